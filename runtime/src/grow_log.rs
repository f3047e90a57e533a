//! A [`LogStore`] in one growable buffer, for backends whose rows live where the host
//! cannot cheaply reach them (the CUDA executor's `DeviceLog`): appends are buffer copies,
//! and a batch's rows are handed on as a view into the buffer, never copied out.
//!
//! Rows `first .. first + len` sit at buffer rows `start ..`. Trimming only moves `start`
//! (the rows before it are dead). When a push finds no room after the live rows, they
//! move: to the front of the same buffer if the dead prefix is larger than they are (the
//! two ranges then do not overlap), else to a new buffer of twice the capacity. A decode
//! step, one row in and one row trimmed, so copies its live rows once every ~len steps.
//! A buffer more than [`SHRINK_BELOW`] times larger than what a push needs (a long prompt
//! grew it, the window then trimmed it) is replaced by one of twice that: a session does
//! not keep the memory of its largest batch.
//!
//! The buffer operations are the backend's ([`RowBuffer`]); this file is the arithmetic,
//! checked on the host against `RowLog` (tests below and in `slot_ops`).

use crate::exec::ExecError;
use crate::state::{check_whole_rows, LogStore};

/// Rows a new buffer holds at least (a decode step pushes one at a time).
const MIN_ROWS: usize = 64;

/// A push that needs less than 1/SHRINK_BELOW of the buffer (and the buffer is larger than
/// a minimal one of twice that) moves the live rows to a buffer of twice what it needs.
const SHRINK_BELOW: usize = 8;

/// One buffer of elements of fixed capacity, where a [`GrowLog`] keeps its rows.
pub trait RowBuffer: Sized {
    /// Rows to append, as the backend holds them.
    type Src<'a>;
    /// Part of the buffer, handed to the next op.
    type View;
    /// Elements in `src`.
    fn src_len(src: &Self::Src<'_>) -> usize;
    /// A new buffer of `elems` elements, next to `src` (on its device).
    fn alloc(src: &Self::Src<'_>, elems: usize) -> Result<Self, ExecError>;
    /// Capacity in elements.
    fn capacity(&self) -> usize;
    /// Copies `n` elements of `src` from `from` to `at`. `src` may be this buffer; the
    /// two ranges never overlap.
    fn copy(&self, at: usize, src: &Self, from: usize, n: usize) -> Result<(), ExecError>;
    /// Copies all of `src` to `at`.
    fn write(&self, at: usize, src: &Self::Src<'_>) -> Result<(), ExecError>;
    /// Elements [at, at + n).
    fn view(&self, at: usize, n: usize) -> Self::View;
    fn bytes(&self) -> usize;
}

/// A log in one growable buffer (see the module docs).
pub struct GrowLog<B> {
    width: usize,
    first: usize,
    /// The first kept row's row in `buf`.
    start: usize,
    /// Kept rows.
    len: usize,
    /// None until the first push.
    buf: Option<B>,
}

impl<B: RowBuffer> GrowLog<B> {
    /// Capacity in rows.
    fn cap(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.capacity() / self.width)
    }

    /// A buffer with room for `n` more rows after the live ones (moved if needed), and the
    /// element where those rows go. On an error (no memory) the log is as it was.
    fn make_room(&mut self, n: usize, src: &B::Src<'_>) -> Result<(&B, usize), ExecError> {
        let (w, cap) = (self.width, self.cap());
        let need = self.len + n;
        let fits = self.start + need <= cap;
        let compact = self.start > self.len && need <= cap;
        let shrink = cap > SHRINK_BELOW * need && cap > 2 * MIN_ROWS;
        // Rows of the new buffer the live rows move to, if they move to one.
        let new_rows = match &self.buf {
            Some(_) if shrink => Some(2 * need),
            Some(_) if fits => None,
            Some(b) if compact => {
                b.copy(0, b, self.start * w, self.len * w)?;
                self.start = 0;
                None
            }
            _ => Some((2 * cap).max(need)),
        };
        if let Some(rows) = new_rows {
            let new = B::alloc(src, rows.max(MIN_ROWS) * w)?;
            if let Some(old) = &self.buf {
                new.copy(0, old, self.start * w, self.len * w)?;
            }
            self.buf = Some(new);
            self.start = 0;
        }
        let at = (self.start + self.len) * w;
        self.buf.as_ref().map(|b| (b, at)).ok_or_else(|| ExecError::Internal("a log without a buffer after making room".into()))
    }
}

impl<B: RowBuffer> LogStore for GrowLog<B> {
    type Src<'a> = B::Src<'a>;
    type View<'a>
        = B::View
    where
        B: 'a;

    fn new(width: usize) -> Self {
        GrowLog { width, first: 0, start: 0, len: 0, buf: None }
    }
    fn first(&self) -> usize {
        self.first
    }
    fn end(&self) -> usize {
        self.first + self.len
    }
    /// A push always leaves a buffer (even of zero rows), so that `rows` has one to view.
    fn push(&mut self, rows: B::Src<'_>) -> Result<(), ExecError> {
        let elems = B::src_len(&rows);
        check_whole_rows(elems, self.width)?;
        let n = elems / self.width;
        let (buf, at) = self.make_room(n, &rows)?;
        buf.write(at, &rows)?;
        self.len += n;
        Ok(())
    }
    fn rows(&self, a: usize, b: usize) -> Option<B::View> {
        if a < self.first || b > self.end() || a > b {
            return None;
        }
        let buf = self.buf.as_ref()?;
        Some(buf.view((self.start + a - self.first) * self.width, (b - a) * self.width))
    }
    fn truncate(&mut self, end: usize) {
        if end < self.end() {
            self.len = end.saturating_sub(self.first);
        }
    }
    fn trim_front(&mut self, from: usize) {
        if from > self.first {
            let dead = from.min(self.end()) - self.first;
            self.first += dead;
            self.start += dead;
            self.len -= dead;
        }
    }
    fn bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.bytes())
    }
}

