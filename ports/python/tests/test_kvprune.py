"""unittest suite of the ctypes binding (python3 -m unittest discover -s tests -v).

Uses the installed package when there is one (pip install ./ports/python bundles the shared
library), else the source tree's package with KVPRUNE_LIB=<path> (.ci/ports.sh builds it from the
installed static library with kvprune.build_shared_library()).
"""
import array
import math
import os
import sys
import threading
import unittest

try:  # the installed package (pip install ./ports/python), else the source tree's
    import kvprune  # noqa: E402
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import kvprune  # noqa: E402
from kvprune import KvpError  # noqa: E402
from _rng import Rng  # noqa: E402

try:
    import numpy as np
except Exception:
    np = None

MODEL = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)


class ConfigTest(unittest.TestCase):
    def test_version(self):
        self.assertEqual(kvprune.version(), (0, 2, 0))

    def test_struct_layout(self):
        cfg = kvprune.Config(MODEL)
        self.assertEqual(cfg.struct_size, __import__("ctypes").sizeof(kvprune._Config))
        self.assertEqual(cfg.model.n_q_heads, 4)
        self.assertEqual(cfg.threads, 1)
        self.assertEqual(cfg.policy, kvprune.POLICY_FULL)

    def test_spec_keys_land_in_fields(self):
        cases = [("capacity=777", "capacity", 777), ("threads=3", "threads", 3), ("sinks=5", "sinks", 5),
                 ("window=17", "window", 17), ("extra=3", "extra", 3), ("compress_every=6", "compress_every", 6),
                 ("slack=11", "slack", 11), ("max_drop=9", "max_drop", 9), ("budget=33", "budget", 33),
                 ("recent=13", "recent", 13), ("obs_window=7", "obs_window", 7), ("beta=2.5", "beta", 2.5),
                 ("decay=0.75", "decay", 0.75), ("asl_tau=0.125", "asl_tau", 0.125), ("lazy_force=5", "lazy_force", 5),
                 ("value_channel_ratio=0.25", "value_channel_ratio", 0.25),
                 ("positions=original", "positions", kvprune.POS_ORIGINAL),
                 ("policy=streaming", "policy", kvprune.POLICY_STREAMING)]
        checked = 0
        for spec, field, want in cases:
            cfg = kvprune.Config(MODEL)
            try:
                cfg.apply(spec)
            except KvpError as e:
                if e.status == kvprune.ERR_UNSUPPORTED:
                    continue
                raise
            self.assertEqual(getattr(cfg, field), want, spec)
            checked += 1
        self.assertGreaterEqual(checked, 10)

    def test_bad_spec(self):
        cfg = kvprune.Config(MODEL, "policy=streaming sinks=4 window=60")
        with self.assertRaises(KvpError) as cm:
            cfg.apply("sinks=8 no_such_key=1")
        self.assertEqual(cm.exception.status, kvprune.ERR_CONFIG)
        self.assertEqual(cm.exception.name, "ERR_CONFIG")
        self.assertIn("no_such_key", cm.exception.message)
        self.assertEqual(cfg.sinks, 4, "apply is all-or-nothing")
        with self.assertRaises(KvpError) as cm:
            cfg.apply("window=abc")
        self.assertIn("window", str(cm.exception))
        with self.assertRaises(KvpError):
            kvprune.Cache(MODEL, "policy=nonsense")
        with self.assertRaises(KvpError) as cm:
            kvprune.Cache(kvprune.Model(2, 3, 2, 16), "")
        self.assertEqual(cm.exception.status, kvprune.ERR_CONFIG)
        with self.assertRaises(KvpError):
            kvprune.Cache(MODEL, "policy=streaming sinks=4 window=16 capacity=3")


