#include "policies/pyramidkv.h"

#include <math.h>

#include "config.h"
#include "policies/snapkv.h"

namespace kvp {

uint32_t pyramid_budget(const kvp_config &cfg, uint32_t layer) {
    const uint32_t L = cfg.model.n_layers, w = cfg.obs_window;
    if (cfg.budget <= w || L == 1) return cfg.budget;
    const double B = double(cfg.budget - w);
    const double mn = B / double(cfg.beta), mx = 2.0 * B - mn;
    const double sel = floor(mx - double(layer) * (mx - mn) / double(L - 1) + 0.5);
    return uint32_t(sel < 0.0 ? 0.0 : sel) + w;
}

namespace {

kvp_status check(const kvp_config &cfg, Msg &m) {
    if (!(cfg.beta >= 1.0f)) {
        m.s("pyramidkv: beta must be >= 1 (min = (budget - obs_window) / beta must not exceed the mean)");
        return KVP_ERR_CONFIG;
    }
    kvp_status st = snapkv_check_common("pyramidkv", cfg, m);
    if (st != KVP_OK) return st;
    const uint64_t top = uint64_t(pyramid_budget(cfg, 0)) + (cfg.capacity ? cfg.capacity - cfg.budget : 1);
    if (top > kMaxCapacity) {
        m.s("pyramidkv: the first layer's capacity ").u(top).s(" exceeds the capacity limit");
        return KVP_ERR_CONFIG;
    }
    return KVP_OK;
}

void plan(const kvp_config &cfg, uint32_t layer, LayerPlan *p) {
    const uint32_t b = pyramid_budget(cfg, layer);
    snapkv_plan(cfg, b, b + (cfg.capacity ? cfg.capacity - cfg.budget : 1), p);
}

}  // namespace

const Policy kPyramidKvPolicy = {"pyramidkv",    KVP_POS_ORIGINAL, &check,           &plan,    &snapkv_observe,
                                 &snapkv_prune,  nullptr,          &snapkv_evictable, &snapkv_self_prune, nullptr};

}  // namespace kvp
