#!/usr/bin/env bash
# The hardware backend on the GPU machine (one H100 or H200), as built from this tree: the
# kernel families behind one trait, the group and wire crates, the plan's low-latency path rule.
# Runs from the repository root; every step bounded by `timeout` and by one time budget
# (BUDGET_S, default 330 s); a failed step is logged and the script goes on.
#
# What it proves, step by step (summary.txt has each step's exit and time):
#  1. hw-unit --include-ignored: the backend's unit tests, NVRTC compiling every kernel for this GPU.
#  2. The GPU test low_latency_without_nvlink_sends_every_peer_message_over_the_wire: with
#     allow_nvlink_for_low_latency_mode = false every message between two ranks crosses the
#     (TCP) wire, each rank its own block, and the byte split is exactly the routing's.
#  3. hw-it --ignored: every other GPU test, the conformance suite's hardware arm, internode over
#     the TCP wire.
#  4. hw-processes --ignored under MPS: one job's ranks in several processes, digests equal to
#     one process's.
#  5. Four scenarios with --backend hw, each held by gpu-hw-redesign-compare.py against a
#     committed result of the same scenario made by the code before the redesign (same kernels,
#     same routing): every rank's output digest equal (byte-identical outputs), the same byte
#     counts per op, every committed measurement key present, the deterministic values
#     (placement, flag scope, kernel shapes, bytes) equal. References:
#       h200-ep8-{ll,normal}-128  results/h200/repeat/ (a9128b7, H200)
#       h200-2node-{ep8-ll,ep16-normal}  results/h200/internode/one-process/ (08f343f, H200, TCP)
#     Timings are not compared (another GPU may come).
#  6. h200-ep8-ll-128 with allow_nvlink_for_low_latency_mode = false (…-no-p2p), on the GPU
#     over the TCP wire and on the simulator (the same binary): verdict ok, one wire block per
#     rank, per op the simulator's RDMA bytes on the wire (every peer message), and with a rank's
#     own messages (local stores) the P2P run's total of step 5 (every message once).
#
# Inputs (paths relative to the repository root):
#   EPTWIN_BIN   the eptwin binary (default target/release/eptwin)
#   HW_TESTS     a folder with the hw test binaries hw-unit, hw-it, hw-processes (default
#                .devbin), built here by `scripts/gpu-hw-redesign.sh --prepare`; steps 1-4 fail
#                naming the file when it is missing
#   OUT          required: $OUT/gpu-hw-redesign.log (every command and exit code),
#                $OUT/summary.txt, $OUT/results/ (the documents), $OUT/compare.txt
# Exits 0 when every step passed.
set -uo pipefail

if [[ "${1:-}" == "--prepare" ]]; then
    # Here, on the development machine: the hw test binaries, stripped (about 30 MiB).
    set -e
    dir=${HW_TESTS:-.devbin}
    cargo test --release -p eptwin-hw --no-run --message-format=json-render-diagnostics \
        >/tmp/eptwin-hw-tests.json
    exe() {
        grep '"kind":\["'"$1"'"\]' /tmp/eptwin-hw-tests.json | grep '"name":"'"$2"'"' |
            sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -1
    }
    mkdir -p "$dir"
    cp "$(exe lib eptwin_hw)" "$dir/hw-unit"
    cp "$(exe test it)" "$dir/hw-it"
    cp "$(exe test processes)" "$dir/hw-processes"
    strip "$dir"/hw-*
    ls -la "$dir"
    exit 0
fi

: "${OUT:?OUT must name the folder the results go to}"
EPTWIN_BIN=${EPTWIN_BIN:-target/release/eptwin}
HW_TESTS=${HW_TESTS:-.devbin}
BUDGET_S=${BUDGET_S:-330}
start_s=$(date +%s)
mkdir -p "$OUT/results"
log="$OUT/gpu-hw-redesign.log"
summary="$OUT/summary.txt"
: >"$summary"
exec > >(tee -a "$log") 2>&1

# NVLink multicast stays off on shared hosts (KINDS.md); EPTWIN_REQUIRE_HW turns a waived
# GPU run into a failure here.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache

