// Arena layout: every byte a cache uses, planned from the config alone (kvp_arena_size is exact).
//
//   [kvp_cache object]                                   one struct
//   [LayerState x n_layers]
//   [HeadStore  x n_layers*n_kv_heads]
//   [block tables]        uint32 per (layer, head): pinned blocks then the circular body list
//   [home_lo x (L+1), min_blocks x L]                   pool home ranges and reservations (shared;
//                                                        per pool: a role table, pool_homes)
//   [BlockPool x n_kv_heads]
//   [pool bookkeeping]    next, dead, bseq [n_kv_heads*nblocks] (by block id over all pools), then
//                         per pool top[L], held[L]
//   [inv_freq x rope_dim/2 doubles]  (and score=fixed: its deterministic copy, score_fixed.h)
//   [RoPE tables for positions 0..2*max_cap-1]          realign with a compacting policy only
//   [score=fixed: Q14 RoPE tables for positions 0..2*(max_cap+stage)-1]  same condition
//   [formatted storage: FmtCache, FmtStore per store, FmtPool per pool, side rows, ThinK channel lists]
//   pool data, nblocks*block + stage + max_draft slots per KV head pool: plain f32 storage lays
//   them out as one slot space (pool.h "One slot space": each array below holds every pool's
//   slots, all pools' blocks first, then each pool's staging and draft slots); formatted storage
//   keeps one region per pool (head-major):
//     K [slots][stride] f32, V [slots][stride] f32, pos [slots] i32, rot [slots] i32, score [slots] f32
//     (formatted storage: K rows, V rows, V scale pairs, key grids, repack scratch, and with a
//      staged policy f32 staging K/V rows [stage][stride] each, instead of K, V)
//     score=fixed: kq [slots][kq_stride] i16, kexp [slots] i16
//     (then `stage` slots: the prompt staging area of staged policies, policy.h; then `max_draft`
//      slots: one layer's draft rows during a draft call, draft.h)
//   [RoPE tables of a call's positions: 1 or 2 ranges of min(max_cap, kRopeCallTables)]   (rope.h;
//                                                        none where the realign tables above exist)
//   [ThreadPool + thread handles]                       threads > 1 with thread support only
//   [policy state region]  Policy::state_bytes (layer-level policies: asl), if any
//   [draft region]  max_draft > 0 only (draft.h, draft_offset): open flag and drafted counts [L], per
//                   layer positions, q, k, v of its draft tokens; formatted storage: draft K/V rows
//                   [H][2][max_draft][stride]
//   RopeMemo x threads
//   scratch x threads:   RoPE tables | runs | attention work floats | decode partials (per
//                        split-K chunk) | decode query rows | policy scratch | fixed-point work |
//                        formatted
//
// Every region starts on a 64-byte boundary; a row's stride is head_dim rounded up to 16 floats,
// so every K/V row is 64-byte aligned. Blocks: each layer needs at most
//   ceil(pin_cap/block) + ceil((body_max [+ block-1 for a ring, whose front block is partly
//   evicted]) / block)
// blocks; the pool holds the sum over layers (default), or ceil(total_capacity/block) when
// total_capacity is below the sum of the layers' capacities (sharing). Where heads lend, a
// layer's home per pool is ceil(pin_cap/block) + ceil((body_max + block - 1)/block) without the
// hole allowance, which the layer's heads share (layer_geom; cache_append.cpp lend_blocks), and
// its homes in all pools hold floor(KV heads x (body_max + block - 1) / block) body blocks
// together (pool_home: some homes one block less; then each pool has its own home ranges). tests/test_capi.cpp and
// tests/test_pool.cpp pin the byte counts.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "align.h"
#include "kvprune/kvprune.h"
#include "policies/policy.h"
#include "quant/store_fmt.h"

