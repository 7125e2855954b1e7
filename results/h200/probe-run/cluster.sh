#!/usr/bin/env bash
# Cluster (distributed shared memory) ring-handoff probes next to the regular probes of the same
# run: eptwin run scenarios/h200-ep8-normal-128.toml --backend hw with EPTWIN_CLUSTER_PROBE=1,
# one process per kernel kind (EPTWIN_CLUSTER_PROBE_ONLY), so a faulting variant loses only itself.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/cl5/eptwin}
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ; uname -r
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
for kind in tma warp; do
    mkdir -p "$OUT/$kind"
    echo; echo "== EPTWIN_CLUSTER_PROBE=1 EPTWIN_CLUSTER_PROBE_ONLY=$kind eptwin run scenarios/h200-ep8-normal-128.toml --backend hw"
    t0=$(date +%s%N)
    EPTWIN_CLUSTER_PROBE=1 EPTWIN_CLUSTER_PROBE_ONLY=$kind EPTWIN_NCCL_BASELINE=0 timeout 200 $B run scenarios/h200-ep8-normal-128.toml --backend hw --out "$OUT/$kind"
    echo "== exit $? after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
echo "== done"
