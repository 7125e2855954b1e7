#!/usr/bin/env bash
# What the low-latency combine's dependent first `topk_idx` load costs per token
# (docs/calibration.md, "The low-latency combine's receive chain"): the h200-ep8 LL scenarios on
# the hardware backend in three passes, as committed (`default-a`), with
# EPTWIN_LL_COMBINE_PREFETCH=1 (each block prefetches its next token's top-k row into L2 a
# token ahead: `prefetch`), and as committed again (`default-b`, drift check). The combine's
# SASS (cuobjdump of the cached cubins) shows where the first slot load waits.
#
# How to run: build here, `mkdir -p .devbin && strip -o .devbin/eptwin target/release/eptwin`,
# then on the GPU machine from the repository root (device tool: carry [".devbin"]):
#   bash scripts/ll-combine-prefetch.sh
# Output under $OUT: passes.tar.gz (per pass: log.txt, results/<scenario>.json), summary.txt
# (each pass's per-op lines) and ll_combine.sass (both variants).
set -uo pipefail
R=${OUT:-/tmp/eptwin-out}
EPTWIN_SCENARIOS=${EPTWIN_SCENARIOS:-ll-128 ll-4096} \
    bash "$(dirname "$0")/ab-passes.sh" EPTWIN_LL_COMBINE_PREFETCH default-a prefetch=1 default-b
bash "$(dirname "$0")/ll-combine-sass.sh" > "$R/ll_combine.sass"
