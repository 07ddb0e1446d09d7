#include "cache.h"

#include <math.h>
#include <new>
#include <string.h>

#include <atomic>

#include "attention.h"
#include "config.h"
#include "draft.h"
#include "kernels/score_fixed.h"
#include "sliding.h"

#if !defined(KVP_NO_HEAP)
#include <stdlib.h>
#endif

namespace kvp {
namespace {

struct Scratch {
    float *work;
    Run *runs;
    void *policy;
    char *fmt;    // formatted storage (FmtPlan scratch)
    float *part;  // decode partials (attention.h)
    float *priv;  // decode query rows
};

Scratch scratch_of(kvp_cache *c, size_t tid) {
    char *base = c->scratch + tid * c->plan.scratch_bytes;
    return Scratch{reinterpret_cast<float *>(base + c->plan.scr_work), reinterpret_cast<Run *>(base + c->plan.scr_runs),
                   base + c->plan.scr_policy, base + c->plan.scr_fmt, reinterpret_cast<float *>(base + c->plan.scr_part),
                   reinterpret_cast<float *>(base + c->plan.scr_priv)};
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
// Half rows (io.h) are widened in this copy; the fixed-point key copy is quantized from the
// widened row before its rotation (the caller's values, as the f32 call's).
void write_token(kvp_cache *c, BlockPool &pool, uint32_t slot, int64_t orig, int64_t rot, In k, In v, RopeMemo &memo,
                 size_t tid, float *kr = nullptr, float *vr = nullptr) {
    const uint32_t hd = c->cfg.model.head_dim;
    if (!c->fmt) {
        kr = pool.k_row(slot);
        vr = pool.v_row(slot);
    }
    k.load(kr, hd);
    if (vr) v.load(vr, hd);
    if (pool.kq) fixed_store_key(c, pool, slot, kr, rot, tid);
    if (c->rope.style != KVP_ROPE_NONE) rope_apply(c->rope, rope_table_memo(c->rope, memo, rot), kr, 1, c->plan.stride);
    rotate_rows(c, kr, 1, c->plan.stride);  // kv_rotate: after RoPE
    if (vr) rotate_rows(c, vr, 1, c->plan.stride);
    pool.pos[slot] = int32_t(orig);
    pool.rot[slot] = int32_t(rot);
    memset(pool.score + slot, 0, sizeof(float));  // 0 as float and as fixed-point bits
}

// Stores one token's K/V row for a head in its next slot (room was made), K rotated at the
// position its mode gives (storage.h: rot). Formatted stores (quant/store_fmt.h) put the rows in
// the side rows (decode) or the staging row `stage` (prefill/append; V stays in the caller's
// array) until the token's group is converted.
void store_token(kvp_cache *c, HeadStore &hs, BlockPool &pool, uint32_t layer, int64_t orig, In k, In v,
                 RopeMemo &memo, size_t tid, float *stage) {
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

// Sliding-window layers (sliding.h): the oldest body tokens of a local layer's store (a ring:
// no pinned prefix, no dead slots) whose original position is at most lim, evicted; and
// at least `over` of them whatever their positions (capacity: only for callers whose positions
// do not ascend). Blocks that empty go back to the pool.
void local_evict(kvp_cache *c, HeadStore &hs, BlockPool &pool, uint32_t layer, int64_t lim, uint32_t over) {
    const uint32_t block = pool.block;
    auto pos_at = [&](uint32_t j) {
        const uint32_t v = hs.roff + j;
        return int64_t(pool.pos[hs.blk[(hs.bhead + v / block) % hs.blk_cap] * block + v % block]);
    };
    uint32_t lo = 0, hi = hs.count;  // the first body token above lim (positions ascend)
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (pos_at(mid) > lim) hi = mid;
        else lo = mid + 1;
    }
    const uint32_t e = lo > over ? lo : over < hs.count ? over : hs.count;
    if (e) store_evict_front(hs, pool, layer, e, c->positions == KVP_POS_REALIGN);
}

// What a head's append leaves for the rest of its step.
struct Appended {
    uint32_t L0 = 0;      // the head's length before the append
    uint32_t staged = 0;  // tokens in the staging slots (a staged prefill), else 0
    StagedNew nw;         // formatted store: the chunk's staged rows (the appending thread's scratch)
};

// Makes room in one head and appends the call's n tokens (thread tid's memo and policy
// scratch): to the staging slots when `staged` (policy.h), else to the store; a formatted
// store stages prefill/append rows when `fmt_stage`.
Appended head_append(kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, const NewPositions &pos, In k, In v,
                     bool staged, bool fmt_stage, size_t tid) {
    const kvp_model &m = c->cfg.model;
    const Policy &pol = *c->policy;
    HeadStore &hs = head_of(c, layer, h);
    BlockPool &pool = c->pools[h];
    PolicyCtx ctx{c, layer, h, &pool, scratch_of(c, tid).policy, 0, 0};

    // A local layer first drops the keys none of the new queries sees (sliding.h).
    const bool local = layer_local(c->cfg, layer);
    if (local) {
        const uint32_t over = hs.len() + n > hs.cap ? hs.len() + n - hs.cap : 0;
        local_evict(c, hs, pool, layer, pos.at(0) - int64_t(c->cfg.sliding_window), over);
    }
    // Room first: dead slots are compacted away, then a dry pool makes the policy evict by its
    // own ranking (cache_room_check said that suffices). A local layer's blocks are reserved.
    while (!staged && !local && store_blocks_needed(hs, pool.block, n) > pool.allowed(layer)) {
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
    Appended ap;
    ap.L0 = L0;
    if (staged) {
        ap.staged = n;
        // formatted storage: the staged rows are the pool's f32 staging rows (store_fmt.h FmtPool)
        const FmtPool *fpo = c->fmt ? &fmt_pool(*c->fmt, pool) : nullptr;
        for (uint32_t i = 0; i < n; ++i) {
            const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
            const int64_t rot = realign ? int64_t(L0) + i + hs.shift : pos.at(i);
            write_token(c, pool, pool.stage_slot + i, pos.at(i), rot, k + kv_off, v + kv_off, c->memos[tid], tid,
                        fpo ? fpo->sk + size_t(i) * c->plan.stride : nullptr,
                        fpo ? fpo->sv + size_t(i) * c->plan.stride : nullptr);
        }
    } else {
        // Formatted stores stage a prefill/append chunk's rotated keys until its groups convert
        // (in the running thread's scratch: such a step stays on one thread).
        const FmtPlan *fp = c->fmt ? &c->fmt->fp : nullptr;
        float *stage = fp && fmt_stage ? reinterpret_cast<float *>(scratch_of(c, tid).fmt + fp->s_stage) : nullptr;
        // The V rows stay in the caller's array, or, half, are widened here into the staging rows
        // after the chunk's K rows (the staging area holds max_cap rows: the C API refuses a half
        // chunk of more than max_cap / 2 tokens, io_stage_limit).
        float *stage_v = stage && !v.f32() ? stage + size_t(n) * c->plan.stride : nullptr;
        for (uint32_t i = 0; i < n; ++i) {
            const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
            if (stage_v) (v + kv_off).load(stage_v + size_t(i) * c->plan.stride, m.head_dim);
            store_token(c, hs, pool, layer, pos.at(i), k + kv_off, v + kv_off, c->memos[tid], tid,
                        stage ? stage + size_t(i) * c->plan.stride : nullptr);
        }
        if (stage) {
            ap.nw.L0 = L0;
            ap.nw.n = n;
            ap.nw.k = stage;
            ap.nw.ldk = c->plan.stride;
            ap.nw.v = stage_v ? stage_v : v.f32() + size_t(h) * m.head_dim;
            ap.nw.ldv = stage_v ? c->plan.stride : size_t(m.n_kv_heads) * m.head_dim;
            if (c->rot) {  // kv_rotate: the staged V rows are rotated copies (cache.h rotv_scratch)
                float *rv = rotv_scratch(c, tid);
                for (uint32_t i = 0; i < n; ++i)
                    memcpy(rv + size_t(i) * c->plan.stride, ap.nw.v + i * ap.nw.ldv, m.head_dim * sizeof(float));
                rotate_rows(c, rv, n, c->plan.stride);
                ap.nw.v = rv;
                ap.nw.ldv = c->plan.stride;
            }
        }
    }
    hs.len_after_append = hs.len() + ap.staged;  // what the queries see
    return ap;
}

// One call on one layer, shared by its participants (pool_run). Two schedules:
//   heads  (prefill, and calls the split cannot take): work item = one KV head, done whole by
//          one thread (append, attention, observation, prune) in its own scratch.
//   split  (decode on 2+ threads, and prefill with queries on more threads than KV heads;
//          plain f32 storage without prompt staging or a decode observation; at most
//          kSplitHeadsMax KV heads): a head's runs, logits and partials live in its own area
//          (head_area), not in a thread's scratch.
//            decode: each participant claims whole heads (j.next), appends to the head, builds
//              its runs, then takes its split-K chunks (attention.h) in order from the front
//              of its own range; with no head left to claim it moves the back half of the
//              largest other range into its own (split_decode). Every thread thus streams K and
//              V upwards (its prefetches run into its own next chunk), and the call ends within
//              about one chunk on every thread instead of one head (DECISIONS.md "Two
//              schedules").
//            prefill: the caller appends to every head first; items are groups of query
//              tiles of one head, largest first.
//          The participant that completes a head's last chunk or tile group merges it
//          (decode_finish), observes and prunes it.
// Either way every head's arithmetic is fixed by the geometry, not by who runs it.
constexpr uint32_t kSplitHeadsMax = 256;  // the most KV heads a split takes (prefill: H < threads <= 256)
constexpr uint32_t kPrefillItemTiles = 4; // query tiles per prefill item
static_assert(kSplitHeadsMax >= kMaxThreads, "a prefill split has fewer KV heads than threads");

struct StepJob {
    kvp_cache *c;
    uint32_t layer, n;
    NewPositions pos;
    In q, k, v;  // f32 or half rows (io.h)
    Out out;
    StepMode mode;
    bool split;
    uint32_t nitems, parts;  // parts: participants (split decode)
    HeadAreaPlan areas;      // split only: the heads' areas (arena.h head_area_plan)
    std::atomic<uint32_t> next;
    // split only: prefill items of head h are [base[h], base[h+1]); decode: range[t] holds
    // participant t's chunks not yet taken (split_decode); left[h] counts the items or chunks of
    // head h not done
    uint32_t base[kSplitHeadsMax + 1];
#if KVP_THREADS  // 64-bit atomics: Cortex-M has none (and no threads, so no split decode)
    std::atomic<uint64_t> range[kMaxThreads];
#endif
    std::atomic<uint32_t> left[kSplitHeadsMax];
    uint32_t nr[kSplitHeadsMax], L0[kSplitHeadsMax];
};

// Head h's area in the split schedules: its runs at 0, logits at .work, partials at .part.
char *head_area(kvp_cache *c, const HeadAreaPlan &p, uint32_t h) {
    return reinterpret_cast<char *>(c) + p.off + size_t(h) * p.bytes;  // the cache object opens the arena
}
Run *head_runs(kvp_cache *c, const HeadAreaPlan &p, uint32_t h) { return reinterpret_cast<Run *>(head_area(c, p, h)); }

// Attention input of head h on thread tid: runs, logits and partials in the thread's scratch
// (heads schedule: areas == nullptr) or in the head's area (split), the rest the thread's.
AttnIn attn_in(kvp_cache *c, uint32_t h, uint32_t nr, uint32_t L, size_t tid, const HeadAreaPlan *areas) {
    const Scratch st = scratch_of(c, tid);
    if (areas) {
        char *b = head_area(c, *areas, h);
        return AttnIn{c, &c->pools[h], reinterpret_cast<Run *>(b), nr, L, &c->memos[tid],
                      reinterpret_cast<float *>(b + areas->work), reinterpret_cast<float *>(b + areas->part), st.priv};
    }
    return AttnIn{c, &c->pools[h], st.runs, nr, L, &c->memos[tid], st.work, st.part, st.priv};
}

// Observation, formatted conversion and prune of one head after its attention (thread tid's
// scratch).
void head_observe_prune(StepJob &j, uint32_t h, const AttnIn &a, const Appended &ap, size_t tid) {
    kvp_cache *c = j.c;
    const kvp_model &m = c->cfg.model;
    const Policy &pol = *c->policy;
    const LayerPlan &lp = c->layers[j.layer].geom.lp;
    HeadStore &hs = head_of(c, j.layer, h);
    BlockPool &pool = c->pools[h];
    const Scratch s = scratch_of(c, tid);
    PolicyCtx ctx{c, j.layer, h, &pool, s.policy, ap.staged, ap.staged ? pool.stage_slot : 0};
    const bool realign = c->positions == KVP_POS_REALIGN;
    const QueryPos qp{&j.pos, realign, ap.L0};
    const size_t tok_stride = size_t(m.n_q_heads) * m.head_dim, qoff = size_t(h) * c->group * m.head_dim;
    if (j.mode == StepMode::kPrefill && j.q && lp.obs_queries && pol.observe) {
        const uint32_t w = lp.obs_queries < j.n ? lp.obs_queries : j.n;
        AttnIn ao = a;
        ao.work = s.work;
        Obs obs{nullptr, nullptr, c->plan.logit_ld};
        if (a.fx) obs.u = observe_prefill_fixed(ao, j.n, qp, j.q + qoff, tok_stride, w);
        else obs.f = observe_prefill(ao, j.n, qp, j.q + qoff, tok_stride, w);
        pol.observe(ctx, hs, a.runs, a.nr, obs);
    }
    if (j.mode == StepMode::kPrefill && j.q && lp.obs_extra && pol.observe) {  // a second window (policy.h)
        const uint32_t w = lp.obs_extra < j.n ? lp.obs_extra : j.n;
        AttnIn ao = a;
        ao.work = s.work;
        Obs obs{nullptr, nullptr, c->plan.logit_ld, kObsExtra};
        if (a.fx) obs.u = observe_prefill_fixed(ao, j.n, qp, j.q + qoff, tok_stride, w);
        else obs.f = observe_prefill(ao, j.n, qp, j.q + qoff, tok_stride, w);
        pol.observe(ctx, hs, a.runs, a.nr, obs);
    }
    if (j.mode == StepMode::kDecode && c->layers[j.layer].observe_decode && pol.observe) {
        // the first decode query's full row (the observation kernels over one query), once; such
        // a decode is never split (cache_step), so this thread's work area is free
        AttnIn ao = a;
        ao.work = s.work;
        Obs obs{nullptr, nullptr, c->plan.logit_ld, kObsDecode};
        if (a.fx) obs.u = observe_prefill_fixed(ao, 1, qp, j.q + qoff, 0, 1);
        else obs.f = observe_prefill(ao, 1, qp, j.q + qoff, 0, 1);
        pol.observe(ctx, hs, a.runs, a.nr, obs);
    }
    if (c->fmt && !ap.staged) {  // completed groups convert after attention, before the policy prunes
        // ThinK reads f32 outputs; with half outputs it recomputes them (think.cpp), the same bits
        const StepObs so{&a, s.runs, realign, s.fmt, j.q ? j.q + qoff : In(), j.out.f32() ? j.out.f32() + qoff : nullptr,
                         tok_stride, j.n, &qp};
        fmt_convert(c, hs, pool, ap.nw, so);
        // peak_live_bytes: after the appends (converted: staged rows are scratch), before the prune
        fmt_store(*c->fmt, hs).bytes_after_append = store_bytes(c, hs, pool);
    } else if (c->fmt) {  // prompt staging: the staged tokens count as f32 residual rows (touched)
        fmt_store(*c->fmt, hs).bytes_after_append =
            store_bytes(c, hs, pool) + uint64_t(ap.staged) * fmt_residual_bytes(c->fmt->f);
    }
    if (layer_local(c->cfg, j.layer)) {  // sliding.h: keep only what the next query can see
        local_evict(c, hs, pool, j.layer, j.pos.at(j.n - 1) + 1 - int64_t(c->cfg.sliding_window), 0);
        return;
    }
    if (pol.prune) pol.prune(ctx, hs, j.mode);
    if (ctx.staged) stage_commit(ctx, hs, nullptr, 0);  // a policy that selected nothing keeps what fits
    if (c->fmt && ap.staged) {
        // The committed staged tokens are the store's last `m` tokens, residual, their rows packed
        // at the front of the staging rows: they convert like a prefill's new tokens (groups that
        // complete are quantized; ThinK selects its channels first if it has none yet, from the
        // call's last w queries, which are the store's last w tokens: the window is kept first).
        const uint32_t mc = ctx.committed, L = hs.len();
        const FmtPool &fpo = fmt_pool(*c->fmt, pool);
        const StagedNew nw{L - mc, mc, fpo.sk, fpo.sv, c->plan.stride, c->plan.stride};
        FmtIn fin = *a.fmt;
        fin.nw = nw;
        AttnIn a2 = a;
        a2.fmt = &fin;
        a2.L = L;
        a2.work = s.work;
        const uint32_t ow = c->cfg.obs_window, w = ow < mc ? (ow < j.n ? ow : j.n) : (mc < j.n ? mc : j.n);
        const NewPositions np{j.pos.given ? j.pos.given + (j.n - w) : nullptr, j.pos.first + (j.n - w)};
        const QueryPos qw{&np, realign, L - w};
        const StepObs so{&a2, s.runs, realign, s.fmt, j.q + (qoff + size_t(j.n - w) * tok_stride),
                         j.out.f32() ? j.out.f32() + qoff + size_t(j.n - w) * tok_stride : nullptr, tok_stride, w, &qw};
        fmt_convert(c, hs, pool, nw, so);
    }
}

// The heads schedule: all of head h on thread tid.
void head_step(StepJob &j, uint32_t h, size_t tid) {
    kvp_cache *c = j.c;
    const kvp_model &m = c->cfg.model;
    const LayerPlan &lp = c->layers[j.layer].geom.lp;
    HeadStore &hs = head_of(c, j.layer, h);
    BlockPool &pool = c->pools[h];
    const Scratch s = scratch_of(c, tid);
    const bool realign = c->positions == KVP_POS_REALIGN;
    // A prefill with queries of a staging policy: the chunk goes to the staging slots (policy.h).
    const bool staged = j.mode == StepMode::kPrefill && j.q && lp.staged_prefill;
    const Appended ap = head_append(c, j.layer, h, j.n, j.pos, j.k, j.v, staged, j.mode != StepMode::kDecode, tid);
    const bool attends = j.mode == StepMode::kDecode || (j.mode == StepMode::kPrefill && j.q);
    // The run list is O(blocks): built only when queries read the store.
    uint32_t nr = 0;
    if (attends) nr = c->fmt ? fmt_runs(c, hs, pool, realign, ap.nw, s.runs) : store_runs(hs, pool, realign, s.runs);
    if (ap.staged) s.runs[nr++] = Run{pool.stage_slot, j.n, ap.L0, c->fmt ? uint32_t(kSrcStaged) : 0u, realign ? hs.shift : 0};
    AttnIn a = attn_in(c, h, nr, hs.len() + ap.staged, tid, nullptr);
    a.window = layer_window(c->cfg, j.layer);
    FixedWork fw;
    if (pool.kq) {
        fw = fixed_work(c, tid);
        a.fx = &fw;
    }
    FmtIn fin;
    if (c->fmt) {
        const FmtPlan &fp = c->fmt->fp;
        // prompt staging: the staged run's rows are the pool's staging rows (kSrcStaged)
        const FmtPool &fpo = fmt_pool(*c->fmt, pool);
        const StagedNew snw{ap.L0, ap.staged, fpo.sk, fpo.sv, c->plan.stride, c->plan.stride};
        fin = FmtIn{c->fmt,
                    &fmt_store(*c->fmt, hs),
                    ap.staged ? snw : ap.nw,
                    reinterpret_cast<float *>(s.fmt + fp.s_qg),
                    reinterpret_cast<float *>(s.fmt + fp.s_qs),
                    reinterpret_cast<float *>(s.fmt + fp.s_bias),
                    reinterpret_cast<float *>(s.fmt + fp.s_oacc),
                    reinterpret_cast<float *>(s.fmt + fp.s_zacc),
                    reinterpret_cast<int8_t *>(s.fmt + fp.s_qi),
                    reinterpret_cast<float *>(s.fmt + fp.s_qsc)};
        a.fmt = &fin;
    }
    const QueryPos qp{&j.pos, realign, ap.L0};
    const size_t qoff = size_t(h) * c->group * m.head_dim;
    if (j.mode == StepMode::kDecode) {
        hs.hoyer = attend_decode(a, j.q + qoff, qp.at(0), j.out + qoff, lp.decode_scores);
    } else if (j.mode == StepMode::kPrefill && j.q && j.out) {
        attend_prefill(a, j.n, qp, j.q + qoff, j.out + qoff, size_t(m.n_q_heads) * m.head_dim);
    }
    head_observe_prune(j, h, a, ap, tid);
}

// The split schedule, one chunk or item of head h (decode: split-K chunk ci, the query rows
// rotated in the thread's scratch unless *cur says they are; prefill: item ci of
// kPrefillItemTiles query tiles). Whoever completes the head's last one merges, observes and
// prunes it (every other one of the head is done and visible: left[h]).
void split_work(StepJob &j, uint32_t h, uint32_t ci, size_t tid, int64_t *cur) {
    kvp_cache *c = j.c;
    const kvp_model &m = c->cfg.model;
    AttnIn a = attn_in(c, h, j.nr[h], head_of(c, j.layer, h).len(), tid, &j.areas);
    a.window = layer_window(c->cfg, j.layer);
    // Prefill: tile scratch, the running thread's. Decode without scores: a chunk's logits are
    // dead after its pv, so they stay in the running thread's scratch too (the head's area has
    // logits only when some layer scores, arena.h head_area_plan).
    if (j.mode == StepMode::kPrefill || !c->layers[j.layer].geom.lp.decode_scores) a.work = scratch_of(c, tid).work;
    FixedWork fw;
    if (c->pools[h].kq) {
        fw = fixed_work(c, tid);
        a.fx = &fw;
    }
    const QueryPos qp{&j.pos, c->positions == KVP_POS_REALIGN, j.L0[h]};
    const size_t qoff = size_t(h) * c->group * m.head_dim;
    if (j.mode == StepMode::kDecode) {
        decode_chunk(a, j.q + qoff, qp.at(0), ci, cur);
    } else if (j.out) {
        const uint32_t t0 = ci * kPrefillItemTiles * kTileTokens;
        const uint32_t t1 = j.n - t0 < kPrefillItemTiles * kTileTokens ? j.n : t0 + kPrefillItemTiles * kTileTokens;
        attend_prefill_tiles(a, j.n, qp, j.q + qoff, j.out + qoff, size_t(m.n_q_heads) * m.head_dim, t0, t1);
    }
    if (j.left[h].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (j.mode == StepMode::kDecode) {
        head_of(c, j.layer, h).hoyer =
            decode_finish(a, j.q + qoff, qp.at(0), j.out + qoff, c->layers[j.layer].geom.lp.decode_scores);
        *cur = INT64_MIN;  // decode_finish reused the query rows' scratch
    }
    Appended ap;
    ap.L0 = j.L0[h];
    head_observe_prune(j, h, a, ap, tid);
}

#if KVP_THREADS
// Split decode work ranges: participant t's chunks not yet taken are [f, b) of head hd, packed
// in range[t] as hd << 56 | b << 28 | f (a head has at most 2^26 chunks: capacity < 2^32,
// granule >= 64; at most kSplitHeadsMax = 256 heads).
constexpr uint32_t kRangeBits = 28;
constexpr uint64_t kRangeMask = (uint64_t(1) << kRangeBits) - 1;
inline uint64_t range_of(uint32_t h, uint32_t f, uint32_t b) {
    return uint64_t(h) << (2 * kRangeBits) | uint64_t(b) << kRangeBits | f;
}
inline uint32_t range_f(uint64_t r) { return uint32_t(r & kRangeMask); }
inline uint32_t range_b(uint64_t r) { return uint32_t(r >> kRangeBits & kRangeMask); }
inline uint32_t range_h(uint64_t r) { return uint32_t(r >> (2 * kRangeBits)); }

// Takes the first chunk of participant tid's own range. Acquire: the head's append and runs,
// released with the range by its owner (a range a thief moved carries that on), are visible.
bool take_own(StepJob &j, size_t tid, uint32_t *h, uint32_t *ci) {
    std::atomic<uint64_t> &R = j.range[tid];
    uint64_t r = R.load(std::memory_order_acquire);
    for (;;) {
        if (range_f(r) >= range_b(r)) return false;
        if (R.compare_exchange_weak(r, r + 1, std::memory_order_acquire, std::memory_order_acquire)) {
            *h = range_h(r);
            *ci = range_f(r);
            return true;
        }
    }
}

// Moves the back half of the largest other range (the lowest participant on ties; the larger
// half, as the victim is still busy with the chunk it took last, so a single chunk left moves
// too) into participant tid's own range; false when every other range is empty.
bool steal_half(StepJob &j, size_t tid) {
    for (;;) {
        uint32_t best = j.parts, most = 0;
        uint64_t seen = 0;
        for (uint32_t t = 0; t < j.parts; ++t) {
            if (t == tid) continue;
            const uint64_t r = j.range[t].load(std::memory_order_acquire);
            if (range_b(r) > range_f(r) && range_b(r) - range_f(r) > most) {
                most = range_b(r) - range_f(r);
                best = t;
                seen = r;
            }
        }
        if (best == j.parts) return false;
        const uint32_t f = range_f(seen), b = range_b(seen), mid = f + (b - f) / 2;  // the victim keeps [f, mid)
        if (j.range[best].compare_exchange_strong(seen, range_of(range_h(seen), f, mid), std::memory_order_acq_rel,
                                                  std::memory_order_acquire)) {
            j.range[tid].store(range_of(range_h(seen), mid, b), std::memory_order_release);
            return true;
        }
    }
}

// Split decode on one participant: its own range chunk by chunk from the front; when that is
// empty, a new head (append, runs, then its chunks become the range); with no head left, the
// back half of the largest range of another participant. Every participant thus walks its
// chunks upwards (its prefetches run into its own next chunk), and the call ends within about
// one chunk on every thread.
void split_decode(StepJob &j, size_t tid) {
    kvp_cache *c = j.c;
    int64_t cur = INT64_MIN;
    uint32_t cur_h = UINT32_MAX, h, ci;
    for (;;) {
        while (take_own(j, tid, &h, &ci)) {
            if (h != cur_h) {
                cur = INT64_MIN;  // another head's query rows
                cur_h = h;
            }
            split_work(j, h, ci, tid, &cur);
        }
        if ((h = j.next.fetch_add(1, std::memory_order_relaxed)) < j.nitems) {
            // The owner appends and builds the runs in the head's area before it offers the chunks.
            j.L0[h] = head_append(c, j.layer, h, j.n, j.pos, j.k, j.v, false, false, tid).L0;
            HeadStore &hs = head_of(c, j.layer, h);
            j.nr[h] = store_runs(hs, c->pools[h], c->positions == KVP_POS_REALIGN, head_runs(c, j.areas, h));
            const uint32_t nch = decode_chunk_count(c->plan, hs.len());
            j.left[h].store(nch, std::memory_order_relaxed);
            j.range[tid].store(range_of(h, 0, nch), std::memory_order_release);
            continue;
        }
        if (!steal_half(j, tid)) return;
    }
}
#endif  // KVP_THREADS

void step_worker(void *arg, uint32_t tid) {
    StepJob &j = *static_cast<StepJob *>(arg);
#if KVP_THREADS
    if (j.split && j.mode == StepMode::kDecode) {
        split_decode(j, tid);
        return;
    }
#endif
    for (;;) {
        const uint32_t i = j.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= j.nitems) return;
        if (j.split) {  // prefill: the longest (last) tiles first
            uint32_t h = 0, it = j.nitems - 1 - i;
            while (it >= j.base[h + 1]) ++h;
            int64_t cur = INT64_MIN;
            split_work(j, h, it - j.base[h], tid, &cur);
        } else {
            head_step(j, i, tid);
        }
    }
}

}  // namespace

// The thread crossover, measured on the project machine (shared 2-core AMD EPYC VM, Zen 4,
// 2026-11-22; bench_attention --crossover, bench/results/crossover-pool.csv; README
// "Benchmarks"). A 2-thread call with the worker asleep costs the caller 6 us at the median
// and 11 us at the 90th percentile (futex wake, join) at load 2.7, 11 and 18 us at load 10; a
// sleeping worker claims its id 4 us after the wake (p50; 7 us p90 at load 10). By that fixed
// cost alone a second thread would pay from about 30 us of one-thread work, 1 MiB of
// cache-resident decode. On this machine, whose other core is usually busy (load average 3-9
// on 2 cores), calls forced onto 2 threads were 0.8-1.0x the 1-thread time up to 2 MiB of work
// and first faster at 4-8 MiB (prefill of 32 tokens, 4.3M units: 1.16x; decode of 8.4 MB,
// 32 q / 8 kv heads: 1.29x in-process A/B), so the constant is 4 MiB; the back-off in
// threads_for covers busier spells. Memory-bound decode gains nothing from a second thread
// here at any size (a plain 2-thread read of main memory is no faster than a 1-thread one).
const uint64_t kParallelWork = uint64_t(4) << 20;

kvp_cache *cache_init(const kvp_config &cfg, const ArenaPlan &plan, void *arena, int *thread_err, const double *caller_freqs) {
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
        fmt_plan(cfg, plan.stride, plan.block, plan.nblocks, plan.max_cap, max_pin, kTileTokens * c->group, plan.stage, &fp);
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
    c->par_work = kParallelWork;
    c->par_shift = c->par_skips = 0;
    c->par_late = 0.0f;
#if !defined(KVP_NO_HEAP)
    // Tests and benchmarks force the parallel paths on small work: KVP_PAR_WORK=<units>
    // (0: every call uses all threads its items allow).
    if (const char *e = getenv("KVP_PAR_WORK")) c->par_work = strtoull(e, nullptr, 10);
#endif
    // The worker threads start now and wait, asleep, for calls (threads.h).
    c->tpool = pool_start(cfg.threads, base + plan.off_threads, thread_err);
    if (*thread_err) {
        c->magic = kDeadMagic;  // not a live cache: a later kvp_create over this arena may proceed
        return nullptr;
    }
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
    if (c->policy->reset) c->policy->reset(c);
    draft_reset(c);
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

namespace {

// What a caller does about a chunk of n tokens that does not fit a layer holding `len` of `cap`
// slots (the tail of every KVP_ERR_FULL message, kvprune.h "Messages").
void full_advice(const kvp_cache *c, uint32_t len, uint32_t cap, uint32_t n, Msg &m) {
    const kvp_config &cfg = c->cfg;
    const bool never_prunes = cfg.policy == KVP_POLICY_FULL ||
                              (cfg.policy == KVP_POLICY_STREAMING && cfg.compress_every == 0);
    if (n > 1 && len < cap) m.s("chunk the prompt by kvp_prefill_room, or ");
    if (cfg.policy == KVP_POLICY_FULL) m.s("raise capacity (policy=full never evicts)");
    else if (never_prunes) m.s("set compress_every >= 1 (0 never prunes) or raise capacity");
    else m.s("raise capacity");
}

}  // namespace

kvp_status cache_room_check(const kvp_cache *c, uint32_t layer, uint32_t n, bool queries, Msg &m) {
    const kvp_model &md = c->cfg.model;
    if (queries && c->layers[layer].geom.lp.staged_prefill) {  // through the staging area (policy.h)
        if (n > c->plan.stage) {
            m.s("layer ").u(layer).s(" holds ").u(head_of(c, layer, 0).len()).s(" tokens; a prefill chunk of ").u(n)
                .s(" exceeds the prompt staging area (prefill_stage=").u(c->plan.stage)
                .s(" tokens per call): chunk the prompt by kvp_prefill_room, or raise prefill_stage");
            return KVP_ERR_FULL;
        }
        return KVP_OK;
    }
    if (layer_local(c->cfg, layer)) return KVP_OK;  // sliding.h: pieces, evictions, reserved blocks
    for (uint32_t h = 0; h < md.n_kv_heads; ++h) {
        const HeadStore &hs = head_of(c, layer, h);
        if (uint64_t(hs.len()) + n > hs.cap) {
            m.s("layer ").u(layer).s(" holds ").u(hs.len()).s(" tokens and can take ").u(hs.cap - hs.len())
                .s(" more (capacity ").u(hs.cap).s("); ").u(n).s(" do not fit: ");
            full_advice(c, hs.len(), hs.cap, n, m);
            return KVP_ERR_FULL;
        }
        uint64_t take;
        uint32_t ev;
        if (!pool_room(c, layer, h, n, c->pools[h].allowed(layer), &take, &ev)) {
            m.s("layer ").u(layer).s(" KV head ").u(h).s(" holds ").u(hs.len()).s(" tokens; the shared pool (total_capacity=")
                .u(c->cfg.total_capacity).s(") has no free block for ").u(n).s(" more and policy ").s(c->policy->name)
                .s(ev ? " cannot free enough: " : " cannot evict: ")
                .s(n > 1 ? "chunk the prompt by kvp_prefill_room, or raise total_capacity" : "raise total_capacity");
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
            if (layer_local(c->cfg, l)) continue;  // its blocks are reserved (sliding.h)
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
        if (layer_local(c->cfg, l)) continue;  // takes any chunk in pieces (sliding.h)
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

double step_work(const kvp_cache *c, uint32_t layer, uint32_t n, StepMode mode, bool queries) {
    const kvp_model &m = c->cfg.model;
    const double row = 2.0 * m.head_dim * sizeof(float), fl = 4.0 * m.head_dim * c->group;
    double work = 0;
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        const double L0 = head_of(c, layer, h).len();
        if (mode == StepMode::kDecode) {
            work += (L0 + 1) * (fl / 2 > row ? fl / 2 : row);
        } else if (queries) {  // causal: new token i sees L0 + i + 1 keys; K/V are re-read per tile
            const double pairs = double(n) * L0 + double(n) * (n + 1) / 2;
            work += pairs * (fl / 2 > row / kTileTokens ? fl / 2 : row / kTileTokens);
        } else {
            work += double(n) * row;
        }
    }
    return work;
}

namespace {

// Threads a call pays for (DECISIONS.md "Threads and allocation"): below c->par_work units of
// step_work the caller runs alone and touches no other thread; from there on each further
// thread needs par_work/2 more. Back-off on a busy machine: pool_run reports the share of a
// parallel call its caller spent waiting at the join for a worker (one preempted while it holds
// an item); when the running average of that share (weight 1/8 per parallel call) exceeds
// kParLate, the threshold doubles (par_shift) and the average restarts at half of kParLate, so
// it takes several late calls in a row; after kParProbe calls that ran alone only because of
// the back-off it halves again (a probe). Scheduling only: the bits never depend on it.
constexpr float kParLate = 0.3f;
constexpr uint32_t kParProbe = 32;
constexpr uint32_t kParShiftMax = 16;

uint32_t threads_for(kvp_cache *c, uint32_t layer, uint32_t n, StepMode mode, bool queries) {
    const uint32_t T = c->cfg.threads;
    if (T <= 1 || !c->tpool) return 1;
    if (c->par_work == 0) return T;
    const double work = step_work(c, layer, n, mode, queries);
    if (work < double(c->par_work)) return 1;
    const double thr = double(c->par_work) * double(uint64_t(1) << c->par_shift);
    if (work < thr) {
        if (++c->par_skips >= kParProbe) {
            c->par_skips = 0;
            --c->par_shift;
        }
        return 1;
    }
    const double k = 2.0 * work / thr;
    return k >= T ? T : uint32_t(k);
}

// After a call on nt threads whose caller waited `late` of it at the join.
void threads_feedback(kvp_cache *c, uint32_t nt, double late) {
    if (nt <= 1 || !c->par_work) return;
    c->par_late += (float(late) - c->par_late) / 8.0f;
    if (c->par_late > kParLate && c->par_shift < kParShiftMax) {
        ++c->par_shift;
        c->par_skips = 0;
        c->par_late = kParLate / 2;
    }
}

}  // namespace

void cache_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, In q, In k, In v, Out out,
                StepMode mode) {
    const kvp_model &m = c->cfg.model;
    LayerState &ls = c->layers[layer];
    NewPositions pos{positions, ls.next_pos};
    const bool local = layer_local(c->cfg, layer);
    const uint32_t piece = local_piece(c->plan.block);
    if (local && n > piece) {  // sliding.h: a long prefill or append runs as pieces
        const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
        for (uint32_t i = 0; i < n; i += piece) {
            const uint32_t k1 = n - i < piece ? n - i : piece;
            cache_step(c, layer, k1, positions ? positions + i : nullptr, q ? q + i * nq : nullptr, k + i * nkv,
                       v + i * nkv, out ? out + i * nq : nullptr, mode);
        }
        return;
    }

    if (c->policy->layer_prepare && !local) {
        PolicyCtx ctx{c, layer, 0, nullptr, scratch_of(c, 0).policy, 0, 0};
        c->policy->layer_prepare(ctx, n, mode);
    }
    // RoPE tables of the call's positions, shared by every head and thread (rope.h): original
    // positions when contiguous (positions NULL, or given without gaps); realign: the positions
    // of the first head (the others' are the same unless their stores differ: those use the
    // memo).
    if (c->rope.call_cap) {
        if (c->positions == KVP_POS_ORIGINAL) {
            if (!positions || int64_t(positions[n - 1]) - positions[0] == int64_t(n) - 1)
                rope_call_prepare(c->rope, 0, pos.at(0), n);
        } else {
            const HeadStore &h0 = head_of(c, layer, 0);
            rope_call_prepare(c->rope, 0, int64_t(h0.len()) + (h0.next_pinned() ? 0 : h0.shift), n);
            rope_call_prepare(c->rope, 1, h0.len(), n);
        }
    }

    StepJob j;
    j.c = c;
    j.layer = layer;
    j.n = n;
    j.pos = pos;
    j.q = q;
    j.k = k;
    j.v = v;
    j.out = out;
    j.mode = mode;
    j.next.store(0, std::memory_order_relaxed);
    const uint32_t H = m.n_kv_heads;
    const bool queries = mode == StepMode::kDecode || (mode == StepMode::kPrefill && q);
    uint32_t nt = threads_for(c, layer, n, mode, queries);
    // Formatted stores and prompt staging keep per-step rows in the appending thread's scratch:
    // their heads are never split. A decode whose first query is observed observes in the
    // finisher's work area: not split either.
    j.split = KVP_THREADS && nt > 1 && (mode == StepMode::kDecode || nt > H) && H <= kSplitHeadsMax && queries &&
              (mode == StepMode::kDecode || out) && !c->fmt &&
              !(mode == StepMode::kPrefill && ls.geom.lp.staged_prefill) &&
              !(mode == StepMode::kDecode && ls.observe_decode);
    uint32_t parts = H;  // the most participants the call can use
    if (j.split) {
        Sz z;  // the plan was checked at create
        j.areas = head_area_plan(c->plan, c->cfg.threads, c->group, z);
    }
    if (j.split && mode == StepMode::kDecode) {
#if KVP_THREADS
        // Heads are claimed by owners, which append (split_decode); every range starts empty.
        parts = 0;
        for (uint32_t h = 0; h < H; ++h)
            parts += decode_chunk_count(c->plan, head_of(c, layer, h).len() + n);
        for (uint32_t t = 0; t < nt; ++t) j.range[t].store(0, std::memory_order_relaxed);
        j.nitems = H;
#endif
    } else if (j.split) {
        // Prefill: the caller appends to every head and builds its runs in the head's area.
        const bool realign = c->positions == KVP_POS_REALIGN;
        j.base[0] = 0;
        parts = 0;
        for (uint32_t h = 0; h < H; ++h) {
            j.L0[h] = head_append(c, layer, h, n, pos, k, v, false, false, 0).L0;
            HeadStore &hs = head_of(c, layer, h);
            j.nr[h] = store_runs(hs, c->pools[h], realign, head_runs(c, j.areas, h));
            const uint32_t items = (n + kPrefillItemTiles * kTileTokens - 1) / (kPrefillItemTiles * kTileTokens);
            j.base[h + 1] = j.base[h] + items;
            j.left[h].store(items, std::memory_order_relaxed);
            parts += items;
        }
        j.nitems = j.base[H];
    } else {
        j.nitems = H;
    }
    if (nt > parts) nt = parts;
    j.parts = nt;
    threads_feedback(c, nt, pool_run(c->tpool, nt, step_worker, &j));

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

    if (c->policy->layer_phase && !local) {
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
