//! The typed graph: ops as nodes, edges carry the input position. Building a node runs
//! its type inference, so a graph that exists is well-typed.

use crate::op::{IrError, Op, TensorType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;

pub type NodeId = NodeIndex<u32>;

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub ty: TensorType,
    /// A readable name for errors and listings ("blk.3.attn.q").
    pub label: String,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: StableDiGraph<Node, usize, u32>,
    /// Named outputs, in the order they were marked.
    pub outputs: Vec<(String, NodeId)>,
    /// Number of state slots the graph's stateful ops use.
    pub n_slots: usize,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Add an op fed by `inputs` (in order); fails if the types do not fit.
    pub fn add(&mut self, label: impl Into<String>, op: Op, inputs: &[NodeId]) -> Result<NodeId, IrError> {
        let label = label.into();
        let tys: Vec<&TensorType> = inputs.iter().map(|&i| &self.g[i].ty).collect();
        let ty = op.infer(&tys).map_err(|e| IrError(format!("{label}: {e}")))?;
        if let Some(s) = op.slot() {
            self.n_slots = self.n_slots.max(s + 1);
        }
        let id = self.g.add_node(Node { op, ty, label });
        for (pos, &i) in inputs.iter().enumerate() {
            self.g.add_edge(i, id, pos);
        }
        Ok(id)
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    /// A node's inputs, in input order.
    pub fn inputs(&self, id: NodeId) -> Vec<NodeId> {
        let mut v: Vec<(usize, NodeId)> = self.g.edges_directed(id, Direction::Incoming).map(|e| (*e.weight(), e.source())).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// The nodes that read `id`'s value (each once, in no particular order).
    pub fn consumers(&self, id: NodeId) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.g.edges_directed(id, Direction::Outgoing).map(|e| e.target()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether `id` is one of the graph's outputs.
    pub fn is_output(&self, id: NodeId) -> bool {
        self.outputs.iter().any(|(_, o)| *o == id)
    }

    /// The one node that reads `id`, where `id` has exactly one reader and is no graph
    /// output (a value an executor may fuse away).
    pub fn only_reader(&self, id: NodeId) -> Option<NodeId> {
        match self.consumers(id)[..] {
            [r] if !self.is_output(id) => Some(r),
            _ => None,
        }
    }

    /// The tensor name of weight node `id` (None for any other node).
    pub fn weight_name(&self, id: NodeId) -> Option<&str> {
        match &self.node(id).op {
            Op::Weight { name, .. } => Some(name),
            _ => None,
        }
    }

    pub fn mark_output(&mut self, name: impl Into<String>, id: NodeId) {
        self.outputs.push((name.into(), id));
    }

    /// Nodes in an order where every input comes before its users (insertion order is one,
    /// since a node can only be built from existing nodes).
    pub fn order(&self) -> Vec<NodeId> {
        self.g.node_indices().collect()
    }

    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// `id` and every node it is computed from.
    pub fn ancestors(&self, id: NodeId) -> std::collections::HashSet<NodeId> {
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![id];
        while let Some(n) = todo.pop() {
            if seen.insert(n) {
                todo.extend(self.g.neighbors_directed(n, Direction::Incoming));
            }
        }
        seen
    }

    /// For each node, the position in `order()` of its last use (outputs live to the end),
    /// so an executor can free values early.
    pub fn last_uses(&self) -> Vec<usize> {
        self.last_uses_in(&self.order())
    }

    /// [`Graph::last_uses`] for nodes run in `order` (every node once, inputs first), as
    /// positions in it.
    pub fn last_uses_in(&self, order: &[NodeId]) -> Vec<usize> {
        let mut pos = vec![0usize; self.g.node_bound()];
        for (k, &n) in order.iter().enumerate() {
            pos[n.index()] = k;
        }
        let mut last = vec![0usize; self.g.node_bound()];
        for &n in order {
            last[n.index()] = pos[n.index()];
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                last[n.index()] = last[n.index()].max(pos[e.target().index()]);
            }
        }
        for (_, o) in &self.outputs {
            last[o.index()] = usize::MAX;
        }
        last
    }

    /// Weight names the graph reads.
    pub fn weights(&self) -> Vec<(&str, &TensorType)> {
        self.order()
            .into_iter()
            .filter_map(|n| match &self.g[n].op {
                Op::Weight { name, ty } => Some((name.as_str(), ty)),
                _ => None,
            })
            .collect()
    }

    /// One line per node: id, label, op, output type.
    pub fn listing(&self) -> String {
        let mut s = String::new();
        for n in self.order() {
            let node = &self.g[n];
            let ins: Vec<String> = self.inputs(n).iter().map(|i| format!("%{}", i.index())).collect();
            s.push_str(&format!("%{} = {}({}) : {}  // {}\n", n.index(), node.op.name(), ins.join(", "), node.ty, node.label));
        }
        s
    }
}
