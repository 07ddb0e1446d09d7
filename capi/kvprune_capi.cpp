// The extern "C" layer: validates every argument, writes error text, never lets an exception
// out (the library is built with -fno-exceptions) and calls into src/ only with valid input.
// Every check runs before anything is mutated, so a failed call leaves the cache unchanged.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "cache.h"
#include "config.h"
#include "kvprune/kvprune.h"
#include "msg.h"

using kvp::Msg;

namespace {

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

bool valid(const kvp_cache *c) { return c && c->magic == kvp::kMagic; }

// Status for a handle that is not a live cache: a destroyed one (its caller memory still
// readable) is a state error, anything else a bad argument.
kvp_status not_live(const kvp_cache *c) { return c && c->magic == kvp::kDeadMagic ? KVP_ERR_STATE : KVP_ERR_ARG; }

// First non-finite float in x[0..n), or n.
size_t first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        if ((b & 0x7f800000u) == 0x7f800000u) return i;
    }
    return n;
}

kvp_status check_finite(const char *name, const float *x, size_t n, Msg &m) {
    const size_t i = first_nonfinite(x, n);
    if (i == n) return KVP_OK;
    m.s(name).s("[").u(i).s("] is NaN or Inf");
    return KVP_ERR_NONFINITE;
}

// Shared validation of the token-adding calls. q == NULL skips the query checks; `prefill`: a
// kvp_prefill call (with q, staged policies take the chunk through their staging area).
kvp_status check_tokens(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions,
                        const float *q, const float *k, const float *v, bool prefill, Msg &m) {
    const kvp_model &md = c->cfg.model;
    if (layer >= md.n_layers) {
        m.s("layer ").u(layer).s(" out of range (n_layers=").u(md.n_layers).s(")");
        return KVP_ERR_LAYER;
    }
    if (n == 0) { m.s("n_tokens must be >= 1"); return KVP_ERR_ARG; }
    if (!k || !v) { m.s("k and v must not be NULL"); return KVP_ERR_ARG; }
    const int64_t next = c->layers[layer].next_pos;
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
    const size_t nkv = size_t(n) * md.n_kv_heads * md.head_dim;
    kvp_status st;
    if (q && (st = check_finite("q", q, size_t(n) * md.n_q_heads * md.head_dim, m)) != KVP_OK) return st;
    if ((st = check_finite("k", k, nkv, m)) != KVP_OK) return st;
    if ((st = check_finite("v", v, nkv, m)) != KVP_OK) return st;
    if ((st = kvp::cache_room_check(c, layer, n, prefill && q, m)) != KVP_OK) return st;  // q: read (see kvp_prefill)
    return KVP_OK;
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
    char buf[8];
    Msg m(buf, sizeof buf);
    return kvp::config_default(cfg, model, m);
}

