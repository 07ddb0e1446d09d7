#include "step.h"

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
namespace {

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
    bool prompt;             // a chunk of an open prompt (prompt.h): appended and attended only
    bool finish;             // cache_prompt_select: the prompt's end (head_finish)
    uint32_t prompt_w;       // then: observed from its last prompt_w queries (= n)
    uint32_t nitems, parts;  // parts: participants (split decode)
    HeadAreaPlan areas;      // split only: the heads' areas (arena.h head_area_plan)
    bool packed;             // split where heads lend: the areas are packed (arena.h head_need),
    uint32_t aoff[kSplitHeadsMax];  // head h's at areas.off + aoff[h] x kAlign
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

// Head h's area in the split schedules: its runs at 0, logits at .work (row stride ld; 0: the
// plan's), partials at .part. Fixed slots (arena.h head_area_plan), or packed where heads lend
// (head_need of the store's tokens: they are at most those the area was placed for).
struct Area {
    char *base;
    size_t work, part, ld;
};
Area area_of(kvp_cache *c, const StepJob &j, uint32_t h) {
    char *arena = reinterpret_cast<char *>(c);  // the cache object opens the arena
    if (!j.packed) return Area{arena + j.areas.off + size_t(h) * j.areas.bytes, j.areas.work, j.areas.part, 0};
    const HeadNeed n = head_need(c->plan, c->group, head_of(c, j.layer, h).len());
    return Area{arena + j.areas.off + size_t(j.aoff[h]) * kAlign, n.work, n.part, n.ld};
}
Run *head_runs(kvp_cache *c, const StepJob &j, uint32_t h) { return reinterpret_cast<Run *>(area_of(c, j, h).base); }
// Packed areas: head h's at *at, for a store of L tokens; *at moves past it.
void place_area(kvp_cache *c, StepJob &j, uint32_t h, uint32_t L, size_t *at) {
    j.aoff[h] = uint32_t(*at / kAlign);
    *at += head_need(c->plan, c->group, L).bytes;
}

// Attention input of head h on thread tid: runs, logits and partials in the thread's scratch
// (heads schedule: area == nullptr) or in the head's area (split), the rest the thread's.
AttnIn attn_in(kvp_cache *c, uint32_t h, uint32_t nr, uint32_t L, size_t tid, const Area *area) {
    const Scratch st = scratch_of(c, tid);
    if (area) {
        AttnIn a{c, &c->pools[h], reinterpret_cast<Run *>(area->base), nr, L, &c->memos[tid],
                 reinterpret_cast<float *>(area->base + area->work), reinterpret_cast<float *>(area->base + area->part), st.priv};
        a.ld = area->ld;
        return a;
    }
    return AttnIn{c, &c->pools[h], st.runs, nr, L, &c->memos[tid], st.work, st.part, st.priv};
}

// A formatted store's attention input for head hs (thread scratch s), new rows nw.
FmtIn fmt_in_of(kvp_cache *c, HeadStore &hs, const StagedNew &nw, const Scratch &s) {
    const FmtPlan &fp = c->fmt->fp;
    return FmtIn{c->fmt,
                 &fmt_store(*c->fmt, hs),
                 nw,
                 reinterpret_cast<float *>(s.fmt + fp.s_qg),
                 reinterpret_cast<float *>(s.fmt + fp.s_qs),
                 reinterpret_cast<float *>(s.fmt + fp.s_bias),
                 reinterpret_cast<float *>(s.fmt + fp.s_oacc),
                 reinterpret_cast<float *>(s.fmt + fp.s_zacc),
                 reinterpret_cast<int8_t *>(s.fmt + fp.s_qi),
                 reinterpret_cast<float *>(s.fmt + fp.s_qsc)};
}

// The score=fixed and formatted-storage parts of a head's attention input (thread tid's scratch
// s; fw and fin hold them for the caller), new rows nw.
void attn_extras(kvp_cache *c, HeadStore &hs, const BlockPool &pool, const Scratch &s, size_t tid, const StagedNew &nw,
                 AttnIn &a, FixedWork &fw, FmtIn &fin) {
    if (pool.kq) {
        fw = fixed_work(c, tid);
        a.fx = &fw;
    }
    if (c->fmt) {
        fin = fmt_in_of(c, hs, nw, s);
        a.fmt = &fin;
    }
}

// Observation, formatted conversion and prune of one head after its attention (thread tid's
// scratch). An open prompt's chunk (j.prompt) converts only; the prompt's end (j.prompt_w)
// observes and prunes only (nothing new to convert).
void head_observe_prune(StepJob &j, uint32_t h, const AttnIn &a, const Appended &ap, size_t tid) {
    kvp_cache *c = j.c;
    const kvp_model &m = c->cfg.model;
    const Policy &pol = *c->policy;
    const LayerPlan &lp = c->layers[j.layer].geom.lp;
    HeadStore &hs = head_of(c, j.layer, h);
    BlockPool &pool = c->pools[h];
    const Scratch s = scratch_of(c, tid);
    PolicyCtx ctx{c, j.layer, h, &pool, s.policy, ap.staged, ap.staged ? pool.stage_slot : 0};
    ctx.prompt_w = j.prompt_w;
    const bool realign = c->positions == KVP_POS_REALIGN;
    const QueryPos qp{&j.pos, realign, ap.L0};
    const size_t tok_stride = size_t(m.n_q_heads) * m.head_dim, qoff = size_t(h) * c->group * m.head_dim;
    if (j.mode == StepMode::kPrefill && j.q && lp.obs_queries && pol.observe && !j.prompt) {
        const uint32_t w = lp.obs_queries < j.n ? lp.obs_queries : j.n;
        AttnIn ao = a;
        ao.work = s.work;
        Obs obs{nullptr, nullptr, c->plan.logit_ld};
        if (a.fx) obs.u = observe_prefill_fixed(ao, j.n, qp, j.q + qoff, tok_stride, w);
        else obs.f = observe_prefill(ao, j.n, qp, j.q + qoff, tok_stride, w);
        pol.observe(ctx, hs, a.runs, a.nr, obs);
    }
    if (j.mode == StepMode::kPrefill && j.q && lp.obs_all && pol.observe && !j.finish) {  // every query (policy.h)
        Obs obs{a.colsum, nullptr, c->plan.logit_ld};
        if (a.fx) {  // fixed point: the integer weights of every query, recomputed (not fused)
            AttnIn ao = a;
            ao.work = s.work;
            obs.u = observe_prefill_fixed(ao, j.n, qp, j.q + qoff, tok_stride, j.n);
        }
        pol.observe(ctx, hs, a.runs, a.nr, obs);
    }
    if (j.mode == StepMode::kPrefill && j.q && lp.obs_extra && pol.observe && !j.prompt) {  // a second window (policy.h)
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
    if (pol.observe_queries && j.q && !j.finish && (j.mode == StepMode::kDecode || j.mode == StepMode::kPrefill)) {
        // the caller's queries before RoPE (policy.h); half inputs through this thread's work area
        const In q = j.q + qoff;
        if (const float *f = q.f32()) {
            pol.observe_queries(ctx, f, tok_stride, j.n);
        } else {
            for (uint32_t t = 0; t < j.n; ++t) {
                (q + size_t(t) * tok_stride).load(s.work, size_t(c->group) * m.head_dim);
                pol.observe_queries(ctx, s.work, 0, 1);
            }
        }
    }
    if (c->fmt && !ap.staged && !j.finish) {  // completed groups convert after attention, before the policy prunes
        // ThinK reads f32 outputs; with half outputs it recomputes them (think.cpp), the same bits
        StepObs so{&a, s.runs, realign, s.fmt, j.q ? j.q + qoff : In(), j.out.f32() ? j.out.f32() + qoff : nullptr,
                   tok_stride, j.n, &qp};
        so.prompt = j.prompt;  // ThinK without channels waits for the prompt's end (store_fmt.h)
        fmt_convert(c, hs, pool, ap.nw, so);
        // peak_live_bytes: after the appends (converted: staged rows are scratch), before the prune
        fmt_store(*c->fmt, hs).bytes_after_append = store_bytes(c, hs, pool);
    } else if (c->fmt && j.finish) {
        if (hs.deferred) {
            // the prompt's end of a deferred ThinK store: channels from the kept queries over the
            // whole prompt, then every complete block converts, before the policy selects (store_fmt.h)
            const StepObs so{&a, s.runs, realign, s.fmt, j.q + qoff, nullptr, tok_stride, j.n, &qp};
            fmt_prompt_finish(c, hs, pool, so);
        }
        // peak_live_bytes: converted, before the selection (cache_prompt_select): a store's first
        // conversion adds its side data (ThinK's channel record), so a store of a few tokens may
        // take more bytes than its full-width rows did
        fmt_store(*c->fmt, hs).bytes_after_append = store_bytes(c, hs, pool);
    } else if (c->fmt && ap.staged) {  // prompt staging: the staged tokens count as f32 residual rows (touched)
        fmt_store(*c->fmt, hs).bytes_after_append =
            store_bytes(c, hs, pool) + uint64_t(ap.staged) * fmt_residual_bytes(c->fmt->f);
    }
    if (j.prompt) return;  // an open prompt is selected at its end (prompt.h)
    if (layer_local(c->cfg, j.layer)) {  // sliding.h: keep only what the next query can see
        local_evict(c, hs, pool, j.layer, j.pos.at(j.n - 1) + 1 - int64_t(c->cfg.sliding_window), 0);
        return;
    }
    if (head_streaming(hs)) {  // DuoAttention: sinks + the duo_window newest, never the policy's selection
        const uint32_t W = c->cfg.duo_window;
        if (hs.body_len() > W) store_evict_front(hs, pool, j.layer, hs.body_len() - W, c->positions == KVP_POS_REALIGN);
        return;
    }
    if (pol.prune) pol.prune(ctx, hs, j.mode);
    // a policy that selected nothing keeps what fits; one that selects in its layer phase commits there
    if (ctx.staged && !lp.select_in_phase) stage_commit(ctx, hs, nullptr, 0);
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
    const bool staged = j.mode == StepMode::kPrefill && j.q && lp.staged_prefill && !j.prompt;
    const Appended ap = head_append(c, j.layer, h, j.n, j.pos, j.k, j.v, staged, j.mode != StepMode::kDecode, tid);
    const bool attends = j.mode == StepMode::kDecode || (j.mode == StepMode::kPrefill && j.q);
    // The run list is O(blocks): built only when queries read the store.
    uint32_t nr = 0;
    if (attends) nr = c->fmt ? fmt_runs(c, hs, pool, realign, ap.nw, s.runs) : store_runs(hs, pool, realign, s.runs);
    if (ap.staged) s.runs[nr++] = Run{pool.stage_slot, j.n, ap.L0, c->fmt ? uint32_t(kSrcStaged) : 0u, realign ? hs.shift : 0};
    AttnIn a = attn_in(c, h, nr, hs.len() + ap.staged, tid, nullptr);
    a.window = layer_window(c->cfg, j.layer);
    FixedWork fw;
    FmtIn fin;
    StagedNew nw = ap.nw;
    if (c->fmt && ap.staged) {  // prompt staging: the staged run's rows are the pool's staging rows (kSrcStaged)
        const FmtPool &fpo = fmt_pool(*c->fmt, pool);
        nw = StagedNew{ap.L0, ap.staged, fpo.sk, fpo.sv, c->plan.stride, c->plan.stride};
    }
    attn_extras(c, hs, pool, s, tid, nw, a, fw, fin);
    const QueryPos qp{&j.pos, realign, ap.L0};
    const size_t qoff = size_t(h) * c->group * m.head_dim;
    if (j.mode == StepMode::kDecode) {
        hs.hoyer = attend_decode(a, j.q + qoff, qp.at(0), j.out + qoff, lp.decode_scores);
    } else if (j.mode == StepMode::kPrefill && j.q) {
        if (lp.obs_all && !a.fx) a.colsum = colsum_rows(a);  // every query's mass, fused (attention.h)
        if (j.out || a.colsum)
            attend_prefill(a, j.n, qp, j.q + qoff, j.out ? j.out + qoff : Out(), size_t(m.n_q_heads) * m.head_dim);
    }
    head_observe_prune(j, h, a, ap, tid);
}

// The end of a prompt (cache_prompt_select), head h on thread tid: the store holds the whole
// prompt; its last j.prompt_w tokens' queries (j.q, positions j.pos) observe it, then it is pruned.
void head_finish(StepJob &j, uint32_t h, size_t tid) {
    kvp_cache *c = j.c;
    HeadStore &hs = head_of(c, j.layer, h);
    BlockPool &pool = c->pools[h];
    const Scratch s = scratch_of(c, tid);
    const bool realign = c->positions == KVP_POS_REALIGN;
    const uint32_t nr = c->fmt ? fmt_runs(c, hs, pool, realign, StagedNew{}, s.runs) : store_runs(hs, pool, realign, s.runs);
    AttnIn a = attn_in(c, h, nr, hs.len(), tid, nullptr);
    FixedWork fw;
    FmtIn fin;
    attn_extras(c, hs, pool, s, tid, StagedNew{}, a, fw, fin);
    Appended ap;
    ap.L0 = hs.len() - j.n;  // the kept queries' tokens are the store's last
    head_observe_prune(j, h, a, ap, tid);
}

// The split schedule, one chunk or item of head h (decode: split-K chunk ci, the query rows
// rotated in the thread's scratch unless *cur says they are; prefill: item ci of
// kPrefillItemTiles query tiles). Whoever completes the head's last one merges, observes and
// prunes it (every other one of the head is done and visible: left[h]).
void split_work(StepJob &j, uint32_t h, uint32_t ci, size_t tid, int64_t *cur) {
    kvp_cache *c = j.c;
    const kvp_model &m = c->cfg.model;
    const Area area = area_of(c, j, h);
    AttnIn a = attn_in(c, h, j.nr[h], head_of(c, j.layer, h).len(), tid, &area);
    a.window = layer_window(c->cfg, j.layer);
    // Prefill: tile scratch, the running thread's. Decode without scores: a chunk's logits are
    // dead after its pv, so they stay in the running thread's scratch too (the head's area has
    // logits only when some layer scores, arena.h head_area_plan).
    if (j.mode == StepMode::kPrefill || !c->layers[j.layer].geom.lp.decode_scores) {
        a.work = scratch_of(c, tid).work;
        a.ld = 0;
    }
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
            j.nr[h] = store_runs(hs, c->pools[h], c->positions == KVP_POS_REALIGN, head_runs(c, j, h));
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
        if (j.finish) {
            head_finish(j, i, tid);
        } else if (j.split) {  // prefill: the longest (last) tiles first
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
    if (T <= 1 || !pool_parallel(c->tpool)) return 1;
    const uint64_t pw = par_work_now(c);
    if (pw == 0) return T;
    const double work = step_work(c, layer, n, mode, queries);
    if (work < double(pw)) return 1;
    const double thr = double(pw) * double(uint64_t(1) << c->par_shift);
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

namespace {

// kvp_stats peak_live_rows/bytes: the layer holding `rows` and `bytes` (after a call's appends
// and conversions, before the policy's prunes), the other layers what they hold.
void note_peak(kvp_cache *c, const LayerState &ls, uint64_t rows, uint64_t bytes) {
    const uint64_t at_rows = c->live_rows - ls.rows + rows, at_bytes = c->live_bytes - ls.bytes + bytes;
    if (at_rows > c->peak_rows) c->peak_rows = at_rows;
    if (at_bytes > c->peak_bytes) c->peak_bytes = at_bytes;
}

// The layer's kept rows and live bytes into its state and the cache's totals.
void layer_account(kvp_cache *c, uint32_t layer) {
    LayerState &ls = c->layers[layer];
    uint64_t rows = 0, bytes = 0;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        rows += head_of(c, layer, h).len();
        bytes += store_bytes(c, head_of(c, layer, h), c->pools[h]);
    }
    c->live_rows = c->live_rows - ls.rows + rows;
    ls.rows = rows;
    c->live_bytes = c->live_bytes - ls.bytes + bytes;
    ls.bytes = bytes;
}

}  // namespace

void cache_prompt_select(kvp_cache *c, uint32_t layer, uint32_t w, const int32_t *pos, const float *q) {
    StepJob j;
    j.c = c;
    j.layer = layer;
    j.n = w;
    j.pos = NewPositions{pos, 0};
    j.q = In(q);
    j.k = j.v = In();
    j.out = Out();
    j.mode = StepMode::kPrefill;
    j.split = j.prompt = false;
    j.finish = true;
    j.prompt_w = w;
    j.next.store(0, std::memory_order_relaxed);
    j.nitems = j.parts = c->cfg.model.n_kv_heads;
    // Every head is observed and pruned whole on one thread (as the heads schedule of a prefill);
    // the threads a call pays for follow the observation's work, as a prefill of w tokens'.
    uint32_t nt = threads_for(c, layer, w ? w : 1, StepMode::kPrefill, true);
    if (nt > j.parts) nt = j.parts;
    threads_feedback(c, nt, pool_run(c->tpool, nt, step_worker, &j));
    if (c->fmt) {  // the rows a deferred ThinK store converted (step_worker), before the selection
        uint64_t bytes = 0;
        for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) bytes += fmt_store(*c->fmt, head_of(c, layer, h)).bytes_after_append;
        note_peak(c, c->layers[layer], c->layers[layer].rows, bytes);
    }
    if (c->policy->layer_phase) {
        PolicyCtx ctx{c, layer, 0, nullptr, scratch_of(c, 0).policy, 0, 0};
        ctx.prompt_w = w ? w : 1;  // the prompt's end (policy.h PolicyCtx::prompt_w)
        c->policy->layer_phase(ctx, StepMode::kPrefill);
    }
    layer_account(c, layer);
}

void cache_make_room(kvp_cache *c, uint32_t layer, uint32_t limit) {
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        HeadStore &hs = head_of(c, layer, h);
        if (head_streaming(hs)) continue;  // DuoAttention: the core's ring, never the policy's ranking
        PolicyCtx ctx{c, layer, h, &c->pools[h], scratch_of(c, 0).policy, 0, 0};
        while (hs.len() > limit && c->policy->evictable(ctx, hs) > 0) {
            if (hs.holes) store_compact(hs, c->pools[h], layer);
            const uint32_t before = hs.len();
            c->policy->self_prune(ctx, hs, hs.len() - limit);
            if (hs.len() == before) break;
        }
        if (hs.holes) store_compact(hs, c->pools[h], layer);
    }
    layer_account(c, layer);
}

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

