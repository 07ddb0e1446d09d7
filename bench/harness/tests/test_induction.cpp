// The retrieval model's reproducibility: our generator (bench/harness/induction) builds a model from a
// byte corpus that answers hand-built passkey prompts exactly like the bundled models/induction6.bin,
// both with the right key, through the harness Session with full KV.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "eval.h"
#include "induction_model.h"
#include "passkey_check.h"
#include "session.h"

#ifndef KVP_HARNESS_MODELS_DIR
#error "KVP_HARNESS_MODELS_DIR must point at the repository's models/"
#endif
#ifndef KVP_INDUCTION_WORK_DIR
#error "KVP_INDUCTION_WORK_DIR must name a writable folder (the build dir)"
#endif

namespace {

using namespace kvh;

const std::string kDir = KVP_HARNESS_MODELS_DIR, kWork = KVP_INDUCTION_WORK_DIR;

std::vector<uint8_t> read_bytes(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

const std::string &generated_model_path() {
    static std::string path;
    if (path.empty()) {
        InductionParams p;
        const std::vector<uint8_t> corpus = read_bytes(kDir + "/enbytes-1m.eval.txt");
        std::string err, summary;
        // One file per test: ctest runs each test in its own process, in parallel, and two
        // processes writing one path race (a reader saw a half-written file).
        const std::string out =
            kWork + "/induction-generated-" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".bin";
        EXPECT_TRUE(write_induction_model(p, corpus, out, &err, &summary)) << err;
        std::printf("[ gen ] %s\n", summary.c_str());
        path = out;
    }
    return path;
}

// The generator writes a checkpoint of induction6.bin's geometry that the harness loads.
TEST(InductionGenerator, GeometryMatchesTheBundledModel) {
    Checkpoint gen, ref;
    std::string err;
    ASSERT_TRUE(load_checkpoint(generated_model_path(), &gen, &err)) << err;
    ASSERT_TRUE(load_checkpoint(kDir + "/induction6.bin", &ref, &err)) << err;
    EXPECT_EQ(gen.cfg.dim, 1152);
    EXPECT_EQ(gen.cfg.n_layers, 2);
    EXPECT_EQ(gen.cfg.n_heads, 6);
    EXPECT_EQ(gen.cfg.n_kv_heads, 1);
    EXPECT_EQ(gen.cfg.head_dim(), 192);
    EXPECT_EQ(gen.cfg.vocab, 256);
    EXPECT_FALSE(gen.cfg.shared_classifier);
    EXPECT_EQ(gen.cfg.seq_len, 1024);
    for (auto f : {&ModelConfig::dim, &ModelConfig::hidden_dim, &ModelConfig::n_layers, &ModelConfig::n_heads,
                   &ModelConfig::n_kv_heads, &ModelConfig::vocab, &ModelConfig::seq_len})
        EXPECT_EQ(gen.cfg.*f, ref.cfg.*f);
    EXPECT_EQ(gen.data.size(), ref.data.size());
    EXPECT_NE(gen.data, ref.data);  // our own random codes: not a copy of the bundled file
}

// The prompts are what they claim: exactly N bytes, the needle's bytes intact at round(depth * room),
// the text around it the haystack's, the question last; impossible requests fail with a message.
TEST(InductionGenerator, PasskeyPromptConstruction) {
    const std::vector<uint8_t> hay = read_bytes(kDir + "/enbytes-1m.eval.txt");
    const std::string q = kPasskeyQuestion;
    for (int n : {128, 256, 512, 1000}) {
        for (double depth : {0.0, 0.1, 0.5, 0.9, 1.0}) {
            PasskeyPrompt p;
            std::string err;
            ASSERT_TRUE(passkey_prompt(hay, 777, n, depth, 48917, &p, &err)) << err;
            ASSERT_EQ(p.tokens.size(), (size_t)n);
            const std::string s(p.tokens.begin(), p.tokens.end());
            const std::string needle = "The pass key is 48917. Remember it. 48917 is the pass key. ";
            const size_t room = (size_t)n - needle.size() - q.size();
            EXPECT_EQ(p.needle_at, (size_t)(depth * room + 0.5));
            EXPECT_EQ(s.substr(p.needle_at, needle.size()), needle);
            EXPECT_EQ(s.substr(0, p.needle_at), std::string(hay.begin() + 777, hay.begin() + 777 + (long)p.needle_at));
            EXPECT_EQ(s.substr(p.needle_at + needle.size(), room - p.needle_at),
                      std::string(hay.begin() + 777 + (long)p.needle_at, hay.begin() + 777 + (long)room));
            EXPECT_EQ(s.substr(s.size() - q.size()), q);
        }
    }
    PasskeyPrompt p;
    std::string err;
    EXPECT_FALSE(passkey_prompt(hay, 0, 64, 0.5, 48917, &p, &err));
    EXPECT_NE(err.find("cannot hold the needle"), std::string::npos) << err;
    EXPECT_FALSE(passkey_prompt(hay, 0, 256, 1.5, 48917, &p, &err));
    EXPECT_NE(err.find("depth must be in [0, 1]"), std::string::npos) << err;
    EXPECT_FALSE(passkey_prompt(hay, 0, 256, 0.5, 4891, &p, &err));
    EXPECT_NE(err.find("5 digits"), std::string::npos) << err;
    EXPECT_FALSE(passkey_prompt(hay, hay.size() - 100, 256, 0.5, 48917, &p, &err));
    EXPECT_NE(err.find("haystack is shorter"), std::string::npos) << err;
}

// Hand-built passkey prompts (lengths 256 and 512, depths 0.1..0.9, held-out text): the generated and
// the bundled model give the same greedy continuation, and it is the key. The prompt ends "The pass key
// is", so the model first writes the space the needle has there and then the 5 digits (what a prompt
// ending in "is " gets: greedy decoding of the space is that prompt).
TEST(InductionGenerator, SamePasskeyAnswersAsTheBundledModel) {
    const std::vector<uint8_t> hay = read_bytes(kDir + "/enbytes-1m.eval.txt");
    ASSERT_GT(hay.size(), 100000u);
    Checkpoint gen, ref;
    std::string err;
    ASSERT_TRUE(load_checkpoint(generated_model_path(), &gen, &err)) << err;
    ASSERT_TRUE(load_checkpoint(kDir + "/induction6.bin", &ref, &err)) << err;
    PasskeyComparison r;
#ifdef KVP_INDUCTION_QUICK
    // Sanitizer build: the forward runs ~60x slower (the full grid took 11 minutes), so 4 of the 18.
    ASSERT_TRUE(compare_passkey(gen, ref, hay, {256, 512}, &r, &err, {2, 8})) << err;
    ASSERT_EQ(r.cases, 4);
#else
    ASSERT_TRUE(compare_passkey(gen, ref, hay, {256, 512}, &r, &err)) << err;
    ASSERT_EQ(r.cases, 18);
#endif
    for (const std::string &l : r.lines) std::printf("[ passkey ] %s\n", l.c_str());
    std::printf("[ passkey ] %d prompts: generated %d right, induction6.bin %d right, %d identical answers\n",
                r.cases, r.right_a, r.right_b, r.same);
    EXPECT_EQ(r.same, r.cases);
    EXPECT_EQ(r.right_a, r.cases);
    EXPECT_EQ(r.right_b, r.cases);
}

// A prompt without the needle gets no key from either model (so the check above is not vacuous).
TEST(InductionGenerator, NoNeedleNoKey) {
    const std::vector<uint8_t> hay = read_bytes(kDir + "/enbytes-1m.eval.txt");
    Checkpoint gen;
    std::string err;
    ASSERT_TRUE(load_checkpoint(generated_model_path(), &gen, &err)) << err;
    Session s;
    ASSERT_TRUE(s.init(gen, "policy=full capacity=1024", &err)) << err;
    const std::string q = kPasskeyQuestion;
    std::vector<int32_t> t(hay.begin() + 20000, hay.begin() + 20000 + 256 - (long)q.size());
    for (unsigned char c : q) t.push_back(c);
    std::string a;
    ASSERT_TRUE(greedy_answer(s, t, 6, &a, &err)) << err;
    int digits = 0;
    for (char c : a) digits += c >= '0' && c <= '9';
    EXPECT_LT(digits, 5) << "answer '" << a << "'";
}

// kv_heads 2 (issue 32's evidence model, docs/harness.md "AdaKV per-head budgets"): two KV heads
// per layer, layer 2's second a local head. With full KV it answers the passkey as induction6.bin
// does; under snapkv's prompt selection at 25 % AdaKV's split gives the matching head what the
// local head does not need (uniform keeps 128 + 128), and the local head keeps its newest bytes.
TEST(InductionGenerator, TwoKvHeadsALocalHeadBesideTheMatchingHead) {
    const std::vector<uint8_t> hay = read_bytes(kDir + "/enbytes-1m.eval.txt");
    InductionParams p;
    p.kv_heads = 2;
    std::string err;
    const std::string path = kWork + "/induction-kv2.bin";
    ASSERT_TRUE(write_induction_model(p, hay, path, &err)) << err;
    Checkpoint kv2, ref;
    ASSERT_TRUE(load_checkpoint(path, &kv2, &err)) << err;
    ASSERT_TRUE(load_checkpoint(kDir + "/induction6.bin", &ref, &err)) << err;
    EXPECT_EQ(kv2.cfg.n_kv_heads, 2);
    EXPECT_EQ(kv2.cfg.n_heads, 6);
    PasskeyComparison r;
    ASSERT_TRUE(compare_passkey(kv2, ref, hay, {256}, &r, &err, {2, 5, 8})) << err;
    EXPECT_EQ(r.same, 3);
    EXPECT_EQ(r.right_a, 3);

    PasskeyPrompt pr;
    ASSERT_TRUE(passkey_prompt(hay, 30000, 512, 0.5, 14937, &pr, &err)) << err;
    auto kept = [&](const char *spec, uint32_t layer, uint32_t head) {
        Session s;
        std::string e, answer;
        EXPECT_TRUE(s.init(kv2, spec, &e)) << e;
        EXPECT_TRUE(greedy_answer(s, pr.tokens, 1, &answer, &e)) << e;
        std::vector<int32_t> pos(1024);
        uint32_t n = 0;
        EXPECT_EQ(kvp_layer_positions(s.cache(), layer, head, pos.data(), 1024, &n), KVP_OK);
        pos.resize(n);
        return pos;
    };
    const char *uni = "policy=snapkv budget=128", *ada = "policy=snapkv budget=128 head_budget=ada";
    for (uint32_t h = 0; h < 2; ++h) {
        EXPECT_EQ(kept(uni, 1, h).size(), 128u) << h;  // the budget (the answer's first byte is not appended)
        EXPECT_EQ(kept(ada, 0, h).size(), 128u) << h;  // layer 1: two positional heads, split evenly
    }
    const std::vector<int32_t> match = kept(ada, 1, 0), local = kept(ada, 1, 1);
    EXPECT_EQ(match.size() + local.size(), 256u);
    EXPECT_GT(match.size(), 192u) << "the matching head gets most of the layer's 256";
    EXPECT_LT(local.size(), 64u);
    ASSERT_GE(local.size(), 8u);
    for (int32_t t = 504; t < 512; ++t)  // the local head's newest bytes
        EXPECT_TRUE(std::binary_search(local.begin(), local.end(), t)) << t;
}

// Same parameters and corpus, same bytes; another seed, other bytes; bad parameters fail clearly.
TEST(InductionGenerator, DeterministicAndChecksItsInput) {
    std::vector<uint8_t> corpus = read_bytes(kDir + "/enbytes-1m.eval.txt");
    corpus.resize(5000);
    InductionParams p;
    p.context = 64;  // small files: only the legacy tables depend on the context
    std::string err;
    const std::string a = kWork + "/induction-det-a.bin", b = kWork + "/induction-det-b.bin",
                      c = kWork + "/induction-det-c.bin";
    ASSERT_TRUE(write_induction_model(p, corpus, a, &err)) << err;
    ASSERT_TRUE(write_induction_model(p, corpus, b, &err)) << err;
    p.seed = 8;
    ASSERT_TRUE(write_induction_model(p, corpus, c, &err)) << err;
    EXPECT_EQ(read_bytes(a), read_bytes(b));
    EXPECT_NE(read_bytes(a), read_bytes(c));

    std::remove((kWork + "/never.bin").c_str());
    InductionParams q;
    q.order = 7;  // one positional head per offset: 7 > 6 heads
    EXPECT_FALSE(write_induction_model(q, corpus, kWork + "/never.bin", &err));
    EXPECT_NE(err.find("order must be in 1..heads"), std::string::npos) << err;
    InductionParams k3;
    k3.kv_heads = 3;
    EXPECT_FALSE(write_induction_model(k3, corpus, kWork + "/never.bin", &err));
    EXPECT_NE(err.find("kv_heads must be 1 or 2"), std::string::npos) << err;
    InductionParams odd;
    odd.kv_heads = 2;
    odd.heads = 5;
    odd.order = 5;
    odd.head_dim = 230;
    EXPECT_FALSE(write_induction_model(odd, corpus, kWork + "/never.bin", &err));
    EXPECT_NE(err.find("even number of heads"), std::string::npos) << err;
    EXPECT_FALSE(write_induction_model(InductionParams(), std::vector<uint8_t>(1, 'a'), kWork + "/never.bin", &err));
    EXPECT_NE(err.find("at least 2 bytes"), std::string::npos) << err;
    EXPECT_FALSE(write_induction_model(InductionParams(), corpus, kWork + "/no-such-dir/x.bin", &err));
    EXPECT_NE(err.find("cannot write"), std::string::npos) << err;
    std::ifstream never(kWork + "/never.bin");
    EXPECT_FALSE(never.good()) << "a failed generation must not leave a file";
}

}  // namespace
