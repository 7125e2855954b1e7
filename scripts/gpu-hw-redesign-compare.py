#!/usr/bin/env python3
"""Hold the hardware result documents of scripts/gpu-hw-redesign.sh against committed ones.

    gpu-hw-redesign-compare.py NEW_DIR SIM_DIR

Each `NEW_DIR/<scenario>.json` named in REFERENCES is held against the committed result of
the same scenario, run by the code before the hardware backend's redesign with the same kernels
and routing (git log a9128b7.. -- kernels engine/src/routing.rs is empty for them):

* verdict `ok`;
* every committed `hw.output_digest.<op>.rank<r>` present and equal: each rank's outputs are
  byte-identical to the committed run's (the digest covers every received row, count and index,
  and every combined row: docs/results.md);
* per op the bytes counted (`rdma_bytes`, `nvlink_bytes`, `logical_bytes_per_rank`,
  `wire_bytes`) and the number of samples equal;
* every committed `measurements` key present (keys of the probes of several GPUs excepted), and
  the values that depend on neither timing nor the GPU model equal: placement, flag scope,
  kernel timeout, L2 hints, the bytes the measurements count, the kernels' shapes (less
  registers, local memory and residency, which follow the compiler and the GPU).

`NEW_DIR/h200-ep8-ll-128-no-p2p.json` (NVLink off) is held against `SIM_DIR/` of the same
name, the simulator's run of the same plan: verdict ok on both, the TCP wire with one block per
rank (`wire_report.peers` = ranks - 1), per op the same bytes in all (every message counted
once) and on the GPU all but a rank's own messages over the wire (`rdma_bytes` > 0,
`nvlink_bytes` under a quarter of the total; the exact split against the routing is the GPU
test's). The simulator's split is printed, not checked: its one-GPU model (`h200-single`'s
kernel programs) keeps every message on the GPU whatever `NVSHMEM_DISABLE_P2P` says.

Timings are never compared. Prints every check; exits 1 when one failed or a document is missing.
"""

import json
import sys
from pathlib import Path

REFERENCES = {
    "h200-ep8-ll-128": "results/h200/repeat/h200-ep8-ll-128.json",
    "h200-ep8-normal-128": "results/h200/repeat/h200-ep8-normal-128.json",
    "h200-2node-ep8-ll": "results/h200/internode/one-process/h200-2node-ep8-ll.json",
    "h200-2node-ep16-normal": "results/h200/internode/one-process/h200-2node-ep16-normal.json",
}
NO_P2P = "h200-ep8-ll-128-no-p2p"
# The same scenario with P2P allowed (a run of step 5): every message a store.
WITH_P2P = "h200-ep8-ll-128"
DIGEST = "hw.output_digest."
# Values that follow neither timing nor the GPU model.
DETERMINISTIC = (
    "hw.placement",
    "hw.flag_scope",
    "hw.kernel_timeout_ms",
    "hw.l2_discard_consumed_lines",
    "hw.nccl_baseline",
    "dispatch.logical_bytes_all_ranks",
    "combine.logical_bytes_all_ranks",
    "dispatch.transported_bytes_all_ranks",
    "combine.transported_bytes_all_ranks",
    "dispatch.nccl_alltoall_bytes_all_ranks",
    "combine.nccl_alltoall_bytes_all_ranks",
)
KERNEL_SHAPES = ("hw.normal_kernels", "hw.cluster_kernels", "hw.low_latency_kernels", "hw.internode_kernels")
# Kernel fields that follow the compiler or the GPU model, not the backend's structure.
COMPILER_OR_GPU = {
    "registers_per_thread",
    "local_memory_bytes_per_thread",
    "resident_blocks_per_sm",
    "resident_clusters",
    "effective_sms_per_rank",
}
ONLY_WITH_SEVERAL_GPUS = ("probe.peer_copy_bw_gbps", "probe.flag_latency_peer_ns")
SUMMARY_BYTES = ("rdma_bytes", "nvlink_bytes", "logical_bytes_per_rank", "wire_bytes")


def without(value, fields):
    """`value` with `fields` dropped at every depth."""
    if isinstance(value, dict):
        return {k: without(v, fields) for k, v in value.items() if k not in fields}
    return value


def ops_of(doc):
    return {(j["name"], o["op"]): o for j in doc["jobs"] for o in j["ops"]}


def verdict_line(doc):
    why = doc.get("waived_reason") or doc.get("failures") or ""
    return f"verdict {doc.get('verdict')}" + (f": {why}" if why else "")


