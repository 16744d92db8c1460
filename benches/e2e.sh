#!/usr/bin/env bash
# End-to-end throughput and latency: tapyard's tap-bridge against a Linux bridge with veths.
#
# Run by hand as root (not in CI):   sudo -E benches/e2e.sh
#
# Cases, each between two network namespaces ("pods") with one interface each:
#   tapyard        pods on TAP devices bridged by target/release/examples/tap-bridge; when the
#                  binary has --no-offload (offload TAPs by default), both of its modes are run
#   linux          pods on veth pairs enslaved to a Linux bridge, default offloads
#   linux tx off   the same with the pods' tx offloads off (`ethtool -K eth0 tx off`, which also
#                  turns off TSO): the fair comparison for a TAP without a virtio-net header,
#                  whose kernel side must checksum and segment in software as well
# Per case: ping latency on an idle link (PING_COUNT pings every 10 ms), then one iperf3 TCP
# stream for DURATION seconds. The switch (the tap-bridge process, or the Linux bridge) lives
# in a namespace of its own, so nothing is added to the host's namespace.
#
# Environment:
#   DURATION=10          iperf3 seconds per case
#   PING_COUNT=200       pings per case
#   TAPBRIDGE_ARGS=""    extra tap-bridge arguments, e.g. "--workers 1"
#   TAPBRIDGE_BIN=path   use this binary instead of building the example
#   KEEP_LOGS=1          keep the work directory (tap-bridge output, iperf3 JSON)
#
# Names carry the script's pid ("tye-...-<pid>") and addresses are 10.214.x.y inside those
# namespaces only; everything is removed on exit, error or Ctrl-C.
set -euo pipefail

DURATION=${DURATION:-10}
PING_COUNT=${PING_COUNT:-200}
TAPBRIDGE_ARGS=${TAPBRIDGE_ARGS:-}
IPERF_PORT=5201
ID=$$

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/tapyard-e2e.XXXXXX)

NS_LIST=()        # namespaces to delete
PIDS=()           # background processes to stop
BRIDGE_PID=""     # the running tap-bridge, if any

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'e2e.sh: %s\n' "$*" >&2; exit 1; }

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_tapbridge quiet
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    for ns in "${NS_LIST[@]}"; do
        # Processes left in the namespace (iperf3 servers) first, then the namespace, which
        # takes its bridge, veths and TAPs with it.
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    if [[ -n "${KEEP_LOGS:-}" ]]; then
        log "logs kept in $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed"; }


ns_add() {
    ip netns add "$1"
    NS_LIST+=("$1")
    ip -n "$1" link set lo up
}

ns_del() {
    local ns=$1 keep=() n
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    for n in "${NS_LIST[@]}"; do [[ $n == "$ns" ]] || keep+=("$n"); done
    NS_LIST=("${keep[@]}")
}

# Stops tap-bridge with SIGINT (its clean exit prints counters and the FDB).
stop_tapbridge() {
    [[ -n "$BRIDGE_PID" ]] || return 0
    local pid=$BRIDGE_PID
    BRIDGE_PID=""
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        [[ "${1:-}" == quiet ]] || log "tap-bridge did not stop on SIGINT; killed"
    fi
    wait "$pid" 2>/dev/null || true
}

