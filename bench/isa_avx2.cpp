// Bench baselines with AVX2+FMA (see isa.h); compiled with -mavx2 -mfma, x86-64 only.
#define KVP_BENCH_ISA avx2
#include "isa.inc"
