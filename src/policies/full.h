// Full KV: keep every token up to the layer's capacity, then KVP_ERR_FULL (the reference every
// other policy is measured against). It cannot evict, so with a shared pool that runs dry it
// answers KVP_ERR_FULL too, with nothing changed. Default positions: original.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kFullPolicy;

}  // namespace kvp
