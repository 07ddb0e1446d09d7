#include "policies/triattention.h"

#include <math.h>
#include <string.h>

#include <algorithm>

#include "kernels/score_fixed.h"
#include "policies/h2o.h"

namespace kvp {

bool tri_ada_select = true;

namespace {

constexpr float kGenerated = 1.0f;  // slot score of a generated token; prompt tokens 0
constexpr uint32_t kOffsets = 17;   // d = 1, 2, 4, ..., 65536 (the reference's offset_max_length)
// Scratch bytes per token of one selection (Work): score, sum, slots, order, cnt, pos, mask; plus
// G doubles of per-query-head scores.
constexpr size_t kPerToken = 2 * sizeof(double) + 3 * sizeof(uint32_t) + sizeof(int32_t) + 1;

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

uint32_t capacity_of(const kvp_config &cfg) { return config_capacity(cfg, cfg.budget + beta_of(cfg) + kFullDefaultCapacity); }

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = capacity_of(cfg);
    p->hole_cap = default_hole_cap(p->cap);
    p->reads_keys = true;
    const Units u = units_of(cfg.model);
    const uint32_t G = cfg.model.n_q_heads / cfg.model.n_kv_heads;
    p->scratch_per_token = kPerToken + G * sizeof(double);  // Work
    p->scratch_bytes = (size_t(G) * u.n * 3 + u.hd + 3 * size_t(u.n)) * sizeof(double) + p->scratch_per_token + 64;
    p->phase_all_layers = cfg.tri_mode != KVP_TRI_PER_LAYER_PERHEAD;
}

size_t state_bytes(const kvp_config &cfg, uint32_t) {
    return size_t(cfg.model.n_layers) * cfg.model.n_q_heads * stat_doubles(units_of(cfg.model)) * sizeof(double);
}

void observe_queries(PolicyCtx &ctx, const float *q, size_t ld, uint32_t n) {
    if (ctx.cfg().tri_stats == KVP_TRI_STATS_GIVEN) return;  // the caller's (kvp_query_stats_set)
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

// kvp_query_stats_set: the caller's means become the statistics of one query (count 1).
kvp_status set_query_stats(const PolicyCtx &ctx, uint32_t qh, const float *mean, const float *abs_mean, uint32_t n,
                           Msg &m) {
    const kvp_config &cfg = ctx.cfg();
    if (cfg.tri_stats != KVP_TRI_STATS_GIVEN) {
        m.s("kvp_query_stats_set: triattention has tri_stats=online (it accumulates the queries it sees); create it with tri_stats=given");
        return KVP_ERR_CONFIG;
    }
    const Units u = units_of(cfg.model);
    if (n != u.n) {
        m.s("kvp_query_stats_set: n_units=").u(n).s(" but this model's heads have ").u(u.n)
            .s(" (rope pairs ").u(u.pairs).s(" + unrotated channels ").u(u.n - u.pairs).s(")");
        return KVP_ERR_ARG;
    }
    for (uint32_t i = 0; i < n; ++i) {
        if (!isfinite(abs_mean[i])) {
            m.s("kvp_query_stats_set: abs_mean[").u(i).s("] is not finite");
            return KVP_ERR_NONFINITE;
        }
        if (abs_mean[i] < 0.0f) {
            m.s("kvp_query_stats_set: abs_mean[").u(i).s("] is negative (a mean of magnitudes)");
            return KVP_ERR_ARG;
        }
    }
    double *st = stats_of(ctx, u, qh);
    st[0] = 1.0;
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t a;
        int32_t b;
        u.at(i, &a, &b);
        double *s = st + 1 + 3 * size_t(i);
        s[0] = mean[a];
        s[1] = b >= 0 ? double(mean[b]) : 0.0;
        s[2] = abs_mean[i];
    }
    return KVP_OK;
}

// tri_stats=given: kvp_reset keeps the caller's statistics (the whole region).
size_t state_kept(const kvp_config &cfg) { return cfg.tri_stats == KVP_TRI_STATS_GIVEN ? state_bytes(cfg, 0) : 0; }

// The scoring of one head with the next query at R: per query head g the future query
// E[q] * W * e^(i R w) (re, im per unit) and the magnitude coefficients E|q| - |E q|, each as one
// array of n units, so that a key's units (read and measured once) meet G dot products.
struct Scorer {
    Units u;
    uint32_t G;
    double *qt;   // [n][3][G]: per unit the G query heads' re, then im, then coefficient
    double *key;  // [hd], then the key's units: re [n], im [n], magnitude [n]

