// H2O (Heavy-Hitter Oracle): the kept tokens of every KV head after a prefill and after every
// decode step, checked against an independent double-precision simulation of the rule written
// here from the explicit q/k inputs (DESIGN.md "h2o"; src/policies/h2o.h), the outputs against a
// double-precision attention over the kept tokens, realign after scattered evictions at
// cache-relative positions, and identical bits for every thread count.
#include <gtest/gtest.h>
#include <math.h>

#include <algorithm>
#include <set>

#include "config_support.h"
#include "reference.h"

namespace {

using ref::Inputs;

// The rule, per KV head, in double: kept original indices and their accumulated scores.
struct Sim {
    uint32_t budget, recent;
    std::vector<uint32_t> kept;
    std::vector<double> score;

    // Adds each kept token's weight from query heads of KV head h at query token t (original
    // positions), for a query that sees the kept tokens up to and including `upto`.
    void accumulate(const Inputs &in, uint32_t h, uint32_t t, uint32_t upto) {
        const uint32_t G = in.m.n_q_heads / in.m.n_kv_heads;
        std::vector<uint32_t> idx;
        std::vector<int64_t> kp;
        for (uint32_t x : kept)
            if (x <= upto) {
                idx.push_back(x);
                kp.push_back(x);
            }
        for (uint32_t g = 0; g < G; ++g) {
            const uint32_t hq = h * G + g;
            const std::vector<double> w =
                ref::weights(in.m, hq, &in.q[size_t(t) * in.nq + size_t(hq) * in.m.head_dim], t, in.k.data(), idx, kp);
            for (size_t j = 0; j < idx.size(); ++j) score[j] += w[j];  // kept is sorted: idx[j] == kept[j]
        }
    }
    // Evicts len - budget tokens: lowest score outside the recent ones, older first on ties.
    // Returns the score of the highest-scored victim (for near-tie tolerance).
    double evict() {
        const uint32_t L = uint32_t(kept.size());
        if (L <= budget) return -1;
        const uint32_t n = L - budget;
        std::vector<uint32_t> cand;
        for (uint32_t j = 0; j + recent < L; ++j) cand.push_back(j);
        std::sort(cand.begin(), cand.end(),
                  [&](uint32_t a, uint32_t b) { return score[a] < score[b] || (score[a] == score[b] && a < b); });
        std::set<uint32_t> gone(cand.begin(), cand.begin() + n);
        const double top = score[cand[n - 1]];
        std::vector<uint32_t> k2;
        std::vector<double> s2;
        for (uint32_t j = 0; j < L; ++j)
            if (!gone.count(j)) {
                k2.push_back(kept[j]);
                s2.push_back(score[j]);
            }
        kept.swap(k2);
        score.swap(s2);
        return top;
    }
    // The library chose lib (a subset of the pre-eviction set) where the simulation chose
    // otherwise: accept it only as a near tie (every victim the library chose scores within
    // tol of the simulation's worst victim), then follow it.
    bool adopt(const std::vector<int32_t> &lib, const std::vector<uint32_t> &pre, const std::vector<double> &pre_score,
               double top, double tol) {
        std::vector<uint32_t> k2;
        std::vector<double> s2;
        size_t li = 0;
        for (size_t j = 0; j < pre.size(); ++j) {
            if (li < lib.size() && uint32_t(lib[li]) == pre[j]) {
                k2.push_back(pre[j]);
                s2.push_back(pre_score[j]);
                ++li;
            } else {
                if (pre_score[j] > top + tol || j + recent >= pre.size()) return false;
            }
        }
        if (li != lib.size()) return false;
        kept.swap(k2);
        score.swap(s2);
        return true;
    }
};

void run_selection_on(const Inputs &in, uint32_t budget, uint32_t recent, uint32_t obs, uint32_t P);

void run_selection(const kvp_model &m, uint32_t budget, uint32_t recent, uint32_t obs, uint32_t P, uint32_t T,
                   float qk_scale, uint64_t seed) {
    const Inputs in(m, T, seed, qk_scale);
    run_selection_on(in, budget, recent, obs, P);
}

void run_selection_on(const Inputs &in, uint32_t budget, uint32_t recent, uint32_t obs, uint32_t P) {
    const kvp_model &m = in.m;
    const uint32_t T = in.T;
    const std::string spec = "policy=h2o budget=" + std::to_string(budget) + " recent=" + std::to_string(recent) +
                             " capacity=" + std::to_string(P + 8) +
                             (obs < P ? " prompt_scores=window obs_window=" + std::to_string(obs)
                                      : std::string());  // obs >= P: every query (the default)
    ref::Cache c(m, spec);
    std::vector<Sim> sim(m.n_kv_heads, Sim{budget, recent, {}, {}});
    std::vector<float> out(size_t(P) * in.nq);
    ASSERT_EQ(kvp_prefill(c.c, 0, P, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK)
        << kvp_last_error(c.c);
    uint32_t near_ties = 0, evictions = 0;
    const double tol = 1e-5;
    auto compare = [&](uint32_t h, const std::vector<uint32_t> &pre, const std::vector<double> &pre_score, double top,
                       const char *when, uint32_t t) {
        const std::vector<int32_t> lib = c.positions(0, h);
        std::vector<int32_t> want(sim[h].kept.begin(), sim[h].kept.end());
        if (lib == want) return;
        ASSERT_TRUE(sim[h].adopt(lib, pre, pre_score, top, tol)) << when << " t=" << t << " head " << h;
        ++near_ties;
    };
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        for (uint32_t j = 0; j < P; ++j) {
            sim[h].kept.push_back(j);
            sim[h].score.push_back(0);
        }
        for (uint32_t t = P - std::min(obs, P); t < P; ++t) sim[h].accumulate(in, h, t, t);
        const auto pre = sim[h].kept;
        const auto pre_score = sim[h].score;
        const double top = sim[h].evict();
        evictions += P > budget ? P - budget : 0;
        compare(h, pre, pre_score, top, "prefill", P);
    }
    double worst = 0;
    for (uint32_t t = P; t < T; ++t) {
        const std::vector<int32_t> before0 = c.positions(0, 0), before1 = c.positions(0, 1);
        ASSERT_EQ(kvp_decode(c.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                             out.data()),
                  KVP_OK);
        // KV head h's query rows are out[h*G*hd ..), each checked against its own kept set
        std::vector<float> row(out.begin(), out.begin() + in.nq);
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            const std::vector<int32_t> &before = h == 0 ? before0 : before1;
            std::vector<uint32_t> idx(before.begin(), before.end());
            idx.push_back(t);
            std::vector<int64_t> kp(idx.begin(), idx.end());
            std::vector<double> expect;
            ref::attend(in.m, &in.q[size_t(t) * in.nq], t, in.k.data(), in.v.data(), idx, kp, expect);
            const uint32_t G = m.n_q_heads / m.n_kv_heads, hd = m.head_dim;
            for (uint32_t i = h * G * hd; i < (h + 1) * G * hd; ++i) worst = std::max(worst, fabs(expect[i] - double(row[i])));

            sim[h].kept.push_back(t);
            sim[h].score.push_back(0);
            sim[h].accumulate(in, h, t, t);
            const auto pre = sim[h].kept;
            const auto pre_score = sim[h].score;
            const double top = sim[h].evict();
            if (top >= 0) ++evictions;
            compare(h, pre, pre_score, top, "decode", t);
        }
    }
    EXPECT_LT(worst, 1e-5);
    EXPECT_LE(near_ties, evictions / 50 + 1) << "near ties adopted";
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c.c, 0), budget);
    EXPECT_EQ(s.live_bytes, uint64_t(budget) * m.n_kv_heads * 2 * m.head_dim * sizeof(float));
    EXPECT_GT(s.prune_events, uint64_t(T - P));
}

