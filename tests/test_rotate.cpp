// kv_rotate=hadamard (issue 23 item 3, docs/rotate.md): the Walsh-Hadamard kernels against
// their scalar reference and a double reference; attention with rotated storage against the
// double-precision reference and against kv_rotate=none (f32: the same attention within float
// rounding; every policy, realign, score=fixed, threads, drafts, state); q4 error with and
// without rotation on outlier-heavy keys and values; config validation.
#include <gtest/gtest.h>
#include <kvprune/kvprune.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/rotate_f32.h"
#include "reference.h"

namespace {

using kvp::kern::RotateF32;

std::vector<const RotateF32 *> variants() {
    std::vector<const RotateF32 *> v{kvp::kern::rotate_f32_scalar(), kvp::kern::rotate_f32_simde()};
    if (const RotateF32 *a = kvp::kern::rotate_f32_avx2()) v.push_back(a);
    return v;
}

// Double reference: block-diagonal Sylvester-Hadamard by the binary digits of hd, largest first,
// H_ij = (-1)^popcount(i & j) / sqrt(b) (a matrix product, not butterflies).
std::vector<double> hadamard_ref(const float *x, uint32_t hd) {
    std::vector<double> y(hd);
    uint32_t off = 0;
    for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
        if (!(hd & bit)) continue;
        for (uint32_t i = 0; i < bit; ++i) {
            double s = 0;
            for (uint32_t j = 0; j < bit; ++j) s += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * double(x[off + j]);
            y[off + i] = s / sqrt(double(bit));
        }
        off += bit;
    }
    return y;
}

// Every variant gives the scalar reference's bits, for widths below, at and above the vector
// width (8), odd widths and non-powers of two, with extremes near the input limit (2^56) and
// tiny values; the result is within (log2 b + 2) * 2^-24 * sum|x_block| / sqrt(b) of the double
// reference (each butterfly stage rounds once, relative to a partial sum bounded by sum|x|,
// and the scale once), and rotating twice gives the input back within twice that.
TEST(RotateKernels, VariantsEqualScalarAndDoubleReference) {
    const uint32_t widths[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 64, 80, 96, 100, 127, 128, 256};
    ref::Rng rng(7);
    for (uint32_t hd : widths) {
        const uint32_t rows = 3;
        const size_t ld = hd + 5;
        std::vector<float> x(rows * ld, -7.0f);
        for (uint32_t r = 0; r < rows; ++r)
            for (uint32_t j = 0; j < hd; ++j) {
                float v = rng.uniform(-1.0f, 1.0f);
                if (r == 1 && j % 5 == 0) v *= 0x1p55f;       // extremes below the input limit
                if (r == 2 && j % 3 == 0) v *= 0x1p-100f;     // tiny
                x[r * ld + j] = v;
            }
        std::vector<float> want = x;
        kvp::kern::rotate_f32_scalar()->hadamard(want.data(), rows, ld, hd);
        for (const RotateF32 *v : variants()) {
            std::vector<float> got = x;
            v->hadamard(got.data(), rows, ld, hd);
            ASSERT_EQ(memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << v->name << " hd " << hd;
        }
        for (uint32_t r = 0; r < rows; ++r) {
            const std::vector<double> y = hadamard_ref(&x[r * ld], hd);
            std::vector<float> back(want.begin() + r * ld, want.begin() + r * ld + hd);
            kvp::kern::rotate_f32_scalar()->hadamard(back.data(), 1, hd, hd);
            uint32_t off = 0;
            for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
                if (!(hd & bit)) continue;
                double sum = 0;
                for (uint32_t j = 0; j < bit; ++j) sum += fabs(double(x[r * ld + off + j]));
                const double bound = (log2(double(bit)) + 2) * 0x1p-24 * sum / sqrt(double(bit));
                for (uint32_t j = off; j < off + bit; ++j) {
                    ASSERT_LE(fabs(double(want[r * ld + j]) - y[j]), bound) << "hd " << hd << " j " << j;
                    ASSERT_LE(fabs(double(back[j]) - double(x[r * ld + j])), 2 * bound + 0x1p-149) << "hd " << hd;
                }
                off += bit;
            }
            for (uint32_t j = hd; j < ld; ++j) ASSERT_EQ(want[r * ld + j], -7.0f) << "wrote past the row";
        }
    }
}

