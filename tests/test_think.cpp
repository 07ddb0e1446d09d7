// ThinK (quant/think.h): the channels a head keeps against an independent double-precision
// computation in this file (brute force over every query/key pair, not the Gram shortcut the
// library uses), for the query-driven score, the l1/l2 baselines and the value score; RoPE pairs
// kept whole; reduced-width storage seen through the arena and live bytes; config errors.
#include <gtest/gtest.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache.h"
#include "quant/store_fmt.h"
#include "quant_support.h"
#include "reference.h"

namespace {

using ref::Rng;

struct Prompt {
    std::vector<float> q, k, v;
};
Prompt prompt(const kvp_model &m, uint32_t P, uint64_t seed) {
    Prompt p;
    p.q.resize(size_t(P) * m.n_q_heads * m.head_dim);
    p.k.resize(size_t(P) * m.n_kv_heads * m.head_dim);
    p.v.resize(p.k.size());
    Rng g(seed);
    g.fill(p.q);
    g.fill(p.k);
    g.fill(p.v);
    // give channels distinct magnitudes so scores are well separated
    for (size_t i = 0; i < p.k.size(); ++i) p.k[i] *= 0.2f + float((i * 7) % m.head_dim) / float(m.head_dim);
    for (size_t i = 0; i < p.v.size(); ++i) p.v[i] *= 0.1f + float((i * 5) % m.head_dim) / float(m.head_dim);
    return p;
}

// Scoring units as the paper's channels: RoPE pairs (kept or pruned together), then singles.
struct Unit {
    uint32_t a, b;  // b == a for a single channel
};
std::vector<Unit> units(const kvp_model &m) {
    const uint32_t rd = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim);
    std::vector<Unit> u;
    for (uint32_t i = 0; i < rd / 2; ++i)
        u.push_back(m.rope == KVP_ROPE_GPTJ ? Unit{2 * i, 2 * i + 1} : Unit{i, i + rd / 2});
    for (uint32_t c = rd; c < m.head_dim; ++c) u.push_back(Unit{c, c});
    return u;
}

// The selection is right when every pruned unit scores no higher than every kept one (ties
// within a relative 1e-9 are allowed either way), per class (pairs, singles).
void expect_top(const std::vector<Unit> &us, const std::vector<double> &score, const std::vector<uint16_t> &kept,
                uint32_t d, const char *what) {
    std::vector<bool> keep(d, false);
    for (uint16_t c : kept) keep[c] = true;
    for (size_t i = 0; i < us.size(); ++i) {
        const bool pair = us[i].a != us[i].b;
        if (pair) {
            EXPECT_EQ(keep[us[i].a], keep[us[i].b]) << what << ": RoPE pair split at unit " << i;
        }
        if (keep[us[i].a]) continue;
        for (size_t j = 0; j < us.size(); ++j) {
            if ((us[j].a != us[j].b) != pair || !keep[us[j].a]) continue;
            EXPECT_LE(score[i], score[j] * (1 + 1e-9) + 1e-300) << what << ": pruned unit " << i << " outranks kept " << j;
        }
    }
}

