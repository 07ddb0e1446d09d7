// Rotary position embedding (RoPE): Su et al., "RoFormer" (2021), Sec. 3.4.
// Pair i (i < rope_dim/2) rotates by angle pos * theta^(-2i/rope_dim):
//   NEOX rotates (x[i], x[i + rope_dim/2]); GPTJ rotates (x[2i], x[2i+1]) as llama2.c does.
// Dimensions past rope_dim are not rotated (partial rotary).
// Angles are formed in double (pos * inv_freq) so large positions lose no precision.
#pragma once
#include <stdint.h>

#include "kvprune/kvprune.h"

namespace kvp {

struct Rope {
    kvp_rope_style style;
    uint32_t pairs;          // rope_dim / 2 (0 when style is NONE)
    const double *inv_freq;  // [pairs], lives in the arena
    // Optional precomputed tables for positions [0, full_n) (full_n = 0: none), each
    // full_floats apart. Realign with compacting stores rotates only at positions below twice
    // the capacity (storage.h), so those caches precompute them at create and never call trig
    // while decoding, whatever the number of runs.
    const float *full;
    uint32_t full_n, full_floats;
};

// Fills inv_freq[pairs] for model m.
void rope_init_freqs(const kvp_model &m, double *inv_freq, uint32_t pairs);

// cs[2*i] = cos(pos*f_i), cs[2*i+1] = sin(pos*f_i) for i < pairs.
void rope_table(const Rope &r, int64_t pos, float *cs);

// Rotates `n` vectors x[j*ld + 0..head_dim) in place with the table cs.
void rope_apply(const Rope &r, const float *cs, float *x, uint32_t n, uint32_t ld);

// Tables one thread computed, direct-mapped by position (entry pos % kRopeMemoEntries). A
// table depends only on the position, so entries never go stale. A decode step needs the same
// few positions for all KV heads (streaming: two), and a realign store after scattered
// evictions needs one per run of equal delta, mostly the same set from step to step (h2o's
// recent window: P..P+recent-1), so each thread computes a table once, not once per head/step.
constexpr uint32_t kRopeMemoEntries = 32;
struct RopeMemo {
    int64_t pos[kRopeMemoEntries];  // INT64_MIN: empty
    float *tables;   // [kRopeMemoEntries][table_floats], in the arena
    uint32_t table_floats;
};
// Empties a memo whose tables live at `tables`.
void rope_memo_init(RopeMemo &m, float *tables, uint32_t table_floats);
// Floats of one memo's tables for `pairs` rotation pairs (each table 64-byte aligned).
size_t rope_memo_floats(uint32_t pairs);
// The table for pos: from the precomputed tables when pos is inside them, else from the memo
// (computed on a miss; valid until the next lookup that maps to its entry).
const float *rope_table_memo(const Rope &r, RopeMemo &m, int64_t pos);
// Floats of one table (64-byte aligned) for `pairs` rotation pairs.
inline size_t rope_table_floats(uint32_t pairs) { return (2 * size_t(pairs) + 15) / 16 * 16; }

}  // namespace kvp
