#!/usr/bin/env bash
# Faults on the hardware backend against the simulator (issue 43; docs/cluster.md, "Faults on
# the hardware backend"), on one GPU with every rank in a process of its own (MPS):
#
#   * healthy     the low-latency EP8 of scenarios/h200-ep8-ll-128.toml, 8 processes
#   * straggler   the same with rank 3 starting every op 20 µs, then 100 µs, late: `ok`, the
#                 op's time (slowest rank) up by about the delay
#   * rank-down   rank 5 down from the start: its process exits, the run fails (exit 1)
#                 within the bounds, naming the rank; with enable_shrink: waived (exit 77)
#   * wire-loss   the 2-node EP8 of scenarios/h200-2node-ep8-ll.toml over the TCP wire, one
#                 process per node, 1e-3 of the records lost: `ok`, every token checked
#   * nic-down    the same with node 1's NIC down: the QPs fail, the kernels time out (exit 1)
#
# Every scenario also runs on the simulator (`--backend sim`) for the comparison.
#
# Built here, run there (no Rust needed on the GPU machine): from the repository root,
#
#   OUT=/some/dir scripts/gpu-faults.sh          (about 3 minutes; every step ≤ 90 s, the
#                                                 whole under BUDGET_S, default 330 s)
#
# EPTWIN_BIN (default target/release/eptwin) is the binary. A step that would start past the
# budget is skipped and logged as such. Writes under $OUT: faults.log
# (every command, exit code and wall time), summary.txt (the table: verdict, exit, mean / p50 /
# p99 per op, first failure line, for hw and sim), scenarios/ (the generated scenario files)
# and runs/<name>.<backend>/ (result JSON, stdout, stderr of each run). EPTWIN_FAULTS_SIM_ONLY=1
# runs the simulator half only (no GPU needed: checks the script and the scenarios).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:?set OUT to the directory for the results}
BIN=$(realpath "${EPTWIN_BIN:-$ROOT/target/release/eptwin}")
SIM_ONLY=${EPTWIN_FAULTS_SIM_ONLY:-0}
BUDGET_S=${BUDGET_S:-330}
start=$SECONDS
mkdir -p "$OUT/scenarios" "$OUT/runs"
[ -x "$BIN" ] || { echo "gpu-faults: $BIN missing: build eptwin --release first" >&2; exit 2; }
: >"$OUT/faults.log"
log() { echo "$*" | tee -a "$OUT/faults.log"; }

# NVLink multicast stays off on shared hosts; kernels cached across runs; short bounds so a
# failing run ends in seconds (the kernels' bounded waits: 3 s; a silent peer: 5 s). The copy
# probes and the NCCL baseline belong to scripts/h200-measure.sh: off here.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache EPTWIN_KERNEL_TIMEOUT_MS=3000
export EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0
export EPTWIN_PEER_TIMEOUT_S=5 EPTWIN_ABORT_GRACE_S=3 EPTWIN_RENDEZVOUS_TIMEOUT_S=60
export CUDA_MPS_PIPE_DIRECTORY=/tmp/eptwin-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/eptwin-mps-log

# scenario NAME BASE FAULT-TOML [SED-EXPR]: $OUT/scenarios/NAME.toml from scenarios/BASE.toml,
# renamed, with the fault table appended.
scenario() {
    local name=$1 base=$2 fault=$3 edit=${4:-}
    local exprs=(-e "s/^name = .*/name = \"$name\"/")
    [ -n "$edit" ] && exprs+=(-e "$edit")
    sed "${exprs[@]}" "scenarios/$base.toml" >"$OUT/scenarios/$name.toml"
    printf '%b' "$fault" >>"$OUT/scenarios/$name.toml"
}

# run NAME BACKEND [ARGS...]: one eptwin run of $OUT/scenarios/NAME.toml, bounded by 90 s and
# by what is left of the budget (timeout signals the spawner's whole process group).
run() {
    local name=$1 backend=$2
    shift 2
    local dir="$OUT/runs/$name.$backend"
    mkdir -p "$dir"
    local limit=90 left=$((start + BUDGET_S - SECONDS))
    ((left < limit)) && limit=$left
    if ((limit < 10)); then
        echo "skipped" >"$dir/exit"
        echo "skipped: the time budget ($BUDGET_S s) is spent" >"$dir/stderr.txt"
        log "$name.$backend: skipped, the time budget ($BUDGET_S s) is spent"
        return 0
    fi
    local t0=$SECONDS
    timeout -k 5 "$limit" "$BIN" run "$OUT/scenarios/$name.toml" --backend "$backend" \
        --out "$dir" "$@" >"$dir/stdout.txt" 2>"$dir/stderr.txt"
    local rc=$?
    echo "$rc" >"$dir/exit"
    log "$name.$backend: eptwin run $OUT/scenarios/$name.toml --backend $backend --out $dir $* -> exit $rc after $((SECONDS - t0)) s (limit $limit s)"
    grep -v '^\[p[1-9]' "$dir/stderr.txt" | grep -iE 'error|fault|timeout|down|waiv' | head -n 3 |
        sed 's/^/    /' | tee -a "$OUT/faults.log"
}

