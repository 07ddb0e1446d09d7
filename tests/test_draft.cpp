// Speculative decoding (issue 21): kvp_draft_begin / kvp_draft_commit against a twin cache that
// prefills exactly the accepted tokens. For every policy x kv_dtype x positions mode (and
// score=fixed): random draft lengths and accept counts, drafted by one prefill per layer or by
// decodes token by token, mixed with ordinary decodes on both caches. After every commit the
// kept positions of every layer/head, the stats and the layer stats equal the twin's; every
// ordinary decode's output bits equal the twin's. Bad-order calls: status, message, unchanged.
// KVP_DRAFT_STEPS=<n> (environment) lengthens the random runs (bench/draft_long.sh).
#include <gtest/gtest.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cache.h"
#include "reference.h"

namespace {

const char *const kSpecs[] = {
    "policy=full capacity=400",
    "policy=window window=60 capacity=70",
    "policy=streaming sinks=4 window=48 compress_every=8 capacity=70",
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
    // sliding-window layers (sliding.h): layer 0 local, layer 1 the policy's; every layer local
    "policy=h2o budget=64 recent=8 capacity=96 sliding_window=12 sliding_pattern=2",
    "policy=full capacity=400 sliding_window=9",
};
const char *const kDtypes[] = {"f32", "f16", "q8", "q4"};
const char *const kPositions[] = {"original", "realign"};

constexpr uint32_t kMaxDraft = 6;

uint32_t steps_from_env(uint32_t dflt) {
    const char *e = getenv("KVP_DRAFT_STEPS");
    return e ? uint32_t(strtoul(e, nullptr, 10)) : dflt;
}

struct Twin {
    kvp_model m;
    ref::Cache a, b;  // a drafts, b prefills the accepted tokens
    uint32_t nq, nkv;
    Twin(const kvp_model &mm, const std::string &spec) : m(mm), a(mm, spec), b(mm, spec) {
        nq = m.n_q_heads * m.head_dim;
        nkv = m.n_kv_heads * m.head_dim;
    }
};

// The kept tokens' slot scores and rotation positions in logical order (internals: what later
// evictions and attention read), and the layer state a policy keeps.
std::vector<uint32_t> internal_state(const kvp_cache *c, uint32_t l, uint32_t h) {
    std::vector<uint32_t> out;
    const kvp::HeadStore &hs = kvp::head_of(c, l, h);
    const kvp::BlockPool &pool = c->pools[h];
    kvp::store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t) {
        for (uint32_t i = 0; i < n; ++i) {
            uint32_t bits;
            memcpy(&bits, &pool.score[slot + i], sizeof bits);
            out.push_back(bits);
            out.push_back(uint32_t(pool.rot[slot + i]));
        }
    });
    out.push_back(uint32_t(hs.shift));
    const kvp::LayerState &ls = c->layers[l];
    for (uint64_t w : ls.pstate) out.push_back(uint32_t(w)), out.push_back(uint32_t(w >> 32));
    out.push_back(uint32_t(ls.next_pos));
    out.push_back(uint32_t(ls.observe_decode));
    return out;
}