kvp_status kvp_config_init(kvp_config *cfg, uint32_t struct_size, const kvp_model *model) {
    char buf[8];
    Msg m(buf, sizeof buf);
    return kvp::config_init(cfg, struct_size, model, m);
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

kvp_status kvp_create(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out) {
    return kvp_create_ex(cfg, arena, arena_len, out, nullptr, 0);
}

kvp_status kvp_create_ex(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out, char *err,
                         size_t err_len) {
    char buf[320];
    Msg m(buf, sizeof buf);
    if (!cfg || !out) {
        m.s("cfg and out must not be NULL");
        return report(KVP_ERR_ARG, m.c_str(), err, err_len);
    }
    kvp_config full;
    kvp_status st = kvp::config_load(cfg, &full, m);
    if (st == KVP_OK) st = kvp::config_check(full, m);
    if (st != KVP_OK) return report(st, m.c_str(), err, err_len);
    kvp::ArenaPlan p;
    if (!kvp::arena_plan(full, &p)) {
        m.s("the arena size of this configuration overflows size_t");
        return report(KVP_ERR_CONFIG, m.c_str(), err, err_len);
    }
    void *owned = nullptr;
    if (!arena) {
#if KVP_NO_HEAP
        m.s("arena is NULL and this build has no heap (KVP_NO_HEAP): pass caller memory of kvp_arena_size bytes");
        return report(KVP_ERR_UNSUPPORTED, m.c_str(), err, err_len);
#else
        owned = aligned_alloc(kvp::kAlign, kvp::align_up(p.total, kvp::kAlign));
        if (!owned) {
            m.s("cannot allocate an arena of ").u(p.total).s(" bytes");
            return report(KVP_ERR_ARENA, m.c_str(), err, err_len);
        }
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
    kvp_cache *c = kvp::cache_init(full, p, arena);
    c->owned = owned;
    *out = c;
    report(KVP_OK, "", err, err_len);
    return KVP_OK;
}

void kvp_destroy(kvp_cache *c) {
    if (!valid(c)) return;
    c->magic = kvp::kDeadMagic;
#if !KVP_NO_HEAP
    free(c->owned);  // NULL for caller memory
#endif
}

kvp_status kvp_reset(kvp_cache *c) {
    // The only failures are handles that are not live caches: kvp_last_error(c) describes them
    // (NULL, destroyed, not a cache) without a cache to write to.
    if (!valid(c)) return not_live(c);
    kvp::cache_reset(c);
    return KVP_OK;
}

kvp_status kvp_prefill(kvp_cache *c, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                       const float *q, const float *k, const float *v, float *out, kvp_selection *sel) {
    if (!valid(c)) return not_live(c);
    char buf[160];
    Msg m(buf, sizeof buf);
    if (out && !q) { m.s("q must not be NULL when out is given"); return fail(c, KVP_ERR_ARG, m); }
    if (sel && (!kvp::struct_size_ok(sel->struct_size, kSelectionFirstSize, sizeof(kvp_selection)) || (sel->capacity && !sel->indices))) {
        m.s("sel: struct_size must be sizeof(kvp_selection) and indices non-NULL when capacity > 0");
        return fail(c, KVP_ERR_ARG, m);
    }
    // q is read when outputs are asked for, and by policies that observe or stage the prompt
    const bool reads_q = q && (out || (layer < c->cfg.model.n_layers && (c->layers[layer].geom.lp.obs_queries ||
                                                                          c->layers[layer].geom.lp.obs_extra ||
                                                                          c->layers[layer].geom.lp.staged_prefill)));
    kvp_status st = check_tokens(c, layer, n_tokens, positions, reads_q ? q : nullptr, k, v, true, m);
    if (st != KVP_OK) return fail(c, st, m);
    // A call that may make a selection (asl) needs room for it before anything changes.
    const kvp::Policy &pol = *c->policy;
    const uint32_t need = pol.selection_size ? pol.selection_size(c, layer, n_tokens, q != nullptr) : 0;
    if (need && (!sel || sel->capacity < need)) {
        if (sel) { sel->n = need; sel->selected = 0; }
        m.s("policy ").s(pol.name).s(": this prefill of layer ").u(layer).s(" may select up to ").u(need)
            .s(" tokens; sel must hold them");
        if (sel) m.s(" (sel->capacity=").u(sel->capacity).s("; sel->n is set to the entries needed)");
        else m.s(" (sel is NULL)");
        return fail(c, KVP_ERR_BUFFER, m);
    }
    kvp::cache_step(c, layer, n_tokens, positions, q, k, v, out, kvp::StepMode::kPrefill);
    if (sel) {
        sel->n = 0;
        sel->selected = 0;
        const int32_t *idx = nullptr;
        const uint32_t got = pol.selection ? pol.selection(c, layer, &idx) : 0;
        if (got && got <= sel->capacity) {  // got <= need <= capacity
            memcpy(sel->indices, idx, size_t(got) * sizeof(int32_t));
            sel->n = got;
            sel->selected = 1;
        }
    }
    return KVP_OK;
}

kvp_status kvp_decode(kvp_cache *c, uint32_t layer, const float *q, const float *k, const float *v,
                      float *out) {
    if (!valid(c)) return not_live(c);
    char buf[160];
    Msg m(buf, sizeof buf);
    if (!q || !out) { m.s("q and out must not be NULL"); return fail(c, KVP_ERR_ARG, m); }
    kvp_status st = check_tokens(c, layer, 1, nullptr, q, k, v, false, m);
    if (st != KVP_OK) return fail(c, st, m);
    kvp::cache_step(c, layer, 1, nullptr, q, k, v, out, kvp::StepMode::kDecode);
    return KVP_OK;
}

kvp_status kvp_append(kvp_cache *c, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                      const float *k, const float *v) {
    if (!valid(c)) return not_live(c);
    char buf[160];
    Msg m(buf, sizeof buf);
    kvp_status st = check_tokens(c, layer, n_tokens, positions, nullptr, k, v, false, m);
    if (st != KVP_OK) return fail(c, st, m);
    kvp::cache_step(c, layer, n_tokens, positions, nullptr, k, v, nullptr, kvp::StepMode::kAppend);
    return KVP_OK;
}

uint32_t kvp_layer_len(const kvp_cache *c, uint32_t layer) {
    if (!valid(c) || layer >= c->cfg.model.n_layers) return 0;
    uint32_t best = 0;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        const uint32_t l = kvp::head_of(c, layer, h).len();
        if (l > best) best = l;
    }
    return best;
}

uint32_t kvp_layer_capacity(const kvp_cache *c, uint32_t layer) {
    if (!valid(c) || layer >= c->cfg.model.n_layers) return 0;
    return c->layers[layer].geom.lp.cap;
}

uint32_t kvp_prefill_room(const kvp_cache *c) {
    if (!valid(c)) return 0;
    return kvp::cache_prefill_room(c);
}

kvp_status kvp_layer_positions(const kvp_cache *c, uint32_t layer, uint32_t kv_head, int32_t *out,
                               uint32_t cap, uint32_t *n) {
    if (!valid(c)) return not_live(c);
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

kvp_status kvp_get_stats(const kvp_cache *c, kvp_stats *s) {
    if (!valid(c)) return not_live(c);
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
        for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
            r.prune_events += kvp::head_of(c, l, h).prune_events;
            r.tokens_evicted += kvp::head_of(c, l, h).evicted;
        }
    }
    copy_out(s, r);
    return KVP_OK;
}

