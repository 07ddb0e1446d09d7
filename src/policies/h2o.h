// H2O, Heavy-Hitter Oracle: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative
// Inference of Large Language Models" (NeurIPS 2023), Sec. 4 and Algorithm 1 (the H2 eviction
// policy): every KV token accumulates the attention it receives; the cache keeps the `budget`
// tokens with the highest accumulated score, always including the `recent` most recent ones.
//
// Here, per KV head (DESIGN.md):
// - Score: the normalised attention mass a token receives, summed over the query heads of the
//   GQA group (fused into the decode pass, see attention.cpp), accumulated over steps.
// - Decode: the new token is appended (score 0) and attended; then, while the head holds more
//   than `budget` tokens, the token with the lowest score outside the `recent` most recent is
//   evicted, the older one first on ties. With one new token per step that is one eviction.
// - Prefill: scores are the attention mass of the chunk's last `obs_window` queries over every
//   key they see (full softmax rows for those queries only; DESIGN.md "prefill scoring"), then the
//   same rule runs once (the len - budget lowest at once: identical to one at a time, since
//   scores do not change in between). Interpretation: the reference code sums the whole prompt's
//   attention matrix; `obs_window` >= the chunk length gives exactly that.
// - `kvp_append` (no queries): nothing is scored, so the rule keeps the oldest non-recent tokens
//   evicted first (all scores tie at 0).
// - Self-prune when the shared pool is dry: the same ranking (lowest score outside the recent
//   window; if every token is recent, lowest overall), as many as the new tokens need.
// Capacity: default budget + 1 (the new token is appended before the eviction); a larger
// capacity only allows larger prefill chunks. Default positions: original (the paper's); with
// realign the survivors are re-indexed after each compaction (storage.h).
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kH2oPolicy;

// Tokens to evict from a compacting (non-ring) store so that n more tokens fit in the blocks
// it holds plus what the pool allows it (at least 1).
uint32_t dense_self_prune_count(const PolicyCtx &ctx, const HeadStore &hs, uint32_t n);

// head_budget=ada: the most evictions of one layer phase that take the bounded-heap path
// (h2o.cpp "fast_phase"; default 256). A test hook: 0 sends every phase through the full
// ranking, whose result the fast path must equal (test_ada H2oFastPathIsTheFullRanking). Read
// only by the layer phase; not for concurrent writes.
extern uint32_t h2o_ada_fast_max;

}  // namespace kvp
