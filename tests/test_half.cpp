// Half-precision inputs and outputs (issue 21 item 7): kvp_prefill_ex / kvp_decode_ex /
// kvp_append_ex with KVP_IO_F16 and KVP_IO_BF16 against a twin cache that gets the same inputs
// widened to float32 through the plain calls. For every policy family x kv_dtype x positions mode
// (and score=fixed, and drafts): after every call the two caches' saved states are the same
// bytes, and every half output is the twin's float32 output rounded to the half type (ties to
// even) by this test's own rounding (not the library's). Bad half inputs: status, message,
// unchanged cache.
#include <gtest/gtest.h>
#include <string.h>

#include <cmath>
#include <string>
#include <vector>

#include "io.h"
#include "kvprune/kvprune.h"
#include "cache.h"
#include "reference.h"

namespace {

// ---- the test's own conversions (by arithmetic in double, not bit tricks) ----

// Rounds a finite x to a binary format with `mant` fraction bits and minimum normal exponent
// emin (subnormals below), ties to even; returns the rounded value (exact in double).
double round_to(double x, int mant, int emin) {
    if (x == 0) return x;
    int e;
    std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
    int ue = e - 1;                // |x| in [2^ue, 2^(ue+1))
    if (ue < emin) ue = emin;
    const double ulp = std::ldexp(1.0, ue - mant);
    return std::nearbyint(x / ulp) * ulp;  // default rounding: to nearest, ties to even
}

uint16_t ref_to_f16(float f) {
    const double r = round_to(double(f), 10, -14);
    const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
    const double a = std::fabs(r);
    if (a >= 65536.0) return uint16_t(sign | 0x7c00);
    if (a < std::ldexp(1.0, -14)) return uint16_t(sign | uint16_t(a / std::ldexp(1.0, -24)));
    int e;
    const double fr = std::frexp(a, &e);  // a = fr * 2^e
    const int E = e - 1;
    return uint16_t(sign | uint16_t((E + 15) << 10) | uint16_t(std::ldexp(fr, 11) - 1024.0));
}

float ref_from_f16(uint16_t h) {
    const int E = (h >> 10) & 31, M = h & 1023;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (E == 0) return float(s * std::ldexp(double(M), -24));
    return float(s * std::ldexp(double(1024 + M), E - 25));
}

uint16_t ref_to_bf16(float f) {
    const float r = float(round_to(double(f), 7, -126));
    uint32_t u;
    memcpy(&u, &r, 4);
    return uint16_t(u >> 16);
}

float ref_from_bf16(uint16_t b) {
    const int E = (b >> 7) & 255, M = b & 127;
    const double s = (b & 0x8000) ? -1.0 : 1.0;
    if (E == 0) return float(s * std::ldexp(double(M), -133));
    return float(s * std::ldexp(double(128 + M), E - 134));
}

uint16_t to_half(kvp_io_dtype dt, float f) { return dt == KVP_IO_F16 ? ref_to_f16(f) : ref_to_bf16(f); }
float from_half(kvp_io_dtype dt, uint16_t h) { return dt == KVP_IO_F16 ? ref_from_f16(h) : ref_from_bf16(h); }

TEST(Half, OwnConversionsRoundTrip) {
    // every f16 and every finite bf16 round-trips through the test's conversions
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7c00) != 0x7c00) {
            ASSERT_EQ(ref_to_f16(ref_from_f16(uint16_t(h))), h) << std::hex << h;
        }
        if ((h & 0x7f80) != 0x7f80 && (h & 0x7f80) != 0) {
            ASSERT_EQ(ref_to_bf16(ref_from_bf16(uint16_t(h))), h) << std::hex << h;
        }
    }
    EXPECT_EQ(ref_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // a tie: to even
    EXPECT_EQ(ref_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    EXPECT_EQ(ref_to_f16(65519.0f), 0x7bff);
    EXPECT_EQ(ref_to_f16(65520.0f), 0x7c00);
}

// The library's conversions (io.h: the scalar code, and io_load / io_store, which use F16C where
// the CPU has it) against the test's, on every half value and on floats of every binade
// (ties, subnormal results, overflow).
TEST(Half, LibraryConversions) {
    std::vector<uint16_t> all(0x10000);
    for (uint32_t h = 0; h < 0x10000; ++h) all[h] = uint16_t(h);
    std::vector<float> wf(all.size()), wb(all.size());
    kvp::io_load(wf.data(), all.data(), kvp::kIoF16, all.size());
    kvp::io_load(wb.data(), all.data(), kvp::kIoBF16, all.size());
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7c00) != 0x7c00) {
            ASSERT_EQ(kvp::f16_to_f32(uint16_t(h)), ref_from_f16(uint16_t(h))) << std::hex << h;
            ASSERT_EQ(wf[h], ref_from_f16(uint16_t(h))) << std::hex << h;
        }
        if ((h & 0x7f80) != 0x7f80) {
            ASSERT_EQ(wb[h], kvp::bf16_to_f32(uint16_t(h))) << std::hex << h;
        }
    }
    ref::Rng g(3);
    std::vector<float> x(1 << 16);
    for (size_t i = 0; i < x.size(); ++i) {
        const int e = int(g.next() % 50) - 30;  // 2^-30 .. 2^19
        float f = std::ldexp(g.uniform(1.0f, 2.0f), e);
        if (i % 7 == 0) f = std::ldexp(float(g.next() % 4096) + 0.5f, e - 12);  // ties at many scales
        x[i] = (g.next() & 1) ? -f : f;
    }
    std::vector<uint16_t> hf(x.size()), hb(x.size());
    kvp::io_store(hf.data(), kvp::kIoF16, x.data(), x.size());
    kvp::io_store(hb.data(), kvp::kIoBF16, x.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(kvp::f32_to_f16(x[i]), ref_to_f16(x[i])) << x[i];
        ASSERT_EQ(hf[i], ref_to_f16(x[i])) << x[i];
        ASSERT_EQ(kvp::f32_to_bf16(x[i]), ref_to_bf16(x[i])) << x[i];
        ASSERT_EQ(hb[i], ref_to_bf16(x[i])) << x[i];
    }
}

