// Attention through the C API against the double-precision reference (tests/reference.cpp):
// prefill (several chunks, tiles and key blocks with remainders) then decode, for MHA, GQA
// and MQA, both RoPE styles, partial rotary, no RoPE, odd head dims; determinism over threads.
#include <gtest/gtest.h>
#include <math.h>
#include <string.h>

#include "reference.h"

namespace {

struct Geo {
    uint32_t nq, nkv, hd;
    kvp_rope_style rope;
    uint32_t rope_dim;
};

class AttentionVsReference : public ::testing::TestWithParam<Geo> {};

// Runs chunks of prefill then decodes on one layer, checking every output row against the
// reference over all tokens so far (policy full, original positions = given positions).
void run_and_check(const Geo &g, bool gapped_positions) {
    const kvp_model m = ref::model(1, g.nq, g.nkv, g.hd, g.rope, g.rope_dim);
    ref::Cache cache(m, "policy=full capacity=400 positions=original");
    ASSERT_NE(cache.c, nullptr);
    const uint32_t chunks[] = {150, 21, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};  // prefill, prefill, decodes
    uint32_t total = 0;
    for (uint32_t n : chunks) total += n;
    std::vector<float> q(size_t(total) * g.nq * g.hd), k(size_t(total) * g.nkv * g.hd), v(k.size());
    ref::Rng rng(g.hd * 131 + g.nq);
    rng.fill(q, -2.0f, 2.0f);
    rng.fill(k, -2.0f, 2.0f);
    rng.fill(v);
    std::vector<int64_t> pos(total);
    for (uint32_t t = 0; t < total; ++t) pos[t] = gapped_positions ? 3 * t + 1 : t;

    std::vector<float> out(q.size(), NAN);
    uint32_t t0 = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; ++c) {
        const uint32_t n = chunks[c];
        const size_t qo = size_t(t0) * g.nq * g.hd, ko = size_t(t0) * g.nkv * g.hd;
        std::vector<int32_t> p32(n);
        for (uint32_t i = 0; i < n; ++i) p32[i] = int32_t(pos[t0 + i]);
        if (c < 2 || gapped_positions) {
            ASSERT_EQ(kvp_prefill(cache.c, 0, n, p32.data(), &q[qo], &k[ko], &v[ko], &out[qo], nullptr), KVP_OK)
                << kvp_last_error(cache.c);
        } else {
            ASSERT_EQ(kvp_decode(cache.c, 0, &q[qo], &k[ko], &v[ko], &out[qo]), KVP_OK) << kvp_last_error(cache.c);
        }
        t0 += n;
    }
    ASSERT_EQ(kvp_layer_len(cache.c, 0), total);
    double worst = 0;
    std::vector<double> expect;
    for (uint32_t t = 0; t < total; ++t) {
        std::vector<uint32_t> idx(t + 1);
        std::vector<int64_t> kp(t + 1);
        for (uint32_t j = 0; j <= t; ++j) { idx[j] = j; kp[j] = pos[j]; }
        ref::attend(m, &q[size_t(t) * g.nq * g.hd], pos[t], k.data(), v.data(), idx, kp, expect);
        for (size_t i = 0; i < expect.size(); ++i)
            worst = std::max(worst, fabs(expect[i] - double(out[size_t(t) * g.nq * g.hd + i])));
    }
    EXPECT_LT(worst, 1e-5) << "nq=" << g.nq << " nkv=" << g.nkv << " hd=" << g.hd;
}

TEST_P(AttentionVsReference, PrefillThenDecode) { run_and_check(GetParam(), false); }
TEST_P(AttentionVsReference, GappedPositions) { run_and_check(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(
    Geometries, AttentionVsReference,
    ::testing::Values(Geo{4, 2, 32, KVP_ROPE_GPTJ, 0},    // GQA 2:1, llama2.c style
                      Geo{4, 4, 16, KVP_ROPE_NEOX, 0},    // MHA, NEOX
                      Geo{6, 1, 24, KVP_ROPE_GPTJ, 0},    // MQA
                      Geo{8, 2, 64, KVP_ROPE_NEOX, 32},   // partial rotary, NEOX
                      Geo{4, 2, 40, KVP_ROPE_GPTJ, 16},   // partial rotary, GPT-J
                      Geo{3, 3, 33, KVP_ROPE_NEOX, 20},   // odd head dim
                      Geo{2, 1, 7, KVP_ROPE_NONE, 0},     // no RoPE, tiny odd dim
                      Geo{16, 2, 128, KVP_ROPE_GPTJ, 0}));  // 8 query heads per KV head

// The same workload gives identical bits for any thread count (heads are split, each head's
// arithmetic is sequential and identical).
std::vector<float> run_threads(uint32_t threads) {
    const kvp_model m = ref::model(2, 8, 4, 64);
    ref::Cache cache(m, "policy=streaming sinks=4 window=40 compress_every=5 slack=2 max_drop=3 capacity=80 threads=" +
                            std::to_string(threads));
    std::vector<float> q(8 * 64), k(4 * 64), v(4 * 64), o(8 * 64), all;
    ref::Rng rng(7);
    std::vector<float> qp(30 * 8 * 64), kp(30 * 4 * 64), vp(30 * 4 * 64), op(qp.size());
    rng.fill(qp);
    rng.fill(kp);
    rng.fill(vp);
    for (uint32_t l = 0; l < 2; ++l) {
        EXPECT_EQ(kvp_prefill(cache.c, l, 30, nullptr, qp.data(), kp.data(), vp.data(), op.data(), nullptr), KVP_OK);
        all.insert(all.end(), op.begin(), op.end());
    }
    for (int t = 0; t < 120; ++t) {
        for (uint32_t l = 0; l < 2; ++l) {
            rng.fill(q);
            rng.fill(k);
            rng.fill(v);
            EXPECT_EQ(kvp_decode(cache.c, l, q.data(), k.data(), v.data(), o.data()), KVP_OK);
            all.insert(all.end(), o.begin(), o.end());
        }
    }
    for (uint32_t h = 0; h < 4; ++h) {
        std::vector<int32_t> p = cache.positions(1, h);
        for (int32_t x : p) all.push_back(float(x));
    }
    return all;
}

TEST(Determinism, ThreadsGiveIdenticalBits) {
    const std::vector<float> a = run_threads(1), b = run_threads(2), c = run_threads(3);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), c.size());
    EXPECT_EQ(memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
    // and across runs
    const std::vector<float> a2 = run_threads(1);
    EXPECT_EQ(memcmp(a.data(), a2.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
