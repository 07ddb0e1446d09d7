// Decode attention over quantized storage (kv_dtype = f32 / f16 / q8 / q4) against the machine's
// read bandwidth, all in one run (DESIGN.md "Performance model"; issue 10's benchmark):
//
//   BM_ReadBandwidth/<bytes>/threads:<T>   plain read of a buffer of that many bytes (SIMD loads at
//                                          the f32 kernel's ISA, OpenMP parallel for over T threads:
//                                          bench_util.h)
//   BM_DecodeQ/<dtype>/N:<N>/threads:<T>   kvp_decode on a 32 q-head / 8 kv-head / d = 128 layer
//                                          holding N tokens (policy=window window=N) stored as dtype
//   BM_KernelQ/<dtype>/<variant>/N:<N>     qk + pv of one GQA group (4 rows) over N stored rows,
//                                          one kernel variant, one thread (.../qk, .../pv: one pass)
//   BM_PrefillQ/<dtype>/P:<P>/threads:<T>  a P-token prompt through kvp_prefill in 512-token calls
//                                          (an engine's micro-batches: later calls attend over the
//                                          stored, formatted keys of earlier ones) into an empty
//                                          cache of the same layer; counter tok_per_s
//
// bytes_per_second counts the bytes a decode step reads: the layer's live bytes in its storage
// format (K and V data, value scales, key grids, the f32 residual group). Counters:
//   bw_frac    its bytes/s over the best BM_ReadBandwidth of the same byte size and threads
//   bw_GBps    that bandwidth (1e9 bytes/s)
//   step_us    time per decode step
// and after the run a table per (N, threads): step time, bytes, bw_frac and the speedup over
// f32 measured in the same process (best repetition of each).
//
//   build/bench/bench_quant --benchmark_repetitions=5 --benchmark_filter='threads:2'
//
// On a shared machine run with OMP_WAIT_POLICY=passive (see bench_attention.cpp).
#include "bench_util.h"
#include "kernels/attn_f32.h"
#include "kernels/attn_q.h"
#include "kvprune/kvprune.h"
#include "quant/format.h"

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
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using kvpbench::cpu_s;
using kvpbench::fill_random;
using kvpbench::now_s;
using kvpbench::read_all;
using kvpbench::Rng;

struct BwEntry {
    size_t bytes;
    int threads;
    double bps;
};
std::vector<BwEntry> g_bw;

void record_bw(size_t bytes, int threads, double bps) {
    for (BwEntry &e : g_bw)
        if (e.bytes == bytes && e.threads == threads) {
            e.bps = std::max(e.bps, bps);
            return;
        }
    g_bw.push_back(BwEntry{bytes, threads, bps});
}

double best_bw(size_t bytes, int threads) {
    for (const BwEntry &e : g_bw)
        if (e.bytes == bytes && e.threads == threads) return e.bps;
    return 0.0;
}

size_t floats_for(size_t bytes) { return (bytes / sizeof(float) + 31) / 32 * 32; }

void BM_ReadBandwidth(benchmark::State &state, size_t bytes, int threads) {
    const size_t n = floats_for(bytes);
    float *buf = static_cast<float *>(kvpbench::arena_alloc(n * sizeof(float)));
    for (size_t i = 0; i < n; ++i) buf[i] = 1.0f;
    benchmark::DoNotOptimize(read_all(buf, n, threads));
    const double t0 = now_s();
    for (auto _ : state) benchmark::DoNotOptimize(read_all(buf, n, threads));
    const double t = now_s() - t0;
    const double total = (double)state.iterations() * (double)(n * sizeof(float));
    state.SetBytesProcessed((int64_t)total);
    record_bw(bytes, threads, total / t);
    std::free(buf);
}

// ---- decode through the C API -------------------------------------------------------------------

const uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
const char *const kDtypes[] = {"f32", "f16", "q8", "q4"};

struct DecodeCache {
    std::string dtype;
    uint32_t n = 0;
    int threads = 0;
    bool empty = false;  // left empty (BM_PrefillQ) rather than holding n tokens
    void *arena = nullptr;
    kvp_cache *c = nullptr;
    size_t step_bytes = 0;  // live bytes read per step (after the step's append)
    std::string error;
};
std::vector<DecodeCache *> g_caches;

