// head_budget=ada (AdaKV per-head budgets, issue 32 item 1; snapkv.cpp "AdaKV"): on constructed
// inputs where one KV head's window attends to few tokens and another's to many, the heads keep
// different numbers of tokens that sum to the layer's uniform total, each at least its floor, and
// exactly the tokens an independent double re-implementation of the allocation keeps (SnapKV
// votes, the floor, one ranking over both heads); live bytes follow the per-head lengths and equal
// uniform's; pyramidkv splits each layer's share the same way; chunked prompts and max_prompt
// work; heads lend blocks while decoding (every head decodes its generation room, one past the
// layer capacity, the layer at uniform's total); score=fixed gives the same bits for threads 1/2/3
// (forced parallel, heads lending); state save/load round trips; drafts commit as the prefill of
// the accepted tokens (also over lent blocks);
// contradictory configs are refused (no allocation after create: test_alloc).
#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "arena.h"
#include "kvprune/kvprune.h"
#include "policies/h2o.h"
#include "policies/policy.h"
#include "reference.h"

namespace {

constexpr uint32_t kN = 96, kB = 24, kW = 4, kHd = 16;

// One layer (or more), 2 KV heads of 2 query heads each, no RoPE. Every query is 4 e0, so a key's
// logit is its e0 component. KV head 0's keys are 0 except two tokens at ~8 (its window puts
// almost all its mass on those two: concentrated); KV head 1 has 40 tokens at ~8 (its mass spreads
// over them: dispersed). Small per-token offsets keep every vote distinct.
// kv = 1: KV head 0's keys only (the sharp head).
ref::Inputs inputs(uint32_t layers, uint64_t seed, uint32_t T = kN, uint32_t kv = 2) {
    ref::Inputs in(ref::model(layers, 4, kv, kHd, KVP_ROPE_NONE), T, seed, 1.0f);
    std::fill(in.q.begin(), in.q.end(), 0.0f);
    std::fill(in.k.begin(), in.k.end(), 0.0f);
    for (uint32_t t = 0; t < T; ++t) {
        for (uint32_t qh = 0; qh < 4; ++qh) in.q[size_t(t) * in.nq + size_t(qh) * kHd] = 4.0f;
        const float off = 0.01f * float(t % 89);
        in.k[size_t(t) * in.nkv] = (t % 89 == 10 || t % 89 == 50 ? 8.0f : 0.0f) + off;
        if (kv > 1) in.k[size_t(t) * in.nkv + kHd] = (t % 89 >= 20 && t % 89 < 60 ? 8.0f : 0.0f) + off;
    }
    return in;
}

std::string spec(const char *policy, const char *hb, const std::string &more = "") {
    return std::string("policy=") + policy + " budget=" + std::to_string(kB) + " obs_window=" + std::to_string(kW) +
           " pool_kernel=1 head_budget=" + hb + (more.empty() ? "" : " " + more);
}

// h2o at budget kB, capacity kB + 8: a prompt goes in chunks of 8 after the first 32 tokens
std::string h2o_spec(const char *hb, const std::string &more) {
    return std::string("policy=h2o budget=") + std::to_string(kB) + " capacity=" + std::to_string(kB + 8) +
           " head_budget=" + hb + " " + more;
}
void prefill(ref::Cache &c, const ref::Inputs &in, uint32_t layers, uint32_t t0, uint32_t n);
void h2o_prompt(ref::Cache &c, const ref::Inputs &in, uint32_t layers, uint32_t n) {
    for (uint32_t t = 0; t < n;) {
        const uint32_t k = t == 0 ? (n < kB + 8 ? n : kB + 8) : (n - t < 8 ? n - t : 8);
        prefill(c, in, layers, t, k);
        t += k;
    }
}

void prefill(ref::Cache &c, const ref::Inputs &in, uint32_t layers, uint32_t t0, uint32_t n) {
    for (uint32_t l = 0; l < layers; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, &in.q[size_t(t0) * in.nq], &in.k[size_t(t0) * in.nkv],
                              &in.v[size_t(t0) * in.nkv], nullptr, nullptr),
                  KVP_OK);
}

// The double reference of one whole-prompt selection over T tokens: each KV head's SnapKV votes
// (kernel 1: no pooling; the group mean of the window queries' summed weights), its window and
// floor(a * B) best tokens, then the best of the rest over both heads, each head up to
// min(T, capacity - 1) tokens. Returns the kept positions per head; *margin is the smallest
// relative gap between adjacent votes in the final ranking (ties in float would be unstable).
std::vector<std::vector<int32_t>> reference(const ref::Inputs &in, uint32_t T, uint32_t B, uint32_t cap, double a,
                                            double *margin) {
    const kvp_model &m = in.m;
    const uint32_t H = m.n_kv_heads, G = in.G, P = T - kW;
    std::vector<std::vector<double>> vote(H, std::vector<double>(P, 0.0));
    std::vector<uint32_t> idx(T);
    std::vector<int64_t> kpos(T);
    for (uint32_t h = 0; h < H; ++h) {
        for (uint32_t g = 0; g < G; ++g) {
            const uint32_t qh = h * G + g;
            for (uint32_t t = T - kW; t < T; ++t) {
                std::vector<uint32_t> id(t + 1);
                std::vector<int64_t> kp(t + 1);
                for (uint32_t j = 0; j <= t; ++j) id[j] = j, kp[j] = j;
                const std::vector<double> w =
                    ref::weights(m, qh, &in.q[size_t(t) * in.nq + size_t(qh) * kHd], t, in.k.data(), id, kp);
                for (uint32_t j = 0; j < P; ++j) vote[h][j] += w[j] / G;
            }
        }
    }
    std::vector<std::vector<uint8_t>> kept(H, std::vector<uint8_t>(T, 0));
    std::vector<uint32_t> cnt(H, 0);
    const uint32_t u = B < T ? B : T, fl = std::max<uint32_t>(uint32_t(a * u), kW), mx = std::min(T, cap - 1);
    uint32_t rest = 0;
    *margin = 1.0;
    for (uint32_t h = 0; h < H; ++h) {
        for (uint32_t j = T - kW; j < T; ++j) kept[h][j] = 1;
        std::vector<uint32_t> order(P);
        for (uint32_t j = 0; j < P; ++j) order[j] = j;
        std::sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
            return vote[h][x] > vote[h][y] || (vote[h][x] == vote[h][y] && x > y);
        });
        for (uint32_t i = 0; i < fl - kW; ++i) kept[h][order[i]] = 1;
        if (fl - kW > 0 && fl - kW < P)
            *margin = std::min(*margin, (vote[h][order[fl - kW - 1]] - vote[h][order[fl - kW]]) / vote[h][order[fl - kW - 1]]);
        cnt[h] = fl;
        rest += u - fl;
    }
    struct Cand {
        double v;
        uint32_t h, j;
    };
    std::vector<Cand> cand;
    for (uint32_t h = 0; h < H; ++h)
        for (uint32_t j = 0; j < P; ++j)
            if (!kept[h][j]) cand.push_back({vote[h][j], h, j});
    std::sort(cand.begin(), cand.end(), [](const Cand &x, const Cand &y) {
        if (x.v != y.v) return x.v > y.v;
        if (x.j != y.j) return x.j > y.j;
        return x.h < y.h;
    });
    size_t last = 0;
    for (size_t i = 0; i < cand.size() && rest > 0; ++i) {
        if (cnt[cand[i].h] >= mx) continue;
        kept[cand[i].h][cand[i].j] = 1;
        ++cnt[cand[i].h];
        --rest;
        last = i;
    }
    if (last + 1 < cand.size()) *margin = std::min(*margin, (cand[last].v - cand[last + 1].v) / cand[last].v);
    std::vector<std::vector<int32_t>> pos(H);
    for (uint32_t h = 0; h < H; ++h)
        for (uint32_t j = 0; j < T; ++j)
            if (kept[h][j]) pos[h].push_back(int32_t(j));
    return pos;
}

