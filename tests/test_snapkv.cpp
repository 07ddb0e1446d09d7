// SnapKV and PyramidKV (src/policies/snapkv.h, pyramidkv.h): the kept tokens of every KV head
// after each staged prefill and each decode step, checked against an independent double
// simulation written here from the explicit q/k inputs (window votes over all keys the window
// sees, pooling per query head with the reference's padding, GQA mean, top budget - w plus the
// window; h2o-style decode eviction at capacity - 1), chunked prompts, the prompt staging area
// (a prompt far larger than the layer in one call), outputs against a double attention (also
// realign), shared pools, threads, the pyramid budgets and config errors.
#include <gtest/gtest.h>
#include <math.h>

#include <algorithm>
#include <functional>
#include <set>

#include "cache.h"
#include "config_support.h"
#include "reference.h"

namespace {

using ref::Inputs;

struct Params {
    uint32_t budget, obs, kernel;
    bool avg;
    uint32_t cap, recent;  // decode: keep cap - 1, the `recent` newest never evicted
};

// One KV head's state in the simulation: kept original indices (ascending) and h2o scores.
struct Head {
    std::vector<uint32_t> kept;
    std::vector<double> score;
};

// Weights of query head hq at query token t over `keys` (original positions = indices).
std::vector<double> weights(const Inputs &in, uint32_t hq, uint32_t t, const std::vector<uint32_t> &keys) {
    std::vector<int64_t> kp(keys.begin(), keys.end());
    return ref::weights(in.m, hq, &in.q[size_t(t) * in.nq + size_t(hq) * in.m.head_dim], t, in.k.data(), keys, kp);
}

struct Selection {
    std::vector<uint32_t> kept;   // the simulation's choice
    std::vector<double> vote;     // per prefix token (logical order)
    std::vector<uint32_t> all;    // held + chunk, logical order
    uint32_t P = 0, w = 0;
};

// SnapKV over `held` plus the chunk [t0, t0 + n) for KV head h, budget b. Updates the head's h2o
// scores (raw window mass summed over the group, every token the window sees).
Selection snap_select(const Inputs &in, uint32_t h, Head &hd, uint32_t t0, uint32_t n, const Params &p, uint32_t b) {
    Selection s;
    s.all = hd.kept;
    std::vector<double> score = hd.score;
    for (uint32_t i = 0; i < n; ++i) {
        s.all.push_back(t0 + i);
        score.push_back(0.0);
    }
    const uint32_t L = uint32_t(s.all.size());
    s.w = std::min(p.obs, n);
    s.P = L - s.w;
    std::vector<std::vector<double>> raw(in.G, std::vector<double>(L, 0.0));
    for (uint32_t i = n - s.w; i < n; ++i) {
        const uint32_t t = t0 + i;
        const std::vector<uint32_t> vis(s.all.begin(), s.all.begin() + (L - n + i + 1));
        for (uint32_t g = 0; g < in.G; ++g) {
            const std::vector<double> wv = weights(in, h * in.G + g, t, vis);
            for (size_t j = 0; j < vis.size(); ++j) {
                raw[g][j] += wv[j];
                score[j] += wv[j];
            }
        }
    }
    // pooling per query head over the prefix, padding kernel/2 (avg: zeros, /kernel; max: ignored)
    s.vote.assign(s.P, 0.0);
    const int hk = int(p.kernel / 2);
    for (uint32_t g = 0; g < in.G; ++g) {
        for (int j = 0; j < int(s.P); ++j) {
            double a = p.avg ? 0.0 : -INFINITY;
            for (int i = j - hk; i <= j + hk; ++i) {
                const double x = i >= 0 && i < int(s.P) ? raw[g][i] : (p.avg ? 0.0 : -INFINITY);
                a = p.avg ? a + x : std::max(a, x);
            }
            s.vote[j] += p.avg ? a / p.kernel : a;
        }
    }
    for (double &x : s.vote) x /= in.G;
    // keep: min(L, b): the window (clamped) and the top prefix votes, newer first on ties
    const uint32_t keep = std::min(L, b), wk = std::min(s.w, keep), sel = keep - wk;
    std::vector<uint32_t> order(s.P);
    for (uint32_t j = 0; j < s.P; ++j) order[j] = j;
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t c) { return s.vote[a] > s.vote[c] || (s.vote[a] == s.vote[c] && a > c); });
    std::set<uint32_t> keepj(order.begin(), order.begin() + (keep >= L ? s.P : sel));
    for (uint32_t j = L - wk; j < L; ++j) keepj.insert(j);
    if (keep >= L)
        for (uint32_t j = 0; j < L; ++j) keepj.insert(j);
    Head nh;
    for (uint32_t j : keepj) {
        nh.kept.push_back(s.all[j]);
        nh.score.push_back(score[j]);
        s.kept.push_back(s.all[j]);
    }
    hd = nh;
    return s;
}

