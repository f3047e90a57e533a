//! Quant kernels from a [`QuantSpec`]: the GPU side of "a quant type is declared once".
//!
//! A spec says what element `s * sub_block + j` of a block is, as an expression tree over
//! the block's fields (see `ds4_ir::quant::expr`). This module lowers that tree, node by
//! node, into one C-style function `ds4_dq(block byte offset, s, j) -> f32`, and wraps it in
//! two kernels per type:
//! - `dequant_rows_<type>`: item = one output row; row `ids[item]` of a weight matrix,
//!   de-quantized (the embedding lookup);
//! - `matvec_<type>`: a gathered mat-vec. Block (r, t) computes
//!   `out[t·n + r] = Σ_{jp < picks} sc · W[e·n + r] · x[((p / x_div)·groups + r / ng)·k ..]`
//!   with `p = t·picks + jp`, `e = sel[p]` (or 0; a negative pick adds nothing) and
//!   `sc = wts[p]` (or 1). One kernel covers the plain matmul, the grouped matmul and both
//!   halves of the routed experts.
//!
//! Every value of the expression language lives in a 32-bit *word* (u32 for unsigned
//! types and f16 bits, i32 for signed ones; u64 where a target has it), and narrow results
//! are wrapped explicitly after each node, so that integer semantics (two's complement at
//! the node's width, masked shift amounts) are the same on every target without relying
//! on C's promotions. Float arithmetic is plain IEEE f32; a target must not contract it
//! into FMA (CUDA: compile with `--fmad=false`), which keeps de-quantization bit-identical
//! to the CPU code generated from the same spec.
//!
//! What differs per target is syntax only: [`QuantSyntax`], implemented in `quant/cuda.rs`,
//! `quant/wgsl.rs` and `quant/metal.rs`.

pub(crate) mod cuda;
mod cuda_matvec;
pub mod cuda_matvec_dense;
mod cuda_mma;
pub mod cuda_split;
mod metal;
mod runs;

pub use cuda_matvec::{block_rows as matvec_block_rows, reads_in_place as matvec_reads_in_place, split_below as matvec_split_below, MATVEC_WARPS};
pub use cuda_mma::{mma_k_unit, MMA_ROWS, MMA_TOKENS};
mod wgsl;

use crate::render::f32_digits;
use crate::Target;
use ds4_ir::quant::{BinOp, Expr, QuantSpec, TableData, Ty, UnOp};
use ds4_ir::GgmlType;
use std::fmt::{self, Write};

/// Threads per block (workgroup) of every quant kernel.
pub const THREADS: u32 = 128;

/// How a value is held in generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    U32,
    I32,
    U64,
    F32,
    Bool,
    /// A byte offset or an element index: 64 bits where the target has them.
    Idx,
}

/// Element type of a kernel buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufElem {
    /// Raw GGUF bytes of a weight.
    Bytes,
    F32,
    I32,
}

/// One parameter of a quant kernel, in launch order: buffers first (the output is the
/// first), then scalars (all [`Word::Idx`]: `u64` on CUDA, `u32` in WGSL/Metal params).
/// `Float` is an f32 by value, for the CUDA-text kernels' epsilons and scales.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QParam {
    Buffer { name: &'static str, elem: BufElem, mutable: bool },
    Scalar { name: &'static str },
    Float { name: &'static str },
}

impl QParam {
    pub fn name(&self) -> &'static str {
        match self {
            QParam::Buffer { name, .. } | QParam::Scalar { name } | QParam::Float { name } => name,
        }
    }
}

/// The two kernels made for each quant type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantKernelKind {
    DequantRows,
    MatVec,
    /// `out[p·n + r] = W[e·n + r] · x[((p / x_div)·groups + r / ng)·k ..]` for up to
    /// [`TOKENS`] rows p per block: each de-quantized weight serves all of them (prefill).
    /// Block y is a group: rows p = y·TOKENS + t (< m) and e = 0, or, with `has_idx`,
    /// the group's listed rows `idx[y·TOKENS + t]` (-1: none; the first is always
    /// present) of expert `gexp[y]` (the routed experts, tokens grouped by expert).
    MatMul,
    /// `MatMul` on tensor cores, [`MMA_ROWS`] rows × [`MMA_TOKENS`] tokens per block
    /// (groups of `MMA_TOKENS` listed rows); CUDA only (`quant/cuda_mma.rs`).
    MatMulMma,
}

/// Tokens per block of the `MatMul` kernel.
pub const TOKENS: u64 = 8;

impl QuantKernelKind {
    pub const ALL: [QuantKernelKind; 4] = [QuantKernelKind::DequantRows, QuantKernelKind::MatVec, QuantKernelKind::MatMul, QuantKernelKind::MatMulMma];

    /// Whether `target` has this kernel (tensor cores: CUDA only).
    pub fn available(self, target: Target) -> bool {
        self != QuantKernelKind::MatMulMma || target.is_cuda()
    }

