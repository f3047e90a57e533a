//! Where a decode step runs a hyper-connection pre chain as one `hc_pre` launch
//! (`ds4_codegen::cuda_hc_pre`): the graph's `RmsNormPlain → MatMul → HcMix` of the
//! streams, and the `HcCollapse` of the same streams with that mix (`model/src/builder.rs`,
//! `hc_mix`). The norm's and the projection's values are read by nothing else, so they
//! are never made; the mix (which the block's `HcExpand` reads later) and the collapse
//! are made by the one launch, and the collapse's weighted RMS norm where it is the
//! collapse's only reader.

use ds4_ir::{Graph, NodeId, Op};

/// A chain found at its norm node.
pub struct HcPreChain {
    /// The streams the chain reads (its norm reads a reshape of them).
    pub streams: NodeId,
    pub proj: NodeId,
    pub mix: NodeId,
    pub collapse: NodeId,
    /// The projection's weight, and the mix's scale and base vectors.
    pub w: String,
    pub scale: String,
    pub base: String,
    pub nh: usize,
    pub iters: usize,
    pub eps_mix: f32,
    /// The collapse's only reader when it is a weighted RMS norm: its node, weight, eps.
    pub norm: Option<(NodeId, String, f32)>,
    /// The router's mat-vec of that norm, where the routing after it runs as one launch
    /// (`router.rs`): the mat-vec node, the scores node that is its only reader, and its
    /// weight. Its logits are linear in the streams, so the launch can make their parts
    /// (`cuda_hc_pre::router_blocks`) and the routing add them up.
    pub router: Option<(NodeId, NodeId, String)>,
    /// Whether that norm feeds the shared expert's side branch (the FFN's chain: its
    /// Sinkhorn goes to that lane's head), set by the plan once the branches are known.
    pub feeds_shared_expert: bool,
}

/// The chain that starts at `norm`, if the graph has one there: a plain RMS norm of a
/// reshape of the streams `r`, read only by a mat-vec, read only by a mix, which a
/// collapse of `r` reads. None of the skipped values is a graph output.
pub fn chain_at(g: &Graph, norm: NodeId) -> Option<HcPreChain> {
    let only = |id: NodeId| g.only_reader(id);
    if !matches!(g.node(norm).op, Op::RmsNormPlain { .. }) {
        return None;
    }
    let flat = g.inputs(norm)[0];
    let Op::Reshape { .. } = g.node(flat).op else { return None };
    let r = g.inputs(flat)[0];
    let proj = only(norm)?;
    let pin = g.inputs(proj);
    if !matches!(g.node(proj).op, Op::MatMul) || pin[0] != norm {
        return None;
    }
    let mix = only(proj)?;
    let min = g.inputs(mix);
    let Op::HcMix { nh, iters, eps } = g.node(mix).op else { return None };
    if min[0] != proj {
        return None;
    }
    let collapse = g.consumers(mix).into_iter().find(|&c| matches!(g.node(c).op, Op::HcCollapse { nh: n } if n == nh) && g.inputs(c) == [r, mix])?;
    let norm = only(collapse).and_then(|a| match g.node(a).op {
        Op::RmsNorm { eps } if g.inputs(a)[0] == collapse => Some((a, g.weight_name(g.inputs(a)[1])?.to_string(), eps)),
        _ => None,
    });
    let router = norm.as_ref().and_then(|(a, _, _)| router_of(g, *a));
    Some(HcPreChain { streams: r, proj, mix, collapse, w: g.weight_name(pin[1])?.to_string(), scale: g.weight_name(min[1])?.to_string(), base: g.weight_name(min[2])?.to_string(), nh, iters, eps_mix: eps, norm, router, feeds_shared_expert: false })
}

/// The router mat-vec that reads norm `a` (its x), read only by scores that start a routing
/// chain (`router::chain_at`): (mat-vec, scores, weight). Neither is a graph output.
fn router_of(g: &Graph, a: NodeId) -> Option<(NodeId, NodeId, String)> {
    g.consumers(a).into_iter().find_map(|m| {
        let ins = g.inputs(m);
        if !matches!(g.node(m).op, Op::MatMul) || ins[0] != a || g.is_output(m) {
            return None;
        }
        let scores = g.only_reader(m)?;
        super::router::chain_at(g, scores)?;
        Some((m, scores, g.weight_name(ins[1])?.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the tiny golden model: a chain at each layer's two pre chains (before the
    /// attention and before the FFN), each with the model's streams and Sinkhorn iterations
    /// and the sublayer's weighted norm, and at no other plain norm.
    #[test]
    fn tiny_model_chains_before_every_sublayer() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let chains: Vec<_> = g.order().into_iter().filter_map(|id| chain_at(g, id).map(|c| (id, c))).collect();
        assert_eq!(chains.len(), 2 * model.hp.n_layer, "two pre chains a layer");
        let mut routers = 0;
        for (id, c) in &chains {
            assert!(matches!(g.node(*id).op, Op::RmsNormPlain { .. }), "{}", g.node(*id).label);
            assert_eq!((c.nh, c.iters), (model.hp.hc, model.hp.hc_iters), "{}", g.node(*id).label);
            assert!(c.norm.is_some(), "{}: the sublayer's weighted norm reads the collapse", g.node(*id).label);
            // The FFN's chain of a layer routed by score has the router's mat-vec of its
            // norm; the attention's and the hash-routed layers' have none.
            if let Some((m, scores, w)) = &c.router {
                assert_eq!(g.inputs(*m)[0], c.norm.as_ref().unwrap().0);
                assert!(matches!(g.node(*scores).op, Op::RouterScores) && super::super::router::chain_at(g, *scores).is_some());
                assert!(w.ends_with("ffn_gate_inp.weight"), "{}: router weight {w}", g.node(*id).label);
                routers += 1;
            }
        }
        assert_eq!(routers, model.hp.n_layer - model.hp.n_hash, "a router part in every layer routed by score");
    }
}
