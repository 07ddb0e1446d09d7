// kvprune.hpp - a small C++17 RAII layer over the C API (header-only, no exceptions).
//
//   kvprune::Config cfg(model);
//   if (cfg.apply("policy=streaming sinks=4 window=1020") != KVP_OK) puts(cfg.error());
//   kvprune::Cache cache;
//   if (cache.create(cfg.get()) != KVP_OK) ...;     // owns a 64-byte aligned arena
//   cache.decode(layer, q, k, v, out);
//
// Errors are kvp_status values as in the C API; messages via error()/last_error().
#pragma once
#include <stdlib.h>

#include <memory>

#include "kvprune.h"

namespace kvprune {

class Config {
public:
    explicit Config(const kvp_model &model) { status_ = kvp_config_default(&cfg_, &model); }
    // KVP_OK unless the model was invalid (then every later call fails too).
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

// A cache and the arena it lives in; movable, not copyable.
class Cache {
public:
    Cache() = default;
    // Allocates the arena (the only allocation) and creates the cache in it.
    kvp_status create(const kvp_config &cfg) {
        reset_handle();
        const size_t n = kvp_arena_size(&cfg);
        if (n == 0) return kvp_config_check(&cfg, nullptr, 0);
        arena_.reset(static_cast<unsigned char *>(aligned_alloc(64, (n + 63) / 64 * 64)));
        if (!arena_) return KVP_ERR_ARENA;
        kvp_cache *c = nullptr;
        const kvp_status st = kvp_create(&cfg, arena_.get(), n, &c);
        if (st == KVP_OK) handle_.reset(c);
        else arena_.reset();
        return st;
    }
    kvp_status prefill(uint32_t layer, uint32_t n, const int32_t *pos, const float *q, const float *k,
                       const float *v, float *out, kvp_selection *sel = nullptr) {
        return kvp_prefill(handle_.get(), layer, n, pos, q, k, v, out, sel);
    }
    kvp_status decode(uint32_t layer, const float *q, const float *k, const float *v, float *out) {
        return kvp_decode(handle_.get(), layer, q, k, v, out);
    }
    kvp_status append(uint32_t layer, uint32_t n, const int32_t *pos, const float *k, const float *v) {
        return kvp_append(handle_.get(), layer, n, pos, k, v);
    }
    kvp_status reset() { return kvp_reset(handle_.get()); }
    uint32_t layer_len(uint32_t layer) const { return kvp_layer_len(handle_.get(), layer); }
    kvp_status stats(kvp_stats *s) const {
        s->struct_size = sizeof *s;
        return kvp_get_stats(handle_.get(), s);
    }
    const char *last_error() const { return kvp_last_error(handle_.get()); }
    kvp_cache *get() const { return handle_.get(); }
    explicit operator bool() const { return handle_ != nullptr; }

private:
    struct Destroy {
        void operator()(kvp_cache *c) const noexcept { kvp_destroy(c); }
    };
    struct Free {
        void operator()(unsigned char *p) const noexcept { free(p); }
    };
    void reset_handle() {
        handle_.reset();
        arena_.reset();
    }
    // Declared first so the handle is destroyed before its arena is freed.
    std::unique_ptr<unsigned char, Free> arena_;
    std::unique_ptr<kvp_cache, Destroy> handle_;
};

}  // namespace kvprune
