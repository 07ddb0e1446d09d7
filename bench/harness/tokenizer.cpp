#include "tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "gguf.h"

namespace kvh {

namespace {

// Decodes one UTF-8 character at s[i] (< end); returns its length (1 for an invalid byte, whose
// code point is then reported as 0xFFFD).
size_t utf8_next(const std::string &s, size_t i, size_t end, uint32_t *cp) {
    const unsigned char c = (unsigned char)s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > end) {
        *cp = 0xFFFD;
        return 1;
    }
    uint32_t v = n == 1 ? c : n == 2 ? (c & 31u) : n == 3 ? (c & 15u) : (c & 7u);
    for (size_t k = 1; k < n; k++) {
        const unsigned char d = (unsigned char)s[i + k];
        if ((d >> 6) != 2) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (d & 63u);
    }
    *cp = v;
    return n;
}

void utf8_put(uint32_t cp, std::string *o) {
    if (cp < 0x80) {
        o->push_back((char)cp);
    } else if (cp < 0x800) {
        o->push_back((char)(0xC0 | (cp >> 6)));
        o->push_back((char)(0x80 | (cp & 63)));
    } else if (cp < 0x10000) {
        o->push_back((char)(0xE0 | (cp >> 12)));
        o->push_back((char)(0x80 | ((cp >> 6) & 63)));
        o->push_back((char)(0x80 | (cp & 63)));
    } else {
        o->push_back((char)(0xF0 | (cp >> 18)));
        o->push_back((char)(0x80 | ((cp >> 12) & 63)));
        o->push_back((char)(0x80 | ((cp >> 6) & 63)));
        o->push_back((char)(0x80 | (cp & 63)));
    }
}

bool is_space(uint32_t c) {
    return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_num(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE) || (c >= 0x660 && c <= 0x669) ||
           (c >= 0x6F0 && c <= 0x6F9) || (c >= 0x966 && c <= 0x96F) || (c >= 0x2070 && c <= 0x2079) ||
           (c >= 0x2080 && c <= 0x2089) || (c >= 0x2150 && c <= 0x2189) || (c >= 0x2460 && c <= 0x249B) ||
           (c >= 0xFF10 && c <= 0xFF19) || c == 0x3007 || (c >= 0x3021 && c <= 0x3029);
}

// Neither letter nor number nor space: ASCII punctuation, Latin-1 symbols, combining marks,
// general punctuation / symbols / arrows / math / box drawing / dingbats, CJK punctuation,
// full-width punctuation, emoji and pictographs. Everything else counts as a letter.
bool is_other(uint32_t c) {
    if (c < 0x80) return !(c >= '0' && c <= '9') && !((c | 32) >= 'a' && (c | 32) <= 'z') && !is_space(c);
    if (c < 0x100) return c != 0xAA && c != 0xB5 && c != 0xBA && c < 0xC0 ? !is_num(c) && !is_space(c) : (c == 0xD7 || c == 0xF7);
    return (c >= 0x300 && c <= 0x36F) || (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) ||
           (c >= 0x20A0 && c <= 0x20FF) || (c >= 0x2190 && c <= 0x245F) || (c >= 0x2500 && c <= 0x2BFF) ||
           (c >= 0x2E00 && c <= 0x2E7F) || (c >= 0x3001 && c <= 0x3006) || (c >= 0x3008 && c <= 0x3020) ||
           (c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) ||
           (c >= 0xFF3B && c <= 0xFF40) || (c >= 0xFF5B && c <= 0xFF65) || (c >= 0x1F000 && c <= 0x1FAFF) || c == 0xFFFD;
}

bool is_letter(uint32_t c) { return !is_space(c) && !is_num(c) && !is_other(c); }

// The characters of s[b, e) with their code points and offsets.
struct Chars {
    std::vector<uint32_t> cp;
    std::vector<size_t> off;  // off[k] = start of char k; off[n] = e
};
Chars chars(const std::string &s, size_t b, size_t e) {
    Chars r;
    for (size_t i = b; i < e;) {
        uint32_t c;
        size_t n = utf8_next(s, i, e, &c);
        r.cp.push_back(c);
        r.off.push_back(i);
        i += n;
    }
    r.off.push_back(e);
    return r;
}

enum Pre { kPreGpt2, kPreLlama3, kPreQwen2, kPreSmollm };

// One match of the pre-tokenizer's alternatives at char k of `c` (n chars); returns its length
// in chars (>= 1).
size_t pre_match(Pre p, const Chars &c, size_t k) {
    const size_t n = c.cp.size();
    auto at = [&](size_t j) -> uint32_t { return j < n ? c.cp[j] : 0; };
    auto lower = [](uint32_t x) { return x < 0x80 ? (x | 32) : x; };
    const bool ci = p == kPreLlama3 || p == kPreQwen2;
    // contractions
    if (at(k) == '\'' && k + 1 < n) {
        uint32_t a = ci ? lower(at(k + 1)) : at(k + 1), b = ci ? lower(at(k + 2)) : at(k + 2);
        if (k + 2 < n && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))) return 3;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    }
    auto run = [&](size_t j, bool (*cls)(uint32_t)) {
        size_t e = j;
        while (e < n && cls(at(e))) e++;
        return e - j;
    };
    if (p == kPreGpt2 || p == kPreSmollm) {
        const size_t s = at(k) == ' ' ? 1 : 0;
        if (size_t m = run(k + s, is_letter)) return s + m;
        if (size_t m = run(k + s, is_num)) return s + m;
        if (size_t m = run(k + s, is_other)) return s + m;
    } else {
        // [^\r\n\p{L}\p{N}]?\p{L}+
        const uint32_t c0 = at(k);
        if (c0 != '\r' && c0 != '\n' && !is_letter(c0) && !is_num(c0)) {
            if (size_t m = run(k + 1, is_letter)) return 1 + m;
        }
        if (size_t m = run(k, is_letter)) return m;
        // \p{N}{1,3} (qwen2: \p{N})
        if (size_t m = run(k, is_num)) return std::min<size_t>(m, p == kPreQwen2 ? 1 : 3);
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        const size_t s = at(k) == ' ' ? 1 : 0;
        if (size_t m = run(k + s, is_other)) {
            size_t e = k + s + m;
            while (e < n && (at(e) == '\r' || at(e) == '\n')) e++;
            return e - k;
        }
        // \s*[\r\n]+ : the longest whitespace prefix ending in \r or \n
        size_t w = run(k, is_space), last = 0;
        for (size_t j = 0; j < w; j++)
            if (at(k + j) == '\r' || at(k + j) == '\n') last = j + 1;
        if (last) return last;
    }
    // \s+(?!\S) then \s+
    size_t w = run(k, is_space);
    if (w) {
        if (k + w < n && w > 1) return w - 1;  // leave one space to lead the next word
        return w;
    }
    return 1;  // unreachable for well-formed classes; keep progress
}

