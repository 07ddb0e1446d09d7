// A llama-architecture forward pass whose every attention call goes through kvprune.
//
// Session = checkpoint weights (borrowed) + one kvprune cache in a fixed, caller-owned arena
// + the scratch buffers of the forward pass. Per layer the harness computes RMSNorm, the
// pre-RoPE q/k/v projections (+ qwen2 biases, qwen3 per-head q/k RMSNorm), hands them to
// kvp_prefill/kvp_decode (kvprune applies the model's RoPE style at the positions of its position
// mode and runs the attention over what it keeps), then the output projection, RMSNorm and the
// SwiGLU FFN. The f32 path (llama2.c, f32 GGUF) is single-threaded with a fixed summation order;
// the mapped GGUF matrices' products split rows over threads, each output in a fixed order, so
// results depend only on kvprune's output, never on the thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "kvprune/kvprune.h"

namespace kvh {

// kvp_model for a checkpoint: GPT-J interleaved RoPE over the whole head, theta 10000.
kvp_model model_geometry(const ModelConfig &c);

// Parses a policy spec against a checkpoint's geometry (resolve_spec without a sequence length:
// the CLI's strict checks, then kvp_config_default + kvp_config_apply). On failure returns false
// with "bad policy spec '<spec>': <message>" in *err.
bool parse_policy(const ModelConfig &mc, const std::string &spec, kvp_config *cfg, std::string *err);

class Session {
public:
    Session() = default;
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    // Creates the cache for `spec` in an arena of exactly kvp_arena_size bytes.
    bool init(const Checkpoint &ck, const std::string &spec, std::string *err);
    // New sequence, same arena.
    bool reset(std::string *err);

    // Feeds n tokens through kvp_prefill, split into chunks that fit the cache (each chunk
    // runs layer 0..L-1 before the next one starts). logits receives [n][vocab] when
    // all_logits, else [vocab] for the last token (the prediction of the next token).
    bool prefill(const int32_t *tokens, int n, float *logits, bool all_logits, std::string *err);
    // Feeds one token through kvp_decode; logits receives [vocab]. Allocates nothing on the f32
    // path (llama2.c, f32 GGUF); the mapped-matrix products hand rows to helper threads (matmul_q).
    bool decode(int32_t token, float *logits, std::string *err);

    // Threads of the quantized GGUF products (default: $KVPRUNE_THREADS, else 2). Results do not
    // depend on it; the f32 path (llama2.c files, f32 GGUF) is always single-threaded.
    void set_threads(int n) { threads_ = n < 1 ? 1 : n; }
    int threads() const { return threads_; }

    // The cache's state (kvp_state_save) and the session's counters, into *buf (resized); restore()
    // puts them back, after which the session continues bit for bit as from the snapshot.
    bool snapshot(std::vector<char> *buf, std::string *err) const;
    // Ends an open prompt (kvp_prompt_end: a max_prompt cache selects over the whole prompt now,
    // as its first decode would; a state is saved only between prompts). Nothing happens
    // otherwise. False (with *err) when the library refuses.
    bool end_prompt(std::string *err);
    bool restore(const std::vector<char> &buf, std::string *err);

    kvp_stats stats() const;
    // Largest resolved per-layer capacity (kvp_layer_capacity), in token slots.
    uint32_t max_layer_capacity() const;
    const kvp_cache *cache() const { return cache_; }  // per-layer figures (kvp_get_layer_stats)
    const kvp_config &config() const { return cfg_; }
    const ModelConfig &model() const { return ck_->cfg; }
    // The model's tokenizer (GGUF files with tokenizer metadata); null for byte / id vocabularies.
    const Tokenizer *tokenizer() const { return ck_ ? ck_->tok.get() : nullptr; }
    int64_t tokens_fed() const { return fed_; }
    // Largest prefill chunk used so far (for tests and docs).
    int max_chunk_used() const { return max_chunk_used_; }
    // Sees every layer's pre-RoPE q rows ([rows][n_q_heads * head_dim]) as they go to kvprune.
    void set_query_observer(std::function<void(int layer, const float *q, int rows)> f) { q_obs_ = std::move(f); }
    // TriAttention's offline calibration (kvprune eval --tri-calibrate): every Session created
    // after this call whose policy is triattention with tri_stats=given gets these statistics
    // (calibrate_query_stats' layout) through kvp_query_stats_set. nullptr: none.
    static void set_given_query_stats(const std::vector<float> *stats);
    // DuoAttention heads (kvprune eval --duo-roles FILE, issue 32 item 2): every Session created
    // after this call gets this role table (roles[layer * n_kv_heads + h], kvp_create_heads) and
    // the arena kvp_arena_size_heads says. nullptr: none.
    static void set_duo_roles(const std::vector<uint8_t> *roles);
    // Sees every layer's pre-RoPE q rows and k rows ([rows][n_kv_heads * head_dim]) of a prefill or
    // decode call as they go to kvprune (duo-calibrate's probe cache takes the same rows).
    void set_kv_observer(std::function<void(int layer, const float *q, const float *k, int rows)> f) {
        kv_obs_ = std::move(f);
    }

