// State save/load (issue 21): round trips for every policy x kv_dtype x positions mode continue
// bit for bit (outputs, kept positions, slot scores, policy state, stats) in a cache of the same
// configuration, also one created with another thread count and one that held other tokens;
// the size is about the live bytes, not the arena; truncated, corrupted, foreign-config,
// foreign-version and inconsistent buffers are refused with a message and the cache unchanged.
// Portability: committed states written on x86-64 (tests/data/state) load and continue here,
// and this platform's save of the same sequence is the same bytes.
// KVP_WRITE_STATE_FILES=1 rewrites the committed files (x86-64).
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cache.h"
#include "reference.h"
#include "state.h"

namespace {

const char *const kSpecs[] = {
    "policy=full capacity=200",
    "policy=window window=40 capacity=48",
    "policy=streaming sinks=4 window=40 compress_every=4 slack=6 max_drop=3 capacity=60",
    // sinks filling a quantization group: converted pinned tokens (pconv > 0), loaded into a fresh cache too
    "policy=streaming sinks=16 window=40 compress_every=4 capacity=80",
    "policy=h2o budget=48 recent=8 capacity=64",
    "policy=h2o budget=48 recent=8 capacity=64 total_capacity=100 score=fixed",
    "policy=snapkv budget=40 obs_window=8 capacity=60 recent=4 prefill_stage=64",
    "policy=pyramidkv budget=40 obs_window=8 beta=5 prefill_stage=64",
    "policy=lethe capacity=120 evict_threshold=24 sparse_ratio=1.2 obs_window=8",
    "policy=simlayerkv nonlazy=h2o budget=48 recent=8 capacity=64 sinks=4 window=20 lazy_last=8 lazy_threshold=0.2",
    "policy=simlayerkv sinks=4 window=20 capacity=200 lazy_mode=decode lazy_threshold=0.2",
    "policy=asl budget=40 obs_window=8 capacity=60 recent=8 asl_min_layer=1",
    "policy=think token_policy=h2o budget=48 recent=8 capacity=64 key_channel_ratio=0.4 value_channel_ratio=0.2",
};
const char *const kDtypes[] = {"f32", "f16", "q8", "q4"};
const char *const kPositions[] = {"original", "realign"};

// Internals a continuation depends on: slot scores and rotations of the kept tokens in logical
// order, the store's shift, the layer's policy words.
std::vector<uint32_t> internals(const kvp_cache *c) {
    std::vector<uint32_t> out;
    for (uint32_t l = 0; l < c->cfg.model.n_layers; ++l) {
        for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
            const kvp::HeadStore &hs = kvp::head_of(c, l, h);
            const kvp::BlockPool &pool = c->pools[h];
            kvp::store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t) {
                for (uint32_t i = 0; i < n; ++i) {
                    uint32_t bits;
                    memcpy(&bits, &pool.score[slot + i], 4);
                    out.push_back(bits);
                    out.push_back(uint32_t(pool.rot[slot + i]));
                    out.push_back(uint32_t(pool.pos[slot + i]));
                }
            });
            out.push_back(uint32_t(hs.shift));
        }
        for (uint64_t w : c->layers[l].pstate) out.push_back(uint32_t(w)), out.push_back(uint32_t(w >> 32));
    }
    return out;
}

std::vector<uint8_t> save(const kvp_cache *c) {
    std::vector<uint8_t> b(kvp_state_size(c));
    size_t w = 0;
    EXPECT_EQ(kvp_state_save(c, b.data(), b.size(), &w), KVP_OK) << kvp_last_error(c);
    EXPECT_EQ(w, b.size());
    return b;
}

// Feeds a deterministic sequence: a prompt of P tokens per layer, then `steps` decodes (grid
// values: exact in float on every ISA).
struct Feeder {
    kvp_model m;
    ref::Rng g;
    std::vector<float> q, k, v, out;
    explicit Feeder(const kvp_model &mm, uint64_t seed) : m(mm), g(seed) {}
    void gen(uint32_t n) {
        q.resize(size_t(n) * m.n_q_heads * m.head_dim);
        k.resize(size_t(n) * m.n_kv_heads * m.head_dim);
        v.resize(k.size());
        out.resize(q.size());
        for (float &x : q) x = g.grid(2.0f);
        for (float &x : k) x = g.grid(2.0f);
        for (float &x : v) x = g.grid(1.0f);
    }
    void prompt(kvp_cache *c, uint32_t P) {
        gen(P);
        int32_t idx[256];
        kvp_selection sel;
        sel.struct_size = sizeof sel;
        sel.capacity = 256;
        sel.indices = idx;
        for (uint32_t l = 0; l < m.n_layers; ++l)
            ASSERT_EQ(kvp_prefill(c, l, P, nullptr, q.data(), k.data(), v.data(), out.data(), &sel), KVP_OK) << kvp_last_error(c);
    }
    // Decodes on both caches (b may be NULL); every output must match bit for bit (tol < 0) or
    // within tol.
    void decodes(kvp_cache *a, kvp_cache *b, uint32_t steps, const std::string &where, float tol = -1.0f) {
        std::vector<float> ob(size_t(m.n_q_heads) * m.head_dim);
        for (uint32_t s = 0; s < steps; ++s) {
            gen(1);
            for (uint32_t l = 0; l < m.n_layers; ++l) {
                ASSERT_EQ(kvp_decode(a, l, q.data(), k.data(), v.data(), out.data()), KVP_OK) << kvp_last_error(a);
                if (!b) continue;
                ASSERT_EQ(kvp_decode(b, l, q.data(), k.data(), v.data(), ob.data()), KVP_OK) << kvp_last_error(b);
                if (tol < 0) {
                    ASSERT_EQ(memcmp(out.data(), ob.data(), ob.size() * sizeof(float)), 0) << where << " step " << s << " layer " << l;
                } else {
                    for (size_t i = 0; i < ob.size(); ++i) ASSERT_NEAR(out[i], ob[i], tol) << where << " step " << s;
                }
            }
        }
    }
};

