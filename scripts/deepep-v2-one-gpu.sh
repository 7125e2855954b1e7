#!/usr/bin/env bash
# DeepEP V2 (ElasticBuffer on NCCL GIN) on the one-GPU machine: stage, check, run, capture.
#
# Run from the repository root on the GPU machine, with the V2 wheel carried in `.whl/`:
#   here:   echo /.whl/ >> .git/info/exclude
#           python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#             --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#             tokenspeed-deepep==2.1.0.post20260810        # 14.3 MB (cp312 wheel)
#   there:  bash scripts/deepep-v2-one-gpu.sh               (carry: [".whl"])
# An NCCL >= 2.30.4 wheel (nvidia-nccl-cu13 2.31.2 is 241 MiB) does not fit the 64 MiB carry;
# when one is staged in .whl/ (or under $EP_NCCL_WHEEL_DIR) it is installed too.
#
# Writes under $OUT: env.txt (versions: Python, torch, the NCCL torch loads, the pip NCCL, nvcc,
# GPU), install.txt, import.txt, test_ep-*.txt (the driver's output), summary.txt. Each step's
# exact error is kept; nothing stops the later steps. Expected time: 1-3 minutes (JIT
# compilation of V2's kernels with nvcc dominates when the import gets that far).
set -u
OUT=${OUT:-out/deepep-v2}
mkdir -p "$OUT"
# NVLink multicast stays off on shared machines (docs/design.md, gpu-workflow).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
SITE=/tmp/deepep-v2-site
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

# 1. What is on the machine.
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  nvcc --version 2>&1 | tail -2
  $PY - <<'EOF' 2>&1
import sys, glob, os
print('python', sys.version.split()[0], sys.executable)
try:
    import torch
    print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())
    print('torch NCCL (loaded)', '.'.join(map(str, torch.cuda.nccl.version())))
except Exception as e:
    print('torch: FAILED', repr(e))
try:
    from importlib.metadata import distributions
    for d in distributions():
        n = (d.metadata['Name'] or '').lower()
        if 'nccl' in n or 'nvshmem' in n:
            print('pip', n, d.version, d._path.parent)
except Exception as e:
    print('pip metadata: FAILED', repr(e))
for p in sorted(set(glob.glob('/usr/lib/x86_64-linux-gnu/libnccl.so*') + glob.glob('/usr/local/lib/libnccl.so*'))):
    print('system', p)
EOF
} > "$OUT/env.txt"
cat "$OUT/env.txt"
NCCL_VER=$($PY -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null || echo unknown)
summary "NCCL loaded by torch: $NCCL_VER (V2 needs >= 2.30.4 for GIN)"
if $PY - "$NCCL_VER" <<'EOF'
import sys
v = sys.argv[1]
ok = v != 'unknown' and tuple(int(x) for x in v.split('.')) >= (2, 30, 4)
sys.exit(0 if ok else 1)
EOF
then summary "NCCL is new enough"; else summary "NCCL is older than 2.30.4: V2's GIN set-up is expected to fail (the exact error follows)"; fi

# 2. Install the carried wheels (no dependencies: torch, NCCL, NVSHMEM come from the machine).
WHEELS=$(ls .whl/tokenspeed_deepep-*.whl ${EP_NCCL_WHEEL_DIR:-.whl}/nvidia_nccl_cu13-*.whl 2>/dev/null)
if [ -z "$WHEELS" ]; then
  summary "no tokenspeed-deepep wheel in .whl/: stage it (see the header) and carry .whl"
  exit 0
fi
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $WHEELS \
  > "$OUT/install.txt" 2>&1
summary "install: exit $? ($(echo $WHEELS | wc -w) wheel(s))"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export EP_JIT_CACHE_DIR=/tmp/deepep-v2-jit

# 3. Import: DeepEP checks the loaded NCCL against its build and starts its JIT runtime.
$PY -c 'import deep_ep, torch; print("deep_ep", deep_ep.__version__, "from", deep_ep.__file__); print("nccl", torch.cuda.nccl.version())' \
  > "$OUT/import.txt" 2>&1
rc=$?
summary "import deep_ep: exit $rc: $(tail -1 "$OUT/import.txt")"
if [ $rc -ne 0 ]; then
  EP_SUPPRESS_NCCL_CHECK=1 $PY -c 'import deep_ep; print("deep_ep", deep_ep.__version__)' \
    > "$OUT/import-suppressed.txt" 2>&1
  summary "import with EP_SUPPRESS_NCCL_CHECK=1: exit $?: $(tail -1 "$OUT/import-suppressed.txt")"
  [ -s "$OUT/import-suppressed.txt" ] && grep -q '^deep_ep' "$OUT/import-suppressed.txt" && export EP_SUPPRESS_NCCL_CHECK=1
fi

# 4. One rank (NCCL refuses two ranks on one GPU): the direct NVLink kernels with a domain of
#    one. EP_DISABLE_GIN=1 first (no NIC on this machine), then with GIN to record NCCL's answer.
#    The flags are test_ep.py's (`eptwin deepep launch` does not print V2 lines yet).
ARGS="--num-processes 1 --num-tokens 4096 --hidden 7168 --num-topk 8 --num-experts 256 --num-sms 0 --sl-idx 3"
for mode in nogin gin; do
  if [ $mode = nogin ]; then export EP_DISABLE_GIN=1; else unset EP_DISABLE_GIN; fi
  timeout 300 $PY scripts/deepep-v2-test-ep.py $ARGS > "$OUT/test_ep-$mode.txt" 2>&1
  rc=$?
  summary "test_ep ($mode, EP1): exit $rc"
  grep -E '^ +[*@] EP:|passed|Error|error|Assert|assert' "$OUT/test_ep-$mode.txt" | tail -8 | tee -a "$OUT/summary.txt"
done
summary "done; logs in $OUT"
