#!/usr/bin/env python3
"""Hold hardware result documents against the committed ones of the same scenario.

    gpu-hw-redesign-compare.py NEW_DIR COMMITTED_ROOT...

For every `NEW_DIR/<name>.json` the committed `<name>.json` under the roots (one-process
documents preferred) is compared: the `measurements` keys and, for object values, their
nested keys must be the same (a key the new document adds is listed, one it lacks fails); the
values that do not depend on timing must be equal (placement, flag scope, the bytes counted,
the NCCL baseline's bytes); output digests are listed as equal or not (they are equal when the
kernels and the routing are). A document named `*-no-p2p` has no committed counterpart: it must
have run over the wire (`backend.wire` = "tcp", one peer per other rank) with no more
NVLink/device-local bytes than a rank's messages to itself. Exits 1 on a failed check.
"""

import json
import sys
from pathlib import Path

DETERMINISTIC = (
    "hw.placement",
    "hw.flag_scope",
    "hw.kernel_timeout_ms",
    "hw.l2_discard_consumed_lines",
    "dispatch.logical_bytes_all_ranks",
    "combine.logical_bytes_all_ranks",
    "dispatch.transported_bytes_all_ranks",
    "combine.transported_bytes_all_ranks",
    "dispatch.nccl_alltoall_bytes_all_ranks",
    "combine.nccl_alltoall_bytes_all_ranks",
)
DIGEST = "hw.output_digest."


def committed_for(name, roots):
    """The committed document of `name`: a one-process one first, then any."""
    found = []
    for root in roots:
        found += sorted(Path(root).rglob(name))
    docs = []
    for path in found:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("backend", {}).get("kind") == "hw":
            docs.append((path, doc))
    docs.sort(key=lambda pd: pd[1]["backend"].get("processes", 1) != 1)
    return docs[0] if docs else (None, None)


def nested_keys(value, prefix=""):
    if not isinstance(value, dict):
        return set()
    keys = set()
    for k, v in value.items():
        keys.add(prefix + k)
        keys |= nested_keys(v, prefix + k + ".")
    return keys


def compare(name, new, old_path, old):
    failures, notes = [], []
    m_new, m_old = new.get("measurements", {}), old.get("measurements", {})
    plain = lambda m: {k for k in m if not k.startswith(DIGEST)}  # noqa: E731
    for k in sorted(plain(m_old) - plain(m_new)):
        failures.append(f"{name}: key {k} of {old_path} is missing")
    for k in sorted(plain(m_new) - plain(m_old)):
        notes.append(f"{name}: key {k} is new")
    for k in sorted(plain(m_new) & plain(m_old)):
        a, b = nested_keys(m_new[k]), nested_keys(m_old[k])
        for sub in sorted(b - a):
            failures.append(f"{name}: {k}.{sub} of {old_path} is missing")
        for sub in sorted(a - b):
            notes.append(f"{name}: {k}.{sub} is new")
    for k in DETERMINISTIC:
        if k in m_new and k in m_old and m_new[k] != m_old[k]:
            failures.append(f"{name}: {k} = {m_new[k]}, committed {m_old[k]}")
    digests = [k for k in m_new if k.startswith(DIGEST)]
    same = sum(1 for k in digests if m_old.get(k) == m_new[k])
    notes.append(f"{name}: {same} of {len(digests)} output digests equal the committed ones")
    return failures, notes


def check_no_p2p(name, doc):
    failures, notes = [], []
    backend = doc.get("backend", {})
    ranks = doc["jobs"][0]["ranks"]
    if doc.get("verdict") != "ok":
        failures.append(f"{name}: verdict {doc.get('verdict')}: {doc.get('failures')}")
    if backend.get("wire") != "tcp":
        failures.append(f"{name}: backend.wire = {backend.get('wire')!r}, not the TCP wire")
    peers = backend.get("wire_report", {}).get("peers")
    if peers != ranks - 1:
        failures.append(f"{name}: {peers} wire peers for {ranks} ranks (one block per rank)")
    for op in doc["jobs"][0]["ops"]:
        s = op["summary"]
        notes.append(
            f"{name}: {op['op']}: rdma_bytes {s['rdma_bytes']}, nvlink_bytes {s['nvlink_bytes']} "
            f"(a rank's own messages), {s['latency_us']['mean']:.1f} us"
        )
        # Uniform top-8 of 256 experts over 8 ranks: about 1/8 of the messages are a rank's own.
        if not s["rdma_bytes"] > 3 * s["nvlink_bytes"]:
            failures.append(f"{name}: {op['op']} moved {s['nvlink_bytes']} bytes by stores")
    return failures, notes


def main():
    new_dir, roots = Path(sys.argv[1]), sys.argv[2:]
    failures, notes = [], []
    for path in sorted(new_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        name = path.stem
        if name.endswith("-no-p2p"):
            f, n = check_no_p2p(name, doc)
        else:
            old_path, old = committed_for(path.name, roots)
            if old is None:
                notes.append(f"{name}: no committed hardware result to compare with")
                continue
            notes.append(f"{name}: against {old_path}")
            f, n = compare(name, doc, old_path, old)
        failures += f
        notes += n
    for line in notes:
        print("  " + line)
    for line in failures:
        print("FAILED " + line)
    print(f"{len(failures)} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
