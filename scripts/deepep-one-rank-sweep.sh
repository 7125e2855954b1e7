#!/bin/bash
# DeepEP's low-latency kernels with one rank on one GPU over token counts, top-k and hidden
# sizes (scripts/deepep-one-rank.py for each), on the GPU machine from the repository root:
#
#   bash scripts/deepep-one-rank-sweep.sh WHEEL_DIR OUT_DIR
#
# WHEEL_DIR holds a DeepEP V1 binary wheel (results/h100/deepep-one-rank/README.md names the
# one used); it is installed to /tmp/site. OUT_DIR gets one folder per run (result.json,
# routing.json), its log, gpu.txt and summary.txt.
set -u
WHEELS=$1 OUT=$2
mkdir -p "$OUT"
SP=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
pip install --no-deps -q --target /tmp/site "$WHEELS"/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
export LD_LIBRARY_PATH=$SP/nvidia/nvshmem/lib:$SP/nvidia/cu13/lib:$SP/torch/lib:${LD_LIBRARY_PATH:-}
# One PE: NVLink multicast stays off (the GPU machine's rule).
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
    > "$OUT/gpu.txt" 2>&1
run() {
    local tag=$1
    shift
    timeout 120 python3 scripts/deepep-one-rank.py "$OUT/$tag" "$@" > "$OUT/log-$tag.txt" 2>&1
    echo "$tag rc=$?" | tee -a "$OUT/summary.txt"
    rm -f "$OUT/$tag"/trace-*.json
}
# 1 token: DeepEP asserts a multiple of 4 (TMA); 512: the default NVSHMEM_QP_DEPTH (1024) is
# below the (512 + 1) * 2 the test asserts. Both fail by design and are kept as evidence.
for T in 1 8 32 64 128 256 512; do run t$T-k8-h7168 --tokens "$T"; done
for K in 1 2 4; do run t128-k$K-h7168 --tokens 128 --topk "$K"; done
for H in 2048 4096; do run t128-k8-h$H --tokens 128 --hidden "$H"; done
run t128-k8-h7168-e32 --tokens 128 --experts 32
