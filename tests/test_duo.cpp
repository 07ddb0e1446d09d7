// DuoAttention heads (kvp_create_heads, issue 32 item 2): a streaming head's outputs equal the
// double reference over exactly its first duo_sink and its duo_window newest tokens, a retrieval
// head's over everything policy=full keeps; a streaming head's blocks go back to its pool (live
// bytes follow the per-head lengths, an all-streaming cache runs far past the arena a uniform
// one would need); arena sizes (all retrieval = kvp_arena_size, streaming heads less); score=fixed
// gives the same bits for threads 1/2/3; state save/load round trips and refuses another table;
// drafts commit as the prefill of the accepted tokens would; bad input is refused with nothing
// created.
#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "kvprune/kvprune.hpp"
#include "reference.h"

namespace {

constexpr uint32_t kS = 4, kW = 16;  // duo_sink, duo_window of the tests

kvp_config config(const kvp_model &m, const std::string &spec) {
    kvp_config cfg;
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256];
    EXPECT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << err;
    return cfg;
}

// A cache with a role table in its own arena.
struct Duo {
    kvp_cache *c = nullptr;
    void *arena = nullptr;
    size_t bytes = 0;
    Duo(const kvp_model &m, const std::string &spec, const std::vector<uint8_t> &roles) {
        const kvp_config cfg = config(m, spec);
        bytes = kvp_arena_size_heads(&cfg, roles.empty() ? nullptr : roles.data(), uint32_t(roles.size()));
        EXPECT_GT(bytes, 0u) << spec;
        arena = aligned_alloc(64, (bytes + 63) / 64 * 64);
        char err[256];
        EXPECT_EQ(kvp_create_heads(&cfg, nullptr, 0, roles.empty() ? nullptr : roles.data(), uint32_t(roles.size()),
                                   arena, bytes, &c, err, sizeof err),
                  KVP_OK)
            << err;
    }
    ~Duo() {
        kvp_destroy(c);
        free(arena);
    }
    std::vector<int32_t> positions(uint32_t l, uint32_t h) const {
        std::vector<int32_t> p(kvp_layer_len(c, l) + 1);
        uint32_t n = 0;
        EXPECT_EQ(kvp_layer_positions(c, l, h, p.data(), uint32_t(p.size()), &n), KVP_OK);
        p.resize(n);
        return p;
    }
};

bool streaming(const std::vector<uint8_t> &roles, uint32_t H, uint32_t l, uint32_t h) {
    return !roles.empty() && roles[size_t(l) * H + h] == KVP_HEAD_STREAMING;
}

// What a head holds after token t (0-based, t+1 tokens seen): a streaming head its first kS and its
// kW newest, a retrieval head (policy=full) all. What token t's query sees in a call whose first
// token is t0: a streaming head kept the kW - 1 newest before the call (t0 = t: a decode, exactly
// the kW newest).
std::vector<uint32_t> expected_idx(bool stream, uint32_t t, uint32_t t0 = UINT32_MAX) {
    if (t0 == UINT32_MAX) t0 = t;
    std::vector<uint32_t> idx;
    for (uint32_t j = 0; j <= t; ++j)
        if (!stream || j < kS || j + kW > t0) idx.push_back(j);
    return idx;
}

// Outputs of token t's query heads against the reference over each KV head's expected tokens.
void expect_reference(const kvp_model &m, const ref::Inputs &in, const std::vector<uint8_t> &roles, uint32_t l,
                      uint32_t t, const float *out, const char *what, uint32_t t0 = UINT32_MAX) {
    const uint32_t H = m.n_kv_heads, G = m.n_q_heads / H, hd = m.head_dim;
    for (uint32_t h = 0; h < H; ++h) {
        const std::vector<uint32_t> idx = expected_idx(streaming(roles, H, l, h), t, t0);
        std::vector<int64_t> kpos(idx.begin(), idx.end());
        std::vector<double> ref_out;
        ref::attend(m, in.qt(t), int64_t(t), in.k.data(), in.v.data(), idx, kpos, ref_out);
        for (uint32_t g = 0; g < G; ++g) {
            const uint32_t qh = h * G + g;
            for (uint32_t d = 0; d < hd; ++d)
                ASSERT_NEAR(out[size_t(qh) * hd + d], ref_out[size_t(qh) * hd + d], 2e-4)
                    << what << " layer " << l << " KV head " << h << " token " << t << " dim " << d;
        }
    }
}

