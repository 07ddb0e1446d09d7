// StreamingLLM with Lazy Pruning, Slack and Max_Drop.
//
// StreamingLLM: Xiao et al., "Efficient Streaming Language Models with Attention Sinks"
// (ICLR 2024), Sec. 3.2: keep the first `sinks` tokens (attention sinks) plus a rolling
// window, positions assigned within the cache (our `realign`, the default for this policy).
// Lazy Pruning / Slack / Max_Drop: Algorithm 1 of the "Lazy Pruning, Slack, Max_Drop"
// streaming-cache paper as stated in DESIGN.md: C = S + W + B, H = C + sigma; prune when
// R > 0 and L - C >= R; target L* = C if delta == 0 else min(max(L - delta, C), H); keep the
// first S and the most recent L* - S. Worked example: S,W,R,sigma,delta = 4,2044,32,16,32,
// a 2090-token prompt leaves 2058 (tests/test_streaming.cpp).
//
// Storage: the sinks are the store's pinned prefix, the window its body; pruning evicts the
// oldest body tokens by advancing the front (storage.h): O(1) per prune, no copies.
// Self-prune when the shared pool is dry: the oldest window tokens (the rule's own ranking),
// as many as free the front block.
// Interpretation: the rule is applied per KV head; all heads hold the same tokens.
#pragma once
#include <stdint.h>

#include "kvprune/kvprune.h"
#include "policies/policy.h"

namespace kvp {

struct StreamingRule {
    uint32_t sinks;     // S
    uint64_t C;         // S + W + B
    uint32_t R;         // compress_every (0: never)
    uint64_t H;         // C + sigma
    uint32_t max_drop;  // delta
};

// The rule of a streaming config (valid config only).
StreamingRule streaming_rule(const kvp_config &cfg);

// Smallest capacity under which the rule never runs out of slots: max(C + R, H).
uint64_t streaming_min_capacity(const StreamingRule &r);

// Target length after a layer of length L was appended to; L when the trigger does not fire.
uint32_t streaming_target(const StreamingRule &r, uint32_t L);

// Shared by streaming and window: prune hs to the rule's target by front eviction, and the
// front-eviction self-prune.
void streaming_apply(PolicyCtx &ctx, HeadStore &hs, const StreamingRule &r);
uint32_t ring_evictable(const PolicyCtx &ctx, const HeadStore &hs);
void ring_self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n);

extern const Policy kStreamingPolicy;

}  // namespace kvp
