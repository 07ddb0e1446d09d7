#include "policies/streaming.h"


namespace kvp {

StreamingRule streaming_rule(const kvp_config &cfg) {
    StreamingRule r;
    r.sinks = cfg.sinks;
    r.C = uint64_t(cfg.sinks) + cfg.window + cfg.extra;
    r.R = cfg.compress_every;
    r.H = r.C + cfg.slack;
    r.max_drop = cfg.max_drop;
    return r;
}

uint64_t streaming_min_capacity(const StreamingRule &r) {
    uint64_t a = r.C + r.R;
    return a > r.H ? a : r.H;
}

uint32_t streaming_target(const StreamingRule &r, uint32_t L) {
    if (r.R == 0 || L < r.C || uint64_t(L) - r.C < r.R) return L;
    if (r.max_drop == 0) return uint32_t(r.C);
    uint64_t t = L > r.max_drop ? uint64_t(L) - r.max_drop : 0;  // L - delta, floored at 0
    if (t < r.C) t = r.C;
    if (t > r.H) t = r.H;
    return uint32_t(t);
}

void streaming_apply(PolicyCtx &ctx, HeadStore &hs, const StreamingRule &r) {
    const uint32_t L = hs.len(), target = streaming_target(r, L);
    if (target < L) store_evict_front(hs, *ctx.pool, ctx.layer, L - target, ctx.realign());
}

uint32_t ring_evictable(const PolicyCtx &, const HeadStore &hs) { return hs.body_len(); }

void ring_self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t) {
    // the tokens of the front block: evicting them returns that block to the pool
    const uint32_t block = ctx.pool->block;
    uint32_t e = block - hs.roff;
    if (e > hs.count) e = hs.count;
    store_evict_front(hs, *ctx.pool, ctx.layer, e, ctx.realign());
}

namespace {

kvp_status check(const kvp_config &cfg, Msg &m) {
    const StreamingRule r = streaming_rule(cfg);
    if (r.C == 0) { m.s("streaming: sinks+window+extra must be >= 1"); return KVP_ERR_CONFIG; }
    const uint64_t need = streaming_min_capacity(r);
    if (cfg.capacity && need > cfg.capacity) {
        m.s("streaming: capacity=").u(cfg.capacity).s(" is below max(C+R, H)=").u(need).s(" (C=sinks+window+extra=")
            .u(r.C).s(", R=compress_every=").u(r.R).s(", H=C+slack=").u(r.H).s(")");
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && need > kMaxCapacity) { m.s("streaming: max(C+R, H) exceeds the capacity limit"); return KVP_ERR_CONFIG; }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, uint32_t(streaming_min_capacity(streaming_rule(cfg))));
    p->pin_cap = cfg.sinks;
    p->front_evict = true;
}

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode) { streaming_apply(ctx, hs, streaming_rule(ctx.cfg())); }

}  // namespace

const Policy kStreamingPolicy = {"streaming", KVP_POS_REALIGN, &check, &plan, nullptr, &prune, nullptr,
                                 &ring_evictable, &ring_self_prune, nullptr,
                            /* state_bytes */ nullptr, /* reset */ nullptr, /* selection_size */ nullptr,
                            /* selection */ nullptr, /* keeps_prompt */ nullptr, /* observe_queries */ nullptr,
                            /* set_query_stats */ nullptr, /* state_kept */ nullptr, /* streaming_heads */ true};

}  // namespace kvp
