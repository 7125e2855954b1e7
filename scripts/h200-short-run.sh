#!/usr/bin/env bash
# The short-run measurements behind the one-GPU model's fixed costs (docs/calibration.md,
# "h200-single"): the flush write-back probe (`probe.flush_writeback`, in every run's probes)
# and the 128- and 4096-token scenarios with the cluster kernels' warp finish times and
# per-token stamps (EPTWIN_CLUSTER_TIMES=1, in the log).
#
# How to run: build here, `mkdir -p .devbin && strip -o .devbin/eptwin target/release/eptwin`,
# then on the GPU machine from the repository root (device tool: carry [".devbin"]):
#   bash scripts/h200-short-run.sh        (EPTWIN_BIN overrides the binary's path)
# Output under $OUT: log.txt and results/<scenario>.json.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/eptwin}
OUT=${OUT:-/tmp/eptwin-out}
mkdir -p "$OUT/results"
exec > >(tee -a "$OUT/log.txt") 2>&1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
export EPTWIN_NCCL_BASELINE=0 RUST_LOG=${RUST_LOG:-info}
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse --short HEAD 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
for s in ${EPTWIN_SCENARIOS:-normal-128 ll-128 normal-4096}; do
    echo; echo "== eptwin run scenarios/h200-ep8-$s.toml --backend hw (EPTWIN_CLUSTER_TIMES=1)"
    t0=$(date +%s%N)
    EPTWIN_CLUSTER_TIMES=1 timeout 200 $B run scenarios/h200-ep8-$s.toml --backend hw --out "$OUT/results"
    echo "== exit $? after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
