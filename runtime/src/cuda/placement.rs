//! Weight placement: the graph's tensors on the device, as raw GGUF bytes.
//!
//! By default every tensor gets its own allocation starting on a 2 MiB boundary (a
//! large page: a tensor never shares a page, or its TLB entries, with another, and a
//! tensor's blocks start aligned), except the weights of mat-vecs that read the same x:
//! those share one, back to back, so that decode runs them as one launch
//! (`matvec_groups.rs`). `Placement::Packed` puts them all in one allocation,
//! 256-byte aligned, for small models or tight memory. Small float vectors (norm
//! weights, biases, sinks, the compressor's positional bias) are also kept
//! de-quantized in f32 on the device: the kernels read them as floats, as the CPU
//! executor does.

use super::device::{bytes_text, CudaError, Device, DeviceBuf};
use crate::weights::Weights;
use ds4_codegen::Target;
use ds4_ir::{GgmlType, Graph, Op};
use ds4_ir::quant::Regroup;
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
    /// Small vectors in f32.
    pub vectors: HashMap<String, DeviceBuf>,
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

/// Weight `n` of the file, or the error that names it.
fn view<'w>(weights: &'w Weights, n: &'w str) -> Result<crate::weights::WeightView<'w>, CudaError> {
    weights.get(n).ok_or_else(|| CudaError(format!("weight {n} is not in the model file")))
}

fn round_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// Whether weights of `need` bytes (as the placement lays them out; `packed`: in one
/// allocation) fit in the `free` bytes of device memory that `device` (of `total` bytes)
/// has: else the error says what the model needs, what the device has and what to do.
fn fits(need: usize, packed: usize, free: usize, total: usize, device: &str) -> Result<(), CudaError> {
    if need <= free {
        return Ok(());
    }
    let pack = if packed < need && packed <= free { format!(" or packed in one allocation (--pack-weights: {})", bytes_text(packed)) } else { String::new() };
    Err(CudaError(format!(
        "the model's weights need {} of device memory and the {device} has {} free (of {}): nothing was uploaded; run it on a GPU with more memory{pack}, or on the CPU (--backend cpu)",
        bytes_text(need),
        bytes_text(free),
        bytes_text(total)
    )))
}

/// A weight in the upload's plan: its name, its device type and its bytes in it
/// (`on_device`).
pub struct Planned {
    pub name: String,
    pub ty: GgmlType,
    pub bytes: usize,
}

/// How `DeviceWeights::upload` lays out a model's weights: its allocations (each a list of
/// weights, in order), the 1-D weights the ops read as f32 vectors (`vectors`, uploaded
/// apart as f32), and the device bytes the allocations take as `placement` lays them out
/// (`need`) and packed in one allocation (`packed`). Made once, before anything is
/// uploaded, so that a model the device cannot hold is refused first (`check_fits`).
pub struct WeightPlan {
    pub placement: Placement,
    pub allocations: Vec<Vec<Planned>>,
    pub vectors: BTreeSet<String>,
    pub need: usize,
    pub packed: usize,
}

