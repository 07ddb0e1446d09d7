/*
 * kvprune.h - the one stable C ABI of kvprune.
 *
 * kvprune owns a transformer's KV cache during decoding: it stores K and V in one
 * arena sized at init, computes attention itself, and prunes what it keeps
 * according to a policy, so that decoding runs in bounded, known memory.
 *
 * This header is C99 and C++ clean. No function allocates after kvp_create() and no
 * C++ exception crosses it. Every function that can fail returns a kvp_status; a
 * failed call leaves the cache exactly as it was (nothing lost, nothing
 * half-applied) and records a message for kvp_last_error().
 *
 * Life cycle (like zstd's static contexts):
 *     kvp_config cfg;
 *     kvp_config_default(&cfg, &model);
 *     kvp_config_apply(&cfg, "policy=streaming sinks=4 window=1020", err, sizeof err);
 *     size_t n = kvp_arena_size(&cfg);            // exact bytes, 0 if cfg is invalid
 *     void *arena = ...;                          // n bytes, 64-byte aligned (or NULL: allocated once)
 *     kvp_cache *c; kvp_create(&cfg, arena, n, &c);
 *     for each token: for layer 0..L-1: kvp_decode(c, layer, q, k, v, out);
 *     kvp_destroy(c); free(arena);
 *
 * Layer order: layers are independent. Each keeps its own tokens, positions (a layer's next
 * position is one past its own last) and policy state, so a host may reach the layers in any
 * order: the usual one (per token or prefill chunk, layer 0..L-1) is neither required nor
 * checked. Decoding layer 1 twice before layer 0 is valid, and every layer's results are the same
 * bits in any order. Where layers meet, the order the host chooses decides: with a shared pool
 * (total_capacity) layers take free blocks first come, first served (kvp_prefill_room assumes
 * layer order); asl ranks tokens over consecutive layers of one prompt (a layer reached out of
 * order starts that ring afresh); kvp_stats.tokens_seen counts the tokens of layer 0.
 *
 * Tensors are row-major float32 and pre-RoPE: q is [n_tokens][n_q_heads][head_dim],
 * k and v are [n_tokens][n_kv_heads][head_dim], out is [n_tokens][n_q_heads][head_dim].
 * Query head h attends with KV head h / (n_q_heads / n_kv_heads).
 * A complete C99 program that checks every status: tests/example.c (also in the README).
 *
 * Threads: one call at a time per cache. Different caches are independent (any threads, at
 * once); calls on one cache must be serialised by the host. Overlapping calls on one cache are
 * caught cheaply rather than corrupting it: every call that reads or changes a cache's state
 * (all but kvp_layer_capacity, fixed at create, and kvp_last_error) holds an in-use flag (one
 * atomic exchange) for its duration, and a call that finds the flag held returns
 * KVP_ERR_STATE and changes nothing, not even the kvp_last_error text (it belongs to the call in
 * progress). The uint32_t queries kvp_layer_len and kvp_prefill_room return 0 then;
 * kvp_destroy does nothing then (the cache stays live: destroy it once the other call returned).
 * This is a safety net, not a lock: a host that relies on it to serialise gets spurious
 * KVP_ERR_STATE results. kvp_last_error returns the slot of the last failed call: read it from
 * the thread that made that call, before that thread's next call on the cache.
 *
 * Input range: every element of q, k and v must be finite with |x| < KVP_INPUT_LIMIT (2^56,
 * about 7.2e16). Anything else (NaN, Inf, or a finite value that large, e.g. q = k = 1e19 whose
 * logits would overflow to Inf and make NaN outputs) fails with KVP_ERR_NONFINITE and changes
 * nothing. In exchange the outputs of every successful call are finite: with |q|,|k| < 2^56 and
 * head_dim <= 1024 a logit stays below 2^124, and an output is a convex combination of the values.
 *
 * Buffers: `out` must not overlap q, k, v or positions (outputs are written while inputs are
 * still read by other heads): KVP_ERR_ARG. q, k and v may overlap each other (read only).
 *
 * Arenas: an arena holds at most one live cache. kvp_create on an arena whose first bytes hold
 * a live cache (created and not destroyed) is KVP_ERR_STATE; two caches whose arenas overlap at
 * other offsets are undefined (not detected). Destroy a cache before freeing or reusing its
 * arena. kvp_destroy twice is safe: with caller memory (still allocated) the second call sees a
 * destroyed cache and does nothing; with a library-owned arena (arena == NULL) the handle is
 * tagged, and kvp_destroy frees it only while it is live, so a second call does nothing without
 * reading the freed memory (until a later kvp_create returns the same address, as with free()).
 * Any other call on a handle whose library-owned arena was freed is undefined (the memory is
 * gone); on a destroyed cache in caller memory it is KVP_ERR_STATE.
 *
 * Messages: every error text the library writes (the err buffers of the config functions,
 * kvp_config_default_ex/kvp_config_init_ex and kvp_create_ex, and kvp_last_error) has one
 * format, "<kvp_status_str(status)>: <detail>", e.g.
 * "KVP_ERR_CONFIG: invalid configuration: unknown key 'windw' (did you mean 'window'?)", so a
 * caller prints it as it is and adds no status text of its own.
 *
 * Versioned structs: kvp_config, kvp_stats, kvp_layer_stats, kvp_selection and kvp_key_info
 * begin with uint32_t struct_size. A caller's struct_size smaller than this library's is
 * accepted down to the struct's first released layout (kvp_config: up to and including
 * channel_score, KVP_CONFIG_SIZE_0_1 bytes; the others: their first layout, which is today's):
 * the library reads and writes only the caller's bytes, and config fields the caller's struct
 * lacks take their defaults. A struct_size larger than the library knows, below the first
 * layout, or not a multiple of 4 is KVP_ERR_ARG.
 */
#ifndef KVPRUNE_H
#define KVPRUNE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_VERSION_MAJOR 0
#define KVP_VERSION_MINOR 2
#define KVP_VERSION_PATCH 0
/** Compile-time version, same encoding as kvp_version(). */
#define KVP_VERSION ((KVP_VERSION_MAJOR << 16) | (KVP_VERSION_MINOR << 8) | KVP_VERSION_PATCH)

/** Inputs q, k, v must satisfy |x| < KVP_INPUT_LIMIT (2^56); larger or non-finite: KVP_ERR_NONFINITE. */
#define KVP_INPUT_LIMIT 72057594037927936.0

/*
 * Enums: the numbers are pinned. Each enum ends with a *_FORCE_INT32_ sentinel (not a valid
 * value) so that it is int-sized even on ABIs with short enums (arm-none-eabi), keeping
 * kvp_config's layout identical for every compiler and binding.
 */

/** Status codes. The numbers are pinned: they never change meaning. */
typedef enum {
    KVP_OK = 0,              /**< success */
    KVP_ERR_ARG = 1,         /**< NULL pointer, bad size or malformed argument */
    KVP_ERR_CONFIG = 2,      /**< invalid or contradictory configuration / spec */
    KVP_ERR_ARENA = 3,       /**< arena NULL-less but too small or misaligned */
    KVP_ERR_LAYER = 4,       /**< layer (or KV head) index out of range */
    KVP_ERR_FULL = 5,        /**< the layer has no room for the tokens and the policy may not evict */
    KVP_ERR_NONFINITE = 6,   /**< NaN, Inf or |x| >= KVP_INPUT_LIMIT in q, k or v */
    KVP_ERR_STATE = 7,       /**< call not valid in the cache's current state (destroyed, in use by another call, arena holds a live cache) */
    KVP_ERR_UNSUPPORTED = 8, /**< feature recognised but not available in this build/version */
    KVP_ERR_BUFFER = 9,      /**< caller's output buffer too small; the call reports the size it needs */
    KVP_STATUS_FORCE_INT32_ = 0x7fffffff  /* not a status: keeps the enum int-sized on every ABI */
} kvp_status;

/** RoPE style. NEOX rotates pairs (i, i + rope_dim/2); GPTJ rotates (2i, 2i+1) (llama2.c). */
typedef enum { KVP_ROPE_NONE = 0, KVP_ROPE_NEOX = 1, KVP_ROPE_GPTJ = 2, KVP_ROPE_FORCE_INT32_ = 0x7fffffff } kvp_rope_style;

/** Model geometry. */
typedef struct kvp_model {
    uint32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    kvp_rope_style rope;  /* NEOX rotates (i, i+rope_dim/2); GPTJ rotates (2i, 2i+1) */
    uint32_t rope_dim;    /* 0 means head_dim; must be even and <= head_dim */
    float    rope_theta;  /* frequency of pair i: theta^(-2i/rope_dim) */
} kvp_model;

