// Decode-attention throughput against the machine's read bandwidth (DESIGN.md, "Performance
// model"), all in one run:
//
//   BM_ReadBandwidth/<bytes>/threads:<T>   plain read of a buffer of that size: SIMD loads,
//                                          OpenMP parallel for + reduction over T threads
//   BM_Kernel/<variant>/N:<N>              qk + softmax + pv of one GQA group (4 query rows,
//                                          d = 128) over N keys, per kernel variant, 1 thread
//   BM_Decode/N:<N>/threads:<T>            kvp_decode on a 32 q-head / 8 kv-head / d = 128
//                                          fp32 layer holding N tokens (policy=window window=N)
//
// bytes_per_second counts the K and V bytes attention must read (for the bandwidth benchmark:
// the buffer). Every attention benchmark also reports
//   bw_frac  = its bytes/s divided by the best BM_ReadBandwidth run (over repetitions) at the
//              same byte size and thread count
//   bw_GBps  = that bandwidth, GB/s (1e9 bytes; bytes_per_second prints in 2^30 units)
// The bandwidth runs are registered first; if a filter skips them, the attention benchmark
// measures the bandwidth itself before its timed loop.
//
//   build-kern/bench/bench_attention --benchmark_repetitions=5 --benchmark_counters_tabular=true
//
// On a shared machine with as many busy processes as cores, libgomp's spinning barrier makes
// the 2-thread runs wait for time slices (milliseconds per step); OMP_WAIT_POLICY=passive
// gives stable figures there.
#include "kernels/attn_f32.h"
#include "kvprune/kvprune.h"

#include <benchmark/benchmark.h>
#include <simde/x86/avx.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// ---- helpers ------------------------------------------------------------------------------

struct Rng {  // splitmix64
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    float uni() {  // [-1, 1)
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return (float)((z >> 40) * (2.0 / 16777216.0) - 1.0);
    }
};

struct AlignedBuf {
    float *p = nullptr;
    size_t n = 0;
    explicit AlignedBuf(size_t floats) : n(floats) {
        p = static_cast<float *>(std::aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64));
        if (!p) std::abort();
    }
    ~AlignedBuf() { std::free(p); }
    AlignedBuf(const AlignedBuf &) = delete;
    AlignedBuf &operator=(const AlignedBuf &) = delete;
};

void fill_random(float *x, size_t n, uint64_t seed) {
    Rng g(seed);
    for (size_t i = 0; i < n; ++i) x[i] = g.uni();
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- read bandwidth -------------------------------------------------------------------------

// Sum of x[0..n), n a multiple of 32: four independent 8-lane accumulators.
float read_block(const float *x, size_t n) {
    simde__m256 a0 = simde_mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 32) {
        a0 = simde_mm256_add_ps(a0, simde_mm256_load_ps(x + i));
        a1 = simde_mm256_add_ps(a1, simde_mm256_load_ps(x + i + 8));
        a2 = simde_mm256_add_ps(a2, simde_mm256_load_ps(x + i + 16));
        a3 = simde_mm256_add_ps(a3, simde_mm256_load_ps(x + i + 24));
    }
    float b[8];
    simde_mm256_storeu_ps(b, simde_mm256_add_ps(simde_mm256_add_ps(a0, a1), simde_mm256_add_ps(a2, a3)));
    return ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
}

const size_t kReadChunk = 16384;  // floats (64 KiB) per OpenMP work item

float read_all(const float *x, size_t n, int threads) {
    const long chunks = (long)(n / kReadChunk);
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
#endif
    for (long c = 0; c < chunks; ++c) total += read_block(x + (size_t)c * kReadChunk, kReadChunk);
    (void)threads;
    return total + read_block(x + (size_t)chunks * kReadChunk, n - (size_t)chunks * kReadChunk);
}

int effective_threads(int threads) {
#ifdef _OPENMP
    return threads;
#else
    (void)threads;
    return 1;  // no OpenMP: everything runs on one thread
#endif
}

struct BwEntry {
    size_t bytes;
    int threads;
    double bytes_per_s;
};
std::vector<BwEntry> g_bw;  // best read bandwidth seen per (bytes, threads)

void record_bw(size_t bytes, int threads, double bps) {
    for (BwEntry &e : g_bw)
        if (e.bytes == bytes && e.threads == threads) {
            if (bps > e.bytes_per_s) e.bytes_per_s = bps;
            return;
        }
    g_bw.push_back(BwEntry{bytes, threads, bps});
}

// Bandwidth for (bytes, threads): from the BM_ReadBandwidth run, else measured now (~0.3 s).
double bandwidth(size_t bytes, int threads) {
    for (const BwEntry &e : g_bw)
        if (e.bytes == bytes && e.threads == threads) return e.bytes_per_s;
    const size_t n = (bytes / sizeof(float) + 31) / 32 * 32;
    AlignedBuf buf(n);
    for (size_t i = 0; i < n; ++i) buf.p[i] = 1.0f;
    benchmark::DoNotOptimize(read_all(buf.p, n, threads));  // warm up
    size_t reps = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (t1 - t0 < 0.3) {
        benchmark::DoNotOptimize(read_all(buf.p, n, threads));
        ++reps;
        t1 = now_s();
    }
    const double bps = (double)(reps * n * sizeof(float)) / (t1 - t0);
    record_bw(bytes, threads, bps);
    return bps;
}

