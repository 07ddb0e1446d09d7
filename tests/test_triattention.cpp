// policy=triattention (src/policies/triattention.h): the kept tokens equal an independent reference
// written from the paper's formula the way its reference code computes it (RoPE inverted from the
// caller's raw keys, phase by atan2, the cosine averaged over the 17 geometric offsets, the
// group's maximum, the budget best of the generated tokens whenever budget + beta are held);
// the prompt is never evicted and a head never holds more than budget + beta generated tokens;
// score=fixed gives the same tokens for threads 1/2/3 and every kv_dtype; a loaded state goes on as
// the saved one would; drafts work; bad configs are refused.
#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <complex>
#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "policies/triattention.h"
#include "reference.h"

namespace {

void prefill(ref::Cache &c, const ref::Inputs &in, uint32_t t0, uint32_t n, bool with_q = true) {
    std::vector<float> out(size_t(n) * in.nq);
    for (uint32_t l = 0; l < in.m.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, with_q ? &in.q[size_t(t0) * in.nq] : nullptr,
                              &in.k[size_t(t0) * in.nkv], &in.v[size_t(t0) * in.nkv], with_q ? out.data() : nullptr,
                              nullptr),
                  KVP_OK)
            << kvp_last_error(c.c);
}

void decode(ref::Cache &c, const ref::Inputs &in, uint32_t t) {
    std::vector<float> out(in.nq);
    for (uint32_t l = 0; l < in.m.n_layers; ++l)
        ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << kvp_last_error(c.c);
}

std::vector<int32_t> all_positions(const ref::Cache &c, const kvp_model &m) {
    std::vector<int32_t> r;
    for (uint32_t l = 0; l < m.n_layers; ++l)
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            const std::vector<int32_t> p = c.positions(l, h);
            r.insert(r.end(), p.begin(), p.end());
            r.push_back(-1);
        }
    return r;
}

// ---- the reference: the paper's score as its code computes it, from the caller's raw rows ----

struct Ref {
    kvp_model m;
    uint32_t budget, beta, prompt;
    const std::vector<ref::Inputs> &in;  // one set of rows per layer
    const std::vector<ref::Inputs> *calib = nullptr;  // tri_stats=given: the means over these queries

