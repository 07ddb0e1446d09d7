#include "storage.h"

#include <string.h>

namespace kvp {

uint32_t store_slot(const HeadStore &hs, uint32_t block, uint32_t j) {
    if (j < hs.npin) return hs.pin_blk[j / block] * block + j % block;
    const uint32_t v = hs.roff + (j - hs.npin);
    return hs.blk[(hs.bhead + v / block) % hs.blk_cap] * block + v % block;
}

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
    const uint32_t block = pool.block;
    hs.roff += e;
    hs.count -= e;
    while (hs.nb > 0 && hs.roff >= block) {
        pool.release(layer, hs.blk[hs.bhead]);
        hs.bhead = (hs.bhead + 1) % hs.blk_cap;
        --hs.nb;
        hs.roff -= block;
    }
    if (hs.count == 0) release_tail(hs, pool, layer);
    if (realign) hs.shift += e;
    hs.prune_events += 1;
    hs.evicted += e;
}

void store_compact(HeadStore &hs, BlockPool &pool, uint32_t layer, const uint32_t *victims, uint32_t nv,
                   uint32_t head_dim) {
    if (nv == 0) return;
    const uint32_t block = pool.block, L = hs.len();
    const size_t row = size_t(head_dim) * sizeof(float);
    uint32_t w = victims[0], vi = 0;
    for (uint32_t r = victims[0]; r < L; ++r) {
        if (vi < nv && victims[vi] == r) {
            ++vi;
            continue;
        }
        const uint32_t from = store_slot(hs, block, r), to = store_slot(hs, block, w);
        memcpy(pool.k_row(to), pool.k_row(from), row);
        memcpy(pool.v_row(to), pool.v_row(from), row);
        pool.pos[to] = pool.pos[from];
        pool.rot[to] = pool.rot[from];
        pool.score[to] = pool.score[from];
        ++w;
    }
    hs.count -= nv;
    release_tail(hs, pool, layer);
    hs.scattered = true;
    hs.prune_events += 1;
    hs.evicted += nv;
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
        else out[nr++] = Run{slot + i, m, j0 + i, d};
        i += m;
    }
    return nr;
}

}  // namespace

uint32_t store_runs(const HeadStore &hs, const BlockPool &pool, bool realign, Run *out) {
    const uint32_t block = pool.block;
    uint32_t nr = 0;
    const bool scan = realign && hs.scattered;
    for (uint32_t b = 0; b * block < hs.npin; ++b) {
        const uint32_t n = hs.npin - b * block < block ? hs.npin - b * block : block;
        nr = add_span(pool, scan, 0, hs.pin_blk[b] * block, n, b * block, out, nr);
    }
    const int64_t body_delta = realign ? hs.shift : 0;
    uint32_t j = hs.npin, left = hs.count, off = hs.roff;
    for (uint32_t b = 0; left > 0; ++b) {
        const uint32_t n = block - off < left ? block - off : left;
        nr = add_span(pool, scan, body_delta, hs.blk[(hs.bhead + b) % hs.blk_cap] * block + off, n, j, out, nr);
        j += n;
        left -= n;
        off = 0;
    }
    return nr;
}

void store_positions(const HeadStore &hs, const BlockPool &pool, int32_t *out) {
    const uint32_t L = hs.len();
    for (uint32_t j = 0; j < L; ++j) out[j] = pool.pos[store_slot(hs, pool.block, j)];
}

void store_clear(HeadStore &hs) {
    hs.npin = hs.pnb = hs.bhead = hs.nb = hs.roff = hs.count = 0;
    hs.shift = 0;
    hs.scattered = false;
    hs.prune_events = hs.evicted = 0;
    hs.len_after_append = 0;
    hs.hoyer = 0.0f;
}

}  // namespace kvp
