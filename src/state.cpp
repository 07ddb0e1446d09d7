#include "state.h"

#include <stddef.h>
#include <string.h>

#include "config.h"
#include "draft.h"
#include "policies/asl.h"
#include "prompt.h"

#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define KVP_STATE_X86 1
#include <immintrin.h>
#else
#define KVP_STATE_X86 0
#endif

namespace kvp {
namespace {

// ---- bulk paths (the same bytes and checksum as the plain loops; DECISIONS.md "State bandwidth") ----

// Pieces at least this long (a q8 block of rows is about 2 KiB) are copied with non-temporal stores: a state of hundreds of MB does not
// fit any cache, and streaming stores skip the read-for-ownership of every destination line (what
// memcpy does for copies this large), so a save or load moves each byte once each way.
constexpr size_t kStreamBytes = 1024;

#if KVP_STATE_X86
#if defined(KVP_HAVE_AVX512)
int g_avx512dq = 0;  // 0 not yet, 1 no, 2 yes (no function-local static: its guard is C++ runtime)
#endif
bool cpu_avx512dq() {
#if defined(KVP_HAVE_AVX512)
    int v = __atomic_load_n(&g_avx512dq, __ATOMIC_RELAXED);
    if (!v) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? 2 : 1;
        __atomic_store_n(&g_avx512dq, v, __ATOMIC_RELAXED);
    }
    return v == 2;
#else
    return false;
#endif
}

// dst[0..n) = src[0..n): the whole 64-byte lines of dst with 16-byte streaming stores (SSE2: every
// x86-64), the partial lines at either end with ordinary stores (a line half written by streaming
// stores is flushed as a partial write: slow); the caller fences (stream_fence) before anything
// else reads dst.
void stream_copy(uint8_t *dst, const uint8_t *src, size_t n) {
    const size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
    if (head >= n) {
        memcpy(dst, src, n);
        return;
    }
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 32));
        const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 48));
        _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i), a);
        _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
}
void stream_fence() { _mm_sfence(); }
#else
void stream_copy(uint8_t *dst, const uint8_t *src, size_t n) { memcpy(dst, src, n); }
void stream_fence() {}
#endif

constexpr char kMagic8[8] = {'K', 'V', 'P', 'S', 'T', 'A', 'T', 'E'};
constexpr size_t kHeaderFixed = 40;
constexpr uint32_t kConfigWords = uint32_t((sizeof(kvp_config) - sizeof(uint32_t)) / sizeof(uint32_t));
static_assert(sizeof(kvp_config) % sizeof(uint32_t) == 0, "kvp_config is made of 32-bit fields");
// The first kvp_config a state was written with (up to max_draft, issue 21): fewer words are not a state.
constexpr uint32_t kConfigFirstWords = uint32_t(offsetof(kvp_config, max_draft) / sizeof(uint32_t));

bool host_little_endian() {
    const uint32_t x = 1;
    uint8_t b;
    memcpy(&b, &x, 1);
    return b == 1;
}

void put_le(uint8_t *p, uint64_t v, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint64_t get_le(const uint8_t *p, uint32_t n) {
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}

// The format's checksum, streamed: eight independent 64-bit lanes over 64-byte stripes, each
// word folded in as lane = rotl((lane ^ w) * P1, 29) (a bijection of the lane for a fixed word, so
// any change confined to one word always changes the result), the lanes then mixed with the
// length and the tail bytes. One multiply per 8 bytes in eight independent chains runs at memory
// speed, and a save feeds it each piece right after writing it (still in cache): the checksum
// costs no second pass over the state.
struct Hasher {
    static constexpr uint64_t P1 = 0x9e3779b185ebca87ull, P2 = 0xc2b2ae3d27d4eb4full, P3 = 0x165667b19e3779f9ull;
    uint64_t v[8] = {P1, P2, P3, P1 ^ P2, P2 ^ P3, P1 ^ P3, P1 + P2, P2 + P3};
    uint64_t n = 0;
    uint8_t tail[64];
    uint32_t nt = 0;
    static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
    void stripe(const uint8_t *p) {
        uint64_t w[8];
        memcpy(w, p, 64);
        for (int i = 0; i < 8; ++i) v[i] = rotl((v[i] ^ w[i]) * P1, 29);
    }
    // ns whole stripes: the eight lanes in one AVX-512 register where the CPU has AVX512DQ (its
    // 64-bit multiply: the same products), else the scalar stripe.
    void stripes(const uint8_t *p, size_t ns);
    void update(const void *data, size_t len) {
        const uint8_t *p = static_cast<const uint8_t *>(data);
        n += len;
        if (nt) {
            const size_t k = len < 64 - nt ? len : 64 - nt;
            memcpy(tail + nt, p, k);
            nt += uint32_t(k);
            p += k;
            len -= k;
            if (nt < 64) return;
            stripe(tail);
            nt = 0;
        }
        stripes(p, len / 64);
        p += len / 64 * 64;
        len %= 64;
        memcpy(tail, p, len);
        nt = uint32_t(len);
    }
    uint64_t final() const {
        uint64_t h = n * P3;
        for (int i = 0; i < 8; ++i) h = rotl(h ^ (v[i] * P2), 27) * P1;
        for (uint32_t i = 0; i < nt; ++i) h = rotl(h ^ (uint64_t(tail[i]) * P3), 11) * P1;
        h ^= h >> 33;
        h *= P2;
        h ^= h >> 29;
        return h;
    }
};

#if KVP_STATE_X86 && defined(KVP_HAVE_AVX512)
// GCC 12's _mm512_set1_epi64 starts from an undefined vector (a false maybe-uninitialized).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512dq"))) void stripes_avx512(uint64_t *v, const uint8_t *p, size_t ns) {
    __m512i acc = _mm512_loadu_si512(v);
    const __m512i k = _mm512_set1_epi64(int64_t(Hasher::P1));
    for (size_t i = 0; i < ns; ++i)
        acc = _mm512_rol_epi64(_mm512_mullo_epi64(_mm512_xor_si512(acc, _mm512_loadu_si512(p + 64 * i)), k), 29);
    _mm512_storeu_si512(v, acc);
}
#pragma GCC diagnostic pop
#endif

void Hasher::stripes(const uint8_t *p, size_t ns) {
#if KVP_STATE_X86 && defined(KVP_HAVE_AVX512)
    if (cpu_avx512dq()) {
        stripes_avx512(v, p, ns);
        return;
    }
#endif
    for (size_t i = 0; i < ns; ++i) stripe(p + 64 * i);
}

