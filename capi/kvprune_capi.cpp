// The extern "C" layer: validates every argument, writes error text, never lets an exception
// out (the library is built with -fno-exceptions) and calls into src/ only with valid input.
// Every check runs before anything is mutated, so a failed call leaves the cache unchanged.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "arena.h"
#include "cache.h"
#include "config.h"
#include "draft.h"
#include "io.h"
#include "prompt.h"
#include "state.h"
#include "kvprune/kvprune.h"
#include "msg.h"

using kvp::Msg;

namespace {

// kvp_arena_advise: the whole 2 MiB pages inside [p, p + len) (DECISIONS "Huge pages under the
// arena"). 0: advised, or no whole page inside; -1: this platform or kernel has no such hint.
constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
int advise_huge(void *p, size_t len) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = (a + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t hi = (len > UINTPTR_MAX - a ? UINTPTR_MAX : a + len) & ~(kHugePage - 1);
    if (hi <= lo) return 0;
    return madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_HUGEPAGE) == 0 ? 0 : -1;
#else
    (void)p;
    (void)len;
    return -1;
#endif
}

kvp_status fail(kvp_cache *c, kvp_status st, Msg &m) {
    if (c) {
        Msg out(c->last_error, sizeof c->last_error);
        out.s(kvp_status_str(st)).s(": ").s(m.c_str());
    }
    return st;
}

// For the read-only calls (kvp_layer_positions, kvp_get_stats, ...): the message slot is the
// one piece of a cache a const call may write (like errno); the cache lives in writable memory.
kvp_status fail_const(const kvp_cache *c, kvp_status st, Msg &m) { return fail(const_cast<kvp_cache *>(c), st, m); }

// "<status>: <detail>" into a caller buffer (the config functions and kvp_create_ex), "" on success.
kvp_status report(kvp_status st, const char *detail, char *err, size_t err_len) {
    Msg out(err, err_len);
    if (st != KVP_OK) out.s(kvp_status_str(st)).s(": ").s(detail);
    return st;
}

// Versioned output structs: their first released layouts (today's) up to the library's size.
constexpr size_t kStatsFirstSize = sizeof(kvp_stats);
constexpr size_t kLayerStatsFirstSize = sizeof(kvp_layer_stats);
constexpr size_t kSelectionFirstSize = sizeof(kvp_selection);
constexpr size_t kKeyInfoFirstSize = sizeof(kvp_key_info);

// Checks an output struct's struct_size (message into m); false when not accepted.
bool sized_out(const uint32_t *struct_size, size_t first, size_t known, const char *what, Msg &m) {
    if (!struct_size) { m.s(what).s(" must not be NULL"); return false; }
    if (kvp::struct_size_ok(*struct_size, first, known)) return true;
    m.s(what).s("->struct_size=").u(*struct_size).s(": this library accepts ").u(first).s("..").u(known)
        .s(" (set it to sizeof(*").s(what).s("))");
    return false;
}

// Writes the fields of r that lie within the caller's struct_size bytes; struct_size is kept.
template <class T>
void copy_out(T *dst, const T &r) {
    const uint32_t n = dst->struct_size;
    memcpy(reinterpret_cast<char *>(dst) + sizeof(uint32_t), reinterpret_cast<const char *>(&r) + sizeof(uint32_t),
           n - sizeof(uint32_t));
}

// ---- handles ----
// With caller memory the handle is the cache's address (the arena's start). A library-owned
// arena (kvp_create with arena == NULL) gives out the address + 1 (caches are 64-byte aligned,
// so bit 0 is free): kvp_destroy tells such a handle from caller memory without reading it, and
// frees it only while it is on the list of live owned caches, so a second kvp_destroy of it does
// nothing instead of reading and freeing freed memory.
constexpr uintptr_t kOwnedTag = 1;

kvp_cache *untag(const kvp_cache *h) {
    return reinterpret_cast<kvp_cache *>(reinterpret_cast<uintptr_t>(h) & ~kOwnedTag);
}

uint32_t magic_of(const kvp_cache *c) { return __atomic_load_n(&c->magic, __ATOMIC_RELAXED); }

bool valid(const kvp_cache *c) { return c && magic_of(c) == kvp::kMagic; }

// Status for a handle that is not a live cache: a destroyed one (its caller memory still
// readable) is a state error, anything else a bad argument.
kvp_status not_live(const kvp_cache *c) { return c && magic_of(c) == kvp::kDeadMagic ? KVP_ERR_STATE : KVP_ERR_ARG; }

// ---- one call at a time per cache ----
// Every call that reads or changes a cache's state holds its `busy` flag for the whole call (one
// atomic exchange in, one store out). A call that finds it held (another thread is inside a call
// on the same cache: a violation of the one-call-at-a-time rule) returns KVP_ERR_STATE and touches
// nothing, not even the message slot, which belongs to the call in progress.
bool acquire(const kvp_cache *c) {
    return __atomic_exchange_n(&const_cast<kvp_cache *>(c)->busy, 1u, __ATOMIC_ACQUIRE) == 0u;
}
void release(const kvp_cache *c) { __atomic_store_n(&const_cast<kvp_cache *>(c)->busy, 0u, __ATOMIC_RELEASE); }

// Holds the flag of a live cache for one call; ok() false when the handle is not a live cache or
// the cache is busy (status() says which).
class Guard {
public:
    explicit Guard(const kvp_cache *h) : c_(untag(h)) {
        if (!valid(c_)) st_ = not_live(c_);
        else if (!acquire(c_)) st_ = KVP_ERR_STATE;
        else held_ = true;
    }
    ~Guard() {
        if (held_) release(c_);
    }
    Guard(const Guard &) = delete;
    Guard &operator=(const Guard &) = delete;
    bool ok() const { return held_; }
    kvp_status status() const { return st_; }
    kvp_cache *get() const { return c_; }

private:
    kvp_cache *c_;
    kvp_status st_ = KVP_OK;
    bool held_ = false;
};