void BM_ReadBandwidth(benchmark::State &state, size_t bytes, int threads) {
    const size_t n = (bytes / sizeof(float) + 31) / 32 * 32;
    AlignedBuf buf(n);
    for (size_t i = 0; i < n; ++i) buf.p[i] = 1.0f;  // touch every page
    benchmark::DoNotOptimize(read_all(buf.p, n, threads));
    const double t0 = now_s();
    for (auto _ : state) benchmark::DoNotOptimize(read_all(buf.p, n, threads));
    const double t = now_s() - t0;
    const double total = (double)state.iterations() * (double)(n * sizeof(float));
    state.SetBytesProcessed((int64_t)total);
    record_bw(bytes, threads, total / t);
    state.counters["threads_used"] = effective_threads(threads);
}

void set_frac(benchmark::State &state, double bytes_total, double seconds, size_t bytes, int threads) {
    const double bw = bandwidth(bytes, threads);
    state.counters["bw_frac"] = (bytes_total / seconds) / bw;
    state.counters["bw_GBps"] = bw / 1e9;
}

// ---- kernel level ---------------------------------------------------------------------------

const uint32_t kHeadDim = 128;

// One GQA group: 4 query rows against N keys, qk + softmax + pv with one kernel variant.
void BM_Kernel(benchmark::State &state, const kvp::kern::AttnF32 *var, uint32_t n) {
    const uint32_t rows = 4, d = kHeadDim;
    AlignedBuf q((size_t)rows * d), k((size_t)n * d), v((size_t)n * d), logits((size_t)rows * n),
        out((size_t)rows * d);
    fill_random(q.p, q.n, 1);
    fill_random(k.p, k.n, 2);
    fill_random(v.p, v.n, 3);
    const float scale = 1.0f / std::sqrt((float)d);
    auto step = [&]() {
        var->qk(q.p, d, rows, k.p, d, n, d, scale, logits.p, n);
        float inv[4];
        for (uint32_t r = 0; r < rows; ++r) {
            float *l = logits.p + (size_t)r * n;
            inv[r] = 1.0f / var->expsum(l, n, var->max(l, n));
        }
        std::memset(out.p, 0, out.n * sizeof(float));
        var->pv(logits.p, n, rows, v.p, d, n, d, out.p, d);
        for (uint32_t r = 0; r < rows; ++r)
            for (uint32_t j = 0; j < d; ++j) out.p[(size_t)r * d + j] *= inv[r];
        benchmark::DoNotOptimize(out.p[0]);
    };
    step();
    const double t0 = now_s();
    for (auto _ : state) step();
    const double t = now_s() - t0;
    const size_t kv_bytes = (size_t)2 * n * d * sizeof(float);
    const double total = (double)state.iterations() * (double)kv_bytes;
    state.SetBytesProcessed((int64_t)total);
    set_frac(state, total, t, kv_bytes, 1);
}

// ---- C API decode ---------------------------------------------------------------------------

const uint32_t kQHeads = 32, kKvHeads = 8;

size_t decode_bytes(uint32_t n) { return (size_t)(n + 1) * kKvHeads * kHeadDim * sizeof(float) * 2; }

// A cache holding N tokens, built once per (N, threads) and reused by every run of the benchmark.
struct DecodeCache {
    uint32_t n = 0;
    int threads = 0;
    void *arena = nullptr;
    kvp_cache *c = nullptr;
    std::string error;
};
std::vector<DecodeCache *> g_caches;