void expect_same_state(const Twin &t, const std::string &where) {
    for (uint32_t l = 0; l < t.m.n_layers; ++l) {
        for (uint32_t h = 0; h < t.m.n_kv_heads; ++h)
            ASSERT_EQ(internal_state(t.a.c, l, h), internal_state(t.b.c, l, h)) << where << " layer " << l << " head " << h;
        for (uint32_t h = 0; h < t.m.n_kv_heads; ++h)
            ASSERT_EQ(t.a.positions(l, h), t.b.positions(l, h)) << where << " layer " << l << " head " << h;
        kvp_layer_stats sa, sb;
        memset(&sa, 0, sizeof sa);
        memset(&sb, 0, sizeof sb);
        sa.struct_size = sb.struct_size = sizeof sa;
        ASSERT_EQ(kvp_get_layer_stats(t.a.c, l, &sa), KVP_OK);
        ASSERT_EQ(kvp_get_layer_stats(t.b.c, l, &sb), KVP_OK);
        ASSERT_EQ(memcmp(&sa, &sb, sizeof sa), 0) << where << " layer stats " << l;
    }
    kvp_stats sa, sb;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    sa.struct_size = sb.struct_size = sizeof sa;
    ASSERT_EQ(kvp_get_stats(t.a.c, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(t.b.c, &sb), KVP_OK);
    ASSERT_EQ(memcmp(&sa, &sb, sizeof sa), 0) << where << " stats";
}

struct RunResult {
    uint32_t commits = 0, accepted = 0, decodes = 0;
    uint64_t evicted = 0;
    uint32_t refused = 0;
    double max_verify_diff = 0;  // |draft output - twin prefill output| of the accepted tokens
    uint32_t verify_exact = 0, verify_total = 0;
};

// P prompt tokens on both, then `steps` steps: a draft of 1..kMaxDraft tokens (by prefill or by
// decodes), `accepted` random, commit / twin prefill; one step in four an ordinary decode on both.
void run_twin(const kvp_model &m, const std::string &spec, uint32_t P, uint32_t steps, uint64_t seed, RunResult &r) {
    Twin t(m, spec + " max_draft=" + std::to_string(kMaxDraft));
    if (!t.a.c || !t.b.c) {
        ADD_FAILURE() << "cannot create " << spec;
        return;
    }
    ref::Rng g(seed);
    const uint32_t L = m.n_layers;
    std::vector<float> q(size_t(P > kMaxDraft ? P : kMaxDraft) * t.nq), k(size_t(P > kMaxDraft ? P : kMaxDraft) * t.nkv),
        v(k.size()), oa(q.size()), ob(q.size());
    auto fill = [&](uint32_t n) {
        for (size_t i = 0; i < size_t(n) * t.nq; ++i) q[i] = g.uniform(-2, 2);
        for (size_t i = 0; i < size_t(n) * t.nkv; ++i) k[i] = g.uniform(-2, 2);
        for (size_t i = 0; i < size_t(n) * t.nkv; ++i) v[i] = g.uniform(-1, 1);
    };
    kvp_selection sel;
    int32_t idx[512];
    sel.struct_size = sizeof sel;
    sel.capacity = 512;
    sel.indices = idx;
    fill(P);
    for (uint32_t l = 0; l < L; ++l) {
        EXPECT_EQ(kvp_prefill(t.a.c, l, P, nullptr, q.data(), k.data(), v.data(), oa.data(), &sel), KVP_OK) << kvp_last_error(t.a.c);
        EXPECT_EQ(kvp_prefill(t.b.c, l, P, nullptr, q.data(), k.data(), v.data(), ob.data(), &sel), KVP_OK);
    }
    expect_same_state(t, spec + " after the prompt");
    for (uint32_t s = 0; s < steps; ++s) {
        const std::string where = spec + " step " + std::to_string(s);
        if (g.next() % 4 == 0) {  // an ordinary decode on both: the outputs must be the same bits
            fill(1);
            for (uint32_t l = 0; l < L; ++l) {
                const kvp_status sa = kvp_decode(t.a.c, l, q.data(), k.data(), v.data(), oa.data());
                const kvp_status sb = kvp_decode(t.b.c, l, q.data(), k.data(), v.data(), ob.data());
                ASSERT_EQ(sa, sb) << where;
                if (sa != KVP_OK) return;  // full (policy=full at capacity): both stop here
                ASSERT_EQ(memcmp(oa.data(), ob.data(), t.nq * sizeof(float)), 0) << where << " decode layer " << l;
            }
            ++r.decodes;
            continue;
        }
        const uint32_t n = 1 + uint32_t(g.next() % kMaxDraft), acc = uint32_t(g.next() % (n + 1));
        const bool by_decode = g.next() % 2 == 0;
        fill(n);
        ASSERT_EQ(kvp_draft_begin(t.a.c), KVP_OK) << kvp_last_error(t.a.c);
        std::vector<float> verify(size_t(n) * t.nq * L);
        bool refused = false;
        if (by_decode) {
            for (uint32_t i = 0; i < n && !refused; ++i)
                for (uint32_t l = 0; l < L && !refused; ++l) {
                    const kvp_status st = kvp_decode(t.a.c, l, &q[size_t(i) * t.nq], &k[size_t(i) * t.nkv],
                                                     &v[size_t(i) * t.nkv], &verify[(size_t(l) * n + i) * t.nq]);
                    if (st == KVP_ERR_FULL) refused = true;
                    else ASSERT_EQ(st, KVP_OK) << where << ": " << kvp_last_error(t.a.c);
                }
        } else {
            for (uint32_t l = 0; l < L && !refused; ++l) {
                const kvp_status st =
                    kvp_prefill(t.a.c, l, n, nullptr, q.data(), k.data(), v.data(), &verify[size_t(l) * n * t.nq], nullptr);
                if (st == KVP_ERR_FULL) refused = true;
                else ASSERT_EQ(st, KVP_OK) << where << ": " << kvp_last_error(t.a.c);
            }
        }
        if (refused) {  // a layer cannot take the draft as one prefill (near capacity): drop it all
            ASSERT_EQ(kvp_draft_commit(t.a.c, 0), KVP_OK);
            expect_same_state(t, where + " refused draft");
            ++r.refused;
            continue;
        }
        expect_same_state(t, where + " during the draft");  // nothing kept changed
        ASSERT_EQ(kvp_draft_commit(t.a.c, acc), KVP_OK) << where << ": " << kvp_last_error(t.a.c);
        for (uint32_t l = 0; l < L && acc; ++l) {
            ASSERT_EQ(kvp_prefill(t.b.c, l, acc, nullptr, q.data(), k.data(), v.data(), ob.data(), nullptr), KVP_OK)
                << where << ": " << kvp_last_error(t.b.c);
            for (size_t i = 0; i < size_t(acc) * t.nq; ++i) {
                const float x = verify[size_t(l) * n * t.nq + i], y = ob[i];
                const double d = std::fabs(double(x) - double(y));
                if (d > r.max_verify_diff) r.max_verify_diff = d;
                r.verify_exact += x == y;
                ++r.verify_total;
            }
        }
        expect_same_state(t, where + " after commit " + std::to_string(acc) + "/" + std::to_string(n));
        if (::testing::Test::HasFatalFailure()) return;
        ++r.commits;
        r.accepted += acc;
    }
    kvp_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    kvp_get_stats(t.b.c, &st);
    r.evicted = st.tokens_evicted;
}

TEST(Draft, TwinEveryPolicyDtypePositions) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    const uint32_t steps = steps_from_env(60);
    uint64_t seed = 1;
    for (const char *spec : kSpecs) {
        for (const char *dt : kDtypes) {
            for (const char *pm : kPositions) {
                const std::string s = std::string(spec) + " quant_group=16 kv_dtype=" + dt + " positions=" + pm;
                RunResult r;
                run_twin(m, s, 40, steps, seed++, r);
                if (HasFatalFailure()) return;
                // the verification outputs are attention over the same keys: within float rounding
                // of the twin's prefill (decode-drafted tokens sum in another order)
                EXPECT_LT(r.max_verify_diff, 1e-4) << s;
                EXPECT_GT(r.commits, 0u) << s;
                printf("%-150s refused %4u commits %5u accepted %6u decodes %5u evicted %7llu verify exact %u/%u max diff %.2g\n",
                       s.c_str(), r.refused, r.commits, r.accepted, r.decodes, (unsigned long long)r.evicted, r.verify_exact,
                       r.verify_total, r.max_verify_diff);
            }
        }
    }
}

