// Sliding-window layers (issue 21 item 5, src/sliding.h): local layers attend exactly to the keys
// at positions p-W < pos <= p (checked against a masked attention in double, tests/reference.h),
// hold only what the next query can see (W - 1 tokens between calls: real blocks back to the
// pool), take a prefill of any length in one call (masked within the chunk), and the global
// layers run the policy. Composition: positions modes, kv dtypes, score=fixed, threads, policies
// that budget across layers, drafts (test_draft.cpp runs the twin with sliding specs), state
// save/load, and the refused contradictory configs.
#include <gtest/gtest.h>
#include <string.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "reference.h"

namespace {

constexpr uint32_t kTokens = 150;  // prompt + decodes

struct Check {
    double max_err = 0;
};

// Runs a prompt of P tokens as prefill chunks of `chunk` (0: one call) then kTokens - P decodes on
// every layer, checking every output row against the double reference over the window (local
// layers) or every earlier token (global layers, policy=full), and the kept positions.
void run_against_reference(const kvp_model &m, const std::string &spec, uint32_t W, uint32_t pattern, uint32_t P,
                           uint32_t chunk, double tol, Check &chk) {
    ref::Cache cache(m, spec);
    ASSERT_TRUE(cache.c) << spec;
    ref::Inputs in(m, kTokens, 42 + P + chunk, 1.0f);
    const uint32_t L = m.n_layers;
    std::vector<float> out(size_t(kTokens) * in.nq);
    auto is_local = [&](uint32_t l) { return pattern == 0 || (l + 1) % pattern != 0; };
    auto check_row = [&](uint32_t l, uint32_t t, const float *o) {
        std::vector<uint32_t> idx;
        std::vector<int64_t> kp;
        for (uint32_t j = 0; j <= t; ++j) {
            if (is_local(l) && !(int64_t(j) > int64_t(t) - int64_t(W))) continue;
            idx.push_back(j);
            kp.push_back(j);
        }
        std::vector<double> r;
        ref::attend(m, in.qt(t), t, in.k.data(), in.v.data(), idx, kp, r);
        for (size_t i = 0; i < r.size(); ++i) {
            const double e = std::fabs(double(o[i]) - r[i]);
            if (e > chk.max_err) chk.max_err = e;
            ASSERT_LT(e, tol) << spec << " layer " << l << " token " << t << " elem " << i;
        }
    };
    for (uint32_t l = 0; l < L; ++l) {
        for (uint32_t t0 = 0; t0 < P;) {
            const uint32_t n = chunk ? (P - t0 < chunk ? P - t0 : chunk) : P;
            ASSERT_EQ(kvp_prefill(cache.c, l, n, nullptr, in.qt(t0), in.kt(t0), in.vt(t0), &out[size_t(t0) * in.nq], nullptr),
                      KVP_OK)
                << spec << ": " << kvp_last_error(cache.c);
            t0 += n;
        }
        for (uint32_t t = 0; t < P; ++t) {
            check_row(l, t, &out[size_t(t) * in.nq]);
            if (::testing::Test::HasFatalFailure()) return;
        }
        if (is_local(l)) {  // between calls a local layer holds the last W - 1 tokens
            const uint32_t keep = P < W - 1 ? P : W - 1;
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                const std::vector<int32_t> pos = cache.positions(l, h);
                ASSERT_EQ(pos.size(), keep) << spec << " layer " << l;
                for (uint32_t i = 0; i < keep; ++i) ASSERT_EQ(pos[i], int32_t(P - keep + i)) << spec;
            }
        }
    }
    for (uint32_t t = P; t < kTokens; ++t) {
        for (uint32_t l = 0; l < L; ++l) {
            ASSERT_EQ(kvp_decode(cache.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK)
                << spec << ": " << kvp_last_error(cache.c);
            check_row(l, t, out.data());
            if (::testing::Test::HasFatalFailure()) return;
            if (is_local(l)) ASSERT_EQ(kvp_layer_len(cache.c, l), W - 1 < t + 1 ? W - 1 : t + 1) << spec;
            else ASSERT_EQ(kvp_layer_len(cache.c, l), t + 1) << spec;
        }
    }
}

TEST(Sliding, MatchesMaskedReference) {
    uint64_t runs = 0;
    for (kvp_rope_style rs : {KVP_ROPE_GPTJ, KVP_ROPE_NEOX}) {
        const kvp_model m = ref::model(3, 4, 2, 32, rs);
        for (uint32_t W : {1u, 20u, 47u}) {
            for (uint32_t pattern : {0u, 3u}) {
                for (const char *pm : {"original", "realign"}) {
                    // (extra keys, prefill chunk): one call, 7-token chunks on 2 threads, 64 with 4-slot blocks
                    const std::pair<const char *, uint32_t> variants[] = {{"", 0}, {" threads=2", 7}, {" block=4", 64}};
                    for (const auto &var : variants) {
                        const std::string spec = "policy=full capacity=400 positions=" + std::string(pm) +
                                                 " sliding_window=" + std::to_string(W) +
                                                 " sliding_pattern=" + std::to_string(pattern) + var.first;
                        Check chk;
                        run_against_reference(m, spec, W, pattern, 100, var.second, 2e-5, chk);
                        if (HasFatalFailure()) return;
                        ++runs;
                    }
                }
            }
        }
    }
    EXPECT_EQ(runs, 72u);
}

// Caller positions with gaps: the window is in positions (p-W < pos <= p), not in tokens; prefill
// chunks and decodes, original positions (the rotation is the caller's position).
TEST(Sliding, GappedPositions) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    const uint32_t W = 25, T = 120;
    ref::Inputs in(m, T, 77, 1.0f);
    std::vector<int32_t> pos(T);
    for (uint32_t t = 0; t < T; ++t) pos[t] = int32_t(t * 3 + (t * 7) % 3);  // ascending, gaps of 1..5
    for (const char *extra : {"", " block=4 threads=2"}) {
        const std::string spec = std::string("policy=full capacity=400 positions=original sliding_window=25 sliding_pattern=2") + extra;
        ref::Cache c(m, spec);
        ASSERT_TRUE(c.c);
        std::vector<float> out(size_t(T) * in.nq);
        auto check = [&](uint32_t l, uint32_t t, const float *o) {
            std::vector<uint32_t> idx;
            std::vector<int64_t> kp;
            for (uint32_t j = 0; j <= t; ++j)
                if (l == 1 || pos[j] > pos[t] - int32_t(W)) idx.push_back(j), kp.push_back(pos[j]);
            std::vector<double> r;
            ref::attend(m, in.qt(t), pos[t], in.k.data(), in.v.data(), idx, kp, r);
            for (size_t i = 0; i < r.size(); ++i) ASSERT_NEAR(o[i], r[i], 2e-5) << spec << " layer " << l << " token " << t;
        };
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_prefill(c.c, l, 50, pos.data(), in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
                << kvp_last_error(c.c);
            ASSERT_EQ(kvp_prefill(c.c, l, 30, pos.data() + 50, in.qt(50), in.kt(50), in.vt(50), out.data() + 50 * in.nq, nullptr),
                      KVP_OK);
            for (uint32_t t = 0; t < 80; ++t) {
                check(l, t, &out[size_t(t) * in.nq]);
                if (HasFatalFailure()) return;
            }
        }
        for (uint32_t t = 80; t < T; ++t)
            for (uint32_t l = 0; l < 2; ++l) {
                ASSERT_EQ(kvp_prefill(c.c, l, 1, &pos[t], in.qt(t), in.kt(t), in.vt(t), out.data(), nullptr), KVP_OK);
                check(l, t, out.data());
                if (HasFatalFailure()) return;
                if (l == 0) {  // holds only what the next query (position > pos[t]) can see
                    for (int32_t p : c.positions(0, 1)) ASSERT_GT(p, pos[t] + 1 - int32_t(W));
                }
            }
    }
}

