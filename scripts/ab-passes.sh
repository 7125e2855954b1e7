#!/usr/bin/env bash
# Three passes of scripts/h200-short-run.sh for an A/B of one hardware-backend knob: as
# committed, with the knob set to 1, as committed again (drift check).
#   bash scripts/ab-passes.sh VARIABLE NAME_A NAME_ON NAME_B
# EPTWIN_SCENARIOS picks the scenarios (h200-short-run.sh's names). Output under $OUT:
# passes.tar.gz (per pass: log.txt, results/<scenario>.json) and summary.txt (each pass's
# per-op lines).
set -uo pipefail
VAR=$1
R=${OUT:-/tmp/eptwin-out}
mkdir -p "$R"
for p in "$2" "$3" "$4"; do
    if [ "$p" = "$3" ]; then export "$VAR=1"; else unset "$VAR"; fi
    OUT="$R/$p" bash "$(dirname "$0")/h200-short-run.sh" > /dev/null 2>&1
    { echo "== pass $p"; grep -E "^== eptwin|^  ep8|rror|panick" "$R/$p/log.txt"; } | tee -a "$R/summary.txt"
done
(cd "$R" && tar czf passes.tar.gz "$2" "$3" "$4" && rm -rf "$2" "$3" "$4")