TEST(Draft, TwinFixedScoringAndThreads) {
    const kvp_model m = ref::model(3, 8, 2, 32);
    const uint32_t steps = steps_from_env(80);
    ref::ForceParallel force(true);
    uint64_t seed = 100;
    for (const char *spec : {"policy=h2o budget=64 recent=8 capacity=96", "policy=snapkv budget=48 obs_window=8 capacity=80 prefill_stage=64",
                             "policy=lethe capacity=120 evict_threshold=40 sparse_ratio=3 obs_window=8"}) {
        for (const char *extra : {" score=fixed", " score=fixed threads=3", " threads=2", " score=fixed positions=realign"}) {
            const std::string s = std::string(spec) + extra;
            RunResult r;
            run_twin(m, s, 50, steps, seed++, r);
            if (HasFatalFailure()) return;
            EXPECT_GT(r.commits, 0u) << s;
        }
    }
}

// The verification pass attends exactly: outputs of a draft prefill equal the twin's prefill
// outputs bit for bit when the draft is one prefill per layer (same tiles, same key blocks).
TEST(Draft, VerificationOutputsMatchPrefillBits) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    for (const char *spec : {"policy=full capacity=300", "policy=h2o budget=64 recent=8 capacity=96 positions=realign",
                             "policy=streaming sinks=4 window=48 compress_every=8"}) {
        Twin t(m, std::string(spec) + " max_draft=8");
        ASSERT_TRUE(t.a.c && t.b.c);
        ref::Inputs in(m, 60, 7, 1.0f);
        std::vector<float> oa(size_t(52) * t.nq), ob(oa.size());
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_prefill(t.a.c, l, 52, nullptr, in.qt(0), in.kt(0), in.vt(0), oa.data(), nullptr), KVP_OK);
            ASSERT_EQ(kvp_prefill(t.b.c, l, 52, nullptr, in.qt(0), in.kt(0), in.vt(0), ob.data(), nullptr), KVP_OK);
        }
        ASSERT_EQ(kvp_draft_begin(t.a.c), KVP_OK);
        for (uint32_t l = 0; l < 2; ++l) {
            ASSERT_EQ(kvp_prefill(t.a.c, l, 8, nullptr, in.qt(52), in.kt(52), in.vt(52), oa.data(), nullptr), KVP_OK);
            ASSERT_EQ(kvp_prefill(t.b.c, l, 8, nullptr, in.qt(52), in.kt(52), in.vt(52), ob.data(), nullptr), KVP_OK);
            EXPECT_EQ(memcmp(oa.data(), ob.data(), size_t(8) * t.nq * sizeof(float)), 0) << spec << " layer " << l;
        }
        ASSERT_EQ(kvp_draft_commit(t.a.c, 8), KVP_OK);
        expect_same_state(t, spec);
    }
}

