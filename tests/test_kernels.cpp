// fp32 attention kernels: every variant against the scalar reference, the scalar reference
// against double precision, exp_approx against std::exp, edge cases (n = 0, -inf, odd d,
// padded leading dimensions).
#include "kernels/attn_f32.h"
#include "kernels/score_f32.h"
#include "reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using kvp::kern::AttnF32;
using kvp::kern::ScoreF32;

namespace {

using ref::Rng;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

std::vector<const AttnF32 *> simd_variants() {
    std::vector<const AttnF32 *> v;
    v.push_back(kvp::kern::attn_f32_simde());
    if (kvp::kern::attn_f32_avx2()) v.push_back(kvp::kern::attn_f32_avx2());
    if (kvp::kern::attn_f32_avx512()) v.push_back(kvp::kern::attn_f32_avx512());
    return v;
}

// The scoring kernels' variant with the same summation order as an attention variant.
const ScoreF32 *score_for(const AttnF32 *a) {
    const std::string n = a->name;
    if (n == "scalar") return kvp::kern::score_f32_scalar();
    if (n == "simde") return kvp::kern::score_f32_simde();
    return kvp::kern::score_f32_avx2();  // avx2 and avx512 (the avx512 attention runs avx2's order)
}

const uint32_t kDims[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129};
const uint32_t kNs[] = {0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 130};
const uint32_t kMaxRows = 9;

// A rows x ld matrix: the first `cols` of each row random, the padding NaN (a kernel that
// reads past `cols` poisons its result). Sized exactly: the last row ends at `cols`, so a
// read past the end is caught by ASan (KVP_SANITIZE builds).
std::vector<float> matrix(Rng &g, uint32_t rows, uint32_t cols, size_t ld, float lo, float hi) {
    std::vector<float> m(rows ? (size_t)(rows - 1) * ld + cols : 0, kNaN);
    for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t c = 0; c < cols; ++c) m[(size_t)r * ld + c] = g.uniform(lo, hi);
    return m;
}

// Problem for qk / pv with odd, distinct padded leading dimensions.
struct Case {
    uint32_t d, rows, n;
    size_t ldq, ldk, ldl;
};
Case make_case(uint32_t d, uint32_t rows, uint32_t n) {
    return Case{d, rows, n, (size_t)d + 3, (size_t)d + 5, (size_t)n + 7};
}

// ---- qk ---------------------------------------------------------------------------------

struct QkData {
    std::vector<float> q, k;
};
QkData qk_data(const Case &c, uint64_t seed) {
    Rng g(seed);
    QkData x;
    x.q = matrix(g, c.rows, c.d, c.ldq, -1.0f, 1.0f);
    x.k = matrix(g, c.n, c.d, c.ldk, -1.0f, 1.0f);
    return x;
}

// Output buffer: padding and tail filled with a sentinel that must survive.
const float kSentinel = -12345.0f;
std::vector<float> out_buffer(uint32_t rows, size_t ld) {
    return std::vector<float>((size_t)(rows + 1) * ld, kSentinel);
}
void expect_padding_untouched(const std::vector<float> &b, uint32_t rows, uint32_t cols, size_t ld,
                              const std::string &what) {
    for (size_t i = 0; i < b.size(); ++i) {
        const size_t r = i / ld, c = i % ld;
        if (r < rows && c < cols) continue;
        if (!(b[i] == kSentinel)) {
            ADD_FAILURE() << what << ": wrote outside the output at row " << r << " col " << c;
            return;
        }
    }
}

// sum_i |q_i k_i| * |scale|: the magnitude that bounds the rounding error of the dot product.
double qk_mag(const QkData &x, const Case &c, uint32_t r, uint32_t t, float scale) {
    double m = 0;
    for (uint32_t i = 0; i < c.d; ++i)
        m += std::fabs((double)x.q[r * c.ldq + i] * (double)x.k[t * c.ldk + i]);
    return m * std::fabs((double)scale);
}

