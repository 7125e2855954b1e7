#!/usr/bin/env bash
# Fetch NVRTC (no CUDA toolkit, no GPU needed) so that `cargo test -p eptwin-hw` compiles every
# kernel for sm_90 on a development machine. The version must not be newer than the GPU
# machine's driver (CUDA 13.0 there). The library is not committed: it lands in $DIR.
# Usage: scripts/fetch-nvrtc.sh [DIR]   then run the printed export line.
set -euo pipefail
dir=${1:-/tmp/nvrtc}
mkdir -p "$dir"
# The 13.0.88 wheel is tagged manylinux2010/manylinux_2_12: name that platform explicitly.
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    nvidia-cuda-nvrtc==13.0.88 -d "$dir"
(cd "$dir" && unzip -q -o nvidia_cuda_nvrtc-13.0.88-*.whl)
lib=$(dirname "$(find "$dir" -name 'libnvrtc.so.13' | head -1)")
echo "export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