#if !KVP_NO_HEAP
// Live library-owned caches (a list through their own arenas), behind a spin lock taken only by
// kvp_create and kvp_destroy of such caches.
uint32_t g_owned_lock = 0;
kvp_cache *g_owned_head = nullptr;

void owned_lock() {
    while (__atomic_exchange_n(&g_owned_lock, 1u, __ATOMIC_ACQUIRE) != 0u) {
    }
}
void owned_unlock() { __atomic_store_n(&g_owned_lock, 0u, __ATOMIC_RELEASE); }

void owned_add(kvp_cache *c) {
    owned_lock();
    c->owned_next = g_owned_head;
    g_owned_head = c;
    owned_unlock();
}

// Unlinks c when it is a live owned cache that no call is using; false otherwise (destroyed
// before, never created, or busy), without reading c's memory unless it is on the list.
bool owned_take(kvp_cache *c) {
    owned_lock();
    kvp_cache **p = &g_owned_head;
    while (*p && *p != c) p = &(*p)->owned_next;
    const bool found = *p != nullptr && acquire(c);
    if (found) *p = c->owned_next;
    owned_unlock();
    return found;
}
#endif

// ---- inputs ----
// Largest magnitude accepted in q, k and v (KVP_INPUT_LIMIT = 2^56): as float bits, |x| >= 2^56
// (biased exponent >= 127 + 56) and NaN/Inf (exponent 255) are both abs_bits >= 183 << 23.
constexpr uint32_t kInputLimitBits = (127u + 56u) << 23;
static_assert(KVP_INPUT_LIMIT == 72057594037927936.0, "KVP_INPUT_LIMIT is 2^56");

static_assert(kInputLimitBits == kvp::kern::kOutOfRangeBits, "the scan kernel's limit");

kvp_status check_finite(const kvp_cache *c, const char *name, kvp::In in, size_t n, Msg &m) {
    // SIMD scan (kernels/vec_f32.h); half rows: io.h (f16: Inf/NaN; bf16: as f32, its range)
    const size_t i = in.f32() ? c->vkern->first_out_of_range(in.f32(), n) : kvp::io_first_out_of_range(in.p, in.dt, n);
    if (i == n) return KVP_OK;
    float x;
    (in + i).load(&x, 1);
    m.s(name).s("[").u(i).s("]=").f(double(x));
    if (x != x || x - x != 0.0f) m.s(" is NaN or Inf");
    else m.s(" is out of range: |x| must be < KVP_INPUT_LIMIT = 2^56 (attention could overflow)");
    return KVP_ERR_NONFINITE;
}

// A kvp_io_dtype the library knows; else a message.
bool io_dtype_ok(kvp_io_dtype dt, Msg &m) {
    if (dt == KVP_IO_F32 || dt == KVP_IO_F16 || dt == KVP_IO_BF16) return true;
    m.s("dtype=").i(int64_t(dt)).s(" is not a kvp_io_dtype (KVP_IO_F32=0, KVP_IO_F16=1, KVP_IO_BF16=2)");
    return false;
}

// Byte ranges [a, a+an) and [b, b+bn) overlap (addresses compared as integers).
bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    if (!a || !b || !an || !bn) return false;
    const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y ? y - x < an : x - y < bn;
}

// Shared validation of the token-adding calls. q == NULL skips the query checks; out (may be
// NULL) must not overlap the inputs; `prefill`: a kvp_prefill call (with q, staged policies take
// the chunk through their staging area).
kvp_status check_tokens(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, uint32_t dt,
                        const void *q, const void *k, const void *v, const void *out, bool prefill, Msg &m,
                        bool room = true) {
    const kvp_model &md = c->cfg.model;
    if (layer >= md.n_layers) {
        m.s("layer ").u(layer).s(" out of range (n_layers=").u(md.n_layers).s(")");
        return KVP_ERR_LAYER;
    }
    if (n == 0) { m.s("n_tokens must be >= 1"); return KVP_ERR_ARG; }
    if (!k || !v) { m.s("k and v must not be NULL"); return KVP_ERR_ARG; }
    // The room first: a chunk that cannot fit is refused before any of the caller's n tokens of
    // positions, q, k or v are read (n may be far larger than the buffers, e.g. 0x7fffffff). With a
    // draft open the room is the draft area's and the commit's (draft.h).
    kvp_status st = !room               ? KVP_OK
                    : kvp::draft_open(c) ? kvp::draft_check(c, layer, n, q != nullptr, m)
                                         : kvp::cache_room_check(c, layer, n, prefill && q, m);  // q: read (see kvp_prefill)
    if (st != KVP_OK) return st;
    const int64_t next = kvp::draft_next_pos(c, layer);  // draft tokens included (draft.h)
    if (positions) {
        for (uint32_t i = 0; i < n; ++i) {
            const int64_t prev = i ? int64_t(positions[i - 1]) : next - 1;
            if (positions[i] < 0 || int64_t(positions[i]) <= prev) {
                m.s("positions[").u(i).s("]=").i(positions[i]).s(" must be >= 0 and greater than the previous position ").i(prev);
                return KVP_ERR_ARG;
            }
        }
    } else if (next + int64_t(n) - 1 > INT32_MAX) {
        m.s("positions would exceed INT32_MAX");
        return KVP_ERR_ARG;
    }
    // Sizes of the caller's arrays: in 64 bits (n * heads * head_dim < 2^52), then they must fit
    // this platform's size_t (32-bit targets) before any pointer arithmetic uses them.
    const uint64_t nq64 = uint64_t(n) * md.n_q_heads * md.head_dim, nkv64 = uint64_t(n) * md.n_kv_heads * md.head_dim;
    const size_t es = kvp::io_size(dt);  // element bytes (kvp_io_dtype)
    if (nq64 > SIZE_MAX / sizeof(float)) {
        m.s("n_tokens=").u(n).s(": q and out would need ").u(nq64 * es).s(" bytes, beyond this platform's address space");
        return KVP_ERR_ARG;
    }
    const size_t nq = size_t(nq64), nkv = size_t(nkv64);
    // Formatted stores keep a prefill/append chunk's V rows in the caller's array until they convert;
    // half rows are widened into the chunk's staging rows after its K rows, which hold max_cap rows
    // in all (prompt staging, a prefill with q under snapkv/pyramidkv/asl, uses other rows).
    const bool fmt_chunk = c->fmt && !(prefill && q && c->layers[layer].geom.lp.staged_prefill && !kvp::prompt_takes(c, layer)) &&
                           !kvp::draft_open(c);
    if (dt != kvp::kIoF32 && fmt_chunk && n > 1 && uint64_t(n) * 2 > c->plan.max_cap) {
        m.s("a half-precision chunk of ").u(n).s(" tokens exceeds ").u(c->plan.max_cap / 2)
            .s(" (half the largest layer capacity) under kv_dtype!=f32 or ThinK: their V rows are widened into the "
               "chunk's staging area; chunk the call");
        return KVP_ERR_FULL;
    }
    if (out && (overlaps(out, nq * es, q, nq * es) || overlaps(out, nq * es, k, nkv * es) ||
                overlaps(out, nq * es, v, nkv * es) ||
                overlaps(out, nq * es, positions, positions ? size_t(n) * sizeof(int32_t) : 0))) {
        m.s("out overlaps q, k, v or positions: outputs are written while the inputs are still read (use a separate buffer)");
        return KVP_ERR_ARG;
    }
    if (q && (st = check_finite(c, "q", kvp::In(q, dt), nq, m)) != KVP_OK) return st;
    if ((st = check_finite(c, "k", kvp::In(k, dt), nkv, m)) != KVP_OK) return st;
    if ((st = check_finite(c, "v", kvp::In(v, dt), nkv, m)) != KVP_OK) return st;
    return KVP_OK;
}

