// The retrieval model's reproducibility: our generator (bench/harness/induction) builds a model from a
// byte corpus that answers hand-built passkey prompts exactly like the bundled models/induction6.bin,
// both with the right key, through the harness Session with full KV.
#include <gtest/gtest.h>

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
    EXPECT_FALSE(write_induction_model(InductionParams(), std::vector<uint8_t>(1, 'a'), kWork + "/never.bin", &err));
    EXPECT_NE(err.find("at least 2 bytes"), std::string::npos) << err;
    EXPECT_FALSE(write_induction_model(InductionParams(), corpus, kWork + "/no-such-dir/x.bin", &err));
    EXPECT_NE(err.find("cannot write"), std::string::npos) << err;
    std::ifstream never(kWork + "/never.bin");
    EXPECT_FALSE(never.good()) << "a failed generation must not leave a file";
}

}  // namespace
