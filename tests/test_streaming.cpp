// Streaming (StreamingLLM + Lazy Pruning / Slack / Max_Drop) and window: trigger and target
// length after every token, kept positions, the paper's worked example, and realign: the
// decode output equals a from-scratch attention over the kept tokens at cache-relative positions.
#include <gtest/gtest.h>
#include <math.h>

#include <algorithm>

#include "reference.h"

namespace {

struct Params {
    uint32_t S, W, B, R, sigma, delta;
};

std::string spec_of(const Params &p, const char *extra = "") {
    return "policy=streaming sinks=" + std::to_string(p.S) + " window=" + std::to_string(p.W) +
           " extra=" + std::to_string(p.B) + " compress_every=" + std::to_string(p.R) +
           " slack=" + std::to_string(p.sigma) + " max_drop=" + std::to_string(p.delta) + " " + extra;
}

// Independent list model of Algorithm 1: the kept original positions after appending one token.
void model_step(const Params &p, std::vector<int32_t> &kept, int32_t pos, uint32_t *prunes) {
    kept.push_back(pos);
    const int64_t L = int64_t(kept.size()), C = p.S + p.W + p.B, H = C + p.sigma;
    if (p.R == 0 || L - C < int64_t(p.R)) return;
    const int64_t target = p.delta == 0 ? C : std::min(std::max(L - int64_t(p.delta), C), H);
    std::vector<int32_t> next(kept.begin(), kept.begin() + p.S);
    next.insert(next.end(), kept.end() - (target - p.S), kept.end());
    if (next.size() != kept.size()) ++*prunes;
    kept.swap(next);
}

class StreamingRule : public ::testing::TestWithParam<Params> {};

TEST_P(StreamingRule, LengthAndPositionsAfterEveryToken) {
    const Params p = GetParam();
    const kvp_model m = ref::model(2, 2, 1, 8);
    ref::Cache dec(m, spec_of(p)), app(m, spec_of(p));
    std::vector<int32_t> kept;
    uint32_t prunes = 0;
    std::vector<float> q(16), kv(8), o(16);
    ref::Rng rng(p.S * 1000 + p.W);
    for (int32_t t = 0; t < 300; ++t) {
        rng.fill(q);
        rng.fill(kv);
        model_step(p, kept, t, &prunes);
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_decode(dec.c, l, q.data(), kv.data(), kv.data(), o.data()), KVP_OK) << kvp_last_error(dec.c);
            ASSERT_EQ(kvp_append(app.c, l, 1, nullptr, kv.data(), kv.data()), KVP_OK) << kvp_last_error(app.c);
        }
        ASSERT_EQ(kvp_layer_len(dec.c, 0), kept.size()) << "token " << t;
        ASSERT_EQ(dec.positions(1, 0), kept) << "token " << t;
        ASSERT_EQ(app.positions(0, 0), kept) << "token " << t;
    }
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(dec.c, &s), KVP_OK);
    EXPECT_EQ(s.tokens_seen, 300u);
    EXPECT_EQ(s.prune_events, 2u * prunes);
    EXPECT_EQ(s.tokens_evicted, 2u * (300u - kept.size()));
    EXPECT_EQ(s.live_bytes, 2u * kept.size() * 2 * 8 * sizeof(float));  // 2 layers, K+V, head_dim 8 (no padding)
    EXPECT_GE(s.peak_live_bytes, s.live_bytes);
}

INSTANTIATE_TEST_SUITE_P(Params, StreamingRule,
                         ::testing::Values(Params{4, 16, 0, 1, 0, 0},   // classic StreamingLLM
                                           Params{4, 16, 2, 8, 0, 0},   // lazy pruning, delta = 0
                                           Params{2, 10, 0, 4, 3, 2},   // slack + max_drop
                                           Params{0, 8, 0, 3, 5, 4},    // no sinks
                                           Params{4, 20, 0, 6, 10, 1},  // delta < R: stays in the slack
                                           Params{1, 5, 1, 2, 0, 9}));  // delta with sigma 0 -> C

TEST(Streaming, NeverPrunesWithRZeroAndIsFullAtCapacity) {
    const kvp_model m = ref::model(1, 2, 1, 8);
    ref::Cache auto_cap(m, "policy=streaming sinks=4 window=60 compress_every=8 slack=12");  // max(C+R, H)
    EXPECT_EQ(kvp_layer_capacity(auto_cap.c, 0), 76u);
    ref::Cache c(m, "policy=streaming sinks=2 window=6 compress_every=0 capacity=10");
    std::vector<float> q(16, 0.1f), kv(8, 0.2f), o(16);
    for (int t = 0; t < 10; ++t) ASSERT_EQ(kvp_decode(c.c, 0, q.data(), kv.data(), kv.data(), o.data()), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 10u);
    EXPECT_EQ(kvp_decode(c.c, 0, q.data(), kv.data(), kv.data(), o.data()), KVP_ERR_FULL);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 10u);
}

