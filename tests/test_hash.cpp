// Cross-ISA determinism hash.
//
// Runs fixed decode workloads through the public C API and hashes (FNV-1a 64) every output
// byte, the kept original positions of every (layer, KV head) after every step, and the final
// counters. Each workload prints one line
//     KVP_HASH <name> <16 hex digits>
// and the whole test one line `KVP_HASH all <hex>`, which .ci/cross.sh compares between
// x86-64 and aarch64 (qemu) builds. The inputs come from an integer PRNG and are exact binary
// fractions, so they are the same bits on every platform; with SIMDE_NO_NATIVE (portable SIMD
// path, KVP_AVX2=OFF) the hashes must agree across ISAs, and threads=1 and threads=2 must agree
// everywhere. No expected value is pinned here (a kernel change legitimately moves it);
// set KVP_EXPECT_HASH=<hex> to check `all` against a known value.
// With score=fixed the eviction decisions are integer functions of the inputs: `KVP_HASH fixed`
// (kept positions and counters only) must agree on every platform and build, native SIMD
// included (DeterminismHash.FixedScoringDecisions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "reference.h"

namespace {

struct Fnv64 {
    uint64_t h = 0xcbf29ce484222325ull;
    void bytes(const void *p, size_t n) {
        const unsigned char *b = static_cast<const unsigned char *>(p);
        for (size_t i = 0; i < n; ++i) {
            h ^= b[i];
            h *= 0x100000001b3ull;
        }
    }
    // Fixed little-endian encoding so the hash does not depend on host byte order.
    void u64(uint64_t x) {
        unsigned char b[8];
        for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(x >> (8 * i));
        bytes(b, 8);
    }
    void u32(uint32_t x) {
        unsigned char b[4];
        for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(x >> (8 * i));
        bytes(b, 4);
    }
    void f32(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u32(u);
    }
};


struct Workload {
    const char *name;
    uint32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    kvp_rope_style rope;
    uint32_t rope_dim;
    const char *spec;
    uint32_t prefill_tokens;  // prompt given as one kvp_prefill chunk before decoding
    uint32_t decode_tokens;
    uint64_t seed;
    bool decisions_only = false;  // hash kept positions and counters only (score=fixed workloads)
};

// Streaming with a small window so that prunes happen many times; both RoPE styles, an odd
// head_dim (33: every SIMD tail path) and a multiple of the vector width (64).
const Workload kWorkloads[] = {
    {"stream_d33_gptj", 2, 4, 2, 33, KVP_ROPE_GPTJ, 32,
     "policy=streaming sinks=4 window=24 compress_every=8", 0, 300, 1},
    {"stream_d64_neox", 2, 4, 2, 64, KVP_ROPE_NEOX, 0,
     "policy=streaming sinks=2 window=40 compress_every=4 slack=8 max_drop=6", 20, 280, 2},
    {"full_d33_none", 2, 4, 2, 33, KVP_ROPE_NONE, 0, "policy=full capacity=320", 16, 284, 3},
};

// score=fixed (kernels/score_fixed.h): the eviction decisions must be the same on every platform
// (x86-64 AVX2, x86-64 SIMDE_NO_NATIVE, aarch64), whatever the float kernels do with the outputs,
// so these hash the kept positions of every (layer, KV head) after every call and the counters,
// not the outputs. Every scored policy, both position modes, a shared pool, many prunes.
const Workload kFixedWorkloads[] = {
    {"fixed_h2o", 2, 8, 2, 33, KVP_ROPE_GPTJ, 32, "policy=h2o score=fixed budget=24 recent=4 obs_window=8 prompt_scores=window capacity=64",
     40, 200, 11, true},
    {"fixed_h2o_realign_pool", 3, 4, 2, 24, KVP_ROPE_NEOX, 0,
     "policy=h2o score=fixed budget=40 recent=6 positions=realign total_capacity=96", 30, 180, 12, true},
    {"fixed_snapkv", 2, 4, 2, 32, KVP_ROPE_GPTJ, 0,
     "policy=snapkv score=fixed budget=32 obs_window=8 pool=max pool_kernel=7 recent=4 capacity=48", 150, 150, 13, true},
    {"fixed_snapkv_realign", 2, 4, 1, 20, KVP_ROPE_NEOX, 0,
     "policy=snapkv score=fixed budget=20 obs_window=6 pool=avg pool_kernel=5 recent=3 positions=realign", 90, 160, 14,
     true},
    {"fixed_pyramidkv_pool", 4, 4, 2, 16, KVP_ROPE_GPTJ, 0,
     "policy=pyramidkv score=fixed budget=40 obs_window=8 beta=4 capacity=52 total_capacity=128", 120, 150, 15, true},
    {"fixed_lethe", 3, 4, 2, 32, KVP_ROPE_GPTJ, 0,
     "policy=lethe score=fixed capacity=80 evict_threshold=20 sparse_ratio=3 segments=8 sinks=2", 30, 200, 16, true},
    {"fixed_lethe_realign_pool", 3, 4, 2, 16, KVP_ROPE_NEOX, 0,
     "policy=lethe score=fixed capacity=96 evict_threshold=24 sparse_ratio=2 positions=realign total_capacity=160", 40,
     200, 17, true},
};

struct RunResult {
    uint64_t hash = 0;
    bool ok = false;
    uint64_t prunes = 0;
};

RunResult run_workload(const Workload &w, uint32_t threads) {
    RunResult r;
    kvp_model m;
    std::memset(&m, 0, sizeof m);
    m.n_layers = w.n_layers;
    m.n_q_heads = w.n_q_heads;
    m.n_kv_heads = w.n_kv_heads;
    m.head_dim = w.head_dim;
    m.rope = w.rope;
    m.rope_dim = w.rope_dim;
    m.rope_theta = 10000.0f;

    kvp_config cfg;
    char err[256];
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, w.spec, err, sizeof err), KVP_OK) << w.spec << ": " << err;
    const std::string th = "threads=" + std::to_string(threads);
    EXPECT_EQ(kvp_config_apply(&cfg, th.c_str(), err, sizeof err), KVP_OK) << err;
    const size_t n = kvp_arena_size(&cfg);
    EXPECT_GT(n, 0u);
    if (n == 0) return r;
    std::vector<unsigned char> mem(n + 64);
    void *arena = mem.data() + (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64;
    kvp_cache *c = nullptr;
    EXPECT_EQ(kvp_create(&cfg, arena, n, &c), KVP_OK) << kvp_last_error(nullptr);
    if (!c) return r;

    const uint32_t qd = w.n_q_heads * w.head_dim, kd = w.n_kv_heads * w.head_dim;
    ref::Rng rng(w.seed);
    Fnv64 h;
    std::vector<float> q, k, v, out;
    std::vector<int32_t> pos(4096);
    bool ok = true;

    auto fill = [&](std::vector<float> &x, size_t len, float scale) {
        x.resize(len);
        for (auto &e : x) e = rng.grid(scale);
    };
    auto hash_state = [&]() {
        for (uint32_t l = 0; l < w.n_layers; ++l) {
            h.u32(kvp_layer_len(c, l));
            for (uint32_t kh = 0; kh < w.n_kv_heads; ++kh) {
                uint32_t np = 0;
                if (kvp_layer_positions(c, l, kh, pos.data(), static_cast<uint32_t>(pos.size()), &np) !=
                    KVP_OK) {
                    ok = false;
                    return;
                }
                h.u32(np);
                for (uint32_t i = 0; i < np; ++i) {
                    if (i > 0 && pos[i] <= pos[i - 1]) ok = false;
                    h.u32(static_cast<uint32_t>(pos[i]));
                }
            }
        }
    };
    auto hash_out = [&]() {
        if (w.decisions_only) return;
        for (float f : out) {
            if (!std::isfinite(f)) ok = false;
            h.f32(f);
        }
    };

    if (w.prefill_tokens > 0) {
        const uint32_t t = w.prefill_tokens;
        for (uint32_t l = 0; l < w.n_layers && ok; ++l) {
            fill(q, size_t(t) * qd, 1.0f);
            fill(k, size_t(t) * kd, 1.0f);
            fill(v, size_t(t) * kd, 2.0f);
            out.assign(size_t(t) * qd, 0.0f);
            const kvp_status s =
                kvp_prefill(c, l, t, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr);
            EXPECT_EQ(s, KVP_OK) << w.name << " prefill layer " << l << ": " << kvp_last_error(c);
            if (s != KVP_OK) ok = false;
            hash_out();
            if (w.decisions_only) hash_state();
        }
        hash_state();
    }
    for (uint32_t step = 0; step < w.decode_tokens && ok; ++step) {
        for (uint32_t l = 0; l < w.n_layers && ok; ++l) {
            fill(q, qd, 1.0f);
            fill(k, kd, 1.0f);
            fill(v, kd, 2.0f);
            out.assign(qd, 0.0f);
            const kvp_status s = kvp_decode(c, l, q.data(), k.data(), v.data(), out.data());
            EXPECT_EQ(s, KVP_OK) << w.name << " step " << step << " layer " << l << ": "
                                 << kvp_last_error(c);
            if (s != KVP_OK) ok = false;
            hash_out();
        }
        hash_state();
    }
    kvp_stats st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT_EQ(kvp_get_stats(c, &st), KVP_OK);
    h.u64(st.live_bytes);
    h.u64(st.peak_live_bytes);
    h.u64(st.tokens_seen);
    h.u64(st.prune_events);
    h.u64(st.tokens_evicted);
    EXPECT_EQ(st.tokens_seen, uint64_t(w.prefill_tokens) + w.decode_tokens) << w.name;
    kvp_destroy(c);
    r.hash = h.h;
    r.ok = ok;
    r.prunes = st.prune_events;
    return r;
}

