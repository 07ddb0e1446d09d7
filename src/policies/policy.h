// The policy seam: one table of operations per policy (DESIGN.md "Policies plug into one seam").
// The core (cache.cpp) never asks which policy runs; it plans the arena from `plan`, and per
// call and KV head it makes room (self_prune when the shared pool is dry), appends, attends
// (accumulating decode attention mass into slot scores when the plan asks for it, observing the
// last `obs_queries` prefill queries when it asks for that), then calls `prune`; after all heads
// of the layer it calls `layer_phase` once, on the calling thread, for layer-wide decisions
// (heads are reduced there in fixed head order, so decisions do not depend on thread count). A
// layer phase with much work hands items to the cache's threads (PolicyCtx::parallel: each
// participant with its own scratch, the reduction after it on the calling thread).
//
// Prompt staging (plan.staged_prefill: snapkv, pyramidkv): a prefill call with queries does not
// append to the layer's store. Its tokens go to the staging slots of the head's pool (one area
// per KV head index, shared by all layers, which are prefilled one after another; size
// `prefill_stage`), attention and observation run over the store plus the staged tokens (one
// more run), and the policy's prune must then call stage_commit with its victims: the store's
// victims are evicted and the surviving staged tokens are copied into the store. So a prompt
// larger than the layer's capacity takes one call.
//
// Layer-level policies (issue 9: simlayerkv, asl) use a few more parts of the seam: a second
// prefill observation (LayerPlan::obs_extra) and an observation of the first decode query
// after create/reset (observe_first_decode), both handed to `observe` with their Obs::kind; a
// per-head value from the per-head work to the layer phase (HeadStore::pword/pflag); a policy
// state region in the arena (state_bytes, initialised by `reset`); a phase region for what a
// layer phase ranks within one call (phase_bytes, in participant 0's scratch); and the prefill
// selection a call returns to its caller (selection_size is asked before the call, selection
// after it: kvp_selection).
//
// The seam is narrow (issue 32 item 0): a policy file includes this header (and other policies'),
// never a core header. It sees the cache only through PolicyCtx: its config, the layer's plan and
// geometry, its stores and pools (and the store operations of storage.h), its scores, its state
// and phase regions and the two per-layer values it owns (evict_threshold, lazy). The core
// implements the accessors (src/policy_ctx.cpp); `c` is the core's handle and opaque here.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "align.h"
#include "kvprune/kvprune.h"
#include "msg.h"
#include "pool.h"
#include "storage.h"

struct kvp_cache;

namespace kvp {

namespace kern {
struct ScoreF32;
}

enum class StepMode { kPrefill, kDecode, kAppend };

// What a policy needs from the core for one layer.
struct LayerPlan {
    uint32_t cap;           // hard cap on tokens per KV head (kvp_layer_capacity)
    uint32_t pin_cap;       // pinned prefix (streaming sinks), 0 otherwise
    bool front_evict;       // evicts the oldest body tokens (ring) rather than by compaction
    bool decode_scores;     // decode adds each token's attention mass to its slot score
    uint32_t obs_queries;   // prefill: observe the attention rows of the chunk's last queries (0: none)
    uint32_t hole_cap;      // evicted slots a store may keep before one compaction pass (storage.h)
    uint32_t store_cap;     // set by the core (arena.cpp layer_geom): HeadStore::cap, the most one
                            // KV head holds: cap, or store_cap(cfg, cap) where heads lend (below)
    size_t scratch_bytes;   // per-thread scratch the policy's operations use
    size_t scratch_per_token;  // plus this many bytes per token one call may see (cap + prefill_stage)
    bool staged_prefill;    // a prefill with queries goes through the staging area (see above)
    uint32_t evict_threshold;  // kvp_layer_stats.evict_threshold after create/reset (Lethe's L_evict)
    uint32_t budget;        // tokens the layer keeps from a prompt (snapkv, pyramidkv), 0 otherwise
    uint32_t obs_extra;     // prefill with q: a second observation, of the chunk's last obs_extra queries (kObsExtra)
    bool observe_first_decode;  // the first decode after create/reset hands its query's row to observe (kObsDecode)
    bool obs_all;           // prefill with q: every query's attention mass per key (h2o's prompt
                            // scores), fused into the prefill attention (attention.h colsum), handed
                            // to observe as a kObsWindow observation; also inside an open prompt
                            // (the sums are additive per key), so the prompt's end observes nothing
    bool reads_keys;          // the policy reads stored keys (PolicyCtx::key): with score=fixed the pool
                              // keeps the fixed-point key copy, which it reads (triattention)
    bool phase_all_layers;    // layer_phase may evict from other layers' stores (ctx.at_layer): the core
                              // accounts every layer after it (triattention's shared modes)
    bool select_in_phase;     // a staged prefill's selection waits for layer_phase (head_budget=ada): the
                              // core does not commit the staged tokens after prune; layer_phase must
                              // stage_commit every head that staged, with that head's ctx.staged
};

// The context of one operation.
struct PolicyCtx {
    kvp_cache *c;
    uint32_t layer;
    uint32_t head;       // KV head (per-head operations)
    BlockPool *pool;     // the head's pool (per-head operations)
    void *scratch;       // this thread's policy scratch (LayerPlan::scratch_bytes, 64-aligned)
    uint32_t staged;     // staged prefill: tokens in the staging area (logical hs.len() ..), else 0
    uint32_t stage_slot; // their first pool slot
    uint32_t committed = 0;  // stage_commit: staged tokens it moved into the store (formatted
                             // storage: their rows are staging rows 0..committed-1, store_fmt.h)
    uint32_t prompt_w = 0;   // the end of a whole prompt (max_prompt, prompt.h): the whole prompt is
                             // in the store (nothing staged) and the observation was of its last
                             // prompt_w queries, the store's last prompt_w tokens; 0 otherwise
                             // (layer_phase after a prompt's end: nonzero)