// Independent scores of KV head h: keys at their positions, the last w queries of the prompt
// at theirs (original positions: token index).
std::vector<double> key_scores(const kvp_model &m, const Prompt &p, uint32_t P, uint32_t h, uint32_t w, int mode) {
    const uint32_t hd = m.head_dim, G = m.n_q_heads / m.n_kv_heads;
    const std::vector<Unit> us = units(m);
    std::vector<std::vector<double>> K(P);
    for (uint32_t s = 0; s < P; ++s) {
        K[s].assign(&p.k[(size_t(s) * m.n_kv_heads + h) * hd], &p.k[(size_t(s) * m.n_kv_heads + h) * hd] + hd);
        ref::rotate(m, K[s], s);
    }
    std::vector<double> score(us.size(), 0.0);
    if (mode == 1 || mode == 2) {  // l1 / l2 of the stored (rotated) keys
        for (size_t u = 0; u < us.size(); ++u) {
            double acc = 0;
            for (uint32_t s = 0; s < P; ++s) {
                const double x = K[s][us[u].a], y = us[u].a != us[u].b ? K[s][us[u].b] : 0.0;
                acc += mode == 1 ? fabs(x) + fabs(y) : x * x + y * y;
            }
            score[u] = mode == 1 ? acc : sqrt(acc);
        }
        return score;
    }
    for (uint32_t g = 0; g < G; ++g) {  // sum over the group of ||Q_u K_u^T||_F, brute force
        std::vector<std::vector<double>> Q(w);
        for (uint32_t t = 0; t < w; ++t) {
            const uint32_t i = P - w + t;
            const float *qr = &p.q[(size_t(i) * m.n_q_heads + h * G + g) * hd];
            Q[t].assign(qr, qr + hd);
            ref::rotate(m, Q[t], i);
        }
        for (size_t u = 0; u < us.size(); ++u) {
            double f2 = 0;
            for (uint32_t t = 0; t < w; ++t)
                for (uint32_t s = 0; s < P; ++s) {
                    double dot = Q[t][us[u].a] * K[s][us[u].a];
                    if (us[u].a != us[u].b) dot += Q[t][us[u].b] * K[s][us[u].b];
                    f2 += dot * dot;
                }
            score[u] += sqrt(f2);
        }
    }
    return score;
}

// ThinK's value score: sum over the group of the column norms of the last w queries' exact
// (causal) attention outputs over the prompt.
std::vector<double> value_scores(const kvp_model &m, const Prompt &p, uint32_t P, uint32_t h, uint32_t w) {
    const uint32_t hd = m.head_dim, G = m.n_q_heads / m.n_kv_heads;
    std::vector<double> sq(size_t(G) * hd, 0.0), score(hd, 0.0);
    for (uint32_t t = 0; t < w; ++t) {
        const uint32_t i = P - w + t;
        std::vector<uint32_t> idx;
        std::vector<int64_t> kpos;
        for (uint32_t s = 0; s <= i; ++s) {
            idx.push_back(s);
            kpos.push_back(s);
        }
        std::vector<double> out;
        ref::attend(m, &p.q[size_t(i) * m.n_q_heads * hd], i, p.k.data(), p.v.data(), idx, kpos, out);
        for (uint32_t g = 0; g < G; ++g)
            for (uint32_t c = 0; c < hd; ++c) {
                const double x = out[(size_t(h) * G + g) * hd + c];
                sq[size_t(g) * hd + c] += x * x;
            }
    }
    for (uint32_t g = 0; g < G; ++g)
        for (uint32_t c = 0; c < hd; ++c) score[c] += sqrt(sq[size_t(g) * hd + c]);
    return score;
}

std::vector<uint16_t> kept_keys(const kvp_cache *c, uint32_t l, uint32_t h) {
    const kvp::FmtStore &fs = kvp::fmt_store(*c->fmt, kvp::head_of(c, l, h));
    EXPECT_TRUE(fs.selected);
    return std::vector<uint16_t>(fs.kidx, fs.kidx + c->fmt->f.wk);
}
std::vector<uint16_t> kept_values(const kvp_cache *c, uint32_t l, uint32_t h) {
    const kvp::FmtStore &fs = kvp::fmt_store(*c->fmt, kvp::head_of(c, l, h));
    return std::vector<uint16_t>(fs.vidx, fs.vidx + c->fmt->f.wv);
}