// ---- twins ----

const char *const kSpecs[] = {
    "policy=full capacity=400",
    "policy=window window=60 capacity=70",
    "policy=streaming sinks=4 window=40 compress_every=4 slack=6 max_drop=3 capacity=60",
    "policy=h2o budget=64 recent=8 capacity=96",
    "policy=h2o budget=64 recent=8 capacity=96 total_capacity=150",
    "policy=snapkv budget=48 obs_window=8 capacity=80 recent=4 prefill_stage=64",
    "policy=pyramidkv budget=48 obs_window=8 beta=5 prefill_stage=64",
    "policy=lethe capacity=200 evict_threshold=30 sparse_ratio=1.2 obs_window=8",
    "policy=simlayerkv nonlazy=h2o budget=64 recent=8 capacity=96 sinks=4 window=24 lazy_last=8 lazy_threshold=0.2",
    "policy=simlayerkv sinks=4 window=24 capacity=260 lazy_last=8 lazy_mode=decode lazy_threshold=0.2",
    "policy=asl budget=64 obs_window=8 capacity=100 recent=8 asl_min_layer=1",
    "policy=think token_policy=h2o budget=64 recent=8 capacity=96 key_channel_ratio=0.4 value_channel_ratio=0.2",
    "policy=h2o budget=64 recent=8 capacity=96 score=fixed",
    "policy=snapkv budget=48 obs_window=8 capacity=80 recent=4 prefill_stage=64 score=fixed",
};
const char *const kDtypes[] = {"f32", "f16", "q8", "q4"};
const char *const kPositions[] = {"original", "realign"};

std::vector<uint8_t> state_of(kvp_cache *c) {
    std::vector<uint8_t> s(kvp_state_size(c));
    size_t w = 0;
    EXPECT_EQ(kvp_state_save(c, s.data(), s.size(), &w), KVP_OK) << kvp_last_error(c);
    return s;
}