// The archive: sizes (no buffer), writes, checks a buffer without touching the cache (dry), or
// loads it. Scalars go through locals (value-by-reference): written from them, read into them.
struct Ar {
    enum Mode { kSize, kWrite, kCheck, kLoad } mode;
    uint8_t *w = nullptr;        // kWrite
    const uint8_t *r = nullptr;  // kCheck, kLoad
    size_t pos = 0, end = 0;     // read bound (kCheck / kLoad)
    bool ok = true;
    Msg *m = nullptr;
    Hasher *hash = nullptr;      // kWrite: fed every piece as it is written; kCheck: every piece read
    struct Val *val = nullptr;   // kCheck: the deep checks of a crafted state (Val below)

    bool reading() const { return mode == kCheck || mode == kLoad; }
    bool loading() const { return mode == kLoad; }
    bool take(size_t n) {  // room for n more bytes to read
        if (!ok) return false;
        if (reading() && end - pos < n) {
            fail("the buffer ends inside the state (truncated)");
            return false;
        }
        return true;
    }
    void fail(const char *why) {
        if (ok && m) m->s(why);
        ok = false;
    }
    void require(bool cond, const char *why) {
        if (!cond) fail(why);
    }
    void scalar(uint64_t &v, uint32_t n) {
        if (!take(n)) return;
        if (mode == kWrite) {
            put_le(w + pos, v, n);
            if (hash) hash->update(w + pos, n);
        }
        else if (reading()) {
            v = get_le(r + pos, n);
            if (mode == kCheck && hash) hash->update(r + pos, n);
        }
        pos += n;
    }
    template <class T>
    void u(T &x) {  // unsigned or signed integers up to 64 bits
        uint64_t v = uint64_t(x);
        scalar(v, sizeof(T));
        if (reading()) x = T(v);
    }
    void f(float &x) {
        uint32_t b;
        memcpy(&b, &x, 4);
        u(b);
        if (reading()) memcpy(&x, &b, 4);
    }
    void flag(bool &x) {
        uint32_t v = x;
        u(v);
        require(!reading() || v <= 1, "a flag is neither 0 nor 1");  // a loaded state saves back the same bytes
        if (reading()) x = v != 0;
    }
    // n bytes of fixed-width little-endian data (the host is little-endian: state_save refuses others).
    // Large pieces: hashed from the source (the same bytes), then streamed out (stream_copy).
    void bytes(void *p, size_t n) {
        if (!take(n)) return;
        if (mode == kWrite) {
            if (n >= kStreamBytes) {
                if (hash) hash->update(p, n);
                stream_copy(w + pos, static_cast<const uint8_t *>(p), n);
            } else {
                memcpy(w + pos, p, n);
                if (hash) hash->update(w + pos, n);
            }
        } else if (mode == kLoad) {
            if (n >= kStreamBytes) stream_copy(static_cast<uint8_t *>(p), r + pos, n);
            else memcpy(p, r + pos, n);
        } else if (mode == kCheck && hash) {
            hash->update(r + pos, n);
        }
        pos += n;
    }
};

// n stored K/V rows of `width` floats (head_dim, or a ThinK row's padded width): each finite with
// an L2 norm of at most sqrt(head_dim) * 2^57, the most a row can have when every input is below
// KVP_INPUT_LIMIT = 2^56 (RoPE rotates pairs: |x| < sqrt(2) * 2^56 per element; kv_rotate's
// Hadamard transform keeps the norm). Then every q.k stays below 2^124 (Cauchy-Schwarz) and every
// output below the largest |v|: attention over loaded rows is as finite as over the caller's.
// NaN and Inf rows fail too: their sum of squares is NaN or Inf. The sum is formed in float over
// eight lanes (vectorizable without reassociation); a row the library stores has a sum below a
// quarter of the bound (each RoPE pair's squared norm < 2^113), so rounding cannot refuse one,
// and a sum that overflows is Inf: refused.
bool rows_ok(const uint8_t *p, size_t rows, size_t width, uint32_t hd) {
    const float bound = float(hd) * 0x1p114f;
    for (size_t r = 0; r < rows; ++r) {
        const uint8_t *row = p + 4 * r * width;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x[8];
        size_t i = 0;
        for (; i + 8 <= width; i += 8) {
            memcpy(x, row + 4 * i, sizeof x);  // little-endian host (state_load refuses others)
            for (int k = 0; k < 8; ++k) acc[k] += x[k] * x[k];
        }
        for (; i < width; ++i) {
            memcpy(x, row + 4 * i, 4);
            acc[0] += x[0] * x[0];
        }
        const float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        if (!(ss <= bound)) return false;
    }
    return true;
}
bool f16_finite(const uint8_t *p, size_t n) {  // n halves
    for (size_t i = 0; i < n; ++i)
        if ((get_le(p + 2 * i, 2) & 0x7c00u) == 0x7c00u) return false;
    return true;
}

// kCheck's deep checks (issue 29, DECISIONS.md "Crafted states"): the checksum only detects
// accidents (anyone can recompute it), so a state must also describe a cache that every later
// call can run on: every structural field against the others and the cache's geometry (block
// ownership, free stacks, sequence words, dead-slot counts, positions, rotations, residuals,
// channel lists, counters) and every stored float finite. Values are read from the buffer at the
// offsets the walk records (the layer and pool records have fixed sizes). Block ownership is a
// bitmap over (pool, block) ids in thread 0's per-call scratch (from its run buffer on: no state
// lives there, so a refused load leaves every saved byte as it was); when the scratch is smaller
// than the bitmap, the walk repeats over windows of ids.
struct Val {
    const kvp_cache *c;
    const uint8_t *r;
    uint64_t *bits;
    uint64_t lo, nbits;  // this pass marks ids [lo, lo + nbits) (id = pool * nblocks + block)
    size_t body0 = 0, layer0 = 0, layer_rec = 0, pool0 = 0, pool_rec = 0;
    uint64_t rows = 0, bytes = 0, sum_rows = 0, sum_bytes = 0;  // kept tokens and live bytes: layer, cache
    uint64_t pool_blocks = 0;  // free and held blocks of the pools checked so far

