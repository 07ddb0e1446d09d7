// Cache construction and reset: lays the cache object, layers, heads, pools, RoPE and
// fixed-point tables and the policy's state into the arena (arena.h's plan) and starts the
// worker threads. Split from cache.cpp by phase (DECISIONS "cache.cpp by phase").
#include "cache.h"

#include <math.h>
#include <new>
#include <string.h>

#include <atomic>

#include "attention.h"
#include "config.h"
#include "draft.h"
#include "prompt.h"
#include "kernels/score_fixed.h"
#include "sliding.h"

#if !defined(KVP_NO_HEAP)
#include <stdlib.h>
#endif

namespace kvp {

kvp_cache *cache_init(const kvp_config &cfg, const ArenaPlan &plan, void *arena, int *thread_err, const double *caller_freqs,
                      const uint8_t *roles) {
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
    const double base_scale = cfg.attn_scale > 0.0f ? double(cfg.attn_scale) : 1.0 / sqrt(double(m.head_dim));  // issue 21: attn_scale
    // issue 21: the RoPE attention factor a scales every logit by a^2 (docs/rope.md); a = 1 keeps the bits.
    const double ra = double(cfg.rope_attn_factor);
    c->scale = ra == 1.0 ? float(base_scale) : float(base_scale * ra * ra);
    c->kern = kern::attn_f32_best();
    c->skern = kern::score_f32_best();
    c->vkern = kern::vec_f32_best();
    c->rot = cfg.kv_rotate == KVP_ROTATE_HADAMARD ? kern::rotate_f32_best_id() : 0;

    double *freqs = reinterpret_cast<double *>(base + plan.off_freqs);
    c->rope.style = m.rope;
    c->rope.pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    if (caller_freqs) {  // issue 21: the caller's table replaces theta's frequencies in every path
        for (uint32_t i = 0; i < c->rope.pairs; ++i) freqs[i] = caller_freqs[i];
        c->rope_fp = rope_table_fingerprint(freqs, c->rope.pairs);
    } else {
        rope_init_freqs(m, freqs, c->rope.pairs);
    }
    c->rope.inv_freq = freqs;
    if (plan.kq_stride) {  // score=fixed with a scoring policy
        double *ff = reinterpret_cast<double *>(base + plan.off_fixed_freqs);
        if (caller_freqs) {
            for (uint32_t i = 0; i < c->rope.pairs; ++i) ff[i] = caller_freqs[i];
        } else {
            fixed::rope_freqs(m.rope_theta, c->rope.pairs, ff);
        }
        c->fixed_freqs = ff;
        c->fixed_K = ra != 1.0                ? fixed::logit_scale_of(float(base_scale * ra * ra))
                     : cfg.attn_scale > 0.0f ? fixed::logit_scale_of(cfg.attn_scale)
                                             : fixed::logit_scale(m.head_dim);
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
    c->rope.rot = m.rope == KVP_ROPE_GPTJ ? c->vkern->rope_gptj : c->vkern->rope_neox;
    c->rope.call = reinterpret_cast<float *>(base + plan.off_rope_call);
    c->rope.call_first[0] = c->rope.call_first[1] = 0;
    c->rope.call_n[0] = c->rope.call_n[1] = 0;
    c->rope.call_cap = plan.rope_call_n;
    c->rope.call_ranges = plan.rope_call_ranges;

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
        sum_max += ls->geom.home_blocks;
    }
    LayerGeom sg;  // a streaming head's store (DuoAttention)
    stream_geom(cfg, &sg);
    if (roles) c->roles_fp = 2166136261u;
    uint64_t acc = 0;
    size_t t = 0;
    for (uint32_t l = 0; l < L; ++l) {
        const LayerGeom &lg = c->layers[l].geom;
        home_lo[l] = plan.shared ? uint32_t(acc * plan.nblocks / (sum_max ? sum_max : 1)) : uint32_t(acc);
        acc += lg.home_blocks;
        min_blocks[l] = lg.min_blocks;
        for (uint32_t h = 0; h < H; ++h) {
            const LayerGeom &g = store_geom(lg, sg, roles, H, l, h);
            HeadStore *hs = new (&head_of(c, l, h)) HeadStore;
            memset(hs, 0, sizeof *hs);
            hs->pin_blk = tables + t;
            hs->blk = tables + t + g.pin_blk_cap;
            t += g.max_blocks();
            hs->cap = g.lp.store_cap;
            hs->pin_cap = g.lp.pin_cap < g.lp.cap ? g.lp.pin_cap : g.lp.cap;
            hs->pin_blk_cap = g.pin_blk_cap;
            hs->blk_cap = g.blk_cap;
            hs->hole_cap = g.lp.hole_cap;
            hs->role = roles ? roles[size_t(l) * H + h] : uint8_t(KVP_HEAD_RETRIEVAL);
            if (roles) c->roles_fp = (c->roles_fp ^ (hs->role + 1u)) * 16777619u;  // FNV-1a over the table
        }
    }
    if (roles && !c->roles_fp) c->roles_fp = 1;  // 0 means no table
    home_lo[L] = plan.nblocks;
    // A role table: each pool's homes follow its own stores' needs (streaming heads need fewer
    // blocks); the blocks beyond a pool's sum (pools are sized by the largest) go to its last home.
    if (roles)
        for (uint32_t h = 0; h < H; ++h) {
            uint32_t *hl = home_lo + size_t(h) * (L + 1), *mb = min_blocks + size_t(h) * L, a = 0;
            for (uint32_t l = 0; l < L; ++l) {
                const LayerGeom &g = store_geom(c->layers[l].geom, sg, roles, H, l, h);
                hl[l] = a;
                a += g.home_blocks;
                mb[l] = g.min_blocks;
            }
            hl[L] = plan.nblocks;
        }
    else if (plan.pool_homes) {  // heads that lend: the layers' rounding shared over the pools (arena.h pool_home)
        for (uint32_t h = 0; h < H; ++h) home_lo[size_t(h) * (L + 1)] = 0;
        uint32_t rot = 0;
        for (uint32_t l = 0; l + 1 < L; ++l) {  // (the last home ends at nblocks, below)
            LayerGeom g;  // c->layers[l].geom, and the layer's short homes
            uint32_t short_homes;
            layer_geom(cfg, l, &g, &short_homes);
            for (uint32_t h = 0; h < H; ++h) {
                uint32_t *hl = home_lo + size_t(h) * (L + 1);
                hl[l + 1] = hl[l] + pool_home(g, short_homes, H, h, rot);
            }
            rot = (rot + short_homes) % H;
        }
        for (uint32_t h = 0; h < H; ++h) home_lo[size_t(h) * (L + 1) + L] = plan.nblocks;
    }
    if (store_formatted(cfg)) {  // the formatted-storage region (its plan is a function of the config)
        uint32_t max_pin = 0;
        for (uint32_t l = 0; l < L; ++l) {
            const LayerPlan &lp = c->layers[l].geom.lp;
            const uint32_t pin = lp.pin_cap < lp.cap ? lp.pin_cap : lp.cap;
            if (pin > max_pin) max_pin = pin;
        }
        FmtPlan fp;
        fmt_plan(cfg, plan.stride, plan.block, plan.nblocks, plan.max_cap, max_pin, kTileTokens * c->group, plan.stage, &fp);
        c->fmt = fmt_init_cache(cfg, fp, base + plan.off_fmt, c->heads, c->pools);
    }

    for (uint32_t h = 0; h < H; ++h) {
        BlockPool *p = new (&c->pools[h]) BlockPool;
        memset(p, 0, sizeof *p);
        // pool.h "One slot space": block ids and slots are over all pools (plain storage), or
        // the pool's own (formatted storage: its data region, its part of the per-block arrays)
        char *meta = base + plan.off_pool_meta;
        const size_t own = plan.one_space ? 0 : size_t(h) * plan.nblocks;
        char *data = base + plan.off_data + (plan.one_space ? 0 : size_t(h) * plan.pool_data_bytes);
        p->base = plan.one_space ? h * plan.nblocks : 0;
        p->next = reinterpret_cast<int32_t *>(meta) + own;
        p->dead = reinterpret_cast<uint32_t *>(meta + plan.block_meta_bytes) + own;
        p->bseq = reinterpret_cast<uint32_t *>(meta + 2 * plan.block_meta_bytes) + own;
        p->top = reinterpret_cast<int32_t *>(base + plan.off_pool_tops + size_t(h) * plan.pool_meta_bytes);
        p->held = reinterpret_cast<uint32_t *>(p->top + L);
        p->home_lo = plan.pool_homes ? home_lo + size_t(h) * (L + 1) : home_lo;
        p->min_blocks = roles ? min_blocks + size_t(h) * L : min_blocks;
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
        // staging, then draft slots (draft.cpp): after every pool's blocks in one slot space
        p->stage_slot = plan.one_space ? H * plan.nblocks * plan.block + h * (plan.stage + cfg.max_draft)
                                       : plan.nblocks * plan.block;
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
    prompt_init(c);  // the prompt region, before the memos (prompt.h)
    for (uint32_t i = 0; i < cfg.threads; ++i) {
        RopeMemo *rm = new (&c->memos[i]) RopeMemo;
        rope_memo_init(*rm, reinterpret_cast<float *>(c->scratch + size_t(i) * plan.scratch_bytes),
                       uint32_t(plan.memo_floats / kRopeMemoEntries));
    }
    if (c->pstate) memset(c->pstate, 0, plan.pstate_bytes);  // create: all of it (cache_reset may keep a part)
    cache_reset(c);
    c->par_work = kParallelWork;
    c->par_shift = c->par_skips = 0;
    c->par_late = 0.0f;
    bool par_forced = false;
#if !defined(KVP_NO_HEAP)
    // Tests and benchmarks force the parallel paths on small work: KVP_PAR_WORK=<units>
    // (0: every call uses all threads its items allow), for host functions too.
    if (const char *e = getenv("KVP_PAR_WORK")) {
        c->par_work = strtoull(e, nullptr, 10);
        par_forced = true;
    }
#endif
    // The worker threads start now and wait, asleep, for calls (threads.h).
    c->tpool = pool_start(cfg.threads, cfg.thread_pool == KVP_THREAD_POOL_HOST, base + plan.off_threads, thread_err);
    if (*thread_err) {
        c->magic = kDeadMagic;  // not a live cache: a later kvp_create over this arena may proceed
        return nullptr;
    }
    if (c->tpool && par_forced) c->tpool->host_par_work = c->par_work;
    return c;
}

void cache_stop(kvp_cache *c) {
    pool_stop(c->tpool);
    c->tpool = nullptr;
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
    // The policy's region starts as zeros, whatever the arena held or earlier calls left: a saved
    // state (state.cpp writes the whole region) then depends only on the calls made since.
    if (c->pstate) {
        const size_t kept = c->policy->state_kept ? c->policy->state_kept(c->cfg) : 0;  // policy.h
        memset(static_cast<char *>(c->pstate) + kept, 0, c->plan.pstate_bytes - kept);
    }
    if (c->policy->reset) c->policy->reset(policy_ctx(c, 0));
    draft_reset(c);
    prompt_reset(c);
}

}  // namespace kvp
