#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_set>

namespace kvh {

// ------------------------------------------------------------------ types and dequantization

namespace {

// Every ggml type number, as ggml names it (ggml.h's enum ggml_type); "" for numbers it never used.
// 4, 5 (q4_2, q4_3), 31..33 (q4_0_4_4 ...) and 36..38 (iq4_nl_4_4 ...) are retired but were written.
const char *const kGgmlNames[] = {"f32",     "f16",     "q4_0",     "q4_1",     "q4_2",     "q4_3",     "q5_0",
                                  "q5_1",    "q8_0",    "q8_1",     "q2_K",     "q3_K",     "q4_K",     "q5_K",
                                  "q6_K",    "q8_K",    "iq2_xxs",  "iq2_xs",   "iq3_xxs",  "iq1_s",    "iq4_nl",
                                  "iq3_s",   "iq2_s",   "iq4_xs",   "i8",       "i16",      "i32",      "i64",
                                  "f64",     "iq1_m",   "bf16",     "q4_0_4_4", "q4_0_4_8", "q4_0_8_8", "tq1_0",
                                  "tq2_0",   "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4", "nvfp4", "q1_0", "q2_0"};

}  // namespace

bool ggml_type_known(uint32_t t) { return t < sizeof kGgmlNames / sizeof kGgmlNames[0]; }

std::string ggml_type_name(uint32_t t) {
    return ggml_type_known(t) ? kGgmlNames[t] : "unknown type " + std::to_string(t);
}

std::string ggml_type_phrase(uint32_t t) {
    return ggml_type_known(t) ? "type " + std::string(kGgmlNames[t])
                              : "an unknown or corrupt type number " + std::to_string(t) + " (no ggml type has it)";
}

bool ggml_block(uint32_t t, uint64_t *be, uint64_t *bb) {
    switch (t) {
        case GGML_F32: *be = 1; *bb = 4; return true;
        case GGML_F16: case GGML_BF16: *be = 1; *bb = 2; return true;
        case GGML_Q8_0: *be = 32; *bb = 34; return true;
        case GGML_Q8_1: *be = 32; *bb = 36; return true;
        case GGML_Q4_0: *be = 32; *bb = 18; return true;
        case GGML_Q4_1: *be = 32; *bb = 20; return true;
        case GGML_Q5_0: *be = 32; *bb = 22; return true;
        case GGML_Q5_1: *be = 32; *bb = 24; return true;
        case GGML_Q4_K: *be = 256; *bb = 144; return true;
        case GGML_Q5_K: *be = 256; *bb = 176; return true;
        case GGML_Q6_K: *be = 256; *bb = 210; return true;
        case GGML_Q2_K: *be = 256; *bb = 84; return true;
        case GGML_Q3_K: *be = 256; *bb = 110; return true;
        case GGML_IQ4_NL: *be = 32; *bb = 18; return true;
        case GGML_IQ4_XS: *be = 256; *bb = 136; return true;
        default: return false;
    }
}

float fp16_to_f32(uint16_t h) {
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    uint32_t bits;
    if (e == 0) {
        if (m == 0) {
            bits = s;
        } else {  // subnormal: m * 2^-24
            float f = (float)m * 0x1.0p-24f;
            std::memcpy(&bits, &f, 4);
            bits |= s;
        }
    } else if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else {
        bits = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

namespace {

inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

// 6-bit scale and min of sub-block j (0..7) of a q4_K super-block's 12 packed bytes.
inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

}  // namespace

const int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Low 4 bits in the low nibble of byte s (s < 8) or the high nibble of byte s - 8, bits 4..5 in bits
// 2 (s / 4) of byte 8 + s % 4.
int q3k_scale(int s, const uint8_t *q) {
    const int lo = s < 8 ? (q[s] & 15) : (q[s - 8] >> 4);
    return lo | ((q[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
}

// Compiled for AVX-512, AVX2 and the baseline (chosen at run time): the same values in every
// variant (conversions and products of exactly representable operands, one rounding each).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
bool dequantize(uint32_t type, const void *src, float *dst, uint64_t n) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    switch (type) {
        case GGML_F32: std::memcpy(dst, p, n * 4); return true;
        case GGML_F16:
            for (uint64_t i = 0; i < n; i++) dst[i] = fp16_to_f32(rd16(p + 2 * i));
            return true;
        case GGML_BF16:
            for (uint64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(rd16(p + 2 * i));
            return true;
        case GGML_Q8_0:
            for (uint64_t b = 0; b < n / 32; b++, p += 34, dst += 32) {
                const float d = fp16_to_f32(rd16(p));
                for (int i = 0; i < 32; i++) dst[i] = d * (float)(int8_t)p[2 + i];
            }
            return true;
        case GGML_Q4_0:
            for (uint64_t b = 0; b < n / 32; b++, p += 18, dst += 32) {
                const float d = fp16_to_f32(rd16(p));
                for (int i = 0; i < 16; i++) {
                    dst[i] = d * (float)((p[2 + i] & 15) - 8);
                    dst[i + 16] = d * (float)((p[2 + i] >> 4) - 8);
                }
            }
            return true;
        case GGML_Q8_1:  // f16 d, f16 s (d times the sum of the quants; not needed here), 32 x i8
            for (uint64_t b = 0; b < n / 32; b++, p += 36, dst += 32) {
                const float d = fp16_to_f32(rd16(p));
                for (int i = 0; i < 32; i++) dst[i] = d * (float)(int8_t)p[4 + i];
            }
            return true;
        case GGML_Q4_1:  // f16 d, f16 m, 16 bytes of nibbles as q4_0; value d q + m
            for (uint64_t b = 0; b < n / 32; b++, p += 20, dst += 32) {
                const float d = fp16_to_f32(rd16(p)), m = fp16_to_f32(rd16(p + 2));
                for (int i = 0; i < 16; i++) {
                    dst[i] = d * (float)(p[4 + i] & 15) + m;
                    dst[i + 16] = d * (float)(p[4 + i] >> 4) + m;
                }
            }
            return true;
        case GGML_Q5_0:  // f16 d, u32 fifth bits (bit i for element i), 16 bytes of nibbles; value d (q - 16)
        case GGML_Q5_1: {  // f16 d, f16 m, u32 fifth bits, 16 bytes of nibbles; value d q + m
            const bool one = type == GGML_Q5_1;
            const uint64_t bb = one ? 24 : 22;
            for (uint64_t b = 0; b < n / 32; b++, p += bb, dst += 32) {
                const float d = fp16_to_f32(rd16(p)), m = one ? fp16_to_f32(rd16(p + 2)) : 0.0f;
                const uint8_t *hb = p + (one ? 4 : 2), *qs = hb + 4;
                const uint32_t h = (uint32_t)hb[0] | (uint32_t)hb[1] << 8 | (uint32_t)hb[2] << 16 | (uint32_t)hb[3] << 24;
                for (int i = 0; i < 16; i++) {
                    const int q0 = (qs[i] & 15) | (int)((h >> i) & 1) << 4;
                    const int q1 = (qs[i] >> 4) | (int)((h >> (i + 16)) & 1) << 4;
                    if (one) {
                        dst[i] = d * (float)q0 + m;
                        dst[i + 16] = d * (float)q1 + m;
                    } else {
                        dst[i] = d * (float)(q0 - 16);
                        dst[i + 16] = d * (float)(q1 - 16);
                    }
                }
            }
            return true;
        }
        case GGML_Q5_K:  // q4_K's header and nibbles (at +48) plus 32 bytes of fifth bits at +16 (bit s of byte l
                         // for element l of sub-block s)
            for (uint64_t b = 0; b < n / 256; b++, p += 176, dst += 256) {
                const float d = fp16_to_f32(rd16(p)), dmin = fp16_to_f32(rd16(p + 2));
                const uint8_t *sc = p + 4, *qh = p + 16, *q = p + 48;
                for (int c = 0; c < 4; c++) {
                    int s0, m0, s1, m1;
                    k4_scale_min(2 * c, sc, &s0, &m0);
                    k4_scale_min(2 * c + 1, sc, &s1, &m1);
                    const float d0 = d * (float)s0, o0 = dmin * (float)m0, d1 = d * (float)s1, o1 = dmin * (float)m1;
                    for (int l = 0; l < 32; l++) {
                        const int qa = (q[32 * c + l] & 15) | ((qh[l] >> (2 * c)) & 1) << 4;
                        const int qb = (q[32 * c + l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
                        dst[64 * c + l] = d0 * (float)qa - o0;
                        dst[64 * c + 32 + l] = d1 * (float)qb - o1;
                    }
                }
            }
            return true;
        case GGML_Q4_K:
            for (uint64_t b = 0; b < n / 256; b++, p += 144, dst += 256) {
                const float d = fp16_to_f32(rd16(p)), dmin = fp16_to_f32(rd16(p + 2));
                const uint8_t *sc = p + 4, *q = p + 16;
                for (int c = 0; c < 4; c++) {  // 64 elements: low nibbles then high nibbles of 32 bytes
                    int s0, m0, s1, m1;
                    k4_scale_min(2 * c, sc, &s0, &m0);
                    k4_scale_min(2 * c + 1, sc, &s1, &m1);
                    const float d0 = d * (float)s0, o0 = dmin * (float)m0, d1 = d * (float)s1, o1 = dmin * (float)m1;
                    for (int l = 0; l < 32; l++) {
                        dst[64 * c + l] = d0 * (float)(q[32 * c + l] & 15) - o0;
                        dst[64 * c + 32 + l] = d1 * (float)(q[32 * c + l] >> 4) - o1;
                    }
                }
            }
            return true;
        case GGML_Q2_K:  // 16 bytes of scales (low nibble scale, high nibble min, per 16 elements), 64 bytes of
                         // 2-bit quants, f16 d, f16 dmin; value d sc q - dmin m
            for (uint64_t b = 0; b < n / 256; b++, p += 84, dst += 256) {
                const float d = fp16_to_f32(rd16(p + 80)), dmin = fp16_to_f32(rd16(p + 82));
                for (int s = 0; s < 16; s++) {  // sub-block s: bytes 32 (s / 8) + 16 (s % 2) .. + 15, bits 2 ((s / 2) % 4)
                    const float ds = d * (float)(p[s] & 15), ms = dmin * (float)(p[s] >> 4);
                    const uint8_t *q = p + 16 + 32 * (s / 8) + 16 * (s % 2);
                    const int shift = 2 * ((s / 2) % 4);
                    for (int l = 0; l < 16; l++) dst[16 * s + l] = ds * (float)((q[l] >> shift) & 3) - ms;
                }
            }
            return true;
        case GGML_Q3_K:  // 32 bytes of high bits, 64 bytes of 2-bit quants, 12 bytes of 6-bit scales, f16 d;
                         // value d (sc - 32) (q - 4 when the high bit is clear, else q)
            for (uint64_t b = 0; b < n / 256; b++, p += 110, dst += 256) {
                const float d = fp16_to_f32(rd16(p + 108));
                const uint8_t *hm = p, *sc = p + 96;
                for (int s = 0; s < 16; s++) {
                    const float ds = d * (float)(q3k_scale(s, sc) - 32);
                    const uint8_t *q = p + 32 + 32 * (s / 8) + 16 * (s % 2);
                    const uint8_t *h = hm + 16 * (s % 2);
                    const int shift = 2 * ((s / 2) % 4), bit = s / 2;  // high bit: bit (s / 2) of hm[16 (s % 2) + l]
                    for (int l = 0; l < 16; l++)
                        dst[16 * s + l] = ds * (float)(((q[l] >> shift) & 3) - (((h[l] >> bit) & 1) ? 0 : 4));
                }
            }
            return true;
        case GGML_IQ4_NL:  // f16 d, 16 bytes of 4-bit indices (q4_0's order); value d kIq4Values[i]
            for (uint64_t b = 0; b < n / 32; b++, p += 18, dst += 32) {
                const float d = fp16_to_f32(rd16(p));
                for (int i = 0; i < 16; i++) {
                    dst[i] = d * (float)kIq4Values[p[2 + i] & 15];
                    dst[i + 16] = d * (float)kIq4Values[p[2 + i] >> 4];
                }
            }
            return true;
        case GGML_IQ4_XS:  // f16 d, u16 scale high bits, 4 bytes of scale low nibbles, 128 bytes of indices
                           // (8 sub-blocks of 32 in iq4_nl's order); value d (sc - 32) kIq4Values[i]
            for (uint64_t b = 0; b < n / 256; b++, p += 136, dst += 256) {
                const float d = fp16_to_f32(rd16(p));
                const uint16_t sh = rd16(p + 2);
                for (int s = 0; s < 8; s++) {
                    const int sc = ((p[4 + s / 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4;
                    const float ds = d * (float)(sc - 32);
                    const uint8_t *q = p + 8 + 16 * s;
                    for (int i = 0; i < 16; i++) {
                        dst[32 * s + i] = ds * (float)kIq4Values[q[i] & 15];
                        dst[32 * s + i + 16] = ds * (float)kIq4Values[q[i] >> 4];
                    }
                }
            }
            return true;
        case GGML_Q6_K:
            for (uint64_t b = 0; b < n / 256; b++, p += 210, dst += 256) {
                const uint8_t *ql = p, *qh = p + 128;
                const int8_t *sc = reinterpret_cast<const int8_t *>(p + 192);
                const float d = fp16_to_f32(rd16(p + 208));
                for (int h = 0; h < 2; h++) {  // two halves of 128
                    const uint8_t *l4 = ql + 64 * h, *hi = qh + 32 * h;
                    const int8_t *s = sc + 8 * h;
                    float *y = dst + 128 * h;
                    for (int l = 0; l < 32; l++) {
                        const int is = l / 16;
                        const int q1 = ((l4[l] & 15) | (((hi[l] >> 0) & 3) << 4)) - 32;
                        const int q2 = ((l4[l + 32] & 15) | (((hi[l] >> 2) & 3) << 4)) - 32;
                        const int q3 = ((l4[l] >> 4) | (((hi[l] >> 4) & 3) << 4)) - 32;
                        const int q4 = ((l4[l + 32] >> 4) | (((hi[l] >> 6) & 3) << 4)) - 32;
                        y[l] = d * (float)s[is] * (float)q1;
                        y[l + 32] = d * (float)s[is + 2] * (float)q2;
                        y[l + 64] = d * (float)s[is + 4] * (float)q3;
                        y[l + 96] = d * (float)s[is + 6] * (float)q4;
                    }
                }
            }
            return true;
        default: return false;
    }
}

bool ggml_finite(uint32_t type, const void *src, uint64_t n, uint64_t *bad) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    auto h = [&](uint64_t off) { return (rd16(p + off) & 0x7C00) != 0x7C00; };  // f16 not inf/nan
    switch (type) {
        case GGML_F32:
            for (uint64_t i = 0; i < n; i++) {
                float f;
                std::memcpy(&f, p + 4 * i, 4);
                if (!std::isfinite(f)) return *bad = i, false;
            }
            return true;
        case GGML_F16:
            for (uint64_t i = 0; i < n; i++)
                if (!h(2 * i)) return *bad = i, false;
            return true;
        case GGML_BF16:
            for (uint64_t i = 0; i < n; i++)
                if ((rd16(p + 2 * i) & 0x7F80) == 0x7F80) return *bad = i, false;
            return true;
        case GGML_Q8_0:
        case GGML_Q4_0:
        case GGML_Q5_0: {
            const uint64_t bb = type == GGML_Q8_0 ? 34 : type == GGML_Q4_0 ? 18 : 22;
            for (uint64_t b = 0; b < n / 32; b++)
                if (!h(b * bb)) return *bad = b, false;
            return true;
        }
        case GGML_Q8_1:  // d only: s is not used
            for (uint64_t b = 0; b < n / 32; b++)
                if (!h(b * 36)) return *bad = b, false;
            return true;
        case GGML_Q4_1:
        case GGML_Q5_1: {  // d and m
            const uint64_t bb = type == GGML_Q4_1 ? 20 : 24;
            for (uint64_t b = 0; b < n / 32; b++)
                if (!h(b * bb) || !h(b * bb + 2)) return *bad = b, false;
            return true;
        }
        case GGML_Q4_K:
        case GGML_Q5_K: {
            const uint64_t bb = type == GGML_Q4_K ? 144 : 176;
            for (uint64_t b = 0; b < n / 256; b++)
                if (!h(b * bb) || !h(b * bb + 2)) return *bad = b, false;
            return true;
        }
        case GGML_Q6_K:
            for (uint64_t b = 0; b < n / 256; b++)
                if (!h(b * 210 + 208)) return *bad = b, false;
            return true;
        case GGML_Q2_K:  // d and dmin at the end
            for (uint64_t b = 0; b < n / 256; b++)
                if (!h(b * 84 + 80) || !h(b * 84 + 82)) return *bad = b, false;
            return true;
        case GGML_Q3_K:
            for (uint64_t b = 0; b < n / 256; b++)
                if (!h(b * 110 + 108)) return *bad = b, false;
            return true;
        case GGML_IQ4_NL:
            for (uint64_t b = 0; b < n / 32; b++)
                if (!h(b * 18)) return *bad = b, false;
            return true;
        case GGML_IQ4_XS:
            for (uint64_t b = 0; b < n / 256; b++)
                if (!h(b * 136)) return *bad = b, false;
            return true;
        default: return *bad = 0, false;
    }
}

// ------------------------------------------------------------------ file

GgufFile::~GgufFile() { close(); }

void GgufFile::close() {
    if (mapped_ && base_) munmap(const_cast<uint8_t *>(base_), size_);
    base_ = nullptr;
    size_ = 0;
    mapped_ = false;
    kv_.clear();
    tensors_.clear();
}

bool GgufFile::open(const std::string &path, std::string *err) {
    close();
    auto fail = [&](const std::string &m) {
        *err = "gguf '" + path + "': " + m;
        return false;
    };
    struct stat sb;
    if (stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode))
        return fail(std::string("not a regular file (") + (S_ISDIR(sb.st_mode) ? "a directory" : "a FIFO, device or socket") + ")");
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return fail(std::string("cannot open: ") + std::strerror(errno));
    if (fstat(fd, &sb) != 0) {
        ::close(fd);
        return fail("cannot stat");
    }
    if (sb.st_size <= 0) {
        ::close(fd);
        return fail("empty file");
    }
    void *m = mmap(nullptr, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return fail(std::string("cannot map: ") + std::strerror(errno));
    base_ = static_cast<const uint8_t *>(m);
    size_ = (size_t)sb.st_size;
    mapped_ = true;
    const uint8_t *b = base_;
    size_t n = size_;
    std::string e;
    if (!parse(b, n, path, &e)) {
        close();
        *err = e;
        return false;
    }
    base_ = b;
    size_ = n;
    mapped_ = true;
    return true;
}

namespace {

struct Cursor {
    const uint8_t *b;
    uint64_t size, pos = 0;
    std::string what;  // set on the first failure
    bool need(uint64_t n, const char *ctx) {
        if (!what.empty()) return false;
        if (n > size - pos) {
            char m[200];
            std::snprintf(m, sizeof m, "truncated: %s needs %llu bytes at offset %llu but the file has %llu", ctx,
                          (unsigned long long)n, (unsigned long long)pos, (unsigned long long)size);
            what = m;
            return false;
        }
        return true;
    }
    bool u32(uint32_t *v, const char *ctx) {
        if (!need(4, ctx)) return false;
        std::memcpy(v, b + pos, 4);
        pos += 4;
        return true;
    }
    bool u64(uint64_t *v, const char *ctx) {
        if (!need(8, ctx)) return false;
        std::memcpy(v, b + pos, 8);
        pos += 8;
        return true;
    }
    bool str(std::string *s, const char *ctx) {
        uint64_t n;
        if (!u64(&n, ctx) || !need(n, ctx)) return false;
        s->assign(reinterpret_cast<const char *>(b + pos), (size_t)n);
        pos += n;
        return true;
    }
    bool skip_str(const char *ctx) {
        uint64_t n;
        if (!u64(&n, ctx) || !need(n, ctx)) return false;
        pos += n;
        return true;
    }
};

uint64_t scalar_size(uint32_t t) {
    switch (t) {
        case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
        case GGUF_U16: case GGUF_I16: return 2;
        case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
        case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
        default: return 0;
    }
}

const char *vtype_name(uint32_t t) {
    static const char *n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return t < 13 ? n[t] : "?";
}

// A name from the file as it may appear in a one-line message: printable ASCII, at most 64 bytes.
std::string shown(const std::string &s) {
    std::string o;
    for (unsigned char ch : s) {
        if (o.size() >= 64) {
            o += "...";
            break;
        }
        if (ch >= 32 && ch < 127) {
            o.push_back((char)ch);
        } else {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", ch);
            o += b;
        }
    }
    return o;
}

}  // namespace

std::string gguf_shown(const std::string &s) { return shown(s); }

bool GgufFile::parse(const uint8_t *data, size_t size, const std::string &name, std::string *err) {
    kv_.clear();
    tensors_.clear();
    align_ = 32;
    base_ = data;  // the getters below read values through base_
    size_ = size;
    auto fail = [&](const std::string &m) {
        *err = "gguf '" + name + "': " + m;
        kv_.clear();
        tensors_.clear();
        return false;
    };
    Cursor c{data, size, 0, std::string()};
    if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) {
        std::string found;
        for (size_t i = 0; i < size && i < 4; i++) found += (char)data[i];
        return fail("not a GGUF file (bad magic): it starts with '" + shown(found) + "', a GGUF file with 'GGUF'");
    }
    c.pos = 4;
    uint64_t n_tensors = 0, n_kv = 0;
    if (!c.u32(&version_, "the version") || !c.u64(&n_tensors, "the tensor count") || !c.u64(&n_kv, "the metadata count"))
        return fail(c.what);
    if (version_ != 2 && version_ != 3)
        return fail("GGUF version " + std::to_string(version_) + " is not supported (2 or 3; version 1 used 32-bit counts)");
    // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor info
    // at least 8 + 4 + 4 + 8: counts beyond what the file can hold are rejected before any reserve.
    if (n_kv > (size - c.pos) / 13) return fail("metadata count " + std::to_string(n_kv) + " cannot fit in the file");
    if (n_tensors > (size - c.pos) / 24) return fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the file");
    kv_.reserve((size_t)n_kv);
    std::unordered_set<std::string> seen;
    for (uint64_t i = 0; i < n_kv; i++) {
        GgufKV kv;
        if (!c.str(&kv.key, "a metadata key") || !c.u32(&kv.type, "a metadata type")) return fail(c.what);
        if (!seen.insert(kv.key).second) return fail("metadata key '" + shown(kv.key) + "' appears twice");
        if (kv.type == GGUF_ARRAY) {
            if (!c.u32(&kv.arr_type, "an array type") || !c.u64(&kv.arr_n, "an array length")) return fail(c.what);
            kv.pos = c.pos;
            if (kv.arr_type == GGUF_STRING) {
                if (kv.arr_n > (size - c.pos) / 8) return fail("array '" + shown(kv.key) + "' length cannot fit in the file");
                for (uint64_t j = 0; j < kv.arr_n; j++)
                    if (!c.skip_str("a string array element")) return fail(c.what + " (key '" + shown(kv.key) + "')");
            } else {
                const uint64_t es = scalar_size(kv.arr_type);
                if (es == 0)
                    return fail("array '" + shown(kv.key) + "' has element type " + std::to_string(kv.arr_type) +
                                " (nested arrays and unknown types are not supported)");
                if (kv.arr_n > (size - c.pos) / es) return fail("array '" + shown(kv.key) + "' length cannot fit in the file");
                c.pos += kv.arr_n * es;
            }
        } else if (kv.type == GGUF_STRING) {
            kv.pos = c.pos;
            if (!c.skip_str("a string value")) return fail(c.what + " (key '" + shown(kv.key) + "')");
        } else {
            const uint64_t es = scalar_size(kv.type);
            if (es == 0) return fail("metadata '" + shown(kv.key) + "' has unknown type " + std::to_string(kv.type));
            kv.pos = c.pos;
            if (!c.need(es, "a metadata value")) return fail(c.what + " (key '" + shown(kv.key) + "')");
            c.pos += es;
        }
        kv_.push_back(std::move(kv));
    }
    int64_t al;
    if (find("general.alignment")) {
        if (!get_int("general.alignment", &al) || al <= 0 || al > 65536 || (al & (al - 1)) != 0)
            return fail("general.alignment must be a power of two in 1..65536");
        align_ = (uint64_t)al;
    }
    tensors_.reserve((size_t)n_tensors);
    seen.clear();
    for (uint64_t i = 0; i < n_tensors; i++) {
        GgufTensor t;
        if (!c.str(&t.name, "a tensor name") || !c.u32(&t.n_dims, "a tensor's dimension count")) return fail(c.what);
        if (t.n_dims < 1 || t.n_dims > 4)
            return fail("tensor '" + shown(t.name) + "' has " + std::to_string(t.n_dims) + " dimensions (1..4)");
        uint64_t total = 1;
        for (uint32_t d = 0; d < t.n_dims; d++) {
            if (!c.u64(&t.ne[d], "a tensor dimension")) return fail(c.what);
            if (t.ne[d] == 0 || t.ne[d] > ((uint64_t)1 << 40) || total > ((uint64_t)1 << 40) / t.ne[d])
                return fail("tensor '" + shown(t.name) + "' has a zero or absurd dimension " + std::to_string(t.ne[d]));
            total *= t.ne[d];
        }
        if (!c.u32(&t.type, "a tensor type") || !c.u64(&t.offset, "a tensor offset")) return fail(c.what);
        if (!seen.insert(t.name).second) return fail("tensor '" + shown(t.name) + "' appears twice");
        uint64_t be = 0, bb = 0;
        if (ggml_block(t.type, &be, &bb)) {
            if (t.ne[0] % be != 0)
                return fail("tensor '" + shown(t.name) + "' of type " + ggml_type_name(t.type) + " has rows of " +
                            std::to_string(t.ne[0]) + " elements, not a multiple of its block of " + std::to_string(be));
            t.nbytes = total / be * bb;
        }
        if (t.offset % align_ != 0)
            return fail("tensor '" + shown(t.name) + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                        std::to_string(align_));
        tensors_.push_back(std::move(t));
    }
    const uint64_t data_start = (c.pos + align_ - 1) / align_ * align_;
    // A file without tensors (llama.cpp's vocabulary-only files) may end right after its metadata.
    if (!tensors_.empty() && data_start > size) return fail("truncated: no room for the tensor data after the header");
    const uint64_t room = size - data_start;
    for (GgufTensor &t : tensors_) {
        // Unknown types keep nbytes 0 and no data: the model loader names them; info lists them.
        if (t.nbytes == 0) continue;
        if (t.offset > room || t.nbytes > room - t.offset)
            return fail("tensor '" + shown(t.name) + "' (" + std::to_string(t.nbytes) + " bytes at data offset " +
                        std::to_string(t.offset) + ") extends past the end of the file");
        t.data = data + data_start + t.offset;
    }
    base_ = data;
    size_ = size;
    return true;
}

const GgufKV *GgufFile::find(const std::string &key) const {
    for (const GgufKV &k : kv_)
        if (k.key == key) return &k;
    return nullptr;
}

const GgufTensor *GgufFile::tensor(const std::string &name) const {
    for (const GgufTensor &t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

namespace {

bool read_int(const uint8_t *p, uint32_t t, int64_t *out) {
    switch (t) {
        case GGUF_U8: *out = p[0]; return true;
        case GGUF_I8: *out = (int8_t)p[0]; return true;
        case GGUF_U16: { uint16_t v; std::memcpy(&v, p, 2); *out = v; return true; }
        case GGUF_I16: { int16_t v; std::memcpy(&v, p, 2); *out = v; return true; }
        case GGUF_U32: { uint32_t v; std::memcpy(&v, p, 4); *out = v; return true; }
        case GGUF_I32: { int32_t v; std::memcpy(&v, p, 4); *out = v; return true; }
        case GGUF_U64: { uint64_t v; std::memcpy(&v, p, 8); if (v > (uint64_t)INT64_MAX) return false; *out = (int64_t)v; return true; }
        case GGUF_I64: { int64_t v; std::memcpy(&v, p, 8); *out = v; return true; }
        default: return false;
    }
}

}  // namespace

bool GgufFile::get_str(const std::string &key, std::string *out) const {
    const GgufKV *k = find(key);
    if (!k || k->type != GGUF_STRING) return false;
    uint64_t n;
    std::memcpy(&n, base_ + k->pos, 8);
    out->assign(reinterpret_cast<const char *>(base_ + k->pos + 8), (size_t)n);
    return true;
}

bool GgufFile::get_int(const std::string &key, int64_t *out) const {
    const GgufKV *k = find(key);
    return k && k->type != GGUF_ARRAY && read_int(base_ + k->pos, k->type, out);
}

bool GgufFile::get_float(const std::string &key, double *out) const {
    const GgufKV *k = find(key);
    if (!k) return false;
    if (k->type == GGUF_F32) {
        float f;
        std::memcpy(&f, base_ + k->pos, 4);
        *out = f;
        return true;
    }
    if (k->type == GGUF_F64) {
        std::memcpy(out, base_ + k->pos, 8);
        return true;
    }
    return false;
}

bool GgufFile::get_bool(const std::string &key, bool *out) const {
    const GgufKV *k = find(key);
    if (!k || k->type != GGUF_BOOL) return false;
    *out = base_[k->pos] != 0;
    return true;
}

bool GgufFile::get_str_array(const std::string &key, std::vector<std::string> *out) const {
    const GgufKV *k = find(key);
    if (!k || k->type != GGUF_ARRAY || k->arr_type != GGUF_STRING) return false;
    out->clear();
    out->reserve((size_t)k->arr_n);
    uint64_t pos = k->pos;
    for (uint64_t i = 0; i < k->arr_n; i++) {  // lengths were checked by parse
        uint64_t n;
        std::memcpy(&n, base_ + pos, 8);
        out->emplace_back(reinterpret_cast<const char *>(base_ + pos + 8), (size_t)n);
        pos += 8 + n;
    }
    return true;
}

bool GgufFile::get_f32_array(const std::string &key, std::vector<float> *out) const {
    const GgufKV *k = find(key);
    if (!k || k->type != GGUF_ARRAY || k->arr_type != GGUF_F32) return false;
    out->resize((size_t)k->arr_n);
    if (k->arr_n) std::memcpy(out->data(), base_ + k->pos, (size_t)k->arr_n * 4);
    return true;
}

bool GgufFile::get_i32_array(const std::string &key, std::vector<int32_t> *out) const {
    const GgufKV *k = find(key);
    if (!k || k->type != GGUF_ARRAY) return false;
    const uint64_t es = scalar_size(k->arr_type);
    if (es == 0 || k->arr_type == GGUF_F32 || k->arr_type == GGUF_F64) return false;
    out->resize((size_t)k->arr_n);
    for (uint64_t i = 0; i < k->arr_n; i++) {
        int64_t v;
        if (!read_int(base_ + k->pos + i * es, k->arr_type, &v) || v < INT32_MIN || v > INT32_MAX) return false;
        (*out)[i] = (int32_t)v;
    }
    return true;
}

std::string GgufFile::value_text(const GgufKV &k) const {
    if (k.type == GGUF_ARRAY) return "[" + std::to_string(k.arr_n) + " x " + vtype_name(k.arr_type) + "]";
    std::string s;
    if (k.type == GGUF_STRING) {
        get_str(k.key, &s);
        return "\"" + shown(s) + "\"";
    }
    if (k.type == GGUF_BOOL) return base_[k.pos] ? "true" : "false";
    double f;
    if (get_float(k.key, &f)) {
        char b[40];
        std::snprintf(b, sizeof b, "%g", f);
        return b;
    }
    int64_t v;
    if (get_int(k.key, &v)) return std::to_string(v);
    return "?";
}

}  // namespace kvh
