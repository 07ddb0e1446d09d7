// Test support for formatted storage (f16/q8/q4, ThinK): snapshots of what a store holds, as
// attention reads it, and a double-precision attention over such a snapshot.
#pragma once
#include <kvprune/kvprune.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "reference.h"

namespace qref {

struct Tok {
    std::vector<double> k, v;  // full width; ThinK-pruned channels 0; keys rotated at rot
    int64_t rot;
};

// Every kept token of (layer, head) as stored (quant/store_fmt.h fmt_read_token).
std::vector<Tok> snapshot(const kvp_cache *c, uint32_t layer, uint32_t head);

// Decode reference: the query heads of KV head `head` (pre-RoPE q rows [G][hd]) at cache
// position P attend over snap plus the new token (pre-RoPE k/v rows, at P as well). Realign:
// stored token j counts at position j (its key re-rotated by j - rot); original: as stored.
// out: [G][hd].
void decode_ref(const kvp_model &m, const std::vector<Tok> &snap, bool realign, const float *q, int64_t P,
                const float *knew, const float *vnew, std::vector<double> &out);

// Max |a - b| over n.
double max_abs(const float *a, const double *b, size_t n);

// A config from a spec (asserts it applies).
kvp_config config(const kvp_model &m, const std::string &spec);

}  // namespace qref
