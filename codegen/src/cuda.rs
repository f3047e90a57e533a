//! CUDA C++ (compiled at run time with NVRTC, or offline with nvcc).
//!
//! Launch: one block per work item, `gridDim.x` = number of items; the item is
//! `blockIdx.x`. Arguments in param order: the output pointer, input pointers, then
//! scalars by value (`usize` = u64, `F` = f32, `bool` = 1 byte, `i32`).
//!
//! The block's threads share an item's `'par` and `'sum` loops where the body allows it
//! (`render::runs_parallel`, docs/cuda-backend.md "Threads per item"); otherwise one
//! thread computes the item and the others return at once.

use crate::render::{c_cast, c_declare, c_for, c_lit, call, escape_any, CXX_KEYWORDS, prec, Code, Dialect};
use std::fmt::Write as _;
use ds4_ir::kir::{Builtin, Elem, Function, Kernel, Lit, ParamKind, Ty};

/// The block-wide sum behind `'sum` loops: a warp shuffle tree, then the warps' sums by
/// a second shuffle tree in every warp (the same order every run: results are
/// reproducible; a butterfly adds each pair in both lanes alike, so every thread gets the
/// same total). The first barrier keeps a previous call's readers off `ds4_red` before it
/// is rewritten. (The warps' sums were added one after another by every thread, a chain of
/// 32 shared-memory loads: H200, `hc_pre`'s two sums of 1,024 threads 1.34 → 0.61 µs, the
/// launch 8.29 → 7.47 µs back to back; decode +1.2%.)
pub(crate) const BLOCK_SUM: &str = "__device__ float ds4_block_sum(float v) {
    __shared__ float ds4_red[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31u) == 0u) ds4_red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = (threadIdx.x & 31u) < ((blockDim.x + 31u) >> 5) ? ds4_red[threadIdx.x & 31u] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}
";

/// Two block-wide sums at once, each added exactly as [`BLOCK_SUM`] adds it: the two
/// shuffle trees side by side and one round through shared memory, two barriers where two
/// calls take four (`hc_pre`'s Σ x² and Σ w·x).
pub(crate) const BLOCK_SUM2: &str = "__device__ float2 ds4_block_sum2(float a, float b) {
    __shared__ float2 ds4_red2[32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    __syncthreads();
    if ((threadIdx.x & 31u) == 0u) ds4_red2[threadIdx.x >> 5] = make_float2(a, b);
    __syncthreads();
    const bool in = (threadIdx.x & 31u) < ((blockDim.x + 31u) >> 5);
    const float2 r = in ? ds4_red2[threadIdx.x & 31u] : make_float2(0.0f, 0.0f);
    float ta = r.x, tb = r.y;
    for (int o = 16; o > 0; o >>= 1) {
        ta += __shfl_xor_sync(0xffffffffu, ta, o);
        tb += __shfl_xor_sync(0xffffffffu, tb, o);
    }
    return make_float2(ta, tb);
}
";

pub struct Cuda {
    /// Compute capability, e.g. 90 or 120 (only named in the header for now).
    pub sm: u32,
}

impl Cuda {
    /// The dialect of a CUDA target (None for the others).
    pub fn of(target: crate::Target) -> Option<Cuda> {
        match target {
            crate::Target::CudaSm90 => Some(Cuda { sm: 90 }),
            crate::Target::CudaSm120 => Some(Cuda { sm: 120 }),
            _ => None,
        }
    }
}

/// CUDA names a body's local could collide with (besides `CXX_KEYWORDS`), plus the functions
/// this dialect calls (a local `expf` would hide `expf()`).
const RESERVED: &[&str] = &[
    "usize",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "expf",
    "logf",
    "sqrtf",
    "fabsf",
    "sinf",
    "cosf",
    "floorf",
    "ceilf",
    "log2f",
    "exp2f",
    "fmaxf",
    "fminf",
    "log1pf",
    "rintf",
    "ilogbf",
];

