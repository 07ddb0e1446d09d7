// PyramidKV: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
// Funneling" (2024), Sec. 3.3-3.4: SnapKV's selection (policies/snapkv.h, all its semantics)
// with a per-layer budget that shrinks linearly from the first layer to the last, since lower
// layers attend broadly and higher layers concentrate on few tokens.
//
// Budgets (DESIGN.md; reference KVCache-Factory PyramidKVCluster and kvpress PyramidKVPress):
// with w = obs_window and B = budget - w (max_capacity_prompt = budget, so the pyramid's mean is
// snapkv's budget and both use the same memory):
//   min = B / beta, max = 2B - min, prefix budget of layer l = round(max - l (max - min) / (L-1)),
//   layer budget = that + w.
// Interpretations:
// - Linear with rounding (kvpress); KVCache-Factory floors the step, which for small B makes
//   every layer take `max` and the sum exceed L * budget. Rounded, the sum is L * budget
//   within rounding.
// - beta must be >= 1 (kvpress asserts it; below 1 the pyramid inverts). beta = 1 is uniform
//   (min = max = B): exactly snapkv.
// - One layer (L = 1): its budget is `budget` (the mean; the reference divides by L - 1 = 0).
// - budget <= w: no pyramid is possible; every layer gets `budget`.
// - Never 0 tokens: a layer keeps at least w >= 1 (the window), and at least 1 when budget <= w.
// - The reference also reshapes the pyramid by the prompt length (max clamped to q_len - w) and
//   falls back to uniform budgets for short prompts. Here the budgets size each layer's store at
//   create (the arena is the exact sum), so they cannot depend on the prompt: a prompt shorter
//   than a layer's budget is simply kept whole there.
// - Capacity: budget_l + 1 by default (decode keeps budget_l tokens per layer, h2o-style, as in
//   snapkv); an explicit `capacity` adds the same slack (capacity - budget) to every layer.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kPyramidKvPolicy;

// The pyramid budget of `layer` (tokens kept from a prompt, window included).
uint32_t pyramid_budget(const kvp_config &cfg, uint32_t layer);

}  // namespace kvp
