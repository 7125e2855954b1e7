#!/usr/bin/env bash
# The measurement behind results/h200/*.json and the simulator's cluster_* calibration keys.
#
# What it measures, on one H200 with eight ranks sharing it: `eptwin topo` (NVML), then the four
# H200 scenarios (scenarios/h200-ep8-{normal,ll}-{128,4096}.toml) on the hardware backend with
# every copy probe, the memcpy ceiling and the NCCL all-to-all baseline; the two normal
# scenarios also run the cluster handoff, reducer and launch probes (EPTWIN_CLUSTER_PROBE=1), whose
# `probe.cluster_*` measurements scripts/h200-profile-from-probes.py turns into the profile's
# cluster keys (docs/calibration.md, "h200-single"). Then diagnostics that stay in the log: the
# low-latency scenarios in hook mode (send and receive kernels timed apart) and with the
# combine's per-block send and receive end stamps (EPTWIN_LL_TIMES=1), normal 4096 with
# the global-memory-ring kernels, and normal 4096 with the cluster kernels' warp finish times and
# per-token stamps (EPTWIN_CLUSTER_TIMES=1).
#
# How to run: build the binary here and carry it to the GPU machine, e.g.
#   cargo build --release && mkdir -p .devbin && strip -o .devbin/eptwin target/release/eptwin
# (or `bash scripts/h200-measure.sh --prepare`), then on the GPU machine, from the repository
# root (device tool: carry [".devbin"]):
#   bash scripts/h200-results.sh          (EPTWIN_BIN overrides the binary's path)
# Output under $OUT: log.txt, results/<scenario>.json (copy them to results/h200/), diag/.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/eptwin}
OUT=${OUT:-/tmp/eptwin-out}
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
echo; echo "== eptwin topo"; $B topo; echo "== exit $?"
for s in normal-128 ll-128 normal-4096 ll-4096; do
    echo; echo "== eptwin run scenarios/h200-ep8-$s.toml --backend hw"
    t0=$(date +%s%N)
    cp=0; [[ $s == normal-* ]] && cp=1
    EPTWIN_CLUSTER_PROBE=$cp EPTWIN_CLUSTER_PROBE_ONLY=tma timeout 150 $B run scenarios/h200-ep8-$s.toml --backend hw --out "$OUT/results"
    echo "== exit $? after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
for s in ll-128 ll-4096; do
    f=/tmp/hook-$s.toml
    sed 's/^\[job.workload\]/[job.workload]\nhook = true/' scenarios/h200-ep8-$s.toml > "$f"
    echo; echo "== diagnostic: $s in hook mode (send and receive kernels timed apart)"
    EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 timeout 100 $B run "$f" --backend hw --out "$OUT/diag"
    echo "== exit $?"
done
for s in ll-128 ll-4096; do
    echo; echo "== diagnostic: $s with the combine's per-block stamps (EPTWIN_LL_TIMES=1)"
    EPTWIN_LL_TIMES=1 EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 timeout 100 $B run scenarios/h200-ep8-$s.toml --backend hw --out /tmp/diag/ll-times
    echo "== exit $?"
done
echo; echo "== diagnostic: normal 4096 with the global-memory rings (the previous default kernels)"
EPTWIN_NORMAL_DISPATCH=global EPTWIN_NORMAL_COMBINE=global EPTWIN_NCCL_BASELINE=0 timeout 100 $B run scenarios/h200-ep8-normal-4096.toml --backend hw --out /tmp/diag/global
echo "== exit $?"
echo; echo "== diagnostic: normal 4096, cluster kernels' warp finish times"
EPTWIN_CLUSTER_TIMES=1 EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 timeout 100 $B run scenarios/h200-ep8-normal-4096.toml --backend hw --out /tmp/diag/times
echo "== exit $?"
echo "== done"
