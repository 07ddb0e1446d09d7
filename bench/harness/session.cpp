#include "session.h"

#include "gguf.h"
#include "spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kvh {

namespace {

// Dot product with 8 independent accumulators combined in a fixed tree: fast under -O2
// auto-vectorisation and bit-reproducible (no dependence on threads or data layout).
inline float dot(const float *a, const float *b, int n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

// out[t][o] = W[o] . x[t]  for t < n, o < out_dim; W is [out_dim][in_dim] (llama2.c layout).
// Every output is bit for bit dot(W[o], x[t]): the tiled kernels below keep dot()'s eight lane
// sums (one 8-float vector, multiply then add: the harness is compiled with -ffp-contract=off so
// no FMA merges them), its reduction tree and its tail. Tokens go in blocks of about 256 KiB of x
// (L2-resident while the rows of W pass over them); R rows x T tokens share each load.
// `rows` (nrows of them, ascending) lists the rows of W that hold a nonzero weight; the others give
// +0 for finite x (every product +-0, their sum +0), written without reading W. rows == nullptr:
// every row.
void matmul_plain(float *out, const float *x, const float *W, int n, int in_dim, int out_dim, const int32_t *rows,
                  int nrows) {
    for (int j = 0; j < nrows; j++) {
        const int o = rows ? rows[j] : j;
        const float *w = W + (size_t)o * in_dim;
        for (int t = 0; t < n; t++) out[(size_t)t * out_dim + o] = dot(w, x + (size_t)t * in_dim, in_dim);
    }
}

#if defined(__x86_64__) || defined(__i386__)
typedef float v8f __attribute__((vector_size(32)));

template <int R, int T>
inline __attribute__((always_inline)) void matmul_tiled(float *out, const float *x, const float *W, int n, int in,
                                                        int od, const int32_t *rows, int nrows) {
    const int n8 = in / 8 * 8;
    const int tb = std::max(T, (int)((256u << 10) / (sizeof(float) * (size_t)std::max(in, 1)))) / T * T;
    auto row = [rows](int j) { return rows ? rows[j] : j; };
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = std::min(n, t0 + tb);
        int j = 0;
        for (; j + R <= nrows; j += R) {
            const float *w[R];
            int o[R];
            for (int r = 0; r < R; r++) w[r] = W + (size_t)(o[r] = row(j + r)) * in;
            int t = t0;
            for (; t + T <= t1; t += T) {
                const float *xt = x + (size_t)t * in;
                v8f acc[R][T];
                for (int r = 0; r < R; r++)
                    for (int k = 0; k < T; k++) acc[r][k] = v8f{};
                for (int i = 0; i < n8; i += 8) {
                    v8f u[R];
                    for (int r = 0; r < R; r++) __builtin_memcpy(&u[r], w[r] + i, sizeof(v8f));
                    for (int k = 0; k < T; k++) {
                        v8f y;
                        __builtin_memcpy(&y, xt + (size_t)k * in + i, sizeof y);
                        for (int r = 0; r < R; r++) acc[r][k] += u[r] * y;
                    }
                }
                for (int r = 0; r < R; r++)
                    for (int k = 0; k < T; k++) {
                        float s[8];
                        __builtin_memcpy(s, &acc[r][k], sizeof s);
                        float v = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
                        const float *xk = xt + (size_t)k * in;
                        for (int i = n8; i < in; i++) v += w[r][i] * xk[i];
                        out[(size_t)(t + k) * od + o[r]] = v;
                    }
            }
            for (; t < t1; t++)
                for (int r = 0; r < R; r++) out[(size_t)t * od + o[r]] = dot(w[r], x + (size_t)t * in, in);
        }
        for (; j < nrows; j++) {
            const int o = row(j);
            for (int t = t0; t < t1; t++) out[(size_t)t * od + o] = dot(W + (size_t)o * in, x + (size_t)t * in, in);
        }
    }
}

__attribute__((target("avx2"))) void matmul_avx2(float *out, const float *x, const float *W, int n, int in, int od,
                                                  const int32_t *rows, int nrows) {
    matmul_tiled<2, 4>(out, x, W, n, in, od, rows, nrows);  // 8 accumulators + 2 rows + 1 token of 16 registers
}
__attribute__((target("avx512f,avx512vl"))) void matmul_avx512(float *out, const float *x, const float *W, int n, int in,
                                                               int od, const int32_t *rows, int nrows) {
    matmul_tiled<4, 4>(out, x, W, n, in, od, rows, nrows);  // 16 accumulators of 32 registers
}

using MatmulFn = void (*)(float *, const float *, const float *, int, int, int, const int32_t *, int);
MatmulFn pick_matmul() {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return matmul_avx512;
    if (__builtin_cpu_supports("avx2")) return matmul_avx2;
    return matmul_plain;
}
const MatmulFn matmul_pick = pick_matmul();
#else
const auto matmul_pick = matmul_plain;
#endif

// out = x W^T over every row (live == nullptr or empty: all rows hold weights), or over the rows
// `live` lists, the others set to +0 (Checkpoint::live_rows: a constructed model's zero rows).
void matmul(float *out, const float *x, const float *W, int n, int in, int od, const std::vector<int32_t> *live = nullptr) {
    if (!live || live->empty()) return matmul_pick(out, x, W, n, in, od, nullptr, od);
    if ((int)live->size() < od) std::memset(out, 0, sizeof(float) * (size_t)n * (size_t)od);
    matmul_pick(out, x, W, n, in, od, live->data(), (int)live->size());
}

void rmsnorm(float *o, const float *x, const float *w, int n, int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *ot = o + (size_t)t * dim;
        float ss = dot(xt, xt, dim) / (float)dim + eps;
        float inv = 1.0f / std::sqrt(ss);
        for (int i = 0; i < dim; i++) ot[i] = w[i] * (xt[i] * inv);
    }
}

