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
// Sweep mode (--sweep, see "sweep mode" below) prints one table of decode over N = 256..65536
// and prefill against the FMA peak, and writes it as CSV for bench/results/. Crossover mode
// (--crossover, see "thread crossover mode") measures when a second thread pays for itself.
// Roofline mode (--roofline, see "roofline mode") puts decode beside the best read of the same
// bytes and the FMA peak, per N and thread count, with the kernels' share of the step.
//
// The bandwidth runs are registered first; if a filter skips them, the attention benchmark
// measures the bandwidth itself before its timed loop.
//
//   build-kern/bench/bench_attention --benchmark_repetitions=5 --benchmark_counters_tabular=true
//
// On a shared machine with as many busy processes as cores, libgomp's spinning barrier makes
// the 2-thread runs wait for time slices (milliseconds per step); OMP_WAIT_POLICY=passive
// gives stable figures there.
#include "kernels/attn_f32.h"
#include "kernels/attn_q.h"
#include "bench_util.h"
#include "isa.h"
// KVP_BENCH_POOL: the library has its worker pool (src/threads.h) and the work estimate
// (cache.h step_work). Without it (e.g. this file built against an older library to measure a
// "before") those rows and columns are left out / 0.
#ifdef KVP_BENCH_POOL
#include "cache.h"
#include "threads.h"
#define KVP_BENCH_WORK(c, n, decode) \
    kvp::step_work(c, 0, n, (decode) ? kvp::StepMode::kDecode : kvp::StepMode::kPrefill, true)
#define KVP_BENCH_PAR_WORK std::to_string(kvp::kParallelWork)
#else
#define KVP_BENCH_WORK(c, n, decode) ((void)(c), 0.0)
#define KVP_BENCH_PAR_WORK std::string("(none: OpenMP over KV heads)")
#endif
#include "kvprune/kvprune.h"

#include <benchmark/benchmark.h>
#include <simde/x86/avx.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// ---- helpers (bench_util.h) ------------------------------------------------------------------

using kvpbench::AlignedBuf;
using kvpbench::arena_alloc;
using kvpbench::fill_random;
using kvpbench::kReadChunk;
using kvpbench::now_s;
using kvpbench::read_all;
using kvpbench::read_block;
using kvpbench::Rng;

// ---- read bandwidth -------------------------------------------------------------------------

// Sum of x[0..n) split into `threads` equal contiguous parts, one per thread (n a multiple of
// 32 * threads); threads == 1 runs without entering OpenMP, as the library does.
float read_split(const float *x, size_t n, int threads) {
    if (threads <= 1) return read_block(x, n);
    float total = 0.0f;
    const size_t part = n / (size_t)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += read_block(x + (size_t)omp_get_thread_num() * part, part);
#else
    for (int t = 0; t < threads; ++t) total += read_block(x + (size_t)t * part, part);
#endif
    return total;
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
            inv[r] = 1.0f / var->expsum(l, n, var->max(l, n), nullptr);
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
    dc->arena = arena_alloc(len);
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
    // N tokens of random K/V
    if (!kvpbench::append_random(dc->c, 1, n, (size_t)kKvHeads * kHeadDim, &dc->error)) return dc;
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


// ---- sweep mode -----------------------------------------------------------------------------
//
// bench_attention --sweep [--reps R] [--time S] [--nmin N] [--nmax N] [--threads 1,2]
//                         [--no-prefill] [--label L] [--csv PATH]
//
// One table (stdout) and the same rows as CSV (--csv, with the CPU model, date, kernel, load
// average and OMP_WAIT_POLICY as '#' comment lines):
//   decode  rows: kvp_decode of one token over N cached tokens (32 q / 8 kv heads, d 128, f32,
//           policy=window window=N), N = nmin..nmax in powers of 2, threads 1 and 2. bytes = the
//           K+V rows one step reads; frac = (bytes/s of decode) / (bytes/s of a plain SIMD read of
//           a warm buffer of the same size with the same thread count). Each repetition measures
//           the read and then the decode back to back (each for --time seconds after a warm-up),
//           so a ratio compares figures taken within a fraction of a second of each other; the
//           table gives medians over repetitions (frac: median of the per-repetition ratios, with
//           their min and max).
//   prefill rows: kvp_prefill of a causal chunk of 512 tokens over P = 0 and 4096 cached tokens
//           (same geometry). GFLOPS counts 4*d flops per (query head, visible key) pair (qk and
//           pv multiply-adds; exp, max and masked key blocks are not counted); peak = the FMA
//           peak of the kernel's ISA measured in the same run with the same thread count
//           (isa.h), frac_peak = GFLOPS / peak.
//   Decode rows also give the roofline: decode does flops_per_byte = 2 * n_q_heads / (2 *
//   n_kv_heads) = 2 fused multiply-add flops per byte of K+V, so it cannot run faster than
//   roof = min(read GB/s, FMA peak / flops_per_byte); frac_roof = GB/s / roof. Where the read
//   bandwidth exceeds the FMA bound (cache-resident N), frac = frac_roof * roof / read GB/s
//   is capped below 1 by the core's FMA throughput, not by the kernel.
//
// Run on an otherwise idle machine with OMP_WAIT_POLICY=passive (see the note at the top).

struct SweepOpts {
    int reps = 5;
    double time_s = 0.15;
    uint32_t nmin = 256, nmax = 65536;
    std::vector<int> threads{1, 2};
    bool prefill = true;
    bool extra = true;  // the MQA, 2-KV-head and small-model rows
    std::string label = "run";
    std::string csv;
};

struct SweepRow {
    std::string kind;  // decode | prefill
    uint32_t n;        // cached tokens (decode: attends over n + 1)
    int threads;
    double bytes;      // K+V bytes read per step
    double ms;         // median ms per step
    double gbps;       // bytes / median time, 1e9
    double bw_gbps;    // median read bandwidth of the same size (decode)
    double frac, frac_lo, frac_hi;
    double gflops, peak_gflops, frac_peak;
    double roof_gbps, frac_roof;  // decode: min(read, FMA peak / flops per byte), GB/s over it
};

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string cpu_model() {
    std::FILE *f = std::fopen("/proc/cpuinfo", "r");
    if (!f) return "unknown";
    char line[512];
    std::string model = "unknown", family, modelno;
    while (std::fgets(line, sizeof line, f)) {
        std::string s(line);
        const size_t colon = s.find(':');
        if (colon == std::string::npos) continue;
        std::string key = s.substr(0, colon), val = s.substr(colon + 1);
        while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
        while (!val.empty() && (val.front() == ' ')) val.erase(0, 1);
        while (!val.empty() && (val.back() == '\n' || val.back() == ' ')) val.pop_back();
        if (key == "model name" && model == "unknown") model = val;
        if (key == "cpu family" && family.empty()) family = val;
        if (key == "model" && modelno.empty()) modelno = val;
        if (key == "processor" && val != "0") break;
    }
    std::fclose(f);
    if (!family.empty()) model += " (family " + family + " model " + modelno + ")";
    return model;
}

std::string load_average() {
    std::FILE *f = std::fopen("/proc/loadavg", "r");
    if (!f) return "unknown";
    char buf[128] = "";
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
    std::string s(buf);
    // first three fields
    size_t pos = 0;
    for (int i = 0; i < 3 && pos != std::string::npos; ++i) pos = s.find(' ', pos + 1);
    return pos == std::string::npos ? s : s.substr(0, pos);
}

// Read bandwidth (bytes/s) of a warm buffer, measured for about `secs` after one warm-up pass.
double read_bw_once(const AlignedBuf &buf, size_t n, int threads, double secs) {
    benchmark::DoNotOptimize(read_all(buf.p, n, threads));
    size_t reps = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (reps < 2 || t1 - t0 < secs) {
        benchmark::DoNotOptimize(read_all(buf.p, n, threads));
        ++reps;
        t1 = now_s();
    }
    return (double)(reps * n * sizeof(float)) / (t1 - t0);
}

double fma_peak_gflops(int threads, double secs) {
    const std::string isa = kvp::kern::attn_f32_best()->name;
    float (*fn)(uint64_t) = &kvpbench::fma_peak_simde;
#ifdef KVP_BENCH_AVX2
    if (isa == "avx2") fn = &kvpbench::fma_peak_avx2;
#endif
#ifdef KVP_BENCH_AVX512
    if (isa == "avx512") fn = &kvpbench::fma_peak_avx512;
#endif
    const uint64_t iters = 1u << 22;
    double best = 0.0;
    const double t_end = now_s() + secs;
    do {
        const double t0 = now_s();
        float sink = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : sink)
#endif
        sink += fn(iters);
        const double t = now_s() - t0;
        benchmark::DoNotOptimize(sink);
        const double gf = (double)threads * (double)iters * (double)kvpbench::kFmaFlopsPerIter / t / 1e9;
        if (gf > best) best = gf;
    } while (now_s() < t_end);
#ifndef _OPENMP
    best /= threads;  // no OpenMP: one thread ran the loop once
#endif
    return best;
}

