//! The fused launches a graph offers, found once per graph (the backend keeps the model's
//! graphs' plans; a session with a graph of its own makes one) rather than at every
//! candidate node of every decode step: the hyper-connection pre chains
//! (`hc_pre.rs`), the norm-RoPE chains (`norm_rope.rs`) and the routing chains
//! (`router.rs`), each by the node where its launch goes; the `Add` after the routed
//! experts that the integer down projection makes (`moe_add`); the RoPE that the attention
//! merge makes (`attention_rope`: the inverse RoPE of the attention's output); the
//! hyper-connection expand that the launch making its y makes (`expand`:
//! `ds4_codegen::cuda_hc_expand`); the mat-vecs that may take the digits a weighted norm's
//! launch makes of its output (`norm_matmuls`); where a Sinkhorn left out of an `hc_pre`
//! launch goes (`comb_at`); each RoPE node's frequency table key (the RoPE frequencies'
//! f32 bits, which the backend's upload cache is keyed by); and the nodes a decode step's
//! graph runs on a side branch (`side`, `launch_plan.rs`): the shared expert's beside the
//! routing (joined at the routed experts' add), the attention query's beside its KV,
//! compressor and indexer (joined at the attention), a CSA layer's indexer query beside its
//! KV row and compressors (joined at the scores); and the order a step runs the nodes in
//! (`run_order`: a CSA layer's indexer query right after its input, its attention query
//! right after the scores).
//! Whether a chain is launched fused is still decided per launch (shapes, alignment, the
//! measuring switches); what the graph offers is fixed.

use super::hc_pre::{self, HcPreChain};
use super::norm_rope::{self, NormRopeChain, RopeHadamardChain};
use super::router::{self, RouterChain};
use ds4_ir::{Graph, NodeId, Op};
use std::collections::HashMap;

/// The chains of one graph, by the index of the node each starts at.
#[derive(Default)]
pub struct FusionPlan {
    hc_pre: HashMap<usize, HcPreChain>,
    norm_rope: HashMap<usize, NormRopeChain>,
    /// RoPEs whose rows go on to a Hadamard transform, by RoPE node.
    rope_hadamard: HashMap<usize, RopeHadamardChain>,
    router: HashMap<usize, RouterChain>,
    moe_add: HashMap<usize, (NodeId, NodeId)>,
    attention_rope: HashMap<usize, NodeId>,
    expand: HashMap<usize, NodeId>,
    /// The routed experts' adds of the shared expert whose expand's streams go on to a
    /// pre chain alone, by add: that chain's norm (`shared_later`).
    shared_later: HashMap<usize, NodeId>,
    rope_keys: HashMap<usize, Vec<u32>>,
    side: HashMap<usize, Branch>,
    joins: std::collections::HashSet<usize>,
    /// Top-k nodes whose picks may come in row order (`rows_top_k`).
    rows_top_k: std::collections::HashSet<usize>,
    /// The MatMul nodes that read a weighted norm's output as their x, by norm: the
    /// mat-vecs that may take the digits the norm's launch makes (`norm_matmuls`).
    norm_matmuls: HashMap<usize, Vec<NodeId>>,
    /// The routed experts and expand nodes: where a pending Sinkhorn goes at the latest
    /// (`comb_at`).
    comb_latest: std::collections::HashSet<usize>,
    /// The order a step runs the nodes in, with its selections (`run_order`) and where
    /// it skips them (`crate::all_rows`: the graph's order).
    selecting: Schedule,
    every_row: Schedule,
    /// The selections a run may skip (`crate::all_rows`).
    all_rows: crate::all_rows::AllRows,
}

/// Which side branch a node is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branch {
    /// The shared expert, beside the routing and the routed experts' gate and up.
    SharedExpert,
    /// The attention's query (its projections, norm and RoPE) beside the KV row, the
    /// compressors and the indexer.
    Query,
    /// A CSA layer's indexer query (its projection, RoPE and Hadamard) beside the KV row
    /// and the compressors.
    IndexerQuery,
}

/// Where a Sinkhorn that an `hc_pre` launch left out of its grid may be launched (the
/// executor's `CombHome`), at a node of the step: only the sublayer's expand reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CombAt {
    /// A node on the shared expert's branch: the FFN's Sinkhorn, kept for that lane,
    /// launches at its head (the lane waits for the routed experts' down anyway).
    SharedExpertLane,
    /// The routed experts (whose down makes the expand that reads the FFN's mix) or an
    /// expand: any Sinkhorn still pending launches here at the latest.
    Latest,
}

/// An order to run a graph's nodes in, and each node's last use in it.
#[derive(Default)]
pub struct Schedule {
    pub order: Vec<NodeId>,
    pub last_use: Vec<usize>,
}

impl Schedule {
    fn of(g: &Graph, order: Vec<NodeId>) -> Schedule {
        Schedule { last_use: g.last_uses_in(&order), order }
    }
}

