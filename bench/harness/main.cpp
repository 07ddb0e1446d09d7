// kvprune - command-line front end of the model harness.
//
//   kvprune run    [--model M] [--policy SPEC] [--prompt TEXT] [--tokens N] [--temp T] [--seed S]
//   kvprune eval   [--model M] [--text FILE] [--tokens N] [--prefill P] [--policy SPEC ...]
//                  [--json FILE] [--csv FILE] [--preset longctx | --replay FILE]
//   kvprune plot   --in results.json --out FILE|- [--format png|svg] [--x auto|bytes|n]
//   kvprune keys   [--policy NAME] [--markdown]
//   kvprune report --in results.json
//   kvprune info   --model M
//   kvprune tokenize --model M [--text T | --file F] [--chunks] [--bos] [--special]
//
// See docs/harness.md. Exit status: 0 success, 1 error (bad file, bad policy, failed run),
// 2 usage error.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint.h"
#include "gguf.h"
#include "eval.h"
#include "gguf.h"
#include "plot.h"
#include "session.h"
#include "spec.h"
#include "tasks.h"
#include "tokenizer.h"

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
const char *kDefaultModel = "enbytes-1m.bin";
const char *kDefaultText = "enbytes-1m.eval.txt";
const char *kDefaultTaskModel = "induction6.bin";  // the bundled model that retrieves (models/README.md)

std::string exe_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "";
    buf[n] = '\0';
    std::string p(buf);
    const size_t s = p.find_last_of('/');
    return s == std::string::npos ? "" : p.substr(0, s);
}

