// Helpers shared by bench_attention and bench_quant: a seeded generator, aligned buffers, clocks,
// and the plain read of a buffer at the ISA of the library's best f32 attention kernel (isa.h:
// at the baseline ISA the read loop is add-latency bound far below the caches' bandwidth, so a
// decode step would be compared with a weaker read than the machine can do), split over OpenMP
// threads. Header-only; the ISA bodies are in isa_<isa>.cpp (the kvp_bench_isa library).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "isa.h"
#include "kernels/attn_f32.h"
#include "kvprune/kvprune.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kvpbench {

struct Rng {  // splitmix64
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uni() { return (float)((next() >> 40) * (2.0 / 16777216.0) - 1.0); }  // [-1, 1)
};

inline void fill_random(float *x, size_t n, uint64_t seed) {
    Rng g(seed);
    for (size_t i = 0; i < n; ++i) x[i] = g.uni();
}

// Appends n tokens of seeded random K/V to each of `layers` layers of c (rows of `row` floats:
// KV heads x head_dim), in chunks of 1024 tokens: layer l's chunk at t0 draws K from seed
// 100 + t0 + l and V from 200 + t0 + l. false, with *err set, when an append fails.
inline bool append_random(kvp_cache *c, uint32_t layers, uint32_t n, size_t row, std::string *err) {
    const uint32_t chunk = 1024;
    std::vector<float> k((size_t)chunk * row), v((size_t)chunk * row);
    for (uint32_t l = 0; l < layers; ++l)
        for (uint32_t t0 = 0; t0 < n; t0 += chunk) {
            const uint32_t m = n - t0 < chunk ? n - t0 : chunk;
            fill_random(k.data(), m * row, 100 + t0 + l);
            fill_random(v.data(), m * row, 200 + t0 + l);
            const kvp_status s = kvp_append(c, l, m, nullptr, k.data(), v.data());
            if (s != KVP_OK) {
                *err = std::string("kvp_append: ") + kvp_status_str(s) + ": " + kvp_last_error(c);
                return false;
            }
        }
    return true;
}

// Memory as an engine should give it to kvprune (kvp_arena_advise): from 2 MiB on, whole huge
// pages on 2 MiB boundaries, advised before the first write; smaller, 64-byte aligned.
// KVP_BENCH_SMALL_PAGES=1 keeps 4 KiB pages (the A/B of docs/benchmarks.md "Huge pages"). Also
// the roofline's read buffers, so that the read roof is the machine's best read as well.
// Freed with std::free.
inline bool small_pages() {
    const char *small = std::getenv("KVP_BENCH_SMALL_PAGES");
    return small && *small && *small != '0';
}
inline const char *arena_pages() {  // for the reports' headers
    return small_pages() ? "4 KiB (KVP_BENCH_SMALL_PAGES)" : "huge pages advised from 2 MiB on (kvp_arena_advise)";
}
inline void *arena_alloc(size_t len) {
    const size_t huge = size_t(2) << 20;
    const size_t al = len >= huge && !small_pages() ? huge : 64;
    const size_t n = (len + al - 1) / al * al;
    void *p = std::aligned_alloc(al, n ? n : al);
    if (p && al == huge) kvp_arena_advise(p, n);
    return p;
}

struct AlignedBuf {  // 64-byte aligned floats (arena_alloc), freed with the object
    float *p = nullptr;
    size_t n = 0;
    explicit AlignedBuf(size_t floats) : n(floats) {
        p = static_cast<float *>(arena_alloc(floats * sizeof(float)));
        if (!p) std::abort();
    }
    ~AlignedBuf() { std::free(p); }
    AlignedBuf(const AlignedBuf &) = delete;
    AlignedBuf &operator=(const AlignedBuf &) = delete;
};

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the whole process (every thread): on a machine shared with other jobs the wall
// time of a step includes waiting for a core; the CPU time is the work, stalls on memory included.
inline double cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Sum of x[0..n), n a multiple of 32, x 32-byte aligned: four independent accumulators at the
// ISA of the best f32 attention kernel.
inline float read_block(const float *x, size_t n) {
    static const std::string isa = kvp::kern::attn_f32_best()->name;
#ifdef KVP_BENCH_AVX512
    if (isa == "avx512") return read_avx512(x, n);
#endif
#ifdef KVP_BENCH_AVX2
    if (isa == "avx2") return read_avx2(x, n);
#endif
    return read_simde(x, n);
}

const size_t kReadChunk = 16384;  // floats (64 KiB) per OpenMP work item

// read_block over x[0..n) in kReadChunk pieces shared by `threads` OpenMP threads (one parallel
// region per call).
inline float read_all(const float *x, size_t n, int threads) {
    const long chunks = (long)(n / kReadChunk);
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
#endif
    for (long c = 0; c < chunks; ++c) total += read_block(x + (size_t)c * kReadChunk, kReadChunk);
    (void)threads;
    return total + read_block(x + (size_t)chunks * kReadChunk, n - (size_t)chunks * kReadChunk);
}

}  // namespace kvpbench
