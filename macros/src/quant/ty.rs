//! Scalar types of the de-quantization language, as the macro sees them. Mirrors
//! `ds4_ir::quant::Ty` (the macro crate cannot depend on ds4-ir) and knows how each type
//! is spelled in the generated Rust and in the emitted IR.

use proc_macro2::TokenStream;
use quote::quote;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    F16,
    F32,
}

impl Ty {
    pub fn from_name(s: &str) -> Option<Ty> {
        Some(match s {
            "bool" => Ty::Bool,
            "u8" => Ty::U8,
            "i8" => Ty::I8,
            "u16" => Ty::U16,
            "i16" => Ty::I16,
            "u32" => Ty::U32,
            "i32" => Ty::I32,
            "u64" => Ty::U64,
            "f16" => Ty::F16,
            "f32" => Ty::F32,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::U8 => "u8",
            Ty::I8 => "i8",
            Ty::U16 => "u16",
            Ty::I16 => "i16",
            Ty::U32 => "u32",
            Ty::I32 => "i32",
            Ty::U64 => "u64",
            Ty::F16 => "f16",
            Ty::F32 => "f32",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Ty::Bool | Ty::U8 | Ty::I8 => 1,
            Ty::U16 | Ty::I16 | Ty::F16 => 2,
            Ty::U32 | Ty::I32 | Ty::F32 => 4,
            Ty::U64 => 8,
        }
    }

    pub fn bits(self) -> u32 {
        self.bytes() as u32 * 8
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            Ty::U8 | Ty::I8 | Ty::U16 | Ty::I16 | Ty::U32 | Ty::I32 | Ty::U64
        )
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Ty::I8 | Ty::I16 | Ty::I32)
    }

    /// Smallest and largest value of an integer (or bool) type.
    pub fn int_range(self) -> (i128, i128) {
        match self {
            Ty::Bool => (0, 1),
            t if t.is_signed() => (-(1i128 << (t.bits() - 1)), (1i128 << (t.bits() - 1)) - 1),
            t => (0, (1i128 << t.bits()) - 1),
        }
    }

    /// The Rust type holding a value of this type in generated CPU code. f16 values are
    /// carried as their u16 bits and converted with `rt::f16_to_f32`.
    pub fn rust(self) -> TokenStream {
        match self {
            Ty::F16 => quote!(u16),
            t => {
                let id = quote::format_ident!("{}", t.name());
                quote!(#id)
            }
        }
    }

    /// The Rust type of a field of this type in the quantizer's `Block` struct.
    pub fn rust_field(self) -> TokenStream {
        match self {
            Ty::F16 => quote!(ds4_ir::quant::rt::f16),
            t => t.rust(),
        }
    }

    /// `ds4_ir::quant::Ty::…`
    pub fn ir(self) -> TokenStream {
        let v = quote::format_ident!(
            "{}",
            match self {
                Ty::Bool => "Bool",
                Ty::U8 => "U8",
                Ty::I8 => "I8",
                Ty::U16 => "U16",
                Ty::I16 => "I16",
                Ty::U32 => "U32",
                Ty::I32 => "I32",
                Ty::U64 => "U64",
                Ty::F16 => "F16",
                Ty::F32 => "F32",
            }
        );
        quote!(ds4_ir::quant::Ty::#v)
    }
}
