#!/usr/bin/env bash
# `cuobjdump -sass -fun ll_combine` of every low_latency cubin in the kernel cache the
# h200 scripts use (one cubin per source and define set), on stdout.
#   bash scripts/ll-combine-sass.sh > ll_combine.sass
set -uo pipefail
D=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for c in /tmp/eptwin-kernel-cache/low_latency*.cubin; do
    echo "== $c"
    "$D" -sass -fun ll_combine "$c" 2>&1 || "$D" -sass "$c" 2>&1
done
