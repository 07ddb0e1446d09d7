#include "policies/window.h"

#include "policies/streaming.h"

namespace kvp {
namespace {

StreamingRule rule(const kvp_config &cfg) {
    StreamingRule r;
    r.sinks = 0;
    r.C = cfg.window;
    r.R = 1;
    r.H = cfg.window;
    r.max_drop = 0;
    return r;
}

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (cfg.window == 0) { m.s("window must be >= 1"); return KVP_ERR_CONFIG; }
    if (cfg.capacity && uint64_t(cfg.window) + 1 > cfg.capacity) {
        m.s("window=").u(cfg.window).s(" needs capacity >= window+1 (the new token is appended before the oldest is evicted), capacity=").u(cfg.capacity);
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && uint64_t(cfg.window) + 1 > kMaxCapacity) { m.s("window exceeds the capacity limit"); return KVP_ERR_CONFIG; }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, cfg.window + 1);
    p->front_evict = true;
}

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode) { streaming_apply(ctx, hs, rule(ctx.cfg())); }

}  // namespace

const Policy kWindowPolicy = {"window", KVP_POS_REALIGN, &check, &plan, nullptr, &prune, nullptr,
                              &ring_evictable, &ring_self_prune, nullptr,
                            /* state_bytes */ nullptr, /* reset */ nullptr, /* selection_size */ nullptr,
                            /* selection */ nullptr, /* keeps_prompt */ nullptr, /* observe_queries */ nullptr,
                            /* set_query_stats */ nullptr, /* state_kept */ nullptr, /* streaming_heads */ true};

}  // namespace kvp
