// score=fixed (src/kernels/score_fixed.h): the deterministic math against libm, the exp tables
// against long double, the integer kernels against direct formulas, and h2o's eviction decisions
// step by step against an integer simulation written here independently from the documented
// format (its own quantizer, libm RoPE tables rounded to Q14, __int128 logits (64-bit hosts), its own exp
// tables): integers must agree exactly. Then ties by older position, saturation, and fixed vs
// float decisions on a random workload (fixed approximates float).
#include <gtest/gtest.h>
#include <math.h>

#include <algorithm>
#include <set>

#include "cache.h"
#include "kernels/score_fixed.h"
#include "reference.h"

namespace {

using namespace kvp;

TEST(FixedMath, DeterministicRoutinesMatchLibm) {
    double worst_log = 0, worst_exp = 0, worst_sc = 0, worst_sc_far = 0;
    ref::Rng rng(1);
    for (int i = 0; i < 20000; ++i) {
        const double x = ldexp(1.0 + rng.uniform(0, 1), int(rng.next() % 200) - 100);
        worst_log = std::max(worst_log, fabs(fixed::det_log2(x) - log2(x)));
        const double y = rng.uniform(-60, 60);
        worst_exp = std::max(worst_exp, fabs(fixed::det_exp2(y) / exp2(y) - 1));
        const double a = rng.uniform(0, 1e6);
        double s, c;
        fixed::det_sincos(a, &s, &c);
        worst_sc = std::max(worst_sc, std::max(fabs(s - sin(a)), fabs(c - cos(a))));
        const double b = rng.uniform(0, 2147483647.0);
        fixed::det_sincos(b, &s, &c);
        worst_sc_far = std::max(worst_sc_far, std::max(fabs(s - sin(b)), fabs(c - cos(b))));
    }
    EXPECT_LT(worst_log, 1e-13);
    EXPECT_LT(worst_exp, 1e-14);
    EXPECT_LT(worst_sc, 1e-9);
    EXPECT_LT(worst_sc_far, 1e-6);  // documented: positions up to 2^31 lose a little accuracy
    // rotation frequencies
    double f[16];
    fixed::rope_freqs(10000.0f, 16, f);
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(f[i] / pow(10000.0, -2.0 * i / 32.0), 1.0, 1e-14);
}

TEST(FixedMath, ExpTablesAndExp2Neg) {
    for (int i = 0; i < 256; ++i) {
        EXPECT_EQ(fixed::kExpHi[i], uint32_t(llroundl(exp2l(-i / 256.0L) * 1073741824.0L))) << i;
        EXPECT_EQ(fixed::kExpLo[i], uint32_t(llroundl(exp2l(-i / 65536.0L) * 1073741824.0L))) << i;
    }
    EXPECT_EQ(fixed::exp2_neg(0), 1u << 30);
    EXPECT_EQ(fixed::exp2_neg(int64_t(31) << 16), 0u);
    EXPECT_EQ(fixed::exp2_neg(int64_t(1) << 62), 0u);
    ref::Rng rng(2);
    for (int i = 0; i < 100000; ++i) {
        const int64_t g = int64_t(rng.next() % (int64_t(20) << 16));
        const double want = exp2(-double(g) / 65536.0) * 1073741824.0;
        ASSERT_LE(fabs(double(fixed::exp2_neg(g)) - want), 1.0 + 2e-6 * want) << g;  // table error + the floor of the shift
    }
}

TEST(FixedMath, QuantizeRotateLogit) {
    ref::Rng rng(3);
    std::vector<float> x(40);
    std::vector<int16_t> v(40), r(40);
    for (int round = 0; round < 500; ++round) {
        const float scale = ldexpf(1.0f, int(rng.next() % 60) - 30);
        rng.fill(x, -scale, scale);
        const int32_t e = fixed::quantize_row(x.data(), 40, v.data());
        int mx = 0;
        for (int i = 0; i < 40; ++i) {
            mx = std::max(mx, std::abs(int(v[i])));
            ASSERT_LE(fabs(double(v[i]) * ldexp(1.0, e) - double(x[i])), ldexp(1.0, e - 1) * 1.000001);
        }
        ASSERT_LE(mx, 16384);
        ASSERT_GT(mx, 4096);  // the full range is used
    }
    std::vector<float> z(8, 0.0f), tiny(8, 1e-35f);
    int16_t zq[8];
    EXPECT_EQ(fixed::quantize_row(z.data(), 8, zq), 0);
    EXPECT_EQ(fixed::quantize_row(tiny.data(), 8, zq), 0);
    for (int16_t s : zq) EXPECT_EQ(s, 0);
    // rotation: integer vs exact, both styles, partial rotary (dims past 2*pairs untouched)
    double fr[16];
    fixed::rope_freqs(10000.0f, 16, fr);
    for (kvp_rope_style st : {KVP_ROPE_GPTJ, KVP_ROPE_NEOX}) {
        rng.fill(x, -1, 1);
        fixed::quantize_row(x.data(), 40, v.data());
        int16_t cs[32];
        fixed::rope_table(fr, 16, 777, cs);
        fixed::rotate(st, 16, cs, v.data(), r.data(), 40);
        for (int i = 0; i < 16; ++i) {
            const int a = st == KVP_ROPE_GPTJ ? 2 * i : i, b = st == KVP_ROPE_GPTJ ? 2 * i + 1 : i + 16;
            const double ang = 777.0 * fr[i];
            EXPECT_NEAR(r[a], v[a] * cos(ang) - v[b] * sin(ang), 2.5);
            EXPECT_NEAR(r[b], v[a] * sin(ang) + v[b] * cos(ang), 2.5);
        }
        for (int i = 32; i < 40; ++i) EXPECT_EQ(r[i], v[i]);
    }
    // logits floor and saturate
    const int64_t K = fixed::logit_scale(64);
    EXPECT_EQ(K, llround(1048576.0 * M_LOG2E / 8.0));
    EXPECT_EQ(fixed::logit(1000, K, -10), int64_t(floor(1000.0 * K / 16384.0)));
    EXPECT_EQ(fixed::logit(-1000, K, -10), int64_t(floor(-1000.0 * K / 16384.0)));
    EXPECT_EQ(fixed::logit(-1, 1, -100), -1);
    EXPECT_EQ(fixed::logit(1, 1, -100), 0);
    EXPECT_EQ(fixed::logit(int64_t(1) << 40, K, 200), fixed::kLogitMax);
    EXPECT_EQ(fixed::logit(-(int64_t(1) << 40), K, 30), -fixed::kLogitMax);
    // weight_r (reciprocal + integer correction) is exactly the floor division
    for (int i = 0; i < 200000; ++i) {
        const uint64_t Z = 1 + rng.next() % ((uint64_t(1) << (1 + rng.next() % 40)));
        const uint64_t e = i % 7 == 0 ? Z : i % 7 == 1 ? Z - 1 : rng.next() % (Z + 1);
        ASSERT_EQ(fixed::weight_r(e, Z, 1.0 / double(Z)), fixed::weight(e, Z)) << e << "/" << Z;
    }
    // saturating scores, decay
    EXPECT_EQ(fixed::sat_add(0xfffffff0u, 100), 0xffffffffu);
    EXPECT_EQ(fixed::sat_add(5, 7), 12u);
    EXPECT_EQ(fixed::decay_q16(0.9f), 58982u);
    EXPECT_EQ(fixed::decay_apply(65536, 58982), 58982u);
    EXPECT_EQ(fixed::decay_apply(0xffffffffu, 65536), 0xffffffffu);
}

// ---- an independent integer simulation of h2o with score=fixed, original positions ----

struct ISim {
    kvp_model m;
    uint32_t G, hd, pairs;
    std::vector<double> inv_freq;
    uint32_t hi[256], lo[256];
    int64_t K;
    ISim(const kvp_model &mm) : m(mm), G(mm.n_q_heads / mm.n_kv_heads), hd(mm.head_dim) {
        pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : hd) / 2;
        for (uint32_t i = 0; i < pairs; ++i) inv_freq.push_back(pow(double(m.rope_theta), -2.0 * i / (2.0 * pairs)));
        for (int i = 0; i < 256; ++i) {
            hi[i] = uint32_t(llroundl(exp2l(-i / 256.0L) * 1073741824.0L));
            lo[i] = uint32_t(llroundl(exp2l(-i / 65536.0L) * 1073741824.0L));
        }
        K = llround(1048576.0 * M_LOG2E / sqrt(double(hd)));
    }
    static int64_t fdiv(int64_t x, int64_t d) { return x >= 0 ? x / d : -((-x + d - 1) / d); }
    // quantized, rotated row and its exponent
    std::vector<int64_t> row(const float *x, int64_t pos, int *e) const {
        float A = 0;
        for (uint32_t i = 0; i < hd; ++i) A = std::max(A, std::fabs(x[i]));
        std::vector<int64_t> v(hd, 0);
        *e = 0;
        if (A >= 0x1p-100f) {
            int E;
            std::frexp(double(A), &E);
            *e = E - 14;
            for (uint32_t i = 0; i < hd; ++i) v[i] = int64_t(std::floor(std::ldexp(double(x[i]), -*e) + 0.5));
        }
        std::vector<int64_t> r = v;
        for (uint32_t i = 0; i < pairs; ++i) {
            const uint32_t a = m.rope == KVP_ROPE_GPTJ ? 2 * i : i, b = m.rope == KVP_ROPE_GPTJ ? 2 * i + 1 : i + pairs;
            const int64_t c = std::llround(std::cos(double(pos) * inv_freq[i]) * 16384.0);
            const int64_t s = std::llround(std::sin(double(pos) * inv_freq[i]) * 16384.0);
            r[a] = fdiv(v[a] * c - v[b] * s + 8192, 16384);
            r[b] = fdiv(v[a] * s + v[b] * c + 8192, 16384);
        }
        return r;
    }
    int64_t logit(const std::vector<int64_t> &q, int eq, const std::vector<int64_t> &k, int ek) const {
        const int sh = eq + ek - 4;
#if defined(__SIZEOF_INT128__)
        __int128 d = 0;
        for (uint32_t i = 0; i < hd; ++i) d += __int128(q[i]) * k[i];
        __int128 p = d * K;
        __int128 y;
        if (sh >= 0) y = p * (__int128(1) << std::min(sh, 70));
        else if (-sh >= 120) y = p >= 0 ? 0 : -1;
        else {
            const __int128 dv = __int128(1) << -sh;
            y = p >= 0 ? p / dv : -((-p + dv - 1) / dv);
        }
        const __int128 cap = __int128(1) << 61;
        return int64_t(y > cap ? cap : y < -cap ? -cap : y);
#else
        // 32-bit targets (armhf) have no __int128: |d| < 2^40 and K < 2^21, so d*K fits int64;
        // the scaling is decided by comparing magnitudes instead of computing the wide product.
        int64_t d = 0;
        for (uint32_t i = 0; i < hd; ++i) d += q[i] * k[i];
        const int64_t p = d * K, cap = int64_t(1) << 61;
        if (p == 0) return 0;
        if (sh >= 0) {
            const uint64_t mag = p < 0 ? uint64_t(-p) : uint64_t(p);
            if (sh >= 62 || mag > (uint64_t(cap) >> sh)) return p > 0 ? cap : -cap;
            return p * (int64_t(1) << sh);
        }
        if (-sh >= 63) return p >= 0 ? 0 : -1;
        const int64_t dv = int64_t(1) << -sh;
        return p >= 0 ? p / dv : -((-p + dv - 1) / dv);
#endif
    }
    uint64_t ex(int64_t g) const {
        if ((g >> 16) >= 31) return 0;
        const uint64_t f = uint64_t(g & 0xffff);
        return ((uint64_t(hi[f >> 8]) * lo[f & 0xff] + (1u << 29)) >> 30) >> (g >> 16);
    }
    // Q16 weights of query row (qr, eq) over keys
    std::vector<uint64_t> weights(const std::vector<int64_t> &qr, int eq, const std::vector<std::vector<int64_t>> &keys,
                                  const std::vector<int> &ke) const {
        std::vector<int64_t> y(keys.size());
        for (size_t j = 0; j < keys.size(); ++j) y[j] = logit(qr, eq, keys[j], ke[j]);
        const int64_t mx = *std::max_element(y.begin(), y.end());
        std::vector<uint64_t> e(keys.size());
        uint64_t Z = 0;
        for (size_t j = 0; j < keys.size(); ++j) Z += e[j] = ex(mx - y[j]);
        for (uint64_t &x : e) x = (x << 16) / Z;
        return e;
    }
};

