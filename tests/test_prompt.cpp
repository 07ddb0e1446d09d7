// Whole-prompt selection across chunks (issue 28, max_prompt; src/prompt.h). A prompt given as
// any sequence of kvp_prefill calls must leave exactly the state one call with the whole prompt
// leaves: the same kept positions per layer and KV head, the same layer stats, and (since the
// stored rows and scores are then the same) the same decode outputs bit for bit afterwards.
#include <gtest/gtest.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "reference.h"

namespace {

// Every policy that takes max_prompt, with sizes that make it select from a 300-token prompt.
const char *const kSpecs[] = {
    "policy=snapkv budget=48 obs_window=8 recent=4",
    "policy=snapkv budget=40 obs_window=6 pool=max pool_kernel=3 positions=realign",
    "policy=pyramidkv budget=48 obs_window=8 beta=5",
    "policy=h2o budget=64 recent=8",
    "policy=h2o budget=64 recent=8 positions=realign",
    "policy=lethe capacity=120 evict_threshold=40 sparse_ratio=3 obs_window=8",
    "policy=simlayerkv nonlazy=snapkv budget=48 obs_window=8 sinks=4 window=24 lazy_last=8 lazy_threshold=0.2",
    "policy=simlayerkv nonlazy=h2o budget=64 recent=8 capacity=96 sinks=4 window=24 lazy_force=1",
    "policy=window window=60",
    "policy=streaming sinks=4 window=48 compress_every=8",
    "policy=snapkv budget=48 obs_window=8 recent=4 kv_rotate=hadamard",
    // selects at layer 0 (one layer per rank figure, any tau), which layer 1 then keeps
    "policy=asl budget=48 obs_window=8 asl_min_layer=0 asl_obs_layers=1",
    // non-lazy layers over full hold the prompt within their capacity; laziness decided at its end
    "policy=simlayerkv nonlazy=full capacity=320 sinks=4 window=24 lazy_last=8 lazy_threshold=0.2",
    "policy=simlayerkv nonlazy=full capacity=320 sinks=4 window=24 lazy_force=2",
    // the random baseline: a uniform subset of the whole prompt; keep_prompt=1 holds it within capacity
    "policy=random keep_prompt=0 budget=48 seed=7",
    "policy=random budget=8 capacity=330 seed=7",
    // TriAttention keeps the prompt (held within capacity); its query statistics add up chunk by chunk
    "policy=triattention budget=8 beta=4 capacity=330",
    "policy=triattention budget=8 beta=4 capacity=330 tri_mode=per_head",
    // ThinK's channels chosen at the prompt's end (the blocks wait at f32 in the deferred rows)
    "policy=think key_channel_ratio=0.5 value_channel_ratio=0.25 capacity=320",
    "policy=think token_policy=h2o budget=64 recent=8 key_channel_ratio=0.5 value_channel_ratio=0.5",
    "policy=think token_policy=snapkv budget=48 obs_window=8 key_channel_ratio=0.25 channel_score=l2",
    "policy=think token_policy=streaming sinks=40 window=48 compress_every=8 key_channel_ratio=0.5 value_channel_ratio=0.25",
};

const kvp_model kModel = ref::model(2, 4, 2, 16);
constexpr uint32_t kPrompt = 300, kDecode = 6;

struct Outcome {
    std::vector<std::vector<int32_t>> pos;  // [layer * H + head]
    std::vector<kvp_layer_stats> stats;
    std::vector<float> dec;                 // decode outputs after the prompt
    bool ok = false;
};

// The prompt in chunks of `chunk` tokens (0: one call), then kvp_prompt_end (when `explicit_end`)
// or the first decode, then kDecode decode steps.
Outcome run(const std::string &spec, uint32_t chunk, bool explicit_end = false, uint32_t prompt = kPrompt) {
    Outcome o;
    ref::Cache cache(kModel, spec);
    if (!cache.c) return o;
    kvp_cache *c = cache.c;
    const ref::Inputs in(kModel, prompt + kDecode, 7, 1.5f);
    std::vector<float> out(size_t(prompt) * in.nq);
    const uint32_t step = chunk ? chunk : prompt;
    for (uint32_t t = 0; t < prompt; t += step) {
        const uint32_t n = prompt - t < step ? prompt - t : step;
        for (uint32_t l = 0; l < kModel.n_layers; ++l) {
            const kvp_status st = kvp_prefill(c, l, n, nullptr, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv],
                                              &in.v[size_t(t) * in.nkv], out.data(), nullptr);
            EXPECT_EQ(st, KVP_OK) << spec << " chunk " << chunk << " at " << t << ": " << kvp_last_error(c);
            if (st != KVP_OK) return o;
        }
    }
    if (explicit_end) {
        EXPECT_EQ(kvp_prompt_end(c), KVP_OK);
    }
    std::vector<float> d(in.nq);
    for (uint32_t s = 0; s < kDecode; ++s) {
        const uint32_t t = prompt + s;
        for (uint32_t l = 0; l < kModel.n_layers; ++l) {
            const kvp_status st =
                kvp_decode(c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv], d.data());
            EXPECT_EQ(st, KVP_OK) << spec << ": " << kvp_last_error(c);
            if (st != KVP_OK) return o;
            o.dec.insert(o.dec.end(), d.begin(), d.end());
        }
        if (s == 0) {  // the state right after the prompt's selection and one decode
            for (uint32_t l = 0; l < kModel.n_layers; ++l) {
                for (uint32_t h = 0; h < kModel.n_kv_heads; ++h) o.pos.push_back(cache.positions(l, h));
                kvp_layer_stats ls;
                ls.struct_size = sizeof ls;
                EXPECT_EQ(kvp_get_layer_stats(c, l, &ls), KVP_OK);
                o.stats.push_back(ls);
            }
        }
    }
    o.ok = true;
    return o;
}

