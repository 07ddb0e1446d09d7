/*
 * Bare-metal smoke test of the Cortex-M build: a static arena, a streaming cache, 300 decode
 * steps. .ci/cross.sh links it with newlib-nano (nosys) and --gc-sections against the
 * heap-free libkvprune.a, checks with nm that the firmware image contains no allocator
 * (malloc/free/_sbrk) and reports its size. It is linked, not run.
 */
#include <stdint.h>

#include "kvprune/kvprune.h"

#define HEAD_DIM 32
static unsigned char arena[48 * 1024] __attribute__((aligned(64)));
static float q[2 * HEAD_DIM], k[HEAD_DIM], v[HEAD_DIM], out[2 * HEAD_DIM];
volatile int kvp_fw_result;

int main(void) {
    const kvp_model m = {1, 2, 1, HEAD_DIM, KVP_ROPE_NEOX, 0, 10000.0f};
    kvp_config cfg;
    kvp_cache *c;
    char err[64];
    uint32_t s = 1;
    if (kvp_config_default(&cfg, &m) != KVP_OK) return 1;
    if (kvp_config_apply(&cfg, "policy=streaming sinks=4 window=60 compress_every=8", err, sizeof err) != KVP_OK)
        return 2;
    if (kvp_arena_size(&cfg) > sizeof arena) return 3;
    /* A heap-free build has no NULL-arena path. */
    if (kvp_create(&cfg, 0, 0, &c) != KVP_ERR_UNSUPPORTED) return 4;
    if (kvp_create(&cfg, arena, sizeof arena, &c) != KVP_OK) return 5;
    for (int t = 0; t < 300; ++t) {
        for (int i = 0; i < 2 * HEAD_DIM; ++i) {
            s = s * 1664525u + 1013904223u;
            q[i] = (float)(int32_t)(s >> 20) / 2048.0f - 1.0f;
            if (i < HEAD_DIM) { k[i] = q[i] * 0.5f; v[i] = -q[i]; }
        }
        kvp_fw_result |= kvp_decode(c, 0, q, k, v, out);
    }
    kvp_stats st;
    st.struct_size = sizeof st;
    kvp_fw_result |= kvp_get_stats(c, &st);
    kvp_destroy(c);
    return kvp_fw_result;
}