    uint32_t u32(size_t off) const { return uint32_t(get_le(r + off, 4)); }
    uint64_t u64(size_t off) const { return get_le(r + off, 8); }
    size_t pool_at(uint32_t h) const { return pool0 + size_t(h) * pool_rec; }
    // pool record: nfree, deficit, then per block (next, dead, bseq), then per layer (top, held)
    int32_t next(uint32_t h, uint32_t b) const { return int32_t(u32(pool_at(h) + 8 + 12 * size_t(b))); }
    uint32_t dead(uint32_t h, uint32_t b) const { return u32(pool_at(h) + 12 + 12 * size_t(b)); }
    uint32_t bseq(uint32_t h, uint32_t b) const { return u32(pool_at(h) + 16 + 12 * size_t(b)); }
    int32_t top(uint32_t h, uint32_t l) const {
        return int32_t(u32(pool_at(h) + 8 + 12 * size_t(c->plan.nblocks) + 8 * size_t(l)));
    }
    uint32_t held(uint32_t h, uint32_t l) const { return u32(pool_at(h) + 12 + 12 * size_t(c->plan.nblocks) + 8 * size_t(l)); }
    // layer record: next_pos i64, rows u64, bytes u64, ...
    int64_t next_pos(uint32_t l) const { return int64_t(u64(layer0 + size_t(l) * layer_rec)); }
    uint64_t layer_rows(uint32_t l) const { return u64(layer0 + size_t(l) * layer_rec + 8); }
    uint64_t layer_bytes(uint32_t l) const { return u64(layer0 + size_t(l) * layer_rec + 16); }
    // Where heads lend (pool.h "Lending") a store or free stack may name any pool's block: ids are
    // saved over all pools (pool * nblocks + block), and a block's record is its own pool's.
    uint32_t owner(uint32_t h, uint32_t b) const { return c->plan.lend ? b / c->plan.nblocks : h; }
    uint32_t local(uint32_t b) const { return c->plan.lend ? b % c->plan.nblocks : b; }
    uint32_t dead_of(uint32_t h, uint32_t b) const { return dead(owner(h, b), local(b)); }
    uint32_t bseq_of(uint32_t h, uint32_t b) const { return bseq(owner(h, b), local(b)); }
    bool mark_of(uint32_t h, uint32_t b) { return mark(owner(h, b), local(b)); }
    // Marks block b of pool h as taken; false when it already was (two owners).
    bool mark(uint32_t h, uint32_t b) {
        const uint64_t id = uint64_t(h) * c->plan.nblocks + b;
        if (id < lo || id - lo >= nbits) return true;
        const uint64_t i = id - lo, bit = uint64_t(1) << (i % 64);
        if (bits[i / 64] & bit) return false;
        bits[i / 64] |= bit;
        return true;
    }
};

// Ascending channel list of n entries below d; with pairs: every RoPE pair kept whole (ThinK).
bool channels_ok(const uint8_t *p, uint32_t n, uint32_t d, uint32_t pairs, bool gptj) {
    uint8_t in[kMaxFmtDim / 8] = {};
    int64_t prev = -1;
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t ch = uint32_t(get_le(p + 2 * size_t(i), 2));
        if (int64_t(ch) <= prev || ch >= d || ch >= kMaxFmtDim) return false;
        prev = ch;
        in[ch / 8] = uint8_t(in[ch / 8] | (1u << (ch % 8)));
    }
    for (uint32_t i = 0; i < n && pairs; ++i) {
        const uint32_t ch = uint32_t(get_le(p + 2 * size_t(i), 2));
        if (ch >= 2 * pairs) continue;
        const uint32_t mate = gptj ? ch ^ 1u : ch < pairs ? ch + pairs : ch - pairs;
        if (!(in[mate / 8] & (1u << (mate % 8)))) return false;
    }
    return true;
}

// A pool's free stacks and counters (kCheck, after its record was read).
void pool_check(Ar &ar, Val &v, uint32_t h) {
    const kvp_cache *c = v.c;
    const BlockPool &pool = c->pools[h];
    const uint32_t L = c->cfg.model.n_layers, nb = c->plan.nblocks;
    const bool lend = c->plan.lend;
    const uint64_t ids = lend ? uint64_t(nb) * c->cfg.model.n_kv_heads : nb;
    uint64_t held = 0, deficit = 0, nfree = 0;
    for (uint32_t l = 0; l < L; ++l) {
        const uint32_t hl = v.held(h, l);
        held += hl;
        deficit += hl < pool.min_blocks[l] ? pool.min_blocks[l] - hl : 0;
    }
    ar.require(deficit == v.u32(v.pool_at(h) + 4), "a pool's reservation deficit does not match its layers' blocks");
    for (uint32_t l = 0; l < L && ar.ok; ++l) {
        const uint32_t lo = pool.home_lo[l], hi = pool.home_lo[l + 1];
        uint32_t n = 0;
        for (int32_t b = v.top(h, l); b != -1 && ar.ok; b = v.next(v.owner(h, uint32_t(b)), v.local(uint32_t(b))), ++n) {
            // lent blocks may sit in any home (the marks still catch a loop or a second listing)
            ar.require(lend ? uint64_t(b) < ids && n < ids : uint32_t(b) >= lo && uint32_t(b) < hi && n < hi - lo,
                       "a pool's free stack leaves its home range or loops");
            if (!ar.ok) break;
            ar.require(v.dead_of(h, uint32_t(b)) == 0, "a free block has dead slots");
            ar.require(v.mark_of(h, uint32_t(b)), "a block is listed twice (free stacks, block tables)");
        }
        nfree += n;
    }
    // lending: each pool's own count moves with what it lent or borrowed; all pools' sum is fixed
    v.pool_blocks += held + nfree;
    ar.require(nfree == v.u32(v.pool_at(h)) && (lend || held + nfree == nb) &&
                   (!lend || h + 1 < c->cfg.model.n_kv_heads || v.pool_blocks == ids),
               "a pool's free count does not match its free stacks and the blocks its layers hold");
}


