//! What a graph needs generated, and the manifest that describes it: `ds4 gen` writes
//! the sources and `manifest.json`; the GPU runtimes compile the same set.
//!
//! The set is decided from the graph alone: every op kernel of `ds4_ir::kernels::all()`
//! that some node runs, the CUDA-only kernels written as CUDA text that some node runs
//! there (`attention_tiled`, see `cuda_attention.rs`; `split_x_bf16x3`, see
//! `quant/cuda_split.rs`), and, per weight type that a matmul,
//! the experts or the embedding reads, the quant kernels of that type. Small weight
//! vectors (norm weights, biases, sinks) are de-quantized once at load and need no kernel.
//! Output is deterministic: kernels in `kernels::all()` order, then the CUDA-only ones,
//! then quant types in `GgmlType` order.

use crate::quant::{self, QParam, QuantKernelKind};
use crate::text_kernels::{self, TextParams};
use crate::{cuda_argmax, cuda_attention, cuda_attention_merge, cuda_copy, cuda_digits, cuda_f16_vec, cuda_hc_mix, cuda_hc_pre, cuda_indexer_scores, cuda_norm_rope, cuda_router, cuda_top_k, cuda_top_k_radix, render, Target};
use ds4_ir::kir::{Elem, Kernel, ParamKind, Ty};
use ds4_ir::{DType, Dim, GgmlType, Graph, Op};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Kernels a graph needs: op kernels by name, CUDA-only kernels by name (generated for
/// the CUDA targets alone) and quant kernels by (kind, type), each with the ops that run it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelSet {
    pub ops: BTreeMap<String, BTreeSet<&'static str>>,
    pub cuda: BTreeMap<&'static str, BTreeSet<&'static str>>,
    pub quant: BTreeMap<(QuantKernelKind, GgmlType), BTreeSet<&'static str>>,
}

/// The op kernels (by `kernels::all()` name) a GPU target runs for `op`, in order.
pub fn op_kernels(op: &Op) -> &'static [&'static str] {
    match op {
        Op::RmsNorm { .. } => &["rms_norm"],
        Op::RmsNormPlain { .. } => &["rms_norm_plain"],
        Op::Add => &["add"],
        Op::HcBroadcast { .. } => &["hc_broadcast"],
        Op::HcMix { .. } => &["hc_mix"],
        Op::HcHeadMix { .. } => &["hc_head_mix"],
        Op::HcCollapse { .. } => &["hc_collapse"],
        Op::HcExpand { .. } => &["hc_expand"],
        Op::Rope { .. } => &["rope"],
        Op::Fp8RoundTrip { .. } => &["fp8_roundtrip"],
        Op::HadamardFp4 { .. } => &["hadamard_fp4"],
        Op::RouterScores => &["router_scores"],
        Op::RouterBiased => &["router_biased"],
        Op::RouterHash { .. } => &["router_hash"],
        Op::TopK { .. } => &["top_k"],
        Op::RouterWeights { .. } => &["router_weights"],
        // The experts' clamped SwiGLU runs between their two mat-vecs.
        Op::SwiGlu { .. } => &["swiglu"],
        // Prefill runs the experts grouped by expert, per (token, pick), then adds picks up.
        Op::MoeExperts { .. } => &["swiglu", "moe_combine"],
        // The new rows' slots gathered from the compressor's logs, then pooled.
        Op::CompressPool { .. } => &["compress_gather", "compress_pool"],
        // One item per (token, head), then per token.
        Op::IndexerScores { .. } => &["indexer_head_dots", "indexer_combine"],
        // The row list in chunks (more of them when there are few items), then a merge.
        Op::Attention { .. } => &["attention_partial", "attention_merge"],
        // A tensor-core matmul split over k adds its slices (CUDA, runtime/src/cuda/exec/matvec.rs).
        Op::MatMul | Op::GroupedMatMul { .. } => &["add"],
        Op::Input { .. } | Op::Weight { .. } | Op::LastRow | Op::Embed | Op::Reshape { .. } | Op::WindowKv { .. } | Op::RowCache { .. } => &[],
    }
}

