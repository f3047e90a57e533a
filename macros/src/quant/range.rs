//! Interval analysis of integer expressions. The macro proves with it that every field and
//! table index of a declaration is in bounds for all sub-block/element indices and all
//! possible block contents, which is what lets the generated CPU code skip bounds checks.
//!
//! Ranges are over the mathematical values (i128). Whenever an operation might leave its
//! type's range it wraps, and the result is widened to the whole type range: sound, and
//! precise enough for index arithmetic, which stays well inside u32.

use super::ty::Ty;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub lo: i128,
    pub hi: i128,
}

impl Range {
    pub fn new(lo: i128, hi: i128) -> Range {
        Range { lo, hi }
    }
    pub fn point(v: i128) -> Range {
        Range { lo: v, hi: v }
    }
    pub fn of(t: Ty) -> Range {
        let (lo, hi) = t.int_range();
        Range { lo, hi }
    }
    /// Self if it fits `t`, else all of `t` (the value may have wrapped).
    pub fn fit(self, t: Ty) -> Range {
        let all = Range::of(t);
        if self.lo >= all.lo && self.hi <= all.hi {
            self
        } else {
            all
        }
    }
    pub fn union(self, o: Range) -> Range {
        Range {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        }
    }
    fn non_negative(self) -> bool {
        self.lo >= 0
    }
}

/// Smallest all-ones number >= v (v >= 0).
fn ones_above(v: i128) -> i128 {
    let mut m = 0i128;
    while m < v {
        m = (m << 1) | 1;
    }
    m
}

/// min/max over candidate values, or None when one overflowed.
fn hull(vals: &[Option<i128>]) -> Option<Range> {
    let mut r: Option<Range> = None;
    for v in vals {
        let v = (*v)?;
        r = Some(match r {
            None => Range::point(v),
            Some(r) => r.union(Range::point(v)),
        });
    }
    r
}

pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// Range of `a op b` for an integer result of type `t` (`a` has type `t`; for shifts `b`
/// may have any integer type; for Div/Rem `b` is a non-zero constant).
pub fn binary(op: Op, t: Ty, a: Range, b: Range) -> Range {
    let all = Range::of(t);
    let r = match op {
        Op::Add => hull(&[a.lo.checked_add(b.lo), a.hi.checked_add(b.hi)]),
        Op::Sub => hull(&[a.lo.checked_sub(b.hi), a.hi.checked_sub(b.lo)]),
        Op::Mul => hull(&[
            a.lo.checked_mul(b.lo),
            a.lo.checked_mul(b.hi),
            a.hi.checked_mul(b.lo),
            a.hi.checked_mul(b.hi),
        ]),
        Op::Div if b.lo == b.hi && b.lo != 0 => {
            // Truncating division by a constant is monotone in the dividend.
            hull(&[Some(a.lo / b.lo), Some(a.hi / b.lo)])
        }
        Op::Rem if b.lo == b.hi && b.lo != 0 => {
            let m = b.lo.abs() - 1;
            Some(if a.non_negative() {
                Range::new(0, a.hi.min(m))
            } else {
                Range::new(-m, m)
            })
        }
        Op::And => match (a.non_negative(), b.non_negative()) {
            (true, true) => Some(Range::new(0, a.hi.min(b.hi))),
            (true, false) => Some(Range::new(0, a.hi)),
            (false, true) => Some(Range::new(0, b.hi)),
            _ => None,
        },
        Op::Or if a.non_negative() && b.non_negative() => {
            Some(Range::new(a.lo.max(b.lo), ones_above(a.hi.max(b.hi))))
        }
        Op::Xor if a.non_negative() && b.non_negative() => {
            Some(Range::new(0, ones_above(a.hi.max(b.hi))))
        }
        Op::Shl | Op::Shr => {
            // The amount is taken modulo the width.
            let w = t.bits() as i128;
            let (s0, s1) = if b.lo >= 0 && b.hi < w {
                (b.lo, b.hi)
            } else {
                (0, w - 1)
            };
            match op {
                Op::Shr => hull(&[
                    Some(a.lo >> s0),
                    Some(a.lo >> s1),
                    Some(a.hi >> s0),
                    Some(a.hi >> s1),
                ]),
                _ => hull(&[
                    a.lo.checked_mul(1i128 << s0),
                    a.lo.checked_mul(1i128 << s1),
                    a.hi.checked_mul(1i128 << s0),
                    a.hi.checked_mul(1i128 << s1),
                ]),
            }
        }
        _ => None,
    };
    r.map_or(all, |r| r.fit(t))
}

pub fn neg(t: Ty, a: Range) -> Range {
    Range::new(-a.hi, -a.lo).fit(t)
}

pub fn not(t: Ty, a: Range) -> Range {
    if t == Ty::Bool {
        return Range::of(t);
    }
    if t.is_signed() {
        Range::new(-a.hi - 1, -a.lo - 1)
    } else {
        let max = Range::of(t).hi;
        Range::new(max - a.hi, max - a.lo)
    }
}

/// Range after `as t` of an integer/bool with range `a` (None: the source is a float).
pub fn cast(t: Ty, a: Option<Range>) -> Range {
    match a {
        Some(a) => a.fit(t),
        None => Range::of(t),
    }
}
