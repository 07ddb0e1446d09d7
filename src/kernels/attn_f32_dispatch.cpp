// Variant selection for the fp32 attention kernels. Compiled at the baseline ISA: the CPU
// check must not sit in the AVX2 object.
#include "kernels/attn_f32.h"

#include <stdlib.h>
#include <string.h>

namespace kvp {
namespace kern {

const AttnF32 *attn_f32_simde() { return attn_f32_simde_table(); }

const AttnF32 *attn_f32_avx2() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();  // idempotent; needed if called before libgcc's constructor ran
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return attn_f32_avx2_table();
#endif
    return nullptr;
}

const AttnF32 *attn_f32_avx512() {
#if defined(KVP_HAVE_AVX512) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl"))
        return attn_f32_avx512_table();
#endif
    return nullptr;
}

const AttnF32 *attn_f32_best() {
#if !defined(KVP_NO_HEAP)
    // KVP_KERNEL=scalar|simde|avx2|avx512 picks a variant (benchmarks, A/B runs); a name that is
    // unknown or not available on this CPU is ignored.
    if (const char *want = getenv("KVP_KERNEL")) {
        const AttnF32 *cand[] = {attn_f32_scalar(), attn_f32_simde(), attn_f32_avx2(), attn_f32_avx512()};
        for (const AttnF32 *a : cand)
            if (a && strcmp(a->name, want) == 0) return a;
    }
#endif
    if (const AttnF32 *a = attn_f32_avx512()) return a;
    const AttnF32 *a = attn_f32_avx2();
    return a ? a : attn_f32_simde();
}

}  // namespace kern
}  // namespace kvp
