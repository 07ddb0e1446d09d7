// Call sequences against a twin cache (targets.h). The input bytes drive every choice: the
// configuration (a row of kPolicies, geometry, positions, sharing, block, threads) and then
// one call after another. Inputs run out as zeros, so every byte string is a valid program.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "targets.h"

namespace kvpfuzz {

void violation(const char *target, const char *what) {
    fprintf(stderr, "kvpfuzz %s: invariant violated: %s\n", target, what);
    fflush(stderr);
    abort();
}

namespace {

struct Bytes {
    const uint8_t *p;
    size_t n, i = 0;
    uint8_t u8() { return i < n ? p[i++] : 0; }
    uint32_t u16() { return uint32_t(u8()) | uint32_t(u8()) << 8; }
    uint32_t pick(uint32_t k) { return k ? u8() % k : 0; }  // 0..k-1
    bool more() const { return i < n; }
};

// splitmix64: the values of q/k/v come from a seed the bytes choose (the bytes choose structure,
// not megabytes of floats).
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float unit() { return float(next() >> 40) / float(1ull << 24) * 2.0f - 1.0f; }
};

// ---- the policy table: one row per policy; rows of policies this build does not implement
// (kvp_config_apply says KVP_ERR_UNSUPPORTED) are skipped, so a new policy's row can land with
// the policy. Each row writes its keys (small values, so sequences reach prunes) into spec.
using SpecFn = void (*)(Bytes &b, std::string &spec);

std::string kv(const char *k, uint32_t v) { return std::string(" ") + k + "=" + std::to_string(v); }

void spec_full(Bytes &b, std::string &s) { s += kv("capacity", 1 + b.pick(96)); }
void spec_window(Bytes &b, std::string &s) {
    const uint32_t w = 1 + b.pick(40);
    s += kv("window", w);
    if (b.pick(2)) s += kv("capacity", w + 1 + b.pick(16));
}
void spec_streaming(Bytes &b, std::string &s) {
    const uint32_t S = b.pick(5), W = 1 + b.pick(40), B = b.pick(4), R = b.pick(9), sig = b.pick(9), d = b.pick(9);
    s += kv("sinks", S) + kv("window", W) + kv("extra", B) + kv("compress_every", R) + kv("slack", sig) + kv("max_drop", d);
    const uint32_t C = S + W + B, need = (C + R > C + sig) ? C + R : C + sig;
    if (b.pick(2)) s += kv("capacity", need + b.pick(16));
}
void spec_h2o_tokens(Bytes &b, std::string &s, bool ada) {
    const uint32_t budget = 1 + b.pick(48), recent = b.pick(budget + 1);
    const uint32_t ow = 1 + b.pick(12);  // odd: the last ow queries score (prompt_scores=window); even: every query
    s += kv("budget", budget) + kv("recent", recent) + (ow % 2 ? " prompt_scores=window" + kv("obs_window", ow) : std::string());
    if (b.pick(2)) s += kv("capacity", budget + 1 + b.pick(24));
    // policy=h2o: AdaKV's per-head budgets on a third of the budgets (no byte drawn, as snapkv's)
    if (ada && budget % 3 == 0) s += " head_budget=ada" + std::string(budget % 2 ? " ada_floor=0.5" : "");
}
void spec_h2o(Bytes &b, std::string &s) { spec_h2o_tokens(b, s, true); }
void spec_snapkv(Bytes &b, std::string &s) {
    const uint32_t budget = 2 + b.pick(48);
    s += kv("budget", budget) + kv("obs_window", 1 + b.pick(budget - 1)) + kv("pool_kernel", 1 + 2 * b.pick(4)) +
         (b.pick(2) ? " pool=avg" : " pool=max");
    if (b.pick(2)) s += kv("capacity", budget + 1 + b.pick(64));
    // issue 32 item 1: AdaKV's per-head budgets on a third of the budgets (no byte drawn: the
    // corpus keeps its meaning; with a quantized kv_dtype the config is rejected)
    if (budget % 3 == 0) s += " head_budget=ada" + std::string(budget % 2 ? " ada_floor=0.5" : "");
}
void spec_pyramidkv(Bytes &b, std::string &s) {
    spec_snapkv(b, s);
    s += kv("beta", 1 + b.pick(40));
}
// A byte drawn for a key no longer given (the corpus keeps its meaning).
std::string unused(uint32_t) { return ""; }

void spec_lethe(Bytes &b, std::string &s) {
    // (recent: lethe ignores it, and a spec giving policy= refuses a key its policy ignores, issue 28)
    s += kv("sinks", b.pick(4)) + unused(b.pick(8)) + kv("segments", 2 + b.pick(12)) +
         kv("sparse_ratio", 1 + b.pick(1000));
    const uint32_t sr = b.pick(10);
    s += std::string(" recent_ratio=0.") + std::to_string(sr) + " decay=0." + std::to_string(b.pick(10));
    if (b.pick(2)) s += kv("capacity", 16 + b.pick(96));
    // head_budget=ada on a third of the recent ratios (no byte drawn, as snapkv's and h2o's)
    if (sr % 3 == 0) s += " head_budget=ada" + std::string(sr % 2 ? " ada_floor=0.5" : "");
}

// ThinK over h2o (so a prefill always reads q: h2o observes), key and value channel ratios in
// tenths, each channel score.
void spec_think(Bytes &b, std::string &s) {
    s += " token_policy=h2o";
    spec_h2o_tokens(b, s, false);
    s += std::string(" key_channel_ratio=0.") + std::to_string(1 + b.pick(8));
    if (b.pick(2)) s += std::string(" value_channel_ratio=0.") + std::to_string(b.pick(9));
    static const char *scores[] = {"", " channel_score=l1", " channel_score=l2"};
    s += scores[b.pick(3)];
}

// SimLayerKV over each non-lazy policy: sinks + window below the layer capacity (else the
// config is refused, which only wastes the sequence); laziness by attention, by a forced mask,
// decided at prefill or at the first decode.
void spec_simlayerkv(Bytes &b, std::string &s) {
    const uint32_t S = b.pick(4), W = 1 + b.pick(20), cap = S + W + 1 + b.pick(48);
    switch (b.pick(3)) {
        case 0: s += " nonlazy=full" + kv("capacity", cap); break;
        case 1: s += " nonlazy=h2o" + kv("budget", cap - 1) + kv("recent", b.pick(4)) + kv("capacity", cap); break;
        default:
            s += " nonlazy=snapkv" + kv("budget", cap - 1) + kv("obs_window", 1 + b.pick(8)) + kv("capacity", cap + b.pick(16));
            break;
    }
    s += kv("sinks", S) + kv("window", W) + kv("lazy_last", 1 + b.pick(16));
    s += std::string(" lazy_threshold=0.") + std::to_string(1 + b.pick(9));
    if (b.pick(2)) s += " lazy_mode=decode";
    if (b.pick(3) == 0) s += kv("lazy_force", b.pick(8));
}
// ASL: small budgets and rank windows so that prompts of a few dozen tokens can select; the
// prefill passes a kvp_selection (Sequence::selections), as ASL requires where it may select.
void spec_asl(Bytes &b, std::string &s) {
    const uint32_t budget = 2 + b.pick(24);
    s += kv("budget", budget) + kv("obs_window", 1 + b.pick(budget - 1)) + kv("asl_obs_layers", 1 + b.pick(3)) +
         kv("asl_min_layer", b.pick(2)) + std::string(" asl_tau=") + (b.pick(2) ? "1e6" : "0.3");
    if (b.pick(2)) s += kv("capacity", budget + 1 + b.pick(32));
}

// The random baseline (issue 32): either mode; keep_prompt=1 needs room for the prompt.
void spec_random(Bytes &b, std::string &s) {
    const uint32_t budget = 1 + b.pick(40), keep = b.pick(2);
    s += kv("budget", budget) + kv("keep_prompt", keep) + kv("seed", b.pick(1000));
    if (keep) s += kv("capacity", budget + 17 + b.pick(64));
    else if (b.pick(2)) s += kv("capacity", budget + 1 + b.pick(24));
}

// TriAttention (issue 32): the prompt is kept; generated tokens cut back to budget every beta.
void spec_triattention(Bytes &b, std::string &s) {
    const uint32_t budget = 1 + b.pick(24), beta = 1 + b.pick(12), mode = b.pick(3);
    static const char *modes[] = {"union", "per_head", "per_layer_perhead"};
    s += kv("budget", budget) + kv("beta", beta) + " tri_mode=" + modes[mode];
    if (b.pick(2)) s += kv("capacity", budget + beta + 17 + b.pick(64));
    // head_budget=ada (per_layer_perhead only) on a third of the budgets (no byte drawn)
    if (mode == 2 && budget % 3 == 0) s += " head_budget=ada" + std::string(beta % 2 ? " ada_floor=0.5" : "");
}

struct PolicyRow {
    const char *name;
    SpecFn spec;
    bool evicts;   // a decode never answers KVP_ERR_FULL (the policy makes room)
    bool observes; // a prefill reads q even without out (scores from the chunk's last queries);
                   // not simlayerkv: lazy_mode=decode over full, or a layer already lazy, reads none
};
const PolicyRow kPolicies[] = {
    {"full", spec_full, false, false},         {"window", spec_window, true, false},
    {"streaming", spec_streaming, true, false}, {"h2o", spec_h2o, true, true},
    {"snapkv", spec_snapkv, false, true},       {"pyramidkv", spec_pyramidkv, false, true},
    {"lethe", spec_lethe, true, true},          {"think", spec_think, true, true},
    {"simlayerkv", spec_simlayerkv, false, false}, {"asl", spec_asl, false, true},
    {"random", spec_random, false, false},  // keep_prompt=1 answers FULL once the prompt fills it
    {"triattention", spec_triattention, false, false},  // answers FULL once the prompt fills it
};
constexpr uint32_t kNumRows = sizeof kPolicies / sizeof kPolicies[0];

// The rows this build implements (asked once).
struct Implemented {
    uint32_t rows[kNumRows];
    uint32_t n = 0;
    Implemented() {
        const kvp_model m = {1, 1, 1, 8, KVP_ROPE_NONE, 0, 10000.0f};
        for (uint32_t i = 0; i < kNumRows; ++i) {
            kvp_config c;
            kvp_config_default(&c, &m);
            const std::string s = std::string("policy=") + kPolicies[i].name;
            if (kvp_config_apply(&c, s.c_str(), nullptr, 0) != KVP_ERR_UNSUPPORTED) rows[n++] = i;
        }
    }
};
const Implemented &implemented() {
    static const Implemented im;
    return im;
}

// The sequence's config, named in a violation's message (what to reproduce it with).
thread_local std::string g_spec;
[[noreturn]] void fail(const std::string &what) { violation("calls", (what + " [config: " + g_spec + "]").c_str()); }
#define KVPF_CHECK KVPFUZZ_CHECK

// A host's parallel-for that runs every task on the calling thread, the last t first.
void host_in_a_row(void *, uint32_t n, void (*task)(void *, uint32_t), void *arg) {
    KVPF_CHECK(n == 2, "kvp_parallel_fn called with n=%u on a 2-thread cache", n);
    for (uint32_t t = n; t-- > 0;) task(arg, t);
}



// What we observe of a cache: per layer its length, capacity and per head positions; counters.
struct View {
    std::vector<int64_t> v;
    bool operator==(const View &o) const { return v == o.v; }
};

// Tokens an open prompt may hold beyond a layer's capacity (config max_prompt of the sequence).
thread_local uint32_t g_prompt_room = 0;
// What a streaming head of a DuoAttention role table holds between calls (duo_sink + duo_window;
// 0 without a table): it may exceed a small policy capacity (kvprune.h "DuoAttention heads").
thread_local uint32_t g_duo_hold = 0;
// Heads that lend (head_budget=ada, more than one KV head): one head may hold up to twice the
// layer's capacity (kvprune.h kvp_layer_capacity).
thread_local uint32_t g_lend = 1;

View observe(kvp_cache *c, const kvp_model &m, const char *who) {
    View w;
    kvp_stats st;
    st.struct_size = sizeof st;
    KVPF_CHECK(kvp_get_stats(c, &st) == KVP_OK, "%s: kvp_get_stats: %s", who, kvp_last_error(c));
    KVPF_CHECK(st.live_bytes <= st.arena_bytes, "%s: live_bytes %llu > arena_bytes %llu", who,
               (unsigned long long)st.live_bytes, (unsigned long long)st.arena_bytes);
    KVPF_CHECK(st.peak_live_bytes >= st.live_bytes, "%s: peak below live", who);
    w.v = {int64_t(st.live_bytes), int64_t(st.peak_live_bytes), int64_t(st.tokens_seen), int64_t(st.prune_events),
           int64_t(st.tokens_evicted)};
    uint64_t live = 0, pe = 0, te = 0;
    std::vector<int32_t> pos(4096);
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        const uint32_t len = kvp_layer_len(c, l), cap = kvp_layer_capacity(c, l);
        KVPF_CHECK(uint64_t(len) <= uint64_t(cap) * g_lend + g_prompt_room || len <= g_duo_hold,
                   "%s: layer %u len %u > capacity %u (x %u where heads lend) + max_prompt %u (streaming heads: %u)", who, l, len,
                   cap, g_lend, g_prompt_room, g_duo_hold);
        kvp_layer_stats ls;
        ls.struct_size = sizeof ls;
        KVPF_CHECK(kvp_get_layer_stats(c, l, &ls) == KVP_OK, "%s: layer stats", who);
        KVPF_CHECK(ls.len == len && ls.capacity == cap, "%s: layer stats len/cap", who);
        KVPF_CHECK(isfinite(ls.sparsity) && ls.sparsity >= 0.0f && ls.sparsity <= 1.0f, "%s: sparsity %g", who,
                   double(ls.sparsity));
        live += ls.live_bytes;
        pe += ls.prune_events;
        te += ls.tokens_evicted;
        w.v.insert(w.v.end(), {int64_t(len), int64_t(cap), int64_t(ls.live_bytes), int64_t(ls.prune_events),
                               int64_t(ls.tokens_evicted), int64_t(ls.evict_threshold), int64_t(ls.lazy)});
        uint32_t maxlen = 0;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            uint32_t n = 0;
            const kvp_status s0 = kvp_layer_positions(c, l, h, nullptr, 0, &n);
            KVPF_CHECK((n == 0 && s0 == KVP_OK) || (n > 0 && s0 == KVP_ERR_BUFFER), "%s: positions with cap 0: %d", who,
                       int(s0));
            KVPF_CHECK(n <= pos.size(), "%s: %u positions", who, n);
            KVPF_CHECK(kvp_layer_positions(c, l, h, pos.data(), uint32_t(pos.size()), &n) == KVP_OK, "%s: positions", who);
            if (n > maxlen) maxlen = n;
            w.v.push_back(n);
            for (uint32_t i = 0; i < n; ++i) {
                KVPF_CHECK(pos[i] >= 0 && (i == 0 || pos[i] > pos[i - 1]), "%s: positions not ascending", who);
                w.v.push_back(pos[i]);
            }
        }
        KVPF_CHECK(maxlen == len, "%s: layer_len %u is not the max over heads %u", who, len, maxlen);
    }
    KVPF_CHECK(live == st.live_bytes && pe == st.prune_events && te == st.tokens_evicted,
               "%s: layer stats do not sum to the cache's", who);
    return w;
}

