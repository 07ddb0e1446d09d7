// Machine baselines for bench_attention, compiled once per kernel ISA (isa.inc), so that the
// attention kernels are compared with what the same instruction set can do:
//   simde  baseline ISA (SSE2 on x86-64: 256-bit SIMDe ops run as two 128-bit halves)
//   avx2   -mavx2 -mfma (x86-64 only; call only where the CPU has AVX2+FMA)
//   avx512 -mavx512f -mavx512vl as well: 16-lane FMAs and 64-byte loads (x86-64 only; call only
//          where attn_f32_avx512() is available)
//
// fma_peak_<isa>(iters): `iters` rounds of 12 independent 8-lane fused multiply-adds
//   (simde_mm256_fmadd_ps, the instruction the kernels use; 12 chains hide the FMA latency on
//   any core with latency x pipes <= 12). Returns a value that depends on all of them. Flops per
//   call: iters * kFmaFlopsPerIter.
// idot_peak_<isa>(iters, products) (simde, avx2): `iters` rounds of 12 independent vpmaddwd
//   (int16 x int16 pairs into int32 lanes: the integer product the q8/q4 key kernels use without
//   VNNI); *products = the products done (16 per 8-lane op).
// idot_peak_vnni(iters, products, wide) (x86-64 with AVX-512 VNNI; call only where
//   attn_q_avx512() is available): 12 chains of vpdpbusd (u8 x s8, four products per int32 lane,
//   accumulated), 8 lanes (wide = 0: what the kernels use) or 16 (wide = 1).
// read_<isa>(x, n): sum of x[0..n), n a multiple of 32, x 32-byte aligned: four independent
//   8-lane accumulators of aligned loads (the plain read that decode attention is measured
//   against). At the baseline ISA this loop is add-latency bound at cache-resident sizes (about
//   27 GB/s on the 2-core EPYC VM where AVX2 reads 90-100 GB/s from L2/L3), which is why the
//   read runs at the kernel's ISA.
// read_pf_<isa>(x, n, pf): the same sum with four accumulators and, when pf > 0, a software
//   prefetch (into L2, as the kernels do) of each 64-byte line pf bytes ahead: the roofline
//   mode's read is the best of plain and prefetched reads, so that a kernel with software
//   prefetch is not compared with a weaker read than the machine can do.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvpbench {

const uint64_t kFmaChains = 12;
const uint64_t kFmaFlopsPerIter = kFmaChains * 16;

float fma_peak_simde(uint64_t iters);
float idot_peak_simde(uint64_t iters, uint64_t *products);
float read_simde(const float *x, size_t n);
float read_pf_simde(const float *x, size_t n, size_t pf);
#ifdef KVP_BENCH_AVX2
float fma_peak_avx2(uint64_t iters);
float idot_peak_avx2(uint64_t iters, uint64_t *products);
float read_avx2(const float *x, size_t n);
float read_pf_avx2(const float *x, size_t n, size_t pf);
#endif
#ifdef KVP_BENCH_AVX512
float fma_peak_avx512(uint64_t iters);
float read_avx512(const float *x, size_t n);
float read_pf_avx512(const float *x, size_t n, size_t pf);
#endif
#ifdef KVP_BENCH_VNNI
float idot_peak_vnni(uint64_t iters, uint64_t *products, int wide);
#endif

}  // namespace kvpbench