// Decode geometry of a sweep row.
struct SweepGeo {
    const char *kind;  // CSV kind: decode (the main table), decode-mqa, decode-kv2, small
    uint32_t layers, nq, nkv, hd;
    size_t bytes(uint32_t n) const { return (size_t)layers * (n + 1) * nkv * hd * sizeof(float) * 2; }
    double flops(uint32_t n) const { return 4.0 * hd * nq * layers * (double)(n + 1); }
};
const SweepGeo kMainGeo{"decode", 1, kQHeads, kKvHeads, kHeadDim};

kvp_cache *make_cache(const std::string &spec, void **arena, std::string *err, const SweepGeo &g = kMainGeo) {
    kvp_model model;
    std::memset(&model, 0, sizeof model);
    model.n_layers = g.layers;
    model.n_q_heads = g.nq;
    model.n_kv_heads = g.nkv;
    model.head_dim = g.hd;
    model.rope = KVP_ROPE_NEOX;
    model.rope_theta = 10000.0f;
    kvp_config cfg;
    char e[256] = "";
    if (kvp_config_default(&cfg, &model) != KVP_OK || kvp_config_apply(&cfg, spec.c_str(), e, sizeof e) != KVP_OK) {
        *err = "config (" + spec + "): " + e;
        return nullptr;
    }
    // KVP_BENCH_ROPE=yarn: a caller RoPE table (YaRN, factor 4, original context 4096) and its
    // attention factor (issue 21: a decode with a table must cost what one without does).
    std::vector<double> table;
    if (const char *rt = std::getenv("KVP_BENCH_ROPE")) {
        if (std::strcmp(rt, "yarn") == 0) {
            table.resize(g.hd / 2);
            float a = 1.0f;
            if (kvp_rope_freqs_yarn(table.data(), g.hd / 2, 10000.0, 4.0, 4096.0, 32.0, 1.0, &a, e, sizeof e) != KVP_OK) {
                *err = std::string("rope table: ") + e;
                return nullptr;
            }
            cfg.rope_attn_factor = a;
        }
    }
    const size_t len = kvp_arena_size(&cfg);
    *arena = len ? arena_alloc(len) : nullptr;
    kvp_cache *c = nullptr;
    if (!*arena || kvp_create_rope(&cfg, table.empty() ? nullptr : table.data(), (uint32_t)table.size(), *arena, len, &c,
                                   e, sizeof e) != KVP_OK) {
        *err = "kvp_create (" + spec + ") failed";
        std::free(*arena);
        *arena = nullptr;
        return nullptr;
    }
    return c;
}

bool append_random(kvp_cache *c, uint32_t n, std::string *err, const SweepGeo &g = kMainGeo) {
    return kvpbench::append_random(c, g.layers, n, (size_t)g.nkv * g.hd, err);
}

bool sweep_decode(const SweepOpts &o, uint32_t n, int threads, double peak, SweepRow *row, std::string *err,
                  const SweepGeo &g = kMainGeo) {
    void *arena = nullptr;
    kvp_cache *c = make_cache("policy=window window=" + std::to_string(n) + " threads=" + std::to_string(threads) +
                                  " kv_dtype=f32",
                              &arena, err, g);
    if (!c) return false;
    bool ok = append_random(c, n, err, g);
    const size_t bytes = g.bytes(n);
    const size_t nf = (bytes / sizeof(float) + kReadChunk - 1) / kReadChunk * kReadChunk;
    AlignedBuf buf(nf);
    for (size_t i = 0; i < nf; ++i) buf.p[i] = 1.0f;
    std::vector<float> q((size_t)g.nq * g.hd), k((size_t)g.nkv * g.hd), v((size_t)g.nkv * g.hd),
        out((size_t)g.nq * g.hd);
    fill_random(q.data(), q.size(), 7);
    fill_random(k.data(), k.size(), 8);
    fill_random(v.data(), v.size(), 9);
    auto step = [&]() {
        bool good = true;
        for (uint32_t l = 0; l < g.layers; ++l)
            good = good && kvp_decode(c, l, q.data(), k.data(), v.data(), out.data()) == KVP_OK;
        return good;
    };
    std::vector<double> ms, bw, frac;
    for (int r = 0; ok && r < o.reps; ++r) {
        const double bps = read_bw_once(buf, nf, threads, o.time_s);
        for (int w = 0; w < 2 && ok; ++w) ok = step();
        size_t steps = 0;
        const double t0 = now_s();
        double t1 = t0;
        while (ok && (steps < 3 || t1 - t0 < o.time_s)) {
            ok = step();
            benchmark::DoNotOptimize(out[0]);
            ++steps;
            t1 = now_s();
        }
        const double step_s = (t1 - t0) / (double)steps;
        ms.push_back(step_s * 1e3);
        bw.push_back(bps);
        frac.push_back((double)bytes / step_s / bps);
    }
    if (!ok && err->empty()) *err = std::string("kvp_decode: ") + kvp_last_error(c);
    if (ok && kvp_layer_len(c, 0) != n) {
        ok = false;
        *err = "window did not keep the layer at N tokens";
    }
    kvp_destroy(c);
    std::free(arena);
    if (!ok) return false;
    row->kind = g.kind;
    row->n = n;
    row->threads = threads;
    row->bytes = (double)bytes;
    row->ms = median(ms);
    row->gbps = (double)bytes / (row->ms * 1e-3) / 1e9;
    row->bw_gbps = median(bw) / 1e9;
    row->frac = median(frac);
    row->frac_lo = *std::min_element(frac.begin(), frac.end());
    row->frac_hi = *std::max_element(frac.begin(), frac.end());
    row->gflops = g.flops(n) / (row->ms * 1e-3) / 1e9;
    row->peak_gflops = peak;
    row->frac_peak = row->gflops / peak;
    const double flops_per_byte = g.flops(n) / (double)bytes;
    row->roof_gbps = std::min(row->bw_gbps, peak / flops_per_byte);
    row->frac_roof = row->gbps / row->roof_gbps;
    return true;
}

bool sweep_prefill(const SweepOpts &o, uint32_t cached, int threads, double peak, SweepRow *row, std::string *err) {
    const uint32_t chunk = 512;
    void *arena = nullptr;
    kvp_cache *c = make_cache("policy=window window=" + std::to_string(cached + chunk) +
                                  " threads=" + std::to_string(threads) + " kv_dtype=f32",
                              &arena, err);
    if (!c) return false;
    std::vector<float> q((size_t)chunk * kQHeads * kHeadDim), k((size_t)chunk * kKvHeads * kHeadDim),
        v((size_t)chunk * kKvHeads * kHeadDim), out((size_t)chunk * kQHeads * kHeadDim);
    fill_random(q.data(), q.size(), 17);
    fill_random(k.data(), k.size(), 18);
    fill_random(v.data(), v.size(), 19);
    double visible = 0;  // (query token, key) pairs under the causal mask
    for (uint32_t i = 0; i < chunk; ++i) visible += (double)cached + i + 1;
    const double flops = 4.0 * kHeadDim * kQHeads * visible;
    std::vector<double> ms;
    bool ok = true;
    for (int r = 0; ok && r < o.reps + 1; ++r) {  // the first one warms up
        ok = kvp_reset(c) == KVP_OK && append_random(c, cached, err);
        const double t0 = now_s();
        ok = ok && kvp_prefill(c, 0, chunk, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr) == KVP_OK;
        const double t = now_s() - t0;
        benchmark::DoNotOptimize(out[0]);
        if (r > 0) ms.push_back(t * 1e3);
    }
    if (!ok && err->empty()) *err = std::string("kvp_prefill: ") + kvp_last_error(c);
    kvp_destroy(c);
    std::free(arena);
    if (!ok) return false;
    row->kind = "prefill";
    row->n = cached;
    row->threads = threads;
    row->bytes = (double)(cached + chunk) * kKvHeads * kHeadDim * sizeof(float) * 2;
    row->ms = median(ms);
    row->gbps = row->bytes / (row->ms * 1e-3) / 1e9;
    row->bw_gbps = 0.0;
    row->frac = row->frac_lo = row->frac_hi = 0.0;
    row->gflops = flops / (row->ms * 1e-3) / 1e9;
    row->peak_gflops = peak;
    row->frac_peak = row->gflops / peak;
    row->roof_gbps = row->frac_roof = 0.0;
    return true;
}

