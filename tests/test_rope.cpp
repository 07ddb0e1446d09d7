// RoPE frequencies from the caller (issue 21, item 3): kvp_create_rope's table and the
// rope_attn_factor key, used by every path, and the helpers that build the tables of the
// published scaling schemes, checked against references written here from the formulas:
//   linear  (position interpolation, Chen et al. 2023): f_i / s
//   llama3  (Meta's Llama 3.1 rope_scaling: factor, low/high_freq_factor, original context)
//   yarn    (Peng et al. 2023, as HF transformers and llama.cpp discretise it: ramp between the
//           pairs that rotate beta_fast and beta_slow times over the original context; attention
//           factor 0.1 ln(s) + 1)
//   divided (a GGUF rope_freqs tensor / LongRoPE factors: f_i / d_i)
#include <gtest/gtest.h>
#include <kvprune/kvprune.h>
#include <math.h>
#include <string.h>

#include <kvprune/kvprune.hpp>
#include <string>
#include <vector>

#include "reference.h"

namespace {

const double kPi = 3.14159265358979323846;

// ---- references from the formulas (libm, double) ----

double base_f(double theta, uint32_t i, uint32_t n) { return 1.0 / pow(theta, 2.0 * i / (2.0 * n)); }

std::vector<double> ref_linear(uint32_t n, double theta, double s) {
    std::vector<double> r(n);
    for (uint32_t i = 0; i < n; ++i) r[i] = base_f(theta, i, n) / s;
    return r;
}

std::vector<double> ref_llama3(uint32_t n, double theta, double s, double lo, double hi, double L) {
    std::vector<double> r(n);
    for (uint32_t i = 0; i < n; ++i) {
        const double f = base_f(theta, i, n), wavelen = 2 * kPi / f;
        if (wavelen < L / hi) r[i] = f;
        else if (wavelen > L / lo) r[i] = f / s;
        else {
            const double smooth = (L / wavelen - lo) / (hi - lo);
            r[i] = (1 - smooth) * f / s + smooth * f;
        }
    }
    return r;
}

std::vector<double> ref_yarn(uint32_t n, double theta, double s, double L, double bf, double bs, double *mscale) {
    const double dim = 2.0 * n;
    // the (real) dimension index whose pair turns `rot` times over L
    auto dim_of = [&](double rot) { return dim * log(L / (rot * 2 * kPi)) / (2 * log(theta)); };
    double low = std::max(floor(dim_of(bf)), 0.0), high = std::min(ceil(dim_of(bs)), dim - 1);
    if (low == high) high += 0.001;
    std::vector<double> r(n);
    for (uint32_t i = 0; i < n; ++i) {
        const double extrap = base_f(theta, i, n), interp = extrap / s;
        const double ramp = std::min(std::max((i - low) / (high - low), 0.0), 1.0);
        const double keep = 1.0 - ramp;  // the share of the original frequency
        r[i] = interp * (1 - keep) + extrap * keep;
    }
    *mscale = s <= 1 ? 1.0 : 0.1 * log(s) + 1.0;
    return r;
}

void expect_close(const std::vector<double> &got, const std::vector<double> &want, const std::string &what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-13 * want[i]) << what << " pair " << i;
}

struct Params {
    uint32_t n;
    double theta, factor;
};

TEST(RopeHelpers, LinearMatchesTheFormula) {
    for (const Params &p : {Params{64, 10000, 1}, Params{64, 10000, 4}, Params{32, 500000, 8}, Params{1, 10000, 2},
                            Params{40, 1e6, 16}}) {
        std::vector<double> t(p.n);
        ASSERT_EQ(kvp_rope_freqs_linear(t.data(), p.n, p.theta, p.factor, nullptr, 0), KVP_OK);
        expect_close(t, ref_linear(p.n, p.theta, p.factor), "linear");
    }
}

