//! The weight loop of the mat-vec and the matmul: how a thread walks a weight row.
//!
//! A thread takes *runs* of [`RUN`] consecutive elements. Inside a run the declaration's
//! lets are emitted inline, each at its level: the per-block and per-sub-block ones once,
//! the per-element ones for each of the run's elements (the loop is unrolled in the
//! source, so element `j` is a literal where it can be). The dot product uses the
//! factored form of the element value (see [`Factored`]): `Σ (a·e_j + o)·x_j` is
//! `a·Σ e_j·x_j + o·Σ x_j`, one fused multiply-add per element and token instead of the
//! two or three multiplications of the declared expression (the same reassociation the
//! CPU's dot products use). De-quantization itself (`ds4_dq`, the embedding rows) keeps
//! the declared expression and its exact rounding.
//!
//! Runs are one of two shapes:
//! - inside a sub-block (`sub_block` a multiple of [`RUN`]): the block/sub-block lets and
//!   the factored scale once per run, x loaded in vectors where the target has them;
//! - across blocks (`block_elems` divides [`RUN`]: F32, F16, BF16): every element is its
//!   own block; nothing to factor, but the run still amortises the loop and indexing,
//!   and a tail loop takes the last `k % RUN` elements.
//!
//! Other layouts take runs of one sub-block.
//!
//! Reading a staged copy (`Lower::words`), a run's bytes of a byte array or byte table
//! read at `X + j` (X the same for the whole run: Q8_0's `qs[j]`, Q2_K's packed values,
//! IQ2_XXS's grid and sign bytes) are consecutive: they are read once per run as words
//! (`run_byte_words`), and each element takes its byte from a register. On the GPU a
//! byte load per element was most of the mat-vec's shared-memory traffic.

use super::{Lower, Reads, Word};
use ds4_ir::quant::{BinOp, Expr, Level, Ty};

/// Elements a thread takes at a time.
pub const RUN: u64 = 8;

/// `value = scale · elem (± offset)`, split by what each factor depends on.
pub struct Factored<'a> {
    /// Factors that do not depend on the element (empty: 1).
    pub scale: Vec<&'a Expr>,
    /// Factors that do (never empty).
    pub elem: Vec<&'a Expr>,
    /// A term that does not depend on the element, added (false) or subtracted (true).
    pub offset: Option<(bool, &'a Expr)>,
}

/// How a weight row is walked (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// Runs of `run` elements inside one sub-block.
    InSub { run: u64 },
    /// Runs of [`RUN`] elements spanning `RUN / block_elems` blocks.
    Blocks,
}

impl Shape {
    /// How `spec`'s rows are walked.
    pub(super) fn of(spec: &ds4_ir::quant::QuantSpec) -> Shape {
        let (be, sb) = (spec.block_elems as u64, spec.sub_block as u64);
        if sb % RUN == 0 {
            Shape::InSub { run: RUN }
        } else if RUN.is_multiple_of(be) && be.is_multiple_of(sb) {
            Shape::Blocks
        } else {
            Shape::InSub { run: sb }
        }
    }
}

/// One token's share of a run: the offset of its x row and its accumulator.
pub struct Token {
    pub xo: String,
    pub acc: String,
}

/// How the threads of a kernel share a stretch of a weight row: thread runs `first`,
/// `first + stride`, .. over `elems` elements (whole blocks) whose first block starts at
/// byte `bytes_at` of the lowering's byte buffer and whose first element is element
/// `x_at` of each x row.
pub struct Walk<'w> {
    pub first: &'w str,
    pub stride: &'w str,
    pub elems: &'w str,
    pub bytes_at: &'w str,
    pub x_at: &'w str,
}

