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

}  // namespace