std::string byte_char(unsigned b) {
    // GPT-2's byte-to-character map: printable bytes stand for themselves, the others take
    // code points 256, 257, ... in byte order.
    static uint32_t map[256];
    static bool init = false;
    if (!init) {
        uint32_t next = 256;
        for (unsigned x = 0; x < 256; x++) {
            const bool keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
            map[x] = keep ? x : next++;
        }
        init = true;
    }
    std::string s;
    utf8_put(map[b], &s);
    return s;
}

int char_byte(uint32_t cp) {
    for (unsigned b = 0; b < 256; b++) {
        uint32_t c;
        std::string s = byte_char(b);
        utf8_next(s, 0, s.size(), &c);
        if (c == cp) return (int)b;
    }
    return -1;
}

}  // namespace

bool Tokenizer::build(Kind kind, const std::string &pre, std::vector<std::string> pieces, std::vector<float> scores,
                      std::vector<int32_t> types, const std::vector<std::string> &merges,
                      std::shared_ptr<const Tokenizer> *out, std::string *err) {
    auto t = std::make_shared<Tokenizer>();
    t->kind_ = kind;
    t->model_ = kind == kSpm ? "llama" : "gpt2";
    t->pre_ = pre;
    if (kind == kBpe) {
        static const char *known[] = {"default", "gpt2", "llama3", "llama-bpe", "qwen2", "smollm"};
        bool ok = false;
        for (const char *k : known) ok = ok || pre == k;
        if (!ok) {
            *err = "tokenizer pre-tokenizer '" + gguf_shown(pre) + "' is not supported (supported: default, gpt2, llama3, llama-bpe, qwen2, smollm)";
            return false;
        }
    }
    scores.resize(pieces.size(), 0.0f);
    types.resize(pieces.size(), 1);
    t->pieces_ = std::move(pieces);
    t->scores_ = std::move(scores);
    t->types_ = std::move(types);
    for (int i = 0; i < 256; i++) t->byte_tok_[i] = -1;
    for (size_t i = 0; i < t->pieces_.size(); i++) {
        const std::string &p = t->pieces_[i];
        t->ids_.emplace(p, (int32_t)i);
        // "<0xHH>": two hex digits exactly (sscanf's %x would also take a sign: "<0x-1>" gave 0xffffffff)
        auto hex = [](char ch) { return std::isxdigit((unsigned char)ch) != 0; };
        if (kind == kSpm && p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && hex(p[3]) && hex(p[4])) {
            const unsigned b = (unsigned)std::stoul(p.substr(3, 2), nullptr, 16);
            if (b < 256) t->byte_tok_[b] = (int32_t)i;
        }
    }
    for (size_t r = 0; r < merges.size(); r++) t->merge_rank_.emplace(merges[r], (int32_t)r);
    *out = t;
    return true;
}