/// A host [`RowBuffer`] for tests: checks the promises `GrowLog` makes to a backend
/// (copies in bounds, never overlapping) and counts the buffers it allocates.
#[cfg(test)]
pub mod host {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    thread_local! {
        pub static ALLOCS: Cell<usize> = const { Cell::new(0) };
    }

    #[derive(Clone)]
    pub struct VecBuf(pub Rc<RefCell<Vec<f64>>>);

    impl RowBuffer for VecBuf {
        type Src<'a> = &'a [f64];
        type View = Vec<f64>;
        fn src_len(src: &&[f64]) -> usize {
            src.len()
        }
        fn alloc(_: &&[f64], elems: usize) -> Result<Self, ExecError> {
            ALLOCS.with(|a| a.set(a.get() + 1));
            // NaN: a read of a never-written element shows.
            Ok(VecBuf(Rc::new(RefCell::new(vec![f64::NAN; elems]))))
        }
        fn capacity(&self) -> usize {
            self.0.borrow().len()
        }
        fn copy(&self, at: usize, src: &Self, from: usize, n: usize) -> Result<(), ExecError> {
            if Rc::ptr_eq(&self.0, &src.0) {
                assert!(at + n <= from || from + n <= at, "overlapping copy {from}..+{n} to {at}");
            }
            let part = src.0.borrow()[from..from + n].to_vec();
            self.0.borrow_mut()[at..at + n].copy_from_slice(&part);
            Ok(())
        }
        fn write(&self, at: usize, src: &&[f64]) -> Result<(), ExecError> {
            self.0.borrow_mut()[at..at + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn view(&self, at: usize, n: usize) -> Vec<f64> {
            self.0.borrow()[at..at + n].to_vec()
        }
        fn bytes(&self) -> usize {
            self.capacity() * 8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host::{VecBuf, ALLOCS};
    use super::*;
    use crate::state::RowLog;

    /// Random pushes (one row, or long batches), truncations and trims: the same rows as
    /// `RowLog` after every step, and growth that stays within a constant of the live rows.
    #[test]
    fn grow_log_keeps_the_rows_a_row_log_keeps() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: usize| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) as usize % n
        };
        let w = 3;
        let (mut g, mut r) = (GrowLog::<VecBuf>::new(w), RowLog::<f64>::new(w));
        let (mut value, mut most) = (0.0, 0);
        for step in 0..3000 {
            match next(10) {
                0..=5 => {
                    let n = if next(8) == 0 { 1 + next(200) } else { next(2) };
                    let rows: Vec<f64> = (0..n * w).map(|_| { value += 1.0; value }).collect();
                    g.push(&rows).unwrap();
                    r.push(&rows).unwrap();
                }
                6 => {
                    let end = r.end().saturating_sub(next(8));
                    g.truncate(end);
                    r.truncate(end);
                }
                _ => {
                    let from = r.first() + next(r.end() - r.first() + 2);
                    g.trim_front(from);
                    r.trim_front(from);
                }
            }
            assert_eq!((g.first(), g.end()), (r.first(), r.end()), "step {step}");
            most = most.max(g.len);
            assert_eq!(g.rows(g.first(), g.end()), r.rows(r.first(), r.end()).map(|s| s.to_vec()), "step {step}");
            if g.end() > g.first() {
                let a = g.first() + next(g.end() - g.first());
                assert_eq!(g.rows(a, g.end()), r.rows(a, r.end()).map(|s| s.to_vec()), "step {step}");
            }
            assert_eq!(g.rows(g.first().wrapping_sub(1), g.end()), None);
            assert_eq!(g.rows(g.first(), g.end() + 1), None);
            // A buffer grows to at most 4× the live rows of the push that needed it.
            assert!(g.cap() <= 4 * most.max(MIN_ROWS), "step {step}: capacity {} for at most {most} rows", g.cap());
        }
    }

