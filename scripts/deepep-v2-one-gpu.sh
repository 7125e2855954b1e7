#!/usr/bin/env bash
# DeepEP V2 (ElasticBuffer on NCCL GIN) at one rank on the one-GPU machine, replayed through
# eptwin: `eptwin deepep launch` gives the flags of tests/elastic/test_ep.py for the scenario,
# scripts/deepep-v2-test-ep.py (test_ep.py's equivalent: the wheel ships no tests) runs them,
# `eptwin deepep import` reads its lines, `eptwin compare` runs the simulator on the same
# scenario beside the measurement.
#
#   OUT=/some/dir bash scripts/deepep-v2-one-gpu.sh        (from the repository root)
#
# Inputs (env, defaults relative to the repository root):
#   EPTWIN_BIN         target/release/eptwin
#   DEEPEP_V2_WHEEL    .stage/wheels/v2/tokenspeed_deepep-2.1.0.post20260810-*.whl
#   NCCL_WHEEL         .stage/nccl/nvidia_nccl_cu13-2.30.7-*.whl if staged, else
#                      .stage/nccl/nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl
#                      (or, if absent, .stage/nccl/part-* joined and checked against
#                      .stage/nccl/whl.sha256)
#   SCENARIO           results/h100/deepep-v2-one-gpu/v2-ep1-one-gpu.toml
# Writes under $OUT: deepep-v2-one-gpu.log (every command, its exit code and output),
# test_ep.log (the V2 driver's output, what the import reads), results/ (the imported
# `<name>.deepep.json`, and compare's `<name>.sim.json` and `<name>.compare.json`).
# Every step is bounded by `timeout` and the whole by DEADLINE (345 s); a failed step is logged
# with its reason and the script goes on. Expected time: 1-6 minutes (nvcc compiles V2's
# kernels on first use; about 1 minute if V2 stops at its NCCL version assertion).
#
# What the wheel needs, read from it (deep_ep/__init__.py, deep_ep/utils/find_pkgs.py, the
# strings and dynamic section of deep_ep/_C.cpython-312-x86_64-linux-gnu.so):
# * `EP_NCCL_ROOT_DIR` (then `NCCL_DIR`) names the NCCL root: its lib/libnccl.so* for
#   check_nccl_so() and its include/ for the JIT (`nvcc ... -I {nccl_root}/include`).
# * check_nccl_so() asserts that the libnccl mapped in the process is byte-identical to
#   `{nccl_root}/lib/libnccl.so*` (the first match) and that only one is mapped:
#   LD_PRELOAD of that file (in the Python processes) makes torch's libnccl.so.2 resolve to it.
#   `EP_SUPPRESS_NCCL_CHECK=1` skips the check (tried if the import fails).
# * _C.so has NEEDED libnvshmem_host.so.3, libnccl.so.2, libcudart.so.13 and a RUNPATH of
#   the build machine's site-packages: the image's nvidia/nvshmem/lib goes on LD_LIBRARY_PATH.
# * ElasticBuffer's constructor (deep_ep::nccl::NCCLSymmetricMemoryContext) asserts
#   `NCCL_VERSION_CODE == nccl_runtime_version` ("Prior to NCCL 2.31, NCCL compile-time and
#   runtime versions must be the same"); the wheel's _C.so compares with 23007 (NCCL 2.30.7,
#   `cmpl $0x59df` after ncclGetVersion). With the staged 2.30.4 that assertion is the
#   expected failure; its text is logged. nvidia-nccl-cu13 2.30.7 is on PyPI: staged as
#   .stage/nccl/nvidia_nccl_cu13-2.30.7-*.whl it is taken instead.
# No `set -e` or `set -u`: a failed step is logged and the next one runs.
: "${OUT:?set OUT to the directory for results and logs}"
mkdir -p "$OUT/results"
LOG="$OUT/deepep-v2-one-gpu.log"
: > "$LOG"
EPTWIN_BIN=${EPTWIN_BIN:-target/release/eptwin}
SCENARIO=${SCENARIO:-results/h100/deepep-v2-one-gpu/v2-ep1-one-gpu.toml}
PY=${PYTHON:-python3}
WORK=/tmp/eptwin-deepep-v2
mkdir -p "$WORK"
# NVLink multicast stays off on the shared GPU machines.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1
export EP_JIT_CACHE_DIR="$WORK/jit"