// The library's message already starts with the status ("KVP_ERR_FULL: ..."): add only where.
std::string kvp_error(const char *fn, uint32_t layer, kvp_status st, const kvp_cache *c) {
    const char *d = kvp_last_error(c);
    return std::string(fn) + " (layer " + std::to_string(layer) + "): " + (d && *d ? d : kvp_status_str(st));
}

}  // namespace

kvp_model model_geometry(const ModelConfig &c) {
    kvp_model m;
    std::memset(&m, 0, sizeof m);
    m.n_layers = (uint32_t)c.n_layers;
    m.n_q_heads = (uint32_t)c.n_heads;
    m.n_kv_heads = (uint32_t)c.n_kv_heads;
    m.head_dim = (uint32_t)c.head_dim();
    m.rope = c.rope;  // llama2.c (and llama GGUFs) rotate interleaved pairs (2i, 2i+1); qwen: NeoX
    m.rope_dim = (uint32_t)c.rope_dim;  // 0: whole head
    m.rope_theta = c.rope_theta;
    return m;
}

bool parse_policy(const ModelConfig &mc, const std::string &spec, kvp_config *cfg, std::string *err) {
    std::string resolved, e;
    if (!resolve_spec(mc, spec, 0, &resolved, cfg, &e)) {
        *err = "bad policy spec '" + spec + "': " + e;
        return false;
    }
    return true;
}

Session::~Session() {
    kvp_destroy(cache_);
    std::free(arena_);
}

namespace {
const std::vector<float> *g_given_stats = nullptr;  // Session::set_given_query_stats

// kvp_query_stats_set's units of a head: RoPE pair i = channels (a, b), then one per channel.
struct StatUnits {
    uint32_t pairs, n;
    kvp_rope_style style;
    uint32_t hd;
    void at(uint32_t u, uint32_t *a, int *b) const {
        if (u < pairs) {
            *a = style == KVP_ROPE_GPTJ ? 2 * u : u;
            *b = (int)(style == KVP_ROPE_GPTJ ? 2 * u + 1 : u + pairs);
        } else {
            *a = 2 * pairs + (u - pairs);
            *b = -1;
        }
    }
};
StatUnits stat_units(const kvp_model &m) {
    StatUnits s;
    s.style = m.rope;
    s.hd = m.head_dim;
    s.pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    s.n = s.pairs + (m.head_dim - 2 * s.pairs);
    return s;
}
}  // namespace

