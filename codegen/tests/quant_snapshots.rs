//! Snapshots of the quant lowering and of `ds4 gen`'s manifest (reviewed by eye when
//! they change): one quant kernel per target, and the manifest of every kernel.

use ds4_codegen::manifest::{generate, KernelSet};
use ds4_codegen::quant::{quant_kernel, QuantKernelKind};
use ds4_codegen::Target;
use ds4_ir::GgmlType;

#[test]
fn q4_k_matvec_per_target() {
    let spec = ds4_ir::quant::spec(GgmlType::Q4K).unwrap();
    for target in [Target::CudaSm90, Target::CudaSm120, Target::Wgsl, Target::Metal] {
        let k = quant_kernel(spec, QuantKernelKind::MatVec, target).unwrap();
        insta::assert_snapshot!(format!("quant_matvec_q4_k_{}", target.name().replace('-', "_")), k.source);
    }
}

#[test]
fn q8_0_dequant_rows_cuda() {
    let spec = ds4_ir::quant::spec(GgmlType::Q8_0).unwrap();
    let k = quant_kernel(spec, QuantKernelKind::DequantRows, Target::CudaSm90).unwrap();
    insta::assert_snapshot!("quant_dequant_rows_q8_0_cuda_sm90", k.source);
}

/// The tensor-core matmul's element-term path (`quant/cuda_mma.rs`), with an offset.
#[test]
fn q2_k_matmul_mma_cuda() {
    let spec = ds4_ir::quant::spec(GgmlType::Q2K).unwrap();
    let k = quant_kernel(spec, QuantKernelKind::MatMulMma, Target::CudaSm90).unwrap();
    insta::assert_snapshot!("quant_matmul_mma_q2_k_cuda_sm90", k.source);
}

#[test]
fn manifest_of_every_kernel_per_target() {
    for target in Target::ALL {
        let (files, manifest) = generate(&KernelSet::everything(), target).unwrap();
        assert!(!files.is_empty());
        // Deterministic: a second run gives the same text.
        assert_eq!(generate(&KernelSet::everything(), target).unwrap().1, manifest);
        insta::assert_snapshot!(format!("manifest_{}", target.name().replace('-', "_")), manifest);
    }
}

#[test]
fn manifest_is_valid_json_naming_every_file() {
    let (files, manifest) = generate(&KernelSet::everything(), Target::CudaSm90).unwrap();
    for f in &files {
        assert!(manifest.contains(&format!("\"file\": \"{}\"", f.file)), "{} not in the manifest", f.file);
    }
    // Braces balance (the CLI test parses a written manifest with serde_json).
    let opens = manifest.matches('{').count();
    assert_eq!(opens, manifest.matches('}').count());
}
