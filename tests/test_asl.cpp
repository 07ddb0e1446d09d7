// ASL (src/policies/asl.h): q/k built so that every layer ranks the prompt by a chosen
// permutation; the rank variance and relative variance the cache computes against an
// independent computation here; the selection layer moves deeper when the ranks stabilise
// later; the selection holds the top-k and the window; later layers hold exactly the selected
// tokens at their original positions; no qualifying layer = snapkv everywhere; the too-small
// kvp_selection error (status, message, sel->n, cache unchanged); the same bits for threads 1/2/3.
#include <gtest/gtest.h>
#include <math.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cache.h"
#include "policies/asl.h"
#include "reference.h"

namespace {

constexpr uint32_t kLayers = 7, kHd = 8, kN = 64, kW = 8, kBudget = 24, kP = kN - kW, kK = kBudget - kW;

// Per layer: prefix token t gets key c * e0 with c = 0.05 * perm[t]; window keys are 0; every
// query is 4 * e0. The window's votes then order the prefix exactly by perm (higher first).
struct Prompt {
    std::vector<std::vector<uint32_t>> perm;  // [layer][t < kP]
    std::vector<std::vector<float>> q, k, v;  // [layer][kN][2 heads][kHd]
};

Prompt make_prompt(uint32_t stable_from, uint64_t seed) {
    Prompt p;
    ref::Rng rng(seed);
    std::vector<uint32_t> fixed(kP);
    for (uint32_t t = 0; t < kP; ++t) fixed[t] = t;
    for (uint32_t t = kP - 1; t > 0; --t) std::swap(fixed[t], fixed[rng.next() % (t + 1)]);
    for (uint32_t l = 0; l < kLayers; ++l) {
        std::vector<uint32_t> perm = fixed;
        if (l < stable_from)
            for (uint32_t t = kP - 1; t > 0; --t) std::swap(perm[t], perm[rng.next() % (t + 1)]);
        p.perm.push_back(perm);
        std::vector<float> q(size_t(kN) * 2 * kHd, 0.0f), k(q.size(), 0.0f), v(q.size());
        rng.fill(v);
        for (uint32_t t = 0; t < kN; ++t)
            for (uint32_t h = 0; h < 2; ++h) {
                q[(size_t(t) * 2 + h) * kHd] = 4.0f;
                if (t < kP) k[(size_t(t) * 2 + h) * kHd] = 0.05f * float(perm[t]);
            }
        p.q.push_back(q);
        p.k.push_back(k);
        p.v.push_back(v);
    }
    return p;
}

// rank 0 = the highest perm value
std::vector<uint32_t> ranks_of(const std::vector<uint32_t> &perm) {
    std::vector<uint32_t> r(kP);
    for (uint32_t t = 0; t < kP; ++t) r[t] = kP - 1 - perm[t];
    return r;
}

// Mean over the union of the layers' top-k of the population variance of each token's ranks.
double variance(const Prompt &p, uint32_t first, uint32_t last) {
    std::vector<std::vector<uint32_t>> rk;
    for (uint32_t l = first; l <= last; ++l) rk.push_back(ranks_of(p.perm[l]));
    double sum = 0.0;
    uint32_t count = 0;
    for (uint32_t t = 0; t < kP; ++t) {
        bool top = false;
        for (const auto &r : rk) top = top || r[t] < kK;
        if (!top) continue;
        double mean = 0.0, var = 0.0;
        for (const auto &r : rk) mean += r[t];
        mean /= double(rk.size());
        for (const auto &r : rk) var += (r[t] - mean) * (r[t] - mean);
        sum += var / double(rk.size());
        ++count;
    }
    return sum / count;
}

struct Outcome {
    int32_t sel_layer = -1;
    std::vector<int32_t> sel;
};

std::string spec(const std::string &extra) {
    return "policy=asl budget=" + std::to_string(kBudget) + " obs_window=" + std::to_string(kW) +
           " pool_kernel=1 pool=avg asl_min_layer=1 asl_obs_layers=2 asl_tau=0.3 " + extra;
}

// An empty kvp_selection over idx (capacity kN).
kvp_selection selection_into(std::vector<int32_t> &idx) {
    kvp_selection sel;
    memset(&sel, 0, sizeof sel);
    sel.struct_size = sizeof sel;
    sel.capacity = kN;
    sel.indices = idx.data();
    return sel;
}

// Prefills every layer as the harness does: the whole prompt until a selection, then only the
// selected tokens at their original positions.
Outcome prefill_all(ref::Cache &c, const Prompt &p) {
    Outcome r;
    std::vector<int32_t> idx(kN);
    std::vector<float> out(size_t(kN) * 2 * kHd);
    for (uint32_t l = 0; l < kLayers; ++l) {
        kvp_selection sel = selection_into(idx);
        if (r.sel_layer < 0) {
            EXPECT_EQ(kvp_prefill(c.c, l, kN, nullptr, p.q[l].data(), p.k[l].data(), p.v[l].data(), out.data(), &sel),
                      KVP_OK) << kvp_last_error(c.c);
            if (sel.selected) {
                r.sel_layer = int32_t(l);
                r.sel.assign(idx.begin(), idx.begin() + sel.n);
            } else {
                EXPECT_EQ(sel.n, 0u);
            }
            continue;
        }
        const uint32_t m = uint32_t(r.sel.size());
        std::vector<float> q, k, v;
        for (int32_t t : r.sel) {
            const size_t off = size_t(t) * 2 * kHd;
            q.insert(q.end(), p.q[l].begin() + off, p.q[l].begin() + off + 2 * kHd);
            k.insert(k.end(), p.k[l].begin() + off, p.k[l].begin() + off + 2 * kHd);
            v.insert(v.end(), p.v[l].begin() + off, p.v[l].begin() + off + 2 * kHd);
        }
        EXPECT_EQ(kvp_prefill(c.c, l, m, r.sel.data(), q.data(), k.data(), v.data(), out.data(), &sel), KVP_OK)
            << kvp_last_error(c.c);
        EXPECT_EQ(sel.selected, 0);
    }
    return r;
}

TEST(Asl, VarianceMatchesAnIndependentComputation) {
    const kvp_model m = ref::model(kLayers, 2, 2, kHd, KVP_ROPE_NONE);
    const Prompt p = make_prompt(3, 11);
    ref::Cache c(m, spec(""));
    const Outcome r = prefill_all(c, p);
    ASSERT_EQ(r.sel_layer, 4);  // layers 3 and 4 share their ranks
    const double ref_v = variance(p, 0, 1);
    ASSERT_GT(ref_v, 0.0);
    for (uint32_t l = 1; l <= 4; ++l) {
        double var = -1, rel = -1;
        ASSERT_TRUE(kvp::asl_layer_variance(c.c, l, &var, &rel));
        const double want = variance(p, l - 1, l);
        EXPECT_NEAR(var, want, 1e-9 * (1 + want)) << l;
        EXPECT_NEAR(rel, want / ref_v, 1e-12) << l;
    }
    EXPECT_EQ(kvp::asl_selection_layer(c.c), 4);
    double var = 0, rel = 0;
    ASSERT_TRUE(kvp::asl_layer_variance(c.c, 0, &var, &rel));  // before asl_min_layer: none
    EXPECT_TRUE(isnan(var));
}

TEST(Asl, SelectionLayerMovesDeeperWhenRanksStabiliseLater) {
    const kvp_model m = ref::model(kLayers, 2, 2, kHd, KVP_ROPE_NONE);
    int32_t prev = -1;
    for (uint32_t s = 2; s <= 5; ++s) {
        const Prompt p = make_prompt(s, 100 + s);
        ref::Cache c(m, spec(""));
        const Outcome r = prefill_all(c, p);
        EXPECT_EQ(r.sel_layer, int32_t(s) + 1) << s;
        EXPECT_GT(r.sel_layer, prev);
        prev = r.sel_layer;
    }
}

TEST(Asl, SelectionIsTopKPlusWindowAndLaterLayersHoldIt) {
    const kvp_model m = ref::model(kLayers, 2, 2, kHd, KVP_ROPE_NONE);
    const Prompt p = make_prompt(2, 5);
    for (const char *pos : {"positions=original"}) {  // rope=none: positions=realign is refused (issue 21)
        ref::Cache c(m, spec(pos));
        const Outcome r = prefill_all(c, p);
        ASSERT_EQ(r.sel_layer, 3) << pos;
        ASSERT_EQ(r.sel.size(), size_t(kBudget));
        std::vector<int32_t> want;
        const std::vector<uint32_t> rk = ranks_of(p.perm[3]);
        for (uint32_t t = 0; t < kP; ++t)
            if (rk[t] < kK) want.push_back(int32_t(t));
        for (uint32_t t = kP; t < kN; ++t) want.push_back(int32_t(t));  // the window
        EXPECT_EQ(r.sel, want) << pos;
        for (uint32_t l = 0; l < kLayers; ++l) {
            kvp_layer_stats s;
            s.struct_size = sizeof s;
            ASSERT_EQ(kvp_get_layer_stats(c.c, l, &s), KVP_OK);
            EXPECT_EQ(s.len, kBudget) << l;  // snapkv to budget up to the selection layer, the selection after it
            if (l > 3) {
                for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(c.positions(l, h), want) << l << " " << pos;
            }
        }
        // decoding continues after the last prompt position on every layer
        std::vector<float> o(2 * kHd);
        for (uint32_t l = 0; l < kLayers; ++l)
            ASSERT_EQ(kvp_decode(c.c, l, p.q[l].data(), p.k[l].data(), p.v[l].data(), o.data()), KVP_OK);
        EXPECT_EQ(c.positions(kLayers - 1, 0).back(), int32_t(kN));
    }
}

// Under max_prompt (issue 28) the selection is made when the prompt ends, from the whole prompt,
// however it was chunked: every layer takes every token (no kvp_selection is returned), the
// prompt's end scores the layers in order, picks the same selection layer as one call without
// max_prompt and the layers after it keep exactly the selection; so the kept positions of every
// layer and head are the one-call protocol's (where the caller passed only the selected tokens).
TEST(Asl, MaxPromptSelectsAtThePromptsEndAsOneCallDoes) {
    const kvp_model m = ref::model(kLayers, 2, 2, kHd, KVP_ROPE_NONE);
    Prompt p = make_prompt(2, 5);
    // the layers after the selection rank the prompt otherwise: their own SnapKV would keep other tokens
    ref::Rng rng(17);
    for (uint32_t l = 4; l < kLayers; ++l) {
        for (uint32_t t = kP - 1; t > 0; --t) std::swap(p.perm[l][t], p.perm[l][rng.next() % (t + 1)]);
        for (uint32_t t = 0; t < kP; ++t)
            for (uint32_t h = 0; h < 2; ++h) p.k[l][(size_t(t) * 2 + h) * kHd] = 0.05f * float(p.perm[l][t]);
    }
    for (const char *score : {"score=float", "score=fixed"}) {
        ref::Cache one(m, spec(score));
        const Outcome r = prefill_all(one, p);
        ASSERT_EQ(r.sel_layer, 3) << score;
        for (uint32_t chunk : {1u, 7u, 64u}) {
            ref::Cache c(m, spec(std::string(score) + " max_prompt=" + std::to_string(kN)));
            ASSERT_NE(c.c, nullptr) << score;
            std::vector<int32_t> idx(kN);
            std::vector<float> out(size_t(kN) * 2 * kHd);
            const size_t row = 2 * kHd;
            for (uint32_t t = 0; t < kN; t += chunk) {
                const uint32_t n = kN - t < chunk ? kN - t : chunk;
                for (uint32_t l = 0; l < kLayers; ++l) {
                    kvp_selection sel = selection_into(idx);
                    ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, &p.q[l][t * row], &p.k[l][t * row], &p.v[l][t * row],
                                          out.data(), &sel),
                              KVP_OK)
                        << kvp_last_error(c.c);
                    EXPECT_EQ(sel.selected, 0);  // nothing is selected inside the prompt
                    EXPECT_EQ(sel.n, 0u);
                }
            }
            EXPECT_EQ(kvp::asl_selection_layer(c.c), -1);
            ASSERT_EQ(kvp_prompt_end(c.c), KVP_OK) << kvp_last_error(c.c);
            EXPECT_EQ(kvp::asl_selection_layer(c.c), 3) << score << " chunk " << chunk;
            for (uint32_t l = 0; l < kLayers; ++l) {
                double v1, r1, v2, r2;
                ASSERT_TRUE(kvp::asl_layer_variance(one.c, l, &v1, &r1));
                ASSERT_TRUE(kvp::asl_layer_variance(c.c, l, &v2, &r2));
                if (isnan(v1)) EXPECT_TRUE(isnan(v2)) << l;
                else EXPECT_EQ(v1, v2) << l;
                for (uint32_t h = 0; h < 2; ++h)
                    EXPECT_EQ(c.positions(l, h), one.positions(l, h)) << score << " chunk " << chunk << " layer " << l;
            }
            // decoding goes on from the prompt's end on every layer
            std::vector<float> o(2 * kHd);
            for (uint32_t l = 0; l < kLayers; ++l)
                ASSERT_EQ(kvp_decode(c.c, l, p.q[l].data(), p.k[l].data(), p.v[l].data(), o.data()), KVP_OK);
            EXPECT_EQ(c.positions(kLayers - 1, 0).back(), int32_t(kN));
        }
    }
}

