// Issue 21's smaller engine rules. Attention scale: attn_scale=x makes the logits q.k * x in every
// kernel variant (KVP_KERNEL=scalar|simde|avx2|avx512), against a double reference with that scale;
// formatted storage and fixed-point scoring take it too (against the same cache fed q scaled by
// x*sqrt(head_dim) with the default scale). Pre-rotated inputs: rope=none with positions=realign is refused
// (the library cannot re-rotate keys it did not rotate), with a message that says why, by
// kvp_config_apply, kvp_config_check and kvp_create; positions=original and the policy default stay
// accepted; the config is unchanged after the refusal.
#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

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

// Double reference: attention of token t's query heads over tokens 0..t with logit scale `scale`.
std::vector<double> reference(const kvp_model &m, const ref::Inputs &in, uint32_t t, double scale, double cap = 0) {
    const uint32_t hd = m.head_dim, G = m.n_q_heads / m.n_kv_heads;
    std::vector<double> out(size_t(m.n_q_heads) * hd, 0.0);
    for (uint32_t h = 0; h < m.n_q_heads; ++h) {
        const uint32_t kvh = h / G;
        std::vector<double> qr(in.qt(t) + h * hd, in.qt(t) + (h + 1) * hd);
        ref::rotate(m, qr, t);
        std::vector<double> lg(t + 1);
        double mx = -INFINITY;
        for (uint32_t j = 0; j <= t; ++j) {
            std::vector<double> kk(in.kt(j) + kvh * hd, in.kt(j) + (kvh + 1) * hd);
            ref::rotate(m, kk, j);
            double d = 0;
            for (uint32_t i = 0; i < hd; ++i) d += qr[i] * kk[i];
            lg[j] = d * scale;
            if (cap > 0) lg[j] = cap * tanh(lg[j] / cap);
            mx = std::max(mx, lg[j]);
        }
        double sum = 0;
        for (double &l : lg) sum += (l = exp(l - mx));
        for (uint32_t j = 0; j <= t; ++j)
            for (uint32_t i = 0; i < hd; ++i) out[size_t(h) * hd + i] += lg[j] / sum * in.vt(j)[kvh * hd + i];
    }
    return out;
}

TEST(Engine, AttnScaleInEveryKernelVariant) {
    const kvp_model m = ref::model(1, 8, 2, 64, KVP_ROPE_NEOX);
    const uint32_t T = 300;  // decode steps past one split-K chunk and one prefill key block
    ref::Inputs in(m, T, 21, 2.0f);
    const float scale = 0.0625f;  // Gemma-style 1/sqrt(256) at head_dim 64
    for (const char *kern : {"scalar", "simde", "avx2", "avx512"}) {
        setenv("KVP_KERNEL", kern, 1);
        ref::Cache c(m, "policy=full capacity=320 attn_scale=0.0625");
        ASSERT_TRUE(c.c);
        std::vector<float> out(size_t(m.n_q_heads) * m.head_dim), pre(size_t(32) * m.n_q_heads * m.head_dim);
        ASSERT_EQ(kvp_prefill(c.c, 0, 32, nullptr, in.qt(0), in.kt(0), in.vt(0), pre.data(), nullptr), KVP_OK);
        double worst = 0;
        for (uint32_t t = 0; t < 32; ++t) {
            const std::vector<double> r = reference(m, in, t, scale);
            for (size_t i = 0; i < r.size(); ++i) worst = std::max(worst, fabs(r[i] - pre[size_t(t) * r.size() + i]));
        }
        for (uint32_t t = 32; t < T; ++t) {
            ASSERT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
            if (t % 37 && t != T - 1) continue;
            const std::vector<double> r = reference(m, in, t, scale);
            for (size_t i = 0; i < r.size(); ++i) worst = std::max(worst, fabs(r[i] - out[i]));
        }
        EXPECT_LT(worst, 2e-5) << kern;
        // and the default scale differs from it (the key is not ignored)
        const std::vector<double> dflt = reference(m, in, T - 1, 1.0 / 8.0);
        double apart = 0;
        for (size_t i = 0; i < dflt.size(); ++i) apart = std::max(apart, fabs(dflt[i] - out[i]));
        EXPECT_GT(apart, 1e-3) << kern;
    }
    unsetenv("KVP_KERNEL");
}