    /// Decode: one row in, the oldest out. After warming up, no more buffers, and the
    /// live rows move only when the dead prefix outgrows them.
    #[test]
    fn a_sliding_log_settles_in_one_buffer() {
        let w = 2;
        let mut g = GrowLog::<VecBuf>::new(w);
        let keep = 100;
        let start = ALLOCS.with(|a| a.get());
        let allocs = || ALLOCS.with(|a| a.get()) - start;
        for p in 0..5000usize {
            g.push(&[p as f64, -(p as f64)]).unwrap();
            g.trim_front((p + 1).saturating_sub(keep));
            assert_eq!(g.rows(g.end() - 1, g.end()), Some(vec![p as f64, -(p as f64)]));
        }
        assert!(allocs() <= 3, "{} buffers for a log of {keep} rows", allocs());
        let all: Vec<f64> = (4900..5000).flat_map(|p| [p as f64, -(p as f64)]).collect();
        assert_eq!(g.rows(4900, 5000), Some(all));
    }

    /// A long batch, then the window trims the log: the next push moves the live rows to a
    /// buffer sized for them, and they read back unchanged.
    #[test]
    fn a_buffer_shrinks_after_the_window_trims_a_long_batch() {
        let w = 2;
        let mut g = GrowLog::<VecBuf>::new(w);
        let rows: Vec<f64> = (0..4000 * w).map(|v| v as f64).collect();
        g.push(&rows).unwrap();
        assert!(g.cap() >= 4000);
        g.trim_front(3900);
        g.push(&[-1.0, -2.0]).unwrap();
        assert!(g.cap() <= 2 * 101usize.max(MIN_ROWS), "capacity {} for 101 rows", g.cap());
        let mut want: Vec<f64> = (3900 * w..4000 * w).map(|v| v as f64).collect();
        want.extend([-1.0, -2.0]);
        assert_eq!(g.rows(3900, 4001), Some(want));
        // Decode from here on does not shrink or grow again.
        let before = ALLOCS.with(|a| a.get());
        for p in 0..1000usize {
            g.push(&[p as f64, 0.0]).unwrap();
            g.trim_front(g.end() - 101);
        }
        assert!(ALLOCS.with(|a| a.get()) - before <= 1);
    }

    #[test]
    fn an_empty_push_leaves_a_buffer_to_view() {
        let mut g = GrowLog::<VecBuf>::new(4);
        assert_eq!(g.rows(0, 0), None);
        g.push(&[]).unwrap();
        assert_eq!(g.rows(0, 0), Some(vec![]));
        assert!(g.push(&[1.0, 2.0]).is_err(), "half a row");
    }
}
