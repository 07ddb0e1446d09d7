// AVX-512 variant (x86-64 only; this file is compiled with -mavx2 -mfma -mavx512f -mavx512vl).
// Selected at run time by attn_f32_dispatch.cpp after a CPU check: nothing here may run on
// other CPUs. Same arithmetic and order as the avx2 variant (same bits), wider blocks: see
// attn_f32_simd.inc.
#define KVP_ATTN_SUFFIX avx512
#define KVP_ATTN_AVX512 1
#include "attn_f32_simd.inc"
