// SnapKV: Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation" (NeurIPS
// 2024), Sec. 4.2 and Listing 1: the last `obs_window` prompt queries (the observation window)
// vote for the earlier prompt tokens with their attention weights; the votes are pooled
// (`pool=avg|max`, `pool_kernel`) so that neighbours of a selected token come along, and each
// KV head keeps the `budget - obs_window` best-voted prefix tokens plus the window itself.
//
// Our reading of the reference code (FasterDecoding/SnapKV snapkv_utils.py, KVCache-Factory
// pyramidkv_utils.py SnapKVCluster, NVIDIA kvpress snapkv_press.py), pinned here:
// - Votes: softmax rows of the window's queries over ALL keys the layer sees (prefix, window,
//   causal within the window), summed over the window's queries. Only prefix keys receive
//   votes: the window's own keys are always kept and are not pooled (`[..., :-window]`).
// - Pooling along the key axis per query head, stride 1, padding kernel/2 (kernel must be odd):
//   avg = F.avg_pool1d with count_include_pad (zeros outside, always divided by the kernel);
//   max = F.max_pool1d (padding never wins). Pooling runs over the prefix only.
// - GQA: pooled per query head, then averaged over the query heads of the KV head's group
//   (kvpress, SnapKV issue #22: pool first, then mean). The original repeats K/V per query head
//   instead; the mean is what a GQA cache can store.
// - Selection: top `budget - w` prefix tokens by vote per KV head plus the w window tokens; a
//   prompt of at most `budget` tokens is kept whole (reference: `if q_len < max_capacity_prompt`).
//   Ties (torch.topk leaves them unspecified) go to the newer token: the older is evicted first.
// Interpretations where the reference is silent or cannot apply:
// - w = min(obs_window, chunk length): the observing queries are the chunk's last tokens.
//   budget < w keeps the last `budget` tokens (the window is clamped).
// - Chunked prompts (the host calls kvp_prefill more than once): each call is one SnapKV
//   selection over what the layer holds plus the new chunk, voted by THIS chunk's window, which
//   sees every held and new token. Votes do not accumulate across calls: SnapKV's premise is
//   that the window at the end of the prompt predicts what generation needs, and the last
//   call's window is that one; a one-call prompt is exactly SnapKV. Pooling runs over the
//   layer's logical order (held tokens are adjacent even if their positions are not).
// - The prompt need not fit the layer: a prefill with queries goes through the prompt staging
//   area (policy.h; `prefill_stage` tokens per call, default max(1024, capacity)), so a 200-token
//   prompt into `budget=48` takes one call with the default capacity.
// - Decode (the paper leaves generated tokens uncompressed): tokens append; once the layer would
//   exceed its capacity (it holds capacity - 1), the token with the lowest accumulated score
//   outside the `recent` most recent is evicted, older first on ties (h2o's rule). The score is
//   the h2o score: the attention mass each token received from the observed prefill queries
//   (raw, summed over the group: the window keys have no votes) plus every decode step's.
//   Default capacity budget + G (issue 28: `max_new=G`, default G = budget): the papers keep the
//   prompt's selection and append every generated token, so for G generated tokens nothing is
//   evicted (the G-th decode still attends over the whole selection; its prune is the first);
//   after that the layer holds capacity - 1 tokens and evicts one per step by this rule. An
//   explicit capacity overrides G (below budget + max_new, when max_new is given, it is refused).
// - score=fixed: votes are the Q16 weight sums (kernels/score_fixed.h); avg pooling is the
//   kernel sum and the GQA mean the group sum (same order, no rounding).
// - A shared pool that cannot hold the selection keeps the best that fits (window first).
// Default positions: original.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kSnapKvPolicy;

// Shared with pyramidkv (which differs only in the per-layer budget and capacity):
// the prefill selection, the h2o-style decode rule, the dry-pool self-prune.
void snapkv_observe(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const Obs &obs);
void snapkv_prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode);
// The same with the selection keeping `budget` tokens (pyramidkv: its layer's share of the prompt)
// and decode holding at most limit - 1 (0: the store's capacity).
void snapkv_prune_keep(PolicyCtx &ctx, HeadStore &hs, StepMode mode, uint32_t budget, uint32_t limit);
// A selection (staged chunk or a prompt's end) that keeps exactly the logical tokens keep[0..n)
// (ascending, < hs.len() + ctx.staged) and evicts the rest (asl's layers after its selection).
void snapkv_keep_only(PolicyCtx &ctx, HeadStore &hs, const int32_t *keep, uint32_t n);
// The generation room G of the default capacity budget + G: max_new, or budget when 0.
uint32_t snapkv_gen_room(const kvp_config &cfg);
// The votes snapkv_observe computed for the head's staged selection (valid until its prune):
// prefix token j's vote at [j], double in float mode, uint64_t in fixed mode.
const void *snapkv_votes(const PolicyCtx &ctx, const HeadStore &hs);
uint32_t snapkv_evictable(const PolicyCtx &ctx, const HeadStore &hs);
void snapkv_self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n);
// head_budget=ada (snapkv.cpp "AdaKV"): the layer phase's allocation and commit of every head whose
// prune deferred its selection; budget_of gives a head's uniform budget for a selection over L
// tokens, after (may be NULL) is told each head's kept count and its share (what uniform keeps)
// once it committed.
void snapkv_ada_phase(PolicyCtx &ctx, uint32_t (*budget_of)(const PolicyCtx &, uint32_t L),
                      void (*after)(const PolicyCtx &, HeadStore &, uint32_t kept, uint32_t share));
// head_budget=ada: the votes region (policy.h state_bytes, transient) and the layer phase's
// candidates and kept marks (policy.h phase_bytes); 0 bytes with head_budget=uniform.
size_t snapkv_state_bytes(const kvp_config &cfg, uint32_t stage);
size_t snapkv_phase_bytes(const kvp_config &cfg, uint32_t stage);
// The plan of a layer that keeps `budget` prompt tokens in a store of `cap` slots.
void snapkv_plan(const kvp_config &cfg, uint32_t budget, uint32_t cap, LayerPlan *p);
// Checks shared by snapkv and pyramidkv.
kvp_status snapkv_check_common(const char *name, const kvp_config &cfg, Msg &m);

}  // namespace kvp
