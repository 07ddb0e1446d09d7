// Prompt staging (policies/policy.h "Prompt staging"): the store operations a staged policy's
// prune uses to end a staged prefill. Core side of the seam: they move slot data and formatted
// rows (quant/store_fmt.h), which policies do not see.
#include <string.h>

#include "policies/policy.h"
#include "quant/store_fmt.h"

namespace kvp {

uint32_t stage_room(const PolicyCtx &ctx, const HeadStore &hs) {
    // After its victims are compacted away a dense store starts at roff 0 (a compacting store
    // never evicts from the front), so it can hold its blocks plus the pool's allowance.
    const BlockPool &pool = *ctx.pool;
    const uint64_t room = (uint64_t(hs.pnb) + hs.nb + pool.allowed(ctx.layer)) * pool.block;
    return room < hs.cap ? uint32_t(room) : hs.cap;
}

void stage_commit(PolicyCtx &ctx, HeadStore &hs, uint32_t *victims, uint32_t nv) {
    BlockPool &pool = *ctx.pool;
    const uint32_t L0 = hs.len(), n = ctx.staged;
    if (!victims) {  // a policy that chose nothing: keep the newest staged tokens that fit
        const uint32_t room = stage_room(ctx, hs);
        const uint32_t fit = room > L0 ? room - L0 : 0;
        nv = n > fit ? n - fit : 0;
    }
    // victims in the store: their slots, in one pass over the store (victims are ascending)
    uint32_t ns = 0;
    while (ns < nv && (victims ? victims[ns] : L0 + ns) < L0) ++ns;
    if (ns) {  // logical index -> slot, in place
        uint32_t vi = 0;
        store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t m, uint32_t j) {
            while (vi < ns && victims[vi] < j + m) {
                victims[vi] = slot + (victims[vi] - j);
                ++vi;
            }
        });
        store_evict(hs, pool, ctx.layer, victims, ns);
    }
    if (hs.holes) store_compact(hs, pool, ctx.layer);
    uint32_t vi = ns, m = 0;
    const FmtPool *fp = pool.fc ? &fmt_pool(*pool.fc, pool) : nullptr;
    for (uint32_t i = 0; i < n; ++i) {
        const uint32_t j = L0 + i;
        if (vi < nv && (victims ? victims[vi] : L0 + (vi - ns)) == j) {
            ++vi;
            continue;
        }
        uint32_t slot = 0;
        if (!store_reserve(hs, pool, ctx.layer, &slot)) break;  // unreachable when the caller kept within stage_room
        if (fp) {  // formatted: a residual token; its rows move to staging row m (m <= i, ascending)
            const bool pinned = hs.next_pinned();
            pool.copy_meta(slot, ctx.stage_slot + i);
            if (m != i) {
                const size_t row = size_t(pool.stride) * sizeof(float);
                memcpy(fp->sk + size_t(m) * pool.stride, fp->sk + size_t(i) * pool.stride, row);
                memcpy(fp->sv + size_t(m) * pool.stride, fp->sv + size_t(i) * pool.stride, row);
            }
            store_commit(hs);
            if (!pinned) ++hs.nres;
        } else {
            pool.copy_slot(slot, ctx.stage_slot + i);
            store_commit(hs);
        }
        ++m;
    }
    ctx.committed = m;
    const uint32_t staged_dropped = nv - ns;
    if (staged_dropped) {
        if (!ns) hs.prune_events += 1;
        hs.evicted += staged_dropped;
    }
    if (nv) hs.scattered = true;  // survivors moved to other logical indices: realign deltas changed
    ctx.staged = 0;
}

}  // namespace kvp
