// Policy specs as the CLI takes them: stricter than kvp_config_apply (which lets the last of a
// repeated key win and accepts keys the policy ignores, for programs that compose specs) and
// with the kvpress-style shorthand compression_ratio=r.
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
// compression_ratio replaced by the keys it sets (otherwise the spec as given, trimmed) and
// *cfg its configuration.
bool resolve_spec(const ModelConfig &mc, const std::string &spec, int64_t seq_len, std::string *resolved,
                  kvp_config *cfg, std::string *err);

// compression_ratio=r (the fraction of the KV cache removed, 0 <= r < 1, as in kvpress): the
// tokens kept, K = max(1, round((1 - r) * seq_len)), and the keys each policy gets:
//   window: window=K; streaming: window=K-sinks-extra (>= 1); h2o, snapkv, pyramidkv, asl:
//   budget=K; lethe: capacity=K (a hard cap: Lethe may keep fewer); simlayerkv: window=K-sinks
//   (lazy layers) and budget=K (nonlazy snapkv/h2o layers); think: key_channel_ratio =
//   value_channel_ratio = r (channels, not tokens); full: an error (it keeps everything).
// Returns the keys ("window=48") or "" with *err set.
std::string compression_keys(const kvp_config &cfg, double ratio, int64_t seq_len, std::string *err);

// "window; common: policy, capacity, ..." : the keys policy uses, for messages and `kvprune keys`.
std::string policy_keys_text(const kvp_config &cfg);

}  // namespace kvh
