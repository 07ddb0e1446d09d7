#include "tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <functional>

#include "gguf.h"

namespace kvh {

namespace {

// ---------------------------------------------------------------- UTF-8

// Decodes one UTF-8 character at s[i] (< end); returns its length (1 for an invalid byte, whose
// code point is then reported as 0xFFFD). Like llama.cpp: lead byte and continuation bytes are
// checked, overlong forms and surrogates are not.
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

// Length of the UTF-8 character that byte c starts, by its top four bits alone (the merge loops
// split words this way; a length past the end is cut there).
size_t utf8_len(char c) {
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[(unsigned char)c >> 4];
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

// ---------------------------------------------------------------- Unicode classes

enum Cls : uint8_t { kUnassigned = 0, kNumber, kLetter, kSeparator, kMark, kPunct, kSymbol, kOther };

struct ClassRange {
    uint32_t first;
    uint8_t cls;
};
const ClassRange kClassRanges[] = {
#include "unicode_classes.inc"
};

uint8_t ucls_slow(uint32_t c) {
    if (c >= 0x110000) return kUnassigned;
    const ClassRange *b = std::begin(kClassRanges), *e = std::end(kClassRanges);
    const ClassRange *it = std::upper_bound(b, e, c, [](uint32_t x, const ClassRange &r) { return x < r.first; });
    return (it - 1)->cls;
}

uint8_t ucls(uint32_t c) {
    static const struct Low {
        uint8_t t[0x800];
        Low() {
            for (uint32_t i = 0; i < 0x800; i++) t[i] = ucls_slow(i);
        }
    } low;
    return c < 0x800 ? low.t[c] : ucls_slow(c);
}

// PropList.txt's White_Space.
bool is_ws(uint32_t c) {
    return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// One code point's properties, as the pre-tokenizers test them. A position past the end of the
// piece has none (`in` false).
struct Props {
    bool in = false, ws = false;
    uint8_t cls = kUnassigned;
    bool letter() const { return in && cls == kLetter; }
    bool number() const { return in && cls == kNumber; }
    bool white() const { return in && ws; }
    // [^\s\p{L}\p{N}]
    bool other() const { return in && !ws && cls != kLetter && cls != kNumber; }
};

// ---------------------------------------------------------------- pre-tokenizers

// The text as code points (invalid UTF-8 bytes as U+FFFD) with their properties.
struct Cps {
    std::vector<uint32_t> cp;
    std::vector<uint8_t> cls, ws;
};
Cps code_points(const std::string &s) {
    Cps r;
    r.cp.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        uint32_t c;
        i += utf8_next(s, i, s.size(), &c);
        r.cp.push_back(c);
    }
    r.cls.resize(r.cp.size());
    r.ws.resize(r.cp.size());
    for (size_t i = 0; i < r.cp.size(); i++) {
        r.cls[i] = ucls(r.cp[i]);
        r.ws[i] = is_ws(r.cp[i]);
    }
    return r;
}

// A split step maps pieces (lengths in code points, covering the text) to finer pieces.
using Pieces = std::vector<size_t>;

// Scanner state for one piece [b, e).
struct Scan {
    const Cps &c;
    size_t b, e;
    Pieces *out;
    size_t last;
    bool marks = false;  // qwen35: [\p{L}\p{M}] where the others have \p{L}
    Props at(size_t p) const {
        Props r;
        if (p < b || p >= e) return r;
        r.in = true;
        r.ws = c.ws[p] != 0;
        r.cls = marks && c.cls[p] == kMark ? (uint8_t)kLetter : c.cls[p];
        return r;
    }
    uint32_t cp(size_t p) const { return p >= b && p < e ? c.cp[p] : 0xFFFFFFFFu; }
    void emit(size_t end) {
        if (end > last) out->push_back(end - last);
        last = end;
    }
};

uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d at p (case-insensitive when ci): its length, else 0.
size_t contraction(const Scan &s, size_t p, bool ci) {
    if (s.cp(p) != '\'' || p + 1 >= s.e) return 0;
    const uint32_t a = ci ? ascii_lower(s.cp(p + 1)) : s.cp(p + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (p + 2 >= s.e) return 0;
    const uint32_t b = ci ? ascii_lower(s.cp(p + 2)) : s.cp(p + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const Cps &c, size_t b, size_t e, Pieces *out) {
    Scan s{c, b, e, out, b, false};
    for (size_t p = b; p < e;) {
        if (size_t m = contraction(s, p, false)) {
            p += m;
            s.emit(p);
            continue;
        }
        const size_t q = s.cp(p) == ' ' ? p + 1 : p;  // the optional leading space
        const Props f = s.at(q);
        if (f.letter() || f.number() || f.other()) {
            p = q;
            if (f.letter()) {
                while (s.at(p).letter()) p++;
            } else if (f.number()) {
                while (s.at(p).number()) p++;
            } else {
                while (s.at(p).other()) p++;
            }
            s.emit(p);
            continue;
        }
        size_t w = 0;
        while (s.at(p + w).white()) w++;
        if (w > 1 && p + w < e) {
            p += w - 1;  // \s+(?!\S): leave the last one to lead the next word
        } else if (w > 0) {
            p += w;
        } else {
            p++;
        }
        s.emit(p);
    }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (marks: [\p{L}\p{M}] for \p{L}, qwen35)
void split_llama3(const Cps &c, size_t b, size_t e, size_t max_digits, bool marks, Pieces *out) {
    Scan s{c, b, e, out, b, marks};
    for (size_t p = b; p < e;) {
        if (size_t m = contraction(s, p, true)) {
            p += m;
            s.emit(p);
            continue;
        }
        const uint32_t ch = s.cp(p);
        const Props f = s.at(p);
        if (ch != '\r' && ch != '\n' && !f.number() && (f.letter() || s.at(p + 1).letter())) {
            p++;
            while (s.at(p).letter()) p++;
            s.emit(p);
            continue;
        }
        if (f.number()) {
            size_t run = 0;
            while (s.at(p).number()) {
                p++;
                if (++run == max_digits) {
                    s.emit(p);
                    run = 0;
                }
            }
            s.emit(p);
            continue;
        }
        const size_t q = ch == ' ' ? p + 1 : p;
        if (s.at(q).other() || (q > p && !s.at(q).in)) {  // a final lone space matches " ?[...]+" as " "
            p = q;
            while (s.at(p).other()) p++;
            while (s.cp(p) == '\r' || s.cp(p) == '\n') p++;
            s.emit(p);
            continue;
        }
        size_t w = 0, nl_end = 0;
        while (s.at(p + w).white()) {
            if (s.cp(p + w) == '\r' || s.cp(p + w) == '\n') nl_end = p + w + 1;
            w++;
        }
        if (nl_end) {
            p = nl_end;  // \s*[\r\n]+
        } else if (w > 1 && p + w < e) {
            p += w - 1;
        } else if (w > 0) {
            p += w;
        } else {
            p++;
        }
        s.emit(p);
    }
}

// A regex that is one character class repeated (or a fixed count of it): every match and every
// gap between matches becomes a piece, as llama.cpp's std::regex splits do.
template <class Match>
void split_matches(const Cps &c, size_t b, size_t e, Match match, Pieces *out) {
    Scan s{c, b, e, out, b, false};
    for (size_t p = b; p < e;) {
        const size_t m = match(p, e);
        if (m == 0) {
            p++;
            continue;
        }
        s.emit(p);
        p += m;
        s.emit(p);
    }
    s.emit(e);
}

enum Pre { kPreDefault, kPreGpt2, kPreLlama3, kPreQwen2, kPreQwen35, kPreSmollm, kPreFalcon, kPreDeepseekCoder };

struct PreName {
    const char *name;
    Pre pre;
};
// llama.cpp's tokenizer.ggml.pre names for the regex lists implemented here (llama-vocab.cpp).
const PreName kPreNames[] = {
    {"default", kPreDefault},
    {"llama3", kPreLlama3}, {"llama-v3", kPreLlama3}, {"llama-bpe", kPreLlama3}, {"falcon3", kPreLlama3},
    {"falcon-h1", kPreLlama3}, {"pixtral", kPreLlama3}, {"midm-2.0", kPreLlama3}, {"lfm2", kPreLlama3},
    {"gpt-2", kPreGpt2}, {"phi-2", kPreGpt2}, {"mpt", kPreGpt2}, {"olmo", kPreGpt2}, {"jais", kPreGpt2},
    {"trillion", kPreGpt2}, {"exaone4", kPreGpt2}, {"gigachat", kPreGpt2}, {"a.x-4.0", kPreGpt2}, {"mellum", kPreGpt2},
    {"qwen2", kPreQwen2}, {"deepseek-r1-qwen", kPreQwen2}, {"megrez", kPreQwen2}, {"stablelm2", kPreQwen2},
    {"qwen35", kPreQwen35},
    {"smollm", kPreSmollm}, {"starcoder", kPreSmollm}, {"refact", kPreSmollm}, {"command-r", kPreSmollm},
    {"codeshell", kPreSmollm}, {"exaone", kPreSmollm}, {"minerva-7b", kPreSmollm},
    {"falcon", kPreFalcon},
    {"deepseek-coder", kPreDeepseekCoder},
};

bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

// \p{P} and the ASCII symbols llama.cpp's default and falcon lists add ($+<=>^~| and, falcon, `).
bool punct_or(const Cps &c, size_t p, bool backtick) {
    const uint32_t x = c.cp[p];
    if (x == '$' || x == '+' || x == '<' || x == '=' || x == '>' || x == '^' || x == '~' || x == '|' || (backtick && x == '`'))
        return true;
    return c.cls[p] == kPunct && !c.ws[p];
}

Pieces pre_pieces(Pre pre, const Cps &c) {
    Pieces pcs{c.cp.size()};
    if (c.cp.empty()) return {};
    auto each = [&](auto step) {
        Pieces out;
        size_t b = 0;
        for (size_t n : pcs) {
            step(b, b + n, &out);
            b += n;
        }
        pcs.swap(out);
    };
    auto class_runs = [&](auto in_class) {
        each([&](size_t b, size_t e, Pieces *out) {
            split_matches(c, b, e, [&](size_t p, size_t end) {
                size_t q = p;
                while (q < end && in_class(q)) q++;
                return q - p;
            }, out);
        });
    };
    auto three_digits = [&]() {
        each([&](size_t b, size_t e, Pieces *out) {
            split_matches(c, b, e, [&](size_t p, size_t end) -> size_t {
                return p + 3 <= end && is_ascii_digit(c.cp[p]) && is_ascii_digit(c.cp[p + 1]) && is_ascii_digit(c.cp[p + 2]) ? 3 : 0;
            }, out);
        });
    };
    auto gpt2 = [&]() { each([&](size_t b, size_t e, Pieces *out) { split_gpt2(c, b, e, out); }); };
    auto number = [&](size_t p) { return c.cls[p] == kNumber && !c.ws[p]; };
    switch (pre) {
        case kPreDefault:  // [\p{P}\$\+<=>\^~\|]+, the GPT-2 regex, \p{N}+, [0-9][0-9][0-9]
            class_runs([&](size_t p) { return punct_or(c, p, false); });
            gpt2();
            class_runs(number);
            three_digits();
            break;
        case kPreFalcon:  // [\p{P}\$\+<=>\^~\|`]+, the GPT-2 regex, [0-9][0-9][0-9]
            class_runs([&](size_t p) { return punct_or(c, p, true); });
            gpt2();
            three_digits();
            break;
        case kPreGpt2:
            gpt2();
            break;
        case kPreSmollm:  // \p{N} (each alone), then the GPT-2 regex
            each([&](size_t b, size_t e, Pieces *out) {
                split_matches(c, b, e, [&](size_t p, size_t) -> size_t { return number(p) ? 1 : 0; }, out);
            });
            gpt2();
            break;
        case kPreDeepseekCoder: {  // [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+, \p{N}
            auto one = [&](auto pred) {
                each([&](size_t b, size_t e, Pieces *out) {
                    split_matches(c, b, e, [&](size_t p, size_t) -> size_t { return pred(p) ? 1 : 0; }, out);
                });
            };
            auto space_then = [&](auto pred) {  // \s?X+: the space only when X follows
                each([&](size_t b, size_t e, Pieces *out) {
                    split_matches(c, b, e, [&](size_t p, size_t end) -> size_t {
                        size_t q = p;
                        if (c.ws[q] && q + 1 < end && pred(q + 1)) q++;
                        else if (!pred(q)) return 0;
                        while (q < end && pred(q)) q++;
                        return q - p;
                    }, out);
                });
            };
            one([&](size_t p) { return c.cp[p] == '\r' || c.cp[p] == '\n'; });
            space_then([&](size_t p) { return c.cls[p] == kLetter && !c.ws[p]; });
            space_then([&](size_t p) { return c.cls[p] == kPunct && !c.ws[p]; });
            class_runs([&](size_t p) {
                const uint32_t x = c.cp[p];
                return !c.ws[p] && ((x >= 0x4E00 && x <= 0x9FA5) || (x >= 0x0800 && x <= 0x4E00) || (x >= 0xAC00 && x <= 0xD7FF));
            });
            one(number);
            break;
        }
        case kPreLlama3:
        case kPreQwen2:
        case kPreQwen35:
            each([&](size_t b, size_t e, Pieces *out) { split_llama3(c, b, e, pre == kPreLlama3 ? 3 : 1, pre == kPreQwen35, out); });
            break;
    }
    return pcs;
}

// ---------------------------------------------------------------- GPT-2's byte map

struct ByteMap {
    std::string enc[256];  // byte -> its printable character (UTF-8)
    ByteMap() {
        uint32_t next = 256;
        for (unsigned x = 0; x < 256; x++) {
            const bool keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
            utf8_put(keep ? x : next++, &enc[x]);
        }
    }
};
const ByteMap &byte_map() {
    static const ByteMap m;
    return m;
}

int char_byte(uint32_t cp) {
    static const struct Rev {
        int16_t t[512];
        Rev() {
            for (int16_t &v : t) v = -1;
            for (unsigned b = 0; b < 256; b++) {
                uint32_t c;
                const std::string &s = byte_map().enc[b];
                utf8_next(s, 0, s.size(), &c);
                t[c] = (int16_t)b;
            }
        }
    } rev;
    return cp < 512 ? rev.t[cp] : -1;
}

// ---------------------------------------------------------------- merge loops

// A symbol: bytes [b, b + n) of the word; n == 0 once merged into its left neighbour.
struct Sym {
    uint32_t b, n;
    int32_t prev, next;
};

// A candidate pair: symbol `left` and its right neighbour, `size` bytes together when queued. It is
// still valid while left.n + right.n == size with both non-empty (a symbol only grows by taking its
// right neighbour, so any merge touching either changes the sum or empties one of them). key is
// priority << 32 | left: the smallest key merges first (priority: BPE rank, SentencePiece score
// order), the leftmost pair on ties.
struct Pair {
    uint64_t key;
    uint32_t size;
    int32_t left() const { return (int32_t)(uint32_t)key; }
};

bool valid(const std::vector<Sym> &sym, const Pair &p) {
    const Sym &l = sym[(size_t)p.left()];
    return l.n != 0 && l.next >= 0 && sym[(size_t)l.next].n != 0 && l.n + sym[(size_t)l.next].n == p.size;
}

std::vector<Sym> split_chars(const std::string &w) {
    std::vector<Sym> sym;
    sym.reserve(w.size());
    for (size_t i = 0; i < w.size();) {
        const size_t n = std::min(utf8_len(w[i]), w.size() - i);
        sym.push_back({(uint32_t)i, (uint32_t)n, (int32_t)sym.size() - 1, (int32_t)sym.size() + 1});
        i += n;
    }
    if (!sym.empty()) sym.back().next = -1;
    return sym;
}

void merge(std::vector<Sym> &sym, int32_t left) {
    Sym &l = sym[(size_t)left];
    Sym &r = sym[(size_t)l.next];
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[(size_t)r.next].prev = left;
}

// A 4-ary min-heap of pairs by key (shallower and more cache-friendly than a binary heap: a run of
// one character queues a pair per character).
class PairHeap {
public:
    explicit PairHeap(std::vector<Pair> v) : h_(std::move(v)) {
        for (size_t i = h_.size(); i-- > 0;) down(i);
    }
    void push(const Pair &p) {
        h_.push_back(p);
        size_t i = h_.size() - 1;
        while (i > 0) {
            const size_t up = (i - 1) / 4;
            if (h_[up].key <= p.key) break;
            h_[i] = h_[up];
            i = up;
        }
        h_[i] = p;
    }
    bool pop(Pair *top) {
        if (h_.empty()) return false;
        *top = h_[0];
        h_[0] = h_.back();
        h_.pop_back();
        if (!h_.empty()) down(0);
        return true;
    }

private:
    void down(size_t i) {
        const Pair p = h_[i];
        const size_t n = h_.size();
        for (;;) {
            const size_t c = 4 * i + 1;
            if (c >= n) break;
            size_t best = c;
            const size_t end = std::min(c + 4, n);
            for (size_t j = c + 1; j < end; j++)
                if (h_[j].key < h_[best].key) best = j;
            if (h_[best].key >= p.key) break;
            h_[i] = h_[best];
            i = best;
        }
        h_[i] = p;
    }
    std::vector<Pair> h_;
};

// The same order for long words: one bucket per priority, each a run of pairs queued in increasing
// `left` (consumed from its head) plus a heap for the pairs queued out of that order, and a heap of
// the priorities with pairs. A run of one character queues its pairs almost always in order, so
// most pushes and pops take O(1) instead of a walk down a heap of a million pairs.
class BucketQueue {
public:
    explicit BucketQueue(const std::vector<Pair> &seed) {
        for (const Pair &p : seed) push(p);
    }
    void push(const Pair &p) {
        const uint32_t prio = (uint32_t)(p.key >> 32);
        auto it = index_.find(prio);
        if (it == index_.end()) {
            it = index_.emplace(prio, (uint32_t)buckets_.size()).first;
            buckets_.emplace_back();
        }
        Bucket &b = buckets_[it->second];
        if (b.head == b.run.size()) {
            b.run.clear();
            b.head = 0;
        }
        if (b.run.empty() || p.key > b.run.back().key) {
            b.run.push_back(p);
        } else {
            b.heap.push_back(p);
            std::push_heap(b.heap.begin(), b.heap.end(), later);
        }
        if (!b.queued) {
            b.queued = true;
            prios_.push_back((uint64_t)prio << 32 | it->second);
            std::push_heap(prios_.begin(), prios_.end(), std::greater<uint64_t>());
        }
    }
    bool pop(Pair *top) {
        while (!prios_.empty()) {
            Bucket &b = buckets_[(uint32_t)prios_.front()];
            const bool in_run = b.head < b.run.size(), in_heap = !b.heap.empty();
            if (!in_run && !in_heap) {
                b.queued = false;
                std::pop_heap(prios_.begin(), prios_.end(), std::greater<uint64_t>());
                prios_.pop_back();
                continue;
            }
            if (in_run && (!in_heap || b.run[b.head].key < b.heap.front().key)) {
                *top = b.run[b.head++];
            } else {
                *top = b.heap.front();
                std::pop_heap(b.heap.begin(), b.heap.end(), later);
                b.heap.pop_back();
            }
            return true;
        }
        return false;
    }

private:
    static bool later(const Pair &a, const Pair &b) { return a.key > b.key; }
    struct Bucket {
        std::vector<Pair> run, heap;
        size_t head = 0;
        bool queued = false;
    };
    std::vector<Bucket> buckets_;
    std::unordered_map<uint32_t, uint32_t> index_;
    std::vector<uint64_t> prios_;  // priority << 32 | bucket, of the buckets with pairs
};

// Pops pairs in key order, merges the valid ones and queues the pairs they make.
template <class Queue, class PairOf, class Merged>
void merge_with(std::vector<Sym> &sym, Queue &heap, PairOf pair_of, Merged merged) {
    Pair top, p;
    while (heap.pop(&top)) {
        if (!valid(sym, top)) continue;
        const int32_t l = top.left();
        merge(sym, l);
        merged(l);
        const int32_t prev = sym[(size_t)l].prev;
        if (prev >= 0 && pair_of(prev, &p)) heap.push(p);
        if (sym[(size_t)l].next >= 0 && pair_of(l, &p)) heap.push(p);
    }
}

// The merge loop, seeded with every adjacent pair. prio(l, &priority, &size) tells whether symbol l
// merges with its right neighbour; merged(l) runs after each merge into l.
template <class Prio, class Merged>
void merge_loop(std::vector<Sym> &sym, Prio prio, Merged merged) {
    auto pair_of = [&](int32_t l, Pair *p) {
        uint32_t pr, size;
        if (!prio(l, &pr, &size)) return false;
        p->key = (uint64_t)pr << 32 | (uint32_t)l;
        p->size = size;
        return true;
    };
    std::vector<Pair> seed;
    seed.reserve(sym.size());
    Pair p;
    for (size_t i = 0; i + 1 < sym.size(); i++)
        if (pair_of((int32_t)i, &p)) seed.push_back(p);
    if (sym.size() >= 256) {
        BucketQueue q(seed);
        merge_with(sym, q, pair_of, merged);
    } else {
        PairHeap q(std::move(seed));
        merge_with(sym, q, pair_of, merged);
    }
}

}  // namespace

// ---------------------------------------------------------------- construction

std::string Tokenizer::supported_pre() {
    std::string s;
    for (const PreName &p : kPreNames) s += (s.empty() ? "" : ", ") + std::string(p.name);
    return s;
}

void Tokenizer::set_strip(int32_t id, bool lstrip, bool rstrip) {
    if (id < 0 || id >= size()) return;
    strip_[(size_t)id] = (uint8_t)((lstrip ? 1 : 0) | (rstrip ? 2 : 0));
}

bool Tokenizer::build(Kind kind, const std::string &pre, std::vector<std::string> pieces, std::vector<float> scores,
                      std::vector<int32_t> types, const std::vector<std::string> &merges,
                      std::shared_ptr<const Tokenizer> *out, std::string *err) {
    auto t = std::make_shared<Tokenizer>();
    t->kind_ = kind;
    t->model_ = kind == kSpm ? "llama" : "gpt2";
    t->pre_ = pre;
    if (kind == kBpe) {
        bool ok = false;
        for (const PreName &p : kPreNames)
            if (pre == p.name) {
                t->pre_id_ = p.pre;
                t->ignore_merges = p.pre == kPreLlama3;
                ok = true;
            }
        if (!ok) {
            *err = "tokenizer pre-tokenizer '" + gguf_shown(pre) + "' is not supported (supported: " + supported_pre() + ")";
            return false;
        }
    }
    scores.resize(pieces.size(), 0.0f);
    types.resize(pieces.size(), 1);
    // llama.cpp makes every end-of-generation token a control token, whatever the file's type (so
    // "</s>", user-defined in Phi-3's file, is text without parse_special)
    static const char *const kEog[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                                       "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
                                       "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
                                       "<turn|>", "<|tool_response>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
                                       "[e~["};
    for (size_t i = 0; i < pieces.size(); i++)
        for (const char *e : kEog)
            if (pieces[i] == e) types[i] = 3;
    for (size_t i = 0; i < pieces.size(); i++)
        if (pieces[i].empty()) pieces[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    t->pieces_ = std::move(pieces);
    t->scores_ = std::move(scores);
    t->types_ = std::move(types);
    t->strip_.assign(t->pieces_.size(), 0);
    {  // each piece's score as a rank: 0 for the highest score, equal scores equal ranks (NaN last)
        std::vector<float> order;
        for (float x : t->scores_)
            if (x == x) order.push_back(x);
        std::sort(order.begin(), order.end(), [](float a, float b) { return a > b; });
        order.erase(std::unique(order.begin(), order.end()), order.end());
        t->score_order_.resize(t->scores_.size());
        for (size_t i = 0; i < t->scores_.size(); i++) {
            const float x = t->scores_[i];
            t->score_order_[i] = x == x ? (uint32_t)(std::lower_bound(order.begin(), order.end(), x, [](float a, float b) { return a > b; }) -
                                                     order.begin())
                                        : (uint32_t)order.size();
        }
    }
    for (int i = 0; i < 256; i++) t->byte_tok_[i] = -1;
    t->ids_.reserve(t->pieces_.size());
    for (size_t i = 0; i < t->pieces_.size(); i++) {
        const std::string &p = t->pieces_[i];
        t->ids_[std::string_view(p)] = (int32_t)i;
        // "<0xHH>": two hex digits exactly (sscanf's %x would also take a sign: "<0x-1>" gave 0xffffffff)
        auto hex = [](char ch) { return std::isxdigit((unsigned char)ch) != 0; };
        if (kind == kSpm && p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && hex(p[3]) && hex(p[4])) {
            const unsigned b = (unsigned)std::stoul(p.substr(3, 2), nullptr, 16);
            if (b < 256 && t->byte_tok_[b] < 0) t->byte_tok_[b] = (int32_t)i;
        }
        // control (3), user-defined (4) and unknown (2) tokens split the text first
        if (t->types_[i] == 2 || t->types_[i] == 3 || t->types_[i] == 4) t->specials_.push_back((int32_t)i);
    }
    if (kind == kSpm)  // llama.cpp looks "<0xXX>" up by text (upper-case hex, the last such piece)
        for (int b = 0; b < 256; b++) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            const int32_t id = t->find(name);
            if (id >= 0) t->byte_tok_[b] = id;
        }
    std::stable_sort(t->specials_.begin(), t->specials_.end(),
                     [&](int32_t a, int32_t b) { return t->pieces_[(size_t)a].size() > t->pieces_[(size_t)b].size(); });
    // merges: "left right", split at the first space after the first byte (as llama.cpp); the
    // halves are interned (part_id_ holds views into merge_parts_, which never reallocates)
    t->merge_parts_.reserve(2 * merges.size());
    auto intern = [&](std::string_view h) {
        auto it = t->part_id_.find(h);
        if (it != t->part_id_.end()) return it->second;
        t->merge_parts_.emplace_back(h);
        const int32_t id = (int32_t)t->merge_parts_.size() - 1;
        t->part_id_.emplace(std::string_view(t->merge_parts_.back()), id);
        return id;
    };
    t->merge_rank_.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); r++) {
        const std::string_view m(merges[r]);
        const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
        const std::string_view a = sp == std::string_view::npos ? std::string_view() : m.substr(0, sp);
        const std::string_view b = sp == std::string_view::npos ? std::string_view() : m.substr(sp + 1);
        const uint64_t key = (uint64_t)(uint32_t)intern(a) << 32 | (uint32_t)intern(b);
        t->merge_rank_.emplace(key, (int32_t)r);  // the first rank of a repeated merge
    }
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
    if (model == "none" || model == "no_vocab") return true;  // llama.cpp's "no tokenizer" (LLAMA_VOCAB_TYPE_NONE)
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
    if (pieces.empty() || (vocab > 0 && pieces.size() > (size_t)vocab)) {
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
    // llama.cpp's defaults: SentencePiece BOS 1, EOS 2, BOS added; byte-level BPE BOS = EOS = 11,
    // BOS added for the llama3 names only. The file's keys override them.
    int64_t v;
    m->bos = kind == kSpm ? 1 : 11;
    m->eos = kind == kSpm ? 2 : 11;
    if (f.get_int("tokenizer.ggml.bos_token_id", &v)) m->bos = v >= 0 && v < m->size() ? (int32_t)v : -1;
    if (f.get_int("tokenizer.ggml.eos_token_id", &v)) m->eos = v >= 0 && v < m->size() ? (int32_t)v : -1;
    if (m->bos >= m->size()) m->bos = -1;
    if (m->eos >= m->size()) m->eos = -1;
    bool b;
    m->add_bos = kind == kSpm || m->pre_id_ == kPreLlama3;
    m->add_space_prefix = kind == kSpm;
    if (f.get_bool("tokenizer.ggml.add_bos_token", &b)) m->add_bos = b;
    if (f.get_bool("tokenizer.ggml.add_space_prefix", &b)) m->add_space_prefix = b;
    if (m->bos < 0) m->add_bos = false;
    // phi-3: special tokens eat the spaces after them, except <unk>, <s>, <|endoftext|> (llama.cpp,
    // by general.name)
    std::string name;
    if (f.get_str("general.name", &name)) {
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return (char)std::tolower(ch); });
        if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
            for (int32_t id : m->specials_) m->set_strip(id, false, true);
            m->set_strip(m->find("</s>"), false, true);
            for (const char *s : {"<unk>", "<s>", "<|endoftext|>"}) m->set_strip(m->find(s), false, false);
        }
    }
    *out = t;
    return true;
}

// ---------------------------------------------------------------- SentencePiece

void Tokenizer::encode_spm(const std::string &text, std::vector<int32_t> *out) const {
    std::vector<Sym> sym = split_chars(text);
    const std::string_view tv(text);
    merge_loop(
        sym,
        [&](int32_t l, uint32_t *prio, uint32_t *size) {
            const uint32_t n = sym[(size_t)l].n + sym[(size_t)sym[(size_t)l].next].n;
            const int32_t id = find(tv.substr(sym[(size_t)l].b, n));
            if (id < 0) return false;
            *prio = score_order_[(size_t)id];
            *size = n;
            return true;
        },
        [](int32_t) {});
    for (int32_t i = sym.empty() ? -1 : 0; i != -1; i = sym[(size_t)i].next) {
        const std::string_view piece = std::string_view(text).substr(sym[(size_t)i].b, sym[(size_t)i].n);
        const int32_t id = find(piece);
        if (id >= 0) {
            out->push_back(id);
            continue;
        }
        for (unsigned char ch : piece) {  // byte fallback: <0xXX>, else the byte as a piece, else unknown
            int32_t bt = byte_tok_[ch];
            if (bt < 0) bt = find(std::string_view(reinterpret_cast<const char *>(&ch), 1));
            out->push_back(bt >= 0 ? bt : 0);
        }
    }
}

// ---------------------------------------------------------------- byte-level BPE

std::vector<std::string> Tokenizer::pre_split(const std::string &text) const {
    const Cps c = code_points(text);
    const Pieces pcs = pre_pieces((Pre)pre_id_, c);
    std::vector<std::string> words;
    size_t k = 0;
    for (size_t n : pcs) {
        std::string w;
        for (size_t j = 0; j < n; j++) utf8_put(c.cp[k + j], &w);
        words.push_back(std::move(w));
        k += n;
    }
    return words;
}

void Tokenizer::bpe_word(const std::string &word, std::vector<int32_t> *out) const {
    if (ignore_merges) {
        const int32_t id = find(word);
        if (id >= 0) {
            out->push_back(id);
            return;
        }
    }
    std::vector<Sym> sym = split_chars(word);
    std::vector<int32_t> part(sym.size());  // each symbol's merge-part id (-1: in no merge)
    auto part_of = [&](const Sym &s) {
        auto it = part_id_.find(std::string_view(word).substr(s.b, s.n));
        return it == part_id_.end() ? -1 : it->second;
    };
    for (size_t i = 0; i < sym.size(); i++) part[i] = part_of(sym[i]);
    merge_loop(
        sym,
        [&](int32_t l, uint32_t *prio, uint32_t *size) {
            const int32_t r = sym[(size_t)l].next;
            if (part[(size_t)l] < 0 || part[(size_t)r] < 0) return false;
            auto it = merge_rank_.find((uint64_t)(uint32_t)part[(size_t)l] << 32 | (uint32_t)part[(size_t)r]);
            if (it == merge_rank_.end()) return false;
            *prio = (uint32_t)it->second;
            *size = sym[(size_t)l].n + sym[(size_t)r].n;
            return true;
        },
        [&](int32_t l) { part[(size_t)l] = part_of(sym[(size_t)l]); });
    for (int32_t i = sym.empty() ? -1 : 0; i != -1; i = sym[(size_t)i].next) {
        const std::string_view s = std::string_view(word).substr(sym[(size_t)i].b, sym[(size_t)i].n);
        const int32_t id = find(s);
        if (id >= 0) {
            out->push_back(id);
            continue;
        }
        for (char ch : s) {  // llama.cpp's fallback: each byte of the mapped text as a one-byte piece
            const int32_t bt = find(std::string_view(&ch, 1));
            if (bt >= 0) out->push_back(bt);
        }
    }
}

void Tokenizer::encode_bpe(const std::string &text, std::vector<int32_t> *out) const {
    const Cps c = code_points(text);
    const Pieces pcs = pre_pieces((Pre)pre_id_, c);
    const ByteMap &bm = byte_map();
    std::string raw, w;
    size_t k = 0;
    for (size_t n : pcs) {
        raw.clear();
        for (size_t j = 0; j < n; j++) utf8_put(c.cp[k + j], &raw);
        k += n;
        w.clear();
        for (unsigned char ch : raw) w += bm.enc[ch];
        bpe_word(w, out);
    }
}

// ---------------------------------------------------------------- encode / decode

std::vector<int32_t> Tokenizer::encode(const std::string &text, bool with_bos, bool space_prefix, bool parse_special) const {
    std::vector<int32_t> out;
    if (with_bos && bos >= 0) out.push_back(bos);
    // Fragments: raw text [b, e) (id < 0) or a special token. Each special token in turn (longest
    // first) splits every raw fragment at its occurrences, leftmost first.
    struct Frag {
        size_t b, e;
        int32_t id;
    };
    std::vector<Frag> frags;
    if (!text.empty()) frags.push_back({0, text.size(), -1});
    const std::string_view tv(text);
    for (int32_t sid : specials_) {
        const int32_t ty = types_[(size_t)sid];
        if (!parse_special && (ty == 3 || ty == 2)) continue;  // only user-defined tokens without parse_special
        const std::string &st = pieces_[(size_t)sid];
        std::vector<Frag> next;
        bool hit = false;
        for (const Frag &f : frags) {
            if (f.id >= 0) {
                next.push_back(f);
                continue;
            }
            size_t b = f.b;
            const size_t e = f.e;
            for (;;) {
                const size_t m = tv.substr(0, e).find(st, b);
                if (m == std::string_view::npos) break;
                hit = true;
                size_t le = m;
                if (strip_[(size_t)sid] & 1)
                    while (le > b && std::isspace((unsigned char)text[le - 1])) le--;
                if (le > b) next.push_back({b, le, -1});
                next.push_back({m, m + st.size(), sid});
                b = m + st.size();
                if (strip_[(size_t)sid] & 2)
                    while (b < e && std::isspace((unsigned char)text[b])) b++;
            }
            if (b < e) next.push_back({b, e, -1});
        }
        if (hit) frags.swap(next);
    }
    bool prev_special = true;
    for (const Frag &f : frags) {
        if (f.id >= 0) {
            out.push_back(f.id);
            prev_special = true;
            continue;
        }
        if (kind_ == kSpm) {
            std::string s;
            if (prev_special && (&f == &frags.front() ? space_prefix : add_space_prefix)) s = "\xE2\x96\x81";
            s.reserve(f.e - f.b + 16);
            for (size_t i = f.b; i < f.e; i++) {
                if (text[i] == ' ') s += "\xE2\x96\x81";
                else s.push_back(text[i]);
            }
            encode_spm(s, &out);
        } else {
            encode_bpe(text.substr(f.b, f.e - f.b), &out);
        }
        prev_special = false;
    }
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
