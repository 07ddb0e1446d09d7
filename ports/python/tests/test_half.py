"""Half-precision rows through the Python binding (kvp_*_ex): the same cache and the rounded
outputs of the float32 calls on the widened values; errors."""
import array
import os
import struct
import sys
import unittest

try:  # the installed package (pip install ./ports/python), else the source tree's
    import kvprune  # noqa: E402
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import kvprune  # noqa: E402
from kvprune import KvpError  # noqa: E402

try:
    import numpy as np
except Exception:  # numpy is optional
    np = None

MODEL = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)
NQ, NKV, HD = 4, 2, 16
SPEC = "policy=h2o budget=16 recent=4 capacity=32"


def vals(seed, n):
    """Multiples of 1/64 in [-1, 1): exact in f16 and bf16."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF
        out.append(((x >> 57) - 64) / 64.0)
    return out


def f16_bits(xs):
    return array.array("H", struct.unpack("<%dH" % len(xs), struct.pack("<%de" % len(xs), *xs)))


def bf16_bits(xs):
    return array.array("H", [u >> 16 for u in struct.unpack("<%dI" % len(xs), struct.pack("<%df" % len(xs), *xs))])


def from_f16(bits):
    return list(struct.unpack("<%de" % len(bits), struct.pack("<%dH" % len(bits), *bits)))


class HalfTest(unittest.TestCase):
    def twin(self, dtype, bits):
        a, b = kvprune.Cache(MODEL, SPEC), kvprune.Cache(MODEL, SPEC)
        for t in range(24):
            q, k, v = vals(3 * t + 1, NQ * HD), vals(3 * t + 2, NKV * HD), vals(3 * t + 3, NKV * HD)
            for layer in range(2):
                if t < 8:
                    ha = a.prefill_half(layer, bits(q), bits(k), bits(v), dtype=dtype)
                    fb = b.prefill(layer, array.array("f", q), array.array("f", k), array.array("f", v))
                elif t < 10:
                    a.append_half(layer, bits(k), bits(v), dtype=dtype)
                    b.append(layer, array.array("f", k), array.array("f", v))
                    continue
                else:
                    ha = a.decode_half(layer, bits(q), bits(k), bits(v), dtype=dtype)
                    fb = b.decode(layer, array.array("f", q), array.array("f", k), array.array("f", v))
                if dtype == "f16":  # the half outputs are the float32 outputs rounded (struct 'e' rounds to even)
                    self.assertEqual(list(ha), list(f16_bits(list(fb))))
        for layer in range(2):
            for h in range(NKV):
                self.assertEqual(a.layer_positions(layer, h), b.layer_positions(layer, h))
        self.assertEqual(bytes(a.state_save()), bytes(b.state_save()))

    def test_f16_twin(self):
        self.twin("f16", f16_bits)

    def test_bf16_twin(self):
        self.twin("bf16", bf16_bits)

    @unittest.skipIf(np is None, "numpy not installed")
    def test_numpy_float16(self):
        a, b = kvprune.Cache(MODEL, SPEC), kvprune.Cache(MODEL, SPEC)
        q, k, v = (np.array(vals(s, n), dtype=np.float16) for s, n in ((1, NQ * HD), (2, NKV * HD), (3, NKV * HD)))
        out = a.decode_half(0, q.reshape(NQ, HD), k, v)
        self.assertEqual(out.dtype, np.float16)
        self.assertEqual(out.shape, (NQ, HD))
        ref = b.decode(0, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
        self.assertTrue((out.ravel() == np.asarray(ref).astype(np.float16).ravel()).all())

    def test_errors(self):
        c = kvprune.Cache(MODEL, SPEC)
        q, k, v = f16_bits(vals(1, NQ * HD)), f16_bits(vals(2, NKV * HD)), f16_bits(vals(3, NKV * HD))
        c.decode_half(0, q, k, v)
        before = bytes(c.state_save())
        k[5] = 0x7C00  # +Inf
        with self.assertRaises(KvpError) as e:
            c.decode_half(0, q, k, v)
        self.assertEqual(e.exception.status, kvprune.ERR_NONFINITE)
        self.assertIn("k[5]", str(e.exception))
        bv = bf16_bits(vals(3, NKV * HD))
        bv[2] = 0x7FC0  # bf16 NaN
        with self.assertRaises(KvpError) as e:
            c.append_half(1, bf16_bits(vals(2, NKV * HD)), bv, dtype="bf16")
        self.assertEqual(e.exception.status, kvprune.ERR_NONFINITE)
        self.assertEqual(bytes(c.state_save()), before)
        with self.assertRaises(KvpError) as e:
            c.decode_half(0, q, k, v, dtype="f8")
        self.assertEqual(e.exception.status, kvprune.ERR_ARG)
        with self.assertRaises(KvpError):  # float32 rows are not half rows
            c.decode_half(0, array.array("f", vals(1, NQ * HD)), k, v)


if __name__ == "__main__":
    unittest.main()
