// Quantized storage (kv_dtype=f16|q8|q4) and ThinK reduced-width storage through the C API:
// attention equals a double-precision attention over exactly what the store holds (so kernels,
// row layout, runs over converted / residual / staged rows and realign are right), error
// bounds against unquantized attention, repacking after many evictions, exact arena sizes and
// live bytes.
#include <gtest/gtest.h>
#include <math.h>
#include <string.h>

#include <string>
#include <vector>

#include "cache.h"
#include "quant/format.h"
#include "quant/store_fmt.h"
#include "quant_support.h"
#include "reference.h"

namespace {

using ref::Rng;

struct Seq {
    std::vector<float> q, k, v;
    uint32_t nq, nkv, hd;
    Seq(const kvp_model &m, uint32_t T, uint64_t seed, float kscale = 1.0f)
        : q(size_t(T) * m.n_q_heads * m.head_dim), k(size_t(T) * m.n_kv_heads * m.head_dim), v(k.size()),
          nq(m.n_q_heads), nkv(m.n_kv_heads), hd(m.head_dim) {
        Rng g(seed);
        g.fill(q, -1.0f, 1.0f);
        g.fill(k, -kscale, kscale);
        g.fill(v, -1.0f, 1.0f);
    }
    const float *qt(uint32_t t) const { return q.data() + size_t(t) * nq * hd; }
    const float *kt(uint32_t t) const { return k.data() + size_t(t) * nkv * hd; }
    const float *vt(uint32_t t) const { return v.data() + size_t(t) * nkv * hd; }
};

// Prefill P tokens, then decode up to T, checking every decode step of every layer and KV head
// against decode_ref over the store's snapshot before the step.
// tol: f32 / f16 / q8 rows are read exactly, so only float rounding separates the two; q4 keys
// are dotted with an int8 copy of the query (kernels/attn_q.h: error per logit at most
// scale * (max|q_s|/254) * sum of the codes), so q4 gets tol_q4.
void check_against_stored(const kvp_model &m, const std::string &spec, uint32_t P, uint32_t T, double tol,
                          double tol_q4 = 5e-3) {
    SCOPED_TRACE(spec + " hd=" + std::to_string(m.head_dim) + " rope=" + std::to_string(int(m.rope)));
    ref::Cache cache(m, spec);
    ASSERT_NE(cache.c, nullptr);
    const kvp_cache *c = cache.c;
    ASSERT_NE(c->fx, nullptr);
    const bool realign = c->positions == KVP_POS_REALIGN;
    if (c->fx->f.dtype == KVP_DTYPE_Q4) tol = tol_q4;
    const uint32_t hd = m.head_dim, G = m.n_q_heads / m.n_kv_heads;
    Seq s(m, T, 7);
    std::vector<float> out(size_t(P) * m.n_q_heads * hd);
    for (uint32_t l = 0; l < m.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(cache.c, l, P, nullptr, s.q.data(), s.k.data(), s.v.data(), out.data(), nullptr), KVP_OK)
            << kvp_last_error(cache.c);
    double worst = 0;
    std::vector<double> want;
    // every stored element is near the token's rotated input (f16 / quantization error)
    const double kbound = c->fx->f.dtype == KVP_DTYPE_F32 ? 1e-6 : c->fx->f.dtype == KVP_DTYPE_F16 ? 2e-3
                          : c->fx->f.dtype == KVP_DTYPE_Q8 ? 0.05 : 0.8;
    auto check_stored = [&](uint32_t t) {
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                const auto snap = qref::snapshot(c, l, h);
                const auto pos = cache.positions(l, h);
                for (size_t j = 0; j < snap.size(); ++j) {
                    std::vector<double> ko(s.kt(pos[j]) + h * hd, s.kt(pos[j]) + (h + 1) * hd);
                    ref::rotate(m, ko, snap[j].rot);
                    const float *vo = s.vt(pos[j]) + h * hd;
                    for (uint32_t i = 0; i < hd; ++i) {
                        if (snap[j].k[i] != 0.0) {
                            ASSERT_NEAR(snap[j].k[i], ko[i], kbound) << "t " << t << " l " << l << " h " << h << " j " << j << " ch " << i;
                        }
                        if (snap[j].v[i] != 0.0) {
                            ASSERT_NEAR(snap[j].v[i], vo[i], kbound) << "t " << t << " l " << l << " h " << h << " j " << j << " ch " << i;
                        }
                    }
                }
            }
        }
    };
    check_stored(P);
    for (uint32_t t = P; t < T; ++t) {
        if (t % 7 == 0) check_stored(t);
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            std::vector<std::vector<qref::Tok>> snaps;
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) snaps.push_back(qref::snapshot(c, l, h));
            ASSERT_EQ(kvp_decode(cache.c, l, s.qt(t), s.kt(t), s.vt(t), out.data()), KVP_OK) << kvp_last_error(cache.c);
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                const int64_t pos = realign ? int64_t(snaps[h].size()) : int64_t(t);
                qref::decode_ref(m, snaps[h], realign, s.qt(t) + size_t(h) * G * hd, pos, s.kt(t) + size_t(h) * hd,
                                 s.vt(t) + size_t(h) * hd, want);
                const double e = qref::max_abs(out.data() + size_t(h) * G * hd, want.data(), size_t(G) * hd);
                worst = std::max(worst, e);
                ASSERT_LE(e, tol) << "step " << t << " layer " << l << " head " << h;
            }
        }
    }
    ::testing::Test::RecordProperty("worst", std::to_string(worst));
}

