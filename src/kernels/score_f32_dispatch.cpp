// Variant selection for the scoring kernels (compiled at the baseline ISA).
#include "kernels/score_f32.h"

namespace kvp {
namespace kern {

const ScoreF32 *score_f32_simde() { return score_f32_simde_table(); }

const ScoreF32 *score_f32_avx2() {
#if defined(KVP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return score_f32_avx2_table();
#endif
    return nullptr;
}

const ScoreF32 *score_f32_best() {
    const ScoreF32 *a = score_f32_avx2();
    return a ? a : score_f32_simde();
}

}  // namespace kern
}  // namespace kvp
