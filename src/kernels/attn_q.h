// Attention kernel family over stored (f16 / q8 / q4) rows: the dot products and the value
// accumulation run on the stored data directly (codes are widened to floats in registers, never
// written back as a dequantized cache). Formats: src/quant/format.h.
//
// Like attn_f32.h: one scalar reference (attn_q_scalar.cpp) and SIMD variants from one SIMDe
// source (attn_q_simd.inc) compiled per ISA (simde at the baseline ISA, avx2 = -mavx2 -mfma
// -mf16c chosen at run time). tests/test_quant_kernels.cpp compares every variant with the
// reference and the reference with double precision.
//
// Widths w are padded row widths: a multiple of 8 channels (16 for q4). Query padding lanes
// are 0, so padded key channels contribute nothing; padded value channels are computed and
// ignored by the caller.
//
// Summation order (fixed per variant, so results are deterministic and independent of thread
// count and of how a run is split into calls):
//   qk    per logit: 8-lane accumulator over 8-channel chunks (FMA in SIMD variants), reduced
//         ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)); plus bias; times scale. Scalar: sequential.
//   pv    o[c] += (p_t * s_tg) * code_tc in t order; the zero terms p_t * z_tg are added to
//         zacc[g] in t order (the caller adds zacc to its group's channels once, after all
//         calls, so results do not depend on how a range is split into calls).
//   prep  qs[c] = q[c] * 2^e[c] (exact), bias = sum_c q[c] * (zi[c] * 2^e[c]) (8-lane, tree).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {
namespace kern {

// logits[r*ldl + t] = scale * (dot(qs[r*ldq + 0..w), K_t) + (bias ? bias[r] : 0)),  r < rows, t < n.
// K_t is row t of k (ldk bytes apart): f16 values, or codes (q8: one byte per channel; q4:
// nibbles, format.h layout). For q formats qs holds the query pre-scaled by the block's steps.
typedef void (*q_qk_fn)(const float *qs, size_t ldq, uint32_t rows, const float *bias, const uint8_t *k, size_t ldk,
                        uint32_t n, uint32_t w, float scale, float *logits, size_t ldl);
// f16:   o[r*ldo + c] += sum_t p[r*ldp + t] * V_tc,  r < rows, c < w.
// q8/q4: V_tc = s_tg * code_tc + z_tg with g = c / 32 and token t's pairs at sz + t*ldsz (G f16
//        scales then G f16 zeros, G = ceil(w/32)): o[r*ldo + c] += sum_t (p_rt * s_tg) * code_tc
//        and zacc[r*ldz + g] += sum_t p_rt * z_tg. sz and zacc are unused for f16.
typedef void (*q_pv_fn)(const float *p, size_t ldp, uint32_t rows, const uint8_t *v, size_t ldv, const uint16_t *sz,
                        size_t ldsz, uint32_t n, uint32_t w, float *o, size_t ldo, float *zacc, size_t ldz);
// Dyadic key grid of a block -> per row qs[r*lds + c] = q[r*ldq + c] * 2^ge[c] and
// bias[r] = sum_c q[r*ldq + c] * gz[c] * 2^ge[c], c < w.
typedef void (*q_prep_fn)(const float *q, size_t ldq, uint32_t rows, const int8_t *ge, const int16_t *gz, uint32_t w,
                          float *qs, size_t lds, float *bias);

struct AttnQ {
    const char *name;  // "scalar", "simde", "avx2"
    q_qk_fn qk_f16, qk_q8, qk_q4;
    q_pv_fn pv_f16, pv_q8, pv_q4;
    q_prep_fn prep;
};

const AttnQ *attn_q_scalar();
const AttnQ *attn_q_simde();
const AttnQ *attn_q_avx2();  // nullptr where not compiled in or the CPU lacks AVX2/FMA/F16C
const AttnQ *attn_q_best();

// Internal tables of attn_q_simd.inc (no CPU check; use the functions above).
const AttnQ *attn_q_simde_table();
const AttnQ *attn_q_avx2_table();

}  // namespace kern
}  // namespace kvp
