//! Every kernel renders for every target; WGSL passes naga's validator (and naga can
//! take it on to MSL); rendering is a pure function of the IR.

use ds4_codegen::{render, validate_wgsl, Target};
use ds4_ir::kernels;

#[test]
fn every_kernel_renders_for_every_target() {
    for k in kernels::all() {
        for t in Target::ALL {
            let src = render(&k, t);
            assert!(src.contains(&k.name), "{} for {t}: kernel name missing", k.name);
            let opens = src.matches('{').count();
            assert_eq!(opens, src.matches('}').count(), "{} for {t}: unbalanced braces", k.name);
        }
    }
}

#[test]
fn every_wgsl_kernel_validates_with_naga() {
    for k in kernels::all() {
        let src = render(&k, Target::Wgsl);
        if let Err(e) = validate_wgsl(&src) {
            panic!("{}: WGSL does not validate:\n{e}\n{src}", k.name);
        }
    }
}

/// naga's own WGSL → MSL path accepts our WGSL: a cross-check of the Metal target's
/// inputs, since MSL itself cannot be compiled here.
#[test]
fn every_wgsl_kernel_translates_to_msl_with_naga() {
    use naga::back::msl;
    for k in kernels::all() {
        let src = render(&k, Target::Wgsl);
        let module = validate_wgsl(&src).unwrap();
        let info =
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default())
                .validate(&module)
                .unwrap();
        let options = msl::Options { fake_missing_bindings: true, ..Default::default() };
        let pipeline = msl::PipelineOptions::default();
        let (text, _) = msl::write_string(&module, &info, &options, &pipeline)
            .unwrap_or_else(|e| panic!("{}: naga cannot write MSL: {e:?}", k.name));
        assert!(text.contains(&k.name), "{}: entry point missing from naga's MSL", k.name);
    }
}

#[test]
fn rendering_is_deterministic() {
    let (a, b) = (kernels::all(), kernels::all());
    for (ka, kb) in a.iter().zip(&b) {
        for t in Target::ALL {
            assert_eq!(render(ka, t), render(kb, t), "{} for {t}", ka.name);
        }
    }
}

#[test]
fn target_names_round_trip() {
    for t in Target::ALL {
        assert_eq!(Target::parse(t.name()), Ok(t));
    }
    assert_eq!(Target::parse("cuda-sm120"), Ok(Target::CudaSm120));
    let e = Target::parse("cuda").unwrap_err().to_string();
    assert!(e.contains("cuda-sm90") && e.contains("wgsl"), "{e}");
}

/// CUDA blocks fit a kernel's parallel loops when their trip counts are known when it is
/// generated (hadamard_fp4: 128 values), and are PAR_THREADS when one depends on a
/// launch parameter (rms_norm's row length).
#[test]
fn block_threads_follow_known_trip_counts() {
    let by_name = |n: &str| ds4_ir::kernels::all().into_iter().find(|k| k.name == n).unwrap();
    let hadamard = by_name("hadamard_fp4");
    assert_eq!(ds4_codegen::render::par_trips(&hadamard), Some(128));
    assert_eq!(ds4_codegen::block_threads(&hadamard, Target::CudaSm90), 128);
    let norm = by_name("rms_norm");
    assert_eq!(ds4_codegen::render::par_trips(&norm), None);
    assert_eq!(ds4_codegen::block_threads(&norm, Target::CudaSm90), ds4_codegen::render::PAR_THREADS);
    // Other targets run items on one thread.
    assert_eq!(ds4_codegen::block_threads(&hadamard, Target::Wgsl), 1);
}
