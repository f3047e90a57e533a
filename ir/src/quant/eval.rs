//! A direct interpreter of a `QuantSpec`: the reference meaning of the expression IR.
//!
//! Slow and simple on purpose. Tests run it on golden blocks next to the macro-generated CPU
//! code, so a GPU lowering of the same tree has a second, independent statement of what
//! each node means to be checked against.

use super::expr::{BinOp, Expr, Ty, UnOp};
use super::spec::{QuantSpec, Table};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Val {
    Bool(bool),
    /// An integer of the given type, held as its mathematical value (already wrapped).
    Int(Ty, i128),
    /// binary16 bits.
    F16(u16),
    F32(f32),
}

/// Wrap a mathematical integer to `ty`'s width (two's complement).
pub(super) fn wrap(ty: Ty, v: i128) -> i128 {
    let w = ty.bits();
    let m = v & ((1i128 << w) - 1);
    if ty.is_signed() && m >= 1i128 << (w - 1) {
        m - (1i128 << w)
    } else {
        m
    }
}

pub(super) fn from_bits(ty: Ty, bits: u64) -> Val {
    match ty {
        Ty::F32 => Val::F32(f32::from_bits(bits as u32)),
        Ty::F16 => Val::F16(bits as u16),
        Ty::Bool => Val::Bool(bits != 0),
        t => Val::Int(t, wrap(t, bits as i128)),
    }
}

struct Ctx<'a> {
    spec: &'a QuantSpec,
    block: &'a [u8],
    s: u32,
    j: u32,
    lets: Vec<(&'static str, Val)>,
}

impl Ctx<'_> {
    fn int(&self, e: &Expr) -> i128 {
        match self.eval(e) {
            Val::Int(_, v) => v,
            v => panic!("expected an integer, got {v:?} from {e}"),
        }
    }

    fn load(&self, name: &str, index: usize) -> Val {
        let f = self
            .spec
            .field(name)
            .unwrap_or_else(|| panic!("no field {name}"));
        assert!(index < f.elems(), "{name}[{index}] out of bounds");
        let at = f.offset + index * f.ty.bytes();
        let mut bits = 0u64;
        for (k, b) in self.block[at..at + f.ty.bytes()].iter().enumerate() {
            bits |= (*b as u64) << (8 * k);
        }
        from_bits(f.ty, bits)
    }

    fn table(&self, name: &str) -> &'static Table {
        self.spec
            .table(name)
            .unwrap_or_else(|| panic!("no table {name}"))
    }

    fn eval(&self, e: &Expr) -> Val {
        match *e {
            Expr::Int(t, b) => Val::Int(t, Expr::int_value(t, b)),
            Expr::F32(v) => Val::F32(v),
            Expr::Sub => Val::Int(Ty::U32, self.s as i128),
            Expr::Lane => Val::Int(Ty::U32, self.j as i128),
            Expr::Var(n, _) => {
                self.lets
                    .iter()
                    .rev()
                    .find(|l| l.0 == n)
                    .unwrap_or_else(|| panic!("no let {n}"))
                    .1
            }
            Expr::Field(n, _) => self.load(n, 0),
            Expr::Load(n, _, i) => self.load(n, self.int(i) as usize),
            Expr::Table(n, t, i) => {
                let tab = self.table(n);
                let i = self.int(i) as usize;
                assert!(i < tab.len(), "{n}[{i}] out of bounds");
                from_bits(t, tab.bits(i))
            }
            Expr::Unary(op, t, a) => unary(op, t, self.eval(a)),
            Expr::Binary(op, t, a, b) => binary(op, t, self.eval(a), self.eval(b)),
            Expr::Cast(t, a) => cast(t, self.eval(a)),
            Expr::Bitcast(t, a) => bitcast(t, self.eval(a)),
            Expr::Select(_, c, a, b) => {
                let (a, b) = (self.eval(a), self.eval(b));
                match self.eval(c) {
                    Val::Bool(true) => a,
                    Val::Bool(false) => b,
                    v => panic!("select on {v:?}"),
                }
            }
        }
    }
}

pub(super) fn unary(op: UnOp, t: Ty, v: Val) -> Val {
    match (op, v) {
        (UnOp::Neg, Val::Int(_, v)) => Val::Int(t, wrap(t, -v)),
        (UnOp::Neg, Val::F32(v)) => Val::F32(-v),
        (UnOp::Not, Val::Int(_, v)) => Val::Int(t, wrap(t, !v)),
        (UnOp::Not, Val::Bool(b)) => Val::Bool(!b),
        (op, v) => panic!("{op:?} on {v:?}"),
    }
}

