#include "induction_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kvh {

namespace {

constexpr int kVocab = 256;  // byte tokens
constexpr int kCode = 128;   // dims of a byte's code
constexpr int kHidden = 8;   // FFN width written to the header (all FFN weights are zero)

// xoshiro256** seeded through splitmix64; normals by Box-Muller. Only the generator's own
// determinism matters (same seed, same file on one platform).
class Rng {
public:
    explicit Rng(uint64_t seed) {
        for (uint64_t &w : s_) {
            seed += 0x9E3779B97F4A7C15ull;
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            w = z ^ (z >> 31);
        }
    }
    uint64_t next() {
        const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }
    double normal() {
        if (have_spare_) {
            have_spare_ = false;
            return spare_;
        }
        const double u1 = ((double)(next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
        const double u2 = (double)(next() >> 11) * 0x1.0p-53;          // [0, 1)
        const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
        spare_ = r * std::sin(a);
        have_spare_ = true;
        return r * std::cos(a);
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
    double spare_ = 0;
    bool have_spare_ = false;
};

// Dense row-major matrix [rows][cols] in double (written as float at the end).
struct Mat {
    int rows = 0, cols = 0;
    std::vector<double> v;
    Mat() = default;
    Mat(int r, int c) : rows(r), cols(c), v((size_t)r * c, 0.0) {}
    double &at(int r, int c) { return v[(size_t)r * cols + c]; }
    double at(int r, int c) const { return v[(size_t)r * cols + c]; }
};

// y = W x over the non-zero entries only (the construction's matrices are almost empty).
struct SparseRows {
    std::vector<size_t> start;
    std::vector<int> col;
    std::vector<double> val;
    explicit SparseRows(const Mat &m) {
        start.push_back(0);
        for (int r = 0; r < m.rows; r++) {
            for (int c = 0; c < m.cols; c++) {
                if (m.at(r, c) != 0.0) {
                    col.push_back(c);
                    val.push_back(m.at(r, c));
                }
            }
            start.push_back(col.size());
        }
    }
    void apply(const double *x, double *y) const {
        for (size_t r = 0; r + 1 < start.size(); r++) {
            double s = 0;
            for (size_t i = start[r]; i < start[r + 1]; i++) s += val[i] * x[col[i]];
            y[r] = s;
        }
    }
};

struct Weights {
    int dim = 0, heads = 0, kv = 1, hd = 0;
    Mat emb;                     // [256][dim]
    Mat wq[2], wk[2], wv[2], wo[2];
    Mat cls;                     // [256][dim]
};

double rms(const double *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    return std::sqrt(s / n);
}

// The format's forward pass (RMSNorm with unit weights, GPT-J RoPE, causal softmax attention with
// w.kv KV heads (query head h reads KV head h / (heads / kv)), zero FFN) over `tokens`, through
// layers [0, n_layers); returns the mean RMS of the residual rows that come out. Used only to
// calibrate two scales of the construction.
double mean_residual_rms(const Weights &w, const std::vector<double> &theta, const std::vector<int> &tokens,
                         int n_layers) {
    const int T = (int)tokens.size(), D = w.dim, H = w.heads, hd = w.hd, P = hd / 2, KV = w.kv, group = H / KV;
    const size_t kvw = (size_t)KV * hd;  // a token's K (or V) row over its KV heads
    std::vector<double> x((size_t)T * D), hn(D), q((size_t)T * H * hd), k((size_t)T * kvw), v((size_t)T * kvw),
        o(H * hd), y(D), p(T);
    for (int t = 0; t < T; t++)
        std::memcpy(&x[(size_t)t * D], &w.emb.v[(size_t)tokens[t] * D], sizeof(double) * D);
    auto rope = [&](double *u, int pos) {
        for (int f = 0; f < P; f++) {
            const double c = std::cos(pos * theta[f]), s = std::sin(pos * theta[f]);
            const double a = u[2 * f], b = u[2 * f + 1];
            u[2 * f] = a * c - b * s;
            u[2 * f + 1] = a * s + b * c;
        }
    };
    for (int l = 0; l < n_layers; l++) {
        const SparseRows Q(w.wq[l]), K(w.wk[l]), V(w.wv[l]), O(w.wo[l]);
        for (int t = 0; t < T; t++) {
            const double *xt = &x[(size_t)t * D];
            double ss = 0;
            for (int i = 0; i < D; i++) ss += xt[i] * xt[i];
            const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
            for (int i = 0; i < D; i++) hn[i] = xt[i] * inv;
            Q.apply(hn.data(), &q[(size_t)t * H * hd]);
            K.apply(hn.data(), &k[(size_t)t * kvw]);
            V.apply(hn.data(), &v[(size_t)t * kvw]);
            for (int h = 0; h < H; h++) rope(&q[((size_t)t * H + h) * hd], t);
            for (int g = 0; g < KV; g++) rope(&k[(size_t)t * kvw + (size_t)g * hd], t);
        }
        // All queries read the residual before this layer's writes: add the outputs afterwards.
        std::vector<double> add((size_t)T * D, 0.0);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                const double *qh = &q[((size_t)t * H + h) * hd];
                const size_t kv_at = (size_t)(h / group) * hd;
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += qh[d] * k[(size_t)j * kvw + kv_at + d];
                    p[j] = s / std::sqrt((double)hd);
                    mx = std::max(mx, p[j]);
                }
                double z = 0;
                for (int j = 0; j <= t; j++) z += (p[j] = std::exp(p[j] - mx));
                for (int d = 0; d < hd; d++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++) s += p[j] * v[(size_t)j * kvw + kv_at + d];
                    o[(size_t)h * hd + d] = s / z;
                }
            }
            O.apply(o.data(), y.data());
            for (int i = 0; i < D; i++) add[(size_t)t * D + i] = y[i];
        }
        for (size_t i = 0; i < x.size(); i++) x[i] += add[i];
    }
    double sum = 0;
    for (int t = 0; t < T; t++) sum += rms(&x[(size_t)t * D], D);
    return sum / T;
}

