#include "state.h"

#include <stddef.h>
#include <string.h>

#include "config.h"
#include "draft.h"

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
    Hasher *hash = nullptr;      // kWrite: fed every piece as it is written

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
        else if (reading()) v = get_le(r + pos, n);
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
        }
        pos += n;
    }
};

// Every mutable part of the cache, in the format's order. The cache is read (kSize, kWrite), only
// its config-derived fields are read (kCheck), or written (kLoad).
void visit(kvp_cache *c, Ar &ar) {
    const kvp_model &md = c->cfg.model;
    const ArenaPlan &p = c->plan;
    const uint32_t L = md.n_layers, H = md.n_kv_heads, B = p.block;
    uint64_t counters[5] = {c->live_rows, c->peak_rows, c->tokens_seen, c->live_bytes, c->peak_bytes};
    for (uint64_t &x : counters) ar.u(x);
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
    }
    for (uint32_t h = 0; h < H; ++h) {
        BlockPool &pool = c->pools[h];
        uint32_t nfree = pool.nfree, deficit = pool.deficit;
        ar.u(nfree);
        ar.u(deficit);
        ar.require(nfree <= p.nblocks, "a pool's free count exceeds its blocks");
        if (ar.loading()) pool.nfree = nfree, pool.deficit = deficit;
        for (uint32_t b = 0; b < p.nblocks && ar.ok; ++b) {
            int32_t nx = pool.next[b];
            uint32_t dead = pool.dead[b], seq = pool.bseq[b];
            ar.u(nx);
            ar.u(dead);
            ar.u(seq);
            ar.require(nx >= -1 && nx < int32_t(p.nblocks) && dead <= B, "a pool's block list is corrupt");
            if (ar.loading()) pool.next[b] = nx, pool.dead[b] = dead, pool.bseq[b] = seq;
        }
        for (uint32_t l = 0; l < L && ar.ok; ++l) {
            int32_t top = pool.top[l];
            uint32_t held = pool.held[l];
            ar.u(top);
            ar.u(held);
            ar.require(top >= -1 && top < int32_t(p.nblocks) && held <= p.nblocks, "a pool's free stacks are corrupt");
            if (ar.loading()) pool.top[l] = top, pool.held[l] = held;
        }
    }
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
            // block tables: the pinned blocks, then the body ring entries in order
            uint32_t blocks[2];  // the two lists' lengths
            blocks[0] = hs.pnb;
            blocks[1] = hs.nb;
            for (uint32_t i = 0; i < blocks[0] + blocks[1] && ar.ok; ++i) {
                uint32_t &slot = i < blocks[0] ? real.pin_blk[i] : real.blk[(hs.bhead + i - blocks[0]) % hs.blk_cap];
                uint32_t bid = slot;
                ar.u(bid);
                ar.require(bid < p.nblocks, "a store's block table names a block beyond the pool");
                if (ar.loading()) slot = bid;
            }
            uint32_t pconv = 0;  // formatted: pinned tokens converted (the buffer's value when reading)
            if (fp) {  // formatted store: conversion state, channel lists
                FmtStore &fs = fmt_store(*c->fmt, real);
                uint32_t selected = fs.selected;
                pconv = fs.pconv;
                uint64_t baa = fs.bytes_after_append;
                ar.u(selected);
                ar.u(pconv);
                ar.u(baa);
                ar.require(pconv <= hs.npin, "a formatted store's conversion count is out of range");
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
        }
    }
    uint64_t pbytes = p.pstate_bytes;
    ar.u(pbytes);
    ar.require(pbytes == p.pstate_bytes, "the policy state region has another size");
    if (ar.ok && pbytes) ar.bytes(c->pstate, pbytes);
}

}  // namespace

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
    put_le(o + 36, c->rope_fp, 4);
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
    if (state_checksum(in + 32, size - 32) != get_le(in + 24, 8)) {
        m.s("the state's checksum does not match (corrupted)");
        return KVP_ERR_ARG;
    }
    // The caller's RoPE table (kvp_create_rope) is part of the configuration: its fingerprint.
    const uint32_t fp = uint32_t(get_le(in + 36, 4));
    if (fp != c->rope_fp) {
        m.s("the state was saved from a cache ").s(fp ? "with a caller RoPE frequency table" : "with theta's RoPE frequencies")
            .s(" and this cache has ").s(c->rope_fp ? "a caller table" : "theta's frequencies");
        if (fp && c->rope_fp) m.s(" (the tables differ: fingerprints ").u(fp).s(" and ").u(c->rope_fp).s(")");
        m.s(" (kvp_create_rope)");
        return KVP_ERR_CONFIG;
    }
    // A state from a library whose kvp_config had fewer fields (keys are appended, never moved) is
    // read with those fields at their defaults; one with more fields comes from a newer library.
    const uint32_t words = uint32_t(get_le(in + 32, 4));
    if (words > kConfigWords || words < kConfigFirstWords || size < kHeaderFixed + size_t(words) * 4) {
        m.s("the state's kvp_config has ").u(words).s(" fields after struct_size; this library reads ").u(kConfigFirstWords)
            .s("..").u(kConfigWords).s(" (a state from a newer library version, or not a state)");
        return KVP_ERR_UNSUPPORTED;
    }
    for (uint32_t i = words; i < kConfigWords; ++i) {
        const size_t off = 4 + 4 * size_t(i);
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
    const size_t threads_off = offsetof(kvp_config, threads) - 4;
    for (uint32_t i = 0; i < words; ++i) {
        if (4 * size_t(i) == threads_off) continue;  // bits do not depend on the thread count
        uint32_t mine;
        memcpy(&mine, reinterpret_cast<const char *>(&c->cfg) + 4 + 4 * size_t(i), 4);
        const uint32_t theirs = uint32_t(get_le(in + kHeaderFixed + 4 * size_t(i), 4));
        if (mine != theirs) {
            m.s("the state was saved from another configuration: ");
            config_word_name(4 + 4 * size_t(i), m);
            m.s(" differs (saved word ").u(theirs).s(", this cache ").u(mine).s(")");
            return KVP_ERR_CONFIG;
        }
    }
    Ar chk{Ar::kCheck};
    chk.r = in;
    chk.m = &m;
    chk.pos = kHeaderFixed + size_t(words) * 4;
    chk.end = size;
    m.s("the state is inconsistent: ");
    visit(c, chk);
    if (chk.ok && chk.pos != size) chk.fail("bytes follow the state's end");
    if (!chk.ok) return KVP_ERR_ARG;
    m.clear();
    Ar ld{Ar::kLoad};
    ld.r = in;
    ld.pos = kHeaderFixed + size_t(words) * 4;
    ld.end = size;
    visit(c, ld);
    stream_fence();  // the streamed rows are in memory before the next call reads them
    return KVP_OK;
}

}  // namespace kvp
