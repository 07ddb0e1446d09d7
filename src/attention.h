// Attention of new tokens' queries over one (layer, KV head) store, with the kernel table of
// the cache. Queries arrive pre-RoPE and are rotated here (see storage.h for how realign
// rotates the pinned and ring runs); the store already holds the new tokens' keys.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cache.h"

namespace kvp {

// Original position of new token i.
struct NewPositions {
    const int32_t *given;  // caller's positions, or NULL
    int64_t first;         // position of token 0 when given is NULL
    int64_t at(uint32_t i) const { return given ? given[i] : first + i; }
};

// Decode: the G query heads (rows q[g*hd], out[g*hd]) of the newest token attend over every
// token of hs (two passes: logits of the whole group kept in scratch, normalised, then one
// pass over V for all G heads together).
void attend_decode(const kvp_cache *c, const HeadStore &hs, const float *q, int64_t pos, float *out,
                   RopeMemo &memo, float *scratch);

// Prefill: the n newest tokens of hs attend causally. Token i's G query rows are at
// q + i*tok_stride (+ g*hd), its output rows at out + i*tok_stride. Tiles of kTileTokens
// tokens x G heads sweep key blocks with an online softmax (exact, one read of K/V per tile).
void attend_prefill(const kvp_cache *c, const HeadStore &hs, uint32_t n, const NewPositions &pos,
                    const float *q, float *out, size_t tok_stride, RopeMemo &memo, float *scratch);

}  // namespace kvp
