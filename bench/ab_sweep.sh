#!/usr/bin/env bash
# A/B of the decode sweep between a git ref (A) and this checkout's build (B), alternating
# sweeps in one session so the VM's drift in bandwidth hits both sides alike (figures measured
# side by side, not in separate sessions).
#
#   bash bench/ab_sweep.sh REF [ROUNDS] [sweep options ...]
#   bash bench/ab_sweep.sh ca753cd 5 --nmin 1024 --nmax 4096 --threads 2
#
# B is ./build/bench/bench_attention (build it first, Release). A is REF's bench_attention,
# built in a temporary git worktree. Each round runs one `--sweep --reps 1 --no-prefill` per side
# (A first, then B); the runs, and their medians A.csv / B.csv (bench/results/summarize.py), go
# to bench/results/runs/ab-<ref>-<UTC time>/. Prints B/A of ms per step for every
# (kind, N, threads) row, with the range over the rounds.
set -euo pipefail
if [ $# -lt 1 ]; then
    sed -n '2,13p' "$0"
    exit 2
fi
ref=$1
rounds=${2:-5}
shift $(($# >= 2 ? 2 : 1))
root=$(git rev-parse --show-toplevel)
cd "$root"
B=./build/bench/bench_attention
[ -x "$B" ] || { echo "ab_sweep: build ./build first (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release)" >&2; exit 2; }
wt=$(mktemp -d)
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"' EXIT
git worktree add --detach "$wt" "$ref" >/dev/null 2>&1
cmake -S "$wt" -B "$wt/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$wt/build" --target bench_attention -j2 >/dev/null
A="$wt/build/bench/bench_attention"
out=bench/results/runs/ab-$(git rev-parse --short "$ref")-$(date -u +%Y%m%dT%H%M)
mkdir -p "$out"
echo "# A = $ref ($(git rev-parse --short "$ref")), B = working tree ($(git rev-parse --short HEAD)$(git diff --quiet || echo ', modified')); $rounds rounds; loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
    OMP_WAIT_POLICY=passive "$A" --sweep --reps 1 --no-prefill --label "A-$r" --csv "$out/A-$r.csv" "$@" >/dev/null
    OMP_WAIT_POLICY=passive "$B" --sweep --reps 1 --no-prefill --label "B-$r" --csv "$out/B-$r.csv" "$@" >/dev/null
done
echo "# loadavg after $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
python3 bench/results/summarize.py "$out/A.csv" "$out"/A-[0-9]*.csv
python3 bench/results/summarize.py "$out/B.csv" "$out"/B-[0-9]*.csv
python3 - "$out" "$rounds" <<'PY'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def load(path):
    rows = [l for l in open(path).read().splitlines() if l and not l.startswith("#")]
    r = list(csv.reader(rows))
    i = r[0].index("ms_per_step")
    return {(x[0], int(x[1]), int(x[2])): float(x[i]) for x in r[1:]}

runs = {s: [load("%s/%s-%d.csv" % (out, s, k)) for k in range(1, rounds + 1)] for s in "AB"}
print("%-11s %6s %3s %10s %10s %7s  %s" % ("kind", "N", "thr", "A ms", "B ms", "B/A", "B/A per round"))
for key in sorted(runs["A"][0], key=lambda k: (k[0] != "decode", k[0], k[1], k[2])):
    a = [r[key] for r in runs["A"] if key in r]
    b = [r[key] for r in runs["B"] if key in r]
    per = [y / x for x, y in zip(a, b)]
    print("%-11s %6d %3d %10.4f %10.4f %7.3f  %.2f..%.2f" % (key[0], key[1], key[2], statistics.median(a),
          statistics.median(b), statistics.median(b) / statistics.median(a), min(per), max(per)))
PY
