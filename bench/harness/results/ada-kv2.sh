#!/usr/bin/env bash
# Issue 32's per-head budget figures (docs/harness.md "induction6-kv2"): the retrieval model with a
# matching head and a local head in one layer (kvprune-gen-induction --kv-heads 2, written into the
# build dir from the held-out text: the same bytes on every run), passkey, niah and recall,
# query-aware, 50/25/12.5 % of the prompt, every policy that takes head_budget=ada with and
# without it, and the random baseline. Writes ada-kv2.{json,txt}, the heatmap and the
# accuracy-vs-memory plot. `kvprune eval --replay bench/harness/results/ada-kv2.json` replays it
# once the model is at the path the rows name (run this script's first step).
#   bash bench/harness/results/ada-kv2.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
K=$B/bench/harness/kvprune
R=bench/harness/results
M=$B/induction6-kv2.bin
"$B/bench/harness/kvprune-gen-induction" --corpus models/enbytes-1m.eval.txt --out "$M" --kv-heads 2
P=()
for s in snapkv pyramidkv h2o lethe "triattention tri_mode=per_layer_perhead"; do
  P+=(--policy "policy=$s" --policy "policy=$s head_budget=ada")
done
/usr/bin/time -f "grid: %e s wall, %M KiB peak RSS" "$K" eval --task passkey,niah,recall --setting query-aware \
  --model "$M" "${P[@]}" --policy "policy=random keep_prompt=0" --json "$R/ada-kv2.json" --progress-every 60 >"$R/ada-kv2.txt"
for t in passkey niah recall; do
  "$K" plot --in "$R/ada-kv2.json" --out "$R/ada-kv2-$t.png" --task "$t" --setting query-aware
done
"$K" plot --in "$R/ada-kv2.json" --out "$R/ada-kv2-memory.png" --kind memory --task passkey
echo "load average after the grid: $(cut -d' ' -f1-3 /proc/loadavg)"
