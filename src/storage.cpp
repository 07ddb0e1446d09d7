#include "storage.h"

#include <string.h>

#include "quant/store_fmt.h"

namespace kvp {

uint32_t store_blocks_needed(const HeadStore &hs, uint32_t block, uint32_t n) {
    uint32_t pinned = 0;
    if (hs.count == 0 && hs.npin < hs.pin_cap) {
        pinned = hs.pin_cap - hs.npin < n ? hs.pin_cap - hs.npin : n;
        n -= pinned;
    }
    const uint32_t pin_need = (hs.npin + pinned + block - 1) / block;
    uint32_t need = pin_need > hs.pnb ? pin_need - hs.pnb : 0;
    if (n) {
        const uint64_t used = hs.count ? uint64_t(hs.roff) + hs.count : 0;
        const uint64_t body_need = (used + n + block - 1) / block;
        if (body_need > hs.nb) need += uint32_t(body_need - hs.nb);
    }
    return need;
}

bool store_reserve(HeadStore &hs, BlockPool &pool, uint32_t layer, uint32_t *slot) {
    const uint32_t block = pool.block;
    if (hs.next_pinned()) {
        if (hs.npin == hs.pnb * block) {
            const int32_t b = pool.alloc(layer);
            if (b < 0) return false;
            hs.pin_blk[hs.pnb++] = uint32_t(b);
        }
        *slot = hs.pin_blk[hs.npin / block] * block + hs.npin % block;
        return true;
    }
    if (hs.count == 0) hs.roff = 0;  // an empty body holds no block (see store_evict_front)
    const uint32_t v = hs.roff + hs.count;
    if (v == hs.nb * block) {
        const int32_t b = pool.alloc(layer);
        if (b < 0) return false;
        hs.blk[(hs.bhead + hs.nb) % hs.blk_cap] = uint32_t(b);
        pool.bseq[b] = hs.seq_head + hs.nb;
        ++hs.nb;
    }
    *slot = hs.blk[(hs.bhead + v / block) % hs.blk_cap] * block + v % block;
    return true;
}

void store_commit(HeadStore &hs) {
    if (hs.next_pinned()) ++hs.npin;
    else ++hs.count;
}

namespace {

// Returns the body blocks past what roff + count needs; all of them when the body is empty.
void release_tail(HeadStore &hs, BlockPool &pool, uint32_t layer) {
    const uint32_t block = pool.block;
    const uint32_t keep = hs.count ? (hs.roff + hs.count + block - 1) / block : 0;
    while (hs.nb > keep) {
        --hs.nb;
        pool.release(layer, hs.blk[(hs.bhead + hs.nb) % hs.blk_cap]);
    }
    if (hs.nb == 0) hs.bhead = hs.roff = 0;
}

}  // namespace

void store_evict_front(HeadStore &hs, BlockPool &pool, uint32_t layer, uint32_t e, bool realign) {
    if (e == 0) return;
    if (hs.holes) store_compact(hs, pool, layer);
    const uint32_t block = pool.block;
    hs.roff += e;
    hs.count -= e;
    if (hs.nres > hs.count) hs.nres = hs.count;  // the residual is the body's tail
    while (hs.nb > 0 && hs.roff >= block) {
        pool.release(layer, hs.blk[hs.bhead]);
        hs.bhead = (hs.bhead + 1) % hs.blk_cap;
        ++hs.seq_head;
        --hs.nb;
        hs.roff -= block;
    }
    if (hs.count == 0) release_tail(hs, pool, layer);
    if (realign) hs.shift += e;
    hs.prune_events += 1;
    hs.evicted += e;
}

void store_evict(HeadStore &hs, BlockPool &pool, uint32_t layer, const uint32_t *slots, uint32_t nv) {
    if (nv == 0) return;
    if (hs.holes == 0) hs.first_hole = UINT32_MAX;
    for (uint32_t i = 0; i < nv; ++i) {
        const uint32_t b = slots[i] / pool.block;
        pool.pos[slots[i]] = kDeadSlot;
        ++pool.dead[b];
        const uint32_t v = (pool.bseq[b] - hs.seq_head) * pool.block + slots[i] % pool.block - hs.roff;
        if (v < hs.first_hole) hs.first_hole = v;
    }
    hs.holes += nv;
    hs.scattered = true;
    hs.prune_events += 1;
    hs.evicted += nv;
    // dead slots at the tail are simply dropped
    const uint32_t block = pool.block;
    while (hs.holes && hs.count) {
        const uint32_t v = hs.roff + hs.count - 1, bid = hs.blk[(hs.bhead + v / block) % hs.blk_cap];
        if (pool.pos[bid * block + v % block] != kDeadSlot) break;
        --pool.dead[bid];
        --hs.count;
        --hs.holes;
        if (hs.nres) --hs.nres;
    }
    if (hs.holes > hs.hole_cap) store_compact(hs, pool, layer);
    else release_tail(hs, pool, layer);
}

void store_compact(HeadStore &hs, BlockPool &pool, uint32_t layer) {
    if (hs.holes && pool.fc) {
        fmt_compact(hs, pool);  // formatted rows: repack (quant/store_fmt.cpp)
    } else if (hs.holes) {
        const uint32_t block = pool.block;
        auto slot = [&](uint32_t v) { return hs.blk[(hs.bhead + (hs.roff + v) / block) % hs.blk_cap] * block + (hs.roff + v) % block; };
        uint32_t w = hs.first_hole;  // rows before it stay: the cost is the rows moved
        while (pool.pos[slot(w)] != kDeadSlot) ++w;  // the first dead slot (there is one)
        for (uint32_t r = w + 1; r < hs.count; ++r) {
            const uint32_t from = slot(r);
            if (pool.pos[from] == kDeadSlot) continue;
            pool.copy_slot(slot(w++), from);
        }
        // blocks before the first hole had no dead slots; the rest are clean now
        for (uint32_t b = (hs.roff + hs.first_hole) / block; b < hs.nb; ++b) pool.dead[hs.blk[(hs.bhead + b) % hs.blk_cap]] = 0;
        hs.count = w;
        hs.holes = 0;
    }
    release_tail(hs, pool, layer);
}

namespace {

// Appends the tokens [j0, j0+n) that lie in consecutive slots from `slot` to the run list,
// merging with the previous run when physically and (realign) rotationally continuous.
uint32_t add_span(const BlockPool &pool, bool scan, int64_t base_delta, uint32_t slot, uint32_t n, uint32_t j0,
                  Run *out, uint32_t nr) {
    uint32_t i = 0;
    while (i < n) {
        int64_t d = base_delta;
        uint32_t m = n - i;
        if (scan) {
            d = int64_t(pool.rot[slot + i]) - int64_t(j0 + i);
            m = 1;
            while (i + m < n && int64_t(pool.rot[slot + i + m]) - int64_t(j0 + i + m) == d) ++m;
        }
        Run *prev = nr ? &out[nr - 1] : nullptr;
        if (prev && prev->slot + prev->n == slot + i && prev->delta == d) prev->n += m;
        else out[nr++] = Run{slot + i, m, j0 + i, 0, d};
        i += m;
    }
    return nr;
}

}  // namespace

uint32_t store_runs(const HeadStore &hs, const BlockPool &pool, bool realign, Run *out) {
    uint32_t nr = 0;
    const bool scan = realign && hs.scattered;
    store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t j) {
        const int64_t base = !realign || j < hs.npin ? 0 : hs.shift;
        nr = add_span(pool, scan, base, slot, n, j, out, nr);
    });
    return nr;
}