// DESIGN.md / the paper's toy example: S,W,R,sigma,delta = 4,2044,32,16,32; a 2090-token
// prompt leaves 2058 tokens: the 4 sinks and positions 36..2089.
TEST(Streaming, PaperWorkedExample) {
    const kvp_model m = ref::model(1, 2, 1, 4);
    ref::Cache c(m, "policy=streaming sinks=4 window=2044 compress_every=32 slack=16 max_drop=32 capacity=2100");
    const uint32_t n = 2090;
    std::vector<float> q(size_t(n) * 8), kv(size_t(n) * 4), o(q.size());
    ref::Rng rng(1);
    rng.fill(q);
    rng.fill(kv);
    ASSERT_EQ(kvp_prefill(c.c, 0, n, nullptr, q.data(), kv.data(), kv.data(), o.data(), nullptr), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 2058u);
    std::vector<int32_t> expect = {0, 1, 2, 3};
    for (int32_t p = 36; p < 2090; ++p) expect.push_back(p);
    EXPECT_EQ(c.positions(0, 0), expect);
    // Decoding on: the next prune fires at L = C + R = 2080 and, since L - delta = 2048 = C, drops to 2048.
    std::vector<float> q1(8, 0.5f), kv1(4, 0.25f), o1(8);
    for (uint32_t L = 2059; L <= 2080; ++L) {
        ASSERT_EQ(kvp_decode(c.c, 0, q1.data(), kv1.data(), kv1.data(), o1.data()), KVP_OK);
        EXPECT_EQ(kvp_layer_len(c.c, 0), L == 2080 ? 2048u : L);
    }
}

TEST(Window, KeepsTheMostRecent) {
    const kvp_model m = ref::model(1, 2, 2, 8, KVP_ROPE_NEOX);
    ref::Cache c(m, "policy=window window=8");
    std::vector<float> q(16, 0.1f), kv(16, 0.3f), o(16);
    for (int32_t t = 0; t < 50; ++t) {
        ASSERT_EQ(kvp_decode(c.c, 0, q.data(), kv.data(), kv.data(), o.data()), KVP_OK);
        std::vector<int32_t> expect;
        for (int32_t p = std::max(0, t - 7); p <= t; ++p) expect.push_back(p);
        ASSERT_EQ(c.positions(0, 1), expect);
    }
}

// Realign: every output equals the reference over (kept before the call) + the new token with
// keys at cache-relative positions 0..L and the query at L; original mode uses absolute positions.
void check_positions_mode(bool realign) {
    const kvp_model m = ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ);
    const Params p{4, 20, 2, 5, 3, 4};
    ref::Cache c(m, spec_of(p, realign ? "positions=realign capacity=40" : "positions=original capacity=40"));
    const uint32_t total = 140, nq = 4 * 16, nkv = 2 * 16;
    std::vector<float> q(size_t(total) * nq), k(size_t(total) * nkv), v(k.size()), out(q.size());
    ref::Rng rng(realign ? 11 : 12);
    rng.fill(q, -3.0f, 3.0f);  // large logits make position errors visible
    rng.fill(k, -3.0f, 3.0f);
    rng.fill(v);
    double worst = 0;
    std::vector<double> expect;
    auto check_row = [&](uint32_t t, const std::vector<int32_t> &before, uint32_t i_in_chunk) {
        std::vector<uint32_t> idx(before.begin(), before.end());
        for (uint32_t j = t - i_in_chunk; j <= t; ++j) idx.push_back(j);
        std::vector<int64_t> kp(idx.size());
        for (size_t j = 0; j < idx.size(); ++j) kp[j] = realign ? int64_t(j) : int64_t(idx[j]);
        ref::attend(m, &q[size_t(t) * nq], realign ? int64_t(idx.size() - 1) : t, k.data(), v.data(), idx, kp, expect);
        for (size_t i = 0; i < expect.size(); ++i)
            worst = std::max(worst, fabs(expect[i] - double(out[size_t(t) * nq + i])));
    };
    uint32_t t = 0;
    auto prefill = [&](uint32_t n) {
        const std::vector<int32_t> before = c.positions(0, 0);
        ASSERT_EQ(kvp_prefill(c.c, 0, n, nullptr, &q[size_t(t) * nq], &k[size_t(t) * nkv], &v[size_t(t) * nkv],
                              &out[size_t(t) * nq], nullptr), KVP_OK);
        for (uint32_t i = 0; i < n; ++i) check_row(t + i, before, i);
        t += n;
    };
    prefill(12);
    for (; t < 100;) {
        const std::vector<int32_t> before = c.positions(0, 1);
        ASSERT_EQ(kvp_decode(c.c, 0, &q[size_t(t) * nq], &k[size_t(t) * nkv], &v[size_t(t) * nkv], &out[size_t(t) * nq]),
                  KVP_OK);
        check_row(t, before, 0);
        ++t;
    }
    // a second prefill chunk after many prunes (the ring has shifted and wrapped)
    while (kvp_layer_len(c.c, 0) > 30) {
        const std::vector<int32_t> before = c.positions(0, 0);
        ASSERT_EQ(kvp_decode(c.c, 0, &q[size_t(t) * nq], &k[size_t(t) * nkv], &v[size_t(t) * nkv], &out[size_t(t) * nq]),
                  KVP_OK);
        check_row(t, before, 0);
        ++t;
    }
    prefill(40 - kvp_layer_len(c.c, 0));
    EXPECT_LT(worst, 3e-4);
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    EXPECT_GT(s.prune_events, 10u);
}

TEST(Positions, RealignMatchesFromScratchAtCacheRelativePositions) { check_positions_mode(true); }
TEST(Positions, OriginalMatchesAbsolutePositions) { check_positions_mode(false); }

}  // namespace
