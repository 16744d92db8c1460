#!/usr/bin/env bash
# Namespaces around a running `tapyard run examples/node.toml`: two pods on cni0, a second
# node and an outside host behind the uplink.
#
#   ty-pod-a  10.244.1.2/24 on TAP pod-a, default via 10.244.1.1   ─┐ cni0 (10.244.1.1/24)
#   ty-pod-b  10.244.1.3/24 on TAP pod-b, default via 10.244.1.1   ─┘
#   ty-wire   a Linux bridge holding the uplink TAP eth0 (tapyard's 172.18.0.2) and two veths:
#     ty-node-b   172.18.0.3/24, its pods' 10.244.2.2 on lo, route 10.244.1.0/24 via 172.18.0.2
#     ty-outside  172.18.0.1/24 (the default gateway), route 10.244.0.0/16 via 172.18.0.2
#                 (until masquerade is wired, the outside host routes pod addresses back)
#
# Usage (as root):
#   tapyard run examples/node.toml &          # creates the TAPs pod-a, pod-b and eth0
#   examples/node-netns.sh up                 # moves them into the namespaces above
#   ip netns exec ty-pod-a ping 10.244.1.3    # pod to pod;  10.244.2.2: the other node's pod
#   tapyard show fdb; tapyard show neigh; tapyard show routes; tapyard show stats
#   tapyard capture pod-a -w /tmp/pod-a.pcap -c 20 && tcpdump -nr /tmp/pod-a.pcap
#   examples/node-netns.sh down               # deletes the namespaces (stop tapyard first)
#
# This host has an eth0 of its own? Run tapyard in a namespace of its own, where the TAPs are
# created, and tell this script with NODE_NS:
#   ip netns add ty-node-a && ip netns exec ty-node-a tapyard run examples/node.toml &
#   NODE_NS=ty-node-a examples/node-netns.sh up      # `down` also deletes ty-node-a
set -euo pipefail

NODE_NS="${NODE_NS:-}"
NAMESPACES=(ty-pod-a ty-pod-b ty-wire ty-node-b ty-outside)

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
  ip -n ty-outside route add 10.244.0.0/16 via 172.18.0.2
  echo "up: try  ip netns exec ty-pod-a ping -c 3 10.244.1.3   (and 10.244.2.2, 172.18.0.1)"
}

down() {
  for ns in "${NAMESPACES[@]}" ${NODE_NS:+"$NODE_NS"}; do
    if ip netns del "$ns" 2>/dev/null; then echo "deleted namespace $ns"; fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: [NODE_NS=ns] $0 up|down" >&2; exit 2 ;;
esac