TEST(RopeHelpers, Llama3MatchesTheFormula) {
    // Llama 3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192
    struct C {
        uint32_t n;
        double theta, s, lo, hi, L;
    };
    for (const C &c : {C{64, 500000, 8, 1, 4, 8192}, C{32, 500000, 32, 1, 4, 8192}, C{64, 10000, 4, 2, 8, 2048},
                       C{16, 10000, 2, 1, 4, 256}}) {
        std::vector<double> t(c.n);
        ASSERT_EQ(kvp_rope_freqs_llama3(t.data(), c.n, c.theta, c.s, c.lo, c.hi, c.L, nullptr, 0), KVP_OK);
        const std::vector<double> r = ref_llama3(c.n, c.theta, c.s, c.lo, c.hi, c.L);
        expect_close(t, r, "llama3");
        // the three bands all occur for Llama 3.1's parameters
        if (c.theta == 500000 && c.n == 64) {
            EXPECT_EQ(t[0], base_f(c.theta, 0, c.n));                              // fast pair kept
            EXPECT_NEAR(t[63], base_f(c.theta, 63, c.n) / 8, 1e-13 * t[63]);       // slow pair / factor
            int mid = 0;
            for (uint32_t i = 0; i < c.n; ++i) {
                const double f = base_f(c.theta, i, c.n);
                if (t[i] < f * (1 - 1e-9) && t[i] > f / 8 * (1 + 1e-9)) ++mid;
            }
            EXPECT_GT(mid, 0) << "a blended band";
        }
    }
}

TEST(RopeHelpers, YarnMatchesTheFormula) {
    // Qwen2.5 with YaRN: theta 1e6, head_dim 128, factor 4, original 32768, beta 32 / 1
    struct C {
        uint32_t n;
        double theta, s, L, bf, bs;
    };
    for (const C &c : {C{64, 1e6, 4, 32768, 32, 1}, C{64, 10000, 16, 4096, 32, 1}, C{32, 10000, 2, 2048, 16, 2},
                       C{64, 500000, 1, 8192, 32, 1}, C{4, 10000, 8, 64, 32, 1}}) {
        std::vector<double> t(c.n);
        float a = 0;
        ASSERT_EQ(kvp_rope_freqs_yarn(t.data(), c.n, c.theta, c.s, c.L, c.bf, c.bs, &a, nullptr, 0), KVP_OK);
        double ms = 0;
        const std::vector<double> r = ref_yarn(c.n, c.theta, c.s, c.L, c.bf, c.bs, &ms);
        expect_close(t, r, "yarn");
        EXPECT_NEAR(double(a), ms, 1e-6) << "attention factor, s=" << c.s;
        EXPECT_EQ(t[0], base_f(c.theta, 0, c.n)) << "the fastest pair is extrapolated (kept)";
    }
    // attn_factor may be NULL
    std::vector<double> t(8);
    EXPECT_EQ(kvp_rope_freqs_yarn(t.data(), 8, 10000, 4, 512, 32, 1, nullptr, nullptr, 0), KVP_OK);
}

TEST(RopeHelpers, DividedMatchesTheFormula) {
    const uint32_t n = 24;
    std::vector<float> d(n);
    ref::Rng g(5);
    for (float &x : d) x = g.uniform(0.5f, 40.0f);
    std::vector<double> t(n);
    ASSERT_EQ(kvp_rope_freqs_divided(t.data(), n, 500000, d.data(), nullptr, 0), KVP_OK);
    std::vector<double> r(n);
    for (uint32_t i = 0; i < n; ++i) r[i] = base_f(500000, i, n) / double(d[i]);
    expect_close(t, r, "divided");
    // Llama 3.1's factors as llama.cpp stores them in rope_freqs reproduce the llama3 helper
    std::vector<double> l3(64), via(64);
    ASSERT_EQ(kvp_rope_freqs_llama3(l3.data(), 64, 500000, 8, 1, 4, 8192, nullptr, 0), KVP_OK);
    std::vector<float> div(64);
    for (uint32_t i = 0; i < 64; ++i) div[i] = float(base_f(500000, i, 64) / l3[i]);
    ASSERT_EQ(kvp_rope_freqs_divided(via.data(), 64, 500000, div.data(), nullptr, 0), KVP_OK);
    for (uint32_t i = 0; i < 64; ++i) EXPECT_NEAR(via[i], l3[i], 1e-7 * l3[i]) << i;  // float divisors
}

