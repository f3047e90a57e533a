//! Per-session state of the stateful ops, one entry per graph slot: the sliding-window KV
//! rows, each compressor's log of per-token projections (the partial window and, for CSA,
//! the previous window's A halves are read from it), and the compressed rows.
//!
//! Logs keep `max_rewind` extra rows so that `rewind(n)` can drop the last n positions
//! and the next batch still finds every row it needs.
//!
//! Where a log's rows live is the backend's business ([`LogStore`]): host memory for the
//! CPU executor ([`RowLog`]), device memory for the CUDA executor (`cuda::DeviceLog`). The
//! bookkeeping over them (this file's truncate and trim, `slot_ops`) is written once.

use crate::exec::ExecError;
use ds4_ir::Real;

/// A log of rows of a fixed width, indexed from `first()` (a position or a row number).
pub trait LogStore: Sized {
    /// Rows to append, as the backend holds them.
    type Src<'a>;
    /// Kept rows handed to the next op.
    type View<'a>
    where
        Self: 'a;
    /// An empty log of rows of `width` elements.
    fn new(width: usize) -> Self;
    /// The first kept row's index.
    fn first(&self) -> usize;
    /// One past the last row's index.
    fn end(&self) -> usize;
    /// Appends whole rows.
    fn push(&mut self, rows: Self::Src<'_>) -> Result<(), ExecError>;
    /// Rows [a, b), if they are all kept.
    fn rows(&self, a: usize, b: usize) -> Option<Self::View<'_>>;
    /// Drop rows at or after `end`.
    fn truncate(&mut self, end: usize);
    /// Forget rows before `from`.
    fn trim_front(&mut self, from: usize);
    /// Bytes held, for reporting.
    fn bytes(&self) -> usize;
}

/// Rows in host memory.
#[derive(Clone, Debug, Default)]
pub struct RowLog<F> {
    pub width: usize,
    pub first: usize,
    pub data: Vec<F>,
}

impl<F: Real> LogStore for RowLog<F> {
    type Src<'a> = &'a [F];
    type View<'a>
        = &'a [F]
    where
        F: 'a;

    fn new(width: usize) -> Self {
        RowLog { width, first: 0, data: Vec::new() }
    }
    fn first(&self) -> usize {
        self.first
    }
    fn end(&self) -> usize {
        self.first + self.data.len() / self.width.max(1)
    }
    fn push(&mut self, rows: &[F]) -> Result<(), ExecError> {
        check_whole_rows(rows.len(), self.width)?;
        self.data.extend_from_slice(rows);
        Ok(())
    }
    fn rows(&self, a: usize, b: usize) -> Option<&[F]> {
        if a < self.first || b > self.end() || a > b {
            return None;
        }
        Some(&self.data[(a - self.first) * self.width..(b - self.first) * self.width])
    }
    fn truncate(&mut self, end: usize) {
        if end < self.end() {
            let keep = end.saturating_sub(self.first);
            self.data.truncate(keep * self.width);
        }
    }
    fn trim_front(&mut self, from: usize) {
        if from > self.first {
            // The new first row, computed before the drain changes `end()`.
            let first = from.min(self.end());
            self.data.drain(..(first - self.first) * self.width);
            self.first = first;
        }
    }
    fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<F>()
    }
}

/// `elems` must be whole rows of `width`.
pub fn check_whole_rows(elems: usize, width: usize) -> Result<(), ExecError> {
    if width == 0 || !elems.is_multiple_of(width) {
        return Err(ExecError::Internal(format!("{elems} values are not whole rows of {width}")));
    }
    Ok(())
}

/// The state behind one slot.
#[derive(Clone, Debug)]
pub enum SlotState<L> {
    /// Window KV rows by position.
    Window { window: usize, log: L },
    /// A compressor's per-token kv and gate projections by position.
    CompressLog { ratio: usize, kv: L, gate: L },
    /// Compressed rows by row number (never trimmed: attention reads them all).
    Rows { ratio: usize, rows: L },
}

#[derive(Clone, Debug)]
pub struct SessionState<L> {
    pub slots: Vec<Option<SlotState<L>>>,
    /// How many positions `rewind` may drop.
    pub max_rewind: usize,
}

impl<L: LogStore> SessionState<L> {
    pub fn new(n_slots: usize, max_rewind: usize) -> Self {
        SessionState { slots: (0..n_slots).map(|_| None).collect(), max_rewind }
    }

    /// At least `n` slots (a graph may have more than the session was made with).
    pub fn ensure_slots(&mut self, n: usize) {
        if self.slots.len() < n {
            self.slots.resize_with(n, || None);
        }
    }

    /// Drop everything at or after position `end`.
    pub fn truncate(&mut self, end: usize) {
        for s in self.slots.iter_mut().flatten() {
            match s {
                SlotState::Window { log, .. } => log.truncate(end),
                SlotState::CompressLog { kv, gate, .. } => {
                    kv.truncate(end);
                    gate.truncate(end);
                }
                SlotState::Rows { ratio, rows } => rows.truncate(end / *ratio),
            }
        }
    }

    /// Forget log rows no future batch (after at most `max_rewind` rewound positions) needs.
    pub fn trim(&mut self, end: usize) {
        let keep = self.max_rewind;
        for s in self.slots.iter_mut().flatten() {
            match s {
                SlotState::Window { window, log } => log.trim_front(end.saturating_sub(*window + keep)),
                SlotState::CompressLog { ratio, kv, gate } => {
                    // A new row needs its own window and (CSA) the previous one.
                    let from = (end.saturating_sub(keep) / *ratio).saturating_sub(1) * *ratio;
                    kv.trim_front(from);
                    gate.trim_front(from);
                }
                SlotState::Rows { .. } => {}
            }
        }
    }

    /// Bytes held, for reporting.
    pub fn bytes(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .map(|s| match s {
                SlotState::Window { log, .. } => log.bytes(),
                SlotState::CompressLog { kv, gate, .. } => kv.bytes() + gate.bytes(),
                SlotState::Rows { rows, .. } => rows.bytes(),
            })
            .sum()
    }
}
