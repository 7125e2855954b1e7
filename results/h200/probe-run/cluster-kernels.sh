#!/usr/bin/env bash
# Normal kernels with the rings in cluster shared memory (EPTWIN_NORMAL_DISPATCH=cluster,
# EPTWIN_NORMAL_COMBINE=cluster) against the global-ring kernels, same binary, same run.
set -uo pipefail
B=${EPTWIN_BIN:-.devbin/cc5/eptwin}  # stripped release build carried to the GPU machine
exec > >(tee -a "$OUT/log.txt") 2>&1
export NCCL_NVLS_ENABLE=0 EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000 EPTWIN_NCCL_BASELINE=0
echo "== provenance"; date -u +%Y-%m-%dT%H:%M:%SZ
run() { # $1 = kernels (cluster|global), $2 = scenario, $3 = SMs override or ""
  local tag="$1-$2${3:+-sms$3}"; mkdir -p "$OUT/$tag"
  echo; echo "== EPTWIN_NORMAL_DISPATCH=$1 EPTWIN_NORMAL_COMBINE=$1 ${3:+EPTWIN_NORMAL_SMS=$3 }eptwin run scenarios/h200-ep8-$2.toml --backend hw"
  EPTWIN_NORMAL_DISPATCH=$1 EPTWIN_NORMAL_COMBINE=$1 EPTWIN_NORMAL_SMS=$3 timeout 150 $B run scenarios/h200-ep8-$2.toml --backend hw --out "$OUT/$tag"
  echo "== exit $?"
}
run cluster normal-128 ""
run cluster normal-4096 30

run global normal-4096 ""
echo "== done"
