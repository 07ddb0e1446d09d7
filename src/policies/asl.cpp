#include "policies/asl.h"

#include <math.h>
#include <string.h>

#include <algorithm>

#include "policies/snapkv.h"

namespace kvp {
namespace {

struct AslHeader {
    int32_t sel_layer;    // -1: no selection yet in this sequence
    uint32_t fresh;       // the current call made the selection
    uint32_t nsel;        // its size
    uint32_t collect;     // the current call scores its layer (layer_prepare)
    uint32_t n;           // that call's tokens
    uint32_t ring_count;  // layers in the rank ring
    uint32_t ring_last;   // the last layer in it
    uint32_t ring_n;      // the prompt length its ranks are of
    uint32_t ref_set;
    uint32_t apply;       // max_prompt: a prompt's end made the selection; the later layers' ends keep it
    double v_ref;         // the rank variance at the reference layer
};

// The state region: header | var[L] | rel[L] | votes[H][S] | score[S] | idx[S] | ranks[obs_layers][S] |
// sel[S], S = slots(): the most tokens one scored prompt may have (the staging area; with
// max_prompt, everything a layer holds at its prompt's end: capacity + max_prompt).
struct Layout {
    size_t var, rel, votes, score, idx, ranks, sel, total;
};

uint32_t capacity_of(const kvp_config &cfg) { return config_capacity(cfg, cfg.budget + 1); }

uint32_t slots(const kvp_config &cfg, uint32_t stage) {
    const uint64_t whole = cfg.max_prompt ? uint64_t(capacity_of(cfg)) + cfg.max_prompt : 0;
    return whole > stage ? uint32_t(whole) : stage;
}

Layout layout(const kvp_config &cfg, uint32_t stage) {
    const size_t L = cfg.model.n_layers, H = cfg.model.n_kv_heads, S = slots(cfg, stage);
    Layout o;
    size_t off = align_up(sizeof(AslHeader), kAlign);
    o.var = off;
    off += align_up(L * sizeof(double), kAlign);
    o.rel = off;
    off += align_up(L * sizeof(double), kAlign);
    o.votes = off;
    off += align_up(H * S * sizeof(double), kAlign);
    o.score = off;
    off += align_up(S * sizeof(double), kAlign);
    o.idx = off;
    off += align_up(S * sizeof(uint32_t), kAlign);
    o.ranks = off;
    off += align_up(size_t(cfg.asl_obs_layers) * S * sizeof(uint32_t), kAlign);
    o.sel = off;
    off += align_up(S * sizeof(int32_t), kAlign);
    o.total = off;
    return o;
}

struct State {
    AslHeader *h;
    double *var, *rel, *votes, *score;
    uint32_t *idx, *ranks;
    int32_t *sel;
};

State state_of(const PolicyCtx &ctx) {
    char *b = static_cast<char *>(ctx.state());
    const Layout o = layout(ctx.cfg(), ctx.stage());  // slots(cfg, stage) per array
    return State{reinterpret_cast<AslHeader *>(b),          reinterpret_cast<double *>(b + o.var),
                 reinterpret_cast<double *>(b + o.rel),     reinterpret_cast<double *>(b + o.votes),
                 reinterpret_cast<double *>(b + o.score),   reinterpret_cast<uint32_t *>(b + o.idx),
                 reinterpret_cast<uint32_t *>(b + o.ranks), reinterpret_cast<int32_t *>(b + o.sel)};
}

uint32_t min_layer(const kvp_config &cfg) {
    return cfg.asl_min_layer == UINT32_MAX ? cfg.model.n_layers / 3 : cfg.asl_min_layer;
}
uint32_t collect_start(const kvp_config &cfg) {
    const uint32_t m = min_layer(cfg), back = cfg.asl_obs_layers - 1;
    return m > back ? m - back : 0;
}
uint32_t window_of(const kvp_config &cfg, uint32_t n) { return cfg.obs_window < n ? cfg.obs_window : n; }

bool layer_empty(const PolicyCtx &ctx) {
    for (uint32_t h = 0; h < ctx.cfg().model.n_kv_heads; ++h)
        if (ctx.store(h).len()) return false;
    return true;
}

size_t state_bytes(const kvp_config &cfg, uint32_t stage) { return layout(cfg, stage).total; }

void reset(const PolicyCtx &ctx) {
    const State s = state_of(ctx);
    memset(s.h, 0, sizeof *s.h);
    s.h->sel_layer = -1;
    for (uint32_t l = 0; l < ctx.cfg().model.n_layers; ++l) s.var[l] = s.rel[l] = NAN;
}

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (cfg.asl_min_layer != UINT32_MAX && cfg.asl_min_layer >= cfg.model.n_layers) {
        m.s("asl: asl_min_layer=").u(cfg.asl_min_layer).s(" must be < n_layers=").u(cfg.model.n_layers)
            .s(" (4294967295 = floor(n_layers/3))");
        return KVP_ERR_CONFIG;
    }
    return snapkv_check_common("asl", cfg, m);
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) { snapkv_plan(cfg, cfg.budget, capacity_of(cfg), p); }

// A prompt's end (max_prompt, prompt.h) scores the layer: no selection yet in this sequence and
// more than `budget` tokens held (the whole prompt, after whatever the layer held before it).
bool end_scores(const PolicyCtx &ctx, const HeadStore &hs) {
    return ctx.prompt_w && ctx.layer >= collect_start(ctx.cfg()) && state_of(ctx).h->sel_layer < 0 &&
           hs.len() > ctx.cfg().budget;
}

void layer_prepare(PolicyCtx &ctx, uint32_t n, StepMode mode) {
    const kvp_config &cfg = ctx.cfg();
    AslHeader &h = *state_of(ctx).h;
    h.fresh = 0;
    h.apply = 0;  // a call outside a prompt: the prompt's end that selected is over
    const bool collect = mode == StepMode::kPrefill && h.sel_layer < 0 && ctx.layer >= collect_start(cfg) &&
                         n > cfg.budget && n <= ctx.stage() && layer_empty(ctx);
    h.collect = collect ? window_of(cfg, n) : 0;
    h.n = n;
}

void observe(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const Obs &obs) {
    snapkv_observe(ctx, hs, runs, nr, obs);
    const State s = state_of(ctx);
    uint32_t n, w;
    if (ctx.staged && s.h->collect) {  // one call (collect: its window, set by layer_prepare)
        n = ctx.staged;
        w = s.h->collect;
    } else if (end_scores(ctx, hs)) {  // a prompt's end: the votes of its last queries over the store
        n = hs.len();
        w = window_of(ctx.cfg(), ctx.prompt_w);
        if (ctx.head == 0) {  // read by layer_phase (every head holds the same tokens)
            s.h->n = n;
            s.h->collect = w;
        }
    } else {
        return;
    }
    const uint32_t P = n - w;
    memcpy(s.votes + size_t(ctx.head) * slots(ctx.cfg(), ctx.stage()), snapkv_votes(ctx, hs),
           size_t(P) * sizeof(double));
    hs.pflag = 1;
}

// A prompt's end in a layer after the one that selected at this end keeps exactly the selection
// (the tokens a one-call prompt would have passed to it); every other prune is SnapKV's.
void prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    const State s = state_of(ctx);
    const AslHeader &h = *s.h;
    if (!ctx.prompt_w || !h.apply || int32_t(ctx.layer) <= h.sel_layer || hs.len() != h.ring_n) {
        snapkv_prune(ctx, hs, mode);
        return;
    }
    snapkv_keep_only(ctx, hs, s.sel, h.nsel);
}

