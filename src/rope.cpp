#include "rope.h"

#include "kernels/score_fixed.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace kvp {

void rope_init_freqs(const kvp_model &m, double *inv_freq, uint32_t pairs) {
    const double rd = double(pairs) * 2.0;
    for (uint32_t i = 0; i < pairs; ++i) inv_freq[i] = pow(double(m.rope_theta), -2.0 * double(i) / rd);
}

void rope_table(const Rope &r, int64_t pos, float *cs) {
    for (uint32_t i = 0; i < r.pairs; ++i) {
        const double a = double(pos) * r.inv_freq[i];
        cs[2 * i] = float(cos(a));
        cs[2 * i + 1] = float(sin(a));
    }
}

size_t rope_memo_floats(uint32_t pairs) { return size_t(kRopeMemoEntries) * rope_table_floats(pairs); }

void rope_memo_init(RopeMemo &m, float *tables, uint32_t table_floats) {
    for (uint32_t i = 0; i < kRopeMemoEntries; ++i) m.pos[i] = INT64_MIN;
    m.tables = tables;
    m.table_floats = table_floats;
}

const float *rope_table_memo(const Rope &r, RopeMemo &m, int64_t pos) {
    if (pos >= 0 && pos < int64_t(r.full_n)) return r.full + size_t(pos) * r.full_floats;
    for (uint32_t k = 0; k < 2; ++k)
        if (pos >= r.call_first[k] && pos - r.call_first[k] < int64_t(r.call_n[k]))
            return r.call + (size_t(k) * r.call_cap + size_t(pos - r.call_first[k])) * r.full_floats;
    const uint32_t i = uint32_t(uint64_t(pos) % kRopeMemoEntries);
    float *t = m.tables + size_t(i) * m.table_floats;
    if (m.pos[i] != pos) {
        rope_table(r, pos, t);
        m.pos[i] = pos;
    }
    return t;
}

void rope_call_prepare(Rope &r, uint32_t range, int64_t first, uint32_t n) {
    if (n > r.call_cap) n = r.call_cap;
    if (n == 0 || range >= r.call_ranges) return;
    auto holds = [&](uint32_t k) {
        return r.call_n[k] && first >= r.call_first[k] && first + n <= r.call_first[k] + int64_t(r.call_n[k]);
    };
    if (holds(range)) return;
    if (range == 1 && holds(0)) {
        r.call_n[1] = 0;
        return;
    }
    r.call_n[range] = 0;  // (only the calling thread runs now)
    float *t = r.call + size_t(range) * r.call_cap * r.full_floats;
    for (uint32_t i = 0; i < n; ++i) rope_table(r, first + i, t + size_t(i) * r.full_floats);
    r.call_first[range] = first;
    r.call_n[range] = n;
}

void rope_apply(const Rope &r, const float *cs, float *x, uint32_t n, uint32_t ld) {
    if (r.style == KVP_ROPE_NONE) return;
    if (r.rot) {
        r.rot(cs, x, n, ld, r.pairs);
        return;
    }
    const uint32_t half = r.pairs;
    for (uint32_t j = 0; j < n; ++j) {
        float *row = x + size_t(j) * ld;
        for (uint32_t i = 0; i < half; ++i) {
            const uint32_t a = r.style == KVP_ROPE_GPTJ ? 2 * i : i;
            const uint32_t b = r.style == KVP_ROPE_GPTJ ? 2 * i + 1 : i + half;
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = row[a], x1 = row[b];
            row[a] = x0 * c - x1 * s;
            row[b] = x0 * s + x1 * c;
        }
    }
}

}  // namespace kvp

// ---- RoPE frequency tables (issue 21) ----

