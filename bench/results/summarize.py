#!/usr/bin/env python3
"""Merge several `bench_attention --sweep --csv` runs into one CSV of medians over the runs.

    python3 bench/results/summarize.py OUT.csv RUN1.csv RUN2.csv ...

Rows are grouped by (kind, N, threads). Every numeric column becomes the median over the runs,
except frac_bw_min / frac_bw_max, which become the min / max over the runs of each run's median
fraction (the spread between runs, not within one). The '#' header lines of the runs are kept
(prefixed with the run's file name), so the output still says when, where and under which
load every number was taken. The output has the same columns as a single run, so
plot_frac.gp draws it the same way.
"""
import csv
import statistics
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], sys.argv[2:]
    header_lines, groups, cols = [], {}, None
    for path in runs:
        with open(path) as f:
            lines = f.read().splitlines()
        header_lines += ["# %s: %s" % (path.split("/")[-1], l[1:].strip()) for l in lines if l.startswith("#")]
        rows = list(csv.reader([l for l in lines if l and not l.startswith("#")]))
        cols = rows[0]
        for r in rows[1:]:
            groups.setdefault((r[0], int(r[1]), int(r[2])), []).append(r)
    with open(out, "w") as f:
        f.write("# median over %d runs: %s\n" % (len(runs), " ".join(p.split("/")[-1] for p in runs)))
        for h in header_lines:
            f.write(h + "\n")
        f.write(",".join(cols) + "\n")
        for key in sorted(groups, key=lambda k: (k[0] != "decode", k[0], k[1], k[2])):
            rs = groups[key]
            vals = []
            for i, c in enumerate(cols):
                if i < 3:
                    vals.append(rs[0][i])
                    continue
                xs = [float(r[i]) for r in rs]
                if c == "frac_bw_min":
                    xs = [float(r[cols.index("frac_bw")]) for r in rs]
                    vals.append("%.4f" % min(xs))
                elif c == "frac_bw_max":
                    xs = [float(r[cols.index("frac_bw")]) for r in rs]
                    vals.append("%.4f" % max(xs))
                else:
                    vals.append("%.4f" % statistics.median(xs))
            f.write(",".join(vals) + "\n")


if __name__ == "__main__":
    main()