const kvp_model kModel = ref::model(2, 4, 2, 16);
// layer 0: head 0 streaming; layer 1: head 1 streaming
const std::vector<uint8_t> kMixed = {KVP_HEAD_STREAMING, KVP_HEAD_RETRIEVAL, KVP_HEAD_RETRIEVAL, KVP_HEAD_STREAMING};
const std::string kSpec = "policy=full capacity=128 block=4 duo_sink=4 duo_window=16";

TEST(Duo, StreamingHeadsAttendOverSinksAndWindowRetrievalOverAll) {
    const ref::Inputs in(kModel, 100, 7, 1.0f);
    Duo c(kModel, kSpec, kMixed);
    ASSERT_NE(c.c, nullptr);
    EXPECT_EQ(kvp_prefill_room(c.c), kW);  // a streaming head takes at most duo_window per call
    std::vector<float> out(size_t(kW) * in.nq);
    // the prompt in chunks of 16, 16, 8: every query of a chunk sees the sinks and the kW - 1 tokens
    // before the chunk, then the chunk causally
    uint32_t t0 = 0;
    for (uint32_t n : {16u, 16u, 8u}) {
        for (uint32_t l = 0; l < kModel.n_layers; ++l) {
            ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, in.qt(t0), in.kt(t0), in.vt(t0), out.data(), nullptr), KVP_OK)
                << kvp_last_error(c.c);
            for (uint32_t i = 0; i < n; ++i) expect_reference(kModel, in, kMixed, l, t0 + i, &out[size_t(i) * in.nq], "prefill", t0);
        }
        t0 += n;
        for (uint32_t h = 0; h < 2; ++h) {  // between calls: sinks + the kW newest
            const std::vector<uint32_t> idx = expected_idx(streaming(kMixed, 2, 0, h), t0 - 1);
            EXPECT_EQ(c.positions(0, h), std::vector<int32_t>(idx.begin(), idx.end()));
        }
    }
    for (uint32_t t = t0; t < in.T; ++t)
        for (uint32_t l = 0; l < kModel.n_layers; ++l) {
            ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << kvp_last_error(c.c);
            expect_reference(kModel, in, kMixed, l, t, out.data(), "decode");
            for (uint32_t h = 0; h < kModel.n_kv_heads; ++h) {  // mutation check: a head that did not evict fails here
                const std::vector<uint32_t> idx = expected_idx(streaming(kMixed, 2, l, h), t);
                EXPECT_EQ(c.positions(l, h), std::vector<int32_t>(idx.begin(), idx.end())) << l << " " << h << " " << t;
            }
        }
    // live bytes follow the per-head lengths (K + V f32 rows)
    kvp_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(kvp_get_stats(c.c, &st), KVP_OK);
    const uint64_t row = 2ull * kModel.head_dim * sizeof(float);
    EXPECT_EQ(st.live_bytes, (2ull * in.T + 2ull * (kS + kW)) * row);
    kvp_layer_stats ls;
    ls.struct_size = sizeof ls;
    ASSERT_EQ(kvp_get_layer_stats(c.c, 0, &ls), KVP_OK);
    EXPECT_EQ(ls.len, in.T);  // the max over KV heads: the retrieval head
    EXPECT_EQ(ls.live_bytes, (uint64_t(in.T) + kS + kW) * row);
    EXPECT_EQ(ls.tokens_evicted, uint64_t(in.T - kS - kW));
}

