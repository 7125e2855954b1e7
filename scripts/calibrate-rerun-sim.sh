#!/usr/bin/env bash
# The simulator side of a committed `scripts/gpu-calibrate.sh` run, re-run here (no GPU): the
# DeepEP costs fitted again to the committed one-rank runs on the committed probes, the model
# compared with DeepEP's committed imports, and the four one-GPU scenarios simulated on that
# profile and compared with the hardware times the run's comparison documents hold.
#
#   scripts/calibrate-rerun-sim.sh [RUN_DIR] OUT_DIR
#
# RUN_DIR is the committed run (default results/h200/calibrate). OUT_DIR gets profile.toml (the
# refit profile), fit.txt (calibrate's summary with the fit table), compare-deepep.txt (eptwin
# compare, 10 %), compare-one-gpu.txt (each op: hardware, the run's simulator, this one).
# EPTWIN_BIN is the binary (default target/release/eptwin). The imports of a run made before
# `eptwin deepep import` recorded the GPU get it from the probes (`backend.gpu_names`) in the
# copy compared here; the committed files are not touched.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${EPTWIN_BIN:-$ROOT/target/release/eptwin}
if [ $# -eq 2 ]; then RUN=$1; OUT=$2; else RUN=$ROOT/results/h200/calibrate; OUT=${1:?OUT_DIR}; fi
RUN=$(cd "$RUN" && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
W=$OUT/work
rm -rf "$W" && mkdir -p "$W/deepep" "$W/one-gpu"
cp -r "$RUN"/run/profile.deepep/* "$W/deepep/" && chmod -R u+w "$W/deepep"
python3 - "$W/deepep" "$RUN/run/probes-only.probes.json" <<'PY'
import glob, json, sys
gpus = json.load(open(sys.argv[2]))["backend"].get("gpu_names") or []
for f in glob.glob(sys.argv[1] + "/*/*.deepep.json"):
    d = json.load(open(f))
    if gpus and not d["backend"].get("gpu_names"):
        d["backend"]["gpu_names"] = gpus[:1]
        json.dump(d, open(f, "w"))
PY
"$BIN" calibrate --base "$RUN/run/probes-only.toml" --name calibrated \
    --from "$RUN/run/probes-only.probes.json" --deepep-runs "$W/deepep" \
    --out "$OUT/profile.toml" >"$OUT/fit.txt" 2>"$W/fit.stderr" || {
    echo "calibrate failed: $W/fit.stderr" >&2
    exit 1
}
for d in "$W"/deepep/*/; do
    for f in "$d"compare-*.toml; do
        sed -i "s|^profile = .*|profile = \"$OUT/profile.toml\"|; s|^routing_file = .*|routing_file = \"${d}routing.json\"|" "$f"
    done
done
"$BIN" compare "$W"/deepep/*/compare-*.toml --measured "$W/deepep" --allow-other-text \
    --out "$W/deepep-cmp" --tolerance 10 >"$OUT/compare-deepep.txt" 2>"$W/compare-deepep.stderr"
echo "DeepEP one rank, 10 %: eptwin compare exit $? ($OUT/compare-deepep.txt)"
SCENARIOS=()
for s in ll-128 ll-4096 normal-128 normal-4096; do
    f=$W/one-gpu/h200-ep8-$s.toml
    sed "s|^profile = \"h200-single\"|profile = \"$OUT/profile.toml\"|" \
        "$ROOT/scenarios/h200-ep8-$s.toml" >"$f"
    SCENARIOS+=("$f")
done
"$BIN" run "${SCENARIOS[@]}" --out "$W/one-gpu/sim" >"$W/one-gpu/sim.txt" 2>&1 || {
    echo "simulator run failed: $W/one-gpu/sim.txt" >&2
    exit 1
}
python3 - "$RUN/run/one-gpu/cmp" "$W/one-gpu/sim" >"$OUT/compare-one-gpu.txt" <<'PY'
import glob, json, sys
print(f"# {'scenario':22s} {'op':9s} {'hw(us)':>9s} {'run sim':>9s} {'err%':>6s} {'sim here':>9s} {'err%':>6s}")
for f in sorted(glob.glob(sys.argv[1] + "/*.compare.json")):
    d = json.load(open(f))
    name = d["scenario"]
    s = json.load(open(glob.glob(f"{sys.argv[2]}/{name}*.json")[0]))
    ops = {o["op"]: o["summary"]["latency_us"]["mean"] for o in s["jobs"][0]["ops"]}
    for r in d["rows"]:
        m, old, new = r["measured"]["latency_us_mean"], r["simulated"]["latency_us_mean"], ops[r["op"]]
        print(f"  {name:22s} {r['op']:9s} {m:9.2f} {old:9.2f} {(old / m - 1) * 100:+6.1f} {new:9.2f} {(new / m - 1) * 100:+6.1f}")
PY
echo "one-GPU scenarios: $OUT/compare-one-gpu.txt"
cat "$OUT/compare-one-gpu.txt"
