#include "cache.h"

#include <math.h>
#include <new>
#include <string.h>

#include "attention.h"
#include "config.h"
#include "kernels/score_fixed.h"

#if KVP_OPENMP
#include <omp.h>
#endif

namespace kvp {
namespace {

struct Scratch {
    float *work;
    Run *runs;
    void *policy;
    char *fmt;  // formatted storage (FmtPlan scratch)
};

Scratch scratch_of(kvp_cache *c, size_t tid) {
    char *base = c->scratch + tid * c->plan.scratch_bytes;
    return Scratch{reinterpret_cast<float *>(base + c->plan.scr_work), reinterpret_cast<Run *>(base + c->plan.scr_runs),
                   base + c->plan.scr_policy, base + c->plan.scr_fmt};
}

}  // namespace

FixedWork fixed_work(kvp_cache *c, size_t tid) {
    char *base = c->scratch + tid * c->plan.scratch_bytes;
    const ArenaPlan &p = c->plan;
    return FixedWork{reinterpret_cast<int16_t *>(base + p.fx_qx), reinterpret_cast<int16_t *>(base + p.fx_qr),
                     reinterpret_cast<int32_t *>(base + p.fx_qe), reinterpret_cast<uint64_t *>(base + p.fx_z),
                     reinterpret_cast<double *>(base + p.fx_z + align_up(size_t(c->group) * sizeof(uint64_t), kAlign)),
                     reinterpret_cast<int16_t *>(base + p.fx_cs), reinterpret_cast<int64_t *>(base + p.fx_y),
                     reinterpret_cast<uint32_t *>(base + p.fx_obs)};
}

const int16_t *fixed_rope_table(const kvp_cache *c, const FixedWork &w, int64_t pos) {
    if (c->rope.style == KVP_ROPE_NONE) return w.cs;  // unused by fixed::rotate
    if (pos >= 0 && pos < int64_t(c->fixed_rope_n)) return c->fixed_rope + size_t(pos) * 2 * c->rope.pairs;
    fixed::rope_table(c->fixed_freqs, c->rope.pairs, pos, w.cs);
    return w.cs;
}

void fixed_store_key(kvp_cache *c, const BlockPool &pool, uint32_t slot, const float *k, int64_t rot, size_t tid) {
    const FixedWork w = fixed_work(c, tid);
    const uint32_t hd = c->cfg.model.head_dim;
    pool.kexp[slot] = int16_t(fixed::quantize_row(k, hd, w.qx));
    fixed::rotate(c->rope.style, c->rope.pairs, fixed_rope_table(c, w, rot), w.qx, pool.kq_row(slot), hd);
}

namespace {

// Writes one token's K/V row into `slot`, K rotated at `rot` (storage.h), score 0.
// kr / vr: where the K and V rows go (NULL: the pool slot's rows; vr is also NULL for a formatted
// store's staged token, whose V stays in the caller's array).
void write_token(kvp_cache *c, BlockPool &pool, uint32_t slot, int64_t orig, int64_t rot, const float *k,
                 const float *v, RopeMemo &memo, size_t tid, float *kr = nullptr, float *vr = nullptr) {
    const uint32_t hd = c->cfg.model.head_dim;
    if (!c->fmt) {
        kr = pool.k_row(slot);
        vr = pool.v_row(slot);
    }
    memcpy(kr, k, hd * sizeof(float));
    if (vr) memcpy(vr, v, hd * sizeof(float));
    if (c->rope.style != KVP_ROPE_NONE) rope_apply(c->rope, rope_table_memo(c->rope, memo, rot), kr, 1, c->plan.stride);
    pool.pos[slot] = int32_t(orig);
    pool.rot[slot] = int32_t(rot);
    memset(pool.score + slot, 0, sizeof(float));  // 0 as float and as fixed-point bits
    if (pool.kq) fixed_store_key(c, pool, slot, k, rot, tid);
}

// Stores one token's K/V row for a head in its next slot (room was made), K rotated at the
// position its mode gives (storage.h: rot). Formatted stores (quant/store_fmt.h) put the rows in
// the side rows (decode) or the staging row `stage` (prefill/append; V stays in the caller's
// array) until the token's group is converted.
void store_token(kvp_cache *c, HeadStore &hs, BlockPool &pool, uint32_t layer, int64_t orig, const float *k,
                 const float *v, RopeMemo &memo, size_t tid, float *stage) {
    uint32_t slot = 0;
    store_reserve(hs, pool, layer, &slot);
    const bool pinned = hs.next_pinned();
    const int64_t rot = c->positions == KVP_POS_ORIGINAL ? orig : int64_t(hs.len()) + (pinned ? 0 : hs.shift);
    float *kr = nullptr, *vr = nullptr;
    if (c->fmt) fmt_new_rows(c, hs, slot, pinned, stage, &kr, &vr);
    write_token(c, pool, slot, orig, rot, k, v, memo, tid, kr, vr);
    store_commit(hs);
    if (c->fmt && !pinned) ++hs.nres;
}

void head_step(kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, const NewPositions &pos, const float *q,
               const float *k, const float *v, float *out, StepMode mode, size_t tid) {
    const kvp_model &m = c->cfg.model;
    const Policy &pol = *c->policy;
    const LayerPlan &lp = c->layers[layer].geom.lp;
    HeadStore &hs = head_of(c, layer, h);
    BlockPool &pool = c->pools[h];
    RopeMemo &memo = c->memos[tid];
    const Scratch s = scratch_of(c, tid);
    PolicyCtx ctx{c, layer, h, &pool, s.policy, 0, 0};
    // A prefill with queries of a staging policy: the chunk goes to the staging slots (policy.h).
    const bool staged = mode == StepMode::kPrefill && q && lp.staged_prefill;

    // Room first: dead slots are compacted away, then a dry pool makes the policy evict by its
    // own ranking (cache_room_check said that suffices).
    while (!staged && store_blocks_needed(hs, pool.block, n) > pool.allowed(layer)) {
        if (hs.holes) {
            store_compact(hs, pool, layer);
            continue;
        }
        const uint32_t before = hs.len();
        pol.self_prune(ctx, hs, n);
        if (hs.len() == before) break;
    }
    const uint32_t L0 = hs.len();
    const bool realign = c->positions == KVP_POS_REALIGN;
    // Formatted stores stage a prefill/append chunk's rotated keys until its groups convert
    // (staging policies are refused with formatted storage: config.cpp).
    const FmtPlan *fp = c->fmt ? &c->fmt->fp : nullptr;
    float *stage = fp && mode != StepMode::kDecode ? reinterpret_cast<float *>(s.fmt + fp->s_stage) : nullptr;
    if (staged) {
        ctx.staged = n;
        ctx.stage_slot = pool.stage_slot;
        for (uint32_t i = 0; i < n; ++i) {
            const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
            const int64_t rot = realign ? int64_t(L0) + i + hs.shift : pos.at(i);
            write_token(c, pool, pool.stage_slot + i, pos.at(i), rot, k + kv_off, v + kv_off, memo, tid);
        }
    } else {
        for (uint32_t i = 0; i < n; ++i) {
            const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
            store_token(c, hs, pool, layer, pos.at(i), k + kv_off, v + kv_off, memo, tid,
                        stage ? stage + size_t(i) * c->plan.stride : nullptr);
        }
    }
    const uint32_t L = hs.len() + ctx.staged;  // what the queries see
    hs.len_after_append = L;
    StagedNew nw;
    if (stage) {
        nw.L0 = L0;
        nw.n = n;
        nw.k = stage;
        nw.ldk = c->plan.stride;
        nw.v = v + size_t(h) * m.head_dim;
        nw.ldv = size_t(m.n_kv_heads) * m.head_dim;
    }

    const bool attends = mode == StepMode::kDecode || (mode == StepMode::kPrefill && q);
    // The run list is O(blocks): built only when queries read the store.
    uint32_t nr = 0;
    if (attends) nr = c->fmt ? fmt_runs(c, hs, pool, realign, nw, s.runs) : store_runs(hs, pool, realign, s.runs);
    if (staged) s.runs[nr++] = Run{pool.stage_slot, n, L0, 0, realign ? hs.shift : 0};
    FixedWork fw;
    if (pool.kq) fw = fixed_work(c, tid);
    AttnIn a{c, &pool, s.runs, nr, L, &memo, s.work, pool.kq ? &fw : nullptr};
    FmtIn fin;
    if (c->fmt) {
        fin = FmtIn{c->fmt,
                    &fmt_store(*c->fmt, hs),
                    nw,
                    reinterpret_cast<float *>(s.fmt + fp->s_qg),
                    reinterpret_cast<float *>(s.fmt + fp->s_qs),
                    reinterpret_cast<float *>(s.fmt + fp->s_bias),
                    reinterpret_cast<float *>(s.fmt + fp->s_oacc),
                    reinterpret_cast<float *>(s.fmt + fp->s_zacc),
                    reinterpret_cast<int8_t *>(s.fmt + fp->s_qi),
                    reinterpret_cast<float *>(s.fmt + fp->s_qsc)};
        a.fmt = &fin;
    }
    const QueryPos qp{&pos, realign, L0};
    const size_t qoff = size_t(h) * c->group * m.head_dim;
    if (mode == StepMode::kDecode) {
        hs.hoyer = attend_decode(a, q + qoff, qp.at(0), out + qoff, lp.decode_scores);
    } else if (mode == StepMode::kPrefill && q) {
        const size_t tok_stride = size_t(m.n_q_heads) * m.head_dim;
        if (out) attend_prefill(a, n, qp, q + qoff, out + qoff, tok_stride);
        if (lp.obs_queries && pol.observe) {
            const uint32_t w = lp.obs_queries < n ? lp.obs_queries : n;
            Obs obs{nullptr, nullptr, c->plan.logit_ld};
            if (a.fx) obs.u = observe_prefill_fixed(a, n, qp, q + qoff, tok_stride, w);
            else obs.f = observe_prefill(a, n, qp, q + qoff, tok_stride, w);
            pol.observe(ctx, hs, a.runs, a.nr, obs);
        }
        if (lp.obs_extra && pol.observe) {  // a second window (policy.h)
            const uint32_t w = lp.obs_extra < n ? lp.obs_extra : n;
            Obs obs{nullptr, nullptr, c->plan.logit_ld, kObsExtra};
            if (a.fx) obs.u = observe_prefill_fixed(a, n, qp, q + qoff, tok_stride, w);
            else obs.f = observe_prefill(a, n, qp, q + qoff, tok_stride, w);
            pol.observe(ctx, hs, a.runs, a.nr, obs);
        }
    }
    if (mode == StepMode::kDecode && c->layers[layer].observe_decode && pol.observe) {
        // the first decode query's full row (the observation kernels over one query), once
        Obs obs{nullptr, nullptr, c->plan.logit_ld, kObsDecode};
        if (a.fx) obs.u = observe_prefill_fixed(a, 1, qp, q + qoff, 0, 1);
        else obs.f = observe_prefill(a, 1, qp, q + qoff, 0, 1);
        pol.observe(ctx, hs, a.runs, a.nr, obs);
    }
    if (c->fmt) {  // completed groups convert after attention, before the policy prunes
        const StepObs so{&a,        s.runs, realign, s.fmt, q ? q + qoff : nullptr,
                         out ? out + qoff : nullptr, size_t(m.n_q_heads) * m.head_dim, n, &qp};
        fmt_convert(c, hs, pool, nw, so);
        // peak_live_bytes: after the appends (converted: staged rows are scratch), before the prune
        fmt_store(*c->fmt, hs).bytes_after_append = store_bytes(c, hs, pool);
    }
    if (pol.prune) pol.prune(ctx, hs, mode);
    if (ctx.staged) stage_commit(ctx, hs, nullptr, 0);  // a policy that selected nothing keeps what fits
}

}  // namespace

kvp_cache *cache_init(const kvp_config &cfg, const ArenaPlan &plan, void *arena) {
    char *base = static_cast<char *>(arena);
    kvp_cache *c = new (base) kvp_cache;
    memset(c, 0, sizeof *c);
    c->magic = kMagic;
    c->cfg = cfg;
    c->plan = plan;
    c->policy = &policy_of(cfg);
    const kvp_model &m = cfg.model;
    const uint32_t L = m.n_layers, H = m.n_kv_heads;
    c->group = m.n_q_heads / m.n_kv_heads;

    c->positions = config_positions(cfg);
    c->scale = float(1.0 / sqrt(double(m.head_dim)));
    c->kern = kern::attn_f32_best();
    c->skern = kern::score_f32_best();

    double *freqs = reinterpret_cast<double *>(base + plan.off_freqs);
    c->rope.style = m.rope;
    c->rope.pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    rope_init_freqs(m, freqs, c->rope.pairs);
    c->rope.inv_freq = freqs;
    if (plan.kq_stride) {  // score=fixed with a scoring policy
        double *ff = reinterpret_cast<double *>(base + plan.off_fixed_freqs);
        fixed::rope_freqs(m.rope_theta, c->rope.pairs, ff);
        c->fixed_freqs = ff;
        c->fixed_K = fixed::logit_scale(m.head_dim);
        int16_t *ft = reinterpret_cast<int16_t *>(base + plan.off_fixed_rope);
        for (uint32_t pos = 0; pos < plan.fixed_rope_n; ++pos)
            fixed::rope_table(ff, c->rope.pairs, pos, ft + size_t(pos) * 2 * c->rope.pairs);
        c->fixed_rope = ft;
        c->fixed_rope_n = plan.fixed_rope_n;
    }
    float *full = reinterpret_cast<float *>(base + plan.off_rope_full);
    c->rope.full_floats = uint32_t(rope_table_floats(c->rope.pairs));
    for (uint32_t pos = 0; pos < plan.rope_full_n; ++pos) rope_table(c->rope, pos, full + size_t(pos) * c->rope.full_floats);
    c->rope.full = full;
    c->rope.full_n = plan.rope_full_n;

    c->layers = reinterpret_cast<LayerState *>(base + plan.off_layers);
    c->heads = reinterpret_cast<HeadStore *>(base + plan.off_heads);
    c->pools = reinterpret_cast<BlockPool *>(base + plan.off_pools);
    uint32_t *tables = reinterpret_cast<uint32_t *>(base + plan.off_tables);
    uint32_t *home_lo = reinterpret_cast<uint32_t *>(base + plan.off_home);
    uint32_t *min_blocks = reinterpret_cast<uint32_t *>(base + plan.off_minb);

    // Layers, their head stores and block tables; home ranges (pool.h) in proportion to what each
    // layer can hold (exactly that without sharing).
    uint64_t sum_max = 0;
    for (uint32_t l = 0; l < L; ++l) {
        LayerState *ls = new (&c->layers[l]) LayerState;
        memset(ls, 0, sizeof *ls);
        layer_geom(cfg, l, &ls->geom);
        sum_max += ls->geom.max_blocks;
    }
    uint64_t acc = 0;
    size_t t = 0;
    for (uint32_t l = 0; l < L; ++l) {
        const LayerGeom &g = c->layers[l].geom;
        home_lo[l] = plan.shared ? uint32_t(acc * plan.nblocks / (sum_max ? sum_max : 1)) : uint32_t(acc);
        acc += g.max_blocks;
        min_blocks[l] = g.min_blocks;
        for (uint32_t h = 0; h < H; ++h) {
            HeadStore *hs = new (&head_of(c, l, h)) HeadStore;
            memset(hs, 0, sizeof *hs);
            hs->pin_blk = tables + t;
            hs->blk = tables + t + g.pin_blk_cap;
            t += g.max_blocks;
            hs->cap = g.lp.cap;
            hs->pin_cap = g.lp.pin_cap < g.lp.cap ? g.lp.pin_cap : g.lp.cap;
            hs->pin_blk_cap = g.pin_blk_cap;
            hs->blk_cap = g.blk_cap;
            hs->hole_cap = g.lp.hole_cap;
        }
    }
    home_lo[L] = plan.nblocks;
    if (store_formatted(cfg)) {  // the formatted-storage region (its plan is a function of the config)
        uint32_t max_pin = 0;
        for (uint32_t l = 0; l < L; ++l) {
            const LayerPlan &lp = c->layers[l].geom.lp;
            const uint32_t pin = lp.pin_cap < lp.cap ? lp.pin_cap : lp.cap;
            if (pin > max_pin) max_pin = pin;
        }
        FmtPlan fp;
        fmt_plan(cfg, plan.stride, plan.block, plan.nblocks, plan.max_cap, max_pin, kTileTokens * c->group, &fp);
        c->fmt = fmt_init_cache(cfg, fp, base + plan.off_fmt, c->heads, c->pools);
    }

    for (uint32_t h = 0; h < H; ++h) {
        BlockPool *p = new (&c->pools[h]) BlockPool;
        memset(p, 0, sizeof *p);
        char *meta = base + plan.off_pool_meta + size_t(h) * plan.pool_meta_bytes;
        char *data = base + plan.off_data + size_t(h) * plan.pool_data_bytes;
        p->next = reinterpret_cast<int32_t *>(meta);
        p->dead = reinterpret_cast<uint32_t *>(meta + align_up(sizeof(int32_t) * plan.nblocks, kAlign));
        p->bseq = reinterpret_cast<uint32_t *>(meta + 2 * align_up(sizeof(int32_t) * plan.nblocks, kAlign));
        p->top = reinterpret_cast<int32_t *>(meta + 3 * align_up(sizeof(int32_t) * plan.nblocks, kAlign));
        p->held = reinterpret_cast<uint32_t *>(p->top + L);
        p->home_lo = home_lo;
        p->min_blocks = min_blocks;
        p->k = reinterpret_cast<float *>(data);
        p->v = reinterpret_cast<float *>(data + plan.data_v);
        p->pos = reinterpret_cast<int32_t *>(data + plan.data_pos);
        p->rot = reinterpret_cast<int32_t *>(data + plan.data_rot);
        p->score = reinterpret_cast<float *>(data + plan.data_score);
        if (plan.kq_stride) {
            p->kq = reinterpret_cast<int16_t *>(data + plan.data_kq);
            p->kexp = reinterpret_cast<int16_t *>(data + plan.data_kexp);
            p->kq_stride = plan.kq_stride;
        }
        p->stage_slot = plan.nblocks * plan.block;
        p->stage = plan.stage;
        p->n_layers = L;
        p->nblocks = plan.nblocks;
        p->block = plan.block;
        p->stride = plan.stride;
        if (c->fmt) fmt_init_pool(c->fmt, data, p);
    }

    c->scratch = base + plan.off_scratch;
    c->pstate = plan.pstate_bytes ? base + plan.off_pstate : nullptr;
    c->memos = reinterpret_cast<RopeMemo *>(base + plan.off_memos);
    for (uint32_t i = 0; i < cfg.threads; ++i) {
        RopeMemo *rm = new (&c->memos[i]) RopeMemo;
        rope_memo_init(*rm, reinterpret_cast<float *>(c->scratch + size_t(i) * plan.scratch_bytes),
                       uint32_t(plan.memo_floats / kRopeMemoEntries));
    }
    cache_reset(c);
#if KVP_OPENMP
    // Start the worker threads now: the OpenMP runtime allocates its pool on first use, and
    // no call after kvp_create may allocate.
    if (cfg.threads > 1) {
#pragma omp parallel num_threads(cfg.threads)
        { (void)omp_get_thread_num(); }
    }
#endif
    return c;
}

void cache_reset(kvp_cache *c) {
    const kvp_model &m = c->cfg.model;
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        LayerState &ls = c->layers[l];
        ls.next_pos = 0;
        ls.rows = 0;
        ls.evict_threshold = ls.geom.lp.evict_threshold;
        ls.sparsity = 0.0f;
        ls.lazy = -1;
        memset(ls.pstate, 0, sizeof ls.pstate);
        ls.observe_decode = ls.geom.lp.observe_first_decode;
        ls.bytes = 0;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            HeadStore &hs = head_of(c, l, h);
            store_clear(hs);
            if (c->fmt) fmt_reset_store(fmt_store(*c->fmt, hs), c->fmt->f);
        }
    }
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) c->pools[h].reset();
    c->live_rows = c->peak_rows = c->tokens_seen = 0;
    c->live_bytes = c->peak_bytes = 0;
    if (c->policy->reset) c->policy->reset(c);
}