// Explicit positions (with gaps) continue after the layer's drafts; commit keeps them.
TEST(Draft, ExplicitPositions) {
    const kvp_model m = ref::model(1, 2, 1, 16);
    Twin t(m, "policy=full capacity=64 max_draft=4");
    ref::Inputs in(m, 10, 3, 1.0f);
    std::vector<float> o(size_t(4) * t.nq);
    const int32_t p0[3] = {0, 5, 9};
    ASSERT_EQ(kvp_prefill(t.a.c, 0, 3, p0, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_prefill(t.b.c, 0, 3, p0, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_draft_begin(t.a.c), KVP_OK);
    const int32_t p1[2] = {12, 20};
    ASSERT_EQ(kvp_prefill(t.a.c, 0, 2, p1, in.qt(3), in.kt(3), in.vt(3), o.data(), nullptr), KVP_OK);
    const int32_t bad[1] = {20};  // not after the draft's last position
    EXPECT_EQ(kvp_prefill(t.a.c, 0, 1, bad, in.qt(5), in.kt(5), in.vt(5), o.data(), nullptr), KVP_ERR_ARG);
    ASSERT_EQ(kvp_decode(t.a.c, 0, in.qt(5), in.kt(5), in.vt(5), o.data()), KVP_OK);  // position 21
    ASSERT_EQ(kvp_draft_commit(t.a.c, 3), KVP_OK);
    const int32_t p2[3] = {12, 20, 21};
    ASSERT_EQ(kvp_prefill(t.b.c, 0, 3, p2, in.qt(3), in.kt(3), in.vt(3), o.data(), nullptr), KVP_OK);
    expect_same_state(t, "explicit positions");
    EXPECT_EQ(t.a.positions(0, 0), (std::vector<int32_t>{0, 5, 9, 12, 20, 21}));
}

// Bad order and bad sizes: a status, a message naming the problem, nothing changed.
TEST(Draft, BadCallsLeaveTheCacheUnchanged) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    Twin t(m, "policy=h2o budget=32 recent=4 capacity=48 max_draft=3");
    ref::Inputs in(m, 40, 5, 1.0f);
    std::vector<float> o(size_t(40) * t.nq);
    for (uint32_t l = 0; l < 2; ++l) {
        ASSERT_EQ(kvp_prefill(t.a.c, l, 20, nullptr, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK);
        ASSERT_EQ(kvp_prefill(t.b.c, l, 20, nullptr, in.qt(0), in.kt(0), in.vt(0), o.data(), nullptr), KVP_OK);
    }
    auto has = [](const char *msg, const char *what) { return strstr(msg, what) != nullptr; };
    // commit without begin
    EXPECT_EQ(kvp_draft_commit(t.a.c, 0), KVP_ERR_STATE);
    EXPECT_TRUE(has(kvp_last_error(t.a.c), "no draft is open")) << kvp_last_error(t.a.c);
    expect_same_state(t, "commit without begin");
    ASSERT_EQ(kvp_draft_begin(t.a.c), KVP_OK);
    // begin twice
    EXPECT_EQ(kvp_draft_begin(t.a.c), KVP_ERR_STATE);
    EXPECT_TRUE(has(kvp_last_error(t.a.c), "already open")) << kvp_last_error(t.a.c);
    // too many drafted: 2 + 2 > max_draft=3 in layer 0
    ASSERT_EQ(kvp_prefill(t.a.c, 0, 2, nullptr, in.qt(20), in.kt(20), in.vt(20), o.data(), nullptr), KVP_OK);
    EXPECT_EQ(kvp_prefill(t.a.c, 0, 2, nullptr, in.qt(22), in.kt(22), in.vt(22), o.data(), nullptr), KVP_ERR_FULL);
    EXPECT_TRUE(has(kvp_last_error(t.a.c), "max_draft=3")) << kvp_last_error(t.a.c);
    EXPECT_EQ(kvp_decode(t.a.c, 1, in.qt(20), in.kt(20), in.vt(20), o.data()), KVP_OK);
    // a draft prefill without q; kvp_append while drafting
    EXPECT_EQ(kvp_prefill(t.a.c, 1, 1, nullptr, nullptr, in.kt(21), in.vt(21), nullptr, nullptr), KVP_ERR_ARG);
    EXPECT_TRUE(has(kvp_last_error(t.a.c), "needs q")) << kvp_last_error(t.a.c);
    EXPECT_EQ(kvp_append(t.a.c, 1, 1, nullptr, in.kt(21), in.vt(21)), KVP_ERR_STATE);
    EXPECT_TRUE(has(kvp_last_error(t.a.c), "kvp_append")) << kvp_last_error(t.a.c);
    // accepted above what was drafted (layer 1 holds 1)
    EXPECT_EQ(kvp_draft_commit(t.a.c, 2), KVP_ERR_ARG);
    EXPECT_TRUE(has(kvp_last_error(t.a.c), "layer 1")) << kvp_last_error(t.a.c);
    expect_same_state(t, "refused calls during the draft");
    // the draft is still open and still whole: commit 1 = the twin's prefill of token 20
    ASSERT_EQ(kvp_draft_commit(t.a.c, 1), KVP_OK);
    for (uint32_t l = 0; l < 2; ++l)
        ASSERT_EQ(kvp_prefill(t.b.c, l, 1, nullptr, in.qt(20), in.kt(20), in.vt(20), o.data(), nullptr), KVP_OK);
    expect_same_state(t, "after the refused calls");
    EXPECT_EQ(kvp_draft_commit(t.a.c, 0), KVP_ERR_STATE);  // closed
    // NULL and dead handles
    EXPECT_EQ(kvp_draft_begin(nullptr), KVP_ERR_ARG);
    EXPECT_EQ(kvp_draft_commit(nullptr, 0), KVP_ERR_ARG);
    // max_draft=0
    ref::Cache none(m, "policy=h2o budget=32 recent=4 capacity=48");
    EXPECT_EQ(kvp_draft_begin(none.c), KVP_ERR_CONFIG);
    EXPECT_TRUE(has(kvp_last_error(none.c), "max_draft")) << kvp_last_error(none.c);
    // reset closes a draft
    ASSERT_EQ(kvp_draft_begin(t.a.c), KVP_OK);
    ASSERT_EQ(kvp_reset(t.a.c), KVP_OK);
    EXPECT_EQ(kvp_draft_commit(t.a.c, 0), KVP_ERR_STATE);
    EXPECT_EQ(kvp_draft_begin(t.a.c), KVP_OK);
}

// max_draft=0 leaves the arena as it was; max_draft > 0 adds the draft region only.
TEST(Draft, ArenaCost) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256];
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=h2o budget=64 recent=8 capacity=96", err, sizeof err), KVP_OK) << err;
    const size_t base = kvp_arena_size(&cfg);
    ASSERT_EQ(kvp_config_apply(&cfg, "max_draft=8", err, sizeof err), KVP_OK) << err;
    const size_t with = kvp_arena_size(&cfg);
    EXPECT_GT(with, base);
    EXPECT_EQ(kvp_config_apply(&cfg, "max_draft=4097", err, sizeof err), KVP_ERR_CONFIG);
}


