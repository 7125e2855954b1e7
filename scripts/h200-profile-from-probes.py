#!/usr/bin/env python3
"""Print the h200-single profile lines the one-GPU simulator model needs, from the probe
measurements of hardware results (`measurements.probe.*`, written by `eptwin run ... --backend
hw` with the probes of hw/src/probes/). Every value is a probe
value or a fixed arithmetic combination of probe values (docs/calibration.md, "h200-single");
nothing is fitted to the dispatch/combine latencies. It reads files only: run it anywhere.

The committed profile (engine/profiles/h200-single.toml) comes from these runs:

  # [gpu] launch/flag and [gpu.memory]: the 13:32 UTC run of 2026-12-02 (in git at d53c212),
  # the ring handoff and the low-latency send chain from their logs
  # the flush's dirty bytes from the flushed passes of results/h200/flush-cost/
  git show d53c212:results/h200/h200-ep8-normal-4096.json > /tmp/h200-1332-normal-4096.json
  mkdir -p /tmp/flush-cost && tar xzf results/h200/flush-cost/passes.tar.gz -C /tmp/flush-cost
  python3 scripts/h200-profile-from-probes.py /tmp/h200-1332-normal-4096.json \
      results/h200/h200-ep8-normal-4096.json \
      --handoff results/h200/probe-run/handoff-log.txt \
      --ll-send results/h200/probe-run/ll-send-chain-and-cluster-waves-log.txt \
      --flush /tmp/flush-cost/flushed-a/log.txt --flush /tmp/flush-cost/flushed-b/log.txt

  # the cluster_* keys: the committed normal results (scripts/h200-results.sh) and the load runs
  # (scripts/h200-cluster-load.sh)
  python3 scripts/h200-profile-from-probes.py results/h200/h200-ep8-normal-4096.json \
      --cluster results/h200/h200-ep8-normal-128.json \
      --cluster results/h200/h200-ep8-normal-4096.json \
      --cluster results/h200/probe-run/load/run1-h200-ep8-normal-128.json \
      --cluster results/h200/probe-run/load/run2-h200-ep8-normal-128.json \
      --flush /tmp/flush-cost/flushed-a/log.txt --flush /tmp/flush-cost/flushed-b/log.txt \
      --frame results/h200/probe-run/cluster-launch/h200-ep8-normal-128.json \
      --frame results/h200/probe-run/cluster-launch/h200-ep8-normal-4096.json \
      --frame results/h200/probe-run/cluster-launch/passes-2-4-log.txt \
      --frame results/h200/repeat/h200-ep8-normal-128.json \
      --frame results/h200/repeat/h200-ep8-normal-4096.json

Usage: h200-profile-from-probes.py RESULT.json [LABEL] [--handoff FILE]... [--ll-send FILE]...
       [--cluster FILE]... [--flush FILE]... [--frame FILE]...
  LABEL names the file in the source comments (default: the path given).
  --handoff FILE: take probe.ring_handoff_bw_gbps from FILE (a result JSON, or a log with
  "# measured probe.ring_handoff_bw_gbps: {...}" lines; every occurrence is averaged) instead
  of RESULT. Without it and without the probe in RESULT, the ring and discard keys are left out.
  --ll-send FILE: the same for probe.ll_send_chain (the low-latency dispatch's send loop with
  every SM sending, shape "<sm_count>x1024"); its four steps per item become the
  ll_send_{cast,slot,copy,release}_ns keys, and the receive's count polls after a send of
  1,024 items ll_recv_poll_ns, averaged over the occurrences.
  --cluster FILE: probe.cluster_handoff_checks (and probe.cluster_handoff_max_active_clusters)
  from FILE (a result JSON of a run with EPTWIN_CLUSTER_PROBE=1, or a log with "# measured"
  lines; shapes measured more than once are averaged) for the cluster_* keys of the
  simulator's model of the cluster kernels (sim/src/hwkernels/cluster.rs); without it, from
  RESULT if it has them. Every cluster probe shape is printed with the model's time for it.
  Where the files also have probe.cluster_launch_us, cluster_frame_ns too: the combine kernel's
  frame (mbarrier init, the cluster barriers at start and exit) less its empty launch.
  --frame FILE: take cluster_frame_ns from FILE (a result JSON or a log with
  probe.cluster_launch_us; every occurrence counts) instead of the --cluster files: runs of the
  launch probe alone, whose few handoff shapes should not enter the other cluster keys.
  --flush FILE: probe.flush_writeback from FILE (a result JSON or a log; every occurrence
  counts) for flush_dirty_bytes, the dirty lines the timing's 256 MB memset leaves for an op:
  median over the reads of 16-128 MiB of after_flush_us - after_clean_us, at dram_bw_gbps.
  Without it every line of L2 counts as dirty (l2_bytes), for the L2 rates and the cluster
  shapes alike.
Paste the [gpu.memory] table into engine/profiles/h200-single.toml and replace
kernel_launch_ns and flag_latency_ns in [gpu] with the two lines printed first.

The L2 is one server whose work per step is its SM-side bytes at l2_bw_gbps plus its HBM bytes
at l2_hbm_bw_gbps. The hbm_to_l2 and hbm_to_hbm warp-copy probes at 132x1024 each copy
X = 4,224 warps x 32 rows x 7,168 B after the 256 MB memset that leaves F = l2_bytes of dirty
lines in L2, in T = X / rate - launch (probe.empty_kernel_event_us):
    2X / l2_bw + (X + F) / l2_hbm = T(hbm_to_l2)     (HBM: X read, F written back)
    2X / l2_bw +    2X   / l2_hbm = T(hbm_to_hbm)    (HBM: X read, X written back)
The ring handoff probe (192x512) hands X' = 1,536 warp pairs x 64 rows x 7,168 B from producer
warps to consumer warps on other SMs through L2-resident slots: source load and output store at
l2_bw, slot store and slot load at l2_ring, 2X' HBM bytes at l2_hbm:
    2X' / l2_bw + 2X' / l2_ring + 2X' / l2_hbm = T(192x512)
and the consumer's discards of the X' bytes cost T(192x512_discard) - T(192x512):
    l2_discard = X' / (T(192x512_discard) - T(192x512))

The cluster handoff probe (kernels/cuda/cluster.cu probe_cluster_tma_handoff), shape key
tma_{blocks}x{threads}_{clusters}cl_{slots}x{chunk}B: clusters of 8 blocks, threads/64 producer
warps per block each filling its ring in a peer block (one TMA bulk copy per chunk), as many
consumer warps bulk-storing the slots out; it hands X bytes over in T = kernel_us - launch, each
producer warp cpw = X / (producer warps x chunk) chunks, so a pair takes p = T / cpw per chunk.
  * One cluster alone: with 4 x 7,168 B and 2 x 14,368 B slots the consumer's stores bind
    (pair_period = max(store, (fill + b / bulk + store) / slots), store = cluster_store_ns +
    b / bulk), so cluster_store_ns and cluster_bulk_copy_gbps solve from the two chunk sizes.
  * One slot without stores (key suffix _nostore): a pair's period is its refill alone,
    fill + 7,168 B / bulk: cluster_fill_ns with one cluster, cluster_fill_wave_ns with a whole
    wave (the load shapes, hw/src/probes/cluster.rs load_shapes).
  * One cluster without stores, 4 x 7,168 B and 2 x 14,368 B: each block takes in a chunk per
    producer warp per period, cluster_ingest_chunk_ns + b / cluster_sm_ingest_gbps.
  * Whole waves with at least two slots, with and without stores: cluster_transfer_l2_ns, the
    L2's time per bulk transfer (a fill; a slot stored out) that brings the model's L2 server
    (its L2 work plus that per transfer; the HBM server as it is) closest to all of them, least
    squares; cluster_handoff_bw_gbps the fastest wave without stores (a lower bound).
The reducer probe (kernels/cuda/intranode_cluster.cu probe_cluster_reduce,
probe.cluster_reduce_ns_per_token, shape {blocks}blk.k{sources}): a combine block's reduction of
one token from k partials in shared memory. cluster_reduce_ns + k x cluster_reduce_source_ns,
least squares over k on the block-per-SM shapes.
"""
import json
import math
import re
import sys