// ---- attention with rotated storage ---------------------------------------------------------

struct Outs {
    std::vector<float> out;  // every output row of every call
    std::vector<std::vector<int32_t>> kept;
};

// Prefill P tokens, then decode the rest, one layer; kept positions of every KV head at the end.
Outs run(const kvp_model &m, const std::string &spec, const ref::Inputs &in, uint32_t P) {
    ref::Cache cache(m, spec);
    EXPECT_NE(cache.c, nullptr) << spec;
    Outs r;
    if (!cache.c) return r;
    r.out.assign(size_t(in.T) * in.nq, 0.0f);
    if (P) {
        EXPECT_EQ(kvp_prefill(cache.c, 0, P, nullptr, in.q.data(), in.k.data(), in.v.data(), r.out.data(), nullptr), KVP_OK) << spec;
    }
    for (uint32_t t = P; t < in.T; ++t)
        EXPECT_EQ(kvp_decode(cache.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], &r.out[t * in.nq]), KVP_OK)
            << spec << " t " << t;
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) r.kept.push_back(cache.positions(0, h));
    return r;
}

double max_diff(const std::vector<float> &a, const std::vector<float> &b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, fabs(double(a[i]) - double(b[i])));
    return d;
}

// f32 storage, policy=full: every output (prefill and decode) within 2e-5 of the double
// reference over the same inputs, for head dims that are a power of two and that are not
// (48 = 32 + 16, 96 = 64 + 32), neox and gptj; and within 2e-5 of kv_rotate=none.
TEST(RotateAttention, F32EqualsReferenceAndNoRotation) {
    for (uint32_t hd : {64u, 48u, 96u}) {
        for (kvp_rope_style rs : {KVP_ROPE_GPTJ, KVP_ROPE_NEOX}) {
            const kvp_model m = ref::model(1, 8, 2, hd, rs);
            const ref::Inputs in(m, 120, 11 + hd, 1.0f);
            const std::string base = "policy=full capacity=128 positions=original";
            const Outs a = run(m, base + " kv_rotate=hadamard", in, 40), b = run(m, base, in, 40);
            EXPECT_LE(max_diff(a.out, b.out), 2e-5) << "hd " << hd;
            std::vector<uint32_t> idx;
            std::vector<int64_t> kpos;
            std::vector<double> want;
            double worst = 0;
            for (uint32_t t = 0; t < in.T; ++t) {
                idx.push_back(t);
                kpos.push_back(t);
                ref::attend(m, &in.q[t * in.nq], t, in.k.data(), in.v.data(), idx, kpos, want);
                for (uint32_t i = 0; i < in.nq; ++i) worst = std::max(worst, fabs(double(a.out[t * in.nq + i]) - want[i]));
            }
            EXPECT_LE(worst, 2e-5) << "hd " << hd << " rope " << rs;
        }
    }
}

// Every token policy (and realign, where keys stay where they were rotated and queries move),
// f32: the same kept tokens as kv_rotate=none and outputs within 1e-4 (policy scores are
// attention weights, unchanged up to float rounding; the data has no near-ties at that scale).
// score=fixed scores come from int16 copies of the unrotated keys: kept tokens identical.
TEST(RotateAttention, EveryPolicyKeepsTheSameTokens) {
    const kvp_model m = ref::model(1, 8, 2, 64);
    const ref::Inputs in(m, 200, 5, 2.0f);
    const char *specs[] = {
        "policy=window window=48 positions=original capacity=224",
        "policy=window window=48 positions=realign capacity=224",
        "policy=streaming sinks=4 window=40 compress_every=8 positions=realign capacity=224",
        "policy=streaming sinks=4 window=40 compress_every=8 positions=original capacity=224",
        "policy=h2o budget=48 recent=8 capacity=224",
        "policy=h2o budget=48 recent=8 positions=realign capacity=224",
        "policy=h2o budget=48 recent=8 score=fixed capacity=224",
        "policy=snapkv budget=48 obs_window=8 pool_kernel=5",
        "policy=snapkv budget=48 obs_window=8 pool_kernel=5 score=fixed",
        "policy=pyramidkv budget=48 obs_window=8",
        "policy=lethe budget=48 capacity=224",
        "policy=simlayerkv sinks=4 window=40 nonlazy=h2o budget=64 capacity=224",
        "policy=full capacity=200 threads=2",
    };
    for (const char *spec : specs) {
        const Outs a = run(m, std::string(spec) + " kv_rotate=hadamard", in, 100), b = run(m, spec, in, 100);
        ASSERT_EQ(a.kept.size(), b.kept.size()) << spec;
        for (size_t h = 0; h < a.kept.size(); ++h) EXPECT_EQ(a.kept[h], b.kept[h]) << spec << " head " << h;
        EXPECT_LE(max_diff(a.out, b.out), 1e-4) << spec;
    }
}

