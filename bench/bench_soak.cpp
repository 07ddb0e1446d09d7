// Soak: many decode steps of one cache (streaming by default, the policy a long-running host uses),
// asserting what must hold however long it runs:
//   - flat memory: the process's resident set after the warm-up equals the one at the end (no
//     allocation after kvp_create; the OpenMP pool started in create),
//   - flat time: ns per step over the first and the last tenth of the run (reported),
//   - exact counters: tokens_seen, prune_events, tokens_evicted, live and peak bytes equal an
//     independent integer model of the streaming rule (docs/design.md),
//   - the final output equals that of a cache rebuilt from the kept tokens alone (kvp_append of
//     the kept positions, then the same last decode): bit for bit with original positions, within
//     1e-5 with realign (the stored keys' rotation angles differ by the shift; the math does not).
//
//   bench_soak [--steps N] [--positions realign|original] [--threads T]
// Prints `soak key=value ...` (parsed by tests/fuzz/reliability.sh) and exits 1 on a failure.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kvprune/kvprune.h"

namespace {

const uint32_t kLayers = 2, kQ = 4, kKV = 2, kHD = 32;
const uint32_t kSinks = 4, kWindow = 60, kR = 8;

long rss_kb() {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long size = 0, res = 0;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Token t's q/k/v (every layer its own): a pure function of (t, layer), so the rebuilt cache can
// regenerate the kept tokens.
void token(uint64_t t, uint32_t layer, float *q, float *k, float *v) {
    uint64_t s = t * 0x9e3779b97f4a7c15ull + layer * 0x632be59bd9b4e019ull + 1;
    auto next = [&s]() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    };
    auto unit = [&next]() { return float(next() >> 40) / float(1ull << 24) * 2.0f - 1.0f; };
    for (uint32_t i = 0; i < kQ * kHD; ++i) q[i] = unit();
    for (uint32_t i = 0; i < kKV * kHD; ++i) k[i] = unit();
    for (uint32_t i = 0; i < kKV * kHD; ++i) v[i] = unit();
}

struct Cache {
    kvp_cache *c = nullptr;
    void *arena = nullptr;
    bool make(const char *spec, uint32_t threads) {
        const kvp_model m = {kLayers, kQ, kKV, kHD, KVP_ROPE_NEOX, 0, 10000.0f};
        kvp_config cfg;
        char err[320];
        if (kvp_config_default(&cfg, &m) != KVP_OK) return false;
        std::string s = std::string(spec) + " threads=" + std::to_string(threads);
        if (kvp_config_apply(&cfg, s.c_str(), err, sizeof err) != KVP_OK) {
            fprintf(stderr, "soak: %s\n", err);
            return false;
        }
        const size_t n = kvp_arena_size(&cfg);
        arena = aligned_alloc(64, (n + 63) / 64 * 64);
        return arena && kvp_create_ex(&cfg, arena, n, &c, err, sizeof err) == KVP_OK;
    }
    ~Cache() {
        kvp_destroy(c);
        free(arena);
    }
};

int failures = 0;
void expect(bool ok, const char *what, unsigned long long got, unsigned long long want) {
    if (ok) return;
    ++failures;
    fprintf(stderr, "soak: FAILED %s: got %llu, want %llu\n", what, got, want);
}

}  // namespace