    // The complex pairs of a raw row (RoPE's pairing) and the unrotated channels as real values.
    std::vector<std::complex<double>> units(const float *x) const {
        std::vector<std::complex<double>> u;
        const uint32_t rd = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim);
        for (uint32_t i = 0; i < rd / 2; ++i) {
            const uint32_t a = m.rope == KVP_ROPE_GPTJ ? 2 * i : i, b = m.rope == KVP_ROPE_GPTJ ? 2 * i + 1 : i + rd / 2;
            u.emplace_back(x[a], x[b]);
        }
        for (uint32_t i = rd; i < m.head_dim; ++i) u.emplace_back(x[i], 0.0);
        return u;
    }
    double omega(uint32_t i) const {
        const uint32_t rd = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim);
        return i < rd / 2 ? pow(double(m.rope_theta), -2.0 * i / rd) : 0.0;
    }
    bool pair(uint32_t i) const {
        const uint32_t rd = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim);
        return i < rd / 2;
    }
    uint32_t G() const { return m.n_q_heads / m.n_kv_heads; }

    // Score of token p's key in layer l for query head qh, with the layer's queries of tokens
    // [0, seen) and the next query at R.
    double score(uint32_t l, uint32_t qh, uint32_t p, uint32_t seen, int64_t R) const {
        const auto k = units(in[l].kt(p) + size_t(qh / G()) * m.head_dim);
        std::vector<std::complex<double>> mean(k.size());
        std::vector<double> absmean(k.size(), 0.0);
        const ref::Inputs &qs = calib ? (*calib)[l] : in[l];
        if (calib) seen = qs.T;
        for (uint32_t t = 0; t < seen; ++t) {
            const auto q = units(qs.qt(t) + size_t(qh) * m.head_dim);
            for (size_t i = 0; i < k.size(); ++i) {
                mean[i] += q[i];
                absmean[i] += pair(uint32_t(i)) ? std::abs(q[i]) : fabs(q[i].real());
            }
        }
        double s = 0.0;
        for (size_t i = 0; i < k.size(); ++i) {
            const std::complex<double> mq = mean[i] / double(seen);
            const double aq = absmean[i] / seen;
            if (!pair(uint32_t(i))) {  // frequency 0, one channel
                s += mq.real() * k[i].real() + (aq - fabs(mq.real())) * fabs(k[i].real());
                continue;
            }
            const double amp = std::abs(mq) * std::abs(k[i]);
            const std::complex<double> rel = mq * std::conj(k[i]);
            const double phi = atan2(rel.imag(), rel.real());
            double c = 0.0;
            for (uint32_t d = 0; d < 17; ++d) c += cos((double(R - p) + double(1u << d)) * omega(uint32_t(i)) + phi);
            s += amp * c / 17 + (aq - std::abs(mq)) * std::abs(k[i]);
        }
        return s;
    }
    double group_max(uint32_t l, uint32_t h, uint32_t p, uint32_t t) const {
        double best = -INFINITY;
        for (uint32_t g = 0; g < G(); ++g) best = std::max(best, score(l, h * G() + g, p, t + 1, int64_t(t) + 1));
        return best;
    }
    // The `keep` best of gen by key (ties: the older goes first), ascending.
    static std::vector<int32_t> best(const std::vector<int32_t> &gen, const std::vector<double> &key, size_t keep) {
        std::vector<std::pair<double, int32_t>> sc;
        for (size_t i = 0; i < gen.size(); ++i) sc.emplace_back(key[i], gen[i]);
        std::sort(sc.begin(), sc.end());
        std::vector<int32_t> r;
        for (size_t i = sc.size() - keep; i < sc.size(); ++i) r.push_back(sc[i].second);
        std::sort(r.begin(), r.end());
        return r;
    }
    // The choice at step t for the stores the mode shares (l < 0: every layer; h < 0: every head).
    std::vector<int32_t> choose(const std::vector<int32_t> &gen, uint32_t t, int32_t l0, int32_t h0, bool union_mode) const {
        std::vector<double> key(gen.size(), union_mode ? -INFINITY : 0.0);
        std::vector<bool> nominated(gen.size(), false);
        uint32_t layers = 0;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            if (l0 >= 0 && l != uint32_t(l0)) continue;
            ++layers;
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                if (h0 >= 0 && h != uint32_t(h0)) continue;
                if (!union_mode) {  // the group's max, summed over layers
                    for (size_t i = 0; i < gen.size(); ++i) key[i] += group_max(l, h, uint32_t(gen[i]), t);
                    continue;
                }
                for (uint32_t g = 0; g < G(); ++g) {  // each query head nominates its budget best
                    std::vector<double> s(gen.size());
                    for (size_t i = 0; i < gen.size(); ++i) {
                        s[i] = score(l, h * G() + g, uint32_t(gen[i]), t + 1, int64_t(t) + 1);
                        key[i] = std::max(key[i], s[i]);
                    }
                    for (int32_t p : best(gen, s, budget)) nominated[size_t(std::find(gen.begin(), gen.end(), p) - gen.begin())] = true;
                }
            }
        }
        for (size_t i = 0; i < gen.size(); ++i) {
            if (!union_mode) key[i] /= layers;
            else if (!nominated[i]) key[i] = -INFINITY;
        }
        return best(gen, key, budget);
    }
    // The positions (l, h) keeps after the prompt [0, prompt) and decodes up to token T-1.
    std::vector<int32_t> kept(const char *mode, uint32_t l, uint32_t h, uint32_t T) const {
        const bool uni = strcmp(mode, "union") == 0, per_head = strcmp(mode, "per_head") == 0;
        std::vector<int32_t> gen;
        for (uint32_t t = prompt; t < T; ++t) {
            gen.push_back(int32_t(t));
            if (gen.size() < size_t(budget) + beta) continue;
            gen = uni ? choose(gen, t, -1, -1, true) : per_head ? choose(gen, t, -1, int32_t(h), false)
                                                               : choose(gen, t, int32_t(l), int32_t(h), false);
        }
        std::vector<int32_t> r;
        for (uint32_t t = 0; t < prompt; ++t) r.push_back(int32_t(t));
        r.insert(r.end(), gen.begin(), gen.end());
        return r;
    }
    // head_budget=ada (tri_mode=per_layer_perhead; triattention.cpp "AdaKV"): the positions every KV
    // head of layer l keeps after decoding up to token T-1. At each cut (the heads' generated
    // tokens reach heads x (budget + beta)) the layer keeps heads x budget: each head first its
    // best floor(a x min(g_h, budget)), the rest by one ranking over all heads (score, then the
    // newer, then the lower head); the score of a token is its group's maximum of per-query-head
    // z-scores over the head's generated tokens (population deviation, at least 1e-6), raw with
    // one KV head. A head keeps at most min(its generated tokens, max(budget, room)), room = its
    // store's cap - prompt - beta; *bound counts the cuts where that skipped a head's token. After
    // the first cut, one comes every beta decodes too.
    std::vector<std::vector<int32_t>> kept_ada(uint32_t l, uint32_t T, double a, size_t room = SIZE_MAX,
                                               size_t *bound = nullptr) const {
        const uint32_t H = m.n_kv_heads;
        std::vector<std::vector<int32_t>> gen(H);
        int64_t since = -1;  // decodes since the last cut (-1: none yet)
        for (uint32_t t = prompt; t < T; ++t) {
            size_t total = 0;
            for (auto &g : gen) total += (g.push_back(int32_t(t)), g.size());
            if (since >= 0) ++since;
            if (total < size_t(H) * (budget + beta) && since < int64_t(beta)) continue;
            since = 0;
            struct Rec {
                double key;
                int32_t pos;
                uint32_t h;
            };
            std::vector<Rec> rest;
            std::vector<std::vector<int32_t>> keep(H);
            std::vector<size_t> most(H);
            for (uint32_t h = 0; h < H; ++h) {
                const size_t n = gen[h].size();
                std::vector<double> key(n, -INFINITY);
                for (uint32_t g = 0; g < G(); ++g) {
                    std::vector<double> s(n);
                    double mean = 0.0, var = 0.0;
                    for (size_t i = 0; i < n; ++i) mean += (s[i] = score(l, h * G() + g, uint32_t(gen[h][i]), t + 1, int64_t(t) + 1));
                    mean /= double(n);
                    for (size_t i = 0; i < n; ++i) var += (s[i] - mean) * (s[i] - mean);
                    const double sd = std::max(sqrt(var / double(n)), 1e-6);
                    for (size_t i = 0; i < n; ++i) key[i] = std::max(key[i], H > 1 ? (s[i] - mean) / sd : s[i]);
                }
                std::vector<Rec> rs;
                for (size_t i = 0; i < n; ++i) rs.push_back(Rec{key[i], gen[h][i], h});
                std::sort(rs.begin(), rs.end(), [](const Rec &x, const Rec &y) { return x.key > y.key || (x.key == y.key && x.pos > y.pos); });
                most[h] = std::min(n, std::max(room, size_t(budget)));
                const size_t fl = std::min(most[h], size_t(a * double(std::min<size_t>(n, budget))));
                for (size_t i = 0; i < rs.size(); ++i) (i < fl ? keep[h].push_back(rs[i].pos) : rest.push_back(rs[i]));
            }
            std::sort(rest.begin(), rest.end(), [](const Rec &x, const Rec &y) {
                return x.key != y.key ? x.key > y.key : x.pos != y.pos ? x.pos > y.pos : x.h < y.h;
            });
            size_t left = size_t(H) * budget;
            for (const auto &k : keep) left -= k.size();
            bool skipped = false;
            for (size_t i = 0; left > 0 && i < rest.size(); ++i) {
                if (keep[rest[i].h].size() >= most[rest[i].h]) {
                    skipped = true;
                    continue;
                }
                keep[rest[i].h].push_back(rest[i].pos);
                --left;
            }
            if (bound && skipped) ++*bound;
            for (uint32_t h = 0; h < H; ++h) {
                std::sort(keep[h].begin(), keep[h].end());
                gen[h] = keep[h];
            }
        }
        std::vector<std::vector<int32_t>> r(H);
        for (uint32_t h = 0; h < H; ++h) {
            for (uint32_t t = 0; t < prompt; ++t) r[h].push_back(int32_t(t));
            r[h].insert(r[h].end(), gen[h].begin(), gen[h].end());
        }
        return r;
    }
};