impl Dialect for Cuda {
    fn ty(&self, t: Ty) -> &'static str {
        match t {
            Ty::Usize => "usize",
            Ty::I32 => "int",
            Ty::F => "float",
            Ty::Bool => "bool",
        }
    }

    fn lit(&self, l: Lit) -> Code {
        c_lit(l, |negative| Code::atom(if negative { "__int_as_float(0xff800000)" } else { "__int_as_float(0x7f800000)" }))
    }

    fn cast(&self, to: Ty, arg: Code) -> Code {
        c_cast(self.ty(to), arg)
    }

    fn builtin(&self, f: Builtin, args: Vec<Code>) -> Code {
        let name = match f {
            Builtin::Exp => "expf",
            Builtin::Ln => "logf",
            Builtin::Sqrt => "sqrtf",
            Builtin::Abs => "fabsf",
            Builtin::Sin => "sinf",
            Builtin::Cos => "cosf",
            Builtin::Floor => "floorf",
            Builtin::Ceil => "ceilf",
            Builtin::Log2 => "log2f",
            Builtin::Exp2 => "exp2f",
            // fmaxf/fminf return the non-NaN operand, as Rust's max/min do.
            Builtin::Max => "fmaxf",
            Builtin::Min => "fminf",
            Builtin::Ln1p => "log1pf",
            // rintf rounds to nearest even in the default rounding mode.
            Builtin::RoundEven => "rintf",
            // ilogbf is exact, as Real::ilogb; the IR wants it as a float.
            Builtin::Ilogb => return Code::new(format!("(float){}", call("ilogbf", &args).text), prec::UNARY),
            Builtin::MaxUsize => "ds4_max_usize",
            Builtin::MinUsize => "ds4_min_usize",
        };
        call(name, &args)
    }

    fn ident(&self, name: &str) -> String {
        escape_any(name, &[CXX_KEYWORDS, RESERVED])
    }

    fn declare(&self, name: &str, ty: Ty, mutable: bool, init: &str) -> String {
        c_declare(self.ty(ty), name, mutable, init)
    }

    fn for_header(&self, var: &str, start: &str, end: &str) -> String {
        c_for("usize", var, start, end)
    }

    /// Unrolled by four, a thread's short loops have their loads in flight together
    /// rather than one loop trip at a time (the trip counts are runtime values).
    fn inner_loop_hint(&self) -> Option<&'static str> {
        Some("#pragma unroll 4")
    }

    fn thread_loop_header(&self, var: &str, start: &str, end: &str, split: bool) -> Option<String> {
        Some(if split {
            format!("for (usize {var} = {start} + threadIdx.x + (usize)blockIdx.y * blockDim.x; {var} < {end}; {var} += (usize)blockDim.x * gridDim.y)")
        } else {
            format!("for (usize {var} = {start} + threadIdx.x; {var} < {end}; {var} += blockDim.x)")
        })
    }

    fn barrier(&self) -> String {
        "__syncthreads();".into()
    }

    fn block_sum(&self, part: &str) -> String {
        format!("ds4_block_sum({part})")
    }

    fn prelude(&self, k: &Kernel) -> String {
        let mut s = format!("// {}: generated by ds4-codegen from kernel IR (target cuda-sm{}).\n", k.name, self.sm);
        s.push_str("typedef unsigned long long usize;\n");
        let used = k.builtins_used();
        if used.contains(&Builtin::MinUsize) {
            s.push_str("__device__ __forceinline__ usize ds4_min_usize(usize a, usize b) { return a < b ? a : b; }\n");
        }
        if used.contains(&Builtin::MaxUsize) {
            s.push_str("__device__ __forceinline__ usize ds4_max_usize(usize a, usize b) { return a > b ? a : b; }\n");
        }
        if k.has_sum_loop() {
            s.push_str(BLOCK_SUM);
        }
        s.push('\n');
        s
    }

    fn helper_signature(&self, f: &Function) -> String {
        let params: Vec<String> = f.params.iter().map(|(n, t)| format!("{} {}", self.ty(*t), self.ident(n))).collect();
        format!("__device__ __forceinline__ {} {}({})", self.ty(f.ret), self.ident(&f.name), params.join(", "))
    }

    fn kernel_open(&self, k: &Kernel, out_len: &str, parallel: bool) -> String {
        let out = self.ident(k.out().0);
        // Serial kernels: one thread computes the item, the others leave at once.
        let threads = if parallel { "" } else { "    if (threadIdx.x != 0) return;\n" };
        let mut s = format!(
            "extern \"C\" __global__ void {}({}) {{\n{GRID_WAIT}{threads}    \
             const usize item = blockIdx.x;\n    \
             {out} += item * ({out_len});\n",
            k.name,
            self.params(k)
        );
        if stages_output(k) {
            // The item's output lives in shared memory while the kernel runs (see
            // `stages_output`), when the launch gave it room; copied in first, so that
            // what the kernel does not write keeps its value.
            let copy_in = self.staged_copy(out_len, parallel, "ds4_out_sh", "ds4_out_g");
            let _ = write!(
                s,
                "    extern __shared__ float ds4_out_sh[];\n    \
                 unsigned int ds4_room;\n    \
                 asm(\"mov.u32 %0, %%dynamic_smem_size;\" : \"=r\"(ds4_room));\n    \
                 float* const ds4_out_g = {out};\n    \
                 const bool ds4_staged = (usize)({out_len}) * 4 <= (usize)ds4_room;\n    \
                 if (ds4_staged) {{\n        \
                 {copy_in}\n        \
                 {out} = ds4_out_sh;\n    \
                 }}\n"
            );
            if parallel {
                // Every thread's copy lands before any thread reads the output.
                s.push_str("    __syncthreads();\n");
            }
        }
        s
    }

    fn kernel_close(&self, k: &Kernel, out_len: &str, parallel: bool) -> String {
        if !stages_output(k) {
            return String::new();
        }
        let barrier = if parallel { "    __syncthreads();\n" } else { "" };
        let copy_out = self.staged_copy(out_len, parallel, "ds4_out_g", "ds4_out_sh");
        format!("{barrier}    if (ds4_staged) {{\n        {copy_out}\n    }}\n")
    }
}