kvp_model model() {
    kvp_model m;
    std::memset(&m, 0, sizeof m);
    m.n_layers = 1;
    m.n_q_heads = kQHeads;
    m.n_kv_heads = kKvHeads;
    m.head_dim = kHeadDim;
    m.rope = KVP_ROPE_NEOX;
    m.rope_theta = 10000.0f;
    return m;
}

DecodeCache *get_cache(const std::string &dtype, uint32_t n, int threads, bool empty = false) {
    for (DecodeCache *dc : g_caches)
        if (dc->dtype == dtype && dc->n == n && dc->threads == threads && dc->empty == empty) return dc;
    DecodeCache *dc = new DecodeCache;
    dc->dtype = dtype;
    dc->n = n;
    dc->threads = threads;
    dc->empty = empty;
    g_caches.push_back(dc);
    const kvp_model m = model();
    kvp_config cfg;
    char err[256] = "";
    kvp_config_default(&cfg, &m);
    const std::string spec =
        "policy=window window=" + std::to_string(n) + " threads=" + std::to_string(threads) + " kv_dtype=" + dtype;
    if (kvp_config_apply(&cfg, spec.c_str(), err, sizeof err) != KVP_OK) {
        dc->error = spec + ": " + err;
        return dc;
    }
    const size_t len = kvp_arena_size(&cfg);
    dc->arena = kvpbench::arena_alloc(len);
    if (!dc->arena || kvp_create(&cfg, dc->arena, len, &dc->c) != KVP_OK) {
        dc->error = "kvp_create failed";
        dc->c = nullptr;
        return dc;
    }
    if (!empty) kvpbench::append_random(dc->c, 1, n, (size_t)kKvHeads * kHeadDim, &dc->error);
    return dc;
}

struct Result {
    std::string dtype;
    uint32_t n;
    int threads;
    double best_s = 1e30;
    size_t bytes = 0;
    double best_cpu = 1e30;  // process CPU seconds per step (all threads)
};
std::vector<Result> g_results;

size_t step_bytes_of(const std::string &dtype, uint32_t n) {
    // the stored bytes of N+1 tokens of one layer (as the benchmark computes after filling)
    kvp_config cfg;
    const kvp_model m = model();
    kvp_config_default(&cfg, &m);
    const std::string spec = "policy=window window=" + std::to_string(n) + " kv_dtype=" + dtype;
    char err[128];
    kvp_config_apply(&cfg, spec.c_str(), err, sizeof err);
    kvp::StoreFormat f;
    kvp::store_format(cfg, &f);
    if (dtype == "f32") return (size_t)(n + 1) * kKvHeads * kHeadDim * 8;
    // converted tokens: all but the residual; grids per block; residual f32 (at most a group)
    const uint64_t group = cfg.quant_group, conv = (uint64_t)(n + 1) / group * group, res = (n + 1) - conv;
    return (size_t)(kKvHeads * (conv * kvp::fmt_token_bytes(f) + (conv / group) * kvp::fmt_grid_bytes(f) +
                                res * kvp::fmt_residual_bytes(f)));
}

void BM_DecodeQ(benchmark::State &state, std::string dtype, uint32_t n, int threads) {
    DecodeCache *dc = get_cache(dtype, n, threads);
    if (!dc->error.empty()) {
        state.SkipWithError(dc->error.c_str());
        return;
    }
    std::vector<float> q((size_t)kQHeads * kHeadDim), k((size_t)kKvHeads * kHeadDim), v(k.size()), out(q.size());
    fill_random(q.data(), q.size(), 7);
    fill_random(k.data(), k.size(), 8);
    fill_random(v.data(), v.size(), 9);
    for (int w = 0; w < 3; ++w) kvp_decode(dc->c, 0, q.data(), k.data(), v.data(), out.data());  // warm up
    kvp_stats st;
    st.struct_size = sizeof st;
    kvp_get_stats(dc->c, &st);
    // what a step reads: N+1 tokens in the storage format (the window keeps N after the step)
    const size_t bytes = step_bytes_of(dtype, n);
    state.counters["live_MB"] = st.live_bytes / 1e6;
    kvp_status s = KVP_OK;
    const double t0 = now_s(), c0 = cpu_s();
    for (auto _ : state) {
        s = kvp_decode(dc->c, 0, q.data(), k.data(), v.data(), out.data());
        benchmark::DoNotOptimize(out[0]);
    }
    const double t = now_s() - t0, cpu = cpu_s() - c0;
    if (s != KVP_OK) {
        state.SkipWithError(kvp_last_error(dc->c));
        return;
    }
    const double per = t / (double)state.iterations();
    state.SetBytesProcessed((int64_t)((double)state.iterations() * (double)bytes));
    const double bw = best_bw(bytes, threads);
    state.counters["bw_frac"] = bw > 0 ? ((double)bytes / per) / bw : 0.0;
    state.counters["bw_GBps"] = bw / 1e9;
    state.counters["step_us"] = per * 1e6;
    const double cper = cpu / (double)state.iterations();
    state.counters["cpu_us"] = cper * 1e6;
    for (Result &r : g_results)
        if (r.dtype == dtype && r.n == n && r.threads == threads) {
            r.best_s = std::min(r.best_s, per);
            r.best_cpu = std::min(r.best_cpu, cper);
            r.bytes = bytes;
            return;
        }
    Result r{dtype, n, threads, per, bytes, cper};
    g_results.push_back(r);
}

