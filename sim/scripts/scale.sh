#!/usr/bin/env bash
# The simulator's speed table (results/sim/README.md, "Speed at scale"): each scenario of
# sim/benches/scale/ (or those given) run as `eptwin run` runs it (the `simrun` example: engine
# and simulator only), pinned to one core, RUNS times; prints one Markdown row per scenario:
# wall time and user CPU time (ranges over the runs), events handled, events/s (at the
# smallest user time), peak RSS, and the host's 1-minute load average before and after.
#
#   sim/scripts/scale.sh                        # every bench scenario, 3 runs each
#   RUNS=5 sim/scripts/scale.sh sim/benches/scale/ll-ep1024.toml
#   INSTR=1 sim/scripts/scale.sh ...            # also instructions (valgrind, slow: ~50x)
#   SIMRUN=/path/to/simrun sim/scripts/scale.sh # another build (e.g. a baseline's)
#
# Wall times on a shared host are noisy: the range shows it, and on a host loaded past its
# cores the wall time counts the other users' turns; the user CPU time does not (though it
# still grows with their use of the shared caches), and events/s is taken from it. Instruction
# counts (INSTR=1, cachegrind without cache simulation) repeat exactly for the same build and
# scenario. CORE=none runs unpinned.
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
header="| scenario | wall (s) | user (s) | events | events/s (M, per user s) | peak RSS (MiB) | load |"
rule="|---|---:|---:|---:|---:|---:|---|"
pin=(taskset -c "$core")
[ "$core" = none ] && pin=()
if [ -n "${INSTR:-}" ]; then
    header="$header instructions (G) |"
    rule="$rule---:|"
fi
echo "$header"
echo "$rule"
for s in "$@"; do
    name=$(basename "$s" .toml)
    walls=()
    users=()
    rss=0
    load_before=$(cut -d' ' -f1 /proc/loadavg)
    events=""
    for _ in $(seq "$runs"); do
        /usr/bin/time -v "${pin[@]}" "$SIMRUN" "$s" >"$tmp/out" 2>"$tmp/time"
        wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$tmp/time" |
            awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
        walls+=("$wall")
        users+=("$(awk -F': ' '/User time \(seconds\)/ {print $2}' "$tmp/time")")
        r=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$tmp/time")
        [ "$r" -gt "$rss" ] && rss=$r
        e=$(awk '/events:/ {print $2}' "$tmp/out")
        if [ -n "$events" ] && [ "$e" != "$events" ]; then
            echo "$name: events differ between runs ($events, $e)" >&2
            exit 1
        fi
        events=$e
    done
    load_after=$(cut -d' ' -f1 /proc/loadavg)
    sorted=$(printf '%s\n' "${walls[@]}" | sort -g)
    lo=$(echo "$sorted" | head -1)
    hi=$(echo "$sorted" | tail -1)
    sorted=$(printf '%s\n' "${users[@]}" | sort -g)
    ulo=$(echo "$sorted" | head -1)
    uhi=$(echo "$sorted" | tail -1)
    row=$(awk -v lo="$lo" -v hi="$hi" -v ulo="$ulo" -v uhi="$uhi" -v e="$events" -v r="$rss" \
        -v n="$name" -v l="$load_before–$load_after" 'BEGIN {
        rate = ulo > 0 ? sprintf("%.1f", e / ulo / 1e6) : "–"
        printf "| %s | %.2f–%.2f | %.2f–%.2f | %d | %s | %.0f | %s |", n, lo, hi, ulo, uhi, e,
            rate, r / 1024, l }')
    if [ -n "${INSTR:-}" ]; then
        valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
            "$SIMRUN" "$s" >/dev/null 2>"$tmp/vg"
        ir=$(awk '/I *refs:/ {gsub(",", "", $NF); print $NF}' "$tmp/vg")
        row="$row $(awk -v i="$ir" 'BEGIN { printf "%.2f", i / 1e9 }') |"
    fi
    echo "$row"
done
