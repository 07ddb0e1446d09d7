// Internal: what the phases of a cache step share (cache.cpp drives a step, cache_append.cpp
// makes room and appends, attention.cpp attends; the policies observe and prune behind
// policies/policy.h). Not a public header.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "attention.h"
#include "io.h"
#include "quant/store_fmt.h"

namespace kvp {

// A thread's scratch regions (arena.h ArenaPlan::scr_*).
struct Scratch {
    float *work;
    Run *runs;
    void *policy;
    char *fmt;    // formatted storage (FmtPlan scratch)
    float *part;  // decode partials (attention.h)
    float *priv;  // decode query rows
};

inline Scratch scratch_of(kvp_cache *c, size_t tid) {
    char *base = c->scratch + tid * c->plan.scratch_bytes;
    return Scratch{reinterpret_cast<float *>(base + c->plan.scr_work), reinterpret_cast<Run *>(base + c->plan.scr_runs),
                   base + c->plan.scr_policy, base + c->plan.scr_fmt, reinterpret_cast<float *>(base + c->plan.scr_part),
                   reinterpret_cast<float *>(base + c->plan.scr_priv)};
}

// What a head's append leaves for the rest of its step.
struct Appended {
    uint32_t L0 = 0;      // the head's length before the append
    uint32_t staged = 0;  // tokens in the staging slots (a staged prefill), else 0
    StagedNew nw;         // formatted store: the chunk's staged rows (the appending thread's scratch)
};

// Heads that lend (pool.h "Lending"): before a call's heads append n tokens to layer's stores
// (not staged), on the calling thread, in KV head order: each head whose pool cannot give what
// its store needs gets the other pools' spare free blocks (beyond what their own heads need for
// the call), the lowest KV head first. Nothing happens unless the plan's heads lend.
void lend_blocks(kvp_cache *c, uint32_t layer, uint32_t n);

// Makes room in one head and appends the call's n tokens (thread tid's memo and policy
// scratch): to the staging slots when `staged` (policy.h), else to the store; a formatted
// store stages prefill/append rows when `fmt_stage`. A sliding-window local layer first drops
// the keys none of the new queries sees (sliding.h).
Appended head_append(kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, const NewPositions &pos, In k, In v,
                     bool staged, bool fmt_stage, size_t tid);

// Sliding-window layers (sliding.h): evicts a local layer's oldest tokens at positions <= lim,
// and at least `over` of them; emptied blocks go back to the pool.
void local_evict(kvp_cache *c, HeadStore &hs, BlockPool &pool, uint32_t layer, int64_t lim, uint32_t over);

}  // namespace kvp
