// Stored-format attention kernels (kernels/attn_q.h) and the element formats (quant/format.h):
// every SIMD variant against the scalar reference, the reference against double precision,
// widths below / at / above the vector width and rows 1..9, bitwise equalities where the
// arithmetic is the same (avx512 = avx2; q4 integer dot products in every variant; the FMA
// variants' pv and f16 qk against a std::fma emulation of the order attn_q.h pins), and the
// conversion error bounds.
#include "kernels/attn_q.h"

#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <string>
#include <vector>

#include "quant/format.h"
#include "reference.h"

using kvp::kern::AttnQ;
using ref::Rng;

#if defined(KVP_TEST_ZEMU)
namespace kvp {
namespace kern {
const AttnQ *attn_q_zemu_table();  // tests/attn_q_zemu.cpp
}  // namespace kern
}  // namespace kvp
#endif

namespace {

// The FMA variants: avx2, avx512, avx512z where the CPU runs them, and (x86 builds with AVX2)
// avx512z's source emulated at AVX2 ("zemu"), so that its 512-bit passes are checked here too.
std::vector<const AttnQ *> fma_variants() {
    std::vector<const AttnQ *> v;
    if (kvp::kern::attn_q_avx2()) v.push_back(kvp::kern::attn_q_avx2());
    if (kvp::kern::attn_q_avx512()) v.push_back(kvp::kern::attn_q_avx512());
    if (kvp::kern::attn_q_avx512z()) v.push_back(kvp::kern::attn_q_avx512z());
#if defined(KVP_TEST_ZEMU)
    if (kvp::kern::attn_q_avx2()) v.push_back(kvp::kern::attn_q_zemu_table());
#endif
    return v;
}

std::vector<const AttnQ *> simd_variants() {
    std::vector<const AttnQ *> v{kvp::kern::attn_q_simde()};
    for (const AttnQ *a : fma_variants()) v.push_back(a);
    return v;
}

enum Kind { kF16, kQ8, kQ4 };
const char *const kKindName[] = {"f16", "q8", "q4"};

// Random stored rows of n tokens, width w (a multiple of 8, 16 for q4), padded leading dims.
struct Rows {
    std::vector<uint8_t> k;
    std::vector<uint16_t> sz;
    size_t ld, ldsz;
};
Rows rows(Kind kind, uint32_t n, uint32_t w, Rng &g) {
    Rows r;
    const size_t rb = kind == kF16 ? 2 * w : kind == kQ8 ? w : w / 2;
    r.ld = rb + 3;
    r.k.assign(n * r.ld + 64, 0xee);  // padding bytes must not matter
    for (uint32_t t = 0; t < n; ++t) {
        uint8_t *row = r.k.data() + t * r.ld;
        if (kind == kF16) {
            for (uint32_t c = 0; c < w; ++c) {
                const uint16_t h = kvp::f16_from_f32(g.uniform(-2.0f, 2.0f));
                memcpy(row + 2 * c, &h, 2);
            }
        } else {
            for (size_t b = 0; b < rb; ++b) row[b] = uint8_t(g.next());
        }
    }
    const uint32_t G = (w + 31) / 32;
    r.ldsz = 2 * G + 1;
    r.sz.assign(n * r.ldsz + 8, 0x7bff);
    for (uint32_t t = 0; t < n; ++t)
        for (uint32_t i = 0; i < 2 * G; ++i)
            r.sz[t * r.ldsz + i] = kvp::f16_from_f32(i < G ? g.uniform(0.001f, 0.1f) : g.uniform(-1.0f, 1.0f));
    return r;
}

double elem(Kind kind, const uint8_t *row, uint32_t c) {
    if (kind == kF16) {
        uint16_t h;
        memcpy(&h, row + 2 * c, 2);
        return kvp::f32_from_f16(h);
    }
    if (kind == kQ8) return row[c];
    return kvp::q4_get(row, 0, c);
}

const uint32_t kWidths[] = {8, 16, 24, 32, 40, 48, 64, 72, 96, 128, 136, 256};
const uint32_t kNs[] = {0, 1, 2, 3, 7, 8, 9, 33, 64, 130};

TEST(QuantKernels, QkMatchesReference) {  // f16 keys (q8 / q4: the integer tests below)
    const AttnQ *S = kvp::kern::attn_q_scalar();
    for (Kind kind : {kF16}) {
        for (uint32_t w : kWidths) {
            for (uint32_t rows_n : {1u, 2u, 3u, 4u, 5u, 9u}) {
                for (uint32_t n : kNs) {
                    Rng g(w * 131 + n * 7 + rows_n);
                    const Rows r = rows(kind, n, w, g);
                    const size_t ldq = w + 5, ldl = n + 3;
                    std::vector<float> q(rows_n * ldq), bias(rows_n);
                    g.fill(q);
                    g.fill(bias);
                    std::vector<float> want(rows_n * ldl + 1, -7.0f);
                    const auto qk = [&](const AttnQ *A) { return A->qk_f16; };
                    qk(S)(q.data(), ldq, rows_n, bias.data(), r.k.data(), r.ld, n, w, 0.3f, want.data(), ldl);
                    for (uint32_t i = 0; i < rows_n; ++i)  // reference against double
                        for (uint32_t t = 0; t < n; ++t) {
                            double d = bias[i];
                            for (uint32_t c = 0; c < w; ++c) d += double(q[i * ldq + c]) * elem(kind, &r.k[t * r.ld], c);
                            double mg = 1;
                            for (uint32_t c = 0; c < w; ++c) mg += fabs(q[i * ldq + c] * elem(kind, &r.k[t * r.ld], c));
                            ASSERT_NEAR(want[i * ldl + t], 0.3 * d, 1e-6 * mg) << kKindName[kind];
                        }
                    // rounding scale of a logit: its terms' magnitude (q8 codes reach 255)
                    std::vector<double> mag(rows_n * ldl + 1, 1.0);
                    for (uint32_t i = 0; i < rows_n; ++i)
                        for (uint32_t t = 0; t < n; ++t)
                            for (uint32_t c = 0; c < w; ++c)
                                mag[i * ldl + t] += fabs(q[i * ldq + c] * elem(kind, &r.k[t * r.ld], c));
                    for (const AttnQ *A : simd_variants()) {
                        std::vector<float> got(rows_n * ldl + 1, -7.0f);
                        qk(A)(q.data(), ldq, rows_n, bias.data(), r.k.data(), r.ld, n, w, 0.3f, got.data(), ldl);
                        for (size_t i = 0; i < got.size(); ++i) {
                            const bool in = i / ldl < rows_n && i % ldl < n;
                            if (!in) {
                                ASSERT_EQ(got[i], -7.0f) << A->name << " wrote outside";
                                continue;
                            }
                            ASSERT_NEAR(got[i], want[i], 1e-6 * mag[i])
                                << A->name << " " << kKindName[kind] << " w=" << w << " rows=" << rows_n << " n=" << n;
                        }
                    }
                }
            }
        }
    }
}

// q8 / q4 keys: integer dot products. prep8 / prep4 give the same int8 query and step in every
// variant (the rounded scaled query, within half a step), the kernels the same bits as the
// scalar reference (exact int32 sums), and the reference is within the stated query-rounding
// bound of the double-precision dot product with the unrounded query: scale * (qsc/2 *
// sum_c code_c) plus float rounding. Widths below / at / above the vector width and with 8- and
// 16-channel tails; extreme codes (all 0, all max) and extreme queries (one huge channel).
TEST(QuantKernels, IntegerDotIsExactInEveryVariant) {
    const AttnQ *S = kvp::kern::attn_q_scalar();
    for (Kind kind : {kQ8, kQ4}) {
        const bool q4 = kind == kQ4;
        const uint32_t levels = q4 ? 15 : 255;
        for (uint32_t w : {8u, 16u, 24u, 32u, 40u, 48u, 56u, 64u, 80u, 96u, 120u, 128u, 136u, 144u, 1024u}) {
            if (q4 && w % 16) continue;
            for (uint32_t rows_n : {1u, 2u, 3u, 4u, 7u}) {
                for (uint32_t n : kNs) {
                    if (w == 1024 && (rows_n > 2 || n > 9)) continue;
                    Rng g(w * 17 + n + rows_n * 1000 + kind * 7919);
                    Rows r = rows(kind, n, w, g);
                    for (uint32_t t = 0; t < n; ++t) {  // extreme rows: all codes 0 / all codes max
                        if (t % 5 == 3) memset(&r.k[t * r.ld], 0, q4 ? w / 2 : w);
                        if (t % 5 == 4) memset(&r.k[t * r.ld], 0xff, q4 ? w / 2 : w);
                    }
                    const size_t ldq = w + 5, ldl = n + 3;
                    std::vector<float> q(rows_n * ldq), qs(rows_n * w), bias(rows_n), qsc(rows_n);
                    g.fill(q);
                    if (rows_n == 7) q[ldq + 3] = 3e4f, q[2 * ldq] = 0.0f;  // one dominating channel
                    if (rows_n == 7) memset(&q[3 * ldq], 0, w * sizeof(float));  // an all-zero row
                    std::vector<int8_t> ge(w);
                    std::vector<int16_t> gz(w);
                    for (uint32_t c = 0; c < w; ++c) {
                        ge[c] = int8_t(int(g.next() % 7) - 5);
                        gz[c] = int16_t(int(g.next() % 41) - 20);
                    }
                    const auto prep = [&](const AttnQ *A) { return q4 ? A->prep4 : A->prep8; };
                    const auto qk = [&](const AttnQ *A) { return q4 ? A->qk_q4 : A->qk_q8; };
                    const auto chan = [&](uint32_t p) { return q4 ? kvp::kern::q4_code_channel(p, w) : p; };
                    std::vector<int8_t> qi_s(rows_n * w);
                    std::vector<float> qsc_s(rows_n), bias_s(rows_n);
                    prep(S)(q.data(), ldq, rows_n, ge.data(), gz.data(), w, qs.data(), w, qi_s.data(), w, qsc_s.data(),
                            bias_s.data());
                    for (uint32_t i = 0; i < rows_n; ++i) {  // it is the rounded scaled query
                        for (uint32_t p = 0; p < w; ++p) {
                            const uint32_t c = chan(p);
                            const double x = double(q[i * ldq + c]) * ldexp(1.0, ge[c]);
                            ASSERT_LE(fabs(qi_s[i * w + p] * double(qsc_s[i]) - x), 0.5001 * qsc_s[i] + 1e-12);
                        }
                    }
                    std::vector<float> want(rows_n * ldl, -7.0f);
                    qk(S)(qi_s.data(), w, rows_n, qsc_s.data(), bias_s.data(), r.k.data(), r.ld, n, w, 0.25f, want.data(),
                          ldl);
                    for (uint32_t i = 0; i < rows_n; ++i)  // the reference against double, unrounded query
                        for (uint32_t t = 0; t < n; ++t) {
                            double d = 0, codes = 0, mag = 0;
                            for (uint32_t c = 0; c < w; ++c) {
                                const double code = q4 ? kvp::q4_get(&r.k[t * r.ld], w, c) : r.k[t * r.ld + c];
                                ASSERT_LE(code, levels);
                                const double x = double(q[i * ldq + c]) * ldexp(1.0, ge[c]);
                                d += x * (code + gz[c]);
                                codes += code;
                                mag += fabs(x) * (code + fabs(double(gz[c])));
                            }
                            const double bound = 0.25 * (0.5001 * qsc_s[i] * codes + 1e-6 * (mag + 1));
                            ASSERT_NEAR(want[i * ldl + t], 0.25 * d, bound) << kKindName[kind] << " w=" << w;
                        }
                    for (const AttnQ *A : simd_variants()) {
                        std::vector<int8_t> qi(rows_n * w);
                        prep(A)(q.data(), ldq, rows_n, ge.data(), gz.data(), w, qs.data(), w, qi.data(), w, qsc.data(),
                                bias.data());
                        ASSERT_EQ(qi, qi_s) << A->name;
                        ASSERT_EQ(memcmp(qsc.data(), qsc_s.data(), rows_n * 4), 0) << A->name;
                        for (uint32_t i = 0; i < rows_n; ++i) ASSERT_NEAR(bias[i], bias_s[i], 1e-4 * (1 + fabs(bias_s[i])));
                        std::vector<float> got(rows_n * ldl, -7.0f);
                        // the same bias in, so the same bits out
                        qk(A)(qi_s.data(), w, rows_n, qsc_s.data(), bias_s.data(), r.k.data(), r.ld, n, w, 0.25f,
                              got.data(), ldl);
                        ASSERT_EQ(memcmp(got.data(), want.data(), got.size() * 4), 0)
                            << A->name << " " << kKindName[kind] << " w=" << w << " rows=" << rows_n << " n=" << n;
                    }
                }
            }
        }
    }
}

// The pv sweep: every kind x width (q4: multiples of 16) x rows 1..6 x n in kNs; stops at the
// first fatal failure (an ASSERT inside f returns from f only).
template <class F>
void each_pv_case(F f) {
    for (Kind kind : {kF16, kQ8, kQ4})
        for (uint32_t w : kWidths) {
            if (kind == kQ4 && w % 16) continue;
            for (uint32_t rows_n : {1u, 2u, 3u, 4u, 6u})
                for (uint32_t n : kNs) {
                    f(kind, w, (w + 31) / 32, rows_n, n);
                    if (::testing::Test::HasFatalFailure()) return;
                }
        }
}

TEST(QuantKernels, PvMatchesReference) {
    const AttnQ *S = kvp::kern::attn_q_scalar();
    each_pv_case([&](Kind kind, uint32_t w, uint32_t G, uint32_t rows_n, uint32_t n) {
        Rng g(w * 7 + n * 13 + rows_n + kind * 100000);
        const Rows r = rows(kind, n, w, g);
        const size_t ldp = n + 2, ldo = w + 3;
        std::vector<float> p(rows_n * ldp);
        g.fill(p, 0.0f, 1.0f);
        std::vector<float> o0(rows_n * ldo), z0(rows_n * G + 1);
        g.fill(o0);
        g.fill(z0);
        const auto pv = [&](const AttnQ *A) {
            return kind == kF16 ? A->pv_f16 : kind == kQ8 ? A->pv_q8 : A->pv_q4;
        };
        std::vector<float> ow = o0, zw = z0;
        pv(S)(p.data(), ldp, rows_n, r.k.data(), r.ld, r.sz.data(), r.ldsz, n, w, ow.data(), ldo, zw.data(), G);
        for (uint32_t i = 0; i < rows_n; ++i) {  // reference against double
            for (uint32_t c = 0; c < w; ++c) {
                double d = o0[i * ldo + c], z = kind == kF16 ? 0 : z0[i * G + c / 32];
                for (uint32_t t = 0; t < n; ++t) {
                    const double pt = p[i * ldp + t];
                    const double s = kind == kF16 ? 1.0 : kvp::f32_from_f16(r.sz[t * r.ldsz + c / 32]);
                    d += pt * s * elem(kind, &r.k[t * r.ld], c);
                    if (kind != kF16) z += pt * kvp::f32_from_f16(r.sz[t * r.ldsz + G + c / 32]);
                }
                ASSERT_NEAR(ow[i * ldo + c], d, 1e-4 * (1 + fabs(d)));
                if (kind != kF16) {
                    ASSERT_NEAR(zw[i * G + c / 32], z, 1e-4 * (1 + fabs(z)));
                }
            }
        }
        for (const AttnQ *A : simd_variants()) {
            std::vector<float> o = o0, z = z0;
            pv(A)(p.data(), ldp, rows_n, r.k.data(), r.ld, r.sz.data(), r.ldsz, n, w, o.data(), ldo, z.data(), G);
            for (size_t i = 0; i < o.size(); ++i) {
                if (i % ldo >= w) {
                    ASSERT_EQ(o[i], o0[i]) << A->name << " wrote padding";
                    continue;
                }
                ASSERT_NEAR(o[i], ow[i], 2e-5 * (1 + fabs(ow[i])))
                    << A->name << " " << kKindName[kind] << " w=" << w << " rows=" << rows_n << " n=" << n;
            }
            // zero terms: mul then add per token, in token order: the reference's bits
            if (kind != kF16) {
                ASSERT_EQ(memcmp(z.data(), zw.data(), z.size() * 4), 0) << A->name;
            }
        }
    });
}

TEST(QuantKernels, Avx512IsBitIdenticalToAvx2) {
    const AttnQ *a2 = kvp::kern::attn_q_avx2();
    if (!a2 || !kvp::kern::attn_q_avx512()) GTEST_SKIP() << "needs AVX2 and AVX-512 VL/BW/VNNI";
    for (const AttnQ *a5 : {kvp::kern::attn_q_avx512(), kvp::kern::attn_q_avx512z()})
    for (Kind kind : {kF16, kQ8, kQ4}) {
        for (uint32_t w : {16u, 32u, 64u, 96u, 128u, 160u, 256u}) {
            for (uint32_t n : {1u, 9u, 130u}) {
                Rng g(w + n + kind);
                const Rows r = rows(kind, n, w, g);
                const uint32_t rows_n = 4, G = (w + 31) / 32;
                std::vector<float> q(rows_n * w), p(rows_n * n), o(rows_n * w), z(rows_n * G), bias(rows_n, 0.1f);
                g.fill(q);
                g.fill(p, 0.0f, 1.0f);
                std::vector<float> l2(rows_n * n), l5(rows_n * n), o2 = o, o5 = o, z2 = z, z5 = z;
                if (kind == kF16) {
                    a2->qk_f16(q.data(), w, rows_n, bias.data(), r.k.data(), r.ld, n, w, 0.5f, l2.data(), n);
                    a5->qk_f16(q.data(), w, rows_n, bias.data(), r.k.data(), r.ld, n, w, 0.5f, l5.data(), n);
                    ASSERT_EQ(memcmp(l2.data(), l5.data(), l2.size() * 4), 0);
                }
                auto pv2 = kind == kF16 ? a2->pv_f16 : kind == kQ8 ? a2->pv_q8 : a2->pv_q4;
                auto pv5 = kind == kF16 ? a5->pv_f16 : kind == kQ8 ? a5->pv_q8 : a5->pv_q4;
                pv2(p.data(), n, rows_n, r.k.data(), r.ld, r.sz.data(), r.ldsz, n, w, o2.data(), w, z2.data(), G);
                pv5(p.data(), n, rows_n, r.k.data(), r.ld, r.sz.data(), r.ldsz, n, w, o5.data(), w, z5.data(), G);
                ASSERT_EQ(memcmp(o2.data(), o5.data(), o2.size() * 4), 0) << a5->name << " " << kKindName[kind] << " w=" << w;
                ASSERT_EQ(memcmp(z2.data(), z5.data(), z2.size() * 4), 0);
            }
        }
    }
}

// The table decode uses without KVP_KERNEL_Q: the widest the CPU runs, and of the two AVX-512
// tables the 512-bit value passes only on Intel (full-width units; DECISIONS "avx512z on
// full-width cores"), avx512 on AMD (Zen 4 splits 512-bit operations).
TEST(QuantKernels, BestTableFollowsTheCpu) {
    if (getenv("KVP_KERNEL_Q")) GTEST_SKIP() << "KVP_KERNEL_Q is set";
    const char *want = "simde";
    if (kvp::kern::attn_q_avx512()) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        want = __builtin_cpu_is("intel") ? "avx512z" : "avx512";
#endif
    } else if (kvp::kern::attn_q_avx2()) {
        want = "avx2";
    }
    EXPECT_STREQ(kvp::kern::attn_q_best()->name, want);
}