TEST(Ada, HeadsKeepWhatTheReferenceAllocates) {
    const ref::Inputs in = inputs(1, 7);
    ref::Cache ada(in.m, spec("snapkv", "ada"));
    ref::Cache uni(in.m, spec("snapkv", "uniform"));
    prefill(ada, in, 1, 0, kN);
    prefill(uni, in, 1, 0, kN);
    double margin = 0;
    const auto want = reference(in, kN, kB, 2 * kB, 0.2, &margin);
    ASSERT_GT(margin, 1e-4) << "the inputs put two votes too close for a float/double comparison";
    const std::vector<int32_t> p0 = ada.positions(0, 0), p1 = ada.positions(0, 1);
    EXPECT_EQ(p0, want[0]);
    EXPECT_EQ(p1, want[1]);
    // the sharp head gives budget to the diffuse one; the total is uniform's
    EXPECT_LT(p0.size(), kB);
    EXPECT_GT(p1.size(), kB);
    EXPECT_EQ(p0.size() + p1.size(), 2 * kB);
    EXPECT_GE(p0.size(), kW);
    EXPECT_EQ(uni.positions(0, 0).size(), kB);
    EXPECT_EQ(uni.positions(0, 1).size(), kB);
    printf("per-head kept: ada %zu + %zu, uniform %u + %u\n", p0.size(), p1.size(), kB, kB);
    // live bytes follow the per-head lengths (and so equal uniform's); the pools are the same size
    kvp_stats sa{}, su{};
    sa.struct_size = su.struct_size = sizeof(kvp_stats);
    ASSERT_EQ(kvp_get_stats(ada.c, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(uni.c, &su), KVP_OK);
    EXPECT_EQ(sa.live_bytes, uint64_t(p0.size() + p1.size()) * kHd * 2 * sizeof(float));
    EXPECT_EQ(sa.live_bytes, su.live_bytes);
    printf("arena bytes: ada %zu, uniform %zu (the difference is the ranking region)\n", ada.bytes, uni.bytes);
}

// The floor: with ada_floor=1 every head keeps exactly its uniform share (and so uniform's tokens).
TEST(Ada, FloorOneIsUniform) {
    const ref::Inputs in = inputs(1, 11);
    ref::Cache ada(in.m, spec("snapkv", "ada", "ada_floor=1"));
    ref::Cache uni(in.m, spec("snapkv", "uniform"));
    prefill(ada, in, 1, 0, kN);
    prefill(uni, in, 1, 0, kN);
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(ada.positions(0, h), uni.positions(0, h)) << h;
    // a floor of 0.5 bounds the sharp head from below
    ref::Cache half(in.m, spec("snapkv", "ada", "ada_floor=0.5"));
    prefill(half, in, 1, 0, kN);
    EXPECT_GE(half.positions(0, 0).size(), kB / 2);
    EXPECT_EQ(half.positions(0, 0).size() + half.positions(0, 1).size(), 2 * kB);
}

void decode(ref::Cache &c, const ref::Inputs &in, uint32_t layers, uint32_t t0, uint32_t n, std::vector<float> *outs = nullptr) {
    std::vector<float> out(in.nq);
    for (uint32_t t = t0; t < t0 + n; ++t)
        for (uint32_t l = 0; l < layers; ++l) {
            ASSERT_EQ(kvp_decode(c.c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                                 out.data()),
                      KVP_OK)
                << kvp_last_error(c.c);
            if (outs) outs->insert(outs->end(), out.begin(), out.end());
        }
}

// A draft of tokens t0..t0+2 on `drafted`, 2 of them accepted, against `twin` given a prefill of
// those 2: both keep the same tokens in layer 0.
void draft_as_prefill(ref::Cache &drafted, ref::Cache &twin, const ref::Inputs &in, uint32_t t0) {
    std::vector<float> dout(size_t(3) * in.nq);
    ASSERT_EQ(kvp_draft_begin(drafted.c), KVP_OK) << kvp_last_error(drafted.c);
    ASSERT_EQ(kvp_prefill(drafted.c, 0, 3, nullptr, &in.q[size_t(t0) * in.nq], &in.k[size_t(t0) * in.nkv],
                          &in.v[size_t(t0) * in.nkv], dout.data(), nullptr),
              KVP_OK)
        << kvp_last_error(drafted.c);
    ASSERT_EQ(kvp_draft_commit(drafted.c, 2), KVP_OK) << kvp_last_error(drafted.c);
    prefill(twin, in, 1, t0, 2);
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(drafted.positions(0, h), twin.positions(0, h)) << h;
}

// Heads lend blocks (pool.h "Lending"): the reference appends every generated token to every head.
// After the selection (sharp head ~6 tokens, diffuse head ~42, uniform 24 + 24 of capacity 48),
// every head decodes its generation room (capacity - its share = 24) without an eviction: the
// diffuse head then holds 42 + 23 = 65 tokens, more than the layer's capacity, with blocks the
// sharp head leaves (its own pool holds 48 slots), and the layer holds exactly uniform's total.
// Past the room, each head keeps its own limit and the totals stay equal.
TEST(Ada, HeadsLendBlocksWhileDecoding) {
    const uint32_t room = kB - 1;  // capacity 2B: decode appends, then a head keeps limit - 1
    const ref::Inputs in = inputs(1, 7, kN + 40);
    ref::Cache ada(in.m, spec("snapkv", "ada"));
    ref::Cache uni(in.m, spec("snapkv", "uniform"));
    prefill(ada, in, 1, 0, kN);
    prefill(uni, in, 1, 0, kN);
    const size_t k0 = ada.positions(0, 0).size(), k1 = ada.positions(0, 1).size();
    ASSERT_LT(k0, kB);
    ASSERT_GT(k1 + room, 2 * kB) << "the diffuse head must outgrow the layer capacity";
    decode(ada, in, 1, kN, room);
    decode(uni, in, 1, kN, room);
    const std::vector<int32_t> p0 = ada.positions(0, 0), p1 = ada.positions(0, 1);
    EXPECT_EQ(p0.size(), k0 + room);
    EXPECT_EQ(p1.size(), k1 + room);
    for (uint32_t t = kN; t < kN + room; ++t) {  // every generated token in every head
        EXPECT_TRUE(std::binary_search(p0.begin(), p0.end(), int32_t(t))) << t;
        EXPECT_TRUE(std::binary_search(p1.begin(), p1.end(), int32_t(t))) << t;
    }
    EXPECT_EQ(kvp_layer_capacity(ada.c, 0), 2 * kB);
    EXPECT_EQ(kvp_layer_len(ada.c, 0), k1 + room);  // past the capacity
    EXPECT_EQ(p0.size() + p1.size(), uni.positions(0, 0).size() + uni.positions(0, 1).size());
    kvp_stats sa{}, su{};
    sa.struct_size = su.struct_size = sizeof(kvp_stats);
    ASSERT_EQ(kvp_get_stats(ada.c, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(uni.c, &su), KVP_OK);
    EXPECT_EQ(sa.live_bytes, uint64_t(p0.size() + p1.size()) * kHd * 2 * sizeof(float));
    EXPECT_EQ(sa.live_bytes, su.live_bytes);
    EXPECT_EQ(sa.tokens_evicted, su.tokens_evicted - 0) << "the selection's evictions only";
    // past the room: each head at its own limit (kept + capacity - share - 1), the totals equal
    decode(ada, in, 1, kN + room, 17);
    decode(uni, in, 1, kN + room, 17);
    EXPECT_EQ(ada.positions(0, 0).size(), k0 + room);
    EXPECT_EQ(ada.positions(0, 1).size(), k1 + room);
    EXPECT_EQ(ada.positions(0, 0).size() + ada.positions(0, 1).size(),
              uni.positions(0, 0).size() + uni.positions(0, 1).size());
    // a draft over lent blocks commits as the prefill of its accepted tokens (a twin cache)
    ref::Cache twin(in.m, spec("snapkv", "ada", "max_draft=4")), drafted(in.m, spec("snapkv", "ada", "max_draft=4"));
    for (ref::Cache *c : {&twin, &drafted}) {
        prefill(*c, in, 1, 0, kN);
        decode(*c, in, 1, kN, room);
    }
    ASSERT_GT(kvp_layer_len(drafted.c, 0), kvp_layer_capacity(drafted.c, 0));
    const uint32_t t0 = kN + room;
    ASSERT_NO_FATAL_FAILURE(draft_as_prefill(drafted, twin, in, t0));
    std::vector<float> o1, o2;
    decode(drafted, in, 1, t0 + 2, 4, &o1);
    decode(twin, in, 1, t0 + 2, 4, &o2);
    EXPECT_EQ(memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0);
    printf("per-head lengths after decoding: ada %zu + %zu, uniform %zu + %zu (capacity %u); arena ada %zu, uniform %zu\n",
           ada.positions(0, 0).size(), ada.positions(0, 1).size(), uni.positions(0, 0).size(), uni.positions(0, 1).size(),
           kvp_layer_capacity(ada.c, 0), ada.bytes, uni.bytes);
}

// pyramidkv: each layer's share (its pyramid budget) is split over its heads; the decode limit of a
// head is what it kept + the generation room, so the layer's total stays uniform's while decoding.
TEST(Ada, PyramidSplitsEachLayersShare) {
    const uint32_t L = 3, T = 160;
    const ref::Inputs in = inputs(L, 5, T + 40);
    ref::Cache ada(in.m, spec("pyramidkv", "ada", "beta=4"));
    ref::Cache uni(in.m, spec("pyramidkv", "uniform", "beta=4"));
    prefill(ada, in, L, 0, T);
    prefill(uni, in, L, 0, T);
    std::vector<float> out(in.nq);
    for (uint32_t l = 0; l < L; ++l) {
        const size_t ua = ada.positions(l, 0).size() + ada.positions(l, 1).size();
        const size_t uu = uni.positions(l, 0).size() + uni.positions(l, 1).size();
        EXPECT_EQ(ua, uu) << "layer " << l;
    }
    EXPECT_NE(ada.positions(0, 0).size(), uni.positions(0, 0).size());
    for (uint32_t t = T; t < T + 40; ++t)
        for (uint32_t l = 0; l < L; ++l) {
            ASSERT_EQ(kvp_decode(ada.c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                                 out.data()),
                      KVP_OK);
            ASSERT_EQ(kvp_decode(uni.c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                                 out.data()),
                      KVP_OK);
        }
    // A head that kept more than the uniform share grows past its layer's capacity with the
    // blocks its other head leaves (heads lend, pool.h): every layer holds uniform's total.
    bool past = false;
    for (uint32_t l = 0; l < L; ++l) {
        const size_t ua = ada.positions(l, 0).size() + ada.positions(l, 1).size();
        const size_t uu = uni.positions(l, 0).size() + uni.positions(l, 1).size();
        EXPECT_EQ(ua, uu) << "layer " << l << " after decoding past the generation room";
        past = past || kvp_layer_len(ada.c, l) > kvp_layer_capacity(ada.c, l);
    }
    EXPECT_TRUE(past) << "no head outgrew its layer's capacity: nothing was lent";
}

// Chunked prompts: every chunk is one allocation over what the heads hold plus the chunk; with
// max_prompt the whole prompt is one allocation, the same as a one-call prefill.
TEST(Ada, ChunksAndWholePrompt) {
    const ref::Inputs in = inputs(1, 7, kN + 40);
    ref::Cache one(in.m, spec("snapkv", "ada"));
    ref::Cache whole(in.m, spec("snapkv", "ada", "max_prompt=" + std::to_string(kN)));
    ref::Cache chunked(in.m, spec("snapkv", "ada"));
    prefill(one, in, 1, 0, kN);
    for (uint32_t t = 0; t < kN; t += 32) {
        prefill(whole, in, 1, t, 32);
        prefill(chunked, in, 1, t, 32);
    }
    ASSERT_EQ(kvp_prompt_end(whole.c), KVP_OK);
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(whole.positions(0, h), one.positions(0, h)) << h;
    // after the prompt's end its heads lend as after a one-call prefill (past the layer capacity)
    decode(one, in, 1, kN, 40);
    decode(whole, in, 1, kN, 40);
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(whole.positions(0, h), one.positions(0, h)) << h;
    EXPECT_GT(kvp_layer_len(whole.c, 0), kvp_layer_capacity(whole.c, 0));
    const size_t c0 = chunked.positions(0, 0).size(), c1 = chunked.positions(0, 1).size();
    EXPECT_EQ(c0 + c1, 2 * kB);
    EXPECT_LT(c0, c1);
}

// A policy's run (`work`: its prompt and decodes on a cache of spec + " threads=T") for T = 1, 2, 3
// with every call forced parallel: the outputs and the kept positions are the same bits; returns
// the kept positions per (layer, KV head). Then a state saved after `work` (threads default)
// loads into a fresh cache that decodes tokens t0..t0+n to the same bits as the original.
using Work = std::function<void(ref::Cache &, std::vector<float> *)>;
std::vector<std::vector<int32_t>> same_bits(const ref::Inputs &in, const std::string &spec, const Work &work, uint32_t t0,
                                            uint32_t n) {
    std::vector<float> o[3];
    std::vector<std::vector<int32_t>> p[3];
    {
        ref::ForceParallel force(true);
        for (uint32_t t = 1; t <= 3; ++t) {
            ref::Cache c(in.m, spec + " threads=" + std::to_string(t));
            work(c, &o[t - 1]);
            for (uint32_t l = 0; l < in.m.n_layers; ++l)
                for (uint32_t h = 0; h < in.m.n_kv_heads; ++h) p[t - 1].push_back(c.positions(l, h));
        }
    }
    for (int t = 1; t < 3; ++t) {
        EXPECT_TRUE(o[t].size() == o[0].size() && memcmp(o[t].data(), o[0].data(), o[0].size() * sizeof(float)) == 0)
            << spec << ", " << t + 1 << " threads: the output bits differ";
        EXPECT_EQ(p[t], p[0]) << spec << ", " << t + 1 << " threads";
    }
    ref::Cache a(in.m, spec), b(in.m, spec);
    work(a, nullptr);
    a.copy_state_to(b);
    std::vector<float> oa, ob;
    decode(a, in, in.m.n_layers, t0, n, &oa);
    decode(b, in, in.m.n_layers, t0, n, &ob);
    EXPECT_EQ(memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)), 0) << spec << ": the loaded state";
    return p[0];
}