std::vector<std::string> split(const std::string &s, char sep) {
    std::vector<std::string> out;
    size_t a = 0;
    while (a <= s.size()) {
        const size_t b = s.find(sep, a);
        out.push_back(s.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) break;
        a = b + 1;
    }
    return out;
}

int run_sweep(int argc, char **argv) {
    SweepOpts o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--sweep") continue;
        else if (a == "--reps") o.reps = std::atoi(next().c_str());
        else if (a == "--time") o.time_s = std::atof(next().c_str());
        else if (a == "--nmin") o.nmin = (uint32_t)std::atol(next().c_str());
        else if (a == "--nmax") o.nmax = (uint32_t)std::atol(next().c_str());
        else if (a == "--threads") {
            o.threads.clear();
            for (const std::string &t : split(next(), ',')) o.threads.push_back(std::atoi(t.c_str()));
        } else if (a == "--no-prefill") o.prefill = false;
        else if (a == "--no-extra") o.extra = false;
        else if (a == "--label") o.label = next();
        else if (a == "--csv") o.csv = next();
        else {
            std::fprintf(stderr,
                         "usage: %s --sweep [--reps R] [--time S] [--nmin N] [--nmax N] [--threads 1,2] "
                         "[--no-prefill] [--no-extra] [--label L] [--csv PATH]\n",
                         argv[0]);
            return 2;
        }
    }
    if (o.reps < 1 || o.nmin < 1 || o.nmax < o.nmin || o.threads.empty()) {
        std::fprintf(stderr, "bad sweep options\n");
        return 2;
    }
    char date[64] = "";
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
    const char *wait = std::getenv("OMP_WAIT_POLICY");
    std::vector<std::string> header;
    header.push_back("label: " + o.label);
    header.push_back("cpu: " + cpu_model());
    header.push_back(std::string("date: ") + date);
    header.push_back(std::string("kernel: ") + kvp::kern::attn_f32_best()->name);
    header.push_back(std::string("OMP_WAIT_POLICY: ") + (wait ? wait : "(unset)"));
    header.push_back("geometry: 32 q heads, 8 kv heads, head_dim 128, f32; decode policy=window window=N; "
                     "decode-mqa 8 q / 1 kv, decode-kv2 8 q / 2 kv (head_dim 128), small 2 layers x 4 q / 2 kv, "
                     "head_dim 32 (bytes and ms per step of both layers)");
    header.push_back(std::string("kParallelWork: ") + KVP_BENCH_PAR_WORK);
    header.push_back(std::string("pages: ") + kvpbench::arena_pages());
    header.push_back("reps: " + std::to_string(o.reps) + ", seconds per measurement: " + std::to_string(o.time_s));
    header.push_back("loadavg before: " + load_average());
    for (const std::string &h : header) std::printf("# %s\n", h.c_str());
    std::vector<double> peaks;  // FMA peak GFLOPS per entry of o.threads
    for (int t : o.threads) peaks.push_back(fma_peak_gflops(t, 0.3));
    for (size_t i = 0; i < peaks.size(); ++i)
        header.push_back("FMA peak, " + std::to_string(o.threads[i]) + " thread(s): " + std::to_string(peaks[i]) +
                         " GFLOPS");
    for (size_t i = 0; i < peaks.size(); ++i) std::printf("# %s\n", header[header.size() - peaks.size() + i].c_str());
    std::printf("%-8s %6s %3s %10s %9s %7s %7s %6s %13s %7s %6s %8s %8s %6s\n", "kind", "N", "thr", "bytes",
                "ms/step", "GB/s", "readGB/s", "frac", "frac[min,max]", "roofGB/s", "f_roof", "GFLOPS", "peak",
                "f_peak");
    std::fflush(stdout);
    std::vector<SweepRow> rows;
    auto print = [](const SweepRow &r) {
        if (r.kind != "prefill")
            std::printf("%-8s %6u %3d %10.0f %9.3f %7.2f %7.2f %6.3f [%5.3f,%5.3f] %8.2f %6.3f %8.2f %8.2f %6.3f\n",
                        r.kind.c_str(), r.n, r.threads, r.bytes, r.ms, r.gbps, r.bw_gbps, r.frac, r.frac_lo,
                        r.frac_hi, r.roof_gbps, r.frac_roof, r.gflops, r.peak_gflops, r.frac_peak);
        else
            std::printf("%-8s %6u %3d %10.0f %9.3f %7.2f %7s %6s %13s %8s %6s %8.2f %8.2f %6.3f\n", r.kind.c_str(),
                        r.n, r.threads, r.bytes, r.ms, r.gbps, "-", "-", "-", "-", "-", r.gflops, r.peak_gflops,
                        r.frac_peak);
        std::fflush(stdout);
    };
    for (uint32_t n = o.nmin; n <= o.nmax; n *= 2) {
        for (size_t ti = 0; ti < o.threads.size(); ++ti) {
            const int t = o.threads[ti];
            SweepRow r;
            std::string err;
            if (!sweep_decode(o, n, t, peaks[ti], &r, &err)) {
                std::fprintf(stderr, "decode N=%u threads=%d: %s\n", n, t, err.c_str());
                return 1;
            }
            print(r);
            rows.push_back(r);
        }
        if (n > 0x7fffffffu) break;
    }
    if (o.extra) {
        // Few KV heads (split-K decode: threads share one head's tokens) and the small
        // model (2 layers of 4 q / 2 kv heads, head_dim 32, 64 tokens; bytes and ms are per step
        // of both layers): ratios against the read bandwidth of the same bytes, as above.
        const SweepGeo mqa{"decode-mqa", 1, 8, 1, kHeadDim}, kv2{"decode-kv2", 1, 8, 2, kHeadDim},
            small{"small", 2, 4, 2, 32};
        struct Extra {
            const SweepGeo *g;
            uint32_t n;
        };
        std::vector<Extra> ex;
        for (const SweepGeo *g : {&mqa, &kv2})
            for (uint32_t n = o.nmin > 1024 ? o.nmin : 1024; n <= o.nmax; n *= 4) ex.push_back(Extra{g, n});
        ex.push_back(Extra{&small, 64});
        for (const Extra &e : ex)
            for (size_t ti = 0; ti < o.threads.size(); ++ti) {
                SweepRow r;
                std::string err;
                if (!sweep_decode(o, e.n, o.threads[ti], peaks[ti], &r, &err, *e.g)) {
                    std::fprintf(stderr, "%s N=%u threads=%d: %s\n", e.g->kind, e.n, o.threads[ti], err.c_str());
                    return 1;
                }
                print(r);
                rows.push_back(r);
            }
    }
    if (o.prefill)
        for (size_t ti = 0; ti < o.threads.size(); ++ti) {
            const int t = o.threads[ti];
            const double peak = peaks[ti];
            for (uint32_t cached : {0u, 4096u}) {
                SweepRow r;
                std::string err;
                if (!sweep_prefill(o, cached, t, peak, &r, &err)) {
                    std::fprintf(stderr, "prefill P=%u threads=%d: %s\n", cached, t, err.c_str());
                    return 1;
                }
                print(r);
                rows.push_back(r);
            }
        }
    header.push_back("loadavg after: " + load_average());
    std::printf("# %s\n", header.back().c_str());
    if (!o.csv.empty()) {
        std::FILE *f = std::fopen(o.csv.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "cannot write %s\n", o.csv.c_str());
            return 1;
        }
        for (const std::string &h : header) std::fprintf(f, "# %s\n", h.c_str());
        std::fprintf(f, "kind,N,threads,bytes,ms_per_step,GBps,read_GBps,frac_bw,frac_bw_min,frac_bw_max,GFLOPS,"
                        "peak_GFLOPS,frac_peak,roof_GBps,frac_roof\n");
        for (const SweepRow &r : rows)
            std::fprintf(f, "%s,%u,%d,%.0f,%.4f,%.3f,%.3f,%.4f,%.4f,%.4f,%.3f,%.3f,%.4f,%.3f,%.4f\n", r.kind.c_str(),
                         r.n, r.threads, r.bytes, r.ms, r.gbps, r.bw_gbps, r.frac, r.frac_lo, r.frac_hi, r.gflops,
                         r.peak_gflops, r.frac_peak, r.roof_gbps, r.frac_roof);
        std::fclose(f);
        std::printf("# wrote %s\n", o.csv.c_str());
    }
    return 0;
}

