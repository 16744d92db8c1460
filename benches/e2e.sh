#!/usr/bin/env bash
# End-to-end throughput and latency: tapyard's tap-bridge against a Linux bridge with veths,
# tapyard's tap-router against Linux routing between two Linux bridges, and pod -> ClusterIP
# through tapyard's conntrack NAT against the kernel with kube-proxy's iptables rules.
#
# Run by hand as root (not in CI):   sudo -E benches/e2e.sh
#                                    sudo -E CASES=service benches/e2e.sh
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
# Service cases (CASES=service), pod A -> ClusterIP 10.96.N.10 on one node: client pod A
# (10.244.N.2), endpoint pods B (.3) and C (.4, when ENDPOINTS=2) on one cni0-like bridge whose
# gateway is 10.244.N.1/24, pods' default route via it. Two Service ports:
#   http   10.96.N.10:80   -> B:8080 (and C:8080), a tiny HTTP/1.0 server on each endpoint
#   iperf  10.96.N.10:5201 -> B:5201 only (iperf3's control and data connections must reach
#                             the same server, so this port has one endpoint)
#   tapyard service  tap-router --bridge cni0=GW/24 --port cni0:TAP... --cluster-cidr
#                  10.244.0.0/16 --service ... (offload TAPs)
#   tapyard run service  the same node through `tapyard run FILE` (the command a user runs):
#                  [[bridge]] cni0 with the TAPs as ports, a [[service]] per Service port
#   linux service  a "node" namespace: pods on veths into a Linux bridge cni0 holding the gateway
#                  (hairpin on, as the bridge CNI sets it), ip_forward=1, br_netfilter with
#                  bridge-nf-call-iptables=1, and the nat and filter rules kube-proxy's iptables
#                  mode writes for these Services (KUBE-SERVICES, KUBE-SVC-* with statistic
#                  random probabilities over KUBE-SEP-* DNAT chains, KUBE-MARK-MASQ for sources
#                  outside the cluster CIDR and for hairpin, KUBE-POSTROUTING MASQUERADE
#                  --random-fully, KUBE-NODEPORTS, KUBE-FORWARD), default offloads
# Per case: HTTP with a new TCP connection per request (`ab -c HTTP_CONCURRENCY` for
# HTTP_SECONDS against http://10.96.N.10/; errors and each endpoint's answer count are checked),
# then one iperf3 TCP stream to 10.96.N.10:5201 for DURATION seconds. No ping: ICMP echo to a
# ClusterIP is not DNAT'd.
# Reading the figures: on Linux the bridging, conntrack and NAT of a packet run in the sending
# process's context (veth transmit, softirq on the same CPU as ab or the server), while
# tapyard does them in its own worker threads; on a machine with few CPUs that placement, not
# only the cost of the rules, shows in the request rate (on Linux, pod to pod without the
# Service was only 10-30% faster than through it on the 2-CPU machine it was written on).
#
# Environment:
#   DURATION=10          iperf3 seconds per case
#   PING_COUNT=200       pings per case
#   CASES=bridge,routed,service  which groups of cases to run (any of them, comma-separated)
#   HTTP_SECONDS=8       service cases: seconds of HTTP requests
#   HTTP_CONCURRENCY=8   service cases: concurrent connections (ab -c)
#   ENDPOINTS=2          service cases: endpoints of the http port, 1 (B) or 2 (B and C)
#   TAPBRIDGE_ARGS=""    extra tap-bridge arguments, e.g. "--workers 1"
#   TAPBRIDGE_BIN=path   use this binary instead of building the example
#   TAPROUTER_ARGS=...   extra tap-router arguments (default: TAPBRIDGE_ARGS), routed and
#                        service cases
#   TAPROUTER_BIN=path   use this binary instead of building the example
#   RUN_SERVICE=1        service cases: also run the tapyard case through the `tapyard run`
#                        command (the node as a TOML file: bridge cni0, the two Service ports;
#                        offload TAPs, default workers); 0 skips it
#   TAPYARD_BIN=path     use this `tapyard` binary instead of building tapyard-cli
#   KEEP_LOGS=1          keep the work directory (tap-bridge/tap-router output, iperf3 JSON)
#
# Missing iptables, ab (apache2-utils), iperf3 and curl are installed with apt-get when
# available.
#
# Names carry the script's pid ("tye-...-<pid>") and addresses are 10.214.x.y, 10.244.x.y and
# 10.96.x.y inside those namespaces only; everything (iptables rules included: they live in the
# node namespace) is removed on exit, error or Ctrl-C.
set -euo pipefail

