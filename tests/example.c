/* Minimal C99 use of kvprune: a streaming cache in caller memory, 200 decode steps over
 * 2 layers, then the counters. Built with -std=c99 -pedantic in CI, run by ctest, and
 * compiled against the installed library with `pkg-config --static --cflags --libs kvprune`. */
#include <kvprune/kvprune.h>
#include <stdio.h>
#include <stdlib.h>

#define NQ 4
#define NKV 2
#define HD 16

int main(void) {
    kvp_model model = {2, NQ, NKV, HD, KVP_ROPE_GPTJ, 0, 10000.0f};
    kvp_config cfg;
    char err[256];
    kvp_cache *cache = NULL;
    kvp_stats st;
    float q[NQ * HD], k[NKV * HD], v[NKV * HD], out[NQ * HD];
    size_t bytes;
    void *raw;
    char *arena;
    unsigned t, l, i, kept;

    if (kvp_config_default(&cfg, &model) != KVP_OK) return 1;
    if (kvp_config_apply(&cfg, "policy=streaming sinks=4 window=60 compress_every=8", err, sizeof err) != KVP_OK) {
        fprintf(stderr, "config: %s\n", err);
        return 1;
    }
    bytes = kvp_arena_size(&cfg);
    raw = malloc(bytes + 63); /* C99 has no aligned_alloc: align by hand */
    if (!raw) return 1;
    arena = (char *)raw + (64 - (size_t)raw % 64) % 64;
    if (kvp_create(&cfg, arena, bytes, &cache) != KVP_OK) return 1;

    for (t = 0; t < 200; ++t) {
        for (l = 0; l < model.n_layers; ++l) {
            for (i = 0; i < NQ * HD; ++i) q[i] = (float)((t * 7 + i * 3 + l) % 17) / 17.0f - 0.5f;
            for (i = 0; i < NKV * HD; ++i) {
                k[i] = (float)((t * 5 + i * 11 + l) % 13) / 13.0f - 0.5f;
                v[i] = (float)((t * 3 + i) % 19) / 19.0f;
            }
            if (kvp_decode(cache, l, q, k, v, out) != KVP_OK) {
                fprintf(stderr, "decode: %s\n", kvp_last_error(cache));
                return 1;
            }
        }
    }
    st.struct_size = sizeof st;
    if (kvp_get_stats(cache, &st) != KVP_OK) return 1;
    kept = kvp_layer_len(cache, 0);
    printf("kvprune %u.%u.%u: kept %u of %llu tokens, live %llu B (peak %llu B) in a %llu B arena, %llu prunes\n",
           kvp_version() >> 16, (kvp_version() >> 8) & 255u, kvp_version() & 255u, kept,
           (unsigned long long)st.tokens_seen, (unsigned long long)st.live_bytes,
           (unsigned long long)st.peak_live_bytes, (unsigned long long)st.arena_bytes,
           (unsigned long long)st.prune_events);
    kvp_destroy(cache);
    free(raw);
    /* 200 tokens, C = 64, R = 8: the layer holds between 64 and 71 tokens */
    return st.tokens_seen == 200 && kept >= 64 && kept < 72 ? 0 : 1;
}
