// Per (layer, KV head) token store over blocks of the shared pool (pool.h).
//
// Logical order (= ascending original position, = insertion order) is a pinned prefix
// followed by a body:
//   pinned  tokens 0..npin-1 in the blocks pin_blk[0..pnb): the attention sinks of `streaming`
//           (pin_cap = sinks; 0 for every other policy). A token goes to the prefix while
//           npin < pin_cap and the body is empty.
//   body    tokens npin..len-1 in a circular list of blocks blk[bhead..bhead+nb); the first body
//           token sits `roff` slots into the first block (the slots before it were evicted from
//           the front). Body token i lives at virtual slot roff + i of that list.
// Two evictions:
//   evict_front  the e oldest body tokens (streaming/window, and their self-prune): roff += e and
//                each block that empties goes back to the pool. O(blocks freed), zero copies.
//   compact      arbitrary tokens (scored policies): one pass from the first victim, each
//                survivor copied down over the gap, so ascending order is kept and the cost is
//                the rows moved (never the capacity); trailing blocks that empty go back to the
//                pool. Victims are body tokens.
// Attention reads the store as runs (Run): maximal sequences of consecutive logical tokens in
// physically consecutive slots that share one rotation delta.
//
// Realign without touching stored keys (DESIGN.md "Positions"): each slot records `rot`, the
// position its key was rotated at. In original mode rot = the original position and the query is
// rotated at its own original position. In realign mode a token's cache-relative position is its
// logical index j, and since RoPE logits depend only on position differences, attending with the
// query rotated at P + (rot - j) (P = the query's logical position) is exactly attention with the
// key re-rotated to j. A new body token gets rot = j + shift, where shift counts the tokens
// evict_front removed: a front eviction lowers every body token's j and raises shift by the same
// amount, so all ring tokens keep one delta (= shift) and streaming attends in two runs (sinks at
// delta 0, ring at shift) exactly as before. A compaction lowers the j of the survivors after a
// victim, so their deltas grow and the body splits into runs of equal delta; `scattered` records
// that, so the delta scan only runs for stores that need it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

namespace kvp {

struct Run {
    uint32_t slot;     // first slot (pool slot index)
    uint32_t n;        // tokens
    uint32_t logical;  // logical index of the first token
    int64_t delta;     // realign: rot - logical, equal for the whole run (0 in original mode)
};

struct HeadStore {
    uint32_t *pin_blk;   // [pin_blk_cap]
    uint32_t *blk;       // [blk_cap] circular
    uint32_t cap;        // hard cap on len()
    uint32_t pin_cap, pin_blk_cap, blk_cap;
    uint32_t npin, pnb;  // pinned tokens, pinned blocks held
    uint32_t bhead, nb;  // body blocks: first index in blk[], count
    uint32_t roff;       // evicted slots before the first body token in its block
    uint32_t count;      // body tokens
    int64_t shift;       // realign: tokens removed by evict_front so far
    bool scattered;      // a compaction happened since the last clear
    uint64_t prune_events, evicted;
    // Written by the thread that owns the head during a step, read by the layer phase.
    uint32_t len_after_append;
    float hoyer;         // sum over the group's query heads of the last decode row's Hoyer sparsity

    uint32_t len() const { return npin + count; }
    bool next_pinned() const { return npin < pin_cap && count == 0; }
};

// Slot of logical token j (< len).
uint32_t store_slot(const HeadStore &hs, uint32_t block, uint32_t j);
// New blocks the store needs to take n more tokens.
uint32_t store_blocks_needed(const HeadStore &hs, uint32_t block, uint32_t n);
// Slot for the next token, taking a block from the pool when needed; false (nothing changed)
// when the pool refuses. The caller writes the slot's data, then calls store_commit.
bool store_reserve(HeadStore &hs, BlockPool &pool, uint32_t layer, uint32_t *slot);
void store_commit(HeadStore &hs);
// Removes the e oldest body tokens (e <= count); realign adds e to shift. Counts one prune event.
void store_evict_front(HeadStore &hs, BlockPool &pool, uint32_t layer, uint32_t e, bool realign);
// Removes the body tokens at the ascending logical indices victims[0..nv) (all >= npin, < len)
// in one pass. Counts one prune event when nv > 0.
void store_compact(HeadStore &hs, BlockPool &pool, uint32_t layer, const uint32_t *victims, uint32_t nv,
                   uint32_t head_dim);
// The runs of the store in logical order into out (room for store_max_runs); returns how many.
// realign: deltas as described above (scans rot only for scattered stores); else all 0.
uint32_t store_runs(const HeadStore &hs, const BlockPool &pool, bool realign, Run *out);
// Upper bound of store_runs for a store of this plan.
inline size_t store_max_runs(uint32_t cap, uint32_t pin_blk_cap, uint32_t blk_cap) {
    return size_t(cap) + pin_blk_cap + blk_cap + 1;
}
// Original positions in logical (= ascending) order.
void store_positions(const HeadStore &hs, const BlockPool &pool, int32_t *out);
// Empty store (the pool is reset separately).
void store_clear(HeadStore &hs);

}  // namespace kvp
