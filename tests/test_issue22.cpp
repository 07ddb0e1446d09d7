// Issue 22 (a newcomer's second pass), the C library's part: defects found from outside (a
// misaligned store on SIMDe's portable path, a finiteness scan past a chunk that cannot fit),
// messages for geometry errors (kvp_config_default_ex), compression_ratio in the library,
// defaults that follow the keys they depend on, KVP_ERR_FULL messages, layer order.
// Each case failed before its fix (defect 1 under UBSan on the portable 32-bit build:
// .ci/cross.sh armhf-ubsan).
#include <gtest/gtest.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.hpp"
#include "reference.h"

namespace {

// ---------------------------------------------------------------- defect 1

// qk_rows stored pairs of logits through a simde__m64 * at 4-byte-aligned addresses (rows of an
// odd number of keys). SIMDe's portable path (armhf, i386, SIMDE_NO_NATIVE) turns that into a
// member access of an 8-byte-aligned struct: UBSan "misaligned address". The outside
// reproducer: snapkv prefill, 3 query heads over 1 KV head, head_dim 7. Here also odd and even
// chunk lengths, and the outputs are checked against the double reference.
TEST(Defect1, ManyShapesRunClean) {  // under UBSan: no misaligned access on any of these shapes
    for (uint32_t nq : {3u, 4u, 6u})
        for (uint32_t hd : {7u, 5u, 9u}) {
            const kvp_model m = ref::model(2, nq, 1, hd, KVP_ROPE_GPTJ, hd & ~1u);
            for (uint32_t T : {1u, 2u, 3u, 5u, 7u, 11u, 13u, 37u, 41u})
                for (uint32_t w : {1u, 3u, 4u, 5u, 7u}) {
                    char spec[128];
                    snprintf(spec, sizeof spec, "policy=snapkv budget=16 obs_window=%u recent=1", w);
                    ref::Cache c(m, spec);
                    ref::Inputs in(m, 2 * T + 1, T * 31 + w, 1.0f);
                    std::vector<float> out(size_t(2 * T + 1) * in.nq);
                    for (uint32_t l = 0; l < m.n_layers; ++l) {
                        ASSERT_EQ(kvp_prefill(c.c, l, T, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
                        ASSERT_EQ(kvp_prefill(c.c, l, T + 1, nullptr, in.qt(T), in.kt(T), in.vt(T), out.data(), nullptr), KVP_OK);
                        ASSERT_EQ(kvp_decode(c.c, l, in.qt(0), in.kt(0), in.vt(0), out.data()), KVP_OK);
                    }
                }
        }
}

TEST(Defect1, SnapkvPrefillOddRowsMatchesReference) {
    const kvp_model m = ref::model(2, 3, 1, 7, KVP_ROPE_GPTJ, 6);
    for (uint32_t T : {5u, 9u, 17u, 33u, 40u}) {
        ref::Cache c(m, "policy=snapkv budget=64 obs_window=4 recent=4");
        ref::Inputs in(m, T, 100 + T, 1.0f);
        std::vector<float> out(size_t(T) * in.nq);
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            ASSERT_EQ(kvp_prefill(c.c, l, T, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK)
                << kvp_last_error(c.c);
            // causal attention of token t over tokens 0..t (every token is kept: T <= budget)
            for (uint32_t t = 0; t < T; t += 3) {
                std::vector<uint32_t> idx;
                std::vector<int64_t> kpos;
                for (uint32_t j = 0; j <= t; ++j) {
                    idx.push_back(j);
                    kpos.push_back(j);
                }
                std::vector<double> want;
                ref::attend(m, in.qt(t), t, in.k.data(), in.v.data(), idx, kpos, want);
                for (size_t i = 0; i < want.size(); ++i)
                    ASSERT_NEAR(out[size_t(t) * in.nq + i], want[i], 1e-4) << "T=" << T << " t=" << t << " i=" << i;
            }
        }
    }
}

// ---------------------------------------------------------------- defect 2

// n_tokens far beyond the layer's room: the call read n tokens of q/k/v (and positions) while
// checking them, then refused with KVP_ERR_FULL (ASan: stack-buffer-overflow). The room is
// checked first now; the buffers below hold one token, so any read past it is an ASan error.
TEST(Defect2, OversizedChunkIsRefusedBeforeReadingInputs) {
    const kvp_model m = ref::model(2, 2, 1, 8);
    for (const char *spec : {"policy=full capacity=16", "policy=streaming sinks=2 window=6",
                             "policy=snapkv budget=8 prefill_stage=32", "policy=h2o budget=8 recent=4"}) {
        ref::Cache c(m, spec);
        float q[16] = {0}, k[8] = {0}, v[8] = {0}, out[16];
        int32_t pos[1] = {0};
        for (uint32_t n : {0x7fffffffu, 0xffffffffu, 100000u}) {
            EXPECT_EQ(kvp_prefill(c.c, 0, n, nullptr, q, k, v, out, nullptr), KVP_ERR_FULL) << spec << " n=" << n;
            EXPECT_NE(strstr(kvp_last_error(c.c), "layer 0"), nullptr) << kvp_last_error(c.c);
            EXPECT_EQ(kvp_prefill(c.c, 0, n, pos, q, k, v, nullptr, nullptr), KVP_ERR_FULL) << spec;
            EXPECT_EQ(kvp_append(c.c, 1, n, nullptr, k, v), KVP_ERR_FULL) << spec;
            EXPECT_EQ(kvp_append(c.c, 1, n, pos, k, v), KVP_ERR_FULL) << spec;
            EXPECT_EQ(kvp_layer_len(c.c, 0), 0u);
            EXPECT_EQ(kvp_layer_len(c.c, 1), 0u);
        }
        // the cache is unchanged and usable
        EXPECT_EQ(kvp_prefill(c.c, 0, 1, nullptr, q, k, v, out, nullptr), KVP_OK) << kvp_last_error(c.c);
    }
}

// ---------------------------------------------------------------- item 4: geometry messages

TEST(ConfigDefaultEx, MessageNamesTheWrongField) {
    struct Case {
        kvp_model m;
        const char *want;
    } cases[] = {
        {ref::model(2, 6, 4, 64), "model.n_kv_heads=4 must divide model.n_q_heads=6"},
        {ref::model(2, 8, 2, 33, KVP_ROPE_NEOX), "model.head_dim=33 is odd"},
        {ref::model(2, 8, 2, 64, KVP_ROPE_NEOX, 0, 0.0f), "model.rope_theta=0"},
        {ref::model(0, 8, 2, 64), "model.n_layers=0 must be in 1..4096"},
        {ref::model(2, 0, 2, 64), "model.n_q_heads=0"},
        {ref::model(2, 8, 0, 64), "model.n_kv_heads=0"},
        {ref::model(2, 8, 2, 0), "model.head_dim=0"},
        {ref::model(2, 8, 2, 64, KVP_ROPE_GPTJ, 5), "model.rope_dim=5 must be even"},
        {ref::model(2, 8, 2, 64, KVP_ROPE_GPTJ, 66), "model.rope_dim=66"},
        {ref::model(2, 8, 2, 64, (kvp_rope_style)7), "model.rope=7"},
    };
    for (const Case &cs : cases) {
        kvp_config cfg, before;
        memset(&cfg, 0xab, sizeof cfg);
        before = cfg;
        char err[256] = "x";
        EXPECT_EQ(kvp_config_default_ex(&cfg, &cs.m, err, sizeof err), KVP_ERR_CONFIG) << cs.want;
        EXPECT_NE(strstr(err, cs.want), nullptr) << err;
        EXPECT_EQ(strncmp(err, "KVP_ERR_CONFIG: ", 16), 0) << err;
        EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0) << "unchanged on failure: " << cs.want;
        // the plain form fails the same way; the sized form names the same field
        EXPECT_EQ(kvp_config_default(&cfg, &cs.m), KVP_ERR_CONFIG);
        char err2[256] = "";
        EXPECT_EQ(kvp_config_init_ex(&cfg, sizeof cfg, &cs.m, err2, sizeof err2), KVP_ERR_CONFIG);
        EXPECT_STREQ(err, err2);
        EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0);
        kvprune::Config cx(cs.m);
        EXPECT_EQ(cx.status(), KVP_ERR_CONFIG);
        EXPECT_STREQ(cx.error(), err);
    }
    // success: "" and the same bytes as kvp_config_default
    const kvp_model ok = ref::model(2, 8, 2, 64);
    kvp_config a, b;
    char err[64] = "junk";
    ASSERT_EQ(kvp_config_default_ex(&a, &ok, err, sizeof err), KVP_OK);
    EXPECT_STREQ(err, "");
    ASSERT_EQ(kvp_config_default(&b, &ok), KVP_OK);
    EXPECT_EQ(memcmp(&a, &b, sizeof a), 0);
    // NULL arguments, NULL or tiny err
    EXPECT_EQ(kvp_config_default_ex(nullptr, &ok, err, sizeof err), KVP_ERR_ARG);
    EXPECT_NE(strstr(err, "NULL"), nullptr) << err;
    EXPECT_EQ(kvp_config_default_ex(&a, nullptr, nullptr, 0), KVP_ERR_ARG);
    char tiny[8];
    const kvp_model bad = ref::model(2, 6, 4, 64);
    EXPECT_EQ(kvp_config_default_ex(&a, &bad, tiny, sizeof tiny), KVP_ERR_CONFIG);
    EXPECT_EQ(strlen(tiny), 7u);
    // kvp_config_init_ex: a struct_size it does not accept is named
    EXPECT_EQ(kvp_config_init_ex(&a, 3, &ok, err, sizeof err), KVP_ERR_ARG);
    EXPECT_NE(strstr(err, "struct_size=3"), nullptr) << err;
    EXPECT_EQ(kvp_config_init_ex(&a, KVP_CONFIG_SIZE_0_1, &ok, err, sizeof err), KVP_OK);
    EXPECT_STREQ(err, "");
    EXPECT_EQ(a.struct_size, KVP_CONFIG_SIZE_0_1);
}

// ---------------------------------------------------------------- item 9: KVP_ERR_FULL messages

// Every KVP_ERR_FULL names the layer, what it holds and could take, and what to do; the cache is
// unchanged by the refused call.
TEST(FullMessages, SayLayerHoldsCanTakeAndWhatToDo) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    ref::Inputs in(m, 64, 9, 1.0f);
    std::vector<float> out(size_t(64) * in.nq);
    auto msg = [](const ref::Cache &c) { return std::string(kvp_last_error(c.c)); };
    {  // full at capacity: decode
        ref::Cache c(m, "policy=full capacity=4");
        ASSERT_EQ(kvp_prefill(c.c, 1, 4, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(kvp_decode(c.c, 1, in.qt(4), in.kt(4), in.vt(4), out.data()), KVP_ERR_FULL);
        const std::string e = msg(c);
        EXPECT_NE(e.find("layer 1 holds 4 tokens and can take 0 more (capacity 4)"), std::string::npos) << e;
        EXPECT_NE(e.find("raise capacity (policy=full never evicts)"), std::string::npos) << e;
        EXPECT_EQ(e.find("kvp_prefill_room"), std::string::npos) << e;  // one token: chunking does not help
        EXPECT_EQ(kvp_layer_len(c.c, 1), 4u);
        // a chunk larger than the room: pointed to kvp_prefill_room
        EXPECT_EQ(kvp_prefill(c.c, 0, 5, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_ERR_FULL);
        const std::string e2 = msg(c);
        EXPECT_NE(e2.find("layer 0 holds 0 tokens and can take 4 more (capacity 4); 5 do not fit"), std::string::npos) << e2;
        EXPECT_NE(e2.find("chunk the prompt by kvp_prefill_room"), std::string::npos) << e2;
        EXPECT_EQ(kvp_layer_len(c.c, 0), 0u);
    }
    {  // streaming that never prunes: not "full policy", but compress_every
        ref::Cache c(m, "policy=streaming sinks=2 window=6 compress_every=0");
        for (uint32_t t = 0; t < 8; ++t) ASSERT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
        EXPECT_EQ(kvp_decode(c.c, 0, in.qt(8), in.kt(8), in.vt(8), out.data()), KVP_ERR_FULL);
        const std::string e = msg(c);
        EXPECT_NE(e.find("layer 0 holds 8 tokens and can take 0 more (capacity 8)"), std::string::npos) << e;
        EXPECT_NE(e.find("set compress_every >= 1"), std::string::npos) << e;
        EXPECT_EQ(e.find("full policy"), std::string::npos) << e;
        EXPECT_EQ(kvp_layer_len(c.c, 0), 8u);
    }
    {  // the prompt staging area (snapkv with queries)
        ref::Cache c(m, "policy=snapkv budget=8 prefill_stage=16");
        EXPECT_EQ(kvp_prefill(c.c, 0, 17, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_ERR_FULL);
        const std::string e = msg(c);
        EXPECT_NE(e.find("layer 0 holds 0 tokens"), std::string::npos) << e;
        EXPECT_NE(e.find("prefill_stage=16"), std::string::npos) << e;
        EXPECT_NE(e.find("kvp_prefill_room"), std::string::npos) << e;
    }
    {  // the shared pool is dry and policy=full cannot evict
        ref::Cache c(m, "policy=full capacity=32 block=16 total_capacity=48");
        ASSERT_EQ(kvp_prefill(c.c, 0, 32, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        ASSERT_EQ(kvp_prefill(c.c, 1, 16, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        EXPECT_EQ(kvp_decode(c.c, 1, in.qt(16), in.kt(16), in.vt(16), out.data()), KVP_ERR_FULL);
        const std::string e = msg(c);
        EXPECT_NE(e.find("layer 1 KV head 0 holds 16 tokens"), std::string::npos) << e;
        EXPECT_NE(e.find("raise total_capacity"), std::string::npos) << e;
        EXPECT_EQ(kvp_layer_len(c.c, 1), 16u);
    }
}

// ---------------------------------------------------------------- item 7: compression_ratio

kvp_status apply(kvp_config *c, const char *spec, std::string *err = nullptr) {
    char e[320] = "";
    const kvp_status st = kvp_config_apply(c, spec, e, sizeof e);
    if (err) *err = e;
    return st;
}

TEST(CompressionRatio, EachPolicyAsTheCliTable) {
    const kvp_model m = ref::model(4, 8, 2, 64);
    struct Case {
        const char *spec;
        uint32_t window, budget, capacity;
        float channels;
    } cases[] = {
        {"policy=window compression_ratio=0.6 ratio_tokens=250", 100, 1024, 0, 0.5f},
        {"policy=streaming compression_ratio=0.6 ratio_tokens=250", 96, 1024, 0, 0.5f},
        {"policy=streaming sinks=2 extra=3 compression_ratio=0.6 ratio_tokens=250", 95, 1024, 0, 0.5f},
        {"policy=h2o compression_ratio=0.6 ratio_tokens=250", 1020, 100, 0, 0.5f},
        {"policy=snapkv compression_ratio=0.6 ratio_tokens=250", 1020, 100, 0, 0.5f},
        {"policy=pyramidkv compression_ratio=0.6 ratio_tokens=250", 1020, 100, 0, 0.5f},
        {"policy=asl compression_ratio=0.6 ratio_tokens=250", 1020, 100, 0, 0.5f},
        {"policy=lethe compression_ratio=0.6 ratio_tokens=250", 1020, 1024, 100, 0.5f},
        {"policy=simlayerkv compression_ratio=0.6 ratio_tokens=250", 96, 1024, 0, 0.5f},
        {"policy=simlayerkv nonlazy=h2o compression_ratio=0.6 ratio_tokens=250", 96, 100, 0, 0.5f},
        {"policy=think compression_ratio=0.6 ratio_tokens=250", 1020, 1024, 0, 0.6f},
        {"policy=think compression_ratio=0.6", 1020, 1024, 0, 0.6f},  // channels: no token count needed
        {"policy=window capacity=300 compression_ratio=0.5", 150, 1024, 300, 0.5f},  // against capacity
        {"compression_ratio=0.999999 policy=window ratio_tokens=10", 1, 1024, 0, 0.5f},  // K >= 1
        {"policy=window compression_ratio=0 ratio_tokens=77", 77, 1024, 0, 0.5f},
    };
    for (const Case &cs : cases) {
        kvp_config c;
        ASSERT_EQ(kvp_config_default(&c, &m), KVP_OK);
        std::string err;
        ASSERT_EQ(apply(&c, cs.spec, &err), KVP_OK) << cs.spec << ": " << err;
        EXPECT_EQ(c.window, cs.window) << cs.spec;
        EXPECT_EQ(c.budget, cs.budget) << cs.spec;
        EXPECT_EQ(c.capacity, cs.capacity) << cs.spec;
        EXPECT_EQ(c.key_channel_ratio, cs.channels) << cs.spec;
        if (c.policy == KVP_POLICY_THINK) {
            EXPECT_EQ(c.value_channel_ratio, cs.channels) << cs.spec;
        }
        EXPECT_GT(kvp_arena_size(&c), 0u) << cs.spec;
        // idempotent: the same spec again gives the same config
        kvp_config again = c;
        ASSERT_EQ(apply(&again, cs.spec), KVP_OK) << cs.spec;
        EXPECT_EQ(memcmp(&again, &c, sizeof c), 0) << cs.spec;
    }
}

TEST(CompressionRatio, ErrorsNameTheKeysAndChangeNothing) {
    const kvp_model m = ref::model(4, 8, 2, 64);
    struct Bad {
        const char *spec, *a, *b;
    } bad[] = {
        {"policy=window window=8 compression_ratio=0.5 ratio_tokens=100", "compression_ratio sets window", "gives window"},
        {"policy=h2o budget=8 compression_ratio=0.5 ratio_tokens=100", "compression_ratio sets budget", "gives budget"},
        {"policy=lethe capacity=64 compression_ratio=0.5 ratio_tokens=100", "compression_ratio sets capacity", "gives capacity"},
        {"policy=simlayerkv nonlazy=snapkv budget=9 compression_ratio=0.5 ratio_tokens=100", "sets budget", "budget"},
        {"policy=think value_channel_ratio=0.1 compression_ratio=0.5", "sets value_channel_ratio", "gives value_channel_ratio"},
        {"policy=full compression_ratio=0.5 ratio_tokens=100", "does not apply to policy=full", "compression_ratio"},
        {"policy=window compression_ratio=1 ratio_tokens=100", "compression_ratio=1 must be in [0, 1)", "compression_ratio"},
        {"policy=window compression_ratio=-0.1 ratio_tokens=100", "[0, 1)", "compression_ratio"},
        {"policy=window compression_ratio=abc ratio_tokens=100", "not a number", "compression_ratio"},
        {"policy=window compression_ratio=0.5", "ratio_tokens=N", "capacity=N"},
        {"policy=lethe compression_ratio=0.5", "give ratio_tokens", "lethe"},
        {"policy=window ratio_tokens=100", "ratio_tokens", "give compression_ratio too"},
        {"policy=streaming compression_ratio=0.99 ratio_tokens=256", "not more than sinks+extra=4", "keeps 3 of 256"},
        {"policy=simlayerkv sinks=8 compression_ratio=0.99 ratio_tokens=256", "not more than sinks=8", "keeps 3"},
        {"policy=window ratio_tokens=x compression_ratio=0.5", "ratio_tokens=x", "unsigned"},
    };
    for (const Bad &b : bad) {
        kvp_config c, before;
        ASSERT_EQ(kvp_config_default(&c, &m), KVP_OK);
        before = c;
        std::string err;
        EXPECT_EQ(apply(&c, b.spec, &err), KVP_ERR_CONFIG) << b.spec;
        EXPECT_NE(err.find(b.a), std::string::npos) << b.spec << " -> " << err;
        EXPECT_NE(err.find(b.b), std::string::npos) << b.spec << " -> " << err;
        EXPECT_EQ(memcmp(&c, &before, sizeof c), 0) << b.spec;
    }
}

TEST(CompressionRatio, ApplyOnlyRowsInTheKeyTable) {
    const kvp_model m = ref::model(4, 8, 2, 64);
    int found = 0;
    for (uint32_t i = 0; i < kvp_config_key_count(); ++i) {
        kvp_key_info k;
        k.struct_size = sizeof k;
        ASSERT_EQ(kvp_config_key(i, &k), KVP_OK);
        const bool ratio = strcmp(k.name, "compression_ratio") == 0, tokens = strcmp(k.name, "ratio_tokens") == 0;
        if (!ratio && !tokens) {
            EXPECT_NE(k.config_size, 0u) << k.name;
            continue;
        }
        ++found;
        EXPECT_EQ(k.config_size, 0u) << k.name;  // no field
        EXPECT_EQ(k.type, ratio ? KVP_KEY_FLOAT : KVP_KEY_UINT);
        EXPECT_EQ(k.default_value, 0.0);
        EXPECT_LT(k.max, ratio ? 1.0 : 4294967296.0);
        EXPECT_EQ(k.policies, KVP_POLICY_ALL & ~KVP_POLICY_BIT(KVP_POLICY_FULL)) << k.name;
        EXPECT_NE(strstr(k.help, "apply-only"), nullptr) << k.help;
        kvp_config c;
        ASSERT_EQ(kvp_config_default(&c, &m), KVP_OK);
        EXPECT_EQ(kvp_config_key_used(&c, k.name), 0);  // full
        ASSERT_EQ(apply(&c, "policy=window"), KVP_OK);
        EXPECT_EQ(kvp_config_key_used(&c, k.name), 1);
    }
    EXPECT_EQ(found, 2);
}

// ---------------------------------------------------------------- item 8: defaults follow

TEST(DefaultsFollow, ADefaultNeverMakesAValidValueFail) {
    const kvp_model m = ref::model(4, 8, 2, 64);
    struct Case {
        const char *spec;
        uint32_t window, sinks, budget, recent;
    } cases[] = {
        {"policy=h2o budget=16", 1020, 4, 16, 16},
        {"policy=h2o budget=1", 1020, 4, 1, 1},
        {"policy=h2o capacity=8", 1020, 4, 7, 7},
        {"policy=snapkv capacity=8", 1020, 4, 7, 32},
        {"policy=pyramidkv capacity=40", 1020, 4, 39, 32},
        {"policy=asl capacity=8", 1020, 4, 7, 32},
        {"policy=window capacity=512", 511, 4, 1024, 32},
        {"policy=streaming capacity=512", 507, 4, 1024, 32},
        {"policy=streaming capacity=512 compress_every=8", 500, 4, 1024, 32},
        {"policy=streaming capacity=512 slack=20 extra=2", 486, 4, 1024, 32},
        {"policy=streaming window=10 capacity=12", 10, 1, 1024, 32},
        {"policy=streaming window=11 capacity=12", 11, 0, 1024, 32},
        {"policy=simlayerkv capacity=512", 507, 4, 1024, 32},
        {"policy=simlayerkv nonlazy=snapkv budget=256", 252, 4, 256, 32},
        {"policy=simlayerkv nonlazy=h2o budget=16", 12, 4, 16, 16},
        {"policy=think token_policy=h2o budget=16", 1020, 4, 16, 16},
        {"policy=think token_policy=window capacity=100", 99, 4, 1024, 32},
        // values the spec gives are kept
        {"policy=h2o budget=16 recent=3", 1020, 4, 16, 3},
        {"policy=streaming sinks=4 capacity=512", 507, 4, 1024, 32},
    };
    for (const Case &cs : cases) {
        kvp_config c;
        ASSERT_EQ(kvp_config_default(&c, &m), KVP_OK);
        std::string err;
        ASSERT_EQ(apply(&c, cs.spec, &err), KVP_OK) << cs.spec << ": " << err;
        EXPECT_EQ(c.window, cs.window) << cs.spec;
        EXPECT_EQ(c.sinks, cs.sinks) << cs.spec;
        EXPECT_EQ(c.budget, cs.budget) << cs.spec;
        EXPECT_EQ(c.recent, cs.recent) << cs.spec;
        EXPECT_EQ(kvp_config_check(&c, nullptr, 0), KVP_OK) << cs.spec;
        ref::Cache cache(m, cs.spec);  // creates
        ASSERT_NE(cache.c, nullptr) << cs.spec;
    }
    // a value the spec gives never changes: the inconsistency is reported as before
    struct Bad {
        const char *spec, *needle;
    } bad[] = {{"policy=h2o budget=16 recent=32", "recent=32 must be <= budget=16"},
               {"policy=window window=1020 capacity=512", "window=1020"},
               {"policy=h2o budget=1024 capacity=8", "budget+1"},
               {"policy=streaming sinks=4 window=10 capacity=12", "capacity=12"}};
    for (const Bad &b : bad) {
        kvp_config c, before;
        ASSERT_EQ(kvp_config_default(&c, &m), KVP_OK);
        before = c;
        std::string err;
        EXPECT_EQ(apply(&c, b.spec, &err), KVP_ERR_CONFIG) << b.spec;
        EXPECT_NE(err.find(b.needle), std::string::npos) << b.spec << " -> " << err;
        EXPECT_EQ(memcmp(&c, &before, sizeof c), 0) << b.spec;
    }
    // the key help text states the rule (kvprune keys shows it)
    for (const char *name : {"budget", "recent", "window", "sinks"}) {
        for (uint32_t i = 0; i < kvp_config_key_count(); ++i) {
            kvp_key_info k;
            k.struct_size = sizeof k;
            ASSERT_EQ(kvp_config_key(i, &k), KVP_OK);
            if (strcmp(k.name, name) == 0) {
                EXPECT_NE(strstr(k.help, "default follows"), nullptr) << name << ": " << k.help;
            }
        }
    }
}

// ---------------------------------------------------------------- item 10: layer order

// Layers are independent (kvprune.h, docs/DECISIONS.md): every layer keeps its own tokens and
// next position, so the order in which a host reaches the layers does not change any layer's
// results. Layer 1 decoded to the end before layer 0 gives the same bits as token-major order.
TEST(LayerOrder, LayersAreIndependent) {
    const kvp_model m = ref::model(3, 4, 2, 16);
    const uint32_t T = 80;
    ref::Inputs in(m, T, 5, 1.0f);
    for (const char *spec : {"policy=full", "policy=window window=24", "policy=streaming sinks=2 window=20",
                             "policy=h2o budget=24 recent=4", "policy=snapkv budget=24", "policy=pyramidkv budget=24",
                             "policy=lethe budget=24", "policy=simlayerkv window=12 sinks=2",
                             "policy=think token_policy=h2o budget=24 recent=4 kv_dtype=q8"}) {
        ref::Cache a(m, spec), b(m, spec);
        std::vector<float> oa(size_t(m.n_layers) * T * in.nq), ob(oa.size());
        auto at = [&](std::vector<float> &o, uint32_t l, uint32_t t) { return &o[(size_t(l) * T + t) * in.nq]; };
        const uint32_t P = 20;  // a prompt, then decodes
        for (uint32_t l = 0; l < m.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(a.c, l, P, nullptr, in.q.data(), in.k.data(), in.v.data(), at(oa, l, 0), nullptr), KVP_OK) << spec;
        for (uint32_t t = P; t < T; ++t)
            for (uint32_t l = 0; l < m.n_layers; ++l)
                ASSERT_EQ(kvp_decode(a.c, l, in.qt(t), in.kt(t), in.vt(t), at(oa, l, t)), KVP_OK) << spec;
        for (uint32_t l : {2u, 0u, 1u}) {  // layer-major, out of order
            ASSERT_EQ(kvp_prefill(b.c, l, P, nullptr, in.q.data(), in.k.data(), in.v.data(), at(ob, l, 0), nullptr), KVP_OK);
            for (uint32_t t = P; t < T; ++t)
                ASSERT_EQ(kvp_decode(b.c, l, in.qt(t), in.kt(t), in.vt(t), at(ob, l, t)), KVP_OK) << spec;
        }
        EXPECT_EQ(memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)), 0) << spec;
        for (uint32_t l = 0; l < m.n_layers; ++l)
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) EXPECT_EQ(a.positions(l, h), b.positions(l, h)) << spec;
    }
    // the outside probe: layer 1 twice before layer 0 is valid; each layer at its own next position
    ref::Cache c(m, "policy=streaming sinks=2 window=20");
    std::vector<float> out(in.nq);
    ASSERT_EQ(kvp_decode(c.c, 1, in.qt(0), in.kt(0), in.vt(0), out.data()), KVP_OK);
    ASSERT_EQ(kvp_decode(c.c, 1, in.qt(1), in.kt(1), in.vt(1), out.data()), KVP_OK);
    ASSERT_EQ(kvp_decode(c.c, 0, in.qt(0), in.kt(0), in.vt(0), out.data()), KVP_OK);
    EXPECT_EQ(c.positions(1, 0), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(c.positions(0, 0), (std::vector<int32_t>{0}));
}

}  // namespace
