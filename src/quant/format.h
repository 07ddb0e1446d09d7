// Storage formats of K/V rows other than plain f32 (DESIGN.md "Precision", "think"): f16, q8,
// q4 (kv_dtype) and/or ThinK channel pruning (reduced-width rows). A config with either is
// "formatted"; everything else keeps the plain f32 path bit for bit.
//
// Layout (docs/DECISIONS.md "Quantized storage and ThinK"):
//   * One pool block = one quantization group of `quant_group` tokens (config_block).
//   * Keys: per channel over the block's tokens (KIVI), on a dyadic grid: channel c of block b
//     stores step s = 2^e[c] and zero z = zi[c] * s (int8 e, int16 zi: 3 bytes per channel per
//     block); a key element is z + code * s, code in 0..levels (q8: 255, q4: 15). Nested dyadic
//     grids make repacking after evictions exact or coarsening only (format.cpp).
//   * Values: per token, one (scale, zero) pair of f16 per group of 32 channels (KIVI's value
//     groups); an element is z + code * s. A token's pairs are stored as G scales then G zeros
//     (G = v_groups), tokens contiguous.
//   * f16: IEEE half per element (round to nearest even), no grid.
//   * ThinK: a stored K row holds only the kept channels (wk, the head's kidx list, ascending);
//     a V row the kept value channels (wv, vidx). Queries are gathered to kidx before the dot
//     product; value contributions are scattered back through vidx.
//   * Rows are padded to a multiple of 8 channels (16 for q4): padding codes are 0 and the
//     gathered query is 0 there, so kernels run over whole chunks. Padding is arena, not live.
//   * q4 nibbles: a row is cut into chunks of 16 channels; chunk k is bytes 8k..8k+7, byte 8k+i
//     holding channel 16k+i in its low nibble and 16k+8+i in its high nibble (one 8-byte load, an
//     AND and a shift give the chunk's 16 codes in channel order).
//   * Saturation: f16/q8/q4 storage clamps K and V elements to the f16 range, +-65504.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kvprune/kvprune.h"

namespace kvp {

constexpr uint32_t kVGroup = 32;       // value channels per (scale, zero) pair
constexpr uint32_t kMaxFmtDim = 1024;  // head_dim limit (config.h kMaxHeadDim)
constexpr float kF16Max = 65504.0f;

struct StoreFormat {
    kvp_dtype dtype;
    uint32_t d;            // head_dim
    uint32_t wk, wv;       // stored key / value channels
    uint32_t wkp, wvp;     // padded widths
    bool thin_k, thin_v;   // ThinK prunes key / value channels
    uint32_t k_row, v_row; // bytes of one stored K / V row
    uint32_t v_groups;     // q8/q4: (scale, zero) pairs per value row; else 0
    uint32_t block;        // tokens per block (= quantization group)
    uint32_t levels;       // q8: 255, q4: 15, else 0
    uint32_t rot_units;    // ThinK: RoPE pairs (pruned as units); channels past 2*rot_units are single units
    uint32_t prune_pairs;  // ThinK: RoPE pairs pruned per head
    uint32_t prune_singles;// ThinK: non-rotary key channels pruned per head
    uint32_t prune_v;      // ThinK: value channels pruned per head
    bool quant() const { return levels != 0; }
};

// Whether the config stores K/V in a format other than plain f32 (kv_dtype != f32, or
// policy=think with a ratio that prunes at least one channel).
bool store_formatted(const kvp_config &cfg);
// Whether ThinK prunes key or value channels (policy=think with a ratio that prunes one).
bool store_thin(const kvp_config &cfg);
// The format of a formatted config (valid config).
void store_format(const kvp_config &cfg, StoreFormat *f);

// ---- live bytes (DESIGN.md kvp_stats: storage format, scales and index lists, no padding) ----
uint64_t fmt_token_bytes(const StoreFormat &f);     // one converted token: K + V data + V scales
inline uint64_t fmt_grid_bytes(const StoreFormat &f) { return f.quant() ? uint64_t(f.wk) * 3 : 0; }
inline uint64_t fmt_residual_bytes(const StoreFormat &f) { return uint64_t(f.d) * 8; }  // f32 K + V
inline uint64_t fmt_index_bytes(const StoreFormat &f) {
    return (uint64_t(f.thin_k ? f.wk : 0) + (f.thin_v ? f.wv : 0)) * sizeof(uint16_t);
}

// ---- element conversions (scalar; exact and the same on every platform) ----
uint16_t f16_from_f32(float x);              // round to nearest even, saturating at +-65504
float f32_from_f16(uint16_t h);
// Dyadic grid of one key channel over values in [mn, mx] (clamped to +-65504): the smallest
// e in [-126, 24] such that zi = floor(mn / 2^e) fits int16 and every value in range has a code
// <= levels. Values quantize to round((x - zi*2^e) / 2^e) (ties to even).
void dyadic_grid(float mn, float mx, uint32_t levels, int8_t *e, int16_t *zi);
uint32_t dyadic_code(float x, int8_t e, int16_t zi, uint32_t levels);
inline float dyadic_step(int8_t e) {  // 2^e, e in [-126, 127]
    const uint32_t bits = uint32_t(int32_t(e) + 127) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}
// One value group x[0..m) (m <= 32): f16 zero z (rounded down) and step s (rounded up) with
// z + levels*s >= max, codes round((x - z) / s); |x - (z + code*s)| <= s/2 (+ float rounding).
void vgroup_quant(const float *x, uint32_t m, uint32_t levels, uint8_t *codes, uint16_t *s, uint16_t *z);

// ---- rows ----
// q4 code of channel c in a row of wp (multiple of 16) channels, and its setter.
uint32_t q4_get(const uint8_t *row, uint32_t wp, uint32_t c);
void q4_set(uint8_t *row, uint32_t wp, uint32_t c, uint32_t code);

// A stored K row -> floats kf[0..wkp) (grid of its block for q formats, padding 0).
void fmt_k_decode(const StoreFormat &f, const uint8_t *row, const int8_t *ge, const int16_t *gz, float *kf);
// V row -> floats vf[0..wvp).
void fmt_v_decode(const StoreFormat &f, const uint8_t *row, const uint16_t *sz, float *vf);
// Writes a K row from kf[0..wk) (f32/f16: direct; q formats: on the block grid ge/gz).
void fmt_k_encode(const StoreFormat &f, const float *kf, const int8_t *ge, const int16_t *gz, uint8_t *row);
// Writes a V row (and its G scales then G zeros) from vf[0..wv).
void fmt_v_encode(const StoreFormat &f, const float *vf, uint8_t *row, uint16_t *sz);
// The dyadic grid of a block from the K rows kf[i*ld + 0..wk) of its n live tokens (q formats).
void fmt_k_grid(const StoreFormat &f, const float *kf, size_t ld, uint32_t n, int8_t *ge, int16_t *gz);

}  // namespace kvp