impl FusionPlan {
    /// Walks `g` once.
    pub fn of(g: &Graph) -> FusionPlan {
        let mut plan = FusionPlan::default();
        let (mut queries, mut indexer_queries) = (Vec::new(), Vec::new());
        for id in g.order() {
            let i = id.index();
            match &g.node(id).op {
                Op::RmsNormPlain { .. } | Op::RmsNorm { .. } => {
                    if matches!(g.node(id).op, Op::RmsNorm { .. }) {
                        let readers: Vec<NodeId> = g.consumers(id).into_iter().filter(|&c| matches!(g.node(c).op, Op::MatMul) && g.inputs(c)[0] == id).collect();
                        if !readers.is_empty() {
                            plan.norm_matmuls.insert(i, readers);
                        }
                    }
                    // A plain norm is tried as a pre chain first (the executor's order).
                    match hc_pre::chain_at(g, id) {
                        Some(c) => {
                            plan.hc_pre.insert(i, c);
                        }
                        None => {
                            if let Some(c) = norm_rope::chain_at(g, id) {
                                plan.norm_rope.insert(i, c);
                            }
                        }
                    }
                }
                Op::RouterScores => {
                    if let Some(c) = router::chain_at(g, id) {
                        plan.router.insert(i, c);
                    }
                }
                Op::Rope { inv_freq, .. } => {
                    plan.rope_keys.insert(i, freq_key(inv_freq));
                    if let Some(c) = norm_rope::hadamard_after(g, id) {
                        plan.rope_hadamard.insert(i, c);
                    }
                }
                Op::Attention { .. } => {
                    if let Some(r) = g.only_reader(id).filter(|&r| matches!(g.node(r).op, Op::Rope { .. }) && g.inputs(r)[0] == id) {
                        plan.attention_rope.insert(i, r);
                    }
                    // A selection read by this attention alone: its order is the order
                    // the attention adds its rows in, nothing more.
                    if let (Op::Attention { comp: ds4_ir::CompMode::Selected, .. }, Some(&sel)) = (&g.node(id).op, g.inputs(id).get(4)) {
                        if matches!(g.node(sel).op, Op::TopK { .. }) && g.consumers(sel) == [id] && !g.is_output(sel) {
                            plan.rows_top_k.insert(sel.index());
                        }
                    }
                    // The query (input 0): what it needs that the attention's other inputs
                    // do not.
                    let ins = g.inputs(id);
                    let nodes = own_ancestors(g, ins[0], &ins[1..]);
                    plan.branch(&nodes, Branch::Query, id);
                    queries.push(nodes);
                }
                Op::IndexerScores { .. } if !switched_off!("DS4_SIDE_INDEXER_Q") => {
                    // The indexer's query (input 0): what it needs that the head weights
                    // and the rows do not, from where it leaves the attention's query.
                    let ins = g.inputs(id);
                    let nodes = own_ancestors(g, ins[0], &ins[1..]);
                    plan.branch(&nodes, Branch::IndexerQuery, id);
                    indexer_queries.push(nodes);
                }
                Op::HcExpand { .. } => {
                    plan.comb_latest.insert(i);
                    // Its streams and mix are made before its y (graph order is node
                    // order), so the launch making y has them.
                    let ins = g.inputs(id);
                    if ins[1].index() < ins[0].index() && ins[2].index() < ins[0].index() {
                        plan.expand.insert(ins[0].index(), id);
                    }
                }
                Op::MoeExperts { .. } => {
                    plan.comb_latest.insert(i);
                    if let Some(a) = moe_add_at(g, id) {
                        plan.moe_add.insert(i, a);
                        // The shared expert: what the add's other input needs that the
                        // routed experts do not. It joins where its output is read: the
                        // add, or the launch of the routed experts' down projection that
                        // makes the add (the executor's `digits_down`).
                        plan.branch(&own_ancestors(g, a.1, &[id]), Branch::SharedExpert, a.0);
                    }
                }
                _ => {}
            }
        }
        // The pre chains whose norm the shared expert's branch reads (known only now).
        for c in plan.hc_pre.values_mut() {
            c.feeds_shared_expert = c.norm.as_ref().is_some_and(|(id, _, _)| g.consumers(*id).iter().any(|r| plan.side.get(&r.index()) == Some(&Branch::SharedExpert)));
        }
        plan.shared_later = shared_later_of(g, &plan);
        plan.all_rows = crate::all_rows::AllRows::of(g);
        let (mut selecting, mut every_row) = (run_order(g, &queries, &indexer_queries), g.order());
        if !switched_off!("DS4_COMP_FIRST") {
            compressors_first(g, &mut selecting);
            compressors_first(g, &mut every_row);
        }
        if !switched_off!("DS4_KV_LATE") {
            kv_row_late(g, &mut selecting);
        }
        plan.selecting = Schedule::of(g, selecting);
        plan.every_row = Schedule::of(g, every_row);
        plan
    }

    /// The order a step runs the nodes in: where it makes its selections, the graph's
    /// with the CSA layers' query branches moved (`run_order`); where it skips them
    /// (`all_rows`: nothing to overlap the query with but the KV row and compressors),
    /// the graph's.
    pub fn schedule(&self, all_rows: bool) -> &Schedule {
        if all_rows {
            &self.every_row
        } else {
            &self.selecting
        }
    }

    /// The selections a run may skip where they are every row (`crate::all_rows`).
    pub fn all_rows(&self) -> &crate::all_rows::AllRows {
        &self.all_rows
    }

    /// Where a pending Sinkhorn may launch at node `id` ([`CombAt`]), if anywhere.
    pub fn comb_at(&self, id: NodeId) -> Option<CombAt> {
        if self.comb_latest.contains(&id.index()) {
            Some(CombAt::Latest)
        } else if self.side(id) == Some(Branch::SharedExpert) {
            Some(CombAt::SharedExpertLane)
        } else {
            None
        }
    }