void expect_same(const Outcome &a, const Outcome &b, const std::string &what) {
    ASSERT_TRUE(a.ok && b.ok) << what;
    ASSERT_EQ(a.pos.size(), b.pos.size());
    for (size_t i = 0; i < a.pos.size(); ++i) EXPECT_EQ(a.pos[i], b.pos[i]) << what << " layer*H+head " << i;
    for (size_t l = 0; l < a.stats.size(); ++l) {
        EXPECT_EQ(a.stats[l].len, b.stats[l].len) << what;
        EXPECT_EQ(a.stats[l].live_bytes, b.stats[l].live_bytes) << what;
        EXPECT_EQ(a.stats[l].prune_events, b.stats[l].prune_events) << what;
        EXPECT_EQ(a.stats[l].tokens_evicted, b.stats[l].tokens_evicted) << what;
        EXPECT_EQ(a.stats[l].evict_threshold, b.stats[l].evict_threshold) << what;
        EXPECT_EQ(a.stats[l].lazy, b.stats[l].lazy) << what;
        EXPECT_EQ(a.stats[l].prompt_early, 0u) << what;
    }
    ASSERT_EQ(a.dec.size(), b.dec.size());
    EXPECT_EQ(memcmp(a.dec.data(), b.dec.data(), a.dec.size() * sizeof(float)), 0) << what << ": decode outputs differ";
}

// The target: chunks of 1, 7, 64 and 512 (here: past the prompt, one call) tokens ==
// one call, for every prompt-selecting policy x f32/q8/q4 x 1/2 threads, score=fixed.
class ChunkedEqualsOneCall : public ::testing::TestWithParam<const char *> {};

TEST_P(ChunkedEqualsOneCall, SameKeptPositionsStatsAndDecodeBits) {
    setenv("KVP_PAR_WORK", "0", 1);  // every call on all the threads its items allow
    for (const char *dtype : {"f32", "q8", "q4"}) {
        for (const char *threads : {"1", "2"}) {
            const std::string spec = std::string(GetParam()) + " score=fixed max_prompt=320 kv_dtype=" + dtype +
                                     " threads=" + threads;
            const Outcome one = run(spec, 0);
            for (uint32_t chunk : {1u, 7u, 64u, 512u}) expect_same(one, run(spec, chunk), spec + " chunk " + std::to_string(chunk));
            expect_same(one, run(spec, 64, true), spec + " chunk 64, kvp_prompt_end");
        }
    }
    unsetenv("KVP_PAR_WORK");
}

INSTANTIATE_TEST_SUITE_P(Policies, ChunkedEqualsOneCall, ::testing::ValuesIn(kSpecs));

// Float scores too: the observation at the prompt's end reads the same keys and queries however
// the prompt was chunked, so float mode is exact as well (no order caveat).
TEST(Prompt, FloatScoresChunkedEqualsOneCall) {
    for (const char *p : {kSpecs[0], kSpecs[3], kSpecs[5], kSpecs[6]}) {
        const std::string spec = std::string(p) + " max_prompt=320";
        expect_same(run(spec, 0), run(spec, 7), spec);
    }
}