// Sliding-window layers (src/sliding.h's rule, restated): local unless the pattern makes it global.
bool layer_is_local(const kvp_config &c, uint32_t layer) {
    return c.sliding_window > 0 && (c.sliding_pattern == 0 || (layer + 1) % c.sliding_pattern != 0);
}

// One defect injected into an otherwise valid call, and the status it must give.
enum Defect { kNone, kBadLayer, kNanQ, kInfK, kHugeV, kNullK, kZeroN, kBackwards, kAliasOut, kNumDefects };

struct Sequence {
    Sequence(Bytes bytes, CallStats *st) : b(bytes), stats(st) {}
    Bytes b;
    CallStats *stats;
    kvp_model m{};
    kvp_config cfg{};
    uint32_t row = 0;
    kvp_cache *a = nullptr, *t = nullptr;  // the cache under attack, its twin
    std::vector<int64_t> last_pos;        // per layer: last position appended (-1: none)
    uint64_t seen0 = 0;                   // tokens appended to layer 0
    std::vector<float> q, k, v, oa, ot;
    std::vector<uint16_t> hq, hk, hv, ho;  // a half call's rows (kvp_*_ex with KVP_IO_F16)
    std::vector<int32_t> pos;
    std::vector<int32_t> sel_a, sel_t;  // kvp_selection indices of the cache and of the twin
    kvp_selection sa{}, st_{};