TEST(H2o, SelectionMatchesSimulationNoRope) {
    run_selection(ref::model(1, 4, 2, 16, KVP_ROPE_NONE), 24, 4, 8, 40, 200, 2.0f, 1);
}
TEST(H2o, SelectionMatchesSimulationGptjGqa4) {
    run_selection(ref::model(1, 8, 2, 32, KVP_ROPE_GPTJ), 30, 6, 40, 40, 180, 1.5f, 2);  // whole prompt observed
}
TEST(H2o, SelectionMatchesSimulationRecentZeroTinyBudget) {
    run_selection(ref::model(1, 2, 2, 8, KVP_ROPE_NEOX), 3, 0, 2, 10, 120, 3.0f, 3);
}
TEST(H2o, SelectionMatchesSimulationRecentEqualsBudget) {  // then h2o is a window of `budget`
    run_selection(ref::model(1, 4, 2, 16, KVP_ROPE_NONE), 12, 12, 4, 20, 80, 2.0f, 4);
}

// Only the second query head of each GQA group sees the heavy hitters (every 5th token's key
// points along e0, and only head 1's query does): they survive only if the score sums the group's
// heads, at decode and in the prefill observation.
TEST(H2o, GroupSumDecidesHeavyHitters) {
    const kvp_model m = ref::model(1, 4, 2, 8, KVP_ROPE_NONE);
    Inputs in(m, 90, 7, 0.1f);
    for (uint32_t t = 0; t < in.T; ++t) {
        for (uint32_t hq = 0; hq < 4; ++hq) {
            float *q = &in.q[size_t(t) * in.nq + hq * 8];
            for (uint32_t i = 0; i < 8; ++i) q[i] = (hq % 2 == 1 && i == 0) ? 4.0f : 0.0f;
        }
        if (t % 5 == 0)
            for (uint32_t h = 0; h < 2; ++h) in.k[size_t(t) * in.nkv + h * 8] = 4.0f;
    }
    run_selection_on(in, 10, 2, 8, 20);
    ref::Cache c(m, "policy=h2o budget=10 recent=2 obs_window=8 capacity=28 prompt_scores=window");
    std::vector<float> out(size_t(20) * in.nq);
    ASSERT_EQ(kvp_prefill(c.c, 0, 20, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
    for (int32_t hh : {0, 5, 10, 15}) {  // the heavy prompt tokens survive the prefill compression
        const std::vector<int32_t> p = c.positions(0, 1);
        EXPECT_NE(std::find(p.begin(), p.end(), hh), p.end()) << hh;
    }
    for (uint32_t t = 20; t < in.T; ++t)
        ASSERT_EQ(kvp_decode(c.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                             out.data()),
                  KVP_OK);
    for (uint32_t h = 0; h < 2; ++h) {
        const std::vector<int32_t> p = c.positions(0, h);
        ASSERT_EQ(p.size(), 10u);
        // rich get richer (the paper's observation): the heavy prompt tokens stay to the end
        for (int32_t hh : {0, 5, 10, 15, 20}) EXPECT_NE(std::find(p.begin(), p.end(), hh), p.end()) << h << ": " << hh;
    }
}

// Uniform attention (q = 0): every prompt token the window saw gets the same score bits, so the
// older-first tie rule decides; the library must evict exactly the oldest.
TEST(H2o, TiesEvictTheOlderToken) {
    const kvp_model m = ref::model(1, 2, 1, 8, KVP_ROPE_NONE);
    ref::Cache c(m, "policy=h2o budget=6 recent=2 obs_window=1 capacity=16 prompt_scores=window");
    std::vector<float> q(16 * 2 * 8, 0.0f), kv(16 * 8);
    ref::Rng rng(5);
    rng.fill(kv);
    ASSERT_EQ(kvp_prefill(c.c, 0, 10, nullptr, q.data(), kv.data(), kv.data(), nullptr, nullptr), KVP_OK);
    // one observed query (token 9) gives every token 2 x 1/10: all tie; keep the 4 newest of
    // the candidates 0..7 and the 2 recent
    EXPECT_EQ(c.positions(0, 0), (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));
}

// Realign after many scattered evictions: every decode and prefill output equals a from-scratch
// double attention over the kept tokens at cache-relative positions 0..L-1, query at L-1
// (DESIGN.md "Positions"). Large logits make any position error visible.
TEST(H2o, RealignAfterScatteredEvictionsMatchesReference) {
    const kvp_model m = ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ);
    const Inputs in(m, 400, 21, 3.0f);
    ref::Cache c(m, "policy=h2o budget=20 recent=3 obs_window=4 capacity=32 positions=realign prompt_scores=window");
    std::vector<float> out(size_t(32) * in.nq);
    double worst = 0;
    uint32_t t = 0;
    auto check = [&](uint32_t tok, const std::vector<int32_t> &before_h, uint32_t h, uint32_t i_in_chunk,
                     const float *o) {
        std::vector<uint32_t> idx(before_h.begin(), before_h.end());
        for (uint32_t j = tok - i_in_chunk; j <= tok; ++j) idx.push_back(j);
        std::vector<int64_t> kp(idx.size());
        for (size_t j = 0; j < kp.size(); ++j) kp[j] = int64_t(j);
        std::vector<double> expect;
        ref::attend(m, &in.q[size_t(tok) * in.nq], int64_t(idx.size()) - 1, in.k.data(), in.v.data(), idx, kp, expect);
        const uint32_t G = 2, hd = 16;
        for (uint32_t i = h * G * hd; i < (h + 1) * G * hd; ++i) worst = std::max(worst, fabs(expect[i] - double(o[i])));
    };
    auto prefill = [&](uint32_t n) {
        const std::vector<int32_t> b0 = c.positions(0, 0), b1 = c.positions(0, 1);
        ASSERT_EQ(kvp_prefill(c.c, 0, n, nullptr, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv],
                              &in.v[size_t(t) * in.nkv], out.data(), nullptr),
                  KVP_OK)
            << kvp_last_error(c.c);
        for (uint32_t i = 0; i < n; ++i) {
            check(t + i, b0, 0, i, &out[size_t(i) * in.nq]);
            check(t + i, b1, 1, i, &out[size_t(i) * in.nq]);
        }
        t += n;
    };
    prefill(30);
    for (int round = 0; round < 6; ++round) {
        for (int s = 0; s < 40; ++s, ++t) {
            const std::vector<int32_t> b0 = c.positions(0, 0), b1 = c.positions(0, 1);
            ASSERT_EQ(kvp_decode(c.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                                 out.data()),
                      KVP_OK);
            check(t, b0, 0, 0, out.data());
            check(t, b1, 1, 0, out.data());
        }
        prefill(11);  // a chunk over a scattered store (budget 20 + 11 + 1 <= capacity 32)
    }
    EXPECT_LT(worst, 1e-5);
    // the evictions really were scattered: kept positions are not one contiguous range
    const std::vector<int32_t> p = c.positions(0, 0);
    EXPECT_GT(p.back() - p.front() + 1, int32_t(p.size()) + 10);
}

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t run_hash(const std::string &spec) {
    const kvp_model m = ref::model(3, 8, 4, 24, KVP_ROPE_GPTJ);
    const Inputs in(m, 260, 9, 2.0f);
    ref::Cache c(m, spec);
    std::vector<float> out(size_t(60) * in.nq);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t l = 0; l < 3; ++l) {
        EXPECT_EQ(kvp_prefill(c.c, l, 60, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
        h = fnv(h, out.data(), out.size() * sizeof(float));
    }
    for (uint32_t t = 60; t < 260; ++t)
        for (uint32_t l = 0; l < 3; ++l) {
            EXPECT_EQ(kvp_decode(c.c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                                 out.data()),
                      KVP_OK);
            h = fnv(h, out.data(), size_t(in.nq) * sizeof(float));
            for (uint32_t kh = 0; kh < 4; ++kh) {
                const std::vector<int32_t> p = c.positions(l, kh);
                h = fnv(h, p.data(), p.size() * sizeof(int32_t));
            }
        }
    return h;
}

TEST(H2o, SameBitsForThreads123BothPositionModes) {
    for (const char *pos : {"original", "realign"}) {
        const std::string base = std::string("policy=h2o budget=40 recent=8 obs_window=16 capacity=64 prompt_scores=window positions=") + pos;
        const uint64_t h1 = run_hash(base + " threads=1");
        EXPECT_EQ(run_hash(base + " threads=2"), h1) << pos;
        EXPECT_EQ(run_hash(base + " threads=3"), h1) << pos;
    }
}

TEST(H2o, ConfigErrorsNameTheKey) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    const kvp_config before = cfg;
    const struct {
        const char *spec;
        const char *needle;
    } bad[] = {{"policy=h2o budget=0", "budget"},
               {"policy=h2o budget=8 recent=9", "recent=9"},
               {"policy=h2o budget=8 recent=2 capacity=8", "capacity"},
               {"policy=h2o block=0", "block"},
               {"policy=h2o block=5000", "block"},
               {"policy=h2o total_capacity=-1", "total_capacity"},
               {"policy=h2o total_capacity=x", "total_capacity"}};
    for (const auto &b : bad) ref::expect_config_rejected(cfg, b.spec, b.needle);
    EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0);
}

