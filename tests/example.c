/* kvprune from C99: a streaming cache in caller memory, 200 decode steps over 2 layers.
 * Every status is checked; every message is printed as the library wrote it. */
#include <kvprune/kvprune.h>
#include <stdio.h>
#include <stdlib.h>

#define LAYERS 2
#define NQ 4  /* query heads */
#define NKV 2 /* KV heads (GQA: 2 query heads per KV head) */
#define HD 16 /* head_dim */

int main(void) {
    kvp_model model = {LAYERS, NQ, NKV, HD, KVP_ROPE_GPTJ, 0, 10000.0f};
    kvp_config cfg;
    kvp_cache *cache = NULL;
    kvp_stats st;
    kvp_status s;
    char err[256];
    float q[NQ * HD], k[NKV * HD], v[NKV * HD], out[NQ * HD];
    size_t bytes;
    void *raw;
    char *arena;
    unsigned t, l, i, kept;

    if ((s = kvp_config_default(&cfg, &model)) != KVP_OK) {
        fprintf(stderr, "model: %s\n", kvp_status_str(s));
        return 1;
    }
    /* All or nothing, and the whole result is checked: KVP_OK means a valid config. */
    if (kvp_config_apply(&cfg, "policy=streaming sinks=4 window=60 compress_every=8", err, sizeof err) != KVP_OK) {
        fprintf(stderr, "config: %s\n", err);
        return 1;
    }
    bytes = kvp_arena_size(&cfg); /* exact; never 0 after a successful apply */
    raw = malloc(bytes + 63);     /* C99 has no aligned_alloc: align by hand */
    if (!raw) return 1;
    arena = (char *)raw + (64 - (size_t)raw % 64) % 64;
    if (kvp_create_ex(&cfg, arena, bytes, &cache, err, sizeof err) != KVP_OK) {
        fprintf(stderr, "create: %s\n", err); /* there is no cache to ask: the message comes back here */
        free(raw);
        return 1;
    }

    for (t = 0; t < 200; ++t) {
        for (l = 0; l < LAYERS; ++l) {
            /* your model's pre-RoPE q/k/v of this token and layer */
            for (i = 0; i < NQ * HD; ++i) q[i] = (float)((t * 7 + i * 3 + l) % 17) / 17.0f - 0.5f;
            for (i = 0; i < NKV * HD; ++i) {
                k[i] = (float)((t * 5 + i * 11 + l) % 13) / 13.0f - 0.5f;
                v[i] = (float)((t * 3 + i) % 19) / 19.0f;
            }
            if (kvp_decode(cache, l, q, k, v, out) != KVP_OK) { /* out: attention output [NQ][HD] */
                fprintf(stderr, "decode: %s\n", kvp_last_error(cache));
                kvp_destroy(cache);
                free(raw);
                return 1;
            }
        }
    }
    st.struct_size = sizeof st;
    if (kvp_get_stats(cache, &st) != KVP_OK) {
        fprintf(stderr, "stats: %s\n", kvp_last_error(cache));
        kvp_destroy(cache);
        free(raw);
        return 1;
    }
    kept = kvp_layer_len(cache, 0);
    printf("kvprune %u.%u.%u: kept %u of %lu tokens, live %lu B (peak %lu B) in a %lu B arena, %lu prunes\n",
           (unsigned)(kvp_version() >> 16), (unsigned)((kvp_version() >> 8) & 255u), (unsigned)(kvp_version() & 255u),
           kept, (unsigned long)st.tokens_seen, (unsigned long)st.live_bytes, (unsigned long)st.peak_live_bytes,
           (unsigned long)st.arena_bytes, (unsigned long)st.prune_events);
    kvp_destroy(cache);
    free(raw);
    /* 200 tokens, C = sinks + window = 64, R = 8: the layer holds between 64 and 71 tokens */
    return st.tokens_seen == 200 && kept >= 64 && kept < 72 ? 0 : 1;
}