    /// The MatMul nodes that read weighted norm `norm`'s output as their x (none: empty).
    pub fn norm_matmuls(&self, norm: NodeId) -> &[NodeId] {
        self.norm_matmuls.get(&norm.index()).map_or(&[], Vec::as_slice)
    }

    pub fn hc_pre(&self, norm: NodeId) -> Option<&HcPreChain> {
        self.hc_pre.get(&norm.index())
    }

    pub fn norm_rope(&self, norm: NodeId) -> Option<&NormRopeChain> {
        self.norm_rope.get(&norm.index())
    }

    pub fn rope_hadamard(&self, rope: NodeId) -> Option<&RopeHadamardChain> {
        self.rope_hadamard.get(&rope.index())
    }

    pub fn router(&self, scores: NodeId) -> Option<&RouterChain> {
        self.router.get(&scores.index())
    }

    /// The `Add` that is the routed experts node `moe`'s only reader, and that add's other
    /// input (made before `moe` in graph order: the shared expert's output).
    pub fn moe_add(&self, moe: NodeId) -> Option<(NodeId, NodeId)> {
        self.moe_add.get(&moe.index()).copied()
    }

    /// Where the shared expert's share of the routed experts' add `add` may be left for
    /// later (`cuda_hc_pre`'s `pending`): the norm of the pre chain that reads the add's
    /// expanded streams, which may add it as it reads them.
    pub fn shared_later(&self, add: NodeId) -> Option<NodeId> {
        self.shared_later.get(&add.index()).copied()
    }

    /// The RoPE that is attention node `attn`'s only reader.
    pub fn attention_rope(&self, attn: NodeId) -> Option<NodeId> {
        self.attention_rope.get(&attn.index()).copied()
    }

    /// The `HcExpand` whose y is node `y` (a launch making y may make it too).
    pub fn expand(&self, y: NodeId) -> Option<NodeId> {
        self.expand.get(&y.index()).copied()
    }

    /// Records `nodes` (none: no branch) as a side branch joined before `join`.
    fn branch(&mut self, nodes: &[NodeId], kind: Branch, join: NodeId) {
        if !nodes.is_empty() {
            self.joins.insert(join.index());
            self.side.extend(nodes.iter().map(|n| (n.index(), kind)));
        }
    }

    /// The side branch of a decode step's graph that `node` runs on, if any.
    pub fn side(&self, node: NodeId) -> Option<Branch> {
        self.side.get(&node.index()).copied()
    }

    /// Whether the side branch joins before `node` (the reader of its output; where the
    /// routed experts make that add, their launch joins it).
    pub fn joins(&self, node: NodeId) -> bool {
        self.joins.contains(&node.index())
    }

    /// Whether top-k node `top_k` may give its picks in row order rather than score order
    /// (`cuda_top_k_radix::ROWS_NAME`): its only reader is an attention over the picked
    /// rows, whose softmax adds the same terms in either order (in row order, the order a
    /// causal attention adds them in).
    pub fn rows_top_k(&self, top_k: NodeId) -> bool {
        self.rows_top_k.contains(&top_k.index())
    }

    /// RoPE node `rope`'s frequency table key.
    pub fn rope_key(&self, rope: NodeId) -> Option<&[u32]> {
        self.rope_keys.get(&rope.index()).map(Vec::as_slice)
    }
}

/// The `Add` reading only `moe` (no graph output) with another input made earlier.
fn moe_add_at(g: &Graph, moe: NodeId) -> Option<(NodeId, NodeId)> {
    let add = g.only_reader(moe)?;
    if !matches!(g.node(add).op, Op::Add) {
        return None;
    }
    let other = match g.inputs(add)[..] {
        [a, b] if a == moe && b != moe => b,
        [a, b] if b == moe && a != moe => a,
        _ => return None,
    };
    // Graph order is node order (`Graph::order`).
    (other.index() < moe.index()).then_some((add, other))
}

/// The adds of the shared expert (`moe_add`) that may leave its share for the next pre
/// chain, by add: the add (no graph output) is read by its expand alone (`expand`), and
/// that expand's streams (no graph output) by one pre chain's norm (through a reshape read
/// by nothing else), that chain's collapse, and expands that read them as their old
/// streams; each of those reads them after the chain has added the share.
fn shared_later_of(g: &Graph, plan: &FusionPlan) -> HashMap<usize, NodeId> {
    let mut later = HashMap::new();
    for &(add, _) in plan.moe_add.values() {
        let Some(&expand) = plan.expand.get(&add.index()) else { continue };
        if g.is_output(add) || g.is_output(expand) || g.consumers(add) != [expand] {
            continue;
        }
        let next = plan.hc_pre.iter().find(|(_, c)| c.streams == expand).map(|(&norm, c)| (NodeId::new(norm), c));
        let Some((norm, c)) = next else { continue };
        let flat = g.inputs(norm)[0];
        let alone = g.consumers(flat) == [norm]
            && g.consumers(expand).into_iter().all(|r| r == flat || r == c.collapse || (matches!(g.node(r).op, Op::HcExpand { .. }) && g.inputs(r)[1] == expand && g.inputs(r)[0] != expand));
        if alone {
            later.insert(add.index(), norm);
        }
    }
    later
}

