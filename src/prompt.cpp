// Whole-prompt selection across chunks (prompt.h).
#include "prompt.h"

#include <string.h>

#include "cache.h"
#include "config.h"
#include "policies/policy.h"
#include "quant/format.h"
#include "sliding.h"

namespace kvp {
namespace {

struct PromptHdr {
    uint32_t open;   // the layer's prompt is open (its stores may hold capacity + P)
    uint32_t early;  // selections made before a prompt ended
    uint32_t nq;     // queries kept (<= W)
    uint32_t pad;
};

size_t layer_meta_bytes(uint32_t w) { return align_up(sizeof(PromptHdr) + size_t(w) * sizeof(int32_t), kAlign); }
size_t q_row_floats(const kvp_config &cfg) { return size_t(cfg.model.n_q_heads) * cfg.model.head_dim; }
size_t layer_bytes(const kvp_config &cfg, uint32_t w) {
    return layer_meta_bytes(w) + align_up(size_t(w) * q_row_floats(cfg) * sizeof(float), kAlign);
}
uint32_t window_of(const kvp_cache *c) { return *reinterpret_cast<const uint32_t *>(c->prompt); }
char *layer_base(const kvp_cache *c, uint32_t layer) {
    return c->prompt + kAlign + size_t(layer) * layer_bytes(c->cfg, window_of(c));
}
PromptHdr &hdr(const kvp_cache *c, uint32_t layer) { return *reinterpret_cast<PromptHdr *>(layer_base(c, layer)); }
int32_t *kept_pos(const kvp_cache *c, uint32_t layer) {
    return reinterpret_cast<int32_t *>(layer_base(c, layer) + sizeof(PromptHdr));
}
float *kept_q(const kvp_cache *c, uint32_t layer) {
    return reinterpret_cast<float *>(layer_base(c, layer) + layer_meta_bytes(window_of(c)));
}

// Every KV head of the layer may hold its store's cap (the capacity; twice it where heads lend,
// policy.h store_cap) + the room (open), or its store's cap (closed).
void set_caps(kvp_cache *c, uint32_t layer, bool open) {
    const uint32_t cap = c->layers[layer].geom.lp.store_cap + (open ? layer_prompt_room(c->cfg, layer) : 0);
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) head_of(c, layer, h).cap = cap;
}

void open_layer(kvp_cache *c, uint32_t layer) {
    PromptHdr &ph = hdr(c, layer);
    ph.open = 1;
    ph.nq = 0;
    set_caps(c, layer, true);
}

// Ends the layer's prompt: the selection over everything it holds, from the kept queries.
void finish_layer(kvp_cache *c, uint32_t layer) {
    PromptHdr &ph = hdr(c, layer);
    set_caps(c, layer, false);  // the policy prunes to its own capacity
    // The kept queries are the stores' last tokens (every call that adds tokens otherwise ends the
    // prompt first): never more of them than a store holds.
    uint32_t w = ph.nq;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h)
        if (head_of(c, layer, h).len() < w) w = head_of(c, layer, h).len();
    const size_t drop = ph.nq - w;
    cache_prompt_select(c, layer, w, kept_pos(c, layer) + drop, kept_q(c, layer) + drop * q_row_floats(c->cfg));
    // Capacity binds, and the next token must fit: a prefill rule that left more than capacity - 1
    // (streaming with compress_every=0, or whose slack lands on its capacity) gives way to the
    // policy's own eviction ranking. (One prefill call could not reach that state: a prompt of
    // more than capacity is refused there.) Where heads lend, a head's bound is its store's cap
    // (its policy keeps the layer's total).
    const uint32_t cap = c->layers[layer].geom.lp.store_cap;
    cache_make_room(c, layer, cap ? cap - 1 : 0);
    ph.open = 0;
    ph.nq = 0;
}

// Keeps the last W queries (and positions) of the prompt: the n new tokens' after the older ones.
void keep_queries(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, int64_t first, In q) {
    const uint32_t W = window_of(c);
    if (!W) return;
    PromptHdr &ph = hdr(c, layer);
    const size_t row = q_row_floats(c->cfg);
    float *qs = kept_q(c, layer);
    int32_t *ps = kept_pos(c, layer);
    const uint32_t take = n < W ? n : W;
    if (ph.nq + take > W) {  // drop the oldest
        const uint32_t drop = ph.nq + take - W;
        memmove(qs, qs + size_t(drop) * row, size_t(ph.nq - drop) * row * sizeof(float));
        memmove(ps, ps + drop, size_t(ph.nq - drop) * sizeof(int32_t));
        ph.nq -= drop;
    }
    for (uint32_t t = n - take; t < n; ++t) {
        (q + size_t(t) * row).load(qs + size_t(ph.nq) * row, row);
        ps[ph.nq] = positions ? positions[t] : int32_t(first + t);
        ++ph.nq;
    }
}

