//! The one renderer: kernel IR to C-style source text.
//!
//! Rust, CUDA C++, WGSL and MSL agree on almost everything a kernel body needs (infix
//! operators with the same precedence, `x = e;`, braces, `if`/`while`/`for`), so the
//! walk over statements and expressions lives here once. A target is a [`Dialect`]:
//! it spells types, literals, casts, builtins, declarations and loop headers, and
//! writes the kernel's signature and prologue (where the work item comes from, how
//! scalar params arrive, where this item's output starts). Nothing about the math is
//! decided by a dialect.

use ds4_ir::kir::{BinOp, Builtin, Callee, Expr, Function, Kernel, Lit, LoopMode, Stmt, Ty, UnOp};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Write;

/// Threads per block of a kernel that runs its `'par`/`'sum` loops in parallel.
pub const PAR_THREADS: u32 = 512;

/// Operator binding strength, weakest first; the same table fits every target for the
/// operators kernel IR has. `CAST` is Rust's `as`; C casts bind like unary operators.
pub mod prec {
    pub const OR: u8 = 1;
    pub const AND: u8 = 2;
    pub const CMP: u8 = 3;
    pub const ADD: u8 = 4;
    pub const MUL: u8 = 5;
    pub const CAST: u8 = 6;
    pub const UNARY: u8 = 7;
    /// Calls, indexing, names and literals: never need parentheses.
    pub const ATOM: u8 = 8;
}

/// Rendered expression text and how strongly its outermost operator binds.
#[derive(Clone, Debug)]
pub struct Code {
    pub text: String,
    pub prec: u8,
}

impl Code {
    pub fn new(text: impl Into<String>, prec: u8) -> Code {
        Code { text: text.into(), prec }
    }

    /// Text that needs no parentheses anywhere (a name, a call, a literal).
    pub fn atom(text: impl Into<String>) -> Code {
        Code::new(text, prec::ATOM)
    }

    /// The text, parenthesized if it binds weaker than `min`.
    pub fn at(&self, min: u8) -> String {
        if self.prec < min {
            format!("({})", self.text)
        } else {
            self.text.clone()
        }
    }
}

/// What a target spells its own way.
pub trait Dialect {
    /// A scalar type.
    fn ty(&self, t: Ty) -> &'static str;
    fn lit(&self, l: Lit) -> Code;
    fn cast(&self, to: Ty, arg: Code) -> Code;
    /// A builtin call; `args[0]` is Rust's receiver.
    fn builtin(&self, f: Builtin, args: Vec<Code>) -> Code;
    /// A name from the kernel, renamed if the target reserves it.
    fn ident(&self, name: &str) -> String {
        name.to_string()
    }
    /// `buf[index]`, as a load and as a store target.
    fn element(&self, _k: &Kernel, buf: &str, index: Code) -> Code {
        Code::atom(format!("{}[{}]", self.ident(buf), index.text))
    }
    /// A whole local declaration statement.
    fn declare(&self, name: &str, ty: Ty, mutable: bool, init: &str) -> String;
    /// `for` header up to (not including) the opening brace.
    fn for_header(&self, var: &str, start: &str, end: &str) -> String;
    /// A line before a serial loop inside a thread loop (a thread's own short loop, such
    /// as `hc_expand`'s over the streams), where the target takes a hint.
    fn inner_loop_hint(&self) -> Option<&'static str> {
        None
    }
    /// An `if`/`while` condition as written after the keyword.
    fn condition(&self, cond: &str) -> String {
        format!("({cond})")
    }
    /// Everything before the helpers: headers, type aliases, builtin shims.
    fn prelude(&self, k: &Kernel) -> String;
    /// A helper's signature up to (not including) the opening brace.
    fn helper_signature(&self, f: &Function) -> String;
    /// The helper's `return` of `value`.
    fn helper_return(&self, value: &str) -> String {
        format!("return {value};")
    }
    /// The kernel's signature, opening brace and prologue lines (indented one level),
    /// given the rendered per-item output length; `parallel`: every thread of the block
    /// runs the body (else one thread runs it and the others leave).
    fn kernel_open(&self, k: &Kernel, out_len: &str, parallel: bool) -> String;
    /// Lines before the kernel's closing brace (CUDA: a staged output's copy back).
    fn kernel_close(&self, _k: &Kernel, _out_len: &str, _parallel: bool) -> String {
        String::new()
    }

    /// Targets that spread `'par`/`'sum` loops over a block's threads override these
    /// three; the others run every loop serially (one thread per item).
    /// A loop over `start..end` strided by the block's threads, up to the brace;
    /// `split`: also strided over the blocks along y (see [`splits_items`]).
    fn thread_loop_header(&self, _var: &str, _start: &str, _end: &str, _split: bool) -> Option<String> {
        None
    }
    /// A block-wide barrier statement.
    fn barrier(&self) -> String {
        String::new()
    }
    /// An expression: the sum over the block's threads of each one's `part` (every
    /// thread gets it; contains barriers, so every thread must reach it).
    fn block_sum(&self, part: &str) -> String {
        part.to_string()
    }
}