/** Pruning policy (spec key `policy`). The numbers are pinned. */
typedef enum {
    KVP_POLICY_FULL = 0,       /**< keep everything up to capacity, then KVP_ERR_FULL */
    KVP_POLICY_WINDOW = 1,     /**< keep the most recent `window` tokens */
    KVP_POLICY_STREAMING = 2,  /**< StreamingLLM sinks + window with Lazy Pruning / Slack / Max_Drop */
    KVP_POLICY_H2O = 3,
    KVP_POLICY_SNAPKV = 4,
    KVP_POLICY_PYRAMIDKV = 5,
    KVP_POLICY_LETHE = 6,
    KVP_POLICY_SIMLAYERKV = 7,
    KVP_POLICY_ASL = 8,
    KVP_POLICY_THINK = 9,
    KVP_POLICY_RANDOM = 10,    /**< baseline: keep the prompt (keep_prompt=1), evict uniformly at random per head */
    KVP_POLICY_TRIATTENTION = 11, /**< TriAttention: keep the prompt, cut generated tokens back to `budget` every
                                       `beta` by a trigonometric score of pre-RoPE query statistics */
    KVP_POLICY_FORCE_INT32_ = 0x7fffffff
} kvp_policy;

/** RoPE position mode (spec key `positions`). */
typedef enum {
    KVP_POS_DEFAULT = 0,   /**< the policy's default: realign for streaming/window, original otherwise */
    KVP_POS_ORIGINAL = 1,  /**< a token keeps its absolute position */
    KVP_POS_REALIGN = 2,   /**< kept tokens sit at 0..L-1; a new token is at L (StreamingLLM) */
    KVP_POS_FORCE_INT32_ = 0x7fffffff
} kvp_positions;

/** Storage precision of K/V rows (spec key `kv_dtype`). */
typedef enum {
    KVP_DTYPE_F32 = 0, KVP_DTYPE_F16 = 1, KVP_DTYPE_Q8 = 2, KVP_DTYPE_Q4 = 3, KVP_DTYPE_FORCE_INT32_ = 0x7fffffff
} kvp_dtype;

/** Scoring arithmetic (spec key `score`). */
typedef enum { KVP_SCORE_FLOAT = 0, KVP_SCORE_FIXED = 1, KVP_SCORE_FORCE_INT32_ = 0x7fffffff } kvp_score_mode;

/** Pooling of SnapKV votes (spec key `pool`). */
typedef enum { KVP_POOL_AVG = 0, KVP_POOL_MAX = 1, KVP_POOL_FORCE_INT32_ = 0x7fffffff } kvp_pool;

/** Rotation of stored K and V (spec key `kv_rotate`, issue 23; docs/rotate.md). */
typedef enum { KVP_ROTATE_NONE = 0, KVP_ROTATE_HADAMARD = 1, KVP_ROTATE_FORCE_INT32_ = 0x7fffffff } kvp_rotate;

/** TriAttention's selection granularity (spec key `tri_mode`; the reference code's three modes). */
typedef enum {
    KVP_TRI_UNION = 0,              /**< one set of generated tokens for every layer and head: each (layer, query
                                         head) nominates its `budget` best, the nominees with the highest score
                                         over all of them are kept (the reference's default) */
    KVP_TRI_PER_HEAD = 1,           /**< one set per KV head, shared by the layers: the mean over layers of the
                                         group's maximum */
    KVP_TRI_PER_LAYER_PERHEAD = 2,  /**< each (layer, KV head) by its own group's maximum */
    KVP_TRI_FORCE_INT32_ = 0x7fffffff
} kvp_tri_mode;

/** Where TriAttention's query statistics come from (spec key `tri_stats`). */
typedef enum {
    KVP_TRI_STATS_ONLINE = 0,  /**< the means over every query the cache sees */
    KVP_TRI_STATS_GIVEN = 1,   /**< the caller's (kvp_query_stats_set), e.g. an offline calibration */
    KVP_TRI_STATS_FORCE_INT32_ = 0x7fffffff
} kvp_tri_stats;

/** Role of one (layer, KV head) in a DuoAttention role table (kvp_create_heads). The numbers are pinned. */
typedef enum {
    KVP_HEAD_RETRIEVAL = 0,  /**< keeps what the configured policy keeps (everything with policy=full) */
    KVP_HEAD_STREAMING = 1,  /**< keeps only its first duo_sink tokens and its duo_window most recent ones */
    KVP_HEAD_FORCE_INT32_ = 0x7fffffff
} kvp_head_role;

/** How a layer's token budget is split over its KV heads (spec key `head_budget`, issue 32). The numbers are pinned. */
typedef enum {
    KVP_HEAD_BUDGET_UNIFORM = 0,  /**< every KV head keeps the layer's budget (the papers' default) */
    KVP_HEAD_BUDGET_ADA = 1,      /**< AdaKV: the layer keeps as many tokens as uniform in total, chosen by one
                                       ranking of every head's votes or scores, each head at least ada_floor
                                       of its uniform share (snapkv, pyramidkv, h2o, triattention with
                                       tri_mode=per_layer_perhead; lethe: its rounds and capacity cut run
                                       over all heads' tokens at once) */
    KVP_HEAD_BUDGET_FORCE_INT32_ = 0x7fffffff
} kvp_head_budget;

/** Whose threads run a cache's parallel work (spec key `thread_pool`, issue 30). The numbers are pinned. */
typedef enum {
    KVP_THREAD_POOL_OWN = 0,   /**< kvp_create starts threads-1 worker threads (the default) */
    KVP_THREAD_POOL_HOST = 1,  /**< kvp_create starts none: a call runs on the caller alone until the host
                                    hands its own threads over with kvp_set_parallel */
    KVP_THREAD_POOL_FORCE_INT32_ = 0x7fffffff
} kvp_thread_pool;

/**
 * Cache configuration. A plain struct: fill it with kvp_config_default(), change
 * fields directly or through kvp_config_apply(). `struct_size` is first so fields can
 * be appended in later versions without breaking old callers. Each field's spec key
 * is its name. Fields of policies other than the selected one are kept but unused.
 */
