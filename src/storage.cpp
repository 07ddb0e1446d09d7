#include "storage.h"

namespace kvp {

uint32_t HeadStore::next_slot(bool *ring) const {
    if (npin < pin_cap && count == 0) {
        *ring = false;
        return npin;
    }
    *ring = true;
    const uint32_t rc = cap - pin_cap;
    return pin_cap + (head + count) % rc;  // caller checked free_slots() > 0, so rc > count
}

void HeadStore::commit_append() {
    if (npin < pin_cap && count == 0) ++npin;
    else ++count;
}

uint32_t HeadStore::segments(Segment out[3]) const {
    uint32_t ns = 0;
    if (npin) out[ns++] = Segment{0, npin, 0, false};
    if (count) {
        const uint32_t rc = cap - pin_cap;
        const uint32_t first = head + count <= rc ? count : rc - head;
        out[ns++] = Segment{pin_cap + head, first, npin, true};
        if (first < count) out[ns++] = Segment{pin_cap, count - first, npin + first, true};
    }
    return ns;
}

void HeadStore::evict_ring_front(uint32_t e, bool realign) {
    if (e == 0) return;
    const uint32_t rc = cap - pin_cap;
    head = (head + e) % rc;
    count -= e;
    if (count == 0) head = 0;
    if (realign) shift += e;
    prune_events += 1;
    evicted += e;
}

void HeadStore::positions(int32_t *out) const {
    Segment seg[3];
    const uint32_t ns = segments(seg);
    uint32_t o = 0;
    for (uint32_t s = 0; s < ns; ++s)
        for (uint32_t i = 0; i < seg[s].n; ++i) out[o++] = pos[seg[s].slot + i];
}

void HeadStore::clear() {
    npin = head = count = 0;
    shift = 0;
    prune_events = evicted = 0;
}

}  // namespace kvp
