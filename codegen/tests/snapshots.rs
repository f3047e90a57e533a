//! Snapshots of generated source, reviewed by eye when they change (`cargo insta
//! review`, or `INSTA_UPDATE=always` and a look at the diff). Representative kernels
//! for CUDA and WGSL; every kernel for Metal, which cannot be compiled or run here.

use ds4_codegen::{render, Target};
use ds4_ir::kernels;
use ds4_ir::kir::Kernel;

fn kernel(name: &str) -> Kernel {
    kernels::all().into_iter().find(|k| k.name == name).unwrap_or_else(|| panic!("no kernel {name}"))
}

#[test]
fn cuda_sm120_snapshots() {
    for name in ["rms_norm", "rope", "attention_partial"] {
        insta::assert_snapshot!(format!("cuda_sm120_{name}"), render(&kernel(name), Target::CudaSm120));
    }
}

#[test]
fn cuda_attention_tiled_snapshot() {
    insta::assert_snapshot!("cuda_sm90_attention_tiled", ds4_codegen::cuda_attention::source(Target::CudaSm90).unwrap());
}

#[test]
fn wgsl_snapshots() {
    for name in ["rms_norm", "rope", "attention_partial"] {
        insta::assert_snapshot!(format!("wgsl_{name}"), render(&kernel(name), Target::Wgsl));
    }
}

#[test]
fn metal_snapshots() {
    for k in kernels::all() {
        insta::assert_snapshot!(format!("metal_{}", k.name), render(&k, Target::Metal));
    }
}