// Sliding-window layers: a local layer (layer 0 here) keeps its exact window whatever the
// chunking (it holds no prompt); the global layer holds the prompt and selects at its end. The
// local ring evicts once per chunk piece, so its prune_events count the chunks, and with
// quantized storage its group boundaries follow them: kept positions and the global layer are
// compared, and f32 decode bits.
TEST(Prompt, SlidingWindowLayersKeepTheirWindow) {
    for (const char *dtype : {"f32", "q8"}) {
        const std::string spec = std::string("policy=h2o budget=64 recent=8 sliding_window=24 sliding_pattern=2 "
                                             "score=fixed max_prompt=320 kv_dtype=") + dtype;
        const Outcome one = run(spec, 0);
        for (uint32_t chunk : {1u, 7u, 64u}) {
            const Outcome ch = run(spec, chunk);
            ASSERT_TRUE(one.ok && ch.ok) << spec;
            EXPECT_EQ(one.pos, ch.pos) << spec << " chunk " << chunk;
            EXPECT_EQ(one.stats[1].prune_events, ch.stats[1].prune_events) << spec;
            EXPECT_EQ(one.stats[1].tokens_evicted, ch.stats[1].tokens_evicted) << spec;
            if (std::string(dtype) == "f32") {
                EXPECT_EQ(memcmp(one.dec.data(), ch.dec.data(), one.dec.size() * sizeof(float)), 0) << spec << " chunk " << chunk;
            }
        }
    }
}

// The comparison has teeth: without max_prompt each chunk is selected by its own queries, and the
// kept set differs from one call's.
TEST(Prompt, WithoutMaxPromptChunkingChangesTheSelection) {
    const std::string spec = "policy=snapkv budget=48 obs_window=8 recent=4 score=fixed";
    const Outcome one = run(spec, 0), chunked = run(spec, 64);
    ASSERT_TRUE(one.ok && chunked.ok);
    EXPECT_NE(one.pos, chunked.pos);
}

// One call with max_prompt keeps what one call without it keeps (the same observation bits over
// the same keys), for a staged policy and one that attends in its store.
TEST(Prompt, OneCallKeepsWhatTheChunkSelectionKept) {
    // (ThinK over a policy that attends in its store: the channels come from the same queries and
    // keys; over a staged policy one call chooses them over the selection, max_prompt over the prompt)
    for (const char *p : {"policy=snapkv budget=48 obs_window=8 recent=4", "policy=h2o budget=64 recent=8 capacity=320",
                          "policy=think token_policy=h2o budget=64 recent=8 capacity=320 key_channel_ratio=0.5 value_channel_ratio=0.5",
                          "policy=think key_channel_ratio=0.5 value_channel_ratio=0.25 capacity=320 kv_dtype=q8"}) {
        for (const char *score : {"fixed", "float"}) {
            const std::string spec = std::string(p) + " score=" + score;
            const Outcome before = run(spec, 0), after = run(spec + " max_prompt=320", 0);
            ASSERT_TRUE(before.ok && after.ok) << spec;
            EXPECT_EQ(before.pos, after.pos) << spec;
            EXPECT_EQ(memcmp(before.dec.data(), after.dec.data(), before.dec.size() * sizeof(float)), 0) << spec;
        }
    }
}

// Window, streaming and h2o take a prompt larger than their capacity in any chunking with no
// capacity set by hand (the issue: "a prompt of up to P tokens is accepted ... one call included").
TEST(Prompt, PromptsLargerThanCapacityNeedNoCapacity) {
    for (const char *p : {"policy=window window=40", "policy=h2o budget=50", "policy=streaming sinks=4 window=30 compress_every=4"}) {
        const std::string spec = std::string(p) + " max_prompt=300";
        const Outcome one = run(spec, 0);
        ASSERT_TRUE(one.ok) << spec;
        for (const auto &pos : one.pos) EXPECT_LE(pos.size(), 51u) << spec;
    }
}

// A prefill rule that keeps more than the capacity (streaming never prunes with compress_every=0)
// gives way to the policy's own ranking when the prompt ends: capacity binds.
TEST(Prompt, CapacityBindsAtThePromptsEnd) {
    const std::string spec = "policy=streaming sinks=4 window=40 compress_every=0 capacity=60 max_prompt=300";
    ref::Cache cache(kModel, spec);
    const ref::Inputs in(kModel, 200, 4, 1.0f);
    std::vector<float> out(size_t(200) * in.nq);
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(cache.c, l, 200, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_prompt_end(cache.c), KVP_OK);
    const std::vector<int32_t> pos = cache.positions(0, 0);
    ASSERT_LE(pos.size(), 59u);  // room for the next token; the ring frees whole blocks: at most a block under it
    ASSERT_GE(pos.size(), 60u - 16u);
    for (int32_t i = 0; i < 4; ++i) EXPECT_EQ(pos[size_t(i)], i);  // the sinks
    for (size_t i = 4; i < pos.size(); ++i) EXPECT_EQ(pos[i], int32_t(200 - pos.size() + i));  // then the most recent
}

