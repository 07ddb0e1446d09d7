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

struct EvalResult {
    std::string policy;           // the spec as given
    double nll = 0;               // mean NLL (nats/token) of the predictions of tokens P..N-1
    double ppl = 0;               // exp(nll)
    double agreement = 0;         // top-1 agreement with the full policy over the same predictions
    uint64_t live_bytes = 0;      // kvp_stats after the last token
    uint64_t peak_live_bytes = 0;
    uint64_t arena_bytes = 0;
    int64_t tokens = 0;           // N: tokens fed (P by kvp_prefill, N-P by kvp_decode)
    double tok_per_s = 0;         // N / wall time of the policy's run (prefill + decode)
};

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
// original positions), filling agreement.
bool run_eval(const Checkpoint &ck, const std::vector<int32_t> &tokens, int N, int P,
              const std::vector<std::string> &specs, std::vector<EvalResult> *results, std::string *err,
              const Progress &progress = nullptr);

// Output. JSON: an array of objects with exactly the fields of EvalResult.
std::string to_json(const std::vector<EvalResult> &rs);
std::string to_csv(const std::vector<EvalResult> &rs);
std::string to_table(const std::vector<EvalResult> &rs);

// NLL of the predictions of tokens P..N-1 from one kvp_prefill of all N tokens (full KV,
// chunk = N, positions 0..N-1); used by the tests to cross-check the decode path.
bool nll_single_prefill(const Checkpoint &ck, const std::string &spec, const std::vector<int32_t> &tokens,
                        int N, int P, double *nll, std::vector<int32_t> *argmax, std::string *err);

}  // namespace kvh
