#include "rope.h"

#include <math.h>
#include <stdint.h>

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
