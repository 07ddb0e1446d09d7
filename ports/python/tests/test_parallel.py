"""Issue 30 through the Python binding: the host's parallel-for (thread_pool=host, set_parallel)
gives the bits of one thread, is called, and None restores the default."""
import os
import struct
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

LAYERS, NQ, NKV, HD = 2, 4, 2, 32
MODEL = kvprune.Model(LAYERS, NQ, NKV, HD)
PROMPT, DECODES = 24, 4


def cache(spec):
    """KVP_PAR_WORK=0 (read at create): every call with 2+ threads goes on all of them."""
    old = os.environ.get("KVP_PAR_WORK")
    os.environ["KVP_PAR_WORK"] = "0"
    try:
        return kvprune.Cache(MODEL, "policy=full capacity=64 " + spec)
    finally:
        if old is None:
            del os.environ["KVP_PAR_WORK"]
        else:
            os.environ["KVP_PAR_WORK"] = old


def run_bits(c):
    """Output bits of a prefill and a few decodes in every layer, then the kept positions."""
    r = Rng(0x30000030)
    bits = []
    q, k, v = r.vec(PROMPT * NQ * HD), r.vec(PROMPT * NKV * HD), r.vec(PROMPT * NKV * HD)
    for layer in range(LAYERS):
        out = c.prefill(layer, q, k, v)
        bits += struct.unpack("%dI" % len(out), out.tobytes())
    for _ in range(DECODES):
        for layer in range(LAYERS):
            out = c.decode(layer, r.vec(NQ * HD), r.vec(NKV * HD), r.vec(NKV * HD))
            bits += struct.unpack("%dI" % len(out), out.tobytes())
    for layer in range(LAYERS):
        for h in range(NKV):
            bits += c.layer_positions(layer, h)
    return bits


class Counting:
    """A parallel-for that counts its calls: on threads (t 1..n-1, t 0 on the caller) or in a row,
    the last t first."""

    def __init__(self, threads):
        self.threads = threads
        self.calls = 0
        self.sizes = set()

    def __call__(self, n, run):
        self.calls += 1
        self.sizes.add(n)
        if not self.threads:
            for t in reversed(range(n)):
                run(t)
            return
        ths = [threading.Thread(target=run, args=(t,)) for t in range(1, n)]
        for th in ths:
            th.start()
        run(0)
        for th in ths:
            th.join()


class ParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with cache("threads=1") as c:
            cls.want = run_bits(c)

    def test_thread_pool_key(self):
        cfg = kvprune.Config(MODEL, "thread_pool=host")
        self.assertEqual((cfg.get("thread_pool"), cfg._raw.thread_pool), (kvprune.THREAD_POOL_HOST,) * 2)
        self.assertEqual(kvprune.Config(MODEL).get("thread_pool"), kvprune.THREAD_POOL_OWN)
        with self.assertRaises(KvpError) as e:
            kvprune.Config(MODEL, "thread_pool=theirs")
        self.assertEqual(e.exception.status, kvprune.ERR_CONFIG)

    def test_threads_and_serial_give_the_bits_of_one_thread(self):
        for spec, threads in (("threads=3 thread_pool=host", True), ("threads=3 thread_pool=host", False),
                              ("threads=3", False)):
            with self.subTest(spec=spec, threads=threads), cache(spec) as c:
                fn = Counting(threads)
                c.set_parallel(fn)
                self.assertEqual(run_bits(c), self.want)
                self.assertGreater(fn.calls, 0)
                self.assertTrue(fn.sizes <= {2, 3}, fn.sizes)

    def test_none_restores_and_misuse(self):
        with cache("threads=3 thread_pool=host") as c:
            fn = Counting(True)
            c.set_parallel(fn)
            run_bits(c)
            calls = fn.calls
            self.assertGreater(calls, 0)
            # None: the caller alone again, same bits, no more calls; kept across reset
            c.set_parallel(None)
            c.reset()
            self.assertEqual(run_bits(c), self.want)
            self.assertEqual(fn.calls, calls)
            # a function that skips every task: the binding runs them
            c.set_parallel(lambda n, run: None)
            c.reset()
            self.assertEqual(run_bits(c), self.want)

            # what the function raises comes out of the cache call, after it completed
            def twice(n, run):
                for t in range(n):
                    run(t)
                run(0)

            c.set_parallel(twice)
            c.reset()
            with self.assertRaisesRegex(RuntimeError, "run twice"):
                run_bits(c)
            c.set_parallel(Counting(True))
            c.reset()
            self.assertEqual(run_bits(c), self.want)
        # threads=1 never calls it; a closed cache is ERR_STATE
        with cache("threads=1 thread_pool=host") as one:
            def never(n, run):
                raise AssertionError("called with threads=1")
            one.set_parallel(never)
            self.assertEqual(run_bits(one), self.want)
        with self.assertRaises(KvpError) as e:
            one.set_parallel(Counting(True))
        self.assertEqual(e.exception.status, kvprune.ERR_STATE)


if __name__ == "__main__":
    unittest.main()
