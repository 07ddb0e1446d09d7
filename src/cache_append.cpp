// The append phase of a cache step: admission (the room checks the C API runs before a call
// changes anything: cache_room_check, cache_prefill_room), then per head making room (compaction,
// the policy's own eviction when the pool is dry, a local layer's window) and writing the new
// tokens' rows (RoPE, kv_rotate, the fixed-point key copy, formatted staging). Split from
// cache.cpp by phase (DECISIONS "cache.cpp by phase").
#include "step.h"

#include <math.h>
#include <new>
#include <string.h>

#include <atomic>

#include "attention.h"
#include "config.h"
#include "draft.h"
#include "prompt.h"
#include "kernels/score_fixed.h"
#include "sliding.h"

#if !defined(KVP_NO_HEAP)
#include <stdlib.h>
#endif

namespace kvp {

FixedWork fixed_work(kvp_cache *c, size_t tid) {
    char *base = c->scratch + tid * c->plan.scratch_bytes;
    const ArenaPlan &p = c->plan;
    return FixedWork{reinterpret_cast<int16_t *>(base + p.fx_qx), reinterpret_cast<int16_t *>(base + p.fx_qr),
                     reinterpret_cast<int32_t *>(base + p.fx_qe), reinterpret_cast<uint64_t *>(base + p.fx_z),
                     reinterpret_cast<double *>(base + p.fx_z + align_up(size_t(c->group) * sizeof(uint64_t), kAlign)),
                     reinterpret_cast<int16_t *>(base + p.fx_cs), reinterpret_cast<int64_t *>(base + p.fx_y),
                     reinterpret_cast<uint32_t *>(base + p.fx_obs)};
}

const int16_t *fixed_rope_table(const kvp_cache *c, const FixedWork &w, int64_t pos) {
    if (c->rope.style == KVP_ROPE_NONE) return w.cs;  // unused by fixed::rotate
    if (pos >= 0 && pos < int64_t(c->fixed_rope_n)) return c->fixed_rope + size_t(pos) * 2 * c->rope.pairs;
    fixed::rope_table(c->fixed_freqs, c->rope.pairs, pos, w.cs);
    return w.cs;
}

void fixed_store_key(kvp_cache *c, const BlockPool &pool, uint32_t slot, const float *k, int64_t rot, size_t tid) {
    const FixedWork w = fixed_work(c, tid);
    const uint32_t hd = c->cfg.model.head_dim;
    pool.kexp[slot] = int16_t(fixed::quantize_row(k, hd, w.qx));
    fixed::rotate(c->rope.style, c->rope.pairs, fixed_rope_table(c, w, rot), w.qx, pool.kq_row(slot), hd);
}

namespace {

// Writes one token's K/V row into `slot`, K rotated at `rot` (storage.h), score 0.
// kr / vr: where the K and V rows go (NULL: the pool slot's rows; vr is also NULL for a formatted
// store's staged token, whose V stays in the caller's array).
// Half rows (io.h) are widened in this copy; the fixed-point key copy is quantized from the
// widened row before its rotation (the caller's values, as the f32 call's).
void write_token(kvp_cache *c, BlockPool &pool, uint32_t slot, int64_t orig, int64_t rot, In k, In v, RopeMemo &memo,
                 size_t tid, float *kr = nullptr, float *vr = nullptr) {
    const uint32_t hd = c->cfg.model.head_dim;
    if (!c->fmt) {
        kr = pool.k_row(slot);
        vr = pool.v_row(slot);
    }
    k.load(kr, hd);
    if (vr) v.load(vr, hd);
    if (pool.kq) fixed_store_key(c, pool, slot, kr, rot, tid);
    if (c->rope.style != KVP_ROPE_NONE) rope_apply(c->rope, rope_table_memo(c->rope, memo, rot), kr, 1, c->plan.stride);
    rotate_rows(c, kr, 1, c->plan.stride);  // kv_rotate: after RoPE
    if (vr) rotate_rows(c, vr, 1, c->plan.stride);
    pool.pos[slot] = int32_t(orig);
    pool.rot[slot] = int32_t(rot);
    memset(pool.score + slot, 0, sizeof(float));  // 0 as float and as fixed-point bits
}

// Stores one token's K/V row for a head in its next slot (room was made), K rotated at the
// position its mode gives (storage.h: rot). Formatted stores (quant/store_fmt.h) put the rows in
// the side rows (decode) or the staging row `stage` (prefill/append; V stays in the caller's
// array) until the token's group is converted.
void store_token(kvp_cache *c, HeadStore &hs, BlockPool &pool, uint32_t layer, int64_t orig, In k, In v,
                 RopeMemo &memo, size_t tid, float *stage) {
    uint32_t slot = 0;
    store_reserve(hs, pool, layer, &slot);
    const bool pinned = hs.next_pinned();
    const int64_t rot = c->positions == KVP_POS_ORIGINAL ? orig : int64_t(hs.len()) + (pinned ? 0 : hs.shift);
    float *kr = nullptr, *vr = nullptr;
    if (c->fmt) fmt_new_rows(c, hs, slot, pinned, stage, &kr, &vr);
    write_token(c, pool, slot, orig, rot, k, v, memo, tid, kr, vr);
    store_commit(hs);
    if (c->fmt && !pinned) ++hs.nres;
}

}  // namespace

// Sliding-window layers (sliding.h): the oldest body tokens of a local layer's store (a ring:
// no pinned prefix, no dead slots) whose original position is at most lim, evicted; and
// at least `over` of them whatever their positions (capacity: only for callers whose positions
// do not ascend). Blocks that empty go back to the pool.
void local_evict(kvp_cache *c, HeadStore &hs, BlockPool &pool, uint32_t layer, int64_t lim, uint32_t over) {
    const uint32_t block = pool.block;
    auto pos_at = [&](uint32_t j) {
        const uint32_t v = hs.roff + j;
        return int64_t(pool.pos[hs.blk[(hs.bhead + v / block) % hs.blk_cap] * block + v % block]);
    };
    uint32_t lo = 0, hi = hs.count;  // the first body token above lim (positions ascend)
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (pos_at(mid) > lim) hi = mid;
        else lo = mid + 1;
    }
    const uint32_t e = lo > over ? lo : over < hs.count ? over : hs.count;
    if (e) store_evict_front(hs, pool, layer, e, c->positions == KVP_POS_REALIGN);
}



