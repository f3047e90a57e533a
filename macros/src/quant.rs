//! `quant_type!`: one declaration per GGML quant type, expanded into the type's IR
//! (`SPEC`, for code generators) and its CPU code (de-quantization, fused dot, the
//! quantizer's `Block` struct, the registry entry `CPU`).
//!
//! ```ignore
//! quant_type! {
//!     ggml: Q8_0,                 // the ds4_ir::GgmlType variant
//!     block: 32,                  // elements per block
//!     sub_block: 32,              // elements per sub-block (hoisting granularity)
//!     layout {                    // little-endian fields tiling the block exactly
//!         d: f16 @ 0,
//!         qs: [i8; 32] @ 2,
//!     }
//!     tables { }                  // `NAME: [T; N]`, naming consts of the same file
//!     dequant(s, j) {             // element s * sub_block + j of the block, as an f32
//!         (qs[j] as f32) * (d as f32)
//!     }
//!     quantize: quantize_block,   // optional: fn(&[f32; block]) -> Block
//! }
//! ```
//! The parts: this file parses the declaration and checks the layout; `check` types the
//! expression; `range` proves indices in bounds; `emit_ir` and `emit_cpu` write the code,
//! `emit_cpu` through `emit_dot` for the dot products, which use the value in the factored
//! form that `factor` finds (sub-block scale × element term + sub-block offset).

mod check;
mod emit_cpu;
mod emit_dot;
mod emit_ir;
mod factor;
mod range;
mod ty;

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{braced, parenthesized, Error, Ident, LitInt, Result, Token};

use check::{FieldDecl, LetDef, Scope, TableDecl};
use ty::Ty;

/// A parsed and checked declaration.
pub struct Decl {
    pub ggml: Ident,
    pub block: usize,
    pub sub_block: usize,
    pub block_bytes: usize,
    pub fields: Vec<FieldDecl>,
    pub tables: Vec<TableDecl>,
    pub lets: Vec<LetDef>,
    pub quantize: Option<syn::Path>,
}

/// The declaration as written, before checking.
struct Raw {
    ggml: Option<Ident>,
    block: Option<LitInt>,
    sub_block: Option<LitInt>,
    fields: Vec<(Ident, syn::Type, LitInt)>,
    tables: Vec<(Ident, syn::Type)>,
    dequant: Option<(Ident, Ident, syn::Block)>,
    quantize: Option<syn::Path>,
}

impl Parse for Raw {
    fn parse(input: ParseStream) -> Result<Raw> {
        let mut r = Raw {
            ggml: None,
            block: None,
            sub_block: None,
            fields: vec![],
            tables: vec![],
            dequant: None,
            quantize: None,
        };
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            match key.to_string().as_str() {
                "ggml" => {
                    input.parse::<Token![:]>()?;
                    r.ggml = Some(input.parse()?);
                }
                "block" => {
                    input.parse::<Token![:]>()?;
                    r.block = Some(input.parse()?);
                }
                "sub_block" => {
                    input.parse::<Token![:]>()?;
                    r.sub_block = Some(input.parse()?);
                }
                "quantize" => {
                    input.parse::<Token![:]>()?;
                    r.quantize = Some(input.parse()?);
                }
                "layout" => {
                    let body;
                    braced!(body in input);
                    while !body.is_empty() {
                        let name: Ident = body.parse()?;
                        body.parse::<Token![:]>()?;
                        let ty: syn::Type = body.parse()?;
                        body.parse::<Token![@]>()?;
                        let off: LitInt = body.parse()?;
                        r.fields.push((name, ty, off));
                        if !body.is_empty() {
                            body.parse::<Token![,]>()?;
                        }
                    }
                }
                "tables" => {
                    let body;
                    braced!(body in input);
                    while !body.is_empty() {
                        let name: Ident = body.parse()?;
                        body.parse::<Token![:]>()?;
                        r.tables.push((name, body.parse()?));
                        if !body.is_empty() {
                            body.parse::<Token![,]>()?;
                        }
                    }
                }
                "dequant" => {
                    let args;
                    parenthesized!(args in input);
                    let s: Ident = args.parse()?;
                    args.parse::<Token![,]>()?;
                    let j: Ident = args.parse()?;
                    r.dequant = Some((s, j, input.parse()?));
                }
                other => {
                    return Err(Error::new(
                        key.span(),
                        format!("unknown key `{other}` (ggml, block, sub_block, layout, tables, dequant, quantize)"),
                    ))
                }
            }
            if input.peek(Token![,]) {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(r)
    }
}

/// `T` or `[T; N]` of a field or table: element type and length.
fn elem_and_len(t: &syn::Type) -> Result<(Ty, Option<usize>)> {
    let scalar = |t: &syn::Type| -> Result<Ty> {
        if let syn::Type::Path(p) = t {
            if let Some(ty) = p
                .path
                .get_ident()
                .and_then(|i| Ty::from_name(&i.to_string()))
            {
                if ty != Ty::Bool {
                    return Ok(ty);
                }
            }
        }
        Err(Error::new(
            t.span(),
            "expected u8, i8, u16, i16, u32, i32, u64, f16 or f32",
        ))
    };
    match t {
        syn::Type::Array(a) => {
            let n = match &a.len {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(n),
                    ..
                }) => n.base10_parse::<usize>()?,
                e => {
                    return Err(Error::new(
                        e.span(),
                        "array length must be an integer literal",
                    ))
                }
            };
            if n == 0 {
                return Err(Error::new(a.len.span(), "empty array"));
            }
            Ok((scalar(&a.elem)?, Some(n)))
        }
        t => Ok((scalar(t)?, None)),
    }
}

