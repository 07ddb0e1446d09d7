#!/usr/bin/env bash
# Issue 23 item 3 quality table (docs/rotate.md, docs/harness.md "Rotated low-bit storage"):
# what kv_rotate=hadamard buys for quantized storage.
#   bash bench/harness/results/rotate.sh [build dir, default build]
# 1. NLL on enbytes-1m (head_dim 32), full KV, f32 against f16/q8/q4 with and without rotation:
#    five held-out passages of models/enbytes-1m.eval.txt (2048 bytes at offsets 0, 40000, ...,
#    160000), N 256 P 64 (the trained context) and N 1024 P 256. Writes rotate-nll.csv (every
#    row) and rotate-nll.txt (mean NLL per configuration and its ratio to f32: the table in the
#    docs).
# 2. Retrieval on induction6 (head_dim 32): passkey, niah, recall at 25% of the prompt's tokens
#    (compression_ratio 0.75) under snapkv pool_kernel=15 (the setting that keeps the pass key
#    at 25%), f32 / q8 / q4, with and without rotation, and full KV; both settings, lengths
#    256/512/1000, 11 depths. Writes rotate-tasks.json (`kvprune report --in` prints its tables).
# Deterministic except the timing fields; 6.5 min wall (2.2 min CPU) on the loaded 2-core VM.
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
K=$B/bench/harness/kvprune
R=bench/harness/results
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
csv=$R/rotate-nll.csv
rm -f "$csv"
for off in 0 40000 80000 120000 160000; do
  dd if=models/enbytes-1m.eval.txt of="$T/p$off.txt" bs=2048 skip=$off count=1 iflag=skip_bytes status=none
  for np in "256 64" "1024 256"; do
    set -- $np
    P=()
    P+=(--policy "policy=full capacity=$1 positions=original")
    for dt in f16 q8 q4; do
      P+=(--policy "policy=full capacity=$1 positions=original kv_dtype=$dt")
      P+=(--policy "policy=full capacity=$1 positions=original kv_dtype=$dt kv_rotate=hadamard")
    done
    "$K" eval --no-progress --text "$T/p$off.txt" --tokens "$1" --prefill "$2" "${P[@]}" --csv "$T/r.csv" > /dev/null
    if [ ! -f "$csv" ]; then head -1 "$T/r.csv" | sed 's/^/offset,/' > "$csv"; fi
    tail -n +2 "$T/r.csv" | sed "s/^/$off,/; s#$T/##g" >> "$csv"
  done
done
# Summary: mean NLL over the passages per (N, dtype, rotation), the ratio to f32's mean, and the
# largest per-passage ratio to f32.
python3 - "$csv" > "$R/rotate-nll.txt" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def cfg(spec):
    dt = "f32"
    for w in spec.split():
        if w.startswith("kv_dtype="): dt = w.split("=")[1]
    return dt + (" + hadamard" if "kv_rotate=hadamard" in spec else "")
order = ["f32", "f16", "f16 + hadamard", "q8", "q8 + hadamard", "q4", "q4 + hadamard"]
print("enbytes-1m, full KV, mean NLL (nats/byte) over 5 passages; ratio = mean / f32 mean; worst = largest per-passage NLL / f32 NLL")
print(("%-16s | %-30s | %-30s" % ("storage", "N 256 P 64: nll  ratio  worst", "N 1024 P 256: nll  ratio  worst")).rstrip())
base = {}
for r in rows:
    if cfg(r["spec"]) == "f32": base[(r["tokens"], r["offset"])] = float(r["nll"])
for c in order:
    cells = []
    for n in ("256", "1024"):
        sel = [r for r in rows if r["tokens"] == n and cfg(r["spec"]) == c]
        m = sum(float(r["nll"]) for r in sel) / len(sel)
        bm = sum(base[(n, r["offset"])] for r in sel) / len(sel)
        worst = max(float(r["nll"]) / base[(n, r["offset"])] for r in sel)
        cells.append("%.4f  %.4f  %.4f" % (m, m / bm, worst))
    print(("%-16s | %-30s | %-30s" % (c, cells[0], cells[1])).rstrip())
PY
cat "$R/rotate-nll.txt"
"$K" eval --no-progress --task passkey,niah,recall --compression-ratio 0.75 \
  --policy "policy=full capacity=1100" \
  --policy "policy=snapkv pool_kernel=15" \
  --policy "policy=snapkv pool_kernel=15 kv_dtype=q8" --policy "policy=snapkv pool_kernel=15 kv_dtype=q8 kv_rotate=hadamard" \
  --policy "policy=snapkv pool_kernel=15 kv_dtype=q4" --policy "policy=snapkv pool_kernel=15 kv_dtype=q4 kv_rotate=hadamard" \
  --json "$R/rotate-tasks.json" > /dev/null
"$K" report --in "$R/rotate-tasks.json"
# Cell by cell against snapkv f32 (the target: no cell that f32 solves is lost): per task and
# configuration, cells f32 answers exactly that it does not (lost), and the reverse (gained);
# recall also the mean byte accuracy. Writes rotate-tasks.txt.
python3 - "$R/rotate-tasks.json" > "$R/rotate-tasks.txt" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
key = lambda r: (r["task"], r["setting"], r["length"], r["depth"], r["sample"])
base = {key(r): r for r in rows if r["policy"] == "policy=snapkv pool_kernel=15 compression_ratio=0.75"}
pols = [p for p in dict.fromkeys(r["policy"] for r in rows) if p.startswith("policy=snapkv") and p != "policy=snapkv pool_kernel=15 compression_ratio=0.75"]
print("induction6, snapkv pool_kernel=15 at 25% of the tokens, both settings, lengths 256/512/1000, 11 depths:")
print("cells against f32 (solved = exact answer): lost = f32 solves, this does not; gained = the reverse")
print("%-84s | %-8s | %6s | %6s | %6s | %s" % ("policy", "task", "cells", "solved", "lost", "gained (byte accuracy: f32 -> this)"))
for p in pols:
    for task in dict.fromkeys(r["task"] for r in rows):
        sel = [r for r in rows if r["policy"] == p and r["task"] == task]
        lost = sum(1 for r in sel if base[key(r)]["correct"] and not r["correct"])
        gained = sum(1 for r in sel if r["correct"] and not base[key(r)]["correct"])
        ba = sum(r["byte_accuracy"] for r in sel) / len(sel)
        bb = sum(base[key(r)]["byte_accuracy"] for r in sel) / len(sel)
        print("%-84s | %-8s | %6d | %6d | %6d | %d (%.3f -> %.3f)" % (p, task, len(sel), sum(1 for r in sel if r["correct"]), lost, gained, bb, ba))
PY
cat "$R/rotate-tasks.txt"