// Every mutable part of the cache, in the format's order. The cache is read (kSize, kWrite), only
// its config-derived fields are read (kCheck), or written (kLoad).
void visit(kvp_cache *c, Ar &ar) {
    const kvp_model &md = c->cfg.model;
    const ArenaPlan &p = c->plan;
    const uint32_t L = md.n_layers, H = md.n_kv_heads, B = p.block;
    Val *v = ar.mode == Ar::kCheck ? ar.val : nullptr;
    const bool realign = c->positions == KVP_POS_REALIGN, fixed = c->cfg.score == KVP_SCORE_FIXED;
    if (v) v->body0 = ar.pos;
    uint64_t counters[5] = {c->live_rows, c->peak_rows, c->tokens_seen, c->live_bytes, c->peak_bytes};
    for (uint64_t &x : counters) ar.u(x);
    if (v) v->layer0 = ar.pos;
    if (ar.loading()) {
        c->live_rows = counters[0];
        c->peak_rows = counters[1];
        c->tokens_seen = counters[2];
        c->live_bytes = counters[3];
        c->peak_bytes = counters[4];
    }
    for (uint32_t l = 0; l < L; ++l) {
        LayerState tmp = c->layers[l];
        LayerState &ls = ar.loading() || !ar.reading() ? c->layers[l] : tmp;
        ar.u(ls.next_pos);
        ar.u(ls.rows);
        ar.u(ls.bytes);
        ar.u(ls.evict_threshold);
        ar.f(ls.sparsity);
        ar.u(ls.lazy);
        for (uint64_t &x : ls.pstate) ar.u(x);
        ar.flag(ls.observe_decode);
        ar.require(ls.next_pos >= 0 && ls.next_pos <= int64_t(INT32_MAX) + 1, "a layer's next position is out of range");
        if (v) {
            if (l == 0) v->layer_rec = ar.pos - v->layer0;
            ar.require(ls.sparsity >= 0.0f && ls.sparsity <= 1.0f && ls.lazy >= -1 && ls.lazy <= 1,
                       "a layer's statistics are out of range");
        }
    }
    if (v) v->pool0 = ar.pos;
    for (uint32_t h = 0; h < H; ++h) {
        BlockPool &pool = c->pools[h];
        // Block ids are stored as the pool's own (0..nblocks-1, pool.h "One slot space": id - base),
        // or where heads lend over all pools (0..H*nblocks-1: a lent block is another pool's).
        const int32_t base = p.lend ? 0 : int32_t(pool.base);
        const uint64_t ids = p.lend ? uint64_t(p.nblocks) * H : p.nblocks;
        uint32_t nfree = pool.nfree, deficit = pool.deficit;
        ar.u(nfree);
        ar.u(deficit);
        ar.require(nfree <= ids, "a pool's free count exceeds its blocks");
        if (ar.loading()) pool.nfree = nfree, pool.deficit = deficit;
        auto own = [base](int32_t id) { return id < 0 ? id : id - base; };
        auto global = [base](int32_t id) { return id < 0 ? id : id + base; };
        for (uint32_t b = 0; b < p.nblocks && ar.ok; ++b) {
            const uint32_t g = pool.base + b;
            int32_t nx = own(pool.next[g]);
            uint32_t dead = pool.dead[g], seq = pool.bseq[g];
            ar.u(nx);
            ar.u(dead);
            ar.u(seq);
            ar.require(nx >= -1 && int64_t(nx) < int64_t(ids) && dead <= B, "a pool's block list is corrupt");
            if (ar.loading()) pool.next[g] = global(nx), pool.dead[g] = dead, pool.bseq[g] = seq;
        }
        for (uint32_t l = 0; l < L && ar.ok; ++l) {
            int32_t top = own(pool.top[l]);
            uint32_t held = pool.held[l];
            ar.u(top);
            ar.u(held);
            ar.require(top >= -1 && int64_t(top) < int64_t(ids) && held <= ids, "a pool's free stacks are corrupt");
            if (ar.loading()) pool.top[l] = global(top), pool.held[l] = held;
        }
        if (v && ar.ok) {
            if (h == 0) v->pool_rec = ar.pos - v->pool0;
            if (!p.lend) pool_check(ar, *v, h);
        }
    }
    // lending: a free stack may link blocks whose records follow its pool's, so after all of them
    for (uint32_t h = 0; v && p.lend && h < H && ar.ok; ++h) pool_check(ar, *v, h);
    const FmtPlan *fp = c->fmt ? &c->fmt->fp : nullptr;
    for (uint32_t l = 0; l < L && ar.ok; ++l) {
        for (uint32_t h = 0; h < H && ar.ok; ++h) {
            HeadStore &real = head_of(c, l, h);
            HeadStore tmp = real;
            HeadStore &hs = ar.loading() || !ar.reading() ? real : tmp;
            BlockPool &pool = c->pools[h];
            ar.u(hs.npin);
            ar.u(hs.pnb);
            ar.u(hs.bhead);
            ar.u(hs.nb);
            ar.u(hs.roff);
            ar.u(hs.count);
            ar.u(hs.holes);
            ar.u(hs.first_hole);
            ar.u(hs.seq_head);
            ar.u(hs.shift);
            ar.flag(hs.scattered);
            ar.u(hs.nres);
            ar.u(hs.prune_events);
            ar.u(hs.evicted);
            ar.u(hs.len_after_append);
            ar.f(hs.hoyer);
            ar.u(hs.pword[0]);
            ar.u(hs.pword[1]);
            ar.u(hs.pflag);
            ar.require(hs.npin <= hs.pin_cap && hs.pnb <= hs.pin_blk_cap && uint64_t(hs.pnb) * B >= hs.npin &&
                           hs.nb <= hs.blk_cap && (hs.blk_cap ? hs.bhead < hs.blk_cap : hs.bhead == 0) &&
                           hs.roff < B && uint64_t(hs.roff) + hs.count <= uint64_t(hs.nb) * B &&
                           hs.holes <= hs.count && hs.nres <= hs.count && hs.len() <= hs.cap,
                       "a store's counts are out of range");
            if (!ar.ok) return;
            if (v) {
                const uint32_t vend = hs.roff + hs.count;
                ar.require(hs.pnb == (hs.npin + B - 1) / B && (hs.count ? hs.nb == (vend + B - 1) / B : hs.nb == 0) &&
                               (hs.count == 0 || hs.npin >= hs.pin_cap) && v->held(h, l) == hs.pnb + hs.nb,
                           "a store's blocks do not match its tokens or its pool's held count");
                ar.require(hs.holes <= hs.hole_cap && (hs.holes == 0 || (hs.scattered && hs.first_hole < hs.count)) &&
                               (fp ? hs.nres <= vend % B : hs.nres == 0),
                           "a store's dead-slot or residual counts are out of range");
                // every token front-evicted (shift) or kept took a position of its own
                ar.require(hs.shift >= 0 && hs.shift <= v->next_pos(l) && hs.shift + hs.len() <= v->next_pos(l) &&
                               (realign || hs.shift == 0) &&
                               hs.hoyer == hs.hoyer && hs.hoyer - hs.hoyer == 0.0f && hs.pflag <= 1,
                           "a store's shift or statistics are out of range");
                if (!ar.ok) return;
            }
            const size_t tpos = ar.pos;  // kCheck: where the block table is
            // block tables: the pinned blocks, then the body ring entries in order
            uint32_t blocks[2];  // the two lists' lengths
            blocks[0] = hs.pnb;
            blocks[1] = hs.nb;
            for (uint32_t i = 0; i < blocks[0] + blocks[1] && ar.ok; ++i) {
                uint32_t &slot = i < blocks[0] ? real.pin_blk[i] : real.blk[(hs.bhead + i - blocks[0]) % hs.blk_cap];
                const uint32_t tbase = p.lend ? 0 : pool.base;  // ids as the pool records save them
                uint32_t bid = slot - tbase;
                ar.u(bid);
                ar.require(bid < (p.lend ? uint64_t(p.nblocks) * H : p.nblocks), "a store's block table names a block beyond the pool");
                if (v && ar.ok) {
                    ar.require(v->mark_of(h, bid), "a block is listed twice (free stacks, block tables)");
                    ar.require(i < blocks[0] ? v->dead_of(h, bid) == 0 : v->bseq_of(h, bid) == hs.seq_head + (i - blocks[0]),
                               "a block's dead count or sequence word does not match its store");
                }
                if (ar.loading()) slot = bid + tbase;
            }
            uint32_t pconv = 0;  // formatted: pinned tokens converted (the buffer's value when reading)
            uint32_t sel_rd = 0;  // formatted: the channel lists are set (the buffer's value when reading)
            if (fp) {  // formatted store: conversion state, channel lists
                FmtStore &fs = fmt_store(*c->fmt, real);
                uint32_t selected = fs.selected;
                pconv = fs.pconv;
                uint64_t baa = fs.bytes_after_append;
                ar.u(selected);
                ar.u(pconv);
                ar.u(baa);
                sel_rd = selected;
                ar.require(pconv <= hs.npin, "a formatted store's conversion count is out of range");
                if (v) {
                    const StoreFormat &f = c->fmt->f;
                    ar.require(selected <= 1 && pconv == hs.npin / B * B, "a formatted store's conversion state is out of range");
                    const bool gptj = md.rope == KVP_ROPE_GPTJ;
                    const size_t koff = fs.kidx ? size_t(f.wk) * 2 : 0;
                    if (ar.ok && fs.kidx && ar.take(koff))
                        ar.require(channels_ok(ar.r + ar.pos, f.wk, f.d, f.thin_k && selected ? f.rot_units : 0, gptj),
                                   "a ThinK key channel list is not ascending channels of the head (whole RoPE pairs)");
                    if (ar.ok && fs.vidx && ar.take(koff + size_t(f.wv) * 2))
                        ar.require(channels_ok(ar.r + ar.pos + koff, f.wv, f.d, 0, gptj),
                                   "a ThinK value channel list is not ascending channels of the head");
                }
                if (ar.loading()) fs.selected = selected, fs.pconv = pconv, fs.bytes_after_append = baa;
                if (fs.kidx) ar.bytes(fs.kidx, size_t(c->fmt->f.wk) * sizeof(uint16_t));
                if (fs.vidx) ar.bytes(fs.vidx, size_t(c->fmt->f.wv) * sizeof(uint16_t));
            }
            if (!ar.ok) return;
            // The data of the slots the store occupies (live and dead; never the unused tail of a
            // block, whose bytes are whatever the arena held): rows of head_dim values, slot
            // metadata; formatted storage: converted slots' rows and scales, converted blocks'
            // key grids, the residual tokens' side rows.
            const uint32_t hd = md.head_dim;
            const uint32_t vend = hs.roff + hs.count, vres = vend - hs.nres;
            auto rows = [&](float *base, uint32_t s0, uint32_t n) {  // n rows at slot s0 (row stride p.stride)
                if (hd == p.stride) ar.bytes(base + size_t(s0) * p.stride, size_t(n) * hd * sizeof(float));
                else
                    for (uint32_t i = 0; i < n; ++i) ar.bytes(base + size_t(s0 + i) * p.stride, size_t(hd) * sizeof(float));
            };
            // kCheck: the store's live tokens so far (logical index), last position, dead slots,
            // first dead body index, and its live bytes (formatted: converted / residual / grids)
            uint32_t jl = 0, ndead = 0, first_dead = UINT32_MAX;
            int64_t last_pos = -1;
            uint64_t conv = pconv, resid = hs.npin - pconv, grids = (pconv + B - 1) / B;
            for (uint32_t i = 0; i < blocks[0] + blocks[1] && ar.ok; ++i) {
                const bool pinned = i < blocks[0];
                // occupied range [o0, o1) of the block and its converted part [o0, oc) (formatted)
                uint32_t o0, o1, oc;
                if (pinned) {
                    o0 = 0;
                    o1 = hs.npin - i * B < B ? hs.npin - i * B : B;
                    oc = pconv > i * B ? (pconv - i * B < o1 ? pconv - i * B : o1) : 0;
                } else {
                    const uint32_t b0 = (i - blocks[0]) * B;  // virtual slot of the block's first slot
                    o0 = hs.roff > b0 ? hs.roff - b0 : 0;
                    o1 = vend - b0 < B ? vend - b0 : B;
                    oc = vres > b0 ? (vres - b0 < o1 ? vres - b0 : o1) : 0;
                    if (oc < o0) oc = o0;
                }
                if (o1 <= o0) continue;
                uint32_t bid = 0;  // kCheck: sizes only (the block ids were checked above)
                if (ar.mode != Ar::kCheck) bid = pinned ? real.pin_blk[i] : real.blk[(hs.bhead + i - blocks[0]) % hs.blk_cap];
                const size_t s0 = size_t(bid) * B;
                if (v) {  // the block's data, read where it lies in the buffer
                    const uint32_t vbid = v->u32(tpos + 4 * size_t(i)), n = o1 - o0;
                    const uint32_t b0 = pinned ? i * B : (i - blocks[0]) * B;  // pinned: logical; body: virtual slot
                    size_t at = ar.pos;
                    if (!fp) {
                        if (!ar.take(size_t(n) * hd * 8)) return;
                        ar.require(rows_ok(ar.r + at, size_t(n) * 2, hd, hd), "a stored K or V row is not finite or out of range");
                        at += size_t(n) * hd * 8;
                    } else {
                        const StoreFormat &f = c->fmt->f;
                        const size_t nc = oc - o0, kb = nc * f.k_row, vb = nc * f.v_row, zb = nc * f.v_groups * 4;
                        const size_t gb = oc > o0 && f.quant() ? size_t(f.wkp) * 3 : 0, sb = size_t(o1 - oc) * hd * 8;
                        if (!ar.take(kb + vb + zb + gb + sb)) return;
                        const uint8_t *q = ar.r + at;
                        if (f.dtype == KVP_DTYPE_F32)  // ThinK rows of the kept channels (padding 0)
                            ar.require(rows_ok(q, nc, f.k_row / 4, hd) && rows_ok(q + kb, nc, f.v_row / 4, hd),
                                       "a stored K or V row is not finite or out of range");
                        else if (f.dtype == KVP_DTYPE_F16)
                            ar.require(f16_finite(q, kb / 2) && f16_finite(q + kb, vb / 2), "a stored K or V value is not finite");
                        ar.require(f16_finite(q + kb + vb, zb / 2), "a stored value scale is not finite");
                        for (size_t e = 0; e < (gb ? f.wkp : 0u) && ar.ok; ++e) {
                            const int8_t ge = int8_t(q[kb + vb + zb + e]);
                            ar.require(ge >= -126 && ge <= 24, "a stored key grid step is out of range");
                        }
                        if (!pinned && oc > o0) ++grids;
                        ar.require(rows_ok(q + kb + vb + zb + gb, size_t(o1 - oc) * 2, hd, hd),
                                   "a stored residual K or V row is not finite or out of range");
                        at += kb + vb + zb + gb + sb;
                    }
                    const size_t pos_at = at, rot_at = at + size_t(n) * 4, score_at = at + size_t(n) * 8;
                    if (!ar.take(at - ar.pos + size_t(n) * 12 + (pool.kq ? size_t(n) * (size_t(hd) + 1) * 2 : 0))) return;
                    uint32_t nd = 0;
                    for (uint32_t t = 0; t < n && ar.ok; ++t) {
                        const int32_t ps = int32_t(v->u32(pos_at + 4 * size_t(t))), rt = int32_t(v->u32(rot_at + 4 * size_t(t)));
                        const uint32_t o = o0 + t;
                        if (ps == kDeadSlot) {
                            ++nd;
                            if (first_dead == UINT32_MAX) first_dead = b0 + o - hs.roff;
                            ar.require(!pinned, "a pinned slot is dead");
                            continue;
                        }
                        const int64_t j = jl;  // logical index (every pinned token is live)
                        ar.require(ps >= 0 && int64_t(ps) > last_pos && int64_t(ps) < v->next_pos(l),
                                   "a store's positions are not ascending below the layer's next position");
                        ar.require(!realign ? rt == ps
                                            : pinned ? int64_t(rt) == j
                                                     : rt >= 0 && rt <= ps && (hs.scattered || int64_t(rt) == j + hs.shift),
                                   "a slot's rotation position does not match its position");
                        if (!fixed) {  // finite, and far from overflowing as later steps add to it
                            float sc;
                            const uint32_t sb = v->u32(score_at + 4 * size_t(t));
                            memcpy(&sc, &sb, 4);
                            ar.require(sc > -0x1p64f && sc < 0x1p64f, "a slot's score is not finite or out of range");
                        }
                        last_pos = ps;
                        ++jl;
                        if (fp && !pinned) {  // pinned: counted from pconv (fmt_store_bytes)
                            if (b0 + o < hs.roff + hs.count - hs.nres) ++conv;
                            else ++resid;
                        }
                    }
                    if (pool.kq) {
                        const size_t kq_at = score_at + size_t(n) * 4, ke_at = kq_at + size_t(n) * hd * 2;
                        for (size_t e = 0; e < size_t(n) * hd && ar.ok; ++e) {
                            const int16_t x = int16_t(get_le(v->r + kq_at + 2 * e, 2));
                            ar.require(x >= -23171 && x <= 23171, "a fixed-point key is out of range");
                        }
                        for (uint32_t t = 0; t < n && ar.ok; ++t) {
                            const int16_t x = int16_t(get_le(v->r + ke_at + 2 * size_t(t), 2));
                            ar.require(x >= -113 && x <= 114, "a fixed-point key exponent is out of range");
                        }
                    }
                    if (!pinned) ar.require(v->dead_of(h, vbid) == nd, "a block's dead count does not match its dead slots");
                    ndead += nd;
                    if (!ar.ok) return;
                }
                if (fp) {
                    const FmtPool &fpo = fmt_pool(*c->fmt, pool);
                    const StoreFormat &f = c->fmt->f;
                    FmtStore &fs = fmt_store(*c->fmt, real);
                    if (oc > o0) {
                        ar.bytes(fpo.kq + (s0 + o0) * f.k_row, size_t(oc - o0) * f.k_row);
                        ar.bytes(fpo.vq + (s0 + o0) * f.v_row, size_t(oc - o0) * f.v_row);
                        if (f.v_groups)
                            ar.bytes(fpo.vsz + (s0 + o0) * f.v_groups * 2, size_t(oc - o0) * f.v_groups * 2 * sizeof(uint16_t));
                        if (f.quant()) {
                            ar.bytes(fpo.kge + size_t(bid) * f.wkp, f.wkp);
                            ar.bytes(fpo.kgz + size_t(bid) * f.wkp, size_t(f.wkp) * sizeof(int16_t));
                        }
                    }
                    for (uint32_t o = oc; o < o1; ++o) {  // residual: side rows (pinned: o, body: pin_side + o)
                        const size_t row = pinned ? o : fp->pin_side + o;
                        ar.bytes(fs.side_k + row * p.stride, size_t(hd) * sizeof(float));
                        ar.bytes(fs.side_v + row * p.stride, size_t(hd) * sizeof(float));
                    }
                } else {
                    rows(pool.k, uint32_t(s0 + o0), o1 - o0);
                    rows(pool.v, uint32_t(s0 + o0), o1 - o0);
                }
                const size_t n = o1 - o0, a0 = s0 + o0;
                ar.bytes(pool.pos + a0, n * sizeof(int32_t));
                ar.bytes(pool.rot + a0, n * sizeof(int32_t));
                ar.bytes(pool.score + a0, n * sizeof(float));
                if (pool.kq) {
                    for (size_t t = 0; t < n; ++t) ar.bytes(pool.kq + (a0 + t) * pool.kq_stride, size_t(hd) * sizeof(int16_t));
                    ar.bytes(pool.kexp + a0, n * sizeof(int16_t));
                }
            }
            if (v && ar.ok) {
                ar.require(ndead == hs.holes && (hs.holes == 0 || hs.first_hole <= first_dead),
                           "a store's dead-slot count or first dead slot does not match its slots");
                v->rows += hs.len();
                v->bytes += fp ? conv * fmt_token_bytes(c->fmt->f) + grids * fmt_grid_bytes(c->fmt->f) +
                                     resid * fmt_residual_bytes(c->fmt->f) +
                                     (sel_rd ? fmt_index_bytes(c->fmt->f) : 0)
                                : uint64_t(hs.len()) * token_bytes(c);
            }
        }
        if (v && ar.ok) {
            ar.require(v->rows == v->layer_rows(l) && v->bytes == v->layer_bytes(l),
                       "a layer's kept tokens or live bytes do not match its stores");
            // heads that lend hold the capacity each between calls (cache_room_check); the
            // layer-wide rankings are sized for that (policies/policy.h layer_tokens_cap)
            ar.require(!p.lend || v->rows <= uint64_t(H) * c->layers[l].geom.lp.cap,
                       "a layer's KV heads hold more tokens than their capacities together");
            v->sum_rows += v->rows;
            v->sum_bytes += v->bytes;
            v->rows = v->bytes = 0;
        }
    }
    // a region that only carries data within one call (Policy::state_transient) is not state
    const uint64_t saved = policy_of(c->cfg).state_transient ? 0 : p.pstate_bytes;
    uint64_t pbytes = saved;
    ar.u(pbytes);
    ar.require(pbytes == saved, "the policy state region has another size");
    if (v && ar.ok) {
        ar.require(counters[0] == v->sum_rows && counters[3] == v->sum_bytes && counters[1] >= counters[0] &&
                       counters[4] >= counters[3],
                   "the cache's counters do not match its layers");
        if (pbytes && &policy_of(c->cfg) == &kAslPolicy && ar.take(pbytes))
            ar.require(asl_state_check(c, ar.r + ar.pos, pbytes), "the ASL policy state is out of range");
    }
    if (ar.ok && pbytes) ar.bytes(c->pstate, pbytes);
}

}  // namespace