# cpu_ticks PID: user + system clock ticks used by PID so far.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# ping_stats NS ADDR: sets LAT="avg p50 p99 mdev" (ms).
ping_stats() {
    local ns=$1 addr=$2 out summary pct
    # Warm up ARP and caches first.
    ip netns exec "$ns" ping -c 3 -i 0.05 -W 2 "$addr" >/dev/null ||
        die "ping $addr from $ns failed"
    out="$WORK/ping-$ns.txt"
    timeout $((PING_COUNT / 50 + 30)) ip netns exec "$ns" ping -n -c "$PING_COUNT" -i 0.01 -W 2 "$addr" >"$out" ||
        die "ping $addr from $ns lost packets: $(tail -2 "$out")"
    # "rtt min/avg/max/mdev = 0.011/0.022/0.033/0.004 ms" -> "avg mdev"
    summary=$(sed -n 's|^rtt .* = \([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\) ms$|\2 \4|p' "$out")
    [[ -n "$summary" ]] || die "cannot parse ping output: $(tail -2 "$out")"
    pct=$(sed -n 's/.* time=\([0-9.]*\) ms.*/\1/p' "$out" | sort -n |
        awk '{ v[NR] = $1 } END {
            if (NR == 0) { print "nan nan"; exit }
            i50 = int(NR * 0.50 + 0.5); if (i50 < 1) i50 = 1
            i99 = int(NR * 0.99 + 0.5); if (i99 < 1) i99 = 1; if (i99 > NR) i99 = NR
            print v[i50], v[i99] }')
    local avg mdev p50 p99
    read -r avg mdev <<<"$summary"
    read -r p50 p99 <<<"$pct"
    LAT="$avg $p50 $p99 $mdev"
}

# iperf NS_CLIENT NS_SERVER SERVER_ADDR TAG: sets TPUT="gbits retransmits".
iperf() {
    local cns=$1 sns=$2 addr=$3 tag=$4 spid json
    ip netns exec "$sns" iperf3 -s -1 -B "$addr" -p "$IPERF_PORT" >"$WORK/iperf-server-$tag.log" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    for _ in $(seq 50); do
        ip netns exec "$sns" ss -Hltn "sport = :$IPERF_PORT" | grep -q . && break
        sleep 0.1
    done
    json="$WORK/iperf-$tag.json"
    if ! timeout $((DURATION + 30)) ip netns exec "$cns" iperf3 -c "$addr" -p "$IPERF_PORT" -t "$DURATION" -J >"$json"; then
        die "iperf3 ($tag) failed: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error","?"))' "$json" 2>/dev/null || tail -3 "$json")"
    fi
    wait "$spid" 2>/dev/null || true
    TPUT=$(python3 - "$json" <<'PY'
import json, sys
end = json.load(open(sys.argv[1]))["end"]
print("%.3f %d" % (end["sum_received"]["bits_per_second"] / 1e9,
                   end["sum_sent"].get("retransmits", 0)))
PY
)
}

RESULTS=()   # "name|gbits|retr|avg|p50|p99|mdev|pod drops"

# pod_drops NS DEV: the interface's rx_dropped + tx_dropped as the pod's kernel counts them.
pod_drops() {
    ip netns exec "$1" sh -c "cat /sys/class/net/$2/statistics/rx_dropped /sys/class/net/$2/statistics/tx_dropped" |
        awk '{ s += $1 } END { print s + 0 }'
}

# measure NAME NS_A DEV_A NS_B DEV_B ADDR_B: ping then iperf3 from A to B; appends to RESULTS.
measure() {
    local name=$1 a=$2 da=$3 b=$4 db=$5 addr=$6 g r avg p50 p99 mdev d0 d1
    d0=$(( $(pod_drops "$a" "$da") + $(pod_drops "$b" "$db") ))
    log "$name: ping ($PING_COUNT x 10 ms)"
    ping_stats "$a" "$addr"
    log "$name: iperf3 TCP, 1 stream, ${DURATION}s"
    iperf "$a" "$b" "$addr" "${name//[^a-z]/_}"
    d1=$(( $(pod_drops "$a" "$da") + $(pod_drops "$b" "$db") ))
    read -r g r <<<"$TPUT"
    read -r avg p50 p99 mdev <<<"$LAT"
    log "$name: $g Gbit/s ($r retransmits, $((d1 - d0)) drops in the pods' interfaces), ping avg $avg ms p50 $p50 p99 $p99 mdev $mdev"
    RESULTS+=("$name|$g|$r|$avg|$p50|$p99|$mdev|$((d1 - d0))")
}

# addr_pod NS DEV ADDR: gives DEV ADDR/24 and brings it up.
addr_pod() {
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$1" link set "$2" up
}

