#!/usr/bin/env bash
# Regenerates the committed results (every row re-run: same model, text, N, P, policy), the PNGs
# and the docs' generated blocks, after a change that moves a figure (e.g. the arena layout).
#   bash bench/harness/results/regen.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
K=$B/bench/harness/kvprune
for f in budgets-256 budgets-1024 budget-sweep longctx policies-25 policies-50 policies-25-p768 \
         think-quant-h2o-256 think-quant-snapkv-256; do
  "$K" eval --replay bench/harness/results/$f.json --json bench/harness/results/$f.json || true
done
"$K" plot --in bench/harness/results/budget-sweep.json --out bench/harness/results/budget-sweep.png
"$K" plot --in bench/harness/results/longctx.json --out bench/harness/results/longctx.png
cmake -DSRC="$PWD" -DCLI="$K" "-DDOCS=README.md;docs/harness.md;docs/ports.md;docs/c-api.md;docs/config.md" -DFIX=ON -P tests/doc_blocks.cmake
git status --short bench/harness/results README.md docs
