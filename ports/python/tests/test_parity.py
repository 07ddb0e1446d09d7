"""Issue 22: the C API in full (prefill_room, layer_capacity, layer_stats, the key table,
key_used, get/set, the ASL selection) and integers that do not fit the C types.

The Rust (ports/rust/tests/parity.rs) and Go (ports/go/parity_test.go) suites run the same cases
with the same numbers; keep the three in step.
"""
import math
import os
import sys
import unittest

try:
    import kvprune  # noqa: E402
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import kvprune  # noqa: E402
from kvprune import KvpError  # noqa: E402
from _rng import Rng  # noqa: E402

MODEL = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)


def status(fn):
    try:
        fn()
    except KvpError as e:
        return e.status
    return kvprune.OK


class OutOfRangeIntegers(unittest.TestCase):
    """Defect 3: ctypes kept the low 32 bits (2**32 + 2 layers built a 2-layer cache)."""

    def test_model_fields_must_fit_uint32(self):
        for args in [(2 ** 32 + 2, 4, 2, 16), (2, 2 ** 32 + 4, 2, 16), (2, 4, -1, 16), (2, 4, 2, 2 ** 64),
                     (2, 4, 2, 16.0), (True, 4, 2, 16)]:
            with self.assertRaises(KvpError) as cm:
                kvprune.Model(*args)
            self.assertEqual(cm.exception.status, kvprune.ERR_CONFIG, args)
        with self.assertRaises(KvpError) as cm:
            kvprune.Model(2, 4, 2, 16, rope_dim=2 ** 32 + 16)
        self.assertIn("rope_dim", cm.exception.message)
        m = kvprune.Model(2, 4, 2, 16)
        with kvprune.Cache(m, "policy=window window=8") as c:
            m.head_dim = 32  # changed after the cache was made: the cache keeps its own geometry
            self.assertEqual(status(lambda: c.decode(0, [0.1] * 128, [0.2] * 64, [0.2] * 64)), kvprune.ERR_ARG)
            c.decode(0, [0.1] * 64, [0.2] * 32, [0.2] * 32)
        m.head_dim = 16
        m.n_layers = 2 ** 32 + 2  # changed after construction: refused where it is used
        with self.assertRaises(KvpError) as cm:
            kvprune.Cache(m, "policy=window window=8")
        self.assertEqual(cm.exception.status, kvprune.ERR_CONFIG)
        self.assertIn("n_layers=4294967298", cm.exception.message)

    def test_geometry_error_names_the_field(self):
        # kvp_config_init_ex: the message names the model field (same case in the three suites)
        for make in (lambda: kvprune.Config(kvprune.Model(2, 6, 4, 16)),
                     lambda: kvprune.Cache(kvprune.Model(2, 6, 4, 16), "policy=window window=8")):
            with self.assertRaises(KvpError) as cm:
                make()
            self.assertEqual(cm.exception.status, kvprune.ERR_CONFIG)
            self.assertIn("model.n_kv_heads=4 must divide model.n_q_heads=6", cm.exception.message)
            self.assertEqual(cm.exception.message.count("KVP_ERR"), 1, cm.exception.message)

    def test_config_set_same_cases_as_rust_and_go(self):
        cfg = kvprune.Config(MODEL, "policy=window window=8")
        bad = [("window", 2 ** 32 + 4), ("window", -1), ("window", 2.5), ("threads", 0), ("beta", float("nan")),
               ("beta", 1e300), ("nonlazy", 99), ("lazy_force", 2 ** 32), ("no_such_key", 1)]
        for key, value in bad:
            self.assertEqual(status(lambda: cfg.set(key, value)), kvprune.ERR_CONFIG, (key, value))
        self.assertEqual(cfg.get("window"), 8, "a refused set changes nothing")
        self.assertEqual(cfg.get("threads"), 1)
        self.assertEqual(status(lambda: cfg.set("window", True)), kvprune.ERR_CONFIG)
        self.assertEqual(status(lambda: cfg.get("no_such_key")), kvprune.ERR_CONFIG)
        with self.assertRaises(KvpError) as cm:
            cfg.set("window", 2 ** 32 + 4)
        self.assertIn("window=4294967300", cm.exception.message)
        cfg.set("lazy_force", 2 ** 32 - 1)  # the largest uint32: kept whole
        self.assertEqual(cfg.get("lazy_force"), 2 ** 32 - 1)
        cfg.set("lazy_force", 0)
        cfg.set("beta", 2.5)
        self.assertEqual(cfg.get("beta"), 2.5)
        cfg.set("policy", kvprune.POLICY_H2O)
        self.assertEqual(cfg.get("policy"), kvprune.POLICY_H2O)
        cfg.set("window", 12)
        cfg.set("policy", kvprune.POLICY_WINDOW)
        cfg.check()
        with kvprune.Cache(MODEL, config=cfg) as c:
            self.assertEqual(c.layer_capacity(0), 13)

    def test_selection_capacity_must_fit_uint32(self):
        with kvprune.Cache(MODEL, "policy=full capacity=8") as c:
            q, kv = [0.1] * 64, [0.2] * 32
            for cap in (2 ** 32, -1, 2.0):
                self.assertEqual(status(lambda: c.prefill_select(0, q, kv, kv, cap)), kvprune.ERR_ARG, cap)
            self.assertEqual(c.layer_len(0), 0)


