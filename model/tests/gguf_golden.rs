//! The GGUF reader against the golden files (written by the `gguf` Python package, not by
//! us), and writer → reader round trips.

use ds4_ir::GgmlType;
use ds4_model::gguf::{GgufFile, MetaValue};
use ds4_model::gguf_writer::GgufWriter;
use ds4_model::inspect::{inspect_json, inspect_text};
use std::path::PathBuf;

fn golden_dir() -> PathBuf {
    match std::env::var_os("DS4_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden")),
    }
}

fn check_model(name: &str) {
    let dir = golden_dir().join("models").join(name);
    let f = GgufFile::open(&dir.join("model.gguf")).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(f.version, 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "deepseek4");
    assert_eq!(f.data_offset % f.alignment, 0);

    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let expected = reference["tensors"].as_object().expect("reference.json has a tensors object");
    assert!(!expected.is_empty());
    for (tname, info) in expected {
        let t = f.tensor(tname).unwrap_or_else(|| panic!("{name}: tensor '{tname}' missing"));
        let ty = info["type"].as_str().unwrap();
        assert_eq!(t.ggml_type, GgmlType::from_name(ty).unwrap(), "{name}: '{tname}' type");
        // reference.json shapes are PyTorch order (the reverse of GGUF ne order) as the
        // gguf Python package reports them: for a quantized type the innermost dimension
        // is in bytes (ne[0] / block_elems * block_bytes), e.g. Q8_0 with ne[0] = 256 → 272.
        let mut shape: Vec<u64> = info["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        shape.reverse();
        let mut ours = t.dims.clone();
        if t.ggml_type.is_quantized() {
            ours[0] = ours[0] / t.ggml_type.block_elems() as u64 * t.ggml_type.block_bytes() as u64;
        }
        assert_eq!(ours, shape, "{name}: '{tname}' shape (ne order, quantized ne[0] in bytes) vs reference");
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
    }
    // The file holds exactly the tensors reference.json lists.
    assert_eq!(f.tensors.len(), expected.len(), "{name}: tensor count");

    // Hyper-parameters read through the typed getters.
    let n_layer = f.get_u32("deepseek4.block_count").unwrap();
    assert_eq!(f.get_u32_array("deepseek4.attention.compress_ratios").unwrap().len(), n_layer as usize);
    assert_eq!(f.get_f32_array("deepseek4.swiglu_clamp_exp").unwrap().len(), n_layer as usize);
    assert!(f.get_f32("deepseek4.rope.freq_base").unwrap() > 0.0);
    f.get_bool("deepseek4.expert_weights_norm").unwrap();

    // The F32 embedding of the f32 model is readable as floats.
    if name == "tiny-f32" {
        let t = f.tensor("output_norm.weight").unwrap();
        assert_eq!(t.ggml_type, GgmlType::F32);
        let v: Vec<f32> =
            f.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert!(v.iter().all(|x| x.is_finite()));
    }

    // inspect covers every tensor and key, and its JSON agrees with the file.
    let text = inspect_text(&f);
    assert!(text.contains("general.architecture"));
    assert!(text.contains("\"deepseek4\""));
    for t in &f.tensors {
        assert!(text.contains(&t.name), "inspect text lacks {}", t.name);
    }
    let j = inspect_json(&f);
    assert_eq!(j["tensors"].as_array().unwrap().len(), f.tensors.len());
    assert_eq!(j["metadata"].as_array().unwrap().len(), f.metadata.len());
    assert_eq!(j["totals"]["bytes"].as_u64().unwrap(), f.tensors.iter().map(|t| t.n_bytes).sum::<u64>());
}

#[test]
fn golden_tiny_f32() {
    check_model("tiny-f32");
}

#[test]
fn golden_tiny_q2() {
    check_model("tiny-q2");
}

#[test]
fn golden_tiny_q4() {
    check_model("tiny-q4");
}

#[test]
fn golden_tokenizer() {
    let f = GgufFile::open(&golden_dir().join("tokenizer/tokenizer.gguf")).unwrap();
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 129280);
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "deepseek-v3");
    assert_eq!(f.get_str_array("tokenizer.ggml.merges").unwrap().len(), 127741);
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 0);
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 1);
    assert_eq!(f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(), 129280);

    // Abbreviated in inspect: the prefix and the count of the rest.
    let text = inspect_text(&f);
    assert!(text.contains("[str; 129280]"), "{text}");
    assert!(text.contains("… 129275 more]"), "{text}");
    assert!(text.len() < 20_000, "inspect output is not abbreviated: {} bytes", text.len());
    let j = inspect_json(&f);
    let tok = j["metadata"].as_array().unwrap().iter().find(|m| m["key"] == "tokenizer.ggml.tokens").unwrap();
    assert_eq!(tok["value"]["len"], 129280);
    assert_eq!(tok["value"]["truncated"], true);
    assert_eq!(tok["value"]["head"].as_array().unwrap().len(), 5);
}

