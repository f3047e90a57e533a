//! Kernel IR: a small, target-neutral tree for one kernel body.
//!
//! A `Kernel` is what `#[kernel]` reads out of a Rust kernel body (`kernels/*.rs`): one
//! work item's computation over buffers and scalars, with scalar locals, counted loops,
//! `while`, `if` and calls of the `Real` methods or of small helper functions. It is the
//! one input of every renderer in `ds4-codegen` and of the interpreter in `kir_eval`, so
//! it stays close to the Rust subset the bodies are written in: every node here has
//! exactly one Rust spelling, which is what lets a test prove the IR equals the body.
//!
//! Conventions shared by every consumer:
//! - the work-item index is the implicit variable [`ITEM`] (a `usize`), not a param;
//! - `params` lists the body's parameters after `item`, in order; the first one is the
//!   item's output slice (the only mutable buffer), already offset to the item, so
//!   `out[i]` means element `item * out_len + i` of the whole output;
//! - every expression is typed by construction (literals carry their type, lets declare
//!   theirs), so renderers never infer types;
//! - `F` is the kernel's float type: f64 for the reference, f32 on CPU and GPUs.

/// Name of the implicit work-item index variable.
pub const ITEM: &str = "item";

/// Scalar types of params, locals and expressions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ty {
    /// An index or a size (`usize` in Rust; 32 or 64 bits on GPUs, per target).
    Usize,
    I32,
    /// The kernel's float type.
    F,
    Bool,
}

/// Element type of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F,
    I32,
}

impl Elem {
    /// The scalar type of one element.
    pub fn ty(self) -> Ty {
        match self {
            Elem::F => Ty::F,
            Elem::I32 => Ty::I32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A slice; `mutable` only for the output.
    Buffer {
        elem: Elem,
        mutable: bool,
    },
    Scalar {
        ty: Ty,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub kind: ParamKind,
}

/// One kernel: the computation of one work item.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    /// Parameters after `item`; `params[0]` is the output buffer.
    pub params: Vec<Param>,
    /// Length of one item's output slice, an expression of the scalar params.
    pub out_len: Expr,
    /// The helper functions the body calls, each listed once.
    pub helpers: Vec<Function>,
    pub body: Vec<Stmt>,
}

impl Kernel {
    /// The output buffer (the first param) and its element type.
    pub fn out(&self) -> (&str, Elem) {
        match self.params.first() {
            Some(Param { name, kind: ParamKind::Buffer { elem, mutable: true } }) => (name, *elem),
            _ => panic!("kernel {}: the first param must be the mutable output buffer", self.name),
        }
    }

    /// Params after the output buffer: the inputs.
    pub fn inputs(&self) -> &[Param] {
        &self.params[1..]
    }

    /// The param called `name`.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }
}

/// A helper function called from kernel bodies: scalars in, one scalar out, no buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub params: Vec<(String, Ty)>,
    pub ret: Ty,
    pub body: Vec<Stmt>,
    /// The value returned (the Rust body's tail expression).
    pub result: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `let [mut] name: ty = init;`
    Let {
        name: String,
        ty: Ty,
        mutable: bool,
        init: Expr,
    },
    /// `name = value;`
    Assign {
        name: String,
        value: Expr,
    },
    /// `name op= value;`
    CompoundAssign {
        name: String,
        op: BinOp,
        value: Expr,
    },
    /// `buf[index] = value;`, or `buf[index] op= value;` when `op` is set.
    Store {
        buf: String,
        index: Expr,
        op: Option<BinOp>,
        value: Expr,
    },
    /// `for var in start..end { body }` over `usize`; `end` is evaluated once, and the
    /// macro guarantees the body assigns nothing it reads, so re-evaluating it (as C's
    /// `for` does) gives the same loop.
    For {
        var: String,
        start: Expr,
        end: Expr,
        body: Vec<Stmt>,
        mode: LoopMode,
    },
    While {
        cond: Expr,
        body: Vec<Stmt>,
    },
    /// `if cond { then } else { otherwise }`; `else if` is an `If` alone in `otherwise`.
    If {
        cond: Expr,
        then: Vec<Stmt>,
        otherwise: Vec<Stmt>,
    },
}

/// How a loop's iterations may be spread over a GPU block's threads (the `'par:` and
/// `'sum:` labels of kernel bodies; the macro checks the rules). CPU code and the
/// interpreter run every loop serially; a target that parallelizes runs the code outside
/// such loops in every thread alike (it assigns the same values everywhere) and puts a
/// barrier before and after each parallel loop.
#[derive(Clone, Debug, PartialEq)]
pub enum LoopMode {
    Serial,
    /// Independent iterations: each writes its own `out` elements and assigns only
    /// locals declared in the body.
    Parallel,
    /// As `Parallel`, plus `acc += ..` into one float local declared outside: each
    /// thread sums its iterations, then the partial sums are added across the block and
    /// every thread's `acc` gets the total (summation order differs from serial code).
    Sum { acc: String },
}

/// A typed literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lit {
    Usize(u64),
    I32(i32),
    /// `F::from_f64(v)`: targets round `v` to their float type.
    F(f64),
    Bool(bool),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Lit(Lit),
    /// A local, a scalar param, a helper's param or [`ITEM`].
    Var(String),
    /// `buf[index]`: a load from a buffer param.
    Index {
        buf: String,
        index: Box<Expr>,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Unary {
        op: UnOp,
        arg: Box<Expr>,
    },
    /// `as usize`, `as i32`, and `F::from_usize` (to = F, from usize).
    Cast {
        to: Ty,
        arg: Box<Expr>,
    },
    Call {
        callee: Callee,
        args: Vec<Expr>,
    },
}

/// Binary operators. Both operands have the same type; comparisons give `Bool`,
/// `And`/`Or` short-circuit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Integer remainder.
    Rem,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl BinOp {
    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }

    /// The operator's spelling, the same in Rust, C and WGSL.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// Arithmetic negation (F or i32).
    Neg,
    /// Logical not.
    Not,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Callee {
    Builtin(Builtin),
    /// One of the kernel's `helpers`, by name.
    Helper(String),
}

/// The `Real` methods (on F), plus `min`/`max` on `usize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Builtin {
    Exp,
    Ln,
    Sqrt,
    Abs,
    Sin,
    Cos,
    Floor,
    Ceil,
    Log2,
    Exp2,
    /// `a.max(b)` on F (the non-NaN operand if one is NaN).
    Max,
    /// `a.min(b)` on F.
    Min,
    /// ln(1 + x), accurate for small x.
    Ln1p,
    /// Round to nearest, ties to even.
    RoundEven,
    /// floor(log2|x|), exact (see `Real::ilogb`).
    Ilogb,
    /// `a.max(b)` on usize.
    MaxUsize,
    /// `a.min(b)` on usize.
    MinUsize,
}

impl Builtin {
    /// The Rust method name.
    pub fn method(self) -> &'static str {
        match self {
            Builtin::Exp => "exp",
            Builtin::Ln => "ln",
            Builtin::Sqrt => "sqrt",
            Builtin::Abs => "abs",
            Builtin::Sin => "sin",
            Builtin::Cos => "cos",
            Builtin::Floor => "floor",
            Builtin::Ceil => "ceil",
            Builtin::Log2 => "log2",
            Builtin::Exp2 => "exp2",
            Builtin::Max | Builtin::MaxUsize => "max",
            Builtin::Min | Builtin::MinUsize => "min",
            Builtin::Ln1p => "ln_1p",
            Builtin::RoundEven => "round_even",
            Builtin::Ilogb => "ilogb",
        }
    }

    /// Number of arguments, the receiver included.
    pub fn arity(self) -> usize {
        match self {
            Builtin::Max | Builtin::Min | Builtin::MaxUsize | Builtin::MinUsize => 2,
            _ => 1,
        }
    }
}