// snapkv ada over two prompt chunks (64 + 56 tokens, with queries) and 36 decodes, past the
// generation room (32): heads lend while the others run.
TEST(Ada, FixedScoresSameBitsForEveryThreadCount) {
    ref::Inputs in(ref::model(2, 8, 4, kHd), 176, 3, 2.0f);
    const uint32_t L = in.m.n_layers, T = 120, D = 36;
    const auto p1 = same_bits(in, spec("snapkv", "ada", "score=fixed budget=32"), [&](ref::Cache &c, std::vector<float> *o) {
        std::vector<float> out(size_t(T) * in.nq);
        for (uint32_t l = 0; l < L; ++l) {
            EXPECT_EQ(kvp_prefill(c.c, l, 64, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
            EXPECT_EQ(kvp_prefill(c.c, l, T - 64, nullptr, &in.q[64 * in.nq], &in.k[64 * in.nkv], &in.v[64 * in.nkv],
                                  out.data(), nullptr),
                      KVP_OK);
            if (o) o->insert(o->end(), out.begin(), out.begin() + size_t(T - 64) * in.nq);
        }
        decode(c, in, L, T, D, o);
    }, T + D, 20);
    size_t longest = 0;
    for (const auto &p : p1) longest = std::max(longest, p.size());
    EXPECT_GT(longest, 64u) << "no head outgrew the capacity (budget 32 + generation room 32): nothing was lent";
    bool differ = false;  // the heads of a layer really hold different numbers of tokens
    for (size_t i = 1; i < 4; ++i) differ = differ || p1[i].size() != p1[0].size();
    EXPECT_TRUE(differ);
}

// A state saved after the prompt and loaded into a fresh cache decodes to the same bits; the votes
// region (transient) is not part of the state.
TEST(Ada, StateRoundTrip) {
    const ref::Inputs in = inputs(1, 7, kN + 8);
    ref::Cache a(in.m, spec("snapkv", "ada"));
    ref::Cache b(in.m, spec("snapkv", "ada"));
    ref::Cache u(in.m, spec("snapkv", "uniform"));
    prefill(a, in, 1, 0, kN);
    prefill(u, in, 1, 0, kN);
    a.copy_state_to(b);
    EXPECT_EQ(kvp_state_size(a.c), kvp_state_size(u.c));  // nothing of the ranking region is saved
    std::vector<float> oa(in.nq), ob(in.nq);
    for (uint32_t t = kN; t < kN + 8; ++t) {
        ASSERT_EQ(kvp_decode(a.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv], oa.data()),
                  KVP_OK);
        ASSERT_EQ(kvp_decode(b.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv], ob.data()),
                  KVP_OK);
        EXPECT_EQ(memcmp(oa.data(), ob.data(), oa.size() * 4), 0) << t;
    }
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(a.positions(0, h), b.positions(0, h));
}

