#!/usr/bin/env bash
# iperf3 from a pod to a pod on another node over VXLAN, in one run:
#   tapyard->linux  pod on node A (tapyard, offload TAPs) -> pod on node B (Linux kernel vxlan
#                   set up as Flannel does)
#   linux->tapyard  the other way
#   tapyard->tapyard  pod on node A -> pod on node C (a second tapyard)
#   linux->linux    pod on node B -> pod on node D (kernel vxlan on both ends): the reference
#
# Run by hand as root (not in CI):   sudo -E bash benches/vxlan.sh
#
# Layout (every node a network namespace, pods child namespaces; nothing in the host's):
#   wire ns: Linux bridge br0 joining node A's and C's uplink TAPs and veths to nodes B and D
#   node A 10.229.0.2, pods 10.226.1.0/24; node B 10.229.0.3, 10.226.2.0/24 (Linux);
#   node C 10.229.0.4, 10.226.3.0/24; node D 10.229.0.5, 10.226.4.0/24 (Linux)
#   Linux nodes: `ip link add flannel.1 type vxlan id 1 dstport 8472 local <ip> dev eth0
#   nolearning`, the pod subnet's network address /32 on it, per remote node a route via its
#   network address onlink, a permanent neighbour and `bridge fdb append`; each pod a veth to
#   its node, which routes (ip_forward=1). tapyard nodes: `tapyard run` with cni0, an uplink
#   TAP and `[[vxlan]]` with a peer per other node (the TAPs start in a namespace of their own,
#   then move). Pods keep MTU 1500 (PMTU discovery brings TCP to 1450 through the overlay).
#   A tapyard uplink TAP carries UDP-tunnel GSO when the kernel allows it (Linux 6.17+): VXLAN
#   super-frames cross it whole both ways; the last lines say which path each node took.
#   TAPYARD=<binary> runs another build (e.g. one from before, to compare in the same session).
#
# Environment: DURATION=10 (iperf3 seconds per case), KEEP_LOGS=1.
set -euo pipefail

DURATION=${DURATION:-10}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
TAPYARD=${TAPYARD:-$repo/target/release/tapyard}
id=$$
P="tyvb$((id % 10000))"
WORK=$(mktemp -d /tmp/tapyard-vxlan-bench.XXXXXX)
NS=()
PIDS=()

