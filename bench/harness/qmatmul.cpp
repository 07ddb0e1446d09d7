#include "qmatmul.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define KVH_Q8_AVX2 1
#endif
#include <thread>
#include <vector>

#include "gguf.h"

namespace kvh {

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVH_CLONES
#endif

constexpr int kRowBlock = 16;

// f16 -> f32 for every bit pattern (256 KiB, built once): the per-block scale without a call.
const float *f16_table() {
    static const std::vector<float> t = [] {
        std::vector<float> v(65536);
        for (uint32_t h = 0; h < 65536; h++) v[h] = fp16_to_f32((uint16_t)h);
        return v;
    }();
    return t.data();
}

KVH_CLONES void rows_kernel(float *out, const float *x, const QView &W, int n, int in_dim, int out_dim, int o0, int o1,
                            float *buf) {
    const float *f16 = f16_table();
    for (int ob = o0; ob < o1; ob += kRowBlock) {
        const int m = std::min(kRowBlock, o1 - ob);
        for (int r = 0; r < m; r++) {
            const uint8_t *src = W.data + (uint64_t)(ob + r) * W.row_bytes;
            float *dst = buf + (size_t)r * in_dim;
            if (W.type == GGML_Q8_0) {
                for (int b = 0; b < in_dim / 32; b++) {
                    const uint8_t *p = src + 34 * b;
                    const float d = f16[p[0] | (p[1] << 8)];
                    const int8_t *q = reinterpret_cast<const int8_t *>(p + 2);
                    for (int i = 0; i < 32; i++) dst[32 * b + i] = d * (float)q[i];
                }
            } else {
                dequantize(W.type, src, dst, (uint64_t)in_dim);
            }
        }
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            const float *x0 = x + (size_t)t * in_dim, *x1 = x0 + in_dim, *x2 = x1 + in_dim, *x3 = x2 + in_dim;
            for (int r = 0; r < m; r++) {
                const float *w = buf + (size_t)r * in_dim;
                float s0[8] = {0}, s1[8] = {0}, s2[8] = {0}, s3[8] = {0};
                int i = 0;
                for (; i + 8 <= in_dim; i += 8)
                    for (int j = 0; j < 8; j++) {
                        s0[j] += w[i + j] * x0[i + j];
                        s1[j] += w[i + j] * x1[i + j];
                        s2[j] += w[i + j] * x2[i + j];
                        s3[j] += w[i + j] * x3[i + j];
                    }
                float *s[4] = {s0, s1, s2, s3};
                const float *xs[4] = {x0, x1, x2, x3};
                for (int k = 0; k < 4; k++) {
                    const float *a = s[k];
                    float v = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
                    for (int ii = i; ii < in_dim; ii++) v += w[ii] * xs[k][ii];
                    out[(size_t)(t + k) * out_dim + ob + r] = v;
                }
            }
        }
        for (; t < n; t++) {
            const float *xt = x + (size_t)t * in_dim;
            for (int r = 0; r < m; r++) {
                const float *w = buf + (size_t)r * in_dim;
                float s[8] = {0};
                int i = 0;
                for (; i + 8 <= in_dim; i += 8)
                    for (int j = 0; j < 8; j++) s[j] += w[i + j] * xt[i + j];
                float v = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
                for (; i < in_dim; i++) v += w[i] * xt[i];
                out[(size_t)t * out_dim + ob + r] = v;
            }
        }
    }
}

#ifdef KVH_Q8_AVX2
__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);                 // (0+4, 1+5, 2+6, 3+7)
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));        // (0+4+2+6, 1+5+3+7)
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// q8_0 / q4_0 / q5_0 rows against f32 x rows, AVX2 + FMA: per block the 32 int8 weights become 4 vectors, each
// x row takes s = w0 x0 + w1 x1 + w2 x2 + w3 x3 (one mul, three fma) and acc += d s; the same
// operations in the same order for a row whether it is in a tile of 4 or alone, so prefill and
// decode give the same bits for the same inputs.
// 16 at 16 * (bit i of the little-endian u16 at p) in byte i: spread the two bytes over 8 lanes
// each, keep one bit per lane, compare, turn the hits into 16.
__attribute__((target("avx2,fma,f16c"))) inline __m128i fifth_bits16(const uint8_t *p) {
    const __m128i sel = _mm_set_epi8((char)0x80, 0x40, 0x20, 0x10, 8, 4, 2, 1, (char)0x80, 0x40, 0x20, 0x10, 8, 4, 2, 1);
    const __m128i spread = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i b = _mm_shuffle_epi8(_mm_set1_epi16((short)(p[0] | (p[1] << 8))), spread);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, sel), sel), _mm_set1_epi8(16));
}

