#include "config.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "arena.h"
#include "policies/policy.h"

namespace kvp {
namespace {

const char *const kPolicyNames[] = {"full",      "window", "streaming",  "h2o", "snapkv",
                                    "pyramidkv", "lethe",  "simlayerkv", "asl", "think", nullptr};
const char *const kPositionNames[] = {"default", "original", "realign", nullptr};
const char *const kDtypeNames[] = {"f32", "f16", "q8", "q4", nullptr};
const char *const kScoreNames[] = {"float", "fixed", nullptr};
const char *const kPoolNames[] = {"avg", "max", nullptr};
const char *const kLazyModeNames[] = {"prefill", "decode", nullptr};
const char *const kChannelScoreNames[] = {"qk", "l1", "l2", nullptr};

// Values recognised by the spec but not implemented in this version (bit i = enum value i).
constexpr uint32_t kPolicyImplemented = (1u << KVP_POLICY_FULL) | (1u << KVP_POLICY_WINDOW) |
                                        (1u << KVP_POLICY_STREAMING) | (1u << KVP_POLICY_H2O) |
                                        (1u << KVP_POLICY_SNAPKV) | (1u << KVP_POLICY_PYRAMIDKV) |
                                        (1u << KVP_POLICY_LETHE);
constexpr uint32_t kDtypeImplemented = 1u << KVP_DTYPE_F32;
constexpr uint32_t kScoreImplemented = (1u << KVP_SCORE_FLOAT) | (1u << KVP_SCORE_FIXED);
constexpr uint32_t kNonlazyAllowed =
    (1u << KVP_POLICY_FULL) | (1u << KVP_POLICY_SNAPKV) | (1u << KVP_POLICY_H2O);

enum Kind { kU32, kF32, kEnum };

struct Key {
    const char *name;
    Kind kind;
    size_t off, size;
    double lo, hi;               // inclusive range for numbers
    const char *const *names;    // enum value names (index = value)
};

#define KVP_U32(f, lo, hi) {#f, kU32, offsetof(kvp_config, f), sizeof(((kvp_config *)0)->f), lo, hi, nullptr}
#define KVP_F32(f, lo, hi) {#f, kF32, offsetof(kvp_config, f), sizeof(((kvp_config *)0)->f), lo, hi, nullptr}
#define KVP_ENUM(f, names) {#f, kEnum, offsetof(kvp_config, f), sizeof(((kvp_config *)0)->f), 0, 0, names}

const Key kKeys[] = {
    KVP_ENUM(policy, kPolicyNames),
    KVP_U32(capacity, 0, kMaxCapacity),
    KVP_ENUM(positions, kPositionNames),
    KVP_U32(threads, 1, kMaxThreads),
    KVP_ENUM(kv_dtype, kDtypeNames),
    KVP_ENUM(score, kScoreNames),
    KVP_U32(sinks, 0, kMaxCapacity),
    KVP_U32(window, 0, kMaxCapacity),
    KVP_U32(extra, 0, kMaxCapacity),
    KVP_U32(compress_every, 0, kMaxCapacity),
    KVP_U32(slack, 0, kMaxCapacity),
    KVP_U32(max_drop, 0, kMaxCapacity),
    KVP_U32(budget, 1, kMaxCapacity),
    KVP_U32(recent, 0, kMaxCapacity),
    KVP_U32(obs_window, 1, kMaxCapacity),
    KVP_U32(pool_kernel, 1, 255),
    KVP_ENUM(pool, kPoolNames),
    KVP_F32(beta, 1e-6, 1e6),
    KVP_F32(sparse_ratio, 1.0, 1e12),
    KVP_F32(recent_ratio, 0.0, 1.0),
    KVP_U32(segments, 2, 1u << 16),
    KVP_F32(decay, 0.0, 1.0),
    KVP_F32(lazy_threshold, 0.0, 1.0),
    KVP_U32(lazy_last, 1, kMaxCapacity),
    KVP_ENUM(lazy_mode, kLazyModeNames),
    KVP_ENUM(nonlazy, kPolicyNames),
    KVP_U32(asl_min_layer, 0, 0xffffffffu),
    KVP_U32(asl_obs_layers, 1, kMaxLayers),
    KVP_F32(asl_tau, 0.0, 1e6),
    KVP_F32(key_channel_ratio, 0.0, 0.999),
    KVP_F32(value_channel_ratio, 0.0, 0.999),
    KVP_ENUM(channel_score, kChannelScoreNames),
    KVP_U32(block, 1, kMaxBlock),
    KVP_U32(total_capacity, 0, 0xffffffffu),
    KVP_U32(evict_threshold, 0, kMaxCapacity),
    KVP_U32(prefill_stage, 0, kMaxCapacity),
};

#undef KVP_U32
#undef KVP_F32
#undef KVP_ENUM

// An enum field's value as stored. C callers may put any int there, and loading an enum with
// a value outside its enumerators is undefined in C++, so validation reads the raw bits.
template <class E>
uint32_t raw(const E &e) {
    static_assert(sizeof(E) == sizeof(uint32_t), "enums in kvp_config are int-sized");
    uint32_t v;
    memcpy(&v, &e, sizeof v);
    return v;
}

void store_uint(void *p, size_t size, uint32_t v) {
    if (size == 1) { uint8_t x = uint8_t(v); memcpy(p, &x, 1); }
    else if (size == 2) { uint16_t x = uint16_t(v); memcpy(p, &x, 2); }
    else { memcpy(p, &v, 4); }
}

bool token_eq(const char *a, size_t n, const char *b) { return strlen(b) == n && memcmp(a, b, n) == 0; }

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

kvp_status check_model(const kvp_model &md, Msg &m) {
    if (md.n_layers == 0 || md.n_layers > kMaxLayers) { m.s("n_layers must be in 1..").u(kMaxLayers); return KVP_ERR_CONFIG; }
    if (md.n_q_heads == 0 || md.n_q_heads > kMaxHeads) { m.s("n_q_heads must be in 1..").u(kMaxHeads); return KVP_ERR_CONFIG; }
    if (md.n_kv_heads == 0 || md.n_kv_heads > md.n_q_heads || md.n_q_heads % md.n_kv_heads != 0) {
        m.s("n_kv_heads=").u(md.n_kv_heads).s(" must divide n_q_heads=").u(md.n_q_heads);
        return KVP_ERR_CONFIG;
    }
    if (md.head_dim == 0 || md.head_dim > kMaxHeadDim) { m.s("head_dim must be in 1..").u(kMaxHeadDim); return KVP_ERR_CONFIG; }
    if (raw(md.rope) > KVP_ROPE_GPTJ) {
        m.s("rope style must be KVP_ROPE_NONE, KVP_ROPE_NEOX or KVP_ROPE_GPTJ");
        return KVP_ERR_CONFIG;
    }
    if (md.rope != KVP_ROPE_NONE) {
        uint32_t rd = md.rope_dim ? md.rope_dim : md.head_dim;
        if (rd % 2 != 0 || rd > md.head_dim) {
            m.s("rope_dim=").u(rd).s(" must be even and <= head_dim=").u(md.head_dim);
            return KVP_ERR_CONFIG;
        }
        if (!(md.rope_theta > 1.0f) || isinf(md.rope_theta)) {
            m.s("rope_theta must be finite and > 1");
            return KVP_ERR_CONFIG;
        }
    }
    return KVP_OK;
}

kvp_status apply_one(kvp_config *cfg, const char *key, size_t kn, const char *val, size_t vn, Msg &m) {
    for (const Key &k : kKeys) {
        if (!token_eq(key, kn, k.name)) continue;
        char *field = reinterpret_cast<char *>(cfg) + k.off;
        if (k.kind == kEnum) {
            for (uint32_t i = 0; k.names[i]; ++i) {
                if (token_eq(val, vn, k.names[i])) {
                    store_uint(field, k.size, i);
                    return KVP_OK;
                }
            }
            m.s(k.name).s("=").sn(val, vn).s(": expected one of");
            for (uint32_t i = 0; k.names[i]; ++i) m.s(i ? "|" : " ").s(k.names[i]);
            return KVP_ERR_CONFIG;
        }
        if (k.kind == kU32) {
            uint32_t v;
            if (!parse_u32(val, vn, &v)) { m.s(k.name).s("=").sn(val, vn).s(": not an unsigned integer"); return KVP_ERR_CONFIG; }
            if (double(v) < k.lo || double(v) > k.hi) {
                m.s(k.name).s("=").sn(val, vn).s(": out of range ").u(uint64_t(k.lo)).s("..").u(uint64_t(k.hi));
                return KVP_ERR_CONFIG;
            }
            store_uint(field, k.size, v);
            return KVP_OK;
        }
        double d;
        if (!parse_f64(val, vn, &d)) { m.s(k.name).s("=").sn(val, vn).s(": not a finite number"); return KVP_ERR_CONFIG; }
        if (!(d >= k.lo && d <= k.hi)) { m.s(k.name).s("=").sn(val, vn).s(": out of range"); return KVP_ERR_CONFIG; }
        float f = float(d);
        memcpy(field, &f, sizeof f);
        return KVP_OK;
    }
    m.s("unknown key '").sn(key, kn).s("'");
    return KVP_ERR_CONFIG;
}

kvp_status check_enums(const kvp_config &c, Msg &m) {
    const struct {
        const char *name;
        uint32_t value, max;
    } enums[] = {{"policy", raw(c.policy), KVP_POLICY_THINK},     {"positions", raw(c.positions), KVP_POS_REALIGN},
                 {"kv_dtype", raw(c.kv_dtype), KVP_DTYPE_Q4},      {"score", raw(c.score), KVP_SCORE_FIXED},
                 {"pool", raw(c.pool), KVP_POOL_MAX},              {"nonlazy", raw(c.nonlazy), KVP_POLICY_THINK},
                 {"lazy_mode", c.lazy_mode, 1},                    {"channel_score", c.channel_score, 2}};
    for (const auto &e : enums) {
        if (e.value > e.max) {
            m.s(e.name).s(": unknown value ").u(e.value);
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
    return KVP_OK;
}

}  // namespace

kvp_status config_default(kvp_config *cfg, const kvp_model *model, Msg &m) {
    if (!cfg || !model) { m.s("cfg and model must not be NULL"); return KVP_ERR_ARG; }
    kvp_status st = check_model(*model, m);
    if (st != KVP_OK) return st;
    kvp_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof(kvp_config);
    c.model = *model;
    c.policy = KVP_POLICY_FULL;
    c.capacity = 0;
    c.positions = KVP_POS_DEFAULT;
    c.threads = 1;
    c.kv_dtype = KVP_DTYPE_F32;
    c.score = KVP_SCORE_FLOAT;
    c.sinks = 4;
    c.window = 1020;
    c.extra = 0;
    c.compress_every = 1;
    c.slack = 0;
    c.max_drop = 0;
    c.budget = 1024;
    c.recent = 32;
    c.obs_window = 32;
    c.pool_kernel = 7;
    c.pool = KVP_POOL_MAX;
    c.beta = 20.0f;
    c.sparse_ratio = 400.0f;
    c.recent_ratio = 0.3f;
    c.segments = 10;
    c.decay = 0.9f;
    c.lazy_threshold = 0.9f;
    c.lazy_last = 1;
    c.lazy_mode = 0;
    c.nonlazy = KVP_POLICY_FULL;
    c.asl_min_layer = 0xffffffffu;
    c.asl_obs_layers = 8;
    c.asl_tau = 0.3f;
    c.key_channel_ratio = 0.5f;
    c.value_channel_ratio = 0.0f;
    c.channel_score = 0;
    c.block = 16;
    c.total_capacity = 0;
    c.evict_threshold = 0;
    c.prefill_stage = 0;
    *cfg = c;
    return KVP_OK;
}

kvp_status config_apply(kvp_config *cfg, const char *spec, Msg &m) {
    if (!cfg || !spec) { m.s("cfg and spec must not be NULL"); return KVP_ERR_ARG; }
    if (cfg->struct_size != sizeof(kvp_config)) {
        m.s("cfg->struct_size mismatch: initialise cfg with kvp_config_default");
        return KVP_ERR_ARG;
    }
    kvp_config tmp = *cfg;  // all-or-nothing
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == '\n') ++p;
        if (!*p) break;
        const char *tok = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n') ++p;
        size_t tn = size_t(p - tok);
        const char *eq = static_cast<const char *>(memchr(tok, '=', tn));
        if (!eq || eq == tok) {
            m.s("expected key=value, got '").sn(tok, tn).s("'");
            return KVP_ERR_CONFIG;
        }
        kvp_status st = apply_one(&tmp, tok, size_t(eq - tok), eq + 1, tn - size_t(eq - tok) - 1, m);
        if (st != KVP_OK) return st;
    }
    kvp_status st = check_enums(tmp, m);
    if (st != KVP_OK) return st;
    st = check_supported(tmp, m);
    if (st != KVP_OK) return st;
    if (!((kNonlazyAllowed >> raw(tmp.nonlazy)) & 1u)) {
        m.s("nonlazy must be full|snapkv|h2o");
        return KVP_ERR_CONFIG;
    }
    *cfg = tmp;
    return KVP_OK;
}

kvp_positions config_positions(const kvp_config &c) {
    if (c.positions != KVP_POS_DEFAULT) return c.positions;
    return policy_of(c).default_positions;
}

kvp_status config_check(const kvp_config &c, Msg &m) {
    if (c.struct_size != sizeof(kvp_config)) {
        m.s("cfg->struct_size=").u(c.struct_size).s(", expected ").u(sizeof(kvp_config)).s(": use kvp_config_default");
        return KVP_ERR_ARG;
    }
    kvp_status st = check_model(c.model, m);
    if (st != KVP_OK) return st;
    st = check_enums(c, m);
    if (st != KVP_OK) return st;
    if (c.threads == 0 || c.threads > kMaxThreads) { m.s("threads must be in 1..").u(kMaxThreads); return KVP_ERR_CONFIG; }
    if (c.capacity > kMaxCapacity) { m.s("capacity must be <= ").u(kMaxCapacity); return KVP_ERR_CONFIG; }
    st = check_supported(c, m);
    if (st != KVP_OK) return st;

    if (c.block == 0 || c.block > kMaxBlock) { m.s("block must be in 1..").u(kMaxBlock); return KVP_ERR_CONFIG; }
    const Policy &pol = policy_of(c);
    if (pol.check && (st = pol.check(c, m)) != KVP_OK) return st;
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

}  // namespace kvp