typedef struct kvp_config {
    uint32_t struct_size;        /* sizeof(kvp_config), set by kvp_config_default */
    kvp_model model;
    kvp_policy policy;           /* policy=full|window|streaming|h2o|snapkv|pyramidkv|lethe|simlayerkv|asl|think */
    uint32_t capacity;           /* token slots per layer incl. slack; 0 = the policy's default (full: 2048;
                                    snapkv/pyramidkv: the layer's budget + max_new), plus max_draft-1 draft
                                    slots where drafts use the store (issue 28) */
    kvp_positions positions;     /* positions=original|realign */
    uint32_t threads;            /* threads=N (>=1): the calling thread plus N-1 worker threads that
                                    kvp_create starts; results are bit-identical for every N */
    kvp_dtype kv_dtype;          /* kv_dtype=f32|f16|q8|q4 */
    kvp_score_mode score;        /* score=float|fixed */
    /* streaming (StreamingLLM + Lazy Pruning / Slack / Max_Drop) and window */
    uint32_t sinks;              /* S: first tokens always kept */
    uint32_t window;             /* W: recent tokens kept */
    uint32_t extra;              /* B: extra budget, C = S + W + B */
    uint32_t compress_every;     /* R: prune when L - C >= R; 0 = never prune */
    uint32_t slack;              /* sigma: H = C + sigma */
    uint32_t max_drop;           /* delta: target min(max(L - delta, C), H); 0 = prune to C */
    /* h2o / snapkv / pyramidkv / asl */
    uint32_t budget;             /* tokens kept per layer/head (pyramidkv: the mean; lethe: capacity 0 = 2*budget) */
    uint32_t recent;             /* most recent tokens never evicted by decode eviction (h2o, snapkv, pyramidkv) */
    uint32_t obs_window;         /* observation window of queries (snapkv: the voting window, kept) */
    uint32_t pool_kernel;        /* pooling kernel width of the votes (odd) */
    kvp_pool pool;               /* pool=avg|max */
    float    beta;               /* pyramidkv steepness (>= 1): min budget = (budget - obs_window) / beta.
                                    triattention (a whole number >= 1): once a KV head holds budget + beta
                                    generated tokens they are cut back to the `budget` best, so it never
                                    holds more than budget + beta; kvp_config_apply makes it 128 for
                                    policy=triattention unless given (the struct's default is pyramidkv's 20) */
    /* lethe (also `sinks`) */
    float    sparse_ratio;       /* tau: breakpoint where scores have fallen by this factor */
    float    recent_ratio;       /* fraction of the layer length always kept as recent tokens */
    uint32_t segments;           /* D: cut points floor(K d / D) */
    float    decay;              /* RASR score decay per step */
    /* simlayerkv (also sinks, window and the keys of its nonlazy policy) */
    float    lazy_threshold;     /* a layer is lazy when its attention mass on the first sinks + last
                                    window keys (mean over query heads and observed queries) exceeds this */
    uint32_t lazy_last;          /* lazy_mode=prefill: the last prompt queries observed (default 32) */
    uint32_t lazy_mode;          /* lazy_mode=prefill (0) | decode (1: the first decode query) */
    kvp_policy nonlazy;          /* nonlazy=full|snapkv|h2o: the policy of the layers that are not lazy */
    /* asl (also budget, obs_window, pool, pool_kernel, recent, prefill_stage) */
    uint32_t asl_min_layer;      /* first layer that may select; UINT32_MAX = floor(n_layers/3) */
    uint32_t asl_obs_layers;     /* layers whose token ranks enter the rank variance (default 8) */
    float    asl_tau;            /* relative rank variance below which a layer selects (default 0.3) */
    /* think */
    float    key_channel_ratio;
    float    value_channel_ratio;
    uint32_t channel_score;      /* channel_score=qk (0) | l1 (1) | l2 (2) */
    /* shared block pool (appended in 0.2; see kvp_get_layer_stats) */
    uint32_t block;              /* block=N: token slots per storage block (default 16) */
    uint32_t total_capacity;     /* total_capacity=N: token slots per KV head summed over layers that the
                                    shared pool holds; 0 (default) or >= the sum of the per-layer
                                    capacities = no sharing */
    /* appended in 0.2 (issue 8) */
    uint32_t evict_threshold;    /* lethe: initial L_evict per layer; 0 = capacity/2 */
    uint32_t prefill_stage;      /* snapkv/pyramidkv/asl: prompt tokens one kvp_prefill call may take (staged
                                    in the arena, shared by the layers, before selection); 0 = the
                                    default max(1024, largest layer capacity) */
    /* appended in 0.2 (issue 10): ThinK's token policy, the quantization group */
    kvp_policy token_policy;     /* token_policy=full|window|streaming|h2o|...: the token policy that
                                    policy=think composes with (its keys apply); default full */
    uint32_t quant_group;        /* quant_group=N: tokens per quantization group and full-precision
                                    residual (default 32); with kv_dtype != f32 or ThinK channel
                                    pruning the storage block is quant_group tokens (`block` applies
                                    to plain f32 storage only) */
    /* appended in 0.2 (issue 9) */
    uint32_t lazy_force;         /* simlayerkv, benchmarks and tests: 0 (default) = decide laziness by
                                    attention; else bit l makes layer l lazy and every other layer not
                                    lazy at the same decision points (the paper's random-layer
                                    baseline; needs n_layers <= 32) */
    /* appended in 0.2 (issue 21): speculative decoding */
    uint32_t max_draft;          /* max_draft=N: draft tokens in flight per layer between kvp_draft_begin and
                                    kvp_draft_commit (the arena reserves their rows); 0 (default) = no drafts */
    float    attn_scale;         /* attn_scale=x: the logit scale q.k * x (Gemma: 1/sqrt(query_pre_attn_scalar));
                                    0 (default) = 1/sqrt(head_dim) */
    float    logit_softcap;      /* logit_softcap=c: logits become c * tanh(logit / c) before the softmax (Gemma 2's
                                    attention soft-capping); 0 (default) = off */
    /* appended in 0.2 (issue 21): RoPE frequencies from the caller (kvp_create_rope) */
    float    rope_attn_factor;   /* rope_attn_factor=a: RoPE attention factor (YaRN's mscale, LongRoPE's
                                    attention factor): every logit is multiplied by a*a, as if q and k were
                                    both scaled by a (docs/rope.md); 1 (default) = none */
    /* appended in 0.2 (issue 21 item 5): sliding-window layers */
    uint32_t sliding_window;     /* sliding_window=W: local layers attend to, and hold, only the keys at positions
                                    p-W < pos <= p of a query at p (Gemma 2/3, Mistral); 0 (default) = none */
    uint32_t sliding_pattern;    /* sliding_pattern=P: with sliding_window, layer l is global (full attention, runs
                                    the policy) iff P > 0 and (l+1) % P == 0, else local (Gemma 3: 6, Gemma 2: 2);
                                    0 (default) = every layer local (Mistral) */
    /* appended in 0.2 (issue 23): rotated low-bit storage */
    uint32_t kv_rotate;          /* kv_rotate=none|hadamard (kvp_rotate): hadamard stores K (after RoPE) and V
                                    rotated by an orthonormal Walsh-Hadamard transform per head and
                                    rotates queries and outputs to match (q.k and the output are
                                    unchanged in exact arithmetic; spreads outlier channels before
                                    f16/q8/q4 rounding); default none. Not with policy=think. */
    /* appended in 0.3 (issue 28): whole-prompt selection across chunks */
    uint32_t max_prompt;         /* max_prompt=P: the largest prompt the arena holds whole (any chunking): each
                                    layer keeps every prompt token (exact attention inside the prompt) and
                                    the policy's prefill selection runs once, over the whole prompt, when the
                                    prompt ends (kvp_prompt_end, or the first kvp_decode/kvp_append/
                                    kvp_draft_begin after it), so chunked prefill keeps what one call keeps.
                                    Costs P tokens of K/V per layer and KV head in the pool, plus the last
                                    obs_window queries per layer. A prompt beyond P is selected every time it
                                    would pass capacity + P (kvp_layer_stats.prompt_early). 0 (default) = off:
                                    each prefill call selects from its own chunk. asl: the selection is made at
                                    the prompt's end (no kvp_selection is returned; every layer takes every
                                    token). think: a store whose channels are not chosen yet holds the open
                                    prompt at f32, full width, and chooses them at its end (the arena adds
                                    f32 K and V rows for every slot). simlayerkv nonlazy=full and think over full
                                    hold the prompt within their capacity. Not with a shared pool (total_capacity)
                                    yet. */
    /* appended in 0.3 (issue 28): the papers' defaults */
    uint32_t max_new;            /* max_new=G (snapkv, pyramidkv): tokens the caller plans to generate after a
                                    prompt. The default capacity is the layer's budget + G, so the prompt's
                                    selection stays whole while G tokens are generated (the papers keep it
                                    and append every generated token); after that decode evicts by the
                                    accumulated scores (h2o's rule, `recent` kept). 0 (default) = G = budget.
                                    A given capacity below budget + G is refused when max_new is given. */
    uint32_t prompt_scores;      /* prompt_scores=all (0, default) | window (1) (h2o): all = every prompt query's
                                    attention is summed into the scores (H2O's accumulated attention), fused
                                    into the prefill attention; window = only the last obs_window queries
                                    (the behaviour before 0.3) */
    /* appended in 0.3 (issue 32): the random baseline */
    uint32_t seed;               /* seed=S (random): the generator's seed; the e-th token evicted from (layer,
                                    KV head) is drawn from splitmix64 of (S, layer, head, e), so the
                                    victims do not depend on threads, chunking or ISA. Default 0. */
    uint32_t keep_prompt;        /* keep_prompt=0|1 (random): 1 (default) = tokens added by kvp_prefill or
                                    kvp_append are never evicted and the generated ones (kvp_decode) are cut
                                    back to `budget` at random; 0 = every token may go, the head keeps
                                    `budget` tokens */
    /* appended in 0.3 (issue 32): TriAttention */
    uint32_t tri_mode;           /* tri_mode=union|per_head|per_layer_perhead (kvp_tri_mode; triattention):
                                    which stores share one choice of generated tokens. union and per_head
                                    decide for every layer when the last layer that runs the policy (not a
                                    sliding-window layer) decodes; per_layer_perhead decides in each layer's
                                    own call. Default union (the reference's). */
    uint32_t tri_stats;          /* tri_stats=online (0, default) | given (1) (triattention): online = the query
                                    statistics are the means over every query the cache sees (kvp_prefill
                                    with q, kvp_decode); given = the caller's (kvp_query_stats_set: the
                                    paper's offline calibration), kept across kvp_reset, never updated */
    /* appended in 0.3 (issue 32): DuoAttention's streaming heads (kvp_create_heads) */
    uint32_t duo_sink;           /* duo_sink=S: the first tokens a streaming head keeps (default 64, the
                                    DuoAttention reference's --sink_size); unused without a role table */
    uint32_t duo_window;         /* duo_window=W: the most recent tokens a streaming head keeps (default 256, the
                                    reference's --recent_size); a call may add at most W tokens to a layer
                                    that has a streaming head (kvp_prefill_room says so) */
    /* appended in 0.3 (issue 32): AdaKV's per-head budgets */
    uint32_t head_budget;        /* head_budget=uniform|ada (kvp_head_budget; snapkv, pyramidkv, h2o, lethe,
                                    triattention with tri_mode=per_layer_perhead): ada = each prompt selection
                                    (snapkv, pyramidkv), prune (h2o) or cut (triattention: its scores z-normalised
                                    per head) keeps the same number of tokens per layer as uniform, split over
                                    the layer's KV heads by one ranking
                                    of all their votes or scores (AdaKV, arXiv 2407.11550); lethe's breakpoint
                                    search and capacity cut rank all the heads' own tokens at once (each head
                                    keeps its own tokens, the layer's count from all of them), so a head whose
                                    attention is concentrated keeps fewer tokens and a diffuse one more. With
                                    more than one KV head, heads lend blocks: one head may hold up to twice the
                                    capacity with slots the others leave, and live_bytes follow the per-head
                                    lengths. Decided on the calling thread in fixed head order (the same for
                                    every thread count). Plain f32 storage (kv_dtype=f32, not think) only.
                                    Default uniform. */
    float ada_floor;             /* ada_floor=a (head_budget=ada): every KV head keeps at least floor(a x its
                                    uniform share) tokens, its observation window counted (kvpress's
                                    alpha_safeguard); 0 <= a <= 1, default 0.2 */
    /* appended in 0.3 (issue 30): running on the host's threads */
    uint32_t thread_pool;        /* thread_pool=own|host (kvp_thread_pool): own = kvp_create starts threads-1
                                    workers; host = it starts none, and a call runs alone until kvp_set_parallel
                                    gives the host's parallel-for (an engine's own thread pool: ggml,
                                    pthreadpool, OpenMP). `threads` stays the most participants a call uses
                                    (the per-thread scratch is sized by it). Bits never depend on it. Default own. */
} kvp_config;

