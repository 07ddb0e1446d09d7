#include "policies/h2o.h"

#include <algorithm>


namespace kvp {

uint32_t h2o_ada_fast_max = 256;

uint32_t dense_self_prune_count(const PolicyCtx &ctx, const HeadStore &hs, uint32_t n) {
    const BlockPool &pool = *ctx.pool;  // the core compacts before it asks (hs.holes == 0)
    const uint64_t room = (uint64_t(hs.nb) + pool.allowed(ctx.layer)) * pool.block;
    const uint64_t want = uint64_t(hs.roff) + hs.count + n;
    const uint64_t e = want > room ? want - room : 1;
    return e > hs.body_len() ? hs.body_len() : uint32_t(e);
}

namespace {

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (cfg.recent > cfg.budget) {
        m.s("h2o: recent=").u(cfg.recent).s(" must be <= budget=").u(cfg.budget);
        return KVP_ERR_CONFIG;
    }
    if (cfg.capacity && cfg.capacity <= cfg.budget) {
        m.s("h2o: capacity=").u(cfg.capacity).s(" must be >= budget+1=").u(uint64_t(cfg.budget) + 1)
            .s(" (the new token is appended before the eviction)");
        return KVP_ERR_CONFIG;
    }
    if (!cfg.capacity && cfg.budget >= kMaxCapacity) { m.s("h2o: budget exceeds the capacity limit"); return KVP_ERR_CONFIG; }
    return KVP_OK;
}

inline bool ada(const kvp_config &cfg) { return cfg.head_budget == KVP_HEAD_BUDGET_ADA; }

// head_budget=ada (see "AdaKV over H2O" below): the phase region (policy.h phase_bytes): a
// scratch row of one head's scores and slots in logical order [smax] (8 bytes each), the kept
// count per head [H], then the layer's candidates (16 bytes each), at most all the layer's
// tokens (policy.h layer_tokens_cap: each candidate is a token of a head, the fast path's
// included); smax = the largest store (its cap, and an open prompt's room: max_prompt, prompt.h).
struct AdaCand {
    uint64_t key;   // rank_key (policy.h): the larger, the better kept
    uint32_t head;  // its KV head, | kKept once kept
    uint32_t slot;  // its slot
};
constexpr uint32_t kKept = 0x80000000u;
// A candidate: slot s of KV head h (policy.h rank_key).
AdaCand cand_of(const BlockPool &pool, uint32_t s, uint32_t h) {
    return AdaCand{rank_key(score_u(pool, s), pool.pos[s]), h, s};
}
// Head h's kept minimum of L tokens: its recent ones (*r) and its floor, at least *r.
uint32_t floor_of(const kvp_config &cfg, uint32_t L, uint32_t *r) {
    const uint32_t u = L < cfg.budget ? L : cfg.budget;
    *r = L < cfg.recent ? L : cfg.recent;
    const uint32_t fl = uint32_t(double(cfg.ada_floor) * double(u));
    return fl < *r ? *r : fl;
}
// Evicts from each head the slots of the candidates cand[0..n) that are its (kept ones carry
// kKept and match no head), head by head; slot: scratch for one head's victims.
void evict_cands(PolicyCtx &ctx, const AdaCand *cand, size_t n, uint32_t *slot) {
    for (uint32_t h = 0; h < ctx.cfg().model.n_kv_heads; ++h) {
        uint32_t nv = 0;
        for (size_t i = 0; i < n; ++i)
            if (cand[i].head == h) slot[nv++] = cand[i].slot;
        if (nv) store_evict(ctx.store(h), ctx.pool_of(h), ctx.layer, slot, nv);
    }
}
uint32_t ada_cap(const kvp_config &cfg) { return config_capacity(cfg, cfg.budget + 1); }
uint32_t ada_smax(const kvp_config &cfg) { return store_cap(cfg, ada_cap(cfg)) + cfg.max_prompt; }
size_t phase_bytes(const kvp_config &cfg, uint32_t) {
    if (!ada(cfg)) return 0;
    const size_t smax = ada_smax(cfg), H = cfg.model.n_kv_heads;
    return align_up(8 * smax, kAlign) + align_up(4 * H, kAlign) +
           align_up(sizeof(AdaCand) * size_t(layer_tokens_cap(cfg, ada_cap(cfg))), kAlign);
}

void plan(const kvp_config &cfg, uint32_t, LayerPlan *p) {
    *p = LayerPlan{};
    p->cap = config_capacity(cfg, cfg.budget + 1);
    p->decode_scores = true;
    // prompt scores (H2O, arXiv 2306.14048 sec. 4: the accumulated attention of every query):
    // all = every prefill query, fused into the prefill attention; window = the last obs_window
    p->obs_all = cfg.prompt_scores == 0;
    p->obs_queries = p->obs_all ? 0 : cfg.obs_window;
    p->scratch_bytes = size_t(p->cap) * 12;  // evict_lowest
    p->hole_cap = default_hole_cap(p->cap);
}

void observe(PolicyCtx &ctx, HeadStore &, const Run *runs, uint32_t nr, const Obs &obs) {
    add_observed_mass(ctx, runs, nr, obs);
}

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode) {
    const kvp_config &cfg = ctx.cfg();
    if (ada(cfg)) return;  // the layer phase decides for every head at once
    const uint32_t L = hs.len();
    if (L <= cfg.budget) return;
    evict_lowest(ctx, hs, L - cfg.budget, 0, L - cfg.recent, ctx.scratch);
}

