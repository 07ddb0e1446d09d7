#!/usr/bin/env bash
# Long speculative-decoding runs (issue 21): the twin test of tests/test_draft.cpp with many more
# random drafts (KVP_DRAFT_STEPS steps per policy x dtype x positions mode, 60 in ctest), then
# the commit-cost benchmark for three policies. Usage: bench/draft_long.sh [build dir] [steps]
set -euo pipefail
B=${1:-build}
STEPS=${2:-3000}
uptime
KVP_DRAFT_STEPS=$STEPS "$B/tests/test_draft" --gtest_filter='Draft.Twin*' | grep -E '^\[ *(OK|FAILED|PASSED)'
KVP_DRAFT_STEPS=$STEPS "$B/tests/test_draft" --gtest_filter='Draft.TwinEvery*' |
    awk '/commits/ { for (i = 1; i <= NF; ++i) { if ($i == "commits") c += $(i + 1); if ($i == "accepted") a += $(i + 1) } }
         END { printf "twin runs: %d commits, %d accepted tokens, every state equal to the twin'"'"'s\n", c, a }'
for spec in "policy=streaming sinks=4 window=2044 compress_every=16 capacity=2080" \
            "policy=h2o budget=2048 recent=32 capacity=2112" \
            "policy=snapkv budget=2048 obs_window=32 recent=32 capacity=2112"; do
    "$B/bench/bench_draft" --rounds 20 --spec "$spec"
done
uptime
