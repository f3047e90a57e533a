//! Where a row's RMS norm, RoPE and FP8 round trip run as one `norm_rope` launch
//! (`ds4_codegen::cuda_norm_rope`): the graph's `RmsNorm | RmsNormPlain → (Reshape)* →
//! Rope`, and the `(Reshape)* → Fp8RoundTrip` after the RoPE where there is one
//! (`model/src/builder.rs`: the query heads, the KV row, the compressors' rows). Every value
//! between the norm and the chain's last node is read only by the next node and is not a
//! graph output, so only the last one is made.

use ds4_ir::{Graph, NodeId, Op};

/// A chain found at its norm node.
pub struct NormRopeChain {
    /// The norm's weight (`RmsNorm`), or none (`RmsNormPlain`).
    pub weight: Option<NodeId>,
    pub eps: f32,
    /// The RoPE node (its op has the rotation's parameters).
    pub rope: NodeId,
    /// The round trip's `n_nope`, where the chain ends with one.
    pub fp8: Option<usize>,
    /// The nodes after the norm that the launch skips (never made), in order.
    pub skipped: Vec<NodeId>,
    /// The chain's last node: the launch makes its value.
    pub last: NodeId,
}

/// The chain that starts at `norm`, if the graph has one there.
pub fn chain_at(g: &Graph, norm: NodeId) -> Option<NormRopeChain> {
    let (weight, eps) = match g.node(norm).op {
        Op::RmsNorm { eps } => (Some(*g.inputs(norm).get(1)?), eps),
        Op::RmsNormPlain { eps } => (None, eps),
        _ => return None,
    };
    let (mut skipped, rope) = past_reshapes(g, norm)?;
    if !matches!(g.node(rope).op, Op::Rope { .. }) {
        return None;
    }
    // Reshapes and a round trip after the RoPE join the chain only together.
    if let Some((after, last)) = past_reshapes(g, rope) {
        if let Op::Fp8RoundTrip { n_nope } = g.node(last).op {
            skipped.push(rope);
            skipped.extend(after);
            return Some(NormRopeChain { weight, eps, rope, fp8: Some(n_nope), skipped, last });
        }
    }
    Some(NormRopeChain { weight, eps, rope, fp8: None, skipped, last: rope })
}

/// The first node past the reshapes that read `from`'s value one after another, and those
/// reshapes: None where a value on the way (`from`'s included) has another reader or is a
/// graph output (`Graph::only_reader`), so that a launch may skip them all.
fn past_reshapes(g: &Graph, from: NodeId) -> Option<(Vec<NodeId>, NodeId)> {
    let (mut reshapes, mut at) = (Vec::new(), from);
    loop {
        let next = g.only_reader(at)?;
        if !matches!(g.node(next).op, Op::Reshape { .. }) {
            return Some((reshapes, next));
        }
        reshapes.push(next);
        at = next;
    }
}

/// A RoPE whose rows go on to a Hadamard transform (`Rope → (Reshape)* → HadamardFp4`,
/// each value read only by the next and not a graph output: the indexer's query heads),
/// run as one `rope_hadamard_fp4` launch (`ds4_codegen::cuda_norm_rope`).
pub struct RopeHadamardChain {
    /// The reshapes between the two (never made).
    pub skipped: Vec<NodeId>,
    /// The transform: the launch makes its value.
    pub hadamard: NodeId,
    pub fp4: bool,
}

/// The chain that starts at RoPE node `rope`, if the graph has one there.
pub fn hadamard_after(g: &Graph, rope: NodeId) -> Option<RopeHadamardChain> {
    if !matches!(g.node(rope).op, Op::Rope { .. }) {
        return None;
    }
    let (skipped, next) = past_reshapes(g, rope)?;
    match g.node(next).op {
        Op::HadamardFp4 { fp4 } => Some(RopeHadamardChain { skipped, hadamard: next, fp4 }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the tiny golden model: a chain at every layer's query-head norm (ending at the
    /// RoPE) and KV norm (ending at the FP8 round trip, the model is DS4-shaped), and at
    /// its compressors' norms; none at any other node. Every skipped node is a reshape or
    /// the RoPE, read only by the chain.
    #[test]
    fn tiny_model_chains_at_the_query_and_kv_norms() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let (mut q, mut kv) = (0, 0);
        for id in g.order() {
            let node = g.node(id);
            let Some(c) = chain_at(g, id) else {
                assert!(!node.label.ends_with(".q.norm") && !node.label.ends_with(".kv.norm"), "{}: no chain", node.label);
                continue;
            };
            assert!(matches!(node.op, Op::RmsNorm { .. } | Op::RmsNormPlain { .. }), "{}", node.label);
            assert!(matches!(g.node(c.rope).op, Op::Rope { inverse: false, .. }), "{}", node.label);
            for &s in &c.skipped {
                assert!(matches!(g.node(s).op, Op::Reshape { .. } | Op::Rope { .. }) && g.consumers(s).len() == 1, "{}: skips {}", node.label, g.node(s).label);
            }
            if node.label.ends_with(".q.norm") {
                assert!(c.weight.is_none() && c.fp8.is_none() && c.last == c.rope && c.skipped.is_empty(), "{}", node.label);
                q += 1;
            } else if node.label.ends_with(".kv.norm") {
                assert!(c.weight.is_some() && c.fp8.is_some() && matches!(g.node(c.last).op, Op::Fp8RoundTrip { .. }), "{}", node.label);
                kv += 1;
            } else {
                assert!(node.label.contains("compressor"), "{}: a chain outside the attention's rows", node.label);
            }
        }
        assert_eq!((q, kv), (model.hp.n_layer, model.hp.n_layer));
    }

    /// On the tiny golden model: a RoPE-Hadamard chain at every CSA layer's indexer query
    /// RoPE (ending at its FP4 Hadamard), and none at a RoPE that a norm chain makes.
    #[test]
    fn tiny_model_chains_the_indexer_query_rope_to_its_hadamard() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let mut found = 0;
        for id in g.order() {
            let Some(c) = hadamard_after(g, id) else { continue };
            assert!(matches!(g.node(c.hadamard).op, Op::HadamardFp4 { fp4: true }), "{}", g.node(id).label);
            assert!(c.skipped.iter().all(|&s| matches!(g.node(s).op, Op::Reshape { .. })));
            let norm_made = g.order().into_iter().any(|n| chain_at(g, n).is_some_and(|nc| nc.rope == id));
            if !norm_made {
                found += 1;
            }
        }
        let csa = model.hp.compress_ratios.iter().filter(|&&r| r == 4).count();
        assert!(csa > 0 && found == csa, "{found} indexer query chains for {csa} CSA layers");
    }
}