uint64_t state_check_bits = 0;

uint64_t state_checksum(const void *data, size_t n) {
    Hasher h;
    h.update(data, n);
    return h.final();
}

size_t state_size(const kvp_cache *c) {
    Ar ar{Ar::kSize};
    ar.pos = kHeaderFixed + size_t(kConfigWords) * 4;
    visit(const_cast<kvp_cache *>(c), ar);
    return ar.pos;
}

kvp_status state_save(const kvp_cache *c, void *buf, size_t size, size_t *written, Msg &m) {
    if (!host_little_endian()) {
        m.s("state save/load needs a little-endian host");
        return KVP_ERR_UNSUPPORTED;
    }
    if (draft_open(c)) {
        m.s("a draft is open: kvp_draft_commit it before saving the state");
        return KVP_ERR_STATE;
    }
    const size_t need = state_size(c);
    if (written) *written = need;
    if (size < need) {
        m.s("the buffer holds ").u(size).s(" bytes; the state needs ").u(need).s(" (kvp_state_size)");
        return KVP_ERR_BUFFER;
    }
    uint8_t *o = static_cast<uint8_t *>(buf);
    memcpy(o, kMagic8, 8);
    put_le(o + 8, kStateFormat, 4);
    put_le(o + 12, KVP_VERSION, 4);
    put_le(o + 16, need, 8);
    put_le(o + 32, kConfigWords, 4);
    put_le(o + 36, c->rope_fp ^ c->roles_fp, 4);  // the RoPE table's and the role table's fingerprints (0: none)
    for (uint32_t i = 0; i < kConfigWords; ++i) {
        uint32_t w;
        memcpy(&w, reinterpret_cast<const char *>(&c->cfg) + 4 + 4 * size_t(i), 4);
        put_le(o + kHeaderFixed + 4 * size_t(i), w, 4);
    }
    Hasher hash;
    hash.update(o + 32, kHeaderFixed - 32 + size_t(kConfigWords) * 4);
    Ar ar{Ar::kWrite};
    ar.w = o;
    ar.hash = &hash;
    ar.pos = kHeaderFixed + size_t(kConfigWords) * 4;
    visit(const_cast<kvp_cache *>(c), ar);
    stream_fence();  // the streamed pieces are in memory before the caller reads the buffer
    put_le(o + 24, hash.final(), 8);
    return KVP_OK;
}