/// One value of every metadata type, plus arrays of each, nested arrays and edge values.
fn all_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue::*;
    let mut m = vec![
        ("t.u8", U8(250)),
        ("t.i8", I8(-7)),
        ("t.u16", U16(65535)),
        ("t.i16", I16(-32768)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.f32", F32(1.5e-6)),
        ("t.bool_t", Bool(true)),
        ("t.bool_f", Bool(false)),
        ("t.str", Str("héllo ｜ wörld \u{1F600}".into())),
        ("t.str_empty", Str(String::new())),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f64", F64(std::f64::consts::PI)),
        ("t.f32_nan", F32(f32::NAN)),
        ("t.arr_u8", Array((0..=255u8).map(U8).collect())),
        ("t.arr_i8", Array(vec![I8(-1), I8(1)])),
        ("t.arr_u16", Array(vec![U16(1), U16(2)])),
        ("t.arr_i16", Array(vec![I16(-1)])),
        ("t.arr_u32", Array((0..43).map(|i| U32(i * 3)).collect())),
        ("t.arr_i32", Array(vec![I32(-5), I32(7)])),
        ("t.arr_f32", Array(vec![F32(10.0), F32(-0.25)])),
        ("t.arr_bool", Array(vec![Bool(true), Bool(false)])),
        ("t.arr_str", Array(vec![Str("a".into()), Str(String::new()), Str("Ġthe".into())])),
        ("t.arr_u64", Array(vec![U64(1 << 40)])),
        ("t.arr_i64", Array(vec![I64(-(1 << 40))])),
        ("t.arr_f64", Array(vec![F64(1e300), F64(-2.0)])),
        ("t.arr_empty", Array(vec![])),
        (
            "t.nested",
            Array(vec![
                Array(vec![U32(1), U32(2)]),
                Array(vec![]),
                Array(vec![Array(vec![Str("deep".into())])]),
            ]),
        ),
        ("t.nested_mixed_inner", Array(vec![Array(vec![U8(1)]), Array(vec![Str("x".into())])])),
    ];
    m.push(("general.architecture", Str("deepseek4".into())));
    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Metadata equality where NaN equals NaN.
fn same_value(a: &MetaValue, b: &MetaValue) -> bool {
    match (a, b) {
        (MetaValue::F32(x), MetaValue::F32(y)) => x.to_bits() == y.to_bits(),
        (MetaValue::F64(x), MetaValue::F64(y)) => x.to_bits() == y.to_bits(),
        (MetaValue::Array(x), MetaValue::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        _ => a == b,
    }
}

/// Deterministic pseudo-random bytes.
fn bytes(n: u64, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// Tensors of several types and ranks (including a 0-byte one and a scalar).
fn tensor_set() -> Vec<(String, GgmlType, Vec<u64>)> {
    vec![
        ("token_embd.weight".into(), GgmlType::F16, vec![64, 10]),
        ("blk.0.attn_q_a.weight".into(), GgmlType::Q8_0, vec![64, 3]),
        ("blk.0.ffn_down_exps.weight".into(), GgmlType::Q2K, vec![256, 2, 3]),
        ("blk.0.ffn_gate_exps.weight".into(), GgmlType::Iq2Xxs, vec![256, 1, 1, 2]),
        ("blk.0.ffn_gate_tid2eid.weight".into(), GgmlType::I32, vec![3, 7]),
        ("output_norm.weight".into(), GgmlType::F32, vec![5]),
        ("scalar".into(), GgmlType::F32, vec![]),
        ("empty".into(), GgmlType::F32, vec![0, 4]),
        ("mxfp4".into(), GgmlType::Mxfp4, vec![32, 3]),
    ]
}

fn build(alignment: Option<u64>) -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.alignment(a).unwrap();
    }
    for (k, v) in all_metadata() {
        w.add_meta(k, v).unwrap();
    }
    let mut datas = Vec::new();
    for (i, (name, ty, dims)) in tensor_set().into_iter().enumerate() {
        let n = ty.bytes_for(dims.iter().product()).unwrap();
        let d = bytes(n, i as u64 + 1);
        datas.push(d.clone());
        w.add_tensor(name, ty, &dims, d).unwrap();
    }
    (w, datas)
}

fn check_round_trip(f: &GgufFile, alignment: u64, datas: &[Vec<u8>]) {
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, alignment);
    assert_eq!(f.data_offset % alignment, 0);
    let expected = all_metadata();
    for (k, v) in &expected {
        let got = f.meta(k).unwrap_or_else(|| panic!("key {k} missing"));
        assert!(same_value(got, v), "key {k}: wrote {v:?}, read {got:?}");
    }
    // Plus general.alignment when it was set explicitly.
    assert!(f.metadata.len() == expected.len() || f.metadata.len() == expected.len() + 1);
    for ((name, ty, dims), data) in tensor_set().iter().zip(datas) {
        let t = f.tensor(name).unwrap();
        assert_eq!((t.ggml_type, &t.dims), (*ty, dims));
        assert_eq!(t.offset % alignment, 0, "{name} offset");
        assert_eq!(f.tensor_data(t), &data[..], "{name} data");
    }
    assert_eq!(f.tensors.iter().map(|t| &t.name).collect::<Vec<_>>(), tensor_set().iter().map(|t| &t.0).collect::<Vec<_>>());
}