TEST(Kernels, ScalarQkMatchesDouble) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    const float scale = 0.0883883476f;  // 1/sqrt(128)
    for (uint32_t d : kDims)
        for (uint32_t rows = 1; rows <= kMaxRows; rows += 4)
            for (uint32_t n : kNs) {
                const Case c = make_case(d, rows, n);
                const QkData x = qk_data(c, 1000 + d * 31 + rows * 7 + n);
                std::vector<float> l = out_buffer(rows, c.ldl);
                ref->qk(x.q.data(), c.ldq, rows, x.k.data(), c.ldk, n, d, scale, l.data(), c.ldl);
                for (uint32_t r = 0; r < rows; ++r)
                    for (uint32_t t = 0; t < n; ++t) {
                        double s = 0;
                        for (uint32_t i = 0; i < d; ++i)
                            s += (double)x.q[r * c.ldq + i] * (double)x.k[t * c.ldk + i];
                        s *= scale;
                        // recursive float summation: |err| <= (d+1) u sum|q k|, u = 2^-24
                        ASSERT_NEAR(l[r * c.ldl + t], s, 1e-5 * qk_mag(x, c, r, t, scale) + 1e-30)
                            << "d=" << d << " rows=" << rows << " n=" << n << " r=" << r << " t=" << t;
                    }
                expect_padding_untouched(l, rows, n, c.ldl, "scalar qk");
            }
}

TEST(Kernels, QkVariantsMatchScalar) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    const float scale = 0.125f;
    for (const AttnF32 *var : simd_variants())
        for (uint32_t d : kDims)
            for (uint32_t rows = 1; rows <= kMaxRows; ++rows)
                for (uint32_t n : kNs) {
                    const Case c = make_case(d, rows, n);
                    const QkData x = qk_data(c, 7 + d * 1000 + rows * 100 + n);
                    std::vector<float> want = out_buffer(rows, c.ldl), got = out_buffer(rows, c.ldl);
                    ref->qk(x.q.data(), c.ldq, rows, x.k.data(), c.ldk, n, d, scale, want.data(), c.ldl);
                    var->qk(x.q.data(), c.ldq, rows, x.k.data(), c.ldk, n, d, scale, got.data(), c.ldl);
                    for (uint32_t r = 0; r < rows; ++r)
                        for (uint32_t t = 0; t < n; ++t)
                            ASSERT_NEAR(got[r * c.ldl + t], want[r * c.ldl + t],
                                        1e-5 * qk_mag(x, c, r, t, scale) + 1e-30)
                                << var->name << " d=" << d << " rows=" << rows << " n=" << n
                                << " r=" << r << " t=" << t;
                    expect_padding_untouched(got, rows, n, c.ldl, var->name);
                }
}

// The SIMD variants use one summation order per logit whatever the blocking (4-row blocks,
// aliased remainder rows, the single-row path, odd n): a logit is bit-identical whether it
// is computed alone or inside a larger call.
TEST(Kernels, QkLogitIndependentOfBatching) {
    for (const AttnF32 *var : simd_variants())
        for (uint32_t d : {7u, 24u, 33u, 47u, 128u}) {
            const Case c = make_case(d, kMaxRows, 65);
            const QkData x = qk_data(c, 99 + d);
            std::vector<float> all = out_buffer(c.rows, c.ldl);
            var->qk(x.q.data(), c.ldq, c.rows, x.k.data(), c.ldk, c.n, d, 0.5f, all.data(), c.ldl);
            for (uint32_t r = 0; r < c.rows; ++r)
                for (uint32_t t = 0; t < c.n; t += 5) {
                    float one = 0;
                    var->qk(&x.q[r * c.ldq], c.ldq, 1, &x.k[t * c.ldk], c.ldk, 1, d, 0.5f, &one, 1);
                    ASSERT_EQ(std::memcmp(&one, &all[r * c.ldl + t], sizeof one), 0)
                        << var->name << " d=" << d << " r=" << r << " t=" << t << ": " << one
                        << " vs " << all[r * c.ldl + t];
                }
        }
}

// ---- pv ---------------------------------------------------------------------------------

struct PvData {
    std::vector<float> p, v, o;
};
PvData pv_data(const Case &c, uint64_t seed, size_t ldp, size_t ldv, size_t ldo) {
    Rng g(seed);
    PvData x;
    x.p = matrix(g, c.rows, c.n, ldp, 0.0f, 1.0f);
    x.v = matrix(g, c.n, c.d, ldv, -2.0f, 2.0f);
    x.o = out_buffer(c.rows, ldo);
    for (uint32_t r = 0; r < c.rows; ++r)
        for (uint32_t j = 0; j < c.d; ++j) x.o[r * ldo + j] = g.uniform(-1.0f, 1.0f);  // o += ...
    return x;
}

