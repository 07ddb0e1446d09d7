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
//   evict        arbitrary body tokens (scored policies): each victim's slot is marked dead
//                (pos = -1) in O(1): it is no longer a token of the store (not in len(), the
//                logical order, attention or positions). When the dead slots exceed the store's
//                allowance `hole_cap` (the plan's; min(capacity/32, sqrt(capacity)), policy.h), or
//                room is needed, one compaction pass from the first dead slot copies each survivor down over the
//                gaps (ascending order kept; cost = rows moved, never the capacity) and the
//                trailing blocks that empty go back to the pool. So a policy that evicts one
//                token per decode step (h2o) moves O(capacity / hole_cap) rows per step on
//                average instead of up to the whole store, and outputs are bit-identical to
//                compacting at once: attention reads only live slots, and the kernels give the
//                same bits however a range is split into runs.
// Attention reads the store as runs (Run): maximal sequences of consecutive logical (live) tokens
// in physically consecutive slots that share one rotation delta.
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
    uint32_t src;      // formatted stores (quant/store_fmt.h): where the rows are; 0 otherwise
    int64_t delta;     // realign: rot - logical, equal for the whole run (0 in original mode)
};

constexpr int32_t kDeadSlot = -1;  // pos of a dead (evicted, not yet compacted) slot

struct HeadStore {
    uint32_t *pin_blk;   // [pin_blk_cap]
    uint32_t *blk;       // [blk_cap] circular
    uint32_t cap;        // hard cap on len()
    uint32_t pin_cap, pin_blk_cap, blk_cap;
    uint32_t hole_cap;   // dead body slots allowed before a compaction
    uint32_t npin, pnb;  // pinned tokens, pinned blocks held
    uint32_t bhead, nb;  // body blocks: first index in blk[], count
    uint32_t roff;       // evicted slots before the first body slot in its block
    uint32_t count;      // body slots in use, live and dead
    uint32_t holes;      // dead body slots
    uint32_t first_hole; // a lower bound of the first dead body slot's index (from roff), when holes > 0
    uint32_t seq_head;   // sequence number of the first body block (pool.bseq)
    int64_t shift;       // realign: tokens removed by evict_front so far
    bool scattered;      // a compaction happened since the last clear
    uint8_t role;        // kvp_head_role (DuoAttention, arena.h stream_geom): set at create, kept by
                         // store_clear; a streaming head is the core's, never the policy's (fills padding)
    uint32_t nres;       // formatted stores (quant/store_fmt.h): the body's last nres slots are the
                         // full-precision residual; 0 otherwise
    uint64_t prune_events, evicted;
    // Written by the thread that owns the head during a step, read by the layer phase.
    uint32_t len_after_append;
    float hoyer;         // sum over the group's query heads of the last decode row's Hoyer sparsity
    uint64_t pword[2];   // the policy's per-head values from the head's work to the layer phase
    uint32_t pflag;      // the policy's per-head flag, same use (cleared by store_clear)
    uint32_t deferred;   // formatted ThinK store under max_prompt (quant/store_fmt.h): its complete
                         // residual blocks wait, full precision, in the pool's deferred rows

    uint32_t len() const { return npin + count - holes; }
    uint32_t body_len() const { return count - holes; }
    bool next_pinned() const { return npin < pin_cap && count == 0; }
};

// Calls f(slot, n, j) for each maximal physically contiguous stretch of live tokens, in logical
// order: slots slot..slot+n-1 hold logical tokens j..j+n-1. Blocks that follow each other in the
// pool (the usual case: a layer takes its home blocks in ascending order) form one stretch; the
// pinned prefix and the body never share one (their realign deltas differ).
template <class F>
void store_for_each_live(const HeadStore &hs, const BlockPool &pool, F f) {
    const uint32_t block = pool.block;
    uint32_t ps = 0, pn = 0, pj = 0;  // the pending stretch
    auto add = [&](uint32_t slot, uint32_t n, uint32_t j) {
        if (pn && ps + pn == slot) {
            pn += n;
            return;
        }
        if (pn) f(ps, pn, pj);
        ps = slot;
        pn = n;
        pj = j;
    };
    for (uint32_t b = 0; b * block < hs.npin; ++b)
        add(hs.pin_blk[b] * block, hs.npin - b * block < block ? hs.npin - b * block : block, b * block);
    if (pn) f(ps, pn, pj);
    pn = 0;
    uint32_t j = hs.npin, left = hs.count, off = hs.roff;
    for (uint32_t b = 0; left > 0; ++b) {
        const uint32_t n = block - off < left ? block - off : left;
        const uint32_t bid = hs.blk[(hs.bhead + b) % hs.blk_cap], s0 = bid * block + off;
        if (pool.dead[bid] == 0) {
            add(s0, n, j);
            j += n;
        } else {  // split at dead slots
            uint32_t i = 0;
            while (i < n) {
                while (i < n && pool.pos[s0 + i] == kDeadSlot) ++i;
                uint32_t e = i;
                while (e < n && pool.pos[s0 + e] != kDeadSlot) ++e;
                if (e > i) {
                    add(s0 + i, e - i, j);
                    j += e - i;
                }
                i = e;
            }
        }
        left -= n;
        off = 0;
    }
    if (pn) f(ps, pn, pj);
}

// New blocks the store needs to take n more tokens.
uint32_t store_blocks_needed(const HeadStore &hs, uint32_t block, uint32_t n);
// Slot for the next token, taking a block from the pool when needed; false (nothing changed)
// when the pool refuses. The caller writes the slot's data, then calls store_commit.
bool store_reserve(HeadStore &hs, BlockPool &pool, uint32_t layer, uint32_t *slot);
void store_commit(HeadStore &hs);
// Removes the e oldest body tokens (e <= body_len()); realign adds e to shift. Counts one prune
// event. A store with dead slots is compacted first.
void store_evict_front(HeadStore &hs, BlockPool &pool, uint32_t layer, uint32_t e, bool realign);
// Evicts the body tokens in slots[0..nv) (live body slots): marks them dead, and compacts when
// the dead slots exceed hole_cap. Counts one prune event when nv > 0.
void store_evict(HeadStore &hs, BlockPool &pool, uint32_t layer, const uint32_t *slots, uint32_t nv);
// Removes every dead slot in one pass (survivors keep ascending order) and returns the blocks
// that empty to the pool.
void store_compact(HeadStore &hs, BlockPool &pool, uint32_t layer);
// The runs of the store in logical order into out (room for store_max_runs); returns how many.
// realign: deltas as described above (scans rot only for scattered stores); else all 0.
uint32_t store_runs(const HeadStore &hs, const BlockPool &pool, bool realign, Run *out);
// Upper bound of store_runs for a store of this plan.
inline size_t store_max_runs(uint32_t cap, uint32_t pin_blk_cap, uint32_t blk_cap) {
    return size_t(cap) + pin_blk_cap + blk_cap + 1;
}
// Blocks the store would need for n more tokens after its body kept only `keep` live tokens
// (compaction, or `front` evictions of the oldest), pinned part included.
uint64_t store_blocks_after(const HeadStore &hs, uint32_t block, uint32_t keep, bool front, uint32_t n);
// Original positions in logical (= ascending) order.
void store_positions(const HeadStore &hs, const BlockPool &pool, int32_t *out);
// Empty store (the pool is reset separately).
void store_clear(HeadStore &hs);

}  // namespace kvp