impl Walk<'_> {
    /// A block's threads over the whole row at `row_base` (the generic mat-vec and matmul).
    pub fn whole_row(stride: &str) -> Walk<'_> {
        Walk { first: "ds4_tid", stride, elems: "k", bytes_at: "row_base", x_at: "" }
    }

    /// `xo + x_at + e` as text (x_at left out when empty).
    fn x_index(&self, xo: &str, e: &str) -> String {
        if self.x_at.is_empty() {
            format!("{xo} + {e}")
        } else {
            format!("{xo} + {} + {e}", self.x_at)
        }
    }
}

impl Lower<'_> {
    /// What `e` depends on: the element (`j` or an element let), the sub-block, or only
    /// the block.
    pub(super) fn level(&self, e: &Expr) -> Level {
        match *e {
            Expr::Int(..) | Expr::F32(_) | Expr::Field(..) => Level::Block,
            Expr::Sub => Level::Sub,
            Expr::Lane => Level::Elem,
            Expr::Var(name, _) => self.spec.let_(name).map_or(Level::Elem, |l| l.level),
            _ => e.children().into_iter().map(|c| self.level(c)).max().unwrap_or(Level::Block),
        }
    }

    /// The factored form of the element value, None when nothing depends on the element.
    pub(super) fn factored(&self) -> Option<Factored<'static>> {
        let value: &'static Expr = self.spec.value;
        let per_elem = |e: &Expr| self.level(e) == Level::Elem;
        let (product, offset) = match *value {
            Expr::Binary(op @ (BinOp::Add | BinOp::Sub), Ty::F32, a, b) if per_elem(a) && !per_elem(b) => (a, Some((op == BinOp::Sub, b))),
            Expr::Binary(BinOp::Add, Ty::F32, a, b) if !per_elem(a) && per_elem(b) => (b, Some((false, a))),
            _ => (value, None),
        };
        fn flatten(e: &'static Expr, out: &mut Vec<&'static Expr>) {
            match *e {
                Expr::Binary(BinOp::Mul, Ty::F32, a, b) => {
                    flatten(a, out);
                    flatten(b, out);
                }
                _ => out.push(e),
            }
        }
        let mut factors = Vec::new();
        flatten(product, &mut factors);
        let (elem, scale): (Vec<_>, Vec<_>) = factors.into_iter().partition(|f| per_elem(f));
        if elem.is_empty() {
            return None;
        }
        Some(Factored { scale, elem, offset })
    }

    /// `e` as a read of a byte array or a byte table at `X + j` (X not per element).
    fn byte_run_of(&self, e: &Expr) -> Option<ByteRun> {
        let (table, name, t, i) = match *e {
            Expr::Load(name, t, i) => (false, name, t, i),
            // Tables only from their shared-memory copies (padded for word reads).
            Expr::Table(name, t, i) if self.shared_tables => (true, name, t, i),
            _ => return None,
        };
        if t.bytes() != 1 {
            return None;
        }
        let x = match *i {
            Expr::Lane => None,
            Expr::Binary(BinOp::Add, _, x, Expr::Lane) | Expr::Binary(BinOp::Add, _, Expr::Lane, x) if self.level(x) != Level::Elem => Some(x),
            _ => return None,
        };
        Some(ByteRun { table, name, x })
    }

    /// The byte reads a run hoists (see the module comment), in the order they first
    /// appear in the element's lets and value; none unless the weights are read in words
    /// and runs hold whole words.
    fn run_byte_reads(&self, run: u64) -> Vec<ByteRun> {
        fn walk(l: &Lower, e: &'static Expr, out: &mut Vec<ByteRun>) {
            if let Some(r) = l.byte_run_of(e) {
                if !out.contains(&r) {
                    out.push(r);
                }
                return;
            }
            for c in e.children() {
                walk(l, c, out);
            }
        }
        let mut out = Vec::new();
        if !self.words() || !run.is_multiple_of(4) {
            return out;
        }
        for l in self.spec.lets.iter().filter(|l| l.level == Level::Elem) {
            walk(self, l.value, &mut out);
        }
        walk(self, self.spec.value, &mut out);
        // Read in place (`Reads::Aligned`), a run's words must be aligned ones: a funnel
        // shift's second word could lie past the last block.
        if self.reads == Reads::Aligned {
            out.retain(|r| r.table || self.byte_run_align(r, run).is_multiple_of(4));
        }
        out
    }

    /// Bytes the first byte of a hoisted read is known to be a multiple of, for weights
    /// read in place (1 otherwise: tables and staged copies are read through funnel
    /// shifts).
    fn byte_run_align(&self, r: &ByteRun, run: u64) -> u64 {
        let Some(f) = self.spec.field(r.name).filter(|_| !r.table && self.reads == Reads::Aligned) else { return 1 };
        let mut a = super::gcd(self.block_align(), f.offset as u64);
        if let Some(x) = r.x {
            a = super::gcd(a, self.known_multiple(x));
        }
        if run != self.spec.sub_block as u64 {
            // `uj`: the run's first element in its sub-block, a multiple of the run.
            a = super::gcd(a, run);
        }
        a
    }

    /// Declarations of the run's hoisted byte words: read `k`'s bytes from the run's
    /// first element are `ds4_rw<k>_0`, `ds4_rw<k>_1`, .. (four a word).
    fn run_byte_words(&self, run: u64) -> Result<Vec<String>, super::QuantGenError> {
        let s = self.syn;
        let mut out = Vec::new();
        for (k, r) in self.run_byte_reads(run).into_iter().enumerate() {
            let (buf, mut start) = if r.table {
                (format!("S_{}", r.name), self.idx(0))
            } else {
                let f = self.spec.field(r.name).ok_or_else(|| super::QuantGenError(format!("no field {}", r.name)))?;
                (self.wbuf.to_string(), format!("ds4_blk + {}", self.idx(f.offset as u64)))
            };
            if let Some(x) = r.x {
                start += &format!(" + {}", s.cast(self.iw(), &self.expr(x)?));
            }
            if run != self.spec.sub_block as u64 {
                start += &format!(" + {}", s.cast(self.iw(), "uj"));
            }
            out.push(s.decl(&format!("ds4_ra{k}"), self.iw(), false, &start));
            for w in 0..run / 4 {
                let at = format!("ds4_ra{k} + {}", self.idx(4 * w));
                // Read in place, the word is aligned (`run_byte_reads` keeps no other).
                let word = if self.reads == Reads::Aligned && !r.table { s.aligned_load(&buf, &at, 4) } else { s.word32(&buf, &at) };
                let word = word.ok_or_else(|| super::QuantGenError("word reads without word32 / aligned_load".into()))?;
                out.push(s.decl(&format!("ds4_rw{k}_{w}"), Word::U32, false, &word));
            }
        }
        Ok(out)
    }

    /// Inside a run (`run_elem`), a hoisted byte read as (its word's name, its byte there).
    pub(super) fn run_byte_at(&self, e: &Expr) -> Option<(String, u64)> {
        let jr = self.run_elem?;
        let read = self.byte_run_of(e)?;
        let run = match self.shape() {
            Shape::InSub { run } => run,
            Shape::Blocks => return None,
        };
        let k = self.run_byte_reads(run).iter().position(|r| *r == read)?;
        Some((format!("ds4_rw{k}_{}", jr / 4), jr % 4))
    }

    /// Inside a run (`run_elem`), a hoisted byte read as its byte of the run's words.
    pub(super) fn run_byte(&self, e: &Expr, t: Ty) -> Option<String> {
        let (word, at) = self.run_byte_at(e)?;
        let byte = format!("(({word} >> {}) & {})", self.u32(8 * at), self.u32(0xFF));
        Some(if t == Ty::I8 { self.wrap(t, self.syn.cast(Word::I32, &byte)) } else { byte })
    }

    pub(super) fn shape(&self) -> Shape {
        Shape::of(self.spec)
    }

    /// The product of `factors` as one expression (`1.0` for none).
    fn product(&self, factors: &[&Expr]) -> Result<String, super::QuantGenError> {
        if factors.is_empty() {
            return Ok(self.f32_const(1.0));
        }
        let parts = factors.iter().map(|f| self.expr(f)).collect::<Result<Vec<_>, _>>()?;
        Ok(format!("({})", parts.join(" * ")))
    }

    /// Declarations of the lets at `level`, in declaration order.
    fn lets_at(&self, level: Level) -> Result<Vec<String>, super::QuantGenError> {
        let s = self.syn;
        self.spec
            .lets
            .iter()
            .filter(|l| l.level == level)
            .map(|l| Ok(s.decl(&format!("v_{}", l.name), super::word_of(l.ty), false, &self.expr(l.value)?)))
            .collect()
    }

    /// Lines (depth, text) walking a weight row as `walk` says: each token's
    /// `acc += W[row] · x[xo ..]`.
    pub(super) fn weight_runs(&self, walk: &Walk, tokens: &[Token]) -> Result<Vec<(usize, String)>, super::QuantGenError> {
        self.rows_runs(walk, tokens, &[self.wbuf])
    }

    /// As `weight_runs`, for several rows at once that read the same x: row r's bytes are
    /// in `rows[r]` (at the walk's `bytes_at` in each) and token t's sum for it goes to
    /// `acc[r]` (`acc` alone for one row). Each x element is loaded once for all rows:
    /// a decode mat-vec's x traffic, four times its weight traffic for Q8_0 with one row
    /// a warp, is what bounds it (`cuda_matvec.rs`).
    pub(super) fn rows_runs(&self, walk: &Walk, tokens: &[Token], rows: &[&'static str]) -> Result<Vec<(usize, String)>, super::QuantGenError> {
        let s = self.syn;
        let x = s.buffer("x");
        let (be, bb) = (self.idx(self.spec.block_elems as u64), self.idx(self.spec.block_bytes as u64));
        let acc = |tok: &Token, r: usize| if rows.len() == 1 { tok.acc.clone() } else { format!("{}[{r}]", tok.acc) };
        let shape = self.shape();
        let run = match shape {
            Shape::InSub { run } => run,
            Shape::Blocks => RUN,
        };
        let mut out = vec![
            (0, format!("{} {{", s.for_header(self.iw(), "u", walk.first, &format!("{} / {}", walk.elems, self.idx(run)), walk.stride))),
            (1, s.decl("e0", self.iw(), false, &format!("u * {}", self.idx(run)))),
        ];
        // x of each token: vectors of four where the target has them and runs are aligned
        // (inside a sub-block, `xo + e0` is a multiple of the run).
        let vectors = matches!(shape, Shape::InSub { run } if run % 4 == 0) && s.load_f32x4("v", &x, "0").is_some();
        for (t, tok) in tokens.iter().enumerate() {
            for jj in 0..run {
                let name = format!("x{t}_{jj}");
                if vectors {
                    let q = format!("xq{t}_{}", jj / 4);
                    if jj % 4 == 0 {
                        let at = walk.x_index(&tok.xo, &format!("e0 + {}", self.idx(jj)));
                        out.push((1, s.load_f32x4(&q, &x, &at).unwrap_or_default()));
                    }
                    out.push((1, s.decl(&name, Word::F32, false, &s.vec4_lane(&q, jj % 4))));
                } else {
                    out.push((1, s.decl(&name, Word::F32, false, &format!("{x}[{}]", walk.x_index(&tok.xo, &format!("e0 + {}", self.idx(jj)))))));
                }
            }
        }
        // Several rows: each row's lines in a scope of their own (the same names).
        let scoped = rows.len() > 1;
        let d0 = usize::from(scoped);
        match shape {
            Shape::InSub { run } => {
                let f = self.factored();
                for (r, &wbuf) in rows.iter().enumerate() {
                    let me = Lower { wbuf, ..*self };
                    if scoped {
                        out.push((1, "{".into()));
                    }
                    let mut row = Vec::new();
                    me.run_open(run, "e0", walk.bytes_at, &mut row)?;
                    let scale = match &f {
                        Some(f) => me.product(&f.scale)?,
                        None => me.f32_const(1.0),
                    };
                    let offset = match &f {
                        Some(Factored { offset: Some((neg, o)), .. }) => Some((*neg, me.expr(o)?)),
                        _ => None,
                    };
                    for (t, _) in tokens.iter().enumerate() {
                        row.push((1, s.decl(&format!("ea{t}"), Word::F32, true, &me.f32_const(0.0))));
                        if offset.is_some() {
                            row.push((1, s.decl(&format!("es{t}"), Word::F32, true, &me.f32_const(0.0))));
                        }
                    }
                    for jj in 0..run {
                        let el = me.run_element_open(run, jj, &mut row)?;
                        let elem = match &f {
                            Some(f) => el.product(&f.elem)?,
                            None => el.expr(me.spec.value)?,
                        };
                        row.push((2, s.decl("ev", Word::F32, false, &elem)));
                        for (t, _) in tokens.iter().enumerate() {
                            row.push((2, format!("ea{t} = {};", s.fma("ev", &format!("x{t}_{jj}"), &format!("ea{t}")))));
                            if offset.is_some() {
                                row.push((2, format!("es{t} = es{t} + x{t}_{jj};")));
                            }
                        }
                        row.push((1, "}".into()));
                    }
                    row.push((1, s.decl("rsc", Word::F32, false, &scale)));
                    if let Some((neg, o)) = &offset {
                        let o = if *neg { format!("(-{o})") } else { o.clone() };
                        row.push((1, s.decl("rso", Word::F32, false, &o)));
                    }
                    for (t, tok) in tokens.iter().enumerate() {
                        let a = acc(tok, r);
                        let mut total = s.fma("rsc", &format!("ea{t}"), &a);
                        if offset.is_some() {
                            total = s.fma("rso", &format!("es{t}"), &total);
                        }
                        row.push((1, format!("{a} = {total};")));
                    }
                    out.extend(row.into_iter().map(|(d, l)| (d + d0, l)));
                    if scoped {
                        out.push((1, "}".into()));
                    }
                }
                out.push((0, "}".into()));
            }
            Shape::Blocks => {
                // Element jj of the run is element (jj % be) of block jj / be: all literals.
                let (be_n, sb_n) = (self.spec.block_elems as u64, self.spec.sub_block as u64);
                out.push((1, s.decl("ub", self.iw(), false, &format!("{} + (e0 / {be}) * {bb}", walk.bytes_at))));
                for jj in 0..RUN {
                    for (r, &wbuf) in rows.iter().enumerate() {
                        let me = Lower { wbuf, ..*self };
                        out.push((1, "{".into()));
                        out.push((2, s.decl("ds4_blk", self.iw(), false, &format!("ub + {}", self.idx(jj / be_n * self.spec.block_bytes as u64)))));
                        out.push((2, s.decl("s", Word::U32, false, &self.u32(jj % be_n / sb_n))));
                        out.push((2, s.decl("j", Word::U32, false, &self.u32(jj % be_n % sb_n))));
                        for level in [Level::Block, Level::Sub, Level::Elem] {
                            for l in me.lets_at(level)? {
                                out.push((2, l));
                            }
                        }
                        out.push((2, s.decl("wv", Word::F32, false, &me.expr(self.spec.value)?)));
                        for (t, tok) in tokens.iter().enumerate() {
                            let a = acc(tok, r);
                            out.push((2, format!("{a} = {};", s.fma("wv", &format!("x{t}_{jj}"), &a))));
                        }
                        out.push((1, "}".into()));
                    }
                }
                out.push((0, "}".into()));
                // The last elems % RUN elements, one per thread.
                let tail_start = format!("({e} / {r}) * {r} + {}", walk.first, e = walk.elems, r = self.idx(RUN));
                out.push((0, format!("{} {{", s.for_header(self.iw(), "e", &tail_start, walk.elems, walk.stride))));
                for (r, &wbuf) in rows.iter().enumerate() {
                    let me = Lower { wbuf, ..*self };
                    let wv = if scoped { format!("wv{r}") } else { "wv".into() };
                    out.push((1, s.decl(&wv, Word::F32, false, &me.dq_call(walk.bytes_at, "e"))));
                    for tok in tokens {
                        let a = acc(tok, r);
                        out.push((1, format!("{a} = {};", s.fma(&wv, &format!("{x}[{}]", walk.x_index(&tok.xo, "e")), &a))));
                    }
                }
                out.push((0, "}".into()));
            }
        }
        Ok(out)
    }
}

