#!/usr/bin/env python3
"""How much error integer attention weights would add to a q8/q4 value pass (issue 23, item 2).

An integer pv computes o[c] = sum_t w_t * code_tc with w_t = p_t * s_t (p_t = exp(l_t - max),
s_t the token's value scale) rounded to b-bit unsigned integers, one scale per `blk` tokens
(scale = the block's largest weight / (2^b - 1)); the float pv uses w_t as is. This prints the
largest error over the output channels in units of the values' range (255 steps of a q8 token),
the median over trials, for the weight widths the integer instructions take:

  7 bits  u8 x s8 into int32 (x86 VNNI vpdpbusd, AVX2 maddubs without saturation, NEON sdot)
  15 bits s16 x s16 into int32 (vpmaddwd / VNNI vpdpwssd)

per 256-token decode chunk (the split-K granule at head_dim 128) and per 32-token block (the
quantization group). Logits are N(0, sigma) with an optional attention sink (logit + sink at
token 0); codes uniform 0..255; value scales uniform 0.01..0.05. The first column is, in the same
units, the error that q8 storage itself puts on the output (values that the codes round to
nearest, a uniform +-1/2 step each, through float weights); q4's is 17 times larger (15 steps).

Needs numpy (Debian: python3-numpy). Deterministic (seeded); about 3 s.
Usage: python3 bench/pv_weight_error.py
"""
import numpy as np


def rel_error(rng, n, sigma, sink, bits, blk, trials):
    errs = []
    for _ in range(trials):
        logits = rng.normal(0.0, sigma, n)
        logits[0] += sink
        p = np.exp(logits - logits.max())
        s = rng.uniform(0.01, 0.05, n)
        codes = rng.integers(0, 256, (n, 64)).astype(np.float64)
        w = p * s
        exact = (w[:, None] * codes).sum(0) / p.sum()
        unit = 255.0 * s.mean()
        if bits == 0:  # q8 storage: the real values the codes stand for, through float weights
            real = codes + rng.uniform(-0.5, 0.5, codes.shape)
            errs.append(np.abs((w[:, None] * real).sum(0) / p.sum() - exact).max() / unit)
            continue
        q = np.empty_like(w)
        for b0 in range(0, n, blk):
            wb = w[b0:b0 + blk]
            step = wb.max() / (2 ** bits - 1)
            q[b0:b0 + blk] = np.round(wb / step) * step if step > 0 else 0.0
        approx = (q[:, None] * codes).sum(0) / p.sum()
        errs.append(np.abs(approx - exact).max() / unit)
    return float(np.median(errs))


def main():
    rng = np.random.default_rng(1)
    cols = ((0, 1), (7, 256), (7, 32), (15, 256), (15, 32))
    print("| N | logit sigma | sink | q8 storage | " + " | ".join("%d-bit / %d tokens" % c for c in cols[1:]) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for n in (4096, 32768):
        for sigma, sink in ((1.0, 0.0), (2.0, 0.0), (1.0, 8.0), (2.0, 12.0)):
            r = [rel_error(rng, n, sigma, sink, b, k, 5) for b, k in cols]
            print("| %d | %.0f | %.0f | " % (n, sigma, sink) + " | ".join("%.1e" % x for x in r) + " |")


if __name__ == "__main__":
    main()