TEST(Kernels, PvVariantsMatchScalarAndDouble) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    std::vector<const AttnF32 *> all = simd_variants();
    all.insert(all.begin(), ref);
    for (uint32_t d : kDims)
        for (uint32_t rows = 1; rows <= kMaxRows; ++rows)
            for (uint32_t n : kNs) {
                const Case c = make_case(d, rows, n);
                const size_t ldp = n + 1, ldv = d + 2, ldo = d + 9;
                const PvData x = pv_data(c, 5 + d * 1000 + rows * 100 + n, ldp, ldv, ldo);
                // double-precision reference and the error magnitude |o| + sum |p v|
                std::vector<double> exact((size_t)rows * d), mag((size_t)rows * d);
                for (uint32_t r = 0; r < rows; ++r)
                    for (uint32_t j = 0; j < d; ++j) {
                        double s = x.o[r * ldo + j], m = std::fabs(s);
                        for (uint32_t t = 0; t < n; ++t) {
                            const double pv = (double)x.p[r * ldp + t] * (double)x.v[t * ldv + j];
                            s += pv;
                            m += std::fabs(pv);
                        }
                        exact[r * d + j] = s;
                        mag[r * d + j] = m;
                    }
                std::vector<float> want = x.o;
                ref->pv(x.p.data(), ldp, rows, x.v.data(), ldv, n, d, want.data(), ldo);
                for (const AttnF32 *var : all) {
                    std::vector<float> got = x.o;
                    var->pv(x.p.data(), ldp, rows, x.v.data(), ldv, n, d, got.data(), ldo);
                    for (uint32_t r = 0; r < rows; ++r)
                        for (uint32_t j = 0; j < d; ++j) {
                            const double tol = 1e-5 * mag[r * d + j] + 1e-30;
                            // vs double: rigorous for recursive summation (n+1) u sum|.|, n <= 130
                            ASSERT_NEAR(got[r * ldo + j], exact[r * d + j], tol)
                                << var->name << " d=" << d << " rows=" << rows << " n=" << n
                                << " r=" << r << " j=" << j;
                            ASSERT_NEAR(got[r * ldo + j], want[r * ldo + j], tol)
                                << var->name << " d=" << d << " rows=" << rows << " n=" << n
                                << " r=" << r << " j=" << j;
                        }
                    expect_padding_untouched(got, rows, d, ldo, var->name);
                }
            }
}

TEST(Kernels, PvRowIndependentOfBatching) {
    for (const AttnF32 *var : simd_variants())
        for (uint32_t d : {7u, 24u, 33u, 47u, 128u}) {
            const Case c = make_case(d, kMaxRows, 130);
            const size_t ldp = c.n, ldv = d, ldo = d;
            const PvData x = pv_data(c, 123 + d, ldp, ldv, ldo);
            std::vector<float> all = x.o;
            var->pv(x.p.data(), ldp, c.rows, x.v.data(), ldv, c.n, d, all.data(), ldo);
            for (uint32_t r = 0; r < c.rows; ++r) {
                std::vector<float> one(x.o.begin() + r * ldo, x.o.begin() + r * ldo + d);
                var->pv(&x.p[r * ldp], ldp, 1, x.v.data(), ldv, c.n, d, one.data(), ldo);
                ASSERT_EQ(std::memcmp(one.data(), &all[r * ldo], d * sizeof(float)), 0)
                    << var->name << " d=" << d << " r=" << r;
            }
        }
}

// The core calls pv once per contiguous run of slots: splitting n into consecutive calls (at
// any point, inside or across the V tiles and 4-key blocks) gives the same bits, for every
// variant including the scalar reference. The same for qk: a run's logits do not depend on
// where the run starts.
TEST(Kernels, SplitCallsBitIdentical) {
    std::vector<const AttnF32 *> all = simd_variants();
    all.insert(all.begin(), kvp::kern::attn_f32_scalar());
    for (const AttnF32 *var : all)
        for (uint32_t d : {7u, 33u, 64u, 128u})
            for (uint32_t rows : {1u, 3u, 4u, 8u}) {
                const uint32_t n = 150;
                const Case c = make_case(d, rows, n);
                const size_t ldp = n + 1, ldv = d + 2, ldo = d + 3;
                const PvData x = pv_data(c, 900 + d + rows, ldp, ldv, ldo);
                const QkData y = qk_data(c, 901 + d + rows);
                std::vector<float> whole = x.o;
                var->pv(x.p.data(), ldp, rows, x.v.data(), ldv, n, d, whole.data(), ldo);
                std::vector<float> lw = out_buffer(rows, c.ldl);
                var->qk(y.q.data(), c.ldq, rows, y.k.data(), c.ldk, n, d, 0.7f, lw.data(), c.ldl);
                for (uint32_t cut : {1u, 5u, 16u, 31u, 33u, 64u, 97u}) {
                    const uint32_t cuts[] = {0, cut, cut + 17 < n ? cut + 17 : n, n};
                    std::vector<float> parts = x.o;
                    std::vector<float> lp = out_buffer(rows, c.ldl);
                    for (int i = 0; i < 3; ++i) {
                        const uint32_t a = cuts[i], b = cuts[i + 1];
                        var->pv(x.p.data() + a, ldp, rows, x.v.data() + (size_t)a * ldv, ldv, b - a, d, parts.data(), ldo);
                        var->qk(y.q.data(), c.ldq, rows, y.k.data() + (size_t)a * c.ldk, c.ldk, b - a, d, 0.7f,
                                lp.data() + a, c.ldl);
                    }
                    ASSERT_EQ(std::memcmp(parts.data(), whole.data(), whole.size() * sizeof(float)), 0)
                        << var->name << " pv d=" << d << " rows=" << rows << " cut=" << cut;
                    ASSERT_EQ(std::memcmp(lp.data(), lw.data(), lw.size() * sizeof(float)), 0)
                        << var->name << " qk d=" << d << " rows=" << rows << " cut=" << cut;
                }
            }
}

