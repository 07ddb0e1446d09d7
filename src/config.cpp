#include "config.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "arena.h"
#include "policies/policy.h"
#include "quant/format.h"

namespace kvp {
namespace {

constexpr const char *kPolicyNames[] = {"full",      "window", "streaming",  "h2o", "snapkv",
                                        "pyramidkv", "lethe",  "simlayerkv", "asl", "think", "random", "triattention", nullptr};
constexpr const char *kPositionNames[] = {"default", "original", "realign", nullptr};
constexpr const char *kDtypeNames[] = {"f32", "f16", "q8", "q4", nullptr};
constexpr const char *kScoreNames[] = {"float", "fixed", nullptr};
constexpr const char *kPoolNames[] = {"avg", "max", nullptr};
constexpr const char *kLazyModeNames[] = {"prefill", "decode", nullptr};
constexpr const char *kChannelScoreNames[] = {"qk", "l1", "l2", nullptr};
constexpr const char *kRotateNames[] = {"none", "hadamard", nullptr};
constexpr const char *kPromptScoresNames[] = {"all", "window", nullptr};
constexpr const char *kTriModeNames[] = {"union", "per_head", "per_layer_perhead", nullptr};
constexpr const char *kTriStatsNames[] = {"online", "given", nullptr};
constexpr const char *kHeadBudgetNames[] = {"uniform", "ada", nullptr};
constexpr const char *kThreadPoolNames[] = {"own", "host", nullptr};

// Values recognised by the spec but not implemented in this version (bit i = enum value i).
// Implementing a policy, dtype or scoring mode = setting its bit here (nothing else in this file).
constexpr uint32_t kPolicyImplemented = (1u << KVP_POLICY_FULL) | (1u << KVP_POLICY_WINDOW) |
                                        (1u << KVP_POLICY_STREAMING) | (1u << KVP_POLICY_H2O) |
                                        (1u << KVP_POLICY_SNAPKV) | (1u << KVP_POLICY_PYRAMIDKV) |
                                        (1u << KVP_POLICY_LETHE) | (1u << KVP_POLICY_THINK) |
                                        (1u << KVP_POLICY_SIMLAYERKV) | (1u << KVP_POLICY_ASL) |
                                        (1u << KVP_POLICY_RANDOM) | (1u << KVP_POLICY_TRIATTENTION);
constexpr uint32_t kDtypeImplemented =
    (1u << KVP_DTYPE_F32) | (1u << KVP_DTYPE_F16) | (1u << KVP_DTYPE_Q8) | (1u << KVP_DTYPE_Q4);
constexpr uint32_t kScoreImplemented = (1u << KVP_SCORE_FLOAT) | (1u << KVP_SCORE_FIXED);

static_assert(KVP_POLICY_TRIATTENTION == 11 && KVP_POLICY_ALL == (1u << 12) - 1, "KVP_POLICY_ALL covers every policy");

enum Kind { kU32 = KVP_KEY_UINT, kF32 = KVP_KEY_FLOAT, kEnum = KVP_KEY_ENUM };

// One row per kvp_config field after `model`, in field order.
struct Key {
    const char *name;
    Kind kind;
    size_t off, size;
    double def;                 // default (enum: value index)
    double lo, hi;              // inclusive range for numbers
    const char *const *names;   // enum value names (index = value)
    uint32_t allowed;           // enum: bit i = names[i] accepted
    const char *values;         // enum: the accepted names, '|'-separated (tests check it against names/allowed)
    uint32_t policies;          // KVP_POLICY_BIT(p): policy p uses the key
    const char *help;
};

#define KVP_U32(f, def, lo, hi, pol, help) {#f, kU32, offsetof(kvp_config, f), sizeof(kvp_config::f), def, lo, hi, nullptr, 0, nullptr, pol, help}
// Apply-only keys (no kvp_config field: off = size = 0): kvp_config_apply resolves them into the
// fields they set (compression_ratio, ratio_tokens); they follow every field row.
#define KVP_APPLY(name, kind, def, lo, hi, pol, help) {name, kind, 0, 0, def, lo, hi, nullptr, 0, nullptr, pol, help}
#define KVP_F32(f, def, lo, hi, pol, help) {#f, kF32, offsetof(kvp_config, f), sizeof(kvp_config::f), def, lo, hi, nullptr, 0, nullptr, pol, help}
#define KVP_ENUM(f, def, names, allowed, values, pol, help) {#f, kEnum, offsetof(kvp_config, f), sizeof(kvp_config::f), def, 0, 0, names, allowed, values, pol, help}
#define P(x) (1u << KVP_POLICY_##x)

constexpr uint32_t kAllNames = 0xffffffffu;
constexpr uint32_t kAll = KVP_POLICY_ALL;
constexpr uint32_t kSnapLike = P(SNAPKV) | P(PYRAMIDKV) | P(ASL);  // budget, obs_window, pool, pool_kernel
constexpr double kRatioMax = 0.999999;  // compression_ratio < 1

// The table. Which policies use a key holds for policies not implemented yet as well (docs/design.md's
// semantics); simlayerkv also uses the keys of its `nonlazy` policy (config_key_used).
constexpr Key kKeys[] = {
    KVP_ENUM(policy, KVP_POLICY_FULL, kPolicyNames, kAllNames,
             "full|window|streaming|h2o|snapkv|pyramidkv|lethe|simlayerkv|asl|think", kAll, "pruning policy"),
    KVP_U32(capacity, 0, 0, kMaxCapacity, kAll,
            "token slots per layer incl. slack; 0 = the policy's minimum (streaming max(C+R, H), window window+1, h2o budget+1, snapkv budget+G (max_new=G, default budget), pyramidkv its layer's largest share+G, lethe 2*budget, full 2048) plus max_draft-1 draft slots (window, streaming, h2o, lethe); a given capacity must hold them too"),
    KVP_ENUM(positions, KVP_POS_DEFAULT, kPositionNames, kAllNames, "default|original|realign", kAll,
             "RoPE positions: original (absolute) or realign (cache-relative); default = realign for streaming/window, original otherwise"),
    KVP_U32(threads, 1, 1, kMaxThreads, kAll,
            "the caller + threads-1 workers started at create, over KV heads and the tokens of few heads; bit-identical for every value"),
    KVP_ENUM(kv_dtype, KVP_DTYPE_F32, kDtypeNames, kAllNames, "f32|f16|q8|q4", kAll, "storage precision of K and V"),
    KVP_ENUM(score, KVP_SCORE_FLOAT, kScoreNames, kAllNames, "float|fixed", kAll,
             "scoring arithmetic; fixed = integer scores from int16 q/k (Q16.16), decisions bit-identical across platforms"),
    KVP_U32(sinks, 4, 0, kMaxCapacity, P(STREAMING) | P(LETHE) | P(SIMLAYERKV),
            "S: first tokens always kept; the default follows capacity and window when they leave less room (streaming, simlayerkv)"),
    KVP_U32(window, 1020, 0, kMaxCapacity, P(WINDOW) | P(STREAMING) | P(SIMLAYERKV),
            "W: most recent tokens kept; the default follows capacity (window: capacity-1; streaming: capacity-max(R,slack)-sinks-extra; simlayerkv: below its layer capacity)"),
    KVP_U32(extra, 0, 0, kMaxCapacity, P(STREAMING), "B: extra budget; C = sinks + window + extra"),
    KVP_U32(compress_every, 1, 0, kMaxCapacity, P(STREAMING), "R: prune when L - C >= R (lazy pruning); 0 = never prune"),
    KVP_U32(slack, 0, 0, kMaxCapacity, P(STREAMING), "sigma: H = C + slack"),
    KVP_U32(max_drop, 0, 0, kMaxCapacity, P(STREAMING), "delta: prune to min(max(L - delta, C), H); 0 = prune to C"),
    KVP_U32(budget, 1024, 1, kMaxCapacity, P(H2O) | kSnapLike | P(LETHE) | P(RANDOM) | P(TRIATTENTION),
            "tokens kept per layer and KV head (pyramidkv: the mean over layers; lethe: capacity 0 = 2*budget; random with keep_prompt=1 and triattention: generated tokens kept beside the prompt); the default follows a smaller capacity (capacity-1)"),
    KVP_U32(recent, 32, 0, kMaxCapacity, P(H2O) | kSnapLike,
            "most recent tokens never evicted by decode eviction; the default follows a smaller budget (h2o: min(32, budget))"),
    KVP_U32(obs_window, 32, 1, kMaxCapacity, P(H2O) | kSnapLike | P(LETHE) | P(THINK),
            "observation window: the last prefill queries that score (snapkv: vote; the window is kept, so snapkv/pyramidkv/asl need budget >= obs_window; h2o: with prompt_scores=window only; the default follows a smaller budget)"),
    KVP_U32(pool_kernel, 7, 1, 255, kSnapLike, "pooling kernel width of the votes (odd)"),
    KVP_ENUM(pool, KVP_POOL_MAX, kPoolNames, kAllNames, "avg|max", kSnapLike, "pooling of the votes"),
    KVP_F32(beta, 20.0, 1e-6, 1e6, P(PYRAMIDKV) | P(TRIATTENTION),
            "pyramidkv: pyramid steepness (>= 1), the last layer keeps (budget - obs_window) / beta + obs_window; triattention: a whole number of generated tokens a KV head gathers beyond budget before they are cut back to budget by score (the paper's beta; 128 unless given)"),
    KVP_F32(sparse_ratio, 400.0, 1.0, 1e12, P(LETHE), "tau: breakpoint at the first cut where top[0]/top[c] >= sparse_ratio"),
    KVP_F32(recent_ratio, 0.3, 0.0, 1.0, P(LETHE), "fraction of the layer length kept as recent tokens"),
    KVP_U32(segments, 10, 2, 1u << 16, P(LETHE), "D: cut points floor(K*d/D), d = 1..D-1"),
    KVP_F32(decay, 0.9, 0.0, 1.0, P(LETHE), "RASR score decay per step"),
    KVP_F32(lazy_threshold, 0.9, 0.0, 1.0, P(SIMLAYERKV),
            "a layer is lazy when its attention mass on the first sinks + last window keys (mean over query heads and queries) exceeds this"),
    KVP_U32(lazy_last, 32, 1, kMaxCapacity, P(SIMLAYERKV), "last prefill queries averaged for the lazy decision (lazy_mode=prefill)"),
    KVP_ENUM(lazy_mode, 0, kLazyModeNames, kAllNames, "prefill|decode", P(SIMLAYERKV),
             "decide laziness from the last queries of each prefill call or from the first decode query"),
    KVP_ENUM(nonlazy, KVP_POLICY_FULL, kPolicyNames, P(FULL) | P(SNAPKV) | P(H2O), "full|snapkv|h2o", P(SIMLAYERKV),
             "policy of the non-lazy layers (its keys apply too)"),
    KVP_U32(asl_min_layer, 4294967295.0, 0, 4294967295.0, P(ASL),
            "first layer that may be the selection layer (< n_layers); 4294967295 = floor(n_layers/3)"),
    KVP_U32(asl_obs_layers, 8, 1, kMaxLayers, P(ASL), "layers whose token ranks enter the rank variance (the last N up to the layer)"),
    KVP_F32(asl_tau, 0.3, 0.0, 1e6, P(ASL), "the first layer whose relative rank variance falls below this is the selection layer"),
    KVP_F32(key_channel_ratio, 0.5, 0.0, 0.999, P(THINK), "fraction of key channels pruned per KV head"),
    KVP_F32(value_channel_ratio, 0.0, 0.0, 0.999, P(THINK), "fraction of value channels pruned per KV head"),
    KVP_ENUM(channel_score, 0, kChannelScoreNames, kAllNames, "qk|l1|l2", P(THINK),
             "channel score: qk = ||Q_obs[:,j] K[:,j]^T||_F, l1/l2 = key magnitude"),
    KVP_U32(block, 16, 1, kMaxBlock, kAll, "token slots per block of the shared pool"),
    KVP_U32(total_capacity, 0, 0, 4294967295.0, kAll,
            "token slots per KV head summed over layers in the shared pool; 0 or >= the sum of the per-layer capacities = no sharing; less = a layer whose pool is dry evicts by its own ranking"),
    KVP_U32(evict_threshold, 0, 0, kMaxCapacity, P(LETHE), "lethe: initial L_evict per layer; 0 = capacity/2"),
    KVP_U32(prefill_stage, 0, 0, kMaxCapacity, kSnapLike,
            "prompt tokens one kvp_prefill call may take (staged in the arena, shared by the layers); 0 = max(1024, capacity)"),
    KVP_ENUM(token_policy, KVP_POLICY_FULL, kPolicyNames, kAllNames & ~P(THINK) & ~P(TRIATTENTION),
             "full|window|streaming|h2o|snapkv|pyramidkv|lethe|simlayerkv|asl", P(THINK),
             "the token policy ThinK composes with (its keys apply too)"),
    KVP_U32(quant_group, 32, 1, kMaxBlock, kAll,
            "tokens per quantization group and per full-precision residual (kv_dtype f16/q8/q4, ThinK); the storage block then"),
    KVP_U32(lazy_force, 0, 0, 4294967295.0, P(SIMLAYERKV),
            "benchmarks/tests: 0 = decide laziness by attention; else bit l makes layer l lazy, the others not (random-layer baseline; n_layers <= 32)"),
    KVP_U32(max_draft, 0, 0, kMaxDraft, kAll,
            "speculative decoding: draft tokens in flight per layer between kvp_draft_begin and kvp_draft_commit; drafts of up to max_draft tokens fit at every policy's default capacity; 0 = no drafts"),
    KVP_F32(attn_scale, 0.0, 0.0, 1.0, kAll,
            "attention logit scale: logits = q.k * attn_scale (Gemma: 1/sqrt(query_pre_attn_scalar)); 0 = 1/sqrt(head_dim)"),
    KVP_F32(logit_softcap, 0.0, 0.0, 1e6, kAll, "attention logit soft-capping: logits = c * tanh(logits / c) (Gemma 2: 50); 0 = off"),
    KVP_F32(rope_attn_factor, 1.0, 1.0 / 64, 64.0, kAll,
            "RoPE attention factor a (YaRN's mscale 0.1 ln(s) + 1, LongRoPE): logits = q.k * scale * a^2, as if q and k were both scaled by a; 1 = none"),
    KVP_U32(sliding_window, 0, 0, kMaxCapacity, kAll,
            "sliding-window layers: a local layer's query at position p sees keys p-W < pos <= p and the layer holds only those (blocks go back to the pool); 0 = none"),
    KVP_U32(sliding_pattern, 0, 0, kMaxLayers, kAll,
            "with sliding_window: layer l is global (full attention, the policy runs there) iff P > 0 and (l+1) % P == 0, the others local (Gemma 3: 6, Gemma 2: 2); 0 = every layer local (Mistral)"),
    KVP_ENUM(kv_rotate, KVP_ROTATE_NONE, kRotateNames, kAllNames, "none|hadamard", kAll,
             "rotate stored K (after RoPE) and V by an orthonormal Walsh-Hadamard transform per head, queries and outputs to match (exact in exact arithmetic; for f16/q8/q4 storage); not with policy=think"),
    KVP_U32(max_prompt, 0, 0, kMaxCapacity, kAll & ~P(FULL),
            "the largest prompt held whole in every layer (any chunking) until it ends (kvp_prompt_end or the first decode), when the policy selects from it once; 0 = each prefill call selects from its own chunk (full never selects; think holds the prompt at f32 until it chooses its channels there)"),
    KVP_U32(max_new, 0, 0, kMaxCapacity, P(SNAPKV) | P(PYRAMIDKV),
            "G: tokens generated after a prompt while its selection stays whole: the default capacity is the layer's budget + G (the papers keep the selection and append); then decode evicts by score; 0 = budget"),
    KVP_ENUM(prompt_scores, 0, kPromptScoresNames, kAllNames, "all|window", P(H2O),
             "h2o: all = every prompt query's attention summed into the scores (H2O), fused into the prefill attention; window = the last obs_window queries only"),
    KVP_U32(seed, 0, 0, 4294967295.0, P(RANDOM),
            "random: the seed of the victims' draws (splitmix64 of seed, layer, KV head and the store's eviction count)"),
    KVP_U32(keep_prompt, 1, 0, 1, P(RANDOM),
            "random: 1 = prompt tokens (kvp_prefill/kvp_append) are kept and generated ones cut back to budget at random; 0 = any token may go, budget kept"),
    KVP_ENUM(tri_mode, KVP_TRI_UNION, kTriModeNames, kAllNames, "union|per_head|per_layer_perhead", P(TRIATTENTION),
             "triattention: one choice of generated tokens for every layer and head (union: each query head nominates its budget best, the highest nominees stay), per KV head over the layers (per_head: mean over layers of the group's max), or per layer and KV head (per_layer_perhead)"),
    KVP_ENUM(tri_stats, 0, kTriStatsNames, kAllNames, "online|given", P(TRIATTENTION),
             "triattention: online = query statistics are the means over the queries the cache sees; given = the caller's (kvp_query_stats_set: an offline calibration), kept across kvp_reset"),
    KVP_U32(duo_sink, 64, 0, kMaxCapacity, kAll,
            "DuoAttention streaming heads (kvp_create_heads role table): the first tokens a streaming head keeps (the reference's sink_size 64); unused without a table"),
    KVP_U32(duo_window, 256, 0, kMaxCapacity, kAll,
            "DuoAttention streaming heads: the most recent tokens a streaming head keeps (the reference's recent_size 256); a call adds at most this many tokens to a layer with a streaming head"),
    KVP_ENUM(head_budget, KVP_HEAD_BUDGET_UNIFORM, kHeadBudgetNames, kAllNames, "uniform|ada", P(SNAPKV) | P(PYRAMIDKV) | P(H2O) | P(LETHE) | P(TRIATTENTION),
             "per-head budgets: uniform = every KV head keeps the layer's budget; ada = AdaKV: the layer keeps as many tokens in total, chosen by one ranking of all its heads' scores (snapkv/pyramidkv: at each selection; h2o: at every prune; lethe: at each round and capacity cut; triattention: at each cut, tri_mode=per_layer_perhead; each head at least ada_floor of its share); heads lend blocks, so one head may hold up to 2x capacity; plain f32 storage only"),
    KVP_F32(ada_floor, 0.2, 0.0, 1.0, P(SNAPKV) | P(PYRAMIDKV) | P(H2O) | P(LETHE) | P(TRIATTENTION),
            "head_budget=ada: every KV head keeps at least floor(a x its uniform share) tokens, its window counted (kvpress's alpha_safeguard 0.2)"),
    KVP_ENUM(thread_pool, KVP_THREAD_POOL_OWN, kThreadPoolNames, kAllNames, "own|host", kAll,
             "whose threads run a call's parallel part: own = kvp_create starts threads-1 workers; host = none, the host's parallel-for given with kvp_set_parallel (threads = the most participants a call uses); bit-identical either way"),
    // apply-only keys (kvp_key_info.config_size 0): resolved by kvp_config_apply, not stored
    KVP_APPLY("compression_ratio", kF32, 0.0, 0.0, kRatioMax, kAll & ~P(FULL),
              "apply-only: fraction r of the KV cache removed, 0 <= r < 1; K = max(1, round((1-r)*ratio_tokens)) tokens kept: window=K (window), window=K-sinks-extra (streaming), budget=K (h2o/snapkv/pyramidkv/asl/random/triattention), capacity=K (lethe), window=K-sinks and budget=K unless nonlazy=full (simlayerkv), key/value_channel_ratio=r (think); a key it sets given in the same spec is an error"),
    KVP_APPLY("ratio_tokens", kU32, 0.0, 0.0, 4294967295.0, kAll & ~P(FULL),
              "apply-only: the token count compression_ratio is resolved against (e.g. the sequence length); 0 = the config's capacity (lethe: must be given)"),
};

#undef KVP_U32
#undef KVP_F32
#undef KVP_ENUM
#undef P

constexpr uint32_t kNumKeys = uint32_t(sizeof kKeys / sizeof kKeys[0]);

constexpr uint32_t kNumApplyKeys = 2;  // compression_ratio, ratio_tokens: the last rows
constexpr uint32_t kNumFieldKeys = kNumKeys - kNumApplyKeys;

constexpr bool table_is_consistent() {
    for (uint32_t i = 0; i < kNumKeys; ++i) {
        const Key &k = kKeys[i];
        if (k.size != (i < kNumFieldKeys ? 4u : 0u)) return false;     // every field is 32-bit
        if (k.kind == kEnum && (k.names == nullptr || k.values == nullptr)) return false;
        if (k.kind != kEnum && !(k.lo <= k.def && k.def <= k.hi)) return false;  // defaults in range
    }
    for (uint32_t i = 1; i < kNumFieldKeys; ++i)
        if (kKeys[i].off != kKeys[i - 1].off + kKeys[i - 1].size) return false;  // every field, in order
    return kNumKeys <= 64 && kKeys[0].off == offsetof(kvp_config, policy) &&
           kKeys[kNumFieldKeys - 1].off + kKeys[kNumFieldKeys - 1].size == sizeof(kvp_config);
}
// A new kvp_config field needs its row here (name, default, range, policies): this fails otherwise.
static_assert(table_is_consistent(), "kKeys: one 32-bit row per kvp_config field after model, in order, defaults in range");

// An enum field's value as stored. C callers may put any int there, and loading an enum with
// a value outside its enumerators is undefined in C++, so validation reads the raw bits.
template <class E>
uint32_t raw(const E &e) {
    static_assert(sizeof(E) == sizeof(uint32_t), "enums in kvp_config are int-sized");
    uint32_t v;
    memcpy(&v, &e, sizeof v);
    return v;
}

char *field_of(kvp_config *c, const Key &k) { return reinterpret_cast<char *>(c) + k.off; }
const char *field_of(const kvp_config *c, const Key &k) { return reinterpret_cast<const char *>(c) + k.off; }
uint32_t load_u32(const kvp_config &c, const Key &k) {
    uint32_t v;
    memcpy(&v, field_of(&c, k), 4);
    return v;
}
float load_f32(const kvp_config &c, const Key &k) {
    float v;
    memcpy(&v, field_of(&c, k), 4);
    return v;
}
void store_u32(kvp_config *c, const Key &k, uint32_t v) { memcpy(field_of(c, k), &v, 4); }
void store_f32(kvp_config *c, const Key &k, float v) { memcpy(field_of(c, k), &v, 4); }

uint32_t count_names(const char *const *names) {
    uint32_t n = 0;
    while (names[n]) ++n;
    return n;
}

// Every field after `model` at its default (model zeroed, struct_size = the library's).
void set_defaults(kvp_config *c) {
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof(kvp_config);
    for (uint32_t i = 0; i < kNumFieldKeys; ++i) {
        const Key &k = kKeys[i];
        if (k.kind == kF32) store_f32(c, k, float(k.def));
        else store_u32(c, k, uint32_t(k.def));
    }
}

bool token_eq(const char *a, size_t n, const char *b) { return strlen(b) == n && memcmp(a, b, n) == 0; }

const Key *find_key(const char *name, size_t n) {
    for (const Key &k : kKeys)
        if (token_eq(name, n, k.name)) return &k;
    return nullptr;
}

// Levenshtein distance (short strings only; 99 when either is longer than 40).
uint32_t edit_distance(const char *a, size_t an, const char *b) {
    const size_t bn = strlen(b);
    if (an > 40 || bn > 40) return 99;
    uint32_t prev[41], cur[41];
    for (size_t j = 0; j <= bn; ++j) prev[j] = uint32_t(j);
    for (size_t i = 1; i <= an; ++i) {
        cur[0] = uint32_t(i);
        for (size_t j = 1; j <= bn; ++j) {
            uint32_t best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            const uint32_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            cur[j] = sub < best ? sub : best;
        }
        memcpy(prev, cur, sizeof(uint32_t) * (bn + 1));
    }
    return prev[bn];
}

// Whether a[0..n) is a subsequence of b ("key_ratio" of "key_channel_ratio").
bool subsequence(const char *a, size_t n, const char *b) {
    size_t i = 0;
    for (; *b && i < n; ++b)
        if (*b == a[i]) ++i;
    return i == n;
}

// The key nearest to an unknown one, or nullptr when none is close: edit distance <= 2 (3 for
// names of 6+ characters), or the unknown name (3+ characters) is a subsequence of a key, e.g.
// an abbreviation or a prefix.
const Key *nearest_key(const char *name, size_t n) {
    const Key *best = nullptr;
    uint32_t best_d = 99;
    for (const Key &k : kKeys) {
        uint32_t d = edit_distance(name, n, k.name);
        if (n >= 3 && d > 2 && subsequence(name, n, k.name)) d = 2;
        if (d < best_d) { best_d = d; best = &k; }
    }
    return best_d <= (n >= 6 ? 3u : 2u) ? best : nullptr;
}

// Unsigned decimal, no sign, no spaces; fails on overflow past 2^32-1.
bool parse_u32(const char *s, size_t n, uint32_t *out) {
    if (n == 0 || n > 10) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + uint64_t(s[i] - '0');
    }
    if (v > 0xffffffffu) return false;
    *out = uint32_t(v);
    return true;
}

// [+-]digits[.digits][(e|E)[+-]digits]; no nan/inf. Own parser: strtod is locale-dependent and
// newlib's allocates.
bool parse_f64(const char *s, size_t n, double *out) {
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    uint64_t mant = 0;
    int exp10 = 0, digits = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; ++i, ++digits) {
        if (mant < 100000000000000000ull) mant = mant * 10 + uint64_t(s[i] - '0');
        else ++exp10;
    }
    if (i < n && s[i] == '.') {
        for (++i; i < n && s[i] >= '0' && s[i] <= '9'; ++i, ++digits) {
            if (mant < 100000000000000000ull) { mant = mant * 10 + uint64_t(s[i] - '0'); --exp10; }
        }
    }
    if (digits == 0) return false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        bool eneg = false;
        if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        int e = 0, ed = 0;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; ++i, ++ed) {
            if (e < 10000) e = e * 10 + (s[i] - '0');
        }
        if (ed == 0) return false;
        exp10 += eneg ? -e : e;
    }
    if (i != n) return false;
    double v = double(mant);
    double p = 1.0;
    for (int k = exp10 < 0 ? -exp10 : exp10; k > 0 && p < 1e300; --k) p *= 10.0;
    v = exp10 < 0 ? v / p : v * p;
    *out = neg ? -v : v;
    return true;
}

