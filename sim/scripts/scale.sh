#!/usr/bin/env bash
# The simulator's speed table (results/sim/README.md, "Speed at scale"): each scenario of
# sim/benches/scale/ (or those given) run as `eptwin run` runs it (the `simrun` example: engine
# and simulator only), pinned to one core, RUNS times; prints one Markdown row per scenario:
# wall time (range over the runs), events handled, events/s (at the fastest run), peak RSS.
#
#   sim/scripts/scale.sh                        # every bench scenario, 3 runs each
#   RUNS=5 sim/scripts/scale.sh sim/benches/scale/ll-ep1024.toml
#   INSTR=1 sim/scripts/scale.sh ...            # also instructions (valgrind, slow: ~50x)
#   SIMRUN=/path/to/simrun sim/scripts/scale.sh # another build (e.g. a baseline's)
#
# Wall times on a shared host are noisy: the range shows it. Instruction counts (INSTR=1,
# cachegrind without cache simulation) repeat exactly for the same build and scenario.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${RUNS:-3}
core=${CORE:-0}
if [ -z "${SIMRUN:-}" ]; then
    cargo build --release -q -p eptwin-sim --example simrun
    SIMRUN=${CARGO_TARGET_DIR:-target}/release/examples/simrun
fi
if [ $# -eq 0 ]; then
    set -- sim/benches/scale/*.toml
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
header="| scenario | wall (s) | events | events/s (M) | peak RSS (MiB) |"
rule="|---|---:|---:|---:|---:|"
if [ -n "${INSTR:-}" ]; then
    header="$header instructions (G) |"
    rule="$rule---:|"
fi
echo "$header"
echo "$rule"
for s in "$@"; do
    name=$(basename "$s" .toml)
    walls=()
    rss=0
    events=""
    for _ in $(seq "$runs"); do
        /usr/bin/time -v taskset -c "$core" "$SIMRUN" "$s" >"$tmp/out" 2>"$tmp/time"
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$tmp/time" |
            awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
        walls+=("$wall")
        r=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$tmp/time")
        [ "$r" -gt "$rss" ] && rss=$r
        e=$(awk '/events:/ {print $2}' "$tmp/out")
        if [ -n "$events" ] && [ "$e" != "$events" ]; then
            echo "$name: events differ between runs ($events, $e)" >&2
            exit 1
        fi
        events=$e
    done
    sorted=$(printf '%s\n' "${walls[@]}" | sort -g)
    lo=$(echo "$sorted" | head -1)
    hi=$(echo "$sorted" | tail -1)
    row=$(awk -v lo="$lo" -v hi="$hi" -v e="$events" -v r="$rss" -v n="$name" 'BEGIN {
        printf "| %s | %.2f–%.2f | %d | %.1f | %.0f |", n, lo, hi, e, e / lo / 1e6, r / 1024 }')
    if [ -n "${INSTR:-}" ]; then
        valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
            "$SIMRUN" "$s" >/dev/null 2>"$tmp/vg"
        ir=$(awk '/I *refs:/ {gsub(",", "", $NF); print $NF}' "$tmp/vg")
        row="$row $(awk -v i="$ir" 'BEGIN { printf "%.2f", i / 1e9 }') |"
    fi
    echo "$row"
done
