// The shared block pool (DESIGN.md "Shared block pool"; src/pool.h): where blocks sit never
// changes an output bit (block sizes, a shared pool that never runs dry and makes layers borrow
// from each other's homes), a dry pool makes the layer self-prune by its own ranking, `full`
// answers KVP_ERR_FULL with nothing changed, live bytes never exceed the pool, and the arena size
// is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "cache.h"
#include "reference.h"

namespace {

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

struct Workload {
    kvp_model m;
    uint32_t T;
    std::vector<float> q, k, v;
    uint32_t nq, nkv;
    explicit Workload(const kvp_model &mm, uint32_t tokens = 300, uint64_t seed = 3) : m(mm), T(tokens) {
        nq = m.n_q_heads * m.head_dim;
        nkv = m.n_kv_heads * m.head_dim;
        q.resize(size_t(T) * nq);
        k.resize(size_t(T) * nkv);
        v.resize(k.size());
        ref::Rng rng(seed);
        rng.fill(q, -2, 2);
        rng.fill(k, -2, 2);
        rng.fill(v);
    }
};

// Prefill `pre[l]` tokens into layer l (uneven, so layers fill their homes unevenly), then decode
// `steps` tokens into every layer; hashes every output and every kept position. Per-step hook.
uint64_t run(const Workload &w, const std::string &spec, const std::vector<uint32_t> &pre, uint32_t steps,
             const std::function<void(kvp_cache *)> &each = nullptr,
             const std::function<void(kvp_cache *)> &setup = nullptr) {
    ref::Cache c(w.m, spec);
    if (!c.c) return 0;
    if (setup) setup(c.c);
    uint64_t h = 0xcbf29ce484222325ull;
    std::vector<float> out(size_t(w.T) * w.nq);
    std::vector<uint32_t> fed(w.m.n_layers, 0);
    for (uint32_t l = 0; l < w.m.n_layers; ++l) {
        const uint32_t n = pre[l];
        EXPECT_EQ(kvp_prefill(c.c, l, n, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK)
            << spec << ": " << kvp_last_error(c.c);
        h = fnv(h, out.data(), size_t(n) * w.nq * sizeof(float));
        fed[l] = n;
    }
    for (uint32_t s = 0; s < steps; ++s) {
        for (uint32_t l = 0; l < w.m.n_layers; ++l) {
            const uint32_t t = fed[l]++;
            const kvp_status st = kvp_decode(c.c, l, &w.q[size_t(t) * w.nq], &w.k[size_t(t) * w.nkv],
                                             &w.v[size_t(t) * w.nkv], out.data());
            EXPECT_EQ(st, KVP_OK) << spec << " step " << s << " layer " << l << ": " << kvp_last_error(c.c);
            if (st != KVP_OK) return 0;
            h = fnv(h, out.data(), size_t(w.nq) * sizeof(float));
            for (uint32_t kh = 0; kh < w.m.n_kv_heads; ++kh) {
                const std::vector<int32_t> p = c.positions(l, kh);
                h = fnv(h, p.data(), p.size() * sizeof(int32_t));
            }
        }
        if (each) each(c.c);
    }
    return h;
}

const char *const kPolicies[] = {
    "policy=full capacity=200",
    "policy=window window=45",
    "policy=streaming sinks=3 window=30 compress_every=5 slack=4 max_drop=3",
    "policy=h2o budget=40 recent=6 capacity=90",
    "policy=h2o budget=40 recent=6 capacity=90 positions=realign",
};

TEST(Pool, BlockSizeNeverChangesABit) {
    const Workload w(ref::model(3, 4, 2, 20, KVP_ROPE_GPTJ));
    const std::vector<uint32_t> pre = {30, 12, 25};  // within every policy's capacity
    for (const char *p : kPolicies) {
        const uint64_t h16 = run(w, p, pre, 100);
        for (const char *b : {" block=1", " block=7", " block=64", " block=4096"})
            EXPECT_EQ(run(w, std::string(p) + b, pre, 100), h16) << p << b;
    }
}

// Evicted slots are marked dead and compacted later (storage.h, hole_cap): outputs and positions
// are bit-identical to compacting at every eviction.
TEST(Pool, DeferredCompactionNeverChangesABit) {
    const Workload w(ref::model(2, 4, 2, 24, KVP_ROPE_GPTJ), 600);
    const std::vector<uint32_t> pre = {100, 60};
    int holes_seen = 0;
    auto watch = [&](kvp_cache *c) {
        for (uint32_t l = 0; l < 2; ++l)
            for (uint32_t h = 0; h < 2; ++h) holes_seen += kvp::head_of(c, l, h).holes > 0;
    };
    auto at_once = [](kvp_cache *c) {
        for (uint32_t l = 0; l < 2; ++l)
            for (uint32_t h = 0; h < 2; ++h) kvp::head_of(c, l, h).hole_cap = 0;
    };
    for (const char *pos : {"original", "realign"}) {
        const std::string spec = std::string("policy=h2o budget=200 recent=8 capacity=260 positions=") + pos;
        ref::Cache probe(w.m, spec);
        ASSERT_EQ(kvp::head_of(probe.c, 0, 0).hole_cap, 260u / 32);
        const uint64_t deferred = run(w, spec, pre, 400, watch);
        EXPECT_EQ(run(w, spec, pre, 400, nullptr, at_once), deferred) << pos;
    }
    EXPECT_GT(holes_seen, 100);  // the deferred runs really read around dead slots
}

// A shared pool (total_capacity below the sum of capacities) that never runs dry: layer 0 holds
// more than its home and borrows other homes' blocks; outputs and positions are bit-identical.
TEST(Pool, SharedPoolThatNeverRunsDryGivesIdenticalBits) {
    const Workload w(ref::model(4, 4, 2, 16, KVP_ROPE_GPTJ));
    const std::vector<uint32_t> pre = {60, 8, 8, 8};
    const std::string base = "policy=full capacity=100";
    bool borrowed = false;
    auto look = [&](kvp_cache *c) {  // a block of layer 0 outside its home range
        const kvp::HeadStore &hs = kvp::head_of(c, 0, 1);
        for (uint32_t b = 0; b < hs.nb; ++b)
            if (hs.blk[(hs.bhead + b) % hs.blk_cap] >= c->pools[1].home_lo[1]) borrowed = true;
    };
    const uint64_t h = run(w, base, pre, 8);
    // 4 x 7 = 28 blocks by default; 10 blocks (160 slots): homes of 2-3 blocks; layer 0 ends at
    // 68 tokens (5 blocks), the others at 16 (1 block each): 8 blocks, never dry
    EXPECT_EQ(run(w, base + " total_capacity=160", pre, 8, look), h);
    EXPECT_TRUE(borrowed);
    // window and streaming rings and h2o compaction in a shared pool with room to spare
    const std::vector<uint32_t> even = {20, 20, 20, 20};
    for (const char *p : {"policy=window window=30", "policy=h2o budget=20 recent=4 capacity=40"}) {
        const uint64_t hp = run(w, p, even, 80);
        EXPECT_EQ(run(w, std::string(p) + " total_capacity=140", even, 80), hp) << p;
    }
}

uint64_t pool_bytes_cap(kvp_cache *c) {  // tokens the pools can hold x bytes per token, all heads
    return uint64_t(c->plan.nblocks) * c->plan.block * c->cfg.model.n_kv_heads * kvp::token_bytes(c);
}

// A pool that runs dry: each layer frees room by its own ranking, every call succeeds, and the
// live bytes stay within the pool at every step.
TEST(Pool, DryPoolMakesTheLayerSelfPrune) {
    const Workload w(ref::model(4, 4, 2, 16, KVP_ROPE_GPTJ), 400);
    const std::vector<uint32_t> pre = {30, 30, 30, 30};
    // h2o: budget 64 per layer would need 4 x 5 blocks per head; the pool has 10
    {
        ref::Cache c(w.m, "policy=h2o budget=64 recent=8 total_capacity=160");
        ASSERT_NE(c.c, nullptr);
        std::vector<float> out(size_t(64) * w.nq);
        kvp_stats s;
        s.struct_size = sizeof s;
        for (uint32_t l = 0; l < 4; ++l)
            ASSERT_EQ(kvp_prefill(c.c, l, 30, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK);
        for (uint32_t t = 30; t < 300; ++t) {
            for (uint32_t l = 0; l < 4; ++l) {
                ASSERT_EQ(kvp_decode(c.c, l, &w.q[size_t(t) * w.nq], &w.k[size_t(t) * w.nkv], &w.v[size_t(t) * w.nkv],
                                     out.data()),
                          KVP_OK)
                    << kvp_last_error(c.c);
                for (float x : std::vector<float>(out.begin(), out.begin() + w.nq)) ASSERT_TRUE(std::isfinite(x));
                for (uint32_t kh = 0; kh < 2; ++kh) {
                    const std::vector<int32_t> p = c.positions(l, kh);
                    ASSERT_TRUE(std::is_sorted(p.begin(), p.end()));
                    // h2o's own ranking never evicts the recent tokens
                    ASSERT_GE(p.size(), 8u);
                    for (uint32_t r = 0; r < 8; ++r) ASSERT_EQ(p[p.size() - 1 - r], int32_t(t - r));
                }
            }
            ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
            ASSERT_LE(s.live_bytes, pool_bytes_cap(c.c));
            ASSERT_LE(s.peak_live_bytes, pool_bytes_cap(c.c));
        }
        // every layer got its share and stayed below budget: the pool, not the budget, bound it
        uint32_t total = 0;
        for (uint32_t l = 0; l < 4; ++l) {
            EXPECT_LT(kvp_layer_len(c.c, l), 64u);
            EXPECT_GE(kvp_layer_len(c.c, l), 16u);
            total += kvp_layer_len(c.c, l);
        }
        EXPECT_LE(total, 160u);
        EXPECT_GT(s.prune_events, 0u);
    }
    // streaming: the oldest window tokens go first; the sinks stay; the window stays contiguous
    {
        ref::Cache c(w.m, "policy=streaming sinks=4 window=60 compress_every=8 total_capacity=180");
        std::vector<float> out(w.nq);
        kvp_stats s;
        s.struct_size = sizeof s;
        for (uint32_t t = 0; t < 400; ++t) {
            for (uint32_t l = 0; l < 4; ++l) {
                ASSERT_EQ(kvp_decode(c.c, l, &w.q[size_t(t) * w.nq], &w.k[size_t(t) * w.nkv], &w.v[size_t(t) * w.nkv],
                                     out.data()),
                          KVP_OK)
                    << kvp_last_error(c.c);
                const std::vector<int32_t> p = c.positions(l, 0);
                for (int32_t i = 0; i < 4 && i <= int32_t(t); ++i) ASSERT_EQ(p[i], i);
                for (size_t i = 5; i < p.size(); ++i) ASSERT_EQ(p[i], p[i - 1] + 1);
                ASSERT_EQ(p.back(), int32_t(t));
            }
            ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
            ASSERT_LE(s.live_bytes, pool_bytes_cap(c.c));
        }
        EXPECT_LT(kvp_layer_len(c.c, 3), 64u);  // 180 slots for 4 layers of up to 72
    }
}

// `full` cannot evict: when its pool is dry the call fails with KVP_ERR_FULL, names the pool, and
// the cache behaves afterwards exactly like a twin that never saw the call.
TEST(Pool, FullPolicyWithDryPoolFailsWithNothingChanged) {
    const Workload w(ref::model(2, 2, 1, 16, KVP_ROPE_GPTJ), 100);
    ref::Cache c(w.m, "policy=full capacity=64 total_capacity=80"), twin(w.m, "policy=full capacity=64 total_capacity=80");
    std::vector<float> out(size_t(64) * w.nq), out2(out.size());
    ASSERT_EQ(kvp_prefill(c.c, 0, 60, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(twin.c, 0, 60, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK);
    // layer 0 holds 4 blocks, the pool has 5 and layer 1 has its reservation of 1: 17 tokens fit
    // neither now nor ever (layer 0 may take 0 more blocks beyond 4 + ... the 5th is reserved)
    EXPECT_EQ(kvp_prefill(c.c, 1, 20, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(c.c), "total_capacity"), nullptr) << kvp_last_error(c.c);
    EXPECT_EQ(kvp_layer_len(c.c, 1), 0u);
    // the same calls that do fit give the same bits as on the twin
    ASSERT_EQ(kvp_prefill(c.c, 1, 16, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(twin.c, 1, 16, nullptr, w.q.data(), w.k.data(), w.v.data(), out2.data(), nullptr), KVP_OK);
    EXPECT_EQ(memcmp(out.data(), out2.data(), size_t(16) * w.nq * sizeof(float)), 0);
    for (uint32_t t = 60; t < 64; ++t) {
        ASSERT_EQ(kvp_decode(c.c, 0, &w.q[t * w.nq], &w.k[t * w.nkv], &w.v[t * w.nkv], out.data()), KVP_OK);
        ASSERT_EQ(kvp_decode(twin.c, 0, &w.q[t * w.nq], &w.k[t * w.nkv], &w.v[t * w.nkv], out2.data()), KVP_OK);
        EXPECT_EQ(memcmp(out.data(), out2.data(), size_t(w.nq) * sizeof(float)), 0);
    }
    // layer 0 at 64 tokens = 4 blocks; layer 1 holds 1; the pool's 5 blocks are all taken
    EXPECT_EQ(kvp_decode(c.c, 1, w.q.data(), w.k.data(), w.v.data(), out.data()), KVP_ERR_FULL);
    EXPECT_EQ(kvp_layer_len(c.c, 1), 16u);
}

// kvp_arena_size is exact: create fails one byte short and succeeds with exactly it; the pool
// part grows by exactly the bytes of the blocks added, for several geometries and block sizes.
TEST(Pool, ArenaSizeIsExact) {
    struct G {
        uint32_t L, nq, nkv, hd;
        const char *spec;
    } geoms[] = {{1, 1, 1, 8, "policy=full capacity=1000"},
                 {3, 8, 2, 40, "policy=h2o budget=300 recent=5"},
                 {6, 4, 2, 32, "policy=streaming sinks=4 window=100 compress_every=16"},
                 {2, 12, 4, 128, "policy=window window=300 threads=2"}};
    int diffs_checked = 0;
    for (const G &g : geoms) {
        for (uint32_t block : {16u, 32u}) {
            const kvp_model m = ref::model(g.L, g.nq, g.nkv, g.hd, KVP_ROPE_NONE);
            kvp_config cfg;
            ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
            char err[256];
            const std::string spec = std::string(g.spec) + " block=" + std::to_string(block);
            ASSERT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << err;
            const size_t n = kvp_arena_size(&cfg);
            ASSERT_GT(n, 0u);
            std::vector<char> mem(n + 64);
            char *a = mem.data() + (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64;
            kvp_cache *c = nullptr;
            EXPECT_EQ(kvp_create(&cfg, a, n - 1, &c), KVP_ERR_ARENA) << spec;
            ASSERT_EQ(kvp_create(&cfg, a, n, &c), KVP_OK) << spec;
            const uint64_t sum_cap = c->plan.sum_cap;
            const uint32_t stride = (g.hd + 15) / 16 * 16;
            kvp_destroy(c);
            // 16 blocks fewer per pool: K+V rows, pos/rot/score (64-byte multiples for these
            // block sizes) and 4 B each of free-list link, dead count and sequence number per block, times
            // the KV heads
            if (sum_cap <= 1 + 16 * uint64_t(block)) continue;
            kvp_config a1 = cfg, a2 = cfg;
            a1.total_capacity = uint32_t(sum_cap - 1);
            const size_t s1 = kvp_arena_size(&a1);
            ASSERT_GT(s1, 0u) << spec;
            a2.total_capacity = uint32_t(sum_cap - 1 - 16 * block);
            const size_t s2 = kvp_arena_size(&a2);
            if (s2 == 0) continue;  // below the layers' reservations for this geometry
            const size_t per_block = size_t(block) * (2 * stride * 4 + 12) + 12;
            EXPECT_EQ(s1 - s2, 16 * per_block * g.nkv) << spec;
            ++diffs_checked;
            // at or above the sum of capacities there is no sharing: the default arena
            a1.total_capacity = uint32_t(sum_cap);
            EXPECT_EQ(kvp_arena_size(&a1), n) << spec;
            a1.total_capacity = uint32_t(sum_cap * 3);
            EXPECT_EQ(kvp_arena_size(&a1), n) << spec;
        }
    }
    EXPECT_GE(diffs_checked, 7);  // streaming x block 32 is below its reservations at -16 blocks
}

// The reservation: a layer may never take the last blocks another layer needs to make progress
// (one block each here), so a layer that holds nothing can always start.
TEST(Pool, ReservationKeepsABlockForEveryLayer) {
    const Workload w(ref::model(2, 2, 1, 16, KVP_ROPE_GPTJ), 120);
    ref::Cache c(w.m, "policy=h2o budget=100 recent=4 total_capacity=96");  // 6 blocks for 2 layers
    std::vector<float> out(size_t(100) * w.nq);
    EXPECT_EQ(kvp_prefill(c.c, 0, 90, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_ERR_FULL);
    EXPECT_EQ(kvp_layer_len(c.c, 0), 0u);
    ASSERT_EQ(kvp_prefill(c.c, 0, 80, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK);
    for (uint32_t t = 0; t < 40; ++t) {  // layer 1 starts from nothing and grows by self-pruning layer... itself
        ASSERT_EQ(kvp_decode(c.c, 1, &w.q[t * w.nq], &w.k[t * w.nkv], &w.v[t * w.nkv], out.data()), KVP_OK)
            << kvp_last_error(c.c);
        ASSERT_EQ(kvp_decode(c.c, 0, &w.q[(80 + t) * w.nq], &w.k[(80 + t) * w.nkv], &w.v[(80 + t) * w.nkv], out.data()),
                  KVP_OK)
            << kvp_last_error(c.c);
    }
    EXPECT_EQ(kvp_layer_len(c.c, 1), 16u);  // its one reserved block: the pool never gave it more
    EXPECT_EQ(kvp_layer_len(c.c, 0), 80u);  // layer 0 kept its 5 blocks, self-pruning at 80
}

// kvp_prefill_room: without sharing it is min(capacity - len). With a shared pool a chunk of that
// size always goes through every layer in turn (also once the pool is dry and layers must
// self-prune), and on an empty cache it is tight: one token more fails (checked on a twin).
TEST(Pool, PrefillRoomIsTheLargestChunkEveryLayerTakes) {
    const Workload w(ref::model(3, 2, 1, 16, KVP_ROPE_GPTJ), 1200);
    std::vector<float> out(size_t(400) * w.nq);
    {
        ref::Cache c(w.m, "policy=full capacity=100");
        EXPECT_EQ(kvp_prefill_room(c.c), 100u);
        ASSERT_EQ(kvp_prefill(c.c, 1, 30, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(kvp_prefill_room(c.c), 70u);
        EXPECT_EQ(kvp_prefill_room(nullptr), 0u);
    }
    for (const char *spec : {"policy=streaming sinks=4 window=200 compress_every=0 capacity=260 total_capacity=400",
                             "policy=h2o budget=150 recent=8 capacity=300 total_capacity=300"}) {
        ref::Cache c(w.m, spec);
        const uint32_t r0 = kvp_prefill_room(c.c);
        ASSERT_GT(r0, 0u) << spec;
        ASSERT_LT(r0, 250u) << spec;  // the pool, not the capacity, bounds it
        {
            ref::Cache twin(w.m, spec);
            bool failed = false;
            for (uint32_t l = 0; l < 3 && !failed; ++l)
                failed = kvp_prefill(twin.c, l, r0 + 1, nullptr, w.q.data(), w.k.data(), w.v.data(), out.data(), nullptr) != KVP_OK;
            EXPECT_TRUE(failed) << spec << " room " << r0;
        }
        uint32_t fed = 0;
        for (int round = 0; round < 6; ++round) {
            const uint32_t r = kvp_prefill_room(c.c);
            ASSERT_GT(r, 0u) << spec << " round " << round;
            for (uint32_t l = 0; l < 3; ++l)
                ASSERT_EQ(kvp_prefill(c.c, l, r, nullptr, &w.q[fed * w.nq], &w.k[fed * w.nkv], &w.v[fed * w.nkv],
                                      out.data(), nullptr),
                          KVP_OK)
                    << spec << " round " << round << " layer " << l << ": " << kvp_last_error(c.c);
            fed += r;
        }
    }
}

TEST(Pool, TotalCapacityBelowTheReservationsIsAConfigError) {
    const kvp_model m = ref::model(8, 4, 2, 16);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256];
    // each layer needs its 2 sink blocks + 1 window block = 3 x 8 = 24 blocks; 200 slots = 13
    // (kvp_config_apply checks the result, so it refuses the spec; set directly, check refuses it)
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=streaming sinks=20 window=100 total_capacity=200", err, sizeof err),
              KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "total_capacity"), nullptr) << err;
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=streaming sinks=20 window=100", err, sizeof err), KVP_OK) << err;
    cfg.total_capacity = 200;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "total_capacity"), nullptr) << err;
    EXPECT_EQ(kvp_arena_size(&cfg), 0u);
    cfg.total_capacity = 24 * 16;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
}

}  // namespace
