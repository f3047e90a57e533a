//! x's bf16 parts for a tensor-core matmul's element-term path: `split_x_bf16x3`
//! (`codegen/src/quant/cuda_split.rs`) runs once per matmul over the floats of x it reads,
//! and `matmul_mma_<type>` copies the parts into its tiles (`quant/cuda_mma.rs`). Whether
//! a kernel reads them is decided when it is generated (`Loaded::reads_x_parts`); types
//! on the TF32 path read x itself and need none (their three trailing arguments are
//! placeholders).

use super::compile::Loaded;
use super::device::{launch, Arg, CudaError, Device, DeviceBuf};
use ds4_codegen::quant::cuda_split;
use std::sync::Arc;

/// The split kernel's name.
pub use cuda_split::NAME as SPLIT_KERNEL;

/// Floats of x a matmul reads: its row offsets are `((p / x_div)·groups + r / ng)·k`
/// for rows p < m, so ceil(m / x_div)·groups rows of k.
pub fn x_len(m: usize, k: usize, groups: usize, x_div: usize) -> usize {
    m.div_ceil(x_div.max(1)) * groups * k
}

/// The split kernel's arguments, by name in launch order.
pub type SplitArgs = [(&'static str, Arg); 4];

/// The parts of `len` floats of x (`len` a multiple of 16).
pub struct XParts {
    pub planes: DeviceBuf,
    pub sums: DeviceBuf,
    pub len: usize,
}

impl XParts {
    /// Buffers for the parts of `len` floats (from the device's pool).
    pub fn alloc(dev: &Arc<Device>, len: usize) -> Result<XParts, CudaError> {
        if !len.is_multiple_of(16) {
            return Err(CudaError(format!("x's bf16 parts: {len} floats is not a multiple of 16")));
        }
        Ok(XParts { planes: dev.alloc(len * 2 * cuda_split::PARTS as usize)?, sums: dev.alloc(len / 16 * 4)?, len })
    }

    /// The split's grid and its arguments (by name, in launch order) for x at `x`.
    pub fn split_args(&self, x: u64) -> ((u32, u32, u32), SplitArgs) {
        let grid = (cuda_split::blocks(self.len) as u32, 1, 1);
        (grid, [("planes", Arg::Ptr(self.planes.ptr)), ("sums", Arg::Ptr(self.sums.ptr)), ("x", Arg::Ptr(x)), ("n", Arg::U64(self.len as u64))])
    }

    /// Launches `split` (the loaded `split_x_bf16x3`) over x at `x` into these parts, by
    /// itself (the executor goes through its own checked call instead).
    pub fn split(&self, dev: &Device, split: &Loaded, x: u64) -> Result<(), CudaError> {
        let (grid, named) = self.split_args(x);
        launch(dev, &split.func, grid, (split.threads, 1, 1), 0, &named.map(|(_, a)| a))
    }
}

/// The matmul's trailing arguments (by name, in launch order): the parts, or placeholders
/// (`dummy`) for a type that reads x itself.
pub fn mma_args(parts: Option<&XParts>, dummy: u64) -> [(&'static str, Arg); 3] {
    match parts {
        Some(p) => [("xp", Arg::Ptr(p.planes.ptr)), ("xs16", Arg::Ptr(p.sums.ptr)), ("xp_stride", Arg::U64(p.len as u64))],
        None => [("xp", Arg::Ptr(dummy)), ("xs16", Arg::Ptr(dummy)), ("xp_stride", Arg::U64(0))],
    }
}
