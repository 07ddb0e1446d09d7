// Variant selection for the row-wise vector ops (compiled at the baseline ISA).
#include "kernels/vec_f32.h"

#include <stdlib.h>
#include <string.h>

namespace kvp {
namespace kern {

const VecF32 *vec_f32_simde() { return vec_f32_simde_table(); }

const VecF32 *vec_f32_avx2() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return vec_f32_avx2_table();
#endif
    return nullptr;
}

const VecF32 *vec_f32_best() {
#if !defined(KVP_NO_HEAP)
    if (const char *want = getenv("KVP_KERNEL")) {  // as attn_f32_best; avx512 -> avx2
        if (strcmp(want, "scalar") == 0) return vec_f32_scalar();
        if (strcmp(want, "simde") == 0) return vec_f32_simde();
    }
#endif
    const VecF32 *a = vec_f32_avx2();
    return a ? a : vec_f32_simde();
}

}  // namespace kern
}  // namespace kvp
