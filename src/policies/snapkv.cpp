#include "policies/snapkv.h"

#include <algorithm>

#include "policies/h2o.h"

namespace kvp {
namespace {

// Policy scratch of a selection, for Lmax = capacity + prefill_stage tokens: the votes (uniform
// only), then tmp, idx and victims.
struct SelScratch {
    double *vote;      // [Lmax] float mode
    uint64_t *vote_u;  // [Lmax] fixed mode (same memory as vote)
    double *tmp;       // [Lmax] a query head's pooled votes (float), then the kept marks
    uint64_t *tmp_u;
    uint32_t *idx;     // [Lmax]
    uint32_t *victims; // [Lmax]
};
constexpr size_t kBytesPerToken = 24;
constexpr size_t kAdaBytesPerToken = 16;  // head_budget=ada: the votes are in the state region

// head_budget=ada (see "AdaKV" below): the state region, transient (policy.h state_transient):
// per KV head its AdaMeta, then the layer's votes (8 bytes per token), written in each head's own
// work, head h's after those of heads 0..h-1 (AdaMeta::voff). The layer phase's candidates (u64)
// and kept marks (a byte per token, at the same offsets) sit in the phase region (policy.h
// phase_bytes). Both are sized for the most tokens a selection ranks in all of a layer's heads
// together (ada_tokens), not KV heads x the longest store.
struct AdaMeta {
    uint32_t pending;     // prune deferred a selection to the layer phase
    uint32_t staged, stage_slot, prompt_w;  // the head's PolicyCtx fields at that prune
    uint32_t L, P;        // tokens the selection ranks, of which the prefix (not the window)
    uint32_t mx;          // the most the head may keep (its store's room, one decode slot left)
    uint32_t u;           // what uniform keeps (the head's share)
    uint32_t kept;        // tokens kept so far (the layer phase)
    uint32_t voff;        // the head's first vote and kept mark (ada_voff)
};
struct AdaRegion {
    AdaMeta *meta;
    char *votes;          // head h's at votes + meta[h].voff * 8
};
inline bool ada(const kvp_config &cfg) { return cfg.head_budget == KVP_HEAD_BUDGET_ADA; }
// The most tokens one selection ranks in all KV heads of a layer together: per head its store
// (the layer's heads hold at most the capacity each, and an open prompt's room each: policy.h
// layer_tokens_cap) plus a staged chunk. The votes, candidates and marks hold that many.
uint64_t ada_tokens(const kvp_config &cfg, uint32_t stage) {
    const Policy &pol = policy_of(cfg);
    uint64_t most = 0;
    for (uint32_t l = 0; l < cfg.model.n_layers; ++l) {
        LayerPlan lp;
        pol.plan(cfg, l, &lp);
        const uint64_t n = uint64_t(lp.cap) + stage + layer_prompt_room(cfg, l);
        if (n > most) most = n;
    }
    return cfg.model.n_kv_heads * most;
}
size_t ada_bytes(const kvp_config &cfg, uint32_t stage) {
    return align_up(sizeof(AdaMeta) * cfg.model.n_kv_heads, kAlign) + align_up(8 * ada_tokens(cfg, stage), kAlign);
}
AdaRegion ada_region(const PolicyCtx &ctx) {
    char *b = static_cast<char *>(ctx.state());
    AdaRegion r;
    r.meta = reinterpret_cast<AdaMeta *>(b);
    r.votes = b + align_up(sizeof(AdaMeta) * ctx.cfg().model.n_kv_heads, kAlign);
    return r;
}
// Where head ctx.head's votes and marks start in a selection: the tokens its layer's lower KV
// heads rank (each its store and the staged chunk). The stores do not change while a selection's
// per-head work runs (a staged chunk waits in the staging slots, which need no room from the
// store; the prompt's end appends nothing; ada's prunes defer to the layer phase), so every head
// reads the same lengths, and the layer phase (before it commits) too.
uint32_t ada_voff(const PolicyCtx &ctx) {
    uint32_t off = 0;
    for (uint32_t h = 0; h < ctx.head; ++h) off += ctx.store(h).len() + ctx.staged;
    return off;
}
struct AdaPhase {
    uint64_t *cand;       // [ada_tokens]
    uint8_t *kept;        // [ada_tokens], head h's at meta[h].voff
};
AdaPhase ada_phase_region(const PolicyCtx &ctx) {
    char *b = static_cast<char *>(ctx.phase());
    const uint64_t n = ada_tokens(ctx.cfg(), ctx.stage());
    return AdaPhase{reinterpret_cast<uint64_t *>(b), reinterpret_cast<uint8_t *>(b + align_up(8 * n, kAlign))};
}

SelScratch sel_scratch(const PolicyCtx &ctx, const HeadStore &) {
    // the layer's capacity, plus a staged chunk or a whole prompt beyond it (prompt.h)
    // (a store holds up to store_cap: heads that lend, policy.h)
    const size_t lmax = size_t(ctx.plan().store_cap) + ctx.stage() + ctx.prompt_room();
    char *b = static_cast<char *>(ctx.scratch);
    SelScratch s;
    s.vote = reinterpret_cast<double *>(b);
    s.vote_u = reinterpret_cast<uint64_t *>(b);
    if (ada(ctx.cfg())) {  // the votes outlive this head's work: the layer phase ranks them
        const AdaRegion r = ada_region(ctx);
        s.vote = reinterpret_cast<double *>(r.votes + size_t(r.meta[ctx.head].voff) * 8);
        s.vote_u = reinterpret_cast<uint64_t *>(s.vote);
    } else {
        b += 8 * lmax;  // the votes (ada: in the state region, so the scratch holds 8 bytes less per token)
    }
    s.tmp = reinterpret_cast<double *>(b);
    s.tmp_u = reinterpret_cast<uint64_t *>(b);
    s.idx = reinterpret_cast<uint32_t *>(b + 8 * lmax);
    s.victims = reinterpret_cast<uint32_t *>(b + 12 * lmax);
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

// The top n of the prefix [0, P) of a head's votes vb by SnapKV's order (higher vote, then
// newer), marked kept; idx: P entries of scratch.
void mark_top(const char *vb, uint8_t *kept, bool fx, uint32_t P, uint32_t n, uint32_t *idx) {
    if (n == 0) return;
    for (uint32_t j = 0; j < P; ++j) idx[j] = j;
    if (fx) {
        const uint64_t *v = reinterpret_cast<const uint64_t *>(vb);
        std::nth_element(idx, idx + (n - 1), idx + P,
                         [v](uint32_t a, uint32_t b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
    } else {
        const double *v = reinterpret_cast<const double *>(vb);
        std::nth_element(idx, idx + (n - 1), idx + P,
                         [v](uint32_t a, uint32_t b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
    }
    for (uint32_t i = 0; i < n; ++i) kept[idx[i]] = 1;
}

}  // namespace

// AdaKV (Feng et al., arXiv 2407.11550, Sec. 3-4 "Adaptive budget allocation", Algorithm 1): the
// layer keeps as many tokens as the uniform split would, B_l in total, but the choice is one
// top-B_l over the scores of every head of the layer, so heads whose votes concentrate on few
// tokens give budget to heads whose votes are spread. Our reading, pinned here (kvpress
// adakv_press.py is the reference we match in shape):
// - Scores: each head's SnapKV votes (pooled, group mean; fixed: group sums), which are
//   comparable across heads (every observed query's weights sum to 1 over the same keys).
// - Safeguard (kvpress alpha_safeguard, the paper's floor): head h first keeps floor(ada_floor *
//   u_h) tokens, u_h being what uniform keeps (min(budget, L_h, room)); its observation window
//   counts towards it and is always kept, as the reference's window scores are the maximum; the
//   rest of the floor is the head's best-voted prefix tokens.
// - Then the remaining sum(u_h) - sum(floors) tokens are the best over all heads' other prefix
//   tokens, ordered by vote, then newer token, then lower head (a total order: the same choice for
//   every thread count and ISA); a head stops taking at mx_h = min(L_h, room_h, capacity - 1)
//   (its home must hold them, one slot left for the next decode; the reference's flat buffer
//   has no such cap, the arena does: docs/DECISIONS.md "AdaKV per-head budgets").
// - Decoding (the reference appends every generated token to every head): heads lend blocks
//   (pool.h "Lending"), so a head grows past the capacity, up to its store's 2 x capacity, with
//   the blocks the layer's other heads leave; it evicts by its scores (h2o's rule) only at that
//   store cap or when no pool has a block for it.
// - Chunked prompts: each selection (a staged chunk, or a whole prompt's end) is one allocation
//   over what every head holds plus the chunk, like SnapKV's.
// Runs in the layer phase, after every head's votes were computed in its own per-head work.
void snapkv_ada_phase(PolicyCtx &ctx, uint32_t (*budget_of)(const PolicyCtx &, uint32_t L),
                      void (*after)(const PolicyCtx &, HeadStore &, uint32_t kept, uint32_t share)) {
    const AdaRegion r = ada_region(ctx);
    const kvp_config &cfg = ctx.cfg();
    const uint32_t H = cfg.model.n_kv_heads;
    bool any = false;
    for (uint32_t h = 0; h < H; ++h) any = any || r.meta[h].pending;
    if (!any) return;
    const AdaPhase ph = ada_phase_region(ctx);
    const bool fx = ctx.fixed();
    auto head_ctx = [&](uint32_t h) {
        PolicyCtx ch = ctx.at_head(h);
        ch.staged = r.meta[h].staged;
        ch.stage_slot = r.meta[h].stage_slot;
        ch.prompt_w = r.meta[h].prompt_w;
        return ch;
    };
    uint64_t rest = 0;  // sum(u_h) - sum(floors)
    for (uint32_t h = 0; h < H; ++h) {
        AdaMeta &m = r.meta[h];
        if (!m.pending) continue;
        const PolicyCtx ch = head_ctx(h);
        HeadStore &hs = ctx.store(h);
        const uint32_t L = hs.len() + ch.staged, w = window_of(ch), room = stage_room(ch, hs);
        const uint32_t B = budget_of(ch, L);
        uint32_t u = B < L ? B : L;
        if (u > room) u = room;
        // the layer's capacity bounds a head's share (not its store's: where heads lend, a store
        // grows past it while decoding, with blocks its layer's other heads leave)
        const uint32_t cap = ch.plan().cap;
        uint32_t mx = L < room ? L : room;
        if (cap > 1 && mx > cap - 1) mx = cap - 1;
        if (mx < u) mx = u;
        const uint32_t wk = w < u ? w : u;
        uint32_t fl = uint32_t(double(cfg.ada_floor) * double(u));
        if (fl < wk) fl = wk;
        m.L = L;
        m.P = L - w;
        m.mx = mx;
        m.u = u;
        m.kept = fl;
        uint8_t *kept = ph.kept + m.voff;
        for (uint32_t j = 0; j < L; ++j) kept[j] = j >= L - wk;
        mark_top(r.votes + size_t(m.voff) * 8, kept, fx, m.P, fl - wk, reinterpret_cast<uint32_t *>(ph.cand));
        rest += u - fl;
    }
    // one ranking of every head's remaining prefix tokens
    size_t nc = 0;
    for (uint32_t h = 0; h < H; ++h) {
        const AdaMeta &m = r.meta[h];
        if (!m.pending) continue;
        const uint8_t *kept = ph.kept + m.voff;
        for (uint32_t j = 0; j < m.P; ++j)
            if (!kept[j]) ph.cand[nc++] = uint64_t(h) << 32 | j;
    }
    const char *vb = r.votes;
    const AdaMeta *meta = r.meta;
    auto order = [&](auto *v) {
        std::sort(ph.cand, ph.cand + nc, [v, meta](uint64_t a, uint64_t b) {
            const uint32_t ha = uint32_t(a >> 32), hb = uint32_t(b >> 32), ja = uint32_t(a), jb = uint32_t(b);
            const auto va = v[meta[ha].voff + ja], vb2 = v[meta[hb].voff + jb];
            if (va != vb2) return va > vb2;
            if (ja != jb) return ja > jb;
            return ha < hb;
        });
    };
    if (fx) order(reinterpret_cast<const uint64_t *>(vb));
    else order(reinterpret_cast<const double *>(vb));
    for (size_t i = 0; i < nc && rest > 0; ++i) {
        const uint32_t h = uint32_t(ph.cand[i] >> 32), j = uint32_t(ph.cand[i]);
        AdaMeta &m = r.meta[h];
        if (m.kept >= m.mx) continue;
        ph.kept[m.voff + j] = 1;
        ++m.kept;
        --rest;
    }
    // every head commits its choice, in head order
    for (uint32_t h = 0; h < H; ++h) {
        AdaMeta &m = r.meta[h];
        if (!m.pending) continue;
        PolicyCtx ch = head_ctx(h);
        HeadStore &hs = ctx.store(h);
        const SelScratch s = sel_scratch(ch, hs);
        const uint8_t *kept = ph.kept + m.voff;
        uint32_t nv = 0;
        for (uint32_t j = 0; j < m.L; ++j)
            if (!kept[j]) s.victims[nv++] = j;
        stage_commit(ch, hs, nv ? s.victims : nullptr, nv);
        m.pending = 0;
        if (after) after(ch, hs, m.kept, m.u);
    }
}

size_t snapkv_state_bytes(const kvp_config &cfg, uint32_t stage) { return ada(cfg) ? ada_bytes(cfg, stage) : 0; }

size_t snapkv_phase_bytes(const kvp_config &cfg, uint32_t stage) {
    if (!ada(cfg)) return 0;
    const uint64_t n = ada_tokens(cfg, stage);
    return align_up(8 * n, kAlign) + align_up(n, kAlign);
}

namespace {
uint32_t snapkv_budget_of(const PolicyCtx &ctx, uint32_t) { return ctx.plan().budget; }
// head_budget=ada: a head's decode limit is uniform's (the capacity) moved by what it kept beyond
// its share, so the layer holds what uniform holds (pyramidkv.cpp: its share + generation room).
void ada_after(const PolicyCtx &ctx, HeadStore &hs, uint32_t kept, uint32_t share) {
    hs.pword[0] = uint64_t(kept) + ctx.plan().cap - share;
}
void layer_phase(PolicyCtx &ctx, StepMode) {
    if (ada(ctx.cfg())) snapkv_ada_phase(ctx, &snapkv_budget_of, &ada_after);
}
}  // namespace

void snapkv_observe(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const Obs &obs) {
    add_observed_mass(ctx, runs, nr, obs);  // the h2o score, for decode eviction
    if (!selecting(ctx)) return;
    if (ada(ctx.cfg())) ada_region(ctx).meta[ctx.head].voff = ada_voff(ctx);  // where sel_scratch puts its votes
    const uint32_t L = hs.len() + ctx.staged, P = L - window_of(ctx);
    if (P > 0) compute_votes(ctx, obs, P, sel_scratch(ctx, hs));
}

const void *snapkv_votes(const PolicyCtx &ctx, const HeadStore &hs) { return sel_scratch(ctx, hs).vote; }

void snapkv_prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    // head_budget=ada: the head's own decode limit (ada_after; 0 before a selection)
    const uint64_t limit = ada(ctx.cfg()) ? hs.pword[0] : 0;
    snapkv_prune_keep(ctx, hs, mode, ctx.plan().budget, uint32_t(limit < hs.cap ? limit : hs.cap));
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
    if (selecting(ctx) && ada(ctx.cfg())) {  // the layer phase selects for every head at once
        AdaMeta &am = ada_region(ctx).meta[ctx.head];
        am.pending = 1;  // (its votes' and marks' offset: snapkv_observe, which every selection runs first)
        am.staged = ctx.staged;
        am.stage_slot = ctx.stage_slot;
        am.prompt_w = ctx.prompt_w;
        return;
    }
    if (selecting(ctx)) {
        select_and_commit(ctx, hs, budget);
        return;
    }
    // decode (and prefill without queries): h2o's rule at capacity - 1 (or limit - 1; a store
    // where heads lend is larger than the layer's capacity: the limit comes first)
    const uint32_t lim = limit ? limit : ctx.plan().cap;
    const uint32_t L = hs.len(), D = (lim < hs.cap ? lim : hs.cap) - 1;
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
    // selection; also covers evict_lowest's 12 per stored token
    p->scratch_per_token = ada(cfg) ? kAdaBytesPerToken : kBytesPerToken;
    p->hole_cap = default_hole_cap(cap);
    p->select_in_phase = ada(cfg);
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
                              &snapkv_prune,    &layer_phase,     &snapkv_evictable, &snapkv_self_prune, nullptr,
                              /* state_bytes */ &snapkv_state_bytes, /* reset */ nullptr,
                              /* selection_size */ nullptr, /* selection */ nullptr, /* keeps_prompt */ nullptr,
                              /* observe_queries */ nullptr, /* set_query_stats */ nullptr, /* state_kept */ nullptr,
                              /* streaming_heads */ false, /* state_transient */ true, /* phase_bytes */ &snapkv_phase_bytes};

}  // namespace kvp