/// The CUDA-only kernels (CUDA text with an op kernel's contract) a CUDA target runs for
/// `op`, besides or in place of [`op_kernels`].
pub fn cuda_kernels(op: &Op) -> &'static [&'static str] {
    match op {
        // attention_partial's chunks with 16 heads per block (heads up to MAX_HD dims); the
        // merge by a warp's chunk maxima, and with the inverse RoPE after it.
        Op::Attention { .. } => &[cuda_attention::NAME, cuda_attention::ONE_NAME, cuda_attention_merge::NAME, cuda_attention_merge::ROPE_NAME, cuda_attention_merge::ROPE_EARLY_NAME],
        // hc_mix's Sinkhorn in one warp (nh² ≤ 32); a decode token's whole pre chain (norm,
        // projection, mix, collapse) in one launch.
        Op::HcMix { .. } => &[cuda_hc_mix::NAME, cuda_hc_pre::NAME, cuda_hc_pre::HC_COMB],
        // A row's RMS norm, RoPE and FP8 round trip in one launch (the attention's query
        // heads and KV row); a RoPE and the Hadamard transform after it (the indexer's query).
        Op::Rope { .. } => &[cuda_norm_rope::NAME, cuda_norm_rope::ROPE_HADAMARD],
        // A decode token's indexer scores in one launch (its dots and their combination).
        Op::IndexerScores { .. } => &[cuda_indexer_scores::NAME],
        // A row's top k by sorting it in shared memory (rows up to cuda_top_k::MAX_N), or
        // by radix selection then a sort of the k picks (long rows).
        Op::TopK { .. } => &[cuda_top_k::NAME, cuda_top_k_radix::NAME, cuda_top_k_radix::ROWS_NAME],
        // A decode token's routing (scores, selection, top k, weights) in one launch.
        Op::RouterScores => &[cuda_router::NAME],
        // The rows the stateful ops append to their logs, copied in a decode step's graph.
        Op::WindowKv { .. } | Op::CompressPool { .. } | Op::RowCache { .. } => &[cuda_copy::NAME],
        // x's bf16 parts for the tensor-core matmuls' element-term path.
        Op::MatMul | Op::GroupedMatMul { .. } | Op::MoeExperts { .. } => &[quant::cuda_split::NAME],
        _ => &[],
    }
}