// The 32 weights of a q8_0 (34-byte), q4_0 (18-byte) or q5_0 (22-byte) block as 4 vectors of 8, unscaled.
template <int K>  // 0: q8_0, 1: q4_0, 2: q5_0
__attribute__((target("avx2,fma,f16c"))) inline void block_w(const uint8_t *p, __m256 *w0, __m256 *w1, __m256 *w2, __m256 *w3) {
    if (K == 2) {  // q4_0's nibbles at p + 6 with bit i of the u32 at p + 2 as bit 4 of element i; value q - 16
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 6));
        const __m128i m = _mm_set1_epi8(15), sixteen = _mm_set1_epi8(16);
        const __m128i lo = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(raw, m), fifth_bits16(p + 2)), sixteen);
        const __m128i hi = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(raw, 4), m), fifth_bits16(p + 4)), sixteen);
        *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
        *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
        *w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
        *w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    } else if (K == 1) {  // elements 0..15: low nibbles of bytes 0..15; 16..31: high nibbles; value q - 8
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 2));
        const __m128i m = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), eight);
        *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
        *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
        *w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
        *w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    } else {
        const __m128i q16a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 2));
        const __m128i q16b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 18));
        *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16a));
        *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16a, 8)));
        *w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16b));
        *w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16b, 8)));
    }
}

template <int K>
__attribute__((target("avx2,fma,f16c"))) void q8_rows_avx2(float *out, const float *x, const QView &W, int n, int in_dim,
                                                      int out_dim, int o0, int o1) {
    const float *f16 = f16_table();
    const int nb = in_dim / 32;
    const int bb = K == 2 ? 22 : K == 1 ? 18 : 34;
    constexpr int kT = 64;  // x rows per pass (they stay in L2 while the weight rows stream)
    for (int tc = 0; tc < n; tc += kT) {
        const int te = std::min(n, tc + kT);
        for (int o = o0; o < o1; o++) {
            const uint8_t *row = W.data + (uint64_t)o * W.row_bytes;
            int t = tc;
            for (; t + 4 <= te; t += 4) {
                __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
                const float *x0 = x + (size_t)t * in_dim, *x1 = x0 + in_dim, *x2 = x1 + in_dim, *x3 = x2 + in_dim;
                for (int b = 0; b < nb; b++) {
                    const uint8_t *p = row + bb * b;
                    const __m256 d = _mm256_set1_ps(f16[p[0] | (p[1] << 8)]);
                    __m256 w0, w1, w2, w3;
                    block_w<K>(p, &w0, &w1, &w2, &w3);
                    const int k = 32 * b;
#define KVH_ROW(xr, acc)                                                              \
    {                                                                                 \
        __m256 s = _mm256_mul_ps(w0, _mm256_loadu_ps(xr + k));                        \
        s = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + k + 8), s);                      \
        s = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + k + 16), s);                     \
        s = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + k + 24), s);                     \
        acc = _mm256_fmadd_ps(d, s, acc);                                             \
    }
                    KVH_ROW(x0, acc0)
                    KVH_ROW(x1, acc1)
                    KVH_ROW(x2, acc2)
                    KVH_ROW(x3, acc3)
                }
                out[(size_t)t * out_dim + o] = hsum8(acc0);
                out[(size_t)(t + 1) * out_dim + o] = hsum8(acc1);
                out[(size_t)(t + 2) * out_dim + o] = hsum8(acc2);
                out[(size_t)(t + 3) * out_dim + o] = hsum8(acc3);
            }
            for (; t < te; t++) {
                __m256 acc0 = _mm256_setzero_ps();
                const float *x0 = x + (size_t)t * in_dim;
                for (int b = 0; b < nb; b++) {
                    const uint8_t *p = row + bb * b;
                    const __m256 d = _mm256_set1_ps(f16[p[0] | (p[1] << 8)]);
                    __m256 w0, w1, w2, w3;
                    block_w<K>(p, &w0, &w1, &w2, &w3);
                    const int k = 32 * b;
                    KVH_ROW(x0, acc0)
                }
                out[(size_t)t * out_dim + o] = hsum8(acc0);
            }
        }
    }
}
#undef KVH_ROW