namespace {

// Pool side of taking n tokens into (layer, head) when `allowed` blocks may be taken: whether it
// can (after compacting dead slots and letting the policy evict all it may), and how many new
// blocks it then takes at most (*take). The evictable count is *ev.
bool pool_room(const kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, uint64_t allowed, uint64_t *take,
               uint32_t *ev) {
    const HeadStore &hs = head_of(c, layer, h);
    const BlockPool &pool = c->pools[h];
    const uint32_t need = store_blocks_needed(hs, pool.block, n);
    *ev = 0;
    if (need <= allowed) {
        *take = need;
        return true;
    }
    PolicyCtx ctx{const_cast<kvp_cache *>(c), layer, h, const_cast<BlockPool *>(&pool), nullptr, 0, 0};
    uint32_t e = c->policy->evictable(ctx, hs);
    if (e > hs.body_len()) e = hs.body_len();
    *ev = e;
    *take = allowed;
    return store_blocks_after(hs, pool.block, hs.body_len() - e, c->layers[layer].geom.lp.front_evict, n) <=
           uint64_t(hs.pnb) + hs.nb + allowed;
}

}  // namespace

kvp_status cache_room_check(const kvp_cache *c, uint32_t layer, uint32_t n, bool queries, Msg &m) {
    const kvp_model &md = c->cfg.model;
    if (queries && c->layers[layer].geom.lp.staged_prefill) {  // through the staging area (policy.h)
        if (n > c->plan.stage) {
            m.s("a prefill chunk of ").u(n).s(" tokens exceeds the prompt staging area (prefill_stage=").u(c->plan.stage)
                .s("): chunk the prompt by kvp_prefill_room");
            return KVP_ERR_FULL;
        }
        return KVP_OK;
    }
    for (uint32_t h = 0; h < md.n_kv_heads; ++h) {
        const HeadStore &hs = head_of(c, layer, h);
        if (uint64_t(hs.len()) + n > hs.cap) {
            m.s("layer ").u(layer).s(" holds ").u(hs.len()).s(" of ").u(hs.cap).s(" slots; ").u(n)
                .s(" more do not fit (full policy at capacity, or a prefill chunk larger than the free slots)");
            return KVP_ERR_FULL;
        }
        uint64_t take;
        uint32_t ev;
        if (!pool_room(c, layer, h, n, c->pools[h].allowed(layer), &take, &ev)) {
            m.s("layer ").u(layer).s(" KV head ").u(h).s(": the shared pool (total_capacity=").u(c->cfg.total_capacity)
                .s(") has no free block for ").u(n).s(" more tokens and policy ").s(c->policy->name)
                .s(ev ? " cannot free enough" : " cannot evict");
            return KVP_ERR_FULL;
        }
    }
    return KVP_OK;
}