// Quantized storage: the same windows (kept positions exact), outputs within the format's error.
TEST(Sliding, QuantizedDtypes) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    for (const char *dt : {"f16", "q8", "q4"}) {
        const double tol = strcmp(dt, "f16") == 0 ? 2e-3 : strcmp(dt, "q8") == 0 ? 3e-2 : 0.3;
        for (uint32_t W : {9u, 40u}) {
            const std::string spec = std::string("policy=full capacity=400 quant_group=16 kv_dtype=") + dt +
                                     " sliding_window=" + std::to_string(W) + " sliding_pattern=2";
            Check chk;
            run_against_reference(m, spec, W, 2, 90, 0, tol, chk);
            if (HasFatalFailure()) return;
            printf("%-90s max err %.3g\n", spec.c_str(), chk.max_err);
        }
    }
}

// Thread counts and chunkings change no bit of a local layer's decode outputs or kept state.
TEST(Sliding, DeterministicAcrossThreads) {
    const kvp_model m = ref::model(4, 8, 2, 32);
    ref::ForceParallel force(true);
    ref::Inputs in(m, 200, 5, 1.0f);
    std::vector<std::vector<float>> outs;
    for (const char *thr : {"threads=1", "threads=2", "threads=3"}) {
        ref::Cache c(m, std::string("policy=h2o budget=48 recent=8 capacity=80 sliding_window=24 sliding_pattern=2 ") + thr);
        ASSERT_TRUE(c.c);
        std::vector<float> o(size_t(200) * in.nq), all;
        for (uint32_t l = 0; l < 4; ++l)
            ASSERT_EQ(kvp_prefill(c.c, l, 60, nullptr, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK)
                << kvp_last_error(c.c);
        all.insert(all.end(), o.begin(), o.begin() + size_t(60) * in.nq);
        for (uint32_t t = 60; t < 200; ++t)
            for (uint32_t l = 0; l < 4; ++l) {
                ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), o.data()), KVP_OK) << kvp_last_error(c.c);
                all.insert(all.end(), o.begin(), o.begin() + in.nq);
            }
        outs.push_back(all);
    }
    for (size_t i = 1; i < outs.size(); ++i) ASSERT_EQ(memcmp(outs[0].data(), outs[i].data(), outs[0].size() * 4), 0) << i;
}

