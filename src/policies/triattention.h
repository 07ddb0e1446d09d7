// TriAttention (Mao et al., arXiv 2604.04921; issue 32 item 3): decode-time eviction that scores each
// generated key by the attention a typical future query would pay it, from per-head statistics of
// the pre-RoPE queries. Keys `budget`, `beta` (shared with
// PyramidKV's steepness: for triattention a whole number, 128 unless given).
//
// Schedule (paper sec. 4, the reference's "slack" trigger): tokens added by kvp_prefill or
// kvp_append are the prompt and are never evicted; tokens added by kvp_decode are generated (marked
// in their slot score, as policy=random marks them). When a KV head holds budget + beta generated
// tokens after a decode, they are cut back to the `budget` best by score, so a head never holds
// more than budget + beta generated tokens; the prompt always stays. Default capacity: budget +
// beta + 2048 (the prompt's room, full's default capacity).
//
// Score (paper sec. 3; the reference's pruning_utils score_keys_for_round with mean aggregation).
// Pair f of a key (RoPE's pairing of the model: NEOX (i, i + n), GPTJ (2i, 2i + 1)) is the complex
// number k_f; per query head the statistics are the mean pre-RoPE query pair E[q_f] and the mean
// magnitude E|q_f| over every query the cache has seen. A key at position p, scored when the next
// query is at R = (newest position) + 1, gets
//     S = sum_f |E q_f| |k_f| mean_d cos((R - p + d) w_f + phi_f)  +  sum_f (E|q_f| - |E q_f|) |k_f|
// with phi_f = arg(E q_f conj k_f), w_f the pair's RoPE frequency and d over the geometric
// offsets 1, 2, 4, ..., 65536 (the reference's offset_max_length). kvprune holds the keys
// rotated at p, so the first sum is a dot product of the stored key with E[q] times
// W_f = mean_d e^(i d w_f), rotated to R: no RoPE inversion (the identity the reference's folded
// path uses). Ties are broken by position, the older evicted first (the reference adds seeded
// noise).
//
// Modes (`tri_mode`, the reference's three):
// - per_layer_perhead: each (layer, KV head) keeps its budget best by the maximum over its group's
//   query heads (the reference's default aggregation), in its own call.
// - per_head: one choice per KV head for every layer: the mean over layers of the group's maximum.
// - union (default, the reference's default): one choice for every layer and head: every (layer,
//   query head) nominates its budget best, and of the nominees those with the highest maximum over
//   all (layer, query head) scores stay; that is the budget best by the maximum, which the library
//   computes directly (triattention.cpp choose_shared).
// The shared modes decide in the layer phase of the last layer that runs the policy (the last
// non-sliding layer), when its stores hold budget + beta generated tokens, and evict from every
// layer there (LayerPlan::phase_all_layers); the earlier layers hold budget + beta until then, so
// the bound holds. The phase runs on the cache's threads (PolicyCtx::parallel): per_head one item
// per KV head; union scores one item per store, each participant into its own maxima (merged:
// maxima do not depend on the order), then evicts one item per KV head. Stores are matched by
// position (a store a dry shared pool made diverge loses the tokens the choice does not name).
//
// Interpretations (docs/DECISIONS.md "TriAttention"):
// - budget counts generated tokens only (the rule); the reference's keep step counts the
//   prompt in the budget while its trigger does not.
// - Statistics (tri_stats): online (default) = accumulated from the queries the cache sees (prefill
//   with queries and decode; a draft's accepted tokens when committed), per (layer, query head), in
//   double; given = the caller's (kvp_query_stats_set: the paper calibrates offline on other
//   text), kept across kvp_reset. Before any, every score is 0: the newest tokens stay.
// - Dimensions RoPE does not rotate (partial rotary past rope_dim, or a model without RoPE) count
//   as frequency-0 terms of one channel each: E[q_i] k_i + (E|q_i| - |E q_i|) |k_i|.
// - The RoPE attention factor scales every term alike and is left out.
// Keys are read as stored (PolicyCtx::key): score=fixed reads the fixed-point key copy, so every
// kv_dtype works and the scores are the same bits on every ISA and thread count; score=float needs
// kv_dtype=f32. positions=realign is refused (the distances would be the cache's, not the text's).
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kTriAttentionPolicy;

// The scores the cuts rank (a test hook: test_triattention ScoresAreThePapersFormula): KV head h
// of `layer` of a live triattention cache, each generated token i (logical order) scored for the
// next query (R = newest position + 1) by query head g of the group into per_g[g * ld + i], its
// position into pos[i]; scratch: 8-aligned, at least the layer's scratch (LayerPlan::scratch_bytes +
// scratch_per_token x (its store's cap + 1)). Returns the number of generated tokens.
uint32_t triattention_scores(const kvp_cache *c, uint32_t layer, uint32_t h, void *scratch, double *per_g, size_t ld,
                             int32_t *pos);

// Test hook (test_triattention AdaHeadAtItsMost): false makes head_budget=ada's cut sort every
// candidate instead of selecting the best when no head reaches its most (the same tokens).
extern bool tri_ada_select;

}  // namespace kvp
