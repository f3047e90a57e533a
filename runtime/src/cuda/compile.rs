//! Run-time compilation: the generated CUDA C++ of every kernel a graph needs, through
//! NVRTC, into loaded functions with their parameter lists.
//!
//! The sources are exactly what `ds4 gen --target cuda-sm90|cuda-sm120` writes (the same
//! `ds4_codegen::manifest` set: op kernels, the CUDA-only `attention_tiled`, quant
//! kernels). Compiled without FMA contraction: quant de-quantization stays bit-identical
//! to the CPU's, and op kernels round like the CPU's f32 code (explicit `fmaf`, as in
//! `attention_tiled`, still fuses).

use super::device::{CudaError, Device};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::CudaFunction;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use ds4_codegen::text_kernels::TextParams;
use ds4_codegen::manifest::KernelSet;
use ds4_codegen::quant::{self, QParam, QuantKernelKind};
use ds4_codegen::Target;
use ds4_ir::kir::{Kernel, ParamKind, Ty};
use ds4_ir::GgmlType;
use std::collections::HashMap;

/// How a generated kernel takes its arguments.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamSig {
    /// A device pointer.
    Ptr,
    U64,
    I32,
    F32,
    Bool,
}

/// A loaded kernel: its function and parameter names and kinds, in order.
pub struct Loaded {
    pub func: CudaFunction,
    pub params: Vec<(String, ParamSig)>,
    /// Threads per block the kernel is written for.
    pub threads: u32,
    /// A generated op kernel: its loops stride by the block, so a launch may give it any
    /// whole number of warps (`exec/matvec.rs`, `op_threads`); the others take `threads`.
    pub any_block: bool,
    /// The most threads a block of it can have: its registers' limit (at most 1024) for an
    /// `any_block` kernel, else `threads`.
    pub max_threads: u32,
    /// An item may be spread over several blocks along y (`ds4_codegen::splits_items`).
    pub splits_items: bool,
    /// Works on its item's output in dynamic shared memory when a launch gives it room
    /// (`ds4_codegen::stages_output`).
    pub stages_out: bool,
    /// Bytes of dynamic shared memory a launch gives it (`QuantKernel::dynamic_shared`).
    pub dyn_shared: u32,
    /// The most dynamic shared memory this device lets a launch of it ask for
    /// ([`shared_room`]): `dyn_shared` where the device has the room.
    pub shared_room: u32,
    /// Reads x's bf16 parts, made first by `split_x_bf16x3` (`QuantKernel::reads_x_parts`,
    /// `x_parts.rs`).
    pub reads_x_parts: bool,
}

impl Loaded {
    /// Dynamic shared memory for a launch over items of `out_len` floats: room for the
    /// item's output where the kernel stages it (at most `STAGE_OUT_LIMIT` bytes), else
    /// the kernel's own.
    pub fn shared_for(&self, out_len: usize) -> u32 {
        if self.stages_out && out_len * 4 <= ds4_codegen::cuda::STAGE_OUT_LIMIT {
            (out_len * 4) as u32
        } else {
            self.dyn_shared
        }
    }
}

/// Every compiled kernel, by entry-point name.
pub struct Kernels {
    pub by_name: HashMap<String, Loaded>,
    pub target: Target,
}

/// The dynamic shared memory a kernel that wants `wanted` bytes may ask for on a device
/// that gives a block `optin` bytes at most, `fixed` of them the kernel's static shared
/// memory. Where that is less than `wanted` (the top-k sort's 128 KiB or the routing's 192
/// KiB on a device of 99 KiB a block), the launches that need more take their fallbacks
/// (`GpuExecutor::has_room`), and the kernel still loads.
pub fn shared_room(wanted: u32, optin: u32, fixed: u32) -> u32 {
    wanted.min(optin.saturating_sub(fixed))
}

/// The dialect for a compute capability.
pub fn target_for(sm: u32) -> Target {
    if sm >= 120 {
        Target::CudaSm120
    } else {
        Target::CudaSm90
    }
}

fn op_params(k: &Kernel) -> Vec<(String, ParamSig)> {
    k.params
        .iter()
        .map(|p| {
            let sig = match p.kind {
                ParamKind::Buffer { .. } => ParamSig::Ptr,
                ParamKind::Scalar { ty: Ty::Usize } => ParamSig::U64,
                ParamKind::Scalar { ty: Ty::I32 } => ParamSig::I32,
                ParamKind::Scalar { ty: Ty::F } => ParamSig::F32,
                ParamKind::Scalar { ty: Ty::Bool } => ParamSig::Bool,
            };
            (p.name.clone(), sig)
        })
        .collect()
}

fn quant_params(params: &[QParam]) -> Vec<(String, ParamSig)> {
    params
        .iter()
        .map(|p| match p {
            QParam::Buffer { name, .. } => (name.to_string(), ParamSig::Ptr),
            QParam::Scalar { name } => (name.to_string(), ParamSig::U64),
            QParam::Float { name } => (name.to_string(), ParamSig::F32),
        })
        .collect()
}

/// One source to compile.
struct Unit {
    name: String,
    any_block: bool,
    source: String,
    params: Vec<(String, ParamSig)>,
    threads: u32,
    splits_items: bool,
    stages_out: bool,
    dyn_shared: u32,
    reads_x_parts: bool,
}

