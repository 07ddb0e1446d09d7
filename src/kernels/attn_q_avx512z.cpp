// Stored-format attention kernels, AVX-512 with 512-bit value passes (x86-64 only): the source
// of attn_q_simd.inc as attn_q_avx512.cpp compiles it, plus KVP_ATTNQ_Z (pv takes 64 channels of
// a token per pass in 16-lane vectors). Same bits as every other FMA variant; chosen at run time
// by attn_q_dispatch.cpp on cores whose AVX-512 units are full width.
//
// GCC 12's <avx512fintrin.h> builds unmasked 512-bit forms on _mm512_undefined_*(), which that
// version reports as -W(maybe-)uninitialized once inlined (GCC PR 105593, fixed in GCC 13; as
// attn_f32_avx512.cpp). The value is never read: silence those warnings for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define KVP_ATTNQ_SUFFIX avx512z
#define KVP_ATTNQ_Z 1
#include "attn_q_simd.inc"
