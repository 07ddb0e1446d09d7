// policy=random (src/policies/random.h): each position is kept about equally often over seeds (a
// uniform subset), keep_prompt=1 never evicts a prompt token and cuts the generated ones back to
// budget, the victims depend only on (seed, layer, head, eviction count): the same for threads
// 1/2/3 and score modes, different for another seed, and a loaded state draws what the saved one
// would have; drafts work at the default capacity; a capacity below budget + 1 is refused.
#include <gtest/gtest.h>
#include <string.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "reference.h"

namespace {

const kvp_model kModel = ref::model(2, 4, 2, 8);

void prefill(ref::Cache &c, const ref::Inputs &in, uint32_t t0, uint32_t n) {
    std::vector<float> out(size_t(n) * in.nq);
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, &in.q[size_t(t0) * in.nq], &in.k[size_t(t0) * in.nkv],
                              &in.v[size_t(t0) * in.nkv], out.data(), nullptr),
                  KVP_OK)
            << kvp_last_error(c.c);
}

void decode(ref::Cache &c, const ref::Inputs &in, uint32_t t) {
    std::vector<float> out(in.nq);
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        ASSERT_EQ(kvp_decode(c.c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                             out.data()),
                  KVP_OK)
            << kvp_last_error(c.c);
}

std::vector<int32_t> all_positions(const ref::Cache &c) {
    std::vector<int32_t> r;
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        for (uint32_t h = 0; h < kModel.n_kv_heads; ++h) {
            const std::vector<int32_t> p = c.positions(l, h);
            r.insert(r.end(), p.begin(), p.end());
            r.push_back(-1);
        }
    return r;
}

// keep_prompt=0: a 64-token prefill kept down to 16 is a uniform 16-subset: over 400 seeds and the
// 4 (layer, head) stores each position is kept 1600 x 16/64 = 400 times on average (sd ~17); every
// position within 400 +- 100, and the stores of one cache differ.
TEST(Random, PrefillKeepsAUniformSubset) {
    const ref::Inputs in(kModel, 64, 3, 1.0f);
    std::vector<uint32_t> kept(64, 0);
    uint32_t same_stores = 0;
    for (uint32_t seed = 0; seed < 400; ++seed) {
        ref::Cache c(kModel, "policy=random keep_prompt=0 budget=16 capacity=64 seed=" + std::to_string(seed));
        prefill(c, in, 0, 64);
        for (uint32_t l = 0; l < kModel.n_layers; ++l)
            for (uint32_t h = 0; h < kModel.n_kv_heads; ++h) {
                const std::vector<int32_t> p = c.positions(l, h);
                ASSERT_EQ(p.size(), 16u);
                for (int32_t x : p) ++kept[size_t(x)];
            }
        same_stores += c.positions(0, 0) == c.positions(1, 1);
    }
    for (uint32_t t = 0; t < 64; ++t) {
        EXPECT_GE(kept[t], 300u) << "position " << t;
        EXPECT_LE(kept[t], 500u) << "position " << t;
    }
    EXPECT_EQ(same_stores, 0u);
}

// keep_prompt=0 at decode: one uniform victim per step among the budget + 1 tokens, the new one
// included: over many steps the new token survives its step about budget/(budget+1) of the time.
TEST(Random, DecodeEvictsOneUniformVictim) {
    const ref::Inputs in(kModel, 2000, 5, 1.0f);
    ref::Cache c(kModel, "policy=random keep_prompt=0 budget=8 seed=11");
    prefill(c, in, 0, 8);
    uint32_t newest_kept = 0, steps = 0;
    for (uint32_t t = 8; t < 2000; ++t) {
        decode(c, in, t);
        const std::vector<int32_t> p = c.positions(0, 0);
        ASSERT_EQ(p.size(), 8u);
        newest_kept += p.back() == int32_t(t);
        ++steps;
    }
    const double f = double(newest_kept) / steps;  // expected 8/9 = 0.889, sd ~0.007
    EXPECT_GT(f, 0.85);
    EXPECT_LT(f, 0.93);
}

