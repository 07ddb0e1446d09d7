// Shared block pool (DESIGN.md "Shared block pool"): token slots come in blocks of `block`
// slots; for each KV head index there is one pool shared by all layers. Threads split KV heads,
// so a pool is only ever touched by one thread, and every allocation decision is deterministic.
//
// Slot arrays (one entry per slot, slot = block id * block + offset), all in the arena:
//   k, v   [slots][stride] floats, post-RoPE keys and values (rows 64-byte aligned)
//   pos    original position of the token
//   rot    position its key was rotated at (original mode: = pos; realign: see storage.h)
//   score  the policy's per-token score (32 bits)
// and per block the number of its dead slots (storage.h), so reading a store skips the per-slot
// dead check for every clean block. With score=fixed each slot also holds its key as the
// fixed-point scoring path's int16 row and exponent (kq, kexp; kernels/score_fixed.h).
// Past the blocks, slots [stage_slot, stage_slot + stage) are the prompt staging area
// (policy.h): in no block, never allocated, used only within one staged prefill call.
//
// Home ranges: the blocks are split into one contiguous home range per layer (with the default
// total_capacity each layer's home is exactly what it can ever hold). A layer takes blocks from
// its own home first, lowest id first, so its rows stay physically contiguous and attention
// reads them as few runs; only when its home is empty does it borrow from the other layers'
// homes (scanning layer+1, layer+2, ... in that fixed order). A freed block returns to its home.
//
// One slot space (plain f32 storage, arena.h): the pools' slot arrays and per-block arrays
// (next, dead, bseq) are each one array over all pools, so a block id and a slot number mean the
// same place in every pool. Pool h's own blocks are ids [base, base + nblocks), base = h *
// nblocks; its staging and draft slots follow all pools' blocks. Formatted storage keeps one
// data region per pool: base = 0 and the per-block arrays point at the pool's own part.
//
// Lending (heads that lend, policies/policy.h heads_lend: head_budget=ada, one slot space): a
// free block may move from one pool's free stacks to another's (lend), so a KV head whose store
// outgrows its home uses the blocks its layer's other heads leave. Only the calling thread moves
// blocks, between calls' parallel parts (cache_append.cpp lend_blocks: before the heads append,
// in KV head order), so while heads run in parallel each still touches its own pool only, and
// which block goes where is a function of the calls, not of the threads. A pool frees a block it
// got from another (an id outside its own range) to the freeing layer's home stack; reset gives
// every pool its own blocks back. The layer's heads share one hole allowance (arena.cpp
// layer_geom: a lending layer's home per pool holds its capacity's blocks plus one, without the
// per-head hole_cap, and some pools' one less: arena.h pool_home, the rounding shared too):
// before lending, lend_blocks compacts the head with the most dead slots while the layer's blocks
// and the call's need exceed its homes in all pools, or a head's need exceeds what the pools can
// give it.
//
// Reservation: each layer may always reach `min_blocks` blocks (what its policy needs to make
// progress), so a layer is never starved by the others: a layer at or above its minimum may take
// a block only while the free blocks exceed the other layers' unmet minimums. When it may not,
// the pool is "dry" for it and it frees room by its own policy's ranking (policy.h self_prune).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

namespace kvp {

struct FmtCache;  // quant/store_fmt.h

struct BlockPool {
    float *k, *v;                // plain f32 rows (NULL for formatted storage)
    const FmtCache *fc;          // formatted storage (quant/store_fmt.h: its rows); NULL for plain f32
    int32_t *pos, *rot;
    float *score;
    int16_t *kq, *kexp;          // score=fixed: [slots][kq_stride] rotated int16 key, [slots] exponent; else NULL
    uint32_t kq_stride;
    uint32_t stage_slot, stage;  // prompt staging slots (0 when the policy does not stage)
    uint32_t base;               // the pool's first block id (one slot space: h * nblocks; else 0)
    int32_t *next;               // [nblocks] free-stack links, -1 ends a stack
    uint32_t *dead;              // [nblocks] dead (evicted, not yet compacted) slots per block
    uint32_t *bseq;              // [nblocks] a body block's sequence number in its store (storage.h)
    int32_t *top;                // [n_layers] top of each home's free stack, -1 when empty
    uint32_t *held;              // [n_layers] blocks each layer holds
    const uint32_t *home_lo;     // [n_layers + 1] home of layer l = [home_lo[l], home_lo[l+1])
    const uint32_t *min_blocks;  // [n_layers]
    uint32_t n_layers, nblocks, block, stride;
    uint32_t nfree;
    uint32_t deficit;            // sum over layers of max(0, min_blocks - held)

    uint32_t deficit_of(uint32_t layer) const {
        return held[layer] < min_blocks[layer] ? min_blocks[layer] - held[layer] : 0;
    }
    // Blocks `layer` may take now, one after another, without breaking the other layers' reservations.
    uint32_t allowed(uint32_t layer) const {
        const uint32_t others = deficit - deficit_of(layer);
        return nfree > others ? nfree - others : 0;
    }
    // Takes a block for `layer` (home first); -1 when allowed(layer) == 0.
    int32_t alloc(uint32_t layer);
    // Moves one free block to pool `to`'s home stack of `layer` (lending, above): taken where
    // alloc(layer) would take it; false (nothing changed) when no block is free.
    bool lend(BlockPool &to, uint32_t layer);
    // Returns block b, held by `layer`, to its home (a lent block, not of this pool's ids: to the
    // home of `layer`).
    void release(uint32_t layer, uint32_t b);
    // All blocks free, in ascending order within each home.
    void reset();

    float *k_row(uint32_t slot) const { return k + size_t(slot) * stride; }
    float *v_row(uint32_t slot) const { return v + size_t(slot) * stride; }
    int16_t *kq_row(uint32_t slot) const { return kq + size_t(slot) * kq_stride; }
    // Copies every per-slot datum of slot `from` to slot `to`.
    void copy_slot(uint32_t to, uint32_t from) const {
        const size_t row = size_t(stride) * sizeof(float);
        memcpy(k_row(to), k_row(from), row);
        memcpy(v_row(to), v_row(from), row);
        copy_meta(to, from);
    }
    // Copies a slot's data except its K/V rows (formatted storage keeps those elsewhere).
    void copy_meta(uint32_t to, uint32_t from) const {
        pos[to] = pos[from];
        rot[to] = rot[from];
        memcpy(score + to, score + from, sizeof(float));
        if (kq) {
            memcpy(kq_row(to), kq_row(from), size_t(kq_stride) * sizeof(int16_t));
            kexp[to] = kexp[from];
        }
    }
};

}  // namespace kvp