// A run split into calls gives the same bits as one call (the store's physical layout never
// changes an output bit): qk per logit, pv per element with zero terms carried across calls.
// The FMA variants (avx2, avx512) against the arithmetic attn_q.h pins, emulated with std::fma:
// pv: o[c] = fma(w_t, x_tc, o[c]) in token order with w_t = p_t * s_tg rounded to float (f16:
// w_t = p_t); f16 qk: lane l of one 8-lane accumulator takes fma(q_c, x_c, .) for c = l mod 8 in
// chunk order, ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)), plus the bias, times the scale. This pins
// avx2 = avx512 on a machine without AVX-512, where Avx512IsBitIdenticalToAvx2 is skipped, and
// any change of either variant's order fails here whatever the machine.
TEST(QuantKernels, FmaVariantsFollowThePinnedOrder) {
    const std::vector<const AttnQ *> fma = fma_variants();
    if (fma.empty()) GTEST_SKIP() << "no FMA variant on this machine";
    each_pv_case([&](Kind kind, uint32_t w, uint32_t G, uint32_t rows_n, uint32_t n) {
        Rng g(w * 11 + n * 5 + rows_n + kind * 7919);
        const Rows r = rows(kind, n, w, g);
        const size_t ldp = n + 1, ldo = w + 1;
        std::vector<float> p(rows_n * ldp), o0(rows_n * ldo), z0(rows_n * G + 1);
        g.fill(p, 0.0f, 1.0f);
        g.fill(o0);
        g.fill(z0);
        std::vector<float> want = o0;
        for (uint32_t i = 0; i < rows_n; ++i)
            for (uint32_t c = 0; c < w; ++c) {
                float acc = o0[i * ldo + c];
                for (uint32_t t = 0; t < n; ++t) {
                    const float pt = p[i * ldp + t];
                    const float wt =
                        kind == kF16 ? pt : pt * kvp::f32_from_f16(r.sz[t * r.ldsz + c / 32]);
                    acc = std::fma(wt, float(elem(kind, &r.k[t * r.ld], c)), acc);
                }
                want[i * ldo + c] = acc;
            }
        for (const AttnQ *A : fma) {
            std::vector<float> o = o0, z = z0;
            auto pv = kind == kF16 ? A->pv_f16 : kind == kQ8 ? A->pv_q8 : A->pv_q4;
            pv(p.data(), ldp, rows_n, r.k.data(), r.ld, r.sz.data(), r.ldsz, n, w, o.data(), ldo, z.data(), G);
            ASSERT_EQ(memcmp(o.data(), want.data(), o.size() * 4), 0)
                << A->name << " pv " << kKindName[kind] << " w=" << w << " rows=" << rows_n << " n=" << n;
        }
        if (kind != kF16) return;
        std::vector<float> q(rows_n * w), bias(rows_n);
        g.fill(q);
        g.fill(bias);
        const float scale = 0.37f;
        std::vector<float> lw(rows_n * ldp, -5.0f);
        for (uint32_t i = 0; i < rows_n; ++i)
            for (uint32_t t = 0; t < n; ++t) {
                float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (uint32_t c = 0; c < w; ++c)
                    lane[c % 8] = std::fma(q[i * w + c], float(elem(kind, &r.k[t * r.ld], c)), lane[c % 8]);
                const float s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
                lw[i * ldp + t] = (s + bias[i]) * scale;
            }
        for (const AttnQ *A : fma) {
            std::vector<float> l(rows_n * ldp, -5.0f);
            A->qk_f16(q.data(), w, rows_n, bias.data(), r.k.data(), r.ld, n, w, scale, l.data(), ldp);
            ASSERT_EQ(memcmp(l.data(), lw.data(), l.size() * 4), 0)
                << A->name << " qk f16 w=" << w << " rows=" << rows_n << " n=" << n;
        }
    });
}

