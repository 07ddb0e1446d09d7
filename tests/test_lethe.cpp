// Lethe (src/policies/lethe.h): the kept tokens after every prefill and decode step against an
// independent double simulation written here from the explicit q/k inputs (RASR decayed layer
// scores summed over all query heads, the segmented breakpoint with tau, L_evict raised or
// doubled, sinks and recent tokens kept, the hard capacity), every KV head keeping the same
// tokens, kvp_get_layer_stats (evict_threshold, sparsity), a shared pool where the layers'
// sparsity decides where the blocks go, threads and config errors.
#include <gtest/gtest.h>
#include <math.h>

#include <algorithm>
#include <functional>
#include <set>

#include "cache.h"
#include "config_support.h"
#include "reference.h"

namespace {

struct Inputs : ref::Inputs {
    using ref::Inputs::Inputs;
    // Heavy hitters: key `t` of every KV head points along the last dimension (in the slowest
    // RoPE pair, so the logit hardly rotates over a few hundred positions) with norm `a`, and
    // every query looks along it with weight `b` (the rest scaled down): they take most of the
    // attention.
    void heavy(uint32_t t, float a) {
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) k[size_t(t) * nkv + h * m.head_dim + m.head_dim - 1] = a;
    }
    void queries_along_e0(float b, float rest) {
        for (size_t i = 0; i < q.size(); ++i) q[i] = (i % m.head_dim == m.head_dim - 1) ? b : q[i] * rest;
    }
};

struct Params {
    uint32_t cap, Le0, sinks, segments, obs;
    double tau, recent_ratio, decay;
};

// The rule in double, for one layer.
struct Sim {
    Params p;
    uint32_t Le;
    std::vector<uint32_t> kept;
    std::vector<double> score;
    uint32_t rounds = 0, found = 0, doubled = 0, hard = 0, raised = 0;
    explicit Sim(const Params &pp) : p(pp), Le(pp.Le0) {}