struct Geometry {
    const char *name;
    kvp_model m;
};
// The scorer's geometries: group sizes 1, 2, 4 and 6 (its four-head block, and a remainder of
// two), GPT-J and NEOX pairs, partial rotary, no RoPE; one to three layers.
const Geometry kScorerGeometries[] = {
    {"gptj d8 G2", ref::model(2, 4, 2, 8)},
    {"neox d16 G1", ref::model(2, 2, 2, 16, KVP_ROPE_NEOX)},
    {"neox partial 8 of 12 G4", ref::model(1, 4, 1, 12, KVP_ROPE_NEOX, 8)},
    {"no rope d5 G2", ref::model(3, 2, 1, 5, KVP_ROPE_NONE)},
    {"gptj d8 G6", ref::model(1, 6, 1, 8)},
};

// Each layer gets its own rows (seed + layer), so that the modes' aggregations over layers matter.
void prefill_layers(ref::Cache &c, const std::vector<ref::Inputs> &in, uint32_t t0, uint32_t n) {
    std::vector<float> out(size_t(n) * in[0].nq);
    for (uint32_t l = 0; l < in.size(); ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, in[l].qt(t0), in[l].kt(t0), in[l].vt(t0), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
}
void decode_layers(ref::Cache &c, const std::vector<ref::Inputs> &in, uint32_t t) {
    std::vector<float> out(in[0].nq);
    for (uint32_t l = 0; l < in.size(); ++l)
        ASSERT_EQ(kvp_decode(c.c, l, in[l].qt(t), in[l].kt(t), in[l].vt(t), out.data()), KVP_OK) << kvp_last_error(c.c);
}

TEST(TriAttention, KeepsWhatThePapersScoreKeeps) {
    for (const Geometry &g : kScorerGeometries) {
        std::vector<ref::Inputs> in;
        for (uint32_t l = 0; l < g.m.n_layers; ++l) in.emplace_back(g.m, 70, 21 + l, 1.0f);
        const Ref r{g.m, 10, 5, 16, in};
        for (const char *mode : {"union", "per_head", "per_layer_perhead"})
            for (const char *score : {"float", "fixed"}) {
                ref::Cache c(g.m, std::string("policy=triattention budget=10 beta=5 tri_mode=") + mode + " score=" + score);
                prefill_layers(c, in, 0, 16);
                for (uint32_t t = 16; t < 70; ++t) decode_layers(c, in, t);
                for (uint32_t l = 0; l < g.m.n_layers; ++l)
                    for (uint32_t h = 0; h < g.m.n_kv_heads; ++h)
                        EXPECT_EQ(c.positions(l, h), r.kept(mode, l, h, 70))
                            << g.name << " tri_mode=" << mode << " score=" << score << " layer " << l << " head " << h;
            }
    }
}

// The scores the cuts rank, token by token and query head by query head, against the paper's
// formula (Ref::score: RoPE inverted, phase by atan2, cosines averaged): the scorer's folded form
// (stored key times E[q] W e^(iRw), magnitudes, four query heads summed side by side) must agree
// to the f32 rotation's rounding in float mode and to the fixed-point key copy's precision in
// fixed mode. Group sizes 1, 2, 4 and 6 (the four-head block, and a remainder).
TEST(TriAttention, ScoresAreThePapersFormula) {
    for (const Geometry &g : kScorerGeometries) {
        std::vector<ref::Inputs> in;
        for (uint32_t l = 0; l < g.m.n_layers; ++l) in.emplace_back(g.m, 40, 21 + l, 1.0f);
        const Ref r{g.m, 30, 20, 16, in};
        const uint32_t G = g.m.n_q_heads / g.m.n_kv_heads;
        for (const char *score : {"float", "fixed"}) {
            // budget + beta above the decodes: no cut, every generated token is scored
            ref::Cache c(g.m, std::string("policy=triattention budget=30 beta=20 tri_mode=per_layer_perhead score=") + score);
            prefill_layers(c, in, 0, 16);
            for (uint32_t t = 16; t < 40; ++t) decode_layers(c, in, t);
            std::vector<double> scratch(1 << 16), per_g(size_t(G) * 64);
            std::vector<int32_t> pos(64);
            const double tol = strcmp(score, "float") == 0 ? 1e-6 : 2e-3;  // f32 keys rotated in float; the int16 copy
            for (uint32_t l = 0; l < g.m.n_layers; ++l)
                for (uint32_t h = 0; h < g.m.n_kv_heads; ++h) {
                    const uint32_t n = kvp::triattention_scores(c.c, l, h, scratch.data(), per_g.data(), 64, pos.data());
                    ASSERT_EQ(n, 24u) << g.name;
                    for (uint32_t i = 0; i < n; ++i) {
                        EXPECT_EQ(pos[i], int32_t(16 + i)) << g.name;
                        for (uint32_t q = 0; q < G; ++q) {
                            const double want = r.score(l, h * G + q, uint32_t(pos[i]), 40, 40);
                            EXPECT_NEAR(per_g[size_t(q) * 64 + i], want, tol * (1.0 + fabs(want)))
                                << g.name << " score=" << score << " layer " << l << " head " << h << " query head "
                                << q << " position " << pos[i];
                        }
                    }
                }
        }
    }
}

// head_budget=ada over tri_mode=per_layer_perhead (issue 32 item 1): every head keeps exactly
// what the reference's allocation keeps (float and fixed scores, two floors); the heads' kept
// counts differ and sum to the layer's budget; with one KV head the choice and the outputs are
// uniform's.
TEST(TriAttention, AdaKeepsWhatTheReferenceAllocates) {
    const Geometry geos[] = {{"gptj d8", ref::model(2, 4, 2, 8)}, {"neox d16 G1 4 kv", ref::model(1, 4, 4, 16, KVP_ROPE_NEOX)}};
    for (const Geometry &g : geos) {
        // KV head 1's keys 4x larger (its scores spread wider: the z-scores put the heads on one
        // scale) and every 7th key of KV head 0 6x (a few outliers: its other tokens rank low,
        // so its floor binds)
        std::vector<ref::Inputs> in;
        for (uint32_t l = 0; l < g.m.n_layers; ++l) {
            in.emplace_back(g.m, 70, 31 + l, 1.0f);
            for (uint32_t t = 0; t < 70; ++t)
                for (uint32_t i = 0; i < g.m.head_dim; ++i) {
                    in[l].k[size_t(t) * in[l].nkv + g.m.head_dim + i] *= 4.0f;
                    if (t % 7 == 0) in[l].k[size_t(t) * in[l].nkv + i] *= 6.0f;
                }
        }
        const Ref r{g.m, 10, 5, 16, in};
        bool differ = false;
        for (const char *floor : {"0.2", "1"})
            for (const char *score : {"float", "fixed"}) {
                ref::Cache c(g.m, std::string("policy=triattention budget=10 beta=5 tri_mode=per_layer_perhead head_budget=ada ada_floor=") +
                                      floor + " score=" + score);
                prefill_layers(c, in, 0, 16);
                for (uint32_t t = 16; t < 70; ++t) decode_layers(c, in, t);
                for (uint32_t l = 0; l < g.m.n_layers; ++l) {
                    const auto want = r.kept_ada(l, 70, atof(floor));
                    size_t gen = 0;
                    for (uint32_t h = 0; h < g.m.n_kv_heads; ++h) {
                        const std::vector<int32_t> p = c.positions(l, h);
                        EXPECT_EQ(p, want[h]) << g.name << " floor " << floor << " score=" << score << " layer " << l << " head " << h;
                        gen += p.size() - 16;
                        differ = differ || p.size() != c.positions(l, 0).size();
                    }
                    // the last cut at token 65 left the layer's budget, then 4 decodes
                    EXPECT_EQ(gen, size_t(g.m.n_kv_heads) * (10 + 4)) << g.name << " layer " << l;
                }
            }
        EXPECT_TRUE(differ) << g.name << ": every head kept its uniform share";
    }
    // one KV head: uniform's choice and outputs, bit for bit
    const kvp_model m1 = ref::model(2, 4, 1, 12, KVP_ROPE_NEOX, 8);
    std::vector<ref::Inputs> in;
    for (uint32_t l = 0; l < 2; ++l) in.emplace_back(m1, 70, 41 + l, 1.0f);
    for (const char *score : {"float", "fixed"}) {
        const std::string base = std::string("policy=triattention budget=10 beta=5 tri_mode=per_layer_perhead score=") + score;
        ref::Cache ada(m1, base + " head_budget=ada"), uni(m1, base);
        prefill_layers(ada, in, 0, 16);
        prefill_layers(uni, in, 0, 16);
        std::vector<float> oa(in[0].nq), ou(in[0].nq);
        for (uint32_t t = 16; t < 70; ++t)
            for (uint32_t l = 0; l < 2; ++l) {
                ASSERT_EQ(kvp_decode(ada.c, l, in[l].qt(t), in[l].kt(t), in[l].vt(t), oa.data()), KVP_OK);
                ASSERT_EQ(kvp_decode(uni.c, l, in[l].qt(t), in[l].kt(t), in[l].vt(t), ou.data()), KVP_OK);
                ASSERT_EQ(memcmp(oa.data(), ou.data(), oa.size() * sizeof(float)), 0) << score << " token " << t;
            }
        EXPECT_EQ(all_positions(ada, m1), all_positions(uni, m1)) << score;
    }
}

// The caller's statistics of every (layer, query head) from calibration rows, in the layout
// kvp_query_stats_set takes: channel means and unit magnitude means.
void set_calibration(ref::Cache &c, const Ref &r, const std::vector<ref::Inputs> &calib) {
    const kvp_model &m = r.m;
    for (uint32_t l = 0; l < m.n_layers; ++l)
        for (uint32_t qh = 0; qh < m.n_q_heads; ++qh) {
            std::vector<double> mean(m.head_dim, 0.0), am;
            for (uint32_t t = 0; t < calib[l].T; ++t) {
                const float *q = calib[l].qt(t) + size_t(qh) * m.head_dim;
                const auto u = r.units(q);
                if (am.empty()) am.assign(u.size(), 0.0);
                for (uint32_t i = 0; i < m.head_dim; ++i) mean[i] += q[i];
                for (size_t i = 0; i < u.size(); ++i) am[i] += r.pair(uint32_t(i)) ? std::abs(u[i]) : fabs(u[i].real());
            }
            std::vector<float> mf(m.head_dim), af(am.size());
            for (uint32_t i = 0; i < m.head_dim; ++i) mf[i] = float(mean[i] / calib[l].T);
            for (size_t i = 0; i < am.size(); ++i) af[i] = float(am[i] / calib[l].T);
            ASSERT_EQ(kvp_query_stats_set(c.c, l, qh, mf.data(), af.data(), uint32_t(af.size())), KVP_OK) << kvp_last_error(c.c);
        }
}

// tri_stats=given: the caller's statistics (an offline calibration on other rows) are scored, the
// cache's own queries are not counted, and kvp_reset keeps them.
// head_budget=ada where a head reaches its most (store cap 2 x 36 - prompt 4 - beta 2 = 66 of the
// layer's 8 x 30; block=1, so no block rounding makes the pool dry): eight KV heads, floor 0, every
// 7th key of seven heads 6x (a few high outliers: their other tokens' z-scores fall below 0), every
// 7th of KV head 2 zero. The double reference (Ref::kept_ada with the room) binds; the cache
// - decodes without a full layer (after the first cut one comes every beta decodes, though the
//   heads at their most left part of the budget unused),
// - leaves after every cut each head at most 66 generated tokens and the layer at most 8 x 30,
//   one head at exactly 66 at some cut,
// - keeps what the full sort keeps when its selection shortcut runs (tri_ada_select), and the same
//   bits for 1/2/3 threads.
// (The kept tokens are not compared with the reference here: in float mode two of them tie to
// 5e-6 in z-score, inside the f32 keys' rounding.)
TEST(TriAttention, AdaHeadAtItsMost) {
    const kvp_model m8 = ref::model(1, 8, 8, 16, KVP_ROPE_NEOX);
    std::vector<ref::Inputs> in;
    in.emplace_back(m8, 160, 51, 1.0f);
    for (uint32_t t = 0; t + 3 < 160; t += 7)
        for (uint32_t h : {0u, 1u, 3u, 4u, 5u, 6u, 7u})
            for (uint32_t i = 0; i < 16; ++i) {
                in[0].k[size_t(t) * in[0].nkv + h * 16 + i] *= 6.0f;
                in[0].k[size_t(t + 3) * in[0].nkv + 2 * 16 + i] = 0.0f;
            }
    const Ref r{m8, 30, 2, 4, in};
    size_t bound = 0;
    r.kept_ada(0, 160, 0.0, 66, &bound);
    EXPECT_GT(bound, 0u) << "the reference never reached a head's most";
    const std::string base =
        "policy=triattention budget=30 beta=2 capacity=36 block=1 tri_mode=per_layer_perhead head_budget=ada ada_floor=0";
    for (const char *score : {"float", "fixed"}) {
        std::vector<std::vector<int32_t>> kept[2];
        for (int sel = 0; sel < 2; ++sel) {
            kvp::tri_ada_select = sel == 1;
            ref::Cache c(m8, base + " score=" + score);
            prefill_layers(c, in, 0, 4);
            size_t at_most = 0, prev = 0;
            for (uint32_t t = 4; t < 160; ++t) {
                decode_layers(c, in, t);
                size_t total = 0, top = 0;
                for (uint32_t h = 0; h < 8; ++h) {
                    const size_t g = c.positions(0, h).size() - 4;
                    total += g;
                    top = std::max(top, g);
                }
                if (total < prev + 8) {  // a cut
                    EXPECT_LE(total, 8u * 30) << score << " t " << t;
                    EXPECT_LE(top, 66u) << score << " t " << t;
                    at_most += top == 66;
                }
                prev = total;
            }
            EXPECT_GT(at_most, 0u) << score << ": no head reached its most";
            for (uint32_t h = 0; h < 8; ++h) kept[sel].push_back(c.positions(0, h));
        }
        kvp::tri_ada_select = true;
        EXPECT_EQ(kept[0], kept[1]) << score << ": the selection shortcut kept other tokens than the sort";
    }
    std::vector<std::vector<int32_t>> first;
    for (const char *threads : {" threads=1", " threads=2", " threads=3"}) {
        ref::ForceParallel par(true);
        ref::Cache c(m8, base + " score=fixed" + threads);
        prefill_layers(c, in, 0, 4);
        for (uint32_t t = 4; t < 160; ++t) decode_layers(c, in, t);
        std::vector<std::vector<int32_t>> p;
        for (uint32_t h = 0; h < 8; ++h) p.push_back(c.positions(0, h));
        if (first.empty()) first = p;
        else EXPECT_EQ(p, first) << threads;
    }
    // a state saved between two cuts (the decodes since the last one travel with it) goes on alike
    ref::Cache a(m8, base), b(m8, base);
    prefill_layers(a, in, 0, 4);
    for (uint32_t t = 4; t < 101; ++t) decode_layers(a, in, t);
    a.copy_state_to(b);
    for (uint32_t t = 101; t < 160; ++t) {
        decode_layers(a, in, t);
        decode_layers(b, in, t);
    }
    for (uint32_t h = 0; h < 8; ++h) EXPECT_EQ(b.positions(0, h), a.positions(0, h)) << "head " << h;
}

TEST(TriAttention, GivenStatisticsAreScoredAndKeptAcrossReset) {
    const Geometry geos[] = {{"gptj d8", ref::model(2, 4, 2, 8)}, {"neox partial 8 of 12", ref::model(1, 4, 1, 12, KVP_ROPE_NEOX, 8)}};
    for (const Geometry &g : geos) {
        std::vector<ref::Inputs> in, calib;
        for (uint32_t l = 0; l < g.m.n_layers; ++l) {
            in.emplace_back(g.m, 70, 21 + l, 1.0f);
            calib.emplace_back(g.m, 50, 900 + l, 1.0f);
        }
        for (uint32_t l = 0; l < g.m.n_layers; ++l)  // calibration queries with a bias: not the inputs' statistics
            for (float &x : calib[l].q) x = 0.5f * x + 0.4f;
        Ref r{g.m, 10, 5, 16, in};
        r.calib = &calib;
        for (const char *mode : {"union", "per_layer_perhead"}) {
            ref::Cache c(g.m, std::string("policy=triattention budget=10 beta=5 tri_stats=given tri_mode=") + mode);
            set_calibration(c, r, calib);
            for (int pass = 0; pass < 2; ++pass) {  // the second after kvp_reset: the statistics stay
                prefill_layers(c, in, 0, 16);
                for (uint32_t t = 16; t < 70; ++t) decode_layers(c, in, t);
                for (uint32_t l = 0; l < g.m.n_layers; ++l)
                    for (uint32_t h = 0; h < g.m.n_kv_heads; ++h)
                        EXPECT_EQ(c.positions(l, h), r.kept(mode, l, h, 70)) << g.name << " " << mode << " pass " << pass;
                ASSERT_EQ(kvp_reset(c.c), KVP_OK);
            }
            // online statistics choose otherwise on these rows
            ref::Cache o(g.m, std::string("policy=triattention budget=10 beta=5 tri_mode=") + mode);
            prefill_layers(o, in, 0, 16);
            for (uint32_t t = 16; t < 70; ++t) decode_layers(o, in, t);
            EXPECT_NE(o.positions(0, 0), r.kept(mode, 0, 0, 70)) << g.name << " " << mode;
        }
    }
}

// kvp_query_stats_set refuses bad input with a clear status and changes nothing.
TEST(TriAttention, QueryStatsSetRefusesBadInput) {
    const kvp_model m = ref::model(2, 4, 2, 8);  // GPT-J over all 8 channels: 4 units
    ref::Cache c(m, "policy=triattention budget=8 beta=4 tri_stats=given");
    std::vector<float> mean(8, 0.25f), am(4, 1.0f);
    ASSERT_EQ(kvp_query_stats_set(c.c, 1, 3, mean.data(), am.data(), 4), KVP_OK) << kvp_last_error(c.c);
    std::vector<uint8_t> before(kvp_state_size(c.c)), after(before.size());
    size_t n0 = 0, n1 = 0;
    ASSERT_EQ(kvp_state_save(c.c, before.data(), before.size(), &n0), KVP_OK);
    std::vector<float> nan_mean = mean, neg = am;
    nan_mean[5] = NAN;
    neg[2] = -1.0f;
    struct Bad {
        uint32_t layer, qh, n;
        const float *mean, *am;
        kvp_status st;
        const char *says;
    } bad[] = {
        {0, 0, 4, nullptr, am.data(), KVP_ERR_ARG, "NULL"},
        {0, 0, 4, mean.data(), nullptr, KVP_ERR_ARG, "NULL"},
        {2, 0, 4, mean.data(), am.data(), KVP_ERR_LAYER, "out of range"},
        {0, 4, 4, mean.data(), am.data(), KVP_ERR_LAYER, "out of range"},
        {0, 0, 8, mean.data(), am.data(), KVP_ERR_ARG, "have 4"},
        {0, 0, 4, nan_mean.data(), am.data(), KVP_ERR_NONFINITE, "mean[5]"},
        {0, 0, 4, mean.data(), neg.data(), KVP_ERR_ARG, "negative"},
    };
    for (const Bad &b : bad) {
        EXPECT_EQ(kvp_query_stats_set(c.c, b.layer, b.qh, b.mean, b.am, b.n), b.st) << b.says;
        EXPECT_NE(strstr(kvp_last_error(c.c), b.says), nullptr) << kvp_last_error(c.c);
    }
    ASSERT_EQ(kvp_state_save(c.c, after.data(), after.size(), &n1), KVP_OK);
    EXPECT_EQ(before, after);
    ref::Cache online(m, "policy=triattention budget=8 beta=4");
    EXPECT_EQ(kvp_query_stats_set(online.c, 0, 0, mean.data(), am.data(), 4), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(online.c), "tri_stats=given"), nullptr) << kvp_last_error(online.c);
    ref::Cache h2o(m, "policy=h2o budget=8");
    EXPECT_EQ(kvp_query_stats_set(h2o.c, 0, 0, mean.data(), am.data(), 4), KVP_ERR_UNSUPPORTED);
    EXPECT_EQ(kvp_query_stats_set(nullptr, 0, 0, mean.data(), am.data(), 4), KVP_ERR_ARG);
}