def against_committed(name, new, ref_path, ref):
    checks = [(new.get("verdict") == "ok", verdict_line(new))]  # (passed, line)
    if new.get("verdict") != "ok":
        return [(ok, f"{name}: {line}") for ok, line in checks]
    m_new, m_ref = new.get("measurements", {}), ref.get("measurements", {})
    digests = sorted(k for k in m_ref if k.startswith(DIGEST))
    equal = [k for k in digests if m_new.get(k) == m_ref[k]]
    checks.append((
        bool(digests) and len(equal) == len(digests),
        f"{len(equal)} of {len(digests)} output digests equal the committed ones (byte-identical outputs)",
    ))
    for k in digests:
        if m_new.get(k) != m_ref[k]:
            checks.append((False, f"{k}: {m_new.get(k)} against {m_ref[k]}"))
    ops_new, ops_ref = ops_of(new), ops_of(ref)
    checks.append((set(ops_new) == set(ops_ref), f"ops {sorted(ops_new)}"))
    for key in sorted(set(ops_new) & set(ops_ref)):
        a, b = ops_new[key], ops_ref[key]
        for f in SUMMARY_BYTES:
            va, vb = a["summary"].get(f), b["summary"].get(f)
            checks.append((va == vb, f"{key[0]} {key[1]}: {f} {va} (committed {vb})"))
        checks.append((len(a["samples"]) == len(b["samples"]), f"{key[0]} {key[1]}: {len(a['samples'])} samples"))
    missing = sorted(
        k for k in m_ref if not k.startswith(DIGEST) and k not in m_new and k not in ONLY_WITH_SEVERAL_GPUS
    )
    checks.append((not missing, f"every committed measurement key present{': missing ' + ', '.join(missing) if missing else ''}"))
    added = sorted(k for k in m_new if k not in m_ref and not k.startswith(DIGEST))
    if added:
        checks.append((True, f"keys the committed run lacks: {', '.join(added)}"))
    for k in DETERMINISTIC:
        if k in m_ref:
            checks.append((m_new.get(k) == m_ref[k], f"{k} = {json.dumps(m_new.get(k))}"))
    for k in KERNEL_SHAPES:
        if k in m_ref:
            a, b = without(m_new.get(k), COMPILER_OR_GPU), without(m_ref[k], COMPILER_OR_GPU)
            checks.append((a == b, f"{k} (shapes) = {json.dumps(a)}" + ("" if a == b else f", committed {json.dumps(b)}")))
    return [(ok, f"{name}: {line}") for ok, line in checks]


def no_p2p(new, sim, with_p2p):
    """The NVLink-off run against the simulator's (same routing): the peer messages' bytes on
    RDMA exactly the simulator's, and with a rank's own messages (local stores on hardware; the
    simulator's DeepEP model counts them nowhere, docs/calibration.md "The one-GPU model") every
    message once: the same total as the P2P run of the scenario, where every message is a store."""
    checks = [(new.get("verdict") == "ok", "hw " + verdict_line(new))]
    checks.append((sim.get("verdict") == "ok", "sim " + verdict_line(sim)))
    if new.get("verdict") != "ok" or sim.get("verdict") != "ok":
        return [(ok, f"{NO_P2P}: {line}") for ok, line in checks]
    backend = new.get("backend", {})
    ranks = new["jobs"][0]["ranks"]
    checks.append((backend.get("wire") == "tcp", f"backend.wire = {backend.get('wire')!r}"))
    peers = backend.get("wire_report", {}).get("peers")
    checks.append((peers == ranks - 1, f"{peers} wire peers for {ranks} ranks (one block per rank)"))
    ops_new, ops_sim, ops_p2p = ops_of(new), ops_of(sim), ops_of(with_p2p)
    checks.append((set(ops_new) == set(ops_sim), f"ops {sorted(ops_new)}"))
    for key in sorted(set(ops_new) & set(ops_sim)):
        a, b = ops_new[key]["summary"], ops_sim[key]["summary"]
        checks.append((
            a["rdma_bytes"] == b["rdma_bytes"],
            f"{key[0]} {key[1]}: rdma_bytes {a['rdma_bytes']}, simulator {b['rdma_bytes']} (every peer message on the wire)",
        ))
        total = a["rdma_bytes"] + a["nvlink_bytes"]
        stored = ops_p2p[key]["summary"]["nvlink_bytes"] if key in ops_p2p else None
        checks.append((
            total == stored,
            f"{key[0]} {key[1]}: {total} bytes in all, P2P run {stored} (every message once; "
            f"nvlink_bytes {a['nvlink_bytes']}: a rank's own messages)",
        ))
        checks.append((True, f"{key[0]} {key[1]}: {a['latency_us']['mean']:.1f} us over loopback TCP (not a fabric time)"))
    return [(ok, f"{NO_P2P}: {line}") for ok, line in checks]


def guarded(name, compare):
    """The checks of `compare()`, or one failed check naming what broke it (a waived or failed
    run's document has no jobs to compare)."""
    try:
        return compare()
    except (KeyError, IndexError, TypeError) as e:
        return [(False, f"{name}: the document lacks what the checks read ({type(e).__name__}: {e})")]


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return e


def main():
    new_dir, sim_dir = Path(sys.argv[1]), Path(sys.argv[2])
    checks = []
    for name, ref_path in REFERENCES.items():
        new, ref = load(new_dir / f"{name}.json"), load(ref_path)
        if isinstance(new, Exception) or isinstance(ref, Exception):
            checks.append((False, f"{name}: no document to compare: {new if isinstance(new, Exception) else ref}"))
            continue
        checks.append((True, f"{name}: against {ref_path} ({ref['eptwin'].get('git_commit', '?')[:9]}, {ref['backend'].get('gpus')})"))
        checks += guarded(name, lambda: against_committed(name, new, ref_path, ref))
    docs = [load(new_dir / f"{NO_P2P}.json"), load(sim_dir / f"{NO_P2P}.json"), load(new_dir / f"{WITH_P2P}.json")]
    broken = [d for d in docs if isinstance(d, Exception)]
    if broken:
        checks.append((False, f"{NO_P2P}: no document to compare: {broken[0]}"))
    else:
        checks += guarded(NO_P2P, lambda: no_p2p(*docs))
    for ok, line in checks:
        print(("  ok     " if ok else "  FAILED ") + line)
    failed = sum(1 for ok, _ in checks if not ok)
    print(f"{failed} failed checks of {len(checks)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
