#!/usr/bin/env bash
# Where the cluster combine's time goes per token (EPTWIN_CLUSTER_TIMES=1 now also stamps, per
# block, when each of its first 32 tokens had every partial in shared memory and when its
# reduction was done), and whether loading the next token's send_head entry early
# (EPTWIN_CLUSTER_VARIANT=1) changes it. Log: tokens-log.txt.
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
for v in 0 1 0 1; do run normal-128 EPTWIN_CLUSTER_VARIANT=$v; done
run normal-128 EPTWIN_CLUSTER_VARIANT=0 EPTWIN_CLUSTER_TIMES=1
run normal-128 EPTWIN_CLUSTER_VARIANT=1 EPTWIN_CLUSTER_TIMES=1
run normal-4096 EPTWIN_CLUSTER_VARIANT=0 EPTWIN_CLUSTER_TIMES=1
run normal-4096 EPTWIN_CLUSTER_VARIANT=1 EPTWIN_CLUSTER_TIMES=1
echo "== done"