/** struct_size of the first released kvp_config (0.1: fields up to and including channel_score). */
#define KVP_CONFIG_SIZE_0_1 ((uint32_t)(offsetof(kvp_config, channel_score) + sizeof(uint32_t)))

/** Counters of a cache (kvp_get_stats). Set struct_size = sizeof(kvp_stats) before the call. */
typedef struct kvp_stats {   /* first member struct_size, like kvp_config; more fields may follow */
    uint32_t struct_size;
    uint64_t arena_bytes;      /* bytes of the arena in use */
    uint64_t live_bytes;       /* K and V rows of the kept tokens, in their storage format */
    uint64_t peak_live_bytes;  /* maximum live_bytes since create/reset (after appends, and a prompt's
                                  conversion at its end, before prunes) */
    uint64_t tokens_seen;      /* tokens appended to layer 0 */
    uint64_t prune_events;     /* prunes, summed over layers and KV heads */
    uint64_t tokens_evicted;   /* evicted tokens, summed over layers and KV heads */
} kvp_stats;

/**
 * Per-layer figures (kvp_get_layer_stats). Set struct_size = sizeof(kvp_layer_stats) before the call.
 * live_bytes, prune_events and tokens_evicted sum over the layer's KV heads.
 */
typedef struct kvp_layer_stats {
    uint32_t struct_size;
    uint32_t capacity;         /* token slots of the layer per KV head (its hard cap) */
    uint32_t len;              /* tokens kept, max over KV heads */
    uint64_t live_bytes;       /* K and V of the kept tokens in their storage format, no padding */
    uint64_t prune_events;     /* prunes of this layer, summed over KV heads */
    uint64_t tokens_evicted;   /* evicted tokens of this layer, summed over KV heads */
    uint32_t evict_threshold;  /* Lethe's current L_evict; 0 for other policies */
    float    sparsity;         /* Hoyer sparsity of the layer's last decode attention row, mean over query heads */
    int32_t  lazy;             /* SimLayerKV: 1 lazy (trimmed to sinks + window), 0 not lazy; -1 undecided
                                  (lazy_mode=decode before the first decode) or another policy */
    uint32_t prompt_early;     /* max_prompt: selections made before the prompt ended, because the prompt
                                  outgrew capacity + max_prompt (0: every prompt was selected whole) */
} kvp_layer_stats;

/**
 * Selection returned by kvp_prefill() for the ASL policy: when a prefill determines the
 * selection layer, it writes the indices (into that call's tokens, ascending) of the prompt
 * tokens to propagate (its top budget - obs_window tokens plus the observation window);
 * later layers receive only those tokens with their original positions. A prefill that may
 * determine it (policy asl, no selection made yet in the sequence, a layer >= asl_min_layer
 * that is empty, q given, more than `budget` tokens) needs a selection of capacity >= budget:
 * otherwise it fails with KVP_ERR_BUFFER, sets sel->n (when sel is not NULL) to the entries
 * needed and changes nothing.
 */
typedef struct kvp_selection {
    uint32_t struct_size;  /* sizeof(kvp_selection); larger than this library knows: KVP_ERR_ARG */
    uint32_t capacity;     /* in: entries `indices` can hold */
    int32_t *indices;      /* in: caller buffer; out: ascending token indices */
    uint32_t n;            /* out: entries written (0 when nothing was selected) */
    int32_t  selected;     /* out: 1 when this call determined the selection layer */
} kvp_selection;

/** Opaque cache handle: the arena's address for caller memory; a tagged value for a library-owned arena. */
typedef struct kvp_cache kvp_cache;

/** Library version: (major<<16)|(minor<<8)|patch. Never fails. */
uint32_t kvp_version(void);

/** Name and meaning of a status, e.g. "KVP_ERR_FULL: layer full". Never NULL, also for unknown values. */
const char *kvp_status_str(kvp_status s);

/**
 * Fills *cfg with defaults for `model`: policy full, capacity 0 (the policy's minimum),
 * positions default, threads 1, f32 storage, float scoring, and each policy's documented
 * defaults (sinks 4, window 1020, compress_every 1, sparse_ratio 400, ...; the full list with
 * ranges: kvp_config_key, or `kvprune keys`). Writes sizeof(kvp_config) bytes of this library
 * version; kvp_config_init is the sized form.
 * Returns KVP_ERR_ARG if cfg or model is NULL, KVP_ERR_CONFIG if the geometry is invalid
 * (zero sizes, n_q_heads not a multiple of n_kv_heads, odd or too large rope_dim,
 * non-positive theta with RoPE on). On failure *cfg is unchanged.
 */
kvp_status kvp_config_default(kvp_config *cfg, const kvp_model *model);

/**
 * kvp_config_default for a caller whose kvp_config has struct_size bytes (bindings and callers
 * built against another version of this header pass their own sizeof(kvp_config)): writes
 * exactly struct_size bytes, struct_size included. KVP_ERR_ARG for NULL pointers or a size this
 * library does not accept (see "Versioned structs" above); KVP_ERR_CONFIG for a bad geometry.
 */
kvp_status kvp_config_init(kvp_config *cfg, uint32_t struct_size, const kvp_model *model);

/**
 * kvp_config_default that also writes why it failed into err (NUL-terminated, truncated to
 * err_len; "" on success; err may be NULL), naming the model field that is wrong and its value,
 * e.g. "KVP_ERR_CONFIG: invalid configuration: model.n_kv_heads=4 must divide model.n_q_heads=6
 * (...)", "model.rope_theta=0 must be finite and > 1 (...)". Returns and changes exactly what
 * kvp_config_default does (on failure *cfg is unchanged). Thread-safe and heap-free.
 */
kvp_status kvp_config_default_ex(kvp_config *cfg, const kvp_model *model, char *err, size_t err_len);

/**
 * kvp_config_init with a message in err as for kvp_config_default_ex (a struct_size it does not
 * accept is named too). On failure *cfg is unchanged.
 */
kvp_status kvp_config_init_ex(kvp_config *cfg, uint32_t struct_size, const kvp_model *model, char *err,
                              size_t err_len);

/**
 * Applies a spec: space-separated key=value pairs, e.g. "policy=streaming sinks=4 window=1020".
 * Keys are the kvp_config field names (a repeated key: the last value wins). Then checks the
 * whole resulting configuration exactly as kvp_config_check does, so KVP_OK means the config is
 * valid (a spec that leaves it inconsistent, e.g. "policy=window window=9 capacity=4", fails:
 * put related keys in one spec).
 * Defaults follow: a key whose valid values depend on other keys, that this spec does not give
 * and that still holds its kvp_config_default value, follows the keys the spec gives where its
 * default would make them fail, so a default never makes a valid value fail: budget follows a
 * smaller capacity (capacity-1: h2o, snapkv, pyramidkv, asl, and simlayerkv's nonlazy policy),
 * recent a smaller budget (h2o: recent = budget), window a capacity that leaves it less room
 * (window: capacity-1; streaming: capacity - max(compress_every, slack) - sinks - extra;
 * simlayerkv: below its layer capacity), then sinks the same way, and obs_window a smaller
 * budget (snapkv, pyramidkv, asl: obs_window = budget). With max_draft > 1 the capacity these
 * follow is the given one less the draft room (kvp_config_check). "policy=h2o budget=16" gives
 * recent 16; "policy=window capacity=512" window 511. A value the spec gives never changes
 * (then an inconsistency fails as before); the rule is kvp_config_apply's (kvp_config_check
 * judges fields as they are). policy=think applies it to its token_policy.
 * Apply-only keys (kvp_config_key rows with config_size 0; not stored):
 *   compression_ratio=r (0 <= r < 1, the fraction of the KV cache removed, as in kvpress) sets,
 *   for K = max(1, round((1 - r) * N)) tokens kept: window: window=K; streaming:
 *   window=K-sinks-extra (> 0); h2o, snapkv, pyramidkv, asl: budget=K; lethe: capacity=K;
 *   simlayerkv: window=K-sinks (> 0) and, unless nonlazy=full, budget=K; think:
 *   key_channel_ratio = value_channel_ratio = min(r, 0.999) (channels, not tokens); full: error.
 *   ratio_tokens=N is the token count it is resolved against (e.g. prompt + generated tokens);
 *   0 or absent = the config's capacity (lethe, which sets capacity, needs ratio_tokens).
 *   A key it sets that the same spec gives too (e.g. "window=8 compression_ratio=0.5" under
 *   window) is KVP_ERR_CONFIG naming both; so is ratio_tokens without compression_ratio. The
 *   keys it sets count as given (defaults follow them). Returns KVP_ERR_ARG for NULL cfg/spec or a bad struct_size,
 * KVP_ERR_CONFIG for an unknown key (the message suggests the nearest one), a malformed or
 * out-of-range value (the message names the key and the range), a key the caller's (older)
 * kvp_config lacks, a key the resulting policy ignores in a spec that gives `policy` (e.g.
 * "policy=h2o window=48"; the message lists the policy's keys; a spec without `policy` sets keys
 * whatever the policy, so programs can compose specs), or an inconsistent result; KVP_ERR_UNSUPPORTED for a recognised value this
 * version does not implement yet. The spec is applied all-or-nothing: on failure *cfg is
 * unchanged. A message is written to err (NUL-terminated, truncated to err_len) when err is not
 * NULL; "" on success.
 */