void lend_blocks(kvp_cache *c, uint32_t layer, uint32_t n) {
    if (!c->plan.lend || layer_local(c->cfg, layer)) return;
    const uint32_t H = c->cfg.model.n_kv_heads;
    auto need = [&](uint32_t h) -> uint32_t {
        const HeadStore &hs = head_of(c, layer, h);
        return head_streaming(hs) ? 0 : store_blocks_needed(hs, c->plan.block, n);  // a streaming head's are reserved
    };
    // The layer's blocks (held in every pool, and the call's need) against its homes in every
    // pool: a layer whose heads hold dead slots stays within its homes (arena.cpp layer_geom), so
    // the other layers' homes stay theirs. (A shared pool's layers take each other's blocks by
    // design: there only a head's shortage compacts.)
    auto over_home = [&]() {
        if (c->plan.shared) return false;
        uint64_t held = 0, home = 0;
        for (uint32_t p = 0; p < H; ++p) {
            const BlockPool &pool = c->pools[p];
            held += pool.held[layer] + need(p);
            home += pool.home_lo[layer + 1] - pool.home_lo[layer];
        }
        return held > home;
    };
    for (;;) {
        bool short_of = false;
        for (uint32_t h = 0; h < H; ++h) {
            BlockPool &to = c->pools[h];
            const uint32_t nh = need(h);
            for (uint32_t g = 0; g < H && to.allowed(layer) < nh; ++g) {
                if (g == h) continue;
                BlockPool &from = c->pools[g];
                const uint32_t ng = need(g);
                while (to.allowed(layer) < nh && from.allowed(layer) > ng && from.lend(to, layer)) {
                }
            }
            short_of = short_of || to.allowed(layer) < nh;
        }
        if (!short_of && !over_home()) return;
        // The heads share one hole allowance (arena.cpp layer_geom: the homes hold no per-head
        // hole_cap): a call that needs more blocks than the layer's homes (or the pools) leave
        // gets those its layer's dead slots hold. Compact the head with the most dead slots
        // (ties: the lower head) and lend again; with none left, head_append's own rule
        // (self_prune on a dry pool) decides, as before.
        uint32_t best = H, most = 0;
        for (uint32_t h = 0; h < H; ++h) {
            const HeadStore &hs = head_of(c, layer, h);
            if (!head_streaming(hs) && hs.holes > most) best = h, most = hs.holes;
        }
        if (best == H) return;
        store_compact(head_of(c, layer, best), c->pools[best], layer);
    }
}

