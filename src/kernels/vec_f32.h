// Row-wise fp32 vector ops of the core that are not attention: RoPE rotation of query and key
// rows, and the input range scan (NaN, Inf, |x| >= 2^56) (capi/ check_tokens). Same scheme as attn_f32.h: a
// scalar reference (vec_f32_scalar.cpp) and SIMD variants from one SIMDe source
// (vec_f32_simd.inc: simde at the baseline ISA, avx2 chosen at run time); tests/test_kernels.cpp
// compares every variant with the reference, bit for bit.
//
// Arithmetic (identical in every variant, so RoPE gives the same bits on every ISA and path):
//   rope  for each pair (a, b) with table entries c = cs[2i], s = cs[2i+1]:
//           x[a] = x[a]*c - x[b]*s;   x[b] = x[a]*s + x[b]*c   (old x[a]; products rounded, no FMA)
//         NEOX pairs (i, i + pairs), GPTJ pairs (2i, 2i + 1), i < pairs (rope.h).
//   first_out_of_range  exact: the index of the first element whose magnitude bits (bits & 0x7fffffff)
//         are >= kOutOfRangeBits: NaN, +-Inf and |x| >= 2^56 (KVP_INPUT_LIMIT, capi/).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {
namespace kern {

// Rotates rows x[j*ld + ...] (j < n) in place with the table cs[2*pairs] (rope.h rope_table).
typedef void (*f32_rope_fn)(const float *cs, float *x, uint32_t n, size_t ld, uint32_t pairs);
// Float bits (sign cleared) of 2^56: magnitudes from here on, Inf and NaN are out of range.
constexpr uint32_t kOutOfRangeBits = (127u + 56u) << 23;
// Index of the first NaN, +-Inf or |x| >= 2^56 in x[0..n), or n when there is none.
typedef size_t (*f32_first_out_of_range_fn)(const float *x, size_t n);

struct VecF32 {
    const char *name;  // "scalar", "simde", "avx2"
    f32_rope_fn rope_neox;
    f32_rope_fn rope_gptj;
    f32_first_out_of_range_fn first_out_of_range;
};

const VecF32 *vec_f32_scalar();
const VecF32 *vec_f32_simde();
const VecF32 *vec_f32_avx2();  // nullptr where not compiled in or not supported
// avx2, else simde; KVP_KERNEL=scalar|simde|avx2|avx512 as for attn_f32_best (avx512 means
// avx2 here: these ops are load/store bound). Call once at create.
const VecF32 *vec_f32_best();

// Internal tables of vec_f32_simd.inc (no CPU check; use the functions above).
const VecF32 *vec_f32_simde_table();
const VecF32 *vec_f32_avx2_table();

}  // namespace kern
}  // namespace kvp
