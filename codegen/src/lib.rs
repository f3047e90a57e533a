//! ds4-codegen: kernel IR (`ds4_ir::kir`) to source text for every target.
//!
//! One renderer (`render.rs`) walks the IR; each target module is a dialect that only
//! spells syntax and intrinsics. `render(kernel, target)` is the whole interface; WGSL
//! output can be checked with [`validate_wgsl`].

pub mod cpu;
pub mod cuda;
pub mod cuda_attention;
pub mod cuda_attention_merge;
pub mod cuda_digits;
pub mod cuda_hc_expand;
pub mod cuda_hc_mix;
pub mod cuda_f16_vec;
pub mod cuda_hc_pre;
pub mod cuda_indexer_scores;
pub mod cuda_norm_rope;
pub mod cuda_router;
pub mod cuda_argmax;
pub mod cuda_copy;
pub mod cuda_top_k;
pub mod cuda_top_k_radix;
pub mod manifest;
pub mod metal;
pub mod quant;
pub mod render;
pub mod text_kernels;
pub mod wgsl;

use ds4_ir::kir::Kernel;
use std::fmt;

/// A code generation target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Cpu,
    CudaSm90,
    CudaSm120,
    Wgsl,
    Metal,
}

impl Target {
    pub const ALL: [Target; 5] = [Target::Cpu, Target::CudaSm90, Target::CudaSm120, Target::Wgsl, Target::Metal];

    /// One of the CUDA dialects.
    pub fn is_cuda(self) -> bool {
        matches!(self, Target::CudaSm90 | Target::CudaSm120)
    }

    /// The target's name on the command line (`cpu`, `cuda-sm90`, `cuda-sm120`, `wgsl`, `metal`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::CudaSm90 => "cuda-sm90",
            Target::CudaSm120 => "cuda-sm120",
            Target::Wgsl => "wgsl",
            Target::Metal => "metal",
        }
    }

    /// Parses a name as printed by [`Target::name`].
    pub fn parse(s: &str) -> Result<Target, UnknownTarget> {
        Target::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| UnknownTarget(s.to_string()))
    }

    /// File extension of the generated source.
    pub fn extension(self) -> &'static str {
        match self {
            Target::Cpu => "rs",
            Target::CudaSm90 | Target::CudaSm120 => "cu",
            Target::Wgsl => "wgsl",
            Target::Metal => "metal",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Target {
    type Err = UnknownTarget;
    fn from_str(s: &str) -> Result<Target, UnknownTarget> {
        Target::parse(s)
    }
}

/// A target name that is not one of [`Target::ALL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownTarget(pub String);

impl fmt::Display for UnknownTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
        write!(f, "unknown target `{}` (expected one of: {})", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownTarget {}

/// Threads per block (workgroup) a kernel is launched with on `target`: a block per item,
/// of [`render::PAR_THREADS`] where its `'par`/`'sum` loops run in parallel (fewer when
/// every such loop has a known, smaller trip count: [`render::par_trips`]), else one.
pub fn block_threads(kernel: &Kernel, target: Target) -> u32 {
    let parallel = match target {
        Target::CudaSm90 | Target::CudaSm120 => render::runs_parallel(&cuda::Cuda { sm: 90 }, kernel),
        _ => false,
    };
    if !parallel {
        return 1;
    }
    match render::par_trips(kernel) {
        // Whole warps; threads past every loop's end would only wait at its barriers
        // (hadamard_fp4's 128 values at 512 threads: a quarter of the block worked).
        Some(most) => (most.div_ceil(32).max(1) * 32).min(render::PAR_THREADS as u64) as u32,
        None => render::PAR_THREADS,
    }
}

/// Whether `kernel` may be launched with several blocks per item on `target` (grid
/// `[items, splits, 1]`, see [`render::splits_items`]); elsewhere the grid's y is 1.
pub fn splits_items(kernel: &Kernel, target: Target) -> bool {
    match target {
        Target::CudaSm90 | Target::CudaSm120 => render::splits_items(&cuda::Cuda { sm: 90 }, kernel),
        _ => false,
    }
}

/// Whether `kernel` on `target` works on its item's output in dynamic shared memory when
/// the launch gives it `out_len · 4` bytes (at most [`cuda::STAGE_OUT_LIMIT`]).
pub fn stages_output(kernel: &Kernel, target: Target) -> bool {
    target.is_cuda() && cuda::stages_output(kernel)
}

pub fn render(kernel: &Kernel, target: Target) -> String {
    match target {
        Target::Cpu => render::render_kernel(&cpu::Cpu, kernel),
        Target::CudaSm90 | Target::CudaSm120 => render::render_kernel(&cuda::Cuda::of(target).expect("a CUDA target"), kernel),
        Target::Wgsl => render::render_kernel(&wgsl::Wgsl, kernel),
        Target::Metal => render::render_kernel(&metal::Metal, kernel),
    }
}

/// Parses and validates WGSL with naga, as wgpu will; the error names the line.
#[cfg(feature = "naga")]
pub fn validate_wgsl(source: &str) -> Result<naga::Module, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    Ok(module)
}