void BM_PrefillQ(benchmark::State &state, std::string dtype, uint32_t P, int threads) {
    DecodeCache *dc = get_cache(dtype, P, threads, true);
    if (!dc->error.empty()) {
        state.SkipWithError(dc->error.c_str());
        return;
    }
    const uint32_t chunk = 512;
    std::vector<float> q((size_t)P * kQHeads * kHeadDim), k((size_t)P * kKvHeads * kHeadDim), v(k.size()),
        out((size_t)chunk * kQHeads * kHeadDim);
    fill_random(q.data(), q.size(), 17);
    fill_random(k.data(), k.size(), 18);
    fill_random(v.data(), v.size(), 19);
    kvp_status s = KVP_OK;
    const auto prompt = [&]() {
        s = kvp_reset(dc->c);
        for (uint32_t t0 = 0; t0 < P && s == KVP_OK; t0 += chunk) {
            const uint32_t m = P - t0 < chunk ? P - t0 : chunk;
            s = kvp_prefill(dc->c, 0, m, nullptr, q.data() + (size_t)t0 * kQHeads * kHeadDim,
                            k.data() + (size_t)t0 * kKvHeads * kHeadDim, v.data() + (size_t)t0 * kKvHeads * kHeadDim,
                            out.data(), nullptr);
        }
        benchmark::DoNotOptimize(out[0]);
    };
    prompt();  // warm up
    const double t0 = now_s();
    for (auto _ : state) prompt();
    const double per = (now_s() - t0) / (double)state.iterations();
    if (s != KVP_OK) {
        state.SkipWithError(kvp_last_error(dc->c));
        return;
    }
    state.counters["prompt_ms"] = per * 1e3;
    state.counters["tok_per_s"] = P / per;
}

// ---- kernel level ---------------------------------------------------------------------------------

// part: 0 = qk + pv, 1 = qk only, 2 = pv only (where a decode step's kernel time goes)
void BM_KernelQ(benchmark::State &state, std::string dtype, const kvp::kern::AttnQ *var, uint32_t n, int part) {
    const uint32_t rows = 4, d = kHeadDim, G = d / 32;
    const size_t rb = dtype == "f16" ? 2 * d : dtype == "q8" ? d : d / 2;
    std::vector<uint8_t> k(n * rb), v(n * rb);
    Rng g(5);
    for (auto &b : k) b = (uint8_t)g.next();
    for (auto &b : v) b = (uint8_t)g.next();
    if (dtype == "f16") {  // finite halves
        for (size_t i = 0; i < k.size(); i += 2) k[i + 1] &= 0x3b, v[i + 1] &= 0x3b;
    }
    std::vector<uint16_t> sz((size_t)n * 2 * G, 0x2000);
    std::vector<float> q(rows * d), logits(rows * n), out(rows * d), zacc(rows * G);
    fill_random(q.data(), q.size(), 1);
    auto pv = dtype == "f16" ? var->pv_f16 : dtype == "q8" ? var->pv_q8 : var->pv_q4;
    std::vector<int8_t> qi(rows * d, 3);
    std::vector<float> qsc(rows, 0.01f), bias(rows, 0.0f);
    for (float &x : logits) x = 1.0f / (float)n;
    auto step = [&]() {
        if (part != 2) {
            if (dtype == "f16")
                var->qk_f16(q.data(), d, rows, nullptr, k.data(), rb, n, d, 0.088f, logits.data(), n);
            else
                (dtype == "q8" ? var->qk_q8 : var->qk_q4)(qi.data(), d, rows, qsc.data(), bias.data(), k.data(), rb, n, d,
                                                          0.088f, logits.data(), n);
            benchmark::DoNotOptimize(logits[0]);
        }
        if (part != 1) {
            if (part == 0)
                for (float &x : logits) x = 1.0f / (float)n;
            pv(logits.data(), n, rows, v.data(), rb, sz.data(), 2 * G, n, d, out.data(), d, zacc.data(), G);
            benchmark::DoNotOptimize(out[0]);
        }
    };
    step();
    for (auto _ : state) step();
    state.SetBytesProcessed((int64_t)(state.iterations() * (int64_t)((part == 0 ? 2 : 1) * n * rb)));
}

}  // namespace

