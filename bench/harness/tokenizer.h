// Tokenizers from a GGUF file's metadata (harness only).
//
// tokenizer.ggml.model = "llama": SentencePiece BPE. Spaces become U+2581, one U+2581 is put in
// front of non-empty text, the text is split into UTF-8 characters and the adjacent pair whose
// concatenation is a vocabulary piece of the highest score is merged (leftmost on ties) until no
// pair merges; a piece left outside the vocabulary is emitted as its bytes (<0xXX> tokens).
//
// tokenizer.ggml.model = "gpt2": byte-level BPE. The text is split by the pre-tokenizer named in
// tokenizer.ggml.pre (default/gpt2, llama3/llama-bpe, qwen2, smollm), each word's bytes are
// mapped to GPT-2's printable characters and merged by tokenizer.ggml.merges rank.
// Unicode classes (letter / number / space) are exact for ASCII and Latin-1 and approximate
// beyond (a table of the common number, space and punctuation ranges; every other code point is
// a letter): docs/harness.md.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvh {

class GgufFile;

class Tokenizer {
public:
    enum Kind { kSpm, kBpe };
    // Builds the tokenizer of `f` (vocab = rows of the embedding). No tokenizer.ggml.model: true
    // with *out null (byte / id vocabulary). Unsupported model or pre-tokenizer, or a vocabulary
    // inconsistent with the embedding: false with a message.
    static bool from_gguf(const GgufFile &f, int vocab, std::shared_ptr<const Tokenizer> *out, std::string *err);
    // Builds from parts (tests): pieces, scores (SPM), token types, merges ("a b", BPE).
    static bool build(Kind kind, const std::string &pre, std::vector<std::string> pieces, std::vector<float> scores,
                      std::vector<int32_t> types, const std::vector<std::string> &merges,
                      std::shared_ptr<const Tokenizer> *out, std::string *err);

    // Token ids of text; BOS first when add_bos and the model has one.
    std::vector<int32_t> encode(const std::string &text, bool with_bos) const { return encode(text, with_bos, add_space_prefix); }
    // The same with SentencePiece's leading U+2581 on (as the metadata says) or off (a fragment
    // that continues text, as the task prompts' pieces do).
    std::vector<int32_t> encode(const std::string &text, bool add_bos, bool space_prefix) const;
    // Text of one token (control tokens give ""; byte tokens their byte).
    std::string decode(int32_t id) const;
    std::string decode(const std::vector<int32_t> &ids) const;
    // gpt2 pre-tokenizer split (for tests): the words before BPE.
    std::vector<std::string> pre_split(const std::string &text) const;

    Kind kind() const { return kind_; }
    const std::string &model_name() const { return model_; }
    const std::string &pre() const { return pre_; }
    int size() const { return (int)pieces_.size(); }
    int32_t bos = -1, eos = -1;
    bool add_bos = true;
    bool add_space_prefix = true;  // SentencePiece: tokenizer.ggml.add_space_prefix (default true)

private:
    std::vector<int32_t> encode_spm(const std::string &text) const;
    void bpe_word(const std::string &word, std::vector<int32_t> *out) const;
    Kind kind_ = kSpm;
    std::string model_, pre_;
    std::vector<std::string> pieces_;
    std::vector<float> scores_;
    std::vector<int32_t> types_;
    std::unordered_map<std::string, int32_t> ids_;
    std::unordered_map<std::string, int32_t> merge_rank_;  // "a b" -> rank
    int32_t byte_tok_[256];
};

}  // namespace kvh