TEST(QuantKernels, SplitCallsGiveTheSameBits) {
    for (const AttnQ *A : simd_variants()) {
        for (Kind kind : {kF16, kQ8, kQ4}) {
            const uint32_t w = 48, n = 70, rows_n = 3, G = 2;
            Rng g(kind + 5);
            const Rows r = rows(kind, n, w, g);
            std::vector<float> p(rows_n * n), o1(rows_n * w, 0.0f), o2 = o1, z1(rows_n * G, 0.0f), z2 = z1;
            g.fill(p, 0.0f, 1.0f);
            auto pv = kind == kF16 ? A->pv_f16 : kind == kQ8 ? A->pv_q8 : A->pv_q4;
            pv(p.data(), n, rows_n, r.k.data(), r.ld, r.sz.data(), r.ldsz, n, w, o1.data(), w, z1.data(), G);
            for (uint32_t t0 = 0; t0 < n; t0 += 23) {
                const uint32_t m = n - t0 < 23 ? n - t0 : 23;
                pv(p.data() + t0, n, rows_n, r.k.data() + t0 * r.ld, r.ld, r.sz.data() + t0 * r.ldsz, r.ldsz, m, w,
                   o2.data(), w, z2.data(), G);
            }
            EXPECT_EQ(memcmp(o1.data(), o2.data(), o1.size() * 4), 0) << A->name << " " << kKindName[kind];
            EXPECT_EQ(memcmp(z1.data(), z2.data(), z1.size() * 4), 0) << A->name << " " << kKindName[kind];
        }
    }
}