// Real memory: the arena of a Gemma-3-shaped config is smaller than the window-less one, a local
// layer's capacity is W - 1 + one prefill piece, and live bytes stay at the windows.
TEST(Sliding, ArenaAndLiveBytes) {
    const kvp_model m = ref::model(12, 4, 1, 64);
    kvp_config a, b;
    ASSERT_EQ(kvp_config_default(&a, &m), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&a, "policy=full capacity=2048", nullptr, 0), KVP_OK);
    b = a;
    ASSERT_EQ(kvp_config_apply(&b, "sliding_window=128 sliding_pattern=6", nullptr, 0), KVP_OK);
    const size_t sa = kvp_arena_size(&a), sb = kvp_arena_size(&b);
    ASSERT_GT(sa, 0u);
    ASSERT_GT(sb, 0u);
    // 2 global layers of 2048 and 10 local of ~160: well under a third of the window-less arena
    EXPECT_LT(double(sb), double(sa) * 0.3) << sa << " " << sb;
    ref::Cache c(m, "policy=full capacity=2048 sliding_window=128 sliding_pattern=6");
    ASSERT_TRUE(c.c);
    for (uint32_t l = 0; l < 12; ++l) {
        if ((l + 1) % 6 == 0) EXPECT_EQ(kvp_layer_capacity(c.c, l), 2048u);
        else EXPECT_EQ(kvp_layer_capacity(c.c, l), 127u + 32u);
    }
    ref::Inputs in(m, 1000, 3, 1.0f);
    std::vector<float> o(size_t(1000) * in.nq);
    for (uint32_t l = 0; l < 12; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, 1000, nullptr, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK) << kvp_last_error(c.c);
    kvp_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    ASSERT_EQ(kvp_get_stats(c.c, &st), KVP_OK);
    const uint64_t tok = uint64_t(64) * 4 * 2;  // K + V of one token in one KV head
    EXPECT_EQ(st.live_bytes, (2 * 1000 + 10 * 127) * tok);
    EXPECT_EQ(kvp_prefill_room(c.c), 2048u - 1000u);  // the global layers bound a chunk
}