DecodeCache *get_cache(uint32_t n, int threads) {
    for (DecodeCache *dc : g_caches)
        if (dc->n == n && dc->threads == threads) return dc;
    DecodeCache *dc = new DecodeCache;
    dc->n = n;
    dc->threads = threads;
    g_caches.push_back(dc);

    kvp_model model;
    std::memset(&model, 0, sizeof model);
    model.n_layers = 1;
    model.n_q_heads = kQHeads;
    model.n_kv_heads = kKvHeads;
    model.head_dim = kHeadDim;
    model.rope = KVP_ROPE_NEOX;
    model.rope_dim = 0;
    model.rope_theta = 10000.0f;
    kvp_config cfg;
    char err[256] = "";
    kvp_status s = kvp_config_default(&cfg, &model);
    if (s != KVP_OK) {
        dc->error = std::string("kvp_config_default: ") + kvp_status_str(s);
        return dc;
    }
    const std::string spec = "policy=window window=" + std::to_string(n) +
                             " threads=" + std::to_string(threads) + " kv_dtype=f32";
    s = kvp_config_apply(&cfg, spec.c_str(), err, sizeof err);
    if (s != KVP_OK) {
        dc->error = "kvp_config_apply(" + spec + "): " + err;
        return dc;
    }
    const size_t len = kvp_arena_size(&cfg);
    if (len == 0) {
        dc->error = "kvp_arena_size returned 0";
        return dc;
    }
    dc->arena = std::aligned_alloc(64, (len + 63) / 64 * 64);
    if (!dc->arena) {
        dc->error = "out of memory";
        return dc;
    }
    s = kvp_create(&cfg, dc->arena, len, &dc->c);
    if (s != KVP_OK) {
        dc->error = std::string("kvp_create: ") + kvp_status_str(s);
        dc->c = nullptr;
        return dc;
    }
    // N tokens of random K/V, appended in chunks
    const uint32_t chunk = 1024;
    const size_t row = (size_t)kKvHeads * kHeadDim;
    std::vector<float> k(chunk * row), v(chunk * row);
    for (uint32_t t0 = 0; t0 < n; t0 += chunk) {
        const uint32_t m = n - t0 < chunk ? n - t0 : chunk;
        fill_random(k.data(), m * row, 100 + t0);
        fill_random(v.data(), m * row, 200 + t0);
        s = kvp_append(dc->c, 0, m, nullptr, k.data(), v.data());
        if (s != KVP_OK) {
            dc->error = std::string("kvp_append: ") + kvp_status_str(s) + ": " + kvp_last_error(dc->c);
            return dc;
        }
    }
    if (kvp_layer_len(dc->c, 0) != n) dc->error = "layer length after append != N";
    return dc;
}

void BM_Decode(benchmark::State &state, uint32_t n, int threads) {
    DecodeCache *dc = get_cache(n, threads);
    if (!dc->error.empty()) {
        state.SkipWithError(dc->error.c_str());
        return;
    }
    std::vector<float> q((size_t)kQHeads * kHeadDim), k((size_t)kKvHeads * kHeadDim),
        v((size_t)kKvHeads * kHeadDim), out((size_t)kQHeads * kHeadDim);
    fill_random(q.data(), q.size(), 7);
    fill_random(k.data(), k.size(), 8);
    fill_random(v.data(), v.size(), 9);
    kvp_status s = kvp_decode(dc->c, 0, q.data(), k.data(), v.data(), out.data());  // warm up
    if (s != KVP_OK) {
        state.SkipWithError((std::string("kvp_decode: ") + kvp_last_error(dc->c)).c_str());
        return;
    }
    const double t0 = now_s();
    for (auto _ : state) {
        s = kvp_decode(dc->c, 0, q.data(), k.data(), v.data(), out.data());
        benchmark::DoNotOptimize(out[0]);
    }
    const double t = now_s() - t0;
    if (s != KVP_OK) {
        state.SkipWithError((std::string("kvp_decode: ") + kvp_last_error(dc->c)).c_str());
        return;
    }
    if (kvp_layer_len(dc->c, 0) != n) {
        state.SkipWithError("window did not keep the layer at N tokens");
        return;
    }
    const double total = (double)state.iterations() * (double)decode_bytes(n);
    state.SetBytesProcessed((int64_t)total);
    set_frac(state, total, t, decode_bytes(n), threads);
    state.counters["threads_used"] = effective_threads(threads);
}

}  // namespace

int main(int argc, char **argv) {
    const uint32_t sizes[] = {512, 4096, 32768};
    const int thread_counts[] = {1, 2};
    using kvp::kern::AttnF32;
    const AttnF32 *variants[] = {kvp::kern::attn_f32_scalar(), kvp::kern::attn_f32_simde(),
                                 kvp::kern::attn_f32_avx2()};

    // bandwidth first (the attention benchmarks read their results)
    for (uint32_t n : sizes)
        benchmark::RegisterBenchmark(
            ("BM_ReadBandwidth/" + std::to_string((size_t)2 * n * kHeadDim * sizeof(float)) + "/threads:1").c_str(),
            BM_ReadBandwidth, (size_t)2 * n * kHeadDim * sizeof(float), 1)
            ->UseRealTime();
    for (uint32_t n : sizes)
        for (int t : thread_counts)
            benchmark::RegisterBenchmark(
                ("BM_ReadBandwidth/" + std::to_string(decode_bytes(n)) + "/threads:" + std::to_string(t)).c_str(),
                BM_ReadBandwidth, decode_bytes(n), t)
                ->UseRealTime();
    for (const AttnF32 *var : variants) {
        if (!var) continue;
        for (uint32_t n : sizes)
            benchmark::RegisterBenchmark(
                (std::string("BM_Kernel/") + var->name + "/N:" + std::to_string(n)).c_str(), BM_Kernel, var, n)
                ->UseRealTime();
    }
    for (uint32_t n : sizes)
        for (int t : thread_counts)
            benchmark::RegisterBenchmark(
                ("BM_Decode/N:" + std::to_string(n) + "/threads:" + std::to_string(t)).c_str(), BM_Decode, n, t)
                ->UseRealTime();

    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("kernel_best", kvp::kern::attn_f32_best()->name);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    for (DecodeCache *dc : g_caches) {
        kvp_destroy(dc->c);
        std::free(dc->arena);
        delete dc;
    }
    return 0;
}