void list_values(const Key &k, Msg &m) { m.s(k.values); }

// The one range check of a field, used by kvp_config_apply (per key, as it is set) and by
// kvp_config_check (every key).
kvp_status check_range(const kvp_config &c, const Key &k, Msg &m) {
    if (k.kind == kEnum) {
        const uint32_t v = load_u32(c, k);
        if (v < count_names(k.names) && ((k.allowed >> v) & 1u)) return KVP_OK;
        m.s(k.name);
        if (v < count_names(k.names)) m.s("=").s(k.names[v]);
        else m.s(": unknown value ").u(v);
        m.s(": expected one of ");
        list_values(k, m);
        return KVP_ERR_CONFIG;
    }
    if (k.kind == kU32) {
        const uint32_t v = load_u32(c, k);
        if (double(v) >= k.lo && double(v) <= k.hi) return KVP_OK;
        m.s(k.name).s("=").u(v).s(": out of range ").u(uint64_t(k.lo)).s("..").u(uint64_t(k.hi));
        return KVP_ERR_CONFIG;
    }
    const float v = load_f32(c, k);
    if (v >= float(k.lo) && v <= float(k.hi)) return KVP_OK;  // false for NaN
    m.s(k.name).s("=").f(double(v)).s(": out of range ").f(k.lo).s("..").f(k.hi);
    return KVP_ERR_CONFIG;
}

