//! Parse the `dequant(s, j) { ... }` body (Rust syntax, via syn) into a typed expression
//! tree: every node gets its type, its level (block / sub-block / element, for hoisting)
//! and, for integers, its value range (for the bounds proofs).
//!
//! The language is a small subset of Rust with Rust's typing rules: no implicit
//! conversions (write `as f32`), integer literals take their type from context, float
//! literals are f32. Integer arithmetic wraps; `/` and `%` only by non-zero constants.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Error, Result};

use super::range::{self, Range};
use super::ty::Ty;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Block,
    Sub,
    Elem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }
}

#[derive(Clone, Debug)]
pub enum Kind {
    Int(i128),
    Float(f32),
    Sub,
    Lane,
    Var(String),
    Field(String),
    Load(String, Box<TExpr>),
    Table(String, Box<TExpr>),
    Unary(UnOp, Box<TExpr>),
    Binary(BinOp, Box<TExpr>, Box<TExpr>),
    Cast(Box<TExpr>),
    Bitcast(Box<TExpr>),
    Select(Box<TExpr>, Box<TExpr>, Box<TExpr>),
}

/// A type-checked node.
#[derive(Clone, Debug)]
pub struct TExpr {
    pub kind: Kind,
    pub ty: Ty,
    pub level: Level,
    /// Value range, for integers and bools.
    pub range: Option<Range>,
}

/// A field of the block layout.
pub struct FieldDecl {
    pub name: String,
    pub ty: Ty,
    pub len: Option<usize>,
    pub offset: usize,
}

/// A constant table the expression may index.
pub struct TableDecl {
    pub name: String,
    pub ty: Ty,
    pub len: usize,
}

/// A checked `let`.
pub struct LetDef {
    pub name: String,
    pub value: TExpr,
}

/// Everything names in the body can refer to.
pub struct Scope<'a> {
    pub fields: &'a [FieldDecl],
    pub tables: &'a [TableDecl],
    pub sub_name: String,
    pub lane_name: String,
    pub sub_blocks: usize,
    pub sub_block: usize,
    pub lets: Vec<LetDef>,
}

fn err<T>(span: Span, msg: impl std::fmt::Display) -> Result<T> {
    Err(Error::new(span, msg))
}

/// An integer or float literal without a suffix (possibly negated or parenthesised): its
/// type comes from the other operand, as in Rust.
fn untyped_literal(e: &syn::Expr) -> bool {
    match e {
        syn::Expr::Lit(l) => match &l.lit {
            syn::Lit::Int(i) => i.suffix().is_empty(),
            syn::Lit::Float(f) => f.suffix().is_empty(),
            _ => false,
        },
        syn::Expr::Paren(p) => untyped_literal(&p.expr),
        syn::Expr::Group(g) => untyped_literal(&g.expr),
        syn::Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => untyped_literal(&u.expr),
        _ => false,
    }
}

fn node(kind: Kind, ty: Ty, level: Level, range: Option<Range>) -> TExpr {
    TExpr {
        kind,
        ty,
        level,
        range,
    }
}

fn parse_ty(t: &syn::Type) -> Result<Ty> {
    if let syn::Type::Path(p) = t {
        if let Some(id) = p.path.get_ident() {
            if let Some(ty) = Ty::from_name(&id.to_string()) {
                return Ok(ty);
            }
        }
    }
    err(
        t.span(),
        "expected one of bool, u8, i8, u16, i16, u32, i32, u64, f16, f32",
    )
}

