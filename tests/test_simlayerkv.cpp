// SimLayerKV (src/policies/simlayerkv.h): q/k built so that a layer is lazy (its last queries
// attend to the first sinks and the last window keys) or not (they attend to the middle), in
// both lazy modes; trimmed layers keep exactly sinks + window (the first sinks and the newest
// window positions); the freed blocks are back in the pool (live_bytes, free blocks) and let
// another layer of a shared pool hold more; realign outputs after the trim against a double
// reference; lazy_force; the same bits for threads 1/2/3; config errors.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "cache.h"
#include "reference.h"

namespace {

constexpr uint32_t kHd = 8, kT = 64, kSinks = 2, kWindow = 8;

// Inputs of one layer: token t's key is `hot` along e0 when t is "attended" (sinks and the last
// window tokens of the prompt for a lazy design, the middle tokens otherwise), else 0; every
// query is `hot` along e0. Values are random. One query head per KV head (2 KV heads).
struct LayerIn {
    std::vector<float> q, k, v;  // [T + extra][heads][hd]
};

LayerIn design(bool lazy, uint32_t T, uint32_t extra, uint64_t seed) {
    const uint32_t H = 2, n = T + extra;
    LayerIn in;
    in.q.assign(size_t(n) * H * kHd, 0.0f);
    in.k.assign(in.q.size(), 0.0f);
    in.v.resize(in.q.size());
    ref::Rng rng(seed);
    rng.fill(in.v);
    const float hot = 6.0f;
    for (uint32_t t = 0; t < n; ++t) {
        const bool edge = t < kSinks || t >= T - kWindow;  // decode tokens count as recent
        for (uint32_t h = 0; h < H; ++h) {
            in.q[(size_t(t) * H + h) * kHd] = hot;
            if (edge == lazy) in.k[(size_t(t) * H + h) * kHd] = hot;
            in.k[(size_t(t) * H + h) * kHd + 1] = rng.uniform(-0.1f, 0.1f);
        }
    }
    return in;
}

kvp_layer_stats stats(const kvp_cache *c, uint32_t l) {
    kvp_layer_stats s;
    s.struct_size = sizeof s;
    EXPECT_EQ(kvp_get_layer_stats(c, l, &s), KVP_OK);
    return s;
}

std::vector<int32_t> expected_trim(uint32_t L) {  // original positions after a trim of 0..L-1
    std::vector<int32_t> p;
    for (uint32_t t = 0; t < kSinks; ++t) p.push_back(int32_t(t));
    for (uint32_t t = L - kWindow; t < L; ++t) p.push_back(int32_t(t));
    return p;
}

std::string base_spec() {
    return "policy=simlayerkv sinks=" + std::to_string(kSinks) + " window=" + std::to_string(kWindow) +
           " lazy_last=4 lazy_threshold=0.9 capacity=128";
}

TEST(SimLayerKv, PrefillModeClassifiesAndTrims) {
    const kvp_model m = ref::model(2, 2, 2, kHd, KVP_ROPE_NONE);
    for (const char *nonlazy : {"full", "h2o budget=100 recent=4", "snapkv budget=100"}) {
        ref::Cache c(m, base_spec() + " lazy_mode=prefill nonlazy=" + nonlazy);
        std::vector<float> out(size_t(kT) * 2 * kHd);
        const LayerIn lazy = design(true, kT, 0, 1), busy = design(false, kT, 0, 2);
        EXPECT_EQ(stats(c.c, 0).lazy, -1);
        ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, lazy.q.data(), lazy.k.data(), lazy.v.data(), out.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(c.c, 1, kT, nullptr, busy.q.data(), busy.k.data(), busy.v.data(), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(stats(c.c, 0).lazy, 1) << nonlazy;
        EXPECT_EQ(stats(c.c, 1).lazy, 0) << nonlazy;
        EXPECT_EQ(stats(c.c, 0).len, kSinks + kWindow) << nonlazy;
        EXPECT_EQ(stats(c.c, 1).len, kT) << nonlazy;
        for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(c.positions(0, h), expected_trim(kT)) << nonlazy;
        // live bytes: exactly the kept tokens (f32 K and V rows, 2 KV heads)
        EXPECT_EQ(stats(c.c, 0).live_bytes, uint64_t(kSinks + kWindow) * 2 * kHd * 4 * 2) << nonlazy;
        // decode: the lazy layer stays at sinks + window, the newest window moves
        std::vector<float> o(2 * kHd);
        const LayerIn more = design(true, kT, 5, 3);
        for (uint32_t t = kT; t < kT + 5; ++t) {
            const size_t off = size_t(t) * 2 * kHd;
            ASSERT_EQ(kvp_decode(c.c, 0, &more.q[off], &more.k[off], &more.v[off], o.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(c.c, 1, &more.q[off], &more.k[off], &more.v[off], o.data()), KVP_OK);
        }
        EXPECT_EQ(c.positions(0, 1), expected_trim(kT + 5)) << nonlazy;
        EXPECT_EQ(stats(c.c, 0).lazy, 1);
    }
}

// The same classification and trim over snapkv's staged prompt with formatted storage (f16, q8,
// q4, and ThinK over simlayerkv): the staged rows are f32, so the lazy decision and the kept
// positions are those of f32 storage; the non-lazy layer stores its prompt in the format.
TEST(SimLayerKv, FormattedStorageOverSnapKvClassifiesAndTrims) {
    const kvp_model m = ref::model(2, 2, 2, kHd, KVP_ROPE_NONE);
    const LayerIn lazy = design(true, kT, 5, 1), busy = design(false, kT, 5, 2);
    const uint64_t f32_busy_bytes = uint64_t(kT) * 2 * kHd * 4 * 2;
    for (const char *fmt : {"kv_dtype=f16", "kv_dtype=q8", "kv_dtype=q4",
                            "kv_dtype=q8 policy=think token_policy=simlayerkv key_channel_ratio=0.5"}) {
        SCOPED_TRACE(fmt);
        ref::Cache c(m, base_spec() + " lazy_mode=prefill nonlazy=snapkv budget=100 quant_group=8 " + fmt);
        ASSERT_NE(c.c, nullptr);
        std::vector<float> out(size_t(kT) * 2 * kHd);
        ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, lazy.q.data(), lazy.k.data(), lazy.v.data(), out.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(c.c, 1, kT, nullptr, busy.q.data(), busy.k.data(), busy.v.data(), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(stats(c.c, 0).lazy, 1);
        EXPECT_EQ(stats(c.c, 1).lazy, 0);
        EXPECT_EQ(stats(c.c, 0).len, kSinks + kWindow);
        EXPECT_EQ(stats(c.c, 1).len, kT);
        for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(c.positions(0, h), expected_trim(kT));
        EXPECT_LT(stats(c.c, 1).live_bytes, f32_busy_bytes);  // the non-lazy prompt is stored in the format
        std::vector<float> o(2 * kHd);
        for (uint32_t t = kT; t < kT + 5; ++t) {
            const size_t off = size_t(t) * 2 * kHd;
            ASSERT_EQ(kvp_decode(c.c, 0, &lazy.q[off], &lazy.k[off], &lazy.v[off], o.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(c.c, 1, &busy.q[off], &busy.k[off], &busy.v[off], o.data()), KVP_OK);
        }
        for (uint32_t h = 0; h < 2; ++h) EXPECT_EQ(c.positions(0, h), expected_trim(kT + 5));
        EXPECT_EQ(stats(c.c, 1).len, kT + 5);
    }
}

TEST(SimLayerKv, DecodeModeDecidesAtTheFirstDecode) {
    const kvp_model m = ref::model(2, 2, 2, kHd, KVP_ROPE_NONE);
    ref::Cache c(m, base_spec() + " lazy_mode=decode nonlazy=full");
    std::vector<float> out(size_t(kT) * 2 * kHd);
    const LayerIn lazy = design(true, kT, 3, 1), busy = design(false, kT, 3, 2);
    ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, lazy.q.data(), lazy.k.data(), lazy.v.data(), out.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(c.c, 1, kT, nullptr, busy.q.data(), busy.k.data(), busy.v.data(), out.data(), nullptr), KVP_OK);
    EXPECT_EQ(stats(c.c, 0).lazy, -1);  // undecided until the first decode
    EXPECT_EQ(stats(c.c, 1).lazy, -1);
    EXPECT_EQ(stats(c.c, 0).len, kT);
    std::vector<float> o(2 * kHd);
    for (uint32_t t = kT; t < kT + 3; ++t) {
        const size_t off = size_t(t) * 2 * kHd;
        ASSERT_EQ(kvp_decode(c.c, 0, &lazy.q[off], &lazy.k[off], &lazy.v[off], o.data()), KVP_OK);
        ASSERT_EQ(kvp_decode(c.c, 1, &busy.q[off], &busy.k[off], &busy.v[off], o.data()), KVP_OK);
        EXPECT_EQ(stats(c.c, 0).lazy, 1);
        EXPECT_EQ(stats(c.c, 1).lazy, 0);
        EXPECT_EQ(stats(c.c, 0).len, kSinks + kWindow);
        EXPECT_EQ(stats(c.c, 1).len, t + 1);
        EXPECT_EQ(c.positions(0, 0), expected_trim(t + 1));
    }
    // a new sequence is undecided again
    ASSERT_EQ(kvp_reset(c.c), KVP_OK);
    EXPECT_EQ(stats(c.c, 0).lazy, -1);
}

TEST(SimLayerKv, ThresholdAndForce) {
    const kvp_model m = ref::model(2, 2, 2, kHd, KVP_ROPE_NONE);
    std::vector<float> out(size_t(kT) * 2 * kHd);
    const LayerIn lazy = design(true, kT, 0, 1), busy = design(false, kT, 0, 2);
    {  // threshold 1: nothing is lazy
        ref::Cache c(m, base_spec() + " lazy_threshold=1");
        ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, lazy.q.data(), lazy.k.data(), lazy.v.data(), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(stats(c.c, 0).lazy, 0);
        EXPECT_EQ(stats(c.c, 0).len, kT);
    }
    {  // lazy_force=2: layer 1 lazy whatever its attention, layer 0 not
        ref::Cache c(m, base_spec() + " lazy_force=2");
        ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, lazy.q.data(), lazy.k.data(), lazy.v.data(), out.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(c.c, 1, kT, nullptr, busy.q.data(), busy.k.data(), busy.v.data(), out.data(), nullptr), KVP_OK);
        EXPECT_EQ(stats(c.c, 0).lazy, 0);
        EXPECT_EQ(stats(c.c, 1).lazy, 1);
        EXPECT_EQ(stats(c.c, 1).len, kSinks + kWindow);
    }
}

TEST(SimLayerKv, FreedBlocksServeAnotherLayer) {
    // block 16, 2 layers of capacity 128 sharing 112 slots per KV head (7 blocks): a full layer
    // of 64 tokens takes 4 blocks, so two of them do not fit; the lazy layer's trim to 10
    // tokens returns 3 blocks and the other layer can take 64 and then grow to 96.
    const kvp_model m = ref::model(2, 2, 2, kHd, KVP_ROPE_NONE);
    const LayerIn lazy = design(true, kT, 32, 1), busy = design(false, kT, 32, 2);
    std::vector<float> out(size_t(kT) * 2 * kHd), o(2 * kHd);
    for (const char *thr : {"0.9", "1"}) {
        ref::Cache c(m, base_spec() + " block=16 total_capacity=112 lazy_threshold=" + thr);
        const uint32_t free0 = c.c->pools[0].nfree;
        ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, lazy.q.data(), lazy.k.data(), lazy.v.data(), out.data(), nullptr), KVP_OK);
        const kvp_status st = kvp_prefill(c.c, 1, kT, nullptr, busy.q.data(), busy.k.data(), busy.v.data(), out.data(), nullptr);
        if (std::string(thr) == "1") {  // nothing lazy: the pool is dry and full cannot evict
            EXPECT_EQ(st, KVP_ERR_FULL);
            EXPECT_EQ(c.c->pools[0].nfree, free0 - 4);
            continue;
        }
        ASSERT_EQ(st, KVP_OK) << kvp_last_error(c.c);
        EXPECT_EQ(c.c->pools[0].nfree, free0 - 1 - 4);  // layer 0 holds one block, layer 1 four
        kvp_stats s;
        s.struct_size = sizeof s;
        ASSERT_EQ(kvp_get_stats(c.c, &s), KVP_OK);
        EXPECT_EQ(s.live_bytes, uint64_t(kSinks + kWindow + kT) * 2 * kHd * 4 * 2);
        for (uint32_t t = kT; t < kT + 32; ++t) {
            const size_t off = size_t(t) * 2 * kHd;
            ASSERT_EQ(kvp_decode(c.c, 0, &lazy.q[off], &lazy.k[off], &lazy.v[off], o.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(c.c, 1, &busy.q[off], &busy.k[off], &busy.v[off], o.data()), KVP_OK) << t;
        }
        EXPECT_EQ(stats(c.c, 1).len, kT + 32);  // 96 tokens: 6 blocks, more than its share of 7
        EXPECT_EQ(stats(c.c, 0).len, kSinks + kWindow);
    }
}

TEST(SimLayerKv, RealignAfterTrimMatchesReference) {
    const kvp_model m = ref::model(1, 2, 2, kHd, KVP_ROPE_GPTJ);
    ref::Cache c(m, base_spec() + " positions=realign nonlazy=h2o budget=100 recent=4");
    const LayerIn in = design(true, kT, 6, 4);
    std::vector<float> out(size_t(kT) * 2 * kHd), o(2 * kHd);
    ASSERT_EQ(kvp_prefill(c.c, 0, kT, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
    ASSERT_EQ(stats(c.c, 0).lazy, 1);
    for (uint32_t t = kT; t < kT + 6; ++t) {
        const size_t off = size_t(t) * 2 * kHd;
        // kept before this token: sinks and the last window of 0..t-1; they sit at 0..L-1, the new one at L
        std::vector<uint32_t> idx;
        for (int32_t p : expected_trim(t)) idx.push_back(uint32_t(p));
        idx.push_back(t);
        std::vector<int64_t> kpos;
        for (uint32_t j = 0; j < idx.size(); ++j) kpos.push_back(j);
        std::vector<double> want;
        ref::attend(m, &in.q[off], int64_t(idx.size() - 1), in.k.data(), in.v.data(), idx, kpos, want);
        ASSERT_EQ(kvp_decode(c.c, 0, &in.q[off], &in.k[off], &in.v[off], o.data()), KVP_OK);
        for (uint32_t i = 0; i < 2 * kHd; ++i) EXPECT_NEAR(o[i], want[i], 1e-5) << t << " " << i;
        // the window keeps one rotation delta: the sinks, the window (split only where slots jump)
        for (uint32_t h = 0; h < 2; ++h) {
            std::vector<kvp::Run> runs(256);
            const uint32_t nr = kvp::store_runs(kvp::head_of(c.c, 0, h), c.c->pools[h], true, runs.data());
            std::set<int64_t> deltas;
            for (uint32_t r = 0; r < nr; ++r) deltas.insert(runs[r].delta);
            EXPECT_LE(deltas.size(), 2u) << t;
            EXPECT_LE(nr, 4u) << t;
        }
    }
}

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t run_hash(const std::string &spec, int32_t *lazy_layers) {
    const kvp_model m = ref::model(3, 8, 4, 16, KVP_ROPE_GPTJ);
    const uint32_t T = 200, P = 60, nq = 8 * 16, nkv = 4 * 16;
    std::vector<float> q(size_t(T) * nq), k(size_t(T) * nkv), v(size_t(T) * nkv);
    ref::Rng rng(7);
    rng.fill(q, -2.0f, 2.0f);
    rng.fill(k, -2.0f, 2.0f);
    rng.fill(v);
    ref::Cache c(m, spec);
    std::vector<float> out(size_t(P) * nq);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t l = 0; l < 3; ++l) {
        EXPECT_EQ(kvp_prefill(c.c, l, P, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr), KVP_OK);
        h = fnv(h, out.data(), out.size() * sizeof(float));
    }
    for (uint32_t t = P; t < T; ++t)
        for (uint32_t l = 0; l < 3; ++l) {
            EXPECT_EQ(kvp_decode(c.c, l, &q[size_t(t) * nq], &k[size_t(t) * nkv], &v[size_t(t) * nkv], out.data()), KVP_OK);
            h = fnv(h, out.data(), size_t(nq) * sizeof(float));
            for (uint32_t kh = 0; kh < 4; ++kh) {
                const std::vector<int32_t> p = c.positions(l, kh);
                h = fnv(h, p.data(), p.size() * sizeof(int32_t));
            }
        }
    *lazy_layers = 0;
    for (uint32_t l = 0; l < 3; ++l) *lazy_layers += stats(c.c, l).lazy == 1;
    return h;
}

TEST(SimLayerKv, SameBitsForThreads123) {
    for (const char *pos : {"original", "realign"})
        for (const char *rest : {"nonlazy=h2o budget=48 recent=8 capacity=100 lazy_mode=prefill lazy_threshold=0.25",
                                 "nonlazy=snapkv budget=48 capacity=100 lazy_mode=decode lazy_threshold=0.3",
                                 "nonlazy=full capacity=256 lazy_force=5 score=fixed"}) {
            const std::string base = std::string("policy=simlayerkv sinks=4 window=16 lazy_last=8 positions=") + pos + " " + rest;
            int32_t n1 = 0, n2 = 0, n3 = 0;
            const uint64_t h1 = run_hash(base + " threads=1", &n1);
            EXPECT_EQ(run_hash(base + " threads=2", &n2), h1) << base;
            EXPECT_EQ(run_hash(base + " threads=3", &n3), h1) << base;
            EXPECT_EQ(n1, n2);
            EXPECT_EQ(n1, n3);
            EXPECT_GT(n1, 0) << base;  // the trim path is exercised
        }
}

TEST(SimLayerKv, ConfigErrors) {
    kvp_config cfg;
    char err[256];
    const kvp_model big = ref::model(40, 2, 2, 8);
    ASSERT_EQ(kvp_config_default(&cfg, &big), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv lazy_force=3", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("lazy_force"), std::string::npos) << err;
    const kvp_model m = ref::model(2, 2, 2, 8);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv nonlazy=h2o budget=8 recent=9", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("recent"), std::string::npos) << err;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv nonlazy=lethe", err, sizeof err), KVP_ERR_CONFIG);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv nonlazy=snapkv kv_dtype=q8", err, sizeof err), KVP_OK) << err;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    // the default window follows the layer capacity (issue 22: a default never makes a valid value fail)
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv nonlazy=h2o kv_dtype=q8 budget=64", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(cfg.window, 60u);  // capacity budget+1 = 65: sinks 4 + window 60 < 65
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv nonlazy=h2o kv_dtype=q8 budget=64 window=1020", err, sizeof err),
              KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("sinks+window"), std::string::npos) << err;  // a window the spec gives
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=simlayerkv nonlazy=h2o kv_dtype=q8 budget=64 window=32", err, sizeof err), KVP_OK) << err;
}

}  // namespace