// A draft committed with `accepted` tokens leaves what a prefill of those tokens leaves: a staged
// selection whose allocation runs in the layer phase, the same heads' lengths and kept tokens.
TEST(Ada, DraftsCommitAsThePrefillOfTheAcceptedTokens) {
    const ref::Inputs in = inputs(1, 7, kN + 8);
    ref::Cache a(in.m, spec("snapkv", "ada", "max_draft=4"));
    ref::Cache b(in.m, spec("snapkv", "ada", "max_draft=4"));
    prefill(a, in, 1, 0, kN);
    prefill(b, in, 1, 0, kN);
    std::vector<float> out(size_t(4) * in.nq), o2(in.nq);
    ASSERT_NO_FATAL_FAILURE(draft_as_prefill(a, b, in, kN));
    EXPECT_NE(a.positions(0, 0).size(), a.positions(0, 1).size());
    const uint32_t t = kN + 2;
    ASSERT_EQ(kvp_decode(a.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv], out.data()),
              KVP_OK);
    ASSERT_EQ(kvp_decode(b.c, 0, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv], o2.data()),
              KVP_OK);
    EXPECT_EQ(memcmp(out.data(), o2.data(), o2.size() * sizeof(float)), 0);
}

// h2o with head_budget=ada (h2o.cpp "AdaKV over H2O"): with one KV head it is uniform H2O, bit
// for bit (prefill and decode, float and fixed scores).
TEST(Ada, H2oOneKvHeadIsUniform) {
    for (const char *score : {"float", "fixed"}) {
        const ref::Inputs in(ref::model(2, 4, 1, kHd), 140, 9, 2.0f);
        const std::string more = std::string("recent=4 score=") + score;
        ref::Cache ada(in.m, h2o_spec("ada", more)), uni(in.m, h2o_spec("uniform", more));
        std::vector<float> oa, ou;
        h2o_prompt(ada, in, 2, 100);
        h2o_prompt(uni, in, 2, 100);
        decode(ada, in, 2, 100, 40, &oa);
        decode(uni, in, 2, 100, 40, &ou);
        ASSERT_EQ(oa.size(), ou.size());
        EXPECT_EQ(memcmp(oa.data(), ou.data(), oa.size() * sizeof(float)), 0) << score;
        for (uint32_t l = 0; l < 2; ++l) EXPECT_EQ(ada.positions(l, 0), uni.positions(l, 0)) << score << " layer " << l;
    }
}

