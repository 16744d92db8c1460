#!/usr/bin/env bash
# Namespaces around a running `tapyard run examples/node.toml`: two pods on cni0, a second
# node and an outside host behind the uplink.
#
#   ty-pod-a  10.244.1.2/24 on TAP pod-a, default via 10.244.1.1   ─┐ cni0 (10.244.1.1/24)
#   ty-pod-b  10.244.1.3/24 on TAP pod-b, default via 10.244.1.1   ─┘
#   ty-wire   a Linux bridge holding the uplink TAP eth0 (tapyard's 172.18.0.2) and two veths:
#     ty-node-b   172.18.0.3/24, its pods' 10.244.2.2 on lo, route 10.244.1.0/24 via 172.18.0.2
#     ty-outside  172.18.0.1/24 (the default gateway), with no route to the pods: their
#                 traffic reaches it masqueraded to 172.18.0.2 ([masquerade] out = "eth0")
#
# Servers for the Services of examples/node.toml (python3; stopped by `down`, by PID), each
# answering "<who> saw <client address>" over HTTP (TCP) or to any UDP datagram:
#   web  10.96.0.10:80 (NodePort 30080) -> ty-pod-a 10.244.1.2:8080, ty-node-b 10.244.2.2:8080
#   dns  10.96.0.53:53/udp              -> ty-pod-b 10.244.1.3:5353
#   and the outside host on 172.18.0.1:9000 (to see the masqueraded address)
#
# Usage (as root):
#   tapyard run examples/node.toml &          # creates the TAPs pod-a, pod-b and eth0
#   examples/node-netns.sh up                 # moves them into the namespaces above
#   ip netns exec ty-pod-a ping 10.244.1.3    # pod to pod;  10.244.2.2: the other node's pod
#   tapyard show fdb; tapyard show neigh; tapyard show routes; tapyard show stats
#   tapyard capture pod-a -w /tmp/pod-a.pcap -c 20 && tcpdump -nr /tmp/pod-a.pcap
#   examples/node-netns.sh try                # each Service once, and pod -> outside
#   ip netns exec ty-pod-b curl -s http://10.96.0.10/      # web, from a pod (either endpoint)
#   ip netns exec ty-outside curl -s http://172.18.0.2:30080/   # the NodePort from outside
#   tapyard show services; tapyard show conntrack          # what that traffic created
#   examples/node-netns.sh down               # deletes the namespaces (stop tapyard first)
#
# This host has an eth0 of its own? Run tapyard in a namespace of its own, where the TAPs are
# created, and tell this script with NODE_NS:
#   ip netns add ty-node-a && ip netns exec ty-node-a tapyard run examples/node.toml &
#   NODE_NS=ty-node-a examples/node-netns.sh up      # `down` also deletes ty-node-a
set -euo pipefail

NODE_NS="${NODE_NS:-}"
NAMESPACES=(ty-pod-a ty-pod-b ty-wire ty-node-b ty-outside)
PIDS=/run/tapyard-node-netns

