#!/usr/bin/env bash
# Instructions per frame of tapyard's per-packet datapath work, counted by callgrind, for
# six cases: bridged (bench `bridge`, forwarding_decision/tapyard_fdb/1000), routed
# (bench `datapath`, datapath_routed/tapyard), routed IPv6 (datapath_routed/tapyard_ipv6, the
# same packets over IPv6), NAT (bench `nat`, established DNAT'd TCP, one connection per port,
# datapath_dnat/tapyard_dnat_established_one_flow), and established DNAT'd TCP with 32
# connections per port over IPv4 (`nat32`, datapath_dnat/tapyard_dnat_established) and IPv6
# (`nat6`, datapath_dnat/tapyard_dnat_established_v6).
#
# usage: bash benches/callgrind.sh [REPO_DIR]      (benches built: cargo bench --no-run)
#
# Method (deterministic, the default). Each case runs its bench binary under callgrind with
# TAPYARD_BENCH_ITERS=$ITERS (default 2000) and TAPYARD_BENCH_ID=<group/name>: the bench
# (registered through testkit/src/bench.rs `bench_batched`/`bench_iter`) then runs exactly
# that many iterations inside `tapyard_testkit::bench::measured`, the only function collected
# (--toggle-collect), and criterion runs nothing (its filter matches no bench).
# TAPYARD_HASH_SEED=$SEED (default 1) fixes every table's hash secrets (src/hash.rs). Two
# runs of one binary give the same figure to the instruction; set-up (table warm-up,
# pump.drain rounds, other groups) is not counted.
# From the callgrind output we sum, over all call sites, the calls to `Datapath::process` and
# their inclusive Ir:
#     Ir/frame = inclusive Ir of process / (calls to process x FRAMES_PER_CALL)
# with FRAMES_PER_CALL = 32 (BATCH_SIZE): bridge calls process on one 32-frame batch per
# iteration; routed and nat run one Pump::poll per iteration over 4 sender ports each holding
# 32 frames (the pump skips empty ports), i.e. 4 calls of 32 frames.
# DETERMINISTIC=0: the old method, criterion's --profile-time $PROFILE_TIME with collection in
# criterion::routine::Routine::profile (iteration count by wall time: ±2 % between runs).
# Cross-check (stderr, informational): in routed/nat every frame goes through
# Datapath::route once (not inlined in 0009063), so route calls / (process calls x 32) ~ 1.
#
# `process` is matched by name, ending in `::process` with `Datapath` in the path, so both
# `tapyard::datapath::Datapath::process` and e.g.
# `tapyard::datapath::pipeline::<impl tapyard::datapath::Datapath>::process` are counted.
# The transmit step (Datapath::dispatch_runs + the port's send_batch: the copy into the
# in-memory port queue), only present in routed/nat, is reported separately on stderr
# (`dispatch` column) and NOT included in the printed figure.
#
# Env: CASES="routed nat6" runs only those, ITERS, SEED, DETERMINISTIC (above), ROUTED6=0 and
# NAT6=0 skip the IPv6 cases (benches older than them), FILE_BACKED=1 adds a case, `nat_file` (the NAT case on a file-backed table),
# PROFILE_TIME (default 2), FRAMES_PER_CALL (default 32), KEEP=1 keeps the raw
# callgrind files (printed path), TARGET_DIR (default REPO_DIR/target).
set -euo pipefail

repo=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
target=${TARGET_DIR:-$repo/target}
ptime=${PROFILE_TIME:-2}
fpc=${FRAMES_PER_CALL:-32}
# DETERMINISTIC=0 falls back to criterion's --profile-time (benches without the mode).
det=${DETERMINISTIC:-1}
iters=${ITERS:-2000}
seed=${SEED:-1}
work=$(mktemp -d /tmp/cgmeasure.XXXXXX)
[[ ${KEEP:-0} == 1 ]] || trap 'rm -rf "$work"' EXIT

# The newest executable target/release/deps/<bench>-<16 hex>.
bench_bin() {
    local b
    b=$(ls -t "$target"/release/deps/"$1"-* 2>/dev/null |
        grep -E "/$1-[0-9a-f]{16}\$" | while read -r f; do [[ -x $f ]] && echo "$f"; done |
        head -n1)
    [[ -n $b ]] || { echo "no bench binary $1 under $target/release/deps" >&2; exit 1; }
    echo "$b"
}

PROCESS_RX='^tapyard::.*Datapath.*::process$'
DISPATCH_RX='^tapyard::.*Datapath.*::dispatch(_runs)?(<.*>)?$'
ROUTE_RX='^tapyard::.*::route$'