# offloads NS DEV: the device's checksum and segmentation offload state, one line.
offloads() {
    ip netns exec "$1" ethtool -k "$2" | awk -F': ' '
        /^tx-checksumming:|^[ \t]*tx-tcp-segmentation:|^generic-segmentation-offload:|^generic-receive-offload:/ {
            gsub(/^[ \t]+/, "", $1); printf "%s=%s ", $1, $2 }'
}

# ---------------------------------------------------------------------------------------------
[[ $DURATION =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a positive number of seconds, not '$DURATION'"
[[ $PING_COUNT =~ ^[1-9][0-9]*$ ]] || die "PING_COUNT must be a positive number, not '$PING_COUNT'"
[[ $(id -u) -eq 0 ]] || die "run as root (it creates namespaces, TAPs, a bridge and veths)"
for t in ip iperf3 ping ethtool ss awk python3 timeout; do need "$t"; done

log "machine: $(nproc) CPUs, kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

if [[ -n "${TAPBRIDGE_BIN:-}" ]]; then
    BIN=$TAPBRIDGE_BIN
else
    log "building tap-bridge (release)"
    (cd "$ROOT" && CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release --example tap-bridge) >&2
    BIN="$ROOT/target/release/examples/tap-bridge"
fi
[[ -x "$BIN" ]] || die "no tap-bridge binary at $BIN"

# --- tapyard cases -----------------------------------------------------------------------------
# tapyard_case NAME NET EXTRA_ARGS...: pods on two TAPs bridged by a tap-bridge process.
tapyard_case() {
    local name=$1 net=$2; shift 2
    local sw="tye-t$net-sw-$ID" a="tye-t$net-a-$ID" b="tye-t$net-b-$ID"
    local ta="tye${ID}a$net" tb="tye${ID}b$net"   # at most 3 + 7 + 2 = 12 bytes
    local out="$WORK/tap-bridge-$net.out" err="$WORK/tap-bridge-$net.err"
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    log "$name: tap-bridge $* $ta $tb (in $sw)"
    ip netns exec "$sw" "$BIN" "$@" "$ta" "$tb" >"$out" 2>"$err" &
    BRIDGE_PID=$!
    for _ in $(seq 100); do
        ip -n "$sw" link show dev "$ta" >/dev/null 2>&1 &&
            ip -n "$sw" link show dev "$tb" >/dev/null 2>&1 && break
        kill -0 "$BRIDGE_PID" 2>/dev/null || die "tap-bridge exited: $(cat "$err")"
        sleep 0.05
    done
    ip -n "$sw" link set "$ta" netns "$a"
    ip -n "$sw" link set "$tb" netns "$b"
    addr_pod "$a" "$ta" "10.214.$net.1"
    addr_pod "$b" "$tb" "10.214.$net.2"
    log "$name: pod offloads: $(offloads "$a" "$ta")"
    local t0 s0 t1 s1
    t0=$(cpu_ticks "$BRIDGE_PID"); s0=$(date +%s.%N)
    measure "$name" "$a" "$ta" "$b" "$tb" "10.214.$net.2"
    t1=$(cpu_ticks "$BRIDGE_PID"); s1=$(date +%s.%N)
    stop_tapbridge
    CPU+=("$name|$(awk -v t0="$t0" -v t1="$t1" -v s0="$s0" -v s1="$s1" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.0f", 100 * (t1 - t0) / hz / (s1 - s0) }')")
    REPORTS+=("$name|$out")
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}

CPU=()      # "name|percent of one core"
REPORTS=()  # "name|tap-bridge stdout"
# shellcheck disable=SC2206 # TAPBRIDGE_ARGS is split into arguments on purpose
EXTRA=($TAPBRIDGE_ARGS)
if [[ " $TAPBRIDGE_ARGS " != *" --no-offload "* ]] && "$BIN" --help 2>&1 | grep -q -- --no-offload; then
    # This tap-bridge defaults to offload TAPs: measure both of its modes.
    tapyard_case "tapyard, offload TAPs" 1 "${EXTRA[@]}"
    tapyard_case "tapyard, --no-offload" 2 "${EXTRA[@]}" --no-offload
    NTAPYARD=2
else
    tapyard_case "tapyard tap-bridge" 1 "${EXTRA[@]}"
    NTAPYARD=1
fi

# --- cases 2 and 3: Linux bridge + veth -------------------------------------------------------
linux_case() { # NAME TXOFF(0|1) NET
    local name=$1 txoff=$2 net=$3
    local sw="tye-k$net-sw-$ID" a="tye-k$net-a-$ID" b="tye-k$net-b-$ID" side ns
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for side in a b; do
        [[ $side == a ]] && ns=$a || ns=$b
        ip -n "$sw" link add "veth-$side" type veth peer name eth0 netns "$ns"
        ip -n "$sw" link set "veth-$side" master br0 up
    done
    if [[ $txoff == 1 ]]; then
        ip netns exec "$a" ethtool -K eth0 tx off >/dev/null
        ip netns exec "$b" ethtool -K eth0 tx off >/dev/null
    fi
    addr_pod "$a" eth0 "10.214.$net.1"
    addr_pod "$b" eth0 "10.214.$net.2"
    log "$name: pod offloads: $(offloads "$a" eth0)"
    # Wait for the bridge ports to forward (no STP: immediate, but let the links settle).
    sleep 0.5
    measure "$name" "$a" eth0 "$b" eth0 "10.214.$net.2"
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}
linux_case "linux bridge, offloads on" 0 3
linux_case "linux bridge, pod tx off" 1 4

# --- report ------------------------------------------------------------------------------------
echo
for r in "${REPORTS[@]}"; do
    IFS='|' read -r n f <<<"$r"
    echo "tap-bridge exit report, $n (counters, drops, FDB):"
    sed 's/^/  /' "$f"
done
echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -r)"
echo "iperf3: 1 TCP stream, ${DURATION}s; ping: ${PING_COUNT} x 10 ms on an idle link; TAPBRIDGE_ARGS='${TAPBRIDGE_ARGS}'"
printf '%-28s %8s %7s %9s %9s %8s %8s %8s %6s\n' case Gbit/s retr "pod drops" "avg ms" "p50 ms" "p99 ms" "mdev ms" "cpu%"
for r in "${RESULTS[@]}"; do
    IFS='|' read -r n g rt avg p50 p99 mdev pd <<<"$r"
    cpu=-
    for c in "${CPU[@]}"; do [[ ${c%%|*} == "$n" ]] && cpu=${c#*|}; done
    printf '%-28s %8s %7s %9s %9s %8s %8s %8s %6s\n' "$n" "$g" "$rt" "$pd" "$avg" "$p50" "$p99" "$mdev" "$cpu"
done
echo "(retr: TCP retransmits; pod drops: rx+tx dropped on the pods' interfaces during the case;"
echo " cpu%: tap-bridge's user+system time over its ping + iperf3 run, in % of one core)"
echo
echo "ratios tapyard / linux (throughput: <1 is slower; latency: >1 is slower):"
for t in "${RESULTS[@]:0:NTAPYARD}"; do
    IFS='|' read -r tn tg _ tavg tp50 _ <<<"$t"
    for r in "${RESULTS[@]:NTAPYARD}"; do
        IFS='|' read -r n g _ avg p50 _ <<<"$r"
        awk -v tn="$tn" -v n="$n" -v tg="$tg" -v g="$g" -v ta="$tavg" -v a="$avg" -v tp="$tp50" -v p="$p50" 'BEGIN {
            printf "  %-24s / %-26s throughput %5.2fx   ping avg %5.2fx   p50 %5.2fx\n",
                tn, n, (g > 0 ? tg / g : 0), (a > 0 ? ta / a : 0), (p > 0 ? tp / p : 0) }'
    done
done
