#include "policies/lethe.h"

#include <math.h>

#include <algorithm>

#include "kernels/score_fixed.h"
#include "policies/h2o.h"

namespace kvp {
namespace {

constexpr size_t kBytesPerToken = 32;

// Layer-phase scratch for a layer of `cap` tokens (thread 0's policy scratch).
struct Scr {
    double *sf;         // [cap] layer scores, float mode (float values held in doubles)
    uint64_t *su;       // [cap] layer scores, fixed mode (same memory)
    double *vf;         // [cap] sorted candidate scores
    uint64_t *vu;
    uint32_t *idx;      // [cap]
    uint32_t *victims;  // [cap] logical, ascending
    uint32_t *tmp;      // [cap] a head's victim slots
};

Scr scr_of(const PolicyCtx &ctx, uint32_t cap) {
    char *b = static_cast<char *>(ctx.scratch);
    const size_t n = cap;
    Scr s;
    s.sf = reinterpret_cast<double *>(b);
    s.su = reinterpret_cast<uint64_t *>(b);
    s.vf = reinterpret_cast<double *>(b + 8 * n);
    s.vu = reinterpret_cast<uint64_t *>(b + 8 * n);
    s.idx = reinterpret_cast<uint32_t *>(b + 16 * n);
    s.victims = reinterpret_cast<uint32_t *>(b + 20 * n);
    s.tmp = reinterpret_cast<uint32_t *>(b + 24 * n);
    return s;
}

struct Layer {
    const PolicyCtx *ctx;
    const kvp_config &cfg() const { return ctx->cfg(); }
    uint32_t layer, H, L, cap;
    bool fixed;
    Scr s;
    HeadStore &hs(uint32_t h) const { return ctx->store(h); }
    BlockPool &pool(uint32_t h) const { return ctx->pool_of(h); }
};

Layer layer_of(PolicyCtx &ctx) {
    Layer ly{&ctx, ctx.layer, ctx.cfg().model.n_kv_heads, 0, ctx.plan().cap, ctx.fixed(), {}};
    ly.L = ctx.store(0).len();
    ly.s = scr_of(ctx, ly.cap + ctx.prompt_room());  // a whole prompt may pass cap (prompt.h)
    return ly;
}

// Layer scores in logical order: the sum over KV heads in head order (all heads hold the same tokens).
void layer_scores(Layer &ly) {
    for (uint32_t j = 0; j < ly.L; ++j) ly.s.su[j] = 0;  // 0 bits = 0.0 as well
    for (uint32_t h = 0; h < ly.H; ++h) {
        const BlockPool &pool = ly.pool(h);
        store_for_each_live(ly.hs(h), pool, [&](uint32_t slot, uint32_t n, uint32_t j) {
            for (uint32_t i = 0; i < n; ++i) {
                if (ly.fixed) ly.s.su[j + i] += score_u(pool, slot + i);
                else ly.s.sf[j + i] = double(float(ly.s.sf[j + i]) + pool.score[slot + i]);
            }
        });
    }
}

// The eviction order: (score, index) ascending.
bool lower(const Layer &ly, uint32_t a, uint32_t b) {
    if (ly.fixed) return ly.s.su[a] < ly.s.su[b] || (ly.s.su[a] == ly.s.su[b] && a < b);
    return ly.s.sf[a] < ly.s.sf[b] || (ly.s.sf[a] == ly.s.sf[b] && a < b);
}

// Appends to victims[*nv] the n lowest-ranked tokens of logical [from, to).
void lowest(Layer &ly, uint32_t from, uint32_t to, uint32_t n, uint32_t *nv) {
    if (n == 0 || to <= from) return;
    const uint32_t m = to - from;
    if (n > m) n = m;
    for (uint32_t i = 0; i < m; ++i) ly.s.idx[i] = from + i;
    std::nth_element(ly.s.idx, ly.s.idx + (n - 1), ly.s.idx + m,
                     [&ly](uint32_t a, uint32_t b) { return lower(ly, a, b); });
    for (uint32_t i = 0; i < n; ++i) ly.s.victims[(*nv)++] = ly.s.idx[i];
}

// Evicts victims[0..nv) (logical; any order) from every KV head of the layer.
void evict_all_heads(Layer &ly, uint32_t nv) {
    if (nv == 0) return;
    std::sort(ly.s.victims, ly.s.victims + nv);
    for (uint32_t h = 0; h < ly.H; ++h) {
        HeadStore &hs = ly.hs(h);
        BlockPool &pool = ly.pool(h);
        uint32_t vi = 0;
        store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t j) {
            while (vi < nv && ly.s.victims[vi] < j + n) {
                ly.s.tmp[vi] = slot + (ly.s.victims[vi] - j);
                ++vi;
            }
        });
        store_evict(hs, pool, ly.layer, ly.s.tmp, nv);
    }
    ly.L -= nv;
}

