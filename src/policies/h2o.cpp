#include "policies/h2o.h"


namespace kvp {

uint32_t dense_self_prune_count(const PolicyCtx &ctx, const HeadStore &hs, uint32_t n) {
    const BlockPool &pool = *ctx.pool;  // the core compacts before it asks (hs.holes == 0)
    const uint64_t room = (uint64_t(hs.nb) + pool.allowed(ctx.layer)) * pool.block;
    const uint64_t want = uint64_t(hs.roff) + hs.count + n;
    const uint64_t e = want > room ? want - room : 1;
    return e > hs.body_len() ? hs.body_len() : uint32_t(e);
}

namespace {

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (cfg.recent > cfg.budget) {
        m.s("h2o: recent=").u(cfg.recent).s(" must be <= budget=").u(cfg.budget);
        return KVP_ERR_CONFIG;
    }
    if (cfg.capacity && cfg.capacity <= cfg.budget) {
        m.s("h2o: capacity=").u(cfg.capacity).s(" must be >= budget+1=").u(uint64_t(cfg.budget) + 1)
            .s(" (the new token is appended before the eviction)");
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && cfg.budget >= kMaxCapacity) { m.s("h2o: budget exceeds the capacity limit"); return KVP_ERR_CONFIG; }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, cfg.budget + 1);
    p->decode_scores = true;
    // prompt scores (H2O, arXiv 2306.14048 sec. 4: the accumulated attention of every query):
    // all = every prefill query, fused into the prefill attention; window = the last obs_window
    p->obs_all = cfg.prompt_scores == 0;
    p->obs_queries = p->obs_all ? 0 : cfg.obs_window;
    p->scratch_bytes = size_t(p->cap) * 12;  // evict_lowest
    p->hole_cap = default_hole_cap(p->cap);
}

void observe(PolicyCtx &ctx, HeadStore &, const Run *runs, uint32_t nr, const Obs &obs) {
    add_observed_mass(ctx, runs, nr, obs);
}

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t L = hs.len();
    if (L <= cfg.budget) return;
    evict_lowest(ctx, hs, L - cfg.budget, 0, L - cfg.recent, ctx.scratch);
}

uint32_t evictable(const PolicyCtx &, const HeadStore &hs) { return hs.body_len(); }

void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) {
    const uint32_t e = dense_self_prune_count(ctx, hs, n), L = hs.len(), recent = ctx.cfg().recent;
    const uint32_t to = L >= recent && L - recent >= e ? L - recent : L;
    evict_lowest(ctx, hs, e, 0, to, ctx.scratch);
}

}  // namespace

const Policy kH2oPolicy = {"h2o", KVP_POS_ORIGINAL, &check, &plan, &observe, &prune, nullptr, &evictable,
                           &self_prune, nullptr,
                            /* state_bytes */ nullptr, /* reset */ nullptr, /* selection_size */ nullptr,
                            /* selection */ nullptr, /* keeps_prompt */ nullptr, /* observe_queries */ nullptr,
                            /* set_query_stats */ nullptr, /* state_kept */ nullptr, /* streaming_heads */ true};

}  // namespace kvp
