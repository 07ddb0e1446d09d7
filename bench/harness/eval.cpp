#include "eval.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "session.h"
#include "spec.h"

namespace kvh {

bool parse_tokens(const std::string &text, int vocab, std::vector<int32_t> *out, std::string *err) {
    out->clear();
    if (vocab == 256) {
        out->reserve(text.size());
        for (unsigned char ch : text) out->push_back((int32_t)ch);
        return true;
    }
    std::istringstream is(text);
    std::string w;
    while (is >> w) {
        char *end = nullptr;
        long v = std::strtol(w.c_str(), &end, 10);
        if (!end || *end != '\0' || v < 0 || v >= vocab) {
            *err = "token '" + w + "' is not an id in 0.." + std::to_string(vocab - 1) +
                   " (models with vocab != 256 take whitespace-separated token ids)";
            return false;
        }
        out->push_back((int32_t)v);
    }
    return true;
}

std::string strprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    const int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out(n > 0 ? (size_t)n : 0, '\0');
    if (n > 0) std::vsnprintf(&out[0], (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return out;
}

std::string library_version() {
    const uint32_t v = kvp_version();
    return std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 255) + "." + std::to_string(v & 255);
}

bool load_tokens(const std::string &path, int vocab, std::vector<int32_t> *out, std::string *err) {
    struct stat sb;
    if (stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode)) {  // a FIFO would block, a folder reads nothing
        *err = "text file '" + path + "': not a regular file (" + (S_ISDIR(sb.st_mode) ? "a directory" : "a FIFO, device or socket") + ")";
        return false;
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        *err = "text file '" + path + "': cannot open: " + std::strerror(errno);
        return false;
    }
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) {
        *err = "text file '" + path + "': read error";
        return false;
    }
    if (!parse_tokens(s, vocab, out, err)) {
        *err = "text file '" + path + "': " + *err;
        return false;
    }
    return true;
}

namespace {

// NLL of target under logits (log-sum-exp in double) and the argmax (first on ties).
double nll_of(const float *lg, int V, int target, int32_t *am) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    double m = lg[best], s = 0;
    for (int i = 0; i < V; i++) s += std::exp((double)lg[i] - m);
    *am = best;
    return m + std::log(s) - (double)lg[target];
}

bool check_range(const std::vector<int32_t> &tokens, int N, int P, std::string *err) {
    if (N < 2 || N > (int)tokens.size()) {
        *err = "--tokens " + std::to_string(N) + " must be in 2.." + std::to_string(tokens.size()) +
               " (the text has " + std::to_string(tokens.size()) + " tokens)";
        return false;
    }
    if (P < 1 || P >= N) {
        *err = "--prefill " + std::to_string(P) + " must be in 1.." + std::to_string(N - 1);
        return false;
    }
    return true;
}

}  // namespace

void json_str(std::string &o, const std::string &s, bool bytes) {
    o += '"';
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            o += '\\';
            o += (char)ch;
        } else if (ch < 0x20 || (bytes && ch >= 0x7f)) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", ch);
            o += b;
        } else {
            o += (char)ch;
        }
    }
    o += '"';
}

std::string json_num(double v, const char *f) {
    if (!std::isfinite(v)) return "null";
    return strprintf(f, v);
}

std::string csv_str(const std::string &s) {
    std::string p = "\"";
    for (char ch : s) p += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return p + "\"";
}