// Global layers run the policy, also those that budget across layers (by the model layer index,
// as without windows): a global layer keeps exactly the positions, and gives exactly the output
// bits, of the same layer of a window-less twin fed the same calls; local layers hold their
// windows whatever the policy.
TEST(Sliding, PoliciesOnGlobalLayers) {
    const kvp_model m = ref::model(6, 4, 2, 32);
    ref::Inputs in(m, 400, 11, 1.0f);
    for (const char *spec : {"policy=window window=50", "policy=streaming sinks=4 window=40",
                             "policy=h2o budget=48 recent=8 capacity=80", "policy=h2o budget=48 recent=8 capacity=80 score=fixed",
                             "policy=snapkv budget=40 obs_window=8 capacity=64 prefill_stage=300",
                             "policy=pyramidkv budget=40 obs_window=8 prefill_stage=300",
                             "policy=lethe capacity=150 evict_threshold=40 obs_window=8",
                             "policy=simlayerkv nonlazy=h2o budget=48 recent=8 capacity=80 sinks=4 window=24 lazy_last=8",
                             "policy=h2o budget=48 recent=8 capacity=80 total_capacity=400"}) {
        const std::string s = std::string(spec) + " sliding_window=16 sliding_pattern=3";
        const bool shared = strstr(spec, "total_capacity") != nullptr;  // the twin's pool pressure differs
        ref::Cache c(m, s), twin(m, spec);
        ASSERT_TRUE(c.c && twin.c) << s;
        std::vector<float> o(size_t(400) * in.nq), ot(o.size());
        auto same_global = [&](uint32_t l, size_t floats, const char *what) {
            if ((l + 1) % 3 != 0 || shared) return;
            ASSERT_EQ(memcmp(o.data(), ot.data(), floats * sizeof(float)), 0) << s << " " << what << " layer " << l;
        };
        for (uint32_t t0 = 0; t0 < 250;) {  // chunks the global layers' policy takes
            const uint32_t r1 = kvp_prefill_room(c.c), r2 = kvp_prefill_room(twin.c), room = r1 < r2 ? r1 : r2;
            const uint32_t n = 250 - t0 < room ? 250 - t0 : room;
            ASSERT_GT(n, 0u) << s;
            for (uint32_t l = 0; l < 6; ++l) {
                ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, in.qt(t0), in.kt(t0), in.vt(t0), o.data(), nullptr), KVP_OK)
                    << s << ": " << kvp_last_error(c.c);
                ASSERT_EQ(kvp_prefill(twin.c, l, n, nullptr, in.qt(t0), in.kt(t0), in.vt(t0), ot.data(), nullptr), KVP_OK)
                    << spec << ": " << kvp_last_error(twin.c);
                same_global(l, size_t(n) * in.nq, "prefill");
            }
            t0 += n;
        }
        for (uint32_t t = 250; t < 400; ++t)
            for (uint32_t l = 0; l < 6; ++l) {
                ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), o.data()), KVP_OK) << s << ": " << kvp_last_error(c.c);
                ASSERT_EQ(kvp_decode(twin.c, l, in.qt(t), in.kt(t), in.vt(t), ot.data()), KVP_OK) << spec;
                same_global(l, in.nq, "decode");
            }
        for (uint32_t l = 0; l < 6; ++l) {
            for (uint32_t h = 0; h < 2; ++h) {
                const std::vector<int32_t> pos = c.positions(l, h);
                if ((l + 1) % 3 != 0) {
                    ASSERT_EQ(pos.size(), 15u) << s << " layer " << l;
                    EXPECT_EQ(pos.front(), 385) << s;
                } else if (!shared) {
                    EXPECT_EQ(pos, twin.positions(l, h)) << s << " layer " << l << " head " << h;
                }
            }
        }
    }
}