/// The nodes that `of` needs (itself included) and none of `others` does, weights and
/// inputs aside, less those read outside them (and what only those need): for `of` the
/// shared expert's output and `others` the routed experts, the shared expert's nodes; for
/// an indexer's query and its scores' other inputs, the query's projection, RoPE and
/// Hadamard (the attention query's norm, which it reads, is read by `q_b` too). Empty
/// where `of` is a graph output (its value would be read before the join).
fn own_ancestors(g: &Graph, of: NodeId, others: &[NodeId]) -> Vec<NodeId> {
    use std::collections::HashSet;
    if g.is_output(of) {
        return Vec::new();
    }
    let theirs: HashSet<NodeId> = others.iter().flat_map(|&o| g.ancestors(o)).collect();
    let mut own: HashSet<NodeId> = g.ancestors(of).into_iter().filter(|n| !theirs.contains(n) && !matches!(g.node(*n).op, Op::Input { .. } | Op::Weight { .. })).collect();
    // Every reader of a branch node is a branch node (`of`'s readers aside): drop those
    // read outside until none is (a dropped node's inputs may then be read outside).
    loop {
        let leaks: Vec<NodeId> = own.iter().copied().filter(|&n| n != of && (g.is_output(n) || g.consumers(n).iter().any(|c| !own.contains(c)))).collect();
        if leaks.is_empty() {
            break;
        }
        for n in leaks {
            own.remove(&n);
        }
    }
    let mut own: Vec<NodeId> = own.into_iter().collect();
    own.sort_by_key(|n| n.index());
    own
}

/// The order a step that makes its selections runs the nodes in: the graph's, except
/// that in a layer with an indexer (a CSA layer) the indexer's query branch (`indexed`,
/// joined at the scores) runs right after the value it reads (the attention query's
/// norm), and the attention's query branch (`queries`, each branch's nodes by index)
/// right after the scores, or right before them where the indexer's query is not a branch.
///
/// Why: launched where the graph has it (after `q_a`'s norm), `q_b`'s 8,192 blocks fill
/// every SM and the main lane's next kernels (the KV row's chain, the compressors' and
/// the indexer's projections, each a few µs) wait until they drain: a CUPTI trace of a
/// CSA layer on the H200 (`scripts/ktrace/`) showed the main lane idle ~9 µs behind it.
/// Issued at the scores, it overlaps them and the top-k (small grids, ~27 µs at ctx
/// 2048) instead; the scores take ~5 µs longer beside it, a CSA layer ~6 µs less in all
/// (decode steady +2.3% at ctx 2048, +5% at 8192). Moved after the indexer's query
/// projection instead (before its RoPE and Hadamard) it stalled those the same way. The
/// indexer's query chain (its F16 projection, RoPE, Hadamard: ~14 µs of small grids) and
/// the main lane's KV row and compressors (~13 µs) then overlap, and the scores join it.
/// Elsewhere (an HCA layer: the main lane's KV row and compressor are shorter than the
/// query) the branch stays where it is. `DS4_QUERY_AT_SCORES=0` keeps the graph's order.
fn run_order(g: &Graph, queries: &[Vec<NodeId>], indexed: &[Vec<NodeId>]) -> Vec<NodeId> {
    let mut order = g.order();
    if switched_off!("DS4_QUERY_AT_SCORES") {
        return order;
    }
    let mut joined = std::collections::HashSet::new();
    for nodes in indexed.iter().filter(|n| !n.is_empty()) {
        joined.extend(joins_of(g, nodes));
        place(g, &mut order, nodes, None);
    }
    for nodes in queries.iter().filter(|n| !n.is_empty()) {
        let inside: std::collections::HashSet<NodeId> = nodes.iter().copied().collect();
        let (Some(first), Some(&join)) = (order.iter().position(|&o| o == nodes[0]), joins_of(g, nodes).iter().min_by_key(|&&j| order.iter().position(|&o| o == j))) else { continue };
        let join_at = order.iter().position(|&o| o == join).unwrap_or(order.len());
        // The main lane's scores between the branch and the attention that joins it.
        let Some(scores) = (first..join_at).map(|p| order[p]).find(|&n| !inside.contains(&n) && matches!(g.node(n).op, Op::IndexerScores { .. })) else { continue };
        let before = match joined.contains(&scores) {
            true => order.iter().skip_while(|&&o| o != scores).skip(1).copied().find(|n| !inside.contains(n)),
            false => Some(scores),
        };
        place(g, &mut order, nodes, before);
    }
    order
}

/// In the layers whose attention reads its compressor's rows without a selection (HCA),
/// the compressor's projections moved before the KV row's mat-vec (`place`): on the main
/// lane they ran after the KV row, when the query's `q_b` held the SMs (an H200 trace: the
/// projections' F16 launch waited ~8 µs for them), and the KV row's log copy and the
/// compressor's now come one after the other, one `copy_spans` launch. An HCA layer 111.5 →
/// 110.1 µs (RESULTS.md, twenty-eighth stop); `DS4_COMP_FIRST=0` keeps the graph's order.
fn compressors_first(g: &Graph, order: &mut Vec<NodeId>) {
    let found = |id, is: &dyn Fn(&Op) -> bool| back_to(g, id, is).map(|(n, _)| n);
    for attn in g.order() {
        let Op::Attention { comp: ds4_ir::CompMode::Causal, .. } = g.node(attn).op else { continue };
        let ins = g.inputs(attn);
        let (Some(kv), Some(pool)) = (found(ins[1], &|op| matches!(op, Op::MatMul)), ins.get(3).and_then(|&r| found(r, &|op| matches!(op, Op::CompressPool { .. })))) else { continue };
        let projections: Vec<NodeId> = g.inputs(pool)[..2].iter().copied().filter(|&m| matches!(g.node(m).op, Op::MatMul)).collect();
        place(g, order, &projections, Some(kv));
    }
}

