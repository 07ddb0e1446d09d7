#include "policies/lethe.h"

#include <math.h>
#include <string.h>

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

// ---- head_budget=ada: AdaKV over Lethe ----
// (Feng et al., arXiv 2407.11550, Sec. 3-4, applied to Lethe's rounds; our interpretation, as
// neither paper's reference allocates Lethe's budgets per head.) Each KV head keeps its own
// tokens, ranked by its own scores (its group's mass: every query's weights sum to one per head,
// so the heads' scores share a scale); the layer's decisions are uniform Lethe's over the layer's
// total, and one ranking of all heads' tokens says which heads keep them:
// - Per head h: sinks S_h = min(sinks, L_h), recent R_h = floor(recent_ratio * L_h), the other
//   K_h tokens are its candidates.
// - Trigger: the layer's total passes KV heads x min(L_evict, capacity - 1), or a head passes its
//   store's cap less the draft room, less one (heads lend blocks: pool.h "Lending").
// - Round (total > KV heads x L_evict): the breakpoint search runs on all heads' candidates
//   sorted together (K = sum K_h). Found at c: the layer keeps c candidates, each head first
//   its best floor(ada_floor * c / KV heads) (at most K_h), the rest the best of all heads';
//   L_evict = max(L_evict, ceil((c + sum R_h) / KV heads)). Not found: L_evict doubles.
// - Hard capacity: a head past its bound evicts its own lowest-ranked; then the layer evicts the
//   lowest-ranked of all heads' tokens until its total is KV heads x (capacity - 1).
// - Ranking: candidates, then recent tokens, then sinks (as uniform); within a tier the lower
//   score, then the older position, then the higher KV head goes first (the best kept: higher
//   score, newer, lower head). With one KV head every step is uniform Lethe's, bit for bit.
// Runs in the layer phase (and layer_prepare) on the calling thread; its records, one per token
// of the layer (policy.h layer_tokens_cap), live in the phase region (policy.h phase_bytes);
// smax = the largest store (its cap and an open prompt's room).
inline bool ada(const kvp_config &cfg) { return cfg.head_budget == KVP_HEAD_BUDGET_ADA; }

struct AdaTok {
    uint64_t key;   // rank_key (policy.h): the larger, the better kept
    uint32_t head;  // its KV head
    uint32_t slot;
    uint32_t tier;  // 0 candidate, 1 recent, 2 sink (the eviction order of the tiers)
    uint32_t out;   // 1 once chosen (kept by a round, evicted by the hard capacity)
};

uint32_t ada_cap(const kvp_config &cfg) { return config_capacity(cfg, 2 * cfg.budget); }
uint32_t ada_smax(const kvp_config &cfg) { return store_cap(cfg, ada_cap(cfg)) + cfg.max_prompt; }

size_t phase_bytes(const kvp_config &cfg, uint32_t) {
    if (!ada(cfg)) return 0;
    const size_t smax = ada_smax(cfg), H = cfg.model.n_kv_heads;
    return align_up(4 * smax, kAlign) + align_up(4 * (smax > H ? smax : H), kAlign) +
           align_up(sizeof(AdaTok) * size_t(layer_tokens_cap(cfg, ada_cap(cfg))), kAlign);
}

// Kept order (the best first) and eviction order (the first to go).
bool better(const AdaTok &a, const AdaTok &b) { return a.key > b.key || (a.key == b.key && a.head < b.head); }
bool worse(const AdaTok &a, const AdaTok &b) {
    if (a.tier != b.tier) return a.tier < b.tier;
    return a.key < b.key || (a.key == b.key && a.head > b.head);
}

struct AdaLayer {
    PolicyCtx *ctx;
    uint32_t H;
    float *score;   // [smax] one head's scores in logical order
    uint32_t *slot; // [max(smax, H)] their slots; then victims (or per-head counts)
    AdaTok *tok;    // [H * smax]
    size_t n;       // records
    uint64_t total, recent;  // tokens and recent tokens of the layer
};

AdaLayer ada_of(PolicyCtx &ctx) {
    const size_t smax = ada_smax(ctx.cfg()), H = ctx.cfg().model.n_kv_heads;
    char *r = static_cast<char *>(ctx.phase());
    AdaLayer a{&ctx, uint32_t(H), reinterpret_cast<float *>(r), nullptr, nullptr, 0, 0, 0};
    a.slot = reinterpret_cast<uint32_t *>(r + align_up(4 * smax, kAlign));
    a.tok = reinterpret_cast<AdaTok *>(r + align_up(4 * smax, kAlign) + align_up(4 * (smax > H ? smax : H), kAlign));
    return a;
}

