// The harness tokenizers (issue 29): the heap merge loops against straightforward quadratic
// references (random texts and runs of one character up to a few thousand), 1 MiB of one
// character (a test that took hours before: the merge loops were quadratic in a word's length),
// llama.cpp's Unicode classes in the pre-tokenizers, the pre-tokenizer names, parse_special, the
// BOS defaults and vocabulary-only GGUF files. llama.cpp's own test vectors run in .ci/vocab.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf.h"
#include "gguf_writer.h"
#include "llama2c_vocab.h"
#include "tokenizer.h"

using namespace kvh;

namespace {

using Ids = std::vector<int32_t>;

size_t ulen(char c) {
    static const size_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[(unsigned char)c >> 4];
}

std::vector<std::string> chars(const std::string &s) {
    std::vector<std::string> v;
    for (size_t i = 0; i < s.size();) {
        const size_t n = std::min(ulen(s[i]), s.size() - i);
        v.push_back(s.substr(i, n));
        i += n;
    }
    return v;
}

// ---- references: the textbook loops (best pair over the whole word, merge, repeat)

struct SpmRef {
    std::map<std::string, int32_t> id;
    std::vector<float> score;
    Ids encode(const std::string &text, bool prefix) const {
        std::string s = prefix ? "\xE2\x96\x81" : "";
        for (char c : text) s += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
        std::vector<std::string> sym = chars(s);
        for (;;) {
            int best = -1;
            float bs = 0;
            for (size_t i = 0; i + 1 < sym.size(); i++) {
                auto it = id.find(sym[i] + sym[i + 1]);
                if (it == id.end()) continue;
                const float sc = score[(size_t)it->second];
                if (best < 0 || sc > bs) {
                    best = (int)i;
                    bs = sc;
                }
            }
            if (best < 0) break;
            sym[(size_t)best] += sym[(size_t)best + 1];
            sym.erase(sym.begin() + best + 1);
        }
        Ids out;
        for (const std::string &p : sym) {
            auto it = id.find(p);
            if (it != id.end()) {
                out.push_back(it->second);
                continue;
            }
            for (unsigned char ch : p) {
                char b[8];
                std::snprintf(b, sizeof b, "<0x%02X>", ch);
                auto jt = id.find(b);
                out.push_back(jt == id.end() ? 0 : jt->second);
            }
        }
        return out;
    }
};

std::string byte_char(unsigned b) {
    unsigned n = 0, cp = 0;
    for (unsigned x = 0; x <= b; x++) {
        const bool keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
        cp = keep ? x : 256 + n++;
    }
    std::string s;
    if (cp < 0x80) s.push_back((char)cp);
    else {
        s.push_back((char)(0xC0 | (cp >> 6)));
        s.push_back((char)(0x80 | (cp & 63)));
    }
    return s;
}

struct BpeRef {
    std::map<std::string, int32_t> id;
    std::map<std::string, int32_t> rank;  // "a b"
    bool ignore_merges = false;
    void word(const std::string &raw, Ids *out) const {
        std::string w;
        for (unsigned char ch : raw) w += byte_char(ch);
        if (ignore_merges && id.count(w)) {
            out->push_back(id.at(w));
            return;
        }
        std::vector<std::string> sym = chars(w);
        for (;;) {
            int best = -1, br = 0;
            for (size_t i = 0; i + 1 < sym.size(); i++) {
                auto it = rank.find(sym[i] + " " + sym[i + 1]);
                if (it != rank.end() && (best < 0 || it->second < br)) {
                    best = (int)i;
                    br = it->second;
                }
            }
            if (best < 0) break;
            sym[(size_t)best] += sym[(size_t)best + 1];
            sym.erase(sym.begin() + best + 1);
        }
        for (const std::string &s : sym) {
            auto it = id.find(s);
            if (it != id.end()) out->push_back(it->second);
            else
                for (char ch : s)
                    if (id.count(std::string(1, ch))) out->push_back(id.at(std::string(1, ch)));
        }
    }
};

// ---- vocabularies

// SentencePiece: unknown, BOS, EOS, the 256 byte tokens, then pieces with scores that tie often.
struct Spm {
    std::shared_ptr<const Tokenizer> tok;
    SpmRef ref;
};
Spm make_spm(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types) {
    Spm s;
    std::string err;
    EXPECT_TRUE(Tokenizer::build(Tokenizer::kSpm, "", pieces, scores, types, {}, &s.tok, &err)) << err;
    for (size_t i = 0; i < pieces.size(); i++) s.ref.id[pieces[i]] = (int32_t)i;
    s.ref.score = scores;
    return s;
}
Spm small_spm() {
    std::vector<std::string> p = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> ty = {2, 3, 3};
    for (int b = 0; b < 256; b++) {
        char n[8];
        std::snprintf(n, sizeof n, "<0x%02X>", b);
        p.push_back(n);
        ty.push_back(6);
    }
    std::vector<float> sc(p.size(), 0.0f);
    const std::string u = "\xE2\x96\x81";
    const std::vector<std::pair<std::string, float>> extra = {
        {u, -1}, {"a", -1}, {"b", -2}, {"-", -2}, {"\n", -3}, {u + u, -2}, {"aa", -2}, {"aaa", -2}, {"aaaa", -1},
        {"ab", -2}, {"ba", -2}, {"aba", -3}, {u + "a", -1}, {u + "b", -2}, {u + u + u + u, -2}, {"--", -2}, {"----", -3},
        {"\n\n", -3}, {u + "ab", -4}, {"bb", -2}, {"a-", -5}};
    for (auto &e : extra) {
        p.push_back(e.first);
        sc.push_back(e.second);
        ty.push_back(1);
    }
    return make_spm(p, sc, ty);
}

struct Bpe {
    std::shared_ptr<const Tokenizer> tok;
    BpeRef ref;
};
Bpe make_bpe(const std::string &pre, const std::vector<std::string> &merges, std::vector<std::string> extra_pieces = {},
             std::vector<int32_t> extra_types = {}) {
    std::vector<std::string> p;
    for (unsigned b = 0; b < 256; b++) p.push_back(byte_char(b));
    for (const std::string &m : merges) {
        const size_t sp = m.find(' ');
        p.push_back(m.substr(0, sp) + m.substr(sp + 1));
    }
    std::vector<int32_t> ty(p.size(), 1);
    for (size_t i = 0; i < extra_pieces.size(); i++) {
        p.push_back(extra_pieces[i]);
        ty.push_back(i < extra_types.size() ? extra_types[i] : 1);
    }
    Bpe b;
    std::string err;
    EXPECT_TRUE(Tokenizer::build(Tokenizer::kBpe, pre, p, {}, ty, merges, &b.tok, &err)) << err;
    for (size_t i = 0; i < p.size(); i++) b.ref.id[p[i]] = (int32_t)i;
    for (size_t r = 0; r < merges.size(); r++) b.ref.rank.emplace(merges[r], (int32_t)r);
    b.ref.ignore_merges = b.tok && b.tok->ignore_merges;
    return b;
}
const std::string G = "\xC4\xA0", C = "\xC4\x8A";  // GPT-2's characters for space and newline
const std::vector<std::string> kMerges = {"a a", "aa aa", "aa a", "b a", "a b", "ab a", "ba b", "aaaa aaaa", G + " " + G,
                                          G + G + " " + G + G, G + " a", G + "a a", "- -", "-- --", "---- ----",
                                          C + " " + C, C + C + " " + C + C, "b b", "bb a", "a bb"};

Ids bpe_ref_encode(const Bpe &b, const std::string &text) {
    Ids out;
    for (const std::string &w : b.tok->pre_split(text)) b.ref.word(w, &out);
    return out;
}

std::string random_text(std::mt19937 &rng, const std::vector<std::string> &alphabet, size_t n) {
    std::string s, last;
    for (size_t i = 0; i < n; i++) {
        if (last.empty() || rng() % 2) last = alphabet[rng() % alphabet.size()];  // runs: repeat half of the time
        s += last;
    }
    return s;
}

// The real SentencePiece vocabulary (../shared/models), when present.
bool llama2_vocab(SpmVocab *v) {
    return read_llama2c_vocab(std::string(KVP_SHARED_MODELS_DIR) + "/tokenizer-llama2.bin", v);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---------------------------------------------------------------- merge loops vs references

TEST(Tokenizer, SentencePieceEqualsTheQuadraticReference) {
    Spm s = small_spm();
    std::mt19937 rng(29);
    const std::vector<std::string> alpha = {"a", "b", " ", "-", "\n", "\xC3\xA9"};
    for (int t = 0; t < 300; t++) {
        const std::string text = random_text(rng, alpha, 1 + rng() % 60);
        ASSERT_EQ(s.tok->encode(text, false, true), s.ref.encode(text, true)) << "text '" << text << "'";
        ASSERT_EQ(s.tok->encode(text, false, false), s.ref.encode(text, false)) << "text '" << text << "'";
    }
    for (const char *ch : {"a", " ", "-", "\n", "b", "\xC3\xA9"})
        for (size_t n : {1, 2, 3, 5, 8, 13, 64, 255, 1001}) {
            std::string text;
            for (size_t i = 0; i < n; i++) text += ch;
            ASSERT_EQ(s.tok->encode(text, false, true), s.ref.encode(text, true)) << n << " x '" << ch << "'";
        }
    for (const char *ch : {"a", " "}) {
        const std::string text(3000, ch[0]);
        ASSERT_EQ(s.tok->encode(text, false, true), s.ref.encode(text, true)) << "3000 x '" << ch << "'";
    }
}

TEST(Tokenizer, Llama2VocabularyRunsEqualTheReference) {
    SpmVocab v;
    if (!llama2_vocab(&v)) GTEST_SKIP() << "no ../shared/models/tokenizer-llama2.bin";
    Spm s = make_spm(v.pieces, v.scores, v.types);
    for (const char *ch : {"a", " ", "-", "\n", "=", "1", "ab", "- "})
        for (size_t n : {1, 2, 3, 7, 16, 100, 777}) {
            std::string text;
            for (size_t i = 0; i < n; i++) text += ch;
            ASSERT_EQ(s.tok->encode(text, false, true), s.ref.encode(text, true)) << n << " x '" << ch << "'";
        }
    std::mt19937 rng(7);
    const std::vector<std::string> alpha = {"a", "e", "t", " ", "-", "\n", "th", "ing", "\xC3\xA9", "\xE4\xBD\xA0"};
    for (int t = 0; t < 50; t++) {
        const std::string text = random_text(rng, alpha, 1 + rng() % 200);
        ASSERT_EQ(s.tok->encode(text, false, true), s.ref.encode(text, true)) << "text '" << text << "'";
    }
}

TEST(Tokenizer, BytePairEqualsTheQuadraticReference) {
    for (const char *pre : {"gpt-2", "llama-bpe", "qwen2", "default"}) {
        Bpe b = make_bpe(pre, kMerges);
        std::mt19937 rng(11);
        const std::vector<std::string> alpha = {"a", "b", " ", "-", "\n", "aa", "\xC3\xA9"};
        for (int t = 0; t < 200; t++) {
            const std::string text = random_text(rng, alpha, 1 + rng() % 60);
            ASSERT_EQ(b.tok->encode(text, false), bpe_ref_encode(b, text)) << pre << " text '" << text << "'";
        }
        for (const char *ch : {"a", " ", "-", "\n", "b", "ab", "\xC3\xA9"})
            for (size_t n : {1, 2, 3, 5, 8, 13, 64, 255, std::string(pre) == "gpt-2" ? 2500 : 600}) {
                std::string text;
                for (size_t i = 0; i < n; i++) text += ch;
                ASSERT_EQ(b.tok->encode(text, false), bpe_ref_encode(b, text)) << pre << " " << n << " x '" << ch << "'";
            }
    }
}

// ---------------------------------------------------------------- 1 MiB of one character

TEST(Tokenizer, OneMebibyteOfOneCharacter) {
    const size_t n = 1 << 20;
    Spm s = small_spm();
    SpmVocab v;
    std::shared_ptr<const Tokenizer> real;
    if (llama2_vocab(&v)) real = make_spm(v.pieces, v.scores, v.types).tok;
    Bpe llama3 = make_bpe("llama-bpe", kMerges);
    for (char ch : {'a', ' ', '-'}) {
        const std::string text(n, ch);
        for (const Tokenizer *t : {s.tok.get(), real.get(), llama3.tok.get()}) {
            if (!t) continue;
            const auto t0 = std::chrono::steady_clock::now();
            const Ids ids = t->encode(text, false, false);
            const double sec = seconds_since(t0);
            std::printf("1 MiB of 0x%02x, %s %s: %zu tokens in %.3f s\n", (unsigned)ch, t->model_name().c_str(), t->pre().c_str(),
                        ids.size(), sec);
            EXPECT_EQ(t->decode(ids), text);
            EXPECT_LE(ids.size(), n);
        }
    }
}

// ---------------------------------------------------------------- pre-tokenizers

TEST(Tokenizer, UnicodeClassesFollowTheGeneralCategories) {
    using V = std::vector<std::string>;
    auto split = [](const char *pre, const std::string &t) { return make_bpe(pre, {}).tok->pre_split(t); };
    // Thai: the vowel sign / tone mark (Mn) is not a letter: it starts the next word ...
    EXPECT_EQ(split("llama-bpe", "\xE0\xB8\x81\xE0\xB9\x88\xE0\xB8\xAD\xE0\xB8\x99"),
              (V{"\xE0\xB8\x81", "\xE0\xB9\x88\xE0\xB8\xAD\xE0\xB8\x99"}));
    // ... except for qwen35, whose words are [\p{L}\p{M}]+
    EXPECT_EQ(split("qwen35", "\xE0\xB8\x81\xE0\xB9\x88\xE0\xB8\xAD\xE0\xB8\x99"), (V{"\xE0\xB8\x81\xE0\xB9\x88\xE0\xB8\xAD\xE0\xB8\x99"}));
    // Arabic harakat (Mn) split the word under gpt-2 too
    EXPECT_EQ(split("gpt-2", "\xD9\x83\xD9\x8E\xD8\xAA"), (V{"\xD9\x83", "\xD9\x8E", "\xD8\xAA"}));
    // zero-width space and BOM (Cf), the trade mark sign (So): not letters
    EXPECT_EQ(split("llama-bpe", "a\xE2\x80\x8B" "b"), (V{"a", "\xE2\x80\x8B" "b"}));
    EXPECT_EQ(split("gpt-2", "\xEF\xBB\xBFhi"), (V{"\xEF\xBB\xBF", "hi"}));
    EXPECT_EQ(split("gpt-2", "Name\xE2\x84\xA2 x"), (V{"Name", "\xE2\x84\xA2", " x"}));
    // Devanagari vowel sign (Mc) after a consonant
    EXPECT_EQ(split("qwen2", "\xE0\xA4\x95\xE0\xA4\xBE"), (V{"\xE0\xA4\x95", "\xE0\xA4\xBE"}));
    // letters beyond Latin-1 stay letters; non-ASCII digits are numbers
    EXPECT_EQ(split("llama-bpe", "caf\xC3\xA9 \xD0\xBC\xD0\xB8\xD1\x80 \xD9\xA1\xD9\xA2"),
              (V{"caf\xC3\xA9", " \xD0\xBC\xD0\xB8\xD1\x80", " ", "\xD9\xA1\xD9\xA2"}));
}

TEST(Tokenizer, PreTokenizerNamesAreLlamaCpps) {
    using V = std::vector<std::string>;
    std::shared_ptr<const Tokenizer> t;
    std::string err;
    std::vector<std::string> p = {"a", "b"};
    EXPECT_FALSE(Tokenizer::build(Tokenizer::kBpe, "gpt2", p, {}, {}, {}, &t, &err));  // llama.cpp never writes it
    EXPECT_NE(err.find("'gpt2' is not supported (supported: default, llama3"), std::string::npos) << err;
    for (const char *name : {"gpt-2", "llama-bpe", "llama3", "qwen2", "qwen35", "default", "smollm", "starcoder", "refact",
                             "command-r", "mpt", "olmo", "falcon", "phi-2", "stablelm2", "deepseek-coder"})
        EXPECT_TRUE(Tokenizer::build(Tokenizer::kBpe, name, p, {}, {}, {}, &t, &err)) << name << ": " << err;
    auto split = [](const char *pre, const std::string &s) { return make_bpe(pre, {}).tok->pre_split(s); };
    // default: [\p{P}$+<=>^~|]+, the GPT-2 regex, \p{N}+, [0-9]{3}: "1 John 1" keeps the space alone
    EXPECT_EQ(split("default", "1 John 1"), (V{"1", " John", " ", "1"}));
    EXPECT_EQ(split("gpt-2", "1 John 1"), (V{"1", " John", " 1"}));
    EXPECT_EQ(split("default", "Hello world's 12345  end\n\nx"),
              (V{"Hello", " world", "'", "s", " ", "123", "45", " ", " end", "\n", "\n", "x"}));
    EXPECT_EQ(split("falcon", "a+b=`c` 12345"), (V{"a", "+", "b", "=`", "c", "`", " ", "123", "45"}));
    EXPECT_EQ(split("starcoder", "ab12 cd"), (V{"ab", "1", "2", " cd"}));
    // deepseek-coder: [\r\n], \s?\p{L}+, \s?\p{P}+, CJK/Hangul runs, \p{N}
    EXPECT_EQ(split("deepseek-coder", "if x12:\n  y, \xE4\xBD\xA0\xE5\xA5\xBD"),
              (V{"if", " x", "1", "2", ":", "\n", " ", " y", ",", " ", "\xE4\xBD\xA0\xE5\xA5\xBD"}));
    EXPECT_EQ(split("llama-bpe", "DON'T 1234567 ok!!\n\n  hi"), (V{"DON", "'T", " ", "123", "456", "7", " ok", "!!\n\n", " ", " hi"}));
}

TEST(Tokenizer, IgnoreMergesKeepsAVocabularyWordWhole) {
    // "aab" is a vocabulary entry no merge sequence reaches ("a a" first gives "aa"+"b", and no
    // "aa b"): llama-bpe (ignore_merges) gives it whole, gpt-2 by the merges
    const std::vector<std::string> merges = {"a a", "a b"};
    Bpe l = make_bpe("llama-bpe", merges, {"aab"}), g = make_bpe("gpt-2", merges, {"aab"});
    const int32_t aab = 258, aa = 256;
    EXPECT_EQ(l.tok->encode("aab", false), (Ids{aab}));
    EXPECT_EQ(g.tok->encode("aab", false), (Ids{aa, 'b'}));
    EXPECT_EQ(l.tok->encode("aabb", false), (Ids{aa, 'b', 'b'}));  // not an entry: merges as usual
}

// ---------------------------------------------------------------- special tokens, BOS, vocab-only files

TEST(Tokenizer, ParseSpecialIsASwitch) {
    Bpe b = make_bpe("llama-bpe", kMerges, {"<|end|>", "<u>"}, {3, 4});
    const int32_t end = (int32_t)(256 + kMerges.size()), u = end + 1;
    // off (haystack text): control-token text is text; user-defined tokens still split (as llama.cpp)
    Ids off = b.tok->encode("x<|end|>y<u>z", false, false, false);
    EXPECT_EQ(std::count(off.begin(), off.end(), end), 0);
    EXPECT_EQ(std::count(off.begin(), off.end(), u), 1);
    EXPECT_EQ(b.tok->decode(off), "x<|end|>y<u>z");
    Ids on = b.tok->encode("x<|end|>y<u>z", false, false, true);
    EXPECT_EQ(on, (Ids{'x', end, 'y', u, 'z'}));
    // an end-of-generation token is a control token even when the file says user-defined (Phi-3's
    // "</s>"), as llama.cpp makes it
    Bpe e = make_bpe("gpt-2", {}, {"</s>"}, {4});
    EXPECT_EQ(e.tok->encode("a</s>", false, false, false).size(), 5u);
    EXPECT_EQ(e.tok->encode("a</s>", false, false, true), (Ids{'a', 256}));
    // SentencePiece: after a special token the next fragment gets its U+2581 again
    Spm s = small_spm();
    const int32_t ua = s.ref.id.at("\xE2\x96\x81" "a");
    EXPECT_EQ(s.tok->encode("<s>a", false, true, true), (Ids{1, ua}));
    EXPECT_NE(s.tok->encode("<s>a", false, true, false).front(), 1);
}

namespace {
std::string vocab_only_file(const std::string &name, const std::string &pre, bool with_bos_keys, int add_bos) {
    gguftest::Writer w;
    w.align = 1;  // no padding after the metadata, as llama.cpp's vocabulary files
    w.str("general.architecture", "llama");
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", pre);
    std::vector<std::string> p;
    for (unsigned b = 0; b < 256; b++) p.push_back(byte_char(b));
    w.str_arr("tokenizer.ggml.tokens", p);
    w.str_arr("tokenizer.ggml.merges", {});
    if (with_bos_keys) w.u32("tokenizer.ggml.bos_token_id", 200);
    if (add_bos >= 0) w.boolean("tokenizer.ggml.add_bos_token", add_bos != 0);
    const std::string path = testing::TempDir() + "/" + name;
    EXPECT_TRUE(w.write(path));
    return path;
}
}  // namespace

TEST(Tokenizer, VocabularyOnlyFilesAndBosDefaults) {
    struct Case {
        const char *pre;
        bool bos_key;
        int add_bos;
        int32_t bos;
        bool expect_add;
    } cases[] = {
        {"llama-bpe", true, -1, 200, true},  // llama.cpp: llama3 names add BOS without the key
        {"llama-bpe", false, -1, 11, true},  // default BOS id of byte-level BPE: 11
        {"llama-bpe", true, 0, 200, false},  // the key wins
        {"qwen2", true, -1, 200, false},
        {"gpt-2", true, 1, 200, true},
    };
    for (const Case &c : cases) {
        const std::string path = vocab_only_file("vocab-only.gguf", c.pre, c.bos_key, c.add_bos);
        GgufFile f;
        std::string err;
        ASSERT_TRUE(f.open(path, &err)) << err;  // was "truncated: no room for the tensor data after the header"
        EXPECT_TRUE(f.tensors().empty());
        std::shared_ptr<const Tokenizer> t;
        ASSERT_TRUE(Tokenizer::from_gguf(f, 0, &t, &err)) << err;
        ASSERT_TRUE(t);
        EXPECT_EQ(t->bos, c.bos) << c.pre;
        EXPECT_EQ(t->add_bos, c.expect_add) << c.pre << " key " << c.add_bos;
        EXPECT_EQ(t->encode("hi", true), (Ids{c.bos, 'h', 'i'}));
    }
}

// llama.cpp's "no tokenizer" (tokenizer.ggml.model "none" or "no_vocab": LLAMA_VOCAB_TYPE_NONE, as
// bench_gguf writes so that llama-bench loads its files): no tokenizer, like a file without the
// key; another unknown name is still refused.
TEST(Tokenizer, NoVocabularyModelMeansNoTokenizer) {
    for (const char *model : {"none", "no_vocab", "bert"}) {
        gguftest::Writer w;
        w.align = 1;
        w.str("general.architecture", "qwen2");
        w.str("tokenizer.ggml.model", model);
        w.u32("qwen2.vocab_size", 256);
        const std::string path = testing::TempDir() + "/no-vocab.gguf";
        ASSERT_TRUE(w.write(path));
        GgufFile f;
        std::string err;
        ASSERT_TRUE(f.open(path, &err)) << err;
        std::shared_ptr<const Tokenizer> t;
        const bool ok = Tokenizer::from_gguf(f, 256, &t, &err);
        if (std::string(model) == "bert") {
            EXPECT_FALSE(ok);
            EXPECT_NE(err.find("'bert' is not supported"), std::string::npos) << err;
        } else {
            EXPECT_TRUE(ok) << model << ": " << err;
            EXPECT_FALSE(t) << model;
        }
    }
}
