"""The suites' deterministic inputs: xorshift64, multiples of 2^-9 in [-1, 1), the same stream
as the Rust and Go suites'."""
import array


class Rng:
    def __init__(self, seed):
        self.s = seed

    def next(self):
        x = self.s
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        self.s = x
        return ((x >> 54) - 512) / 512.0

    def vec(self, n):
        return array.array("f", [self.next() for _ in range(n)])
