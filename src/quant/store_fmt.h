// Formatted stores (quant/format.h: f16/q8/q4 and/or ThinK reduced width): how tokens move from
// the full-precision residual into the stored format, how attention reads a store whose tokens
// live in three places, repacking after evictions, and live bytes.
//
// Where a token's K/V are (per (layer, KV head) store, storage.h):
//   converted  in the pool slot, in the stored format (format.h)
//   residual   f32, full width, in the store's side rows (FmtStore): the tokens of the last,
//              incomplete body block from hs.nres on (KIVI's full-precision residual group), and
//              the pinned tokens of the last incomplete pinned block (from hs.pconv on). A side
//              row is indexed by the token's offset in its block.
//   staged     prefill/append tokens of the current call: K (rotated) in the thread's staging
//              rows, V read from the caller's array, until the call converts them. A staged
//              policy's prompt (policy.h) is in the pool's f32 staging rows (FmtPool::sk/sv):
//              attended as kSrcStaged, its kept tokens committed as residual tokens and then
//              converted like a prefill's new tokens (cache.cpp head_observe_prune).
// A block is converted when it completes, after the step's attention and before the policy's
// prune (KIVI order: the group that just filled is attended at full precision once). Prefill
// attention therefore reads the new tokens at full precision and the older ones as stored.
//
// ThinK under max_prompt (issue 28, prompt.h): a store whose channels are not chosen yet does not
// convert while its layer's prompt is open: the channels are chosen at the prompt's end, from its
// last queries over the whole prompt. Its blocks that complete meanwhile stay full precision in
// the pool's deferred rows (FmtPlan::dk/dv: f32 K and V for every slot of the pool, indexed by
// slot; only such configs have them) and HeadStore::deferred marks the store: its residual
// tokens in blocks that were complete before the current call are read there (kSrcDeferred).
// fmt_prompt_finish chooses the channels and converts them at the prompt's end.
//
// Evictions: front eviction (rings) moves nothing; a dead slot inside a block is masked (never
// read) until the store's compaction, which repacks: survivors move down, each target block's
// grid is recomputed over its tokens and its keys re-encoded (exact when the new grid is not
// coarser, format.cpp), the residual keeps full precision unless its block completes.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kernels/attn_q.h"
#include "io.h"
#include "kvprune/kvprune.h"
#include "pool.h"
#include "quant/format.h"
#include "storage.h"

struct kvp_cache;

