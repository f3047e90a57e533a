//! `ds4 bench --synthetic ds4-flash`'s model: DeepSeek-V4-Flash's layout with its big
//! tensors as holes of a sparse file (the CUDA backend makes them in device memory).
//! Checked here without a GPU: the layout loads through the normal loader, the deferred
//! tensors are exactly the big ones, and the roofline's bytes per token are plausible.

use ds4_ir::GgmlType;
use ds4_model::gguf::GgufFile;
use ds4_model::synthetic::{build_writer, RealLayout, SynthConfig};
use ds4_runtime::traffic::decode_weight_bytes;
use ds4_runtime::Model;

fn load(layers: usize, recipe: RealLayout) -> (Model, Vec<String>) {
    let w = build_writer(&SynthConfig::ds4_flash(layers, recipe)).unwrap();
    let deferred: Vec<String> = w.deferred_names().map(String::from).collect();
    let path = std::env::temp_dir().join(format!("ds4-test-synth-{}-{layers}.gguf", std::process::id()));
    w.write_sparse(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    (Model::from_gguf(file).unwrap(), deferred)
}

#[test]
fn full_size_layout_loads_with_real_types() {
    let (m, deferred) = load(43, RealLayout::Q2);
    assert_eq!((m.hp.n_layer, m.hp.d, m.hp.n_expert, m.hp.vocab), (43, 4096, 256, 129_280));
    let ty = |n: &str| m.weights.get(n).unwrap().ty;
    assert_eq!(ty("blk.5.ffn_gate_exps.weight"), GgmlType::Iq2Xxs);
    assert_eq!(ty("blk.5.ffn_down_exps.weight"), GgmlType::Q2K);
    assert_eq!(ty("blk.5.attn_q_b.weight"), GgmlType::Q8_0);
    assert_eq!(ty("output.weight"), GgmlType::Q8_0);
    // Deferred: every quantized tensor and every F16 one over 1 MiB, nothing else.
    for name in &deferred {
        let w = m.weights.get(name).unwrap();
        assert!(w.ty != GgmlType::F32 && w.ty != GgmlType::I32, "{name} is {} and deferred", w.ty);
        assert!(w.bytes.len() > 1 << 20 || w.ty != GgmlType::F16, "{name}: small F16 deferred");
    }
    assert!(deferred.iter().any(|n| n == "token_embd.weight"));
    // The small tensors are there: norms are ones, not holes.
    let norm = m.weights.get("blk.0.attn_norm.weight").unwrap().to_vec::<f32>();
    assert!(norm.iter().all(|&v| v == 1.0));
    // mksynth's file of the same layout reads 9.568 GB per decoded token (measured).
    let bytes = decode_weight_bytes(&m.graph_last, &m.weights) as f64;
    println!("ds4-flash q2: {:.3} GB of weights per decoded token", bytes / 1e9);
    assert!((9.4e9..9.8e9).contains(&bytes), "{bytes}");
}

/// On CUDA the q2 layout's experts take the integer decode kernels: the gate and up as
/// IQ2_XXS_R (the kernel set asks by the device type; a build that asked by the file's
/// type fell back to the float mat-vec, 40% slower, with every parity test passing), the
/// down as Q2_K, with the routing that makes their digits.
#[test]
fn q2_experts_take_the_integer_kernels_on_cuda() {
    use ds4_codegen::{cuda_digits, cuda_router, manifest::KernelSet, quant::QuantKernelKind, Target};
    let (m, _) = load(2, RealLayout::Q2);
    for target in [Target::CudaSm90, Target::CudaSm120] {
        let set = KernelSet::for_graph(&m.graph_last, target);
        for k in [cuda_digits::MATVEC_IQ2_XXS, cuda_digits::MATVEC_Q2_K, cuda_digits::X_DIGITS, cuda_router::WITH_DIGITS] {
            assert!(set.cuda.contains_key(k), "{target}: {k} not in the kernel set");
        }
        assert!(set.quant.keys().any(|&(kind, t)| kind == QuantKernelKind::MatMulMma && t == GgmlType::Iq2XxsR), "{target}: the prefill's IQ2_XXS_R matmul");
        assert!(!set.quant.keys().any(|&(_, t)| t == GgmlType::Iq2Xxs), "{target}: no kernel of the file's IQ2_XXS (the upload regroups it)");
    }
}

#[test]
fn q4_layout_and_short_stacks() {
    let (m, _) = load(3, RealLayout::Q4);
    assert_eq!(m.hp.n_layer, 3);
    assert_eq!(m.weights.get("blk.2.ffn_down_exps.weight").unwrap().ty, GgmlType::Q4K);
}