void store_positions(const HeadStore &hs, const BlockPool &pool, int32_t *out) {
    store_for_each_live(hs, pool, [&](uint32_t slot, uint32_t n, uint32_t j) {
        memcpy(out + j, pool.pos + slot, n * sizeof(int32_t));
    });
}

uint64_t store_blocks_after(const HeadStore &hs, uint32_t block, uint32_t keep, bool front, uint32_t n) {
    uint32_t to_pin = 0;
    if (keep == 0 && hs.npin < hs.pin_cap) to_pin = hs.pin_cap - hs.npin < n ? hs.pin_cap - hs.npin : n;
    const uint64_t roff = keep == 0 ? 0 : front ? (uint64_t(hs.roff) + hs.count - keep) % block : hs.roff;
    const uint64_t body = uint64_t(keep) + (n - to_pin);
    return (uint64_t(hs.npin) + to_pin + block - 1) / block + (body ? (roff + body + block - 1) / block : 0);
}

void store_clear(HeadStore &hs) {
    hs.npin = hs.pnb = hs.bhead = hs.nb = hs.roff = hs.count = hs.holes = hs.first_hole = hs.seq_head = 0;
    hs.shift = 0;
    hs.scattered = false;
    hs.prune_events = hs.evicted = 0;
    hs.nres = 0;
    hs.len_after_append = 0;
    hs.hoyer = 0.0f;
    hs.pword[0] = hs.pword[1] = 0;
    hs.pflag = 0;
    hs.deferred = 0;
}

}  // namespace kvp
