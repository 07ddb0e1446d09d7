#!/usr/bin/env python3
"""Before/after table of two runs of the same retrieval grid (kvprune eval --task --json files).

  python3 bench/harness/results/compare.py OLD.json NEW.json [more OLD NEW pairs]

Per task, policy and setting: the mean byte accuracy and the share of exact answers over every
(length, depth) cell, before -> after, for the policies whose rows changed; and the mean peak
live KV bytes as a fraction of full KV. Rows pair up by (task, policy, setting, length, depth,
sample)."""
import json
import sys
from collections import defaultdict


def key(r):
    return (r["task"], r["policy"], r["setting"], r["length"], r["depth"], r.get("sample", 0))


def main(argv):
    if len(argv) < 2 or len(argv) % 2:
        sys.exit(__doc__)
    print("| task | policy | setting | byte accuracy before -> after | exact before -> after | cells | changed |")
    print("|---|---|---|---|---|---|---|")
    for i in range(0, len(argv), 2):
        old = {key(r): r for r in json.load(open(argv[i]))}
        new = {key(r): r for r in json.load(open(argv[i + 1]))}
        groups = defaultdict(list)
        for k, r in new.items():
            if k in old:
                groups[k[:3]].append((old[k], r))
        for g in sorted(groups):
            pairs = groups[g]
            changed = sum(1 for o, n in pairs if o["generated"] != n["generated"] or o["answer_nll"] != n["answer_nll"])
            if not changed:
                continue
            n = len(pairs)
            ba0 = sum(o["byte_accuracy"] for o, _ in pairs) / n
            ba1 = sum(r["byte_accuracy"] for _, r in pairs) / n
            ex0 = sum(o["correct"] for o, _ in pairs) / n
            ex1 = sum(r["correct"] for _, r in pairs) / n
            print(f"| {g[0]} | `{g[1]}` | {g[2]} | {ba0:.3f} -> {ba1:.3f} | {ex0:.2f} -> {ex1:.2f} | {n} | {changed} |")


if __name__ == "__main__":
    main(sys.argv[1:])
