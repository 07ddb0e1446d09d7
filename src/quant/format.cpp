#include "quant/format.h"

#include <math.h>
#include <string.h>

namespace kvp {
namespace {

// Round to nearest, ties to even, without depending on the FP rounding mode.
double rne(double t) {
    double r = floor(t);
    const double frac = t - r;
    if (frac > 0.5 || (frac == 0.5 && fmod(r, 2.0) != 0.0)) r += 1.0;
    return r;
}

float clamp16(float x) { return x > kF16Max ? kF16Max : x < -kF16Max ? -kF16Max : x; }

// Next f16 toward +inf / -inf (finite inputs; saturates at +-65504).
uint16_t f16_up(uint16_t h) {
    if (h == 0x8000u || h == 0) return 1;  // -0, +0 -> smallest positive subnormal
    if (h & 0x8000u) return uint16_t(h - 1);             // negative: magnitude down
    return h >= 0x7bffu ? 0x7bffu : uint16_t(h + 1);
}
uint16_t f16_down(uint16_t h) {
    if (h == 0 || h == 0x8000u) return 0x8001u;
    if (h & 0x8000u) return h >= 0xfbffu ? 0xfbffu : uint16_t(h + 1);
    return uint16_t(h - 1);
}
uint16_t f16_round_down(float x) {
    uint16_t h = f16_from_f32(x);
    if (f32_from_f16(h) > clamp16(x)) h = f16_down(h);
    return h;
}
uint16_t f16_round_up(float x) {
    uint16_t h = f16_from_f32(x);
    if (f32_from_f16(h) < clamp16(x)) h = f16_up(h);
    return h;
}

uint32_t row_bytes(kvp_dtype t, uint32_t wp) {
    switch (t) {
        case KVP_DTYPE_F16: return wp * 2;
        case KVP_DTYPE_Q8: return wp;
        case KVP_DTYPE_Q4: return wp / 2;
        default: return wp * 4;
    }
}

uint32_t round_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

// Position of channel c of a q4 row: byte and whether it is the high nibble (format.h).
void q4_where(uint32_t, uint32_t c, uint32_t *byte, bool *hi) {
    const uint32_t i = c % 16;
    *hi = i >= 8;
    *byte = 8 * (c / 16) + (i & 7);
}

}  // namespace

bool store_formatted(const kvp_config &cfg) { return cfg.kv_dtype != KVP_DTYPE_F32 || store_thin(cfg); }

bool store_thin(const kvp_config &cfg) {
    StoreFormat f;
    store_format(cfg, &f);
    return f.thin_k || f.thin_v;
}

void store_format(const kvp_config &cfg, StoreFormat *f) {
    const kvp_model &m = cfg.model;
    memset(f, 0, sizeof *f);
    f->dtype = cfg.kv_dtype;
    f->d = m.head_dim;
    const uint32_t rd = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim);
    f->rot_units = rd / 2;
    if (cfg.policy == KVP_POLICY_THINK) {
        const double lk = cfg.key_channel_ratio, lv = cfg.value_channel_ratio;
        f->prune_pairs = uint32_t(floor(lk * double(rd / 2)));
        f->prune_singles = uint32_t(floor(lk * double(m.head_dim - rd)));
        f->prune_v = uint32_t(floor(lv * double(m.head_dim)));
    }
    f->wk = m.head_dim - 2 * f->prune_pairs - f->prune_singles;
    f->wv = m.head_dim - f->prune_v;
    f->thin_k = f->wk < m.head_dim;
    f->thin_v = f->wv < m.head_dim;
    const uint32_t pad = cfg.kv_dtype == KVP_DTYPE_Q4 ? 16 : 8;
    f->wkp = round_up(f->wk, pad);
    f->wvp = round_up(f->wv, pad);
    f->k_row = row_bytes(cfg.kv_dtype, f->wkp);
    f->v_row = row_bytes(cfg.kv_dtype, f->wvp);
    f->levels = cfg.kv_dtype == KVP_DTYPE_Q8 ? 255 : cfg.kv_dtype == KVP_DTYPE_Q4 ? 15 : 0;
    f->v_groups = f->levels ? (f->wv + kVGroup - 1) / kVGroup : 0;
    f->block = cfg.quant_group;
}

uint64_t fmt_token_bytes(const StoreFormat &f) {
    auto data = [&](uint32_t w) -> uint64_t {
        switch (f.dtype) {
            case KVP_DTYPE_F16: return uint64_t(w) * 2;
            case KVP_DTYPE_Q8: return w;
            case KVP_DTYPE_Q4: return (uint64_t(w) + 1) / 2;
            default: return uint64_t(w) * 4;
        }
    };
    return data(f.wk) + data(f.wv) + uint64_t(f.v_groups) * 4;
}