bool is_file(const std::string &p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Where bundled checkpoints are looked for, in order: $KVPRUNE_MODEL_DIR (alone, when set), the
// installed share/kvprune/models next to this binary's prefix, the source tree's models/.
std::vector<std::string> model_dirs() {
    const char *e = std::getenv("KVPRUNE_MODEL_DIR");
    if (e && *e) return {e};
    std::vector<std::string> d;
    const std::string x = exe_dir();
    if (!x.empty()) d.push_back(x + "/../share/kvprune/models");
    d.push_back(KVP_HARNESS_MODELS_DIR);
    return d;
}

// A bundled file by name: the first folder holding it (else the first folder, for the message).
std::string bundled(const std::string &name) {
    const std::vector<std::string> dirs = model_dirs();
    for (const std::string &d : dirs)
        if (is_file(d + "/" + name)) return d + "/" + name;
    return dirs.front() + "/" + name;
}

// A file named in a results row: as given when it exists, else a bundled file of that name.
std::string find_data_file(const std::string &p) {
    if (is_file(p)) return p;
    const size_t s = p.find_last_of('/');
    return bundled(s == std::string::npos ? p : p.substr(s + 1));
}

const char *kUsageRun =
    "kvprune run [--model M] [--policy SPEC] [--prompt TEXT] [--tokens N] [--temp T] [--seed S] [--quiet]\n"
    "    Generate N tokens (default 1024, 4x the default model's context) and print one stats line.\n"
    "    With no arguments: the bundled byte model under streaming + realign in a fixed arena.\n"
    "    --policy SPEC   kvp_config_apply string (default \"policy=streaming sinks=4 window=60 compress_every=1\");\n"
    "                    compression_ratio=r is resolved for the prompt + N tokens (docs/harness.md)\n"
    "    --temp T        sampling temperature, 0 = greedy (default 0.8); --seed S (default 42)\n";
const char *kUsageEval =
    "kvprune eval [--model M] [--text FILE] [--tokens N] [--prefill P] [--policy SPEC]...\n"
    "             [--json FILE] [--csv FILE] [--no-progress] [--progress-every SECONDS] [--random-lazy SEED]\n"
    "             [--tri-calibrate FILE] [--duo-roles FILE]\n"
    "    Teacher-forced NLL of tokens P..N-1 (P by kvp_prefill, the rest by kvp_decode) per policy,\n"
    "    top-1 agreement with full KV, live/peak/arena bytes, KV ratio to full, tokens/s; after the\n"
    "    table one line per policy: prefill time, simlayerkv's lazy layers, asl's selection layer.\n"
    "    --tri-calibrate FILE: TriAttention's offline calibration: the query statistics of a full-KV\n"
    "    pass over FILE's first min(context, 4096) tokens, given to every policy with\n"
    "    tri_stats=given (kvp_query_stats_set); also with --task.\n"
    "    --duo-roles FILE: a DuoAttention role table (kvprune duo-calibrate) for every policy's cache\n"
    "    (kvp_create_heads: streaming heads keep duo_sink + duo_window tokens); also with --task.\n"
    "    --random-lazy SEED: for each simlayerkv policy, one more row trimming as many layers chosen\n"
    "    at random (splitmix64 from SEED) via lazy_force: the SimLayerKV paper's baseline.\n"
    "    Defaults: N 1024, P N/4; policies full KV and streaming 4+60. A failing policy is reported\n"
    "    and the others still run (exit 1). Output paths are checked before anything runs.\n"
    "    Progress (tokens/s, ETA) goes to stderr: a bar on a terminal, else a line every\n"
    "    --progress-every seconds (default 10) and one per finished policy.\n"
    "kvprune eval --preset longctx [--model M] [--text FILE] [--json FILE] [--csv FILE]\n"
    "    NLL at 1x, 4x and 8x the model's trained context: full (original positions) vs\n"
    "    streaming sinks 4 + window 60 (realign, and original positions).\n"
    "kvprune eval --replay RESULTS.json [--json FILE] [--csv FILE] [--threads T] [--replay-every K]\n"
    "    Re-runs every row of a results file (its model, text, N, P, policy) and compares every\n"
    "    figure except tok/s; exit 1 on a difference. With --json: writes the fresh rows.\n"
    "    Task results (--task): every figure but the times; --replay-every K re-runs rows 0, K, 2K, ...\n";
const char *kUsageTask =
    "kvprune eval --task passkey|niah|niah-multikey|recall[,...] [--model M] [--text FILE] [--lengths L,...]\n"
    "             [--depths D,...] [--samples S] [--seed S] [--setting query-aware|query-agnostic|both]\n"
    "             [--policy SPEC]... [--compression-ratio R,...] [--threads T] [--answers] [--json FILE] [--csv FILE]\n"
    "             [--port-rows FILE | --port-results FILE]\n"
    "    Retrieval tasks: a needle (or passage) at each depth of held-out text, every prompt exactly\n"
    "    L bytes; the answer is greedy-decoded after the question and scored by exact match (recall:\n"
    "    per byte), with the answer's teacher-forced NLL and live/peak KV bytes per cell. A model with a\n"
    "    tokenizer (GGUF) gets the same text encoded by it: L tokens (BOS included), depths in tokens,\n"
    "    the decoded answer compared on the answer's bytes (docs/harness.md \"Task prompts on GGUF models\").\n"
    "    query-aware: the question is prefilled with the context (SnapKV's setting); query-agnostic:\n"
    "    the context is prefilled and compressed first, the question arrives by decode.\n"
    "    Defaults: model induction6.bin (exact 6-byte induction, context 1024), text enbytes-1m.eval.txt,\n"
    "    lengths 256,512,1000, depths 0,0.1,...,1, 1 sample, seed 0, both settings, ratios 0.5,0.75,0.875\n"
    "    applied to every --policy that takes one (full KV runs once), policies: full KV and every\n"
    "    policy (window, streaming, h2o, snapkv, pyramidkv, lethe, simlayerkv, asl, think over snapkv,\n"
    "    snapkv with q8/q4 storage, random with keep_prompt=0); threads: the machine's cores (results do not depend on them).\n"
    "    Prints the summary table (kvprune report), after one line per cell with --answers (expected and\n"
    "    answered bytes, right or wrong, live KV); --json/--csv write one row per cell.\n"
    "    --port-rows FILE writes the grid's prompts (token ids, specs) for llama.cpp with the kvprune port and\n"
    "    runs nothing; --port-results FILE reads what the port's llama-kvp-tasks answered and reports it as\n"
    "    above (ports/llama.cpp/tasks.sh does the three steps; answer NLL and times are not measured there).\n";
const char *kUsageDuo =
    "kvprune duo-calibrate --out FILE [--model M] [--text FILE] [--length N] [--samples S] [--seed S]\n"
    "             [--streaming F]\n"
    "    DuoAttention's calibration (arXiv:2410.10819): S passkey prompts of N tokens (needle depths\n"
    "    spread over [0, 1], query-aware) run full KV; per (layer, KV head) the mean attention mass the\n"
    "    question's queries put on the needle; the fraction F of heads with the least mass become\n"
    "    streaming heads. Writes the role table and the masses to FILE (eval --duo-roles FILE).\n"
    "    Defaults: model induction6.bin, text enbytes-1m.eval.txt, N 256, S 8, seed 0, F 0.5.\n";
const char *kUsagePlot =
    "kvprune plot --in results.json --out FILE|- [--format png|svg] [--x auto|bytes|n]\n"
    "             [--kind heatmap|memory] [--task T] [--setting query-aware|query-agnostic|both]   (task results)\n"
    "    NLL against live KV bytes (or against N for a long-context file: --x auto), one series per\n"
    "    policy family; the title names the model, N and P. FILE.svg writes SVG, otherwise PNG;\n"
    "    --out - writes to stdout (not a PNG to a terminal). Needs gnuplot.\n"
    "    Task results (kvprune eval --task): --kind heatmap (default) draws the needle heatmap, a panel per\n"
    "    policy and ratio (length x depth, colour = accuracy) for --task (default: the first row's) and\n"
    "    --setting (default: the first row's; both: a panel per setting too); --kind memory draws accuracy\n"
    "    against mean live KV bytes, a line per policy, a panel per setting (both, the default, or --setting).\n";
const char *kUsageKeys =
    "kvprune keys [--policy NAME] [--markdown]\n"
    "    Every configuration key from the library's own table (kvp_config_key): type, default,\n"
    "    range or values, the policies that use it, meaning. --policy: only that policy's keys.\n";
const char *kUsageReport =
    "kvprune report --in results.json\n"
    "    The rows of a results file as a markdown table (the docs' tables are made by it); task results:\n"
    "    per task, accuracy (recall: mean byte accuracy) and mean live KV per policy x setting x ratio.\n";
const char *kUsageInfo =
    "kvprune info [--model M]\n"
    "    What a model file holds: format, architecture, sizes, weight types, context, RoPE, the\n"
    "    tokenizer, and the KV bytes per token (raw K+V and kvprune's arena) at f32/f16/q8/q4.\n"
    "    --model takes a llama2.c .bin or a GGUF file (llama, qwen2, qwen3; weight types f32, f16, bf16,\n"
    "    q8_0, q8_1, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K in any mix; docs/harness.md).\n";

const char *kUsageTokenize =
    "kvprune tokenize --model M [--text T | --file F] [--chunks] [--bos] [--special]\n"
    "    The token ids of a text through a GGUF file's tokenizer (vocabulary-only files too), on one line.\n"
    "    --chunks: the input is llama.cpp's test-tokenizer-0 format (chunks separated by lines\n"
    "    __ggml_vocab_test__); one line of ids per chunk. --bos: BOS first when the model adds one\n"
    "    (`info`'s add_bos, as run and eval do). --special: control-token text becomes the token\n"
    "    (llama.cpp's parse_special; off by default, as for eval text).\n";

std::string usage_all() {
    return std::string("usage:\n") + kUsageRun + kUsageEval + kUsageTask + kUsageDuo + kUsagePlot + kUsageKeys + kUsageReport + kUsageInfo + kUsageTokenize +
           "kvprune help | version\n"
           "SPEC is the kvp_config_apply string, e.g. \"policy=streaming sinks=4 window=60\" (`kvprune keys`).\n"
           "GGUF models with a tokenizer read text through it; other models with vocab 256 read text as\n"
           "bytes, the rest whitespace-separated token ids.\n";
}

struct Args {
    std::vector<std::pair<std::string, std::string>> opts;  // in order
    std::string err;
    bool help = false;
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

// Parses --key value / --key=value against the allowed keys; flags take no value; --help / -h.
bool parse_args(int argc, char **argv, int first, const std::vector<std::string> &keys,
                const std::vector<std::string> &flags, Args *a) {
    for (int i = first; i < argc; i++) {
        std::string s = argv[i];
        if (s == "--help" || s == "-h") {
            a->help = true;
            continue;
        }
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

int usage_error(const std::string &cmd, const std::string &m, const char *usage) {
    std::fprintf(stderr, "kvprune %s: %s\nusage: %s(kvprune %s --help)\n", cmd.c_str(), m.c_str(), usage,
                 cmd.c_str());
    return 2;
}

int help(const char *usage) {
    std::printf("usage: %s", usage);
    return 0;
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

// Every --policy must be non-empty (an empty one is a usage error, not "full KV").
bool policies_nonempty(const Args &a, std::string *err) {
    for (const std::string &p : a.all("policy")) {
        if (p.find_first_not_of(" \t\n") == std::string::npos) {
            *err = "--policy is empty: give a spec such as \"policy=streaming sinks=4 window=60\" (`kvprune keys`)";
            return false;
        }
    }
    return true;
}

// Tokens of a text file for a model: through its tokenizer (GGUF, BOS as the metadata says), else
// load_tokens (bytes for vocab 256, ids otherwise).
bool model_tokens(const Checkpoint &ck, const std::string &path, std::vector<int32_t> *out, std::string *err) {
    if (!ck.tok) return load_tokens(path, ck.cfg.vocab, out, err);
    std::vector<int32_t> probe;  // the file checks of load_tokens (regular file, readable)
    struct stat sb;
    if (stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode)) return load_tokens(path, ck.cfg.vocab, &probe, err);
    std::ifstream f(path, std::ios::binary);
    if (!f) return load_tokens(path, ck.cfg.vocab, &probe, err);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    *out = ck.tok->encode(text, ck.tok->add_bos);
    if (out->empty()) {
        *err = "text '" + path + "' gives no tokens";
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- run

int cmd_run(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"model", "policy", "prompt", "tokens", "temp", "seed"}, {"quiet"}, &a))
        return usage_error("run", a.err, kUsageRun);
    if (a.help) return help(kUsageRun);
    long long n_gen = 1024, seed = 42;
    double temp = 0.8;
    if (a.has("tokens") && !to_int(a.get("tokens"), 1, 100000000, &n_gen))
        return usage_error("run", "--tokens must be a positive integer", kUsageRun);
    if (a.has("seed") && !to_int(a.get("seed"), 0, INT64_MAX, &seed))
        return usage_error("run", "--seed must be a non-negative integer", kUsageRun);
    if (a.has("temp") && (!to_num(a.get("temp"), &temp) || temp < 0))
        return usage_error("run", "--temp must be a number >= 0 (0 = greedy)", kUsageRun);
    bool quiet = a.has("quiet");
    std::string err, spec = a.get("policy", kRunPolicy);
    if (!policies_nonempty(a, &err)) return usage_error("run", err, kUsageRun);
    Checkpoint ck;
    if (!load_checkpoint(a.get("model", bundled(kDefaultModel)), &ck, &err)) return error("run", err);
    const int V = ck.cfg.vocab;
    std::string prompt_text = a.get("prompt", V == 256 || ck.tok ? kRunPrompt : "1");
    std::vector<int32_t> prompt;
    if (ck.tok) {
        prompt = ck.tok->encode(prompt_text, ck.tok->add_bos);
    } else if (!parse_tokens(prompt_text, V, &prompt, &err)) {
        return error("run", "--prompt: " + err);
    }
    if (prompt.empty()) return error("run", "--prompt is empty");
    // compression_ratio refers to the whole sequence: prompt + generated tokens.
    std::string resolved, e;
    kvp_config rcfg;
    if (!resolve_spec(ck.cfg, spec, (int64_t)prompt.size() + n_gen, &resolved, &rcfg, &e))
        return error("run", "bad policy spec '" + spec + "': " + e);
    Session s;
    if (!s.init(ck, resolved, &err)) return error("run", err);
    std::fprintf(stderr,
                 "kvprune run: %s (context %d) | %s | fixed arena %llu bytes | %lld tokens after a %zu-token "
                 "prompt (%.1fx the context)\n",
                 ck.path.c_str(), ck.cfg.seq_len, resolved.c_str(), (unsigned long long)s.stats().arena_bytes, n_gen,
                 prompt.size(), (double)(n_gen + (long long)prompt.size()) / ck.cfg.seq_len);
    const std::string big = arena_warning(rcfg, (int64_t)prompt.size() + n_gen);
    if (!big.empty()) std::fprintf(stderr, "kvprune run: %s\n", big.c_str());
    std::vector<float> logits((size_t)V);
    std::vector<double> prob((size_t)V);
    std::mt19937_64 rng((uint64_t)seed);
    auto emit = [&](int32_t t) {
        if (quiet) return;
        if (ck.tok) {
            std::fputs(ck.tok->decode(t).c_str(), stdout);
        } else if (V == 256) {
            std::fputc(t, stdout);
        } else {
            std::fprintf(stdout, "%d ", t);
        }
    };
    for (int32_t t : prompt) emit(t);
    auto t0 = std::chrono::steady_clock::now();
    if (!s.prefill(prompt.data(), (int)prompt.size(), logits.data(), false, &err)) return error("run", err);
    EvalResult note;  // prefill time and the layer-level policies' decisions, on stderr
    note.spec = resolved;
    note.prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    note.lazy_layers = s.lazy_layers();
    note.selection_layer = s.selection_layer();
    note.n_layers = ck.cfg.n_layers;
    std::fprintf(stderr, "kvprune run: %zu-token prompt: %s\n", prompt.size(), layer_note(note).c_str());
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

// Progress on stderr: a bar with tokens/s and ETA on a terminal; otherwise a line every
// `every` seconds and one per finished policy (CI logs, pipes).
struct ProgressBar {
    enum Mode { kOff, kBar, kLines } mode = kOff;
    double every = 10;
    std::vector<std::string> names;
    size_t runs = 1;  // policies (and the reference) expected, for the ETA
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), last = t0, run_t0 = t0;
    int64_t done_before = 0;  // tokens of finished runs
    size_t cur = (size_t)-1;
    void operator()(size_t i, int64_t done, int64_t total) {
        if (mode == kOff) return;
        const auto now = std::chrono::steady_clock::now();
        if (i != cur) {
            if (cur != (size_t)-1) done_before += total;
            cur = i;
            run_t0 = now;
        }
        runs = std::max(runs, i + 1);
        const double el = std::chrono::duration<double>(now - t0).count();
        const double rate = el > 0 ? (double)(done_before + done) / el : 0;
        const double left = (double)total * (double)runs - (double)(done_before + done);
        const std::string eta = rate > 0 ? strprintf("%.0fs", left / rate) : std::string("?");
        std::string name = i < names.size() ? names[i] : "full-KV reference";
        if (mode == kBar) {
            if (name.size() > 36) name = name.substr(0, 33) + "...";
            const int W = 24, f = total ? (int)(W * done / total) : W;
            std::fprintf(stderr, "\r[%zu/%zu] [%.*s%*s] %6lld/%-6lld %7.0f tok/s ETA %-6s %-36s", i + 1, runs, f,
                         "########################", W - f, "", (long long)done, (long long)total, rate, eta.c_str(),
                         name.c_str());
            if (done == total) std::fprintf(stderr, "\r%*s\r", 130, "");
            std::fflush(stderr);
            return;
        }
        if (done == total) {
            const double rs = std::chrono::duration<double>(now - run_t0).count();
            std::fprintf(stderr, "kvprune eval: [%zu/%zu] '%s' done: %lld tokens in %.1f s (%.0f tok/s), ETA %s\n", i + 1,
                         runs, name.c_str(), (long long)total, rs, rs > 0 ? total / rs : 0.0,
                         i + 1 >= runs ? "0s" : eta.c_str());
            last = now;
        } else if (std::chrono::duration<double>(now - last).count() >= every && done > 0) {
            std::fprintf(stderr, "kvprune eval: [%zu/%zu] '%s': %lld/%lld tokens, %.0f tok/s, ETA %s\n", i + 1, runs,
                         name.c_str(), (long long)done, (long long)total, rate, eta.c_str());
            last = now;
        }
        std::fflush(stderr);
    }
};

std::string display_name(const Args &a, const char *key, const char *def) {
    return a.has(key) ? a.get(key) : std::string(def);
}

// Writes --json / --csv (when there are rows), then one "error:" line per failure (exit 1).
int finish_outputs(const Args &a, const std::string &json, const std::string &csv, const std::string &failures) {
    std::string err;
    if (!json.empty()) {
        if (a.has("json") && !write_file(a.get("json"), json, &err)) return error("eval", err);
        if (a.has("csv") && !write_file(a.get("csv"), csv, &err)) return error("eval", err);
    }
    if (!failures.empty()) {
        std::istringstream is(failures);
        std::string line;
        while (std::getline(is, line)) std::fprintf(stderr, "kvprune eval: error: %s\n", line.c_str());
        return 1;
    }
    return 0;
}

int finish_eval(const Args &a, std::vector<EvalResult> &all, const std::string &failures) {
    return all.empty() ? finish_outputs(a, "", "", failures) : finish_outputs(a, to_json(all), to_csv(all), failures);
}

int cmd_task_replay(const Args &a, const std::string &in, const std::string &json);

int cmd_replay(const Args &a) {
    std::string err;
    const std::string in = a.get("replay");
    std::ifstream f(in, std::ios::binary);
    if (!f) return error("eval", "cannot open '" + in + "'");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (is_task_results(text)) return cmd_task_replay(a, in, text);
    std::vector<EvalResult> old;
    if (!parse_results_json(text, &old, &err)) return error("eval", in + ": " + err);
    if (old.empty()) return error("eval", in + ": no rows to replay");
    // Groups of rows with one (model, text, N, P), in file order; each is one run_eval.
    std::vector<std::vector<size_t>> groups;
    for (size_t i = 0; i < old.size(); i++) {
        bool placed = false;
        for (auto &g : groups) {
            const EvalResult &h = old[g[0]];
            if (h.model == old[i].model && h.text == old[i].text && h.tokens == old[i].tokens &&
                h.prefill == old[i].prefill) {
                g.push_back(i);
                placed = true;
                break;
            }
        }
        if (!placed) groups.push_back({i});
    }
    std::vector<EvalResult> fresh(old.size());
    std::string failures;
    int diffs = 0;
    for (const auto &g : groups) {
        const EvalResult &h = old[g[0]];
        Checkpoint ck;
        if (!load_checkpoint(find_data_file(h.model), &ck, &err)) return error("eval", err);
        std::vector<int32_t> toks;
        if (!load_tokens(find_data_file(h.text), ck.cfg.vocab, &toks, &err)) return error("eval", err);
        std::vector<std::string> specs;
        for (size_t i : g) specs.push_back(old[i].policy);
        std::vector<EvalResult> rs;
        if (!run_eval(ck, toks, (int)h.tokens, (int)h.prefill, specs, &rs, &err))
            failures += (failures.empty() ? "" : "\n") + err;
        for (size_t j = 0, k = 0; j < g.size() && k < rs.size(); j++) {
            if (rs[k].policy != old[g[j]].policy) continue;
            rs[k].model = h.model;
            rs[k].text = h.text;
            fresh[g[j]] = rs[k++];
        }
    }
    std::vector<EvalResult> out;
    for (size_t i = 0; i < old.size(); i++) {
        std::string d;
        if (fresh[i].policy.empty()) {
            ++diffs;
            std::fprintf(stderr, "kvprune eval: row %zu '%s': did not run\n", i, old[i].policy.c_str());
            continue;
        }
        out.push_back(fresh[i]);
        if (!same_figures(old[i], fresh[i], &d)) {
            ++diffs;
            std::fprintf(stderr, "kvprune eval: row %zu '%s' (N=%lld): %s\n", i, old[i].policy.c_str(),
                         (long long)old[i].tokens, d.c_str());
        }
    }
    std::printf("replay of %s: %zu rows, %d differ\n", in.c_str(), old.size(), diffs);
    const int rc = finish_eval(a, out, failures);
    return rc ? rc : (diffs ? 1 : 0);
}

// ---------------------------------------------------------------- eval --task

// "a,b,c" -> numbers / integers; false on an empty item or a bad number.
bool split_list(const std::string &s, std::vector<std::string> *out) {
    out->clear();
    std::string cur;
    for (size_t i = 0; i <= s.size(); i++) {
        if (i == s.size() || s[i] == ',') {
            if (cur.empty()) return false;
            out->push_back(cur);
            cur.clear();
        } else {
            cur += s[i];
        }
    }
    return true;
}

bool read_text_file(const std::string &path, std::string *out, std::string *err) {
    std::vector<int32_t> bytes;  // load_tokens' checks (regular file, readable), as bytes
    if (!load_tokens(path, 256, &bytes, err)) return false;
    out->assign(bytes.begin(), bytes.end());
    return true;
}

// Progress of a task grid on stderr: a bar on a terminal, else a line every `every` seconds.
struct TaskBar {
    bool on = true, tty = false;
    double every = 10;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), last = t0;
    void operator()(size_t done, size_t total) {
        if (!on) return;
        const auto now = std::chrono::steady_clock::now();
        const double el = std::chrono::duration<double>(now - t0).count();
        const double eta = done ? el / (double)done * (double)(total - done) : 0;
        // a rate below one cell per second (real models) reads as seconds per cell, not "0.0 cells/s"
        char rate[48];
        const double cps = el > 0 ? (double)done / el : 0.0;
        if (cps >= 1 || done == 0) std::snprintf(rate, sizeof rate, "%.1f cells/s", cps);
        else std::snprintf(rate, sizeof rate, "%.1f s/cell", el / (double)done);
        if (tty) {
            const int W = 30, f = total ? (int)(W * done / total) : W;
            std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu cells, %s, ETA %.0fs   ", f, "##############################", W - f, "", done,
                         total, rate, eta);
            if (done == total) std::fprintf(stderr, "\n");
        } else if (done == total || std::chrono::duration<double>(now - last).count() >= every) {
            std::fprintf(stderr, "kvprune eval: %zu/%zu cells, %s, ETA %.0fs\n", done, total, rate, eta);
            last = now;
        }
        std::fflush(stderr);
    }
};

// How long a task grid will take, before it runs (issue 29: the default grid on a 0.5B GGUF model
// runs for hours). A prefill of up to 64 tokens and 8 decodes of this model are timed here (the
// sessions' own thread settings), then scaled by what the cells feed: each cell prefills its prompt
// (query-agnostic: the context, then decodes the question) and decodes the answer's tokens once
// teacher-forced and, when greedy leaves the answer, once more. Cells run on the worker threads
// side by side on a llama2.c (f32) model; on a GGUF model their quantized products share one pool
// and run one at a time, so the workers do not divide the time. Attention and scoring are not
// counted, nor other load on the machine: a rough, lower-end figure.
std::string duration_text(double s) {
    char b[64];
    if (s < 120) std::snprintf(b, sizeof b, "%.0f s", s);
    else if (s < 7200) std::snprintf(b, sizeof b, "%.0f min", s / 60);
    else std::snprintf(b, sizeof b, "%.1f h", s / 3600);
    return b;
}

void print_task_estimate(const Checkpoint &ck, const std::string &text, const std::vector<TaskResult> &rows, int threads,
                         bool custom_grid) {
    if (rows.empty()) return;
    // prompt shapes per (task, length): question and answer tokens of the first sample
    std::map<std::pair<std::string, int64_t>, std::pair<size_t, size_t>> shape;
    const std::vector<int32_t> text_ids = ck.tok ? task_text_ids(*ck.tok, text) : std::vector<int32_t>();
    double prompt = 0, decoded = 0;
    int shortest = INT32_MAX;
    for (const TaskResult &r : rows) {
        const auto key = std::make_pair(r.task, r.length);
        auto it = shape.find(key);
        if (it == shape.end()) {
            TaskPrompt p;
            std::string e;
            const bool ok = ck.tok ? make_task_prompt_tokens(r.task, *ck.tok, text_ids, (int)r.length, 0.0, 0, r.seed, &p, &e)
                                   : make_task_prompt(r.task, text, (int)r.length, 0.0, 0, r.seed, &p, &e);
            const size_t q = !ok ? 16 : p.tokens() ? p.question_ids.size() : p.question.size();
            const size_t an = !ok ? 8 : p.tokens() ? p.answer_ids.size() : p.answer.size();
            it = shape.emplace(key, std::make_pair(q, an)).first;
        }
        const bool aware = r.setting == kSettings[0];
        const double q = (double)it->second.first, an = (double)it->second.second;
        prompt += aware ? (double)r.length : (double)r.length - q;
        decoded += (aware ? 0.0 : q) + 2.0 * std::max(0.0, an - 1);
        shortest = std::min(shortest, (int)r.length);
    }
    const int P = std::max(1, std::min(64, shortest));
    Session s;
    std::string e;
    if (!s.init(ck, "policy=full capacity=" + std::to_string(P + 16), &e)) return;
    std::vector<int32_t> toks((size_t)P);
    for (int i = 0; i < P; i++) toks[(size_t)i] = (int32_t)((7919u * (unsigned)i + 1u) % (unsigned)ck.cfg.vocab);
    std::vector<float> logits((size_t)ck.cfg.vocab);
    const auto t0 = std::chrono::steady_clock::now();
    if (!s.prefill(toks.data(), P, logits.data(), false, &e)) return;
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < 8; i++)
        if (!s.decode(toks[(size_t)i % toks.size()], logits.data(), &e)) return;
    const auto t2 = std::chrono::steady_clock::now();
    const double tp = std::chrono::duration<double>(t1 - t0).count() / P, td = std::chrono::duration<double>(t2 - t1).count() / 8;
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const double workers = ck.qmat.empty() ? std::max(1, std::min(threads, (int)hw)) : 1;
    const double est = (prompt * tp + decoded * td) / workers;
    std::fprintf(stderr,
                 "kvprune eval: estimated %s (%.0f prompt tokens at %.2f ms/token and %.0f decoded at %.2f ms/token, timed "
                 "here on this model%s; attention, scoring and other load not counted)\n",
                 duration_text(est).c_str(), prompt, tp * 1e3, decoded, td * 1e3,
                 workers > 1 ? (", over " + std::to_string((int)workers) + " workers").c_str()
                             : (ck.qmat.empty() ? "" : ", cells one at a time (quantized products share one pool)"));
    if (est > 1800 && !custom_grid)
        std::fprintf(stderr, "kvprune eval: this is the default grid (every policy, 3 ratios, 3 lengths, 11 depths, both settings); "
                             "for a real model see docs/harness.md \"Task grids on real models\" for a smaller one\n");
    std::fflush(stderr);
}