    void prepare(const PolicyCtx &ctx, int64_t R) {
        const double *w = ctx.rope_freqs();
        for (uint32_t g = 0; g < G; ++g) {
            const double *st = stats_of(ctx, u, ctx.head * G + g);
            const double cnt = st[0];
            for (uint32_t i = 0; i < u.n; ++i) {
                const double *s = st + 1 + 3 * size_t(i);
                double *re = qt + 3 * size_t(i) * G + g, *im = re + G, *co = im + G;
                if (cnt == 0.0) {
                    *re = *im = *co = 0.0;
                    continue;
                }
                const double mr = s[0] / cnt, mi = s[1] / cnt, am = s[2] / cnt;
                *co = am - (i < u.pairs ? sqrt(mr * mr + mi * mi) : fabs(mr));
                if (i >= u.pairs) {  // frequency 0: W = 1, no rotation
                    *re = mr;
                    *im = 0.0;
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
                *re = mr * zr - mi * zi;
                *im = mr * zi + mi * zr;
            }
        }
    }
    // The key's score per query head into per_g[g * ld] (when not NULL); returns the group's maximum.
    // Query heads are summed four at a time (independent chains, each in unit order: the same
    // bits as one head after another; -ffp-contract=off keeps every product and sum rounded).
    double score(const PolicyCtx &ctx, uint32_t slot, double *per_g = nullptr, size_t ld = 0) {
        ctx.key(slot, key);
        const size_t n = u.n;
        double *kr = key + u.hd, *ki = kr + n, *km = ki + n;
        const uint32_t P = u.pairs;
        const size_t step = u.style == KVP_ROPE_GPTJ ? 2 : 1;  // pair u: (2u, 2u+1) or (u, u+pairs)
        const double *ka = key, *kb = key + (u.style == KVP_ROPE_GPTJ ? 1 : P);
        for (uint32_t i = 0; i < P; ++i) {
            const double re = ka[i * step], im = kb[i * step];
            kr[i] = re;
            ki[i] = im;
            km[i] = sqrt(re * re + im * im);
        }
        for (uint32_t i = P; i < u.n; ++i) {  // unrotated channels 2 * pairs ..
            kr[i] = key[2 * P + (i - P)];
            ki[i] = 0.0;
            km[i] = fabs(kr[i]);
        }
        double best = 0.0;
        uint32_t g = 0;
        const size_t gs = 3 * size_t(G);  // one unit's re, im and coefficient rows
        for (; g + 4 <= G; g += 4) {      // four query heads: four independent sums, one lane each
            double s[4] = {0.0, 0.0, 0.0, 0.0};
            for (size_t i = 0; i < n; ++i) {
                const double *re = qt + i * gs + g, *im = re + G, *co = im + G;
                const double r = kr[i], m = ki[i], a = km[i];
                for (uint32_t j = 0; j < 4; ++j) s[j] += re[j] * r + im[j] * m + co[j] * a;
            }
            for (uint32_t j = 0; j < 4; ++j) {
                if (per_g) per_g[(g + j) * ld] = s[j];
                if (g + j == 0 || s[j] > best) best = s[j];
            }
        }
        for (; g < G; ++g) {
            double s = 0.0;
            for (size_t i = 0; i < n; ++i) {
                const double *re = qt + i * gs + g, *im = re + G, *co = im + G;
                s += *re * kr[i] + *im * ki[i] + *co * km[i];
            }
            if (per_g) per_g[g * ld] = s;
            if (g == 0 || s > best) best = s;
        }
        return best;
    }
};

// The scratch of one selection over at most `cap` tokens (PolicyCtx::scratch; plan()).
struct Work {
    Scorer sc;
    double *score, *sum, *per_g;  // [cap], [cap], [G][cap]
    uint32_t *slots, *order, *cnt;
    int32_t *pos;
    uint8_t *mask;
};

Work work_of(const PolicyCtx &ctx) {
    const Units u = units_of(ctx.cfg().model);
    const size_t cap = size_t(ctx.plan().store_cap) + 1;  // a head may hold its store's cap (heads lend)
    Work w;
    w.sc.u = u;
    w.sc.G = ctx.group();
    double *d = static_cast<double *>(ctx.scratch);
    w.sc.qt = d;
    w.sc.key = d + size_t(w.sc.G) * u.n * 3;
    w.score = w.sc.key + u.hd + 3 * size_t(u.n);
    w.sum = w.score + cap;
    w.per_g = w.sum + cap;
    w.slots = reinterpret_cast<uint32_t *>(w.per_g + size_t(w.sc.G) * cap);
    w.order = w.slots + cap;
    w.cnt = w.order + cap;
    w.pos = reinterpret_cast<int32_t *>(w.cnt + cap);
    w.mask = reinterpret_cast<uint8_t *>(w.pos + cap);
    return w;
}

// The generated tokens (slots in logical order, so ascending positions) and R, the position
// after the newest token.
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

// Splits idx[0..m) (indices 0..m-1) so that idx[0..e) are the e lowest by ascending key, ties by
// ascending position (the older is evicted first), in no particular order. Positions are distinct,
// so the order is total and the split is a set, the same whichever algorithm finds it: every use
// only asks which indices fall below e (a selection, linear, not a sort).
void split_lowest(uint32_t *idx, uint32_t m, uint32_t e, const double *key, const int32_t *pos) {
    for (uint32_t i = 0; i < m; ++i) idx[i] = i;
    if (e == 0 || e >= m) return;
    std::nth_element(idx, idx + e, idx + m, [&](uint32_t x, uint32_t y) {
        if (key[x] != key[y]) return key[x] < key[y];
        return pos[x] < pos[y];
    });
}

// Evicts the e lowest-scored generated tokens of one store (ties: the older first).
void evict_scored(PolicyCtx &ctx, HeadStore &hs, uint32_t e) {
    Work w = work_of(ctx);
    int64_t R;
    const uint32_t m = candidates(ctx, hs, w.slots, &R);
    hs.pword[0] = m;
    if (e > m) e = m;
    if (e == 0) return;
    w.sc.prepare(ctx, R);
    for (uint32_t i = 0; i < m; ++i) {
        w.score[i] = w.sc.score(ctx, w.slots[i]);
        w.pos[i] = ctx.pool->pos[w.slots[i]];
    }
    split_lowest(w.order, m, e, w.score, w.pos);
    for (uint32_t i = 0; i < e; ++i) w.order[i] = w.slots[w.order[i]];  // the victims' slots
    store_evict(hs, *ctx.pool, ctx.layer, w.order, e);
    hs.pword[0] = m - e;
}

// ---- the shared modes: one choice for several stores, made at the last policy layer ----

bool layer_runs_policy(const kvp_config &cfg, uint32_t l) {  // not a sliding-window layer (sliding.h)
    if (!cfg.sliding_window) return true;
    return cfg.sliding_pattern && (l + 1) % cfg.sliding_pattern == 0;
}

uint32_t last_policy_layer(const kvp_config &cfg) {
    for (uint32_t l = cfg.model.n_layers; l-- > 0;)
        if (layer_runs_policy(cfg, l)) return l;
    return 0;
}

// The index of position p in the reference positions pos[0..m), or m.
uint32_t index_of(const int32_t *pos, uint32_t m, int32_t p) {
    const int32_t *it = std::lower_bound(pos, pos + m, p);
    return it != pos + m && *it == p ? uint32_t(it - pos) : m;
}

// Scores every generated token of store (l, h) per query head and adds them, by the index of its
// position among the reference positions w.pos[0..m), to: w.sum/w.cnt (the group's max: per_head),
// or w.score (max over heads: union).
void score_store(PolicyCtx &ctx, uint32_t l, uint32_t h, Work &w, uint32_t m, bool union_mode) {
    PolicyCtx hc = ctx.at_layer(l).at_head(h);
    HeadStore &hs = hc.store(h);
    uint32_t *slots = w.order;  // this store's candidates (order is free until the choice)
    int64_t R;
    const uint32_t ms = candidates(hc, hs, slots, &R);
    if (ms == 0) return;
    w.sc.prepare(hc, R);
    for (uint32_t i = 0; i < ms; ++i) {
        const uint32_t k = index_of(w.pos, m, hc.pool->pos[slots[i]]);
        if (k == m) continue;  // not a token of the reference store: it is evicted, unscored
        const double best = w.sc.score(hc, slots[i]);
        if (!union_mode) {
            w.sum[k] += best;
            ++w.cnt[k];
        } else if (best > w.score[k] || w.cnt[k] == 0) {
            w.score[k] = best;
            w.cnt[k] = 1;
        }
    }
}

// Keeps the generated tokens of store (l, h) whose positions are w.pos[k] with w.mask[k] set.
void keep_chosen(PolicyCtx &ctx, uint32_t l, uint32_t h, Work &w, uint32_t m) {
    PolicyCtx hc = ctx.at_layer(l).at_head(h);
    HeadStore &hs = hc.store(h);
    int64_t R;
    const uint32_t ms = candidates(hc, hs, w.order, &R);
    uint32_t e = 0;
    for (uint32_t i = 0; i < ms; ++i) {
        const uint32_t k = index_of(w.pos, m, hc.pool->pos[w.order[i]]);
        if (k == m || !w.mask[k]) w.order[e++] = w.order[i];
    }
    if (e) store_evict(hs, *hc.pool, l, w.order, e);
    hs.pword[0] = ms - e;
}

// The union's parallel parts (PolicyCtx::parallel): scoring, item i = (layer i / heads, head
// i % heads), each participant into its own accumulators (its Work's score and cnt over the
// reference positions, which it reads from the caller's Work); then the eviction, item = KV head
// (its stores of every layer share its pool).
struct UnionJob {
    Work *w;  // the caller's: reference positions, its accumulators, the choice
    uint32_t m;
};

Work participant_work(const PolicyCtx &ctx, const Work &caller) {  // own scratch, the caller's positions
    Work w = work_of(ctx);
    w.pos = caller.pos;
    return w;
}

void union_score_item(PolicyCtx &ctx, uint32_t i, uint32_t, void *arg) {
    const UnionJob &j = *static_cast<const UnionJob *>(arg);
    const uint32_t H = ctx.cfg().model.n_kv_heads, l = i / H;
    if (!layer_runs_policy(ctx.cfg(), l)) return;
    Work w = participant_work(ctx, *j.w);
    score_store(ctx, l, i % H, w, j.m, true);
}

void union_keep_item(PolicyCtx &ctx, uint32_t h, uint32_t, void *arg) {
    const UnionJob &j = *static_cast<const UnionJob *>(arg);
    Work w = participant_work(ctx, *j.w);
    w.mask = j.w->mask;
    for (uint32_t l = 0; l < ctx.cfg().model.n_layers; ++l)
        if (layer_runs_policy(ctx.cfg(), l)) keep_chosen(ctx, l, h, w, j.m);
}

// One choice for the stores of KV heads [h0, h1) of every policy layer (per_head: one head, on
// the calling participant; union: all, scored and evicted in parallel), the reference positions
// those of (ctx.layer, h0).
void choose_shared(PolicyCtx &ctx, uint32_t h0, uint32_t h1, bool union_mode) {
    const kvp_config &cfg = ctx.cfg();
    Work w = work_of(ctx);
    PolicyCtx rc = ctx.at_head(h0);
    int64_t R;
    const uint32_t m = candidates(rc, rc.store(h0), w.slots, &R);
    const uint32_t keep = cfg.budget < m ? cfg.budget : m;
    for (uint32_t i = 0; i < m; ++i) {
        w.pos[i] = rc.pool->pos[w.slots[i]];
        w.score[i] = w.sum[i] = 0.0;
        w.cnt[i] = 0;
        w.mask[i] = 0;
    }
    UnionJob job{&w, m};
    if (union_mode) {
        // every participant's accumulators start empty; the maxima merge in any order
        for (uint32_t t = 1; t < cfg.threads; ++t) {
            PolicyCtx tc = ctx;
            tc.scratch = ctx.scratch_at(t);
            memset(work_of(tc).cnt, 0, size_t(m) * sizeof(uint32_t));
        }
        const uint32_t k = ctx.parallel(cfg.model.n_layers * cfg.model.n_kv_heads, &union_score_item, &job);
        for (uint32_t t = 1; t < k; ++t) {
            PolicyCtx tc = ctx;
            tc.scratch = ctx.scratch_at(t);
            const Work wt = work_of(tc);
            for (uint32_t i = 0; i < m; ++i) {
                if (wt.cnt[i] && (w.cnt[i] == 0 || wt.score[i] > w.score[i])) {
                    w.score[i] = wt.score[i];
                    w.cnt[i] = 1;
                }
            }
        }
    } else {
        for (uint32_t l = 0; l < cfg.model.n_layers; ++l)
            if (layer_runs_policy(cfg, l))
                for (uint32_t h = h0; h < h1; ++h) score_store(ctx, l, h, w, m, false);
    }
    // The choice: per_head the best mean over layers; union the best maximum over every store and
    // query head. (The reference's union lets each query head nominate its `keep` best and keeps
    // the nominees with the highest maximum. Over the same tokens that is the `keep` best by the
    // maximum: a token outside its maximising head's `keep` best has `keep` tokens above it there,
    // so above it by the maximum too, ties going the same way (the newer kept). test_triattention's
    // reference computes the nominations; DECISIONS "TriAttention", Modes.)
    double *key = w.score;
    if (!union_mode)
        for (uint32_t k = 0; k < m; ++k) key[k] = w.cnt[k] ? w.sum[k] / w.cnt[k] : -HUGE_VAL;
    split_lowest(w.order, m, m - keep, key, w.pos);
    for (uint32_t r = m - keep; r < m; ++r) w.mask[w.order[r]] = 1;
    if (union_mode) {
        ctx.parallel(cfg.model.n_kv_heads, &union_keep_item, &job);
        return;
    }
    for (uint32_t l = 0; l < cfg.model.n_layers; ++l)
        if (layer_runs_policy(cfg, l))
            for (uint32_t h = h0; h < h1; ++h) keep_chosen(ctx, l, h, w, m);
}

// per_head: item h makes KV head h's choice when it is due (its own stores and pool only).
void per_head_item(PolicyCtx &ctx, uint32_t h, uint32_t, void *) {
    const kvp_config &cfg = ctx.cfg();
    if (ctx.store(h).pword[0] >= uint64_t(cfg.budget) + beta_of(cfg)) choose_shared(ctx, h, h + 1, false);
}

// ---- head_budget=ada: AdaKV over TriAttention's per-layer-per-head cuts ----
// (Feng et al., arXiv 2407.11550, Sec. 3-4, applied to TriAttention's decode-time cut, Sec. 4 of
// arXiv 2604.04921; our interpretation: neither reference splits TriAttention's budget over
// heads.) tri_mode=per_layer_perhead only (the other modes keep one set for several stores).
// - The cut is the layer's: when its KV heads' generated tokens reach KV heads x (budget + beta)
//   (every beta decodes, as uniform's per-head cut), the layer keeps min(them, KV heads x budget).
//   After the first cut it also comes every beta decodes (counted in each head's pword[1], saved
//   with the state): a cut where heads at their most (below) left part of the budget unused keeps
//   less, and waiting for the total would let such a head outgrow its store and the layer its
//   capacity.
// - Scores share a scale across heads: each query head's trigonometric scores over its KV head's
//   generated tokens are z-normalised (mean 0, standard deviation 1, at least 1e-6: the
//   reference's normalize_scores), a token's score is its group's maximum. With one KV head
//   nothing is compared across heads: the raw scores, so the choice is uniform's bit for bit.
// - Head h first keeps its best floor(ada_floor x min(g_h, budget)) (g_h its generated tokens);
//   the rest of the layer's total goes to the best of all heads' others: higher score, newer
//   position, lower head. A head keeps at most max(budget, its store's cap - its prompt - beta)
//   (the next beta tokens must fit before the next cut; heads lend blocks, pool.h "Lending").
// - The prompt is always kept. Runs in the layer phase: the heads are scored in parallel (one item
//   per KV head, PolicyCtx::parallel, each into its own records in the phase region, policy.h
//   phase_bytes), the ranking over all heads then on the calling thread.
bool ada(const kvp_config &cfg) { return cfg.head_budget == KVP_HEAD_BUDGET_ADA; }

struct AdaRec {
    double key;     // the normalised score (raw with one KV head)
    int32_t pos;
    uint32_t head;  // | kAdaKept once kept
    uint32_t slot;
    uint32_t pad;
};
static_assert(sizeof(AdaRec) == 24, "phase_bytes() reserves 24 bytes per token of a layer");
constexpr uint32_t kAdaKept = 0x80000000u;

bool ada_better(const AdaRec &a, const AdaRec &b) {
    if (a.key != b.key) return a.key > b.key;
    if (a.pos != b.pos) return a.pos > b.pos;
    return (a.head & ~kAdaKept) < (b.head & ~kAdaKept);
}

// The phase region: four per-head counts [4][H], then a record per token of the layer (head h's
// from the tokens of the heads before it: each head's generated tokens are at most its tokens,
// and the layer's tokens at most layer_tokens_cap, policy.h).
size_t ada_counts_bytes(const kvp_config &cfg) { return align_up(4 * sizeof(uint32_t) * cfg.model.n_kv_heads, kAlign); }
size_t phase_bytes(const kvp_config &cfg, uint32_t) {
    if (!ada(cfg)) return 0;
    return ada_counts_bytes(cfg) + align_up(sizeof(AdaRec) * size_t(layer_tokens_cap(cfg, capacity_of(cfg))), kAlign);
}
AdaRec *ada_records(const PolicyCtx &ctx) {
    return reinterpret_cast<AdaRec *>(static_cast<char *>(ctx.phase()) + ada_counts_bytes(ctx.cfg()));
}
// Where head h's records start: after the tokens of the heads before it.
size_t ada_base(const PolicyCtx &ctx, uint32_t h) {
    size_t b = 0;
    for (uint32_t g = 0; g < h; ++g) b += ctx.store(g).len();
    return b;
}

// Scores head h's generated tokens into rec[0..m) (keys normalised when `norm`); returns m.
uint32_t ada_score_head(PolicyCtx &ctx, uint32_t h, Work &w, AdaRec *rec, bool norm) {
    PolicyCtx hc = ctx.at_head(h);
    HeadStore &hs = hc.store(h);
    int64_t R;
    const uint32_t m = candidates(hc, hs, w.slots, &R);
    if (m == 0) return 0;
    w.sc.prepare(hc, R);
    const size_t ld = size_t(hc.plan().store_cap) + 1;
    for (uint32_t i = 0; i < m; ++i) w.score[i] = w.sc.score(hc, w.slots[i], w.per_g + i, ld);
    if (norm) {  // per query head: z-scores over the head's generated tokens, then the group's maximum
        for (uint32_t g = 0; g < w.sc.G; ++g) {
            double *row = w.per_g + size_t(g) * ld, mean = 0.0, var = 0.0;
            for (uint32_t i = 0; i < m; ++i) mean += row[i];
            mean /= double(m);
            for (uint32_t i = 0; i < m; ++i) var += (row[i] - mean) * (row[i] - mean);
            double sd = sqrt(var / double(m));
            if (!(sd >= 1e-6)) sd = 1e-6;
            for (uint32_t i = 0; i < m; ++i) {
                const double z = (row[i] - mean) / sd;
                if (g == 0 || z > w.score[i]) w.score[i] = z;
            }
        }
    }
    for (uint32_t i = 0; i < m; ++i) rec[i] = AdaRec{w.score[i], hc.pool->pos[w.slots[i]], h, w.slots[i], 0};
    return m;
}

struct AdaJob {
    AdaRec *rec;  // the phase region's records
    uint32_t *held, *most, *cnt;
};

// Item h of the cut (PolicyCtx::parallel): KV head h's generated tokens scored into its records,
// the most it keeps, and its floor's best kept (a selection: the order is total).
void ada_head_item(PolicyCtx &ctx, uint32_t h, uint32_t, void *arg) {
    const AdaJob &j = *static_cast<const AdaJob *>(arg);
    const kvp_config &cfg = ctx.cfg();
    const uint32_t H = cfg.model.n_kv_heads, B = cfg.budget, beta = beta_of(cfg);
    Work w = work_of(ctx);
    AdaRec *rec = j.rec + ada_base(ctx, h);
    const HeadStore &hs = ctx.store(h);
    const uint32_t m = ada_score_head(ctx, h, w, rec, H > 1);
    const uint32_t prompt = hs.len() - m, sc = hs.cap;
    const uint64_t room = uint64_t(sc) > uint64_t(prompt) + beta ? uint64_t(sc) - prompt - beta : 0;
    j.most[h] = uint32_t(room > B ? (room < m ? room : m) : (B < m ? B : m));
    const uint32_t u = m < B ? m : B, fl = uint32_t(double(cfg.ada_floor) * double(u));
    j.held[h] = fl < j.most[h] ? fl : j.most[h];
    if (j.held[h] > 0 && j.held[h] < m) std::nth_element(rec, rec + j.held[h], rec + m, ada_better);
    for (uint32_t i = 0; i < j.held[h]; ++i) rec[i].head |= kAdaKept;
    j.cnt[h] = m;
}

void ada_cut(PolicyCtx &ctx) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t H = cfg.model.n_kv_heads, B = cfg.budget, beta = beta_of(cfg);
    uint64_t gen = 0;
    for (uint32_t h = 0; h < H; ++h) gen += ctx.store(h).pword[0];
    // due every beta decodes after the first cut (pword[1] = 1 + decodes since it), or when the
    // layer holds heads x (budget + beta): the same step unless a cut kept less than heads x budget
    if (gen < uint64_t(H) * (uint64_t(B) + beta) && ctx.store(0).pword[1] <= beta) return;
    for (uint32_t h = 0; h < H; ++h) ctx.store(h).pword[1] = 1;
    Work w = work_of(ctx);
    // per head: kept so far, the most it keeps, room left, its generated tokens; then the records
    AdaRec *rec = ada_records(ctx);
    uint32_t *held = static_cast<uint32_t *>(ctx.phase()), *most = held + H, *left = most + H, *cnt = left + H;
    AdaJob job{rec, held, most, cnt};
    ctx.parallel(H, &ada_head_item, &job);  // each head scored, its floor kept, in its own records
    uint64_t rest = gen < uint64_t(H) * B ? gen : uint64_t(H) * B;
    for (uint32_t h = 0; h < H; ++h) rest -= held[h];
    // the rest: the best of all heads' others (in head order), each head up to its most
    size_t k = 0;
    size_t b = 0;  // ada_base(ctx, h)
    for (uint32_t h = 0; h < H; b += ctx.store(h).len(), ++h)
        for (uint32_t i = 0; i < cnt[h]; ++i)
            if (!(rec[b + i].head & kAdaKept)) rec[k++] = rec[b + i];
    // The walk below keeps the best others in order, skipping heads at their most. Usually no head
    // reaches its most among the best min(rest, k): then the walk keeps exactly those, found by a
    // selection (the order is total, so they are a set); else the walk needs them sorted.
    const size_t top = rest < k ? size_t(rest) : k;
    if (top < k && tri_ada_select) std::nth_element(rec, rec + top, rec + k, ada_better);
    for (uint32_t h = 0; h < H; ++h) left[h] = most[h] - held[h];  // how many more it may keep
    bool fits = tri_ada_select;
    for (size_t i = 0; i < top && fits; ++i) fits = left[rec[i].head]-- > 0;
    if (fits) {
        for (size_t i = 0; i < top; ++i) rec[i].head |= kAdaKept;
        rest = 0;
    } else {
        std::sort(rec, rec + k, ada_better);
    }
    for (size_t i = 0; i < k && rest > 0; ++i) {
        const uint32_t h = rec[i].head;
        if (held[h] >= most[h]) continue;
        ++held[h];
        rec[i].head |= kAdaKept;
        --rest;
    }
    for (uint32_t h = 0; h < H; ++h) {  // victims: the others, head by head
        HeadStore &hs = ctx.store(h);
        PolicyCtx hc = ctx.at_head(h);
        uint32_t nv = 0;
        for (size_t i = 0; i < k; ++i)
            if (rec[i].head == h) w.slots[nv++] = rec[i].slot;
        if (nv) store_evict(hs, *hc.pool, ctx.layer, w.slots, nv);
        hs.pword[0] -= nv;
    }
}

void layer_phase(PolicyCtx &ctx, StepMode mode) {
    const kvp_config &cfg = ctx.cfg();
    if (ada(cfg)) {
        if (mode == StepMode::kDecode && layer_runs_policy(cfg, ctx.layer)) ada_cut(ctx);
        return;
    }
    if (mode != StepMode::kDecode || cfg.tri_mode == KVP_TRI_PER_LAYER_PERHEAD || ctx.layer != last_policy_layer(cfg))
        return;
    const uint32_t H = cfg.model.n_kv_heads;
    const uint64_t at = uint64_t(cfg.budget) + beta_of(cfg);
    if (cfg.tri_mode == KVP_TRI_PER_HEAD) {
        ctx.parallel(H, &per_head_item, nullptr);
        return;
    }
    bool due = false;
    for (uint32_t h = 0; h < H; ++h) due = due || ctx.store(h).pword[0] >= at;
    if (due) choose_shared(ctx, 0, H, true);
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
    if (hs.pword[1]) ++hs.pword[1];  // ada: decodes since the layer's last cut (ada_cut)
    if (cfg.tri_mode != KVP_TRI_PER_LAYER_PERHEAD || ada(cfg)) return;  // a layer phase cuts (layer_phase)
    if (uint64_t(g) >= uint64_t(cfg.budget) + beta_of(cfg)) evict_scored(ctx, hs, g - cfg.budget);
}

uint32_t evictable(const PolicyCtx &, const HeadStore &hs) { return generated_count(hs); }

void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) { evict_scored(ctx, hs, dense_self_prune_count(ctx, hs, n)); }

