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
    /// A sample of N(0, 1) (Box-Muller on two uniforms in (0, 1), never 0).
    pub fn normal(&mut self) -> f64 {
        let mut open = || ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let (u, v) = (open(), open());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// `n` samples of N(0, 1) as f32, the same for the same `seed` (test and benchmark data).
pub fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n).map(|_| r.normal() as f32).collect()
}
