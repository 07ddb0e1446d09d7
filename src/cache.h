// The cache object (lives at offset 0 of its arena) and the operations behind the C API.
// Inputs reaching these functions were validated by capi/ (including cache_room_check): they do
// not fail.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "io.h"
#include "arena.h"
#include "kernels/attn_f32.h"
#include "kernels/rotate_f32.h"
#include "kernels/score_f32.h"
#include "kernels/vec_f32.h"
#include "kvprune/kvprune.h"
#include "msg.h"
#include "policies/policy.h"
#include "pool.h"
#include "rope.h"
#include "storage.h"
#include "threads.h"

namespace kvp {

struct LayerState {
    int64_t next_pos;          // position of the next token when the caller passes none
    uint64_t rows;             // tokens kept, summed over the layer's KV heads
    LayerGeom geom;            // plan and block geometry
    uint64_t bytes;            // live bytes of the layer (kvp_layer_stats)
    uint32_t evict_threshold;  // kvp_layer_stats (Lethe)
    float sparsity;            // kvp_layer_stats: Hoyer sparsity of the last decode row
    int32_t lazy;              // kvp_layer_stats (SimLayerKV); -1 undecided
    uint64_t pstate[4];        // the policy's per-layer state (zeroed by reset)
    bool observe_decode;       // the next decode hands its query's row to observe (LayerPlan::observe_first_decode)
};

}  // namespace kvp

struct kvp_cache {
    uint32_t magic;
    uint32_t busy;             // capi: 1 while a call runs on this cache (one call at a time)
    kvp_config cfg;
    kvp::ArenaPlan plan;
    const kvp::Policy *policy;
    uint32_t group;            // query heads per KV head
    kvp_positions positions;   // ORIGINAL or REALIGN
    float scale;               // 1/sqrt(head_dim)
    uint32_t rot;              // kv_rotate=hadamard: the rotation kernel's id (kernels/rotate_f32.h); 0: none
                               // (an id, not a pointer: it fills padding, kvp_cache keeps its size)
    kvp::Rope rope;
    const kvp::kern::AttnF32 *kern;
    const kvp::kern::ScoreF32 *skern;
    const kvp::kern::VecF32 *vkern;
    kvp::LayerState *layers;
    kvp::HeadStore *heads;     // [layer * n_kv_heads + head]
    kvp::BlockPool *pools;     // [n_kv_heads]
    char *scratch;             // [threads][plan.scratch_bytes]
    void *pstate;              // the policy's state region (plan.pstate_bytes; NULL when 0)
    kvp::RopeMemo *memos;      // [threads]
    const double *fixed_freqs; // score=fixed: deterministic rotation frequencies (score_fixed.h)
    int64_t fixed_K;           // score=fixed: logit scale (fixed::logit_scale)
    const int16_t *fixed_rope; // score=fixed: precomputed Q14 tables [fixed_rope_n][2*pairs] (realign)
    uint32_t fixed_rope_n;
    kvp::ThreadPool *tpool;    // the worker threads (NULL: threads == 1 or no thread support)
    uint64_t par_work;         // work a call needs before a second thread joins (cache.cpp)
    uint32_t par_shift;        // back-off: the threshold is par_work << par_shift (cache.cpp)
    uint32_t par_skips;        // calls run alone since the last back-off or probe
    float par_late;            // running average of the callers' join-wait share of parallel calls
    uint32_t rope_fp;          // fingerprint of the caller's RoPE table (rope.h; 0: theta), checked by kvp_state_load (fills padding)
    uint32_t roles_fp;         // fingerprint of the DuoAttention role table (kvp_create_heads; 0: none), checked likewise
    void *owned;               // internal allocation freed by kvp_destroy (NULL-arena path)
    kvp::FmtCache *fmt;        // formatted storage (quant/store_fmt.h); NULL for plain f32
    kvp_cache *owned_next;     // capi: list of live library-owned caches (NULL-arena path)
    char *prompt;              // max_prompt: the prompt region (prompt.h); NULL otherwise
    uint64_t live_rows, peak_rows, tokens_seen;
    uint64_t live_bytes, peak_bytes;  // kvp_stats, in the storage format
    // sizeof(kvp_cache) is part of every arena size that the committed results and tests pin
    // (arena.cpp rounds it up to 64 bytes: 1216 now); a new field goes into padding (after
    // scale, par_late are taken) or costs every pinned figure. 232 keeps the struct at 1216
    // (was 248 before max_prompt and the prompt region pointer).
    char last_error[232];
};

