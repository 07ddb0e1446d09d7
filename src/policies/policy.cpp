#include "policies/policy.h"

#include <string.h>

#include <algorithm>

#include "cache.h"
#include "kernels/score_fixed.h"
#include "policies/full.h"
#include "policies/asl.h"
#include "policies/h2o.h"
#include "policies/lethe.h"
#include "policies/pyramidkv.h"
#include "policies/simlayerkv.h"
#include "policies/snapkv.h"
#include "policies/streaming.h"
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
    const bool fixed = fixed_scores(ctx.c);
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
        const kern::ScoreF32 &S = *ctx.c->skern;
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
    const uint32_t G = ctx.c->group;
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

uint32_t stage_room(const PolicyCtx &ctx, const HeadStore &hs) {
    // After its victims are compacted away a dense store starts at roff 0 (a compacting store
    // never evicts from the front), so it can hold its blocks plus the pool's allowance.
    const BlockPool &pool = *ctx.pool;
    const uint64_t room = (uint64_t(hs.pnb) + hs.nb + pool.allowed(ctx.layer)) * pool.block;
    return room < hs.cap ? uint32_t(room) : hs.cap;
}

void stage_commit(PolicyCtx &ctx, HeadStore &hs, uint32_t *victims, uint32_t nv) {
    BlockPool &pool = *ctx.pool;
    const uint32_t L0 = hs.len(), n = ctx.staged;
    if (!victims) {  // a policy that chose nothing: keep the newest staged tokens that fit
        const uint32_t room = stage_room(ctx, hs);
        const uint32_t fit = room > L0 ? room - L0 : 0;
        nv = n > fit ? n - fit : 0;
    }
    // victims in the store: their slots, in one pass over the store (victims are ascending)
    uint32_t ns = 0;
    while (ns < nv && (victims ? victims[ns] : L0 + ns) < L0) ++ns;
    if (ns) {  // logical index -> slot, in place
        uint32_t vi = 0;
        store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t m, uint32_t j) {
            while (vi < ns && victims[vi] < j + m) {
                victims[vi] = slot + (victims[vi] - j);
                ++vi;
            }
        });
        store_evict(hs, pool, ctx.layer, victims, ns);
    }
    if (hs.holes) store_compact(hs, pool, ctx.layer);
    uint32_t vi = ns, m = 0;
    const FmtPool *fp = pool.fc ? &fmt_pool(*pool.fc, pool) : nullptr;
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t j = L0 + i;
        if (vi < nv && (victims ? victims[vi] : L0 + (vi - ns)) == j) {
            ++vi;
            continue;
        }
        uint32_t slot = 0;
        if (!store_reserve(hs, pool, ctx.layer, &slot)) break;  // unreachable when the caller kept within stage_room
        if (fp) {  // formatted: a residual token; its rows move to staging row m (m <= i, ascending)
            const bool pinned = hs.next_pinned();
            pool.copy_meta(slot, ctx.stage_slot + i);
            if (m != i) {
                const size_t row = size_t(pool.stride) * sizeof(float);
                memcpy(fp->sk + size_t(m) * pool.stride, fp->sk + size_t(i) * pool.stride, row);
                memcpy(fp->sv + size_t(m) * pool.stride, fp->sv + size_t(i) * pool.stride, row);
            }
            store_commit(hs);
            if (!pinned) ++hs.nres;
        } else {
            pool.copy_slot(slot, ctx.stage_slot + i);
            store_commit(hs);
        }
        ++m;
    }
    ctx.committed = m;
    const uint32_t staged_dropped = nv - ns;
    if (staged_dropped) {
        if (!ns) hs.prune_events += 1;
        hs.evicted += staged_dropped;
    }
    if (nv) hs.scattered = true;  // survivors moved to other logical indices: realign deltas changed
    ctx.staged = 0;
}

}  // namespace kvp
