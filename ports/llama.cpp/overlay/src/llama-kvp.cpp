// kvprune port: llama.cpp memory backed by one kvprune cache per sequence (see llama-kvp.h and
// ports/llama.cpp/README.md in the kvprune repository).

#include "llama-kvp.h"

#include "llama-impl.h"
#include "llama-model.h"
#include "llama-cparams.h"
#include "llama-arch.h"
#include "llama-io.h"

#include "ggml.h"
#include "ggml-backend.h"

#include "kvprune/kvprune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

// a float as a spec value that reads back as the same float
static std::string kvp_float(float x) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.9g", x);
    return buf;
}

const char * llama_kvp_spec() {
    const char * s = getenv("KVP_SPEC");
    return s && *s ? s : nullptr;
}

bool llama_kvp_seq_stats(llama_context * ctx, int seq_id, kvp_stats * out) {
    auto * mem = dynamic_cast<llama_kvp_memory *>(llama_get_memory(ctx));
    return mem && mem->seq_stats(seq_id, out);
}

bool llama_kvp_memory::seq_stats(int seq_id, kvp_stats * out) const {
    if (seq_id < 0 || (size_t) seq_id >= seqs.size()) {
        return false;
    }
    out->struct_size = sizeof(*out);
    return kvp_get_stats(seqs[seq_id].cache, out) == KVP_OK;
}

//
// llama_kvp_context
//

llama_kvp_context::llama_kvp_context(llama_memory_status status) : status(status) {}

llama_kvp_context::llama_kvp_context(llama_kvp_memory * mem) : mem(mem), status(LLAMA_MEMORY_STATUS_SUCCESS) {}

llama_kvp_context::llama_kvp_context(llama_kvp_memory * mem, std::vector<llama_ubatch> ubatches, std::vector<bool> drafts)
    : mem(mem), status(LLAMA_MEMORY_STATUS_SUCCESS), ubatches(std::move(ubatches)), drafts(std::move(drafts)) {}

bool llama_kvp_context::next() {
    return ++i_next < ubatches.size();
}

bool llama_kvp_context::apply() {
    if (ubatches.empty()) {
        return true; // the reserve context: nothing to apply
    }
    return mem->begin_ubatch(ubatches[i_next], drafts[i_next]);
}

const llama_ubatch & llama_kvp_context::get_ubatch() const {
    GGML_ASSERT(i_next < ubatches.size());
    return ubatches[i_next];
}

llama_memory_status llama_kvp_context::get_status() const {
    return status;
}

//
// llama_kvp_memory
//

// (not think: under max_prompt it holds the open prompt at f32 in rows for every slot, an arena
// cost the spec should ask for with max_prompt itself)
static const char * kvp_policies_observing_prompt[] = { "h2o", "snapkv", "pyramidkv", "lethe", "simlayerkv", "asl", "random" };

// draft tokens in flight when the spec does not give max_draft: a speculative step drafts
// --spec-draft-n-max tokens (default 3) and verifies them with the last token, so up to 15
static const uint32_t kvp_default_max_draft = 16;

// the memory's state in a llama.cpp state (session file, sequence state): this header, then
// kvp_state_save's bytes
static const uint32_t kvp_state_magic   = 0x4b56504cu; // "LPVK" little-endian: "KVPL"
static const uint32_t kvp_state_version = 1;