// ---- thread crossover mode ------------------------------------------------------------------
//
// bench_attention --crossover [--reps R] [--time S] [--csv PATH]
//
// When does a second thread pay for itself? Every row times one thing three ways, the
// repetitions alternating so that all see the same machine: 1 thread, 2 threads on every call
// (KVP_PAR_WORK=0 at create: the parallel path forced), and 2 threads as the library chooses
// per call (the default crossover, src/cache.cpp kParallelWork):
//   region  the bare round trip of the library's worker pool (src/threads.h: wake a sleeping
//           worker, run an empty job on both, join) next to an OpenMP parallel region of an
//           empty body (the bench's own libgomp, OMP_WAIT_POLICY as set), and a plain read of B
//           bytes with 1 thread vs split over 2 OpenMP threads;
//   decode  kvp_decode through the C API for the small model (2 layers of 4 q / 2 kv
//           heads, head_dim 32; one row = both layers), the sweep's geometry (32 q / 8 kv,
//           head_dim 128) and MQA (8 q / 1 kv, head_dim 128: split-K decode), N tokens;
//   prefill kvp_prefill of a chunk of n tokens over nothing cached (32 q / 8 kv, d 128).
// `work` is the library's estimate of the call (cache.h step_work: bytes of K+V read, or half
// the flops when that is more), the unit of kParallelWork: the crossover is the smallest work
// from which the forced 2-thread time stays below the 1-thread time.
// Table to stdout, CSV with --csv.

double omp_region_us(int threads, double secs) {
    std::vector<double> best;
    size_t reps = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (reps < 100 || t1 - t0 < secs) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
        { benchmark::ClobberMemory(); }
#endif
        ++reps;
        t1 = now_s();
    }
    (void)threads;
    return (t1 - t0) / (double)reps * 1e6;
}

struct XRow {
    std::string what;
    double n, bytes, work, t1_us, t2_us, ta_us;  // ta: 2 threads, automatic (0: not measured)
};

// Time per call (us) of each of fns, median over `reps` windows of `secs` each, alternating.
template <class... F>
std::vector<double> alternate(int reps, double secs, F... fns) {
    std::vector<std::function<void()>> fs{fns...};
    std::vector<std::vector<double>> t(fs.size());
    auto window = [&](const std::function<void()> &fn) {
        fn();
        size_t n = 0;
        const double t0 = now_s();
        double t1 = t0;
        while (n < 3 || t1 - t0 < secs) {
            fn();
            ++n;
            t1 = now_s();
        }
        return (t1 - t0) / (double)n * 1e6;
    };
    for (int r = 0; r < reps; ++r)
        for (size_t i = 0; i < fs.size(); ++i) t[i].push_back(window(fs[i]));
    std::vector<double> out;
    for (auto &x : t) out.push_back(median(x));
    return out;
}

// A cache of the given geometry with N tokens in every layer. force: every call on all threads.
kvp_cache *x_cache(uint32_t layers, uint32_t nq, uint32_t nkv, uint32_t hd, uint32_t cap, uint32_t n, int threads,
                   bool force, void **arena) {
    kvp_model model;
    std::memset(&model, 0, sizeof model);
    model.n_layers = layers;
    model.n_q_heads = nq;
    model.n_kv_heads = nkv;
    model.head_dim = hd;
    model.rope = KVP_ROPE_NEOX;
    model.rope_theta = 10000.0f;
    kvp_config cfg;
    char e[256] = "";
    const std::string spec = "policy=window window=" + std::to_string(cap) + " threads=" + std::to_string(threads);
    if (kvp_config_default(&cfg, &model) != KVP_OK || kvp_config_apply(&cfg, spec.c_str(), e, sizeof e) != KVP_OK)
        return nullptr;
    const size_t len = kvp_arena_size(&cfg);
    *arena = len ? arena_alloc(len) : nullptr;
    kvp_cache *c = nullptr;
    if (force) setenv("KVP_PAR_WORK", "0", 1);
    const bool ok = *arena && kvp_create(&cfg, *arena, len, &c) == KVP_OK;
    if (force) unsetenv("KVP_PAR_WORK");
    if (!ok) return nullptr;
    if (n) {
        const size_t row = (size_t)nkv * hd;
        std::vector<float> k((size_t)n * row), v((size_t)n * row);
        fill_random(k.data(), k.size(), 3);
        fill_random(v.data(), v.size(), 4);
        for (uint32_t l = 0; l < layers; ++l)
            if (kvp_append(c, l, n, nullptr, k.data(), v.data()) != KVP_OK) return nullptr;
    }
    return c;
}

int run_crossover(int argc, char **argv) {
    int reps = 7;
    double secs = 0.03;
    std::string csv;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--crossover") continue;
        if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (a == "--time" && i + 1 < argc) secs = std::atof(argv[++i]);
        else if (a == "--csv" && i + 1 < argc) csv = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s --crossover [--reps R] [--time S] [--csv PATH]\n", argv[0]);
            return 2;
        }
    }
    const char *wait = std::getenv("OMP_WAIT_POLICY");
    char date[64] = "";
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
    std::vector<std::string> header{"cpu: " + cpu_model(), std::string("date: ") + date,
                                    std::string("kernel: ") + kvp::kern::attn_f32_best()->name,
                                    std::string("OMP_WAIT_POLICY (bench's own reads only): ") + (wait ? wait : "(unset)"),
                                    "kParallelWork: " + KVP_BENCH_PAR_WORK,
                                    "loadavg before: " + load_average()};
    for (const std::string &h : header) std::printf("# %s\n", h.c_str());
    std::vector<XRow> rows;
#ifdef KVP_BENCH_POOL
    {
        const size_t pb = kvp::pool_bytes(2, false);
        void *mem = std::aligned_alloc(64, (pb + 63) / 64 * 64);
        int err = 0;
        kvp::ThreadPool *tp = kvp::pool_start(2, false, mem, &err);
        auto noop = [](void *, uint32_t) {};
        const std::vector<double> t = alternate(
            reps, secs, [&] { for (int i = 0; i < 100; ++i) kvp::pool_run(tp, 1, noop, nullptr); },
            [&] { for (int i = 0; i < 100; ++i) kvp::pool_run(tp, 2, noop, nullptr); });
        rows.push_back(XRow{"pool_run(empty)", 0, 0, 0, t[0] / 100.0, t[1] / 100.0, 0});
        // With the worker asleep (calls 1 ms apart, as between layers of a model): the caller's
        // time for a 2-thread call of an empty job (wake syscall, closing the job), and how long
        // a sleeping worker takes from the wake to claiming its id (the caller waits for it, at
        // most 5 ms). Medians and 90th percentiles over 300 calls.
        struct Wake {
            std::atomic<double> t_claim{0};
        } wk;
        auto claim = [](void *arg, uint32_t tid) {
            Wake &w = *static_cast<Wake *>(arg);
            if (tid == 1) {
                w.t_claim.store(now_s());
                return;
            }
            for (double t0 = now_s(); w.t_claim.load() == 0 && now_s() - t0 < 5e-3;) {
            }
        };
        std::vector<double> call_us, wake_us;
        for (int i = 0; i < 300; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            double t0 = now_s();
            kvp::pool_run(tp, 2, noop, nullptr);
            call_us.push_back((now_s() - t0) * 1e6);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            wk.t_claim.store(0);
            t0 = now_s();
            kvp::pool_run(tp, 2, claim, &wk);
            if (wk.t_claim.load() > 0) wake_us.push_back((wk.t_claim.load() - t0) * 1e6);
        }
        auto pct = [](std::vector<double> v, double p) {
            if (v.empty()) return 0.0;
            std::sort(v.begin(), v.end());
            return v[std::min(v.size() - 1, (size_t)(p * (double)v.size()))];
        };
        rows.push_back(XRow{"pool call, worker asleep p50/p90", 0, 0, 0, pct(call_us, 0.5), pct(call_us, 0.9), 0});
        rows.push_back(XRow{"pool wake to claim p50/p90", 0, 0, 0, pct(wake_us, 0.5), pct(wake_us, 0.9), 0});
        kvp::pool_stop(tp);
        std::free(mem);
    }