// The common step of the layer phase below (a decode: the layer evicts as many tokens as its
// heads appended, no head at its store's cap), with the same result in O(tokens x log n): the n
// tokens the full ranking evicts are the n lowest, in eviction order (lower score, older, higher
// head), of the heads' others outside their floor; a head's candidates among them are its n
// lowest others, which lie outside its best (floor - recent) when it has more than floor + n
// others (else only its others - (floor - recent) lowest are). So each head keeps its k lowest
// in a bounded heap over one scan of its store, and the n lowest of those go.
void fast_phase(PolicyCtx &ctx, uint32_t n, AdaCand *cand, uint32_t *slot) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t H = cfg.model.n_kv_heads;
    // the eviction order; as a heap order its top is the heap's last to go (the best kept)
    auto evicted_first = [](const AdaCand &a, const AdaCand &b) { return a.key < b.key || (a.key == b.key && a.head > b.head); };
    size_t nc = 0;
    for (uint32_t h = 0; h < H; ++h) {
        const HeadStore &hs = ctx.store(h);
        const BlockPool &pool = ctx.pool_of(h);
        const uint32_t L = hs.len();
        uint32_t r;
        const uint32_t fl = floor_of(cfg, L, &r);
        const uint32_t others = L - r, extra = fl - r < others ? fl - r : others;
        const uint32_t k = others - extra < n ? others - extra : n;
        if (k == 0) continue;
        AdaCand *heap = cand + nc;
        uint32_t m = 0;
        store_for_each_live(hs, pool, [&](uint32_t s0, uint32_t cnt, uint32_t j) {
            for (uint32_t i = 0; i < cnt && j + i < others; ++i) {
                const AdaCand c = cand_of(pool, s0 + i, h);
                if (m < k) {
                    heap[m++] = c;
                    std::push_heap(heap, heap + m, evicted_first);
                } else if (evicted_first(c, heap[0])) {  // evicted before the heap's best kept
                    std::pop_heap(heap, heap + m, evicted_first);
                    heap[m - 1] = c;
                    std::push_heap(heap, heap + m, evicted_first);
                }
            }
        });
        nc += m;
    }
    // the n lowest of all heads' candidates go, head by head
    if (n < nc) std::nth_element(cand, cand + (n - 1), cand + nc, evicted_first);
    evict_cands(ctx, cand, n < nc ? n : nc, slot);
}