// Rank variance of the layers in the ring ending at `layer` (m of them), over the union of
// their top-k: mean over those tokens of the population variance of their ranks.
double rank_variance(const State &s, const kvp_config &cfg, uint32_t stage, uint32_t layer, uint32_t m, uint32_t P,
                     uint32_t k) {
    const uint32_t O = cfg.asl_obs_layers;
    double sum = 0.0;
    uint32_t count = 0;
    for (uint32_t t = 0; t < P; ++t) {
        bool top = false;
        for (uint32_t i = 0; i < m && !top; ++i) top = s.ranks[size_t((layer - i) % O) * stage + t] < k;
        if (!top) continue;
        double mean = 0.0;
        for (uint32_t i = 0; i < m; ++i) mean += double(s.ranks[size_t((layer - i) % O) * stage + t]);
        mean /= double(m);
        double v = 0.0;
        for (uint32_t i = 0; i < m; ++i) {
            const double d = double(s.ranks[size_t((layer - i) % O) * stage + t]) - mean;
            v += d * d;
        }
        sum += v / double(m);
        ++count;
    }
    return count ? sum / double(count) : 0.0;
}

void score_layer(PolicyCtx &ctx, StepMode mode) {
    const kvp_config &cfg = ctx.cfg();
    const State s = state_of(ctx);
    AslHeader &h = *s.h;
    const uint32_t layer = ctx.layer, H = cfg.model.n_kv_heads, stage = slots(cfg, ctx.stage());
    if (mode != StepMode::kPrefill || !h.collect || !ctx.store(0).pflag) return;
    const uint32_t n = h.n, w = h.collect, P = n - w;
    h.collect = 0;
    for (uint32_t kv = 0; kv < H; ++kv) ctx.store(kv).pflag = 0;
    const uint32_t wk = w < cfg.budget ? w : cfg.budget, k = cfg.budget - wk;
    // head-summed scores, in fixed head order
    const bool fx = ctx.fixed();
    uint64_t *score_u = reinterpret_cast<uint64_t *>(s.score);
    for (uint32_t t = 0; t < P; ++t) {
        if (fx) {
            uint64_t a = 0;
            for (uint32_t kv = 0; kv < H; ++kv) a += reinterpret_cast<const uint64_t *>(s.votes + size_t(kv) * stage)[t];
            score_u[t] = a;
        } else {
            float a = 0.0f;
            for (uint32_t kv = 0; kv < H; ++kv) a += float(s.votes[size_t(kv) * stage + t]);
            s.score[t] = double(a);
        }
    }
    for (uint32_t t = 0; t < P; ++t) s.idx[t] = t;
    if (fx) {
        std::sort(s.idx, s.idx + P, [score_u](uint32_t a, uint32_t b) {
            return score_u[a] > score_u[b] || (score_u[a] == score_u[b] && a > b);
        });
    } else {
        const double *v = s.score;
        std::sort(s.idx, s.idx + P, [v](uint32_t a, uint32_t b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
    }
    const uint32_t O = cfg.asl_obs_layers;
    if (h.ring_count && (h.ring_last + 1 != layer || h.ring_n != n)) h.ring_count = 0;  // not this prompt's ring
    uint32_t *rank = s.ranks + size_t(layer % O) * stage;
    for (uint32_t r = 0; r < P; ++r) rank[s.idx[r]] = r;
    h.ring_count = h.ring_count + 1 < O ? h.ring_count + 1 : O;
    h.ring_last = layer;
    h.ring_n = n;
    const uint32_t need = O < 2 ? O : 2;
    if (layer < min_layer(cfg) || h.ring_count < need) return;
    const double V = rank_variance(s, cfg, stage, layer, h.ring_count, P, k);
    if (!h.ref_set) {
        h.v_ref = V;
        h.ref_set = 1;
    }
    const double rel = h.v_ref > 0.0 ? V / h.v_ref : (V == 0.0 ? 0.0 : INFINITY);
    s.var[layer] = V;
    s.rel[layer] = rel;
    if (!(rel < double(cfg.asl_tau))) return;
    // the selection: this layer's top-k prefix tokens and the (clamped) window, ascending
    uint32_t ns = 0;
    for (uint32_t t = 0; t < P; ++t)
        if (rank[t] < k) s.sel[ns++] = int32_t(t);
    for (uint32_t t = n - wk; t < n; ++t) s.sel[ns++] = int32_t(t);
    h.nsel = ns;
    h.sel_layer = int32_t(layer);
    // one call: returned to its caller (kvp_selection); a prompt's end: kept by the later layers' ends
    h.fresh = ctx.prompt_w ? 0 : 1;
    h.apply = ctx.prompt_w ? 1 : 0;
}

void layer_phase(PolicyCtx &ctx, StepMode mode) {
    AslHeader &h = *state_of(ctx).h;
    // the ends of one prompt run in layer order; a layer at or before the selecting one starts
    // another round (a prompt past capacity + max_prompt selects early, prompt.h)
    if (ctx.prompt_w && h.apply && int32_t(ctx.layer) <= h.sel_layer) h.apply = 0;
    score_layer(ctx, mode);
    if (ctx.prompt_w && ctx.layer + 1 == ctx.cfg().model.n_layers) h.apply = 0;
}

uint32_t selection_size(const PolicyCtx &ctx, uint32_t n, bool queries) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t layer = ctx.layer;
    // under max_prompt the prompt's end selects (prompt.h): a prefill returns nothing
    if (!queries || ctx.prompt_holds() || state_of(ctx).h->sel_layer >= 0 || layer < min_layer(cfg) ||
        n <= cfg.budget || n > ctx.stage() || !layer_empty(ctx))
        return 0;
    return cfg.budget;
}

uint32_t selection(const PolicyCtx &ctx, const int32_t **idx) {
    const State s = state_of(ctx);
    const uint32_t layer = ctx.layer;
    if (!s.h->fresh || s.h->sel_layer != int32_t(layer)) return 0;
    *idx = s.sel;
    return s.h->nsel;
}

}  // namespace

