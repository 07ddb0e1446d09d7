// Fixed-point scoring (score=fixed): integer attention weights from integer inputs, so that
// eviction decisions are bit-identical on every platform (DESIGN.md "Precision ... Scoring").
//
// Why not quantize the float weights: the float attention (SIMD kernels, FMA where the ISA has
// it, different reduction trees) does not give the same bits on every ISA, and a weight one ULP
// either side of a rounding boundary quantizes differently. So the fixed path never reads a float
// result of the kernels. Its inputs are the caller's own float q and k rows (the same bits on
// every platform), quantized by exact operations; everything after that is integer arithmetic.
//
// Format, per KV head (all integer; "Qn" = n fraction bits):
//   inputs    a pre-RoPE row x[0..hd) becomes int16 v_i = round(x_i * 2^-e) with one exponent e
//             per row chosen so that max|v_i| <= 2^14 (e = E - 14 where max|x| < 2^E; a power-of-two
//             scaling, which is exact, then floor(v + 0.5) in double: the same bits everywhere).
//             Rows whose max |x| is below 2^-100 quantize to 0 (e = 0).
//   RoPE      integer rotation of each pair by a Q14 cos/sin table: r_a = (v_a c - v_b s + 2^13) >> 14
//             (floor), |r| <= 23170 (int16). The table is computed by the deterministic double
//             routines below (only +, -, *, /, floor, frexp/ldexp: correctly rounded on every
//             IEEE-754 platform; the library is built with -ffp-contract=off), never by libm.
//             Keys are rotated at their stored position (`rot`), queries per run of equal delta
//             (realign), exactly like the float path.
//   logits    d = sum_i q_i k_i (int64), y = d * K * 2^(e_q + e_k - 4) in Q16 log2 units, with
//             K = round(2^20 * log2(e) / sqrt(head_dim)); the shift floors; |y| saturates at 2^61.
//   weights   per query head: e_j = 2^-(max - y_j) in Q30 from two 256-entry tables (2^(-i/256)
//             and 2^(-i/65536), Q30, literal constants), 0 when the gap is >= 31; Z = sum e_j;
//             w_j = floor(e_j * 2^16 / Z) in Q16 (1.0 = 65536).
//   scores    unsigned Q16.16 in the slot's 32 bits: a token's step mass is the sum of w_j over
//             the GQA group's query heads; scores add with saturation at 0xFFFFFFFF (65535.99998).
//             Lethe's decay multiplies by round(decay * 2^16) and floors (>> 16).
// Ties between equal scores are broken by position (the older token is evicted first), as in
// float mode, so the decisions depend on integers only.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvprune/kvprune.h"

namespace kvp {
namespace fixed {

constexpr int kInBits = 14;   // |quantized input| <= 2^14
constexpr int kTrigQ = 14;    // cos/sin Q14
constexpr int kWeightQ = 16;  // weights and scores Q16
constexpr int64_t kLogitMax = int64_t(1) << 61;

// Deterministic scalar math in double (see above). det_log2: x > 0. det_sincos: any finite a.
double det_log2(double x);
double det_exp2(double x);
void det_sincos(double a, double *s, double *c);

// Rotation frequencies theta^(-2i/rope_dim) for i < pairs, computed with det_* (bit-identical
// everywhere; the float path's libm table may differ in the last bit).
void rope_freqs(float theta, uint32_t pairs, double *inv_freq);
// cs[2i] = round(cos(pos * f_i) * 2^14), cs[2i+1] = round(sin(pos * f_i) * 2^14).
void rope_table(const double *inv_freq, uint32_t pairs, int64_t pos, int16_t *cs);

// Quantizes x[0..hd) (see above); returns the exponent e (x ~= out * 2^e).
int32_t quantize_row(const float *x, uint32_t hd, int16_t *out);
// Rotates in[0..hd) into out with table cs (style NONE or pairs 0: a copy).
void rotate(kvp_rope_style style, uint32_t pairs, const int16_t *cs, const int16_t *in, int16_t *out, uint32_t hd);
inline int64_t dot(const int16_t *a, const int16_t *b, uint32_t hd) {
    int64_t d = 0;
    for (uint32_t i = 0; i < hd; ++i) d += int32_t(a[i]) * int32_t(b[i]);
    return d;
}
// K = round(2^20 * log2(e) / sqrt(hd)).
int64_t logit_scale(uint32_t hd);
// The same for a given logit scale s in (0, 1] (attn_scale): round(2^20 * log2(e) * s) < 2^21.
int64_t logit_scale_of(float s);
// floor(x / 2^k) for k in [0, 62], without the implementation-defined shift of negative values.
inline int64_t floor_shr(int64_t x, int k) { return x >= 0 ? x >> k : ~((~x) >> k); }
// y = d * K * 2^(e - 4), floored, saturated to +-kLogitMax (e = e_q + e_k).
inline int64_t logit(int64_t d, int64_t K, int32_t e) {
    const int64_t p = d * K;  // |d| < 2^40, K < 2^21
    const int32_t sh = e - 4;
    int64_t y;
    if (sh >= 0) {
        if (sh >= 62 || p > (kLogitMax >> sh) || p < -(kLogitMax >> sh)) y = p > 0 ? kLogitMax : p < 0 ? -kLogitMax : 0;
        else y = p * (int64_t(1) << sh);
    } else {
        y = -sh >= 63 ? (p >= 0 ? 0 : -1) : floor_shr(p, -sh);
    }
    return y > kLogitMax ? kLogitMax : y < -kLogitMax ? -kLogitMax : y;
}
extern const uint32_t kExpHi[256];  // round(2^(-i/256) * 2^30)
extern const uint32_t kExpLo[256];  // round(2^(-i/65536) * 2^30)
// 2^(-g / 2^16) in Q30 for a gap g >= 0 (0 when g >= 31 * 2^16).
inline uint32_t exp2_neg(int64_t g) {
    const int64_t n = g >> 16;  // g >= 0
    if (n >= 31) return 0;
    const uint32_t f = uint32_t(g & 0xffff);
    const uint64_t v = (uint64_t(kExpHi[f >> 8]) * kExpLo[f & 0xff] + (uint64_t(1) << 29)) >> 30;
    return uint32_t(v >> n);
}
// Softmax in place: y[0..n) (Q16 log2 logits) becomes e_j (Q30, as int64); returns Z = sum e_j (> 0).
uint64_t softmax_exps(int64_t *y, uint32_t n);
// floor(e * 2^16 / Z)
inline uint32_t weight(uint64_t e, uint64_t Z) { return uint32_t((e << kWeightQ) / Z); }
// The same with a precomputed inv = 1.0 / Z (e <= Z < 2^53): the double estimate of the quotient
// (<= 2^16) is within 2^-36 of it, so off by at most one, and is corrected in integers: exactly
// weight(e, Z), on every platform, without a 64-bit division per token.
inline uint32_t weight_r(uint64_t e, uint64_t Z, double inv) {
    const uint64_t n = e << kWeightQ;
    uint64_t q = uint64_t(double(n) * inv);
    if (q * Z > n) --q;
    else if ((q + 1) * Z <= n) ++q;
    return uint32_t(q);
}
inline uint32_t sat_add(uint32_t a, uint64_t b) {
    const uint64_t s = uint64_t(a) + b;
    return s > 0xffffffffu ? 0xffffffffu : uint32_t(s);
}
// round(decay * 2^16) for decay in [0, 1].
uint32_t decay_q16(float decay);
inline uint32_t decay_apply(uint32_t s, uint32_t dq) { return uint32_t((uint64_t(s) * dq) >> 16); }


}  // namespace fixed
}  // namespace kvp