int main(int argc, char **argv) {
    uint64_t steps = 1000000;
    std::string positions = "realign";
    uint32_t threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) steps = strtoull(argv[i + 1], nullptr, 10);
        else if (!strcmp(argv[i], "--positions")) positions = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = uint32_t(atoi(argv[i + 1]));
        else {
            fprintf(stderr, "usage: bench_soak [--steps N] [--positions realign|original] [--threads T]\n");
            return 2;
        }
    }
    if (steps < 100 || (positions != "realign" && positions != "original")) return 2;
    char spec[256];
    snprintf(spec, sizeof spec, "policy=streaming sinks=%u window=%u compress_every=%u positions=%s", kSinks, kWindow, kR,
             positions.c_str());
    Cache soak;
    if (!soak.make(spec, threads)) return 1;

    // The independent model: per layer (all KV heads alike) length, prunes, evictions; peak =
    // the largest sum over layers right after a call's append, before its prune.
    const uint64_t C = kSinks + kWindow;
    uint64_t len[kLayers] = {0}, prunes = 0, evicted = 0, peak = 0;

    std::vector<float> q(kQ * kHD), k(kKV * kHD), v(kKV * kHD), out(kQ * kHD);
    const long rss_start = rss_kb();
    long rss_warm = -1;
    const uint64_t tenth = steps / 10, warm = steps / 100;
    double t0 = now_s(), t_first = 0, t_last_start = 0;
    for (uint64_t t = 0; t < steps; ++t) {
        if (t == warm) rss_warm = rss_kb();
        if (t == tenth) t_first = now_s() - t0;
        if (t == steps - tenth) t_last_start = now_s();
        for (uint32_t l = 0; l < kLayers; ++l) {
            token(t, l, q.data(), k.data(), v.data());
            if (kvp_decode(soak.c, l, q.data(), k.data(), v.data(), out.data()) != KVP_OK) {
                fprintf(stderr, "soak: decode failed at step %llu: %s\n", (unsigned long long)t, kvp_last_error(soak.c));
                return 1;
            }
            len[l] += 1;
            uint64_t live = 0;
            for (uint32_t j = 0; j < kLayers; ++j) live += len[j];
            if (live > peak) peak = live;
            if (len[l] - C >= kR && len[l] >= C) {
                evicted += len[l] - C;
                len[l] = C;
                prunes += 1;
            }
        }
    }
    const double t_last = now_s() - t_last_start;
    const long rss_end = rss_kb();

    kvp_stats st;
    st.struct_size = sizeof st;
    if (kvp_get_stats(soak.c, &st) != KVP_OK) return 1;
    const uint64_t row = uint64_t(kHD) * 4 * 2 * kKV;  // bytes per token per layer (all KV heads)
    expect(st.tokens_seen == steps, "tokens_seen", st.tokens_seen, steps);
    expect(st.prune_events == prunes * kKV, "prune_events", st.prune_events, prunes * kKV);
    expect(st.tokens_evicted == evicted * kKV, "tokens_evicted", st.tokens_evicted, evicted * kKV);
    expect(st.live_bytes == (len[0] + len[1]) * row, "live_bytes", st.live_bytes, (len[0] + len[1]) * row);
    expect(st.peak_live_bytes == peak * row, "peak_live_bytes", st.peak_live_bytes, peak * row);
    // Flat memory: nothing grows after the warm-up (a page of slack for the stdio buffer).
    expect(rss_end <= rss_warm + 8, "rss after warm-up (kB)", (unsigned long long)rss_end, (unsigned long long)rss_warm);

    // The rebuilt cache: the kept tokens of each layer appended at their positions, then one
    // more decode step on both caches.
    Cache rebuilt;
    if (!rebuilt.make(spec, 1)) return 1;
    double max_diff = 0;
    bool bits_equal = true;
    std::vector<float> out2(kQ * kHD), ks, vs, qq(kQ * kHD), kk(kKV * kHD), vv(kKV * kHD);
    for (uint32_t l = 0; l < kLayers; ++l) {
        std::vector<int32_t> pos(kvp_layer_len(soak.c, l)), pos1(pos.size());
        uint32_t n = 0, n1 = 0;
        if (kvp_layer_positions(soak.c, l, 0, pos.data(), uint32_t(pos.size()), &n) != KVP_OK) return 1;
        if (kvp_layer_positions(soak.c, l, 1, pos1.data(), uint32_t(pos1.size()), &n1) != KVP_OK || pos1 != pos) {
            fprintf(stderr, "soak: KV heads keep different positions\n");
            return 1;
        }
        // sinks 0..S-1 and the most recent tokens
        for (uint32_t i = 0; i < n; ++i) {
            const int64_t want = i < kSinks ? int64_t(i) : int64_t(steps) - (n - i);
            expect(pos[i] == want, "kept position", uint64_t(pos[i]), uint64_t(want));
        }
        ks.assign(size_t(n) * kKV * kHD, 0);
        vs.assign(ks.size(), 0);
        for (uint32_t i = 0; i < n; ++i) token(uint64_t(pos[i]), l, qq.data(), &ks[size_t(i) * kKV * kHD], &vs[size_t(i) * kKV * kHD]);
        // realign: the rebuilt cache's positions are cache-relative anyway; original: the same absolute ones
        if (kvp_append(rebuilt.c, l, n, positions == "original" ? pos.data() : nullptr, ks.data(), vs.data()) != KVP_OK) {
            fprintf(stderr, "soak: rebuild append failed: %s\n", kvp_last_error(rebuilt.c));
            return 1;
        }
        token(steps, l, qq.data(), kk.data(), vv.data());
        if (kvp_decode(soak.c, l, qq.data(), kk.data(), vv.data(), out.data()) != KVP_OK ||
            kvp_decode(rebuilt.c, l, qq.data(), kk.data(), vv.data(), out2.data()) != KVP_OK)
            return 1;
        for (size_t i = 0; i < out.size(); ++i) {
            max_diff = fmax(max_diff, fabs(double(out[i]) - double(out2[i])));
            if (memcmp(&out[i], &out2[i], 4) != 0) bits_equal = false;
        }
    }
    if (positions == "original") expect(bits_equal, "rebuilt output bit-identical", 0, 1);
    else expect(max_diff <= 1e-5, "rebuilt output within 1e-5 (x1e9)", (unsigned long long)(max_diff * 1e9), 10000);

    const double ns_first = t_first / double(tenth) * 1e9, ns_last = t_last / double(tenth) * 1e9;
    printf("soak steps=%llu layers=%u positions=%s threads=%u rss_start_kb=%ld rss_warm_kb=%ld rss_end_kb=%ld "
           "ns_per_step_first=%.0f ns_per_step_last=%.0f tokens_seen=%llu prune_events=%llu tokens_evicted=%llu "
           "live_bytes=%llu peak_live_bytes=%llu counters=%s rebuilt_max_abs_diff=%.3g rebuilt_bits_equal=%d\n",
           (unsigned long long)steps, kLayers, positions.c_str(), threads, rss_start, rss_warm, rss_end, ns_first, ns_last,
           (unsigned long long)st.tokens_seen, (unsigned long long)st.prune_events,
           (unsigned long long)st.tokens_evicted, (unsigned long long)st.live_bytes,
           (unsigned long long)st.peak_live_bytes, failures ? "MISMATCH" : "exact", max_diff, bits_equal ? 1 : 0);
    printf("soak: %d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