kvp_status kvp_config_apply(kvp_config *cfg, const char *spec, char *err, size_t err_len);

/**
 * Checks a whole configuration for consistency: geometry, every field's range (the same table
 * kvp_config_apply and kvp_config_key use), and the cross-field rules (capacity >= what the
 * policy needs, e.g. capacity >= max(C+R, H) for streaming; pool_kernel odd; asl_min_layer <
 * n_layers; snapkv, pyramidkv, asl: budget >= obs_window). With max_draft > 1 a given capacity
 * must also hold max_draft-1 draft slots beyond what the policy needs (window, streaming, h2o,
 * lethe, and simlayerkv/think over them: drafts there go through the store; the default capacity
 * includes them), so drafts of up to max_draft tokens always fit; the message names the
 * capacity that would do. Returns KVP_OK, KVP_ERR_ARG (NULL cfg or a struct_size not accepted),
 * KVP_ERR_CONFIG or KVP_ERR_UNSUPPORTED, with a message in err as for kvp_config_apply.
 * Never modifies cfg.
 */
kvp_status kvp_config_check(const kvp_config *cfg, char *err, size_t err_len);

/** Exact arena bytes kvp_create() needs for cfg (cache object, slots, scratch). 0 if cfg is invalid. */
size_t kvp_arena_size(const kvp_config *cfg);

/**
 * Asks the operating system to back the arena with huge pages: on Linux, madvise(MADV_HUGEPAGE)
 * over the whole 2 MiB pages inside [arena, arena + arena_len) (transparent huge pages in
 * "madvise" or "always" mode). Each decode step streams every live K/V row of the arena; with
 * 4 KiB pages the CPU's hardware prefetchers stop at every page boundary and each page costs a
 * TLB walk: on a Zen 4, one thread's f32 and f16 decode steps at N 32768 ran 10-15 % faster on
 * huge pages (docs/benchmarks.md "Huge pages").
 * Call it after allocating the arena and before kvp_create (create writes the arena; pages
 * touched before the hint stay small until the kernel collapses them). Aligning the arena to
 * 2 MiB and its length to a multiple of 2 MiB lets every page of it be huge. Nothing is allocated,
 * no cache is needed and the arena's bytes are not changed. kvp_create with arena == NULL
 * allocates arenas of 2 MiB or more on 2 MiB boundaries and advises them itself.
 * Returns KVP_OK when the hint was given, or when the range holds no whole 2 MiB page (nothing
 * to advise); KVP_ERR_ARG for a NULL arena; KVP_ERR_UNSUPPORTED where the platform has no such
 * hint (not Linux, a kernel without transparent huge pages) or the kernel refused it (for
 * example memory that is not an ordinary private mapping). A refusal changes nothing: the arena
 * works as before, with small pages.
 */
kvp_status kvp_arena_advise(void *arena, size_t arena_len);

/**
 * Creates a cache in caller memory. arena must be 64-byte aligned and arena_len >=
 * kvp_arena_size(cfg); with arena == NULL the library allocates that once (and frees it in
 * kvp_destroy; from 2 MiB on on 2 MiB boundaries, rounded up to whole 2 MiB pages and advised
 * as kvp_arena_advise does); builds without heap (KVP_NO_HEAP) return KVP_ERR_UNSUPPORTED
 * for that. For a caller's arena, see kvp_arena_advise.
 * Threads: with threads=N > 1, N-1 worker threads are started here (their state lives in the
 * arena; creating a thread is the only allocation, by the C library, and it happens here), so
 * no later call allocates, whichever host thread makes it and whatever thread pools or OpenMP
 * teams the host runs. Between calls the workers sleep (they never spin); a call wakes only as
 * many as its work pays for (small calls run on the caller alone) and the caller always takes
 * part, so a call never waits for a worker that has not started. They block every signal.
 * Builds without thread support (KVP_THREADS=OFF) start none and run every call on the caller.
 * A cache with workers must not be used in a child process after fork() (the workers do not
 * exist there).
 * Returns KVP_ERR_ARG (NULL cfg/out, bad struct_size), KVP_ERR_CONFIG/UNSUPPORTED (as
 * kvp_config_check, or an arena size that overflows this platform's size_t), KVP_ERR_ARENA (too
 * small, misaligned, or the NULL-arena allocation failed), KVP_ERR_STATE (the arena holds a live
 * cache, or the worker threads could not be started; nothing is left running). *out is set only
 * on success. There is no cache to hold a message when this fails:
 * kvp_create_ex returns it in a caller buffer.
 */
kvp_status kvp_create(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out);

/**
 * kvp_create that also writes why it failed into err (NUL-terminated, truncated to err_len;
 * "" on success; err may be NULL). Thread-safe and heap-free: the message lives in the
 * caller's buffer, not in global or thread-local state.
 */
kvp_status kvp_create_ex(const kvp_config *cfg, void *arena, size_t arena_len, kvp_cache **out,
                         char *err, size_t err_len);

/**
 * Destroys a cache (NULL is a no-op). Caller memory is not freed; the arena may be reused.
 * Calls on a destroyed handle whose caller memory is still readable return KVP_ERR_STATE.
 * A second kvp_destroy is a no-op (also for a library-owned arena); so is kvp_destroy of a cache
 * another thread's call is using (see "Threads" above).
 * With threads > 1 it stops and joins the cache's worker threads before it returns (they are
 * asleep between calls, so this takes a wake-up each): free or reuse the arena only after
 * kvp_destroy returned.
 */
void kvp_destroy(kvp_cache *c);

/**
 * Starts a new sequence in the same arena: every layer empty, counters zero. KVP_ERR_ARG for
 * NULL or a pointer that is not a cache, KVP_ERR_STATE for a destroyed one (kvp_last_error
 * says which).
 */
kvp_status kvp_reset(kvp_cache *c);

/**
 * Appends n_tokens tokens to `layer` and computes exact causal attention of their
 * queries over what the layer holds plus the new tokens (before pruning), then applies
 * the policy's prefill compression once. positions: NULL = next positions, else strictly
 * increasing and after the layer's last position. out may be NULL (attention skipped).
 * sel may be NULL except where the ASL policy may select (see kvp_selection); it is written
 * only by the ASL policy (n = 0, selected = 0 otherwise). SimLayerKV decides a layer's
 * laziness here (lazy_mode=prefill) and trims a lazy layer before returning.
 * q is read (and checked) when out is given, and also with out == NULL under a policy that observes
 * or stages the prompt (h2o, snapkv, pyramidkv, lethe, simlayerkv, asl): pass NULL for q when there
 * are none.
 * Errors: KVP_ERR_ARG (NULL c/q/k/v, n_tokens 0, bad positions, out overlapping an input),
 * KVP_ERR_LAYER, KVP_ERR_NONFINITE (q, k or v out of range: see "Input range"),
 * KVP_ERR_FULL (chunk does not fit in capacity, or for snapkv/pyramidkv/asl with q exceeds
 * `prefill_stage`: callers chunk long prompts by kvp_prefill_room), KVP_ERR_BUFFER (asl: sel
 * missing or too small, see kvp_selection), KVP_ERR_STATE.
 */
kvp_status kvp_prefill(kvp_cache *c, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                       const float *q, const float *k, const float *v, float *out, kvp_selection *sel);

/**
 * Decodes one token at the next position: appends k/v, computes attention of q over the
 * layer (including the new token) into out, then prunes if the policy's trigger fires.
 * SimLayerKV with lazy_mode=decode decides the layer's laziness at its first decode after
 * create/reset (and trims a lazy layer after that decode's attention).
 * Errors: KVP_ERR_ARG (NULL pointers, out overlapping q/k/v), KVP_ERR_LAYER, KVP_ERR_NONFINITE,
 * KVP_ERR_FULL, KVP_ERR_STATE.
 */
kvp_status kvp_decode(kvp_cache *c, uint32_t layer, const float *q, const float *k, const float *v,
                      float *out);

/**
 * Stores tokens without attention (restoring a cache, hosts with their own kernels,
 * benchmarks). Position-based triggers (streaming, window) still apply; positions as in
 * kvp_prefill. Errors as kvp_prefill.
 */
kvp_status kvp_append(kvp_cache *c, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                      const float *k, const float *v);

/**
 * Tokens kept by `layer` (max over its KV heads); 0 for NULL c or a bad layer. With
 * head_budget=ada and more than one KV head, heads lend blocks: one head may hold up to twice
 * kvp_layer_capacity while its layer's other heads hold less.
 */
uint32_t kvp_layer_len(const kvp_cache *c, uint32_t layer);

/**
 * Token slots of `layer` per KV head: the resolved capacity (capacity=0 in the config means the
 * policy's minimum). A prefill chunk of n tokens fits when kvp_layer_len + n <= this.
 * With head_budget=ada and more than one KV head it is each head's share: the arena holds the
 * layer's heads this many slots each, and one head may hold up to twice it with slots the others
 * leave (kvp_layer_len). 0 for NULL c or a bad layer.
 */