// The modes differ: union keeps one set everywhere, per_head one per KV head, per_layer_perhead
// one per store (on inputs where the heads and layers see different rows).
TEST(TriAttention, ModesShareTheirChoiceAsNamed) {
    const kvp_model m = ref::model(2, 4, 2, 8);
    std::vector<ref::Inputs> in;
    for (uint32_t l = 0; l < m.n_layers; ++l) in.emplace_back(m, 120, 40 + l, 1.0f);
    std::vector<std::vector<int32_t>> sets[3];
    const char *modes[] = {"union", "per_head", "per_layer_perhead"};
    for (int i = 0; i < 3; ++i) {
        ref::Cache c(m, std::string("policy=triattention budget=16 beta=8 tri_mode=") + modes[i]);
        prefill_layers(c, in, 0, 24);
        for (uint32_t t = 24; t < 120; ++t) decode_layers(c, in, t);
        for (uint32_t l = 0; l < m.n_layers; ++l)
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) sets[i].push_back(c.positions(l, h));
    }
    for (const auto &s : sets[0]) EXPECT_EQ(s, sets[0][0]);          // union: (0,0) (0,1) (1,0) (1,1) alike
    EXPECT_EQ(sets[1][0], sets[1][2]);                                // per_head: head 0 in both layers
    EXPECT_EQ(sets[1][1], sets[1][3]);                                // head 1 in both layers
    EXPECT_NE(sets[1][0], sets[1][1]);
    EXPECT_NE(sets[2][0], sets[2][2]);                                // per_layer_perhead: layers differ
}