// ---- max / expsum -----------------------------------------------------------------------

TEST(Kernels, MaxMatchesScalar) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    std::vector<const AttnF32 *> all = simd_variants();
    all.insert(all.begin(), ref);
    for (const AttnF32 *var : all) {
        EXPECT_EQ(var->max(nullptr, 0), -kInf) << var->name;
        for (uint32_t n = 1; n <= 70; ++n) {
            Rng g(n);
            std::vector<float> x(n + 1);
            for (float &e : x) e = g.uniform(-50.0f, 50.0f);
            x[n] = 1e30f;  // past the end: must not be read
            const uint32_t at = (uint32_t)(g.next() % n);
            x[at] = 60.0f;  // unique maximum somewhere, also in the tail
            EXPECT_EQ(var->max(x.data(), n), 60.0f) << var->name << " n=" << n << " at=" << at;
            EXPECT_EQ(var->max(x.data(), n), ref->max(x.data(), n)) << var->name << " n=" << n;
            std::vector<float> ninf(n, -kInf);  // fully masked row
            ninf[n - 1] = (n % 2) ? -kInf : -3.0f;
            EXPECT_EQ(var->max(ninf.data(), n), (n % 2) ? -kInf : -3.0f) << var->name << " n=" << n;
        }
    }
}

// |a - b| / b for positive b, with b from double exp
double rel_err(float a, double b) { return std::fabs((double)a - b) / b; }

// Cephes expf is ~1 ulp on its range. Measured over 4M points of [-87.3, 88.3]: max relative
// error 8.0e-8 (scalar, simde) and 8.3e-8 (avx2, whose FMA evaluation of the same polynomial
// rounds differently), i.e. < 1 ulp everywhere. The bound is 2^-22 ~ 2.4e-7: two ulps where the
// relative spacing of floats is widest, so it holds for any correct evaluation order, while a
// wrong coefficient, range-reduction constant or exponent build gives >= 1e-6.
const double kExpRelTol = 2.384185791015625e-7;

TEST(Kernels, ExpApproxMatchesStdExp) {
    using kvp::kern::exp_approx;
    EXPECT_EQ(exp_approx(-kInf), 0.0f);
    EXPECT_EQ(exp_approx(-100.0f), 0.0f);
    EXPECT_EQ(exp_approx(-1e30f), 0.0f);
    EXPECT_EQ(exp_approx(-87.5f), 0.0f);  // below ln(FLT_MIN): flushed
    EXPECT_EQ(exp_approx(0.0f), 1.0f);
    EXPECT_LT(rel_err(exp_approx(88.0f), std::exp(88.0)), kExpRelTol);
    EXPECT_LT(rel_err(exp_approx(-87.0f), std::exp(-87.0)), kExpRelTol);
    EXPECT_TRUE(std::isfinite(exp_approx(1000.0f)));  // saturates, never inf
    EXPECT_GT(exp_approx(1000.0f), 1e38f);
    double worst = 0, worst_x = 0;
    const int steps = 2000000;
    for (int i = 0; i <= steps; ++i) {
        const float x = -87.3f + (88.3f + 87.3f) * (float)i / (float)steps;
        const double e = rel_err(exp_approx(x), std::exp((double)x));
        if (e > worst) worst = e, worst_x = x;
    }
    for (int i = -100000; i <= 100000; ++i) {  // dense near 0, where softmax weights live
        const float x = (float)i * 1e-5f;
        const double e = rel_err(exp_approx(x), std::exp((double)x));
        if (e > worst) worst = e, worst_x = x;
    }
    EXPECT_LT(worst, kExpRelTol) << "at x=" << worst_x;
    RecordProperty("exp_approx_max_rel_err_e9", std::to_string((long long)(worst * 1e9)));
}

