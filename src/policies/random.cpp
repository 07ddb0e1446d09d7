#include "policies/random.h"

#include <string.h>

#include "policies/h2o.h"

namespace kvp {

namespace {

constexpr float kGenerated = 1.0f;  // slot score of a generated token (keep_prompt=1); prompt tokens 0

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

bool generated(const BlockPool &pool, uint32_t slot) {
    float s;
    memcpy(&s, pool.score + slot, sizeof s);
    return s == kGenerated;
}

// The candidates (slots, logical order): every live token, or the generated ones (keep_prompt=1).
uint32_t candidates(const PolicyCtx &ctx, const HeadStore &hs, uint32_t *slots) {
    const bool all = !ctx.cfg().keep_prompt;
    const BlockPool &pool = *ctx.pool;
    uint32_t m = 0;
    store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t) {
        for (uint32_t i = 0; i < n; ++i)
            if (all || generated(pool, slot + i)) slots[m++] = slot + i;
    });
    return m;
}

// Evicts k of the m candidate slots, drawn uniformly (partial Fisher-Yates on the store's draws).
void evict_random(PolicyCtx &ctx, HeadStore &hs, uint32_t *slots, uint32_t m, uint32_t k) {
    if (k > m) k = m;
    if (k == 0) return;
    const uint64_t e0 = hs.evicted;
    for (uint32_t i = 0; i < k; ++i) {
        const uint64_t r = random_draw(ctx.cfg().seed, ctx.layer, ctx.head, e0 + i) % (m - i);
        const uint32_t t = slots[i];
        slots[i] = slots[i + r];
        slots[i + r] = t;
    }
    store_evict(hs, *ctx.pool, ctx.layer, slots, k);
}

uint32_t *slot_scratch(const PolicyCtx &ctx) { return static_cast<uint32_t *>(ctx.scratch); }

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (!cfg.keep_prompt && cfg.capacity && cfg.capacity <= cfg.budget) {
        m.s("random: capacity=").u(cfg.capacity).s(" must be >= budget+1=").u(uint64_t(cfg.budget) + 1)
            .s(" (decode appends before it evicts)");
        return KVP_ERR_CONFIG;
    }
    if (cfg.keep_prompt && cfg.capacity && cfg.capacity <= cfg.budget) {
        m.s("random: capacity=").u(cfg.capacity).s(" must hold the prompt and budget+1=").u(uint64_t(cfg.budget) + 1)
            .s(" generated tokens (keep_prompt=1)");
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && uint64_t(cfg.budget) + 1 + (cfg.keep_prompt ? kFullDefaultCapacity : 0) > kMaxCapacity) {
        m.s("random: budget exceeds the capacity limit");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, cfg.budget + 1 + (cfg.keep_prompt ? kFullDefaultCapacity : 0));
    p->hole_cap = default_hole_cap(p->cap);
    p->scratch_per_token = sizeof(uint32_t);  // the candidates' slots
}

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    const kvp_config &cfg = ctx.cfg();
    uint32_t *slots = slot_scratch(ctx);
    if (cfg.keep_prompt) {
        if (mode != StepMode::kDecode) return;  // prompt tokens stay
        uint32_t last = 0;  // the new token: the store's last
        store_for_each_live(hs, *ctx.pool, [&](uint32_t slot, uint32_t n, uint32_t) { last = slot + n - 1; });
        if (hs.len()) memcpy(ctx.pool->score + last, &kGenerated, sizeof kGenerated);
    }
    const uint32_t m = candidates(ctx, hs, slots);
    if (m > cfg.budget) evict_random(ctx, hs, slots, m, m - cfg.budget);
}

uint32_t evictable(const PolicyCtx &ctx, const HeadStore &hs) {
    if (!ctx.cfg().keep_prompt) return hs.body_len();
    uint32_t g = 0;
    const BlockPool &pool = *ctx.pool;
    store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t) {
        for (uint32_t i = 0; i < n; ++i) g += generated(pool, slot + i);
    });
    return g;
}

void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) {
    uint32_t *slots = slot_scratch(ctx);
    const uint32_t m = candidates(ctx, hs, slots);
    evict_random(ctx, hs, slots, m, dense_self_prune_count(ctx, hs, n));
}

// keep_prompt=1 never selects from a prompt: under max_prompt the layers hold it within capacity.
bool keeps_prompt(const kvp_config &cfg) { return cfg.keep_prompt != 0; }

}  // namespace

uint64_t random_draw(uint32_t seed, uint32_t layer, uint32_t head, uint64_t e) {
    return splitmix64(splitmix64(splitmix64((uint64_t(seed) << 32) | layer) ^ head) ^ e);
}

const Policy kRandomPolicy = {"random", KVP_POS_ORIGINAL, &check,   &plan,   nullptr,    &prune,  nullptr,
                              &evictable, &self_prune,    nullptr,  nullptr, nullptr,    nullptr, nullptr,
                              &keeps_prompt, /* observe_queries */ nullptr, /* set_query_stats */ nullptr,
                              /* state_kept */ nullptr, /* streaming_heads */ true};

}  // namespace kvp
