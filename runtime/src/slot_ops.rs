//! The stateful ops' bookkeeping, written once for every backend over [`LogStore`]: which
//! log a slot holds, that it ends where the batch starts, that the rows a batch reads are
//! still kept, and which rows each op hands on. The CPU executor's logs are host memory
//! (`RowLog`), the CUDA executor's device memory (`cuda::DeviceLog`), where a batch's rows
//! are appended by device copies and handed on as views into the log.
//!
//! The compressor's gather from the logs is a kernel (`ds4_ir::kernels::compress`), run
//! by every backend; the tests below hold it to a plain loop over the logs' rows.

use crate::exec::ExecError;
use crate::state::{LogStore, SessionState, SlotState};
use ds4_ir::Bind;

/// The slot's state, made by `new` on first use.
fn slot_state<L: LogStore>(state: &mut SessionState<L>, slot: usize, new: impl FnOnce() -> SlotState<L>) -> Result<&mut SlotState<L>, ExecError> {
    let n = state.slots.len();
    let s = state.slots.get_mut(slot).ok_or_else(|| ExecError::Internal(format!("slot {slot} of a state with {n}")))?;
    Ok(s.get_or_insert_with(new))
}

/// `WindowKv`: `x` ([T, wd]) joins the log; the rows the batch attends over are the kept
/// rows of earlier batches that its first token can still see, then `x`.
pub fn window_kv<'s, L: LogStore>(state: &'s mut SessionState<L>, slot: usize, window: usize, wd: usize, x: L::Src<'_>, bind: Bind, label: &str) -> Result<L::View<'s>, ExecError> {
    let st = slot_state(state, slot, || SlotState::Window { window, log: L::new(wd) })?;
    let SlotState::Window { log, .. } = st else { return Err(ExecError::Internal(format!("slot {slot} is not a window"))) };
    if log.end() != bind.pos0 {
        return Err(ExecError::Internal(format!("{label}: window state ends at {}, batch starts at {}", log.end(), bind.pos0)));
    }
    let from = bind.pos0 - bind.window_prior(window);
    if from < log.first() {
        return Err(ExecError::Internal(format!("{label}: window rows were trimmed")));
    }
    log.push(x)?;
    log.rows(from, bind.pos0 + bind.tokens).ok_or_else(|| ExecError::Internal(format!("{label}: window rows missing after the push")))
}

/// What a batch's new compressed rows (`first_row .. first_row + n_rows`) read from a
/// compressor's logs: the kv and gate rows of tokens `first ..`, the batch's included.
pub struct PoolLogs<V> {
    pub kv: V,
    pub gate: V,
    pub first: usize,
    pub first_row: usize,
    pub n_rows: usize,
}

/// `CompressPool`'s logs: the batch's projections (`kvc`, `gc`: [T, cw]) join them; the
/// tokens the new rows pool (their own windows and, CSA, the one before each).
#[allow(clippy::too_many_arguments)]
pub fn compress_log<'s, L: LogStore>(
    state: &'s mut SessionState<L>,
    slot: usize,
    ratio: usize,
    overlap: bool,
    cw: usize,
    kvc: L::Src<'_>,
    gc: L::Src<'_>,
    n_rows: usize,
    bind: Bind,
    label: &str,
) -> Result<PoolLogs<L::View<'s>>, ExecError> {
    let st = slot_state(state, slot, || SlotState::CompressLog { ratio, kv: L::new(cw), gate: L::new(cw) })?;
    let SlotState::CompressLog { kv, gate, .. } = st else { return Err(ExecError::Internal(format!("slot {slot} is not a compressor log"))) };
    if kv.end() != bind.pos0 || gate.end() != bind.pos0 {
        return Err(ExecError::Internal(format!("{label}: compressor log ends at {}, batch starts at {}", kv.end(), bind.pos0)));
    }
    let first_row = bind.pos0 / ratio;
    let end = (first_row + n_rows) * ratio;
    let first = match (n_rows, overlap) {
        (0, _) => end,
        (_, true) => first_row.saturating_sub(1) * ratio,
        (_, false) => first_row * ratio,
    };
    if first < kv.first() {
        return Err(ExecError::Internal(format!("{label}: token {first} left the compressor log")));
    }
    kv.push(kvc)?;
    gate.push(gc)?;
    let missing = || ExecError::Internal(format!("{label}: tokens {first}..{end} missing from the compressor log"));
    Ok(PoolLogs { kv: kv.rows(first, end).ok_or_else(missing)?, gate: gate.rows(first, end).ok_or_else(missing)?, first, first_row, n_rows })
}