// The library's Q16.16 scores of (layer 0, head h) in logical order.
std::vector<uint64_t> lib_scores(const kvp_cache *c, uint32_t h) {
    const HeadStore &hs = head_of(c, 0, h);
    std::vector<float> f(hs.len());
    scores_logical(hs, c->pools[h], f.data(), nullptr);
    std::vector<uint64_t> u(f.size());
    for (size_t j = 0; j < f.size(); ++j) {
        uint32_t x;
        memcpy(&x, &f[j], 4);
        u[j] = x;
    }
    return u;
}

struct IHead {
    std::vector<uint32_t> kept;
    std::vector<uint64_t> score;  // saturating at 2^32 - 1
    std::vector<std::vector<int64_t>> kr;
    std::vector<int> ke;
};

void run_h2o_fixed(const kvp_model &m, uint32_t budget, uint32_t recent, uint32_t obs, uint32_t P, uint32_t T,
                   float scale, uint64_t seed, bool zero_q = false) {
    const ISim sim(m);
    const uint32_t nq = m.n_q_heads * m.head_dim, nkv = m.n_kv_heads * m.head_dim, hd = m.head_dim;
    std::vector<float> q(size_t(T) * nq), k(size_t(T) * nkv), v(k.size());
    ref::Rng rng(seed);
    rng.fill(q, -scale, scale);
    rng.fill(k, -scale, scale);
    rng.fill(v);
    if (zero_q) std::fill(q.begin(), q.end(), 0.0f);
    const std::string spec = "policy=h2o score=fixed budget=" + std::to_string(budget) + " recent=" +
                             std::to_string(recent) + " capacity=" + std::to_string(P + 4) +
                             (obs < P ? " prompt_scores=window obs_window=" + std::to_string(obs) : std::string());
    ref::Cache c(m, spec);
    ASSERT_NE(c.c, nullptr);
    std::vector<float> out(size_t(P) * nq);
    std::vector<IHead> heads(m.n_kv_heads);
    auto sat = [](uint64_t a) { return std::min<uint64_t>(a, 0xffffffffu); };
    auto evict = [&](IHead &H) {
        const uint32_t L = uint32_t(H.kept.size());
        if (L <= budget) return;
        std::vector<uint32_t> cand;
        for (uint32_t j = 0; j + recent < L; ++j) cand.push_back(j);
        std::sort(cand.begin(), cand.end(),
                  [&](uint32_t a, uint32_t b) { return H.score[a] < H.score[b] || (H.score[a] == H.score[b] && a < b); });
        std::set<uint32_t> gone(cand.begin(), cand.begin() + (L - budget));
        IHead n;
        for (uint32_t j = 0; j < L; ++j)
            if (!gone.count(j)) {
                n.kept.push_back(H.kept[j]);
                n.score.push_back(H.score[j]);
                n.kr.push_back(H.kr[j]);
                n.ke.push_back(H.ke[j]);
            }
        H = n;
    };
    auto add_token = [&](IHead &H, uint32_t h, uint32_t t) {
        int e;
        H.kr.push_back(sim.row(&k[size_t(t) * nkv + h * hd], t, &e));
        H.ke.push_back(e);
        H.kept.push_back(t);
        H.score.push_back(0);
    };
    ASSERT_EQ(kvp_prefill(c.c, 0, P, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr), KVP_OK);
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        IHead &H = heads[h];
        for (uint32_t t = 0; t < P; ++t) add_token(H, h, t);
        std::vector<std::vector<uint64_t>> obsg(sim.G, std::vector<uint64_t>(P, 0));
        for (uint32_t t = P - std::min(obs, P); t < P; ++t) {
            const std::vector<std::vector<int64_t>> keys(H.kr.begin(), H.kr.begin() + t + 1);
            const std::vector<int> ke(H.ke.begin(), H.ke.begin() + t + 1);
            for (uint32_t g = 0; g < sim.G; ++g) {
                int eq;
                const std::vector<int64_t> qr = sim.row(&q[size_t(t) * nq + (h * sim.G + g) * hd], t, &eq);
                const std::vector<uint64_t> w = sim.weights(qr, eq, keys, ke);
                for (size_t j = 0; j < w.size(); ++j) obsg[g][j] = sat(obsg[g][j] + w[j]);
            }
        }
        for (uint32_t j = 0; j < P; ++j) {
            uint64_t a = 0;
            for (uint32_t g = 0; g < sim.G; ++g) a += obsg[g][j];
            H.score[j] = sat(H.score[j] + a);
        }
        evict(H);
        ASSERT_EQ(c.positions(0, h), std::vector<int32_t>(H.kept.begin(), H.kept.end())) << "prefill head " << h;
        ASSERT_EQ(lib_scores(c.c, h), H.score) << "prefill head " << h;  // the integers themselves
    }
    for (uint32_t t = P; t < T; ++t) {
        ASSERT_EQ(kvp_decode(c.c, 0, &q[size_t(t) * nq], &k[size_t(t) * nkv], &v[size_t(t) * nkv], out.data()), KVP_OK);
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            IHead &H = heads[h];
            add_token(H, h, t);
            std::vector<uint64_t> mass(H.kept.size(), 0);
            for (uint32_t g = 0; g < sim.G; ++g) {
                int eq;
                const std::vector<int64_t> qr = sim.row(&q[size_t(t) * nq + (h * sim.G + g) * hd], t, &eq);
                const std::vector<uint64_t> w = sim.weights(qr, eq, H.kr, H.ke);
                for (size_t j = 0; j < w.size(); ++j) mass[j] += w[j];
            }
            for (size_t j = 0; j < mass.size(); ++j) H.score[j] = sat(H.score[j] + mass[j]);
            evict(H);
            ASSERT_EQ(c.positions(0, h), std::vector<int32_t>(H.kept.begin(), H.kept.end())) << "t=" << t << " head " << h;
            ASSERT_EQ(lib_scores(c.c, h), H.score) << "t=" << t << " head " << h;
        }
    }
}

