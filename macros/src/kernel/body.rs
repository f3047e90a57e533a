//! Lowering a kernel body (a syn tree) to tokens that build `ds4_ir::kir` values.
//!
//! The IR is typed, and the Rust source leaves integer literals' types to inference,
//! so lowering is two steps per expression: build a typed tree (`Typed`) where an
//! integer literal starts as `T::Int` and takes the type of whatever it meets (the
//! other operand, the local, the buffer, the index), then emit it. A literal nothing
//! constrains is a `usize`, as in the bodies (`let mut lo = 0;`, `let n = 128;`). Where
//! Rust would infer something else from a *later* use, the type check here fails loudly
//! (assigning an i32 to that usize local is a compile error), never silently.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;

/// Macro-side scalar types; `Int` is an integer literal whose type is not known yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum T {
    Usize,
    I32,
    F,
    Bool,
    Int,
}

impl T {
    pub(crate) fn kir(self) -> TokenStream {
        let k = super::kir();
        match self {
            T::Usize | T::Int => quote!(#k::Ty::Usize),
            T::I32 => quote!(#k::Ty::I32),
            T::F => quote!(#k::Ty::F),
            T::Bool => quote!(#k::Ty::Bool),
        }
    }

    fn name(self) -> &'static str {
        match self {
            T::Usize => "usize",
            T::I32 => "i32",
            T::F => "F",
            T::Bool => "bool",
            T::Int => "an integer literal",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PKind {
    Buffer { elem: T, mutable: bool },
    Scalar(T),
}

#[derive(Clone, Debug)]
pub(crate) struct ParamInfo {
    pub name: String,
    pub kind: PKind,
}

struct Local {
    name: String,
    ty: T,
    mutable: bool,
}

/// A typed expression, before emission.
struct Typed {
    e: E,
    ty: T,
    span: Span,
}

enum E {
    Int(i128),
    Float(f64),
    Bool(bool),
    /// An upper-case `usize` constant of the kernel's module (e.g. `COMP_CAUSAL`); its
    /// value is read when `<name>_kir()` runs.
    Const(syn::Path),
    Var(String),
    Index(String, Box<Typed>),
    Bin(&'static str, Box<Typed>, Box<Typed>),
    Neg(Box<Typed>),
    Not(Box<Typed>),
    Cast(T, Box<Typed>),
    Builtin(&'static str, Vec<Typed>),
    Helper(String, Vec<Typed>),
}

type Result<X> = syn::Result<X>;

fn err<X>(span: Span, msg: impl std::fmt::Display) -> Result<X> {
    Err(syn::Error::new(span, msg))
}

pub(crate) struct Lowerer {
    float: Option<syn::Ident>,
    params: Vec<ParamInfo>,
    /// Kernel bodies see `item`; helpers and the `out` expression do not.
    allow_item: bool,
    /// Kernel bodies may call helpers; helpers may not (their IR lists no dependencies).
    allow_helpers: bool,
    scopes: Vec<Vec<Local>>,
    /// Helpers called, in order of first call, with the first call's span.
    pub helpers: Vec<(String, Span)>,
    /// Every local assigned so far, in order (for the loop-bound check and the parallel
    /// loops' rules).
    assigned: Vec<Assigned>,
}

#[derive(Clone, Copy)]
enum LoopKind {
    Serial,
    Par,
    Sum,
}

/// One assignment to a local: which scope declared it, and how it was assigned.
struct Assigned {
    name: String,
    /// Index into `scopes` of the declaring block.
    scope: usize,
    /// The compound operator (`Add` for `+=`), None for `=`.
    op: Option<&'static str>,
    ty: T,
}

impl Lowerer {
    pub(crate) fn new(
        float: Option<syn::Ident>,
        params: Vec<ParamInfo>,
        allow_item: bool,
        allow_helpers: bool,
    ) -> Self {
        Lowerer {
            float,
            params,
            allow_item,
            allow_helpers,
            scopes: Vec::new(),
            helpers: Vec::new(),
            assigned: Vec::new(),
        }
    }

    /// A `usize` expression (the `out` length).
    pub(crate) fn usize_expr(&mut self, e: &syn::Expr) -> Result<TokenStream> {
        let mut t = self.expr(e)?;
        coerce(&mut t, T::Usize)?;
        emit(&t)
    }

    /// A `{ .. }` block as tokens of a `Vec<Stmt>`.
    pub(crate) fn block(&mut self, b: &syn::Block) -> Result<TokenStream> {
        self.block_with(b, Vec::new())
    }

    /// A block whose scope starts with `locals` (a loop variable).
    fn block_with(&mut self, b: &syn::Block, locals: Vec<Local>) -> Result<TokenStream> {
        self.scopes.push(locals);
        let stmts = b.stmts.iter().map(|s| self.stmt(s)).collect::<Result<Vec<_>>>();
        self.scopes.pop();
        let stmts = stmts?;
        Ok(quote!(vec![#(#stmts),*]))
    }

    /// A helper's body: statements, then the tail expression as the result.
    pub(crate) fn helper_body(&mut self, b: &syn::Block) -> Result<(TokenStream, TokenStream)> {
        let Some((syn::Stmt::Expr(tail, None), init)) = b.stmts.split_last() else {
            return err(b.span(), "a kernel helper ends with its result expression (no `return`)");
        };
        self.scopes.push(Vec::new());
        let stmts = init.iter().map(|s| self.stmt(s)).collect::<Result<Vec<_>>>()?;
        let mut result = self.expr(tail)?;
        coerce(&mut result, T::F)?;
        let result = emit(&result)?;
        self.scopes.pop();
        Ok((quote!(vec![#(#stmts),*]), result))
    }

    // ---- statements ----

    fn stmt(&mut self, s: &syn::Stmt) -> Result<TokenStream> {
        match s {
            syn::Stmt::Local(l) => self.local(l),
            syn::Stmt::Expr(e, _) => self.stmt_expr(e),
            other => {
                err(other.span(), "only `let`, assignments, `for`, `while` and `if` are supported in kernel bodies")
            }
        }
    }

    fn local(&mut self, l: &syn::Local) -> Result<TokenStream> {
        let (pat, annotation) = match &l.pat {
            syn::Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        let syn::Pat::Ident(pi) = pat else { return err(l.pat.span(), "expected `let name` or `let mut name`") };
        if pi.by_ref.is_some() || pi.subpat.is_some() {
            return err(pi.span(), "expected `let name` or `let mut name`");
        }
        let Some(init) = &l.init else { return err(l.span(), "a local needs an initializer") };
        if init.diverge.is_some() {
            return err(l.span(), "`let .. else` is not supported");
        }
        let name = pi.ident.to_string();
        self.check_new_name(&name, pi.ident.span())?;
        let mut value = self.expr(&init.expr)?;
        let ty = match annotation {
            Some(ty) => match super::scalar_type(ty, self.float.as_ref()) {
                Some(t) => t,
                None => return err(ty.span(), "locals are usize, i32, bool or F"),
            },
            None if value.ty == T::Int => T::Usize,
            None => value.ty,
        };
        coerce(&mut value, ty)?;
        let mutable = pi.mutability.is_some();
        self.scopes.last_mut().expect("inside a block").push(Local { name: name.clone(), ty, mutable });
        let (k, ty, init) = (super::kir(), ty.kir(), emit(&value)?);
        Ok(quote!(#k::Stmt::Let { name: #name.to_string(), ty: #ty, mutable: #mutable, init: #init }))
    }

    /// Checks a labelled loop's rules against what its body assigned (`body_scope`: the
    /// scope index of the body's outermost block) and returns its `LoopMode` tokens.
    /// `'par`: the body assigns no local declared outside it, so iterations are
    /// independent apart from the distinct `out` elements they write. `'sum`: the same,
    /// except one float local declared outside, only ever `+=`-ed: the accumulator.
    fn loop_mode(&self, kind: LoopKind, assigned: &[Assigned], body_scope: usize, span: Span) -> Result<TokenStream> {
        let k = super::kir();
        let outer: Vec<&Assigned> = assigned.iter().filter(|a| a.scope < body_scope).collect();
        match kind {
            LoopKind::Serial => Ok(quote!(#k::LoopMode::Serial)),
            LoopKind::Par => match outer.first() {
                Some(a) => err(span, format!("a `'par` loop may not assign `{}`, declared outside it: its iterations run in parallel", a.name)),
                None => Ok(quote!(#k::LoopMode::Parallel)),
            },
            LoopKind::Sum => {
                let Some(acc) = outer.first() else {
                    return err(span, "a `'sum` loop adds into one float local declared outside it (`acc += ..`); this one assigns none");
                };
                if let Some(bad) = outer.iter().find(|a| a.name != acc.name || a.op != Some("Add") || a.ty != T::F) {
                    return err(span, format!("a `'sum` loop may only `+=` one float local declared outside it (`{}`); it also assigns `{}` another way", acc.name, bad.name));
                }
                let name = &acc.name;
                Ok(quote!(#k::LoopMode::Sum { acc: #name.to_string() }))
            }
        }
    }

    /// A new local may not reuse a param's name (C has params and the outermost locals
    /// in one scope) nor a name of its own block (C and WGSL forbid redeclaration).
    fn check_new_name(&self, name: &str, span: Span) -> Result<()> {
        self.check_not_param(name, span)?;
        if self.scopes.last().is_some_and(|s| s.iter().any(|l| l.name == name)) {
            return err(
                span,
                format!("`{name}` is already declared in this block; shadowing is not supported in kernel bodies"),
            );
        }
        Ok(())
    }

    /// Params, `item` and `ds4_*` names are taken in every scope of the generated code.
    fn check_not_param(&self, name: &str, span: Span) -> Result<()> {
        if name.starts_with("ds4_") {
            return err(span, "names starting with `ds4_` are reserved for generated code");
        }
        if name == "item" || self.params.iter().any(|p| p.name == name) {
            return err(span, format!("`{name}` is a param; use another name for the local"));
        }
        Ok(())
    }

    fn stmt_expr(&mut self, e: &syn::Expr) -> Result<TokenStream> {
        let k = super::kir();
        match e {
            syn::Expr::Assign(a) => self.assign(&a.left, None, &a.right),
            syn::Expr::Binary(b) => match compound_op(&b.op) {
                Some(op) => self.assign(&b.left, Some(op), &b.right),
                None => err(e.span(), "an expression statement must be an assignment or control flow"),
            },
            syn::Expr::ForLoop(f) => {
                // `'par:` and `'sum:` mark loops a GPU target may spread over a block's
                // threads (see `ds4_ir::kir::LoopMode`); CPU code runs them as written.
                let mode = match f.label.as_ref().map(|l| l.name.ident.to_string()) {
                    None => LoopKind::Serial,
                    Some(l) if l == "par" => LoopKind::Par,
                    Some(l) if l == "sum" => LoopKind::Sum,
                    Some(_) => return err(f.span(), "the only loop labels are `'par` (independent iterations) and `'sum` (a sum reduction)"),
                };
                let syn::Pat::Ident(pi) = &*f.pat else {
                    return err(f.pat.span(), "the loop variable is a plain name");
                };
                if pi.by_ref.is_some() || pi.mutability.is_some() || pi.subpat.is_some() {
                    return err(f.pat.span(), "the loop variable is a plain name");
                }
                let syn::Expr::Range(r) = &*f.expr else { return err(f.expr.span(), "loops run over a range `a..b`") };
                let (Some(start), Some(end), syn::RangeLimits::HalfOpen(_)) = (&r.start, &r.end, &r.limits) else {
                    return err(r.span(), "loops run over a half-open range `a..b`");
                };
                let mut start = self.expr(start)?;
                coerce(&mut start, T::Usize)?;
                let mut end_t = self.expr(end)?;
                coerce(&mut end_t, T::Usize)?;
                let var = pi.ident.to_string();
                // The loop variable opens the body's scope (C++ forbids redeclaring it there),
                // so it may shadow a local of the enclosing block.
                self.check_not_param(&var, pi.ident.span())?;
                let first_assignment = self.assigned.len();
                let body_scope = self.scopes.len();
                let body = self.block_with(&f.body, vec![Local { name: var.clone(), ty: T::Usize, mutable: false }])?;
                let mode = self.loop_mode(mode, &self.assigned[first_assignment..], body_scope, f.span())?;
                // Rust evaluates `end` once; C and WGSL `for` re-test it every iteration. Both
                // agree as long as the body assigns nothing `end` reads.
                let mut reads = Vec::new();
                vars_of(&end_t, &mut reads);
                if let Some(v) = self.assigned[first_assignment..].iter().map(|a| &a.name).find(|v| reads.contains(v)) {
                    return err(
                        end.span(),
                        format!("the loop bound reads `{v}`, which the loop body assigns; copy it to a local first"),
                    );
                }
                let (start, end) = (emit(&start)?, emit(&end_t)?);
                Ok(quote!(#k::Stmt::For { var: #var.to_string(), start: #start, end: #end, body: #body, mode: #mode }))
            }
            syn::Expr::While(w) => {
                if w.label.is_some() {
                    return err(w.span(), "loop labels are not supported");
                }
                let mut cond = self.expr(&w.cond)?;
                coerce(&mut cond, T::Bool)?;
                let cond = emit(&cond)?;
                let body = self.block(&w.body)?;
                Ok(quote!(#k::Stmt::While { cond: #cond, body: #body }))
            }
            syn::Expr::If(i) => self.if_stmt(i),
            _ => err(e.span(), "an expression statement must be an assignment or control flow"),
        }
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> Result<TokenStream> {
        let k = super::kir();
        let mut cond = self.expr(&i.cond)?;
        coerce(&mut cond, T::Bool)?;
        let cond = emit(&cond)?;
        let then = self.block(&i.then_branch)?;
        let otherwise = match &i.else_branch {
            None => quote!(vec![]),
            Some((_, e)) => match &**e {
                syn::Expr::Block(b) if b.label.is_none() => self.block(&b.block)?,
                syn::Expr::If(elif) => {
                    let s = self.if_stmt(elif)?;
                    quote!(vec![#s])
                }
                other => return err(other.span(), "unsupported `else` branch"),
            },
        };
        Ok(quote!(#k::Stmt::If { cond: #cond, then: #then, otherwise: #otherwise }))
    }

    /// `x = v`, `x op= v`, `out[i] = v`, `out[i] op= v`.
    fn assign(&mut self, left: &syn::Expr, op: Option<&'static str>, right: &syn::Expr) -> Result<TokenStream> {
        let k = super::kir();
        let mut value = self.expr(right)?;
        match left {
            syn::Expr::Index(ix) => {
                let (buf, elem, mutable) = self.buffer(&ix.expr)?;
                if !mutable {
                    return err(ix.expr.span(), format!("`{buf}` is an input; only the output slice is written"));
                }
                let mut index = self.expr(&ix.index)?;
                coerce(&mut index, T::Usize)?;
                coerce(&mut value, elem)?;
                check_op(op, elem, right.span())?;
                let (index, value) = (emit(&index)?, emit(&value)?);
                let op = match op {
                    Some(op) => {
                        let op = syn::Ident::new(op, Span::call_site());
                        quote!(Some(#k::BinOp::#op))
                    }
                    None => quote!(None),
                };
                Ok(quote!(#k::Stmt::Store { buf: #buf.to_string(), index: #index, op: #op, value: #value }))
            }
            syn::Expr::Path(p) => {
                let Some(id) = p.path.get_ident() else { return err(p.span(), "expected a local") };
                let name = id.to_string();
                let Some(local) = self.scopes.iter().rev().flatten().find(|l| l.name == name) else {
                    return err(id.span(), format!("`{name}` is not a local of this body (params are read-only)"));
                };
                if !local.mutable {
                    return err(id.span(), format!("`{name}` is not `mut`"));
                }
                let ty = local.ty;
                let scope = self.scopes.iter().rposition(|s| s.iter().any(|l| l.name == name)).expect("found above");
                coerce(&mut value, ty).map_err(|e| {
                    let hint = format!("(`{name}` is {}; annotate the `let` if Rust infers another type)", ty.name());
                    let mut e = e;
                    e.combine(syn::Error::new(id.span(), hint));
                    e
                })?;
                check_op(op, ty, right.span())?;
                self.assigned.push(Assigned { name: name.clone(), scope, op, ty });
                let value = emit(&value)?;
                Ok(match op {
                    Some(op) => {
                        let op = syn::Ident::new(op, Span::call_site());
                        quote!(#k::Stmt::CompoundAssign { name: #name.to_string(), op: #k::BinOp::#op, value: #value })
                    }
                    None => quote!(#k::Stmt::Assign { name: #name.to_string(), value: #value }),
                })
            }
            other => err(other.span(), "only locals and `out[..]` can be assigned"),
        }
    }

    /// A buffer param named by `e`: (name, element type, mutable).
    fn buffer(&self, e: &syn::Expr) -> Result<(String, T, bool)> {
        if let syn::Expr::Path(p) = e {
            if let Some(id) = p.path.get_ident() {
                let name = id.to_string();
                let shadowed = self.scopes.iter().flatten().any(|l| l.name == name);
                if let Some(ParamInfo { kind: PKind::Buffer { elem, mutable }, .. }) =
                    self.params.iter().find(|p| p.name == name).filter(|_| !shadowed)
                {
                    return Ok((name, *elem, *mutable));
                }
            }
        }
        err(e.span(), "only slice params can be indexed")
    }

    // ---- expressions ----

    fn expr(&mut self, e: &syn::Expr) -> Result<Typed> {
        let span = e.span();
        let typed = |e: E, ty: T| Ok(Typed { e, ty, span });
        match e {
            syn::Expr::Paren(p) => self.expr(&p.expr),
            syn::Expr::Group(g) => self.expr(&g.expr),
            syn::Expr::Lit(l) => match &l.lit {
                syn::Lit::Int(i) => {
                    let v: i128 = i.base10_parse()?;
                    match i.suffix() {
                        "" => typed(E::Int(v), T::Int),
                        "usize" => typed(E::Int(v), T::Usize),
                        "i32" => typed(E::Int(v), T::I32),
                        s => err(span, format!("integer literals are usize or i32, not {s}")),
                    }
                }
                syn::Lit::Bool(b) => typed(E::Bool(b.value), T::Bool),
                syn::Lit::Float(_) => err(span, "float constants are written `F::from_f64(..)`"),
                _ => err(span, "unsupported literal"),
            },
            syn::Expr::Path(p) => self.path(p),
            syn::Expr::Index(ix) => {
                let (buf, elem, _) = self.buffer(&ix.expr)?;
                let mut index = self.expr(&ix.index)?;
                coerce(&mut index, T::Usize)?;
                typed(E::Index(buf, Box::new(index)), elem)
            }
            syn::Expr::Binary(b) => {
                let Some((op, class)) = bin_op(&b.op) else {
                    return err(b.op.span(), "unsupported operator in kernel bodies");
                };
                let mut l = self.expr(&b.left)?;
                let mut r = self.expr(&b.right)?;
                let ty = match class {
                    OpClass::Logic => {
                        coerce(&mut l, T::Bool)?;
                        coerce(&mut r, T::Bool)?;
                        T::Bool
                    }
                    OpClass::Arith => {
                        let t = unify(&mut l, &mut r, span)?;
                        if t == T::Bool || (op == "Rem" && t == T::F) {
                            return err(b.op.span(), format!("this operator is not defined on {}", t.name()));
                        }
                        t
                    }
                    OpClass::Compare => {
                        let mut t = unify(&mut l, &mut r, span)?;
                        if t == T::Int {
                            coerce(&mut l, T::Usize)?;
                            coerce(&mut r, T::Usize)?;
                            t = T::Usize;
                        }
                        if t == T::Bool && !matches!(op, "Eq" | "Ne") {
                            return err(b.op.span(), "booleans are only compared with == and !=");
                        }
                        T::Bool
                    }
                };
                typed(E::Bin(op, Box::new(l), Box::new(r)), ty)
            }
            syn::Expr::Unary(u) => {
                let arg = self.expr(&u.expr)?;
                let ty = arg.ty;
                match u.op {
                    syn::UnOp::Neg(_) => match (ty, &arg.e) {
                        // Fold `-1` into one literal, as Rust does.
                        (T::Int | T::I32, E::Int(v)) => typed(E::Int(-v), ty),
                        (T::F | T::I32, _) => typed(E::Neg(Box::new(arg)), ty),
                        (t, _) => err(span, format!("cannot negate {}", t.name())),
                    },
                    syn::UnOp::Not(_) => {
                        let mut arg = arg;
                        coerce(&mut arg, T::Bool)?;
                        typed(E::Not(Box::new(arg)), T::Bool)
                    }
                    _ => err(span, "unsupported unary operator"),
                }
            }
            syn::Expr::Cast(c) => {
                let to = match super::scalar_type(&c.ty, None) {
                    Some(t @ (T::Usize | T::I32)) => t,
                    _ => return err(c.ty.span(), "casts are `as usize` or `as i32` (use F::from_usize for floats)"),
                };
                let mut arg = self.expr(&c.expr)?;
                match arg.ty {
                    T::Int => {
                        coerce(&mut arg, to)?;
                        Ok(arg)
                    }
                    T::Usize | T::I32 => typed(E::Cast(to, Box::new(arg)), to),
                    t => err(span, format!("cannot cast {} with `as`", t.name())),
                }
            }
            syn::Expr::MethodCall(m) => self.method(m),
            syn::Expr::Call(c) => self.call(c),
            _ => err(span, "unsupported expression in kernel bodies"),
        }
    }

    /// A variable, a scalar param, `item`, or an upper-case module constant.
    fn path(&self, p: &syn::ExprPath) -> Result<Typed> {
        let span = p.span();
        let Some(id) = p.path.get_ident().filter(|_| p.qself.is_none()) else {
            return err(span, "unsupported path (locals, params and `F::..` constructors only)");
        };
        let name = id.to_string();
        if let Some(l) = self.scopes.iter().rev().flatten().find(|l| l.name == name) {
            return Ok(Typed { e: E::Var(name), ty: l.ty, span });
        }
        if let Some(p) = self.params.iter().find(|p| p.name == name) {
            return match p.kind {
                PKind::Scalar(t) => Ok(Typed { e: E::Var(name), ty: t, span }),
                PKind::Buffer { .. } => err(span, format!("`{name}` is a slice; index it")),
            };
        }
        if name == "item" && self.allow_item {
            return Ok(Typed { e: E::Var(name), ty: T::Usize, span });
        }
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
            return Ok(Typed { e: E::Const(p.path.clone()), ty: T::Usize, span });
        }
        err(span, format!("unknown name `{name}`"))
    }

    /// `x.exp()`, `a.max(b)`, ... on F; `a.min(b)`, `a.max(b)` on usize.
    fn method(&mut self, m: &syn::ExprMethodCall) -> Result<Typed> {
        let span = m.span();
        if m.turbofish.is_some() {
            return err(span, "no turbofish in kernel bodies");
        }
        let mut recv = self.expr(&m.receiver)?;
        let name = m.method.to_string();
        let mut args = m.args.iter().map(|a| self.expr(a)).collect::<Result<Vec<_>>>()?;
        if recv.ty == T::Int {
            coerce(&mut recv, T::Usize)?;
        }
        let (builtin, ty) = match (recv.ty, name.as_str()) {
            (T::F, "max") => ("Max", T::F),
            (T::F, "min") => ("Min", T::F),
            (T::Usize, "max") => ("MaxUsize", T::Usize),
            (T::Usize, "min") => ("MinUsize", T::Usize),
            (T::F, unary) => match unary_builtin(unary) {
                Some(b) => (b, T::F),
                None => return err(m.method.span(), format!("`{unary}` is not a Real method the kernel IR knows")),
            },
            (t, _) => return err(m.method.span(), format!("`.{name}()` is not supported on {}", t.name())),
        };
        let want_args = if matches!(name.as_str(), "max" | "min") { 1 } else { 0 };
        if args.len() != want_args {
            return err(span, format!("`.{name}()` takes {want_args} argument(s)"));
        }
        for a in &mut args {
            coerce(a, ty)?;
        }
        args.insert(0, recv);
        Ok(Typed { e: E::Builtin(builtin, args), ty, span })
    }

    /// `F::from_f64(lit)`, `F::from_usize(e)`, `F::zero()`, `F::one()`,
    /// `F::neg_infinity()`, or a helper `name(args)`.
    fn call(&mut self, c: &syn::ExprCall) -> Result<Typed> {
        let span = c.span();
        let syn::Expr::Path(fp) = &*c.func else { return err(c.func.span(), "unsupported call") };
        let segs: Vec<String> = fp.path.segments.iter().map(|s| s.ident.to_string()).collect();
        let args = &c.args;
        let is_float = self.float.as_ref().is_some_and(|f| segs.len() == 2 && fp.path.segments[0].ident == *f);
        if is_float {
            let nargs = if matches!(segs[1].as_str(), "from_f64" | "from_usize") { 1 } else { 0 };
            if args.len() != nargs {
                return err(span, format!("`F::{}` takes {nargs} argument(s)", segs[1]));
            }
            let lit = |v: f64| Ok(Typed { e: E::Float(v), ty: T::F, span });
            return match segs[1].as_str() {
                "zero" => lit(0.0),
                "one" => lit(1.0),
                "neg_infinity" => lit(f64::NEG_INFINITY),
                "from_f64" => lit(float_literal(&args[0])?),
                "from_usize" => {
                    let mut a = self.expr(&args[0])?;
                    coerce(&mut a, T::Usize)?;
                    Ok(Typed { e: E::Cast(T::F, Box::new(a)), ty: T::F, span })
                }
                other => err(span, format!("`F::{other}` is not supported in kernel bodies")),
            };
        }
        if segs.len() == 1 && fp.qself.is_none() {
            if !self.allow_helpers {
                return err(span, "helpers cannot call other functions");
            }
            let name = segs[0].clone();
            let mut targs = args.iter().map(|a| self.expr(a)).collect::<Result<Vec<_>>>()?;
            for a in &mut targs {
                if a.ty == T::Int {
                    coerce(a, T::Usize)?;
                }
            }
            if !self.helpers.iter().any(|(h, _)| *h == name) {
                self.helpers.push((name.clone(), fp.path.segments[0].ident.span()));
            }
            // Helpers return F (`#[kernel_helper]` enforces it).
            return Ok(Typed { e: E::Helper(name, targs), ty: T::F, span });
        }
        err(span, "unsupported call (Real constructors and #[kernel_helper] functions only)")
    }
}

#[derive(Clone, Copy)]
enum OpClass {
    Arith,
    Compare,
    Logic,
}

fn bin_op(op: &syn::BinOp) -> Option<(&'static str, OpClass)> {
    use syn::BinOp as B;
    Some(match op {
        B::Add(_) => ("Add", OpClass::Arith),
        B::Sub(_) => ("Sub", OpClass::Arith),
        B::Mul(_) => ("Mul", OpClass::Arith),
        B::Div(_) => ("Div", OpClass::Arith),
        B::Rem(_) => ("Rem", OpClass::Arith),
        B::Lt(_) => ("Lt", OpClass::Compare),
        B::Le(_) => ("Le", OpClass::Compare),
        B::Gt(_) => ("Gt", OpClass::Compare),
        B::Ge(_) => ("Ge", OpClass::Compare),
        B::Eq(_) => ("Eq", OpClass::Compare),
        B::Ne(_) => ("Ne", OpClass::Compare),
        B::And(_) => ("And", OpClass::Logic),
        B::Or(_) => ("Or", OpClass::Logic),
        _ => return None,
    })
}

fn compound_op(op: &syn::BinOp) -> Option<&'static str> {
    use syn::BinOp as B;
    Some(match op {
        B::AddAssign(_) => "Add",
        B::SubAssign(_) => "Sub",
        B::MulAssign(_) => "Mul",
        B::DivAssign(_) => "Div",
        B::RemAssign(_) => "Rem",
        _ => return None,
    })
}

/// `x op= v` is only arithmetic, and `%=` only on integers.
fn check_op(op: Option<&str>, ty: T, span: Span) -> Result<()> {
    match (op, ty) {
        (Some(_), T::Bool) | (Some("Rem"), T::F) => {
            err(span, format!("compound assignment not defined on {}", ty.name()))
        }
        _ => Ok(()),
    }
}

fn unary_builtin(name: &str) -> Option<&'static str> {
    Some(match name {
        "exp" => "Exp",
        "ln" => "Ln",
        "sqrt" => "Sqrt",
        "abs" => "Abs",
        "sin" => "Sin",
        "cos" => "Cos",
        "floor" => "Floor",
        "ceil" => "Ceil",
        "log2" => "Log2",
        "exp2" => "Exp2",
        "ln_1p" => "Ln1p",
        "round_even" => "RoundEven",
        "ilogb" => "Ilogb",
        _ => return None,
    })
}

/// The argument of `F::from_f64`: a float literal, possibly negated.
fn float_literal(e: &syn::Expr) -> Result<f64> {
    match e {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Float(f), .. }) if matches!(f.suffix(), "" | "f64") => {
            f.base10_parse()
        }
        syn::Expr::Unary(syn::ExprUnary { op: syn::UnOp::Neg(_), expr, .. }) => Ok(-float_literal(expr)?),
        syn::Expr::Paren(p) => float_literal(&p.expr),
        _ => err(e.span(), "`F::from_f64` takes a float literal such as `2.0` or `1e-4`"),
    }
}

/// Gives an integer literal (or literal-only arithmetic) the type `want`, or checks that
/// an already typed expression has it.
fn coerce(t: &mut Typed, want: T) -> Result<()> {
    if t.ty == want {
        return Ok(());
    }
    if t.ty == T::Int && matches!(want, T::Usize | T::I32) {
        set_int_type(t, want);
        return Ok(());
    }
    let hint = if t.ty == T::Int && want == T::F { " (write float constants as `F::from_f64(..)`)" } else { "" };
    err(t.span, format!("expected {}, found {}{hint}", want.name(), t.ty.name()))
}

fn set_int_type(t: &mut Typed, want: T) {
    t.ty = want;
    match &mut t.e {
        E::Bin(_, a, b) => {
            set_int_type(a, want);
            set_int_type(b, want);
        }
        E::Neg(a) => set_int_type(a, want),
        _ => {}
    }
}

/// Both operands of a binary operator get one type; an untyped literal takes the other's.
fn unify(l: &mut Typed, r: &mut Typed, span: Span) -> Result<T> {
    if l.ty == T::Int {
        coerce(l, r.ty).or_else(|_| err(span, format!("mismatched operands: {} and {}", l.ty.name(), r.ty.name())))?;
    } else if r.ty == T::Int {
        coerce(r, l.ty).or_else(|_| err(span, format!("mismatched operands: {} and {}", l.ty.name(), r.ty.name())))?;
    }
    if l.ty != r.ty {
        return err(span, format!("mismatched operands: {} and {}", l.ty.name(), r.ty.name()));
    }
    Ok(l.ty)
}

/// Names of the variables an expression reads.
fn vars_of(t: &Typed, out: &mut Vec<String>) {
    match &t.e {
        E::Var(v) => out.push(v.clone()),
        E::Index(_, i) => vars_of(i, out),
        E::Bin(_, a, b) => {
            vars_of(a, out);
            vars_of(b, out);
        }
        E::Neg(a) | E::Not(a) | E::Cast(_, a) => vars_of(a, out),
        E::Builtin(_, args) | E::Helper(_, args) => args.iter().for_each(|a| vars_of(a, out)),
        E::Int(_) | E::Float(_) | E::Bool(_) | E::Const(_) => {}
    }
}

/// Tokens that build the `kir::Expr` for `t`.
fn emit(t: &Typed) -> Result<TokenStream> {
    let k = super::kir();
    Ok(match &t.e {
        E::Int(v) => {
            let ty = if t.ty == T::Int { T::Usize } else { t.ty };
            match ty {
                T::Usize => {
                    let v = u64::try_from(*v).or_else(|_| err(t.span, "usize literal out of range"))?;
                    quote!(#k::Expr::Lit(#k::Lit::Usize(#v)))
                }
                T::I32 => {
                    let v = i32::try_from(*v).or_else(|_| err(t.span, "i32 literal out of range"))?;
                    quote!(#k::Expr::Lit(#k::Lit::I32(#v)))
                }
                _ => unreachable!("integer literal typed {ty:?}"),
            }
        }
        // Bits, so that the value is exactly the one Rust parsed (and -inf survives).
        E::Float(v) => {
            let bits = v.to_bits();
            quote!(#k::Expr::Lit(#k::Lit::F(f64::from_bits(#bits))))
        }
        E::Bool(b) => quote!(#k::Expr::Lit(#k::Lit::Bool(#b))),
        E::Const(p) => quote!(#k::Expr::Lit(#k::Lit::Usize({
            let v: usize = #p;
            v as u64
        }))),
        E::Var(v) => quote!(#k::Expr::Var(#v.to_string())),
        E::Index(buf, i) => {
            let i = emit(i)?;
            quote!(#k::Expr::index(#buf, #i))
        }
        E::Bin(op, a, b) => {
            let op = syn::Ident::new(op, Span::call_site());
            let (a, b) = (emit(a)?, emit(b)?);
            quote!(#k::Expr::binary(#k::BinOp::#op, #a, #b))
        }
        E::Neg(a) => {
            let a = emit(a)?;
            quote!(#k::Expr::unary(#k::UnOp::Neg, #a))
        }
        E::Not(a) => {
            let a = emit(a)?;
            quote!(#k::Expr::unary(#k::UnOp::Not, #a))
        }
        E::Cast(to, a) => {
            let (to, a) = (to.kir(), emit(a)?);
            quote!(#k::Expr::cast(#to, #a))
        }
        E::Builtin(b, args) => {
            let b = syn::Ident::new(b, Span::call_site());
            let args = args.iter().map(emit).collect::<Result<Vec<_>>>()?;
            quote!(#k::Expr::builtin(#k::Builtin::#b, vec![#(#args),*]))
        }
        E::Helper(name, args) => {
            let args = args.iter().map(emit).collect::<Result<Vec<_>>>()?;
            quote!(#k::Expr::helper(#name, vec![#(#args),*]))
        }
    })
}