    pub fn prefix(self) -> &'static str {
        match self {
            QuantKernelKind::DequantRows => "dequant_rows",
            QuantKernelKind::MatVec => "matvec",
            QuantKernelKind::MatMul => "matmul",
            QuantKernelKind::MatMulMma => "matmul_mma",
        }
    }

    /// Parameters in launch order.
    pub fn params(self) -> Vec<QParam> {
        use BufElem::*;
        let b = |name, elem, mutable| QParam::Buffer { name, elem, mutable };
        let s = |name| QParam::Scalar { name };
        match self {
            QuantKernelKind::DequantRows => vec![b("out", F32, true), b("w", Bytes, false), b("ids", I32, false), s("k"), s("row_bytes")],
            QuantKernelKind::MatVec => vec![
                b("out", F32, true),
                b("w", Bytes, false),
                b("x", F32, false),
                b("sel", I32, false),
                b("wts", F32, false),
                s("n"),
                s("k"),
                s("row_bytes"),
                s("picks"),
                s("x_div"),
                s("groups"),
                s("ng"),
                s("has_sel"),
                s("has_wts"),
                s("row_blocks"),
            ],
            QuantKernelKind::MatMul => vec![
                b("out", F32, true),
                b("w", Bytes, false),
                b("x", F32, false),
                b("idx", I32, false),
                b("gexp", I32, false),
                s("n"),
                s("k"),
                s("row_bytes"),
                s("m"),
                s("groups"),
                s("ng"),
                s("x_div"),
                s("has_idx"),
            ],
            // The matmul's, and a split over k: columns per slice (blockIdx.z) and the
            // distance between the slices' outputs (`quant/cuda_mma.rs`).
            // Then, read by the element-term path only (`quant/cuda_mma.rs`): x's bf16 parts
            // and sums per 16 columns (`quant/cuda_split.rs`), and the floats of x (the
            // distance between two parts). Last, so that the matmul's arguments keep their
            // places.
            QuantKernelKind::MatMulMma => {
                let mut p = QuantKernelKind::MatMul.params();
                p.extend([s("k_slice"), s("out_slice"), b("xp", Bytes, false), b("xs16", F32, false), s("xp_stride")]);
                p
            }
        }
    }

    /// The launch grid, in words (for the manifest).
    pub fn grid(self) -> &'static str {
        match self {
            QuantKernelKind::DequantRows => "[rows, 1, 1]",
            QuantKernelKind::MatVec => "[row_blocks (≤ n), m, 1]",
            QuantKernelKind::MatMul => "[n, ceil(m / 8) or groups, 1]",
            QuantKernelKind::MatMulMma => "[ceil(n / 64), ceil(m / 64) or groups, ceil(k / k_slice)]",
        }
    }

    /// Shared (workgroup) memory the kernel declares.
    pub fn shared_bytes(self) -> u32 {
        match self {
            QuantKernelKind::DequantRows => 0,
            QuantKernelKind::MatVec | QuantKernelKind::MatMul => THREADS * 4,
            // Static: the token bookkeeping; the tiles and staged rows are dynamic
            // (`QuantKernel::dynamic_shared`).
            QuantKernelKind::MatMulMma => cuda_mma::STATIC_SHARED_BYTES as u32,
        }
    }
}

/// A generated quant kernel.
#[derive(Clone, Debug)]
pub struct QuantKernel {
    /// Entry point name, e.g. `matvec_q4_k`.
    pub name: String,
    pub kind: QuantKernelKind,
    pub ggml: GgmlType,
    pub params: Vec<QParam>,
    pub threads: u32,
    /// Shared memory in all: static and dynamic.
    pub shared_bytes: u32,
    /// Of which dynamic (given at launch; the runtime raises the kernel's limit for it).
    pub dynamic_shared: u32,
    /// Reads x's bf16 parts made by `split_x_bf16x3` (`quant/cuda_split.rs`) instead of x:
    /// `matmul_mma` on the element-term path (`quant/cuda_mma.rs`).
    pub reads_x_parts: bool,
    pub source: String,
}

/// Why a spec could not be lowered for a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantGenError(pub String);

impl fmt::Display for QuantGenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for QuantGenError {}

/// The type's name in kernel and file names: `Q4_K` → `q4_k`.
pub fn type_slug(t: GgmlType) -> String {
    t.to_string().to_lowercase()
}

/// Entry point name of one quant kernel.
pub fn kernel_name(kind: QuantKernelKind, t: GgmlType) -> String {
    format!("{}_{}", kind.prefix(), type_slug(t))
}

/// The type a weight of type `ty`, in rows of `row_len` elements, has on `target`'s
/// devices. CUDA devices hold Q8_0 as Q8_0_R (the same bytes regrouped,
/// `ds4_ir::quant::regroup_q8_0`), whose mat-vec reads rows in place (`cuda_matvec.rs`,
/// the direct path), where its rows are a multiple of 16 bytes (256 values), and IQ2_XXS
/// as IQ2_XXS_R (72 bytes a block where the file has 66, `regroup_iq2_xxs`), which the
/// experts' integer gate and up read (`cuda_digits.rs`); every other weight keeps its
/// file's type. The kernels a graph needs (`KernelSet::for_graph`) and
/// the upload agree through this function.
pub fn device_type(target: Target, ty: GgmlType, row_len: u64) -> GgmlType {
    if target.is_cuda() && ty == GgmlType::Q8_0 && GgmlType::Q8_0R.bytes_for(row_len).is_some_and(|b| b % 16 == 0) {
        GgmlType::Q8_0R
    } else if target.is_cuda() && ty == GgmlType::Iq2Xxs && GgmlType::Iq2XxsR.bytes_for(row_len).is_some() {
        GgmlType::Iq2XxsR
    } else {
        ty
    }
}

/// Whether `target` ever stores weights of type `ty`: every GGML type, and a device
/// layout only where [`device_type`] makes it (CUDA). Kernels are generated for those.
pub fn target_stores(target: Target, ty: GgmlType) -> bool {
    !ty.is_device_layout() || target.is_cuda()
}

/// What a target spells its own way. Every method returns text; the core decides what
/// is computed.
pub trait QuantSyntax {
    fn target(&self) -> &'static str;
    /// The type name of a word.
    fn word(&self, w: Word) -> &'static str;
    /// An integer literal of a word type.
    fn int_lit(&self, w: Word, v: i128) -> String;
    /// An f32 literal (finite).
    fn f32_lit(&self, v: f32) -> String {
        format!("{}f", f32_digits(v as f64))
    }
    /// A value conversion.
    /// The C family's spelling (CUDA and MSL); WGSL overrides it.
    fn cast(&self, to: Word, e: &str) -> String {
        format!("(({}){e})", self.word(to))
    }
    /// u32 bits → f32.
    fn bits_to_f32(&self, e: &str) -> String;
    /// f32 → u32 bits.
    fn f32_to_bits(&self, e: &str) -> String;
    /// `c ? a : b` (both evaluated; neither has side effects).
    fn select(&self, c: &str, a: &str, b: &str) -> String {
        format!("({c} ? {a} : {b})")
    }
    /// Byte `addr` (an Idx) of byte buffer `buf` (the weights, or a staged copy of them),
    /// as a u32.
    fn byte(&self, buf: &str, addr: &str) -> String;
    /// The four bytes at `addr` of `buf` as a little-endian u32, read as the two aligned
    /// words that hold them (`buf` 4-byte aligned and readable 4 bytes past `addr + 3`);
    /// `None` where the target has no such read (then the bytes are read one by one).
    fn word32(&self, _buf: &str, _addr: &str) -> Option<String> {
        None
    }
    /// The `bytes` (2 or 4) bytes at `addr` of `buf`, an address that is a multiple of
    /// `bytes`, as one load (a u32); `None` where the target has no such read.
    fn aligned_load(&self, _buf: &str, _addr: &str, _bytes: u64) -> Option<String> {
        None
    }
    /// A local declaration statement.
    fn decl(&self, name: &str, w: Word, mutable: bool, init: &str) -> String {
        let c = if mutable { "" } else { "const " };
        format!("{c}{} {name} = {init};", self.word(w))
    }
    /// `for` header up to the brace: `var` from `start` while `< end`, adding `step`.
    fn for_header(&self, w: Word, var: &str, start: &str, end: &str, step: &str) -> String;
    /// A module-scope constant table.
    fn table(&self, name: &str, w: Word, values: &[String]) -> String;
    /// Everything before the tables and functions.
    fn prelude(&self, kernel: &str, spec: &QuantSpec) -> String;
    /// A device function's signature up to the brace; `with_weights` adds the weight
    /// buffer as the first parameter where the target passes buffers to functions.
    fn function(&self, name: &str, params: &[(&str, Word)], ret: Word, with_weights: bool) -> String;
    /// The call of such a function; `weights`: the byte buffer passed as its weights,
    /// where the target passes buffers to functions.
    fn call(&self, name: &str, args: &[String], weights: Option<&str>) -> String;
    /// Module-scope declarations a kernel needs (bindings, parameter structs).
    fn kernel_globals(&self, params: &[QParam], shared: u32) -> String;
    /// The kernel's signature, brace and prologue: defines `ds4_tid`, `ds4_bx`, `ds4_by`
    /// (Idx) and every scalar param under its name (Idx).
    /// `min_blocks`: blocks per SM to compile for (a register budget), where the target
    /// takes such a hint.
    fn kernel_open(&self, name: &str, params: &[QParam], shared: u32, min_blocks: Option<u32>) -> String;
    /// A workgroup barrier statement.
    fn barrier(&self) -> String;

