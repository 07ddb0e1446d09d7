// Half-precision inputs and outputs of the token calls (issue 21 item 7: kvp_prefill_ex,
// kvp_decode_ex, kvp_append_ex). The core reads q, k and v and writes out through these two
// handles: an address and the element type. Every place that reads the caller's rows (the copy
// of a K/V row into its store row or staging row, the copy of a query row into the rotation
// scratch, the quantization of a query row for score=fixed, ThinK's copy of its observation
// queries, the draft region's copy) converts there, in that pass: the f32 path is the same code
// with a memcpy. f16 and bf16 widen to f32 exactly, so every step after the first pass sees the
// f32 call's bits; outputs are computed in f32 and rounded once to the caller's type (round to
// nearest even) as they are written.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

namespace kvp {

// kvp_io_dtype's numbers (kvprune.h).
enum : uint32_t { kIoF32 = 0, kIoF16 = 1, kIoBF16 = 2 };

inline size_t io_size(uint32_t dt) { return dt == kIoF32 ? 4 : 2; }

inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// IEEE binary16 -> float, exact (subnormals included; Inf and NaN kept).
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em >= 0x7c00u) return bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    // em << 13 is the value scaled by 2^-112 as float bits (a half subnormal becomes an f32
    // subnormal); the multiplication by 2^112 is exact.
    return bits_f32(sign | f32_bits(bits_f32(em << 13) * 5.192296858534828e33f));
}
inline float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

// float -> binary16, round to nearest even (overflow to Inf, NaN stays NaN).
inline uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
    if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520: rounds to Inf
    if (x < 0x38800000u) {  // below 2^-14: a half subnormal (or 0); the float addition rounds
        const float r = bits_f32(x) + 0.5f;  // to the half subnormal grid (2^-24), nearest even
        return uint16_t(sign | (f32_bits(r) - 0x3f000000u));
    }
    x += 0xc8000fffu + ((x >> 13) & 1u);  // rebias (127 -> 15) and round to nearest even
    return uint16_t(sign | (x >> 13));
}
// float -> bfloat16, round to nearest even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// n elements of type dt at src -> floats at dst.
void io_load(float *dst, const void *src, uint32_t dt, size_t n);
// n floats -> n elements of type dt at dst.
void io_store(void *dst, uint32_t dt, const float *src, size_t n);
// Index of the first element of src (type dt) that is NaN, Inf or |x| >= 2^56; n if none.
size_t io_first_out_of_range(const void *src, uint32_t dt, size_t n);

// Caller rows to read: element offsets, as with a float pointer.
struct In {
    const void *p = nullptr;
    uint32_t dt = kIoF32;
    In() = default;
    In(const float *f) : p(f) {}  // NOLINT: the f32 calls pass their pointers as they are
    In(const void *q, uint32_t t) : p(q), dt(t) {}
    In operator+(size_t e) const { return In(static_cast<const char *>(p) + e * io_size(dt), dt); }
    explicit operator bool() const { return p != nullptr; }
    // The rows as floats when they are floats, else NULL.
    const float *f32() const { return dt == kIoF32 ? static_cast<const float *>(p) : nullptr; }
    void load(float *dst, size_t n) const {
        if (dt == kIoF32) memcpy(dst, p, n * sizeof(float));
        else io_load(dst, p, dt, n);
    }
};

// Caller rows to write.
struct Out {
    void *p = nullptr;
    uint32_t dt = kIoF32;
    Out() = default;
    Out(float *f) : p(f) {}  // NOLINT
    Out(void *q, uint32_t t) : p(q), dt(t) {}
    Out operator+(size_t e) const { return Out(static_cast<char *>(p) + e * io_size(dt), dt); }
    explicit operator bool() const { return p != nullptr; }
    float *f32() const { return dt == kIoF32 ? static_cast<float *>(p) : nullptr; }
    void store(const float *src, size_t n) const {
        if (dt == kIoF32) memcpy(p, src, n * sizeof(float));
        else io_store(p, dt, src, n);
    }
};

}  // namespace kvp