/// Slots a compressed row pools: its window's `ratio` tokens, and with `overlap` (CSA)
/// the previous window's too.
pub fn pool_slots(ratio: usize, overlap: bool) -> usize {
    if overlap {
        2 * ratio
    } else {
        ratio
    }
}

/// `RowCache`: appends the batch's new rows; every row so far.
pub fn row_cache<'s, L: LogStore>(state: &'s mut SessionState<L>, slot: usize, ratio: usize, wd: usize, x: L::Src<'_>, bind: Bind, label: &str) -> Result<L::View<'s>, ExecError> {
    let st = slot_state(state, slot, || SlotState::Rows { ratio, rows: L::new(wd) })?;
    let SlotState::Rows { rows, .. } = st else { return Err(ExecError::Internal(format!("slot {slot} is not a row cache"))) };
    if rows.end() != bind.pos0 / ratio {
        return Err(ExecError::Internal(format!("{label}: {} cached rows, expected {}", rows.end(), bind.pos0 / ratio)));
    }
    rows.push(x)?;
    rows.rows(0, rows.end()).ok_or_else(|| ExecError::Internal(format!("{label}: compressed rows were trimmed")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grow_log::host::VecBuf;
    use crate::grow_log::GrowLog;
    use crate::state::RowLog;
    use ds4_ir::kernels::compress;
    use ds4_ir::rng::Rng;
    use ds4_ir::Real;

    /// What `compress_pool` needs for a batch's new rows: kv and gate (+ ape) values
    /// gathered into `[rows, slots, wd]`, absent slots with gate -inf.
    pub struct PoolInputs<F> {
        pub kv: Vec<F>,
        pub gate: Vec<F>,
        pub slots: usize,
    }

    /// Every new row's slots, gathered from the logs' rows (`ape`: [ratio, cw]).
    pub fn compress_gather<F: Real>(logs: &PoolLogs<&[F]>, ape: &[F], ratio: usize, overlap: bool, wd: usize) -> PoolInputs<F> {
        let r = ratio;
        let cw = if overlap { 2 * wd } else { wd };
        let slots = pool_slots(r, overlap);
        let mut skv = vec![F::zero(); logs.n_rows * slots * wd];
        let mut sg = vec![F::neg_infinity(); logs.n_rows * slots * wd];
        for j in 0..logs.n_rows {
            let i = logs.first_row + j;
            for s in 0..slots {
                // (token, channel offset within the c·w projection)
                let (tok, half) = if overlap {
                    if s < r {
                        if i == 0 {
                            continue;
                        }
                        ((i - 1) * r + s, 0)
                    } else {
                        (i * r + s - r, wd)
                    }
                } else {
                    (i * r + s, 0)
                };
                let kr = &logs.kv[(tok - logs.first) * cw..][..cw];
                let gr = &logs.gate[(tok - logs.first) * cw..][..cw];
                let ar = &ape[(tok % r) * cw..][..cw];
                let o = (j * slots + s) * wd;
                for c in 0..wd {
                    skv[o + c] = kr[half + c];
                    sg[o + c] = gr[half + c] + ar[half + c];
                }
            }
        }
        PoolInputs { kv: skv, gate: sg, slots }
    }

    fn same(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// The `compress_gather` kernel (its Rust body in f64, and the CPU kernel rendered from
    /// its IR in f32) gives exactly what the host gather gives: HCA and CSA, row 0 and
    /// later rows, one or several new rows, logs that start before the oldest token read.
    #[test]
    fn the_gather_kernel_matches_the_host_gather() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..500 {
            let (ratio, wd, n_rows) = (r.range(1, 6), r.range(1, 7), r.range(1, 5));
            let overlap = case % 2 == 0;
            let first_row = if case % 3 == 0 { 0 } else { r.range(1, 9) };
            let lowest = if overlap { first_row.saturating_sub(1) * ratio } else { first_row * ratio };
            let first = lowest - r.range(0, 4).min(lowest);
            let (slots, cw) = (pool_slots(ratio, overlap), if overlap { 2 * wd } else { wd });
            let tokens = (first_row + n_rows) * ratio - first;
            let (kv, gate, ape) = (r.f32_floats(tokens * cw, -2.0, 2.0), r.f32_floats(tokens * cw, -2.0, 2.0), r.f32_floats(ratio * cw, -2.0, 2.0));
            let want = compress_gather(&PoolLogs { kv: &kv[..], gate: &gate[..], first, first_row, n_rows }, &ape, ratio, overlap, wd);
            assert_eq!(want.slots, slots);
            let per_row = slots * wd;
            let mut got = vec![7.25; 2 * n_rows * per_row];
            for (item, o) in got.chunks_mut(per_row).enumerate() {
                compress::compress_gather(item, o, &kv, &gate, &ape, n_rows, first_row, first, ratio, slots, wd);
            }
            let (got_kv, got_gate) = got.split_at(n_rows * per_row);
            assert!(same(got_kv, &want.kv) && same(got_gate, &want.gate), "case {case}: f64 body differs");

            let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let (kv32, gate32, ape32) = (f32s(&kv), f32s(&gate), f32s(&ape));
            let want32 = compress_gather(&PoolLogs { kv: &kv32[..], gate: &gate32[..], first, first_row, n_rows }, &ape32, ratio, overlap, wd);
            let mut got32 = vec![7.25f32; 2 * n_rows * per_row];
            for (item, o) in got32.chunks_mut(per_row).enumerate() {
                crate::cpu_kernels::compress_gather::compress_gather(item, o, &kv32, &gate32, &ape32, n_rows, first_row, first, ratio, slots, wd);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&got32), bits(&[want32.kv, want32.gate].concat()), "case {case}: f32 CPU kernel differs");
        }
    }

    /// One graph run's stateful ops over two backends' logs: what each op hands on.
    struct Slots {
        window: usize,
        ratios: [(usize, bool); 2],
    }

    const WD: usize = 3;

    impl Slots {
        /// Runs a batch of `t` tokens at `pos0` (inputs from `seed`): window rows, each
        /// compressor's gathered inputs and each row cache's rows, then the trim.
        fn run<L: LogStore>(&self, state: &mut SessionState<L>, pos0: usize, t: usize, seed: u64, rows_of: impl Fn(L::View<'_>) -> Vec<f64>, src: impl Fn(&[f64]) -> L::Src<'_>) -> Result<Vec<Vec<f64>>, String> {
            let bind = Bind { pos0, tokens: t };
            let mut r = Rng(seed);
            let mut outs = Vec::new();
            let x = r.f32_floats(t * WD, -2.0, 2.0);
            outs.push(rows_of(window_kv(state, 0, self.window, WD, src(&x), bind, "win").map_err(|e| e.to_string())?));
            for (c, &(ratio, overlap)) in self.ratios.iter().enumerate() {
                let cw = if overlap { 2 * WD } else { WD };
                let (kvc, gc, ape) = (r.f32_floats(t * cw, -2.0, 2.0), r.f32_floats(t * cw, -2.0, 2.0), r.f32_floats(ratio * cw, -2.0, 2.0));
                let n_rows = (pos0 + t) / ratio - pos0 / ratio;
                let (kv, gate, first, first_row) = {
                    let logs = compress_log(state, 1 + 2 * c, ratio, overlap, cw, src(&kvc), src(&gc), n_rows, bind, "pool").map_err(|e| e.to_string())?;
                    (rows_of(logs.kv), rows_of(logs.gate), logs.first, logs.first_row)
                };
                let p = compress_gather(&PoolLogs { kv: &kv[..], gate: &gate[..], first, first_row, n_rows }, &ape, ratio, overlap, WD);
                outs.push([p.kv, p.gate].concat());
                let pooled = r.f32_floats(n_rows * WD, -2.0, 2.0);
                outs.push(rows_of(row_cache(state, 2 + 2 * c, ratio, WD, src(&pooled), bind, "cache").map_err(|e| e.to_string())?));
            }
            state.trim(pos0 + t);
            Ok(outs)
        }
    }

    /// The bookkeeping over device-style logs (`GrowLog`, here over host buffers) hands on
    /// exactly what it hands on over `RowLog`: decode steps, long batches, rewinds after
    /// either, trims with a small `max_rewind`, and the same errors.
    #[test]
    fn grow_logs_and_row_logs_agree_through_batches_rewinds_and_trims() {
        let mut r = Rng(0x1234_5678_9abc_def1);
        for (trial, max_rewind) in [0, 3, 7, 40].into_iter().enumerate() {
            let slots = Slots { window: 4 + trial, ratios: [(4, true), (3 + trial % 2, false)] };
            let mut host: SessionState<RowLog<f64>> = SessionState::new(5, max_rewind);
            let mut dev: SessionState<GrowLog<VecBuf>> = SessionState::new(5, max_rewind);
            // Trims follow the furthest end reached: a rewind may not go below it by more
            // than max_rewind, however it is split (as `Session::rewind` needs).
            let (mut pos, mut reached) = (0usize, 0usize);
            for step in 0..400 {
                let floor = reached.saturating_sub(max_rewind);
                if pos > floor && r.range(0, 6) == 0 {
                    pos -= r.range(1, pos - floor + 1);
                    host.truncate(pos);
                    dev.truncate(pos);
                }
                let t = match r.range(0, 10) {
                    0 => r.range(20, 130),
                    1..=3 => r.range(2, 9),
                    _ => 1,
                };
                let seed = r.next() | 1;
                let a = slots.run(&mut host, pos, t, seed, |v| v.to_vec(), |x| x);
                let b = slots.run(&mut dev, pos, t, seed, |v| v, |x| x);
                match (&a, &b) {
                    (Ok(a), Ok(b)) => assert!(a.iter().zip(b).all(|(x, y)| same(x, y)), "trial {trial} step {step}: outputs differ"),
                    _ => assert_eq!(a, b, "trial {trial} step {step}"),
                }
                a.unwrap_or_else(|e| panic!("trial {trial} step {step}: {e}"));
                pos += t;
                reached = reached.max(pos);
            }
        }
    }

    #[test]
    fn a_batch_that_does_not_continue_the_log_is_an_error() {
        let mut st: SessionState<GrowLog<VecBuf>> = SessionState::new(1, 0);
        let x = [1.0, 2.0];
        window_kv(&mut st, 0, 4, 2, &x[..], Bind { pos0: 0, tokens: 1 }, "w").unwrap();
        let e = window_kv(&mut st, 0, 4, 2, &x[..], Bind { pos0: 5, tokens: 1 }, "w").err().unwrap();
        assert!(e.to_string().contains("window state ends at 1, batch starts at 5"), "{e}");
        let e = row_cache(&mut st, 0, 4, 2, &x[..], Bind { pos0: 1, tokens: 1 }, "c").err().unwrap();
        assert!(e.to_string().contains("slot 0 is not a row cache"), "{e}");
        let e = window_kv(&mut st, 3, 4, 2, &x[..], Bind { pos0: 0, tokens: 1 }, "w").err().unwrap();
        assert!(e.to_string().contains("slot 3"), "{e}");
    }
}
