// Rotary position embedding (RoPE): Su et al., "RoFormer" (2021), Sec. 3.4.
// Pair i (i < rope_dim/2) rotates by angle pos * theta^(-2i/rope_dim):
//   NEOX rotates (x[i], x[i + rope_dim/2]); GPTJ rotates (x[2i], x[2i+1]) as llama2.c does.
// Dimensions past rope_dim are not rotated (partial rotary).
// Angles are formed in double (pos * inv_freq) so large positions lose no precision.
#pragma once
#include <stdint.h>

#include "kernels/vec_f32.h"
#include "msg.h"
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
    // Rotation kernel for the style (vec_f32.h; NULL: the scalar reference).
    kern::f32_rope_fn rot;
    // Tables of the current call's positions, computed by the calling thread before any
    // per-head work (rope_call_prepare) and read by every thread: range 0 holds the new keys'
    // rotation positions (original: the tokens' positions; realign ring: L0 + shift + i, which
    // are also the queries' positions over the ring run), range 1 (realign stores with a pinned
    // prefix: streaming's sinks) the queries' positions over the pinned run, L0 + i. Prefill
    // computes a chunk's tables once instead of once per KV head for keys and again for
    // queries; a later layer's call with the same positions (decode of one token over all
    // layers) reuses them. Each range holds up to call_cap tables, full_floats apart, in the
    // arena (call: call_ranges * call_cap tables; call_cap = 0: none).
    float *call;
    int64_t call_first[2];
    uint32_t call_n[2], call_cap, call_ranges;
};

// Fills inv_freq[pairs] for model m.
void rope_init_freqs(const kvp_model &m, double *inv_freq, uint32_t pairs);

// ---- RoPE frequency tables from published scaling schemes (issue 21; kvprune.h, docs/rope.md) ----
// Each fills inv_freq[n] (n = rope_dim/2 pairs) from theta^(-i/n), computed with the
// deterministic double routines of score_fixed.h (the same bits on every IEEE-754 platform; with
// factor 1 / divisors 1 exactly the table score=fixed derives from theta). On a bad parameter
// they write the reason into m, return KVP_ERR_ARG/KVP_ERR_CONFIG and leave inv_freq untouched.
kvp_status rope_freqs_linear(double *inv_freq, uint32_t n, double theta, double factor, Msg &m);
kvp_status rope_freqs_llama3(double *inv_freq, uint32_t n, double theta, double factor, double low_freq_factor,
                             double high_freq_factor, double original_max_pos, Msg &m);
kvp_status rope_freqs_yarn(double *inv_freq, uint32_t n, double theta, double factor, double original_max_pos,
                           double beta_fast, double beta_slow, float *attn_factor, Msg &m);
kvp_status rope_freqs_divided(double *inv_freq, uint32_t n, double theta, const float *divisors, Msg &m);
// A caller's table against a valid config: n == pairs, entries finite and > 0.
kvp_status rope_table_check(const kvp_config &cfg, const double *inv_freq, uint32_t n, Msg &m);
// Fingerprint of a caller's table for kvp_state_save/load: 0 = none (theta), else a nonzero
// hash of the table's bits.
uint32_t rope_table_fingerprint(const double *inv_freq, uint32_t n);

// cs[2*i] = cos(pos*f_i), cs[2*i+1] = sin(pos*f_i) for i < pairs.
void rope_table(const Rope &r, int64_t pos, float *cs);

// Rotates `n` vectors x[j*ld + 0..head_dim) in place with the table cs (r.rot's kernel).
void rope_apply(const Rope &r, const float *cs, float *x, uint32_t n, uint32_t ld);

// Makes call range `range` hold the tables of positions first..first+n-1 (up to call_cap of
// them): kept when it (or, for range 1, range 0) already does, else recomputed. Runs on the
// calling thread before the per-head work.
void rope_call_prepare(Rope &r, uint32_t range, int64_t first, uint32_t n);

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
// The table for pos: from the precomputed tables or the call tables when pos is inside them,
// else from the memo (computed on a miss; valid until the next lookup that maps to its entry).
const float *rope_table_memo(const Rope &r, RopeMemo &m, int64_t pos);
// Floats of one table (64-byte aligned) for `pairs` rotation pairs.
inline size_t rope_table_floats(uint32_t pairs) { return (2 * size_t(pairs) + 15) / 16 * 16; }

}  // namespace kvp
