// Attention kernel family over stored (f16 / q8 / q4) rows: the dot products and the value
// accumulation run on the stored data directly (codes are widened to floats in registers, never
// written back as a dequantized cache). Formats: src/quant/format.h.
//
// Like attn_f32.h: one scalar reference (attn_q_scalar.cpp) and SIMD variants from one SIMDe
// source (attn_q_simd.inc) compiled per ISA (simde at the baseline ISA, avx2 = -mavx2 -mfma
// -mf16c and avx512 = that plus AVX-512 VL/BW/VNNI, chosen at run time). tests/test_quant_kernels.cpp compares every variant with the
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
//   q4    keys: integer dot products. prep4 quantizes the scaled query row to int8 with one step
//         qsc = max|qs| / 127 per row (qi = floor(qs * (127 / max) + 1/2), the same float ops
//         in every variant), the kernel sums qi * code exactly in int32 and returns
//         (qsc * sum + bias) * scale: bit-identical across variants. qi is stored in code order
//         (per 32 channels: 0-7, 16-23, 8-15, 24-31; a trailing 16: natural order).
//   q8    keys: integer dot products as q4. prep8 is prep4 with qi in natural channel order (a q8
//         byte is one channel); the kernel sums qi * code (u8 code x s8 query) exactly in int32:
//         AVX-512 VNNI dpbusd over 32 channels, AVX2 / SIMDe: both widened to int16 and madd
//         (maddubs would saturate: 2 * 255 * 127 > 32767), scalar: plain loop. Any order is exact
//         (|sum| <= 255 * 127 * w < 2^31 for w <= 1024), so logits are bit-identical across
//         variants, thread counts and call splits. Query rounding: |qsc * qi_c - qs_c| <= qsc / 2,
//         so a logit differs from the float-query value by at most scale * qsc / 2 * sum_c code_tc
//         (<= scale * max|qs| * 255 * w / 254) plus float rounding; the bias (zero points) is not
//         rounded.
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
// q8 / q4 keys: logits[r*ldl + t] = scale * (qsc[r] * sum_c qi[r*ldq + c] * code_tc + bias[r])
// (q4: w a multiple of 16, qi in code order, from prep4; q8: w a multiple of 8, qi in channel
// order, from prep8).
typedef void (*q4_qk_fn)(const int8_t *qi, size_t ldq, uint32_t rows, const float *qsc, const float *bias,
                         const uint8_t *k, size_t ldk, uint32_t n, uint32_t w, float scale, float *logits, size_t ldl);
// prep, then the int8 query qi[r*ldi + ...] and its step qsc[r] for qk_q4 (prep4: code order)
// or qk_q8 (prep8: channel order); qs is scratch of rows x lds floats.
typedef void (*q_prep4_fn)(const float *q, size_t ldq, uint32_t rows, const int8_t *ge, const int16_t *gz, uint32_t w,
                           float *qs, size_t lds, int8_t *qi, size_t ldi, float *qsc, float *bias);

struct AttnQ {
    const char *name;  // "scalar", "simde", "avx2"
    q_qk_fn qk_f16;
    q4_qk_fn qk_q8, qk_q4;  // q8 / q4: integer dot products
    q_pv_fn pv_f16, pv_q8, pv_q4;
    q_prep_fn prep;
    q_prep4_fn prep4;
    q_prep4_fn prep8;
};

// Channel of code-order position p of a q4 row of width w (a multiple of 16).
inline uint32_t q4_code_channel(uint32_t p, uint32_t w) {
    const uint32_t b = p / 32 * 32, i = p % 32;
    if (b + 32 > w) return p;  // a trailing 16-channel chunk
    const uint32_t g = i / 8;
    return b + (g == 1 ? 16 : g == 2 ? 8 : 8 * g) + i % 8;
}

const AttnQ *attn_q_scalar();
const AttnQ *attn_q_simde();
const AttnQ *attn_q_avx2();    // nullptr where not compiled in or the CPU lacks AVX2/FMA/F16C
const AttnQ *attn_q_avx512();  // the same source with AVX-512 VL/BW/VNNI (32 registers, dpbusd); same bits
const AttnQ *attn_q_avx512z(); // avx512 with 512-bit value passes (pv: 64 channels per pass); same bits
// avx512, else avx2, else simde. avx512z is not the default anywhere yet: its 512-bit value
// pass measured slower on Zen 4 (two 256-bit halves per operation, DECISIONS "The pv pass is at
// the FMA floor") and has not been timed on a core with full-width units (DECISIONS "512-bit
// value passes: avx512z"). Every choice gives the same bits. KVP_KERNEL_Q=scalar|simde|avx2|
// avx512|avx512z overrides it where that variant runs on this CPU (benchmarks, A/B runs; an
// unknown or unavailable name is ignored).
const AttnQ *attn_q_best();

// Internal tables of attn_q_simd.inc (no CPU check; use the functions above).
const AttnQ *attn_q_simde_table();
const AttnQ *attn_q_avx2_table();
const AttnQ *attn_q_avx512_table();
const AttnQ *attn_q_avx512z_table();

}  // namespace kern
}  // namespace kvp