// A kvp_decode or kvp_append ends an open prompt (prompt.h) first. Every check is made before
// that: the call's inputs, and its room once the prompt has ended (the called layer's: the
// policy must be able to make room after its selection; another layer's ending cannot change
// it), so a call that fails changes nothing and one that passes them succeeds.
kvp_status end_prompt_for(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, uint32_t dt, const void *q,
                          const void *k, const void *v, const void *out, Msg &m) {
    if (kvp::draft_open(c) || !kvp::prompt_any_open(c)) return KVP_OK;
    kvp_status st = check_tokens(c, layer, n, positions, dt, q, k, v, out, false, m, false);
    if (st != KVP_OK) return st;
    st = kvp::prompt_open(c, layer) ? kvp::prompt_end_check(c, layer, n, m) : kvp::cache_room_check(c, layer, n, false, m);
    if (st == KVP_OK) kvp::prompt_end_for(c, layer, n);
    return st;
}

}  // namespace

extern "C" {

uint32_t kvp_version(void) { return KVP_VERSION; }

const char *kvp_status_str(kvp_status s) {
    switch (s) {
        case KVP_OK: return "KVP_OK: success";
        case KVP_ERR_ARG: return "KVP_ERR_ARG: invalid argument";
        case KVP_ERR_CONFIG: return "KVP_ERR_CONFIG: invalid configuration";
        case KVP_ERR_ARENA: return "KVP_ERR_ARENA: arena too small or misaligned";
        case KVP_ERR_LAYER: return "KVP_ERR_LAYER: layer or head out of range";
        case KVP_ERR_FULL: return "KVP_ERR_FULL: no room in the layer";
        case KVP_ERR_NONFINITE: return "KVP_ERR_NONFINITE: NaN or Inf in input";
        case KVP_ERR_STATE: return "KVP_ERR_STATE: invalid in the current state";
        case KVP_ERR_UNSUPPORTED: return "KVP_ERR_UNSUPPORTED: not supported by this build";
        case KVP_ERR_BUFFER: return "KVP_ERR_BUFFER: output buffer too small";
        default: break;
    }
    return "KVP_ERR_?: unknown status";
}

kvp_status kvp_config_default(kvp_config *cfg, const kvp_model *model) {
    return kvp_config_default_ex(cfg, model, nullptr, 0);
}

kvp_status kvp_config_default_ex(kvp_config *cfg, const kvp_model *model, char *err, size_t err_len) {
    char buf[256];
    Msg m(buf, sizeof buf);
    return report(kvp::config_default(cfg, model, m), m.c_str(), err, err_len);
}

kvp_status kvp_config_init(kvp_config *cfg, uint32_t struct_size, const kvp_model *model) {
    return kvp_config_init_ex(cfg, struct_size, model, nullptr, 0);
}

kvp_status kvp_config_init_ex(kvp_config *cfg, uint32_t struct_size, const kvp_model *model, char *err,
                              size_t err_len) {
    char buf[256];
    Msg m(buf, sizeof buf);
    return report(kvp::config_init(cfg, struct_size, model, m), m.c_str(), err, err_len);
}

kvp_status kvp_config_apply(kvp_config *cfg, const char *spec, char *err, size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    return report(kvp::config_apply(cfg, spec, m), m.c_str(), err, err_len);
}

kvp_status kvp_config_check(const kvp_config *cfg, char *err, size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    kvp_config full;
    kvp_status st = kvp::config_load(cfg, &full, m);
    if (st == KVP_OK) st = kvp::config_check(full, m);
    return report(st, m.c_str(), err, err_len);
}

size_t kvp_arena_size(const kvp_config *cfg) {
    Msg m(nullptr, 0);
    kvp_config full;
    if (kvp::config_load(cfg, &full, m) != KVP_OK || kvp::config_check(full, m) != KVP_OK) return 0;
    kvp::ArenaPlan p;
    return kvp::arena_plan(full, &p) ? p.total : 0;
}

kvp_status kvp_arena_advise(void *arena, size_t arena_len) {
    if (!arena) return KVP_ERR_ARG;
    return advise_huge(arena, arena_len) == 0 ? KVP_OK : KVP_ERR_UNSUPPORTED;
}

kvp_status kvp_create(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out) {
    return kvp_create_ex(cfg, arena, arena_len, out, nullptr, 0);
}

kvp_status kvp_create_ex(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out, char *err,
                         size_t err_len) {
    return kvp_create_rope(cfg, nullptr, 0, arena, arena_len, out, err, err_len);
}

kvp_status kvp_create_rope(const kvp_config *cfg, const double *inv_freq, uint32_t n, void *arena, size_t arena_len,
                           kvp_cache **out, char *err, size_t err_len) {
    return kvp_create_heads(cfg, inv_freq, n, nullptr, 0, arena, arena_len, out, err, err_len);
}

size_t kvp_arena_size_heads(const kvp_config *cfg, const uint8_t *roles, uint32_t n_roles) {
    Msg m(nullptr, 0);
    kvp_config full;
    bool stream = false;
    if (!cfg || kvp::config_load(cfg, &full, m) != KVP_OK || kvp::config_check(full, m) != KVP_OK ||
        kvp::roles_check(full, roles, n_roles, &stream, m) != KVP_OK)
        return 0;
    kvp::ArenaPlan p;
    return kvp::arena_plan(full, &p, nullptr, stream ? roles : nullptr) ? p.total : 0;
}

kvp_status kvp_create_heads(const kvp_config *cfg, const double *inv_freq, uint32_t n, const uint8_t *roles,
                            uint32_t n_roles, void *arena, size_t arena_len, kvp_cache **out, char *err, size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    if (!cfg || !out) {
        m.s("cfg and out must not be NULL");
        return report(KVP_ERR_ARG, m.c_str(), err, err_len);
    }
    kvp_config full;
    kvp_status st = kvp::config_load(cfg, &full, m);
    if (st == KVP_OK) st = kvp::config_check(full, m);
    if (st == KVP_OK) st = kvp::rope_table_check(full, inv_freq, n, m);  // issue 21
    bool stream = false;  // issue 32 item 2: a DuoAttention role table with a streaming head
    if (st == KVP_OK) st = kvp::roles_check(full, roles, n_roles, &stream, m);
    if (st != KVP_OK) return report(st, m.c_str(), err, err_len);
    if (!stream) roles = nullptr;  // no table, or every head retrieval: exactly kvp_create_rope
    kvp::ArenaPlan p;
    if (!kvp::arena_plan(full, &p, nullptr, roles)) {
        m.s("the arena size of this configuration overflows size_t");
        return report(KVP_ERR_CONFIG, m.c_str(), err, err_len);
    }
    void *owned = nullptr;
    if (!arena) {
#if KVP_NO_HEAP
        m.s("arena is NULL and this build has no heap (KVP_NO_HEAP): pass caller memory of kvp_arena_size bytes");
        return report(KVP_ERR_UNSUPPORTED, m.c_str(), err, err_len);
#else
        // from a whole huge page on, on huge-page boundaries and advised (kvp_arena_advise)
        const size_t al = p.total >= kHugePage ? size_t(kHugePage) : kvp::kAlign;
        owned = p.total <= SIZE_MAX - al ? aligned_alloc(al, kvp::align_up(p.total, al)) : nullptr;
        if (!owned) {
            m.s("cannot allocate an arena of ").u(p.total).s(" bytes");
            return report(KVP_ERR_ARENA, m.c_str(), err, err_len);
        }
        if (al == kHugePage) advise_huge(owned, kvp::align_up(p.total, al));
        arena = owned;
        arena_len = p.total;
#endif
    }
    if (arena_len < p.total) {
        m.s("arena_len=").u(arena_len).s(" is below kvp_arena_size=").u(p.total);
        return report(KVP_ERR_ARENA, m.c_str(), err, err_len);
    }
    if (reinterpret_cast<uintptr_t>(arena) % kvp::kAlign != 0) {
        m.s("arena address is not 64-byte aligned (address % 64 = ").u(reinterpret_cast<uintptr_t>(arena) % kvp::kAlign).s(")");
        return report(KVP_ERR_ARENA, m.c_str(), err, err_len);
    }
    // Two caches in one arena: creating over a live cache (created, not destroyed) would turn
    // its handle into an alias of the new one. Caught when the arena starts where that cache
    // does; arenas that overlap at other offsets are the caller's to avoid (kvprune.h).
    if (!owned && valid(static_cast<const kvp_cache *>(arena))) {
        m.s("the arena holds a live cache: kvp_destroy it first (or kvp_reset it to start a new sequence)");
        return report(KVP_ERR_STATE, m.c_str(), err, err_len);
    }
    int terr = 0;
    kvp_cache *c = kvp::cache_init(full, p, arena, &terr, inv_freq, roles);
    if (!c) {
#if !KVP_NO_HEAP
        free(owned);
#endif
        m.s("cannot start ").u(full.threads - 1).s(" worker threads (pthread_create error ").u(uint64_t(terr))
            .s("): use fewer threads");
        return report(KVP_ERR_STATE, m.c_str(), err, err_len);
    }
    c->owned = owned;
#if !KVP_NO_HEAP
    if (owned) {
        owned_add(c);
        *out = reinterpret_cast<kvp_cache *>(reinterpret_cast<uintptr_t>(c) | kOwnedTag);
        report(KVP_OK, "", err, err_len);
        return KVP_OK;
    }
#endif
    *out = c;
    report(KVP_OK, "", err, err_len);
    return KVP_OK;
}

void kvp_destroy(kvp_cache *h) {
    kvp_cache *c = untag(h);
    if (!c) return;
#if !KVP_NO_HEAP
    if (reinterpret_cast<uintptr_t>(h) & kOwnedTag) {
        // Only a live owned cache no call is using is destroyed; anything else (destroyed
        // before, busy) is left alone, and its memory is not read unless it is on the list.
        if (!owned_take(c)) return;
        kvp::cache_stop(c);  // joins the worker threads
        __atomic_store_n(&c->magic, kvp::kDeadMagic, __ATOMIC_RELAXED);
        free(c->owned);
        return;
    }
#endif
    // Caller memory: a cache that is busy (another thread is inside a call on it) is left alone;
    // the flag stays held, so every later call on the handle fails.
    if (!valid(c) || !acquire(c)) return;
    kvp::cache_stop(c);  // joins the worker threads
    __atomic_store_n(&c->magic, kvp::kDeadMagic, __ATOMIC_RELAXED);
}

kvp_status kvp_reset(kvp_cache *h) {
    // The only failures are handles that are not live caches or busy: kvp_last_error(c)
    // describes the first kind (NULL, destroyed, not a cache) without a cache to write to.
    Guard g(h);
    if (!g.ok()) return g.status();
    kvp::cache_reset(g.get());
    return KVP_OK;
}

}  // extern "C"