std::string hex(uint64_t x) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
    return b;
}

TEST(DeterminismHash, DecodeWorkloads) {
    Fnv64 all;
    for (const Workload &w : kWorkloads) {
        const RunResult r1 = run_workload(w, 1);
        ASSERT_TRUE(r1.ok) << w.name;
        if (std::strncmp(w.name, "stream", 6) == 0) {
            EXPECT_GT(r1.prunes, 0u) << w.name << ": the workload is meant to prune";
        }
        // Bit-identical for every thread count (DESIGN: threads=1 gives the bits of threads=N).
        const RunResult r2 = run_workload(w, 2);
        ASSERT_TRUE(r2.ok) << w.name;
        EXPECT_EQ(hex(r1.hash), hex(r2.hash)) << w.name << ": threads=1 vs threads=2";
        std::printf("KVP_HASH %s %s\n", w.name, hex(r1.hash).c_str());
        all.u64(r1.hash);
    }
    std::printf("KVP_HASH all %s\n", hex(all.h).c_str());
    std::fflush(stdout);
    if (const char *want = std::getenv("KVP_EXPECT_HASH")) {
        if (*want) {
            EXPECT_EQ(std::string(want), hex(all.h));
        }
    }
}

// score=fixed: `KVP_HASH fixed <hex>` over the kept positions of every workload, which
// .ci/cross.sh requires to be equal on x86-64 (AVX2 and SIMDE_NO_NATIVE) and aarch64 (portable
// and native builds). Each workload must prune often, and threads 1 and 2 agree.
TEST(DeterminismHash, FixedScoringDecisions) {
    Fnv64 all;
    for (const Workload &w : kFixedWorkloads) {
        const RunResult r1 = run_workload(w, 1);
        ASSERT_TRUE(r1.ok) << w.name;
        EXPECT_GT(r1.prunes, 100u) << w.name << ": the workload is meant to prune often";
        for (uint32_t t : {2u}) {
            const RunResult r = run_workload(w, t);
            ASSERT_TRUE(r.ok) << w.name;
            EXPECT_EQ(hex(r1.hash), hex(r.hash)) << w.name << ": threads=1 vs threads=" << t;  // 3 threads: tests/test_snapkv.cpp, test_lethe.cpp
        }
        std::printf("KVP_HASH %s %s\n", w.name, hex(r1.hash).c_str());
        all.u64(r1.hash);
    }
    std::printf("KVP_HASH fixed %s\n", hex(all.h).c_str());
    std::fflush(stdout);
    if (const char *want = std::getenv("KVP_EXPECT_FIXED_HASH")) {
        if (*want) {
            EXPECT_EQ(std::string(want), hex(all.h));
        }
    }
}

// The hash itself: FNV-1a 64 test vectors, so that a broken hash cannot fake agreement.
TEST(DeterminismHash, Fnv1aVectors) {
    Fnv64 a;
    EXPECT_EQ(a.h, 0xcbf29ce484222325ull);
    a.bytes("a", 1);
    EXPECT_EQ(a.h, 0xaf63dc4c8601ec8cull);
    Fnv64 b;
    b.bytes("foobar", 6);
    EXPECT_EQ(b.h, 0x85944171f73967e8ull);
}

}  // namespace
