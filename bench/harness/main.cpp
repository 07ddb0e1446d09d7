// kvprune - command-line front end of the model harness.
//
//   kvprune run  [--model M] [--policy SPEC] [--prompt TEXT] [--tokens N] [--temp T] [--seed S]
//   kvprune eval [--model M] [--text FILE] [--tokens N] [--prefill P] [--policy SPEC ...]
//                [--json FILE] [--csv FILE] [--preset longctx]
//   kvprune plot --in results.json --out plot.png
//
// See docs/harness.md. Exit status: 0 success, 1 error (bad file, bad policy, failed run),
// 2 usage error.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "eval.h"
#include "plot.h"
#include "session.h"

#ifndef KVP_HARNESS_MODELS_DIR
#define KVP_HARNESS_MODELS_DIR "models"
#endif

namespace {

using namespace kvh;

// The main job's policy: StreamingLLM with 4 attention sinks and a 60-token window, positions
// realigned to the cache (the library's default for streaming), pruned every token: a 64-token
// cache, a quarter of the model's trained context.
const char *kRunPolicy = "policy=streaming sinks=4 window=60 compress_every=1";
const char *kRunPrompt = "In the beginning";
const char *kStreamSpec = "policy=streaming sinks=4 window=60 compress_every=1";

std::string models_dir() {
    const char *e = std::getenv("KVPRUNE_MODEL_DIR");
    return e && *e ? std::string(e) : std::string(KVP_HARNESS_MODELS_DIR);
}
std::string default_model() { return models_dir() + "/enbytes-1m.bin"; }
std::string default_text() { return models_dir() + "/enbytes-1m.eval.txt"; }

const char *kUsage =
    "usage:\n"
    "  kvprune run  [--model M] [--policy SPEC] [--prompt TEXT] [--tokens N] [--temp T] [--seed S] [--quiet]\n"
    "      generate N tokens (default 1024, 4x the default model's context) and print one stats line.\n"
    "      With no arguments: the bundled byte model under streaming + realign in a fixed arena.\n"
    "  kvprune eval [--model M] [--text FILE] [--tokens N] [--prefill P] [--policy SPEC]...\n"
    "               [--json FILE] [--csv FILE] [--no-progress]\n"
    "      teacher-forced NLL of tokens P..N-1 (P by kvp_prefill, the rest by kvp_decode) per policy,\n"
    "      top-1 agreement with full KV, live/peak/arena bytes, tokens/s. Defaults: N 1024, P N/4.\n"
    "  kvprune eval --preset longctx [--model M] [--text FILE] [--json FILE] [--csv FILE]\n"
    "      NLL at 1x, 4x and 8x the model's trained context: full (original positions) vs\n"
    "      streaming sinks 4 + window 60 (realign, and original positions).\n"
    "  kvprune plot --in results.json --out plot.png\n"
    "      NLL against live KV bytes, one series per policy family (needs gnuplot).\n"
    "  SPEC is the kvp_config_apply string, e.g. \"policy=streaming sinks=4 window=60\".\n"
    "  Models with vocab 256 read text as bytes; others read whitespace-separated token ids.\n";

struct Args {
    std::vector<std::pair<std::string, std::string>> opts;  // in order
    std::string err;
    bool has(const std::string &k) const {
        for (auto &o : opts)
            if (o.first == k) return true;
        return false;
    }
    std::string get(const std::string &k, const std::string &def = "") const {
        std::string v = def;
        for (auto &o : opts)
            if (o.first == k) v = o.second;
        return v;
    }
    std::vector<std::string> all(const std::string &k) const {
        std::vector<std::string> v;
        for (auto &o : opts)
            if (o.first == k) v.push_back(o.second);
        return v;
    }
};

// Parses --key value / --key=value against the allowed keys; flags take no value.
bool parse_args(int argc, char **argv, int first, const std::vector<std::string> &keys,
                const std::vector<std::string> &flags, Args *a) {
    for (int i = first; i < argc; i++) {
        std::string s = argv[i];
        if (s.compare(0, 2, "--") != 0) {
            a->err = "unexpected argument '" + s + "'";
            return false;
        }
        std::string k = s.substr(2), v;
        size_t eq = k.find('=');
        bool inline_v = eq != std::string::npos;
        if (inline_v) {
            v = k.substr(eq + 1);
            k = k.substr(0, eq);
        }
        bool is_flag = false, is_key = false;
        for (auto &f : flags) is_flag |= f == k;
        for (auto &f : keys) is_key |= f == k;
        if (is_flag && !inline_v) {
            a->opts.push_back({k, "1"});
            continue;
        }
        if (!is_key) {
            a->err = "unknown option '--" + k + "'";
            return false;
        }
        if (!inline_v) {
            if (i + 1 >= argc) {
                a->err = "option '--" + k + "' needs a value";
                return false;
            }
            v = argv[++i];
        }
        a->opts.push_back({k, v});
    }
    return true;
}

bool to_int(const std::string &s, long long lo, long long hi, long long *out) {
    if (s.empty()) return false;
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno || !end || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool to_num(const std::string &s, double *out) {
    if (s.empty()) return false;
    char *end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (!end || *end || !std::isfinite(v)) return false;
    *out = v;
    return true;
}

int usage_error(const std::string &cmd, const std::string &m) {
    std::fprintf(stderr, "kvprune %s: %s\n%s", cmd.c_str(), m.c_str(), kUsage);
    return 2;
}

int error(const std::string &cmd, const std::string &m) {
    std::fprintf(stderr, "kvprune %s: error: %s\n", cmd.c_str(), m.c_str());
    return 1;
}

bool write_file(const std::string &path, const std::string &s, std::string *err) {
    std::ofstream f(path, std::ios::binary);
    if (f) f << s;
    if (!f) {
        *err = "cannot write '" + path + "'";
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- run

int cmd_run(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"model", "policy", "prompt", "tokens", "temp", "seed"}, {"quiet"}, &a))
        return usage_error("run", a.err);
    long long n_gen = 1024, seed = 42;
    double temp = 0.8;
    if (a.has("tokens") && !to_int(a.get("tokens"), 1, 100000000, &n_gen))
        return usage_error("run", "--tokens must be a positive integer");
    if (a.has("seed") && !to_int(a.get("seed"), 0, INT64_MAX, &seed))
        return usage_error("run", "--seed must be a non-negative integer");
    if (a.has("temp") && (!to_num(a.get("temp"), &temp) || temp < 0))
        return usage_error("run", "--temp must be a number >= 0 (0 = greedy)");
    bool quiet = a.has("quiet");
    std::string err, spec = a.get("policy", kRunPolicy);
    Checkpoint ck;
    if (!load_checkpoint(a.get("model", default_model()), &ck, &err)) return error("run", err);
    const int V = ck.cfg.vocab;
    std::string prompt_text = a.get("prompt", V == 256 ? kRunPrompt : "1");
    std::vector<int32_t> prompt;
    if (!parse_tokens(prompt_text, V, &prompt, &err)) return error("run", "--prompt: " + err);
    if (prompt.empty()) return error("run", "--prompt is empty");
    Session s;
    if (!s.init(ck, spec, &err)) return error("run", err);
    std::fprintf(stderr,
                 "kvprune run: %s (context %d) | %s | fixed arena %llu bytes | %lld tokens after a %zu-token "
                 "prompt (%.1fx the context)\n",
                 ck.path.c_str(), ck.cfg.seq_len, spec.c_str(), (unsigned long long)s.stats().arena_bytes, n_gen,
                 prompt.size(), (double)(n_gen + (long long)prompt.size()) / ck.cfg.seq_len);
    std::vector<float> logits((size_t)V);
    std::vector<double> prob((size_t)V);
    std::mt19937_64 rng((uint64_t)seed);
    auto emit = [&](int32_t t) {
        if (quiet) return;
        if (V == 256) {
            std::fputc(t, stdout);
        } else {
            std::fprintf(stdout, "%d ", t);
        }
    };
    for (int32_t t : prompt) emit(t);
    auto t0 = std::chrono::steady_clock::now();
    if (!s.prefill(prompt.data(), (int)prompt.size(), logits.data(), false, &err)) return error("run", err);
    for (long long i = 0; i < n_gen; i++) {
        int32_t next = 0;
        if (temp == 0) {
            for (int j = 1; j < V; j++)
                if (logits[j] > logits[next]) next = j;
        } else {
            double m = logits[0];
            for (int j = 1; j < V; j++) m = std::max(m, (double)logits[j]);
            double z = 0;
            for (int j = 0; j < V; j++) z += prob[j] = std::exp(((double)logits[j] - m) / temp);
            double u = (double)(rng() >> 11) * 0x1.0p-53 * z, c = 0;
            next = V - 1;
            for (int j = 0; j < V; j++) {
                c += prob[j];
                if (u < c) {
                    next = j;
                    break;
                }
            }
        }
        emit(next);
        if (!quiet && (i & 15) == 15) std::fflush(stdout);
        if (!s.decode(next, logits.data(), &err)) return error("run", "token " + std::to_string(i) + ": " + err);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kvp_stats st = s.stats();
    if (!quiet) std::fputc('\n', stdout);
    std::fprintf(stdout,
                 "[kvprune] policy=\"%s\" tokens=%llu tok_per_s=%.1f live_kv_bytes=%llu peak_live_kv_bytes=%llu "
                 "arena_bytes=%llu\n",
                 spec.c_str(), (unsigned long long)st.tokens_seen, secs > 0 ? st.tokens_seen / secs : 0.0,
                 (unsigned long long)st.live_bytes, (unsigned long long)st.peak_live_bytes,
                 (unsigned long long)st.arena_bytes);
    return 0;
}

// ---------------------------------------------------------------- eval

struct ProgressBar {
    bool on;
    std::vector<std::string> names;
    void operator()(size_t i, int64_t done, int64_t total) const {
        if (!on) return;
        const int W = 30;
        int f = total ? (int)(W * done / total) : W;
        std::string name = i < names.size() ? names[i] : "full-KV reference";
        if (name.size() > 40) name = name.substr(0, 37) + "...";
        std::fprintf(stderr, "\r[%.*s%*s] %6lld/%-6lld %-40s", f, "##############################", W - f, "",
                     (long long)done, (long long)total, name.c_str());
        if (done == total) std::fprintf(stderr, "\r%*s\r", W + 58, "");
        std::fflush(stderr);
    }
};

int cmd_eval(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"model", "text", "tokens", "prefill", "policy", "json", "csv", "preset"},
                    {"no-progress"}, &a))
        return usage_error("eval", a.err);
    std::string err;
    Checkpoint ck;
    if (!load_checkpoint(a.get("model", default_model()), &ck, &err)) return error("eval", err);
    std::vector<int32_t> toks;
    if (!load_tokens(a.get("text", default_text()), ck.cfg.vocab, &toks, &err)) return error("eval", err);
    ProgressBar bar{!a.has("no-progress") && isatty(2) != 0, {}};
    std::vector<EvalResult> all;

    if (a.has("preset")) {
        if (a.get("preset") != "longctx") return usage_error("eval", "unknown preset '" + a.get("preset") + "'");
        if (a.has("tokens") || a.has("prefill") || a.has("policy"))
            return usage_error("eval", "--preset longctx sets --tokens, --prefill and --policy itself");
        const int ctx = ck.cfg.seq_len;
        std::vector<std::string> names = {"full, original positions", "streaming 4+60, realign",
                                          "streaming 4+60, original positions"};
        std::string table =
            "| n (x context) | P | " + names[0] + " | " + names[1] + " | " + names[2] + " |\n|---|---|---|---|---|\n";
        for (int mult : {1, 4, 8}) {
            int N = mult * ctx, P = N / 4;
            if (N > (int)toks.size())
                return error("eval", "the text has " + std::to_string(toks.size()) + " tokens, the preset needs " +
                                         std::to_string(N));
            std::vector<std::string> specs = {full_reference_spec(N), kStreamSpec,
                                              std::string(kStreamSpec) + " positions=original"};
            bar.names = specs;
            std::vector<EvalResult> rs;
            if (!run_eval(ck, toks, N, P, specs, &rs, &err, bar)) return error("eval", err);
            char b[256];
            std::snprintf(b, sizeof b, "| %d (%dx) | %d | %.3f | %.3f | %.3f |\n", N, mult, P, rs[0].nll, rs[1].nll,
                          rs[2].nll);
            table += b;
            all.insert(all.end(), rs.begin(), rs.end());
        }
        std::printf("%s\nlong-context preset, mean NLL (nats/token) of tokens n/4..n-1, model %s (context %d):\n%s",
                    to_table(all).c_str(), ck.path.c_str(), ctx, table.c_str());
    } else {
        long long N = 1024, P = -1;
        if (a.has("tokens") && !to_int(a.get("tokens"), 2, INT32_MAX, &N))
            return usage_error("eval", "--tokens must be an integer >= 2");
        if (a.has("prefill") && !to_int(a.get("prefill"), 1, INT32_MAX, &P))
            return usage_error("eval", "--prefill must be a positive integer");
        if (P < 0) P = std::max(1LL, N / 4);
        std::vector<std::string> specs = a.all("policy");
        if (specs.empty()) specs = {full_reference_spec((int)N), kStreamSpec};
        bar.names = specs;
        if (!run_eval(ck, toks, (int)N, (int)P, specs, &all, &err, bar)) return error("eval", err);
        std::printf("%s", to_table(all).c_str());
    }
    if (a.has("json") && !write_file(a.get("json"), to_json(all), &err)) return error("eval", err);
    if (a.has("csv") && !write_file(a.get("csv"), to_csv(all), &err)) return error("eval", err);
    return 0;
}