namespace kvp {

struct AttnIn;
struct QueryPos;

// Per (layer, KV head) state of a formatted store (in the arena). The store's body residual is
// its last hs.nres slots (storage.h); the pinned tokens from pconv on are residual too.
struct FmtStore {
    float *side_k, *side_v;  // [side_rows][stride]: pinned residual rows, then pin_side + offset in block
    uint16_t *kidx, *vidx;   // ThinK: kept key / value channels, ascending ([wk], [wv])
    uint32_t selected;       // ThinK: the channel lists are set
    uint32_t pconv;          // pinned tokens converted (a multiple of the block)
    uint64_t bytes_after_append;  // live bytes after the step's appends (peak_live_bytes)
};

// One pool's formatted arrays: K rows, V rows, V scale pairs per slot, the dyadic key grid per
// block, and the pool's repack scratch.
struct FmtPool {
    uint8_t *kq, *vq;
    uint16_t *vsz;
    int8_t *kge;
    int16_t *kgz;
    char *pscr;
    float *sk, *sv;  // prompt staging rows of a staged policy ([stage][stride] f32 K rotated, V), else NULL
};

// Arena plan of formatted storage (computed by arena_plan for sizes, again by cache_init).
struct FmtPlan {
    bool on;
    StoreFormat f;
    uint32_t pin_side, side_rows, obs_rows;
    // One pool's data region (offsets from its base): K rows, V rows, V scale pairs, key grids,
    // repack scratch, the prompt staging rows (staged policies: `stage` f32 K rows, then V rows);
    // the slot metadata (pos, rot, score) follows at `end`.
    size_t kq, vq, vsz, kge, kgz, pscr, sk, sv, dk, dv, end;  // dk, dv: deferred rows (dk == dv: none)
    uint32_t stage;
    // Cache-wide region: FmtCache, FmtStore[stores], FmtPool[n_kv_heads], side rows, channel lists.
    size_t bytes, o_stores, o_pools, o_side, o_kidx, o_vidx;
    // One thread's scratch (offsets from its base): staging K rows, gathered / scaled queries,
    // value accumulator, ThinK's selection buffers.
    size_t scr_bytes, s_stage, s_qg, s_qs, s_bias, s_oacc, s_zacc, s_qi, s_qsc, s_think;
};

// Cache-wide state of formatted storage (in the arena; kvp_cache::fx).
struct FmtCache {
    StoreFormat f;
    FmtPlan fp;
    const kern::AttnQ *q;
    uint32_t stride;          // floats per side / staging row (plan.stride)
    uint32_t pin_side;        // side rows before the body's (max pinned tokens of one block)
    uint32_t side_rows;       // pin_side + block
    uint32_t n_kv_heads;      // store s uses pool s % n_kv_heads
    FmtStore *stores;         // [layer * n_kv_heads + head], parallel to kvp_cache::heads
    const HeadStore *heads;
    FmtPool *fpools;          // [n_kv_heads], parallel to kvp_cache::pools
    const BlockPool *pools;
};
inline FmtStore &fmt_store(const FmtCache &fc, const HeadStore &hs) { return fc.stores[&hs - fc.heads]; }
inline const FmtPool &fmt_pool(const FmtCache &fc, const BlockPool &p) { return fc.fpools[&p - fc.pools]; }
// Fills fp for a formatted config (fp->on false otherwise). max_pin: the largest pinned prefix
// of a layer; rows: query rows of a prefill tile; stage: prompt staging slots per pool (ArenaPlan).
// False on size_t overflow.
bool fmt_plan(const kvp_config &cfg, uint32_t stride, uint32_t block, uint32_t nblocks, uint32_t max_cap,
              uint32_t max_pin, uint32_t tile_rows, uint32_t stage, FmtPlan *fp);
// Wires the cache-wide region at `base` (cache_init), then each pool's arrays (its data region).
FmtCache *fmt_init_cache(const kvp_config &cfg, const FmtPlan &fp, char *base, const HeadStore *heads,
                         const BlockPool *pools);
void fmt_init_pool(FmtCache *fc, char *data, BlockPool *pool);
void fmt_reset_store(FmtStore &fs, const StoreFormat &f);

// Run::src of a formatted store: where the run's rows are.
enum : uint32_t {
    kSrcPool = 0,      // converted, in the pool slots
    kSrcPinSide = 1,   // residual pinned tokens: side row = slot % block
    kSrcBodySide = 2,  // residual body tokens: side row = pin_side + slot % block
    kSrcStaged = 3,    // this call's staged tokens: staging row = logical - L0
    kSrcDeferred = 4,  // ThinK under max_prompt: deferred rows of the store's pool, row = slot
};

// The new tokens of the current call when they are staged (prefill / append): token i is at
// logical L0 + i, K row k + i*ldk (rotated), V row v + i*ldv. n = 0: nothing staged.
struct StagedNew {
    uint32_t L0 = 0, n = 0;
    const float *k = nullptr, *v = nullptr;
    size_t ldk = 0, ldv = 0;
};

// Where a new token's K (and V, NULL when staged) rows go: its staging row, or its side row.
void fmt_new_rows(const kvp_cache *c, HeadStore &hs, uint32_t slot, bool pinned, float *stage_row, float **kr,
                  float **vr);
// The runs of a formatted store (as store_runs, also split by where the rows are: Run::src).
uint32_t fmt_runs(const kvp_cache *c, const HeadStore &hs, const BlockPool &pool, bool realign, const StagedNew &nw,
                  Run *out);
// Full-precision rows of logical token j of a residual / staged run (src != kSrcPool): K at *k,
// V at *v, successive tokens of the run ld[0] / ld[1] floats apart.
void fmt_run_rows(const FmtCache &fc, const FmtStore &fs, const StagedNew &nw, const Run &run, uint32_t j,
                  const float **k, const float **v, size_t *ld);

// What ThinK's channel selection may use from the current call (quant/think.h).
struct StepObs {
    const AttnIn *a;          // the store's attention input (its runs are rebuilt by ThinK)
    Run *runs;                // the thread's run buffer
    bool realign;
    char *scratch;            // the thread's formatted-storage scratch (FmtPlan::scr_bytes)
    In q;                     // this head's query rows (token i at q + i*tok_stride), NULL: none
    float *out;               // this head's attention output rows (same layout), NULL: none (or not f32)
    size_t tok_stride;
    uint32_t n;               // tokens of the call
    const QueryPos *qp;
    bool prompt = false;      // a chunk of an open prompt: a ThinK store without channels defers
};
// After the step's attention: converts every completed group (selecting ThinK's channels first
// when none are set), moves staged residual rows to the side rows.
void fmt_convert(kvp_cache *c, HeadStore &hs, BlockPool &pool, const StagedNew &nw, const StepObs &obs);
// The end of the layer's prompt for a deferred store (hs.deferred): chooses ThinK's channels from
// the observation (the prompt's last queries, obs.q/obs.n, no outputs) over every token the store
// holds, converts every complete block and clears the mark. Nothing to do otherwise.
void fmt_prompt_finish(kvp_cache *c, HeadStore &hs, BlockPool &pool, const StepObs &obs);
// store_compact of a formatted store with dead slots (storage.cpp).
void fmt_compact(HeadStore &hs, BlockPool &pool);
// Live bytes of a store in its storage format (no padding).
uint64_t fmt_store_bytes(const kvp_cache *c, const HeadStore &hs, const BlockPool &pool);

// Tests and tools: the K and V of logical token j of (layer, head) as attention uses them,
// full width (pruned channels 0, keys rotated as stored, at position *rot), and when kstep is
// not NULL each key channel's grid step (q8/q4 converted tokens; 0 otherwise). False for a bad
// index.
bool fmt_read_token(const kvp_cache *c, uint32_t layer, uint32_t head, uint32_t j, float *k, float *v, int64_t *rot,
                    float *kstep = nullptr);

}  // namespace kvp