impl Cuda {
    /// `dst[i] = src[i]` over a staged item output of `out_len` floats, by the block's
    /// threads where the kernel runs in parallel (the dialect's own loop headers).
    fn staged_copy(&self, out_len: &str, parallel: bool, dst: &str, src: &str) -> String {
        let end = format!("(usize)({out_len})");
        let header = match self.thread_loop_header("i", "0", &end, false) {
            Some(h) if parallel => h,
            _ => self.for_header("i", "0", &end),
        };
        format!("{header} {dst}[i] = {src}[i];")
    }
}

impl Cuda {
    /// A kernel's parameter list (buffers as restricted pointers, scalars by value); also
    /// the signature of the CUDA-text kernels that share an IR kernel's contract.
    pub(crate) fn params(&self, k: &Kernel) -> String {
        let params: Vec<String> = k
            .params
            .iter()
            .map(|p| {
                let name = self.ident(&p.name);
                match p.kind {
                    ParamKind::Buffer { elem, mutable } => {
                        let t = if elem == Elem::F { "float" } else { "int" };
                        let c = if mutable { "" } else { "const " };
                        format!("{c}{t}* __restrict__ {name}")
                    }
                    ParamKind::Scalar { ty } => format!("const {} {name}", self.ty(ty)),
                }
            })
            .collect();
        params.join(", ")
    }
}

/// Whether a kernel keeps its item's output in shared memory while it runs: those that
/// read back what they wrote (`render::reads_output`; never split over blocks). The
/// hyper-connection mix's 20 Sinkhorn rounds went through global memory, an L2 round trip
/// per step of the chain. The launch gives the room (`STAGE_OUT_LIMIT`); without it the
/// kernel works in global memory as before.
pub fn stages_output(k: &Kernel) -> bool {
    crate::render::reads_output(k)
}