// Makes room in one head and appends the call's n tokens (thread tid's memo and policy
// scratch): to the staging slots when `staged` (policy.h), else to the store; a formatted
// store stages prefill/append rows when `fmt_stage`.
Appended head_append(kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, const NewPositions &pos, In k, In v,
                     bool staged, bool fmt_stage, size_t tid) {
    const kvp_model &m = c->cfg.model;
    const Policy &pol = *c->policy;
    HeadStore &hs = head_of(c, layer, h);
    BlockPool &pool = c->pools[h];
    PolicyCtx ctx{c, layer, h, &pool, scratch_of(c, tid).policy, 0, 0};

    // A local layer first drops the keys none of the new queries sees (sliding.h).
    const bool local = layer_local(c->cfg, layer);
    if (local) {
        const uint32_t over = hs.len() + n > hs.cap ? hs.len() + n - hs.cap : 0;
        local_evict(c, hs, pool, layer, pos.at(0) - int64_t(c->cfg.sliding_window), over);
    }
    // A streaming head (DuoAttention role table; arena.h stream_geom) keeps its sinks and the
    // duo_window - 1 newest tokens before the call's n (n <= duo_window: cache_room_check), so
    // every query of the call sees its sinks and at least its duo_window newest tokens (a decode
    // exactly those); its blocks are reserved, the policy never runs on it.
    const bool stream = head_streaming(hs);
    if (stream) {
        const uint32_t keep = c->cfg.duo_window - 1;
        if (hs.body_len() > keep) store_evict_front(hs, pool, layer, hs.body_len() - keep, c->positions == KVP_POS_REALIGN);
    }
    // Room first: dead slots are compacted away, then a dry pool makes the policy evict by its
    // own ranking (cache_room_check said that suffices). A local layer's blocks are reserved.
    while (!staged && !local && !stream && store_blocks_needed(hs, pool.block, n) > pool.allowed(layer)) {
        if (hs.holes) {
            store_compact(hs, pool, layer);
            continue;
        }
        const uint32_t before = hs.len();
        pol.self_prune(ctx, hs, n);
        if (hs.len() == before) break;
    }
    const uint32_t L0 = hs.len();
    const bool realign = c->positions == KVP_POS_REALIGN;
    Appended ap;
    ap.L0 = L0;
    if (staged) {
        ap.staged = n;
        // formatted storage: the staged rows are the pool's f32 staging rows (store_fmt.h FmtPool)
        const FmtPool *fpo = c->fmt ? &fmt_pool(*c->fmt, pool) : nullptr;
        for (uint32_t i = 0; i < n; ++i) {
            const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
            const int64_t rot = realign ? int64_t(L0) + i + hs.shift : pos.at(i);
            write_token(c, pool, pool.stage_slot + i, pos.at(i), rot, k + kv_off, v + kv_off, c->memos[tid], tid,
                        fpo ? fpo->sk + size_t(i) * c->plan.stride : nullptr,
                        fpo ? fpo->sv + size_t(i) * c->plan.stride : nullptr);
        }
    } else {
        // Formatted stores stage a prefill/append chunk's rotated keys until its groups convert
        // (in the running thread's scratch: such a step stays on one thread).
        const FmtPlan *fp = c->fmt ? &c->fmt->fp : nullptr;
        float *stage = fp && fmt_stage ? reinterpret_cast<float *>(scratch_of(c, tid).fmt + fp->s_stage) : nullptr;
        // The V rows stay in the caller's array, or, half, are widened here into the staging rows
        // after the chunk's K rows (the staging area holds max_cap rows: the C API refuses a half
        // chunk of more than max_cap / 2 tokens, io_stage_limit).
        float *stage_v = stage && !v.f32() ? stage + size_t(n) * c->plan.stride : nullptr;
        for (uint32_t i = 0; i < n; ++i) {
            const size_t kv_off = (size_t(i) * m.n_kv_heads + h) * m.head_dim;
            if (stage_v) (v + kv_off).load(stage_v + size_t(i) * c->plan.stride, m.head_dim);
            store_token(c, hs, pool, layer, pos.at(i), k + kv_off, v + kv_off, c->memos[tid], tid,
                        stage ? stage + size_t(i) * c->plan.stride : nullptr);
        }
        if (stage) {
            ap.nw.L0 = L0;
            ap.nw.n = n;
            ap.nw.k = stage;
            ap.nw.ldk = c->plan.stride;
            ap.nw.v = stage_v ? stage_v : v.f32() + size_t(h) * m.head_dim;
            ap.nw.ldv = stage_v ? c->plan.stride : size_t(m.n_kv_heads) * m.head_dim;
            if (c->rot) {  // kv_rotate: the staged V rows are rotated copies (cache.h rotv_scratch)
                float *rv = rotv_scratch(c, tid);
                for (uint32_t i = 0; i < n; ++i)
                    memcpy(rv + size_t(i) * c->plan.stride, ap.nw.v + i * ap.nw.ldv, m.head_dim * sizeof(float));
                rotate_rows(c, rv, n, c->plan.stride);
                ap.nw.v = rv;
                ap.nw.ldv = c->plan.stride;
            }
        }
    }
    hs.len_after_append = hs.len() + ap.staged;  // what the queries see
    return ap;
}

