//! Emit the CPU code of a quant type: the quantizer's `Block` struct, the de-quantization,
//! and (through `emit_dot`) the dot products, all from the same typed expression tree.
//!
//! Shape of the de-quantization (an `#[inline(always)]` walker):
//! ```text
//! for_each_group(block, f):
//!     block-level lets                      (scales of the whole block)
//!     for s in 0..SUB_BLOCKS:
//!         sub-level lets                    (hoisted: the sub-block's scale and min)
//!         for g in 0..SUB_BLOCK / W:
//!             v = [f32; W]; for l in 0..W { j = g*W + l; element lets; v[l] = value }
//!             f(group index, &v)
//! ```
//! `dequantize_block` stores each group. The value is computed in the declared operation
//! order, so de-quantization is bit-exact; the dot products (`emit_dot`) use a factored
//! form of the same expression instead.

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::check::{BinOp, Kind, Level, TExpr, UnOp};
use super::emit_dot;
use super::ty::Ty;
use super::Decl;

pub(super) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn int_literal(t: Ty, v: i128) -> TokenStream {
    let lit = match t {
        Ty::U8 => Literal::u8_suffixed(v as u8),
        Ty::I8 => Literal::i8_suffixed(v as i8),
        Ty::U16 => Literal::u16_suffixed(v as u16),
        Ty::I16 => Literal::i16_suffixed(v as i16),
        Ty::U32 => Literal::u32_suffixed(v as u32),
        Ty::I32 => Literal::i32_suffixed(v as i32),
        Ty::U64 => Literal::u64_suffixed(v as u64),
        Ty::Bool => return if v != 0 { quote!(true) } else { quote!(false) },
        Ty::F16 | Ty::F32 => unreachable!("not an integer type"),
    };
    quote!((#lit))
}

/// Rust for a checked expression. Index variables are `__s` and `__j` (u32); the block is
/// `__b: &[u8; BYTES]`; tables are the `__TAB_*` statics.
pub(super) fn expr(e: &TExpr, d: &Decl) -> TokenStream {
    let rt = quote!(ds4_ir::quant::rt);
    match &e.kind {
        Kind::Int(v) => int_literal(e.ty, *v),
        Kind::Float(v) => {
            let b = v.to_bits();
            quote!(f32::from_bits(#b))
        }
        Kind::Sub => quote!(__s),
        Kind::Lane => quote!(__j),
        Kind::Var(n) => {
            let id = format_ident!("{}", n);
            quote!(#id)
        }
        Kind::Field(n) => load(d, n, quote!(0usize)),
        Kind::Load(n, i) => {
            let i = expr(i, d);
            load(d, n, quote!((#i) as usize))
        }
        Kind::Table(n, i) => {
            let (tab, i) = (format_ident!("__TAB_{}", n), expr(i, d));
            // SAFETY: the macro proved the index below the table's length (range analysis).
            quote!(unsafe { #rt::tab(&#tab, (#i) as usize) })
        }
        Kind::Unary(op, a) => {
            let a = expr(a, d);
            match (op, e.ty) {
                (UnOp::Neg, Ty::F32) => quote!((-(#a))),
                (UnOp::Neg, _) => quote!((#a).wrapping_neg()),
                (UnOp::Not, _) => quote!((!(#a))),
            }
        }
        Kind::Binary(op, a, b) => {
            let int = a.ty.is_int();
            let (a, b) = (expr(a, d), expr(b, d));
            match op {
                BinOp::Add if int => quote!((#a).wrapping_add(#b)),
                BinOp::Sub if int => quote!((#a).wrapping_sub(#b)),
                BinOp::Mul if int => quote!((#a).wrapping_mul(#b)),
                BinOp::Div if int => quote!((#a).wrapping_div(#b)),
                BinOp::Rem if int => quote!((#a).wrapping_rem(#b)),
                BinOp::Shl => quote!((#a).wrapping_shl((#b) as u32)),
                BinOp::Shr => quote!((#a).wrapping_shr((#b) as u32)),
                BinOp::Add => quote!((#a + #b)),
                BinOp::Sub => quote!((#a - #b)),
                BinOp::Mul => quote!((#a * #b)),
                BinOp::Div => quote!((#a / #b)),
                BinOp::Rem => quote!((#a % #b)),
                BinOp::BitAnd => quote!((#a & #b)),
                BinOp::BitOr => quote!((#a | #b)),
                BinOp::BitXor => quote!((#a ^ #b)),
                BinOp::Eq => quote!((#a == #b)),
                BinOp::Ne => quote!((#a != #b)),
                BinOp::Lt => quote!((#a < #b)),
                BinOp::Le => quote!((#a <= #b)),
                BinOp::Gt => quote!((#a > #b)),
                BinOp::Ge => quote!((#a >= #b)),
                BinOp::And => quote!((#a && #b)),
                BinOp::Or => quote!((#a || #b)),
            }
        }
        Kind::Cast(a) => {
            let from = a.ty;
            let a = expr(a, d);
            match (from, e.ty) {
                (f, t) if f == t => a,
                // `AVX2` and `__f16` are in scope of all generated code: AVX2 is true in the
                // AVX2 variant of the dot products (F16C's conversion instruction), and
                // `__f16` is the conversion for lanes (one-element types) or for single
                // values (block scales): `rt::f16_to_f32_lanes` / `_scalar`.
                (Ty::F16, Ty::F32) => quote!(__f16::<AVX2>(#a)),
                (Ty::F32, Ty::F16) => quote!(#rt::f32_to_f16(#a)),
                (_, t) => {
                    let t = t.rust();
                    quote!(((#a) as #t))
                }
            }
        }
        Kind::Bitcast(a) => {
            let from = a.ty;
            let a = expr(a, d);
            match (from, e.ty) {
                (Ty::U32, Ty::F32) => quote!(f32::from_bits(#a)),
                (Ty::F32, Ty::U32) => quote!((#a).to_bits()),
                // f16 values are carried as their bits already.
                _ => a,
            }
        }
        Kind::Select(c, a, b) => {
            let (c, a, b) = (expr(c, d), expr(a, d), expr(b, d));
            quote!((if #c { #a } else { #b }))
        }
    }
}

/// Element `index` of field `name`, as a value of the field's CPU type.
fn load(d: &Decl, name: &str, index: TokenStream) -> TokenStream {
    let rt = quote!(ds4_ir::quant::rt);
    let f = d.fields.iter().find(|f| f.name == name).expect("checked");
    let (off, size) = (f.offset, f.ty.bytes());
    let at = quote!(#off + (#index) * #size);
    // SAFETY (all arms): the macro proved `index < len` for this field, and the fields lie
    // inside the block, so `at + size <= BYTES`.
    let raw = match size {
        1 => quote!(unsafe { #rt::ld_u8(__b, #at) }),
        2 => quote!(unsafe { #rt::ld_u16(__b, #at) }),
        4 => quote!(unsafe { #rt::ld_u32(__b, #at) }),
        _ => quote!(unsafe { #rt::ld_u64(__b, #at) }),
    };
    match f.ty {
        Ty::I8 => quote!((#raw as i8)),
        Ty::I16 => quote!((#raw as i16)),
        Ty::I32 => quote!((#raw as i32)),
        Ty::F32 => quote!(f32::from_bits(#raw)),
        _ => raw,
    }
}

pub(super) fn lets_at(d: &Decl, level: Level) -> TokenStream {
    let lets = d.lets.iter().filter(|l| l.value.level == level).map(|l| {
        let (id, ty, v) = (
            format_ident!("{}", l.name),
            l.value.ty.rust(),
            expr(&l.value, d),
        );
        quote!(let #id: #ty = #v;)
    });
    quote!(#(#lets)*)
}

/// The quantizer's view of a block: a struct with one Rust field per layout field, and its
/// little-endian encoding.
fn block_struct(d: &Decl) -> TokenStream {
    let bytes = d.block_bytes;
    let mut members = vec![];
    let mut reads = vec![];
    let mut writes = vec![];
    for f in &d.fields {
        let (id, ty, off, size) = (
            format_ident!("{}", f.name),
            f.ty.rust_field(),
            f.offset,
            f.ty.bytes(),
        );
        let elem_ty = f.ty.rust();
        let from = |at: TokenStream| {
            let v = quote! {{
                let mut a = [0u8; #size];
                a.copy_from_slice(&b[#at..#at + #size]);
                <#elem_ty>::from_le_bytes(a)
            }};
            if f.ty == Ty::F16 {
                quote!(ds4_ir::quant::rt::f16::from_bits(#v))
            } else {
                v
            }
        };
        let to = |at: TokenStream, v: TokenStream| {
            let v = if f.ty == Ty::F16 {
                quote!(#v.to_bits())
            } else {
                v
            };
            quote!(b[#at..#at + #size].copy_from_slice(&#v.to_le_bytes());)
        };
        match f.len {
            None => {
                members.push(quote!(pub #id: #ty));
                let r = from(quote!(#off));
                reads.push(quote!(#id: #r));
                writes.push(to(quote!(#off), quote!(self.#id)));
            }
            Some(n) => {
                members.push(quote!(pub #id: [#ty; #n]));
                let r = from(quote!(#off + k * #size));
                reads.push(quote!(#id: core::array::from_fn(|k| #r)));
                let w = to(quote!(#off + k * #size), quote!(self.#id[k]));
                writes.push(quote!(for k in 0..#n { #w }));
            }
        }
    }
    quote! {
        /// One block, field by field: what a quantizer fills in.
        #[allow(dead_code)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct Block {
            #(#members,)*
        }

        #[allow(dead_code)]
        impl Block {
            /// Decode a block's fields (little-endian).
            pub fn read(b: &[u8; #bytes]) -> Block {
                Block { #(#reads,)* }
            }
            /// Encode the fields into the block's bytes (little-endian).
            pub fn write(&self, b: &mut [u8; #bytes]) {
                #(#writes)*
            }
        }
    }
}

/// All CPU items of a declaration.
pub fn cpu(d: &Decl, value: &TExpr) -> TokenStream {
    let rt = quote!(ds4_ir::quant::rt);
    let (n, bytes, sub) = (d.block, d.block_bytes, d.sub_block);
    let nsub = (n / sub) as u32;
    // Lanes per group of the de-quantization walk: divides the sub-block, at most 16.
    let w = gcd(sub, 16);
    let groups = (sub / w) as u32;
    let w32 = w as u32;

    let block_lets = lets_at(d, Level::Block);
    let sub_lets = lets_at(d, Level::Sub);
    let elem_lets = lets_at(d, Level::Elem);
    let (dot, dot_q8_ref) = emit_dot::dots(d, value);
    let value = expr(value, d);

    let tables = d.tables.iter().map(|t| {
        let (tab, id, ty, len) = (
            format_ident!("__TAB_{}", t.name),
            format_ident!("{}", t.name),
            t.ty.rust(),
            t.len,
        );
        // A static, so that indexing reads one shared copy rather than a const temporary.
        quote!(static #tab: [#ty; #len] = #id;)
    });

    let (quantize_row, quantize_ref) = match &d.quantize {
        Some(path) => (
            quote! {
                /// Quantize whole blocks (`src.len() / BLOCK_ELEMS` of them) into `dst`.
                pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
                    let (xs, _) = src.as_chunks::<#n>();
                    let (bs, _) = dst.as_chunks_mut::<#bytes>();
                    for (x, b) in xs.iter().zip(bs) {
                        let block: Block = #path(x);
                        block.write(b);
                    }
                }
            },
            quote!(Some(quantize_row)),
        ),
        None => (quote!(), quote!(None)),
    };
    let ggml = &d.ggml;
    let block_struct = block_struct(d);

    quote! {
        #[allow(dead_code)]
        pub const GGML: ds4_ir::GgmlType = ds4_ir::GgmlType::#ggml;
        #[allow(dead_code)]
        pub const BLOCK_ELEMS: usize = #n;
        #[allow(dead_code)]
        pub const BLOCK_BYTES: usize = #bytes;
        #[allow(dead_code)]
        pub const SUB_BLOCK: usize = #sub;

        #(#tables)*

        #block_struct

        /// Walk the block's elements in groups of the lane width, computing each group from
        /// the declared expression (in its declared operation order: bit-exact) with block-
        /// and sub-block-level values hoisted.
        #[inline(always)]
        #[allow(unused_variables, clippy::all)]
        fn __for_each_group(__b: &[u8; #bytes], mut __f: impl FnMut(usize, &[f32; #w])) {
            const AVX2: bool = false;
            use ds4_ir::quant::rt::f16_to_f32_lanes as __f16;
            #block_lets
            for __s in 0..#nsub {
                #sub_lets
                for __g in 0..#groups {
                    let mut __v = [0f32; #w];
                    for __l in 0..#w32 {
                        let __j: u32 = __g * #w32 + __l;
                        #elem_lets
                        __v[__l as usize] = #value;
                    }
                    __f((__s * #groups + __g) as usize, &__v);
                }
            }
        }

        /// De-quantize one block.
        #[allow(dead_code)]
        pub fn dequantize_block(b: &[u8; #bytes], out: &mut [f32; #n]) {
            let (groups, _) = out.as_chunks_mut::<#w>();
            __for_each_group(b, |g, v| groups[g] = *v);
        }

        /// De-quantize whole blocks (`src.len() / BLOCK_BYTES` of them).
        pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
            let (bs, _) = src.as_chunks::<#bytes>();
            let (os, _) = dst.as_chunks_mut::<#n>();
            for (b, o) in bs.iter().zip(os) {
                dequantize_block(b, o);
            }
        }

        #dot

        /// Dot product of one de-quantized block with `x`, f32 accumulation.
        #[allow(dead_code)]
        pub fn dot_block(b: &[u8; #bytes], x: &[f32; #n]) -> f32 {
            dot_row(b, x)
        }

        #quantize_row

        /// This type's entry in the registry.
        pub static CPU: #rt::CpuQuant = #rt::CpuQuant {
            spec: &SPEC,
            dequantize_row,
            dot_row,
            quantize_row: #quantize_ref,
            dot_row_q8: #dot_q8_ref,
        };
    }
}