llama_kvp_memory::llama_kvp_memory(const llama_model & model, const llama_cparams & cparams, const std::string & user_spec) {
    const auto & hp = model.hparams;

    // the architectures whose graph builder reaches kvprune through build_attn_inp_kv (or
    // build_attn_inp_kv_iswa) + build_attn and that test.sh checks
    if (model.arch != LLM_ARCH_LLAMA && model.arch != LLM_ARCH_QWEN2 && model.arch != LLM_ARCH_QWEN3 &&
        model.arch != LLM_ARCH_GEMMA2 && model.arch != LLM_ARCH_GEMMA3) {
        throw std::runtime_error(format("kvprune: architecture '%s' is not supported by this port yet "
                    "(llama, qwen2, qwen3, gemma2, gemma3)", llm_arch_name(model.arch)));
    }
    if (!cparams.causal_attn || cparams.embeddings) {
        throw std::runtime_error("kvprune: only causal decoder models, no embeddings");
    }
    if (hp.swa_type != LLAMA_SWA_TYPE_NONE && hp.swa_type != LLAMA_SWA_TYPE_STANDARD) {
        throw std::runtime_error("kvprune: sliding windows other than the standard one (chunked, symmetric) are not supported");
    }

    n_layer = hp.n_layer();
    const uint32_t n_head    = hp.n_head(0);
    const uint32_t n_head_kv = hp.n_head_kv(0);
    const uint32_t head_dim  = hp.n_embd_head_k(0);
    for (uint32_t il = 0; il < n_layer; ++il) {
        if (hp.n_head(il) != n_head || hp.n_head_kv(il) != n_head_kv ||
            hp.n_embd_head_k(il) != head_dim || hp.n_embd_head_v(il) != head_dim) {
            throw std::runtime_error(format("kvprune: layer %u has another geometry than layer 0", il));
        }
    }

    // RoPE: llama.cpp rotates q and k in the graph (ggml_rope_ext) before build_attn, so the cache
    // stores pre-rotated keys: rope=none (positions=realign is not available this way).
    kvp_model m = {};
    m.n_layers   = n_layer;
    m.n_q_heads  = n_head;
    m.n_kv_heads = n_head_kv;
    m.head_dim   = head_dim;
    m.rope       = KVP_ROPE_NONE;
    m.rope_dim   = 0;
    m.rope_theta = 10000.0f;

    char err[512];
    kvp_config cfg;
    if (kvp_config_default_ex(&cfg, &m, err, sizeof(err)) != KVP_OK) {
        throw std::runtime_error(std::string("kvprune: ") + err);
    }

    // the keys the user gave, and the port's defaults for the ones not given
    std::set<std::string> keys;
    std::string policy = "full";
    {
        std::istringstream ss(user_spec);
        std::string tok;
        while (ss >> tok) {
            const size_t eq = tok.find('=');
            const std::string key = tok.substr(0, eq);
            keys.insert(key);
            if (key == "policy" && eq != std::string::npos) {
                policy = tok.substr(eq + 1);
            }
        }
    }
    // each sequence has its own cache, sized for one sequence's context (n_ctx_seq: n_ctx / n_seq_max,
    // or n_ctx with a unified KV cache, as llama.cpp's own cache gives each sequence)
    const std::string n_ctx = std::to_string(cparams.n_ctx_seq);
    std::string spec = user_spec;
    if (policy == "full" && !keys.count("capacity")) {
        spec += " capacity=" + n_ctx; // full keeps the whole context
    }
    if (keys.count("compression_ratio") && !keys.count("ratio_tokens")) {
        spec += " ratio_tokens=" + n_ctx; // compression_ratio is a fraction of the context size
    }
    if (!keys.count("threads") && !keys.count("thread_pool")) {
        // kvprune's parallel part runs on the graph's own threads (parallel_for): as many
        // participants as the larger of the two thread counts, no worker threads of its own, and
        // no more than the machine's hardware threads: a context created with llama.cpp's default
        // of 4 threads and run with fewer (llama-bench sets them after creation) would otherwise
        // reserve per-thread scratch that can never be used (about 12 MiB each for a 16K-token snapkv
        // cache of the 0.5B shape)
        int nt = std::max(std::max(cparams.n_threads, cparams.n_threads_batch), 1);
        const unsigned hw = std::thread::hardware_concurrency();  // 0: unknown, no cap
        if (hw > 0 && unsigned(nt) > hw) {
            nt = int(hw);
        }
        spec += " thread_pool=host threads=" + std::to_string(std::min(nt, 256));
    }
    if (!keys.count("max_draft")) {
        spec += " max_draft=" + std::to_string(kvp_default_max_draft); // seq_rm of a suffix (speculative decoding)
    }
    if (!keys.count("max_prompt")) {
        for (const char * p : kvp_policies_observing_prompt) {
            if (policy == p) {
                spec += " max_prompt=" + n_ctx; // whole-prompt selection across micro-batches
            }
        }
    }
    // sliding-window layers (gemma2, gemma3): kvprune's local layers, window and period from the model.
    // llama.cpp masks a key at p0 for a query at p1 when p1 - p0 >= n_swa: the query sees n_swa keys,
    // itself included, which is kvprune's sliding_window; its layer il is local unless
    // (il + 1) % pattern == 0, which is kvprune's sliding_pattern (0: every layer local)
    if (hp.swa_type == LLAMA_SWA_TYPE_STANDARD) {
        if (keys.count("sliding_window") || keys.count("sliding_pattern")) {
            throw std::runtime_error("kvprune: sliding_window and sliding_pattern come from the model's "
                    "sliding-window layers; leave them out of the spec");
        }
        int64_t pattern = -1;
        for (uint32_t p = 0; p <= n_layer + 1 && pattern < 0; ++p) {
            bool fits = true;
            for (uint32_t il = 0; il < n_layer && fits; ++il) {
                fits = hp.is_swa(il) == !(p > 0 && (il + 1) % p == 0);
            }
            if (fits) {
                pattern = p;
            }
        }
        if (pattern < 0) {
            throw std::runtime_error("kvprune: the model's sliding-window layers follow no period "
                    "(kvprune's sliding_pattern: layer l is global iff (l + 1) % P == 0)");
        }
        spec += " sliding_window=" + std::to_string(hp.n_swa) + " sliding_pattern=" + std::to_string(pattern);
    }
    // attention logit soft-capping (gemma2): llama.cpp caps the logits of the scaled q (kq_scale 1)
    // as c * tanh(logits / c) before the softmax, which is kvprune's logit_softcap
    if (hp.attn_soft_cap) {
        if (keys.count("logit_softcap")) {
            throw std::runtime_error("kvprune: logit_softcap comes from the model's attention soft-capping; "
                    "leave it out of the spec");
        }
        spec += " logit_softcap=" + kvp_float(hp.f_attn_logit_softcapping);
    }
    // the scale the architecture's graph passes to build_attn: gemma2 and gemma3 scale q themselves
    // and pass 1 (src/models/gemma2.cpp, gemma3.cpp), llama takes f_attention_scale when the file
    // gives one
    if (!keys.count("attn_scale")) {
        float scale = 1.0f / sqrtf((float) head_dim);
        if (model.arch == LLM_ARCH_GEMMA2 || model.arch == LLM_ARCH_GEMMA3) {
            scale = 1.0f;
        } else if (model.arch == LLM_ARCH_LLAMA && hp.f_attention_scale != 0.0f) {
            scale = hp.f_attention_scale;
        }
        if (scale != 1.0f / sqrtf((float) head_dim)) {
            spec += " attn_scale=" + kvp_float(scale);
        }
    }
    if (kvp_config_apply(&cfg, spec.c_str(), err, sizeof(err)) != KVP_OK) {
        throw std::runtime_error(format("kvprune: spec '%s': %s", spec.c_str(), err));
    }
    attn_scale = cfg.attn_scale != 0.0f ? cfg.attn_scale : 1.0f / sqrtf((float) head_dim);

    max_draft  = cfg.max_draft;
    draft_mode = max_draft > 0 ? DRAFT_FIRST : DRAFT_OFF;

    arena_bytes = kvp_arena_size(&cfg);
    seqs.resize(cparams.n_seq_max);
    for (auto & s : seqs) {
        if (kvp_create_ex(&cfg, nullptr, arena_bytes, &s.cache, err, sizeof(err)) != KVP_OK) {
            for (auto & t : seqs) {
                kvp_destroy(t.cache); // (null for the ones not created)
            }
            throw std::runtime_error(format("kvprune: create: %s", err));
        }
        // (KVP_ERR_UNSUPPORTED from a kvprune built without threads: every call runs on thread 0)
        kvp_set_parallel(s.cache, parallel_for, &par);
    }

    ops.resize(n_layer);
    for (uint32_t il = 0; il < n_layer; ++il) {
        ops[il] = { this, (int) il };
    }

    LLAMA_LOG_INFO("%s: kvprune cache '%s': %u layers, %u/%u heads, head_dim %u, arena %.2f MiB x %zu sequence(s)\n", __func__,
            spec.c_str(), n_layer, n_head, n_head_kv, head_dim, arena_bytes / 1024.0 / 1024.0, seqs.size());
}