// State save/load: a sliding cache continues bit-identically after a load; a state saved without
// windows does not load into a cache with them (different config) and vice versa.
TEST(Sliding, StateSaveLoad) {
    const kvp_model m = ref::model(3, 4, 2, 32);
    const std::string spec = "policy=h2o budget=48 recent=8 capacity=80 sliding_window=20 sliding_pattern=3";
    ref::Cache a(m, spec), b(m, spec), plain(m, "policy=h2o budget=48 recent=8 capacity=80");
    ref::Inputs in(m, 120, 9, 1.0f);
    std::vector<float> oa(size_t(120) * in.nq), ob(oa.size());
    for (uint32_t l = 0; l < 3; ++l) {
        ASSERT_EQ(kvp_prefill(a.c, l, 70, nullptr, in.qt(0), in.kt(0), in.vt(0), oa.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(plain.c, l, 70, nullptr, in.qt(0), in.kt(0), in.vt(0), oa.data(), nullptr), KVP_OK);
    }
    std::vector<char> buf(kvp_state_size(a.c)), pbuf(kvp_state_size(plain.c));
    size_t w = 0;
    ASSERT_EQ(kvp_state_save(a.c, buf.data(), buf.size(), &w), KVP_OK);
    ASSERT_EQ(kvp_state_load(b.c, buf.data(), w), KVP_OK) << kvp_last_error(b.c);
    for (uint32_t t = 70; t < 120; ++t)
        for (uint32_t l = 0; l < 3; ++l) {
            ASSERT_EQ(kvp_decode(a.c, l, in.qt(t), in.kt(t), in.vt(t), oa.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(b.c, l, in.qt(t), in.kt(t), in.vt(t), ob.data()), KVP_OK);
            ASSERT_EQ(memcmp(oa.data(), ob.data(), in.nq * sizeof(float)), 0) << t << " " << l;
        }
    size_t pw = 0;
    ASSERT_EQ(kvp_state_save(plain.c, pbuf.data(), pbuf.size(), &pw), KVP_OK);
    EXPECT_EQ(kvp_state_load(b.c, pbuf.data(), pw), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(kvp_last_error(b.c)).find("sliding_window"), std::string::npos) << kvp_last_error(b.c);
    EXPECT_EQ(kvp_state_load(plain.c, buf.data(), w), KVP_ERR_CONFIG);
    // the state is close to live bytes: the local layers' windows, not the arena
    EXPECT_LT(buf.size(), pbuf.size());
}

// Contradictory configs: refused with a message naming the keys; the config is unchanged.
TEST(Sliding, RefusedConfigs) {
    const kvp_model m = ref::model(4, 4, 2, 32);
    struct Case {
        const char *spec, *needle;
        kvp_status st;
    } cases[] = {
        {"sliding_pattern=6", "needs sliding_window", KVP_ERR_CONFIG},
        {"sliding_window=64 sliding_pattern=1", "every layer global", KVP_ERR_CONFIG},
        {"policy=h2o sliding_window=64", "would run on no layer", KVP_ERR_CONFIG},
        {"policy=h2o sliding_window=64 sliding_pattern=5", "would run on no layer", KVP_ERR_CONFIG},  // 4 layers
        {"policy=asl sliding_window=64 sliding_pattern=2", "asl", KVP_ERR_UNSUPPORTED},
        {"policy=think token_policy=h2o sliding_window=64 sliding_pattern=2", "think", KVP_ERR_UNSUPPORTED},
        {"sliding_window=268435456", "capacity", KVP_ERR_CONFIG},
    };
    for (const Case &k : cases) {
        kvp_config cfg, before;
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        before = cfg;
        char err[512] = "";
        EXPECT_EQ(kvp_config_apply(&cfg, k.spec, err, sizeof err), k.st) << k.spec << ": " << err;
        EXPECT_NE(std::string(err).find(k.needle), std::string::npos) << k.spec << ": " << err;
        EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0) << k.spec;
    }
    // accepted: all local with policy=full (Mistral), window 1, pattern beyond n_layers with full
    for (const char *ok : {"sliding_window=4096", "sliding_window=1", "sliding_window=8 sliding_pattern=9"}) {
        kvp_config cfg;
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        char err[512] = "";
        EXPECT_EQ(kvp_config_apply(&cfg, ok, err, sizeof err), KVP_OK) << ok << ": " << err;
    }
}

}  // namespace