// The prompt is never selected from: under max_prompt the layers hold it within capacity.
bool keeps_prompt(const kvp_config &) { return true; }

}  // namespace

uint32_t triattention_scores(const kvp_cache *c, uint32_t layer, uint32_t h, void *scratch, double *per_g, size_t ld,
                             int32_t *pos) {
    PolicyCtx ctx = policy_ctx(c, layer).at_head(h);
    ctx.scratch = scratch;
    Work w = work_of(ctx);
    int64_t R;
    const uint32_t m = candidates(ctx, ctx.store(h), w.slots, &R);
    if (m) w.sc.prepare(ctx, R);
    for (uint32_t i = 0; i < m; ++i) {
        w.sc.score(ctx, w.slots[i], per_g + i, ld);
        pos[i] = ctx.pool->pos[w.slots[i]];
    }
    return m;
}

const Policy kTriAttentionPolicy = {"triattention", KVP_POS_ORIGINAL, &check,   &plan,      nullptr,
                                    &prune,         &layer_phase,          &evictable, &self_prune, nullptr,
                                    &state_bytes,   nullptr,          nullptr,    nullptr,     &keeps_prompt,
                                    &observe_queries, &set_query_stats, &state_kept, /* streaming_heads */ false,
                                    /* state_transient */ false, /* phase_bytes */ &phase_bytes};

}  // namespace kvp