// The prompt stays; generated tokens never exceed budget + beta and fall to budget at each cut;
// the kept ones are not just the newest (the score chooses).
TEST(TriAttention, KeepsThePromptAndCutsGeneratedTokensEveryBeta) {
    const kvp_model m = ref::model(2, 4, 2, 8);
    const ref::Inputs in(m, 260, 5, 1.0f);
    ref::Cache c(m, "policy=triattention budget=16 beta=8");
    prefill(c, in, 0, 30);
    prefill(c, in, 30, 10, false);  // kvp_append-like: a prefill without queries is prompt too
    uint32_t older = 0;
    for (uint32_t t = 40; t < 260; ++t) {
        decode(c, in, t);
        const uint32_t gen = t - 40 + 1;
        for (uint32_t l = 0; l < m.n_layers; ++l)
            for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                const std::vector<int32_t> p = c.positions(l, h);
                for (int32_t i = 0; i < 40; ++i) ASSERT_EQ(p[size_t(i)], i);
                const size_t g = p.size() - 40;
                ASSERT_LT(g, 16u + 8u);
                if (gen >= 16 + 8) {
                    ASSERT_GE(g, 16u);
                }
                if (gen >= 24 && p[40] < int32_t(t) - 23) ++older;
            }
    }
    EXPECT_GT(older, 0u);
    kvp_layer_stats ls;
    ls.struct_size = sizeof ls;
    ASSERT_EQ(kvp_get_layer_stats(c.c, 0, &ls), KVP_OK);
    EXPECT_GT(ls.tokens_evicted, 0u);
}

