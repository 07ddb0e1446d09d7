#include "policies/pyramidkv.h"

#include <math.h>

#include "policies/snapkv.h"

namespace kvp {

uint32_t pyramid_keep(const kvp_config &cfg, uint32_t layer, uint32_t q_len) {
    const uint32_t L = cfg.model.n_layers, w = cfg.obs_window, B = cfg.budget;
    if (B <= w || L == 1) return B;
    const double S = double(B - w);
    // a prompt below the budget is kept whole; below 2S every layer keeps the budget (uniform)
    if (q_len < B || double(q_len) < 2.0 * S) return B;
    double mn = floor(S / double(cfg.beta)), mx = 2.0 * S - mn;
    if (mx >= double(q_len) - w) {  // clamp the top to what the prompt has, and redistribute
        mx = double(q_len) - w;
        mn = 2.0 * S - mx;
    }
    const double sel = floor(mx - double(layer) * (mx - mn) / double(L - 1) + 0.5);
    return uint32_t(sel < 0.0 ? 0.0 : sel) + w;
}

uint32_t pyramid_budget(const kvp_config &cfg, uint32_t layer) {
    const uint32_t w = cfg.obs_window, B = cfg.budget;
    uint32_t most = B;  // short prompts: uniform
    if (B <= w || cfg.model.n_layers == 1) return most;
    // long prompts: the unclamped pyramid; between, the clamped one is linear in q_len on each
    // side of the clamp, so its extremes are the clamp's ends: enumerate the clamped range
    const uint64_t S = B - w, lo = 2 * S, hi = lo + w + uint64_t(floor(double(S) / double(cfg.beta))) + 1;
    for (uint64_t q = lo; q <= hi; ++q) {
        const uint32_t qq = uint32_t(q > kMaxCapacity ? kMaxCapacity : q), k = pyramid_keep(cfg, layer, qq);
        if ((k < qq ? k : qq) > most) most = k < qq ? k : qq;  // a selection keeps at most its q tokens
    }
    return most;
}

namespace {

// The generation room beyond a layer's share (the plan's: capacity - budget, else G).
uint32_t gen_room(const kvp_config &cfg) { return cfg.capacity ? cfg.capacity - cfg.budget : snapkv_gen_room(cfg); }

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (!(cfg.beta >= 1.0f)) {
        m.s("pyramidkv: beta must be >= 1 (min = (budget - obs_window) / beta must not exceed the mean)");
        return KVP_ERR_CONFIG;
    }
    kvp_status st = snapkv_check_common("pyramidkv", cfg, m);
    if (st != KVP_OK) return st;
    const uint64_t top = uint64_t(pyramid_budget(cfg, 0)) + gen_room(cfg);
    if (top > kMaxCapacity) {
        m.s("pyramidkv: the first layer's capacity ").u(top).s(" exceeds the capacity limit");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t layer, LayerPlan *p) {
    const uint32_t b = pyramid_budget(cfg, layer);
    snapkv_plan(cfg, b, b + gen_room(cfg), p);
}

// The selection keeps the layer's share for the tokens it selects from (the prompt, or what the
// layer holds plus a chunk), and decode then holds that share + the generation room (less one
// slot, as capacity - 1), not the store's capacity, which is sized for the largest share over
// every prompt length: the head's HeadStore::pword[0] (0 before any selection, and after a
// reset: the store's capacity; saved with the state).
void prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    const kvp_config &cfg = ctx.cfg();
    const bool selects = ctx.staged || ctx.prompt_w;
    const uint32_t keep = selects ? pyramid_keep(cfg, ctx.layer, hs.len() + ctx.staged) : 0;
    if (selects) hs.pword[0] = uint64_t(keep) + gen_room(cfg);
    const uint64_t limit = hs.pword[0];
    snapkv_prune_keep(ctx, hs, mode, keep, uint32_t(limit < hs.cap ? limit : hs.cap));
}

// head_budget=ada: the layer's share is split over its heads (snapkv.cpp "AdaKV"); each head's decode
// limit is what it kept + the generation room.
uint32_t ada_budget_of(const PolicyCtx &ctx, uint32_t L) { return pyramid_keep(ctx.cfg(), ctx.layer, L); }
void ada_after(const PolicyCtx &ctx, HeadStore &hs, uint32_t kept, uint32_t) { hs.pword[0] = uint64_t(kept) + gen_room(ctx.cfg()); }
void layer_phase(PolicyCtx &ctx, StepMode) {
    if (ctx.cfg().head_budget == KVP_HEAD_BUDGET_ADA) snapkv_ada_phase(ctx, &ada_budget_of, &ada_after);
}

}  // namespace

const Policy kPyramidKvPolicy = {"pyramidkv",    KVP_POS_ORIGINAL, &check,           &plan,    &snapkv_observe,
                                 &prune,         &layer_phase,     &snapkv_evictable, &snapkv_self_prune, nullptr,
                                 /* state_bytes */ &snapkv_state_bytes, /* reset */ nullptr,
                                 /* selection_size */ nullptr, /* selection */ nullptr, /* keeps_prompt */ nullptr,
                                 /* observe_queries */ nullptr, /* set_query_stats */ nullptr, /* state_kept */ nullptr,
                                 /* streaming_heads */ false, /* state_transient */ true, /* phase_bytes */ &snapkv_phase_bytes};

}  // namespace kvp
