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
# The cache holds one low_latency cubin per source and define set.
D=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for c in /tmp/eptwin-kernel-cache/low_latency*.cubin; do
    echo "== $c"
    "$D" -sass -fun ll_combine "$c" 2>&1 || "$D" -sass "$c" 2>&1
done > "$R/ll_combine.sass"