int finish_task(const Args &a, const std::vector<TaskResult> &rows, const std::string &failures) {
    return finish_outputs(a, tasks_to_json(rows), tasks_to_csv(rows), failures);
}

int default_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return (int)std::max(1u, std::min(n, 8u));
}

// --tri-calibrate FILE: TriAttention's offline calibration (the paper's): the query statistics of
// a full-KV pass over the first min(context, 4096) tokens of FILE, given to every triattention
// policy with tri_stats=given (kvp_query_stats_set).
bool setup_tri_calibration(const Args &a, const Checkpoint &ck, std::string *err) {
    static std::vector<float> stats;
    if (!a.has("tri-calibrate")) return true;
    std::vector<int32_t> toks;
    if (!model_tokens(ck, a.get("tri-calibrate"), &toks, err)) return false;
    const size_t n = std::min<size_t>(toks.size(), (size_t)std::min(ck.cfg.seq_len > 0 ? ck.cfg.seq_len : 4096, 4096));
    if (n < 2) {
        *err = "--tri-calibrate: the text has fewer than 2 tokens";
        return false;
    }
    toks.resize(n);
    uint32_t units = 0;
    if (!calibrate_query_stats(ck, toks, &stats, &units, err)) return false;
    Session::set_given_query_stats(&stats);
    return true;
}

