// A GGUF writer for tests and benchmarks, written from the format description and independent of
// the reader (bench/harness/gguf.cpp): metadata of every scalar type, string and array values,
// tensors with raw bytes, the alignment padding. Also the reference block encoders the tests
// use to make weights (f16/bf16 rounding; q8_0, q8_1, q4_1, q5_0, q5_1 and q5_K quantization written
// from the specification).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gguftest {

inline void put(std::string &o, const void *p, size_t n) { o.append(static_cast<const char *>(p), n); }
inline void put32(std::string &o, uint32_t v) { put(o, &v, 4); }
inline void put64(std::string &o, uint64_t v) { put(o, &v, 8); }
inline void putstr(std::string &o, const std::string &s) {
    put64(o, s.size());
    o += s;
}

struct Writer {
    uint32_t version = 3;
    uint64_t align = 32;
    uint64_t n_kv = 0;
    std::string meta;
    struct T {
        std::string name;
        std::vector<uint64_t> ne;
        uint32_t type;
        std::string bytes;
    };
    std::vector<T> tensors;

    void key(const std::string &k, uint32_t type) {
        putstr(meta, k);
        put32(meta, type);
        n_kv++;
    }
    void str(const std::string &k, const std::string &v) { key(k, 8); putstr(meta, v); }
    void u32(const std::string &k, uint32_t v) { key(k, 4); put32(meta, v); }
    void i32(const std::string &k, int32_t v) { key(k, 5); put(meta, &v, 4); }
    void u64(const std::string &k, uint64_t v) { key(k, 10); put64(meta, v); }
    void f32(const std::string &k, float v) { key(k, 6); put(meta, &v, 4); }
    void f64(const std::string &k, double v) { key(k, 12); put(meta, &v, 8); }
    void boolean(const std::string &k, bool v) { key(k, 7); meta.push_back(v ? 1 : 0); }
    void str_arr(const std::string &k, const std::vector<std::string> &v) {
        key(k, 9);
        put32(meta, 8);
        put64(meta, v.size());
        for (auto &s : v) putstr(meta, s);
    }
    void f32_arr(const std::string &k, const std::vector<float> &v) {
        key(k, 9);
        put32(meta, 6);
        put64(meta, v.size());
        put(meta, v.data(), v.size() * 4);
    }
    void i32_arr(const std::string &k, const std::vector<int32_t> &v) {
        key(k, 9);
        put32(meta, 5);
        put64(meta, v.size());
        put(meta, v.data(), v.size() * 4);
    }
    void tensor(const std::string &name, std::vector<uint64_t> ne, uint32_t type, std::string bytes) {
        tensors.push_back({name, std::move(ne), type, std::move(bytes)});
    }
    void tensor_f32(const std::string &name, std::vector<uint64_t> ne, const float *v, size_t n) {
        tensor(name, std::move(ne), 0, std::string(reinterpret_cast<const char *>(v), n * 4));
    }
    std::string bytes() const {
        std::string o = "GGUF";
        put32(o, version);
        put64(o, tensors.size());
        put64(o, n_kv);
        o += meta;
        uint64_t off = 0;
        for (auto &t : tensors) {
            putstr(o, t.name);
            put32(o, (uint32_t)t.ne.size());
            for (uint64_t d : t.ne) put64(o, d);
            put32(o, t.type);
            put64(o, off);
            off += (t.bytes.size() + align - 1) / align * align;
        }
        while (o.size() % align) o.push_back(0);
        for (auto &t : tensors) {
            o += t.bytes;
            while (o.size() % align) o.push_back(0);
        }
        return o;
    }
    bool write(const std::string &path) const {
        std::string b = bytes();
        FILE *f = std::fopen(path.c_str(), "wb");
        if (!f) return false;
        bool ok = std::fwrite(b.data(), 1, b.size(), f) == b.size();
        return std::fclose(f) == 0 && ok;
    }
};