fn required<T>(v: Option<T>, what: &str) -> Result<T> {
    v.ok_or_else(|| Error::new(Span::call_site(), format!("quant_type! needs `{what}`")))
}

/// Check the layout: fields tile `0..block_bytes` with no gap and no overlap. Returns the
/// block's byte size.
fn check_layout(fields: &[FieldDecl], spans: &[Span]) -> Result<usize> {
    let mut order: Vec<usize> = (0..fields.len()).collect();
    order.sort_by_key(|&k| fields[k].offset);
    let mut end = 0usize;
    for &k in &order {
        let f = &fields[k];
        if f.offset != end {
            let what = if f.offset > end { "gap" } else { "overlap" };
            return Err(Error::new(
                spans[k],
                format!(
                    "`{}` starts at byte {} but the previous field ends at {end} ({what})",
                    f.name, f.offset
                ),
            ));
        }
        end = f.offset + f.len.unwrap_or(1) * f.ty.bytes();
    }
    if end == 0 {
        return Err(Error::new(Span::call_site(), "the layout has no fields"));
    }
    Ok(end)
}

pub fn expand(input: TokenStream) -> Result<TokenStream> {
    let raw: Raw = syn::parse2(input)?;
    let ggml = required(raw.ggml, "ggml: <GgmlType variant>")?;
    let block_lit = required(raw.block, "block: <elements per block>")?;
    let block: usize = block_lit.base10_parse()?;
    let sub_block: usize = match &raw.sub_block {
        Some(l) => l.base10_parse()?,
        None => block,
    };
    if block == 0 || sub_block == 0 || !block.is_multiple_of(sub_block) {
        return Err(Error::new(
            block_lit.span(),
            "block and sub_block must be positive, sub_block dividing block",
        ));
    }

    let mut names: Vec<String> = vec![];
    let mut unique = |id: &Ident| -> Result<String> {
        let n = id.to_string();
        if names.contains(&n) || n.starts_with("__") {
            return Err(Error::new(
                id.span(),
                format!("`{n}` is declared twice or reserved"),
            ));
        }
        names.push(n.clone());
        Ok(n)
    };
    let mut fields = vec![];
    let mut spans = vec![];
    for (name, t, off) in &raw.fields {
        let (ty, len) = elem_and_len(t)?;
        fields.push(FieldDecl {
            name: unique(name)?,
            ty,
            len,
            offset: off.base10_parse()?,
        });
        spans.push(name.span());
    }
    let block_bytes = check_layout(&fields, &spans)?;
    let mut tables = vec![];
    for (name, t) in &raw.tables {
        let (ty, len) = elem_and_len(t)?;
        let Some(len) = len else {
            return Err(Error::new(t.span(), "a table is an array: [T; N]"));
        };
        if ty == Ty::F16 {
            return Err(Error::new(
                t.span(),
                "f16 tables are not supported (use u16 bits or f32)",
            ));
        }
        tables.push(TableDecl {
            name: unique(name)?,
            ty,
            len,
        });
    }
    let (s, j, body) = required(raw.dequant, "dequant(s, j) { ... }")?;
    let (sub_name, lane_name) = (unique(&s)?, unique(&j)?);

    let mut scope = Scope {
        fields: &fields,
        tables: &tables,
        sub_name,
        lane_name,
        sub_blocks: block / sub_block,
        sub_block,
        lets: vec![],
    };
    let value = scope.check_body(&body)?;
    let lets = std::mem::take(&mut scope.lets);

    let decl = Decl {
        ggml,
        block,
        sub_block,
        block_bytes,
        fields,
        tables,
        lets,
        quantize: raw.quantize,
    };
    let spec = emit_ir::spec(&decl, &value);
    let cpu = emit_cpu::cpu(&decl, &value);
    Ok(quote::quote! {
        #spec
        #cpu
    })
}