/// In a layer that selects its rows (CSA), the KV row's chain after its mat-vec (its norm,
/// RoPE and FP8 round trip, one `norm_rope` launch, and the push into the window's log, a
/// `copy_spans`) moved right before the attention, its only reader. In the graph's order
/// the chain sat on the main lane between the mat-vec and the compressors' projections,
/// on the path to the indexer's scores, which do not read it; there its copy waited ~2 µs
/// for SMs behind the indexer query's mat-vec on the side lane (an H200 trace: the norm
/// 3.9 µs, the wait and the copy 3.3 more). Before the attention it runs while the
/// attention waits for the query's `q_b` anyway. `DS4_KV_LATE=0` keeps the graph's order.
fn kv_row_late(g: &Graph, order: &mut Vec<NodeId>) {
    for attn in g.order() {
        let Op::Attention { comp: ds4_ir::CompMode::Selected, .. } = g.node(attn).op else { continue };
        // From the window's log back to the KV row's mat-vec: the chain is the nodes between.
        let Some((_, mut chain)) = back_to(g, g.inputs(attn)[1], &|op| matches!(op, Op::MatMul)) else { continue };
        // Only a chain that is the attention's alone moves.
        let alone = |n: &NodeId| g.consumers(*n).iter().all(|c| *c == attn || chain.contains(c));
        if !chain.iter().all(alone) {
            continue;
        }
        chain.reverse();
        place(g, order, &chain, Some(attn));
    }
}

/// Back from `id` through first inputs to the first node (at most 16 steps) whose op
/// matches `is`: that node, and the nodes passed on the way (from `id` on).
fn back_to(g: &Graph, mut id: NodeId, is: &dyn Fn(&Op) -> bool) -> Option<(NodeId, Vec<NodeId>)> {
    let mut passed = Vec::new();
    for _ in 0..16 {
        if is(&g.node(id).op) {
            return Some((id, passed));
        }
        passed.push(id);
        id = *g.inputs(id).first()?;
    }
    None
}

/// The readers of `nodes` outside them (a branch's joins).
fn joins_of(g: &Graph, nodes: &[NodeId]) -> Vec<NodeId> {
    let inside: std::collections::HashSet<NodeId> = nodes.iter().copied().collect();
    let mut joins: Vec<NodeId> = nodes.iter().flat_map(|&n| g.consumers(n)).filter(|c| !inside.contains(c)).collect();
    joins.sort_by_key(|n| n.index());
    joins.dedup();
    joins
}

/// Takes `nodes` (in order) out of `order` and puts them back together right before
/// `before` (a node outside them), or, if that is earlier or none, right after the last
/// value they read from outside; with the weights only they read (a weight node names
/// its tensor for its readers: it reads nothing, so it may go anywhere before them).
fn place(g: &Graph, order: &mut Vec<NodeId>, nodes: &[NodeId], before: Option<NodeId>) {
    let mut inside: std::collections::HashSet<NodeId> = nodes.iter().copied().collect();
    let weights: Vec<NodeId> = nodes.iter().flat_map(|&n| g.inputs(n)).filter(|&w| matches!(g.node(w).op, Op::Weight { .. }) && g.consumers(w).iter().all(|c| inside.contains(c))).collect();
    inside.extend(weights);
    let moved: Vec<NodeId> = order.iter().copied().filter(|n| inside.contains(n)).collect();
    order.retain(|n| !inside.contains(n));
    let pos = |n: NodeId| order.iter().position(|&o| o == n);
    let after_inputs = inside.iter().flat_map(|&n| g.inputs(n)).filter(|i| !inside.contains(i)).filter_map(pos).max().map_or(0, |p| p + 1);
    let at = before.and_then(pos).unwrap_or(0).max(after_inputs);
    order.splice(at..at, moved);
}