// Records of every token of every head (tiers from the current lengths).
void ada_collect(AdaLayer &a) {
    const kvp_config &cfg = a.ctx->cfg();
    a.n = 0;
    a.total = a.recent = 0;
    for (uint32_t h = 0; h < a.H; ++h) {
        const HeadStore &hs = a.ctx->store(h);
        const BlockPool &pool = a.ctx->pool_of(h);
        const uint32_t L = hs.len(), S = cfg.sinks < L ? cfg.sinks : L;
        const double rr = floor(double(cfg.recent_ratio) * double(L));
        const uint32_t R = rr >= double(L) ? L : uint32_t(rr), cand_end = L - R > S ? L - R : S;
        scores_logical(hs, pool, a.score, a.slot);
        for (uint32_t j = 0; j < L; ++j) {
            uint32_t bits;
            memcpy(&bits, a.score + j, 4);
            const uint32_t tier = j < S ? 2u : j < cand_end ? 0u : 1u;
            a.tok[a.n++] = AdaTok{rank_key(bits, pool.pos[a.slot[j]]), h, a.slot[j], tier, 0};
        }
        a.total += L;
        a.recent += L - cand_end;
    }
}

// Evicts from each head the records marked `out == mark` (mark 1) or not (mark 0).
void ada_evict(AdaLayer &a, uint32_t mark) {
    for (uint32_t h = 0; h < a.H; ++h) {
        uint32_t nv = 0;
        for (size_t i = 0; i < a.n; ++i)
            if (a.tok[i].head == h && (a.tok[i].out == mark)) a.slot[nv++] = a.tok[i].slot;
        if (nv) store_evict(a.ctx->store(h), a.ctx->pool_of(h), a.ctx->layer, a.slot, nv);
    }
}

// The round's breakpoint search over all heads' candidates; true when the layer evicted.
bool ada_round(AdaLayer &a, uint32_t *Le) {
    const kvp_config &cfg = a.ctx->cfg();
    ada_collect(a);
    size_t K = 0;  // the candidates to the front, sorted best first
    for (size_t i = 0; i < a.n; ++i)
        if (a.tok[i].tier == 0) std::swap(a.tok[K++], a.tok[i]);
    std::sort(a.tok, a.tok + K, better);
    const uint32_t D = cfg.segments;
    size_t c = 0;
    bool found = false;  // no candidates: not found (the threshold doubles), as uniform
    const uint64_t v0 = K ? a.tok[0].key >> 32 : 0;
    if (a.ctx->fixed()) {
        const uint64_t tau = uint64_t(floor(double(cfg.sparse_ratio) * 65536.0 + 0.5));
        for (uint32_t d = 1; K && v0 != 0 && d < D && !found; ++d) {
            c = size_t(uint64_t(K) * d / D);
            const uint64_t vc = a.tok[c].key >> 32;
            found = vc == 0 || (v0 << 16) / vc >= tau;
        }
    } else {
        auto val = [](const AdaTok &t) {
            const uint32_t bits = uint32_t(t.key >> 32);
            float f;
            memcpy(&f, &bits, 4);
            return double(f);
        };
        const double f0 = K ? val(a.tok[0]) : 0.0, tau = double(cfg.sparse_ratio);
        for (uint32_t d = 1; f0 > 0.0 && d < D && !found; ++d) {
            c = size_t(uint64_t(K) * d / D);
            found = f0 >= tau * val(a.tok[c]);
        }
    }
    if (!found) {
        *Le = *Le >= 0x40000000u ? 0x80000000u : *Le * 2;
        return false;
    }
    // keep c: each head's floor (its best, in the sorted order), then the best of the rest
    const uint32_t fl = uint32_t(double(cfg.ada_floor) * double(c) / double(a.H));
    uint32_t *taken = a.slot;  // per head: candidates kept by the floor
    for (uint32_t h = 0; h < a.H; ++h) taken[h] = 0;
    size_t kept = 0;
    for (size_t i = 0; i < K && kept < c; ++i)
        if (taken[a.tok[i].head] < fl) ++taken[a.tok[i].head], a.tok[i].out = 1, ++kept;
    for (size_t i = 0; i < K && kept < c; ++i)
        if (!a.tok[i].out) a.tok[i].out = 1, ++kept;
    a.n = K;  // only candidates can go: the ones not kept
    ada_evict(a, 0);
    const uint64_t t = (uint64_t(c) + a.recent + a.H - 1) / a.H;
    if (t > *Le) *Le = uint32_t(t);
    return true;
}