// A prompt beyond max_prompt is selected whenever it would pass capacity + P (counted), never an
// error in the middle of the prompt, and ends within capacity.
TEST(Prompt, BeyondMaxPromptFallsBackToEarlySelection) {
    const std::string spec = "policy=snapkv budget=48 obs_window=8 recent=4 score=fixed max_prompt=100";
    ref::Cache cache(kModel, spec);
    kvp_cache *c = cache.c;
    const uint32_t T = 700;
    const ref::Inputs in(kModel, T + 1, 3, 1.0f);
    std::vector<float> out(size_t(T) * in.nq);
    for (uint32_t t = 0; t < T;) {
        const uint32_t room = kvp_prefill_room(c);
        ASSERT_GT(room, 0u);
        const uint32_t n = T - t < room ? T - t : room;
        for (uint32_t l = 0; l < kModel.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c, l, n, nullptr, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv],
                                  &in.v[size_t(t) * in.nkv], out.data(), nullptr),
                      KVP_OK)
                << kvp_last_error(c);
        t += n;
    }
    ASSERT_EQ(kvp_prompt_end(c), KVP_OK);
    for (uint32_t l = 0; l < kModel.n_layers; ++l) {
        kvp_layer_stats ls;
        ls.struct_size = sizeof ls;
        ASSERT_EQ(kvp_get_layer_stats(c, l, &ls), KVP_OK);
        EXPECT_GT(ls.prompt_early, 0u);
        EXPECT_LE(ls.len, ls.capacity);
        EXPECT_EQ(ls.len, 48u);
    }
    // one call of more than max_prompt tokens is refused before anything changes
    EXPECT_EQ(kvp_prefill(c, 0, 101, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(c), "max_prompt"), nullptr) << kvp_last_error(c);
}

