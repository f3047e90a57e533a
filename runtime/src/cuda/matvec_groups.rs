//! Mat-vecs that read the same x, launched as one at decode.
//!
//! Several of a layer's matmuls read the same activation row: the attention's `q_a` and
//! `kv` (and the compressors' and the indexer's kv and gate projections) read the
//! attention norm's output, the shared expert's gate and up read the FFN norm's. At
//! decode each is a mat-vec of a few µs, most of it the launch's ramp and tail. The
//! upload puts the weights of such a group back to back (`placement.rs`), and the
//! executor then runs the group's mat-vecs as one launch over all their rows, each
//! node's output a view of the launch's (`exec/matvec.rs`, `matmul_node`).

use ds4_ir::{GgmlType, Graph, NodeId, Op};

/// The groups of weights to place back to back, by name: the weights of MatMul nodes
/// that read the same node, of the same type and row length (`type_of` gives a weight's
/// type and row length, None for a weight not on the device), in graph order; groups of
/// one are left out.
pub fn weight_groups(g: &Graph, type_of: &dyn Fn(&str) -> Option<(GgmlType, u64)>) -> Vec<Vec<String>> {
    let mut groups: Vec<((NodeId, GgmlType, u64), Vec<String>)> = Vec::new();
    for id in g.order() {
        if !matches!(g.node(id).op, Op::MatMul) {
            continue;
        }
        let ins = g.inputs(id);
        let Op::Weight { name, .. } = &g.node(ins[1]).op else { continue };
        let Some((ty, k)) = type_of(name) else { continue };
        let key = (ins[0], ty, k);
        match groups.iter_mut().find(|(k2, _)| *k2 == key) {
            Some((_, names)) if !names.contains(name) => names.push(name.clone()),
            Some(_) => {}
            None => groups.push((key, vec![name.clone()])),
        }
    }
    groups.into_iter().map(|(_, names)| names).filter(|names| names.len() > 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny golden model's groups: per layer, the attention's Q8_0 `q_a` and `kv`, its
    /// F16 compressor projections, and the shared expert's gate and up.
    #[test]
    fn tiny_model_groups_share_their_input() {
        let model = crate::cuda::tiny_q2();
        let w = &model.weights;
        let groups = weight_groups(&model.graph, &|n| w.get(n).map(|v| (v.ty, v.ne[0])));
        let has = |a: &str, b: &str| groups.iter().any(|gr| gr.iter().any(|n| n == a) && gr.iter().any(|n| n == b));
        assert!(has("blk.0.attn_q_a.weight", "blk.0.attn_kv.weight"), "{groups:?}");
        assert!(has("blk.0.ffn_gate_shexp.weight", "blk.0.ffn_up_shexp.weight"), "{groups:?}");
        // Different inputs are never grouped: q_b reads q_a's output.
        assert!(!has("blk.0.attn_q_a.weight", "blk.0.attn_q_b.weight"));
        for gr in &groups {
            let t: Vec<_> = gr.iter().map(|n| (w.get(n).unwrap().ty, w.get(n).unwrap().ne[0])).collect();
            assert!(t.windows(2).all(|p| p[0] == p[1]), "{gr:?}: {t:?}");
        }
    }
}
