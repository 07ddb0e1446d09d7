#include "draft.h"

#include "prompt.h"

#include <string.h>

#include <atomic>

#include "attention.h"
#include "sliding.h"

namespace kvp {
namespace {

// The layer's part of the draft region: positions [D], q [D][n_q_heads*hd], k and v [D][n_kv_heads*hd].
struct DraftLayer {
    int32_t *pos;
    float *q, *k, *v;
};

DraftLayer draft_layer(const kvp_cache *c, uint32_t layer) {
    const kvp_model &m = c->cfg.model;
    const size_t D = c->cfg.max_draft, nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    Sz z;  // checked at create
    char *b = reinterpret_cast<char *>(draft_header(c)) + draft_header_bytes(c->cfg) +
              size_t(layer) * draft_layer_bytes(c->cfg, z);
    DraftLayer d;
    d.pos = reinterpret_cast<int32_t *>(b);
    b += align_up(D * sizeof(int32_t), kAlign);
    d.q = reinterpret_cast<float *>(b);
    b += align_up(D * nq * sizeof(float), kAlign);
    d.k = reinterpret_cast<float *>(b);
    b += align_up(D * nkv * sizeof(float), kAlign);
    d.v = reinterpret_cast<float *>(b);
    return d;
}

// Formatted storage: the draft K and V rows of KV head h ([max_draft][stride] each).
float *draft_rows(const kvp_cache *c, uint32_t h, uint32_t which) {
    const ArenaPlan &p = c->plan;
    const size_t rows = align_up(size_t(c->cfg.max_draft) * p.stride * sizeof(float), kAlign);
    Sz z;  // checked at create
    char *b = reinterpret_cast<char *>(draft_header(c)) + draft_header_bytes(c->cfg) +
              size_t(c->cfg.model.n_layers) * draft_layer_bytes(c->cfg, z);
    return reinterpret_cast<float *>(b + (size_t(h) * 2 + which) * rows);
}

struct DraftJob {
    kvp_cache *c;
    uint32_t layer, n, d0;
    const float *q;  // the call's rows in the draft region
    Out out;
    bool decode;
    std::atomic<uint32_t> next;
};

// One KV head of a draft call on thread tid: the draft rows of the layer's draft tokens, the
// store's runs plus the draft run(s), attention without scores.
void draft_head(DraftJob &j, uint32_t h, size_t tid) {
    kvp_cache *c = j.c;
    const kvp_model &m = c->cfg.model;
    const ArenaPlan &p = c->plan;
    const HeadStore &hs = head_of(c, j.layer, h);
    BlockPool &pool = c->pools[h];
    char *scr = c->scratch + tid * p.scratch_bytes;
    Run *runs = reinterpret_cast<Run *>(scr + p.scr_runs);
    const bool realign = c->positions == KVP_POS_REALIGN;
    const DraftLayer dl = draft_layer(c, j.layer);
    const uint32_t D = j.d0 + j.n, L = hs.len(), hd = m.head_dim;
    const uint32_t dslot = pool.stage_slot + pool.stage;  // after the pool's staging slots (cache_init.cpp)
    // Draft token d sits at logical L + d; a twin prefill would pin it (streaming's sinks) while
    // the body is empty and the pinned prefix not full, and rotate it where store_token does.
    const uint32_t npin = hs.count == 0 && hs.npin < hs.pin_cap ? (hs.pin_cap - hs.npin < D ? hs.pin_cap - hs.npin : D) : 0;
    float *fk = c->fmt ? draft_rows(c, h, 0) : nullptr, *fv = c->fmt ? draft_rows(c, h, 1) : nullptr;
    // Every draft row of the layer is rewritten: the slots are shared by the layers.
    for (uint32_t d = 0; d < D; ++d) {
        const int64_t rot = !realign ? int64_t(dl.pos[d]) : int64_t(L) + d + (d < npin ? 0 : hs.shift);
        float *kr = fk ? fk + size_t(d) * p.stride : pool.k_row(dslot + d);
        float *vr = fv ? fv + size_t(d) * p.stride : pool.v_row(dslot + d);
        const size_t off = (size_t(d) * m.n_kv_heads + h) * hd;
        memcpy(kr, dl.k + off, hd * sizeof(float));
        memcpy(vr, dl.v + off, hd * sizeof(float));
        if (c->rope.style != KVP_ROPE_NONE) rope_apply(c->rope, rope_table_memo(c->rope, c->memos[tid], rot), kr, 1, p.stride);
        rotate_rows(c, kr, 1, p.stride);  // kv_rotate: as write_token
        rotate_rows(c, vr, 1, p.stride);
        pool.pos[dslot + d] = dl.pos[d];
        pool.rot[dslot + d] = int32_t(rot);
    }
    uint32_t nr = c->fmt ? fmt_runs(c, hs, pool, realign, StagedNew{}, runs) : store_runs(hs, pool, realign, runs);
    const uint32_t src = c->fmt ? uint32_t(kSrcStaged) : 0u;
    if (npin) runs[nr++] = Run{dslot, npin, L, src, 0};
    if (D > npin) runs[nr++] = Run{dslot + npin, D - npin, L + npin, src, realign ? hs.shift : 0};
    AttnIn a{c, &pool, runs, nr, L + D, &c->memos[tid], reinterpret_cast<float *>(scr + p.scr_work),
             reinterpret_cast<float *>(scr + p.scr_part), reinterpret_cast<float *>(scr + p.scr_priv)};
    FmtIn fin;
    if (c->fmt) {
        const FmtPlan &fp = c->fmt->fp;
        char *sf = scr + p.scr_fmt;
        fin = FmtIn{c->fmt,
                    &fmt_store(*c->fmt, hs),
                    StagedNew{L, D, fk, fv, p.stride, p.stride},
                    reinterpret_cast<float *>(sf + fp.s_qg),
                    reinterpret_cast<float *>(sf + fp.s_qs),
                    reinterpret_cast<float *>(sf + fp.s_bias),
                    reinterpret_cast<float *>(sf + fp.s_oacc),
                    reinterpret_cast<float *>(sf + fp.s_zacc),
                    reinterpret_cast<int8_t *>(sf + fp.s_qi),
                    reinterpret_cast<float *>(sf + fp.s_qsc)};
        a.fmt = &fin;
    }
    const size_t tok = size_t(m.n_q_heads) * hd, qoff = size_t(h) * c->group * hd;
    const NewPositions np{dl.pos + j.d0, 0};
    const QueryPos qp{&np, realign, L + j.d0};
    // A local layer (sliding.h) holds up to W - 1 committed keys plus the draft: its queries are
    // masked to their windows, a decode too (through the prefill tiles, which mask).
    a.window = layer_window(c->cfg, j.layer);
    if (j.decode && !a.window) attend_decode(a, j.q + qoff, qp.at(0), j.out + qoff, false);
    else if (j.decode || j.out) attend_prefill(a, j.n, qp, j.q + qoff, j.out + qoff, tok);
}

void draft_worker(void *arg, uint32_t tid) {
    DraftJob &j = *static_cast<DraftJob *>(arg);
    for (;;) {
        const uint32_t h = j.next.fetch_add(1, std::memory_order_relaxed);
        if (h >= j.c->cfg.model.n_kv_heads) return;
        draft_head(j, h, tid);
    }
}

}  // namespace

void draft_reset(kvp_cache *c) {
    if (uint32_t *hd = draft_header(c)) memset(hd, 0, sizeof(uint32_t) * (size_t(c->cfg.model.n_layers) + 1));
}

int64_t draft_next_pos(const kvp_cache *c, uint32_t layer) {
    const uint32_t d = draft_open(c) ? draft_header(c)[1 + layer] : 0;
    return d ? int64_t(draft_layer(c, layer).pos[d - 1]) + 1 : c->layers[layer].next_pos;
}

kvp_status draft_check(const kvp_cache *c, uint32_t layer, uint32_t n, bool q, Msg &m) {
    const uint32_t d0 = draft_header(c)[1 + layer];
    if (!q) {
        m.s("a draft is open: kvp_prefill needs q (kvp_draft_commit replays the accepted tokens with it)");
        return KVP_ERR_ARG;
    }
    if (uint64_t(d0) + n > c->cfg.max_draft) {
        m.s("layer ").u(layer).s(" holds ").u(d0).s(" draft tokens; ").u(n).s(" more exceed max_draft=").u(c->cfg.max_draft);
        return KVP_ERR_FULL;
    }
    // At commit the accepted tokens go in as one prefill: it must fit now (nothing changes until then).
    const kvp_status st = cache_room_check(c, layer, d0 + n, true, m);
    if (st != KVP_OK) return st;
    const Policy &pol = *c->policy;
    if (pol.selection_size && pol.selection_size(policy_ctx(c, layer), d0 + n, true)) {
        m.s("policy ").s(pol.name).s(": a prefill of layer ").u(layer)
            .s(" may make the prompt selection here; draft only after the selection (or after the prompt)");
        return KVP_ERR_UNSUPPORTED;
    }
    return KVP_OK;
}

void draft_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, In q, In k, In v, Out out,
                bool decode) {
    const kvp_model &m = c->cfg.model;
    const DraftLayer dl = draft_layer(c, layer);
    const uint32_t d0 = draft_header(c)[1 + layer];
    const int64_t first = draft_next_pos(c, layer);
    const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    for (uint32_t i = 0; i < n; ++i) dl.pos[d0 + i] = positions ? positions[i] : int32_t(first + i);
    q.load(dl.q + d0 * nq, n * nq);
    k.load(dl.k + d0 * nkv, n * nkv);
    v.load(dl.v + d0 * nkv, n * nkv);
    draft_header(c)[1 + layer] = d0 + n;
    DraftJob j;
    j.c = c;
    j.layer = layer;
    j.n = n;
    j.d0 = d0;
    j.q = dl.q + d0 * nq;  // the same bits as the caller's (widened) rows
    j.out = out;
    j.decode = decode;
    j.next.store(0, std::memory_order_relaxed);
    // Threads as an ordinary call of this size would take them (the same bits for any count).
    uint32_t nt = 1;
    if (pool_parallel(c->tpool) && c->cfg.threads > 1 && (out || decode)) {
        const uint64_t pw = par_work_now(c);
        if (pw == 0 || step_work(c, layer, n, decode ? StepMode::kDecode : StepMode::kPrefill, true) >= double(pw)) nt = c->cfg.threads < m.n_kv_heads ? c->cfg.threads : m.n_kv_heads;
    }
    if (out || decode) pool_run(c->tpool, nt, draft_worker, &j);
}

