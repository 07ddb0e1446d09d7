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

constexpr ScoreF32 kScalar = {"scalar", &acc_scalar, &sumsq_scalar};

}  // namespace

const ScoreF32 *score_f32_scalar() { return &kScalar; }

}  // namespace kern
}  // namespace kvp
