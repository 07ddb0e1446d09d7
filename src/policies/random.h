// The random baseline (issue 32 item 4): a 2026 study (arXiv 2609.03430) found that keeping the
// prompt and evicting generated tokens uniformly at random per head matches the best evictors on
// several tasks, so every policy table here has a random row beside it. Keys `budget`, `seed`,
// `keep_prompt`.
//
// Per (layer, KV head), independently:
// - keep_prompt=1 (default): tokens added by kvp_prefill or kvp_append are the prompt and are never
//   evicted; tokens added by kvp_decode are generated (marked in their slot score). After a decode,
//   while the head holds more than `budget` generated tokens, generated tokens are evicted
//   uniformly at random (the new token included) down to `budget`. Default capacity: budget + 1 +
//   2048 (the prompt's room, full's default capacity); give capacity for a longer prompt. A
//   draft's commit replays its tokens as a prefill, so accepted draft tokens count as prompt.
// - keep_prompt=0: every token may go; after each call the head keeps `budget` tokens, the others
//   evicted uniformly at random (a prefill chunk: a uniform `budget`-subset of what the head holds;
//   a decode: one uniform victim once full). Default capacity budget + 1, as h2o's.
// Draws: the e-th token evicted from a store (e = its eviction count, saved with the state) is
// chosen by splitmix64 of (seed, layer, head, e): a partial Fisher-Yates over the candidates in
// logical order, so the victims depend on nothing but the calls (not on threads, chunking under
// max_prompt, ISA or score mode) and a loaded state draws what the saved one would have.
// Self-prune (a dry shared pool): random among the candidates, as many as the new tokens need.
// Default positions: original.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kRandomPolicy;

// The draw of a store's e-th eviction (tests).
uint64_t random_draw(uint32_t seed, uint32_t layer, uint32_t head, uint64_t e);

}  // namespace kvp
