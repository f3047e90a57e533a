//! Weight bytes one decode step reads: the numerator of the bandwidth roofline that
//! `ds4 bench` reports (decode tokens/s ≤ copy bandwidth / these bytes).
//!
//! Every weight a step uses is read once, except the token embedding (one row) and the
//! routed experts (only the picked `k` of `E`: a fused MoE reads no other expert's bytes).

use crate::weights::Weights;
use ds4_ir::{Graph, Op};
use std::collections::HashMap;

/// Bytes of weights read to decode one token with `graph` (use the last-token graph), each
/// weight at its file's size.
pub fn decode_weight_bytes(graph: &Graph, weights: &Weights) -> u64 {
    decode_weight_bytes_stored(graph, weights, |_| None)
}

/// [`decode_weight_bytes`] with each weight at the size a backend stores it in where
/// `stored` knows it (a device layout: the CUDA backend holds IQ2_XXS as IQ2_XXS_R, 72
/// bytes a block where the file has 66), else its file's.
pub fn decode_weight_bytes_stored(graph: &Graph, weights: &Weights, stored: impl Fn(&str) -> Option<usize>) -> u64 {
    // Per weight name, the fraction of it read (the largest any use needs).
    let mut frac: HashMap<String, f64> = HashMap::new();
    let name_of = |id| match &graph.node(id).op {
        Op::Weight { name, .. } => Some(name.clone()),
        _ => None,
    };
    let last_dim = |id| match graph.node(id).ty.shape.last() {
        Some(ds4_ir::Dim::Const(n)) => n as f64,
        _ => 1.0,
    };
    for id in graph.order() {
        let ins = graph.inputs(id);
        let partial: Vec<(usize, f64)> = match &graph.node(id).op {
            Op::Embed => {
                let rows = weights.get(name_of(ins[1]).as_deref().unwrap_or("")).map_or(1.0, |w| w.ne.get(1).copied().unwrap_or(1) as f64);
                vec![(1, 1.0 / rows)]
            }
            Op::MoeExperts { .. } => {
                let experts = weights.get(name_of(ins[3]).as_deref().unwrap_or("")).map_or(1.0, |w| w.ne.get(2).copied().unwrap_or(1) as f64);
                let k = last_dim(ins[1]);
                vec![(3, k / experts), (4, k / experts), (5, k / experts)]
            }
            _ => Vec::new(),
        };
        for (i, &input) in ins.iter().enumerate() {
            if let Some(n) = name_of(input) {
                let f = partial.iter().find(|(j, _)| *j == i).map_or(1.0, |p| p.1);
                let e = frac.entry(n).or_insert(0.0);
                *e = e.max(f);
            }
        }
    }
    frac.iter().map(|(n, f)| weights.get(n).map_or(0.0, |w| stored(n).unwrap_or(w.bytes.len()) as f64 * f)).sum::<f64>() as u64
}