namespace {

// kvp_prefill / kvp_prefill_ex: q, k, v and out are rows of type dt (checked).
kvp_status prefill_impl(kvp_cache *h, uint32_t layer, uint32_t n_tokens, const int32_t *positions, kvp_io_dtype dtype,
                        const void *q, const void *k, const void *v, void *out, kvp_selection *sel) {
    Guard g(h);
    if (!g.ok()) return g.status();
    kvp_cache *c = g.get();
    char buf[256];
    Msg m(buf, sizeof buf);
    if (!io_dtype_ok(dtype, m)) return fail(c, KVP_ERR_ARG, m);
    const uint32_t dt = uint32_t(dtype);
    if (out && !q) { m.s("q must not be NULL when out is given"); return fail(c, KVP_ERR_ARG, m); }
    if (sel && (!kvp::struct_size_ok(sel->struct_size, kSelectionFirstSize, sizeof(kvp_selection)) || (sel->capacity && !sel->indices))) {
        m.s("sel: struct_size must be sizeof(kvp_selection) and indices non-NULL when capacity > 0");
        return fail(c, KVP_ERR_ARG, m);
    }
    // q is read when outputs are asked for, by policies that observe or stage the prompt, and
    // for a prompt held whole (max_prompt: q marks the call as a prompt's, prompt.h)
    const bool reads_q = q && (out || (layer < c->cfg.model.n_layers && (c->layers[layer].geom.lp.obs_queries ||
                                                                          c->layers[layer].geom.lp.obs_extra ||
                                                                          c->layers[layer].geom.lp.obs_all ||
                                                                          c->layers[layer].geom.lp.staged_prefill ||
                                                                          kvp::prompt_takes(c, layer))));
    kvp_status st;
    // A prefill without q stores tokens without attention, as kvp_append does: it ends an open
    // prompt first (prompt.h). (With q into a sliding-window local layer it is the prompt's.)
    if (!q && (st = end_prompt_for(c, layer, n_tokens, positions, dt, nullptr, k, v, out, m)) != KVP_OK)
        return fail(c, st, m);
    st = check_tokens(c, layer, n_tokens, positions, dt, kvp::draft_open(c) || reads_q ? q : nullptr, k, v, out, true, m);
    if (st != KVP_OK) return fail(c, st, m);
    const kvp::In qi(q, dt), ki(k, dt), vi(v, dt);
    const kvp::Out oi(out, dt);
    if (kvp::draft_open(c)) {  // a draft call: appends and attends only (draft.h)
        if (sel) { sel->n = 0; sel->selected = 0; }
        kvp::draft_step(c, layer, n_tokens, positions, qi, ki, vi, oi, false);
        return KVP_OK;
    }
    // A call that may make a selection (asl) needs room for it before anything changes.
    const kvp::Policy &pol = *c->policy;
    const uint32_t need = pol.selection_size ? pol.selection_size(kvp::policy_ctx(c, layer), n_tokens, q != nullptr) : 0;
    if (need && (!sel || sel->capacity < need)) {
        if (sel) { sel->n = need; sel->selected = 0; }
        m.s("policy ").s(pol.name).s(": this prefill of layer ").u(layer).s(" may select up to ").u(need)
            .s(" tokens; sel must hold them");
        if (sel) m.s(" (sel->capacity=").u(sel->capacity).s("; sel->n is set to the entries needed)");
        else m.s(" (sel is NULL)");
        return fail(c, KVP_ERR_BUFFER, m);
    }
    if (q && kvp::prompt_takes(c, layer)) kvp::prompt_prefill(c, layer, n_tokens, positions, qi, ki, vi, oi);
    else kvp::cache_step(c, layer, n_tokens, positions, qi, ki, vi, oi, kvp::StepMode::kPrefill);
    if (sel) {
        sel->n = 0;
        sel->selected = 0;
        const int32_t *idx = nullptr;
        const uint32_t got = pol.selection ? pol.selection(kvp::policy_ctx(c, layer), &idx) : 0;
        if (got && got <= sel->capacity) {  // got <= need <= capacity
            memcpy(sel->indices, idx, size_t(got) * sizeof(int32_t));
            sel->n = got;
            sel->selected = 1;
        }
    }
    return KVP_OK;
}

kvp_status decode_impl(kvp_cache *h, uint32_t layer, kvp_io_dtype dtype, const void *q, const void *k, const void *v,
                       void *out) {
    Guard g(h);
    if (!g.ok()) return g.status();
    kvp_cache *c = g.get();
    char buf[256];
    Msg m(buf, sizeof buf);
    if (!io_dtype_ok(dtype, m)) return fail(c, KVP_ERR_ARG, m);
    const uint32_t dt = uint32_t(dtype);
    if (!q || !out) { m.s("q and out must not be NULL"); return fail(c, KVP_ERR_ARG, m); }
    kvp_status st;
    if ((st = end_prompt_for(c, layer, 1, nullptr, dt, q, k, v, out, m)) != KVP_OK) return fail(c, st, m);
    st = check_tokens(c, layer, 1, nullptr, dt, q, k, v, out, false, m);
    if (st != KVP_OK) return fail(c, st, m);
    const kvp::In qi(q, dt), ki(k, dt), vi(v, dt);
    const kvp::Out oi(out, dt);
    if (kvp::draft_open(c)) {  // draft.h
        kvp::draft_step(c, layer, 1, nullptr, qi, ki, vi, oi, true);
        return KVP_OK;
    }
    kvp::cache_step(c, layer, 1, nullptr, qi, ki, vi, oi, kvp::StepMode::kDecode);
    return KVP_OK;
}

kvp_status append_impl(kvp_cache *h, uint32_t layer, uint32_t n_tokens, const int32_t *positions, kvp_io_dtype dtype,
                       const void *k, const void *v) {
    Guard g(h);
    if (!g.ok()) return g.status();
    kvp_cache *c = g.get();
    char buf[256];
    Msg m(buf, sizeof buf);
    if (!io_dtype_ok(dtype, m)) return fail(c, KVP_ERR_ARG, m);
    const uint32_t dt = uint32_t(dtype);
    if (kvp::draft_open(c)) { m.s("a draft is open: kvp_append is refused until kvp_draft_commit (draft with kvp_prefill)"); return fail(c, KVP_ERR_STATE, m); }
    kvp_status st;
    if ((st = end_prompt_for(c, layer, n_tokens, positions, dt, nullptr, k, v, nullptr, m)) != KVP_OK) return fail(c, st, m);
    st = check_tokens(c, layer, n_tokens, positions, dt, nullptr, k, v, nullptr, false, m);
    if (st != KVP_OK) return fail(c, st, m);
    kvp::cache_step(c, layer, n_tokens, positions, kvp::In(), kvp::In(k, dt), kvp::In(v, dt), kvp::Out(),
                    kvp::StepMode::kAppend);
    return KVP_OK;
}

}  // namespace