// full never evicts, so it never selects from a prompt: max_prompt gives it no room (and no
// arena) beyond its capacity, and a prompt past capacity is refused as without it.
TEST(Prompt, FullGetsNoPromptRoom) {
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &kModel), KVP_OK);
    char err[256] = "";
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=full capacity=64", err, sizeof err), KVP_OK) << err;
    const size_t base = kvp_arena_size(&cfg);
    // (a spec that names policy=full refuses the key: it has no effect there; a spec without
    // policy= composes onto the config)
    EXPECT_EQ(kvp_config_apply(&cfg, "policy=full max_prompt=100", err, sizeof err), KVP_ERR_CONFIG);
    ASSERT_EQ(kvp_config_apply(&cfg, "max_prompt=100", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(kvp_arena_size(&cfg), base);
    std::vector<char> arena(base + 64);
    kvp_cache *c = nullptr;
    char *a64 = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
    ASSERT_EQ(kvp_create(&cfg, a64, base, &c), KVP_OK);
    const ref::Inputs in(kModel, 200, 5, 1.0f);
    std::vector<float> out(size_t(200) * in.nq);
    ASSERT_EQ(kvp_prefill(c, 0, 64, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK);
    EXPECT_EQ(kvp_prefill(c, 0, 1, nullptr, &in.q[64 * in.nq], &in.k[64 * in.nkv], &in.v[64 * in.nkv], out.data(), nullptr),
              KVP_ERR_FULL);
    EXPECT_NE(strstr(kvp_last_error(c), "can take 0 more"), nullptr) << kvp_last_error(c);
    EXPECT_EQ(kvp_layer_len(c, 0), 64u);
    kvp_destroy(c);
}

// Calls around an open prompt: state save/load refuse it, drafts and appends end it, reset clears it.
TEST(Prompt, CallsAroundAnOpenPrompt) {
    const std::string spec = "policy=h2o budget=32 recent=4 max_prompt=128 max_draft=2";
    ref::Cache cache(kModel, spec);
    kvp_cache *c = cache.c;
    const ref::Inputs in(kModel, 200, 9, 1.0f);
    std::vector<float> out(size_t(200) * in.nq);
    auto prefill_all = [&](uint32_t at, uint32_t n) {
        for (uint32_t l = 0; l < kModel.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c, l, n, nullptr, &in.q[size_t(at) * in.nq], &in.k[size_t(at) * in.nkv],
                                  &in.v[size_t(at) * in.nkv], out.data(), nullptr),
                      KVP_OK)
                << kvp_last_error(c);
    };
    prefill_all(0, 100);
    EXPECT_EQ(kvp_layer_len(c, 0), 100u);  // held whole while open
    std::vector<char> st(kvp_state_size(c));
    size_t w = 0;
    EXPECT_EQ(kvp_state_save(c, st.data(), st.size(), &w), KVP_ERR_STATE);
    EXPECT_NE(strstr(kvp_last_error(c), "kvp_prompt_end"), nullptr);
    EXPECT_EQ(kvp_state_load(c, st.data(), st.size()), KVP_ERR_ARG);  // not a state: nothing changes
    EXPECT_EQ(kvp_layer_len(c, 0), 100u);
    // a draft ends the prompt first
    ASSERT_EQ(kvp_draft_begin(c), KVP_OK);
    EXPECT_EQ(kvp_layer_len(c, 0), 32u);
    ASSERT_EQ(kvp_draft_commit(c, 0), KVP_OK);
    ASSERT_EQ(kvp_state_save(c, st.data(), st.size(), &w), KVP_OK) << kvp_last_error(c);
    // a chat's next turn: a prompt over what the cache holds plus the new tokens
    prefill_all(100, 50);
    EXPECT_EQ(kvp_layer_len(c, 1), 82u);
    {  // a valid state loaded over the open prompt replaces it; the next prompt opens afresh
        ref::Cache twin(kModel, spec);
        ASSERT_EQ(kvp_state_load(twin.c, st.data(), w), KVP_OK) << kvp_last_error(twin.c);
        ASSERT_EQ(kvp_state_load(c, st.data(), w), KVP_OK) << kvp_last_error(c);
        EXPECT_EQ(kvp_layer_len(c, 1), 32u);
        EXPECT_EQ(cache.positions(1, 0), twin.positions(1, 0));
        EXPECT_EQ(kvp_prompt_end(c), KVP_OK);  // nothing open
        EXPECT_EQ(kvp_layer_len(c, 1), 32u);
        prefill_all(100, 50);  // the same turn again, from the loaded state
        EXPECT_EQ(kvp_layer_len(c, 1), 82u);
    }
    // a decode that fails its checks leaves the prompt open
    std::vector<float> bad(in.nq, 0.0f);
    bad[0] = NAN;
    EXPECT_EQ(kvp_decode(c, 0, bad.data(), &in.k[150 * in.nkv], &in.v[150 * in.nkv], out.data()), KVP_ERR_NONFINITE);
    EXPECT_EQ(kvp_layer_len(c, 1), 82u);
    // an append ends it
    ASSERT_EQ(kvp_append(c, 0, 1, nullptr, &in.k[150 * in.nkv], &in.v[150 * in.nkv]), KVP_OK) << kvp_last_error(c);
    EXPECT_LE(kvp_layer_len(c, 1), 33u);
    // a prefill without q stores without attention, as an append: it ends the prompt first
    prefill_all(0, 100);
    EXPECT_GT(kvp_layer_len(c, 1), 100u);  // what it held plus the new prompt
    ASSERT_EQ(kvp_prefill(c, 1, 1, nullptr, nullptr, &in.k[151 * in.nkv], &in.v[151 * in.nkv], nullptr, nullptr), KVP_OK)
        << kvp_last_error(c);
    EXPECT_LE(kvp_layer_len(c, 1), 33u);
    EXPECT_LE(kvp_layer_len(c, 0), 32u);
    // reset: nothing open, a saved state loads
    prefill_all(0, 100);
    ASSERT_EQ(kvp_reset(c), KVP_OK);
    EXPECT_EQ(kvp_state_load(c, st.data(), w), KVP_OK) << kvp_last_error(c);
    EXPECT_EQ(kvp_layer_len(c, 0), 32u);
}

TEST(Prompt, UnsupportedCombinationsAreRefusedAtCreate) {
    for (const char *p : {"policy=h2o budget=32 total_capacity=200 max_prompt=64"}) {
        kvp_config cfg;
        ASSERT_EQ(kvp_config_default(&cfg, &kModel), KVP_OK);
        char err[256] = "";
        EXPECT_EQ(kvp_config_apply(&cfg, p, err, sizeof err), KVP_ERR_UNSUPPORTED) << p;  // apply checks the result
        EXPECT_NE(strstr(err, "max_prompt"), nullptr) << err;
    }
}

// Policies whose layers may keep the whole prompt (simlayerkv over full, think over full) hold an
// open prompt within their capacity: a chunk past it is refused (as one call past capacity is),
// naming capacity, and changes nothing.
TEST(Prompt, KeepingPoliciesHoldThePromptWithinCapacity) {
    for (const char *p : {"policy=simlayerkv nonlazy=full capacity=100 sinks=4 window=24 max_prompt=64",
                          "policy=think key_channel_ratio=0.5 capacity=100 max_prompt=64"}) {
        ref::Cache cache(kModel, p);
        kvp_cache *c = cache.c;
        ASSERT_NE(c, nullptr) << p;
        const ref::Inputs in(kModel, 128, 5, 1.0f);
        std::vector<float> out(size_t(64) * in.nq);
        for (uint32_t l = 0; l < kModel.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c, l, 64, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK)
                << p << ": " << kvp_last_error(c);
        const std::vector<int32_t> before = cache.positions(0, 0);
        EXPECT_EQ(kvp_prefill(c, 0, 64, nullptr, &in.q[size_t(64) * in.nq], &in.k[size_t(64) * in.nkv],
                              &in.v[size_t(64) * in.nkv], out.data(), nullptr),
                  KVP_ERR_FULL)
            << p;
        EXPECT_NE(strstr(kvp_last_error(c), "raise capacity"), nullptr) << kvp_last_error(c);
        EXPECT_EQ(cache.positions(0, 0), before) << p;
        EXPECT_EQ(kvp_prompt_end(c), KVP_OK);
    }
    // A new prompt over a full layer makes room by the policy's ranking first (random keep_prompt=1
    // evicts generated tokens): the layer never passes its capacity, its positions stay ascending.
    ref::Cache cache(kModel, "policy=random budget=30 capacity=60 max_prompt=32");
    kvp_cache *c = cache.c;
    const ref::Inputs in(kModel, 100, 6, 1.0f);
    std::vector<float> out(size_t(32) * in.nq);
    auto prefill = [&](uint32_t t, uint32_t n) {
        for (uint32_t l = 0; l < kModel.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c, l, n, nullptr, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv],
                                  &in.v[size_t(t) * in.nkv], out.data(), nullptr),
                      KVP_OK)
                << kvp_last_error(c);
    };
    prefill(0, 20);
    for (uint32_t t = 20; t < 59; ++t)
        for (uint32_t l = 0; l < kModel.n_layers; ++l)
            ASSERT_EQ(kvp_decode(c, l, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv], &in.v[size_t(t) * in.nkv],
                                 out.data()),
                      KVP_OK);
    ASSERT_EQ(cache.positions(0, 0).size(), 50u);  // 20 prompt + 30 generated
    prefill(59, 25);  // 75 > 60: 15 generated tokens go first
    const std::vector<int32_t> p = cache.positions(0, 0);
    ASSERT_EQ(p.size(), 60u);
    for (size_t i = 1; i < p.size(); ++i) EXPECT_LT(p[i - 1], p[i]);
    for (int32_t t = 0; t < 20; ++t) EXPECT_EQ(p[size_t(t)], t);  // the first prompt stays
    EXPECT_EQ(p.back(), 83);
}