impl KernelSet {
    /// Every kernel `graph` runs on `target` (its weights in their device types,
    /// `quant::device_type`).
    pub fn for_graph(graph: &Graph, target: Target) -> KernelSet {
        let mut set = KernelSet::default();
        for id in graph.order() {
            let node = graph.node(id);
            for k in op_kernels(&node.op) {
                set.ops.entry(k.to_string()).or_default().insert(node.op.name());
            }
            for &k in cuda_kernels(&node.op) {
                set.cuda.entry(k).or_default().insert(node.op.name());
            }
            let weight_inputs: &[usize] = match node.op {
                Op::Embed => &[1],
                Op::MatMul | Op::GroupedMatMul { .. } => &[1],
                Op::MoeExperts { .. } => &[3, 4, 5],
                _ => &[],
            };
            // Matmuls: the mat-vec (decode) and the token-tiled matmul (prefill).
            let kinds: &[QuantKernelKind] = match node.op {
                Op::Embed => &[QuantKernelKind::DequantRows],
                Op::MatMul | Op::GroupedMatMul { .. } | Op::MoeExperts { .. } => &[QuantKernelKind::MatVec, QuantKernelKind::MatMul, QuantKernelKind::MatMulMma],
                _ => &[QuantKernelKind::MatVec],
            };
            // The indexer's query-row dots run as an F32 matmul on CUDA (runtime/src/cuda/exec/indexer.rs).
            if let Op::IndexerScores { .. } = node.op {
                set.quant.entry((QuantKernelKind::MatMulMma, ds4_ir::GgmlType::F32)).or_default().insert(node.op.name());
            }
            let ins = graph.inputs(id);
            for &i in weight_inputs {
                let w = &graph.node(ins[i]).ty;
                if let DType::Weight(t) = w.dtype {
                    // GGUF order reversed: the last dimension is the row.
                    let row_len = match w.shape.0.last() {
                        Some(&Dim::Const(n)) => n as u64,
                        _ => 1,
                    };
                    let t = quant::device_type(target, t, row_len);
                    for &kind in kinds {
                        set.quant.entry((kind, t)).or_default().insert(node.op.name());
                    }
                    // A decode token's IQ2_XXS gate and up (as IQ2_XXS_R), Q2_K down, in integers
                    // (cuda_digits.rs).
                    let digits = match (i, t) {
                        (3, ds4_ir::GgmlType::Iq2XxsR) => Some(cuda_digits::MATVEC_IQ2_XXS),
                        (5, ds4_ir::GgmlType::Q2K) => Some(cuda_digits::MATVEC_Q2_K),
                        _ => None,
                    };
                    if let (Some(mv), Op::MoeExperts { .. }, true) = (digits, &node.op, target.is_cuda()) {
                        for k in [cuda_digits::X_DIGITS, mv] {
                            set.cuda.entry(k).or_default().insert(node.op.name());
                        }
                        // The gate and up's digits made by the routing's launch; the down's
                        // by the gate and up (their SwiGLU's).
                        if mv == cuda_digits::MATVEC_IQ2_XXS {
                            for k in [cuda_router::WITH_DIGITS, cuda_digits::MATVEC_IQ2_XXS_SWIGLU] {
                                set.cuda.entry(k).or_default().insert(node.op.name());
                            }
                        }
                    }
                    // A decode token's F16 mat-vecs in 16-byte loads (cuda_f16_vec.rs).
                    if matches!(node.op, Op::MatMul | Op::GroupedMatMul { .. }) && t == ds4_ir::GgmlType::F16 && target.is_cuda() {
                        set.cuda.entry(cuda_f16_vec::NAME).or_default().insert(node.op.name());
                    }
                    // A decode token's mat-vecs over every row of Q8_0_R (quant/cuda_matvec_dense.rs).
                    if matches!(node.op, Op::MatMul | Op::GroupedMatMul { .. }) && t == quant::cuda_matvec_dense::DENSE_TYPE && target.is_cuda() {
                        for form in quant::cuda_matvec_dense::FORMS {
                            set.cuda.entry(form.name).or_default().insert(node.op.name());
                        }
                        // Short rows in integers against x's digits (cuda_digits.rs).
                        if row_len as usize <= cuda_digits::DENSE_MAX_K {
                            for k in [cuda_digits::X_DIGITS, cuda_digits::MATVEC_Q8_0_R] {
                                set.cuda.entry(k).or_default().insert(node.op.name());
                            }
                            // Their x's norm and its digits in one launch.
                            set.cuda.entry(cuda_digits::NORM_DIGITS).or_default().insert(Op::RmsNorm { eps: 0.0 }.name());
                        }
                    }
                }
            }
        }
        // A greedy decode's pick of the logits, on the device (cuda_argmax.rs).
        if graph.outputs.iter().any(|(name, _)| name == "logits") {
            set.cuda.entry(cuda_argmax::NAME).or_default().insert("logits");
        }
        set
    }

    /// Every op kernel and every quant kernel of every registered type (for tests and
    /// `ds4 gen` without a model's graph).
    pub fn everything() -> KernelSet {
        let mut set = KernelSet::default();
        for k in ds4_ir::kernels::all() {
            set.ops.insert(k.name.clone(), BTreeSet::new());
        }
        for k in text_kernels::all() {
            set.cuda.insert(k.name, BTreeSet::new());
        }
        for &t in ds4_ir::quant::supported() {
            for kind in QuantKernelKind::ALL {
                set.quant.insert((kind, t), BTreeSet::new());
            }
        }
        set
    }

    /// Adds `other`'s kernels (and the ops that run them) to this set.
    pub fn extend(&mut self, other: KernelSet) {
        for (k, ops) in other.ops {
            self.ops.entry(k).or_default().extend(ops);
        }
        for (k, ops) in other.cuda {
            self.cuda.entry(k).or_default().extend(ops);
        }
        for (k, ops) in other.quant {
            self.quant.entry(k).or_default().extend(ops);
        }
    }
}

/// One generated source file.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub file: String,
    pub source: String,
}

