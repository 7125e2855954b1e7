#!/usr/bin/env bash
# The hardware backend on the GPU machine after its redesign into kernel families: every GPU
# test (the families' end-to-end jobs, the NVLink-off low-latency test, internode over the TCP
# wire), the conformance suite's hardware arm, the multi-process tests under MPS, and a few
# scenarios with --backend hw whose result documents are held against the committed ones
# (results/h200/, results/h100/): the same measurement keys, the same deterministic values.
#
# Here, on the development machine, build and stage what it carries (.devbin/, about 40 MiB):
#   scripts/gpu-hw-redesign.sh --prepare
# There (the device tool's `run`, carry [".devbin"], from the repository root):
#   bash scripts/gpu-hw-redesign.sh
# It writes $OUT/summary.txt (each step's exit and time, the key comparison) and
# $OUT/gpu-hw-redesign.tar.gz (the full log, the result documents, the comparisons).
# Exits 0 when every step passed.
set -uo pipefail

if [[ "${1:-}" == "--prepare" ]]; then
    set -e
    cargo build --release
    cargo test --release -p eptwin-hw --no-run --message-format=json-render-diagnostics \
        >/tmp/eptwin-hw-tests.json
    exe() {
        grep '"kind":\["'"$1"'"\]' /tmp/eptwin-hw-tests.json | grep '"name":"'"$2"'"' |
            sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -1
    }
    rm -rf .devbin && mkdir -p .devbin
    cp target/release/eptwin .devbin/eptwin
    cp "$(exe lib eptwin_hw)" .devbin/hw-unit
    cp "$(exe test it)" .devbin/hw-it
    cp "$(exe test processes)" .devbin/hw-processes
    strip .devbin/*
    ls -la .devbin
    du -sh .devbin
    exit 0
fi

OUT=${OUT:-/tmp/eptwin-out}
WORK=/tmp/gpu-hw-redesign
rm -rf "$WORK" && mkdir -p "$WORK/results" "$OUT"
log="$WORK/log.txt"
summary="$OUT/summary.txt"
: >"$summary"
exec > >(tee -a "$log") 2>&1

# NVLink multicast stays off on shared hosts (KINDS.md); EPTWIN_REQUIRE_HW turns a waived
# GPU test into a failure here; the kernel timeout is the committed results' (3 s).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache
export EPTWIN_KERNEL_TIMEOUT_MS=${EPTWIN_KERNEL_TIMEOUT_MS:-3000}

echo "== provenance"
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git on the GPU machine)"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
# cudarc looks for libnccl.so; a machine with only libnccl.so.2 (pip wheel) needs a symlink.
if ! ldconfig -p | grep -q 'libnccl\.so '; then
    n2=$(ldconfig -p | grep -o '/[^ ]*libnccl\.so\.2$' | head -1)
    [[ -z "$n2" ]] && n2=$(find / -name 'libnccl.so.2' -not -path '*/proc/*' 2>/dev/null | head -1)
    if [[ -n "$n2" ]]; then
        mkdir -p /tmp/ncclib && ln -sf "$n2" /tmp/ncclib/libnccl.so
        export LD_LIBRARY_PATH="/tmp/ncclib:${LD_LIBRARY_PATH:-}"
        echo "libnccl.so -> $n2"
    fi
fi

rc_all=0
run_step() {
    local name=$1 limit=$2
    shift 2
    echo
    echo "== $name: $*"
    local t0 rc
    t0=$(date +%s%N)
    timeout "$limit" "$@"
    rc=$?
    local ms=$((($(date +%s%N) - t0) / 1000000))
    echo "== exit $rc after $ms ms: $name"
    printf '%-58s exit %3d  %7d ms\n' "$name" "$rc" "$ms" >>"$summary"
    [[ $rc -ne 0 ]] && rc_all=1
    return 0
}

run_step "hw unit tests (NVRTC compiles every kernel)" 180 \
    .devbin/hw-unit --include-ignored --test-threads=1
# The NVLink-off test alone first, so its outcome stands out in the summary; then every GPU
# test and the conformance arm.
run_step "NVLink-off low-latency job: every peer message on the wire" 120 \
    .devbin/hw-it --ignored --exact low_latency_without_nvlink_sends_every_peer_message_over_the_wire \
    --nocapture
run_step "hw GPU tests + conformance arm + internode over TCP" 480 \
    .devbin/hw-it --ignored --test-threads=1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/eptwin-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/eptwin-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
run_step "hw multi-process tests under MPS" 240 \
    .devbin/hw-processes --ignored --test-threads=1
echo quit | nvidia-cuda-mps-control
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

# Scenarios whose committed results the documents are held against, and the pure-RDMA
# variant of the one-GPU low-latency scenario (every peer message over the TCP wire).
sed -e 's/^name = "h200-ep8-ll-128"/name = "h200-ep8-ll-128-no-p2p"/' \
    -e 's/^num_qps_per_rank = 32.*/num_qps_per_rank = 32\nallow_nvlink_for_low_latency_mode = false/' \
    scenarios/h200-ep8-ll-128.toml >"$WORK/h200-ep8-ll-128-no-p2p.toml"
for s in scenarios/h200-ep8-normal-128.toml scenarios/h200-ep8-ll-128.toml \
    scenarios/h200-2node-ep8-ll.toml "$WORK/h200-ep8-ll-128-no-p2p.toml"; do
    run_step "eptwin run $(basename "$s" .toml) --backend hw" 240 \
        .devbin/eptwin run "$s" --backend hw --out "$WORK/results"
done

echo
echo "== the result documents against the committed ones"
python3 scripts/gpu-hw-redesign-compare.py "$WORK/results" results/h200 results/h100 \
    >"$WORK/compare.txt" 2>&1
compare_rc=$?
cat "$WORK/compare.txt"
cat "$WORK/compare.txt" >>"$summary"
printf '%-58s exit %3d\n' "measurement keys against the committed results" "$compare_rc" >>"$summary"
[[ $compare_rc -ne 0 ]] && rc_all=1

echo
echo "== done (any step failed: $rc_all)"
echo "any step failed: $rc_all" >>"$summary"
tar -czf "$OUT/gpu-hw-redesign.tar.gz" -C "$WORK" .
exit $rc_all
