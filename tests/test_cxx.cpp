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
    ASSERT_EQ(bad.apply("policy=window window=9 capacity=4"), KVP_OK);  // contradiction found at check
    EXPECT_EQ(bad.check(), KVP_ERR_CONFIG);
    kvprune::Cache none;
    EXPECT_EQ(none.create(bad.get()), KVP_ERR_CONFIG);
    EXPECT_FALSE(none);
}