TEST(Kernels, ExpsumMatchesScalarAndStdExp) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    std::vector<const AttnF32 *> all = simd_variants();
    all.insert(all.begin(), ref);
    for (const AttnF32 *var : all) {
        // n = 0: returns 0 and touches nothing
        float untouched = 7.0f, sq0 = 5.0f;
        EXPECT_EQ(var->expsum(&untouched, 0, 1.0f, nullptr), 0.0f) << var->name;
        EXPECT_EQ(untouched, 7.0f) << var->name;
        EXPECT_EQ(var->expsum(nullptr, 0, -kInf, &sq0), 0.0f) << var->name;
        EXPECT_EQ(sq0, 0.0f) << var->name << ": n = 0 gives a sum of squares of 0";
        for (uint32_t n = 1; n <= 70; ++n) {
            Rng g(1000 + n);
            std::vector<float> x(n + 1);
            for (uint32_t i = 0; i < n; ++i) x[i] = g.uniform(-20.0f, 10.0f);
            x[g.next() % n] = -kInf;     // masked position
            x[g.next() % n] = -150.0f;   // x - m far below ln(FLT_MIN)
            x[n] = kNaN;                  // past the end: must not be read or written
            const float m = ref->max(x.data(), n);
            std::vector<float> want = x, got = x;
            float qwant = kNaN, qgot = kNaN;
            const float swant = ref->expsum(want.data(), n, m, &qwant);
            const float sgot = var->expsum(got.data(), n, m, &qgot);
            // Without the sum of squares: the same values and sum, bit for bit.
            std::vector<float> plain = x;
            const float splain = var->expsum(plain.data(), n, m, nullptr);
            ASSERT_EQ(std::memcmp(&splain, &sgot, sizeof sgot), 0) << var->name << " n=" << n;
            ASSERT_EQ(std::memcmp(plain.data(), got.data(), n * sizeof(float)), 0) << var->name << " n=" << n;
            // The sum of squares is the scoring kernels' sumsq of the new row, bit for bit, for
            // the variant of the same arithmetic (the scalar one for the scalar reference, simde
            // for simde, the avx2 order for avx2 and avx512); decode's Hoyer figure relies on it.
            const ScoreF32 *sk = score_for(var);
            const float qsep = sk->sumsq(got.data(), n);
            EXPECT_EQ(std::memcmp(&qsep, &qgot, sizeof qgot), 0)
                << var->name << " vs " << sk->name << " n=" << n << ": " << qgot << " != " << qsep;
            double exact_sq = 0;
            for (uint32_t i = 0; i < n; ++i) exact_sq += (double)got[i] * got[i];
            EXPECT_NEAR(qgot, exact_sq, 1e-6 * exact_sq) << var->name << " n=" << n;
            EXPECT_NEAR(qgot, qwant, 1e-5 * qwant) << var->name << " n=" << n;
            double exact_sum = 0;
            for (uint32_t i = 0; i < n; ++i) {
                const float arg = x[i] - m;
                const double e = std::exp((double)arg);
                exact_sum += e;
                ASSERT_FALSE(std::isnan(got[i])) << var->name;
                if (arg < -87.3365f) {
                    ASSERT_EQ(got[i], 0.0f) << var->name << " n=" << n << " i=" << i << " arg=" << arg;
                } else {
                    ASSERT_LT(rel_err(got[i], e), kExpRelTol) << var->name << " n=" << n << " i=" << i;
                    ASSERT_LE(std::fabs(got[i] - want[i]), 2 * kExpRelTol * want[i]) << var->name;
                }
            }
            ASSERT_TRUE(std::isnan(got[n])) << var->name << ": wrote past the end";
            EXPECT_NEAR(sgot, exact_sum, 1e-5 * exact_sum) << var->name << " n=" << n;
            EXPECT_NEAR(sgot, swant, 1e-5 * swant) << var->name << " n=" << n;
            EXPECT_GE(sgot, 1.0f - 1e-6f) << var->name;  // the max contributes exp(0) = 1
        }
        // x - m above the range saturates (finite, no inf or NaN), as exp_approx does
        float big[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
        const float sbig = var->expsum(big, 9, -1000.0f, nullptr);
        EXPECT_TRUE(std::isfinite(big[0]) && std::isfinite(big[8])) << var->name;
        const float sat = kvp::kern::exp_approx(1000.0f);
        EXPECT_NEAR(big[0], sat, kExpRelTol * sat) << var->name;
        EXPECT_NEAR(big[8], sat, kExpRelTol * sat) << var->name;
        EXPECT_FALSE(std::isnan(sbig)) << var->name;
    }
}