// --duo-roles FILE: a DuoAttention role table (kvprune duo-calibrate) for every Session's cache.
bool setup_duo_roles(const Args &a, const Checkpoint &ck, std::string *err) {
    static std::vector<uint8_t> roles;
    if (!a.has("duo-roles")) return true;
    std::string text;
    if (!read_text_file(a.get("duo-roles"), &text, err)) return false;
    if (!parse_duo_roles(text, ck.cfg, &roles, err)) {
        *err = "--duo-roles " + a.get("duo-roles") + ": " + *err;
        return false;
    }
    Session::set_duo_roles(&roles);
    return true;
}

int cmd_task(const Args &a) {
    for (const char *k : {"tokens", "prefill", "preset", "random-lazy"})
        if (a.has(k)) return usage_error("eval", std::string("--") + k + " does not apply to --task", kUsageTask);
    TaskGrid g;
    std::vector<std::string> items;
    if (!split_list(a.get("task"), &g.tasks)) return usage_error("eval", "--task takes names separated by commas", kUsageTask);
    for (const std::string &t : g.tasks) {
        bool known = false;
        for (const char *n : kTaskNames) known = known || t == n;
        if (!known) return usage_error("eval", "unknown task '" + t + "' (known: passkey, niah, niah-multikey, recall)", kUsageTask);
    }
    if (!split_list(a.get("lengths", "256,512,1000"), &items))
        return usage_error("eval", "--lengths takes integers separated by commas", kUsageTask);
    for (const std::string &x : items) {
        long long v = 0;
        if (!to_int(x, 1, INT32_MAX, &v)) return usage_error("eval", "--lengths: '" + x + "' is not a positive integer", kUsageTask);
        g.lengths.push_back((int)v);
    }
    if (!split_list(a.get("depths", "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1"), &items))
        return usage_error("eval", "--depths takes numbers separated by commas", kUsageTask);
    for (const std::string &x : items) {
        double d = 0;
        if (!to_num(x, &d) || d < 0 || d > 1) return usage_error("eval", "--depths: '" + x + "' is not a number in [0, 1]", kUsageTask);
        g.depths.push_back(d);
    }
    if (!split_list(a.get("compression-ratio", "0.5,0.75,0.875"), &items))
        return usage_error("eval", "--compression-ratio takes numbers separated by commas", kUsageTask);
    for (const std::string &x : items) {
        double r = 0;
        if (!to_num(x, &r) || r < 0 || r >= 1)
            return usage_error("eval", "--compression-ratio: '" + x + "' is not a number in [0, 1)", kUsageTask);
        g.ratios.push_back(r);
    }
    long long samples = 1, seed = 0, threads = default_threads();
    if (a.has("samples") && !to_int(a.get("samples"), 1, 1000000, &samples))
        return usage_error("eval", "--samples must be a positive integer", kUsageTask);
    if (a.has("seed") && !to_int(a.get("seed"), 0, INT64_MAX, &seed))
        return usage_error("eval", "--seed must be a non-negative integer", kUsageTask);
    if (a.has("threads") && !to_int(a.get("threads"), 1, 256, &threads))
        return usage_error("eval", "--threads must be an integer in 1..256", kUsageTask);
    g.samples = (int)samples;
    g.seed = (uint64_t)seed;
    g.threads = (int)threads;
    const std::string setting = a.get("setting", "both");
    if (setting == "both") g.settings = {kSettings[0], kSettings[1]};
    else if (setting == kSettings[0] || setting == kSettings[1]) g.settings = {setting};
    else return usage_error("eval", "--setting must be query-aware, query-agnostic or both", kUsageTask);
    std::string err;
    Checkpoint ck;
    if (!load_checkpoint(a.get("model", bundled(kDefaultTaskModel)), &ck, &err)) return error("eval", err);
    if (!setup_tri_calibration(a, ck, &err)) return error("eval", err);
    if (!setup_duo_roles(a, ck, &err)) return error("eval", err);
    std::string text;
    if (!read_text_file(a.get("text", bundled(kDefaultText)), &text, &err)) return error("eval", err);
    // The full-KV baseline runs with any --policy list (issue 29); the defaults are every policy.
    g.specs = task_specs_with_baseline(ck, a.has("policy") ? a.all("policy") : default_task_specs(), g.lengths);
    g.model_name = display_name(a, "model", kDefaultTaskModel);
    g.text_name = display_name(a, "text", kDefaultText);
    std::vector<TaskResult> rows;
    if (!expand_task_grid(ck, text, g, &rows, &err)) return error("eval", err);
    if (a.has("port-rows") && a.has("port-results"))
        return usage_error("eval", "--port-rows and --port-results are two steps (ports/llama.cpp/tasks.sh)", kUsageTask);
    if (a.has("port-rows")) {  // the grid's prompts for llama.cpp (the port's llama-kvp-tasks); nothing runs here
        if (!write_port_rows(ck, text, rows, a.get("port-rows"), &err)) return error("eval", err);
        std::fprintf(stderr, "kvprune eval: %zu rows written to %s\n", rows.size(), a.get("port-rows").c_str());
        return 0;
    }
    if (a.has("port-results")) {  // what llama.cpp with the port answered, scored and reported as a run here is
        std::string data;
        if (!read_text_file(a.get("port-results"), &data, &err) ||
            !read_port_results(ck, text, data, a.get("port-results"), &rows, &err))
            return error("eval", err);
        std::printf("%s", task_report(rows).c_str());
        std::printf("%zu cells run by llama.cpp with the kvprune port (%s)\n", rows.size(), a.get("port-results").c_str());
        return finish_task(a, rows, "");
    }
    TaskBar bar;
    bar.on = !a.has("no-progress");
    bar.tty = isatty(2) != 0;
    if (a.has("progress-every") && !to_num(a.get("progress-every"), &bar.every))
        return usage_error("eval", "--progress-every must be a number of seconds >= 0", kUsageTask);
    std::fprintf(stderr, "kvprune eval: %zu cells (%zu tasks x %zu policies/ratios x %zu settings x %zu lengths x %zu depths x %d samples) on %d threads\n",
                 rows.size(), g.tasks.size(), rows.size() / (g.tasks.size() * g.settings.size() * g.lengths.size() * g.depths.size() * g.samples),
                 g.settings.size(), g.lengths.size(), g.depths.size(), g.samples, g.threads);
    print_task_estimate(ck, text, rows, g.threads, a.has("lengths") || a.has("depths") || a.has("policy"));
    const auto t0 = std::chrono::steady_clock::now();
    std::string failures;
    if (!run_task_rows(ck, text, &rows, g.threads, &failures, [&bar](size_t d, size_t t) { bar(d, t); })) {}
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (a.has("answers")) {  // one line per cell: what the model answered, right or wrong, and the bytes kept
        size_t w = 6;
        for (const TaskResult &r : rows) w = std::max(w, r.policy.size());
        std::printf("%-*s  %-14s %5s %5s  %-10s %-10s %-5s %9s\n", (int)w, "policy", "setting", "len", "depth", "expected",
                    "answered", "", "live KiB");
        for (const TaskResult &r : rows) {
            std::string shown;
            for (char c : r.generated) shown += (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?';
            std::printf("%-*s  %-14s %5lld %5.2f  %-10s %-10s %-5s %9.0f\n", (int)w, r.policy.c_str(), r.setting.c_str(),
                        (long long)r.length, r.depth, r.answer.c_str(), ("'" + shown + "'").c_str(),
                        r.correct ? "right" : "WRONG", (double)r.live_bytes / 1024);
        }
        std::printf("\n");
    }
    std::printf("%s", task_report(rows).c_str());
    std::printf("%zu cells in %.1f s on %d threads\n", rows.size(), secs, g.threads);
    return finish_task(a, rows, failures);
}

int cmd_task_replay(const Args &a, const std::string &in, const std::string &json) {
    std::vector<TaskResult> all_rows, old;
    std::string err;
    if (!parse_task_json(json, &all_rows, &err)) return error("eval", in + ": " + err);
    long long every = 1;
    if (a.has("replay-every") && !to_int(a.get("replay-every"), 1, INT32_MAX, &every))
        return usage_error("eval", "--replay-every must be a positive integer", kUsageEval);
    for (size_t i = 0; i < all_rows.size(); i += (size_t)every) old.push_back(all_rows[i]);  // rows 0, K, 2K, ...
    if (old.empty()) return error("eval", in + ": no rows to replay");
    // Rows of one (model, text) run together; rows keep their order.
    std::vector<TaskResult> fresh = old;
    std::string failures;
    std::map<std::pair<std::string, std::string>, std::vector<size_t>> groups;
    for (size_t i = 0; i < old.size(); i++) groups[{old[i].model, old[i].text}].push_back(i);
    long long threads = default_threads();
    if (a.has("threads") && !to_int(a.get("threads"), 1, 256, &threads))
        return usage_error("eval", "--threads must be an integer in 1..256", kUsageEval);
    for (const auto &grp : groups) {
        Checkpoint ck;
        if (!load_checkpoint(find_data_file(grp.first.first), &ck, &err)) return error("eval", err);
        std::string text;
        if (!read_text_file(find_data_file(grp.first.second), &text, &err)) return error("eval", err);
        std::vector<TaskResult> rows;
        for (size_t i : grp.second) rows.push_back(old[i]);
        std::string e;
        if (!run_task_rows(ck, text, &rows, (int)threads, &e)) failures += (failures.empty() ? "" : "\n") + e;
        for (size_t j = 0; j < rows.size(); j++) fresh[grp.second[j]] = rows[j];
    }
    int diffs = 0;
    for (size_t i = 0; i < old.size(); i++) {
        std::string d;
        if (!same_task_figures(old[i], fresh[i], &d)) {
            ++diffs;
            std::fprintf(stderr, "kvprune eval: row %zu '%s' %s %s L=%lld depth=%g: %s\n", i, old[i].policy.c_str(),
                         old[i].task.c_str(), old[i].setting.c_str(), (long long)old[i].length, old[i].depth, d.c_str());
        }
    }
    std::printf("replay of %s: %zu rows, %d differ\n", in.c_str(), old.size(), diffs);
    if (every > 1) std::printf("(every %lld-th of its %zu rows)\n", every, all_rows.size());
    const int rc = finish_task(a, fresh, failures);
    return rc ? rc : (diffs ? 1 : 0);
}

int cmd_eval(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2,
                    {"model", "text", "tokens", "prefill", "policy", "json", "csv", "preset", "replay", "progress-every", "random-lazy",
                     "task", "lengths", "depths", "samples", "seed", "setting", "compression-ratio", "threads", "replay-every",
                     "tri-calibrate", "duo-roles", "port-rows", "port-results"},
                    {"no-progress", "answers"}, &a))
        return usage_error("eval", a.err, kUsageEval);
    if (a.help) return help(kUsageEval);
    std::string err;
    if (!policies_nonempty(a, &err)) return usage_error("eval", err, kUsageEval);
    double every = 10;
    if (a.has("progress-every") && (!to_num(a.get("progress-every"), &every) || every < 0))
        return usage_error("eval", "--progress-every must be a number of seconds >= 0", kUsageEval);
    // Output paths first: a typo must not cost a long run.
    for (const char *k : {"json", "csv"})
        if (a.has(k) && !check_writable(a.get(k), &err)) return error("eval", "--" + std::string(k) + ": " + err);
    if (a.has("task")) return cmd_task(a);
    for (const char *k : {"lengths", "depths", "samples", "seed", "setting", "compression-ratio", "answers", "port-rows", "port-results"})
        if (a.has(k)) return usage_error("eval", std::string("--") + k + " applies to --task only", kUsageEval);
    if (a.has("threads") && !a.has("replay")) return usage_error("eval", "--threads applies to --task and --replay only", kUsageEval);
    if (a.has("replay-every") && !a.has("replay")) return usage_error("eval", "--replay-every applies to --replay only", kUsageEval);
    if (a.has("replay")) {
        if (a.has("preset") || a.has("policy") || a.has("tokens") || a.has("prefill") || a.has("model") || a.has("text"))
            return usage_error("eval", "--replay takes everything from the results file", kUsageEval);
        return cmd_replay(a);
    }
    Checkpoint ck;
    if (!load_checkpoint(a.get("model", bundled(kDefaultModel)), &ck, &err)) return error("eval", err);
    std::vector<int32_t> toks;
    if (!model_tokens(ck, a.get("text", bundled(kDefaultText)), &toks, &err)) return error("eval", err);
    if (!setup_tri_calibration(a, ck, &err)) return error("eval", err);
    if (!setup_duo_roles(a, ck, &err)) return error("eval", err);
    ProgressBar bar;
    bar.every = every;
    bar.mode = a.has("no-progress") ? ProgressBar::kOff : (isatty(2) ? ProgressBar::kBar : ProgressBar::kLines);
    std::vector<EvalResult> all;
    std::string failures;
    const std::string model_name = display_name(a, "model", kDefaultModel), text_name = display_name(a, "text", kDefaultText);
    auto progress = [&bar](size_t i, int64_t d, int64_t t) { bar(i, d, t); };

    if (a.has("preset")) {
        if (a.get("preset") != "longctx")
            return usage_error("eval", "unknown preset '" + a.get("preset") + "' (known: longctx)", kUsageEval);
        if (a.has("tokens") || a.has("prefill") || a.has("policy"))
            return usage_error("eval", "--preset longctx sets --tokens, --prefill and --policy itself", kUsageEval);
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
            bar.runs = eval_runs(ck, N, specs);
            bar.cur = (size_t)-1;
            bar.done_before = 0;
            bar.t0 = std::chrono::steady_clock::now();
            std::vector<EvalResult> rs;
            if (!run_eval(ck, toks, N, P, specs, &rs, &err, progress)) return error("eval", err);
            table += strprintf("| %d (%dx) | %d | %.3f | %.3f | %.3f |\n", N, mult, P, rs[0].nll, rs[1].nll, rs[2].nll);
            all.insert(all.end(), rs.begin(), rs.end());
        }
        for (EvalResult &r : all) {
            r.model = model_name;
            r.text = text_name;
        }
        std::printf("%s\nlong-context preset, mean NLL (nats/token) of tokens n/4..n-1, model %s (context %d):\n%s",
                    to_table(all).c_str(), ck.path.c_str(), ctx, table.c_str());
    } else {
        long long N = 1024, P = -1;
        if (a.has("tokens") && !to_int(a.get("tokens"), 2, INT32_MAX, &N))
            return usage_error("eval", "--tokens must be an integer >= 2", kUsageEval);
        if (a.has("prefill") && !to_int(a.get("prefill"), 1, INT32_MAX, &P))
            return usage_error("eval", "--prefill must be a positive integer", kUsageEval);
        if (P < 0) P = std::max(1LL, N / 4);
        std::vector<std::string> specs = a.all("policy");
        if (specs.empty()) specs = {full_reference_spec((int)N), kStreamSpec};
        bar.names = specs;
        bar.runs = eval_runs(ck, (int)N, specs);
        if (!run_eval(ck, toks, (int)N, (int)P, specs, &all, &err, progress)) {
            if (all.empty() && err.find("policy '") != 0) return error("eval", err);  // N/P out of range
            failures = err;
        }
        if (a.has("random-lazy")) {  // SimLayerKV's baseline: as many layers, chosen at random
            long long seed = 0;
            if (!to_int(a.get("random-lazy"), 0, INT64_MAX, &seed))
                return usage_error("eval", "--random-lazy must be a non-negative integer seed", kUsageEval);
            std::vector<std::string> extra;
            for (const EvalResult &r : all)
                if (r.spec.find("policy=simlayerkv") != std::string::npos && r.spec.find("lazy_force=") == std::string::npos &&
                    !r.lazy_layers.empty() && r.n_layers <= 32)
                    extra.push_back(r.policy + " lazy_force=" +
                                    std::to_string(random_lazy_mask(r.n_layers, (int)r.lazy_layers.size(), (uint64_t)seed)));
            if (!extra.empty()) {
                std::vector<EvalResult> more;
                std::string e2;
                bar.names = extra;
                bar.runs = eval_runs(ck, (int)N, extra);
                if (!run_eval(ck, toks, (int)N, (int)P, extra, &more, &e2, progress)) failures += e2;
                all.insert(all.end(), more.begin(), more.end());
            }
        }
        for (EvalResult &r : all) {
            r.model = model_name;
            r.text = text_name;
        }
        if (!all.empty()) std::printf("%s", to_table(all).c_str());
        for (const EvalResult &r : all) std::printf("  %s: %s\n", r.policy.c_str(), layer_note(r).c_str());
    }
    return finish_eval(a, all, failures);
}