START=$(date +%s)
log() { echo "[$(date -u +%T)] $*" | tee -a "$LOG"; }
# The whole script stays inside 6 minutes: every step's limit is cut to what is left of
# DEADLINE seconds from the start (a step with under 5 s left is skipped, and says so).
DEADLINE=${DEADLINE:-345}
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
# step NAME SECONDS CMD...: run CMD bounded, its output into the log, and log its exit code.
step() {
  local name=$1 secs=$2
  shift 2
  local rest
  rest=$(left)
  [ "$rest" -lt "$secs" ] && secs=$rest
  if [ "$secs" -lt 5 ]; then log "= [$name] skipped: the script's ${DEADLINE}s are spent"; return 124; fi
  log "+ [$name] (limit ${secs}s) $*"
  timeout "$secs" "$@" >> "$LOG" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then log "= [$name] exit $rc (timed out after ${secs}s)"; else log "= [$name] exit $rc"; fi
  return $rc
}
log "deepep-v2-one-gpu: OUT=$OUT EPTWIN_BIN=$EPTWIN_BIN SCENARIO=$SCENARIO"

# 1. The machine.
step gpu 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step nvcc 20 nvcc --version
step python 60 "$PY" -c '
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
print("torch NCCL", ".".join(map(str, torch.cuda.nccl.version())))
from importlib.metadata import distributions
for d in distributions():
    n = (d.metadata["Name"] or "").lower()
    if "nccl" in n or "nvshmem" in n or n == "nvidia-cuda-runtime":
        print("pip", n, d.version, d._path.parent)
'
# The scenario is written for an H100 (profile h100-cx7); on an H200 a copy names h200-cx7, so
# that the simulator models the GPU that ran.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if printf '%s' "$GPU_NAME" | grep -q H200; then
  sed -e 's/^profile = "h100-cx7"/profile = "h200-cx7"/' -e 's/one H100/one H200/' "$SCENARIO" > "$WORK/$(basename "$SCENARIO")"
  SCENARIO="$WORK/$(basename "$SCENARIO")"
  log "an H200: the scenario with profile h200-cx7 is $SCENARIO"