TEST(FixedH2o, DecisionsEqualAnIntegerSimulationGptjGqa2) {
    run_h2o_fixed(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 20, 4, 8, 40, 220, 2.0f, 1);
}
TEST(FixedH2o, DecisionsEqualAnIntegerSimulationNeoxPartialGqa4) {
    run_h2o_fixed(ref::model(1, 8, 2, 24, KVP_ROPE_NEOX, 16), 16, 2, 40, 40, 160, 3.0f, 2);
}
TEST(FixedH2o, DecisionsEqualAnIntegerSimulationNoRopeOddDim) {
    run_h2o_fixed(ref::model(1, 3, 1, 13, KVP_ROPE_NONE), 12, 3, 4, 20, 150, 1.0f, 3);
}
TEST(FixedH2o, DecisionsEqualAnIntegerSimulationLargeInputs) {  // exponents far from 0
    run_h2o_fixed(ref::model(1, 2, 2, 8, KVP_ROPE_GPTJ), 10, 1, 3, 16, 120, 3000.0f, 4);
}
// q = 0: every weight of a row is the same integer, so scores tie and the older token goes first.
TEST(FixedH2o, TiesEvictTheOlderToken) {
    run_h2o_fixed(ref::model(1, 2, 1, 8, KVP_ROPE_GPTJ), 6, 2, 1, 10, 60, 1.0f, 5, true);
    const kvp_model m = ref::model(1, 2, 1, 8, KVP_ROPE_NONE);
    ref::Cache c(m, "policy=h2o score=fixed budget=6 recent=2 obs_window=1 capacity=16 prompt_scores=window");
    std::vector<float> q(16 * 2 * 8, 0.0f), kv(16 * 8);
    ref::Rng rng(5);
    rng.fill(kv);
    ASSERT_EQ(kvp_prefill(c.c, 0, 10, nullptr, q.data(), kv.data(), kv.data(), nullptr, nullptr), KVP_OK);
    EXPECT_EQ(c.positions(0, 0), (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));
}

