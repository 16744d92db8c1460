#!/usr/bin/env bash
# End-to-end throughput and latency: tapyard's tap-bridge against a Linux bridge with veths, and
# tapyard's tap-router against Linux routing between two Linux bridges.
#
# Run by hand as root (not in CI):   sudo -E benches/e2e.sh
#
# Bridged cases, two network namespaces ("pods") with one interface each, in one subnet:
#   tapyard        pods on TAP devices bridged by target/release/examples/tap-bridge; when the
#                  binary has --no-offload (offload TAPs by default), both of its modes are run
#   linux          pods on veth pairs enslaved to a Linux bridge, default offloads
#   linux tx off   the same with the pods' tx offloads off (`ethtool -K eth0 tx off`, which also
#                  turns off TSO): the fair comparison for a TAP without a virtio-net header,
#                  whose kernel side must checksum and segment in software as well
# Routed cases, pod A and pod B in different subnets (a /24 each, a default route via their
# gateway), as two pods behind two cni0-like bridges of one node:
#   tapyard routed target/release/examples/tap-router with two bridges, each with a router
#                  interface holding the gateway address, one TAP per pod; both TAP modes as
#                  above when the binary has --no-offload
#   linux routed   a "router" namespace with two Linux bridges holding the gateway addresses,
#                  ip_forward=1, a veth from each pod to its bridge; default offloads, then the
#                  pods' tx offloads off as above
# Per case: ping latency on an idle link (PING_COUNT pings every 10 ms), then one iperf3 TCP
# stream for DURATION seconds. The switch (the tap-bridge or tap-router process, or the Linux
# bridges) lives in a namespace of its own, so nothing is added to the host's namespace.
#
# Environment:
#   DURATION=10          iperf3 seconds per case
#   PING_COUNT=200       pings per case
#   CASES=bridge,routed  which groups of cases to run
#   TAPBRIDGE_ARGS=""    extra tap-bridge arguments, e.g. "--workers 1"
#   TAPBRIDGE_BIN=path   use this binary instead of building the example
#   TAPROUTER_ARGS=...   extra tap-router arguments (default: TAPBRIDGE_ARGS)
#   TAPROUTER_BIN=path   use this binary instead of building the example
#   KEEP_LOGS=1          keep the work directory (tap-bridge/tap-router output, iperf3 JSON)
#
# Names carry the script's pid ("tye-...-<pid>") and addresses are 10.214.x.y inside those
# namespaces only; everything is removed on exit, error or Ctrl-C.
set -euo pipefail

DURATION=${DURATION:-10}
PING_COUNT=${PING_COUNT:-200}
TAPBRIDGE_ARGS=${TAPBRIDGE_ARGS:-}
TAPROUTER_ARGS=${TAPROUTER_ARGS:-$TAPBRIDGE_ARGS}
CASES=${CASES:-bridge,routed}
IPERF_PORT=5201
ID=$$

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/tapyard-e2e.XXXXXX)

NS_LIST=()        # namespaces to delete
PIDS=()           # background processes to stop
BRIDGE_PID=""     # the running tap-bridge or tap-router, if any

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

# Stops tap-bridge or tap-router with SIGINT (its clean exit prints counters and tables).
stop_tapbridge() {
    [[ -n "$BRIDGE_PID" ]] || return 0
    local pid=$BRIDGE_PID
    BRIDGE_PID=""
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        [[ "${1:-}" == quiet ]] || log "switch process $pid did not stop on SIGINT; killed"
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
KINDS=()     # per result: "bridge tapyard", "bridge linux", "routed tapyard" or "routed linux"
KIND=""      # the kind of the case being measured

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
    KINDS+=("$KIND")
}

# addr_pod NS DEV ADDR [GATEWAY]: gives DEV ADDR/24, brings it up, and adds a default route via
# GATEWAY when given.
addr_pod() {
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$1" link set "$2" up
    if [[ -n "${4:-}" ]]; then ip -n "$1" route add default via "$4"; fi
}

