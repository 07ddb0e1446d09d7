// The fuzz targets (targets.h) as deterministic tests under any compiler: seeded generated
// inputs, then every file of the committed corpus (tests/fuzz/corpus/<target>/, the seeds the CI
// fuzz stage starts from and the inputs of defects it found). A violated invariant aborts with
// its message, which fails the test.
#define _FILE_OFFSET_BITS 64  // readdir on 32-bit targets: 64-bit inode numbers (else EOVERFLOW)
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "targets.h"

namespace {

uint64_t splitmix(uint64_t &s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

std::vector<std::vector<uint8_t>> corpus(const char *target) {
    std::vector<std::vector<uint8_t>> out;
    const std::string dir = std::string(KVPFUZZ_CORPUS) + "/" + target;
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    std::vector<std::string> names;
    while (dirent *e = readdir(d))
        if (e->d_name[0] != '.') names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string &n : names) {
        FILE *f = fopen((dir + "/" + n).c_str(), "rb");
        if (!f) continue;
        std::vector<uint8_t> b;
        int ch;
        while ((ch = fgetc(f)) != EOF) b.push_back(uint8_t(ch));
        fclose(f);
        out.push_back(b);
    }
    return out;
}

// Sequences per run: KVPFUZZ_SEQUENCES overrides (the soak-like long run of the figures script).
int sequences(int dflt) {
    const char *e = getenv("KVPFUZZ_SEQUENCES");
    return e && *e ? atoi(e) : dflt;
}

TEST(FuzzCalls, SeededSequences) {
    kvpfuzz::CallStats st;
    uint64_t s = 0x6b7670727a65ull;
    const int n = sequences(600);
    for (int i = 0; i < n; ++i) {
        std::vector<uint8_t> b(64 + splitmix(s) % 1500);
        for (uint8_t &x : b) x = uint8_t(splitmix(s));
        kvpfuzz::calls_target(b.data(), b.size(), &st);
    }
    printf("sequences %llu (configs rejected %llu), calls %llu: %llu ok, %llu failed, %llu with a bad input\n",
           (unsigned long long)st.sequences, (unsigned long long)st.configs_rejected, (unsigned long long)st.calls,
           (unsigned long long)st.calls_ok, (unsigned long long)st.calls_failed, (unsigned long long)st.bad_inputs);
    for (uint32_t i = 0; i < kvpfuzz::calls_policy_count(); ++i)
        if (st.policy_runs[i]) printf("  policy %s: %llu sequences\n", kvpfuzz::calls_policy_name(i), (unsigned long long)st.policy_runs[i]);
    printf("ASL selections returned (equal to the twin's): %llu\n", (unsigned long long)st.selections);
    printf("drafts committed (equal to the twin's prefill of the accepted tokens): %llu, %llu with accepted > 0\n",
           (unsigned long long)st.drafts, (unsigned long long)st.drafts_accepted);
    printf("f16 calls with outputs (kvp_*_ex; equal to the twin's f32 outputs rounded): %llu\n",
           (unsigned long long)st.half_calls);
    EXPECT_GT(st.sequences, uint64_t(n / 4));
    EXPECT_GT(st.half_calls, 0u);
    EXPECT_GT(st.selections, 0u);
    EXPECT_GT(st.drafts_accepted, 0u);
    EXPECT_GT(st.calls_failed, 0u);
    EXPECT_GT(st.calls_ok, st.calls_failed);
    for (const char *p : {"full", "window", "streaming", "h2o", "snapkv", "pyramidkv", "lethe", "think", "simlayerkv",
                          "asl"}) {  // every implemented policy is drawn
        bool drawn = false;
        for (uint32_t i = 0; i < kvpfuzz::calls_policy_count(); ++i)
            if (std::string(kvpfuzz::calls_policy_name(i)) == p) drawn = st.policy_runs[i] > 0;
        EXPECT_TRUE(drawn) << p;
    }
}

TEST(FuzzCalls, Corpus) {
    const auto inputs = corpus("calls");
    for (const auto &b : inputs) kvpfuzz::calls_target(b.data(), b.size());
    printf("%zu corpus inputs\n", inputs.size());
}

// The state target's seeds (tests/fuzz/corpus/state/<policy>-<dtype>.kvps): one small state per
// policy row and dtype (2 layers, 2 KV heads, head_dim 8, blocks of 4, after a prompt and
// decodes that evicted). Rewritten by KVPFUZZ_WRITE_SEEDS=<dir> ./test_fuzz_replay
// --gtest_filter=FuzzState.Seeds; every run checks them against the target.
struct SeedSpec {
    const char *name, *spec;
};
const SeedSpec kStateSeeds[] = {
    {"full", "policy=full capacity=16"},
    {"window", "policy=window window=8 capacity=10"},
    {"streaming", "policy=streaming sinks=2 window=8 compress_every=2 capacity=13"},
    {"streaming-sinks", "policy=streaming sinks=4 window=6 compress_every=2 capacity=13"},
    {"h2o", "policy=h2o budget=8 recent=2 capacity=10"},
    {"h2o-fixed", "policy=h2o budget=8 recent=2 capacity=10 total_capacity=18 score=fixed"},
    {"snapkv", "policy=snapkv budget=6 obs_window=2 capacity=10 recent=2 prefill_stage=16"},
    {"pyramidkv", "policy=pyramidkv budget=6 obs_window=2 beta=5 capacity=10 prefill_stage=16"},
    {"lethe", "policy=lethe capacity=12 evict_threshold=4 sparse_ratio=1.2 obs_window=2"},
    {"simlayerkv", "policy=simlayerkv nonlazy=h2o budget=8 recent=2 capacity=10 sinks=2 window=4 lazy_last=2 lazy_threshold=0.2"},
    {"asl", "policy=asl budget=6 obs_window=2 capacity=10 recent=2 asl_min_layer=1 prefill_stage=16"},
    {"think", "policy=think token_policy=h2o budget=8 recent=2 capacity=10 key_channel_ratio=0.4 value_channel_ratio=0.2"},
};

std::vector<uint8_t> seed_state(const std::string &spec, uint64_t seed) {
    kvp_model m = {2, 2, 2, 8, KVP_ROPE_NEOX, 0, 10000.0f};
    kvp_config cfg;
    char err[256];
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    EXPECT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << spec << ": " << err;
    const size_t n = kvp_arena_size(&cfg);
    std::vector<uint8_t> arena(n + 64), out;
    void *a = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
    kvp_cache *c = nullptr;
    EXPECT_EQ(kvp_create(&cfg, a, n, &c), KVP_OK) << spec;
    if (!c) return out;
    std::vector<float> q(8 * 2 * 8), k(q.size()), v(q.size()), o(q.size());
    int32_t idx[16];
    kvp_selection sel;
    sel.struct_size = sizeof sel;
    sel.capacity = 16;
    sel.indices = idx;
    uint64_t s = seed;
    auto fill = [&] {
        for (std::vector<float> *x : {&q, &k, &v})
            for (float &f : *x) f = float(int(splitmix(s) % 17) - 8) * 0.25f;
    };
    fill();
    for (uint32_t l = 0; l < 2; ++l)
        EXPECT_EQ(kvp_prefill(c, l, 8, nullptr, q.data(), k.data(), v.data(), o.data(), &sel), KVP_OK)
            << spec << ": " << kvp_last_error(c);
    for (int t = 0; t < 6; ++t) {
        fill();
        for (uint32_t l = 0; l < 2; ++l)
            EXPECT_EQ(kvp_decode(c, l, q.data(), k.data(), v.data(), o.data()), KVP_OK) << spec << ": " << kvp_last_error(c);
    }
    out.resize(kvp_state_size(c));
    size_t w = 0;
    EXPECT_EQ(kvp_state_save(c, out.data(), out.size(), &w), KVP_OK);
    kvp_destroy(c);
    return out;
}

TEST(FuzzState, Seeds) {
    const char *dir = getenv("KVPFUZZ_WRITE_SEEDS");
    const char *const dtypes[] = {"f32", "f16", "q8", "q4"};
    uint64_t seed = 1;
    size_t most = 0;
    for (const SeedSpec &sp : kStateSeeds) {
        for (const char *dt : dtypes) {
            const std::string spec = std::string(sp.spec) + " quant_group=4 max_draft=2 kv_dtype=" + dt +
                                     (seed % 2 ? " positions=realign" : " positions=original");
            const std::vector<uint8_t> st = seed_state(spec, seed++);
            ASSERT_FALSE(st.empty()) << spec;
            if (st.size() > most) most = st.size();
            kvpfuzz::state_target(st.data(), st.size());
            if (dir && *dir) {
                const std::string path = std::string(dir) + "/" + sp.name + "-" + dt + ".kvps";
                FILE *f = fopen(path.c_str(), "wb");
                ASSERT_TRUE(f) << path;
                ASSERT_EQ(fwrite(st.data(), 1, st.size(), f), st.size());
                fclose(f);
            }
        }
    }
    printf("largest seed state: %zu bytes\n", most);
}

// The committed corpus (seeds and regression inputs), and word edits of each: a value +-1, 0, all
// ones, a NaN pattern or a random word at a random body word, the checksum fixed by the target.
TEST(FuzzState, CorpusAndMutations) {
    const auto inputs = corpus("state");
    uint64_t s = 13;
    const int per = sequences(24);
    for (const auto &b : inputs) {
        kvpfuzz::state_target(b.data(), b.size());
        for (int i = 0; i < per && b.size() > 64; ++i) {
            std::vector<uint8_t> m = b;
            const size_t at = 40 + 4 * size_t(splitmix(s) % ((m.size() - 40) / 4));
            uint32_t x;
            memcpy(&x, &m[at], 4);
            static const uint32_t vals[] = {0u, 0xffffffffu, 0x7fc00000u, 0x7f800000u, 0x80000000u};
            const int kind = int(splitmix(s) % 4);
            x = kind == 0 ? x + 1 : kind == 1 ? x - 1 : kind == 2 ? vals[splitmix(s) % 5] : uint32_t(splitmix(s));
            memcpy(&m[at], &x, 4);
            kvpfuzz::state_target(m.data(), m.size());
        }
    }
    EXPECT_GT(inputs.size(), 0u);
}

// Specs assembled from the key table's names with values of every kind (in and out of range,
// malformed), and random bytes.
TEST(FuzzConfig, SeededSpecs) {
    uint64_t s = 42;
    std::vector<std::string> names;
    for (uint32_t i = 0; i < kvp_config_key_count(); ++i) {
        kvp_key_info ki;
        ki.struct_size = sizeof ki;
        ASSERT_EQ(kvp_config_key(i, &ki), KVP_OK);
        names.push_back(ki.name);
    }
    static const char *values[] = {"0", "1", "2", "3", "7", "16", "64", "1020", "4294967295", "4294967296", "-1",
                                   "0.5", "1e-7", "1e40", "nan", "inf", "", "full", "window", "streaming", "h2o",
                                   "snapkv", "realign", "original", "avg", "max", "f32", "q8", "l2", "1.5", "+3", "08"};
    const int n = sequences(20000);
    for (int i = 0; i < n; ++i) {
        std::string spec;
        const int keys = int(splitmix(s) % 7);
        for (int j = 0; j < keys; ++j) {
            spec += names[splitmix(s) % names.size()] + "=" + values[splitmix(s) % (sizeof values / sizeof *values)];
            spec += splitmix(s) % 9 ? " " : "\t";
        }
        if (splitmix(s) % 10 == 0) spec += char(splitmix(s) % 256);
        std::vector<uint8_t> b(8);
        for (uint8_t &x : b) x = uint8_t(splitmix(s));
        b.insert(b.end(), spec.begin(), spec.end());
        kvpfuzz::config_target(b.data(), b.size());
    }
    for (const auto &b : corpus("config")) kvpfuzz::config_target(b.data(), b.size());
}

#if KVPFUZZ_HARNESS
TEST(FuzzHarness, CheckpointCorpusAndMutations) {
    const auto inputs = corpus("checkpoint");
    uint64_t s = 7;
    for (const auto &b : inputs) {
        kvpfuzz::checkpoint_target(b.data(), b.size());
        for (int i = 0; i < 40; ++i) {  // a few mutations of each seed
            std::vector<uint8_t> m = b;
            if (m.empty()) break;
            const int kind = int(splitmix(s) % 3);
            if (kind == 0) m[splitmix(s) % m.size()] ^= uint8_t(1u << (splitmix(s) % 8));
            else if (kind == 1) m.resize(splitmix(s) % (m.size() + 1));
            else m.insert(m.end(), size_t(splitmix(s) % 64), uint8_t(splitmix(s)));
            kvpfuzz::checkpoint_target(m.data(), m.size());
        }
    }
    EXPECT_GT(inputs.size(), 0u);
}

TEST(FuzzHarness, ResultsCorpusAndMutations) {
    const auto inputs = corpus("results");
    uint64_t s = 9;
    for (const auto &b : inputs) {
        kvpfuzz::results_target(b.data(), b.size());
        for (int i = 0; i < 40; ++i) {
            std::vector<uint8_t> m = b;
            if (m.empty()) break;
            const size_t at = splitmix(s) % m.size();
            static const char *bits[] = {"1e309", "-0", "null", "\"", "\\u0000", "{", "]", "9007199254740993", "1e-400", ","};
            const std::string ins = bits[splitmix(s) % 10];
            if (splitmix(s) % 2) m.erase(m.begin() + at, m.begin() + std::min(m.size(), at + 1 + size_t(splitmix(s) % 8)));
            m.insert(m.begin() + std::min(at, m.size()), ins.begin(), ins.end());
            kvpfuzz::results_target(m.data(), m.size());
        }
    }
    EXPECT_GT(inputs.size(), 0u);
}

TEST(FuzzHarness, GgufCorpusAndMutations) {
    const auto inputs = corpus("gguf");
    uint64_t s = 11;
    for (const auto &b : inputs) {
        kvpfuzz::gguf_target(b.data(), b.size());
        for (int i = 0; i < 40; ++i) {  // bit flips, cuts, 64-bit fields set to large values
            std::vector<uint8_t> m = b;
            if (m.empty()) break;
            const int kind = int(splitmix(s) % 3);
            if (kind == 0) {
                m[splitmix(s) % m.size()] ^= uint8_t(1u << (splitmix(s) % 8));
            } else if (kind == 1) {
                m.resize(splitmix(s) % (m.size() + 1));
            } else {
                const size_t at = splitmix(s) % m.size();
                const uint64_t v = splitmix(s) >> (splitmix(s) % 64);
                for (size_t k = 0; k < 8 && at + k < m.size(); ++k) m[at + k] = uint8_t(v >> (8 * k));
            }
            kvpfuzz::gguf_target(m.data(), m.size());
        }
    }
    EXPECT_GT(inputs.size(), 0u);
}
#endif

}  // namespace
