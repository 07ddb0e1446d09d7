// Variant selection for the stored-format attention kernels (compiled at the baseline ISA).
#include "kernels/attn_q.h"

#include <stdlib.h>
#include <string.h>

#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

namespace kvp {
namespace kern {

#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
namespace {
// F16C (CPUID.1:ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
}  // namespace
#endif

namespace {
// Whether a 512-bit operation runs at full width. No CPUID bit says so; every Intel core with
// AVX-512 has 512-bit data paths, while Zen 4 splits each 512-bit operation into two 256-bit halves.
// Measured (docs/DECISIONS.md "avx512z on full-width cores"): on an Emerald Rapids Xeon the 512-bit
// value passes are faster; on Zen 4 they tie or lose. Zen 5 is not measured, so AMD keeps avx512.
bool full_width_512() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
#else
    return false;
#endif
}
}  // namespace

const AttnQ *attn_q_simde() { return attn_q_simde_table(); }

const AttnQ *attn_q_avx2() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        return attn_q_avx2_table();
#endif
    return nullptr;
}

const AttnQ *attn_q_avx512() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (attn_q_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        return attn_q_avx512_table();
#endif
    return nullptr;
}

const AttnQ *attn_q_avx512z() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    if (attn_q_avx512()) return attn_q_avx512z_table();
#endif
    return nullptr;
}

const AttnQ *attn_q_best() {
#if !defined(KVP_NO_HEAP)
    if (const char *want = getenv("KVP_KERNEL_Q")) {
        const AttnQ *cand[] = {attn_q_scalar(), attn_q_simde(), attn_q_avx2(), attn_q_avx512(), attn_q_avx512z()};
        for (const AttnQ *q : cand)
            if (q && strcmp(q->name, want) == 0) return q;
    }
#endif
    const AttnQ *a = attn_q_avx512();
    if (a && full_width_512()) a = attn_q_avx512z();
    if (!a) a = attn_q_avx2();
    return a ? a : attn_q_simde();
}

}  // namespace kern
}  // namespace kvp
