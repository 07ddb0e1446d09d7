#include "policies/snapkv.h"

#include <algorithm>

#include "policies/h2o.h"

namespace kvp {
namespace {

// Policy scratch of a selection, for Lmax = capacity + prefill_stage tokens.
struct SelScratch {
    double *vote;      // [Lmax] float mode
    uint64_t *vote_u;  // [Lmax] fixed mode (same memory as vote)
    double *tmp;       // [Lmax] a query head's pooled votes (float), then the kept marks
    uint64_t *tmp_u;
    uint32_t *idx;     // [Lmax]
    uint32_t *victims; // [Lmax]
};
constexpr size_t kBytesPerToken = 24;

SelScratch sel_scratch(const PolicyCtx &ctx, const HeadStore &) {
    // the layer's capacity, plus a staged chunk or a whole prompt beyond it (prompt.h)
    const size_t lmax = size_t(ctx.plan().cap) + ctx.stage() +
                        ctx.prompt_room();
    char *b = static_cast<char *>(ctx.scratch);
    SelScratch s;
    s.vote = reinterpret_cast<double *>(b);
    s.vote_u = reinterpret_cast<uint64_t *>(b);
    s.tmp = reinterpret_cast<double *>(b + 8 * lmax);
    s.tmp_u = reinterpret_cast<uint64_t *>(b + 8 * lmax);
    s.idx = reinterpret_cast<uint32_t *>(b + 16 * lmax);
    s.victims = reinterpret_cast<uint32_t *>(b + 20 * lmax);
    return s;
}

// Observing queries of this call: the core observed min(obs_window, chunk) queries; at the end
// of a whole prompt (max_prompt) min(obs_window, the queries it kept).
uint32_t window_of(const PolicyCtx &ctx) {
    const uint32_t w = ctx.cfg().obs_window, n = ctx.prompt_w ? ctx.prompt_w : ctx.staged;
    return w < n ? w : n;
}

// A selection runs on this prune: a staged chunk, or the end of a whole prompt (policy.h).
bool selecting(const PolicyCtx &ctx) { return ctx.staged || ctx.prompt_w; }

// Votes of the prefix [0, P): pooled per query head, then the group mean (fixed: sums).
void compute_votes(const PolicyCtx &ctx, const Obs &obs, uint32_t P, const SelScratch &s) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t G = ctx.group(), k = cfg.pool_kernel, h = k / 2;
    const bool avg = cfg.pool == KVP_POOL_AVG;
    if (obs.u) {
        for (uint32_t j = 0; j < P; ++j) s.vote_u[j] = 0;
        for (uint32_t g = 0; g < G; ++g) {
            const uint32_t *row = obs.u + g * obs.ld;
            for (uint32_t j = 0; j < P; ++j) {
                const uint32_t lo = j >= h ? j - h : 0, hi = j + h < P ? j + h : P - 1;
                uint64_t a = 0;
                for (uint32_t i = lo; i <= hi; ++i) a = avg ? a + row[i] : (row[i] > a ? row[i] : a);
                s.vote_u[j] += a;
            }
        }
        return;
    }
    // float arithmetic in a fixed order (held in doubles only for the shared comparison code)
    for (uint32_t j = 0; j < P; ++j) s.vote[j] = 0.0;
    for (uint32_t g = 0; g < G; ++g) {
        const float *row = obs.f + g * obs.ld;
        for (uint32_t j = 0; j < P; ++j) {
            const uint32_t lo = j >= h ? j - h : 0, hi = j + h < P ? j + h : P - 1;
            float a = avg ? 0.0f : row[lo];
            for (uint32_t i = lo; i <= hi; ++i) a = avg ? a + row[i] : (row[i] > a ? row[i] : a);
            if (avg) a = a / float(k);
            s.vote[j] = double(float(s.vote[j]) + a);
        }
    }
    for (uint32_t j = 0; j < P; ++j) s.vote[j] = double(float(s.vote[j]) / float(G));
}

// The staged selection: keep min(L, budget, room) tokens: the window (the last w, clamped) and
// the best-voted prefix tokens; everything else is a victim.
void select_and_commit(PolicyCtx &ctx, HeadStore &hs, uint32_t budget) {
    const uint32_t L = hs.len() + ctx.staged, w = window_of(ctx), P = L - w;
    const uint32_t room = stage_room(ctx, hs);
    uint32_t keep = budget < L ? budget : L;
    if (keep > room) keep = room;
    if (keep >= L) {
        stage_commit(ctx, hs, nullptr, 0);  // everything fits: nothing is a victim
        return;
    }
    const SelScratch s = sel_scratch(ctx, hs);
    const uint32_t wk = w < keep ? w : keep, sel = keep - wk;
    // marks: 1 = kept
    uint8_t *kept = reinterpret_cast<uint8_t *>(s.tmp);
    for (uint32_t j = 0; j < L; ++j) kept[j] = j >= L - wk;
    if (sel > 0) {
        for (uint32_t j = 0; j < P; ++j) s.idx[j] = j;
        if (ctx.fixed()) {
            const uint64_t *v = s.vote_u;
            std::nth_element(s.idx, s.idx + (sel - 1), s.idx + P,
                             [v](uint32_t a, uint32_t b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
        } else {
            const double *v = s.vote;
            std::nth_element(s.idx, s.idx + (sel - 1), s.idx + P,
                             [v](uint32_t a, uint32_t b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
        }
        for (uint32_t i = 0; i < sel; ++i) kept[s.idx[i]] = 1;
    }
    uint32_t nv = 0;
    for (uint32_t j = 0; j < L; ++j)
        if (!kept[j]) s.victims[nv++] = j;
    stage_commit(ctx, hs, s.victims, nv);
}

}  // namespace

void snapkv_observe(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const Obs &obs) {
    add_observed_mass(ctx, runs, nr, obs);  // the h2o score, for decode eviction
    if (!selecting(ctx)) return;
    const uint32_t L = hs.len() + ctx.staged, P = L - window_of(ctx);
    if (P > 0) compute_votes(ctx, obs, P, sel_scratch(ctx, hs));
}

const void *snapkv_votes(const PolicyCtx &ctx, const HeadStore &hs) { return sel_scratch(ctx, hs).vote; }

void snapkv_prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    snapkv_prune_keep(ctx, hs, mode, ctx.plan().budget, 0);
}

void snapkv_keep_only(PolicyCtx &ctx, HeadStore &hs, const int32_t *keep, uint32_t n) {
    const SelScratch s = sel_scratch(ctx, hs);
    const uint32_t L = hs.len() + ctx.staged;
    uint32_t nv = 0, i = 0;
    for (uint32_t j = 0; j < L; ++j) {
        if (i < n && uint32_t(keep[i]) == j) {
            ++i;
            continue;
        }
        s.victims[nv++] = j;
    }
    stage_commit(ctx, hs, s.victims, nv);
}

uint32_t snapkv_gen_room(const kvp_config &cfg) { return cfg.max_new ? cfg.max_new : cfg.budget; }

void snapkv_prune_keep(PolicyCtx &ctx, HeadStore &hs, StepMode, uint32_t budget, uint32_t limit) {
    if (selecting(ctx)) {
        select_and_commit(ctx, hs, budget);
        return;
    }
    // decode (and prefill without queries): h2o's rule at capacity - 1 (or limit - 1)
    const uint32_t L = hs.len(), D = (limit && limit < hs.cap ? limit : hs.cap) - 1;
    if (L <= D) return;
    const uint32_t recent = ctx.cfg().recent < D ? ctx.cfg().recent : D;
    evict_lowest(ctx, hs, L - D, 0, L - recent, ctx.scratch);
}

uint32_t snapkv_evictable(const PolicyCtx &, const HeadStore &hs) { return hs.body_len(); }

void snapkv_self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) {
    const uint32_t e = dense_self_prune_count(ctx, hs, n), L = hs.len(), recent = ctx.cfg().recent;
    const uint32_t to = L >= recent && L - recent >= e ? L - recent : L;
    evict_lowest(ctx, hs, e, 0, to, ctx.scratch);
}

void snapkv_plan(const kvp_config &cfg, uint32_t budget, uint32_t cap, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = cap;
    p->budget = budget;
    p->decode_scores = true;
    p->obs_queries = cfg.obs_window;
    p->staged_prefill = true;
    p->scratch_per_token = kBytesPerToken;  // selection; also covers evict_lowest's 12 per stored token
    p->hole_cap = default_hole_cap(cap);
}

kvp_status snapkv_check_common(const char *name, const kvp_config &cfg, Msg &m) {
    if (cfg.pool_kernel % 2 == 0) {
        m.s(name).s(": pool_kernel=").u(cfg.pool_kernel).s(" must be odd (padding kernel/2 keeps one vote per token)");
        return KVP_ERR_CONFIG;
    }
    if (cfg.capacity && cfg.capacity <= cfg.budget) {
        m.s(name).s(": capacity=").u(cfg.capacity).s(" must be >= budget+1=").u(uint64_t(cfg.budget) + 1)
            .s(" (decode appends before it evicts)");
        return KVP_ERR_CONFIG;
    }
    if (cfg.capacity && cfg.max_new && uint64_t(cfg.capacity) < uint64_t(cfg.budget) + cfg.max_new) {
        m.s(name).s(": capacity=").u(cfg.capacity).s(" is below budget + max_new = ").u(uint64_t(cfg.budget) + cfg.max_new)
            .s(" (the prompt's selection stays whole while max_new tokens are generated): raise capacity, lower max_new, or leave capacity=0");
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && uint64_t(cfg.budget) + snapkv_gen_room(cfg) > kMaxCapacity) {
        m.s(name).s(": budget + max_new exceeds the capacity limit");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

namespace {

kvp_status check(const kvp_config &cfg, Msg &m) { return snapkv_check_common("snapkv", cfg, m); }

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    snapkv_plan(cfg, cfg.budget, config_capacity(cfg, cfg.budget + snapkv_gen_room(cfg)), p);
}

}  // namespace

const Policy kSnapKvPolicy = {"snapkv",         KVP_POS_ORIGINAL, &check,           &plan,    &snapkv_observe,
                              &snapkv_prune,    nullptr,          &snapkv_evictable, &snapkv_self_prune, nullptr};

}  // namespace kvp
