#!/bin/bash
# `eptwin calibrate` on the GPU machine (one H100 or H200), and the checks of the profile it
# writes (docs/calibration.md, "Calibrating a profile for your machine"), in one go:
#
#   1. eptwin calibrate --base h200-single: the hardware backend's probes (cluster probes
#      included) and DeepEP 1.2.1's own low-latency kernels at one rank over 10 shapes (8-256
#      tokens, top-1 to top-8, hidden 2,048-7,168), each launched with `eptwin deepep launch` and
#      read back with `eptwin deepep import` (scripts/deepep-one-rank.py stands in for
#      tests/test_low_latency.py, which the wheel does not ship), fused and in hook mode;
#   2. the one-GPU scenarios (scenarios/h200-ep8-{ll,normal}-{128,4096}.toml) on the hardware
#      backend, then `eptwin compare` with the simulator on the calibrated profile;
#   3. `eptwin compare` of the DeepEP one-rank runs with the model on that profile.
#
# Prepare here (the machine has no network, no Rust), from the repository root:
#
#   cargo build --release -p eptwin && mkdir -p .devbin/wheels
#   strip -o .devbin/eptwin target/release/eptwin                          # ~10 MB
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 -d .devbin/wheels tokenspeed-deepep==1.2.1.post20251110
#
# then on the GPU machine from the repository root (device tool: carry [".devbin"], ~21 MB):
#
#   bash scripts/gpu-calibrate.sh
#
# It runs about 7 minutes and leaves in $OUT: profile.toml (the calibrated profile),
# calibrate-summary.txt (its table and the one-rank fit), calibrate-log.txt (progress),
# compare-one-gpu.txt and compare-deepep.txt (the comparison tables), gpu.txt and calibrate.tar.gz
# (every result, launch script, log and comparison document; results/<gpu>/calibrate/ holds
# them once committed). Re-generating a bundled profile from these files needs no GPU:
#
#   eptwin calibrate --from calibrate/profile.probes.json --deepep-runs calibrate/profile.deepep \
#       --base h100-cx7 --name h100-cx7 --out engine/profiles/h100-cx7.toml
set -u
OUT=${OUT:-out/gpu-calibrate}
B=${EPTWIN_BIN:-.devbin/eptwin}
WHEELS=${WHEELS:-.devbin/wheels}
W=$OUT/calibrate
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "[gpu-calibrate +$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/calibrate-log.txt" >&2; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

# DeepEP V1 (the wheel), NVSHMEM and torch from the machine's Python; one PE, NVLink multicast off.
SP=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
pip install --no-deps -q --target /tmp/site "$WHEELS"/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$SP/nvidia/nvshmem/lib:$SP/nvidia/cu13/lib:$SP/torch/lib:${LD_LIBRARY_PATH:-}
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
STANDIN=/tmp/deepep-standin
mkdir -p $STANDIN/tests
cp scripts/deepep-one-rank.py $STANDIN/tests/test_low_latency.py

# 1. The profile.
stamp "eptwin calibrate"
"$B" calibrate --base h200-single --name calibrated --out "$W/profile.toml" \
    --deepep-dir $STANDIN --python python3 --deepep-timeout-s 90 \
    > "$OUT/calibrate-summary.txt" 2>> "$OUT/calibrate-log.txt"
stamp "calibrate exit $?"
cp "$W/profile.toml" "$OUT/profile.toml" 2>/dev/null
PROFILE=$(readlink -f "$W/profile.toml")

# 2. The one-GPU scenarios: hardware (its probes ran in calibrate), then the model on the profile.
mkdir -p "$W/one-gpu"
for s in ll-128 ll-4096 normal-128 normal-4096; do
    sed "s|^profile = \"h200-single\"|profile = \"$PROFILE\"|" scenarios/h200-ep8-$s.toml > "$W/one-gpu/h200-ep8-$s.toml"
done
stamp "one-GPU scenarios on the hardware"
EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 "$B" run scenarios/h200-ep8-{ll,normal}-{128,4096}.toml \
    --backend hw --out "$W/one-gpu/hw" > "$W/one-gpu/hw-table.txt" 2>> "$OUT/calibrate-log.txt"
stamp "hardware exit $?"
"$B" compare "$W"/one-gpu/h200-ep8-*.toml --measured "$W/one-gpu/hw" --out "$W/one-gpu/cmp" \
    > "$OUT/compare-one-gpu.txt" 2>> "$OUT/calibrate-log.txt"
stamp "one-GPU compare exit $?"

# 3. DeepEP at one rank against the model on the profile (the runs calibrate made).
if ls "$W"/profile.deepep/*/compare-*.toml > /dev/null 2>&1; then
    "$B" compare "$W"/profile.deepep/*/compare-*.toml --measured "$W/profile.deepep" \
        --out "$W/deepep-cmp" > "$OUT/compare-deepep.txt" 2>> "$OUT/calibrate-log.txt"
    stamp "DeepEP one-rank compare exit $?"
else
    stamp "no DeepEP one-rank runs to compare (calibrate-log.txt says why)"
fi
tar czf "$OUT/calibrate.tar.gz" -C "$OUT" calibrate
stamp "done"
