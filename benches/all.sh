#!/usr/bin/env bash
# Everything a user compares tapyard with Linux on, in one run, side by side: the end-to-end
# throughput and latency cases of benches/e2e.sh (one TCP stream bridged, routed and pod ->
# ClusterIP, with ping) and the edge cases of benches/edge.sh (ping and sockperf p50/p99 with
# busy polling off and on, idle CPU, the 64-byte frame rate, multi-queue with 4 TCP streams),
# tapyard with both I/O modes (--io plain and --io uring) where they differ.
#
# Run by hand as root (not in CI):   sudo -E benches/all.sh
#
# It builds the release binaries once (tap-bridge, tap-router, tapyard), then runs e2e.sh and
# edge.sh with them and prints their summaries (the full logs are in the work directory with
# KEEP_LOGS=1). Environment: as e2e.sh and edge.sh (DURATION, PING_COUNT, CASES of each is
# E2E_CASES / EDGE_CASES here, RATE, BUSY_POLL_US, IO_MODES...); wrap the run in
# `flock /tmp/measure.lock` on a shared machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d /tmp/tapyard-all.XXXXXX)
trap '[[ -n "${KEEP_LOGS:-}" ]] && echo "logs kept in $WORK" >&2 || rm -rf "$WORK"' EXIT

[[ $(id -u) -eq 0 ]] || { echo "all.sh: run as root" >&2; exit 1; }
if [[ -z "${SKIP_BUILD:-}" ]]; then
    (cd "$ROOT" && cargo build --release --example tap-bridge --example tap-router -p tapyard &&
        cargo build --release -p tapyard-cli) >&2
fi
export TAPBRIDGE_BIN=${TAPBRIDGE_BIN:-$TARGET/release/examples/tap-bridge}
export TAPROUTER_BIN=${TAPROUTER_BIN:-$TARGET/release/examples/tap-router}
export TAPYARD_BIN=${TAPYARD_BIN:-$TARGET/release/tapyard}

echo "load average before: $(cat /proc/loadavg)"
CASES=${E2E_CASES:-bridge,routed,service} bash "$ROOT/benches/e2e.sh" >"$WORK/e2e.txt" 2>"$WORK/e2e.err" ||
    { tail -20 "$WORK/e2e.err" >&2; exit 1; }
echo "load average after e2e.sh: $(cat /proc/loadavg)"
CASES=${EDGE_CASES:-latency,rate,mq} bash "$ROOT/benches/edge.sh" >"$WORK/edge.txt" 2>"$WORK/edge.err" ||
    { tail -20 "$WORK/edge.err" >&2; exit 1; }
echo "load average after edge.sh: $(cat /proc/loadavg)"
echo
echo "=== benches/e2e.sh: one TCP stream and ping, bridged / routed / pod -> ClusterIP"
sed -n '/^machine:/,$p' "$WORK/e2e.txt"
echo
echo "=== benches/edge.sh: latency, idle CPU, 64-byte frames, multi-queue"
grep -E 'tx_dropped|switch CPU' "$WORK/edge.err" | sed 's/^== */  /' || true
cat "$WORK/edge.txt"