// q4_K / q5_K / q6_K / q4_1 / q5_0 / q5_1 / q8_1 / f16 / bf16 (and q2_K / q3_K / iq4_nl / iq4_xs, issue 29,
// whose weights equal dequantize()'s bit for bit) rows, AVX2 + FMA: each 32-element
// sub-block is decoded into 4 vectors of its dequantized weights (d sc q - dmin m for q4_K / q5_K and
// d q + m for q4_1 / q5_1 as one fma, so within an ulp of dequantize(); d sc (q - 32) for q6_K,
// d (q - 16) for q5_0), then acc += w . x with one fma per vector, in the same order for every row.
template <uint32_t T>
__attribute__((target("avx2,fma,f16c"))) inline void kblock_w(const uint8_t *row, int j, const float *f16, __m256 *w) {
    if (T == GGML_F16) {  // 32 halves: exact conversions
        const uint8_t *p = row + 64 * (size_t)j;
        for (int k = 0; k < 4; k++) w[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 16 * k)));
        return;
    }
    if (T == GGML_BF16) {  // the high half of an f32
        const uint8_t *p = row + 64 * (size_t)j;
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 16 * k))), 16));
        return;
    }
    if (T == GGML_Q8_1) {  // d at 0, 32 x i8 at 4
        const uint8_t *p = row + 36 * (size_t)j;
        const __m256 d = _mm256_set1_ps(f16[p[0] | (p[1] << 8)]);
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p + 4 + 8 * k)))));
        return;
    }
    if (T == GGML_Q4_1 || T == GGML_Q5_0 || T == GGML_Q5_1) {
        // 16 bytes of nibbles: elements 0..15 the low nibbles, 16..31 the high ones; q5 adds bit i of
        // the u32 before them as bit 4 of element i. q4_1 / q5_1: d q + m (one fma); q5_0: d (q - 16).
        const size_t bb = T == GGML_Q4_1 ? 20 : T == GGML_Q5_0 ? 22 : 24;
        const uint8_t *p = row + bb * (size_t)j;
        const uint8_t *qs = p + (T == GGML_Q4_1 ? 4 : T == GGML_Q5_0 ? 6 : 8);
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
        const __m128i m15 = _mm_set1_epi8(15);
        __m128i lo = _mm_and_si128(raw, m15), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m15);
        if (T != GGML_Q4_1) {
            const uint8_t *hb = p + (T == GGML_Q5_0 ? 2 : 4);
            const __m128i sixteen = _mm_set1_epi8(16);
            lo = _mm_or_si128(lo, fifth_bits16(hb));
            hi = _mm_or_si128(hi, fifth_bits16(hb + 2));
            if (T == GGML_Q5_0) {
                lo = _mm_sub_epi8(lo, sixteen);
                hi = _mm_sub_epi8(hi, sixteen);
            }
        }
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        const __m256 d = _mm256_set1_ps(f16[p[0] | (p[1] << 8)]);
        if (T == GGML_Q5_0) {
            for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
        } else {
            const __m256 m = _mm256_set1_ps(f16[p[2] | (p[3] << 8)]);
            for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), m);
        }
        return;
    }
    if (T == GGML_IQ4_NL) {  // f16 d, 16 bytes of indices (q4_0's order): d grid[index], the grid by a byte shuffle
        const uint8_t *p = row + 18 * (size_t)j;
        const __m128i grid = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4Values));
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 2)), m15 = _mm_set1_epi8(15);
        const __m128i lo = _mm_shuffle_epi8(grid, _mm_and_si128(raw, m15));
        const __m128i hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(raw, 4), m15));
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        const __m256 d = _mm256_set1_ps(f16[p[0] | (p[1] << 8)]);
        for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
        return;
    }
    if (T == GGML_IQ4_XS) {  // sub-block s of a 136-byte super-block: d (scale - 32) grid[index]
        const uint8_t *blk = row + 136 * (size_t)(j / 8);
        const int s = j % 8;
        const int sh = blk[2] | (blk[3] << 8);
        const int sc = ((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4;
        const __m256 ds = _mm256_set1_ps(f16[blk[0] | (blk[1] << 8)] * (float)(sc - 32));
        const __m128i grid = _mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4Values));
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 8 + 16 * s)), m15 = _mm_set1_epi8(15);
        const __m128i lo = _mm_shuffle_epi8(grid, _mm_and_si128(raw, m15));
        const __m128i hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(raw, 4), m15));
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
        return;
    }
    if (T == GGML_Q2_K || T == GGML_Q3_K) {
        // 32 elements = two 16-element scale groups (2 s, 2 s + 1) of super-block j / 8: their 2-bit
        // quants are the 32 bytes at 32 (s / 4) of the quant bytes, bits 2 (s % 4); q3_K's high bits
        // are bit s of the 32 hmask bytes (clear: q - 4). q2_K: d sc q - dmin m; q3_K: d (sc - 32) q,
        // each as dequantize() computes it (a product and a difference, no fma).
        const int s = j % 8;
        const uint8_t *blk = row + (size_t)(T == GGML_Q2_K ? 84 : 110) * (j / 8);
        const uint8_t *qs = blk + (T == GGML_Q2_K ? 16 : 32) + 32 * (s / 4);
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs));
        __m256i q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * (s % 4))), _mm256_set1_epi8(3));
        float ds[2], ms[2] = {0, 0};
        if (T == GGML_Q2_K) {
            const float d = f16[blk[80] | (blk[81] << 8)], dmin = f16[blk[82] | (blk[83] << 8)];
            for (int h = 0; h < 2; h++) {
                ds[h] = d * (float)(blk[2 * s + h] & 15);
                ms[h] = dmin * (float)(blk[2 * s + h] >> 4);
            }
        } else {
            const float d = f16[blk[108] | (blk[109] << 8)];
            for (int h = 0; h < 2; h++) ds[h] = d * (float)(q3k_scale(2 * s + h, blk + 96) - 32);
            const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk));
            const __m256i bit = _mm256_set1_epi8((char)(1 << s));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            q = _mm256_sub_epi8(q, _mm256_andnot_si256(set, _mm256_set1_epi8(4)));
        }
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++) {
            const __m256 v = _mm256_mul_ps(_mm256_set1_ps(ds[k / 2]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
            w[k] = T == GGML_Q2_K ? _mm256_sub_ps(v, _mm256_set1_ps(ms[k / 2])) : v;
        }
        return;
    }
    const uint8_t *blk = row + (size_t)(T == GGML_Q4_K ? 144 : T == GGML_Q5_K ? 176 : 210) * (j / 8);
    const int s = j % 8;
    if (T == GGML_Q4_K || T == GGML_Q5_K) {
        const float d = f16[blk[0] | (blk[1] << 8)], dmin = f16[blk[2] | (blk[3] << 8)];
        const uint8_t *sc = blk + 4;
        int scv, mn;
        if (s < 4) {
            scv = sc[s] & 63;
            mn = sc[s + 4] & 63;
        } else {
            scv = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4);
            mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        }
        const __m256 dv = _mm256_set1_ps(d * (float)scv), mv = _mm256_set1_ps(dmin * (float)mn);
        const int qoff = T == GGML_Q4_K ? 16 : 48;
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + qoff + 32 * (s / 2)));
        __m256i nib = (s & 1) ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15))
                              : _mm256_and_si256(raw, _mm256_set1_epi8(15));
        if (T == GGML_Q5_K) {  // bit s of fifth-bit byte l is bit 4 of element l
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 16));
            const __m256i bit = _mm256_set1_epi8((char)(1 << s));
            nib = _mm256_or_si256(nib, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(16)));
        }
        const __m128i lo = _mm256_castsi256_si128(nib), hi = _mm256_extracti128_si256(nib, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++) w[k] = _mm256_fmsub_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), mv);
    } else {  // q6_K: half h = s / 4, quarter g = s % 4
        const int h = s / 4, g = s % 4;
        const float d = f16[blk[208] | (blk[209] << 8)];
        const int8_t *sc = reinterpret_cast<const int8_t *>(blk + 192) + 8 * h + 2 * g;
        const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 64 * h + 32 * (g & 1)));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 128 + 32 * h));
        const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
        const __m256i low = g >= 2 ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m15) : _mm256_and_si256(ql, m15);
        __m256i high = qh;
        if (g == 1) high = _mm256_srli_epi16(qh, 2);
        if (g == 2) high = _mm256_srli_epi16(qh, 4);
        if (g == 3) high = _mm256_srli_epi16(qh, 6);
        high = _mm256_and_si256(high, m3);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        const __m256 d0 = _mm256_set1_ps(d * (float)sc[0]), d1 = _mm256_set1_ps(d * (float)sc[1]);
        for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(k < 2 ? d0 : d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
    }
}