    /// An expression: the sum over the block of every thread's `v` (every thread gets it;
    /// contains barriers), where the target has a block sum of its own (CUDA: the op
    /// kernels' `ds4_block_sum`); None: the shared-memory tree below.
    fn block_sum(&self, _v: &str) -> Option<String> {
        None
    }
    /// Source defining what `block_sum` calls, placed before the kernel.
    fn block_sum_helper(&self) -> &'static str {
        ""
    }
    /// The name under which the kernel body reads buffer param `name`.
    fn buffer(&self, name: &str) -> String {
        format!("ds4_{name}")
    }
    /// Name of the shared reduction array.
    fn shared_array(&self) -> &'static str {
        "ds4_red"
    }
    /// Whether the target has 64-bit integers.
    fn has_u64(&self) -> bool {
        true
    }
    /// `a · b + c` with one rounding (the dot products' accumulation).
    fn fma(&self, a: &str, b: &str, c: &str) -> String {
        format!("fma({a}, {b}, {c})")
    }
    /// A declaration of `name` as the four f32 of buffer `buf` from element `at` (a
    /// multiple of 4) in one load, where the target has such vectors; see `vec4_lane`.
    fn load_f32x4(&self, _name: &str, _buf: &str, _at: &str) -> Option<String> {
        None
    }
    /// Lane `i` of a vector declared by `load_f32x4`.
    fn vec4_lane(&self, v: &str, i: u64) -> String {
        format!("{v}[{i}]")
    }
    /// An integer of at most 16 bits (held in its word) as f32, exactly.
    fn narrow_int_to_f32(&self, v: &str, _signed: bool) -> String {
        self.cast(Word::F32, v)
    }
    /// Byte `byte` (0..4) of the u32 `word`, an unsigned or a two's-complement byte, as
    /// f32, exactly; None where the target has no cheaper form than extract and convert.
    fn byte_to_f32(&self, _word: &str, _byte: u64, _signed: bool) -> Option<String> {
        None
    }
    /// Lines (each ending in a newline) that declare `S_<name>`, a shared-memory copy of
    /// table `T_<name>` (`len` elements of type `ty`, held as `word`), and fill it with
    /// the block's threads; None where the target keeps tables where they are.
    fn shared_table(&self, _name: &str, _ty: Ty, _word: Word, _len: usize) -> Option<String> {
        None
    }
    /// `ds4_f16_to_f32_dot`: the conversion for values that only feed dot products (the
    /// same for every half but NaNs, whose payloads it need not keep), where the target
    /// has a faster one than `ds4_f16_to_f32`.
    fn f16_to_f32_dot_fn(&self) -> Option<&'static str> {
        None
    }
    /// A faster definition of `ds4_f16_to_f32` with the same results (bit for bit),
    /// where the target has a conversion instruction; it may call `ds4_f16_to_f32_dot`
    /// (then emitted before it in every kernel).
    fn f16_to_f32_fn(&self) -> Option<&'static str> {
        None
    }
}

/// The syntax of `target`'s quant kernels (None for the CPU, whose quant code the
/// `quant_type!` macro generates at compile time).
pub fn syntax(target: Target) -> Option<Box<dyn QuantSyntax>> {
    match target {
        Target::Cpu => None,
        Target::CudaSm90 => Some(Box::new(cuda::CudaQuant { sm: 90 })),
        Target::CudaSm120 => Some(Box::new(cuda::CudaQuant { sm: 120 })),
        Target::Wgsl => Some(Box::new(wgsl::WgslQuant)),
        Target::Metal => Some(Box::new(metal::MetalQuant)),
    }
}