impl WeightPlan {
    /// The plan for the weights of `graphs` (their union) on `target`.
    pub fn of(weights: &Weights, graphs: &[&Graph], placement: Placement, target: Target) -> Result<WeightPlan, CudaError> {
        let names: BTreeSet<String> = graphs.iter().flat_map(|g| g.weights().into_iter().map(|(n, _)| n.to_string())).collect();
        // Each weight's device type and bytes, once.
        let sized: HashMap<&str, (GgmlType, usize)> = names.iter().map(|n| Ok((n.as_str(), on_device(&view(weights, n)?, target)))).collect::<Result<_, CudaError>>()?;
        let groups: Vec<Vec<String>> = match placement {
            Placement::PerTensor => {
                // Weights of mat-vecs that read the same x back to back, one allocation a
                // group (`matvec_groups.rs`); every other tensor in its own.
                let type_of = |n: &str| Some((sized.get(n)?.0, weights.get(n)?.ne[0]));
                let mut groups: Vec<Vec<String>> = Vec::new();
                let mut placed = BTreeSet::new();
                for g in graphs {
                    for group in super::matvec_groups::weight_groups(g, &type_of) {
                        if group.iter().all(|n| !placed.contains(n)) {
                            placed.extend(group.iter().cloned());
                            groups.push(group);
                        }
                    }
                }
                groups.extend(names.iter().filter(|n| !placed.contains(*n)).map(|n| vec![n.clone()]));
                groups
            }
            Placement::Packed => vec![names.iter().cloned().collect()],
        };
        let allocations: Vec<Vec<Planned>> = groups
            .into_iter()
            .map(|g| {
                g.into_iter()
                    .map(|name| {
                        let &(ty, bytes) = sized.get(name.as_str()).ok_or_else(|| CudaError(format!("weight {name} is not among the graphs' weights")))?;
                        Ok(Planned { name, ty, bytes })
                    })
                    .collect::<Result<_, CudaError>>()
            })
            .collect::<Result<_, _>>()?;
        // The bytes the upload allocates (`offsets`, `aligned_bytes`), and packed.
        let packed = offsets(allocations.iter().flatten(), Placement::Packed).1;
        let need = match placement {
            Placement::PerTensor => allocations.iter().map(|a| aligned_bytes(offsets(a, placement).1)).sum(),
            Placement::Packed => packed,
        };
        let mut vectors = BTreeSet::new();
        for g in graphs {
            for id in g.order() {
                let ins = g.inputs(id);
                for &i in vector_inputs(&g.node(id).op) {
                    if let Op::Weight { name, .. } = &g.node(ins[i]).op {
                        vectors.insert(name.clone());
                    }
                }
            }
        }
        Ok(WeightPlan { placement, allocations, vectors, need, packed })
    }

    /// Whether the plan's weights fit in `dev`'s free memory: else the error that says
    /// what they need, what the device has and what to do.
    pub fn check_fits(&self, dev: &Device) -> Result<(), CudaError> {
        let (free, total) = dev.memory()?;
        fits(self.need, self.packed, free, total, &dev.name)
    }
}

impl DeviceWeights {
    /// Uploads the weights as `plan` lays them out (the caller has checked that they fit:
    /// `WeightPlan::check_fits`).
    /// `generate`: tensors made in device memory from random data instead of copied from
    /// the file (`ds4 bench --synthetic`, whose file leaves them as zeros).
    /// Each tensor in its device type on `target` (`ds4_codegen::quant::device_type`:
    /// Q8_0 rows regrouped as Q8_0_R, the same size; IQ2_XXS as IQ2_XXS_R, 72 bytes a
    /// block where the file has 66).
    pub fn upload(dev: &Arc<Device>, weights: &Weights, plan: &WeightPlan, generate: &BTreeSet<String>) -> Result<DeviceWeights, CudaError> {
        let mut tensors = HashMap::new();
        let mut blocks = Vec::new();
        let mut tiles = HashMap::new();
        let mut total = 0;
        for group in &plan.allocations {
            let (offsets, at) = offsets(group, plan.placement);
            let (buf, base) = match plan.placement {
                Placement::PerTensor => aligned_alloc(dev, at)?,
                Placement::Packed => (dev.alloc_owned(at)?, 0),
            };
            for (p, off) in group.iter().zip(offsets) {
                let w = view(weights, &p.name)?;
                fill(&buf, base + off, &w, p.ty, p.bytes, generate.contains(&p.name), &mut tiles)?;
                tensors.insert(p.name.clone(), DeviceTensor { ptr: buf.ptr + (base + off) as u64, ty: p.ty, ne: w.ne.to_vec(), bytes: p.bytes });
            }
            total += buf.bytes;
            blocks.push(buf);
        }
        let mut vectors = HashMap::new();
        for n in &plan.vectors {
            let host: Vec<f32> = view(weights, n)?.to_vec();
            vectors.insert(n.clone(), dev.upload(&host)?);
        }
        Ok(DeviceWeights { tensors, vectors, _blocks: blocks, bytes: total })
    }

    pub fn tensor(&self, name: &str) -> Result<&DeviceTensor, CudaError> {
        self.tensors.get(name).ok_or_else(|| CudaError(format!("weight {name} was not uploaded")))
    }

    pub fn vector(&self, name: &str) -> Result<&DeviceBuf, CudaError> {
        self.vectors.get(name).ok_or_else(|| CudaError(format!("weight {name} was not uploaded as a vector")))
    }
}

