// Attention of new tokens' queries over one (layer, KV head) store, read as runs (storage.h),
// with the kernel tables of the cache. Queries arrive pre-RoPE and are rotated here: for a run
// of delta d, the query at position p is rotated at p + d (storage.h explains why that is
// exactly realign; in original mode every delta is 0). The store already holds the new tokens.
//
// Key order is logical everywhere (logits are written at logical indices, prefill key blocks are
// logical ranges), and the kernels give bits that do not depend on how a range is split into
// runs, so where blocks sit physically never changes an output bit.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "quant/attn_fmt.h"

namespace kvp {

// Original position of new token i.
struct NewPositions {
    const int32_t *given;  // caller's positions, or NULL
    int64_t first;         // position of token 0 when given is NULL
    int64_t at(uint32_t i) const { return given ? given[i] : first + i; }
};

// The position a new token's query is rotated at before its run's delta is added.
struct QueryPos {
    const NewPositions *pos;
    bool realign;  // cache-relative: new token i sits at logical index L0 + i
    uint32_t L0;
    int64_t at(uint32_t i) const { return realign ? int64_t(L0) + i : pos->at(i); }
};

struct AttnIn {
    const kvp_cache *c;
    const BlockPool *pool;
    const Run *runs;
    uint32_t nr;
    uint32_t L;        // tokens in the store (runs cover logical 0..L-1)
    RopeMemo *memo;
    float *work;       // this thread's attention scratch (ArenaPlan::scr_work)
    const FixedWork *fx;  // score=fixed: this thread's fixed-point scratch, else NULL
    const FmtIn *fmt = nullptr;  // formatted store (quant/attn_fmt.h); NULL: plain f32 rows
};

// Decode: the G query heads of the newest token (rows q[g*hd], out[g*hd]) attend over all L
// tokens. Two passes for the whole group: logits of every run into scratch at logical indices,
// softmax per row, then one pass over V. When `scores`, each token's normalised attention mass
// summed over the group is added to its slot score (the logits are still in scratch: no second
// read of K); with score=fixed (a.fx) the fixed-point weights are added instead, from the
// int16 key copies (kernels/score_fixed.h). Returns the sum over the group of each row's Hoyer sparsity
// (sqrt(L) - |p|_1/|p|_2) / (sqrt(L) - 1) (0 when L == 1).
float attend_decode(const AttnIn &a, const float *q, int64_t qpos, float *out, bool scores);

// Prefill: the n newest tokens attend causally. Token i's G query rows are at q + i*tok_stride
// (+ g*hd), its output rows at out + i*tok_stride. Tiles of kTileTokens tokens x G heads sweep
// logical key blocks of kKeyBlock keys with an online softmax (exact, one read of K/V per tile).
void attend_prefill(const AttnIn &a, uint32_t n, const QueryPos &qp, const float *q, float *out, size_t tok_stride);

// Prefill observation: full softmax rows of the last w new tokens' queries over every key they
// see; returns obs with obs[g * plan.logit_ld + j] = sum over those queries of query head g's
// normalised weight on logical token j (j < L). Lives in the thread's scratch.
const float *observe_prefill(const AttnIn &a, uint32_t n, const QueryPos &qp, const float *q, size_t tok_stride,
                             uint32_t w);
// The same in fixed point (score=fixed): Q16 weight sums, saturating (kernels/score_fixed.h).
const uint32_t *observe_prefill_fixed(const AttnIn &a, uint32_t n, const QueryPos &qp, const float *q,
                                      size_t tok_stride, uint32_t w);

}  // namespace kvp