# "<who> <tcp port or 0> <udp port or 0>": answers HTTP requests and UDP datagrams with
# "<who> saw <client address>".
SERVER_PY='
import socket, sys, threading
who, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def tcp():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", tport))
    s.listen(64)
    while True:
        c, peer = s.accept()
        try:
            c.settimeout(2)
            c.recv(4096)
            body = "%s saw %s\n" % (who, peer[0])
            c.sendall(("HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
        except OSError:
            pass
        c.close()
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", uport))
    while True:
        d, peer = u.recvfrom(2048)
        u.sendto(("%s saw %s\n" % (who, peer[0])).encode(), peer)
ts = [threading.Thread(target=f, daemon=True) for f, p in ((tcp, tport), (udp, uport)) if p]
[t.start() for t in ts]
[t.join() for t in ts]
'

# "udp|tcp ADDR PORT": one exchange, prints the answer.
CLIENT_PY='
import socket, sys
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "udp":
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    u.sendto(b"hello", (addr, port))
    print(u.recv(2048).decode().strip())
else:
    c = socket.create_connection((addr, port), timeout=3)
    c.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print(c.makefile().read().split("\r\n\r\n", 1)[-1].strip())
'

server() { # NS WHO TCP_PORT UDP_PORT
  mkdir -p "$PIDS"
  ip netns exec "$1" python3 -c "$SERVER_PY" "$2" "$3" "$4" >/dev/null 2>&1 &
  echo $! >"$PIDS/$1.pid"
}

servers() {
  if ! command -v python3 >/dev/null; then
    echo "python3 not found: no servers for the Services (run your own on the endpoints)" >&2
    return 0
  fi
  server ty-pod-a pod-a 8080 0
  server ty-node-b node-b 8080 0
  server ty-pod-b pod-b 0 5353
  server ty-outside outside 9000 0
}

probe() { # NS MODE ADDR PORT
  printf '%-11s %s %s:%s -> ' "$1" "$2" "$3" "$4"
  ip netns exec "$1" python3 -c "$CLIENT_PY" "$2" "$3" "$4" 2>&1 | tail -n 1
}

try() {
  probe ty-pod-b tcp 10.96.0.10 80       # web from a pod: either endpoint, client kept
  probe ty-pod-b tcp 10.96.0.10 80
  probe ty-pod-a udp 10.96.0.53 53       # dns over UDP
  probe ty-outside tcp 172.18.0.2 30080  # the NodePort from outside: masqueraded
  probe ty-pod-a tcp 172.18.0.1 9000     # pod -> outside: the outside sees 172.18.0.2
}

# `ip` in the namespace holding tapyard's TAPs.
node_ip() {
  if [[ -n "$NODE_NS" ]]; then ip -n "$NODE_NS" "$@"; else ip "$@"; fi
}

wait_for_tap() {
  for _ in $(seq 50); do
    node_ip link show "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "node-netns.sh: TAP $1 not found${NODE_NS:+ in namespace $NODE_NS}: is \`tapyard run examples/node.toml\` running?" >&2
  exit 1
}

pod() { # NS TAP ADDR
  node_ip link set "$2" netns "$1"
  ip -n "$1" addr add "$3/24" dev "$2"
  ip -n "$1" link set lo up
  ip -n "$1" link set "$2" up
  ip -n "$1" route add default via 10.244.1.1
}

up() {
  for t in pod-a pod-b eth0; do wait_for_tap "$t"; done
  for ns in "${NAMESPACES[@]}"; do ip netns add "$ns"; done
  pod ty-pod-a pod-a 10.244.1.2
  pod ty-pod-b pod-b 10.244.1.3
  node_ip link set eth0 netns ty-wire
  ip -n ty-wire link add br0 type bridge
  ip -n ty-wire link set br0 up
  ip -n ty-wire link set eth0 master br0
  ip -n ty-wire link set eth0 up
  for peer in node-b:172.18.0.3 outside:172.18.0.1; do
    name="${peer%%:*}" addr="${peer#*:}"
    ip -n ty-wire link add "v-$name" type veth peer name eth0 netns "ty-$name"
    ip -n ty-wire link set "v-$name" master br0
    ip -n ty-wire link set "v-$name" up
    ip -n "ty-$name" addr add "$addr/24" dev eth0
    ip -n "ty-$name" link set eth0 up
    ip -n "ty-$name" link set lo up
  done
  ip -n ty-node-b addr add 10.244.2.2/32 dev lo
  ip -n ty-node-b route add 10.244.1.0/24 via 172.18.0.2
  servers
  echo "up: try  ip netns exec ty-pod-a ping -c 3 10.244.1.3   (and 10.244.2.2, 172.18.0.1)"
  echo "    and  $0 try   (each Service once, and pod -> outside masqueraded)"
}

down() {
  for f in "$PIDS"/*.pid; do
    [[ -e "$f" ]] || continue
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  for ns in "${NAMESPACES[@]}" ${NODE_NS:+"$NODE_NS"}; do
    if ip netns del "$ns" 2>/dev/null; then echo "deleted namespace $ns"; fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  try) try ;;
  *) echo "usage: [NODE_NS=ns] $0 up|try|down" >&2; exit 2 ;;
esac
