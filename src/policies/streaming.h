// StreamingLLM with Lazy Pruning, Slack and Max_Drop.
//
// StreamingLLM: Xiao et al., "Efficient Streaming Language Models with Attention Sinks"
// (ICLR 2024), Sec. 3.2: keep the first `sinks` tokens (attention sinks) plus a rolling
// window, positions assigned within the cache (our `realign`).
// Lazy Pruning / Slack / Max_Drop: Algorithm 1 of the "Lazy Pruning, Slack, Max_Drop"
// streaming-cache paper as stated in DESIGN.md: C = S + W + B, H = C + sigma; prune when
// R > 0 and L - C >= R; target L* = C if delta == 0 else min(max(L - delta, C), H); keep the
// first S and the most recent L* - S. Worked example: S,W,R,sigma,delta = 4,2044,32,16,32,
// a 2090-token prompt leaves 2058 (tests/test_streaming.cpp).
//
// The `window` policy is the same rule with S = 0, B = 0, R = 1, sigma = delta = 0: the new
// token is appended (attention covers window + 1 tokens), then the oldest is evicted.
// Interpretation: the rule is applied per KV head; all heads hold the same tokens.
#pragma once
#include <stdint.h>

#include "kvprune/kvprune.h"

namespace kvp {

struct StreamingRule {
    uint32_t sinks;     // S
    uint64_t C;         // S + W + B
    uint32_t R;         // compress_every (0: never)
    uint64_t H;         // C + sigma
    uint32_t max_drop;  // delta
};

// The rule of a streaming or window config (valid config only).
StreamingRule streaming_rule(const kvp_config &cfg);

// Smallest capacity under which the rule never runs out of slots: max(C + R, H).
uint64_t streaming_min_capacity(const StreamingRule &r);

// Target length after a layer of length L was appended to; L when the trigger does not fire.
uint32_t streaming_target(const StreamingRule &r, uint32_t L);

}  // namespace kvp