llama_kvp_memory::~llama_kvp_memory() {
    for (size_t i = 0; i < seqs.size(); ++i) {
        kvp_stats st = {};
        st.struct_size = sizeof(st);
        if (kvp_get_stats(seqs[i].cache, &st) == KVP_OK && (i == 0 || st.tokens_seen > 0)) {
            LLAMA_LOG_INFO("%s: kvprune: %llu tokens seen, %llu evicted (summed over layers and KV heads), "
                    "live %.2f KiB (peak %.2f KiB) of an arena of %.2f KiB (sequence %zu)\n", __func__,
                    (unsigned long long) st.tokens_seen, (unsigned long long) st.tokens_evicted,
                    st.live_bytes / 1024.0, st.peak_live_bytes / 1024.0, arena_bytes / 1024.0, i);
        }
        kvp_destroy(seqs[i].cache);
    }
    LLAMA_LOG_INFO("%s: kvprune: %llu calls ran on more than one of ggml's threads (kvp_set_parallel)\n", __func__,
            (unsigned long long) par.jobs);
    if (seqs.size() > 1) {
        LLAMA_LOG_INFO("%s: kvprune: %zu sequences, %llu batches carried tokens of several sequences\n", __func__,
                seqs.size(), (unsigned long long) n_batch_multi_seq);
    }
}

llama_kvp_memory::seq_t & llama_kvp_memory::seq_at(llama_seq_id seq_id, const char * what) {
    if (seq_id < 0 || (size_t) seq_id >= seqs.size()) {
        throw std::runtime_error(format("kvprune: %s: sequence %d, the context has %zu (n_seq_max)", what, seq_id, seqs.size()));
    }
    return seqs[seq_id];
}