TEST(QuantKernels, PrepScalesByTheDyadicGrid) {
    const AttnQ *S = kvp::kern::attn_q_scalar();
    for (const AttnQ *A : simd_variants()) {
        for (uint32_t w : {8u, 24u, 128u}) {
            Rng g(w);
            std::vector<float> q(3 * w), qs1(3 * w), qs2(3 * w), b1(3), b2(3);
            g.fill(q);
            std::vector<int8_t> ge(w);
            std::vector<int16_t> gz(w);
            for (uint32_t c = 0; c < w; ++c) {
                ge[c] = int8_t(int(g.next() % 11) - 8);
                gz[c] = int16_t(int(g.next() % 2001) - 1000);
            }
            S->prep(q.data(), w, 3, ge.data(), gz.data(), w, qs1.data(), w, b1.data());
            A->prep(q.data(), w, 3, ge.data(), gz.data(), w, qs2.data(), w, b2.data());
            EXPECT_EQ(memcmp(qs1.data(), qs2.data(), qs1.size() * 4), 0);  // power-of-two scaling is exact
            for (uint32_t r = 0; r < 3; ++r) {
                double d = 0;
                for (uint32_t c = 0; c < w; ++c) d += double(q[r * w + c]) * gz[c] * ldexp(1.0, ge[c]);
                EXPECT_NEAR(b2[r], d, 1e-4 * (1 + fabs(d)));
                EXPECT_NEAR(b1[r], d, 1e-4 * (1 + fabs(d)));
            }
        }
    }
}