#endif
    {
        const std::vector<double> t = alternate(reps, secs, [] { benchmark::DoNotOptimize(omp_region_us(1, 0.0)); },
                                                [] { benchmark::DoNotOptimize(omp_region_us(2, 0.0)); });
        rows.push_back(XRow{"omp_region(empty)", 0, 0, 0, t[0] / 100.0, t[1] / 100.0, 0});  // 100 regions each
    }
    for (size_t bytes = 16384; bytes <= ((size_t)32 << 20); bytes *= 4) {
        const size_t n = bytes / sizeof(float);
        AlignedBuf buf(n);
        for (size_t i = 0; i < n; ++i) buf.p[i] = 1.0f;
        const std::vector<double> t = alternate(reps, secs, [&] { benchmark::DoNotOptimize(read_split(buf.p, n, 1)); },
                                                [&] { benchmark::DoNotOptimize(read_split(buf.p, n, 2)); });
        rows.push_back(XRow{"read (omp)", 0, (double)bytes, (double)bytes, t[0], t[1], 0});
    }
    struct Geo {
        const char *name;
        uint32_t layers, nq, nkv, hd, nmin, nmax;
    };
    const Geo geos[] = {{"decode 2L 4q/2kv d32", 2, 4, 2, 32, 16, 4096},
                        {"decode 1L 32q/8kv d128", 1, 32, 8, 128, 16, 8192},
                        {"decode 1L 8q/1kv d128 (MQA)", 1, 8, 1, 128, 64, 16384}};
    for (const Geo &g : geos)
        for (uint32_t n = g.nmin; n <= g.nmax; n *= 2) {
            void *arena[3] = {nullptr, nullptr, nullptr};
            kvp_cache *c[3];
            for (int i = 0; i < 3; ++i) c[i] = x_cache(g.layers, g.nq, g.nkv, g.hd, n, n, i ? 2 : 1, i == 1, &arena[i]);
            if (!c[0] || !c[1] || !c[2]) {
                std::fprintf(stderr, "crossover: cache setup failed (%s)\n", g.name);
                return 1;
            }
            std::vector<float> q((size_t)g.nq * g.hd), k1((size_t)g.nkv * g.hd), v1((size_t)g.nkv * g.hd),
                out((size_t)g.nq * g.hd);
            fill_random(q.data(), q.size(), 5);
            fill_random(k1.data(), k1.size(), 6);
            fill_random(v1.data(), v1.size(), 7);
            auto step = [&](kvp_cache *cc) {
                for (uint32_t l = 0; l < g.layers; ++l) kvp_decode(cc, l, q.data(), k1.data(), v1.data(), out.data());
                benchmark::DoNotOptimize(out[0]);
            };
            const double work = g.layers * KVP_BENCH_WORK(c[0], 1, true);
            const std::vector<double> t =
                alternate(reps, secs, [&] { step(c[0]); }, [&] { step(c[1]); }, [&] { step(c[2]); });
            rows.push_back(XRow{g.name, (double)n, (double)g.layers * (n + 1) * g.nkv * g.hd * sizeof(float) * 2, work,
                                t[0], t[1], t[2]});
            for (int i = 0; i < 3; ++i) {
                kvp_destroy(c[i]);
                std::free(arena[i]);
            }
        }
    for (uint32_t n = 1; n <= 256; n *= 2) {  // prefill of n tokens over nothing: reset per call
        void *arena[3] = {nullptr, nullptr, nullptr};
        kvp_cache *c[3];
        for (int i = 0; i < 3; ++i) c[i] = x_cache(1, 32, 8, 128, 512, 0, i ? 2 : 1, i == 1, &arena[i]);
        if (!c[0] || !c[1] || !c[2]) return 1;
        std::vector<float> q((size_t)n * 32 * 128), k((size_t)n * 8 * 128), v(k.size()), out(q.size());
        fill_random(q.data(), q.size(), 8);
        fill_random(k.data(), k.size(), 9);
        fill_random(v.data(), v.size(), 10);
        auto step = [&](kvp_cache *cc) {
            kvp_reset(cc);
            kvp_prefill(cc, 0, n, nullptr, q.data(), k.data(), v.data(), out.data(), nullptr);
            benchmark::DoNotOptimize(out[0]);
        };
        const double work = KVP_BENCH_WORK(c[0], n, false);
        const std::vector<double> t = alternate(reps, secs, [&] { step(c[0]); }, [&] { step(c[1]); }, [&] { step(c[2]); });
        rows.push_back(XRow{"prefill 1L 32q/8kv d128", (double)n, (double)n * 8 * 128 * 8, work, t[0], t[1], t[2]});
        for (int i = 0; i < 3; ++i) {
            kvp_destroy(c[i]);
            std::free(arena[i]);
        }
    }
    header.push_back("loadavg after: " + load_average());
    std::printf("%-28s %6s %10s %11s %9s %9s %9s %7s %7s\n", "what", "N", "bytes", "work", "1thr_us", "2thr_us",
                "auto_us", "t1/t2", "t1/auto");
    for (const XRow &r : rows)
        std::printf("%-28s %6.0f %10.0f %11.0f %9.2f %9.2f %9.2f %7.3f %7.3f\n", r.what.c_str(), r.n, r.bytes, r.work,
                    r.t1_us, r.t2_us, r.ta_us, r.t1_us / r.t2_us, r.ta_us > 0 ? r.t1_us / r.ta_us : 0.0);
    std::printf("# %s\n", header.back().c_str());
    if (!csv.empty()) {
        std::FILE *f = std::fopen(csv.c_str(), "w");
        if (!f) return 1;
        for (const std::string &h : header) std::fprintf(f, "# %s\n", h.c_str());
        std::fprintf(f, "what,N,bytes,work,t1_us,t2_forced_us,t2_auto_us,speedup_forced,speedup_auto\n");
        for (const XRow &r : rows)
            std::fprintf(f, "%s,%.0f,%.0f,%.0f,%.3f,%.3f,%.3f,%.4f,%.4f\n", r.what.c_str(), r.n, r.bytes, r.work, r.t1_us,
                         r.t2_us, r.ta_us, r.t1_us / r.t2_us, r.ta_us > 0 ? r.t1_us / r.ta_us : 0.0);
        std::fclose(f);
    }
    return 0;
}


// ---- roofline mode --------------------------------------------------------------------------
//
// bench_attention --roofline [--reps R] [--time S] [--nmin N] [--nmax N] [--threads 1,2]
//                            [--dtypes f32,f16,q8,q4] [--no-parts] [--label L] [--csv PATH]
//
// Issue 23 item 4, issue 31 item 3: decode (32 q / 8 kv heads, head_dim 128, policy=window
// window=N) of each storage type (--dtypes, default f32,f16,q8,q4) against its roof, N =
// nmin..nmax in powers of 2, each thread count. A step must read its bytes (the layer's live
// bytes, kvp_get_stats, after the warm-up steps: codes, grids, scales and the f32 residual) and
// do its arithmetic: f32 and f16 one FMA per stored element per query row in qk and in pv; q8 and
// q4 one integer product per key element per query row (qk) and one FMA per value element per
// query row (pv). Its roof time is the larger of bytes / read and the arithmetic at the measured
// peaks (integer products / idot + FMAs / fma: they share the vector pipes), and
// f_roof = roof time / step time (1 = at the roof; `lim` says which side bounds it). Every
// repetition measures, back to back and with the row's thread count (each for --time seconds
// after a warm-up):
//   fma     the FMA peak: the register-only loop of isa.h at the f32 kernel's ISA (16 lanes on
//           AVX-512)
//   idot    (q8, q4) the integer-dot peak of the q kernels' ISA: vpdpbusd where they run their
//           avx512 variant (VNNI; the better of 8 and 16 lanes), vpmaddwd otherwise (isa.h)
//   read    a plain read of the same bytes, split in contiguous parts over the threads, each
//           thread looping over its part inside one parallel region (sustained bandwidth: the
//           sweep's read woke the threads for every pass, which at 2 MB costs as much as the
//           pass), three ways: `plain` (the sweep's loop, no software prefetch), `pf4k` and
//           `pf16k` (four accumulators, each line prefetched into L2 4 KiB / 16 KiB ahead; qk
//           prefetches 32 K rows = 16 KiB ahead): read = the best of the three in that repetition
//   decode  kvp_decode of one token, ms per step
// then f_roof as above (the table gives medians over repetitions; f_roof: median of the
// per-repetition ratios, with min and max) and roof in GB/s = bytes / roof time.
// "Where the rest goes" (unless --no-parts): the decode's kernels called directly (the library's
// best variant) on buffers of the same layout (8 heads x N rows; f32: 128 floats each for K and
// V; f16/q8/q4: the stored rows, with q8/q4 keys prepared per 32-token block as the store's key
// grids require and their values' scales per row), one thread, per repetition: qk (4 query rows
// per head), softmax (max + expsum of the 32 rows) and pv; rest = decode ms - (qk + softmax +
// pv) / threads: the API's own work (RoPE of the new
// row, append, the per-head driver and merge) and, with 2 threads, the wake-up, imbalance and
// join of the worker pool. `used`: the threads the library's rule gives the step on a quiet
// machine (below kParallelWork = 4 Mi units of work, N < 1024 here, the caller runs alone).

