#!/usr/bin/env bash
# Variants of the cluster combine compiled in (EPTWIN_CLUSTER_VARIANT -> CLUSTER_VARIANT in
# kernels/cuda/intranode_cluster.cu: 1 = send_head prefetch, 4 = register-lean reducer loop;
# ablations of the lean loop that break the output, for timing only: 8 = no shared-memory loads,
# 16 = no output stores; 32 = with 4, the reduced row written into a slot and bulk-stored; 64 =
# the argument pointers hoisted into registers before the token loop), each
# with the per-token stamps (EPTWIN_CLUSTER_TIMES=1).
# Log: tokens3-log.txt (run 2026-12-03 16:47 UTC). The knob and its variants were a working state of
# the kernel that was not committed: variant 5 (1 + 4) became the kernel, then its slot indices were
# resolved by the ring leaders (reduce.sh); the other variants and the knob were removed.
# Binary built here and carried: strip -o .devbin/t1/eptwin target/release/eptwin.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/t1/eptwin}
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000 EPTWIN_NCCL_BASELINE=0 EPTWIN_PROBES=0
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
run() { # $1 = scenario, rest = env assignments
  local sc="$1"; shift 1
  echo; echo "== $* eptwin run scenarios/h200-ep8-$sc.toml --backend hw"
  env "$@" timeout 150 $B run scenarios/h200-ep8-$sc.toml --backend hw --out /tmp/o 2>&1 | grep -E "memcpy ceiling|  ep8 |verdict|rror|warp finish|per token|FAILED"
  echo "== exit ${PIPESTATUS[0]}"
}
for v in 0 1 5 65 69 101 37 20 0 1 5 65 69 101 37 20; do run normal-128 EPTWIN_CLUSTER_VARIANT=$v EPTWIN_CLUSTER_TIMES=1; done
for v in 0 5 69 101 0 5 69 101; do run normal-4096 EPTWIN_CLUSTER_VARIANT=$v EPTWIN_CLUSTER_TIMES=1; done
echo "== done"
