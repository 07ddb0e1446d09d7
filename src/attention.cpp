#include "attention.h"

#include <math.h>
#include <string.h>

#include "kernels/score_fixed.h"

namespace kvp {

// logit_softcap (issue 21): logits x of `rows` rows of n keys (row stride ld) become
// c * tanh(x / c), right after their qk and before any mask, on every path and kernel variant
// (the kernel family's softcap: every variant gives the same bits, attn_f32.h). Off when c == 0.
static void softcap(const kvp_cache *c, float *lg, uint32_t rows, uint32_t n, size_t ld) {
    const float cap = c->cfg.logit_softcap;
    if (!(cap > 0.0f)) return;
    for (uint32_t r = 0; r < rows; ++r) c->kern->softcap(lg + r * ld, n, cap);
}
namespace {

constexpr size_t kR16 = kAlign / sizeof(float);

// Copies `rows` query rows (src stride src_ld) to dst (stride = plan.stride) and rotates them to rpos.
// Half rows (io.h) are widened in this copy.
void load_rotated(const kvp_cache *c, RopeMemo &memo, int64_t rpos, In src, size_t src_ld, uint32_t rows, float *dst) {
    const uint32_t hd = c->cfg.model.head_dim, st = c->plan.stride;
    for (uint32_t r = 0; r < rows; ++r) (src + r * src_ld).load(dst + size_t(r) * st, hd);
    if (c->rope.style != KVP_ROPE_NONE) rope_apply(c->rope, rope_table_memo(c->rope, memo, rpos), dst, rows, st);
    rotate_rows(c, dst, rows, st);  // kv_rotate: the keys' basis (after RoPE, as they were stored)
}

// Rotates the tile's query rows (tq tokens x G heads, token t at q + (i0+t)*tok_stride) for a
// run of delta d, unless they already are (*cur).
void rotate_tile(const AttnIn &a, const QueryPos &qp, In q, size_t tok_stride, uint32_t i0, uint32_t tq,
                 int64_t d, int64_t *cur, float *qt) {
    if (*cur == d) return;
    const uint32_t G = a.c->group, hd = a.c->cfg.model.head_dim, st = a.c->plan.stride;
    for (uint32_t t = 0; t < tq; ++t)
        load_rotated(a.c, *a.memo, qp.at(i0 + t) + d, q + (i0 + t) * tok_stride, hd, G, qt + size_t(t) * G * st);
    *cur = d;
}

// Key i of run r (slot index).
inline uint32_t slot_at(const Run &r, uint32_t logical) { return r.slot + (logical - r.logical); }

// score=fixed: quantizes the G query rows q[g*hd] (pre-RoPE) into w.qx / w.qe; a half row is
// widened into row[0..hd) first (the running thread's, AttnIn::priv's second half).
void fixed_load_queries(const kvp_cache *c, const FixedWork &w, In q, float *row) {
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, kst = c->plan.kq_stride;
    for (uint32_t g = 0; g < G; ++g) {
        const In qg = q + size_t(g) * hd;
        const float *x = qg.f32();
        if (!x) {
            qg.load(row, hd);
            x = row;
        }
        w.qe[g] = fixed::quantize_row(x, hd, w.qx + size_t(g) * kst);
    }
}

// One row of head_dim floats in AvnIn::priv ([G][stride] floats) after decode_finish's 2G floats
// (inv, wv; with G = 1 they are locals there and the row starts at 0): a half call's output row,
// or a half query row before its fixed-point quantization. It fits: with G >= 2,
// G*stride - head_dim >= (G-1)*16 >= align16(2G). Free once the query rows are dead (decode_finish),
// and in prefill observation (priv is decode-only).
float *priv_stage(const AttnIn &a) {
    const size_t G = a.c->group;
    return a.priv + (G == 1 ? 0 : align_up(2 * G, kR16));
}

// score=fixed: rotates the quantized query rows to position p into w.qr.
void fixed_rotate_queries(const kvp_cache *c, const FixedWork &w, int64_t p) {
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, kst = c->plan.kq_stride;
    const int16_t *cs = fixed_rope_table(c, w, p);
    for (uint32_t g = 0; g < G; ++g)
        fixed::rotate(c->rope.style, c->rope.pairs, cs, w.qx + size_t(g) * kst, w.qr + size_t(g) * kst, hd);
}

// score=fixed: integer logits of the rotated queries (w.qr, w.qe) over the logical keys
// [j0, j1) of run `run` into w.y[g * ld + j].
void fixed_logits(const AttnIn &a, const FixedWork &w, const Run &run, uint32_t j0, uint32_t j1) {
    const kvp_cache *c = a.c;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, kst = c->plan.kq_stride;
    const size_t ld = c->plan.logit_ld;
    const kern::ScoreF32 &S = *c->skern;
    for (uint32_t j = j0; j < j1; ++j) {
        const uint32_t slot = slot_at(run, j);
        const int32_t ke = a.pool->kexp[slot];
        S.dots16(w.qr, kst, G, a.pool->kq_row(slot), hd, w.y + j, ld);  // exact integers, any variant
        for (uint32_t g = 0; g < G; ++g) w.y[g * ld + j] = fixed::logit(w.y[g * ld + j], c->fixed_K, w.qe[g] + ke);
    }
}

// score=fixed, decode: each token's Q16 weight summed over the group, added to its slot score
// (saturating).
void fixed_decode_scores(const AttnIn &a, In q, int64_t qpos) {
    const kvp_cache *c = a.c;
    const FixedWork &w = *a.fx;
    const uint32_t G = c->group;
    const size_t ld = c->plan.logit_ld;
    fixed_load_queries(c, w, q, priv_stage(a));
    int64_t cur = INT64_MIN;
    for (uint32_t r = 0; r < a.nr; ++r) {
        const Run &run = a.runs[r];
        if (qpos + run.delta != cur) {
            cur = qpos + run.delta;
            fixed_rotate_queries(c, w, cur);
        }
        fixed_logits(a, w, run, run.logical, run.logical + run.n);
    }
    for (uint32_t g = 0; g < G; ++g) {
        w.z[g] = fixed::softmax_exps(w.y + g * ld, a.L);
        w.inv[g] = 1.0 / double(w.z[g]);
    }
    BlockPool &pool = *const_cast<BlockPool *>(a.pool);
    for (uint32_t r = 0; r < a.nr; ++r) {
        const Run &run = a.runs[r];
        for (uint32_t i = 0; i < run.n; ++i) {
            const uint32_t j = run.logical + i;
            uint64_t mass = 0;
            for (uint32_t g = 0; g < G; ++g) mass += fixed::weight_r(uint64_t(w.y[g * ld + j]), w.z[g], w.inv[g]);
            score_set_u(pool, run.slot + i, fixed::sat_add(score_u(pool, run.slot + i), mass));
        }
    }
}

// The first run that holds logical index j or a later one (runs are in logical order).
uint32_t first_run(const AttnIn &a, uint32_t j) {
    uint32_t lo = 0, hi = a.nr;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (a.runs[mid].logical + a.runs[mid].n <= j) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

}  // namespace

uint32_t decode_chunks(const AttnIn &a) { return decode_chunk_count(a.c->plan, a.L); }

void decode_chunk(const AttnIn &a, In q, int64_t qpos, uint32_t ci, int64_t *cur) {
    const kvp_cache *c = a.c;
    const kern::AttnF32 &K = *c->kern;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, st = c->plan.stride;
    const size_t ld = a.ld ? a.ld : c->plan.logit_ld;
    const uint32_t j0 = ci * c->plan.granule, j1 = decode_chunk_end(c->plan, ci, a.L);
    const uint32_t nj = j1 - j0;
    float *logits = a.work, *qr = a.priv;
    float *pc = a.part + size_t(ci) * c->plan.part_floats;
    float *m = pc, *l = pc + G, *ss = pc + 2 * G, *o = pc + align_up(3 * size_t(G), kR16);

    const uint32_t r0 = first_run(a, j0);
    for (uint32_t r = r0; r < a.nr && a.runs[r].logical < j1; ++r) {
        const Run &run = a.runs[r];
        const uint32_t s0 = run.logical > j0 ? run.logical : j0;
        const uint32_t s1 = run.logical + run.n < j1 ? run.logical + run.n : j1;
        if (qpos + run.delta != *cur) {
            *cur = qpos + run.delta;
            load_rotated(c, *a.memo, *cur, q, hd, G, qr);
        }
        if (a.fmt) fmt_qk(a, run, s0, s1, qr, st, G, logits + s0, ld);
        else K.qk(qr, st, G, a.pool->k_row(slot_at(run, s0)), st, s1 - s0, hd, c->scale, logits + s0, ld);
        softcap(c, logits + s0, G, s1 - s0, ld);
    }
    for (uint32_t g = 0; g < G; ++g) {
        float *row = logits + g * ld + j0;
        m[g] = K.max(row, nj);
        l[g] = K.expsum(row, nj, m[g], &ss[g]);  // with the squares' sum, in one pass
    }
    memset(o, 0, size_t(G) * st * sizeof(float));
    if (a.fmt) fmt_pv_begin(a, G);
    for (uint32_t r = r0; r < a.nr && a.runs[r].logical < j1; ++r) {
        const Run &run = a.runs[r];
        const uint32_t s0 = run.logical > j0 ? run.logical : j0;
        const uint32_t s1 = run.logical + run.n < j1 ? run.logical + run.n : j1;
        if (a.fmt) fmt_pv(a, run, s0, s1, logits + s0, ld, G, o, st);
        else K.pv(logits + s0, ld, G, a.pool->v_row(slot_at(run, s0)), st, s1 - s0, hd, o, st);
    }
    if (a.fmt) fmt_pv_end(a, G, o, st);
}

float decode_finish(const AttnIn &a, In q, int64_t qpos, Out out, bool scores) {
    const kvp_cache *c = a.c;
    const kern::AttnF32 &K = *c->kern;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, st = c->plan.stride, L = a.L;
    const size_t ld = a.ld ? a.ld : c->plan.logit_ld, pf = c->plan.part_floats, ooff = align_up(3 * size_t(G), kR16);
    const uint32_t nch = decode_chunks(a);
    float loc[2];  // G = 1: inv and wv here, priv_stage is priv itself
    float *inv = G == 1 ? loc : a.priv, *wv = G == 1 ? loc + 1 : a.priv + G;  // the query rows are no longer needed
    // f32 outputs are merged in place; a half call's row is merged into priv_stage and rounded as
    // it is written
    float *of = out.f32();
    float hoyer = 0.0f;
    const double rl = sqrt(double(L));
    for (uint32_t g = 0; g < G; ++g) {
        float mx = -INFINITY;
        for (uint32_t ci = 0; ci < nch; ++ci) mx = a.part[ci * pf + g] > mx ? a.part[ci * pf + g] : mx;
        float sum = 0.0f;
        double sq = 0.0;
        for (uint32_t ci = 0; ci < nch; ++ci) {
            float *pc = a.part + ci * pf;
            const float w = kern::exp_approx(pc[g] - mx);  // exactly 1 for the chunk holding the max
            pc[g] = w;                                      // m_c is not needed again: keep w_c
            sum = sum + w * pc[G + g];
            sq += double(w) * double(w) * double(pc[2 * G + g]);
        }
        inv[g] = 1.0f / sum;
        const float ig = inv[g];
        // out = (sum_c w_c o_c) * inv, in chunk order (with one chunk w = 1: o_0 * inv)
        if (of) {
            K.merge(a.part + ooff + size_t(g) * st, pf, a.part + g, pf, nch, ig, hd, of + size_t(g) * hd);
            rotate_rows(a.c, of + size_t(g) * hd, 1, hd);  // kv_rotate: back from V's basis (its own inverse)
        } else {
            float *row = priv_stage(a);
            K.merge(a.part + ooff + size_t(g) * st, pf, a.part + g, pf, nch, ig, hd, row);
            rotate_rows(a.c, row, 1, hd);  // before the rounding to the caller's type
            (out + size_t(g) * hd).store(row, hd);
        }
        if (L > 1) {
            const double l2 = sqrt(sq) * double(ig);  // |p|_2, |p|_1 = 1
            double h = l2 > 0 ? (rl - 1.0 / l2) / (rl - 1.0) : 0.0;
            h = h < 0 ? 0 : h > 1 ? 1 : h;
            hoyer += float(h);
        }
    }
    if (scores && a.fx) {
        fixed_decode_scores(a, q, qpos);
    } else if (scores) {
        const kern::ScoreF32 &S = *c->skern;
        for (uint32_t ci = 0; ci < nch; ++ci) {
            const float *pc = a.part + ci * pf;
            for (uint32_t g = 0; g < G; ++g) wv[g] = pc[g] * inv[g];
            const uint32_t j0 = ci * c->plan.granule, j1 = decode_chunk_end(c->plan, ci, L);
            for (uint32_t r = first_run(a, j0); r < a.nr && a.runs[r].logical < j1; ++r) {
                const Run &run = a.runs[r];
                const uint32_t s0 = run.logical > j0 ? run.logical : j0;
                const uint32_t s1 = run.logical + run.n < j1 ? run.logical + run.n : j1;
                S.acc(a.work + s0, ld, G, wv, s1 - s0, a.pool->score + slot_at(run, s0));
            }
        }
    }
    return hoyer;
}

float attend_decode(const AttnIn &a, In q, int64_t qpos, Out out, bool scores) {
    int64_t cur = INT64_MIN;
    for (uint32_t ci = 0, nch = decode_chunks(a); ci < nch; ++ci) decode_chunk(a, q, qpos, ci, &cur);
    return decode_finish(a, q, qpos, out, scores);
}

void attend_prefill(const AttnIn &a, uint32_t n, const QueryPos &qp, In q, Out out, size_t tok_stride) {
    attend_prefill_tiles(a, n, qp, q, out, tok_stride, 0, n);
}

namespace {

// Sliding window (sliding.h): the first logical key whose original position exceeds lim (a.L
// when none). Key positions ascend in logical order in a local layer's store and its draft or
// new tokens, so the keys a query at p sees are the logical suffix from window_lo(p - W) up to
// the causal bound.
uint32_t window_lo(const AttnIn &a, int64_t lim) {
    const int32_t *pos = a.pool->pos;
    uint32_t r0 = 0, r1 = a.nr;  // the first run whose last key is above lim
    while (r0 < r1) {
        const uint32_t mid = r0 + (r1 - r0) / 2;
        const Run &r = a.runs[mid];
        if (int64_t(pos[r.slot + r.n - 1]) > lim) r1 = mid;
        else r0 = mid + 1;
    }
    if (r0 == a.nr) return a.L;
    const Run &r = a.runs[r0];
    uint32_t lo = 0, hi = r.n - 1;  // pos[slot + hi] > lim
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (int64_t(pos[r.slot + mid]) > lim) hi = mid;
        else lo = mid + 1;
    }
    return r.logical + lo;
}

// The observation rows of a thread's work area, after attend_prefill's buffers: a tile's whole
// logit rows (lg, plan.logit_ld apart), the per-head sums (obs, G rows), 1/l per row (inv), and
// the running max per (row, key block) of a colsum sweep (mblk). arena.cpp sizes them.
struct ObsAreas {
    float *lg, *obs, *inv, *mblk;
};
ObsAreas obs_areas(const AttnIn &a) {
    const size_t G = a.c->group, st = a.c->plan.stride, TR = size_t(kTileTokens) * G, ld = a.c->plan.logit_ld;
    ObsAreas o;
    o.lg = a.work + 2 * align_up(TR * st, kR16) + align_up(TR * kKeyBlock, kR16) + 2 * align_up(TR, kR16);
    o.obs = o.lg + align_up(TR * ld, kR16);
    o.inv = o.obs + align_up(G * ld, kR16);
    o.mblk = o.inv + align_up(TR, kR16);
    return o;
}

// colsum's tile step (attention.h): the tile's exp'd logits of keys [k0, vis), each block taken at
// its running max, are rescaled to the row's final max, then added to colsum weighted by 1/l.
void colsum_tile(const AttnIn &a, const ObsAreas &oa, uint32_t tq, uint32_t k0, uint32_t vis, const float *mrow,
                 const float *lrow, size_t nbk) {
    const uint32_t G = a.c->group;
    const size_t ld = a.c->plan.logit_ld;
    for (uint32_t r = 0; r < tq * G; ++r) {
        float *row = oa.lg + r * ld;
        for (uint32_t kb0 = k0; kb0 < vis; kb0 += kKeyBlock) {
            const float mb = oa.mblk[r * nbk + kb0 / kKeyBlock];
            if (mb == mrow[r] || mb == -INFINITY) continue;  // at the final max already, or all zero
            const float al = kern::exp_approx(mb - mrow[r]);
            const uint32_t e = vis - kb0 < kKeyBlock ? vis : kb0 + kKeyBlock;
            for (uint32_t j = kb0; j < e; ++j) row[j] *= al;
        }
    }
    float wg[kTileTokens];
    for (uint32_t g = 0; g < G; ++g) {
        for (uint32_t t = 0; t < tq; ++t) wg[t] = 1.0f / lrow[size_t(t) * G + g];
        a.c->skern->acc(oa.lg + size_t(g) * ld + k0, size_t(G) * ld, tq, wg, vis - k0, a.colsum + size_t(g) * ld + k0);
    }
}

}  // namespace

void attend_prefill_tiles(const AttnIn &a, uint32_t n, const QueryPos &qp, In q, Out out,
                          size_t tok_stride, uint32_t i_begin, uint32_t i_end) {
    const kvp_cache *c = a.c;
    const kern::AttnF32 &K = *c->kern;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, st = c->plan.stride;
    const size_t TR = size_t(kTileTokens) * G;
    float *qt = a.work;
    float *O = qt + align_up(TR * st, kR16);
    float *lg = O + align_up(TR * st, kR16);
    float *mrow = lg + align_up(TR * kKeyBlock, kR16);
    float *lrow = mrow + align_up(TR, kR16);
    // colsum: the tile's logits stay whole in the observation rows (KB apart otherwise), with
    // each row's running max per key block in mblk (ObsAreas)
    const ObsAreas oa = obs_areas(a);
    const size_t KB = a.colsum ? c->plan.logit_ld : kKeyBlock;
    const size_t nbk = (c->plan.logit_ld + kKeyBlock - 1) / kKeyBlock;

    const uint32_t L = a.L, L0 = L - n;
    for (uint32_t i0 = i_begin; i0 < i_end; i0 += kTileTokens) {
        const uint32_t tq = n - i0 < kTileTokens ? n - i0 : kTileTokens;
        const uint32_t rows = tq * G;
        for (uint32_t r = 0; r < rows; ++r) {
            mrow[r] = -INFINITY;
            lrow[r] = 0.0f;
        }
        memset(O, 0, size_t(rows) * st * sizeof(float));
        if (a.fmt) fmt_pv_begin(a, rows);
        const uint32_t first_q = L0 + i0, last_q = L0 + i0 + tq - 1;
        int64_t cur = INT64_MIN;
        uint32_t ri = 0;
        // Sliding window: query token t sees logical keys from wlo[t] on; blocks below every
        // wlo are skipped (they would be fully masked).
        uint32_t wlo[kTileTokens] = {0, 0, 0, 0}, wmin = 0, wmax = 0;
        static_assert(kTileTokens == 4, "wlo's initializer");
        if (a.window) {
            wmin = UINT32_MAX;
            for (uint32_t t = 0; t < tq; ++t) {
                wlo[t] = window_lo(a, qp.pos->at(i0 + t) - int64_t(a.window));
                if (wlo[t] > first_q + t) wlo[t] = first_q + t;  // a query always sees itself
                if (wlo[t] < wmin) wmin = wlo[t];
                if (wlo[t] > wmax) wmax = wlo[t];
            }
        }
        const uint32_t kbs = wmin / kKeyBlock * kKeyBlock;
        for (uint32_t kb0 = kbs; kb0 <= last_q; kb0 += kKeyBlock) {
            const uint32_t kb1 = last_q + 1 - kb0 < kKeyBlock ? last_q + 1 : kb0 + kKeyBlock;
            const uint32_t nb = kb1 - kb0;
            if (a.colsum) lg = oa.lg + kb0;  // the block's columns of the whole rows
            while (a.runs[ri].logical + a.runs[ri].n <= kb0) ++ri;
            for (uint32_t r = ri; r < a.nr && a.runs[r].logical < kb1; ++r) {
                const Run &run = a.runs[r];
                const uint32_t j0 = run.logical > kb0 ? run.logical : kb0;
                const uint32_t j1 = run.logical + run.n < kb1 ? run.logical + run.n : kb1;
                rotate_tile(a, qp, q, tok_stride, i0, tq, run.delta, &cur, qt);
                if (a.fmt) fmt_qk(a, run, j0, j1, qt, st, rows, lg + (j0 - kb0), KB);
                else K.qk(qt, st, rows, a.pool->k_row(slot_at(run, j0)), st, j1 - j0, hd, c->scale, lg + (j0 - kb0), KB);
                softcap(c, lg + (j0 - kb0), rows, j1 - j0, KB);
            }
            if (kb1 - 1 > first_q) {  // causal mask: key j visible to query token t iff j <= L0+i0+t
                for (uint32_t t = 0; t < tq; ++t) {
                    const uint32_t lim = first_q + t;
                    const uint32_t from = lim >= kb0 ? lim - kb0 + 1 : 0;
                    for (uint32_t g = 0; g < G; ++g) {
                        float *row = lg + (size_t(t) * G + g) * KB;
                        for (uint32_t jj = from; jj < nb; ++jj) row[jj] = -INFINITY;
                    }
                }
            }
            if (kb0 < wmax) {  // window mask: key j visible to query token t iff j >= wlo[t]
                for (uint32_t t = 0; t < tq; ++t) {
                    const uint32_t upto = wlo[t] <= kb0 ? 0 : wlo[t] - kb0 < nb ? wlo[t] - kb0 : nb;
                    for (uint32_t g = 0; g < G; ++g) {
                        float *row = lg + (size_t(t) * G + g) * KB;
                        for (uint32_t jj = 0; jj < upto; ++jj) row[jj] = -INFINITY;
                    }
                }
            }
            for (uint32_t r = 0; r < rows; ++r) {
                float *row = lg + r * KB;
                const float bm = K.max(row, nb);
                if (bm == -INFINITY) {  // fully masked for this query: contributes nothing
                    memset(row, 0, nb * sizeof(float));
                    if (a.colsum) oa.mblk[r * nbk + kb0 / kKeyBlock] = -INFINITY;
                    continue;
                }
                const float mn = bm > mrow[r] ? bm : mrow[r];
                if (a.colsum) oa.mblk[r * nbk + kb0 / kKeyBlock] = mn;
                if (mn != mrow[r] && lrow[r] != 0.0f) {
                    const float al = kern::exp_approx(mrow[r] - mn);
                    float *o = O + r * st;
                    for (uint32_t j = 0; j < hd; ++j) o[j] *= al;
                    if (a.fmt) fmt_pv_rescale(a, r, al);
                    lrow[r] *= al;
                }
                lrow[r] += K.expsum(row, nb, mn, nullptr);
                mrow[r] = mn;
            }
            for (uint32_t r = ri; r < a.nr && a.runs[r].logical < kb1; ++r) {
                const Run &run = a.runs[r];
                const uint32_t j0 = run.logical > kb0 ? run.logical : kb0;
                const uint32_t j1 = run.logical + run.n < kb1 ? run.logical + run.n : kb1;
                if (a.fmt) fmt_pv(a, run, j0, j1, lg + (j0 - kb0), KB, rows, O, st);
                else K.pv(lg + (j0 - kb0), KB, rows, a.pool->v_row(slot_at(run, j0)), st, j1 - j0, hd, O, st);
            }
        }
        if (a.fmt) fmt_pv_end(a, rows, O, st);
        if (a.colsum) colsum_tile(a, oa, tq, kbs, last_q + 1, mrow, lrow, nbk);
        if (!out) continue;  // scores only
        for (uint32_t t = 0; t < tq; ++t) {
            for (uint32_t g = 0; g < G; ++g) {
                const size_t r = size_t(t) * G + g;
                const float il = 1.0f / lrow[r];
                const Out og = out + (i0 + t) * tok_stride + size_t(g) * hd;
                if (float *o = og.f32()) {
                    for (uint32_t j = 0; j < hd; ++j) o[j] = O[r * st + j] * il;
                    rotate_rows(c, o, 1, hd);  // kv_rotate: back from V's basis (its own inverse)
                } else {  // rounded to the caller's type as written (io.h)
                    float *x = O + r * st;
                    for (uint32_t j = 0; j < hd; ++j) x[j] = x[j] * il;
                    rotate_rows(c, x, 1, hd);
                    og.store(x, hd);
                }
            }
        }
    }
}

float *colsum_rows(const AttnIn &a) {
    const ObsAreas oa = obs_areas(a);
    for (uint32_t g = 0; g < a.c->group; ++g) memset(oa.obs + size_t(g) * a.c->plan.logit_ld, 0, size_t(a.L) * sizeof(float));
    return oa.obs;
}

const float *observe_prefill(const AttnIn &a, uint32_t n, const QueryPos &qp, In q, size_t tok_stride,
                             uint32_t w) {
    const kvp_cache *c = a.c;
    const kern::AttnF32 &K = *c->kern;
    const kern::ScoreF32 &S = *c->skern;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, st = c->plan.stride;
    const size_t ld = c->plan.logit_ld;
    // After attend_prefill's buffers (qt is shared: it is rebuilt per tile anyway).
    float *qt = a.work;
    const ObsAreas oa = obs_areas(a);
    float *lgf = oa.lg, *obs = oa.obs, *inv = oa.inv;

    const uint32_t L = a.L, L0 = L - n;
    for (uint32_t g = 0; g < G; ++g) memset(obs + g * ld, 0, size_t(L) * sizeof(float));
    for (uint32_t i0 = n - w; i0 < n; i0 += kTileTokens) {
        const uint32_t tq = n - i0 < kTileTokens ? n - i0 : kTileTokens;
        const uint32_t rows = tq * G, vis = L0 + i0 + tq;  // keys 0..vis-1 are seen by some row
        int64_t cur = INT64_MIN;
        for (uint32_t r = 0; r < a.nr && a.runs[r].logical < vis; ++r) {
            const Run &run = a.runs[r];
            const uint32_t j1 = run.logical + run.n < vis ? run.logical + run.n : vis;
            rotate_tile(a, qp, q, tok_stride, i0, tq, run.delta, &cur, qt);
            if (a.fmt) fmt_qk(a, run, run.logical, j1, qt, st, rows, lgf + run.logical, ld);
            else K.qk(qt, st, rows, a.pool->k_row(run.slot), st, j1 - run.logical, hd, c->scale, lgf + run.logical, ld);
            softcap(c, lgf + run.logical, rows, j1 - run.logical, ld);
        }
        for (uint32_t t = 0; t < tq; ++t) {
            for (uint32_t g = 0; g < G; ++g) {
                const size_t r = size_t(t) * G + g;
                float *row = lgf + r * ld;
                for (uint32_t j = L0 + i0 + t + 1; j < vis; ++j) row[j] = -INFINITY;
                inv[r] = 1.0f / K.expsum(row, vis, K.max(row, vis), nullptr);
            }
        }
        for (uint32_t g = 0; g < G; ++g) {
            float wg[kTileTokens];
            for (uint32_t t = 0; t < tq; ++t) wg[t] = inv[size_t(t) * G + g];
            S.acc(lgf + size_t(g) * ld, size_t(G) * ld, tq, wg, vis, obs + size_t(g) * ld);
        }
    }
    return obs;
}

const uint32_t *observe_prefill_fixed(const AttnIn &a, uint32_t n, const QueryPos &qp, In q,
                                      size_t tok_stride, uint32_t w) {
    const kvp_cache *c = a.c;
    const FixedWork &fw = *a.fx;
    const uint32_t G = c->group;
    const size_t ld = c->plan.logit_ld;
    const uint32_t L = a.L, L0 = L - n;
    for (uint32_t g = 0; g < G; ++g) memset(fw.obs + g * ld, 0, size_t(L) * sizeof(uint32_t));
    for (uint32_t t = n - w; t < n; ++t) {
        const uint32_t vis = L0 + t + 1;  // causal: keys 0..L0+t
        fixed_load_queries(c, fw, q + t * tok_stride, priv_stage(a));
        int64_t cur = INT64_MIN;
        for (uint32_t r = 0; r < a.nr && a.runs[r].logical < vis; ++r) {
            const Run &run = a.runs[r];
            if (qp.at(t) + run.delta != cur) {
                cur = qp.at(t) + run.delta;
                fixed_rotate_queries(c, fw, cur);
            }
            const uint32_t j1 = run.logical + run.n < vis ? run.logical + run.n : vis;
            fixed_logits(a, fw, run, run.logical, j1);
        }
        for (uint32_t g = 0; g < G; ++g) {
            int64_t *y = fw.y + g * ld;
            const uint64_t Z = fixed::softmax_exps(y, vis);
            const double inv = 1.0 / double(Z);
            uint32_t *o = fw.obs + g * ld;
            for (uint32_t j = 0; j < vis; ++j) o[j] = fixed::sat_add(o[j], fixed::weight_r(uint64_t(y[j]), Z, inv));
        }
    }
    return fw.obs;
}

}  // namespace kvp