// h2o with head_budget=ada over two KV heads: the sharp head (its mass on two tokens) gives budget
// to the diffuse one; the layer keeps uniform's total after the prompt and after every decode
// step, each head at least its floor (its recent tokens); the diffuse head holds more than the
// layer capacity (budget + 8) with blocks the other leaves; live bytes equal uniform's.
TEST(Ada, H2oSplitsTheLayersBudget) {
    const ref::Inputs in = inputs(1, 7, kN + 40);
    ref::Cache ada(in.m, h2o_spec("ada", "recent=4")), uni(in.m, h2o_spec("uniform", "recent=4"));
    h2o_prompt(ada, in, 1, kN);
    h2o_prompt(uni, in, 1, kN);
    const size_t k0 = ada.positions(0, 0).size(), k1 = ada.positions(0, 1).size();
    EXPECT_EQ(k0 + k1, 2 * kB);
    EXPECT_LT(k0, kB);
    EXPECT_GT(k1, kB + 8);
    EXPECT_GE(k0, 4u);
    EXPECT_GT(kvp_layer_len(ada.c, 0), kvp_layer_capacity(ada.c, 0));
    for (uint32_t t = kN; t < kN + 40; ++t) {
        decode(ada, in, 1, t, 1);
        decode(uni, in, 1, t, 1);
        ASSERT_EQ(ada.positions(0, 0).size() + ada.positions(0, 1).size(), 2 * kB) << t;
        ASSERT_LE(kvp_layer_len(ada.c, 0), 2 * kvp_layer_capacity(ada.c, 0) - 1) << t;
    }
    kvp_stats sa{}, su{};
    sa.struct_size = su.struct_size = sizeof(kvp_stats);
    ASSERT_EQ(kvp_get_stats(ada.c, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(uni.c, &su), KVP_OK);
    EXPECT_EQ(sa.live_bytes, su.live_bytes);
    printf("h2o per-head kept: after the prompt ada %zu + %zu, after 40 decodes %zu + %zu (uniform %u + %u, capacity %u)\n", k0,
           k1, ada.positions(0, 0).size(), ada.positions(0, 1).size(), kB, kB, kvp_layer_capacity(ada.c, 0));
}

// h2o ada under max_prompt: the prompt, held whole in chunks (each head past its store's cap), is
// ranked once at its end as a one-call prefill of it into a cache large enough to take it; both
// then decode alike.
TEST(Ada, H2oWholePrompt) {
    const ref::Inputs in = inputs(1, 7, kN + 20);
    ref::Cache whole(in.m, h2o_spec("ada", "recent=4 max_prompt=" + std::to_string(kN)));
    ref::Cache one(in.m, "policy=h2o budget=" + std::to_string(kB) + " capacity=" + std::to_string(kN + 1) +
                             " head_budget=ada recent=4");
    for (uint32_t t = 0; t < kN; t += 8) prefill(whole, in, 1, t, 8);
    EXPECT_EQ(kvp_layer_len(whole.c, 0), kN) << "the prompt is held whole";
    ASSERT_EQ(kvp_prompt_end(whole.c), KVP_OK) << kvp_last_error(whole.c);
    prefill(one, in, 1, 0, kN);
    for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(whole.positions(0, h), one.positions(0, h)) << h;
    EXPECT_EQ(whole.positions(0, 0).size() + whole.positions(0, 1).size(), 2 * kB);
    std::vector<float> ow, oo;
    decode(whole, in, 1, kN, 20, &ow);
    decode(one, in, 1, kN, 20, &oo);
    EXPECT_EQ(memcmp(ow.data(), oo.data(), ow.size() * sizeof(float)), 0);
}


// h2o ada: the same bits for 1, 2 and 3 threads (every call forced parallel), and a state saved
// with lent blocks decodes on to the same bits in a fresh cache.
TEST(Ada, H2oThreadsAndState) {
    const ref::Inputs in = inputs(2, 3, 200);  // the sharp and the diffuse head in both layers
    const auto p = same_bits(in, h2o_spec("ada", "recent=4 score=fixed"), [&](ref::Cache &c, std::vector<float> *o) {
        h2o_prompt(c, in, 2, 120);
        decode(c, in, 2, 120, 30, o);
    }, 150, 30);
    size_t longest = 0;
    for (const auto &q : p) longest = std::max(longest, q.size());
    EXPECT_GT(longest, kB + 8u) << "no head outgrew the capacity";
}

// h2o ada's per-step path (h2o.cpp fast_phase: a bounded heap per head) keeps exactly what the
// full ranking keeps: the same run with the full ranking at every phase (the test hook
// h2o_ada_fast_max = 0) gives the same output bits and kept tokens (2 layers, float and fixed
// scores, recent 4, floors 0.2 and 0.9, chunked prompts then decodes).
TEST(Ada, H2oFastPathIsTheFullRanking) {
    const ref::Inputs in = inputs(2, 5, 200);
    for (const char *more : {"recent=4", "recent=4 score=fixed ada_floor=0.9", "recent=0 ada_floor=0"}) {
        std::vector<float> o[2];
        std::vector<std::vector<int32_t>> p[2];
        for (int full = 0; full < 2; ++full) {
            kvp::h2o_ada_fast_max = full ? 0 : 256;
            ref::Cache c(in.m, h2o_spec("ada", more));
            h2o_prompt(c, in, 2, 120);
            decode(c, in, 2, 120, 80, &o[full]);
            for (uint32_t l = 0; l < 2; ++l)
                for (uint32_t h = 0; h < 2; ++h) p[full].push_back(c.positions(l, h));
        }
        kvp::h2o_ada_fast_max = 256;
        EXPECT_TRUE(o[0].size() == o[1].size() && memcmp(o[0].data(), o[1].data(), o[0].size() * sizeof(float)) == 0) << more;
        EXPECT_EQ(p[0], p[1]) << more;
        EXPECT_NE(p[0][0].size(), p[0][1].size()) << more << ": the heads kept alike";
    }
}

// lethe with head_budget=ada (lethe.cpp "AdaKV over Lethe"): with one KV head every round and
// capacity cut is uniform Lethe's, bit for bit (float and fixed scores; a sparse config whose
// breakpoints are found, a dense one whose threshold doubles until the capacity binds; a shared
// pool).
std::string lethe_spec(const char *hb, const std::string &more) {
    return std::string("policy=lethe capacity=48 evict_threshold=16 sinks=2 recent_ratio=0.1 head_budget=") + hb + " " + more;
}
TEST(Ada, LetheOneKvHeadIsUniform) {
    const ref::Inputs sharp = inputs(2, 9, 160, 1), dense(ref::model(2, 4, 1, kHd), 160, 9, 2.0f);
    for (const char *more : {"sparse_ratio=20 score=float", "sparse_ratio=20 score=fixed recent_ratio=0.5", "sparse_ratio=1000 score=fixed",
                             "sparse_ratio=20 recent_ratio=0.95",  // no candidates: the threshold doubles
                             "sparse_ratio=20 total_capacity=80 score=float"}) {
        const bool dense_run = strstr(more, "1000") != nullptr;  // no breakpoint: the threshold doubles
        const ref::Inputs &in = dense_run ? dense : sharp;
        ref::Cache ada(in.m, lethe_spec("ada", more)), uni(in.m, lethe_spec("uniform", more));
        std::vector<float> oa, ou;
        prefill(ada, in, 2, 0, 30);
        prefill(uni, in, 2, 0, 30);
        for (uint32_t t = 30; t < 160; ++t) {  // the thresholds agree after every step
            decode(ada, in, 2, t, 1, &oa);
            decode(uni, in, 2, t, 1, &ou);
            for (uint32_t l = 0; l < 2; ++l) {
                kvp_layer_stats sa{}, su{};
                sa.struct_size = su.struct_size = sizeof sa;
                ASSERT_EQ(kvp_get_layer_stats(ada.c, l, &sa), KVP_OK);
                ASSERT_EQ(kvp_get_layer_stats(uni.c, l, &su), KVP_OK);
                ASSERT_EQ(sa.evict_threshold, su.evict_threshold) << more << " layer " << l << " token " << t;
            }
        }
        ASSERT_EQ(oa.size(), ou.size());
        EXPECT_EQ(memcmp(oa.data(), ou.data(), oa.size() * sizeof(float)), 0) << more;
        for (uint32_t l = 0; l < 2; ++l) {
            EXPECT_EQ(ada.positions(l, 0), uni.positions(l, 0)) << more << " layer " << l;
            kvp_layer_stats sa{}, su{};
            sa.struct_size = su.struct_size = sizeof sa;
            ASSERT_EQ(kvp_get_layer_stats(ada.c, l, &sa), KVP_OK);
            ASSERT_EQ(kvp_get_layer_stats(uni.c, l, &su), KVP_OK);
            EXPECT_EQ(sa.evict_threshold, su.evict_threshold) << more;
            if (dense_run || strstr(more, "recent_ratio")) {  // doubled, or raised by a round (c + R)
                EXPECT_GT(su.evict_threshold, 16u) << more << ": the threshold never moved";
            }
        }
        kvp_stats st{};
        st.struct_size = sizeof st;
        ASSERT_EQ(kvp_get_stats(uni.c, &st), KVP_OK);
        EXPECT_GT(st.tokens_evicted, 100u) << more;
    }
}

// lethe ada over two KV heads (the sharp head's mass on two tokens, the diffuse head's over 40):
// a round's breakpoint over both heads' candidates gives the diffuse head more tokens; every
// decode step leaves the layer within KV heads x (capacity - 1) and each head within its store's
// cap; live bytes follow the per-head lengths.
TEST(Ada, LetheSplitsTheLayersTokens) {
    const ref::Inputs in = inputs(1, 7, 200);
    const std::string more = "sparse_ratio=20";
    ref::Cache ada(in.m, lethe_spec("ada", more)), uni(in.m, lethe_spec("uniform", more));
    prefill(ada, in, 1, 0, 30);
    prefill(uni, in, 1, 0, 30);
    size_t most_apart = 0, max0 = 0, max1 = 0;
    for (uint32_t t = 30; t < 200; ++t) {
        decode(ada, in, 1, t, 1);
        decode(uni, in, 1, t, 1);
        const size_t a0 = ada.positions(0, 0).size(), a1 = ada.positions(0, 1).size();
        ASSERT_LE(a0 + a1, 2u * 47) << t;
        ASSERT_LE(std::max(a0, a1), 2u * 48 - 1) << t;
        ASSERT_EQ(uni.positions(0, 0), uni.positions(0, 1)) << t;
        most_apart = std::max(most_apart, a1 > a0 ? a1 - a0 : 0);
        max0 = std::max(max0, a0);
        max1 = std::max(max1, a1);
        kvp_stats sa{};
        sa.struct_size = sizeof sa;
        ASSERT_EQ(kvp_get_stats(ada.c, &sa), KVP_OK);
        ASSERT_EQ(sa.live_bytes, uint64_t(a0 + a1) * kHd * 2 * sizeof(float)) << t;
    }
    EXPECT_GT(most_apart, 10u) << "the heads kept alike";
    // ada_floor=1: each head keeps its even share of a round's candidates (both heads have enough
    // of them here), so the heads stay within a token or two of each other
    ref::Cache even(in.m, lethe_spec("ada", more + " ada_floor=1"));
    prefill(even, in, 1, 0, 30);
    for (uint32_t t = 30; t < 200; ++t) {
        decode(even, in, 1, t, 1);
        const size_t e0 = even.positions(0, 0).size(), e1 = even.positions(0, 1).size();
        ASSERT_LE(e0 > e1 ? e0 - e1 : e1 - e0, 2u) << t << ": the floor did not bind";
    }
    printf("lethe per-head lengths: ada now %zu + %zu (most %zu, %zu), uniform %zu + %zu (capacity 48)\n",
           ada.positions(0, 0).size(), ada.positions(0, 1).size(), max0, max1, uni.positions(0, 0).size(),
           uni.positions(0, 1).size());
}

// lethe ada over two identical KV heads: every score and position ties across the heads, and the
// pinned tie-break (the lower KV head keeps) decides: head 1 never holds more than head 0, and
// holds only tokens head 0 holds.
TEST(Ada, LetheTiesGoToTheLowerHead) {
    ref::Inputs in = inputs(1, 7, 160);
    for (uint32_t t = 0; t < in.T; ++t)
        for (uint32_t i = 0; i < kHd; ++i) {
            in.k[size_t(t) * in.nkv + kHd + i] = in.k[size_t(t) * in.nkv + i];
            in.v[size_t(t) * in.nkv + kHd + i] = in.v[size_t(t) * in.nkv + i];
        }
    ref::Cache ada(in.m, lethe_spec("ada", "sparse_ratio=20 score=fixed"));
    prefill(ada, in, 1, 0, 30);
    bool apart = false;
    for (uint32_t t = 30; t < 160; ++t) {
        decode(ada, in, 1, t, 1);
        const std::vector<int32_t> p0 = ada.positions(0, 0), p1 = ada.positions(0, 1);
        ASSERT_LE(p1.size(), p0.size()) << t;
        ASSERT_TRUE(std::includes(p0.begin(), p0.end(), p1.begin(), p1.end())) << t;
        apart = apart || p1.size() < p0.size();
    }
    EXPECT_TRUE(apart) << "no tie was broken";
}

// The config and arena plan of `spec` on a Llama-3-8B shape (32 layers, 32 query / 8 KV heads,
// head_dim 128).
bool big_plan(const std::string &spec, kvp_config *cfg, kvp::ArenaPlan *p) {
    const kvp_model big = ref::model(32, 32, 8, 128, KVP_ROPE_NEOX, 0, 500000.0f);
    char err[256];
    return kvp_config_default(cfg, &big) == KVP_OK && kvp_config_apply(cfg, spec.c_str(), err, sizeof err) == KVP_OK &&
           kvp::arena_plan(*cfg, p, nullptr, nullptr);
}

// The phase region of `pol` with head_budget=ada on the Llama-3-8B shape (1 and 2 threads,
// max_prompt, score=fixed): more than `least` bytes, within the scratch parts that are dead in
// the layer phase (runs, work, partials, private rows); no_state: the plan has no state region.
void phase_fits_dead_span(const char *pol, size_t least, bool no_state) {
    for (const char *more : {"", " threads=2", " max_prompt=512", " score=fixed"}) {
        kvp_config cfg;
        kvp::ArenaPlan p;
        const std::string s = std::string(pol) + " head_budget=ada" + more;
        ASSERT_TRUE(big_plan(s, &cfg, &p)) << s;
        const size_t rec = kvp::policy_of(cfg).phase_bytes(cfg, p.stage);
        if (no_state) {
            EXPECT_EQ(p.pstate_bytes, 0u) << s;
        }
        EXPECT_GT(rec, least) << s;
        EXPECT_LE(rec, p.scr_policy - p.scr_runs) << s;
    }
}

// h2o's and lethe's layer-wide rankings (head_budget=ada) keep one record per token of the layer
// in participant 0's scratch (policy.h phase_bytes, layer_tokens_cap): the arena has no region
// for them, and the most tokens a layer holds at a layer phase (a prompt held whole, every
// head at its capacity + max_prompt) fill the records exactly. That run keeps and outputs what
// the same run with room to spare (a larger max_prompt) does, and for h2o what a one-call prefill
// does.
TEST(Ada, RankingRecordsFitTheLayersMostTokens) {
    // the plan, on a Llama-3-8B shape: no state region; the records fit the dead scratch
    for (const char *pol : {"policy=h2o budget=2048", "policy=lethe budget=2048"}) phase_fits_dead_span(pol, 8u * 8 * 2048, true);
    const ref::Inputs in = inputs(1, 7, kN + 20);
    // h2o: capacity 25 (budget + 1), 71 more while the prompt is open; lethe: 48 and 48
    const std::string h2o = "policy=h2o budget=" + std::to_string(kB) + " head_budget=ada recent=4";
    const std::string lethe = lethe_spec("ada", "sparse_ratio=20");
    for (const auto &c : {std::make_pair(h2o, kN - (kB + 1)), std::make_pair(lethe, kN - 48)}) {
        ref::Cache tight(in.m, c.first + " max_prompt=" + std::to_string(c.second));
        ref::Cache roomy(in.m, c.first + " max_prompt=" + std::to_string(kN));
        ASSERT_EQ(kvp_layer_capacity(tight.c, 0) + c.second, kN) << c.first;
        for (uint32_t t = 0; t < kN; t += 8) {
            prefill(tight, in, 1, t, 8);
            prefill(roomy, in, 1, t, 8);
        }
        // the layer phase at the prompt's end ranks every token: exactly the records' count
        kvp_config cfg;
        char err[256];
        ASSERT_EQ(kvp_config_default(&cfg, &in.m), KVP_OK);
        ASSERT_EQ(kvp_config_apply(&cfg, (c.first + " max_prompt=" + std::to_string(c.second)).c_str(), err, sizeof err), KVP_OK);
        ASSERT_EQ(tight.positions(0, 0).size() + tight.positions(0, 1).size(), 2 * kN) << "held whole: " << c.first;
        EXPECT_EQ(kvp::layer_tokens_cap(cfg, kvp_layer_capacity(tight.c, 0)), 2 * kN) << c.first;
        ASSERT_EQ(kvp_prompt_end(tight.c), KVP_OK) << kvp_last_error(tight.c);
        ASSERT_EQ(kvp_prompt_end(roomy.c), KVP_OK) << kvp_last_error(roomy.c);
        for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(tight.positions(0, h), roomy.positions(0, h)) << c.first << " head " << h;
        EXPECT_NE(tight.positions(0, 0).size(), tight.positions(0, 1).size()) << c.first << ": the heads kept alike";
        if (c.first == h2o) {
            ref::Cache one(in.m, h2o + " capacity=" + std::to_string(kN + 1));
            prefill(one, in, 1, 0, kN);
            for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(tight.positions(0, h), one.positions(0, h)) << h;
        }
        std::vector<float> ot, orm;
        decode(tight, in, 1, kN, 20, &ot);
        decode(roomy, in, 1, kN, 20, &orm);
        EXPECT_EQ(memcmp(ot.data(), orm.data(), ot.size() * sizeof(float)), 0) << c.first;
    }
}

// The cache's statistics (a failed call fails the test and gives zeros).
kvp_stats stats_of(const ref::Cache &c) {
    kvp_stats st{};
    st.struct_size = sizeof st;
    EXPECT_EQ(kvp_get_stats(c.c, &st), KVP_OK);
    return st;
}

// snapkv's and pyramidkv's ada selection ranks in the phase region too (snapkv.cpp ada_tokens):
// candidates and kept marks for the layer's tokens, KV heads x (capacity + prompt room + a staged
// chunk), not KV heads x the longest store; the votes (a state region: the per-head work writes
// them) are packed by the same bound. On the Llama-3-8B shape the marks fit the dead scratch; in
// a run where the heads lend (the layer at uniform's total) and then take a staged chunk of the
// stage's size, the selection ranks what the bound allows less one slot per head (a decode leaves
// capacity - 1): the bound holds with one token per head to spare, and one without the staged
// chunk fails.
TEST(Ada, SelectionMarksFitTheLayersMostTokens) {
    for (const char *pol : {"policy=snapkv budget=2048", "policy=pyramidkv budget=2048"}) phase_fits_dead_span(pol, 9u * 8 * 2048, false);
    const uint32_t S = 32, T = kN + 40;
    const ref::Inputs in = inputs(1, 7, T + S + 4);
    const std::string sp = spec("snapkv", "ada", "prefill_stage=" + std::to_string(S));
    ref::Cache c(in.m, sp);
    for (uint32_t t = 0; t < kN; t += S) prefill(c, in, 1, t, S);
    decode(c, in, 1, kN, 40);
    const size_t l0 = c.positions(0, 0).size(), l1 = c.positions(0, 1).size(), cap = kvp_layer_capacity(c.c, 0);
    ASSERT_NE(l0, l1);
    ASSERT_GT(l1, cap) << "a head lends";
    ASSERT_EQ(l0 + l1, 2 * (cap - 1)) << "the layer at uniform's total";
    kvp_config cfg;
    char err[256];
    ASSERT_EQ(kvp_config_default(&cfg, &in.m), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&cfg, sp.c_str(), err, sizeof err), KVP_OK) << err;
    const kvp::Policy &pol = kvp::policy_of(cfg);
    const size_t ranked = l0 + l1 + 2 * S, rec = pol.phase_bytes(cfg, S), votes = pol.state_bytes(cfg, S);
    EXPECT_GE(rec, 8 * ranked + ranked) << "the candidates and marks of the selection";
    EXPECT_LT(rec, 8 * (ranked + 2 + 8) + (ranked + 2 + 64)) << "the bound is KV heads x (capacity + stage)";
    EXPECT_GE(votes, 8 * ranked + 2 * 40) << "the votes and two heads' records";
    EXPECT_LT(votes, 8 * (ranked + 2 + 8) + 128) << "the votes' bound is the same";
    // the selection over lent stores and a staged chunk evicts, keeps the layer's budget and
    // goes on decoding
    const uint64_t ev = stats_of(c).tokens_evicted;
    prefill(c, in, 1, T, S);
    EXPECT_GT(stats_of(c).tokens_evicted, ev) << "the chunk's selection evicted";
    EXPECT_EQ(c.positions(0, 0).size() + c.positions(0, 1).size(), 2 * size_t(kB)) << "the layer keeps its budget per head";
    decode(c, in, 1, T + S, 4);
}