# wait_taps NS PID TAP...: waits until the process PID created every TAP in NS.
wait_taps() {
    local ns=$1 pid=$2 t ok; shift 2
    for _ in $(seq 100); do
        ok=1
        for t in "$@"; do ip -n "$ns" link show dev "$t" >/dev/null 2>&1 || ok=0; done
        [[ $ok == 1 ]] && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# cpu_record NAME T0 S0: records the switch process's CPU use since ticks T0 at time S0.
cpu_record() {
    local t1 s1
    t1=$(cpu_ticks "$BRIDGE_PID"); s1=$(date +%s.%N)
    CPU+=("$1|$(awk -v t0="$2" -v t1="$t1" -v s0="$3" -v s1="$s1" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.0f", 100 * (t1 - t0) / hz / (s1 - s0) }')")
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
[[ $CASES =~ ^(bridge|routed)(,(bridge|routed))*$ ]] || die "CASES must be bridge, routed or bridge,routed, not '$CASES'"
[[ $(id -u) -eq 0 ]] || die "run as root (it creates namespaces, TAPs, a bridge and veths)"
for t in ip iperf3 ping ethtool ss awk python3 timeout; do need "$t"; done

log "machine: $(nproc) CPUs, kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

want() { [[ ",$CASES," == *",$1,"* ]]; }
BUILD=()
want bridge && [[ -z "${TAPBRIDGE_BIN:-}" ]] && BUILD+=(--example tap-bridge)
want routed && [[ -z "${TAPROUTER_BIN:-}" ]] && BUILD+=(--example tap-router)
if [[ ${#BUILD[@]} -gt 0 ]]; then
    log "building ${BUILD[*]} (release)"
    (cd "$ROOT" && CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release "${BUILD[@]}") >&2
fi
BIN=${TAPBRIDGE_BIN:-$ROOT/target/release/examples/tap-bridge}
RBIN=${TAPROUTER_BIN:-$ROOT/target/release/examples/tap-router}
if want bridge; then [[ -x "$BIN" ]] || die "no tap-bridge binary at $BIN"; fi
if want routed; then [[ -x "$RBIN" ]] || die "no tap-router binary at $RBIN"; fi

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
    wait_taps "$sw" "$BRIDGE_PID" "$ta" "$tb" || die "tap-bridge did not create its TAPs: $(cat "$err")"
    ip -n "$sw" link set "$ta" netns "$a"
    ip -n "$sw" link set "$tb" netns "$b"
    addr_pod "$a" "$ta" "10.214.$net.1"
    addr_pod "$b" "$tb" "10.214.$net.2"
    log "$name: pod offloads: $(offloads "$a" "$ta")"
    local t0 s0
    t0=$(cpu_ticks "$BRIDGE_PID"); s0=$(date +%s.%N)
    measure "$name" "$a" "$ta" "$b" "$tb" "10.214.$net.2"
    cpu_record "$name" "$t0" "$s0"
    stop_tapbridge
    REPORTS+=("$name|$out")
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}

CPU=()      # "name|percent of one core"
REPORTS=()  # "name|tap-bridge or tap-router stdout"
# shellcheck disable=SC2206 # TAPBRIDGE_ARGS is split into arguments on purpose
EXTRA=($TAPBRIDGE_ARGS)
if ! want bridge; then
    :
elif [[ " $TAPBRIDGE_ARGS " != *" --no-offload "* ]] && "$BIN" --help 2>&1 | grep -q -- --no-offload; then
    # This tap-bridge defaults to offload TAPs: measure both of its modes.
    KIND="bridge tapyard"
    tapyard_case "tapyard, offload TAPs" 1 "${EXTRA[@]}"
    tapyard_case "tapyard, --no-offload" 2 "${EXTRA[@]}" --no-offload
else
    KIND="bridge tapyard"
    tapyard_case "tapyard tap-bridge" 1 "${EXTRA[@]}"
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
if want bridge; then
    KIND="bridge linux"
    linux_case "linux bridge, offloads on" 0 3
    linux_case "linux bridge, pod tx off" 1 4
fi

# --- routed cases: pod A 10.214.NA.2/24 (gateway .1) to pod B 10.214.NB.2/24 (gateway .1) ----
# tapyard_routed_case NAME NA NB EXTRA_ARGS...: pods on two TAPs, each on a bridge of a
# tap-router process whose router interfaces hold the gateways.
tapyard_routed_case() {
    local name=$1 na=$2 nb=$3; shift 3
    local sw="tye-r$na-sw-$ID" a="tye-r$na-a-$ID" b="tye-r$na-b-$ID"
    local ta="tye${ID}a$na" tb="tye${ID}b$na"   # at most 3 + 7 + 3 = 13 bytes
    local out="$WORK/tap-router-$na.out" err="$WORK/tap-router-$na.err"
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    local args=(--bridge "gw-a=10.214.$na.1/24" --bridge "gw-b=10.214.$nb.1/24"
        --port "gw-a:$ta" --port "gw-b:$tb" "$@")
    log "$name: tap-router ${args[*]} (in $sw)"
    ip netns exec "$sw" "$RBIN" "${args[@]}" >"$out" 2>"$err" &
    BRIDGE_PID=$!
    wait_taps "$sw" "$BRIDGE_PID" "$ta" "$tb" || die "tap-router did not create its TAPs: $(cat "$err")"
    ip -n "$sw" link set "$ta" netns "$a"
    ip -n "$sw" link set "$tb" netns "$b"
    addr_pod "$a" "$ta" "10.214.$na.2" "10.214.$na.1"
    addr_pod "$b" "$tb" "10.214.$nb.2" "10.214.$nb.1"
    log "$name: pod offloads: $(offloads "$a" "$ta")"
    local t0 s0
    t0=$(cpu_ticks "$BRIDGE_PID"); s0=$(date +%s.%N)
    measure "$name" "$a" "$ta" "$b" "$tb" "10.214.$nb.2"
    cpu_record "$name" "$t0" "$s0"
    stop_tapbridge
    REPORTS+=("$name|$out")
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}

# linux_routed_case NAME TXOFF(0|1) NA NB: the kernel routes between two Linux bridges (each
# holding its pods' gateway address, like cni0) in a "router" namespace.
linux_routed_case() {
    local name=$1 txoff=$2 na=$3 nb=$4
    local sw="tye-k$na-rt-$ID" a="tye-k$na-a-$ID" b="tye-k$na-b-$ID"
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    ip netns exec "$sw" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$sw" link add br-a type bridge
    ip -n "$sw" link add br-b type bridge
    ip -n "$sw" addr add "10.214.$na.1/24" dev br-a
    ip -n "$sw" addr add "10.214.$nb.1/24" dev br-b
    ip -n "$sw" link set br-a up
    ip -n "$sw" link set br-b up
    ip -n "$sw" link add veth-a type veth peer name eth0 netns "$a"
    ip -n "$sw" link add veth-b type veth peer name eth0 netns "$b"
    ip -n "$sw" link set veth-a master br-a up
    ip -n "$sw" link set veth-b master br-b up
    if [[ $txoff == 1 ]]; then
        ip netns exec "$a" ethtool -K eth0 tx off >/dev/null
        ip netns exec "$b" ethtool -K eth0 tx off >/dev/null
    fi
    addr_pod "$a" eth0 "10.214.$na.2" "10.214.$na.1"
    addr_pod "$b" eth0 "10.214.$nb.2" "10.214.$nb.1"
    log "$name: pod offloads: $(offloads "$a" eth0)"
    sleep 0.5
    measure "$name" "$a" eth0 "$b" eth0 "10.214.$nb.2"
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}

# shellcheck disable=SC2206 # TAPROUTER_ARGS is split into arguments on purpose
REXTRA=($TAPROUTER_ARGS)
if want routed; then
    KIND="routed tapyard"
    if [[ " $TAPROUTER_ARGS " != *" --no-offload "* ]]; then
        tapyard_routed_case "tapyard routed, offload" 11 12 "${REXTRA[@]}"
        tapyard_routed_case "tapyard routed, no-offload" 13 14 "${REXTRA[@]}" --no-offload
    else
        tapyard_routed_case "tapyard routed" 13 14 "${REXTRA[@]}"
    fi
    KIND="routed linux"
    linux_routed_case "linux routed, offloads on" 0 15 16
    linux_routed_case "linux routed, pod tx off" 1 17 18
fi

# --- report ------------------------------------------------------------------------------------
echo
for r in "${REPORTS[@]}"; do
    IFS='|' read -r n f <<<"$r"
    echo "exit report, $n (counters, drops, FDB; tap-router: router events, routes, neighbours):"
    sed 's/^/  /' "$f"
done
echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -r)"
echo "iperf3: 1 TCP stream, ${DURATION}s; ping: ${PING_COUNT} x 10 ms on an idle link; TAPBRIDGE_ARGS='${TAPBRIDGE_ARGS}' TAPROUTER_ARGS='${TAPROUTER_ARGS}'"
printf '%-28s %8s %7s %9s %9s %8s %8s %8s %6s\n' case Gbit/s retr "pod drops" "avg ms" "p50 ms" "p99 ms" "mdev ms" "cpu%"
for r in "${RESULTS[@]}"; do
    IFS='|' read -r n g rt avg p50 p99 mdev pd <<<"$r"
    cpu=-
    for c in "${CPU[@]}"; do [[ ${c%%|*} == "$n" ]] && cpu=${c#*|}; done
    printf '%-28s %8s %7s %9s %9s %8s %8s %8s %6s\n' "$n" "$g" "$rt" "$pd" "$avg" "$p50" "$p99" "$mdev" "$cpu"
done
echo "(retr: TCP retransmits; pod drops: rx+tx dropped on the pods' interfaces during the case;"
echo " cpu%: tap-bridge's or tap-router's user+system time over its ping + iperf3 run, in % of one core)"
echo
echo "ratios tapyard / linux (throughput: <1 is slower; latency: >1 is slower):"
for i in "${!RESULTS[@]}"; do
    [[ ${KINDS[$i]} == *" tapyard" ]] || continue
    IFS='|' read -r tn tg _ tavg tp50 _ <<<"${RESULTS[$i]}"
    for j in "${!RESULTS[@]}"; do
        [[ ${KINDS[$j]} == "${KINDS[$i]% tapyard} linux" ]] || continue
        IFS='|' read -r n g _ avg p50 _ <<<"${RESULTS[$j]}"
        awk -v tn="$tn" -v n="$n" -v tg="$tg" -v g="$g" -v ta="$tavg" -v a="$avg" -v tp="$tp50" -v p="$p50" 'BEGIN {
            printf "  %-26s / %-26s throughput %5.2fx   ping avg %5.2fx   p50 %5.2fx\n",
                tn, n, (g > 0 ? tg / g : 0), (a > 0 ? ta / a : 0), (p > 0 ? tp / p : 0) }'
    done
done
