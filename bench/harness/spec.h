// Policy specs as the CLI takes them: stricter than kvp_config_apply (which lets the last of a
// repeated key win, and accepts keys the policy ignores in a spec without policy=, for programs
// that compose specs) and with the kvpress-style shorthand compression_ratio=r.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoint.h"
#include "kvprune/kvprune.h"

namespace kvh {

// Validates a spec against a checkpoint's geometry and resolves compression_ratio for a sequence
// of `seq_len` tokens (0 = not known: compression_ratio is then an error). Errors, each with a
// message naming the key: an empty spec, a token that is not key=value, a repeated key, an
// unknown key (the library suggests the nearest), a key the chosen policy ignores (the message
// lists the policy's keys), and every library error. On success *resolved is the spec with
// compression_ratio (and ratio_tokens, default seq_len) replaced by the keys whose values it
// changed (otherwise the spec as given, trimmed) and *cfg its configuration.
bool resolve_spec(const ModelConfig &mc, const std::string &spec, int64_t seq_len, std::string *resolved,
                  kvp_config *cfg, std::string *err);

// compression_ratio=r (the fraction of the KV cache removed, 0 <= r < 1, as in kvpress) for a
// sequence of seq_len tokens: resolved by the library (kvp_config_apply with compression_ratio=r
// ratio_tokens=seq_len; the per-policy table is documented in kvprune.h). Returns the fields it
// changes as keys ("window=48"), or "" with *err set (the library's message).
std::string compression_keys(const kvp_config &cfg, double ratio, int64_t seq_len, std::string *err);

// "window; common: policy, capacity, ..." : the keys policy uses, for messages and `kvprune keys`.
std::string policy_keys_text(const kvp_config &cfg);

// `kvprune run`'s arena check (issue 28): "" when the arena of cfg is at most 8x what a run of
// `tokens` tokens needs (a cache keeping all of them: policy=full at capacity tokens + max_draft),
// else one line naming the arena size, the size the run needs and the key to lower (of capacity,
// budget, window, prefill_stage: the one whose value = tokens shrinks the arena most).
std::string arena_warning(const kvp_config &cfg, int64_t tokens);

}  // namespace kvh
