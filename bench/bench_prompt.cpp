// Whole-prompt selection across chunks (issue 28, max_prompt): what a chunked prompt keeps against
// one call, with and without max_prompt, and what the chunking costs. The setting: a
// 3000-token prompt at budget 750 fed in 512-token chunks (llama.cpp's micro-batch).
//
//   ./build/bench/bench_prompt [prompt=3000] [chunk=512] [budget=750] [reps=3]
//
// Prints, per policy, the kept positions shared with the one-call prompt (layer 1, KV head 0)
// without and with max_prompt, and the prefill wall time of one call and of the chunks (median of
// reps, with max_prompt: the chunks attend over everything before them, as one call does).
#include <kvprune/kvprune.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string>
#include <vector>

namespace {

uint64_t g_seed = 7;
float rnd() {
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return float((g_seed >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

struct Run {
    std::vector<int32_t> kept;
    double seconds = 0.0;
};

Run run(const kvp_model &m, const std::string &spec, uint32_t T, uint32_t chunk, const std::vector<float> &q,
        const std::vector<float> &k, const std::vector<float> &v) {
    kvp_config cfg;
    char err[256];
    if (kvp_config_default(&cfg, &m) != KVP_OK || kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", spec.c_str(), err);
        exit(1);
    }
    kvp_cache *c = nullptr;
    if (kvp_create_ex(&cfg, nullptr, 0, &c, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "create %s: %s\n", spec.c_str(), err);
        exit(1);
    }
    const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    std::vector<float> out(size_t(chunk) * nq);
    Run r;
    const auto t0 = std::chrono::steady_clock::now();
    for (uint32_t t = 0; t < T; t += chunk) {
        const uint32_t n = std::min(chunk, T - t);
        for (uint32_t l = 0; l < m.n_layers; ++l)
            if (kvp_prefill(c, l, n, nullptr, &q[t * nq], &k[t * nkv], &v[t * nkv], out.data(), nullptr) != KVP_OK) {
                fprintf(stderr, "%s: prefill at %u: %s\n", spec.c_str(), t, kvp_last_error(c));
                exit(1);
            }
    }
    kvp_prompt_end(c);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.kept.resize(kvp_layer_len(c, 1) + 1);
    uint32_t n = 0;
    kvp_layer_positions(c, 1, 0, r.kept.data(), uint32_t(r.kept.size()), &n);
    r.kept.resize(n);
    kvp_destroy(c);
    return r;
}

size_t shared(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    std::vector<int32_t> o;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(o));
    return o.size();
}

double median_seconds(const kvp_model &m, const std::string &spec, uint32_t T, uint32_t chunk, int reps,
                      const std::vector<float> &q, const std::vector<float> &k, const std::vector<float> &v) {
    std::vector<double> s;
    for (int i = 0; i < reps; ++i) s.push_back(run(m, spec, T, chunk, q, k, v).seconds);
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
}

}  // namespace

int main(int argc, char **argv) {
    const uint32_t T = argc > 1 ? uint32_t(atoi(argv[1])) : 3000, chunk = argc > 2 ? uint32_t(atoi(argv[2])) : 512,
                   budget = argc > 3 ? uint32_t(atoi(argv[3])) : 750;
    const int reps = argc > 4 ? atoi(argv[4]) : 3;
    const kvp_model m = {2, 8, 2, 64, KVP_ROPE_NEOX, 0, 10000.0f};  // 4 query heads per KV head, d 64
    const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    std::vector<float> q(T * nq), k(T * nkv), v(T * nkv);
    for (float &x : q) x = 2.0f * rnd();
    for (float &x : k) x = 2.0f * rnd();
    for (float &x : v) x = rnd();
    const std::string b = std::to_string(budget), P = std::to_string(T);
    const std::string specs[] = {
        "policy=snapkv budget=" + b + " obs_window=32 prefill_stage=" + P,
        "policy=pyramidkv budget=" + b + " obs_window=32 prefill_stage=" + P,
        "policy=h2o budget=" + b + " recent=32 capacity=" + std::to_string(T + 1),
    };
    printf("prompt %u tokens in chunks of %u, budget %u; 2 layers, 8 query / 2 KV heads, d 64; kept positions of layer 1, KV head 0\n",
           T, chunk, budget);
    printf("%-10s %8s %22s %22s %14s %14s\n", "policy", "kept", "chunked shares (no P)", "chunked shares (P)", "one call s",
           "chunked (P) s");
    for (const std::string &s : specs) {
        const std::string withP = s + " max_prompt=" + P;
        const Run one = run(m, s, T, T, q, k, v), ch = run(m, s, T, chunk, q, k, v);
        const Run oneP = run(m, withP, T, T, q, k, v), chP = run(m, withP, T, chunk, q, k, v);
        if (oneP.kept != one.kept) printf("  (one call with max_prompt keeps another set: a defect)\n");
        const double t1 = median_seconds(m, withP, T, T, reps, q, k, v), tc = median_seconds(m, withP, T, chunk, reps, q, k, v);
        printf("%-10s %8zu %15zu of %-4zu %15zu of %-4zu %14.3f %14.3f\n", s.substr(7, s.find(' ') - 7).c_str(), one.kept.size(),
               shared(one.kept, ch.kept), one.kept.size(), shared(oneP.kept, chP.kept), oneP.kept.size(), t1, tc);
    }
    return 0;
}