void Session::set_given_query_stats(const std::vector<float> *stats) { g_given_stats = stats; }

namespace {
const std::vector<uint8_t> *g_duo_roles = nullptr;  // Session::set_duo_roles
}
void Session::set_duo_roles(const std::vector<uint8_t> *roles) { g_duo_roles = roles; }

bool calibrate_duo_mass(const Checkpoint &ck, const std::vector<std::vector<int32_t>> &prompts,
                        const std::vector<std::pair<int, int>> &needle, const std::vector<int> &question_at,
                        std::vector<double> *mass, std::string *err) {
    size_t longest = 0;
    for (const auto &p : prompts) longest = std::max(longest, p.size());
    const std::vector<uint8_t> *saved = g_duo_roles;
    g_duo_roles = nullptr;  // the calibration runs full KV
    Session s;
    const bool ok = s.init(ck, "policy=full capacity=" + std::to_string(longest + 16), err);
    g_duo_roles = saved;
    if (!ok) return false;
    const kvp_config cfg = s.config();
    const kvp_model &m = cfg.model;
    const uint32_t L = m.n_layers, H = m.n_kv_heads, G = m.n_q_heads / m.n_kv_heads, hd = m.head_dim;
    const size_t bytes = kvp_arena_size(&cfg);
    void *arena = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!arena) {
        *err = "cannot allocate the probe cache's arena";
        return false;
    }
    kvp_cache *probe = nullptr;
    char e[512] = {0};
    const std::vector<double> &rf = ck.cfg.rope_freqs;
    if (kvp_create_rope(&cfg, rf.empty() ? nullptr : rf.data(), (uint32_t)rf.size(), arena, bytes, &probe, e, sizeof e) != KVP_OK) {
        std::free(arena);
        *err = std::string("duo-calibrate probe: ") + e;
        return false;
    }
    std::vector<double> sum((size_t)L * H, 0.0);
    uint64_t rows_counted = 0;
    std::vector<int> seen(L, 0);
    std::vector<float> vind, out;
    int lo = 0, hi = 0, qa = 0;
    bool failed = false;
    s.set_kv_observer([&](int l, const float *q, const float *k, int n) {
        if (failed) return;
        vind.assign((size_t)n * H * hd, 0.0f);
        for (int t = 0; t < n; t++) {
            const int idx = seen[l] + t;
            if (idx >= lo && idx < hi)
                for (uint32_t h = 0; h < H; h++) vind[((size_t)t * H + h) * hd] = 1.0f;
        }
        out.assign((size_t)n * m.n_q_heads * hd, 0.0f);
        if (kvp_prefill(probe, (uint32_t)l, (uint32_t)n, nullptr, q, k, vind.data(), out.data(), nullptr) != KVP_OK) {
            *err = std::string("duo-calibrate probe: ") + kvp_last_error(probe);
            failed = true;
            return;
        }
        for (int t = 0; t < n; t++) {
            if (seen[l] + t < qa) continue;
            if (l == 0) rows_counted++;
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t g = 0; g < G; g++) sum[(size_t)l * H + h] += out[((size_t)t * m.n_q_heads + h * G + g) * hd];
        }
        seen[l] += n;
    });
    std::vector<float> logits((size_t)ck.cfg.vocab);
    for (size_t i = 0; i < prompts.size() && !failed; i++) {
        lo = needle[i].first;
        hi = needle[i].second;
        qa = question_at[i];
        std::fill(seen.begin(), seen.end(), 0);
        if (!s.reset(err) || kvp_reset(probe) != KVP_OK ||
            !s.prefill(prompts[i].data(), (int)prompts[i].size(), logits.data(), false, err))
            failed = true;
    }
    kvp_destroy(probe);
    std::free(arena);
    if (failed) return false;
    mass->assign(sum.size(), 0.0);
    for (size_t i = 0; i < sum.size(); i++) (*mass)[i] = sum[i] / ((double)G * (double)(rows_counted ? rows_counted : 1));
    return true;
}