// Parses `val` for key k into *c and range-checks it.
kvp_status set_key(kvp_config *c, const Key &k, const char *val, size_t vn, Msg &m) {
    if (k.kind == kEnum) {
        for (uint32_t i = 0; k.names[i]; ++i) {
            if (token_eq(val, vn, k.names[i])) {
                store_u32(c, k, i);
                return check_range(*c, k, m);
            }
        }
        m.s(k.name).s("=").sn(val, vn).s(": expected one of ");
        list_values(k, m);
        return KVP_ERR_CONFIG;
    }
    if (k.kind == kU32) {
        uint32_t v;
        if (!parse_u32(val, vn, &v)) {
            m.s(k.name).s("=").sn(val, vn).s(": not an unsigned integer in ").u(uint64_t(k.lo)).s("..").u(uint64_t(k.hi));
            return KVP_ERR_CONFIG;
        }
        store_u32(c, k, v);
        return check_range(*c, k, m);
    }
    double d;
    if (!parse_f64(val, vn, &d)) {
        m.s(k.name).s("=").sn(val, vn).s(": not a finite number in ").f(k.lo).s("..").f(k.hi);
        return KVP_ERR_CONFIG;
    }
    // Out-of-float-range values become +-inf or 0 here and fail (or pass) the range check as such.
    store_f32(c, k, float(d > 3.5e38 ? 3.5e38 : (d < -3.5e38 ? -3.5e38 : d)));
    return check_range(*c, k, m);
}