namespace kvp {

constexpr uint32_t kMagic = 0x4b565052u;      // "KVPR"
constexpr uint32_t kDeadMagic = 0x4b564444u;  // "KVDD": set by kvp_destroy

inline bool fixed_scores(const kvp_cache *c) { return c->cfg.score == KVP_SCORE_FIXED; }

// kv_rotate=hadamard (issue 23, docs/rotate.md): rotates n head rows x[j*ld] in place; nothing
// when off. Stored K (after RoPE) and V, the queries (after RoPE) and the outputs go through it.
inline void rotate_rows(const kvp_cache *c, float *x, uint32_t n, size_t ld) {
    if (c->rot) kern::rotate_f32_variant(c->rot)->hadamard(x, n, ld, c->cfg.model.head_dim);
}
// kv_rotate with formatted storage: thread tid's rows for the rotated copies of a staged
// prefill chunk's V (arena.h: after the formatted part of its scratch).
inline float *rotv_scratch(kvp_cache *c, size_t tid) {
    return reinterpret_cast<float *>(c->scratch + tid * c->plan.scratch_bytes + c->plan.scr_fmt +
                                     align_up(c->fmt->fp.scr_bytes, kAlign));
}

// A thread's fixed-point scratch (score=fixed; ArenaPlan::fx_*).
struct FixedWork {
    int16_t *qx, *qr;  // [G][kq_stride] quantized, rotated query rows
    int32_t *qe;       // [G] their exponents
    uint64_t *z;       // [G] softmax sums
    double *inv;       // [G] their reciprocals (fixed::weight_r)
    int16_t *cs;       // rotation table
    int64_t *y;        // [G][logit_ld] logits, then exps
    uint32_t *obs;     // [G][logit_ld] observation sums
};
FixedWork fixed_work(kvp_cache *c, size_t tid);
// score=fixed: the Q14 rotation table of position pos (precomputed, or computed into w.cs).
const int16_t *fixed_rope_table(const kvp_cache *c, const FixedWork &w, int64_t pos);
// score=fixed: quantizes the pre-RoPE key row k and stores it rotated at `rot` in the slot.
void fixed_store_key(kvp_cache *c, const BlockPool &pool, uint32_t slot, const float *k, int64_t rot, size_t tid);


// A call pays for a second thread from this much work (cache.cpp threads_for: bytes of K+V
// read, or half the flops when that is more), each further thread from half as much again.
// Measured with bench_attention --crossover (bench/results/crossover-pool.csv, README
// "Benchmarks"): see the comment at the definition.
extern const uint64_t kParallelWork;

// The work of a call in the units of kParallelWork: bytes of K+V it reads, or half its flops
// when that is more (decode with 4 query heads per KV head does 2 flops per byte: the two
// bounds meet at the machine's FMA peak over its read bandwidth); prefill counts K+V once per
// tile of kTileTokens queries; appends count the bytes they write. queries: decode, or prefill
// with q.
double step_work(const kvp_cache *c, uint32_t layer, uint32_t n, StepMode mode, bool queries);
// The step_work from which a call takes a second participant (0: always, as its items allow):
// par_work for the own workers; with a host function (kvp_set_parallel) the host's threads are
// taken to be awake, so every call that has items for them uses them (DECISIONS "kvprune on a
// host's thread pool").
inline uint64_t par_work_now(const kvp_cache *c) {
    return c->tpool && c->tpool->host_fn ? c->tpool->host_par_work : c->par_work;
}

// Builds a cache in `arena` (>= plan.total bytes, 64-aligned) for a checked config and starts
// its worker threads. NULL when a thread could not be started (*thread_err = the
// pthread_create error; nothing is left running).
// caller_freqs: the caller's RoPE inverse frequencies (kvp_create_rope; rope_table_check passed),
// copied into the arena; NULL = theta's.
// roles: a DuoAttention role table with a streaming head (arena_plan's), copied into the stores
// (HeadStore::role); NULL otherwise.
kvp_cache *cache_init(const kvp_config &cfg, const ArenaPlan &plan, void *arena, int *thread_err,
                      const double *caller_freqs = nullptr, const uint8_t *roles = nullptr);
// A streaming head of a DuoAttention role table (storage.h HeadStore::role).
inline bool head_streaming(const HeadStore &hs) { return hs.role == KVP_HEAD_STREAMING; }
// Stops the worker threads (kvp_destroy): joins them; no call may follow.
void cache_stop(kvp_cache *c);
void cache_reset(kvp_cache *c);
// KVP_OK when every KV head of `layer` can take n more tokens (hard capacity, and the shared
// pool after the policy's self-prune); else KVP_ERR_FULL with a message. Changes nothing.
// `queries`: a prefill call with q (staged policies take it through the staging area).
kvp_status cache_room_check(const kvp_cache *c, uint32_t layer, uint32_t n, bool queries, Msg &m);
// kvp_prefill_room: the largest chunk every layer can take in turn (see kvprune.h).
uint32_t cache_prefill_room(const kvp_cache *c);
// Appends n tokens to a layer, runs attention per mode, applies the policy.
// q, k, v and out are f32 or half rows (io.h: converted where they are first read / written).
void cache_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, In q, In k, In v, Out out,
                StepMode mode);
// max_prompt (prompt.h): the end of layer's prompt. Each KV head is observed from the prompt's
// last w queries q[w][n_q_heads * head_dim] (pre-RoPE, original positions pos[w]), which are its
// store's last w tokens, over everything the store holds, then pruned by the policy's prefill
// rule (PolicyCtx::prompt_w = w); then the layer phase, as after one prefill call.
void cache_prompt_select(kvp_cache *c, uint32_t layer, uint32_t w, const int32_t *pos, const float *q);
// Evicts by the policy's own ranking (self_prune) until every KV head of layer holds at most
// `limit` tokens or its policy cannot evict more.
void cache_make_room(kvp_cache *c, uint32_t layer, uint32_t limit);
inline HeadStore &head_of(kvp_cache *c, uint32_t layer, uint32_t h) {
    return c->heads[size_t(layer) * c->cfg.model.n_kv_heads + h];
}
inline const HeadStore &head_of(const kvp_cache *c, uint32_t layer, uint32_t h) {
    return c->heads[size_t(layer) * c->cfg.model.n_kv_heads + h];
}
// Bytes one kept token occupies in one KV head with plain f32 storage (K and V rows, no padding).
inline uint64_t token_bytes(const kvp_cache *c) { return uint64_t(c->cfg.model.head_dim) * sizeof(float) * 2; }
// Live bytes of a store in its storage format (scales, channel lists; no padding).
inline uint64_t store_bytes(const kvp_cache *c, const HeadStore &hs, const BlockPool &pool) {
    return c->fmt ? fmt_store_bytes(c, hs, pool) : uint64_t(hs.len()) * token_bytes(c);
}

}  // namespace kvp
