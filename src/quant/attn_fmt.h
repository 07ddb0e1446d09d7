// Attention over formatted stores (quant/store_fmt.h): the hooks attention.cpp calls when
// AttnIn::fx is set. Per run: full-precision rows (Run::fk) go through the fp32 kernels at full
// width; converted rows through the stored-format kernels (kernels/attn_q.h) with the query
// gathered to the head's kept key channels (and, for q8/q4, scaled by the block's key steps).
// Value contributions of converted rows accumulate at the kept value width in `oacc` (plus the
// per-group zero terms in `zacc`) and are added to the output channels once (fmt_pv_end), so
// results do not depend on how runs are split.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "quant/store_fmt.h"

namespace kvp {

struct AttnIn;

struct FmtIn {
    const FmtCache *fc;
    const FmtStore *fs;
    StagedNew nw;           // this call's staged tokens
    float *qg, *qs, *bias;  // [rows][wkp], [rows][wkp], [rows]
    float *oacc, *zacc;     // [rows][wvp], [rows][v_groups]
    int8_t *qi;             // q8/q4: [rows][wkp] int8 query (kern::AttnQ::prep8 / prep4)
    float *qsc;             // q4: [rows] its steps
};

// logits[r*ldl + (t - j0)] for logical keys t in [j0, j1) of run (q rows rotated for the run).
void fmt_qk(const AttnIn &a, const Run &run, uint32_t j0, uint32_t j1, const float *q, size_t ldq, uint32_t rows,
            float *logits, size_t ldl);
// Weights p[r*ldp + (t - j0)] times the values of keys [j0, j1): full-precision runs into
// o[r*ldo + 0..head_dim), converted ones into the accumulators.
void fmt_pv(const AttnIn &a, const Run &run, uint32_t j0, uint32_t j1, const float *p, size_t ldp, uint32_t rows,
            float *o, size_t ldo);
void fmt_pv_begin(const AttnIn &a, uint32_t rows);              // zero the accumulators
void fmt_pv_rescale(const AttnIn &a, uint32_t row, float alpha); // online softmax rescale of one row
void fmt_pv_end(const AttnIn &a, uint32_t rows, float *o, size_t ldo);  // o[r][vidx[c]] += acc

}  // namespace kvp