impl Unit {
    /// A CUDA-text kernel with its own block layout: `threads` a block, one item a block,
    /// `dyn_shared` bytes of dynamic shared memory.
    fn fixed(name: &str, source: String, params: Vec<(String, ParamSig)>, threads: u32, dyn_shared: u32) -> Unit {
        Unit { name: name.into(), any_block: false, source, params, threads, splits_items: false, stages_out: false, dyn_shared, reads_x_parts: false }
    }
}

impl Kernels {
    /// Compiles `set` for `dev` (in parallel: NVRTC is thread-safe).
    pub fn compile(dev: &Device, set: &KernelSet) -> Result<Kernels, CudaError> {
        let target = target_for(dev.sm);
        let mut units = Vec::new();
        for k in ds4_ir::kernels::all() {
            if set.ops.contains_key(&k.name) {
                units.push(Unit {
                    name: k.name.clone(),
                    any_block: true,
                    source: ds4_codegen::render(&k, target),
                    params: op_params(&k),
                    threads: ds4_codegen::block_threads(&k, target),
                    splits_items: ds4_codegen::splits_items(&k, target),
                    stages_out: ds4_codegen::stages_output(&k, target),
                    dyn_shared: 0,
                    reads_x_parts: false,
                });
            }
        }
        // The CUDA-text kernels the set names, from their one list.
        let text = ds4_codegen::text_kernels::all();
        for name in set.cuda.keys() {
            let k = text.iter().find(|k| k.name == *name).ok_or_else(|| CudaError(format!("{name}: not a CUDA-text kernel")))?;
            let source = k.source(target).ok_or_else(|| CudaError(format!("{target}: no {name}")))?;
            let params = match &k.params {
                TextParams::Contract(contract) => op_params(contract),
                TextParams::Own(own) => quant_params(own),
            };
            units.push(Unit::fixed(k.name, source, params, k.threads, k.dyn_shared));
        }
        for &(kind, t) in set.quant.keys() {
            if !kind.available(target) {
                continue;
            }
            units.push(quant_unit(kind, t, target)?);
        }
        let arch = format!("--gpu-architecture=compute_{}", dev.sm);
        let ptx: Vec<Result<cudarc::nvrtc::Ptx, CudaError>> = std::thread::scope(|s| {
            let handles: Vec<_> = units
                .iter()
                .map(|u| {
                    let arch = arch.clone();
                    s.spawn(move || {
                        let opts = CompileOptions { fmad: Some(false), options: vec![arch], name: Some(format!("{}.cu", u.name)), ..Default::default() };
                        compile_ptx_with_opts(&u.source, opts).map_err(|e| CudaError(format!("NVRTC failed on {}: {e:?}", u.name)))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(CudaError("NVRTC thread panicked".into())))).collect()
        });
        let mut by_name = HashMap::new();
        dev.bind()?;
        for (u, p) in units.into_iter().zip(ptx) {
            let module = dev.ctx.load_module(p?)?;
            let func = module.load_function(&u.name)?;
            let shared_room = match u.dyn_shared {
                0 => 0,
                wanted => {
                    // Past 48 KiB a kernel must ask for its dynamic shared memory, and the
                    // device bounds what it may ask for.
                    let room = shared_room(wanted, dev.shared_optin, func.shared_size_bytes()?.max(0) as u32);
                    func.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, room as i32)?;
                    room
                }
            };
            let max_threads = if u.any_block { func.max_threads_per_block()? as u32 } else { u.threads };
            by_name.insert(u.name, Loaded { func, params: u.params, threads: u.threads, any_block: u.any_block, max_threads, splits_items: u.splits_items, stages_out: u.stages_out, dyn_shared: u.dyn_shared, shared_room, reads_x_parts: u.reads_x_parts });
        }
        Ok(Kernels { by_name, target })
    }

    pub fn get(&self, name: &str) -> Result<&Loaded, CudaError> {
        self.by_name.get(name).ok_or_else(|| CudaError(format!("kernel {name} was not compiled for this graph")))
    }
}

fn quant_unit(kind: QuantKernelKind, t: GgmlType, target: Target) -> Result<Unit, CudaError> {
    let spec = ds4_ir::quant::spec(t).ok_or_else(|| CudaError(format!("{t}: no quant declaration")))?;
    let k = quant::quant_kernel(spec, kind, target).map_err(|e| CudaError(e.to_string()))?;
    Ok(Unit { params: quant_params(&k.params), name: k.name, any_block: false, source: k.source, threads: k.threads, splits_items: false, stages_out: false, dyn_shared: k.dynamic_shared, reads_x_parts: k.reads_x_parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel gets what it wants where the device has the room, else the device's most
    /// less its static shared memory (never below zero).
    #[test]
    fn shared_room_is_what_the_device_leaves() {
        // Hopper: 227 KiB a block.
        assert_eq!(shared_room(196_608, 232_448, 1024), 196_608);
        // sm_120: 99 KiB a block.
        assert_eq!(shared_room(196_608, 101_376, 1024), 100_352);
        assert_eq!(shared_room(70_752, 101_376, 0), 70_752);
        assert_eq!(shared_room(4096, 1000, 2000), 0);
    }
}