kvp_status draft_begin(kvp_cache *c, Msg &m) {
    if (!c->cfg.max_draft) {
        m.s("this cache was created with max_draft=0: set max_draft=N (draft tokens per layer) to draft");
        return KVP_ERR_CONFIG;
    }
    if (draft_open(c)) {
        m.s("a draft is already open: kvp_draft_commit it first");
        return KVP_ERR_STATE;
    }
    draft_header(c)[0] = 1;
    return KVP_OK;
}

kvp_status draft_commit(kvp_cache *c, uint32_t accepted, Msg &m) {
    const kvp_model &md = c->cfg.model;
    if (!draft_open(c)) {
        m.s("no draft is open: call kvp_draft_begin first");
        return KVP_ERR_STATE;
    }
    for (uint32_t l = 0; l < md.n_layers; ++l) {
        if (accepted > draft_header(c)[1 + l]) {
            m.s("accepted=").u(accepted).s(" exceeds the ").u(draft_header(c)[1 + l]).s(" draft tokens of layer ").u(l);
            return KVP_ERR_ARG;
        }
    }
    // Each layer's room was checked when its drafts came; a shared pool also gives blocks to the
    // layers before it in the same replay.
    if (accepted && c->plan.shared && !c->plan.stage && cache_prefill_room(c) < accepted) {
        m.s("the shared pool (total_capacity=").u(c->cfg.total_capacity).s(") cannot take ").u(accepted)
            .s(" tokens in every layer in turn: commit fewer");
        return KVP_ERR_FULL;
    }
    draft_header(c)[0] = 0;
    if (accepted) {
        for (uint32_t l = 0; l < md.n_layers; ++l) {
            const DraftLayer dl = draft_layer(c, l);
            // as the caller's kvp_prefill of them would: under max_prompt through the prompt (prompt.h),
            // which ends with the commit (accepted tokens are generated ones: the next call is a decode)
            if (prompt_takes(c, l)) prompt_prefill(c, l, accepted, dl.pos, dl.q, dl.k, dl.v, Out());
            else cache_step(c, l, accepted, dl.pos, dl.q, dl.k, dl.v, nullptr, StepMode::kPrefill);
        }
        prompt_finish_all(c);
    }
    draft_reset(c);
    return KVP_OK;
}

}  // namespace kvp
