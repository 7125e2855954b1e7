#!/usr/bin/env bash
# The reducer probe (hw/src/cluster_probe.rs run_reduce, kernels/cuda/intranode_cluster.cu
# probe_cluster_reduce) and the cluster kernels' per-token stamps, on the normal scenarios.
# reduce-log.txt: the register-lean reducer (tokens3.sh variant 5, adopted) at 16:56 UTC;
# reduce2-log.txt: the same with the leaders resolving each ring's slot index once per token
# (no `% R` per thread and source, no division chain per weight) at 17:00 UTC, run twice.
# Binary built here and carried: strip -o .devbin/run3/eptwin target/release/eptwin.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/run3/eptwin}
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000 EPTWIN_NCCL_BASELINE=0 EPTWIN_PROBES=0
(for s in normal-128 normal-4096 normal-128 normal-4096; do
    EPTWIN_CLUSTER_PROBE=1 EPTWIN_CLUSTER_PROBE_ONLY=tma EPTWIN_CLUSTER_TIMES=1 timeout 200 $B run scenarios/h200-ep8-$s.toml --backend hw --out /tmp/o
    echo "== exit $?"
done) > "$OUT/reduce2-log.txt" 2>&1