// Formatted storage and fixed-point scoring: a cache with attn_scale=x against one with the default
// scale fed q * x * sqrt(head_dim) (the same logits up to rounding).
TEST(Engine, AttnScaleFormattedAndFixed) {
    const kvp_model m = ref::model(2, 4, 2, 32, KVP_ROPE_GPTJ);
    const uint32_t T = 160;
    ref::Inputs in(m, T, 5, 1.5f);
    const float x = 0.09f, alpha = float(0.09 * sqrt(32.0));
    ref::Inputs sc = in;
    for (float &v : sc.q) v *= alpha;
    for (const char *spec : {"policy=full capacity=200 kv_dtype=f16", "policy=full capacity=200 kv_dtype=q8",
                             "policy=h2o budget=48 recent=4 capacity=64 score=fixed",
                             "policy=h2o budget=48 recent=4 capacity=64 kv_dtype=q4 quant_group=16"}) {
        ref::Cache a(m, std::string(spec) + " attn_scale=0.09"), b(m, spec);
        ASSERT_TRUE(a.c && b.c) << spec;
        std::vector<float> oa(size_t(m.n_q_heads) * m.head_dim), ob(oa.size());
        double worst = 0;
        for (uint32_t t = 0; t < T; ++t)
            for (uint32_t l = 0; l < m.n_layers; ++l) {
                ASSERT_EQ(kvp_decode(a.c, l, in.qt(t), in.kt(t), in.vt(t), oa.data()), KVP_OK);
                ASSERT_EQ(kvp_decode(b.c, l, sc.qt(t), sc.kt(t), sc.vt(t), ob.data()), KVP_OK);
                for (size_t i = 0; i < oa.size(); ++i) worst = std::max(worst, double(fabs(oa[i] - ob[i])));
            }
        EXPECT_LT(worst, strstr(spec, "q8") || strstr(spec, "q4") ? 2e-2 : 1e-4) << spec;
        (void)x;
    }
}

// logit_softcap: c * tanh(logit / c) before the softmax, in every kernel variant (prefill and
// decode) and with formatted storage, against the double reference; score=fixed refuses it.
TEST(Engine, LogitSoftcapInEveryKernelVariant) {
    const kvp_model m = ref::model(1, 8, 2, 64, KVP_ROPE_NEOX);
    const uint32_t T = 300;
    ref::Inputs in(m, T, 23, 3.0f);  // large logits: the cap matters
    const double cap = 5.0, scale = 1.0 / 8.0;
    struct Case {
        const char *kern, *dtype;
        double tol;
    };
    const Case cases[] = {{"scalar", "f32", 2e-5}, {"simde", "f32", 2e-5}, {"avx2", "f32", 2e-5}, {"avx512", "f32", 2e-5},
                          {nullptr, "f16", 3e-3},  {nullptr, "q8", 3e-2}};
    for (const Case &cs : cases) {
        if (cs.kern) setenv("KVP_KERNEL", cs.kern, 1);
        ref::Cache c(m, std::string("policy=full capacity=320 logit_softcap=5 quant_group=16 kv_dtype=") + cs.dtype);
        ASSERT_TRUE(c.c);
        std::vector<float> out(size_t(m.n_q_heads) * m.head_dim), pre(size_t(40) * m.n_q_heads * m.head_dim);
        ASSERT_EQ(kvp_prefill(c.c, 0, 40, nullptr, in.qt(0), in.kt(0), in.vt(0), pre.data(), nullptr), KVP_OK);
        double worst = 0, apart = 0;
        for (uint32_t t = 0; t < 40; t += 3) {
            const std::vector<double> r = reference(m, in, t, scale, cap);
            for (size_t i = 0; i < r.size(); ++i) worst = std::max(worst, fabs(r[i] - pre[size_t(t) * r.size() + i]));
        }
        for (uint32_t t = 40; t < T; ++t) {
            ASSERT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
            if (t % 41 && t != T - 1) continue;
            const std::vector<double> r = reference(m, in, t, scale, cap), u = reference(m, in, t, scale);
            for (size_t i = 0; i < r.size(); ++i) {
                worst = std::max(worst, fabs(r[i] - out[i]));
                apart = std::max(apart, fabs(u[i] - out[i]));
            }
        }
        EXPECT_LT(worst, cs.tol) << (cs.kern ? cs.kern : "") << " " << cs.dtype;
        EXPECT_GT(apart, 1e-2) << "the cap changes the outputs";
        unsetenv("KVP_KERNEL");
    }
    // an observing policy runs with it; fixed-point scores refuse it
    ref::Cache h(m, "policy=h2o budget=64 recent=8 capacity=80 logit_softcap=5");
    ASSERT_TRUE(h.c);
    std::vector<float> o(size_t(T) * m.n_q_heads * m.head_dim);
    ASSERT_EQ(kvp_prefill(h.c, 0, 70, nullptr, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256];
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=h2o logit_softcap=50 score=fixed", err, sizeof err), KVP_ERR_UNSUPPORTED);
    EXPECT_NE(strstr(err, "score=fixed"), nullptr) << err;
}

}  // namespace