    // ---- what a policy may see (src/policy_ctx.cpp) ----
    const kvp_config &cfg() const;
    uint32_t group() const;              // query heads per KV head
    bool realign() const;                // positions=realign (resolved)
    bool fixed() const;                  // score=fixed: slot scores are Q16.16 integers
    uint32_t stage() const;              // prompt staging slots per pool (0: the policy does not stage)
    bool shared_pool() const;            // total_capacity makes the layers share the pool
    const LayerPlan &plan() const;       // this layer's plan
    uint32_t prompt_room() const;        // max_prompt: tokens an open prompt may add beyond the capacity
    bool prompt_holds() const;           // max_prompt: the layer holds its prompt open until its end
    HeadStore &store(uint32_t h) const;  // this layer's store of KV head h
    BlockPool &pool_of(uint32_t h) const;  // KV head h's pool
    PolicyCtx at_head(uint32_t h) const; // this context for KV head h (its pool; the same scratch)
    PolicyCtx at_layer(uint32_t l) const; // this context for layer l (the same head, pool and scratch):
                                          // only a layer_phase of a LayerPlan::phase_all_layers plan uses it
    uint32_t &evict_threshold() const;   // this layer's kvp_layer_stats.evict_threshold (Lethe)
    int32_t &lazy() const;               // this layer's laziness (SimLayerKV; -1 undecided)
    void *state() const;                 // the policy's state region (Policy::state_bytes)
    void *phase() const;                 // the policy's phase region (Policy::phase_bytes; 64-aligned):
                                         // from layer_prepare and layer_phase only
    const kern::ScoreF32 &score_kernels() const;
    // RoPE as this cache's score mode rotates keys (triattention): the style, the rotated pairs
    // (rope_dim/2; 0 without RoPE) and their frequencies (score=fixed: the deterministic table
    // its integer rotation uses; else the float path's).
    kvp_rope_style rope_style() const;
    uint32_t rope_pairs() const;
    const double *rope_freqs() const;
    // A layer phase's parallel part: runs fn(item_ctx, i, tid, arg) once for every item i < n on
    // the cache's threads (the calling thread is participant 0) and returns when all returned.
    // item_ctx is this context with participant tid's scratch (tid < the returned count; a
    // participant may run no item). Items run in any order and on any participant, so each must
    // write only its own data (disjoint per item, or per participant: scratch_at) for the bits to
    // be the same for every thread count; the stores of KV head h share pool h across layers, so
    // items that evict must own whole KV heads. Returns how many participants could have run
    // (1 without workers). From layer_phase only.
    typedef void (*ItemFn)(PolicyCtx &ctx, uint32_t i, uint32_t tid, void *arg);
    uint32_t parallel(uint32_t n, ItemFn fn, void *arg) const;
    void *scratch_at(uint32_t tid) const;  // participant tid's policy scratch (tid < threads)
    // The stored key of `slot` of this context's pool, full width, as RoPE left it (at
    // pool.rot[slot]; kv_rotate undone): score=fixed reads the fixed-point key copy (its int16 row
    // times 2^exponent, exact in double, the same bits everywhere), else the f32 row (plain
    // storage only: LayerPlan::reads_keys policies refuse float scoring over formatted storage).
    void key(uint32_t slot, double *out) const;
};

// A context for `layer` (no head, no scratch) of a live cache: the policies' functions that the
// core or the tests call with the cache (asl's diagnostics and state check).
PolicyCtx policy_ctx(const kvp_cache *c, uint32_t layer);

// ---- the config rules a policy's plan and check use (config.cpp) ----

constexpr uint32_t kMaxCapacity = 1u << 28;
constexpr uint32_t kFullDefaultCapacity = 2048;

// Draft room (issue 28): a layer's capacity holds, beyond what its policy needs, the slots that let
// a draft of max_draft tokens (draft.cpp: appended, verified as one prefill, the accepted prefix
// committed as one) fit while the policy holds its most: one token less than its capacity (a
// decode must fit). That is max_draft - 1 slots (0 for max_draft <= 1) for the policies whose
// prefill goes through the store (window, streaming, h2o, lethe, random; simlayerkv over h2o; think over
// these), 0 for the staged ones (snapkv, pyramidkv, asl: a prefill with queries goes through the
// staging area, never the store's capacity) and for full (it keeps every token: full is full).
// max_draft = 0 (the default) changes no capacity.
uint32_t config_draft_room(const kvp_config &cfg);
// A layer capacity in a policy's plan: cfg.capacity when given (it includes the draft room:
// config_check refuses one too small), else `need` (the policy's own default) plus the draft room.
inline uint32_t config_capacity(const kvp_config &cfg, uint32_t need) {
    return cfg.capacity ? cfg.capacity : need + config_draft_room(cfg);
}
// Tokens an open prompt may add to a layer beyond its capacity (max_prompt; prompt.cpp).
uint32_t layer_prompt_room(const kvp_config &cfg, uint32_t layer);
// Heads lend blocks (head_budget=ada with more than one KV head, pool.h "Lending"): a KV head
// may hold more than its layer's capacity, up to store_cap, with blocks its layer's other heads
// do not use; the pools (the arena's K/V part) stay sized for the layer's capacity.
inline bool heads_lend(const kvp_config &cfg) {
    return cfg.head_budget == KVP_HEAD_BUDGET_ADA && cfg.model.n_kv_heads > 1;
}
// The most tokens one KV head's store holds in a layer of capacity cap: 2 x cap where heads lend
// (DECISIONS "Heads lend blocks"), else cap.
inline uint32_t store_cap(const kvp_config &cfg, uint32_t cap) {
    return heads_lend(cfg) ? (cap < kMaxCapacity ? 2 * cap : cap) : cap;
}
// The most tokens a layer of capacity cap holds in all its KV heads together during a call: the
// capacity each (cache_room_check: where heads lend, their sum), and an open prompt's room each
// (prompt_room_check bounds every head by cap + its room). A ranking over all the layer's tokens
// (head_budget=ada's records) needs no more entries; kvp_state_load refuses a lending layer whose
// heads hold more than the capacity each.
inline uint64_t layer_tokens_cap(const kvp_config &cfg, uint32_t cap) {
    return uint64_t(cfg.model.n_kv_heads) * (uint64_t(cap) + cfg.max_prompt);
}
// The capacity a policy works within (what it prunes to stay below): the layer capacity less the
// draft room.
inline uint32_t config_policy_capacity(const kvp_config &cfg, uint32_t layer_cap) {
    return layer_cap - config_draft_room(cfg);
}

// Prefill observation rows: row g (query head g of the group) at g * ld; float sums of normalised
// weights in float mode (f), Q16 sums of fixed-point weights in fixed mode (u; kernels/score_fixed.h).
// kind: which observation (LayerPlan): the chunk's last obs_queries queries (kObsWindow), its
// last obs_extra queries (kObsExtra) or the first decode query (kObsDecode).
enum ObsKind : uint32_t { kObsWindow = 0, kObsExtra = 1, kObsDecode = 2 };
struct Obs {
    const float *f;
    const uint32_t *u;
    size_t ld;
    uint32_t kind = kObsWindow;
};

struct Policy {
    const char *name;
    kvp_positions default_positions;  // what positions=default means
    // Policy-specific consistency of a config whose ranges were checked. May be NULL.
    kvp_status (*check)(const kvp_config &cfg, Msg &m);
    void (*plan)(const kvp_config &cfg, uint32_t layer, LayerPlan *p);
    // Prefill observation: obs row g, entry j = attention mass of query head g of the group on
    // logical token j (j < hs.len() + ctx.staged), summed over the observed queries. May be NULL.
    void (*observe)(PolicyCtx &ctx, HeadStore &hs, const Run *runs, uint32_t nr, const Obs &obs);
    // After the head's tokens were appended and attended. May be NULL.
    void (*prune)(PolicyCtx &ctx, HeadStore &hs, StepMode mode);
    // After all heads of the layer. May be NULL.
    void (*layer_phase)(PolicyCtx &ctx, StepMode mode);
    // Tokens self_prune could remove from hs (0: the policy cannot evict). With ctx.prompt_w != 0
    // the question is about the state after an open prompt's end (prompt.h admission checks): a
    // policy whose decisions there can protect more tokens answers the least it can promise.
    uint32_t (*evictable)(const PolicyCtx &ctx, const HeadStore &hs);
    // The pool cannot supply the blocks for n new tokens: evict by the policy's own ranking.
    // Must remove at least one token when evictable() > 0; the core calls it until the blocks fit.
    void (*self_prune)(PolicyCtx &ctx, HeadStore &hs, uint32_t n);
    // Before the per-head work of a call adding n tokens, on the calling thread (layer-wide room
    // making for policies whose KV heads keep the same tokens). May be NULL.
    void (*layer_prepare)(PolicyCtx &ctx, uint32_t n, StepMode mode);
    // Bytes of the policy's state region in the arena (kvp_cache::pstate, 64-aligned). stage:
    // the prompt staging slots per pool. May be NULL (no region).
    size_t (*state_bytes)(const kvp_config &cfg, uint32_t stage) = nullptr;
    // Called by create and kvp_reset after the stores are cleared (ctx: layer 0). May be NULL.
    void (*reset)(const PolicyCtx &ctx) = nullptr;
    // Prefill selection (kvp_selection): before a kvp_prefill of n tokens into ctx.layer (queries:
    // q given), the entries a selection made by that call could need; 0 when the call cannot
    // select. May be NULL (never selects).
    uint32_t (*selection_size)(const PolicyCtx &ctx, uint32_t n, bool queries) = nullptr;
    // After that call: the selection it made (ascending indices into the call's tokens, *idx
    // valid until the next call) and its size; 0 when it made none. May be NULL.
    uint32_t (*selection)(const PolicyCtx &ctx, const int32_t **idx) = nullptr;
    // max_prompt (prompt.h): whether a layer of this config may keep a whole prompt, never selecting
    // from it (simlayerkv's non-lazy layers over full): an open prompt then holds within the
    // capacity (no room beyond it), and the decision waits for the prompt's end. May be NULL (no).
    bool (*keeps_prompt)(const kvp_config &cfg) = nullptr;
    // The caller's queries of a prefill (with q) or decode call, before RoPE, in the per-head work of
    // KV head ctx.head: token t's row for query head g of the group at q + t * ld + g * head_dim, n
    // tokens in order (a prompt's chunks one after another; the prompt's end hands nothing again).
    // May be NULL.
    void (*observe_queries)(PolicyCtx &ctx, const float *q, size_t ld, uint32_t n) = nullptr;
    // kvp_query_stats_set for query head qh of ctx.layer (arguments checked for NULL, range and
    // finiteness): validates the rest (Msg names the problem) and stores them. May be NULL (the
    // policy has none: KVP_ERR_UNSUPPORTED).
    kvp_status (*set_query_stats)(const PolicyCtx &ctx, uint32_t qh, const float *mean, const float *abs_mean,
                                  uint32_t n, Msg &m) = nullptr;
    // Bytes at the start of the state region that kvp_reset keeps (create zeroes the whole region).
    // May be NULL (none).
    size_t (*state_kept)(const kvp_config &cfg) = nullptr;
    // Whether DuoAttention streaming heads (kvp_create_heads) may sit beside this policy's heads:
    // its decisions are per KV head and need nothing from the heads it never runs on (the core
    // keeps those as sinks + window). false: a role table with a streaming head is
    // KVP_ERR_UNSUPPORTED.
    bool streaming_heads = false;
    // The state region only carries data within one call (snapkv's head_budget=ada votes, between
    // the per-head work and the layer phase): kvp_state_save stores none of it, kvp_state_load
    // leaves it as it is.
    bool state_transient = false;
    // Bytes of the policy's phase region (PolicyCtx::phase): memory that layer_prepare and
    // layer_phase use within one call, on the calling thread (a layer phase's parallel items may
    // write it too). The core places it in participant 0's scratch, over the parts that hold data
    // only while a call's per-head work runs (runs, work, partials, private rows: arena.h
    // scr_runs..scr_policy; not the policy scratch), enlarged where it does not fit: it costs the
    // arena no region of its own (issue 32: head_budget=ada's layer-wide rankings). Its bytes are
    // not kept between calls, saved or zeroed. May be NULL (none).
    size_t (*phase_bytes)(const kvp_config &cfg, uint32_t stage) = nullptr;
};

// The table of cfg.policy (valid config).
const Policy &policy_of(const kvp_config &cfg);
// The table of a token policy (full for values without one).
const Policy &policy_table(kvp_policy p);

// ---- helpers shared by the scored policies (policy.cpp) ----

// Scores of the store in logical order into out[0..len), and (when slots is not NULL) each
// token's slot. The 32 score bits are copied as they are (float, or uint32 in fixed mode).
void scores_logical(const HeadStore &hs, const BlockPool &pool, float *out, uint32_t *slots);
// A slot's score in fixed mode (Q16.16), and a saturating add to it.
inline uint32_t score_u(const BlockPool &pool, uint32_t slot) {
    uint32_t u;
    memcpy(&u, pool.score + slot, 4);
    return u;
}
inline void score_set_u(BlockPool &pool, uint32_t slot, uint32_t u) { memcpy(pool.score + slot, &u, 4); }
// A token's key in a ranking of several heads' tokens by accumulated score (head_budget=ada: h2o,
// lethe): its 32 score bits (fixed: Q16.16; float: a non-negative sum, whose bits order as its
// values), then its original position; the larger, the better kept (ties: the newer).
inline uint64_t rank_key(uint32_t score_bits, int32_t pos) { return uint64_t(score_bits) << 32 | uint32_t(pos); }
// The hole allowance for a scored store of `cap` tokens: min(cap/32, floor(sqrt(cap))), 0 below
// 32 tokens (compact at once). Each dead slot splits a run, and every run costs the attention
// kernels a fixed overhead per pass (block remainders, prefetch restart), while a compaction
// costs the rows it moves (up to the store) once per `hole_cap` evictions: per decode step about
// holes/2 runs against cap/hole_cap rows, balanced near sqrt(cap). Measured with bench_policies
// (h2o against window at N = 4096, 32/8 heads, d 128, 1 thread, 3 x 7 interleaved repetitions on
// the 2-core EPYC VM): cap/32 (128 holes) +6.1% decode time, sqrt (64) +2.0%. Up to 1024 tokens
// cap/32 <= sqrt(cap), so small stores (and their arena bytes) are unchanged.
inline uint32_t default_hole_cap(uint32_t cap) {
    uint32_t h = 0;  // the smaller of cap/32 and the integer square root of cap
    while (h < cap / 32 && (uint64_t(h) + 1) * (h + 1) <= cap) ++h;
    return h;
}
// Evicts the `n` tokens with the lowest score among logical [from, to), ties by older (lower
// index) first. scratch: 12 bytes per token of the store.
void evict_lowest(PolicyCtx &ctx, HeadStore &hs, uint32_t n, uint32_t from, uint32_t to, void *scratch);

// Adds each token's observed mass summed over the group's query heads (g = 0..G-1 in order)
// to its slot score: float, or saturating Q16.16 in fixed mode.
void add_observed_mass(PolicyCtx &ctx, const Run *runs, uint32_t nr, const Obs &obs);

// ---- the staging operations (the core's: src/stage.cpp) ----

// Staged prefill (see the top): tokens the store may hold after this commit (the blocks it has
// plus what the pool allows it; capped by its capacity).
uint32_t stage_room(const PolicyCtx &ctx, const HeadStore &hs);
// Ends a staged prefill: victims[0..nv) are logical indices in [0, hs.len() + ctx.staged),
// ascending (overwritten). Store victims are evicted, the other staged tokens join the store in
// order (the caller keeps their number within stage_room). Counts one prune event when nv > 0.
// victims == NULL: the newest staged tokens that fit are kept (the core's fallback).
// Formatted storage: the kept tokens join the store as residual tokens (only their slot data is
// copied; their K/V rows are packed to the front of the pool's staging rows) and the core then
// converts them like a prefill's new tokens (cache.cpp head_observe_prune, fmt_convert).
void stage_commit(PolicyCtx &ctx, HeadStore &hs, uint32_t *victims, uint32_t nv);

}  // namespace kvp
