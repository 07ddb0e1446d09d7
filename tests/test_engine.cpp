// Issue 21's smaller engine rules. Pre-rotated inputs: rope=none with positions=realign is refused
// (the library cannot re-rotate keys it did not rotate), with a message that says why, by
// kvp_config_apply, kvp_config_check and kvp_create; positions=original and the policy default stay
// accepted; the config is unchanged after the refusal.
#include <gtest/gtest.h>
#include <string.h>

#include "reference.h"

namespace {

TEST(Engine, PreRotatedInputsRefuseRealign) {
    const kvp_model m = ref::model(2, 4, 2, 16, KVP_ROPE_NONE);
    char err[512];
    for (const char *policy : {"policy=streaming sinks=4 window=40", "policy=h2o budget=32 recent=4 capacity=40",
                               "policy=window window=40"}) {
        kvp_config cfg;
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        kvp_config before = cfg;
        const std::string spec = std::string(policy) + " positions=realign";
        EXPECT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_ERR_CONFIG) << spec;
        EXPECT_NE(strstr(err, "cannot re-rotate keys it did not rotate"), nullptr) << err;
        EXPECT_NE(strstr(err, "positions=original"), nullptr) << err;
        EXPECT_EQ(memcmp(&cfg, &before, sizeof cfg), 0) << spec;
        // set directly: kvp_config_check and kvp_create refuse it too
        ASSERT_EQ(kvp_config_apply(&cfg, policy, err, sizeof err), KVP_OK) << err;
        cfg.positions = KVP_POS_REALIGN;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
        EXPECT_EQ(kvp_arena_size(&cfg), 0u);
        kvp_cache *c = nullptr;
        EXPECT_EQ(kvp_create_ex(&cfg, nullptr, 0, &c, err, sizeof err), KVP_ERR_CONFIG);
        EXPECT_NE(strstr(err, "rope=none"), nullptr) << err;
        // original positions, and the policy's default, are fine
        cfg.positions = KVP_POS_ORIGINAL;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
        cfg.positions = KVP_POS_DEFAULT;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
    }
    // with RoPE parameters the library rotates: realign is accepted
    const kvp_model r = ref::model(2, 4, 2, 16, KVP_ROPE_NEOX);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &r), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=h2o budget=32 recent=4 capacity=40 positions=realign", err, sizeof err), KVP_OK)
        << err;
}

}  // namespace