TEST(Asl, NoQualifyingLayerMeansSnapKvEverywhere) {
    const kvp_model m = ref::model(kLayers, 2, 2, kHd, KVP_ROPE_NONE);
    const Prompt p = make_prompt(kLayers, 9);  // never stable
    ref::Cache c(m, spec("asl_tau=0"));
    const Outcome r = prefill_all(c, p);
    EXPECT_EQ(r.sel_layer, -1);
    EXPECT_EQ(kvp::asl_selection_layer(c.c), -1);
    for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(kvp_layer_len(c.c, l), kBudget);
}

TEST(Asl, TooSmallSelectionIsAnErrorThatChangesNothing) {
    const kvp_model m = ref::model(kLayers, 2, 2, kHd, KVP_ROPE_NONE);
    const Prompt p = make_prompt(0, 3);  // stable at once: layer 1 selects (reference variance 0)
    ref::Cache c(m, spec(""));
    std::vector<float> out(size_t(kN) * 2 * kHd);
    std::vector<int32_t> idx(kN, -7);
    ASSERT_EQ(kvp_prefill(c.c, 0, kN, nullptr, p.q[0].data(), p.k[0].data(), p.v[0].data(), out.data(), nullptr), KVP_OK)
        << "layer 0 is before asl_min_layer: no selection needed";
    kvp_stats before;
    before.struct_size = sizeof before;
    ASSERT_EQ(kvp_get_stats(c.c, &before), KVP_OK);
    kvp_selection sel;
    memset(&sel, 0, sizeof sel);
    sel.struct_size = sizeof sel;
    sel.capacity = kBudget - 1;
    sel.indices = idx.data();
    EXPECT_EQ(kvp_prefill(c.c, 1, kN, nullptr, p.q[1].data(), p.k[1].data(), p.v[1].data(), out.data(), &sel),
              KVP_ERR_BUFFER);
    EXPECT_EQ(sel.n, kBudget);
    EXPECT_EQ(sel.selected, 0);
    EXPECT_NE(std::string(kvp_last_error(c.c)).find("sel"), std::string::npos) << kvp_last_error(c.c);
    EXPECT_EQ(idx[0], -7);
    EXPECT_EQ(kvp_prefill(c.c, 1, kN, nullptr, p.q[1].data(), p.k[1].data(), p.v[1].data(), out.data(), nullptr),
              KVP_ERR_BUFFER);
    kvp_stats after;
    after.struct_size = sizeof after;
    ASSERT_EQ(kvp_get_stats(c.c, &after), KVP_OK);
    EXPECT_EQ(memcmp(&before, &after, sizeof before), 0);
    EXPECT_EQ(kvp_layer_len(c.c, 1), 0u);
    EXPECT_EQ(kvp::asl_selection_layer(c.c), -1);
    // the same call with room selects as a fresh cache would
    sel.capacity = kBudget;
    ASSERT_EQ(kvp_prefill(c.c, 1, kN, nullptr, p.q[1].data(), p.k[1].data(), p.v[1].data(), out.data(), &sel), KVP_OK);
    EXPECT_EQ(sel.selected, 1);
    EXPECT_EQ(sel.n, kBudget);
    ref::Cache fresh(m, spec(""));
    const Outcome r = prefill_all(fresh, p);
    EXPECT_EQ(r.sel_layer, 1);
    EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + sel.n), r.sel);
}

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// One run of a 6-layer model (150-token one-call prompt, selection propagated, 40 decode steps):
// the hash of every output and every kept position after each decode step, the selection, the
// kept positions after the prompt and the final stats.
struct AslRun {
    uint64_t hash = 0;
    int32_t sel_layer = -1;
    std::vector<int32_t> sel;
    std::vector<std::vector<int32_t>> after_prompt;  // [layer * 4 + kv head]
    kvp_stats st{};
};