die() { echo "vxlan.sh: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "needs root (network namespaces, TAP and vxlan devices)"
for c in ip bridge iperf3 python3; do command -v "$c" >/dev/null || die "$c is not installed"; done
if [[ ! -x $TAPYARD ]]; then
    (cd "$repo" && cargo build --release -p tapyard-cli) >&2
fi

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    if [[ ${KEEP_LOGS:-0} == 1 ]]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

ns() { ip netns add "$1"; NS+=("$1"); }
vtep_mac() { printf '0a:58:0a:e2:%02x:00' "$1"; }   # 10.226.N.0

WIRE=$P-wire
ns "$WIRE"
ip -n "$WIRE" link add br0 type bridge
ip -n "$WIRE" link set br0 up
# A TAP's own namespace while tapyard starts, so the host's namespace gets nothing.
TNS=$P-taps
ns "$TNS"

# tapyard node N (1 or 3): its config, its run, its pod.
tapyard_node() {
    local n=$1 node=$P-n$1 pod=$P-p$1 up=${P}u$1 tap=${P}t$1
    local conf=$WORK/n$n.toml
    cat >"$conf" <<EOF
[node]
name = "bench-$n"
cluster_cidr = "10.226.0.0/16"
socket = "$WORK/n$n.sock"

[[bridge]]
name = "cni0"
address = "10.226.$n.1/24"
ports = ["$tap"]

[[uplink]]
name = "eth0"
tap = "$up"
address = "10.229.0.$((n + 1))/24"

[[vxlan]]
name = "flannel.1"
vni = 1
port = 8472
uplink = "eth0"
address = "10.226.$n.0/32"
EOF
    for m in 1 2 3 4; do
        [[ $m == "$n" ]] && continue
        printf '\n[[vxlan.peer]]\nnode_ip = "10.229.0.%d"\nvtep_mac = "%s"\npod_cidr = "10.226.%d.0/24"\n' \
            $((m + 1)) "$(vtep_mac "$m")" "$m" >>"$conf"
    done
    "$TAPYARD" check "$conf" >&2
    ip netns exec "$TNS" "$TAPYARD" run "$conf" >"$WORK/n$n.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do [[ -S $WORK/n$n.sock ]] && break; sleep 0.1; done
    [[ -S $WORK/n$n.sock ]] || die "tapyard node $n did not start: $(tail -3 "$WORK/n$n.log")"
    for _ in $(seq 100); do
        "$TAPYARD" show routes --socket "$WORK/n$n.sock" >/dev/null 2>&1 && break
        sleep 0.1
    done
    ns "$pod"
    ip -n "$TNS" link set "$tap" netns "$pod"
    ip -n "$pod" addr add "10.226.$n.2/24" dev "$tap"
    ip -n "$pod" link set lo up
    ip -n "$pod" link set "$tap" up
    ip -n "$pod" route add default via "10.226.$n.1"
    ip -n "$TNS" link set "$up" netns "$WIRE"
    ip -n "$WIRE" link set "$up" master br0
    ip -n "$WIRE" link set "$up" up
}

# Linux node N (2 or 4): kernel vxlan as Flannel, a pod behind a veth.
linux_node() {
    local n=$1 node=$P-n$1 pod=$P-p$1 ip=10.229.0.$(($1 + 1))
    ns "$node"
    ip -n "$WIRE" link add "v$n" type veth peer name eth0 netns "$node"
    ip -n "$WIRE" link set "v$n" master br0
    ip -n "$WIRE" link set "v$n" up
    ip -n "$node" addr add "$ip/24" dev eth0
    ip -n "$node" link set eth0 up
    ip -n "$node" link set lo up
    ip netns exec "$node" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$node" link add flannel.1 address "$(vtep_mac "$n")" type vxlan id 1 dstport 8472 \
        local "$ip" dev eth0 nolearning
    ip -n "$node" addr add "10.226.$n.0/32" dev flannel.1
    ip -n "$node" link set flannel.1 up
    for m in 1 2 3 4; do
        [[ $m == "$n" ]] && continue
        ip -n "$node" route add "10.226.$m.0/24" via "10.226.$m.0" dev flannel.1 onlink
        ip -n "$node" neigh add "10.226.$m.0" lladdr "$(vtep_mac "$m")" dev flannel.1 nud permanent
        ip netns exec "$node" bridge fdb append "$(vtep_mac "$m")" dev flannel.1 dst "10.229.0.$((m + 1))"
    done
    ns "$pod"
    ip -n "$node" link add vpod type veth peer name eth0 netns "$pod"
    ip -n "$node" addr add "10.226.$n.1/24" dev vpod
    ip -n "$node" link set vpod up
    ip -n "$pod" addr add "10.226.$n.2/24" dev eth0
    ip -n "$pod" link set eth0 up
    ip -n "$pod" link set lo up
    ip -n "$pod" route add default via "10.226.$n.1"
}

tapyard_node 1
linux_node 2
tapyard_node 3
linux_node 4

# One iperf3 stream from pod $1 to pod $2; prints Gbit/s.
iperf() {
    local from=$P-p$1 to=$P-p$2 addr=10.226.$2.2 tag=$1-$2
    ip netns exec "$from" ping -c 2 -W 2 -q "$addr" >/dev/null || die "pod $1 cannot reach pod $2"
    ip netns exec "$to" iperf3 -s -1 -B "$addr" >"$WORK/server-$tag.log" 2>&1 &
    local spid=$!
    sleep 0.5
    timeout $((DURATION + 30)) ip netns exec "$from" iperf3 -c "$addr" -t "$DURATION" -J >"$WORK/iperf-$tag.json" ||
        die "iperf3 $tag failed: $(tail -3 "$WORK/iperf-$tag.json")"
    wait "$spid" 2>/dev/null || true
    python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' \
        "$WORK/iperf-$tag.json"
}

echo "iperf3 pod -> remote pod over VXLAN, one TCP stream, ${DURATION}s each (Gbit/s)"
ll=$(iperf 2 4)
tl=$(iperf 1 2)
lt=$(iperf 2 1)
tt=$(iperf 1 3)
ratio() { python3 -c "import sys; print('%.2f' % (float(sys.argv[1]) / float(sys.argv[2])))" "$1" "$ll"; }
printf '%-18s %8s %10s\n' case Gbit/s "x linux"
printf '%-18s %8s %10s\n' "linux->linux" "$ll" "1.00"
printf '%-18s %8s %10s\n' "tapyard->linux" "$tl" "$(ratio "$tl")"
printf '%-18s %8s %10s\n' "linux->tapyard" "$lt" "$(ratio "$lt")"
printf '%-18s %8s %10s\n' "tapyard->tapyard" "$tt" "$(ratio "$tt")"
for n in 1 3; do
    echo "node $n: $("$TAPYARD" show stats --socket "$WORK/n$n.sock" | grep -E '^drops:')"
    gso=$(grep -o 'uplink eth0: [^(]*' "$WORK/n$n.log" || true)
    echo "node $n: ${gso:-uplink eth0: no UDP-tunnel GSO (a build without it)}"
done