namespace {

// Pool side of taking n tokens into (layer, head) when `allowed` blocks may be taken: whether it
// can (after compacting dead slots and letting the policy evict all it may), and how many new
// blocks it then takes at most (*take). The evictable count is *ev.
bool pool_room(const kvp_cache *c, uint32_t layer, uint32_t h, uint32_t n, uint64_t allowed, uint64_t *take,
               uint32_t *ev) {
    const HeadStore &hs = head_of(c, layer, h);
    const BlockPool &pool = c->pools[h];
    const uint32_t need = store_blocks_needed(hs, pool.block, n);
    *ev = 0;
    if (need <= allowed) {
        *take = need;
        return true;
    }
    PolicyCtx ctx{const_cast<kvp_cache *>(c), layer, h, const_cast<BlockPool *>(&pool), nullptr, 0, 0};
    uint32_t e = c->policy->evictable(ctx, hs);
    if (e > hs.body_len()) e = hs.body_len();
    *ev = e;
    *take = allowed;
    return store_blocks_after(hs, pool.block, hs.body_len() - e, c->layers[layer].geom.lp.front_evict, n) <=
           uint64_t(hs.pnb) + hs.nb + allowed;
}

}  // namespace

namespace {

// What a caller does about a chunk of n tokens that does not fit a layer holding `len` of `cap`
// slots (the tail of every KVP_ERR_FULL message, kvprune.h "Messages").
void full_advice(const kvp_cache *c, uint32_t len, uint32_t cap, uint32_t n, Msg &m) {
    const kvp_config &cfg = c->cfg;
    const bool never_prunes = cfg.policy == KVP_POLICY_FULL ||
                              (cfg.policy == KVP_POLICY_STREAMING && cfg.compress_every == 0);
    if (n > 1 && len < cap) m.s("chunk the prompt by kvp_prefill_room, or ");
    if (cfg.policy == KVP_POLICY_FULL) m.s("raise capacity (policy=full never evicts)");
    else if (never_prunes) m.s("set compress_every >= 1 (0 never prunes) or raise capacity");
    else m.s("raise capacity");
}

}  // namespace