/// Whether `d` runs `k` with a block of threads per item: the target can, the body has a
/// `'par`/`'sum` loop, and every buffer store is inside one (code outside them runs in
/// every thread alike, which is only sound while it writes no buffer).
pub fn runs_parallel(d: &dyn Dialect, k: &Kernel) -> bool {
    fn scan(stmts: &[Stmt], inside: bool, any_par: &mut bool) -> bool {
        stmts.iter().all(|st| match st {
            Stmt::Store { .. } => inside,
            Stmt::For { body, mode, .. } => {
                let par = *mode != LoopMode::Serial;
                *any_par |= par;
                scan(body, inside || par, any_par)
            }
            Stmt::While { body, .. } => scan(body, inside, any_par),
            Stmt::If { then, otherwise, .. } => scan(then, inside, any_par) && scan(otherwise, inside, any_par),
            _ => true,
        })
    }
    let mut any_par = false;
    d.thread_loop_header("i", "0", "1", false).is_some() && scan(&k.body, false, &mut any_par) && any_par
}

/// The largest trip count of `k`'s `'par`/`'sum` loops when every one of them is known
/// when the kernel is generated (bounds of literals and of immutable lets of literals,
/// through `+ - * /`), else None.
pub fn par_trips(k: &Kernel) -> Option<u64> {
    use ds4_ir::kir::{BinOp, Lit};
    use std::collections::HashSet;
    /// The names a statement list assigns (or declares mutable): never constants.
    fn assigned(stmts: &[Stmt], out: &mut HashSet<String>) {
        for st in stmts {
            match st {
                Stmt::Let { name, mutable: true, .. } | Stmt::Assign { name, .. } | Stmt::CompoundAssign { name, .. } => {
                    out.insert(name.clone());
                }
                Stmt::For { body, .. } | Stmt::While { body, .. } => assigned(body, out),
                Stmt::If { then, otherwise, .. } => {
                    assigned(then, out);
                    assigned(otherwise, out);
                }
                _ => {}
            }
        }
    }
    /// Names in scope, innermost last: a constant, or None for any other value.
    type Scope = Vec<(String, Option<u64>)>;
    fn value(e: &Expr, scope: &Scope) -> Option<u64> {
        match e {
            Expr::Lit(Lit::Usize(v)) => Some(*v),
            Expr::Var(n) => scope.iter().rev().find(|c| &c.0 == n)?.1,
            Expr::Binary { op, lhs, rhs } => {
                let (a, b) = (value(lhs, scope)?, value(rhs, scope)?);
                match op {
                    BinOp::Add => a.checked_add(b),
                    BinOp::Sub => a.checked_sub(b),
                    BinOp::Mul => a.checked_mul(b),
                    BinOp::Div => a.checked_div(b),
                    _ => None,
                }
            }
            _ => None,
        }
    }
    fn scan(stmts: &[Stmt], scope: &mut Scope, vars: &HashSet<String>, most: &mut u64) -> Option<()> {
        let depth = scope.len();
        for st in stmts {
            match st {
                Stmt::Let { name, init, .. } => {
                    let v = if vars.contains(name) { None } else { value(init, scope) };
                    scope.push((name.clone(), v));
                }
                Stmt::For { start, end, body, mode, var } => {
                    if *mode != LoopMode::Serial {
                        let trips = value(end, scope)?.saturating_sub(value(start, scope)?);
                        *most = (*most).max(trips);
                    }
                    scope.push((var.clone(), None));
                    scan(body, scope, vars, most)?;
                    scope.pop();
                }
                Stmt::While { body, .. } => scan(body, scope, vars, most)?,
                Stmt::If { then, otherwise, .. } => {
                    scan(then, scope, vars, most)?;
                    scan(otherwise, scope, vars, most)?;
                }
                _ => {}
            }
        }
        scope.truncate(depth);
        Some(())
    }
    let mut vars = HashSet::new();
    assigned(&k.body, &mut vars);
    let mut most = 0;
    scan(&k.body, &mut Vec::new(), &vars, &mut most)?;
    Some(most)
}