uint32_t kvp_layer_capacity(const kvp_cache *c, uint32_t layer);

/**
 * The largest prefill chunk n such that kvp_prefill of n tokens into layer 0, then layer 1, ...,
 * then the last layer succeeds from the cache's current state (capacity and, with a shared pool,
 * the blocks the earlier layers of the same chunk take first). A lower bound: the prunes those
 * calls make and self-prunes are not counted. Without a shared pool it is the minimum over layers
 * of kvp_layer_capacity - kvp_layer_len. Policies that stage the prompt (snapkv, pyramidkv: a
 * prefill with q goes through a staging area in the arena and only the selected tokens enter the
 * layer) take any chunk up to `prefill_stage` tokens, whatever the layer holds: that is returned.
 * 0 for NULL c.
 */
uint32_t kvp_prefill_room(const kvp_cache *c);

/**
 * Ends the prompt (config max_prompt > 0): every layer that holds an open prompt runs its
 * policy's prefill selection now, over the whole prompt (plus what the layer held before it),
 * from the prompt's last obs_window queries, exactly as one kvp_prefill of the whole prompt
 * would. A prompt opens with the first kvp_prefill with q after create, kvp_reset or a decode,
 * and ends here, or at the first kvp_decode, kvp_append or kvp_draft_begin after it (so this
 * call is needed only to compress, or save the state, before generating). Returns KVP_OK (also
 * when no prompt is open or max_prompt is 0: nothing happens); KVP_ERR_ARG/KVP_ERR_STATE for a
 * handle that is not a live cache (as kvp_reset), KVP_ERR_STATE while a draft is open (nothing
 * changes).
 */
kvp_status kvp_prompt_end(kvp_cache *c);

/**
 * Sets the query statistics of (layer, q_head) that policy=triattention scores with, for
 * tri_stats=given (the paper's calibration: means over the queries of other text, pre-RoPE).
 * The units of a head: its RoPE pairs first (P = rope_dim/2, rope_dim 0 = head_dim; P = 0 without
 * RoPE), pair i being channels (i, i + P) for NEOX and (2i, 2i + 1) for GPTJ, then one unit per
 * channel past 2P; n_units = P + head_dim - 2P. mean[0..head_dim): the mean of each pre-RoPE query
 * channel; abs_mean[0..n_units): the mean over queries of each unit's magnitude (sqrt(a^2 + b^2)
 * of a pair, |x| of a channel), >= 0. The statistics are copied into the arena, saved with the
 * state and kept across kvp_reset; until they are set a head's are 0 (every score 0: the newest
 * generated tokens stay). Returns KVP_OK; KVP_ERR_ARG for NULL mean/abs_mean, n_units not the
 * head's count (the message gives it) or a negative abs_mean; KVP_ERR_LAYER for layer or q_head out
 * of range; KVP_ERR_NONFINITE for a NaN or Inf value; KVP_ERR_CONFIG when the cache's policy is
 * triattention with tri_stats=online (it accumulates its own); KVP_ERR_UNSUPPORTED for a policy
 * that scores without query statistics; KVP_ERR_ARG/KVP_ERR_STATE for a handle that is not a live
 * cache. On failure nothing changes.
 */
kvp_status kvp_query_stats_set(kvp_cache *c, uint32_t layer, uint32_t q_head, const float *mean,
                               const float *abs_mean, uint32_t n_units);

/**
 * Writes the original positions kept by (layer, kv_head), ascending, into out[0..cap).
 * *n receives the number kept. KVP_ERR_ARG for NULL c/n (or NULL out with cap > 0),
 * KVP_ERR_LAYER for a bad layer or head, KVP_ERR_BUFFER if cap is too small (*n is still set
 * to the number needed, out is untouched: call with cap 0 to learn it). Failures record a
 * message for kvp_last_error; the cache is otherwise unchanged.
 */
kvp_status kvp_layer_positions(const kvp_cache *c, uint32_t layer, uint32_t kv_head,
                               int32_t *out, uint32_t cap, uint32_t *n);

/**
 * Fills *s (the fields within s->struct_size bytes; struct_size itself is left as given).
 * KVP_ERR_ARG for NULL or a struct_size not accepted (see "Versioned structs"); failures
 * record a message for kvp_last_error.
 */
kvp_status kvp_get_stats(const kvp_cache *c, kvp_stats *s);

/**
 * Fills *s (the fields within s->struct_size bytes; struct_size itself is left as given) with the
 * figures of one layer. KVP_ERR_ARG for NULL c/s or a struct_size not accepted (see "Versioned
 * structs"), KVP_ERR_LAYER for a bad layer; failures record a message for kvp_last_error.
 * Never changes the cache otherwise.
 */
kvp_status kvp_get_layer_stats(const kvp_cache *c, uint32_t layer, kvp_layer_stats *s);

/**
 * Message of the last failed call on c ("" if none), in the format described at the top.
 * A static message when c is NULL, destroyed or not a cache. Never NULL. kvp_create failures
 * have no cache: see kvp_create_ex.
 */
const char *kvp_last_error(const kvp_cache *c);

/* ---- Speculative decoding: draft tokens that can be taken back (issue 21) ---- */

/**
 * Opens a draft (speculative decoding). Until kvp_draft_commit, kvp_prefill and kvp_decode on
 * any layer only append draft tokens and attend: each call's queries attend causally over what
 * the layer keeps plus the layer's draft tokens so far (the verification pass), and nothing is
 * pruned, scored or observed: the kept state (tokens, scores, policy state, counters) does not
 * change. A layer takes at most `max_draft` draft tokens in all; positions continue after the
 * layer's drafts (positions as in kvp_prefill; kvp_layer_len counts kept tokens only). kvp_prefill
 * needs q while a draft is open (the commit replays the accepted tokens with it), and refuses a
 * call whose tokens the layer could not take as one prefill at commit (KVP_ERR_FULL), or that
 * may make an ASL selection (KVP_ERR_UNSUPPORTED); kvp_append is refused (KVP_ERR_STATE).
 * Returns KVP_ERR_ARG/KVP_ERR_STATE for a handle that is not a live cache (as kvp_reset),
 * KVP_ERR_CONFIG when the cache was created with max_draft=0, KVP_ERR_STATE when a draft is
 * already open. On failure nothing changes. kvp_reset closes an open draft (its tokens dropped).
 */
kvp_status kvp_draft_begin(kvp_cache *c);

/**
 * Closes the draft: keeps the first `accepted` draft tokens of every layer and drops the rest,
 * leaving the cache in exactly the state one kvp_prefill per layer of those `accepted` tokens
 * (the same q, k, v and positions; nothing when accepted is 0) would have left it in from the
 * state at kvp_draft_begin: the same kept tokens, scores, policy state and counters. Costs the
 * dropped rows (none are copied) plus that prefill without its outputs (appends, and the
 * observation of policies that observe the prompt).
 * Returns KVP_ERR_ARG/KVP_ERR_STATE for a handle that is not a live cache, KVP_ERR_STATE when
 * no draft is open, KVP_ERR_ARG when `accepted` exceeds the draft tokens of some layer (the
 * message names the layer; layers may hold more than `accepted`, never fewer), KVP_ERR_FULL when a
 * shared pool (total_capacity) cannot take the accepted tokens in every layer in turn. On
 * failure nothing changes and the draft stays open (commit fewer tokens, or 0).
 */
kvp_status kvp_draft_commit(kvp_cache *c, uint32_t accepted);

/* ---- Running on the host's threads (issue 30) ---- */

/**
 * A host's parallel-for, given to kvp_set_parallel: it must call task(arg, t) exactly once for
 * every t in [0, n), on any threads, concurrently or one after another, and return only after
 * every one of those calls returned. `user` is the pointer given to kvp_set_parallel. n is at
 * least 2 and at most the cache's `threads`. The tasks share their work through atomics, so
 * results are bit-identical whichever thread runs which t and whether they overlap; a task
 * never blocks waiting for another (running all n in a row on one thread is correct). A
 * function that skips a t or returns early is a host bug (work is lost, outputs are wrong).
 */
typedef void (*kvp_parallel_fn)(void *user, uint32_t n, void (*task)(void *arg, uint32_t t), void *arg);

/**
 * Hands the cache's parallel work to the host's threads: from now on every call that has work
 * items for k > 1 participants (k <= `threads`: KV heads, or chunks of few heads) calls
 * fn(user, k, task, arg) from the calling thread instead of waking the cache's workers, and
 * returns after fn returned. The host's threads are taken to be awake (an engine's compute team
 * at its op), so small calls use them too, where the cache's own sleeping workers are woken only
 * for calls of about 4 MiB of work; a host whose hand-over is costly gives a smaller `threads`. fn is called only from inside calls on this cache
 * (kvp_prefill, kvp_decode, kvp_append and their _ex forms, kvp_prompt_end, kvp_draft_commit),
 * on the thread that made the call; neither fn nor task allocates memory of kvprune's. fn NULL
 * restores the default: the cache's own workers (thread_pool=own) or the caller alone
 * (thread_pool=host). With threads=1 fn is never called. The cache's own workers, if any, stay
 * asleep while fn is set. Not saved by kvp_state_save, kept across kvp_reset and kvp_state_load.
 * Returns KVP_OK; KVP_ERR_UNSUPPORTED in a build without thread support (KVP_THREADS=OFF: a
 * task uses atomics that build lacks); KVP_ERR_ARG/KVP_ERR_STATE for a handle that is not a live
 * cache (as kvp_reset). On failure nothing changes.
 */
