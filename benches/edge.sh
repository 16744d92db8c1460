#!/usr/bin/env bash
# The TAP edge: latency with busy polling off and on, idle CPU, and the 64-byte frame rate,
# tapyard's tap-bridge against a Linux bridge with veths, in the same run.
#
# Run by hand as root (not in CI):   sudo -E benches/edge.sh
#                                    sudo -E CASES=latency benches/edge.sh
#
# Two network namespaces ("pods") with one interface each, in one subnet, bridged by:
#   tapyard            target/release/examples/tap-bridge (offload TAPs) with polling off
#                      (one worker per TAP, the default, then one worker for both)
#   tapyard busy-poll  the same with --busy-poll-us $BUSY_POLL_US
#   linux              veth pairs on a Linux bridge, default offloads
# The switch lives in a namespace of its own.
#
# latency: on an idle link, PING_COUNT pings every 10 ms (p50/p99 of the round trip), then
#   sockperf ping-pong, 64-byte UDP messages for SOCKPERF_SECONDS (p50/p99); for tapyard also
#   the CPU the switch process used while idle for IDLE_SECONDS before the traffic and again
#   after it (from /proc/PID/stat: polling must back off to sleeping).
# rate: trafgen (netsniff-ng) in pod A sends 64-byte UDP frames (60 bytes + FCS) to pod B at
#   RATE for RATE_SECONDS, one sender process; offered = pod A's interface tx_packets,
#   delivered = pod B's interface rx_packets, both per second, and the share delivered.
# mq: iperf3 -P 4 (four TCP streams) from A to B for MQ_SECONDS through tap-bridge with 2
#   workers and single-queue TAPs, the same with --queues 2 (multi-queue TAPs, each pod's
#   queues received by both workers), and the Linux bridge.
#
# Environment:
#   CASES=latency,rate,mq  which groups to run
#   MQ_SECONDS=10        iperf3 seconds per mq case
#   PING_COUNT=200       pings per case
#   SOCKPERF_SECONDS=5   sockperf ping-pong seconds per case
#   IDLE_SECONDS=10      idle CPU measurement per tapyard case
#   BUSY_POLL_US=50000   the busy-poll window of the polling case
#   RATE=1000000pps      trafgen's rate (trafgen -b syntax)
#   RATE_SECONDS=5       seconds of trafgen per case
#   TAPBRIDGE_ARGS=""    extra tap-bridge arguments, e.g. "--workers 1"
#   TAPBRIDGE_BIN=path   use this binary instead of building the example
#   KEEP_LOGS=1          keep the work directory
#
# Names carry the script's pid ("tyg-...-<pid>"), addresses are 10.215.x.y inside those
# namespaces only; everything is removed on exit, error or Ctrl-C.
set -euo pipefail

CASES=${CASES:-latency,rate,mq}
MQ_SECONDS=${MQ_SECONDS:-10}
MEASURE=
PING_COUNT=${PING_COUNT:-200}
SOCKPERF_SECONDS=${SOCKPERF_SECONDS:-5}
IDLE_SECONDS=${IDLE_SECONDS:-10}
BUSY_POLL_US=${BUSY_POLL_US:-50000}
RATE=${RATE:-1000000pps}
RATE_SECONDS=${RATE_SECONDS:-5}
TAPBRIDGE_ARGS=${TAPBRIDGE_ARGS:-}
ID=$$

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/tapyard-edge.XXXXXX)
NS_LIST=()
PIDS=()
BRIDGE_PID=""

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'edge.sh: %s\n' "$*" >&2; exit 1; }

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_switch
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    for ns in "${NS_LIST[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    if [[ -n "${KEEP_LOGS:-}" ]]; then log "logs kept in $WORK"; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed${2:+ (apt-get install $2)}"; }
want() { [[ ",$CASES," == *",$1,"* ]]; }
# measuring GROUP: whether the case being run measures GROUP.
measuring() { [[ ",$MEASURE," == *",$1,"* ]]; }