namespace kvp {

constexpr uint32_t kTileTokens = 4;   // prefill: query tokens per tile
constexpr uint32_t kKeyBlock = 128;   // prefill: keys per online-softmax block
constexpr uint32_t kRopeCallTables = 512;  // RoPE tables of one call's positions (rope.h Rope::call)

// Decode split-K (attention.h): a KV head's keys are attended in chunks of this many logical
// tokens, on every path and for every thread count, so outputs do not depend on how many
// threads share the chunks. Chosen from the row stride alone: about kSplitBytes of K+V per chunk
// (a power of two, at least 64 tokens): 256 tokens at head_dim 128, 1024 at head_dim 32.
constexpr size_t kSplitBytes = size_t(256) << 10;
inline uint32_t decode_granule(uint32_t stride) {
    uint32_t g = 64;
    while (size_t(g) * 2 * 2 * stride * sizeof(float) <= kSplitBytes) g *= 2;
    return g;
}

// Overflow-checked size arithmetic for arena plans (32-bit size_t on armhf and Cortex-M): any
// overflow clears ok, and the plan is then rejected.
struct Sz {
    bool ok = true;
    size_t add(size_t a, size_t b) {
        if (a > SIZE_MAX - b) ok = false;
        return a + b;
    }
    size_t mul(size_t a, size_t b) {
        if (b && a > SIZE_MAX / b) ok = false;
        return a * b;
    }
    size_t al(size_t x) {  // align_up to kAlign
        if (x > SIZE_MAX - kAlign) ok = false;
        return align_up(x, kAlign);
    }
    size_t al16(size_t floats) { return al(mul(floats, sizeof(float))) / sizeof(float); }
    size_t fit(uint64_t v) {  // a 64-bit count as size_t (32-bit targets)
        if (v > SIZE_MAX) ok = false;
        return size_t(v);
    }
};

// A layer's plan and the block geometry derived from it.
struct LayerGeom {
    LayerPlan lp;
    uint32_t pin_blk_cap;   // pinned blocks
    uint32_t blk_cap;       // body block list entries
    uint32_t min_blocks;    // reservation (pool.h)
    uint32_t home_blocks;   // the layer's home per pool (pool.h): max_blocks(), or where heads lend
                            // (policy.h heads_lend) the blocks of the layer's capacity only
    // all one head's store can ever hold (for lp.store_cap tokens)
    uint32_t max_blocks() const { return pin_blk_cap + blk_cap; }
};
// *home_short (when given): where heads lend, how many of the layer's n_kv_heads homes hold one
// block less than home_blocks (the rounding shared: pool_home); 0 otherwise. (Not a LayerGeom
// field: every layer's state would grow by 8 bytes.)
void layer_geom(const kvp_config &cfg, uint32_t layer, LayerGeom *g, uint32_t *home_short = nullptr);
// Layer g's home in pool h of H (not a shared pool's: cache_init splits those in proportion to
// home_blocks). Where heads lend, `short_homes` of the layer's H homes hold one block less than
// home_blocks: those of the pools from `rot` on (cyclically). Over the layers rot starts at 0 and
// moves on by the layer's short homes after each, so the short homes go round the pools in turn
// and every pool's sum is within one block of the others' (arena_plan sizes the pools by the
// largest: the layers' sum of home_blocks, less the short homes over H rounded down).
inline uint32_t pool_home(const LayerGeom &g, uint32_t short_homes, uint32_t H, uint32_t h, uint32_t rot) {
    return g.home_blocks - ((h + H - rot) % H < short_homes ? 1u : 0u);
}
// Test hook (as policies/h2o.h h2o_ada_fast_max) for lending layers' homes: 0 plans them with
// every head's hole allowance, as before the heads shared it; 1 shares the allowance but rounds
// each home up on its own; 2 (the default) shares the rounding too (test_ada compares them).
extern uint32_t lend_lean_homes;

// DuoAttention (issue 32 item 2, DECISIONS "DuoAttention heads"): the geometry of a streaming
// head's store, the core's like a local layer's (sliding.h): duo_sink pinned tokens and a ring
// (front eviction) of the duo_window - 1 newest plus a call's at most duo_window tokens, every
// block reserved (min_blocks = max_blocks).
void stream_geom(const kvp_config &cfg, LayerGeom *g);
// A role table with a streaming head (NULL: none, or every head retrieval).
inline bool roles_stream(const uint8_t *roles, uint32_t n) {
    if (!roles) return false;
    for (uint32_t i = 0; i < n; ++i)
        if (roles[i] == KVP_HEAD_STREAMING) return true;
    return false;
}
// The geometry of store (layer, h): stream_geom for a streaming head, else the layer's.
inline const LayerGeom &store_geom(const LayerGeom &layer, const LayerGeom &stream, const uint8_t *roles, uint32_t H,
                                   uint32_t l, uint32_t h) {
    return roles && roles[size_t(l) * H + h] == KVP_HEAD_STREAMING ? stream : layer;
}

struct ArenaPlan {
    uint32_t stride;         // floats per K/V row
    uint32_t block;          // slots per block
    uint32_t nblocks;        // blocks per pool (per KV head index)
    uint32_t max_cap;        // max layer capacity
    uint32_t logit_ld;       // decode / observation logits row stride (floats): >= max_cap + stage
    uint32_t stage;          // prompt staging slots per pool (0: no staged policy)
    uint32_t kq_stride;      // score=fixed: int16 per scoring key row (0 otherwise)
    bool shared;             // total_capacity below the sum of the layers' capacities
    bool decode_scores;      // some layer's decode scores its tokens (split areas keep logits)
    uint64_t sum_cap;        // sum of the layers' capacities (tokens per KV head)
    size_t max_runs;
    size_t off_layers, off_heads, off_tables, off_home, off_minb, off_pools;
    size_t off_pool_meta, block_meta_bytes;  // next, dead, bseq: one array each over all pools' block ids
    size_t off_pool_tops, pool_meta_bytes;   // per pool: top[L], held[L]
    bool one_space;          // plain f32 storage: one slot space and block-id space for all pools (pool.h)
    bool lend;               // heads lend blocks (one space and policies/policy.h heads_lend; pool.h)
    bool pool_homes;         // each pool has its own home ranges: a role table, or heads that lend
                             // where some layer's homes share their rounding (arena.h pool_home)
    uint32_t rope_full_n;    // precomputed RoPE positions (0: none)
    size_t off_rope_full;
    uint32_t fixed_rope_n;   // score=fixed: precomputed Q14 RoPE tables (positions 0..n-1), like rope_full_n
    size_t off_fixed_rope;
    // pool_data_bytes: the one slot space's bytes (one_space), else one pool's data region
    size_t off_freqs, off_fixed_freqs, off_data, pool_data_bytes, data_v, data_pos, data_rot, data_score;
    size_t data_kq, data_kexp;  // score=fixed (pool data offsets; 0 otherwise)
    uint32_t rope_call_n;    // RoPE call tables per range (0: none)
    uint32_t rope_call_ranges;
    size_t off_rope_call;
    size_t off_threads, threads_bytes;  // ThreadPool region (0 bytes: none)
    uint32_t granule;        // decode split-K chunk (tokens)
    uint32_t max_chunks;     // chunks of the longest layer
    size_t part_floats;      // decode partials per chunk: m, l, sumsq (G each, padded), o [G][stride]
    size_t off_pstate, pstate_bytes;  // the policy's state region (Policy::state_bytes; 0 bytes: none)
    size_t off_memos, off_scratch, scratch_bytes;
    // A thread's scratch: RoPE memo floats, then runs, work, partials, private rows (data only
    // while a call's per-head work runs), the policy scratch, fixed-point and formatted parts.
    // Participant 0's runs..priv hold the policy's phase region between per-head work
    // (policies/policy.h phase_bytes; work is enlarged where it does not fit).
    size_t memo_floats, scr_runs, scr_work, scr_part, scr_priv, scr_policy;
    // score=fixed scratch (offsets in a thread's scratch): quantized and rotated query rows
    // [G][kq_stride] i16, their exponents [G] i32, a rotation table [kq_stride] i16, logits
    // [G][logit_ld] i64, observation sums [G][logit_ld] u32.
    size_t fx_qx, fx_qr, fx_qe, fx_z, fx_cs, fx_y, fx_obs;  // fx_z: [G] u64 softmax sums, then [G] f64 1/sum
    // Formatted storage (quant/store_fmt.h FmtPlan, recomputed by cache_init): the pools' K/V
    // rows are replaced by its layout, its cache-wide region sits at off_fmt, each thread's part
    // at scr_fmt of its scratch.
    // kv_rotate=hadamard with formatted storage (issue 23) adds, after the formatted part of a
    // thread's scratch (at scr_fmt + the 64-aligned FmtPlan::scr_bytes: cache.h rotv_scratch),
    // the rotated copies of a staged prefill chunk's V rows [max_cap][stride] (the caller's V
    // rows are read in place otherwise). No field: kvp_cache's size stays that of 0.2.
    size_t off_fmt, scr_fmt;
    size_t total;
};

// The draft region (draft.h; max_draft > 0 only) follows the policy state region: derived, so the
// plan (part of the cache object) does not grow. Per layer: positions [D] i32, q [D][n_q_heads*hd],
// k and v [D][n_kv_heads*hd] f32, each part 64-aligned, after a header of the open flag and the
// layers' draft counts (u32 x (1 + n_layers)).
inline size_t draft_offset(const ArenaPlan &p) { return p.off_pstate + align_up(p.pstate_bytes, kAlign); }
inline size_t draft_header_bytes(const kvp_config &cfg) { return align_up(sizeof(uint32_t) * (size_t(cfg.model.n_layers) + 1), kAlign); }
inline size_t draft_layer_bytes(const kvp_config &cfg, Sz &z) {
    const size_t D = cfg.max_draft, nq = size_t(cfg.model.n_q_heads) * cfg.model.head_dim,
                 nkv = size_t(cfg.model.n_kv_heads) * cfg.model.head_dim;
    return z.add(z.add(z.al(z.mul(D, sizeof(int32_t))), z.al(z.mul(z.mul(D, nq), sizeof(float)))),
                 z.mul(2, z.al(z.mul(z.mul(D, nkv), sizeof(float)))));
}

// Plans the arena of a config that passed the range and policy checks; false when a size
// overflows size_t (or the pool is smaller than the layers' reservations: *why is set then).
// roles: a DuoAttention role table with a streaming head (checked: roles_stream), or NULL. With
// one, each pool has its own home ranges and reservations (H x (L+1) and H x L words at
// off_home / off_minb), and nblocks is the largest pool's sum over layers of its stores' needs.
// Heads that lend (without a shared pool) whose homes share their rounding also give each pool its
// own home ranges (pool_home; ArenaPlan::pool_homes), the reservations staying shared.
bool arena_plan(const kvp_config &cfg, ArenaPlan *p, const char **why = nullptr, const uint8_t *roles = nullptr);

// Decode split-K (decode_granule): the chunks over L logical keys, and the key after chunk ci's
// last (chunk ci covers [ci * granule, decode_chunk_end)).
inline uint32_t decode_chunk_count(const ArenaPlan &p, uint32_t L) { return (L + p.granule - 1) / p.granule; }
inline uint32_t decode_chunk_end(const ArenaPlan &p, uint32_t ci, uint32_t L) {
    const uint32_t j0 = ci * p.granule;
    return L - j0 < p.granule ? L : j0 + p.granule;
}

// The split schedules' per-KV-head areas (cache.cpp head_area), one per KV head after the
// threads' scratch, only with threads > 1 (bytes 0 otherwise): a head's runs at 0, its group's
// logits at `work` (only when some layer's decode scores: otherwise a chunk's logits live in
// the running thread's scratch, dead once its pv is done), its decode partials at `part`.
// Derived from the plan's other fields (so the plan, part of the cache object, does not
// grow); arena_plan counts them with its own Sz, cache_step once per split call.
struct HeadAreaPlan {
    size_t off, bytes, work, part;
};
HeadAreaPlan head_area_plan(const ArenaPlan &p, uint32_t threads, uint32_t group, Sz &z);
// Where heads lend (ArenaPlan::lend), the areas are packed instead (cache.cpp area_of): head h's
// after those of heads 0..h-1, each sized for the L tokens its store holds after the call's
// appends (its runs, at most one per token; its logits at row stride ld = L rounded up to 16;
// its chunks' partials), so together they follow the layer's tokens (at most
// policies/policy.h layer_tokens_cap) rather than KV heads x the longest store. Offsets within
// the head's area; bytes a multiple of kAlign.
struct HeadNeed {
    size_t work, part, bytes;
    uint32_t ld;
};
HeadNeed head_need(const ArenaPlan &p, uint32_t group, uint32_t L);
// The runs a store may have beyond one per token (head_need: at most L + this, and max_runs).
inline size_t run_slack(const ArenaPlan &p) { return p.max_runs > p.max_cap ? p.max_runs - p.max_cap : p.max_runs; }

}  // namespace kvp
