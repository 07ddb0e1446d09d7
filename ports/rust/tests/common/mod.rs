//! Shared by the integration tests (`mod common;`): deterministic inputs, multiples of 2^-9 in
//! [-1, 1) from xorshift64, the same stream as the Python and Go suites'.
#![allow(dead_code)]

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 54) as i32 - 512) as f32 / 512.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}