// Bit-identical across thread counts with rotation (f32 and q4).
TEST(RotateAttention, ThreadCountsGiveTheSameBits) {
    const kvp_model m = ref::model(1, 8, 4, 64);
    const ref::Inputs in(m, 160, 9, 1.0f);
    for (const char *dt : {"f32", "q4"}) {
        const std::string s = std::string("policy=h2o budget=64 recent=8 capacity=160 kv_rotate=hadamard kv_dtype=") + dt;
        const Outs a = run(m, s + " threads=1", in, 90), b = run(m, s + " threads=3", in, 90);
        EXPECT_EQ(memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0) << dt;
        EXPECT_EQ(a.kept, b.kept) << dt;
    }
}

// ---- q4: what the rotation buys -------------------------------------------------------------
//
// Outlier-heavy data: every key row has one spike of +-24 in a random channel on top of
// uniform [-1, 1) channels, and every value row carries a channel of magnitude 16 (channel 5).
// Per-channel key grids see the spikes of the group's tokens in almost every channel, and
// per-token value grids see the outlier channel in every row: both make the grid step large for
// the ordinary elements. Rotated, a spike is 24/8 = 3 spread over all 64 channels and the
// value outlier 2 per channel. Mean |out - exact| over the decode (policy=full) must be lower
// with rotation, for q4 and q8; printed for the record.
double quant_error(const std::string &dtype, bool rotate, uint64_t seed) {
    const kvp_model m = ref::model(1, 8, 2, 64);
    ref::Inputs in(m, 256, seed, 1.0f);
    ref::Rng rng(seed * 31 + 1);
    for (uint32_t t = 0; t < in.T; ++t)
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            in.k[(size_t(t) * m.n_kv_heads + h) * 64 + (rng.next() % 64)] = (rng.next() & 1) ? 24.0f : -24.0f;
            in.v[(size_t(t) * m.n_kv_heads + h) * 64 + 5] = 16.0f + rng.uniform(-1.0f, 1.0f);
        }
    for (float &x : in.q) x *= 0.25f;  // logits of order 1 despite the spikes
    const Outs r = run(m, "policy=full capacity=256 kv_dtype=" + dtype + (rotate ? " kv_rotate=hadamard" : ""), in, 64);
    std::vector<uint32_t> idx;
    std::vector<int64_t> kpos;
    std::vector<double> want;
    double sum = 0;
    size_t n = 0;
    for (uint32_t t = 0; t < in.T; ++t) {
        idx.push_back(t);
        kpos.push_back(t);
        if (t < 64) continue;  // the decode steps
        ref::attend(m, &in.q[t * in.nq], t, in.k.data(), in.v.data(), idx, kpos, want);
        for (uint32_t i = 0; i < in.nq; ++i, ++n) sum += fabs(double(r.out[t * in.nq + i]) - want[i]);
    }
    return sum / double(n);
}

TEST(RotateQuant, OutlierHeavyErrorIsLowerWithRotation) {
    for (const char *dt : {"q4", "q8"}) {
        for (uint64_t seed : {1, 2}) {
            const double plain = quant_error(dt, false, seed), rot = quant_error(dt, true, seed);
            printf("[ error    ] %s seed %d: mean |out - exact| %.4g plain, %.4g rotated\n", dt, int(seed), plain, rot);
            EXPECT_LT(rot, plain) << dt;
        }
    }
}

