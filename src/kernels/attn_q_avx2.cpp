// Stored-format attention kernels, AVX2 + FMA + F16C (x86-64 only; compiled with -mavx2 -mfma
// -mf16c). Selected at run time by attn_q_dispatch.cpp after a CPU check.
#define KVP_ATTNQ_SUFFIX avx2
#include "attn_q_simd.inc"
