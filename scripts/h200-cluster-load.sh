#!/usr/bin/env bash
# The cluster handoff probe at rising load, source of the simulator's refill and intake keys
# (cluster_fill_ns, cluster_fill_wave_ns, cluster_sm_ingest_gbps, cluster_ingest_chunk_ns;
# docs/calibration.md, "The cluster kernels").
#
# What it measures (hw/src/probes/cluster.rs `load_shapes`): 1, 2, 4, 8 and 15 clusters of the
# probe with one slot and no stores (the refill chain's latency at each load), four 7,168 B
# slots without stores (each SM's intake), and the combine's 2 x 14,368 B slots with and without
# stores; the reducer probe runs too. Only these probes (EPTWIN_CLUSTER_PROBE_ONLY=load, no copy
# probes, no NCCL baseline); the normal 128 scenario's kernels run as every hw run does. Twice,
# for the spread; results/h200/probe-run/load/run{1,2}-h200-ep8-normal-128.json and
# results/h200/probe-run/load-log.txt are the committed output.
#
# How to run: build and carry the binary as for scripts/h200-results.sh (.devbin/eptwin), then on
# the GPU machine, from the repository root:
#   bash scripts/h200-cluster-load.sh     (EPTWIN_BIN overrides the binary's path)
# Output under $OUT: load-log.txt, results/run{1,2}/h200-ep8-normal-128.json.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/eptwin}
OUT=${OUT:-/tmp/eptwin-out}
mkdir -p "$OUT/results"
exec > >(tee -a "$OUT/load-log.txt") 2>&1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
for i in 1 2; do
    echo; echo "== load shapes, run $i"
    EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 EPTWIN_CLUSTER_PROBE=1 EPTWIN_CLUSTER_PROBE_ONLY=load \
        timeout 200 $B run scenarios/h200-ep8-normal-128.toml --backend hw --out "$OUT/results/run$i" -v
    echo "== exit $?"
done
echo "== done"