struct Half {
    kvp_io_dtype dt;
    ref::Rng g;
    std::vector<uint16_t> hq, hk, hv, ho;
    std::vector<float> fq, fk, fv, fo;
    uint32_t nq, nkv;
    Half(kvp_io_dtype d, uint64_t seed, uint32_t nq_, uint32_t nkv_, uint32_t tokens)
        : dt(d), g(seed), nq(nq_), nkv(nkv_) {
        hq.resize(size_t(tokens) * nq);
        ho.resize(hq.size());
        fq.resize(hq.size());
        fo.resize(hq.size());
        hk.resize(size_t(tokens) * nkv);
        hv.resize(hk.size());
        fk.resize(hk.size());
        fv.resize(hk.size());
    }
    float draw(float scale) {
        const uint64_t r = g.next() % 64;
        if (r == 0) return g.uniform(-1e-6f, 1e-6f);  // f16 subnormals
        if (r == 1) return 0.0f;
        return g.uniform(-scale, scale);
    }
    void fill(uint32_t n) {
        for (size_t i = 0; i < size_t(n) * nq; ++i) fq[i] = from_half(dt, hq[i] = to_half(dt, draw(2)));
        for (size_t i = 0; i < size_t(n) * nkv; ++i) fk[i] = from_half(dt, hk[i] = to_half(dt, draw(2)));
        for (size_t i = 0; i < size_t(n) * nkv; ++i) fv[i] = from_half(dt, hv[i] = to_half(dt, draw(1)));
    }
    // The half outputs are the f32 outputs rounded by the test.
    void expect_outputs(uint32_t n, const std::string &where) {
        for (size_t i = 0; i < size_t(n) * nq; ++i)
            ASSERT_EQ(ho[i], to_half(dt, fo[i])) << where << " output " << i << " f32 " << fo[i];
    }
};

// The two caches hold the same state: their saved states are the same bytes (which also needs
// a saved state to depend only on the calls: ASL's policy region and the converted rows of
// tokens evicted while residual (simlayerkv lazy_mode=decode, kv_dtype=f16) once held arena
// bytes; both are zeroed now).
void expect_same(const ref::Cache &a, const ref::Cache &b, const kvp_model &, const std::string &where) {
    const std::vector<uint8_t> sa = state_of(a.c), sb = state_of(b.c);
    size_t first = 0;  // bytes 24..31: the checksum
    while (first < sa.size() && first < sb.size() && (sa[first] == sb[first] || (first >= 24 && first < 32))) ++first;
    ASSERT_TRUE(sa == sb) << where << ": the saved states differ first at byte " << first << " of " << sa.size();
}