ns_add() { ip netns add "$1"; NS_LIST+=("$1"); ip -n "$1" link set lo up; }
ns_del() {
    local ns=$1 keep=() n
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    for n in "${NS_LIST[@]}"; do [[ $n == "$ns" ]] || keep+=("$n"); done
    NS_LIST=("${keep[@]}")
}

stop_switch() {
    [[ -n "$BRIDGE_PID" ]] || return 0
    local pid=$BRIDGE_PID
    BRIDGE_PID=""
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# idle_cpu: percent of one core the switch used over IDLE_SECONDS with no traffic.
idle_cpu() {
    local t0 t1
    t0=$(cpu_ticks "$BRIDGE_PID")
    sleep "$IDLE_SECONDS"
    t1=$(cpu_ticks "$BRIDGE_PID")
    awk -v a="$t0" -v b="$t1" -v s="$IDLE_SECONDS" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.1f", 100 * (b - a) / hz / s }'
}

# ping_pct NS ADDR: prints "p50 p99" in µs.
ping_pct() {
    local out="$WORK/ping-$1.txt"
    ip netns exec "$1" ping -c 3 -i 0.05 -W 2 "$2" >/dev/null || die "ping $2 from $1 failed"
    timeout $((PING_COUNT / 50 + 30)) ip netns exec "$1" ping -n -c "$PING_COUNT" -i 0.01 -W 2 "$2" >"$out" ||
        die "ping $2 from $1 lost packets: $(tail -2 "$out")"
    sed -n 's/.* time=\([0-9.]*\) ms.*/\1/p' "$out" | sort -n | awk '{ v[NR] = $1 * 1000 } END {
        i50 = int(NR * 0.50 + 0.5); if (i50 < 1) i50 = 1
        i99 = int(NR * 0.99 + 0.5); if (i99 < 1) i99 = 1; if (i99 > NR) i99 = NR
        printf "%.0f %.0f\n", v[i50], v[i99] }'
}

# sockperf_pct NS_CLIENT NS_SERVER ADDR: prints "p50 p99" in µs (UDP ping-pong, 64 bytes).
sockperf_pct() {
    local out="$WORK/sockperf-$1.txt" spid
    ip netns exec "$2" sockperf sr -i "$3" -p 11111 >"$WORK/sockperf-server-$2.txt" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    sleep 0.5
    timeout $((SOCKPERF_SECONDS + 30)) ip netns exec "$1" sockperf pp -i "$3" -p 11111 -m 64 \
        -t "$SOCKPERF_SECONDS" >"$out" 2>&1 || die "sockperf failed: $(tail -3 "$out")"
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null || true
    awk '/percentile 50.000 =/ { p50 = $NF } /percentile 99.000 =/ { p99 = $NF }
        END { printf "%.0f %.0f\n", p50, p99 }' "$out"
}

