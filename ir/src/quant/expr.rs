//! The de-quantization expression IR: what one quant type's "element i of a block is ..."
//! looks like once `quant_type!` has parsed and type-checked it.
//!
//! It is deliberately small and target-neutral: scalar types, constants, the two index
//! variables, field and table loads, arithmetic, casts, bit casts and select. No loops, no
//! stores, no calls. GPU code generators lower it node by node; the CPU code is generated
//! from the same tree by the macro, and [`super::eval`] interprets it as the reference.
//!
//! Semantics every target must follow (the CPU code and the interpreter do):
//! - integer `+ - *` and negation wrap (two's complement) at the node's width;
//! - `/` and `%` on integers only divide by a non-zero constant (the macro checks) and
//!   truncate toward zero;
//! - shift amounts are taken modulo the left operand's width (as Rust's `wrapping_shl`,
//!   WGSL and PTX `shl.b32` with a masked amount);
//! - float arithmetic is IEEE f32, round to nearest, **no contraction into FMA**: that is
//!   what makes a target's de-quantization bit-identical to the reference;
//! - `Select` evaluates both arms (they have no side effects and every load in either
//!   arm is proven in bounds by the macro).

use std::fmt;

/// Scalar types of the expression language. `F16` values are IEEE binary16 bit patterns
/// and only convert to and from `F32` (`Cast`) or `U16` (`Bitcast`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    F16,
    F32,
}

impl Ty {
    /// Size in bytes of a value stored in a block or a table (Bool: 1).
    pub fn bytes(self) -> usize {
        match self {
            Ty::Bool | Ty::U8 | Ty::I8 => 1,
            Ty::U16 | Ty::I16 | Ty::F16 => 2,
            Ty::U32 | Ty::I32 | Ty::F32 => 4,
            Ty::U64 => 8,
        }
    }
    pub fn bits(self) -> u32 {
        self.bytes() as u32 * 8
    }
    pub fn is_int(self) -> bool {
        matches!(
            self,
            Ty::U8 | Ty::I8 | Ty::U16 | Ty::I16 | Ty::U32 | Ty::I32 | Ty::U64
        )
    }
    pub fn is_signed(self) -> bool {
        matches!(self, Ty::I8 | Ty::I16 | Ty::I32)
    }
    pub fn is_float(self) -> bool {
        matches!(self, Ty::F16 | Ty::F32)
    }
    /// The Rust spelling, also used by `Display`.
    pub fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::U8 => "u8",
            Ty::I8 => "i8",
            Ty::U16 => "u16",
            Ty::I16 => "i16",
            Ty::U32 => "u32",
            Ty::I32 => "i32",
            Ty::U64 => "u64",
            Ty::F16 => "f16",
            Ty::F32 => "f32",
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How often a value changes: once per block, once per sub-block (depends on `s`), or per
/// element (depends on `j`). Code generators hoist `Block` and `Sub` lets out of the
/// element loop; that is where a type's shared scale math ends up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Block,
    Sub,
    Elem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    /// Arithmetic negation (wrapping for integers).
    Neg,
    /// Bitwise not for integers, logical not for `Bool`.
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// Logical and/or on `Bool` (no short-circuit needed: nothing has side effects).
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::BitAnd => "&",
            BinOp::BitOr => "|",
            BinOp::BitXor => "^",
            BinOp::Shl => "<<",
            BinOp::Shr => ">>",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }
}

