#pragma once

// kvprune port (ports/llama.cpp in the kvprune repository): a llama_memory_i whose KV cache is a
// kvprune cache. Selected at context creation by the environment variable KVP_SPEC (which the
// common argument --kvp SPEC sets); without it llama.cpp builds its own memory as before.

#include "llama-memory.h"
#include "llama-graph.h"
#include "llama-batch.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

struct kvp_cache;
struct llama_model;
struct llama_cparams;
struct ggml_context;
struct ggml_tensor;

// the kvprune spec of this process (env KVP_SPEC), nullptr when unset or empty
const char * llama_kvp_spec();

struct llama_context;
struct kvp_stats;
// kvprune's counters of sequence seq_id of a context whose memory is kvprune's (kvp_get_stats);
// false when the memory is llama.cpp's own or seq_id is not one of its sequences (tools/kvp-tasks)
bool llama_kvp_seq_stats(llama_context * ctx, int seq_id, kvp_stats * out);

class llama_kvp_memory;

class llama_kvp_context : public llama_memory_context_i {
public:
    explicit llama_kvp_context(llama_memory_status status);
    // the worst-case context used to reserve the compute graphs (no ubatch)
    explicit llama_kvp_context(llama_kvp_memory * mem);
    // drafts[i]: ubatch i goes into its sequence's kvprune draft (see llama_kvp_memory::init_batch)
    llama_kvp_context(llama_kvp_memory * mem, std::vector<llama_ubatch> ubatches, std::vector<bool> drafts);

    bool next()  override;
    bool apply() override;

    const llama_ubatch & get_ubatch() const override;
    llama_memory_status  get_status() const override;

    llama_kvp_memory * mem = nullptr;

private:
    llama_memory_status status;
    std::vector<llama_ubatch> ubatches;
    size_t i_next = 0;
    std::vector<bool> drafts;
};

class llama_kvp_memory : public llama_memory_i {
public:
    // throws std::runtime_error with kvprune's message when the spec or the model is not supported
    llama_kvp_memory(const llama_model & model, const llama_cparams & cparams, const std::string & spec);
    ~llama_kvp_memory() override;

    llama_memory_context_ptr init_batch(llama_batch_allocr & balloc, uint32_t n_ubatch, bool embd_all) override;
    llama_memory_context_ptr init_full() override;
    llama_memory_context_ptr init_update(llama_context * lctx, bool optimize) override;

    bool get_can_shift() const override { return false; }

    void clear(bool data) override;

    bool seq_rm  (llama_seq_id seq_id,                              llama_pos p0, llama_pos p1) override;
    [[noreturn]] void seq_cp  (llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) override;
    void seq_keep(llama_seq_id seq_id) override;
    [[noreturn]] void seq_add (llama_seq_id seq_id,                              llama_pos p0, llama_pos p1, llama_pos shift) override;
    [[noreturn]] void seq_div (llama_seq_id seq_id,                              llama_pos p0, llama_pos p1, int d) override;

    llama_pos seq_pos_min(llama_seq_id seq_id) const override;
    llama_pos seq_pos_max(llama_seq_id seq_id) const override;

    std::map<ggml_backend_buffer_type_t, size_t> memory_breakdown() const override;

    void state_write(llama_io_write_i & io, llama_seq_id seq_id = -1, llama_state_seq_flags flags = 0) const override;
    void state_read (llama_io_read_i  & io, llama_seq_id seq_id = -1, llama_state_seq_flags flags = 0) override;

    // llama_kvp_context::apply(): the ubatch whose graph is computed next, all of one sequence
    // (draft: it goes into the sequence's open kvprune draft, opened if none is)
    bool begin_ubatch(const llama_ubatch & ubatch, bool draft);

    // the custom op of layer il on the first of its nth threads: attention of dst->src[0..2]
    // (q, k, v) into dst; then the other threads (op_help) leave the op
    void compute(int il, ggml_tensor * dst, int nth);
    void compute_layer(int il, ggml_tensor * dst);

    // graph side: the op that replaces build_attn_mha for layer il
    ggml_tensor * build_attn(ggml_context * ctx0, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                             float kq_scale, int il);

    struct layer_op {
        llama_kvp_memory * mem;
        int il;
    };

    // the op's threads other than the first: run the tasks kvprune's call (on the first thread)
    // hands to the graph's threads, until that call returned
    void op_help(int nth);