// Small constructors, so that the macro's output and hand-written IR stay short.

impl Expr {
    pub fn var(name: impl Into<String>) -> Expr {
        Expr::Var(name.into())
    }

    pub fn usize(v: u64) -> Expr {
        Expr::Lit(Lit::Usize(v))
    }

    pub fn f(v: f64) -> Expr {
        Expr::Lit(Lit::F(v))
    }

    pub fn index(buf: impl Into<String>, index: Expr) -> Expr {
        Expr::Index { buf: buf.into(), index: Box::new(index) }
    }

    pub fn binary(op: BinOp, lhs: Expr, rhs: Expr) -> Expr {
        Expr::Binary { op, lhs: Box::new(lhs), rhs: Box::new(rhs) }
    }

    pub fn unary(op: UnOp, arg: Expr) -> Expr {
        Expr::Unary { op, arg: Box::new(arg) }
    }

    pub fn cast(to: Ty, arg: Expr) -> Expr {
        Expr::Cast { to, arg: Box::new(arg) }
    }

    pub fn builtin(f: Builtin, args: Vec<Expr>) -> Expr {
        Expr::Call { callee: Callee::Builtin(f), args }
    }

    pub fn helper(name: impl Into<String>, args: Vec<Expr>) -> Expr {
        Expr::Call { callee: Callee::Helper(name.into()), args }
    }

    /// Visits this expression and every sub-expression, parents first.
    pub fn walk(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Lit(_) | Expr::Var(_) => {}
            Expr::Index { index, .. } => index.walk(f),
            Expr::Binary { lhs, rhs, .. } => {
                lhs.walk(f);
                rhs.walk(f);
            }
            Expr::Unary { arg, .. } | Expr::Cast { arg, .. } => arg.walk(f),
            Expr::Call { args, .. } => args.iter().for_each(|a| a.walk(f)),
        }
    }
}

/// Visits every expression in `stmts` (nested blocks included), parents first.
pub fn walk_exprs(stmts: &[Stmt], f: &mut impl FnMut(&Expr)) {
    for s in stmts {
        match s {
            Stmt::Let { init: e, .. } | Stmt::Assign { value: e, .. } | Stmt::CompoundAssign { value: e, .. } => {
                e.walk(f)
            }
            Stmt::Store { index, value, .. } => {
                index.walk(f);
                value.walk(f);
            }
            Stmt::For { start, end, body, .. } => {
                start.walk(f);
                end.walk(f);
                walk_exprs(body, f);
            }
            Stmt::While { cond, body } => {
                cond.walk(f);
                walk_exprs(body, f);
            }
            Stmt::If { cond, then, otherwise } => {
                cond.walk(f);
                walk_exprs(then, f);
                walk_exprs(otherwise, f);
            }
        }
    }
}

impl Kernel {
    /// Whether the body has a `'sum` loop (targets add their block-sum helper).
    pub fn has_sum_loop(&self) -> bool {
        fn any(stmts: &[Stmt]) -> bool {
            stmts.iter().any(|st| match st {
                Stmt::For { mode: LoopMode::Sum { .. }, .. } => true,
                Stmt::For { body, .. } | Stmt::While { body, .. } => any(body),
                Stmt::If { then, otherwise, .. } => any(then) || any(otherwise),
                _ => false,
            })
        }
        any(&self.body)
    }

    /// Every builtin the body or its helpers call, in a fixed order (renderers emit a
    /// prelude function only for the builtins a target lacks and a kernel uses).
    pub fn builtins_used(&self) -> std::collections::BTreeSet<Builtin> {
        let mut used = std::collections::BTreeSet::new();
        let mut note = |e: &Expr| {
            if let Expr::Call { callee: Callee::Builtin(b), .. } = e {
                used.insert(*b);
            }
        };
        walk_exprs(&self.body, &mut note);
        for h in &self.helpers {
            walk_exprs(&h.body, &mut note);
            h.result.walk(&mut note);
        }
        used
    }
}