    // A chunk of an open prompt (prompt.h): appended and attended; the policy acts at its end.
    const bool prompt = mode == StepMode::kPrefill && q && prompt_open(c, layer);
    if (c->policy->layer_prepare && !local && !prompt) {
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
    j.prompt = prompt;
    j.finish = false;
    j.prompt_w = 0;
    j.next.store(0, std::memory_order_relaxed);
    const uint32_t H = m.n_kv_heads;
    const bool queries = mode == StepMode::kDecode || (mode == StepMode::kPrefill && q);
    uint32_t nt = threads_for(c, layer, n, mode, queries);
    // Formatted stores and prompt staging keep per-step rows in the appending thread's scratch:
    // their heads are never split. A decode whose first query is observed observes in the
    // finisher's work area: not split either.
    j.split = KVP_THREADS && nt > 1 && (mode == StepMode::kDecode || nt > H) && H <= kSplitHeadsMax && queries &&
              (mode == StepMode::kDecode || out) && !c->fmt &&
              !(mode == StepMode::kPrefill && ls.geom.lp.staged_prefill && !prompt) &&
              !(mode == StepMode::kPrefill && ls.geom.lp.obs_all) &&  // colsum: a head's tiles in order
              !(mode == StepMode::kDecode && ls.observe_decode);
    // heads that lend (pool.h): blocks move between pools here, before any head appends
    if (!(mode == StepMode::kPrefill && q && ls.geom.lp.staged_prefill && !prompt)) lend_blocks(c, layer, n);
    uint32_t parts = H;  // the most participants the call can use
    j.packed = false;
    if (j.split) {
        Sz z;  // the plan was checked at create
        j.areas = head_area_plan(c->plan, c->cfg.threads, c->group, z);
        j.packed = c->plan.lend;
        // packed areas (arena.h head_need): a decode's heads are placed for their tokens after the
        // call's append (its owners append concurrently); a prefill's as the caller appends, below
        if (j.packed && mode == StepMode::kDecode) {
            size_t at = 0;
            for (uint32_t h = 0; h < H; ++h) place_area(c, j, h, head_of(c, layer, h).len() + n, &at);
        }
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
        size_t at = 0;  // packed areas: placed as the heads append
        for (uint32_t h = 0; h < H; ++h) {
            j.L0[h] = head_append(c, layer, h, n, pos, k, v, false, false, 0).L0;
            HeadStore &hs = head_of(c, layer, h);
            if (j.packed) place_area(c, j, h, hs.len(), &at);
            j.nr[h] = store_runs(hs, c->pools[h], realign, head_runs(c, j, h));
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
    note_peak(c, ls, appended, appended_bytes);

    if (c->policy->layer_phase && !local && !prompt) {
        PolicyCtx ctx{c, layer, 0, nullptr, scratch_of(c, 0).policy, 0, 0};
        c->policy->layer_phase(ctx, mode);
        if (ls.geom.lp.phase_all_layers)  // it may have evicted from any layer (policy.h)
            for (uint32_t l = 0; l < m.n_layers; ++l)
                if (l != layer) layer_account(c, l);
    }
    if (mode == StepMode::kDecode) ls.observe_decode = false;  // only the first decode is observed
    if (mode == StepMode::kDecode) {  // heads reduced in fixed order
        float hoyer = 0.0f;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) hoyer += head_of(c, layer, h).hoyer;
        ls.sparsity = hoyer / float(m.n_q_heads);
    }
    layer_account(c, layer);
    ls.next_pos = pos.at(n - 1) + 1;
    if (layer == 0) c->tokens_seen += n;
}

}  // namespace kvp
