// FMA peak with AVX2+FMA (see fma_peak.h); compiled with -mavx2 -mfma, x86-64 only.
#define KVP_FMA_PEAK_NAME fma_peak_avx2
#include "fma_peak.inc"
