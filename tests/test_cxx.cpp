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