// score=fixed: the same tokens for threads 1/2/3 and kv_dtype f32/f16/q8/q4 (the fixed-point key
// copy is scored, whatever the storage), also through a chunked prompt under max_prompt; per_head
// (its heads' choices run in parallel) the same tokens for threads 1/2/3.
TEST(TriAttention, FixedScoresAreTheSameForThreadsAndStorage) {
    const kvp_model m = ref::model(2, 8, 2, 16, KVP_ROPE_NEOX);
    const ref::Inputs in(m, 200, 9, 1.0f);
    std::vector<int32_t> first, first_ph;
    for (const char *extra : {" threads=1", " threads=2", " threads=3", " kv_dtype=f16 threads=2", " kv_dtype=q8",
                              " kv_dtype=q4 threads=3", " kv_rotate=hadamard", " max_prompt=64 threads=2",
                              " tri_mode=per_head threads=1", " tri_mode=per_head threads=2",
                              " tri_mode=per_head threads=3"}) {
        ref::ForceParallel par(true);
        ref::Cache c(m, std::string("policy=triattention budget=20 beta=6 score=fixed") + extra);
        const bool chunked = strstr(extra, "max_prompt") != nullptr;
        if (chunked) {
            for (uint32_t t = 0; t < 48; t += 7) prefill(c, in, t, t + 7 <= 48 ? 7 : 48 - t);
            ASSERT_EQ(kvp_prompt_end(c.c), KVP_OK) << kvp_last_error(c.c);
        } else {
            prefill(c, in, 0, 48);
        }
        for (uint32_t t = 48; t < 200; ++t) decode(c, in, t);
        const std::vector<int32_t> p = all_positions(c, m);
        std::vector<int32_t> &want = strstr(extra, "per_head") ? first_ph : first;  // union (default), per_head
        if (want.empty()) want = p;
        else EXPECT_EQ(p, want) << extra;
    }
}