// Prompt, then random calls (decode, prefill chunks, appends, drafts) on both caches.
void run_twin(const kvp_model &m, const std::string &spec, kvp_io_dtype dt, uint32_t steps, uint64_t seed) {
    ref::Cache a(m, spec), b(m, spec);
    if (!a.c || !b.c) {
        ADD_FAILURE() << "cannot create " << spec;
        return;
    }
    const uint32_t nq = m.n_q_heads * m.head_dim, nkv = m.n_kv_heads * m.head_dim, L = m.n_layers, P = 24;
    Half h(dt, seed, nq, nkv, P);
    const bool drafts = spec.find("max_draft") != std::string::npos;
    int32_t idx[512];
    kvp_selection sa, sb;
    sa.struct_size = sb.struct_size = sizeof sa;
    sa.capacity = sb.capacity = 512;
    sa.indices = sb.indices = idx;
    h.fill(P);
    for (uint32_t l = 0; l < L; ++l) {
        const kvp_status s1 = kvp_prefill_ex(a.c, l, P, nullptr, dt, h.hq.data(), h.hk.data(), h.hv.data(), h.ho.data(), &sa);
        const kvp_status s2 = kvp_prefill(b.c, l, P, nullptr, h.fq.data(), h.fk.data(), h.fv.data(), h.fo.data(), &sb);
        ASSERT_EQ(s1, s2) << spec << ": " << kvp_last_error(a.c);
        ASSERT_EQ(s1, KVP_OK) << spec << ": " << kvp_last_error(a.c);
        h.expect_outputs(P, spec + " prompt layer " + std::to_string(l));
        if (::testing::Test::HasFatalFailure()) return;
    }
    expect_same(a, b, m, spec + " after the prompt");
    if (::testing::Test::HasFatalFailure()) return;
    for (uint32_t s = 0; s < steps; ++s) {
        const std::string where = spec + " step " + std::to_string(s);
        const uint32_t kind = uint32_t(h.g.next() % 8);
        if (drafts && kind == 7) {  // a draft: both caches draft the same tokens, commit the same count
            const uint32_t n = 1 + uint32_t(h.g.next() % 4), acc = uint32_t(h.g.next() % (n + 1));
            h.fill(n);
            ASSERT_EQ(kvp_draft_begin(a.c), KVP_OK) << kvp_last_error(a.c);
            ASSERT_EQ(kvp_draft_begin(b.c), KVP_OK);
            bool refused = false;
            const bool by_decode = h.g.next() % 2 == 0;
            for (uint32_t l = 0; l < L && !refused; ++l) {
                if (by_decode) {
                    for (uint32_t i = 0; i < n && !refused; ++i) {
                        const kvp_status s1 = kvp_decode_ex(a.c, l, dt, &h.hq[size_t(i) * nq], &h.hk[size_t(i) * nkv],
                                                            &h.hv[size_t(i) * nkv], &h.ho[size_t(i) * nq]);
                        const kvp_status s2 = kvp_decode(b.c, l, &h.fq[size_t(i) * nq], &h.fk[size_t(i) * nkv],
                                                         &h.fv[size_t(i) * nkv], &h.fo[size_t(i) * nq]);
                        ASSERT_EQ(s1, s2) << where;
                        refused = s1 != KVP_OK;
                    }
                } else {
                    const kvp_status s1 =
                        kvp_prefill_ex(a.c, l, n, nullptr, dt, h.hq.data(), h.hk.data(), h.hv.data(), h.ho.data(), nullptr);
                    const kvp_status s2 =
                        kvp_prefill(b.c, l, n, nullptr, h.fq.data(), h.fk.data(), h.fv.data(), h.fo.data(), nullptr);
                    ASSERT_EQ(s1, s2) << where;
                    refused = s1 != KVP_OK;
                }
                if (!refused) h.expect_outputs(n, where + " draft layer " + std::to_string(l));
                if (::testing::Test::HasFatalFailure()) return;
            }
            const uint32_t c = refused ? 0 : acc;
            ASSERT_EQ(kvp_draft_commit(a.c, c), KVP_OK) << where << ": " << kvp_last_error(a.c);
            ASSERT_EQ(kvp_draft_commit(b.c, c), KVP_OK) << where;
        } else if (kind >= 5) {  // a prefill chunk (with outputs) or an append
            const uint32_t n = 1 + uint32_t(h.g.next() % 5);
            h.fill(n);
            const bool append = kind == 6;
            for (uint32_t l = 0; l < L; ++l) {
                kvp_status s1, s2;
                if (append) {
                    s1 = kvp_append_ex(a.c, l, n, nullptr, dt, h.hk.data(), h.hv.data());
                    s2 = kvp_append(b.c, l, n, nullptr, h.fk.data(), h.fv.data());
                } else {
                    s1 = kvp_prefill_ex(a.c, l, n, nullptr, dt, h.hq.data(), h.hk.data(), h.hv.data(), h.ho.data(), &sa);
                    s2 = kvp_prefill(b.c, l, n, nullptr, h.fq.data(), h.fk.data(), h.fv.data(), h.fo.data(), &sb);
                }
                ASSERT_EQ(s1, s2) << where << ": " << kvp_last_error(a.c);
                if (s1 != KVP_OK) return;  // full on both (policy=full at capacity)
                if (!append) h.expect_outputs(n, where + " prefill layer " + std::to_string(l));
                if (::testing::Test::HasFatalFailure()) return;
            }
        } else {  // a decode
            h.fill(1);
            for (uint32_t l = 0; l < L; ++l) {
                const kvp_status s1 = kvp_decode_ex(a.c, l, dt, h.hq.data(), h.hk.data(), h.hv.data(), h.ho.data());
                const kvp_status s2 = kvp_decode(b.c, l, h.fq.data(), h.fk.data(), h.fv.data(), h.fo.data());
                ASSERT_EQ(s1, s2) << where << ": " << kvp_last_error(a.c);
                if (s1 != KVP_OK) return;
                h.expect_outputs(1, where + " decode layer " + std::to_string(l));
                if (::testing::Test::HasFatalFailure()) return;
            }
        }
        expect_same(a, b, m, where);
        if (::testing::Test::HasFatalFailure()) return;
    }
}