TEST(Duo, ArenaFollowsTheRoles) {
    const kvp_config cfg = config(kModel, kSpec);
    const size_t uniform = kvp_arena_size(&cfg);
    const std::vector<uint8_t> ret(4, KVP_HEAD_RETRIEVAL), str(4, KVP_HEAD_STREAMING);
    EXPECT_EQ(kvp_arena_size_heads(&cfg, nullptr, 0), uniform);
    EXPECT_EQ(kvp_arena_size_heads(&cfg, ret.data(), 4), uniform);
    const size_t all = kvp_arena_size_heads(&cfg, str.data(), 4), mixed = kvp_arena_size_heads(&cfg, kMixed.data(), 4);
    EXPECT_LT(all, mixed);
    EXPECT_LT(mixed, uniform);
    // A Llama-3-8B-shaped geometry (32 layers, 32/8 heads, head_dim 128, full, capacity 8192,
    // the reference's sink 64 and window 256): uniform vs all streaming vs half (each pool: every
    // other layer streaming).
    const kvp_model big = ref::model(32, 32, 8, 128, KVP_ROPE_NEOX, 0, 500000.0f);
    const kvp_config bc = config(big, "policy=full capacity=8192");
    std::vector<uint8_t> ball(32 * 8, KVP_HEAD_STREAMING), bhalf(32 * 8);
    for (uint32_t i = 0; i < bhalf.size(); ++i) bhalf[i] = uint8_t(((i / 8) + (i % 8)) % 2);
    // 64-bit products: the sizes are above 2^31, so x 10 would wrap on 32-bit targets (armhf)
    const uint64_t bu = kvp_arena_size(&bc), ba = kvp_arena_size_heads(&bc, ball.data(), 256),
                   bh = kvp_arena_size_heads(&bc, bhalf.data(), 256);
    printf("arena bytes, 32x(32q/8kv)x128, full capacity=8192, duo_sink=64 duo_window=256: uniform %llu, "
           "all streaming %llu, half %llu\n",
           (unsigned long long)bu, (unsigned long long)ba, (unsigned long long)bh);
    EXPECT_LT(ba * 10, bu);  // 64 + 511 of 8192 token slots per head
    EXPECT_LT(bh * 10, bu * 6);
    EXPECT_GT(bh * 10, bu * 4);
}

// Blocks go back to the pool: an all-streaming cache in its (small) arena runs 600 tokens.
TEST(Duo, StreamingBlocksReturnToThePool) {
    const std::vector<uint8_t> str(4, KVP_HEAD_STREAMING);
    Duo c(kModel, kSpec, str);
    const kvp_config cfg = config(kModel, kSpec);
    EXPECT_LT(c.bytes, kvp_arena_size(&cfg));
    const ref::Inputs in(kModel, 600, 9, 1.0f);
    std::vector<float> out(in.nq);
    for (uint32_t t = 0; t < in.T; ++t)
        for (uint32_t l = 0; l < 2; ++l)
            ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << t << kvp_last_error(c.c);
    kvp_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(kvp_get_stats(c.c, &st), KVP_OK);
    EXPECT_EQ(st.live_bytes, 4ull * (kS + kW) * 2 * 16 * sizeof(float));
    EXPECT_EQ(st.tokens_evicted, 4ull * (600 - kS - kW));
    // kvp_reset: every block back, the table kept
    ASSERT_EQ(kvp_reset(c.c), KVP_OK);
    for (uint32_t t = 0; t < 40; ++t)
        for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
    EXPECT_EQ(c.positions(1, 0).size(), kS + kW);
}

