#include "io.h"

namespace kvp {

void io_load(float *dst, const void *src, uint32_t dt, size_t n) {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    if (dt == kIoBF16) {
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
    } else if (dt == kIoF16) {
        for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
    } else {
        memcpy(dst, src, n * sizeof(float));
    }
}

void io_store(void *dst, uint32_t dt, const float *src, size_t n) {
    uint16_t *d = static_cast<uint16_t *>(dst);
    if (dt == kIoBF16) {
        for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    } else if (dt == kIoF16) {
        for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
    } else {
        memcpy(dst, src, n * sizeof(float));
    }
}

size_t io_first_out_of_range(const void *src, uint32_t dt, size_t n) {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    // f16: exponent all ones (its largest finite value, 65504, is far below 2^56); bf16: the f32
    // test on the high half (|x| >= 2^56 or not finite: biased exponent >= 127 + 56).
    const uint16_t lim = dt == kIoF16 ? 0x7c00u : uint16_t(((127u + 56u) << 23) >> 16);
    const uint16_t mask = dt == kIoF16 ? 0x7c00u : 0x7fffu;
    size_t i = 0;
    // blocks of 64: a branch-free OR over the block, then the exact index
    for (; i + 64 <= n; i += 64) {
        uint32_t any = 0;
        for (size_t j = 0; j < 64; ++j) any |= uint32_t((s[i + j] & mask) >= lim);
        if (any) break;
    }
    for (; i < n; ++i)
        if ((s[i] & mask) >= lim) return i;
    return n;
}

}  // namespace kvp