std::vector<uint8_t> duo_roles_from_mass(const std::vector<double> &mass, double fraction) {
    std::vector<size_t> order(mass.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return mass[a] < mass[b]; });
    const size_t n = (size_t)std::llround(fraction * (double)mass.size());
    std::vector<uint8_t> roles(mass.size(), KVP_HEAD_RETRIEVAL);
    for (size_t i = 0; i < n && i < order.size(); i++) roles[order[i]] = KVP_HEAD_STREAMING;
    return roles;
}

std::string duo_roles_file(const std::vector<uint8_t> &roles, const std::vector<double> &mass, uint32_t L, uint32_t H,
                           const std::string &comment) {
    std::string o = "# kvprune duo-calibrate: DuoAttention role table (0 retrieval, 1 streaming) and the\n"
                    "# attention mass on the needle per (layer, KV head); " + comment + "\n";
    o += "duo_roles " + std::to_string(L) + " " + std::to_string(H) + "\n";
    char line[96];
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++) {
            std::snprintf(line, sizeof line, "%u %u %u %.6f\n", l, h, (unsigned)roles[(size_t)l * H + h],
                          mass.empty() ? 0.0 : mass[(size_t)l * H + h]);
            o += line;
        }
    return o;
}

bool parse_duo_roles(const std::string &text, const ModelConfig &mc, std::vector<uint8_t> *roles, std::string *err) {
    const uint32_t L = (uint32_t)mc.n_layers, H = (uint32_t)mc.n_kv_heads;
    roles->assign((size_t)L * H, KVP_HEAD_RETRIEVAL);
    std::vector<bool> got((size_t)L * H, false);
    bool header = false;
    size_t pos = 0, lineno = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string ln = text.substr(pos, end - pos);
        pos = end + 1;
        lineno++;
        if (ln.empty() || ln[0] == '#') continue;
        if (!header) {
            unsigned fl = 0, fh = 0;
            char tail = 0;
            if (std::sscanf(ln.c_str(), "duo_roles %u %u %c", &fl, &fh, &tail) != 2) {
                *err = "line " + std::to_string(lineno) + ": expected 'duo_roles <n_layers> <n_kv_heads>'";
                return false;
            }
            if (fl != L || fh != H) {
                *err = "the table is for " + std::to_string(fl) + " layers x " + std::to_string(fh) + " KV heads; the model has " +
                       std::to_string(L) + " x " + std::to_string(H);
                return false;
            }
            header = true;
            continue;
        }
        unsigned l = 0, h = 0, r = 0;
        double ms = 0;
        if (std::sscanf(ln.c_str(), "%u %u %u %lf", &l, &h, &r, &ms) < 3 || l >= L || h >= H || r > 1) {
            *err = "line " + std::to_string(lineno) + ": expected '<layer> <kv_head> <role 0|1> [mass]' within the model";
            return false;
        }
        if (got[(size_t)l * H + h]) {
            *err = "line " + std::to_string(lineno) + ": layer " + std::to_string(l) + " KV head " + std::to_string(h) + " given twice";
            return false;
        }
        got[(size_t)l * H + h] = true;
        (*roles)[(size_t)l * H + h] = (uint8_t)r;
    }
    if (!header) {
        *err = "no 'duo_roles <n_layers> <n_kv_heads>' line";
        return false;
    }
    for (size_t i = 0; i < got.size(); i++)
        if (!got[i]) {
            *err = "layer " + std::to_string(i / H) + " KV head " + std::to_string(i % H) + " has no role";
            return false;
        }
    return true;
}

