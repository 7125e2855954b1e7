#!/usr/bin/env bash
# `eptwin doctor` on a GPU machine: the node checks alone, then against a bundled single-GPU
# scenario, each as text and as JSON, everything under $OUT. Built here, run there (no Rust
# needed on the GPU machine): `cargo build --release` first, then from the repository root on
# the GPU machine:
#
#   OUT=/some/dir scripts/gpu-doctor.sh            (takes a few seconds)
#
# Writes $OUT/doctor-node.txt/.json, $OUT/doctor-<scenario>.txt/.json and $OUT/doctor.log
# (the exit codes). Expected on the single-GPU machine: NVML and CUDA answer (GPU, UUID,
# dma-buf), one GPU so no peer pairs, and no RDMA NIC: "no RDMA port, internode will waive".
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:?set OUT to the directory for the results}
BIN=${EPTWIN_BIN:-$ROOT/target/release/eptwin}
SCENARIO=${EPTWIN_DOCTOR_SCENARIO:-scenarios/h200-ep8-ll-128.toml}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "gpu-doctor: $BIN missing: run cargo build --release first" >&2; exit 2; }

log() { echo "$*" | tee -a "$OUT/doctor.log"; }
run() { # name, args...
    local name=$1
    shift
    # The doctor's own subprocesses are time-limited; this bounds the whole run as well.
    timeout 120 "$BIN" doctor "$@" >"$OUT/$name.txt" 2>"$OUT/$name.stderr"
    log "eptwin doctor $* (text): exit $?"
    timeout 120 "$BIN" doctor --json "$@" >"$OUT/$name.json" 2>>"$OUT/$name.stderr"
    log "eptwin doctor --json $* : exit $?"
}

: >"$OUT/doctor.log"
log "host $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ), eptwin $("$BIN" --version 2>&1)"
log "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -4 | tr '\n' ';')"
start=$SECONDS
run doctor-node
run "doctor-$(basename "$SCENARIO" .toml)" "$SCENARIO"
log "total $((SECONDS - start)) s"
cat "$OUT/doctor-node.txt"