// The library's kept set is acceptable when it equals the simulation's or differs only by near
// ties (every prefix token it kept instead scores within tol of every one it dropped); it is then
// adopted, with the simulation's scores.
bool agree(const std::vector<int32_t> &lib, const Selection &s, Head &hd, const std::vector<double> &all_score,
           double tol, bool *tie) {
    *tie = false;
    std::vector<uint32_t> want = s.kept;
    if (std::vector<int32_t>(want.begin(), want.end()) == lib) return true;
    if (lib.size() != want.size()) return false;
    std::set<int32_t> L(lib.begin(), lib.end());
    double min_kept = INFINITY, max_dropped = -INFINITY;
    for (uint32_t j = 0; j < s.all.size(); ++j) {
        const bool kept = L.count(int32_t(s.all[j])) > 0;
        if (j >= s.P) {
            if (!kept && j >= s.all.size() - std::min<size_t>(s.w, want.size())) return false;  // kept window
            continue;
        }
        if (kept) min_kept = std::min(min_kept, s.vote[j]);
        else max_dropped = std::max(max_dropped, s.vote[j]);
    }
    if (min_kept < max_dropped - tol) return false;
    *tie = true;
    Head nh;
    for (uint32_t j = 0; j < s.all.size(); ++j)
        if (L.count(int32_t(s.all[j]))) {
            nh.kept.push_back(s.all[j]);
            nh.score.push_back(all_score[j]);
        }
    hd = nh;
    return true;
}

// h2o's decode rule on the simulation: append t, accumulate the group's weights, evict the
// lowest outside the recent ones while over cap - 1. Returns the highest victim score.
double decode_step(const Inputs &in, uint32_t h, Head &hd, uint32_t t, const Params &p) {
    hd.kept.push_back(t);
    hd.score.push_back(0.0);
    for (uint32_t g = 0; g < in.G; ++g) {
        const std::vector<double> wv = weights(in, h * in.G + g, t, hd.kept);
        for (size_t j = 0; j < wv.size(); ++j) hd.score[j] += wv[j];
    }
    const uint32_t L = uint32_t(hd.kept.size()), D = p.cap - 1;
    if (L <= D) return -1;
    const uint32_t r = std::min(p.recent, D);
    std::vector<uint32_t> cand;
    for (uint32_t j = 0; j + r < L; ++j) cand.push_back(j);
    std::sort(cand.begin(), cand.end(),
              [&](uint32_t a, uint32_t b) { return hd.score[a] < hd.score[b] || (hd.score[a] == hd.score[b] && a < b); });
    const uint32_t e = L - D;
    std::set<uint32_t> gone(cand.begin(), cand.begin() + e);
    const double top = hd.score[cand[e - 1]];
    Head nh;
    for (uint32_t j = 0; j < L; ++j)
        if (!gone.count(j)) {
            nh.kept.push_back(hd.kept[j]);
            nh.score.push_back(hd.score[j]);
        }
    hd = nh;
    return top;
}

std::string spec_of(const char *policy, const Params &p, const std::string &extra = "") {
    return std::string("policy=") + policy + " budget=" + std::to_string(p.budget) + " obs_window=" +
           std::to_string(p.obs) + " pool_kernel=" + std::to_string(p.kernel) + " pool=" + (p.avg ? "avg" : "max") +
           " recent=" + std::to_string(p.recent) + (p.cap ? " capacity=" + std::to_string(p.cap) : "") + " " + extra;
}