uint16_t f16_from_f32(float x) {
    x = clamp16(x);
    uint32_t b;
    memcpy(&b, &x, 4);
    const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
    const uint32_t a = b & 0x7fffffffu;
    if (a >= 0x38800000u) {  // |x| >= 2^-14: a normal half
        const uint32_t mant = a & 0x7fffffu, exp = (a >> 23) - 127 + 15;
        uint32_t h = (exp << 10) | (mant >> 13);
        const uint32_t rem = mant & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
        return uint16_t(sign | h);
    }
    float af;
    memcpy(&af, &a, 4);
    return uint16_t(sign | uint32_t(rne(double(af) * 16777216.0)));  // subnormal (or 2^-14 after rounding)
}

float f32_from_f16(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = float(mant) * (1.0f / 16777216.0f);  // exact
        uint32_t b;
        memcpy(&b, &f, 4);
        b |= sign;
        memcpy(&f, &b, 4);
        return f;
    }
    const uint32_t b = sign | (exp == 31 ? 0x7f800000u | (mant << 13) : ((exp - 15 + 127) << 23) | (mant << 13));
    memcpy(&f, &b, 4);
    return f;
}

void dyadic_grid(float mn, float mx, uint32_t levels, int8_t *eo, int16_t *zo) {
    mn = clamp16(mn);
    mx = clamp16(mx);
    const double range = double(mx) - double(mn);
    int e = -126, k;
    if (range > 0) {
        frexp(range / double(levels), &k);  // 2^(k-1) <= range/levels < 2^k
        if (k - 1 > e) e = k - 1;
    }
    if (mn != 0.0f) {
        frexp(fabs(double(mn)) / 32767.0, &k);
        if (k - 1 > e) e = k - 1;
    }
    for (;; ++e) {
        const double s = ldexp(1.0, e), zi = floor(double(mn) / s);
        if (zi < -32768.0 || zi > 32767.0) continue;
        if (rne((double(mx) - zi * s) / s) > double(levels)) continue;
        *eo = int8_t(e);
        *zo = int16_t(zi);
        return;
    }
}

uint32_t dyadic_code(float x, int8_t e, int16_t zi, uint32_t levels) {
    const double s = ldexp(1.0, e);
    const double c = rne((double(clamp16(x)) - double(zi) * s) / s);
    return c < 0 ? 0 : c > double(levels) ? levels : uint32_t(c);
}

