#include "pool.h"

namespace kvp {

int32_t BlockPool::alloc(uint32_t layer) {
    if (allowed(layer) == 0) return -1;
    uint32_t home = layer;
    for (uint32_t i = 0; i < n_layers && top[home] < 0; ++i) home = (layer + 1 + i) % n_layers;
    const int32_t b = top[home];
    if (b < 0) return -1;  // unreachable while nfree > 0
    top[home] = next[b];
    next[b] = -1;
    if (held[layer] < min_blocks[layer]) --deficit;
    ++held[layer];
    --nfree;
    return b;
}

bool BlockPool::lend(BlockPool &to, uint32_t layer) {
    if (nfree == 0) return false;
    uint32_t home = layer;
    for (uint32_t i = 0; i < n_layers && top[home] < 0; ++i) home = (layer + 1 + i) % n_layers;
    const int32_t b = top[home];
    if (b < 0) return false;  // unreachable while nfree > 0
    top[home] = next[b];
    --nfree;
    next[b] = to.top[layer];
    to.top[layer] = b;
    ++to.nfree;
    return true;
}

void BlockPool::release(uint32_t layer, uint32_t b) {
    // home of b: the last layer whose range starts at or before b (binary search); a lent block
    // goes to the home of `layer`
    uint32_t lo = layer;
    if (b >= base && b - base < nblocks) {
        uint32_t hi = n_layers;
        lo = 0;
        while (hi - lo > 1) {
            const uint32_t mid = (lo + hi) / 2;
            if (home_lo[mid] <= b - base) lo = mid;
            else hi = mid;
        }
    }
    next[b] = top[lo];
    top[lo] = int32_t(b);
    --held[layer];
    if (held[layer] < min_blocks[layer]) ++deficit;
    ++nfree;
}

void BlockPool::reset() {
    deficit = 0;
    for (uint32_t l = 0; l < n_layers; ++l) {
        top[l] = -1;
        for (uint32_t b = base + home_lo[l + 1]; b > base + home_lo[l]; --b) {  // pushed descending: pops ascending
            next[b - 1] = top[l];
            top[l] = int32_t(b - 1);
        }
        held[l] = 0;
        deficit += min_blocks[l];
    }
    for (uint32_t b = base; b < base + nblocks; ++b) dead[b] = bseq[b] = 0;  // bseq too: a saved state (state.h) is a function of the calls
    nfree = nblocks;
}

}  // namespace kvp
