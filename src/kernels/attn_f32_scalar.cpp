// Scalar reference of the fp32 attention kernels (see attn_f32.h).
//
// Plain loops in the most obvious order: every dot product and every output element is a
// sequential float sum over its index. The SIMD variants are tested against these, and these
// are tested against a double-precision loop (tests/test_kernels.cpp).
#include "kernels/attn_f32.h"

#include <math.h>

namespace kvp {
namespace kern {

// exp, Cephes expf style (also the polynomial of the SIMD variants, attn_f32_simd.inc):
//   n = floor(x*log2(e) + 1/2), r = x - n*ln2 (ln2 split in two so that n*C1 is exact),
//   exp(r) = 1 + r + r^2 * P(r) on |r| <= ln2/2, exp(x) = exp(r) * 2^n built in the exponent.
// Range: x < ln(FLT_MIN) (-87.3365, including -inf) gives 0 (the true value is subnormal:
// flushing it is harmless for softmax weights); x > 88.37 saturates at exp(88.37) ~ 2.4e38
// (finite, so never inf * 0). Accuracy ~1-2 ulp in between. NaN input gives an unspecified
// finite value (callers reject non-finite q/k/v before attention).
namespace {
constexpr float kExpHi = 88.37f;               // n <= 127: 2^n stays a normal float
constexpr float kExpLo = -87.33654475f;        // ln(FLT_MIN)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kExpC1 = 0.693359375f;         // ln2 = C1 + C2, C1 has 9 significant bits
constexpr float kExpC2 = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f;
constexpr float kExpP1 = 1.3981999507e-3f;
constexpr float kExpP2 = 8.3334519073e-3f;
constexpr float kExpP3 = 4.1665795894e-2f;
constexpr float kExpP4 = 1.6666665459e-1f;
constexpr float kExpP5 = 5.0000001201e-1f;
}  // namespace

float exp_approx(float x) {
    if (!(x >= kExpLo)) {
        // -inf, large negative; NaN also lands here (gives 0)
        return 0.0f;
    }
    if (x > kExpHi) x = kExpHi;
    const float n = floorf(x * kLog2e + 0.5f);
    float r = x - n * kExpC1;
    r = r - n * kExpC2;
    const float z = r * r;
    float y = kExpP0;
    y = y * r + kExpP1;
    y = y * r + kExpP2;
    y = y * r + kExpP3;
    y = y * r + kExpP4;
    y = y * r + kExpP5;
    y = y * z + r;
    y = y + 1.0f;
    // 2^n with n in [-126, 127]: build the exponent field directly
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float p2;
    __builtin_memcpy(&p2, &bits, sizeof p2);
    return y * p2;
}

// tanh: for |x| < 0.625, x + x^3 * P(x^2) (the minimax coefficients of Cephes' tanhf); above,
// 1 - 2 / (e^(2|x|) + 1) with exp_approx, which has no cancellation there (tanh >= 0.55). The
// sign is restored at the end. No FMA anywhere (see attn_f32.h, f32_softcap_fn).
namespace {
constexpr float kTanhSplit = 0.625f;
constexpr float kTanhP0 = -5.70498872745e-3f;
constexpr float kTanhP1 = 2.06390887954e-2f;
constexpr float kTanhP2 = -5.37397155531e-2f;
constexpr float kTanhP3 = 1.33314422036e-1f;
constexpr float kTanhP4 = -3.33332819422e-1f;
}  // namespace

float tanh_approx(float x) {
    const float a = fabsf(x);
    float t;
    if (a < kTanhSplit) {
        const float z = a * a;
        float p = kTanhP0;
        p = p * z + kTanhP1;
        p = p * z + kTanhP2;
        p = p * z + kTanhP3;
        p = p * z + kTanhP4;
        t = a + (a * z) * p;
    } else {
        const float e = exp_approx(a + a);
        t = 1.0f - 2.0f / (e + 1.0f);
    }
    return copysignf(t, x);
}

namespace {

void softcap_scalar(float *x, uint32_t n, float cap) {
    const float inv = 1.0f / cap;  // a multiply per logit instead of a divide (SIMD: 1 of 2 divides)
    for (uint32_t i = 0; i < n; ++i) x[i] = cap * tanh_approx(x[i] * inv);
}

void qk_scalar(const float *q, size_t ldq, uint32_t rows, const float *k, size_t ldk, uint32_t n,
               uint32_t d, float scale, float *logits, size_t ldl) {
    for (uint32_t r = 0; r < rows; ++r) {
        const float *qr = q + (size_t)r * ldq;
        float *lr = logits + (size_t)r * ldl;
        for (uint32_t t = 0; t < n; ++t) {
            const float *kt = k + (size_t)t * ldk;
            float s = 0.0f;
            for (uint32_t i = 0; i < d; ++i) s += qr[i] * kt[i];
            lr[t] = s * scale;
        }
    }
}

void pv_scalar(const float *p, size_t ldp, uint32_t rows, const float *v, size_t ldv, uint32_t n,
               uint32_t d, float *o, size_t ldo) {
    for (uint32_t r = 0; r < rows; ++r) {
        const float *pr = p + (size_t)r * ldp;
        float *orow = o + (size_t)r * ldo;
        for (uint32_t t = 0; t < n; ++t) {
            const float w = pr[t];
            const float *vt = v + (size_t)t * ldv;
            for (uint32_t j = 0; j < d; ++j) orow[j] += w * vt[j];
        }
    }
}

float max_scalar(const float *x, uint32_t n) {
    float m = -INFINITY;
    for (uint32_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
    return m;
}

float expsum_scalar(float *x, uint32_t n, float m, float *sumsq) {
    float s = 0.0f, q = 0.0f;
    for (uint32_t i = 0; i < n; ++i) {
        x[i] = exp_approx(x[i] - m);
        s += x[i];
        q += x[i] * x[i];
    }
    if (sumsq) *sumsq = q;
    return s;
}

void merge_scalar(const float *o, size_t ldo, const float *w, size_t ldw, uint32_t nch, float scale, uint32_t d,
                  float *out) {
    for (uint32_t j = 0; j < d; ++j) {
        float s = w[0] * o[j];
        for (uint32_t c = 1; c < nch; ++c) s = s + w[c * ldw] * o[c * ldo + j];
        out[j] = s * scale;
    }
}

constexpr AttnF32 kScalar = {"scalar", &qk_scalar, &pv_scalar, &max_scalar, &expsum_scalar, &merge_scalar,
                                &softcap_scalar};

}  // namespace

const AttnF32 *attn_f32_scalar() { return &kScalar; }

}  // namespace kern
}  // namespace kvp