class CacheTest(unittest.TestCase):
    def test_single_token_attention(self):
        with kvprune.Cache(MODEL, "policy=full capacity=64") as c:
            r = Rng(7)
            q, k, v = r.vec(64), r.vec(32), r.vec(32)
            out = c.decode(0, q, k, v)
            self.assertIsInstance(out, array.array)
            for h in range(4):
                for j in range(16):
                    self.assertAlmostEqual(out[h * 16 + j], v[(h // 2) * 16 + j], delta=1e-6)

    def test_huge_page_arena(self):
        # an arena of 2 MiB or more is advised for huge pages (kvp_arena_advise) before create
        # writes it: it decodes as a small one does (no token is evicted in either)
        with kvprune.Cache(MODEL, "policy=window window=20000") as big, \
                kvprune.Cache(MODEL, "policy=window window=64") as small:
            self.assertGreaterEqual(big.stats().arena_bytes, 2 << 20)
            r = Rng(5)
            for _ in range(20):
                for layer in range(2):
                    q, k, v = r.vec(64), r.vec(32), r.vec(32)
                    self.assertEqual(big.decode(layer, q, k, v).tobytes(), small.decode(layer, q, k, v).tobytes())

    def test_streaming_decode_and_stats(self):
        c = kvprune.Cache(MODEL, "policy=streaming sinks=4 window=16 compress_every=4")
        r = Rng(42)
        out = array.array("f", bytes(4 * 64))
        steps = 100
        for _ in range(steps):
            for layer in range(2):
                res = c.decode(layer, r.vec(64), r.vec(32), r.vec(32), out=out)
                self.assertIs(res, out)
                self.assertTrue(all(math.isfinite(x) for x in out))
        live = 0
        for layer in range(2):
            self.assertTrue(20 <= c.layer_len(layer) < 24, c.layer_len(layer))
            for h in range(2):
                pos = c.layer_positions(layer, h)
                self.assertEqual(pos[:4], [0, 1, 2, 3])
                self.assertEqual(pos[-1], steps - 1)
                self.assertEqual(pos[4:], list(range(pos[4], steps)))
                live += len(pos) * 16 * 4 * 2
        s = c.stats()
        self.assertEqual(s.tokens_seen, steps)
        self.assertGreater(s.prune_events, 0)
        self.assertGreater(s.tokens_evicted, 0)
        self.assertEqual(s.live_bytes, live)
        self.assertGreaterEqual(s.peak_live_bytes, s.live_bytes)
        self.assertEqual(s.arena_bytes, c.arena_len)
        c.reset()
        self.assertEqual(c.layer_len(0), 0)
        self.assertEqual(c.stats().tokens_seen, 0)
        c.close()
        c.close()
        with self.assertRaises(KvpError) as cm:
            c.stats()
        self.assertEqual(cm.exception.status, kvprune.ERR_STATE)

    def test_buffer_kinds(self):
        import ctypes
        with kvprune.Cache(MODEL, "policy=full capacity=64") as c:
            r = Rng(5)
            q, k, v = r.vec(64), r.vec(32), r.vec(32)
            a = c.decode(0, memoryview(q), bytes(memoryview(k)), list(v))      # memoryview, bytes, list
            b_out = bytearray(4 * 64)
            c.decode(1, q, k, bytearray(memoryview(v)), out=b_out)              # bytearray in and out
            c_out = (ctypes.c_float * 64)()
            c.decode(1, q, k, v, out=memoryview(c_out))
            self.assertEqual(list(a), list(array.array("f", bytes(b_out))))
            with self.assertRaises(KvpError):
                c.decode(0, q, k, v, out=bytes(256))                             # read-only out
            with self.assertRaises(KvpError):
                c.decode(0, q, k, v, out=array.array("d", [0.0] * 64))          # wrong dtype
            with self.assertRaises(KvpError):
                c.decode(0, 42, k, v)

    @unittest.skipIf(np is None, "numpy not installed")
    def test_numpy(self):
        with kvprune.Cache(MODEL, "policy=full capacity=64") as c:
            r = Rng(5)
            q = np.array(r.vec(64), dtype=np.float32).reshape(4, 16)
            k = np.array(r.vec(32), dtype=np.float64).reshape(2, 16)  # converted
            v = np.array(r.vec(32), dtype=np.float32)
            out = c.decode(0, q, k, v)
            self.assertIsInstance(out, np.ndarray)
            np.testing.assert_allclose(out.reshape(4, 16)[0], v[:16], atol=1e-6)
            out2 = np.zeros((4, 16), dtype=np.float32)
            c.decode(1, q, k, v, out=out2)
            self.assertTrue(np.isfinite(out2).all())

    def test_prefill_matches_decode(self):
        a = kvprune.Cache(MODEL, "policy=full capacity=64")
        b = kvprune.Cache(MODEL, "policy=full capacity=64")
        r = Rng(3)
        n = 8
        q, k, v = r.vec(n * 64), r.vec(n * 32), r.vec(n * 32)
        out_a = a.prefill(0, q, k, v)
        self.assertEqual(len(out_a), n * 64)
        for t in range(n):
            out_b = b.decode(0, q[t * 64:(t + 1) * 64], k[t * 32:(t + 1) * 32], v[t * 32:(t + 1) * 32])
            for j in range(64):
                self.assertAlmostEqual(out_a[t * 64 + j], out_b[j], delta=1e-5)
        self.assertEqual(a.layer_positions(0, 1), list(range(n)))
        a.append(1, k[:64], v[:64], positions=[10, 20])
        self.assertIsNone(a.prefill(1, q[:64], k[:32], v[:32], out=None))
        self.assertEqual(a.layer_positions(1, 0), [10, 20, 21])
        out, sel = a.prefill(1, q[:64], k[:32], v[:32], selection=4)
        self.assertEqual(sel, kvprune.Selection(False, []))

    def test_bad_input(self):
        c = kvprune.Cache(MODEL, "policy=full capacity=4")
        r = Rng(9)
        q, k, v = r.vec(64), r.vec(32), r.vec(32)
        c.decode(0, q, k, v)

        def status(fn):
            with self.assertRaises(KvpError) as cm:
                fn()
            return cm.exception.status

        self.assertEqual(status(lambda: c.decode(0, q[:63], k, v)), kvprune.ERR_ARG)
        self.assertEqual(status(lambda: c.prefill(0, q, k, v[:16])), kvprune.ERR_ARG)
        self.assertEqual(status(lambda: c.append(0, k, v, positions=[1, 2])), kvprune.ERR_ARG)
        self.assertEqual(status(lambda: c.append(0, [], [])), kvprune.ERR_ARG)
        self.assertEqual(status(lambda: c.decode(5, q, k, v)), kvprune.ERR_LAYER)
        self.assertTrue(c.last_error())
        bad = array.array("f", k)
        bad[3] = float("nan")
        self.assertEqual(status(lambda: c.decode(0, q, bad, v)), kvprune.ERR_NONFINITE)
        badq = array.array("f", q)
        badq[0] = float("inf")
        self.assertEqual(status(lambda: c.decode(0, badq, k, v)), kvprune.ERR_NONFINITE)
        self.assertEqual(status(lambda: c.append(0, k, v, positions=[0])), kvprune.ERR_ARG)
        self.assertEqual(c.layer_len(0), 1)
        self.assertEqual(c.layer_positions(0, 0), [0])
        for _ in range(3):
            c.decode(0, q, k, v)
        self.assertEqual(status(lambda: c.decode(0, q, k, v)), kvprune.ERR_FULL)
        self.assertEqual(c.layer_len(0), 4)
        self.assertEqual(status(lambda: c.layer_positions(0, 2)), kvprune.ERR_LAYER)
        self.assertEqual(c.layer_len(9), 0)

    def test_threads(self):
        errors = []

        def work(seed):
            try:
                with kvprune.Cache(MODEL, "policy=streaming sinks=2 window=8 compress_every=2 threads=2") as c:
                    r = Rng(seed)
                    for _ in range(30):
                        for layer in range(2):
                            c.decode(layer, r.vec(64), r.vec(32), r.vec(32))
                    self.assertEqual(c.layer_positions(1, 0)[-1], 29)
            except Exception as e:  # pragma: no cover
                errors.append(e)

        ts = [threading.Thread(target=work, args=(s + 1,)) for s in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

class IssueElevenTwelveTest(unittest.TestCase):
    def test_integers_beyond_32_bits_are_rejected(self):
        m = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)
        with kvprune.Cache(m, "policy=window window=8") as c:
            q, kv = [0.1] * 64, [0.2] * 32
            for layer in (2 ** 32, 2 ** 32 + 1, -1, 2 ** 64):
                for call in (lambda: c.decode(layer, q, kv, kv), lambda: c.append(layer, kv, kv),
                             lambda: c.prefill(layer, q, kv, kv), lambda: c.layer_len(layer),
                             lambda: c.layer_positions(0, layer)):
                    with self.assertRaises(kvprune.KvpError) as cm:
                        call()
                    self.assertEqual(cm.exception.status, kvprune.ERR_LAYER, layer)
            self.assertEqual(c.layer_len(0), 0)
            with self.assertRaises(kvprune.KvpError) as cm:
                c.append(0, kv, kv, positions=[2 ** 32 + 5])  # would wrap to 5
            self.assertEqual(cm.exception.status, kvprune.ERR_ARG)
            self.assertIn("int32", cm.exception.message)
            with self.assertRaises(kvprune.KvpError) as cm:
                c.append(0, kv, kv, positions=[-2 ** 31 - 1])
            self.assertEqual(cm.exception.status, kvprune.ERR_ARG)
            self.assertEqual(c.layer_len(0), 0)
            c.append(0, kv, kv, positions=[5])
            self.assertEqual(c.layer_positions(0, 0), [5])

    def test_error_text_not_doubled(self):
        m = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)
        with kvprune.Cache(m, "policy=window window=8") as c:
            with self.assertRaises(kvprune.KvpError) as cm:
                c.decode(1, [0.1] * 63, [0.2] * 32, [0.2] * 32)
            self.assertTrue(str(cm.exception).startswith("KVP_ERR_ARG: "), str(cm.exception))
            self.assertEqual(str(cm.exception).count("KVP_ERR"), 1)
        with self.assertRaises(kvprune.KvpError) as cm:
            kvprune.Config(m, "bogus=1")
        self.assertEqual(str(cm.exception).count("KVP_ERR"), 1, str(cm.exception))
        cfg = kvprune.Config(m, "policy=window window=8")
        cfg.set("capacity", 3)
        with self.assertRaises(kvprune.KvpError) as cm:
            kvprune.Cache(m, config=cfg)
        self.assertEqual(cm.exception.status, kvprune.ERR_CONFIG)
        self.assertIn("capacity", cm.exception.message)
        self.assertNotIn("NULL cache", cm.exception.message)

    @unittest.skipIf(np is None, "numpy not installed")
    def test_numpy_keeps_the_query_shape(self):
        m = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)
        with kvprune.Cache(m, "policy=full capacity=16") as c:
            q = np.full((4, 16), 0.1, dtype=np.float32)
            kv = np.full((2, 16), 0.2, dtype=np.float32)
            self.assertEqual(c.decode(0, q, kv, kv).shape, (4, 16))
            q3 = np.full((3, 4, 16), 0.1, dtype=np.float32)
            kv3 = np.full((3, 2, 16), 0.2, dtype=np.float32)
            self.assertEqual(c.prefill(1, q3, kv3, kv3).shape, (3, 4, 16))
            self.assertEqual(c.decode(0, q.reshape(-1), kv.reshape(-1), kv.reshape(-1)).shape, (64,))


if __name__ == "__main__":
    unittest.main()