// The fewest tokens the layer's head h can hold after its prompt's selection (what its policy
// cannot evict), for the admission of a chunk that would pass capacity + P.
// A layer of this config may keep a whole prompt (Policy::keeps_prompt).
bool keeps(const kvp_config &cfg) {
    const Policy &pol = policy_of(cfg);
    return pol.keeps_prompt && pol.keeps_prompt(cfg);
}

uint32_t floor_after_select(const kvp_cache *c, uint32_t layer, uint32_t h) {
    const HeadStore &hs = head_of(c, layer, h);
    PolicyCtx ctx{const_cast<kvp_cache *>(c), layer, h, &c->pools[h], nullptr, 0, 0};
    ctx.prompt_w = 1;  // asked for after the prompt's end (policy.h evictable)
    uint32_t e = c->policy->evictable(ctx, hs);
    if (e > hs.body_len()) e = hs.body_len();
    return hs.len() - e;
}

}  // namespace

uint32_t layer_prompt_room(const kvp_config &cfg, uint32_t layer) {
    // A policy that neither prunes per head nor in a layer phase (full) never selects: a prompt
    // gets no room beyond its capacity.
    const Policy &pol = policy_of(cfg);
    return cfg.max_prompt && !layer_local(cfg, layer) && (pol.prune || pol.layer_phase) && !keeps(cfg) ? cfg.max_prompt : 0;
}

bool layer_prompt_holds(const kvp_config &cfg, uint32_t layer) {
    const Policy &pol = policy_of(cfg);
    return layer_prompt_room(cfg, layer) ||
           (cfg.max_prompt && !layer_local(cfg, layer) && (store_thin(cfg) || ((pol.prune || pol.layer_phase) && keeps(cfg))));
}

uint32_t prompt_window(const kvp_config &cfg) {
    if (!cfg.max_prompt) return 0;
    // ThinK chooses its channels at the prompt's end from its last obs_window queries
    uint32_t w = 0;
    const uint32_t thin = store_thin(cfg) ? cfg.obs_window : 0;
    for (uint32_t l = 0; l < cfg.model.n_layers; ++l) {
        if (!layer_prompt_holds(cfg, l)) continue;
        LayerGeom g;
        layer_geom(cfg, l, &g);
        uint32_t lw = g.lp.obs_queries > g.lp.obs_extra ? g.lp.obs_queries : g.lp.obs_extra;
        if (thin > lw) lw = thin;
        if (lw > w) w = lw;
    }
    return w;
}

bool prompt_used(const kvp_config &cfg) {
    for (uint32_t l = 0; l < cfg.model.n_layers; ++l)
        if (layer_prompt_holds(cfg, l)) return true;
    return false;
}

size_t prompt_region_bytes(const kvp_config &cfg, uint32_t w, Sz &z) {
    if (!prompt_used(cfg)) return 0;
    const size_t per = z.add(layer_meta_bytes(w), z.al(z.mul(z.mul(w, q_row_floats(cfg)), sizeof(float))));
    return z.add(kAlign, z.mul(per, cfg.model.n_layers));
}

void prompt_init(kvp_cache *c) {
    c->prompt = nullptr;
    if (!prompt_used(c->cfg)) return;
    Sz z;
    const uint32_t w = prompt_window(c->cfg);
    c->prompt = reinterpret_cast<char *>(c) + c->plan.off_memos - prompt_region_bytes(c->cfg, w, z);
    memset(c->prompt, 0, kAlign);
    *reinterpret_cast<uint32_t *>(c->prompt) = w;
}

void prompt_reset(kvp_cache *c) {
    if (!c->prompt) return;
    for (uint32_t l = 0; l < c->cfg.model.n_layers; ++l) {
        memset(&hdr(c, l), 0, sizeof(PromptHdr));
        set_caps(c, l, false);
    }
}

