#!/usr/bin/env bash
# Ran 2026-12-03 from an uncommitted tree between a9241c9 and 602233a (log: the same name
# with -log.txt). EPTWIN_CLUSTER_VARIANT existed only then: bit 0 = the dispatch receiver
# returns each slot once its store has read it, bit 1 = it stores every landed slot at once
# (602233a made both the only behaviour and dropped the knob).
# Cluster kernels with more channels than clusters resident at once (15 on the H200): the
# clusters run in waves, so a channel that finishes early hands its SMs to the next one instead
# of idling through the slowest channel's tail. EPTWIN_NORMAL_SMS = 2 x channels.
# Binary built here and carried: strip -o .devbin/v1/eptwin target/release/eptwin.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/v1/eptwin}
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000 EPTWIN_NCCL_BASELINE=0 EPTWIN_CLUSTER_VARIANT=1
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ
run() { # $1 = tag, $2 = scenario, rest = env assignments
  local tag="$1" sc="$2"; shift 2; mkdir -p "$OUT/$tag"
  echo; echo "== $* eptwin run scenarios/h200-ep8-$sc.toml --backend hw"
  env "$@" timeout 150 $B run scenarios/h200-ep8-$sc.toml --backend hw --out "$OUT/$tag" 2>&1 | grep -E "memcpy ceiling|  ep8 |verdict|rror|warp finish|FAILED|vs_memcpy"
  echo "== exit ${PIPESTATUS[0]}"
}
for sms in 30 60 120 240 480; do run w$sms normal-4096 EPTWIN_NORMAL_SMS=$sms EPTWIN_CLUSTER_TIMES=1; done
for sms in 30 60 120 240; do run w$sms-128 normal-128 EPTWIN_NORMAL_SMS=$sms; done
run w120b normal-4096 EPTWIN_NORMAL_SMS=120
run w30b normal-4096 EPTWIN_NORMAL_SMS=30
echo "== done"