// ---------------------------------------------------------------- plot, report

bool read_results(const std::string &cmd, const std::string &in, std::vector<EvalResult> *rs, int *rc) {
    std::string err;
    struct stat st;
    if (stat(in.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
        *rc = error(cmd, "'" + in + "' is not a regular file");
        return false;
    }
    std::ifstream f(in, std::ios::binary);
    if (!f) {
        *rc = error(cmd, "cannot open '" + in + "': " + std::strerror(errno));
        return false;
    }
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
        *rc = error(cmd, "'" + in + "' is empty (expected the JSON of `kvprune eval --json`)");
        return false;
    }
    if (!parse_results_json(text, rs, &err)) {
        *rc = error(cmd, in + ": " + err);
        return false;
    }
    if (rs->empty()) {
        *rc = error(cmd, "'" + in + "' holds no results (an empty array)");
        return false;
    }
    return true;
}

// A task results file (rows with a "task" field): read as such, or "" when it holds eval rows.
bool read_task_results(const std::string &cmd, const std::string &in, std::vector<TaskResult> *rs, bool *is_task, int *rc) {
    std::ifstream f(in, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    *is_task = f && is_task_results(text);
    if (!*is_task) return true;
    std::string err;
    if (!parse_task_json(text, rs, &err)) {
        *rc = error(cmd, in + ": " + err);
        return false;
    }
    return true;
}

int cmd_duo_calibrate(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"model", "text", "length", "samples", "seed", "streaming", "out"}, {}, &a))
        return usage_error("duo-calibrate", a.err, kUsageDuo);
    if (a.help) return help(kUsageDuo);
    if (!a.has("out")) return usage_error("duo-calibrate", "--out FILE is required", kUsageDuo);
    long long length = 256, samples = 8, seed = 0;
    double frac = 0.5;
    if (a.has("length") && !to_int(a.get("length"), 1, INT32_MAX, &length))
        return usage_error("duo-calibrate", "--length must be a positive integer", kUsageDuo);
    if (a.has("samples") && !to_int(a.get("samples"), 1, 100000, &samples))
        return usage_error("duo-calibrate", "--samples must be a positive integer", kUsageDuo);
    if (a.has("seed") && !to_int(a.get("seed"), 0, INT64_MAX, &seed))
        return usage_error("duo-calibrate", "--seed must be a non-negative integer", kUsageDuo);
    if (a.has("streaming") && (!to_num(a.get("streaming"), &frac) || frac < 0 || frac > 1))
        return usage_error("duo-calibrate", "--streaming must be a fraction in [0, 1]", kUsageDuo);
    std::string err;
    if (!check_writable(a.get("out"), &err)) return error("duo-calibrate", "--out: " + err);
    Checkpoint ck;
    if (!load_checkpoint(a.get("model", bundled(kDefaultTaskModel)), &ck, &err)) return error("duo-calibrate", err);
    if (ck.cfg.vocab != 256 && !ck.tok)
        return error("duo-calibrate", "passkey prompts need a byte-level model (vocab 256) or a model with a tokenizer");
    std::string text;
    if (!read_text_file(a.get("text", bundled(kDefaultText)), &text, &err)) return error("duo-calibrate", err);
    const std::vector<int32_t> text_ids = ck.tok ? task_text_ids(*ck.tok, text) : std::vector<int32_t>();
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::pair<int, int>> needle;
    std::vector<int> question_at;
    for (long long i = 0; i < samples; i++) {
        const double depth = samples == 1 ? 0.5 : (double)i / (double)(samples - 1);
        TaskPrompt p;
        if (ck.tok ? !make_task_prompt_tokens("passkey", *ck.tok, text_ids, (int)length, depth, (int)i, (uint64_t)seed, &p, &err)
                   : !make_task_prompt("passkey", text, (int)length, depth, (int)i, (uint64_t)seed, &p, &err))
            return error("duo-calibrate", err);
        std::vector<int32_t> ids;
        int nlen = 0;
        if (p.tokens()) {
            ids = p.context_ids;
            ids.insert(ids.end(), p.question_ids.begin(), p.question_ids.end());
            nlen = (int)ck.tok->encode(p.needle, false, false).size();
        } else {
            for (char c : p.context) ids.push_back((unsigned char)c);
            for (char c : p.question) ids.push_back((unsigned char)c);
            nlen = (int)p.needle.size();
        }
        prompts.push_back(ids);
        needle.push_back({(int)p.needle_at, (int)p.needle_at + nlen});
        question_at.push_back((int)(p.tokens() ? p.context_ids.size() : p.context.size()));
    }
    std::vector<double> mass;
    if (!calibrate_duo_mass(ck, prompts, needle, question_at, &mass, &err)) return error("duo-calibrate", err);
    const std::vector<uint8_t> roles = duo_roles_from_mass(mass, frac);
    const uint32_t L = (uint32_t)ck.cfg.n_layers, H = (uint32_t)ck.cfg.n_kv_heads;
    size_t streaming = 0;
    for (uint8_t r : roles) streaming += r == KVP_HEAD_STREAMING;
    char comment[256];
    std::snprintf(comment, sizeof comment, "model %s, %lld passkey prompts of %lld tokens, seed %lld, streaming fraction %g",
                  display_name(a, "model", kDefaultTaskModel).c_str(), samples, length, seed, frac);
    if (!write_file(a.get("out"), duo_roles_file(roles, mass, L, H, comment), &err)) return error("duo-calibrate", err);
    std::printf("layer kv_head  needle mass  role\n");
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++)
            std::printf("%5u %7u  %11.4f  %s\n", l, h, mass[(size_t)l * H + h],
                        roles[(size_t)l * H + h] == KVP_HEAD_STREAMING ? "streaming" : "retrieval");
    std::printf("%zu of %zu heads streaming; role table written to %s\n", streaming, roles.size(), a.get("out").c_str());
    return 0;
}