// union over a shared pool that runs dry: a store evicts by its own scores (self_prune) and holds
// other tokens than the reference store (its extra tokens are evicted at the cut, its missing ones
// take their maximum from the other stores); the stores are scored in parallel, each participant
// into its own maxima, merged: the same tokens for threads 1/2/3.
TEST(TriAttention, UnionOverADryPoolIsTheSameForThreads) {
    const kvp_model m = ref::model(2, 8, 2, 16, KVP_ROPE_NEOX);
    const ref::Inputs in(m, 200, 17, 1.0f);
    std::vector<int32_t> first;
    bool diverged = false;
    for (const char *threads : {" threads=1", " threads=2", " threads=3"}) {
        ref::ForceParallel par(true);
        ref::Cache c(m, std::string("policy=triattention budget=20 beta=6 score=fixed total_capacity=130") + threads);
        prefill(c, in, 0, 48);
        for (uint32_t t = 48; t < 200; ++t) {
            decode(c, in, t);
            diverged = diverged || c.positions(0, 0) != c.positions(1, 0) || c.positions(0, 0) != c.positions(0, 1);
        }
        const std::vector<int32_t> p = all_positions(c, m);
        if (first.empty()) first = p;
        else EXPECT_EQ(p, first) << threads;
    }
    EXPECT_TRUE(diverged) << "the pool never ran dry: no store held other tokens";
}