// Where heads lend, the split schedules' per-KV-head areas (threads > 1) are packed by the
// heads' lengths (arena.h head_need): the arena holds every split of the layer's tokens over its
// heads (each head up to its store's cap), for less than KV heads x the longest store's area.
TEST(Ada, PackedHeadAreasHoldEverySplitOfTheLayersTokens) {
    for (const char *pol : {"policy=h2o budget=2048", "policy=lethe budget=2048", "policy=snapkv budget=2048",
                            "policy=triattention budget=2048 tri_mode=per_layer_perhead", "policy=h2o budget=1000 max_prompt=700"})
        for (const char *threads : {" threads=2", " threads=3 score=fixed"}) {
            kvp_config cfg;
            kvp::ArenaPlan p;
            const std::string s = std::string(pol) + " head_budget=ada" + threads;
            ASSERT_TRUE(big_plan(s, &cfg, &p)) << s;
            kvp::Sz z;
            const kvp::HeadAreaPlan fixed = kvp::head_area_plan(p, cfg.threads, 4, z);
            const size_t areas = p.total - fixed.off;  // the areas close the arena
            EXPECT_LT(areas, 8 * fixed.bytes) << s;
            kvp::LayerGeom g;
            kvp::layer_geom(cfg, 0, &g);
            const uint32_t R = cfg.max_prompt, T = 8 * (g.lp.cap + R), most = g.lp.store_cap + R;
            // splits of T tokens: even, one head at its most and the rest even, pairs at their
            // most and empty, and seeded random ones (each head at most `most`)
            std::vector<std::vector<uint32_t>> splits = {std::vector<uint32_t>(8, T / 8)};
            std::vector<uint32_t> one(8, (T - most) / 7);
            one[3] = most;
            splits.push_back(one);
            std::vector<uint32_t> pairs(8, 0);
            for (uint32_t h = 0, left = T; h < 8 && left; ++h) left -= pairs[h] = left < most ? left : most;
            splits.push_back(pairs);
            ref::Rng rng(11);
            for (int r = 0; r < 200; ++r) {
                std::vector<uint32_t> L(8, 0);
                for (uint32_t left = T; left;) {
                    const uint32_t h = uint32_t(rng.uniform(0, 8)) % 8, k = 1 + uint32_t(rng.uniform(0, 97));
                    const uint32_t add = std::min({k, left, most - L[h]});
                    L[h] += add;
                    left -= add;
                }
                splits.push_back(L);
            }
            size_t worst = 0;
            for (const auto &L : splits) {
                size_t sum = 0;
                for (uint32_t h = 0; h < 8; ++h) sum += kvp::head_need(p, 4, L[h]).bytes;
                worst = std::max(worst, sum);
                ASSERT_LE(sum, areas) << s;
            }
            printf("%s: areas %zu bytes (fixed slots %zu), the largest split needs %zu\n", s.c_str(), areas, 8 * fixed.bytes, worst);
        }
}