int cmd_plot(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"in", "out", "format", "x", "kind", "task", "setting"}, {}, &a))
        return usage_error("plot", a.err, kUsagePlot);
    if (a.help) return help(kUsagePlot);
    if (!a.has("in") || !a.has("out")) return usage_error("plot", "--in and --out are required", kUsagePlot);
    PlotOptions o;
    o.x = a.get("x", "auto");
    if (o.x != "auto" && o.x != "bytes" && o.x != "n")
        return usage_error("plot", "--x must be auto, bytes or n", kUsagePlot);
    const std::string out = a.get("out");
    o.format = plot_format(out == "-" ? "" : out, a.get("format"));
    std::string err;
    if (!check_plot_output(out, o.format, isatty(1) != 0, &err)) return error("plot", err);
    std::vector<EvalResult> rs;
    std::vector<TaskResult> ts;
    int rc = 0;
    bool is_task = false;
    if (!read_task_results("plot", a.get("in"), &ts, &is_task, &rc)) return rc;
    if (is_task) {  // task rows (kvprune eval --task) have their own plots
        const std::string kind = a.get("kind", "heatmap");
        if (kind != "heatmap" && kind != "memory") return usage_error("plot", "--kind must be heatmap or memory", kUsagePlot);
        const std::string task = a.get("task", ts[0].task);
        // --setting as eval takes it: one setting or both (the heatmap's default: the first row's; the
        // memory plot's: every setting, a panel each)
        const std::string setting = a.get("setting", kind == "memory" ? "both" : ts[0].setting);
        if (setting != kSettings[0] && setting != kSettings[1] && setting != "both")
            return usage_error("plot", "--setting must be query-aware, query-agnostic or both", kUsagePlot);
        if (kind == "memory" && setting != "both")
            ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const TaskResult &t) { return t.setting != setting; }), ts.end());
        size_t n = 0;
        for (const TaskResult &t : ts) n += t.task == task && (setting == "both" || t.setting == setting);
        if (!n) return error("plot", "no rows for task '" + task + "'" + (setting != "both" ? " and setting '" + setting + "'" : ""));
        int w = 0, h = 0;
        auto make = [&](const std::string &file) {
            return kind == "heatmap" ? task_heatmap_script(ts, task, setting, file, &w, &h)
                                     : task_memory_script(ts, task, file, &w, &h);
        };
        make("");  // the size
        if (!render_plot(make, out, o.format, w, h, &err)) return error("plot", err);
        std::fprintf(out == "-" ? stderr : stdout, "wrote %s (%s, %s of %s, %zu cells)\n", out == "-" ? "stdout" : out.c_str(),
                     o.format.c_str(), kind.c_str(), task.c_str(), n);
        return 0;
    }
    if (a.has("kind") || a.has("task") || a.has("setting"))
        return usage_error("plot", "--kind, --task and --setting apply to task results (kvprune eval --task)", kUsagePlot);
    if (!read_results("plot", a.get("in"), &rs, &rc)) return rc;
    if (!plot_results(rs, out, o, &err)) return error("plot", err);
    std::fprintf(out == "-" ? stderr : stdout, "wrote %s (%s, %zu points, x axis: %s)\n",
                 out == "-" ? "stdout" : out.c_str(), o.format.c_str(), rs.size(),
                 plot_x_axis(rs, o) == "n" ? "N" : "live KV bytes");
    return 0;
}

