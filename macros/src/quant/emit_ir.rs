//! Emit the `ds4_ir::quant::QuantSpec` static: the layout, the tables and the typed
//! expression tree as constant data. This is what GPU code generators read.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use super::check::{BinOp, Kind, Level, TExpr, UnOp};
use super::ty::Ty;
use super::Decl;

fn level(l: Level) -> TokenStream {
    match l {
        Level::Block => quote!(ds4_ir::quant::Level::Block),
        Level::Sub => quote!(ds4_ir::quant::Level::Sub),
        Level::Elem => quote!(ds4_ir::quant::Level::Elem),
    }
}

fn binop(op: BinOp) -> TokenStream {
    let v = format_ident!("{}", format!("{op:?}"));
    quote!(ds4_ir::quant::BinOp::#v)
}

fn unop(op: UnOp) -> TokenStream {
    let v = format_ident!("{}", format!("{op:?}"));
    quote!(ds4_ir::quant::UnOp::#v)
}

/// Two's-complement bits of `v`, truncated to the width of `t`.
fn int_bits(t: Ty, v: i128) -> u64 {
    let bits = v as u64;
    if t.bits() == 64 {
        bits
    } else {
        bits & ((1u64 << t.bits()) - 1)
    }
}

/// `ds4_ir::quant::Expr` constant for a checked expression.
pub fn expr(e: &TExpr) -> TokenStream {
    let ty = e.ty.ir();
    let x = quote!(ds4_ir::quant::Expr);
    match &e.kind {
        Kind::Int(v) => {
            let b = int_bits(e.ty, *v);
            quote!(#x::Int(#ty, #b))
        }
        Kind::Float(v) => {
            let b = v.to_bits();
            quote!(#x::F32(f32::from_bits(#b)))
        }
        Kind::Sub => quote!(#x::Sub),
        Kind::Lane => quote!(#x::Lane),
        Kind::Var(n) => quote!(#x::Var(#n, #ty)),
        Kind::Field(n) => quote!(#x::Field(#n, #ty)),
        Kind::Load(n, i) => {
            let i = expr(i);
            quote!(#x::Load(#n, #ty, &#i))
        }
        Kind::Table(n, i) => {
            let i = expr(i);
            quote!(#x::Table(#n, #ty, &#i))
        }
        Kind::Unary(op, a) => {
            let (op, a) = (unop(*op), expr(a));
            quote!(#x::Unary(#op, #ty, &#a))
        }
        Kind::Binary(op, a, b) => {
            let (op, a, b) = (binop(*op), expr(a), expr(b));
            quote!(#x::Binary(#op, #ty, &#a, &#b))
        }
        Kind::Cast(a) => {
            let a = expr(a);
            quote!(#x::Cast(#ty, &#a))
        }
        Kind::Bitcast(a) => {
            let a = expr(a);
            quote!(#x::Bitcast(#ty, &#a))
        }
        Kind::Select(c, a, b) => {
            let (c, a, b) = (expr(c), expr(a), expr(b));
            quote!(#x::Select(#ty, &#c, &#a, &#b))
        }
    }
}

/// `pub static SPEC: QuantSpec = …;`
pub fn spec(d: &Decl, value: &TExpr) -> TokenStream {
    let q = quote!(ds4_ir::quant);
    let ggml = &d.ggml;
    let (n, bytes, sub) = (d.block, d.block_bytes, d.sub_block);
    let fields = d.fields.iter().map(|f| {
        let (name, ty, off) = (&f.name, f.ty.ir(), f.offset);
        let len = match f.len {
            Some(n) => quote!(Some(#n)),
            None => quote!(None),
        };
        quote!(#q::Field { name: #name, ty: #ty, len: #len, offset: #off })
    });
    let tables = d.tables.iter().map(|t| {
        let (name, ty) = (&t.name, t.ty.ir());
        let variant = format_ident!("{}", t.ty.name().to_uppercase());
        let id = format_ident!("{}", t.name);
        quote!(#q::Table { name: #name, ty: #ty, data: #q::TableData::#variant(&#id) })
    });
    let lets = d.lets.iter().map(|l| {
        let (name, ty, lv, v) = (
            &l.name,
            l.value.ty.ir(),
            level(l.value.level),
            expr(&l.value),
        );
        quote!(#q::Let { name: #name, ty: #ty, level: #lv, value: &#v })
    });
    let value = expr(value);
    quote! {
        /// Layout and de-quantization expression of this type, for code generators.
        pub static SPEC: #q::QuantSpec = #q::QuantSpec {
            ggml: ds4_ir::GgmlType::#ggml,
            block_elems: #n,
            block_bytes: #bytes,
            sub_block: #sub,
            fields: &[#(#fields),*],
            tables: &[#(#tables),*],
            lets: &[#(#lets),*],
            value: &#value,
        };
    }
}
