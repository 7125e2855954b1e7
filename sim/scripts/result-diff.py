#!/usr/bin/env python3
"""Compare simulator result JSONs of two runs, field by field.

    sim/scripts/result-diff.py REF_DIR NEW_DIR     # every REF_DIR/*.json against NEW_DIR's
    sim/scripts/result-diff.py REF.json NEW.json

`git_commit` and `created_at` are ignored. For each file: "identical", or every leaf path
whose value differs, grouped by path with array indices replaced by `*`, with the number of
differing values and the largest relative difference |new - ref| / |ref| (non-numbers: the
count only). Exit status 0 when everything is identical, 1 otherwise.
"""
import json
import re
import sys
from pathlib import Path

IGNORED = {"git_commit", "created_at"}


def leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            if k not in IGNORED:
                yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{path}[{i}]")
        yield f"{path}.#len", len(x)
    else:
        yield path, x


def compare(ref_path, new_path):
    ref = dict(leaves(json.loads(Path(ref_path).read_text())))
    new = dict(leaves(json.loads(Path(new_path).read_text())))
    groups = {}
    for key in sorted(set(ref) | set(new)):
        a, b = ref.get(key), new.get(key)
        if a == b:
            continue
        g = groups.setdefault(re.sub(r"\[\d+\]", "[*]", key), [0, 0.0])
        g[0] += 1
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            rel = abs(b - a) / abs(a) if a != 0 else float("inf")
            g[1] = max(g[1], rel)
    return groups


def main():
    ref, new = Path(sys.argv[1]), Path(sys.argv[2])
    pairs = (
        [(f, new / f.name) for f in sorted(ref.glob("*.json"))] if ref.is_dir() else [(ref, new)]
    )
    differs = False
    for a, b in pairs:
        if not b.exists():
            print(f"{a.name}: MISSING in {new}")
            differs = True
            continue
        groups = compare(a, b)
        if not groups:
            print(f"{a.name}: identical")
            continue
        differs = True
        print(f"{a.name}: differs")
        for path, (n, rel) in groups.items():
            print(f"    {path}: {n} value(s), max relative difference {rel:.3g}")
    sys.exit(1 if differs else 0)


if __name__ == "__main__":
    main()