// Fixed-point scores approximate the float ones: on a random workload most kept sets agree, and
// the outputs (float attention over the kept tokens) are the same bits while the sets agree.
TEST(FixedH2o, CloseToFloatDecisions) {
    const kvp_model m = ref::model(2, 4, 2, 32, KVP_ROPE_GPTJ);
    const uint32_t T = 300, nq = 4 * 32, nkv = 2 * 32;
    std::vector<float> q(size_t(T) * nq), k(size_t(T) * nkv), v(k.size()), o1(size_t(64) * nq), o2(o1.size());
    ref::Rng rng(9);
    rng.fill(q, -1.5, 1.5);
    rng.fill(k, -1.5, 1.5);
    rng.fill(v);
    ref::Cache f(m, "policy=h2o budget=48 recent=8 capacity=70"), x(m, "policy=h2o budget=48 recent=8 capacity=70 score=fixed");
    for (uint32_t l = 0; l < 2; ++l) {
        ASSERT_EQ(kvp_prefill(f.c, l, 64, nullptr, q.data(), k.data(), v.data(), o1.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(x.c, l, 64, nullptr, q.data(), k.data(), v.data(), o2.data(), nullptr), KVP_OK);
        EXPECT_EQ(memcmp(o1.data(), o2.data(), o1.size() * 4), 0);  // prefill outputs do not depend on scoring
    }
    uint64_t common = 0, total = 0;
    for (uint32_t t = 64; t < T; ++t)
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_decode(f.c, l, &q[t * nq], &k[t * nkv], &v[t * nkv], o1.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(x.c, l, &q[t * nq], &k[t * nkv], &v[t * nkv], o2.data()), KVP_OK);
            for (uint32_t h = 0; h < 2; ++h) {
                const std::vector<int32_t> a = f.positions(l, h), b = x.positions(l, h);
                std::vector<int32_t> both;
                std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
                common += both.size();
                total += a.size();
            }
        }
    EXPECT_GT(double(common) / double(total), 0.85);
}

