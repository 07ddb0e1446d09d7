// Stored-format attention kernels, SIMDe at the baseline ISA (SSE2 / NEON / plain C).
#define KVP_ATTNQ_SUFFIX simde
#include "attn_q_simd.inc"