    // Adds the weights of every query head at token t over the kept tokens <= t.
    void accumulate(const Inputs &in, uint32_t t) {
        std::vector<uint32_t> idx;
        for (uint32_t x : kept)
            if (x <= t) idx.push_back(x);
        std::vector<int64_t> kp(idx.begin(), idx.end());
        for (uint32_t hq = 0; hq < in.m.n_q_heads; ++hq) {
            const std::vector<double> w =
                ref::weights(in.m, hq, &in.q[size_t(t) * in.nq + size_t(hq) * in.m.head_dim], t, in.k.data(), idx, kp);
            for (size_t j = 0; j < idx.size(); ++j) score[j] += w[j];
        }
    }
    bool lower(uint32_t a, uint32_t b) const { return score[a] < score[b] || (score[a] == score[b] && a < b); }
    void erase(const std::set<uint32_t> &gone) {
        std::vector<uint32_t> k2;
        std::vector<double> s2;
        for (uint32_t j = 0; j < kept.size(); ++j)
            if (!gone.count(j)) {
                k2.push_back(kept[j]);
                s2.push_back(score[j]);
            }
        kept.swap(k2);
        score.swap(s2);
    }
    // n lowest of [from, to) by the ranking
    std::vector<uint32_t> lowest(uint32_t from, uint32_t to, uint32_t n) const {
        std::vector<uint32_t> c;
        for (uint32_t j = from; j < to; ++j) c.push_back(j);
        std::sort(c.begin(), c.end(), [&](uint32_t a, uint32_t b) { return lower(a, b); });
        c.resize(std::min<size_t>(n, c.size()));
        return c;
    }
    // After a step's scores were added.
    void rule() {
        const uint32_t L = uint32_t(kept.size()), T = std::min(Le, p.cap - 1);
        if (L > T) {
            ++rounds;
            const uint32_t S = std::min(p.sinks, L), R = uint32_t(std::min<double>(floor(p.recent_ratio * L), L));
            if (L > Le) {
                bool ok = false;
                uint32_t bp = 0;
                if (L >= S + R && L - S - R > 0) {
                    const uint32_t K = L - S - R;
                    std::vector<double> v(score.begin() + S, score.begin() + S + K);
                    std::sort(v.begin(), v.end(), std::greater<double>());
                    for (uint32_t d = 1; d < p.segments && v[0] > 0; ++d) {
                        const uint32_t c = uint32_t(uint64_t(K) * d / p.segments);
                        if (v[0] / v[c] >= p.tau) {
                            bp = c;
                            ok = true;
                            break;
                        }
                    }
                    if (ok) {
                        const std::vector<uint32_t> g = lowest(S, L - R, K - bp);
                        erase(std::set<uint32_t>(g.begin(), g.end()));
                        raised += bp + R > Le;
                        Le = std::max<uint32_t>(Le, bp + R);
                        ++found;
                    }
                }
                if (!ok) {
                    Le = Le >= 0x40000000u ? 0x80000000u : 2 * Le;
                    ++doubled;
                }
            }
            const uint32_t L2 = uint32_t(kept.size());
            if (L2 > p.cap - 1) {
                ++hard;
                const uint32_t R2 = uint32_t(std::min<double>(floor(p.recent_ratio * L2), L2));
                const uint32_t S2 = std::min(p.sinks, L2), end = L2 - R2 > S2 ? L2 - R2 : S2;
                uint32_t need = L2 - (p.cap - 1);
                std::vector<uint32_t> g = lowest(S2, end, need);
                if (g.size() < need) {
                    const std::vector<uint32_t> g2 = lowest(end, L2, need - uint32_t(g.size()));
                    g.insert(g.end(), g2.begin(), g2.end());
                }
                if (g.size() < need) {
                    const std::vector<uint32_t> g3 = lowest(0, S2, need - uint32_t(g.size()));
                    g.insert(g.end(), g3.begin(), g3.end());
                }
                erase(std::set<uint32_t>(g.begin(), g.end()));
            }
        }
        for (double &s : score) s *= p.decay;
    }
    void decode(const Inputs &in, uint32_t t) {
        kept.push_back(t);
        score.push_back(0.0);
        accumulate(in, t);
        rule();
    }
    void prefill(const Inputs &in, uint32_t t0, uint32_t n) {
        for (uint32_t i = 0; i < n; ++i) {
            kept.push_back(t0 + i);
            score.push_back(0.0);
        }
        for (uint32_t i = n - std::min(p.obs, n); i < n; ++i) accumulate(in, t0 + i);
        rule();
    }
};

std::string spec_of(const Params &p, const std::string &extra) {
    char buf[256];
    snprintf(buf, sizeof buf,
             "policy=lethe capacity=%u evict_threshold=%u sinks=%u segments=%u obs_window=%u sparse_ratio=%g "
             "recent_ratio=%g decay=%g ",
             p.cap, p.Le0, p.sinks, p.segments, p.obs, p.tau, p.recent_ratio, p.decay);
    return buf + extra;
}

// The library's kept set equals the simulation's, or differs only by near ties in score (every
// token it kept instead is within tol of every token it dropped, relative to the top score):
// adopted then. Every KV head keeps the same tokens.
void compare(const ref::Cache &c, Sim &sim, const Sim &before_rule, double tol, uint32_t *ties, const char *when,
             uint32_t t) {
    const std::vector<int32_t> lib = c.positions(0, 0);
    for (uint32_t h = 1; h < c.c->cfg.model.n_kv_heads; ++h) ASSERT_EQ(c.positions(0, h), lib) << when << " t=" << t;
    if (std::vector<int32_t>(sim.kept.begin(), sim.kept.end()) == lib) return;
    // near tie: same length, and the scores (before the decay) of the swapped tokens are close
    ASSERT_EQ(lib.size(), sim.kept.size()) << when << " t=" << t;
    const std::set<int32_t> L(lib.begin(), lib.end()), S(sim.kept.begin(), sim.kept.end());
    double top = 0;
    for (double s : before_rule.score) top = std::max(top, s);
    double min_lib_only = INFINITY, max_sim_only = -INFINITY;
    for (size_t j = 0; j < before_rule.kept.size(); ++j) {
        const int32_t x = int32_t(before_rule.kept[j]);
        if (L.count(x) && !S.count(x)) min_lib_only = std::min(min_lib_only, before_rule.score[j]);
        if (S.count(x) && !L.count(x)) max_sim_only = std::max(max_sim_only, before_rule.score[j]);
    }
    ASSERT_LE(fabs(min_lib_only - max_sim_only), tol * std::max(top, 1.0)) << when << " t=" << t;
    Sim adopted = sim;
    adopted.kept.clear();
    adopted.score.clear();
    for (size_t j = 0; j < before_rule.kept.size(); ++j)
        if (L.count(int32_t(before_rule.kept[j]))) {
            adopted.kept.push_back(before_rule.kept[j]);
            adopted.score.push_back(before_rule.score[j] * sim.p.decay);
        }
    sim.kept = adopted.kept;
    sim.score = adopted.score;
    ++*ties;
}

