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
#include "io.h"
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
    RopeMemo *memo;    // the running thread's
    float *work;       // attention scratch (ArenaPlan::scr_work): prefill tiles (the running
                       // thread's), decode logits [G][logit_ld] (the head's)
    float *part;       // decode partials, ArenaPlan::part_floats per chunk (the head's)
    float *priv;       // decode query rows [G][stride] (the running thread's); once they are dead, also
                       // a half call's output row or score=fixed query row (attention.cpp priv_stage)
    const FixedWork *fx = nullptr;  // score=fixed: the running thread's fixed-point scratch, else NULL
    uint32_t window = 0;            // sliding-window layer (sliding.h): prefill masks keys at pos <= p - window
                                    // per query at original position p; 0: causal only
    float *colsum = nullptr;        // prefill, float scores: every query's normalised weights summed per key
                                    // into colsum[g * plan.logit_ld + j] (zeroed by the caller; the
                                    // observation scratch of the thread's work area; h2o's every-query
                                    // prompt scores, attend_prefill_tiles)
    const FmtIn *fmt = nullptr;     // formatted store (quant/attn_fmt.h); NULL: plain f32 rows.
                                    // Its scratch is the running thread's: a formatted store's
                                    // decode is never split across threads (cache.cpp).
    size_t ld = 0;                  // decode logits' row stride in `work` (floats): 0 means
                                    // plan.logit_ld; a packed head area's own (arena.h head_need)
};

// Decode: the G query heads of the newest token (rows q[g*hd], out[g*hd]) attend over all L
// tokens, for the whole group at once (each K and V row is read once per step).
//
// Split-K: the keys are taken in decode_chunks(a) chunks of plan.granule logical keys (the
// granule depends on the geometry only, so the arithmetic is the same on every path and for
// every thread count). decode_chunk(ci) computes the chunk's logits into the head's logits at
// their logical indices (runs split at chunk boundaries), per row its max m_c, turns the logits
// into e = exp(s - m_c) with their sum l_c and sum of squares, and o_c = sum e*v from zero
// (formatted stores through quant/attn_fmt.h); it writes only its own partials and logits, so
// chunks may run in any order on any threads.
// decode_finish merges in chunk order: m = max_c m_c (exact), w_c = exp(m_c - m),
// l = sum_c w_c*l_c, out = (sum_c w_c*o_c) / l; when `scores`, each token's normalised mass
// e*w_c/l summed over the group is added to its slot score (the e are still in the logits: no
// second read of K); with score=fixed (a.fx) the fixed-point weights are added instead, from
// the int16 key copies of the query q at qpos (kernels/score_fixed.h). Returns the sum over the
// group of each row's Hoyer sparsity (sqrt(L) - |p|_1/|p|_2) / (sqrt(L) - 1) (0 when L == 1),
// |p|_2^2 = sum_c w_c^2 sumsq_c / l^2.
// With one chunk (L <= granule) every w is 1 and the result is the unsplit computation's.
// *cur: the position a.priv holds the query rotated at (INT64_MIN: none yet); a thread that
// runs several chunks of one head in a row keeps it.
uint32_t decode_chunks(const AttnIn &a);
void decode_chunk(const AttnIn &a, In q, int64_t qpos, uint32_t ci, int64_t *cur);
float decode_finish(const AttnIn &a, In q, int64_t qpos, Out out, bool scores);
// All chunks in order, then decode_finish.
float attend_decode(const AttnIn &a, In q, int64_t qpos, Out out, bool scores);

// Prefill: the n newest tokens attend causally. Token i's G query rows are at q + i*tok_stride
// (+ g*hd), its output rows at out + i*tok_stride. Tiles of kTileTokens tokens x G heads sweep
// logical key blocks of kKeyBlock keys with an online softmax (exact, one read of K/V per tile).
void attend_prefill(const AttnIn &a, uint32_t n, const QueryPos &qp, In q, Out out, size_t tok_stride);
// The same for new tokens [i_begin, i_end) only (i_begin a multiple of kTileTokens): tiles are
// independent, so any split of [0, n) gives the bits of attend_prefill.
// a.colsum (H2O's scores, arXiv 2306.14048 sec. 4: every query's attention summed per key): a
// tile's logits stay in the observation rows (plan.logit_ld apart) with each key block's running
// max; after the tile's sweep each block is rescaled to the row's final max, and the tile's rows,
// weighted by 1/l, are added to colsum in token order (score kernel `acc`). The attention bits are
// unchanged; the sums depend on the tile split, so a head's tiles run in order on one thread
// (cache.cpp never splits such a prefill). out may be NULL then (scores only).
void attend_prefill_tiles(const AttnIn &a, uint32_t n, const QueryPos &qp, In q, Out out,
                          size_t tok_stride, uint32_t i_begin, uint32_t i_end);

// colsum's rows (a.work's observation area), zeroed for a.L keys: set a.colsum to it.
float *colsum_rows(const AttnIn &a);

// Prefill observation: full softmax rows of the last w new tokens' queries over every key they
// see; returns obs with obs[g * plan.logit_ld + j] = sum over those queries of query head g's
// normalised weight on logical token j (j < L). Lives in the thread's scratch.
const float *observe_prefill(const AttnIn &a, uint32_t n, const QueryPos &qp, In q, size_t tok_stride,
                             uint32_t w);
// The same in fixed point (score=fixed): Q16 weight sums, saturating (kernels/score_fixed.h).
const uint32_t *observe_prefill_fixed(const AttnIn &a, uint32_t n, const QueryPos &qp, In q,
                                      size_t tok_stride, uint32_t w);

}  // namespace kvp