// Hard capacity: each head within `head_top`, the layer's total within `layer_top`.
void ada_capacity(AdaLayer &a, uint32_t head_top, uint64_t layer_top) {
    ada_collect(a);
    uint64_t total = a.total;
    size_t b = 0;  // head h's records are [b, b + L_h): collected in head order
    for (uint32_t h = 0; h < a.H; ++h) {
        const uint32_t L = a.ctx->store(h).len();
        if (L > head_top) {
            const uint32_t e = L - head_top;
            std::nth_element(a.tok + b, a.tok + b + (e - 1), a.tok + b + L, worse);
            for (uint32_t i = 0; i < e; ++i) a.tok[b + i].out = 1;
            total -= e;
        }
        b += L;
    }
    if (total > layer_top) {
        size_t m = 0;  // the records still in, to the front
        for (size_t i = 0; i < a.n; ++i)
            if (!a.tok[i].out) std::swap(a.tok[m++], a.tok[i]);
        const size_t e = size_t(total - layer_top);
        std::nth_element(a.tok, a.tok + (e - 1), a.tok + m, worse);
        for (size_t i = 0; i < e; ++i) a.tok[i].out = 1;
    }
    ada_evict(a, 1);
}

void ada_phase(PolicyCtx &ctx) {
    const kvp_config &cfg = ctx.cfg();
    AdaLayer a = ada_of(ctx);
    uint32_t &Le = ctx.evict_threshold();
    const uint32_t top = config_policy_capacity(cfg, ctx.plan().cap) - 1;
    const uint32_t head_top = config_policy_capacity(cfg, ctx.plan().store_cap) - 1;
    const uint32_t T = Le < top ? Le : top;
    uint64_t total = 0;
    bool over = false;
    auto measure = [&] {
        total = 0;
        over = false;
        for (uint32_t h = 0; h < a.H; ++h) {
            total += ctx.store(h).len();
            over = over || ctx.store(h).len() > head_top;
        }
    };
    measure();
    if (total <= uint64_t(a.H) * T && !over) return;
    if (total > uint64_t(a.H) * Le && ada_round(a, &Le)) measure();
    if (total > uint64_t(a.H) * top || over) ada_capacity(a, head_top, uint64_t(a.H) * top);
}

// Shared pool, ada: head h evicts its own e lowest-ranked tokens (no other head's are asked);
// returns whether it evicted.
bool ada_evict_head(PolicyCtx &ctx, uint32_t h, uint32_t e) {
    AdaLayer a = ada_of(ctx);
    ada_collect(a);
    size_t b = 0, m = 0;
    for (uint32_t g = 0; g < h; ++g) b += ctx.store(g).len();
    m = ctx.store(h).len();
    if (e > m) e = uint32_t(m);
    if (e == 0) return false;
    std::nth_element(a.tok + b, a.tok + b + (e - 1), a.tok + b + m, worse);
    for (uint32_t i = 0; i < e; ++i) a.tok[b + i].out = 1;
    ada_evict(a, 1);
    return true;
}

void layer_phase(PolicyCtx &ctx, StepMode) {
    if (ada(ctx.cfg())) {
        ada_phase(ctx);
        Layer ly = layer_of(ctx);
        decay_scores(ly);
        return;
    }
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
        bool need = false, moved = false;
        uint32_t e = 0;
        for (uint32_t h = 0; h < H; ++h) {
            HeadStore &hs = ctx.store(h);
            BlockPool &pool = ctx.pool_of(h);
            if (store_blocks_needed(hs, pool.block, n) <= pool.allowed(ctx.layer)) continue;
            need = true;
            if (hs.holes) {
                store_compact(hs, pool, ctx.layer);
                moved = true;
                continue;
            }
            PolicyCtx hc = ctx.at_head(h);
            const uint32_t eh = dense_self_prune_count(hc, hs, n);
            if (ada(ctx.cfg())) {  // heads keep their own tokens: each evicts its own
                moved = ada_evict_head(ctx, h, eh) || moved;
                continue;
            }
            if (eh > e) e = eh;
        }
        if (!need) return;
        if (ada(ctx.cfg())) {
            if (!moved) return;  // nothing left to evict (the room check said this does not happen)
            continue;
        }
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
                             &layer_phase, &evictable,  &self_prune, &layer_prepare,
                             /* state_bytes */ nullptr, /* reset */ nullptr, /* selection_size */ nullptr,
                             /* selection */ nullptr, /* keeps_prompt */ nullptr, /* observe_queries */ nullptr,
                             /* set_query_stats */ nullptr, /* state_kept */ nullptr, /* streaming_heads */ false,
                             /* state_transient */ false, /* phase_bytes */ &phase_bytes};

}  // namespace kvp