// ---- issue 28 item 3: drafts at the default capacity ----

// Every policy at its default capacity (x f32/q8 x max_draft 1, 3, 4): past the capacity by
// decodes, then drafts of 1..max_draft tokens (begin, a verification prefill on every layer,
// commit a prefix), mixed with decodes, for many steps: every call KVP_OK. Before issue 28 a full
// window (capacity window+1) took 1 more token: a 2-token draft was KVP_ERR_FULL.
const char *const kDefaultCapSpecs[] = {
    "policy=full",
    "policy=window window=48",
    "policy=streaming sinks=4 window=40",
    "policy=streaming sinks=4 window=40 compress_every=8 slack=10 max_drop=3",
    "policy=h2o budget=48 recent=8",
    "policy=snapkv budget=48 obs_window=8",
    "policy=pyramidkv budget=48 obs_window=8",
    "policy=lethe budget=40 obs_window=8",
    "policy=lethe budget=40 obs_window=8 evict_threshold=200",  // L_evict above the capacity: the hard cap acts
    "policy=simlayerkv nonlazy=h2o budget=48 recent=8 sinks=4 window=24 lazy_last=8 lazy_threshold=0.2",
    "policy=simlayerkv nonlazy=h2o budget=48 recent=8 sinks=4 lazy_force=1",  // window follows the capacity
    "policy=simlayerkv nonlazy=snapkv budget=48 obs_window=8 sinks=4 window=24 lazy_force=2",
    "policy=simlayerkv sinks=4 window=24 lazy_force=1",  // nonlazy=full: never evicts (layer 1)
    "policy=asl budget=48 obs_window=8 asl_min_layer=1",
    "policy=think token_policy=h2o budget=48 recent=8",
    "policy=think token_policy=window window=48",
    "policy=think token_policy=streaming sinks=4 window=40 compress_every=4",
};

