// Attention kernel family, fp32 (XNNPACK-style: one folder per family, names say dtype/op/isa).
//
// Every op has one scalar reference (attn_f32_scalar.cpp) and SIMD variants built from one
// SIMDe source (attn_f32_simd.inc) compiled per ISA:
//   simde  - portable 256-bit SIMDe code at the baseline ISA (SSE2 on x86-64, NEON on aarch64,
//            plain C with SIMDE_NO_NATIVE)
//   avx2   - the same source compiled with -mavx2 -mfma (x86-64 only), chosen at run time
//   avx512 - the same source with -mavx512f -mavx512vl as well (x86-64 only), chosen at run
//            time: wider blocks, the same arithmetic in the same order, so the same bits as avx2
// Tests compare every variant with the scalar reference (tests/test_kernels.cpp).
//
// All kernels are pure functions of their inputs: no allocation, no globals, fixed
// summation order for a given variant (so results do not depend on thread count).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {
namespace kern {

// logits[r*ldl + t] = scale * dot(q[r*ldq + 0..d), k[t*ldk + 0..d))   for r < rows, t < n
typedef void (*f32_qk_fn)(const float *q, size_t ldq, uint32_t rows, const float *k, size_t ldk,
                          uint32_t n, uint32_t d, float scale, float *logits, size_t ldl);
// o[r*ldo + j] += sum_t p[r*ldp + t] * v[t*ldv + j]                     for r < rows, j < d
typedef void (*f32_pv_fn)(const float *p, size_t ldp, uint32_t rows, const float *v, size_t ldv,
                          uint32_t n, uint32_t d, float *o, size_t ldo);
// max of x[0..n); -INFINITY for n == 0
typedef float (*f32_max_fn)(const float *x, uint32_t n);
// x[i] = exp(x[i] - m) in place (exp(-inf) = 0), returns the sum of the new x[0..n). When
// sumsq is not NULL, *sumsq = the sum of the squares of the new x[0..n) (0 for n == 0), in
// the same pass: the SIMD variants in score_f32.h's sumsq order, so the same bits as
// ScoreF32::sumsq run afterwards over the new x (decode's Hoyer sparsity needs both, and a
// second pass over the row cost 1.8 % of a cache-resident decode step); the scalar reference
// as score_f32_scalar's sumsq does (in index order).
typedef float (*f32_expsum_fn)(float *x, uint32_t n, float m, float *sumsq);

// Split-K merge of one output row (attention.h): for j < d,
//   out[j] = ((w[0]*o[j] + w[ldw]*o[ldo + j]) + ... + w[(nch-1)*ldw]*o[(nch-1)*ldo + j]) * scale
// in chunk order, every product and sum rounded on its own (no FMA), so every variant, the
// scalar reference included, gives the same bits. nch >= 1.
typedef void (*f32_merge_fn)(const float *o, size_t ldo, const float *w, size_t ldw, uint32_t nch, float scale,
                             uint32_t d, float *out);

// Logit soft-capping (Gemma 2): x[i] = cap * tanh_approx(x[i] * (1 / cap)) for i < n, cap > 0
// (a multiply by the rounded reciprocal instead of a divide per logit: 20 % faster, one ulp).
// Every variant, the scalar reference included, runs the same float operations lane by lane
// (tanh_approx with mul/add/sub/div only, no FMA; the library is built with -ffp-contract=off),
// so every variant gives the same bits. Against cap * tanh(x / cap) in double: at most 4 ulp of
// the result, 3 measured (tests/test_kernels.cpp, "Softcap").
typedef void (*f32_softcap_fn)(float *x, uint32_t n, float cap);

struct AttnF32 {
    const char *name;  // "scalar", "simde", "avx2", "avx512"
    f32_qk_fn qk;
    f32_pv_fn pv;
    f32_max_fn max;
    f32_expsum_fn expsum;
    f32_merge_fn merge;
    f32_softcap_fn softcap;
};

// Variants. attn_f32_avx2() / attn_f32_avx512() are nullptr where not compiled in or not
// supported by the CPU (and its OS: libgcc's check includes the XSAVE state).
const AttnF32 *attn_f32_scalar();
const AttnF32 *attn_f32_simde();
const AttnF32 *attn_f32_avx2();
const AttnF32 *attn_f32_avx512();
// Best variant for this CPU (avx512, else avx2, else simde); the environment variable
// KVP_KERNEL=<name> overrides it with an available variant (hosted builds; for benchmarks and
// A/B runs). Call once at create.
const AttnF32 *attn_f32_best();

// Internal: the tables defined by attn_f32_simd.inc, one per ISA it is compiled for. They do
// no CPU check; use attn_f32_simde()/attn_f32_avx2()/attn_f32_avx512() instead. The avx2 one
// exists only when the library is built with KVP_HAVE_AVX2, the avx512 one with KVP_HAVE_AVX512.
const AttnF32 *attn_f32_simde_table();
const AttnF32 *attn_f32_avx2_table();
const AttnF32 *attn_f32_avx512_table();

// Scalar exp used by the scalar reference (the same polynomial as the SIMD variants so that
// they agree to a few ulp). exp_approx(-inf) == 0.
float exp_approx(float x);
// tanh for the soft-cap (attn_f32_scalar.cpp): |x| < 0.625 an odd polynomial, else
// sign(x) * (1 - 2 / (exp_approx(2|x|) + 1)); mul/add/sub/div only, so the SIMD variants give
// the same bits. Within 2 ulp of tanh (1 measured); |x| >= 9.1 gives +-1; NaN gives an unspecified value.
float tanh_approx(float x);

}  // namespace kern
}  // namespace kvp