float read_plain_fn(const float *x, size_t n, size_t) { return read_block(x, n); }

float (*read_pf_fn())(const float *, size_t, size_t) {
    const std::string isa = kvp::kern::attn_f32_best()->name;
#ifdef KVP_BENCH_AVX512
    if (isa == "avx512") return &kvpbench::read_pf_avx512;
#endif
#ifdef KVP_BENCH_AVX2
    if (isa == "avx2") return &kvpbench::read_pf_avx2;
#endif
    return &kvpbench::read_pf_simde;
}

// Bytes/s of fn over x[0..n) with `threads`: one parallel region in which every thread reads its
// contiguous part (n / threads floats) again and again for about `secs` (at least 3 passes), so
// the figure is the sustained bandwidth, not diluted by waking the threads per pass (at 2 MB a
// pass takes ~25 us, about what a passive OpenMP wake-up costs). Bytes = all passes of all
// threads, time = the region's wall time (one wake-up in thousands of passes at small N; the
// first pass, which may miss the caches, in a handful at large N).
double read_bw_fn(float (*fn)(const float *, size_t, size_t), const float *x, size_t n, int threads, size_t pf,
                  double secs) {
    const size_t part = n / (size_t)(threads > 0 ? threads : 1);
    std::atomic<size_t> passes{0};
    auto body = [&](int t) {
        const float *p = x + (size_t)t * part;
        const double start = now_s();
        float s = 0.0f;
        size_t k = 0;
        do {
            s += fn(p, part, pf);
            ++k;
        } while (k < 3 || now_s() - start < secs);
        passes += k;
        return s;
    };
    float sink = 0.0f;
    const double t0 = now_s();
    if (threads <= 1) {
        sink = body(0);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += body(omp_get_thread_num());
#else
        for (int t = 0; t < threads; ++t) sink += body(t);
#endif
    }
    const double t1 = now_s();
    benchmark::DoNotOptimize(sink);
    return (double)(passes.load() * part * sizeof(float)) / (t1 - t0);
}

// Integer products per second (1e9) of the q kernels' dot product at their ISA, `threads` running
// the loop at once; *what names the instruction.
double idot_peak_gops(int threads, double secs, std::string *what) {
    typedef std::function<float(uint64_t, uint64_t *)> Fn;
    const std::string isa = kvp::kern::attn_q_best()->name;
    std::vector<Fn> fns{&kvpbench::idot_peak_simde};  // candidates at the q kernels' ISA: the best rate counts
    *what = "vpmaddwd (simde)";
#ifdef KVP_BENCH_AVX2
    if (isa == "avx2") fns = {&kvpbench::idot_peak_avx2}, *what = "vpmaddwd ymm";
#endif
#ifdef KVP_BENCH_VNNI
    if (isa == "avx512") {
        fns = {[](uint64_t it, uint64_t *p) { return kvpbench::idot_peak_vnni(it, p, 0); },
               [](uint64_t it, uint64_t *p) { return kvpbench::idot_peak_vnni(it, p, 1); }};
        *what = "vpdpbusd ymm/zmm";
    }
#endif
    const uint64_t iters = 1u << 20;
    double best = 0.0;
    for (const Fn &fn : fns) {
        uint64_t per_iter = 0;
        fn(1, &per_iter);
        const double t_end = now_s() + secs / (double)fns.size();
        do {
            const double t0 = now_s();
            float sink = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : sink)
#endif
            {
                uint64_t unused = 0;
                sink += fn(iters, &unused);
            }
            const double t = now_s() - t0;
            benchmark::DoNotOptimize(sink);
            const double g = (double)threads * (double)(iters * per_iter) / t / 1e9;
            if (g > best) best = g;
        } while (now_s() < t_end);
    }
#ifndef _OPENMP
    best /= threads;  // no OpenMP: one thread ran the loop (as fma_peak_gflops)
#endif
    return best;
}

struct RoofRow {
    std::string dtype;
    uint32_t n;
    int threads;
    double bytes, ms, gbps;
    double fma, idot, read_plain, read_pf16k, read_pf4k, read, roof, f_roof, f_lo, f_hi, f_read;
    double t_read_ms, t_comp_ms;              // the roof's two sides for this step
    const char *limit;                        // "comp" or "read": the larger time of the two
    int used;                                 // threads the library's rule gives this step (quiet machine)
    double qk_ms, sm_ms, pv_ms, rest_ms;      // parts (0 with --no-parts)
};

// Seconds per call of f, for about `secs` after one warm-up call.
template <class F>
double time_per_call(F &&f, double secs) {
    f();
    size_t reps = 0;
    const double t0 = now_s();
    double t1 = t0;
    while (reps < 2 || t1 - t0 < secs) {
        f();
        ++reps;
        t1 = now_s();
    }
    return (t1 - t0) / (double)reps;
}

