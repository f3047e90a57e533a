//! Where a decode step runs a token's MoE routing as one `router_select` launch
//! (`ds4_codegen::cuda_router`): the graph's `RouterScores → RouterBiased → TopK` and the
//! `RouterWeights` of those scores and picks (`model/src/builder.rs`, the routed experts of
//! the non-hash layers). The scores and the biased scores are read by nothing else, so they
//! are never made; the picks and the weights (which the experts read) are made by the one
//! launch.

use ds4_ir::{Graph, NodeId, Op};

/// A chain found at its scores node.
pub struct RouterChain {
    pub biased: NodeId,
    /// The selection bias's weight.
    pub bias: String,
    pub top_k: NodeId,
    pub weights: NodeId,
    pub k: usize,
    pub scale: f32,
    pub normalize: bool,
    /// The routed experts that read the picks and the router's input (their x), where the
    /// graph has them so: the launch may make x's digits for their gate and up.
    pub experts: Option<NodeId>,
}

/// The chain that starts at `scores`, if the graph has one there: scores read only by a
/// biased selection and by the weights; the selection read only by a top k; the weights
/// of those scores and that top k. Neither skipped value is a graph output.
pub fn chain_at(g: &Graph, scores: NodeId) -> Option<RouterChain> {
    if !matches!(g.node(scores).op, Op::RouterScores) || g.is_output(scores) {
        return None;
    }
    let readers = g.consumers(scores);
    let biased = *readers.iter().find(|&&c| matches!(g.node(c).op, Op::RouterBiased))?;
    let weights = *readers.iter().find(|&&c| matches!(g.node(c).op, Op::RouterWeights { .. }))?;
    if readers.len() != 2 || g.inputs(biased)[0] != scores {
        return None;
    }
    let top_k = g.only_reader(biased)?;
    let Op::TopK { k } = g.node(top_k).op else { return None };
    let Op::RouterWeights { scale, normalize } = g.node(weights).op else { return None };
    let bias = g.weight_name(*g.inputs(biased).get(1)?)?.to_string();
    let x = g.inputs(*g.inputs(scores).first()?).first().copied();
    let experts = g.consumers(top_k).into_iter().find(|&c| matches!(g.node(c).op, Op::MoeExperts { .. }) && g.inputs(c).first().copied() == x);
    (g.inputs(weights) == [scores, top_k]).then_some(RouterChain { biased, bias, top_k, weights, k, scale, normalize, experts })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the tiny golden model: a chain at the scores of every layer that routes by score,
    /// with the layer's top k and its own bias, and none at the hash-routed layers (their
    /// scores feed only the weights) or at any other node.
    #[test]
    fn tiny_model_chains_at_the_scored_layers() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let mut found = 0;
        for id in g.order() {
            let node = g.node(id);
            let chain = chain_at(g, id);
            if !matches!(node.op, Op::RouterScores) {
                assert!(chain.is_none(), "{}: a chain at a node that is not router scores", node.label);
                continue;
            }
            let layer: usize = node.label.trim_start_matches("blk.").split('.').next().and_then(|l| l.parse().ok()).unwrap_or_else(|| panic!("{}: no layer", node.label));
            match chain {
                Some(c) => {
                    assert!(layer >= model.hp.n_hash, "{}: a chain at a hash-routed layer", node.label);
                    assert_eq!(c.k, model.hp.n_expert_used, "{}", node.label);
                    assert!(c.bias.starts_with(&format!("blk.{layer}.")), "{}: bias {}", node.label, c.bias);
                    assert!(matches!(g.node(c.top_k).op, Op::TopK { .. }) && matches!(g.node(c.weights).op, Op::RouterWeights { .. }));
                    // The layer's routed experts, reading the router's input.
                    let moe = c.experts.unwrap_or_else(|| panic!("{}: no routed experts", node.label));
                    assert_eq!(g.node(moe).label, format!("blk.{layer}.moe"));
                    assert_eq!(g.inputs(moe)[0], g.inputs(g.inputs(id)[0])[0]);
                    found += 1;
                }
                None => assert!(layer < model.hp.n_hash, "{}: no chain at a scored layer", node.label),
            }
        }
        assert_eq!(found, model.hp.n_layer - model.hp.n_hash);
    }
}