// score=fixed with h2o (retrieval heads evict by score): the same bits for threads 1/2/3.
TEST(Duo, FixedScoresAreTheSameForEveryThreadCount) {
    const kvp_model m = ref::model(2, 8, 4, 32);
    std::vector<uint8_t> roles(8);
    for (uint32_t i = 0; i < 8; ++i) roles[i] = uint8_t(i % 3 == 0);
    const ref::Inputs in(m, 120, 11, 1.0f);
    std::vector<std::vector<float>> outs;
    std::vector<std::vector<int32_t>> kept;
    for (uint32_t threads = 1; threads <= 3; ++threads) {
        ref::ForceParallel par(threads > 1);
        Duo c(m, "policy=h2o budget=24 recent=4 capacity=40 score=fixed duo_sink=4 duo_window=16 threads=" + std::to_string(threads),
              roles);
        std::vector<float> all, out(size_t(16) * in.nq);
        for (uint32_t t0 = 0; t0 < 32; t0 += 16)
            for (uint32_t l = 0; l < 2; ++l) {
                ASSERT_EQ(kvp_prefill(c.c, l, 16, nullptr, in.qt(t0), in.kt(t0), in.vt(t0), out.data(), nullptr), KVP_OK)
                    << kvp_last_error(c.c);
                all.insert(all.end(), out.begin(), out.end());
            }
        for (uint32_t t = 32; t < in.T; ++t)
            for (uint32_t l = 0; l < 2; ++l) {
                ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << kvp_last_error(c.c);
                all.insert(all.end(), out.begin(), out.begin() + in.nq);
            }
        std::vector<int32_t> pos;
        for (uint32_t l = 0; l < 2; ++l)
            for (uint32_t h = 0; h < 4; ++h) {
                const std::vector<int32_t> p = c.positions(l, h);
                if (roles[l * 4 + h]) {
                    EXPECT_EQ(p.size(), kS + kW);
                } else {
                    EXPECT_LE(p.size(), 40u);
                }
                pos.insert(pos.end(), p.begin(), p.end());
                pos.push_back(-1);
            }
        outs.push_back(all);
        kept.push_back(pos);
    }
    for (uint32_t i = 1; i < 3; ++i) {
        EXPECT_EQ(kept[i], kept[0]) << "threads " << i + 1;
        ASSERT_EQ(outs[i].size(), outs[0].size());
        EXPECT_EQ(memcmp(outs[i].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0) << "threads " << i + 1;
    }
}

TEST(Duo, StateRoundTripsAndRefusesAnotherTable) {
    const ref::Inputs in(kModel, 80, 13, 1.0f);
    Duo a(kModel, kSpec, kMixed), b(kModel, kSpec, kMixed);
    std::vector<float> out(in.nq), out2(in.nq);
    for (uint32_t t = 0; t < 50; ++t)
        for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_decode(a.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
    std::vector<uint8_t> buf(kvp_state_size(a.c));
    size_t written = 0;
    ASSERT_EQ(kvp_state_save(a.c, buf.data(), buf.size(), &written), KVP_OK) << kvp_last_error(a.c);
    ASSERT_EQ(kvp_state_load(b.c, buf.data(), written), KVP_OK) << kvp_last_error(b.c);
    for (uint32_t t = 50; t < in.T; ++t)
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_decode(a.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(b.c, l, in.qt(t), in.kt(t), in.vt(t), out2.data()), KVP_OK);
            ASSERT_EQ(memcmp(out.data(), out2.data(), out.size() * sizeof(float)), 0) << t;
        }
    for (uint32_t l = 0; l < 2; ++l)
        for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(a.positions(l, h), b.positions(l, h));
    // another table, no table: refused, the cache unchanged
    const std::vector<uint8_t> other = {KVP_HEAD_RETRIEVAL, KVP_HEAD_STREAMING, KVP_HEAD_RETRIEVAL, KVP_HEAD_STREAMING};
    Duo o(kModel, kSpec, other), none(kModel, kSpec, {});
    EXPECT_EQ(kvp_state_load(o.c, buf.data(), written), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(o.c), "role table"), nullptr) << kvp_last_error(o.c);
    EXPECT_EQ(kvp_layer_len(o.c, 0), 0u);
    EXPECT_EQ(kvp_state_load(none.c, buf.data(), written), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(none.c), "kvp_create_heads"), nullptr) << kvp_last_error(none.c);
    // and a state without a table does not load into a cache with one
    std::vector<uint8_t> nb(kvp_state_size(none.c));
    ASSERT_EQ(kvp_state_save(none.c, nb.data(), nb.size(), &written), KVP_OK);
    EXPECT_EQ(kvp_state_load(a.c, nb.data(), written), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(a.c), "no DuoAttention role table"), nullptr) << kvp_last_error(a.c);
}

