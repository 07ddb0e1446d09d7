#include "policies/full.h"


namespace kvp {
namespace {

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, kFullDefaultCapacity);
}

uint32_t evictable(const PolicyCtx &, const HeadStore &) { return 0; }

void self_prune(PolicyCtx &, HeadStore &, uint32_t) {}  // never called: evictable() is 0

}  // namespace

const Policy kFullPolicy = {"full", KVP_POS_ORIGINAL, nullptr, &plan, nullptr, nullptr, nullptr, &evictable,
                            &self_prune, nullptr,
                            /* state_bytes */ nullptr, /* reset */ nullptr, /* selection_size */ nullptr,
                            /* selection */ nullptr, /* keeps_prompt */ nullptr, /* observe_queries */ nullptr,
                            /* set_query_stats */ nullptr, /* state_kept */ nullptr, /* streaming_heads */ true};

}  // namespace kvp