    // Selections of capacity n for a prefill of n tokens (every policy takes one; ASL needs it).
    void selections(uint32_t n) {
        sel_a.assign(n ? n : 1, -1);
        sel_t.assign(n ? n : 1, -1);
        sa = kvp_selection{};
        st_ = kvp_selection{};
        sa.struct_size = st_.struct_size = sizeof(kvp_selection);
        sa.capacity = st_.capacity = n;
        sa.indices = sel_a.data();
        st_.indices = sel_t.data();
    }
    // The twin made the same selection.
    void compare_selections(const char *what) {
        KVPF_CHECK(sa.selected == st_.selected && sa.n == st_.n, "%s: selection differs from the twin", what);
        KVPF_CHECK(!sa.selected || sa.n <= sa.capacity, "%s: selection of %u entries in a buffer of %u", what, sa.n,
                   sa.capacity);
        if (!sa.selected) return;
        if (stats) ++stats->selections;
        for (uint32_t i = 0; i < sa.n; ++i)
            KVPF_CHECK(sel_a[i] == sel_t[i] && (i == 0 || sel_a[i] > sel_a[i - 1]), "%s: selection entry %u", what, i);
    }

    void fill(uint32_t n, uint64_t seed, float scale, bool with_q) {
        const size_t nq = size_t(n) * m.n_q_heads * m.head_dim, nkv = size_t(n) * m.n_kv_heads * m.head_dim;
        q.assign(nq + 8, 0.0f);
        k.assign(nkv + 8, 0.0f);
        v.assign(nkv + 8, 0.0f);
        oa.assign(nq + 8, 0.0f);
        ot.assign(nq + 8, 0.0f);
        Rng r{seed};
        if (with_q)
            for (size_t i = 0; i < nq; ++i) q[i] = r.unit() * scale;
        for (size_t i = 0; i < nkv; ++i) k[i] = r.unit() * scale;
        for (size_t i = 0; i < nkv; ++i) v[i] = r.unit() * scale;
    }

