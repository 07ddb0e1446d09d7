#include "arena.h"

#include "cache.h"
#include "config.h"
#include "storage.h"

namespace kvp {
namespace {

// a + b with overflow detection into *ok.
size_t add(size_t a, size_t b, bool *ok) {
    if (a > SIZE_MAX - b) *ok = false;
    return a + b;
}
size_t mul(size_t a, size_t b, bool *ok) {
    if (b && a > SIZE_MAX / b) *ok = false;
    return a * b;
}

}  // namespace

bool arena_plan(const kvp_config &cfg, ArenaPlan *p) {
    bool ok = true;
    const kvp_model &m = cfg.model;
    const uint32_t group = m.n_q_heads / m.n_kv_heads;
    const uint32_t pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    p->stride = uint32_t(align_up(m.head_dim, kAlign / sizeof(float)));
    p->cap = config_capacity(cfg);
    p->logit_ld = uint32_t(align_up(p->cap, kAlign / sizeof(float)));

    size_t off = align_up(sizeof(kvp_cache), kAlign);
    p->off_layers = off;
    off = add(off, align_up(sizeof(LayerState) * m.n_layers, kAlign), &ok);
    p->off_heads = off;
    off = add(off, align_up(mul(sizeof(HeadStore), size_t(m.n_layers) * m.n_kv_heads, &ok), kAlign), &ok);
    p->off_freqs = off;
    off = add(off, align_up(sizeof(double) * pairs, kAlign), &ok);
    p->off_rows = off;

    const size_t row_bytes = mul(p->stride, sizeof(float), &ok);
    size_t hb = mul(mul(row_bytes, p->cap, &ok), 2, &ok);                       // K and V
    hb = add(hb, align_up(mul(sizeof(int32_t), p->cap, &ok), kAlign), &ok);   // pos
    hb = add(hb, align_up(mul(sizeof(float), p->cap, &ok), kAlign), &ok);     // score
    p->head_bytes = hb;
    off = add(off, mul(hb, size_t(m.n_layers) * m.n_kv_heads, &ok), &ok);

    p->off_memos = off;
    off = add(off, align_up(mul(sizeof(RopeMemo), cfg.threads, &ok), kAlign), &ok);

    // Per-thread scratch (floats, each part rounded to 16 floats).
    const size_t r16 = kAlign / sizeof(float);
    p->memo_floats = rope_memo_floats(pairs);
    const size_t dec = mul(group, p->logit_ld, &ok) + 2 * align_up(size_t(group) * p->stride, r16) +
                       align_up(group, r16);
    const size_t rows = size_t(kTileTokens) * group;
    const size_t pre = 3 * align_up(rows * p->stride, r16) + align_up(rows * kKeyBlock, r16) +
                       2 * align_up(rows, r16);
    p->scratch_floats = p->memo_floats + align_up(dec > pre ? dec : pre, r16);
    p->off_scratch = off;
    off = add(off, mul(mul(p->scratch_floats, sizeof(float), &ok), cfg.threads, &ok), &ok);
    p->total = off;
    return ok;
}

}  // namespace kvp