ROW_BYTES = 7168  # the warp-copy probes' row (hw/src/probes/memory.rs CHUNK_BYTES)
# Bytes each probe copies (hw/src/probes/memory.rs): 132 x 1024 threads = 4,224 warps x 32 rows; the
# ring handoff at 192 x 512: 96 producer blocks x 16 warps = 1,536 pairs x 64 rows.
COPY_BYTES_132X1024 = 4224 * 32 * ROW_BYTES
HANDOFF_BYTES_192X512 = 1536 * 64 * ROW_BYTES


def probe_values(path, key):
    """Every probe.<key> in a result JSON or a log ("# measured probe.<key>: {...}" lines)."""
    text = open(path).read()
    if path.endswith(".json"):
        return [json.loads(text)["measurements"][f"probe.{key}"]]
    pat = r"# measured probe\." + re.escape(key) + r": (\{.*\})"
    return [json.loads(x) for x in re.findall(pat, text)]


def handoffs(path):
    """Every probe.ring_handoff_bw_gbps in a result JSON or a log."""
    return probe_values(path, "ring_handoff_bw_gbps")


CLUSTER_BLOCKS = 8  # blocks per cluster of the probe (hw/src/probes/cluster.rs CLUSTER_SIZE)
CLUSTER_KEY = re.compile(r"^tma_(\d+)x(\d+)_(\d+)cl_(\d+)x(\d+)B(_nostore)?$")
# The kernels' slots (hw/src/normal/rings.rs): dispatch 3 x 7,472 B, combine 2 x 14,368 B.
KERNEL_SLOTS = [(3, 7472), (2, 14368)]
# sm_90: the dynamic shared memory a block may opt in to (hw/src/normal/rings.rs).
SMEM_BYTES = 232448