namespace {

// Whether a chunk of n tokens fits every layer in turn: per pool, each layer's new blocks are
// taken from what the layers before it in the same chunk left (reservations as in pool.h).
bool chunk_fits(const kvp_cache *c, uint32_t n) {
    const kvp_model &m = c->cfg.model;
    if (!c->plan.shared) return true;  // the capacities were checked by the caller
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        const BlockPool &pool = c->pools[h];
        uint64_t nfree = pool.nfree, deficit = pool.deficit;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            const uint64_t own = pool.deficit_of(l), others = deficit - own;
            uint64_t take;
            uint32_t ev;
            if (!pool_room(c, l, h, n, nfree > others ? nfree - others : 0, &take, &ev)) return false;
            nfree -= take;
            deficit -= take < own ? take : own;
        }
    }
    return true;
}

}  // namespace

uint32_t cache_prefill_room(const kvp_cache *c) {
    uint32_t lo = 0, hi = UINT32_MAX;  // fits(lo); the answer is at most min(cap - len)
    const kvp_model &m = c->cfg.model;
    if (c->plan.stage) return c->plan.stage;  // staged policies: any chunk up to the staging area
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            const uint32_t len = head_of(c, l, h).len(), cap = c->layers[l].geom.lp.cap;
            const uint32_t room = cap > len ? cap - len : 0;
            if (room < hi) hi = room;
        }
    }
    if (chunk_fits(c, hi)) return hi;
    while (hi - lo > 1) {  // fits(lo), !fits(hi)
        const uint32_t mid = lo + (hi - lo) / 2;
        if (chunk_fits(c, mid)) lo = mid;
        else hi = mid;
    }
    return lo;
}

