#include "policies/triattention.h"

#include <math.h>
#include <string.h>

#include <algorithm>

#include "kernels/score_fixed.h"
#include "policies/h2o.h"

namespace kvp {

namespace {

constexpr float kGenerated = 1.0f;  // slot score of a generated token; prompt tokens 0
constexpr uint32_t kOffsets = 17;   // d = 1, 2, 4, ..., 65536 (the reference's offset_max_length)

// A scoring unit: a RoPE pair (a, b) with frequency index u < pairs, or one unrotated channel a
// (b < 0). Units 0..pairs-1 are the rotated pairs, then every channel past 2 * pairs.
struct Units {
    uint32_t hd, pairs, n;
    kvp_rope_style style;
    void at(uint32_t u, uint32_t *a, int32_t *b) const {
        if (u < pairs) {
            *a = style == KVP_ROPE_GPTJ ? 2 * u : u;
            *b = int32_t(style == KVP_ROPE_GPTJ ? 2 * u + 1 : u + pairs);
        } else {
            *a = 2 * pairs + (u - pairs);
            *b = -1;
        }
    }
};

Units units_of(const kvp_model &m) {
    Units s;
    s.hd = m.head_dim;
    s.style = m.rope;
    s.pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    s.n = s.pairs + (s.hd - 2 * s.pairs);
    return s;
}

// Per (layer, query head): [count, then per unit: sum re, sum im, sum |q|] in doubles.
size_t stat_doubles(const Units &u) { return 1 + 3 * size_t(u.n); }

double *stats_of(const PolicyCtx &ctx, const Units &u, uint32_t qh) {
    const kvp_model &m = ctx.cfg().model;
    return static_cast<double *>(ctx.state()) + (size_t(ctx.layer) * m.n_q_heads + qh) * stat_doubles(u);
}

uint32_t beta_of(const kvp_config &cfg) { return uint32_t(cfg.beta); }

bool generated(const BlockPool &pool, uint32_t slot) {
    float s;
    memcpy(&s, pool.score + slot, sizeof s);
    return s == kGenerated;
}

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (cfg.positions == KVP_POS_REALIGN) {
        m.s("triattention: positions=realign is not supported (its score needs the tokens' own positions): use positions=original");
        return KVP_ERR_CONFIG;
    }
    if (cfg.score != KVP_SCORE_FIXED && cfg.kv_dtype != KVP_DTYPE_F32) {
        m.s("triattention reads the stored keys: with kv_dtype other than f32 give score=fixed (it scores the fixed-point key copy)");
        return KVP_ERR_CONFIG;
    }
    if (!(cfg.beta >= 1.0f) || cfg.beta != floorf(cfg.beta) || cfg.beta > float(kMaxCapacity)) {
        m.s("triattention: beta=").f(double(cfg.beta)).s(" must be a whole number of tokens >= 1");
        return KVP_ERR_CONFIG;
    }
    const uint64_t gen = uint64_t(cfg.budget) + beta_of(cfg);
    if (cfg.capacity && cfg.capacity < gen) {
        m.s("triattention: capacity=").u(cfg.capacity).s(" must hold budget+beta=").u(gen)
            .s(" generated tokens (and the prompt)");
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && gen + kFullDefaultCapacity > kMaxCapacity) {
        m.s("triattention: budget+beta exceeds the capacity limit");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, cfg.budget + beta_of(cfg) + kFullDefaultCapacity);
    p->hole_cap = default_hole_cap(p->cap);
    p->reads_keys = true;
    const Units u = units_of(cfg.model);
    const uint32_t G = cfg.model.n_q_heads / cfg.model.n_kv_heads;
    p->scratch_bytes = (size_t(G) * u.n * 3 + u.hd + 3 * size_t(u.n)) * sizeof(double);
    p->scratch_per_token = 2 * sizeof(uint32_t) + sizeof(double);  // candidate slot, order, score
}

size_t state_bytes(const kvp_config &cfg, uint32_t) {
    return size_t(cfg.model.n_layers) * cfg.model.n_q_heads * stat_doubles(units_of(cfg.model)) * sizeof(double);
}

void observe_queries(PolicyCtx &ctx, const float *q, size_t ld, uint32_t n) {
    const Units u = units_of(ctx.cfg().model);
    const uint32_t G = ctx.group();
    for (uint32_t t = 0; t < n; ++t) {
        for (uint32_t g = 0; g < G; ++g) {
            const float *row = q + size_t(t) * ld + size_t(g) * u.hd;
            double *st = stats_of(ctx, u, ctx.head * G + g);
            st[0] += 1.0;
            for (uint32_t i = 0; i < u.n; ++i) {
                uint32_t a;
                int32_t b;
                u.at(i, &a, &b);
                const double re = row[a], im = b >= 0 ? double(row[b]) : 0.0;
                double *s = st + 1 + 3 * size_t(i);
                s[0] += re;
                s[1] += im;
                s[2] += b >= 0 ? sqrt(re * re + im * im) : fabs(re);
            }
        }
    }
}

// The scoring of one head with the next query at R: per query head g the future query
// E[q] * W * e^(i R w) (re, im per unit) and the magnitude coefficients E|q| - |E q|, each as one
// array of n units, so that a key's units (read and measured once) meet G dot products.
struct Scorer {
    Units u;
    uint32_t G;
    double *qt;   // [G][3][n]: re, im, coefficient
    double *key;  // [hd], then the key's units: re [n], im [n], magnitude [n]