/// Whether `d` may spread one item of `k` over several blocks (along y): it runs in
/// parallel, its one `'par` loop is all the item's work (no `'sum`, so no block-wide
/// value; no second loop, so no barrier between loops that blocks could not share), and
/// it never reads its output (so no iteration depends on another's store).
/// A decode step has one item per token: this gives its big element-wise ops (the
/// hyper-connection expansions, the compressor pooling) more than one block.
pub fn splits_items(d: &dyn Dialect, k: &Kernel) -> bool {
    runs_parallel(d, k) && !k.has_sum_loop() && par_loops(&k.body) == 1 && !reads_output(k)
}

/// `'par`/`'sum` loops in `stmts`, nested ones included.
fn par_loops(stmts: &[Stmt]) -> usize {
    stmts
        .iter()
        .map(|st| match st {
            Stmt::For { body, mode, .. } => (*mode != LoopMode::Serial) as usize + par_loops(body),
            Stmt::While { body, .. } => par_loops(body),
            Stmt::If { then, otherwise, .. } => par_loops(then) + par_loops(otherwise),
            _ => 0,
        })
        .sum()
}

/// Whether `k` reads back what it wrote to its output (loads, or `out[i] op= v`).
pub fn reads_output(k: &Kernel) -> bool {
    fn updates(stmts: &[Stmt], out: &str) -> bool {
        stmts.iter().any(|st| match st {
            Stmt::Store { buf, op, .. } => buf == out && op.is_some(),
            Stmt::For { body, .. } | Stmt::While { body, .. } => updates(body, out),
            Stmt::If { then, otherwise, .. } => updates(then, out) || updates(otherwise, out),
            _ => false,
        })
    }
    let out = k.out().0;
    let mut loads = false;
    ds4_ir::kir::walk_exprs(&k.body, &mut |e| loads |= matches!(e, Expr::Index { buf, .. } if buf == out));
    loads || updates(&k.body, out)
}

/// Renders `k` in dialect `d`.
pub fn render_kernel(d: &dyn Dialect, k: &Kernel) -> String {
    let parallel = runs_parallel(d, k);
    let split = splits_items(d, k);
    let r = Renderer { d, k, parallel, split, in_par: Cell::new(false), rename: RefCell::new(HashMap::new()) };
    let mut s = d.prelude(k);
    s.push_str(&r.helpers());
    let out_len = r.expr(&k.out_len).text;
    s.push_str(&d.kernel_open(k, &out_len, parallel));
    r.block(&mut s, &k.body, 1);
    s.push_str(&d.kernel_close(k, &out_len, parallel));
    s.push_str("}\n");
    s
}

/// `k`'s helper functions alone, in dialect `d` (for CUDA text that uses an op kernel's
/// helpers: `cuda_norm_rope.rs`).
pub fn render_helpers(d: &dyn Dialect, k: &Kernel) -> String {
    let r = Renderer { d, k, parallel: runs_parallel(d, k), split: splits_items(d, k), in_par: Cell::new(false), rename: RefCell::new(HashMap::new()) };
    r.helpers()
}

/// The helpers of op kernel `name` (`ds4_ir::kernels`), rendered for `d`: how a kernel
/// written as target text takes an op's arithmetic from its IR instead of restating it.
pub fn op_helpers(d: &dyn Dialect, name: &str) -> String {
    let k = ds4_ir::kernels::all().into_iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} is an op kernel"));
    render_helpers(d, &k)
}

