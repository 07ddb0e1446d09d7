// Sliding-window layers (issue 21 item 5): the core's business, not a policy's.
//
// With sliding_window = W > 0 a layer is local unless sliding_pattern = P > 0 and (l+1) % P == 0
// (global). A local layer's query at original position p sees exactly the keys at original
// positions p-W < pos <= p (the masking of the Hugging Face Gemma/Mistral reference: a query
// sees W keys, itself included). The core, not the policy, runs a local layer:
//   - plan: a ring (front eviction), no pinned prefix, no scores, no observation, capacity
//     W - 1 + local_piece(cfg) tokens per KV head, and a pool reservation of all its blocks;
//   - before appending a call's tokens it evicts the keys no new query can see
//     (pos <= first new position - W), after the call those the next query cannot see
//     (pos <= last position + 1 - W): the blocks go back to the pool, so the layer holds at
//     most W - 1 tokens between calls;
//   - a prefill with more tokens than local_piece runs as pieces of local_piece tokens, one
//     after another (the same append / attend / evict), so the arena never holds more than the
//     window plus one piece;
//   - prefill and draft attention mask every key at pos <= p - W per query (attention.cpp);
//     a decode needs no mask (the store holds exactly the query's window after the eviction);
//   - the policy's operations (prune, observe, layer_prepare, layer_phase, self_prune,
//     selection) never run on a local layer; global layers run the chosen policy as before.
#pragma once
#include <stdint.h>

#include "kvprune/kvprune.h"

namespace kvp {

inline bool layer_local(const kvp_config &cfg, uint32_t layer) {
    if (cfg.sliding_window == 0) return false;
    return cfg.sliding_pattern == 0 || (layer + 1) % cfg.sliding_pattern != 0;
}

// The attention window of a layer: sliding_window for a local layer, 0 (none) for a global one.
inline uint32_t layer_window(const kvp_config &cfg, uint32_t layer) {
    return layer_local(cfg, layer) ? cfg.sliding_window : 0;
}

// Tokens one piece of a local layer's prefill appends: 32 rounded up to the storage block.
inline uint32_t local_piece(uint32_t block) { return (32 + block - 1) / block * block; }

}  // namespace kvp