// The arena with head_budget=ada against uniform's on a Llama-3-8B shape (the figures of
// docs/harness.md "AdaKV per-head budgets", budgets 128-8192): the heads share one hole
// allowance, so from a budget of 512 (a store's hole_cap, capacity/32, reaching a block of 16) the
// K/V pools are smaller than uniform's by more than what follows a store of up to twice the
// capacity (block tables, per-thread scratch, snapkv's votes, realign's RoPE tables) adds: ada's
// arena is the smaller on 1 and 2 threads for every policy that takes the key. With every head's
// hole allowance in the pools (the test hook lend_lean_homes = 0) each row is larger than
// uniform's. Below 512 a store's hole_cap is under a block, and what the heads share is the
// rounding of their homes (arena.h pool_home): where the layer's body and a block of rounding is
// not a multiple of the block, H homes together hold fewer blocks than H rounded up each. That
// puts lethe, snapkv, pyramidkv and triattention below uniform at budgets 128 and 256 too; h2o's
// capacity (budget + 1) leaves nothing to round there (printed only: +0.06-0.11 %).
TEST(Ada, ArenaOverUniformOnALlama3Shape) {
    const uint32_t dflt = kvp::lend_lean_homes;
    for (const char *pol : {"policy=h2o", "policy=lethe", "policy=snapkv", "policy=pyramidkv",
                            "policy=triattention tri_mode=per_layer_perhead"})
        for (uint32_t budget : {128u, 256u, 512u, 2048u, 8192u})
            for (uint32_t t = 1; t <= 2; ++t) {
                if (sizeof(size_t) < 8 && budget > 2048) continue;  // 4-5 GB arenas: not on 32-bit targets
                kvp_config cu, ca;
                kvp::ArenaPlan pu, pa;
                const std::string s = std::string(pol) + " budget=" + std::to_string(budget) + " threads=" + std::to_string(t);
                ASSERT_TRUE(big_plan(s, &cu, &pu) && big_plan(s + " head_budget=ada", &ca, &pa)) << s;
                const uint64_t u = kvp_arena_size(&cu), a = kvp_arena_size(&ca);
                kvp::lend_lean_homes = 0;
                const uint64_t wide = kvp_arena_size(&ca);
                kvp::lend_lean_homes = 1;
                const uint64_t own = kvp_arena_size(&ca);  // each home rounded on its own (stop 49)
                kvp::lend_lean_homes = dflt;
                ASSERT_GT(u, 0u);
                printf("%s: uniform %llu bytes, ada %+lld (%+.3f %%); homes rounded each %+lld (%+.3f %%); with every head's "
                       "hole allowance %+lld (%+.3f %%)\n",
                       s.c_str(), (unsigned long long)u, (long long)(a - u), 100.0 * (double(a) - double(u)) / double(u),
                       (long long)(own - u), 100.0 * (double(own) - double(u)) / double(u), (long long)(wide - u),
                       100.0 * (double(wide) - double(u)) / double(u));
                EXPECT_LE(a, own) << s;
                if (budget < 512 && strcmp(pol, "policy=h2o") == 0) continue;
                EXPECT_LT(a, u) << s;
                if (budget >= 512) {
                    EXPECT_GT(wide, u) << s;
                }
            }
}

// lethe ada: the same bits for 1, 2 and 3 threads (forced parallel; also with a shared pool), and a
// state saved mid-decode decodes on to the same bits in a fresh cache.
TEST(Ada, LetheThreadsAndState) {
    const ref::Inputs in = inputs(2, 3, 200);
    for (const char *more : {"sparse_ratio=20 score=fixed", "sparse_ratio=20 score=fixed total_capacity=150",
                             "sparse_ratio=20"}) {
        const auto p = same_bits(in, lethe_spec("ada", more), [&](ref::Cache &c, std::vector<float> *o) {
            prefill(c, in, 2, 0, 30);
            decode(c, in, 2, 30, 90, o);
        }, 120, 60);
        EXPECT_NE(p[0].size(), p[1].size()) << more << ": the heads kept alike";
    }
}

// triattention with head_budget=ada (tri_mode=per_layer_perhead; triattention.cpp "AdaKV"; the
// kept tokens against a double reference: test_triattention AdaKeepsWhatTheReferenceAllocates):
// on the sharp and diffuse heads, every cut leaves the layer's budget in total, split unevenly;
// a head outgrows the layer capacity with blocks the other leaves; the same bits for 1/2/3
// threads, and a loaded state goes on as the saved one.
TEST(Ada, TriAttentionSplitsAndLends) {
    const ref::Inputs in = inputs(2, 3, 200);
    // prompt 8; capacity 8 + 16 + 4 + 4: uniform's heads fit, an ada head may take 2x
    const std::string spec = "policy=triattention budget=16 beta=4 capacity=32 tri_mode=per_layer_perhead head_budget=ada";
    ref::Cache c(in.m, spec);
    prefill(c, in, 2, 0, 8);
    bool lent = false, split = false;
    for (uint32_t t = 8; t < 120; ++t) {
        decode(c, in, 2, t, 1);
        for (uint32_t l = 0; l < 2; ++l) {
            const size_t g0 = c.positions(l, 0).size() - 8, g1 = c.positions(l, 1).size() - 8;
            ASSERT_LE(g0 + g1, 2u * (16 + 4)) << t;
            if ((t - 8 + 1) % 4 == 0 && t >= 8 + 19) {  // a cut: the 20th decode, then every 4th
                ASSERT_EQ(g0 + g1, 2u * 16) << "a cut at token " << t;
            }
            split = split || g0 != g1;
            lent = lent || kvp_layer_len(c.c, l) > kvp_layer_capacity(c.c, l);
        }
    }
    EXPECT_TRUE(split) << "the heads kept alike";
    EXPECT_TRUE(lent) << "no head outgrew the capacity";
    same_bits(in, spec + " score=fixed", [&](ref::Cache &x, std::vector<float> *o) {
        prefill(x, in, 2, 0, 8);
        decode(x, in, 2, 8, 100, o);
    }, 108, 60);
}

