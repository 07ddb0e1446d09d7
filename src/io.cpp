#include "io.h"

#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define KVP_IO_F16C 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define KVP_IO_F16C 0
#endif

namespace kvp {
namespace {

#if KVP_IO_F16C
// F16C and AVX2 (CPUID.1:ECX bits 29 and 28, leaf 7 EBX bit 5): the hardware conversions, which
// round to nearest even as f32_to_f16 does and widen exactly (the same bits as the scalar code).
// Detected once per process: 0 not yet, 1 no, 2 yes (a race only repeats the detection; no
// function-local static, whose guard would pull in the C++ runtime).
int g_f16c = 0;
bool has_f16c() {
    int v = __atomic_load_n(&g_f16c, __ATOMIC_RELAXED);
    if (!v) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool yes = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && (c & (1u << 28));
        if (yes) {
            __builtin_cpu_init();
            yes = __builtin_cpu_supports("avx2") != 0;
        }
        v = yes ? 2 : 1;
        __atomic_store_n(&g_f16c, v, __ATOMIC_RELAXED);
    }
    return v == 2;
}

__attribute__((target("avx2,f16c"))) void load_f16c(float *dst, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i))));
    for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

__attribute__((target("avx2,f16c"))) void store_f16c(uint16_t *d, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
}

__attribute__((target("avx2"))) void load_bf16_avx2(float *dst, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}
#endif

}  // namespace

void io_load(float *dst, const void *src, uint32_t dt, size_t n) {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    if (dt == kIoBF16) {
#if KVP_IO_F16C
        if (has_f16c()) return load_bf16_avx2(dst, s, n);
#endif
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
    } else if (dt == kIoF16) {
#if KVP_IO_F16C
        if (has_f16c()) return load_f16c(dst, s, n);
#endif
        for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
    } else {
        memcpy(dst, src, n * sizeof(float));
    }
}

void io_store(void *dst, uint32_t dt, const float *src, size_t n) {
    uint16_t *d = static_cast<uint16_t *>(dst);
    if (dt == kIoBF16) {
        for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    } else if (dt == kIoF16) {
#if KVP_IO_F16C
        if (has_f16c()) return store_f16c(d, src, n);
#endif
        for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
    } else {
        memcpy(dst, src, n * sizeof(float));
    }
}

size_t io_first_out_of_range(const void *src, uint32_t dt, size_t n) {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    // f16: exponent all ones (its largest finite value, 65504, is far below 2^56); bf16: the f32
    // test on the high half (|x| >= 2^56 or not finite: biased exponent >= 127 + 56).
    const uint16_t lim = dt == kIoF16 ? 0x7c00u : uint16_t(((127u + 56u) << 23) >> 16);
    const uint16_t mask = dt == kIoF16 ? 0x7c00u : 0x7fffu;
    size_t i = 0;
    // blocks of 64: a branch-free OR over the block (vectorised), then the exact index
    for (; i + 64 <= n; i += 64) {
        uint32_t any = 0;
        for (size_t j = 0; j < 64; ++j) any |= uint32_t((s[i + j] & mask) >= lim);
        if (any) break;
    }
    for (; i < n; ++i)
        if ((s[i] & mask) >= lim) return i;
    return n;
}

}  // namespace kvp