// snapkv, pyramidkv and lethe with fixed-point scores select mostly what they select with float
// scores (integer votes, pooling, layer sums, breakpoints approximate the float ones).
TEST(FixedPolicies, CloseToFloatSelections) {
    const kvp_model m = ref::model(3, 4, 2, 32, KVP_ROPE_GPTJ);
    const uint32_t T = 260, nq = 4 * 32, nkv = 2 * 32;
    std::vector<float> q(size_t(T) * nq), k(size_t(T) * nkv), v(k.size()), o(size_t(160) * nq);
    ref::Rng rng(21);
    rng.fill(q, -1.5, 1.5);
    rng.fill(k, -1.5, 1.5);
    rng.fill(v);
    for (const char *spec : {"policy=snapkv budget=40 obs_window=8 pool=max", "policy=snapkv budget=40 obs_window=8 pool=avg pool_kernel=5",
                             "policy=pyramidkv budget=40 obs_window=8 beta=4",
                             "policy=lethe capacity=96 evict_threshold=24 sparse_ratio=4"}) {
        ref::Cache f(m, spec), x(m, std::string(spec) + " score=fixed");
        for (uint32_t l = 0; l < 3; ++l) {
            ASSERT_EQ(kvp_prefill(f.c, l, 80, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK) << spec;
            ASSERT_EQ(kvp_prefill(x.c, l, 80, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK) << spec;
        }
        uint64_t common = 0, total = 0;
        auto compare = [&]() {
            for (uint32_t l = 0; l < 3; ++l)
                for (uint32_t h = 0; h < 2; ++h) {
                    const std::vector<int32_t> a = f.positions(l, h), b = x.positions(l, h);
                    std::vector<int32_t> both;
                    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
                    common += both.size();
                    total += std::max(a.size(), b.size());
                }
        };
        compare();
        for (uint32_t t = 80; t < T; ++t)
            for (uint32_t l = 0; l < 3; ++l) {
                ASSERT_EQ(kvp_decode(f.c, l, &q[t * nq], &k[t * nkv], &v[t * nkv], o.data()), KVP_OK) << spec;
                ASSERT_EQ(kvp_decode(x.c, l, &q[t * nq], &k[t * nkv], &v[t * nkv], o.data()), KVP_OK) << spec;
            }
        compare();
        EXPECT_GT(double(common) / double(total), 0.8) << spec;
    }
}

}  // namespace