// Solves (A^T A) X = A^T B for X (least squares; A [n][m] with full column rank, B [n][k]) by Cholesky.
bool least_squares(const Mat &A, const Mat &B, Mat *X) {
    const int n = A.rows, m = A.cols, kc = B.cols;
    Mat N(m, m), R(m, kc);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int r = 0; r < n; r++) s += A.at(r, i) * A.at(r, j);
            N.at(i, j) = s;
        }
    for (int i = 0; i < m; i++)
        for (int c = 0; c < kc; c++) {
            double s = 0;
            for (int r = 0; r < n; r++) s += A.at(r, i) * B.at(r, c);
            R.at(i, c) = s;
        }
    Mat L(m, m);  // N = L L^T
    for (int j = 0; j < m; j++) {
        double d = N.at(j, j);
        for (int k = 0; k < j; k++) d -= L.at(j, k) * L.at(j, k);
        if (!(d > 0)) return false;
        L.at(j, j) = std::sqrt(d);
        for (int i = j + 1; i < m; i++) {
            double s = N.at(i, j);
            for (int k = 0; k < j; k++) s -= L.at(i, k) * L.at(j, k);
            L.at(i, j) = s / L.at(j, j);
        }
    }
    *X = Mat(m, kc);
    for (int c = 0; c < kc; c++) {
        std::vector<double> z(m);
        for (int i = 0; i < m; i++) {  // L z = R
            double s = R.at(i, c);
            for (int k = 0; k < i; k++) s -= L.at(i, k) * z[k];
            z[i] = s / L.at(i, i);
        }
        for (int i = m - 1; i >= 0; i--) {  // L^T x = z
            double s = z[i];
            for (int k = i + 1; k < m; k++) s -= L.at(k, i) * X->at(k, c);
            X->at(i, c) = s / L.at(i, i);
        }
    }
    return true;
}

bool write_floats(std::FILE *f, const std::vector<double> &v) {
    std::vector<float> buf(v.size());
    for (size_t i = 0; i < v.size(); i++) buf[i] = (float)v[i];
    return std::fwrite(buf.data(), sizeof(float), buf.size(), f) == buf.size();
}

}  // namespace

