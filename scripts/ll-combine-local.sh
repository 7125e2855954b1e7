#!/usr/bin/env bash
# The low-latency combine's receive loop with every rank on one node (results/h200/
# ll-combine-local/): the h200-ep8 LL scenarios on the hardware backend in four passes,
# alternating a binary built before the loop's all-local path (`before-*`, EPTWIN_BEFORE) and
# the current one (`local-*`), and the combine's SASS of both.
#
# How to run: build here, `mkdir -p .devbin && strip -o .devbin/eptwin target/release/eptwin`,
# and the same at the earlier commit into .devbin/eptwin-before; then on the GPU machine from
# the repository root (device tool: carry [".devbin"]):
#   bash scripts/ll-combine-local.sh
# Output under $OUT: passes.tar.gz (per pass: log.txt, results/<scenario>.json), summary.txt
# (each pass's per-op lines) and ll_combine.sass (both kernels).
set -uo pipefail
R=${OUT:-/tmp/eptwin-out}
BEFORE=${EPTWIN_BEFORE:-.devbin/eptwin-before}
EPTWIN_SCENARIOS=${EPTWIN_SCENARIOS:-ll-128 ll-4096} \
    bash "$(dirname "$0")/ab-passes.sh" EPTWIN_BIN \
    "before-a=$BEFORE" local-a "before-b=$BEFORE" local-b
bash "$(dirname "$0")/ll-combine-sass.sh" > "$R/ll_combine.sass"