namespace {

const char *const kModelNames[] = {"n_layers", "n_q_heads", "n_kv_heads", "head_dim", "rope", "rope_dim", "rope_theta"};

// The name of the kvp_config field at byte offset off.
void config_word_name(size_t off, Msg &m) {
    const size_t model_off = offsetof(kvp_config, model);
    if (off >= model_off && off < model_off + sizeof(kvp_model)) {
        const size_t i = (off - model_off) / 4;
        m.s(i < 7 ? kModelNames[i] : "model");
        return;
    }
    for (uint32_t i = 0; i < config_key_count(); ++i) {
        kvp_key_info k;
        k.struct_size = sizeof k;
        if (config_key_info(i, &k) && k.config_size - 4 == off) {
            m.s(k.name);
            return;
        }
    }
    m.s("field at byte ").u(off);
}

}  // namespace

kvp_status state_load(kvp_cache *c, const void *buf, size_t size, Msg &m) {
    if (!host_little_endian()) {
        m.s("state save/load needs a little-endian host");
        return KVP_ERR_UNSUPPORTED;
    }
    if (draft_open(c)) {
        m.s("a draft is open: kvp_draft_commit it before loading a state");
        return KVP_ERR_STATE;
    }
    const uint8_t *in = static_cast<const uint8_t *>(buf);
    if (size < kHeaderFixed || memcmp(in, kMagic8, 8) != 0) {
        m.s(size < kHeaderFixed ? "the buffer is shorter than a state header" : "not a kvprune state (bad magic)");
        return KVP_ERR_ARG;
    }
    const uint32_t format = uint32_t(get_le(in + 8, 4)), ver = uint32_t(get_le(in + 12, 4));
    if (format != kStateFormat) {
        m.s("state format ").u(format).s(" (written by kvprune ").u(ver >> 16).s(".").u((ver >> 8) & 0xff).s(".")
            .u(ver & 0xff).s("); this library reads format ").u(kStateFormat);
        return KVP_ERR_UNSUPPORTED;
    }
    const uint64_t total = get_le(in + 16, 8);
    if (total != size) {
        m.s("the state is ").u(total).s(" bytes; the buffer holds ").u(size).s(total > size ? " (truncated)" : " (pass the state's size)");
        return KVP_ERR_ARG;
    }
    // A state from a library whose kvp_config had fewer fields (keys are appended, never moved) is
    // read with those fields at their defaults; one with more fields comes from a newer library.
    const uint32_t words = uint32_t(get_le(in + 32, 4));
    const bool words_ok = words <= kConfigWords && words >= kConfigFirstWords && size >= kHeaderFixed + size_t(words) * 4;
    const size_t body0 = kHeaderFixed + size_t(words) * 4;
    // The checksum, and the first pass of the body's checks (Val) in the same read of the buffer:
    // the check walk hashes each piece it reads (issue 29: the checks read every stored float, and
    // a second pass over the state cost 40-70% of the load's time). The walk reads bytes only, so
    // it is safe on a buffer whose checksum does not match; that verdict comes first. Ownership
    // marks go to a bitmap in thread 0's scratch (from its run buffer on); when the scratch holds
    // fewer bits than the pools have blocks, more passes follow over windows of block ids.
    const uint64_t ids = uint64_t(c->cfg.model.n_kv_heads) * c->plan.nblocks;
    uint64_t *const bits = reinterpret_cast<uint64_t *>(c->scratch + c->plan.scr_runs);
    uint64_t nbits = uint64_t((c->plan.scratch_bytes - c->plan.scr_runs) / 8) * 64;  // >= 512: the run buffer
    if (state_check_bits && state_check_bits < nbits) nbits = state_check_bits < 64 ? 64 : state_check_bits / 64 * 64;
    char wbuf[256];
    Msg wm(wbuf, sizeof wbuf);  // the walk's finding, reported after the checksum and config verdicts
    auto walk = [&](uint64_t lo, Hasher *hash) {
        Val v{c, in, bits, lo, nbits};
        const uint64_t n = ids - lo < nbits ? ids - lo : nbits;
        memset(bits, 0, size_t((n + 63) / 64) * 8);
        Ar chk{Ar::kCheck};
        chk.r = in;
        chk.m = &wm;
        chk.val = &v;
        chk.hash = hash;
        chk.pos = body0;
        chk.end = size;
        wm.clear();
        wm.s("the state is inconsistent: ");
        visit(c, chk);
        if (chk.ok && chk.pos != size) chk.fail("bytes follow the state's end");
        if (hash) hash->update(in + chk.pos, size - chk.pos);  // a walk that stopped: the rest
        return chk.ok;
    };
    Hasher hash;
    bool walked_ok = false;
    if (words_ok) {
        hash.update(in + 32, body0 - 32);
        walked_ok = walk(0, &hash);
    } else {
        hash.update(in + 32, size - 32);
    }
    if (hash.final() != get_le(in + 24, 8)) {
        m.s("the state's checksum does not match (corrupted)");
        return KVP_ERR_ARG;
    }
    // The caller's RoPE table (kvp_create_rope) is part of the configuration: its fingerprint.
    const uint32_t fp = uint32_t(get_le(in + 36, 4));
    // The DuoAttention role table (kvp_create_heads) likewise: its fingerprint is XORed in (0: none).
    if (c->roles_fp && fp != (c->rope_fp ^ c->roles_fp)) {
        m.s("the state was saved from a cache with ").s(fp == c->rope_fp ? "no DuoAttention role table" : "another role table or RoPE table")
            .s(" and this cache has a role table (kvp_create_heads, kvp_create_rope)");
        return KVP_ERR_CONFIG;
    }
    if (!c->roles_fp && fp != c->rope_fp) {
        m.s("the state was saved from a cache ").s(fp ? "with a caller RoPE frequency table" : "with theta's RoPE frequencies")
            .s(" and this cache has ").s(c->rope_fp ? "a caller table" : "theta's frequencies");
        if (fp && c->rope_fp) m.s(" (the tables differ: fingerprints ").u(fp).s(" and ").u(c->rope_fp).s(")");
        m.s(" (kvp_create_rope), or with a DuoAttention role table (kvp_create_heads)");
        return KVP_ERR_CONFIG;
    }
    if (!words_ok) {
        m.s("the state's kvp_config has ").u(words).s(" fields after struct_size; this library reads ").u(kConfigFirstWords)
            .s("..").u(kConfigWords).s(" (a state from a newer library version, or not a state)");
        return KVP_ERR_UNSUPPORTED;
    }
    for (uint32_t i = words; i < kConfigWords; ++i) {
        const size_t off = 4 + 4 * size_t(i);
        if (off == offsetof(kvp_config, thread_pool)) continue;  // the threads, not the bits
        kvp_key_info k;
        k.struct_size = sizeof k;
        bool is_default = true;
        for (uint32_t j = 0; j < config_key_count(); ++j) {
            if (!config_key_info(j, &k) || k.config_size - 4 != off) continue;
            const char *field = reinterpret_cast<const char *>(&c->cfg) + off;
            if (k.type == KVP_KEY_FLOAT) {
                float f;
                memcpy(&f, field, 4);
                is_default = double(f) == double(float(k.default_value));
            } else {
                uint32_t u;
                memcpy(&u, field, 4);
                is_default = double(u) == k.default_value;
            }
            break;
        }
        if (!is_default) {
            m.s("the state predates key ");
            config_word_name(off, m);
            m.s(", which this cache sets to a value other than its default");
            return KVP_ERR_CONFIG;
        }
    }
    const size_t threads_off = offsetof(kvp_config, threads) - 4, pool_off = offsetof(kvp_config, thread_pool) - 4;
    for (uint32_t i = 0; i < words; ++i) {
        if (4 * size_t(i) == threads_off || 4 * size_t(i) == pool_off) continue;  // bits do not depend on the threads
        uint32_t mine;
        memcpy(&mine, reinterpret_cast<const char *>(&c->cfg) + 4 + 4 * size_t(i), 4);
        const uint32_t theirs = uint32_t(get_le(in + kHeaderFixed + 4 * size_t(i), 4));
        if (mine != theirs) {
            m.s("the state was saved from another configuration: ");
            config_word_name(4 + 4 * size_t(i), m);
            m.s(" differs (the state was saved with ");
            config_word_text(4 + 4 * size_t(i), theirs, m);
            m.s(", this cache has ");
            config_word_text(4 + 4 * size_t(i), mine, m);
            m.s(")");
            return KVP_ERR_CONFIG;
        }
    }
    if (!walked_ok) {
        m.s(wbuf);
        return KVP_ERR_ARG;
    }
    for (uint64_t lo = nbits; lo < ids; lo += nbits) {  // more windows of block ids (large pools only)
        if (!walk(lo, nullptr)) {
            m.s(wbuf);
            return KVP_ERR_ARG;
        }
    }
    // Valid: the state replaces everything, an open prompt (max_prompt) included: its layers close
    // (their stores' caps back to capacity) before the stores are written.
    prompt_reset(c);
    Ar ld{Ar::kLoad};
    ld.r = in;
    ld.pos = body0;
    ld.end = size;
    visit(c, ld);
    stream_fence();  // the streamed rows are in memory before the next call reads them
    return KVP_OK;
}

}  // namespace kvp
