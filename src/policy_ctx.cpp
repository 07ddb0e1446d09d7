// The core's side of the policy seam (policies/policy.h): what a policy may see of the cache.
#include "cache.h"
#include "config.h"
#include "prompt.h"

namespace kvp {

const kvp_config &PolicyCtx::cfg() const { return c->cfg; }
uint32_t PolicyCtx::group() const { return c->group; }
bool PolicyCtx::realign() const { return c->positions == KVP_POS_REALIGN; }
bool PolicyCtx::fixed() const { return fixed_scores(c); }
uint32_t PolicyCtx::stage() const { return c->plan.stage; }
bool PolicyCtx::shared_pool() const { return c->plan.shared; }
const LayerPlan &PolicyCtx::plan() const { return c->layers[layer].geom.lp; }
uint32_t PolicyCtx::prompt_room() const { return layer_prompt_room(c->cfg, layer); }
bool PolicyCtx::prompt_holds() const { return layer_prompt_holds(c->cfg, layer); }
HeadStore &PolicyCtx::store(uint32_t h) const { return head_of(c, layer, h); }
BlockPool &PolicyCtx::pool_of(uint32_t h) const { return c->pools[h]; }
PolicyCtx PolicyCtx::at_head(uint32_t h) const { return PolicyCtx{c, layer, h, &c->pools[h], scratch, 0, 0}; }
uint32_t &PolicyCtx::evict_threshold() const { return c->layers[layer].evict_threshold; }
int32_t &PolicyCtx::lazy() const { return c->layers[layer].lazy; }
void *PolicyCtx::state() const { return c->pstate; }
const kern::ScoreF32 &PolicyCtx::score_kernels() const { return *c->skern; }

PolicyCtx policy_ctx(const kvp_cache *c, uint32_t layer) {
    return PolicyCtx{const_cast<kvp_cache *>(c), layer, 0, nullptr, nullptr, 0, 0};
}

}  // namespace kvp