log "== provenance: $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(timeout 10 "$BIN" --version 2>&1)"
log "nvidia-smi: $(timeout 20 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2 | tr '\n' ';')"
# The hardware backend loads libnccl.so; a machine with only the pip wheel's libnccl.so.2
# needs a symlink on LD_LIBRARY_PATH.
if [ "$SIM_ONLY" != 1 ] && ! ldconfig -p | grep -q 'libnccl\.so '; then
    n2=$(ldconfig -p | grep -o '/[^ ]*libnccl\.so\.2$' | head -1)
    [ -z "$n2" ] && n2=$(timeout 20 find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
    if [ -n "$n2" ]; then
        mkdir -p /tmp/ncclib && ln -sf "$n2" /tmp/ncclib/libnccl.so
        export LD_LIBRARY_PATH="/tmp/ncclib:${LD_LIBRARY_PATH:-}"
        log "libnccl.so -> $n2"
    fi
fi

straggler() { echo "\n[[fault]]\nkind = \"straggler\"\nranks = \"3\"\ndelay_us = $1\n"; }
scenario healthy h200-ep8-ll-128 ''
scenario straggler-20us h200-ep8-ll-128 "$(straggler 20)"
scenario straggler-100us h200-ep8-ll-128 "$(straggler 100)"
scenario rank-down h200-ep8-ll-128 '\n[[fault]]\nkind = "rank_down"\nranks = "5"\nat_us = 0\n'
scenario rank-down-shrink h200-ep8-ll-128 '\n[[fault]]\nkind = "rank_down"\nranks = "5"\nat_us = 0\n' \
    's/^low_latency_mode = true/low_latency_mode = true\nenable_shrink = true/'
scenario wire-healthy h200-2node-ep8-ll ''
scenario wire-loss h200-2node-ep8-ll '\n[[fault]]\nkind = "packet_loss"\nrate = 1e-3\n'
scenario nic-down h200-2node-ep8-ll '\n[[fault]]\nkind = "nic_down"\nnode = 1\nnic = 0\nat_us = 0\n'
ONE_NODE=(healthy straggler-20us straggler-100us rank-down rank-down-shrink)
TWO_NODES=(wire-healthy wire-loss nic-down)

log "== simulator"
for s in "${ONE_NODE[@]}" "${TWO_NODES[@]}"; do
    run "$s" sim
done

if [ "$SIM_ONLY" != 1 ]; then
    log "== hardware: 8 processes on the one GPU through MPS"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    timeout 20 nvidia-cuda-mps-control -d >>"$OUT/faults.log" 2>&1
    log "MPS control daemon: exit $?"
    trap 'echo quit | timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1 || true' EXIT
    for s in "${ONE_NODE[@]}"; do
        run "$s" hw --spawn 8
        # A run that failed ended its clients abruptly (a dead rank's process exits with its
        # context open): a fresh MPS server for the next run, whose contexts the old one may
        # still refuse (seen: CUDA_ERROR_UNKNOWN from cuDevicePrimaryCtxRetain right after).
        if [ "$(cat "$OUT/runs/$s.hw/exit")" != 0 ]; then
            echo quit | timeout 20 nvidia-cuda-mps-control >>"$OUT/faults.log" 2>&1
            sleep 2
            timeout 20 nvidia-cuda-mps-control -d >>"$OUT/faults.log" 2>&1
            log "MPS control daemon restarted after $s.hw: exit $?"
        fi
    done
    log "== hardware: one process per node over the TCP wire"
    for s in "${TWO_NODES[@]}"; do
        run "$s" hw --wire tcp --spawn 2 --ranks-per-process 4
    done
fi
log "== total $((SECONDS - start)) s"

timeout 30 python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
print(f"{'run':<34}{'exit':>8}  {'verdict':<8}{'op':<9}{'mean us':>10}{'p50 us':>10}{'p99 us':>10}  first failure / waiver")
for d in sorted(glob.glob(os.path.join(out, "runs", "*"))):
    name = os.path.basename(d)
    rc = open(os.path.join(d, "exit")).read().strip()
    docs = [p for p in glob.glob(os.path.join(d, "*.json"))]
    if not docs:
        err = open(os.path.join(d, "stderr.txt"), errors="replace").read().strip().splitlines()
        print(f"{name:<34}{rc:>8}  {'-':<8}{'-':<9}{'':>30}  {(err[-1] if err else '')[:160]}")
        continue
    r = json.load(open(docs[0]))
    why = (r.get("failures") or [r.get("waived_reason") or ""])[0] or ""
    ops = [(j, o) for j in r.get("jobs", []) for o in j.get("ops", [])]
    if not ops:
        print(f"{name:<34}{rc:>8}  {r.get('verdict'):<8}{'-':<9}{'':>30}  {why[:160]}")
    for j, o in ops:
        lat = o["summary"]["latency_us"]
        masked = j.get("masked_ranks") or ""
        print(f"{name:<34}{rc:>8}  {r.get('verdict'):<8}{o['op']:<9}{lat['mean']:>10.1f}{lat['p50']:>10.1f}{lat['p99']:>10.1f}  {masked} {why[:160]}")
        why = ""
EOF
