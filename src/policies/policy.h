// The policy seam: one table of operations per policy (DESIGN.md "Policies plug into one seam").
// The core (cache.cpp) never asks which policy runs; it plans the arena from `plan`, and per
// call and KV head it makes room (self_prune when the shared pool is dry), appends, attends
// (accumulating decode attention mass into slot scores when the plan asks for it, observing the
// last `obs_queries` prefill queries when it asks for that), then calls `prune`; after all heads
// of the layer it calls `layer_phase` once, on the calling thread, for layer-wide decisions
// (heads are reduced there in fixed head order, so decisions do not depend on thread count).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvprune/kvprune.h"
#include "msg.h"
#include "pool.h"
#include "storage.h"

struct kvp_cache;

namespace kvp {

enum class StepMode { kPrefill, kDecode, kAppend };

// What a policy needs from the core for one layer.
struct LayerPlan {
    uint32_t cap;           // hard cap on tokens per KV head (kvp_layer_capacity)
    uint32_t pin_cap;       // pinned prefix (streaming sinks), 0 otherwise
    bool front_evict;       // evicts the oldest body tokens (ring) rather than by compaction
    bool decode_scores;     // decode adds each token's attention mass to its slot score
    uint32_t obs_queries;   // prefill: observe the attention rows of the chunk's last queries (0: none)
    size_t scratch_bytes;   // per-thread scratch the policy's operations use
};

// The context of one operation.
struct PolicyCtx {
    kvp_cache *c;
    uint32_t layer;
    uint32_t head;       // KV head (per-head operations)
    BlockPool *pool;     // the head's pool (per-head operations)
    void *scratch;       // this thread's policy scratch (LayerPlan::scratch_bytes, 64-aligned)
};

struct Policy {
    const char *name;
    kvp_positions default_positions;  // what positions=default means
    // Policy-specific consistency of a config whose ranges were checked. May be NULL.
    kvp_status (*check)(const kvp_config &cfg, Msg &m);
    void (*plan)(const kvp_config &cfg, uint32_t layer, LayerPlan *p);
    // Prefill observation: obs[g * ld + j] = attention mass of query head g of the group on
    // logical token j (j < hs.len()), summed over the observed queries. May be NULL.
    void (*observe)(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const float *obs, size_t ld);
    // After the head's tokens were appended and attended. May be NULL.
    void (*prune)(PolicyCtx &ctx, HeadStore &hs, StepMode mode);
    // After all heads of the layer. May be NULL.
    void (*layer_phase)(PolicyCtx &ctx, StepMode mode);
    // Tokens self_prune could remove from hs (0: the policy cannot evict).
    uint32_t (*evictable)(const PolicyCtx &ctx, const HeadStore &hs);
    // The pool cannot supply the blocks for n new tokens: evict by the policy's own ranking.
    // Must remove at least one token when evictable() > 0; the core calls it until the blocks fit.
    void (*self_prune)(PolicyCtx &ctx, HeadStore &hs, uint32_t n);
};

// The table of cfg.policy (valid config).
const Policy &policy_of(const kvp_config &cfg);

// ---- helpers shared by the scored policies (policy.cpp) ----

// Scores of the store in logical order into out[0..len).
void scores_logical(const HeadStore &hs, const BlockPool &pool, float *out);
// Evicts the `n` tokens with the lowest score among logical [from, to), ties by older (lower
// index) first, in one compaction. scratch: 8 bytes per token of the store.
void evict_lowest(PolicyCtx &ctx, HeadStore &hs, uint32_t n, uint32_t from, uint32_t to, void *scratch);

}  // namespace kvp
