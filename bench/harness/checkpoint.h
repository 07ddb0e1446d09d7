// llama2.c legacy checkpoint loader (harness only; not part of the library ABI).
//
// Format (see models/README.md): 7 little-endian int32
//   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
// (vocab_size > 0: the classifier shares the token embedding; < 0: a separate classifier
// of |vocab_size| rows follows), then fp32 tensors, matrices [out][in]:
//   token_embedding [vocab][dim], rms_att [L][dim], wq [L][H*hd][dim], wk [L][KVH*hd][dim],
//   wv [L][KVH*hd][dim], wo [L][dim][H*hd], rms_ffn [L][dim], w1 [L][hidden][dim],
//   w2 [L][dim][hidden], w3 [L][hidden][dim], rms_final [dim],
//   two unused legacy RoPE tables of seq_len*hd/2 floats each, [wcls [vocab][dim]].
//
// The loader reads the whole file, checks the header for sane, consistent values, checks
// that the file size is exactly what the header implies (no truncation, no trailing bytes)
// and that every weight is finite. It never reads past the end of what it read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvh {

struct ModelConfig {
    int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab = 0, seq_len = 0;
    bool shared_classifier = true;
    int head_dim() const { return dim / n_heads; }
    int q_dim() const { return n_heads * head_dim(); }
    int kv_dim() const { return n_kv_heads * head_dim(); }
};

struct Checkpoint {
    ModelConfig cfg;
    std::vector<float> data;  // all weights as read
    // Pointers into data (per-layer tensors are contiguous over layers).
    const float *tok_emb = nullptr, *rms_att = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr,
                *wo = nullptr, *rms_ffn = nullptr, *w1 = nullptr, *w2 = nullptr, *w3 = nullptr,
                *rms_final = nullptr, *wcls = nullptr;
    std::string path;
};

// Loads `path` into *out. On failure returns false and sets *err to a message naming the
// file and the problem; *out is then unspecified (but safe to destroy).
bool load_checkpoint(const std::string &path, Checkpoint *out, std::string *err);

}  // namespace kvh
