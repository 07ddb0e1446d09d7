// The 512-bit value passes of the avx512z variant (KVP_ATTNQ_Z), compiled here at AVX2 + FMA so
// that SIMDe carries out each 512-bit operation as two native 256-bit ones (exact: the same
// FMAs lane by lane). test_quant_kernels checks this table bit for bit against the pinned FMA
// order on machines without AVX-512, where the library's own avx512z table cannot run. Only
// attn_q_zemu_table() is external (attn_q_simd.inc).
#define KVP_ATTNQ_SUFFIX zemu
#define KVP_ATTNQ_Z 1
#include "kernels/attn_q_simd.inc"
