//! Per-session state of the stateful ops, one entry per graph slot: the sliding-window KV
//! rows, each compressor's log of per-token projections (the partial window and, for CSA,
//! the previous window's A halves are read from it), and the compressed rows.
//!
//! Logs keep `max_rewind` extra rows so that `rewind(n)` can drop the last n positions
//! and the next batch still finds every row it needs.

use ds4_ir::Real;

/// Rows of a fixed width, indexed from `first` (a position or a row number).
#[derive(Clone, Debug, Default)]
pub struct RowLog<F> {
    pub width: usize,
    pub first: usize,
    pub data: Vec<F>,
}

impl<F: Real> RowLog<F> {
    pub fn new(width: usize) -> Self {
        RowLog { width, first: 0, data: Vec::new() }
    }
    /// One past the last row's index.
    pub fn end(&self) -> usize {
        self.first + self.data.len() / self.width.max(1)
    }
    pub fn push(&mut self, rows: &[F]) {
        self.data.extend_from_slice(rows);
    }
    /// Rows [a, b) as one slice, if they are all kept.
    pub fn rows(&self, a: usize, b: usize) -> Option<&[F]> {
        if a < self.first || b > self.end() || a > b {
            return None;
        }
        Some(&self.data[(a - self.first) * self.width..(b - self.first) * self.width])
    }
    pub fn row(&self, i: usize) -> Option<&[F]> {
        self.rows(i, i + 1)
    }
    /// Drop rows at or after `end`.
    pub fn truncate(&mut self, end: usize) {
        if end < self.end() {
            let keep = end.saturating_sub(self.first);
            self.data.truncate(keep * self.width);
        }
    }
    /// Forget rows before `from`.
    pub fn trim_front(&mut self, from: usize) {
        if from > self.first {
            // The new first row, computed before the drain changes `end()`.
            let first = from.min(self.end());
            self.data.drain(..(first - self.first) * self.width);
            self.first = first;
        }
    }
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<F>()
    }
}

/// The state behind one slot.
#[derive(Clone, Debug)]
pub enum SlotState<F> {
    /// Window KV rows by position.
    Window { window: usize, log: RowLog<F> },
    /// A compressor's per-token kv and gate projections by position.
    CompressLog { ratio: usize, kv: RowLog<F>, gate: RowLog<F> },
    /// Compressed rows by row number (never trimmed: attention reads them all).
    Rows { ratio: usize, rows: RowLog<F> },
}

#[derive(Clone, Debug)]
pub struct SessionState<F> {
    pub slots: Vec<Option<SlotState<F>>>,
    /// How many positions `rewind` may drop.
    pub max_rewind: usize,
}

impl<F: Real> SessionState<F> {
    pub fn new(n_slots: usize, max_rewind: usize) -> Self {
        SessionState { slots: vec![None; n_slots], max_rewind }
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