// ---- merge --------------------------------------------------------------------------------

// The split-K merge rounds every product and sum on its own, in chunk order: every variant
// gives the scalar reference's bits, for odd widths, one chunk and many, padded strides.
TEST(Kernels, MergeBitIdenticalToScalar) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    const uint32_t nchs[] = {1, 2, 3, 8, 17};
    for (const AttnF32 *var : simd_variants())
        for (uint32_t d : kDims)
            for (uint32_t nch : nchs) {
                const size_t ldo = d + 5, ldw = 3;
                Rng g(d * 100 + nch);
                std::vector<float> o(nch * ldo, kNaN), w(nch * ldw, kNaN);  // padding: NaN
                for (uint32_t c = 0; c < nch; ++c) {
                    for (uint32_t j = 0; j < d; ++j) o[c * ldo + j] = g.uniform(-3.0f, 3.0f);
                    w[c * ldw] = c == 0 ? 1.0f : g.uniform(0.0f, 1.0f);
                }
                const float scale = g.uniform(0.01f, 2.0f);
                std::vector<float> want(d + 1, 7.0f), got(d + 1, 7.0f);
                ref->merge(o.data(), ldo, w.data(), ldw, nch, scale, d, want.data());
                var->merge(o.data(), ldo, w.data(), ldw, nch, scale, d, got.data());
                ASSERT_EQ(std::memcmp(want.data(), got.data(), d * sizeof(float)), 0)
                    << var->name << " d=" << d << " nch=" << nch;
                ASSERT_EQ(got[d], 7.0f) << var->name << ": wrote past d";
                // The reference is the documented sum (mul, then add, in chunk order).
                for (uint32_t j = 0; j < d; ++j) {
                    volatile float s = w[0] * o[j];
                    for (uint32_t c = 1; c < nch; ++c) {
                        volatile float p = w[c * ldw] * o[c * ldo + j];
                        s = s + p;
                    }
                    volatile float r = s * scale;
                    ASSERT_EQ(want[j], (float)r) << "scalar merge d=" << d << " nch=" << nch << " j=" << j;
                }
            }
}

// ---- full softmax attention through the kernels vs double --------------------------------

TEST(Kernels, AttentionPipelineMatchesDouble) {
    const uint32_t d = 128, rows = 4, n = 300;
    const float scale = 1.0f / std::sqrt((float)d);
    Rng g(42);
    std::vector<float> q((size_t)rows * d), k((size_t)n * d), v((size_t)n * d);
    for (float &e : q) e = g.uniform(-2.0f, 2.0f);
    for (float &e : k) e = g.uniform(-2.0f, 2.0f);
    for (float &e : v) e = g.uniform(-1.0f, 1.0f);
    std::vector<double> exact((size_t)rows * d, 0.0);
    for (uint32_t r = 0; r < rows; ++r) {
        std::vector<double> w(n);
        double mx = -1e300, sum = 0;
        for (uint32_t t = 0; t < n; ++t) {
            double s = 0;
            for (uint32_t i = 0; i < d; ++i) s += (double)q[r * d + i] * k[t * d + i];
            w[t] = s * scale;
            mx = std::max(mx, w[t]);
        }
        for (uint32_t t = 0; t < n; ++t) sum += (w[t] = std::exp(w[t] - mx));
        for (uint32_t t = 0; t < n; ++t)
            for (uint32_t j = 0; j < d; ++j) exact[r * d + j] += w[t] / sum * v[t * d + j];
    }
    std::vector<const AttnF32 *> all = simd_variants();
    all.insert(all.begin(), kvp::kern::attn_f32_scalar());
    for (const AttnF32 *var : all) {
        std::vector<float> logits((size_t)rows * n), out((size_t)rows * d, 0.0f);
        var->qk(q.data(), d, rows, k.data(), d, n, d, scale, logits.data(), n);
        for (uint32_t r = 0; r < rows; ++r) {
            float *lr = &logits[(size_t)r * n];
            const float s = var->expsum(lr, n, var->max(lr, n), nullptr);
            for (uint32_t t = 0; t < n; ++t) lr[t] /= s;
        }
        var->pv(logits.data(), n, rows, v.data(), d, n, d, out.data(), d);
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], exact[i], 2e-6) << var->name << " i=" << i;
    }
}