kvp_status kvp_set_parallel(kvp_cache *c, kvp_parallel_fn fn, void *user);

/* ---- State save/load (issue 21) ---- */

/**
 * Bytes kvp_state_save writes for the cache's current state: the blocks in use (whole blocks of
 * K/V rows and their metadata), per-layer and per-pool bookkeeping and the policy's state, not
 * the arena. 0 for NULL, a handle that is not a live cache, or a busy cache.
 */
size_t kvp_state_size(const kvp_cache *c);

/**
 * Writes the cache's whole state into caller memory buf[0..size) (no allocation): a versioned,
 * checksummed, little-endian format with one layout on x86-64, aarch64 and armhf (a state
 * written on one loads on the others), that kvp_state_load reads into a cache of the same
 * configuration (thread count aside), which then continues bit-identically to this one on the
 * same platform and kernel variant (across platforms the kernels may round differently). *written (when not NULL) receives the state's size.
 * Returns KVP_ERR_ARG for NULL c/buf or a handle that is not a live cache (KVP_ERR_STATE for a
 * destroyed or busy one), KVP_ERR_BUFFER when size < kvp_state_size (*written is set to the size
 * needed, buf is untouched), KVP_ERR_STATE while a draft or a prompt (max_prompt: call
 * kvp_prompt_end first) is open, KVP_ERR_UNSUPPORTED on a big-endian host. The cache is never
 * changed.
 */
kvp_status kvp_state_save(const kvp_cache *c, void *buf, size_t size, size_t *written);

/**
 * Replaces the cache's state with a state kvp_state_save wrote (a new sequence of the same
 * configuration; whatever the cache held is dropped). Everything is checked before anything
 * changes: KVP_ERR_ARG for NULL c/buf, a buffer that is not a state (magic), whose size is not
 * the state's (truncated, or trailing bytes), whose checksum does not match (corrupted) or whose
 * contents are inconsistent; KVP_ERR_UNSUPPORTED for a state format or kvp_config layout this
 * library cannot read (the message names the writer's version); KVP_ERR_CONFIG for a state saved
 * from another configuration, geometry or kv_dtype (the message names the first differing key;
 * `threads` may differ); KVP_ERR_STATE while a draft is open. On failure the cache is unchanged.
 * An open prompt (max_prompt) is dropped with the rest of the old state when the load succeeds.
 */
kvp_status kvp_state_load(kvp_cache *c, const void *buf, size_t size);

/* ---- RoPE frequencies from the caller (issue 21) ----
 *
 * By default pair i (i < rope_dim/2) of a RoPE model rotates by pos * theta^(-2i/rope_dim).
 * Scaled RoPE variants (linear position interpolation, Llama 3.1's frequency factors, YaRN,
 * LongRoPE) keep the rotation and change the per-pair inverse frequencies; YaRN and LongRoPE also
 * scale the attention logits (kvp_config.rope_attn_factor). kvp_create_rope copies a caller's
 * table of inverse frequencies into the arena at create; every path (float and fixed scoring,
 * positions=realign, quantized keys, drafts) rotates with it instead of theta. The helpers below
 * build the table of each published scheme (docs/rope.md gives the formulas). They compute with
 * the library's deterministic double routines (+, -, *, /, floor: the same bits on every IEEE-754
 * platform) and allocate nothing. "pairs" is rope_dim/2 (rope_dim 0 means head_dim).
 */

/**
 * Checks a RoPE table against cfg (which must itself be valid, as kvp_config_check): inv_freq
 * holds n entries, n == rope_dim/2, every entry finite and > 0; inv_freq NULL with n 0 means
 * "no table" (theta). Returns KVP_OK, KVP_ERR_ARG (NULL cfg, inv_freq NULL with n > 0),
 * KVP_ERR_CONFIG (cfg invalid, n != rope_dim/2, rope=KVP_ROPE_NONE with a table, an entry
 * that is not finite or not > 0: the message names its index and value), with a message in err
 * as kvp_config_check. Changes nothing.
 */
kvp_status kvp_rope_check(const kvp_config *cfg, const double *inv_freq, uint32_t n, char *err, size_t err_len);

/**
 * kvp_create_ex whose RoPE rotates pair i by pos * inv_freq[i] instead of theta's frequencies.
 * The n entries are copied into the arena (the arena size is that of kvp_arena_size(cfg): the
 * table takes the room theta's frequencies would); the caller's array may be freed after the
 * call. inv_freq NULL with n 0 is exactly kvp_create_ex. The table is part of the cache's
 * identity: kvp_state_load refuses a state saved with another table (or none). Returns what
 * kvp_create_ex returns, and the statuses of kvp_rope_check for the table (checked first;
 * nothing is created then). *out is set only on success.
 */
kvp_status kvp_create_rope(const kvp_config *cfg, const double *inv_freq, uint32_t n, void *arena,
                           size_t arena_len, kvp_cache **out, char *err, size_t err_len);

/* ---- DuoAttention heads (issue 32 item 2) ----
 *
 * A role table gives each (layer, KV head) a role: roles[layer * n_kv_heads + h] is
 * KVP_HEAD_RETRIEVAL (0) or KVP_HEAD_STREAMING (1) (kvp_head_role). A retrieval head keeps what
 * the configured policy keeps; a streaming head keeps only its first duo_sink tokens and its
 * duo_window most recent ones, evicting the others as it goes (its blocks go back to its pool),
 * and never runs the policy: between calls it holds at most duo_sink + duo_window tokens, a decode
 * query attends over exactly its sinks and its duo_window newest tokens (itself included), a
 * prefill query over its sinks and at least its duo_window newest. A call adds at most duo_window
 * tokens to a layer with a streaming head (KVP_ERR_FULL otherwise; kvp_prefill_room says so). The
 * arena holds exactly what the heads need (a streaming head: duo_sink + 2 * duo_window - 1 slots),
 * so a table with streaming heads needs less than kvp_arena_size(cfg). kvp_layer_len (the most
 * any KV head of the layer holds) may then exceed kvp_layer_capacity (the policy's capacity per
 * head) when duo_sink + duo_window is larger: chunk by kvp_prefill_room. Supported with policy=full, window,
 * streaming, h2o (head_budget=uniform) and random, f32 storage, without total_capacity, max_prompt or sliding_window;
 * other configurations are KVP_ERR_UNSUPPORTED with a table that has a streaming head.
 */

/**
 * Exact arena bytes kvp_create_heads needs for cfg and the role table roles[0..n_roles)
 * (n_roles == n_layers * n_kv_heads, every entry 0 or 1). roles NULL with n_roles 0, or a table
 * without a streaming head, is kvp_arena_size(cfg). Returns 0 if cfg or the table is invalid or
 * unsupported (kvp_create_heads says why).
 */
size_t kvp_arena_size_heads(const kvp_config *cfg, const uint8_t *roles, uint32_t n_roles);

/**
 * kvp_create_rope with a DuoAttention role table (see above). The table is copied into the
 * cache (the caller's array may be freed after the call); arena_len must be at least
 * kvp_arena_size_heads(cfg, roles, n_roles). roles NULL with n_roles 0 is exactly
 * kvp_create_rope. The table is part of the cache's identity: kvp_state_load refuses a state
 * saved with another table (or none). Returns what kvp_create_rope returns, and KVP_ERR_ARG
 * (roles NULL with n_roles > 0), KVP_ERR_CONFIG (n_roles != n_layers * n_kv_heads, an entry that
 * is not 0 or 1: the message names its index and value; duo_sink + duo_window == 0 or above the
 * capacity limit), KVP_ERR_UNSUPPORTED (a streaming head with a configuration listed above as
 * unsupported), with the message in err. Checked before anything is created: on failure
 * nothing is created and *out is untouched.
 */
kvp_status kvp_create_heads(const kvp_config *cfg, const double *inv_freq, uint32_t n_freq, const uint8_t *roles,
                            uint32_t n_roles, void *arena, size_t arena_len, kvp_cache **out, char *err,
                            size_t err_len);

/**
 * Linear scaling (position interpolation, Chen et al. 2023): inv_freq[i] = theta^(-i/n) / factor
 * for i < n (n = pairs). Returns KVP_ERR_ARG for NULL inv_freq or n == 0, KVP_ERR_CONFIG for
 * theta not finite or <= 1 or factor not finite or < 1 (the message in err names the
 * parameter; err may be NULL). On failure inv_freq is untouched.
 */
kvp_status kvp_rope_freqs_linear(double *inv_freq, uint32_t n, double theta, double factor, char *err,
                                 size_t err_len);