bool calibrate_query_stats(const Checkpoint &ck, const std::vector<int32_t> &tokens, std::vector<float> *stats,
                           uint32_t *units, std::string *err) {
    Session s;
    if (!s.init(ck, "policy=full capacity=" + std::to_string(tokens.size() + 16), err)) return false;
    const kvp_model &m = s.config().model;
    const StatUnits u = stat_units(m);
    const size_t per = (size_t)m.head_dim + u.n, L = m.n_layers, H = m.n_q_heads;
    std::vector<double> sum(L * H * per, 0.0);
    int64_t rows = 0;
    s.set_query_observer([&](int l, const float *q, int n) {
        if (l == 0) rows += n;
        for (int t = 0; t < n; t++)
            for (size_t h = 0; h < H; h++) {
                const float *r = q + ((size_t)t * H + h) * m.head_dim;
                double *o = &sum[((size_t)l * H + h) * per];
                for (uint32_t i = 0; i < m.head_dim; i++) o[i] += r[i];
                for (uint32_t i = 0; i < u.n; i++) {
                    uint32_t a;
                    int b;
                    u.at(i, &a, &b);
                    o[m.head_dim + i] += b >= 0 ? std::sqrt((double)r[a] * r[a] + (double)r[b] * r[b]) : std::fabs((double)r[a]);
                }
            }
    });
    std::vector<float> logits((size_t)ck.cfg.vocab);
    if (!s.prefill(tokens.data(), (int)tokens.size(), logits.data(), false, err)) return false;
    stats->assign(sum.size(), 0.0f);
    for (size_t i = 0; i < sum.size(); i++) (*stats)[i] = (float)(sum[i] / (double)(rows ? rows : 1));
    *units = u.n;
    return true;
}

bool Session::init(const Checkpoint &ck, const std::string &spec, std::string *err) {
    kvp_destroy(cache_);
    cache_ = nullptr;
    std::free(arena_);
    arena_ = nullptr;
    ck_ = &ck;
    fed_ = 0;
    if (const char *e = std::getenv("KVPRUNE_THREADS")) set_threads(std::atoi(e));
    sel_layer_ = -1;
    if (!parse_policy(ck.cfg, spec, &cfg_, err)) return false;
    // Scaled RoPE (GGUF): the model's attention factor unless the spec sets rope_attn_factor itself.
    if (ck.cfg.rope_attn_factor != 1.0f && spec.find("rope_attn_factor") == std::string::npos)
        cfg_.rope_attn_factor = ck.cfg.rope_attn_factor;
    const std::vector<uint8_t> *roles = g_duo_roles;  // --duo-roles (kvp_create_heads)
    if (roles && roles->size() != (size_t)cfg_.model.n_layers * cfg_.model.n_kv_heads) {
        *err = "--duo-roles table does not fit this model";
        return false;
    }
    const uint8_t *rt = roles ? roles->data() : nullptr;
    const uint32_t nr = roles ? (uint32_t)roles->size() : 0;
    size_t n = kvp_arena_size_heads(&cfg_, rt, nr);
    if (n == 0) {  // the library's message: create fails the same checks before it allocates
        char e0[512] = {0};
        kvp_cache *none = nullptr;
        const std::vector<double> &rf0 = ck.cfg.rope_freqs;
        kvp_create_heads(&cfg_, rf0.empty() ? nullptr : rf0.data(), (uint32_t)rf0.size(), rt, nr, nullptr, 0, &none, e0, sizeof e0);
        if (none) kvp_destroy(none);
        *err = e0[0] ? std::string("kvp_create: ") + e0 : "kvp_arena_size returned 0 for '" + spec + "'";
        return false;
    }
    const size_t al = n >= (size_t(2) << 20) ? size_t(2) << 20 : 64;  // huge pages from 2 MiB on
    arena_len_ = (n + al - 1) / al * al;
    arena_ = std::aligned_alloc(al, arena_len_);
    if (!arena_) {
        *err = "cannot allocate an arena of " + std::to_string(arena_len_) + " bytes";
        return false;
    }
    if (al > 64) kvp_arena_advise(arena_, arena_len_);  // before kvp_create writes it
    char e[512] = {0};
    const std::vector<double> &rf = ck.cfg.rope_freqs;  // empty: theta's frequencies
    kvp_status st = kvp_create_heads(&cfg_, rf.empty() ? nullptr : rf.data(), (uint32_t)rf.size(), rt, nr, arena_,
                                     arena_len_, &cache_, e, sizeof e);
    if (st != KVP_OK) {
        *err = std::string("kvp_create: ") + e;
        cache_ = nullptr;
        return false;
    }
    ensure_rows(1);
    if (g_given_stats && cfg_.policy == KVP_POLICY_TRIATTENTION && cfg_.tri_stats == KVP_TRI_STATS_GIVEN) {
        const kvp_model &m = cfg_.model;
        const uint32_t nu = stat_units(m).n;
        const size_t per = (size_t)m.head_dim + nu;
        if (g_given_stats->size() != (size_t)m.n_layers * m.n_q_heads * per) {
            *err = "--tri-calibrate statistics do not fit this model";
            return false;
        }
        for (uint32_t l = 0; l < m.n_layers; l++)
            for (uint32_t h = 0; h < m.n_q_heads; h++) {
                const float *p = g_given_stats->data() + ((size_t)l * m.n_q_heads + h) * per;
                if (kvp_query_stats_set(cache_, l, h, p, p + m.head_dim, nu) != KVP_OK) {
                    *err = std::string("kvp_query_stats_set: ") + kvp_last_error(cache_);
                    return false;
                }
            }
    }
    return true;
}