// ---- element formats ----------------------------------------------------------------------------

TEST(QuantFormat, F16RoundTripIsExactAndRoundsToNearestEven) {
    for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite half survives f16 -> f32 -> f16
        if ((h & 0x7c00u) == 0x7c00u) continue;
        ASSERT_EQ(kvp::f16_from_f32(kvp::f32_from_f16(uint16_t(h))), uint16_t(h == 0x8000u ? 0x8000u : h)) << h;
    }
    Rng g(3);
    for (int i = 0; i < 200000; ++i) {  // nearest: no half is closer
        const float x = g.uniform(-70000.0f, 70000.0f) * (i % 3 == 0 ? 1e-6f : 1.0f);
        const uint16_t h = kvp::f16_from_f32(x);
        const double y = kvp::f32_from_f16(h), xc = fmax(-65504.0, fmin(65504.0, double(x)));
        const double up = kvp::f32_from_f16(uint16_t(h + 1)), dn = kvp::f32_from_f16(uint16_t(h - 1));
        if ((h & 0x7fffu) != 0x7bffu && (h & 0x7fffu) != 0) {
            ASSERT_LE(fabs(y - xc), fabs(up - xc)) << x;
            ASSERT_LE(fabs(y - xc), fabs(dn - xc)) << x;
        }
    }
    EXPECT_EQ(kvp::f32_from_f16(kvp::f16_from_f32(1e9f)), 65504.0f);   // saturates
    EXPECT_EQ(kvp::f32_from_f16(kvp::f16_from_f32(-1e9f)), -65504.0f);
    EXPECT_EQ(kvp::f16_from_f32(1.0f + 1.0f / 2048), kvp::f16_from_f32(1.0f));  // tie to even
    EXPECT_EQ(kvp::f16_from_f32(1.0f + 3.0f / 2048), uint16_t(kvp::f16_from_f32(1.0f) + 2));
}