bool Tokenizer::from_gguf(const GgufFile &f, int vocab, std::shared_ptr<const Tokenizer> *out, std::string *err) {
    out->reset();
    std::string model;
    if (!f.find("tokenizer.ggml.model")) return true;
    if (!f.get_str("tokenizer.ggml.model", &model)) {
        *err = "tokenizer.ggml.model is not a string";
        return false;
    }
    Kind kind;
    if (model == "llama") {
        kind = kSpm;
    } else if (model == "gpt2") {
        kind = kBpe;
    } else {
        *err = "tokenizer model '" + gguf_shown(model) + "' is not supported (supported: llama, gpt2)";
        return false;
    }
    std::vector<std::string> pieces, merges;
    std::vector<float> scores;
    std::vector<int32_t> types;
    if (!f.get_str_array("tokenizer.ggml.tokens", &pieces)) {
        *err = "tokenizer.ggml.tokens is missing or not an array of strings";
        return false;
    }
    if (pieces.empty() || pieces.size() > (size_t)vocab) {
        *err = "tokenizer has " + std::to_string(pieces.size()) + " tokens but the embedding has " + std::to_string(vocab) + " rows";
        return false;
    }
    if (f.find("tokenizer.ggml.scores") && (!f.get_f32_array("tokenizer.ggml.scores", &scores) || scores.size() != pieces.size())) {
        *err = "tokenizer.ggml.scores is not an f32 array of one score per token";
        return false;
    }
    if (f.find("tokenizer.ggml.token_type") && (!f.get_i32_array("tokenizer.ggml.token_type", &types) || types.size() != pieces.size())) {
        *err = "tokenizer.ggml.token_type is not an integer array of one type per token";
        return false;
    }
    if (kind == kBpe && !f.get_str_array("tokenizer.ggml.merges", &merges)) {
        *err = "tokenizer.ggml.merges (a string array) is missing for the gpt2 tokenizer";
        return false;
    }
    std::string pre = "default";
    if (kind == kBpe && f.find("tokenizer.ggml.pre") && !f.get_str("tokenizer.ggml.pre", &pre)) {
        *err = "tokenizer.ggml.pre is not a string";
        return false;
    }
    std::shared_ptr<const Tokenizer> t;
    if (!build(kind, pre, std::move(pieces), std::move(scores), std::move(types), merges, &t, err)) return false;
    Tokenizer *m = const_cast<Tokenizer *>(t.get());
    int64_t v;
    m->bos = kind == kSpm ? 1 : -1;
    m->eos = kind == kSpm ? 2 : -1;
    if (f.get_int("tokenizer.ggml.bos_token_id", &v)) m->bos = v >= 0 && v < m->size() ? (int32_t)v : -1;
    if (f.get_int("tokenizer.ggml.eos_token_id", &v)) m->eos = v >= 0 && v < m->size() ? (int32_t)v : -1;
    if (m->bos >= m->size()) m->bos = -1;
    if (m->eos >= m->size()) m->eos = -1;
    bool b;
    m->add_bos = kind == kSpm;
    if (f.get_bool("tokenizer.ggml.add_bos_token", &b)) m->add_bos = b;
    if (f.get_bool("tokenizer.ggml.add_space_prefix", &b)) m->add_space_prefix = b;
    if (m->bos < 0) m->add_bos = false;
    *out = t;
    return true;
}

