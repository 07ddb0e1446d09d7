// State save/load bandwidth (issue 21 target: a 32k-token cache saves and loads at >= half the
// memory bandwidth). A cache of --layers layers x 8 KV heads x head_dim 128 (32 query heads),
// policy=full, kv_dtype --dtype, filled with --tokens tokens (default 32768) by kvp_append; then
// --reps rounds of kvp_state_save and kvp_state_load into a second cache. The memory bandwidth
// baseline is memcpy of the same number of bytes between two buffers of the state's size (what
// a save must at least do: read the rows and write them). Prints GB/s (10^9 bytes of state per
// second, best of the rounds) and the ratio to memcpy.
//   bench_state [--layers L] [--tokens N] [--dtype f32|f16|q8|q4] [--reps R]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvprune/kvprune.h"

namespace {

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

kvp_cache *make(const kvp_config &cfg, void **mem) {
    const size_t n = kvp_arena_size(&cfg);
    *mem = aligned_alloc(64, (n + 63) / 64 * 64);
    memset(*mem, 0, n);  // fault the pages in before timing
    kvp_cache *c = nullptr;
    char err[256];
    if (!*mem || kvp_create_ex(&cfg, *mem, n, &c, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "create: %s\n", err);
        exit(1);
    }
    return c;
}

}  // namespace

int main(int argc, char **argv) {
    uint32_t L = 2, T = 32768, reps = 5;
    std::string dtype = "f32";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers")) L = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--tokens")) T = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = uint32_t(atoi(argv[i + 1]));
    }
    const kvp_model m = {L, 32, 8, 128, KVP_ROPE_NEOX, 0, 500000.0f};
    kvp_config cfg;
    kvp_config_default(&cfg, &m);
    char err[256];
    const std::string spec = "policy=full capacity=" + std::to_string(T) + " kv_dtype=" + dtype;
    if (kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    void *ma, *mb;
    kvp_cache *a = make(cfg, &ma), *b = make(cfg, &mb);
    const uint32_t chunk = 1024;
    const size_t nkv = size_t(m.n_kv_heads) * m.head_dim;
    std::vector<float> k(chunk * nkv), v(chunk * nkv);
    uint64_t s = 1;
    for (float &x : k) x = float(int32_t((s = s * 6364136223846793005ull + 1) >> 40) % 1000) / 1000.0f;
    for (float &x : v) x = float(int32_t((s = s * 6364136223846793005ull + 1) >> 40) % 1000) / 1000.0f;
    for (uint32_t t = 0; t < T; t += chunk)
        for (uint32_t l = 0; l < L; ++l)
            if (kvp_append(a, l, chunk, nullptr, k.data(), v.data()) != KVP_OK) {
                fprintf(stderr, "append: %s\n", kvp_last_error(a));
                return 1;
            }
    const size_t n = kvp_state_size(a);
    kvp_stats st;
    st.struct_size = sizeof st;
    kvp_get_stats(a, &st);
    std::vector<uint8_t> buf(n), copy(n);
    memset(buf.data(), 1, n);
    memset(copy.data(), 2, n);
    double best_save = 1e30, best_load = 1e30, best_copy = 1e30;
    for (uint32_t r = 0; r < reps; ++r) {
        double t0 = now_s();
        size_t w = 0;
        if (kvp_state_save(a, buf.data(), n, &w) != KVP_OK) return 1;
        best_save = std::min(best_save, now_s() - t0);
        t0 = now_s();
        if (kvp_state_load(b, buf.data(), n) != KVP_OK) {
            fprintf(stderr, "load: %s\n", kvp_last_error(b));
            return 1;
        }
        best_load = std::min(best_load, now_s() - t0);
        t0 = now_s();
        memcpy(copy.data(), buf.data(), n);
        best_copy = std::min(best_copy, now_s() - t0);
    }
    if (memcmp(copy.data(), buf.data(), n) != 0) return 1;
    const double gb = double(n) / 1e9;
    printf("bench_state %s tokens=%u layers=%u state=%.1f MB live=%.1f MB arena=%.1f MB\n", spec.c_str(), T, L, n / 1e6,
           st.live_bytes / 1e6, st.arena_bytes / 1e6);
    printf("save %.2f GB/s (%.1f ms)  load %.2f GB/s (%.1f ms)  memcpy %.2f GB/s (%.1f ms)  save/memcpy %.2f  load/memcpy %.2f\n",
           gb / best_save, 1e3 * best_save, gb / best_load, 1e3 * best_load, gb / best_copy, 1e3 * best_copy,
           best_copy / best_save, best_copy / best_load);
    kvp_destroy(a);
    kvp_destroy(b);
    free(ma);
    free(mb);
    return 0;
}
