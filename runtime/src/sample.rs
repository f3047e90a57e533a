//! Sampling the next token: greedy, or temperature with top-p and min-p filtering, from
//! a seeded generator so runs repeat.

#[derive(Clone, Debug)]
pub struct SamplerOptions {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// Keep tokens with probability ≥ min_p × the top probability.
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions { temperature: 0.0, top_p: 1.0, min_p: 0.05, seed: 0 }
    }
}

impl SamplerOptions {
    /// Why these options cannot sample, if they cannot: a temperature that is a finite
    /// number ≥ 0, top-p in (0, 1], min-p in [0, 1] (as the server checks a request's; a
    /// NaN or out-of-range value would pick noise without saying so). Names the option as
    /// `name` calls it (`--top-p`, `top_p`).
    pub fn check(&self, name: impl Fn(&str) -> String) -> Result<(), String> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(format!("{} is {t}; it must be a finite number, 0 or more (0: greedy)", name("temperature")));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("{} is {}; it must be in (0, 1]", name("top_p"), self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("{} is {}; it must be in [0, 1]", name("min_p"), self.min_p));
        }
        Ok(())
    }
}

pub struct Sampler {
    opts: SamplerOptions,
    state: u64,
}

/// The arg-max, lowest index on ties; NaNs are never picked, and 0 is where nothing beats
/// −∞ (the device's pick, `ds4_codegen::cuda_argmax`, is the same).
pub fn argmax(logits: &[f32]) -> usize {
    let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            (best, best_v) = (i, v);
        }
    }
    best
}

impl Sampler {
    pub fn new(opts: SamplerOptions) -> Sampler {
        let state = opts.seed ^ 0x9E37_79B9_7F4A_7C15;
        Sampler { opts, state }
    }

    /// splitmix64: small, fast, good enough for sampling.
    fn next_f32(&mut self) -> f32 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    pub fn sample(&mut self, logits: &[f32]) -> usize {
        if self.opts.temperature <= 0.0 || logits.len() < 2 {
            return argmax(logits);
        }
        let t = self.opts.temperature;
        let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<(usize, f32)> = logits.iter().enumerate().map(|(i, &l)| (i, ((l - mx) / t).exp())).collect();
        let sum: f32 = probs.iter().map(|p| p.1).sum();
        for p in &mut probs {
            p.1 /= sum;
        }
        probs.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal).then(a.0.cmp(&b.0)));
        let top = probs[0].1;
        let mut kept = Vec::new();
        let mut cum = 0.0;
        for &(i, p) in &probs {
            if p < self.opts.min_p * top {
                break;
            }
            kept.push((i, p));
            cum += p;
            if cum >= self.opts.top_p {
                break;
            }
        }
        let total: f32 = kept.iter().map(|p| p.1).sum();
        let mut r = self.next_f32() * total;
        for &(i, p) in &kept {
            if r < p {
                return i;
            }
            r -= p;
        }
        kept.last().map(|p| p.0).unwrap_or(probs[0].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options that cannot sample are named with their value; the defaults and the ends of
    /// each range pass.
    #[test]
    fn check_refuses_what_cannot_sample() {
        let ok = |t: f32, p: f32, m: f32| SamplerOptions { temperature: t, top_p: p, min_p: m, seed: 0 }.check(|n| format!("--{n}"));
        assert!(SamplerOptions::default().check(|n| n.into()).is_ok());
        assert!(ok(0.0, 1.0, 0.0).is_ok() && ok(5.0, 1e-6, 1.0).is_ok());
        for (t, p, m, what) in [(f32::NAN, 1.0, 0.0, "--temperature is NaN"), (-0.5, 1.0, 0.0, "--temperature is -0.5"), (f32::INFINITY, 1.0, 0.0, "--temperature is inf"), (1.0, 0.0, 0.0, "--top_p is 0"), (1.0, 1.5, 0.0, "--top_p is 1.5"), (1.0, f32::NAN, 0.0, "--top_p is NaN"), (1.0, 1.0, 2.0, "--min_p is 2"), (1.0, 1.0, -0.1, "--min_p is -0.1")] {
            let e = ok(t, p, m).unwrap_err();
            assert!(e.starts_with(what), "{e}");
        }
    }

    #[test]
    fn argmax_skips_nans_and_keeps_the_lowest_index() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        assert_eq!(argmax(&[nan, 1.0, 3.0, 3.0]), 2);
        assert_eq!(argmax(&[1.0, nan, 0.5]), 0);
        assert_eq!(argmax(&[-inf, -inf, nan]), 0, "nothing beats -inf");
        assert_eq!(argmax(&[-1.0, inf, inf]), 1);
        assert_eq!(argmax(&[]), 0);
    }
    #[test]
    fn greedy_and_seeded() {
        let l = [0.1, 2.0, 2.0, -1.0];
        assert_eq!(argmax(&l), 1);
        let mut s = Sampler::new(SamplerOptions::default());
        assert_eq!(s.sample(&l), 1);
        let o = SamplerOptions { temperature: 1.0, seed: 7, ..Default::default() };
        let a: Vec<usize> = { let mut s = Sampler::new(o.clone()); (0..20).map(|_| s.sample(&l)).collect() };
        let b: Vec<usize> = { let mut s = Sampler::new(o); (0..20).map(|_| s.sample(&l)).collect() };
        assert_eq!(a, b);
        // min-p 0.05 drops a token far below the top.
        let l2 = [10.0, 0.0];
        let mut s = Sampler::new(SamplerOptions { temperature: 1.0, seed: 1, ..Default::default() });
        assert!((0..100).all(|_| s.sample(&l2) == 0));
    }
}
