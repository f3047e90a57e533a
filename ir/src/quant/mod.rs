//! Quant types: GGML block formats, each declared once.
//!
//! A quant type is one file here with one `quant_type!` invocation: the GGML type, the
//! block size, the block's byte layout, and the de-quantization of one element as an
//! expression (plus, optionally, a quantizer). From it the macro derives
//! - `SPEC`, a [`QuantSpec`]: layout + expression tree, for the GPU code generators;
//! - the CPU code: `dequantize_block`, the fused dot products (exact: `dot_row`, f32
//!   activations; fast: `dot_row_q8`, int8 activations, where the element term is a small
//!   integer), row functions, and the quantizer's `Block` struct. The dot products exist
//!   in two variants from the same source, the baseline target's and x86-64 AVX2 + FMA,
//!   picked at run time;
//! - `CPU`, the entry the registry below collects.
//!
//! The fast path (`quantize_activations`, `dot_row_fast`) is described in `acts`.
//!
//! There is no other per-type code: adding a type is one file and one registry line
//! (see docs/adding-a-quant-type.md).

pub mod eval;
pub mod expr;
pub mod fit;
pub mod rt;
pub mod spec;
pub mod values;

mod acts;
mod api;

pub use acts::{dot_row_fast, has_fast_kernel, quantize_activations, simd_level, QuantActs};
pub use api::{
    can_quantize, cpu, dequantize_row, dot_row, iq2_xxs_r_sign_bit, quantize_row, regroup_iq2_xxs, regroup_q8_0, regrouped_from, spec, supported, QuantError,
    Regroup,
};
pub use expr::{BinOp, Expr, Level, Ty, UnOp};
pub use spec::{Field, Let, QuantSpec, Table, TableData};

/// Declares the type modules and collects their registry entries, in order.
macro_rules! registry {
    ($($m:ident),* $(,)?) => {
        $(mod $m;)*
        static REGISTRY: &[&rt::CpuQuant] = &[$(&$m::CPU),*];
        static SUPPORTED: &[crate::GgmlType] = &[$($m::GGML),*];
    };
}

// The registry: one line per type (file `<line>.rs`). The modules are private: everything
// else reaches a type through the functions above, by `GgmlType`.
registry! {
    f32,
    f16,
    bf16,
    q8_0,
    q4_k,
    q2_k,
    iq2_xxs,
    q6_k,
    mxfp4,
    q8_0_r,
    iq2_xxs_r,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_agree_with_the_ggml_table() {
        for &t in supported() {
            let s = spec(t).unwrap();
            assert_eq!(s.ggml, t);
            assert_eq!(s.block_elems, t.block_elems(), "{t}");
            assert_eq!(s.block_bytes, t.block_bytes(), "{t}");
            assert_eq!(s.block_elems % s.sub_block, 0, "{t}");
        }
        let mut seen = supported().to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), supported().len(), "a type is registered twice");
    }

    #[test]
    fn specs_print_as_their_declaration() {
        let text = spec(crate::GgmlType::Q8_0).unwrap().to_string();
        assert!(text.contains("qs: [i8; 32] @ 2"), "{text}");
        assert!(text.contains("value = ((qs[j] as f32) * d32)"), "{text}");
    }
}
