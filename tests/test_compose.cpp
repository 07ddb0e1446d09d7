// Composition matrix: every token policy x kv_dtype {f32, f16, q8, q4} x {no ThinK, ThinK
// lambda 0.4} runs a chunked prefill and decode, stays within its memory bound, and gives the
// same bits on 1, 2 and 3 threads. Table-driven: a policy that lands adds one row to
// kTokenPolicies (its keys with a capacity small enough to make it prune).
#include <gtest/gtest.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include <string>
#include <vector>

#include "cache.h"
#include "quant/format.h"
#include "quant/store_fmt.h"
#include "quant_support.h"
#include "reference.h"

namespace {

struct TokenPolicy {
    const char *name;
    const char *keys;  // the policy's keys (without policy=)
};
const TokenPolicy kTokenPolicies[] = {
    {"full", "capacity=260"},
    {"window", "window=60"},
    {"streaming", "sinks=4 window=48 compress_every=8"},
    {"streaming", "sinks=4 window=40 compress_every=4 slack=6 max_drop=3 positions=original"},
    {"h2o", "budget=64 recent=8 capacity=96"},
    {"h2o", "budget=64 recent=8 capacity=96 positions=realign total_capacity=150"},
    // prompt staging (staged f32 rows, committed into the store's format): the 150-token prompt
    // in three calls of prefill_stage=64, each a selection over what the layer holds plus the chunk
    {"snapkv", "budget=48 obs_window=8 capacity=80 recent=4 prefill_stage=64"},
    {"pyramidkv", "budget=48 obs_window=8 beta=5 positions=realign prefill_stage=64"},
    {"lethe", "capacity=120 evict_threshold=40 sparse_ratio=3 obs_window=8"},
    {"lethe", "capacity=120 evict_threshold=32 sparse_ratio=3 positions=realign total_capacity=200"},
    {"simlayerkv", "nonlazy=h2o budget=64 recent=8 capacity=96 sinks=4 window=24 lazy_force=1"},
    {"simlayerkv", "sinks=4 window=24 capacity=260 lazy_last=8 lazy_mode=decode lazy_threshold=0.2 positions=realign"},
    // over a staged snapkv: layer 0 lazy (its staged prompt trimmed to sinks + window), layer 1 snapkv
    {"simlayerkv", "nonlazy=snapkv budget=48 obs_window=8 capacity=80 recent=4 prefill_stage=64 sinks=4 window=24 "
                   "lazy_force=1"},
    {"simlayerkv", "nonlazy=snapkv budget=48 obs_window=8 capacity=80 recent=4 prefill_stage=64 sinks=4 window=24 "
                   "lazy_last=8 lazy_threshold=0.2 positions=realign total_capacity=120"},
};
const char *const kDtypes[] = {"f32", "f16", "q8", "q4"};

struct RunOut {
    std::vector<float> outs;
    std::vector<std::vector<int32_t>> pos;
    kvp_stats st;
};

// Prompt of P tokens in chunks of kvp_prefill_room (as the harness does), then T decode steps.
RunOut run(const kvp_model &m, const std::string &spec, uint32_t P, uint32_t T) {
    RunOut r;
    ref::Cache cache(m, spec);
    if (!cache.c) return r;
    const kvp_cache *c = cache.c;
    const uint32_t nq = m.n_q_heads, nkv = m.n_kv_heads, hd = m.head_dim;
    ref::Rng g(21);
    std::vector<float> q(size_t(P + T) * nq * hd), k(size_t(P + T) * nkv * hd), v(k.size());
    g.fill(q);
    g.fill(k);
    g.fill(v);
    std::vector<float> out(size_t(P) * nq * hd);
    // the format's memory bound per store: every slot converted, plus a residual group (and the
    // pinned residual) at f32, grids for every block, the channel lists; staged policies add the
    // staging area at f32 (peak_live_bytes counts a call's staged rows)
    uint64_t bound = uint64_t(nkv) * c->plan.stage * hd * 8;
    if (c->fmt) {
        const kvp::StoreFormat &f = c->fmt->f;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            const uint32_t cap = kvp_layer_capacity(c, l);
            bound += nkv * (cap * kvp::fmt_token_bytes(f) + (cap / f.block + 2) * kvp::fmt_grid_bytes(f) +
                            kvp::fmt_index_bytes(f) + (f.block + c->fmt->pin_side) * kvp::fmt_residual_bytes(f));
        }
    } else {
        for (uint32_t l = 0; l < m.n_layers; ++l) bound += uint64_t(nkv) * kvp_layer_capacity(c, l) * hd * 8;
    }
    auto check_bounds = [&]() {
        kvp_stats st;
        st.struct_size = sizeof st;
        EXPECT_EQ(kvp_get_stats(cache.c, &st), KVP_OK);
        EXPECT_LE(st.peak_live_bytes, bound);
        EXPECT_LE(st.live_bytes, st.peak_live_bytes);
        for (uint32_t l = 0; l < m.n_layers; ++l) EXPECT_LE(kvp_layer_len(c, l), kvp_layer_capacity(c, l));
    };
    for (uint32_t t0 = 0; t0 < P;) {
        uint32_t n = kvp_prefill_room(c);
        if (n == 0) n = 1;
        if (n > P - t0) n = P - t0;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            EXPECT_EQ(kvp_prefill(cache.c, l, n, nullptr, &q[size_t(t0) * nq * hd], &k[size_t(t0) * nkv * hd],
                                  &v[size_t(t0) * nkv * hd], out.data(), nullptr),
                      KVP_OK)
                << kvp_last_error(cache.c);
            r.outs.insert(r.outs.end(), out.begin(), out.begin() + size_t(n) * nq * hd);
        }
        t0 += n;
        check_bounds();
    }
    for (uint32_t t = P; t < P + T; ++t) {
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            EXPECT_EQ(kvp_decode(cache.c, l, &q[size_t(t) * nq * hd], &k[size_t(t) * nkv * hd], &v[size_t(t) * nkv * hd],
                                 out.data()),
                      KVP_OK)
                << kvp_last_error(cache.c);
            r.outs.insert(r.outs.end(), out.begin(), out.begin() + size_t(nq) * hd);
        }
        if (t % 10 == 0) check_bounds();
    }
    for (uint32_t l = 0; l < m.n_layers; ++l)
        for (uint32_t h = 0; h < nkv; ++h) r.pos.push_back(cache.positions(l, h));
    r.st.struct_size = sizeof r.st;
    kvp_get_stats(cache.c, &r.st);
    return r;
}