/// Each weight's byte offset in its allocation, and the bytes the allocation holds: back to
/// back in a (2 MiB-aligned) allocation of its group, or at 256-byte offsets in the one
/// packed allocation.
fn offsets<'p>(group: impl IntoIterator<Item = &'p Planned>, placement: Placement) -> (Vec<usize>, usize) {
    let align = match placement {
        Placement::PerTensor => 1,
        Placement::Packed => PACKED_ALIGN,
    };
    let mut at = 0;
    let offsets = group
        .into_iter()
        .map(|w| {
            let off = at;
            at = round_up(at + w.bytes, align);
            off
        })
        .collect();
    (offsets, at)
}

/// Blocks regrouped at a time on the host (`regroup`): 2^18, 17-18 MiB of either layout.
const REGROUP_BLOCKS: usize = 1 << 18;

/// Weight `w` on `target`'s devices: its device type (`ds4_codegen::quant::device_type`),
/// and its bytes in it (its file's, or as many rows of the device layout).
fn on_device(w: &crate::weights::WeightView, target: Target) -> (GgmlType, usize) {
    let row_len = w.ne.first().copied().unwrap_or(1);
    let ty = ds4_codegen::quant::device_type(target, w.ty, row_len);
    if ty == w.ty {
        return (ty, w.bytes.len());
    }
    let rows: u64 = w.ne.iter().skip(1).product();
    (ty, (rows * ty.bytes_for(row_len).unwrap_or(0)) as usize)
}

/// How a file's bytes become device layout `ty` (`ds4_ir::quant::regrouped_from`): the
/// regroup, and the file's bytes for one block of `ty` (Q8_0_R: two Q8_0 blocks, the same
/// 68 bytes; IQ2_XXS_R: one IQ2_XXS block, 66 bytes, where it has 72). None for a type
/// that is no device layout.
fn regroup_of(ty: GgmlType) -> Option<(Regroup, usize)> {
    let (file, regroup) = ds4_ir::quant::regrouped_from(ty)?;
    Some((regroup, ty.block_elems() / file.block_elems() * file.block_bytes()))
}

/// `src` (whole blocks of a file's type, `from` bytes to each block of `ty`) into `dst` by
/// `one`, split over the host's cores: IQ2_XXS's 47 GB of experts in DeepSeek-V4-Flash are
/// regrouped at upload.
fn regroup(one: Regroup, from: usize, ty: GgmlType, src: &[u8], dst: &mut [u8]) -> Result<(), ds4_ir::quant::QuantError> {
    let to = ty.block_bytes();
    // A partial block or a destination of another length: the one-call regroup says which
    // (split, the threads' zip would drop a partial tail).
    if !src.len().is_multiple_of(from) || dst.len() != src.len() / from * to {
        return one(src, dst);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    let per = (dst.len() / to).div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        let jobs: Vec<_> = src.chunks(per * from).zip(dst.chunks_mut(per * to)).map(|(s, d)| sc.spawn(move || one(s, d))).collect();
        jobs.into_iter().try_for_each(|j| j.join().expect("a regroup thread does not panic"))
    })
}

/// Puts tensor `w` at byte `at` of `buf` as `n` bytes of its device type `ty`
/// (`on_device`): its bytes from the file (Q8_0 and IQ2_XXS regrouped, a chunk at a time), or
/// (`random`) a tile of random blocks of the device type, quantized here once per type
/// (`tiles`) and repeated over the tensor by device copies, so that a full-size synthetic
/// model costs no host memory and no upload. The tile (256 KiB) is small next to any
/// tensor it fills and next to the L2 cache, so repetition does not flatter the
/// bandwidth; it is small because some quantizers (IQ2_XXS: seconds per MiB) are slow.
fn fill(buf: &DeviceBuf, at: usize, w: &crate::weights::WeightView, ty: GgmlType, n: usize, random: bool, tiles: &mut HashMap<GgmlType, Vec<u8>>) -> Result<(), CudaError> {
    if !random {
        if ty == w.ty {
            return buf.write(at, w.bytes);
        }
        let (one, src_unit) = regroup_of(ty).ok_or_else(|| CudaError(format!("{}: no regroup from {} to {ty}", w.name, w.ty)))?;
        // Whole blocks of both layouts a chunk.
        let dst_unit = ty.block_bytes();
        let mut host = vec![0u8; (REGROUP_BLOCKS * dst_unit).min(n)];
        for (i, src) in w.bytes.chunks(REGROUP_BLOCKS * src_unit).enumerate() {
            let dst = &mut host[..src.len() / src_unit * dst_unit];
            regroup(one, src_unit, ty, src, dst).map_err(|e| CudaError(format!("{}: {e}", w.name)))?;
            buf.write(at + i * REGROUP_BLOCKS * dst_unit, dst)?;
        }
        return Ok(());
    }
    if let std::collections::hash_map::Entry::Vacant(e) = tiles.entry(ty) {
        e.insert(random_tile(ty).map_err(|e| CudaError(format!("{}: cannot make random {ty} data: {e}", w.name)))?);
    }
    let tile = &tiles[&ty];
    let first = tile.len().min(n);
    buf.write(at, &tile[..first])?;
    // Doubling copies: [0, len) to [len, 2·len), then the remainder (all whole blocks).
    let mut have = first;
    while have < n {
        let k = have.min(n - have);
        buf.copy_from(at + have, buf, at, k)?;
        have += k;
    }
    Ok(())
}

