#!/usr/bin/env python3
"""Print the h200-single profile lines the one-GPU simulator model needs, from the probe
measurements of one hardware result (`measurements.probe.*`, written by `eptwin run ... --backend
hw` with the probes of hw/src/probes.rs). Every value is a probe value or a fixed arithmetic
combination of probe values (docs/calibration.md, "h200-single"); nothing is fitted.

Usage: profile-from-probes.py RESULT.json [LABEL]
  LABEL names the file in the source comments (default: the path given).
Paste the [gpu.memory] table into engine/profiles/h200-single.toml and replace
kernel_launch_ns and flag_latency_ns in [gpu] with the two lines printed first.
"""
import json
import sys

ROW_BYTES = 7168  # the warp-copy probes' row (hw/src/probes.rs CHUNK_BYTES)


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    doc = json.load(open(path))
    m = doc["measurements"]
    copy = m["probe.warp_copy_bw_gbps"]
    chase = m["probe.dependent_load"]
    ops = m["probe.op_latency"]
    full = ["132x1024", "192x512", "264x512"]

    def best(variant):
        return max(copy[variant][s] for s in full if s in copy[variant])

    src = f"({label})"
    lines = [
        f"kernel_launch_ns = {round(m['probe.empty_kernel_event_us'] * 1000)} "
        f"# probe.empty_kernel_event_us: an empty kernel between two CUDA events {src}",
        f"flag_latency_ns = {round(m['probe.flag_latency_same_gpu_gpu_scope_ns'])} "
        f"# probe.flag_latency_same_gpu_gpu_scope_ns: .gpu release -> acquire, one way {src}",
        "",
        "[gpu.memory]",
        f"l2_bytes = {doc['backend']['l2_bytes']} # backend.l2_bytes (CUDA device attribute) {src}",
        f"l2_bw_gbps = {2 * best('l2_to_l2'):.0f} "
        f"# 2 x probe.warp_copy_bw_gbps.l2_to_l2, best full-GPU shape (loads + stores) {src}",
        f"dram_bw_gbps = {2 * max(best('hbm_to_hbm'), m['probe.copy_kernel_bw_gbps']):.0f} "
        f"# 2 x max(probe.warp_copy_bw_gbps.hbm_to_hbm full GPU, probe.copy_kernel_bw_gbps) {src}",
        f"warp_row_l2_ns = {ROW_BYTES / copy['l2_to_l2']['1x32']:.1f} "
        f"# 7168 B / probe.warp_copy_bw_gbps.l2_to_l2.1x32 {src}",
        f"warp_row_hbm_ns = {ROW_BYTES / copy['hbm_to_hbm']['1x32']:.1f} "
        f"# 7168 B / probe.warp_copy_bw_gbps.hbm_to_hbm.1x32 {src}",
        f"sm_copy_l2_gbps = {copy['l2_to_l2']['1x1024']:.1f} "
        f"# probe.warp_copy_bw_gbps.l2_to_l2.1x1024 {src}",
        f"sm_copy_hbm_gbps = {copy['hbm_to_hbm']['1x1024']:.1f} "
        f"# probe.warp_copy_bw_gbps.hbm_to_hbm.1x1024 {src}",
        f"load_l2_ns = {round(chase['l2_1x32']['ns_per_load_thread0'])} "
        f"# probe.dependent_load.l2_1x32 {src}",
        f"load_hbm_ns = {round(chase['hbm_1x32']['ns_per_load_thread0'])} "
        f"# probe.dependent_load.hbm_1x32 {src}",
        f"load_hbm_busy_ns = {round(chase['hbm_132x1024']['ns_per_load_thread0'])} "
        f"# probe.dependent_load.hbm_132x1024 (every SM loading) {src}",
        f"atomic_ns = {round(ops['atomic_add_ns'])} # probe.op_latency.atomic_add_ns {src}",
        f"release_ns = {max(0, round(ops['warp_copy_7168B_release_ns'] - ops['warp_copy_7168B_ns']))} "
        f"# probe.op_latency: warp_copy_7168B_release_ns - warp_copy_7168B_ns {src}",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
