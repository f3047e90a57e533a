//! Emit the dot products of a quant type: the exact one (`dot_row`, f32 activations) and,
//! where the element term is a small integer, the fast one against int8-quantized
//! activations (`dot_row_q8`).
//!
//! Both use the factored form of the value (see `factor`): per sub-block,
//! `scale · Σ e_j·x_j + offset · Σ x_j`. Each is one generic function body, instantiated
//! for the baseline target and, on x86-64, for AVX2 + FMA (picked at run time).
//!
//! Shape of the exact product, per block:
//! ```text
//! (sa, so) = scales and offsets of all sub-blocks      (a vectorizable loop over s)
//! for s in 0..SUB_BLOCKS (unrolled):
//!     q[W] = Σ e_j·x_j, sx[W] = Σ x_j                 (W lanes, vectorized over j)
//!     acc[s % 4] += sa[s]·q;  acc[4 + s % 2] += so[s]·sx
//! ```
//! and of the fast one, per block:
//! ```text
//! for each 32 values c (unrolled):                      (one activation block)
//!     e[32] = the element terms as bytes                (vectorized over j)
//!     lanes[8] = Σ e·xq per 4 values                    (vpmaddubsw + vpmaddwd on AVX2)
//!     acc[c % 2] += lanes · (sa[sub-block of the lane] · xd[c])
//! acc_off[s] += so[s] · (Σ x̂ over sub-block s)         (precomputed per 16 activations)
//! ```

use proc_macro2::TokenStream;
use quote::quote;

use super::check::{Level, TExpr};
use super::emit_cpu::{expr, gcd, lets_at};
use super::factor::{factor, Factored};
use super::Decl;

/// Accumulator lanes of the exact dot product, per sub-block: one AVX or two SSE registers.
/// More lanes would make the per-sub-block fold (one multiply-add per lane) the larger cost
/// for the 16-value sub-blocks of Q2_K and Q6_K.
const DOT_LANES: usize = 8;

/// Blocks per step for one-element types (F32, F16, BF16), each lane its own block and
/// accumulator: four AVX registers of accumulators.
const SINGLE_STEP: usize = 32;

/// Activation block of the fast path (one f32 scale per this many int8 values), and the
/// granule of its precomputed sums.
const ACT_BLOCK: usize = 32;
const ACT_SUM: usize = 16;