int cmd_report(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"in"}, {}, &a)) return usage_error("report", a.err, kUsageReport);
    if (a.help) return help(kUsageReport);
    if (!a.has("in")) return usage_error("report", "--in is required", kUsageReport);
    std::vector<EvalResult> rs;
    std::vector<TaskResult> ts;
    int rc = 0;
    bool is_task = false;
    if (!read_task_results("report", a.get("in"), &ts, &is_task, &rc)) return rc;
    if (is_task) {
        std::printf("%s", task_report(ts).c_str());
        return 0;
    }
    if (!read_results("report", a.get("in"), &rs, &rc)) return rc;
    std::printf("%s", to_markdown(rs).c_str());
    return 0;
}

// ---------------------------------------------------------------- keys

const char *kPolicyNames[] = {"full", "window", "streaming", "h2o", "snapkv", "pyramidkv", "lethe", "simlayerkv", "asl", "think", "random", "triattention"};
constexpr int kNumPolicies = int(sizeof kPolicyNames / sizeof *kPolicyNames);

int cmd_keys(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"policy"}, {"markdown"}, &a)) return usage_error("keys", a.err, kUsageKeys);
    if (a.help) return help(kUsageKeys);
    int only = -1;
    if (a.has("policy")) {
        for (int p = 0; p < kNumPolicies; p++)
            if (a.get("policy") == kPolicyNames[p]) only = p;
        if (only < 0) {
            std::string names;
            for (const char *n : kPolicyNames) names += (names.empty() ? "" : "|") + std::string(n);
            return usage_error("keys", "--policy must be one of " + names, kUsageKeys);
        }
    }
    const bool md = a.has("markdown");
    struct Row {
        std::string key, type, def, range, used, help;
    };
    std::vector<Row> rows;
    for (uint32_t i = 0; i < kvp_config_key_count(); i++) {
        kvp_key_info k;
        k.struct_size = sizeof k;
        if (kvp_config_key(i, &k) != KVP_OK) return error("keys", "kvp_config_key failed");
        if (only >= 0 && !(k.policies & KVP_POLICY_BIT(only))) continue;
        Row r;
        r.key = k.name;
        r.type = k.type == KVP_KEY_UINT ? "uint" : k.type == KVP_KEY_FLOAT ? "float" : "enum";
        if (k.type == KVP_KEY_ENUM) {
            r.def = k.default_name;
            r.range = k.values;
        } else if (k.type == KVP_KEY_UINT) {
            r.def = strprintf("%.0f", k.default_value);
            r.range = strprintf("%.0f..%.0f", k.min, k.max);
        } else {
            r.def = strprintf("%g", k.default_value);
            r.range = strprintf("%g..%g", k.min, k.max);
        }
        if (k.policies == KVP_POLICY_ALL) {
            r.used = "all";
        } else {
            for (int p = 0; p < kNumPolicies; p++)
                if (k.policies & KVP_POLICY_BIT(p)) r.used += (r.used.empty() ? "" : ",") + std::string(kPolicyNames[p]);
        }
        r.help = k.help;
        rows.push_back(r);
    }
    if (md) {
        std::printf("| key | type | default | range / values | used by | meaning |\n|---|---|---|---|---|---|\n");
        for (const Row &r : rows) {
            std::string range = r.range;
            for (size_t p = 0; (p = range.find('|', p)) != std::string::npos; p += 2) range.replace(p, 1, "\\|");
            std::printf("| `%s` | %s | %s | %s | %s | %s |\n", r.key.c_str(), r.type.c_str(), r.def.c_str(),
                        range.c_str(), r.used.c_str(), r.help.c_str());
        }
        return 0;
    }
    size_t w[5] = {3, 4, 7, 14, 7};
    for (const Row &r : rows) {
        w[0] = std::max(w[0], r.key.size());
        w[1] = std::max(w[1], r.type.size());
        w[2] = std::max(w[2], r.def.size());
        w[3] = std::max(w[3], r.range.size());
        w[4] = std::max(w[4], std::min<size_t>(r.used.size(), 24));
    }
    std::printf("%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", (int)w[0], "key", (int)w[1], "type", (int)w[2], "default", (int)w[3],
                "range / values", (int)w[4], "used by", "meaning");
    for (const Row &r : rows)
        std::printf("%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", (int)w[0], r.key.c_str(), (int)w[1], r.type.c_str(), (int)w[2],
                    r.def.c_str(), (int)w[3], r.range.c_str(), (int)w[4], r.used.c_str(), r.help.c_str());
    std::printf("\nkeys from the library's table (kvp_config_key, %u keys); a spec is \"key=value key=value ...\".\n"
                "Defaults that depend on other keys follow them when the spec does not give them (budget follows a\n"
                "smaller capacity, recent a smaller budget, window and then sinks a capacity with less room): a default\n"
                "never makes a valid value fail.\n"
                "compression_ratio=r and ratio_tokens=N are apply-only keys (no field): the library maps r to each\n"
                "policy's budget/window (table above); the CLI sets ratio_tokens to the sequence length (docs/harness.md).\n",
                kvp_config_key_count());
    return 0;
}

// ---------------------------------------------------------------- tokenize