template <uint32_t T>
__attribute__((target("avx2,fma,f16c"))) void k_rows_avx2(float *out, const float *x, const QView &W, int n, int in_dim,
                                                     int out_dim, int o0, int o1) {
    const float *f16 = f16_table();
    const int nsb = in_dim / 32;  // sub-blocks of 32
    constexpr int kT = 64;
    for (int tc = 0; tc < n; tc += kT) {
        const int te = std::min(n, tc + kT);
        for (int o = o0; o < o1; o++) {
            const uint8_t *row = W.data + (uint64_t)o * W.row_bytes;
            int t = tc;
            for (; t + 4 <= te; t += 4) {
                __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                for (int j = 0; j < nsb; j++) {
                    __m256 w[4];
                    kblock_w<T>(row, j, f16, w);
                    for (int r = 0; r < 4; r++) {
                        const float *xr = x + (size_t)(t + r) * in_dim + 32 * j;
                        for (int k = 0; k < 4; k++) acc[r] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xr + 8 * k), acc[r]);
                    }
                }
                for (int r = 0; r < 4; r++) out[(size_t)(t + r) * out_dim + o] = hsum8(acc[r]);
            }
            for (; t < te; t++) {
                __m256 acc = _mm256_setzero_ps();
                for (int j = 0; j < nsb; j++) {
                    __m256 w[4];
                    kblock_w<T>(row, j, f16, w);
                    const float *xr = x + (size_t)t * in_dim + 32 * j;
                    for (int k = 0; k < 4; k++) acc = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xr + 8 * k), acc);
                }
                out[(size_t)t * out_dim + o] = hsum8(acc);
            }
        }
    }
}