void expect_same(const kvp_cache *a, const kvp_cache *b, const std::string &where) {
    const kvp_model &m = a->cfg.model;
    kvp_stats sa, sb;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    sa.struct_size = sb.struct_size = sizeof sa;
    ASSERT_EQ(kvp_get_stats(a, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(b, &sb), KVP_OK);
    sa.arena_bytes = sb.arena_bytes = 0;  // another thread count: another arena
    EXPECT_EQ(memcmp(&sa, &sb, sizeof sa), 0) << where << " stats";
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        kvp_layer_stats la, lb;
        memset(&la, 0, sizeof la);
        memset(&lb, 0, sizeof lb);
        la.struct_size = lb.struct_size = sizeof la;
        ASSERT_EQ(kvp_get_layer_stats(a, l, &la), KVP_OK);
        ASSERT_EQ(kvp_get_layer_stats(b, l, &lb), KVP_OK);
        EXPECT_EQ(memcmp(&la, &lb, sizeof la), 0) << where << " layer stats " << l;
    }
    EXPECT_EQ(internals(a), internals(b)) << where;
}

// Kept positions per layer/head and the integer counters (not the float fields).
void expect_same_structure(const kvp_cache *a, const kvp_cache *b, const std::string &where) {
    const kvp_model &m = a->cfg.model;
    for (uint32_t l = 0; l < m.n_layers; ++l)
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            std::vector<int32_t> pa(4096), pb(4096);
            uint32_t na = 0, nb = 0;
            ASSERT_EQ(kvp_layer_positions(a, l, h, pa.data(), 4096, &na), KVP_OK);
            ASSERT_EQ(kvp_layer_positions(b, l, h, pb.data(), 4096, &nb), KVP_OK);
            pa.resize(na);
            pb.resize(nb);
            EXPECT_EQ(pa, pb) << where << " layer " << l << " head " << h;
        }
    kvp_stats sa, sb;
    sa.struct_size = sb.struct_size = sizeof sa;
    ASSERT_EQ(kvp_get_stats(a, &sa), KVP_OK);
    ASSERT_EQ(kvp_get_stats(b, &sb), KVP_OK);
    EXPECT_EQ(sa.live_bytes, sb.live_bytes) << where;
    EXPECT_EQ(sa.tokens_seen, sb.tokens_seen) << where;
    EXPECT_EQ(sa.prune_events, sb.prune_events) << where;
    EXPECT_EQ(sa.tokens_evicted, sb.tokens_evicted) << where;
}

TEST(State, RoundTripContinuesBitForBit) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    uint64_t seed = 1;
    for (const char *spec : kSpecs) {
        for (const char *dt : kDtypes) {
            for (const char *pm : kPositions) {
                const std::string s = std::string(spec) + " quant_group=16 kv_dtype=" + dt + " positions=" + pm;
                ref::Cache a(m, s), b(m, s + " threads=2"), fresh(m, s);
                ASSERT_TRUE(a.c && b.c && fresh.c) << s;
                Feeder fa(m, seed), fb(m, seed + 1000);
                fa.prompt(a.c, 30);
                fa.decodes(a.c, nullptr, 50, s);
                fb.prompt(b.c, 20);  // b holds other tokens: the load replaces them
                fb.decodes(b.c, nullptr, 7, s);
                const std::vector<uint8_t> st = save(a.c);
                ASSERT_EQ(kvp_state_load(b.c, st.data(), st.size()), KVP_OK) << s << ": " << kvp_last_error(b.c);
                ASSERT_EQ(kvp_state_load(fresh.c, st.data(), st.size()), KVP_OK) << s;
                expect_same(a.c, b.c, s + " after load");
                EXPECT_TRUE(save(fresh.c) == st) << s << ": a loaded cache saves the same bytes";
                Feeder f2(m, seed + 7);
                f2.decodes(a.c, b.c, 40, s + " continued");
                expect_same(a.c, b.c, s + " continued");
                // size: the blocks in use, not the arena
                kvp_stats sa;
                sa.struct_size = sizeof sa;
                ASSERT_EQ(kvp_get_stats(a.c, &sa), KVP_OK);
                EXPECT_LT(st.size(), sa.arena_bytes) << s;
                if (HasFatalFailure()) return;
                ++seed;
            }
        }
    }
}

TEST(State, SizeFollowsTheLiveBytes) {
    const kvp_model m = ref::model(4, 8, 4, 64);
    ref::Cache a(m, "policy=full capacity=4096");
    Feeder f(m, 3);
    size_t empty = kvp_state_size(a.c);
    f.gen(1000);
    for (uint32_t l = 0; l < m.n_layers; ++l)
        ASSERT_EQ(kvp_append(a.c, l, 1000, nullptr, f.k.data(), f.v.data()), KVP_OK);
    kvp_stats st;
    st.struct_size = sizeof st;
    ASSERT_EQ(kvp_get_stats(a.c, &st), KVP_OK);
    const size_t n = kvp_state_size(a.c);
    // 1000 of 4096 slots used: the state is the live bytes plus block metadata, a quarter of the arena
    EXPECT_GE(n, st.live_bytes);
    EXPECT_LT(double(n), 1.05 * double(st.live_bytes) + double(empty));
    EXPECT_LT(double(n), 0.35 * double(st.arena_bytes));
    printf("state %zu bytes (empty %zu), live %llu, arena %llu\n", n, empty, (unsigned long long)st.live_bytes,
           (unsigned long long)st.arena_bytes);
}

