// AVX2 variant (x86-64 only; compiled with -mavx2). Selected at run time by
// rotate_f32_scalar.cpp after a CPU check: nothing here may run on other CPUs.
#define KVP_ROT_SUFFIX avx2
#include "rotate_f32_simd.inc"
