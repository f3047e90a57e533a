//! Why a CUDA decode step reads no expert ids back to check them (the CPU executor checks
//! every batch's): each MoE node's picks come either from a top-k over at most as many
//! scores as there are experts (ids below that by construction; top_k's -1, a missing
//! pick, the mat-vec skips), or from a hash-routing table, every entry of which is
//! checked here once, when the backend loads the weights.

use super::device::CudaError;
use crate::weights::Weights;
use ds4_ir::{Dim, Graph, Op};

/// Fails on a hash-routing entry that is not an expert of the MoE node it feeds (a corrupt
/// file), or on picks from anything but a top-k or a hash table.
pub fn check_expert_sources(graph: &Graph, weights: &Weights) -> Result<(), CudaError> {
    let konst = |d: Option<&Dim>| match d {
        Some(Dim::Const(n)) => Some(*n),
        _ => None,
    };
    for id in graph.order() {
        let node = graph.node(id);
        let Op::MoeExperts { .. } = node.op else { continue };
        let ins = graph.inputs(id);
        // gate [E, F, D]
        let n_exp = konst(graph.node(ins[3]).ty.shape.0.first()).ok_or_else(|| CudaError(format!("{}: expert count is not a constant", node.label)))?;
        let picks = graph.node(ins[1]);
        let pick_ins = graph.inputs(ins[1]);
        match &picks.op {
            Op::TopK { .. } => {
                let n = konst(graph.node(pick_ins[0]).ty.shape.0.last());
                if n.is_none_or(|n| n > n_exp) {
                    return Err(CudaError(format!("{}: top-k over {n:?} scores for {n_exp} experts", node.label)));
                }
            }
            Op::RouterHash { .. } => {
                let Op::Weight { name, .. } = &graph.node(pick_ins[1]).op else {
                    return Err(CudaError(format!("{}: the hash table is not a weight", picks.label)));
                };
                let table = weights.get(name).ok_or_else(|| CudaError(format!("weight {name} is not in the model file")))?;
                if let Some((i, e)) = table.to_i32().into_iter().enumerate().find(|&(_, e)| e < 0 || e as usize >= n_exp) {
                    return Err(CudaError(format!("{name}: entry {i} is expert {e}, outside 0..{n_exp} (a corrupt file)")));
                }
            }
            other => return Err(CudaError(format!("{}: expert ids from {}: the CUDA backend takes them from top_k or router_hash only", node.label, other.name()))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;
    use ds4_model::gguf::GgufFile;
    use ds4_model::synthetic::{build, SynthConfig};

    /// The embedded tiny model (two hash layers) with entry `at` of layer 1's table set to `e`.
    fn model_with_entry(at: usize, e: i32) -> Model {
        let mut bytes = build(&SynthConfig::tiny_default()).unwrap();
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        let t = file.tensor("blk.1.ffn_gate_tid2eid.weight").unwrap();
        let off = file.tensor_data(t).as_ptr() as usize - file.bytes().as_ptr() as usize + 4 * at;
        bytes[off..off + 4].copy_from_slice(&e.to_le_bytes());
        Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap()
    }

    #[test]
    fn hash_tables_are_checked_once_at_load() {
        let good = model_with_entry(0, 7);
        for g in [&good.graph, &good.graph_plain, &good.graph_last] {
            check_expert_sources(g, &good.weights).unwrap();
        }
        for bad in [8, -1] {
            let m = model_with_entry(1234, bad);
            let e = check_expert_sources(&m.graph, &m.weights).unwrap_err().to_string();
            assert!(e.contains(&format!("blk.1.ffn_gate_tid2eid.weight: entry 1234 is expert {bad}, outside 0..8")), "{e}");
        }
    }
}