bool have_avx2() {
    static const bool ok = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;  // F16C: CPUID leaf 1, ECX bit 29 (not a name every compiler's builtin knows)
        const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    }();
    return ok;
}
#endif

void rows(float *out, const float *x, const QView &W, int n, int in_dim, int out_dim, int o0, int o1, float *buf) {
#ifdef KVH_Q8_AVX2
    if ((W.type == GGML_Q8_0 || W.type == GGML_Q4_0 || W.type == GGML_Q5_0) && in_dim % 32 == 0 && have_avx2() &&
        !std::getenv("KVPRUNE_NO_AVX2")) {
        if (W.type == GGML_Q8_0) q8_rows_avx2<0>(out, x, W, n, in_dim, out_dim, o0, o1);
        else if (W.type == GGML_Q4_0) q8_rows_avx2<1>(out, x, W, n, in_dim, out_dim, o0, o1);
        else q8_rows_avx2<2>(out, x, W, n, in_dim, out_dim, o0, o1);
        return;
    }
    if ((W.type == GGML_Q4_K || W.type == GGML_Q5_K || W.type == GGML_Q6_K) && in_dim % 256 == 0 && have_avx2() &&
        !std::getenv("KVPRUNE_NO_AVX2")) {
        if (W.type == GGML_Q4_K) k_rows_avx2<GGML_Q4_K>(out, x, W, n, in_dim, out_dim, o0, o1);
        else if (W.type == GGML_Q5_K) k_rows_avx2<GGML_Q5_K>(out, x, W, n, in_dim, out_dim, o0, o1);
        else k_rows_avx2<GGML_Q6_K>(out, x, W, n, in_dim, out_dim, o0, o1);
        return;
    }
    if ((W.type == GGML_Q4_1 || W.type == GGML_Q5_1 || W.type == GGML_Q8_1) && in_dim % 32 == 0 &&
        have_avx2() && !std::getenv("KVPRUNE_NO_AVX2")) {
        if (W.type == GGML_Q4_1) k_rows_avx2<GGML_Q4_1>(out, x, W, n, in_dim, out_dim, o0, o1);
        else if (W.type == GGML_Q5_1) k_rows_avx2<GGML_Q5_1>(out, x, W, n, in_dim, out_dim, o0, o1);
        else k_rows_avx2<GGML_Q8_1>(out, x, W, n, in_dim, out_dim, o0, o1);
        return;
    }
    if ((W.type == GGML_Q2_K || W.type == GGML_Q3_K || W.type == GGML_IQ4_XS) && in_dim % 256 == 0 && have_avx2() &&
        !std::getenv("KVPRUNE_NO_AVX2")) {
        if (W.type == GGML_Q2_K) k_rows_avx2<GGML_Q2_K>(out, x, W, n, in_dim, out_dim, o0, o1);
        else if (W.type == GGML_Q3_K) k_rows_avx2<GGML_Q3_K>(out, x, W, n, in_dim, out_dim, o0, o1);
        else k_rows_avx2<GGML_IQ4_XS>(out, x, W, n, in_dim, out_dim, o0, o1);
        return;
    }
    if (W.type == GGML_IQ4_NL && in_dim % 32 == 0 && have_avx2() && !std::getenv("KVPRUNE_NO_AVX2")) {
        k_rows_avx2<GGML_IQ4_NL>(out, x, W, n, in_dim, out_dim, o0, o1);
        return;
    }
    if ((W.type == GGML_F16 || W.type == GGML_BF16) && in_dim % 32 == 0 && have_avx2() && !std::getenv("KVPRUNE_NO_AVX2")) {
        if (W.type == GGML_F16) k_rows_avx2<GGML_F16>(out, x, W, n, in_dim, out_dim, o0, o1);
        else k_rows_avx2<GGML_BF16>(out, x, W, n, in_dim, out_dim, o0, o1);
        return;
    }
#endif
    rows_kernel(out, x, W, n, in_dim, out_dim, o0, o1, buf);
}

}  // namespace

