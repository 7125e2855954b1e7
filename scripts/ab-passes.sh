#!/usr/bin/env bash
# Passes of scripts/h200-short-run.sh for an A/B of one hardware-backend knob. Each pass is
# NAME (the variable unset: as committed) or NAME=VALUE (the variable set to VALUE);
# bracketing the variants with two unset passes checks for drift:
#   bash scripts/ab-passes.sh VARIABLE NAME_A NAME_ON=1 NAME_B
# EPTWIN_SCENARIOS picks the scenarios (h200-short-run.sh's names). Output under $OUT:
# passes.tar.gz (per pass: log.txt, results/<scenario>.json) and summary.txt (each pass's
# per-op lines).
set -uo pipefail
VAR=$1
shift
R=${OUT:-/tmp/eptwin-out}
mkdir -p "$R"
names=()
for pass in "$@"; do
    p=${pass%%=*}
    names+=("$p")
    if [ "$p" = "$pass" ]; then unset "$VAR"; else export "$VAR=${pass#*=}"; fi
    OUT="$R/$p" bash "$(dirname "$0")/h200-short-run.sh" > /dev/null 2>&1
    { echo "== pass $pass"; grep -E "^== eptwin|^  ep8|rror|panick" "$R/$p/log.txt"; } | tee -a "$R/summary.txt"
done
(cd "$R" && tar czf passes.tar.gz "${names[@]}" && rm -rf "${names[@]}")