uint32_t sinks_of(const Layer &ly) { return ly.cfg().sinks < ly.L ? ly.cfg().sinks : ly.L; }
uint32_t recent_of(const Layer &ly) {
    const double r = floor(double(ly.cfg().recent_ratio) * double(ly.L));
    return r >= double(ly.L) ? ly.L : uint32_t(r);
}

// Evicts the n lowest-ranked tokens: candidates (not sinks, not the R recent) first, then recent
// tokens, then sinks. Needs fresh layer scores.
void evict_ranked(Layer &ly, uint32_t n, uint32_t R) {
    const uint32_t S = sinks_of(ly), L = ly.L;
    const uint32_t cand_end = L - R > S ? L - R : S;
    uint32_t nv = 0;
    lowest(ly, S, cand_end, n, &nv);
    if (nv < n) {
        const uint32_t got = nv;
        // victims already chosen lie in [S, cand_end): the next ranges are disjoint from them
        lowest(ly, cand_end, L, n - got, &nv);
    }
    if (nv < n) lowest(ly, 0, S, n - nv, &nv);
    evict_all_heads(ly, nv);
}

// The breakpoint search of a round; returns true and the breakpoint when found.
bool breakpoint(Layer &ly, uint32_t S, uint32_t R, uint32_t *bp) {
    const kvp_config &cfg = ly.cfg();
    if (ly.L < S + R || ly.L - S - R == 0) return false;
    const uint32_t K = ly.L - S - R, D = cfg.segments;
    if (ly.fixed) {
        for (uint32_t i = 0; i < K; ++i) ly.s.vu[i] = ly.s.su[S + i];
        std::sort(ly.s.vu, ly.s.vu + K, [](uint64_t a, uint64_t b) { return a > b; });
        const uint64_t v0 = ly.s.vu[0];
        if (v0 == 0) return false;
        const uint64_t tau = uint64_t(floor(double(cfg.sparse_ratio) * 65536.0 + 0.5));
        for (uint32_t d = 1; d < D; ++d) {
            const uint32_t c = uint32_t(uint64_t(K) * d / D);
            const uint64_t vc = ly.s.vu[c];
            if (vc == 0 || (v0 << 16) / vc >= tau) {
                *bp = c;
                return true;
            }
        }
        return false;
    }
    for (uint32_t i = 0; i < K; ++i) ly.s.vf[i] = ly.s.sf[S + i];
    std::sort(ly.s.vf, ly.s.vf + K, [](double a, double b) { return a > b; });
    const double v0 = ly.s.vf[0], tau = double(cfg.sparse_ratio);
    if (!(v0 > 0.0)) return false;
    for (uint32_t d = 1; d < D; ++d) {
        const uint32_t c = uint32_t(uint64_t(K) * d / D);
        if (v0 >= tau * ly.s.vf[c]) {
            *bp = c;
            return true;
        }
    }
    return false;
}

void decay_scores(Layer &ly) {
    const float dec = ly.cfg().decay;
    const uint32_t dq = fixed::decay_q16(dec);
    for (uint32_t h = 0; h < ly.H; ++h) {
        BlockPool &pool = ly.pool(h);
        store_for_each_live(ly.hs(h), pool, [&](uint32_t slot, uint32_t n, uint32_t) {
            for (uint32_t i = 0; i < n; ++i) {
                if (ly.fixed) score_set_u(pool, slot + i, fixed::decay_apply(score_u(pool, slot + i), dq));
                else pool.score[slot + i] *= dec;
            }
        });
    }
}

