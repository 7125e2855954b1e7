#!/usr/bin/env bash
# Runs on the GPU machine (the device tool's `run`), from the repository root, with the
# binaries built here and carried in .devbin/ (scripts/h200-measure.sh --prepare builds them):
#   .devbin/eptwin   release build of the CLI
#   .devbin/hw-unit  eptwin-hw unit tests      .devbin/hw-it  eptwin-hw GPU tests + conformance arm
#   .devbin/hw-processes  eptwin-hw multi-process tests (ignored without a GPU; run under MPS)
# Writes the full log and the result files under $OUT (the files that come back):
#   $OUT/log.txt, $OUT/results/<scenario>.json, $OUT/diag/<scenario>.json
# Usage there: bash scripts/h200-measure.sh [smoke|full]   (default full)
set -uo pipefail

if [[ "${1:-}" == "--prepare" ]]; then
    # Here, on the development machine: build and stage the binaries to carry.
    set -e
    cargo build --release
    cargo test --release -p eptwin-hw --no-run 2>&1 | tee /tmp/eptwin-test-build.log
    mkdir -p .devbin
    cp target/release/eptwin .devbin/eptwin
    cp "$(grep -o 'target/release/deps/eptwin_hw-[0-9a-f]*' /tmp/eptwin-test-build.log | head -1)" .devbin/hw-unit
    cp "$(grep -o 'target/release/deps/it-[0-9a-f]*' /tmp/eptwin-test-build.log | head -1)" .devbin/hw-it
    cp "$(grep -o 'target/release/deps/processes-[0-9a-f]*' /tmp/eptwin-test-build.log | head -1)" .devbin/hw-processes
    strip .devbin/*
    ls -la .devbin
    exit 0
fi

mode=${1:-full}
OUT=${OUT:-/tmp/eptwin-out}
mkdir -p "$OUT/results" "$OUT/diag"
log="$OUT/log.txt"
exec > >(tee -a "$log") 2>&1

# NVLink multicast stays off on shared hosts (KINDS.md); EPTWIN_REQUIRE_HW turns a waived
# GPU test into a failure here.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export EPTWIN_REQUIRE_HW=1 EPTWIN_KERNEL_CACHE=/tmp/eptwin-kernel-cache
export EPTWIN_KERNEL_TIMEOUT_MS=${EPTWIN_KERNEL_TIMEOUT_MS:-3000}

echo "== provenance"
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='commit %H %s' 2>/dev/null || echo "commit: (no git on the GPU machine)"
uname -r
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
nvidia-smi topo -m 2>/dev/null | head -20
ldconfig -p | grep -E 'libnccl\.so|libnvrtc\.so|libcuda\.so|libnvidia-ml' | head

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

step() { echo; echo "== $*"; }
rc_all=0
run_step() {
    local limit=$1; shift
    local t0
    t0=$(date +%s%N)
    timeout "$limit" "$@"
    local rc=$?
    echo "== exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"
    [[ $rc -ne 0 ]] && rc_all=1
    return 0
}

step "eptwin-hw unit tests (NVRTC compiles every kernel for this GPU)"
run_step 120 .devbin/hw-unit --include-ignored --test-threads=1
step "eptwin-hw GPU tests and the conformance suite's hardware arm, internode over the TCP wire (ignored without a GPU)"
run_step 480 .devbin/hw-it --ignored --test-threads=1 --nocapture
step "eptwin-hw multi-process tests (processes sharing the GPU through MPS, digests against one process)"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/eptwin-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/eptwin-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
run_step 240 .devbin/hw-processes --ignored --test-threads=1 --nocapture
echo quit | nvidia-cuda-mps-control
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
step "eptwin topo (NVML)"
run_step 60 .devbin/eptwin topo

# The two-node scenarios run both "nodes" on the one GPU over the TCP wire (EPTWIN_WIRE
# defaults to auto, which is TCP without an ACTIVE RDMA port): their results say `wire: tcp`.
scenarios=(scenarios/h200-ep8-normal-128.toml scenarios/h200-ep8-ll-128.toml
    scenarios/h200-2node-ep16-normal.toml scenarios/h200-2node-ep8-ll.toml)
[[ "$mode" == full ]] && scenarios+=(scenarios/h200-ep8-normal-4096.toml scenarios/h200-ep8-ll-4096.toml)
for s in "${scenarios[@]}"; do
    step "eptwin run $s --backend hw"
    run_step 240 .devbin/eptwin run "$s" --backend hw --out "$OUT/results"
done

if [[ "$mode" == full ]]; then
    # Variants of the same scenario, to see what the L2 discard and the L2 eviction hints buy.
    mkdir -p "$OUT/diag/keep" "$OUT/diag/nohint"
    step "diagnostic: normal 4096 with consumed dispatch ring lines kept in L2 (EPTWIN_L2_DISCARD_DISPATCH=0)"
    EPTWIN_L2_DISCARD_DISPATCH=0 run_step 240 .devbin/eptwin run scenarios/h200-ep8-normal-4096.toml --backend hw --out "$OUT/diag/keep"
    step "diagnostic: normal 4096 without L2 eviction hints (EPTWIN_L2_HINTS=0)"
    EPTWIN_L2_HINTS=0 run_step 240 .devbin/eptwin run scenarios/h200-ep8-normal-4096.toml --backend hw --out "$OUT/diag/nohint"
fi

if [[ "${SWEEP:-0}" == 1 ]]; then
    # Ring sizes and reducer groups of the normal kernels at 4096 tokens (variants of the
    # scenario in /tmp; only the summary lines are kept).
    sweep_set=("6 12 4 8 5" "6 24 4 8 5" "6 12 2 4 5" "6 256 4 256 5")
    for v in "${sweep_set[@]}"; do
        read -r ds dr cs cr gw <<< "$v"
        f=/tmp/sweep-$ds-$dr-$cs-$cr-$gw.toml
        sed -e '/^\[job.buffer.dispatch_config\]/,/^\[job.workload\]/{/^\[job.workload\]/!d}' \
            scenarios/h200-ep8-normal-4096.toml > "$f"
        sed -i "s/^\[job.workload\]/[job.buffer.dispatch_config]\nnum_max_nvl_chunked_send_tokens = $ds\nnum_max_nvl_chunked_recv_tokens = $dr\n[job.buffer.combine_config]\nnum_max_nvl_chunked_send_tokens = $cs\nnum_max_nvl_chunked_recv_tokens = $cr\n[job.workload]/" "$f"
        step "sweep: dispatch $ds/$dr, combine $cs/$cr, $gw warps per combined token"
        EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 EPTWIN_COMBINE_GROUP_WARPS=$gw \
            run_step 120 .devbin/eptwin run "$f" --backend hw --out /tmp/sweep-out | grep -E '^  ep8|verdict|FAILED|rror'
    done
fi

if [[ "${PROFILE:-0}" == 1 ]]; then
    # Hardware counters of one dispatch and one combine at 4096 tokens (Nsight Compute; clocks
    # left alone). The copy probes and NCCL are skipped to keep the profiled run short.
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    sed -e 's/^warmup = .*/warmup = 0/' -e 's/^iterations = .*/iterations = 1/' \
        scenarios/h200-ep8-normal-4096.toml > /tmp/profile-normal-4096.toml
    : > "$OUT/ncu.txt"
    for variant in ${PROFILE_VARIANTS:-""}; do
        step "ncu on intranode_dispatch and intranode_combine, 4096 tokens ${variant:-(default)}"
        echo "==== variant: ${variant:-default}" >> "$OUT/ncu.txt"
        env $variant EPTWIN_PROBES=0 EPTWIN_NCCL_BASELINE=0 timeout 300 "$ncu_bin" --clock-control none \
            -k 'regex:intranode_(dispatch|combine)$' --section SpeedOfLight \
            --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sectors_srcunit_tex_op_write.sum \
            .devbin/eptwin run /tmp/profile-normal-4096.toml --backend hw --out /tmp/profile-out >> "$OUT/ncu.txt" 2>&1
        echo "== exit $?"
    done
    grep -E '==== variant|intranode_(dispatch|combine) \(|Duration|DRAM Throughput|L2 Cache Throughput|dram__bytes|lts__t_sector' "$OUT/ncu.txt"
fi
echo
echo "== done (any step failed: $rc_all)"
exit $rc_all