extern "C" {

kvp_status kvp_prefill(kvp_cache *h, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                       const float *q, const float *k, const float *v, float *out, kvp_selection *sel) {
    return prefill_impl(h, layer, n_tokens, positions, KVP_IO_F32, q, k, v, out, sel);
}

kvp_status kvp_prefill_ex(kvp_cache *h, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                          kvp_io_dtype dtype, const void *q, const void *k, const void *v, void *out,
                          kvp_selection *sel) {
    return prefill_impl(h, layer, n_tokens, positions, dtype, q, k, v, out, sel);
}

kvp_status kvp_decode(kvp_cache *h, uint32_t layer, const float *q, const float *k, const float *v,
                      float *out) {
    return decode_impl(h, layer, KVP_IO_F32, q, k, v, out);
}

kvp_status kvp_decode_ex(kvp_cache *h, uint32_t layer, kvp_io_dtype dtype, const void *q, const void *k,
                         const void *v, void *out) {
    return decode_impl(h, layer, dtype, q, k, v, out);
}

kvp_status kvp_append(kvp_cache *h, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                      const float *k, const float *v) {
    return append_impl(h, layer, n_tokens, positions, KVP_IO_F32, k, v);
}

kvp_status kvp_append_ex(kvp_cache *h, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                         kvp_io_dtype dtype, const void *k, const void *v) {
    return append_impl(h, layer, n_tokens, positions, dtype, k, v);
}

namespace {
uint32_t layer_len_of(const kvp_cache *c, uint32_t layer) {
    uint32_t best = 0;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        const uint32_t l = kvp::head_of(c, layer, h).len();
        if (l > best) best = l;
    }
    return best;
}
}  // namespace