const char *rope_name(uint32_t r) { return r == KVP_ROPE_NEOX ? "KVP_ROPE_NEOX" : "KVP_ROPE_GPTJ"; }

// The geometry; each message names the model field that is wrong and its value.
kvp_status check_model(const kvp_model &md, Msg &m) {
    if (md.n_layers == 0 || md.n_layers > kMaxLayers) {
        m.s("model.n_layers=").u(md.n_layers).s(" must be in 1..").u(kMaxLayers);
        return KVP_ERR_CONFIG;
    }
    if (md.n_q_heads == 0 || md.n_q_heads > kMaxHeads) {
        m.s("model.n_q_heads=").u(md.n_q_heads).s(" must be in 1..").u(kMaxHeads);
        return KVP_ERR_CONFIG;
    }
    if (md.n_kv_heads == 0 || md.n_kv_heads > md.n_q_heads || md.n_q_heads % md.n_kv_heads != 0) {
        m.s("model.n_kv_heads=").u(md.n_kv_heads).s(" must divide model.n_q_heads=").u(md.n_q_heads)
            .s(" (each KV head serves n_q_heads/n_kv_heads query heads)");
        return KVP_ERR_CONFIG;
    }
    if (md.head_dim == 0 || md.head_dim > kMaxHeadDim) {
        m.s("model.head_dim=").u(md.head_dim).s(" must be in 1..").u(kMaxHeadDim);
        return KVP_ERR_CONFIG;
    }
    if (raw(md.rope) > KVP_ROPE_GPTJ) {
        m.s("model.rope=").u(raw(md.rope)).s(" must be KVP_ROPE_NONE (0), KVP_ROPE_NEOX (1) or KVP_ROPE_GPTJ (2)");
        return KVP_ERR_CONFIG;
    }
    if (md.rope != KVP_ROPE_NONE) {
        if (md.rope_dim == 0 && md.head_dim % 2 != 0) {
            m.s("model.head_dim=").u(md.head_dim).s(" is odd: with model.rope=").s(rope_name(raw(md.rope)))
                .s(" and rope_dim=0 (= head_dim) RoPE needs an even head_dim; set model.rope_dim to an even value < head_dim");
            return KVP_ERR_CONFIG;
        }
        if (md.rope_dim % 2 != 0 || md.rope_dim > md.head_dim) {
            m.s("model.rope_dim=").u(md.rope_dim).s(" must be even and <= model.head_dim=").u(md.head_dim)
                .s(" (model.rope=").s(rope_name(raw(md.rope))).s(")");
            return KVP_ERR_CONFIG;
        }
        if (!(md.rope_theta > 1.0f) || isinf(md.rope_theta)) {
            m.s("model.rope_theta=").f(double(md.rope_theta)).s(" must be finite and > 1 (model.rope=")
                .s(rope_name(raw(md.rope))).s("; KVP_ROPE_NONE needs no theta)");
            return KVP_ERR_CONFIG;
        }
    }
    return KVP_OK;
}

kvp_status check_supported(const kvp_config &c, Msg &m) {
    if (!((kPolicyImplemented >> uint32_t(c.policy)) & 1u)) {
        m.s("policy=").s(kPolicyNames[c.policy]).s(" is recognised but not implemented in this version");
        return KVP_ERR_UNSUPPORTED;
    }
    if (!((kDtypeImplemented >> uint32_t(c.kv_dtype)) & 1u)) {
        m.s("kv_dtype=").s(kDtypeNames[c.kv_dtype]).s(" is recognised but not implemented in this version");
        return KVP_ERR_UNSUPPORTED;
    }
    if (!((kScoreImplemented >> uint32_t(c.score)) & 1u)) {
        m.s("score=").s(kScoreNames[c.score]).s(" is recognised but not implemented in this version");
        return KVP_ERR_UNSUPPORTED;
    }
    if (c.policy == KVP_POLICY_THINK && !((kPolicyImplemented >> uint32_t(c.token_policy)) & 1u)) {
        m.s("token_policy=").s(kPolicyNames[c.token_policy]).s(" is recognised but not implemented in this version");
        return KVP_ERR_UNSUPPORTED;
    }
    return KVP_OK;
}

}  // namespace

bool struct_size_ok(uint32_t size, size_t first_layout, size_t known) {
    return size >= first_layout && size <= known && size % 4 == 0;
}

kvp_status config_default(kvp_config *cfg, const kvp_model *model, Msg &m) {
    if (!cfg || !model) { m.s("cfg and model must not be NULL"); return KVP_ERR_ARG; }
    kvp_status st = check_model(*model, m);
    if (st != KVP_OK) return st;
    kvp_config c;
    set_defaults(&c);
    c.model = *model;
    *cfg = c;
    return KVP_OK;
}

kvp_status config_init(kvp_config *cfg, uint32_t size, const kvp_model *model, Msg &m) {
    if (!cfg || !model) { m.s("cfg and model must not be NULL"); return KVP_ERR_ARG; }
    if (!struct_size_ok(size, kConfigFirstSize, sizeof(kvp_config))) {
        m.s("struct_size=").u(size).s(": this library accepts ").u(kConfigFirstSize).s("..").u(sizeof(kvp_config))
            .s(" (multiples of 4)");
        return KVP_ERR_ARG;
    }
    kvp_config c;
    kvp_status st = config_default(&c, model, m);
    if (st != KVP_OK) return st;
    c.struct_size = size;
    memcpy(cfg, &c, size);
    return KVP_OK;
}