// q4 with rotation stays within the q4 bound of tests/test_quant.cpp (0.08) on ordinary data,
// through the staged prefill path (V rows copied and rotated in scratch) and snapkv's prompt
// staging.
TEST(RotateQuant, PrefillAndStagingWithinQ4Bound) {
    const kvp_model m = ref::model(1, 8, 2, 64);
    const ref::Inputs in(m, 160, 3, 1.0f);
    for (const char *spec : {"policy=full capacity=160", "policy=h2o budget=120 recent=8"}) {
        const Outs r = run(m, std::string(spec) + " kv_dtype=q4 kv_rotate=hadamard", in, 100);
        const Outs f = run(m, spec, in, 100);
        EXPECT_LE(max_diff(r.out, f.out), 0.08) << spec;
    }
    const Outs s = run(m, "policy=snapkv budget=64 obs_window=8 kv_dtype=q4 kv_rotate=hadamard", in, 100);
    const Outs sf = run(m, "policy=snapkv budget=64 obs_window=8", in, 100);
    for (uint32_t t = 0; t < 100; ++t)  // prefill outputs attend over everything (selection comes after)
        for (uint32_t i = 0; i < in.nq; ++i) EXPECT_LE(fabs(s.out[t * in.nq + i] - sf.out[t * in.nq + i]), 0.08f);
}

// ---- state and drafts -----------------------------------------------------------------------

// A saved rotated cache continues with the same bits after load; a state saved with rotation
// does not load into a cache without it (KVP_ERR_CONFIG: the config words differ, kv_rotate is named).
TEST(RotateState, SaveLoadRoundTripsAndRefusesAnotherRotation) {
    const kvp_model m = ref::model(1, 8, 2, 64);
    const ref::Inputs in(m, 120, 4, 1.0f);
    for (const char *dt : {"f32", "q4"}) {
        const std::string spec = std::string("policy=h2o budget=64 recent=8 capacity=128 kv_dtype=") + dt;
        ref::Cache a(m, spec + " kv_rotate=hadamard"), b(m, spec + " kv_rotate=hadamard"), plain(m, spec);
        std::vector<float> out(in.nq), out2(in.nq);
        ASSERT_EQ(kvp_prefill(a.c, 0, 80, nullptr, in.q.data(), in.k.data(), in.v.data(), nullptr, nullptr), KVP_OK);
        std::vector<char> buf(kvp_state_size(a.c));
        size_t w = 0;
        ASSERT_EQ(kvp_state_save(a.c, buf.data(), buf.size(), &w), KVP_OK);
        ASSERT_EQ(kvp_state_load(b.c, buf.data(), w), KVP_OK);
        for (uint32_t t = 80; t < in.T; ++t) {
            ASSERT_EQ(kvp_decode(a.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], out.data()), KVP_OK);
            ASSERT_EQ(kvp_decode(b.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], out2.data()), KVP_OK);
            ASSERT_EQ(memcmp(out.data(), out2.data(), out.size() * sizeof(float)), 0) << dt << " t " << t;
        }
        EXPECT_EQ(kvp_state_load(plain.c, buf.data(), w), KVP_ERR_CONFIG) << dt;
        EXPECT_NE(std::string(kvp_last_error(plain.c)).find("kv_rotate"), std::string::npos) << kvp_last_error(plain.c);
    }
}

