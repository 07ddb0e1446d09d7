// Scalar reference of the stored-format attention kernels (see attn_q.h): plain loops in the
// documented order. Elements are decoded one at a time (f16 through format.h's exact
// conversion, codes as small integers); nothing is cached.
#include "kernels/attn_q.h"

#include <math.h>

#include "quant/format.h"

namespace kvp {
namespace kern {
namespace {

enum Kind { kF16, kQ8, kQ4 };

// Element c of a stored row of width w: the f16 value, or the code as a float.
float elem(Kind kind, const uint8_t *row, uint32_t w, uint32_t c) {
    if (kind == kF16) {
        uint16_t h;
        __builtin_memcpy(&h, row + 2 * c, 2);
        return f32_from_f16(h);
    }
    if (kind == kQ8) return float(row[c]);
    (void)w;
    const uint32_t i = c % 16, b = row[8 * (c / 16) + (i & 7)];
    return i < 8 ? float(b & 15u) : float(b >> 4);
}

void qk(Kind kind, const float *qs, size_t ldq, uint32_t rows, const float *bias, const uint8_t *k, size_t ldk,
        uint32_t n, uint32_t w, float scale, float *logits, size_t ldl) {
    for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t t = 0; t < n; ++t) {
            const uint8_t *kt = k + (size_t)t * ldk;
            float s = 0.0f;
            for (uint32_t c = 0; c < w; ++c) s += qs[(size_t)r * ldq + c] * elem(kind, kt, w, c);
            logits[(size_t)r * ldl + t] = (s + (bias ? bias[r] : 0.0f)) * scale;
        }
    }
}

void pv(Kind kind, const float *p, size_t ldp, uint32_t rows, const uint8_t *v, size_t ldv, const uint16_t *sz,
        size_t ldsz, uint32_t n, uint32_t w, float *o, size_t ldo, float *zacc_all, size_t ldz) {
    const uint32_t G = (w + 31) / 32;
    for (uint32_t r = 0; r < rows; ++r) {
        float *zacc = kind != kF16 ? zacc_all + (size_t)r * ldz : nullptr;
        float *orow = o + (size_t)r * ldo;
        for (uint32_t t = 0; t < n; ++t) {
            const float pt = p[(size_t)r * ldp + t];
            const uint8_t *vt = v + (size_t)t * ldv;
            for (uint32_t c = 0; c < w; ++c) {
                float wt = pt;
                if (kind != kF16) wt = pt * f32_from_f16(sz[(size_t)t * ldsz + c / 32]);
                orow[c] += wt * elem(kind, vt, w, c);
            }
            if (kind != kF16)
                for (uint32_t g = 0; g < G; ++g) zacc[g] += pt * f32_from_f16(sz[(size_t)t * ldsz + G + g]);
        }
    }
}

void qk_f16(const float *qs, size_t ldq, uint32_t rows, const float *bias, const uint8_t *k, size_t ldk, uint32_t n,
            uint32_t w, float scale, float *l, size_t ldl) {
    qk(kF16, qs, ldq, rows, bias, k, ldk, n, w, scale, l, ldl);
}
void qk_q8(const int8_t *qi, size_t ldq, uint32_t rows, const float *qsc, const float *bias, const uint8_t *k,
           size_t ldk, uint32_t n, uint32_t w, float scale, float *l, size_t ldl) {
    for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t t = 0; t < n; ++t) {
            int32_t s = 0;
            for (uint32_t c = 0; c < w; ++c) s += int32_t(qi[(size_t)r * ldq + c]) * int32_t(k[(size_t)t * ldk + c]);
            l[(size_t)r * ldl + t] = (qsc[r] * float(s) + bias[r]) * scale;
        }
    }
}
void qk_q4(const int8_t *qi, size_t ldq, uint32_t rows, const float *qsc, const float *bias, const uint8_t *k,
           size_t ldk, uint32_t n, uint32_t w, float scale, float *l, size_t ldl) {
    for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t t = 0; t < n; ++t) {
            int32_t s = 0;
            for (uint32_t p = 0; p < w; ++p)
                s += int32_t(qi[(size_t)r * ldq + p]) * int32_t(elem(kQ4, k + (size_t)t * ldk, w, q4_code_channel(p, w)));
            l[(size_t)r * ldl + t] = (qsc[r] * float(s) + bias[r]) * scale;
        }
    }
}
void pv_f16(const float *p, size_t ldp, uint32_t rows, const uint8_t *v, size_t ldv, const uint16_t *sz, size_t ldsz,
           uint32_t n, uint32_t w, float *o, size_t ldo, float *z, size_t ldz) {
    pv(kF16, p, ldp, rows, v, ldv, sz, ldsz, n, w, o, ldo, z, ldz);
}
void pv_q8(const float *p, size_t ldp, uint32_t rows, const uint8_t *v, size_t ldv, const uint16_t *sz, size_t ldsz,
           uint32_t n, uint32_t w, float *o, size_t ldo, float *z, size_t ldz) {
    pv(kQ8, p, ldp, rows, v, ldv, sz, ldsz, n, w, o, ldo, z, ldz);
}
void pv_q4(const float *p, size_t ldp, uint32_t rows, const uint8_t *v, size_t ldv, const uint16_t *sz, size_t ldsz,
           uint32_t n, uint32_t w, float *o, size_t ldo, float *z, size_t ldz) {
    pv(kQ4, p, ldp, rows, v, ldv, sz, ldsz, n, w, o, ldo, z, ldz);
}

