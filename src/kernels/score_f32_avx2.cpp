// Scoring kernels, AVX2 + FMA (x86-64 only; compiled with -mavx2 -mfma). Selected at run time by
// score_f32_dispatch.cpp after a CPU check: nothing here may run on other CPUs.
#define KVP_SCORE_SUFFIX avx2
#include "score_f32_simd.inc"