struct Renderer<'a> {
    d: &'a dyn Dialect,
    k: &'a Kernel,
    /// The kernel runs a block of threads per item (see [`runs_parallel`]).
    parallel: bool,
    /// Its parallel loop is also strided over blocks along y (see [`splits_items`]).
    split: bool,
    /// Inside a parallel loop: nested ones run serially in their thread.
    in_par: Cell<bool>,
    /// Locals spelled differently inside a `'sum` loop (the accumulator → its partial).
    rename: RefCell<HashMap<String, String>>,
}

impl Renderer<'_> {
    /// The kernel's helper functions.
    fn helpers(&self) -> String {
        let mut s = String::new();
        for h in &self.k.helpers {
            let _ = writeln!(s, "{} {{", self.d.helper_signature(h));
            self.block(&mut s, &h.body, 1);
            let _ = writeln!(s, "    {}", self.d.helper_return(&self.expr(&h.result).text));
            s.push_str("}\n\n");
        }
        s
    }

    /// A local's or param's name as the target spells it here.
    fn name(&self, n: &str) -> String {
        match self.rename.borrow().get(n) {
            Some(r) => r.clone(),
            None => self.d.ident(n),
        }
    }

    /// A `'par` or `'sum` loop spread over the block's threads.
    fn thread_loop(&self, s: &mut String, header: &str, body: &[Stmt], mode: &LoopMode, depth: usize) {
        let pad = "    ".repeat(depth);
        let d = self.d;
        self.in_par.set(true);
        match mode {
            LoopMode::Sum { acc } => {
                // Each thread adds its iterations into a partial of its own; then the
                // block's partials are summed and added to the accumulator everywhere.
                let part = format!("{}_part", self.name(acc));
                let _ = writeln!(s, "{pad}{{");
                let _ = writeln!(s, "{pad}    {}", d.declare(&part, Ty::F, true, &d.lit(Lit::F(0.0)).text));
                self.rename.borrow_mut().insert(acc.clone(), part.clone());
                let _ = writeln!(s, "{pad}    {header} {{");
                self.block(s, body, depth + 2);
                let _ = writeln!(s, "{pad}    }}");
                self.rename.borrow_mut().remove(acc);
                let _ = writeln!(s, "{pad}    {} += {};", self.name(acc), d.block_sum(&part));
                let _ = writeln!(s, "{pad}}}");
            }
            _ => {
                // Barriers on both sides: no thread still runs code before the loop that
                // reads what the loop writes, and everything after sees all of it.
                let _ = writeln!(s, "{pad}{}", d.barrier());
                let _ = writeln!(s, "{pad}{header} {{");
                self.block(s, body, depth + 1);
                let _ = writeln!(s, "{pad}}}");
                let _ = writeln!(s, "{pad}{}", d.barrier());
            }
        }
        self.in_par.set(false);
    }

    fn block(&self, s: &mut String, stmts: &[Stmt], depth: usize) {
        for st in stmts {
            self.stmt(s, st, depth);
        }
    }

    fn stmt(&self, s: &mut String, st: &Stmt, depth: usize) {
        let pad = "    ".repeat(depth);
        let d = self.d;
        match st {
            Stmt::Let { name, ty, mutable, init } => {
                let _ = writeln!(s, "{pad}{}", d.declare(&self.name(name), *ty, *mutable, &self.expr(init).text));
            }
            Stmt::Assign { name, value } => {
                let _ = writeln!(s, "{pad}{} = {};", self.name(name), self.expr(value).text);
            }
            Stmt::CompoundAssign { name, op, value } => {
                let _ = writeln!(s, "{pad}{} {}= {};", self.name(name), op.symbol(), self.expr(value).text);
            }
            Stmt::Store { buf, index, op, value } => {
                let target = d.element(self.k, buf, self.expr(index)).text;
                let op = op.map_or("", BinOp::symbol);
                let _ = writeln!(s, "{pad}{target} {op}= {};", self.expr(value).text);
            }
            Stmt::For { var, start, end, body, mode } => {
                let (v, a, b) = (self.name(var), self.expr(start).text, self.expr(end).text);
                if self.parallel && *mode != LoopMode::Serial && !self.in_par.get() {
                    let header = d.thread_loop_header(&v, &a, &b, self.split).expect("runs_parallel checked the target");
                    self.thread_loop(s, &header, body, mode, depth);
                    return;
                }
                let header = d.for_header(&v, &a, &b);
                if let Some(hint) = d.inner_loop_hint().filter(|_| self.in_par.get()) {
                    let _ = writeln!(s, "{pad}{hint}");
                }
                let _ = writeln!(s, "{pad}{header} {{");
                self.block(s, body, depth + 1);
                let _ = writeln!(s, "{pad}}}");
            }
            Stmt::While { cond, body } => {
                let _ = writeln!(s, "{pad}while {} {{", d.condition(&self.expr(cond).text));
                self.block(s, body, depth + 1);
                let _ = writeln!(s, "{pad}}}");
            }
            Stmt::If { .. } => {
                s.push_str(&pad);
                self.if_chain(s, st, depth);
                s.push('\n');
            }
        }
    }

    /// `if .. { } else if .. { } else { }` without the leading indent or the final newline.
    fn if_chain(&self, s: &mut String, st: &Stmt, depth: usize) {
        let Stmt::If { cond, then, otherwise } = st else { unreachable!() };
        let pad = "    ".repeat(depth);
        let _ = writeln!(s, "if {} {{", self.d.condition(&self.expr(cond).text));
        self.block(s, then, depth + 1);
        let _ = write!(s, "{pad}}}");
        match otherwise.as_slice() {
            [] => {}
            [elif @ Stmt::If { .. }] => {
                s.push_str(" else ");
                self.if_chain(s, elif, depth);
            }
            other => {
                s.push_str(" else {\n");
                self.block(s, other, depth + 1);
                let _ = write!(s, "{pad}}}");
            }
        }
    }

    fn expr(&self, e: &Expr) -> Code {
        let d = self.d;
        match e {
            Expr::Lit(l) => d.lit(*l),
            Expr::Var(v) => Code::atom(self.name(v)),
            Expr::Index { buf, index } => d.element(self.k, buf, self.expr(index)),
            Expr::Binary { op, lhs, rhs } => {
                let (l, r) = (self.expr(lhs), self.expr(rhs));
                // Left-associative: the right operand needs parentheses at equal strength
                // (`a - (b - c)`). Comparisons never chain, and `&&` inside `||` is always
                // parenthesized (WGSL requires it).
                let (p, lmin, rmin) = match op {
                    BinOp::Or => (prec::OR, prec::AND + 1, prec::AND + 1),
                    BinOp::And => (prec::AND, prec::AND, prec::AND + 1),
                    op if op.is_comparison() => (prec::CMP, prec::CMP + 1, prec::CMP + 1),
                    BinOp::Add | BinOp::Sub => (prec::ADD, prec::ADD, prec::ADD + 1),
                    _ => (prec::MUL, prec::MUL, prec::MUL + 1),
                };
                Code::new(format!("{} {} {}", l.at(lmin), op.symbol(), r.at(rmin)), p)
            }
            Expr::Unary { op, arg } => {
                let sym = match op {
                    UnOp::Neg => "-",
                    UnOp::Not => "!",
                };
                // `-(-x)`, never `--x`.
                Code::new(format!("{sym}{}", self.expr(arg).at(prec::ATOM)), prec::UNARY)
            }
            Expr::Cast { to, arg } => d.cast(*to, self.expr(arg)),
            Expr::Call { callee: Callee::Builtin(b), args } => {
                d.builtin(*b, args.iter().map(|a| self.expr(a)).collect())
            }
            Expr::Call { callee: Callee::Helper(name), args } => {
                let args: Vec<String> = args.iter().map(|a| self.expr(a).text).collect();
                Code::atom(format!("{}({})", d.ident(name), args.join(", ")))
            }
        }
    }
}

