"""Issue 21 through the Python binding: draft rollback against a twin, state save/load, errors."""
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
from _rng import Rng  # noqa: E402

MODEL = kvprune.Model(2, 4, 2, 16, rope=kvprune.ROPE_NEOX)
NQ, NKV, HD = 4, 2, 16
SPEC = "policy=streaming sinks=2 window=6 capacity=32 max_draft=4"


def toks(r, n):
    return r.vec(n * NQ * HD), r.vec(n * NKV * HD), r.vec(n * NKV * HD)


def head(t, n):
    return t[0][:n * NQ * HD], t[1][:n * NKV * HD], t[2][:n * NKV * HD]


def prefill_all(c, t):
    for layer in range(2):
        c.prefill(layer, *t, out=None)


def decode_bits(c, seed):
    r = Rng(seed)
    bits = []
    for layer in range(2):
        out = c.decode(layer, *toks(r, 1))
        bits += struct.unpack("%dI" % len(out), out.tobytes())
    return bits


def kept(c):
    return [(c.layer_len(l), c.layer_positions(l, h)) for l in range(2) for h in range(NKV)]


class DraftTest(unittest.TestCase):
    def test_config_fields(self):
        cfg = kvprune.Config(MODEL, SPEC)
        self.assertEqual(cfg.get("max_draft"), 4)
        cfg.set("attn_scale", 0.0625)
        cfg.set("logit_softcap", 50)
        self.assertEqual((cfg.get("attn_scale"), cfg.get("logit_softcap")), (0.0625, 50.0))
        with self.assertRaises(KvpError) as e:
            cfg.set("attn_scale", 2)
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)
        self.assertEqual(cfg.get("attn_scale"), 0.0625)

    def test_sliding_window_keys(self):  # issue 21 item 5: through the spec, the struct mirrors the header
        spec = "policy=full capacity=64 sliding_window=5 sliding_pattern=2"
        cfg = kvprune.Config(MODEL, spec)
        self.assertEqual((cfg.get("sliding_window"), cfg.get("sliding_pattern")), (5, 2))
        r = Rng(7)
        with kvprune.Cache(MODEL, spec) as c:
            self.assertEqual(c.layer_capacity(1), 64)  # global
            self.assertEqual(c.layer_capacity(0), 4 + 32)  # W - 1 + one 32-token prefill piece
            q, k, v = toks(r, 12)
            for layer in range(2):
                c.prefill(layer, q, k, v)
            self.assertEqual((c.layer_len(0), c.layer_len(1)), (4, 12))
        with self.assertRaises(KvpError) as e:
            kvprune.Config(MODEL, "sliding_pattern=2")
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)

    def test_commit_equals_twin(self):
        r = Rng(0x2B7E1516)
        prompt, draft = toks(r, 9), toks(r, 3)
        with kvprune.Cache(MODEL, SPEC) as c, kvprune.Cache(MODEL, SPEC) as twin:
            prefill_all(c, prompt)
            prefill_all(twin, prompt)
            c.draft_begin()
            for layer in range(2):
                c.prefill(layer, *draft)
            c.draft_commit(2)
            prefill_all(twin, head(draft, 2))
            self.assertEqual(kept(c), kept(twin))
            self.assertEqual(c.stats(), twin.stats())
            self.assertEqual(decode_bits(c, 77), decode_bits(twin, 77))
            self.assertEqual(kept(c), kept(twin))

    def test_save_load_continues(self):
        r = Rng(0x9E3779B9)
        with kvprune.Cache(MODEL, SPEC) as c, kvprune.Cache(MODEL, SPEC) as fresh:
            prefill_all(c, toks(r, 11))
            decode_bits(c, 5)
            n = c.state_size()
            self.assertGreater(n, 0)
            small = bytearray(b"\xa5" * (n - 1))
            with self.assertRaises(KvpError) as e:
                c.state_save(small)
            self.assertEqual(e.exception.status, kvprune.ERR_BUFFER)
            self.assertEqual(small, bytearray(b"\xa5" * (n - 1)))
            buf = bytearray(n + 8)
            self.assertEqual(c.state_save(buf), n)
            saved = c.state_save()
            self.assertEqual(bytes(buf[:n]), saved)
            fresh.state_load(saved)
            self.assertEqual(kept(fresh), kept(c))
            self.assertEqual(fresh.state_save(), saved)
            for step in range(3):
                self.assertEqual(decode_bits(fresh, 100 + step), decode_bits(c, 100 + step))
            self.assertEqual(kept(fresh), kept(c))
            # a bytearray and a memoryview load the same way
            fresh.state_load(bytearray(saved))
            fresh.state_load(memoryview(saved))

    def test_errors_leave_cache_unchanged(self):
        r = Rng(0x12345678)
        with kvprune.Cache(MODEL, SPEC) as c, kvprune.Cache(MODEL, SPEC) as other:
            prefill_all(c, toks(r, 5))
            before = c.state_save()

            def status(fn, *a):
                with self.assertRaises(KvpError) as e:
                    fn(*a)
                return e.exception.status

            with self.assertRaises(KvpError) as e:
                c.draft_commit(0)
            self.assertEqual(e.exception.status, kvprune.ERR_STATE)
            self.assertTrue(str(e.exception).startswith("KVP_ERR_STATE"), str(e.exception))
            self.assertEqual(c.state_save(), before)
            self.assertEqual(status(c.draft_commit, -1), kvprune.ERR_ARG)
            self.assertEqual(status(c.draft_commit, 1.5), kvprune.ERR_ARG)

            c.draft_begin()
            self.assertEqual(status(c.draft_begin), kvprune.ERR_STATE)
            prefill_all(c, toks(r, 2))
            self.assertEqual(status(c.draft_commit, 3), kvprune.ERR_ARG)
            self.assertEqual(status(c.state_save, bytearray(2 * len(before) + 4096)), kvprune.ERR_STATE)
            self.assertEqual(status(c.state_load, before), kvprune.ERR_STATE)
            c.draft_commit(0)
            self.assertEqual(c.state_save(), before)

            prefill_all(other, toks(r, 3))
            other_before = other.state_save()
            self.assertEqual(status(other.state_load, before[:-1]), kvprune.ERR_ARG)
            self.assertEqual(status(other.state_load, before[:16]), kvprune.ERR_ARG)
            self.assertEqual(status(other.state_load, b""), kvprune.ERR_ARG)
            bad = bytearray(before)
            bad[len(bad) // 2] ^= 1
            self.assertEqual(status(other.state_load, bad), kvprune.ERR_ARG)
            self.assertEqual(status(other.state_save, b"\0" * 4096), kvprune.ERR_ARG)  # read-only
            self.assertEqual(other.state_save(), other_before)

        with kvprune.Cache(MODEL, "policy=streaming sinks=2 window=6 capacity=32") as nodraft:
            self.assertEqual(status(nodraft.state_load, before), kvprune.ERR_CONFIG)
            self.assertEqual(status(nodraft.draft_begin), kvprune.ERR_CONFIG)
            self.assertEqual(nodraft.layer_len(0), 0)
        self.assertEqual(status(nodraft.draft_begin), kvprune.ERR_STATE)  # closed


class DuoHeadsTest(unittest.TestCase):
    """issue 32 item 2: a DuoAttention role table (kvp_create_heads)."""

    def test_streaming_heads_keep_sinks_and_window(self):
        cfg = kvprune.Config(MODEL, "policy=full capacity=64 duo_sink=2 duo_window=6")
        self.assertEqual((cfg.get("duo_sink"), cfg.get("duo_window")), (2, 6))
        S, R = kvprune.HEAD_STREAMING, kvprune.HEAD_RETRIEVAL
        roles = [S, R, R, S]
        self.assertLess(cfg.arena_size_heads(roles), cfg.arena_size())
        self.assertEqual(cfg.arena_size_heads([R] * 4), cfg.arena_size())
        self.assertEqual(cfg.arena_size_heads(roles[:3]), 0)
        c = kvprune.Cache(MODEL, config=cfg, roles=roles)
        for i in range(20):
            decode_bits(c, 7 + i)
        want = [0, 1] + list(range(14, 20))
        self.assertEqual(list(c.layer_positions(0, 0)), want)
        self.assertEqual(list(c.layer_positions(1, 1)), want)
        self.assertEqual(len(c.layer_positions(0, 1)), 20)
        with self.assertRaises(kvprune.KvpError) as e:
            kvprune.Cache(MODEL, config=cfg, roles=[S, R, 2, R])
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)
        self.assertIn("roles[2]=2", str(e.exception))
        other = kvprune.Cache(MODEL, config=cfg, roles=[R, S, S, R])
        with self.assertRaises(kvprune.KvpError) as e:
            other.state_load(c.state_save())
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)


