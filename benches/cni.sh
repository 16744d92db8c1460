#!/usr/bin/env bash
# ADD and DEL latency of the tapyard-cni plugin against a real `tapyard run`, and of the
# reference `bridge` plugin with the same host-local IPAM configuration, in the same run.
#
# usage: sudo bash benches/cni.sh [N]          (N pods per plugin, default 200; root)
#
# Builds target/release/{tapyard,tapyard-cni} (cargo build --release), starts tapyard in a
# network namespace of its own with bridge cni0 (gateway 10.244.1.1/24, no file ports), then
# for each plugin ADDs N pods one after the other (a fresh namespace each, made beforehand and
# not timed) and DELs them, timing each plugin run from fork to exit (date +%s%N around the
# exec). The bridge plugin runs inside a namespace of its own too (so its Linux bridge, veths
# and iptables state do not touch the host), which adds `ip netns exec`'s cost to each of its
# runs: the script measures that cost (an empty `ip netns exec NS true`) and prints it, so it
# can be subtracted. Prints p50/p99 of ADD and DEL for both. Everything (namespaces, node,
# IPAM dataDirs) is removed on exit, also on failure or Ctrl-C.
#
# Env: PLUGINS (directory of host-local and bridge; default /usr/lib/cni, else /opt/cni/bin).
set -euo pipefail

N=${1:-200}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PLUGINS=${PLUGINS:-$( [ -x /usr/lib/cni/host-local ] && echo /usr/lib/cni || echo /opt/cni/bin )}
[ "$(id -u)" = 0 ] || { echo "cni.sh: needs root" >&2; exit 1; }
[ -x "$PLUGINS/host-local" ] && [ -x "$PLUGINS/bridge" ] || {
    echo "cni.sh: host-local and bridge not found in $PLUGINS (set PLUGINS)" >&2; exit 1; }

(cd "$ROOT" && cargo build -q --release -p tapyard-cli -p tapyard-cni)
TAPYARD=$ROOT/target/release/tapyard
CNI=$ROOT/target/release/tapyard-cni

TAG=$$
WORK=$(mktemp -d /tmp/tapyard-cni-bench.XXXXXX)
NODE_NS=tybn-$TAG
BR_NS=tybr-$TAG
NODE_PID=
cleanup() {
    [ -n "$NODE_PID" ] && kill "$NODE_PID" 2>/dev/null && wait "$NODE_PID" 2>/dev/null
    for ns in $(ip netns list | awk '{print $1}' | grep -E -- "-$TAG\$"); do
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

ip netns add "$NODE_NS"
ip netns add "$BR_NS"
cat >"$WORK/node.toml" <<EOF
[node]
name = "bench"
cluster_cidr = "10.244.0.0/16"
socket = "$WORK/ctl.sock"

[[bridge]]
name = "cni0"
address = "10.244.1.1/24"
EOF
ip netns exec "$NODE_NS" "$TAPYARD" run "$WORK/node.toml" 2>"$WORK/run.log" &
NODE_PID=$!
for _ in $(seq 100); do
    "$TAPYARD" show ports --socket "$WORK/ctl.sock" >/dev/null 2>&1 && break
    sleep 0.1
done
"$TAPYARD" show ports --socket "$WORK/ctl.sock" >/dev/null

ipam() { # $1: dataDir
    printf '{"type":"host-local","ranges":[[{"subnet":"10.244.1.0/24","gateway":"10.244.1.1"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":"%s"}' "$1"
}
TY_CONF=$(printf '{"cniVersion":"1.0.0","name":"tybench","type":"tapyard-cni","bridge":"cni0","socket":"%s","mtu":1500,"ipam":%s}' \
    "$WORK/ctl.sock" "$(ipam "$WORK/ipam-ty")")
BR_CONF=$(printf '{"cniVersion":"1.0.0","name":"tybench","type":"bridge","bridge":"cni0","isGateway":true,"mtu":1500,"ipam":%s}' \
    "$(ipam "$WORK/ipam-br")")

now() { date +%s%N; }

# run_one PLUGIN-CMD... : times one plugin run (env set by the caller), stdin from $CONF.
# Appends nanoseconds to $OUT; a failed run aborts with the plugin's output.
run_one() {
    local t0 t1 out
    t0=$(now)
    if ! out=$("$@" <<<"$CONF" 2>&1); then
        echo "cni.sh: $CNI_COMMAND $CNI_CONTAINERID failed: $out" >&2
        exit 1
    fi
    t1=$(now)
    echo $((t1 - t0)) >>"$OUT"
}

# bench NAME CONF PREFIX-CMD...: N ADDs then N DELs.
bench() {
    local name=$1
    CONF=$2
    shift 2
    for i in $(seq "$N"); do ip netns add "typ$i-$name-$TAG"; done
    export CNI_IFNAME=eth0 CNI_PATH=$PLUGINS
    for cmd in ADD DEL; do
        OUT=$WORK/$name.$cmd
        : >"$OUT"
        export CNI_COMMAND=$cmd
        for i in $(seq "$N"); do
            export CNI_CONTAINERID=bench-$name-$i CNI_NETNS=/var/run/netns/typ$i-$name-$TAG
            run_one "$@"
        done
    done
    for i in $(seq "$N"); do ip netns del "typ$i-$name-$TAG"; done
}

pct() { # FILE P: the P-th percentile, in ms
    sort -n "$1" | awk -v p="$2" '{v[NR]=$1} END {i=int((NR-1)*p/100)+1; printf "%.1f", v[i]/1e6}'
}

bench tapyard "$TY_CONF" "$CNI"
bench bridge "$BR_CONF" ip netns exec "$BR_NS" "$PLUGINS/bridge"
# The cost `ip netns exec` adds to each bridge run.
OUT=$WORK/netns-exec
: >"$OUT"
for _ in $(seq 50); do
    t0=$(now); ip netns exec "$BR_NS" true; t1=$(now); echo $((t1 - t0)) >>"$OUT"
done

left=$("$TAPYARD" show ports --json --socket "$WORK/ctl.sock" | grep -c '"name"' || true)
printf '%s pods per plugin, one at a time (ms)\n' "$N"
printf '%-34s %8s %8s %8s %8s\n' plugin "ADD p50" "ADD p99" "DEL p50" "DEL p99"
printf '%-34s %8s %8s %8s %8s\n' "tapyard-cni + tapyard run" \
    "$(pct "$WORK/tapyard.ADD" 50)" "$(pct "$WORK/tapyard.ADD" 99)" \
    "$(pct "$WORK/tapyard.DEL" 50)" "$(pct "$WORK/tapyard.DEL" 99)"
printf '%-34s %8s %8s %8s %8s\n' "bridge (via ip netns exec)" \
    "$(pct "$WORK/bridge.ADD" 50)" "$(pct "$WORK/bridge.ADD" 99)" \
    "$(pct "$WORK/bridge.DEL" 50)" "$(pct "$WORK/bridge.DEL" 99)"
printf '%-34s %8s %8s\n' "ip netns exec alone" "$(pct "$OUT" 50)" "$(pct "$OUT" 99)"
printf 'ports left in tapyard after the DELs: %s\n' "$left"
