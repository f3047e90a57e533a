//! The values an expression of a quant declaration can take, when there are few.
//!
//! A code generator may want to know more about a declaration than its text says: for
//! example, that the element term of every IQ2_XXS value is one of ±8, ±25, ±43, so it is
//! exact in bf16 and a tensor core can multiply it without splitting (see
//! `codegen/src/quant/cuda_mma.rs`). [`values`] answers by interpretation over sets: each
//! node's set of possible values is computed from its children's with the interpreter's
//! own operations (`eval.rs`), so the meaning of every node is the reference's.
//!
//! The sets are over-approximations (a `Select` takes both arms, a load any value of its
//! type), and the answer is `None` where a set would grow past [`MAX_VALUES`]: a 16-bit or
//! wider field read whole, an f16 scale. What keeps the element terms small is the usual
//! shape of a declaration: bytes, masks (`x & 0xF` has at most 16 values whatever `x` is),
//! small tables.

use super::eval::{binary, bitcast, cast, from_bits, unary, Val};
use super::expr::{BinOp, Expr, Ty};
use super::spec::QuantSpec;

/// The largest set kept; larger ones are unknown.
pub const MAX_VALUES: usize = 4096;

/// Pairs a binary node may combine before its result is declared unknown.
const MAX_PAIRS: usize = 1 << 18;

/// A set of values (`None`: unknown, or too many).
type Set = Option<Vec<Val>>;

/// A value's identity for set membership: its kind and its bits (floats by bit pattern,
/// so -0.0 and 0.0 stay apart).
fn key(v: &Val) -> (u8, u64) {
    match *v {
        Val::Bool(b) => (0, b as u64),
        Val::Int(_, x) => (1, x as u64),
        Val::F16(h) => (2, h as u64),
        Val::F32(f) => (3, f.to_bits() as u64),
    }
}

/// `vals` without repeats, or unknown when more than [`MAX_VALUES`] remain.
fn set_of(mut vals: Vec<Val>) -> Set {
    vals.sort_by_key(key);
    vals.dedup_by_key(|v| key(v));
    (vals.len() <= MAX_VALUES).then_some(vals)
}

/// Every value of type `t` (integers up to 16 bits; None for wider ones and floats).
fn all_of(t: Ty) -> Set {
    match t {
        Ty::Bool => Some(vec![Val::Bool(false), Val::Bool(true)]),
        Ty::U8 | Ty::I8 => set_of((0..256u64).map(|b| from_bits(t, b)).collect()),
        _ => None,
    }
}

struct Sets<'a> {
    spec: &'a QuantSpec,
    /// The lets evaluated so far, in order (a later one shadows an earlier namesake).
    lets: Vec<(&'static str, Set)>,
}

impl Sets<'_> {
    fn eval(&self, e: &Expr) -> Set {
        match *e {
            Expr::Int(t, b) => Some(vec![Val::Int(t, Expr::int_value(t, b))]),
            Expr::F32(v) => Some(vec![Val::F32(v)]),
            Expr::Sub => set_of((0..self.spec.sub_blocks() as i128).map(|s| Val::Int(Ty::U32, s)).collect()),
            Expr::Lane => set_of((0..self.spec.sub_block as i128).map(|j| Val::Int(Ty::U32, j)).collect()),
            Expr::Var(n, _) => self.lets.iter().rev().find(|l| l.0 == n).and_then(|l| l.1.clone()),
            Expr::Field(_, t) | Expr::Load(_, t, _) => all_of(t),
            Expr::Table(n, t, _) => {
                let tab = self.spec.table(n)?;
                set_of((0..tab.len()).map(|i| from_bits(t, tab.bits(i))).collect())
            }
            Expr::Unary(op, t, a) => {
                let a = self.eval(a)?;
                set_of(a.into_iter().map(|v| unary(op, t, v)).collect())
            }
            Expr::Binary(op, t, a, b) => self.binary(op, t, a, b),
            Expr::Cast(t, a) => set_of(self.eval(a)?.into_iter().map(|v| cast(t, v)).collect()),
            Expr::Bitcast(t, a) => set_of(self.eval(a)?.into_iter().map(|v| bitcast(t, v)).collect()),
            Expr::Select(_, _, a, b) => {
                let mut v = self.eval(a)?;
                v.extend(self.eval(b)?);
                set_of(v)
            }
        }
    }

    fn binary(&self, op: BinOp, t: Ty, a: &Expr, b: &Expr) -> Set {
        let (sa, sb) = (self.eval(a), self.eval(b));
        // A mask by one non-negative constant keeps the bits of the constant, whatever the
        // other side is: its sub-masks.
        if op == BinOp::BitAnd {
            let single = |s: &Set| match s.as_deref() {
                Some([Val::Int(_, c)]) if *c >= 0 && (*c as usize) < MAX_VALUES => Some(*c),
                _ => None,
            };
            if let Some(c) = single(&sa).or(single(&sb)) {
                if sa.is_none() || sb.is_none() {
                    return set_of((0..=c).filter(|v| v & !c == 0).map(|v| Val::Int(t, v)).collect());
                }
            }
        }
        let (sa, sb) = (sa?, sb?);
        if sa.len() * sb.len() > MAX_PAIRS {
            return None;
        }
        let mut out = Vec::with_capacity(sa.len() * sb.len());
        for &x in &sa {
            for &y in &sb {
                // Integer division by zero cannot happen (divisors are non-zero constants).
                out.push(binary(op, t, x, y));
            }
        }
        set_of(out)
    }
}