bool Session::reset(std::string *err) {
    kvp_status st = kvp_reset(cache_);
    if (st != KVP_OK) {
        *err = std::string("kvp_reset: ") + kvp_last_error(cache_);
        return false;
    }
    fed_ = 0;
    sel_layer_ = -1;
    return true;
}

void Session::ensure_rows(int n) {
    if (n <= rows_) return;
    const ModelConfig &c = ck_->cfg;
    rows_ = n;
    x_.assign((size_t)n * c.dim, 0.f);
    xb_.assign((size_t)n * c.dim, 0.f);
    xb2_.assign((size_t)n * c.dim, 0.f);
    q_.assign((size_t)n * c.q_dim(), 0.f);
    att_.assign((size_t)n * c.q_dim(), 0.f);
    k_.assign((size_t)n * c.kv_dim(), 0.f);
    v_.assign((size_t)n * c.kv_dim(), 0.f);
    hb_.assign((size_t)n * c.hidden_dim, 0.f);
    hb2_.assign((size_t)n * c.hidden_dim, 0.f);
    pos_.assign((size_t)n, 0);
    sel_idx_.assign((size_t)n, 0);
}

bool Session::snapshot(std::vector<char> *buf, std::string *err) const {
    const size_t head = sizeof fed_ + sizeof sel_layer_;
    const size_t n = kvp_state_size(cache_);
    buf->resize(head + n);
    std::memcpy(buf->data(), &fed_, sizeof fed_);
    std::memcpy(buf->data() + sizeof fed_, &sel_layer_, sizeof sel_layer_);
    size_t written = 0;
    const kvp_status st = kvp_state_save(cache_, buf->data() + head, n, &written);
    if (st != KVP_OK || written != n) {
        *err = std::string("kvp_state_save: ") + kvp_last_error(cache_);
        return false;
    }
    return true;
}

bool Session::end_prompt(std::string *err) {
    if (kvp_prompt_end(cache_) == KVP_OK) return true;
    *err = std::string("kvp_prompt_end: ") + kvp_last_error(cache_);
    return false;
}

bool Session::restore(const std::vector<char> &buf, std::string *err) {
    const size_t head = sizeof fed_ + sizeof sel_layer_;
    if (buf.size() < head) return *err = "restore: not a snapshot", false;
    if (kvp_state_load(cache_, buf.data() + head, buf.size() - head) != KVP_OK) {
        *err = std::string("kvp_state_load: ") + kvp_last_error(cache_);
        return false;
    }
    std::memcpy(&fed_, buf.data(), sizeof fed_);
    std::memcpy(&sel_layer_, buf.data() + sizeof fed_, sizeof sel_layer_);
    return true;
}

kvp_stats Session::stats() const {
    kvp_stats s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    if (cache_) kvp_get_stats(cache_, &s);
    return s;
}

uint32_t Session::max_layer_capacity() const {
    uint32_t best = 0;
    for (int l = 0; l < ck_->cfg.n_layers; l++) best = std::max(best, kvp_layer_capacity(cache_, (uint32_t)l));
    return best;
}

// Largest chunk every layer can take in turn (the library knows its capacities and, with a
// shared pool, what the earlier layers of the chunk take first).
std::vector<int> Session::lazy_layers() const {
    std::vector<int> out;
    for (int l = 0; l < ck_->cfg.n_layers; l++) {
        kvp_layer_stats s;
        s.struct_size = sizeof s;
        if (kvp_get_layer_stats(cache_, (uint32_t)l, &s) == KVP_OK && s.lazy == 1) out.push_back(l);
    }
    return out;
}