void drafts_at_capacity(const kvp_model &m, const std::string &spec, uint32_t D, uint64_t seed) {
    ref::Cache c(m, spec + " max_draft=" + std::to_string(D));
    ASSERT_TRUE(c.c) << spec;
    const uint32_t L = m.n_layers, nq = m.n_q_heads * m.head_dim, nkv = m.n_kv_heads * m.head_dim;
    ref::Rng g(seed);
    std::vector<float> q(size_t(16) * nq), k(size_t(16) * nkv), v(k.size()), o(q.size());
    const uint32_t P = std::min(16u, kvp_layer_capacity(c.c, 0) / 2);  // a prompt (lethe capacity=5: 2 tokens)
    auto fill = [&](uint32_t n) {
        for (size_t i = 0; i < size_t(n) * nq; ++i) q[i] = g.uniform(-2, 2);
        for (size_t i = 0; i < size_t(n) * nkv; ++i) k[i] = g.uniform(-2, 2);
        for (size_t i = 0; i < size_t(n) * nkv; ++i) v[i] = g.uniform(-1, 1);
    };
    fill(P);
    for (uint32_t l = 0; l < L; ++l)
        ASSERT_EQ(kvp_prefill(c.c, l, P, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK)
            << spec << ": " << kvp_last_error(c.c);
    uint32_t cap = 0;
    for (uint32_t l = 0; l < L; ++l) cap = std::max(cap, kvp_layer_capacity(c.c, l));
    const bool full = kvp_layer_capacity(c.c, 0) >= 2048;  // policy=full (also simlayerkv over full): never evicts
    const uint32_t decodes = full ? 60 : cap + 20;  // past the capacity (full: well within)
    for (uint32_t t = 0; t < decodes; ++t) {
        fill(1);
        for (uint32_t l = 0; l < L; ++l)
            ASSERT_EQ(kvp_decode(c.c, l, q.data(), k.data(), v.data(), o.data()), KVP_OK)
                << spec << " decode " << t << ": " << kvp_last_error(c.c);
    }
    for (uint32_t s = 0; s < 3 * D + 40; ++s) {
        const std::string where = spec + " max_draft=" + std::to_string(D) + " step " + std::to_string(s);
        const uint32_t n = 1 + s % D, acc = uint32_t(g.next() % (n + 1));
        fill(n);
        ASSERT_EQ(kvp_draft_begin(c.c), KVP_OK) << where << ": " << kvp_last_error(c.c);
        for (uint32_t l = 0; l < L; ++l)
            ASSERT_EQ(kvp_prefill(c.c, l, n, nullptr, q.data(), k.data(), v.data(), o.data(), nullptr), KVP_OK)
                << where << " verify " << n << " tokens, layer " << l << ": " << kvp_last_error(c.c);
        ASSERT_EQ(kvp_draft_commit(c.c, acc), KVP_OK) << where << ": " << kvp_last_error(c.c);
        if (s % 3 == 0) {  // a draft drafted by decodes, token by token
            fill(n);
            ASSERT_EQ(kvp_draft_begin(c.c), KVP_OK) << where;
            for (uint32_t i = 0; i < n; ++i)
                for (uint32_t l = 0; l < L; ++l)
                    ASSERT_EQ(kvp_decode(c.c, l, &q[size_t(i) * nq], &k[size_t(i) * nkv], &v[size_t(i) * nkv], o.data()), KVP_OK)
                        << where << " draft decode " << i << " layer " << l << ": " << kvp_last_error(c.c);
            ASSERT_EQ(kvp_draft_commit(c.c, n), KVP_OK) << where << ": " << kvp_last_error(c.c);
        }
        if (s % 4 == 1) {
            fill(1);
            for (uint32_t l = 0; l < L; ++l)
                ASSERT_EQ(kvp_decode(c.c, l, q.data(), k.data(), v.data(), o.data()), KVP_OK) << where << ": " << kvp_last_error(c.c);
        }
    }
}

TEST(DraftCapacity, EveryPolicyDraftsAtItsDefaultCapacity) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    uint64_t seed = 1;
    for (const char *spec : kDefaultCapSpecs)
        for (const char *dt : {"f32", "q8"})
            for (uint32_t D : {1u, 3u, 4u}) {
                drafts_at_capacity(m, std::string(spec) + " quant_group=16 kv_dtype=" + dt, D, seed++);
                if (HasFatalFailure()) return;
            }
}