#[test]
fn round_trip_every_type_default_alignment() {
    let (w, datas) = build(None);
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert!(f.meta("general.alignment").is_none());
    check_round_trip(&f, 32, &datas);

    // Typed getters.
    assert_eq!(f.get_u32("t.u8").unwrap(), 250);
    assert_eq!(f.get_u64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_f32("t.f64").unwrap(), std::f32::consts::PI);
    assert_eq!(f.get_f64("t.f32").unwrap(), 1.5e-6f32 as f64);
    assert!(f.get_bool("t.bool_t").unwrap());
    assert_eq!(f.get_str("t.str").unwrap(), "héllo ｜ wörld \u{1F600}");
    assert_eq!(f.get_u32_array("t.arr_u32").unwrap(), (0..43).map(|i| i * 3).collect::<Vec<u32>>());
    assert_eq!(f.get_u32_array("t.arr_u8").unwrap().len(), 256);
    assert_eq!(f.get_i32_array("t.arr_i8").unwrap(), vec![-1, 1]);
    assert_eq!(f.get_f32_array("t.arr_f32").unwrap(), vec![10.0, -0.25]);
    assert_eq!(f.get_str_array("t.arr_str").unwrap(), vec!["a", "", "Ġthe"]);
    assert_eq!(f.get_u32_array("t.arr_empty").unwrap(), Vec::<u32>::new());
    let nested = f.meta("t.nested").unwrap().as_array().unwrap();
    assert_eq!(nested[0].as_array().unwrap()[1].as_u64(), Some(2));
    assert_eq!(nested[2].as_array().unwrap()[0].as_array().unwrap()[0].as_str(), Some("deep"));
    assert_eq!(f.tensor("scalar").unwrap().n_elements(), 1);
    assert_eq!(f.tensor("empty").unwrap().n_bytes, 0);

    // Inspect abbreviates the 43-element array and renders the nested one.
    let text = inspect_text(&f);
    assert!(text.contains("[u32; 43] = [0, 3, 6, 9, 12, … 38 more]"), "{text}");
    assert!(text.contains("[u8; 256]"), "{text}");
    assert!(text.contains("total: 9 tensors"), "{text}");
    let j = inspect_json(&f);
    let arr = j["metadata"].as_array().unwrap().iter().find(|m| m["key"] == "t.arr_u32").unwrap();
    assert_eq!(arr["type"], "[u32; 43]");
    assert_eq!(arr["value"]["len"], 43);
    assert_eq!(arr["value"]["head"], serde_json::json!([0, 3, 6, 9, 12]));
}

