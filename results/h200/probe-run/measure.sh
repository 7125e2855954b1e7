#!/usr/bin/env bash
# h200cal: the four H200 scenarios with the memory-model probes (binary built from branch
# h200cal, carried in .devbin/h200cal/), plus the low-latency scenarios in hook mode (send and
# receive phases timed apart). Everything goes to $OUT (log.txt, results/, diag/).
set -uo pipefail
B=.devbin/h200cal/eptwin
mkdir -p "$OUT/results" "$OUT/diag"
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ; uname -r
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
if ! ldconfig -p | grep -q 'libnccl\.so '; then
    n2=$(ldconfig -p | grep -o '/[^ ]*libnccl\.so\.2$' | head -1)
    if [[ -n "$n2" ]]; then mkdir -p /tmp/ncclib && ln -sf "$n2" /tmp/ncclib/libnccl.so; export LD_LIBRARY_PATH="/tmp/ncclib:${LD_LIBRARY_PATH:-}"; fi
fi
for s in normal-128 ll-128 normal-4096 ll-4096; do
    echo; echo "== eptwin run scenarios/h200-ep8-$s.toml --backend hw"
    t0=$(date +%s%N)
    timeout 150 $B run scenarios/h200-ep8-$s.toml --backend hw --out "$OUT/results"
    echo "== exit $? after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
for s in ll-128 ll-4096; do
    f=/tmp/hook-$s.toml
    sed 's/^\[job.workload\]/[job.workload]\nhook = true/' scenarios/h200-ep8-$s.toml > "$f"
    echo; echo "== diagnostic: $s in hook mode (send and receive kernels timed apart)"
    EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 timeout 100 $B run "$f" --backend hw --out "$OUT/diag"
    echo "== exit $?"
done
echo "== done"