llama_memory_context_ptr llama_kvp_memory::init_batch(llama_batch_allocr & balloc, uint32_t n_ubatch, bool embd_all) {
    GGML_UNUSED(embd_all);

    // each sequence has its own cache: with more than one, every ubatch holds the tokens of one
    // sequence set (split_seq), and a token of several sequences (a shared prompt) is refused
    balloc.split_reset();
    std::vector<llama_ubatch> ubatches;
    while (true) {
        auto ubatch = seqs.size() == 1 ? balloc.split_simple(n_ubatch) : balloc.split_seq(n_ubatch);
        if (ubatch.n_tokens == 0) {
            break;
        }
        ubatches.push_back(std::move(ubatch)); // NOLINT
    }
    if (balloc.get_n_used() < balloc.get_n_tokens()) {
        return std::make_unique<llama_kvp_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
    }
    std::vector<uint32_t> n_seq_tokens(seqs.size(), 0); // this batch's tokens per sequence
    for (const auto & ub : ubatches) {
        for (uint32_t i = 0; i < ub.n_tokens; ++i) {
            if (ub.n_seq_id[i] != 1 || ub.seq_id[i][0] < 0 || (size_t) ub.seq_id[i][0] >= seqs.size()) {
                LLAMA_LOG_ERROR("%s: kvprune: a token belongs to %d sequences (first %d): each token must belong to one "
                        "sequence in [0, %zu), one kvprune cache each\n", __func__, ub.n_seq_id[i], ub.seq_id[i][0], seqs.size());
                return std::make_unique<llama_kvp_context>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
            }
        }
        n_seq_tokens[ub.seq_id[0][0]] += ub.n_tokens;
    }
    if (std::count_if(n_seq_tokens.begin(), n_seq_tokens.end(), [](uint32_t n) { return n > 0; }) > 1) {
        n_batch_multi_seq++;
    }
    // a sequence's tokens of at most max_draft are a draft (all its ubatches) once the context
    // removed a suffix, and before that when they start the sequence (README "Drafts")
    std::vector<bool> drafts;
    for (const auto & ub : ubatches) {
        const llama_seq_id s = ub.seq_id[0][0];
        drafts.push_back(draft_mode != DRAFT_OFF && n_seq_tokens[s] <= max_draft &&
                (draft_mode == DRAFT_ALL || seqs[s].pos_next == 0));
    }
    return std::make_unique<llama_kvp_context>(this, std::move(ubatches), std::move(drafts));
}

llama_memory_context_ptr llama_kvp_memory::init_full() {
    return std::make_unique<llama_kvp_context>(this);
}

llama_memory_context_ptr llama_kvp_memory::init_update(llama_context * lctx, bool optimize) {
    GGML_UNUSED(lctx);
    GGML_UNUSED(optimize);
    return std::make_unique<llama_kvp_context>(LLAMA_MEMORY_STATUS_NO_UPDATE);
}

void llama_kvp_memory::clear_seq(seq_t & s) {
    if (kvp_reset(s.cache) != KVP_OK) {
        GGML_ABORT("kvprune: reset: %s", kvp_last_error(s.cache));
    }
    s.pos_next   = 0;
    s.draft_open = false; // kvp_reset closed it
    s.draft_n    = 0;
}

void llama_kvp_memory::clear(bool data) {
    GGML_UNUSED(data);
    for (auto & s : seqs) {
        clear_seq(s);
    }
}

bool llama_kvp_memory::draft_commit(seq_t & s, uint32_t accepted, const char * why) {
    GGML_ASSERT(s.draft_open && accepted <= s.draft_n);
    if (kvp_draft_commit(s.cache, accepted) != KVP_OK) {
        LLAMA_LOG_ERROR("%s: kvprune: commit of %u of the %u draft tokens at position %d (%s): %s\n", __func__,
                accepted, s.draft_n, s.draft_pos0, why, kvp_last_error(s.cache));
        return false;
    }
    LLAMA_LOG_DEBUG("%s: kvprune: committed %u of %u draft tokens at position %d (%s)\n", __func__,
            accepted, s.draft_n, s.draft_pos0, why);
    s.draft_open = false;
    s.pos_next   = s.draft_pos0 + (llama_pos) accepted;
    s.draft_n    = 0;
    return true;
}

bool llama_kvp_memory::seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
    if (seq_id < 0) { // every sequence
        bool ok = true;
        for (size_t i = 0; i < seqs.size(); ++i) {
            ok = seq_rm_one((llama_seq_id) i, p0, p1) && ok;
        }
        return ok;
    }
    if ((size_t) seq_id >= seqs.size()) {
        LLAMA_LOG_ERROR("%s: kvprune: sequence %d, the context has %zu (n_seq_max)\n", __func__, seq_id, seqs.size());
        return false;
    }
    return seq_rm_one(seq_id, p0, p1);
}