kvp_status cache_room_check(const kvp_cache *c, uint32_t layer, uint32_t n, bool queries, Msg &m) {
    const kvp_model &md = c->cfg.model;
    if (queries && prompt_takes(c, layer)) return prompt_room_check(c, layer, n, m);  // prompt.h
    if (queries && c->layers[layer].geom.lp.staged_prefill) {  // through the staging area (policy.h)
        if (n > c->plan.stage) {
            m.s("layer ").u(layer).s(" holds ").u(head_of(c, layer, 0).len()).s(" tokens; a prefill chunk of ").u(n)
                .s(" exceeds the prompt staging area (prefill_stage=").u(c->plan.stage)
                .s(" tokens per call): chunk the prompt by kvp_prefill_room, or raise prefill_stage");
            return KVP_ERR_FULL;
        }
        return KVP_OK;
    }
    if (layer_local(c->cfg, layer)) return KVP_OK;  // sliding.h: pieces, evictions, reserved blocks
    // Heads that lend (pool.h): a head holds up to its store's cap, the layer's heads together up
    // to the capacity each (what the pools hold), as uniform's
    if (c->plan.lend) {
        uint64_t sum = 0, heads = 0;
        for (uint32_t h = 0; h < md.n_kv_heads; ++h)
            if (!head_streaming(head_of(c, layer, h))) sum += head_of(c, layer, h).len(), ++heads;
        const uint64_t cap = c->layers[layer].geom.lp.cap;
        if (sum + heads * n > heads * cap) {
            m.s("layer ").u(layer).s("'s KV heads hold ").u(sum).s(" tokens of ").u(heads * cap).s(" (capacity ").u(cap)
                .s(" per head, lent between them); ").u(n).s(" more per head do not fit: ");
            full_advice(c, uint32_t(sum / (heads ? heads : 1)), uint32_t(cap), n, m);
            return KVP_ERR_FULL;
        }
    }
    for (uint32_t h = 0; h < md.n_kv_heads; ++h) {
        const HeadStore &hs = head_of(c, layer, h);
        if (head_streaming(hs)) {  // DuoAttention: a call adds at most duo_window tokens (head_append)
            if (n > c->cfg.duo_window) {
                m.s("layer ").u(layer).s(" KV head ").u(h).s(" is a streaming head (kvp_create_heads) that takes at most duo_window=")
                    .u(c->cfg.duo_window).s(" tokens per call; ").u(n).s(" do not fit: chunk the prompt by kvp_prefill_room");
                return KVP_ERR_FULL;
            }
            continue;
        }
        if (uint64_t(hs.len()) + n > hs.cap) {
            m.s("layer ").u(layer).s(" holds ").u(hs.len()).s(" tokens and can take ").u(hs.cap > hs.len() ? hs.cap - hs.len() : 0)
                .s(" more (capacity ").u(hs.cap).s("); ").u(n).s(" do not fit: ");
            full_advice(c, hs.len(), hs.cap, n, m);
            return KVP_ERR_FULL;
        }
        uint64_t take;
        uint32_t ev;
        if (!pool_room(c, layer, h, n, c->pools[h].allowed(layer), &take, &ev)) {
            m.s("layer ").u(layer).s(" KV head ").u(h).s(" holds ").u(hs.len()).s(" tokens; the shared pool (total_capacity=")
                .u(c->cfg.total_capacity).s(") has no free block for ").u(n).s(" more and policy ").s(c->policy->name)
                .s(ev ? " cannot free enough: " : " cannot evict: ")
                .s(n > 1 ? "chunk the prompt by kvp_prefill_room, or raise total_capacity" : "raise total_capacity");
            return KVP_ERR_FULL;
        }
    }
    return KVP_OK;
}

