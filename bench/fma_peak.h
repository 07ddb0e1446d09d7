// FMA peak micro-benchmark for the ISA of the attention kernels (bench_attention --sweep uses it
// to put prefill GFLOPS against what the machine can do).
//
// fma_peak_<isa>(iters) runs `iters` rounds of 12 independent 8-lane fused multiply-adds
// (simde_mm256_fmadd_ps, the instruction the kernels use; 12 chains hide the FMA latency on
// any core with <= 6 cycles latency x 2 pipes) and returns a value that depends on all of
// them (so the compiler keeps them). Flops per call: iters * 12 * 16.
//   simde  compiled at the baseline ISA (SSE2 on x86-64: the FMA is a multiply and an add on
//          two 4-lane halves, as in the simde kernel variant)
//   avx2   compiled with -mavx2 -mfma (x86-64 only); call only where the CPU has AVX2+FMA
#pragma once
#include <stdint.h>

namespace kvpbench {

const uint64_t kFmaChains = 12;
const uint64_t kFmaFlopsPerIter = kFmaChains * 16;

float fma_peak_simde(uint64_t iters);
float fma_peak_avx2(uint64_t iters);  // defined only when built with KVP_BENCH_AVX2

}  // namespace kvpbench