bool llama_kvp_memory::seq_rm_one(llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
    seq_t & s = seqs[seq_id];
    llama_pos & pos_next = s.pos_next;
    if (p0 < 0) {
        p0 = 0;
    }
    if (p1 < 0) {
        p1 = std::numeric_limits<llama_pos>::max();
    }
    if (p0 >= p1) {
        return true;
    }
    if (s.draft_open && p1 >= pos_next && p0 >= s.draft_pos0) {
        // a suffix inside the open draft (speculative decoding's rejected tokens, or nothing when
        // p0 >= pos_next): keep the draft's tokens before p0, drop the rest
        const bool removes = p0 < pos_next;
        if (!draft_commit(s, (uint32_t) (std::min(p0, pos_next) - s.draft_pos0), "seq_rm")) {
            return false;
        }
        if (removes && draft_mode == DRAFT_FIRST) {
            draft_mode = DRAFT_ALL;
            LLAMA_LOG_INFO("%s: kvprune: a suffix was removed: from now on every batch of <= %u tokens is a kvprune "
                    "draft, committed at the next seq_rm or when the next batch does not fit (max_draft=%u)\n",
                    __func__, max_draft, max_draft);
        }
        return true;
    }
    if (p0 >= pos_next) {
        return true; // nothing stored there
    }
    if (p0 == 0 && p1 >= pos_next) {
        clear_seq(s);
        return true;
    }
    if (p1 >= pos_next && draft_mode != DRAFT_OFF) {
        LLAMA_LOG_ERROR("%s: kvprune: cannot remove positions [%d, %d) of sequence %d of %d tokens: only the tokens of the open "
                "draft can be removed (%s; max_draft=%u: speculative decoding needs max_draft >= the draft tokens of a step + 1, "
                "e.g. --spec-draft-n-max + 1)\n", __func__, p0, p1, seq_id, pos_next,
                s.draft_open ? format("it starts at position %d", s.draft_pos0).c_str() : "none is open", max_draft);
    } else {
        LLAMA_LOG_ERROR("%s: kvprune: cannot remove positions [%d, %d) of sequence %d of %d tokens (only the whole sequence%s)\n",
                __func__, p0, p1, seq_id, pos_next, draft_mode == DRAFT_OFF ? ": max_draft=0" : ", or a suffix inside the open draft");
    }
    return false;
}

void llama_kvp_memory::seq_cp(llama_seq_id, llama_seq_id, llama_pos, llama_pos) {
    GGML_ABORT("kvprune: seq_cp is not supported (each sequence has its own kvprune cache; a cache is not copied, "
            "e.g. llama-server's n_cmpl > 1 or a shared prompt)");
}

void llama_kvp_memory::seq_keep(llama_seq_id seq_id) {
    for (size_t i = 0; i < seqs.size(); ++i) {
        if ((llama_seq_id) i != seq_id) {
            clear_seq(seqs[i]);
        }
    }
}

void llama_kvp_memory::seq_add(llama_seq_id, llama_pos, llama_pos, llama_pos) {
    GGML_ABORT("kvprune: seq_add (context shift) is not supported: a pruned cache keeps its own positions");
}

void llama_kvp_memory::seq_div(llama_seq_id, llama_pos, llama_pos, int) {
    GGML_ABORT("kvprune: seq_div (self-extend) is not supported");
}

llama_pos llama_kvp_memory::seq_pos_min(llama_seq_id seq_id) const {
    if (seq_id < 0 || (size_t) seq_id >= seqs.size() || seqs[seq_id].pos_next == 0) {
        return -1;
    }
    // kvprune prunes, and cuts the sequence back only inside the open draft: report, as a recurrent
    // memory does, the first position llama.cpp may resume from: the open draft's first position,
    // else the last one. (llama-server then restores a checkpoint or reprocesses a prompt instead
    // of removing a suffix it cannot; llama.cpp's batch checks use seq_pos_max only.)
    const seq_t & s = seqs[seq_id];
    return s.draft_open ? s.draft_pos0 : s.pos_next - 1;
}

llama_pos llama_kvp_memory::seq_pos_max(llama_seq_id seq_id) const {
    // (llama.cpp's batch checks ask for every sequence id a unified context allows)
    if (seq_id < 0 || (size_t) seq_id >= seqs.size()) {
        return -1;
    }
    return seqs[seq_id].pos_next - 1;
}

std::map<ggml_backend_buffer_type_t, size_t> llama_kvp_memory::memory_breakdown() const {
    return { { ggml_backend_cpu_buffer_type(), arena_bytes * seqs.size() } }; // every sequence's arena
}