// A decode or append whose room after the prompt's end depends on a decision made there
// (simlayerkv: a layer that turns lazy keeps its sinks) is judged by the least the policy can
// promise: refused before the prompt ends, nothing changed (found by the call-sequence fuzzer).
TEST(Prompt, AdmissionAfterThePromptsEndCountsWhatItsDecisionsKeep) {
    ref::Cache cache(kModel, "policy=simlayerkv nonlazy=h2o budget=22 recent=0 sinks=3 window=6 lazy_force=3 max_prompt=30");
    kvp_cache *c = cache.c;
    ASSERT_NE(c, nullptr);
    const ref::Inputs in(kModel, 80, 4, 1.0f);
    std::vector<float> out(size_t(30) * in.nq);
    for (uint32_t l = 0; l < kModel.n_layers; ++l)
        ASSERT_EQ(kvp_prefill(c, l, 14, nullptr, in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr), KVP_OK)
            << kvp_last_error(c);
    const uint32_t cap = kvp_layer_capacity(c, 1), n = cap - 3 + 1;  // fits after h2o's end, not a lazy layer's
    const std::vector<int32_t> before = cache.positions(1, 0);
    EXPECT_EQ(kvp_append(c, 1, n, nullptr, &in.k[size_t(14) * in.nkv], &in.v[size_t(14) * in.nkv]), KVP_ERR_FULL);
    EXPECT_EQ(cache.positions(1, 0), before);  // the prompt is still open and whole
    EXPECT_EQ(kvp_layer_len(c, 1), 14u);
    EXPECT_EQ(kvp_append(c, 1, n - 1, nullptr, &in.k[size_t(14) * in.nkv], &in.v[size_t(14) * in.nkv]), KVP_OK)
        << kvp_last_error(c);
}

