// AVX2 + FMA variant (x86-64 only; this file is compiled with -mavx2 -mfma). Selected at run
// time by attn_f32_dispatch.cpp after a CPU check: nothing here may run on other CPUs.
#define KVP_ATTN_SUFFIX avx2
#include "attn_f32_simd.inc"
