// Configuration: defaults, the key=value spec parser, consistency checks and the values
// derived from a valid config (effective capacity and position mode).
#pragma once
#include <stdint.h>

#include "kvprune/kvprune.h"
#include "msg.h"

namespace kvp {

kvp_status config_default(kvp_config *cfg, const kvp_model *model, Msg &m);
kvp_status config_apply(kvp_config *cfg, const char *spec, Msg &m);
kvp_status config_check(const kvp_config &cfg, Msg &m);

// Derived values of a config that passed config_check.
kvp_positions config_positions(const kvp_config &cfg);  // ORIGINAL or REALIGN (never DEFAULT)
// Slots per pool block: quant_group for formatted storage (quant/format.h: kv_dtype != f32 or
// ThinK channel pruning; one block is one quantization group), else `block`.
uint32_t config_block(const kvp_config &cfg);

// Limits (documented in the header and docs/DECISIONS.md).
constexpr uint32_t kMaxHeadDim = 1024;
constexpr uint32_t kMaxHeads = 1024;
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxThreads = 256;
constexpr uint32_t kMaxCapacity = 1u << 28;
constexpr uint32_t kFullDefaultCapacity = 2048;
constexpr uint32_t kMaxBlock = 4096;

}  // namespace kvp
