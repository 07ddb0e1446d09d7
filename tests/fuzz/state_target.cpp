// The state target (issue 29): kvp_state_load on a state whose checksum the harness recomputes, so
// every mutation reaches the body's checks (the checksum only detects accidents: anyone can
// recompute it). The cache is built from the state's own header (its kvp_config words, threads 1,
// arena at most kMaxArena), holds a few tokens of its own, then loads the input.
// Invariants: a refused load gives KVP_ERR_ARG / _UNSUPPORTED / _CONFIG and leaves the cache
// saving the same bytes; an accepted one saves the input's body back byte for byte (every field is
// read as written), then lengths, positions, counters and layer stats are consistent and decodes,
// a draft, a prefill, a second save and its reload run with finite outputs.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "targets.h"

namespace kvp {
uint64_t state_checksum(const void *p, size_t n);  // src/state.h: the format's checksum (in the library)
}

namespace kvpfuzz {
namespace {

constexpr size_t kMaxArena = size_t(16) << 20;
constexpr size_t kHeader = 40;
constexpr uint32_t kWords = uint32_t((sizeof(kvp_config) - 4) / 4);

[[noreturn]] void fail(const std::string &what) { violation("state", what.c_str()); }
#define KVPS_CHECK KVPFUZZ_CHECK

uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}
void put(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) p[i] = uint8_t(v >> (8 * i));
}


std::vector<uint8_t> save(kvp_cache *c) {
    // a loaded config may declare max_prompt (the word is fuzzed too): the prefills after the load
    // then opened a prompt, which a save refuses; end it first (nothing happens without one)
    KVPS_CHECK(kvp_prompt_end(c) == KVP_OK, "prompt_end: %s", kvp_last_error(c));
    std::vector<uint8_t> b(kvp_state_size(c));
    size_t w = 0;
    KVPS_CHECK(kvp_state_save(c, b.data(), b.size(), &w) == KVP_OK && w == b.size(), "save: %s", kvp_last_error(c));
    return b;
}

// Rows of n tokens (grid values, finite).
struct Rows {
    std::vector<float> q, k, v, out;
    uint32_t s = 1;
    void gen(const kvp_model &m, uint32_t n) {
        q.resize(size_t(n) * m.n_q_heads * m.head_dim);
        k.resize(size_t(n) * m.n_kv_heads * m.head_dim);
        v.resize(k.size());
        out.assign(q.size(), 0.0f);
        for (std::vector<float> *x : {&q, &k, &v})
            for (float &f : *x) f = float(int((s = s * 1103515245u + 12345u) >> 20) % 17 - 8) * 0.25f;
    }
    void finite(const char *what, uint32_t layer) const {
        for (float f : out) KVPS_CHECK(isfinite(f), "%s layer %u: a non-finite output", what, layer);
    }
};

void check_view(kvp_cache *c, const kvp_model &m, const char *who) {
    kvp_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    KVPS_CHECK(kvp_get_stats(c, &st) == KVP_OK, "%s: stats", who);
    KVPS_CHECK(st.live_bytes <= st.arena_bytes && st.peak_live_bytes >= st.live_bytes, "%s: live %llu peak %llu arena %llu",
               who, (unsigned long long)st.live_bytes, (unsigned long long)st.peak_live_bytes,
               (unsigned long long)st.arena_bytes);
    uint64_t live = 0;
    std::vector<int32_t> pos;
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        const uint32_t len = kvp_layer_len(c, l), cap = kvp_layer_capacity(c, l);
        KVPS_CHECK(len <= cap, "%s: layer %u len %u > capacity %u", who, l, len, cap);
        kvp_layer_stats ls;
        memset(&ls, 0, sizeof ls);
        ls.struct_size = sizeof ls;
        KVPS_CHECK(kvp_get_layer_stats(c, l, &ls) == KVP_OK, "%s: layer stats", who);
        KVPS_CHECK(ls.len == len && isfinite(ls.sparsity) && ls.sparsity >= 0.0f && ls.sparsity <= 1.0f,
                   "%s: layer %u stats (len %u, sparsity %g)", who, l, ls.len, double(ls.sparsity));
        live += ls.live_bytes;
        pos.assign(size_t(cap) + 1, 0);
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            uint32_t n = 0;
            KVPS_CHECK(kvp_layer_positions(c, l, h, pos.data(), cap + 1, &n) == KVP_OK && n <= cap, "%s: positions", who);
            for (uint32_t i = 0; i < n; ++i)
                KVPS_CHECK(pos[i] >= 0 && (i == 0 || pos[i] > pos[i - 1]), "%s: layer %u head %u positions not ascending",
                           who, l, h);
        }
    }
    KVPS_CHECK(live == st.live_bytes, "%s: layer live bytes sum to %llu, the cache says %llu", who,
               (unsigned long long)live, (unsigned long long)st.live_bytes);
}

}  // namespace