void cache_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, const float *q,
                const float *k, const float *v, float *out, StepMode mode) {
    const kvp_model &m = c->cfg.model;
    LayerState &ls = c->layers[layer];
    NewPositions pos{positions, ls.next_pos};

    if (c->policy->layer_prepare) {
        PolicyCtx ctx{c, layer, 0, nullptr, scratch_of(c, 0).policy, 0, 0};
        c->policy->layer_prepare(ctx, n, mode);
    }
    const int nkv = int(m.n_kv_heads);
    auto run = [&](int h, size_t tid) { head_step(c, layer, uint32_t(h), n, pos, q, k, v, out, mode, tid); };
#if KVP_OPENMP
    // threads == 1 never enters OpenMP: libgomp allocates a team even for an if(false) region.
    if (c->cfg.threads > 1) {
#pragma omp parallel for num_threads(c->cfg.threads) schedule(static)
        for (int h = 0; h < nkv; ++h) run(h, size_t(omp_get_thread_num()));
    } else
#endif
    {
        for (int h = 0; h < nkv; ++h) run(h, 0);
    }

    // Peak: after every head appended, before the policy's prunes.
    uint64_t appended = 0, appended_bytes = 0;
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        appended += head_of(c, layer, h).len_after_append;
        const HeadStore &hs = head_of(c, layer, h);
        appended_bytes += c->fmt ? fmt_store(*c->fmt, hs).bytes_after_append : hs.len_after_append * token_bytes(c);
    }
    const uint64_t at_peak = c->live_rows - ls.rows + appended;
    if (at_peak > c->peak_rows) c->peak_rows = at_peak;
    const uint64_t at_peak_bytes = c->live_bytes - ls.bytes + appended_bytes;
    if (at_peak_bytes > c->peak_bytes) c->peak_bytes = at_peak_bytes;

    if (c->policy->layer_phase) {
        PolicyCtx ctx{c, layer, 0, nullptr, scratch_of(c, 0).policy, 0, 0};
        c->policy->layer_phase(ctx, mode);
    }
    if (mode == StepMode::kDecode) ls.observe_decode = false;  // only the first decode is observed
    if (mode == StepMode::kDecode) {  // heads reduced in fixed order
        float hoyer = 0.0f;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) hoyer += head_of(c, layer, h).hoyer;
        ls.sparsity = hoyer / float(m.n_q_heads);
    }
    uint64_t rows = 0, bytes = 0;
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        rows += head_of(c, layer, h).len();
        bytes += store_bytes(c, head_of(c, layer, h), c->pools[h]);
    }
    c->live_rows = c->live_rows - ls.rows + rows;
    ls.rows = rows;
    c->live_bytes = c->live_bytes - ls.bytes + bytes;
    ls.bytes = bytes;
    ls.next_pos = pos.at(n - 1) + 1;
    if (layer == 0) c->tokens_seen += n;
}

}  // namespace kvp