TEST(State, BadBuffersLeaveTheCacheUnchanged) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    const std::string spec = "policy=h2o budget=24 recent=4 capacity=32 max_draft=2";
    ref::Cache a(m, spec), b(m, spec);
    Feeder fa(m, 5), fb(m, 6);
    fa.prompt(a.c, 20);
    fa.decodes(a.c, nullptr, 10, "a");
    fb.prompt(b.c, 12);
    const std::vector<uint8_t> st = save(a.c), b0 = save(b.c);
    auto has = [](const kvp_cache *c, const char *what) { return strstr(kvp_last_error(c), what) != nullptr; };
    auto unchanged = [&](const char *what) { EXPECT_TRUE(save(b.c) == b0) << what; };
    // save: NULLs, small buffer, draft open
    size_t w = 0;
    std::vector<uint8_t> small(st.size() - 1, 0xee);
    EXPECT_EQ(kvp_state_save(a.c, small.data(), small.size(), &w), KVP_ERR_BUFFER);
    EXPECT_EQ(w, st.size());
    EXPECT_TRUE(has(a.c, "kvp_state_size")) << kvp_last_error(a.c);
    EXPECT_EQ(small[0], 0xee);
    EXPECT_EQ(kvp_state_save(a.c, nullptr, 10, &w), KVP_ERR_ARG);
    EXPECT_EQ(kvp_state_save(nullptr, small.data(), small.size(), &w), KVP_ERR_ARG);
    EXPECT_EQ(kvp_state_size(nullptr), 0u);
    ASSERT_EQ(kvp_draft_begin(a.c), KVP_OK);
    EXPECT_EQ(kvp_state_save(a.c, small.data(), st.size() + 10, &w), KVP_ERR_STATE);
    EXPECT_TRUE(has(a.c, "draft")) << kvp_last_error(a.c);
    ASSERT_EQ(kvp_draft_commit(a.c, 0), KVP_OK);
    // load: NULL, truncated, trailing bytes, corrupted anywhere, not a state
    EXPECT_EQ(kvp_state_load(b.c, nullptr, st.size()), KVP_ERR_ARG);
    EXPECT_EQ(kvp_state_load(nullptr, st.data(), st.size()), KVP_ERR_ARG);
    EXPECT_EQ(kvp_state_load(b.c, st.data(), st.size() - 1), KVP_ERR_ARG);
    EXPECT_TRUE(has(b.c, "truncated")) << kvp_last_error(b.c);
    EXPECT_EQ(kvp_state_load(b.c, st.data(), 20), KVP_ERR_ARG);
    std::vector<uint8_t> longer(st);
    longer.push_back(0);
    EXPECT_EQ(kvp_state_load(b.c, longer.data(), longer.size()), KVP_ERR_ARG);
    unchanged("truncated / longer");
    for (size_t at : {size_t(0), size_t(9), size_t(17), size_t(26), size_t(33), size_t(60), st.size() / 2, st.size() - 1}) {
        std::vector<uint8_t> bad(st);
        bad[at] ^= 0x10;
        const kvp_status s = kvp_state_load(b.c, bad.data(), bad.size());
        EXPECT_TRUE(s == KVP_ERR_ARG || s == KVP_ERR_UNSUPPORTED) << "flip at " << at << ": " << s;
        unchanged("corrupted");
    }
    std::vector<uint8_t> bad(st);
    bad[st.size() / 2] ^= 1;
    EXPECT_EQ(kvp_state_load(b.c, bad.data(), bad.size()), KVP_ERR_ARG);
    EXPECT_TRUE(has(b.c, "checksum")) << kvp_last_error(b.c);
    // another format version (checksum fixed up): refused as unreadable, naming the writer
    std::vector<uint8_t> v2(st);
    v2[8] = 2;
    EXPECT_EQ(kvp_state_load(b.c, v2.data(), v2.size()), KVP_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(b.c, "format 2")) << kvp_last_error(b.c);
    // a consistent checksum over inconsistent contents (a crafted state): the checks catch it
    std::vector<uint8_t> cr(st);
    const size_t body = 40 + 4 * ((sizeof(kvp_config) - 4) / 4);
    cr[body + 40 + 7] = 0x7f;  // layer 0's next position (after the five u64 counters): its high byte
    const uint64_t sum = kvp::state_checksum(cr.data() + 32, cr.size() - 32);
    for (int i = 0; i < 8; ++i) cr[24 + i] = uint8_t(sum >> (8 * i));
    EXPECT_EQ(kvp_state_load(b.c, cr.data(), cr.size()), KVP_ERR_ARG);
    EXPECT_TRUE(has(b.c, "inconsistent")) << kvp_last_error(b.c);
    unchanged("crafted");
    // other configuration, geometry, dtype
    struct Other {
        kvp_model m;
        std::string spec, key;
    };
    const Other others[] = {{m, "policy=h2o budget=20 recent=4 capacity=32 max_draft=2", "budget"},
                            {m, spec + " kv_dtype=q8", "kv_dtype"},
                            {m, "policy=snapkv budget=24 capacity=32 max_draft=2", "policy"},
                            {ref::model(3, 4, 2, 16), spec, "n_layers"},
                            {ref::model(2, 4, 2, 32), spec, "head_dim"}};
    for (const Other &o : others) {
        ref::Cache c(o.m, o.spec);
        ASSERT_TRUE(c.c) << o.spec;
        const std::vector<uint8_t> c0 = save(c.c);
        EXPECT_EQ(kvp_state_load(c.c, st.data(), st.size()), KVP_ERR_CONFIG) << o.spec;
        EXPECT_TRUE(has(c.c, o.key.c_str())) << kvp_last_error(c.c);
        EXPECT_TRUE(save(c.c) == c0) << o.spec;
    }
    {  // the values are named, not their stored words (issue 29): "f32 ... q8", "h2o ... snapkv"
        ref::Cache c(m, spec + " kv_dtype=q8");
        EXPECT_EQ(kvp_state_load(c.c, st.data(), st.size()), KVP_ERR_CONFIG);
        EXPECT_TRUE(has(c.c, "kv_dtype differs (the state was saved with f32, this cache has q8)")) << kvp_last_error(c.c);
        ref::Cache p(m, "policy=snapkv budget=24 capacity=32 max_draft=2");
        EXPECT_EQ(kvp_state_load(p.c, st.data(), st.size()), KVP_ERR_CONFIG);
        EXPECT_TRUE(has(p.c, "policy differs (the state was saved with h2o, this cache has snapkv)")) << kvp_last_error(p.c);
    }
    // load during a draft
    ASSERT_EQ(kvp_draft_begin(b.c), KVP_OK);
    EXPECT_EQ(kvp_state_load(b.c, st.data(), st.size()), KVP_ERR_STATE);
    ASSERT_EQ(kvp_draft_commit(b.c, 0), KVP_OK);
    unchanged("draft");
    // and the good one still loads
    EXPECT_EQ(kvp_state_load(b.c, st.data(), st.size()), KVP_OK);
    EXPECT_TRUE(save(b.c) == st);
}