    // Positions for n tokens after layer l's last (gaps from the bytes), or NULL.
    const int32_t *positions(uint32_t l, uint32_t n, bool given) {
        if (!given) return nullptr;
        pos.resize(n);
        int64_t p = last_pos[l] + 1 + b.pick(3);
        for (uint32_t i = 0; i < n; ++i) {
            pos[i] = int32_t(p);
            p += 1 + b.pick(3);
        }
        return pos.data();
    }

    bool setup() {
        const Implemented &im = implemented();
        row = im.rows[b.pick(im.n)];
        const uint32_t nkv = 1 + b.pick(2), group = 1 + b.pick(3);
        static const uint32_t dims[] = {4, 8, 16, 20, 32};
        const uint32_t hd = dims[b.pick(5)];
        const kvp_rope_style rope = kvp_rope_style(b.pick(3));
        m = kvp_model{1 + b.pick(3), nkv * group, nkv, hd, rope, 0, 10000.0f};
        if (rope != KVP_ROPE_NONE && b.pick(4) == 0) m.rope_dim = hd / 2 - (hd / 2) % 2;
        if (kvp_config_default(&cfg, &m) != KVP_OK) fail("kvp_config_default on a valid model");
        std::string spec = std::string("policy=") + kPolicies[row].name;
        kPolicies[row].spec(b, spec);
        static const char *pos_modes[] = {"", " positions=original", " positions=realign"};
        spec += pos_modes[b.pick(3)];
        static const uint32_t blocks[] = {16, 1, 2, 4, 7, 16, 64};
        spec += kv("block", blocks[b.pick(7)]);
        // Storage formats and fixed-point scoring (configs a policy refuses count as rejected).
        static const char *dtypes[] = {"", "", "", " kv_dtype=f16", " kv_dtype=q8", " kv_dtype=q4"};
        spec += dtypes[b.pick(6)];
        if (b.pick(4) == 0) spec += kv("quant_group", 1 + b.pick(40));
        if (b.pick(4) == 0) spec += " score=fixed";
        char err[320];
        g_spec = spec;
        if (kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
            if (stats) ++stats->configs_rejected;
            return false;
        }
        // A shared pool: total_capacity below the sum of capacities (a fraction the bytes pick).
        if (b.pick(3) == 0) {
            uint64_t sum = 0;
            kvp_cache *probe = nullptr;
            Arena pa(kvp_arena_size(&cfg));
            if (kvp_create(&cfg, pa.p, kvp_arena_size(&cfg), &probe) == KVP_OK) {
                for (uint32_t l = 0; l < m.n_layers; ++l) sum += kvp_layer_capacity(probe, l);
                kvp_destroy(probe);
            }
            const uint32_t frac = 1 + b.pick(8);  // eighths of the sum
            const std::string tc = kv("total_capacity", uint32_t(sum * frac / 8 + b.pick(8)));
            if (kvp_config_apply(&cfg, tc.c_str(), err, sizeof err) != KVP_OK && stats) ++stats->configs_rejected;
        }
        if (stats) ++stats->policy_runs[row];
        return true;
    }

    // Runs the same call on the twin after it succeeded on the cache, and compares outputs.
    void compare_outputs(size_t n_out, const char *what) {
        for (size_t i = 0; i < n_out; ++i) {
            KVPF_CHECK(isfinite(oa[i]), "%s: output %zu is %g", what, i, double(oa[i]));
            KVPF_CHECK(memcmp(&oa[i], &ot[i], 4) == 0, "%s: output %zu differs from the twin (%g vs %g)", what, i,
                       double(oa[i]), double(ot[i]));
        }
    }

    void expect_status(kvp_status st, Defect d, const char *what) {
        static const kvp_status want[kNumDefects] = {KVP_OK,  KVP_ERR_LAYER, KVP_ERR_NONFINITE, KVP_ERR_NONFINITE,
                                                     KVP_ERR_NONFINITE, KVP_ERR_ARG, KVP_ERR_ARG, KVP_ERR_ARG,
                                                     KVP_ERR_ARG};
        if (d != kNone) {
            // The room is checked before positions, q, k, v and out are read (issue 22 defect 2):
            // a call with one of those defects into a layer without room is KVP_ERR_FULL.
            const bool reads_inputs = d == kNanQ || d == kInfK || d == kHugeV || d == kBackwards || d == kAliasOut;
            KVPF_CHECK(st == want[d] || (reads_inputs && st == KVP_ERR_FULL), "%s with defect %d: status %d, want %d (%s)",
                       what, int(d), int(st), int(want[d]), kvp_last_error(a));
        } else {
            KVPF_CHECK(st == KVP_OK || st == KVP_ERR_FULL, "%s: valid call failed with %d (%s)", what, int(st),
                       kvp_last_error(a));
        }
        if (st != KVP_OK) {
            const char *e = kvp_last_error(a);
            const char *s = kvp_status_str(st);
            KVPF_CHECK(strncmp(e, s, strlen(s)) == 0, "%s: message '%s' does not start with '%s'", what, e, s);
        }
    }

