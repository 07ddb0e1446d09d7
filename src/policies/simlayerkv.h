// SimLayerKV: Zhang et al., "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction"
// (2024, arXiv:2410.13846), Sec. 3 (lazy-layer identification, Eq. 2 for the prefill test and
// Eq. 3 for the decode test) and Sec. 4 (lazy layers keep the initial and recent tokens).
//
// A layer is lazy when its attention concentrates on the first `sinks` keys and the last
// `window` keys: the attention mass on those keys, averaged over the query heads and over the
// observed queries, exceeds `lazy_threshold`. Lazy layers are trimmed to sinks + window (the
// first `sinks` and the most recent `window` tokens) and then behave as StreamingLLM with
// compress_every = 1 (after every call the layer holds at most sinks + window tokens); the
// other layers follow `nonlazy=full|snapkv|h2o` with that policy's keys.
//
// Our reading of the paper and its reference code (sail-sg/SimLayerKV; NVIDIA kvpress's
// SimLayerKVPress follows the same rule), pinned here:
// - "Last window keys" are counted from the end of what the observed queries see (the last L
//   keys of the layer, L = its length after the call's tokens were added), as the reference
//   slices the attention rows of the last queries with [..., :sinks] and [..., -window:]; the
//   two ranges are not double-counted when they overlap.
// - lazy_mode=prefill: the queries are the last `lazy_last` queries of a prefill call with q
//   (default 32, the reference's "last tokens"); each such call decides for every layer that is
//   not lazy yet, so with a chunked prompt the last chunk's decision stands, except that a lazy
//   layer stays lazy (its trimmed tokens are gone). lazy_mode=decode: the first decode query
//   after create/reset (the observation kernels see its full row once); the prompt is kept by
//   the nonlazy policy until then, and the trim happens after that decode's attention.
// - Mean over heads and queries: every observed query row sums to 1, so the mean equals
//   (mass on sinks + window summed over heads and queries) / (all mass summed likewise); both
//   sums are reduced over KV heads in fixed head order in the layer phase (score=fixed: Q16
//   integer sums, compared exactly as mass > lazy_threshold * total in double).
// - The decision is per layer (all KV heads of a lazy layer are trimmed; with nonlazy=snapkv
//   or h2o the heads may hold different tokens, and each keeps its own first sinks + last window).
// - Memory really moves: the trimmed stores are compacted at once and their blocks go back to
//   the head's pool (pool.h), where other layers can take them when `total_capacity` makes the
//   pool shared. A lazy layer's later evictions (one token per step) leave dead slots that are
//   compacted every hole_cap evictions (storage.h).
// - Storage: a lazy layer keeps its compacting store (the nonlazy policy's); the sinks are not
//   moved to a pinned prefix. Its evictions (the trim, then the oldest token after the sinks)
//   mark slots dead and compact every hole_cap evictions (storage.h). positions=realign stays
//   exact (kept tokens at 0..L-1) and cheap: an eviction of n tokens after the sinks raises the
//   store's shift by n, so the tokens appended later share the rotation delta of the surviving
//   window and attention reads the sinks and the window as two runs (plus splits at physical
//   discontinuities), as in the streaming ring.
// - lazy_force (benchmarks/tests): the paper's random-layer baseline trims the same number of
//   layers chosen at random; bit l of lazy_force makes layer l lazy at the same decision points.
// - kv_dtype=f16|q8|q4 composes with nonlazy=full|h2o. nonlazy=snapkv with formatted storage is
//   refused (check below): snapkv alone composes with it now (staged f32 rows,
//   converted after the commit), but a lazy layer's trim of a staged prompt in a formatted store
//   is not built or tested yet.
// Default positions: original.
#pragma once
#include "policies/policy.h"

namespace kvp {

extern const Policy kSimLayerKvPolicy;

}  // namespace kvp
