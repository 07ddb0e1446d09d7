#include "policies/simlayerkv.h"

#include <string.h>

#include "policies/h2o.h"

namespace kvp {
namespace {

const Policy &nonlazy_of(const kvp_config &cfg) { return policy_table(cfg.nonlazy); }

bool is_lazy(const PolicyCtx &ctx) { return ctx.lazy() == 1; }

// Evicts the e tokens at logical [from, from + e) of a compacting store (pin_cap 0).
void evict_range(PolicyCtx &ctx, HeadStore &hs, uint32_t from, uint32_t e) {
    if (e == 0) return;
    uint32_t *slots = static_cast<uint32_t *>(ctx.scratch);
    uint32_t n = 0;
    const uint32_t to = from + e;
    store_for_each_live(hs, *ctx.pool, [&](uint32_t slot, uint32_t m, uint32_t j) {
        const uint32_t a = j > from ? j : from, b = j + m < to ? j + m : to;
        for (uint32_t i = a; i < b; ++i) slots[n++] = slot + (i - j);
    });
    store_evict(hs, *ctx.pool, ctx.layer, slots, n);
    // realign: the survivors after the range moved down by n logical places, so their rotation
    // delta grew by n; new tokens take the same delta (storage.h: rot = j + shift), so the ring
    // stays one run as in streaming (the store scans deltas from rot: it is scattered now).
    if (ctx.realign()) hs.shift += n;
}

// A lazy layer's rule: the first sinks and the last window tokens stay.
void lazy_prune(PolicyCtx &ctx, HeadStore &hs) {
    const kvp_config &cfg = ctx.cfg();
    if (ctx.staged) {  // a later prompt chunk of a lazy snapkv layer: commit sinks + window only
        const uint32_t L = hs.len() + ctx.staged;
        uint32_t keep = cfg.sinks + cfg.window < L ? cfg.sinks + cfg.window : L;
        const uint32_t room = stage_room(ctx, hs);
        if (keep > room) keep = room;
        const uint32_t s = cfg.sinks < keep ? cfg.sinks : keep, recent = keep - s;
        uint32_t *victims = static_cast<uint32_t *>(ctx.scratch);
        uint32_t nv = 0;
        for (uint32_t j = s; j < L - recent; ++j) victims[nv++] = j;
        stage_commit(ctx, hs, victims, nv);
        return;
    }
    const uint32_t L = hs.len();
    if (L <= cfg.sinks + cfg.window) return;
    evict_range(ctx, hs, cfg.sinks, L - cfg.sinks - cfg.window);
}

void plan(const kvp_config &cfg, uint32_t layer, LayerPlan *p) {
    nonlazy_of(cfg).plan(cfg, layer, p);
    if (cfg.lazy_mode == 0) p->obs_extra = cfg.lazy_last;
    else p->observe_first_decode = true;
    if (!p->hole_cap) p->hole_cap = default_hole_cap(p->cap);
    const size_t victims = size_t(p->cap) * sizeof(uint32_t);  // evict_range's slots
    if (p->scratch_bytes < victims) p->scratch_bytes = victims;
    if (p->staged_prefill && p->scratch_per_token < sizeof(uint32_t)) p->scratch_per_token = sizeof(uint32_t);
}

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (cfg.lazy_force && cfg.model.n_layers > 32) {
        m.s("simlayerkv: lazy_force is a bit mask of 32 layers; this model has ").u(cfg.model.n_layers);
        return KVP_ERR_CONFIG;
    }
    const Policy &nl = nonlazy_of(cfg);
    const kvp_status st = nl.check ? nl.check(cfg, m) : KVP_OK;
    if (st != KVP_OK) return st;
    LayerPlan lp;
    nl.plan(cfg, 0, &lp);
    if (uint64_t(cfg.sinks) + cfg.window >= lp.cap) {
        m.s("simlayerkv: sinks+window=").u(uint64_t(cfg.sinks) + cfg.window).s(" must be < the layer capacity ").u(lp.cap)
            .s(" (a lazy layer keeps sinks + window and appends before it evicts; set window or capacity)");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

// Mass on the first sinks + last window keys (pword[0]) and all mass (pword[1]) of the observed
// rows, summed over the group's query heads: doubles in float mode, integers in fixed mode.
void observe_mass(PolicyCtx &ctx, HeadStore &hs, const Obs &obs) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t L = hs.len() + ctx.staged, G = ctx.group();
    const uint32_t S = cfg.sinks < L ? cfg.sinks : L;
    const uint32_t R0 = L > cfg.window ? L - cfg.window : 0, hi = R0 > S ? R0 : S;
    if (obs.u) {
        uint64_t in = 0, all = 0;
        for (uint32_t g = 0; g < G; ++g) {
            const uint32_t *row = obs.u + g * obs.ld;
            for (uint32_t j = 0; j < L; ++j) {
                all += row[j];
                if (j < S || j >= hi) in += row[j];
            }
        }
        hs.pword[0] = in;
        hs.pword[1] = all;
    } else {
        double in = 0.0, all = 0.0;
        for (uint32_t g = 0; g < G; ++g) {
            const float *row = obs.f + g * obs.ld;
            for (uint32_t j = 0; j < L; ++j) {
                all += double(row[j]);
                if (j < S || j >= hi) in += double(row[j]);
            }
        }
        memcpy(&hs.pword[0], &in, sizeof in);
        memcpy(&hs.pword[1], &all, sizeof all);
    }
    hs.pflag = 1;
}

void observe(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const Obs &obs) {
    if (obs.kind == kObsWindow) {
        const Policy &nl = nonlazy_of(ctx.cfg());
        if (nl.observe) nl.observe(ctx, hs, runs, nr, obs);
        return;
    }
    observe_mass(ctx, hs, obs);
}

void prune(PolicyCtx &ctx, HeadStore &hs, StepMode mode) {
    if (is_lazy(ctx)) {
        lazy_prune(ctx, hs);
        return;
    }
    const Policy &nl = nonlazy_of(ctx.cfg());
    if (nl.prune) nl.prune(ctx, hs, mode);
}

// The layer-wide decision once every head observed (fixed head order), then the trim.
void layer_phase(PolicyCtx &ctx, StepMode) {
    const kvp_config &cfg = ctx.cfg();
    const uint32_t H = cfg.model.n_kv_heads, layer = ctx.layer;
    int32_t &lazy_of = ctx.lazy();
    if (!ctx.store(0).pflag) return;  // no observation in this call
    bool lazy;
    if (ctx.fixed()) {
        uint64_t in = 0, all = 0;
        for (uint32_t h = 0; h < H; ++h) {
            in += ctx.store(h).pword[0];
            all += ctx.store(h).pword[1];
        }
        lazy = double(in) > double(cfg.lazy_threshold) * double(all);
    } else {
        double in = 0.0, all = 0.0;
        for (uint32_t h = 0; h < H; ++h) {
            double a, b;
            memcpy(&a, &ctx.store(h).pword[0], sizeof a);
            memcpy(&b, &ctx.store(h).pword[1], sizeof b);
            in += a;
            all += b;
        }
        lazy = in > double(cfg.lazy_threshold) * all;
    }
    for (uint32_t h = 0; h < H; ++h) ctx.store(h).pflag = 0;
    if (cfg.lazy_force) lazy = layer < 32 && ((cfg.lazy_force >> layer) & 1u);
    if (lazy_of == 1) return;  // a lazy layer stays lazy
    lazy_of = lazy ? 1 : 0;
    if (!lazy) return;
    for (uint32_t h = 0; h < H; ++h) {  // trim now; the emptied blocks go back to the pool
        HeadStore &hs = ctx.store(h);
        PolicyCtx hc = ctx.at_head(h);
        lazy_prune(hc, hs);
        store_compact(hs, ctx.pool_of(h), layer);
    }
}

// Non-lazy layers over full keep every prompt token: under max_prompt the layers hold the prompt
// within their capacity (as one call must) and decide their laziness at its end.
bool keeps_prompt(const kvp_config &cfg) { return !nonlazy_of(cfg).prune; }

uint32_t evictable(const PolicyCtx &ctx, const HeadStore &hs) {
    const uint32_t L = hs.len(), S = ctx.cfg().sinks, lazy_e = L > S ? L - S : 0;
    if (is_lazy(ctx)) return lazy_e;
    const uint32_t e = nonlazy_of(ctx.cfg()).evictable(ctx, hs);
    // after a prompt's end the layer may have turned lazy (its sinks then stay): the lesser
    return ctx.prompt_w && lazy_e < e ? lazy_e : e;
}

void self_prune(PolicyCtx &ctx, HeadStore &hs, uint32_t n) {
    if (is_lazy(ctx)) {  // the oldest tokens after the sinks (streaming's ranking)
        const uint32_t L = hs.len(), S = ctx.cfg().sinks < L ? ctx.cfg().sinks : L;
        uint32_t e = dense_self_prune_count(ctx, hs, n);
        if (e > L - S) e = L - S;
        evict_range(ctx, hs, S, e);
        return;
    }
    nonlazy_of(ctx.cfg()).self_prune(ctx, hs, n);
}

}  // namespace

const Policy kSimLayerKvPolicy = {"simlayerkv", KVP_POS_ORIGINAL, &check,     &plan,       &observe,
                                  &prune,       &layer_phase,     &evictable, &self_prune, nullptr,
                                  nullptr,      nullptr,          nullptr,    nullptr,     &keeps_prompt};

}  // namespace kvp