/// A frequency table's cache key: its values as f32 bits.
pub fn freq_key(inv_freq: &[f64]) -> Vec<u32> {
    inv_freq.iter().map(|&v| (v as f32).to_bits()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A branch is what one value needs that the others do not (inputs and weights
    /// aside), less what is read from outside it, and none when the value is a graph
    /// output.
    #[test]
    fn a_branch_is_what_only_its_value_needs() {
        use ds4_ir::{Dim, TensorType};
        let mut g = Graph::new();
        let x = g.add("x", Op::Input { name: "x".into(), ty: TensorType::f32(&[Dim::Tokens, Dim::Const(8)]) }, &[]).unwrap();
        let a = g.add("a", Op::RmsNormPlain { eps: 1e-6 }, &[x]).unwrap();
        let s1 = g.add("s1", Op::Add, &[a, a]).unwrap();
        let s2 = g.add("s2", Op::Add, &[s1, s1]).unwrap();
        let other = g.add("other", Op::Add, &[a, x]).unwrap();
        g.add("join", Op::Add, &[s2, other]).unwrap();
        assert_eq!(own_ancestors(&g, s2, &[other]), vec![s1, s2]);
        assert_eq!(own_ancestors(&g, other, &[s2]), vec![other], "`a` is the other side's too");
        let mut leaky = g.clone();
        leaky.add("leak", Op::Add, &[s1, x]).unwrap();
        assert_eq!(own_ancestors(&leaky, s2, &[other]), vec![s2], "s1 read outside the branch: left on the main lane");
        let mut out = g.clone();
        out.mark_output("s2", s2);
        assert!(own_ancestors(&out, s2, &[other]).is_empty(), "a graph output");
    }

    /// On the tiny golden model the plan holds what the chain finders find node by node,
    /// a pre chain where both a pre chain and a norm-RoPE chain could start (none does),
    /// each layer's shared-expert add after its routed experts and inverse RoPE after its
    /// attention, each sublayer's expand at its y, and a key for every RoPE node.
    #[test]
    fn tiny_model_plan_is_the_chain_finders_node_by_node() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let plan = FusionPlan::of(g);
        let (mut pre, mut nr, mut rt, mut ropes, mut moe_adds, mut attention_ropes, mut side, mut query, mut expands, mut indexed) = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        let (mut ffn_pre, mut norm_matmuls, mut q_norms, mut shared_later) = (0, 0, 0, 0);
        for id in g.order() {
            let found_pre = hc_pre::chain_at(g, id).is_some();
            assert_eq!(plan.hc_pre(id).is_some(), found_pre, "{}", g.node(id).label);
            // The FFN's pre chain feeds the shared expert's branch, the attention's does not.
            if let Some(c) = plan.hc_pre(id) {
                assert_eq!(c.feeds_shared_expert, g.node(id).label.contains("ffn"), "{}: feeds the shared expert", g.node(id).label);
                ffn_pre += c.feeds_shared_expert as usize;
            }
            assert_eq!(plan.norm_rope(id).is_some(), !found_pre && norm_rope::chain_at(g, id).is_some(), "{}", g.node(id).label);
            assert_eq!(plan.router(id).is_some(), router::chain_at(g, id).is_some(), "{}", g.node(id).label);
            if let Op::Rope { inv_freq, .. } = &g.node(id).op {
                assert_eq!(plan.rope_key(id), Some(freq_key(inv_freq).as_slice()));
                ropes += 1;
            }
            if let Some(rope) = plan.attention_rope(id) {
                assert!(matches!(g.node(id).op, Op::Attention { .. }) && matches!(g.node(rope).op, Op::Rope { inverse: true, .. }), "{}", g.node(id).label);
                attention_ropes += 1;
            }
            if let Some((add, other)) = plan.moe_add(id) {
                assert!(matches!(g.node(add).op, Op::Add) && g.consumers(id) == [add] && g.inputs(add).contains(&other), "{}", g.node(id).label);
                moe_adds += 1;
                // The shared expert's output is on the side branch, which joins at the add.
                assert!(plan.side(other) == Some(Branch::SharedExpert) && plan.joins(add) && plan.side(id).is_none() && !plan.joins(id), "{}", g.node(id).label);
                // Its share left for the next layer's attention pre chain, which reads the
                // expanded streams; the last layer's go to the output head.
                let layer: usize = g.node(id).label.split('.').nth(1).and_then(|l| l.parse().ok()).expect("blk.N label");
                match plan.shared_later(add) {
                    Some(norm) => {
                        let c = plan.hc_pre(norm).expect("a pre chain");
                        assert_eq!(Some(c.streams), plan.expand(add), "{}: the chain reads the add's expand", g.node(id).label);
                        assert!(g.node(norm).label.starts_with(&format!("blk.{}.hc_attn", layer + 1)), "{}: left for {}", g.node(id).label, g.node(norm).label);
                        shared_later += 1;
                    }
                    None => assert_eq!(layer + 1, model.hp.n_layer, "{}: only the last layer's share is added at once", g.node(id).label),
                }
            }
            match plan.side(id) {
                Some(Branch::SharedExpert) => {
                    assert!(g.node(id).label.contains("shexp") || g.node(id).label.contains("shared"), "{}: on the shared expert's branch", g.node(id).label);
                    side += 1;
                }
                Some(Branch::Query) => {
                    assert!(g.node(id).label.contains("q") && !g.node(id).label.contains("indexer"), "{}: on the query's branch", g.node(id).label);
                    query += 1;
                }
                Some(Branch::IndexerQuery) => {
                    assert!(g.node(id).label.contains("indexer.q"), "{}: on the indexer query's branch", g.node(id).label);
                    indexed += 1;
                }
                None => {}
            }
            if let Op::TopK { .. } = g.node(id).op {
                assert_eq!(plan.rows_top_k(id), g.node(id).label.contains("indexer"), "{}: only the indexer's picks in row order", g.node(id).label);
            }
            if let Op::IndexerScores { .. } = g.node(id).op {
                assert!(plan.joins(id) && plan.side(g.inputs(id)[0]) == Some(Branch::IndexerQuery), "{}: joins the indexer query's branch", g.node(id).label);
                assert!(plan.side(g.inputs(id)[1]).is_none() && plan.side(g.inputs(id)[2]).is_none(), "{}: head weights and rows on the main lane", g.node(id).label);
            }
            if let Op::Attention { .. } = g.node(id).op {
                assert!(plan.joins(id) && plan.side(g.inputs(id)[0]) == Some(Branch::Query), "{}: joins the query's branch", g.node(id).label);
            }
            if let Some(e) = plan.expand(id) {
                assert!(matches!(g.node(e).op, Op::HcExpand { .. }) && g.inputs(e)[0] == id, "{}", g.node(id).label);
                expands += 1;
            }
            // Where a pending Sinkhorn may go: the routed experts and the expands at the
            // latest, the shared expert's lane at its head.
            let latest = matches!(g.node(id).op, Op::MoeExperts { .. } | Op::HcExpand { .. });
            let want_comb = if latest { Some(CombAt::Latest) } else { (plan.side(id) == Some(Branch::SharedExpert)).then_some(CombAt::SharedExpertLane) };
            assert_eq!(plan.comb_at(id), want_comb, "{}", g.node(id).label);
            // A weighted norm's mat-vecs: every MatMul that reads it as its x, no other.
            let want: Vec<NodeId> = if matches!(g.node(id).op, Op::RmsNorm { .. }) { g.consumers(id).into_iter().filter(|&c| matches!(g.node(c).op, Op::MatMul) && g.inputs(c)[0] == id).collect() } else { Vec::new() };
            assert_eq!(plan.norm_matmuls(id), want.as_slice(), "{}", g.node(id).label);
            norm_matmuls += want.len();
            if matches!(g.node(id).op, Op::RmsNorm { .. }) && g.node(id).label.ends_with("q_a.norm") {
                assert!(want.iter().any(|&c| g.node(c).label.contains("q_b")), "{}: q_b reads the query's norm", g.node(id).label);
                q_norms += 1;
            }
            pre += plan.hc_pre(id).is_some() as usize;
            nr += plan.norm_rope(id).is_some() as usize;
            rt += plan.router(id).is_some() as usize;
        }
        assert_eq!(pre, 2 * model.hp.n_layer, "two pre chains a layer");
        assert_eq!(moe_adds, model.hp.n_layer, "the shared expert's add after every layer's routed experts");
        assert_eq!(ffn_pre, model.hp.n_layer, "every layer's FFN pre chain feeds its shared expert");
        assert_eq!(shared_later, model.hp.n_layer - 1, "every layer's shared expert but the last's left for the next layer");
        assert_eq!(attention_ropes, model.hp.n_layer, "the inverse RoPE after every layer's attention");
        assert_eq!(expands, 2 * model.hp.n_layer, "an expand after every sublayer, at its y");
        assert!(nr > 0 && rt > 0 && ropes > 0, "norm-RoPE chains {nr}, routing chains {rt}, RoPE nodes {ropes}");
        assert!(q_norms == model.hp.n_layer && norm_matmuls >= q_norms, "each layer's q_b after its query's norm: {q_norms} norms, {norm_matmuls} mat-vecs");
        assert!(side >= 3 * model.hp.n_layer, "the shared expert's gate, up, SwiGLU and down on the side branch: {side}");
        assert!(query >= 2 * model.hp.n_layer, "the query's q_b, norm and RoPE on the side branch: {query}");
        let csa = model.hp.compress_ratios.iter().filter(|&&r| r == 4).count();
        assert!(csa > 0 && indexed >= 3 * csa, "a CSA layer's indexer query projection, RoPE and Hadamard on their branch: {indexed}");
    }

    /// A layer whose expanded streams are a graph output (a residual read back, a split
    /// point's hand-over) adds its shared expert's share at once: the value read must be
    /// whole. The other layers still leave theirs for the next `hc_pre`.
    #[test]
    fn streams_read_outside_the_graph_take_the_share_at_once() {
        let model = crate::cuda::tiny_q2();
        let mut g = model.graph.clone();
        let adds: Vec<(NodeId, NodeId)> = g.order().into_iter().filter_map(|id| moe_add_at(&g, id)).map(|(add, _)| (add, g.only_reader(add).expect("the add's expand"))).collect();
        assert_eq!(adds.len(), model.hp.n_layer);
        let plan = FusionPlan::of(&g);
        assert!(plan.shared_later(adds[0].0).is_some(), "layer 0's share left for later");
        g.mark_output("residual.0", adds[0].1);
        let plan = FusionPlan::of(&g);
        assert!(plan.shared_later(adds[0].0).is_none(), "layer 0's streams are read back: added at once");
        assert_eq!(adds[1..].iter().filter(|(add, _)| plan.shared_later(*add).is_some()).count(), model.hp.n_layer - 2, "the other layers but the last leave theirs");
    }

    /// The run orders hold every node once, each after its inputs, with their last uses;
    /// in a layer with an indexer the indexer's query branch runs right after the query
    /// norm it reads and the attention's query branch right after the indexer's scores,
    /// elsewhere where the graph has it; a run that skips the selections keeps the
    /// graph's order; in both, an HCA layer's compressor projections run right before its
    /// KV row's mat-vec; a CSA layer's KV row chain runs right before its attention where
    /// the run selects.
    #[test]
    fn run_order_moves_only_an_indexed_layers_query_branches() {
        let model = crate::cuda::tiny_q2();
        let g = &model.graph;
        let plan = FusionPlan::of(g);
        // Each node's place in `order`, every node once, each after its inputs.
        let places = |order: &[NodeId]| -> Vec<usize> {
            let mut pos = vec![usize::MAX; order.iter().map(|n| n.index() + 1).max().unwrap_or(0)];
            for (p, n) in order.iter().enumerate() {
                assert_eq!(pos[n.index()], usize::MAX, "{} twice", g.node(*n).label);
                pos[n.index()] = p;
            }
            assert_eq!(order.len(), g.order().len());
            for &n in order {
                for i in g.inputs(n) {
                    assert!(pos[i.index()] < pos[n.index()], "{} before its input {}", g.node(n).label, g.node(i).label);
                }
            }
            pos
        };
        let mut graph_order = g.order();
        compressors_first(g, &mut graph_order);
        let every_row = plan.schedule(true);
        assert_eq!(every_row.order, graph_order);
        assert_eq!(every_row.last_use, g.last_uses_in(&graph_order));
        let order = &plan.schedule(false).order;
        let pos = places(order);
        assert_eq!(plan.schedule(false).last_use, g.last_uses_in(order));
        // An HCA layer's compressor projections, then (weights aside) its KV row's mat-vec.
        let mut hca = 0;
        for o in [&every_row.order, order] {
            let p = places(o);
            for id in g.order() {
                let label = &g.node(id).label;
                if !label.ends_with(".attn_compressor.kv") || g.order().iter().any(|&n| g.node(n).label == label.replace(".attn_compressor.kv", ".indexer.scores")) {
                    continue;
                }
                let kv = g.order().into_iter().find(|&n| g.node(n).label == label.replace(".attn_compressor.kv", ".kv")).expect("the layer's KV row");
                let gate = g.order().into_iter().find(|&n| g.node(n).label == label.replace(".kv", ".gate")).expect("the compressor's gate");
                let between = |a: usize, b: usize| (a + 1..b).all(|q| matches!(g.node(o[q]).op, Op::Weight { .. }));
                assert!(p[id.index()] < p[gate.index()] && between(p[id.index()], p[gate.index()]) && p[gate.index()] < p[kv.index()] && between(p[gate.index()], p[kv.index()]), "{label}: right before the KV row's mat-vec");
                hca += 1;
            }
        }
        assert!(hca > 0, "no HCA layer's compressor");
        let at = |label: String| g.order().into_iter().find(|&n| g.node(n).label == label);
        let branch = |layer: &str, b: Branch| -> Vec<usize> {
            let mut p: Vec<usize> = g.order().into_iter().filter(|&n| plan.side(n) == Some(b) && g.node(n).label.starts_with(&format!("{layer}."))).map(|n| pos[n.index()]).collect();
            p.sort();
            assert_eq!(p[0] + p.len() - 1, p[p.len() - 1], "{layer}: {b:?}'s nodes together");
            p
        };
        let (mut moved, mut kept) = (0, 0);
        for id in g.order() {
            let label = &g.node(id).label;
            if plan.side(id) != Some(Branch::Query) || !label.ends_with(".q_b") {
                continue;
            }
            let layer = label.split('.').take(2).collect::<Vec<_>>().join(".");
            match at(format!("{layer}.indexer.scores")) {
                Some(scores) => {
                    let query = branch(&layer, Branch::Query);
                    // Right after: nothing between but the weights they read.
                    let right_after = |from: usize, to: usize| (from + 1..to).all(|p| matches!(g.node(order[p]).op, Op::Weight { .. }));
                    assert!(query[0] > pos[scores.index()] && right_after(pos[scores.index()], query[0]), "{label}: the query's branch right after the scores");
                    let indexer = branch(&layer, Branch::IndexerQuery);
                    let norm = at(format!("{layer}.q_a.norm")).expect("the query's norm");
                    assert!(indexer[0] > pos[norm.index()] && right_after(pos[norm.index()], indexer[0]), "{label}: the indexer's query right after the norm it reads");
                    moved += 1;
                }
                None => {
                    assert_eq!(pos[id.index()], g.order().iter().position(|&n| n == id).unwrap(), "{label}: where the graph has it");
                    kept += 1;
                }
            }
        }
        assert!(moved > 0 && kept > 0, "moved {moved}, kept {kept}");
        // A CSA layer's KV row from its norm to its window log, right before the attention
        // (weights aside), where the run selects; where it skips the selections, as the
        // graph has it (after the mat-vec).
        let mut late = 0;
        for id in g.order() {
            if !matches!(g.node(id).op, Op::Attention { comp: ds4_ir::CompMode::Selected, .. }) {
                continue;
            }
            let layer = g.node(id).label.trim_end_matches(".attn").to_string();
            let (norm, window, kv) = (at(format!("{layer}.kv.norm")).expect("the KV row's norm"), g.inputs(id)[1], at(format!("{layer}.kv")).expect("the KV row's mat-vec"));
            assert_eq!(pos[window.index()] + 1, pos[id.index()], "{layer}: the window log right before the attention");
            for &o in &order[pos[norm.index()]..pos[window.index()]] {
                let n = g.node(o);
                assert!(n.label.starts_with(&format!("{layer}.kv.")) || matches!(n.op, Op::Weight { .. }), "{layer}: {} inside the KV row's chain", n.label);
            }
            let p = places(&every_row.order);
            assert!(p[norm.index()] < p[id.index()] && (p[kv.index()] + 1..p[norm.index()]).all(|q| matches!(g.node(every_row.order[q]).op, Op::Weight { .. })), "{layer}: the graph's order where every row is read");
            late += 1;
        }
        assert!(late > 0, "no CSA layer");
    }
}
