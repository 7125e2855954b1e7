#!/usr/bin/env bash
# What the low-latency combine's receive loop spends on each top-k link besides the slot load
# (docs/calibration.md, "The low-latency combine's receive chain"): the h200-ep8 LL scenarios
# on the hardware backend in four passes: as committed (`default-a`), with
# EPTWIN_LL_COMBINE_REDUCE=hoist_chain (the token's indices, weights and rank tests in
# registers before the hidden loop, the slot loads still one after another: `hoist_chain`),
# =hoist (the same with the slot loads independent: `hoist`), and as committed again
# (`default-b`, drift check). The combine's SASS (cuobjdump of the cached cubins) shows what
# each variant does per link.
#
# How to run: build here, `mkdir -p .devbin && strip -o .devbin/eptwin target/release/eptwin`,
# then on the GPU machine from the repository root (device tool: carry [".devbin"]):
#   bash scripts/ll-combine-reduce.sh
# Output under $OUT: passes.tar.gz (per pass: log.txt, results/<scenario>.json), summary.txt
# (each pass's per-op lines) and ll_combine.sass (every variant).
set -uo pipefail
R=${OUT:-/tmp/eptwin-out}
EPTWIN_SCENARIOS=${EPTWIN_SCENARIOS:-ll-128 ll-4096} \
    bash "$(dirname "$0")/ab-passes.sh" EPTWIN_LL_COMBINE_REDUCE \
    default-a hoist_chain=hoist_chain hoist=hoist default-b
# The cache holds one low_latency cubin per define set (file names carry the sources' hash).
D=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for c in /tmp/eptwin-kernel-cache/low_latency*.cubin; do
    echo "== $c"
    "$D" -sass -fun ll_combine "$c" 2>&1 || "$D" -sass "$c" 2>&1
done > "$R/ll_combine.sass"
