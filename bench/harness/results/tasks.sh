#!/usr/bin/env bash
# Issue 19's retrieval figures (docs/harness.md "Retrieval tasks"): every default policy at 50/25/12.5%
# of the prompt's tokens and full KV, both settings, 11 depths, on the retrieval model induction6.bin:
# passkey and recall at lengths 256/512/1000, niah-multikey at 512/768/1000 (four needles need room).
# Besides the defaults (kvprune eval --task's own list), the best setting of each policy's keys that
# the 25% sweep found (tasks-sweep-25.json; docs/harness.md) runs beside it.
# Writes tasks-<task>.json (replayed in part by ctest), the heatmaps per setting, the accuracy-vs-memory
# plot and tasks-report.md (kvprune report of the three files).
#   bash bench/harness/results/tasks.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
K=$B/bench/harness/kvprune
R=bench/harness/results
P=()
for s in "policy=window" "policy=streaming sinks=4" "policy=h2o" "policy=snapkv" "policy=pyramidkv" "policy=lethe" \
         "policy=simlayerkv nonlazy=snapkv" "policy=asl" "policy=think token_policy=snapkv" "policy=snapkv kv_dtype=q8" \
         "policy=snapkv kv_dtype=q4" "policy=random keep_prompt=0" \
         "policy=streaming sinks=16" "policy=snapkv pool_kernel=15" "policy=pyramidkv beta=5 pool_kernel=15" \
         "policy=lethe recent_ratio=0.1" "policy=simlayerkv nonlazy=snapkv pool_kernel=15" "policy=asl pool_kernel=15" \
         "policy=think token_policy=snapkv pool_kernel=15" "policy=snapkv kv_dtype=q4 pool_kernel=15"; do
  P+=(--policy "$s")
done
for t in passkey niah-multikey recall; do
  lengths=256,512,1000
  [ "$t" = niah-multikey ] && lengths=512,768,1000
  /usr/bin/time -f "$t grid: %e s wall, %M KiB peak RSS" "$K" eval --task "$t" --lengths "$lengths" \
    --policy "policy=full capacity=1088" "${P[@]}" --json "$R/tasks-$t.json" --progress-every 60 >"$R/tasks-$t.txt"
  for s in query-aware query-agnostic; do
    "$K" plot --in "$R/tasks-$t.json" --out "$R/tasks-$t-$s.png" --setting "$s"
  done
  "$K" plot --in "$R/tasks-$t.json" --out "$R/tasks-$t-memory.png" --kind memory
done
{ for t in passkey niah-multikey recall; do "$K" report --in "$R/tasks-$t.json"; done; } >"$R/tasks-report.md"
echo "load average after the grids: $(cut -d' ' -f1-3 /proc/loadavg)"
