// Teacher-forced quality evaluation of kvprune policies on a checkpoint.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint.h"

namespace kvh {

// Reads a text file as tokens: raw bytes for a byte-level model (vocab 256), otherwise
// whitespace-separated decimal token ids (there is no tokenizer for other vocabularies).
bool load_tokens(const std::string &path, int vocab, std::vector<int32_t> *out, std::string *err);
// Same for an in-memory string (the --prompt of `kvprune run`).
bool parse_tokens(const std::string &text, int vocab, std::vector<int32_t> *out, std::string *err);

// One row of the results (JSON/CSV): everything a reader needs to reproduce it.
struct EvalResult {
    std::string policy;           // the spec as given
    std::string spec;             // the spec as applied (compression_ratio resolved)
    std::string model;            // checkpoint file (as given, or the bundled model's file name)
    std::string text;             // text file (same convention)
    int64_t tokens = 0;           // N: tokens fed (P by kvp_prefill, N-P by kvp_decode)
    int64_t prefill = 0;          // P
    double nll = 0;               // mean NLL (nats/token) of the predictions of tokens P..N-1
    double ppl = 0;               // exp(nll)
    double agreement = 0;         // top-1 agreement with the full policy over the same predictions
    uint64_t live_bytes = 0;      // kvp_stats after the last token
    uint64_t peak_live_bytes = 0;
    uint64_t arena_bytes = 0;
    uint64_t capacity = 0;        // resolved token slots per layer (largest layer; kvp_layer_capacity)
    uint64_t threads = 1;         // threads of the configuration
    double kv_ratio = 0;          // live_bytes / the f32 K+V bytes of all N tokens in every layer (full KV)
    std::string version;          // kvprune library version, "major.minor.patch"
    double tok_per_s = 0;         // N / wall time of the policy's run (prefill + decode)
    // Not in the JSON (a time, and decisions the figures above already reflect); printed by
    // `kvprune eval` after its table (layer_note):
    double prefill_ms = 0;        // wall time of the prompt's kvp_prefill calls (with the harness's layer math)
    std::vector<int> lazy_layers; // simlayerkv: the lazy layers after the run
    int selection_layer = -1;     // asl: the layer whose prefill made the selection (-1: none)
    int n_layers = 0;
};

// "prefill 12.3 ms; lazy layers 2/5 (0,3); selection layer 2" (the lazy and selection parts for
// simlayerkv / asl rows only).
std::string layer_note(const EvalResult &r);

// The random-layer baseline of SimLayerKV (its paper's comparison): `count` of the `n_layers`
// layers, chosen by a splitmix64 stream seeded with `seed` (partial Fisher-Yates), as a
// lazy_force bit mask (n_layers <= 32).
uint32_t random_lazy_mask(int n_layers, int count, uint64_t seed);

// The deterministic fields of two rows are equal (everything but tok_per_s); *diff names the first
// that is not. nll, ppl, agreement and kv_ratio compare as written to JSON (%.9g).
bool same_figures(const EvalResult &a, const EvalResult &b, std::string *diff);

// Library version as "major.minor.patch".
std::string library_version();

// Progress callback: (policy index, tokens done, tokens total).
using Progress = std::function<void(size_t, int64_t, int64_t)>;

// Runs one policy over tokens[0..N): tokens[0..P) by kvp_prefill (chunked to fit), the rest
// one by one by kvp_decode. Fills r (nll, ppl, bytes, tok/s; agreement left 0) and, when
// argmax is not null, the argmax of the prediction of each token P..N-1.
bool run_policy(const Checkpoint &ck, const std::string &spec, const std::vector<int32_t> &tokens, int N,
                int P, EvalResult *r, std::vector<int32_t> *argmax, std::string *err,
                const Progress &progress = nullptr, size_t index = 0);

// The reference for `agreement`: full KV, original positions, capacity N.
std::string full_reference_spec(int N);

// Runs every spec and the full reference (reused when a spec already is full KV with
// original positions), filling agreement. A spec that fails (invalid, or an error during its run)
// does not stop the others: *results holds the rows of the specs that ran, *err one line per
// failure ("policy '<spec>': <message>"), and the return value is false when anything failed.
// Progress indices: spec i, and specs.size() for an extra reference run.
bool run_eval(const Checkpoint &ck, const std::vector<int32_t> &tokens, int N, int P,
              const std::vector<std::string> &specs, std::vector<EvalResult> *results, std::string *err,
              const Progress &progress = nullptr);

// Runs run_eval will make: the specs, plus the full-KV reference when none of them is one.
size_t eval_runs(const Checkpoint &ck, int N, const std::vector<std::string> &specs);

// Output. JSON: an array of objects with exactly the fields of EvalResult, in its order.
std::string to_json(const std::vector<EvalResult> &rs);
std::string to_csv(const std::vector<EvalResult> &rs);
std::string to_table(const std::vector<EvalResult> &rs);
// Markdown table for docs: policy (as given), N, P, nll, ppl, agreement, live/peak/arena bytes,
// kv_ratio (no tok/s: it is not reproducible).
std::string to_markdown(const std::vector<EvalResult> &rs);

// JSON and CSV pieces shared by the results writers. json_str appends s as a JSON string:
// '"' and '\\' escaped, control bytes as \u00XX, and with `bytes` also 0x7f..0xff (model output
// that need not be UTF-8; the results reader maps \u00XX back to the byte).
void json_str(std::string &o, const std::string &s, bool bytes = false);
// A number as JSON ("null" when not finite).
std::string json_num(double v, const char *f = "%.9g");
// A CSV field in double quotes ('"' doubled).
std::string csv_str(const std::string &s);

// printf into a std::string of any length.
std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// NLL of the predictions of tokens P..N-1 from one kvp_prefill of all N tokens (full KV,
// chunk = N, positions 0..N-1); used by the tests to cross-check the decode path.
bool nll_single_prefill(const Checkpoint &ck, const std::string &spec, const std::vector<int32_t> &tokens,
                        int N, int P, double *nll, std::vector<int32_t> *argmax, std::string *err);

}  // namespace kvh