namespace kvp {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kLn2d = 6.93147180559945309417e-01;

bool finite(double x) { return x == x && x - x == 0.0; }

// theta^(-i/n), as fixed::rope_freqs computes it (2i/(2n) and i/n round to the same double).
double base_freq(double log2_theta, uint32_t i, uint32_t n) { return fixed::det_exp2(-(double(i) / double(n)) * log2_theta); }

kvp_status check_common(const double *inv_freq, uint32_t n, double theta, Msg &m) {
    if (!inv_freq || n == 0) {
        m.s(!inv_freq ? "inv_freq must not be NULL" : "n (rope_dim/2 pairs) must be > 0");
        return KVP_ERR_ARG;
    }
    if (!finite(theta) || !(theta > 1.0)) {
        m.s("theta=").f(theta).s(" must be finite and > 1");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

kvp_status check_factor(double factor, Msg &m) {
    if (!finite(factor) || !(factor >= 1.0)) {
        m.s("factor=").f(factor).s(" must be finite and >= 1 (the context extension ratio)");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

kvp_status check_orig(double L, Msg &m) {
    if (!finite(L) || !(L >= 1.0)) {
        m.s("original_max_position_embeddings=").f(L).s(" must be finite and >= 1");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

}  // namespace

kvp_status rope_freqs_linear(double *inv_freq, uint32_t n, double theta, double factor, Msg &m) {
    kvp_status st = check_common(inv_freq, n, theta, m);
    if (st == KVP_OK) st = check_factor(factor, m);
    if (st != KVP_OK) return st;
    const double l2 = fixed::det_log2(theta);
    for (uint32_t i = 0; i < n; ++i) inv_freq[i] = base_freq(l2, i, n) / factor;
    return KVP_OK;
}

kvp_status rope_freqs_llama3(double *inv_freq, uint32_t n, double theta, double factor, double low_freq_factor,
                             double high_freq_factor, double original_max_pos, Msg &m) {
    kvp_status st = check_common(inv_freq, n, theta, m);
    if (st == KVP_OK) st = check_factor(factor, m);
    if (st == KVP_OK) st = check_orig(original_max_pos, m);
    if (st != KVP_OK) return st;
    if (!finite(low_freq_factor) || !finite(high_freq_factor) || !(low_freq_factor > 0.0) ||
        !(high_freq_factor > low_freq_factor)) {
        m.s("low_freq_factor=").f(low_freq_factor).s(", high_freq_factor=").f(high_freq_factor)
            .s(": need 0 < low_freq_factor < high_freq_factor, both finite (Llama 3.1: 1 and 4)");
        return KVP_ERR_CONFIG;
    }
    const double l2 = fixed::det_log2(theta);
    const double low_wl = original_max_pos / low_freq_factor, high_wl = original_max_pos / high_freq_factor;
    for (uint32_t i = 0; i < n; ++i) {
        const double f = base_freq(l2, i, n), wl = 2.0 * kPi / f;
        if (wl < high_wl) {
            inv_freq[i] = f;  // high frequencies: unchanged
        } else if (wl > low_wl) {
            inv_freq[i] = f / factor;  // low frequencies: interpolated
        } else {
            const double s = (original_max_pos / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
            inv_freq[i] = (1.0 - s) * (f / factor) + s * f;
        }
    }
    return KVP_OK;
}

kvp_status rope_freqs_yarn(double *inv_freq, uint32_t n, double theta, double factor, double original_max_pos,
                           double beta_fast, double beta_slow, float *attn_factor, Msg &m) {
    kvp_status st = check_common(inv_freq, n, theta, m);
    if (st == KVP_OK) st = check_factor(factor, m);
    if (st == KVP_OK) st = check_orig(original_max_pos, m);
    if (st != KVP_OK) return st;
    if (!finite(beta_fast) || !finite(beta_slow) || !(beta_slow > 0.0) || !(beta_fast > beta_slow)) {
        m.s("beta_fast=").f(beta_fast).s(", beta_slow=").f(beta_slow)
            .s(": need beta_fast > beta_slow > 0, both finite (YaRN's defaults: 32 and 1)");
        return KVP_ERR_CONFIG;
    }
    const double l2 = fixed::det_log2(theta), d = 2.0 * double(n);
    // The pair index (as a real number) whose wavelength 2*pi*theta^(i/n) fits r times into L.
    auto corr = [&](double r) { return d * fixed::det_log2(original_max_pos / (2.0 * kPi * r)) / (2.0 * l2); };
    double lo = floor(corr(beta_fast)), hi = ceil(corr(beta_slow));
    if (lo < 0.0) lo = 0.0;
    if (hi > d - 1.0) hi = d - 1.0;
    if (hi == lo) hi += 0.001;  // (lo > hi is possible for tiny L: the ramp is then a step)
    for (uint32_t i = 0; i < n; ++i) {
        const double f = base_freq(l2, i, n);
        double g = (double(i) - lo) / (hi - lo);
        g = g < 0.0 ? 0.0 : g > 1.0 ? 1.0 : g;
        inv_freq[i] = (f / factor) * g + f * (1.0 - g);
    }
    if (attn_factor) *attn_factor = factor > 1.0 ? float(0.1 * fixed::det_log2(factor) * kLn2d + 1.0) : 1.0f;
    return KVP_OK;
}

kvp_status rope_freqs_divided(double *inv_freq, uint32_t n, double theta, const float *divisors, Msg &m) {
    if (!divisors) {
        m.s("divisors must not be NULL");
        return KVP_ERR_ARG;
    }
    kvp_status st = check_common(inv_freq, n, theta, m);
    if (st != KVP_OK) return st;
    for (uint32_t i = 0; i < n; ++i) {
        if (!finite(double(divisors[i])) || !(divisors[i] > 0.0f)) {
            m.s("divisors[").u(i).s("]=").f(double(divisors[i])).s(" must be finite and > 0");
            return KVP_ERR_CONFIG;
        }
    }
    const double l2 = fixed::det_log2(theta);
    for (uint32_t i = 0; i < n; ++i) inv_freq[i] = base_freq(l2, i, n) / double(divisors[i]);
    return KVP_OK;
}

kvp_status rope_table_check(const kvp_config &cfg, const double *inv_freq, uint32_t n, Msg &m) {
    if (!inv_freq && n == 0) return KVP_OK;
    if (!inv_freq) {
        m.s("inv_freq is NULL but n=").u(n).s(" (pass NULL with n=0 for theta's frequencies)");
        return KVP_ERR_ARG;
    }
    const kvp_model &md = cfg.model;
    if (md.rope == KVP_ROPE_NONE) {
        m.s("a RoPE frequency table was given but model.rope=KVP_ROPE_NONE (the library rotates nothing); set "
            "model.rope to KVP_ROPE_NEOX or KVP_ROPE_GPTJ, or pass no table");
        return KVP_ERR_CONFIG;
    }
    const uint32_t pairs = (md.rope_dim ? md.rope_dim : md.head_dim) / 2;
    if (n != pairs) {
        m.s("the RoPE frequency table has n=").u(n).s(" entries; it needs rope_dim/2=").u(pairs).s(" (one per rotated pair)");
        return KVP_ERR_CONFIG;
    }
    for (uint32_t i = 0; i < n; ++i) {
        if (!finite(inv_freq[i]) || !(inv_freq[i] > 0.0)) {
            m.s("RoPE inv_freq[").u(i).s("]=").f(inv_freq[i]).s(" must be finite and > 0");
            return KVP_ERR_CONFIG;
        }
    }
    return KVP_OK;
}

uint32_t rope_table_fingerprint(const double *inv_freq, uint32_t n) {
    if (!inv_freq || !n) return 0;
    // FNV-1a over the entries' bits, little-endian order whatever the host (portable states).
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; ++i) {
        uint64_t b;
        memcpy(&b, &inv_freq[i], 8);
        for (int k = 0; k < 8; ++k) {
            h ^= (b >> (8 * k)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    h ^= n;
    const uint32_t f = uint32_t(h ^ (h >> 32));
    return f ? f : 1u;
}

}  // namespace kvp