    // IEEE binary16 <-> float for the half calls (the twin gets the widened values).
    static float f16_value(uint16_t h) {
        const int e = (h >> 10) & 31, mant = h & 1023;
        const float sgn = (h & 0x8000) ? -1.0f : 1.0f;
        if (e == 31) return mant ? NAN : sgn * INFINITY;
        return sgn * (e ? ldexpf(float(1024 + mant), e - 25) : ldexpf(float(mant), -24));
    }
    static uint16_t f16_bits(float x) {  // to nearest, ties to even
        if (x != x) return 0x7e00;
        const uint16_t sgn = signbit(x) ? 0x8000 : 0;
        const double a = fabs(double(x));
        if (a >= 65520.0) return uint16_t(sgn | 0x7c00);
        int e;
        frexp(a, &e);
        const int ue = e - 1 < -14 ? -14 : e - 1;
        const double r = nearbyint(a / ldexp(1.0, ue - 10)) * ldexp(1.0, ue - 10);
        if (r < ldexp(1.0, -14)) return uint16_t(sgn | uint16_t(r / ldexp(1.0, -24)));
        const double fr = frexp(r, &e);
        return uint16_t(sgn | uint16_t((e + 14) << 10) | uint16_t(ldexp(fr, 11) - 1024.0));
    }
    // Half copies of the call's rows; the float rows become their widened values (the twin's input).
    void to_half(size_t nq, size_t nkv) {
        hq.assign(q.size(), 0);
        hk.assign(k.size(), 0);
        hv.assign(v.size(), 0);
        ho.assign(oa.size(), 0);
        for (size_t i = 0; i < nq; ++i) q[i] = f16_value(hq[i] = f16_bits(q[i]));
        for (size_t i = 0; i < nkv; ++i) k[i] = f16_value(hk[i] = f16_bits(k[i]));
        for (size_t i = 0; i < nkv; ++i) v[i] = f16_value(hv[i] = f16_bits(v[i]));
    }

    // decode / prefill / append with an optional defect; one call in four through the half calls
    // (kvp_*_ex, f16) on the cache, the twin taking the widened values through the f32 calls.
    void token_call(int kind) {
        const uint32_t L = m.n_layers;
        const Defect d = b.pick(3) == 0 ? Defect(1 + b.pick(kNumDefects - 1)) : kNone;
        uint32_t layer = b.pick(L);
        uint32_t n = kind == 0 ? 1 : 1 + b.pick(b.pick(4) == 0 ? 200 : 24);
        const bool given = kind != 0 && b.pick(2);
        const bool with_out = kind == 1 ? b.pick(4) != 0 : kind == 0;
        const bool with_q = kind == 0 || (kind == 1 && (with_out || b.pick(2)));
        static const float scales[] = {1.0f, 1.0f, 0.01f, 30.0f, 1e6f, 3e16f};
        const bool half = b.pick(4) == 0;
        // f16 tops out at 65504: larger scales would make the defect-free rows Inf
        fill(n, (uint64_t(b.u16()) << 16) | b.u8(), scales[half ? b.pick(4) : b.pick(6)], with_q);
        const int32_t *p = positions(layer, n, given);
        const size_t nq = size_t(n) * m.n_q_heads * m.head_dim, nkv = size_t(n) * m.n_kv_heads * m.head_dim;
        const float *qa = with_q ? q.data() : nullptr, *ka = k.data(), *va = v.data();
        float *out = with_out ? oa.data() : nullptr;
        uint32_t na = n, la = layer;
        const int32_t *pa = p;
        std::vector<int32_t> back;
        switch (d) {
            case kNone: break;
            case kBadLayer: la = L + b.pick(3); break;
            case kNanQ:
                // q not read, so not checked: no output and no policy observing it (a
                // sliding-window local layer runs no policy)
                if (!qa || (!out && (!kPolicies[row].observes || layer_is_local(cfg, layer)))) return;
                q[b.u16() % nq] = NAN;
                break;
            case kInfK: k[b.u16() % nkv] = -INFINITY; break;
            case kHugeV: v[b.u16() % nkv] = b.pick(2) ? 1e19f : -float(KVP_INPUT_LIMIT); break;
            case kNullK: ka = nullptr; break;
            case kZeroN:
                if (kind == 0) return;
                na = 0;
                break;
            case kBackwards:
                if (kind == 0) return;
                back.assign(n, 0);  // not after the layer's last position, or negative
                back[0] = last_pos[layer] >= 0 ? int32_t(last_pos[layer]) - int32_t(b.pick(2)) : -1 - int32_t(b.pick(5));
                for (uint32_t i = 1; i < n; ++i) back[i] = back[i - 1] + 1;
                pa = back.data();
                break;
            case kAliasOut:
                if (!out || !qa) return;
                out = b.pick(2) ? q.data() : k.data();
                break;
            default: break;
        }
        if (half) to_half(nq, nkv);
        const void *hqa = qa ? hq.data() : nullptr, *hka = ka ? hk.data() : nullptr;
        void *hout = !out ? nullptr : out == q.data() ? static_cast<void *>(hq.data())
                                   : out == k.data() ? static_cast<void *>(hk.data()) : ho.data();
        if (stats) {
            ++stats->calls;
            if (d != kNone) ++stats->bad_inputs;
        }
        const View before = observe(a, m, "before");
        kvp_status st;
        const char *what = kind == 0 ? "decode" : kind == 1 ? "prefill" : "append";
        if (half) {
            if (kind == 0) st = kvp_decode_ex(a, la, KVP_IO_F16, hqa, hka, hv.data(), hout);
            else if (kind == 1) {
                selections(n);
                st = kvp_prefill_ex(a, la, na, pa, KVP_IO_F16, hqa, hka, hv.data(), hout, &sa);
            } else {
                st = kvp_append_ex(a, la, na, pa, KVP_IO_F16, hka, hv.data());
            }
        } else if (kind == 0) st = kvp_decode(a, la, qa, ka, va, out);
        else if (kind == 1) {
            selections(n);
            st = kvp_prefill(a, la, na, pa, qa, ka, va, out, &sa);
        } else {
            st = kvp_append(a, la, na, pa, ka, va);
        }
        expect_status(st, d, what);
        const bool evicts = kPolicies[row].evicts && !(cfg.policy == KVP_POLICY_STREAMING && cfg.compress_every == 0);
        if (kind == 0 && d == kNone && evicts)
            KVPF_CHECK(st == KVP_OK, "decode under %s answered %d (%s)", kPolicies[row].name, int(st), kvp_last_error(a));
        if (st != KVP_OK) {
            if (stats) ++stats->calls_failed;
            KVPF_CHECK(observe(a, m, "after a failed call") == before, "a failed %s (status %d) changed the cache", what,
                       int(st));
            return;
        }
        if (stats) ++stats->calls_ok;
        kvp_status st2;
        float *out_t = with_out ? ot.data() : nullptr;
        if (kind == 0) st2 = kvp_decode(t, layer, qa, ka, va, out_t);
        else if (kind == 1) st2 = kvp_prefill(t, layer, n, p, qa, ka, va, out_t, &st_);
        else st2 = kvp_append(t, layer, n, p, ka, va);
        KVPF_CHECK(st2 == KVP_OK, "the twin refused a %s the cache took: %d (%s)", what, int(st2), kvp_last_error(t));
        if (kind == 1) compare_selections(what);
        if (with_out && half) {
            if (stats) ++stats->half_calls;
            for (size_t i = 0; i < nq; ++i)
                KVPF_CHECK(ho[i] == f16_bits(ot[i]), "%s (f16): output %zu is %04x, the twin's %g rounds to %04x", what, i,
                           unsigned(ho[i]), double(ot[i]), unsigned(f16_bits(ot[i])));
        } else if (with_out) {
            compare_outputs(nq, what);
        }
        last_pos[layer] = p ? p[n - 1] : last_pos[layer] + n;
        if (layer == 0) seen0 += n;
        KVPF_CHECK(observe(a, m, "cache") == observe(t, m, "twin"), "cache and twin differ after a %s", what);
    }