// Dyadic key grids: step 2^e at most twice the min-max step, every value within half a step;
// a value already on a grid is re-encoded exactly on any grid that is not coarser (nesting).
TEST(QuantFormat, DyadicGridBoundsAndNesting) {
    Rng g(9);
    for (uint32_t levels : {255u, 15u}) {
        for (int i = 0; i < 20000; ++i) {
            const float scale = std::pow(2.0f, float(int(g.next() % 30) - 15));
            float mn = g.uniform(-1, 1) * scale, mx = g.uniform(-1, 1) * scale;
            if (mn > mx) std::swap(mn, mx);
            if (i % 50 == 0) mx = mn;  // constant channel
            int8_t e;
            int16_t zi;
            kvp::dyadic_grid(mn, mx, levels, &e, &zi);
            const double s = ldexp(1.0, e), z = zi * s;
            ASSERT_LE(z, mn);
            ASSERT_GE(z + levels * s + 0.5 * s, mx);
            if (mx > mn && fabs(mn) / (mx - mn) < 32767.0 / levels / 4) {  // the range decides the step
                ASSERT_LE(s, 2.0 * (double(mx) - mn) / (levels - 1) + 1e-30) << mn << " " << mx;
            }
            for (int k = 0; k < 8; ++k) {
                const float x = mn + (mx - mn) * float(k) / 7.0f;
                const uint32_t c = kvp::dyadic_code(x, e, zi, levels);
                ASSERT_LE(c, levels);
                const double back = (zi + double(c)) * s;
                ASSERT_LE(fabs(back - x), 0.5 * s * (1 + 1e-6)) << x;
                // nesting: a grid with a step not coarser holds `back` exactly
                int8_t e2;
                int16_t z2;
                kvp::dyadic_grid(float(back), float(back) + float(s), levels, &e2, &z2);
                if (e2 <= e) {
                    const uint32_t c2 = kvp::dyadic_code(float(back), e2, z2, levels);
                    ASSERT_EQ((z2 + double(c2)) * ldexp(1.0, e2), back);
                }
            }
        }
    }
}