pub(super) fn binary(op: BinOp, t: Ty, a: Val, b: Val) -> Val {
    use BinOp::*;
    match (a, b) {
        (Val::Int(lt, x), Val::Int(_, y)) => match op {
            Add => Val::Int(t, wrap(t, x + y)),
            Sub => Val::Int(t, wrap(t, x - y)),
            Mul => Val::Int(t, wrap(t, x.wrapping_mul(y))),
            Div => Val::Int(t, wrap(t, x / y)),
            Rem => Val::Int(t, wrap(t, x % y)),
            BitAnd => Val::Int(t, wrap(t, x & y)),
            BitOr => Val::Int(t, wrap(t, x | y)),
            BitXor => Val::Int(t, wrap(t, x ^ y)),
            Shl => Val::Int(
                t,
                wrap(t, x.wrapping_shl(y.rem_euclid(lt.bits() as i128) as u32)),
            ),
            Shr => Val::Int(t, wrap(t, x >> y.rem_euclid(lt.bits() as i128))),
            Eq => Val::Bool(x == y),
            Ne => Val::Bool(x != y),
            Lt => Val::Bool(x < y),
            Le => Val::Bool(x <= y),
            Gt => Val::Bool(x > y),
            Ge => Val::Bool(x >= y),
            And | Or => panic!("{op:?} on integers"),
        },
        (Val::F32(x), Val::F32(y)) => match op {
            Add => Val::F32(x + y),
            Sub => Val::F32(x - y),
            Mul => Val::F32(x * y),
            Div => Val::F32(x / y),
            Eq => Val::Bool(x == y),
            Ne => Val::Bool(x != y),
            Lt => Val::Bool(x < y),
            Le => Val::Bool(x <= y),
            Gt => Val::Bool(x > y),
            Ge => Val::Bool(x >= y),
            _ => panic!("{op:?} on f32"),
        },
        (Val::Bool(x), Val::Bool(y)) => match op {
            And => Val::Bool(x && y),
            Or => Val::Bool(x || y),
            Eq => Val::Bool(x == y),
            Ne => Val::Bool(x != y),
            _ => panic!("{op:?} on bool"),
        },
        (a, b) => panic!("{op:?} on {a:?}, {b:?}"),
    }
}

/// Reinterpret the bits: u32<->f32, u16<->f16.
pub(super) fn bitcast(t: Ty, v: Val) -> Val {
    match (t, v) {
        (Ty::F32, Val::Int(_, v)) => Val::F32(f32::from_bits(v as u32)),
        (Ty::U32, Val::F32(v)) => Val::Int(t, v.to_bits() as i128),
        (Ty::F16, Val::Int(_, v)) => Val::F16(v as u16),
        (Ty::U16, Val::F16(h)) => Val::Int(t, h as i128),
        (t, v) => panic!("bitcast of {v:?} to {t}"),
    }
}

/// `as`, with Rust's rules (float to int saturates, NaN to 0; int to float rounds to nearest).
pub(super) fn cast(t: Ty, v: Val) -> Val {
    match (v, t) {
        (Val::Int(_, x), Ty::F32) => Val::F32(x as f32),
        (Val::Int(_, x), t) if t.is_int() => Val::Int(t, wrap(t, x)),
        (Val::Bool(b), t) if t.is_int() => Val::Int(t, b as i128),
        (Val::F32(x), Ty::F16) => Val::F16(half::f16::from_f32(x).to_bits()),
        (Val::F32(x), Ty::F32) => Val::F32(x),
        (Val::F32(x), t) if t.is_int() => Val::Int(
            t,
            match t {
                Ty::U8 => x as u8 as i128,
                Ty::I8 => x as i8 as i128,
                Ty::U16 => x as u16 as i128,
                Ty::I16 => x as i16 as i128,
                Ty::U32 => x as u32 as i128,
                Ty::I32 => x as i32 as i128,
                _ => x as u64 as i128,
            },
        ),
        (Val::F16(h), Ty::F32) => Val::F32(half::f16::from_bits(h).to_f32()),
        (Val::F16(h), Ty::F16) => Val::F16(h),
        (v, t) => panic!("cast of {v:?} to {t}"),
    }
}

/// Element `s * spec.sub_block + j` of `block`, by interpreting the spec.
///
/// Panics if `block` is shorter than `spec.block_bytes` or the spec is malformed (specs made
/// by `quant_type!` are not).
pub fn eval_element(spec: &QuantSpec, block: &[u8], s: u32, j: u32) -> f32 {
    assert!(
        block.len() >= spec.block_bytes,
        "block of {} bytes, need {}",
        block.len(),
        spec.block_bytes
    );
    let mut ctx = Ctx {
        spec,
        block,
        s,
        j,
        lets: Vec::with_capacity(spec.lets.len()),
    };
    for l in spec.lets {
        let v = ctx.eval(l.value);
        ctx.lets.push((l.name, v));
    }
    match ctx.eval(spec.value) {
        Val::F32(v) => v,
        v => panic!("the value of {:?} is {v:?}, not f32", spec.ggml),
    }
}

/// De-quantize one block by interpretation (`out.len() >= spec.block_elems`).
pub fn eval_block(spec: &QuantSpec, block: &[u8], out: &mut [f32]) {
    let sb = spec.sub_block;
    for s in 0..spec.sub_blocks() {
        for j in 0..sb {
            out[s * sb + j] = eval_element(spec, block, s as u32, j as u32);
        }
    }
}