TEST(Compose, EveryPolicyDtypeAndThinkRunsBoundedWithTheSameBitsOnAnyThreads) {
    const kvp_model m = ref::model(2, 6, 3, 40);
    for (const TokenPolicy &tp : kTokenPolicies) {
        for (const char *dt : kDtypes) {
            for (bool think : {false, true}) {
                const std::string base = (think ? std::string("policy=think token_policy=") + tp.name +
                                                      " key_channel_ratio=0.4 value_channel_ratio=0.2 "
                                                : std::string("policy=") + tp.name + " ") +
                                         tp.keys + " kv_dtype=" + dt + " quant_group=16";
                SCOPED_TRACE(base);
                const RunOut one = run(m, base + " threads=1", 150, 80);
                ASSERT_FALSE(one.outs.empty());
                EXPECT_GT(one.st.tokens_seen, 0u);
                for (const char *th : {" threads=2", " threads=3"}) {
                    const RunOut other = run(m, base + th, 150, 80);
                    ASSERT_EQ(other.outs.size(), one.outs.size()) << th;
                    EXPECT_EQ(memcmp(other.outs.data(), one.outs.data(), one.outs.size() * sizeof(float)), 0) << th;
                    EXPECT_EQ(other.pos, one.pos) << th;
                    EXPECT_EQ(other.st.live_bytes, one.st.live_bytes) << th;
                    EXPECT_EQ(other.st.peak_live_bytes, one.st.peak_live_bytes) << th;
                }
            }
        }
    }
}

// Prompt staging with formatted storage (DECISIONS.md "Quantized storage"): the staged rows are
// f32, so a one-call prompt into an empty layer is attended, observed and voted exactly as with
// f32 storage: every dtype (and ThinK, which only narrows what is stored afterwards) keeps the
// same tokens. Chunked prompts vote over quantized older tokens, and decode eviction (h2o's rule)
// scores with quantized attention: the kept sets then overlap highly but need not be equal.
std::vector<std::vector<int32_t>> kept(const ref::Cache &c, const kvp_model &m) {
    std::vector<std::vector<int32_t>> r;
    for (uint32_t l = 0; l < m.n_layers; ++l)
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) r.push_back(c.positions(l, h));
    return r;
}