# rate_run NS_A DEV_A NS_B DEV_B ADDR_A ADDR_B: prints "offered delivered percent" (pkt/s).
rate_run() {
    local a=$1 da=$2 b=$3 db=$4 ipa=$5 ipb=$6 mac_a mac_b cfg rx0 tx1 rx1
    mac_a=$(ip netns exec "$a" cat "/sys/class/net/$da/address")
    mac_b=$(ip netns exec "$b" cat "/sys/class/net/$db/address")
    cfg="$WORK/trafgen-$a.cfg"
    cat >"$cfg" <<EOF
{ eth(da=$mac_b, sa=$mac_a), ipv4(saddr=$ipa, daddr=$ipb, ttl=64), udp(sp=9, dp=9), fill(0x00, 18) }
EOF
    # B's address is learnt from one warm-up ping (the Linux bridge and tapyard both learn it).
    ip netns exec "$a" ping -c 2 -i 0.05 -W 2 "$ipb" >/dev/null || die "ping $ipb from $a failed"
    rx0=$(ip netns exec "$b" cat "/sys/class/net/$db/statistics/rx_packets")
    local txd0 txd1 c0=0 c1=0
    txd0=$(ip netns exec "$a" cat "/sys/class/net/$da/statistics/tx_dropped")
    [[ -n "$BRIDGE_PID" ]] && c0=$(cpu_ticks "$BRIDGE_PID")
    timeout $((RATE_SECONDS + 10)) ip netns exec "$a" trafgen -q -P 1 -i "$cfg" -o "$da" -b "$RATE" \
        -n 0 >"$WORK/trafgen-$a.out" 2>&1 &
    local tpid=$! ppid=""
    if [[ -n "${PERF:-}" && -n "$BRIDGE_PID" ]]; then
        # PERF=1: profile the switch process during the run (perf report -i the file).
        perf record -q -g -p "$BRIDGE_PID" -o "$WORK/perf-$a.data" -- sleep "$((RATE_SECONDS - 1))" \
            >/dev/null 2>&1 &
        ppid=$!
    fi
    sleep "$RATE_SECONDS"
    [[ -n "$ppid" ]] && wait "$ppid" 2>/dev/null
    kill -INT "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null || true
    sleep 0.3
    rx1=$(ip netns exec "$b" cat "/sys/class/net/$db/statistics/rx_packets")
    txd1=$(ip netns exec "$a" cat "/sys/class/net/$da/statistics/tx_dropped")
    if [[ -n "$BRIDGE_PID" ]]; then
        # The switch's efficiency, whatever share of the CPUs it got: frames delivered per
        # CPU second of the switch process.
        c1=$(cpu_ticks "$BRIDGE_PID")
        log "  switch CPU: $(awk -v a="$c0" -v b="$c1" -v s="$RATE_SECONDS" -v hz="$(getconf CLK_TCK)" \
            'BEGIN { printf "%.0f", 100 * (b - a) / hz / s }') % of a core, $(awk -v a="$c0" -v b="$c1" \
            -v r="$((rx1 - rx0))" -v hz="$(getconf CLK_TCK)" \
            'BEGIN { printf "%.2f", (b > a) ? r / ((b - a) / hz) / 1e6 : 0 }') M frames delivered per CPU second"
    fi
    # Where the rest went: dropped at pod A's interface (a TAP's queue full: the switch did
    # not read in time; a veth does not queue).
    log "  pod A's $da tx_dropped: $((txd1 - txd0)) ($(awk -v d="$((txd1 - txd0))" -v s="$RATE_SECONDS" 'BEGIN { printf "%.3f", d / s / 1e6 }') M/s)"
    # Offered: what trafgen handed to pod A's interface (a TAP's full queue drops it there,
    # counted as tx_dropped, not tx_packets, so trafgen's own count is the one to use).
    tx1=$(tr -d '\r' <"$WORK/trafgen-$a.out" | awk '/packets outgoing/ { print $1 }')
    [[ -n "$tx1" ]] || die "trafgen failed: $(tail -3 "$WORK/trafgen-$a.out")"
    awk -v t="$tx1" -v r="$((rx1 - rx0))" -v s="$RATE_SECONDS" \
        'BEGIN { printf "%.3f %.3f %.0f\n", t / s / 1e6, r / s / 1e6, (t > 0) ? 100 * r / t : 0 }'
}

# iperf_p NS_CLIENT NS_SERVER ADDR: prints Gbit/s received with 4 streams.
iperf_p() {
    local spid json="$WORK/iperf-$1.json"
    ip netns exec "$2" iperf3 -s -1 -B "$3" -p 5211 >/dev/null 2>&1 &
    spid=$!
    PIDS+=("$spid")
    sleep 0.5
    timeout $((MQ_SECONDS + 30)) ip netns exec "$1" iperf3 -c "$3" -p 5211 -P 4 -t "$MQ_SECONDS" -J >"$json" ||
        die "iperf3 -P 4 failed: $(tail -3 "$json")"
    wait "$spid" 2>/dev/null || true
    python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' "$json"
}

RESULTS=()  # "name|ping p50|ping p99|sockperf p50|sockperf p99|idle cpu before|after|offered|delivered|%"