echo "== provenance"
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git on the GPU machine)"
echo "EPTWIN_BIN=$EPTWIN_BIN HW_TESTS=$HW_TESTS BUDGET_S=$BUDGET_S"
"$EPTWIN_BIN" --version
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
# cudarc looks for libnccl.so; a machine with only libnccl.so.2 (pip wheel) needs a symlink.
if ! ldconfig -p | grep -q 'libnccl\.so '; then
    n2=$(ldconfig -p | grep -o '/[^ ]*libnccl\.so\.2$' | head -1)
    [[ -z "$n2" ]] && n2=$(timeout 20 find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
    if [[ -n "$n2" ]]; then
        mkdir -p /tmp/ncclib && ln -sf "$n2" /tmp/ncclib/libnccl.so
        export LD_LIBRARY_PATH="/tmp/ncclib:${LD_LIBRARY_PATH:-}"
        echo "libnccl.so -> $n2"
    fi
fi

rc_all=0
# run_step NAME LIMIT_S COMMAND...: at most LIMIT_S, and never past the budget.
run_step() {
    local name=$1 limit=$2
    shift 2
    local left=$((start_s + BUDGET_S - $(date +%s)))
    ((left < limit)) && limit=$left
    echo
    echo "== $name: $*"
    if ((limit < 10)); then
        echo "== skipped: the time budget ($BUDGET_S s) is spent"
        printf '%-62s SKIPPED (budget)\n' "$name" >>"$summary"
        rc_all=1
        return 0
    fi
    local t0 rc
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$@"
    rc=$?
    local ms=$((($(date +%s%N) - t0) / 1000000))
    echo "== exit $rc after $ms ms (limit $limit s): $name"
    printf '%-62s exit %3d  %7d ms\n' "$name" "$rc" "$ms" >>"$summary"
    [[ $rc -ne 0 ]] && rc_all=1
    return 0
}

export EPTWIN_KERNEL_TIMEOUT_MS=3000
run_step "1 hw unit tests (NVRTC compiles every kernel)" 90 \
    "$HW_TESTS/hw-unit" --include-ignored --test-threads=1
run_step "2 NVLink-off low-latency job: every peer message on the wire" 60 \
    "$HW_TESTS/hw-it" --ignored --exact low_latency_without_nvlink_sends_every_peer_message_over_the_wire \
    --nocapture
run_step "3 hw GPU tests + conformance arm + internode over TCP" 120 \
    "$HW_TESTS/hw-it" --ignored --test-threads=1 \
    --skip low_latency_without_nvlink_sends_every_peer_message_over_the_wire
export CUDA_MPS_PIPE_DIRECTORY=/tmp/eptwin-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/eptwin-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
timeout 20 nvidia-cuda-mps-control -d
echo "== exit $? : nvidia-cuda-mps-control -d"
run_step "4 hw multi-process tests under MPS" 60 \
    "$HW_TESTS/hw-processes" --ignored --test-threads=1
echo quit | timeout 20 nvidia-cuda-mps-control
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

# 5. The settings of the reference runs: h200-results.sh's for the one-node scenarios (cluster
# probes with the normal one), results/h200/internode/README.md's for the two-node ones.
new=$OUT/results
EPTWIN_CLUSTER_PROBE=0 run_step "5 eptwin run h200-ep8-ll-128 --backend hw" 60 \
    "$EPTWIN_BIN" run scenarios/h200-ep8-ll-128.toml --backend hw --out "$new"
EPTWIN_CLUSTER_PROBE=1 EPTWIN_CLUSTER_PROBE_ONLY=tma run_step \
    "5 eptwin run h200-ep8-normal-128 --backend hw" 60 \
    "$EPTWIN_BIN" run scenarios/h200-ep8-normal-128.toml --backend hw --out "$new"
for s in h200-2node-ep8-ll h200-2node-ep16-normal; do
    EPTWIN_KERNEL_TIMEOUT_MS=4000 EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 run_step \
        "5 eptwin run $s --backend hw --wire tcp" 60 \
        "$EPTWIN_BIN" run "scenarios/$s.toml" --backend hw --wire tcp --out "$new"
done

# 6. The one-GPU low-latency scenario with NVLink off: 8 wire blocks of one rank, fewer
# iterations (every peer message crosses loopback TCP).
no_p2p=/tmp/h200-ep8-ll-128-no-p2p.toml
sed -e 's/^name = "h200-ep8-ll-128"/name = "h200-ep8-ll-128-no-p2p"/' \
    -e 's/^num_qps_per_rank = 32.*/num_qps_per_rank = 32\nallow_nvlink_for_low_latency_mode = false/' \
    -e 's/^warmup = .*/warmup = 1/' -e 's/^iterations = .*/iterations = 5/' \
    scenarios/h200-ep8-ll-128.toml >"$no_p2p"
grep -q '^allow_nvlink_for_low_latency_mode = false' "$no_p2p" || echo "== the no-p2p scenario lacks its key"
mkdir -p "$OUT/sim"
run_step "6 eptwin run h200-ep8-ll-128-no-p2p --backend sim" 30 \
    "$EPTWIN_BIN" run "$no_p2p" --backend sim --out "$OUT/sim"
EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 run_step "6 eptwin run h200-ep8-ll-128-no-p2p --backend hw --wire tcp" 90 \
    "$EPTWIN_BIN" run "$no_p2p" --backend hw --wire tcp --out "$new"

echo
echo "== the documents against the committed ones and the simulator"
echo "python3 scripts/gpu-hw-redesign-compare.py $new $OUT/sim"
timeout 30 python3 scripts/gpu-hw-redesign-compare.py "$new" "$OUT/sim" >"$OUT/compare.txt" 2>&1
compare_rc=$?
cat "$OUT/compare.txt"
echo "== exit $compare_rc: gpu-hw-redesign-compare.py"
printf '%-62s exit %3d\n' "5-6 results against the committed ones and the simulator" "$compare_rc" >>"$summary"
[[ $compare_rc -ne 0 ]] && rc_all=1

echo
echo "== done after $(($(date +%s) - start_s)) s (any step failed: $rc_all)"
echo "any step failed: $rc_all (after $(($(date +%s) - start_s)) s)" >>"$summary"
exit $rc_all