class KeyTable(unittest.TestCase):
    def test_keys_and_defaults(self):
        keys = kvprune.config_keys()
        names = [k.name for k in keys]
        self.assertEqual(names[0], "policy")
        for want in ("capacity", "window", "budget", "lazy_force", "prefill_stage"):
            self.assertIn(want, names)
        self.assertEqual(len(set(names)), len(names))
        cfg = kvprune.Config(MODEL)
        for k in keys:
            if k.config_size == 0:  # apply-only (compression_ratio, ratio_tokens): nothing stored
                self.assertEqual(status(lambda: cfg.get(k.name)), kvprune.ERR_CONFIG)
                continue
            self.assertIn(k.key_type, (kvprune.KEY_UINT, kvprune.KEY_FLOAT, kvprune.KEY_ENUM))
            if k.key_type == kvprune.KEY_FLOAT:
                self.assertAlmostEqual(cfg.get(k.name), k.default_value, places=5, msg=k.name)
            else:
                self.assertEqual(cfg.get(k.name), k.default_value, k.name)
            self.assertEqual(k.values is not None, k.key_type == kvprune.KEY_ENUM, k.name)
            self.assertTrue(k.help)
        pool = keys[names.index("pool")]
        self.assertEqual(pool.values, "avg|max")
        self.assertEqual(pool.default_name, "max")
        self.assertTrue(pool.policies & (1 << kvprune.POLICY_SNAPKV))

    def test_compression_ratio_through_apply(self):
        cfg = kvprune.Config(MODEL, "policy=h2o compression_ratio=0.75 ratio_tokens=64")
        self.assertEqual(cfg.get("budget"), 16)  # keeps 25 % of 64 tokens
        self.assertEqual(status(lambda: cfg.get("compression_ratio")), kvprune.ERR_CONFIG)
        self.assertEqual(status(lambda: cfg.set("compression_ratio", 0.5)), kvprune.ERR_CONFIG)

    def test_key_used(self):
        self.assertFalse(kvprune.Config(MODEL, "policy=window window=8").key_used("sinks"))
        self.assertTrue(kvprune.Config(MODEL, "policy=streaming sinks=4 window=8").key_used("sinks"))
        self.assertEqual(status(lambda: kvprune.Config(MODEL).key_used("no_such_key")), kvprune.ERR_CONFIG)

    def test_calls_are_methods(self):
        cfg = kvprune.Config(MODEL, "policy=window window=8")
        self.assertGreater(cfg.arena_size(), 0)
        with kvprune.Cache(MODEL, config=cfg) as c:
            self.assertEqual(c.arena_len, cfg.arena_size())
            self.assertEqual(c.last_error(), "")
            self.assertEqual(status(lambda: c.layer_stats(2)), kvprune.ERR_LAYER)
            self.assertIn("layer", c.last_error())


