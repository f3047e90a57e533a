//! Element types: the float types, integer types and GGML quant types a tensor can have.
//!
//! GGML type ids and block geometry are llama.cpp's (the GGUF file format stores them).
//! A quant type is a first-class dtype: the graph knows that a weight is Q8_0, and
//! kernels are chosen (and generated) per type.

use std::fmt;

/// GGML tensor types as stored in GGUF files. Only the ids matter on disk; the names are
/// llama.cpp's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
    /// Not a GGUF type: Q8_0 rows regrouped for devices that read weights straight from
    /// global memory (`quant/q8_0_r.rs`). Never read from a file.
    Q8_0R,
    /// Not a GGUF type: IQ2_XXS regrouped for the CUDA experts' integer mat-vec
    /// (`quant/iq2_xxs_r.rs`): 8-byte aligned words, each sign's parity stored. Never read
    /// from a file.
    Iq2XxsR,
}

/// (type, ggml id, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "IQ2_XXS", 256, 66),
    (GgmlType::Iq2Xs, 17, "IQ2_XS", 256, 74),
    (GgmlType::Iq3Xxs, 18, "IQ3_XXS", 256, 98),
    (GgmlType::Iq1S, 19, "IQ1_S", 256, 50),
    (GgmlType::Iq4Nl, 20, "IQ4_NL", 32, 18),
    (GgmlType::Iq3S, 21, "IQ3_S", 256, 110),
    (GgmlType::Iq2S, 22, "IQ2_S", 256, 82),
    (GgmlType::Iq4Xs, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::Iq1M, 29, "IQ1_M", 256, 56),
    (GgmlType::Bf16, 30, "BF16", 1, 2),
    (GgmlType::Tq1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "MXFP4", 32, 17),
    // Device layouts: ids past GGML's, which a file's tensor may not name (`from_id`).
    (GgmlType::Q8_0R, DEVICE_IDS, "Q8_0_R", 64, 68),
    (GgmlType::Iq2XxsR, DEVICE_IDS + 1, "IQ2_XXS_R", 256, 72),
];

/// The first id of the device-only layouts (none of them is a GGML type).
const DEVICE_IDS: u32 = 0x4000_0000;

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE.iter().find(|r| r.0 == self).expect("every GgmlType is in TABLE")
    }
    /// The type for a GGML id, or None for an id this build does not know (device-only
    /// layouts are not GGML types: a file cannot name them).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id && id < DEVICE_IDS).map(|r| r.0)
    }
    /// A layout ds4 makes on a device, never found in a GGUF file.
    pub fn is_device_layout(self) -> bool {
        self.row().1 >= DEVICE_IDS
    }
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.2.eq_ignore_ascii_case(name)).map(|r| r.0)
    }
    pub fn id(self) -> u32 {
        self.row().1
    }
    pub fn name(self) -> &'static str {
        self.row().2
    }
    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> usize {
        self.row().3
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }
    /// Bytes for `n` elements, or None when `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dtype of a graph tensor: activations are F32 (or I32 for ids); weights may be any
/// GGML type, quant types included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    I32,
    /// A weight stored in a GGML type (F32, F16, BF16, Q8_0, ...).
    Weight(GgmlType),
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::F32 => f.write_str("f32"),
            DType::I32 => f.write_str("i32"),
            DType::Weight(t) => write!(f, "weight<{t}>"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ids_round_trip() {
        for r in TABLE.iter().filter(|r| !r.0.is_device_layout()) {
            assert_eq!(GgmlType::from_id(r.1), Some(r.0));
            assert_eq!(GgmlType::from_name(r.2), Some(r.0));
        }
        assert_eq!(GgmlType::from_id(1000), None);
        assert_eq!(GgmlType::from_id(GgmlType::Q8_0R.id()), None, "a device layout is not a file type");
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
    }
}