// One layer: prefill P, decode to T; kept sets and L_evict after every call.
Sim run_sim(const Inputs &in, const Params &p, uint32_t P, const std::string &extra = "") {
    ref::Cache c(in.m, spec_of(p, extra));
    Sim sim(p);
    EXPECT_NE(c.c, nullptr);
    if (!c.c) return sim;
    std::vector<float> out(size_t(std::max(P, 1u)) * in.nq);
    uint32_t ties = 0;
    const double tol = 1e-5;
    kvp_layer_stats ls;
    ls.struct_size = sizeof ls;
    EXPECT_EQ(kvp_get_layer_stats(c.c, 0, &ls), KVP_OK);
    EXPECT_EQ(ls.evict_threshold, p.Le0);
    if (P) {
        EXPECT_EQ(kvp_prefill(c.c, 0, P, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        Sim pre = sim;
        for (uint32_t i = 0; i < P; ++i) {
            pre.kept.push_back(i);
            pre.score.push_back(0.0);
        }
        for (uint32_t i = P - std::min(p.obs, P); i < P; ++i) pre.accumulate(in, i);
        sim.prefill(in, 0, P);
        compare(c, sim, pre, tol, &ties, "prefill", P);
    }
    for (uint32_t t = P; t < in.T; ++t) {
        EXPECT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << kvp_last_error(c.c);
        Sim pre = sim;
        pre.kept.push_back(t);
        pre.score.push_back(0.0);
        pre.accumulate(in, t);
        sim.decode(in, t);
        compare(c, sim, pre, tol, &ties, "decode", t);
        if (::testing::Test::HasFatalFailure()) return sim;
        EXPECT_EQ(kvp_get_layer_stats(c.c, 0, &ls), KVP_OK);
        EXPECT_EQ(ls.evict_threshold, sim.Le) << "t=" << t;
        EXPECT_EQ(ls.len, sim.kept.size());
        EXPECT_LE(ls.len, p.cap - 1);
        // sinks and the recent tokens are never evicted by a round (only the hard cap could)
        const uint32_t S = std::min<uint32_t>(p.sinks, t + 1);
        for (uint32_t j = 0; j < S && sim.hard == 0; ++j) EXPECT_EQ(sim.kept[j], j);
        if (p.recent_ratio * double(sim.kept.size()) >= 2.0) {
            EXPECT_EQ(sim.kept.back(), t);
        }
    }
    EXPECT_LE(ties, (in.T - P) / 20 + 1);
    return sim;
}

// A sparse layer: a few heavy hitters take most of the attention, so scores fall by more than
// tau within the first segment: breakpoints are found, the layer shrinks and L_evict rises.
TEST(Lethe, SparseLayerFindsBreakpoints) {
    Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 400, 1, 1.0f);
    in.queries_along_e0(3.0f, 0.3f);
    for (uint32_t t : {1u, 7u, 30u, 55u, 120u, 121u, 200u, 310u}) in.heavy(t, 10.0f);
    const Params p{160, 60, 2, 10, 8, 50.0, 0.3, 0.9};
    const Sim s = run_sim(in, p, 40);
    EXPECT_GT(s.found, 3u);
    EXPECT_LT(s.kept.size(), 60u);
}

// Many heavy tokens (every other one) and a prompt far past L_evict: the breakpoint falls late
// (about half the candidates), so bp + recent exceeds L_evict and raises it. (Within decode a
// round starts at L = L_evict + 1, where bp + recent <= 0.9 K + R < L_evict: only a prefill, or a
// pool-bound layer, can raise it.)
TEST(Lethe, ManyHeavyTokensRaiseTheThreshold) {
    Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 200, 7, 1.0f);
    in.queries_along_e0(3.0f, 0.3f);
    for (uint32_t t = 0; t < 200; t += 2) in.heavy(t, 10.0f);
    const Params p{200, 10, 2, 10, 8, 50.0, 0.3, 0.9};
    const Sim s = run_sim(in, p, 120);
    EXPECT_GE(s.raised, 1u);
    EXPECT_GT(s.Le, 40u);
    EXPECT_GE(s.found, 1u);
}