// ThinK (issue 28): a store without channels keeps its open prompt at f32, full width (in the
// pool's deferred rows), and chooses the channels at the prompt's end; a prompt past capacity + P
// chooses them at the first early selection, and a later prompt (a chat's next turn) converts with
// the channels it has. The arena adds f32 K and V for every pool slot.
TEST(Prompt, ThinkHoldsThePromptAtF32UntilItsEnd) {
    const std::string spec = "policy=think token_policy=h2o budget=64 recent=8 key_channel_ratio=0.5 kv_dtype=q8";
    const uint32_t L = kModel.n_layers, H = kModel.n_kv_heads, hd = kModel.head_dim;
    ref::Cache cache(kModel, spec + " max_prompt=256");
    kvp_cache *c = cache.c;
    ASSERT_NE(c, nullptr);
    const ref::Inputs in(kModel, 600, 11, 1.0f);
    std::vector<float> out(size_t(600) * in.nq);
    auto prefill = [&](uint32_t t, uint32_t n) {
        for (uint32_t l = 0; l < L; ++l)
            ASSERT_EQ(kvp_prefill(c, l, n, nullptr, &in.q[size_t(t) * in.nq], &in.k[size_t(t) * in.nkv],
                                  &in.v[size_t(t) * in.nkv], out.data(), nullptr),
                      KVP_OK)
                << kvp_last_error(c);
    };
    auto stats = [&](uint32_t l) {
        kvp_layer_stats ls;
        ls.struct_size = sizeof ls;
        EXPECT_EQ(kvp_get_layer_stats(c, l, &ls), KVP_OK);
        return ls;
    };
    for (uint32_t t = 0; t < 200; t += 40) prefill(t, 40);
    for (uint32_t l = 0; l < L; ++l) {  // open: every token at f32, full width (8 bytes per channel: K and V)
        EXPECT_EQ(stats(l).len, 200u);
        EXPECT_EQ(stats(l).live_bytes, uint64_t(H) * 200 * hd * 8) << l;
    }
    ASSERT_EQ(kvp_prompt_end(c), KVP_OK);
    for (uint32_t l = 0; l < L; ++l) {  // selected and converted: q8 at half the key channels
        EXPECT_LT(stats(l).len, 65u);
        EXPECT_LT(stats(l).live_bytes, uint64_t(H) * 64 * hd * 2) << l;
    }
    std::vector<float> d(in.nq);
    for (uint32_t l = 0; l < L; ++l)
        ASSERT_EQ(kvp_decode(c, l, &in.q[size_t(200) * in.nq], &in.k[size_t(200) * in.nkv], &in.v[size_t(200) * in.nkv],
                             d.data()),
                  KVP_OK);
    // a next turn: converted as it comes (its channels are chosen), selected at its end
    for (uint32_t t = 201; t < 441; t += 60) prefill(t, 60);
    for (uint32_t l = 0; l < L; ++l) EXPECT_LT(stats(l).live_bytes, uint64_t(H) * stats(l).len * hd * 8) << l;
    ASSERT_EQ(kvp_prompt_end(c), KVP_OK);

    // past capacity + P: the early selection chooses the channels; the prompt goes on
    ref::Cache big(kModel, spec + " max_prompt=64");
    c = big.c;
    for (uint32_t t = 0; t < 320; t += 64) prefill(t, 64);
    EXPECT_GT(stats(0).prompt_early, 0u);
    ASSERT_EQ(kvp_prompt_end(c), KVP_OK);
    EXPECT_LT(stats(0).live_bytes, uint64_t(H) * 65 * hd * 2);

    // the arena: the prompt's P slots per layer and KV head, and f32 K + V for every pool slot
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &kModel), KVP_OK);
    char err[256] = "";
    ASSERT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << err;
    const size_t base = kvp_arena_size(&cfg);
    ASSERT_EQ(kvp_config_apply(&cfg, "max_prompt=256", err, sizeof err), KVP_OK) << err;
    const size_t with = kvp_arena_size(&cfg);
    const size_t slots = L * (64 + 1 + 256);  // per KV head (pool): capacity + P per layer, at least
    EXPECT_GE(with - base, H * slots * hd * 2 * sizeof(float)) << with - base;
}