namespace {

// Helper threads that stay (started on first use, joined at exit): a product hands each helper its
// row range and waits for them, instead of starting threads per product (which cost more than a
// decode step's small products under load).
class Workers {
public:
    static Workers &get() {
        static Workers w;
        return w;
    }
    // Runs fn(k) for k = 1..n-1 on helpers while the caller runs fn(0); returns when all are done.
    void run(int n, const std::function<void(int)> &fn) {
        std::lock_guard<std::mutex> one(call_m_);  // one product at a time across Sessions
        ensure(n - 1);
        {
            std::lock_guard<std::mutex> g(m_);
            fn_ = &fn;
            active_ = n - 1;
            pending_ = n - 1;
            ++gen_;
        }
        cv_.notify_all();
        fn(0);
        std::unique_lock<std::mutex> g(m_);
        done_.wait(g, [&] { return pending_ == 0; });
        fn_ = nullptr;
    }
    ~Workers() {
        {
            std::lock_guard<std::mutex> g(m_);
            stop_ = true;
            ++gen_;
        }
        cv_.notify_all();
        for (auto &t : ts_) t.join();
    }

private:
    void ensure(int k) {
        std::lock_guard<std::mutex> g(m_);
        while ((int)ts_.size() < k) {
            const int id = (int)ts_.size() + 1;
            const uint64_t seen = gen_;
            ts_.emplace_back([this, id, seen] { loop(id, seen); });
        }
    }
    void loop(int id, uint64_t seen) {
        std::unique_lock<std::mutex> g(m_);
        for (;;) {
            cv_.wait(g, [&] { return stop_ || gen_ != seen; });
            if (stop_) return;
            seen = gen_;
            if (id > active_ || !fn_) continue;
            const std::function<void(int)> *f = fn_;
            g.unlock();
            (*f)(id);
            g.lock();
            if (--pending_ == 0) done_.notify_one();
        }
    }
    std::mutex call_m_, m_;
    std::condition_variable cv_, done_;
    std::vector<std::thread> ts_;
    const std::function<void(int)> *fn_ = nullptr;
    uint64_t gen_ = 0;
    int active_ = 0, pending_ = 0;
    bool stop_ = false;
};

}  // namespace

void matmul_q(float *out, const float *x, const QView &W, int n, int in_dim, int out_dim, int threads) {
    threads = std::max(1, std::min(threads, (out_dim + kRowBlock - 1) / kRowBlock));
    // Small products (a decode step's q/k/v and output projections) run on the caller alone:
    // handing them out costs more than they take. Results are the same either way.
    if ((int64_t)n * in_dim * out_dim < ((int64_t)1 << 22)) threads = 1;
    // Row ranges aligned to the row block; part 0 is the caller's.
    const int blocks = (out_dim + kRowBlock - 1) / kRowBlock;
    auto part = [&](int k) {
        static thread_local std::vector<float> buf;
        buf.resize((size_t)kRowBlock * in_dim);
        const int a = std::min(out_dim, (int)((int64_t)blocks * k / threads) * kRowBlock);
        const int b = std::min(out_dim, (int)((int64_t)blocks * (k + 1) / threads) * kRowBlock);
        rows(out, x, W, n, in_dim, out_dim, a, b, buf.data());
    };
    if (threads == 1) {
        part(0);
        return;
    }
    Workers::get().run(threads, part);
}

}  // namespace kvh