/// Lowers `spec` into kernel `kind` for `target`.
pub fn quant_kernel(spec: &QuantSpec, kind: QuantKernelKind, target: Target) -> Result<QuantKernel, QuantGenError> {
    let syn = syntax(target).ok_or_else(|| QuantGenError(format!("{target}: quant code is generated by the quant_type! macro at compile time")))?;
    if !syn.has_u64() && uses_u64(spec) {
        return Err(QuantGenError(format!("{}: {target} has no 64-bit integers, which this type's de-quantization uses", spec.ggml)));
    }
    if !kind.available(target) {
        return Err(QuantGenError(format!("{}: {target} has no {} kernel", spec.ggml, kind.prefix())));
    }
    let name = kernel_name(kind, spec.ggml);
    let params = kind.params();
    // The shared-memory tree's array, unless the target sums with its own helper (whose
    // shared memory is the helper's: one float per warp).
    let own_sum = syn.block_sum("v").is_some();
    let shared = if own_sum { 0 } else { kind.shared_bytes() };
    let mut src = syn.prelude(&name, spec);
    let lower = Lower { syn: syn.as_ref(), spec, shared_tables: false, wbuf: "ds4_w", reads: Reads::Bytes, run_elem: None, dot: false };
    src.push_str(&lower.helpers()?);
    src.push_str(&lower.dequant_fn()?);
    if kind != QuantKernelKind::DequantRows && own_sum {
        src.push_str(syn.block_sum_helper());
        src.push('\n');
    }
    // The dot-product kernels read tables from shared memory where the target can stage
    // them: a warp's lanes look up unrelated entries, which global memory serves a cache
    // line at a time.
    let staged: Vec<String> = if kind == QuantKernelKind::DequantRows {
        Vec::new()
    } else {
        spec.tables.iter().filter_map(|t| syn.shared_table(t.name, t.ty, word_of(t.ty), t.len())).collect()
    };
    let lower = Lower { shared_tables: !staged.is_empty() && staged.len() == spec.tables.len(), ..lower };
    let stage = |src: &mut String| {
        if lower.shared_tables {
            for l in &staged {
                src.push_str(l);
            }
            src.push_str(&format!("    {}\n", syn.barrier()));
        }
    };
    if kind == QuantKernelKind::MatMulMma {
        src.push_str(&lower.mma_helpers());
        src.push_str(&syn.kernel_open(&name, &params, 0, lower.mma_min_blocks()));
        stage(&mut src);
        src.push_str(&lower.mma_body()?);
        src.push_str("}\n");
        let dynamic_shared = lower.mma_dynamic_shared();
        let shared_bytes = kind.shared_bytes() + lower.staged_table_bytes() as u32 + dynamic_shared;
        let reads_x_parts = lower.term_mma().is_some();
        return Ok(QuantKernel { name, kind, ggml: spec.ggml, params, threads: THREADS, shared_bytes, dynamic_shared, reads_x_parts, source: src });
    }
    if kind == QuantKernelKind::MatVec && target.is_cuda() {
        // A warp per row, rows staged in shared memory (`quant/cuda_matvec.rs`).
        src.push_str(crate::cuda::CP_ASYNC);
        src.push_str(&syn.kernel_open(&name, &params, 0, Some(cuda_matvec::MIN_BLOCKS)));
        stage(&mut src);
        src.push_str(&lower.staged_matvec_body()?);
        src.push_str("}\n");
        let shared_bytes = (MATVEC_WARPS * cuda_matvec::warp_stage_bytes(spec.block_bytes as u64)) as u32 + lower.staged_table_bytes() as u32;
        return Ok(QuantKernel { name, kind, ggml: spec.ggml, params, threads: THREADS, shared_bytes, dynamic_shared: 0, reads_x_parts: false, source: src });
    }
    src.push_str(&syn.kernel_globals(&params, shared));
    src.push_str(&syn.kernel_open(&name, &params, shared, None));
    stage(&mut src);
    src.push_str(&lower.kernel_body(kind)?);
    src.push_str("}\n");
    // Reported: what the kernel uses, the helper's per-warp floats included.
    let used = if own_sum && kind != QuantKernelKind::DequantRows { THREADS / 32 * 4 } else { shared };
    Ok(QuantKernel { name, kind, ggml: spec.ggml, params, threads: THREADS, shared_bytes: used, dynamic_shared: 0, reads_x_parts: false, source: src })
}

/// Whether any field, table or node of `spec` is a u64.
fn uses_u64(spec: &QuantSpec) -> bool {
    fn walk(e: &Expr) -> bool {
        e.ty() == Ty::U64 || e.children().into_iter().any(walk)
    }
    spec.fields.iter().any(|f| f.ty == Ty::U64)
        || spec.tables.iter().any(|t| t.ty == Ty::U64)
        || spec.lets.iter().any(|l| walk(l.value))
        || walk(spec.value)
}

/// The container word of an expression type.
fn word_of(t: Ty) -> Word {
    match t {
        Ty::Bool => Word::Bool,
        Ty::U8 | Ty::U16 | Ty::U32 | Ty::F16 => Word::U32,
        Ty::I8 | Ty::I16 | Ty::I32 => Word::I32,
        Ty::U64 => Word::U64,
        Ty::F32 => Word::F32,
    }
}

struct Lower<'a> {
    syn: &'a dyn QuantSyntax,
    spec: &'a QuantSpec,
    /// Whether table reads go to the kernel's shared-memory copies (`S_<name>`, see
    /// `QuantSyntax::shared_table`) instead of the module's constants (`T_<name>`).
    shared_tables: bool,
    /// The byte buffer block fields are read from: the weight param `ds4_w`, or a
    /// shared-memory copy of part of a row (the CUDA mat-vec's staging, `cuda_matvec.rs`).
    wbuf: &'static str,
    /// How multi-byte fields of `wbuf` are read.
    reads: Reads,
    /// Inside a run whose byte reads are hoisted (`runs.rs`, `Lower::run_byte_words`):
    /// the element's index in the run, a literal.
    run_elem: Option<u64>,
    /// The values only feed dot products: a NaN makes the sum NaN whatever its bits, so
    /// halves convert without keeping NaN payloads (`QuantSyntax::f16_to_f32_dot_fn`).
    dot: bool,
}

/// How a lowering reads the multi-byte fields of its byte buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reads {
    /// Byte by byte: any alignment, nothing read past a field.
    Bytes,
    /// A staged copy, 4-byte aligned with padding after it: a field as the two aligned
    /// words that hold it and a funnel shift (`QuantSyntax::word32`; fields of 66- and
    /// 84-byte blocks are at best 2-byte aligned).
    Staged,
    /// Rows read in place, 16-byte aligned, so that every block starts at a multiple of
    /// gcd(`block_bytes`, 16) (the CUDA mat-vec's direct path): a field whose address is
    /// a known multiple of its width is one load of that width
    /// (`QuantSyntax::aligned_load`), any other byte by byte (nothing is read past a block).
    Aligned,
}

/// Greatest common divisor.
pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple (a whole number of blocks and of vectors or steps).
pub(crate) fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Elements of a table's shared-memory copy: byte tables are read in words where a run's
/// bytes are hoisted (`runs.rs`), and the padding keeps the last word read inside it.
pub(crate) fn staged_table_len(ty: Ty, len: usize) -> usize {
    if ty.bytes() == 1 {
        len + WORDS_PAD as usize
    } else {
        len
    }
}

