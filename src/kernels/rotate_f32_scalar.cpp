// Scalar reference of the Walsh-Hadamard rotation (rotate_f32.h), and variant selection.
#include "kernels/rotate_f32.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace kvp {
namespace kern {

float hadamard_scale(uint32_t b) { return float(1.0 / sqrt(double(b))); }

namespace {

void hadamard_block(float *x, uint32_t b) {
    for (uint32_t h = 1; h < b; h <<= 1)
        for (uint32_t j0 = 0; j0 < b; j0 += 2 * h)
            for (uint32_t j = j0; j < j0 + h; ++j) {
                const float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    const float s = hadamard_scale(b);
    for (uint32_t j = 0; j < b; ++j) x[j] = x[j] * s;
}

void hadamard_scalar(float *x, uint32_t n, size_t ld, uint32_t hd) {
    for (uint32_t r = 0; r < n; ++r) {
        float *row = x + r * ld;
        uint32_t off = 0;
        for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
            if (!(hd & bit)) continue;
            if (bit > 1) hadamard_block(row + off, bit);
            off += bit;
        }
    }
}

constexpr RotateF32 kScalar = {"scalar", &hadamard_scalar};

}  // namespace

const RotateF32 *rotate_f32_scalar() { return &kScalar; }
const RotateF32 *rotate_f32_simde() { return rotate_f32_simde_table(); }

const RotateF32 *rotate_f32_avx2() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return rotate_f32_avx2_table();
#endif
    return nullptr;
}

const RotateF32 *rotate_f32_best() {
#if !defined(KVP_NO_HEAP)
    if (const char *want = getenv("KVP_KERNEL")) {  // as vec_f32_best
        if (strcmp(want, "scalar") == 0) return rotate_f32_scalar();
        if (strcmp(want, "simde") == 0) return rotate_f32_simde();
    }
#endif
    const RotateF32 *a = rotate_f32_avx2();
    return a ? a : rotate_f32_simde();
}

const RotateF32 *rotate_f32_variant(uint32_t id) {
    if (id == 1) return rotate_f32_scalar();
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    if (id == 3) return rotate_f32_avx2_table();  // only ever the id of a checked CPU (rotate_f32_best_id)
#endif
    return rotate_f32_simde();
}

uint32_t rotate_f32_best_id() {
    const RotateF32 *b = rotate_f32_best();
    return b == rotate_f32_scalar() ? 1u : b == rotate_f32_simde() ? 2u : 3u;
}

}  // namespace kern
}  // namespace kvp