bool write_induction_model(const InductionParams &p, const std::vector<uint8_t> &corpus,
                           const std::string &out_path, std::string *err, std::string *summary) {
    const int H = p.heads, hd = p.head_dim, D = H * hd, P = hd / 2, n = p.order, KV = p.kv_heads;
    const int cdim = 2 * p.match_pairs;
    // Residual layout: [code | constant | context | history | answer | previous byte (KV = 2)].
    const int kConst = kCode, kCtx = kConst + 1, kHist = kCtx + cdim, kAns = kHist + cdim, kPrev = kAns + kCode;
    auto bad = [&](const std::string &m) {
        *err = "induction model: " + m;
        return false;
    };
    if (H < 1 || H > 64) return bad("heads must be in 1..64");
    if (hd < kCode || hd > 1024 || hd % 2 != 0) return bad("head_dim must be even and in 128..1024");
    if (n < 1 || n > H) return bad("order must be in 1..heads (one positional head per offset)");
    if (p.pos_pairs < 1 || p.match_pairs < 1 || p.pos_pairs + p.match_pairs > P)
        return bad("pos_pairs and match_pairs must be >= 1 and together at most head_dim/2");
    if (KV != 1 && KV != 2) return bad("kv_heads must be 1 or 2");
    if (KV == 2 && H % 2 != 0) return bad("kv_heads 2 needs an even number of heads");
    if ((KV == 2 ? kPrev : kAns) + kCode > D) return bad("the residual layout does not fit heads * head_dim");
    if (!(p.local_gain >= 0)) return bad("local_gain must be >= 0");
    if (p.context < 2 || p.context > (1 << 20)) return bad("context must be in 2..1048576");
    if (!(p.subspace_scale > 0) || !(p.pos_sharpness > 0) || !(p.match_sharpness > 0))
        return bad("scales and sharpness must be positive");
    if (corpus.size() < 2) return bad("the corpus must hold at least 2 bytes");

    Rng rng(p.seed);
    std::vector<double> theta(P);
    for (int f = 0; f < P; f++) theta[f] = std::pow(10000.0, -2.0 * f / hd);

    // Byte codes (|g|^2 = kCode exactly) and one random projection per offset into the matching space.
    Mat G(kVocab, kCode);
    for (int b = 0; b < kVocab; b++) {
        double ss = 0;
        for (int i = 0; i < kCode; i++) ss += (G.at(b, i) = rng.normal()) * G.at(b, i);
        const double s = std::sqrt(kCode / ss);
        for (int i = 0; i < kCode; i++) G.at(b, i) *= s;
    }
    std::vector<Mat> proj(n, Mat(cdim, kCode));  // proj[m]: code of the byte m positions back
    for (Mat &m : proj)
        for (double &x : m.v) x = rng.normal() / std::sqrt((double)kCode);

    Weights w;
    w.dim = D;
    w.heads = H;
    w.kv = KV;
    w.hd = hd;
    w.emb = Mat(kVocab, D);
    for (int b = 0; b < kVocab; b++) {
        for (int i = 0; i < kCode; i++) w.emb.at(b, i) = G.at(b, i);
        w.emb.at(b, kConst) = std::sqrt((double)kCode);
    }
    for (int l = 0; l < 2; l++) {
        w.wq[l] = Mat(H * hd, D);
        w.wk[l] = Mat(KV * hd, D);
        w.wv[l] = Mat(KV * hd, D);
        w.wo[l] = Mat(D, H * hd);
    }
    const double kappa = p.subspace_scale, sqrt_hd = std::sqrt((double)hd);

    // ---- Layer 1. Every embedding row has |x|^2 = 2 kCode, so its RMSNorm divides by exactly rms1.
    const double rms1 = std::sqrt(2.0 * kCode / D), const_n = std::sqrt((double)kCode) / rms1;
    for (int g = 0; g < KV; g++)  // every KV head: the same key and value (the query heads of each group read it)
        for (int f = 0; f < p.pos_pairs; f++) w.wk[0].at(g * hd + 2 * f, kConst) = 1.0 / const_n;  // k = (1, 0) per pair
    for (int m = 1; m <= n; m++) {
        // q = (cos m theta, -sin m theta): after RoPE at i and j the pair's score is cos((i - j - m) theta),
        // largest where j = i - m on every pair at once.
        const int h = m - 1;
        for (int f = 0; f < p.pos_pairs; f++) {
            const double a = p.pos_sharpness * sqrt_hd / const_n;
            w.wq[0].at(h * hd + 2 * f, kConst) = a * std::cos(m * theta[f]);
            w.wq[0].at(h * hd + 2 * f + 1, kConst) = -a * std::sin(m * theta[f]);
        }
        for (int r = 0; r < cdim; r++)
            for (int i = 0; i < kCode; i++) {
                if (m < n) w.wo[0].at(kCtx + r, h * hd + i) += kappa * proj[m].at(r, i);
                w.wo[0].at(kHist + r, h * hd + i) += kappa * proj[m - 1].at(r, i);
            }
    }
    for (int g = 0; g < KV; g++)
        for (int i = 0; i < kCode; i++) w.wv[0].at(g * hd + i, i) = rms1;  // value = the attended byte's code

    // Calibration sample: 300 bytes of the corpus (from byte 1000 when it is long enough).
    const size_t cal_len = std::min<size_t>({300, corpus.size(), (size_t)p.context});
    const size_t cal_at = corpus.size() >= 1000 + cal_len ? 1000 : 0;
    std::vector<int> sample(corpus.begin() + cal_at, corpus.begin() + cal_at + cal_len);
    const double rms2 = mean_residual_rms(w, theta, sample, 1);

    // ---- Layer 2, head 0: q = c_0(t_i) + context = sum_{m<n} P_m g(t_{i-m}),
    // k = history = sum_{m<n} P_m g(t_{j-1-m}), on the lowest-frequency pairs.
    const double s_match = p.match_sharpness * sqrt_hd;
    for (int r = 0; r < cdim; r++) {
        const int d = 2 * (P - p.match_pairs) + r;
        for (int i = 0; i < kCode; i++) w.wq[1].at(d, i) = s_match * rms2 * proj[0].at(r, i);
        w.wq[1].at(d, kCtx + r) = s_match * rms2 / kappa;
        w.wk[1].at(d, kHist + r) = rms2 / kappa;
    }
    for (int i = 0; i < kCode; i++) {
        w.wv[1].at(i, i) = rms2;        // value: the code of the byte at the key
        w.wo[1].at(kAns + i, i) = kappa;  // -> answer subspace
    }
    // ---- Layer 2, KV head 1 (kv_heads 2): a local head. Its query heads H/2 + j attend to the byte
    // j + 1 positions back as layer 1's heads do (constant key, phase offset on the highest-frequency
    // pairs); the first writes the previous byte's code into the previous-byte subspace, which the
    // classifier reads as a skip-bigram (the others write nothing, as layer 2's other matching-group
    // heads). It needs its last H/2 + 1 tokens; the matching head needs them all.
    const int local_q = H / 2;
    if (KV == 2) {
        const double const2 = std::sqrt((double)kCode) / rms2;  // the constant channel after layer 2's RMSNorm
        for (int f = 0; f < p.pos_pairs; f++) {
            const double a = p.pos_sharpness * sqrt_hd / const2;
            w.wk[1].at(hd + 2 * f, kConst) = 1.0 / const2;
            for (int j = 0; local_q + j < H; j++) {
                w.wq[1].at((local_q + j) * hd + 2 * f, kConst) = a * std::cos((j + 1) * theta[f]);
                w.wq[1].at((local_q + j) * hd + 2 * f + 1, kConst) = -a * std::sin((j + 1) * theta[f]);
            }
        }
        for (int i = 0; i < kCode; i++) {
            w.wv[1].at(hd + i, i) = rms2;
            w.wo[1].at(kPrev + i, local_q * hd + i) = kappa;
        }
    }
    const double rms_final = mean_residual_rms(w, theta, sample, 2);

    // ---- Classifier: bigram log-probabilities (add-one counts) from the current byte's code, least
    // squares over the 256 codes, plus the copy read from the answer subspace (and with two KV heads
    // the skip-bigram read from the previous-byte subspace, fitted the same way).
    // logp[a][b] = log P(next = b | the byte `gap` positions back = a), add-one counts.
    auto skip_logp = [&](size_t gap) {
        Mat logp(kVocab, kVocab);
        std::vector<double> cnt((size_t)kVocab * kVocab, 1.0);
        for (size_t i = 0; i + gap < corpus.size(); i++) cnt[(size_t)corpus[i] * kVocab + corpus[i + gap]] += 1.0;
        for (int a = 0; a < kVocab; a++) {
            double z = 0;
            for (int b = 0; b < kVocab; b++) z += cnt[(size_t)a * kVocab + b];
            for (int b = 0; b < kVocab; b++) logp.at(a, b) = std::log(cnt[(size_t)a * kVocab + b] / z);
        }
        return logp;
    };
    Mat bigram, skip;  // [kCode][256]: g(a) . bigram[:, b] ~ logp[a][b]
    if (!least_squares(G, skip_logp(1), &bigram) || (KV == 2 && !least_squares(G, skip_logp(2), &skip)))
        return bad("the byte codes are degenerate (least squares failed)");
    w.cls = Mat(kVocab, D);
    for (int b = 0; b < kVocab; b++)
        for (int i = 0; i < kCode; i++) {
            w.cls.at(b, i) = p.bigram_gain * rms_final * bigram.at(i, b);
            w.cls.at(b, kAns + i) = p.copy_gain * rms_final * G.at(b, i) / kappa;
            if (KV == 2) w.cls.at(b, kPrev + i) = p.local_gain * rms_final * skip.at(i, b) / kappa;
        }

    // ---- Write: header, then the tensors in the format's order.
    std::FILE *f = std::fopen(out_path.c_str(), "wb");
    if (!f) return bad("cannot write '" + out_path + "': " + std::strerror(errno));
    const int32_t hdr[7] = {D, kHidden, 2, H, KV, -kVocab, p.context};
    bool ok = std::fwrite(hdr, sizeof hdr, 1, f) == 1;
    auto put = [&](const std::vector<double> &v) { ok = ok && write_floats(f, v); };
    auto put_layers = [&](const Mat *m) {
        put(m[0].v);
        put(m[1].v);
    };
    const std::vector<double> ones2((size_t)2 * D, 1.0), ffn((size_t)2 * kHidden * D, 0.0), ones1(D, 1.0);
    put(w.emb.v);
    put(ones2);  // rms_att
    put_layers(w.wq);
    put_layers(w.wk);
    put_layers(w.wv);
    put_layers(w.wo);
    put(ones2);  // rms_ffn
    put(ffn);    // w1, w2, w3: zero
    put(ffn);
    put(ffn);
    put(ones1);  // rms_final
    std::vector<double> table((size_t)p.context * P);
    for (int t = 0; t < p.context; t++)
        for (int i = 0; i < P; i++) table[(size_t)t * P + i] = std::cos(t * theta[i]);
    put(table);
    for (int t = 0; t < p.context; t++)
        for (int i = 0; i < P; i++) table[(size_t)t * P + i] = std::sin(t * theta[i]);
    put(table);
    put(w.cls.v);
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) return bad("write error on '" + out_path + "'");
    if (summary) {
        char b[300];
        std::snprintf(b, sizeof b,
                      "dim %d, %d heads x %d, %d KV head%s, 2 layers, context %d, order %d, matching dims %d; "
                      "bigram from %zu bytes; rms at layer 2 %.4f, final %.4f",
                      D, H, hd, KV, KV == 1 ? "" : "s", p.context, n, cdim, corpus.size(), rms2, rms_final);
        *summary = b;
    }
    return true;
}

}  // namespace kvh
