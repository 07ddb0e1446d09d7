// The C++ RAII header: config errors surface as statuses and messages, the cache owns its
// arena, and it decodes like the C API.
#include <gtest/gtest.h>
#include <kvprune/kvprune.hpp>
#include <string.h>

#include <utility>
#include <vector>

TEST(Cxx, ConfigAndCacheLifecycle) {
    const kvp_model m = {1, 4, 2, 16, KVP_ROPE_NEOX, 0, 10000.0f};
    kvprune::Config cfg(m);
    ASSERT_EQ(cfg.status(), KVP_OK);
    EXPECT_EQ(cfg.apply("policy=streaming sinks=1 window=7 bogus=3"), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(cfg.error(), "bogus"), nullptr);
    ASSERT_EQ(cfg.apply("policy=streaming sinks=1 window=7"), KVP_OK);
    EXPECT_EQ(cfg.check(), KVP_OK);
    kvprune::Cache cache;
    EXPECT_FALSE(cache);
    ASSERT_EQ(cache.create(cfg.get()), KVP_OK);
    std::vector<float> q(64, 0.1f), kv(32, 0.2f), out(64);
    for (int t = 0; t < 20; ++t) ASSERT_EQ(cache.decode(0, q.data(), kv.data(), kv.data(), out.data()), KVP_OK);
    EXPECT_EQ(cache.layer_len(0), 8u);
    EXPECT_EQ(cache.decode(3, q.data(), kv.data(), kv.data(), out.data()), KVP_ERR_LAYER);
    EXPECT_NE(strstr(cache.last_error(), "layer 3"), nullptr);
    kvprune::Cache moved = std::move(cache);
    kvp_stats s;
    ASSERT_EQ(moved.stats(&s), KVP_OK);
    EXPECT_EQ(s.tokens_seen, 20u);

    kvprune::Config bad(m);
    EXPECT_EQ(bad.apply("policy=window window=9 capacity=4"), KVP_ERR_CONFIG);  // apply checks the result
    EXPECT_NE(strstr(bad.error(), "capacity"), nullptr) << bad.error();
    ASSERT_EQ(bad.apply("policy=window window=9"), KVP_OK);
    bad.get().capacity = 4;  // a contradiction set directly is found by check
    EXPECT_EQ(bad.check(), KVP_ERR_CONFIG);
    kvprune::Cache none;
    EXPECT_EQ(none.create(bad.get()), KVP_ERR_CONFIG);
    EXPECT_FALSE(none);
}

// An arena of 2 MiB or more is allocated in whole 2 MiB pages on 2 MiB boundaries and advised
// for huge pages (kvp_arena_advise) before create writes it: it decodes as a small one does (no
// token is evicted in either).
TEST(Cxx, HugePageArena) {
    const kvp_model m = {2, 4, 2, 16, KVP_ROPE_NEOX, 0, 10000.0f};
    kvprune::Config big(m), small(m);
    ASSERT_EQ(big.apply("policy=window window=20000"), KVP_OK);
    ASSERT_EQ(small.apply("policy=window window=64"), KVP_OK);
    ASSERT_GE(kvp_arena_size(&big.get()), size_t(2) << 20);
    kvprune::Cache a, b;
    ASSERT_EQ(a.create(big.get()), KVP_OK);
    ASSERT_EQ(b.create(small.get()), KVP_OK);
    std::vector<float> q(64), k(32), v(32), oa(64), ob(64);
    for (int t = 0; t < 20; ++t)
        for (uint32_t l = 0; l < 2; ++l) {
            for (size_t i = 0; i < q.size(); ++i) q[i] = float((t * 7 + i * 3 + l) % 17) / 17.0f - 0.5f;
            for (size_t i = 0; i < k.size(); ++i) k[i] = float((t * 5 + i * 11 + l) % 13) / 13.0f - 0.5f, v[i] = float((t + i) % 19) / 19.0f;
            ASSERT_EQ(a.decode(l, q.data(), k.data(), v.data(), oa.data()), KVP_OK);
            ASSERT_EQ(b.decode(l, q.data(), k.data(), v.data(), ob.data()), KVP_OK);
            ASSERT_EQ(memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)), 0) << t << " " << l;
        }
}

