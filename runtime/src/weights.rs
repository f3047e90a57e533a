//! Weights: views into the model file's tensor data (mmap or in-memory), in their GGUF
//! types. Nothing is converted up front; matmuls read quantized rows directly.

use ds4_ir::quant::QuantActs;
use ds4_ir::{GgmlType, Real};
use ds4_model::gguf::GgufFile;
use std::sync::Arc;

#[derive(Clone)]
pub struct Weights {
    pub file: Arc<GgufFile>,
}

/// One tensor: type, GGUF dims (ne order) and its bytes.
#[derive(Clone, Copy)]
pub struct WeightView<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub ne: &'a [u64],
    pub bytes: &'a [u8],
}

impl Weights {
    pub fn new(file: Arc<GgufFile>) -> Weights {
        Weights { file }
    }

    pub fn get<'a>(&'a self, name: &'a str) -> Option<WeightView<'a>> {
        let t = self.file.tensor(name)?;
        Some(WeightView { name, ty: t.ggml_type, ne: &t.dims, bytes: self.file.tensor_data(t) })
    }
}

impl<'a> WeightView<'a> {
    /// Bytes of one row of `k` elements.
    pub fn row_bytes(&self, k: usize) -> usize {
        self.ty.bytes_for(k as u64).expect("row length checked by the graph builder") as usize
    }

    /// Row `i` of a matrix whose rows have `k` elements.
    pub fn row(&self, i: usize, k: usize) -> &'a [u8] {
        let rb = self.row_bytes(k);
        &self.bytes[i * rb..(i + 1) * rb]
    }

    /// The whole tensor as floats (small tensors: norms, biases, scales).
    pub fn to_vec<F: Real>(&self) -> Vec<F> {
        let n: u64 = self.ne.iter().product();
        let mut tmp = vec![0f32; n as usize];
        ds4_ir::quant::dequantize_row(self.ty, self.bytes, &mut tmp).expect("tensor size checked by the loader");
        tmp.into_iter().map(F::from_f32).collect()
    }

    /// The whole tensor as i32 (the hash-routing table).
    pub fn to_i32(&self) -> Vec<i32> {
        self.bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

/// How a float type reads weight rows: f32 uses the quant types' fused dot products;
/// the f64 reference de-quantizes a row and accumulates in f64.
pub trait Compute: Real {
    fn dot_weight_row(ty: GgmlType, row: &[u8], x: &[Self]) -> Self;
    fn dequant_row(ty: GgmlType, row: &[u8], out: &mut [Self]);

    /// The fast path (`SessionOptions::fast`): an activation row quantized for
    /// `dot_weight_row_fast`, or None where this float type has no fast path (the f64
    /// reference), and the caller uses `dot_weight_row`.
    fn prepare_fast(_x: &[Self]) -> Option<QuantActs> {
        None
    }
    fn dot_weight_row_fast(ty: GgmlType, row: &[u8], a: &QuantActs) -> Self {
        Self::from_f32(ds4_ir::quant::dot_row_fast(ty, row, a).expect("row length checked by the graph builder"))
    }
}

impl Compute for f32 {
    #[inline]
    fn dot_weight_row(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
        ds4_ir::quant::dot_row(ty, row, x).expect("row length checked by the graph builder")
    }
    fn dequant_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
        ds4_ir::quant::dequantize_row(ty, row, out).expect("row length checked by the graph builder")
    }
    fn prepare_fast(x: &[f32]) -> Option<QuantActs> {
        Some(ds4_ir::quant::quantize_activations(x))
    }
}

impl Compute for f64 {
    fn dot_weight_row(ty: GgmlType, row: &[u8], x: &[f64]) -> f64 {
        let mut tmp = vec![0f32; x.len()];
        ds4_ir::quant::dequantize_row(ty, row, &mut tmp).expect("row length checked by the graph builder");
        tmp.iter().zip(x).map(|(&w, &v)| w as f64 * v).sum()
    }
    fn dequant_row(ty: GgmlType, row: &[u8], out: &mut [f64]) {
        let mut tmp = vec![0f32; out.len()];
        ds4_ir::quant::dequantize_row(ty, row, &mut tmp).expect("row length checked by the graph builder");
        for (o, v) in out.iter_mut().zip(tmp) {
            *o = v as f64;
        }
    }
}