AslRun run_all(const std::string &spec) {
    AslRun r;
    int32_t *sel_layer = &r.sel_layer;
    const uint32_t L = 6, N = 150, T = 40, nq = 8 * 16, nkv = 4 * 16;
    const kvp_model m = ref::model(L, 8, 4, 16, KVP_ROPE_GPTJ);
    std::vector<float> q(size_t(L) * (N + T) * nq), k(size_t(L) * (N + T) * nkv), v(k.size());
    ref::Rng rng(17);
    rng.fill(q, -2.0f, 2.0f);
    rng.fill(k, -2.0f, 2.0f);
    rng.fill(v);
    ref::Cache c(m, spec);
    EXPECT_NE(c.c, nullptr) << spec;
    if (!c.c) return r;
    std::vector<float> out(size_t(N) * nq);
    std::vector<int32_t> idx(N);
    uint64_t h = 0xcbf29ce484222325ull;
    std::vector<int32_t> &sel_pos = r.sel;
    for (uint32_t l = 0; l < L; ++l) {
        const float *ql = &q[size_t(l) * (N + T) * nq], *kl = &k[size_t(l) * (N + T) * nkv], *vl = &v[size_t(l) * (N + T) * nkv];
        kvp_selection sel;
        memset(&sel, 0, sizeof sel);
        sel.struct_size = sizeof sel;
        sel.capacity = N;
        sel.indices = idx.data();
        if (*sel_layer < 0) {
            EXPECT_EQ(kvp_prefill(c.c, l, N, nullptr, ql, kl, vl, out.data(), &sel), KVP_OK) << kvp_last_error(c.c);
            h = fnv(h, out.data(), out.size() * sizeof(float));
            if (sel.selected) {
                *sel_layer = int32_t(l);
                sel_pos.assign(idx.begin(), idx.begin() + sel.n);
                h = fnv(h, sel_pos.data(), sel_pos.size() * 4);
            }
        } else {
            std::vector<float> qs, ks, vs;
            for (int32_t t : sel_pos) {
                qs.insert(qs.end(), ql + size_t(t) * nq, ql + size_t(t + 1) * nq);
                ks.insert(ks.end(), kl + size_t(t) * nkv, kl + size_t(t + 1) * nkv);
                vs.insert(vs.end(), vl + size_t(t) * nkv, vl + size_t(t + 1) * nkv);
            }
            EXPECT_EQ(kvp_prefill(c.c, l, uint32_t(sel_pos.size()), sel_pos.data(), qs.data(), ks.data(), vs.data(),
                                  out.data(), &sel),
                      KVP_OK);
            h = fnv(h, out.data(), sel_pos.size() * nq * sizeof(float));
        }
    }
    for (uint32_t l = 0; l < L; ++l)
        for (uint32_t kh = 0; kh < 4; ++kh) r.after_prompt.push_back(c.positions(l, kh));
    for (uint32_t t = N; t < N + T; ++t)
        for (uint32_t l = 0; l < L; ++l) {
            const size_t base = size_t(l) * (N + T) + t;
            EXPECT_EQ(kvp_decode(c.c, l, &q[base * nq], &k[base * nkv], &v[base * nkv], out.data()), KVP_OK);
            h = fnv(h, out.data(), size_t(nq) * sizeof(float));
            for (uint32_t kh = 0; kh < 4; ++kh) {
                const std::vector<int32_t> p = c.positions(l, kh);
                h = fnv(h, p.data(), p.size() * sizeof(int32_t));
            }
        }
    r.hash = h;
    r.st.struct_size = sizeof r.st;
    EXPECT_EQ(kvp_get_stats(c.c, &r.st), KVP_OK);
    return r;
}