// ---------------------------------------------------------------- plot

int cmd_plot(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"in", "out"}, {}, &a)) return usage_error("plot", a.err);
    if (!a.has("in") || !a.has("out")) return usage_error("plot", "--in and --out are required");
    std::ifstream f(a.get("in"), std::ios::binary);
    if (!f) return error("plot", "cannot open '" + a.get("in") + "'");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<EvalResult> rs;
    std::string err;
    if (!parse_results_json(text, &rs, &err)) return error("plot", a.get("in") + ": " + err);
    if (!plot_results(rs, a.get("out"), &err)) return error("plot", err);
    std::printf("wrote %s (%zu points)\n", a.get("out").c_str(), rs.size());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::string cmd = argc > 1 ? argv[1] : "run";
    if (cmd == "run") return cmd_run(argc, argv);
    if (cmd == "eval") return cmd_eval(argc, argv);
    if (cmd == "plot") return cmd_plot(argc, argv);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
        std::printf("%s", kUsage);
        return 0;
    }
    if (cmd == "version" || cmd == "--version") {
        uint32_t v = kvp_version();
        std::printf("kvprune %u.%u.%u\n", v >> 16, (v >> 8) & 255, v & 255);
        return 0;
    }
    std::fprintf(stderr, "kvprune: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
}
