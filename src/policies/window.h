// Sliding window: the most recent `window` tokens (the classic local-attention baseline, e.g.
// Longformer's local window, Beltagy et al. 2020, Sec. 3.1; here without global tokens).
// It is the streaming rule (streaming.h) with S = 0, B = 0, R = 1, sigma = delta = 0: the new
// token is appended (attention covers window + 1 tokens), then the oldest is evicted, so the
// capacity is at least window + 1. Default positions: realign, like streaming.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kWindowPolicy;

}  // namespace kvp
