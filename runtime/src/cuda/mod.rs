//! The CUDA backend: the generated CUDA C++ of every kernel a graph needs (the kernel
//! bodies of `ds4_ir::kernels` and the quant kernels lowered from each `QuantSpec`, as
//! `ds4 gen --target cuda-*` writes them), compiled at run time with NVRTC and run
//! through the driver API, both loaded at run time: this module builds everywhere, and
//! [`probe`] tells a machine without a GPU or driver apart.
//!
//! - `device.rs`: context, allocations, copies, launches;
//! - `launch_plan.rs`: decode steps recorded and replayed as CUDA graphs;
//! - `compile.rs`: NVRTC, one module per kernel;
//! - `placement.rs`: weights as raw GGUF bytes, 2 MiB-aligned per tensor (or packed);
//! - `exec.rs`: the graph executor, `crate::exec`'s semantics on device buffers;
//! - `device_log.rs`: the stateful ops' logs in device memory (`crate::grow_log` over
//!   device buffers; the bookkeeping is `crate::slot_ops`, shared with the CPU);
//! - `expert_ids.rs`: the load-time check that lets a decode step skip reading expert ids;
//! - `fusion_plan.rs`: the fused launches a graph offers (`hc_pre.rs`, `norm_rope.rs`,
//!   `router.rs` find the chains), found once per graph;
//! - `profile.rs`: `DS4_PROFILE=1`, device time per op kind;
//! - `session.rs`: [`CudaBackend`] and [`CudaSession`] (feed / prefill / rewind);
//! - `backend_choice.rs`: `--backend cpu|cuda` for the CLI;
//! - `x_parts.rs`: x's bf16 parts for the tensor-core matmuls' element-term path.
//!
//! See docs/cuda-backend.md for why this is our own CUDA printer and not cubecl.

mod backend_choice;
mod compile;
mod device;
mod device_log;
mod exec;
mod expert_ids;
mod fusion_plan;
mod hc_pre;
mod norm_rope;
mod router;
mod matvec_groups;
pub mod launch_plan;
pub mod kernel_bench;
mod placement;
pub mod profile;
mod session;
pub mod x_parts;

pub use backend_choice::{AnySession, BackendKind};
pub use compile::{target_for, Kernels, Loaded};
pub use device::{launch, probe, Arg, CudaError, DevSlice, Device, DeviceBuf, MappedI32, Marker};
pub use device_log::DeviceLog;
pub use exec::{expert_groups, matvec_row_blocks, mma_k_slices, use_graphs};
pub use placement::{DeviceWeights, Placement, Planned, WeightPlan, PACKED_ALIGN, TENSOR_ALIGN};
pub use session::{CudaBackend, CudaOptions, CudaSession};
/// The kernel set and quant kernel names the backend compiles (from the codegen core).
pub use ds4_codegen::manifest::KernelSet;
/// The tiled attention kernel (CUDA text): its name, launch and limits.
pub use ds4_codegen::{cuda_argmax, cuda_attention, cuda_attention_merge, cuda_copy, cuda_digits, cuda_f16_vec, cuda_hc_mix, cuda_hc_pre, cuda_indexer_scores, cuda_norm_rope, cuda_router, cuda_top_k, cuda_top_k_radix};
pub use ds4_codegen::quant::{cuda_matvec_dense, kernel_name as quant_kernel_name, matvec_block_rows, matvec_reads_in_place, matvec_split_below, mma_k_unit, QuantKernelKind, TOKENS as MATMUL_TOKENS};
/// Rows and tokens of a tensor-core matmul tile.
pub const MMA_ROWS: usize = ds4_codegen::quant::MMA_ROWS as usize;
pub const MMA_TOKENS: usize = ds4_codegen::quant::MMA_TOKENS as usize;

/// The line tests print when they cannot run here.
pub fn skip_reason() -> Option<String> {
    match probe() {
        Ok(_) => None,
        Err(why) => Some(format!("skipped: no CUDA device ({why})")),
    }
}

/// The tiny golden model `tiny-q2` (`DS4_GOLDEN_DIR`, else ../shared/golden), for the
/// graph-level tests of the decode fusions (`hc_pre.rs`, `router.rs`, `matvec_groups.rs`).
#[cfg(test)]
pub(crate) fn tiny_q2() -> crate::Model {
    let dir = std::env::var_os("DS4_GOLDEN_DIR").map_or_else(|| std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden")), std::path::PathBuf::from);
    let path = dir.join("models/tiny-q2/model.gguf");
    crate::Model::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