/**
 * Llama 3.1's frequency scaling (HF rope_type "llama3"). With base f_i = theta^(-i/n), wavelength
 * w_i = 2*pi/f_i, L = original_max_position_embeddings: w_i < L/high_freq_factor keeps f_i,
 * w_i > L/low_freq_factor gives f_i/factor, and in between s = (L/w_i - low_freq_factor) /
 * (high_freq_factor - low_freq_factor) blends (1-s)*f_i/factor + s*f_i. Returns KVP_ERR_ARG for
 * NULL inv_freq or n == 0, KVP_ERR_CONFIG for a parameter out of range (theta > 1, factor >= 1,
 * 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings >= 1, all finite).
 * On failure inv_freq is untouched.
 */
kvp_status kvp_rope_freqs_llama3(double *inv_freq, uint32_t n, double theta, double factor, double low_freq_factor,
                                 double high_freq_factor, double original_max_position_embeddings, char *err,
                                 size_t err_len);

/**
 * YaRN (Peng et al. 2023; HF rope_type "yarn"): with f_i = theta^(-i/n), d = 2n, L =
 * original_max_position_embeddings and c(r) = d * ln(L / (2*pi*r)) / (2 ln theta) (the pair whose
 * wavelength fits r times into L), the ramp runs from lo = max(floor(c(beta_fast)), 0) to hi =
 * min(ceil(c(beta_slow)), d-1) (hi = lo + 0.001 when equal): g_i = clamp((i - lo)/(hi - lo), 0, 1),
 * inv_freq[i] = f_i/factor * g_i + f_i * (1 - g_i) (fast pairs keep f_i, slow ones interpolate).
 * *attn_factor (when not NULL) receives the paper's attention factor 0.1 ln(factor) + 1 (1 for
 * factor 1), for kvp_config.rope_attn_factor. Defaults of the published scheme: beta_fast 32,
 * beta_slow 1. Returns KVP_ERR_ARG for NULL inv_freq or n == 0, KVP_ERR_CONFIG for a parameter out
 * of range (theta > 1, factor >= 1, beta_fast > beta_slow > 0, original_max_position_embeddings
 * >= 1, all finite). On failure inv_freq and *attn_factor are untouched.
 */
kvp_status kvp_rope_freqs_yarn(double *inv_freq, uint32_t n, double theta, double factor,
                               double original_max_position_embeddings, double beta_fast, double beta_slow,
                               float *attn_factor, char *err, size_t err_len);

/**
 * Per-pair divisors (a GGUF file's `rope_freqs` tensor, as llama.cpp stores Llama 3.1's scaling;
 * LongRoPE's short/long factors): inv_freq[i] = theta^(-i/n) / divisors[i]. Returns KVP_ERR_ARG
 * for NULL pointers or n == 0, KVP_ERR_CONFIG for theta not finite or <= 1 or a divisor not
 * finite or <= 0 (the message names its index). On failure inv_freq is untouched.
 */
kvp_status kvp_rope_freqs_divided(double *inv_freq, uint32_t n, double theta, const float *divisors, char *err,
                                  size_t err_len);
/* ---- Half-precision inputs and outputs (issue 21) ---- */

/**
 * Element type of the q, k, v and out arrays of the _ex token calls (the numbers are pinned).
 * KVP_IO_F16 is IEEE 754 binary16, KVP_IO_BF16 bfloat16 (the high half of a float32), both in
 * the host's byte order, 2-byte aligned.
 */
typedef enum {
    KVP_IO_F32 = 0,   /**< float32: the plain calls */
    KVP_IO_F16 = 1,   /**< IEEE binary16 */
    KVP_IO_BF16 = 2,  /**< bfloat16 */
    KVP_IO_FORCE_INT32_ = 0x7fffffff
} kvp_io_dtype;

/**
 * kvp_prefill with q, k, v and out of element type `dtype` (same shapes, `dtype` elements instead
 * of floats). The rows are widened to float32 where the call first reads them (the copy of K/V
 * into the cache or its staging rows, the copy of a query row for its rotation) and outputs are
 * computed in float32 and rounded to `dtype` (to nearest, ties to even) as they are written: the
 * cache afterwards, and the outputs, are bit for bit those of kvp_prefill on the inputs converted
 * to float32 (exact), with that call's outputs rounded to `dtype`. KVP_IO_F32 is kvp_prefill.
 * Input range as kvp_prefill: a binary16 Inf or NaN, a bfloat16 Inf or NaN or |x| >= 2^56 is
 * KVP_ERR_NONFINITE (the message names the element and its value). out must not overlap q, k, v
 * or positions (byte ranges of `dtype` elements). Errors as kvp_prefill, and KVP_ERR_ARG for a
 * dtype that is not a kvp_io_dtype; with kv_dtype != f32 or ThinK (formatted storage) a half chunk
 * of more than half the largest layer capacity is KVP_ERR_FULL (its V rows are widened into the
 * chunk's staging rows; kvp_prefill_room does not count this: chunk the call). On failure the
 * cache is unchanged.
 */
kvp_status kvp_prefill_ex(kvp_cache *c, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                          kvp_io_dtype dtype, const void *q, const void *k, const void *v, void *out,
                          kvp_selection *sel);

/**
 * kvp_decode with q, k, v and out of element type `dtype`, converted as in kvp_prefill_ex (the
 * same cache state and outputs as kvp_decode on the inputs widened to float32, its outputs
 * rounded to `dtype`). Errors as kvp_decode, and KVP_ERR_ARG for a dtype that is not a
 * kvp_io_dtype. On failure the cache is unchanged.
 */
kvp_status kvp_decode_ex(kvp_cache *c, uint32_t layer, kvp_io_dtype dtype, const void *q, const void *k,
                         const void *v, void *out);

/**
 * kvp_append with k and v of element type `dtype`, widened to float32 as they are stored (the
 * state of kvp_append on the widened inputs). Errors as kvp_append, KVP_ERR_ARG for a dtype that
 * is not a kvp_io_dtype, and KVP_ERR_FULL for a half chunk beyond half the largest layer capacity
 * under formatted storage (as kvp_prefill_ex). On failure the cache is unchanged.
 */
kvp_status kvp_append_ex(kvp_cache *c, uint32_t layer, uint32_t n_tokens, const int32_t *positions,
                         kvp_io_dtype dtype, const void *k, const void *v);

/* ---- Configuration keys: the library's own table (names, types, defaults, ranges, policies) ---- */

/** Value type of a configuration key. */
typedef enum {
    KVP_KEY_UINT = 0,   /**< unsigned 32-bit integer */
    KVP_KEY_FLOAT = 1,  /**< 32-bit float (finite) */
    KVP_KEY_ENUM = 2,   /**< one of the names in `values` */
    KVP_KEY_FORCE_INT32_ = 0x7fffffff
} kvp_key_type;

/** Bit of `policy` in kvp_key_info.policies. */
#define KVP_POLICY_BIT(policy) (1u << (unsigned)(policy))
/** kvp_key_info.policies of a key every policy uses (policy, capacity, threads, ...). */
#define KVP_POLICY_ALL 0xfffu

/**
 * One row of the key table (kvp_config_key). Set struct_size = sizeof(kvp_key_info) first.
 * Strings are static and never NULL except `values` and `default_name` for numeric keys.
 */
typedef struct kvp_key_info {
    uint32_t struct_size;
    const char *name;          /* spec key, the kvp_config field of the same name (apply-only keys: none) */
    kvp_key_type type;
    double min, max;           /* inclusive range (UINT, FLOAT); ENUM: 0..largest accepted value */
    double default_value;      /* kvp_config_default's value (ENUM: the enum's number) */
    const char *values;        /* ENUM: accepted names, '|'-separated, e.g. "avg|max"; else NULL */
    const char *default_name;  /* ENUM: name of the default value; else NULL */
    uint32_t policies;         /* KVP_POLICY_BIT(p) set when policy p uses the key (KVP_POLICY_ALL: every policy) */
    uint32_t config_size;      /* smallest kvp_config struct_size that holds the field; 0 for an
                                  apply-only key (compression_ratio, ratio_tokens: kvp_config_apply
                                  resolves it into other fields, nothing is stored) */
    const char *help;          /* one line: meaning, units, special values */
} kvp_key_info;

/** Number of configuration keys (rows of the table). */
uint32_t kvp_config_key_count(void);

/**
 * Fills *info with row `index` (0..kvp_config_key_count()-1): the kvp_config fields in their
 * order, then the apply-only keys (config_size 0: compression_ratio, ratio_tokens; default 0 =
 * not given). KVP_ERR_ARG for NULL info, a bad struct_size or index out of range.
 */
kvp_status kvp_config_key(uint32_t index, kvp_key_info *info);

/**
 * Whether key `name` affects a cache of configuration cfg: 1 when cfg's policy uses it (for
 * simlayerkv also when its `nonlazy` policy does; for think when its `token_policy` does, and
 * that policy's `nonlazy` under simlayerkv), 0 when cfg's policy ignores it, -1 for an
 * unknown key, NULL arguments or a bad struct_size. Front ends use it to reject keys that would
 * have no effect ("sinks" under policy=window).
 */
int kvp_config_key_used(const kvp_config *cfg, const char *name);

#ifdef __cplusplus
}
#endif

#endif /* KVPRUNE_H */
