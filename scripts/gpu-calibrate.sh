#!/usr/bin/env bash
# `eptwin calibrate` on the GPU machine (one H100 or H200), then the checks of issue 41's
# "is the twin right on my machine" acceptance with the profile it wrote, in at most 6 minutes.
# From the repository root on the GPU machine (the binary built here with `cargo build
# --release`, carried as target/release/eptwin; the DeepEP V1 wheel staged under .stage/):
#
#   OUT=/some/dir bash scripts/gpu-calibrate.sh
#
# Steps (each bounded by `timeout`, cut to what is left of the 350 s deadline; a failed step is
# logged and the next one runs):
#
#   1. DeepEP V1 wheel -> /tmp/eptwin-deepep (pip --no-deps --target), `import deep_ep` checked;
#      scripts/deepep-one-rank.py stands in for tests/test_low_latency.py (the wheel ships none).
#   2. `eptwin calibrate --base h200-single`: the hardware backend's probes (copy bandwidths,
#      flush, cluster launch, L2, SM count and clocks, the NCCL baseline); writes
#      $OUT/calibrate/probes-only.toml and its probes.json; then the probes again,
#      GPU_CALIBRATE_PROBE_RUNS in all (default 3, 21 s each on an H200: probes-<i>.*), and a
#      profile from all of them (probes-all.toml: the latency probes' median).
#   3. `eptwin calibrate --from <all those probes> --deepep-dir ...`: DeepEP's own LL kernels at one
#      rank over the token/top-k/hidden sweep, launched with `eptwin deepep launch`, imported with
#      `eptwin deepep import`, fused and hook, within the time left (--deepep-budget-s); the
#      profile with the fitted [deepep] ll_* costs: $OUT/calibrate/profile.toml.
#   4. The one-GPU scenarios (scenarios/h200-ep8-{ll,normal}-{128,4096}.toml) on the hardware
#      backend, then `eptwin compare --tolerance 5` with the simulator on the calibrated profile.
#   5. `eptwin compare --tolerance 10` of the DeepEP one-rank runs with the model on that profile.
#
# $OUT gets: gpu-calibrate.log (every command, its exit code and seconds), gpu.txt,
# calibrate-summary.txt (stdout of step 3, else step 2: the measured keys against the base and
# the one-rank fit table), calibrate-stderr.txt (progress), profile.toml (the profile the checks
# used), compare-one-gpu.txt and compare-deepep.txt (the tables; their stderr names every op
# over the tolerance), acceptance.txt (one line per check: PASS/FAIL/NOT RUN), and calibrate/
# (probe result, one-rank runs with launch.sh and logs, hardware results, comparison documents:
# results/<gpu>/calibrate/ once committed).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:?set OUT to the directory for the results}
BIN=${EPTWIN_BIN:-$ROOT/target/release/eptwin}
WHEEL_GLOB=${DEEPEP_V1_WHEEL:-.stage/wheels/v1/tokenspeed_deepep-1.2.1.post20251110-*.whl}
DEADLINE_S=${GPU_CALIBRATE_DEADLINE_S:-350}
BASE=${GPU_CALIBRATE_BASE:-h200-single}
PROBE_RUNS=${GPU_CALIBRATE_PROBE_RUNS:-3}
W=$OUT/calibrate
LOG=$OUT/gpu-calibrate.log
mkdir -p "$W"
: >"$LOG"
: >"$OUT/acceptance.txt"
START=$SECONDS
# fd 3: the terminal's stderr, whatever a step redirects its own to.
exec 3>&2

log() {
    echo "[+$((SECONDS - START)) s] $*" >>"$LOG"
    echo "[gpu-calibrate +$((SECONDS - START)) s] $*" >&3
}
left() { echo $((DEADLINE_S - (SECONDS - START))); }
# step CAP_S CMD...: run CMD under `timeout`, at most CAP_S and never past the deadline; log it.
step() {
    local cap=$1
    shift
    local limit
    limit=$(left)
    [ "$limit" -gt "$cap" ] && limit=$cap
    if [ "$limit" -lt 5 ]; then
        log "SKIPPED (deadline): $*"
        return 124
    fi
    local t0=$SECONDS
    log "RUN (limit ${limit} s): $*"
    timeout --kill-after=5 "$limit" "$@"
    local rc=$?
    log "EXIT $rc after $((SECONDS - t0)) s: $1"
    return $rc
}
accept() {
    echo "$*" >>"$OUT/acceptance.txt"
    log "ACCEPTANCE $*"
}

