// A retrieval model written by hand: a 2-layer llama2.c byte model whose attention performs exact
// n-gram induction (default n = 6). Our own implementation of the construction that
// models/README.md describes for induction6.bin; its output is not bit-identical to that file
// (different random codes) but answers the same retrieval tasks. See docs/harness.md,
// "The retrieval model (induction6)".
//
// How it works (residual of dim = heads * head_dim; MLPs are zero):
//   embedding   a random code g(b) of 128 dims per byte b (|g|^2 = 128), and a constant channel;
//   layer 1     head m-1 (m = 1..n) is positional: its key is constant and its query a phase offset of
//               m steps on the highest-frequency RoPE pairs, so it attends to the byte m positions
//               back; it writes that byte's code, projected by an offset-specific random matrix P, into
//               a "context" subspace (offsets 1..n-1, read by the query below) and a "history"
//               subspace (offsets 1..n, each shifted by one, read by the key below);
//   layer 2     head 0 compares, on the lowest-frequency RoPE pairs (nearly position-free), the codes
//               of the last n bytes at the query with the codes of the n bytes before each key: the
//               score peaks where the current n-byte context occurred before, and the head copies the
//               code of the byte that followed it into an "answer" subspace; heads 1.. are zero;
//   classifier  (separate, vocab -256) the answer read through the byte codes (the copy), plus a bigram
//               table of the corpus read from the current byte's code (what it says when nothing matches).
// kv_heads 2 (issue 32's evidence for per-head budgets: a layer whose heads need different spans):
// both layers have two KV heads, query heads [0, heads/2) reading KV head 0 and the rest KV head 1.
// Layer 1's two KV heads carry the same positional key and value. In layer 2, KV head 0 is the
// matching head above (query head 0) and KV head 1 a local head: its query heads heads/2 + j attend
// to the byte j + 1 back; the first writes the previous byte's code into a sixth subspace, which the
// classifier reads as a skip-bigram table of the corpus (P(next | the byte two back), weight
// local_gain). The random codes are drawn as for one KV head.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvh {

struct InductionParams {
    int context = 1024;       // seq_len of the checkpoint
    int order = 6;            // n: bytes of context matched (<= heads)
    int heads = 6;            // query heads
    int kv_heads = 1;         // 1, or 2: layer 2's second KV head is a local head (below)
    int head_dim = 192;       // dim = heads * head_dim
    int pos_pairs = 32;       // highest-frequency RoPE pairs used by the positional heads
    int match_pairs = 21;     // lowest-frequency RoPE pairs used by the matching head
    double pos_sharpness = 6.0;    // score per pair of the positional heads' target
    double match_sharpness = 0.6;  // score scale of the matching head
    double copy_gain = 0.12;       // weight of the copy in the logits
    double bigram_gain = 1.0;      // weight of the bigram log-probabilities in the logits
    double subspace_scale = 0.1;   // size of the context/history/answer subspaces in the residual
    double local_gain = 0.5;       // kv_heads 2: weight of the local head's skip-bigram in the logits
    uint64_t seed = 7;             // random codes and projections
};

// Builds the checkpoint (llama2.c legacy format, separate classifier) from the bigram statistics of
// `corpus` and writes it to `out_path`. Returns false with a message in *err when the parameters are
// inconsistent, the corpus is shorter than 2 bytes, or the file cannot be written. *summary (optional)
// receives one line describing the model.
bool write_induction_model(const InductionParams &p, const std::vector<uint8_t> &corpus,
                           const std::string &out_path, std::string *err, std::string *summary = nullptr);

}  // namespace kvh