# tapyard_case NAME NET ARGS...: pods on two TAPs bridged by tap-bridge.
tapyard_case() {
    local name=$1 net=$2; shift 2
    local sw="tyg-t$net-sw-$ID" a="tyg-t$net-a-$ID" b="tyg-t$net-b-$ID"
    local ta="tyg${ID}a$net" tb="tyg${ID}b$net"
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    log "$name: tap-bridge $* $ta $tb"
    ip netns exec "$sw" "$BIN" "$@" "$ta" "$tb" >"$WORK/tb-$net.out" 2>"$WORK/tb-$net.err" &
    BRIDGE_PID=$!
    for _ in $(seq 100); do
        ip -n "$sw" link show dev "$tb" >/dev/null 2>&1 && break
        sleep 0.05
    done
    ip -n "$sw" link set "$ta" netns "$a"
    ip -n "$sw" link set "$tb" netns "$b"
    if [[ -n "${TAP_TXQLEN:-}" ]]; then
        # TAP_TXQLEN=N: the pods' TAP queues (frames waiting for the switch to read) hold N.
        ip -n "$a" link set "$ta" txqueuelen "$TAP_TXQLEN"
        ip -n "$b" link set "$tb" txqueuelen "$TAP_TXQLEN"
    fi
    ip -n "$a" addr add "10.215.$net.1/24" dev "$ta"; ip -n "$a" link set "$ta" up
    ip -n "$b" addr add "10.215.$net.2/24" dev "$tb"; ip -n "$b" link set "$tb" up
    sleep 0.5
    run_case "$name" "$a" "$ta" "$b" "$tb" "10.215.$net.1" "10.215.$net.2" tapyard
    stop_switch
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}

linux_case() { # NAME NET
    local name=$1 net=$2
    local sw="tyg-k$net-sw-$ID" a="tyg-k$net-a-$ID" b="tyg-k$net-b-$ID"
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    ip -n "$sw" link add veth-a type veth peer name eth0 netns "$a"
    ip -n "$sw" link add veth-b type veth peer name eth0 netns "$b"
    ip -n "$sw" link set veth-a master br0 up
    ip -n "$sw" link set veth-b master br0 up
    ip -n "$a" addr add "10.215.$net.1/24" dev eth0; ip -n "$a" link set eth0 up
    ip -n "$b" addr add "10.215.$net.2/24" dev eth0; ip -n "$b" link set eth0 up
    sleep 0.5
    run_case "$name" "$a" eth0 "$b" eth0 "10.215.$net.1" "10.215.$net.2" linux
    ns_del "$a"; ns_del "$b"; ns_del "$sw"
}

# run_case NAME NS_A DEV_A NS_B DEV_B ADDR_A ADDR_B KIND
run_case() {
    local name=$1 a=$2 da=$3 b=$4 db=$5 ipa=$6 ipb=$7 kind=$8
    local pp="- -" sp="- -" c0="-" c1="-" rr="- - -"
    if measuring mq; then
        log "$name: iperf3 -P 4, ${MQ_SECONDS}s"
        local g
        g=$(iperf_p "$a" "$b" "$ipb")
        log "$name: $g Gbit/s"
        MQ_RESULTS+=("$name|$g")
        return 0
    fi
    if [[ $kind == tapyard ]]; then
        log "$name: idle CPU, ${IDLE_SECONDS}s"
        c0=$(idle_cpu)
    fi
    if measuring latency; then
        log "$name: ping ($PING_COUNT x 10 ms)"
        pp=$(ping_pct "$a" "$ipb")
        log "$name: sockperf ping-pong ${SOCKPERF_SECONDS}s"
        sp=$(sockperf_pct "$a" "$b" "$ipb")
    fi
    if measuring rate; then
        log "$name: trafgen 64-byte frames at $RATE, ${RATE_SECONDS}s"
        rr=$(rate_run "$a" "$da" "$b" "$db" "$ipa" "$ipb")
    fi
    if [[ $kind == tapyard ]]; then
        log "$name: idle CPU after the traffic, ${IDLE_SECONDS}s"
        c1=$(idle_cpu)
    fi
    log "$name: ping p50/p99 $pp µs, sockperf p50/p99 $sp µs, idle CPU $c0/$c1 %, 64 B offered/delivered/% $rr"
    RESULTS+=("$name|${pp// /|}|${sp// /|}|$c0|$c1|${rr// /|}")
}

