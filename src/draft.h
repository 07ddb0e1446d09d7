// Speculative decoding (issue 21): draft tokens that kvp_draft_commit can take back.
//
// Between kvp_draft_begin and kvp_draft_commit, kvp_prefill and kvp_decode on a layer go to
// draft_step instead of cache_step: the call's positions and q/k/v, as given, are copied into the
// layer's part of the draft region (arena.h), and its queries attend over the layer's store plus
// the layer's draft tokens so far. The draft tokens never enter the store: their K rows (rotated
// where the twin prefill would rotate them) and V rows are written, for the call's layer only, to
// the pool's last `max_draft` slots (plain f32 storage) or to the draft rows (formatted storage,
// read through a kSrcStaged run), so nothing of the kept state changes (no append, no prune, no
// score, no observation, no counter). kvp_draft_commit then drops every draft token beyond
// `accepted` (a counter: no row moves) and runs the ordinary prefill (cache_step, without
// outputs) of the first `accepted` draft tokens of each layer, so the cache is by construction in
// the state of a twin that prefilled exactly those tokens: the same code on the same inputs.
// The core only: no policy knows about drafts.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "msg.h"

namespace kvp {

// The draft region's header (arena.h draft_offset): [0] 1 while a draft is open, [1 + l] the
// draft tokens of layer l. NULL when max_draft = 0.
inline uint32_t *draft_header(const kvp_cache *c) {
    if (!c->cfg.max_draft) return nullptr;
    return reinterpret_cast<uint32_t *>(reinterpret_cast<char *>(const_cast<kvp_cache *>(c)) + draft_offset(c->plan));
}
inline bool draft_open(const kvp_cache *c) { return c->cfg.max_draft && draft_header(c)[0] != 0; }

// Closes any draft (cache_init, cache_reset).
void draft_reset(kvp_cache *c);

// The position the layer's next token takes when the caller passes none (draft tokens included).
int64_t draft_next_pos(const kvp_cache *c, uint32_t layer);

// While a draft is open: whether n more draft tokens fit `layer` (max_draft, and the room a
// prefill of all its draft tokens would need at commit; prefill needs q; no ASL selection).
// KVP_OK or a status with a message; changes nothing.
kvp_status draft_check(const kvp_cache *c, uint32_t layer, uint32_t n, bool q, Msg &m);
// A checked draft call: stores the tokens, attends (out may be NULL for a prefill).
// q, k and v (f32 or half) are widened into the draft region as they are copied there.
void draft_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, In q, In k, In v, Out out,
                bool decode);

// kvp_draft_begin / kvp_draft_commit after the handle checks.
kvp_status draft_begin(kvp_cache *c, Msg &m);
kvp_status draft_commit(kvp_cache *c, uint32_t accepted, Msg &m);

}  // namespace kvp
