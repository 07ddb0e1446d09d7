// AVX2 variant (x86-64 only; compiled with -mavx2 -mfma). Selected at run time by
// vec_f32_dispatch.cpp after a CPU check: nothing here may run on other CPUs.
#define KVP_VEC_SUFFIX avx2
#include "vec_f32_simd.inc"