void llama_kvp_memory::state_prepare(seq_t & s) {
    // the sequence llama.cpp saves holds every token given so far: the open draft's too
    if (s.draft_open && !draft_commit(s, s.draft_n, "state save")) {
        throw std::runtime_error(format("kvprune: state save: commit of the open draft: %s", kvp_last_error(s.cache)));
    }
    // kvp_state_save refuses an open prompt: end it here (its selection runs now, as it would at
    // the next generated token)
    if (kvp_prompt_end(s.cache) != KVP_OK) {
        throw std::runtime_error(format("kvprune: state save: kvp_prompt_end: %s", kvp_last_error(s.cache)));
    }
}

// A sequence's state is its kvprune cache: a header and kvp_state_save's bytes. The whole state
// (seq_id -1) is every sequence's, in order (with one sequence: the same bytes as sequence 0's).
// LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (the part a memory cannot seq_rm: a checkpoint) is the
// whole cache too, as nothing of it outside a draft can be removed.
void llama_kvp_memory::state_write(llama_io_write_i & io, llama_seq_id seq_id, llama_state_seq_flags flags) const {
    GGML_UNUSED(flags);
    auto * self = const_cast<llama_kvp_memory *>(this);
    if (seq_id < 0) {
        for (auto & s : self->seqs) {
            self->state_write_seq(io, s);
        }
    } else {
        self->state_write_seq(io, self->seq_at(seq_id, "state save"));
    }
}

void llama_kvp_memory::state_write_seq(llama_io_write_i & io, seq_t & s) {
    state_prepare(s);

    const size_t n = kvp_state_size(s.cache);
    if (n == 0) {
        throw std::runtime_error(format("kvprune: kvp_state_size: %s", kvp_last_error(s.cache)));
    }
    std::vector<uint8_t> buf(n);
    size_t written = 0;
    if (kvp_state_save(s.cache, buf.data(), n, &written) != KVP_OK || written != n) {
        throw std::runtime_error(format("kvprune: kvp_state_save: %s", kvp_last_error(s.cache)));
    }
    const int32_t  pos  = s.pos_next;
    const uint64_t size = n;
    io.write(&kvp_state_magic,   sizeof(kvp_state_magic));
    io.write(&kvp_state_version, sizeof(kvp_state_version));
    io.write(&pos,  sizeof(pos));
    io.write(&size, sizeof(size));
    io.write(buf.data(), n);
}

void llama_kvp_memory::state_read(llama_io_read_i & io, llama_seq_id seq_id, llama_state_seq_flags flags) {
    GGML_UNUSED(flags);
    if (seq_id < 0) {
        for (auto & s : seqs) {
            state_read_seq(io, s);
        }
    } else {
        state_read_seq(io, seq_at(seq_id, "state load"));
    }
}

void llama_kvp_memory::state_read_seq(llama_io_read_i & io, seq_t & s) {
    uint32_t magic = 0, version = 0;
    int32_t  pos   = 0;
    uint64_t size  = 0;
    io.read(&magic, sizeof(magic));
    if (magic != kvp_state_magic) {
        throw std::runtime_error("kvprune: this state was not saved from a kvprune cache (llama.cpp's own KV cache "
                "writes another format): load it into a context without --kvp/KVP_SPEC");
    }
    io.read(&version, sizeof(version));
    if (version != kvp_state_version) {
        throw std::runtime_error(format("kvprune: state version %u, this port reads %u", version, kvp_state_version));
    }
    io.read(&pos,  sizeof(pos));
    io.read(&size, sizeof(size));
    if (pos < 0 || size == 0 || size > ((uint64_t) 1 << 48)) {
        throw std::runtime_error("kvprune: corrupted state header");
    }
    std::vector<uint8_t> buf(size);
    io.read(buf.data(), size);

    // kvp_state_load refuses an open draft and an open prompt; the load replaces everything anyway
    if (s.draft_open && !draft_commit(s, 0, "state load")) {
        throw std::runtime_error(format("kvprune: state load: closing the open draft: %s", kvp_last_error(s.cache)));
    }
    if (kvp_prompt_end(s.cache) != KVP_OK) {
        throw std::runtime_error(format("kvprune: state load: kvp_prompt_end: %s", kvp_last_error(s.cache)));
    }
    if (kvp_state_load(s.cache, buf.data(), size) != KVP_OK) {
        throw std::runtime_error(format("kvprune: kvp_state_load: %s", kvp_last_error(s.cache)));
    }
    s.pos_next = pos;
}