// Drafts: draft decode outputs and the committed cache equal kv_rotate=none's within float
// rounding (f32), and a rolled-back draft leaves the rotated cache as it was (the next decode
// gives the bits of a cache that never drafted).
TEST(RotateDraft, DraftCommitAndRollback) {
    const kvp_model m = ref::model(1, 8, 2, 64);
    const ref::Inputs in(m, 80, 6, 1.0f);
    const std::string spec = "policy=h2o budget=64 recent=8 max_draft=4";
    ref::Cache r(m, spec + " kv_rotate=hadamard"), p(m, spec), ctl(m, spec + " kv_rotate=hadamard");
    ASSERT_EQ(kvp_prefill(r.c, 0, 60, nullptr, in.q.data(), in.k.data(), in.v.data(), nullptr, nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(p.c, 0, 60, nullptr, in.q.data(), in.k.data(), in.v.data(), nullptr, nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(ctl.c, 0, 60, nullptr, in.q.data(), in.k.data(), in.v.data(), nullptr, nullptr), KVP_OK);
    std::vector<float> a(in.nq), b(in.nq), c(in.nq);
    // rollback: draft 3, accept 0
    ASSERT_EQ(kvp_draft_begin(r.c), KVP_OK);
    for (uint32_t t = 60; t < 63; ++t)
        ASSERT_EQ(kvp_decode(r.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], a.data()), KVP_OK);
    ASSERT_EQ(kvp_draft_commit(r.c, 0), KVP_OK);
    ASSERT_EQ(kvp_decode(r.c, 0, &in.q[60 * in.nq], &in.k[60 * in.nkv], &in.v[60 * in.nkv], a.data()), KVP_OK);
    ASSERT_EQ(kvp_decode(ctl.c, 0, &in.q[60 * in.nq], &in.k[60 * in.nkv], &in.v[60 * in.nkv], c.data()), KVP_OK);
    EXPECT_EQ(memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
    ASSERT_EQ(kvp_decode(p.c, 0, &in.q[60 * in.nq], &in.k[60 * in.nkv], &in.v[60 * in.nkv], b.data()), KVP_OK);
    // drafts, accept 2 of 3, then decode
    ASSERT_EQ(kvp_draft_begin(r.c), KVP_OK);
    ASSERT_EQ(kvp_draft_begin(p.c), KVP_OK);
    for (uint32_t t = 61; t < 64; ++t) {
        ASSERT_EQ(kvp_decode(r.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], a.data()), KVP_OK);
        ASSERT_EQ(kvp_decode(p.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], b.data()), KVP_OK);
        EXPECT_LE(max_diff(a, b), 2e-5) << "draft t " << t;
    }
    ASSERT_EQ(kvp_draft_commit(r.c, 2), KVP_OK);
    ASSERT_EQ(kvp_draft_commit(p.c, 2), KVP_OK);
    for (uint32_t t = 63; t < in.T; ++t) {
        ASSERT_EQ(kvp_decode(r.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], a.data()), KVP_OK);
        ASSERT_EQ(kvp_decode(p.c, 0, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], b.data()), KVP_OK);
        EXPECT_LE(max_diff(a, b), 2e-5) << "after commit t " << t;
    }
    EXPECT_EQ(r.positions(0, 0), p.positions(0, 0));
}

// ---- config ---------------------------------------------------------------------------------

TEST(RotateConfig, UnknownValueAndThinkAreRefused) {
    const kvp_model m = ref::model(2, 8, 2, 64);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(cfg.kv_rotate, uint32_t(KVP_ROTATE_NONE));
    char err[512] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, "kv_rotate=walsh", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("none|hadamard"), std::string::npos) << err;
    EXPECT_EQ(cfg.kv_rotate, uint32_t(KVP_ROTATE_NONE)) << "a failed apply changed the config";
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=think kv_rotate=hadamard", err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_NE(std::string(err).find("policy=think"), std::string::npos) << err;
    EXPECT_EQ(cfg.policy, KVP_POLICY_FULL) << "a failed apply changed the config";
    cfg.policy = KVP_POLICY_THINK;
    cfg.kv_rotate = KVP_ROTATE_HADAMARD;
    EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG);
    EXPECT_EQ(kvp_arena_size(&cfg), 0u);
    cfg.kv_rotate = 2;  // out of the enum
    cfg.policy = KVP_POLICY_FULL;
    EXPECT_NE(kvp_config_check(&cfg, err, sizeof err), KVP_OK);
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    for (const char *ok : {"kv_rotate=hadamard", "kv_rotate=hadamard kv_dtype=q4 policy=snapkv score=fixed",
                           "kv_rotate=hadamard kv_dtype=f16 policy=streaming positions=realign", "kv_rotate=none policy=think"}) {
        kvp_config c2;
        ASSERT_EQ(kvp_config_default(&c2, &m), KVP_OK);
        EXPECT_EQ(kvp_config_apply(&c2, ok, err, sizeof err), KVP_OK) << ok << ": " << err;
    }
    // the arena of kv_rotate=none is unchanged by the key's existence; f32 rotation needs no more
    kvp_config a, b;
    ASSERT_EQ(kvp_config_default(&a, &m), KVP_OK);
    ASSERT_EQ(kvp_config_default(&b, &m), KVP_OK);
    ASSERT_EQ(kvp_config_apply(&b, "kv_rotate=hadamard", err, sizeof err), KVP_OK);
    EXPECT_EQ(kvp_arena_size(&a), kvp_arena_size(&b));
}

}  // namespace
