#!/usr/bin/env bash
# One scenario of 8 ranks on the one H200 as 1 process, as 8 processes and as 2 processes of 4
# ranks (eptwin's --spawn, torchrun and Open MPI's mpirun), for a low-latency and a normal
# scenario, and the two internode scenarios over the TCP wire as 1 process and as 2 (one per
# node); every run's per-rank output digests compared with the single-process run's; then
# one process killed mid-run to show that the others end within the documented bound.
#
# Runs on the GPU machine (the device tool's `run`) with a release binary built elsewhere:
#   bash scripts/h200-cluster.sh path/to/eptwin
# Writes under $OUT (what comes back): log.txt (everything), summary.txt (the table) and
# results.tar.gz (every run's result JSON, stdout and stderr). Takes about two minutes.
set -uo pipefail

BIN=$(realpath "${1:?usage: h200-cluster.sh EPTWIN_BINARY}")
OUT=${OUT:-/tmp/eptwin-cluster}
WORK=/tmp/eptwin-cluster-work
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK/runs"
exec > >(tee -a "$OUT/log.txt") 2>&1

# NVLink multicast stays off on shared hosts; kernels cached across runs; short bounds so that
# the kill test ends quickly. The copy probes and the NCCL baseline belong to the single-process
# measurements (scripts/h200-measure.sh): off here. Both normal kernels on global-memory rings
# in every run (the cluster kernels need all ranks in one launch, so multi-process runs use the
# global ones; the single-process run must run the same kernels for the digests to compare).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
export EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0
export EPTWIN_NORMAL_DISPATCH=global EPTWIN_NORMAL_COMBINE=global
export EPTWIN_PEER_TIMEOUT_S=5 EPTWIN_ABORT_GRACE_S=3 EPTWIN_RENDEZVOUS_TIMEOUT_S=60
export CUDA_MPS_PIPE_DIRECTORY=/tmp/eptwin-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/eptwin-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
TORCHRUN=${TORCHRUN:-$(command -v torchrun || echo /opt/torch/.venv/bin/torchrun)}
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
MPIRUN=${MPIRUN:-$(command -v mpirun || echo mpirun)}

stop_mps() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; }
trap stop_mps EXIT

echo "== provenance"
date -u +%Y-%m-%dT%H:%M:%SZ
"$BIN" --version
nvidia-smi --query-gpu=index,name,driver_version,compute_mode --format=csv,noheader
echo "torchrun: $TORCHRUN  mpirun: $MPIRUN  python: $PY"

# run NAME -- COMMAND...: one eptwin run with its own result folder; the command gets
# `--out DIR` appended. Records name, exit code and wall time.
run() {
    local name=$1; shift; [[ "$1" == -- ]] && shift
    local dir="$WORK/runs/$name"
    mkdir -p "$dir"
    local t0; t0=$(date +%s%N)
    timeout 150 "$@" --out "$dir" >"$dir/stdout.txt" 2>"$dir/stderr.txt"
    local rc=$?
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '%s\t%s\t%s\n' "$name" "$rc" "$ms" >>"$WORK/runs.tsv"
    echo "== $name: exit $rc after $ms ms"
    grep -v '^\[p[1-9]' "$dir/stderr.txt" | tail -n 4
}

scenarios=(h200-ep8-ll-128 h200-ep8-normal-128)

echo
echo "== without MPS: several processes on one GPU are waived (77) with how to start MPS"
run waiver-no-mps -- "$BIN" run scenarios/h200-ep8-ll-128.toml --backend hw --spawn 2 --ranks-per-process 4
cat "$WORK/runs/waiver-no-mps/stdout.txt"

echo
echo "== MPS"
nvidia-cuda-mps-control -d && echo "MPS control daemon started"

for s in "${scenarios[@]}"; do
    f=scenarios/$s.toml
    echo
    echo "== $s"
    run "$s.single" -- "$BIN" run "$f" --backend hw
    run "$s.spawn8" -- "$BIN" run "$f" --backend hw --spawn 8
    if [[ $s == *normal* && $(tail -n 1 "$WORK/runs.tsv" | cut -f2) != 0 ]]; then
        # 8 × 30 blocks need two blocks of different processes per SM; 8 × 16 fit one per SM.
        EPTWIN_NORMAL_SMS=16 run "$s.spawn8-sms16" -- "$BIN" run "$f" --backend hw --spawn 8
    fi
    run "$s.torchrun8" -- "$TORCHRUN" --no-python --nproc-per-node 8 --master-port 29611 \
        "$BIN" run "$f" --backend hw
    run "$s.spawn2x4" -- "$BIN" run "$f" --backend hw --spawn 2 --ranks-per-process 4
    run "$s.mpirun2x4" -- "$MPIRUN" --allow-run-as-root -np 2 \
        "$BIN" run "$f" --backend hw --ranks-per-process 4
