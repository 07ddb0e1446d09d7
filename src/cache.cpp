#include "cache.h"

#include <math.h>
#include <new>
#include <string.h>

#include "attention.h"
#include "config.h"

#if KVP_OPENMP
#include <omp.h>
#endif

namespace kvp {
namespace {

// Stores token i's K/V row for one head in the next slot, K rotated per the position mode.
void store_token(kvp_cache *c, HeadStore &hs, uint32_t logical, int64_t orig, const float *k,
                 const float *v, RopeMemo &memo) {
    const uint32_t hd = c->cfg.model.head_dim, st = c->plan.stride;
    bool ring;
    const uint32_t slot = hs.next_slot(&ring);
    float *kr = hs.k + size_t(slot) * st;
    memcpy(kr, k, hd * sizeof(float));
    memcpy(hs.v + size_t(slot) * st, v, hd * sizeof(float));
    if (c->rope.style != KVP_ROPE_NONE) {
        const int64_t rpos = c->positions == KVP_POS_ORIGINAL ? orig : int64_t(logical) + (ring ? hs.shift : 0);
        rope_apply(c->rope, rope_table_memo(c->rope, memo, rpos), kr, 1, st);
    }
    hs.pos[slot] = int32_t(orig);
    hs.score[slot] = 0.0f;
    hs.commit_append();
}

// The policy's pruning after tokens were appended to one head (prefill: once per chunk).
void prune_head(kvp_cache *c, HeadStore &hs) {
    if (!c->streaming) return;
    const uint32_t L = hs.len();
    const uint32_t target = streaming_target(c->rule, L);
    if (target < L) hs.evict_ring_front(L - target, c->positions == KVP_POS_REALIGN);
}

void head_step(kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, const NewPositions &pos,
               const float *q, const float *k, const float *v, float *out, StepMode mode, size_t tid) {
    const kvp_model &m = c->cfg.model;
    HeadStore &hs = head_of(c, layer, h);
    const uint32_t L0 = hs.len();
    RopeMemo &memo = c->memos[tid];
    float *scratch = scratch_of(c, tid);
    for (uint32_t i = 0; i < n; ++i) {
        const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
        store_token(c, hs, L0 + i, pos.at(i), k + kv_off, v + kv_off, memo);
    }
    const size_t qoff = size_t(h) * c->group * m.head_dim;
    if (mode == StepMode::kDecode) {
        attend_decode(c, hs, q + qoff, pos.at(0), out + qoff, memo, scratch);
    } else if (mode == StepMode::kPrefill && out) {
        attend_prefill(c, hs, n, pos, q + qoff, out + qoff, size_t(m.n_q_heads) * m.head_dim, memo, scratch);
    }
    prune_head(c, hs);
}

}  // namespace

kvp_cache *cache_init(const kvp_config &cfg, const ArenaPlan &plan, void *arena) {
    char *base = static_cast<char *>(arena);
    kvp_cache *c = new (base) kvp_cache;
    memset(c, 0, sizeof *c);
    c->magic = kMagic;
    c->cfg = cfg;
    c->plan = plan;
    const kvp_model &m = cfg.model;
    c->group = m.n_q_heads / m.n_kv_heads;
    c->positions = config_positions(cfg);
    c->streaming = config_is_streaming(cfg);
    if (c->streaming) c->rule = streaming_rule(cfg);
    c->scale = float(1.0 / sqrt(double(m.head_dim)));
    c->kern = kern::attn_f32_best();

    double *freqs = reinterpret_cast<double *>(base + plan.off_freqs);
    c->rope.style = m.rope;
    c->rope.pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    rope_init_freqs(m, freqs, c->rope.pairs);
    c->rope.inv_freq = freqs;

    c->layers = reinterpret_cast<LayerState *>(base + plan.off_layers);
    c->heads = reinterpret_cast<HeadStore *>(base + plan.off_heads);
    const uint32_t pin = cfg.policy == KVP_POLICY_STREAMING ? cfg.sinks : 0;
    const size_t rows_bytes = size_t(plan.cap) * plan.stride * sizeof(float);
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            char *p = base + plan.off_rows + (size_t(l) * m.n_kv_heads + h) * plan.head_bytes;
            HeadStore *hs = new (&head_of(c, l, h)) HeadStore;
            memset(hs, 0, sizeof *hs);
            hs->k = reinterpret_cast<float *>(p);
            hs->v = reinterpret_cast<float *>(p + rows_bytes);
            hs->pos = reinterpret_cast<int32_t *>(p + 2 * rows_bytes);
            hs->score = reinterpret_cast<float *>(p + 2 * rows_bytes + align_up(plan.cap * sizeof(int32_t), kAlign));
            hs->cap = plan.cap;
            hs->pin_cap = pin;
        }
    }
    c->scratch = reinterpret_cast<float *>(base + plan.off_scratch);
    c->memos = reinterpret_cast<RopeMemo *>(base + plan.off_memos);
    for (uint32_t t = 0; t < cfg.threads; ++t) {
        RopeMemo *rm = new (&c->memos[t]) RopeMemo;
        memset(rm, 0, sizeof *rm);
        rm->tables = c->scratch + size_t(t) * plan.scratch_floats;
        rm->table_floats = uint32_t(plan.memo_floats / kRopeMemoEntries);
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
        c->layers[l].next_pos = 0;
        c->layers[l].rows = 0;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) head_of(c, l, h).clear();
    }
    c->live_rows = c->peak_rows = c->tokens_seen = 0;
}

void cache_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, const float *q,
                const float *k, const float *v, float *out, StepMode mode) {
    const kvp_model &m = c->cfg.model;
    LayerState &ls = c->layers[layer];
    NewPositions pos{positions, ls.next_pos};
    const uint64_t appended = uint64_t(n) * m.n_kv_heads;
    if (c->live_rows + appended > c->peak_rows) c->peak_rows = c->live_rows + appended;

    const int nkv = int(m.n_kv_heads);
    auto run = [&](int h, size_t tid) {
        head_step(c, layer, uint32_t(h), n, pos, q, k, v, out, mode, tid);
    };
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

    uint64_t rows = 0;
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) rows += head_of(c, layer, h).len();
    c->live_rows = c->live_rows - ls.rows + rows;
    ls.rows = rows;
    ls.next_pos = pos.at(n - 1) + 1;
    if (layer == 0) c->tokens_seen += n;
}

}  // namespace kvp
