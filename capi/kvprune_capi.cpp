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
        default: break;
    }
    return "KVP_ERR_?: unknown status";
}

kvp_status kvp_config_default(kvp_config *cfg, const kvp_model *model) {
    char buf[8];
    Msg m(buf, sizeof buf);
    return kvp::config_default(cfg, model, m);
}

kvp_status kvp_config_apply(kvp_config *cfg, const char *spec, char *err, size_t err_len) {
    Msg m(err, err_len);
    return kvp::config_apply(cfg, spec, m);
}

kvp_status kvp_config_check(const kvp_config *cfg, char *err, size_t err_len) {
    Msg m(err, err_len);
    if (!cfg) { m.s("cfg must not be NULL"); return KVP_ERR_ARG; }
    return kvp::config_check(*cfg, m);
}

size_t kvp_arena_size(const kvp_config *cfg) {
    if (!cfg) return 0;
    Msg m(nullptr, 0);
    if (kvp::config_check(*cfg, m) != KVP_OK) return 0;
    kvp::ArenaPlan p;
    return kvp::arena_plan(*cfg, &p) ? p.total : 0;
}

kvp_status kvp_create(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out) {
    if (!cfg || !out) return KVP_ERR_ARG;
    Msg m(nullptr, 0);
    kvp_status st = kvp::config_check(*cfg, m);
    if (st != KVP_OK) return st;
    kvp::ArenaPlan p;
    if (!kvp::arena_plan(*cfg, &p)) return KVP_ERR_CONFIG;
    void *owned = nullptr;
    if (!arena) {
#if KVP_NO_HEAP
        return KVP_ERR_UNSUPPORTED;
#else
        owned = aligned_alloc(kvp::kAlign, kvp::align_up(p.total, kvp::kAlign));
        if (!owned) return KVP_ERR_ARENA;
        arena = owned;
        arena_len = p.total;
#endif
    }
    if (arena_len < p.total || reinterpret_cast<uintptr_t>(arena) % kvp::kAlign != 0) return KVP_ERR_ARENA;
    kvp_cache *c = kvp::cache_init(*cfg, p, arena);
    c->owned = owned;
    *out = c;
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
    if (sel && (sel->struct_size < sizeof(kvp_selection) || (sel->capacity && !sel->indices))) {
        m.s("sel: struct_size must be sizeof(kvp_selection) and indices non-NULL when capacity > 0");
        return fail(c, KVP_ERR_ARG, m);
    }
    // q is read when outputs are asked for, and by policies that observe or stage the prompt
    const bool reads_q = q && (out || (layer < c->cfg.model.n_layers && (c->layers[layer].geom.lp.obs_queries ||
                                                                          c->layers[layer].geom.lp.staged_prefill)));
    kvp_status st = check_tokens(c, layer, n_tokens, positions, reads_q ? q : nullptr, k, v, true, m);
    if (st != KVP_OK) return fail(c, st, m);
    kvp::cache_step(c, layer, n_tokens, positions, q, k, v, out, kvp::StepMode::kPrefill);
    if (sel) { sel->n = 0; sel->selected = 0; }
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
    if (!n || (!out && cap > 0)) return KVP_ERR_ARG;
    if (layer >= c->cfg.model.n_layers || kv_head >= c->cfg.model.n_kv_heads) return KVP_ERR_LAYER;
    const kvp::HeadStore &hs = kvp::head_of(c, layer, kv_head);
    *n = hs.len();
    if (cap < hs.len()) return KVP_ERR_FULL;
    kvp::store_positions(hs, c->pools[kv_head], out);
    return KVP_OK;
}

kvp_status kvp_get_stats(const kvp_cache *c, kvp_stats *s) {
    if (!valid(c)) return not_live(c);
    if (!s || s->struct_size < sizeof(kvp_stats)) return KVP_ERR_ARG;
    kvp_stats r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof(kvp_stats);
    r.arena_bytes = c->plan.total;
    r.live_bytes = c->live_rows * kvp::token_bytes(c);
    r.peak_live_bytes = c->peak_rows * kvp::token_bytes(c);
    r.tokens_seen = c->tokens_seen;
    for (uint32_t l = 0; l < c->cfg.model.n_layers; ++l) {
        for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
            r.prune_events += kvp::head_of(c, l, h).prune_events;
            r.tokens_evicted += kvp::head_of(c, l, h).evicted;
        }
    }
    memcpy(s, &r, sizeof r);
    return KVP_OK;
}

kvp_status kvp_get_layer_stats(const kvp_cache *c, uint32_t layer, kvp_layer_stats *s) {
    if (!valid(c)) return not_live(c);
    if (!s || s->struct_size < sizeof(kvp_layer_stats)) return KVP_ERR_ARG;
    if (layer >= c->cfg.model.n_layers) return KVP_ERR_LAYER;
    kvp_layer_stats r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    const kvp::LayerState &ls = c->layers[layer];
    r.capacity = ls.geom.lp.cap;
    r.len = kvp_layer_len(c, layer);
    r.live_bytes = ls.rows * kvp::token_bytes(c);
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        r.prune_events += kvp::head_of(c, layer, h).prune_events;
        r.tokens_evicted += kvp::head_of(c, layer, h).evicted;
    }
    r.evict_threshold = ls.evict_threshold;
    r.sparsity = ls.sparsity;
    r.lazy = ls.lazy;
    memcpy(s, &r, sizeof r);
    return KVP_OK;
}

const char *kvp_last_error(const kvp_cache *c) {
    if (!c) return "kvp_last_error: NULL cache";
    if (c->magic == kvp::kDeadMagic) return "kvp_last_error: cache was destroyed";
    if (!valid(c)) return "kvp_last_error: not a live cache";
    return c->last_error;
}

}  // extern "C"