uint64_t run_hash(const std::string &spec, int32_t *sel_layer) {
    const AslRun r = run_all(spec);
    *sel_layer = r.sel_layer;
    return r.hash;
}

TEST(Asl, SameBitsForThreads123) {
    for (const char *pos : {"original", "realign"})
        for (const char *rest : {"asl_tau=1.5 asl_obs_layers=3", "asl_tau=1.5 asl_obs_layers=2 score=fixed"}) {
            const std::string base =
                std::string("policy=asl budget=40 obs_window=8 capacity=60 asl_min_layer=2 positions=") + pos + " " + rest;
            int32_t s1 = -1, s2 = -1, s3 = -1;
            const uint64_t h1 = run_hash(base + " threads=1", &s1);
            EXPECT_EQ(run_hash(base + " threads=2", &s2), h1) << base;
            EXPECT_EQ(run_hash(base + " threads=3", &s3), h1) << base;
            EXPECT_EQ(s1, s2);
            EXPECT_EQ(s1, s3);
            EXPECT_GE(s1, 2) << base;  // a selection was made (the selection path is covered)
        }
}

// ASL over formatted storage (kv_dtype f16/q8/q4, ThinK): the prompt is staged at f32 (DECISIONS.md
// "Prompt staging with formatted storage"), so a one-call prompt per layer is scored, ranked and
// selected exactly as with f32 storage: the same selection layer, the same selection and the same
// kept tokens after the prompt for every dtype, in less memory; then decode (h2o-style eviction
// over quantized attention) gives the same bits on 1, 2 and 3 threads.
TEST(Asl, FormattedStorageKeepsTheF32SelectionAndBits) {
    const std::string base = "policy=asl budget=40 obs_window=8 capacity=60 asl_min_layer=2 asl_tau=1.5 asl_obs_layers=3";
    for (const char *pos : {"original", "realign"}) {
        const std::string tail = std::string(" positions=") + pos + " quant_group=16";
        const AslRun f32 = run_all(base + tail);
        ASSERT_GE(f32.sel_layer, 2);
        for (const char *dt : {"f16", "q8", "q4"})
            for (bool think : {false, true}) {
                const std::string spec = (think ? "policy=think token_" + base +
                                                      " key_channel_ratio=0.4 value_channel_ratio=0.2"
                                                : base) +
                                         tail + " kv_dtype=" + dt;
                SCOPED_TRACE(spec);
                const AslRun one = run_all(spec + " threads=1");
                EXPECT_EQ(one.sel_layer, f32.sel_layer);
                EXPECT_EQ(one.sel, f32.sel);
                EXPECT_EQ(one.after_prompt, f32.after_prompt);
                EXPECT_LT(one.st.live_bytes, f32.st.live_bytes);
                EXPECT_LE(one.st.live_bytes, one.st.peak_live_bytes);
                EXPECT_LE(one.st.peak_live_bytes, one.st.arena_bytes);
                for (const char *th : {" threads=2", " threads=3"}) {
                    const ref::ForceParallel fp(true);
                    const AslRun other = run_all(spec + th);
                    EXPECT_EQ(other.hash, one.hash) << th;
                    EXPECT_EQ(other.st.live_bytes, one.st.live_bytes) << th;
                    EXPECT_EQ(other.st.peak_live_bytes, one.st.peak_live_bytes) << th;
                }
            }
    }
}

TEST(Asl, ConfigErrors) {
    kvp_config cfg;
    char err[256];
    const kvp_model m = ref::model(4, 2, 2, 8);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=asl asl_min_layer=4", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("asl_min_layer"), std::string::npos) << err;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=asl pool_kernel=4", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("pool_kernel"), std::string::npos) << err;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=asl budget=64 capacity=64", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("asl: capacity"), std::string::npos) << err;
}

}  // namespace