/// The product of `factors` (f32 expressions), in source order; `1.0` if none.
fn product(factors: &[&TExpr], d: &Decl) -> TokenStream {
    let mut it = factors.iter().map(|f| expr(f, d));
    match it.next() {
        None => quote!(1f32),
        Some(first) => it.fold(first, |acc, f| quote!((#acc * #f))),
    }
}

/// `#public(#args) -> #ret`, calling `#generic::<FMA, AVX2>(#call)` instantiated twice: a
/// portable version for the build's baseline target, and (x86-64) one compiled for
/// AVX2 + FMA, chosen at run time. The body is the same token stream: LLVM vectorizes it
/// for each target, `rt::madd::<FMA>` becomes a fused multiply-add only where FMA exists
/// (aarch64 has it in its baseline), and `rt::dot32_*::<AVX2>` uses the AVX2 byte
/// multiply-adds.
fn dispatch(
    public: TokenStream,
    generic: TokenStream,
    args: TokenStream,
    call: TokenStream,
) -> TokenStream {
    let rt = quote!(ds4_ir::quant::rt);
    quote! {
        #public(#args) -> f32 {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c")]
                fn avx2(#args) -> f32 {
                    #generic::<true, true>(#call)
                }
                if #rt::avx2_fma() {
                    // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run time, once).
                    return unsafe { avx2(#call) };
                }
            }
            #generic::<{ #rt::PORTABLE_FMA }, false>(#call)
        }
    }
}

/// `let (__sa, __so) = ...`: the scales and offsets of the block's sub-blocks, for the dot
/// products. With several sub-blocks the arrays go through memory (`black_box`): the
/// stores of the arrays' consecutive elements are what LLVM's SLP vectorizer starts from,
/// so Q2_K's 16 scales become a few vector operations. Without it, LLVM unrolls the loop
/// and keeps every scale in a register: 16 scalar conversions and multiplies, each next to
/// its sub-block. The sub-blocks then read the arrays with broadcast loads.
fn call_sub_scales(d: &Decl) -> TokenStream {
    if d.block / d.sub_block >= 4 {
        quote! {
            let mut __ss = __sub_scales::<AVX2>(__b);
            core::hint::black_box(&mut __ss);
            let (__sa, __so) = &__ss;
        }
    } else {
        quote!(let (__sa, __so) = __sub_scales::<AVX2>(__b);)
    }
}

/// `__sub_scales(block) -> (scales, offsets)` of every sub-block, in a loop over `s`.
fn sub_scales(d: &Decl, f: &Factored) -> TokenStream {
    let (bytes, nsub) = (d.block_bytes, d.block / d.sub_block);
    let nsub32 = nsub as u32;
    let block_lets = lets_at(d, Level::Block);
    let sub_lets = lets_at(d, Level::Sub);
    let scale = product(&f.scale, d);
    let offset = match f.offset {
        Some((negate, o)) => {
            let o = expr(o, d);
            if negate {
                quote!(-(#o))
            } else {
                o
            }
        }
        None => quote!(0f32),
    };
    quote! {
        /// The scale and offset of every sub-block of a block (the factored value: see the
        /// macro's `factor`).
        #[inline(always)]
        #[allow(unused_variables, clippy::all)]
        fn __sub_scales<const AVX2: bool>(__b: &[u8; #bytes]) -> ([f32; #nsub], [f32; #nsub]) {
            use ds4_ir::quant::rt::f16_to_f32_scalar as __f16;
            #block_lets
            let mut __sa = [0f32; #nsub];
            let mut __so = [0f32; #nsub];
            for __s in 0..#nsub32 {
                #sub_lets
                __sa[__s as usize] = #scale;
                __so[__s as usize] = #offset;
            }
            (__sa, __so)
        }
    }
}

/// The exact dot product of a row of multi-element blocks with f32 `x`.
fn dot_exact(d: &Decl, f: &Factored) -> TokenStream {
    let rt = quote!(ds4_ir::quant::rt);
    let scales = call_sub_scales(d);
    let (n, bytes, sub) = (d.block, d.block_bytes, d.sub_block);
    let nsub = (n / sub) as u32;
    let w = gcd(sub, DOT_LANES);
    let (groups, w32) = ((sub / w) as u32, w as u32);
    let sub_lets = lets_at(d, Level::Sub);
    let elem_lets = lets_at(d, Level::Elem);
    // Where the element term is a small integer, the sub-block's terms are first computed
    // as bytes, in a loop of their own (byte operations, 16 or 32 per vector: MXFP4's
    // decoding selects vectorize there, not next to the f32 products), then widened to f32
    // as the products need them.
    let (unpack, elem_lets, elem) = match int_elem_bytes(f, d) {
        Some((ety, e)) => (
            quote! {
                let mut __e = [0 as #ety; #sub];
                for __j in 0..#sub as u32 {
                    #elem_lets
                    __e[__j as usize] = #e;
                }
            },
            quote!(),
            quote!((__e[__j as usize] as f32)),
        ),
        None => (quote!(), elem_lets, product(&f.elem, d)),
    };
    let sum_x = f.offset.map(|_| quote!(__sx[__l as usize] += __xv;));
    let fold_offset = f.offset.map(|_| {
        quote! {
            let __o = __so[__si];
            let __dst = &mut __acc[4 + __si % 2];
            for __l in 0..#w {
                __dst[__l] = #rt::madd::<FMA>(__o, __sx[__l], __dst[__l]);
            }
        }
    });
    // The sub-block loop is unrolled: with `s` a constant, the sub-level index arithmetic,
    // shifts and selects fold into constants, and the sub-blocks' independent work is
    // scheduled together.
    let subs = (0..nsub).map(|s| {
        let si = s as usize;
        quote! {{
            let __s: u32 = #s;
            let __si: usize = #si;
            #sub_lets
            let __x: &[f32; #sub] = &__xsub[__si];
            // -0.0, the identity of f32 addition (0.0 is not, for -0.0): LLVM drops the
            // first addition.
            let mut __q = [-0f32; #w];
            let mut __sx = [-0f32; #w];
            #unpack
            for __g in 0..#groups {
                for __l in 0..#w32 {
                    let __j: u32 = __g * #w32 + __l;
                    #elem_lets
                    let __xv = __x[__j as usize];
                    __q[__l as usize] = #rt::madd::<FMA>(#elem, __xv, __q[__l as usize]);
                    #sum_x
                }
            }
            let __a = __sa[__si];
            let __dst = &mut __acc[__si % 4];
            for __l in 0..#w {
                __dst[__l] = #rt::madd::<FMA>(__a, __q[__l], __dst[__l]);
            }
            #fold_offset
        }}
    });
    let body = quote! {
        #[inline(always)]
        #[allow(unused_variables, unused_mut, clippy::all)]
        fn __dot<const FMA: bool, const AVX2: bool>(src: &[u8], x: &[f32]) -> f32 {
            // Block and sub-block values (no current type has f16 element values).
            use ds4_ir::quant::rt::f16_to_f32_scalar as __f16;
            let (__bs, _) = src.as_chunks::<#bytes>();
            let (__xs, _) = x.as_chunks::<#n>();
            // Six sets of accumulators (scale terms of sub-blocks by s mod 4, offset terms by
            // s mod 2): independent chains of multiply-adds, so that their latencies
            // overlap (IQ2_XXS folds every 8 values).
            let mut __acc = [[0f32; #w]; 6];
            for (__b, __xb) in __bs.iter().zip(__xs) {
                #scales
                let (__xsub, _) = __xb.as_chunks::<#sub>();
                #(#subs)*
            }
            #rt::sum_lanes(__acc.as_flattened())
        }
    };
    let dispatch = dispatch(
        quote!(pub fn dot_row),
        quote!(__dot),
        quote!(src: &[u8], x: &[f32]),
        quote!(src, x),
    );
    quote! {
        #body
        /// Dot product of a row of whole blocks with `x`, without an intermediate buffer:
        /// the exactly de-quantized weights times `x`, accumulated in f32 in factored form
        /// (per sub-block, scale · Σ e·x + offset · Σ x).
        #dispatch
    }
}

/// The exact dot product for one-element blocks (F32, F16, BF16): `SINGLE_STEP` blocks per
/// step, each lane its own block and accumulator.
fn dot_single(d: &Decl, value: &TExpr) -> TokenStream {
    let rt = quote!(ds4_ir::quant::rt);
    let bytes = d.block_bytes;
    let k = SINGLE_STEP;
    let lets = [Level::Block, Level::Sub, Level::Elem].map(|l| lets_at(d, l));
    let value = expr(value, d);
    let body = quote! {
        #[inline(always)]
        #[allow(unused_variables, clippy::all)]
        fn __dot<const FMA: bool, const AVX2: bool>(src: &[u8], x: &[f32]) -> f32 {
            use ds4_ir::quant::rt::f16_to_f32_lanes as __f16;
            let (__bs, _) = src.as_chunks::<#bytes>();
            let __n = __bs.len().min(x.len());
            let (__bk, __br) = __bs[..__n].as_chunks::<#k>();
            let (__xk, __xr) = x[..__n].as_chunks::<#k>();
            let (__s, __j) = (0u32, 0u32);
            // Groups of 8 blocks, group g into accumulator set g: the shape of the
            // multi-block types' loop, which LLVM vectorizes for SSE2 and AVX2 alike (32
            // independent lanes did not vectorize on SSE2).
            let mut __acc = [[0f32; 8]; #k / 8];
            for (__bb, __xx) in __bk.iter().zip(__xk) {
                for __g in 0..#k / 8 {
                    for __l in 0..8 {
                        let __b = &__bb[__g * 8 + __l];
                        #(#lets)*
                        __acc[__g][__l] = #rt::madd::<FMA>(#value, __xx[__g * 8 + __l], __acc[__g][__l]);
                    }
                }
            }
            let mut __tail = [0f32; #k];
            for (__l, (__b, __xv)) in __br.iter().zip(__xr).enumerate() {
                #(#lets)*
                __tail[__l] = #rt::madd::<FMA>(#value, *__xv, __tail[__l]);
            }
            #rt::sum_lanes(__acc.as_flattened()) + #rt::sum_lanes(&__tail)
        }
    };
    let dispatch = dispatch(
        quote!(pub fn dot_row),
        quote!(__dot),
        quote!(src: &[u8], x: &[f32]),
        quote!(src, x),
    );
    quote! {
        #body
        /// Dot product of a row of whole blocks with `x`, without an intermediate buffer.
        #dispatch
    }
}

/// Interval product of the integer factors' ranges: the range of the element term.
fn int_range(ints: &[&TExpr]) -> Option<(i128, i128)> {
    let mut r = (1i128, 1i128);
    for f in ints {
        let fr = f.range?;
        let c = [r.0 * fr.lo, r.0 * fr.hi, r.1 * fr.lo, r.1 * fr.hi];
        r = (*c.iter().min()?, *c.iter().max()?);
    }
    Some(r)
}

/// The element term as a byte-sized integer expression, and its type (`u8` for
/// `0..=127`, else `i8`), when it is a product of integers whose range fits a byte.
fn int_elem_bytes(f: &Factored, d: &Decl) -> Option<(TokenStream, TokenStream)> {
    let (ints, _) = f.int_elem()?;
    let (lo, hi) = int_range(&ints)?;
    let ety = if lo >= 0 && hi <= 127 {
        quote!(u8)
    } else if lo >= -128 && hi <= 127 {
        quote!(i8)
    } else {
        return None;
    };
    let mut it = ints.iter().map(|f| {
        let f = expr(f, d);
        quote!(((#f) as i32))
    });
    let first = it.next().expect("the element term has a factor");
    let prod = it.fold(first, |acc, f| quote!(#acc.wrapping_mul(#f)));
    Some((ety.clone(), quote!((#prod as #ety))))
}

/// The fast dot product against int8 activations, when the declaration allows it: the
/// element term is a product of integers that fits a byte (`0..=127`: unsigned form; else
/// `-128..=127`: signed form), blocks are whole activation blocks, every 4 values share a
/// sub-block, and an offset's sub-blocks are whole activation-sum granules. None otherwise
/// (the fast path then uses the exact product).
fn dot_q8(d: &Decl, f: &Factored) -> Option<TokenStream> {
    let rt = quote!(ds4_ir::quant::rt);
    let scales = call_sub_scales(d);
    let (n, bytes, sub) = (d.block, d.block_bytes, d.sub_block);
    let (ety, e) = int_elem_bytes(f, d)?;
    let dot32 = if ety.to_string() == "u8" {
        quote!(#rt::dot32_u8::<AVX2>)
    } else {
        quote!(#rt::dot32_i8::<AVX2>)
    };
    if !n.is_multiple_of(ACT_BLOCK) || !sub.is_multiple_of(4) {
        return None;
    }
    if f.offset.is_some() && !sub.is_multiple_of(ACT_SUM) {
        return None;
    }
    let chunks = n / ACT_BLOCK;
    let nsub = n / sub;
    let sub_lets = lets_at(d, Level::Sub);
    let elem_lets = lets_at(d, Level::Elem);
    let chunk_code = (0..chunks).map(|c| {
        // The values c*32 .. c*32+32, as runs of one sub-block each.
        let mut runs = vec![];
        let mut p = 0usize;
        while p < ACT_BLOCK {
            let i = c * ACT_BLOCK + p;
            let (s, j0) = (i / sub, i % sub);
            let len = (sub - j0).min(ACT_BLOCK - p);
            let (s32, j032, len32, p0) = (s as u32, j0 as u32, len as u32, p);
            runs.push(quote! {{
                let __s: u32 = #s32;
                #sub_lets
                for __p in 0..#len32 {
                    let __j: u32 = #j032 + __p;
                    #elem_lets
                    __e[#p0 + __p as usize] = #e;
                }
            }});
            p += len;
        }
        // Lane k of the integer dot covers values 4k..4k+4 of the chunk: one sub-block.
        let factors = (0..8).map(|k| {
            let s = (c * ACT_BLOCK + 4 * k) / sub;
            quote!(__sa[#s] * __dx)
        });
        let parity = c % 2;
        quote! {{
            let mut __e = [0 as #ety; 32];
            #(#runs)*
            // SAFETY: AVX2 is true only in the variant that runs after checking the CPU.
            let __lanes = unsafe { #dot32(&__e, &__xqc[#c]) };
            let __dx = __xdb[#c];
            let __f: [f32; 8] = [#(#factors),*];
            let __dst = &mut __acc[#parity];
            for __k in 0..8 {
                __dst[__k] = #rt::madd::<FMA>(__lanes[__k] as f32, __f[__k], __dst[__k]);
            }
        }}
    });
    let per_sub = sub / ACT_SUM;
    let (sums_chunks, fold_offset) = match f.offset {
        Some(_) => (
            quote!(let (__xsb, _) = xs.as_chunks::<{ #n / #ACT_SUM }>();),
            quote! {
                // Σ over the sub-block of the de-quantized activations, from the sums per 16.
                for __s in 0..#nsub {
                    let mut __sum = 0f32;
                    for __k in 0..#per_sub {
                        __sum += __xs[__s * #per_sub + __k];
                    }
                    __acco[__s] = #rt::madd::<FMA>(__so[__s], __sum, __acco[__s]);
                }
            },
        ),
        None => (quote!(), quote!()),
    };
    let zip_sums = f.offset.map(|_| quote!(.zip(__xsb)));
    let bind_sums = match f.offset {
        Some(_) => quote!((((__b, __xq), __xd), __xs)),
        None => quote!(((__b, __xq), __xd)),
    };
    let nact = n / ACT_BLOCK;
    let body = quote! {
        #[inline(always)]
        #[allow(unused_variables, unused_mut, clippy::all)]
        fn __dot_q8<const FMA: bool, const AVX2: bool>(src: &[u8], xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
            use ds4_ir::quant::rt::f16_to_f32_scalar as __f16;
            let (__bs, _) = src.as_chunks::<#bytes>();
            let (__xqb, _) = xq.as_chunks::<#n>();
            let (__xdbs, _) = xd.as_chunks::<#nact>();
            #sums_chunks
            // Two sets of lane accumulators (even and odd chunks), and one per sub-block for
            // the offset terms.
            let mut __acc = [[0f32; 8]; 2];
            let mut __acco = [0f32; #nsub];
            for #bind_sums in __bs.iter().zip(__xqb).zip(__xdbs)#zip_sums {
                #scales
                let (__xqc, _) = __xq.as_chunks::<32>();
                let __xdb = __xd;
                #(#chunk_code)*
                #fold_offset
            }
            #rt::sum_lanes(__acc.as_flattened()) + #rt::sum_lanes(&__acco)
        }
    };
    let dispatch = dispatch(
        quote!(pub fn dot_row_q8),
        quote!(__dot_q8),
        quote!(src: &[u8], xq: &[i8], xd: &[f32], xs: &[f32]),
        quote!(src, xq, xd, xs),
    );
    Some(quote! {
        #body
        /// Dot product of a row of whole blocks with int8-quantized activations (`xq`, with
        /// f32 scales `xd` per 32 values and de-quantized sums `xs` per 16): the exactly
        /// de-quantized weights times the de-quantized activations, each sub-block's
        /// `Σ e·xq` computed in integers.
        #dispatch
    })
}

/// The dot products of a declaration, and the registry's `dot_row_q8` entry.
pub fn dots(d: &Decl, value: &TExpr) -> (TokenStream, TokenStream) {
    if d.block == 1 {
        return (dot_single(d, value), quote!(None));
    }
    let f = factor(value);
    let scales = sub_scales(d, &f);
    let exact = dot_exact(d, &f);
    match dot_q8(d, &f) {
        Some(fast) => (quote!(#scales #exact #fast), quote!(Some(dot_row_q8))),
        None => (quote!(#scales #exact), quote!(None)),
    }
}