bool prompt_open(const kvp_cache *c, uint32_t layer) { return c->prompt && hdr(c, layer).open; }

bool prompt_any_open(const kvp_cache *c) {
    if (!c->prompt) return false;
    for (uint32_t l = 0; l < c->cfg.model.n_layers; ++l)
        if (hdr(c, l).open) return true;
    return false;
}

uint32_t prompt_early(const kvp_cache *c, uint32_t layer) { return c->prompt ? hdr(c, layer).early : 0; }

bool prompt_takes(const kvp_cache *c, uint32_t layer) { return c->prompt && layer_prompt_holds(c->cfg, layer); }

kvp_status prompt_room_check(const kvp_cache *c, uint32_t layer, uint32_t n, Msg &m) {
    const uint32_t P = c->cfg.max_prompt, R = layer_prompt_room(c->cfg, layer), cap = c->layers[layer].geom.lp.cap;
    if (n > P) {
        m.s("layer ").u(layer).s(": a prompt chunk of ").u(n).s(" tokens exceeds max_prompt=").u(P)
            .s(": chunk the prompt by kvp_prefill_room, or raise max_prompt");
        return KVP_ERR_FULL;
    }
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        const HeadStore &hs = head_of(c, layer, h);
        if (uint64_t(hs.len()) + n <= uint64_t(cap) + R) continue;
        // beyond capacity + P: the prompt so far is selected first (prompt.h); the policy must be
        // able to make room for the chunk
        if (uint64_t(floor_after_select(c, layer, h)) + n <= uint64_t(cap) + R) continue;
        m.s("layer ").u(layer).s(" holds ").u(hs.len()).s(" tokens; a prompt chunk of ").u(n).s(" does not fit capacity");
        if (R) m.s(" + max_prompt");
        m.s(" = ").u(uint64_t(cap) + R).s(" and policy ").s(c->policy->name).s(" cannot evict enough: raise ")
            .s(R ? "max_prompt or capacity" : "capacity");
        return KVP_ERR_FULL;
    }
    return KVP_OK;
}

void prompt_prefill(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, In q, In k, In v, Out out) {
    const uint32_t P = layer_prompt_room(c->cfg, layer), cap = c->layers[layer].geom.lp.cap;
    PromptHdr &ph = hdr(c, layer);
    uint32_t most = 0;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h)
        if (head_of(c, layer, h).len() > most) most = head_of(c, layer, h).len();
    if (uint64_t(most) + n > uint64_t(cap) + P) {  // beyond capacity + P
        if (ph.open) {  // select what the prompt has first
            finish_layer(c, layer);
            ++ph.early;
        }
        // what the selection left above it, or (a layer that holds its prompt within its capacity,
        // P = 0: the chunk opens a prompt over a full layer) what the layer held (prompt_room_check)
        cache_make_room(c, layer, cap + P - n);
    }
    if (!ph.open) open_layer(c, layer);
    const int64_t first = c->layers[layer].next_pos;
    cache_step(c, layer, n, positions, q, k, v, out, StepMode::kPrefill);
    keep_queries(c, layer, n, positions, first, q);
}

kvp_status prompt_end_check(const kvp_cache *c, uint32_t layer, uint32_t n, Msg &m) {
    const uint32_t cap = c->layers[layer].geom.lp.cap;
    for (uint32_t h = 0; h < c->cfg.model.n_kv_heads; ++h) {
        if (uint64_t(floor_after_select(c, layer, h)) + n <= cap) continue;
        m.s("layer ").u(layer).s(" holds an open prompt of ").u(head_of(c, layer, h).len())
            .s(" tokens; after its selection policy ").s(c->policy->name).s(" cannot make room for ").u(n)
            .s(" more within capacity ").u(cap).s(": raise capacity");
        return KVP_ERR_FULL;
    }
    return KVP_OK;
}

void prompt_end_for(kvp_cache *c, uint32_t layer, uint32_t n) {
    const bool open = prompt_open(c, layer);
    prompt_finish_all(c);
    if (open) cache_make_room(c, layer, c->layers[layer].geom.lp.cap - n);  // n <= cap (prompt_end_check)
}

void prompt_finish_all(kvp_cache *c) {
    if (!c->prompt) return;
    for (uint32_t l = 0; l < c->cfg.model.n_layers; ++l)
        if (hdr(c, l).open) finish_layer(c, l);
}

}  // namespace kvp