// Issue 11: move assignment onto a live cache freed the arena before destroying the handle that
// lives in it (use after free under ASan); a failed create() lost the old cache.
TEST(Cxx, MoveAssignmentOntoALiveCache) {
    const kvp_model m = {2, 4, 2, 16, KVP_ROPE_NEOX, 0, 10000.0f};
    kvprune::Config cfg(m);
    ASSERT_EQ(cfg.apply("policy=window window=8"), KVP_OK);
    std::vector<float> q(64, 0.1f), kv(32, 0.2f), out(64);
    kvprune::Cache a, b;
    ASSERT_EQ(a.create(cfg.get()), KVP_OK);
    ASSERT_EQ(b.create(cfg.get()), KVP_OK);
    for (int t = 0; t < 3; ++t) ASSERT_EQ(b.decode(0, q.data(), kv.data(), kv.data(), out.data()), KVP_OK);
    a = std::move(b);  // destroys a's cache (handle, then arena), takes b's
    EXPECT_FALSE(b);
    ASSERT_TRUE(a);
    EXPECT_EQ(a.layer_len(0), 3u);
    ASSERT_EQ(a.decode(0, q.data(), kv.data(), kv.data(), out.data()), KVP_OK);
    kvprune::Cache &self = a;
    a = std::move(self);  // self-move keeps the cache
    ASSERT_TRUE(a);
    EXPECT_EQ(a.layer_len(0), 4u);
    kvprune::Cache c(std::move(a));
    EXPECT_EQ(c.layer_len(0), 4u);
    c = kvprune::Cache();  // move-assign an empty cache: releases it
    EXPECT_FALSE(c);
}

TEST(Cxx, FailedCreateKeepsTheOldCache) {
    const kvp_model m = {1, 4, 2, 16, KVP_ROPE_NEOX, 0, 10000.0f};
    kvprune::Config good(m), bad(m);
    ASSERT_EQ(good.apply("policy=window window=8"), KVP_OK);
    ASSERT_EQ(bad.apply("policy=window window=8"), KVP_OK);
    bad.get().capacity = 3;  // contradiction
    kvprune::Cache cache;
    ASSERT_EQ(cache.create(good.get()), KVP_OK);
    EXPECT_STREQ(cache.create_error(), "");
    std::vector<float> q(64, 0.1f), kv(32, 0.2f), out(64);
    for (int t = 0; t < 5; ++t) ASSERT_EQ(cache.decode(0, q.data(), kv.data(), kv.data(), out.data()), KVP_OK);
    kvp_cache *before = cache.get();
    EXPECT_EQ(cache.create(bad.get()), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(cache.create_error(), "capacity"), nullptr) << cache.create_error();
    EXPECT_EQ(cache.get(), before);
    EXPECT_EQ(cache.layer_len(0), 5u);
    ASSERT_EQ(cache.decode(0, q.data(), kv.data(), kv.data(), out.data()), KVP_OK);
    kvp_config wrong = good.get();
    wrong.struct_size = 3;
    EXPECT_EQ(cache.create(wrong), KVP_ERR_ARG);
    EXPECT_EQ(cache.layer_len(0), 6u);
    ASSERT_EQ(cache.create(good.get()), KVP_OK);  // success replaces it
    EXPECT_EQ(cache.layer_len(0), 0u);
}

