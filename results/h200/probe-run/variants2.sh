#!/usr/bin/env bash
# Ran 2026-12-03 from an uncommitted tree between a9241c9 and 602233a (log: the same name
# with -log.txt). EPTWIN_CLUSTER_VARIANT existed only then: bit 0 = the dispatch receiver
# returns each slot once its store has read it, bit 1 = it stores every landed slot at once
# (602233a made both the only behaviour and dropped the knob).
# Where the cluster kernels' time goes (EPTWIN_CLUSTER_TIMES=1: each warp's finish time) for the
# early-release receiver, one slot per source, then the cluster handoff probe's bulk-copy shapes
# (the probe's consumer now releases each slot as soon as its store has read it).
# Binary built here and carried: strip -o .devbin/v1/eptwin target/release/eptwin.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/v1/eptwin}
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000 EPTWIN_NCCL_BASELINE=0
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ
run() { # $1 = tag, $2 = scenario, rest = env assignments
  local tag="$1" sc="$2"; shift 2; mkdir -p "$OUT/$tag"
  echo; echo "== $* eptwin run scenarios/h200-ep8-$sc.toml --backend hw"
  env "$@" timeout 150 $B run scenarios/h200-ep8-$sc.toml --backend hw --out "$OUT/$tag" 2>&1 | grep -E "memcpy ceiling|  ep8 |verdict|rror|warp finish|FAILED"
  echo "== exit ${PIPESTATUS[0]}"
}
run t1 normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=1 EPTWIN_CLUSTER_TIMES=1
run t0 normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=0 EPTWIN_CLUSTER_TIMES=1
run s1 normal-4096 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=1 EPTWIN_CLUSTER_SLOTS=1
run t1-128 normal-128 EPTWIN_NORMAL_SMS=30 EPTWIN_CLUSTER_VARIANT=1 EPTWIN_CLUSTER_TIMES=1
echo; echo "== cluster probe (bulk-copy shapes)"
EPTWIN_CLUSTER_PROBE=1 EPTWIN_CLUSTER_PROBE_ONLY=tma EPTWIN_PROBES=0 timeout 200 $B run scenarios/h200-ep8-normal-128.toml --backend hw --out "$OUT/probe" 2>&1 | grep -E "cluster handoff|rror|FAILED"
echo "== exit ${PIPESTATUS[0]}"
echo "== done"
