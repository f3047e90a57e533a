//! Malformed GGUF input: every case must give an error whose message names the problem,
//! never a panic or a huge allocation.

use ds4_ir::GgmlType;
use ds4_model::gguf::{GgufError, GgufFile, MetaValue};
use ds4_model::gguf_writer::GgufWriter;

/// Hand-assembled GGUF bytes: the writer refuses to produce broken files, so broken
/// files are built field by field here.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// A u32 key/value pair.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pad to `align` and append `n` data bytes.
    fn data(&mut self, align: usize, n: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0xAB, n));
        self
    }
    fn bytes(&self) -> Vec<u8> {
        self.0.clone()
    }
}

/// Parse, expect an error, and check that its message contains every `needle`.
#[track_caller]
fn expect_err(bytes: Vec<u8>, needles: &[&str]) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("expected an error containing {needles:?}, parsed {f:?}"),
        Err(e) => {
            let msg = e.to_string();
            for n in needles {
                assert!(msg.contains(n), "error {msg:?} does not contain {n:?}");
            }
            e
        }
    }
}

/// A valid one-tensor file whose tensor info fields can be varied.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Vec<u8> {
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.quantization_version", 2).tensor("blk.0.attn_q_a.weight", dims, ty, offset).data(32, data);
    r.bytes()
}

#[test]
fn valid_raw_file_parses() {
    // The baseline of the cases below is itself valid.
    let f = GgufFile::from_bytes(one_tensor(&[8, 2], 0, 0, 64)).unwrap();
    assert_eq!(f.tensors[0].n_bytes, 64);
    assert_eq!(f.data_offset % 32, 0);
    let v2 = {
        let mut b = one_tensor(&[8, 2], 0, 0, 64);
        b[4] = 2;
        b
    };
    assert_eq!(GgufFile::from_bytes(v2).unwrap().version, 2);
}

#[test]
fn empty_file() {
    expect_err(vec![], &["empty"]);
    let path = std::env::temp_dir().join(format!("ds4-gguf-empty-{}.gguf", std::process::id()));
    std::fs::write(&path, b"").unwrap();
    let e = GgufFile::open(&path).unwrap_err().to_string();
    std::fs::remove_file(&path).ok();
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn missing_file() {
    let e = GgufFile::open(std::path::Path::new("/nonexistent/ds4/model.gguf")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/ds4/model.gguf"), "{e}");
}

#[test]
fn wrong_magic() {
    let mut b = one_tensor(&[8], 0, 0, 32);
    b[..4].copy_from_slice(b"GGML");
    expect_err(b, &["magic", "GGML"]);
    expect_err(b"GG".to_vec(), &["magic"]);
}

#[test]
fn unsupported_version_1() {
    expect_err(Raw::header(1, 0, 0).bytes(), &["version 1", "not supported"]);
}

#[test]
fn unsupported_version_99() {
    expect_err(Raw::header(99, 0, 0).bytes(), &["version 99", "not supported"]);
}

#[test]
fn big_endian_file() {
    expect_err(Raw::header(3u32.swap_bytes(), 0, 0).bytes(), &["big-endian"]);
}

/// A writer-made file with strings, arrays and several tensors.
fn rich_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::Str("deepseek4".into())).unwrap();
    w.add_meta("a.u32s", MetaValue::Array((0..10).map(MetaValue::U32).collect())).unwrap();
    w.add_meta("a.strs", MetaValue::Array(vec![MetaValue::Str("x".into()), MetaValue::Str("yz".into())])).unwrap();
    w.add_meta("a.nested", MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::F64(1.0)])])).unwrap();
    w.add_meta("a.f32", MetaValue::F32(0.5)).unwrap();
    w.add_meta("a.bool", MetaValue::Bool(true)).unwrap();
    w.add_tensor("t0", GgmlType::F32, &[4, 2], vec![1; 32]).unwrap();
    w.add_tensor("t1", GgmlType::Q8_0, &[32, 2], vec![2; 68]).unwrap();
    w.add_tensor("t2", GgmlType::F16, &[5], vec![3; 10]).unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn truncated_at_every_offset() {
    let full = rich_file();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let data_offset = f.data_offset as usize;
    let last_end = f.tensors.iter().map(|t| f.data_offset + t.offset + t.n_bytes).max().unwrap() as usize;
    let mut cuts: Vec<usize> = (0..=data_offset).collect();
    cuts.extend([data_offset + 1, data_offset + 31, data_offset + 32, last_end - 1]);
    for cut in cuts {
        let e = GgufFile::from_bytes(full[..cut].to_vec())
            .err()
            .unwrap_or_else(|| panic!("truncation at {cut} of {} parsed", full.len()))
            .to_string();
        let named = ["empty", "magic", "truncated", "cannot fit", "past end of file"];
        assert!(named.iter().any(|n| e.contains(n)), "cut at {cut}: unhelpful error {e:?}");
    }
    // Cutting only the padding after the last tensor leaves a valid file.
    GgufFile::from_bytes(full[..last_end].to_vec()).unwrap();
}