DURATION=${DURATION:-10}
PING_COUNT=${PING_COUNT:-200}
TAPBRIDGE_ARGS=${TAPBRIDGE_ARGS:-}
TAPROUTER_ARGS=${TAPROUTER_ARGS:-$TAPBRIDGE_ARGS}
CASES=${CASES:-bridge,routed,service}
HTTP_SECONDS=${HTTP_SECONDS:-8}
HTTP_CONCURRENCY=${HTTP_CONCURRENCY:-8}
ENDPOINTS=${ENDPOINTS:-2}
RUN_SERVICE=${RUN_SERVICE:-1}
IPERF_PORT=5201
ID=$$

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/tapyard-e2e.XXXXXX)

NS_LIST=()        # namespaces to delete
STATE_DIRS=()     # `tapyard run` state directories to delete
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
    for d in "${STATE_DIRS[@]}"; do rm -rf "$d"; done
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

# ensure TOOL PACKAGE: installs PACKAGE with apt-get when TOOL is missing (and apt-get exists).
ensure() {
    command -v "$1" >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || die "$1 is not installed (package $2)"
    log "installing $2 (for $1)"
    timeout 300 env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >"$WORK/apt-$2.log" 2>&1 ||
        { timeout 300 apt-get update -q >/dev/null 2>&1 &&
            timeout 300 env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >"$WORK/apt-$2.log" 2>&1; } ||
        die "cannot install $2: $(tail -2 "$WORK/apt-$2.log")"
    command -v "$1" >/dev/null 2>&1 || die "$2 installed but $1 is still missing"
}


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
    # "rtt min/avg/max/mdev = 0.011/0.022/0.033/0.004 ms" -> "avg mdev" (with ", pipe N" after
    # it when a reply came after the next ping was sent)
    summary=$(sed -n 's|^rtt .* = \([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\) ms\(, pipe [0-9]*\)\{0,1\}$|\2 \4|p' "$out")
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
[[ $CASES =~ ^(bridge|routed|service)(,(bridge|routed|service))*$ ]] ||
    die "CASES must be a comma-separated list of bridge, routed and service, not '$CASES'"
[[ $HTTP_SECONDS =~ ^[1-9][0-9]*$ ]] || die "HTTP_SECONDS must be a positive number of seconds, not '$HTTP_SECONDS'"
[[ $HTTP_CONCURRENCY =~ ^[1-9][0-9]*$ ]] || die "HTTP_CONCURRENCY must be a positive number, not '$HTTP_CONCURRENCY'"
[[ $ENDPOINTS =~ ^[12]$ ]] || die "ENDPOINTS must be 1 or 2, not '$ENDPOINTS'"
[[ $RUN_SERVICE =~ ^[01]$ ]] || die "RUN_SERVICE must be 0 or 1, not '$RUN_SERVICE'"
[[ $(id -u) -eq 0 ]] || die "run as root (it creates namespaces, TAPs, a bridge and veths)"
ensure iperf3 iperf3
for t in ip ping ethtool ss awk python3 timeout; do need "$t"; done
if [[ ",$CASES," == *",service,"* ]]; then
    ensure iptables iptables
    ensure iptables-restore iptables
    ensure ab apache2-utils
    ensure curl curl
fi

log "machine: $(nproc) CPUs, kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