// Prefill the chunks (one kvp_prefill each), then decode to T; every head's kept set against
// the simulation after every call.
void run_selection(const Inputs &in, const Params &p, const std::vector<uint32_t> &chunks, const std::string &extra = "",
                   const char *policy = "snapkv") {
    ref::Cache c(in.m, spec_of(policy, p, extra));
    ASSERT_NE(c.c, nullptr);
    Params pp = p;
    if (!pp.cap) pp.cap = kvp_layer_capacity(c.c, 0);
    std::vector<Head> sim(in.m.n_kv_heads);
    std::vector<float> out(size_t(in.T) * in.nq);
    uint32_t t = 0, ties = 0, decisions = 0;
    const double tol = 1e-5;
    for (uint32_t n : chunks) {
        ASSERT_EQ(kvp_prefill(c.c, 0, n, nullptr, in.qt(t), in.kt(t), in.vt(t), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        for (uint32_t h = 0; h < in.m.n_kv_heads; ++h) {
            Head before = sim[h];
            const Selection s = snap_select(in, h, sim[h], t, n, pp, p.budget);
            // scores of every token of the call (for adoption)
            Head probe = before;
            std::vector<double> all_score;
            {
                Selection s2 = snap_select(in, h, probe, t, n, Params{pp.budget, pp.obs, pp.kernel, pp.avg, pp.cap, pp.recent},
                                           uint32_t(before.kept.size() + n));  // keep everything: scores of all
                all_score = probe.score;
            }
            bool tie = false;
            ASSERT_TRUE(agree(c.positions(0, h), s, sim[h], all_score, tol, &tie)) << "chunk at " << t << " head " << h;
            ties += tie;
            ++decisions;
        }
        t += n;
    }
    double worst_near = 0;
    for (; t < in.T; ++t) {
        ASSERT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << kvp_last_error(c.c);
        for (uint32_t h = 0; h < in.m.n_kv_heads; ++h) {
            const Head pre = sim[h];
            Head pre_app = pre;  // with t appended and scored, before eviction
            pre_app.kept.push_back(t);
            pre_app.score.push_back(0.0);
            for (uint32_t g = 0; g < in.G; ++g) {
                const std::vector<double> wv = weights(in, h * in.G + g, t, pre_app.kept);
                for (size_t j = 0; j < wv.size(); ++j) pre_app.score[j] += wv[j];
            }
            const double top = decode_step(in, h, sim[h], t, pp);
            const std::vector<int32_t> lib = c.positions(0, h);
            if (std::vector<int32_t>(sim[h].kept.begin(), sim[h].kept.end()) == lib) continue;
            // near tie: the library evicted another token whose score is within tol of the victim's
            Head nh;
            size_t li = 0;
            bool ok = lib.size() == sim[h].kept.size();
            for (size_t j = 0; j < pre_app.kept.size() && ok; ++j) {
                if (li < lib.size() && uint32_t(lib[li]) == pre_app.kept[j]) {
                    nh.kept.push_back(pre_app.kept[j]);
                    nh.score.push_back(pre_app.score[j]);
                    ++li;
                } else if (pre_app.score[j] > top + tol || j + std::min(pp.recent, pp.cap - 1) >= pre_app.kept.size()) {
                    ok = false;
                } else {
                    worst_near = std::max(worst_near, top - pre_app.score[j]);
                }
            }
            ASSERT_TRUE(ok && li == lib.size()) << "decode t=" << t << " head " << h;
            sim[h] = nh;
            ++ties;
        }
        decisions += in.m.n_kv_heads;
    }
    EXPECT_LE(ties, decisions / 20 + 1) << "near ties adopted";
}

TEST(SnapKv, SelectionMatchesSimulationMaxPoolGqa2) {
    const Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 160, 1, 1.5f);
    run_selection(in, Params{24, 8, 7, false, 0, 4}, {120});
}
TEST(SnapKv, SelectionMatchesSimulationAvgPoolNoRope) {
    const Inputs in(ref::model(1, 2, 2, 8, KVP_ROPE_NONE), 140, 2, 2.0f);
    run_selection(in, Params{30, 6, 5, true, 0, 3}, {100});
}
TEST(SnapKv, SelectionMatchesSimulationGqa4KernelOneNeox) {  // kernel 1: no pooling
    const Inputs in(ref::model(1, 8, 2, 16, KVP_ROPE_NEOX), 130, 3, 1.5f);
    run_selection(in, Params{20, 5, 1, false, 0, 2}, {90});
}
TEST(SnapKv, SelectionMatchesSimulationMha) {
    const Inputs in(ref::model(1, 3, 3, 12, KVP_ROPE_GPTJ), 110, 4, 2.0f);
    run_selection(in, Params{16, 4, 3, true, 0, 4}, {80});
}
// Chunked prompt: each call selects over what the layer holds plus the chunk, voted by the
// chunk's own window (the window of a short chunk is the chunk).
TEST(SnapKv, ChunkedPromptVotesByEachChunksWindow) {
    const Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 200, 5, 1.5f);
    run_selection(in, Params{24, 8, 5, false, 0, 4}, {60, 50, 5, 30});
}
// Decode with room: the layer grows to capacity - 1 before eviction starts.
TEST(SnapKv, DecodeGrowsToCapacityThenEvictsLikeH2o) {
    const Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 200, 6, 1.5f);
    run_selection(in, Params{20, 6, 7, false, 40, 5}, {70});
}
// Budget below the window is refused (issue 28: the window is kept whole, so such a budget
// silently meant "the last `budget` tokens"); a window the spec does not give follows the budget,
// and a window equal to the budget keeps the last `budget` tokens.
TEST(SnapKv, BudgetBelowWindowIsRefusedAndTheWindowFollowsTheBudget) {
    const Inputs in(ref::model(1, 2, 1, 8, KVP_ROPE_GPTJ), 60, 7, 1.0f);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &in.m), KVP_OK);
    char err[256] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=snapkv budget=3 obs_window=8", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "budget=3 is below obs_window=8"), nullptr) << err;
    run_selection(in, Params{3, 3, 3, true, 0, 1}, {40});
    ref::Cache c(in.m, "policy=snapkv budget=3");  // obs_window follows: 3
    std::vector<float> out(size_t(40) * in.nq);
    ASSERT_EQ(kvp_prefill(c.c, 0, 40, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
    EXPECT_EQ(c.positions(0, 0), (std::vector<int32_t>{37, 38, 39}));
}
// The papers' generation room (issue 28): the prompt's selection stays whole while max_new=G tokens
// are generated (default G = budget): G decode steps evict nothing, the G-th step's prune is the
// first, and from then on the layer holds capacity - 1 tokens. For snapkv and pyramidkv, one
// call and chunked under max_prompt.
TEST(SnapKv, SelectionStaysWholeForMaxNewTokens) {
    const kvp_model m = ref::model(3, 4, 2, 16, KVP_ROPE_GPTJ);
    const Inputs in(m, 260, 21, 1.0f);
    for (const char *spec : {"policy=snapkv budget=40 obs_window=8 max_new=12", "policy=snapkv budget=12 obs_window=4",
                             "policy=pyramidkv budget=40 obs_window=8 max_new=12",
                             "policy=snapkv budget=40 obs_window=8 max_new=12 max_prompt=200"}) {
        ref::Cache c(m, spec);
        ASSERT_NE(c.c, nullptr) << spec;
        const uint32_t P = 200, G = 12;  // max_new=12, or the default max_new = budget = 12
        std::vector<float> out(size_t(P) * in.nq);
        for (uint32_t l = 0; l < 3; ++l) {
            for (uint32_t t0 = 0; t0 < P; t0 += strstr(spec, "max_prompt") ? 64 : P) {
                const uint32_t n = std::min(P - t0, strstr(spec, "max_prompt") ? 64u : P);
                ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, in.qt(t0), in.kt(t0), in.vt(t0), out.data(), nullptr), KVP_OK)
                    << spec << ": " << kvp_last_error(c.c);
            }
        }
        ASSERT_EQ(kvp_prompt_end(c.c), KVP_OK);
        std::vector<std::vector<int32_t>> sel(3);
        for (uint32_t l = 0; l < 3; ++l) {
            sel[l] = c.positions(l, 1);
            EXPECT_EQ(kvp_layer_capacity(c.c, l), c.c->layers[l].geom.lp.budget + G) << spec << " layer " << l;
            if (strstr(spec, "pyramidkv") && l == 2) {
                EXPECT_LT(sel[l].size(), c.c->layers[l].geom.lp.budget);  // a smaller share than its store
            }
        }
        for (uint32_t t = P; t < P + G + 3; ++t) {
            for (uint32_t l = 0; l < 3; ++l) {
                ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << spec;
                const std::vector<int32_t> now = c.positions(l, 1);
                const uint32_t gen = t - P + 1;  // decode steps so far
                if (gen < G) {  // nothing evicted: the selection, then every generated token
                    std::vector<int32_t> want = sel[l];
                    for (uint32_t i = P; i <= t; ++i) want.push_back(int32_t(i));
                    EXPECT_EQ(now, want) << spec << " layer " << l << " step " << gen;
                } else {  // the G-th step's prune is the first: the layer's share + G - 1 from then on
                    EXPECT_EQ(now.size(), sel[l].size() + G - 1) << spec << " layer " << l << " step " << gen;
                }
            }
        }
    }
    // a capacity below budget + max_new is refused at create, naming both
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[512] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=snapkv budget=40 max_new=12 capacity=50", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "capacity=50 is below budget + max_new = 52"), nullptr) << err;
    // an explicit capacity without max_new is the caller's choice (budget + 1 is today's h2o-style rule)
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=snapkv budget=40 capacity=41", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
}

