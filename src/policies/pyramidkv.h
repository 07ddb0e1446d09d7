// PyramidKV: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
// Funneling" (2024), Sec. 3.3-3.4: SnapKV's selection (policies/snapkv.h, all its semantics)
// with a per-layer budget that shrinks linearly from the first layer to the last, since lower
// layers attend broadly and higher layers concentrate on few tokens.
//
// Budgets (DESIGN.md; reference KVCache-Factory PyramidKVCluster.update_kv, kvpress
// PyramidKVPress): with w = obs_window, S = budget - w (max_capacity_prompt = budget, so the
// pyramid's mean is snapkv's budget) and q = the tokens the selection runs over (the prompt):
//   q < budget: kept whole; q < 2S: every layer keeps `budget` (uniform);
//   else min = floor(S / beta), max = 2S - min; if max >= q - w: max = q - w, min = 2S - max
//   (the top layer would keep the whole prompt: clamp it and give the rest to the lower
//   layers); layer l keeps round(max - l (max - min) / (L-1)) + w.
// Interpretations:
// - The step is not floored (kvpress rounds each layer): KVCache-Factory floors the step, which
//   for small S makes every layer take `max` and the sum exceed L * budget. Rounded, the sum is
//   L * budget within rounding at every prompt length.
// - beta must be >= 1 (kvpress asserts it; below 1 the pyramid inverts). beta = 1 is uniform.
// - One layer (L = 1), or budget <= w: every layer keeps `budget`.
// - q is what the selection runs over: the prompt in one call or at its end (max_prompt), else
//   what the layer holds plus the chunk.
// - Arena: a layer's store holds its largest share over every prompt length (pyramid_budget:
//   `budget` for the lower layers, whose share grows toward the mean on short prompts) plus the
//   generation room, so the arena is larger than snapkv's at the same budget (the sum of
//   max(budget, the long-prompt share)), while the tokens kept sum to L * budget.
// - Capacity: the layer's share + G (max_new=G, default G = budget, as snapkv); an explicit
//   `capacity` adds capacity - budget to every layer instead.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kPyramidKvPolicy;

// Tokens `layer` keeps from a selection over q_len tokens (window included).
uint32_t pyramid_keep(const kvp_config &cfg, uint32_t layer, uint32_t q_len);
// The most pyramid_keep gives `layer` over every q_len: its store's budget (LayerPlan::budget).
uint32_t pyramid_budget(const kvp_config &cfg, uint32_t layer);

}  // namespace kvp