// The default capacity includes the draft room (max_draft - 1 slots where the store takes the
// draft), and max_draft 0 or 1 leaves every capacity and arena size as it was.
TEST(DraftCapacity, DefaultCapacityIncludesTheRoom) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    struct Row {
        const char *spec;
        uint32_t cap0, room;  // capacity with max_draft=0; slots added per draft token beyond the first
    };
    const Row rows[] = {{"policy=window window=48", 49, 1},
                        {"policy=streaming sinks=4 window=40 compress_every=8", 52, 1},
                        {"policy=h2o budget=48", 49, 1},
                        {"policy=lethe budget=40", 80, 1},
                        {"policy=simlayerkv nonlazy=h2o budget=48 sinks=4 window=24", 49, 1},
                        {"policy=think token_policy=h2o budget=48", 49, 1},
                        {"policy=snapkv budget=48", 96, 0},  // budget + max_new (default: budget)
                        {"policy=pyramidkv budget=48 obs_window=8", 0, 0},
                        {"policy=asl budget=48", 49, 0},
                        {"policy=full", 2048, 0}};
    for (const Row &r : rows) {
        kvp_config cfg;
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        char err[512] = "";
        ASSERT_EQ(kvp_config_apply(&cfg, r.spec, err, sizeof err), KVP_OK) << r.spec << ": " << err;
        const size_t bytes0 = kvp_arena_size(&cfg);
        std::vector<uint32_t> caps0;
        {
            ref::Cache c(m, r.spec);
            for (uint32_t l = 0; l < m.n_layers; ++l) caps0.push_back(kvp_layer_capacity(c.c, l));
        }
        if (r.cap0) {
            EXPECT_EQ(caps0[0], r.cap0) << r.spec;
        }
        for (uint32_t D : {1u, 4u}) {
            const std::string s = std::string(r.spec) + " max_draft=" + std::to_string(D);
            ref::Cache c(m, s);
            for (uint32_t l = 0; l < m.n_layers; ++l)
                EXPECT_EQ(kvp_layer_capacity(c.c, l), caps0[l] + r.room * (D - 1)) << s << " layer " << l;
        }
        ASSERT_EQ(kvp_config_apply(&cfg, "max_draft=0", err, sizeof err), KVP_OK) << err;
        EXPECT_EQ(kvp_arena_size(&cfg), bytes0) << r.spec;
    }
}