uint32_t kvp_layer_len(const kvp_cache *h, uint32_t layer) {
    Guard g(h);
    if (!g.ok() || layer >= g.get()->cfg.model.n_layers) return 0;
    return layer_len_of(g.get(), layer);
}

uint32_t kvp_layer_capacity(const kvp_cache *h, uint32_t layer) {
    const kvp_cache *c = untag(h);  // fixed at create: no guard needed
    if (!valid(c) || layer >= c->cfg.model.n_layers) return 0;
    return c->layers[layer].geom.lp.cap;
}

uint32_t kvp_prefill_room(const kvp_cache *h) {
    Guard g(h);
    if (!g.ok()) return 0;
    return kvp::cache_prefill_room(g.get());
}

kvp_status kvp_layer_positions(const kvp_cache *h, uint32_t layer, uint32_t kv_head, int32_t *out,
                               uint32_t cap, uint32_t *n) {
    Guard g(h);
    if (!g.ok()) return g.status();
    const kvp_cache *c = g.get();
    char buf[160];
    Msg m(buf, sizeof buf);
    if (!n || (!out && cap > 0)) {
        m.s("kvp_layer_positions: n must not be NULL, nor out when cap > 0");
        return fail_const(c, KVP_ERR_ARG, m);
    }
    if (layer >= c->cfg.model.n_layers || kv_head >= c->cfg.model.n_kv_heads) {
        m.s("kvp_layer_positions: layer ").u(layer).s(", kv_head ").u(kv_head).s(" out of range (n_layers=")
            .u(c->cfg.model.n_layers).s(", n_kv_heads=").u(c->cfg.model.n_kv_heads).s(")");
        return fail_const(c, KVP_ERR_LAYER, m);
    }
    const kvp::HeadStore &hs = kvp::head_of(c, layer, kv_head);
    *n = hs.len();
    if (cap < hs.len()) {
        m.s("kvp_layer_positions: cap=").u(cap).s(" is below the ").u(hs.len()).s(" positions kept (*n is set)");
        return fail_const(c, KVP_ERR_BUFFER, m);
    }
    kvp::store_positions(hs, c->pools[kv_head], out);
    return KVP_OK;
}