TEST(QuantFormat, ValueGroupErrorIsHalfAStep) {
    Rng g(4);
    for (uint32_t levels : {255u, 15u}) {
        for (int i = 0; i < 20000; ++i) {
            const uint32_t m = 1 + uint32_t(g.next() % 32);
            const float scale = std::pow(2.0f, float(int(g.next() % 24) - 12));
            std::vector<float> x(m);
            for (float &v : x) v = g.uniform(-1, 1) * scale + (i % 7 == 0 ? 3.0f * scale : 0.0f);
            uint8_t codes[32];
            uint16_t sh, zh;
            kvp::vgroup_quant(x.data(), m, levels, codes, &sh, &zh);
            const double s = kvp::f32_from_f16(sh), z = kvp::f32_from_f16(zh);
            float mn = x[0];
            for (float v : x) mn = std::min(mn, v);
            for (uint32_t j = 0; j < m; ++j) {
                ASSERT_LE(codes[j], levels);
                // half a step, plus the f16 rounding of the zero point when the step is 0
                const double tol = s > 0 ? 0.5 * s * (1 + 1e-5) + 1e-7 * scale : fabs(double(mn) - z) + 1e-12;
                ASSERT_LE(fabs(z + s * codes[j] - x[j]), tol) << "m=" << m << " scale=" << scale;
            }
        }
    }
}