// The peak counts the prompt's end too (cache.cpp cache_prompt_select): a deferred ThinK store
// converts its rows there, before the selection, and a store's first conversion adds its side
// data, so layer 2's one token takes 302 bytes where its full-width row took 256. The fuzzer found
// peak_live_bytes below live_bytes after such a prompt's end (5786 against 5740;
// tests/fuzz/corpus/calls/d8fe5927...): its calls, on its model (3 layers, 2 q / 1 KV head,
// head_dim 32, no RoPE): decodes into layer 1, a prompt opened there, decodes into layer 0, then a
// few tokens into every layer (a draft's accepted tokens) and the prompt's end. Fails without the
// peak at the prompt's end.
TEST(Prompt, PeakCountsThePromptsEndConversion) {
    const kvp_model m = ref::model(3, 2, 1, 32, KVP_ROPE_NONE);
    for (uint32_t acc = 1; acc <= 3; ++acc) {
        ref::Cache cache(m, "policy=think token_policy=h2o budget=19 recent=8 key_channel_ratio=0.1 block=16 quant_group=1 max_prompt=37");
        kvp_cache *c = cache.c;
        ASSERT_NE(c, nullptr);
        const ref::Inputs in(m, 40, 7, 1.0f);
        std::vector<float> out(in.nq * 16);
        uint32_t t = 0;
        auto call = [&](uint32_t l, uint32_t n) {
            const kvp_status st = n == 0 ? kvp_decode(c, l, &in.q[t * in.nq], &in.k[t * in.nkv], &in.v[t * in.nkv], out.data())
                                         : kvp_prefill(c, l, n, nullptr, &in.q[t * in.nq], &in.k[t * in.nkv],
                                                       &in.v[t * in.nkv], out.data(), nullptr);
            ASSERT_EQ(st, KVP_OK) << kvp_last_error(c);
            kvp_stats s;
            s.struct_size = sizeof s;
            ASSERT_EQ(kvp_get_stats(c, &s), KVP_OK);
            EXPECT_GE(s.peak_live_bytes, s.live_bytes) << "after a call into layer " << l;
        };
        for (int i = 0; i < 6; ++i) call(1, 0), ++t;
        call(1, 12);
        t += 12;
        for (int i = 0; i < 2; ++i) call(0, 0), ++t;
        for (uint32_t l = 0; l < 3; ++l) call(l, acc);
        ASSERT_EQ(kvp_prompt_end(c), KVP_OK) << kvp_last_error(c);
        kvp_stats s;
        s.struct_size = sizeof s;
        ASSERT_EQ(kvp_get_stats(c, &s), KVP_OK);
        EXPECT_GE(s.peak_live_bytes, s.live_bytes) << "after the prompt's end (" << acc << " tokens)";
    }
}

// The arena a declared prompt adds: P tokens of K/V (+ slot metadata) per layer and KV head, the
// kept queries, and the selection's scratch over P more tokens; nothing without max_prompt.
TEST(Prompt, ArenaGrowsByThePromptOnly) {
    kvp_config cfg;
    ASSERT_EQ(kvp_config_default(&cfg, &kModel), KVP_OK);
    char err[256] = "";
    ASSERT_EQ(kvp_config_apply(&cfg, "policy=h2o budget=64 recent=8", err, sizeof err), KVP_OK) << err;
    const size_t base = kvp_arena_size(&cfg);
    ASSERT_EQ(kvp_config_apply(&cfg, "max_prompt=0", err, sizeof err), KVP_OK) << err;
    EXPECT_EQ(kvp_arena_size(&cfg), base);
    ASSERT_EQ(kvp_config_apply(&cfg, "max_prompt=1024", err, sizeof err), KVP_OK) << err;
    const size_t with = kvp_arena_size(&cfg);
    const size_t L = kModel.n_layers, H = kModel.n_kv_heads, hd = kModel.head_dim;
    const size_t kv = L * H * 1024 * (2 * hd * sizeof(float));                 // K and V rows
    const size_t meta = L * H * 1024 * 3 * sizeof(int32_t);                    // pos, rot, score
    const size_t queries = L * 32 * kModel.n_q_heads * hd * sizeof(float);    // obs_window = 32
    // per thread, scratch also grows with the longest store: the selection's 24 bytes per token,
    // a run entry per token (24 bytes), the observation's logit rows (kTileTokens x G + G floats
    // per key); and the RoPE tables of one call's positions (a chunk may now take P tokens)
    const size_t G = kModel.n_q_heads / kModel.n_kv_heads,
                 scratch = 1024 * (24 + 24 + (4 * G + G) * sizeof(float) + hd * sizeof(float));
    EXPECT_GE(with - base, kv + meta);
    EXPECT_LE(with - base, kv + meta + queries + scratch + 16 * 1024) << with - base;  // + block tables, alignment
}

}  // namespace
