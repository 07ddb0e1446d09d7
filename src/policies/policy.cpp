#include "policies/policy.h"

#include <algorithm>

#include "cache.h"
#include "policies/full.h"
#include "policies/h2o.h"
#include "policies/streaming.h"
#include "policies/window.h"

namespace kvp {

const Policy &policy_of(const kvp_config &cfg) {
    switch (cfg.policy) {
        case KVP_POLICY_WINDOW: return kWindowPolicy;
        case KVP_POLICY_STREAMING: return kStreamingPolicy;
        case KVP_POLICY_H2O: return kH2oPolicy;
        default: break;
    }
    return kFullPolicy;
}

void scores_logical(const HeadStore &hs, const BlockPool &pool, float *out) {
    const uint32_t L = hs.len();
    for (uint32_t j = 0; j < L; ++j) out[j] = pool.score[store_slot(hs, pool.block, j)];
}

void evict_lowest(PolicyCtx &ctx, HeadStore &hs, uint32_t n, uint32_t from, uint32_t to, void *scratch) {
    if (n == 0 || to <= from) return;
    if (n > to - from) n = to - from;
    const uint32_t L = hs.len();
    float *score = static_cast<float *>(scratch);
    uint32_t *idx = reinterpret_cast<uint32_t *>(score + L);
    scores_logical(hs, *ctx.pool, score);
    if (n == 1) {  // the common decode case: one linear scan
        uint32_t best = from;
        for (uint32_t j = from + 1; j < to; ++j)
            if (score[j] < score[best]) best = j;  // strict: the older token wins a tie
        idx[0] = best;
    } else {
        uint32_t m = 0;
        for (uint32_t j = from; j < to; ++j) idx[m++] = j;
        // A strict total order (score, then index), so the chosen set is unique.
        auto lower = [score](uint32_t a, uint32_t b) { return score[a] < score[b] || (score[a] == score[b] && a < b); };
        std::nth_element(idx, idx + (n - 1), idx + m, lower);
        std::sort(idx, idx + n);
    }
    store_compact(hs, *ctx.pool, ctx.layer, idx, n, ctx.c->cfg.model.head_dim);
}

}  // namespace kvp