fi
SITE=$("$PY" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>>"$LOG")
IMAGE_NCCL=$("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>>"$LOG")
log "site-packages: ${SITE:-not found}; the image's NCCL (torch): ${IMAGE_NCCL:-unknown}"

# 2. The V2 wheel, without dependencies (torch and NVSHMEM are the image's).
V2_WHEEL=$(ls ${DEEPEP_V2_WHEEL:-.stage/wheels/v2/tokenspeed_deepep-2.1.0.post20260810-*.whl} 2>/dev/null | head -1)
if [ -n "$V2_WHEEL" ]; then
  step install-v2 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$WORK/site" "$V2_WHEEL"
else
  log "no V2 wheel at ${DEEPEP_V2_WHEEL:-.stage/wheels/v2/tokenspeed_deepep-2.1.0.post20260810-*.whl}"
fi
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"

# 3. NCCL >= 2.30.4 from its wheel, to its own directory (not on PYTHONPATH: only
#    EP_NCCL_ROOT_DIR and LD_PRELOAD point at it).
# NCCL 2.30.7, the version the wheel's _C.so was built with, when one is staged; else 2.30.4.
NCCL_WHEEL=${NCCL_WHEEL:-$(ls .stage/nccl/nvidia_nccl_cu13-2.30.7-*.whl 2>/dev/null | head -1)}
NCCL_WHEEL=${NCCL_WHEEL:-.stage/nccl/nvidia_nccl_cu13-2.30.4-py3-none-manylinux_2_18_x86_64.whl}
if [ ! -f "$NCCL_WHEEL" ] && ls .stage/nccl/part-* > /dev/null 2>&1; then
  JOINED="$WORK/$(basename "$NCCL_WHEEL")"
  log "joining .stage/nccl/part-* into $JOINED"
  cat .stage/nccl/part-* > "$JOINED"
  WANT=$(awk '{print $1}' .stage/nccl/whl.sha256 2>/dev/null)
  GOT=$(sha256sum "$JOINED" | awk '{print $1}')
  log "sha256 $GOT (expected ${WANT:-unknown})"
  if [ -z "$WANT" ] || [ "$WANT" = "$GOT" ]; then NCCL_WHEEL=$JOINED; else log "the joined NCCL wheel does not match whl.sha256"; fi
fi
NCCL_ROOT=""
PRELOAD=""
if [ -f "$NCCL_WHEEL" ]; then
  step install-nccl 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$WORK/nccl" "$NCCL_WHEEL" && NCCL_ROOT="$WORK/nccl/nvidia/nccl"
else
  log "no NCCL wheel at $NCCL_WHEEL: V2 falls back to the image's NCCL"
fi
if [ -n "$NCCL_ROOT" ] && [ -f "$NCCL_ROOT/lib/libnccl.so.2" ] && [ -f "$NCCL_ROOT/include/nccl.h" ]; then
  export EP_NCCL_ROOT_DIR="$NCCL_ROOT"
  # Preloaded into the Python processes only (PYRUN), not into eptwin or the shell's tools.
  PRELOAD="$NCCL_ROOT/lib/libnccl.so.2${EXTRA_PRELOAD:+:$EXTRA_PRELOAD}"
  log "EP_NCCL_ROOT_DIR=$EP_NCCL_ROOT_DIR LD_PRELOAD (Python only)=$PRELOAD"
else
  log "no usable NCCL root from the wheel (lib/libnccl.so.2 and include/nccl.h)"
fi

# 4. Libraries _C.so needs that torch does not load: libnvshmem_host.so.3 (and CUDA 13's
#    runtime, should torch not have loaded it).
for d in "$SITE/nvidia/nvshmem/lib" "$SITE/nvidia/cu13/lib" "$SITE/torch/lib"; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ls "$SITE"/nvidia/nvshmem/lib/libnvshmem_host.so* >> "$LOG" 2>&1 || log "no libnvshmem_host.so in $SITE/nvidia/nvshmem/lib"

# 5. Import deep_ep: check_nccl_so(), then the JIT runtime. On failure, once more with the
#    check suppressed (the failure's text stays in the log).
PROBE='
import torch
print("torch NCCL (loaded)", ".".join(map(str, torch.cuda.nccl.version())))
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})
print("libnccl mapped:", maps)
import deep_ep
print("deep_ep", deep_ep.__version__, "from", deep_ep.__file__)
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})
print("libnccl mapped after import:", maps)
'
PYRUN=(env LD_PRELOAD="$PRELOAD" "$PY")
if ! step import 90 "${PYRUN[@]}" -c "$PROBE"; then
  # Only check_nccl_so()'s own failures are worth a second try without it.
  if tail -40 "$LOG" | grep -qE 'Duplicate NCCL runtime|Invalid NCCL versions|No libnccl.so found'; then
    export EP_SUPPRESS_NCCL_CHECK=1
    step import-suppressed 90 "${PYRUN[@]}" -c "$PROBE" || unset EP_SUPPRESS_NCCL_CHECK
  fi
fi

# 6. The flags: `eptwin deepep launch` for the scenario (its marker line heads the log the
#    import reads). Without them (an eptwin without V2 replay) the scenario's flags as written.
FALLBACK_ARGS="--num-processes 1 --num-tokens 4096 --hidden 7168 --num-topk 8 --num-experts 256 --num-sms 24 --num-qps 0 --num-allocated-qps 0 --num-gpu-timeout-secs 100 --num-cpu-timeout-secs 300 --sl-idx 3 --allow-hybrid-mode 1 --allow-multiple-reduction 1 --prefer-overlap-with-compute 1"
MARKER=""
if step launch 20 "$EPTWIN_BIN" deepep launch "$SCENARIO" --deepep-dir DeepEP; then
  LAUNCH_TEXT=$(timeout 30 "$EPTWIN_BIN" deepep launch "$SCENARIO" --deepep-dir DeepEP 2>/dev/null)
  MARKER=$(printf '%s\n' "$LAUNCH_TEXT" | sed -n "s/^( echo '\(\[eptwin\] launch .*\)' && \\\\$/\1/p" | head -1)