int Session::prefill_room() const { return (int)std::min<uint32_t>(kvp_prefill_room(cache_), INT32_MAX); }

bool Session::prefill(const int32_t *tokens, int n, float *logits, bool all_logits, std::string *err) {
    if (n <= 0) {
        *err = "prefill of 0 tokens";
        return false;
    }
    const int V = ck_->cfg.vocab;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            *err = "token id " + std::to_string(tokens[i]) + " out of range for vocab " + std::to_string(V);
            return false;
        }
    }
    int done = 0;
    while (done < n) {
        // At least 1: a full layer then answers KVP_ERR_FULL with its message.
        const int chunk = std::max(1, std::min(n - done, prefill_room()));
        const bool last = done + chunk == n;
        float *lg = all_logits ? logits + (size_t)done * V : (last ? logits : nullptr);
        ensure_rows(chunk);
        if (!run_chunk(tokens + done, chunk, false, lg, all_logits, err)) return false;
        max_chunk_used_ = std::max(max_chunk_used_, chunk);
        done += chunk;
    }
    return true;
}

bool Session::decode(int32_t token, float *logits, std::string *err) {
    if (token < 0 || token >= ck_->cfg.vocab) {
        *err = "token id " + std::to_string(token) + " out of range for vocab " + std::to_string(ck_->cfg.vocab);
        return false;
    }
    return run_chunk(&token, 1, true, logits, false, err);
}

