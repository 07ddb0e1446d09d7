// ASL: Taniguchi, Dong, Onizuka, Xiao, "Adaptive Layer Selection for Layer-Wise Token Pruning in
// LLM Inference" (2026, arXiv:2601.07667), Sec. 3 (pooled scores, token-rank variance over the
// recent layers, the relative-variance test against tau) with SnapKV (Sec. 4, "ASL + SnapKV")
// compressing the layers up to the selection layer and for decoding.
//
// During a prompt's prefill each layer from `asl_min_layer` (default floor(L/3)) is scored like
// SnapKV: the last `obs_window` queries vote, the votes are pooled (`pool`, `pool_kernel`) and
// summed over all heads, and the prefix tokens (the window excluded) are ranked by that score.
// The ranks of the last `asl_obs_layers` layers are kept in the arena. The rank variance of a
// layer is the mean, over the union of those layers' top-k tokens, of each token's variance of
// rank across them; the relative variance divides it by the same figure at asl_min_layer. The
// first layer at or after asl_min_layer whose relative variance is below `asl_tau` is the
// selection layer: its kvp_prefill fills the caller's kvp_selection with its top-k prefix
// tokens plus the observation window (k = budget - window, so `budget` tokens, ascending). The
// caller passes only those tokens (with their original positions) to the later layers, which
// keep them. Every layer compresses its own prompt with SnapKV to `budget` (layers up to and
// including the selection layer, and every layer when no layer qualifies); decoding follows
// SnapKV's decode rule (snapkv.h).
//
// Our reading where the paper is terse, pinned here:
// - Ranks: 0 = the highest score; ties go to the newer token (SnapKV's rule). Variance is the
//   population variance (divide by the number of layers m) of a token's ranks in the m layers.
// - The rank window at layer l holds the layers max(l - asl_obs_layers + 1, s) .. l, where
//   ranks are collected from s = max(0, asl_min_layer - asl_obs_layers + 1), so the reference
//   figure at asl_min_layer already spans asl_obs_layers layers (when asl_min_layer allows it).
//   A figure needs at least two layers (one if asl_obs_layers = 1): with asl_min_layer = 0 the
//   reference is taken at layer 1. A reference of 0 makes the relative variance 0 where the
//   variance is 0 and +inf elsewhere.
// - Without max_prompt, only a prompt given in one kvp_prefill call per layer (the layer empty
//   before it, more than `budget` tokens, within `prefill_stage`) is scored; chunked prompts get
//   plain SnapKV.
// - With max_prompt (issue 28, prompt.h) the selection is made when the prompt ends, from the
//   whole prompt, whatever its chunking: every layer takes every prompt token (no kvp_selection
//   is returned: the caller propagates all of them), the prompt's end scores the layers in order
//   (a layer from collect_start, no selection yet in this sequence, more than `budget` tokens
//   held: the whole store, so a chat's later prompt counts what the layer held before it), and
//   the layers after the selection layer keep exactly the selection at their ends. Layers up to
//   the selection layer see the same inputs as in the one-call protocol, so the selection layer
//   and every layer's kept positions are the one-call protocol's; the K/V the later layers keep
//   differ (they were computed with the whole prompt in view, not the selection alone) and the
//   prefill saves no compute. Pinned by test_asl MaxPromptSelectsAtThePromptsEndAsOneCallDoes.
// - The scores are the SnapKV votes per KV head (pooled per query head, group mean), summed over
//   the KV heads in fixed head order (float: float sums; score=fixed: the exact integer sums),
//   so the selection layer and the selection are the same for every thread count.
// - A prefill that may select (policy asl, no selection made yet in this sequence, a layer at or
//   after asl_min_layer, with q, more than `budget` tokens, the layer empty) needs a
//   kvp_selection of capacity >= budget: otherwise KVP_ERR_BUFFER before anything changes.
// Default positions: original.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kAslPolicy;

// Diagnostics (tests, harness): the rank variance and relative variance ASL computed at `layer`
// in the current sequence (NaN when it computed none), and the selection layer (-1: none yet).
bool asl_layer_variance(const kvp_cache *c, uint32_t layer, double *var, double *rel);
int32_t asl_selection_layer(const kvp_cache *c);
// kvp_state_load (issue 29): whether the `bytes` of a state region (little-endian, as saved) are an
// ASL state of this cache: every index and count (selection layer and size, selected token indices,
// rank ring) in range. The float statistics may hold NaN (not computed) and are not indices.
bool asl_state_check(const kvp_cache *c, const uint8_t *region, size_t bytes);

}  // namespace kvp