/// `name(args..)`, the call form of C, WGSL and MSL.
pub fn call(name: &str, args: &[Code]) -> Code {
    let args: Vec<&str> = args.iter().map(|a| a.text.as_str()).collect();
    Code::atom(format!("{name}({})", args.join(", ")))
}

/// A literal as the C-family targets (CUDA, Metal) spell it: integers plain (C's usual
/// conversions give them the other operand's type), floats with an `f` suffix, and the
/// infinities as `infinity(negative)` says (each target has its own spelling).
pub fn c_lit(l: Lit, infinity: impl Fn(bool) -> Code) -> Code {
    match l {
        Lit::Usize(v) => Code::atom(format!("{v}")),
        Lit::I32(v) if v < 0 => Code::new(format!("{v}"), prec::UNARY),
        Lit::I32(v) => Code::atom(format!("{v}")),
        Lit::Bool(b) => Code::atom(format!("{b}")),
        Lit::F(v) if v.is_infinite() => infinity(v < 0.0),
        Lit::F(v) => {
            let t = format!("{}f", f32_digits(v));
            let p = if t.starts_with('-') { prec::UNARY } else { prec::ATOM };
            Code::new(t, p)
        }
    }
}

/// A C-style cast of `arg` to the type spelled `ty`.
pub fn c_cast(ty: &str, arg: Code) -> Code {
    Code::new(format!("({ty}){}", arg.at(prec::ATOM)), prec::UNARY)
}

