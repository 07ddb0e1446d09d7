// Scoring kernels, SIMDe at the baseline ISA (SSE2 on x86-64, NEON on aarch64, plain C elsewhere).
#define KVP_SCORE_SUFFIX simde
#include "score_f32_simd.inc"
