// Stored-format attention kernels, AVX2 + FMA + F16C + AVX-512 VL/BW/VNNI (x86-64 only): the
// 256-bit source of attn_q_simd.inc with 32 registers and dpbusd. Selected at run time by
// attn_q_dispatch.cpp after a CPU check.
#define KVP_ATTNQ_SUFFIX avx512
#include "attn_q_simd.inc"
