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
    Some(HcPreChain { proj, mix, collapse, w: g.weight_name(pin[1])?.to_string(), scale: g.weight_name(min[1])?.to_string(), base: g.weight_name(min[2])?.to_string(), nh, iters, eps_mix: eps, norm, feeds_shared_expert: false })
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
        for (id, c) in &chains {
            assert!(matches!(g.node(*id).op, Op::RmsNormPlain { .. }), "{}", g.node(*id).label);
            assert_eq!((c.nh, c.iters), (model.hp.hc, model.hp.hc_iters), "{}", g.node(*id).label);
            assert!(c.norm.is_some(), "{}: the sublayer's weighted norm reads the collapse", g.node(*id).label);
        }
    }
}