// AdaKV over H2O (Feng et al., arXiv 2407.11550, Sec. 3-4, applied to H2O's Algorithm 1; our
// interpretation, as AdaKV's paper and reference allocate a prompt's budget only): after every
// prune (a decode step, a prefill chunk, a prompt's end) the layer keeps what uniform H2O keeps in
// total, min(its tokens, n_kv_heads x budget), chosen by one ranking of every head's accumulated
// scores (a token's attention mass summed over its group's query heads: every query's weights sum
// to one per head, so the heads' scores share a scale). Pinned here:
// - Head h first keeps its `recent` newest tokens and its best-scored others up to
//   floor(ada_floor * min(L_h, budget)) (the recent ones count towards it), as snapkv's ada keeps
//   its window and floor.
// - The rest of the layer's total goes to the best of all heads' other tokens: higher score,
//   then the newer token (original position), then the lower head. With one KV head that is
//   uniform H2O's choice (it evicts the lowest, older first on ties).
// - A head keeps at most its store's capacity - 1 (the next token must fit): heads lend blocks
//   (pool.h "Lending"), so one head may hold up to twice the layer capacity.
// Runs on the calling thread in the layer phase; victims are evicted head by head in order.
void layer_phase(PolicyCtx &ctx, StepMode) {
    const kvp_config &cfg = ctx.cfg();
    if (!ada(cfg)) return;
    const uint32_t H = cfg.model.n_kv_heads, B = cfg.budget, smax = ada_smax(cfg);
    uint64_t total = 0;
    bool over = false;
    for (uint32_t h = 0; h < H; ++h) {
        const HeadStore &hs = ctx.store(h);
        total += hs.len();
        over = over || hs.len() + 1 > hs.cap;
    }
    const uint64_t keep = total < uint64_t(H) * B ? total : uint64_t(H) * B;
    if (total <= keep && !over) return;
    char *region = static_cast<char *>(ctx.phase());
    float *score = reinterpret_cast<float *>(region);
    uint32_t *slot = reinterpret_cast<uint32_t *>(score + smax);
    uint32_t *held = reinterpret_cast<uint32_t *>(region + align_up(8 * size_t(smax), kAlign));
    AdaCand *cand = reinterpret_cast<AdaCand *>(reinterpret_cast<char *>(held) + align_up(4 * size_t(H), kAlign));
    auto better = [](const AdaCand &a, const AdaCand &b) { return a.key > b.key || (a.key == b.key && a.head < b.head); };
    if (!over && total - keep <= (smax < h2o_ada_fast_max ? smax : h2o_ada_fast_max)) {
        fast_phase(ctx, uint32_t(total - keep), cand, slot);
        return;
    }
    // per head: its recent tokens and floor are kept; its other tokens become candidates
    size_t nc = 0;
    uint64_t rest = keep;
    for (uint32_t h = 0; h < H; ++h) {
        const HeadStore &hs = ctx.store(h);
        const BlockPool &pool = ctx.pool_of(h);
        const uint32_t L = hs.len();
        uint32_t r;
        const uint32_t fl = floor_of(cfg, L, &r);
        scores_logical(hs, pool, score, slot);
        const size_t c0 = nc;
        for (uint32_t j = 0; j + r < L; ++j) cand[nc++] = cand_of(pool, slot[j], h);
        // its best fl - r others are kept: moved to the front of its range
        const size_t others = nc - c0, extra = fl - r < others ? fl - r : others;
        if (extra > 0 && extra < others) std::nth_element(cand + c0, cand + c0 + (extra - 1), cand + nc, better);
        for (size_t i = 0; i < extra; ++i) cand[c0 + i].head |= kKept;
        held[h] = r + uint32_t(extra);
        rest -= held[h];
    }
    size_t m = 0;  // the candidates not kept yet
    for (size_t i = 0; i < nc; ++i)
        if (!(cand[i].head & kKept)) cand[m++] = cand[i];
    // the rest of the total: the best of them over all heads, each head up to its store's
    // capacity - 1 (taken in rank order). Usually no head reaches that: the best `rest` at once.
    auto take = [&](size_t i) {
        const uint32_t h = cand[i].head;
        if (held[h] + 1 >= ctx.store(h).cap) return false;
        ++held[h];
        cand[i].head |= kKept;
        return true;
    };
    if (rest > 0 && rest < m) std::nth_element(cand, cand + (rest - 1), cand + m, better);
    bool capped = false;
    for (size_t i = 0; i < m && i < rest; ++i) capped = !take(i) || capped;
    if (capped) {  // a head reached its store: the rank order decides who takes the rest
        for (size_t i = 0; i < m && i < rest; ++i)
            if (cand[i].head & kKept) cand[i].head &= ~kKept, --held[cand[i].head];
        std::sort(cand, cand + m, better);
        for (size_t i = 0; i < m && rest > 0; ++i)
            if (take(i)) --rest;
    }
    // victims, head by head (a set of its slots: store_evict takes any order)
    evict_cands(ctx, cand, m, slot);
}

uint32_t evictable(const PolicyCtx &, const HeadStore &hs) { return hs.body_len(); }

void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) {
    const uint32_t e = dense_self_prune_count(ctx, hs, n), L = hs.len(), recent = ctx.cfg().recent;
    const uint32_t to = L >= recent && L - recent >= e ? L - recent : L;
    evict_lowest(ctx, hs, e, 0, to, ctx.scratch);
}

}  // namespace

const Policy kH2oPolicy = {"h2o", KVP_POS_ORIGINAL, &check, &plan, &observe, &prune, &layer_phase, &evictable,
                           &self_prune, nullptr,
                            /* state_bytes */ nullptr, /* reset */ nullptr, /* selection_size */ nullptr,
                            /* selection */ nullptr, /* keeps_prompt */ nullptr, /* observe_queries */ nullptr,
                            /* set_query_stats */ nullptr, /* state_kept */ nullptr, /* streaming_heads */ true,
                            /* state_transient */ false, /* phase_bytes */ &phase_bytes};

}  // namespace kvp
