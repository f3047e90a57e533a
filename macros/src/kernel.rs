//! `#[kernel]` and `#[kernel_helper]`: a kernel body, written once in Rust, also becomes
//! kernel IR (`ds4_ir::kir`).
//!
//! The function is re-emitted untouched (it *is* the CPU kernel and the float64
//! reference); next to it comes `<name>_kir()`, which builds the same computation as a
//! `ds4_ir::kir::Kernel` for the GPU renderers. The IR is read straight off the syn tree,
//! so anything outside the supported subset is a compile error at its span rather than a
//! silently different kernel. `body.rs` does the statement/expression lowering; this file
//! reads the attribute and the signature and assembles the output.

mod body;

use body::{Lowerer, PKind, ParamInfo, T};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{FnArg, GenericParam, ItemFn, LitStr, Pat, ReturnType, Type};

/// Path of the IR module in generated code (inside ds4-ir it resolves through
/// `extern crate self as ds4_ir`).
fn kir() -> TokenStream {
    quote!(ds4_ir::kir)
}

/// `#[kernel(out = "<expr of scalar params>")]` on `fn name<F: Real>(item: usize, out: &mut [..], ..)`.
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let generated = syn::parse2::<ItemFn>(item.clone()).and_then(|f| kernel_ir(attr, &f));
    with_original(item, generated)
}

/// `#[kernel_helper]` on `fn name<F: Real>(scalars..) -> F`: adds `<name>_kir_fn()`.
pub fn kernel_helper(attr: TokenStream, item: TokenStream) -> TokenStream {
    let generated = if attr.is_empty() {
        syn::parse2::<ItemFn>(item.clone()).and_then(|f| helper_ir(&f))
    } else {
        Err(syn::Error::new(attr.span(), "#[kernel_helper] takes no arguments"))
    };
    with_original(item, generated)
}

