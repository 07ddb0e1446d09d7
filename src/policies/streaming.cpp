#include "policies/streaming.h"

namespace kvp {

StreamingRule streaming_rule(const kvp_config &cfg) {
    StreamingRule r;
    if (cfg.policy == KVP_POLICY_WINDOW) {
        r.sinks = 0;
        r.C = cfg.window;
        r.R = 1;
        r.H = cfg.window;
        r.max_drop = 0;
        return r;
    }
    r.sinks = cfg.sinks;
    r.C = uint64_t(cfg.sinks) + cfg.window + cfg.extra;
    r.R = cfg.compress_every;
    r.H = r.C + cfg.slack;
    r.max_drop = cfg.max_drop;
    return r;
}

uint64_t streaming_min_capacity(const StreamingRule &r) {
    uint64_t a = r.C + r.R;
    return a > r.H ? a : r.H;
}

uint32_t streaming_target(const StreamingRule &r, uint32_t L) {
    if (r.R == 0 || L < r.C || uint64_t(L) - r.C < r.R) return L;
    if (r.max_drop == 0) return uint32_t(r.C);
    uint64_t t = L > r.max_drop ? uint64_t(L) - r.max_drop : 0;  // L - delta, floored at 0
    if (t < r.C) t = r.C;
    if (t > r.H) t = r.H;
    return uint32_t(t);
}

}  // namespace kvp
