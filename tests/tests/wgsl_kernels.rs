//! Every op kernel's WGSL (`ds4_codegen`'s WGSL target) run on a Vulkan device through
//! wgpu, against its float64 reference on fresh random inputs: the CUDA test's cases and
//! bounds (`op_cases`). CI runs it on Mesa's software Vulkan (lavapipe), which `.ci/run`
//! installs and then requires (`DS4_REQUIRE_VULKAN=1`: no adapter is a failure there).
//! Elsewhere, without a Vulkan adapter, it prints "skipped: no Vulkan device" and passes.
//! Set DS4_CUDA_SEED to vary the inputs (default: the time), as for the CUDA test.

mod op_cases;

use ds4_codegen::Target;
use ds4_ir::kir::{Elem, Kernel, ParamKind, Ty};
use ds4_ir::rng::Rng;
use op_cases::*;
use std::collections::HashMap;
use wgpu::util::DeviceExt;

/// The Vulkan device the kernels run on.
struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    name: String,
}

/// The first Vulkan adapter (lavapipe in CI), or why there is none. Only Vulkan: the
/// WGSL target is what a Vulkan (or WebGPU) user of the engine runs.
fn gpu() -> Result<Gpu, String> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor { backends: wgpu::Backends::VULKAN, ..wgpu::InstanceDescriptor::new_without_display_handle() });
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default())).map_err(|e| e.to_string())?;
    let info = adapter.get_info();
    let desc = wgpu::DeviceDescriptor { label: Some("ds4 wgsl kernels"), required_limits: adapter.limits(), ..Default::default() };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(|e| e.to_string())?;
    Ok(Gpu { device, queue, name: format!("{} ({:?}, {})", info.name, info.device_type, info.driver) })
}

/// The device, or None after saying why the tests skip (a failure where the environment
/// requires one: `DS4_REQUIRE_VULKAN=1`).
fn device() -> Option<Gpu> {
    match gpu() {
        Ok(g) => Some(g),
        Err(why) if std::env::var("DS4_REQUIRE_VULKAN").as_deref() == Ok("1") => panic!("DS4_REQUIRE_VULKAN=1 but no Vulkan device: {why}"),
        Err(why) => {
            say(&format!("skipped: no Vulkan device ({why})"));
            None
        }
    }
}

/// A kernel's compute pipeline and its bind group layout: its buffers in parameter order
/// (storage, read-only where `read_only` says), then its scalars as one uniform, as the
/// WGSL target declares them (`wgsl.rs`'s `prelude`, `quant/wgsl.rs`).
struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

fn pipeline(gpu: &Gpu, source: String, entry: &str, read_only: &[bool]) -> Pipeline {
    let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(entry), source: wgpu::ShaderSource::Wgsl(source.into()) });
    let buffer = |ty| wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None };
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = read_only
        .iter()
        .enumerate()
        .map(|(i, &read_only)| wgpu::BindGroupLayoutEntry { binding: i as u32, visibility: wgpu::ShaderStages::COMPUTE, ty: buffer(wgpu::BufferBindingType::Storage { read_only }), count: None })
        .collect();
    entries.push(wgpu::BindGroupLayoutEntry { binding: read_only.len() as u32, visibility: wgpu::ShaderStages::COMPUTE, ty: buffer(wgpu::BufferBindingType::Uniform), count: None });
    let layout = gpu.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(entry), entries: &entries });
    let pl = gpu.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor { label: Some(entry), bind_group_layouts: &[Some(&layout)], ..Default::default() });
    let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(entry),
        layout: Some(&pl),
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    });
    Pipeline { pipeline, layout }
}

/// An op kernel's pipeline (its buffers read-only but those it writes).
fn op_pipeline(gpu: &Gpu, k: &Kernel) -> Pipeline {
    let read_only: Vec<bool> = k.params.iter().filter_map(|p| match p.kind {
        ParamKind::Buffer { mutable, .. } => Some(!mutable),
        _ => None,
    }).collect();
    pipeline(gpu, ds4_codegen::render(k, Target::Wgsl), &k.name, &read_only)
}

/// Bytes as 4-byte words, zero-padded (at least one: wgpu binds no empty buffer).
fn padded(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(v.len().next_multiple_of(4).max(4), 0);
    v
}