impl Lower<'_> {
    /// Lines that de-quantize `count` consecutive elements of the row at `row_base`,
    /// from element `e0` (a variable; a multiple of `count`, and `count` of the run):
    /// `store(i, v)` for element `e0 + i` with value `v`, zero past `k`. The declared
    /// expression and its rounding, lets hoisted to their level (as in `weight_runs`).
    pub(super) fn value_runs(&self, count: u64, store: &dyn Fn(u64, &str) -> String) -> Result<Vec<(usize, String)>, super::QuantGenError> {
        let s = self.syn;
        let (be, bb, sb) = (self.idx(self.spec.block_elems as u64), self.idx(self.spec.block_bytes as u64), self.idx(self.spec.sub_block as u64));
        let mut out = Vec::new();
        match self.shape() {
            Shape::Blocks => {
                // Element by element (each may be past k when k is not a multiple of RUN).
                for i in 0..count {
                    out.push((0, "{".into()));
                    out.push((1, s.decl("ea", self.iw(), false, &format!("e0 + {}", self.idx(i)))));
                    out.push((1, "if (ea < k) {".into()));
                    out.push((2, s.decl("ds4_blk", self.iw(), false, &format!("row_base + (ea / {be}) * {bb}"))));
                    out.push((2, s.decl("s", Word::U32, false, &s.cast(Word::U32, &format!("((ea % {be}) / {sb})")))));
                    out.push((2, s.decl("j", Word::U32, false, &s.cast(Word::U32, &format!("((ea % {be}) % {sb})")))));
                    for level in [Level::Block, Level::Sub, Level::Elem] {
                        for l in self.lets_at(level)? {
                            out.push((2, l));
                        }
                    }
                    out.push((2, s.decl("wv", Word::F32, false, &self.expr(self.spec.value)?)));
                    out.push((2, store(i, "wv")));
                    out.push((1, "} else {".into()));
                    out.push((2, store(i, &self.f32_const(0.0))));
                    out.push((1, "}".into()));
                    out.push((0, "}".into()));
                }
            }
            Shape::InSub { run } => {
                let value = |el: &Lower, i: u64| -> Result<Vec<String>, super::QuantGenError> {
                    Ok(vec![s.decl("wv", Word::F32, false, &el.expr(self.spec.value)?), store(i, "wv")])
                };
                out = self.sub_runs(run, count, &|| Ok(Vec::new()), &value)?;
            }
        }
        Ok(out)
    }

    /// Lines that de-quantize the element *terms* of `count` consecutive elements of the
    /// row at `row_base` from element `e0` (as `value_runs`), for a product that applies
    /// the scale and offset afterwards (`Factored`): `store(i, t)` for element `e0 + i`
    /// with term `t`, and `scale(sc, off)` once, the factored scale and offset (None:
    /// none) of element `e0`, which hold for all `count` elements when `count` divides
    /// [`Lower::scale_span`]. Only for `Shape::InSub` layouts with a factored value.
    pub(super) fn term_runs(&self, count: u64, store: &dyn Fn(u64, &str) -> String, scale: &dyn Fn(&str, Option<&str>) -> String) -> Result<Vec<(usize, String)>, super::QuantGenError> {
        let s = self.syn;
        let (Shape::InSub { run }, Some(f)) = (self.shape(), self.factored()) else {
            return Err(super::QuantGenError(format!("{:?}: no element terms to de-quantize", self.spec.ggml)));
        };
        let first = || -> Result<Vec<String>, super::QuantGenError> {
            let mut l = vec![s.decl("rsc", Word::F32, false, &self.product(&f.scale)?)];
            let off = match f.offset {
                Some((neg, o)) => {
                    let o = self.expr(o)?;
                    l.push(s.decl("rso", Word::F32, false, &if neg { format!("(-{o})") } else { o }));
                    Some("rso")
                }
                None => None,
            };
            l.push(scale("rsc", off));
            Ok(l)
        };
        let term = |el: &Lower, i: u64| -> Result<Vec<String>, super::QuantGenError> { Ok(vec![s.decl("ev", Word::F32, false, &el.product(&f.elem)?), store(i, "ev")]) };
        self.sub_runs(run, count, &first, &term)
    }

    /// `count` elements from `e0` in runs of `run` inside sub-blocks: each run's block and
    /// sub-block lets and hoisted byte words, `first` once (in the first run, after its
    /// lets), then `elem(el, i)` for element `e0 + i` (`el` lowers inside the run).
    #[allow(clippy::type_complexity)]
    fn sub_runs(
        &self,
        run: u64,
        count: u64,
        first: &dyn Fn() -> Result<Vec<String>, super::QuantGenError>,
        elem: &dyn Fn(&Lower, u64) -> Result<Vec<String>, super::QuantGenError>,
    ) -> Result<Vec<(usize, String)>, super::QuantGenError> {
        let s = self.syn;
        let mut out = Vec::new();
        for q in 0..count / run {
            out.push((0, "{".into()));
            out.push((1, s.decl("ea", self.iw(), false, &format!("e0 + {}", self.idx(q * run)))));
            self.run_open(run, "ea", "row_base", &mut out)?;
            if q == 0 {
                out.extend(first()?.into_iter().map(|l| (1, l)));
            }
            for jj in 0..run {
                let el = self.run_element_open(run, jj, &mut out)?;
                out.extend(elem(&el, q * run + jj)?.into_iter().map(|l| (2, l)));
                out.push((1, "}".into()));
            }
            out.push((0, "}".into()));
        }
        Ok(out)
    }

    /// Opens a run of `run` elements inside a sub-block whose first element is `e` (a
    /// variable) of the row whose blocks start at `base`: its block, sub-block and
    /// position in the sub-block, the block and sub-block lets, the hoisted byte words
    /// (depth 1 in `out`).
    fn run_open(&self, run: u64, e: &str, base: &str, out: &mut Vec<(usize, String)>) -> Result<(), super::QuantGenError> {
        let s = self.syn;
        let (be, bb, sb) = (self.idx(self.spec.block_elems as u64), self.idx(self.spec.block_bytes as u64), self.idx(self.spec.sub_block as u64));
        out.push((1, s.decl("ds4_blk", self.iw(), false, &format!("{base} + ({e} / {be}) * {bb}"))));
        out.push((1, s.decl("s", Word::U32, false, &s.cast(Word::U32, &format!("(({e} % {be}) / {sb})")))));
        if run != self.spec.sub_block as u64 {
            out.push((1, s.decl("uj", Word::U32, false, &s.cast(Word::U32, &format!("({e} % {sb})")))));
        }
        for l in self.lets_at(Level::Block)?.into_iter().chain(self.lets_at(Level::Sub)?).chain(self.run_byte_words(run)?) {
            out.push((1, l));
        }
        Ok(())
    }

    /// Opens element `jj` of a run of `run` inside a sub-block: `{`, its `j` and its
    /// element lets into `out`; the lowering that reads the run's hoisted bytes for it
    /// (the caller adds the element's use and the closing brace).
    fn run_element_open(&self, run: u64, jj: u64, out: &mut Vec<(usize, String)>) -> Result<Lower<'_>, super::QuantGenError> {
        out.push((1, "{".into()));
        let j = if run == self.spec.sub_block as u64 { self.u32(jj) } else { format!("uj + {}", self.u32(jj)) };
        out.push((2, self.syn.decl("j", Word::U32, false, &j)));
        let el = Lower { run_elem: Some(jj), ..*self };
        for l in el.lets_at(Level::Elem)? {
            out.push((2, l));
        }
        Ok(el)
    }

    /// The values the factored element term can take (the product of the element
    /// factors, multiplied in the order `product` lowers them), when they are few.
    pub(super) fn term_values(&self) -> Option<Vec<f32>> {
        let f = self.factored()?;
        let mut acc = vec![1.0f32];
        for (i, e) in f.elem.iter().enumerate() {
            let vals = ds4_ir::quant::values::values(self.spec, e)?;
            acc = if i == 0 { vals } else { acc.iter().flat_map(|a| vals.iter().map(move |v| a * v)).collect() };
            acc.sort_by_key(|v| v.to_bits());
            acc.dedup_by_key(|v| v.to_bits());
            if acc.len() > ds4_ir::quant::values::MAX_VALUES {
                return None;
            }
        }
        Some(acc)
    }

    /// Whether every element term is exact in bf16 (finite, its low 16 bits zero): a
    /// tensor core then multiplies it without splitting it.
    pub(super) fn terms_exact_in_bf16(&self) -> bool {
        self.term_values().is_some_and(|v| v.iter().all(|t| t.is_finite() && t.to_bits() & 0xFFFF == 0))
    }

    /// Elements over which the factored scale and offset stay the same, from the start of
    /// a block: the block when they depend on no sub-block, else `sub_block · c` where
    /// every use of `s` in them (through their lets) is `s / c'` with `c | c'` (IQ2_XXS:
    /// its scale reads `s / 4`, so it holds for 4 sub-blocks of 8). 0 when nothing is
    /// factored.
    pub(super) fn scale_span(&self) -> u64 {
        fn divisors(l: &Lower, e: &'static Expr, out: &mut Vec<u64>) {
            match *e {
                Expr::Binary(BinOp::Div, _, Expr::Sub, Expr::Int(_, c)) => out.push(*c),
                Expr::Sub => out.push(1),
                Expr::Var(n, _) => {
                    if let Some(let_) = l.spec.let_(n) {
                        divisors(l, let_.value, out)
                    }
                }
                _ => e.children().into_iter().for_each(|c| divisors(l, c, out)),
            }
        }
        let Some(f) = self.factored() else { return 0 };
        let mut ds = Vec::new();
        for e in f.scale.iter().copied().chain(f.offset.map(|o| o.1)) {
            divisors(self, e, &mut ds);
        }
        let (be, sb) = (self.spec.block_elems as u64, self.spec.sub_block as u64);
        match ds.into_iter().reduce(super::gcd) {
            None => be,
            Some(c) => super::gcd(sb * c, be),
        }
    }
}

/// A byte array field (or a byte table's shared copy) read at `x + j` in a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct ByteRun {
    table: bool,
    name: &'static str,
    x: Option<&'static Expr>,
}

/// Two reads are the same when they read the same bytes (offsets compared as text).
impl PartialEq for ByteRun {
    fn eq(&self, o: &Self) -> bool {
        self.table == o.table && self.name == o.name && self.x.map(|x| x.to_string()) == o.x.map(|x| x.to_string())
    }
}