TEST(Think, ChannelChoiceMatchesIndependentComputation) {
    const kvp_model models[] = {ref::model(1, 4, 2, 32), ref::model(1, 6, 2, 32, KVP_ROPE_NEOX, 16),
                                ref::model(1, 4, 2, 24, KVP_ROPE_NONE)};
    const char *scores[] = {"qk", "l1", "l2"};
    for (const kvp_model &m : models) {
        for (int mode = 0; mode < 3; ++mode) {
            for (uint32_t w : {1u, 8u, 32u}) {
                const uint32_t P = 40;
                const std::string spec = std::string("policy=think key_channel_ratio=0.4 value_channel_ratio=0.3 channel_score=") +
                                         scores[mode] + " obs_window=" + std::to_string(w) + " quant_group=8 capacity=64";
                SCOPED_TRACE(spec + " rope=" + std::to_string(int(m.rope)));
                ref::Cache cache(m, spec);
                const Prompt p = prompt(m, P, 3 + w);
                std::vector<float> out(size_t(P) * m.n_q_heads * m.head_dim);
                ASSERT_EQ(kvp_prefill(cache.c, 0, P, nullptr, p.q.data(), p.k.data(), p.v.data(), out.data(), nullptr),
                          KVP_OK);
                const kvp::StoreFormat &f = cache.c->fmt->f;
                for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                    const std::vector<uint16_t> kk = kept_keys(cache.c, 0, h), kv = kept_values(cache.c, 0, h);
                    ASSERT_TRUE(std::is_sorted(kk.begin(), kk.end()));
                    ASSERT_TRUE(std::is_sorted(kv.begin(), kv.end()));
                    expect_top(units(m), key_scores(m, p, P, h, w, mode), kk, m.head_dim, "keys");
                    // values: the appendix score for qk, magnitudes for the baselines
                    std::vector<double> vs(m.head_dim, 0.0);
                    if (mode == 0) {
                        vs = value_scores(m, p, P, h, w);
                    } else {
                        for (uint32_t c = 0; c < m.head_dim; ++c) {
                            double a = 0;
                            for (uint32_t s = 0; s < P; ++s) {
                                const double x = p.v[(size_t(s) * m.n_kv_heads + h) * m.head_dim + c];
                                a += mode == 1 ? fabs(x) : x * x;
                            }
                            vs[c] = mode == 1 ? a : sqrt(a);
                        }
                    }
                    std::vector<Unit> singles;
                    for (uint32_t c = 0; c < m.head_dim; ++c) singles.push_back(Unit{c, c});
                    expect_top(singles, vs, kv, m.head_dim, "values");
                    EXPECT_EQ(kk.size(), f.wk);
                    EXPECT_EQ(kv.size(), size_t(m.head_dim - uint32_t(0.3 * m.head_dim)));
                }
            }
        }
    }
}

// Widths: floor(lambda * rope_dim/2) pairs and floor(lambda * unrotated) singles are pruned.
TEST(Think, PrunedWidths) {
    const struct {
        kvp_model m;
        const char *spec;
        uint32_t wk, wv;
    } cases[] = {
        {ref::model(1, 2, 1, 128), "key_channel_ratio=0.4", 78, 128},
        {ref::model(1, 2, 1, 128), "key_channel_ratio=0.5 value_channel_ratio=0.5", 64, 64},
        {ref::model(1, 2, 1, 64, KVP_ROPE_NEOX, 32), "key_channel_ratio=0.4", 64 - 12 - 12, 64},
        {ref::model(1, 2, 1, 24, KVP_ROPE_NONE), "key_channel_ratio=0.25 value_channel_ratio=0.1", 18, 22},
    };
    for (const auto &cs : cases) {
        const kvp_config cfg = qref::config(cs.m, std::string("policy=think ") + cs.spec);
        kvp::StoreFormat f;
        kvp::store_format(cfg, &f);
        EXPECT_EQ(f.wk, cs.wk) << cs.spec;
        EXPECT_EQ(f.wv, cs.wv) << cs.spec;
    }
}

