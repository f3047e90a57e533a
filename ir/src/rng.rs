//! xorshift64*: deterministic random inputs for tests and checks, without a dependency.

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo) as u64) as usize
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `n` uniform values in `[lo, hi)`.
    pub fn floats(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    /// `n` uniform values in `[lo, hi)` that are f32-representable, so that an f32 and an
    /// f64 computation see identical inputs.
    pub fn f32_floats(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi) as f32 as f64).collect()
    }
    /// True with probability `p`.
    pub fn coin(&mut self, p: f64) -> bool {
        self.uniform(0.0, 1.0) < p
    }
}
