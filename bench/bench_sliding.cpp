// Sliding-window layers (issue 21 item 5): the memory and decode time of a Gemma-3-shaped cache
// with its local layers (sliding_window, sliding_pattern=6: five local to one global) against
// one window-less cache (policy=full on every layer), at N context tokens.
//   Gemma 3 1B: 26 layers, 4 query heads, 1 KV head, head_dim 256, window 512
//   Gemma 3 4B: 34 layers, 8 query heads, 4 KV heads, head_dim 256, window 1024
// Per (shape, N, cache): kvp_arena_size, live bytes after N tokens (kvp_append in chunks of
// kvp_prefill_room, every layer), then --decodes decode steps over all layers (ms per token,
// best of --reps rounds of those steps; each round continues the sequence). A cache whose arena
// exceeds --max-mb is planned (arena printed) but not run.
//   bench_sliding [--tokens 4096,32768] [--decodes 16] [--reps 3] [--threads 1] [--max-mb 4096]
//                 [--dtype f32|f16|q8|q4]
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"

namespace {

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Shape {
    const char *name;
    kvp_model m;
    uint32_t window;
};

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
float rnd() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return float(int32_t(rng_state >> 40) - (1 << 23)) / float(1 << 23);
}

struct Row {
    size_t arena = 0;
    uint64_t live = 0;
    double ms = -1;
    bool run = false;
};

Row measure(const kvp_model &m, const std::string &spec, uint32_t N, uint32_t decodes, uint32_t reps, double max_mb) {
    Row r;
    kvp_config cfg;
    kvp_config_default(&cfg, &m);
    char err[512];
    if (kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s: %s\n", spec.c_str(), err);
        exit(1);
    }
    r.arena = kvp_arena_size(&cfg);
    if (double(r.arena) / (1 << 20) > max_mb) return r;
    void *mem = aligned_alloc(64, (r.arena + 63) / 64 * 64);
    if (!mem) return r;
    memset(mem, 0, r.arena);
    kvp_cache *c = nullptr;
    if (kvp_create_ex(&cfg, mem, r.arena, &c, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "create %s: %s\n", spec.c_str(), err);
        exit(1);
    }
    const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    const uint32_t chunk_max = 1024;
    std::vector<float> k(chunk_max * nkv), v(k.size()), q(nq), o(nq);
    for (float &x : k) x = rnd();
    for (float &x : v) x = rnd();
    for (float &x : q) x = rnd();
    for (uint32_t t = 0; t < N;) {
        uint32_t n = kvp_prefill_room(c);
        if (n > chunk_max) n = chunk_max;
        if (n > N - t) n = N - t;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            if (kvp_append(c, l, n, nullptr, k.data(), v.data()) != KVP_OK) {
                fprintf(stderr, "append: %s\n", kvp_last_error(c));
                exit(1);
            }
        }
        t += n;
    }
    kvp_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    kvp_get_stats(c, &st);
    r.live = st.live_bytes;
    double best = 1e30;
    for (uint32_t rep = 0; rep < reps; ++rep) {
        const double t0 = now_s();
        for (uint32_t d = 0; d < decodes; ++d)
            for (uint32_t l = 0; l < m.n_layers; ++l)
                if (kvp_decode(c, l, q.data(), k.data() + size_t(d % chunk_max) * nkv, v.data(), o.data()) != KVP_OK) {
                    fprintf(stderr, "decode: %s\n", kvp_last_error(c));
                    exit(1);
                }
        const double dt = (now_s() - t0) / decodes;
        if (dt < best) best = dt;
    }
    r.ms = best * 1e3;
    r.run = true;
    kvp_destroy(c);
    free(mem);
    return r;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<uint32_t> tokens = {4096, 32768};
    uint32_t decodes = 16, reps = 3, threads = 1;
    double max_mb = 4096;
    std::string dtype = "f32";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens")) {
            tokens.clear();
            for (const char *p = argv[i + 1]; *p;) {
                tokens.push_back(uint32_t(strtoul(p, const_cast<char **>(&p), 10)));
                if (*p == ',') ++p;
            }
        } else if (!strcmp(argv[i], "--decodes")) decodes = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--reps")) reps = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--threads")) threads = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--max-mb")) max_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    }
    const Shape shapes[] = {
        {"gemma3-1b", {26, 4, 1, 256, KVP_ROPE_NEOX, 0, 1000000.0f}, 512},
        {"gemma3-4b", {34, 8, 4, 256, KVP_ROPE_NEOX, 0, 1000000.0f}, 1024},
    };
    printf("kv_dtype=%s threads=%u decodes=%u reps=%u (decode: ms per token over all layers, best round)\n", dtype.c_str(),
           threads, decodes, reps);
    printf("%-10s %6s %-26s %11s %11s %10s %8s %8s\n", "shape", "N", "cache", "arena MiB", "live MiB", "decode ms",
           "arena x", "live x");
    for (const Shape &s : shapes) {
        for (uint32_t N : tokens) {
            const std::string base = "policy=full capacity=" + std::to_string(N + decodes * reps) + " kv_dtype=" + dtype +
                                     " threads=" + std::to_string(threads);
            const std::string sw = " sliding_window=" + std::to_string(s.window) + " sliding_pattern=6";
            const Row full = measure(s.m, base, N, decodes, reps, max_mb);
            const Row slid = measure(s.m, base + sw, N, decodes, reps, max_mb);
            auto line = [&](const char *what, const Row &r, const Row *ref) {
                char ms[32] = "not run", live[32] = "-", ax[32] = "", lx[32] = "";
                if (r.run) {
                    snprintf(ms, sizeof ms, "%.3f", r.ms);
                    snprintf(live, sizeof live, "%.1f", double(r.live) / (1 << 20));
                }
                if (ref) {
                    snprintf(ax, sizeof ax, "%.3f", double(r.arena) / double(ref->arena));
                    if (r.run && ref->run) snprintf(lx, sizeof lx, "%.3f", double(r.live) / double(ref->live));
                }
                printf("%-10s %6u %-26s %11.1f %11s %10s %8s %8s\n", s.name, N, what, double(r.arena) / (1 << 20), live, ms, ax,
                       lx);
            };
            line("full (no window)", full, nullptr);
            const std::string name = "window " + std::to_string(s.window) + ", 5 local:1";
            line(name.c_str(), slid, &full);
        }
    }
    return 0;
}
