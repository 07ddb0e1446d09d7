// Row-wise vector ops (src/kernels/vec_f32.h): RoPE rotation and the NaN/Inf scan. Every SIMD
// variant gives the scalar reference's bits (RoPE: same products and sums, never fused), the
// reference matches a double rotation, padding past the rotated part and the row is untouched.
#include "kernels/vec_f32.h"
#include "reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using kvp::kern::VecF32;

namespace {

std::vector<const VecF32 *> variants() {
    std::vector<const VecF32 *> v{kvp::kern::vec_f32_simde()};
    if (kvp::kern::vec_f32_avx2()) v.push_back(kvp::kern::vec_f32_avx2());
    return v;
}

std::vector<float> table(uint32_t pairs, double pos) {
    std::vector<float> cs(2 * pairs);
    for (uint32_t i = 0; i < pairs; ++i) {
        const double a = pos * std::pow(10000.0, -2.0 * i / (2.0 * pairs));
        cs[2 * i] = float(std::cos(a));
        cs[2 * i + 1] = float(std::sin(a));
    }
    return cs;
}

TEST(VecKernels, RopeVariantsBitIdenticalToScalarAndDouble) {
    const VecF32 *S = kvp::kern::vec_f32_scalar();
    ref::Rng g(3);
    for (bool gptj : {false, true})
        for (uint32_t pairs : {1u, 3u, 4u, 7u, 8u, 9u, 15u, 16u, 17u, 32u, 64u, 65u})
            for (uint32_t rows : {1u, 2u, 5u}) {
                const size_t ld = 2 * pairs + 5;  // rows padded; cols past 2*pairs must not change
                const std::vector<float> cs = table(pairs, 1234.5 + pairs);
                std::vector<float> x(rows * ld);
                for (float &f : x) f = g.uniform(-3, 3);
                std::vector<float> want = x;
                (gptj ? S->rope_gptj : S->rope_neox)(cs.data(), want.data(), rows, ld, pairs);
                for (uint32_t r = 0; r < rows; ++r) {  // reference vs double, padding untouched
                    for (uint32_t i = 0; i < pairs; ++i) {
                        const size_t a = r * ld + (gptj ? 2 * i : i), b = r * ld + (gptj ? 2 * i + 1 : i + pairs);
                        const double c = cs[2 * i], s = cs[2 * i + 1];
                        EXPECT_NEAR(want[a], double(x[a]) * c - double(x[b]) * s, 1e-5);
                        EXPECT_NEAR(want[b], double(x[a]) * s + double(x[b]) * c, 1e-5);
                    }
                    for (size_t j = r * ld + 2 * pairs; j < (r + 1) * ld; ++j) EXPECT_EQ(want[j], x[j]);
                }
                for (const VecF32 *V : variants()) {
                    std::vector<float> got = x;
                    (gptj ? V->rope_gptj : V->rope_neox)(cs.data(), got.data(), rows, ld, pairs);
                    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                        << V->name << (gptj ? " gptj" : " neox") << " pairs=" << pairs << " rows=" << rows;
                }
            }
}

TEST(VecKernels, FirstOutOfRangeFindsTheFirst) {
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::signaling_NaN(),
                         72057594037927936.0f /* 2^56 */, -72057594037927936.0f, std::numeric_limits<float>::max()};
    std::vector<const VecF32 *> all = variants();
    all.push_back(kvp::kern::vec_f32_scalar());
    for (const VecF32 *V : all)
        for (size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 64u, 100u, 1000u}) {
            std::vector<float> x(n);
            ref::Rng g(n);
            for (float &f : x) f = g.uniform(-1e16f, 1e16f);
            if (n) x[n / 2] = std::nextafter(72057594037927936.0f, 0.0f);  // the largest accepted magnitude
            if (n > 2) x[n / 4] = -std::nextafter(72057594037927936.0f, 0.0f);
            if (n > 1) x[n / 3] = std::numeric_limits<float>::denorm_min();
            EXPECT_EQ(V->first_out_of_range(x.data(), n), n) << V->name << " n=" << n;
            for (size_t at : {size_t(0), n / 2, n ? n - 1 : 0})
                for (float b : bad) {
                    if (!n) continue;
                    std::vector<float> y = x;
                    y[at] = b;
                    if (at + 5 < n) y[at + 5] = b;  // a later one must not be reported
                    EXPECT_EQ(V->first_out_of_range(y.data(), n), at) << V->name << " n=" << n << " at=" << at;
                }
        }
}

TEST(VecKernels, Dispatch) {
    const VecF32 *b = kvp::kern::vec_f32_best();
    ASSERT_NE(b, nullptr);
    EXPECT_TRUE(std::strcmp(b->name, "avx2") == 0 || std::strcmp(b->name, "simde") == 0 ||
                std::strcmp(b->name, "scalar") == 0);
}

}  // namespace