bool Session::run_chunk(const int32_t *tokens, int n, bool use_decode, float *logits, bool all_logits,
                        std::string *err) {
    const Checkpoint &w = *ck_;
    const ModelConfig &c = w.cfg;
    const int D = c.dim, QD = c.q_dim(), KVD = c.kv_dim(), HD = c.hidden_dim, hd = c.head_dim();
    const float eps = c.norm_eps;
    const int L = c.n_layers;
    // Product with matrix k of layer l: the mapped quantized rows when the file has them, else f32.
    // (W is the f32 base of kind k; null when the file's matrices of that kind are mapped.)
    auto mm = [&](float *out, const float *x, const float *W, int k, int l, int rows, int in, int outd) {
        if (!w.qmat.empty() && w.qmat[(size_t)k * L + l]) matmul_q(out, x, w.qmat[(size_t)k * L + l], rows, in, outd, threads_);
        else matmul(out, x, W + (size_t)l * outd * in, rows, in, outd,
                    w.live_rows.empty() ? nullptr : &w.live_rows[(size_t)k * L + l]);
    };
    for (int t = 0; t < n; t++) {
        if (w.qemb) dequantize(w.qemb.type, w.qemb.data + (uint64_t)tokens[t] * w.qemb.row_bytes, &x_[(size_t)t * D], (uint64_t)D);
        else std::memcpy(&x_[(size_t)t * D], w.tok_emb + (size_t)tokens[t] * D, D * sizeof(float));
    }
    int cur = n;                  // rows still flowing (ASL may select a subset)
    bool explicit_pos = false;    // after an ASL selection, positions are passed explicitly
    bool last_row_is_last = true;
    for (int l = 0; l < c.n_layers; l++) {
        rmsnorm(xb_.data(), x_.data(), w.rms_att + (size_t)l * D, cur, D, eps);
        mm(q_.data(), xb_.data(), w.wq, 0, l, cur, D, QD);
        mm(k_.data(), xb_.data(), w.wk, 1, l, cur, D, KVD);
        mm(v_.data(), xb_.data(), w.wv, 2, l, cur, D, KVD);
        if (w.bq) {  // qwen2: q/k/v biases
            for (int t = 0; t < cur; t++) {
                for (int i = 0; i < QD; i++) q_[(size_t)t * QD + i] += w.bq[(size_t)l * QD + i];
                for (int i = 0; i < KVD; i++) k_[(size_t)t * KVD + i] += w.bk[(size_t)l * KVD + i];
                for (int i = 0; i < KVD; i++) v_[(size_t)t * KVD + i] += w.bv[(size_t)l * KVD + i];
            }
        }
        if (w.q_norm) {  // qwen3: RMSNorm of every q and k head before RoPE
            rmsnorm(q_.data(), q_.data(), w.q_norm + (size_t)l * hd, cur * c.n_heads, hd, eps);
            rmsnorm(k_.data(), k_.data(), w.k_norm + (size_t)l * hd, cur * c.n_kv_heads, hd, eps);
        }
        if (q_obs_) q_obs_(l, q_.data(), cur);
        if (kv_obs_) kv_obs_(l, q_.data(), k_.data(), cur);
        kvp_status st;
        if (use_decode) {
            st = kvp_decode(cache_, (uint32_t)l, q_.data(), k_.data(), v_.data(), att_.data());
        } else {
            kvp_selection sel;
            std::memset(&sel, 0, sizeof sel);
            sel.struct_size = sizeof sel;
            sel.capacity = (uint32_t)cur;
            sel.indices = sel_idx_.data();
            st = kvp_prefill(cache_, (uint32_t)l, (uint32_t)cur, explicit_pos ? pos_.data() : nullptr,
                             q_.data(), k_.data(), v_.data(), att_.data(), &sel);
            if (st == KVP_OK && sel.selected && sel.n > 0 && (int)sel.n <= cur) {
                // ASL: later layers receive only the selected tokens, with their positions.
                if (!explicit_pos)
                    for (int t = 0; t < cur; t++) pos_[t] = (int32_t)(fed_ + t);
                int m = (int)sel.n;
                for (int r = 0; r < m; r++) {
                    int src = sel_idx_[r];
                    if (src < 0 || src >= cur || (r > 0 && src <= sel_idx_[r - 1])) {
                        *err = "kvp_prefill returned an invalid selection";
                        return false;
                    }
                    if (src != r) {
                        std::memmove(&x_[(size_t)r * D], &x_[(size_t)src * D], D * sizeof(float));
                        std::memmove(&att_[(size_t)r * QD], &att_[(size_t)src * QD], QD * sizeof(float));
                    }
                    pos_[r] = pos_[src];
                }
                last_row_is_last = last_row_is_last && sel_idx_[m - 1] == cur - 1;
                sel_layer_ = l;
                cur = m;
                explicit_pos = true;
            }
        }
        if (st != KVP_OK) {
            *err = kvp_error(use_decode ? "kvp_decode" : "kvp_prefill", (uint32_t)l, st, cache_);
            return false;
        }
        mm(xb2_.data(), att_.data(), w.wo, 3, l, cur, QD, D);
        for (size_t i = 0; i < (size_t)cur * D; i++) x_[i] += xb2_[i];
        rmsnorm(xb_.data(), x_.data(), w.rms_ffn + (size_t)l * D, cur, D, eps);
        mm(hb_.data(), xb_.data(), w.w1, 4, l, cur, D, HD);
        mm(hb2_.data(), xb_.data(), w.w3, 6, l, cur, D, HD);
        for (size_t i = 0; i < (size_t)cur * HD; i++) {
            float a = hb_[i];
            hb_[i] = a / (1.0f + std::exp(-a)) * hb2_[i];
        }
        mm(xb2_.data(), hb_.data(), w.w2, 5, l, cur, HD, D);
        for (size_t i = 0; i < (size_t)cur * D; i++) x_[i] += xb2_[i];
    }
    fed_ += n;
    if (logits) {
        if (cur != n && all_logits) {
            *err = "per-position logits are not available: the policy selected a subset of the prompt";
            return false;
        }
        if (!last_row_is_last) {
            *err = "the policy's selection dropped the last prompt token; no next-token prediction";
            return false;
        }
        int first = all_logits ? 0 : cur - 1;
        rmsnorm(xb_.data(), x_.data() + (size_t)first * D, w.rms_final, cur - first, D, eps);
        if (w.qcls) matmul_q(logits, xb_.data(), w.qcls, cur - first, D, c.vocab, threads_);
        else matmul(logits, xb_.data(), w.wcls, cur - first, D, c.vocab, &w.live_rows_cls);
    }
    return true;
}

}  // namespace kvh