/// The sources of `set` for `target`, and `manifest.json`'s text.
pub fn generate(set: &KernelSet, target: Target) -> Result<(Vec<SourceFile>, String), quant::QuantGenError> {
    let mut files = Vec::new();
    let mut entries = Vec::new();
    let ext = target.extension();
    for k in ds4_ir::kernels::all() {
        let Some(ops) = set.ops.get(&k.name) else { continue };
        let file = format!("{}.{ext}", k.name);
        files.push(SourceFile { file: file.clone(), source: render(&k, target) });
        entries.push(op_entry(&k, ops, &file, target));
    }
    // The CUDA-only kernels (other targets have none), in their list's order; a name the
    // set holds that the list lacks is an error, not a kernel quietly left out.
    let text = text_kernels::all();
    if let Some(unknown) = set.cuda.keys().find(|n| !text.iter().any(|k| k.name == **n)) {
        return Err(quant::QuantGenError(format!("{unknown}: not a CUDA-text kernel (codegen/src/text_kernels.rs)")));
    }
    for k in &text {
        let (Some(ops), Some(source)) = (set.cuda.get(k.name), k.source(target)) else { continue };
        let file = format!("{}.{ext}", k.name);
        files.push(SourceFile { file: file.clone(), source });
        entries.push(match &k.params {
            TextParams::Contract(contract) => contract_entry(k.name, contract, ops, &file, &k.launch, k.manifest_shared),
            TextParams::Own(params) => cuda_entry(k.name, ops, &file, "", &qparams_json(params), &k.launch, k.manifest_shared),
        });
    }
    for ((kind, t), ops) in &set.quant {
        if !kind.available(target) || !quant::target_stores(target, *t) {
            continue;
        }
        let spec = ds4_ir::quant::spec(*t).ok_or_else(|| quant::QuantGenError(format!("{t}: no quant declaration")))?;
        if target == Target::Cpu {
            // The CPU's quant code is generated by `quant_type!` at compile time; the
            // declaration it is generated from is what `gen` can show.
            let file = format!("{}.spec.txt", quant::type_slug(*t));
            if !files.iter().any(|f: &SourceFile| f.file == file) {
                files.push(SourceFile { file: file.clone(), source: spec.to_string() });
            }
            entries.push(format!(
                "    {{\"name\": \"{}\", \"kind\": \"quant\", \"file\": \"{file}\", \"ops\": {}, \"quant_type\": \"{t}\", \"launch\": \"compiled into the binary by quant_type!\"}}",
                quant::kernel_name(*kind, *t),
                json_list(ops.iter().copied())
            ));
            continue;
        }
        let qk = quant::quant_kernel(spec, *kind, target)?;
        let file = format!("{}.{ext}", qk.name);
        entries.push(quant_entry(&qk, ops, &file, target));
        files.push(SourceFile { file, source: qk.source });
    }
    let manifest = format!("{{\n  \"target\": \"{target}\",\n  \"kernels\": [\n{}\n  ]\n}}\n", entries.join(",\n"));
    Ok((files, manifest))
}

fn json_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<String> = items.map(|s| format!("\"{s}\"")).collect();
    format!("[{}]", v.join(", "))
}

fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::Usize => "usize",
        Ty::I32 => "i32",
        Ty::F => "f32",
        Ty::Bool => "bool",
    }
}

/// How an op kernel is launched on `target` (one work item per output row).
fn op_launch(k: &Kernel, target: Target) -> String {
    match target {
        Target::Cpu => "{\"items\": \"rayon over output rows\"}".into(),
        // A block per item: its threads share the `'par`/`'sum` loops, or one thread.
        // Several blocks per item (splits along y) where the kernel allows it.
        Target::CudaSm90 | Target::CudaSm120 => {
            let y = if crate::splits_items(k, target) { "splits" } else { "1" };
            format!("{{\"grid\": \"[items, {y}, 1]\", \"block\": [{}, 1, 1]}}", crate::block_threads(k, target))
        }
        Target::Wgsl => format!("{{\"workgroups\": \"[ceil(items / {0}), 1, 1]\", \"workgroup_size\": [{0}, 1, 1]}}", crate::wgsl::WORKGROUP_SIZE),
        Target::Metal => "{\"threads\": \"[items, 1, 1]\"}".into(),
    }
}

