/* An engine's attention step through kvprune (C99): a long prompt prefilled in chunks that fit
 * (kvp_prefill_room) and selected whole when it ends (max_prompt, kvp_prompt_end), a
 * speculative draft verified and partly accepted, the state saved, one decode
 * call per generated token and layer, the state restored. fake_qkv stands in for your model's
 * pre-RoPE projections of the layer input; `out` goes on to your o-proj and FFN. */
#include <kvprune/kvprune.h>
#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 4, NQ = 4, NKV = 2, HD = 16, PROMPT = 300, GEN = 40, CHUNK = 64 };
static float q[CHUNK * NQ * HD], k[CHUNK * NKV * HD], v[CHUNK * NKV * HD], out[CHUNK * NQ * HD];
static unsigned seed = 1u;
static void fill(float *x, unsigned n) { /* a tiny deterministic generator (LCG) in [-0.5, 0.5) */
    while (n--) { seed = seed * 1664525u + 1013904223u; *x++ = (float)(seed >> 8) / 16777216.0f - 0.5f; }
}
static void fake_qkv(unsigned n) { fill(q, n * NQ * HD); fill(k, n * NKV * HD); fill(v, n * NKV * HD); }
static int fail(kvp_cache *c, const char *what) { fprintf(stderr, "%s: %s\n", what, kvp_last_error(c)); return 1; }

int main(void) {
    kvp_model model = {LAYERS, NQ, NKV, HD, KVP_ROPE_NEOX, 0, 10000.0f};
    kvp_config cfg;
    kvp_cache *c = NULL;
    char err[256], *raw, *arena, *state;
    unsigned done = 0, n, t, l, kept;
    size_t size;
    if (kvp_config_default(&cfg, &model) != KVP_OK) return 1; /* a bad geometry */
    if (kvp_config_apply(&cfg, "policy=h2o budget=96 max_draft=4 max_prompt=512", err, sizeof err) != KVP_OK ||
        !(raw = malloc(kvp_arena_size(&cfg) + 63))) return fprintf(stderr, "config: %s\n", err), 1;
    arena = raw + (64 - (size_t)raw % 64) % 64; /* the one allocation: 64-byte aligned, exact size */
    if (kvp_create_ex(&cfg, arena, kvp_arena_size(&cfg), &c, err, sizeof err) != KVP_OK)
        return fprintf(stderr, "create: %s\n", err), 1;

    /* prefill: every layer takes the chunk before the next chunk starts; with max_prompt each layer
     * holds the whole prompt (any chunking) and the policy selects from it once, when it ends */
    while (done < PROMPT) {
        n = kvp_prefill_room(c) < CHUNK ? kvp_prefill_room(c) : CHUNK;
        if (n > PROMPT - done) n = PROMPT - done;
        if (n == 0) { fputs("prefill: no room (a policy that never evicts, at capacity)\n", stderr); return 1; }
        for (l = 0; l < LAYERS; ++l) {
            fake_qkv(n); /* layer l's projections of the chunk; positions NULL = the next n */
            if (kvp_prefill(c, l, n, NULL, q, k, v, out, NULL) != KVP_OK) return fail(c, "prefill");
        }
        done += n;
    }
    if (kvp_prompt_end(c) != KVP_OK) return fail(c, "prompt end"); /* else the first decode or draft ends it */
    if (kvp_draft_begin(c) != KVP_OK) return fail(c, "draft"); /* 4 draft tokens, verified in one batch */
    for (l = 0; l < LAYERS; ++l) {
        fake_qkv(4);
        if (kvp_prefill(c, l, 4, NULL, q, k, v, out, NULL) != KVP_OK) return fail(c, "verify");
    }
    if (kvp_draft_commit(c, 2) != KVP_OK) return fail(c, "commit"); /* 2 accepted: the rest leave no trace */
    size = kvp_state_size(c); /* save the session (close to its live bytes), restore it below */
    if (!(state = malloc(size)) || kvp_state_save(c, state, size, &size) != KVP_OK) return fail(c, "save");
    kept = kvp_layer_len(c, 0);
    for (t = 0; t < GEN; ++t) /* decode: one token, every layer in order */
        for (l = 0; l < LAYERS; ++l) {
            fake_qkv(1);
            if (kvp_decode(c, l, q, k, v, out) != KVP_OK) return fail(c, "decode");
        }
    printf("engine: %u prompt + %u generated tokens, layer 0 keeps %u (h2o budget 96)\n", PROMPT, GEN,
           kvp_layer_len(c, 0));
    for (l = 0, n = 0; l < LAYERS; ++l) n += kvp_layer_len(c, l) == 96; /* every layer holds its budget */
    if (kvp_state_load(c, state, size) != KVP_OK) return fail(c, "load"); /* back to the saved state */
    n += kvp_layer_len(c, 0) == kept;
    kvp_destroy(c);
    free(state);
    free(raw);
    return n == LAYERS + 1 ? 0 : 1;
}