bool llama_kvp_memory::begin_ubatch(const llama_ubatch & ub, bool draft) {
    // init_batch checked that every token belongs to one sequence; split_seq puts one in a ubatch
    const llama_seq_id seq_id = ub.seq_id[0][0];
    seq_t & s = seqs[seq_id];
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
        if (ub.n_seq_id[i] != 1 || ub.seq_id[i][0] != seq_id) {
            LLAMA_LOG_ERROR("%s: kvprune: a ubatch holds tokens of several sequences\n", __func__);
            return false;
        }
        if (ub.pos[i] != s.pos_next + (llama_pos) i) {
            LLAMA_LOG_ERROR("%s: kvprune: sequence %d: token %u has position %d, the cache expects %d (positions must continue the sequence)\n",
                    __func__, seq_id, i, ub.pos[i], s.pos_next + (llama_pos) i);
            return false;
        }
    }
    // an open draft stays open while draft batches fit in it; anything else first commits it whole
    if (s.draft_open && (!draft || s.draft_n + ub.n_tokens > max_draft) && !draft_commit(s, s.draft_n, "next batch")) {
        return false;
    }
    if (draft && !s.draft_open) {
        if (kvp_draft_begin(s.cache) != KVP_OK) {
            LLAMA_LOG_ERROR("%s: kvprune: kvp_draft_begin: %s\n", __func__, kvp_last_error(s.cache));
            return false;
        }
        s.draft_open = true;
        s.draft_pos0 = s.pos_next;
        s.draft_n    = 0;
    }
    cur = &s;
    cur_pos.assign(ub.pos, ub.pos + ub.n_tokens);
    cur_draft = draft;
    // outside a draft, one token after the sequence began is a generated token (kvp_decode, which
    // ends an open prompt); anything else is prompt (kvp_prefill, whole-prompt selection with max_prompt)
    cur_decode = !draft && ub.n_tokens == 1 && s.pos_next > 0;
    if (draft) {
        s.draft_n += ub.n_tokens;
    }
    s.pos_next += ub.n_tokens;
    return true;
}

void llama_kvp_memory::compute(int il, ggml_tensor * dst, int nth) {
    par.nth = nth;
    compute_layer(il, dst);
    if (nth > 1) {
        par.call_done.store(1, std::memory_order_release); // the other threads leave the op
    }
}

void llama_kvp_memory::compute_layer(int il, ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];

    const uint32_t n_tokens = (uint32_t) q->ne[2];
    GGML_ASSERT(cur && n_tokens == cur_pos.size());
    kvp_cache * cache = cur->cache;

    const float * qd = (const float *) q->data;
    const float * kd = (const float *) k->data;
    const float * vd = (const float *) v->data;
    float       * od = (float *) dst->data;

    if (cur_draft) {
        // draft tokens: appended and attended over the kept tokens and the draft so far, nothing
        // pruned or scored until kvp_draft_commit
        if (kvp_prefill(cache, (uint32_t) il, n_tokens, cur_pos.data(), qd, kd, vd, od, nullptr) != KVP_OK) {
            GGML_ABORT("kvprune: layer %d, %u draft tokens at position %d (max_draft=%u): %s", il, n_tokens, cur_pos[0],
                    max_draft, kvp_last_error(cache));
        }
        return;
    }
    if (cur_decode) {
        if (kvp_decode(cache, (uint32_t) il, qd, kd, vd, od) != KVP_OK) {
            GGML_ABORT("kvprune: layer %d, decode at position %d: %s", il, cur_pos[0], kvp_last_error(cache));
        }
        return;
    }

    // a prompt ubatch: one kvp_prefill, or, when the layer cannot take it whole (a policy whose
    // capacity is below the ubatch, e.g. window/streaming), chunks of what the layer has room for
    // (a failed call changes nothing; each chunk's prune makes room for the next)
    const size_t q_row  = (size_t) q->ne[0] * q->ne[1];
    const size_t kv_row = (size_t) k->ne[0] * k->ne[1];
    uint32_t done = 0;
    while (done < n_tokens) {
        uint32_t n = n_tokens - done;
        kvp_status st = kvp_prefill(cache, (uint32_t) il, n, cur_pos.data() + done, qd + done * q_row,
                kd + done * kv_row, vd + done * kv_row, od + done * q_row, nullptr);
        if (st == KVP_ERR_FULL) {
            const uint32_t cap = kvp_layer_capacity(cache, (uint32_t) il);
            const uint32_t len = kvp_layer_len(cache, (uint32_t) il);
            if (cap > len && cap - len < n) {
                n = cap - len;
                st = kvp_prefill(cache, (uint32_t) il, n, cur_pos.data() + done, qd + done * q_row,
                        kd + done * kv_row, vd + done * kv_row, od + done * q_row, nullptr);
            }
        }
        if (st != KVP_OK) {
            GGML_ABORT("kvprune: layer %d, %u tokens at position %d: %s", il, n, cur_pos[done], kvp_last_error(cache));
        }
        done += n;
    }
}