// Uniform attention (q = 0): no breakpoint (scores never fall by tau): L_evict doubles, then the
// hard capacity binds at every step (the lowest-ranked candidate goes).
TEST(Lethe, DenseLayerDoublesThenCapacityBinds) {
    Inputs in(ref::model(1, 2, 1, 8, KVP_ROPE_GPTJ), 160, 2, 1.0f);
    for (float &x : in.q) x = 0.0f;
    const Params p{48, 12, 4, 10, 4, 400.0, 0.3, 0.9};
    const Sim s = run_sim(in, p, 0);
    EXPECT_GE(s.doubled, 2u);  // 12 -> 24 -> 48
    EXPECT_EQ(s.found, 0u);
    EXPECT_GT(s.hard, 100u);
    EXPECT_EQ(s.Le, 48u);
    EXPECT_EQ(s.kept.size(), 47u);
}

// Random attention, GQA 4:1, NEOX, a prefill larger than the threshold: all paths mixed.
TEST(Lethe, RandomWorkloadMatchesSimulation) {
    Inputs in(ref::model(1, 8, 2, 16, KVP_ROPE_NEOX), 300, 3, 2.5f);
    const Params p{96, 30, 4, 8, 16, 20.0, 0.25, 0.8};
    const Sim s = run_sim(in, p, 50);
    EXPECT_GT(s.rounds, 10u);
}

// Small tau: breakpoints at the first cut; recent_ratio 0 and no sinks: only the top tokens.
TEST(Lethe, TauOneKeepsTheFirstCut) {
    Inputs in(ref::model(1, 2, 2, 8, KVP_ROPE_NONE), 200, 4, 2.0f);
    const Params p{64, 20, 0, 4, 4, 1.0, 0.0, 0.5};
    const Sim s = run_sim(in, p, 0);
    EXPECT_GT(s.found, 5u);
}

