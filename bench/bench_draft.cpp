// Speculative-decoding cost (issue 21): what kvp_draft_begin / draft calls / kvp_draft_commit
// cost per step, against the plain calls they stand for.
//
// A cache of an 8B-class layer geometry (32 q / 8 kv heads, head_dim 128; --layers, default 8)
// under --spec (default h2o at steady state) is filled to --fill tokens; then, per round, a draft
// of --draft tokens is verified by one kvp_prefill per layer (with outputs) and committed with
// accepted = 0..draft. Reported per layer (median over --rounds):
//   verify      the draft prefill of `draft` tokens with outputs
//   commit(a)   kvp_draft_commit(a): dropping the rejected rows (no copy) + the ordinary prefill of
//               the a accepted tokens without outputs (append, and the observation/prune of the
//               policy: the "deferred prune")
//   prefill(a)  that prefill alone on a twin in the same state (kvp_prefill without outputs): the
//               floor commit(a) cannot go below
//   decode      one ordinary kvp_decode, for scale
//   bench_draft [--layers L] [--fill N] [--draft K] [--rounds R] [--spec "..."]
#include <algorithm>
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

struct Cache {
    kvp_cache *c = nullptr;
    void *mem = nullptr;
    Cache(const kvp_config &cfg) {
        const size_t n = kvp_arena_size(&cfg);
        mem = aligned_alloc(64, (n + 63) / 64 * 64);
        char err[256];
        if (!mem || kvp_create_ex(&cfg, mem, n, &c, err, sizeof err) != KVP_OK) {
            fprintf(stderr, "create: %s\n", err);
            exit(1);
        }
    }
    ~Cache() {
        kvp_destroy(c);
        free(mem);
    }
};

void check(kvp_status st, kvp_cache *c, const char *what) {
    if (st != KVP_OK) {
        fprintf(stderr, "%s: %s\n", what, kvp_last_error(c));
        exit(1);
    }
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char **argv) {
    uint32_t L = 8, fill = 2000, K = 4, rounds = 40;
    std::string spec = "policy=h2o budget=2048 recent=32 capacity=2112";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers")) L = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--fill")) fill = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--draft")) K = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--rounds")) rounds = uint32_t(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--spec")) spec = argv[i + 1];
    }
    const kvp_model m = {L, 32, 8, 128, KVP_ROPE_NEOX, 0, 500000.0f};
    kvp_config cfg;
    kvp_config_default(&cfg, &m);
    char err[256];
    const std::string full = spec + " max_draft=" + std::to_string(K);
    if (kvp_config_apply(&cfg, full.c_str(), err, sizeof err) != KVP_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    Cache a(cfg), b(cfg);
    const size_t nq = size_t(m.n_q_heads) * m.head_dim, nkv = size_t(m.n_kv_heads) * m.head_dim;
    const uint32_t chunk = 256, T = std::max(chunk, K);
    std::vector<float> q(T * nq), k(T * nkv), v(T * nkv), out(T * nq);
    uint64_t s = 12345;
    auto rnd = [&s]() {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return float(int32_t(s >> 33) % 2000) / 1000.0f;
    };
    auto gen = [&](uint32_t n) {
        for (size_t i = 0; i < n * nq; ++i) q[i] = rnd() - 1.0f;
        for (size_t i = 0; i < n * nkv; ++i) k[i] = rnd() - 1.0f, v[i] = rnd() - 1.0f;
    };
    for (uint32_t t = 0; t < fill; t += chunk) {
        const uint32_t n = std::min(chunk, fill - t);
        gen(n);
        for (uint32_t l = 0; l < L; ++l) {
            check(kvp_prefill(a.c, l, n, nullptr, q.data(), k.data(), v.data(), nullptr, nullptr), a.c, "fill");
            check(kvp_prefill(b.c, l, n, nullptr, q.data(), k.data(), v.data(), nullptr, nullptr), b.c, "fill twin");
        }
    }
    std::vector<double> verify, dec;
    std::vector<std::vector<double>> commit(K + 1), pre(K + 1);
    for (uint32_t r = 0; r < rounds; ++r) {
        for (uint32_t acc = 0; acc <= K; ++acc) {
            gen(K);
            check(kvp_draft_begin(a.c), a.c, "begin");
            double t0 = now_s();
            for (uint32_t l = 0; l < L; ++l)
                check(kvp_prefill(a.c, l, K, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr), a.c, "verify");
            verify.push_back((now_s() - t0) / L);
            t0 = now_s();
            check(kvp_draft_commit(a.c, acc), a.c, "commit");
            commit[acc].push_back((now_s() - t0) / L);
            t0 = now_s();
            for (uint32_t l = 0; l < L && acc; ++l)
                check(kvp_prefill(b.c, l, acc, nullptr, q.data(), k.data(), v.data(), nullptr, nullptr), b.c, "twin");
            pre[acc].push_back((now_s() - t0) / L);
            gen(1);
            t0 = now_s();
            for (uint32_t l = 0; l < L; ++l) {
                check(kvp_decode(a.c, l, q.data(), k.data(), v.data(), out.data()), a.c, "decode");
                check(kvp_decode(b.c, l, q.data(), k.data(), v.data(), out.data() + nq), b.c, "decode twin");
                if (memcmp(out.data(), out.data() + nq, nq * sizeof(float)) != 0) {
                    fprintf(stderr, "decode after a commit differs from the twin\n");
                    return 1;
                }
            }
            dec.push_back((now_s() - t0) / (2 * L));
        }
    }
    printf("bench_draft spec=\"%s\" layers=%u fill=%u draft=%u rounds=%u layer_len=%u (per layer, median, us)\n",
           full.c_str(), L, fill, K, rounds, kvp_layer_len(a.c, 0));
    printf("verify(%u tokens, outputs) %.1f   decode %.1f\n", K, 1e6 * median(verify), 1e6 * median(dec));
    for (uint32_t acc = 0; acc <= K; ++acc)
        printf("accepted %u: commit %.1f   prefill of the accepted alone %.1f\n", acc, 1e6 * median(commit[acc]),
               1e6 * median(pre[acc]));
    return 0;
}