// IEEE half from float, round to nearest even (normal range and subnormals; no overflow handling
// needed for test magnitudes).
inline uint16_t to_f16(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    const uint32_t sign = (b >> 16) & 0x8000;
    const float a = std::fabs(x);
    if (a == 0) return (uint16_t)sign;
    int e;
    const double m = std::frexp((double)a, &e);  // a = m * 2^e, m in [0.5, 1)
    if (e - 1 < -14) {                          // subnormal: units of 2^-24
        const double q = std::nearbyint((double)a / std::ldexp(1.0, -24));
        return (uint16_t)(sign | (uint32_t)q);
    }
    double q = std::nearbyint(m * 2048.0);  // 11 significant bits
    if (q >= 2048.0) {
        q /= 2;
        e++;
    }
    return (uint16_t)(sign | (uint32_t)(e - 1 + 15) << 10 | ((uint32_t)q & 1023));
}
inline double from_f16(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? std::ldexp((double)m, -24) : std::ldexp(1024.0 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

// q8_0 blocks of x (n a multiple of 32): d = max|x| / 127 as f16, q = round(x / d).
inline std::string quant_q8_0(const float *x, size_t n) {
    std::string o;
    for (size_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = std::fmax(amax, std::fabs(x[32 * b + i]));
        const uint16_t dh = to_f16(amax / 127.0f);
        const double d = from_f16(dh);
        put(o, &dh, 2);
        for (int i = 0; i < 32; i++) {
            const long q = d == 0 ? 0 : std::lround(x[32 * b + i] / d);
            o.push_back((char)(int8_t)std::max(-127L, std::min(127L, q)));
        }
    }
    return o;
}

inline void put_f16(std::string &o, float x) {
    const uint16_t h = to_f16(x);
    put(o, &h, 2);
}

// q8_1 blocks: q8_0's d and quants with s = d * sum(q) as f16 between them (36 bytes).
inline std::string quant_q8_1(const float *x, size_t n) {
    std::string o;
    const std::string q8 = quant_q8_0(x, n);
    for (size_t b = 0; b < n / 32; b++) {
        const char *blk = q8.data() + 34 * b;
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        long sum = 0;
        for (int i = 0; i < 32; i++) sum += (int8_t)blk[2 + i];
        put(o, &dh, 2);
        put_f16(o, (float)(from_f16(dh) * (double)sum));
        o.append(blk + 2, 32);
    }
    return o;
}

// q4_1 / q5_1 (bits 4 / 5, with a minimum) and q5_0 (bits 5, symmetric) blocks of 32 from the
// format description: element i < 16 is the low nibble of quant byte i, element i >= 16 the high
// nibble of byte i - 16; q5 keeps bit 4 of element i in bit i of a little-endian u32 placed before
// the nibbles. q4_1 / q5_1: value d q + m with m = min(x), d = (max - min) / (2^bits - 1);
// q5_0: value d (q - 16) with d = -(the element of largest magnitude) / 16, as ggml's quantizer.
inline std::string quant_q_n(const float *x, size_t n, int bits, bool with_min) {
    std::string o;
    const int top = (1 << bits) - 1;
    for (size_t b = 0; b < n / 32; b++) {
        const float *v = x + 32 * b;
        float lo = v[0], hi = v[0], big = v[0];
        for (int i = 0; i < 32; i++) {
            lo = std::fmin(lo, v[i]);
            hi = std::fmax(hi, v[i]);
            if (std::fabs(v[i]) > std::fabs(big)) big = v[i];
        }
        uint16_t dh, mh = 0;
        if (with_min) {
            dh = to_f16((hi - lo) / (float)top);
            mh = to_f16(lo);
        } else {
            dh = to_f16(-big / 16.0f);
        }
        const double d = from_f16(dh), m = from_f16(mh);
        int q[32];
        for (int i = 0; i < 32; i++) {
            long k = d == 0 ? 0 : std::lround(with_min ? (v[i] - m) / d : v[i] / d + 16);
            q[i] = (int)std::max(0L, std::min((long)top, k));
        }
        put(o, &dh, 2);
        if (with_min) put(o, &mh, 2);
        if (bits == 5) {
            uint32_t h = 0;
            for (int i = 0; i < 32; i++) h |= (uint32_t)((q[i] >> 4) & 1) << i;
            put32(o, h);
        }
        for (int i = 0; i < 16; i++) o.push_back((char)((q[i] & 15) | (q[i + 16] & 15) << 4));
    }
    return o;
}
inline std::string quant_q4_1(const float *x, size_t n) { return quant_q_n(x, n, 4, true); }
inline std::string quant_q5_0(const float *x, size_t n) { return quant_q_n(x, n, 5, false); }
inline std::string quant_q5_1(const float *x, size_t n) { return quant_q_n(x, n, 5, true); }

// q5_K super-blocks of 256 (176 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8
// sub-blocks of 32 (sub-block s < 4: scale = low 6 bits of byte s, min = low 6 bits of byte s + 4;
// s >= 4: scale = low nibble of byte s + 4 | top 2 bits of byte s - 4 as bits 4..5, min = high nibble
// of byte s + 4 | top 2 bits of byte s as bits 4..5), 32 bytes of fifth bits (bit s of byte l for
// element l of sub-block s), 128 bytes of nibbles (sub-block s in bytes 32 (s / 2) .. + 31, low
// nibble when s is even); value d scale q - dmin min. A plain quantizer: per sub-block step
// (max - min) / 31 and offset -min (min clipped to <= 0), both quantized to 6 bits of d / dmin.
inline std::string quant_q5_K(const float *x, size_t n) {
    std::string o;
    for (size_t b = 0; b < n / 256; b++) {
        const float *v = x + 256 * b;
        float step[8], off[8], smax = 0, omax = 0;
        for (int s = 0; s < 8; s++) {
            float lo = 0, hi = v[32 * s];
            for (int l = 0; l < 32; l++) {
                lo = std::fmin(lo, v[32 * s + l]);
                hi = std::fmax(hi, v[32 * s + l]);
            }
            step[s] = (hi - lo) / 31.0f;
            off[s] = -lo;
            smax = std::fmax(smax, step[s]);
            omax = std::fmax(omax, off[s]);
        }
        const uint16_t dh = to_f16(smax / 63.0f), mh = to_f16(omax / 63.0f);
        const double d = from_f16(dh), dmin = from_f16(mh);
        int sc[8], mn[8];
        for (int s = 0; s < 8; s++) {
            sc[s] = d == 0 ? 0 : (int)std::min(63L, std::lround(step[s] / d));
            mn[s] = dmin == 0 ? 0 : (int)std::min(63L, std::lround(off[s] / dmin));
        }
        uint8_t packed[12] = {0};
        for (int s = 0; s < 4; s++) {
            packed[s] = (uint8_t)(sc[s] | (sc[s + 4] >> 4) << 6);
            packed[s + 4] = (uint8_t)(mn[s] | (mn[s + 4] >> 4) << 6);
            packed[s + 8] = (uint8_t)((sc[s + 4] & 15) | (mn[s + 4] & 15) << 4);
        }
        uint8_t qh[32] = {0}, qs[128] = {0};
        for (int s = 0; s < 8; s++)
            for (int l = 0; l < 32; l++) {
                const double ds = d * sc[s], ms = dmin * mn[s];
                const long k = ds == 0 ? 0 : std::lround((v[32 * s + l] + ms) / ds);
                const int q = (int)std::max(0L, std::min(31L, k));
                qh[l] = (uint8_t)(qh[l] | ((q >> 4) & 1) << s);
                qs[32 * (s / 2) + l] = (uint8_t)(qs[32 * (s / 2) + l] | (q & 15) << (4 * (s & 1)));
            }
        put(o, &dh, 2);
        put(o, &mh, 2);
        put(o, packed, 12);
        put(o, qh, 32);
        put(o, qs, 128);
    }
    return o;
}

// ---- the types of llama-quantize's Q2_K, Q3_K_S/M, IQ4_NL and IQ4_XS presets (issue 29), written
// from the block layouts (ggml-common.h's structs), plain round-to-nearest quantizers.

// The 16 values of an iq4_nl / iq4_xs index (a fixed non-linear grid of the format).
constexpr int kIq4Grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The index of the grid value nearest to t (ties: the lower).
inline int iq4_nearest(double t) {
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (std::fabs(t - kIq4Grid[i]) < std::fabs(t - kIq4Grid[best])) best = i;
    return best;
}

// The element of largest magnitude (its sign kept) of v[0..n).
inline float signed_max(const float *v, int n) {
    float big = 0;
    for (int i = 0; i < n; i++)
        if (std::fabs(v[i]) > std::fabs(big)) big = v[i];
    return big;
}

// iq4_nl blocks of 32 (18 bytes): f16 d, 16 bytes of 4-bit indices (element i < 16: low nibble of
// byte i, else high nibble of byte i - 16); value d grid[index]. d maps the element of largest
// magnitude to grid[0] = -127.
inline std::string quant_iq4_nl(const float *x, size_t n) {
    std::string o;
    for (size_t b = 0; b < n / 32; b++) {
        const float *v = x + 32 * b;
        const uint16_t dh = to_f16(signed_max(v, 32) / -127.0f);
        const double d = from_f16(dh);
        int q[32];
        for (int i = 0; i < 32; i++) q[i] = d == 0 ? 8 : iq4_nearest(v[i] / d);  // grid[8] = 1: nearest to 0 of d = 0
        put(o, &dh, 2);
        for (int i = 0; i < 16; i++) o.push_back((char)(q[i] | q[i + 16] << 4));
    }
    return o;
}

// iq4_xs super-blocks of 256 (136 bytes): f16 d, u16 of scale high bits (bits 2s..2s+1 for
// sub-block s), 4 bytes of scale low nibbles (sub-block s: byte s / 2, high nibble when s is odd),
// 128 bytes of indices (sub-block s of 32 in bytes 16 s .. + 15, iq4_nl's order); value
// d (scale - 32) grid[index], scale 0..63.
inline std::string quant_iq4_xs(const float *x, size_t n) {
    std::string o;
    for (size_t b = 0; b < n / 256; b++) {
        const float *v = x + 256 * b;
        float want[8], amax = 0;
        for (int s = 0; s < 8; s++) {
            want[s] = signed_max(v + 32 * s, 32) / -127.0f;
            amax = std::fmax(amax, std::fabs(want[s]));
        }
        const uint16_t dh = to_f16(amax / 31.0f);
        const double d = from_f16(dh);
        uint16_t sh = 0;
        uint8_t sl[4] = {0}, qs[128] = {0};
        for (int s = 0; s < 8; s++) {
            const int ls = (int)std::max(-32L, std::min(31L, d == 0 ? 0L : std::lround(want[s] / d))) + 32;
            sh = (uint16_t)(sh | (ls >> 4) << (2 * s));
            sl[s / 2] = (uint8_t)(sl[s / 2] | (ls & 15) << (4 * (s % 2)));
            const double ds = d * (ls - 32);
            for (int i = 0; i < 16; i++) {
                const int lo = ds == 0 ? 8 : iq4_nearest(v[32 * s + i] / ds);
                const int hi = ds == 0 ? 8 : iq4_nearest(v[32 * s + 16 + i] / ds);
                qs[16 * s + i] = (uint8_t)(lo | hi << 4);
            }
        }
        put(o, &dh, 2);
        put(o, &sh, 2);
        put(o, sl, 4);
        put(o, qs, 128);
    }
    return o;
}

// Where element l (0..15) of 16-element sub-block s (0..15) of a q2_K / q3_K super-block keeps its
// two low bits: byte 32 (s / 8) + 16 (s % 2) + l of the 64 quant bytes, bits 2 ((s / 2) % 4) and up.
inline void k23_pos(int s, int l, int *byte, int *shift) {
    *byte = 32 * (s / 8) + 16 * (s % 2) + l;
    *shift = 2 * ((s / 2) % 4);
}

// q2_K super-blocks of 256 (84 bytes): 16 bytes of scales (sub-block s of 16: low nibble the scale,
// high nibble the min), 64 bytes of 2-bit quants (k23_pos), f16 d, f16 dmin; value
// d scale q - dmin min. Per sub-block step (max - min) / 3 and offset -min (min clipped to <= 0),
// each a 4-bit multiple of d / dmin.
inline std::string quant_q2_K(const float *x, size_t n) {
    std::string o;
    for (size_t b = 0; b < n / 256; b++) {
        const float *v = x + 256 * b;
        float step[16], off[16], smax = 0, omax = 0;
        for (int s = 0; s < 16; s++) {
            float lo = 0, hi = v[16 * s];
            for (int l = 0; l < 16; l++) {
                lo = std::fmin(lo, v[16 * s + l]);
                hi = std::fmax(hi, v[16 * s + l]);
            }
            step[s] = (hi - lo) / 3.0f;
            off[s] = -lo;
            smax = std::fmax(smax, step[s]);
            omax = std::fmax(omax, off[s]);
        }
        const uint16_t dh = to_f16(smax / 15.0f), mh = to_f16(omax / 15.0f);
        const double d = from_f16(dh), dmin = from_f16(mh);
        uint8_t sc[16], qs[64] = {0};
        for (int s = 0; s < 16; s++) {
            const int a = d == 0 ? 0 : (int)std::min(15L, std::lround(step[s] / d));
            const int m = dmin == 0 ? 0 : (int)std::min(15L, std::lround(off[s] / dmin));
            sc[s] = (uint8_t)(a | m << 4);
            for (int l = 0; l < 16; l++) {
                const double ds = d * a;
                const long k = ds == 0 ? 0 : std::lround((v[16 * s + l] + dmin * m) / ds);
                int byte, shift;
                k23_pos(s, l, &byte, &shift);
                qs[byte] = (uint8_t)(qs[byte] | (int)std::max(0L, std::min(3L, k)) << shift);
            }
        }
        put(o, sc, 16);
        put(o, qs, 64);
        put(o, &dh, 2);
        put(o, &mh, 2);
    }
    return o;
}

// q3_K super-blocks of 256 (110 bytes): 32 bytes of high bits (element l of sub-block s: bit s / 2
// of byte 16 (s % 2) + l), 64 bytes of 2-bit low quants (k23_pos), 12 bytes of 6-bit scales (scale
// s: low 4 bits in the low nibble of byte s for s < 8, the high nibble of byte s - 8 for s >= 8;
// bits 4..5 in bits 2 (s / 4) .. + 1 of byte 8 + s % 4), f16 d; value d (scale - 32) (q - 4) with
// q = low + 4 high (0..7). The sub-block's element of largest magnitude maps to q - 4 = -4.
inline std::string quant_q3_K(const float *x, size_t n) {
    std::string o;
    for (size_t b = 0; b < n / 256; b++) {
        const float *v = x + 256 * b;
        float want[16], amax = 0;
        for (int s = 0; s < 16; s++) {
            want[s] = signed_max(v + 16 * s, 16) / -4.0f;
            amax = std::fmax(amax, std::fabs(want[s]));
        }
        const uint16_t dh = to_f16(amax / 31.0f);
        const double d = from_f16(dh);
        uint8_t hm[32] = {0}, qs[64] = {0}, sc[12] = {0};
        for (int s = 0; s < 16; s++) {
            const int ls = (int)std::max(-32L, std::min(31L, d == 0 ? 0L : std::lround(want[s] / d))) + 32;
            if (s < 8) sc[s] = (uint8_t)(sc[s] | (ls & 15));
            else sc[s - 8] = (uint8_t)(sc[s - 8] | (ls & 15) << 4);
            sc[8 + s % 4] = (uint8_t)(sc[8 + s % 4] | (ls >> 4) << (2 * (s / 4)));
            const double ds = d * (ls - 32);
            for (int l = 0; l < 16; l++) {
                const int q = (int)std::max(0L, std::min(7L, (ds == 0 ? 0L : std::lround(v[16 * s + l] / ds)) + 4));
                int byte, shift;
                k23_pos(s, l, &byte, &shift);
                qs[byte] = (uint8_t)(qs[byte] | (q & 3) << shift);
                hm[16 * (s % 2) + l] = (uint8_t)(hm[16 * (s % 2) + l] | (q >> 2) << (s / 2));
            }
        }
        put(o, hm, 32);
        put(o, qs, 64);
        put(o, sc, 12);
        put(o, &dh, 2);
    }
    return o;
}

}  // namespace gguftest