// The decode's kernels of one storage type called directly on buffers of the decode's layout
// (kvp::kern, the library's best variants), for "where the rest goes".
struct KernelParts {
    std::string dtype;
    uint32_t nkv, rows, d, nk;
    size_t ldl, rb;
    const kvp::kern::AttnF32 *K;
    const kvp::kern::AttnQ *Q;
    std::unique_ptr<AlignedBuf> kf, vf, lg, po, zacc, qs, qsc, bias;
    std::vector<uint8_t> kq, vq;
    std::vector<uint16_t> sz;
    std::vector<int8_t> ge, qi;
    std::vector<int16_t> gz;
    std::vector<float> q;
    KernelParts(const std::string &dt, uint32_t n, uint32_t nq, uint32_t nkv_, uint32_t d_)
        : dtype(dt), nkv(nkv_), rows(nq / nkv_), d(d_), nk(n + 1), ldl((n + 1 + 15) / 16 * 16),
          rb(dt == "f32" ? 0 : dt == "f16" ? 2 * d_ : dt == "q8" ? d_ : d_ / 2), K(kvp::kern::attn_f32_best()),
          Q(kvp::kern::attn_q_best()), q((size_t)nq * d_) {
        fill_random(q.data(), q.size(), 7);
        lg.reset(new AlignedBuf((size_t)nq * ldl));
        po.reset(new AlignedBuf((size_t)nq * d));
        if (dtype == "f32") {
            kf.reset(new AlignedBuf((size_t)nkv * nk * d));
            vf.reset(new AlignedBuf((size_t)nkv * nk * d));
            fill_random(kf->p, kf->n, 21);
            fill_random(vf->p, vf->n, 22);
            return;
        }
        kq.resize((size_t)nkv * nk * rb);
        vq.resize(kq.size());
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < kq.size(); ++i) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            kq[i] = (uint8_t)x;
            vq[i] = (uint8_t)(x >> 8);
        }
        if (dtype == "f16")  // finite halves
            for (size_t i = 1; i < kq.size(); i += 2) kq[i] &= 0x3b, vq[i] &= 0x3b;
        const uint32_t G = d / 32;
        sz.assign((size_t)nkv * nk * 2 * G, 0x2000);
        ge.assign(d, -3);
        gz.assign(d, 5);
        qi.resize((size_t)rows * d);
        qs.reset(new AlignedBuf((size_t)rows * d));
        qsc.reset(new AlignedBuf(16));
        bias.reset(new AlignedBuf(16));
        zacc.reset(new AlignedBuf((size_t)nq * G + 16));
    }
    void qk(float scale) {
        for (uint32_t h = 0; h < nkv; ++h) {
            const float *qh = q.data() + (size_t)h * rows * d;
            float *l = lg->p + (size_t)h * rows * ldl;
            if (dtype == "f32") {
                K->qk(qh, d, rows, kf->p + (size_t)h * nk * d, d, nk, d, scale, l, ldl);
            } else if (dtype == "f16") {
                Q->qk_f16(qh, d, rows, nullptr, kq.data() + (size_t)h * nk * rb, rb, nk, d, scale, l, ldl);
            } else {  // one key grid per 32-token block: prep per block, as the store does
                const bool q8 = dtype == "q8";
                for (uint32_t t = 0; t < nk; t += 32) {
                    const uint32_t m = nk - t < 32 ? nk - t : 32;
                    (q8 ? Q->prep8 : Q->prep4)(qh, d, rows, ge.data(), gz.data(), d, qs->p, d, qi.data(), d, qsc->p,
                                               bias->p);
                    (q8 ? Q->qk_q8 : Q->qk_q4)(qi.data(), d, rows, qsc->p, bias->p,
                                               kq.data() + ((size_t)h * nk + t) * rb, rb, m, d, scale, l + t, ldl);
                }
            }
        }
    }
    void softmax() {
        float s = 0.0f;
        for (uint32_t r = 0; r < nkv * rows; ++r) {
            float *l = lg->p + (size_t)r * ldl;
            s += K->expsum(l, nk, K->max(l, nk), nullptr);
        }
        benchmark::DoNotOptimize(s);
    }
    void pv() {
        std::memset(po->p, 0, po->n * sizeof(float));
        const uint32_t G = d / 32;
        for (uint32_t h = 0; h < nkv; ++h) {
            const float *p = lg->p + (size_t)h * rows * ldl;
            float *o = po->p + (size_t)h * rows * d;
            if (dtype == "f32") {
                K->pv(p, ldl, rows, vf->p + (size_t)h * nk * d, d, nk, d, o, d);
            } else {
                const kvp::kern::q_pv_fn f = dtype == "f16" ? Q->pv_f16 : dtype == "q8" ? Q->pv_q8 : Q->pv_q4;
                f(p, ldl, rows, vq.data() + (size_t)h * nk * rb, rb, sz.data() + (size_t)h * nk * 2 * G, 2 * G, nk, d,
                  o, d, zacc->p + (size_t)h * rows * G, G);
            }
        }
        benchmark::DoNotOptimize(po->p[0]);
    }
};

bool roofline_row(const std::string &dtype, uint32_t n, int threads, int reps, double secs, bool parts, RoofRow *row,
                  std::string *err) {
    const SweepGeo &g = kMainGeo;
    void *arena = nullptr;
    kvp_cache *c = make_cache("policy=window window=" + std::to_string(n) + " threads=" + std::to_string(threads) +
                                  " kv_dtype=" + dtype,
                              &arena, err, g);
    if (!c) return false;
    bool ok = append_random(c, n, err, g);
    std::vector<float> q((size_t)g.nq * g.hd), k((size_t)g.nkv * g.hd), v((size_t)g.nkv * g.hd),
        out((size_t)g.nq * g.hd);
    fill_random(q.data(), q.size(), 7);
    fill_random(k.data(), k.size(), 8);
    fill_random(v.data(), v.size(), 9);
    for (int w = 0; w < 2 && ok; ++w) ok = kvp_decode(c, 0, q.data(), k.data(), v.data(), out.data()) == KVP_OK;
    kvp_stats st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    if (ok) ok = kvp_get_stats(c, &st) == KVP_OK;
    const size_t bytes = (size_t)st.live_bytes;
    const size_t nf = (bytes / sizeof(float) + kReadChunk - 1) / kReadChunk * kReadChunk;
    AlignedBuf buf(nf ? nf : kReadChunk);
    for (size_t i = 0; i < buf.n; ++i) buf.p[i] = 1.0f;
    // the step's arithmetic: element-row products of qk and pv (N+1 keys, every query row)
    const double elems = (double)g.hd * g.nq * g.layers * (double)(n + 1);
    const bool integer_keys = dtype == "q8" || dtype == "q4";
    const double fma_flops = integer_keys ? 2.0 * elems : 4.0 * elems, int_prods = integer_keys ? elems : 0.0;
    std::unique_ptr<KernelParts> kp;
    if (parts) kp.reset(new KernelParts(dtype, n, g.nq, g.nkv, g.hd));
    const float scale = 1.0f / std::sqrt((float)g.hd);
    float (*pf_fn)(const float *, size_t, size_t) = read_pf_fn();
    std::string idot_what;
    std::vector<double> ms, fma, idot, rp, r1, r4, rd, fr, frd, qk_ms, sm_ms, pv_ms, trd, tcp;
    for (int r = 0; ok && r < reps; ++r) {
        fma.push_back(fma_peak_gflops(threads, 0.03));
        idot.push_back(integer_keys ? idot_peak_gops(threads, 0.03, &idot_what) : 0.0);
        rp.push_back(read_bw_fn(&read_plain_fn, buf.p, nf, threads, 0, secs * 0.5));
        r1.push_back(read_bw_fn(pf_fn, buf.p, nf, threads, 16384, secs * 0.5));
        r4.push_back(read_bw_fn(pf_fn, buf.p, nf, threads, 4096, secs * 0.5));
        const double best = std::max(rp.back(), std::max(r1.back(), r4.back()));
        rd.push_back(best);
        for (int w = 0; w < 2 && ok; ++w)
            ok = kvp_decode(c, 0, q.data(), k.data(), v.data(), out.data()) == KVP_OK;
        size_t steps = 0;
        const double t0 = now_s();
        double t1 = t0;
        while (ok && (steps < 3 || t1 - t0 < secs)) {
            ok = kvp_decode(c, 0, q.data(), k.data(), v.data(), out.data()) == KVP_OK;
            benchmark::DoNotOptimize(out[0]);
            ++steps;
            t1 = now_s();
        }
        const double step_s = (t1 - t0) / (double)steps;
        ms.push_back(step_s * 1e3);
        const double t_read = (double)bytes / best;
        const double t_comp = fma_flops / (fma.back() * 1e9) + (integer_keys ? int_prods / (idot.back() * 1e9) : 0.0);
        trd.push_back(t_read * 1e3);
        tcp.push_back(t_comp * 1e3);
        fr.push_back(std::max(t_read, t_comp) / step_s);
        frd.push_back(t_read / step_s);
        if (parts) {
            qk_ms.push_back(time_per_call([&]() { kp->qk(scale); }, secs / 3) * 1e3);
            // in place: after the first call the rows hold weights in (0, 1], and exp of those
            // costs what exp of the logits costs (no special cases in the kernels' exp)
            sm_ms.push_back(time_per_call([&]() { kp->softmax(); }, secs / 3) * 1e3);
            pv_ms.push_back(time_per_call([&]() { kp->pv(); }, secs / 3) * 1e3);
        }
    }
    if (!ok && err->empty()) *err = std::string("kvp_decode: ") + kvp_last_error(c);
    if (ok && kvp_layer_len(c, 0) != n) {
        ok = false;
        *err = "window did not keep the layer at N tokens";
    }
    // Below kParallelWork units of work the library runs a step on the calling thread alone
    // (src/cache.cpp threads_for; on a busy machine its back-off can raise that threshold).
#ifdef KVP_BENCH_POOL
    row->used = threads > 1 && KVP_BENCH_WORK(c, 1, true) >= (double)kvp::kParallelWork ? threads : 1;
#else
    row->used = threads;
#endif
    kvp_destroy(c);
    std::free(arena);
    if (!ok) return false;
    row->dtype = dtype;
    row->n = n;
    row->threads = threads;
    row->bytes = (double)bytes;
    row->ms = median(ms);
    row->gbps = (double)bytes / (row->ms * 1e-3) / 1e9;
    row->fma = median(fma);
    row->idot = integer_keys ? median(idot) : 0.0;
    row->read_plain = median(rp) / 1e9;
    row->read_pf16k = median(r1) / 1e9;
    row->read_pf4k = median(r4) / 1e9;
    row->read = median(rd) / 1e9;
    row->t_read_ms = median(trd);
    row->t_comp_ms = median(tcp);
    row->limit = row->t_comp_ms > row->t_read_ms ? "comp" : "read";
    row->roof = (double)bytes / (std::max(row->t_read_ms, row->t_comp_ms) * 1e-3) / 1e9;
    row->f_roof = median(fr);
    row->f_lo = *std::min_element(fr.begin(), fr.end());
    row->f_hi = *std::max_element(fr.begin(), fr.end());
    row->f_read = median(frd);
    row->qk_ms = median(qk_ms);
    row->sm_ms = median(sm_ms);
    row->pv_ms = median(pv_ms);
    row->rest_ms = parts ? row->ms - (row->qk_ms + row->sm_ms + row->pv_ms) / threads : 0.0;
    return true;
}