TEST(QuantFormat, RowsRoundTrip) {
    for (kvp_dtype dt : {KVP_DTYPE_F32, KVP_DTYPE_F16, KVP_DTYPE_Q8, KVP_DTYPE_Q4}) {
        for (uint32_t hd : {8u, 40u, 128u}) {
            const kvp_model m = ref::model(1, 2, 1, hd);
            kvp_config cfg;
            kvp_config_default(&cfg, &m);
            cfg.kv_dtype = dt;
            kvp::StoreFormat f;
            kvp::store_format(cfg, &f);
            Rng g(hd + dt);
            std::vector<float> kf(f.wkp * 4), vf(f.wvp), kout(f.wkp), vout(f.wvp);
            g.fill(kf);
            g.fill(vf);
            std::vector<int8_t> ge(f.wkp);
            std::vector<int16_t> gz(f.wkp);
            if (f.quant()) kvp::fmt_k_grid(f, kf.data(), f.wkp, 4, ge.data(), gz.data());
            std::vector<uint8_t> krow(f.k_row), vrow(f.v_row);
            std::vector<uint16_t> sz(2 * f.v_groups + 1);
            kvp::fmt_k_encode(f, kf.data(), ge.data(), gz.data(), krow.data());
            kvp::fmt_v_encode(f, vf.data(), vrow.data(), sz.data());
            kvp::fmt_k_decode(f, krow.data(), ge.data(), gz.data(), kout.data());
            kvp::fmt_v_decode(f, vrow.data(), sz.data(), vout.data());
            const double tol = dt == KVP_DTYPE_F32 ? 0 : dt == KVP_DTYPE_F16 ? 1e-3 : dt == KVP_DTYPE_Q8 ? 2.0 / 255 : 2.0 / 15;
            for (uint32_t c = 0; c < hd; ++c) {
                EXPECT_NEAR(kout[c], kf[c], tol) << c;
                EXPECT_NEAR(vout[c], vf[c], tol) << c;
            }
        }
    }
}

}  // namespace