class HarnessStyle(unittest.TestCase):
    def test_chunk_a_long_prompt_by_prefill_room(self):
        """bench/harness/session.cpp: chunk = max(1, min(left, kvp_prefill_room)), every layer per chunk."""
        n = 100
        r = Rng(5)
        q, k, v = r.vec(n * 64), r.vec(n * 32), r.vec(n * 32)
        with kvprune.Cache(MODEL, "policy=streaming sinks=4 window=24 compress_every=8") as c:
            self.assertEqual(c.layer_capacity(0), 36)
            self.assertEqual(c.layer_capacity(2), 0)
            self.assertEqual(c.prefill_room(), 36)
            # the whole prompt at once does not fit, and changes nothing
            self.assertEqual(status(lambda: c.prefill(0, q, k, v)), kvprune.ERR_FULL)
            self.assertEqual(c.layer_len(0), 0)
            done, chunks = 0, []
            while done < n:
                room = c.prefill_room()
                chunk = max(1, min(n - done, room))
                for layer in range(2):
                    c.prefill(layer, q[done * 64:(done + chunk) * 64], k[done * 32:(done + chunk) * 32],
                              v[done * 32:(done + chunk) * 32])
                    self.assertLessEqual(c.layer_len(layer), c.layer_capacity(layer))
                chunks.append(chunk)
                done += chunk
            self.assertGreater(len(chunks), 2)
            self.assertEqual(sum(chunks), n)
            self.assertEqual(c.stats().tokens_seen, n)
            ls = c.layer_stats(1)
            self.assertEqual((ls.capacity, ls.len), (36, 28))
            self.assertGreater(ls.tokens_evicted, 0)
            self.assertEqual(ls.lazy, -1)
            kept = c.layer_positions(1, 0)
            self.assertEqual(kept[:4], [0, 1, 2, 3])
            self.assertEqual(kept[-1], n - 1)

    def test_read_lazy_layers(self):
        r = Rng(6)
        n = 30
        q, k, v = r.vec(n * 64), r.vec(n * 32), r.vec(n * 32)
        # lazy_force=1: layer 0 lazy (trimmed to sinks + window), layer 1 not, decided at prefill
        with kvprune.Cache(MODEL, "policy=simlayerkv sinks=4 window=8 capacity=64 lazy_force=1") as c:
            self.assertEqual(c.layer_stats(0).lazy, -1)
            for layer in range(2):
                c.prefill(layer, q, k, v, out=None)
            l0, l1 = c.layer_stats(0), c.layer_stats(1)
            self.assertEqual((l0.lazy, l0.len), (1, 12))
            self.assertEqual((l1.lazy, l1.len), (0, n))
        # lazy_mode=decode: undecided after the prompt, decided by the first decode
        with kvprune.Cache(MODEL, "policy=simlayerkv sinks=4 window=8 capacity=64 lazy_mode=decode") as c:
            for layer in range(2):
                c.prefill(layer, q, k, v, out=None)
            self.assertEqual([c.layer_stats(i).lazy for i in range(2)], [-1, -1])
            for layer in range(2):
                c.decode(layer, r.vec(64), r.vec(32), r.vec(32))
            for layer in range(2):
                ls = c.layer_stats(layer)
                self.assertIn(ls.lazy, (0, 1))
                self.assertEqual(ls.len, 12 if ls.lazy else n + 1)
                self.assertTrue(math.isfinite(ls.sparsity))

    def test_asl_selection(self):
        m = kvprune.Model(4, 4, 2, 16, rope=kvprune.ROPE_NEOX)
        n = 30
        r = Rng(7)
        q, k, v = r.vec(n * 64), r.vec(n * 32), r.vec(n * 32)
        with kvprune.Cache(m, "policy=asl budget=12 obs_window=4 asl_tau=1000000") as c:
            out, sel = c.prefill_select(0, q, k, v, 12)  # layer 0 < asl_min_layer = 1: no selection
            self.assertEqual(sel, kvprune.Selection(False, []))
            self.assertEqual(len(out), n * 64)
            # layer 1 may select up to budget tokens: a smaller buffer is ERR_BUFFER, nothing changed
            self.assertEqual(status(lambda: c.prefill_select(1, q, k, v, 4)), kvprune.ERR_BUFFER)
            self.assertEqual(c.layer_len(1), 0)
            _, sel = c.prefill_select(1, q, k, v, 12)
            self.assertTrue(sel.selected)
            self.assertEqual(len(sel.indices), 12)
            self.assertEqual(sel.indices, sorted(set(sel.indices)))
            self.assertEqual(sel.indices[-4:], [26, 27, 28, 29], "the observation window is propagated")
            # later layers receive only the selected tokens, at their original positions
            qs = [q[i * 64 + j] for i in sel.indices for j in range(64)]
            ks = [k[i * 32 + j] for i in sel.indices for j in range(32)]
            vs = [v[i * 32 + j] for i in sel.indices for j in range(32)]
            for layer in (2, 3):
                _, s2 = c.prefill_select(layer, qs, ks, vs, 12, positions=sel.indices)
                self.assertFalse(s2.selected)
                self.assertEqual(c.layer_positions(layer, 1), sel.indices)


if __name__ == "__main__":
    unittest.main()