/// Bytes of padding after a staged copy read with `Lower::words` (a field's second word
/// may lie up to 4 bytes past its end); 16 keeps the next copy 16-byte aligned.
pub(crate) const WORDS_PAD: u64 = 16;

impl Lower<'_> {
    /// Bytes of the tables' shared-memory copies (none when they are read from constants).
    pub(super) fn staged_table_bytes(&self) -> usize {
        if self.shared_tables {
            self.spec.tables.iter().map(|t| staged_table_len(t.ty, t.len()) * t.ty.bytes()).sum()
        } else {
            0
        }
    }

    fn u32(&self, v: u64) -> String {
        self.syn.int_lit(Word::U32, v as i128)
    }
    /// The word of index arithmetic in the weight walk: 32 bits inside a staged copy
    /// (offsets of a few KiB; 64-bit math costs the GPU two or more instructions for
    /// each of its many address steps), the index word over whole weight tensors.
    fn iw(&self) -> Word {
        if self.reads == Reads::Bytes {
            Word::Idx
        } else {
            Word::U32
        }
    }

    /// Whether multi-byte reads go through words (staged or aligned), which also lets
    /// runs hoist their byte reads (`runs.rs`).
    fn words(&self) -> bool {
        self.reads != Reads::Bytes
    }

    /// Bytes every block's start is a multiple of (1: not known).
    fn block_align(&self) -> u64 {
        match self.reads {
            Reads::Aligned => gcd(self.spec.block_bytes as u64, 16),
            _ => 1,
        }
    }

    /// The largest power of two (at most 2^20) known to divide `e`'s value, 0 when the
    /// value is 0: the alignment an index adds to an address.
    fn known_multiple(&self, e: &Expr) -> u64 {
        const MAX: u64 = 1 << 20;
        match *e {
            Expr::Int(t, bits) => {
                let v = Expr::int_value(t, bits).unsigned_abs();
                if v == 0 {
                    0
                } else {
                    (1u64 << v.trailing_zeros()).min(MAX)
                }
            }
            // Inside a run, `j` is `uj + jj` (uj a multiple of the run) or the literal jj.
            Expr::Lane => match (self.run_elem, self.shape()) {
                (Some(jj), runs::Shape::InSub { run }) if run == self.spec.sub_block as u64 => self.known_multiple(&Expr::Int(Ty::U32, jj)),
                (Some(jj), runs::Shape::InSub { run }) => gcd(self.known_multiple(&Expr::Int(Ty::U32, run)), self.known_multiple(&Expr::Int(Ty::U32, jj))),
                _ => 1,
            },
            Expr::Var(name, _) => self.spec.let_(name).map_or(1, |l| self.known_multiple(l.value)),
            Expr::Binary(BinOp::Mul, _, a, b) => (self.known_multiple(a) * self.known_multiple(b)).min(MAX),
            Expr::Binary(BinOp::Add | BinOp::Sub, _, a, b) => gcd(self.known_multiple(a), self.known_multiple(b)),
            // Integer conversions keep a power of two dividing the value (up to their
            // width; alignments are at most 16).
            Expr::Cast(_, a) => self.known_multiple(a),
            _ => 1,
        }
    }
    /// An index constant (in `iw`).
    fn idx(&self, v: u64) -> String {
        self.syn.int_lit(self.iw(), v as i128)
    }

    /// `e` (held in `t`'s word) wrapped to `t`'s width: masks for narrow unsigned types,
    /// sign extension for narrow signed ones.
    fn wrap(&self, t: Ty, e: String) -> String {
        let s = self.syn;
        match t {
            Ty::U8 => format!("({e} & {})", self.u32(0xFF)),
            Ty::U16 => format!("({e} & {})", self.u32(0xFFFF)),
            Ty::I8 | Ty::I16 => {
                let (mask, half) = if t == Ty::I8 { (0xFF, 0x80) } else { (0xFFFF, 0x8000) };
                let low = format!("({} & {})", s.cast(Word::U32, &e), self.u32(mask));
                let h = s.int_lit(Word::I32, half);
                format!("(({} ^ {h}) - {h})", s.cast(Word::I32, &low))
            }
            _ => e,
        }
    }

    /// An integer constant of type `t` (already the type's mathematical value).
    fn int_const(&self, t: Ty, bits: u64) -> String {
        self.syn.int_lit(word_of(t), Expr::int_value(t, bits))
    }

    fn f32_const(&self, v: f32) -> String {
        if v.is_finite() {
            self.syn.f32_lit(v)
        } else {
            self.syn.bits_to_f32(&self.u32(v.to_bits() as u64))
        }
    }

    /// Little-endian load of element `index` (an expression of any integer word, and a
    /// number it is known to be a multiple of) of a field at `offset` with element type `t`.
    fn field_load(&self, offset: usize, t: Ty, index: Option<(String, u64)>) -> Result<String, QuantGenError> {
        let s = self.syn;
        let n = t.bytes();
        let (base, align) = match index {
            None => (format!("(ds4_blk + {})", self.idx(offset as u64)), gcd(self.block_align(), offset as u64)),
            Some((i, m)) => (
                format!("(ds4_blk + {} + {} * {})", self.idx(offset as u64), s.cast(self.iw(), &i), self.idx(n as u64)),
                gcd(gcd(self.block_align(), offset as u64), m * n as u64),
            ),
        };
        let at = |k: usize| if k == 0 { base.clone() } else { format!("{base} + {}", self.idx(k as u64)) };
        let byte = |k: usize| s.byte(self.wbuf, &at(k));
        let assemble = |from: usize, count: usize| -> String {
            if self.reads == Reads::Aligned && (count == 2 || count == 4) && gcd(align, from as u64).is_multiple_of(count as u64) {
                if let Some(v) = s.aligned_load(self.wbuf, &at(from), count as u64) {
                    return v;
                }
            }
            if self.reads == Reads::Staged && count >= 2 {
                if let Some(word) = s.word32(self.wbuf, &at(from)) {
                    return if count == 4 { word } else { format!("({word} & {})", self.u32((1u64 << (8 * count)) - 1)) };
                }
            }
            let parts: Vec<String> =
                (0..count).map(|k| if k == 0 { byte(from) } else { format!("({} << {})", byte(from + k), self.u32(8 * k as u64)) }).collect();
            if count == 1 {
                parts[0].clone()
            } else {
                format!("({})", parts.join(" | "))
            }
        };
        Ok(match t {
            Ty::Bool => return Err(QuantGenError("a bool field".into())),
            Ty::U8 | Ty::U16 | Ty::U32 | Ty::F16 => assemble(0, n),
            Ty::I8 | Ty::I16 => self.wrap(t, s.cast(Word::I32, &assemble(0, n))),
            Ty::I32 => s.cast(Word::I32, &assemble(0, 4)),
            Ty::F32 => s.bits_to_f32(&assemble(0, 4)),
            Ty::U64 => format!(
                "({} | ({} << {}))",
                s.cast(Word::U64, &assemble(0, 4)),
                s.cast(Word::U64, &assemble(4, 4)),
                self.u32(32)
            ),
        })
    }

    fn expr(&self, e: &Expr) -> Result<String, QuantGenError> {
        let s = self.syn;
        Ok(match *e {
            Expr::Int(t, bits) => self.int_const(t, bits),
            Expr::F32(v) => self.f32_const(v),
            Expr::Sub => "s".to_string(),
            Expr::Lane => "j".to_string(),
            Expr::Var(name, _) => format!("v_{name}"),
            Expr::Field(name, t) => {
                let f = self.spec.field(name).ok_or_else(|| QuantGenError(format!("no field {name}")))?;
                self.field_load(f.offset, t, None)?
            }
            Expr::Load(name, t, i) => {
                if let Some(v) = self.run_byte(e, t) {
                    return Ok(v);
                }
                let f = self.spec.field(name).ok_or_else(|| QuantGenError(format!("no field {name}")))?;
                self.field_load(f.offset, t, Some((self.expr(i)?, self.known_multiple(i))))?
            }
            Expr::Table(name, t, i) => match self.run_byte(e, t) {
                Some(v) => v,
                None if self.shared_tables => s.cast(word_of(t), &format!("S_{name}[{}]", s.cast(Word::U32, &self.expr(i)?))),
                None => format!("T_{name}[{}]", s.cast(Word::U32, &self.expr(i)?)),
            },
            Expr::Unary(op, t, a) => {
                let a = self.expr(a)?;
                match (op, t) {
                    (UnOp::Neg, Ty::F32) => format!("(-{a})"),
                    (UnOp::Neg, t) if word_of(t) == Word::I32 => {
                        self.wrap(t, s.cast(Word::I32, &format!("({} - {})", self.u32(0), s.cast(Word::U32, &a))))
                    }
                    (UnOp::Neg, t) => self.wrap(t, format!("({} - {a})", s.int_lit(word_of(t), 0))),
                    (UnOp::Not, Ty::Bool) => format!("(!{a})"),
                    (UnOp::Not, t) => self.wrap(t, format!("(~{a})")),
                }
            }
            Expr::Binary(op, t, a, b) => self.binary(op, t, a, b)?,
            Expr::Cast(t, a) => self.cast(t, a)?,
            Expr::Bitcast(t, a) => {
                let v = self.expr(a)?;
                match (a.ty(), t) {
                    (Ty::U32, Ty::F32) => s.bits_to_f32(&v),
                    (Ty::F32, Ty::U32) => s.f32_to_bits(&v),
                    // f16 is held as its bits already.
                    (Ty::U16, Ty::F16) | (Ty::F16, Ty::U16) => v,
                    (from, to) => return Err(QuantGenError(format!("bitcast {from} -> {to}"))),
                }
            }
            Expr::Select(_, c, a, b) => s.select(&self.expr(c)?, &self.expr(a)?, &self.expr(b)?),
        })
    }

    fn binary(&self, op: BinOp, t: Ty, a: &Expr, b: &Expr) -> Result<String, QuantGenError> {
        let s = self.syn;
        let lt = a.ty();
        let (x, y) = (self.expr(a)?, self.expr(b)?);
        let sym = op.symbol();
        if op.is_comparison() || matches!(op, BinOp::And | BinOp::Or) || t == Ty::F32 {
            return Ok(format!("({x} {sym} {y})"));
        }
        let signed = word_of(t) == Word::I32;
        Ok(match op {
            // Signed wrap-around is done in u32 (C leaves signed overflow undefined).
            BinOp::Add | BinOp::Sub | BinOp::Mul if signed => {
                self.wrap(t, s.cast(Word::I32, &format!("({} {sym} {})", s.cast(Word::U32, &x), s.cast(Word::U32, &y))))
            }
            BinOp::Shl | BinOp::Shr => {
                let amount = format!("({} & {})", s.cast(Word::U32, &y), self.u32(lt.bits() as u64 - 1));
                if op == BinOp::Shl && signed {
                    self.wrap(t, s.cast(Word::I32, &format!("({} << {amount})", s.cast(Word::U32, &x))))
                } else {
                    self.wrap(t, format!("({x} {sym} {amount})"))
                }
            }
            _ => self.wrap(t, format!("({x} {sym} {y})")),
        })
    }

    fn cast(&self, t: Ty, a: &Expr) -> Result<String, QuantGenError> {
        let s = self.syn;
        let from = a.ty();
        let v = self.expr(a)?;
        Ok(match (from, t) {
            (f, t) if f == t => v,
            (Ty::F16, Ty::F32) if self.dot && s.f16_to_f32_dot_fn().is_some() => s.call("ds4_f16_to_f32_dot", &[v], None),
            (Ty::F16, Ty::F32) => s.call("ds4_f16_to_f32", &[v], None),
            (Ty::F32, t) if t.is_int() => self.wrap(t, s.cast(word_of(t), &v)),
            (Ty::Bool, t) if t.is_int() => s.select(&v, &s.int_lit(word_of(t), 1), &s.int_lit(word_of(t), 0)),
            // A hoisted run byte (`runs.rs`): straight from its word where the target can.
            (Ty::U8 | Ty::I8, Ty::F32) => match self.run_byte_at(a).and_then(|(word, byte)| s.byte_to_f32(&word, byte, from.is_signed())) {
                Some(f) => f,
                None => s.narrow_int_to_f32(&v, from.is_signed()),
            },
            (Ty::U16 | Ty::I16, Ty::F32) => s.narrow_int_to_f32(&v, from.is_signed()),
            (f, Ty::F32) if f.is_int() => s.cast(Word::F32, &v),
            (f, t) if f.is_int() && t.is_int() => self.wrap(t, s.cast(word_of(t), &v)),
            (f, t) => return Err(QuantGenError(format!("{}: cast {f} -> {t} has no GPU lowering", self.spec.ggml))),
        })
    }

    /// The spec's constant tables and the f16 → f32 conversion (exact; subnormals,
    /// infinities and NaNs included); the dot products' cheaper conversion
    /// (`QuantSyntax::f16_to_f32_dot_fn`) only for kernels with dot products (`dots`).
    fn helpers(&self) -> Result<String, QuantGenError> {
        let s = self.syn;
        let mut out = String::new();
        for t in self.spec.tables {
            let w = word_of(t.ty);
            let values: Vec<String> = match t.data {
                TableData::F32(v) => v.iter().map(|&x| self.f32_const(x)).collect(),
                _ => (0..t.len()).map(|i| self.int_const(t.ty, t.bits(i))).collect(),
            };
            out.push_str(&s.table(&format!("T_{}", t.name), w, &values));
        }
        if let Some(f) = s.f16_to_f32_dot_fn() {
            out.push_str(f);
        }
        if let Some(f) = s.f16_to_f32_fn() {
            out.push_str(f);
            return Ok(out);
        }
        let u = |v| self.u32(v);
        let _ = writeln!(out, "{} {{", s.function("ds4_f16_to_f32", &[("h", Word::U32)], Word::F32, false));
        let lines = [
            s.decl("sign", Word::U32, false, &format!("((h & {}) << {})", u(0x8000), u(16))),
            s.decl("e", Word::U32, false, &format!("((h >> {}) & {})", u(10), u(0x1F))),
            s.decl("m", Word::U32, false, &format!("(h & {})", u(0x3FF))),
            s.decl("normal", Word::U32, false, &format!("(sign | ((e + {}) << {}) | (m << {}))", u(112), u(23), u(13))),
            s.decl("special", Word::U32, false, &format!("(sign | {} | (m << {}))", u(0x7F80_0000), u(13))),
            // Subnormal halves: m · 2^-24, exact in f32.
            s.decl("sub", Word::F32, false, &s.bits_to_f32(&format!("(sign | {})", s.f32_to_bits(&format!("({} * {})", s.cast(Word::F32, "m"), self.f32_const(2f32.powi(-24))))))),
        ];
        for l in lines {
            let _ = writeln!(out, "    {l}");
        }
        let normal_or_special = s.bits_to_f32(&s.select(&format!("(e == {})", u(31)), "special", "normal"));
        let _ = writeln!(out, "    return {};\n}}\n", s.select(&format!("(e == {})", u(0)), "sub", &normal_or_special));
        Ok(out)
    }

    /// `ds4_dq(ds4_blk, s, j)`: element `s·sub_block + j` of the block at byte `ds4_blk`.
    fn dequant_fn(&self) -> Result<String, QuantGenError> {
        let s = self.syn;
        let mut out = format!("// {} de-quantization, lowered from its declaration:\n", self.spec.ggml);
        for line in self.spec.to_string().lines() {
            let _ = writeln!(out, "//   {line}");
        }
        let params = [("ds4_blk", Word::Idx), ("s", Word::U32), ("j", Word::U32)];
        let _ = writeln!(out, "{} {{", s.function("ds4_dq", &params, Word::F32, true));
        for l in self.spec.lets {
            let _ = writeln!(out, "    {}", s.decl(&format!("v_{}", l.name), word_of(l.ty), false, &self.expr(l.value)?));
        }
        let _ = writeln!(out, "    return {};\n}}\n", self.expr(self.spec.value)?);
        Ok(out)
    }

    /// The call `ds4_dq(<block of element e of row `row`>)` as text.
    fn dq_call(&self, row_base: &str, e: &str) -> String {
        let s = self.syn;
        let (be, bb, sb) = (self.idx(self.spec.block_elems as u64), self.idx(self.spec.block_bytes as u64), self.idx(self.spec.sub_block as u64));
        let blk = format!("{row_base} + ({e} / {be}) * {bb}");
        let within = format!("({e} % {be})");
        let sub = s.cast(Word::U32, &format!("({within} / {sb})"));
        let lane = s.cast(Word::U32, &format!("({within} % {sb})"));
        s.call("ds4_dq", &[blk, sub, lane], Some(self.wbuf))
    }

    /// Lines that sum every thread's `v` over the block, and the expression holding the
    /// total in thread 0 afterwards: the target's block sum, or a shared-memory tree
    /// (unrolled; every thread reaches every barrier).
    fn block_total(&self, v: &str) -> (Vec<(usize, String)>, String) {
        let s = self.syn;
        if let Some(sum) = s.block_sum(v) {
            return (vec![(0, format!("{v} = {sum};"))], v.to_string());
        }
        let red = s.shared_array();
        let mut code = vec![(0, format!("{red}[ds4_tid] = {v};")), (0, s.barrier())];
        let mut stride = THREADS / 2;
        while stride > 0 {
            let st = self.idx(stride as u64);
            code.push((0, format!("if (ds4_tid < {st}) {{")));
            code.push((1, format!("{red}[ds4_tid] = {red}[ds4_tid] + {red}[ds4_tid + {st}];")));
            code.push((0, "}".into()));
            code.push((0, s.barrier()));
            stride /= 2;
        }
        (code, format!("{red}[0]"))
    }

    fn kernel_body(&self, kind: QuantKernelKind) -> Result<String, QuantGenError> {
        let s = self.syn;
        let b = |n: &str| s.buffer(n);
        let threads = self.idx(THREADS as u64);
        let mut o = String::new();
        let mut line = |depth: usize, text: String| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        match kind {
            QuantKernelKind::DequantRows => {
                line(1, s.decl("row", Word::Idx, false, &s.cast(Word::Idx, &format!("{}[ds4_bx]", b("ids")))));
                line(1, s.decl("row_base", Word::Idx, false, "row * row_bytes"));
                line(1, format!("{} {{", s.for_header(Word::Idx, "e", "ds4_tid", "k", &threads)));
                line(2, format!("{}[ds4_bx * k + e] = {};", b("out"), self.dq_call("row_base", "e")));
                line(1, "}".into());
            }
            QuantKernelKind::MatMulMma => return Err(QuantGenError("matmul_mma has its own body (cuda_mma.rs)".into())),
            QuantKernelKind::MatMul => {
                // Tokens t0 .. t0 + TOKENS; a token past m reads the last one's row (a valid
                // address) and is not stored.
                let tm = TOKENS as usize;
                line(1, s.decl("t0", Word::Idx, false, &format!("ds4_by * {}", self.idx(TOKENS))));
                let listed = format!("has_idx != {}", self.idx(0));
                let ex = s.select(&listed, &s.cast(Word::Idx, &format!("{}[ds4_by]", b("gexp"))), &self.idx(0));
                line(1, s.decl("row_base", Word::Idx, false, &format!("({ex} * n + ds4_bx) * row_bytes")));
                line(1, s.decl("xg", Word::Idx, false, "ds4_bx / ng"));
                for t in 0..tm {
                    // Row p{t} of this group, `ok{t}` whether it exists; a missing one reads
                    // the group's first row (a valid address) and is not stored.
                    let tt = format!("t0 + {}", self.idx(t as u64));
                    let plain = s.select(&format!("{tt} < m"), &s.cast(Word::I32, &tt), &s.int_lit(Word::I32, -1));
                    let raw = s.select(&listed, &format!("{}[ds4_by * {} + {}]", b("idx"), self.idx(TOKENS), self.idx(t as u64)), &plain);
                    line(1, s.decl(&format!("raw{t}"), Word::I32, false, &raw));
                    line(1, s.decl(&format!("ok{t}"), Word::Bool, false, &format!("raw{t} >= {}", s.int_lit(Word::I32, 0))));
                    let p = s.select(&format!("ok{t}"), &s.cast(Word::Idx, &format!("raw{t}")), &s.cast(Word::Idx, "raw0"));
                    line(1, s.decl(&format!("p{t}"), Word::Idx, false, &p));
                    line(1, s.decl(&format!("xo{t}"), Word::Idx, false, &format!("((p{t} / x_div) * groups + xg) * k")));
                    line(1, s.decl(&format!("acc{t}"), Word::F32, true, &self.f32_const(0.0)));
                }
                let tokens: Vec<runs::Token> = (0..tm).map(|t| runs::Token { xo: format!("xo{t}"), acc: format!("acc{t}") }).collect();
                for (d, l) in self.weight_runs(&runs::Walk::whole_row(&threads), &tokens)? {
                    line(1 + d, l);
                }
                // One block sum per token (the shared array is reused: a barrier after each).
                for t in 0..tm {
                    let (code, total) = self.block_total(&format!("acc{t}"));
                    for (d, l) in code {
                        line(1 + d, l);
                    }
                    line(1, format!("if (ds4_tid == {} && ok{t}) {{", self.idx(0)));
                    line(2, format!("{}[p{t} * n + ds4_bx] = {total};", b("out")));
                    line(1, "}".into());
                    line(1, s.barrier());
                }
            }
            QuantKernelKind::MatVec => {
                // Rows ds4_bx, ds4_bx + row_blocks, ..: fewer blocks than rows lets a block's
                // one-time work (tables staged in shared memory) serve several rows.
                line(1, format!("{} {{", s.for_header(Word::Idx, "row", "ds4_bx", "n", "row_blocks")));
                line(2, s.decl("acc", Word::F32, true, &self.f32_const(0.0)));
                line(2, format!("{} {{", s.for_header(Word::Idx, "jp", &self.idx(0), "picks", &self.idx(1))));
                line(3, s.decl("p", Word::Idx, false, "ds4_by * picks + jp"));
                line(3, s.decl("pick", Word::I32, true, &s.int_lit(Word::I32, 0)));
                line(3, format!("if (has_sel != {}) {{", self.idx(0)));
                line(4, format!("pick = {}[p];", b("sel")));
                line(3, "}".into());
                // A missing pick (top_k's -1: fewer finite scores than picks) adds nothing
                // and reads no weight (the same for every thread of the block).
                line(3, format!("if (pick >= {}) {{", s.int_lit(Word::I32, 0)));
                line(4, s.decl("ex", Word::Idx, false, &s.cast(Word::Idx, "pick")));
                line(4, s.decl("sc", Word::F32, true, &self.f32_const(1.0)));
                line(4, format!("if (has_wts != {}) {{", self.idx(0)));
                line(5, format!("sc = {}[p];", b("wts")));
                line(4, "}".into());
                line(4, s.decl("row_base", Word::Idx, false, "(ex * n + row) * row_bytes"));
                line(4, s.decl("xo", Word::Idx, false, "((p / x_div) * groups + row / ng) * k"));
                line(4, s.decl("part", Word::F32, true, &self.f32_const(0.0)));
                for (d, l) in self.weight_runs(&runs::Walk::whole_row(&threads), &[runs::Token { xo: "xo".into(), acc: "part".into() }])? {
                    line(4 + d, l);
                }
                line(4, "acc = acc + sc * part;".into());
                line(3, "}".into());
                line(2, "}".into());
                let (code, total) = self.block_total("acc");
                for (d, l) in code {
                    line(2 + d, l);
                }
                line(2, format!("if (ds4_tid == {}) {{", self.idx(0)));
                line(3, format!("{}[ds4_by * n + row] = {total};", b("out")));
                line(2, "}".into());
                if self.syn.block_sum("v").is_none() {
                    // The shared tree's array is reused by the next row.
                    line(2, s.barrier());
                }
                line(1, "}".into());
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_type_lowers_for_every_gpu_target() {
        for &t in ds4_ir::quant::supported() {
            let spec = ds4_ir::quant::spec(t).unwrap();
            for target in [Target::CudaSm90, Target::CudaSm120, Target::Metal] {
                for kind in QuantKernelKind::ALL.into_iter().filter(|k| k.available(target)) {
                    let k = quant_kernel(spec, kind, target).unwrap_or_else(|e| panic!("{t} {target}: {e}"));
                    assert!(k.source.contains(&k.name));
                }
            }
        }
    }

    #[test]
    fn wgsl_quant_kernels_validate_with_naga() {
        for &t in ds4_ir::quant::supported() {
            let spec = ds4_ir::quant::spec(t).unwrap();
            for kind in QuantKernelKind::ALL.into_iter().filter(|k| k.available(Target::Wgsl)) {
                match quant_kernel(spec, kind, Target::Wgsl) {
                    Ok(k) => {
                        crate::validate_wgsl(&k.source).unwrap_or_else(|e| panic!("{}: {e}\n{}", k.name, k.source));
                    }
                    // Only 64-bit types may be refused (WGSL has none).
                    Err(e) => assert!(e.0.contains("64-bit"), "{t}: {e}"),
                }
            }
        }
    }
}
