// Test support: a double-precision naive attention reference (independent of src/), a
// deterministic PRNG and a cache wrapper owning an aligned arena.
#pragma once
#include <kvprune/kvprune.h>
#include <stdint.h>
#include <stdlib.h>

#include <string>
#include <vector>

namespace ref {

// splitmix64-based generator: same numbers on every platform.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) / float(1ull << 24); }
    // A multiple of 2^-12 in [-scale, scale) for a power-of-two scale: exact in float, so the
    // same on every ISA even where the compiler contracts a*b+c into FMA (cross-ISA hash).
    float grid(float scale) {
        const int32_t m = int32_t(next() >> 51) - 4096;  // [-4096, 4096)
        return scale * (float(m) / 4096.0f);
    }
    void fill(std::vector<float> &x, float lo = -1.0f, float hi = 1.0f) {
        for (float &f : x) f = uniform(lo, hi);
    }
};

// Attention of one token's query heads q[nq][hd] (pre-RoPE, rotated at qpos) over the keys
// k_all[idx[j]] rotated at kpos[j] (k_all/v_all are [T][nkv][hd], pre-RoPE), in double.
void attend(const kvp_model &m, const float *q, int64_t qpos, const float *k_all, const float *v_all,
            const std::vector<uint32_t> &idx, const std::vector<int64_t> &kpos, std::vector<double> &out);

// RoPE in double: rotates x[0..head_dim) to position pos as the model's style says.
void rotate(const kvp_model &m, std::vector<double> &x, int64_t pos);

// Softmax weights, in double, of query head h (pre-RoPE q row, rotated at qpos) over the keys
// k_all[idx[j]] of its KV head (rotated at kpos[j]): w[j], summing to 1.
std::vector<double> weights(const kvp_model &m, uint32_t h, const float *q_row, int64_t qpos, const float *k_all,
                            const std::vector<uint32_t> &idx, const std::vector<int64_t> &kpos);

// A cache in its own 64-byte-aligned arena.
struct Cache {
    kvp_cache *c = nullptr;
    void *arena = nullptr;
    size_t bytes = 0;
    Cache(const kvp_model &m, const std::string &spec);
    ~Cache();
    Cache(const Cache &) = delete;
    Cache &operator=(const Cache &) = delete;
    std::vector<int32_t> positions(uint32_t layer, uint32_t head) const;
    // Saves this cache's state and loads it into `to` (gtest failures name the call that failed).
    void copy_state_to(Cache &to) const;
};

kvp_model model(uint32_t layers, uint32_t nq, uint32_t nkv, uint32_t hd, kvp_rope_style rope = KVP_ROPE_GPTJ,
                uint32_t rope_dim = 0, float theta = 10000.0f);

// Seeded q/k/v for T tokens of model m (q and k uniform in [-qk_scale, qk_scale], v in [-1, 1]),
// token-major as the C API takes them.
struct Inputs {
    kvp_model m;
    uint32_t T, nq, nkv, G;
    std::vector<float> q, k, v;
    Inputs(const kvp_model &mm, uint32_t tokens, uint64_t seed, float qk_scale) : m(mm), T(tokens) {
        nq = m.n_q_heads * m.head_dim;
        nkv = m.n_kv_heads * m.head_dim;
        G = m.n_q_heads / m.n_kv_heads;
        q.resize(size_t(T) * nq);
        k.resize(size_t(T) * nkv);
        v.resize(k.size());
        Rng rng(seed);
        rng.fill(q, -qk_scale, qk_scale);
        rng.fill(k, -qk_scale, qk_scale);
        rng.fill(v);
    }
    const float *qt(uint32_t t) const { return &q[size_t(t) * nq]; }
    const float *kt(uint32_t t) const { return &k[size_t(t) * nkv]; }
    const float *vt(uint32_t t) const { return &v[size_t(t) * nkv]; }
};

// Forces every call of caches created in its scope onto all their threads (KVP_PAR_WORK=0, read
// at create by src/cache.cpp), so small test workloads take the parallel paths.
struct ForceParallel {
    explicit ForceParallel(bool force) : on(force) {
        if (on) setenv("KVP_PAR_WORK", "0", 1);
    }
    ~ForceParallel() {
        if (on) unsetenv("KVP_PAR_WORK");
    }
    ForceParallel(const ForceParallel &) = delete;
    ForceParallel &operator=(const ForceParallel &) = delete;
    bool on;
};

}  // namespace ref
