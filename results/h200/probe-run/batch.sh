#!/usr/bin/env bash
# Ran 2026-12-03 from an uncommitted tree between a9241c9 and 602233a (log: the same name
# with -log.txt). EPTWIN_CLUSTER_VARIANT existed only then: bit 0 = the dispatch receiver
# returns each slot once its store has read it, bit 1 = it stores every landed slot at once
# (602233a made both the only behaviour and dropped the knob).
# Cluster dispatch: the receiver storing every landed slot after the one it waited for in the
# same bulk stores (EPTWIN_CLUSTER_VARIANT=3) against one token per store (=1), 15 clusters and
# 120 clusters in waves. Binary: strip -o .devbin/v1/eptwin target/release/eptwin.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/v1/eptwin}
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000 EPTWIN_NCCL_BASELINE=0
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ
run() { # $1 = tag, $2 = scenario, rest = env assignments
  local tag="$1" sc="$2"; shift 2; mkdir -p "$OUT/$tag"
  echo; echo "== $* eptwin run scenarios/h200-ep8-$sc.toml --backend hw"
  env "$@" timeout 150 $B run scenarios/h200-ep8-$sc.toml --backend hw --out "$OUT/$tag" 2>&1 | grep -E "memcpy ceiling|  ep8 |verdict|rror|warp finish|FAILED|vs_memcpy|checks"
  echo "== exit ${PIPESTATUS[0]}"
}
run b3 normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=3 EPTWIN_CLUSTER_TIMES=1
run b1 normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=1
run b3b normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=3
run b1b normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=1
run b3w normal-4096 EPTWIN_NORMAL_SMS=240 EPTWIN_CLUSTER_VARIANT=3
run b3-128 normal-128 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=3
run b1-128 normal-128 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=1
echo "== done"
