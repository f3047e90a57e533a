//! The node at hand in the executor's walk (`run_nodes`): its inputs' values, its shapes
//! at the bound batch, and the checks its launches need, for the launch helpers of every
//! op to take as one argument.

use super::{DevSlice, DeviceTensor, DeviceWeights, ExecError, GVal, StepIds};
use super::super::device::Arg;
use ds4_ir::{Bind, Graph, NodeId, Op};
use std::collections::HashMap;

/// A launch's `usize` argument.
pub(super) fn u(v: usize) -> Arg {
    Arg::U64(v as u64)
}

/// A launch's `f32` argument.
pub(super) fn fl(v: f32) -> Arg {
    Arg::F32(v)
}

/// Node `id` during a run: its inputs `ins` (their values in `vals`), its output's shape
/// at `bind` and its length.
pub(super) struct NodeView<'r> {
    pub id: NodeId,
    pub label: &'r str,
    pub ins: &'r [NodeId],
    pub shape: Vec<usize>,
    pub n_out: usize,
    pub bind: Bind,
    pub graph: &'r Graph,
    pub vals: &'r HashMap<usize, GVal>,
    weights: &'r DeviceWeights,
}

impl<'r> NodeView<'r> {
    pub fn new(graph: &'r Graph, id: NodeId, ins: &'r [NodeId], bind: Bind, vals: &'r HashMap<usize, GVal>, weights: &'r DeviceWeights) -> Self {
        let node = graph.node(id);
        let shape = node.ty.shape.eval(bind);
        let n_out = shape.iter().product();
        NodeView { id, label: node.label.as_str(), ins, shape, n_out, bind, graph, vals, weights }
    }

    /// Input `i`'s shape.
    pub fn in_shape(&self, i: usize) -> Vec<usize> {
        self.graph.node(self.ins[i]).ty.shape.eval(self.bind)
    }

    /// Input `i`'s last dimension.
    pub fn last(&self, i: usize) -> usize {
        *self.in_shape(i).last().unwrap_or(&1)
    }

    /// Input `i`'s rows: its elements over its last dimension.
    pub fn rows(&self, i: usize) -> usize {
        let s = self.in_shape(i);
        s.iter().product::<usize>() / s.last().copied().unwrap_or(1).max(1)
    }

    /// Input `i`'s value, if it has one yet.
    pub fn value(&self, i: usize) -> Option<&'r GVal> {
        self.vals.get(&self.ins[i].index())
    }

    /// The error for input `i` not being `what` the node needs.
    fn not_a(&self, i: usize, what: &str) -> ExecError {
        ExecError::Internal(format!("{}: input {i} is not {what}", self.label))
    }

    /// Input `i`'s float value.
    pub fn fs(&self, i: usize) -> Result<&'r DevSlice, ExecError> {
        match self.value(i) {
            Some(GVal::F(s)) => Ok(s),
            _ => Err(self.not_a(i, "a float value")),
        }
    }

    /// Input `i`'s float value as a launch argument.
    pub fn f(&self, i: usize) -> Result<Arg, ExecError> {
        Ok(Arg::Ptr(self.fs(i)?.ptr()))
    }

    /// Input `i`'s i32 value.
    pub fn is(&self, i: usize) -> Result<&'r DevSlice, ExecError> {
        match self.value(i) {
            Some(GVal::I(s)) => Ok(s),
            _ => Err(self.not_a(i, "an i32 value")),
        }
    }

    /// Input `i`'s i32 value as a launch argument.
    pub fn iv(&self, i: usize) -> Result<Arg, ExecError> {
        Ok(Arg::Ptr(self.is(i)?.ptr()))
    }

    /// Input `i`'s weight tensor.
    pub fn w(&self, i: usize) -> Result<&'r DeviceTensor, ExecError> {
        match self.value(i) {
            Some(GVal::W(name)) => Ok(self.weights.tensor(name)?),
            _ => Err(self.not_a(i, "a weight")),
        }
    }

    /// A small float parameter: an activation or a weight kept as an f32 vector.
    pub fn vecf(&self, i: usize) -> Result<Arg, ExecError> {
        match self.value(i) {
            Some(GVal::F(s)) => Ok(Arg::Ptr(s.ptr())),
            Some(GVal::W(name)) => Ok(Arg::Ptr(self.weights.vector(name)?.ptr)),
            _ => Err(self.not_a(i, "a float value or a weight")),
        }
    }

    /// Token ids (input `i`, the graph's `ids`) below `size`, the `what` they index: checked
    /// on the host's copy, the graph input (no read back); ids on the device by the bound
    /// they are known to keep.
    pub fn check_ids(&self, i: usize, size: usize, what: &str, ids: StepIds) -> Result<(), ExecError> {
        if !matches!(&self.graph.node(self.ins[i]).op, Op::Input { name, .. } if name == "ids") {
            return Err(ExecError::Internal(format!("{}: token ids must be the graph's ids input", self.label)));
        }
        match ids {
            StepIds::Host(host) => match host.iter().find(|&&t| t < 0 || t as usize >= size) {
                Some(bad) => Err(ExecError::Input(format!("token id {bad} is outside the {what} (size {size})"))),
                None => Ok(()),
            },
            StepIds::Device { below, .. } if below > size => Err(ExecError::Input(format!("token ids up to {} may be outside the {what} (size {size})", below - 1))),
            StepIds::Device { .. } => Ok(()),
        }
    }
}
