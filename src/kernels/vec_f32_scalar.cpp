// Scalar reference of the row-wise vector ops (see vec_f32.h).
#include "kernels/vec_f32.h"

#include <string.h>

namespace kvp {
namespace kern {
namespace {

void rope_neox_scalar(const float *cs, float *x, uint32_t n, size_t ld, uint32_t pairs) {
    for (uint32_t j = 0; j < n; ++j) {
        float *row = x + j * ld;
        for (uint32_t i = 0; i < pairs; ++i) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = row[i], x1 = row[i + pairs];
            row[i] = x0 * c - x1 * s;
            row[i + pairs] = x0 * s + x1 * c;
        }
    }
}

void rope_gptj_scalar(const float *cs, float *x, uint32_t n, size_t ld, uint32_t pairs) {
    for (uint32_t j = 0; j < n; ++j) {
        float *row = x + j * ld;
        for (uint32_t i = 0; i < pairs; ++i) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = row[2 * i], x1 = row[2 * i + 1];
            row[2 * i] = x0 * c - x1 * s;
            row[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

size_t first_out_of_range_scalar(const float *x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        if ((b & 0x7fffffffu) >= kOutOfRangeBits) return i;
    }
    return n;
}

constexpr VecF32 kScalar = {"scalar", &rope_neox_scalar, &rope_gptj_scalar, &first_out_of_range_scalar};

}  // namespace

const VecF32 *vec_f32_scalar() { return &kScalar; }

}  // namespace kern
}  // namespace kvp