// States are read by later libraries: a config with fewer fields (keys are appended) loads with the
// missing keys at their defaults; a cache that sets such a key otherwise refuses it, naming it.
TEST(State, OlderConfigLayoutsLoad) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    const std::string spec = "policy=h2o budget=24 recent=4 capacity=32";
    ref::Cache a(m, spec), b(m, spec), scaled(m, spec + " attn_scale=0.125");
    Feeder f(m, 9);
    f.prompt(a.c, 20);
    const std::vector<uint8_t> st = save(a.c);
    // drop the last config word (attn_scale), as a library without that key would have written
    const uint32_t w = uint32_t(st[32]) | uint32_t(st[33]) << 8;
    std::vector<uint8_t> old(st.begin(), st.begin() + 40 + 4 * (w - 1));
    old.insert(old.end(), st.begin() + 40 + 4 * w, st.end());
    old[32] = uint8_t(w - 1);
    const uint64_t total = old.size();
    for (int i = 0; i < 8; ++i) old[16 + i] = uint8_t(total >> (8 * i));
    const uint64_t sum = kvp::state_checksum(old.data() + 32, old.size() - 32);
    for (int i = 0; i < 8; ++i) old[24 + i] = uint8_t(sum >> (8 * i));
    ASSERT_EQ(kvp_state_load(b.c, old.data(), old.size()), KVP_OK) << kvp_last_error(b.c);
    expect_same(a.c, b.c, "older layout");
    EXPECT_EQ(kvp_state_load(scaled.c, old.data(), old.size()), KVP_ERR_CONFIG);
    EXPECT_NE(strstr(kvp_last_error(scaled.c), "attn_scale"), nullptr) << kvp_last_error(scaled.c);
    // more words than this library knows: a newer library's state
    std::vector<uint8_t> newer(st);
    newer[32] = uint8_t(w + 1);
    const uint64_t s2 = kvp::state_checksum(newer.data() + 32, newer.size() - 32);
    for (int i = 0; i < 8; ++i) newer[24 + i] = uint8_t(s2 >> (8 * i));
    EXPECT_EQ(kvp_state_load(b.c, newer.data(), newer.size()), KVP_ERR_UNSUPPORTED);
}

// Committed states written on x86-64: they load here and continue like the live sequence (the
// portability check of the format: CI's cross stage runs this on aarch64 and armhf). Where the
// kernels are x86-64's AVX2/AVX-512 ones (the files' writer), this platform's save of the same
// sequence is the same bytes and the continuation is bit for bit; with the scalar or SIMDe
// variants (aarch64, armhf, KVP_KERNEL=scalar|simde) some computed floats (rotated keys, scores,
// sparsity) differ in the last bits (measured), so there the kept positions and integer counters
// must be equal and the outputs within 1e-4.
struct Portable {
    const char *file, *spec;
};
const Portable kPortable[] = {
    {"h2o_f32_realign.kvps", "policy=h2o budget=24 recent=4 capacity=40 positions=realign"},
    {"streaming_q8.kvps", "policy=streaming sinks=4 window=24 compress_every=4 kv_dtype=q8 quant_group=8"},
    {"snapkv_fixed_q4.kvps", "policy=snapkv budget=24 obs_window=4 capacity=40 score=fixed kv_dtype=q4 quant_group=8"},
};

TEST(State, CommittedStatesArePortable) {
    const kvp_model m = ref::model(2, 4, 2, 16, KVP_ROPE_NEOX);
    const bool write = getenv("KVP_WRITE_STATE_FILES") != nullptr;
    for (const Portable &p : kPortable) {
        ref::Cache live(m, p.spec), loaded(m, p.spec);
        ASSERT_TRUE(live.c && loaded.c) << p.spec;
        Feeder f(m, 77);
        f.prompt(live.c, 30);
        f.decodes(live.c, nullptr, 40, p.file);
        const std::vector<uint8_t> mine = save(live.c);
        const std::string path = std::string(KVP_STATE_DATA) + "/" + p.file;
        if (write) {
            FILE *o = fopen(path.c_str(), "wb");
            ASSERT_TRUE(o) << path;
            fwrite(mine.data(), 1, mine.size(), o);
            fclose(o);
        }
        FILE *in = fopen(path.c_str(), "rb");
        ASSERT_TRUE(in) << path;
        std::vector<uint8_t> file;
        uint8_t buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) file.insert(file.end(), buf, buf + n);
        fclose(in);
        ASSERT_EQ(kvp_state_load(loaded.c, file.data(), file.size()), KVP_OK) << p.file << ": " << kvp_last_error(loaded.c);
        // The committed files come from x86-64's AVX2/AVX-512 kernels (the same bits); the scalar
        // and SIMDe variants (and so aarch64's NEON, armhf) round some float steps differently.
        const std::string kern = live.c->kern->name;
        const bool same_bits = kern == "avx2" || kern == "avx512";
        Feeder f2(m, 78);
        if (same_bits) {
            // the bodies (after the config words: a later library appends keys) are the same bytes
            auto body = [](const std::vector<uint8_t> &b) {
                const size_t w = size_t(b[32]) | size_t(b[33]) << 8;
                return std::vector<uint8_t>(b.begin() + long(40 + 4 * w), b.end());
            };
            const std::vector<uint8_t> bm = body(mine), bf = body(file);
            size_t first = 0;
            while (first < bm.size() && first < bf.size() && bm[first] == bf[first]) ++first;
            EXPECT_TRUE(bm == bf) << p.file << " (first difference at body byte " << first << " of " << bm.size()
                                  << "): this platform's save differs from the committed x86-64 bytes";
            expect_same(live.c, loaded.c, p.file);
            f2.decodes(live.c, loaded.c, 30, p.file);
        } else {
            expect_same_structure(live.c, loaded.c, p.file);
            f2.decodes(live.c, loaded.c, 30, p.file, 1e-4f);
            expect_same_structure(live.c, loaded.c, std::string(p.file) + " continued");
        }
    }
}

}  // namespace

