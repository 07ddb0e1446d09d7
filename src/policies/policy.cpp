#include "policies/policy.h"

#include <string.h>

#include <algorithm>

#include "kernels/score_f32.h"
#include "kernels/score_fixed.h"
#include "policies/full.h"
#include "policies/asl.h"
#include "policies/h2o.h"
#include "policies/lethe.h"
#include "policies/pyramidkv.h"
#include "policies/random.h"
#include "policies/simlayerkv.h"
#include "policies/snapkv.h"
#include "policies/streaming.h"
#include "policies/triattention.h"
#include "policies/window.h"

namespace kvp {

const Policy &policy_table(kvp_policy p) {
    switch (p) {
        case KVP_POLICY_WINDOW: return kWindowPolicy;
        case KVP_POLICY_STREAMING: return kStreamingPolicy;
        case KVP_POLICY_H2O: return kH2oPolicy;
        case KVP_POLICY_SNAPKV: return kSnapKvPolicy;
        case KVP_POLICY_PYRAMIDKV: return kPyramidKvPolicy;
        case KVP_POLICY_LETHE: return kLethePolicy;
        case KVP_POLICY_SIMLAYERKV: return kSimLayerKvPolicy;
        case KVP_POLICY_ASL: return kAslPolicy;
        case KVP_POLICY_RANDOM: return kRandomPolicy;
        case KVP_POLICY_TRIATTENTION: return kTriAttentionPolicy;
        default: break;
    }
    return kFullPolicy;
}

// policy=think is a channel axis (quant/think.h) over the token policy `token_policy`, whose
// table runs everything token-level.
const Policy &policy_of(const kvp_config &cfg) {
    return policy_table(cfg.policy == KVP_POLICY_THINK ? cfg.token_policy : cfg.policy);
}

void scores_logical(const HeadStore &hs, const BlockPool &pool, float *out, uint32_t *slots) {
    store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t j) {
        memcpy(out + j, pool.score + slot, n * sizeof(float));
        if (slots)
            for (uint32_t i = 0; i < n; ++i) slots[j + i] = slot + i;
    });
}

void evict_lowest(PolicyCtx &ctx, HeadStore &hs, uint32_t n, uint32_t from, uint32_t to, void *scratch) {
    if (n == 0 || to <= from) return;
    if (n > to - from) n = to - from;
    const BlockPool &pool = *ctx.pool;
    const bool fixed = ctx.fixed();
    if (n == 1 && fixed) {  // fixed-point scores: the first (oldest) minimum, in place
        uint32_t best = 0, best_slot = 0;
        bool found = false;
        store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t m, uint32_t j) {
            const uint32_t a = j > from ? j : from, b = j + m < to ? j + m : to;
            for (uint32_t i = a; i < b; ++i) {
                const uint32_t v = score_u(pool, slot + (i - j));
                if (!found || v < best) {
                    best = v;
                    best_slot = slot + (i - j);
                    found = true;
                }
            }
        });
        store_evict(hs, *ctx.pool, ctx.layer, &best_slot, 1);
        return;
    }
    if (n == 1) {  // the common decode case: the kernel's argmin over each live stretch, in place
        const kern::ScoreF32 &S = ctx.score_kernels();
        float best = 0.0f;
        uint32_t best_slot = 0;
        bool found = false;
        store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t m, uint32_t j) {
            const uint32_t a = j > from ? j : from, b = j + m < to ? j + m : to;
            if (a >= b) return;
            const uint32_t i = S.argmin(pool.score + slot + (a - j), b - a);
            const float v = pool.score[slot + (a - j) + i];
            if (!found || v < best) {  // strict: an earlier stretch (older token) wins a tie
                best = v;
                best_slot = slot + (a - j) + i;
                found = true;
            }
        });
        store_evict(hs, *ctx.pool, ctx.layer, &best_slot, 1);
        return;
    }
    const uint32_t L = hs.len();
    float *score = static_cast<float *>(scratch);
    uint32_t *slot = reinterpret_cast<uint32_t *>(score + L);
    uint32_t *idx = slot + L;
    scores_logical(hs, pool, score, slot);
    uint32_t m = 0;
    for (uint32_t j = from; j < to; ++j) idx[m++] = j;
    // A strict total order (score, then index), so the chosen set is unique.
    if (fixed) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(static_cast<const void *>(score));
        auto lower_u = [u](uint32_t a, uint32_t b) { return u[a] < u[b] || (u[a] == u[b] && a < b); };
        std::nth_element(idx, idx + (n - 1), idx + m, lower_u);
    } else {
        auto lower = [score](uint32_t a, uint32_t b) { return score[a] < score[b] || (score[a] == score[b] && a < b); };
        std::nth_element(idx, idx + (n - 1), idx + m, lower);
    }
    for (uint32_t i = 0; i < n; ++i) idx[i] = slot[idx[i]];
    store_evict(hs, *ctx.pool, ctx.layer, idx, n);
}

void add_observed_mass(PolicyCtx &ctx, const Run *runs, uint32_t nr, const Obs &obs) {
    const uint32_t G = ctx.group();
    const size_t ld = obs.ld;
    BlockPool &pool = *ctx.pool;
    for (uint32_t r = 0; r < nr; ++r) {
        for (uint32_t i = 0; i < runs[r].n; ++i) {
            const uint32_t j = runs[r].logical + i, slot = runs[r].slot + i;
            if (obs.u) {
                uint64_t a = 0;
                for (uint32_t g = 0; g < G; ++g) a += obs.u[g * ld + j];
                score_set_u(pool, slot, fixed::sat_add(score_u(pool, slot), a));
            } else {
                float a = obs.f[j];
                for (uint32_t g = 1; g < G; ++g) a += obs.f[g * ld + j];
                pool.score[slot] += a;
            }
        }
    }
}

}  // namespace kvp