#[cfg(test)]
mod tests {
    use super::expand;
    use quote::quote;

    /// The error message of a declaration that must be rejected.
    fn error(decl: proc_macro2::TokenStream) -> String {
        match expand(decl) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn accepts_a_valid_declaration() {
        let out = expand(quote! {
            ggml: Q8_0, block: 32,
            layout { d: f16 @ 0, qs: [i8; 32] @ 2 }
            dequant(s, j) { (qs[j] as f32) * (d as f32) }
        })
        .unwrap()
        .to_string();
        assert!(out.contains("pub static SPEC"), "{out}");
        assert!(out.contains("pub fn dot_row"), "{out}");
    }

    #[test]
    fn integer_element_terms_get_a_fast_kernel() {
        // q as f32 times a block scale: an int8 element term, so a `dot_row_q8`.
        let out = expand(quote! {
            ggml: Q8_0, block: 32,
            layout { d: f16 @ 0, qs: [i8; 32] @ 2 }
            dequant(s, j) { (qs[j] as f32) * (d as f32) }
        })
        .unwrap()
        .to_string();
        assert!(out.contains("dot_row_q8 : Some (dot_row_q8)"), "{out}");
        // A float element term (here the raw f32 value) has none.
        let out = expand(quote! {
            ggml: Q8_0, block: 32,
            layout { d: f16 @ 0, qs: [i8; 32] @ 2 }
            tables { T: [f32; 256] }
            dequant(s, j) { T[(qs[j] as u8) as u32] * (d as f32) }
        })
        .unwrap()
        .to_string();
        assert!(out.contains("dot_row_q8 : None"), "{out}");
    }

    #[test]
    fn rejects_an_index_it_cannot_prove_in_bounds() {
        let e = error(quote! {
            ggml: Q8_0, block: 32,
            layout { d: f16 @ 0, qs: [i8; 32] @ 2 }
            dequant(s, j) { (qs[j + 1] as f32) * (d as f32) }
        });
        assert!(
            e.contains("cannot prove this index in bounds: it ranges over 1..=32"),
            "{e}"
        );
    }

    #[test]
    fn proves_masked_data_dependent_indices() {
        // A table index from loaded data is fine once masked below the table length.
        expand(quote! {
            ggml: Mxfp4, block: 32, sub_block: 16,
            layout { e: u8 @ 0, qs: [u8; 16] @ 1 }
            tables { KV: [i8; 16] }
            dequant(s, j) { KV[(qs[j] >> (4 * s)) & 0xF] as f32 }
        })
        .unwrap();
        let e = error(quote! {
            ggml: Mxfp4, block: 32, sub_block: 16,
            layout { e: u8 @ 0, qs: [u8; 16] @ 1 }
            tables { KV: [i8; 16] }
            dequant(s, j) { KV[qs[j] >> (3 * s)] as f32 }
        });
        assert!(e.contains("ranges over 0..=255"), "{e}");
    }

    #[test]
    fn rejects_layout_gaps_and_overlaps() {
        let e = error(quote! {
            ggml: Q8_0, block: 32,
            layout { d: f16 @ 0, qs: [i8; 32] @ 3 }
            dequant(s, j) { qs[j] as f32 }
        });
        assert!(e.contains("(gap)"), "{e}");
        let e = error(quote! {
            ggml: Q8_0, block: 32,
            layout { d: f16 @ 0, qs: [i8; 32] @ 1 }
            dequant(s, j) { qs[j] as f32 }
        });
        assert!(e.contains("(overlap)"), "{e}");
    }

    #[test]
    fn rejects_type_errors() {
        let body = |b: proc_macro2::TokenStream| {
            error(quote! {
                ggml: Q8_0, block: 32,
                layout { d: f16 @ 0, qs: [i8; 32] @ 2 }
                dequant(s, j) { #b }
            })
        };
        assert!(body(quote!((qs[j] as f32) * d)).contains("mismatched types f32 and f16"));
        assert!(body(quote!(qs[j])).contains("must be f32, this is i8"));
        assert!(body(quote!((qs[j] / (j as i8)) as f32)).contains("only by a non-zero constant"));
        assert!(body(quote!((qs[j] as f32) * 2)).contains("write it as a float"));
        assert!(body(quote!(x as f32)).contains("unknown name `x`"));
        assert!(body(quote!(qs as f32)).contains("array field"));
        assert!(body(quote!(let a = 1; let a = 2; a as f32)).contains("already defined"));
    }
}
