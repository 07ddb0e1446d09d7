// SIMDe variant at the baseline ISA (SSE2 on x86-64, NEON on aarch64, plain C elsewhere).
#define KVP_ROT_SUFFIX simde
#include "rotate_f32_simd.inc"
