#!/usr/bin/env bash
# What the timing's L2 flush costs the one-GPU ops (docs/calibration.md, "The timing's L2
# flush"): the four h200-ep8 scenarios on the hardware backend in three passes, as every op is
# timed (after the 256 MB flush memset, L2 full of its dirty lines), with EPTWIN_L2_CLEAN=1 (the
# flush buffer read back before each op: clean lines), and as timed again (drift check).
# Each pass runs scripts/h200-short-run.sh, so each also has the flush write-back probe.
#
# How to run: build here, `mkdir -p .devbin && strip -o .devbin/eptwin target/release/eptwin`,
# then on the GPU machine from the repository root (device tool: carry [".devbin"]):
#   bash scripts/flush-cost.sh
# Output under $OUT: passes.tar.gz (per pass: log.txt, results/<scenario>.json) and
# summary.txt (each pass's per-op lines).
set -uo pipefail
EPTWIN_SCENARIOS=${EPTWIN_SCENARIOS:-normal-128 ll-128 normal-4096 ll-4096} \
    exec bash "$(dirname "$0")/ab-passes.sh" EPTWIN_L2_CLEAN flushed-a clean=1 flushed-b
