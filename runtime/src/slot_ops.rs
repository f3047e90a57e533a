//! The stateful ops' bookkeeping, on the host, shared by every backend: which rows a
//! batch's window, compressor and row cache see. The CPU executor runs the math on the
//! result directly; the CUDA executor moves only the rows involved across the bus.
//!
//! TODO(device-state): keep the logs on the device and gather with a kernel.

use crate::exec::ExecError;
use crate::state::{RowLog, SessionState, SlotState};
use ds4_ir::{Bind, Real};

/// `WindowKv`: the kept rows of earlier batches, then `x` ([T, wd]); `x` joins the log.
pub fn window_kv<F: Real>(state: &mut SessionState<F>, slot: usize, window: usize, x: &[F], wd: usize, bind: Bind, label: &str) -> Result<Vec<F>, ExecError> {
    let st = state.slots[slot].get_or_insert_with(|| SlotState::Window { window, log: RowLog::new(wd) });
    let SlotState::Window { log, .. } = st else { return Err(ExecError::Internal(format!("slot {slot} is not a window"))) };
    if log.end() != bind.pos0 {
        return Err(ExecError::Internal(format!("{label}: window state ends at {}, batch starts at {}", log.end(), bind.pos0)));
    }
    let prior = bind.window_prior(window);
    let mut out = log.rows(bind.pos0 - prior, bind.pos0).ok_or_else(|| ExecError::Internal(format!("{label}: window rows were trimmed")))?.to_vec();
    out.extend_from_slice(x);
    log.push(x);
    Ok(out)
}

/// What `compress_pool` needs for a batch's new rows: kv and gate (+ ape) values
/// gathered into `[rows, slots, wd]`, absent slots with gate -inf.
pub struct PoolInputs<F> {
    pub kv: Vec<F>,
    pub gate: Vec<F>,
    pub slots: usize,
}

/// `CompressPool`: logs the batch's projections and gathers every new row's slots.
#[allow(clippy::too_many_arguments)]
pub fn compress_gather<F: Real>(
    state: &mut SessionState<F>,
    slot: usize,
    ratio: usize,
    overlap: bool,
    wd: usize,
    kvc: &[F],
    gc: &[F],
    ape: &[F],
    cw: usize,
    n_rows: usize,
    bind: Bind,
    label: &str,
) -> Result<PoolInputs<F>, ExecError> {
    let r = ratio;
    let st = state.slots[slot].get_or_insert_with(|| SlotState::CompressLog { ratio: r, kv: RowLog::new(cw), gate: RowLog::new(cw) });
    let SlotState::CompressLog { kv, gate, .. } = st else { return Err(ExecError::Internal(format!("slot {slot} is not a compressor log"))) };
    if kv.end() != bind.pos0 {
        return Err(ExecError::Internal(format!("{label}: compressor log ends at {}, batch starts at {}", kv.end(), bind.pos0)));
    }
    kv.push(kvc);
    gate.push(gc);
    let first_row = bind.pos0 / r;
    let slots = if overlap { 2 * r } else { r };
    let mut skv = vec![F::zero(); n_rows * slots * wd];
    let mut sg = vec![F::neg_infinity(); n_rows * slots * wd];
    for j in 0..n_rows {
        let i = first_row + j;
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
            let kr = kv.row(tok).ok_or_else(|| ExecError::Internal(format!("{label}: token {tok} left the compressor log")))?;
            let gr = gate.row(tok).expect("kv and gate logs move together");
            let ar = &ape[(tok % r) * cw..][..cw];
            let o = (j * slots + s) * wd;
            for c in 0..wd {
                skv[o + c] = kr[half + c];
                sg[o + c] = gr[half + c] + ar[half + c];
            }
        }
    }
    Ok(PoolInputs { kv: skv, gate: sg, slots })
}

/// `RowCache`: appends the batch's new rows; every row so far.
pub fn row_cache<'s, F: Real>(state: &'s mut SessionState<F>, slot: usize, ratio: usize, x: &[F], wd: usize, bind: Bind, label: &str) -> Result<&'s [F], ExecError> {
    let st = state.slots[slot].get_or_insert_with(|| SlotState::Rows { ratio, rows: RowLog::new(wd) });
    let SlotState::Rows { rows, .. } = st else { return Err(ExecError::Internal(format!("slot {slot} is not a row cache"))) };
    if rows.end() != bind.pos0 / ratio {
        return Err(ExecError::Internal(format!("{label}: {} cached rows, expected {}", rows.end(), bind.pos0 / ratio)));
    }
    rows.push(x);
    Ok(&rows.data)
}
