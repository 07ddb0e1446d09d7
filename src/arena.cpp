#include "arena.h"

#include "cache.h"
#include "config.h"
#include "sliding.h"
#include "storage.h"
#include "prompt.h"
#include "threads.h"

namespace kvp {
namespace {

uint32_t ceil_div(uint64_t a, uint32_t b) { return uint32_t((a + b - 1) / b); }

}  // namespace

uint32_t lend_lean_homes = 2;

void layer_geom(const kvp_config &cfg, uint32_t layer, LayerGeom *g, uint32_t *home_short) {
    const bool local = layer_local(cfg, layer);
    if (local) {  // sliding.h: the core's ring, W - 1 kept plus one prefill piece
        g->lp = LayerPlan{};
        g->lp.cap = uint32_t(uint64_t(cfg.sliding_window) - 1 + local_piece(config_block(cfg)));
        g->lp.front_evict = true;
    } else {
        policy_of(cfg).plan(cfg, layer, &g->lp);
    }
    const uint32_t block = config_block(cfg), cap = g->lp.cap;
    const uint32_t pin = g->lp.pin_cap < cap ? g->lp.pin_cap : cap;
    g->pin_blk_cap = ceil_div(pin, block);
    // max_prompt (prompt.h): an open prompt may hold cap + P tokens in the layer's body
    auto body_blocks = [&](uint32_t c) {
        const uint64_t body = uint64_t(c) + layer_prompt_room(cfg, layer) - pin + g->lp.hole_cap +
                              (g->lp.front_evict ? block - 1 : 0);
        return c > pin ? uint32_t(ceil_div(body, block)) : 0u;
    };
    g->blk_cap = body_blocks(cap);
    g->min_blocks = g->pin_blk_cap + (g->blk_cap ? 1 : 0);
    if (local) g->min_blocks = g->max_blocks();  // a local layer never self-prunes: it always gets its window
    // Heads that lend (pool.h "Lending"): the home holds the capacity's blocks; a store may take
    // up to store_cap tokens, with the blocks its layer's other heads (or other layers) leave.
    g->home_blocks = g->max_blocks();
    const uint32_t H = cfg.model.n_kv_heads;
    if (home_short) *home_short = 0;
    g->lp.store_cap = local ? cap : store_cap(cfg, cap);
    if (g->lp.store_cap != cap) {
        // The layer's heads share one hole allowance (DECISIONS "Heads share the hole
        // allowance"): the home holds the capacity's blocks plus one block of rounding, without
        // the per-head hole_cap; when a call would take the layer past its homes, or a head
        // past what the pools can lend it, lend_blocks (cache_append.cpp) first compacts the
        // heads that hold dead slots. Once compacted, R heads holding x_h tokens (sum <= R x
        // body) need sum ceil(x_h / block) <= R (body + block - 1) / block blocks: this home's.
        // The rounding is the layer's too: sum ceil(x_h / block) <= floor(R (body + block - 1) /
        // block), so its R homes together hold that many body blocks (pool_home splits them).
        if (lend_lean_homes && cap > pin) {
            const uint64_t body = uint64_t(cap) + layer_prompt_room(cfg, layer) - pin + (g->lp.front_evict ? block - 1 : 0);
            const uint32_t lean = g->pin_blk_cap + uint32_t(ceil_div(body + block - 1, block));
            if (lean < g->home_blocks) g->home_blocks = lean;
            // (>= H x (lean - 1): at most H homes are one block short)
            const uint64_t total = uint64_t(H) * g->pin_blk_cap + (body + block - 1) * H / block;
            if (home_short && lend_lean_homes > 1 && total < uint64_t(H) * g->home_blocks)
                *home_short = uint32_t(uint64_t(H) * g->home_blocks - total);
        }
        g->blk_cap = body_blocks(g->lp.store_cap);
    }
}

void stream_geom(const kvp_config &cfg, LayerGeom *g) {
    // duo_sink pinned; a ring of the duo_window - 1 tokens kept before a call plus the call's at
    // most duo_window (cache_append.cpp head_append): 2W - 1, and block - 1 for its front block
    const uint32_t block = config_block(cfg), S = cfg.duo_sink, W = cfg.duo_window;
    g->lp = LayerPlan{};
    g->lp.cap = S + 2 * W - 1;
    g->lp.pin_cap = S;
    g->lp.front_evict = true;
    g->pin_blk_cap = ceil_div(S, block);
    g->blk_cap = ceil_div(uint64_t(2) * W - 1 + block - 1, block);
    g->min_blocks = g->max_blocks();  // never self-prunes: its sinks and window are always there
    g->home_blocks = g->max_blocks();
    g->lp.store_cap = g->lp.cap;
}

bool arena_plan(const kvp_config &cfg, ArenaPlan *p, const char **why, const uint8_t *roles) {
    Sz z;
    const kvp_model &m = cfg.model;
    const uint32_t L = m.n_layers, H = m.n_kv_heads, G = m.n_q_heads / m.n_kv_heads;
    const uint32_t pairs = m.rope == KVP_ROPE_NONE ? 0 : (m.rope_dim ? m.rope_dim : m.head_dim) / 2;
    p->stride = uint32_t(align_up(m.head_dim, kAlign / sizeof(float)));
    p->block = config_block(cfg);

    // Per-layer plans: block needs, table sizes, scratch needs.
    uint64_t sum_blocks = 0, sum_min = 0, sum_cap = 0, tables = 0;
    uint64_t max_tokens = 0;  // the most tokens a layer's KV heads hold together in a call (heads lend)
    uint32_t max_cap = 0, max_pin = 0, max_pcap = 0;  // max_pcap: the largest policy capacity
    uint32_t max_ccap = 0;  // the longest chunk a call appends: a layer's capacity and prompt room (not store_cap)
    size_t max_runs = 0;
    const uint32_t prompt_w = prompt_window(cfg);  // max_prompt: queries stashed per layer (prompt.h)
    bool any_obs = false, any_colsum = false, staged = false, any_compacting = false, any_scoring = false, any_pinned = false;
    p->decode_scores = false;
    LayerGeom sg;  // a streaming head's store (DuoAttention role table)
    stream_geom(cfg, &sg);
    if (roles) {
        if (sg.lp.cap > max_cap) max_cap = sg.lp.cap;
        if (sg.lp.cap > max_ccap) max_ccap = sg.lp.cap;
        if (sg.pin_blk_cap) any_pinned = true;
        const size_t runs = store_max_runs(sg.lp.cap, sg.pin_blk_cap, sg.blk_cap);
        if (runs > max_runs) max_runs = runs;
        // each pool's need; the largest sets nblocks (every pool the same size: state.h ids)
        for (uint32_t h = 0; h < H; ++h) {
            uint64_t need = 0;
            for (uint32_t l = 0; l < L; ++l) {
                LayerGeom g;
                layer_geom(cfg, l, &g);
                need += store_geom(g, sg, roles, H, l, h).home_blocks;
            }
            if (need > sum_blocks) sum_blocks = need;
        }
    }
    uint64_t shorts = 0;  // pool_home's short homes over all layers
    for (uint32_t l = 0; l < L; ++l) {
        LayerGeom g;
        uint32_t short_homes;
        layer_geom(cfg, l, &g, &short_homes);
        if (!roles) sum_blocks += g.home_blocks, shorts += short_homes;
        sum_min += g.min_blocks;
        sum_cap += g.lp.cap;
        if (!roles) tables += uint64_t(g.max_blocks()) * H;
        else
            for (uint32_t h = 0; h < H; ++h) tables += store_geom(g, sg, roles, H, l, h).max_blocks();
        // a layer's store holds up to cap + its prompt room (prompt.h): every size that follows
        // the longest store (logits, runs, realign's RoPE tables, formatted rows) takes that; a
        // call's chunk follows the capacity and the room (lcap)
        const uint32_t room = layer_prompt_room(cfg, l), scap = g.lp.store_cap + room, lcap = g.lp.cap + room;
        if (scap > max_cap) max_cap = scap;
        if (lcap > max_ccap) max_ccap = lcap;
        // policies/policy.h layer_tokens_cap, the layer's own room
        const uint64_t tokens = uint64_t(H) * lcap;
        if (tokens > max_tokens) max_tokens = tokens;
        if (g.lp.cap > max_pcap) max_pcap = g.lp.cap;
        if (g.lp.pin_cap > max_pin) max_pin = g.lp.pin_cap < g.lp.cap ? g.lp.pin_cap : g.lp.cap;
        const size_t runs = store_max_runs(scap, g.pin_blk_cap, g.blk_cap);
        if (runs > max_runs) max_runs = runs;
        const bool observes = g.lp.obs_queries || g.lp.obs_extra || g.lp.observe_first_decode || g.lp.obs_all;
        if (g.lp.obs_all) any_colsum = true;
        if (observes) any_obs = true;
        if (g.lp.staged_prefill) staged = true;
        if (g.lp.decode_scores || observes || g.lp.reads_keys) any_scoring = true;
        if (g.lp.decode_scores) p->decode_scores = true;
        if (!g.lp.front_evict) any_compacting = true;
        if (g.pin_blk_cap) any_pinned = true;
    }
    // Prompt staging (policy.h): prefill_stage, default max(1024, the largest capacity).
    p->stage = !staged ? 0 : cfg.prefill_stage ? cfg.prefill_stage : max_pcap > 1024 ? max_pcap : 1024;
    size_t pol_scratch = 0;
    for (uint32_t l = 0; l < L; ++l) {
        LayerGeom g;
        layer_geom(cfg, l, &g);
        // the selection at a prompt's end ranks up to cap + P tokens (prompt.h: kPromptScratchPerToken
        // per token covers every policy's per-token needs there)
        const uint64_t pr = layer_prompt_room(cfg, l);
        const size_t per = g.lp.scratch_per_token > kPromptScratchPerToken || !pr ? g.lp.scratch_per_token : kPromptScratchPerToken;
        const size_t b = z.add(z.add(g.lp.scratch_bytes, z.mul(per, uint64_t(g.lp.store_cap) + p->stage)), z.mul(per, pr));
        if (b > pol_scratch) pol_scratch = b;
    }
    if (staged) max_runs += 1;  // the staged tokens' run
    // Draft tokens (draft.h): their run(s) after the store's (a pinned part and a body part).
    const uint32_t draft = cfg.max_draft;
    if (draft) max_runs += 2;
    const uint32_t extra_keys = p->stage > draft ? p->stage : draft;  // never both in one call
    const bool fixed = cfg.score == KVP_SCORE_FIXED && any_scoring;  // position-based policies score nothing
    p->kq_stride = fixed ? uint32_t(align_up(m.head_dim, kAlign / sizeof(int16_t))) : 0;
    p->sum_cap = sum_cap;
    p->max_cap = max_cap;
    p->max_runs = max_runs;
    p->shared = cfg.total_capacity != 0 && cfg.total_capacity < sum_cap;
    if (!p->shared) sum_blocks -= shorts / H;  // the pools hold the largest pool's sum (pool_home)
    p->pool_homes = roles || (!p->shared && shorts);
    const uint64_t nblocks = p->shared ? ceil_div(cfg.total_capacity, p->block) : sum_blocks;
    if (nblocks > 0x7fffffffu) { if (why) *why = "the pool needs more than 2^31-1 blocks"; return false; }
    if (nblocks < sum_min) {
        if (why) *why = "total_capacity is below what the layers need to make progress";
        return false;
    }
    // Slot ids are uint32 (storage.h), and cache_init's home ranges multiply block counts.
    if (nblocks * cfg.block > 0xffffffffu) { if (why) *why = "a pool needs more than 2^32-1 slots per KV head"; return false; }
    if (p->shared && nblocks && sum_blocks > UINT64_MAX / nblocks) { if (why) *why = "the pool's home ranges overflow"; return false; }
    p->nblocks = uint32_t(nblocks);
    p->logit_ld = uint32_t(z.al16(uint64_t(max_cap) + extra_keys));
    FmtPlan fp;
    if (!fmt_plan(cfg, p->stride, p->block, p->nblocks, max_cap, max_pin, kTileTokens * G, p->stage, &fp)) z.ok = false;
    if (fp.on) max_runs += 8;  // runs also split where the rows are (store_fmt.h)
    p->one_space = !fp.on;
    p->lend = p->one_space && heads_lend(cfg);
    p->max_runs = max_runs;

    size_t off = z.al(sizeof(kvp_cache));
    p->off_layers = off;
    off = z.add(off, z.al(z.mul(sizeof(LayerState), L)));
    p->off_heads = off;
    off = z.add(off, z.al(z.mul(sizeof(HeadStore), z.mul(L, H))));
    p->off_tables = off;
    off = z.add(off, z.al(z.mul(sizeof(uint32_t), z.fit(tables))));
    p->off_home = off;
    // a role table, or heads that lend: one set of home ranges per pool (and a role table's
    // reservations per pool)
    off = z.add(off, z.al(z.mul(z.mul(sizeof(uint32_t), size_t(L) + 1), p->pool_homes ? H : 1)));
    p->off_minb = off;
    off = z.add(off, z.al(z.mul(z.mul(sizeof(uint32_t), L), roles ? H : 1)));
    p->off_pools = off;
    off = z.add(off, z.al(z.mul(sizeof(BlockPool), H)));
    // per-block bookkeeping of every pool as three arrays indexed by block id over all pools
    // (pool.h "One slot space"), then each pool's free-stack tops and held counts
    p->off_pool_meta = off;
    p->block_meta_bytes = z.al(z.mul(z.mul(sizeof(int32_t), p->nblocks), H));
    off = z.add(off, z.mul(3, p->block_meta_bytes));
    p->off_pool_tops = off;
    p->pool_meta_bytes = z.al(z.mul(2 * sizeof(uint32_t), L));
    off = z.add(off, z.mul(p->pool_meta_bytes, H));
    p->off_freqs = off;
    off = z.add(off, z.al(sizeof(double) * pairs));
    p->off_fixed_freqs = off;
    if (fixed) off = z.add(off, z.al(sizeof(double) * pairs));
    // Realign over compacting stores rotates at positions < 2 * capacity (storage.h): precompute.
    const bool full = pairs && any_compacting && config_positions(cfg) == KVP_POS_REALIGN;
    p->rope_full_n = full ? 2 * max_cap : 0;
    p->off_rope_full = off;
    off = z.add(off, z.mul(z.mul(p->rope_full_n, rope_table_floats(pairs)), sizeof(float)));
    // score=fixed rotates the int16 rows at the same positions (queries also at staged ones).
    p->fixed_rope_n = full && fixed ? 2 * (max_cap + p->stage) : 0;
    p->off_fixed_rope = off;
    off = z.add(off, z.al(z.mul(z.mul(p->fixed_rope_n, 2 * size_t(pairs)), sizeof(int16_t))));
    p->off_fmt = off;
    off = z.add(off, fp.on ? z.al(fp.bytes) : 0);

    // Tables of one call's positions (rope.h Rope::call): a prefill chunk's, decode's one; a
    // second range for the queries over streaming's sinks in realign mode. A call appends at
    // most a layer's capacity and prompt room per head, also where heads lend (cache_room_check:
    // the layer's sum), so the tables follow that, not a store's cap; positions past them come
    // from the thread's memo (rope.h: the same tables).
    p->rope_call_n = pairs && !p->rope_full_n ? (max_ccap < kRopeCallTables ? max_ccap : kRopeCallTables) : 0;
    p->rope_call_ranges = any_pinned && config_positions(cfg) == KVP_POS_REALIGN ? 2 : 1;
    p->off_rope_call = off;
    off = z.add(off, z.mul(z.mul(z.mul(p->rope_call_n, p->rope_call_ranges), rope_table_floats(pairs)), sizeof(float)));
    p->off_threads = off;
    p->threads_bytes = z.al(pool_bytes(cfg.threads, cfg.thread_pool == KVP_THREAD_POOL_HOST));
    off = z.add(off, p->threads_bytes);

    // The last `draft` slots of a pool hold the rows of one layer's draft tokens during a draft
    // call (draft.h), after the staging slots.
    // Plain f32 storage lays the pools' slots out as one slot space (pool.h "One slot space"):
    // each array holds every pool's slots, all blocks first, then each pool's staging and draft
    // slots; formatted storage keeps one data region per pool (quant/store_fmt.h).
    const size_t pool_slots = z.add(z.add(z.mul(p->nblocks, p->block), p->stage), draft);
    const size_t slots = p->one_space ? z.mul(pool_slots, H) : pool_slots;
    const uint64_t all_slots = uint64_t(pool_slots) * (p->one_space ? H : 1u);  // (size_t may be 32 bits)
    if (all_slots > 0xffffffffu || (p->one_space && uint64_t(p->nblocks) * H > 0x7fffffffu)) {
        if (why) *why = "the pools need more than 2^32-1 slots or 2^31-1 blocks in all";
        return false;
    }
    const size_t rows = z.mul(z.mul(slots, p->stride), sizeof(float));
    p->data_v = rows;
    p->data_pos = fp.on ? fp.end : z.mul(rows, 2);
    p->data_rot = z.add(p->data_pos, z.al(z.mul(sizeof(int32_t), slots)));
    p->data_score = z.add(p->data_rot, z.al(z.mul(sizeof(int32_t), slots)));
    p->pool_data_bytes = z.add(p->data_score, z.al(z.mul(sizeof(float), slots)));
    p->data_kq = p->data_kexp = 0;
    if (fixed) {
        p->data_kq = p->pool_data_bytes;
        p->data_kexp = z.add(p->data_kq, z.al(z.mul(z.mul(slots, p->kq_stride), sizeof(int16_t))));
        p->pool_data_bytes = z.add(p->data_kexp, z.al(z.mul(slots, sizeof(int16_t))));
    }
    p->off_data = off;
    off = z.add(off, p->one_space ? p->pool_data_bytes : z.mul(p->pool_data_bytes, H));

    const Policy &pol = policy_of(cfg);
    p->pstate_bytes = pol.state_bytes ? pol.state_bytes(cfg, p->stage) : 0;
    const size_t phase = pol.phase_bytes ? pol.phase_bytes(cfg, p->stage) : 0;  // in the scratch, below
    p->off_pstate = off;
    off = z.add(off, z.al(p->pstate_bytes));

    // Draft region (arena.h draft_offset): the header, per layer the draft tokens' positions and
    // q/k/v as given, then (formatted storage) the draft rows of one layer's KV heads.
    if (draft) {
        size_t bytes = z.add(draft_header_bytes(cfg), z.mul(draft_layer_bytes(cfg, z), L));
        if (fp.on) bytes = z.add(bytes, z.mul(z.mul(2, H), z.al(z.mul(z.mul(draft, p->stride), sizeof(float)))));
        off = z.add(off, bytes);
    }

    // max_prompt (prompt.h): the prompt region, derived (prompt_offset), before the memos
    off = z.add(off, prompt_region_bytes(cfg, prompt_w, z));

    p->off_memos = off;
    off = z.add(off, z.al(z.mul(sizeof(RopeMemo), cfg.threads)));

    // Per-thread scratch (bytes; parts 64-aligned).
    const size_t ld = p->logit_ld, st = p->stride, TR = size_t(kTileTokens) * G;
    p->memo_floats = rope_memo_floats(pairs);
    p->granule = decode_granule(p->stride);
    p->max_chunks = decode_chunk_count(*p, max_cap + draft);  // decode reads at most a layer's capacity (+ drafts)
    p->part_floats = z.add(z.al16(z.mul(3, G)), z.mul(G, st));
    const size_t dec = z.mul(G, ld);  // the group's logits; partials and query rows follow
    size_t pre = z.add(z.add(z.mul(2, z.al16(z.mul(TR, st))), z.al16(z.mul(TR, kKeyBlock))), 2 * z.al16(TR));
    if (any_obs) pre = z.add(pre, z.add(z.add(z.al16(z.mul(TR, ld)), z.al16(z.mul(G, ld))), z.al16(TR)));
    if (any_colsum) pre = z.add(pre, z.al16(z.mul(TR, (ld + kKeyBlock - 1) / kKeyBlock)));  // colsum's block maxima
    const size_t work = dec > pre ? dec : pre;
    const size_t runs_b = z.al(z.mul(sizeof(Run), max_runs)), part_b = z.al(z.mul(z.mul(p->max_chunks, p->part_floats), sizeof(float))),
                 priv_b = z.al(z.mul(z.al16(z.mul(G, st)), sizeof(float)));
    size_t work_b = z.al(z.mul(work, sizeof(float)));
    // the policy's phase region (policy.h phase_bytes) spans participant 0's runs..priv: work
    // grows where it does not fit
    const size_t span = z.add(z.add(runs_b, work_b), z.add(part_b, priv_b));
    if (phase > span) work_b = z.add(work_b, z.al(phase - span));
    p->scr_runs = z.al(z.mul(p->memo_floats, sizeof(float)));
    p->scr_work = z.add(p->scr_runs, runs_b);
    p->scr_part = z.add(p->scr_work, work_b);
    p->scr_priv = z.add(p->scr_part, part_b);
    p->scr_policy = z.add(p->scr_priv, priv_b);
    size_t fx = z.add(p->scr_policy, z.al(pol_scratch));
    p->fx_qx = p->fx_qr = p->fx_qe = p->fx_z = p->fx_cs = p->fx_y = p->fx_obs = 0;
    if (fixed) {
        const size_t qrow = z.al(z.mul(z.mul(G, p->kq_stride), sizeof(int16_t)));
        p->fx_qx = fx;
        p->fx_qr = z.add(p->fx_qx, qrow);
        p->fx_qe = z.add(p->fx_qr, qrow);
        p->fx_z = z.add(p->fx_qe, z.al(z.mul(G, sizeof(int32_t))));
        p->fx_cs = z.add(p->fx_z, z.mul(2, z.al(z.mul(G, sizeof(uint64_t)))));  // sums, then reciprocals
        p->fx_y = z.add(p->fx_cs, z.al(z.mul(p->kq_stride, sizeof(int16_t))));
        p->fx_obs = z.add(p->fx_y, z.al(z.mul(z.mul(G, ld), sizeof(int64_t))));
        fx = z.add(p->fx_obs, z.al(z.mul(z.mul(G, ld), sizeof(uint32_t))));
    }
    p->scr_fmt = fx;
    p->scratch_bytes = z.add(p->scr_fmt, fp.on ? z.al(fp.scr_bytes) : 0);
    if (fp.on && cfg.kv_rotate == KVP_ROTATE_HADAMARD)  // rotated staged V rows (arena.h, after scr_fmt)
        p->scratch_bytes = z.add(p->scratch_bytes, z.al(z.mul(z.mul(max_cap, st), sizeof(float))));
    p->off_scratch = off;
    off = z.add(off, z.mul(p->scratch_bytes, cfg.threads));
    const HeadAreaPlan ha = head_area_plan(*p, cfg.threads, G, z);
    size_t areas = z.mul(ha.bytes, H);
    if (p->lend && ha.bytes && max_tokens) {
        // packed (head_need): sum_h need(L_h) over sum_h L_h <= max_tokens, each part rounded up
        // to kAlign (64 bytes) and a row to 16 floats at most once per head
        const uint64_t runs = max_tokens + uint64_t(H) * run_slack(*p), lrows = max_tokens + uint64_t(H) * 15,
                       chunks = (max_tokens + uint64_t(H) * p->granule) / p->granule;
        size_t packed = z.add(z.mul(sizeof(Run), z.fit(runs)), z.mul(H, 3 * kAlign));
        if (p->decode_scores) packed = z.add(packed, z.mul(z.mul(G, z.fit(lrows)), sizeof(float)));
        packed = z.add(packed, z.mul(z.mul(z.fit(chunks), p->part_floats), sizeof(float)));
        if (packed < areas) areas = packed;
    }
    off = z.add(off, areas);
    p->total = off;
    if (!z.ok && why) *why = "the arena size overflows size_t";
    return z.ok;
}

HeadNeed head_need(const ArenaPlan &p, uint32_t group, uint32_t L) {
    const size_t want = size_t(L) + run_slack(p), runs = want < p.max_runs ? want : p.max_runs;
    HeadNeed n;
    n.ld = uint32_t(align_up(L, 16));
    n.work = align_up(sizeof(Run) * runs, kAlign);
    n.part = n.work + (p.decode_scores ? align_up(size_t(group) * n.ld * sizeof(float), kAlign) : 0);
    n.bytes = n.part + align_up(size_t(decode_chunk_count(p, L)) * p.part_floats * sizeof(float), kAlign);
    return n;
}

HeadAreaPlan head_area_plan(const ArenaPlan &p, uint32_t threads, uint32_t group, Sz &z) {
    HeadAreaPlan a{z.add(p.off_scratch, z.mul(p.scratch_bytes, threads)), 0, 0, 0};
    if (threads <= 1) return a;
    a.work = z.al(z.mul(sizeof(Run), p.max_runs));
    a.part = z.add(a.work, p.decode_scores ? z.al(z.mul(z.mul(group, p.logit_ld), sizeof(float))) : 0);
    a.bytes = z.add(a.part, z.al(z.mul(z.mul(p.max_chunks, p.part_floats), sizeof(float))));
    return a;
}

}  // namespace kvp