/// Values as the bytes of a buffer, each by `f` (its native-endian bytes).
fn words<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Runs `p` over `groups` workgroups on `buffers` (the first is the output, `out_bytes`
/// of which are read back) and the uniform `params`; the output's bytes.
fn dispatch(gpu: &Gpu, p: &Pipeline, buffers: &[Vec<u8>], params: &[u8], groups: (u32, u32, u32), out_bytes: usize) -> Vec<u8> {
    let init = |contents: &[u8], usage| gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: None, contents, usage });
    let bufs: Vec<wgpu::Buffer> = buffers.iter().map(|b| init(&padded(b), wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC)).collect();
    let mut uniform = params.to_vec();
    uniform.resize(uniform.len().next_multiple_of(16).max(16), 0);
    let params = init(&uniform, wgpu::BufferUsages::UNIFORM);
    let mut entries: Vec<wgpu::BindGroupEntry> = bufs.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
    entries.push(wgpu::BindGroupEntry { binding: bufs.len() as u32, resource: params.as_entire_binding() });
    let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &p.layout, entries: &entries });
    let size = out_bytes.next_multiple_of(4).max(4) as u64;
    let back = gpu.device.create_buffer(&wgpu::BufferDescriptor { label: Some("read back"), size, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
    let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        pass.set_pipeline(&p.pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
    }
    enc.copy_buffer_to_buffer(&bufs[0], 0, &back, 0, size);
    gpu.queue.submit([enc.finish()]);
    let slice = back.slice(..);
    slice.map_async(wgpu::MapMode::Read, |r| r.expect("the read-back buffer maps"));
    gpu.device.poll(wgpu::PollType::wait_indefinitely()).expect("the device finishes the kernel");
    // A binding, not a tail expression: the mapped view (a temporary) must go before the
    // buffer does, and a tail expression's temporaries outlive the block's locals.
    #[allow(clippy::let_and_return)]
    let bytes = slice.get_mapped_range()[..out_bytes].to_vec();
    bytes
}

/// A buffer's bytes as floats.
fn f32s_of(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|w| f32::from_ne_bytes([w[0], w[1], w[2], w[3]])).collect()
}

/// Runs one case of op kernel `k` on the device and compares it with the f64 reference.
fn run_case(gpu: &Gpu, p: &Pipeline, k: &Kernel, items: usize, args: &[A]) -> (usize, usize, f64) {
    let n_out = items * ds4_ir::kir_eval::out_len(k, &kargs_of(args));
    let mut buffers = vec![vec![0u8; 4 * n_out]];
    // The uniform: the item count, then each scalar in parameter order, a word each.
    let mut uniform = (items as u32).to_ne_bytes().to_vec();
    for (a, param) in args.iter().zip(k.inputs()) {
        match (a, param.kind) {
            (A::F(v), _) => buffers.push(words(v, |x| (x as f32).to_ne_bytes())),
            (A::I(v), _) => buffers.push(words(v, i32::to_ne_bytes)),
            (A::U(v), _) => uniform.extend((*v as u32).to_ne_bytes()),
            (A::S(v), ParamKind::Scalar { ty: Ty::F }) => uniform.extend((*v as f32).to_ne_bytes()),
            (A::S(v), _) => uniform.extend((*v as i32).to_ne_bytes()),
            (A::B(v), _) => uniform.extend((*v as u32).to_ne_bytes()),
        }
    }
    let groups = (items as u32).div_ceil(ds4_codegen::wgsl::WORKGROUP_SIZE);
    let out = dispatch(gpu, p, &buffers, &uniform, (groups, 1, 1), 4 * n_out);
    match k.out().1 {
        Elem::F => compare(k, items, args, Got::F(&f32s_of(&out))),
        Elem::I32 => compare(k, items, args, Got::I(&out.chunks_exact(4).map(|w| i32::from_ne_bytes([w[0], w[1], w[2], w[3]])).collect::<Vec<_>>())),
    }
}

#[test]
fn every_op_kernel_in_wgsl_matches_its_f64_reference() {
    let Some(gpu) = device() else { return };
    let seed = seed();
    println!("WGSL op kernel parity on {} (seed {seed}):", gpu.name);
    let mut pipelines = HashMap::new();
    let failures = every_op_kernel(&mut Rng(seed), |k, items, args| {
        let p = pipelines.entry(k.name.clone()).or_insert_with(|| op_pipeline(&gpu, k));
        run_case(&gpu, p, k, items, args)
    });
    assert!(failures.is_empty(), "WGSL kernels off their f64 reference: {failures:?}");
}