// Fixed-point scores follow the same rule (decisions compared with the float run: they agree on
// most steps; exact integer behaviour is tested in test_fixed.cpp), and stats report the layer's
// threshold and Hoyer sparsity.
TEST(Lethe, StatsReportThresholdAndSparsity) {
    Inputs in(ref::model(2, 4, 2, 16, KVP_ROPE_GPTJ), 200, 5, 1.0f);
    in.queries_along_e0(3.0f, 0.3f);
    for (uint32_t t : {3u, 40u, 90u}) in.heavy(t, 10.0f);
    ref::Cache c(in.m, "policy=lethe capacity=100 sparse_ratio=50 sinks=2");
    kvp_layer_stats ls;
    ls.struct_size = sizeof ls;
    ASSERT_EQ(kvp_get_layer_stats(c.c, 1, &ls), KVP_OK);
    EXPECT_EQ(ls.evict_threshold, 50u);  // capacity / 2
    EXPECT_EQ(ls.capacity, 100u);
    std::vector<float> out(in.nq);
    for (uint32_t t = 0; t < 200; ++t)
        for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
    ASSERT_EQ(kvp_get_layer_stats(c.c, 1, &ls), KVP_OK);
    EXPECT_GT(ls.sparsity, 0.3f);
    EXPECT_LE(ls.sparsity, 1.0f);
    EXPECT_GT(ls.prune_events, 0u);
    EXPECT_EQ(ls.lazy, -1);
    ASSERT_EQ(kvp_reset(c.c), KVP_OK);
    ASSERT_EQ(kvp_get_layer_stats(c.c, 1, &ls), KVP_OK);
    EXPECT_EQ(ls.evict_threshold, 50u);  // reset restores the initial threshold
    EXPECT_EQ(ls.len, 0u);
}

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// 4 layers: layers 0 and 2 sparse (heavy hitters, queries along e0), 1 and 3 dense (q = 0).
struct Mixed {
    kvp_model m = ref::model(4, 4, 2, 16, KVP_ROPE_GPTJ);
    std::vector<Inputs> per_layer;
    explicit Mixed(uint32_t T = 360) {
        for (uint32_t l = 0; l < 4; ++l) {
            per_layer.emplace_back(m, T, 10 + l, 1.0f);
            Inputs &in = per_layer.back();
            if (l % 2 == 0) {
                in.queries_along_e0(3.0f, 0.3f);
                for (uint32_t t = 5; t < T; t += 37) in.heavy(t, 10.0f);
            } else {
                for (float &x : in.q) x = 0.0f;
            }
        }
    }
};