// keep_prompt=1: the prompt stays whole; generated tokens are cut back to budget at random.
TEST(Random, KeepPromptKeepsThePromptAndBudgetGeneratedTokens) {
    const ref::Inputs in(kModel, 200, 7, 1.0f);
    ref::Cache c(kModel, "policy=random budget=12 seed=3");
    prefill(c, in, 0, 40);
    prefill(c, in, 40, 30);  // a second prefill is prompt too
    std::vector<uint32_t> gen_kept(200, 0);
    for (uint32_t t = 70; t < 200; ++t) decode(c, in, t);
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        for (uint32_t h = 0; h < kModel.n_kv_heads; ++h) {
            const std::vector<int32_t> p = c.positions(l, h);
            ASSERT_EQ(p.size(), 70u + 12u);
            for (int32_t t = 0; t < 70; ++t) EXPECT_EQ(p[size_t(t)], t);
            for (size_t i = 70; i < p.size(); ++i) ++gen_kept[size_t(p[i])];
            EXPECT_GE(p[70], 70);
        }
    uint32_t spread = 0;  // the kept generated tokens are spread over the generation, not the last 12
    for (uint32_t t = 70; t < 188; ++t) spread += gen_kept[t];
    EXPECT_GT(spread, 0u);
    kvp_layer_stats ls;
    ls.struct_size = sizeof ls;
    ASSERT_EQ(kvp_get_layer_stats(c.c, 0, &ls), KVP_OK);
    EXPECT_EQ(ls.tokens_evicted, uint64_t(kModel.n_kv_heads) * (130 - 12));
}

// The victims depend only on the seed and the calls: threads, score mode and chunking under
// max_prompt change nothing; another seed changes them.
TEST(Random, SameVictimsForThreadsAndScoreModesOtherSeedOthers) {
    const ref::Inputs in(kModel, 300, 9, 1.0f);
    for (const char *base : {"policy=random keep_prompt=0 budget=24 capacity=100", "policy=random budget=10 capacity=200"}) {
        std::vector<int32_t> first;
        for (const char *extra : {" threads=1", " threads=2", " threads=3", " score=fixed threads=2", " kv_dtype=q8"}) {
            ref::Cache c(kModel, std::string(base) + extra);
            for (uint32_t t = 0; t < 96; t += 32) prefill(c, in, t, 32);
            for (uint32_t t = 96; t < 160; ++t) decode(c, in, t);
            const std::vector<int32_t> p = all_positions(c);
            if (first.empty()) first = p;
            else EXPECT_EQ(p, first) << base << extra;
        }
        ref::Cache other(kModel, std::string(base) + " seed=1");
        for (uint32_t t = 0; t < 96; t += 32) prefill(other, in, t, 32);
        for (uint32_t t = 96; t < 160; ++t) decode(other, in, t);
        EXPECT_NE(all_positions(other), first) << base;
    }
}

// A state saved mid-generation and loaded into a fresh cache goes on drawing the same victims.
TEST(Random, LoadedStateDrawsWhatTheSavedOneWould) {
    const ref::Inputs in(kModel, 200, 13, 1.0f);
    for (const char *spec : {"policy=random keep_prompt=0 budget=20 capacity=64 seed=5", "policy=random budget=8 seed=5"}) {
        ref::Cache a(kModel, spec);
        prefill(a, in, 0, 48);
        for (uint32_t t = 48; t < 100; ++t) decode(a, in, t);
        ref::Cache b(kModel, spec);
        a.copy_state_to(b);
        for (uint32_t t = 100; t < 200; ++t) {
            decode(a, in, t);
            decode(b, in, t);
        }
        EXPECT_EQ(all_positions(a), all_positions(b)) << spec;
    }
}

// Drafts of up to max_draft tokens work at the default capacity; the commit keeps the policy's rule.
TEST(Random, DraftsWorkAtTheDefaultCapacity) {
    const ref::Inputs in(kModel, 120, 17, 1.0f);
    ref::Cache c(kModel, "policy=random keep_prompt=0 budget=16 max_draft=4");
    prefill(c, in, 0, 16);
    for (uint32_t t = 16; t < 60; ++t) decode(c, in, t);
    ASSERT_EQ(kvp_draft_begin(c.c), KVP_OK) << kvp_last_error(c.c);
    std::vector<float> out(size_t(4) * in.nq);
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, 4, nullptr, &in.q[size_t(60) * in.nq], &in.k[size_t(60) * in.nkv],
                              &in.v[size_t(60) * in.nkv], out.data(), nullptr),
                  KVP_OK)
            << kvp_last_error(c.c);
    ASSERT_EQ(kvp_draft_commit(c.c, 3), KVP_OK) << kvp_last_error(c.c);
    EXPECT_EQ(c.positions(0, 0).size(), 16u);
}

TEST(Random, ConfigErrors) {
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &kModel), KVP_OK);
    char err[256] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=random keep_prompt=0 budget=16 capacity=16", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "budget+1"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=random keep_prompt=2", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=random window=8", err, sizeof err), KVP_ERR_CONFIG);  // not its key
    ASSERT_EQ(kvp_config_default(&cfg, &kModel), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=random keep_prompt=0 compression_ratio=0.75 ratio_tokens=64", err, sizeof err),
              KVP_OK)
        << err;
    EXPECT_EQ(cfg.budget, 16u);
}

}  // namespace
