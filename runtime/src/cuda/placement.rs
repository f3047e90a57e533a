//! Weight placement: the graph's tensors on the device, as raw GGUF bytes.
//!
//! By default every tensor gets its own allocation starting on a 2 MiB boundary (a
//! large page: a tensor never shares a page, or its TLB entries, with another, and a
//! tensor's blocks start aligned). `Placement::Packed` puts them all in one allocation,
//! 256-byte aligned, for small models or tight memory. Small float vectors (norm
//! weights, biases, sinks, the compressor's positional bias) are also kept
//! de-quantized in f32, on the device and on the host: the kernels and the stateful
//! ops' bookkeeping read them as floats, as the CPU executor does.

use super::device::{CudaError, Device, DeviceBuf};
use crate::weights::Weights;
use ds4_ir::{GgmlType, Graph, Op};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// 2 MiB: the alignment (and size granularity) of a per-tensor allocation.
pub const TENSOR_ALIGN: usize = 2 << 20;
/// Alignment of tensors inside a packed allocation.
pub const PACKED_ALIGN: usize = 256;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// One 2 MiB-aligned allocation per tensor.
    #[default]
    PerTensor,
    /// One allocation for all tensors.
    Packed,
}

/// A tensor on the device.
#[derive(Clone, Debug)]
pub struct DeviceTensor {
    pub ptr: u64,
    pub ty: GgmlType,
    pub ne: Vec<u64>,
    pub bytes: usize,
}

impl DeviceTensor {
    /// Bytes of one row of `k` elements.
    pub fn row_bytes(&self, k: usize) -> usize {
        self.ty.bytes_for(k as u64).expect("row length checked by the graph builder") as usize
    }
}

/// Every weight a graph reads, placed.
pub struct DeviceWeights {
    pub tensors: HashMap<String, DeviceTensor>,
    /// Small vectors in f32: on the device, and the host copy.
    pub vectors: HashMap<String, (DeviceBuf, Vec<f32>)>,
    /// The allocations backing `tensors` (kept alive here).
    _blocks: Vec<DeviceBuf>,
    pub bytes: usize,
}

/// Weights read as float vectors (`vecf` in the CPU executor): by (op, input position).
fn vector_inputs(op: &Op) -> &'static [usize] {
    match op {
        Op::RmsNorm { .. } | Op::RouterBiased => &[1],
        Op::HcMix { .. } | Op::HcHeadMix { .. } => &[1, 2],
        Op::CompressPool { .. } => &[2],
        Op::Attention { .. } => &[2],
        _ => &[],
    }
}

fn round_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

impl DeviceWeights {
    /// Uploads the weights of `graphs` (their union).
    pub fn upload(dev: &Arc<Device>, weights: &Weights, graphs: &[&Graph], placement: Placement) -> Result<DeviceWeights, CudaError> {
        let mut names = BTreeSet::new();
        let mut vec_names = BTreeSet::new();
        for g in graphs {
            for (name, _) in g.weights() {
                names.insert(name.to_string());
            }
            for id in g.order() {
                let ins = g.inputs(id);
                for &i in vector_inputs(&g.node(id).op) {
                    if let Op::Weight { name, .. } = &g.node(ins[i]).op {
                        vec_names.insert(name.clone());
                    }
                }
            }
        }
        fn view<'w>(weights: &'w Weights, n: &'w str) -> Result<crate::weights::WeightView<'w>, CudaError> {
            weights.get(n).ok_or_else(|| CudaError(format!("weight {n} is not in the model file")))
        }
        let mut tensors = HashMap::new();
        let mut blocks = Vec::new();
        let mut total = 0;
        match placement {
            Placement::PerTensor => {
                for n in &names {
                    let w = view(weights, n)?;
                    let buf = aligned_alloc(dev, w.bytes.len())?;
                    buf.0.write(buf.1, w.bytes)?;
                    total += buf.0.bytes;
                    tensors.insert(n.clone(), DeviceTensor { ptr: buf.0.ptr + buf.1 as u64, ty: w.ty, ne: w.ne.to_vec(), bytes: w.bytes.len() });
                    blocks.push(buf.0);
                }
            }
            Placement::Packed => {
                let mut offsets = Vec::new();
                let mut at = 0;
                for n in &names {
                    offsets.push(at);
                    at = round_up(at + view(weights, n)?.bytes.len(), PACKED_ALIGN);
                }
                let arena = dev.alloc(at)?;
                for (n, &off) in names.iter().zip(&offsets) {
                    let w = view(weights, n)?;
                    arena.write(off, w.bytes)?;
                    tensors.insert(n.clone(), DeviceTensor { ptr: arena.ptr + off as u64, ty: w.ty, ne: w.ne.to_vec(), bytes: w.bytes.len() });
                }
                total += arena.bytes;
                blocks.push(arena);
            }
        }
        let mut vectors = HashMap::new();
        for n in &vec_names {
            let host: Vec<f32> = view(weights, n)?.to_vec();
            vectors.insert(n.clone(), (dev.upload(&host)?, host));
        }
        Ok(DeviceWeights { tensors, vectors, _blocks: blocks, bytes: total })
    }

    pub fn tensor(&self, name: &str) -> Result<&DeviceTensor, CudaError> {
        self.tensors.get(name).ok_or_else(|| CudaError(format!("weight {name} was not uploaded")))
    }

    pub fn vector(&self, name: &str) -> Result<&(DeviceBuf, Vec<f32>), CudaError> {
        self.vectors.get(name).ok_or_else(|| CudaError(format!("weight {name} was not uploaded as a vector")))
    }
}

/// An allocation of at least `bytes` whose returned offset is 2 MiB-aligned: sized in
/// whole 2 MiB units (the driver then hands out 2 MiB-aligned addresses); one more unit
/// if it did not.
fn aligned_alloc(dev: &Arc<Device>, bytes: usize) -> Result<(DeviceBuf, usize), CudaError> {
    let size = round_up(bytes.max(1), TENSOR_ALIGN);
    let buf = dev.alloc(size)?;
    if (buf.ptr as usize).is_multiple_of(TENSOR_ALIGN) {
        return Ok((buf, 0));
    }
    drop(buf);
    let buf = dev.alloc(size + TENSOR_ALIGN)?;
    let off = round_up(buf.ptr as usize, TENSOR_ALIGN) - buf.ptr as usize;
    Ok((buf, off))
}
