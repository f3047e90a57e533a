//! Symbolic shapes. A graph is built once for a layer range; the number of tokens in a
//! batch and the sizes that follow from the batch's position are symbols, bound when the
//! graph runs.

use std::fmt;

/// One dimension of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Known when the graph is built (from GGUF metadata).
    Const(usize),
    /// Tokens in the batch: T.
    Tokens,
    /// Compressed rows of ratio r that close inside the batch:
    /// floor((pos0+T)/r) - floor(pos0/r).
    NewRows(usize),
    /// Compressed rows of ratio r that exist after the batch: floor((pos0+T)/r).
    TotalRows(usize),
    /// Sliding-window keys a batch attends over: the kept earlier rows
    /// min(pos0, window-1) plus the T new ones.
    WindowKeys(usize),
}

/// What a graph's symbols are bound to for one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bind {
    /// Position of the batch's first token.
    pub pos0: usize,
    /// Tokens in the batch.
    pub tokens: usize,
}

impl Bind {
    /// Window rows from before the batch that its first token can still see.
    pub fn window_prior(&self, window: usize) -> usize {
        self.pos0.min(window.saturating_sub(1))
    }
}

impl Dim {
    pub fn eval(self, b: Bind) -> usize {
        match self {
            Dim::Const(n) => n,
            Dim::Tokens => b.tokens,
            Dim::NewRows(r) => (b.pos0 + b.tokens) / r - b.pos0 / r,
            Dim::TotalRows(r) => (b.pos0 + b.tokens) / r,
            Dim::WindowKeys(w) => b.window_prior(w) + b.tokens,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(n) => write!(f, "{n}"),
            Dim::Tokens => f.write_str("T"),
            Dim::NewRows(r) => write!(f, "new_rows/{r}"),
            Dim::TotalRows(r) => write!(f, "rows/{r}"),
            Dim::WindowKeys(w) => write!(f, "win{w}+T"),
        }
    }
}

/// A shape: dims outermost first (row-major; the last dim is contiguous).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn of(dims: &[Dim]) -> Shape {
        Shape(dims.to_vec())
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn last(&self) -> Option<Dim> {
        self.0.last().copied()
    }
    pub fn eval(&self, b: Bind) -> Vec<usize> {
        self.0.iter().map(|d| d.eval(b)).collect()
    }
    /// Product of the constant dims, or None if any dim is symbolic.
    pub fn const_elems(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, d| match d {
            Dim::Const(n) => acc.checked_mul(*n),
            _ => None,
        })
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn symbols_follow_the_batch_position() {
        let b = Bind { pos0: 6, tokens: 5 }; // positions 6..=10
        assert_eq!(Dim::NewRows(4).eval(b), 1); // row 1 closes at position 7
        assert_eq!(Dim::TotalRows(4).eval(b), 2);
        assert_eq!(Dim::WindowKeys(4).eval(b), 3 + 5);
        assert_eq!(Dim::WindowKeys(16).eval(Bind { pos0: 2, tokens: 1 }), 3);
    }
}