impl Scope<'_> {
    /// Check the whole body: `let`s, then the final expression (an f32).
    pub fn check_body(&mut self, body: &syn::Block) -> Result<TExpr> {
        let n = body.stmts.len();
        for (k, st) in body.stmts.iter().enumerate() {
            match st {
                syn::Stmt::Local(local) if k + 1 < n => self.check_let(local)?,
                syn::Stmt::Expr(e, None) if k + 1 == n => {
                    let v = self.check(e, Some(Ty::F32))?;
                    if v.ty != Ty::F32 {
                        return err(
                            e.span(),
                            format!(
                                "the de-quantized value must be f32, this is {}",
                                v.ty.name()
                            ),
                        );
                    }
                    return Ok(v);
                }
                _ => {
                    return err(
                        st.span(),
                        "expected `let name = expr;` statements, then the f32 value expression",
                    )
                }
            }
        }
        err(
            body.span(),
            "the body must end with the f32 value expression",
        )
    }

    fn check_let(&mut self, local: &syn::Local) -> Result<()> {
        let (pat, annot) = match &local.pat {
            syn::Pat::Type(pt) => (&*pt.pat, Some(parse_ty(&pt.ty)?)),
            p => (p, None),
        };
        let name = match pat {
            syn::Pat::Ident(pi)
                if pi.by_ref.is_none() && pi.mutability.is_none() && pi.subpat.is_none() =>
            {
                pi.ident.to_string()
            }
            _ => {
                return err(
                    local.pat.span(),
                    "expected `let name = ...` or `let name: type = ...`",
                )
            }
        };
        if name.starts_with("__") {
            return err(
                local.pat.span(),
                "names starting with `__` are reserved for generated code",
            );
        }
        if self.is_defined(&name) {
            return err(
                local.pat.span(),
                format!("`{name}` is already defined (no shadowing: each name means one thing)"),
            );
        }
        let Some(init) = &local.init else {
            return err(local.span(), "a `let` needs a value");
        };
        if init.diverge.is_some() {
            return err(local.span(), "let-else is not supported");
        }
        let value = self.check(&init.expr, annot)?;
        if let Some(t) = annot {
            if value.ty != t {
                return err(
                    init.expr.span(),
                    format!("declared {} but the value is {}", t.name(), value.ty.name()),
                );
            }
        }
        self.lets.push(LetDef { name, value });
        Ok(())
    }

    fn is_defined(&self, name: &str) -> bool {
        name == self.sub_name
            || name == self.lane_name
            || self.fields.iter().any(|f| f.name == name)
            || self.tables.iter().any(|t| t.name == name)
            || self.lets.iter().any(|l| l.name == name)
    }

    /// Type-check `e`. `expect` is only a hint for untyped literals, as in Rust.
    pub fn check(&self, e: &syn::Expr, expect: Option<Ty>) -> Result<TExpr> {
        match e {
            syn::Expr::Paren(p) => self.check(&p.expr, expect),
            syn::Expr::Group(g) => self.check(&g.expr, expect),
            syn::Expr::Lit(l) => self.literal(&l.lit, expect, false),
            syn::Expr::Path(p) => self.path(p),
            syn::Expr::Index(ix) => self.index(ix),
            syn::Expr::Unary(u) => self.unary(u, expect),
            syn::Expr::Binary(b) => self.binary(b, expect),
            syn::Expr::Cast(c) => self.cast(c),
            syn::Expr::Call(c) => self.bitcast_call(c),
            syn::Expr::MethodCall(m) => self.to_bits_call(m),
            syn::Expr::If(i) => self.select(i, expect),
            syn::Expr::Block(b) => self.single(&b.block, expect),
            _ => err(
                e.span(),
                "not in the de-quantization language (literals, names, a[i], arithmetic, \
                 bit operations, comparisons, `as`, f32::from_bits, .to_bits(), if/else)",
            ),
        }
    }

    /// A `{ expr }` block with exactly one expression.
    fn single(&self, b: &syn::Block, expect: Option<Ty>) -> Result<TExpr> {
        match b.stmts.as_slice() {
            [syn::Stmt::Expr(e, None)] => self.check(e, expect),
            _ => err(
                b.span(),
                "a branch holds a single expression (put `let`s before the `if`)",
            ),
        }
    }

    fn literal(&self, lit: &syn::Lit, expect: Option<Ty>, negate: bool) -> Result<TExpr> {
        match lit {
            syn::Lit::Int(i) => {
                let ty = match i.suffix() {
                    "" => match expect {
                        Some(t) if t.is_int() => t,
                        Some(Ty::F32) => {
                            return err(
                                i.span(),
                                "an integer literal is not an f32: write it as a float (2.0)",
                            )
                        }
                        _ => Ty::I32,
                    },
                    s => match Ty::from_name(s) {
                        Some(t) if t.is_int() => t,
                        _ => return err(i.span(), format!("unsupported literal suffix `{s}`")),
                    },
                };
                let mag: u128 = i.base10_parse()?;
                let v = if negate { -(mag as i128) } else { mag as i128 };
                let (lo, hi) = ty.int_range();
                if mag > i128::MAX as u128 || v < lo || v > hi {
                    return err(i.span(), format!("literal out of range for {}", ty.name()));
                }
                Ok(node(Kind::Int(v), ty, Level::Block, Some(Range::point(v))))
            }
            syn::Lit::Float(f) => {
                if !matches!(f.suffix(), "" | "f32") {
                    return err(f.span(), "float literals are f32");
                }
                if matches!(expect, Some(t) if t != Ty::F32) {
                    return err(
                        f.span(),
                        format!("expected {}, found a float literal", expect.unwrap().name()),
                    );
                }
                let v: f32 = f.base10_parse()?;
                Ok(node(
                    Kind::Float(if negate { -v } else { v }),
                    Ty::F32,
                    Level::Block,
                    None,
                ))
            }
            _ => err(lit.span(), "only integer and float literals"),
        }
    }

    fn path(&self, p: &syn::ExprPath) -> Result<TExpr> {
        let Some(id) = p.path.get_ident() else {
            return err(p.span(), "expected a name");
        };
        let name = id.to_string();
        if name == self.sub_name {
            let r = Range::new(0, self.sub_blocks as i128 - 1);
            return Ok(node(Kind::Sub, Ty::U32, Level::Sub, Some(r)));
        }
        if name == self.lane_name {
            let r = Range::new(0, self.sub_block as i128 - 1);
            return Ok(node(Kind::Lane, Ty::U32, Level::Elem, Some(r)));
        }
        if let Some(l) = self.lets.iter().find(|l| l.name == name) {
            let v = &l.value;
            return Ok(node(Kind::Var(name), v.ty, v.level, v.range));
        }
        if let Some(f) = self.fields.iter().find(|f| f.name == name) {
            if f.len.is_some() {
                return err(id.span(), format!("`{name}` is an array field: index it"));
            }
            return Ok(node(Kind::Field(name), f.ty, Level::Block, int_range(f.ty)));
        }
        if self.tables.iter().any(|t| t.name == name) {
            return err(id.span(), format!("`{name}` is a table: index it"));
        }
        err(
            id.span(),
            format!(
                "unknown name `{name}` (fields, tables, lets and the two indices are in scope)"
            ),
        )
    }

    fn index(&self, ix: &syn::ExprIndex) -> Result<TExpr> {
        let base = match &*ix.expr {
            syn::Expr::Path(p) if p.path.get_ident().is_some() => {
                p.path.get_ident().unwrap().to_string()
            }
            e => return err(e.span(), "only fields and tables can be indexed"),
        };
        let idx = self.check(&ix.index, Some(Ty::U32))?;
        if !idx.ty.is_int() {
            return err(
                ix.index.span(),
                format!("an index must be an integer, this is {}", idx.ty.name()),
            );
        }
        let (len, ty, is_field) = if let Some(f) = self.fields.iter().find(|f| f.name == base) {
            match f.len {
                Some(n) => (n, f.ty, true),
                None => return err(ix.expr.span(), format!("`{base}` is a scalar field")),
            }
        } else if let Some(t) = self.tables.iter().find(|t| t.name == base) {
            (t.len, t.ty, false)
        } else {
            return err(ix.expr.span(), format!("unknown field or table `{base}`"));
        };
        let r = idx.range.expect("integers have ranges");
        if r.lo < 0 || r.hi >= len as i128 {
            return err(
                ix.index.span(),
                format!(
                    "cannot prove this index in bounds: it ranges over {}..={} but `{base}` has {len} elements \
                     (mask or reduce it so that the bound is evident)",
                    r.lo, r.hi
                ),
            );
        }
        let level = idx.level.max(Level::Block);
        let kind = if is_field {
            Kind::Load(base, Box::new(idx))
        } else {
            Kind::Table(base, Box::new(idx))
        };
        Ok(node(kind, ty, level, int_range(ty)))
    }

    fn unary(&self, u: &syn::ExprUnary, expect: Option<Ty>) -> Result<TExpr> {
        match u.op {
            syn::UnOp::Neg(_) => {
                // Fold `-literal` so that e.g. `-128i8` is a valid constant.
                if let syn::Expr::Lit(l) = &*u.expr {
                    let t = self.literal(&l.lit, expect, true)?;
                    if t.ty.is_int() && !t.ty.is_signed() && !matches!(t.kind, Kind::Int(0)) {
                        return err(
                            u.span(),
                            format!("cannot negate a {} constant", t.ty.name()),
                        );
                    }
                    return Ok(t);
                }
                let a = self.check(&u.expr, expect)?;
                if !(a.ty.is_signed() || a.ty == Ty::F32) {
                    return err(
                        u.span(),
                        format!(
                            "cannot negate a {} (only signed integers and f32)",
                            a.ty.name()
                        ),
                    );
                }
                let (ty, level, r) = (a.ty, a.level, a.range.map(|r| range::neg(a.ty, r)));
                Ok(node(Kind::Unary(UnOp::Neg, Box::new(a)), ty, level, r))
            }
            syn::UnOp::Not(_) => {
                let a = self.check(&u.expr, expect)?;
                if !(a.ty.is_int() || a.ty == Ty::Bool) {
                    return err(
                        u.span(),
                        format!("`!` needs an integer or bool, this is {}", a.ty.name()),
                    );
                }
                let (ty, level, r) = (a.ty, a.level, a.range.map(|r| range::not(a.ty, r)));
                Ok(node(Kind::Unary(UnOp::Not, Box::new(a)), ty, level, r))
            }
            _ => err(u.span(), "unsupported unary operator"),
        }
    }

    fn binary(&self, b: &syn::ExprBinary, expect: Option<Ty>) -> Result<TExpr> {
        use syn::BinOp as S;
        let op = match b.op {
            S::Add(_) => BinOp::Add,
            S::Sub(_) => BinOp::Sub,
            S::Mul(_) => BinOp::Mul,
            S::Div(_) => BinOp::Div,
            S::Rem(_) => BinOp::Rem,
            S::BitAnd(_) => BinOp::BitAnd,
            S::BitOr(_) => BinOp::BitOr,
            S::BitXor(_) => BinOp::BitXor,
            S::Shl(_) => BinOp::Shl,
            S::Shr(_) => BinOp::Shr,
            S::Eq(_) => BinOp::Eq,
            S::Ne(_) => BinOp::Ne,
            S::Lt(_) => BinOp::Lt,
            S::Le(_) => BinOp::Le,
            S::Gt(_) => BinOp::Gt,
            S::Ge(_) => BinOp::Ge,
            S::And(_) => BinOp::And,
            S::Or(_) => BinOp::Or,
            _ => return err(b.span(), "assignment operators are not expressions here"),
        };
        let span = b.span();

        if matches!(op, BinOp::And | BinOp::Or) {
            let l = self.check(&b.left, Some(Ty::Bool))?;
            let r = self.check(&b.right, Some(Ty::Bool))?;
            if l.ty != Ty::Bool || r.ty != Ty::Bool {
                return err(span, "`&&` and `||` need bools");
            }
            let level = l.level.max(r.level);
            return Ok(node(
                Kind::Binary(op, Box::new(l), Box::new(r)),
                Ty::Bool,
                level,
                Some(Range::new(0, 1)),
            ));
        }

        if matches!(op, BinOp::Shl | BinOp::Shr) {
            let l = self.check(&b.left, expect)?;
            let r = self.check(&b.right, Some(Ty::U32))?;
            if !l.ty.is_int() || !r.ty.is_int() {
                return err(span, "shifts need integers");
            }
            let rop = if op == BinOp::Shl {
                range::Op::Shl
            } else {
                range::Op::Shr
            };
            let rr = range::binary(rop, l.ty, l.range.unwrap(), r.range.unwrap());
            let (ty, level) = (l.ty, l.level.max(r.level));
            return Ok(node(
                Kind::Binary(op, Box::new(l), Box::new(r)),
                ty,
                level,
                Some(rr),
            ));
        }

        // Both operands have one type; an untyped literal on either side takes the other's.
        let hint = if op.is_comparison() { None } else { expect };
        let (l, r) = if untyped_literal(&b.left) && !untyped_literal(&b.right) {
            let r = self.check(&b.right, hint)?;
            (self.check(&b.left, Some(r.ty))?, r)
        } else {
            let l = self.check(&b.left, hint)?;
            let r = self.check(&b.right, Some(l.ty))?;
            (l, r)
        };
        if l.ty != r.ty {
            return err(
                span,
                format!(
                    "mismatched types {} and {} (convert with `as`)",
                    l.ty.name(),
                    r.ty.name()
                ),
            );
        }
        let t = l.ty;
        let level = l.level.max(r.level);
        if op.is_comparison() {
            if !(t.is_int()
                || t == Ty::F32
                || (t == Ty::Bool && matches!(op, BinOp::Eq | BinOp::Ne)))
            {
                return err(span, format!("cannot compare {}", t.name()));
            }
            return Ok(node(
                Kind::Binary(op, Box::new(l), Box::new(r)),
                Ty::Bool,
                level,
                Some(Range::new(0, 1)),
            ));
        }
        let rop = match op {
            BinOp::Add => range::Op::Add,
            BinOp::Sub => range::Op::Sub,
            BinOp::Mul => range::Op::Mul,
            BinOp::Div => range::Op::Div,
            BinOp::Rem => range::Op::Rem,
            BinOp::BitAnd => range::Op::And,
            BinOp::BitOr => range::Op::Or,
            BinOp::BitXor => range::Op::Xor,
            _ => unreachable!("handled above"),
        };
        let bitwise = matches!(op, BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor);
        if t == Ty::F32 {
            if bitwise || op == BinOp::Rem {
                return err(span, "f32 supports + - * / and comparisons");
            }
            return Ok(node(
                Kind::Binary(op, Box::new(l), Box::new(r)),
                t,
                level,
                None,
            ));
        }
        if !t.is_int() {
            return err(
                span,
                format!("no arithmetic on {} (convert to f32 first)", t.name()),
            );
        }
        if matches!(op, BinOp::Div | BinOp::Rem) && !matches!(r.kind, Kind::Int(c) if c != 0) {
            return err(
                b.right.span(),
                "integer `/` and `%` only by a non-zero constant",
            );
        }
        let rr = range::binary(rop, t, l.range.unwrap(), r.range.unwrap());
        Ok(node(
            Kind::Binary(op, Box::new(l), Box::new(r)),
            t,
            level,
            Some(rr),
        ))
    }

    fn cast(&self, c: &syn::ExprCast) -> Result<TExpr> {
        let to = parse_ty(&c.ty)?;
        let a = self.check(&c.expr, None)?;
        let from = a.ty;
        let ok = match (from, to) {
            (f, t) if f == t => true,
            (f, t) if (f.is_int() || f == Ty::Bool) && t.is_int() => true,
            (f, Ty::F32) if f.is_int() => true,
            (Ty::F32, t) if t.is_int() => true,
            (Ty::F32, Ty::F16) | (Ty::F16, Ty::F32) => true,
            _ => false,
        };
        if !ok {
            return err(
                c.span(),
                format!("cannot convert {} to {} with `as`", from.name(), to.name()),
            );
        }
        let r = if to.is_int() {
            Some(range::cast(to, a.range))
        } else {
            None
        };
        let level = a.level;
        Ok(node(Kind::Cast(Box::new(a)), to, level, r))
    }

    /// `f32::from_bits(u32)` / `f16::from_bits(u16)`.
    fn bitcast_call(&self, c: &syn::ExprCall) -> Result<TExpr> {
        let segs: Vec<String> = match &*c.func {
            syn::Expr::Path(p) => p
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect(),
            _ => vec![],
        };
        let (to, from) = match segs
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["f32", "from_bits"] => (Ty::F32, Ty::U32),
            ["f16", "from_bits"] => (Ty::F16, Ty::U16),
            _ => {
                return err(
                    c.func.span(),
                    "the only functions are f32::from_bits and f16::from_bits",
                )
            }
        };
        if c.args.len() != 1 {
            return err(c.span(), "from_bits takes one argument");
        }
        let a = self.check(&c.args[0], Some(from))?;
        if a.ty != from {
            return err(
                c.args[0].span(),
                format!("{}::from_bits needs a {}", to.name(), from.name()),
            );
        }
        let level = a.level;
        Ok(node(Kind::Bitcast(Box::new(a)), to, level, None))
    }

    /// `x.to_bits()` for f32 and f16.
    fn to_bits_call(&self, m: &syn::ExprMethodCall) -> Result<TExpr> {
        if m.method != "to_bits" || !m.args.is_empty() {
            return err(m.span(), "the only method is .to_bits()");
        }
        let a = self.check(&m.receiver, None)?;
        let to = match a.ty {
            Ty::F32 => Ty::U32,
            Ty::F16 => Ty::U16,
            t => return err(m.span(), format!("{} has no to_bits", t.name())),
        };
        let level = a.level;
        Ok(node(
            Kind::Bitcast(Box::new(a)),
            to,
            level,
            Some(Range::of(to)),
        ))
    }

    fn select(&self, i: &syn::ExprIf, expect: Option<Ty>) -> Result<TExpr> {
        let c = self.check(&i.cond, Some(Ty::Bool))?;
        if c.ty != Ty::Bool {
            return err(i.cond.span(), "the condition must be a bool");
        }
        let Some((_, else_e)) = &i.else_branch else {
            return err(i.span(), "`if` needs an `else`: it is a value");
        };
        let then_e = match i.then_branch.stmts.as_slice() {
            [syn::Stmt::Expr(e, None)] => e,
            _ => return err(i.then_branch.span(), "a branch holds a single expression"),
        };
        let (a, b) = if untyped_literal(then_e) {
            let b = self.check(else_e, expect)?;
            (self.check(then_e, Some(b.ty))?, b)
        } else {
            let a = self.check(then_e, expect)?;
            let b = self.check(else_e, Some(a.ty))?;
            (a, b)
        };
        if a.ty != b.ty {
            return err(
                i.span(),
                format!(
                    "the branches have types {} and {}",
                    a.ty.name(),
                    b.ty.name()
                ),
            );
        }
        let r = match (a.range, b.range) {
            (Some(x), Some(y)) => Some(x.union(y)),
            _ => None,
        };
        let (ty, level) = (a.ty, c.level.max(a.level).max(b.level));
        Ok(node(
            Kind::Select(Box::new(c), Box::new(a), Box::new(b)),
            ty,
            level,
            r,
        ))
    }
}

fn int_range(t: Ty) -> Option<Range> {
    if t.is_int() || t == Ty::Bool {
        Some(Range::of(t))
    } else {
        None
    }
}