    // kvp_get_stats of sequence seq_id's cache; false for an id outside [0, n_seq_max)
    bool seq_stats(int seq_id, kvp_stats * out) const;

private:
    // kvprune's parallel part on the graph's threads (thread_pool=host, kvp_set_parallel): the
    // op's first thread makes the kvprune call; the host function it calls publishes the job here,
    // and every thread of the op (the first included) claims participant ids until none is left
    struct alignas(64) par_slot {
        std::atomic<uint64_t> job{0};   // generation (bits 63..32) | n (31..16) | next id (15..0)
        std::atomic<uint32_t> done{0};  // ids of the current job that returned
        void (*task)(void *, uint32_t) = nullptr;
        void * arg = nullptr;
        int nth = 1;                    // threads in the op now (the first thread sets it)
        uint64_t jobs = 0;              // jobs published to the op's other threads (logged at exit)
        alignas(64) std::atomic<int> call_done{0};  // the first thread's kvprune call returned
        std::atomic<int> left{0};       // the other threads that left the op
    };
    par_slot par;
    static void parallel_for(void * user, uint32_t n, void (*task)(void *, uint32_t), void * arg);
    static bool par_claim(par_slot & p);  // runs one id of the open job, false when none is left

    size_t arena_bytes = 0;      // of one sequence's cache (each has its own arena)
    float attn_scale = 0.0f;
    uint32_t n_layer = 0;

    std::vector<layer_op> ops;   // userdata of the custom ops, one per layer (stable addresses)

    // speculative decoding (README "Drafts"): llama.cpp removes a rejected suffix with seq_rm;
    // kvprune can take back only the tokens of an open draft (kvp_draft_begin/kvp_draft_commit)
    enum draft_mode_t {
        DRAFT_OFF,    // max_draft=0: no drafts, a suffix cannot be removed
        DRAFT_FIRST,  // a batch of <= max_draft tokens of a sequence that starts it is a draft
        DRAFT_ALL,    // after a suffix was removed (any sequence): every batch of <= max_draft tokens
                      // of a sequence is a draft
    };
    uint32_t     max_draft  = 0;
    draft_mode_t draft_mode = DRAFT_OFF;

    // one kvprune cache per sequence (llama.cpp's seq_id = the index; n_seq_max of them)
    struct seq_t {
        kvp_cache * cache = nullptr;
        llama_pos pos_next   = 0;     // position of the next token (positions stored: 0 .. pos_next-1,
                                      // the open draft's included)
        bool      draft_open = false;
        llama_pos draft_pos0 = 0;     // position of the open draft's first token
        uint32_t  draft_n    = 0;     // tokens in the open draft (every layer holds them all)
    };
    std::vector<seq_t> seqs;
    uint64_t n_batch_multi_seq = 0; // batches that carried tokens of more than one sequence

    // the sequence of seq_id; throws for an id outside [0, n_seq_max)
    seq_t & seq_at(llama_seq_id seq_id, const char * what);

    void clear_seq(seq_t & s);
    bool seq_rm_one(llama_seq_id seq_id, llama_pos p0, llama_pos p1);

    // keeps the first `accepted` tokens of the sequence's open draft (kvp_draft_commit), drops the rest
    bool draft_commit(seq_t & s, uint32_t accepted, const char * why);

    // state_write: commits an open draft (whole) and ends an open prompt, which kvp_state_save needs
    void state_prepare(seq_t & s);
    void state_write_seq(llama_io_write_i & io, seq_t & s);
    void state_read_seq (llama_io_read_i  & io, seq_t & s);

    // the ubatch being computed (set by begin_ubatch)
    seq_t * cur = nullptr;
    std::vector<int32_t> cur_pos;
    bool cur_decode = false;
    bool cur_draft  = false;
};

// the attention input of a context whose memory is kvprune: no mask, no cell indices
class llm_graph_input_attn_kvp : public llm_graph_input_attn_kv {
public:
    llm_graph_input_attn_kvp(const llama_hparams & hparams, const llama_cparams & cparams, llama_kvp_memory * mem)
        : llm_graph_input_attn_kv(hparams, cparams, nullptr), mem(mem) {}

    void set_input(const llama_ubatch * ubatch) override { GGML_UNUSED(ubatch); }

    bool can_reuse(const llm_graph_params & params) override;

    llama_kvp_memory * mem;
};

// the same for a model with sliding-window layers (gemma3: build_attn_inp_kv_iswa): kvprune's
// local layers (sliding_window/sliding_pattern, set from the model) hold the windows, so both
// branches of llama.cpp's input are one kvprune cache; build_attn hands `kvp` to the overload above
class llm_graph_input_attn_kvp_iswa : public llm_graph_input_attn_kv_iswa {
public:
    llm_graph_input_attn_kvp_iswa(const llama_hparams & hparams, const llama_cparams & cparams, llama_kvp_memory * mem)
        : llm_graph_input_attn_kv_iswa(hparams, cparams, nullptr), kvp(hparams, cparams, mem) {}

    void set_input(const llama_ubatch * ubatch) override { GGML_UNUSED(ubatch); }

    bool can_reuse(const llm_graph_params & params) override { return kvp.can_reuse(params); }

    llm_graph_input_attn_kvp kvp;
};