/// The original function always comes back, so that one unsupported line gives one
/// error, not a cascade of "function not found".
fn with_original(item: TokenStream, generated: syn::Result<TokenStream>) -> TokenStream {
    match generated {
        // `'par:`/`'sum:` labels are read by the macro; rustc sees them unused.
        Ok(extra) => quote!(#[allow(unused_labels)] #item #extra),
        Err(e) => {
            let e = e.to_compile_error();
            quote!(#[allow(unused_labels)] #item #e)
        }
    }
}

fn kernel_ir(attr: TokenStream, f: &ItemFn) -> syn::Result<TokenStream> {
    let out_len = parse_attr(attr)?;
    let float = float_param(f)?;
    let params = kernel_params(f, float.as_ref())?;

    // The output length may only read the scalar params.
    let scalars: Vec<ParamInfo> = params.iter().filter(|p| matches!(p.kind, PKind::Scalar(_))).cloned().collect();
    let mut lw = Lowerer::new(float.clone(), scalars, false, false);
    let out_len = lw.usize_expr(&out_len)?;

    let mut lw = Lowerer::new(float, params.clone(), true, true);
    let body = lw.block(&f.block)?;

    let k = kir();
    let name = f.sig.ident.to_string();
    let kir_fn = format_ident!("{}_kir", f.sig.ident);
    let vis = &f.vis;
    let doc = format!("Kernel IR of [`{name}`], read from its body by `#[kernel]`.");
    let param_tokens = params.iter().map(|p| {
        let pname = &p.name;
        let kind = match p.kind {
            PKind::Buffer { elem, mutable } => {
                let elem = if elem == T::F { quote!(#k::Elem::F) } else { quote!(#k::Elem::I32) };
                quote!(#k::ParamKind::Buffer { elem: #elem, mutable: #mutable })
            }
            PKind::Scalar(t) => {
                let t = t.kir();
                quote!(#k::ParamKind::Scalar { ty: #t })
            }
        };
        quote!(#k::Param { name: #pname.to_string(), kind: #kind })
    });
    // Helpers are found by name in the same module: `#[kernel_helper]` put a
    // `<helper>_kir_fn` next to each; the span points at the first call.
    let helper_calls = lw.helpers.iter().map(|(h, span)| {
        let f = format_ident!("{}_kir_fn", h, span = *span);
        quote!(#f())
    });
    Ok(quote! {
        #[doc = #doc]
        #vis fn #kir_fn() -> #k::Kernel {
            #k::Kernel {
                name: #name.to_string(),
                params: vec![#(#param_tokens),*],
                out_len: #out_len,
                helpers: vec![#(#helper_calls),*],
                body: #body,
            }
        }
    })
}

fn helper_ir(f: &ItemFn) -> syn::Result<TokenStream> {
    let float = float_param(f)?;
    let mut params = Vec::new();
    for arg in &f.sig.inputs {
        let (name, ty) = typed_arg(arg)?;
        match scalar_type(ty, float.as_ref()) {
            Some(t) => params.push(ParamInfo { name, kind: PKind::Scalar(t) }),
            None => return Err(syn::Error::new(ty.span(), "helper params are scalars: usize, i32, bool or F")),
        }
    }
    // Kernels type a helper call as F without seeing the helper, so helpers return F.
    let ret_ok = match &f.sig.output {
        ReturnType::Type(_, ty) => float.is_some() && scalar_type(ty, float.as_ref()) == Some(T::F),
        ReturnType::Default => false,
    };
    if !ret_ok {
        return Err(syn::Error::new(f.sig.output.span(), "a kernel helper returns the float type F"));
    }

    let mut lw = Lowerer::new(float, params.clone(), false, false);
    let (body, result) = lw.helper_body(&f.block)?;

    let k = kir();
    let name = f.sig.ident.to_string();
    let kir_fn = format_ident!("{}_kir_fn", f.sig.ident);
    let vis = &f.vis;
    let param_tokens = params.iter().map(|p| {
        let pname = &p.name;
        let t = match p.kind {
            PKind::Scalar(t) => t.kir(),
            PKind::Buffer { .. } => unreachable!(),
        };
        quote!((#pname.to_string(), #t))
    });
    Ok(quote! {
        #[doc(hidden)]
        #[allow(dead_code)]
        #vis fn #kir_fn() -> #k::Function {
            #k::Function {
                name: #name.to_string(),
                params: vec![#(#param_tokens),*],
                ret: #k::Ty::F,
                body: #body,
                result: #result,
            }
        }
    })
}

/// The attribute's one argument: `out = "<expr>"`.
fn parse_attr(attr: TokenStream) -> syn::Result<syn::Expr> {
    let mut out = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("out") {
            let s: LitStr = meta.value()?.parse()?;
            out = Some(s.parse::<syn::Expr>()?);
            Ok(())
        } else {
            Err(meta.error("expected `out = \"<per-item output length>\"`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr.clone())?;
    out.ok_or_else(|| syn::Error::new(attr.span(), "missing `out = \"<per-item output length>\"`"))
}

/// The float type parameter (`F` in `fn k<F: Real>`), if the function is generic.
fn float_param(f: &ItemFn) -> syn::Result<Option<syn::Ident>> {
    let g = &f.sig.generics;
    if let Some(w) = &g.where_clause {
        return Err(syn::Error::new(w.span(), "kernel functions take no where clause"));
    }
    match g.params.len() {
        0 => Ok(None),
        1 => match &g.params[0] {
            GenericParam::Type(t) => Ok(Some(t.ident.clone())),
            other => Err(syn::Error::new(other.span(), "the one generic parameter is the float type")),
        },
        _ => Err(syn::Error::new(g.span(), "kernel functions have at most one generic parameter (the float type)")),
    }
}

/// `item: usize`, then the output slice, then inputs.
fn kernel_params(f: &ItemFn, float: Option<&syn::Ident>) -> syn::Result<Vec<ParamInfo>> {
    if !matches!(f.sig.output, ReturnType::Default) {
        return Err(syn::Error::new(f.sig.output.span(), "a kernel writes `out` and returns nothing"));
    }
    let mut args = f.sig.inputs.iter();
    let first = args.next().ok_or_else(|| syn::Error::new(f.sig.span(), "a kernel starts with `item: usize`"))?;
    let (name, ty) = typed_arg(first)?;
    if name != "item" || scalar_type(ty, float) != Some(T::Usize) {
        return Err(syn::Error::new(first.span(), "a kernel starts with `item: usize`"));
    }
    let mut params = Vec::new();
    for (i, arg) in args.enumerate() {
        let (name, ty) = typed_arg(arg)?;
        if name.starts_with("ds4_") {
            return Err(syn::Error::new(arg.span(), "names starting with `ds4_` are reserved for generated code"));
        }
        let kind = if let Some(t) = scalar_type(ty, float) {
            PKind::Scalar(t)
        } else if let Some((elem, mutable)) = slice_type(ty, float) {
            PKind::Buffer { elem, mutable }
        } else {
            return Err(syn::Error::new(
                ty.span(),
                "expected usize, i32, bool, F, &[F], &[i32] or (for `out`) &mut [F] / &mut [i32]",
            ));
        };
        let is_out = matches!(kind, PKind::Buffer { mutable: true, .. });
        if (i == 0) != is_out {
            let msg = if i == 0 {
                "the second param is the output: `out: &mut [F]` or `&mut [i32]`"
            } else {
                "only the output slice is mutable"
            };
            return Err(syn::Error::new(arg.span(), msg));
        }
        params.push(ParamInfo { name, kind });
    }
    if params.is_empty() {
        return Err(syn::Error::new(f.sig.span(), "a kernel has an output slice after `item`"));
    }
    Ok(params)
}

fn typed_arg(arg: &FnArg) -> syn::Result<(String, &Type)> {
    if let FnArg::Typed(pt) = arg {
        if let Pat::Ident(pi) = &*pt.pat {
            if pi.by_ref.is_none() && pi.mutability.is_none() && pi.subpat.is_none() {
                return Ok((pi.ident.to_string(), &pt.ty));
            }
        }
    }
    Err(syn::Error::new(arg.span(), "params are plain `name: type` (not `mut`, no patterns)"))
}

/// usize, i32, bool or the float type.
pub(crate) fn scalar_type(ty: &Type, float: Option<&syn::Ident>) -> Option<T> {
    let Type::Path(p) = ty else { return None };
    let id = p.path.get_ident()?;
    if p.qself.is_some() {
        return None;
    }
    match id.to_string().as_str() {
        "usize" => Some(T::Usize),
        "i32" => Some(T::I32),
        "bool" => Some(T::Bool),
        _ if float == Some(id) => Some(T::F),
        _ => None,
    }
}

/// `&[F]`, `&[i32]`, `&mut [F]`, `&mut [i32]` → (element type, mutable).
fn slice_type(ty: &Type, float: Option<&syn::Ident>) -> Option<(T, bool)> {
    let Type::Reference(r) = ty else { return None };
    let Type::Slice(s) = &*r.elem else { return None };
    match scalar_type(&s.elem, float)? {
        t @ (T::F | T::I32) => Some((t, r.mutability.is_some())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error text `#[kernel(out = "n")]` gives for `body`, or None if it lowers.
    fn lower(body: TokenStream) -> Option<String> {
        let f: ItemFn = syn::parse2(quote! {
            pub fn k<F: Real>(item: usize, out: &mut [F], x: &[F], n: usize) { #body }
        })
        .unwrap();
        kernel_ir(quote!(out = "n"), &f).err().map(|e| e.to_string())
    }

    #[test]
    fn parallel_loops_follow_their_rules() {
        // Accepted: independent iterations; a sum into one outer float.
        assert_eq!(lower(quote! { 'par: for i in 0..n { let v = x[i]; out[i] = v; } }), None);
        assert_eq!(lower(quote! { let mut s = F::zero(); 'sum: for i in 0..n { s += x[i]; } out[0] = s; }), None);
        // Refused: a 'par loop assigning an outer local.
        let e = lower(quote! { let mut s = F::zero(); 'par: for i in 0..n { s = x[i]; } out[0] = s; }).unwrap();
        assert!(e.contains("may not assign `s`"), "{e}");
        // Refused: a 'sum loop with no accumulator, with two, or with something but `+=`.
        let e = lower(quote! { 'sum: for i in 0..n { out[i] = x[i]; } }).unwrap();
        assert!(e.contains("assigns none"), "{e}");
        let e = lower(quote! { let mut a = F::zero(); let mut b = F::zero(); 'sum: for i in 0..n { a += x[i]; b += x[i]; } out[0] = a + b; }).unwrap();
        assert!(e.contains("also assigns `b`"), "{e}");
        let e = lower(quote! { let mut a = F::zero(); 'sum: for i in 0..n { a *= x[i]; } out[0] = a; }).unwrap();
        assert!(e.contains("only `+=`"), "{e}");
        let e = lower(quote! { let mut c = 0; 'sum: for i in 0..n { c += i; } out[0] = x[c]; }).unwrap();
        assert!(e.contains("one float local"), "{e}");
        // Any other label.
        let e = lower(quote! { 'outer: for i in 0..n { out[i] = x[i]; } }).unwrap();
        assert!(e.contains("the only loop labels"), "{e}");
    }
}