namespace {

// The format's checksum written out plainly (src/state.h: eight 64-bit lanes over 64-byte stripes,
// lane = rotl((lane ^ word) * P1, 29); then length, lanes and tail mixed): the library's bulk paths
// (AVX-512 lanes where the CPU has them, pieces fed from wherever they are) must give its bits.
uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t plain_checksum(const uint8_t *p, size_t n) {
    const uint64_t P1 = 0x9e3779b185ebca87ull, P2 = 0xc2b2ae3d27d4eb4full, P3 = 0x165667b19e3779f9ull;
    uint64_t v[8] = {P1, P2, P3, P1 ^ P2, P2 ^ P3, P1 ^ P3, P1 + P2, P2 + P3};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int l = 0; l < 8; ++l) {
            uint64_t w = 0;
            for (int b = 0; b < 8; ++b) w |= uint64_t(p[i + 8 * l + b]) << (8 * b);
            v[l] = rotl64((v[l] ^ w) * P1, 29);
        }
    uint64_t h = uint64_t(n) * P3;
    for (int l = 0; l < 8; ++l) h = rotl64(h ^ (v[l] * P2), 27) * P1;
    for (; i < n; ++i) h = rotl64(h ^ (uint64_t(p[i]) * P3), 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    return h;
}

}  // namespace

TEST(State, ChecksumBulkPathsMatchThePlainDefinition) {
    std::vector<uint8_t> buf(70000 + 64);
    uint64_t x = 12345;
    for (uint8_t &b : buf) b = uint8_t((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    for (size_t off : {0, 1, 7, 33})
        for (size_t n : {0, 1, 63, 64, 65, 127, 128, 4095, 4096, 4160, 65536, 70000})
            ASSERT_EQ(kvp::state_checksum(buf.data() + off, n), plain_checksum(buf.data() + off, n)) << off << " " << n;
}

// Pieces of 4096 bytes and more (here 16-token blocks of 128-float rows: 8 KiB) are hashed from the
// cache and streamed into the buffer, and streamed back on load: the saved state loads, saves again
// to the same bytes, and a flipped byte inside such a piece is refused.
TEST(State, StreamedPiecesRoundTrip) {
    const kvp_model m = ref::model(2, 4, 2, 128);
    ref::Cache a(m, "policy=full capacity=256"), b(m, "policy=full capacity=256");
    ref::Inputs in(m, 200, 9, 1.0f);
    for (uint32_t l = 0; l < 2; ++l) ASSERT_EQ(kvp_append(a.c, l, 200, nullptr, in.k.data(), in.v.data()), KVP_OK);
    std::vector<uint8_t> s1(kvp_state_size(a.c)), s2(s1.size());
    ASSERT_GT(s1.size(), size_t(200) * 2 * 2 * 2 * 128 * 4);
    ASSERT_EQ(kvp_state_save(a.c, s1.data(), s1.size(), nullptr), KVP_OK);
    ASSERT_EQ(kvp_state_load(b.c, s1.data(), s1.size()), KVP_OK) << kvp_last_error(b.c);
    ASSERT_EQ(kvp_state_save(b.c, s2.data(), s2.size(), nullptr), KVP_OK);
    EXPECT_EQ(s1, s2);
    std::vector<float> oa(in.nq), ob(in.nq);
    ASSERT_EQ(kvp_decode(a.c, 1, in.qt(0), in.kt(0), in.vt(0), oa.data()), KVP_OK);
    ASSERT_EQ(kvp_decode(b.c, 1, in.qt(0), in.kt(0), in.vt(0), ob.data()), KVP_OK);
    EXPECT_EQ(0, memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)));
    s1[s1.size() / 2] ^= 0x10;
    ref::Cache c(m, "policy=full capacity=256");
    EXPECT_EQ(kvp_state_load(c.c, s1.data(), s1.size()), KVP_ERR_ARG);
    EXPECT_NE(strstr(kvp_last_error(c.c), "checksum"), nullptr) << kvp_last_error(c.c);
}

namespace {

// A cache in an arena whose bytes are `fill` before kvp_create (what a caller's reused arena
// holds: old caches, other data).
struct DirtyCache {
    kvp_cache *c = nullptr;
    void *arena = nullptr;
    DirtyCache(const kvp_model &m, const std::string &spec, int fill) {
        kvp_config cfg;
        char err[256];
        if (kvp_config_default(&cfg, &m) != KVP_OK || kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK)
            return;
        const size_t n = kvp_arena_size(&cfg);
        arena = aligned_alloc(64, (n + 63) / 64 * 64);
        memset(arena, fill, n);
        if (kvp_create(&cfg, arena, n, &c) != KVP_OK) c = nullptr;
    }
    ~DirtyCache() {
        if (c) kvp_destroy(c);
        free(arena);
    }
};

}  // namespace