/// A kernel's element types and parameters, as JSON lists.
fn params_json(k: &Kernel) -> (String, String) {
    let mut params = Vec::new();
    let mut dtypes = BTreeSet::new();
    for p in &k.params {
        let t = match p.kind {
            ParamKind::Buffer { elem, mutable } => {
                let e = if elem == Elem::F { "f32" } else { "i32" };
                dtypes.insert(e);
                format!("{}{e}[]", if mutable { "mut " } else { "" })
            }
            ParamKind::Scalar { ty } => ty_name(ty).to_string(),
        };
        params.push(format!("{}: {t}", p.name));
    }
    (json_list(dtypes.into_iter()), json_list(params.iter().map(|s| s.as_str())))
}

fn op_entry(k: &Kernel, ops: &BTreeSet<&'static str>, file: &str, target: Target) -> String {
    let (dtypes, params) = params_json(k);
    let mut s = String::new();
    let _ = write!(
        s,
        "    {{\"name\": \"{}\", \"kind\": \"op\", \"file\": \"{file}\", \"ops\": {}, \"dtypes\": {dtypes}, \"params\": {params}, \"launch\": {}, \"shared_mem_bytes\": 0, \"stages_output\": {}}}",
        k.name,
        json_list(ops.iter().copied()),
        op_launch(k, target),
        crate::stages_output(k, target)
    );
    s
}

/// A CUDA-text kernel with an IR kernel's contract (its parameters and output), its own
/// `launch` (the JSON object's fields) and shared memory.
fn contract_entry(name: &str, contract: &Kernel, ops: &BTreeSet<&'static str>, file: &str, launch: &str, shared: u32) -> String {
    let (dtypes, params) = params_json(contract);
    let extra = format!("\"contract\": \"{}\", \"dtypes\": {dtypes}, ", contract.name);
    cuda_entry(name, ops, file, &extra, &params, launch, shared)
}

/// A CUDA-text kernel's entry: `extra` fields (each ending in ", ") before its `params`
/// (a JSON list), its own `launch` (the JSON object's fields) and shared memory.
fn cuda_entry(name: &str, ops: &BTreeSet<&'static str>, file: &str, extra: &str, params: &str, launch: &str, shared: u32) -> String {
    format!(
        "    {{\"name\": \"{name}\", \"kind\": \"cuda\", \"file\": \"{file}\", \"ops\": {}, {extra}\"params\": {params}, \"launch\": {{{launch}}}, \"shared_mem_bytes\": {shared}}}",
        json_list(ops.iter().copied()),
    )
}

/// Quant-style parameters as a JSON list of "name: type" strings.
fn qparams_json(params: &[QParam]) -> String {
    let params: Vec<String> = params
        .iter()
        .map(|p| match p {
            QParam::Buffer { name, elem, mutable } => {
                let e = match elem {
                    quant::BufElem::Bytes => "u8",
                    quant::BufElem::F32 => "f32",
                    quant::BufElem::I32 => "i32",
                };
                format!("{name}: {}{e}[]", if *mutable { "mut " } else { "" })
            }
            QParam::Scalar { name } => format!("{name}: usize"),
            QParam::Float { name } => format!("{name}: f32"),
        })
        .collect();
    json_list(params.iter().map(|s| s.as_str()))
}

fn quant_entry(k: &quant::QuantKernel, ops: &BTreeSet<&'static str>, file: &str, target: Target) -> String {
    let block = match target {
        Target::Wgsl => "workgroup_size",
        Target::Metal => "threads_per_threadgroup",
        _ => "block",
    };
    format!(
        "    {{\"name\": \"{}\", \"kind\": \"quant\", \"file\": \"{file}\", \"ops\": {}, \"quant_type\": \"{}\", \"params\": {}, \"launch\": {{\"grid\": \"{}\", \"{block}\": [{}, 1, 1]}}, \"shared_mem_bytes\": {}}}",
        k.name,
        json_list(ops.iter().copied()),
        k.ggml,
        qparams_json(&k.params),
        k.kind.grid(),
        k.threads,
        k.shared_bytes
    )
}