// Converted tokens keep only their head's channels (the rest read back as 0); the residual
// group and tokens decoded after the prompt stay full width until their group converts.
TEST(Think, ReducedWidthStorageAndFullWidthResidual) {
    const kvp_model m = ref::model(1, 4, 2, 32);
    ref::Cache cache(m, "policy=think key_channel_ratio=0.5 value_channel_ratio=0.25 quant_group=8 capacity=64");
    const uint32_t P = 21;
    const Prompt p = prompt(m, P + 10, 9);
    std::vector<float> out(size_t(P) * m.n_q_heads * m.head_dim);
    ASSERT_EQ(kvp_prefill(cache.c, 0, P, nullptr, p.q.data(), p.k.data(), p.v.data(), out.data(), nullptr), KVP_OK);
    for (uint32_t t = P; t < P + 2; ++t)
        ASSERT_EQ(kvp_decode(cache.c, 0, &p.q[size_t(t) * 4 * 32], &p.k[size_t(t) * 2 * 32], &p.v[size_t(t) * 2 * 32],
                             out.data()),
                  KVP_OK);
    const auto snap = qref::snapshot(cache.c, 0, 1);
    ASSERT_EQ(snap.size(), P + 2);
    for (uint32_t j = 0; j < snap.size(); ++j) {
        uint32_t kz = 0, vz = 0;
        for (uint32_t c = 0; c < 32; ++c) {
            kz += snap[j].k[c] == 0.0;
            vz += snap[j].v[c] == 0.0;
        }
        if (j < 16) {  // two complete groups of 8: thinned
            EXPECT_EQ(kz, 16u) << j;
            EXPECT_EQ(vz, 8u) << j;
        } else {  // residual: full width
            EXPECT_EQ(kz, 0u) << j;
            EXPECT_EQ(vz, 0u) << j;
        }
    }
    // the arena of the same capacity is smaller than without ThinK; live bytes count the width
    const kvp_model big = ref::model(4, 16, 4, 128);
    const kvp_config plain = qref::config(big, "capacity=2048");
    const kvp_config think = qref::config(big, "policy=think key_channel_ratio=0.5 capacity=2048");
    EXPECT_LT(kvp_arena_size(&think), kvp_arena_size(&plain) * 0.85);
}

// kvp_append has no queries: qk falls back to the l2 key magnitude (documented).
TEST(Think, AppendOnlySelectsByKeyMagnitude) {
    const kvp_model m = ref::model(1, 4, 2, 32);
    const Prompt p = prompt(m, 40, 12);
    std::vector<std::vector<uint16_t>> sel;
    for (const char *score : {"qk", "l2"}) {
        ref::Cache cache(m, std::string("policy=think key_channel_ratio=0.4 value_channel_ratio=0.2 quant_group=8 capacity=64 "
                                        "channel_score=") +
                                score);
        ASSERT_EQ(kvp_append(cache.c, 0, 40, nullptr, p.k.data(), p.v.data()), KVP_OK);
        sel.push_back(kept_keys(cache.c, 0, 1));
        sel.push_back(kept_values(cache.c, 0, 1));
    }
    EXPECT_EQ(sel[0], sel[2]);
    EXPECT_EQ(sel[1], sel[3]);
}

TEST(Think, ConfigErrors) {
    const kvp_model m = ref::model(1, 4, 2, 32);
    kvp_config cfg;
    kvp_config_default(&cfg, &m);
    char err[256];
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=think token_policy=think", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "token_policy"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "key_channel_ratio=1.5", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "key_channel_ratio"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "value_channel_ratio=-0.1", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "value_channel_ratio"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "channel_score=l3", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "qk|l1|l2"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "token_policy=fifo", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "token_policy"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=think token_policy=asl", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "kv_dtype=q2", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "f32|f16|q8|q4"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "quant_group=5000", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "quant_group"), nullptr) << err;
    // a C caller's garbage in the new fields is caught by check
    kvp_config bad = cfg;
    const uint32_t garbage = 77;
    memcpy(&bad.token_policy, &garbage, 4);
    EXPECT_EQ(kvp_config_check(&bad, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "token_policy"), nullptr) << err;
    bad = cfg;
    bad.quant_group = 0;
    EXPECT_EQ(kvp_config_check(&bad, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "quant_group"), nullptr) << err;
    EXPECT_EQ(kvp_arena_size(&bad), 0u);
    // policy=think alone composes with full and keeps ThinK's defaults
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=think", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << err;
}

}  // namespace