#[test]
fn absurd_n_tensors() {
    expect_err(Raw::header(3, 1 << 60, 0).bytes(), &["1152921504606846976 tensors", "cannot fit"]);
    expect_err(Raw::header(3, u64::MAX, 0).bytes(), &["cannot fit"]);
}

#[test]
fn absurd_n_kv() {
    expect_err(Raw::header(3, 0, 1 << 60).bytes(), &["1152921504606846976 metadata keys", "cannot fit"]);
    expect_err(Raw::header(3, 0, u64::MAX).bytes(), &["cannot fit"]);
}

#[test]
fn absurd_key_string_length() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(1 << 60).u32(4).u32(0);
    expect_err(r.bytes(), &["metadata key #0", "string of length 1152921504606846976", "truncated"]);
}

#[test]
fn absurd_value_string_length() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(1 << 60).u64(0);
    expect_err(r.bytes(), &["'general.name'", "string of length 1152921504606846976"]);
}

#[test]
fn absurd_tensor_name_length() {
    let mut r = Raw::header(3, 1, 0);
    r.u64(u64::MAX).u32(1).u64(32).u32(0).u64(0);
    expect_err(r.bytes(), &["tensor info #0", "truncated"]);
}

#[test]
fn absurd_array_length() {
    let mut r = Raw::header(3, 0, 1);
    r.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(1 << 60).u64(0);
    expect_err(r.bytes(), &["'tokenizer.ggml.tokens'", "array of 1152921504606846976 str elements", "cannot fit"]);
    // A length whose byte count overflows u64.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(10).u64(u64::MAX / 2).u64(0);
    expect_err(r.bytes(), &["'k'", "cannot fit"]);
}

#[test]
fn arrays_nested_too_deep() {
    let mut r = Raw::header(3, 0, 1);
    r.str("deep").u32(9);
    for _ in 0..1000 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(0);
    expect_err(r.bytes(), &["'deep'", "nested more than"]);
}

#[test]
fn unknown_value_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    expect_err(r.bytes(), &["'k'", "unknown value type 13"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(77).u64(0);
    expect_err(r.bytes(), &["'k'", "unknown array element type 77"]);
}

#[test]
fn invalid_bool() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(7).u8(2);
    expect_err(r.bytes(), &["'k'", "invalid bool byte 2"]);
}

#[test]
fn invalid_utf8() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(2).u8(0xff).u8(0xfe);
    expect_err(r.bytes(), &["'k'", "UTF-8"]);
}

#[test]
fn tensor_with_5_dims() {
    expect_err(one_tensor(&[1, 1, 1, 1, 8], 0, 0, 32), &["'blk.0.attn_q_a.weight'", "n_dims = 5"]);
}

#[test]
fn dims_product_overflows() {
    expect_err(one_tensor(&[1 << 32, 1 << 32, 2], 0, 0, 32), &["'blk.0.attn_q_a.weight'", "overflows"]);
    // The element count fits, the byte count does not.
    expect_err(one_tensor(&[1 << 62], 0, 0, 32), &["'blk.0.attn_q_a.weight'", "byte size", "overflows"]);
}

#[test]
fn unknown_ggml_type() {
    expect_err(one_tensor(&[8], 1000, 0, 32), &["'blk.0.attn_q_a.weight'", "unknown GGML type id 1000"]);
}

#[test]
fn misaligned_offset() {
    expect_err(one_tensor(&[8], 0, 4, 64), &["'blk.0.attn_q_a.weight'", "offset 4", "alignment 32"]);
}

#[test]
fn data_past_end_of_file() {
    let b = one_tensor(&[8, 2], 0, 0, 63);
    let len = b.len();
    let e = expect_err(b, &["'blk.0.attn_q_a.weight'", "runs past end of file"]);
    assert!(e.to_string().contains(&format!("(size {len})")), "{e}");
    // An offset so large that data start + offset overflows.
    expect_err(one_tensor(&[8], 0, u64::MAX - 31, 32), &["'blk.0.attn_q_a.weight'", "overflows"]);
}

#[test]
fn ne0_not_a_multiple_of_block_size() {
    expect_err(one_tensor(&[33, 2], 8, 0, 128), &["'blk.0.attn_q_a.weight'", "ne[0] = 33", "Q8_0 block size 32"]);
    expect_err(one_tensor(&[128], 12, 0, 256), &["ne[0] = 128", "Q4_K block size 256"]);
}

#[test]
fn duplicate_tensor_name() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0).tensor("w", &[8], 0, 32).data(32, 64);
    expect_err(r.bytes(), &["'w'", "duplicate tensor name"]);
}

#[test]
fn overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0).tensor("b", &[8], 0, 32).data(32, 64);
    expect_err(r.bytes(), &["'b'", "overlaps tensor 'a'"]);
}

#[test]
fn duplicate_key() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("deepseek4.block_count", 2).kv_u32("deepseek4.block_count", 3);
    expect_err(r.bytes(), &["'deepseek4.block_count'", "duplicate key"]);
}