/// About 256 KiB of whole blocks of `ty` holding zero-mean, weight-sized random values.
fn random_tile(ty: GgmlType) -> Result<Vec<u8>, ds4_ir::quant::QuantError> {
    let (blk_elems, blk_bytes) = (ty.block_elems(), ty.block_bytes());
    let blocks = ((256 << 10) / blk_bytes).max(1);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = || {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
    };
    let vals: Vec<f32> = (0..blocks * blk_elems).map(|_| (uniform() + uniform() - 1.0) * 0.05).collect();
    let mut tile = vec![0u8; blocks * blk_bytes];
    ds4_ir::quant::quantize_row(ty, &vals, &mut tile)?;
    Ok(tile)
}

/// The bytes of a 2 MiB-aligned allocation holding `bytes` (`aligned_alloc`).
fn aligned_bytes(bytes: usize) -> usize {
    round_up(bytes.max(1), TENSOR_ALIGN)
}

/// An allocation of at least `bytes` whose returned offset is 2 MiB-aligned: sized in
/// whole 2 MiB units (the driver then hands out 2 MiB-aligned addresses); one more unit
/// if it did not.
fn aligned_alloc(dev: &Arc<Device>, bytes: usize) -> Result<(DeviceBuf, usize), CudaError> {
    let size = aligned_bytes(bytes);
    let buf = dev.alloc_owned(size)?;
    if (buf.ptr as usize).is_multiple_of(TENSOR_ALIGN) {
        return Ok((buf, 0));
    }
    drop(buf);
    let buf = dev.alloc_owned(size + TENSOR_ALIGN)?;
    let off = round_up(buf.ptr as usize, TENSOR_ALIGN) - buf.ptr as usize;
    Ok((buf, off))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upload's regroup, split over threads, is the one-call regroup of the whole
    /// input, for both device layouts and a block count no thread count divides.
    #[test]
    fn threaded_regroup_is_the_whole_regroup() {
        for ty in [GgmlType::Q8_0R, GgmlType::Iq2XxsR] {
            let (one, from) = regroup_of(ty).unwrap();
            let blocks = 1009;
            let src: Vec<u8> = (0..blocks * from).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
            let mut whole = vec![0u8; blocks * ty.block_bytes()];
            one(&src, &mut whole).unwrap();
            let mut split = vec![0u8; whole.len()];
            regroup(one, from, ty, &src, &mut split).unwrap();
            assert!(split == whole, "{ty}");
            // A partial block is an error, not a short copy, however the work splits.
            assert!(regroup(one, from, ty, &src[..from * 3 + 1], &mut split[..ty.block_bytes() * 3]).is_err(), "{ty}");
            assert!(regroup(one, from, ty, &src[..from * 40 + 1], &mut split[..ty.block_bytes() * 40]).is_err(), "{ty}");
            assert!(regroup(one, from, ty, &src[..from * 40], &mut split[..ty.block_bytes() * 39]).is_err(), "{ty}");
        }
        assert!(regroup_of(GgmlType::Q8_0).is_none() && regroup_of(GgmlType::Iq2Xxs).is_none());
    }

    /// The upload's plan on the tiny q2 model: every weight in exactly one allocation, in
    /// its device type and bytes; per tensor each allocation whole 2 MiB units of its
    /// tensors' device bytes, packed one allocation of them at 256-byte offsets (so never
    /// more than per tensor).
    #[test]
    fn plan_places_every_weight_once() {
        let model = crate::cuda::tiny_q2();
        let graphs = [&model.graph, &model.graph_plain];
        let target = Target::CudaSm90;
        let names: BTreeSet<String> = graphs.iter().flat_map(|g| g.weights().into_iter().map(|(n, _)| n.to_string())).collect();
        let bytes = |n: &str| on_device(&model.weights.get(n).unwrap(), target).1;
        for placement in [Placement::PerTensor, Placement::Packed] {
            let plan = WeightPlan::of(&model.weights, &graphs, placement, target).unwrap();
            let placed: Vec<&Planned> = plan.allocations.iter().flatten().collect();
            assert_eq!(placed.len(), names.len(), "{placement:?}: a weight placed twice or not at all");
            assert_eq!(placed.iter().map(|w| w.name.as_str()).collect::<BTreeSet<_>>(), names.iter().map(|n| n.as_str()).collect(), "{placement:?}");
            for w in &placed {
                assert_eq!((w.ty, w.bytes), on_device(&model.weights.get(&w.name).unwrap(), target), "{placement:?}: {}", w.name);
            }
            assert_eq!(plan.packed, names.iter().map(|n| round_up(bytes(n), PACKED_ALIGN)).sum::<usize>(), "{placement:?}");
            match placement {
                Placement::PerTensor => {
                    assert_eq!(plan.need, plan.allocations.iter().map(|g| round_up(g.iter().map(|w| bytes(&w.name)).sum::<usize>().max(1), TENSOR_ALIGN)).sum::<usize>());
                    assert!(plan.need > plan.packed && plan.need.is_multiple_of(TENSOR_ALIGN));
                }
                Placement::Packed => assert_eq!((plan.allocations.len(), plan.need), (1, plan.packed)),
            }
        }
    }

    /// A group's weights back to back per tensor; at 256-byte offsets packed, the
    /// allocation ending on one.
    #[test]
    fn offsets_back_to_back_or_packed() {
        let w = |bytes| Planned { name: String::new(), ty: GgmlType::F32, bytes };
        let group = [w(100), w(68), w(4096), w(1)];
        assert_eq!(offsets(&group, Placement::PerTensor), (vec![0, 100, 168, 4264], 4265));
        assert_eq!(offsets(&group, Placement::Packed), (vec![0, 256, 512, 4608], 4864));
        assert_eq!(offsets(&[], Placement::Packed), (vec![], 0));
    }

    /// A model that fits is let through; one that does not is refused with what it needs,
    /// what the device has, and `--pack-weights` only where packing would fit.
    #[test]
    fn fits_says_what_the_model_needs_and_the_device_has() {
        const GB: usize = 1_000_000_000;
        assert!(fits(80 * GB, 79 * GB, 100 * GB, 141 * GB, "H200").is_ok());
        assert!(fits(140 * GB, 140 * GB, 140 * GB, 141 * GB, "H200").is_ok());
        let e = fits(86_700_000_000, 86_650_000_000, 79_100_000_000, 79_600_000_000, "NVIDIA H100 80GB HBM3").unwrap_err().to_string();
        for part in ["86.70 GB of device memory", "NVIDIA H100 80GB HBM3 has 79.10 GB free (of 79.60 GB)", "nothing was uploaded", "--backend cpu"] {
            assert!(e.contains(part), "{part:?} not in: {e}");
        }
        assert!(!e.contains("--pack-weights"), "packing would not fit either: {e}");
        let e = fits(80 * GB, 78 * GB, 79 * GB, 80 * GB, "H100").unwrap_err().to_string();
        assert!(e.contains("--pack-weights: 78.00 GB"), "{e}");
        let e = fits(327_155_712, 7_961_600, 164_800_000, 150_110_000_000, "H200").unwrap_err().to_string();
        assert!(e.contains("need 327.2 MB of device memory and the H200 has 164.8 MB free (of 150.11 GB)") && e.contains("--pack-weights: 8.0 MB"), "{e}");
    }
}
