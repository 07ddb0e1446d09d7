#include "quant/store_fmt.h"

#include <string.h>

#include "arena.h"
#include "attention.h"
#include "cache.h"
#include "prompt.h"
#include "quant/think.h"

namespace kvp {
namespace {

// A token going into a block being (re)built: its target slot and where its data is now.
struct Src {
    uint32_t slot;        // target slot
    uint32_t from;        // converted source slot (kf == NULL)
    const float *kf, *vf; // full-precision rows (residual / staged), else NULL
};

// Repack scratch of one pool (pool.h pscr): K of a block being rebuilt, one gathered V row,
// bounce rows for residual tokens a compaction moves, the block's source list.
struct PoolScratch {
    float *kbuf;      // [block][wkp]
    float *vtmp;      // [wvp]
    float *bk, *bv;   // [block][stride]
    Src *src;         // [block]
};
size_t ps_kbuf(const StoreFormat &f) { return align_up(size_t(f.block) * f.wkp * sizeof(float), kAlign); }
size_t ps_vtmp(const StoreFormat &f) { return align_up(size_t(f.wvp) * sizeof(float), kAlign); }
size_t ps_bounce(const StoreFormat &f, uint32_t stride) { return align_up(size_t(f.block) * stride * sizeof(float), kAlign); }
size_t pool_scratch_bytes(const StoreFormat &f, uint32_t stride) {
    return ps_kbuf(f) + ps_vtmp(f) + 2 * ps_bounce(f, stride) + align_up(size_t(f.block) * sizeof(Src), kAlign);
}
PoolScratch pool_scratch(const FmtCache &fc, const BlockPool &pool) {
    const StoreFormat &f = fc.f;
    char *b = fmt_pool(fc, pool).pscr;
    PoolScratch s;
    s.kbuf = reinterpret_cast<float *>(b);
    b += ps_kbuf(f);
    s.vtmp = reinterpret_cast<float *>(b);
    b += ps_vtmp(f);
    s.bk = reinterpret_cast<float *>(b);
    b += ps_bounce(f, fc.stride);
    s.bv = reinterpret_cast<float *>(b);
    b += ps_bounce(f, fc.stride);
    s.src = reinterpret_cast<Src *>(b);
    return s;
}

uint32_t vgroups_halves(const StoreFormat &f) { return 2 * f.v_groups; }

// The deferred K (or V) row of a pool's slot (FmtPlan::dk/dv; the pool's data region starts at kq).
float *defer_row(const FmtCache &fc, const FmtPool &p, bool v, uint32_t slot) {
    char *data = reinterpret_cast<char *>(p.kq) - fc.fp.kq;
    return reinterpret_cast<float *>(data + (v ? fc.fp.dv : fc.fp.dk)) + size_t(slot) * fc.stride;
}
const FmtPool &pool_of_store(const FmtCache &fc, const FmtStore &fs) {
    return fc.fpools[size_t(&fs - fc.stores) % fc.n_kv_heads];
}

// The first pinned token and the first body virtual slot of the current call's staged tokens
// (nw; the store's ends when none): the tokens before them were in the store before the call.
uint32_t first_new_pinned(const HeadStore &hs, const StagedNew &nw) { return nw.n && nw.L0 < hs.npin ? nw.L0 : hs.npin; }
uint32_t first_new_body(const HeadStore &hs, const StagedNew &nw) {
    const uint32_t vend = hs.roff + hs.count;
    return nw.n ? vend - (hs.len() - (nw.L0 > hs.npin ? nw.L0 : hs.npin)) : vend;
}

void gather(const float *full, const uint16_t *idx, bool thin, uint32_t w, float *out) {
    if (thin) {
        for (uint32_t c = 0; c < w; ++c) out[c] = full[idx[c]];
    } else {
        memcpy(out, full, size_t(w) * sizeof(float));
    }
}

uint8_t *k_row(const FmtPool &p, const StoreFormat &f, uint32_t slot) { return p.kq + size_t(slot) * f.k_row; }
uint8_t *v_row(const FmtPool &p, const StoreFormat &f, uint32_t slot) { return p.vq + size_t(slot) * f.v_row; }
uint16_t *v_sz(const FmtPool &p, const StoreFormat &f, uint32_t slot) {
    return p.vsz + size_t(slot) * vgroups_halves(f);
}

// Writes the tokens src[0..m) of physical block `bid` in the stored format: converted sources
// are copied (and their keys re-encoded on the block's new grid for q formats), full-precision
// ones gathered to the kept channels and encoded. Every source is read before anything of
// the block is written (sources lie in this block or later ones; targets ascend).
void rebuild(const FmtCache &fc, const BlockPool &bp, const FmtStore &fs, uint32_t bid, const Src *src, uint32_t m) {
    if (m == 0) return;
    const StoreFormat &f = fc.f;
    const PoolScratch ps = pool_scratch(fc, bp);
    const FmtPool &pool = fmt_pool(fc, bp);
    const uint32_t block = bp.block;
    if (f.quant()) {
        for (uint32_t i = 0; i < m; ++i) {
            float *kb = ps.kbuf + size_t(i) * f.wkp;
            if (src[i].kf) {
                gather(src[i].kf, fs.kidx, f.thin_k, f.wk, kb);
                for (uint32_t c = f.wk; c < f.wkp; ++c) kb[c] = 0.0f;
            } else {
                const uint32_t sb = src[i].from / block;
                fmt_k_decode(f, k_row(pool, f, src[i].from), pool.kge + size_t(sb) * f.wkp, pool.kgz + size_t(sb) * f.wkp,
                             kb);
            }
        }
        int8_t *ge = pool.kge + size_t(bid) * f.wkp;
        int16_t *gz = pool.kgz + size_t(bid) * f.wkp;
        fmt_k_grid(f, ps.kbuf, f.wkp, m, ge, gz);
        for (uint32_t i = 0; i < m; ++i) fmt_k_encode(f, ps.kbuf + size_t(i) * f.wkp, ge, gz, k_row(pool, f, src[i].slot));
    } else {
        for (uint32_t i = 0; i < m; ++i) {
            if (src[i].kf) {
                gather(src[i].kf, fs.kidx, f.thin_k, f.wk, ps.kbuf);
                fmt_k_encode(f, ps.kbuf, nullptr, nullptr, k_row(pool, f, src[i].slot));
            } else if (src[i].from != src[i].slot) {
                memmove(k_row(pool, f, src[i].slot), k_row(pool, f, src[i].from), f.k_row);
            }
        }
    }
    for (uint32_t i = 0; i < m; ++i) {
        if (src[i].vf) {
            gather(src[i].vf, fs.vidx, f.thin_v, f.wv, ps.vtmp);
            fmt_v_encode(f, ps.vtmp, v_row(pool, f, src[i].slot), v_sz(pool, f, src[i].slot));
        } else if (src[i].from != src[i].slot) {
            memmove(v_row(pool, f, src[i].slot), v_row(pool, f, src[i].from), f.v_row);
            if (f.v_groups)
                memmove(v_sz(pool, f, src[i].slot), v_sz(pool, f, src[i].from), vgroups_halves(f) * sizeof(uint16_t));
        }
    }
}

// Slot of body token i (virtual slot roff + i).
uint32_t body_slot(const HeadStore &hs, uint32_t block, uint32_t i) {
    const uint32_t v = hs.roff + i;
    return hs.blk[(hs.bhead + v / block) % hs.blk_cap] * block + v % block;
}

// Appends runs for the stretch slots slot..slot+n-1 = logical j..j+n-1 (one source), merging
// with the previous run when physically, rotationally and source-continuous.
struct RunSink {
    Run *out;
    uint32_t nr = 0;
    void span(const BlockPool &pool, bool scan, int64_t base, uint32_t slot, uint32_t n, uint32_t j, uint32_t src) {
        uint32_t i = 0;
        while (i < n) {
            int64_t d = base;
            uint32_t m = n - i;
            if (scan) {
                d = int64_t(pool.rot[slot + i]) - int64_t(j + i);
                m = 1;
                while (i + m < n && int64_t(pool.rot[slot + i + m]) - int64_t(j + i + m) == d) ++m;
            }
            Run *p = nr ? &out[nr - 1] : nullptr;
            if (p && p->src == src && p->slot + p->n == slot + i && p->delta == d) p->n += m;
            else out[nr++] = Run{slot + i, m, j + i, src, d};
            i += m;
        }
    }
};

}  // namespace

// ---- plan and init --------------------------------------------------------------------------

bool fmt_plan(const kvp_config &cfg, uint32_t stride, uint32_t block, uint32_t nblocks, uint32_t max_cap,
              uint32_t max_pin, uint32_t tile_rows, uint32_t stage, FmtPlan *fp) {
    memset(fp, 0, sizeof *fp);
    if (!store_formatted(cfg)) return true;
    fp->on = true;
    store_format(cfg, &fp->f);
    const StoreFormat &f = fp->f;
    Sz z;
    const size_t slots = z.mul(nblocks, block);
    fp->pin_side = max_pin < block ? max_pin : block;
    fp->side_rows = fp->pin_side + block;
    // pool data
    fp->kq = 0;
    fp->vq = z.al(z.mul(slots, f.k_row));
    fp->vsz = z.add(fp->vq, z.al(z.mul(slots, f.v_row)));
    fp->kge = z.add(fp->vsz, z.al(z.mul(z.mul(slots, f.v_groups), 2 * sizeof(uint16_t))));
    const bool grids = f.quant();
    fp->kgz = z.add(fp->kge, grids ? z.al(z.mul(nblocks, f.wkp)) : 0);
    fp->pscr = z.add(fp->kgz, grids ? z.al(z.mul(z.mul(nblocks, f.wkp), sizeof(int16_t))) : 0);
    fp->sk = z.add(fp->pscr, z.al(pool_scratch_bytes(f, stride)));
    fp->stage = stage;
    const size_t stage_rows = z.al(z.mul(z.mul(stage, stride), sizeof(float)));
    fp->sv = z.add(fp->sk, stage_rows);
    // ThinK under max_prompt: f32 K and V rows for every slot, where blocks wait for the channels
    // to be chosen at the prompt's end (see the header)
    const size_t defer_rows = (f.thin_k || f.thin_v) && prompt_used(cfg) ? z.al(z.mul(z.mul(slots, stride), sizeof(float))) : 0;
    fp->dk = z.add(fp->sv, stage_rows);
    fp->dv = z.add(fp->dk, defer_rows);
    fp->end = z.add(fp->dv, defer_rows);
    // cache-wide
    const size_t stores = size_t(cfg.model.n_layers) * cfg.model.n_kv_heads;
    fp->o_stores = z.al(sizeof(FmtCache));
    fp->o_pools = z.add(fp->o_stores, z.al(z.mul(sizeof(FmtStore), stores)));
    fp->o_side = z.add(fp->o_pools, z.al(z.mul(sizeof(FmtPool), cfg.model.n_kv_heads)));
    const size_t side_floats = z.mul(z.mul(2, fp->side_rows), stride);
    fp->o_kidx = z.add(fp->o_side, z.al(z.mul(z.mul(side_floats, sizeof(float)), stores)));
    const bool lists = f.thin_k || f.thin_v;
    fp->o_vidx = z.add(fp->o_kidx, lists ? z.al(z.mul(z.mul(f.wk, sizeof(uint16_t)), stores)) : 0);
    fp->bytes = z.add(fp->o_vidx, lists ? z.al(z.mul(z.mul(f.wv, sizeof(uint16_t)), stores)) : 0);
    // thread scratch
    const uint32_t G = cfg.model.n_q_heads / cfg.model.n_kv_heads;
    fp->s_stage = 0;
    fp->s_qg = z.al(z.mul(z.mul(max_cap, stride), sizeof(float)));
    fp->s_qs = z.add(fp->s_qg, z.al(z.mul(z.mul(tile_rows, f.wkp), sizeof(float))));
    fp->s_bias = z.add(fp->s_qs, z.al(z.mul(z.mul(tile_rows, f.wkp), sizeof(float))));
    fp->s_oacc = z.add(fp->s_bias, z.al(z.mul(tile_rows, sizeof(float))));
    fp->s_zacc = z.add(fp->s_oacc, z.al(z.mul(z.mul(tile_rows, f.wvp), sizeof(float))));
    fp->s_qi = z.add(fp->s_zacc, z.al(z.mul(z.mul(tile_rows, f.v_groups), sizeof(float))));
    fp->s_qsc = z.add(fp->s_qi, z.al(z.mul(tile_rows, f.wkp)));
    fp->s_think = z.add(fp->s_qsc, z.al(z.mul(tile_rows, sizeof(float))));
    size_t think = 0;
    if (lists) {
        fp->obs_rows = cfg.obs_window < max_cap ? cfg.obs_window : max_cap;
        think = think_scratch_bytes(cfg, stride, fp->obs_rows, G);
    }
    fp->scr_bytes = z.add(fp->s_think, z.al(think));
    return z.ok;
}

FmtCache *fmt_init_cache(const kvp_config &cfg, const FmtPlan &fp, char *base, const HeadStore *heads,
                         const BlockPool *pools) {
    FmtCache *fc = reinterpret_cast<FmtCache *>(base);
    memset(fc, 0, sizeof *fc);
    fc->f = fp.f;
    fc->fp = fp;
    fc->q = kern::attn_q_best();
    fc->stride = uint32_t(align_up(cfg.model.head_dim, kAlign / sizeof(float)));
    fc->pin_side = fp.pin_side;
    fc->side_rows = fp.side_rows;
    fc->n_kv_heads = cfg.model.n_kv_heads;
    fc->stores = reinterpret_cast<FmtStore *>(base + fp.o_stores);
    fc->heads = heads;
    fc->fpools = reinterpret_cast<FmtPool *>(base + fp.o_pools);
    fc->pools = pools;
    const size_t stores = size_t(cfg.model.n_layers) * cfg.model.n_kv_heads;
    const size_t side_floats = size_t(2) * fp.side_rows * fc->stride;
    for (size_t s = 0; s < stores; ++s) {
        FmtStore &st = fc->stores[s];
        memset(&st, 0, sizeof st);
        st.side_k = reinterpret_cast<float *>(base + fp.o_side) + s * side_floats;
        st.side_v = st.side_k + size_t(fp.side_rows) * fc->stride;
        if (fp.f.thin_k || fp.f.thin_v) {
            st.kidx = reinterpret_cast<uint16_t *>(base + fp.o_kidx) + s * fp.f.wk;
            st.vidx = reinterpret_cast<uint16_t *>(base + fp.o_vidx) + s * fp.f.wv;
        }
        fmt_reset_store(st, fp.f);
    }
    return fc;
}

void fmt_init_pool(FmtCache *fc, char *data, BlockPool *pool) {
    const FmtPlan &fp = fc->fp;
    pool->fc = fc;
    pool->k = pool->v = nullptr;
    FmtPool &p = fc->fpools[pool - fc->pools];
    p.kq = reinterpret_cast<uint8_t *>(data + fp.kq);
    p.vq = reinterpret_cast<uint8_t *>(data + fp.vq);
    p.vsz = reinterpret_cast<uint16_t *>(data + fp.vsz);
    p.kge = reinterpret_cast<int8_t *>(data + fp.kge);
    p.kgz = reinterpret_cast<int16_t *>(data + fp.kgz);
    p.pscr = data + fp.pscr;
    p.sk = fp.stage ? reinterpret_cast<float *>(data + fp.sk) : nullptr;
    p.sv = fp.stage ? reinterpret_cast<float *>(data + fp.sv) : nullptr;
}

void fmt_reset_store(FmtStore &fs, const StoreFormat &f) {
    fs.selected = 0;  // the channel lists are only read once selected; identity until then
    if (fs.kidx)
        for (uint32_t c = 0; c < f.wk; ++c) fs.kidx[c] = uint16_t(c);
    if (fs.vidx)
        for (uint32_t c = 0; c < f.wv; ++c) fs.vidx[c] = uint16_t(c);
    fs.pconv = 0;
    fs.bytes_after_append = 0;
}

// ---- tokens and runs ------------------------------------------------------------------------

void fmt_new_rows(const kvp_cache *c, HeadStore &hs, uint32_t slot, bool pinned, float *stage_row, float **kr,
                  float **vr) {
    if (stage_row) {
        *kr = stage_row;
        *vr = nullptr;
        return;
    }
    const FmtCache &fc = *c->fmt;
    const uint32_t block = fc.f.block;
    const uint32_t row = pinned ? hs.npin % block : fc.pin_side + slot % block;
    *kr = fmt_store(fc, hs).side_k + size_t(row) * fc.stride;
    *vr = fmt_store(fc, hs).side_v + size_t(row) * fc.stride;
}

uint32_t fmt_runs(const kvp_cache *c, const HeadStore &hs, const BlockPool &pool, bool realign, const StagedNew &nw,
                  Run *out) {
    const FmtCache &fc = *c->fmt;
    const FmtStore &fs = fmt_store(fc, hs);
    const uint32_t block = pool.block;
    const bool scan = realign && hs.scattered;
    const uint32_t L0 = nw.n ? nw.L0 : UINT32_MAX;
    RunSink sink{out};
    // A live stretch of one block; residual tokens from L0 on are this call's staged ones.
    auto emit = [&](uint32_t s0, uint32_t n, uint32_t j, int64_t base, uint32_t src) {
        if (src == kSrcPool || j + n <= L0) {
            sink.span(pool, scan, base, s0, n, j, src);
            return;
        }
        const uint32_t i = j < L0 ? L0 - j : 0;
        if (i) sink.span(pool, scan, base, s0, i, j, src);
        sink.span(pool, scan, base, s0 + i, n - i, j + i, kSrcStaged);
    };
    // pinned: [0, pconv) converted, the rest residual (deferred: the blocks complete before this call)
    const uint32_t pdef = hs.deferred ? first_new_pinned(hs, nw) / block * block : 0;
    for (uint32_t p0 = 0; p0 < hs.npin; p0 += block) {
        const uint32_t n = hs.npin - p0 < block ? hs.npin - p0 : block, s0 = hs.pin_blk[p0 / block] * block;
        const uint32_t nc = fs.pconv > p0 ? (fs.pconv - p0 < n ? fs.pconv - p0 : n) : 0;
        if (nc) emit(s0, nc, p0, 0, kSrcPool);
        if (nc < n) emit(s0 + nc, n - nc, p0 + nc, 0, p0 + block <= pdef ? kSrcDeferred : kSrcPinSide);
    }
    // body: virtual slots below vres converted, the rest residual (deferred: as the pinned)
    const uint32_t vend = hs.roff + hs.count, vres = vend - hs.nres;
    const uint32_t vdef = hs.deferred ? first_new_body(hs, nw) / block * block : 0;
    const int64_t base = realign ? hs.shift : 0;
    uint32_t j = hs.npin;
    for (uint32_t b = 0; b * block < vend; ++b) {
        const uint32_t vb = b * block > hs.roff ? b * block : hs.roff, ve = (b + 1) * block < vend ? (b + 1) * block : vend;
        if (vb >= ve) continue;
        const uint32_t bid = hs.blk[(hs.bhead + b) % hs.blk_cap];
        if (pool.dead[bid] == 0) {
            const uint32_t vc = vres < vb ? vb : vres > ve ? ve : vres;  // split at the residual start
            const uint32_t side = (b + 1) * block <= vdef ? kSrcDeferred : kSrcBodySide;
            if (vc > vb) emit(bid * block + vb % block, vc - vb, j, base, kSrcPool);
            if (ve > vc) emit(bid * block + vc % block, ve - vc, j + (vc - vb), base, side);
            j += ve - vb;
        } else {
            uint32_t v = vb;
            while (v < ve) {
                while (v < ve && pool.pos[bid * block + v % block] == kDeadSlot) ++v;
                uint32_t e = v;
                const bool conv = v < vres;
                while (e < ve && pool.pos[bid * block + e % block] != kDeadSlot && (e < vres) == conv) ++e;
                if (e > v) {
                    emit(bid * block + v % block, e - v, j, base,
                         conv ? kSrcPool : (b + 1) * block <= vdef ? kSrcDeferred : kSrcBodySide);
                    j += e - v;
                }
                v = e;
            }
        }
    }
    return sink.nr;
}

void fmt_run_rows(const FmtCache &fc, const FmtStore &fs, const StagedNew &nw, const Run &run, uint32_t j,
                  const float **k, const float **v, size_t *ld) {
    const uint32_t block = fc.f.block;
    const uint32_t slot = run.slot + (j - run.logical);
    size_t row;
    switch (run.src) {
        case kSrcStaged:
            *k = nw.k + size_t(j - nw.L0) * nw.ldk;
            *v = nw.v + size_t(j - nw.L0) * nw.ldv;
            ld[0] = nw.ldk;
            ld[1] = nw.ldv;
            return;
        case kSrcDeferred: {
            const FmtPool &p = pool_of_store(fc, fs);
            *k = defer_row(fc, p, false, slot);
            *v = defer_row(fc, p, true, slot);
            ld[0] = ld[1] = fc.stride;
            return;
        }
        case kSrcPinSide: row = slot % block; break;
        default: row = fc.pin_side + slot % block; break;
    }
    *k = fs.side_k + row * fc.stride;
    *v = fs.side_v + row * fc.stride;
    ld[0] = ld[1] = fc.stride;
}

// ---- conversion -----------------------------------------------------------------------------

namespace {

// A chunk of an open prompt into a ThinK store without channels (see the header): the blocks that
// completed in this call go to the deferred rows (their older tokens from the side rows, the
// call's from the staging rows), the call's tokens of incomplete blocks to the side rows.
void defer_blocks(const FmtCache &fc, HeadStore &hs, const BlockPool &pool, const StagedNew &nw) {
    const StoreFormat &f = fc.f;
    const FmtStore &fs = fmt_store(fc, hs);
    const FmtPool &fpo = fmt_pool(fc, pool);
    const uint32_t block = pool.block, st = fc.stride, L = hs.len();
    const size_t bytes = size_t(f.d) * sizeof(float);
    auto put = [&](uint32_t slot, const float *k, const float *v) {
        memcpy(defer_row(fc, fpo, false, slot), k, bytes);
        memcpy(defer_row(fc, fpo, true, slot), v, bytes);
    };
    const uint32_t pin_full = hs.npin / block * block, pnew = first_new_pinned(hs, nw);
    bool any = false;
    for (uint32_t p = pnew / block * block; p < pin_full; ++p) {
        const uint32_t slot = hs.pin_blk[p / block] * block + p % block;
        if (nw.n && p >= nw.L0) put(slot, nw.k + size_t(p - nw.L0) * nw.ldk, nw.v + size_t(p - nw.L0) * nw.ldv);
        else put(slot, fs.side_k + size_t(p % block) * st, fs.side_v + size_t(p % block) * st);
        any = true;
    }
    const uint32_t vend = hs.roff + hs.count, vfull = vend / block * block, vnew = first_new_body(hs, nw);
    const uint32_t vres = vend - hs.nres;
    for (uint32_t v = vnew / block * block; v < vfull; ++v) {
        if (v < hs.roff || v < vres) continue;  // evicted from the front, or converted
        const uint32_t slot = hs.blk[(hs.bhead + v / block) % hs.blk_cap] * block + v % block;
        any = true;
        if (pool.pos[slot] == kDeadSlot) continue;
        if (v >= vnew) {
            const size_t i = L - (vend - v) - nw.L0;
            put(slot, nw.k + i * nw.ldk, nw.v + i * nw.ldv);
        } else {
            const size_t row = fc.pin_side + v % block;
            put(slot, fs.side_k + row * st, fs.side_v + row * st);
        }
    }
    if (any) hs.deferred = 1;
    if (!nw.n) return;
    for (uint32_t p = nw.L0 > pin_full ? nw.L0 : pin_full; p < hs.npin; ++p) {
        const size_t i = p - nw.L0, row = p % block;
        memcpy(fs.side_k + row * st, nw.k + i * nw.ldk, bytes);
        memcpy(fs.side_v + row * st, nw.v + i * nw.ldv, bytes);
    }
    for (uint32_t v = vnew > vfull ? vnew : vfull; v < vend; ++v) {
        const size_t i = L - (vend - v) - nw.L0, row = fc.pin_side + v % block;
        memcpy(fs.side_k + row * st, nw.k + i * nw.ldk, bytes);
        memcpy(fs.side_v + row * st, nw.v + i * nw.ldv, bytes);
    }
}

}  // namespace

void fmt_convert(kvp_cache *c, HeadStore &hs, BlockPool &pool, const StagedNew &nw, const StepObs &obs) {
    const FmtCache &fc = *c->fmt;
    const StoreFormat &f = fc.f;
    FmtStore &fs = fmt_store(fc, hs);
    const uint32_t block = pool.block, st = fc.stride;
    const uint32_t L = hs.len();
    const uint32_t pin_full = hs.npin / block * block;
    const uint32_t vend = hs.roff + hs.count, vres = vend - hs.nres, vfull = vend / block * block;
    const bool pin_work = pin_full > fs.pconv, body_work = vfull > vres;
    if (obs.prompt && (f.thin_k || f.thin_v) && !fs.selected && fc.fp.dv > fc.fp.dk) {
        defer_blocks(fc, hs, pool, nw);
        return;
    }
    if ((pin_work || body_work) && (f.thin_k || f.thin_v) && !fs.selected) think_select(c, hs, pool, nw, obs);

    // Full-precision rows of a residual token: staged token i, or side row `row`.
    auto full = [&](bool staged, size_t i, uint32_t row, Src *x) {
        if (staged) {
            x->kf = nw.k + i * nw.ldk;
            x->vf = nw.v + i * nw.ldv;
        } else {
            x->kf = fs.side_k + size_t(row) * st;
            x->vf = fs.side_v + size_t(row) * st;
        }
    };
    // A deferred store's blocks complete before this call are in the deferred rows (the header).
    const FmtPool &fpo = fmt_pool(fc, pool);
    auto deferred = [&](uint32_t slot, Src *x) {
        x->kf = defer_row(fc, fpo, false, slot);
        x->vf = defer_row(fc, fpo, true, slot);
    };
    const uint32_t pdef = hs.deferred ? first_new_pinned(hs, nw) / block * block : 0;
    const uint32_t vdef = hs.deferred ? first_new_body(hs, nw) / block * block : 0;
    Src *s = pool_scratch(fc, pool).src;

    // pinned blocks that completed (every pinned token is live; all of such a block are residual)
    for (uint32_t p0 = fs.pconv; p0 < pin_full; p0 += block) {
        const uint32_t bid = hs.pin_blk[p0 / block];
        for (uint32_t i = 0; i < block; ++i) {
            s[i].slot = s[i].from = bid * block + i;
            if (p0 + block <= pdef) deferred(s[i].slot, &s[i]);
            else full(nw.n && p0 + i >= nw.L0, p0 + i - nw.L0, i, &s[i]);
        }
        rebuild(fc, pool, fs, bid, s, block);
    }
    if (pin_work) fs.pconv = pin_full;

    // Body blocks that completed, from the block of the residual start. Staged body tokens are
    // the last (L - max(L0, npin)) slots (appended this call, none dead): the token at virtual
    // slot v >= vstaged is staged token L - (vend - v) - L0.
    const uint32_t nstaged_body = nw.n ? L - (nw.L0 > hs.npin ? nw.L0 : hs.npin) : 0;
    const uint32_t vstaged = vend - nstaged_body;
    for (uint32_t vb = vres / block * block; vb < vfull; vb += block) {
        const uint32_t bid = hs.blk[(hs.bhead + vb / block) % hs.blk_cap];
        uint32_t m = 0;
        for (uint32_t v = vb > hs.roff ? vb : hs.roff; v < vb + block; ++v) {
            const uint32_t slot = bid * block + v % block;
            if (pool.pos[slot] == kDeadSlot) {
                // Evicted while residual: it gets no converted rows. Zeros, not what the block's
                // bytes held before (arena bytes or an older token), so that a saved state
                // (which writes the block's slots, live and dead) depends only on the calls.
                memset(k_row(fpo, f, slot), 0, f.k_row);
                memset(v_row(fpo, f, slot), 0, f.v_row);
                if (f.v_groups) memset(v_sz(fpo, f, slot), 0, vgroups_halves(f) * sizeof(uint16_t));
                continue;
            }
            s[m].slot = s[m].from = slot;
            s[m].kf = s[m].vf = nullptr;
            if (v >= vres && vb + block <= vdef) deferred(slot, &s[m]);
            else if (v >= vres) full(v >= vstaged, size_t(L - (vend - v)) - nw.L0, fc.pin_side + v % block, &s[m]);
            ++m;
        }
        rebuild(fc, pool, fs, bid, s, m);
    }
    if (body_work) hs.nres = vend - vfull;

    // staged tokens still residual: to their side rows
    if (nw.n) {
        for (uint32_t p = fs.pconv > nw.L0 ? fs.pconv : nw.L0; p < hs.npin; ++p) {
            const size_t i = p - nw.L0, row = p % block;
            memcpy(fs.side_k + row * st, nw.k + i * nw.ldk, size_t(f.d) * sizeof(float));
            memcpy(fs.side_v + row * st, nw.v + i * nw.ldv, size_t(f.d) * sizeof(float));
        }
        const uint32_t vr = vend - hs.nres;
        for (uint32_t v = vr > vstaged ? vr : vstaged; v < vend; ++v) {
            const size_t i = L - (vend - v) - nw.L0, row = fc.pin_side + v % block;
            memcpy(fs.side_k + row * st, nw.k + i * nw.ldk, size_t(f.d) * sizeof(float));
            memcpy(fs.side_v + row * st, nw.v + i * nw.ldv, size_t(f.d) * sizeof(float));
        }
    }
}

void fmt_prompt_finish(kvp_cache *c, HeadStore &hs, BlockPool &pool, const StepObs &obs) {
    if (!hs.deferred) return;
    StepObs o = obs;
    o.prompt = false;
    fmt_convert(c, hs, pool, StagedNew{}, o);  // chooses the channels, converts every complete block
    hs.deferred = 0;
}

// ---- compaction -----------------------------------------------------------------------------

void fmt_compact(HeadStore &hs, BlockPool &pool) {
    const FmtCache &fc = *pool.fc;
    const StoreFormat &f = fc.f;
    FmtStore &fs = fmt_store(fc, hs);
    const uint32_t block = pool.block, st = fc.stride;
    const uint32_t ires = hs.count - hs.nres;  // body index where the residual starts
    const PoolScratch ps = pool_scratch(fc, pool);
    uint32_t w0 = hs.first_hole;  // a lower bound (storage.h)
    while (pool.pos[body_slot(hs, block, w0)] != kDeadSlot) ++w0;  // the first dead slot (there is one)
    // Rebuild from the block of the first dead slot; the residual lies in the last block, so
    // i0 <= ires. The residual survivors' side rows go to the bounce rows first.
    const uint32_t vstart = (hs.roff + w0) / block * block;
    const uint32_t i0 = vstart > hs.roff ? vstart - hs.roff : 0;
    uint32_t nbounce = 0;
    for (uint32_t i = ires; i < hs.count; ++i) {
        const uint32_t v = hs.roff + i;
        if (pool.pos[body_slot(hs, block, i)] == kDeadSlot) continue;
        const size_t row = fc.pin_side + v % block;
        memcpy(ps.bk + size_t(nbounce) * st, fs.side_k + row * st, size_t(f.d) * sizeof(float));
        memcpy(ps.bv + size_t(nbounce) * st, fs.side_v + row * st, size_t(f.d) * sizeof(float));
        ++nbounce;
    }
    const bool can_convert = !(f.thin_k || f.thin_v) || fs.selected;
    Src *s = ps.src;
    uint32_t m = 0, nconv = 0, w = i0, bi = 0;
    // Writes the target block of body index w-1 (m tokens, the first nconv converted sources).
    auto flush = [&](bool complete) {
        if (m == 0) return;
        const uint32_t bid = hs.blk[(hs.bhead + (hs.roff + w - 1) / block) % hs.blk_cap];
        if (complete && can_convert) {
            rebuild(fc, pool, fs, bid, s, m);  // residual sources of a completed block convert
            hs.nres = 0;
        } else {
            rebuild(fc, pool, fs, bid, s, nconv);
            for (uint32_t i = nconv; i < m; ++i) {  // still residual: side rows at the new offsets
                const size_t row = fc.pin_side + s[i].slot % block;
                memcpy(fs.side_k + row * st, s[i].kf, size_t(f.d) * sizeof(float));
                memcpy(fs.side_v + row * st, s[i].vf, size_t(f.d) * sizeof(float));
            }
            hs.nres = m - nconv;
        }
        m = nconv = 0;
    };
    hs.nres = 0;
    for (uint32_t r = i0; r < hs.count; ++r) {
        const uint32_t from = body_slot(hs, block, r);
        if (pool.pos[from] == kDeadSlot) continue;
        const uint32_t to = body_slot(hs, block, w++);
        pool.pos[to] = pool.pos[from];
        pool.rot[to] = pool.rot[from];
        pool.score[to] = pool.score[from];
        if (pool.kq && to != from) {  // score=fixed's int16 key copy
            memcpy(pool.kq_row(to), pool.kq_row(from), size_t(pool.kq_stride) * sizeof(int16_t));
            pool.kexp[to] = pool.kexp[from];
        }
        s[m].slot = to;
        s[m].from = from;
        s[m].kf = s[m].vf = nullptr;
        if (r >= ires) {
            s[m].kf = ps.bk + size_t(bi) * st;
            s[m].vf = ps.bv + size_t(bi) * st;
            ++bi;
        } else {
            ++nconv;
        }
        ++m;
        if ((hs.roff + w) % block == 0) flush(true);
    }
    flush(false);
    hs.count = w;
    hs.holes = 0;
    for (uint32_t b = (hs.roff + i0) / block; b < hs.nb; ++b) pool.dead[hs.blk[(hs.bhead + b) % hs.blk_cap]] = 0;
}

// ---- live bytes and reading back ------------------------------------------------------------

uint64_t fmt_store_bytes(const kvp_cache *c, const HeadStore &hs, const BlockPool &pool) {
    const FmtCache &fc = *c->fmt;
    const StoreFormat &f = fc.f;
    const uint32_t block = pool.block;
    const FmtStore &fs = fmt_store(fc, hs);
    uint64_t conv = fs.pconv, grids = (fs.pconv + block - 1) / block, resid = hs.npin - fs.pconv;
    const uint32_t vend = hs.roff + hs.count, vres = vend - hs.nres;
    for (uint32_t b = 0; b * block < vend; ++b) {
        const uint32_t vb = b * block > hs.roff ? b * block : hs.roff, ve = (b + 1) * block < vend ? (b + 1) * block : vend;
        if (vb >= ve) continue;
        const uint32_t bid = hs.blk[(hs.bhead + b) % hs.blk_cap];
        uint32_t nc = 0, nr = 0;
        if (pool.dead[bid] == 0) {
            const uint32_t vc = vres < vb ? vb : vres > ve ? ve : vres;
            nc = vc - vb;
            nr = ve - vc;
        } else {
            for (uint32_t v = vb; v < ve; ++v) {
                if (pool.pos[bid * block + v % block] == kDeadSlot) continue;
                if (v < vres) ++nc;
                else ++nr;
            }
        }
        conv += nc;
        resid += nr;
        if (nc) ++grids;
    }
    return conv * fmt_token_bytes(f) + grids * fmt_grid_bytes(f) + resid * fmt_residual_bytes(f) +
           (fs.selected ? fmt_index_bytes(f) : 0);
}

bool fmt_read_token(const kvp_cache *c, uint32_t layer, uint32_t head, uint32_t j, float *k, float *v, int64_t *rot,
                    float *kstep) {
    if (!c->fmt || layer >= c->cfg.model.n_layers || head >= c->cfg.model.n_kv_heads) return false;
    const HeadStore &hs = head_of(c, layer, head);
    const BlockPool &pool = c->pools[head];
    const FmtCache &fc = *c->fmt;
    const StoreFormat &f = fc.f;
    const FmtStore &fs = fmt_store(fc, hs);
    const uint32_t block = pool.block;
    if (j >= hs.len()) return false;
    uint32_t slot = 0, side = 0;
    bool conv, dfr;
    if (j < hs.npin) {
        slot = hs.pin_blk[j / block] * block + j % block;
        conv = j < fs.pconv;
        side = j % block;
        dfr = hs.deferred && j < hs.npin / block * block;
    } else {
        uint32_t live = hs.npin, i = 0;
        for (;; ++i) {
            slot = body_slot(hs, block, i);
            if (pool.pos[slot] == kDeadSlot) continue;
            if (live++ == j) break;
        }
        conv = i < hs.count - hs.nres;
        side = fc.pin_side + (hs.roff + i) % block;
        dfr = hs.deferred && hs.roff + i < (hs.roff + hs.count) / block * block;
    }
    *rot = pool.rot[slot];
    if (kstep)
        for (uint32_t ch = 0; ch < f.d; ++ch) kstep[ch] = 0.0f;
    if (!conv) {
        const FmtPool &p = fmt_pool(fc, pool);
        memcpy(k, dfr ? defer_row(fc, p, false, slot) : fs.side_k + size_t(side) * fc.stride, size_t(f.d) * sizeof(float));
        memcpy(v, dfr ? defer_row(fc, p, true, slot) : fs.side_v + size_t(side) * fc.stride, size_t(f.d) * sizeof(float));
        return true;
    }
    float kf[kMaxFmtDim], vf[kMaxFmtDim];
    const uint32_t b = slot / block;
    const FmtPool &fpo = fmt_pool(fc, pool);
    fmt_k_decode(f, fpo.kq + size_t(slot) * f.k_row, fpo.kge + size_t(b) * f.wkp, fpo.kgz + size_t(b) * f.wkp, kf);
    fmt_v_decode(f, fpo.vq + size_t(slot) * f.v_row, fpo.vsz + size_t(slot) * 2 * f.v_groups, vf);
    for (uint32_t ch = 0; ch < f.d; ++ch) k[ch] = v[ch] = 0.0f;
    for (uint32_t ch = 0; ch < f.wk; ++ch) k[f.thin_k ? fs.kidx[ch] : ch] = kf[ch];
    if (kstep && f.quant())
        for (uint32_t ch = 0; ch < f.wk; ++ch) kstep[f.thin_k ? fs.kidx[ch] : ch] = dyadic_step(fpo.kge[size_t(b) * f.wkp + ch]);
    for (uint32_t ch = 0; ch < f.wv; ++ch) v[f.thin_v ? fs.vidx[ch] : ch] = vf[ch];
    return true;
}

}  // namespace kvp