// A state saved mid-generation and loaded into a fresh cache goes on as the saved one would (the
// query statistics travel in the policy's state region).
TEST(TriAttention, LoadedStateGoesOnAsTheSavedOne) {
    const kvp_model m = ref::model(2, 4, 2, 8);
    const ref::Inputs in(m, 220, 13, 1.0f);
    for (const char *spec : {"policy=triattention budget=10 beta=4", "policy=triattention budget=10 beta=4 score=fixed kv_dtype=q8"}) {
        ref::Cache a(m, spec);
        prefill(a, in, 0, 32);
        for (uint32_t t = 32; t < 100; ++t) decode(a, in, t);
        ref::Cache b(m, spec);
        a.copy_state_to(b);
        for (uint32_t t = 100; t < 220; ++t) {
            decode(a, in, t);
            decode(b, in, t);
        }
        EXPECT_EQ(all_positions(a, m), all_positions(b, m)) << spec;
        // without the statistics (a fresh cache given the same tokens as a prompt) the choice differs
    }
}

// Drafts work at the default capacity: a committed draft's tokens are prompt (kept).
TEST(TriAttention, DraftsWorkAtTheDefaultCapacity) {
    const kvp_model m = ref::model(2, 4, 2, 8);
    const ref::Inputs in(m, 120, 17, 1.0f);
    ref::Cache c(m, "policy=triattention budget=16 beta=4 max_draft=4");
    prefill(c, in, 0, 16);
    for (uint32_t t = 16; t < 60; ++t) decode(c, in, t);
    const size_t before = c.positions(0, 0).size();
    ASSERT_EQ(kvp_draft_begin(c.c), KVP_OK) << kvp_last_error(c.c);
    std::vector<float> out(size_t(4) * in.nq);
    for (uint32_t l = 0; l < m.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, 4, nullptr, in.qt(60), in.kt(60), in.vt(60), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
    ASSERT_EQ(kvp_draft_commit(c.c, 3), KVP_OK) << kvp_last_error(c.c);
    EXPECT_EQ(c.positions(0, 0).size(), before + 3);
    for (uint32_t t = 63; t < 100; ++t) decode(c, in, t);
    EXPECT_LT(c.positions(0, 0).size(), 16u + 3u + 16u + 4u);
}

TEST(TriAttention, ConfigErrors) {
    const kvp_model m = ref::model(2, 4, 2, 8);
    kvp_config cfg;
    char err[256] = "";
    struct Bad {
        const char *spec, *says;
    } bad[] = {
        {"policy=triattention positions=realign", "realign"},
        {"policy=triattention kv_dtype=q8", "score=fixed"},
        {"policy=triattention budget=16 beta=8 capacity=20", "budget+beta"},
        {"policy=triattention beta=2.5", "whole number"},
        {"policy=think token_policy=triattention", "token_policy"},
        {"policy=triattention window=8", "window"},
    };
    for (const Bad &b : bad) {
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        EXPECT_EQ(kvp_config_apply(&cfg, b.spec, err, sizeof err), KVP_ERR_CONFIG) << b.spec;
        EXPECT_NE(strstr(err, b.says), nullptr) << b.spec << ": " << err;
    }
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=triattention compression_ratio=0.75 ratio_tokens=64", err, sizeof err), KVP_OK)
        << err;
    EXPECT_EQ(cfg.budget, 16u);
    EXPECT_EQ(cfg.beta, 128.0f);  // beta follows the policy: 128 for triattention unless given
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=triattention beta=20", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(cfg.beta, 20.0f);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=pyramidkv", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(cfg.beta, 20.0f);
    ref::Cache c(m, "policy=triattention kv_dtype=q4 score=fixed budget=64 beta=32");
    EXPECT_EQ(kvp_layer_capacity(c.c, 0), 64u + 32u + 2048u);
}

}  // namespace