    // kvp_prefill_room tokens go into every layer in turn (the header's promise).
    void room_call() {
        const uint32_t r = kvp_prefill_room(a);
        KVPF_CHECK(r == kvp_prefill_room(t), "prefill_room differs from the twin");
        if (r == 0 || r > 600) return;
        const uint32_t n = r > 64 && b.pick(2) ? 1 + b.pick(64) : r;
        fill(n, b.u16(), 1.0f, true);
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            const bool out = b.pick(2);
            selections(n);
            kvp_status s1 = kvp_prefill(a, l, n, nullptr, q.data(), k.data(), v.data(), out ? oa.data() : nullptr, &sa);
            KVPF_CHECK(s1 == KVP_OK, "prefill of kvp_prefill_room()=%u (n=%u) tokens into layer %u failed: %s", r, n, l,
                       kvp_last_error(a));
            kvp_status s2 = kvp_prefill(t, l, n, nullptr, q.data(), k.data(), v.data(), out ? ot.data() : nullptr, &st_);
            KVPF_CHECK(s2 == KVP_OK, "twin prefill failed");
            compare_selections("room prefill");
            if (out) compare_outputs(size_t(n) * m.n_q_heads * m.head_dim, "room prefill");
            last_pos[l] += n;
            if (l == 0) seen0 += n;
            if (stats) stats->calls += 2, stats->calls_ok += 2;
        }
        if (r % 3 == 0) {  // max_prompt: the prompt ends here (nothing happens without an open one)
            KVPF_CHECK(kvp_prompt_end(a) == KVP_OK && kvp_prompt_end(t) == KVP_OK, "prompt_end: %s", kvp_last_error(a));
            KVPF_CHECK(observe(a, m, "cache") == observe(t, m, "twin"), "cache and twin differ after kvp_prompt_end");
        }
    }

    void misc_call() {
        if (stats) ++stats->calls;
        switch (b.pick(6)) {
            case 0: {  // reset both
                KVPF_CHECK(kvp_reset(a) == KVP_OK && kvp_reset(t) == KVP_OK, "reset");
                for (int64_t &x : last_pos) x = -1;
                seen0 = 0;
                break;
            }
            case 1: {  // positions with a short buffer / bad head
                uint32_t n = 99;
                int32_t buf[4];
                const uint32_t l = b.pick(m.n_layers + 1), h = b.pick(m.n_kv_heads + 1);
                const View before = observe(a, m, "before");
                const kvp_status st = kvp_layer_positions(a, l, h, buf, b.pick(5), &n);
                if (l >= m.n_layers || h >= m.n_kv_heads) KVPF_CHECK(st == KVP_ERR_LAYER, "positions of a bad layer/head");
                else KVPF_CHECK(st == KVP_OK || (st == KVP_ERR_BUFFER && n > 0), "positions: %d", int(st));
                KVPF_CHECK(observe(a, m, "after positions") == before, "kvp_layer_positions changed the cache");
                break;
            }
            case 2: {  // stats with bad sizes
                kvp_stats s;
                s.struct_size = b.pick(2) ? 4 : uint32_t(sizeof s) + 4;
                KVPF_CHECK(kvp_get_stats(a, &s) == KVP_ERR_ARG, "stats with a bad struct_size");
                kvp_layer_stats ls;
                ls.struct_size = sizeof ls;
                KVPF_CHECK(kvp_get_layer_stats(a, m.n_layers, &ls) == KVP_ERR_LAYER, "layer stats of a bad layer");
                break;
            }
            case 3: {  // tokens_seen is exact
                kvp_stats s;
                s.struct_size = sizeof s;
                KVPF_CHECK(kvp_get_stats(a, &s) == KVP_OK && s.tokens_seen == seen0, "tokens_seen %llu, fed %llu",
                           (unsigned long long)s.tokens_seen, (unsigned long long)seen0);
                break;
            }
            case 5: draft_call(); break;
            default: room_call(); break;
        }
    }

    // Speculative decoding (kvp_draft_begin/commit, max_draft=kMaxDraft): bad-order calls change
    // nothing; draft prefills/decodes change nothing kept; after a commit of `acc` tokens the cache
    // equals the twin after a prefill of those tokens per layer.
    static constexpr uint32_t kMaxDraft = 4;
    void draft_call() {
        const uint32_t L = m.n_layers;
        // An open prompt (max_prompt) would end at kvp_draft_begin: end it on both first, so the
        // draft's own calls are what is compared below (tests/test_prompt.cpp covers that end).
        KVPF_CHECK(kvp_prompt_end(a) == KVP_OK && kvp_prompt_end(t) == KVP_OK, "prompt_end: %s", kvp_last_error(a));
        const View before = observe(a, m, "before a draft");
        auto unchanged = [&](kvp_status st, kvp_status want, const char *what) {
            KVPF_CHECK(st == want, "%s: status %d, want %d (%s)", what, int(st), int(want), kvp_last_error(a));
            const char *e = kvp_last_error(a), *s0 = kvp_status_str(st);
            KVPF_CHECK(strncmp(e, s0, strlen(s0)) == 0, "%s: message '%s'", what, e);
            KVPF_CHECK(observe(a, m, what) == before, "%s changed the cache", what);
        };
        if (b.pick(3) == 0) unchanged(kvp_draft_commit(a, b.pick(3)), KVP_ERR_STATE, "commit without begin");
        KVPF_CHECK(kvp_draft_begin(a) == KVP_OK, "draft_begin: %s", kvp_last_error(a));
        if (b.pick(4) == 0) unchanged(kvp_draft_begin(a), KVP_ERR_STATE, "begin twice");
        std::vector<std::vector<float>> dq(L), dk(L), dv(L);
        std::vector<uint32_t> nd(L, 0);
        const size_t rq = size_t(m.n_q_heads) * m.head_dim, rkv = size_t(m.n_kv_heads) * m.head_dim;
        for (uint32_t round = 0, rounds = 1 + b.pick(4); round < rounds; ++round) {
            const bool by_decode = b.pick(2);
            const uint32_t n = by_decode ? 1 : 1 + b.pick(kMaxDraft + 1);  // up to one more than fits
            fill(n, b.u16(), 1.0f, true);
            for (uint32_t l = 0; l < L; ++l) {
                const bool with_out = by_decode || b.pick(2);
                kvp_status st = by_decode ? kvp_decode(a, l, q.data(), k.data(), v.data(), oa.data())
                                          : kvp_prefill(a, l, n, nullptr, q.data(), k.data(), v.data(),
                                                        with_out ? oa.data() : nullptr, nullptr);
                if (stats) ++stats->calls;
                if (st != KVP_OK) {
                    KVPF_CHECK(st == KVP_ERR_FULL || st == KVP_ERR_UNSUPPORTED, "draft call: status %d (%s)", int(st),
                               kvp_last_error(a));
                    if (stats) ++stats->calls_failed;
                } else {
                    if (stats) ++stats->calls_ok;
                    if (with_out)
                        for (size_t i = 0; i < size_t(n) * rq; ++i)
                            KVPF_CHECK(isfinite(oa[i]), "draft output %zu is %g", i, double(oa[i]));
                    dq[l].insert(dq[l].end(), q.begin(), q.begin() + long(n * rq));
                    dk[l].insert(dk[l].end(), k.begin(), k.begin() + long(n * rkv));
                    dv[l].insert(dv[l].end(), v.begin(), v.begin() + long(n * rkv));
                    nd[l] += n;
                    KVPF_CHECK(nd[l] <= kMaxDraft, "layer %u took %u draft tokens, max_draft=%u", l, nd[l], kMaxDraft);
                }
                KVPF_CHECK(observe(a, m, "during a draft") == before, "a draft call changed the kept state");
            }
        }
        if (b.pick(2) == 0) unchanged(kvp_append(a, 0, 1, nullptr, k.data(), v.data()), KVP_ERR_STATE, "append in a draft");
        uint32_t lo = kMaxDraft;
        for (uint32_t l = 0; l < L; ++l) lo = nd[l] < lo ? nd[l] : lo;
        if (b.pick(3) == 0) unchanged(kvp_draft_commit(a, lo + 1 + b.pick(3)), KVP_ERR_ARG, "accepted above drafted");
        uint32_t acc = b.pick(lo + 1);
        kvp_status st = kvp_draft_commit(a, acc);
        if (st == KVP_ERR_FULL) {  // a shared pool that cannot take acc tokens in every layer in turn
            unchanged(st, KVP_ERR_FULL, "commit refused");
            acc = 0;
            st = kvp_draft_commit(a, 0);
        }
        KVPF_CHECK(st == KVP_OK, "commit %u: %s", acc, kvp_last_error(a));
        if (stats) ++stats->drafts, stats->drafts_accepted += acc > 0;
        for (uint32_t l = 0; l < L && acc; ++l) {
            const kvp_status s2 =
                kvp_prefill(t, l, acc, nullptr, dq[l].data(), dk[l].data(), dv[l].data(), nullptr, nullptr);
            KVPF_CHECK(s2 == KVP_OK, "the twin refused the accepted %u tokens of layer %u: %s", acc, l, kvp_last_error(t));
            last_pos[l] += acc;
            if (l == 0) seen0 += acc;
        }
        // max_prompt: the commit's prefill went through a prompt that the commit ended
        KVPF_CHECK(kvp_prompt_end(t) == KVP_OK, "twin prompt_end: %s", kvp_last_error(t));
        KVPF_CHECK(observe(a, m, "cache") == observe(t, m, "twin"), "cache and twin differ after a commit of %u", acc);
    }

    void run() {
        if (!setup()) return;
        if (stats) ++stats->sequences;
        cfg.max_draft = kMaxDraft;  // draft_call (no byte spent: the corpus keeps its meaning)
        // Issue 28: a capacity holds the draft room too (a given one: add it where it lacks it),
        // and a total_capacity drawn for the capacities without drafts grows by the room per layer.
        if (cfg.capacity && kvp_config_check(&cfg, nullptr, 0) != KVP_OK) cfg.capacity += kMaxDraft - 1;
        if (cfg.total_capacity && kvp_config_check(&cfg, nullptr, 0) != KVP_OK)
            cfg.total_capacity += (kMaxDraft - 1) * m.n_layers;
        // Sliding-window layers on head_dim 8 and 20 models (no byte spent either): layer 1 global
        // of 2+ layers (pattern 2), else all local; configs that refuse it stay window-less.
        if (m.head_dim == 8 || m.head_dim == 20) {
            kvp_config sw = cfg;
            sw.sliding_window = 1 + (m.n_q_heads * 5 + m.n_layers * 3) % 23;
            sw.sliding_pattern = m.n_layers >= 2 ? 2 : 0;
            if (kvp_config_check(&sw, nullptr, 0) == KVP_OK) cfg = sw;
        }
        // Whole-prompt selection (issue 28) on head_dim 4 and 32 models (no byte spent): a small
        // max_prompt, so sequences reach the early selection past capacity + P; configs that
        // refuse it (asl, think, a shared pool) stay without.
        if (m.head_dim == 4 || m.head_dim == 32) {
            kvp_config mp = cfg;
            mp.max_prompt = 8 + (m.n_q_heads * 7 + m.n_layers * 5) % 97;
            if (kvp_config_check(&mp, nullptr, 0) == KVP_OK) cfg = mp;
        }
        // DuoAttention role tables (issue 32 item 2) on models with an odd layer count (no byte
        // spent): every other (layer, KV head) streams, duo_sink and duo_window from the geometry
        // (duo_window >= max_draft); configs that refuse a table (staged and layer-level policies,
        // quantized storage, a shared pool, max_prompt, sliding windows) run without one.
        std::vector<uint8_t> roles;
        if (m.n_layers % 2 == 1) {
            kvp_config dc = cfg;
            dc.duo_sink = m.n_q_heads % 3;
            dc.duo_window = kMaxDraft + m.head_dim % 13;
            std::vector<uint8_t> r(size_t(m.n_layers) * m.n_kv_heads);
            for (size_t i = 0; i < r.size(); ++i) r[i] = uint8_t((i / m.n_kv_heads + i % m.n_kv_heads) % 2 == 0);
            if (kvp_arena_size_heads(&dc, r.data(), uint32_t(r.size())) > 0) {
                cfg = dc;
                roles = r;
            }
        }
        const uint8_t *rt = roles.empty() ? nullptr : roles.data();
        const uint32_t nr = uint32_t(roles.size());
        g_prompt_room = cfg.max_prompt;
        g_lend = cfg.head_budget == KVP_HEAD_BUDGET_ADA && cfg.model.n_kv_heads > 1 ? 2 : 1;
        g_duo_hold = nr ? cfg.duo_sink + cfg.duo_window : 0;
        g_spec += std::string(nr ? " duo_roles=alternate duo_sink=" + std::to_string(cfg.duo_sink) + " duo_window=" +
                                       std::to_string(cfg.duo_window)
                                 : "") +
                  " max_prompt=" + std::to_string(cfg.max_prompt) + " sliding_window=" +
                 std::to_string(cfg.sliding_window) + " layers=" + std::to_string(m.n_layers) + " head_dim=" +
                 std::to_string(m.head_dim);
        const size_t bytes = kvp_arena_size_heads(&cfg, rt, nr);
        KVPF_CHECK(bytes > 0, "kvp_arena_size is 0 for a config kvp_config_apply accepted");
        if (bytes > (8u << 20)) return;
        kvp_config tcfg = cfg;
        tcfg.threads = cfg.threads == 1 ? 2 : 1;  // the twin runs the other thread count
        if (b.pick(2)) cfg.threads = 2, tcfg.threads = 1;
        char err[320];
        // Caller RoPE tables (issue 21): models with an even layer count run with a YaRN table and its
        // attention factor, in the cache and the twin (no byte spent: the corpus keeps its meaning).
        std::vector<double> table;
        const uint32_t pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
        if (pairs && m.n_layers % 2 == 0) {
            table.resize(pairs);
            float af = 1.0f;
            KVPF_CHECK(kvp_rope_freqs_yarn(table.data(), pairs, 10000.0, 4.0, 64.0, 32.0, 1.0, &af, err, sizeof err) == KVP_OK,
                       "yarn table: %s", err);
            kvp_config fc = cfg;
            fc.rope_attn_factor = af;
            if (kvp_config_check(&fc, nullptr, 0) == KVP_OK) cfg.rope_attn_factor = tcfg.rope_attn_factor = af;
            KVPF_CHECK(kvp_rope_check(&cfg, table.data(), pairs, err, sizeof err) == KVP_OK, "rope check: %s", err);
        }
        const size_t tbytes = kvp_arena_size_heads(&tcfg, rt, nr), abytes = kvp_arena_size_heads(&cfg, rt, nr);
        Arena aa(abytes), ta(tbytes);
        const double *tab = table.empty() ? nullptr : table.data();
        const bool host_pool = (m.n_q_heads + m.head_dim) % 2 == 1;
        if (host_pool) setenv("KVP_PAR_WORK", "0", 1);
        KVPF_CHECK(kvp_create_heads(&cfg, tab, pairs && tab ? pairs : 0, rt, nr, aa.p, abytes, &a, err, sizeof err) == KVP_OK,
                   "create: %s", err);
        KVPF_CHECK(kvp_create_heads(&tcfg, tab, pairs && tab ? pairs : 0, rt, nr, ta.p, tbytes, &t, err, sizeof err) == KVP_OK,
                   "create twin: %s", err);
        if (host_pool) unsetenv("KVP_PAR_WORK");
        // The host's threads (issue 30 item 4) on models with an odd q-head count + head_dim (no
        // byte spent): the 2-thread cache hands its parallel part to a host function that runs the
        // tasks in a row, the last first; the twin's 1 thread checks the bits. Created with
        // KVP_PAR_WORK=0 (read at create): every call goes through the function. Builds without
        // threads refuse the function (KVP_ERR_UNSUPPORTED) and run both alone.
        if (host_pool) {
            kvp_cache *two = cfg.threads == 2 ? a : t;
            const kvp_status st = kvp_set_parallel(two, host_in_a_row, nullptr);
            KVPF_CHECK(st == KVP_OK || st == KVP_ERR_UNSUPPORTED, "kvp_set_parallel: %s", kvp_last_error(two));
            if (st == KVP_OK) g_spec += " host_pool=in_a_row";
        }
        last_pos.assign(m.n_layers, -1);
        if (getenv("KVPFUZZ_SPEC")) fprintf(stderr, "config: %s\n", g_spec.c_str());  // a crash's config
        for (int i = 0; i < 400 && b.more(); ++i) {
            const uint32_t op = b.pick(16);
            if (op < 6) token_call(0);
            else if (op < 9) token_call(1);
            else if (op < 11) token_call(2);
            else misc_call();
        }
        KVPF_CHECK(observe(a, m, "cache") == observe(t, m, "twin"), "cache and twin differ at the end");
        kvp_destroy(a);
        kvp_destroy(t);
        kvp_destroy(a);  // twice: a no-op
    }
};

}  // namespace

void calls_target(const uint8_t *data, size_t size, CallStats *stats) {
    Sequence s(Bytes{data, size}, stats);
    s.run();
}

const char *calls_policy_name(uint32_t i) { return i < kNumRows ? kPolicies[i].name : nullptr; }
uint32_t calls_policy_count() { return kNumRows; }

}  // namespace kvpfuzz