kvp_status kvp_get_stats(const kvp_cache *h, kvp_stats *s) {
    Guard g(h);
    if (!g.ok()) return g.status();
    const kvp_cache *c = g.get();
    char buf[160];
    Msg m(buf, sizeof buf);
    if (!sized_out(s ? &s->struct_size : nullptr, kStatsFirstSize, sizeof(kvp_stats), "kvp_stats", m)) return fail_const(c, KVP_ERR_ARG, m);
    kvp_stats r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof(kvp_stats);
    r.arena_bytes = c->plan.total;
    r.live_bytes = c->live_bytes;
    r.peak_live_bytes = c->peak_bytes;
    r.tokens_seen = c->tokens_seen;
    for (uint32_t l = 0; l < c->cfg.model.n_layers; ++l) {
        for (uint32_t hd = 0; hd < c->cfg.model.n_kv_heads; ++hd) {
            r.prune_events += kvp::head_of(c, l, hd).prune_events;
            r.tokens_evicted += kvp::head_of(c, l, hd).evicted;
        }
    }
    copy_out(s, r);
    return KVP_OK;
}

kvp_status kvp_get_layer_stats(const kvp_cache *h, uint32_t layer, kvp_layer_stats *s) {
    Guard g(h);
    if (!g.ok()) return g.status();
    const kvp_cache *c = g.get();
    char buf[160];
    Msg m(buf, sizeof buf);
    if (!sized_out(s ? &s->struct_size : nullptr, kLayerStatsFirstSize, sizeof(kvp_layer_stats), "kvp_layer_stats", m)) return fail_const(c, KVP_ERR_ARG, m);
    if (layer >= c->cfg.model.n_layers) { m.s("layer ").u(layer).s(" out of range (n_layers=").u(c->cfg.model.n_layers).s(")"); return fail_const(c, KVP_ERR_LAYER, m); }
    kvp_layer_stats r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    const kvp::LayerState &ls = c->layers[layer];
    r.capacity = ls.geom.lp.cap;
    r.len = layer_len_of(c, layer);
    r.live_bytes = ls.bytes;
    for (uint32_t hd = 0; hd < c->cfg.model.n_kv_heads; ++hd) {
        r.prune_events += kvp::head_of(c, layer, hd).prune_events;
        r.tokens_evicted += kvp::head_of(c, layer, hd).evicted;
    }
    r.evict_threshold = ls.evict_threshold;
    r.sparsity = ls.sparsity;
    r.lazy = ls.lazy;
    r.prompt_early = kvp::prompt_early(c, layer);
    copy_out(s, r);
    return KVP_OK;
}

const char *kvp_last_error(const kvp_cache *h) {
    const kvp_cache *c = untag(h);
    if (!c) return "KVP_ERR_ARG: invalid argument: NULL cache (why a kvp_create failed: kvp_create_ex)";
    if (magic_of(c) == kvp::kDeadMagic) return "KVP_ERR_STATE: invalid in the current state: the cache was destroyed";
    if (!valid(c)) return "KVP_ERR_ARG: invalid argument: not a live cache";
    return c->last_error;
}

uint32_t kvp_config_key_count(void) { return kvp::config_key_count(); }

kvp_status kvp_config_key(uint32_t index, kvp_key_info *info) {
    if (!info || !kvp::struct_size_ok(info->struct_size, kKeyInfoFirstSize, sizeof(kvp_key_info))) return KVP_ERR_ARG;
    return kvp::config_key_info(index, info) ? KVP_OK : KVP_ERR_ARG;
}

int kvp_config_key_used(const kvp_config *cfg, const char *name) {
    Msg m(nullptr, 0);
    kvp_config full;
    if (!name || kvp::config_load(cfg, &full, m) != KVP_OK) return -1;
    return kvp::config_key_used(full, name);
}

}  // extern "C"

