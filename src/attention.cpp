#include "attention.h"

#include <math.h>
#include <string.h>

namespace kvp {
namespace {

constexpr size_t kR16 = kAlign / sizeof(float);

// Copies `rows` query rows (src stride src_ld) to dst (stride = plan.stride) and rotates them to rpos.
void load_rotated(const kvp_cache *c, RopeMemo &memo, int64_t rpos, const float *src, size_t src_ld,
                  uint32_t rows, float *dst) {
    const uint32_t hd = c->cfg.model.head_dim, st = c->plan.stride;
    for (uint32_t r = 0; r < rows; ++r) memcpy(dst + size_t(r) * st, src + r * src_ld, hd * sizeof(float));
    if (c->rope.style == KVP_ROPE_NONE) return;
    rope_apply(c->rope, rope_table_memo(c->rope, memo, rpos), dst, rows, st);
}

// Rotation position of a query at logical index `logical` (original position `orig`) for the
// pinned (ring=false) or ring runs.
int64_t query_rot(const kvp_cache *c, const HeadStore &hs, uint32_t logical, int64_t orig, bool ring) {
    if (c->positions == KVP_POS_ORIGINAL) return orig;
    return int64_t(logical) + (ring ? hs.shift : 0);
}

bool ring_needs_own_rotation(const kvp_cache *c, const HeadStore &hs) {
    return c->positions == KVP_POS_REALIGN && hs.shift != 0 && hs.count != 0;
}

}  // namespace

void attend_decode(const kvp_cache *c, const HeadStore &hs, const float *q, int64_t pos, float *out,
                   RopeMemo &memo, float *scratch) {
    const kern::AttnF32 &K = *c->kern;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, st = c->plan.stride;
    const size_t ld = c->plan.logit_ld;
    float *logits = scratch;
    float *qpin = logits + G * ld;
    float *qring = qpin + align_up(size_t(G) * st, kR16);
    float *sums = qring + align_up(size_t(G) * st, kR16);

    const uint32_t L = hs.len(), P = L - 1;
    load_rotated(c, memo, query_rot(c, hs, P, pos, false), q, hd, G, qpin);
    const float *qr = qpin;
    if (ring_needs_own_rotation(c, hs)) {
        load_rotated(c, memo, query_rot(c, hs, P, pos, true), q, hd, G, qring);
        qr = qring;
    }
    Segment seg[3];
    const uint32_t ns = hs.segments(seg);
    for (uint32_t s = 0; s < ns; ++s)
        K.qk(seg[s].ring ? qr : qpin, st, G, hs.k + size_t(seg[s].slot) * st, st, seg[s].n, hd, c->scale,
             logits + seg[s].logical, ld);
    for (uint32_t g = 0; g < G; ++g) {
        float *row = logits + g * ld;
        sums[g] = K.expsum(row, L, K.max(row, L));
    }
    for (uint32_t g = 0; g < G; ++g) memset(out + size_t(g) * hd, 0, hd * sizeof(float));
    for (uint32_t s = 0; s < ns; ++s)
        K.pv(logits + seg[s].logical, ld, G, hs.v + size_t(seg[s].slot) * st, st, seg[s].n, hd, out, hd);
    for (uint32_t g = 0; g < G; ++g) {
        const float inv = 1.0f / sums[g];
        float *o = out + size_t(g) * hd;
        for (uint32_t j = 0; j < hd; ++j) o[j] *= inv;
    }
}

void attend_prefill(const kvp_cache *c, const HeadStore &hs, uint32_t n, const NewPositions &pos,
                    const float *q, float *out, size_t tok_stride, RopeMemo &memo, float *scratch) {
    const kern::AttnF32 &K = *c->kern;
    const uint32_t G = c->group, hd = c->cfg.model.head_dim, st = c->plan.stride;
    const size_t TR = size_t(kTileTokens) * G;
    const size_t KB = kKeyBlock;
    float *qpin = scratch;
    float *qring = qpin + align_up(TR * st, kR16);
    float *O = qring + align_up(TR * st, kR16);
    float *lg = O + align_up(TR * st, kR16);
    float *mrow = lg + align_up(TR * KB, kR16);
    float *lrow = mrow + align_up(TR, kR16);

    const uint32_t L = hs.len(), L0 = L - n;
    Segment seg[3];
    const uint32_t ns = hs.segments(seg);
    const bool own_ring = ring_needs_own_rotation(c, hs);

    for (uint32_t i0 = 0; i0 < n; i0 += kTileTokens) {
        const uint32_t tq = n - i0 < kTileTokens ? n - i0 : kTileTokens;
        const uint32_t rows = tq * G;
        for (uint32_t t = 0; t < tq; ++t) {
            const uint32_t i = i0 + t;
            const float *src = q + i * tok_stride;
            load_rotated(c, memo, query_rot(c, hs, L0 + i, pos.at(i), false), src, hd, G, qpin + size_t(t) * G * st);
            if (own_ring)
                load_rotated(c, memo, query_rot(c, hs, L0 + i, pos.at(i), true), src, hd, G, qring + size_t(t) * G * st);
        }
        const float *qr = own_ring ? qring : qpin;
        for (uint32_t r = 0; r < rows; ++r) {
            mrow[r] = -INFINITY;
            lrow[r] = 0.0f;
        }
        memset(O, 0, size_t(rows) * st * sizeof(float));
        const uint32_t first_q = L0 + i0, last_q = L0 + i0 + tq - 1;

        for (uint32_t s = 0; s < ns; ++s) {
            for (uint32_t b = 0; b < seg[s].n; b += kKeyBlock) {
                const uint32_t j0 = seg[s].logical + b;
                if (j0 > last_q) break;
                const uint32_t nb = seg[s].n - b < kKeyBlock ? seg[s].n - b : kKeyBlock;
                const size_t slot = size_t(seg[s].slot) + b;
                K.qk(seg[s].ring ? qr : qpin, st, rows, hs.k + slot * st, st, nb, hd, c->scale, lg, KB);
                if (j0 + nb - 1 > first_q) {  // causal mask: key j visible to query token t iff j <= L0+i0+t
                    for (uint32_t t = 0; t < tq; ++t) {
                        const uint32_t lim = first_q + t;
                        const uint32_t from = lim >= j0 ? lim - j0 + 1 : 0;
                        for (uint32_t g = 0; g < G; ++g) {
                            float *row = lg + (size_t(t) * G + g) * KB;
                            for (uint32_t jj = from; jj < nb; ++jj) row[jj] = -INFINITY;
                        }
                    }
                }
                for (uint32_t r = 0; r < rows; ++r) {
                    float *row = lg + r * KB;
                    const float bm = K.max(row, nb);
                    if (bm == -INFINITY) {  // fully masked for this query: contributes nothing
                        memset(row, 0, nb * sizeof(float));
                        continue;
                    }
                    const float mn = bm > mrow[r] ? bm : mrow[r];
                    if (mn != mrow[r] && lrow[r] != 0.0f) {
                        const float a = kern::exp_approx(mrow[r] - mn);
                        float *o = O + r * st;
                        for (uint32_t j = 0; j < hd; ++j) o[j] *= a;
                        lrow[r] *= a;
                    }
                    lrow[r] += K.expsum(row, nb, mn);
                    mrow[r] = mn;
                }
                K.pv(lg, KB, rows, hs.v + slot * st, st, nb, hd, O, st);
            }
        }
        for (uint32_t t = 0; t < tq; ++t) {
            for (uint32_t g = 0; g < G; ++g) {
                const size_t r = size_t(t) * G + g;
                const float inv = 1.0f / lrow[r];
                float *o = out + (i0 + t) * tok_stride + size_t(g) * hd;
                for (uint32_t j = 0; j < hd; ++j) o[j] = O[r * st + j] * inv;
            }
        }
    }
}

}  // namespace kvp