// kvp_get_layer_stats: counters add up to kvp_get_stats; sparsity is 0 for uniform attention and
// near 1 when one key takes all the weight; bad input is rejected and changes nothing.
TEST(LayerStats, CountersAndSparsity) {
    const kvp_model m = ref::model(2, 2, 1, 8, KVP_ROPE_NONE);
    ref::Cache c(m, "policy=h2o budget=10 recent=2");
    std::vector<float> q(16, 0.0f), k(8), v(8, 1.0f), o(16);
    ref::Rng rng(1);
    for (int t = 0; t < 30; ++t) {
        rng.fill(k);
        for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_decode(c.c, l, q.data(), k.data(), v.data(), o.data()), KVP_OK);
    }
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    uint64_t live = 0, ev = 0, pe = 0;
    for (uint32_t l = 0; l < 2; ++l) {
        kvp_layer_stats ls;
        ls.struct_size = sizeof ls;
        ASSERT_EQ(kvp_get_layer_stats(c.c, l, &ls), KVP_OK);
        EXPECT_EQ(ls.capacity, 11u);
        EXPECT_EQ(ls.len, 10u);
        EXPECT_EQ(ls.live_bytes, 10u * 2 * 8 * 4);
        EXPECT_EQ(ls.evict_threshold, 0u);
        EXPECT_EQ(ls.lazy, -1);
        EXPECT_NEAR(ls.sparsity, 0.0f, 1e-4);  // q = 0: uniform over 11 keys
        live += ls.live_bytes;
        ev += ls.tokens_evicted;
        pe += ls.prune_events;
    }
    EXPECT_EQ(live, s.live_bytes);
    EXPECT_EQ(ev, s.tokens_evicted);
    EXPECT_EQ(pe, s.prune_events);
    EXPECT_EQ(ev, 2u * 20);
    // one key dominates: q aligned with a key of huge norm
    std::vector<float> qb(16, 30.0f), kb(8, 30.0f);
    ASSERT_EQ(kvp_decode(c.c, 0, qb.data(), kb.data(), v.data(), o.data()), KVP_OK);
    kvp_layer_stats ls;
    ls.struct_size = sizeof ls;
    ASSERT_EQ(kvp_get_layer_stats(c.c, 0, &ls), KVP_OK);
    EXPECT_GT(ls.sparsity, 0.99f);
    EXPECT_LE(ls.sparsity, 1.0f);
    // bad input
    EXPECT_EQ(kvp_get_layer_stats(c.c, 2, &ls), KVP_ERR_LAYER);
    EXPECT_EQ(kvp_get_layer_stats(c.c, 0, nullptr), KVP_ERR_ARG);
    EXPECT_EQ(kvp_get_layer_stats(nullptr, 0, &ls), KVP_ERR_ARG);
    kvp_layer_stats small;
    small.struct_size = 4;
    EXPECT_EQ(kvp_get_layer_stats(c.c, 0, &small), KVP_ERR_ARG);
}

}  // namespace