want() { [[ ",$CASES," == *",$1,"* ]]; }
BUILD=()
want bridge && [[ -z "${TAPBRIDGE_BIN:-}" ]] && BUILD+=(--example tap-bridge)
if want routed || want service; then [[ -n "${TAPROUTER_BIN:-}" ]] || BUILD+=(--example tap-router); fi
if [[ ${#BUILD[@]} -gt 0 ]]; then
    log "building ${BUILD[*]} (release)"
    (cd "$ROOT" && CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release "${BUILD[@]}") >&2
fi
if want service && [[ $RUN_SERVICE == 1 && -z "${TAPYARD_BIN:-}" ]]; then
    log "building tapyard-cli (release)"
    (cd "$ROOT" && CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release -p tapyard-cli) >&2
fi
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
TBIN=""
if want service && [[ $RUN_SERVICE == 1 ]]; then
    TBIN=${TAPYARD_BIN:-$TARGET/release/tapyard}
    [[ -x "$TBIN" ]] || die "no tapyard binary at $TBIN"
fi
BIN=${TAPBRIDGE_BIN:-$TARGET/release/examples/tap-bridge}
RBIN=${TAPROUTER_BIN:-$TARGET/release/examples/tap-router}
if want bridge; then [[ -x "$BIN" ]] || die "no tap-bridge binary at $BIN"; fi
if want routed || want service; then [[ -x "$RBIN" ]] || die "no tap-router binary at $RBIN"; fi
if want service; then
    "$RBIN" --help 2>&1 | grep -q -- --service || die "$RBIN has no --service (an older tap-router?)"
fi

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

# --- service cases: pod A -> ClusterIP 10.96.N.10 DNAT'd to pods B (and C) on one bridge -------
SRESULTS=()  # "name|req/s|replies|errors|mean ms|p50 ms|p99 ms|per endpoint|gbits|retr|pod drops"
HTTP_PORT=8080   # the endpoints' HTTP port (targetPort)
SVC_IPERF=5201   # the iperf port of the Service and of its endpoint B

# A tiny HTTP/1.0 server: one blocking loop, one request per connection, a fixed answer, the
# server closes first (so TIME_WAIT stays on the endpoint, as with a real server). On SIGTERM
# it writes how many requests it answered to the file given.
HTTP_SERVER='
import os, signal, socket, sys
port, out, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
body = ("hello from %s\n" % name).encode()
resp = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
n = 0
def stop(*_):
    with open(out, "w") as f:
        f.write("%d\n" % n)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(4096)
while True:
    c, _ = s.accept()
    try:
        if c.recv(4096):
            c.sendall(resp)
            n += 1
    except OSError:
        pass
    c.close()
'

# http_servers TAG NS:NAME...: starts the HTTP server in each NS on HTTP_PORT; sets HSPIDS.
http_servers() {
    local tag=$1 x ns n; shift
    HSPIDS=()
    for x in "$@"; do
        ns=${x%%:*}; n=${x#*:}
        ip netns exec "$ns" python3 -c "$HTTP_SERVER" "$HTTP_PORT" "$WORK/http-$tag-$n.count" "$n" \
            2>"$WORK/http-$tag-$n.err" &
        HSPIDS+=($!)
        PIDS+=($!)
    done
    for x in "$@"; do
        ns=${x%%:*}
        for _ in $(seq 50); do
            ip netns exec "$ns" ss -Hltn "sport = :$HTTP_PORT" | grep -q . && break
            sleep 0.1
        done
        ip netns exec "$ns" ss -Hltn "sport = :$HTTP_PORT" | grep -q . ||
            die "HTTP server in $ns did not start: $(cat "$WORK/http-$tag-${x#*:}.err")"
    done
}

# http_stop: stops the HTTP servers (each writes its answer count).
http_stop() {
    local p
    for p in "${HSPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${HSPIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}

# http_bench NS URL TAG NAME...: a few single requests first (they must answer, from one of the
# endpoints), then ab for HTTP_SECONDS; sets HTTP="req/s replies errors mean p50 p99" (ms).
http_bench() {
    local ns=$1 url=$2 tag=$3 out body ok=0; shift 3
    for _ in $(seq 10); do
        body=$(timeout 5 ip netns exec "$ns" curl -s -m 3 "$url" 2>/dev/null) || body=""
        if [[ $body == "hello from "* ]]; then ok=$((ok + 1)); [[ $ok -ge 3 ]] && break; fi
        sleep 0.2
    done
    [[ $ok -ge 3 ]] || die "$tag: no HTTP answer from $url (got '${body:-nothing}')"
    out="$WORK/ab-$tag.txt"
    # -t stops after HTTP_SECONDS (-n only lifts ab's default cap of 50000 requests); -r goes on
    # after a failed read; -s 5: a request without an answer for 5 s counts as an error.
    timeout $((HTTP_SECONDS + 60)) ip netns exec "$ns" \
        ab -q -r -s 5 -t "$HTTP_SECONDS" -n 10000000 -c "$HTTP_CONCURRENCY" "$url" >"$out" 2>&1 ||
        die "$tag: ab failed: $(tail -3 "$out")"
    HTTP=$(awk '
        /^Complete requests:/ { c = $3 }
        /^Failed requests:/ { f = $3 }
        /^Non-2xx responses:/ { x = $3 }
        /^Requests per second:/ { r = $4 }
        /^  50%/ { p50 = $2 }
        /^  99%/ { p99 = $2 }
        /^Time per request:.*\(mean\)$/ { m = $4 }
        END { if (c == "") exit 1; printf "%.0f %d %d %s %s %s\n", r, c, f + x, (m == "" ? "nan" : m), (p50 == "" ? "nan" : p50), (p99 == "" ? "nan" : p99) }' "$out") ||
        die "$tag: cannot parse ab output: $(tail -5 "$out")"
}

# iperf_vip NS_CLIENT NS_SERVER VIP TAG: iperf3 server on SVC_IPERF in NS_SERVER, one stream
# from NS_CLIENT to VIP:SVC_IPERF (DNAT'd to it); sets TPUT="gbits retransmits".
iperf_vip() {
    local cns=$1 sns=$2 vip=$3 tag=$4 spid json
    ip netns exec "$sns" iperf3 -s -1 -p "$SVC_IPERF" >"$WORK/iperf-server-$tag.log" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    for _ in $(seq 50); do
        ip netns exec "$sns" ss -Hltn "sport = :$SVC_IPERF" | grep -q . && break
        sleep 0.1
    done
    json="$WORK/iperf-$tag.json"
    if ! timeout $((DURATION + 30)) ip netns exec "$cns" iperf3 -c "$vip" -p "$SVC_IPERF" -t "$DURATION" -J >"$json"; then
        die "iperf3 ($tag) to $vip:$SVC_IPERF failed: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error","?"))' "$json" 2>/dev/null || tail -3 "$json")"
    fi
    wait "$spid" 2>/dev/null || true
    TPUT=$(python3 - "$json" <<'PY'
import json, sys
end = json.load(open(sys.argv[1]))["end"]
print("%.3f %d" % (end["sum_received"]["bits_per_second"] / 1e9,
                   end["sum_sent"].get("retransmits", 0)))
PY
)
    local bytes
    bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bytes"])' "$json")
    [[ $bytes -gt 0 ]] || die "iperf3 ($tag): nothing received"
}

# measure_service NAME N NS_A DEV_A NS_B DEV_B [NS_C]: HTTP then iperf3 from A to 10.96.N.10;
# appends to SRESULTS.
measure_service() {
    local name=$1 net=$2 a=$3 da=$4 b=$5 db=$6 c=${7:-} vip="10.96.$2.10" tag d0 d1
    tag=${name//[^a-z]/_}
    d0=$(( $(pod_drops "$a" "$da") + $(pod_drops "$b" "$db") ))
    local servers=("$b:B")
    [[ -n "$c" ]] && servers+=("$c:C")
    http_servers "$tag" "${servers[@]}"
    log "$name: HTTP, a new connection per request, ab -c $HTTP_CONCURRENCY for ${HTTP_SECONDS}s to http://$vip/"
    http_bench "$a" "http://$vip/" "$tag"
    http_stop
    local rps n err mean p50 p99 per="" x cnt total=0
    read -r rps n err mean p50 p99 <<<"$HTTP"
    for x in "${servers[@]}"; do
        cnt=$(cat "$WORK/http-$tag-${x#*:}.count" 2>/dev/null || echo 0)
        total=$((total + cnt))
        per+="${per:+/}${x#*:} $cnt"
    done
    # The servers also answered the warm-up requests, and requests ab gave up on at its time
    # limit; more answers than replies is fine, fewer is not.
    [[ $total -ge $n ]] || die "$name: the endpoints answered $total requests but ab counted $n replies"
    [[ $n -gt 0 ]] || die "$name: no HTTP replies"
    [[ -z "$c" || $per != *" 0"* ]] || log "WARNING: $name: an endpoint got no request ($per)"
    log "$name: $rps req/s, $n replies, $err errors, connect+request mean $mean ms p50 $p50 ms p99 $p99 ms; answered by $per"
    log "$name: iperf3 TCP, 1 stream, ${DURATION}s, to $vip:$SVC_IPERF"
    iperf_vip "$a" "$b" "$vip" "$tag"
    d1=$(( $(pod_drops "$a" "$da") + $(pod_drops "$b" "$db") ))
    local g r
    read -r g r <<<"$TPUT"
    log "$name: $g Gbit/s ($r retransmits, $((d1 - d0)) drops in the pods' interfaces)"
    SRESULTS+=("$name|$rps|$n|$err|$mean|$p50|$p99|$per|$g|$r|$((d1 - d0))")
}

# service_pods NS_NODE NET: the pods' namespaces' common setup (after their interfaces exist):
# a wide ephemeral port range in the client, so ab does not run out of source ports.
service_client_setup() {
    ip netns exec "$1" sysctl -qw net.ipv4.ip_local_port_range="1024 65535"
}

# tapyard_service_case NAME N LAUNCHER EXTRA_ARGS...: pods on TAPs of one bridge with the
# Services, LAUNCHER `router` (tap-router, EXTRA_ARGS added to its arguments) or `run` (the
# `tapyard run` command with the same bridge and Services in a TOML file; offload TAPs).
tapyard_service_case() {
    local name=$1 net=$2 launcher=$3; shift 3
    local sw="tye-s$net-node-$ID" a="tye-s$net-a-$ID" b="tye-s$net-b-$ID" c=""
    local ta="tye${ID}a$net" tb="tye${ID}b$net" tc="tye${ID}c$net"
    local out="$WORK/tap-router-s$net.out" err="$WORK/tap-router-s$net.err"
    local gw="10.244.$net.1" pa="10.244.$net.2" pb="10.244.$net.3" pc="10.244.$net.4" vip="10.96.$net.10"
    local eps="$pb:$HTTP_PORT"
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    local args=(--bridge "cni0=$gw/24" --port "cni0:$ta" --port "cni0:$tb")
    local taps=("$ta" "$tb")
    if [[ $ENDPOINTS == 2 ]]; then
        c="tye-s$net-c-$ID"; ns_add "$c"
        args+=(--port "cni0:$tc"); taps+=("$tc")
        eps+=",$pc:$HTTP_PORT"
    fi
    args+=(--cluster-cidr 10.244.0.0/16
        --service "default/web:http=$vip:80/tcp=$eps"
        --service "default/web:iperf=$vip:$SVC_IPERF/tcp=$pb:$SVC_IPERF" "$@")
    if [[ $launcher == run ]]; then
        # The same node as a file for `tapyard run`: its state directory on a tmpfs, its control
        # socket in the work directory.
        local conf="$WORK/node-s$net.toml" state="/dev/shm/tye-run-s$net-$ID" t q
        STATE_DIRS+=("$state")
        {
            echo '[node]'
            echo "name = \"tye-s$net-$ID\""
            echo 'cluster_cidr = "10.244.0.0/16"'
            echo "socket = \"$WORK/node-s$net.sock\""
            echo "state_dir = \"$state\""
            echo '[[bridge]]'
            echo 'name = "cni0"'
            echo "address = \"$gw/24\""
            q=""; for t in "${taps[@]}"; do q+="${q:+, }\"$t\""; done
            echo "ports = [$q]"
            echo '[[service]]'
            echo 'name = "web-http"'
            echo "cluster_ip = \"$vip\""
            echo 'port = 80'
            q=""; for t in ${eps//,/ }; do q+="${q:+, }\"$t\""; done
            echo "endpoints = [$q]"
            echo '[[service]]'
            echo 'name = "web-iperf"'
            echo "cluster_ip = \"$vip\""
            echo "port = $SVC_IPERF"
            echo "endpoints = [\"$pb:$SVC_IPERF\"]"
        } >"$conf"
        out="$WORK/tapyard-run-s$net.out" err="$WORK/tapyard-run-s$net.err"
        log "$name: tapyard run $conf (in $sw)"
        ip netns exec "$sw" "$TBIN" run "$conf" >"$out" 2>"$err" &
    else
        log "$name: tap-router ${args[*]} (in $sw)"
        ip netns exec "$sw" "$RBIN" "${args[@]}" >"$out" 2>"$err" &
    fi
    BRIDGE_PID=$!
    wait_taps "$sw" "$BRIDGE_PID" "${taps[@]}" || die "$name did not create its TAPs: $(cat "$err")"
    ip -n "$sw" link set "$ta" netns "$a"
    ip -n "$sw" link set "$tb" netns "$b"
    addr_pod "$a" "$ta" "$pa" "$gw"
    addr_pod "$b" "$tb" "$pb" "$gw"
    if [[ -n "$c" ]]; then
        ip -n "$sw" link set "$tc" netns "$c"
        addr_pod "$c" "$tc" "$pc" "$gw"
    fi
    service_client_setup "$a"
    log "$name: pod offloads: $(offloads "$a" "$ta")"
    local t0 s0
    t0=$(cpu_ticks "$BRIDGE_PID"); s0=$(date +%s.%N)
    measure_service "$name" "$net" "$a" "$ta" "$b" "$tb" "$c"
    cpu_record "$name" "$t0" "$s0"
    stop_tapbridge
    if [[ $launcher == run ]]; then cat "$err" >>"$out"; fi
    REPORTS+=("$name|$out")
    ns_del "$a"; ns_del "$b"; [[ -z "$c" ]] || ns_del "$c"; ns_del "$sw"
}

# kube_rules N ENDPOINT_ADDR... : the iptables-restore input kube-proxy's iptables mode (v1.28+,
# --cluster-cidr 10.244.0.0/16, masqueradeBit 14) writes for the two Service ports, endpoints
# all ready and local; chain hashes as kube-proxy's are opaque, these are fixed names of the
# same shape. MASQ_ALL=1 adds --masquerade-all's rule (used when br_netfilter is missing).
kube_rules() {
    local net=$1; shift
    local vip="10.96.$net.10" n=$# i=0 ep svc=KUBE-SVC-WEBHTTP000000000 isvc=KUBE-SVC-WEBIPERF00000000
    local seps=() e
    for ep in "$@"; do seps+=("KUBE-SEP-WEBHTTP$(printf '%09d' "$i")"); i=$((i + 1)); done
    echo '*filter'
    echo ':INPUT ACCEPT [0:0]'
    echo ':FORWARD ACCEPT [0:0]'
    echo ':OUTPUT ACCEPT [0:0]'
    for e in KUBE-EXTERNAL-SERVICES KUBE-FIREWALL KUBE-FORWARD KUBE-KUBELET-CANARY KUBE-NODEPORTS \
        KUBE-PROXY-CANARY KUBE-PROXY-FIREWALL KUBE-SERVICES; do echo ":$e - [0:0]"; done
    echo '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL'
    echo '-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS'
    echo '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES'
    echo '-A INPUT -j KUBE-FIREWALL'
    echo '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL'
    echo '-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD'
    echo '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
    echo '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES'
    echo '-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL'
    echo '-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
    echo '-A OUTPUT -j KUBE-FIREWALL'
    echo '-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP'
    echo '-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP'
    echo '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT'
    echo '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT'
    echo 'COMMIT'
    echo '*nat'
    echo ':PREROUTING ACCEPT [0:0]'
    echo ':INPUT ACCEPT [0:0]'
    echo ':OUTPUT ACCEPT [0:0]'
    echo ':POSTROUTING ACCEPT [0:0]'
    for e in KUBE-KUBELET-CANARY KUBE-MARK-MASQ KUBE-NODEPORTS KUBE-POSTROUTING KUBE-PROXY-CANARY \
        KUBE-SERVICES "$svc" "$isvc" "${seps[@]}" KUBE-SEP-WEBIPERF00000000; do echo ":$e - [0:0]"; done
    echo '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
    echo '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
    echo '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING'
    echo '-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000'
    echo '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN'
    echo '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000'
    echo '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully'
    echo "-A KUBE-SERVICES -d $vip/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j $svc"
    echo "-A KUBE-SERVICES -d $vip/32 -p tcp -m comment --comment \"default/web:iperf cluster IP\" -m tcp --dport $SVC_IPERF -j $isvc"
    echo '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS'
    if [[ ${MASQ_ALL:-0} == 1 ]]; then
        echo "-A $svc -d $vip/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
    fi
    echo "-A $svc ! -s 10.244.0.0/16 -d $vip/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
    i=0
    for ep in "$@"; do
        # Endpoint i of n is taken with probability 1/(n-i) among the rest; the last always.
        if [[ $((n - i)) -gt 1 ]]; then
            echo "-A $svc -m comment --comment \"default/web:http -> $ep:$HTTP_PORT\" -m statistic --mode random --probability $(awk -v k=$((n - i)) 'BEGIN { printf "%.11f", 1 / k }') -j ${seps[$i]}"
        else
            echo "-A $svc -m comment --comment \"default/web:http -> $ep:$HTTP_PORT\" -j ${seps[$i]}"
        fi
        i=$((i + 1))
    done
    i=0
    for ep in "$@"; do
        echo "-A ${seps[$i]} -s $ep/32 -m comment --comment \"default/web:http\" -j KUBE-MARK-MASQ"
        echo "-A ${seps[$i]} -p tcp -m comment --comment \"default/web:http\" -m tcp -j DNAT --to-destination $ep:$HTTP_PORT"
        i=$((i + 1))
    done
    if [[ ${MASQ_ALL:-0} == 1 ]]; then
        echo "-A $isvc -d $vip/32 -p tcp -m comment --comment \"default/web:iperf cluster IP\" -m tcp --dport $SVC_IPERF -j KUBE-MARK-MASQ"
    fi
    echo "-A $isvc ! -s 10.244.0.0/16 -d $vip/32 -p tcp -m comment --comment \"default/web:iperf cluster IP\" -m tcp --dport $SVC_IPERF -j KUBE-MARK-MASQ"
    echo "-A $isvc -m comment --comment \"default/web:iperf -> $1:$SVC_IPERF\" -j KUBE-SEP-WEBIPERF00000000"
    echo "-A KUBE-SEP-WEBIPERF00000000 -s $1/32 -m comment --comment \"default/web:iperf\" -j KUBE-MARK-MASQ"
    echo "-A KUBE-SEP-WEBIPERF00000000 -p tcp -m comment --comment \"default/web:iperf\" -m tcp -j DNAT --to-destination $1:$SVC_IPERF"
    echo 'COMMIT'
}

# linux_service_case NAME N: the kernel with kube-proxy's rules in a "node" namespace whose Linux
# bridge cni0 holds the pods' gateway.
linux_service_case() {
    local name=$1 net=$2
    local sw="tye-k$net-node-$ID" a="tye-k$net-a-$ID" b="tye-k$net-b-$ID" c="" side ns
    local gw="10.244.$net.1" pa="10.244.$net.2" pb="10.244.$net.3" pc="10.244.$net.4"
    local eps=("$pb")
    ns_add "$sw"; ns_add "$a"; ns_add "$b"
    local sides=(a b)
    if [[ $ENDPOINTS == 2 ]]; then
        c="tye-k$net-c-$ID"; ns_add "$c"; sides+=(c); eps+=("$pc")
    fi
    ip netns exec "$sw" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$sw" link add cni0 type bridge
    ip -n "$sw" addr add "$gw/24" dev cni0
    ip -n "$sw" link set cni0 up
    for side in "${sides[@]}"; do
        case $side in a) ns=$a ;; b) ns=$b ;; c) ns=$c ;; esac
        ip -n "$sw" link add "veth-$side" type veth peer name eth0 netns "$ns"
        ip -n "$sw" link set "veth-$side" master cni0 up
        ip -n "$sw" link set "veth-$side" type bridge_slave hairpin on
    done
    # br_netfilter: bridged IPv4 (B's replies to A, on the same bridge) must pass conntrack to be
    # un-DNAT'd, as on every kube-proxy node.
    MASQ_ALL=0
    local brnf=/proc/sys/net/bridge/bridge-nf-call-iptables
    if ! ip netns exec "$sw" test -e "$brnf"; then
        if command -v modprobe >/dev/null 2>&1; then modprobe br_netfilter 2>/dev/null || true; fi
    fi
    if ip netns exec "$sw" test -e "$brnf"; then
        ip netns exec "$sw" sysctl -qw net.bridge.bridge-nf-call-iptables=1
        BRNF="br_netfilter with bridge-nf-call-iptables=1"
    else
        MASQ_ALL=1
        BRNF="NO br_netfilter: replies from B to A would be bridged past conntrack (not un-DNAT'd), so Service traffic is masqueraded (kube-proxy --masquerade-all) to route the replies through the node; slower than a real node"
        log "WARNING: $name: br_netfilter is not available; $BRNF"
    fi
    kube_rules "$net" "${eps[@]}" >"$WORK/iptables-s$net.rules"
    ip netns exec "$sw" iptables-restore <"$WORK/iptables-s$net.rules" ||
        die "iptables-restore of kube-proxy's rules failed (rules in $WORK/iptables-s$net.rules; KEEP_LOGS=1 keeps them)"
    addr_pod "$a" eth0 "$pa" "$gw"
    addr_pod "$b" eth0 "$pb" "$gw"
    [[ -z "$c" ]] || addr_pod "$c" eth0 "$pc" "$gw"
    service_client_setup "$a"
    log "$name: $BRNF; pod offloads: $(offloads "$a" eth0)"
    sleep 0.5
    measure_service "$name" "$net" "$a" eth0 "$b" eth0 "$c"
    {
        echo "iptables-save -c (the node namespace's rules with their counters):"
        ip netns exec "$sw" iptables-save -c | grep -v '^#'
        echo "conntrack entries in the node namespace: $(ip netns exec "$sw" cat /proc/sys/net/netfilter/nf_conntrack_count 2>/dev/null || echo '?')"
        echo "ICMP redirects the node sent: $(ip netns exec "$sw" cat /proc/net/snmp | awk '/^Icmp:/ { if (!h) { for (i = 1; i <= NF; i++) k[i] = $i; h = 1 } else for (i = 1; i <= NF; i++) if (k[i] == "OutRedirects") print $i }')"
    } >"$WORK/linux-s$net.out"
    REPORTS+=("$name|$WORK/linux-s$net.out")
    ns_del "$a"; ns_del "$b"; [[ -z "$c" ]] || ns_del "$c"; ns_del "$sw"
}

if want service; then
    # shellcheck disable=SC2206 # TAPROUTER_ARGS is split into arguments on purpose
    SEXTRA=($TAPROUTER_ARGS)
    tapyard_service_case "tapyard service" 21 router "${SEXTRA[@]}"
    if [[ -n "$TBIN" ]]; then
        tapyard_service_case "tapyard run service" 23 run
    fi
    linux_service_case "linux service+iptables" 22
fi

# --- report ------------------------------------------------------------------------------------
echo
for r in "${REPORTS[@]}"; do
    IFS='|' read -r n f <<<"$r"
    echo "exit report, $n (counters, drops, FDB; tap-router: router events, routes, neighbours, NAT;"
    echo "  linux service: the iptables rules and counters):"
    sed 's/^/  /' "$f"
done
echo
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), kernel $(uname -r)"
if [[ ${#RESULTS[@]} -gt 0 ]]; then
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
fi
if [[ ${#SRESULTS[@]} -gt 0 ]]; then
    echo
    echo "pod A -> ClusterIP: HTTP/1.0 with a new TCP connection per request (ab -c $HTTP_CONCURRENCY, ${HTTP_SECONDS}s) to"
    echo "10.96.N.10:80 -> $ENDPOINTS endpoint(s) :$HTTP_PORT; iperf3 1 TCP stream (${DURATION}s) to 10.96.N.10:$SVC_IPERF -> B; linux: ${BRNF:-?}"
    printf '%-24s %7s %8s %6s %7s %4s %4s %-16s %7s %6s %5s %5s\n' case req/s replies errors "mean ms" p50 p99 "answered by" Gbit/s retr drops "cpu%"
    for r in "${SRESULTS[@]}"; do
        IFS='|' read -r n rps cnt err mean p50 p99 per g rt pd <<<"$r"
        cpu=-
        for c in "${CPU[@]}"; do [[ ${c%%|*} == "$n" ]] && cpu=${c#*|}; done
        printf '%-24s %7s %8s %6s %7s %4s %4s %-16s %7s %6s %5s %5s\n' "$n" "$rps" "$cnt" "$err" "$mean" "$p50" "$p99" "$per" "$g" "$rt" "$pd" "$cpu"
    done
    echo "(mean/p50/p99: ab's connect + request + answer time per request, ms (p50/p99 whole ms);"
    echo " errors: ab's failed and non-2xx requests; answered by: requests each endpoint's server"
    echo " answered, warm-up included; drops: rx+tx dropped on A's and B's interfaces; cpu%: tap-router's"
    echo " user+system time over the HTTP and iperf3 runs, in % of one core)"
    echo
    echo "ratios tapyard / linux (req/s, throughput: <1 is slower; time per request: >1 is slower):"
    for r in "${SRESULTS[@]}"; do
        IFS='|' read -r tn trps _ _ tmean _ _ _ tg _ <<<"$r"
        [[ $tn == tapyard* ]] || continue
        for q in "${SRESULTS[@]}"; do
            IFS='|' read -r n rps _ _ mean _ _ _ g _ <<<"$q"
            [[ $n == linux* ]] || continue
            awk -v tn="$tn" -v n="$n" -v tr="$trps" -v r="$rps" -v tg="$tg" -v g="$g" -v tp="$tmean" -v p="$mean" 'BEGIN {
                printf "  %-22s / %-24s req/s %5.2fx   throughput %5.2fx   HTTP mean time %5.2fx\n",
                    tn, n, (r > 0 ? tr / r : 0), (g > 0 ? tg / g : 0), (p > 0 ? tp / p : 0) }'
        done
    done
fi