// a waiting thread's spin: pause, and from the 1024th round on give the core away each round
// (a busy machine: the thread being waited for may be the one that needs it)
static inline void llama_kvp_relax(uint32_t & round) {
    if (++round > 1024) {
        std::this_thread::yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// job word: generation (bits 63..32) | n (31..16) | next participant id (15..0)
static inline uint32_t par_n(uint64_t j)    { return (uint32_t) (j >> 16) & 0xffffu; }
static inline uint32_t par_next(uint64_t j) { return (uint32_t) j & 0xffffu; }

bool llama_kvp_memory::par_claim(par_slot & p) {
    uint64_t j = p.job.load(std::memory_order_acquire);
    while (par_next(j) < par_n(j)) {
        // the id belongs to this generation: its job cannot end (nor task/arg change) before it ran
        if (p.job.compare_exchange_weak(j, j + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
            p.task(p.arg, par_next(j));
            p.done.fetch_add(1, std::memory_order_release);
            return true;
        }
    }
    return false;
}

// kvp_parallel_fn: called by kvprune on the op's first thread, inside its kvp_prefill/kvp_decode
void llama_kvp_memory::parallel_for(void * user, uint32_t n, void (*task)(void *, uint32_t), void * arg) {
    par_slot & p = *(par_slot *) user;
    if (p.nth <= 1) {
        for (uint32_t t = 0; t < n; ++t) {
            task(arg, t);
        }
        return;
    }
    ++p.jobs;
    p.task = task;
    p.arg  = arg;
    p.done.store(0, std::memory_order_relaxed);
    const uint64_t gen = (p.job.load(std::memory_order_relaxed) >> 32) + 1;
    p.job.store(gen << 32 | (uint64_t) n << 16, std::memory_order_release); // publish: ids 0..n-1 open
    while (par_claim(p)) {
    }
    // every id is claimed; wait for the ones other threads run (each is short: its work items)
    for (uint32_t round = 0; p.done.load(std::memory_order_acquire) < n;) {
        llama_kvp_relax(round);
    }
}

void llama_kvp_memory::op_help(int nth) {
    par_slot & p = par;
    for (uint32_t round = 0;;) {
        if (par_claim(p)) {
            round = 0;
            continue;
        }
        if (p.call_done.load(std::memory_order_acquire)) {
            break;
        }
        llama_kvp_relax(round);
    }
    // the last thread out resets the slot for the next op: the first thread (which set call_done)
    // and every other thread are held at ggml's barrier after this op until then
    if (p.left.fetch_add(1, std::memory_order_acq_rel) + 1 == nth - 1) {
        p.left.store(0, std::memory_order_relaxed);
        p.call_done.store(0, std::memory_order_release);
    }
}

static void llama_kvp_attn_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    // every thread of the graph enters the op; the first makes the kvprune call and the others
    // run the tasks it hands over (kvp_set_parallel), so kvprune uses exactly ggml's threads
    auto * op = (llama_kvp_memory::layer_op *) userdata;
    if (ith != 0) {
        op->mem->op_help(nth);
        return;
    }
    op->mem->compute(op->il, dst, nth);
}

ggml_tensor * llama_kvp_memory::build_attn(ggml_context * ctx0, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
        float kq_scale, int il) {
    GGML_ASSERT(il >= 0 && (uint32_t) il < n_layer);
    GGML_ASSERT(k && v && "kvprune: layers that reuse another layer's KV are not supported");
    GGML_ASSERT(q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32);
    if (fabsf(kq_scale - attn_scale) > 1e-6f * attn_scale) {
        GGML_ABORT("kvprune: layer %d uses the attention scale %g, the cache was created with %g", il, kq_scale, attn_scale);
    }
    // q [head_dim, n_head, n_tokens], k and v [head_dim, n_head_kv, n_tokens]: kvprune's row-major
    // [n_tokens][heads][head_dim] once contiguous
    if (!ggml_is_contiguous(q)) q = ggml_cont(ctx0, q);
    if (!ggml_is_contiguous(k)) k = ggml_cont(ctx0, k);
    if (!ggml_is_contiguous(v)) v = ggml_cont(ctx0, v);

    ggml_tensor * args[3] = { q, k, v };
    ggml_tensor * cur = ggml_custom_4d(ctx0, GGML_TYPE_F32, q->ne[0] * q->ne[1], q->ne[2], 1, 1,
            args, 3, llama_kvp_attn_op, GGML_N_TASKS_MAX, &ops[il]);
    return cur;
}

bool llm_graph_input_attn_kvp::can_reuse(const llm_graph_params & params) {
    const auto * m = dynamic_cast<const llama_kvp_context *>(params.mctx);
    return m && m->mem == mem;
}