std::vector<int32_t> Tokenizer::encode_spm(const std::string &text) const {
    struct Sym {
        size_t b, n;
        int prev, next;
    };
    std::vector<Sym> sym;
    for (size_t i = 0; i < text.size();) {
        uint32_t c;
        size_t n = utf8_next(text, i, text.size(), &c);
        sym.push_back({i, n, (int)sym.size() - 1, (int)sym.size() + 1});
        i += n;
    }
    if (!sym.empty()) sym.back().next = -1;
    // Merge the best pair until none merges (O(n^2); prompts are short).
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (int i = sym.empty() ? -1 : 0; i != -1 && sym[(size_t)i].next != -1; i = sym[(size_t)i].next) {
            const Sym &a = sym[(size_t)i], &bb = sym[(size_t)a.next];
            auto it = ids_.find(text.substr(a.b, a.n + bb.n));
            if (it == ids_.end() || types_[(size_t)it->second] == 3) continue;
            const float s = scores_[(size_t)it->second];
            if (best < 0 || s > best_score) {
                best = i;
                best_score = s;
            }
        }
        if (best < 0) break;
        Sym &a = sym[(size_t)best];
        Sym &bb = sym[(size_t)a.next];
        a.n += bb.n;
        a.next = bb.next;
        if (bb.next != -1) sym[(size_t)bb.next].prev = best;
        bb.n = 0;
    }
    std::vector<int32_t> out;
    for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[(size_t)i].next) {
        const std::string piece = text.substr(sym[(size_t)i].b, sym[(size_t)i].n);
        auto it = ids_.find(piece);
        if (it != ids_.end()) {
            out.push_back(it->second);
            continue;
        }
        for (unsigned char ch : piece)
            if (byte_tok_[ch] >= 0) out.push_back(byte_tok_[ch]);
            else if (!pieces_.empty()) out.push_back(0);  // no byte fallback: unknown
    }
    return out;
}

std::vector<std::string> Tokenizer::pre_split(const std::string &text) const {
    const Pre p = pre_ == "llama3" || pre_ == "llama-bpe" ? kPreLlama3 : pre_ == "qwen2" ? kPreQwen2
                  : pre_ == "smollm" ? kPreSmollm : kPreGpt2;
    std::vector<std::string> words;
    // smollm: every digit is a piece of its own first, the rest is split within the segments.
    std::vector<std::pair<size_t, size_t>> segs;
    if (p == kPreSmollm) {
        size_t s = 0;
        for (size_t i = 0; i < text.size();) {
            uint32_t c;
            size_t n = utf8_next(text, i, text.size(), &c);
            if (is_num(c)) {
                if (i > s) segs.push_back({s, i});
                segs.push_back({i, i + n});
                s = i + n;
            }
            i += n;
        }
        if (s < text.size()) segs.push_back({s, text.size()});
    } else {
        segs.push_back({0, text.size()});
    }
    for (auto &sg : segs) {
        Chars c = chars(text, sg.first, sg.second);
        for (size_t k = 0; k < c.cp.size();) {
            size_t m = pre_match(p, c, k);
            words.push_back(text.substr(c.off[k], c.off[k + m] - c.off[k]));
            k += m;
        }
    }
    return words;
}