// ---- avx512 = avx2, bit for bit -----------------------------------------------------------

// The avx512 variant runs the avx2 arithmetic in the same order with wider blocks (qk 4x4
// key blocks, 16-lane pv FMAs): every op must give the same bits as avx2, for every shape
// (rows 1..9, n around the 4-key blocks and the 32-row V tiles, odd and padded dims).
TEST(Kernels, Avx512BitIdenticalToAvx2) {
    const AttnF32 *a2 = kvp::kern::attn_f32_avx2(), *a5 = kvp::kern::attn_f32_avx512();
    if (!a2 || !a5) GTEST_SKIP() << "avx512 variant not available on this CPU/build";
    const uint32_t dims[] = {1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 63, 64, 65, 79, 96, 127, 128, 129, 192};
    const uint32_t ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 63, 64, 65, 100};
    for (uint32_t d : dims)
        for (uint32_t rows = 1; rows <= kMaxRows; ++rows)
            for (uint32_t n : ns) {
                const Case c = make_case(d, rows, n);
                const QkData x = qk_data(c, 31 + d * 1000 + rows * 100 + n);
                std::vector<float> l2 = out_buffer(rows, c.ldl), l5 = out_buffer(rows, c.ldl);
                a2->qk(x.q.data(), c.ldq, rows, x.k.data(), c.ldk, n, d, 0.3f, l2.data(), c.ldl);
                a5->qk(x.q.data(), c.ldq, rows, x.k.data(), c.ldk, n, d, 0.3f, l5.data(), c.ldl);
                ASSERT_EQ(std::memcmp(l2.data(), l5.data(), l2.size() * sizeof(float)), 0)
                    << "qk d=" << d << " rows=" << rows << " n=" << n;
                const size_t ldp = n + 3, ldv = d + 1, ldo = d + 5;
                const PvData y = pv_data(c, 77 + d * 1000 + rows * 100 + n, ldp, ldv, ldo);
                std::vector<float> o2 = y.o, o5 = y.o;
                a2->pv(y.p.data(), ldp, rows, y.v.data(), ldv, n, d, o2.data(), ldo);
                a5->pv(y.p.data(), ldp, rows, y.v.data(), ldv, n, d, o5.data(), ldo);
                ASSERT_EQ(std::memcmp(o2.data(), o5.data(), o2.size() * sizeof(float)), 0)
                    << "pv d=" << d << " rows=" << rows << " n=" << n;
            }
    for (uint32_t n = 0; n <= 70; ++n) {
        Rng g(5000 + n);
        std::vector<float> x(n);
        for (float &e : x) e = g.uniform(-30.0f, 5.0f);
        EXPECT_EQ(a2->max(x.data(), n), a5->max(x.data(), n)) << "n=" << n;
        std::vector<float> e2 = x, e5 = x;
        float q2 = 0, q5 = 0;
        const float s2 = a2->expsum(e2.data(), n, 5.0f, &q2), s5 = a5->expsum(e5.data(), n, 5.0f, &q5);
        EXPECT_EQ(std::memcmp(&s2, &s5, sizeof s2), 0) << "n=" << n;
        EXPECT_EQ(std::memcmp(&q2, &q5, sizeof q2), 0) << "n=" << n;
        if (n) {
            EXPECT_EQ(std::memcmp(e2.data(), e5.data(), n * sizeof(float)), 0) << "n=" << n;
        }
    }
}

// ---- softcap ----------------------------------------------------------------------------