/// One node. Children are `&'static` so that a whole tree is a constant the macro can emit
/// into a `static`. Every node carries its result type, so a lowering never has to infer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expr {
    /// Integer constant: its two's-complement bits truncated to the type's width.
    Int(Ty, u64),
    /// f32 constant.
    F32(f32),
    /// The sub-block index `s` (u32, `0..block_elems / sub_block`).
    Sub,
    /// The element index inside the sub-block `j` (u32, `0..sub_block`); the element's index
    /// in the block is `s * sub_block + j`.
    Lane,
    /// A `let` of [`super::QuantSpec::lets`], by name.
    Var(&'static str, Ty),
    /// A scalar field of the block.
    Field(&'static str, Ty),
    /// Element `index` (u32 after widening; proven in bounds) of an array field.
    Load(&'static str, Ty, &'static Expr),
    /// Element `index` (proven in bounds) of a constant table.
    Table(&'static str, Ty, &'static Expr),
    Unary(UnOp, Ty, &'static Expr),
    /// Binary operation; the `Ty` is the result type (Bool for comparisons, the left type
    /// for shifts, the common operand type otherwise).
    Binary(BinOp, Ty, &'static Expr, &'static Expr),
    /// Numeric conversion (`as`): int<->int truncates or extends, int<->f32 rounds to
    /// nearest (f32->int saturates), f16<->f32, bool->int.
    Cast(Ty, &'static Expr),
    /// Reinterpret the bits: u32<->f32, u16<->f16.
    Bitcast(Ty, &'static Expr),
    /// `if cond { a } else { b }`.
    Select(Ty, &'static Expr, &'static Expr, &'static Expr),
}

impl Expr {
    /// The node's operands, in order (none for leaves).
    pub fn children(&self) -> Vec<&'static Expr> {
        match *self {
            Expr::Load(_, _, a)
            | Expr::Table(_, _, a)
            | Expr::Unary(_, _, a)
            | Expr::Cast(_, a)
            | Expr::Bitcast(_, a) => vec![a],
            Expr::Binary(_, _, a, b) => vec![a, b],
            Expr::Select(_, c, a, b) => vec![c, a, b],
            Expr::Int(..)
            | Expr::F32(_)
            | Expr::Sub
            | Expr::Lane
            | Expr::Var(..)
            | Expr::Field(..) => Vec::new(),
        }
    }

    pub fn ty(&self) -> Ty {
        match *self {
            Expr::Int(t, _) => t,
            Expr::F32(_) => Ty::F32,
            Expr::Sub | Expr::Lane => Ty::U32,
            Expr::Var(_, t)
            | Expr::Field(_, t)
            | Expr::Load(_, t, _)
            | Expr::Table(_, t, _)
            | Expr::Unary(_, t, _)
            | Expr::Binary(_, t, _, _)
            | Expr::Cast(t, _)
            | Expr::Bitcast(t, _)
            | Expr::Select(t, _, _, _) => t,
        }
    }

    /// The constant's value as a mathematical integer (sign-extended for signed types).
    pub fn int_value(ty: Ty, bits: u64) -> i128 {
        let w = ty.bits();
        if ty.is_signed() {
            let shift = 64 - w;
            (((bits << shift) as i64) >> shift) as i128
        } else {
            bits as i128
        }
    }
}

/// Rust-like text, fully parenthesised: for error messages, snapshots and comments in
/// generated GPU code.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Expr::Int(t, b) => write!(f, "{}{}", Expr::int_value(t, b), t),
            Expr::F32(v) => write!(f, "{v:?}f32"),
            Expr::Sub => f.write_str("s"),
            Expr::Lane => f.write_str("j"),
            Expr::Var(n, _) | Expr::Field(n, _) => f.write_str(n),
            Expr::Load(n, _, i) | Expr::Table(n, _, i) => write!(f, "{n}[{i}]"),
            Expr::Unary(UnOp::Neg, _, a) => write!(f, "(-{a})"),
            Expr::Unary(UnOp::Not, _, a) => write!(f, "(!{a})"),
            Expr::Binary(op, _, a, b) => write!(f, "({a} {} {b})", op.symbol()),
            Expr::Cast(t, a) => write!(f, "({a} as {t})"),
            Expr::Bitcast(t, a) if t.is_float() => write!(f, "{t}::from_bits({a})"),
            Expr::Bitcast(_, a) => write!(f, "{a}.to_bits()"),
            Expr::Select(_, c, a, b) => write!(f, "(if {c} {{ {a} }} else {{ {b} }})"),
        }
    }
}
