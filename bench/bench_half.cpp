// Half-precision inputs (issue 21 target: "f16 inputs: a decode step no slower than the f32 call
// on the same data"). For each context length N and kv_dtype: three caches with the same N
// tokens (policy=window window=N, so every decode keeps N), decoded in turn, one call each per
// round in a rotating order, with the same token: kvp_decode on f32 rows, kvp_decode_ex on the f16 rows and on the
// bf16 rows of those values (values exact in both, so the three caches hold the same bits).
// Geometry: 32 query heads, 8 KV heads, head_dim 128 (Llama-3-8B's layer), one layer.
// Prints the median microseconds per decode step of each and the ratio to f32, with the load
// average (the calls alternate, so a busy spell hits all three alike).
//   bench_half [--tokens 512,4096,32768] [--dtypes f32,q8] [--reps R]
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
    if (*mem) memset(*mem, 0, n);  // fault the pages in before timing
    kvp_cache *c = nullptr;
    char err[256];
    if (!*mem || kvp_create_ex(&cfg, *mem, n, &c, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "create: %s\n", err);
        exit(1);
    }
    return c;
}

std::vector<std::string> split(const std::string &s) {
    std::vector<std::string> out;
    size_t a = 0;
    while (a <= s.size()) {
        const size_t b = s.find(',', a);
        out.push_back(s.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) break;
        a = b + 1;
    }
    return out;
}

// Values exact in f16 and bf16: k/256 for |k| < 256 (8 significant bits).
uint16_t f16_of(float x) {  // exact for these values
    if (x == 0.0f) return 0;
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, e = (u >> 23) & 255u, mant = (u >> 13) & 0x3ffu;
    return uint16_t(sign | ((e - 112u) << 10) | mant);
}
uint16_t bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return uint16_t(u >> 16);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char **argv) {
    std::string tokens = "512,4096,32768", dtypes = "f32,q8";
    uint32_t reps = 300;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens")) tokens = argv[i + 1];
        else if (!strcmp(argv[i], "--dtypes")) dtypes = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = uint32_t(atoi(argv[i + 1]));
    }
    const kvp_model m = {1, 32, 8, 128, KVP_ROPE_NEOX, 0, 500000.0f};
    const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    double load[3] = {0, 0, 0};
    if (FILE *f = fopen("/proc/loadavg", "r")) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    printf("bench_half: decode step, 32 q / 8 kv heads x 128, one layer, policy=window; median of %u; load %.2f %.2f %.2f\n",
           reps, load[0], load[1], load[2]);
    printf("%8s %6s %10s %10s %10s %9s %9s\n", "tokens", "kv", "f32_us", "f16_us", "bf16_us", "f16/f32", "bf16/f32");
    for (const std::string &ts : split(tokens)) {
        const uint32_t N = uint32_t(atol(ts.c_str()));
        for (const std::string &kd : split(dtypes)) {
            kvp_config cfg;
            kvp_config_default(&cfg, &m);
            char err[256];
            const std::string spec = "policy=window window=" + std::to_string(N) + " capacity=" +
                                     std::to_string(N + 64) + " kv_dtype=" + kd;
            if (kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            void *mem[3];
            kvp_cache *c[3];
            for (int i = 0; i < 3; ++i) c[i] = make(cfg, &mem[i]);
            const uint32_t T = 256;  // distinct tokens, reused
            std::vector<float> q(T * nq), k(T * nkv), v(T * nkv), out(nq);
            uint64_t s = 7;
            auto val = [&]() { return float(int32_t((s = s * 6364136223846793005ull + 1) >> 33) % 255) / 256.0f; };
            for (float &x : q) x = val();
            for (float &x : k) x = val();
            for (float &x : v) x = val();
            std::vector<uint16_t> hq(q.size()), hk(k.size()), hv(v.size()), bq(q.size()), bk(k.size()), bv(v.size()),
                hout(nq);
            for (size_t i = 0; i < q.size(); ++i) hq[i] = f16_of(q[i]), bq[i] = bf16_of(q[i]);
            for (size_t i = 0; i < k.size(); ++i) hk[i] = f16_of(k[i]), bk[i] = bf16_of(k[i]);
            for (size_t i = 0; i < v.size(); ++i) hv[i] = f16_of(v[i]), bv[i] = bf16_of(v[i]);
            for (uint32_t t = 0; t < N; t += T) {
                const uint32_t n = N - t < T ? N - t : T;
                for (int i = 0; i < 3; ++i)
                    if (kvp_append(c[i], 0, n, nullptr, k.data(), v.data()) != KVP_OK) {
                        fprintf(stderr, "append: %s\n", kvp_last_error(c[i]));
                        return 1;
                    }
            }
            std::vector<double> us[3];
            for (uint32_t r = 0; r < reps + 10; ++r) {
                const uint32_t t = r % T;
                double dt[3];
                for (int o = 0; o < 3; ++o) {
                    const int i = int((o + r) % 3);  // the order rotates: no call always goes first
                    const double t0 = now_s();
                    kvp_status st;
                    if (i == 0) st = kvp_decode(c[0], 0, &q[t * nq], &k[t * nkv], &v[t * nkv], out.data());
                    else if (i == 1)
                        st = kvp_decode_ex(c[1], 0, KVP_IO_F16, &hq[t * nq], &hk[t * nkv], &hv[t * nkv], hout.data());
                    else
                        st = kvp_decode_ex(c[2], 0, KVP_IO_BF16, &bq[t * nq], &bk[t * nkv], &bv[t * nkv], hout.data());
                    dt[i] = now_s() - t0;
                    if (st != KVP_OK) {
                        fprintf(stderr, "decode: %s\n", kvp_last_error(c[i]));
                        return 1;
                    }
                }
                if (r >= 10)  // warm-up
                    for (int i = 0; i < 3; ++i) us[i].push_back(1e6 * dt[i]);
            }
            const double a = median(us[0]), b = median(us[1]), d = median(us[2]);
            printf("%8u %6s %10.1f %10.1f %10.1f %9.3f %9.3f\n", N, kd.c_str(), a, b, d, b / a, d / a);
            fflush(stdout);
            for (int i = 0; i < 3; ++i) {
                kvp_destroy(c[i]);
                free(mem[i]);
            }
        }
    }
    return 0;
}
