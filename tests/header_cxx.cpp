// The public header compiles as C++ (the C99 check is tests/example.c) and its pinned
// numbers are what DESIGN.md says.
#include <kvprune/kvprune.h>

static_assert(KVP_OK == 0 && KVP_ERR_ARG == 1 && KVP_ERR_CONFIG == 2 && KVP_ERR_ARENA == 3 &&
                  KVP_ERR_LAYER == 4 && KVP_ERR_FULL == 5 && KVP_ERR_NONFINITE == 6 &&
                  KVP_ERR_STATE == 7 && KVP_ERR_UNSUPPORTED == 8,
              "status codes are pinned");
static_assert(KVP_ROPE_NONE == 0 && KVP_ROPE_NEOX == 1 && KVP_ROPE_GPTJ == 2, "rope styles are pinned");
static_assert(offsetof(kvp_config, struct_size) == 0 && offsetof(kvp_stats, struct_size) == 0,
              "struct_size comes first");
static_assert(sizeof(kvp_status) == 4 && sizeof(kvp_policy) == 4 && sizeof(kvp_rope_style) == 4 &&
                  sizeof(kvp_positions) == 4 && sizeof(kvp_dtype) == 4 && sizeof(kvp_score_mode) == 4 &&
                  sizeof(kvp_pool) == 4,
              "enums are int-sized (FORCE_INT32 sentinels)");
