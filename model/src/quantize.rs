//! `ds4 quantize`: convert an F32/F16/BF16 DS4 GGUF to the real files' type layouts.
//!
//! - `q2`: routed experts gate/up IQ2_XXS, down Q2_K;
//! - `q4`: routed experts Q4_K;
//! - both: attention, shared experts, output and the MTP projections Q8_0; embeddings,
//!   hyper-connection, compressor, indexer and router matrices F16; norms, biases, scales
//!   and sinks F32; the hash table stays I32 (as in real DS4 files);
//! - `q8_0`: every matrix Q8_0 (the I32 table, the 1-D tensors and the compressors'
//!   position biases as they are).
//!
//! The plan is made and checked for every tensor before a byte is written, so a shape the
//! target type cannot hold is refused up front, naming the tensor. Tensors are then
//! converted one at a time and streamed out (the model is never held twice in memory).

use crate::gguf::{GgufError, GgufFile, MetaValue};
use crate::gguf_writer::GgufWriter;
use ds4_ir::{quant, GgmlType};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    Q2,
    Q4,
    Q8_0,
}

impl Recipe {
    pub fn parse(s: &str) -> Option<Recipe> {
        match s {
            "q2" => Some(Recipe::Q2),
            "q4" => Some(Recipe::Q4),
            "q8_0" => Some(Recipe::Q8_0),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Recipe::Q2 => "q2",
            Recipe::Q4 => "q4",
            Recipe::Q8_0 => "q8_0",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("tensor '{name}': {problem}")]
    Tensor { name: String, problem: String },
}

/// What one tensor became and how far it moved.
#[derive(Clone, Debug)]
pub struct TensorReport {
    pub name: String,
    pub from: GgmlType,
    pub to: GgmlType,
    /// RMS of (quantized - source) over RMS of source; 0 for copied tensors.
    pub rel_rmse: f64,
}

/// The type `recipe` gives tensor `name` (ne = `dims`) stored as `src`.
pub fn target_type(recipe: Recipe, name: &str, src: GgmlType, dims: &[u64]) -> GgmlType {
    if src == GgmlType::I32 || dims.len() < 2 {
        return if src == GgmlType::I32 { src } else { GgmlType::F32 };
    }
    let base = name.rsplit_once(".weight").map(|(b, _)| b).unwrap_or(name);
    let stem = base.rsplit('.').next().unwrap_or(base);
    // Position biases are added to activations, not multiplied: they stay float.
    if stem.ends_with("_ape") {
        return GgmlType::F16;
    }
    if recipe == Recipe::Q8_0 {
        return GgmlType::Q8_0;
    }
    match stem {
        "ffn_gate_exps" | "ffn_up_exps" => {
            if recipe == Recipe::Q2 {
                GgmlType::Iq2Xxs
            } else {
                GgmlType::Q4K
            }
        }
        "ffn_down_exps" => {
            if recipe == Recipe::Q2 {
                GgmlType::Q2K
            } else {
                GgmlType::Q4K
            }
        }
        "attn_q_a" | "attn_q_b" | "attn_kv" | "attn_output_a" | "attn_output_b" | "ffn_gate_shexp" | "ffn_up_shexp" | "ffn_down_shexp" | "output" | "e_proj" | "h_proj" => GgmlType::Q8_0,
        _ => GgmlType::F16,
    }
}

fn bad(name: &str, problem: String) -> QuantizeError {
    QuantizeError::Tensor { name: name.to_string(), problem }
}

/// Plan every tensor: (name, source type, target type, dims). Refuses what cannot be done.
pub fn plan(src: &GgufFile, recipe: Recipe) -> Result<Vec<(String, GgmlType, GgmlType, Vec<u64>)>, QuantizeError> {
    let mut out = Vec::new();
    for t in &src.tensors {
        let from = t.ggml_type;
        if !matches!(from, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::I32) {
            return Err(bad(&t.name, format!("is {from}; quantize from an F32, F16 or BF16 file")));
        }
        let to = target_type(recipe, &t.name, from, &t.dims);
        if to != from && to != GgmlType::I32 {
            if !quant::can_quantize(to) {
                return Err(bad(&t.name, format!("this build cannot quantize to {to}")));
            }
            let ne0 = t.dims.first().copied().unwrap_or(1);
            if ne0 % to.block_elems() as u64 != 0 {
                return Err(bad(&t.name, format!("row length ne[0] = {ne0} is not a multiple of the {to} block size {}", to.block_elems())));
            }
        }
        out.push((t.name.clone(), from, to, t.dims.clone()));
    }
    Ok(out)
}

/// Convert `src` with `recipe` into `out`. `progress(done, total, name)` is called before
/// each tensor.
pub fn quantize_file(src: &GgufFile, recipe: Recipe, out: &Path, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<Vec<TensorReport>, QuantizeError> {
    let plan = plan(src, recipe)?;
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        if k == "general.alignment" {
            continue;
        }
        w.add_meta(k.clone(), v.clone())?;
    }
    w.add_meta("general.quantization_recipe", MetaValue::Str(recipe.name().into()))?;
    for (name, _, to, dims) in &plan {
        w.add_tensor_deferred(name.clone(), *to, dims)?;
    }
    let mut reports = Vec::with_capacity(plan.len());
    let total = plan.len();
    let mut i = 0;
    let mut err: Option<QuantizeError> = None;
    w.write_streaming(out, |spec, sink| {
        let (name, from, to, dims) = &plan[i];
        debug_assert_eq!(&spec.name, name);
        progress(i, total, name);
        i += 1;
        let t = src.tensor(name).expect("planned from this file");
        let data = src.tensor_data(t);
        if from == to {
            reports.push(TensorReport { name: name.clone(), from: *from, to: *to, rel_rmse: 0.0 });
            return sink.write_all(data);
        }
        let row = dims.first().copied().unwrap_or(1) as usize;
        let rows = (t.n_elements() as usize) / row.max(1);
        let mut x = vec![0f32; row];
        let mut back = vec![0f32; row];
        let rb = to.bytes_for(row as u64).expect("checked in the plan") as usize;
        let mut q = vec![0u8; rb];
        let src_rb = from.bytes_for(row as u64).expect("source sizes checked by the reader") as usize;
        let (mut num, mut den) = (0f64, 0f64);
        for r in 0..rows {
            let res = quant::dequantize_row(*from, &data[r * src_rb..(r + 1) * src_rb], &mut x)
                .and_then(|_| quant::quantize_row(*to, &x, &mut q))
                .and_then(|_| quant::dequantize_row(*to, &q, &mut back));
            if let Err(e) = res {
                err = Some(bad(name, e.to_string()));
                return Err(std::io::Error::other("quantization failed"));
            }
            for (a, b) in x.iter().zip(&back) {
                num += ((a - b) as f64).powi(2);
                den += (*a as f64).powi(2);
            }
            sink.write_all(&q)?;
        }
        reports.push(TensorReport { name: name.clone(), from: *from, to: *to, rel_rmse: (num / den.max(1e-300)).sqrt() });
        Ok(())
    })
    .map_err(|e| err.take().unwrap_or(QuantizeError::Gguf(e)))?;
    progress(total, total, "");
    Ok(reports)
}
