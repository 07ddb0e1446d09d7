#include "quant_support.h"

#include <gtest/gtest.h>
#include <math.h>

#include "cache.h"
#include "quant/store_fmt.h"

namespace qref {

std::vector<Tok> snapshot(const kvp_cache *c, uint32_t layer, uint32_t head) {
    const uint32_t hd = c->cfg.model.head_dim, L = kvp::head_of(c, layer, head).len();
    std::vector<Tok> out(L);
    std::vector<float> k(hd), v(hd);
    for (uint32_t j = 0; j < L; ++j) {
        int64_t rot = 0;
        EXPECT_TRUE(kvp::fmt_read_token(c, layer, head, j, k.data(), v.data(), &rot));
        out[j].k.assign(k.begin(), k.end());
        out[j].v.assign(v.begin(), v.end());
        out[j].rot = rot;
    }
    return out;
}

void decode_ref(const kvp_model &m, const std::vector<Tok> &snap, bool realign, const float *q, int64_t P,
                const float *knew, const float *vnew, std::vector<double> &out) {
    const uint32_t hd = m.head_dim, G = m.n_q_heads / m.n_kv_heads;
    const size_t L = snap.size() + 1;
    std::vector<std::vector<double>> keys(L), vals(L);
    for (size_t j = 0; j < snap.size(); ++j) {
        keys[j] = snap[j].k;
        if (realign) ref::rotate(m, keys[j], int64_t(j) - snap[j].rot);
        vals[j] = snap[j].v;
    }
    keys[L - 1].assign(knew, knew + hd);
    ref::rotate(m, keys[L - 1], P);
    vals[L - 1].assign(vnew, vnew + hd);
    out.assign(size_t(G) * hd, 0.0);
    for (uint32_t g = 0; g < G; ++g) {
        std::vector<double> qr(q + g * hd, q + (g + 1) * hd);
        ref::rotate(m, qr, P);
        std::vector<double> lg(L);
        double mx = -INFINITY;
        for (size_t j = 0; j < L; ++j) {
            double d = 0;
            for (uint32_t i = 0; i < hd; ++i) d += qr[i] * keys[j][i];
            lg[j] = d / sqrt(double(hd));
            mx = std::max(mx, lg[j]);
        }
        double sum = 0;
        for (double &x : lg) sum += (x = exp(x - mx));
        for (size_t j = 0; j < L; ++j)
            for (uint32_t i = 0; i < hd; ++i) out[size_t(g) * hd + i] += lg[j] / sum * vals[j][i];
    }
}

double max_abs(const float *a, const double *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; ++i) e = std::max(e, fabs(double(a[i]) - b[i]));
    return e;
}

kvp_config config(const kvp_model &m, const std::string &spec) {
    kvp_config cfg;
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << spec << ": " << err;
    return cfg;
}

}  // namespace qref
