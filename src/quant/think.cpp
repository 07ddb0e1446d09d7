#include "quant/think.h"

#include <math.h>
#include <string.h>

#include <algorithm>

#include "arena.h"
#include "attention.h"
#include "cache.h"
#include "rope.h"

namespace kvp {
namespace {

struct ThinkScratch {
    float *qrot;    // [w][G][stride]  observation queries rotated for the current run delta
    float *qc, *oc; // [w][G*hd]       compact copies of the observation queries / their outputs
    double *acc;    // [G][units]      sum over runs of tr(Gram_Q * Gram_K) per query head
    double *qg;     // [G][units][3]   query Gram per unit (pairs: aa, ab, bb; singles: aa)
    double *kg;     // [units][3]      key Gram of one run
    double *ks;     // [units]         key score
    double *vs;     // [hd]            value score
    uint32_t *ord;  // [hd]
};

size_t sz_f(size_t n) { return align_up(n * sizeof(float), kAlign); }
size_t sz_d(size_t n) { return align_up(n * sizeof(double), kAlign); }

ThinkScratch carve(char *b, uint32_t stride, uint32_t w, uint32_t G, uint32_t hd) {
    ThinkScratch s;
    s.qrot = reinterpret_cast<float *>(b);
    b += sz_f(size_t(w) * G * stride);
    s.qc = reinterpret_cast<float *>(b);
    b += sz_f(size_t(w) * G * hd);
    s.oc = reinterpret_cast<float *>(b);
    b += sz_f(size_t(w) * G * hd);
    s.acc = reinterpret_cast<double *>(b);
    b += sz_d(size_t(G) * hd);
    s.qg = reinterpret_cast<double *>(b);
    b += sz_d(size_t(G) * hd * 3);
    s.kg = reinterpret_cast<double *>(b);
    b += sz_d(size_t(hd) * 3);
    s.ks = reinterpret_cast<double *>(b);
    b += sz_d(hd);
    s.vs = reinterpret_cast<double *>(b);
    b += sz_d(hd);
    s.ord = reinterpret_cast<uint32_t *>(b);
    return s;
}

// Scoring units: RoPE pairs 0..pairs-1 (channels a(u), b(u)), then unrotated single channels.
struct Units {
    uint32_t pairs, n, hd;
    kvp_rope_style style;
    uint32_t a(uint32_t u) const {
        if (u >= pairs) return 2 * pairs + (u - pairs);
        return style == KVP_ROPE_GPTJ ? 2 * u : u;
    }
    uint32_t b(uint32_t u) const { return style == KVP_ROPE_GPTJ ? 2 * u + 1 : u + pairs; }
    bool pair(uint32_t u) const { return u < pairs; }
};

// Sorts idx[0..n) by (score ascending, index ascending): the first ones are pruned.
void rank(uint32_t *idx, uint32_t n, const double *score) {
    std::sort(idx, idx + n, [score](uint32_t x, uint32_t y) { return score[x] < score[y] || (score[x] == score[y] && x < y); });
}

}  // namespace

size_t think_scratch_bytes(const kvp_config &cfg, uint32_t stride, uint32_t w, uint32_t G) {
    const size_t hd = cfg.model.head_dim;
    return sz_f(size_t(w) * G * stride) + 2 * sz_f(size_t(w) * G * hd) + sz_d(G * hd) + sz_d(G * hd * 3) +
           sz_d(hd * 3) + 2 * sz_d(hd) + align_up(hd * sizeof(uint32_t), kAlign);
}

void think_select(kvp_cache *c, HeadStore &hs, BlockPool &pool, const StagedNew &nw, const StepObs &obs) {
    const kvp_config &cfg = c->cfg;
    const FmtCache &fc = *c->fmt;
    const StoreFormat &f = fc.f;
    FmtStore &fs = fmt_store(fc, hs);
    const uint32_t hd = f.d, G = c->group, st = fc.stride;
    const uint32_t w = obs.q && obs.n ? (cfg.obs_window < obs.n ? cfg.obs_window : obs.n) : 0;
    ThinkScratch s = carve(obs.scratch + fc.fp.s_think, st, fc.fp.obs_rows, G, hd);
    const Units U{f.rot_units, f.rot_units + (hd - 2 * f.rot_units), hd, cfg.model.rope};
    const uint32_t nr = fmt_runs(c, hs, pool, obs.realign, nw, obs.runs);
    const bool qk = cfg.channel_score == 0 && w > 0;

    // ---- key channels ----
    for (size_t i = 0; i < size_t(G) * U.n; ++i) s.acc[i] = 0.0;
    for (uint32_t u = 0; u < U.n; ++u) s.ks[u] = 0.0;
    int64_t cur = INT64_MIN;
    for (uint32_t r = 0; r < nr; ++r) {
        const Run &run = obs.runs[r];  // every token is still full precision (nothing converted yet)
        for (uint32_t u = 0; u < U.n; ++u) s.kg[3 * u] = s.kg[3 * u + 1] = s.kg[3 * u + 2] = 0.0;
        const float *k0, *v0;
        size_t ld[2];
        fmt_run_rows(fc, fs, nw, run, run.logical, &k0, &v0, ld);
        for (uint32_t i = 0; i < run.n; ++i) {
            const float *k = k0 + i * ld[0];
            for (uint32_t u = 0; u < U.n; ++u) {
                const double x = k[U.a(u)];
                if (cfg.channel_score == 1 && !qk) {  // l1
                    s.kg[3 * u] += fabs(x);
                    if (U.pair(u)) s.kg[3 * u] += fabs(double(k[U.b(u)]));
                } else {
                    s.kg[3 * u] += x * x;
                    if (U.pair(u)) {
                        const double y = k[U.b(u)];
                        s.kg[3 * u + 1] += x * y;
                        s.kg[3 * u + 2] += y * y;
                    }
                }
            }
        }
        if (!qk) {
            for (uint32_t u = 0; u < U.n; ++u) s.ks[u] += s.kg[3 * u] + s.kg[3 * u + 2];
            continue;
        }
        if (run.delta != cur) {  // the observation queries as attention rotated them for this run
            cur = run.delta;
            for (uint32_t t = 0; t < w; ++t) {
                const uint32_t i = obs.n - w + t;
                float *dst = s.qrot + size_t(t) * G * st;
                for (uint32_t g = 0; g < G; ++g)
                    (obs.q + (i * obs.tok_stride + size_t(g) * hd)).load(dst + size_t(g) * st, hd);
                if (c->rope.style != KVP_ROPE_NONE)
                    rope_apply(c->rope, rope_table_memo(c->rope, *obs.a->memo, obs.qp->at(i) + cur), dst, G, st);
            }
            for (uint32_t g = 0; g < G; ++g) {
                double *qg = s.qg + size_t(g) * U.n * 3;
                for (uint32_t u = 0; u < U.n; ++u) qg[3 * u] = qg[3 * u + 1] = qg[3 * u + 2] = 0.0;
                for (uint32_t t = 0; t < w; ++t) {
                    const float *q = s.qrot + (size_t(t) * G + g) * st;
                    for (uint32_t u = 0; u < U.n; ++u) {
                        const double x = q[U.a(u)];
                        qg[3 * u] += x * x;
                        if (U.pair(u)) {
                            const double y = q[U.b(u)];
                            qg[3 * u + 1] += x * y;
                            qg[3 * u + 2] += y * y;
                        }
                    }
                }
            }
        }
        // ||Q_u K_u^T||_F^2 = sum_ab GramQ_ab GramK_ab, accumulated over runs per query head
        for (uint32_t g = 0; g < G; ++g) {
            const double *qg = s.qg + size_t(g) * U.n * 3;
            double *acc = s.acc + size_t(g) * U.n;
            for (uint32_t u = 0; u < U.n; ++u)
                acc[u] += qg[3 * u] * s.kg[3 * u] + 2.0 * qg[3 * u + 1] * s.kg[3 * u + 1] + qg[3 * u + 2] * s.kg[3 * u + 2];
        }
    }
    if (qk) {
        for (uint32_t g = 0; g < G; ++g)
            for (uint32_t u = 0; u < U.n; ++u) s.ks[u] += sqrt(s.acc[size_t(g) * U.n + u]);
    } else if (cfg.channel_score != 1) {  // l2 (and qk without queries)
        for (uint32_t u = 0; u < U.n; ++u) s.ks[u] = sqrt(s.ks[u]);
    }
    if (f.thin_k) {
        bool pruned[kMaxFmtDim] = {false};
        uint32_t m = 0;
        for (uint32_t u = 0; u < U.pairs; ++u) s.ord[m++] = u;
        rank(s.ord, m, s.ks);
        for (uint32_t i = 0; i < f.prune_pairs; ++i) pruned[U.a(s.ord[i])] = pruned[U.b(s.ord[i])] = true;
        m = 0;
        for (uint32_t u = U.pairs; u < U.n; ++u) s.ord[m++] = u;
        rank(s.ord, m, s.ks);
        for (uint32_t i = 0; i < f.prune_singles; ++i) pruned[U.a(s.ord[i])] = true;
        m = 0;
        for (uint32_t ch = 0; ch < hd; ++ch)
            if (!pruned[ch]) fs.kidx[m++] = uint16_t(ch);
    } else {
        for (uint32_t ch = 0; ch < f.wk; ++ch) fs.kidx[ch] = uint16_t(ch);
    }

    // ---- value channels ----
    if (f.thin_v) {
        for (uint32_t ch = 0; ch < hd; ++ch) s.vs[ch] = 0.0;
        if (cfg.channel_score == 0 && w > 0) {
            // ||A V[:, j]|| over the observation queries = column norms of their outputs
            const float *o = nullptr;
            size_t ld = 0;
            if (obs.out) {
                o = obs.out + (obs.n - w) * obs.tok_stride;
                ld = obs.tok_stride;
            } else {
                const size_t row = size_t(G) * hd;
                for (uint32_t t = 0; t < w; ++t)
                    (obs.q + (obs.n - w + t) * obs.tok_stride).load(s.qc + t * row, row);
                NewPositions np{obs.qp->pos->given ? obs.qp->pos->given + (obs.n - w) : nullptr,
                                obs.qp->pos->first + (obs.n - w)};
                QueryPos qp{&np, obs.qp->realign, hs.len() - w};
                AttnIn a = *obs.a;
                a.runs = obs.runs;
                a.nr = nr;
                attend_prefill(a, w, qp, s.qc, s.oc, row);
                o = s.oc;
                ld = row;
            }
            for (uint32_t g = 0; g < G; ++g) {
                for (uint32_t ch = 0; ch < hd; ++ch) {
                    double sq = 0.0;
                    for (uint32_t t = 0; t < w; ++t) {
                        const double x = o[t * ld + size_t(g) * hd + ch];
                        sq += x * x;
                    }
                    s.vs[ch] += sqrt(sq);
                }
            }
        } else {  // magnitude: l1 or l2 of the value columns
            for (uint32_t r = 0; r < nr; ++r) {
                const Run &run = obs.runs[r];
                const float *k0, *v0;
                size_t ld[2];
                fmt_run_rows(fc, fs, nw, run, run.logical, &k0, &v0, ld);
                for (uint32_t i = 0; i < run.n; ++i) {
                    const float *v = v0 + i * ld[1];
                    for (uint32_t ch = 0; ch < hd; ++ch)
                        s.vs[ch] += cfg.channel_score == 1 ? fabs(double(v[ch])) : double(v[ch]) * v[ch];
                }
            }
            if (cfg.channel_score != 1)
                for (uint32_t ch = 0; ch < hd; ++ch) s.vs[ch] = sqrt(s.vs[ch]);
        }
        for (uint32_t ch = 0; ch < hd; ++ch) s.ord[ch] = ch;
        rank(s.ord, hd, s.vs);
        bool pruned[kMaxFmtDim] = {false};
        for (uint32_t i = 0; i < f.prune_v; ++i) pruned[s.ord[i]] = true;
        uint32_t m = 0;
        for (uint32_t ch = 0; ch < hd; ++ch)
            if (!pruned[ch]) fs.vidx[m++] = uint16_t(ch);
    } else {
        for (uint32_t ch = 0; ch < f.wv; ++ch) fs.vidx[ch] = uint16_t(ch);
    }
    fs.selected = 1;
}

}  // namespace kvp
