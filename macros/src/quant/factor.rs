//! Factor the de-quantized value for the dot products.
//!
//! Almost every quant type computes `scale(s) * e(s, j) + offset(s)`: a sub-block scale
//! (Q4_K's `d * sc`), an element term (the unpacked integer `q`, or a grid value times a
//! sign) and an optional sub-block offset (Q4_K's `- dmin * m`). The dot product of a
//! sub-block with x is then
//!
//! ```text
//! Σ_j (a·e_j + o)·x_j  =  a·Σ_j e_j·x_j  +  o·Σ_j x_j
//! ```
//!
//! which needs one multiply-add per element instead of two or three, and, when `e` is a
//! product of integers, lets the fast path compute `Σ_j e_j·xq_j` in integers against
//! quantized activations. This module finds that form in the checked expression tree:
//! products are flattened and split by level (factors that do not depend on `j` go to the
//! scale), and a top-level `+`/`-` of a `j`-independent term is the offset. The
//! de-quantization itself keeps the declared expression and its exact operation order;
//! only the dot products use the factored form (a reassociation: same math, f32 rounding
//! in a different place).

use super::check::{BinOp, Kind, Level, TExpr};
use super::ty::Ty;

pub struct Factored<'a> {
    /// The `j`-independent factors of the product, in source order (empty: 1).
    pub scale: Vec<&'a TExpr>,
    /// The `j`-dependent factors, in source order (never empty).
    pub elem: Vec<&'a TExpr>,
    /// `j`-independent term added to the product, and whether it is subtracted.
    pub offset: Option<(bool, &'a TExpr)>,
}

impl Factored<'_> {
    /// The integer view of the element term: each factor is `int as f32`; returns the
    /// integer expressions and a bound on |product|. None if some factor is a float.
    pub fn int_elem(&self) -> Option<(Vec<&TExpr>, i128)> {
        let mut ints = vec![];
        let mut bound = 1i128;
        for f in &self.elem {
            match &f.kind {
                Kind::Cast(inner) if inner.ty.is_int() && inner.ty != Ty::Bool => {
                    let r = inner.range?;
                    bound = bound.checked_mul(r.lo.abs().max(r.hi.abs()))?;
                    ints.push(&**inner);
                }
                _ => return None,
            }
        }
        Some((ints, bound))
    }
}

fn flatten<'a>(e: &'a TExpr, out: &mut Vec<&'a TExpr>) {
    match &e.kind {
        Kind::Binary(BinOp::Mul, a, b) if e.ty == Ty::F32 => {
            flatten(a, out);
            flatten(b, out);
        }
        _ => out.push(e),
    }
}

fn uniform(e: &TExpr) -> bool {
    e.level <= Level::Sub
}

/// The factored form of `value` (an f32 expression that depends on `j`).
pub fn factor(value: &TExpr) -> Factored<'_> {
    let (product, offset) = match &value.kind {
        Kind::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) if !uniform(a) && uniform(b) => {
            (&**a, Some((*op == BinOp::Sub, &**b)))
        }
        Kind::Binary(BinOp::Add, a, b) if uniform(a) && !uniform(b) => (&**b, Some((false, &**a))),
        _ => (value, None),
    };
    let mut factors = vec![];
    flatten(product, &mut factors);
    let (scale, elem): (Vec<_>, Vec<_>) = factors.into_iter().partition(|f| uniform(f));
    if elem.is_empty() {
        // Nothing depends on j (a one-element block): no factoring.
        return Factored {
            scale: vec![],
            elem: vec![value],
            offset: None,
        };
    }
    Factored {
        scale,
        elem,
        offset,
    }
}