double overlap(const std::vector<std::vector<int32_t>> &a, const std::vector<std::vector<int32_t>> &b) {
    size_t same = 0, all = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        std::vector<int32_t> x;
        std::set_intersection(a[i].begin(), a[i].end(), b[i].begin(), b[i].end(), std::back_inserter(x));
        same += x.size();
        all += a[i].size();
    }
    return all ? double(same) / double(all) : 1.0;
}

struct Prompt {
    std::vector<float> q, k, v;
    uint32_t nq, nkv;
    Prompt(const kvp_model &m, uint32_t T, uint64_t seed) : nq(m.n_q_heads * m.head_dim), nkv(m.n_kv_heads * m.head_dim) {
        ref::Rng g(seed);
        q.resize(size_t(T) * nq);
        k.resize(size_t(T) * nkv);
        v.resize(size_t(T) * nkv);
        g.fill(q);
        g.fill(k);
        g.fill(v);
        // a few strongly attended keys, so the votes have a clear order (as in real prompts)
        for (uint32_t t = 5; t < T; t += 17)
            for (uint32_t i = 0; i < nkv; ++i) k[size_t(t) * nkv + i] = 3.0f * q[size_t(T - 1) * nq + i % nq];
    }
};

// Prefill P tokens in chunks of `chunk` (0: one call), then T - P decode steps.
void drive(const ref::Cache &c, const kvp_model &m, const Prompt &p, uint32_t P, uint32_t T, uint32_t chunk) {
    std::vector<float> out(size_t(P) * p.nq);
    for (uint32_t t0 = 0; t0 < P;) {
        const uint32_t n = chunk && chunk < P - t0 ? chunk : P - t0;
        for (uint32_t l = 0; l < m.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, &p.q[size_t(t0) * p.nq], &p.k[size_t(t0) * p.nkv],
                                  &p.v[size_t(t0) * p.nkv], out.data(), nullptr),
                      KVP_OK)
                << kvp_last_error(c.c);
        t0 += n;
    }
    for (uint32_t t = P; t < T; ++t)
        for (uint32_t l = 0; l < m.n_layers; ++l)
            ASSERT_EQ(kvp_decode(c.c, l, &p.q[size_t(t) * p.nq], &p.k[size_t(t) * p.nkv], &p.v[size_t(t) * p.nkv],
                                 out.data()),
                      KVP_OK);
}