void state_target(const uint8_t *data, size_t size) {
    if (size < kHeader + 8 * 4) return;
    std::vector<uint8_t> st(data, data + size);
    const uint32_t words = uint32_t(le(&st[32], 4));
    if (words > kWords || size < kHeader + size_t(words) * 4) return;
    // the cache: the state's configuration (the rest at defaults), one thread, a bounded arena
    kvp_model m;
    memcpy(&m, &st[kHeader], sizeof m);
    kvp_config cfg;
    if (kvp_config_default(&cfg, &m) != KVP_OK) return;
    memcpy(reinterpret_cast<char *>(&cfg) + 4, &st[kHeader], size_t(words) * 4);
    cfg.threads = 1;
    if (kvp_config_check(&cfg, nullptr, 0) != KVP_OK) return;
    const size_t need = kvp_arena_size(&cfg);
    if (need == 0 || need > kMaxArena || uint64_t(m.n_q_heads) * m.head_dim > 4096) return;
    Arena arena(need);
    kvp_cache *c = nullptr;
    if (!arena.p || kvp_create(&cfg, arena.p, need, &c) != KVP_OK) return;
    Rows r;
    r.gen(m, 2);
    for (uint32_t l = 0; l < m.n_layers; ++l)  // tokens of its own (a refused load must keep them)
        (void)kvp_prefill(c, l, 2, nullptr, r.q.data(), r.k.data(), r.v.data(), r.out.data(), nullptr);
    const std::vector<uint8_t> before = save(c);

    put(&st[16], size, 8);  // the size and checksum the mutation broke
    put(&st[24], kvp::state_checksum(st.data() + 32, size - 32), 8);
    const kvp_status s = kvp_state_load(c, st.data(), size);
    if (s != KVP_OK) {
        KVPS_CHECK(s == KVP_ERR_ARG || s == KVP_ERR_UNSUPPORTED || s == KVP_ERR_CONFIG, "load status %d: %s", int(s),
                   kvp_last_error(c));
        KVPS_CHECK(save(c) == before, "a refused load (%s) changed the cache", kvp_last_error(c));
        kvp_destroy(c);
        return;
    }
    {  // the loaded cache saves the input's body back
        const std::vector<uint8_t> back = save(c);
        const size_t in0 = kHeader + size_t(words) * 4, out0 = kHeader + size_t(kWords) * 4;
        KVPS_CHECK(back.size() - out0 == size - in0 && memcmp(back.data() + out0, st.data() + in0, size - in0) == 0,
                   "an accepted state does not save back the same body (%zu vs %zu bytes)", back.size() - out0, size - in0);
    }
    check_view(c, m, "after the load");
    for (int step = 0; step < 2; ++step) {
        r.gen(m, 1);
        for (uint32_t l = 0; l < m.n_layers; ++l)
            if (kvp_decode(c, l, r.q.data(), r.k.data(), r.v.data(), r.out.data()) == KVP_OK) r.finite("decode", l);
        check_view(c, m, "after a decode");
    }
    if (kvp_draft_begin(c) == KVP_OK) {
        r.gen(m, 1);
        uint32_t ok = 1;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            if (kvp_decode(c, l, r.q.data(), r.k.data(), r.v.data(), r.out.data()) == KVP_OK) r.finite("draft", l);
            else ok = 0;
        }
        KVPS_CHECK(kvp_draft_commit(c, ok) == KVP_OK, "draft commit: %s", kvp_last_error(c));
        check_view(c, m, "after a draft");
    }
    r.gen(m, 2);
    for (uint32_t l = 0; l < m.n_layers; ++l)
        if (kvp_prefill(c, l, 2, nullptr, r.q.data(), r.k.data(), r.v.data(), r.out.data(), nullptr) == KVP_OK)
            r.finite("prefill", l);
    check_view(c, m, "after a prefill");
    const std::vector<uint8_t> again = save(c);
    KVPS_CHECK(kvp_state_load(c, again.data(), again.size()) == KVP_OK, "its own save after the calls: %s",
               kvp_last_error(c));
    kvp_destroy(c);
}

}  // namespace kvpfuzz
