//! The CUDA backend when device memory runs out: a model the device cannot hold is
//! refused before anything is uploaded, with what it needs and what the device has; an
//! allocation past the device's memory is a sentence too; with the memory back the same
//! model loads. Its own test binary: it holds nearly all of the device's memory, which
//! would fail the tests of another binary running beside it (cargo runs binaries one at
//! a time). Without a CUDA device or driver it prints "skipped: no CUDA device" and passes.

use ds4_golden::model_path;
use ds4_runtime::cuda::{skip_reason, target_for, CudaBackend, CudaOptions, Device, Placement, WeightPlan, TENSOR_ALIGN};
use ds4_runtime::Model;

#[test]
fn a_model_the_device_cannot_hold_is_refused() {
    if let Some(why) = skip_reason() {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{why}");
        return;
    }
    let model = Model::load(&model_path("tiny-q2")).unwrap();
    let dev = Device::open().unwrap();
    let graphs = [&model.graph, &model.graph_plain];
    let plan = WeightPlan::of(&model.weights, &graphs, Placement::PerTensor, target_for(dev.sm)).unwrap();
    let (need, packed) = (plan.need, plan.packed);
    // All but half of what the weights need in their default placement (2 MiB-padded
    // tensors: ~330 MB for tiny-q2, while packed they take ~8 MB).
    let (free, _) = dev.memory().unwrap();
    let hold = dev.alloc_owned((free - need / 2) / TENSOR_ALIGN * TENSOR_ALIGN).unwrap();
    let e = CudaBackend::new(&model, &CudaOptions::default()).err().expect("the model loaded into too little memory").to_string();
    println!("refused: {e}");
    for part in ["the model's weights need", "of device memory", "nothing was uploaded", "--backend cpu"] {
        assert!(e.contains(part), "{part:?} not in: {e}");
    }
    assert!(packed < need / 2 && e.contains("--pack-weights"), "packed ({packed} bytes) would fit: {e}");
    let e = dev.alloc_owned(free).err().expect("an allocation of the whole device's free memory beside another").to_string();
    println!("refused: {e}");
    assert!(e.contains("out of device memory") && e.contains(" asked for (") && e.contains(" free of "), "{e}");
    // Packed, the same model fits in what is left; and loads as usual once the memory is back.
    CudaBackend::new(&model, &CudaOptions { placement: Placement::Packed, ..Default::default() }).unwrap();
    drop(hold);
    CudaBackend::new(&model, &CudaOptions::default()).unwrap();
}