class HalfTwin : public ::testing::TestWithParam<int> {};

TEST_P(HalfTwin, SameStateAndRoundedOutputs) {
    const kvp_io_dtype dt = GetParam() ? KVP_IO_BF16 : KVP_IO_F16;
    const kvp_model m = ref::model(2, 4, 2, 32);
    uint64_t seed = 11 + uint64_t(GetParam()) * 1000;
    for (const char *spec : kSpecs)
        for (const char *kd : kDtypes)
            for (const char *pos : kPositions) {
                const std::string s = std::string(spec) + " kv_dtype=" + kd + " positions=" + pos;
                run_twin(m, s, dt, 24, ++seed);
                if (::testing::Test::HasFatalFailure()) return;
            }
}

TEST_P(HalfTwin, Drafts) {
    const kvp_io_dtype dt = GetParam() ? KVP_IO_BF16 : KVP_IO_F16;
    const kvp_model m = ref::model(2, 4, 2, 32);
    uint64_t seed = 77 + uint64_t(GetParam()) * 1000;
    for (const char *spec : {"policy=h2o budget=64 recent=8 capacity=96", "policy=streaming sinks=4 window=40 compress_every=4 capacity=60",
                             "policy=snapkv budget=48 obs_window=8 capacity=80 recent=4 prefill_stage=64 score=fixed"})
        for (const char *kd : {"f32", "q4"})
            for (const char *pos : kPositions) {
                const std::string s = std::string(spec) + " kv_dtype=" + kd + " positions=" + pos + " max_draft=4";
                run_twin(m, s, dt, 30, ++seed);
                if (::testing::Test::HasFatalFailure()) return;
            }
}

// Threads: the split decode and split prefill schedules write half outputs too.
TEST_P(HalfTwin, Threads) {
    ref::ForceParallel fp(true);
    const kvp_io_dtype dt = GetParam() ? KVP_IO_BF16 : KVP_IO_F16;
    const kvp_model m = ref::model(2, 8, 2, 32);
    uint64_t seed = 99 + uint64_t(GetParam()) * 1000;
    for (const char *spec : {"policy=full capacity=400 threads=3", "policy=h2o budget=64 recent=8 capacity=96 threads=2"})
        for (const char *pos : kPositions) run_twin(m, std::string(spec) + " positions=" + pos, dt, 24, ++seed);
}

INSTANTIATE_TEST_SUITE_P(IoDtypes, HalfTwin, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) { return i.param ? "bf16" : "f16"; });

// ---- bad input: status, message, unchanged cache ----

