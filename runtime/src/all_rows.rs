//! An indexer's selection when it is every row.
//!
//! A CSA layer's attention reads the compressed rows its indexer picks: the top k of the
//! rows a query may see, all of them when there are no more than k (ir/src/kernels: `top_k`,
//! -inf scores never chosen; ../shared/spec/DS4_FORWARD.md: "all of them when there are
//! fewer"). Until a session's context passes k · ratio tokens (2048 on DeepSeek-V4-Flash),
//! that is every token's case, and the selection is the causal prefix of the compressed
//! rows: the attention's `COMP_CAUSAL` mode, the same rows in row order rather than in the
//! picks' score order (the softmax adds them in another order; the rows and their weights
//! are the same). A run whose last token sees no more than k rows then skips what only the
//! selection needs: the indexer's query projection, its RoPE and Hadamard, its head weights,
//! the scores and the top k. The indexer's compressor still runs (its rows are state that
//! later steps read), as does everything a graph output or a stateful op needs.
//! `DS4_ALL_ROWS=0` keeps the selection (for measuring and comparing).

use ds4_ir::{Bind, CompMode, Graph, NodeId, Op};
use std::collections::{HashMap, HashSet};

/// The attentions with a selection, and what only their selections need.
#[derive(Default)]
pub struct AllRows {
    /// By attention node: its ratio, its selection's k, the nodes only the selection needs.
    attentions: HashMap<usize, (usize, usize, Vec<NodeId>)>,
}

impl AllRows {
    /// Walks `g`: each attention that reads a top-k selection (`CompMode::Selected`).
    pub fn of(g: &Graph) -> AllRows {
        let mut attentions = HashMap::new();
        for id in g.order() {
            let Op::Attention { ratio, comp: CompMode::Selected, .. } = g.node(id).op else { continue };
            let ins = g.inputs(id);
            let Some(&sel) = ins.get(4) else { continue };
            if let Op::TopK { k } = g.node(sel).op {
                attentions.insert(id.index(), (ratio, k, selection_only(g, id, sel)));
            }
        }
        AllRows { attentions }
    }

    /// Whether attention `attn` sees every row it may in run `bind`: its selection would
    /// pick all of them (no more than k visible to the run's last token).
    pub fn every_row(&self, attn: NodeId, bind: Bind) -> bool {
        !switched_off!("DS4_ALL_ROWS") && self.attentions.get(&attn.index()).is_some_and(|&(ratio, k, _)| ratio > 0 && bind.tokens > 0 && (bind.pos0 + bind.tokens) / ratio <= k)
    }

    /// The nodes run `bind` skips: those only the selections of its every-row attentions
    /// need (by index).
    pub fn skipped(&self, bind: Bind) -> HashSet<usize> {
        self.attentions.iter().filter(|(&a, _)| self.every_row(NodeId::new(a), bind)).flat_map(|(_, (_, _, only))| only.iter().map(|n| n.index())).collect()
    }
}