// ---- speculative decoding (issue 21, src/draft.h) ----
extern "C" {

kvp_status kvp_draft_begin(kvp_cache *h) {
    Guard g(h);
    if (!g.ok()) return g.status();
    char buf[192];
    Msg m(buf, sizeof buf);
    if (!kvp::draft_open(g.get()) && g.get()->cfg.max_draft) kvp::prompt_finish_all(g.get());  // a draft ends the prompt
    const kvp_status st = kvp::draft_begin(g.get(), m);
    return st == KVP_OK ? st : fail(g.get(), st, m);
}

kvp_status kvp_prompt_end(kvp_cache *h) {
    Guard g(h);
    if (!g.ok()) return g.status();
    char buf[96];
    Msg m(buf, sizeof buf);
    if (kvp::draft_open(g.get())) {
        m.s("a draft is open: kvp_prompt_end after kvp_draft_commit");
        return fail(g.get(), KVP_ERR_STATE, m);
    }
    kvp::prompt_finish_all(g.get());
    return KVP_OK;
}

kvp_status kvp_set_parallel(kvp_cache *h, kvp_parallel_fn fn, void *user) {
    Guard g(h);
    if (!g.ok()) return g.status();
    kvp_cache *c = g.get();
#if !KVP_THREADS
    (void)fn;
    (void)user;
    char buf[128];
    Msg m(buf, sizeof buf);
    m.s("kvp_set_parallel: this build has no thread support (KVP_THREADS=OFF): every call runs on the caller");
    return fail(c, KVP_ERR_UNSUPPORTED, m);
#else
    // threads=1 has no pool: every call runs alone and fn would never be called.
    if (c->tpool) {
        c->tpool->host_fn = fn;
        c->tpool->host_user = fn ? user : nullptr;
    }
    return KVP_OK;
#endif
}

kvp_status kvp_query_stats_set(kvp_cache *h, uint32_t layer, uint32_t q_head, const float *mean,
                               const float *abs_mean, uint32_t n_units) {
    Guard g(h);
    if (!g.ok()) return g.status();
    kvp_cache *c = g.get();
    char buf[192];
    Msg m(buf, sizeof buf);
    const kvp_model &md = c->cfg.model;
    if (!mean || !abs_mean) {
        m.s("kvp_query_stats_set: mean and abs_mean must not be NULL");
        return fail(c, KVP_ERR_ARG, m);
    }
    if (layer >= md.n_layers || q_head >= md.n_q_heads) {
        m.s("kvp_query_stats_set: layer ").u(layer).s(", q_head ").u(q_head).s(" out of range (n_layers=")
            .u(md.n_layers).s(", n_q_heads=").u(md.n_q_heads).s(")");
        return fail(c, KVP_ERR_LAYER, m);
    }
    if (!c->policy->set_query_stats) {
        m.s("kvp_query_stats_set: policy=").s(c->policy->name).s(" scores without query statistics (triattention uses them)");
        return fail(c, KVP_ERR_UNSUPPORTED, m);
    }
    for (uint32_t i = 0; i < md.head_dim; ++i)
        if (!isfinite(mean[i])) {
            m.s("kvp_query_stats_set: mean[").u(i).s("] is not finite");
            return fail(c, KVP_ERR_NONFINITE, m);
        }
    const kvp::PolicyCtx ctx = kvp::policy_ctx(c, layer);
    const kvp_status st = c->policy->set_query_stats(ctx, q_head, mean, abs_mean, n_units, m);
    return st == KVP_OK ? st : fail(c, st, m);
}

kvp_status kvp_draft_commit(kvp_cache *h, uint32_t accepted) {
    Guard g(h);
    if (!g.ok()) return g.status();
    char buf[192];
    Msg m(buf, sizeof buf);
    const kvp_status st = kvp::draft_commit(g.get(), accepted, m);
    return st == KVP_OK ? st : fail(g.get(), st, m);
}

}  // extern "C"

// ---- state save/load (issue 21, src/state.h) ----
extern "C" {

size_t kvp_state_size(const kvp_cache *h) {
    Guard g(h);
    if (!g.ok()) return 0;
    return kvp::state_size(g.get());
}

kvp_status kvp_state_save(const kvp_cache *h, void *buf, size_t size, size_t *written) {
    Guard g(h);
    if (!g.ok()) return g.status();
    char b[192];
    Msg m(b, sizeof b);
    if (!buf) { m.s("buf must not be NULL"); return fail_const(g.get(), KVP_ERR_ARG, m); }
    if (kvp::prompt_any_open(g.get())) {
        m.s("a prompt is open (max_prompt): call kvp_prompt_end before kvp_state_save");
        return fail_const(g.get(), KVP_ERR_STATE, m);
    }
    const kvp_status st = kvp::state_save(g.get(), buf, size, written, m);
    return st == KVP_OK ? st : fail_const(g.get(), st, m);
}

kvp_status kvp_state_load(kvp_cache *h, const void *buf, size_t size) {
    Guard g(h);
    if (!g.ok()) return g.status();
    char b[256];
    Msg m(b, sizeof b);
    if (!buf) { m.s("buf must not be NULL"); return fail(g.get(), KVP_ERR_ARG, m); }
    // An open prompt (max_prompt) is dropped with everything else once the state is valid (state.cpp).
    const kvp_status st = kvp::state_load(g.get(), buf, size, m);
    return st == KVP_OK ? st : fail(g.get(), st, m);
}

}  // extern "C"

// ---- RoPE frequencies from the caller (issue 21; src/rope.cpp) ----

extern "C" {

kvp_status kvp_rope_check(const kvp_config *cfg, const double *inv_freq, uint32_t n, char *err, size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    if (!cfg) {
        m.s("cfg must not be NULL");
        return report(KVP_ERR_ARG, m.c_str(), err, err_len);
    }
    kvp_config full;
    kvp_status st = kvp::config_load(cfg, &full, m);
    if (st == KVP_OK) st = kvp::config_check(full, m);
    if (st == KVP_OK) st = kvp::rope_table_check(full, inv_freq, n, m);
    return report(st, m.c_str(), err, err_len);
}

kvp_status kvp_rope_freqs_linear(double *inv_freq, uint32_t n, double theta, double factor, char *err, size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    return report(kvp::rope_freqs_linear(inv_freq, n, theta, factor, m), m.c_str(), err, err_len);
}

kvp_status kvp_rope_freqs_llama3(double *inv_freq, uint32_t n, double theta, double factor, double low_freq_factor,
                                 double high_freq_factor, double original_max_position_embeddings, char *err,
                                 size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    return report(kvp::rope_freqs_llama3(inv_freq, n, theta, factor, low_freq_factor, high_freq_factor,
                                         original_max_position_embeddings, m),
                  m.c_str(), err, err_len);
}

kvp_status kvp_rope_freqs_yarn(double *inv_freq, uint32_t n, double theta, double factor,
                               double original_max_position_embeddings, double beta_fast, double beta_slow,
                               float *attn_factor, char *err, size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    return report(kvp::rope_freqs_yarn(inv_freq, n, theta, factor, original_max_position_embeddings, beta_fast,
                                       beta_slow, attn_factor, m),
                  m.c_str(), err, err_len);
}

kvp_status kvp_rope_freqs_divided(double *inv_freq, uint32_t n, double theta, const float *divisors, char *err,
                                  size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    return report(kvp::rope_freqs_divided(inv_freq, n, theta, divisors, m), m.c_str(), err, err_len);
}

}  // extern "C"
