#!/usr/bin/env bash
# The cluster handoff at rising load (hw/src/cluster_probe.rs load_shapes): 1, 2, 4, 8 and 15
# clusters of the probe, one slot without stores (the refill chain's latency at each load), four
# 7,168 B slots without stores (each SM's intake), the combine's 2 x 14,368 B slots with and
# without stores. Only the probe: no other probe, no NCCL baseline (the scenario's kernels run
# too, as every hw run does). Twice, for the spread.
# Binary: `cargo build --release && mkdir -p .devbin/load && strip -o .devbin/load/eptwin
# target/release/eptwin` here, then on the GPU machine (device tool, carry [".devbin/load"]):
#   bash results/h200/probe-run/load.sh
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/load/eptwin}
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