TEST(ComposeStaged, QuantizedSnapKvKeepsTheF32Selection) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    const Prompt p(m, 320, 5);
    for (const char *pol : {"policy=snapkv budget=48 obs_window=16 capacity=64 recent=8",
                            "policy=pyramidkv budget=48 obs_window=8 beta=4"}) {
        const std::string base = std::string(pol) + " quant_group=16";
        ref::Cache f32(m, base);
        drive(f32, m, p, 200, 200, 0);
        const auto want = kept(f32, m);
        // ThinK's channel lists over f32 storage: the same for every dtype (same kept tokens, same
        // window queries, chosen before anything is quantized)
        const std::string think_keys = " key_channel_ratio=0.4 value_channel_ratio=0.2";
        ref::Cache tf32(m, "policy=think token_" + std::string(pol) + " quant_group=16" + think_keys);
        drive(tf32, m, p, 200, 200, 0);
        EXPECT_EQ(kept(tf32, m), want);
        auto lists = [&](const ref::Cache &c) {
            std::vector<uint16_t> r;
            const kvp::StoreFormat &f = c.c->fmt->f;
            for (uint32_t l = 0; l < m.n_layers; ++l)
                for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                    const kvp::FmtStore &fs = kvp::fmt_store(*c.c->fmt, kvp::head_of(c.c, l, h));
                    r.insert(r.end(), fs.kidx, fs.kidx + f.wk);
                    r.insert(r.end(), fs.vidx, fs.vidx + f.wv);
                }
            return r;
        };
        const auto want_lists = lists(tf32);
        for (const char *dt : {"f16", "q8", "q4"}) {
            for (const char *think : {"", " key_channel_ratio=0.4 value_channel_ratio=0.2"}) {
                const std::string spec = (*think ? "policy=think token_" + std::string(pol) : std::string(pol)) +
                                         " quant_group=16 kv_dtype=" + dt + think;
                SCOPED_TRACE(spec);
                ref::Cache c(m, spec);
                ASSERT_NE(c.c, nullptr);
                drive(c, m, p, 200, 200, 0);
                EXPECT_EQ(kept(c, m), want);  // one call into an empty layer: the same votes
                // the commit converted the kept groups; ThinK chose its channels from the call's window
                for (uint32_t l = 0; l < m.n_layers; ++l)
                    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
                        const kvp::HeadStore &hs = kvp::head_of(c.c, l, h);
                        EXPECT_LT(hs.nres, c.c->fmt->f.block);
                        if (*think) {
                            EXPECT_EQ(kvp::fmt_store(*c.c->fmt, hs).selected, 1u);
                        }
                    }
                if (*think) {
                    EXPECT_EQ(lists(c), want_lists);
                }
            }
        }
    }
    // chunked prompt (the second and third calls vote over stored tokens) and decode eviction
    const std::string base = "policy=snapkv budget=48 obs_window=16 capacity=64 recent=8 prefill_stage=70 quant_group=16";
    ref::Cache f32(m, base);
    drive(f32, m, p, 200, 320, 70);
    const auto want = kept(f32, m);
    for (const char *dt : {"f16", "q8"}) {
        ref::Cache c(m, base + " kv_dtype=" + dt);
        drive(c, m, p, 200, 320, 70);
        const double o = overlap(kept(c, m), want);
        ::testing::Test::RecordProperty(std::string("overlap_") + dt, std::to_string(o));
        EXPECT_GE(o, 0.9) << dt;
    }
}

// A prompt larger than the layer's capacity in one kvp_prefill call with q4 storage: the staging
// area holds the whole chunk at f32, the commit converts the kept groups; live and peak bytes
// are exact.
TEST(ComposeStaged, PromptLargerThanCapacityInOneCallWithQ4) {
    const kvp_model m = ref::model(3, 4, 2, 32);
    const Prompt p(m, 340, 9);
    ref::Cache c(m, "policy=snapkv budget=48 max_new=1 kv_dtype=q4 quant_group=16");
    ASSERT_NE(c.c, nullptr);
    EXPECT_EQ(kvp_layer_capacity(c.c, 0), 49u);
    EXPECT_EQ(kvp_prefill_room(c.c), 1024u);
    const uint32_t P = 300;
    std::vector<float> out(size_t(P) * p.nq);
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        ASSERT_EQ(kvp_prefill(c.c, l, P, nullptr, p.q.data(), p.k.data(), p.v.data(), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c.c);
        EXPECT_EQ(kvp_layer_len(c.c, l), 48u);
        for (float x : out) ASSERT_TRUE(std::isfinite(x));
    }
    const kvp::StoreFormat &f = c.c->fmt->f;
    const uint64_t store = 48 * kvp::fmt_token_bytes(f) + 3 * kvp::fmt_grid_bytes(f);  // 3 converted groups
    kvp_stats s;
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
    EXPECT_EQ(s.live_bytes, 3u * 2 * store);
    // the peak: the last layer's staged prompt at f32 next to the other layers' stores
    EXPECT_EQ(s.peak_live_bytes, 2u * 2 * store + 2u * P * kvp::fmt_residual_bytes(f));
    EXPECT_EQ(s.tokens_evicted, 3u * 2 * (P - 48));
    for (uint32_t t = P; t < 340; ++t)
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            ASSERT_EQ(kvp_decode(c.c, l, &p.q[size_t(t) * p.nq], &p.k[size_t(t) * p.nkv], &p.v[size_t(t) * p.nkv],
                                 out.data()),
                      KVP_OK);
            for (uint32_t i = 0; i < p.nq; ++i) ASSERT_TRUE(std::isfinite(out[i]));
        }
    EXPECT_EQ(kvp_layer_len(c.c, 2), 48u);
}

}  // namespace
