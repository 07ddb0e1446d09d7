// The fuzz targets (targets.h) as deterministic tests under any compiler: seeded generated
// inputs, then every file of the committed corpus (tests/fuzz/corpus/<target>/, the seeds the CI
// fuzz stage starts from and the inputs of defects it found). A violated invariant aborts with
// its message, which fails the test.
#define _FILE_OFFSET_BITS 64  // readdir on 32-bit targets: 64-bit inode numbers (else EOVERFLOW)
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

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