/// 16-byte copies global -> shared memory that travel while the kernel computes
/// (`cp.async`, sm_80 and later): the tensor-core matmuls' and `attention_tiled`'s staging.
pub(crate) const CP_ASYNC: &str = r#"// 16 bytes global -> shared without passing through registers; the first `bytes` come
// from `src` (16-byte aligned), the rest are zeros. Complete after ds4_cp_wait().
__device__ __forceinline__ void ds4_cp16(void* dst, const void* src, const unsigned int bytes) {
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void ds4_cp_wait() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

"#;

/// The first statement of every CUDA kernel: wait until the kernels before it in the
/// stream have finished and their writes are visible. A no-op for a plain launch; in a
/// decode step's graph the runtime links kernels with programmatic edges
/// (`runtime/src/cuda/launch_plan.rs`), so a kernel is launched while its predecessor
/// still runs and waits here, hiding the launch latency (sm_90 and later). Every thread
/// runs it before anything else, an early return included: a kernel finishes only after
/// its predecessor has, so the order holds along the whole chain.
pub(crate) const GRID_WAIT: &str = "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n";

/// The opening of a branch that holds loads a kernel issues before its [`GRID_WAIT`]
/// (weights no kernel writes), `cond` a condition the kernel's parameters make true.
/// Without it ptxas schedules the wait (`ACQBULK`) above straight-line loads, which it may
/// (the wait orders only what follows it): `hc_pre`'s "early" loads were issued after the
/// wait and overlapped nothing (CUDA 13, sm_90, seen in the SASS, twenty-sixth stop). It
/// does not move the wait above a branch that comes before it. Close with
/// [`BEFORE_WAIT_CLOSE`]; what the branch loads must be right whether or not it runs.
pub(crate) fn before_wait_open(cond: &str) -> String {
    format!("    if ({cond}) {{\n")
}

/// The end of [`before_wait_open`]'s branch.
pub(crate) const BEFORE_WAIT_CLOSE: &str = "    }\n";

/// Where a kernel's blocks have done their reads of weights and are left with their
/// sums and stores: let the kernel after it in a decode step's graph launch now (its
/// blocks then wait in [`GRID_WAIT`] until this kernel has finished and its writes are
/// visible, as without it). The next kernel is launched once every block has passed here
/// or exited, so its launch, and what it does before its wait (`hc_pre` loads its
/// weights), overlap the last blocks' sums and stores.
pub(crate) const GRID_TRIGGER: &str = "asm volatile(\"griddepcontrol.launch_dependents;\");";

/// The opening of a CUDA-text kernel with its own parameter list (`hc_pre`, `router_select`,
/// the integer expert mat-vecs, `matvec_f16_vec`, `norm_rope`, `split_x_bf16x3`): entry
/// point `name` under `__launch_bounds__(bounds)`, `params` as the quant kernels declare
/// them (`quant::cuda::c_params`, so a list is written once, in its `params()`), then
/// [`GRID_WAIT`].
pub(crate) fn own_entry(name: &str, bounds: &str, params: &[crate::quant::QParam]) -> String {
    format!("{}{GRID_WAIT}", own_entry_unwaited(name, bounds, params))
}

/// [`own_entry`] without [`GRID_WAIT`]: for a kernel that reads weights (never written by
/// a kernel) before it waits, and waits itself before anything else.
pub(crate) fn own_entry_unwaited(name: &str, bounds: &str, params: &[crate::quant::QParam]) -> String {
    format!("extern \"C\" __global__ void __launch_bounds__({bounds}) {name}({}) {{\n", crate::quant::cuda::c_params(params))
}

/// Op kernel `op`'s IR helpers (`ds4_ir::kernels`) for a kernel written as CUDA text, with
/// the `usize` they may name declared (C++ takes the same typedef again): how a text kernel
/// takes an op's arithmetic instead of restating it. The dialect renders helpers alike for
/// every sm (only a kernel's header names it), so the text kernels without a target take
/// these too.
pub(crate) fn text_helpers(op: &str) -> String {
    format!("typedef unsigned long long usize;\n{}", crate::render::op_helpers(&Cuda { sm: 90 }, op))
}

/// The largest item output (bytes) a launch stages in shared memory.
pub const STAGE_OUT_LIMIT: usize = 16 * 1024;

/// A kernel written as CUDA text with an IR kernel's contract (`cuda_attention.rs`,
/// `cuda_hc_mix.rs`): a header naming its `file`, `preamble` (constants, helpers), the
/// entry point `name` with `contract`'s parameters under `__launch_bounds__(bounds)`, and
/// `body`. None for the targets that are not CUDA.
pub(crate) fn text_kernel(target: crate::Target, name: &str, file: &str, preamble: &str, bounds: &str, contract: &Kernel, body: &str) -> Option<String> {
    let sm = Cuda::of(target)?.sm;
    let mut s = format!("// {name}: written as CUDA text in ds4-codegen ({file}), target cuda-sm{sm}.\n");
    s.push_str("typedef unsigned long long usize;\n");
    s.push_str(preamble);
    s.push_str(&format!("extern \"C\" __global__ void __launch_bounds__({bounds}) {name}({}) {{\n", Cuda { sm }.params(contract)));
    s.push_str(GRID_WAIT);
    s.push_str(body);
    s.push_str("}\n");
    Some(s)
}

/// Test support for the CUDA-text kernels with their own parameter list (`cuda_hc_pre.rs`,
/// `cuda_digits.rs`, `cuda_router.rs`): the entry point `name` of `source` declares every
/// parameter of `params`, in order.
#[cfg(test)]
pub(crate) fn assert_declares_params(source: &str, name: &str, params: &[crate::quant::QParam]) {
    let sig = &source[source.find(&format!("{name}(")).unwrap_or_else(|| panic!("no {name}"))..];
    let sig = &sig[..sig.find(')').unwrap()];
    let mut at = 0;
    for p in params {
        let i = sig[at..].find(p.name()).unwrap_or_else(|| panic!("{name}: {} missing or out of order", p.name()));
        at += i + p.name().len();
    }
}

/// Test support for the CUDA-text kernels that take an IR kernel's contract
/// (`cuda_attention.rs`, `cuda_hc_mix.rs`): the entry point `name` of `source` has the
/// generated kernel's parameter list on every CUDA target, and no other target has it.
#[cfg(test)]
pub(crate) fn assert_takes_contract(source: fn(crate::Target) -> Option<String>, name: &str, contract: &Kernel) {
    use crate::Target;
    fn signature<'s>(src: &'s str, name: &str) -> &'s str {
        let start = src.find(&format!("{name}(")).unwrap() + name.len() + 1;
        &src[start..start + src[start..].find(')').unwrap()]
    }
    for target in [Target::CudaSm90, Target::CudaSm120] {
        let text = source(target).unwrap();
        let generated = crate::render(contract, target);
        assert_eq!(signature(&text, name), signature(&generated, &contract.name), "{name} on {target}");
    }
    for target in [Target::Cpu, Target::Wgsl, Target::Metal] {
        assert!(source(target).is_none(), "{name} on {target}");
    }
}