kvp_status kvp_get_layer_stats(const kvp_cache *c, uint32_t layer, kvp_layer_stats *s) {
    if (!valid(c)) return not_live(c);
    char buf[160];
    Msg m(buf, sizeof buf);
    if (!sized_out(s ? &s->struct_size : nullptr, kLayerStatsFirstSize, sizeof(kvp_layer_stats), "kvp_layer_stats", m)) return fail_const(c, KVP_ERR_ARG, m);
    if (layer >= c->cfg.model.n_layers) { m.s("layer ").u(layer).s(" out of range (n_layers=").u(c->cfg.model.n_layers).s(")"); return fail_const(c, KVP_ERR_LAYER, m); }
    kvp_layer_stats r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    const kvp::LayerState &ls = c->layers[layer];
    r.capacity = ls.geom.lp.cap;
    r.len = kvp_layer_len(c, layer);
    r.live_bytes = ls.bytes;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        r.prune_events += kvp::head_of(c, layer, h).prune_events;
        r.tokens_evicted += kvp::head_of(c, layer, h).evicted;
    }
    r.evict_threshold = ls.evict_threshold;
    r.sparsity = ls.sparsity;
    r.lazy = ls.lazy;
    copy_out(s, r);
    return KVP_OK;
}

const char *kvp_last_error(const kvp_cache *c) {
    if (!c) return "KVP_ERR_ARG: invalid argument: NULL cache (why a kvp_create failed: kvp_create_ex)";
    if (c->magic == kvp::kDeadMagic) return "KVP_ERR_STATE: invalid in the current state: the cache was destroyed";
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
