#include "reference.h"

#include <gtest/gtest.h>
#include <math.h>
#include <string.h>

#include <map>
#include <tuple>

namespace ref {

namespace {

// cos and sin of every rotated pair at one position, memoized per thread: tests call the
// reference for every key at every step, and recomputing pow, cos and sin there was most of
// their time (88% of QuantError.DecodeOutputsWithinStatedBounds; ~12x more under qemu). The
// values are the same expressions of the same arguments, so the same bits as computing them
// each time. The memo grows with the positions a test uses (rope_dim doubles each) and lives
// until the thread ends.
const std::vector<double> &rope_cos_sin(const kvp_model &m, uint32_t rd, int64_t pos) {
    uint32_t theta_bits;
    memcpy(&theta_bits, &m.rope_theta, sizeof theta_bits);
    static thread_local std::map<std::tuple<uint32_t, uint32_t, int64_t>, std::vector<double>> memo;
    std::vector<double> &cs = memo[std::make_tuple(theta_bits, rd, pos)];
    if (cs.empty()) {
        cs.resize(rd);
        for (uint32_t i = 0; i < rd / 2; ++i) {
            const double f = pow(double(m.rope_theta), -2.0 * i / double(rd));
            const double a = double(pos) * f;
            cs[2 * i] = cos(a);
            cs[2 * i + 1] = sin(a);
        }
    }
    return cs;
}

}  // namespace

void rotate(const kvp_model &m, std::vector<double> &x, int64_t pos) {
    if (m.rope == KVP_ROPE_NONE) return;
    const uint32_t rd = m.rope_dim ? m.rope_dim : m.head_dim;
    const std::vector<double> &cs = rope_cos_sin(m, rd, pos);
    for (uint32_t i = 0; i < rd / 2; ++i) {
        const double c = cs[2 * i], s = cs[2 * i + 1];
        const uint32_t i0 = m.rope == KVP_ROPE_GPTJ ? 2 * i : i;
        const uint32_t i1 = m.rope == KVP_ROPE_GPTJ ? 2 * i + 1 : i + rd / 2;
        const double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

namespace {

// Keys idx[j] of KV head kvh (k_all is [T][nkv][hd], pre-RoPE), each rotated to kpos[j]:
// [idx.size()][hd], in double.
std::vector<double> rotated_keys(const kvp_model &m, uint32_t kvh, const float *k_all,
                                 const std::vector<uint32_t> &idx, const std::vector<int64_t> &kpos) {
    const uint32_t hd = m.head_dim;
    std::vector<double> keys(idx.size() * hd), kk(hd);
    for (size_t j = 0; j < idx.size(); ++j) {
        const float *kr = k_all + (size_t(idx[j]) * m.n_kv_heads + kvh) * hd;
        kk.assign(kr, kr + hd);
        rotate(m, kk, kpos[j]);
        std::copy(kk.begin(), kk.end(), keys.begin() + j * hd);
    }
    return keys;
}

}  // namespace

std::vector<double> weights(const kvp_model &m, uint32_t h, const float *q_row, int64_t qpos, const float *k_all,
                            const std::vector<uint32_t> &idx, const std::vector<int64_t> &kpos) {
    const uint32_t hd = m.head_dim, kvh = h / (m.n_q_heads / m.n_kv_heads);
    std::vector<double> qr(q_row, q_row + hd);
    rotate(m, qr, qpos);
    const std::vector<double> keys = rotated_keys(m, kvh, k_all, idx, kpos);
    std::vector<double> w(idx.size());
    double mx = -INFINITY;
    for (size_t j = 0; j < idx.size(); ++j) {
        const double *kk = &keys[j * hd];
        double d = 0;
        for (uint32_t i = 0; i < hd; ++i) d += qr[i] * kk[i];
        w[j] = d / sqrt(double(hd));
        mx = std::max(mx, w[j]);
    }
    double sum = 0;
    for (double &x : w) sum += (x = exp(x - mx));
    for (double &x : w) x /= sum;
    return w;
}

void attend(const kvp_model &m, const float *q, int64_t qpos, const float *k_all, const float *v_all,
            const std::vector<uint32_t> &idx, const std::vector<int64_t> &kpos, std::vector<double> &out) {
    const uint32_t hd = m.head_dim, G = m.n_q_heads / m.n_kv_heads;
    out.assign(size_t(m.n_q_heads) * hd, 0.0);
    std::vector<double> keys;  // one KV head's rotated keys, shared by its G query heads
    for (uint32_t h = 0; h < m.n_q_heads; ++h) {
        const uint32_t kvh = h / G;
        if (h % G == 0) keys = rotated_keys(m, kvh, k_all, idx, kpos);
        std::vector<double> qr(q + h * hd, q + (h + 1) * hd);
        rotate(m, qr, qpos);
        std::vector<double> logit(idx.size());
        double mx = -INFINITY;
        for (size_t j = 0; j < idx.size(); ++j) {
            const double *kk = &keys[j * hd];
            double d = 0;
            for (uint32_t i = 0; i < hd; ++i) d += qr[i] * kk[i];
            logit[j] = d / sqrt(double(hd));
            mx = std::max(mx, logit[j]);
        }
        double sum = 0;
        for (double &l : logit) sum += (l = exp(l - mx));
        for (size_t j = 0; j < idx.size(); ++j) {
            const float *vr = v_all + (size_t(idx[j]) * m.n_kv_heads + kvh) * hd;
            for (uint32_t i = 0; i < hd; ++i) out[size_t(h) * hd + i] += logit[j] / sum * vr[i];
        }
    }
}

Cache::Cache(const kvp_model &m, const std::string &spec) {
    kvp_config cfg;
    EXPECT_EQ(kvp_config_default(&cfg, &m), KVP_OK);
    char err[256] = "";
    EXPECT_EQ(kvp_config_apply(&cfg, spec.c_str(), err, sizeof err), KVP_OK) << err;
    bytes = kvp_arena_size(&cfg);
    EXPECT_GT(bytes, 0u) << spec;
    arena = aligned_alloc(64, (bytes + 63) / 64 * 64);
    EXPECT_EQ(kvp_create(&cfg, arena, bytes, &c), KVP_OK) << spec;
}

Cache::~Cache() {
    kvp_destroy(c);
    free(arena);
}

std::vector<int32_t> Cache::positions(uint32_t layer, uint32_t head) const {
    std::vector<int32_t> p(kvp_layer_len(c, layer) + 1);
    uint32_t n = 0;
    EXPECT_EQ(kvp_layer_positions(c, layer, head, p.data(), uint32_t(p.size()), &n), KVP_OK);
    p.resize(n);
    return p;
}

void Cache::copy_state_to(Cache &to) const {
    std::vector<uint8_t> st(kvp_state_size(c));
    size_t written = 0;
    ASSERT_EQ(kvp_state_save(c, st.data(), st.size(), &written), KVP_OK) << kvp_last_error(c);
    ASSERT_EQ(kvp_state_load(to.c, st.data(), written), KVP_OK) << kvp_last_error(to.c);
}

kvp_model model(uint32_t layers, uint32_t nq, uint32_t nkv, uint32_t hd, kvp_rope_style rope, uint32_t rope_dim,
                float theta) {
    kvp_model m = {layers, nq, nkv, hd, rope, rope_dim, theta};
    return m;
}

}  // namespace ref
