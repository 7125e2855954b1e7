#!/usr/bin/env bash
# h200cal, short form (device time is scarce): the memory-model probes once (they run before
# the normal 128-token scenario; NCCL baseline off), then low-latency 4096 in hook mode (send and
# receive kernels timed apart; probes and NCCL off). Everything goes to $OUT.
set -uo pipefail
B=.devbin/h200cal/eptwin
mkdir -p "$OUT/results" "$OUT/diag"
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ; uname -r
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
echo; echo "== eptwin run scenarios/h200-ep8-normal-128.toml --backend hw (probes; EPTWIN_NCCL_BASELINE=0)"
EPTWIN_NCCL_BASELINE=0 timeout 60 $B run scenarios/h200-ep8-normal-128.toml --backend hw --out "$OUT/results"
echo "== exit $?"
f=/tmp/hook-ll-4096.toml
sed 's/^\[job.workload\]/[job.workload]\nhook = true/' scenarios/h200-ep8-ll-4096.toml > "$f"
echo; echo "== diagnostic: ll-4096 in hook mode (send and receive kernels timed apart; EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0)"
EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 timeout 60 $B run "$f" --backend hw --out "$OUT/diag"
echo "== exit $?"
echo "== done"