    void prepare(const PolicyCtx &ctx, int64_t R) {
        const double *w = ctx.rope_freqs();
        const size_t n = u.n;
        for (uint32_t g = 0; g < G; ++g) {
            const double *st = stats_of(ctx, u, ctx.head * G + g);
            const double cnt = st[0];
            double *re = qt + size_t(g) * 3 * n, *im = re + n, *co = im + n;
            for (uint32_t i = 0; i < u.n; ++i) {
                const double *s = st + 1 + 3 * size_t(i);
                if (cnt == 0.0) {
                    re[i] = im[i] = co[i] = 0.0;
                    continue;
                }
                const double mr = s[0] / cnt, mi = s[1] / cnt, am = s[2] / cnt;
                co[i] = am - (i < u.pairs ? sqrt(mr * mr + mi * mi) : fabs(mr));
                if (i >= u.pairs) {  // frequency 0: W = 1, no rotation
                    re[i] = mr;
                    im[i] = 0.0;
                    continue;
                }
                double wr = 0.0, wi = 0.0, sn, cs;
                for (uint32_t d = 0; d < kOffsets; ++d) {
                    fixed::det_sincos(w[i] * double(uint64_t(1) << d), &sn, &cs);
                    wr += cs;
                    wi += sn;
                }
                wr /= kOffsets;
                wi /= kOffsets;
                fixed::det_sincos(w[i] * double(R), &sn, &cs);
                const double zr = wr * cs - wi * sn, zi = wr * sn + wi * cs;  // W e^(i R w)
                re[i] = mr * zr - mi * zi;
                im[i] = mr * zi + mi * zr;
            }
        }
    }
    double score(const PolicyCtx &ctx, uint32_t slot) {
        ctx.key(slot, key);
        const size_t n = u.n;
        double *kr = key + u.hd, *ki = kr + n, *km = ki + n;
        for (uint32_t i = 0; i < u.n; ++i) {
            uint32_t a;
            int32_t b;
            u.at(i, &a, &b);
            kr[i] = key[a];
            ki[i] = b >= 0 ? key[b] : 0.0;
            km[i] = b >= 0 ? sqrt(kr[i] * kr[i] + ki[i] * ki[i]) : fabs(kr[i]);
        }
        double best = 0.0;
        for (uint32_t g = 0; g < G; ++g) {
            const double *re = qt + size_t(g) * 3 * n, *im = re + n, *co = im + n;
            double s = 0.0;
            for (size_t i = 0; i < n; ++i) s += re[i] * kr[i] + im[i] * ki[i] + co[i] * km[i];
            if (g == 0 || s > best) best = s;
        }
        return best;
    }
};

struct Work {
    Scorer sc;
    uint32_t *slots, *order;
    double *score;
};

Work work_of(const PolicyCtx &ctx, uint32_t cap) {
    const Units u = units_of(ctx.cfg().model);
    Work w;
    w.sc.u = u;
    w.sc.G = ctx.group();
    double *d = static_cast<double *>(ctx.scratch);
    w.sc.qt = d;
    w.sc.key = d + size_t(w.sc.G) * u.n * 3;
    w.score = w.sc.key + u.hd + 3 * size_t(u.n);
    w.slots = reinterpret_cast<uint32_t *>(w.score + cap);
    w.order = w.slots + cap;
    return w;
}

// The generated tokens (slots in logical order) and R, the position after the newest token.
uint32_t candidates(const PolicyCtx &ctx, const HeadStore &hs, uint32_t *slots, int64_t *R) {
    const BlockPool &pool = *ctx.pool;
    uint32_t m = 0;
    int64_t last = -1;
    store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t) {
        for (uint32_t i = 0; i < n; ++i) {
            if (generated(pool, slot + i)) slots[m++] = slot + i;
            if (pool.pos[slot + i] > last) last = pool.pos[slot + i];
        }
    });
    *R = last + 1;
    return m;
}

