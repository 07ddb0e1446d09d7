// Lethe: layer- and time-adaptive KV cache pruning for reasoning-intensive generation. Semantics
// as pinned by DESIGN.md ("lethe"), with the paper's names: RASR (recency-aware selective
// retention) scores, a per-layer eviction threshold L_evict that adapts over time, and a
// segmented breakpoint search on the sorted scores that decides how many tokens a layer keeps,
// so each layer's length follows its own attention sparsity.
//
// Per layer (all KV heads of a layer keep the same tokens; decisions in the layer phase, heads
// reduced in fixed order; head_budget=ada: each head keeps its own, lethe.cpp "AdaKV over Lethe"):
// - Score: s_t = decay * s_{t-1} + m_t, m_t = the attention mass the token receives at step t
//   summed over all query heads of the layer (at prefill: over the chunk's last `obs_window`
//   queries too). Each KV head accumulates its group's mass in its slot scores (fused into the
//   attention pass); the layer score is the sum over KV heads in head order. The decay is applied
//   after each step's decision, so the stored value is decay * s_t and the next step's mass adds
//   on top.
// - Trigger: after a step, if L > min(L_evict, capacity - 1) (a round):
//   * R = floor(recent_ratio * L) most recent tokens and the first `sinks` are always kept; the
//     other K tokens are candidates.
//   * If L > L_evict: sort the candidates' scores descending (top[0] the largest); cut points
//     c_d = floor(K d / D), d = 1..D-1 (D = `segments`); the breakpoint is the first c_d with
//     top[0] > 0 and top[0] / top[c_d] >= sparse_ratio (tau). Found: keep the top c_d candidates
//     (+ sinks + recent), L_evict = max(L_evict, c_d + R). Not found (the scores have not fallen
//     by tau anywhere: a dense layer): L_evict *= 2 (saturating), nothing evicted by the search.
//   * Hard capacity (always binding): if the layer still holds more than capacity - 1 tokens (a
//     decode must be able to append), the lowest-ranked candidates go until it holds capacity - 1
//     (then recent tokens, oldest-ranked first, then sinks, if candidates do not suffice).
//   Rounds repeat whenever the layer grows past its threshold again (multi-round pruning).
// - Ranking everywhere: (score, position) ascending is the eviction order: the lowest score goes
//   first, the older token first on ties (DESIGN.md "eviction ties").
// - Shared pool: when a layer needs a block the pool will not give, it evicts by the same ranking
//   (same tokens in every head) before the step (layer_prepare), so sparse layers, which keep
//   few tokens, leave blocks that dense layers use: the arena holds total_capacity, not the sum
//   of the capacities.
// - kvp_get_layer_stats: evict_threshold = the current L_evict, sparsity = the Hoyer sparsity of
//   the layer's last decode row.
// Interpretations: the paper states the breakpoint as the point where scores have fallen by the
// factor tau (DESIGN.md's reading: a larger sparse_ratio keeps more tokens, as in the paper's
// ablation); K = 0 candidates is "not found". Defaults: capacity = 2 * budget (so L_evict starts
// at `budget`), evict_threshold = capacity / 2, sparse_ratio 400, recent_ratio 0.3, segments 10,
// decay 0.9, sinks 4 (the shared `sinks` key). Default positions: original.
// score=fixed: scores are Q16.16 sums (kernels/score_fixed.h), layer scores their uint64 sums,
// the decay multiplies by round(decay * 2^16) >> 16, and the breakpoint test is
// floor(top[0] * 2^16 / top[c]) >= round(tau * 2^16): integers only.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kLethePolicy;

}  // namespace kvp