#[test]
fn alignment_zero() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 0);
    expect_err(r.bytes(), &["'general.alignment'", "alignment 0", "power of two"]);
}

#[test]
fn alignment_three() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 3);
    expect_err(r.bytes(), &["'general.alignment'", "alignment 3", "power of two"]);
}

#[test]
fn alignment_wrong_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    expect_err(r.bytes(), &["'general.alignment'", "integer"]);
}

#[test]
fn typed_getter_errors() {
    let mut w = GgufWriter::new();
    w.add_meta("neg", MetaValue::I32(-1)).unwrap();
    w.add_meta("big", MetaValue::U64(1 << 40)).unwrap();
    w.add_meta("s", MetaValue::Str("x".into())).unwrap();
    w.add_meta("f", MetaValue::F64(1e300)).unwrap();
    w.add_meta("ints", MetaValue::Array(vec![MetaValue::U64(1), MetaValue::U64(1 << 33)])).unwrap();
    w.add_meta("strs", MetaValue::Array(vec![MetaValue::Str("a".into())])).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let msg = |e: GgufError| e.to_string();
    assert_eq!(msg(f.get_u32("nope").unwrap_err()), "metadata key 'nope' is missing");
    assert!(msg(f.get_u32("neg").unwrap_err()).contains("'neg': value -1 is out of range for u32"));
    assert!(msg(f.get_u64("neg").unwrap_err()).contains("out of range for u64"));
    assert!(msg(f.get_u32("big").unwrap_err()).contains("'big': value 1099511627776 is out of range for u32"));
    assert_eq!(f.get_u64("big").unwrap(), 1 << 40);
    assert!(msg(f.get_u32("s").unwrap_err()).contains("'s': expected an integer, found str"));
    assert!(msg(f.get_str("big").unwrap_err()).contains("'big': expected str, found u64"));
    assert!(msg(f.get_bool("s").unwrap_err()).contains("expected bool"));
    assert!(msg(f.get_f32("f").unwrap_err()).contains("'f': value 1e300 is out of range for f32"));
    assert!(msg(f.get_f32("s").unwrap_err()).contains("expected a float"));
    assert!(msg(f.get_u32_array("ints").unwrap_err()).contains("'ints[1]': value 8589934592 is out of range for u32"));
    assert!(msg(f.get_u32_array("big").unwrap_err()).contains("'big': expected an array of integers, found u64"));
    assert!(msg(f.get_str_array("ints").unwrap_err()).contains("'ints[0]': expected str, found u64"));
    assert!(msg(f.get_f32_array("strs").unwrap_err()).contains("'strs[0]': expected a float, found str"));
}

#[test]
fn writer_refusals() {
    let mut w = GgufWriter::new();
    let e = w.add_tensor("w", GgmlType::Q8_0, &[64], vec![0; 67]).unwrap_err().to_string();
    assert!(e.contains("'w'") && e.contains("68 bytes, 67 given"), "{e}");
    let e = w.add_tensor("w", GgmlType::Q8_0, &[33], vec![0; 34]).unwrap_err().to_string();
    assert!(e.contains("block size 32"), "{e}");
    let e = w.add_tensor("w", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4]).unwrap_err().to_string();
    assert!(e.contains("5 dims"), "{e}");
    let e = w.add_tensor("w", GgmlType::F32, &[1 << 40, 1 << 40], vec![]).unwrap_err().to_string();
    assert!(e.contains("overflows"), "{e}");
    w.add_tensor("w", GgmlType::F32, &[1], vec![0; 4]).unwrap();
    let e = w.add_tensor("w", GgmlType::F32, &[1], vec![0; 4]).unwrap_err().to_string();
    assert!(e.contains("'w': added twice"), "{e}");

    w.add_meta("k", MetaValue::U8(1)).unwrap();
    let e = w.add_meta("k", MetaValue::U8(1)).unwrap_err().to_string();
    assert!(e.contains("'k' added twice"), "{e}");
    let e = w.add_meta("m", MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U16(1)])).unwrap_err().to_string();
    assert!(e.contains("'m'") && e.contains("mixes u8"), "{e}");
    for a in [0, 3, 1 << 33] {
        assert!(w.alignment(a).is_err(), "alignment {a} accepted");
    }
    let e = w.add_meta("general.alignment", MetaValue::U32(3)).unwrap_err().to_string();
    assert!(e.contains("alignment 3"), "{e}");
}

/// Flipping bytes anywhere in a valid header never panics (whatever the outcome).
#[test]
fn corrupted_bytes_never_panic() {
    let full = rich_file();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let header_end = f.data_offset as usize;
    for i in 0..header_end {
        for v in [0x00, 0xff, 0x80, 0x09, 0x05] {
            let mut b = full.clone();
            b[i] = v;
            if let Ok(g) = GgufFile::from_bytes(b) {
                for t in &g.tensors {
                    assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
                }
            }
        }
    }
}