def cluster_runs(path):
    """(checks, max_active_clusters, launch_us or None) of every cluster probe run in a file."""
    text = open(path).read()
    if path.endswith(".json"):
        m = json.loads(text)["measurements"]
        if "probe.cluster_handoff_checks" not in m:
            return []
        return [(m["probe.cluster_handoff_checks"], m.get("probe.cluster_handoff_max_active_clusters"),
                 m.get("probe.empty_kernel_event_us"))]
    checks = probe_values(path, "cluster_handoff_checks")
    active = [json.loads(x) for x in
              re.findall(r"# measured probe\.cluster_handoff_max_active_clusters: (\d+)", text)]
    return [(c, active[0] if active else None, None) for c in checks]


def cluster_shapes(runs, launch_us):
    """Per parsed shape key: blocks, threads, clusters, slots, chunk bytes, bytes, mean kernel_us
    over the runs, and p = T / chunks per producer warp (us)."""
    acc = {}
    for checks, _, launch in runs:
        for key, c in checks.items():
            m = CLUSTER_KEY.match(key)
            # Shapes without stores are not checked word for word (wrong_words null).
            if not m or c.get("wrong_words") not in (0, None):
                continue
            acc.setdefault(key, (m, c["bytes"], [], []))[2].append(c["kernel_us"])
            acc[key][3].append(launch if launch is not None else launch_us)
    shapes = {}
    for key, (m, x, us, launches) in sorted(acc.items()):
        blocks, threads, clusters, slots, chunk = (int(g) for g in m.groups()[:5])
        warps = blocks * (threads // 64)
        cpw = x / (warps * chunk)
        t = sum(us) / len(us) - sum(launches) / len(launches)
        shapes[key] = dict(blocks=blocks, threads=threads, clusters=clusters, slots=slots,
                           chunk=chunk, bytes=x, kernel_us=sum(us) / len(us), runs=len(us),
                           cpw=cpw, t_us=t, pair_us=t / cpw, store=m.group(6) is None)
    return shapes


def pair_period_ns(k, slots, b):
    """The simulator's pair_period (sim/src/hwkernels/cluster.rs), ns per chunk: a slot
    cycles through a refill (fill_ns and its bytes) and a store; the consumer's stores follow
    one another."""
    store = k["store_ns"] + b / k["bulk_gbps"]
    return max(store, (k["fill_ns"] + b / k["bulk_gbps"] + store) / max(1, slots))


def reduce_runs(path):
    """Every probe.cluster_reduce_ns_per_token in a result JSON or a log."""
    text = open(path).read()
    if path.endswith(".json"):
        m = json.loads(text)["measurements"]
        v = m.get("probe.cluster_reduce_ns_per_token")
        return [v] if v else []
    return probe_values(path, "cluster_reduce_ns_per_token")


def reduce_fit(runs):
    """(cluster_reduce_ns, cluster_reduce_source_ns, [(k, mean ns)]) from the shapes with a block
    per SM ({blocks}blk.k{k}, the most blocks measured), or None."""
    acc = {}
    for r in runs:
        most = max((int(key.split("blk")[0]) for key in r), default=0)
        for key, ns in r.items():
            blocks, k = key.split("blk.k")
            if int(blocks) == most and most > 1:
                acc.setdefault(int(k), []).append(ns)
    if len(acc) < 2:
        return None
    pts = sorted((k, sum(v) / len(v)) for k, v in acc.items())
    mk = sum(k for k, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    per = sum((k - mk) * (v - mv) for k, v in pts) / sum((k - mk) ** 2 for k, _ in pts)
    return mv - per * mk, per, pts


def frame_ns(files):
    """The cluster kernels' frame beyond their launch, ns: probe.cluster_launch_us's
    combine_cluster_frame_* less combine_cluster_* (the same grid and shared memory, empty),
    mean over every occurrence in FILES; (ns, occurrences) or None."""
    deltas = []
    for f in files:
        try:
            runs = probe_values(f, "cluster_launch_us")
        except KeyError:
            continue
        for r in runs:
            frame = [v for k, v in r.items() if k.startswith("combine_cluster_frame_")]
            empty = [v for k, v in r.items()
                     if k.startswith("combine_cluster_") and not k.startswith("combine_cluster_frame_")]
            if frame and empty:
                deltas.append((frame[0] - empty[0]) * 1e3)
    if not deltas:
        return None
    return sum(deltas) / len(deltas), len(deltas)


def cluster_lines(runs, src, m, mem, runs_reduce=()):
    """The cluster_* lines and a table of every shape, model against measurement.

    One cluster alone (64 pairs): with 4 x 7,168 B and 2 x 14,368 B slots the consumer's
    stores bind, so store_ns + b / bulk solves from the two chunk sizes. With one slot and no
    stores a pair's period is its refill chain alone: fill_ns + 7,168 B / bulk, with one
    cluster (cluster_fill_ns) and with a whole wave (cluster_fill_wave_ns) on the GPU. Without
    stores, 4 x 7,168 B and 2 x 14,368 B: each block takes in a chunk per producer warp per
    period, ingest_chunk_ns + b / sm_ingest (two equations). Whole waves with at least two
    slots: the L2's time per transfer (least squares) and the handoff's lower bound."""
    launch_us = m["probe.empty_kernel_event_us"]
    shapes = cluster_shapes(runs, launch_us)
    active = next((a for _, a, _ in runs if a), None) or 15
    wave = f"tma_{8 * active}x512_{active}cl"
    need = ["tma_8x512_1cl_4x7168B", "tma_8x512_1cl_2x14368B",
            "tma_8x512_1cl_1x7168B_nostore", f"{wave}_1x7168B_nostore",
            "tma_8x512_1cl_4x7168B_nostore", "tma_8x512_1cl_2x14368B_nostore"]
    missing = [k for k in need if k not in shapes]
    if missing:
        return [], [f"{src} lacks {', '.join(missing)}: no cluster keys"]
    p4, p2, f1, fw = (shapes[k]["pair_us"] * 1e3 for k in need[:4])
    bulk = (14368 - 7168) / (p2 - p4)  # bytes per ns = GB/s
    store = p4 - 7168 / bulk
    fill = f1 - 7168 / bulk
    fill_wave = fw - 7168 / bulk
    # Per block and chunk taken in: the pair period over the producer warps of the cluster
    # (threads / 64 per block, one ring each in every block).
    i4, i2 = (shapes[k]["pair_us"] * 1e3 / (shapes[k]["threads"] // 64) for k in need[4:])
    ingest = (14368 - 7168) / (i2 - i4)
    ingest_chunk = i4 - 7168 / ingest
    # Whole waves (every cluster resident from the start, no straggling wave) with at least two
    # slots (with one the chain binds): the L2's time per bulk transfer besides the bytes, the
    # one value that brings the model's L2 server (plus that time per transfer; the HBM server
    # as it is) closest to all of them, least squares. A transfer is a chunk's fill, and its
    # store out of the slot where the consumers store.
    waves = {key: s for key, s in shapes.items() if s["clusters"] % active == 0 and s["slots"] > 1}

    def l2_hbm_us(s):
        moved = 2 * s["bytes"] if s["store"] else s["bytes"]
        l2_us = moved / mem["l2_bw_gbps"] / 1e3 + (moved + mem["flush_dirty"]) / mem["l2_hbm_bw_gbps"] / 1e3
        return l2_us, (moved + mem["flush_dirty"]) / mem["dram_bw_gbps"] / 1e3

    def transfers(s):
        return s["bytes"] / s["chunk"] * (2 if s["store"] else 1)

    def wave_err(c_ns):
        return sum((max(l2 + transfers(s) * c_ns / 1e3, hbm) - s["t_us"]) ** 2
                   for s in waves.values() for l2, hbm in [l2_hbm_us(s)])

    transfer_ns = min((i / 1000 for i in range(0, 3001)), key=wave_err)
    # The rate of the handoff alone is not separable from these: every whole wave without
    # stores is bound by the L2 in the model. Its lower bound: the fastest of them.
    nostore = [s for s in waves.values() if not s["store"]]
    handoff = max(s["bytes"] / (s["t_us"] * 1e3) for s in nostore)
    k = dict(fill_ns=fill, bulk_gbps=bulk, store_ns=store)
    lines = [
        f"cluster_fill_ns = {fill:.0f} # {need[2]}: {f1 / 1e3:.3f} us per chunk - 7,168 B / {bulk:.2f} GB/s {src}",
        f"cluster_fill_wave_ns = {fill_wave:.0f} # {need[3]}: {fw / 1e3:.3f} us per chunk - 7,168 B / {bulk:.2f} GB/s {src}",
        f"cluster_bulk_copy_gbps = {bulk:.2f} # (14,368 - 7,168) B / ({p2 / 1e3:.3f} - {p4 / 1e3:.3f}) us {src}",
        f"cluster_store_ns = {store:.0f} # {p4 / 1e3:.3f} us - 7,168 B / {bulk:.2f} GB/s {src}",
        f"cluster_handoff_bw_gbps = {handoff:.0f} # the fastest whole wave without stores, bytes / time "
        f"(a lower bound) {src}",
        f"cluster_transfer_l2_ns = {transfer_ns:.3f} # least squares over the {len(waves)} whole-wave shapes "
        f"(L2 work + transfers x this against the kernel time) {src}",
        f"cluster_sm_ingest_gbps = {ingest:.0f} # (14,368 - 7,168) B / ({i2:.1f} - {i4:.1f}) ns per chunk into a "
        f"block, {need[5]} and {need[4]} {src}",
        f"cluster_ingest_chunk_ns = {ingest_chunk:.1f} # {i4:.1f} ns - 7,168 B / {ingest:.0f} GB/s {src}",
        f"cluster_max_active_clusters = {active} # probe.cluster_handoff_max_active_clusters {src}",
        f"cluster_smem_bytes = {SMEM_BYTES} # sm_90 opt-in dynamic shared memory per block",
    ]
    reduce = reduce_fit(runs_reduce)
    if reduce is None:
        return [], [f"{src} lacks probe.cluster_reduce_ns_per_token: no cluster keys"]
    base, per, pts = reduce
    lines.append(f"cluster_reduce_ns = {base:.0f} # probe.cluster_reduce_ns_per_token "
                 f"{', '.join(f'k{k} {v:.0f}' for k, v in pts)} ns, least squares over k {src}")
    lines.append(f"cluster_reduce_source_ns = {per:.1f} # the same fit, per source {src}")
    # Every shape: the model's time (waves of `active` clusters; each wave the slower of its
    # pairs' chain and the GPU's handoff; the L2 and HBM servers as a check).
    notes = [f"{'shape':<32} {'runs':>4} {'meas us':>9} {'model us':>9} {'err':>7}  "
             f"{'pair ns':>8} {'chain ns':>8}  binds"]
    for key, s in shapes.items():
        pairs_per_cluster = CLUSTER_BLOCKS * (s["threads"] // 64)
        # The refill at this occupancy (sim fill_at: in proportion to the SMs taken).
        k_res = min(s["clusters"], active)
        f_at = fill + (fill_wave - fill) * (k_res - 1) / max(1, active - 1)
        ks = dict(k, fill_ns=f_at)
        # Without stores a slot cycles through its refill only; every chunk crosses its
        # consumer's SM intake, a chunk per producer warp of the cluster per period.
        intake = s["threads"] // 64 * (ingest_chunk + s["chunk"] / ingest)
        if s["store"]:
            chain = max(pair_period_ns(ks, s["slots"], s["chunk"]), intake)
        else:
            chain = max((f_at + s["chunk"] / bulk) / s["slots"], intake)
        t, left, binds = 0.0, s["clusters"], set()
        while left > 0:
            k_cl = min(left, active)
            chunks = k_cl * pairs_per_cluster * s["cpw"]
            by_rate = chunks * s["chunk"] / handoff / 1e3
            by_chain = s["cpw"] * chain / 1e3
            t += max(by_rate, by_chain)
            binds.add("handoff" if by_rate >= by_chain else "chain")
            left -= k_cl
        # Read once; written once more when the consumers store (the flushed L2's dirty lines
        # are written back either way); the L2 also spends transfer_ns per bulk transfer.
        l2_us, hbm_us = l2_hbm_us(s)
        l2_us += transfers(s) * transfer_ns / 1e3
        if max(hbm_us, l2_us) > t:
            binds.add("L2/HBM servers")
            t = max(hbm_us, l2_us)
        model = t + launch_us
        notes.append(f"{key:<32} {s['runs']:>4} {s['kernel_us']:>9.1f} {model:>9.1f} "
                     f"{100 * (model / s['kernel_us'] - 1):>+6.1f}%  {s['pair_us'] * 1e3:>8.0f} "
                     f"{chain:>8.0f}  {'+'.join(sorted(binds))}")
    return lines, notes


def flush_dirty_bytes(files, dram_gbps):
    """The flush memset's dirty lines as an op meets them: probe.flush_writeback's reads of
    16-128 MiB (more new lines than the flush leaves dirty; a read writes nothing back of its
    own) take after_flush - after_clean longer after the flush than with L2 full of clean
    lines; at the HBM rate that is this many bytes written back. Median over the shapes and
    every occurrence in FILES. Returns (bytes, the deltas in us)."""
    deltas = []
    for f in files:
        for probe in probe_values(f, "flush_writeback"):
            for mib in (16, 32, 64, 128):
                s = probe[f"read_{mib}MiB"]
                deltas.append(s["after_flush_us"] - s["after_clean_us"])
    deltas.sort()
    mid = len(deltas) // 2
    median = deltas[mid] if len(deltas) % 2 else (deltas[mid - 1] + deltas[mid]) / 2
    return median * dram_gbps * 1e3, deltas


def l2_rates(m, l2_bytes):
    """(l2_bw_gbps, l2_hbm_bw_gbps) solved as in the module docstring."""
    copy = m["probe.warp_copy_bw_gbps"]
    launch_us = m["probe.empty_kernel_event_us"]
    x = COPY_BYTES_132X1024
    t1 = x / copy["hbm_to_l2"]["132x1024"] / 1e3 - launch_us
    t2 = x / copy["hbm_to_hbm"]["132x1024"] / 1e3 - launch_us
    l2_hbm = (x - l2_bytes) / (t2 - t1) / 1e3
    l2 = 2 * x / (t1 - (x + l2_bytes) / l2_hbm / 1e3) / 1e3
    return l2, l2_hbm


def main():
    args = sys.argv[1:]
    opts = ("--handoff", "--ll-send", "--cluster", "--flush", "--frame")
    flush_files = [args[i + 1] for i, a in enumerate(args) if a == "--flush"]
    handoff_files = [args[i + 1] for i, a in enumerate(args) if a == "--handoff"]
    ll_send_files = [args[i + 1] for i, a in enumerate(args) if a == "--ll-send"]
    cluster_files = [args[i + 1] for i, a in enumerate(args) if a == "--cluster"]
    frame_files = [args[i + 1] for i, a in enumerate(args) if a == "--frame"]
    pos = [a for i, a in enumerate(args) if a not in opts and (i == 0 or args[i - 1] not in opts)]
    path = pos[0]
    label = pos[1] if len(pos) > 1 else path
    doc = json.load(open(path))
    m = doc["measurements"]
    copy = m["probe.warp_copy_bw_gbps"]
    chase = m["probe.dependent_load"]
    ops = m["probe.op_latency"]
    full = ["132x1024", "192x512", "264x512"]

    def best(variant):
        return max(copy[variant][s] for s in full if s in copy[variant])

    src = f"({label})"
    dram = 2 * max(best("hbm_to_hbm"), m["probe.copy_kernel_bw_gbps"])
    # The dirty lines the timing's flush leaves: measured with --flush, else all of L2.
    dirty = doc["backend"]["l2_bytes"]
    if flush_files:
        dirty, deltas = flush_dirty_bytes(flush_files, dram)
    l2, l2_hbm = l2_rates(m, dirty)
    lines = [
        f"kernel_launch_ns = {round(m['probe.empty_kernel_event_us'] * 1000)} "
        f"# probe.empty_kernel_event_us: an empty kernel between two CUDA events {src}",
        f"flag_latency_ns = {round(m['probe.flag_latency_same_gpu_gpu_scope_ns'])} "
        f"# probe.flag_latency_same_gpu_gpu_scope_ns: .gpu release -> acquire, one way {src}",
        "",
        "[gpu.memory]",
        f"l2_bytes = {doc['backend']['l2_bytes']} # backend.l2_bytes (CUDA device attribute) {src}",
        f"l2_bw_gbps = {l2:.0f} # solved from probe.warp_copy_bw_gbps.hbm_to_l2/hbm_to_hbm.132x1024 "
        f"with l2_hbm_bw_gbps {src}",
        f"dram_bw_gbps = {dram:.0f} "
        f"# 2 x max(probe.warp_copy_bw_gbps.hbm_to_hbm full GPU, probe.copy_kernel_bw_gbps) {src}",
        f"l2_hbm_bw_gbps = {l2_hbm:.0f} # solved with l2_bw_gbps {src}",
    ]
    if flush_files:
        lines.append(
            f"flush_dirty_bytes = {dirty:.0f} # probe.flush_writeback read_16..128MiB after_flush - "
            f"after_clean, median of {len(deltas)} ({deltas[0]:.2f}-{deltas[-1]:.2f} us) x "
            f"dram_bw_gbps ({', '.join(flush_files)})")
    lines += [
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
    runs = [h for f in handoff_files for h in handoffs(f)]
    if not handoff_files and "probe.ring_handoff_bw_gbps" in m:
        runs = [m["probe.ring_handoff_bw_gbps"]]
    if runs:
        hsrc = f"({', '.join(handoff_files) or label})"
        x = HANDOFF_BYTES_192X512
        plain = sum(r["192x512"] for r in runs) / len(runs)
        discard = sum(r["192x512_discard"] for r in runs) / len(runs)
        # The profile's launch (this result's), as for the L2 rates.
        t = x / plain / 1e3 - m["probe.empty_kernel_event_us"]
        ring = 2 * x / (t - 2 * x / l2 / 1e3 - 2 * x / l2_hbm / 1e3) / 1e3
        dt = x / discard / 1e3 - x / plain / 1e3
        lines += [
            f"l2_ring_bw_gbps = {ring:.0f} # solved from probe.ring_handoff_bw_gbps.192x512 "
            f"(mean of {len(runs)}: {plain:.1f}) {hsrc}",
            f"l2_discard_bw_gbps = {x / dt / 1e3:.0f} # X / (T(192x512_discard) - T(192x512)) "
            f"(means of {len(runs)}: {discard:.1f}, {plain:.1f}) {hsrc}",
        ]
    chains = [c for f in ll_send_files for c in probe_values(f, "ll_send_chain")]
    if not ll_send_files and "probe.ll_send_chain" in m:
        chains = [m["probe.ll_send_chain"]]
    if chains:
        shape = f"{doc['backend']['sm_count']}x1024"
        csrc = f"({', '.join(ll_send_files) or label})"
        for key, step in [
            ("ll_send_cast_ns", "cast_barrier_ns"),
            ("ll_send_slot_ns", "index_atomic_ns"),
            ("ll_send_copy_ns", "copy_ns"),
            ("ll_send_release_ns", "release_loop_ns"),
        ]:
            vals = [c[shape][step] for c in chains]
            lines.append(
                f"{key} = {sum(vals) / len(vals):.0f} # probe.ll_send_chain.{shape}.{step} "
                f"(mean of {len(vals)}: {', '.join(f'{v:.0f}' for v in vals)}) {csrc}"
            )
        # The receive group's count polls after a send of the LL 128 item count: sources
        # 0..src of 8 are polled in turn, 4.5 per item on average.
        recv = f"{shape}_1024items_then_recv"
        if all(recv in c for c in chains):
            vals = [c[recv]["poll_ns_per_item"] for c in chains]
            lines.append(
                f"ll_recv_poll_ns = {sum(vals) / len(vals) / 4.5:.0f} # probe.ll_send_chain.{recv}"
                f".poll_ns_per_item / 4.5 polls per item (mean of {len(vals)}: "
                f"{', '.join(f'{v:.0f}' for v in vals)}) {csrc}"
            )
    runs = [r for f in cluster_files for r in cluster_runs(f)]
    runs_reduce = [r for f in cluster_files for r in reduce_runs(f)]
    if not cluster_files and "probe.cluster_handoff_checks" in m:
        runs = cluster_runs(path)
        runs_reduce = reduce_runs(path)
    notes = []
    if runs:
        mem = {"flush_dirty": dirty, "l2_bw_gbps": l2, "l2_hbm_bw_gbps": l2_hbm,
               "dram_bw_gbps": dram}
        more, notes = cluster_lines(runs, f"({', '.join(cluster_files) or label})", m, mem,
                                    runs_reduce)
        lines += more
        frame_src = frame_files or cluster_files
        frame = frame_ns(frame_src or [path])
        if more and frame is not None:
            ns, n = frame
            lines.append(f"cluster_frame_ns = {ns:.0f} # probe.cluster_launch_us combine_cluster_frame - "
                         f"combine_cluster, mean of {n} ({', '.join(frame_src) or label})")
    print("\n".join(lines))
    if notes:
        print("\n# cluster probe shapes: measured kernel time against the model's with these values")
        print("\n".join("# " + n for n in notes))


if __name__ == "__main__":
    main()