bool asl_layer_variance(const kvp_cache *c, uint32_t layer, double *var, double *rel) {
    const PolicyCtx ctx = policy_ctx(c, 0);
    if (&policy_of(ctx.cfg()) != &kAslPolicy || layer >= ctx.cfg().model.n_layers) return false;  // asl, or think over it
    const State s = state_of(ctx);
    *var = s.var[layer];
    *rel = s.rel[layer];
    return true;
}

bool asl_state_check(const kvp_cache *c, const uint8_t *region, size_t bytes) {
    const PolicyCtx ctx = policy_ctx(c, 0);
    const kvp_config &cfg = ctx.cfg();
    const uint32_t stage = slots(cfg, ctx.stage()), L = cfg.model.n_layers;
    const Layout o = layout(cfg, ctx.stage());
    if (bytes != o.total) return false;
    AslHeader h;  // the region is little-endian and the host too (state.cpp refuses others)
    memcpy(&h, region, sizeof h);
    if (h.sel_layer < -1 || h.sel_layer >= int32_t(L) || h.nsel > stage || h.nsel > cfg.budget || h.fresh > 1 ||
        h.collect > cfg.obs_window || h.n > stage || h.ring_count > cfg.asl_obs_layers || (h.ring_count && h.ring_last >= L) ||
        h.ring_n > stage || h.ref_set > 1 || h.apply > 1)
        return false;
    for (uint32_t i = 0; i < h.nsel; ++i) {  // ascending prompt token indices
        int32_t t, prev = -1;
        memcpy(&t, region + o.sel + 4 * size_t(i), 4);
        if (i) memcpy(&prev, region + o.sel + 4 * size_t(i - 1), 4);
        if (t < 0 || uint32_t(t) >= stage || t <= prev) return false;
    }
    return true;
}

int32_t asl_selection_layer(const kvp_cache *c) {
    const PolicyCtx ctx = policy_ctx(c, 0);
    return &policy_of(ctx.cfg()) == &kAslPolicy ? state_of(ctx).h->sel_layer : -1;
}

const Policy kAslPolicy = {"asl",          KVP_POS_ORIGINAL, &check,           &plan,
                           &observe,       &prune,           &layer_phase,     &snapkv_evictable,
                           &snapkv_self_prune, &layer_prepare, &state_bytes,   &reset,
                           &selection_size, &selection};

}  // namespace kvp