kvp_status config_load(const kvp_config *user, kvp_config *full, Msg &m) {
    if (!user) { m.s("cfg must not be NULL"); return KVP_ERR_ARG; }
    uint32_t size;
    memcpy(&size, user, sizeof size);
    if (!struct_size_ok(size, kConfigFirstSize, sizeof(kvp_config))) {
        m.s("cfg->struct_size=").u(size).s(": this library accepts ").u(kConfigFirstSize).s("..").u(sizeof(kvp_config))
            .s(" (multiples of 4); initialise cfg with kvp_config_default or kvp_config_init");
        return KVP_ERR_ARG;
    }
    set_defaults(full);
    memcpy(full, user, size);
    full->struct_size = sizeof(kvp_config);
    return KVP_OK;
}

uint32_t config_draft_room(const kvp_config &c) {
    if (c.max_draft <= 1) return 0;
    uint32_t p = raw(c.policy) == KVP_POLICY_THINK ? raw(c.token_policy) : raw(c.policy);
    if (p == KVP_POLICY_SIMLAYERKV) p = raw(c.nonlazy);
    switch (p) {
        case KVP_POLICY_WINDOW:
        case KVP_POLICY_STREAMING:
        case KVP_POLICY_H2O:
        case KVP_POLICY_LETHE:
        case KVP_POLICY_RANDOM:
        case KVP_POLICY_TRIATTENTION: return c.max_draft - 1;
        default: return 0;  // full keeps every token; snapkv, pyramidkv, asl stage a prefill with queries
    }
}

