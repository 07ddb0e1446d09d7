// Arena layout: every byte a cache uses, planned from the config alone (kvp_arena_size is exact).
//
//   [kvp_cache object]                                    one struct, 64-aligned
//   [LayerState x n_layers]
//   [HeadStore  x n_layers*n_kv_heads]
//   [inv_freq   x rope_dim/2 doubles]
//   per (layer, kv head), for each of its `cap` slots:    (layer-major, then head)
//     K rows [cap][stride] f32, V rows [cap][stride] f32, pos [cap] i32, score [cap] f32
//   RopeMemo x threads
//   scratch x threads: RoPE tables (memo), then decode logits [G][logit_ld] and rotated
//                      queries, or prefill tiles
//
// Every region starts on a 64-byte boundary; a row's stride is head_dim rounded up to 16
// floats so every K/V row is 64-byte aligned. tests/test_capi.cpp pins the byte count.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvprune/kvprune.h"

namespace kvp {

constexpr size_t kAlign = 64;
constexpr uint32_t kTileTokens = 4;   // prefill: query tokens per tile
constexpr uint32_t kKeyBlock = 128;   // prefill: keys per online-softmax block

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

struct ArenaPlan {
    uint32_t stride;          // floats per K/V row
    uint32_t cap;             // slots per (layer, head)
    uint32_t logit_ld;        // decode logits row stride (floats)
    size_t off_layers, off_heads, off_freqs, off_rows, head_bytes;
    size_t off_memos;
    size_t off_scratch, scratch_floats;  // per thread, of which the first memo_floats are RoPE tables
    size_t memo_floats;
    size_t total;
};

// Plans the arena of a config that passed config_check; false on size overflow.
bool arena_plan(const kvp_config &cfg, ArenaPlan *p);

}  // namespace kvp
