// Integer-dot peak with AVX-512 VNNI (see isa.h); compiled with -mavx512f -mavx512vl -mavx512bw
// -mavx512vnni and called only where the q kernels' avx512 variant runs (it checks VNNI).
#include "isa.h"

#include <simde/x86/avx512.h>

namespace kvpbench {

namespace {
template <class V, class Dp, class Add, class St>
float chains(uint64_t iters, V x, V y, V a0, Dp dp, Add add, int32_t *lanes, St store) {
    V a[12];
    for (int i = 0; i < 12; ++i) a[i] = a0;
    for (uint64_t i = 0; i < iters; ++i)
        for (int j = 0; j < 12; ++j) a[j] = dp(a[j], x, y);
    V t = a[0];
    for (int j = 1; j < 12; ++j) t = add(t, a[j]);
    store(lanes, t);
    return (float)lanes[0];
}
}  // namespace

float idot_peak_vnni(uint64_t iters, uint64_t *products, int wide) {
    int32_t lanes[16];
    const int s = (int)(iters & 7) + 1;
    if (wide) {
        *products = iters * 12 * 64;
        return chains(
            iters, simde_mm512_set1_epi8((char)s), simde_mm512_set1_epi8(3), simde_mm512_set1_epi32(s),
            [](simde__m512i a, simde__m512i x, simde__m512i y) { return simde_mm512_dpbusd_epi32(a, x, y); },
            [](simde__m512i a, simde__m512i b) { return simde_mm512_add_epi32(a, b); }, lanes,
            [](int32_t *o, simde__m512i v) { simde_mm512_storeu_si512((void *)o, v); });
    }
    *products = iters * 12 * 32;
    return chains(
        iters, simde_mm256_set1_epi8((char)s), simde_mm256_set1_epi8(3), simde_mm256_set1_epi32(s),
        [](simde__m256i a, simde__m256i x, simde__m256i y) { return simde_mm256_dpbusd_epi32(a, x, y); },
        [](simde__m256i a, simde__m256i b) { return simde_mm256_add_epi32(a, b); }, lanes,
        [](int32_t *o, simde__m256i v) { simde_mm256_storeu_si256((simde__m256i *)o, v); });
}

}  // namespace kvpbench