// A prompt no longer than the budget is kept whole.
TEST(SnapKv, ShortPromptIsKeptWhole) {
    const Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 30, 8, 1.0f);
    ref::Cache c(in.m, "policy=snapkv budget=32 obs_window=8");
    std::vector<float> out(size_t(30) * in.nq);
    ASSERT_EQ(kvp_prefill(c.c, 0, 30, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(c.positions(0, h).size(), 30u);
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    EXPECT_EQ(s.tokens_evicted, 0u);
    EXPECT_EQ(s.prune_events, 0u);
}

// Uniform attention (q = 0): every prefix token gets the same vote bits, so the tie rule decides:
// the older token is evicted first, the newest prefix tokens are kept (float and fixed scores).
TEST(SnapKv, TiesKeepTheNewerToken) {
    for (const char *score : {"float", "fixed"}) {
        const kvp_model m = ref::model(1, 2, 1, 8, KVP_ROPE_GPTJ);
        ref::Cache c(m, std::string("policy=snapkv budget=7 obs_window=3 pool=avg pool_kernel=1 score=") + score);
        std::vector<float> q(30 * 2 * 8, 0.0f), kv(30 * 8);
        ref::Rng rng(5);
        rng.fill(kv);
        ASSERT_EQ(kvp_prefill(c.c, 0, 30, nullptr, q.data(), kv.data(), kv.data(), nullptr, nullptr), KVP_OK);
        EXPECT_EQ(c.positions(0, 0), (std::vector<int32_t>{23, 24, 25, 26, 27, 28, 29})) << score;
    }
}

// Pooling smooths: one strongly voted token brings its neighbours (max pooling, kernel 5) and the
// vote is the mean over the group: a token only the second query head of a group looks at wins.
TEST(SnapKv, PoolingKeepsNeighboursOfAHeavyToken) {
    const kvp_model m = ref::model(1, 4, 2, 8, KVP_ROPE_NONE);
    Inputs in(m, 64, 9, 0.05f);
    for (uint32_t t = 0; t < in.T; ++t)
        for (uint32_t hq = 0; hq < 4; ++hq)
            for (uint32_t i = 0; i < 8; ++i) in.q[size_t(t) * in.nq + hq * 8 + i] = (hq % 2 == 1 && i == 0) ? 3.0f : 0.0f;
    for (uint32_t h = 0; h < 2; ++h) in.k[size_t(20) * in.nkv + h * 8] = 3.0f;  // token 20 is heavy
    ref::Cache c(m, "policy=snapkv budget=13 obs_window=8 pool=max pool_kernel=5");
    std::vector<float> out(size_t(64) * in.nq);
    ASSERT_EQ(kvp_prefill(c.c, 0, 64, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
    for (uint32_t h = 0; h < 2; ++h) {
        const std::vector<int32_t> p = c.positions(0, h);
        ASSERT_EQ(p.size(), 13u);
        // 18..22 (the heavy token and its pooled neighbours), then the window 56..63
        EXPECT_EQ(std::vector<int32_t>(p.begin(), p.begin() + 5), (std::vector<int32_t>{18, 19, 20, 21, 22})) << h;
        EXPECT_EQ(p[5], 56);
    }
    run_selection(in, Params{13, 8, 5, false, 0, 2}, {64});
}

// The case: a 200-token prompt into budget=48 with no explicit capacity (49 slots per
// layer) takes one kvp_prefill call per layer; kvp_prefill_room reports the staging area.
TEST(SnapKv, PromptLargerThanTheLayerTakesOneCall) {
    const kvp_model m = ref::model(3, 4, 2, 16, KVP_ROPE_GPTJ);
    const Inputs in(m, 230, 10, 1.0f);
    ref::Cache c(m, "policy=snapkv budget=48 max_new=1");
    ASSERT_NE(c.c, nullptr);
    EXPECT_EQ(kvp_layer_capacity(c.c, 0), 49u);
    EXPECT_EQ(kvp_prefill_room(c.c), 1024u);  // the default staging area: max(1024, capacity)
    std::vector<float> out(size_t(200) * in.nq);
    for (uint32_t l = 0; l < 3; ++l) {
        ASSERT_EQ(kvp_prefill(c.c, l, 200, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        EXPECT_EQ(kvp_layer_len(c.c, l), 48u);
    }
    EXPECT_EQ(kvp_prefill_room(c.c), 1024u);
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    EXPECT_EQ(s.live_bytes, 3u * 2 * 48 * 2 * 16 * 4);
    EXPECT_EQ(s.tokens_evicted, 3u * 2 * (200 - 48));
    // the peak counts the staged prompt of one layer (the memory really touched)
    EXPECT_EQ(s.peak_live_bytes, uint64_t(2 * 48 + 200) * 2 * 2 * 16 * 4);
    for (uint32_t t = 200; t < 230; ++t)
        for (uint32_t l = 0; l < 3; ++l) ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c.c, 2), 48u);
    // an explicit staging area bounds the chunk, with a message naming it
    ref::Cache small(m, "policy=snapkv budget=48 max_new=1 prefill_stage=100");
    EXPECT_EQ(kvp_prefill_room(small.c), 100u);
    EXPECT_EQ(kvp_prefill(small.c, 0, 101, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(small.c), "prefill_stage"), nullptr) << kvp_last_error(small.c);
    EXPECT_EQ(kvp_layer_len(small.c, 0), 0u);
    // without queries the chunk is stored directly: it must fit the layer
    EXPECT_EQ(kvp_prefill(small.c, 0, 60, nullptr, nullptr, in.kt(0), in.vt(0), nullptr, nullptr), KVP_ERR_FULL);
    ASSERT_EQ(kvp_prefill(small.c, 0, 40, nullptr, nullptr, in.kt(0), in.vt(0), nullptr, nullptr), KVP_OK);
    EXPECT_EQ(kvp_layer_len(small.c, 0), 40u);
}

// Every prefill and decode output equals a double attention over what the layer held plus the
// call's tokens (causal), at original positions or (realign) cache-relative ones.
void check_outputs(const char *pos_mode) {
    const kvp_model m = ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ);
    const Inputs in(m, 260, 11, 2.5f);
    const bool realign = std::string(pos_mode) == "realign";
    ref::Cache c(m, std::string("policy=snapkv budget=24 obs_window=6 pool_kernel=3 capacity=30 recent=3 positions=") +
                        pos_mode);
    std::vector<float> out(size_t(100) * in.nq);
    double worst = 0;
    uint32_t t = 0;
    auto check = [&](uint32_t tok, const std::vector<int32_t> &held, uint32_t h, uint32_t i_in_chunk, const float *o) {
        std::vector<uint32_t> idx(held.begin(), held.end());
        for (uint32_t j = tok - i_in_chunk; j <= tok; ++j) idx.push_back(j);
        std::vector<int64_t> kp(idx.size());
        for (size_t j = 0; j < kp.size(); ++j) kp[j] = realign ? int64_t(j) : int64_t(idx[j]);
        std::vector<double> expect;
        ref::attend(m, in.qt(tok), realign ? int64_t(idx.size()) - 1 : tok, in.k.data(), in.v.data(), idx, kp, expect);
        for (uint32_t i = h * 2 * 16; i < (h + 1) * 2 * 16; ++i) worst = std::max(worst, fabs(expect[i] - double(o[i])));
    };
    auto prefill = [&](uint32_t n) {
        const std::vector<int32_t> b0 = c.positions(0, 0), b1 = c.positions(0, 1);
        ASSERT_EQ(kvp_prefill(c.c, 0, n, nullptr, in.qt(t), in.kt(t), in.vt(t), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        for (uint32_t i = 0; i < n; ++i) {
            check(t + i, b0, 0, i, &out[size_t(i) * in.nq]);
            check(t + i, b1, 1, i, &out[size_t(i) * in.nq]);
        }
        t += n;
    };
    prefill(100);  // > capacity: staged
    for (int round = 0; round < 4; ++round) {
        for (int s = 0; s < 30; ++s, ++t) {
            const std::vector<int32_t> b0 = c.positions(0, 0), b1 = c.positions(0, 1);
            ASSERT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
            check(t, b0, 0, 0, out.data());
            check(t, b1, 1, 0, out.data());
        }
        prefill(9);  // a chunk over a scattered store
    }
    EXPECT_LT(worst, 3e-4) << pos_mode;
    const std::vector<int32_t> p = c.positions(0, 0);
    EXPECT_GT(p.back() - p.front() + 1, int32_t(p.size()) + 10);  // scattered
}
TEST(SnapKv, OutputsMatchReferenceOriginal) { check_outputs("original"); }
TEST(SnapKv, OutputsMatchReferenceRealign) { check_outputs("realign"); }

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// 3 layers: prefill 90 (staged), decode to 250; hash of outputs and kept positions.
uint64_t run_hash(const std::string &spec, const std::function<void(kvp_cache *)> &each = nullptr) {
    const kvp_model m = ref::model(3, 8, 4, 24, KVP_ROPE_GPTJ);
    const Inputs in(m, 170, 9, 2.0f);
    ref::Cache c(m, spec);
    if (!c.c) return 0;
    std::vector<float> out(size_t(90) * in.nq);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t l = 0; l < 3; ++l) {
        EXPECT_EQ(kvp_prefill(c.c, l, 90, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << spec << ": " << kvp_last_error(c.c);
        h = fnv(h, out.data(), out.size() * sizeof(float));
    }
    for (uint32_t t = 90; t < 170; ++t)
        for (uint32_t l = 0; l < 3; ++l) {
            EXPECT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << spec << ": " << kvp_last_error(c.c);
            h = fnv(h, out.data(), size_t(in.nq) * sizeof(float));
            for (uint32_t kh = 0; kh < 4; ++kh) {
                const std::vector<int32_t> p = c.positions(l, kh);
                h = fnv(h, p.data(), p.size() * sizeof(int32_t));
            }
            if (each) each(c.c);
        }
    return h;
}

// Same bits for threads 1/2/3: both policies, both position modes, with and without a shared
// pool, float and fixed scoring (each pair of these covered).
TEST(SnapKv, SameBitsForThreads123PositionsAndPools) {
    const char *const combos[] = {"policy=snapkv positions=original score=float",
                                  "policy=snapkv positions=realign total_capacity=120 score=fixed",
                                  "policy=pyramidkv positions=original total_capacity=120 score=fixed",
                                  "policy=pyramidkv positions=realign score=float",
                                  "policy=snapkv positions=realign score=float",
                                  "policy=pyramidkv positions=original score=fixed"};
    for (const char *combo : combos) {
        const std::string base = std::string(combo) + " budget=40 obs_window=8 recent=6 capacity=56";
        const uint64_t h1 = run_hash(base + " threads=1");
        EXPECT_EQ(run_hash(base + " threads=2"), h1) << base;
        EXPECT_EQ(run_hash(base + " threads=3"), h1) << base;
    }
}

// A shared pool smaller than the layers' stores: every call succeeds, the selection keeps what
// fits (the window first), live bytes never exceed the pool, and the same run without sharing
// differs (the pool bound it).
TEST(SnapKv, SharedPoolKeepsWhatFits) {
    uint64_t max_live = 0, pool_bytes = 0;
    const std::string spec = "policy=snapkv budget=40 obs_window=8 recent=6 capacity=56 total_capacity=112";
    const uint64_t hs = run_hash(spec, [&](kvp_cache *c) {
        kvp_stats s;
        s.struct_size = sizeof s;
        kvp_get_stats(c, &s);
        max_live = std::max(max_live, s.live_bytes);
        pool_bytes = uint64_t(c->plan.nblocks) * c->plan.block * 4 * kvp::token_bytes(c);
        for (uint32_t l = 0; l < 3; ++l)
            for (uint32_t h = 0; h < 4; ++h) {
                ASSERT_GE(kvp::head_of(c, l, h).len(), 8u);  // at least the window fits (one block each)
            }
    });
    EXPECT_LE(max_live, pool_bytes);
    EXPECT_NE(hs, run_hash("policy=snapkv budget=40 obs_window=8 recent=6 capacity=56"));
}

// ---- PyramidKV ----

// The schedule written independently from KVCache-Factory's PyramidKVCluster.update_kv (its
// clamp to the prompt and its uniform fallback), per-layer rounding as kvpress: S = budget - w;
// a selection over q tokens keeps min(q, budget) when q < 2S; else min = floor(S/beta), max =
// 2S - min, clamped to max = q - w (min = 2S - max) when max >= q - w; layer l keeps
// round(max - l (max - min)/(L - 1)) + w. One layer or budget <= w: budget.
uint32_t pyramid(uint32_t L, uint32_t budget, uint32_t w, double beta, uint32_t l, uint32_t q) {
    if (budget <= w || L == 1) return std::min(budget, q);
    const double S = budget - w;
    if (q < budget || q < 2 * S) return std::min(budget, q);
    double mn = std::floor(S / beta), mx = 2 * S - mn;
    if (mx >= double(q) - w) {
        mx = double(q) - w;
        mn = 2 * S - mx;
    }
    return std::min(q, uint32_t(std::lround(std::max(0.0, mx - l * (mx - mn) / (L - 1)))) + w);
}
// A layer's store: its largest share over every prompt length.
uint32_t pyramid_most(uint32_t L, uint32_t budget, uint32_t w, double beta, uint32_t l) {
    uint32_t most = 0;
    for (uint32_t q = 1; q <= 6 * budget + 64; ++q) most = std::max(most, pyramid(L, budget, w, beta, l, q));
    return most;
}

// Every layer keeps its share for the prompt's length (short, uniform, clamped, long), and its
// store holds its largest share plus the generation room.
TEST(PyramidKv, SharesFollowThePromptLength) {
    struct Case {
        uint32_t L, budget, w;
        float beta;
        uint32_t cap;
    } cases[] = {{6, 64, 8, 20, 0}, {6, 64, 8, 1, 0},  {1, 50, 8, 20, 0},    {2, 10, 8, 20, 0}, {8, 9, 8, 20, 0},
                 {4, 5, 5, 20, 0},  {8, 40, 8, 20, 0}, {5, 64, 8, 3, 80}, {3, 12, 8, 2, 0}};
    for (const Case &k : cases) {
        const kvp_model m = ref::model(k.L, 2, 1, 8, KVP_ROPE_GPTJ);
        std::string spec = "policy=pyramidkv budget=" + std::to_string(k.budget) + " obs_window=" + std::to_string(k.w) +
                           " beta=" + std::to_string(k.beta);
        if (k.cap) spec += " capacity=" + std::to_string(k.cap);
        const uint32_t S = k.budget > k.w ? k.budget - k.w : 0, mn = uint32_t(std::floor(S / k.beta));
        const uint32_t qs[] = {1, k.budget - 1, k.budget, S > 0 ? 2 * S - 1 : 1, 2 * S, 2 * S + k.w / 2,
                               2 * S - mn + k.w, 2 * S - mn + k.w + 1, 3 * k.budget + 7};
        ref::Cache sizes(m, spec);
        ASSERT_NE(sizes.c, nullptr) << spec;
        uint64_t sum = 0;
        for (uint32_t l = 0; l < k.L; ++l) {
            const uint32_t most = pyramid_most(k.L, k.budget, k.w, k.beta, l);
            const uint32_t cap = most + (k.cap ? k.cap - k.budget : k.budget);  // max_new default: budget
            EXPECT_EQ(kvp_layer_capacity(sizes.c, l), cap) << spec << " layer " << l;
            sum += cap;
        }
        EXPECT_EQ(sizes.c->plan.sum_cap, sum) << spec;  // the arena holds exactly the per-layer stores
        for (uint32_t q : qs) {
            if (q == 0) continue;
            ref::Cache c(m, spec);
            const Inputs in(m, q, 40 + q, 1.0f);
            std::vector<float> out(size_t(q) * in.nq);
            uint64_t kept = 0;
            for (uint32_t l = 0; l < k.L; ++l) {
                ASSERT_EQ(kvp_prefill(c.c, l, q, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
                    << spec << " q " << q << ": " << kvp_last_error(c.c);
                const uint32_t b = pyramid(k.L, k.budget, k.w, k.beta, l, q);
                EXPECT_GE(b, 1u) << spec;  // never 0 tokens
                EXPECT_EQ(kvp_layer_len(c.c, l), b) << spec << " q " << q << " layer " << l;
                kept += b;
            }
            if (k.budget > k.w && k.L > 1 && q >= 2 * S && q >= k.budget) {  // the mean is the budget, within rounding
                EXPECT_LE(std::abs(int64_t(kept) - int64_t(k.L) * k.budget), int64_t(k.L)) << spec << " q " << q;
            }
        }
    }
}

// The case, budget 3/4 of the prompt: below 2 (budget - w) every layer keeps the budget
// (the old schedule kept the top layers whole and left ~10% of the budget unused). Just above,
// the top layer is clamped to the prompt less the window and the lower layers take the rest.
TEST(PyramidKv, ShortPromptsAreUniformAndTheTopIsClamped) {
    const kvp_model m = ref::model(8, 4, 2, 16, KVP_ROPE_GPTJ);
    const Inputs in(m, 320, 5, 1.0f);
    std::vector<float> out(size_t(320) * in.nq);
    ref::Cache u(m, "policy=pyramidkv budget=240 obs_window=32");
    for (uint32_t l = 0; l < 8; ++l) {
        ASSERT_EQ(kvp_prefill(u.c, l, 320, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(kvp_layer_len(u.c, l), 240u) << l;
    }
    const uint32_t q = 270, B = 160, w = 32;  // S = 128: min 6, max 250 >= q - w = 238: clamped
    ref::Cache c(m, "policy=pyramidkv budget=160 obs_window=32");
    uint64_t kept = 0;
    for (uint32_t l = 0; l < 8; ++l) {
        ASSERT_EQ(kvp_prefill(c.c, l, q, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(kvp_layer_len(c.c, l), pyramid(8, B, w, 20, l, q)) << l;
        kept += kvp_layer_len(c.c, l);
    }
    EXPECT_EQ(kvp_layer_len(c.c, 0), q);        // max = q - w: the whole prompt
    EXPECT_EQ(kvp_layer_len(c.c, 7), 18u + w);  // min = 2S - max = 18
    EXPECT_LE(std::abs(int64_t(kept) - 8 * int64_t(B)), 8);
}

// Each layer's selection follows its own budget (the same simulation as snapkv).
TEST(PyramidKv, EachLayerSelectsWithItsBudget) {
    const kvp_model m = ref::model(4, 4, 2, 16, KVP_ROPE_GPTJ);
    const Inputs in(m, 150, 12, 1.5f);
    ref::Cache c(m, "policy=pyramidkv budget=30 obs_window=6 pool=avg pool_kernel=5 beta=4");
    std::vector<float> out(size_t(120) * in.nq);
    for (uint32_t l = 0; l < 4; ++l) {
        ASSERT_EQ(kvp_prefill(c.c, l, 120, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
        const uint32_t b = pyramid(4, 30, 6, 4, l, 120);
        for (uint32_t h = 0; h < 2; ++h) {
            Head hd;
            const Selection s = snap_select(in, h, hd, 0, 120, Params{30, 6, 5, true, 0, 32}, b);
            EXPECT_EQ(c.positions(l, h), std::vector<int32_t>(s.kept.begin(), s.kept.end())) << "layer " << l << " head " << h;
            EXPECT_EQ(c.positions(l, h).size(), b);
        }
    }
    // a one-layer model works and is snapkv
    const kvp_model m1 = ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ);
    ref::Cache p1(m1, "policy=pyramidkv budget=30 obs_window=6"), s1(m1, "policy=snapkv budget=30 obs_window=6");
    ASSERT_EQ(kvp_prefill(p1.c, 0, 120, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(s1.c, 0, 120, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
    EXPECT_EQ(p1.positions(0, 1), s1.positions(0, 1));
    EXPECT_EQ(p1.positions(0, 1).size(), 30u);
}

TEST(SnapKvConfig, ErrorsNameTheKey) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    const struct {
        const char *spec;
        const char *needle;
    } bad[] = {{"policy=snapkv pool_kernel=4", "pool_kernel"},
               {"policy=snapkv pool_kernel=0", "pool_kernel"},
               {"policy=snapkv pool=median", "pool"},
               {"policy=snapkv budget=0", "budget"},
               {"policy=snapkv budget=8 capacity=8", "capacity"},
               {"policy=snapkv obs_window=0", "obs_window"},
               {"policy=snapkv prefill_stage=x", "prefill_stage"},
               {"policy=snapkv prefill_stage=4294967295", "prefill_stage"},
               {"policy=pyramidkv beta=0.5", "beta"},
               {"policy=pyramidkv budget=8 capacity=5", "capacity"},
               {"policy=pyramidkv pool_kernel=2", "pool_kernel"}};
    for (const auto &b : bad) ref::expect_config_rejected(cfg, b.spec, b.needle);
}

}  // namespace
