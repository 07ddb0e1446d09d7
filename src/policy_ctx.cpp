// The core's side of the policy seam (policies/policy.h): what a policy may see of the cache.
#include "cache.h"
#include "config.h"
#include "prompt.h"
#include "step.h"
#include "threads.h"

#include <atomic>

#include <math.h>
#include <string.h>

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
PolicyCtx PolicyCtx::at_layer(uint32_t l) const { return PolicyCtx{c, l, head, pool, scratch, 0, 0}; }
uint32_t &PolicyCtx::evict_threshold() const { return c->layers[layer].evict_threshold; }
int32_t &PolicyCtx::lazy() const { return c->layers[layer].lazy; }
void *PolicyCtx::state() const { return c->pstate; }
void *PolicyCtx::phase() const { return c->scratch + c->plan.scr_runs; }  // participant 0's (arena.cpp)
const kern::ScoreF32 &PolicyCtx::score_kernels() const { return *c->skern; }

namespace {

struct PhaseJob {
    kvp_cache *c;
    PolicyCtx base;
    uint32_t n;
    PolicyCtx::ItemFn fn;
    void *arg;
    std::atomic<uint32_t> next;
};

void phase_worker(void *a, uint32_t tid) {
    PhaseJob &j = *static_cast<PhaseJob *>(a);
    PolicyCtx ctx = j.base;
    ctx.scratch = scratch_of(j.c, tid).policy;
    for (;;) {
        const uint32_t i = j.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= j.n) return;
        j.fn(ctx, i, tid, j.arg);
    }
}

}  // namespace

uint32_t PolicyCtx::parallel(uint32_t n, ItemFn fn, void *arg) const {
    uint32_t k = pool_parallel(c->tpool) ? c->cfg.threads : 1;
    if (k > n) k = n ? n : 1;
    PhaseJob j;
    j.c = c;
    j.base = *this;
    j.n = n;
    j.fn = fn;
    j.arg = arg;
    j.next.store(0, std::memory_order_relaxed);
    if (k <= 1) phase_worker(&j, 0);
    else pool_run(c->tpool, k, phase_worker, &j);
    return k;
}

void *PolicyCtx::scratch_at(uint32_t tid) const { return scratch_of(c, tid).policy; }

kvp_rope_style PolicyCtx::rope_style() const { return c->rope.style; }
uint32_t PolicyCtx::rope_pairs() const { return c->rope.style == KVP_ROPE_NONE ? 0 : c->rope.pairs; }
const double *PolicyCtx::rope_freqs() const { return fixed() ? c->fixed_freqs : c->rope.inv_freq; }

void PolicyCtx::key(uint32_t slot, double *out) const {
    const uint32_t hd = c->cfg.model.head_dim;
    if (pool->kq) {  // the fixed-point copy: RoPE'd by the integer rotation, never kv_rotated
        const int16_t *r = pool->kq_row(slot);
        const double scale = ldexp(1.0, pool->kexp[slot]);  // exact: int16 x 2^e fits a double
        for (uint32_t i = 0; i < hd; ++i) out[i] = double(r[i]) * scale;
        return;
    }
    float row[kMaxHeadDim];
    memcpy(row, pool->k_row(slot), size_t(hd) * sizeof(float));
    rotate_rows(c, row, 1, hd);  // kv_rotate is its own inverse
    for (uint32_t i = 0; i < hd; ++i) out[i] = double(row[i]);
}

PolicyCtx policy_ctx(const kvp_cache *c, uint32_t layer) {
    return PolicyCtx{const_cast<kvp_cache *>(c), layer, 0, nullptr, nullptr, 0, 0};
}

}  // namespace kvp
