//! An interpreter for kernel IR, generic over the float type.
//!
//! It exists to prove that the IR `#[kernel]` extracts is the Rust body it came from:
//! run both on the same inputs (F = f64) and the outputs must be bit-identical. So every
//! operation here is the one the body performs: float math goes through the same `Real`
//! methods, integer math is checked the way a debug build checks it, and an ill-typed
//! tree or an out-of-bounds index panics instead of guessing.

use crate::kir::{BinOp, Builtin, Callee, Elem, Expr, Function, Kernel, Lit, ParamKind, Stmt, Ty, UnOp, ITEM};
use crate::real::Real;

/// One kernel argument (every param but the output, in order).
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a, F> {
    Buf(&'a [F]),
    IntBuf(&'a [i32]),
    Usize(usize),
    I32(i32),
    F(F),
    Bool(bool),
}

/// The output buffer: the whole output for [`eval`], one item's slice for [`eval_item`].
#[derive(Debug)]
pub enum Out<'a, F> {
    F(&'a mut [F]),
    I32(&'a mut [i32]),
}

/// Runs items `0..n_items`, item `i` writing `out[i * out_len ..][.. out_len]`.
pub fn eval<F: Real>(kernel: &Kernel, n_items: usize, out: Out<'_, F>, args: &[Arg<'_, F>]) {
    let len = out_len(kernel, args);
    match out {
        Out::F(o) => {
            for item in 0..n_items {
                eval_item(kernel, item, Out::F(&mut o[item * len..(item + 1) * len]), args);
            }
        }
        Out::I32(o) => {
            for item in 0..n_items {
                eval_item(kernel, item, Out::I32(&mut o[item * len..(item + 1) * len]), args);
            }
        }
    }
}

/// The per-item output length for these arguments.
pub fn out_len<F: Real>(kernel: &Kernel, args: &[Arg<'_, F>]) -> usize {
    let mut m = Machine::new(kernel, args, None);
    m.expr(&kernel.out_len).usize()
}

/// Runs one work item; `out` is that item's slice.
pub fn eval_item<F: Real>(kernel: &Kernel, item: usize, out: Out<'_, F>, args: &[Arg<'_, F>]) {
    let (_, elem) = kernel.out();
    match (&out, elem) {
        (Out::F(_), Elem::F) | (Out::I32(_), Elem::I32) => {}
        _ => panic!("kernel {}: output buffer has the wrong element type", kernel.name),
    }
    let mut m = Machine::new(kernel, args, Some(out));
    m.vars.push((ITEM, Value::Usize(item)));
    m.block(&kernel.body);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value<F> {
    Usize(usize),
    I32(i32),
    F(F),
    Bool(bool),
}

impl<F: Real> Value<F> {
    fn ty(self) -> Ty {
        match self {
            Value::Usize(_) => Ty::Usize,
            Value::I32(_) => Ty::I32,
            Value::F(_) => Ty::F,
            Value::Bool(_) => Ty::Bool,
        }
    }

    fn usize(self) -> usize {
        match self {
            Value::Usize(v) => v,
            v => panic!("expected usize, got {v:?}"),
        }
    }

    fn float(self) -> F {
        match self {
            Value::F(v) => v,
            v => panic!("expected F, got {v:?}"),
        }
    }

    fn bool(self) -> bool {
        match self {
            Value::Bool(v) => v,
            v => panic!("expected bool, got {v:?}"),
        }
    }
}

/// An input buffer, by element type.
enum Slice<'a, F> {
    F(&'a [F]),
    I32(&'a [i32]),
}

/// The state of one running body (a kernel item or a helper call).
struct Machine<'k, 'a, F> {
    kernel: &'k Kernel,
    inputs: Vec<(&'k str, Slice<'a, F>)>,
    out: Option<(&'k str, Out<'a, F>)>,
    /// Visible variables, innermost last; a block truncates back to its entry length.
    vars: Vec<(&'k str, Value<F>)>,
}

impl<'k, 'a, F: Real> Machine<'k, 'a, F> {
    /// Binds `args` to the kernel's inputs: scalars become variables, buffers inputs.
    fn new(kernel: &'k Kernel, args: &[Arg<'a, F>], out: Option<Out<'a, F>>) -> Self {
        let inputs_decl = kernel.inputs();
        assert_eq!(inputs_decl.len(), args.len(), "kernel {}: wrong number of arguments", kernel.name);
        let mut m = Machine { kernel, inputs: Vec::new(), out: out.map(|o| (kernel.out().0, o)), vars: Vec::new() };
        for (p, a) in inputs_decl.iter().zip(args) {
            let name = p.name.as_str();
            match (p.kind, *a) {
                (ParamKind::Buffer { elem: Elem::F, .. }, Arg::Buf(b)) => m.inputs.push((name, Slice::F(b))),
                (ParamKind::Buffer { elem: Elem::I32, .. }, Arg::IntBuf(b)) => m.inputs.push((name, Slice::I32(b))),
                (ParamKind::Scalar { ty: Ty::Usize }, Arg::Usize(v)) => m.vars.push((name, Value::Usize(v))),
                (ParamKind::Scalar { ty: Ty::I32 }, Arg::I32(v)) => m.vars.push((name, Value::I32(v))),
                (ParamKind::Scalar { ty: Ty::F }, Arg::F(v)) => m.vars.push((name, Value::F(v))),
                (ParamKind::Scalar { ty: Ty::Bool }, Arg::Bool(v)) => m.vars.push((name, Value::Bool(v))),
                (kind, a) => panic!("kernel {}: param {name} is {kind:?}, argument is {a:?}", kernel.name),
            }
        }
        m
    }

    fn block(&mut self, stmts: &'k [Stmt]) {
        let depth = self.vars.len();
        for s in stmts {
            self.stmt(s);
        }
        self.vars.truncate(depth);
    }

    fn stmt(&mut self, s: &'k Stmt) {
        match s {
            Stmt::Let { name, ty, init, .. } => {
                let v = self.expr(init);
                assert_eq!(v.ty(), *ty, "let {name}: declared {ty:?}, initialized with {v:?}");
                self.vars.push((name, v));
            }
            Stmt::Assign { name, value } => {
                let v = self.expr(value);
                self.set(name, v);
            }
            Stmt::CompoundAssign { name, op, value } => {
                let old = self.get(name);
                let rhs = self.expr(value);
                self.set(name, binary(*op, old, rhs));
            }
            Stmt::Store { buf, index, op, value } => {
                let i = self.expr(index).usize();
                let mut v = self.expr(value);
                if let Some(op) = op {
                    v = binary(*op, self.load(buf, i), v);
                }
                self.store(buf, i, v);
            }
            Stmt::For { var, start, end, body, .. } => {
                // Rust evaluates the range once, before the first iteration.
                let (lo, hi) = (self.expr(start).usize(), self.expr(end).usize());
                for v in lo..hi {
                    self.vars.push((var, Value::Usize(v)));
                    self.block(body);
                    self.vars.pop();
                }
            }
            Stmt::While { cond, body } => {
                while self.expr(cond).bool() {
                    self.block(body);
                }
            }
            Stmt::If { cond, then, otherwise } => {
                if self.expr(cond).bool() {
                    self.block(then);
                } else {
                    self.block(otherwise);
                }
            }
        }
    }

    fn get(&self, name: &str) -> Value<F> {
        match self.vars.iter().rev().find(|(n, _)| *n == name) {
            Some((_, v)) => *v,
            None => panic!("kernel {}: unknown variable {name}", self.kernel.name),
        }
    }

    fn set(&mut self, name: &str, v: Value<F>) {
        let slot = self.vars.iter_mut().rev().find(|(n, _)| *n == name);
        let (_, old) = slot.unwrap_or_else(|| panic!("assignment to unknown variable {name}"));
        assert_eq!(old.ty(), v.ty(), "assignment of {v:?} to {name}: {old:?}");
        *old = v;
    }

    fn load(&self, buf: &str, i: usize) -> Value<F> {
        if let Some((name, out)) = &self.out {
            if *name == buf {
                return match out {
                    Out::F(o) => Value::F(o[i]),
                    Out::I32(o) => Value::I32(o[i]),
                };
            }
        }
        match self.inputs.iter().find(|(n, _)| *n == buf) {
            Some((_, Slice::F(b))) => Value::F(b[i]),
            Some((_, Slice::I32(b))) => Value::I32(b[i]),
            None => panic!("kernel {}: unknown buffer {buf}", self.kernel.name),
        }
    }

    fn store(&mut self, buf: &str, i: usize, v: Value<F>) {
        match &mut self.out {
            Some((name, Out::F(o))) if *name == buf => o[i] = v.float(),
            Some((name, Out::I32(o))) if *name == buf => match v {
                Value::I32(x) => o[i] = x,
                v => panic!("store of {v:?} into i32 buffer {buf}"),
            },
            _ => panic!("kernel {}: store into {buf}, which is not the output", self.kernel.name),
        }
    }

    fn expr(&mut self, e: &'k Expr) -> Value<F> {
        match e {
            Expr::Lit(Lit::Usize(v)) => Value::Usize(usize::try_from(*v).expect("usize literal")),
            Expr::Lit(Lit::I32(v)) => Value::I32(*v),
            Expr::Lit(Lit::F(v)) => Value::F(F::from_f64(*v)),
            Expr::Lit(Lit::Bool(v)) => Value::Bool(*v),
            Expr::Var(name) => self.get(name),
            Expr::Index { buf, index } => {
                let i = self.expr(index).usize();
                self.load(buf, i)
            }
            Expr::Binary { op: BinOp::And, lhs, rhs } => Value::Bool(self.expr(lhs).bool() && self.expr(rhs).bool()),
            Expr::Binary { op: BinOp::Or, lhs, rhs } => Value::Bool(self.expr(lhs).bool() || self.expr(rhs).bool()),
            Expr::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs);
                let b = self.expr(rhs);
                binary(*op, a, b)
            }
            Expr::Unary { op, arg } => match (op, self.expr(arg)) {
                (UnOp::Neg, Value::F(v)) => Value::F(-v),
                (UnOp::Neg, Value::I32(v)) => Value::I32(v.checked_neg().expect("i32 negation overflow")),
                (UnOp::Not, Value::Bool(v)) => Value::Bool(!v),
                (op, v) => panic!("{op:?} of {v:?}"),
            },
            Expr::Cast { to, arg } => match (to, self.expr(arg)) {
                (Ty::Usize, Value::Usize(v)) => Value::Usize(v),
                (Ty::Usize, Value::I32(v)) => Value::Usize(v as usize),
                (Ty::I32, Value::I32(v)) => Value::I32(v),
                (Ty::I32, Value::Usize(v)) => Value::I32(v as i32),
                (Ty::F, Value::Usize(v)) => Value::F(F::from_usize(v)),
                (to, v) => panic!("cast of {v:?} to {to:?}"),
            },
            Expr::Call { callee: Callee::Builtin(b), args } => {
                let vals: Vec<Value<F>> = args.iter().map(|a| self.expr(a)).collect();
                builtin(*b, &vals)
            }
            Expr::Call { callee: Callee::Helper(name), args } => {
                let vals: Vec<Value<F>> = args.iter().map(|a| self.expr(a)).collect();
                let kernel = self.kernel;
                let f = kernel.helpers.iter().find(|f| &f.name == name);
                call_helper(kernel, f.unwrap_or_else(|| panic!("unknown helper {name}")), &vals)
            }
        }
    }
}

/// A helper runs in a machine of its own: it sees its params and nothing else.
fn call_helper<F: Real>(kernel: &Kernel, f: &Function, args: &[Value<F>]) -> Value<F> {
    assert_eq!(f.params.len(), args.len(), "helper {}: wrong number of arguments", f.name);
    let mut m = Machine { kernel, inputs: Vec::new(), out: None, vars: Vec::new() };
    for ((name, ty), v) in f.params.iter().zip(args) {
        assert_eq!(v.ty(), *ty, "helper {}: param {name} given {v:?}", f.name);
        m.vars.push((name, *v));
    }
    // The result may read the body's locals, so the statements run without a block
    // scope of their own.
    for s in &f.body {
        m.stmt(s);
    }
    let r = m.expr(&f.result);
    assert_eq!(r.ty(), f.ret, "helper {} returned {r:?}", f.name);
    r
}

fn binary<F: Real>(op: BinOp, a: Value<F>, b: Value<F>) -> Value<F> {
    use BinOp::*;
    match (a, b) {
        (Value::Usize(x), Value::Usize(y)) => match op {
            Add => Value::Usize(x.checked_add(y).expect("usize overflow")),
            Sub => Value::Usize(x.checked_sub(y).expect("usize underflow")),
            Mul => Value::Usize(x.checked_mul(y).expect("usize overflow")),
            Div => Value::Usize(x / y),
            Rem => Value::Usize(x % y),
            _ => Value::Bool(compare(op, &x, &y)),
        },
        (Value::I32(x), Value::I32(y)) => match op {
            Add => Value::I32(x.checked_add(y).expect("i32 overflow")),
            Sub => Value::I32(x.checked_sub(y).expect("i32 overflow")),
            Mul => Value::I32(x.checked_mul(y).expect("i32 overflow")),
            Div => Value::I32(x.checked_div(y).expect("i32 division")),
            Rem => Value::I32(x.checked_rem(y).expect("i32 remainder")),
            _ => Value::Bool(compare(op, &x, &y)),
        },
        (Value::F(x), Value::F(y)) => match op {
            Add => Value::F(x + y),
            Sub => Value::F(x - y),
            Mul => Value::F(x * y),
            Div => Value::F(x / y),
            _ => Value::Bool(compare(op, &x, &y)),
        },
        (Value::Bool(x), Value::Bool(y)) if matches!(op, Eq | Ne) => Value::Bool(compare(op, &x, &y)),
        (a, b) => panic!("{op:?} of {a:?} and {b:?}"),
    }
}

fn compare<T: PartialOrd>(op: BinOp, x: &T, y: &T) -> bool {
    match op {
        BinOp::Lt => x < y,
        BinOp::Le => x <= y,
        BinOp::Gt => x > y,
        BinOp::Ge => x >= y,
        BinOp::Eq => x == y,
        BinOp::Ne => x != y,
        op => panic!("{op:?} is not a comparison"),
    }
}

fn builtin<F: Real>(b: Builtin, args: &[Value<F>]) -> Value<F> {
    assert_eq!(args.len(), b.arity(), "{b:?}: wrong number of arguments");
    if let Builtin::MinUsize | Builtin::MaxUsize = b {
        let (x, y) = (args[0].usize(), args[1].usize());
        return Value::Usize(if b == Builtin::MinUsize { x.min(y) } else { x.max(y) });
    }
    let x = args[0].float();
    Value::F(match b {
        Builtin::Exp => x.exp(),
        Builtin::Ln => x.ln(),
        Builtin::Sqrt => x.sqrt(),
        Builtin::Abs => x.abs(),
        Builtin::Sin => x.sin(),
        Builtin::Cos => x.cos(),
        Builtin::Floor => x.floor(),
        Builtin::Ceil => x.ceil(),
        Builtin::Log2 => x.log2(),
        Builtin::Exp2 => x.exp2(),
        Builtin::Max => x.max(args[1].float()),
        Builtin::Min => x.min(args[1].float()),
        Builtin::Ln1p => x.ln_1p(),
        Builtin::RoundEven => x.round_even(),
        Builtin::Ilogb => x.ilogb(),
        Builtin::MinUsize | Builtin::MaxUsize => unreachable!(),
    })
}
