// Configuration: the key table (names, types, defaults, ranges, which policies use each key),
// defaults, the key=value spec parser, consistency checks, versioned-struct loading and the
// values derived from a valid config (effective capacity and position mode).
//
// One table (kKeys in config.cpp) drives kvp_config_default, kvp_config_apply, kvp_config_check
// and kvp_config_key, so a range or default cannot differ between them.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvprune/kvprune.h"
#include "msg.h"
#include "policies/policy.h"  // the draft room and capacity rules, kMaxCapacity, kFullDefaultCapacity

namespace kvp {

// Full-size config (struct_size == sizeof(kvp_config)) filled with the defaults for model.
kvp_status config_default(kvp_config *cfg, const kvp_model *model, Msg &m);
// Writes the defaults for model into the caller's first `size` bytes (size accepted by
// config_size_ok); *cfg is unchanged on failure.
kvp_status config_init(kvp_config *cfg, uint32_t size, const kvp_model *model, Msg &m);
// Copies a caller's config (its struct_size bytes) into *full, the fields it lacks set to their
// defaults; KVP_ERR_ARG for NULL or a struct_size not accepted.
kvp_status config_load(const kvp_config *user, kvp_config *full, Msg &m);
// Applies a spec to a caller's config (its struct_size bytes) and checks the result.
kvp_status config_apply(kvp_config *cfg, const char *spec, Msg &m);
// Checks a full-size (loaded) config.
kvp_status config_check(const kvp_config &cfg, Msg &m);

// The key table.
uint32_t config_key_count();
bool config_key_info(uint32_t index, kvp_key_info *info);  // info has a valid struct_size
// The stored value `word` of the kvp_config field at byte `off` as a person reads it: an enum's
// name (q8, not 2), a float's value, a number (state.cpp's messages).
void config_word_text(size_t off, uint32_t word, Msg &m);
int config_key_used(const kvp_config &full, const char *name);

// Versioned structs: size between the first released layout and the library's, multiple of 4.
bool struct_size_ok(uint32_t size, size_t first_layout, size_t known);
constexpr size_t kConfigFirstSize = KVP_CONFIG_SIZE_0_1;

// Derived values of a config that passed config_check.
kvp_positions config_positions(const kvp_config &cfg);  // ORIGINAL or REALIGN (never DEFAULT)
// Slots per pool block: quant_group for formatted storage (quant/format.h: kv_dtype != f32 or
// ThinK channel pruning; one block is one quantization group), else `block`.
uint32_t config_block(const kvp_config &cfg);
// A DuoAttention role table (kvp_create_heads) for a checked config: roles NULL with n 0 (none),
// or n == n_layers * n_kv_heads entries of 0/1; with a streaming head also duo_window >= 1,
// duo_sink + duo_window within the capacity limit, max_draft <= duo_window, and a supported
// configuration (DECISIONS "DuoAttention heads"). *stream (may be NULL): the table has a
// streaming head.
kvp_status roles_check(const kvp_config &cfg, const uint8_t *roles, uint32_t n, bool *stream, Msg &m);


// Limits (documented in the header and docs/DECISIONS.md).
constexpr uint32_t kMaxHeadDim = 1024;
constexpr uint32_t kMaxHeads = 1024;
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxThreads = 256;
constexpr uint32_t kMaxBlock = 4096;
constexpr uint32_t kMaxDraft = 4096;  // max_draft (issue 21)

}  // namespace kvp