#[test]
fn round_trip_every_alignment() {
    for shift in 0..=16 {
        let a = 1u64 << shift;
        let (w, datas) = build(Some(a));
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap_or_else(|e| panic!("alignment {a}: {e}"));
        assert_eq!(f.get_u32("general.alignment").unwrap() as u64, a);
        check_round_trip(&f, a, &datas);
    }
}

#[test]
fn alignment_through_metadata_key() {
    // A writer fed a reader's metadata (as a converter does) keeps the file's alignment.
    let mut w = GgufWriter::new();
    w.add_meta("general.alignment", MetaValue::U32(64)).unwrap();
    w.add_tensor("x", GgmlType::F32, &[3], vec![0; 12]).unwrap();
    w.add_tensor("y", GgmlType::F32, &[1], vec![1; 4]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment, 64);
    assert_eq!(f.tensor("y").unwrap().offset, 64);
}

#[test]
fn round_trip_through_a_file() {
    let (w, datas) = build(Some(256));
    let dir = std::env::temp_dir().join(format!("ds4-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rt.gguf");
    w.write(&path).unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk, w.to_bytes().unwrap(), "write() and to_bytes() differ");
    let f = GgufFile::open(&path).unwrap();
    check_round_trip(&f, 256, &datas);
    drop(f);

    // Deferred tensors are produced by the callback, in table order.
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::Str("deepseek4".into())).unwrap();
    w.add_tensor("a", GgmlType::F32, &[2], vec![1; 8]).unwrap();
    w.add_tensor_deferred("b", GgmlType::Q8_0, &[64]).unwrap();
    w.add_tensor_deferred("c", GgmlType::F16, &[3]).unwrap();
    assert!(w.to_bytes().is_err(), "to_bytes must refuse deferred tensors");
    let mut order = Vec::new();
    w.write_streaming(&path, |spec, out| {
        order.push(spec.name.clone());
        out.write_all(&vec![spec.name.as_bytes()[0]; spec.n_bytes as usize])
    })
    .unwrap();
    assert_eq!(order, ["b", "c"]);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor_data(f.tensor("a").unwrap()), &[1; 8]);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &[b'b'; 68]);
    assert_eq!(f.tensor_data(f.tensor("c").unwrap()), &[b'c'; 6]);
    drop(f);

    // A callback that writes the wrong number of bytes is an error naming the tensor.
    let e = w.write_streaming(&path, |_, out| out.write_all(&[0; 3])).unwrap_err().to_string();
    assert!(e.contains("'b'") && e.contains("68 expected"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn golden_files_rewrite_identically() {
    // Reading a golden file and writing its metadata and tensors back gives the same bytes:
    // the writer lays files out as the gguf Python package does (if it does not, this
    // test names the first difference).
    let path = golden_dir().join("models/tiny-q2/model.gguf");
    let f = GgufFile::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &f.metadata {
        w.add_meta(k.clone(), v.clone()).unwrap();
    }
    for t in &f.tensors {
        w.add_tensor(t.name.clone(), t.ggml_type, &t.dims, f.tensor_data(t).to_vec()).unwrap();
    }
    let out = w.to_bytes().unwrap();
    let g = GgufFile::from_bytes(out.clone()).unwrap();
    assert_eq!(g.metadata.len(), f.metadata.len());
    for ((k1, v1), (k2, v2)) in f.metadata.iter().zip(&g.metadata) {
        assert_eq!(k1, k2);
        assert!(same_value(v1, v2), "{k1}");
    }
    for t in &f.tensors {
        let u = g.tensor(&t.name).unwrap();
        assert_eq!(g.tensor_data(u), f.tensor_data(t), "{}", t.name);
    }
    if let Some(i) = out.iter().zip(f.bytes()).position(|(a, b)| a != b) {
        panic!("rewritten file differs from the original at byte {i}");
    }
    assert_eq!(out.len(), f.bytes().len());
}