void prep(const float *q, size_t ldq, uint32_t rows, const int8_t *ge, const int16_t *gz, uint32_t w, float *qs,
          size_t lds, float *bias) {
    for (uint32_t r = 0; r < rows; ++r) {
        float b = 0.0f;
        for (uint32_t c = 0; c < w; ++c) {
            const float s = dyadic_step(ge[c]), qc = q[(size_t)r * ldq + c];
            qs[(size_t)r * lds + c] = qc * s;
            b += qc * (float(gz[c]) * s);
        }
        bias[r] = b;
    }
}

// prep, then the int8 query in code order (q4) or channel order (q8).
void prep_int(bool q4, const float *q, size_t ldq, uint32_t rows, const int8_t *ge, const int16_t *gz, uint32_t w,
              float *qs, size_t lds, int8_t *qi, size_t ldi, float *qsc, float *bias) {
    prep(q, ldq, rows, ge, gz, w, qs, lds, bias);
    for (uint32_t r = 0; r < rows; ++r) {
        const float *x = qs + (size_t)r * lds;
        float mx = 0.0f;
        for (uint32_t c = 0; c < w; ++c) mx = fabsf(x[c]) > mx ? fabsf(x[c]) : mx;
        const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        qsc[r] = mx / 127.0f;
        for (uint32_t p = 0; p < w; ++p) {
            float v = floorf(x[q4 ? q4_code_channel(p, w) : p] * inv + 0.5f);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qi[(size_t)r * ldi + p] = int8_t(v);
        }
    }
}

void prep4(const float *q, size_t ldq, uint32_t rows, const int8_t *ge, const int16_t *gz, uint32_t w, float *qs,
           size_t lds, int8_t *qi, size_t ldi, float *qsc, float *bias) {
    prep_int(true, q, ldq, rows, ge, gz, w, qs, lds, qi, ldi, qsc, bias);
}
void prep8(const float *q, size_t ldq, uint32_t rows, const int8_t *ge, const int16_t *gz, uint32_t w, float *qs,
           size_t lds, int8_t *qi, size_t ldi, float *qsc, float *bias) {
    prep_int(false, q, ldq, rows, ge, gz, w, qs, lds, qi, ldi, qsc, bias);
}

constexpr AttnQ kScalar = {"scalar", &qk_f16, &qk_q8, &qk_q4, &pv_f16, &pv_q8, &pv_q4, &prep, &prep4, &prep8};

}  // namespace

const AttnQ *attn_q_scalar() { return &kScalar; }

}  // namespace kern
}  // namespace kvp
