"""Issue 21 item 3 through the Python binding: RoPE frequency tables and the attention factor."""
import array
import math
import os
import sys
import unittest

try:  # the installed package (pip install ./ports/python), else the source tree's
    import kvprune  # noqa: E402
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import kvprune  # noqa: E402
from kvprune import KvpError  # noqa: E402

HD, NQ, NKV = 16, 4, 2


def vec(seed, n):
    x, out = seed, array.array("f")
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(((x >> 55) - 256) / 256.0)
    return out


def run(cache, seed, tokens=20):
    out = array.array("f", [0.0] * NQ * HD)
    res = []
    for t in range(tokens):
        q, k, v = vec(seed + 3 * t, NQ * HD), vec(seed + 3 * t + 1, NKV * HD), vec(seed + 3 * t + 2, NKV * HD)
        cache.decode(0, q, k, v, out)
        res.extend(out)
    return res


class RopeHelpers(unittest.TestCase):
    def test_formulas(self):
        n, theta = 8, 10000.0
        base = [theta ** (-i / n) for i in range(n)]
        lin = kvprune.rope_freqs_linear(n, theta, 4.0)
        for a, b in zip(lin, base):
            self.assertAlmostEqual(a, b / 4.0, delta=1e-13 * b)
        l3 = kvprune.rope_freqs_llama3(n, theta, 8.0, 1.0, 4.0, 64.0)
        for a, f in zip(l3, base):
            wl = 2 * math.pi / f
            want = f if wl < 16.0 else f / 8.0 if wl > 64.0 else \
                (1 - (64.0 / wl - 1) / 3) * f / 8 + (64.0 / wl - 1) / 3 * f
            self.assertAlmostEqual(a, want, delta=1e-13 * f)
        y, att = kvprune.rope_freqs_yarn(n, theta, 4.0, 256.0)
        self.assertAlmostEqual(att, 0.1 * math.log(4.0) + 1.0, delta=1e-6)
        self.assertEqual(y[0], base[0])
        self.assertAlmostEqual(y[-1], base[-1] / 4.0, delta=1e-13 * base[-1])
        d = kvprune.rope_freqs_divided(n, theta, [2.0] * n)
        for a, b in zip(d, base):
            self.assertAlmostEqual(a, b / 2.0, delta=1e-13 * b)

    def test_errors(self):
        with self.assertRaises(KvpError) as e:
            kvprune.rope_freqs_linear(8, 1.0, 2.0)
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)
        self.assertIn("theta=1", str(e.exception))
        with self.assertRaises(KvpError):
            kvprune.rope_freqs_yarn(8, 10000.0, 4.0, 256.0, beta_fast=1.0, beta_slow=2.0)
        with self.assertRaises(KvpError):
            kvprune.rope_freqs_divided(8, 10000.0, [1.0] * 7)
        with self.assertRaises(KvpError):
            kvprune.rope_freqs_linear(0, 10000.0, 2.0)


class RopeTable(unittest.TestCase):
    def test_table_is_used(self):
        m = kvprune.Model(1, NQ, NKV, HD, rope=kvprune.ROPE_NEOX)
        m2 = kvprune.Model(1, NQ, NKV, HD, rope=kvprune.ROPE_NEOX, rope_theta=977.0)
        tab = [977.0 ** (-2.0 * i / HD) for i in range(HD // 2)]  # as the library computes theta's
        spec = "policy=full capacity=32"
        a = kvprune.Cache(m, spec, rope_freqs=tab)
        b = kvprune.Cache(m2, spec)
        c = kvprune.Cache(m, spec)
        ra, rb, rc = run(a, 5), run(b, 5), run(c, 5)
        self.assertEqual(ra, rb)
        self.assertNotEqual(ra, rc)

    def test_bad_table(self):
        m = kvprune.Model(1, NQ, NKV, HD, rope=kvprune.ROPE_NEOX)
        with self.assertRaises(KvpError) as e:
            kvprune.Cache(m, "policy=full capacity=32", rope_freqs=[1.0] * 7)
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)
        self.assertIn("rope_dim/2=8", str(e.exception))
        with self.assertRaises(KvpError):
            kvprune.Cache(m, "policy=full capacity=32", rope_freqs=[1.0] * 7 + [float("nan")])
        cfg = kvprune.Config(m, "policy=full capacity=32")
        cfg.rope_check([1.0] * 8)
        cfg.rope_check(None)
        for bad in ([1.0] * 7, [1.0] * 7 + [float("inf")], [1.0] * 7 + [0.0]):
            with self.assertRaises(KvpError) as e:
                cfg.rope_check(bad)
            self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)

    def test_attn_factor_key(self):
        m = kvprune.Model(1, NQ, NKV, HD, rope=kvprune.ROPE_NEOX)
        _, att = kvprune.rope_freqs_yarn(HD // 2, 10000.0, 4.0, 256.0)
        cfg = kvprune.Config(m, "policy=full capacity=32")
        cfg.set("rope_attn_factor", att)
        self.assertAlmostEqual(cfg.get("rope_attn_factor"), att, places=6)
        with self.assertRaises(KvpError):
            kvprune.Config(m, "policy=full rope_attn_factor=0")


if __name__ == "__main__":
    unittest.main()