const char *const kDtypes[] = {"f16", "q8", "q4"};

struct PolicyCase {
    const char *keys;
    uint32_t P, T;
};
const PolicyCase kPolicies[] = {
    {"policy=full capacity=160", 37, 150},
    {"policy=window window=45", 30, 150},
    {"policy=streaming sinks=4 window=40 compress_every=8", 20, 160},
    {"policy=streaming sinks=11 window=30 compress_every=5 positions=original", 20, 120},
    {"policy=h2o budget=48 recent=6 obs_window=8 capacity=80", 60, 170},
    {"policy=h2o budget=40 recent=3 positions=realign", 25, 160},
};

TEST(QuantStore, AttentionEqualsAttentionOverStoredValues) {
    const kvp_model models[] = {ref::model(2, 4, 2, 40), ref::model(1, 6, 2, 48, KVP_ROPE_NEOX, 24)};
    for (const kvp_model &m : models) {
        for (const PolicyCase &pc : kPolicies) {
            for (const char *dt : kDtypes) {
                for (const char *qg : {"quant_group=8", "quant_group=32"}) {
                    const std::string spec = std::string(pc.keys) + " kv_dtype=" + dt + " " + qg;
                    check_against_stored(m, spec, pc.P, pc.T, 2e-5);
                }
            }
        }
    }
}

TEST(QuantStore, ThinkAttentionEqualsAttentionOverStoredValues) {
    const kvp_model models[] = {ref::model(2, 4, 2, 40), ref::model(1, 6, 2, 48, KVP_ROPE_NEOX, 24),
                                ref::model(1, 2, 1, 24, KVP_ROPE_NONE)};
    for (const kvp_model &m : models) {
        for (const PolicyCase &pc : kPolicies) {
            for (const char *dt : {"f32", "f16", "q8", "q4"}) {
                const std::string keys = std::string(pc.keys).replace(0, 7, "token_policy=");
                const std::string spec = "policy=think " + keys + " kv_dtype=" + dt +
                                         " key_channel_ratio=0.4 value_channel_ratio=0.3 quant_group=8";
                check_against_stored(m, spec, pc.P, pc.T, 2e-5);
            }
        }
    }
}

}  // namespace