// A saved state depends only on the calls made: two caches created over arenas holding other
// bytes, fed the same calls, save the same bytes, and so does one reset and fed them again (ASL's
// policy region and formatted stores once saved arena bytes no call had written).
TEST(State, BytesDependOnlyOnTheCalls) {
    const kvp_model m = ref::model(2, 4, 2, 32);
    uint64_t seed = 11;
    for (const char *spec : kSpecs) {
        for (const char *dt : kDtypes) {
            for (const char *pm : kPositions) {
                const std::string s = std::string(spec) + " quant_group=16 kv_dtype=" + dt + " positions=" + pm;
                DirtyCache a(m, s, 0x00), b(m, s, 0xA5);
                ASSERT_TRUE(a.c && b.c) << s;
                Feeder fa(m, seed), fb(m, seed), fr(m, seed + 1);
                fr.prompt(b.c, 24);  // b first holds other tokens, then is reset
                fr.decodes(b.c, nullptr, 9, s);
                ASSERT_EQ(kvp_reset(b.c), KVP_OK);
                fa.prompt(a.c, 30);
                fa.decodes(a.c, nullptr, 40, s);
                fb.prompt(b.c, 30);
                fb.decodes(b.c, nullptr, 40, s);
                const std::vector<uint8_t> sa = save(a.c), sb = save(b.c);
                ASSERT_EQ(sa.size(), sb.size()) << s;
                size_t first = 0;  // bytes 24..31 hold the checksum (state.cpp): compare it last
                while (first < sa.size() && (sa[first] == sb[first] || (first >= 24 && first < 32))) ++first;
                EXPECT_TRUE(sa == sb) << s << ": the checksums differ";
                EXPECT_EQ(first, sa.size()) << s << ": the saved states differ from byte " << first;
                if (HasFailure()) return;
                ++seed;
            }
        }
    }
}

// Issue 29: a state whose checksum was recomputed after an edit (anyone can do that) either loads
// into a cache on which every later call is safe, or is refused with KVP_ERR_ARG and the cache
// unchanged. For each policy x dtype a small state is saved; sampled words of its body (all of
// them when few) get a few edits each (+1, -1, 0, all ones, a NaN pattern, the top bit), the
// checksum is recomputed, and the result is loaded into a cache that holds other tokens. Loaded:
// lengths within capacity, positions ascending, live bytes within the arena, decodes, a draft, a
// prefill and a second save/load run with finite outputs (ASan/UBSan in CI find the rest).
namespace {

const char *const kEditSpecs[] = {
    "policy=full capacity=40",
    "policy=window window=12 capacity=16",
    "policy=streaming sinks=4 window=12 compress_every=4 capacity=21",
    "policy=streaming sinks=8 window=12 compress_every=4 capacity=25",
    "policy=h2o budget=12 recent=4 capacity=16",
    "policy=h2o budget=12 recent=4 capacity=16 total_capacity=28 score=fixed",
    "policy=snapkv budget=10 obs_window=4 capacity=16 recent=2 prefill_stage=24",
    "policy=lethe capacity=24 evict_threshold=8 sparse_ratio=1.2 obs_window=4",
    "policy=simlayerkv nonlazy=h2o budget=12 recent=4 capacity=16 sinks=2 window=6 lazy_last=4 lazy_threshold=0.2",
    "policy=asl budget=10 obs_window=4 capacity=16 recent=4 asl_min_layer=1 prefill_stage=24",
    "policy=think token_policy=h2o budget=12 recent=4 capacity=16 key_channel_ratio=0.4 value_channel_ratio=0.2",
};

void fix_checksum(std::vector<uint8_t> &b) {
    const uint64_t sum = kvp::state_checksum(b.data() + 32, b.size() - 32);
    for (int i = 0; i < 8; ++i) b[24 + i] = uint8_t(sum >> (8 * i));
}

// Invariants of a cache after a load: lengths, positions, stats.
void expect_sane(const kvp_cache *c, const std::string &where) {
    const kvp_model &m = c->cfg.model;
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        // a head may hold twice the capacity where heads lend (kvprune.h kvp_layer_len)
        const uint32_t cap = kvp_layer_capacity(c, l) * (c->plan.lend ? 2 : 1), len = kvp_layer_len(c, l);
        ASSERT_LE(len, cap) << where << " layer " << l;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            std::vector<int32_t> p(size_t(cap) + 1);
            uint32_t n = 0;
            ASSERT_EQ(kvp_layer_positions(c, l, h, p.data(), cap + 1, &n), KVP_OK) << where;
            ASSERT_LE(n, cap) << where;
            for (uint32_t i = 1; i < n; ++i) ASSERT_LT(p[i - 1], p[i]) << where << " layer " << l << " head " << h;
            if (n) {
                ASSERT_GE(p[0], 0) << where;
            }
        }
    }
    kvp_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    ASSERT_EQ(kvp_get_stats(c, &s), KVP_OK);
    ASSERT_LE(s.live_bytes, s.arena_bytes) << where;
    ASSERT_LE(s.live_bytes, s.peak_live_bytes) << where;
}

bool all_finite(const std::vector<float> &x) {
    for (float f : x)
        if (!(f - f == 0.0f)) return false;
    return true;
}

