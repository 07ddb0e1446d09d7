// ThinK: Xu et al., "ThinK: Thinner Key Cache by Query-Driven Pruning" (2024; ICLR 2025),
// Sec. 3.2 (key channels) and Appendix D (value channels). A channel axis that composes with
// every token policy: policy=think token_policy=<policy> key_channel_ratio=lambda
// value_channel_ratio=... channel_score=qk|l1|l2 obs_window=w.
//
// Reading of the reference code (github.com/SalesforceAIResearch/ThinK, ThinK_flash
// kv_pruning_utils.py key_pruner_query_driven, ThinK_kivi llama_kivi_think.py), pinned here:
//   * scores per head from post-RoPE queries and keys: the last 32 queries of the prompt (our
//     `obs_window`) against every key the head holds; ||Q[:,j] K[:,j]^T||_F, which factors as
//     ||Q[:,j]|| * ||K[:,j]|| (the reference computes mean(q^2) * mean(k^2), the same ranking);
//     the reference prunes per query head after repeat_kv; we store per KV head, so the group's
//     query heads' scores are summed (DESIGN.md);
//   * topk(..., largest=False) of int(head_dim * ratio) channels is pruned, the rest kept in
//     ascending channel order (a mask; queries are masked the same way before the dot product);
//   * ThinK_flash keeps the last recent_size=32 prompt tokens and every decoded token at full
//     width; ThinK_kivi thins a group when KIVI quantizes it (the residual stays full): here a
//     token stays full width while it is in the full-precision residual group (the last
//     incomplete block of quant_group tokens) and is thinned when its group is converted, so
//     memory stays bounded (docs/DECISIONS.md);
//   * values (Appendix D): ||softmax(Q_obs K^T / sqrt(D)) V[:, j]||_F, i.e. the column norms of
//     the observation queries' attention outputs, summed over the group's query heads.
// Decisions beyond the paper (docs/DECISIONS.md "ThinK"):
//   * RoPE pairs are pruned as units (pair score ||Q_p K_p^T||_F over both channels, from 2x2
//     Gram matrices), so a kept key keeps whole rotation pairs: logits then depend only on
//     position differences and realign (query rotated per run delta) stays exact. floor(lambda *
//     rope_dim/2) pairs and floor(lambda * (head_dim - rope_dim)) unrotated channels are pruned.
//   * The channel lists are chosen once per (layer, KV head), at the first group conversion,
//     from that call's last min(obs_window, n) queries and every key the store then holds (all
//     still full precision). kvp_append has no queries: qk falls back to l2 for keys and values.
//   * l1 / l2 baselines: sum |K[:,j]| / ||K[:,j]|| (pairs: summed / joint norm); values: ||V[:,j]||.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "quant/store_fmt.h"

namespace kvp {

size_t think_scratch_bytes(const kvp_config &cfg, uint32_t stride, uint32_t obs_rows, uint32_t group);
// Chooses hs's key / value channel lists (fs->kidx, fs->vidx) and marks it selected.
void think_select(kvp_cache *c, HeadStore &hs, BlockPool &pool, const StagedNew &nw, const StepObs &obs);

}  // namespace kvp
