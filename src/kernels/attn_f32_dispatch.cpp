// Variant selection for the fp32 attention kernels. Compiled at the baseline ISA: the CPU
// check must not sit in the AVX2 object.
#include "kernels/attn_f32.h"

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

const AttnF32 *attn_f32_best() {
    const AttnF32 *a = attn_f32_avx2();
    return a ? a : attn_f32_simde();
}

}  // namespace kern
}  // namespace kvp
