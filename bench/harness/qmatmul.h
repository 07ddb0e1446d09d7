// Matrix products on quantized GGUF weights kept as they are in the mapped file (harness only).
//
// out[t][o] = W[o] . x[t] for t < n, o < out_dim, where W's rows are blocks of a ggml type. q8_0,
// q4_0 and q5_0 go through an AVX2+FMA kernel (block weights as 4 vectors of 8, acc += d * (w . x)),
// q4_K, q5_K, q6_K, q4_1, q5_1, q8_1, q2_K, q3_K, iq4_nl, iq4_xs, f16 and bf16 through one that
// dequantizes each 32-element sub-block into 4 vectors (acc += w x);
// other types (and CPUs without AVX2, or KVPRUNE_NO_AVX2=1) dequantize 16 rows at a time into a
// small buffer and dot them with every x row using the 8-lane accumulator order of the f32 path; rows of W are split among
// `threads` threads, each output element is computed by one thread in a fixed order, so results
// do not depend on the thread count, nor on whether a row came in a prefill or a decode. The
// portable kernel is compiled for AVX-512, AVX2 and the baseline (chosen at run time): bits can
// differ between CPUs, never between runs or thread counts.
#pragma once
#include <cstdint>

namespace kvh {

struct QView {
    uint32_t type = 0;             // ggml type (GgmlType)
    const uint8_t *data = nullptr; // row-major blocks, row_bytes apart
    uint64_t row_bytes = 0;
    explicit operator bool() const { return data != nullptr; }
};

void matmul_q(float *out, const float *x, const QView &W, int n, int in_dim, int out_dim, int threads);

}  // namespace kvh