// A capacity given too small for the drafts is refused at create (kvp_config_apply,
// kvp_config_check, kvp_arena_size, kvp_create), naming capacity and max_draft and the capacity
// that would do; that capacity works.
TEST(DraftCapacity, ExplicitCapacityTooSmallIsRefusedAtCreate) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    struct Row {
        const char *spec;
        uint32_t need;  // the least capacity for max_draft=4
    };
    const Row rows[] = {{"policy=window window=48 capacity=49", 52},
                        {"policy=streaming sinks=4 window=40 compress_every=8 capacity=52", 55},
                        {"policy=h2o budget=48 capacity=50", 52},
                        {"policy=lethe budget=40 capacity=4", 5},
                        {"policy=simlayerkv nonlazy=h2o budget=40 sinks=4 window=24 capacity=42", 44},
                        {"policy=think token_policy=h2o budget=48 capacity=49", 52}};
    for (const Row &r : rows) {
        kvp_config cfg;
        ASSERT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
        char err[512] = "";
        const kvp_config dflt = cfg;
        EXPECT_EQ(kvp_config_apply(&cfg, (std::string(r.spec) + " max_draft=4").c_str(), err, sizeof err), KVP_ERR_CONFIG)
            << r.spec;
        const std::string e = err;
        EXPECT_NE(e.find("capacity="), std::string::npos) << e;
        EXPECT_NE(e.find("max_draft=4"), std::string::npos) << e;
        EXPECT_NE(e.find("capacity >= " + std::to_string(r.need)), std::string::npos) << r.spec << ": " << e;
        EXPECT_EQ(memcmp(&cfg, &dflt, sizeof cfg), 0);  // all-or-nothing
        // the same config set field by field: refused by the check, the arena size and create
        ASSERT_EQ(kvp_config_apply(&cfg, r.spec, err, sizeof err), KVP_OK) << r.spec << ": " << err;
        cfg.max_draft = 4;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG) << r.spec;
        EXPECT_NE(std::string(err).find("max_draft=4"), std::string::npos) << err;
        EXPECT_EQ(kvp_arena_size(&cfg), 0u) << r.spec;
        kvp_cache *c = nullptr;
        EXPECT_EQ(kvp_create(&cfg, nullptr, 0, &c), KVP_ERR_CONFIG) << r.spec;
        EXPECT_EQ(c, nullptr);
        if (c) kvp_destroy(c);
        // one less than the need is refused, the need works (drafts of 4 after the capacity)
        cfg.capacity = r.need - 1;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_ERR_CONFIG) << r.spec;
        cfg.capacity = r.need;
        EXPECT_EQ(kvp_config_check(&cfg, err, sizeof err), KVP_OK) << r.spec << ": " << err;
        std::string s = r.spec;
        s = s.substr(0, s.rfind(" capacity=")) + " capacity=" + std::to_string(r.need);
        drafts_at_capacity(m, s, 4, 7);
        if (HasFatalFailure()) return;
    }
}

}  // namespace
