// Tokenizers from a GGUF file's metadata (harness only). Both follow llama.cpp's tokenizer
// (src/llama-vocab.cpp, src/unicode.cpp at the tree pinned in .ci/vocab.sh): the same ids on its
// test vectors (models/ggml-vocab-*.gguf.inp/.out) for llama-spm, phi-3, llama-bpe, qwen2, gpt-2
// and the other vocabularies docs/harness.md lists.
//
// Special tokens first: with parse_special, the text of every control, user-defined and unknown
// token (longest first) splits the text and becomes that token; without it only user-defined
// tokens do (llama.cpp's parse_special; haystack and eval text use it off).
//
// tokenizer.ggml.model = "llama": SentencePiece BPE. Spaces become U+2581, one U+2581 is put in
// front of a text fragment that starts the text or follows a special token (add_space_prefix),
// the fragment is split into UTF-8 characters and the adjacent pair whose concatenation is a
// vocabulary piece of the highest score is merged (leftmost on ties) until no pair merges; a piece
// left outside the vocabulary is emitted as its bytes (<0xXX> tokens).
//
// tokenizer.ggml.model = "gpt2": byte-level BPE. The text is split by the pre-tokenizer named in
// tokenizer.ggml.pre (llama.cpp's regexes for that name, run as hand-written scanners over the
// Unicode general categories of unicode_classes.inc), each word's bytes are mapped to GPT-2's
// printable characters and merged by tokenizer.ggml.merges rank (leftmost on ties); with
// ignore_merges (llama3 names) a word that is itself a vocabulary entry is that one token.
//
// Both merge loops keep the candidate pairs in a heap: O(n log n) in the length of a word, so a
// long run of one character (a line of dashes or spaces) costs no more than ordinary text.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvh {

class GgufFile;

class Tokenizer {
public:
    Tokenizer() = default;
    Tokenizer(const Tokenizer &) = delete;  // ids_ holds views into pieces_
    Tokenizer &operator=(const Tokenizer &) = delete;
    enum Kind { kSpm, kBpe };
    // Builds the tokenizer of `f` (vocab = rows of the embedding; 0 for a vocabulary-only file, no
    // limit). No tokenizer.ggml.model, or llama.cpp's "none" / "no_vocab": true with *out null
    // (byte / id vocabulary). Unsupported
    // model or pre-tokenizer, or a vocabulary inconsistent with the embedding: false with a message.
    static bool from_gguf(const GgufFile &f, int vocab, std::shared_ptr<const Tokenizer> *out, std::string *err);
    // Builds from parts (tests): pieces, scores (SPM), token types, merges ("a b", BPE).
    static bool build(Kind kind, const std::string &pre, std::vector<std::string> pieces, std::vector<float> scores,
                      std::vector<int32_t> types, const std::vector<std::string> &merges,
                      std::shared_ptr<const Tokenizer> *out, std::string *err);

    // Token ids of text; BOS first when with_bos and the model has one. Special-token text is
    // text unless parse_special (see above).
    std::vector<int32_t> encode(const std::string &text, bool with_bos) const { return encode(text, with_bos, add_space_prefix); }
    // The same with SentencePiece's leading U+2581 on (as the metadata says) or off (a fragment
    // that continues text, as the task prompts' pieces do), and control-token text parsed or not.
    std::vector<int32_t> encode(const std::string &text, bool add_bos, bool space_prefix, bool parse_special = false) const;
    // Text of one token (control tokens give ""; byte tokens their byte).
    std::string decode(int32_t id) const;
    std::string decode(const std::vector<int32_t> &ids) const;
    // gpt2 pre-tokenizer split (for tests): the words before BPE (invalid UTF-8 as U+FFFD).
    std::vector<std::string> pre_split(const std::string &text) const;
    // The pre-tokenizer names accepted (llama.cpp's names for the regexes implemented).
    static std::string supported_pre();

    Kind kind() const { return kind_; }
    const std::string &model_name() const { return model_; }
    const std::string &pre() const { return pre_; }
    int size() const { return (int)pieces_.size(); }
    int32_t bos = -1, eos = -1;
    bool add_bos = true;
    bool add_space_prefix = true;  // SentencePiece: tokenizer.ggml.add_space_prefix (default true)
    bool ignore_merges = false;    // BPE: a word that is a vocabulary entry is one token (llama3 names)

    // Token attributes (llama.cpp's LSTRIP / RSTRIP: a special token eats the spaces before /
    // after it); phi-3 files get RSTRIP on their special tokens as in llama.cpp.
    void set_strip(int32_t id, bool lstrip, bool rstrip);

private:
    void encode_spm(const std::string &text, std::vector<int32_t> *out) const;
    void encode_bpe(const std::string &text, std::vector<int32_t> *out) const;
    void bpe_word(const std::string &word, std::vector<int32_t> *out) const;
    int32_t find(std::string_view s) const {
        auto it = ids_.find(s);
        return it == ids_.end() ? -1 : it->second;
    }
    Kind kind_ = kSpm;
    int pre_id_ = 0;
    std::string model_, pre_;
    std::vector<std::string> pieces_;
    std::vector<float> scores_;
    std::vector<uint32_t> score_order_;                      // SentencePiece: 0 = highest score
    std::vector<int32_t> types_;
    std::vector<uint8_t> strip_;                             // bit 0 lstrip, bit 1 rstrip
    std::unordered_map<std::string_view, int32_t> ids_;     // views into pieces_ (last id wins)
    std::vector<std::string> merge_parts_;                   // the distinct halves of the merges
    std::unordered_map<std::string_view, int32_t> part_id_;  // views into merge_parts_
    std::unordered_map<uint64_t, int32_t> merge_rank_;       // (left part, right part) -> rank
    std::vector<int32_t> specials_;                          // control / user-defined / unknown, longest first
    int32_t byte_tok_[256];
};

}  // namespace kvh