class AdaTest(unittest.TestCase):
    """issue 32 item 1: AdaKV's per-head budgets reach the struct this binding mirrors."""

    def test_head_budget_ada(self):
        cfg = kvprune.Config(MODEL, "policy=snapkv budget=8 obs_window=2 head_budget=ada ada_floor=0.5")
        self.assertEqual((cfg.get("head_budget"), cfg.get("ada_floor")), (1, 0.5))
        self.assertEqual((cfg._raw.head_budget, cfg._raw.ada_floor), (1, 0.5))
        c = kvprune.Cache(MODEL, config=cfg)
        for i in range(12):
            decode_bits(c, 11 + i)
        self.assertEqual(len(c.layer_positions(0, 0)), 12)


class PromptTest(unittest.TestCase):
    """Issue 28: a prompt in chunks with max_prompt keeps what one call keeps (prompt_end)."""

    def test_chunked_prompt_keeps_what_one_call_keeps(self):
        spec = "policy=snapkv budget=12 obs_window=4 recent=2 max_prompt=64"
        self.assertEqual(kvprune.Config(MODEL, spec).get("max_prompt"), 64)
        # the papers' defaults' keys (issue 28 item 2) reach the struct this binding mirrors
        self.assertEqual(kvprune.Config(MODEL, "policy=snapkv budget=12 obs_window=4 max_new=5").get("max_new"), 5)
        h2o = kvprune.Config(MODEL, "policy=h2o budget=8 prompt_scores=window obs_window=4")
        self.assertEqual(h2o.get("prompt_scores"), 1)
        self.assertEqual(h2o.get("obs_window"), 4)
        # issue 32's random baseline: its keys sit after prompt_scores in the mirrored struct
        rnd = kvprune.Config(MODEL, "policy=random budget=6 seed=9 keep_prompt=0")
        self.assertEqual((rnd.get("seed"), rnd.get("keep_prompt"), rnd.get("budget")), (9, 0, 6))
        tri = kvprune.Config(MODEL, "policy=triattention budget=6 beta=3 tri_mode=per_head")
        self.assertEqual((tri.get("policy"), tri.get("beta"), tri.get("budget"), tri.get("tri_mode")),
                         (kvprune.POLICY_TRIATTENTION, 3, 6, 1))
        # kvp_query_stats_set: 16 NeoX channels = 8 units; tri_stats=given only
        given = kvprune.Cache(MODEL, "policy=triattention budget=6 beta=3 tri_stats=given")
        given.query_stats_set(1, 3, [0.1] * 16, [0.5] * 8)
        with self.assertRaises(KvpError) as e:
            given.query_stats_set(0, 0, [0.1] * 16, [0.5] * 7)
        self.assertEqual(e.exception.status, kvprune.ERR_ARG)
        with self.assertRaises(KvpError) as e:
            kvprune.Cache(MODEL, "policy=triattention").query_stats_set(0, 0, [0.1] * 16, [0.5] * 8)
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)
        prompt = toks(Rng(0x5EED0028), 40)
        one, chunked = kvprune.Cache(MODEL, spec), kvprune.Cache(MODEL, spec)
        prefill_all(one, prompt)
        for at in range(0, 40, 7):
            n = min(7, 40 - at)
            part = (prompt[0][at * NQ * HD:(at + n) * NQ * HD], prompt[1][at * NKV * HD:(at + n) * NKV * HD],
                    prompt[2][at * NKV * HD:(at + n) * NKV * HD])
            prefill_all(chunked, part)
        self.assertEqual(chunked.layer_len(0), 40)  # held whole until the prompt ends
        one.prompt_end()
        chunked.prompt_end()
        self.assertEqual(one.layer_len(0), 12)
        self.assertEqual(kept(one), kept(chunked))
        self.assertEqual(chunked.layer_stats(0).prompt_early, 0)
        self.assertEqual(decode_bits(one, 5), decode_bits(chunked, 5))



if __name__ == "__main__":
    unittest.main()