log "host $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ), binary $BIN"
if ! [ -x "$BIN" ] || ! "$BIN" calibrate --help >/dev/null 2>&1; then
    log "FATAL: $BIN missing or without 'calibrate' (build this branch with cargo build --release)"
    accept "NOT RUN: every check (no eptwin with calibrate at $BIN)"
    exit 2
fi
log "eptwin: $("$BIN" --version 2>&1)"
step 15 nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
    >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt" >>"$LOG"

# 1. DeepEP V1 into /tmp, NVSHMEM and torch from the machine's Python; one PE, multicast off.
SITE=/tmp/eptwin-deepep
STANDIN=/tmp/eptwin-deepep-standin
DEEPEP_ARGS=()
# shellcheck disable=SC2086 # the glob is meant to expand
WHEEL=$(ls $WHEEL_GLOB 2>/dev/null | head -1)
if [ -n "$WHEEL" ]; then
    step 60 python3 -m pip install --no-deps --quiet --target "$SITE" "$WHEEL" >>"$LOG" 2>&1
    SP=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>>"$LOG")
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    export LD_LIBRARY_PATH=$SP/nvidia/nvshmem/lib:$SP/nvidia/cu13/lib:$SP/torch/lib:${LD_LIBRARY_PATH:-}
    export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
    if step 45 python3 -c "import deep_ep" >>"$LOG" 2>&1; then
        mkdir -p "$STANDIN/tests"
        cp scripts/deepep-one-rank.py "$STANDIN/tests/test_low_latency.py"
        DEEPEP_ARGS=(--deepep-dir "$STANDIN" --python python3)
    else
        log "deep_ep does not import: the profile keeps the base's DeepEP costs"
    fi
else
    log "no DeepEP V1 wheel at $WHEEL_GLOB: the profile keeps the base's DeepEP costs"
fi

# 2. The probes (a profile from them alone, the fallback of step 3).
step 150 "$BIN" calibrate --base "$BASE" --name calibrated --out "$W/probes-only.toml" \
    >"$OUT/calibrate-summary.txt" 2>"$OUT/calibrate-stderr.txt"
