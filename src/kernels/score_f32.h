// Scoring kernel family, fp32: the arithmetic the scored policies run over attention weights
// that are already in scratch (never over K or V), so decode scoring is fused into the
// attention pass without a second read of K (DESIGN.md "Scoring is fused").
//
// As for attn_f32.h: one scalar reference (score_f32_scalar.cpp) and SIMD variants from one
// SIMDe source (score_f32_simd.inc) compiled per ISA (simde baseline, avx2 chosen at run time).
// tests/test_kernels.cpp compares every variant with the reference.
//
// Summation order (fixed, so results are deterministic and independent of how a call is
// batched into runs):
//   acc    per t: a = w[0]*p[0][t]; a = a + w[r]*p[r][t] for r = 1..rows-1 (FMA in SIMD
//          variants); then s[t] = s[t] + a. Each t is independent of every other t.
//   sumsq  8-lane accumulator over chunks of 8 (tail zero-padded), tree-reduced
//          ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)), like attn expsum. Decode takes it fused
//          into the attention kernels' expsum pass (attn_f32.h), which must give these bits:
//          this one is the order that pass is tested against (tests/test_kernels.cpp).
//   argmin exact (min is order-independent): the first index holding the minimum, so every
//          variant returns the same index (ties: the lowest index, i.e. the older token).
//   dots16 integer (score=fixed, kernels/score_fixed.h): exact int64 sums of int16 products, so
//          every variant gives the same integers (SIMD: 16-bit pair products summed in 32 bits,
//          which holds for |x| <= 23170 as score_fixed's rows are, then widened to 64).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {
namespace kern {

// s[t] += sum_{r < rows} w[r] * p[r*ldp + t]   for t < n   (rows >= 1)
typedef void (*f32_score_acc_fn)(const float *p, size_t ldp, uint32_t rows, const float *w, uint32_t n,
                                 float *s);
// sum of x[i]^2 for i < n (0 for n == 0)
typedef float (*f32_sumsq_fn)(const float *x, uint32_t n);
// first index of the minimum of x[0..n) (n >= 1; x finite)
typedef uint32_t (*f32_argmin_fn)(const float *x, uint32_t n);
// out[r * ldo] = sum_{i < n} q[r*ldq + i] * k[i]   for r < rows   (|q|, |k| <= 23170)
typedef void (*i16_dots_fn)(const int16_t *q, size_t ldq, uint32_t rows, const int16_t *k, uint32_t n, int64_t *out,
                            size_t ldo);

struct ScoreF32 {
    const char *name;
    f32_score_acc_fn acc;
    f32_sumsq_fn sumsq;
    f32_argmin_fn argmin;
    i16_dots_fn dots16;
};

const ScoreF32 *score_f32_scalar();
const ScoreF32 *score_f32_simde();
const ScoreF32 *score_f32_avx2();  // nullptr where not compiled in or not supported
const ScoreF32 *score_f32_best();

// Internal tables of score_f32_simd.inc (no CPU check; use the functions above).
const ScoreF32 *score_f32_simde_table();
const ScoreF32 *score_f32_avx2_table();

}  // namespace kern
}  // namespace kvp