/// Every quant type's WGSL `dequant_rows`, `matvec` and `matmul` against the CPU code of
/// its spec (as `cuda_kernels`' quant test): random rows quantized by the CPU quantizer,
/// de-quantized in reverse row order bit for bit, and m tokens' products within 1e-5 of
/// Σ|w·x| of the f64 dot of the de-quantized row (the mat-vec with fewer row workgroups
/// than rows, the matmul over tokens not a multiple of its tile and in row groups).
/// A type the WGSL target cannot take (64-bit integers in its de-quantization) says so.
#[test]
fn every_quant_kernel_in_wgsl_matches_the_cpu_code_of_its_spec() {
    use ds4_codegen::quant::{quant_kernel, QuantKernelKind};
    let Some(gpu) = device() else { return };
    let mut r = Rng(seed());
    let mut failures = Vec::new();
    println!("WGSL quant kernel parity on {}:", gpu.name);
    let u = |v: usize| (v as u32).to_ne_bytes();
    for &t in ds4_ir::quant::supported() {
        if !ds4_ir::quant::can_quantize(t) {
            continue;
        }
        let spec = ds4_ir::quant::spec(t).expect("a supported type has a spec");
        let t0 = std::time::Instant::now();
        let (dq, mv) = match (quant_kernel(spec, QuantKernelKind::DequantRows, Target::Wgsl), quant_kernel(spec, QuantKernelKind::MatVec, Target::Wgsl)) {
            (Ok(dq), Ok(mv)) => (dq, mv),
            (Err(e), _) | (_, Err(e)) => {
                println!("{t}: no WGSL kernel ({e})");
                continue;
            }
        };
        let read_only = |params: &[ds4_codegen::quant::QParam]| -> Vec<bool> {
            params.iter().filter_map(|p| match p {
                ds4_codegen::quant::QParam::Buffer { mutable, .. } => Some(!mutable),
                _ => None,
            }).collect()
        };
        let (rows, m) = (r.range(1, 100), r.range(1, 4));
        let k = t.block_elems() * r.range(1, 5);
        let q = QuantRows::random(t, rows, k, &mut r);
        let (bytes, rb) = (&q.bytes, q.row_bytes);
        // dequant_rows: rows in reverse order, bit for bit.
        let ids: Vec<i32> = (0..rows as i32).rev().collect();
        let p = pipeline(&gpu, dq.source.clone(), &dq.name, &read_only(&dq.params));
        let params = [u(k), u(rb)].concat();
        let got = f32s_of(&dispatch(&gpu, &p, &[vec![0u8; 4 * rows * k], bytes.to_vec(), words(&ids, i32::to_ne_bytes)], &params, (rows as u32, 1, 1), 4 * rows * k));
        let exact = ids.iter().enumerate().all(|(j, &row)| got[j * k..(j + 1) * k].iter().zip(&q.rows[row as usize]).all(|(a, b)| a.to_bits() == b.to_bits()));
        // matvec: m tokens against every row, in fewer row workgroups than rows.
        let x = f32s(&mut r, m * k, -1.0, 1.0);
        let row_blocks = r.range(1, rows + 1);
        let p = pipeline(&gpu, mv.source.clone(), &mv.name, &read_only(&mv.params));
        // n, k, row_bytes, picks, x_div, groups, ng, has_sel, has_wts, row_blocks.
        let params = [u(rows), u(k), u(rb), u(1), u(1), u(1), u(rows), u(0), u(0), u(row_blocks)].concat();
        let xb = words(&x, f32::to_ne_bytes);
        let got = f32s_of(&dispatch(&gpu, &p, &[vec![0u8; 4 * m * rows], bytes.to_vec(), xb.clone(), words(&[0i32], i32::to_ne_bytes), xb], &params, (row_blocks as u32, m as u32, 1), 4 * m * rows));
        let mut worst = 0f64;
        for ti in 0..m {
            for row in 0..rows {
                worst = worst.max(q.error(got[ti * rows + row], row, &x[ti * k..(ti + 1) * k]));
            }
        }
        // matmul (a prefill's): m2 tokens, not a multiple of its tile, in TOKENS-token
        // workgroups; the rows in two groups where they split evenly (group g reads x's
        // g-th slice of k).
        let mm = quant_kernel(spec, QuantKernelKind::MatMul, Target::Wgsl).expect("a WGSL matvec's type has a WGSL matmul");
        let (m2, groups) = (r.range(2, 40), if rows % 2 == 0 { 2 } else { 1 });
        let x2 = f32s(&mut r, m2 * groups * k, -1.0, 1.0);
        let p = pipeline(&gpu, mm.source.clone(), &mm.name, &read_only(&mm.params));
        // n, k, row_bytes, m, groups, ng, x_div, has_idx.
        let params = [u(rows), u(k), u(rb), u(m2), u(groups), u(rows / groups), u(1), u(0)].concat();
        let none = words(&[0i32], i32::to_ne_bytes);
        let tiles = m2.div_ceil(ds4_codegen::quant::TOKENS as usize) as u32;
        let got = f32s_of(&dispatch(&gpu, &p, &[vec![0u8; 4 * m2 * rows], bytes.to_vec(), words(&x2, f32::to_ne_bytes), none.clone(), none], &params, (rows as u32, tiles, 1), 4 * m2 * rows));
        let mut worst_mm = 0f64;
        for ti in 0..m2 {
            for row in 0..rows {
                let xo = (ti * groups + row / (rows / groups)) * k;
                worst_mm = worst_mm.max(q.error(got[ti * rows + row], row, &x2[xo..xo + k]));
            }
        }
        let ok = exact && worst < 1e-5 && worst_mm < 1e-5;
        println!("{t}: {rows} rows of {k}, dequant_rows bit-exact {exact}; worst |Δ|/Σ|w·x|: matvec ({m} tokens, {row_blocks} row workgroups) {worst:.2e}, matmul ({m2} tokens, {groups} row groups) {worst_mm:.2e} ({:.1} s){}", t0.elapsed().as_secs_f64(), if ok { "" } else { "  FAIL" });
        if !ok {
            failures.push(t.to_string());
        }
    }
    assert!(failures.is_empty(), "WGSL quant kernels off the CPU code of their spec: {failures:?}");
}