// Bad parameters: a clear status and message, the table untouched.
TEST(RopeHelpers, BadParametersLeaveTheTableUntouched) {
    const double nan = NAN, inf = INFINITY;
    std::vector<double> t(8, 42.0);
    char err[256];
    auto untouched = [&]() {
        for (double x : t) EXPECT_EQ(x, 42.0);
    };
    auto fails = [&](kvp_status st, kvp_status want, const char *needle) {
        EXPECT_EQ(st, want) << err;
        EXPECT_NE(strstr(err, needle), nullptr) << err;
        untouched();
    };
    fails(kvp_rope_freqs_linear(nullptr, 8, 10000, 2, err, sizeof err), KVP_ERR_ARG, "inv_freq");
    fails(kvp_rope_freqs_linear(t.data(), 0, 10000, 2, err, sizeof err), KVP_ERR_ARG, "n (rope_dim/2");
    fails(kvp_rope_freqs_linear(t.data(), 8, 1.0, 2, err, sizeof err), KVP_ERR_CONFIG, "theta=1 must be finite and > 1");
    fails(kvp_rope_freqs_linear(t.data(), 8, nan, 2, err, sizeof err), KVP_ERR_CONFIG, "theta=nan");
    fails(kvp_rope_freqs_linear(t.data(), 8, inf, 2, err, sizeof err), KVP_ERR_CONFIG, "theta=inf");
    fails(kvp_rope_freqs_linear(t.data(), 8, 10000, 0.5, err, sizeof err), KVP_ERR_CONFIG, "factor=0.5");
    fails(kvp_rope_freqs_linear(t.data(), 8, 10000, nan, err, sizeof err), KVP_ERR_CONFIG, "factor=nan");
    fails(kvp_rope_freqs_llama3(t.data(), 8, 10000, 8, 4, 1, 8192, err, sizeof err), KVP_ERR_CONFIG, "low_freq_factor=4");
    fails(kvp_rope_freqs_llama3(t.data(), 8, 10000, 8, 0, 4, 8192, err, sizeof err), KVP_ERR_CONFIG, "0 < low_freq_factor");
    fails(kvp_rope_freqs_llama3(t.data(), 8, 10000, 8, 1, inf, 8192, err, sizeof err), KVP_ERR_CONFIG, "high_freq_factor=inf");
    fails(kvp_rope_freqs_llama3(t.data(), 8, 10000, 8, 1, 4, 0, err, sizeof err), KVP_ERR_CONFIG,
          "original_max_position_embeddings=0");
    fails(kvp_rope_freqs_llama3(t.data(), 8, 10000, 0.9, 1, 4, 8192, err, sizeof err), KVP_ERR_CONFIG, "factor=0.9");
    float a = 7.0f;
    fails(kvp_rope_freqs_yarn(t.data(), 8, 10000, 4, 4096, 1, 32, &a, err, sizeof err), KVP_ERR_CONFIG, "beta_fast=1");
    fails(kvp_rope_freqs_yarn(t.data(), 8, 10000, 4, 4096, 32, 0, &a, err, sizeof err), KVP_ERR_CONFIG, "beta_slow=0");
    fails(kvp_rope_freqs_yarn(t.data(), 8, 10000, 4, nan, 32, 1, &a, err, sizeof err), KVP_ERR_CONFIG,
          "original_max_position_embeddings=nan");
    fails(kvp_rope_freqs_yarn(t.data(), 8, 0.5, 4, 4096, 32, 1, &a, err, sizeof err), KVP_ERR_CONFIG, "theta=0.5");
    EXPECT_EQ(a, 7.0f);
    std::vector<float> d(8, 1.0f);
    d[3] = 0.0f;
    fails(kvp_rope_freqs_divided(t.data(), 8, 10000, d.data(), err, sizeof err), KVP_ERR_CONFIG, "divisors[3]=0");
    d[3] = NAN;
    fails(kvp_rope_freqs_divided(t.data(), 8, 10000, d.data(), err, sizeof err), KVP_ERR_CONFIG, "divisors[3]=nan");
    fails(kvp_rope_freqs_divided(t.data(), 8, 10000, nullptr, err, sizeof err), KVP_ERR_ARG, "divisors");
    // the message format of every library text
    EXPECT_EQ(kvp_rope_freqs_linear(t.data(), 8, 1.0, 2, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_EQ(strncmp(err, "KVP_ERR_CONFIG: ", 16), 0) << err;
    ASSERT_EQ(kvp_rope_freqs_linear(t.data(), 8, 10000, 2, err, sizeof err), KVP_OK);
    EXPECT_STREQ(err, "");
}

// ---- the table in the cache ----

kvp_config make_cfg(const kvp_model &m, const std::string &spec) {
    kvp_config cfg;
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << spec << ": " << err;
    return cfg;
}

// A cache created with kvp_create_rope in its own arena.
struct TCache {
    kvp_cache *c = nullptr;
    void *arena = nullptr;
    TCache(const kvp_config &cfg, const double *t, uint32_t n) {
        const size_t bytes = kvp_arena_size(&cfg);
        EXPECT_GT(bytes, 0u);
        arena = aligned_alloc(64, (bytes + 63) / 64 * 64);
        char err[256];
        EXPECT_EQ(kvp_create_rope(&cfg, t, n, arena, bytes, &c, err, sizeof err), KVP_OK) << err;
    }
    ~TCache() {
        kvp_destroy(c);
        free(arena);
    }
    TCache(const TCache &) = delete;
    TCache &operator=(const TCache &) = delete;
};

TEST(RopeTable, CreateRefusesBadTables) {
    const kvp_model m = ref::model(2, 4, 2, 32, KVP_ROPE_NEOX, 16);  // 8 pairs
    const kvp_config cfg = make_cfg(m, "policy=full capacity=64");
    const size_t bytes = kvp_arena_size(&cfg);
    void *arena = aligned_alloc(64, (bytes + 63) / 64 * 64);
    memset(arena, 0x5a, bytes);
    std::vector<double> t(8);
    ASSERT_EQ(kvp_rope_freqs_linear(t.data(), 8, 10000, 2, nullptr, 0), KVP_OK);
    char err[320];
    auto refused = [&](const double *tab, uint32_t n, kvp_status want, const char *needle) {
        kvp_cache *c = reinterpret_cast<kvp_cache *>(0x1);
        EXPECT_EQ(kvp_rope_check(&cfg, tab, n, err, sizeof err), want) << err;
        EXPECT_NE(strstr(err, needle), nullptr) << err;
        EXPECT_EQ(kvp_create_rope(&cfg, tab, n, arena, bytes, &c, err, sizeof err), want) << err;
        EXPECT_NE(strstr(err, needle), nullptr) << err;
        EXPECT_EQ(c, reinterpret_cast<kvp_cache *>(0x1)) << "*out is set only on success";
        for (size_t i = 0; i < bytes; ++i)
            if (static_cast<unsigned char *>(arena)[i] != 0x5a) {
                ADD_FAILURE() << "arena written by a refused create (" << needle << ")";
                break;
            }
    };
    refused(t.data(), 7, KVP_ERR_CONFIG, "n=7 entries; it needs rope_dim/2=8");
    refused(t.data(), 16, KVP_ERR_CONFIG, "n=16");
    refused(nullptr, 8, KVP_ERR_ARG, "inv_freq is NULL but n=8");
    for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {
        std::vector<double> b = t;
        b[5] = bad;
        refused(b.data(), 8, KVP_ERR_CONFIG, "inv_freq[5]=");
    }
    kvp_model none = m;
    none.rope = KVP_ROPE_NONE;
    const kvp_config cn = make_cfg(none, "policy=full capacity=64");
    EXPECT_EQ(kvp_rope_check(&cn, t.data(), 8, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "KVP_ROPE_NONE"), nullptr) << err;
    EXPECT_EQ(kvp_rope_check(nullptr, t.data(), 8, err, sizeof err), KVP_ERR_ARG);
    EXPECT_EQ(kvp_rope_check(&cfg, nullptr, 0, err, sizeof err), KVP_OK);
    EXPECT_EQ(kvp_rope_check(&cfg, t.data(), 8, err, sizeof err), KVP_OK) << err;
    free(arena);
}

TEST(RopeTable, AttnFactorKey) {
    const kvp_model m = ref::model(1, 2, 1, 64);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(cfg.rope_attn_factor, 1.0f);
    char err[320];
    for (const char *bad : {"rope_attn_factor=0", "rope_attn_factor=-1", "rope_attn_factor=nan", "rope_attn_factor=100"}) {
        const kvp_config before = cfg;
        EXPECT_EQ(kvp_config_apply(&cfg, bad, err, sizeof err), KVP_ERR_CONFIG) << bad;
        EXPECT_NE(strstr(err, "rope_attn_factor"), nullptr) << err;
        EXPECT_EQ(memcmp(&before, &cfg, sizeof cfg), 0) << bad;
    }
    ASSERT_EQ(kvp_config_apply(&cfg, "rope_attn_factor=1.25", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(cfg.rope_attn_factor, 1.25f);
    // score=fixed: the logit scale times a^2 must stay <= 1 (1/8 * 3^2 > 1)
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=h2o score=fixed rope_attn_factor=3", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(err, "rope_attn_factor^2 <= 1"), nullptr) << err;
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=h2o score=fixed rope_attn_factor=2", err, sizeof err), KVP_OK) << err;
    // set in the struct directly: kvp_config_check and kvp_create judge it by the same range
    for (float bad : {0.0f, -2.0f, float(NAN), float(INFINITY), 65.0f}) {
        kvp_config c2;
        ASSERT_EQ(kvp_config_default(&c2, &m), KVP_OK);
        c2.rope_attn_factor = bad;
        EXPECT_EQ(kvp_config_check(&c2, err, sizeof err), KVP_ERR_CONFIG) << bad;
        EXPECT_NE(strstr(err, "rope_attn_factor"), nullptr) << err;
        EXPECT_EQ(kvp_arena_size(&c2), 0u);
        kvp_cache *c = nullptr;
        EXPECT_EQ(kvp_create_rope(&c2, nullptr, 0, nullptr, 0, &c, err, sizeof err), KVP_ERR_CONFIG);
        EXPECT_EQ(c, nullptr);
    }
}

// Runs a prompt and decodes through caches a and b with the same inputs; b may be NULL.
// Returns the outputs of every call concatenated.
std::vector<float> run(kvp_cache *c, const kvp_model &m, uint64_t seed, uint32_t prompt, uint32_t decodes,
                       float qk = 1.0f) {
    ref::Inputs in(m, prompt + decodes, seed, qk);
    std::vector<float> outs, out(size_t(prompt) * in.nq);
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        EXPECT_EQ(kvp_prefill(c, l, prompt, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c);
        outs.insert(outs.end(), out.begin(), out.end());
    }
    for (uint32_t t = prompt; t < prompt + decodes; ++t)
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            EXPECT_EQ(kvp_decode(c, l, in.qt(t), in.kt(t), in.vt(t), out.data()), KVP_OK) << kvp_last_error(c);
            outs.insert(outs.end(), out.begin(), out.begin() + in.nq);
        }
    return outs;
}

std::vector<int32_t> kept(kvp_cache *c, const kvp_model &m) {
    std::vector<int32_t> all;
    for (uint32_t l = 0; l < m.n_layers; ++l)
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            std::vector<int32_t> p(4096);
            uint32_t n = 0;
            EXPECT_EQ(kvp_layer_positions(c, l, h, p.data(), 4096, &n), KVP_OK);
            all.push_back(-1);
            all.insert(all.end(), p.begin(), p.begin() + n);
        }
    return all;
}

const char *const kSpecs[] = {
    "policy=full capacity=160",
    "policy=streaming sinks=4 window=40 capacity=64",  // realign (its default)
    "policy=h2o budget=32 recent=4 capacity=48 positions=realign",
    "policy=snapkv budget=32 obs_window=8 capacity=48",
    "policy=lethe budget=32 capacity=64 positions=realign",
};
const char *const kDtypes[] = {"f32", "f16", "q8", "q4"};

// Every path rotates with the table: a cache of theta 10000 given the table of theta2 (computed
// as the library computes theta's frequencies, pow(theta, -2i/rope_dim)) is bit-identical to a
// cache of theta2 without a table, for every policy, storage format and positions mode. Any path
// still rotating by the model's theta would differ.
TEST(RopeTable, UsedByEveryFloatPath) {
    for (kvp_rope_style style : {KVP_ROPE_GPTJ, KVP_ROPE_NEOX}) {
        const kvp_model m = ref::model(2, 4, 2, 32, style, style == KVP_ROPE_NEOX ? 24 : 0, 10000.0f);
        kvp_model m2 = m;
        m2.rope_theta = 977.0f;
        const uint32_t pairs = (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
        std::vector<double> t(pairs);
        for (uint32_t i = 0; i < pairs; ++i) t[i] = pow(double(m2.rope_theta), -2.0 * double(i) / double(2 * pairs));
        for (const char *spec : kSpecs)
            for (const char *dt : kDtypes) {
                const std::string s = std::string(spec) + " quant_group=16 kv_dtype=" + dt;
                TCache a(make_cfg(m, s), t.data(), pairs), b(make_cfg(m2, s), nullptr, 0), plain(make_cfg(m, s), nullptr, 0);
                ASSERT_TRUE(a.c && b.c && plain.c) << s;
                const std::vector<float> oa = run(a.c, m, 3, 30, 90), ob = run(b.c, m, 3, 30, 90),
                                         op = run(plain.c, m, 3, 30, 90);
                EXPECT_TRUE(oa == ob) << s << " style " << style << ": the table's outputs differ from theta2's";
                EXPECT_TRUE(kept(a.c, m) == kept(b.c, m)) << s;
                EXPECT_FALSE(oa == op) << s << ": the table changed nothing (test cannot fail)";
                if (HasFatalFailure()) return;
            }
    }
}

// score=fixed rotates with its own copy of the table: a table equal to the deterministic one
// score=fixed derives from theta2 (kvp_rope_freqs_linear with factor 1 computes it the same
// way) keeps exactly theta2's tokens.
TEST(RopeTable, UsedByFixedScoring) {
    const kvp_model m = ref::model(2, 4, 2, 32, KVP_ROPE_NEOX, 0, 10000.0f);
    kvp_model m2 = m;
    m2.rope_theta = 977.0f;
    std::vector<double> t(16);
    ASSERT_EQ(kvp_rope_freqs_linear(t.data(), 16, double(m2.rope_theta), 1.0, nullptr, 0), KVP_OK);
    for (const char *spec : {"policy=h2o budget=24 recent=4 capacity=40 positions=realign score=fixed",
                             "policy=snapkv budget=24 obs_window=4 capacity=40 score=fixed kv_dtype=q4 quant_group=8",
                             "policy=lethe budget=32 capacity=64 score=fixed"}) {
        TCache a(make_cfg(m, spec), t.data(), 16), b(make_cfg(m2, spec), nullptr, 0), plain(make_cfg(m, spec), nullptr, 0);
        ASSERT_TRUE(a.c && b.c && plain.c) << spec;
        const std::vector<float> oa = run(a.c, m, 9, 30, 80, 3.0f), ob = run(b.c, m, 9, 30, 80, 3.0f);
        run(plain.c, m, 9, 30, 80, 3.0f);
        EXPECT_TRUE(kept(a.c, m) == kept(b.c, m)) << spec;
        EXPECT_FALSE(kept(a.c, m) == kept(plain.c, m)) << spec << ": the table changed no decision (test cannot fail)";
        ASSERT_EQ(oa.size(), ob.size());
        for (size_t i = 0; i < oa.size(); ++i) ASSERT_NEAR(oa[i], ob[i], 1e-5f) << spec << " at " << i;
    }
}

// The attention factor a multiplies every logit by a^2: bit-identical to attn_scale =
// (attn_scale or 1/sqrt(head_dim)) * a^2, float and fixed, every storage format.
TEST(RopeTable, AttnFactorIsALogitScale) {
    const kvp_model m = ref::model(2, 4, 2, 64, KVP_ROPE_NEOX);
    const float a = 1.3f;
    const float eq = float(0.125 * double(a) * double(a));
    const float eq2 = float(double(0.09f) * double(a) * double(a));
    for (const char *spec : {"policy=full capacity=160", "policy=h2o budget=24 recent=4 capacity=40",
                             "policy=h2o budget=24 recent=4 capacity=40 score=fixed",
                             "policy=streaming sinks=4 window=40 capacity=64 kv_dtype=q4 quant_group=16"}) {
        ref::Cache x(m, std::string(spec) + " rope_attn_factor=1.3"), y(m, std::string(spec) + " attn_scale=" + std::to_string(eq)),
            x2(m, std::string(spec) + " rope_attn_factor=1.3 attn_scale=0.09"),
            y2(m, std::string(spec) + " attn_scale=" + std::to_string(eq2));
        // std::to_string rounds to 6 decimals: compare against the exact float instead when it does
        kvp_config cy = make_cfg(m, spec), cy2 = make_cfg(m, spec);
        cy.attn_scale = eq;
        cy2.attn_scale = eq2;
        TCache ye(cy, nullptr, 0), ye2(cy2, nullptr, 0);
        const std::vector<float> ox = run(x.c, m, 4, 30, 40), oy = run(ye.c, m, 4, 30, 40), o1 = run(y.c, m, 4, 30, 40);
        const std::vector<float> ox2 = run(x2.c, m, 4, 30, 40), oy2 = run(ye2.c, m, 4, 30, 40);
        EXPECT_TRUE(ox == oy) << spec;
        EXPECT_TRUE(ox2 == oy2) << spec << " with attn_scale";
        EXPECT_TRUE(kept(x.c, m) == kept(ye.c, m)) << spec;
        (void)o1;
    }
}

// Against a double reference written from the definition: pair i of query and key rotates by
// pos * inv_freq[i] (GPTJ: dims 2i, 2i+1; NEOX: i, i + rope_dim/2), dims past rope_dim unrotated,
// logit = q.k / sqrt(head_dim) * a^2.
void ref_rotate(const kvp_model &m, const std::vector<double> &t, std::vector<double> &x, int64_t pos) {
    const uint32_t rd = m.rope_dim ? m.rope_dim : m.head_dim;
    for (uint32_t i = 0; i < rd / 2; ++i) {
        const double ang = double(pos) * t[i], c = cos(ang), s = sin(ang);
        const uint32_t i0 = m.rope == KVP_ROPE_GPTJ ? 2 * i : i, i1 = m.rope == KVP_ROPE_GPTJ ? 2 * i + 1 : i + rd / 2;
        const double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

TEST(RopeTable, MatchesTheDoubleReference) {
    for (kvp_rope_style style : {KVP_ROPE_GPTJ, KVP_ROPE_NEOX}) {
        const kvp_model m = ref::model(1, 4, 2, 32, style, 24);
        std::vector<double> t(12);
        ASSERT_EQ(kvp_rope_freqs_yarn(t.data(), 12, 10000, 8, 64, 32, 1, nullptr, nullptr, 0), KVP_OK);
        const double a = 1.2;
        kvp_config cfg = make_cfg(m, "policy=full capacity=400 rope_attn_factor=1.2");
        TCache c(cfg, t.data(), 12);
        const uint32_t T = 300;
        ref::Inputs in(m, T, 11, 1.0f);
        std::vector<float> out(size_t(T) * in.nq);
        ASSERT_EQ(kvp_prefill(c.c, 0, T, nullptr, in.qt(0), in.kt(0), in.vt(0), out.data(), nullptr), KVP_OK);
        const uint32_t hd = m.head_dim;
        double worst = 0;
        for (uint32_t tq : {0u, 1u, 63u, 150u, 299u}) {
            for (uint32_t h = 0; h < m.n_q_heads; ++h) {
                const uint32_t kvh = h / in.G;
                std::vector<double> q(in.qt(tq) + h * hd, in.qt(tq) + (h + 1) * hd);
                ref_rotate(m, t, q, tq);
                std::vector<double> lg(tq + 1), o(hd, 0.0);
                double mx = -INFINITY, sum = 0;
                for (uint32_t j = 0; j <= tq; ++j) {
                    std::vector<double> k(in.kt(j) + kvh * hd, in.kt(j) + (kvh + 1) * hd);
                    ref_rotate(m, t, k, j);
                    double d = 0;
                    for (uint32_t i = 0; i < hd; ++i) d += q[i] * k[i];
                    lg[j] = d / sqrt(double(hd)) * a * a;
                    mx = std::max(mx, lg[j]);
                }
                for (double &x : lg) sum += (x = exp(x - mx));
                for (uint32_t j = 0; j <= tq; ++j)
                    for (uint32_t i = 0; i < hd; ++i) o[i] += lg[j] / sum * in.vt(j)[kvh * hd + i];
                for (uint32_t i = 0; i < hd; ++i)
                    worst = std::max(worst, fabs(o[i] - double(out[size_t(tq) * in.nq + h * hd + i])));
            }
        }
        EXPECT_LT(worst, 2e-5) << "style " << style;
    }
}

// The table is part of the state's identity; states saved without a table (all states written
// before tables existed, tests/data/state) still load into caches without one.
TEST(RopeTable, StateChecksTheTable) {
    const kvp_model m = ref::model(2, 4, 2, 16, KVP_ROPE_NEOX);
    const std::string spec = "policy=h2o budget=24 recent=4 capacity=40";
    std::vector<double> t(8), u(8);
    ASSERT_EQ(kvp_rope_freqs_linear(t.data(), 8, 10000, 4, nullptr, 0), KVP_OK);
    ASSERT_EQ(kvp_rope_freqs_linear(u.data(), 8, 10000, 2, nullptr, 0), KVP_OK);
    const kvp_config cfg = make_cfg(m, spec);
    TCache a(cfg, t.data(), 8), same(cfg, t.data(), 8), other(cfg, u.data(), 8), none(cfg, nullptr, 0);
    run(a.c, m, 5, 30, 20);
    run(other.c, m, 6, 10, 2);
    std::vector<uint8_t> st(kvp_state_size(a.c));
    ASSERT_EQ(kvp_state_save(a.c, st.data(), st.size(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_state_load(same.c, st.data(), st.size()), KVP_OK) << kvp_last_error(same.c);
    EXPECT_TRUE(kept(a.c, m) == kept(same.c, m));
    EXPECT_TRUE(run(a.c, m, 8, 1, 10) == run(same.c, m, 8, 1, 10)) << "continues bit for bit";
    const std::vector<int32_t> before = kept(other.c, m);
    EXPECT_EQ(kvp_state_load(other.c, st.data(), st.size()), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(other.c), "the tables differ"), nullptr) << kvp_last_error(other.c);
    EXPECT_TRUE(kept(other.c, m) == before) << "a refused load changes nothing";
    EXPECT_EQ(kvp_state_load(none.c, st.data(), st.size()), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(none.c), "with a caller RoPE frequency table"), nullptr) << kvp_last_error(none.c);
    // and the other way: a theta state into a table cache
    std::vector<uint8_t> sn(kvp_state_size(none.c));
    ASSERT_EQ(kvp_state_save(none.c, sn.data(), sn.size(), nullptr), KVP_OK);
    EXPECT_EQ(kvp_state_load(a.c, sn.data(), sn.size()), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(a.c), "with theta's RoPE frequencies"), nullptr) << kvp_last_error(a.c);
    // the attention factor is a config key: compared as one
    TCache f(make_cfg(m, spec + " rope_attn_factor=1.1"), t.data(), 8);
    EXPECT_EQ(kvp_state_load(f.c, st.data(), st.size()), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(f.c), "rope_attn_factor"), nullptr) << kvp_last_error(f.c);
}

// The C++ wrapper passes the table through.
TEST(RopeTable, CxxCreate) {
    const kvp_model m = ref::model(1, 2, 1, 16, KVP_ROPE_NEOX);
    std::vector<double> t(8);
    ASSERT_EQ(kvp_rope_freqs_linear(t.data(), 8, 10000, 4, nullptr, 0), KVP_OK);
    kvprune::Cache c;
    EXPECT_EQ(c.create(make_cfg(m, "policy=full capacity=32"), t.data(), 7), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(c.create_error(), "n=7"), nullptr) << c.create_error();
    EXPECT_FALSE(bool(c));
    EXPECT_EQ(c.create(make_cfg(m, "policy=full capacity=32"), t.data(), 8), KVP_OK) << c.create_error();
    EXPECT_TRUE(bool(c));
}

}  // namespace
