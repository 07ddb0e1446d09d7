#include "eval.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "session.h"

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

bool load_tokens(const std::string &path, int vocab, std::vector<int32_t> *out, std::string *err) {
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

void json_str(std::string &o, const std::string &s) {
    o += '"';
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            o += '\\';
            o += (char)ch;
        } else if (ch < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", ch);
            o += b;
        } else {
            o += (char)ch;
        }
    }
    o += '"';
}

std::string num(double v, const char *f = "%.9g") {
    if (!std::isfinite(v)) return "null";
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

}  // namespace

bool run_policy(const Checkpoint &ck, const std::string &spec, const std::vector<int32_t> &tokens, int N,
                int P, EvalResult *r, std::vector<int32_t> *argmax, std::string *err, const Progress &progress,
                size_t index) {
    if (!check_range(tokens, N, P, err)) return false;
    Session s;
    if (!s.init(ck, spec, err)) return false;
    const int V = ck.cfg.vocab;
    std::vector<float> logits((size_t)V);
    if (argmax) argmax->assign((size_t)(N - P), 0);
    double sum = 0;
    auto t0 = std::chrono::steady_clock::now();
    if (progress) progress(index, 0, N);
    if (!s.prefill(tokens.data(), P, logits.data(), false, err)) return false;
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
    r->nll = sum / (N - P);
    r->ppl = std::exp(r->nll);
    r->agreement = 0;
    r->live_bytes = st.live_bytes;
    r->peak_live_bytes = st.peak_live_bytes;
    r->arena_bytes = st.arena_bytes;
    r->tokens = N;
    r->tok_per_s = secs > 0 ? N / secs : 0;
    return true;
}

std::string full_reference_spec(int N) {
    return "policy=full capacity=" + std::to_string(N) + " positions=original";
}

bool run_eval(const Checkpoint &ck, const std::vector<int32_t> &tokens, int N, int P,
              const std::vector<std::string> &specs, std::vector<EvalResult> *results, std::string *err,
              const Progress &progress) {
    results->clear();
    if (!check_range(tokens, N, P, err)) return false;
    // Validate every spec before spending time on any run.
    std::vector<kvp_config> cfgs(specs.size());
    for (size_t i = 0; i < specs.size(); i++)
        if (!parse_policy(ck.cfg, specs[i], &cfgs[i], err)) return false;
    std::vector<std::vector<int32_t>> am(specs.size());
    int ref = -1;
    for (size_t i = 0; i < specs.size(); i++) {
        EvalResult r;
        if (!run_policy(ck, specs[i], tokens, N, P, &r, &am[i], err, progress, i)) {
            *err = "policy '" + specs[i] + "': " + *err;
            return false;
        }
        results->push_back(r);
        const kvp_config &c = cfgs[i];
        if (ref < 0 && c.policy == KVP_POLICY_FULL &&
            (c.positions == KVP_POS_DEFAULT || c.positions == KVP_POS_ORIGINAL) && c.kv_dtype == KVP_DTYPE_F32)
            ref = (int)i;
    }
    std::vector<int32_t> ref_am;
    if (ref >= 0) {
        ref_am = am[(size_t)ref];
    } else {
        EvalResult r;
        std::string spec = full_reference_spec(N);
        if (!run_policy(ck, spec, tokens, N, P, &r, &ref_am, err, progress, specs.size())) {
            *err = "full-KV reference '" + spec + "': " + *err;
            return false;
        }
    }
    for (size_t i = 0; i < specs.size(); i++) {
        size_t agree = 0;
        for (size_t t = 0; t < ref_am.size(); t++) agree += am[i][t] == ref_am[t];
        (*results)[i].agreement = (double)agree / (double)ref_am.size();
    }
    return true;
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
        o += ", \"nll\": " + num(r.nll) + ", \"ppl\": " + num(r.ppl) + ", \"agreement\": " + num(r.agreement) +
             ", \"live_bytes\": " + std::to_string(r.live_bytes) +
             ", \"peak_live_bytes\": " + std::to_string(r.peak_live_bytes) +
             ", \"arena_bytes\": " + std::to_string(r.arena_bytes) + ", \"tokens\": " + std::to_string(r.tokens) +
             ", \"tok_per_s\": " + num(r.tok_per_s, "%.1f") + "}";
        o += i + 1 < rs.size() ? ",\n" : "\n";
    }
    o += "]\n";
    return o;
}

std::string to_csv(const std::vector<EvalResult> &rs) {
    std::string o = "policy,nll,ppl,agreement,live_bytes,peak_live_bytes,arena_bytes,tokens,tok_per_s\n";
    for (const EvalResult &r : rs) {
        std::string p = "\"";
        for (char ch : r.policy) p += ch == '"' ? std::string("\"\"") : std::string(1, ch);
        p += "\"";
        o += p + "," + num(r.nll) + "," + num(r.ppl) + "," + num(r.agreement) + "," + std::to_string(r.live_bytes) +
             "," + std::to_string(r.peak_live_bytes) + "," + std::to_string(r.arena_bytes) + "," +
             std::to_string(r.tokens) + "," + num(r.tok_per_s, "%.1f") + "\n";
    }
    return o;
}

std::string to_table(const std::vector<EvalResult> &rs) {
    size_t w = 6;
    for (const EvalResult &r : rs) w = std::max(w, r.policy.size());
    std::string o;
    char b[512];
    std::snprintf(b, sizeof b, "%-*s %6s %8s %8s %6s %10s %10s %10s %9s\n", (int)w, "policy", "tokens", "nll",
                  "ppl", "agree", "live_B", "peak_B", "arena_B", "tok/s");
    o += b;
    for (const EvalResult &r : rs) {
        std::snprintf(b, sizeof b, "%-*s %6lld %8.4f %8.3f %6.3f %10llu %10llu %10llu %9.1f\n", (int)w,
                      r.policy.c_str(), (long long)r.tokens, r.nll, r.ppl, r.agreement,
                      (unsigned long long)r.live_bytes, (unsigned long long)r.peak_live_bytes,
                      (unsigned long long)r.arena_bytes, r.tok_per_s);
        o += b;
    }
    return o;
}

}  // namespace kvh