uint64_t run_mixed(const Mixed &w, const std::string &spec, const std::function<void(kvp_cache *, uint32_t)> &each = nullptr) {
    ref::Cache c(w.m, spec);
    if (!c.c) return 0;
    std::vector<float> out(size_t(40) * w.per_layer[0].nq);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t l = 0; l < 4; ++l) {
        const Inputs &in = w.per_layer[l];
        EXPECT_EQ(kvp_prefill(c.c, l, 40, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << spec << ": " << kvp_last_error(c.c);
        h = fnv(h, out.data(), out.size() * sizeof(float));
    }
    for (uint32_t t = 40; t < w.per_layer[0].T; ++t) {
        for (uint32_t l = 0; l < 4; ++l) {
            const Inputs &in = w.per_layer[l];
            EXPECT_EQ(kvp_decode(c.c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << spec << ": " << kvp_last_error(c.c);
            h = fnv(h, out.data(), size_t(in.nq) * sizeof(float));
            const std::vector<int32_t> p0 = c.positions(l, 0);
            EXPECT_EQ(c.positions(l, 1), p0) << spec;  // the heads of a layer keep the same tokens
            h = fnv(h, p0.data(), p0.size() * sizeof(int32_t));
        }
        if (each) each(c.c, t);
    }
    return h;
}

// With a shared pool (total_capacity = half the sum of the capacities) the sparse layers keep
// few tokens and the dense layers take the blocks they free: the arena is smaller by the blocks
// saved, every call succeeds, live bytes stay within the pool, and the dense layers hold far
// more than the sparse ones.
TEST(Lethe, SharedPoolGivesTheDenseLayersTheMemory) {
    const Mixed w;
    const std::string base = "policy=lethe capacity=160 evict_threshold=32 sparse_ratio=50 sinks=2 recent_ratio=0.2";
    ref::Cache unshared(w.m, base), shared(w.m, base + " total_capacity=320");
    EXPECT_LT(shared.bytes + 300u * 2 * 2 * 16 * 4, unshared.bytes);  // >= 300 token slots x 2 KV heads fewer
    uint64_t pool_bytes = 0, max_live = 0;
    std::vector<uint32_t> len(4);
    run_mixed(w, base + " total_capacity=320", [&](kvp_cache *c, uint32_t) {
        kvp_stats s;
        s.struct_size = sizeof s;
        kvp_get_stats(c, &s);
        max_live = std::max(max_live, s.live_bytes);
        pool_bytes = uint64_t(c->plan.nblocks) * c->plan.block * 2 * kvp::token_bytes(c);
        for (uint32_t l = 0; l < 4; ++l) len[l] = kvp_layer_len(c, l);
        if (getenv("LETHE_DEBUG")) {
            printf("%u:", unsigned(s.tokens_seen));
            for (uint32_t l = 0; l < 4; ++l) {
                kvp_layer_stats ls;
                ls.struct_size = sizeof ls;
                kvp_get_layer_stats(c, l, &ls);
                printf(" [%u %u %.2f]", ls.len, ls.evict_threshold, ls.sparsity);
            }
            printf("\n");
        }
    });
    EXPECT_LE(max_live, pool_bytes);
    EXPECT_GT(len[1] + len[3], 2 * (len[0] + len[2])) << len[0] << " " << len[1] << " " << len[2] << " " << len[3];
    EXPECT_GT(len[1], 100u);
    EXPECT_LT(len[0], 60u);
}

TEST(Lethe, SameBitsForThreads123PositionsAndPools) {
    const Mixed w(160);
    // total_capacity=200 of 4 x 96: the pool binds; each pair of position mode, pool and score covered
    for (const char *combo : {"positions=original score=float", "positions=realign total_capacity=200 score=fixed",
                              "positions=original total_capacity=200 score=fixed", "positions=realign score=float"}) {
        const std::string base = std::string("policy=lethe capacity=96 evict_threshold=24 sparse_ratio=50 sinks=2 ") + combo;
        const uint64_t h1 = run_mixed(w, base + " threads=1");
        EXPECT_EQ(run_mixed(w, base + " threads=2"), h1) << base;
        EXPECT_EQ(run_mixed(w, base + " threads=3"), h1) << base;
    }
}

// Realign: outputs equal a double attention at cache-relative positions after many rounds.
TEST(Lethe, RealignOutputsMatchReference) {
    Inputs in(ref::model(1, 4, 2, 16, KVP_ROPE_GPTJ), 300, 6, 2.5f);
    ref::Cache c(in.m, "policy=lethe capacity=64 sparse_ratio=5 sinks=2 positions=realign");
    std::vector<float> out(in.nq);
    double worst = 0;
    uint32_t rounds = 0;
    for (uint32_t t = 0; t < in.T; ++t) {
        const std::vector<int32_t> before = c.positions(0, 0);
        ASSERT_EQ(kvp_decode(c.c, 0, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK);
        std::vector<uint32_t> idx(before.begin(), before.end());
        idx.push_back(t);
        std::vector<int64_t> kp(idx.size());
        for (size_t j = 0; j < kp.size(); ++j) kp[j] = int64_t(j);
        std::vector<double> expect;
        ref::attend(in.m, in.qt(t), int64_t(idx.size()) - 1, in.k.data(), in.v.data(), idx, kp, expect);
        for (size_t i = 0; i < expect.size(); ++i) worst = std::max(worst, fabs(expect[i] - double(out[i])));
    }
    kvp_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(kvp_get_stats(c.c, &st), KVP_OK);
    rounds = uint32_t(st.prune_events);
    EXPECT_LT(worst, 1e-5);
    EXPECT_GT(rounds, 5u);
    const std::vector<int32_t> p = c.positions(0, 0);
    EXPECT_GT(p.back() - p.front() + 1, int32_t(p.size()) + 10);  // scattered evictions
}

TEST(LetheConfig, ErrorsNameTheKey) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    const struct {
        const char *spec;
        const char *needle;
    } bad[] = {{"policy=lethe capacity=1", "capacity"},
               {"policy=lethe segments=1", "segments"},
               {"policy=lethe sparse_ratio=0.5", "sparse_ratio"},
               {"policy=lethe recent_ratio=1.5", "recent_ratio"},
               {"policy=lethe decay=-0.1", "decay"},
               {"policy=lethe evict_threshold=-1", "evict_threshold"},
               {"policy=lethe evict_threshold=999999999999", "evict_threshold"},
               {"policy=lethe budget=200000000", "capacity"}};
    for (const auto &b : bad) ref::expect_config_rejected(cfg, b.spec, b.needle);
}

}  // namespace