rc=$?
PROFILE=
FROM=()
if [ $rc -eq 0 ] && [ -f "$W/probes-only.toml" ]; then
    PROFILE=$W/probes-only.toml
    FROM=(--from "$W/probes-only.probes.json")
    # More probe runs: the single-load and atomic latencies swing 10-30 % between runs, and the
    # profile takes their median over every run given (docs/calibration.md).
    for i in $(seq 2 "$PROBE_RUNS"); do
        if step 60 "$BIN" calibrate --base "$BASE" --name calibrated --out "$W/probes-$i.toml" \
            >"$W/probes-$i.summary.txt" 2>>"$OUT/calibrate-stderr.txt"; then
            FROM+=(--from "$W/probes-$i.probes.json")
        fi
    done
    if [ ${#FROM[@]} -gt 2 ] && step 30 "$BIN" calibrate --base "$BASE" --name calibrated \
        "${FROM[@]}" --out "$W/probes-all.toml" >"$W/probes-all.summary.txt" \
        2>>"$OUT/calibrate-stderr.txt"; then
        PROFILE=$W/probes-all.toml
        cp "$W/probes-all.summary.txt" "$OUT/calibrate-summary.txt"
    fi
elif [ $rc -eq 77 ]; then
    log "calibrate waived (no GPU): $(tail -1 "$OUT/calibrate-stderr.txt")"
fi

# 3. DeepEP at one rank within what is left, minus the checks' share (steps 4 and 5: 100 s;
# they took 20 s on an H200).
if [ -n "$PROFILE" ] && [ ${#DEEPEP_ARGS[@]} -gt 0 ]; then
    BUDGET=$(($(left) - 100 - 20))
    if [ "$BUDGET" -ge 30 ]; then
        step $((BUDGET + 20)) "$BIN" calibrate --base "$BASE" --name calibrated \
            "${FROM[@]}" "${DEEPEP_ARGS[@]}" \
            --deepep-timeout-s 60 --deepep-budget-s "$BUDGET" --out "$W/profile.toml" \
            >"$OUT/calibrate-summary-deepep.txt" 2>>"$OUT/calibrate-stderr.txt"
        if [ $? -eq 0 ] && [ -f "$W/profile.toml" ]; then
            PROFILE=$W/profile.toml
            mv "$OUT/calibrate-summary-deepep.txt" "$OUT/calibrate-summary.txt"
        fi
    else
        log "no time left for the DeepEP one-rank sweep (${BUDGET} s)"
    fi
fi
if [ -z "$PROFILE" ]; then
    accept "NOT RUN: eptwin calibrate wrote no profile (calibrate-stderr.txt)"
    tar czf "$OUT/calibrate.tar.gz" -C "$OUT" calibrate 2>/dev/null
    log "done without a profile"
    exit 1
fi
cp "$PROFILE" "$OUT/profile.toml"
log "profile: $PROFILE"
accept "PASS: eptwin calibrate wrote $(basename "$PROFILE")"

# 4. The one-GPU scenarios on this GPU's hardware backend, and the simulator on the profile.
mkdir -p "$W/one-gpu"
SCENARIOS=()
for s in ll-128 ll-4096 normal-128 normal-4096; do
    f=$W/one-gpu/h200-ep8-$s.toml
    sed "s|^profile = \"h200-single\"|profile = \"$PROFILE\"|" "scenarios/h200-ep8-$s.toml" >"$f"
    SCENARIOS+=("$f")
done
step 100 env EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 "$BIN" run "${SCENARIOS[@]}" --backend hw \
    --out "$W/one-gpu/hw" >"$W/one-gpu/hw-table.txt" 2>>"$LOG"
hw_rc=$?
step 60 "$BIN" compare "${SCENARIOS[@]}" --measured "$W/one-gpu/hw" --out "$W/one-gpu/cmp" \
    --allow-other-text --tolerance 5 >"$OUT/compare-one-gpu.txt" 2>"$OUT/compare-one-gpu.stderr"
rc=$?
cat "$OUT/compare-one-gpu.stderr" >>"$LOG"
case $rc in
    0) accept "PASS: one-GPU scenarios (LL, normal; 128, 4096 tokens): every op within 5 %" ;;
    1) accept "FAIL: one-GPU scenarios: $(grep -c 'off by' "$OUT/compare-one-gpu.stderr") scenario(s) over 5 % (compare-one-gpu.stderr)" ;;
    *) accept "NOT RUN: one-GPU compare exit $rc (hardware run exit $hw_rc)" ;;
esac

# 5. DeepEP at one rank against the model on the profile.
if ls "$W"/profile.deepep/*/compare-*.toml >/dev/null 2>&1; then
    step 40 "$BIN" compare "$W"/profile.deepep/*/compare-*.toml --measured "$W/profile.deepep" \
        --allow-other-text --out "$W/deepep-cmp" --tolerance 10 >"$OUT/compare-deepep.txt" \
        2>"$OUT/compare-deepep.stderr"
    rc=$?
    cat "$OUT/compare-deepep.stderr" >>"$LOG"
    n=$(ls "$W"/profile.deepep/*/compare-*.toml | wc -l)
    case $rc in
        0) accept "PASS: DeepEP one rank ($n runs, fused and hook): dispatch and combine within 10 %" ;;
        1) accept "FAIL: DeepEP one rank: $(grep -c 'off by' "$OUT/compare-deepep.stderr") of $n runs over 10 % (compare-deepep.stderr)" ;;
        *) accept "NOT RUN: DeepEP one-rank compare exit $rc" ;;
    esac
else
    accept "NOT RUN: DeepEP one rank (no runs; calibrate-stderr.txt says why)"
fi

step 20 tar czf "$OUT/calibrate.tar.gz" -C "$OUT" calibrate
log "done in $((SECONDS - START)) s"
cat "$OUT/acceptance.txt"