/// The f32 values `e` (an f32 expression of `spec`, after all its lets) can take, sorted by
/// bit pattern; `None` when they are not few (see the module comment).
pub fn values(spec: &QuantSpec, e: &Expr) -> Option<Vec<f32>> {
    let mut sets = Sets { spec, lets: Vec::with_capacity(spec.lets.len()) };
    for l in spec.lets {
        let s = sets.eval(l.value);
        sets.lets.push((l.name, s));
    }
    sets.eval(e)?
        .into_iter()
        .map(|v| match v {
            Val::F32(f) => Some(f),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::spec as spec_of;
    use crate::GgmlType;

    /// The value's factor that depends on the element, as the declarations write it: the
    /// left operand of the last product (before any offset).
    fn elem_term(t: GgmlType) -> &'static Expr {
        let s = spec_of(t).unwrap();
        let product = match s.value {
            Expr::Binary(BinOp::Sub, _, a, _) => a,
            v => v,
        };
        match product {
            Expr::Binary(BinOp::Mul, _, a, b) => {
                if matches!(a, Expr::Var(..)) {
                    b
                } else {
                    a
                }
            }
            _ => product,
        }
    }

    #[test]
    fn element_terms_of_the_integer_types_are_small_sets() {
        let q8 = values(spec_of(GgmlType::Q8_0).unwrap(), elem_term(GgmlType::Q8_0)).unwrap();
        assert_eq!(q8.len(), 256);
        assert!(q8.iter().all(|v| v.fract() == 0.0 && (-128.0..=127.0).contains(v)));
        let q2 = values(spec_of(GgmlType::Q2K).unwrap(), elem_term(GgmlType::Q2K)).unwrap();
        assert_eq!(q2, vec![0.0, 1.0, 2.0, 3.0]);
        let q6 = values(spec_of(GgmlType::Q6K).unwrap(), elem_term(GgmlType::Q6K)).unwrap();
        assert_eq!(q6.len(), 64);
        let mut iq2 = values(spec_of(GgmlType::Iq2Xxs).unwrap(), elem_term(GgmlType::Iq2Xxs)).unwrap();
        iq2.sort_by(f32::total_cmp);
        assert_eq!(iq2, vec![-43.0, -25.0, -8.0, 8.0, 25.0, 43.0]);
    }

    #[test]
    fn wide_loads_are_unknown_and_masks_bound_them() {
        // Q8_0's scale is an f16 field: 65536 values, not kept.
        let q8 = spec_of(GgmlType::Q8_0).unwrap();
        assert_eq!(values(q8, q8.value), None);
        // IQ2_XXS's grid index is a byte of a u32 (masked by 0xFF).
        let iq2 = spec_of(GgmlType::Iq2Xxs).unwrap();
        let g = iq2.let_("g").unwrap().value;
        let f = Expr::Cast(Ty::F32, g);
        assert_eq!(values(iq2, &f).unwrap().len(), 256);
    }
}