/// The nodes that only attention `attn`'s selection `sel` (its input 4) needs: those no
/// graph output, no stateful op (`WindowKv`, `CompressPool`, `RowCache`: they write the
/// session's state) and no other reader needs, by a walk from the last node back.
fn selection_only(g: &Graph, attn: NodeId, sel: NodeId) -> Vec<NodeId> {
    let order = g.order();
    let mut needed: HashSet<NodeId> = HashSet::new();
    for &n in order.iter().rev() {
        let stateful = matches!(g.node(n).op, Op::WindowKv { .. } | Op::CompressPool { .. } | Op::RowCache { .. });
        let read = g.consumers(n).into_iter().any(|c| needed.contains(&c) && !(c == attn && n == sel && g.inputs(attn).iter().filter(|&&i| i == sel).count() == 1));
        if g.is_output(n) || stateful || read {
            needed.insert(n);
        }
    }
    let mut only: Vec<NodeId> = g.ancestors(sel).into_iter().filter(|n| !needed.contains(n) && !matches!(g.node(*n).op, Op::Input { .. } | Op::Weight { .. })).collect();
    only.sort_by_key(|n| n.index());
    only
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_ir::kernels::attention;

    /// The claim the skip rests on: attention over a selection of every visible row, in
    /// any order (the top k's score order) with unused picks, is the causal attention over
    /// those rows (the f64 reference kernels, to rounding).
    #[test]
    fn a_selection_of_every_row_is_the_causal_attention() {
        let mut r = ds4_ir::rng::Rng(0x1234_5678_9abc_def1);
        let (heads, hd, window, ratio, k_sel) = (2usize, 8usize, 4usize, 4usize, 8usize);
        for (tokens, pos0) in [(1usize, 30usize), (5, 0), (3, 27)] {
            let last = pos0 + tokens - 1;
            assert!((last + 1) / ratio <= k_sel);
            let n_comp = (last + 1) / ratio;
            let win_pos0 = pos0.saturating_sub(window - 1);
            let n_win = pos0 + tokens - win_pos0;
            let (q, win) = (r.floats(tokens * heads * hd, -1.0, 1.0), r.floats(n_win * hd, -1.0, 1.0));
            let (comp, sinks) = (r.floats(n_comp.max(1) * hd, -1.0, 1.0), r.floats(heads, -1.0, 1.0));
            // Each token's visible rows, reversed and rotated (not row order), then -1s.
            let mut sel = vec![-1i32; tokens * k_sel];
            for t in 0..tokens {
                let visible = (pos0 + t + 1) / ratio;
                for j in 0..visible {
                    sel[t * k_sel + j] = ((visible - 1 - j + t) % visible) as i32;
                }
            }
            let run = |mode: usize| -> Vec<f64> {
                let nc = 2;
                let mut part = vec![0f64; tokens * heads * nc * (hd + 2)];
                for (i, o) in part.chunks_mut(hd + 2).enumerate() {
                    attention::attention_partial(i, o, &q, &win, &comp, &sel, &sinks, heads, hd, pos0, win_pos0, n_win, window, n_comp, mode, ratio, k_sel, 0.3, nc);
                }
                let mut out = vec![0f64; tokens * heads * hd];
                for (item, o) in out.chunks_mut(hd).enumerate() {
                    attention::attention_merge(item, o, &part, hd, nc);
                }
                out
            };
            let (selected, causal) = (run(attention::COMP_SELECTED), run(attention::COMP_CAUSAL));
            for (i, (a, b)) in selected.iter().zip(&causal).enumerate() {
                assert!((a - b).abs() < 1e-12, "tokens {tokens} at {pos0}, value {i}: {a} vs {b}");
            }
        }
    }

    /// On the tiny golden model: each CSA layer's selection is its indexer's scores, top k,
    /// query projection, RoPE and Hadamard, and head weights; never its compressor's nodes
    /// nor anything the attention's other inputs need. The every-row test is the top k's
    /// count of visible rows.
    #[test]
    fn tiny_model_selection_is_the_indexer_query_side() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let rows = AllRows::of(g);
        assert!(!rows.attentions.is_empty());
        for (&a, (ratio, k, only)) in &rows.attentions {
            let attn = NodeId::new(a);
            let layer = g.node(attn).label.split('.').take(2).collect::<Vec<_>>().join(".");
            let labels: Vec<&str> = only.iter().map(|n| g.node(*n).label.as_str()).collect();
            for want in ["indexer.top_k", "indexer.scores", "indexer.q", "indexer.w"] {
                assert!(labels.contains(&format!("{layer}.{want}").as_str()), "{layer}: {want} not in {labels:?}");
            }
            assert!(labels.iter().all(|l| l.starts_with(&format!("{layer}.indexer")) && !l.contains("compressor")), "{layer}: {labels:?}");
            let others: HashSet<NodeId> = g.inputs(attn)[..4].iter().flat_map(|&i| g.ancestors(i)).collect();
            assert!(only.iter().all(|n| !others.contains(n)), "{layer}: a node the attention's other inputs need");
            let bind = |pos0, tokens| Bind { pos0, tokens };
            assert!(rows.every_row(attn, bind(0, ratio * k)) && rows.every_row(attn, bind(ratio * k - 1, 1)));
            assert!(!rows.every_row(attn, bind(0, ratio * (k + 1))) && !rows.every_row(attn, bind(ratio * (k + 1) - 1, 1)));
        }
        assert_eq!(rows.skipped(Bind { pos0: 0, tokens: 4 }).len(), rows.attentions.values().map(|v| v.2.len()).sum::<usize>());
        assert!(rows.skipped(Bind { pos0: 100_000, tokens: 1 }).is_empty());
    }
}