namespace {

// The config a policy's own check and plan judge (issue 28): no drafts, and a given capacity less
// the draft room (config_draft_room). false when a given capacity does not exceed the room.
bool policy_view(const kvp_config &c, kvp_config *pc) {
    const uint32_t room = config_draft_room(c);
    *pc = c;
    pc->max_draft = 0;
    if (!c.capacity) return true;
    if (c.capacity <= room) return false;
    pc->capacity = c.capacity - room;
    return true;
}

// Policies that keep their observation window whole from a prompt (snapkv's vote window).
bool snap_like(uint32_t p) { return p == KVP_POLICY_SNAPKV || p == KVP_POLICY_PYRAMIDKV || p == KVP_POLICY_ASL; }

// The token policy that owns budget, recent and obs_window (think: its token policy; simlayerkv:
// its nonlazy policy).
uint32_t owner_policy(const kvp_config &c) {
    uint32_t p = raw(c.policy) == KVP_POLICY_THINK ? raw(c.token_policy) : raw(c.policy);
    if (p == KVP_POLICY_SIMLAYERKV) p = raw(c.nonlazy);
    return p;
}

const Key &key_named(const char *name) {
    const Key *k = find_key(name, strlen(name));
    return *k;  // names of this file's table
}
uint32_t key_index(const Key &k) { return uint32_t(&k - kKeys); }

// Keys set by one spec: bit i = kKeys[i].
struct Given {
    uint64_t bits = 0;
    bool has(const Key &k) const { return (bits >> key_index(k)) & 1u; }
    void add(const Key &k) { bits |= uint64_t(1) << key_index(k); }
};

// A key whose default depends on other keys may follow them: when the spec does not give it and
// it still holds its default value (kvprune.h, kvp_config_apply).
bool follows(const kvp_config &c, const Given &g, const char *name) {
    const Key &k = key_named(name);
    return !g.has(k) && load_u32(c, k) == uint32_t(k.def);
}

bool budget_policy(const kvp_config &c, uint32_t p) {
    return p == KVP_POLICY_H2O || p == KVP_POLICY_SNAPKV || p == KVP_POLICY_PYRAMIDKV || p == KVP_POLICY_ASL ||
           (p == KVP_POLICY_RANDOM && !c.keep_prompt);  // keep_prompt=1: the capacity also holds the prompt
}

// Defaults that depend on other keys follow them, so that a default never makes a valid value
// of the spec fail (issue 22): budget follows a smaller capacity, recent a smaller budget
// (h2o), window a capacity that leaves less room (window, streaming, simlayerkv), then sinks.
// Only where the rule would otherwise fail; the checks that follow still judge the result.
void follow_defaults(kvp_config &c, const Given &g) {
    const uint32_t pol = raw(c.policy) == KVP_POLICY_THINK ? raw(c.token_policy) : raw(c.policy);
    if (pol > KVP_POLICY_TRIATTENTION) return;  // the range check reports it
    const uint32_t owner = pol == KVP_POLICY_SIMLAYERKV ? raw(c.nonlazy) : pol;  // budget, recent, capacity
    // The capacity the policy works within: a given capacity less the draft room (config_check
    // refuses one that does not exceed it).
    const uint32_t draft = config_draft_room(c);
    const uint32_t cap = c.capacity > draft ? c.capacity - draft : c.capacity;
    if (budget_policy(c, owner) && cap && cap <= c.budget && cap >= 2 && follows(c, g, "budget"))
        c.budget = cap - 1;  // capacity >= budget + 1
    if (owner == KVP_POLICY_H2O && c.recent > c.budget && follows(c, g, "recent")) c.recent = c.budget;
    if (pol == KVP_POLICY_TRIATTENTION && !g.has(key_named("beta")) && c.beta == 20.0f)
        c.beta = 128.0f;  // the paper's interval (20 is pyramidkv's default; beta is a float key)
    if (snap_like(owner) && c.obs_window > c.budget && follows(c, g, "obs_window"))
        c.obs_window = c.budget;  // issue 28: budget >= obs_window
    if (pol == KVP_POLICY_WINDOW && cap && uint64_t(c.window) + 1 > cap && cap >= 2 && follows(c, g, "window"))
        c.window = cap - 1;
    if (pol == KVP_POLICY_STREAMING && cap) {  // capacity >= max(C + R, C + slack), C = S + W + B
        const uint64_t pad = c.compress_every > c.slack ? c.compress_every : c.slack;
        const uint64_t room = cap > pad ? cap - pad : 0;
        if (uint64_t(c.sinks) + c.window + c.extra > room && follows(c, g, "window") &&
            room >= uint64_t(c.sinks) + c.extra + 1)
            c.window = uint32_t(room - c.sinks - c.extra);
        if (uint64_t(c.sinks) + c.window + c.extra > room && follows(c, g, "sinks") &&
            room >= uint64_t(c.window) + c.extra)
            c.sinks = uint32_t(room - c.window - c.extra);
    }
    if (pol == KVP_POLICY_SIMLAYERKV && owner <= KVP_POLICY_THINK) {  // sinks + window < the layer capacity
        LayerPlan lp;
        kvp_config pc;
        policy_view(c, &pc);
        policy_table(kvp_policy(owner)).plan(pc, 0, &lp);
        uint64_t room = lp.cap ? lp.cap - 1 : 0;
        if (lp.budget && lp.budget < room) room = lp.budget;  // snapkv's generation room is not the lazy layers'
        if (uint64_t(c.sinks) + c.window > room && follows(c, g, "window") && room >= uint64_t(c.sinks) + 1)
            c.window = uint32_t(room - c.sinks);
        if (uint64_t(c.sinks) + c.window > room && follows(c, g, "sinks") && room >= c.window)
            c.sinks = uint32_t(room - c.window);
    }
}

const char *policy_name(uint32_t p) { return p <= KVP_POLICY_TRIATTENTION ? kPolicyNames[p] : "?"; }

// compression_ratio=r resolved against N tokens (ratio_tokens, else capacity): K = max(1,
// round((1 - r) N)) tokens kept, the keys of the policy's table (kvprune.h), each marked given; a
// key it sets that the spec gives too is an error naming both.
kvp_status resolve_ratio(kvp_config &c, double r, uint32_t tokens, bool has_tokens, Given &g, Msg &m) {
    const uint32_t pol = raw(c.policy);
    if (pol == KVP_POLICY_FULL) {
        m.s("compression_ratio does not apply to policy=full (it keeps every token); use window, streaming, h2o, "
            "snapkv, pyramidkv, lethe, simlayerkv, asl or think");
        return KVP_ERR_CONFIG;
    }
    if (pol > KVP_POLICY_TRIATTENTION) return KVP_OK;  // the range check reports the policy
    {  // the keys it sets (as in the switch below) must not be given as well
        const char *names[2] = {nullptr, nullptr};
        switch (pol) {
            case KVP_POLICY_WINDOW:
            case KVP_POLICY_STREAMING: names[0] = "window"; break;
            case KVP_POLICY_LETHE: names[0] = "capacity"; break;
            case KVP_POLICY_SIMLAYERKV:
                names[0] = "window";
                if (c.nonlazy != KVP_POLICY_FULL) names[1] = "budget";
                break;
            case KVP_POLICY_THINK: names[0] = "key_channel_ratio"; names[1] = "value_channel_ratio"; break;
            default: names[0] = "budget"; break;
        }
        for (const char *name : names) {
            if (name && g.has(key_named(name))) {
                m.s("compression_ratio sets ").s(name).s(" for policy=").s(policy_name(pol)).s(" and the spec gives ")
                    .s(name).s(" too: give one of them, not both");
                return KVP_ERR_CONFIG;
            }
        }
    }
    const uint32_t N = has_tokens && tokens ? tokens : c.capacity;
    if (pol == KVP_POLICY_LETHE && !(has_tokens && tokens)) {
        m.s("compression_ratio under policy=lethe sets capacity: give ratio_tokens=N (the token count it is resolved against)");
        return KVP_ERR_CONFIG;
    }
    if (N == 0 && pol != KVP_POLICY_THINK) {
        m.s("compression_ratio needs the token count it is resolved against: ratio_tokens=N (e.g. the sequence length) or capacity=N");
        return KVP_ERR_CONFIG;
    }
    const double kept = floor((1.0 - r) * double(N) + 0.5);
    const uint32_t K = kept < 1.0 ? 1u : uint32_t(kept);
    struct Set {
        const char *key;
        uint32_t u;
        float f;
    } sets[2];
    uint32_t n = 0;
    switch (pol) {
        case KVP_POLICY_WINDOW: sets[n++] = {"window", K, 0}; break;
        case KVP_POLICY_STREAMING: {
            const uint64_t se = uint64_t(c.sinks) + c.extra;
            if (K <= se) {
                m.s("compression_ratio=").f(r).s(" keeps ").u(K).s(" of ").u(N).s(" tokens, not more than sinks+extra=").u(se);
                return KVP_ERR_CONFIG;
            }
            sets[n++] = {"window", uint32_t(K - se), 0};
            break;
        }
        case KVP_POLICY_H2O:
        case KVP_POLICY_SNAPKV:
        case KVP_POLICY_PYRAMIDKV:
        case KVP_POLICY_ASL:
        case KVP_POLICY_RANDOM:
        case KVP_POLICY_TRIATTENTION: sets[n++] = {"budget", K, 0}; break;
        case KVP_POLICY_LETHE: sets[n++] = {"capacity", K, 0}; break;
        case KVP_POLICY_SIMLAYERKV:
            if (K <= c.sinks) {
                m.s("compression_ratio=").f(r).s(" keeps ").u(K).s(" of ").u(N).s(" tokens, not more than sinks=").u(c.sinks);
                return KVP_ERR_CONFIG;
            }
            sets[n++] = {"window", K - c.sinks, 0};
            if (c.nonlazy != KVP_POLICY_FULL) sets[n++] = {"budget", K, 0};  // full keeps every token of its layers
            break;
        case KVP_POLICY_THINK: {
            const float fr = float(r < 0.999 ? r : 0.999);
            sets[n++] = {"key_channel_ratio", 0, fr};
            sets[n++] = {"value_channel_ratio", 0, fr};
            break;
        }
        default: break;
    }
    for (uint32_t i = 0; i < n; ++i) {
        const Key &k = key_named(sets[i].key);
        if (k.kind == kF32) store_f32(&c, k, sets[i].f);
        else store_u32(&c, k, sets[i].u);
        g.add(k);
        const kvp_status st = check_range(c, k, m);
        if (st != KVP_OK) {
            m.s(" (set by compression_ratio=").f(r).s(" of ").u(N).s(" tokens)");
            return st;
        }
    }
    return KVP_OK;
}

// Issue 28: a spec that chooses the policy (gives `policy`) and a key that policy ignores
// ("policy=h2o window=48") contradicts itself: refused, naming the policy's keys (the CLI's rule,
// now the library's; bench/harness/spec.cpp relies on it). A spec without `policy` sets keys on
// whatever policy the config has, or will have: programs compose specs (DECISIONS, issue 28).
kvp_status check_given_used(const kvp_config &c, const Given &g, Msg &m) {
    if (!g.has(kKeys[0])) return KVP_OK;  // kKeys[0] is policy
    for (uint32_t i = 0; i < kNumFieldKeys; ++i) {
        const Key &k = kKeys[i];
        if (!g.has(k) || config_key_used(c, k.name) != 0) continue;
        m.s("key '").s(k.name).s("' has no effect under policy=").s(policy_name(raw(c.policy))).s(" (its keys: ");
        bool any = false;
        for (uint32_t j = 0; j < kNumFieldKeys; ++j) {
            if (kKeys[j].policies == kAll || config_key_used(c, kKeys[j].name) != 1) continue;
            m.s(any ? ", " : "").s(kKeys[j].name);
            any = true;
        }
        if (!any) m.s("none of its own");
        m.s("; common to all: ");
        any = false;
        for (uint32_t j = 0; j < kNumFieldKeys; ++j) {
            if (kKeys[j].policies != kAll) continue;
            m.s(any ? ", " : "").s(kKeys[j].name);
            any = true;
        }
        m.s(")");
        return KVP_ERR_CONFIG;
    }
    // h2o scores the prompt with every query unless prompt_scores=window (the only use it has of
    // obs_window there; think's channel choice and lethe use obs_window themselves)
    const uint32_t pol = raw(c.policy);
    const bool h2o = pol == KVP_POLICY_H2O || (pol == KVP_POLICY_SIMLAYERKV && raw(c.nonlazy) == KVP_POLICY_H2O);
    if (h2o && c.prompt_scores == 0 && g.has(key_named("obs_window"))) {
        m.s("key 'obs_window' has no effect under policy=").s(policy_name(pol))
            .s(" with prompt_scores=all (every prompt query scores, H2O's rule): give prompt_scores=window to score by the last obs_window queries");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

}  // namespace

kvp_status config_apply(kvp_config *cfg, const char *spec, Msg &m) {
    if (!cfg || !spec) { m.s("cfg and spec must not be NULL"); return KVP_ERR_ARG; }
    kvp_config tmp;  // all-or-nothing
    kvp_status st = config_load(cfg, &tmp, m);
    if (st != KVP_OK) return st;
    const uint32_t user_size = cfg->struct_size;
    Given given;
    bool has_ratio = false, has_tokens = false;
    double ratio = 0;
    uint32_t tokens = 0;
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == '\n') ++p;
        if (!*p) break;
        const char *tok = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n') ++p;
        const size_t tn = size_t(p - tok);
        const char *eq = static_cast<const char *>(memchr(tok, '=', tn));
        if (!eq || eq == tok) {
            m.s("expected key=value, got '").sn(tok, tn).s("'");
            return KVP_ERR_CONFIG;
        }
        const size_t kn = size_t(eq - tok);
        const Key *k = find_key(tok, kn);
        if (!k) {
            m.s("unknown key '").sn(tok, kn).s("'");
            if (const Key *near = nearest_key(tok, kn)) m.s(" (did you mean '").s(near->name).s("'?)");
            return KVP_ERR_CONFIG;
        }
        const char *val = eq + 1;
        const size_t vn = tn - kn - 1;
        if (k->size == 0) {  // apply-only keys
            if (k->kind == kF32) {  // compression_ratio
                if (!parse_f64(val, vn, &ratio)) {
                    m.s(k->name).s("=").sn(val, vn).s(": not a number in [0, 1)");
                    return KVP_ERR_CONFIG;
                }
                if (!(ratio >= 0.0 && ratio < 1.0)) {
                    m.s(k->name).s("=").sn(val, vn).s(" must be in [0, 1) (the fraction of the KV cache removed)");
                    return KVP_ERR_CONFIG;
                }
                has_ratio = true;
            } else {  // ratio_tokens
                if (!parse_u32(val, vn, &tokens)) {
                    m.s(k->name).s("=").sn(val, vn).s(": not an unsigned integer in 0..4294967295");
                    return KVP_ERR_CONFIG;
                }
                has_tokens = true;
            }
            continue;
        }
        if (k->off + k->size > user_size) {
            m.s("key '").s(k->name).s("' is not in the caller's kvp_config (struct_size=").u(user_size)
                .s(", the field needs ").u(k->off + k->size).s(": built against an older kvprune.h)");
            return KVP_ERR_CONFIG;
        }
        st = set_key(&tmp, *k, val, vn, m);
        if (st != KVP_OK) return st;
        given.add(*k);
    }
    if (has_tokens && !has_ratio) {
        m.s("ratio_tokens is the token count compression_ratio is resolved against: give compression_ratio too");
        return KVP_ERR_CONFIG;
    }
    if (has_ratio && (st = resolve_ratio(tmp, ratio, tokens, has_tokens, given, m)) != KVP_OK) return st;
    if ((st = check_given_used(tmp, given, m)) != KVP_OK) return st;
    follow_defaults(tmp, given);
    st = config_check(tmp, m);
    if (st != KVP_OK) return st;
    // Write back only the caller's bytes, struct_size excepted.
    memcpy(reinterpret_cast<char *>(cfg) + sizeof(uint32_t), reinterpret_cast<const char *>(&tmp) + sizeof(uint32_t),
           user_size - sizeof(uint32_t));
    return KVP_OK;
}