    // ASL: the layer whose kvp_prefill made the selection in this sequence (-1: none).
    int selection_layer() const { return sel_layer_; }
    // SimLayerKV: the layers whose kvp_layer_stats.lazy is 1.
    std::vector<int> lazy_layers() const;

private:
    bool run_chunk(const int32_t *tokens, int n, bool use_decode, float *logits, bool all_logits,
                   std::string *err);
    void ensure_rows(int n);
    int prefill_room() const;

    const Checkpoint *ck_ = nullptr;
    kvp_config cfg_{};
    kvp_cache *cache_ = nullptr;
    void *arena_ = nullptr;
    size_t arena_len_ = 0;
    int64_t fed_ = 0;
    int rows_ = 0;
    int max_chunk_used_ = 0;
    int sel_layer_ = -1;
    int threads_ = 2;
    // scratch, [rows][...]
    std::vector<float> x_, xb_, xb2_, q_, k_, v_, att_, hb_, hb2_;
    std::vector<int32_t> pos_, sel_idx_;
    std::function<void(int, const float *, int)> q_obs_;
    std::function<void(int, const float *, const float *, int)> kv_obs_;
};

// DuoAttention's calibration (kvprune duo-calibrate): per (layer, KV head) the attention mass on
// the needle block, averaged over the group's query heads, the question's queries (the tokens after
// the context) and the prompts. Each prompt runs full KV (query-aware prefill); a probe cache with
// the same config takes every layer's q and k rows with V = 1 in channel 0 on the needle's tokens
// and 0 elsewhere, so its output's channel 0 is each query's attention mass on the needle (the
// library's own attention, no second implementation). needle[i] = [first, end) token range of the
// asked block in prompt i; question_at[i]: the question's first token. *mass: [n_layers * n_kv_heads].
bool calibrate_duo_mass(const Checkpoint &ck, const std::vector<std::vector<int32_t>> &prompts,
                        const std::vector<std::pair<int, int>> &needle, const std::vector<int> &question_at,
                        std::vector<double> *mass, std::string *err);
// The role table that makes the round(fraction * n) heads with the least needle mass streaming
// (ties: the lower index first), the others retrieval.
std::vector<uint8_t> duo_roles_from_mass(const std::vector<double> &mass, double fraction);
// The role-table file (duo-calibrate writes it, --duo-roles reads it): '#' comment lines, then
// "duo_roles <n_layers> <n_kv_heads>", then one line "<layer> <kv_head> <role> <mass>" per head.
std::string duo_roles_file(const std::vector<uint8_t> &roles, const std::vector<double> &mass, uint32_t L, uint32_t H,
                           const std::string &comment);
bool parse_duo_roles(const std::string &text, const ModelConfig &mc, std::vector<uint8_t> *roles, std::string *err);

// TriAttention's query statistics of a model measured on `tokens` (a full-KV pass, prefill in
// chunks): per layer and query head, head_dim channel means then n_units unit magnitude means
// (kvp_query_stats_set's units: RoPE pairs, then each unrotated channel); *units receives n_units.
bool calibrate_query_stats(const Checkpoint &ck, const std::vector<int32_t> &tokens, std::vector<float> *stats,
                           uint32_t *units, std::string *err);

}  // namespace kvh
