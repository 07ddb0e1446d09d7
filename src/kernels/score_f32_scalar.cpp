// Scalar reference of the scoring kernels (see score_f32.h): plain loops in the documented order.
#include "kernels/score_f32.h"

namespace kvp {
namespace kern {
namespace {

void acc_scalar(const float *p, size_t ldp, uint32_t rows, const float *w, uint32_t n, float *s) {
    for (uint32_t t = 0; t < n; ++t) {
        float a = w[0] * p[t];
        for (uint32_t r = 1; r < rows; ++r) a += w[r] * p[(size_t)r * ldp + t];
        s[t] += a;
    }
}

float sumsq_scalar(const float *x, uint32_t n) {
    float s = 0.0f;
    for (uint32_t i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
}

uint32_t argmin_scalar(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; ++i)
        if (x[i] < x[best]) best = i;
    return best;
}

void dots16_scalar(const int16_t *q, size_t ldq, uint32_t rows, const int16_t *k, uint32_t n, int64_t *out, size_t ldo) {
    for (uint32_t r = 0; r < rows; ++r) {
        int64_t d = 0;
        for (uint32_t i = 0; i < n; ++i) d += int32_t(q[r * ldq + i]) * int32_t(k[i]);
        out[r * ldo] = d;
    }
}

constexpr ScoreF32 kScalar = {"scalar", &acc_scalar, &sumsq_scalar, &argmin_scalar, &dots16_scalar};

}  // namespace

const ScoreF32 *score_f32_scalar() { return &kScalar; }

}  // namespace kern
}  // namespace kvp