int main(int argc, char **argv) {
    const uint32_t sizes[] = {4096, 32768};
    const int thread_counts[] = {1, 2};
    for (uint32_t n : sizes)
        for (int t : thread_counts)
            for (const char *dt : kDtypes) {
                const size_t b = step_bytes_of(dt, n);
                benchmark::RegisterBenchmark(
                    ("BM_ReadBandwidth/" + std::to_string(b) + "/threads:" + std::to_string(t)).c_str(),
                    BM_ReadBandwidth, b, t)
                    ->UseRealTime();
            }
    for (uint32_t n : sizes)
        for (int t : thread_counts)
            for (const char *dt : kDtypes)
                benchmark::RegisterBenchmark(
                    ("BM_DecodeQ/" + std::string(dt) + "/N:" + std::to_string(n) + "/threads:" + std::to_string(t))
                        .c_str(),
                    BM_DecodeQ, std::string(dt), n, t)
                    ->UseRealTime();
    for (int t : thread_counts)
        for (const char *dt : kDtypes)
            benchmark::RegisterBenchmark(("BM_PrefillQ/" + std::string(dt) + "/P:4096/threads:" + std::to_string(t)).c_str(),
                                         BM_PrefillQ, std::string(dt), 4096u, t)
                ->UseRealTime();
    const kvp::kern::AttnQ *vars[] = {kvp::kern::attn_q_simde(), kvp::kern::attn_q_avx2(), kvp::kern::attn_q_avx512(),
                                      kvp::kern::attn_q_avx512z()};
    for (const kvp::kern::AttnQ *var : vars) {
        if (!var) continue;
        for (const char *dt : {"f16", "q8", "q4"})
            for (int part : {0, 1, 2})
                benchmark::RegisterBenchmark(("BM_KernelQ/" + std::string(dt) + "/" + var->name + "/N:4096" +
                                              (part == 1 ? "/qk" : part == 2 ? "/pv" : ""))
                                                 .c_str(),
                                             BM_KernelQ, std::string(dt), var, 4096u, part)
                    ->UseRealTime();
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("kernel_q_best", kvp::kern::attn_q_best()->name);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();

    // summary: best repetition per configuration, speedup over f32 of the same (N, threads)
    if (!g_results.empty()) {
        std::printf("\n| N | threads | dtype | step ms | MB read | GB/s | read GB/s | bw_frac | speedup vs f32 | CPU ms/step | CPU speedup |\n");
        std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (const Result &r : g_results) {
            double f32 = 0, f32c = 0;
            for (const Result &o : g_results)
                if (o.dtype == "f32" && o.n == r.n && o.threads == r.threads) {
                    f32 = o.best_s;
                    f32c = o.best_cpu;
                }
            const double bw = best_bw(r.bytes, r.threads);
            std::printf("| %u | %d | %s | %.3f | %.1f | %.2f | %.2f | %.2f | %.2fx | %.3f | %.2fx |\n", r.n, r.threads,
                        r.dtype.c_str(), r.best_s * 1e3, r.bytes / 1e6, r.bytes / r.best_s / 1e9, bw / 1e9,
                        bw > 0 ? r.bytes / r.best_s / bw : 0.0, f32 > 0 ? f32 / r.best_s : 0.0, r.best_cpu * 1e3,
                        f32c > 0 ? f32c / r.best_cpu : 0.0);
        }
    }
    for (DecodeCache *dc : g_caches) {
        kvp_destroy(dc->c);
        std::free(dc->arena);
        delete dc;
    }
    return 0;
}
