#include "quant/attn_fmt.h"

#include <string.h>

#include "attention.h"
#include "cache.h"

namespace kvp {

void fmt_qk(const AttnIn &a, const Run &run, uint32_t j0, uint32_t j1, const float *q, size_t ldq, uint32_t rows,
            float *logits, size_t ldl) {
    const kvp_cache *c = a.c;
    const uint32_t n = j1 - j0;
    if (n == 0) return;
    const FmtIn &x = *a.fmt;
    if (run.src != kSrcPool) {
        const float *k, *v;
        size_t ld[2];
        fmt_run_rows(*x.fc, *x.fs, x.nw, run, j0, &k, &v, ld);
        c->kern->qk(q, ldq, rows, k, ld[0], n, c->cfg.model.head_dim, c->scale, logits, ldl);
        return;
    }
    const StoreFormat &f = x.fc->f;
    const FmtPool &pool = fmt_pool(*x.fc, *a.pool);
    // the query at the kept key channels, zero padded
    for (uint32_t r = 0; r < rows; ++r) {
        const float *qr = q + r * ldq;
        float *g = x.qg + size_t(r) * f.wkp;
        if (f.thin_k) {
            for (uint32_t ch = 0; ch < f.wk; ++ch) g[ch] = qr[x.fs->kidx[ch]];
        } else {
            memcpy(g, qr, f.wk * sizeof(float));
        }
        for (uint32_t ch = f.wk; ch < f.wkp; ++ch) g[ch] = 0.0f;
    }
    const uint32_t s0 = run.slot + (j0 - run.logical);
    switch (f.dtype) {
        case KVP_DTYPE_F32:
            c->kern->qk(x.qg, f.wkp, rows, reinterpret_cast<const float *>(pool.kq) + size_t(s0) * f.wkp, f.wkp, n, f.wk,
                        c->scale, logits, ldl);
            return;
        case KVP_DTYPE_F16:
            x.fc->q->qk_f16(x.qg, f.wkp, rows, nullptr, pool.kq + size_t(s0) * f.k_row, f.k_row, n, f.wkp, c->scale, logits,
                            ldl);
            return;
        default: {
            const kern::AttnQ &Q = *x.fc->q;
            const uint32_t block = a.pool->block;
            for (uint32_t t = 0; t < n;) {  // one call per block: its own key grid
                const uint32_t s = s0 + t, b = s / block, m = block - s % block < n - t ? block - s % block : n - t;
                const int8_t *ge = pool.kge + size_t(b) * f.wkp;
                const int16_t *gz = pool.kgz + size_t(b) * f.wkp;
                const uint8_t *k = pool.kq + size_t(s) * f.k_row;
                if (f.dtype == KVP_DTYPE_Q8) {  // integer dot products (kernels/attn_q.h)
                    Q.prep8(x.qg, f.wkp, rows, ge, gz, f.wkp, x.qs, f.wkp, x.qi, f.wkp, x.qsc, x.bias);
                    Q.qk_q8(x.qi, f.wkp, rows, x.qsc, x.bias, k, f.k_row, m, f.wkp, c->scale, logits + t, ldl);
                } else {
                    Q.prep4(x.qg, f.wkp, rows, ge, gz, f.wkp, x.qs, f.wkp, x.qi, f.wkp, x.qsc, x.bias);
                    Q.qk_q4(x.qi, f.wkp, rows, x.qsc, x.bias, k, f.k_row, m, f.wkp, c->scale, logits + t, ldl);
                }
                t += m;
            }
        }
    }
}

void fmt_pv(const AttnIn &a, const Run &run, uint32_t j0, uint32_t j1, const float *p, size_t ldp, uint32_t rows,
            float *o, size_t ldo) {
    const kvp_cache *c = a.c;
    const uint32_t n = j1 - j0;
    if (n == 0) return;
    const FmtIn &x = *a.fmt;
    if (run.src != kSrcPool) {
        const float *k, *v;
        size_t ld[2];
        fmt_run_rows(*x.fc, *x.fs, x.nw, run, j0, &k, &v, ld);
        c->kern->pv(p, ldp, rows, v, ld[1], n, c->cfg.model.head_dim, o, ldo);
        return;
    }
    const StoreFormat &f = x.fc->f;
    const FmtPool &pool = fmt_pool(*x.fc, *a.pool);
    const uint32_t s0 = run.slot + (j0 - run.logical);
    switch (f.dtype) {
        case KVP_DTYPE_F32:
            c->kern->pv(p, ldp, rows, reinterpret_cast<const float *>(pool.vq) + size_t(s0) * f.wvp, f.wvp, n, f.wv, x.oacc,
                        f.wvp);
            return;
        case KVP_DTYPE_F16:
            x.fc->q->pv_f16(p, ldp, rows, pool.vq + size_t(s0) * f.v_row, f.v_row, nullptr, 0, n, f.wvp, x.oacc, f.wvp,
                            nullptr, 0);
            return;
        default: {
            const kern::q_pv_fn pv = f.dtype == KVP_DTYPE_Q8 ? x.fc->q->pv_q8 : x.fc->q->pv_q4;
            const size_t ldsz = 2 * size_t(f.v_groups);
            pv(p, ldp, rows, pool.vq + size_t(s0) * f.v_row, f.v_row, pool.vsz + size_t(s0) * ldsz, ldsz, n, f.wvp, x.oacc,
               f.wvp, x.zacc, f.v_groups);
        }
    }
}

void fmt_pv_begin(const AttnIn &a, uint32_t rows) {
    const FmtIn &x = *a.fmt;
    const StoreFormat &f = x.fc->f;
    memset(x.oacc, 0, size_t(rows) * f.wvp * sizeof(float));
    if (f.v_groups) memset(x.zacc, 0, size_t(rows) * f.v_groups * sizeof(float));
}

void fmt_pv_rescale(const AttnIn &a, uint32_t row, float alpha) {
    const FmtIn &x = *a.fmt;
    const StoreFormat &f = x.fc->f;
    float *o = x.oacc + size_t(row) * f.wvp;
    for (uint32_t ch = 0; ch < f.wv; ++ch) o[ch] *= alpha;
    float *z = x.zacc + size_t(row) * f.v_groups;
    for (uint32_t g = 0; g < f.v_groups; ++g) z[g] *= alpha;
}

void fmt_pv_end(const AttnIn &a, uint32_t rows, float *o, size_t ldo) {
    const FmtIn &x = *a.fmt;
    const StoreFormat &f = x.fc->f;
    if ((f.thin_k || f.thin_v) && !x.fs->selected) return;  // nothing is converted before ThinK selects
    for (uint32_t r = 0; r < rows; ++r) {
        const float *acc = x.oacc + size_t(r) * f.wvp;
        const float *z = x.zacc + size_t(r) * f.v_groups;
        float *orow = o + r * ldo;
        if (f.thin_v) {
            for (uint32_t ch = 0; ch < f.wv; ++ch)
                orow[x.fs->vidx[ch]] += f.v_groups ? acc[ch] + z[ch / kVGroup] : acc[ch];
            continue;
        }
        // per value group, so the compiler vectorizes (the same additions per element)
        if (!f.v_groups) {
            for (uint32_t ch = 0; ch < f.wv; ++ch) orow[ch] += acc[ch];
            continue;
        }
        for (uint32_t g = 0, ch0 = 0; ch0 < f.wv; ++g, ch0 += kVGroup) {
            const float zg = z[g];
            const uint32_t ch1 = ch0 + kVGroup < f.wv ? ch0 + kVGroup : f.wv;
            for (uint32_t ch = ch0; ch < ch1; ++ch) orow[ch] += acc[ch] + zg;
        }
    }
}

}  // namespace kvp