namespace {

// Whether a chunk of n tokens fits every layer in turn: per pool, each layer's new blocks are
// taken from what the layers before it in the same chunk left (reservations as in pool.h).
bool chunk_fits(const kvp_cache *c, uint32_t n) {
    const kvp_model &m = c->cfg.model;
    if (!c->plan.shared) return true;  // the capacities were checked by the caller
    for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
        const BlockPool &pool = c->pools[h];
        uint64_t nfree = pool.nfree, deficit = pool.deficit;
        for (uint32_t l = 0; l < m.n_layers; ++l) {
            if (layer_local(c->cfg, l)) continue;  // its blocks are reserved (sliding.h)
            const uint64_t own = pool.deficit_of(l), others = deficit - own;
            uint64_t take;
            uint32_t ev;
            if (!pool_room(c, l, h, n, nfree > others ? nfree - others : 0, &take, &ev)) return false;
            nfree -= take;
            deficit -= take < own ? take : own;
        }
    }
    return true;
}

}  // namespace

uint32_t cache_prefill_room(const kvp_cache *c) {
    uint32_t lo = 0, hi = UINT32_MAX;  // fits(lo); the answer is at most min(cap - len)
    const kvp_model &m = c->cfg.model;
    if (c->prompt) {  // max_prompt (prompt.h): a chunk up to P fits where the policy can make room
        Msg none(nullptr, 0);
        uint32_t plo = 0, phi = c->cfg.max_prompt;
        for (uint32_t l = 0; l < m.n_layers; ++l)
            if (prompt_takes(c, l) && prompt_room_check(c, l, phi, none) != KVP_OK) phi = 0;
        if (phi) return phi;
        phi = c->cfg.max_prompt;  // fits(plo), !fits(phi)
        while (phi - plo > 1) {
            const uint32_t mid = plo + (phi - plo) / 2;
            bool fits = true;
            for (uint32_t l = 0; l < m.n_layers && fits; ++l)
                fits = !prompt_takes(c, l) || prompt_room_check(c, l, mid, none) == KVP_OK;
            if (fits) plo = mid;
            else phi = mid;
        }
        return plo;
    }
    if (c->plan.stage) return c->plan.stage;  // staged policies: any chunk up to the staging area
    for (uint32_t l = 0; l < m.n_layers; ++l) {
        if (layer_local(c->cfg, l)) continue;  // takes any chunk in pieces (sliding.h)
        uint64_t sum = 0, heads = 0;
        for (uint32_t h = 0; h < m.n_kv_heads; ++h) {
            const HeadStore &hs = head_of(c, l, h);
            // heads that lend (pool.h): each up to its store's cap (the layer's sum below)
            const uint32_t len = hs.len(), cap = c->plan.lend ? hs.cap : c->layers[l].geom.lp.cap;
            // a streaming head (DuoAttention) takes up to duo_window tokens per call, whatever it holds
            const uint32_t room = head_streaming(hs) ? c->cfg.duo_window : cap > len ? cap - len : 0;
            if (room < hi) hi = room;
            if (!head_streaming(hs)) sum += len, ++heads;
        }
        const uint64_t lcap = uint64_t(c->layers[l].geom.lp.cap) * heads;
        if (c->plan.lend && heads) {
            const uint64_t room = lcap > sum ? (lcap - sum) / heads : 0;
            if (room < hi) hi = uint32_t(room);
        }
    }
    if (chunk_fits(c, hi)) return hi;
    while (hi - lo > 1) {  // fits(lo), !fits(hi)
        const uint32_t mid = lo + (hi - lo) / 2;
        if (chunk_fits(c, mid)) lo = mid;
        else hi = mid;
    }
    return lo;
}

}  // namespace kvp