// Heads share one hole allowance (arena.cpp layer_geom, cache_append.cpp lend_blocks): a lending
// layer's home holds its capacity's blocks without every head's hole_cap, and a call whose heads
// need more blocks than the pools have free first compacts the head with the most dead slots.
// The same runs with every head's allowance in the homes (the test hook lend_lean_homes = 0), and
// with each home rounded up on its own (1; the default 2 shares the rounding: arena.h pool_home),
// keep the same tokens and give the same output bits, in arenas that are that much larger: h2o,
// lethe and triattention (which evict while decoding), 4 KV heads whose keys differ in scale,
// block 4 so that a 512-token store's hole_cap (16) spans blocks and every layer has short homes
// (its body and a block of rounding not a multiple of 4); 1 and 2 threads (forced parallel),
// float and fixed scores. Without the compaction under pressure the runs part (a dry pool makes
// the policy evict by its own ranking).
TEST(Ada, HeadsShareTheHoleAllowance) {
    // as inputs(): KV head 0 sharp (2 of every 89 keys at ~8), heads 1-3 diffuse (40 of 89),
    // so head 0 gives budget to the others and they outgrow the capacity with its blocks
    ref::Inputs in(ref::model(2, 8, 4, kHd, KVP_ROPE_NONE), 920, 11, 1.0f);
    std::fill(in.q.begin(), in.q.end(), 0.0f);
    std::fill(in.k.begin(), in.k.end(), 0.0f);
    for (uint32_t t = 0; t < in.T; ++t) {
        const uint32_t r = t % 89;
        for (uint32_t qh = 0; qh < 8; ++qh) in.q[size_t(t) * in.nq + size_t(qh) * kHd] = 4.0f;
        for (uint32_t h = 0; h < 4; ++h) {
            const bool hot = h == 0 ? r == 10 || r == 50 : (r + 17 * h) % 89 >= 20 && (r + 17 * h) % 89 < 60;
            in.k[size_t(t) * in.nkv + size_t(h) * kHd] = (hot ? 8.0f : 0.0f) + 0.01f * float(r) + 0.001f * float(h);
        }
    }
    struct Case {
        const char *spec;
        uint32_t prompt, chunk, decodes;
    };
    const Case cases[] = {
        {"policy=h2o budget=497 recent=4", 400, 400, 500},
        {"policy=lethe capacity=255 evict_threshold=64 sinks=2 recent_ratio=0.1", 64, 16, 800},
        {"policy=triattention budget=480 beta=8 capacity=503 tri_mode=per_layer_perhead", 8, 8, 900},
    };
    for (const Case &cs : cases)
        for (const char *more : {"", " score=fixed threads=2"}) {
            const std::string spec = std::string(cs.spec) + " block=4 head_budget=ada" + more;
            ref::ForceParallel force(more[0] != 0);
            std::vector<float> o[3];
            std::vector<std::vector<int32_t>> p[3];
            uint64_t bytes[3] = {0, 0, 0};
            bool lent = false;
            const uint32_t dflt = kvp::lend_lean_homes;
            for (int lean = 0; lean < 3; ++lean) {
                kvp::lend_lean_homes = uint32_t(lean);
                ref::Cache c(in.m, spec);
                kvp::lend_lean_homes = dflt;
                bytes[lean] = stats_of(c).arena_bytes;
                for (uint32_t t = 0; t < cs.prompt; t += cs.chunk) prefill(c, in, 2, t, cs.chunk);
                decode(c, in, 2, cs.prompt, cs.decodes, &o[lean]);
                for (uint32_t l = 0; l < 2; ++l) {
                    lent = lent || kvp_layer_len(c.c, l) > kvp_layer_capacity(c.c, l);
                    for (uint32_t h = 0; h < 4; ++h) p[lean].push_back(c.positions(l, h));
                }
            }
            EXPECT_LT(bytes[1], bytes[0]) << spec;
            EXPECT_LT(bytes[2], bytes[1]) << spec;
            for (int lean = 1; lean < 3; ++lean) {
                EXPECT_TRUE(o[0].size() == o[lean].size() &&
                            memcmp(o[0].data(), o[lean].data(), o[0].size() * sizeof(float)) == 0)
                    << spec << ": the output bits differ (homes " << lean << ")";
                EXPECT_EQ(p[0], p[lean]) << spec << " (homes " << lean << ")";
            }
            EXPECT_TRUE(lent) << spec << ": no head outgrew the capacity";
            printf("%s: arena %llu bytes; homes rounded each %llu; with every head's hole allowance %llu\n", spec.c_str(),
                   (unsigned long long)bytes[2], (unsigned long long)bytes[1], (unsigned long long)bytes[0]);
        }
}

TEST(Ada, RefusesWhatItCannotDo) {
    const kvp_model m = ref::model(1, 4, 2, kHd);
    kvp_config cfg;
    char err[256];
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    // formatted storage: unsupported, named
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=snapkv head_budget=ada kv_dtype=q8", err, sizeof err), KVP_ERR_UNSUPPORTED);
    EXPECT_NE(strstr(err, "kv_dtype=f32"), nullptr) << err;
    cfg.policy = KVP_POLICY_SNAPKV;
    cfg.head_budget = KVP_HEAD_BUDGET_ADA;
    cfg.kv_dtype = KVP_DTYPE_Q8;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_UNSUPPORTED);
    EXPECT_EQ(kvp_arena_size(&cfg), 0u);
    // policies without a prompt budget, and the decode-time ones not done yet
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    cfg.head_budget = KVP_HEAD_BUDGET_ADA;
    cfg.policy = KVP_POLICY_WINDOW;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_UNSUPPORTED);
    EXPECT_NE(strstr(err, "no per-head token budget"), nullptr) << err;
    EXPECT_NE(strstr(err, "snapkv, pyramidkv, h2o, lethe and triattention"), nullptr) << err;
    cfg.policy = KVP_POLICY_TRIATTENTION;  // tri_mode=union by default: one choice for all heads
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_UNSUPPORTED);
    EXPECT_NE(strstr(err, "tri_mode=per_layer_perhead"), nullptr) << err;
    cfg.tri_mode = KVP_TRI_PER_HEAD;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_UNSUPPORTED);
    cfg.tri_mode = KVP_TRI_PER_LAYER_PERHEAD;
    for (kvp_policy p : {KVP_POLICY_H2O, KVP_POLICY_LETHE, KVP_POLICY_TRIATTENTION}) {
        cfg.policy = p;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
    }
    // DuoAttention streaming heads beside ada: refused (the ranking spans every KV head of a layer)
    {
        const uint8_t roles[2] = {KVP_HEAD_RETRIEVAL, KVP_HEAD_STREAMING};
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        ASSERT_EQ(kvp_config_apply(&cfg, "policy=h2o budget=8 duo_window=4", err, sizeof err), KVP_OK) << err;
        EXPECT_GT(kvp_arena_size_heads(&cfg, roles, 2), 0u);
        cfg.head_budget = KVP_HEAD_BUDGET_ADA;
        EXPECT_EQ(kvp_arena_size_heads(&cfg, roles, 2), 0u);
        std::vector<char> arena(1 << 20);
        kvp_cache *c = nullptr;
        EXPECT_EQ(kvp_create_heads(&cfg, nullptr, 0, roles, 2, arena.data(), arena.size(), &c, err, sizeof err),
                  KVP_ERR_UNSUPPORTED);
        EXPECT_NE(strstr(err, "head_budget=ada"), nullptr) << err;
        EXPECT_EQ(c, nullptr);
    }
    // a spec naming a policy that ignores the key is refused by apply
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_NE(kvp_config_apply(&cfg, "policy=window head_budget=ada", err, sizeof err), KVP_OK);
    // ranges
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_NE(kvp_config_apply(&cfg, "policy=snapkv ada_floor=1.5", err, sizeof err), KVP_OK);
    EXPECT_NE(kvp_config_apply(&cfg, "policy=snapkv head_budget=some", err, sizeof err), KVP_OK);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    cfg.policy = KVP_POLICY_SNAPKV;
    cfg.head_budget = 2;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    cfg.head_budget = KVP_HEAD_BUDGET_ADA;
    cfg.ada_floor = NAN;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    cfg.ada_floor = 0.2f;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
}

}  // namespace
