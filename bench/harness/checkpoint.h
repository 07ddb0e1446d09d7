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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvprune/kvprune.h"
#include "qmatmul.h"

namespace kvh {

struct ModelConfig {
    int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab = 0, seq_len = 0;
    bool shared_classifier = true;
    // GGUF models (gguf_model.cpp) set these; the llama2.c defaults are GPT-J RoPE over the
    // whole head with theta 10000, RMSNorm epsilon 1e-5 and head_dim = dim / n_heads.
    int head_dim_override = 0;  // > 0: head_dim independent of dim (qwen3: key_length)
    kvp_rope_style rope = KVP_ROPE_GPTJ;
    int rope_dim = 0;           // 0: the whole head
    float rope_theta = 10000.0f;
    // Scaled RoPE (GGUF rope.scaling.type linear/yarn, llama3's rope_freqs tensor): the per-pair
    // inverse frequencies kvp_create_rope takes (empty: theta's) and the attention factor
    // (kvp_config.rope_attn_factor); rope_scaling names the scheme for `kvprune info`.
    std::vector<double> rope_freqs;
    float rope_attn_factor = 1.0f;
    std::string rope_scaling = "none";
    float norm_eps = 1e-5f;
    int head_dim() const { return head_dim_override > 0 ? head_dim_override : dim / n_heads; }
    int q_dim() const { return n_heads * head_dim(); }
    int kv_dim() const { return n_kv_heads * head_dim(); }
};

class Tokenizer;

struct Checkpoint {
    ModelConfig cfg;
    std::vector<float> data;  // all weights as read
    // Pointers into data (per-layer tensors are contiguous over layers).
    const float *tok_emb = nullptr, *rms_att = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr,
                *wo = nullptr, *rms_ffn = nullptr, *w1 = nullptr, *w2 = nullptr, *w3 = nullptr,
                *rms_final = nullptr, *wcls = nullptr;
    // Optional (GGUF): q/k/v biases [L][q_dim], [L][kv_dim] (qwen2); per-head q/k RMSNorm weights
    // [L][head_dim] (qwen3). nullptr when the architecture has none.
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    std::string path;
    std::string format = "llama2.c";   // or "gguf"
    std::string arch = "llama";        // GGUF general.architecture
    std::string name;                  // GGUF general.name, if any
    int64_t context_length = 0;        // GGUF <arch>.context_length (llama2.c: seq_len)
    std::map<std::string, int> weight_types;  // ggml type name -> tensor count (GGUF)
    uint64_t file_bytes = 0;
    // GGUF matrices of a type other than f32, read where they lie in the mapped file (their f32
    // pointers above are then null, and data holds only the f32 tensors): qmat[k * n_layers + l]
    // for k = 0..6 (wq, wk, wv, wo, w1, w2, w3), qcls for the output, qemb for the embedding.
    // Empty for llama2.c and all-f32 files.
    std::vector<QView> qmat;
    QView qcls, qemb;
    std::shared_ptr<const void> keep;  // the mapping qmat/qcls point into
    // f32 matrices with rows that are all zero (constructed models: 1224 of induction6's 7968 weight
    // rows hold a nonzero weight, 22% of its matmul work): live_rows[k * n_layers + l] (k = 0..6 as qmat) lists the rows with a
    // nonzero weight, ascending; an empty list means every row (nothing to skip). The harness matmul
    // computes only those rows and writes +0 for the others, which is what their dot products give
    // for finite inputs (bit for bit). Filled by load_checkpoint (set_live_rows).
    std::vector<std::vector<int32_t>> live_rows;
    std::vector<int32_t> live_rows_cls;
    // Text <-> ids from the file's metadata (GGUF tokenizer.ggml.*); null: byte or id vocabulary.
    std::shared_ptr<const Tokenizer> tok;
};

// Fills live_rows / live_rows_cls from the f32 matrices the checkpoint points to.
void set_live_rows(Checkpoint *ck);

// Loads `path` into *out. On failure returns false and sets *err to a message naming the
// file and the problem; *out is then unspecified (but safe to destroy).
// A file that starts with the GGUF magic is read by load_gguf (so every caller accepts GGUF).
bool load_checkpoint(const std::string &path, Checkpoint *out, std::string *err);

// GGUF model (gguf_model.cpp): architectures llama, qwen2, qwen3; weights dequantized to f32 on
// load. Same contract as load_checkpoint; the message of a refused file names what is not supported.
bool load_gguf(const std::string &path, Checkpoint *out, std::string *err);
// Dispatches on the file's magic: GGUF or llama2.c.
inline bool load_model(const std::string &path, Checkpoint *out, std::string *err) {
    return load_checkpoint(path, out, err);
}

}  // namespace kvh
