// Scoring kernel family (src/kernels/score_f32.h): every variant against the scalar reference,
// and the reference against double, at sizes below, equal to and above the vector width.
#include <gtest/gtest.h>
#include <math.h>

#include <vector>

#include "kernels/score_f32.h"
#include "reference.h"

namespace {

using kvp::kern::ScoreF32;

std::vector<const ScoreF32 *> variants() {
    std::vector<const ScoreF32 *> v = {kvp::kern::score_f32_simde()};
    if (kvp::kern::score_f32_avx2()) v.push_back(kvp::kern::score_f32_avx2());
    return v;
}

const uint32_t kSizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 257};

TEST(ScoreKernels, AccMatchesScalarAndDouble) {
    ref::Rng rng(1);
    for (uint32_t rows : {1u, 2u, 4u, 7u}) {
        for (uint32_t n : kSizes) {
            const size_t ldp = n + 5;
            std::vector<float> p(rows * ldp), w(rows), s0(n);
            rng.fill(p, 0.0f, 1.0f);
            rng.fill(w, 0.5f, 2.0f);
            rng.fill(s0, 0.0f, 10.0f);
            std::vector<float> ref_s = s0;
            kvp::kern::score_f32_scalar()->acc(p.data(), ldp, rows, w.data(), n, ref_s.data());
            for (uint32_t t = 0; t < n; ++t) {
                double e = s0[t];
                double a = 0;
                for (uint32_t r = 0; r < rows; ++r) a += double(w[r]) * p[r * ldp + t];
                e += a;
                ASSERT_NEAR(ref_s[t], e, 1e-5 * (1 + fabs(e))) << rows << "x" << n;
            }
            for (const ScoreF32 *v : variants()) {
                std::vector<float> s = s0;
                v->acc(p.data(), ldp, rows, w.data(), n, s.data());
                for (uint32_t t = 0; t < n; ++t)
                    ASSERT_NEAR(s[t], ref_s[t], 2e-6f * (1 + fabsf(ref_s[t]))) << v->name << " " << rows << "x" << n;
            }
        }
    }
}

// acc of a range split into two calls gives the same bits as one call (the core calls it per run).
TEST(ScoreKernels, AccIndependentOfSplitting) {
    ref::Rng rng(2);
    const uint32_t rows = 4, n = 77, ldp = 80;
    std::vector<float> p(rows * ldp), w(rows), s0(n);
    rng.fill(p, 0, 1);
    rng.fill(w, 0.5f, 2);
    rng.fill(s0, 0, 3);
    for (const ScoreF32 *v : variants()) {
        std::vector<float> a = s0;
        v->acc(p.data(), ldp, rows, w.data(), n, a.data());
        for (uint32_t cut : {1u, 5u, 8u, 13u, 40u}) {
            std::vector<float> b = s0;
            v->acc(p.data(), ldp, rows, w.data(), cut, b.data());
            v->acc(p.data() + cut, ldp, rows, w.data(), n - cut, b.data() + cut);
            ASSERT_EQ(memcmp(a.data(), b.data(), n * sizeof(float)), 0) << v->name << " cut " << cut;
        }
    }
}

TEST(ScoreKernels, SumsqMatchesScalarAndDouble) {
    ref::Rng rng(3);
    for (uint32_t n : kSizes) {
        std::vector<float> x(n);
        rng.fill(x, -1, 1);
        double e = 0;
        for (float f : x) e += double(f) * f;
        const float r = kvp::kern::score_f32_scalar()->sumsq(x.data(), n);
        ASSERT_NEAR(r, e, 1e-5 * (1 + e)) << n;
        for (const ScoreF32 *v : variants()) ASSERT_NEAR(v->sumsq(x.data(), n), r, 2e-6 * (1 + r)) << v->name << " " << n;
    }
    for (const ScoreF32 *v : variants()) EXPECT_EQ(v->sumsq(nullptr, 0), 0.0f);
}

// dots16 (score=fixed) is integer arithmetic: every variant gives the reference's integers,
// including at the extremes of score_fixed's rows (|x| <= 23170) and every tail length.
TEST(ScoreKernels, Dots16AreExact) {
    ref::Rng rng(7);
    for (uint32_t rows : {1u, 3u, 8u})
        for (uint32_t n : {1u, 7u, 15u, 16u, 17u, 32u, 33u, 128u, 131u}) {
            const size_t ldq = n + 3, ldo = 5;
            std::vector<int16_t> q(rows * ldq), k(n);
            for (int16_t &x : q) x = int16_t(int32_t(rng.next() % 46341) - 23170);
            for (int16_t &x : k) x = int16_t(int32_t(rng.next() % 46341) - 23170);
            if (n == 128)  // the worst case: every product at the extreme, one sign
                for (uint32_t i = 0; i < n; ++i) { k[i] = 23170; q[i] = 23170; }
            std::vector<int64_t> ref_out(rows * ldo, -1), out(rows * ldo, -1);
            kvp::kern::score_f32_scalar()->dots16(q.data(), ldq, rows, k.data(), n, ref_out.data(), ldo);
            for (uint32_t r = 0; r < rows; ++r) {
                int64_t d = 0;
                for (uint32_t i = 0; i < n; ++i) d += int64_t(q[r * ldq + i]) * k[i];
                ASSERT_EQ(ref_out[r * ldo], d);
            }
            for (const ScoreF32 *v : variants()) {
                v->dots16(q.data(), ldq, rows, k.data(), n, out.data(), ldo);
                ASSERT_EQ(out, ref_out) << v->name << " " << rows << "x" << n;
            }
        }
}

// argmin is exact: every variant returns the reference's index, including on ties (first index).
TEST(ScoreKernels, ArgminIsExactWithTiesToTheFirstIndex) {
    ref::Rng rng(4);
    for (uint32_t n : kSizes) {
        for (int trial = 0; trial < 20; ++trial) {
            std::vector<float> x(n);
            for (float &f : x) f = float(int(rng.next() % 7));  // many ties
            if (trial % 3 == 0) rng.fill(x, -5, 5);
            const uint32_t r = kvp::kern::score_f32_scalar()->argmin(x.data(), n);
            for (uint32_t i = 0; i < n; ++i) {
                ASSERT_GE(x[i], x[r]);
                if (i < r) {
                    ASSERT_GT(x[i], x[r]);
                }
            }
            for (const ScoreF32 *v : variants()) ASSERT_EQ(v->argmin(x.data(), n), r) << v->name << " n=" << n;
        }
    }
    // the minimum in the tail past the last full vector, and at index 0
    std::vector<float> x(19, 1.0f);
    x[18] = -1.0f;
    for (const ScoreF32 *v : variants()) EXPECT_EQ(v->argmin(x.data(), 19), 18u) << v->name;
    x[0] = -1.0f;
    for (const ScoreF32 *v : variants()) EXPECT_EQ(v->argmin(x.data(), 19), 0u) << v->name;
}

TEST(ScoreKernels, DispatchPicksAvx2WhenAvailable) {
    const ScoreF32 *best = kvp::kern::score_f32_best();
    ASSERT_NE(best, nullptr);
    EXPECT_STREQ(best->name, kvp::kern::score_f32_avx2() ? "avx2" : "simde");
}

}  // namespace