void vgroup_quant(const float *x, uint32_t m, uint32_t levels, uint8_t *codes, uint16_t *so, uint16_t *zo) {
    float mn = clamp16(x[0]), mx = mn;
    for (uint32_t i = 1; i < m; ++i) {
        const float v = clamp16(x[i]);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    const uint16_t zh = f16_round_down(mn);
    const double z = f32_from_f16(zh);
    const uint16_t sh = f16_round_up(float((double(mx) - z) / double(levels)));
    const double s = f32_from_f16(sh);
    for (uint32_t i = 0; i < m; ++i) {
        double c = s > 0 ? rne((double(clamp16(x[i])) - z) / s) : 0.0;
        c = c < 0 ? 0 : c > double(levels) ? double(levels) : c;
        codes[i] = uint8_t(c);
    }
    *so = sh;
    *zo = zh;
}

uint32_t q4_get(const uint8_t *row, uint32_t wp, uint32_t c) {
    uint32_t byte;
    bool hi;
    q4_where(wp, c, &byte, &hi);
    return hi ? uint32_t(row[byte] >> 4) : uint32_t(row[byte] & 15u);
}

void q4_set(uint8_t *row, uint32_t wp, uint32_t c, uint32_t code) {
    uint32_t byte;
    bool hi;
    q4_where(wp, c, &byte, &hi);
    row[byte] = hi ? uint8_t((row[byte] & 0x0fu) | (code << 4)) : uint8_t((row[byte] & 0xf0u) | code);
}

void fmt_k_decode(const StoreFormat &f, const uint8_t *row, const int8_t *ge, const int16_t *gz, float *kf) {
    switch (f.dtype) {
        case KVP_DTYPE_F32: memcpy(kf, row, size_t(f.wkp) * 4); return;
        case KVP_DTYPE_F16: {
            const uint16_t *h = reinterpret_cast<const uint16_t *>(row);
            for (uint32_t c = 0; c < f.wkp; ++c) kf[c] = f32_from_f16(h[c]);
            return;
        }
        default:
            for (uint32_t c = 0; c < f.wkp; ++c) {
                const uint32_t code = f.dtype == KVP_DTYPE_Q8 ? row[c] : q4_get(row, f.wkp, c);
                kf[c] = float(int32_t(gz[c]) + int32_t(code)) * dyadic_step(ge[c]);  // exact
            }
    }
}

void fmt_v_decode(const StoreFormat &f, const uint8_t *row, const uint16_t *sz, float *vf) {
    switch (f.dtype) {
        case KVP_DTYPE_F32: memcpy(vf, row, size_t(f.wvp) * 4); return;
        case KVP_DTYPE_F16: {
            const uint16_t *h = reinterpret_cast<const uint16_t *>(row);
            for (uint32_t c = 0; c < f.wvp; ++c) vf[c] = f32_from_f16(h[c]);
            return;
        }
        default:
            for (uint32_t c = 0; c < f.wvp; ++c) {
                if (c >= f.wv) { vf[c] = 0.0f; continue; }
                const uint32_t g = c / kVGroup;
                const uint32_t code = f.dtype == KVP_DTYPE_Q8 ? row[c] : q4_get(row, f.wvp, c);
                vf[c] = f32_from_f16(sz[g]) * float(code) + f32_from_f16(sz[f.v_groups + g]);
            }
    }
}

void fmt_k_encode(const StoreFormat &f, const float *kf, const int8_t *ge, const int16_t *gz, uint8_t *row) {
    switch (f.dtype) {
        case KVP_DTYPE_F32: {
            float *r = reinterpret_cast<float *>(row);
            for (uint32_t c = 0; c < f.wkp; ++c) r[c] = c < f.wk ? kf[c] : 0.0f;
            return;
        }
        case KVP_DTYPE_F16: {
            uint16_t *h = reinterpret_cast<uint16_t *>(row);
            for (uint32_t c = 0; c < f.wkp; ++c) h[c] = c < f.wk ? f16_from_f32(kf[c]) : 0;
            return;
        }
        case KVP_DTYPE_Q8:
            for (uint32_t c = 0; c < f.wkp; ++c) row[c] = c < f.wk ? uint8_t(dyadic_code(kf[c], ge[c], gz[c], 255)) : 0;
            return;
        default:
            memset(row, 0, f.k_row);
            for (uint32_t c = 0; c < f.wk; ++c) q4_set(row, f.wkp, c, dyadic_code(kf[c], ge[c], gz[c], 15));
    }
}

void fmt_v_encode(const StoreFormat &f, const float *vf, uint8_t *row, uint16_t *sz) {
    switch (f.dtype) {
        case KVP_DTYPE_F32: {
            float *r = reinterpret_cast<float *>(row);
            for (uint32_t c = 0; c < f.wvp; ++c) r[c] = c < f.wv ? vf[c] : 0.0f;
            return;
        }
        case KVP_DTYPE_F16: {
            uint16_t *h = reinterpret_cast<uint16_t *>(row);
            for (uint32_t c = 0; c < f.wvp; ++c) h[c] = c < f.wv ? f16_from_f32(vf[c]) : 0;
            return;
        }
        default: {
            memset(row, 0, f.v_row);
            uint8_t codes[kVGroup];
            for (uint32_t g = 0; g < f.v_groups; ++g) {
                const uint32_t c0 = g * kVGroup, m = f.wv - c0 < kVGroup ? f.wv - c0 : kVGroup;
                vgroup_quant(vf + c0, m, f.levels, codes, &sz[g], &sz[f.v_groups + g]);
                for (uint32_t i = 0; i < m; ++i) {
                    if (f.dtype == KVP_DTYPE_Q8) row[c0 + i] = codes[i];
                    else q4_set(row, f.wvp, c0 + i, codes[i]);
                }
            }
        }
    }
}

void fmt_k_grid(const StoreFormat &f, const float *kf, size_t ld, uint32_t n, int8_t *ge, int16_t *gz) {
    for (uint32_t c = 0; c < f.wkp; ++c) {
        if (c >= f.wk || n == 0) {
            ge[c] = 0;
            gz[c] = 0;
            continue;
        }
        float mn = kf[c], mx = kf[c];
        for (uint32_t i = 1; i < n; ++i) {
            const float v = kf[i * ld + c];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        dyadic_grid(mn, mx, f.levels, &ge[c], &gz[c]);
    }
}

}  // namespace kvp