struct Bad : ::testing::Test {
    kvp_model m = ref::model(2, 4, 2, 16);
    ref::Cache c{m, "policy=h2o budget=32 recent=4 capacity=64"};
    uint32_t nq = 4 * 16, nkv = 2 * 16;
    std::vector<uint16_t> q, k, v, o;
    std::vector<uint8_t> before;
    void SetUp() override {
        q.assign(size_t(4) * nq, 0x3c00);  // 1.0 (f16)
        k.assign(size_t(4) * nkv, 0x3800);
        v.assign(size_t(4) * nkv, 0xb800);
        o.assign(q.size(), 0);
        for (uint32_t l = 0; l < 2; ++l)
            ASSERT_EQ(kvp_prefill_ex(c.c, l, 4, nullptr, KVP_IO_F16, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK)
                << kvp_last_error(c.c);
        before = state_of(c.c);
    }
    void expect_refused(kvp_status got, kvp_status want, const char *needle) {
        EXPECT_EQ(got, want);
        EXPECT_NE(strstr(kvp_last_error(c.c), needle), nullptr) << kvp_last_error(c.c);
        EXPECT_EQ(state_of(c.c), before);
    }
};

TEST_F(Bad, F16InfNaN) {
    q[5] = 0x7c00;  // +Inf
    expect_refused(kvp_decode_ex(c.c, 0, KVP_IO_F16, q.data(), k.data(), v.data(), o.data()), KVP_ERR_NONFINITE,
                   "q[5]=inf is NaN or Inf");
    q[5] = 0x3c00;
    k[7] = 0x7e01;  // NaN
    expect_refused(kvp_decode_ex(c.c, 1, KVP_IO_F16, q.data(), k.data(), v.data(), o.data()), KVP_ERR_NONFINITE,
                   "k[7]=");
    expect_refused(kvp_append_ex(c.c, 0, 2, nullptr, KVP_IO_F16, k.data(), v.data()), KVP_ERR_NONFINITE, "is NaN or Inf");
    k[7] = 0x3800;
    v[2 * nkv + 3] = 0xfc00;  // -Inf in token 2
    expect_refused(kvp_prefill_ex(c.c, 0, 3, nullptr, KVP_IO_F16, q.data(), k.data(), v.data(), o.data(), nullptr),
                   KVP_ERR_NONFINITE, "v[67]=");
    v[2 * nkv + 3] = 0x7bff;  // 65504, the largest f16: accepted
    EXPECT_EQ(kvp_prefill_ex(c.c, 0, 3, nullptr, KVP_IO_F16, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK)
        << kvp_last_error(c.c);
}

TEST_F(Bad, BF16NaNAndRange) {
    std::vector<uint16_t> bq(q.size(), 0x3f80), bk(k.size(), 0x3f00), bv(v.size(), 0xbf00);  // 1, 0.5, -0.5
    bk[9] = 0x7fc0;  // NaN
    expect_refused(kvp_decode_ex(c.c, 0, KVP_IO_BF16, bq.data(), bk.data(), bv.data(), o.data()), KVP_ERR_NONFINITE,
                   "k[9]=nan is NaN or Inf");
    bk[9] = 0x3f00;
    bq[1] = 0xff80;  // -Inf
    expect_refused(kvp_decode_ex(c.c, 0, KVP_IO_BF16, bq.data(), bk.data(), bv.data(), o.data()), KVP_ERR_NONFINITE,
                   "q[1]=-inf");
    bq[1] = 0x3f80;
    bv[4] = 0x5b80;  // 2^56: out of range
    expect_refused(kvp_append_ex(c.c, 1, 1, nullptr, KVP_IO_BF16, bk.data(), bv.data()), KVP_ERR_NONFINITE,
                   "is out of range");
    bv[4] = 0xdb7f;  // just below -2^56: accepted
    EXPECT_EQ(kvp_append_ex(c.c, 1, 1, nullptr, KVP_IO_BF16, bk.data(), bv.data()), KVP_OK) << kvp_last_error(c.c);
}

TEST_F(Bad, DtypeAndOverlap) {
    expect_refused(kvp_decode_ex(c.c, 0, kvp_io_dtype(3), q.data(), k.data(), v.data(), o.data()), KVP_ERR_ARG,
                   "not a kvp_io_dtype");
    expect_refused(kvp_append_ex(c.c, 0, 1, nullptr, kvp_io_dtype(-1), k.data(), v.data()), KVP_ERR_ARG, "kvp_io_dtype");
    expect_refused(kvp_prefill_ex(c.c, 0, 1, nullptr, kvp_io_dtype(7), q.data(), k.data(), v.data(), o.data(), nullptr),
                   KVP_ERR_ARG, "kvp_io_dtype");
    // out overlapping q by one half element (byte ranges of 2-byte elements)
    std::vector<uint16_t> buf(size_t(2) * nq + 1, 0x3c00);
    expect_refused(kvp_decode_ex(c.c, 0, KVP_IO_F16, buf.data(), k.data(), v.data(), buf.data() + nq - 1),
                   KVP_ERR_ARG, "overlaps");
    // right after q's nq halves: no overlap (it would overlap as floats)
    EXPECT_EQ(kvp_decode_ex(c.c, 0, KVP_IO_F16, buf.data(), k.data(), v.data(), buf.data() + nq), KVP_OK)
        << kvp_last_error(c.c);
    before = state_of(c.c);
    expect_refused(kvp_decode_ex(c.c, 0, KVP_IO_F16, nullptr, k.data(), v.data(), o.data()), KVP_ERR_ARG, "NULL");
}

// Formatted stores (kv_dtype != f32) widen a half chunk's V rows into its staging rows after
// its K rows: a chunk of more than half the largest layer capacity is refused, nothing changed.
TEST(Half, FormattedChunkLimit) {
    const kvp_model m = ref::model(1, 2, 1, 16);
    ref::Cache c(m, "policy=full capacity=64 kv_dtype=q8");
    std::vector<uint16_t> q(size_t(40) * 32, 0x3c00), k(size_t(40) * 16, 0x3800), v(k.size(), 0xb800), o(q.size());
    const std::vector<uint8_t> before = state_of(c.c);
    EXPECT_EQ(kvp_prefill_ex(c.c, 0, 33, nullptr, KVP_IO_F16, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(c.c), "half-precision chunk of 33 tokens exceeds 32"), nullptr) << kvp_last_error(c.c);
    EXPECT_EQ(kvp_append_ex(c.c, 0, 40, nullptr, KVP_IO_BF16, k.data(), v.data()), KVP_ERR_FULL);
    EXPECT_EQ(state_of(c.c), before);
    EXPECT_EQ(kvp_prefill_ex(c.c, 0, 32, nullptr, KVP_IO_F16, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK)
        << kvp_last_error(c.c);
    EXPECT_EQ(o[0], 0xb800);  // every value is -0.5
}

// KVP_IO_F32 through the _ex calls is the plain call.
TEST(Half, F32ExIsPlain) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    ref::Cache a(m, "policy=h2o budget=32 recent=4 capacity=64 kv_dtype=q8"), b(m, "policy=h2o budget=32 recent=4 capacity=64 kv_dtype=q8");
    ref::Inputs in(m, 50, 5, 2.0f);
    std::vector<float> oa(size_t(in.nq) * 50), ob(oa.size());
    for (uint32_t l = 0; l < 2; ++l) {
        ASSERT_EQ(kvp_prefill_ex(a.c, l, 40, nullptr, KVP_IO_F32, in.q.data(), in.k.data(), in.v.data(), oa.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(b.c, l, 40, nullptr, in.q.data(), in.k.data(), in.v.data(), ob.data(), nullptr), KVP_OK);
    }
    for (uint32_t t = 40; t < 50; ++t)
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_decode_ex(a.c, l, KVP_IO_F32, in.qt(t), in.kt(t), in.vt(t), oa.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(b.c, l, in.qt(t), in.kt(t), in.vt(t), ob.data()), KVP_OK);
            ASSERT_EQ(memcmp(oa.data(), ob.data(), in.nq * sizeof(float)), 0);
        }
    EXPECT_EQ(state_of(a.c), state_of(b.c));
}

}  // namespace
