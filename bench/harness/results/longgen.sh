#!/usr/bin/env bash
# Issue 8's long generation at equal average memory (docs/harness.md "Results (issue 8)"):
# 4x the trained context (N 1024, P 16, teacher-forced on models/enbytes-1m.eval.txt), streaming,
# window, h2o and lethe at three memory levels; bench_longgen records live bytes after every token
# (its "mean live" is the average memory). Every figure is deterministic (no times).
#   bash bench/harness/results/longgen.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
exec "$B/bench/harness/bench_longgen" --tokens 1024 --prefill 16 \
  --policy "policy=streaming sinks=4 window=252" \
  --policy "policy=h2o budget=256 positions=realign" \
  --policy "policy=lethe capacity=512 evict_threshold=128 total_capacity=1536 positions=realign" \
  --policy "policy=lethe capacity=256 positions=realign" \
  --policy "policy=h2o budget=256" \
  --policy "policy=lethe capacity=512 evict_threshold=128 total_capacity=1536" \
  --policy "policy=streaming sinks=4 window=164" \
  --policy "policy=window window=168" \
  --policy "policy=h2o budget=168 positions=realign" \
  --policy "policy=lethe capacity=256 evict_threshold=64 total_capacity=1008 positions=realign" \
  --policy "policy=lethe capacity=256 evict_threshold=64 total_capacity=1008 sparse_ratio=50 positions=realign" \
  --policy "policy=streaming sinks=4 window=60" \
  --policy "policy=h2o budget=64 positions=realign" \
  --policy "policy=lethe capacity=128 evict_threshold=32 total_capacity=384 positions=realign"