kvp_status roles_check(const kvp_config &c, const uint8_t *roles, uint32_t n, bool *stream, Msg &m) {
    if (stream) *stream = false;
    if (!roles) {
        if (n == 0) return KVP_OK;
        m.s("roles is NULL but n_roles=").u(n).s(" (NULL with 0 means no role table)");
        return KVP_ERR_ARG;
    }
    const uint64_t want = uint64_t(c.model.n_layers) * c.model.n_kv_heads;
    if (n != want) {
        m.s("n_roles=").u(n).s(" must be n_layers * n_kv_heads = ").u(want).s(" (one role per layer and KV head)");
        return KVP_ERR_CONFIG;
    }
    bool any = false;
    for (uint32_t i = 0; i < n; ++i) {
        if (roles[i] > KVP_HEAD_STREAMING) {
            m.s("roles[").u(i).s("]=").u(roles[i]).s(" (layer ").u(i / c.model.n_kv_heads).s(", KV head ")
                .u(i % c.model.n_kv_heads).s(") is not a role: 0 (KVP_HEAD_RETRIEVAL) or 1 (KVP_HEAD_STREAMING)");
            return KVP_ERR_CONFIG;
        }
        if (roles[i] == KVP_HEAD_STREAMING) any = true;
    }
    if (!any) return KVP_OK;  // every head retrieval: exactly the cache without a table
    if (c.duo_window == 0) {
        m.s("duo_window=0: a streaming head must keep at least the newest token (duo_window >= 1)");
        return KVP_ERR_CONFIG;
    }
    if (uint64_t(c.duo_sink) + 2ull * c.duo_window - 1 > kMaxCapacity) {  // arena.h stream_geom
        m.s("duo_sink + 2 * duo_window - 1 = ").u(uint64_t(c.duo_sink) + 2ull * c.duo_window - 1)
            .s(" (a streaming head's slots) exceeds the capacity limit ").u(kMaxCapacity);
        return KVP_ERR_CONFIG;
    }
    if (c.max_draft > c.duo_window) {
        m.s("max_draft=").u(c.max_draft).s(" exceeds duo_window=").u(c.duo_window)
            .s(": a streaming head takes at most duo_window tokens per call (a draft's commit is one)");
        return KVP_ERR_CONFIG;
    }
    const bool pol_ok = policy_of(c).streaming_heads;  // full, window, streaming, h2o, random (policy.h)
    const char *what = !pol_ok ? "this policy (streaming heads: policy=full, window, streaming, h2o or random)"
                       : store_formatted(c) ? "kv_dtype other than f32 (streaming heads need plain f32 storage)"
                       : c.total_capacity ? "total_capacity (a shared pool)"
                       : c.head_budget == KVP_HEAD_BUDGET_ADA ? "head_budget=ada (its ranking spans every KV head of a layer)"
                       : c.max_prompt ? "max_prompt"
                       : c.sliding_window ? "sliding_window"
                                          : nullptr;
    if (what) {
        m.s("a role table with streaming heads (kvp_create_heads) is not supported with ").s(what);
        return KVP_ERR_UNSUPPORTED;
    }
    if (stream) *stream = true;
    return KVP_OK;
}

uint32_t config_block(const kvp_config &c) { return store_formatted(c) ? c.quant_group : c.block; }

kvp_positions config_positions(const kvp_config &c) {
    if (c.positions != KVP_POS_DEFAULT) return c.positions;
    return policy_of(c).default_positions;
}

kvp_status check_engine_rules(const kvp_config &c, Msg &m);  // issue 21 (end of this file)

namespace {

// The policy's own rules on what it works within (policy_view), drafts aside; then (issue 28) a
// given capacity must hold the draft room too: refused here, with the capacity that would do,
// rather than KVP_ERR_FULL at the first draft.
kvp_status check_policy(const Policy &pol, const kvp_config &c, Msg &m) {
    kvp_config c0 = c, pc;
    c0.max_draft = 0;
    kvp_status st = pol.check(c0, m);
    if (st != KVP_OK) return st;
    const uint32_t room = config_draft_room(c);
    if (!room || !c.capacity) return KVP_OK;
    char buf[8];
    Msg quiet(buf, sizeof buf);
    if (policy_view(c, &pc) && pol.check(pc, quiet) == KVP_OK) return KVP_OK;
    // the least capacity that does: capacity + room passes (c0 did), c.capacity does not
    uint64_t lo = c.capacity, hi = uint64_t(c.capacity) + room;
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        kvp_config t = c;
        t.capacity = uint32_t(mid);
        quiet.clear();
        if (policy_view(t, &pc) && pol.check(pc, quiet) == KVP_OK) hi = mid;
        else lo = mid;
    }
    m.s("capacity=").u(c.capacity).s(" is too small for max_draft=").u(c.max_draft).s(" under policy=")
        .s(kPolicyNames[raw(c.policy)]).s(": a draft needs max_draft-1=").u(room)
        .s(" slots beyond what the policy keeps, so capacity >= ").u(hi)
        .s(" (or leave capacity=0: its default includes them), or a smaller max_draft");
    return KVP_ERR_CONFIG;
}

}  // namespace