int run_roofline(int argc, char **argv) {
    int reps = 5;
    double secs = 0.12;
    uint32_t nmin = 256, nmax = 65536;
    std::vector<int> threads{1, 2};
    std::vector<std::string> dtypes{"f32", "f16", "q8", "q4"};
    bool parts = true;
    std::string label = "run", csv;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--roofline") continue;
        else if (a == "--reps") reps = std::atoi(next().c_str());
        else if (a == "--time") secs = std::atof(next().c_str());
        else if (a == "--nmin") nmin = (uint32_t)std::atol(next().c_str());
        else if (a == "--nmax") nmax = (uint32_t)std::atol(next().c_str());
        else if (a == "--threads") {
            threads.clear();
            for (const std::string &t : split(next(), ',')) threads.push_back(std::atoi(t.c_str()));
        } else if (a == "--dtypes") {
            dtypes = split(next(), ',');
        } else if (a == "--no-parts") parts = false;
        else if (a == "--label") label = next();
        else if (a == "--csv") csv = next();
        else {
            std::fprintf(stderr,
                         "usage: %s --roofline [--reps R] [--time S] [--nmin N] [--nmax N] [--threads 1,2] "
                         "[--dtypes f32,f16,q8,q4] [--no-parts] [--label L] [--csv PATH]\n",
                         argv[0]);
            return 2;
        }
    }
    for (const std::string &d : dtypes)
        if (d != "f32" && d != "f16" && d != "q8" && d != "q4") {
            std::fprintf(stderr, "--dtypes: %s is not f32, f16, q8 or q4\n", d.c_str());
            return 2;
        }
    if (reps < 1 || nmin < 1 || nmax < nmin || threads.empty() || dtypes.empty() || secs <= 0.0) {
        std::fprintf(stderr, "bad roofline options\n");
        return 2;
    }
    char date[64] = "";
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
    std::vector<std::string> header;
    header.push_back("label: " + label);
    header.push_back("cpu: " + cpu_model());
    header.push_back(std::string("date: ") + date);
    header.push_back(std::string("kernel: ") + kvp::kern::attn_f32_best()->name + " (f32), " +
                     kvp::kern::attn_q_best()->name + " (f16, q8, q4)");
    const char *wait = std::getenv("OMP_WAIT_POLICY");
    header.push_back(std::string("OMP_WAIT_POLICY: ") + (wait ? wait : "(unset)"));
    header.push_back("geometry: 32 q heads, 8 kv heads, head_dim 128; policy=window window=N kv_dtype=D");
    header.push_back(std::string("pages: ") + kvpbench::arena_pages());
    header.push_back("reps: " + std::to_string(reps) + ", seconds per measurement: " + std::to_string(secs));
    header.push_back("f_roof = max(t_read, t_comp) / step: t_read = bytes / read, t_comp = FMAs / fma + integer "
                     "products / idot (GFLOPS, G products/s); targets (issue 31): f_roof >= 0.75 at N >= 16384, "
                     "f32 2 threads f_read >= 0.8");
    header.push_back("loadavg before: " + load_average());
    for (const std::string &h : header) std::printf("# %s\n", h.c_str());
    std::printf("%-4s %6s %3s %4s %8s %8s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %4s %6s %13s %6s %7s %7s %7s %7s\n",
                "type", "N", "thr", "used", "MB", "ms/step", "GB/s", "FMA", "idot", "plain", "pf4k", "pf16k", "read",
                "t_read", "t_comp", "roof", "lim", "f_roof", "[min,max]", "f_read", "qk_ms", "sm_ms", "pv_ms", "rest_ms");
    std::fflush(stdout);
    std::vector<RoofRow> rows;
    for (uint32_t n = nmin; n <= nmax; n *= 2) {
        for (int t : threads)
            for (const std::string &dt : dtypes) {
                RoofRow r;
                std::string err;
                if (!roofline_row(dt, n, t, reps, secs, parts, &r, &err)) {
                    std::fprintf(stderr, "%s N=%u threads=%d: %s\n", dt.c_str(), n, t, err.c_str());
                    return 1;
                }
                std::printf("%-4s %6u %3d %4d %8.1f %8.3f %7.2f %7.1f %7.1f %7.2f %7.2f %7.2f %7.2f %7.3f %7.3f %7.2f %4s %6.3f "
                            "[%5.3f,%5.3f] %6.3f %7.3f %7.3f %7.3f %7.3f\n",
                            r.dtype.c_str(), r.n, r.threads, r.used, r.bytes / 1e6, r.ms, r.gbps, r.fma, r.idot,
                            r.read_plain, r.read_pf4k, r.read_pf16k, r.read, r.t_read_ms, r.t_comp_ms, r.roof, r.limit,
                            r.f_roof, r.f_lo, r.f_hi, r.f_read, r.qk_ms, r.sm_ms, r.pv_ms, r.rest_ms);
                std::fflush(stdout);
                rows.push_back(r);
            }
        if (n > 0x7fffffffu) break;
    }
    header.push_back("loadavg after: " + load_average());
    std::printf("# %s\n", header.back().c_str());
    int below = 0, big = 0;
    for (const RoofRow &r : rows)
        if (r.n >= 16384) ++big, below += r.f_roof < 0.75;
    std::printf("# rows at N >= 16384 below f_roof 0.75: %d of %d\n", below, big);
    if (!csv.empty()) {
        std::FILE *f = std::fopen(csv.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "cannot write %s\n", csv.c_str());
            return 1;
        }
        for (const std::string &h : header) std::fprintf(f, "# %s\n", h.c_str());
        std::fprintf(f, "dtype,N,threads,threads_used,bytes,ms_per_step,GBps,fma_GFLOPS,idot_Gops,read_plain_GBps,"
                        "read_pf4k_GBps,read_pf16k_GBps,read_GBps,t_read_ms,t_comp_ms,roof_GBps,limit,frac_roof,"
                        "frac_roof_min,frac_roof_max,frac_read,qk_ms,softmax_ms,pv_ms,rest_ms\n");
        for (const RoofRow &r : rows)
            std::fprintf(f, "%s,%u,%d,%d,%.0f,%.4f,%.3f,%.2f,%.2f,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%.3f,%s,%.4f,%.4f,%.4f,"
                            "%.4f,%.4f,%.4f,%.4f,%.4f\n",
                         r.dtype.c_str(), r.n, r.threads, r.used, r.bytes, r.ms, r.gbps, r.fma, r.idot, r.read_plain,
                         r.read_pf4k, r.read_pf16k, r.read, r.t_read_ms, r.t_comp_ms, r.roof, r.limit, r.f_roof, r.f_lo,
                         r.f_hi, r.f_read, r.qk_ms, r.sm_ms, r.pv_ms, r.rest_ms);
        std::fclose(f);
        std::printf("# wrote %s\n", csv.c_str());
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--crossover") == 0) return run_crossover(argc, argv);
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--sweep") == 0) return run_sweep(argc, argv);
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--roofline") == 0) return run_roofline(argc, argv);
    const uint32_t sizes[] = {512, 4096, 32768};
    const int thread_counts[] = {1, 2};
    using kvp::kern::AttnF32;
    const AttnF32 *variants[] = {kvp::kern::attn_f32_scalar(), kvp::kern::attn_f32_simde(),
                                 kvp::kern::attn_f32_avx2(),
#ifdef KVP_BENCH_AVX512
                                 kvp::kern::attn_f32_avx512()
#else
                                 nullptr
#endif
    };

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