// ulps between two floats of the same sign (both finite): the distance of their bit patterns.
int64_t ulp_dist(float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;  // monotone map of the sign-magnitude pattern
    if (ib < 0) ib = INT32_MIN - ib;
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

// tanh_approx against tanh in double: at most 2 ulp of the float result (measured: 1 ulp at
// worst over the grid below and 1M random points), +-1 for |x| >= 9.1, odd, 0 at 0.
TEST(Kernels, TanhApproxBound) {
    int64_t worst = 0;
    float at = 0;
    auto check = [&](float x) {
        const float want = (float)std::tanh((double)x), got = kvp::kern::tanh_approx(x);
        const int64_t u = ulp_dist(want, got);
        if (u > worst) worst = u, at = x;
        ASSERT_EQ(kvp::kern::tanh_approx(-x), -got) << x;  // odd, bit for bit
    };
    for (float x = 0.0f; x < 12.0f; x = std::nextafter(x + 1e-5f * x, 100.0f)) check(x);  // relative steps
    Rng g(99);
    for (int i = 0; i < 1000000; ++i) check(g.uniform(-10.0f, 10.0f));
    for (float x : {1e-30f, 1e-8f, 0.6249999f, 0.625f, 0.6250001f, 9.0f, 9.1f, 50.0f, 1e30f}) check(x);
    EXPECT_LE(worst, 2) << "worst at x=" << at;
    EXPECT_EQ(kvp::kern::tanh_approx(9.1f), 1.0f);
    EXPECT_EQ(kvp::kern::tanh_approx(1e30f), 1.0f);
    EXPECT_EQ(kvp::kern::tanh_approx(0.0f), 0.0f);
    EXPECT_TRUE(std::signbit(kvp::kern::tanh_approx(-0.0f)));
}

// softcap: every variant the scalar reference's bits (the same float ops lane by lane), for
// lengths below, equal to and above the vector width, caps 1 / 5 / 30 / 50; the scalar
// reference within 4 ulp of cap * tanh(x / cap) in double (measured: 3); large logits saturate at +-cap.
TEST(Kernels, SoftcapMatchesScalarBitForBit) {
    const AttnF32 *ref = kvp::kern::attn_f32_scalar();
    ASSERT_NE(ref->softcap, nullptr);
    std::vector<const AttnF32 *> all = simd_variants();
    int64_t worst = 0;
    for (float cap : {1.0f, 5.0f, 30.0f, 50.0f})
        for (uint32_t n : {0u, 1u, 3u, 7u, 8u, 9u, 15u, 16u, 17u, 33u, 100u, 1000u}) {
            Rng g(n * 7 + (uint32_t)cap);
            std::vector<float> x(n + 1);
            for (float &e : x) e = g.uniform(-4.0f * cap, 4.0f * cap);
            if (n > 2) x[1] = 0.0f, x[2] = 1e6f;  // zero, far above the cap
            x[n] = 12345.0f;                      // past the end: must stay
            std::vector<float> want = x;
            ref->softcap(want.data(), n, cap);
            EXPECT_EQ(want[n], 12345.0f);
            for (uint32_t i = 0; i < n; ++i) {
                const float exact = (float)((double)cap * std::tanh((double)x[i] / (double)cap));
                worst = std::max(worst, ulp_dist(exact, want[i]));
                EXPECT_LE(std::fabs(want[i]), cap);
            }
            if (n > 2) {
                EXPECT_EQ(want[1], 0.0f);
                EXPECT_EQ(want[2], cap);
            }
            for (const AttnF32 *var : all) {
                std::vector<float> got = x;
                var->softcap(got.data(), n, cap);
                ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                    << var->name << " cap=" << cap << " n=" << n;
            }
        }
    EXPECT_LE(worst, 4);
}

// ---- dispatch ---------------------------------------------------------------------------

TEST(Kernels, Dispatch) {
    EXPECT_STREQ(kvp::kern::attn_f32_scalar()->name, "scalar");
    EXPECT_STREQ(kvp::kern::attn_f32_simde()->name, "simde");
    const AttnF32 *best = kvp::kern::attn_f32_best();
    ASSERT_NE(best, nullptr);
    if (const AttnF32 *a = kvp::kern::attn_f32_avx512()) {
        EXPECT_STREQ(a->name, "avx512");
        EXPECT_EQ(best, a);
        EXPECT_NE(kvp::kern::attn_f32_avx2(), nullptr);  // avx512 implies the avx2 variant
    } else if (const AttnF32 *a2 = kvp::kern::attn_f32_avx2()) {
        EXPECT_STREQ(a2->name, "avx2");
        EXPECT_EQ(best, a2);
    } else {
        EXPECT_EQ(best, kvp::kern::attn_f32_simde());
    }
#if defined(__x86_64__) && defined(__GNUC__)
    // the avx2 variant is never returned on a CPU without AVX2+FMA, avx512 never without F+VL
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        EXPECT_EQ(kvp::kern::attn_f32_avx2(), nullptr);
        EXPECT_EQ(kvp::kern::attn_f32_avx512(), nullptr);
    }
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"))) {
        EXPECT_EQ(kvp::kern::attn_f32_avx512(), nullptr);
    }
#endif
    for (const AttnF32 *var : {kvp::kern::attn_f32_scalar(), kvp::kern::attn_f32_simde(), best}) {
        EXPECT_NE(var->qk, nullptr);
        EXPECT_NE(var->pv, nullptr);
        EXPECT_NE(var->max, nullptr);
        EXPECT_NE(var->expsum, nullptr);
        EXPECT_NE(var->merge, nullptr);
        EXPECT_NE(var->softcap, nullptr);
    }
}

}  // namespace
