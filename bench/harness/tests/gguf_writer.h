// A GGUF writer for tests and benchmarks, written from the format description and independent of
// the reader (bench/harness/gguf.cpp): metadata of every scalar type, string and array values,
// tensors with raw bytes, the alignment padding. Also the reference block encoders the tests
// use to make weights (f16/bf16 rounding and q8_0 quantization written from the specification).
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

}  // namespace gguftest