done

echo
echo "== internode over the TCP wire: both nodes in one process, then one process per node"
for pair in h200-2node-ep16-normal:8 h200-2node-ep8-ll:4; do
    s=${pair%:*} per_node=${pair#*:}
    f=scenarios/$s.toml
    run "$s.single" -- "$BIN" run "$f" --backend hw --wire tcp
    run "$s.spawn2" -- "$BIN" run "$f" --backend hw --wire tcp --spawn 2 --ranks-per-process "$per_node"
done

echo
echo "== one process of 8 killed mid-run (SIGKILL): the others must end within the bound"
# The low-latency scenario with enough iterations to be running when the kill comes.
sed -e 's/^iterations = .*/iterations = 3000/' -e 's/^name = .*/name = "kill-test"/' \
    scenarios/h200-ep8-ll-128.toml >"$WORK/kill-test.toml"
mkdir -p "$WORK/runs/kill8"
t0=$(date +%s%N)
"$BIN" run "$WORK/kill-test.toml" --backend hw --spawn 8 --out "$WORK/runs/kill8" \
    >"$WORK/runs/kill8/stdout.txt" 2>"$WORK/runs/kill8/stderr.txt" &
spawner=$!
# Kill once every process has passed its first timed op (the run is then in its iterations).
for _ in $(seq 1 200); do
    sleep 0.1
    kids=$(pgrep -P "$spawner" | wc -l)
    [[ $kids -eq 8 ]] && (( $(date +%s%N) - t0 > 6000000000 )) && break
done
victim=$(pgrep -P "$spawner" | sort -n | sed -n 4p)
echo "killing pid $victim ($(pgrep -P "$spawner" | wc -l) processes running)"
kill -9 "$victim"
tk=$(date +%s%N)
wait "$spawner"
rc=$?
ms=$(( ($(date +%s%N) - tk) / 1000000 ))
printf 'kill8\t%s\t%s\n' "$rc" "$ms" >>"$WORK/runs.tsv"
echo "== kill8: spawner exit $rc, $ms ms after the kill"
grep -E 'eptwin|error|closed|abandon' "$WORK/runs/kill8/stderr.txt" | head -n 20

stop_mps
echo "MPS stopped"

echo
echo "== summary"
"$PY" - "$WORK" >"$OUT/summary.txt" <<'EOF'
import json, os, sys
work = sys.argv[1]
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(work, "runs.tsv"))]
def result(name):
    d = os.path.join(work, "runs", name)
    files = [f for f in os.listdir(d) if f.endswith(".json")] if os.path.isdir(d) else []
    return json.load(open(os.path.join(d, files[0]))) if files else None
def digests(r):
    return {k: v for k, v in r.get("measurements", {}).items() if k.startswith("hw.output_digest.")}
print(f"{'run':32} {'exit':>4} {'wall s':>7} {'procs':>5} {'launcher':>9} {'verdict':>8} "
      f"{'dispatch us':>12} {'combine us':>11}  digests vs single")
for name, rc, ms in rows:
    r = result(name)
    if r is None:
        print(f"{name:32} {rc:>4} {int(ms)/1e3:7.1f}  (no result file)")
        continue
    b = r["backend"]
    lat = {op["op"]: op["summary"]["latency_us"]["mean"] for j in r["jobs"] for op in j["ops"]}
    ref_name = name.rsplit(".", 1)[0] + ".single"
    ref = result(ref_name) if "." in name else None
    if ref is None or name == ref_name:
        same = f"{len(digests(r))} digests (reference)" if digests(r) else "-"
    else:
        a, b2 = digests(ref), digests(r)
        equal = sum(1 for k in a if b2.get(k) == a[k])
        same = f"{equal}/{len(a)} equal" + ("" if set(a) == set(b2) else f" (keys differ: {len(b2)})")
    print(f"{name:32} {rc:>4} {int(ms)/1e3:7.1f} {b.get('processes', '?'):>5} "
          f"{b.get('launcher', '?'):>9} {r['verdict']:>8} {lat.get('dispatch', 0):12.2f} "
          f"{lat.get('combine', 0):11.2f}  {same}")
    for f in r.get("failures", [])[:3]:
        print(f"    failure: {f[:200]}")
    if r.get("waived_reason"):
        print(f"    waived: {r['waived_reason'][:200]}")
EOF
cat "$OUT/summary.txt"
tar -czf "$OUT/results.tar.gz" -C "$WORK" runs runs.tsv
echo "== done"