// Evicts the e lowest-scored generated tokens (ties: the older first).
void evict_scored(PolicyCtx &ctx, HeadStore &hs, uint32_t e) {
    const uint32_t cap = hs.len() + 1;
    Work w = work_of(ctx, cap);
    int64_t R;
    const uint32_t m = candidates(ctx, hs, w.slots, &R);
    hs.pword[0] = m;
    if (e > m) e = m;
    if (e == 0) return;
    w.sc.prepare(ctx, R);
    for (uint32_t i = 0; i < m; ++i) {
        w.score[i] = w.sc.score(ctx, w.slots[i]);
        w.order[i] = i;
    }
    const BlockPool &pool = *ctx.pool;
    std::sort(w.order, w.order + m, [&](uint32_t x, uint32_t y) {
        if (w.score[x] != w.score[y]) return w.score[x] < w.score[y];
        return pool.pos[w.slots[x]] < pool.pos[w.slots[y]];
    });
    for (uint32_t i = 0; i < e; ++i) w.order[i] = w.slots[w.order[i]];  // the victims' slots
    store_evict(hs, *ctx.pool, ctx.layer, w.order, e);
    hs.pword[0] = m - e;
}

// The head's generated tokens: counted in HeadStore::pword[0] (saved with the state, cleared with
// the store), so a decode does not scan the store.
uint32_t generated_count(const HeadStore &hs) { return uint32_t(hs.pword[0]); }

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    if (mode != StepMode::kDecode || hs.len() == 0) return;  // prompt tokens stay
    uint32_t last = 0;  // the new token: the store's last
    store_for_each_live(hs, *ctx.pool, [&](uint32_t slot, uint32_t n, uint32_t) { last = slot + n - 1; });
    memcpy(ctx.pool->score + last, &kGenerated, sizeof kGenerated);
    const kvp_config &cfg = ctx.cfg();
    const uint32_t g = uint32_t(++hs.pword[0]);
    if (uint64_t(g) >= uint64_t(cfg.budget) + beta_of(cfg)) evict_scored(ctx, hs, g - cfg.budget);
}

uint32_t evictable(const PolicyCtx &, const HeadStore &hs) { return generated_count(hs); }

void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) { evict_scored(ctx, hs, dense_self_prune_count(ctx, hs, n)); }

// The prompt is never selected from: under max_prompt the layers hold it within capacity.
bool keeps_prompt(const kvp_config &) { return true; }

}  // namespace

const Policy kTriAttentionPolicy = {"triattention", KVP_POS_ORIGINAL, &check,   &plan,      nullptr,
                                    &prune,         nullptr,          &evictable, &self_prune, nullptr,
                                    &state_bytes,   nullptr,          nullptr,    nullptr,     &keeps_prompt,
                                    &observe_queries};

}  // namespace kvp