// Calls on a loaded cache: decodes, a draft, a prefill, a save and a reload of that save.
void exercise(kvp_cache *c, Feeder &f, const std::string &where) {
    const kvp_model &m = f.m;
    for (int s = 0; s < 2; ++s) {
        f.gen(1);
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            const kvp_status st = kvp_decode(c, l, f.q.data(), f.k.data(), f.v.data(), f.out.data());
            ASSERT_TRUE(st == KVP_OK || st == KVP_ERR_FULL || st == KVP_ERR_ARG) << where << ": " << kvp_last_error(c);
            if (st == KVP_OK) {
                ASSERT_TRUE(all_finite(f.out)) << where << " decode layer " << l;
            }
        }
        ASSERT_NO_FATAL_FAILURE(expect_sane(c, where + " after a decode"));
    }
    if (kvp_draft_begin(c) == KVP_OK) {
        f.gen(1);
        uint32_t ok = 1;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            const kvp_status st = kvp_decode(c, l, f.q.data(), f.k.data(), f.v.data(), f.out.data());
            if (st == KVP_OK) {
                ASSERT_TRUE(all_finite(f.out)) << where << " draft layer " << l;
            } else {
                ok = 0;
            }
        }
        ASSERT_EQ(kvp_draft_commit(c, ok), KVP_OK) << where << ": " << kvp_last_error(c);
        ASSERT_NO_FATAL_FAILURE(expect_sane(c, where + " after a draft"));
    }
    f.gen(3);
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        const kvp_status st = kvp_prefill(c, l, 3, nullptr, f.q.data(), f.k.data(), f.v.data(), f.out.data(), nullptr);
        if (st == KVP_OK) {
            ASSERT_TRUE(all_finite(f.out)) << where << " prefill layer " << l;
        }
    }
    ASSERT_NO_FATAL_FAILURE(expect_sane(c, where + " after a prefill"));
    const std::vector<uint8_t> again = save(c);
    ASSERT_EQ(kvp_state_load(c, again.data(), again.size()), KVP_OK) << where << ": " << kvp_last_error(c);
}

}  // namespace

// Every word of a state of cache `s` (after a prompt of `prompt` tokens and `decodes` decodes)
// past the header edited (+1, -1, then values): each load is refused with KVP_ERR_ARG and the
// cache unchanged, or loads a state the cache then runs on (expect_sane, exercise).
void edit_words(const kvp_model &m, const std::string &s, uint64_t seed, uint32_t phase, uint32_t prompt, uint32_t decodes,
                uint64_t *loaded, uint64_t *refused) {
    const size_t body = 40 + 4 * ((sizeof(kvp_config) - 4) / 4);
    const uint32_t edits[] = {1u, 0xffffffffu, 0u, 0xffffffffu, 0x7fc00000u, 0x80000000u};  // +1, -1, then values
    const size_t kWords = 120;  // words edited per state (all when it has fewer)
    ref::Cache a(m, s), b(m, s);
    ASSERT_TRUE(a.c && b.c) << s;
    Feeder fa(m, seed), fb(m, seed + 100);
    fa.prompt(a.c, prompt);
    fa.decodes(a.c, nullptr, decodes, s);
    fb.prompt(b.c, 9);
    if (::testing::Test::HasFailure()) return;
    const std::vector<uint8_t> st = save(a.c), b0 = save(b.c);
    const size_t words = (st.size() - body) / 4, stride = words > kWords ? (words + kWords - 1) / kWords : 1;
    for (size_t w = phase % stride; w < words; w += stride) {
        for (size_t e = 0; e < sizeof edits / sizeof edits[0]; ++e) {
            std::vector<uint8_t> ed(st);
            uint8_t *p = ed.data() + body + 4 * w;
            uint32_t x;
            memcpy(&x, p, 4);
            x = e < 2 ? x + edits[e] : edits[e];
            memcpy(p, &x, 4);
            if (ed == st) continue;
            fix_checksum(ed);
            const std::string where = s + " word " + std::to_string(w) + " edit " + std::to_string(e);
            const kvp_status r = kvp_state_load(b.c, ed.data(), ed.size());
            if (r != KVP_OK) {
                ++*refused;
                ASSERT_EQ(r, KVP_ERR_ARG) << where << ": " << kvp_last_error(b.c);
                ASSERT_TRUE(save(b.c) == b0) << where << ": a refused load changed the cache";
                continue;
            }
            ++*loaded;
            ASSERT_NO_FATAL_FAILURE(expect_sane(b.c, where));
            Feeder f(m, seed + 7);
            ASSERT_NO_FATAL_FAILURE(exercise(b.c, f, where));
            ASSERT_EQ(kvp_state_load(b.c, b0.data(), b0.size()), KVP_OK) << where;
        }
    }
}

TEST(State, EditedStatesLoadSafelyOrAreRefused) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    uint64_t seed = 11, loaded = 0, refused = 0;
    uint32_t phase = 0;
    for (const char *spec : kEditSpecs) {
        for (const char *dt : kDtypes) {
            const std::string s = std::string(spec) + " quant_group=8 max_draft=2 kv_dtype=" + dt +
                                  " positions=" + kPositions[phase % 2];
            ASSERT_NO_FATAL_FAILURE(edit_words(m, s, seed, phase, 14, 12, &loaded, &refused));
            if (HasFailure()) return;
            ++seed;
            ++phase;
        }
    }
    printf("edited states: %llu loaded, %llu refused\n", (unsigned long long)loaded, (unsigned long long)refused);
    EXPECT_GT(refused, 0u);
}

// Heads that lend (head_budget=ada, pool.h "Lending"): a state whose stores hold blocks of other
// KV heads' pools saves block ids over all pools; it loads into a fresh cache that then decodes
// to the same bits, and every edited word is refused or loads safely (as above).
TEST(State, LentBlocksRoundTripAndEdits) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    const std::string s = "policy=snapkv budget=10 obs_window=4 capacity=20 head_budget=ada ada_floor=0 max_draft=2";
    ref::Cache a(m, s), b(m, s);
    Feeder fa(m, 5);
    fa.prompt(a.c, 40);
    fa.decodes(a.c, nullptr, 14, s);
    bool lent = false;
    for (uint32_t l = 0; l < m.n_layers; ++l) lent = lent || kvp_layer_len(a.c, l) > kvp_layer_capacity(a.c, l);
    ASSERT_TRUE(lent) << "no head outgrew its layer's capacity: the state holds no lent block";
    const std::vector<uint8_t> st = save(a.c);
    ASSERT_EQ(kvp_state_load(b.c, st.data(), st.size()), KVP_OK) << kvp_last_error(b.c);
    EXPECT_TRUE(save(b.c) == st);
    fa.decodes(a.c, b.c, 10, s);  // the same bits on both
    uint64_t loaded = 0, refused = 0;
    ASSERT_NO_FATAL_FAILURE(edit_words(m, s, 5, 0, 40, 14, &loaded, &refused));
    printf("edited lent states: %llu loaded, %llu refused\n", (unsigned long long)loaded, (unsigned long long)refused);
    EXPECT_GT(refused, 0u);
}

