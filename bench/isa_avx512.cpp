// Bench baselines with AVX-512 (see isa.h); compiled with -mavx2 -mfma -mavx512f -mavx512vl.
#define KVP_BENCH_ISA avx512
#define KVP_BENCH_W512 1
#include "isa.inc"