/// The `ds4_ln_1p` shim of the targets with no log1p (WGSL, MSL), under `signature`
/// (`fn ds4_ln_1p(x: f32) -> f32`, `static inline float ds4_ln_1p(float x)`), `log` being
/// the target's logarithm: ln(1 + x) by its series to x⁷ where |x| < 0.1 (the rest below
/// |x|·1.3e-8), `log(1 + x)` beyond. Near 1, Vulkan lets `log` be off by 2^-21 absolute
/// and a fast-math compiler may fold (1 + x) - 1 to x, which undoes Goldberg's
/// correction: on lavapipe that correction measured off by up to 3.5% of ln(1 + x)
/// (`wgsl_kernels`). The statements are ones both languages spell alike.
pub fn ln_1p_shim(signature: &str, log: &str) -> String {
    let series = "x * (1.0f - x * (0.5f - x * (0.33333334f - x * (0.25f - x * (0.2f - x * (0.16666667f - x * 0.14285715f))))))";
    format!("{signature} {{\n    if (abs(x) < 0.1f) {{\n        return {series};\n    }}\n    return {log}(1.0f + x);\n}}\n\n")
}

/// A C-family local declaration of type `ty` (spelled), `const` unless `mutable`.
pub fn c_declare(ty: &str, name: &str, mutable: bool, init: &str) -> String {
    let c = if mutable { "" } else { "const " };
    format!("{c}{ty} {name} = {init};")
}

/// A C-family counting `for` header over an index of type `index` (spelled), up to the
/// opening brace.
pub fn c_for(index: &str, var: &str, start: &str, end: &str) -> String {
    format!("for ({index} {var} = {start}; {var} < {end}; {var}++)")
}

/// The shortest decimal that reads back as `v` rounded to f32, the float type of the
/// GPU targets (`F::from_f64(v)` with F = f32). Finite values only.
pub fn f32_digits(v: f64) -> String {
    let x = v as f32;
    assert!(x.is_finite(), "f32_digits of {v}");
    // Rust's Debug prints the shortest round-tripping form, always with a '.' or an 'e'.
    format!("{x:?}")
}

/// C++ keywords: reserved in CUDA C++ and in MSL alike (each dialect adds its own names).
pub const CXX_KEYWORDS: &[&str] = &[
    "auto",
    "break",
    "case",
    "char",
    "class",
    "const",
    "continue",
    "default",
    "delete",
    "do",
    "double",
    "else",
    "enum",
    "extern",
    "float",
    "for",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "new",
    "operator",
    "private",
    "public",
    "register",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "struct",
    "switch",
    "template",
    "this",
    "typedef",
    "union",
    "unsigned",
    "void",
    "volatile",
    "while",
    "namespace",
    "using",
    "true",
    "false",
    "bool",
];

/// Appends `_` to names any of `lists` reserves.
pub fn escape_any(name: &str, lists: &[&[&str]]) -> String {
    if lists.iter().any(|l| l.contains(&name)) {
        format!("{name}_")
    } else {
        name.to_string()
    }
}

/// Appends `_` to names a target reserves.
pub fn escape(name: &str, reserved: &[&str]) -> String {
    if reserved.contains(&name) {
        format!("{name}_")
    } else {
        name.to_string()
    }
}