run_case() { # label bench filter
    local label=$1 bench=$2 filter=$3 bin out
    bin=$(bench_bin "$bench")
    out=$work/callgrind.$label.out
    if [[ $det == 1 ]]; then
        # The deterministic mode: exactly $iters iterations of the one bench whose id is
        # the filter without its anchors, collected inside bench::measured; fixed hash seeds.
        local id=${filter#^}
        id=${id%\$}
        (cd "$work" && CRITERION_HOME="$work/criterion" TAPYARD_BENCH_ITERS=$iters \
            TAPYARD_BENCH_ID="$id" TAPYARD_HASH_SEED=$seed \
            valgrind --tool=callgrind --callgrind-out-file="$out" \
            --toggle-collect='*bench::measured*' \
            --compress-strings=no --compress-pos=no \
            "$bin" --bench "^deterministic mode: no criterion bench$" \
            >"$work/$label.stdout" 2>"$work/$label.valgrind") ||
            { echo "$label: valgrind run failed:" >&2; tail -n 20 "$work/$label.valgrind" >&2; exit 1; }
        grep -q "^$id: $iters deterministic iterations" "$work/$label.stdout" ||
            { echo "$label: no bench has the id '$id'" >&2; cat "$work/$label.stdout" >&2; exit 1; }
    else
        (cd "$work" && CRITERION_HOME="$work/criterion" \
            valgrind --tool=callgrind --callgrind-out-file="$out" \
            --toggle-collect='criterion::routine::Routine::profile*' \
            --compress-strings=no --compress-pos=no \
            "$bin" --bench --profile-time "$ptime" "$filter" \
            >"$work/$label.stdout" 2>"$work/$label.valgrind") ||
            { echo "$label: valgrind run failed:" >&2; tail -n 20 "$work/$label.valgrind" >&2; exit 1; }
        # Exactly one benchmark must have run (the filter is a regex; anchored).
        local ran
        ran=$(grep -c "Complete (Analysis Disabled)" "$work/$label.stdout" || true)
        [[ $ran == 1 ]] ||
            { echo "$label: filter '$filter' ran $ran benchmarks, expected 1" >&2; cat "$work/$label.stdout" >&2; exit 1; }
    fi
    python3 "$here/cg_sum.py" "$out" "process=$PROCESS_RX" "dispatch=$DISPATCH_RX" \
        "route=$ROUTE_RX" >"$work/$label.sum"
    python3 - "$label" "$fpc" "$work/$label.sum" <<'PY'
import sys
label, fpc, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = {}
for line in open(path):
    k, c, ir, names = line.split(maxsplit=3)
    s[k] = (int(c), int(ir), names.strip())
pc, pir, pnames = s["process"]
if pc == 0:
    sys.exit(f"{label}: no calls to Datapath::process were counted (inlined? renamed?)")
frames = pc * fpc
dc, dir_, _ = s["dispatch"]
rc, _, _ = s["route"]
print(f"{label} {pir / frames:.1f}")
print(f"  [{label}] process: {pc} calls x {fpc} frames, {pir} Ir incl ({pnames});"
      f" dispatch: {dc} calls, {dir_ / frames:.1f} Ir/frame; route calls / frames: {rc / frames:.4f}",
      file=sys.stderr)
PY
}

# CASES="routed nat" runs only those labels.
want() { [[ -z ${CASES:-} || " $CASES " == *" $1 "* ]]; }
want bridge && run_case bridge bridge '^forwarding_decision/tapyard_fdb/1000$'
want routed && run_case routed datapath '^datapath_routed/tapyard$'
# ROUTED6=0 skips it (benches older than the IPv6 case).
[[ ${ROUTED6:-1} == 1 ]] && want routed6 && run_case routed6 datapath '^datapath_routed/tapyard_ipv6$'
want nat && run_case nat nat '^datapath_dnat/tapyard_dnat_established_one_flow$'
# NAT6=0 skips the 32-connections-per-port pair (IPv4 beside IPv6; benches older than it).
if [[ ${NAT6:-1} == 1 ]]; then
    want nat32 && run_case nat32 nat '^datapath_dnat/tapyard_dnat_established$'
    want nat6 && run_case nat6 nat '^datapath_dnat/tapyard_dnat_established_v6$'
fi
# FILE_BACKED=1: also the NAT case with the connection table in a file (/dev/shm).
[[ ${FILE_BACKED:-0} == 1 ]] &&
    run_case nat_file nat '^datapath_dnat/tapyard_dnat_established_one_flow_file$'
[[ ${KEEP:-0} == 1 ]] && echo "raw callgrind files kept in $work" >&2
exit 0
