// AVX-512 variant (x86-64 only; this file is compiled with -mavx2 -mfma -mavx512f -mavx512vl).
// Selected at run time by attn_f32_dispatch.cpp after a CPU check: nothing here may run on
// other CPUs. Same arithmetic and order as the avx2 variant (same bits), wider blocks: see
// attn_f32_simd.inc.
//
// GCC 12's <avx512fintrin.h> builds the unmasked forms of max/min/roundscale/slli/extract on
// _mm512_undefined_*(), which that version reports as -Wmaybe-uninitialized once inlined (GCC
// PR 105593, fixed in GCC 13). The value is never read: silence that warning for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define KVP_ATTN_SUFFIX avx512
#define KVP_ATTN_AVX512 1
#include "attn_f32_simd.inc"