// A committed draft leaves the state one prefill of the accepted tokens would.
TEST(Duo, DraftsCommitAsThePrefillOfTheAcceptedTokens) {
    const ref::Inputs in(kModel, 60, 17, 1.0f);
    const std::string spec = kSpec + " max_draft=4";
    Duo a(kModel, spec, kMixed), b(kModel, spec, kMixed);
    std::vector<float> out(size_t(4) * in.nq);
    for (uint32_t t = 0; t < 40; ++t)
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_decode(a.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(b.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
        }
    ASSERT_EQ(kvp_draft_begin(a.c), KVP_OK) << kvp_last_error(a.c);
    for (uint32_t l = 0; l < 2; ++l)
        ASSERT_EQ(kvp_prefill(a.c, l, 3, nullptr, in.qt(40), in.kt(40), in.vt(40), out.data(), nullptr), KVP_OK)
            << kvp_last_error(a.c);
    ASSERT_EQ(kvp_draft_commit(a.c, 2), KVP_OK) << kvp_last_error(a.c);
    for (uint32_t l = 0; l < 2; ++l)
        ASSERT_EQ(kvp_prefill(b.c, l, 2, nullptr, in.qt(40), in.kt(40), in.vt(40), out.data(), nullptr), KVP_OK);
    for (uint32_t l = 0; l < 2; ++l)
        for (uint32_t h = 0; h < 2; ++h) {
            EXPECT_EQ(a.positions(l, h), b.positions(l, h));
            const std::vector<uint32_t> idx = expected_idx(streaming(kMixed, 2, l, h), 41);
            EXPECT_EQ(a.positions(l, h), std::vector<int32_t>(idx.begin(), idx.end()));
        }
    std::vector<float> o2(in.nq);
    for (uint32_t l = 0; l < 2; ++l) {
        ASSERT_EQ(kvp_decode(a.c, l, in.qt(42), in.kt(42), in.vt(42), out.data()), KVP_OK);
        ASSERT_EQ(kvp_decode(b.c, l, in.qt(42), in.kt(42), in.vt(42), o2.data()), KVP_OK);
        EXPECT_EQ(memcmp(out.data(), o2.data(), o2.size() * sizeof(float)), 0);
    }
}

TEST(Duo, ChunksAboveTheWindowAreRefused) {
    const ref::Inputs in(kModel, 40, 19, 1.0f);
    Duo c(kModel, kSpec, kMixed);
    std::vector<float> out(size_t(in.T) * in.nq);
    EXPECT_EQ(kvp_prefill(c.c, 0, kW + 1, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(c.c), "duo_window=16"), nullptr) << kvp_last_error(c.c);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 0u);
    // layer 1's streaming head is KV head 1: the same
    EXPECT_EQ(kvp_prefill(c.c, 1, kW + 1, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_ERR_FULL);
}

TEST(Duo, BadInputCreatesNothing) {
    const kvp_config cfg = config(kModel, kSpec);
    char err[256];
    const size_t bytes = kvp_arena_size_heads(&cfg, kMixed.data(), 4);
    void *arena = aligned_alloc(64, bytes + 64);
    kvp_cache *const sentinel = reinterpret_cast<kvp_cache *>(uintptr_t(0x40));
    struct Case {
        const kvp_config *cfg;
        const uint8_t *roles;
        uint32_t n;
        kvp_status st;
        const char *msg;
    };
    const uint8_t two[4] = {0, 1, 2, 0};
    const Case cases[] = {
        {nullptr, kMixed.data(), 4, KVP_ERR_ARG, "cfg and out"},
        {&cfg, nullptr, 4, KVP_ERR_ARG, "roles is NULL"},
        {&cfg, kMixed.data(), 3, KVP_ERR_CONFIG, "n_roles=3 must be n_layers * n_kv_heads = 4"},
        {&cfg, kMixed.data(), 0, KVP_ERR_CONFIG, "n_roles=0"},
        {&cfg, two, 4, KVP_ERR_CONFIG, "roles[2]=2 (layer 1, KV head 0) is not a role"},
    };
    for (const Case &k : cases) {
        kvp_cache *c = sentinel;
        EXPECT_EQ(kvp_create_heads(k.cfg, nullptr, 0, k.roles, k.n, arena, bytes, &c, err, sizeof err), k.st) << k.msg;
        EXPECT_NE(strstr(err, k.msg), nullptr) << err;
        EXPECT_EQ(c, sentinel);
        EXPECT_EQ(kvp_arena_size_heads(k.cfg, k.roles, k.n), 0u) << k.msg;
    }
    kvp_cache *c = sentinel;
    EXPECT_EQ(kvp_create_heads(&cfg, nullptr, 0, kMixed.data(), 4, arena, bytes, nullptr, err, sizeof err), KVP_ERR_ARG);
    EXPECT_EQ(kvp_create_heads(&cfg, nullptr, 0, kMixed.data(), 4, arena, bytes - 64, &c, err, sizeof err), KVP_ERR_ARENA);
    EXPECT_NE(strstr(err, "below"), nullptr) << err;
    EXPECT_EQ(c, sentinel);
    // configurations streaming heads do not support, and bad duo keys
    const struct {
        const char *spec;
        kvp_status st;
        const char *msg;
    } specs[] = {
        {"policy=snapkv budget=32", KVP_ERR_UNSUPPORTED, "this policy"},
        {"policy=full capacity=128 kv_dtype=q8", KVP_ERR_UNSUPPORTED, "kv_dtype"},
        {"policy=h2o budget=32 total_capacity=40", KVP_ERR_UNSUPPORTED, "total_capacity"},
        {"policy=h2o budget=32 max_prompt=64", KVP_ERR_UNSUPPORTED, "max_prompt"},
        {"policy=full capacity=128 duo_window=0", KVP_ERR_CONFIG, "duo_window=0"},
        {"policy=full capacity=128 duo_window=8 max_draft=9", KVP_ERR_CONFIG, "max_draft=9 exceeds duo_window=8"},
    };
    for (const auto &s : specs) {
        const kvp_config bad = config(kModel, s.spec);
        c = sentinel;
        EXPECT_EQ(kvp_create_heads(&bad, nullptr, 0, kMixed.data(), 4, arena, bytes, &c, err, sizeof err), s.st) << s.spec;
        EXPECT_NE(strstr(err, s.msg), nullptr) << s.spec << ": " << err;
        EXPECT_EQ(c, sentinel);
        EXPECT_EQ(kvp_arena_size_heads(&bad, kMixed.data(), 4), 0u) << s.spec;
        // without a streaming head the same configuration is kvp_create_rope's business
        const std::vector<uint8_t> ret(4, 0);
        if (s.st == KVP_ERR_UNSUPPORTED) {
            EXPECT_EQ(kvp_arena_size_heads(&bad, ret.data(), 4), kvp_arena_size(&bad)) << s.spec;
        }
    }
    // a RoPE table that is wrong is checked first
    const double bad_freq[3] = {1.0, 0.5, 0.25};
    EXPECT_EQ(kvp_create_heads(&cfg, bad_freq, 3, kMixed.data(), 4, arena, bytes, &c, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_EQ(c, sentinel);
    free(arena);
    // NULL/0 is kvp_create_rope exactly (in kvp_arena_size bytes)
    const size_t full = kvp_arena_size(&cfg);
    void *farena = aligned_alloc(64, (full + 63) / 64 * 64);
    ASSERT_EQ(kvp_create_heads(&cfg, nullptr, 0, nullptr, 0, farena, full, &c, err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(kvp_prefill_room(c), 128u);
    kvp_destroy(c);
    free(farena);
}

// The C++ header's create() with a role table.
TEST(Duo, CxxHeaderCreatesWithRoles) {
    const kvp_config cfg = config(kModel, kSpec);
    kvprune::Cache c;
    ASSERT_EQ(c.create(cfg, nullptr, 0, kMixed.data(), 4), KVP_OK) << c.create_error();
    const ref::Inputs in(kModel, 30, 23, 1.0f);
    std::vector<float> out(in.nq);
    for (uint32_t t = 0; t < in.T; ++t)
        for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(c.decode(l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
    uint32_t n = 0;
    int32_t pos[64];
    ASSERT_EQ(kvp_layer_positions(c.get(), 0, 0, pos, 64, &n), KVP_OK);
    EXPECT_EQ(n, kS + kW);
    const uint8_t bad[4] = {0, 3, 0, 0};
    EXPECT_EQ(c.create(cfg, nullptr, 0, bad, 4), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(c.create_error(), "roles[1]=3"), nullptr) << c.create_error();
    ASSERT_EQ(kvp_layer_positions(c.get(), 0, 0, pos, 64, &n), KVP_OK);  // the old cache kept
    EXPECT_EQ(n, kS + kW);
}

}  // namespace
