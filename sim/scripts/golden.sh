#!/usr/bin/env bash
# Golden comparison for simulator changes that must not alter results: run every scenario
# through the release binary and compare each result JSON byte for byte with a reference run
# (the `git_commit` provenance line is the only line allowed to differ), and the Chrome traces
# of two packet-level scenarios (InfiniBand and RoCE) byte for byte.
#
#   sim/scripts/golden.sh record DIR    # before a change: write the reference results to DIR
#   sim/scripts/golden.sh check DIR     # after: run again into a temp dir and compare with DIR
#
# `cargo test` checks the same against the committed snapshots in sim/tests/snapshots/
# (sim/tests/it/scenarios.rs; INSTA_UPDATE=always rewrites them); this script compares with any
# reference run, e.g. one recorded before a change.
#
# A change that is meant to move results slightly (documented in results/sim/README.md) is
# measured with sim/scripts/result-diff.py REF_DIR NEW_DIR instead: per file and field, the
# number of differing values and the largest relative difference.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?record|check}
ref=${2:?reference directory}
cargo build --release -q
bin=${CARGO_TARGET_DIR:-target}/release/eptwin
scenarios=(scenarios/*.toml scenarios/validation/*.toml scenarios/ll-ep-sweep/*.toml)
traced=(ep16-ll roce-ep16-ll)
case "$mode" in
record)
    "$bin" run "${scenarios[@]}" --out "$ref" >/dev/null
    mkdir -p "$ref/traces"
    for s in "${traced[@]}"; do
        "$bin" run "scenarios/$s.toml" --out "$ref/traces" \
            --trace "$ref/traces/$s.trace.json" >/dev/null
        rm "$ref/traces/$s.json"
    done
    echo "recorded $(ls "$ref"/*.json | wc -l) results and ${#traced[@]} traces in $ref"
    ;;
check)
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    start=$(date +%s.%N)
    "$bin" run "${scenarios[@]}" --out "$out" >/dev/null || true
    end=$(date +%s.%N)
    bad=0
    for f in "$ref"/*.json; do
        name=$(basename "$f")
        if [ ! -f "$out/$name" ]; then
            echo "MISSING $name"; bad=1; continue
        fi
        if ! cmp -s <(grep -v '"git_commit"' "$f") <(grep -v '"git_commit"' "$out/$name"); then
            echo "DIFFERS $name"; bad=1
            # diff exits 1 when the files differ: under `set -e -o pipefail` that would end the
            # check at the first difference instead of listing them all.
            diff <(grep -v '"git_commit"' "$f") <(grep -v '"git_commit"' "$out/$name") | head -20 || true
        fi
    done
    for f in "$out"/*.json; do
        [ -f "$ref/$(basename "$f")" ] || { echo "EXTRA $(basename "$f")"; bad=1; }
    done
    for s in "${traced[@]}"; do
        [ -f "$ref/traces/$s.trace.json" ] || continue
        "$bin" run "scenarios/$s.toml" --out "$out/traces" \
            --trace "$out/$s.trace.json" >/dev/null
        if cmp -s "$ref/traces/$s.trace.json" "$out/$s.trace.json"; then
            echo "trace $s identical"
        else
            echo "DIFFERS trace $s"; bad=1
        fi
    done
    printf 'all scenarios: %.1f s wall\n' "$(echo "$end - $start" | bc)"
    if [ $bad -eq 0 ]; then echo "golden: all $(ls "$ref"/*.json | wc -l) results identical"; fi
    exit $bad
    ;;
*) echo "usage: $0 record|check DIR" >&2; exit 2 ;;
esac
