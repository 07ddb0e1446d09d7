// Composition matrix: every token policy x kv_dtype {f32, f16, q8, q4} x {no ThinK, ThinK
// lambda 0.4} runs a chunked prefill and decode, stays within its memory bound, and gives the
// same bits on 1, 2 and 3 threads. Table-driven: a policy that lands adds one row to
// kTokenPolicies (its keys with a capacity small enough to make it prune).
#include <gtest/gtest.h>
#include <string.h>

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
    {"simlayerkv", "nonlazy=h2o budget=64 recent=8 capacity=96 sinks=4 window=24 lazy_force=1"},
    {"simlayerkv", "sinks=4 window=24 capacity=260 lazy_last=8 lazy_mode=decode lazy_threshold=0.2 positions=realign"},
    // snapkv / pyramidkv / asl stage their prompts: not with formatted storage yet
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
    // pinned residual) at f32, grids for every block, the channel lists
    uint64_t bound = 0;
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

}  // namespace