fi
if [ -n "$MARKER" ]; then
  ARGS=${MARKER#*args: }
  log "flags from eptwin deepep launch: $ARGS"
else
  ARGS=$FALLBACK_ARGS
  log "no launch line: the scenario's flags as written: $ARGS"
fi

# 7. The V2 test at one rank (one process on the one GPU), leaving 25 s for the import and the
#    simulator.
BUDGET=$(( $(left) - 25 ))
[ $BUDGET -lt 20 ] && BUDGET=20
log "+ [test_ep] LD_PRELOAD=$PRELOAD EP_NCCL_ROOT_DIR=${EP_NCCL_ROOT_DIR:-} EP_SUPPRESS_NCCL_CHECK=${EP_SUPPRESS_NCCL_CHECK:-} $PY scripts/deepep-v2-test-ep.py $ARGS (timeout ${BUDGET}s)"
{
  [ -n "$MARKER" ] && echo "$MARKER"
  # shellcheck disable=SC2086
  timeout "$BUDGET" "${PYRUN[@]}" scripts/deepep-v2-test-ep.py $ARGS 2>&1
  echo "[eptwin] test_ep exit $?"
} > "$OUT/test_ep.log"
log "= [test_ep] $(tail -1 "$OUT/test_ep.log")"
grep -E '^ +[*@#+-] EP:|passed|Error|error|assert|Prior to NCCL|GIN' "$OUT/test_ep.log" | head -20 | tee -a "$LOG"
if grep -q 'Prior to NCCL 2.31' "$OUT/test_ep.log"; then
  log "V2's version assertion: the wheel's _C.so was built against NCCL 2.30.7 (it compares ncclGetVersion with 23007); the loaded NCCL differs"
  # The image's own NCCL, should it be that version: once more without the staged one.
  if [ "${IMAGE_NCCL:-}" = 2.30.7 ]; then
    log "the image's NCCL is 2.30.7: once more with it (no LD_PRELOAD, no EP_NCCL_ROOT_DIR)"
    AGAIN=$(( $(left) - 25 ))
    [ $AGAIN -lt 20 ] && AGAIN=20
    {
      [ -n "$MARKER" ] && echo "$MARKER"
      # shellcheck disable=SC2086
      env -u EP_NCCL_ROOT_DIR timeout "$AGAIN" "$PY" scripts/deepep-v2-test-ep.py $ARGS 2>&1
      echo "[eptwin] test_ep exit $?"
    } > "$OUT/test_ep.log"
    log "= [test_ep image NCCL] $(tail -1 "$OUT/test_ep.log")"
  fi
fi
# V2's own SM choice at one rank (--num-sms 0: every SM of the device, elastic.py:816), checks
# only, while time is left: whether the kernels take 132 SMs x 16 channels (eptwin refuses it
# as over kNumMaxChannels = 1024).
if [ "$(left)" -gt 90 ] && grep -q '^ *\* EP:' "$OUT/test_ep.log"; then
  AUTO_ARGS=$(printf '%s' "$ARGS" | sed 's/--num-sms [0-9]*/--num-sms 0/')
  # shellcheck disable=SC2086
  step test_ep-auto-sms $(( $(left) - 25 )) "${PYRUN[@]}" scripts/deepep-v2-test-ep.py $AUTO_ARGS --skip-perf-test
else
  log "skipping the --num-sms 0 check ($(left)s left, or no timed line above)"
fi

# 8. Import, then the simulator on the same scenario beside it.
if step import-log 20 "$EPTWIN_BIN" deepep import "$OUT/test_ep.log" --scenario "$SCENARIO" --out "$OUT/results"; then :; fi
MEASURED=$(ls "$OUT"/results/*.deepep.json 2>/dev/null | head -1)
if [ -n "$MEASURED" ]; then
  step compare 30 "$EPTWIN_BIN" compare "$SCENARIO" --measured "$MEASURED" --out "$OUT/results"
else
  log "no imported result: the simulator alone"
  step sim 30 "$EPTWIN_BIN" run "$SCENARIO" --out "$OUT/results"
fi
log "done in $(( $(date +%s) - START ))s; files: $(cd "$OUT" && find . -type f | tr '\n' ' ')"
