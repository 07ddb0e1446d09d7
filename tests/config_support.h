// Test support: the check every policy's bad-key test makes of one rejected spec.
#pragma once
#include <gtest/gtest.h>
#include <kvprune/kvprune.h>
#include <string.h>

namespace ref {

// `spec` applied to a copy of `cfg` must fail with KVP_ERR_CONFIG and a message holding
// `needle`: either kvp_config_apply refuses it and leaves the copy byte for byte as it was
// (all or nothing), or it applies and kvp_config_check refuses it, with kvp_arena_size 0.
inline void expect_config_rejected(const kvp_config &cfg, const char *spec, const char *needle) {
    char err[256] = {0};
    kvp_config c2 = cfg;
    kvp_status st = kvp_config_apply(&c2, spec, err, sizeof err);
    if (st != KVP_OK) {
        EXPECT_EQ(memcmp(&c2, &cfg, sizeof cfg), 0) << spec;
    } else {
        st = kvp_config_check(&c2, err, sizeof err);
        EXPECT_EQ(kvp_arena_size(&c2), 0u) << spec;
    }
    EXPECT_EQ(st, KVP_ERR_CONFIG) << spec;
    EXPECT_NE(strstr(err, needle), nullptr) << spec << " -> " << err;
}

}  // namespace ref
