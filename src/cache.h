// The cache object (lives at offset 0 of its arena) and the operations behind the C API.
// Inputs reaching these functions were validated by capi/: they do not fail.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "kernels/attn_f32.h"
#include "kvprune/kvprune.h"
#include "msg.h"
#include "policies/streaming.h"
#include "rope.h"
#include "storage.h"

namespace kvp {

struct LayerState {
    int64_t next_pos;   // position of the next token when the caller passes none
    uint64_t rows;      // tokens kept, summed over the layer's KV heads
};

enum class StepMode { kPrefill, kDecode, kAppend };

}  // namespace kvp

struct kvp_cache {
    uint32_t magic;
    kvp_config cfg;
    kvp::ArenaPlan plan;
    uint32_t group;            // query heads per KV head
    kvp_positions positions;   // ORIGINAL or REALIGN
    bool streaming;            // streaming/window rule applies
    kvp::StreamingRule rule;
    float scale;               // 1/sqrt(head_dim)
    kvp::Rope rope;
    const kvp::kern::AttnF32 *kern;
    kvp::LayerState *layers;
    kvp::HeadStore *heads;     // [layer * n_kv_heads + head]
    float *scratch;            // [threads][plan.scratch_floats]
    kvp::RopeMemo *memos;      // [threads]
    void *owned;               // internal allocation freed by kvp_destroy (NULL-arena path)
    uint64_t live_rows, peak_rows, tokens_seen;
    char last_error[256];
};

namespace kvp {

constexpr uint32_t kMagic = 0x4b565052u;      // "KVPR"
constexpr uint32_t kDeadMagic = 0x4b564444u;  // "KVDD": set by kvp_destroy

// Builds a cache in `arena` (>= plan.total bytes, 64-aligned) for a checked config.
kvp_cache *cache_init(const kvp_config &cfg, const ArenaPlan &plan, void *arena);
void cache_reset(kvp_cache *c);
// Appends n tokens to a layer, runs attention per mode, applies the policy.
void cache_step(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, const float *q,
                const float *k, const float *v, float *out, StepMode mode);
inline HeadStore &head_of(kvp_cache *c, uint32_t layer, uint32_t h) {
    return c->heads[size_t(layer) * c->cfg.model.n_kv_heads + h];
}
inline const HeadStore &head_of(const kvp_cache *c, uint32_t layer, uint32_t h) {
    return c->heads[size_t(layer) * c->cfg.model.n_kv_heads + h];
}
// Thread tid's working scratch (after its RoPE tables).
inline float *scratch_of(kvp_cache *c, size_t tid) {
    return c->scratch + tid * c->plan.scratch_floats + c->plan.memo_floats;
}
inline uint64_t row_bytes(const kvp_cache *c) { return uint64_t(c->plan.stride) * sizeof(float); }

}  // namespace kvp
