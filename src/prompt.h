// Whole-prompt selection across chunks (issue 28, config max_prompt; DECISIONS "Whole-prompt
// selection"). Engines feed a long prompt in chunks (their batch size); a policy that selects
// from the prompt (SnapKV's votes of the last queries, H2O's and Lethe's prompt scores,
// SimLayerKV's laziness) must see the whole prompt, or it keeps another set than one call would.
//
// With max_prompt = P, a kvp_prefill with q into a global layer opens that layer's prompt: while
// it is open the layer's store may hold its capacity + P tokens, every chunk attends exactly
// over all of them, nothing is observed, pruned or selected, and the last W queries of the
// prompt (W = the layer's largest observation window) are kept in the prompt region with their
// positions. The prompt ends (prompt_finish) at kvp_prompt_end or the first kvp_decode /
// kvp_append / kvp_draft_begin after it: then each open layer's heads are observed from the
// kept queries over everything the store holds and pruned by the policy's prefill rule, its
// layer phase runs, exactly as after one kvp_prefill of the whole prompt (the observation
// kernels read the same keys and queries, however the prompt was chunked). A prompt that would
// pass capacity + P in a layer is selected there first and goes on as a new prompt over the
// selection (prompt_early counts it: "today's early selection", once per P tokens).
//
// The prompt region (derived, like the draft region: the plan does not grow) sits just before
// the memos: a 64-byte header (W), then per layer a header {open, early, nq} and positions [W]
// (64-aligned together), then queries [W][n_q_heads * head_dim] f32 (64-aligned).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "io.h"
#include "kvprune/kvprune.h"
#include "msg.h"

struct kvp_cache;

namespace kvp {

// Bytes per token of policy scratch that a selection at a prompt's end may use for the tokens
// beyond the layer's capacity (the largest per-token need of any policy: snapkv's 24).
constexpr size_t kPromptScratchPerToken = 24;

// layer_prompt_room (declared with the policies' config rules, policies/policy.h, which arena.h
// includes): max_prompt for a global layer, 0 for a sliding-window local layer (it keeps its
// window) and with max_prompt = 0.
// Whether the layer holds a prompt open until its end: it has room, or (ThinK over a policy that
// never selects, full) its channels are chosen at the prompt's end, within the capacity.
bool layer_prompt_holds(const kvp_config &cfg, uint32_t layer);
// W: queries kept per layer (the largest observation window of a layer with prompt room).
uint32_t prompt_window(const kvp_config &cfg);
// Whether some layer has prompt room (the cache then has a prompt region).
bool prompt_used(const kvp_config &cfg);
// Bytes of the prompt region (0 when no layer has prompt room).
size_t prompt_region_bytes(const kvp_config &cfg, uint32_t w, Sz &z);
// Sets c->prompt (cache_init) and clears the region (create, reset).
void prompt_init(kvp_cache *c);
void prompt_reset(kvp_cache *c);

// Whether layer's prompt is open; whether any layer's is.
bool prompt_open(const kvp_cache *c, uint32_t layer);
bool prompt_any_open(const kvp_cache *c);
// Selections made before a prompt ended (kvp_layer_stats.prompt_early).
uint32_t prompt_early(const kvp_cache *c, uint32_t layer);

// Whether a kvp_prefill with q of n tokens into `layer` goes through the prompt (max_prompt > 0,
// a global layer); then prompt_room_check is its room check (else cache_room_check's).
bool prompt_takes(const kvp_cache *c, uint32_t layer);
kvp_status prompt_room_check(const kvp_cache *c, uint32_t layer, uint32_t n, Msg &m);
// kvp_prefill with q through the prompt (prompt_takes; checked).
void prompt_prefill(kvp_cache *c, uint32_t layer, uint32_t n, const int32_t *positions, In q, In k, In v, Out out);
// Ends every open prompt (kvp_prompt_end, and before a decode, append or draft).
void prompt_finish_all(kvp_cache *c);
// A kvp_decode/kvp_append of n tokens into `layer` whose prompt is open: KVP_OK when, once the
// prompt ends, the layer can make room for them by its policy's ranking (evictable); else
// KVP_ERR_FULL with a message and nothing changed. prompt_end_for then ends every prompt and
// makes that room (capacity - n), so the call that follows fits.
kvp_status prompt_end_check(const kvp_cache *c, uint32_t layer, uint32_t n, Msg &m);
void prompt_end_for(kvp_cache *c, uint32_t layer, uint32_t n);

}  // namespace kvp