void Tokenizer::bpe_word(const std::string &word, std::vector<int32_t> *out) const {
    std::vector<std::string> sym;
    for (unsigned char ch : word) sym.push_back(byte_char(ch));
    for (;;) {
        int best = -1, best_rank = 0;
        for (size_t i = 0; i + 1 < sym.size(); i++) {
            auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
            if (it != merge_rank_.end() && (best < 0 || it->second < best_rank)) {
                best = (int)i;
                best_rank = it->second;
            }
        }
        if (best < 0) break;
        sym[(size_t)best] += sym[(size_t)best + 1];
        sym.erase(sym.begin() + best + 1);
    }
    for (const std::string &s : sym) {
        auto it = ids_.find(s);
        if (it != ids_.end()) {
            out->push_back(it->second);
            continue;
        }
        for (size_t i = 0; i < s.size();) {  // fall back to the single characters
            uint32_t c;
            size_t n = utf8_next(s, i, s.size(), &c);
            auto jt = ids_.find(s.substr(i, n));
            if (jt != ids_.end()) out->push_back(jt->second);
            i += n;
        }
    }
}

std::vector<int32_t> Tokenizer::encode(const std::string &text, bool with_bos, bool space_prefix) const {
    std::vector<int32_t> out;
    if (with_bos && bos >= 0) out.push_back(bos);
    // Control (3) and user-defined (4) tokens written in the text are those tokens.
    std::vector<std::pair<size_t, int32_t>> specials;  // (length, id), longest first
    for (size_t i = 0; i < pieces_.size(); i++)
        if ((types_[i] == 3 || types_[i] == 4) && pieces_[i].size() > 1) specials.push_back({pieces_[i].size(), (int32_t)i});
    std::sort(specials.begin(), specials.end(), [](auto &a, auto &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    size_t start = 0;
    auto flush = [&](size_t end) {
        if (end <= start) return;
        std::string frag = text.substr(start, end - start);
        if (kind_ == kSpm) {
            std::string s;
            if (start == 0 && space_prefix) s = "\xE2\x96\x81";
            for (char ch : frag) {
                if (ch == ' ') s += "\xE2\x96\x81";
                else s.push_back(ch);
            }
            // Pieces hold U+2581 only as a prefix (SentencePiece splits at whitespace; true of every
            // piece of the Llama 2 vocabulary), so no merge crosses the start of a run of U+2581
            // after another character: merging chunk by chunk gives the same ids in linear time
            // over the chunks instead of quadratic time over the whole text.
            size_t b = 0;
            for (size_t i = 3; i <= s.size(); i++) {
                const bool cut = i == s.size() || (s.compare(i, 3, "\xE2\x96\x81") == 0 && s.compare(i - 3, 3, "\xE2\x96\x81") != 0);
                if (!cut) continue;
                std::vector<int32_t> ids = encode_spm(s.substr(b, i - b));
                out.insert(out.end(), ids.begin(), ids.end());
                b = i;
            }
        } else {
            for (const std::string &w : pre_split(frag)) bpe_word(w, &out);
        }
    };
    for (size_t i = 0; i < text.size();) {
        bool hit = false;
        for (auto &sp : specials) {
            if (text.compare(i, sp.first, pieces_[(size_t)sp.second]) == 0) {
                flush(i);
                out.push_back(sp.second);
                i += sp.first;
                start = i;
                hit = true;
                break;
            }
        }
        if (!hit) i++;
    }
    flush(text.size());
    return out;
}

std::string Tokenizer::decode(int32_t id) const {
    if (id < 0 || id >= size()) return "";
    const int32_t ty = types_[(size_t)id];
    if (ty == 3) return "";
    const std::string &p = pieces_[(size_t)id];
    std::string o;
    if (kind_ == kSpm) {
        if (ty == 6 || (p.size() == 6 && p.compare(0, 3, "<0x") == 0)) {
            unsigned b;
            if (std::sscanf(p.c_str() + 3, "%2x", &b) == 1) return std::string(1, (char)b);
        }
        for (size_t i = 0; i < p.size(); i++) {
            if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
                o.push_back(' ');
                i += 2;
            } else {
                o.push_back(p[i]);
            }
        }
        return o;
    }
    for (size_t i = 0; i < p.size();) {
        uint32_t c;
        size_t n = utf8_next(p, i, p.size(), &c);
        int b = char_byte(c);
        if (b >= 0) o.push_back((char)b);
        else o.append(p, i, n);
        i += n;
    }
    return o;
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids) const {
    std::string s;
    for (int32_t id : ids) s += decode(id);
    return s;
}

}  // namespace kvh
