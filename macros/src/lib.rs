//! ds4-macros: the proc macros through which ds4 declares things once and derives the rest.
//!
//! - [`kernel`] / [`kernel_helper`]: a kernel body written once in Rust is also read into
//!   kernel IR (`ds4_ir::kir`) for the GPU renderers.
//! - [`quant_type!`]: a GGML quant type — block layout and de-quantization expression — from
//!   which come its `ds4_ir` description (for GPU code generation) and its CPU code.
//!
//! Expanded code refers to `ds4_ir::…` paths, so it is used inside ds4-ir (which has
//! `extern crate self as ds4_ir;`) or in crates depending on it.
use proc_macro::TokenStream;

mod kernel;
mod quant;

/// `#[kernel(out = "<len>")]` on a kernel body: keeps the function and adds `<name>_kir()`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::kernel(attr.into(), item.into()).into()
}

/// `#[kernel_helper]` on a helper function called from kernel bodies.
#[proc_macro_attribute]
pub fn kernel_helper(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::kernel_helper(attr.into(), item.into()).into()
}

/// Declare a quant type. See `macros/src/quant.rs` for the syntax and
/// `docs/adding-a-quant-type.md` for a walk-through.
#[proc_macro]
pub fn quant_type(input: TokenStream) -> TokenStream {
    quant::expand(input.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}