// Half-precision rows through the wrapper (kvp_*_ex): the same cache state and the rounded
// outputs of the f32 calls on the widened inputs (1.0, 0.5 and -0.5 are exact in f16).
TEST(Cxx, HalfRows) {
    const kvp_model m = {1, 4, 2, 16, KVP_ROPE_NEOX, 0, 10000.0f};
    kvprune::Config cfg(m);
    ASSERT_EQ(cfg.apply("policy=window window=8"), KVP_OK);
    kvprune::Cache a, b;
    ASSERT_EQ(a.create(cfg.get()), KVP_OK);
    ASSERT_EQ(b.create(cfg.get()), KVP_OK);
    std::vector<uint16_t> hq(3 * 64, 0x3c00), hk(3 * 32, 0x3800), hv(3 * 32, 0xb800), ho(3 * 64);
    std::vector<float> q(3 * 64, 1.0f), k(3 * 32, 0.5f), v(3 * 32, -0.5f), out(3 * 64);
    ASSERT_EQ(a.prefill(0, 2, nullptr, KVP_IO_F16, hq.data(), hk.data(), hv.data(), ho.data()), KVP_OK) << a.last_error();
    ASSERT_EQ(b.prefill(0, 2, nullptr, q.data(), k.data(), v.data(), out.data()), KVP_OK);
    ASSERT_EQ(a.append(0, 1, nullptr, KVP_IO_F16, hk.data(), hv.data()), KVP_OK);
    ASSERT_EQ(b.append(0, 1, nullptr, k.data(), v.data()), KVP_OK);
    ASSERT_EQ(a.decode(0, KVP_IO_F16, hq.data(), hk.data(), hv.data(), ho.data()), KVP_OK);
    ASSERT_EQ(b.decode(0, q.data(), k.data(), v.data(), out.data()), KVP_OK);
    EXPECT_EQ(out[0], -0.5f);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(ho[i], 0xb800) << i;  // -0.5 as f16
    hk[3] = 0x7c00;  // Inf
    EXPECT_EQ(a.decode(0, KVP_IO_F16, hq.data(), hk.data(), hv.data(), ho.data()), KVP_ERR_NONFINITE);
    EXPECT_EQ(a.layer_len(0), b.layer_len(0));
}

// set_parallel hands the cache's parallel part to a host function (thread_pool=host), NULL
// restores the default; an empty Cache answers KVP_ERR_ARG.
namespace {
void count_and_run(void *user, uint32_t n, void (*task)(void *, uint32_t), void *arg) {
    ++*static_cast<int *>(user);
    for (uint32_t t = 0; t < n; ++t) task(arg, t);
}
}  // namespace

TEST(Cxx, SetParallel) {
    setenv("KVP_PAR_WORK", "0", 1);  // read at create: every call uses all its threads
    const kvp_model m = {2, 4, 2, 32, KVP_ROPE_NONE, 0, 10000.0f};
    kvprune::Config cfg(m);
    ASSERT_EQ(cfg.apply("policy=full capacity=64 threads=3 thread_pool=host"), KVP_OK) << cfg.error();
    kvprune::Cache cache;
    ASSERT_EQ(cache.create(cfg.get()), KVP_OK);
    unsetenv("KVP_PAR_WORK");
    int calls = 0;
#if !KVP_THREADS
    EXPECT_EQ(cache.set_parallel(count_and_run, &calls), KVP_ERR_UNSUPPORTED);
    return;
#endif
    ASSERT_EQ(cache.set_parallel(count_and_run, &calls), KVP_OK);
    std::vector<float> q(24 * 4 * 32, 0.1f), kv(24 * 2 * 32, 0.2f), out(q.size());
    ASSERT_EQ(cache.prefill(0, 24, nullptr, q.data(), kv.data(), kv.data(), out.data()), KVP_OK) << cache.last_error();
    EXPECT_GT(calls, 0);
    const int before = calls;
    ASSERT_EQ(cache.set_parallel(nullptr, nullptr), KVP_OK);
    ASSERT_EQ(cache.prefill(1, 24, nullptr, q.data(), kv.data(), kv.data(), out.data()), KVP_OK) << cache.last_error();
    EXPECT_EQ(calls, before);
    EXPECT_EQ(kvprune::Cache{}.set_parallel(count_and_run, &calls), KVP_ERR_ARG);
}