kvp_status config_check(const kvp_config &c, Msg &m) {
    if (c.struct_size != sizeof(kvp_config)) {  // internal: callers pass a config_load()ed copy
        m.s("cfg->struct_size=").u(c.struct_size).s(", expected ").u(sizeof(kvp_config)).s(": use kvp_config_default");
        return KVP_ERR_ARG;
    }
    kvp_status st = check_model(c.model, m);
    if (st != KVP_OK) return st;
    for (uint32_t i = 0; i < kNumFieldKeys; ++i) {
        st = check_range(c, kKeys[i], m);
        if (st != KVP_OK) return st;
    }
    st = check_supported(c, m);
    if (st != KVP_OK) return st;

    // Cross-field rules.
    if (c.pool_kernel % 2 == 0) {
        m.s("pool_kernel=").u(c.pool_kernel).s(" must be odd (a centred pooling window)");
        return KVP_ERR_CONFIG;
    }
    if (c.asl_min_layer != 0xffffffffu && c.asl_min_layer >= c.model.n_layers) {
        m.s("asl_min_layer=").u(c.asl_min_layer).s(" must be < n_layers=").u(c.model.n_layers)
            .s(" (or 4294967295 = floor(n_layers/3))");
        return KVP_ERR_CONFIG;
    }
    if ((st = check_engine_rules(c, m)) != KVP_OK) return st;  // issue 21 (end of this file)
    const uint32_t owner = owner_policy(c);
    if (snap_like(owner) && c.budget < c.obs_window) {  // issue 28: the window is kept whole
        m.s("budget=").u(c.budget).s(" is below obs_window=").u(c.obs_window).s(" (policy=").s(kPolicyNames[owner])
            .s(" keeps the observation window whole from a prompt): give budget >= obs_window");
        return KVP_ERR_CONFIG;
    }
    const Policy &pol = policy_of(c);
    if (pol.check && (st = check_policy(pol, c, m)) != KVP_OK) return st;
    for (uint32_t l = 0; l < c.model.n_layers; ++l) {
        LayerGeom g;
        layer_geom(c, l, &g);
        if (g.lp.cap == 0 || g.lp.cap > kMaxCapacity) {
            m.s("layer ").u(l).s(": capacity ").u(g.lp.cap).s(" must be in 1..").u(kMaxCapacity);
            return KVP_ERR_CONFIG;
        }
    }
    // The shared pool: the layers' capacities and the blocks they need (arena.h).
    ArenaPlan plan = {};
    const char *why = nullptr;
    if (!arena_plan(c, &plan, &why)) {
        m.s(why ? why : "the arena size overflows");
        if (plan.shared) m.s(" (total_capacity=").u(c.total_capacity).s(", block=").u(c.block).s(")");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

uint32_t config_key_count() { return kNumKeys; }

void config_word_text(size_t off, uint32_t word, Msg &m) {
    for (uint32_t i = 0; i < kNumFieldKeys; ++i) {
        const Key &k = kKeys[i];
        if (k.off != off) continue;
        if (k.kind == kEnum) {
            if (word < count_names(k.names)) m.s(k.names[word]);
            else m.s("(value ").u(word).s(")");
        } else if (k.kind == kF32) {
            float f;
            memcpy(&f, &word, sizeof f);
            m.f(double(f));
        } else {
            m.u(word);
        }
        return;
    }
    m.u(word);
}

bool config_key_info(uint32_t index, kvp_key_info *info) {
    if (index >= kNumKeys) return false;
    const Key &k = kKeys[index];
    kvp_key_info r;
    memset(&r, 0, sizeof r);
    r.struct_size = info->struct_size;
    r.name = k.name;
    r.type = kvp_key_type(k.kind);
    r.min = k.lo;
    r.max = k.hi;
    r.default_value = k.def;
    r.policies = k.policies;
    r.config_size = uint32_t(k.off + k.size);
    r.help = k.help;
    if (k.kind == kEnum) {
        r.values = k.values;
        r.default_name = k.names[uint32_t(k.def)];
        uint32_t hi = 0;
        for (uint32_t i = 0; k.names[i]; ++i)
            if ((k.allowed >> i) & 1u) hi = i;
        r.min = 0;
        r.max = hi;
    }
    memcpy(info, &r, info->struct_size);
    return true;
}

int config_key_used(const kvp_config &c, const char *name) {
    const Key *k = find_key(name, strlen(name));
    if (!k) return -1;
    const uint32_t p = raw(c.policy);
    if (p <= KVP_POLICY_TRIATTENTION && ((k->policies >> p) & 1u)) return 1;
    if (p == KVP_POLICY_SIMLAYERKV) {
        const uint32_t nl = raw(c.nonlazy);
        if (nl <= KVP_POLICY_THINK && ((k->policies >> nl) & 1u)) return 1;
    }
    if (p == KVP_POLICY_THINK) {  // ThinK over its token policy: that policy's keys apply too
        const uint32_t tp = raw(c.token_policy);
        if (tp <= KVP_POLICY_RANDOM && tp != KVP_POLICY_THINK && ((k->policies >> tp) & 1u)) return 1;
        if (tp == KVP_POLICY_SIMLAYERKV) {  // and, over simlayerkv, its nonlazy policy's (issue 28)
            const uint32_t nl = raw(c.nonlazy);
            if (nl <= KVP_POLICY_THINK && ((k->policies >> nl) & 1u)) return 1;
        }
    }
    return 0;
}

// ---- issue 21: rules for engines ----

// Pre-rotated inputs: with rope=none the caller rotates q and k itself, so the library cannot
// re-rotate a kept key to a new position; positions=realign would silently realign nothing.
// Sliding-window layers (sliding.h): contradictory combinations are refused.
static kvp_status check_sliding(const kvp_config &c, Msg &m) {
    if (c.sliding_window == 0) {
        if (c.sliding_pattern != 0) {
            m.s("sliding_pattern=").u(c.sliding_pattern).s(" needs sliding_window=W (W >= 1): without a window no layer is local");
            return KVP_ERR_CONFIG;
        }
        return KVP_OK;
    }
    if (c.sliding_pattern == 1) {
        m.s("sliding_pattern=1 makes every layer global, so sliding_window=").u(c.sliding_window)
            .s(" applies to none: drop sliding_window, or use P >= 2 (layer l global iff (l+1) % P == 0) or 0 (all local)");
        return KVP_ERR_CONFIG;
    }
    const bool any_global = c.sliding_pattern != 0 && c.sliding_pattern <= c.model.n_layers;
    if (!any_global && c.policy != KVP_POLICY_FULL) {
        m.s("every layer is local (sliding_pattern=").u(c.sliding_pattern).s(", n_layers=").u(c.model.n_layers)
            .s("): policy ").s(policy_of(c).name).s(" would run on no layer; use policy=full, or a pattern with global layers");
        return KVP_ERR_CONFIG;
    }
    if (c.policy == KVP_POLICY_ASL) {
        m.s("policy=asl with sliding_window: ASL's rank-variance ring needs consecutive global layers and its selection "
            "would skip the local ones; use another policy for the global layers");
        return KVP_ERR_UNSUPPORTED;
    }
    if (c.policy == KVP_POLICY_THINK) {
        m.s("policy=think with sliding_window: ThinK's channel pruning is cache-wide storage and would change the local "
            "layers' exact window attention; use its token policy alone");
        return KVP_ERR_UNSUPPORTED;
    }
    return KVP_OK;
}

kvp_status check_engine_rules(const kvp_config &c, Msg &m) {
    kvp_status st_sw;
    if (c.model.rope == KVP_ROPE_NONE && c.positions == KVP_POS_REALIGN) {
        m.s("positions=realign needs the library to rotate keys, but rope=none (q and k arrive pre-rotated or "
            "without RoPE): kvprune cannot re-rotate keys it did not rotate; use positions=original, or give the "
            "RoPE parameters (rope, rope_dim, rope_theta, or a frequency table: kvp_create_rope) and pass q/k before RoPE");
        return KVP_ERR_CONFIG;
    }
    if (c.score == KVP_SCORE_FIXED && c.rope_attn_factor != 1.0f) {  // fixed::logit_scale_of takes a scale <= 1
        const double base = c.attn_scale > 0.0f ? double(c.attn_scale) : 1.0 / sqrt(double(c.model.head_dim));
        const double eff = base * double(c.rope_attn_factor) * double(c.rope_attn_factor);
        if (eff > 1.0) {
            m.s("score=fixed needs the logit scale (attn_scale or 1/sqrt(head_dim)) times rope_attn_factor^2 <= 1, but it is ")
                .f(eff).s(" (rope_attn_factor=").f(double(c.rope_attn_factor)).s(")");
            return KVP_ERR_CONFIG;
        }
    }
    if ((st_sw = check_sliding(c, m)) != KVP_OK) return st_sw;
    if (c.logit_softcap > 0.0f && c.score == KVP_SCORE_FIXED) {
        m.s("logit_softcap is not implemented for score=fixed (fixed-point scores have no tanh); use score=float");
        return KVP_ERR_UNSUPPORTED;
    }
    // issue 28 (DECISIONS "Whole-prompt selection"): the prompt is held whole and selected once
    // when it ends (ASL: asl.h; ThinK's channels: store_fmt.h). Not yet: a shared pool would let
    // the prompt of one layer take another's blocks (self-pruning inside the prompt).
    if (c.max_prompt) {
        if (c.total_capacity) {
            m.s("max_prompt=").u(c.max_prompt).s(" with total_capacity=").u(c.total_capacity)
                .s(" is not supported yet (the prompt's blocks would come from the shared pool); give one of them");
            return KVP_ERR_UNSUPPORTED;
        }
    }
    // issue 32 item 1 (DECISIONS "AdaKV per-head budgets"): the selection is made in the layer
    // phase, after every head's staged chunk was observed; formatted storage converts a head's
    // committed tokens in its own per-head work, which has ended by then.
    if (c.head_budget == KVP_HEAD_BUDGET_ADA && c.policy != KVP_POLICY_SNAPKV && c.policy != KVP_POLICY_PYRAMIDKV &&
        c.policy != KVP_POLICY_H2O && c.policy != KVP_POLICY_LETHE && c.policy != KVP_POLICY_TRIATTENTION) {
        m.s("head_budget=ada with policy=").s(policy_name(c.policy))
            .s(": the policy has no per-head token budget (head_budget=ada is for snapkv, pyramidkv, h2o, lethe and triattention)");
        return KVP_ERR_UNSUPPORTED;
    }
    if (c.head_budget == KVP_HEAD_BUDGET_ADA && c.policy == KVP_POLICY_TRIATTENTION && c.tri_mode != KVP_TRI_PER_LAYER_PERHEAD) {
        m.s("head_budget=ada with triattention needs tri_mode=per_layer_perhead (tri_mode=")
            .s(c.tri_mode == KVP_TRI_UNION ? "union" : "per_head")
            .s(" keeps one choice for several stores: there is no per-head budget to split)");
        return KVP_ERR_UNSUPPORTED;
    }
    if (c.head_budget == KVP_HEAD_BUDGET_ADA && c.kv_dtype != KVP_DTYPE_F32) {
        m.s("head_budget=ada needs kv_dtype=f32 (the per-head budgets are decided after every head's chunk, "
            "when formatted storage has already converted its rows): use kv_dtype=f32, or head_budget=uniform");
        return KVP_ERR_UNSUPPORTED;
    }
    // issue 23: ThinK prunes key and value channels by their magnitude in the model's basis; the
    // rotation spreads every channel over all of them, so ThinK's ranking would act on mixtures.
    if (c.kv_rotate == KVP_ROTATE_HADAMARD && c.policy == KVP_POLICY_THINK) {
        m.s("kv_rotate=hadamard does not compose with policy=think: ThinK prunes key/value channels by magnitude, "
            "and the rotation mixes every channel into all of them (docs/rotate.md); use kv_rotate=none with think, "
            "or a token policy with kv_rotate=hadamard");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

}  // namespace kvp
