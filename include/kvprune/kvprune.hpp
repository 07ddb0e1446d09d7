// kvprune.hpp - a small C++17 RAII layer over the C API (header-only, no exceptions).
//
//   kvprune::Config cfg(model);
//   if (cfg.apply("policy=streaming sinks=4 window=1020") != KVP_OK) puts(cfg.error());
//   kvprune::Cache cache;
//   if (cache.create(cfg.get()) != KVP_OK) puts(cache.create_error());  // owns a 64-byte aligned arena
//   cache.decode(layer, q, k, v, out);
//
// Errors are kvp_status values as in the C API; messages via error()/last_error().
#pragma once
#include <stdlib.h>

#include "kvprune.h"

namespace kvprune {

class Config {
public:
    explicit Config(const kvp_model &model) { status_ = kvp_config_default_ex(&cfg_, &model, err_, sizeof err_); }
    // KVP_OK unless the model was invalid (then every later call fails too; error() says which field).
    kvp_status status() const { return status_; }
    kvp_status apply(const char *spec) {
        if (status_ != KVP_OK) return status_;
        return kvp_config_apply(&cfg_, spec, err_, sizeof err_);
    }
    kvp_status check() { return status_ != KVP_OK ? status_ : kvp_config_check(&cfg_, err_, sizeof err_); }
    size_t arena_size() const { return status_ == KVP_OK ? kvp_arena_size(&cfg_) : 0; }
    const char *error() const { return err_; }
    kvp_config &get() { return cfg_; }
    const kvp_config &get() const { return cfg_; }

private:
    kvp_config cfg_{};
    kvp_status status_;
    char err_[256] = "";
};

// A cache and the arena it lives in; movable, not copyable. The handle lives inside the arena,
// so every path destroys the handle before it frees the arena (move assignment included).
class Cache {
public:
    Cache() = default;
    ~Cache() { release(); }
    Cache(const Cache &) = delete;
    Cache &operator=(const Cache &) = delete;
    Cache(Cache &&o) noexcept : arena_(o.arena_), handle_(o.handle_) {
        o.arena_ = nullptr;
        o.handle_ = nullptr;
    }
    Cache &operator=(Cache &&o) noexcept {
        if (this != &o) {
            release();  // this cache's handle, then its arena
            arena_ = o.arena_;
            handle_ = o.handle_;
            o.arena_ = nullptr;
            o.handle_ = nullptr;
        }
        return *this;
    }
    // Allocates an arena (the only allocation) and creates a cache for cfg in it. On success it
    // replaces the cache this object held; on failure the old cache is kept, unchanged, and
    // create_error() says why.
    kvp_status create(const kvp_config &cfg) { return create(cfg, nullptr, 0); }
    // create() whose RoPE uses the caller's inverse frequencies inv_freq[n_freqs] (rope_dim/2;
    // kvp_create_rope: copied into the arena; nullptr/0 = theta's). Build the table with
    // kvp_rope_freqs_linear/_llama3/_yarn/_divided.
    kvp_status create(const kvp_config &cfg, const double *inv_freq, uint32_t n_freqs) {
        return create(cfg, inv_freq, n_freqs, nullptr, 0);
    }
    // create() with a DuoAttention role table roles[n_roles] (kvp_create_heads: KVP_HEAD_RETRIEVAL
    // or KVP_HEAD_STREAMING per layer and KV head, layer-major; nullptr/0 = none) and the arena
    // kvp_arena_size_heads says.
    kvp_status create(const kvp_config &cfg, const double *inv_freq, uint32_t n_freqs, const uint8_t *roles,
                      uint32_t n_roles) {
        err_[0] = '\0';
        const size_t n = kvp_arena_size_heads(&cfg, roles, n_roles);
        if (n == 0) {  // the library's message: its checks fail before anything is allocated
            kvp_cache *none = nullptr;
            const kvp_status st = kvp_create_heads(&cfg, inv_freq, n_freqs, roles, n_roles, nullptr, 0, &none, err_, sizeof err_);
            if (st == KVP_OK) kvp_destroy(none);
            return st != KVP_OK ? st : KVP_ERR_CONFIG;
        }
        // from 2 MiB on: whole huge pages, advised before create writes them (kvp_arena_advise)
        const size_t al = n >= (size_t(2) << 20) ? size_t(2) << 20 : 64;
        void *mem = n <= SIZE_MAX - al ? aligned_alloc(al, (n + al - 1) / al * al) : nullptr;
        if (mem && al > 64) kvp_arena_advise(mem, (n + al - 1) / al * al);
        if (!mem) {
            copy_error("KVP_ERR_ARENA: arena too small or misaligned: cannot allocate the arena");
            return KVP_ERR_ARENA;
        }
        kvp_cache *c = nullptr;
        const kvp_status st = kvp_create_heads(&cfg, inv_freq, n_freqs, roles, n_roles, mem, n, &c, err_, sizeof err_);
        if (st != KVP_OK) {
            free(mem);
            return st;
        }
        release();
        arena_ = mem;
        handle_ = c;
        return KVP_OK;
    }
    kvp_status prefill(uint32_t layer, uint32_t n, const int32_t *pos, const float *q, const float *k,
                       const float *v, float *out, kvp_selection *sel = nullptr) {
        return kvp_prefill(handle_, layer, n, pos, q, k, v, out, sel);
    }
    kvp_status decode(uint32_t layer, const float *q, const float *k, const float *v, float *out) {
        return kvp_decode(handle_, layer, q, k, v, out);
    }
    kvp_status append(uint32_t layer, uint32_t n, const int32_t *pos, const float *k, const float *v) {
        return kvp_append(handle_, layer, n, pos, k, v);
    }
    // Half-precision rows (kvp_prefill_ex / kvp_decode_ex / kvp_append_ex): q, k, v and out hold
    // `dtype` elements (uint16_t for KVP_IO_F16 / KVP_IO_BF16).
    kvp_status prefill(uint32_t layer, uint32_t n, const int32_t *pos, kvp_io_dtype dtype, const void *q,
                       const void *k, const void *v, void *out, kvp_selection *sel = nullptr) {
        return kvp_prefill_ex(handle_, layer, n, pos, dtype, q, k, v, out, sel);
    }
    kvp_status decode(uint32_t layer, kvp_io_dtype dtype, const void *q, const void *k, const void *v, void *out) {
        return kvp_decode_ex(handle_, layer, dtype, q, k, v, out);
    }
    kvp_status append(uint32_t layer, uint32_t n, const int32_t *pos, kvp_io_dtype dtype, const void *k,
                      const void *v) {
        return kvp_append_ex(handle_, layer, n, pos, dtype, k, v);
    }
    kvp_status reset() { return kvp_reset(handle_); }
    // Whole-prompt selection (config max_prompt): ends the prompt now (kvp_prompt_end).
    kvp_status prompt_end() { return kvp_prompt_end(handle_); }
    // TriAttention's query statistics from the caller (tri_stats=given; kvp_query_stats_set).
    kvp_status query_stats_set(uint32_t layer, uint32_t q_head, const float *mean, const float *abs_mean,
                               uint32_t n_units) {
        return kvp_query_stats_set(handle_, layer, q_head, mean, abs_mean, n_units);
    }
    // The host's parallel-for (kvp_set_parallel; config thread_pool=host starts no workers): fn
    // must call task(arg, t) once for every t in [0, n) and return after all returned; user must
    // outlive the setting. nullptr restores the default.
    kvp_status set_parallel(kvp_parallel_fn fn, void *user) { return kvp_set_parallel(handle_, fn, user); }
    // Speculative decoding (kvp_draft_begin / kvp_draft_commit).
    kvp_status draft_begin() { return kvp_draft_begin(handle_); }
    kvp_status draft_commit(uint32_t accepted) { return kvp_draft_commit(handle_, accepted); }
    // State save/load (kvp_state_size / kvp_state_save / kvp_state_load), caller memory.
    size_t state_size() const { return kvp_state_size(handle_); }
    kvp_status state_save(void *buf, size_t size, size_t *written = nullptr) const {
        return kvp_state_save(handle_, buf, size, written);
    }
    kvp_status state_load(const void *buf, size_t size) { return kvp_state_load(handle_, buf, size); }
    uint32_t layer_len(uint32_t layer) const { return kvp_layer_len(handle_, layer); }
    kvp_status stats(kvp_stats *s) const {
        s->struct_size = sizeof *s;
        return kvp_get_stats(handle_, s);
    }
    // Message of the last failed call on the cache (kvp_last_error).
    const char *last_error() const { return kvp_last_error(handle_); }
    // Why the last create() failed ("" after a successful one).
    const char *create_error() const { return err_; }
    kvp_cache *get() const { return handle_; }
    explicit operator bool() const { return handle_ != nullptr; }

private:
    void release() noexcept {
        kvp_destroy(handle_);  // first: the handle lives in the arena
        handle_ = nullptr;
        free(arena_);
        arena_ = nullptr;
    }
    void copy_error(const char *m) {
        size_t i = 0;
        for (; m[i] && i + 1 < sizeof err_; ++i) err_[i] = m[i];
        err_[i] = '\0';
    }
    void *arena_ = nullptr;
    kvp_cache *handle_ = nullptr;
    char err_[256] = "";
};

}  // namespace kvprune