bool is_gguf(const std::string &path) {
    char magic[4] = {0, 0, 0, 0};
    std::ifstream f(path, std::ios::binary);
    return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

void print_tokenizer(const Tokenizer &t) {
    std::printf("tokenizer      %s%s%s, %d tokens, bos %d, eos %d, add_bos %s\n", t.model_name().c_str(),
                t.kind() == Tokenizer::kBpe ? ", pre " : "", t.kind() == Tokenizer::kBpe ? t.pre().c_str() : "", t.size(), t.bos,
                t.eos, t.add_bos ? "yes" : "no");
}

// `info` on a GGUF file without tensors (llama.cpp's vocabulary files): 1 when printed, -1 on a
// bad tokenizer, 0 for any other file (the model path).
int info_vocab_only(const std::string &path) {
    if (!is_gguf(path)) return 0;
    GgufFile f;
    std::string err;
    if (!f.open(path, &err) || !f.tensors().empty()) return 0;
    std::shared_ptr<const Tokenizer> t;
    if (!Tokenizer::from_gguf(f, 0, &t, &err)) {
        error("info", err);
        return -1;
    }
    std::string arch, name;
    f.get_str("general.architecture", &arch);
    f.get_str("general.name", &name);
    std::printf("model          %s\n", path.c_str());
    std::printf("format         gguf v%u, vocabulary only: no tensors (%zu bytes)\n", f.version(), f.file_size());
    std::printf("architecture   %s%s%s\n", arch.empty() ? "(none)" : arch.c_str(), name.empty() ? "" : ", name: ", name.c_str());
    if (t) print_tokenizer(*t);
    else std::printf("tokenizer      none\n");
    return 1;
}

int cmd_tokenize(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"model", "text", "file"}, {"chunks", "bos", "special"}, &a))
        return usage_error("tokenize", a.err, kUsageTokenize);
    if (a.help) return help(kUsageTokenize);
    if (!a.has("model")) return usage_error("tokenize", "--model is required", kUsageTokenize);
    if (a.has("text") == a.has("file")) return usage_error("tokenize", "give one of --text and --file", kUsageTokenize);
    const std::string path = a.get("model");
    std::string err, text = a.get("text");
    if (!is_gguf(path)) return error("tokenize", "'" + path + "' is not a GGUF file (tokenize reads a GGUF file's tokenizer)");
    GgufFile f;
    if (!f.open(path, &err)) return error("tokenize", err);
    std::shared_ptr<const Tokenizer> t;
    if (!Tokenizer::from_gguf(f, 0, &t, &err)) return error("tokenize", err);
    if (!t) return error("tokenize", "'" + path + "' has no tokenizer (no tokenizer.ggml.model)");
    if (a.has("file")) {
        std::ifstream in(a.get("file"), std::ios::binary);
        if (!in) return error("tokenize", "cannot read '" + a.get("file") + "'");
        text.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    std::vector<std::string> chunks;
    if (a.has("chunks")) {  // as llama.cpp's test-tokenizer-0 reads its .inp files
        const std::string sep = "\n__ggml_vocab_test__\n";
        for (size_t pos = 0; pos < text.size();) {
            const size_t next = text.find(sep, pos);
            if (next == std::string::npos) {
                chunks.push_back(text.substr(pos));
                break;
            }
            chunks.push_back(text.substr(pos, next - pos));
            pos = next + sep.size();
        }
    } else {
        chunks.push_back(text);
    }
    const bool bos = a.has("bos") && t->add_bos;
    std::string line;
    for (const std::string &c : chunks) {
        line.clear();
        for (int32_t id : t->encode(c, bos, t->add_space_prefix, a.has("special"))) {
            if (!line.empty()) line.push_back(' ');
            line += std::to_string(id);
        }
        line.push_back('\n');
        std::fwrite(line.data(), 1, line.size(), stdout);
    }
    return 0;
}

// ---------------------------------------------------------------- info

int cmd_info(int argc, char **argv) {
    Args a;
    if (!parse_args(argc, argv, 2, {"model"}, {}, &a)) return usage_error("info", a.err, kUsageInfo);
    if (a.help) return help(kUsageInfo);
    std::string err;
    Checkpoint ck;
    if (int rc = info_vocab_only(a.get("model", bundled(kDefaultModel)))) return rc > 0 ? 0 : 1;
    if (!load_checkpoint(a.get("model", bundled(kDefaultModel)), &ck, &err)) return error("info", err);
    const ModelConfig &c = ck.cfg;
    uint64_t params = 0;
    {
        const uint64_t D = (uint64_t)c.dim, L = (uint64_t)c.n_layers;
        params = (uint64_t)c.vocab * D * (c.shared_classifier ? 1 : 2) + D +
                 L * (2 * D + D * (uint64_t)c.q_dim() * 2 + D * (uint64_t)c.kv_dim() * 2 + 3 * D * (uint64_t)c.hidden_dim);
        if (ck.bq) params += L * ((uint64_t)c.q_dim() + 2 * (uint64_t)c.kv_dim());
        if (ck.q_norm) params += L * 2 * (uint64_t)c.head_dim();
    }
    std::printf("model          %s\n", ck.path.c_str());
    std::printf("format         %s (%llu bytes)\n", ck.format.c_str(), (unsigned long long)ck.file_bytes);
    std::printf("architecture   %s%s%s\n", ck.arch.c_str(), ck.name.empty() ? "" : ", name: ", ck.name.c_str());
    std::printf("parameters     %llu (%.3f B)\n", (unsigned long long)params, (double)params * 1e-9);
    std::printf("layers         %d\ndim            %d\nffn hidden     %d\n", c.n_layers, c.dim, c.hidden_dim);
    std::printf("heads          %d query, %d key/value (GQA %d:1), head_dim %d\n", c.n_heads, c.n_kv_heads,
                c.n_heads / c.n_kv_heads, c.head_dim());
    std::printf("vocab          %d (%s output)\n", c.vocab, c.shared_classifier ? "tied" : "separate");
    std::printf("context        %lld\n", (long long)(ck.context_length ? ck.context_length : c.seq_len));
    std::printf("rope           %s, %d dims, theta %g\n", c.rope == KVP_ROPE_NEOX ? "neox (halves)" : "gptj (interleaved pairs)",
                c.rope_dim ? c.rope_dim : c.head_dim(), (double)c.rope_theta);
    if (c.rope_scaling != "none")
        std::printf("rope scaling   %s (per-pair frequency table), attention factor %g\n", c.rope_scaling.c_str(),
                    (double)c.rope_attn_factor);
    std::printf("rms eps        %g\n", (double)c.norm_eps);
    if (ck.bq) std::printf("extras         q/k/v biases\n");
    if (ck.q_norm) std::printf("extras         per-head q/k RMSNorm\n");
    std::string types;
    for (auto &t : ck.weight_types) types += (types.empty() ? "" : ", ") + t.first + " x" + std::to_string(t.second);
    std::printf("weight types   %s\n", ck.format == "gguf" ? types.c_str() : "f32 (llama2.c)");
    // What happens to the weights (docs/harness.md "GGUF models"): matrices of a type other than f32
    // stay in the memory-mapped file and are read in place by the quantized products; norms, biases
    // and f32 matrices are copied into memory as f32.
    {
        std::map<std::string, std::pair<int, double>> mapped;  // type -> matrices, bytes
        const int64_t D = c.dim, Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
        const int64_t rows7[7] = {Q, KV, KV, D, F, D, F};
        auto add = [&](const QView &v, int64_t r) {
            if (!v) return;
            auto &e = mapped[ggml_type_name(v.type)];
            e.first++;
            e.second += (double)v.row_bytes * (double)r;
        };
        for (size_t i = 0; i < ck.qmat.size() && c.n_layers > 0; i++) add(ck.qmat[i], rows7[i / (size_t)c.n_layers]);
        add(ck.qemb, c.vocab);
        if (ck.qcls.data != ck.qemb.data) add(ck.qcls, c.vocab);
        auto size = [](double b) {
            char t[32];
            if (b < 1048576.0) std::snprintf(t, sizeof t, "%.1f KiB", b / 1024.0);
            else std::snprintf(t, sizeof t, "%.1f MiB", b / 1048576.0);
            return std::string(t);
        };
        std::printf("in memory      %s of f32 (%s, copied on load)\n", size((double)ck.data.size() * 4).c_str(),
                    ck.format == "gguf" ? "norms, biases and f32 matrices" : "every weight");
        for (auto &m : mapped)
            std::printf("mapped         %s: %d matrices, %s, read in place from the file (not dequantized)\n", m.first.c_str(),
                        m.second.first, size(m.second.second).c_str());
    }
    if (ck.tok) {
        std::printf("tokenizer      %s%s%s, %d tokens, bos %d, eos %d, add_bos %s\n", ck.tok->model_name().c_str(),
                    ck.tok->kind() == Tokenizer::kBpe ? ", pre " : "", ck.tok->kind() == Tokenizer::kBpe ? ck.tok->pre().c_str() : "",
                    ck.tok->size(), ck.tok->bos, ck.tok->eos, ck.tok->add_bos ? "yes" : "no");
    } else {
        std::printf("tokenizer      none (%s)\n", c.vocab == 256 ? "text as bytes" : "whitespace-separated token ids");
    }
    // KV bytes per token: raw K+V of every layer, and what kvprune's arena grows by per token slot
    // (kvp_arena_size at two capacities: scales, residual groups and bookkeeping included).
    const double raw = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim();
    std::printf("kv bytes/token ");
    const char *names[4] = {"f32", "f16", "q8", "q4"};
    const double width[4] = {4, 2, 1, 0.5};
    for (int i = 0; i < 4; i++) {
        kvp_config c1, c2;
        std::string e1, e2;
        const std::string spec = std::string("policy=full kv_dtype=") + names[i] + " capacity=";
        double arena = -1;
        if (parse_policy(c, spec + "1024", &c1, &e1) && parse_policy(c, spec + "2048", &c2, &e2))
            arena = ((double)kvp_arena_size(&c2) - (double)kvp_arena_size(&c1)) / 1024.0;
        std::printf("%s%s %.0f raw, %.1f arena", i ? "; " : "", names[i], raw * width[i], arena);
    }
    std::printf("\n");
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::string cmd = argc > 1 ? argv[1] : "run";
    if (cmd == "run") return cmd_run(argc, argv);
    if (cmd == "eval") return cmd_eval(argc, argv);
    if (cmd == "plot") return cmd_plot(argc, argv);
    if (cmd == "duo-calibrate") return cmd_duo_calibrate(argc, argv);
    if (cmd == "keys") return cmd_keys(argc, argv);
    if (cmd == "report") return cmd_report(argc, argv);
    if (cmd == "info") return cmd_info(argc, argv);
    if (cmd == "tokenize") return cmd_tokenize(argc, argv);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
        std::printf("%s", usage_all().c_str());
        return 0;
    }
    if (cmd == "version" || cmd == "--version") {
        std::printf("kvprune %s\n", library_version().c_str());
        return 0;
    }
    std::fprintf(stderr, "kvprune: unknown command '%s'\n%s", cmd.c_str(), usage_all().c_str());
    return 2;
}