void layer_phase(PolicyCtx &ctx, StepMode) {
    Layer ly = layer_of(ctx);
    uint32_t &Le = ctx.evict_threshold();
    const uint32_t top = config_policy_capacity(ly.cfg(), ly.cap) - 1;  // below it: the draft room (config.h)
    const uint32_t T = Le < top ? Le : top;
    if (ly.L > T) {
        layer_scores(ly);
        const uint32_t S = sinks_of(ly), R = recent_of(ly);
        if (ly.L > Le) {
            uint32_t bp = 0;
            if (breakpoint(ly, S, R, &bp)) {
                uint32_t nv = 0;
                lowest(ly, S, ly.L - R, ly.L - R - S - bp, &nv);  // all candidates but the top bp
                evict_all_heads(ly, nv);
                const uint64_t t = uint64_t(bp) + R;
                if (t > Le) Le = uint32_t(t);
            } else {
                Le = Le >= 0x40000000u ? 0x80000000u : Le * 2;
            }
        }
        if (ly.L > top) {  // hard capacity: rank the survivors again in their new logical order
            layer_scores(ly);
            evict_ranked(ly, ly.L - top, recent_of(ly));
        }
    }
    decay_scores(ly);
}

// Shared pool: make room for n new tokens in every head by the layer ranking, before the step.
void layer_prepare(PolicyCtx &ctx, uint32_t n, StepMode) {
    const uint32_t H = ctx.cfg().model.n_kv_heads;
    if (!ctx.shared_pool()) return;
    for (;;) {
        bool need = false;
        uint32_t e = 0;
        for (uint32_t h = 0; h < H; ++h) {
            HeadStore &hs = ctx.store(h);
            BlockPool &pool = ctx.pool_of(h);
            if (store_blocks_needed(hs, pool.block, n) <= pool.allowed(ctx.layer)) continue;
            need = true;
            if (hs.holes) {
                store_compact(hs, pool, ctx.layer);
                continue;
            }
            PolicyCtx hc = ctx.at_head(h);
            const uint32_t eh = dense_self_prune_count(hc, hs, n);
            if (eh > e) e = eh;
        }
        if (!need) return;
        if (e == 0) continue;  // compactions only: check again
        Layer ly = layer_of(ctx);
        if (ly.L == 0) return;  // nothing to evict (the room check said this does not happen)
        layer_scores(ly);
        evict_ranked(ly, e < ly.L ? e : ly.L, recent_of(ly));
    }
}

uint32_t evictable(const PolicyCtx &, const HeadStore &hs) { return hs.body_len(); }

// Never reached: layer_prepare made the room for every head before the per-head work.
void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) {
    evict_lowest(ctx, hs, dense_self_prune_count(ctx, hs, n), 0, hs.len(), ctx.scratch);
}

uint32_t capacity_of(const kvp_config &cfg) { return cfg.capacity ? cfg.capacity : 2 * cfg.budget; }

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (!cfg.capacity && uint64_t(cfg.budget) * 2 > kMaxCapacity) {
        m.s("lethe: capacity=2*budget exceeds the capacity limit");
        return KVP_ERR_CONFIG;
    }
    if (capacity_of(cfg) < 2) {
        m.s("lethe: capacity=").u(capacity_of(cfg)).s(" must be >= 2 (a decode appends before it prunes)");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, 2 * cfg.budget);  // capacity_of, plus the draft room
    p->decode_scores = true;
    p->obs_queries = cfg.obs_window;
    p->hole_cap = default_hole_cap(p->cap);
    p->scratch_per_token = kBytesPerToken;
    p->evict_threshold = cfg.evict_threshold ? cfg.evict_threshold : config_policy_capacity(cfg, p->cap) / 2;
}

void observe(PolicyCtx &ctx, HeadStore &, const Run *runs, uint32_t nr, const Obs &obs) {
    add_observed_mass(ctx, runs, nr, obs);
}

}  // namespace

const Policy kLethePolicy = {"lethe", KVP_POS_ORIGINAL, &check,     &plan,       &observe,     nullptr,
                             &layer_phase, &evictable,  &self_prune, &layer_prepare};

}  // namespace kvp