bool run_policy(const Checkpoint &ck, const std::string &spec, const std::vector<int32_t> &tokens, int N,
                int P, EvalResult *r, std::vector<int32_t> *argmax, std::string *err, const Progress &progress,
                size_t index) {
    if (!check_range(tokens, N, P, err)) return false;
    std::string resolved, e;
    kvp_config cfg;
    if (!resolve_spec(ck.cfg, spec, N, &resolved, &cfg, &e)) {
        *err = "bad policy spec '" + spec + "': " + e;
        return false;
    }
    Session s;
    if (!s.init(ck, resolved, err)) return false;
    const int V = ck.cfg.vocab;
    std::vector<float> logits((size_t)V);
    if (argmax) argmax->assign((size_t)(N - P), 0);
    double sum = 0;
    auto t0 = std::chrono::steady_clock::now();
    if (progress) progress(index, 0, N);
    if (!s.prefill(tokens.data(), P, logits.data(), false, err)) return false;
    r->prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    int32_t am;
    for (int t = P; t < N; t++) {
        sum += nll_of(logits.data(), V, tokens[t], &am);  // prediction of token t
        if (argmax) (*argmax)[t - P] = am;
        if (!s.decode(tokens[t], logits.data(), err)) {
            *err = "token " + std::to_string(t) + ": " + *err;
            return false;
        }
        if (progress && ((t + 1) % 32 == 0 || t + 1 == N)) progress(index, t + 1, N);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kvp_stats st = s.stats();
    r->policy = spec;
    r->spec = resolved;
    r->model = ck.path;
    r->prefill = P;
    r->capacity = s.max_layer_capacity();
    r->threads = s.config().threads;
    r->version = library_version();
    const double full_kv = 2.0 * sizeof(float) * (double)N * ck.cfg.n_layers * ck.cfg.kv_dim();
    r->kv_ratio = (double)st.live_bytes / full_kv;
    r->nll = sum / (N - P);
    r->ppl = std::exp(r->nll);
    r->agreement = 0;
    r->live_bytes = st.live_bytes;
    r->peak_live_bytes = st.peak_live_bytes;
    r->arena_bytes = st.arena_bytes;
    r->tokens = N;
    r->tok_per_s = secs > 0 ? N / secs : 0;
    r->lazy_layers = s.lazy_layers();
    r->selection_layer = s.selection_layer();
    r->n_layers = ck.cfg.n_layers;
    return true;
}

std::string layer_note(const EvalResult &r) {
    std::string out = strprintf("prefill %.2f ms", r.prefill_ms);
    if (r.spec.find("policy=simlayerkv") != std::string::npos) {
        out += strprintf("; lazy layers %zu/%d", r.lazy_layers.size(), r.n_layers);
        std::string list;
        for (int l : r.lazy_layers) list += (list.empty() ? "" : ",") + std::to_string(l);
        if (!list.empty()) out += " (" + list + ")";
    }
    if (r.spec.find("policy=asl") != std::string::npos)
        out += r.selection_layer >= 0 ? strprintf("; selection layer %d", r.selection_layer) : "; no selection layer";
    return out;
}

uint32_t random_lazy_mask(int n_layers, int count, uint64_t seed) {
    std::vector<int> idx((size_t)n_layers);
    for (int i = 0; i < n_layers; i++) idx[(size_t)i] = i;
    uint64_t st = seed;
    auto next = [&st]() {
        uint64_t z = (st += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    };
    uint32_t mask = 0;
    for (int i = 0; i < count && i < n_layers; i++) {
        const int j = i + (int)(next() % (uint64_t)(n_layers - i));
        std::swap(idx[(size_t)i], idx[(size_t)j]);
        if (idx[(size_t)i] < 32) mask |= 1u << idx[(size_t)i];
    }
    return mask;
}

std::string full_reference_spec(int N) {
    return "policy=full capacity=" + std::to_string(N) + " positions=original";
}

bool run_eval(const Checkpoint &ck, const std::vector<int32_t> &tokens, int N, int P,
              const std::vector<std::string> &specs, std::vector<EvalResult> *results, std::string *err,
              const Progress &progress) {
    results->clear();
    err->clear();
    if (!check_range(tokens, N, P, err)) return false;
    // Validate every spec before spending time on any run; an invalid one is reported and skipped.
    std::vector<kvp_config> cfgs(specs.size());
    std::vector<bool> ok(specs.size(), false);
    auto failed = [&](const std::string &spec, const std::string &m) {
        *err += (err->empty() ? "" : "\n") + ("policy '" + spec + "': " + m);
    };
    for (size_t i = 0; i < specs.size(); i++) {
        std::string resolved, e;
        ok[i] = resolve_spec(ck.cfg, specs[i], N, &resolved, &cfgs[i], &e);
        if (!ok[i]) failed(specs[i], "bad policy spec: " + e);
        const kvp_config &c = cfgs[i];
        const bool never_evicts = c.policy == KVP_POLICY_FULL ||
                                  (c.policy == KVP_POLICY_THINK && c.token_policy == KVP_POLICY_FULL) ||
                                  (c.policy == KVP_POLICY_STREAMING && c.compress_every == 0);
        Session s;
        if (ok[i] && never_evicts && s.init(ck, resolved, &e) && (int64_t)s.max_layer_capacity() < N) {
            // It would fail with KVP_ERR_FULL after max_layer_capacity tokens: say so before running.
            ok[i] = false;
            failed(specs[i], strprintf("KVP_ERR_FULL before running: this policy never evicts and its layers hold %u "
                                       "tokens, fewer than N = %d (raise capacity to at least %d, or choose a policy "
                                       "that evicts)",
                                       s.max_layer_capacity(), N, N));
        }
    }
    std::vector<std::vector<int32_t>> am(specs.size());
    std::vector<EvalResult> rows(specs.size());
    int ref = -1;
    for (size_t i = 0; i < specs.size(); i++) {
        if (!ok[i]) continue;
        std::string e;
        if (!run_policy(ck, specs[i], tokens, N, P, &rows[i], &am[i], &e, progress, i)) {
            ok[i] = false;
            failed(specs[i], e);
            continue;
        }
        const kvp_config &c = cfgs[i];
        if (ref < 0 && c.policy == KVP_POLICY_FULL &&
            (c.positions == KVP_POS_DEFAULT || c.positions == KVP_POS_ORIGINAL) && c.kv_dtype == KVP_DTYPE_F32)
            ref = (int)i;
    }
    bool any = false;
    for (bool b : ok) any = any || b;
    std::vector<int32_t> ref_am;
    bool have_ref = ref >= 0;
    if (have_ref) {
        ref_am = am[(size_t)ref];
    } else if (any) {
        EvalResult r;
        std::string spec = full_reference_spec(N), e;
        have_ref = run_policy(ck, spec, tokens, N, P, &r, &ref_am, &e, progress, specs.size());
        if (!have_ref) failed(spec, "full-KV reference (for agreement): " + e);
    }
    for (size_t i = 0; i < specs.size(); i++) {
        if (!ok[i]) continue;
        size_t agree = 0;
        for (size_t t = 0; have_ref && t < ref_am.size(); t++) agree += am[i][t] == ref_am[t];
        rows[i].agreement = have_ref ? (double)agree / (double)ref_am.size() : NAN;
        results->push_back(rows[i]);
    }
    return err->empty();
}

namespace {
bool is_reference(const kvp_config &c) {
    return c.policy == KVP_POLICY_FULL && (c.positions == KVP_POS_DEFAULT || c.positions == KVP_POS_ORIGINAL) &&
           c.kv_dtype == KVP_DTYPE_F32;
}
}  // namespace

size_t eval_runs(const Checkpoint &ck, int N, const std::vector<std::string> &specs) {
    for (const std::string &sp : specs) {
        std::string r, e;
        kvp_config c;
        if (resolve_spec(ck.cfg, sp, N, &r, &c, &e) && is_reference(c)) return specs.size();
    }
    return specs.size() + 1;
}

bool nll_single_prefill(const Checkpoint &ck, const std::string &spec, const std::vector<int32_t> &tokens,
                        int N, int P, double *nll, std::vector<int32_t> *argmax, std::string *err) {
    if (!check_range(tokens, N, P, err)) return false;
    Session s;
    if (!s.init(ck, spec, err)) return false;
    const int V = ck.cfg.vocab;
    std::vector<float> logits((size_t)N * V);
    if (!s.prefill(tokens.data(), N, logits.data(), true, err)) return false;
    if (s.max_chunk_used() != N) {
        *err = "the prefill did not fit in one chunk (capacity too small for " + std::to_string(N) + " tokens)";
        return false;
    }
    double sum = 0;
    if (argmax) argmax->assign((size_t)(N - P), 0);
    for (int t = P; t < N; t++) {
        int32_t am;
        sum += nll_of(&logits[(size_t)(t - 1) * V], V, tokens[t], &am);
        if (argmax) (*argmax)[t - P] = am;
    }
    *nll = sum / (N - P);
    return true;
}

std::string to_json(const std::vector<EvalResult> &rs) {
    std::string o = "[\n";
    for (size_t i = 0; i < rs.size(); i++) {
        const EvalResult &r = rs[i];
        o += "  {\"policy\": ";
        json_str(o, r.policy);
        o += ", \"spec\": ";
        json_str(o, r.spec);
        o += ", \"model\": ";
        json_str(o, r.model);
        o += ", \"text\": ";
        json_str(o, r.text);
        o += ", \"tokens\": " + std::to_string(r.tokens) + ", \"prefill\": " + std::to_string(r.prefill) +
             ", \"nll\": " + json_num(r.nll) + ", \"ppl\": " + json_num(r.ppl) + ", \"agreement\": " + json_num(r.agreement) +
             ", \"live_bytes\": " + std::to_string(r.live_bytes) +
             ", \"peak_live_bytes\": " + std::to_string(r.peak_live_bytes) +
             ", \"arena_bytes\": " + std::to_string(r.arena_bytes) + ", \"capacity\": " + std::to_string(r.capacity) +
             ", \"threads\": " + std::to_string(r.threads) + ", \"kv_ratio\": " + json_num(r.kv_ratio) +
             ", \"version\": ";
        json_str(o, r.version);
        o += ", \"tok_per_s\": " + json_num(r.tok_per_s, "%.1f") + "}";
        o += i + 1 < rs.size() ? ",\n" : "\n";
    }
    o += "]\n";
    return o;
}

std::string to_csv(const std::vector<EvalResult> &rs) {
    std::string o =
        "policy,spec,model,text,tokens,prefill,nll,ppl,agreement,live_bytes,peak_live_bytes,arena_bytes,capacity,"
        "threads,kv_ratio,version,tok_per_s\n";
    for (const EvalResult &r : rs) {
        o += csv_str(r.policy) + "," + csv_str(r.spec) + "," + csv_str(r.model) + "," + csv_str(r.text) + "," +
             std::to_string(r.tokens) + "," + std::to_string(r.prefill) + "," + json_num(r.nll) + "," + json_num(r.ppl) + "," +
             json_num(r.agreement) + "," + std::to_string(r.live_bytes) + "," + std::to_string(r.peak_live_bytes) + "," +
             std::to_string(r.arena_bytes) + "," + std::to_string(r.capacity) + "," + std::to_string(r.threads) + "," +
             json_num(r.kv_ratio) + "," + csv_str(r.version) + "," + json_num(r.tok_per_s, "%.1f") + "\n";
    }
    return o;
}

std::string to_table(const std::vector<EvalResult> &rs) {
    size_t w = 6;
    for (const EvalResult &r : rs) w = std::max(w, r.policy.size());
    std::string o = strprintf("%-*s %6s %6s %8s %8s %6s %10s %10s %10s %8s %9s\n", (int)w, "policy", "N", "P", "nll", "ppl",
                              "agree", "live_B", "peak_B", "arena_B", "kv_ratio", "tok/s");
    for (const EvalResult &r : rs) {
        o += strprintf("%-*s %6lld %6lld %8.4f %8.3f %6.3f %10llu %10llu %10llu %8.4f %9.1f\n", (int)w, r.policy.c_str(),
                       (long long)r.tokens, (long long)r.prefill, r.nll, r.ppl, r.agreement,
                       (unsigned long long)r.live_bytes, (unsigned long long)r.peak_live_bytes,
                       (unsigned long long)r.arena_bytes, r.kv_ratio, r.tok_per_s);
    }
    return o;
}

std::string to_markdown(const std::vector<EvalResult> &rs) {
    std::string o =
        "| policy | N | P | nll | ppl | agreement | live B | peak live B | arena B | KV vs full |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const EvalResult &r : rs) {
        std::string p;
        for (char ch : r.policy) p += ch == '|' ? std::string("\\|") : std::string(1, ch);
        o += strprintf("| `%s` | %lld | %lld | %.4f | %.3f | %.3f | %llu | %llu | %llu | %.3f |\n", p.c_str(),
                       (long long)r.tokens, (long long)r.prefill, r.nll, r.ppl, r.agreement,
                       (unsigned long long)r.live_bytes, (unsigned long long)r.peak_live_bytes,
                       (unsigned long long)r.arena_bytes, r.kv_ratio);
    }
    return o;
}

bool same_figures(const EvalResult &a, const EvalResult &b, std::string *diff) {
    auto cmp = [&](const char *name, const std::string &x, const std::string &y) {
        if (x == y) return true;
        *diff = std::string(name) + ": " + x + " vs " + y;
        return false;
    };
    return cmp("policy", a.policy, b.policy) && cmp("spec", a.spec, b.spec) && cmp("model", a.model, b.model) &&
           cmp("text", a.text, b.text) && cmp("tokens", std::to_string(a.tokens), std::to_string(b.tokens)) &&
           cmp("prefill", std::to_string(a.prefill), std::to_string(b.prefill)) && cmp("nll", json_num(a.nll), json_num(b.nll)) &&
           cmp("ppl", json_num(a.ppl), json_num(b.ppl)) && cmp("agreement", json_num(a.agreement), json_num(b.agreement)) &&
           cmp("live_bytes", std::to_string(a.live_bytes), std::to_string(b.live_bytes)) &&
           cmp("peak_live_bytes", std::to_string(a.peak_live_bytes), std::to_string(b.peak_live_bytes)) &&
           cmp("arena_bytes", std::to_string(a.arena_bytes), std::to_string(b.arena_bytes)) &&
           cmp("capacity", std::to_string(a.capacity), std::to_string(b.capacity)) &&
           cmp("threads", std::to_string(a.threads), std::to_string(b.threads)) &&
           cmp("kv_ratio", json_num(a.kv_ratio), json_num(b.kv_ratio));
}

}  // namespace kvh