// The load's bound for lending layers (state.cpp: a layer's KV heads hold at most their
// capacities together between calls, cache_room_check; the layer-wide rankings are sized for
// that, policies/policy.h layer_tokens_cap). No consistent state exceeds it, so the test lowers
// the loading cache's capacity (read by that check alone): one token short of the state's
// rows is refused with the cache unchanged; exactly the rows loads.
TEST(State, LendingLayerAboveItsCapacitiesIsRefused) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    const std::string s = "policy=snapkv budget=10 obs_window=4 capacity=20 head_budget=ada ada_floor=0";
    ref::Cache a(m, s), b(m, s);
    ASSERT_TRUE(a.c && b.c && a.c->plan.lend);
    Feeder fa(m, 5), fb(m, 6);
    fa.prompt(a.c, 40);
    fa.decodes(a.c, nullptr, 14, s);
    fb.prompt(b.c, 9);
    const std::vector<uint8_t> st = save(a.c), b0 = save(b.c);
    const uint32_t H = m.n_kv_heads;
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        const uint64_t rows = a.c->layers[l].rows;
        ASSERT_EQ(rows % H, 0u) << "layer " << l << ": pick a spec whose layers hold a multiple of the heads";
        const uint32_t cap = b.c->layers[l].geom.lp.cap, tight = uint32_t(rows / H);
        ASSERT_LE(tight, cap);
        b.c->layers[l].geom.lp.cap = tight - 1;
        const kvp_status r = kvp_state_load(b.c, st.data(), st.size());
        const std::string msg = kvp_last_error(b.c);
        b.c->layers[l].geom.lp.cap = cap;
        EXPECT_EQ(r, KVP_ERR_ARG) << "layer " << l;
        EXPECT_NE(msg.find("more tokens than their capacities together"), std::string::npos) << msg;
        EXPECT_TRUE(save(b.c) == b0) << "layer " << l << ": a refused load changed the cache";
        b.c->layers[l].geom.lp.cap = tight;
        EXPECT_EQ(kvp_state_load(b.c, st.data(), st.size()), KVP_OK) << "layer " << l << ": " << kvp_last_error(b.c);
        b.c->layers[l].geom.lp.cap = cap;
        ASSERT_EQ(kvp_state_load(b.c, b0.data(), b0.size()), KVP_OK);
    }
}

// The ownership bitmap in windows (what pools with more blocks than thread 0's scratch has bits
// need): with 64 bits per pass, every edited state gets the verdict of the one-pass check.
TEST(State, OwnershipWindowsGiveTheSameVerdicts) {
    const kvp_model m = ref::model(2, 4, 2, 16);
    const size_t body = 40 + 4 * ((sizeof(kvp_config) - 4) / 4);
    const char *const specs[] = {"policy=h2o budget=16 recent=4 capacity=24 block=1",
                                 "policy=streaming sinks=4 window=20 compress_every=4 capacity=28 block=1",
                                 "policy=lethe capacity=32 evict_threshold=8 sparse_ratio=1.2 obs_window=4 block=1"};
    uint64_t windowed = 0, differ = 0, refused = 0;
    for (const char *spec : specs) {
        ref::Cache a(m, spec), b(m, spec);
        ASSERT_TRUE(a.c && b.c) << spec;
        Feeder fa(m, 3), fb(m, 4);
        fa.prompt(a.c, 14);
        fa.decodes(a.c, nullptr, 12, spec);
        fb.prompt(b.c, 9);
        const std::vector<uint8_t> st = save(a.c), b0 = save(b.c);
        const uint64_t ids = uint64_t(m.n_kv_heads) * b.c->plan.nblocks;
        ASSERT_GT(ids, 64u) << spec << ": the test needs more than one window";
        const size_t words = (st.size() - body) / 4, stride = words / 150 + 1;
        for (size_t w = 0; w < words; w += stride) {
            for (uint32_t e : {1u, 0xffffffffu, 0u, 7u}) {
                std::vector<uint8_t> ed(st);
                uint32_t x;
                memcpy(&x, &ed[body + 4 * w], 4);
                x = e == 1u || e == 0xffffffffu ? x + e : e;
                memcpy(&ed[body + 4 * w], &x, 4);
                fix_checksum(ed);
                kvp::state_check_bits = 0;
                const kvp_status one = kvp_state_load(b.c, ed.data(), ed.size());
                const std::string msg1 = kvp_last_error(b.c);
                ASSERT_EQ(kvp_state_load(b.c, b0.data(), b0.size()), KVP_OK);
                kvp::state_check_bits = 64;
                const kvp_status win = kvp_state_load(b.c, ed.data(), ed.size());
                const std::string msg2 = kvp_last_error(b.c);
                kvp::state_check_bits = 0;
                ASSERT_EQ(kvp_state_load(b.c, b0.data(), b0.size()), KVP_OK);
                ++windowed;
                if (msg1 != msg2) ++differ;  // both refused, the windowed pass naming another finding first
                EXPECT_EQ(one, win) << spec << " word " << w << ": " << msg1 << " / " << msg2;
                if (one != KVP_OK) ++refused;
            }
        }
    }
    kvp::state_check_bits = 0;
    printf("windowed checks: %llu edited states, %llu refused, %llu with another message\n", (unsigned long long)windowed,
           (unsigned long long)refused, (unsigned long long)differ);
    EXPECT_GT(refused, 0u);
}

