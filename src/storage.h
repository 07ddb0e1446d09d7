// Per (layer, KV head) token storage: a fixed pool of `cap` slots in the arena.
//
// Slots [0, pin_cap) are a pinned prefix (the attention sinks of `streaming`; empty for other
// policies); slots [pin_cap, cap) are a ring. A token goes to the next pinned slot while the
// prefix is not full, else to the ring's tail. Evicting the oldest ring tokens advances the
// ring head: O(1), zero copies. The logical order (pinned prefix, then the ring from its
// head) is the order of insertion, hence ascending original position; attention reads it as
// at most three contiguous runs of slots (Segment).
//
// Realign (cache-relative positions) without re-rotating keys: pinned keys are stored rotated
// at their logical index; ring keys at (logical index + shift), and evicting e ring tokens
// adds e to shift. RoPE logits depend only on the position difference, so a query at logical
// position P is rotated at P for the pinned run and at P + shift for the ring runs: exactly
// the attention over keys re-rotated by the constant delta (DESIGN.md "realign"), at O(1)
// cost per prune and with no accumulated rounding. In `original` mode shift stays 0 and keys
// are rotated at their original position.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace kvp {

struct Segment {
    uint32_t slot;     // first slot of the run
    uint32_t n;        // tokens in the run
    uint32_t logical;  // logical index of its first token
    bool ring;         // part of the ring (queries rotated with +shift in realign mode)
};

struct HeadStore {
    float *k;        // [cap][stride] keys, post-RoPE
    float *v;        // [cap][stride] values
    int32_t *pos;    // [cap] original position of the token in each slot
    float *score;    // [cap] per-token policy score (scoring policies)
    uint32_t cap;
    uint32_t pin_cap;
    uint32_t npin;   // pinned slots in use
    uint32_t head;   // ring index of the oldest ring token
    uint32_t count;  // ring tokens
    int64_t shift;
    uint64_t prune_events;
    uint64_t evicted;

    uint32_t len() const { return npin + count; }
    uint32_t free_slots() const { return cap - len(); }
    // Slot the next appended token goes to; *ring tells whether it is a ring slot.
    uint32_t next_slot(bool *ring) const;
    // Marks the slot returned by next_slot as used.
    void commit_append();
    // The logical order as contiguous runs; returns how many (0..3).
    uint32_t segments(Segment out[3]) const;
    // Evicts the e oldest ring tokens (e <= count); adds e to shift when realign.
    void evict_ring_front(uint32_t e, bool realign);
    // Writes the kept original positions in logical (= ascending) order.
    void positions(int32_t *out) const;
    void clear();
};

}  // namespace kvp