# ---------------------------------------------------------------------------------------------
[[ $CASES =~ ^(latency|rate|mq)(,(latency|rate|mq))*$ ]] || die "CASES: a comma-separated list of latency, rate and mq"
[[ $(id -u) -eq 0 ]] || die "run as root (it creates namespaces, TAPs, a bridge and veths)"
for t in ip ping awk timeout; do need "$t"; done
want latency && need sockperf sockperf
want rate && need trafgen netsniff-ng
want mq && need iperf3 iperf3 && need python3
log "machine: $(nproc) CPUs, kernel $(uname -r)"

if [[ -z "${TAPBRIDGE_BIN:-}" ]]; then
    log "building tap-bridge (release)"
    (cd "$ROOT" && cargo build --release --example tap-bridge) >&2
fi
BIN=${TAPBRIDGE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/tap-bridge}
[[ -x "$BIN" ]] || die "no tap-bridge binary at $BIN"
# shellcheck disable=SC2206 # split on purpose
EXTRA=($TAPBRIDGE_ARGS)

MQ_RESULTS=()  # "name|Gbit/s"
MEASURE=""
want latency && MEASURE+=latency,
want rate && MEASURE+=rate,
# IO_MODES: the tap-bridge --io modes to run the latency/rate cases with (when it has --io).
IO_MODES=${IO_MODES:-plain uring}
"$BIN" --help 2>&1 | grep -q -- '--io ' || IO_MODES=default
if [[ -n $MEASURE ]]; then
    net=10
    for io in $IO_MODES; do
        IOARG=()
        [[ $io == default ]] || IOARG=(--io "$io")
        tapyard_case "tapyard $io, polling off" $((net + 1)) "${EXTRA[@]}" "${IOARG[@]}"
        tapyard_case "tapyard $io, polling off, 1 worker" $((net + 2)) "${EXTRA[@]}" "${IOARG[@]}" --workers 1
        if "$BIN" --help 2>&1 | grep -q -- --busy-poll-us; then
            tapyard_case "tapyard $io, --busy-poll-us $BUSY_POLL_US" $((net + 3)) "${EXTRA[@]}" "${IOARG[@]}" --busy-poll-us "$BUSY_POLL_US"
        fi
        net=$((net + 10))
    done
    linux_case "linux bridge" 3
fi
if want mq; then
    MEASURE=mq
    tapyard_case "tapyard, 2 workers, 1 queue" 4 "${EXTRA[@]}" --workers 2
    if "$BIN" --help 2>&1 | grep -q -- --queues; then
        tapyard_case "tapyard, 2 workers, --queues 2" 5 "${EXTRA[@]}" --workers 2 --queues 2
    fi
    linux_case "linux bridge" 6
fi

printf '\n%-34s %15s %15s %17s %13s %26s\n' "case" "ping p50/p99" "sockperf p50/p99" "idle CPU %" \
    "" "64 B Mpkt/s offered/deliv."
for r in "${RESULTS[@]+"${RESULTS[@]}"}"; do
    IFS='|' read -r n p50 p99 s50 s99 c0 c1 off del pct <<<"$r"
    printf '%-34s %8s/%-6s %8s/%-6s µs %6s/%-6s %20s/%-6s (%s %%)\n' "$n" "$p50" "$p99" "$s50" "$s99" "$c0" "$c1" "$off" "$del" "$pct"
done
if [[ ${#MQ_RESULTS[@]} -gt 0 ]]; then
    printf '\n%-34s %s\n' "case (iperf3 -P 4, ${MQ_SECONDS}s)" "Gbit/s"
    for r in "${MQ_RESULTS[@]}"; do
        IFS='|' read -r n g <<<"$r"
        printf '%-34s %s\n' "$n" "$g"
    done
fi
