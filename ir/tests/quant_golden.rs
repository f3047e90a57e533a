//! Quant types against golden data made by the `gguf` Python package (llama.cpp's), and
//! the quantizers' round-trip error on Gaussian data.
//!
//! Golden files: `$DS4_GOLDEN_DIR/quant/<TYPE>.safetensors` (default: the shared golden
//! folder next to the workspace). For every golden type ds4 supports:
//! - `dequantize_row(raw)` equals `dequant` bit for bit, and so does the IR interpreter;
//! - `dot_row(raw, x)` matches `y_ref` (f64) within 1e-5 × max over rows of |y_ref|;
//! - where gguf could quantize, `quantize_row(quant_src)` reproduces `quant_raw` byte for byte.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ds4_ir::quant::{self, eval, QuantError};
use ds4_ir::clock::thread_cpu_seconds;
use ds4_ir::rng::gaussian;
use ds4_ir::GgmlType;
use safetensors::{Dtype, SafeTensors};

fn golden_dir() -> PathBuf {
    match std::env::var_os("DS4_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden")),
    }
}

/// One golden file: tensors as raw bytes with their shapes.
struct Golden {
    tensors: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
}

impl Golden {
    fn load(t: GgmlType) -> Option<Golden> {
        let path = golden_dir()
            .join("quant")
            .join(format!("{}.safetensors", t.name()));
        let bytes = std::fs::read(&path).ok()?;
        let st =
            SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, v)| (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
            .collect();
        Some(Golden { tensors })
    }
    fn get(&self, name: &str) -> Option<&(Dtype, Vec<usize>, Vec<u8>)> {
        self.tensors.get(name)
    }
    fn u8(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let (dt, shape, data) = self.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(*dt, Dtype::U8, "{name}");
        (shape.clone(), data.clone())
    }
    fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (dt, shape, data) = self.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(*dt, Dtype::F32, "{name}");
        (
            shape.clone(),
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }
    fn f64(&self, name: &str) -> Vec<f64> {
        let (dt, _, data) = self.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(*dt, Dtype::F64, "{name}");
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// Every type with a golden file that ds4 supports. A missing golden folder is an error
/// (a test that silently checks nothing is worse than a failing one).
fn golden_types() -> Vec<GgmlType> {
    let dir = golden_dir().join("quant");
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("golden quant folder {}: {e}", dir.display()));
    let mut types = vec![];
    for e in entries {
        let name = e.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name.strip_suffix(".safetensors") else {
            continue;
        };
        match GgmlType::from_name(stem) {
            Some(t) if quant::supported().contains(&t) => types.push(t),
            _ => eprintln!("golden {name}: type not supported by ds4, not checked"),
        }
    }
    types.sort();
    assert!(!types.is_empty(), "no supported type in {}", dir.display());
    types
}

#[test]
fn dequantize_matches_golden_bit_for_bit() {
    for t in golden_types() {
        let g = Golden::load(t)
            .unwrap_or_else(|| panic!("no golden file for {t} in {}", golden_dir().display()));
        let (rshape, raw) = g.u8("raw");
        let (dshape, want) = g.f32("dequant");
        let (rows, cols) = (dshape[0], dshape[1]);
        let row_bytes = rshape[1];
        let mut got = vec![0f32; cols];
        let mut mismatches = 0;
        for r in 0..rows {
            quant::dequantize_row(t, &raw[r * row_bytes..(r + 1) * row_bytes], &mut got).unwrap();
            for c in 0..cols {
                let w = want[r * cols + c];
                if got[c].to_bits() != w.to_bits() {
                    if mismatches < 5 {
                        eprintln!("{t} row {r} col {c}: got {:e} want {:e}", got[c], w);
                    }
                    mismatches += 1;
                }
            }
        }
        assert_eq!(
            mismatches, 0,
            "{t}: {mismatches} de-quantized values differ from gguf's"
        );
        eprintln!("{t}: {rows}x{cols} de-quantized bit-exactly");
    }
}

#[test]
fn ir_interpreter_matches_golden_bit_for_bit() {
    for t in golden_types() {
        let g = Golden::load(t).unwrap();
        let spec = quant::spec(t).unwrap();
        let (_, raw) = g.u8("raw");
        let (_, want) = g.f32("dequant");
        let mut out = vec![0f32; spec.block_elems];
        for (b, block) in raw.chunks_exact(spec.block_bytes).enumerate() {
            eval::eval_block(spec, block, &mut out);
            let w = &want[b * spec.block_elems..(b + 1) * spec.block_elems];
            for (k, (o, w)) in out.iter().zip(w).enumerate() {
                assert_eq!(
                    o.to_bits(),
                    w.to_bits(),
                    "{t} block {b} element {k}: IR gives {o:e}, gguf {w:e}"
                );
            }
        }
    }
}

#[test]
fn dot_row_matches_golden_y_ref() {
    for t in golden_types() {
        let g = Golden::load(t).unwrap();
        let (rshape, raw) = g.u8("raw");
        let (_, x) = g.f32("x");
        let y_ref = g.f64("y_ref");
        let row_bytes = rshape[1];
        let scale = y_ref.iter().fold(0f64, |m, v| m.max(v.abs()));
        let mut worst = 0f64;
        for (r, want) in y_ref.iter().enumerate() {
            let y = quant::dot_row(t, &raw[r * row_bytes..(r + 1) * row_bytes], &x).unwrap() as f64;
            let rel = (y - want).abs() / scale;
            assert!(
                rel <= 1e-5,
                "{t} row {r}: dot {y} vs y_ref {want} (error {rel:e} of max |y_ref| {scale})"
            );
            worst = worst.max(rel);
        }
        eprintln!("{t}: dot_row worst error {worst:.2e} of max |y_ref|");
    }
}

#[test]
fn quantizers_reproduce_gguf_bytes() {
    for t in golden_types() {
        let g = Golden::load(t).unwrap();
        let Some((_, qshape, want)) = g.get("quant_raw") else {
            continue;
        };
        let (sshape, src) = g.f32("quant_src");
        let (rows, cols) = (sshape[0], sshape[1]);
        let row_bytes = (cols / t.block_elems()) * t.block_bytes();
        if qshape != &vec![rows, row_bytes] {
            // gguf's quantize() returns float16 values (not bytes) for F16; the golden
            // generator stored them cast to u8. Nothing byte-level to compare against; the
            // round trip below covers the F16 quantizer instead.
            eprintln!("{t}: golden quant_raw has shape {qshape:?}, not bytes [{rows}, {row_bytes}]: skipped");
            continue;
        }
        let mut got = vec![0u8; row_bytes];
        for r in 0..rows {
            quant::quantize_row(t, &src[r * cols..(r + 1) * cols], &mut got).unwrap();
            let w = &want[r * row_bytes..(r + 1) * row_bytes];
            if let Some(k) = got.iter().zip(w).position(|(a, b)| a != b) {
                panic!(
                    "{t} row {r}: byte {k} (block {}) is {:#04x}, gguf wrote {:#04x}",
                    k / t.block_bytes(),
                    got[k],
                    w[k]
                );
            }
        }
        eprintln!("{t}: quantizer reproduces gguf's {rows} rows byte for byte");
    }
}

/// For the float types, quantizing the golden de-quantized values gives back `raw`
/// (f16/bf16 -> f32 -> f16/bf16 is exact): checks rounding of every value in the file.
#[test]
fn float_types_round_trip_golden_raw() {
    for t in [GgmlType::F16, GgmlType::Bf16] {
        let g = Golden::load(t).unwrap();
        let (_, raw) = g.u8("raw");
        let (_, deq) = g.f32("dequant");
        let mut got = vec![0u8; raw.len()];
        quant::quantize_row(t, &deq, &mut got).unwrap();
        assert!(got == raw, "{t}: quantize(dequant(raw)) != raw");
    }
}

/// The golden rows of file type `from`, regrouped by `regroup` into device type `to`: each
/// de-quantizes to the golden values bit for bit, and its dot product with the golden x
/// agrees with the file type's (to 1e-5: the same values, summed in another order). The
/// golden raw bytes and the regrouped rows' values, for the callers' own checks.
fn regrouped_rows_match_golden(from: GgmlType, to: GgmlType, regroup: quant::Regroup) -> (Vec<u8>, Vec<f32>) {
    let g = Golden::load(from).unwrap_or_else(|| panic!("no golden {from} file in {}", golden_dir().display()));
    let (rshape, raw) = g.u8("raw");
    let (dshape, want) = g.f32("dequant");
    let (rows, cols, row_bytes) = (dshape[0], dshape[1], rshape[1]);
    let x = g.f32("x").1;
    let mut regrouped = vec![0u8; to.bytes_for(cols as u64).unwrap_or_else(|| panic!("golden {from} rows are whole {to} blocks")) as usize];
    let mut got = vec![0f32; rows * cols];
    for (r, row) in got.chunks_exact_mut(cols).enumerate() {
        let src = &raw[r * row_bytes..(r + 1) * row_bytes];
        regroup(src, &mut regrouped).unwrap();
        quant::dequantize_row(to, &regrouped, row).unwrap();
        for c in 0..cols {
            assert_eq!(row[c].to_bits(), want[r * cols + c].to_bits(), "{to}: row {r} col {c}");
        }
        let (a, b) = (quant::dot_row(to, &regrouped, &x).unwrap(), quant::dot_row(from, src, &x).unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{to}: row {r}: dot {a} vs {from}'s {b}");
    }
    (raw, got)
}

/// Q8_0_R (a device layout, no golden file of its own) holds the same numbers as the Q8_0
/// blocks it regroups: the golden Q8_0 rows, regrouped, de-quantize to the golden values
/// bit for bit, and their dot products agree with Q8_0's.
#[test]
fn regrouped_q8_0_dequantizes_as_the_golden_q8_0() {
    let (raw, _) = regrouped_rows_match_golden(GgmlType::Q8_0, GgmlType::Q8_0R, quant::regroup_q8_0);
    let mut regrouped = vec![0u8; 34 * 7];
    // Whole Q8_0_R blocks only, and the destination as long as the source.
    assert!(quant::regroup_q8_0(&raw[..34 * 7], &mut regrouped[..34 * 7]).is_err());
    assert!(quant::regroup_q8_0(&raw[..34 * 3], &mut regrouped[..34 * 3]).is_err());
    assert!(quant::regroup_q8_0(&raw[..136], &mut regrouped[..135]).is_err());
}

#[test]
fn bad_lengths_are_errors() {
    for &t in quant::supported() {
        let (be, bb) = (t.block_elems(), t.block_bytes());
        let src = vec![0u8; 2 * bb];
        let x = vec![0f32; 2 * be];
        let mut dst = vec![0f32; 2 * be];
        // Not a whole number of blocks.
        let e = quant::dot_row(t, &src[..2 * bb - 1], &x).unwrap_err();
        assert_eq!(
            e,
            QuantError::PartialBlockBytes {
                ty: t,
                bytes: 2 * bb - 1,
                block_bytes: bb
            }
        );
        assert!(e.to_string().contains(t.name()), "{e}");
        assert!(quant::dequantize_row(t, &src[..bb + 1], &mut dst[..be]).is_err());
        // Element count does not match the blocks.
        let e = quant::dot_row(t, &src, &x[..be]).unwrap_err();
        assert!(
            matches!(e, QuantError::ElemsMismatch { want, got, .. } if want == 2 * be && got == be),
            "{e}"
        );
        assert!(quant::dequantize_row(t, &src, &mut dst[..2 * be - 1]).is_err());
        // Empty rows are fine.
        assert_eq!(quant::dot_row(t, &[], &[]).unwrap(), 0.0);
        if quant::can_quantize(t) {
            let mut q = vec![0u8; 2 * bb];
            if be > 1 {
                let e = quant::quantize_row(t, &x[..be + 1], &mut q).unwrap_err();
                assert!(matches!(e, QuantError::PartialBlockElems { .. }), "{e}");
            }
            let e = quant::quantize_row(t, &x, &mut q[..bb]).unwrap_err();
            assert!(matches!(e, QuantError::BytesMismatch { .. }), "{e}");
        }
    }
    let e = quant::dot_row(GgmlType::Q5K, &[], &[]).unwrap_err();
    assert_eq!(e, QuantError::Unsupported(GgmlType::Q5K));
    assert!(e.to_string().contains("Q5_K"));
}

/// Round-trip RMSE of each quantizer on N(0, 1) data, relative to the data's RMS.
/// The listed bounds are a little above what the quantizers achieve (printed): a
/// regression in a quantizer, or a mismatch between a quantizer and its type's layout,
/// fails here. A type not listed yet gets a loose generic bound from its bits per weight.
#[test]
fn quantizer_round_trip_rmse() {
    let bounds = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 3e-4),
        (GgmlType::Bf16, 2.5e-3),
        (GgmlType::Q8_0, 6e-3),
        (GgmlType::Q4K, 0.073),
        (GgmlType::Q2K, 0.27),
        (GgmlType::Iq2Xxs, 0.34),
        (GgmlType::Q6K, 0.019),
        (GgmlType::Mxfp4, 0.12),
    ];
    for &t in quant::supported() {
        if !quant::can_quantize(t) {
            continue;
        }
        let bpw = 8.0 * t.block_bytes() as f64 / t.block_elems() as f64;
        let bound = match bounds.iter().find(|b| b.0 == t) {
            Some(b) => b.1,
            None if t.is_quantized() => 3.0 * (-bpw).exp2(),
            None => panic!("no RMSE bound for the float type {t}"),
        };
        let cols = 4096;
        let rows = 16;
        let x = gaussian(rows * cols, 7);
        let row_bytes = cols / t.block_elems() * t.block_bytes();
        let mut q = vec![0u8; row_bytes];
        let mut back = vec![0f32; cols];
        let (mut err2, mut sig2) = (0f64, 0f64);
        for r in 0..rows {
            let src = &x[r * cols..(r + 1) * cols];
            quant::quantize_row(t, src, &mut q).unwrap();
            quant::dequantize_row(t, &q, &mut back).unwrap();
            for (a, b) in src.iter().zip(&back) {
                err2 += ((a - b) as f64).powi(2);
                sig2 += (*a as f64).powi(2);
            }
        }
        let rel = (err2 / sig2).sqrt();
        eprintln!(
            "{t}: round-trip RMSE {rel:.5} of RMS on N(0,1) ({bpw:.3} bits/weight, bound {bound})"
        );
        assert!(rel <= bound, "{t}: RMSE {rel} above bound {bound}");
    }
}

/// The IR interpreter and the generated CPU code agree on random blocks too (not only on
/// the golden ones), for every type.
#[test]
fn generated_code_matches_ir_on_random_blocks() {
    let mut s = 0x1234_5678_9abc_def0u64;
    for &t in quant::supported() {
        let spec = quant::spec(t).unwrap();
        let n = 64;
        let bytes: Vec<u8> = (0..n * spec.block_bytes)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect();
        let mut got = vec![0f32; n * spec.block_elems];
        quant::dequantize_row(t, &bytes, &mut got).unwrap();
        let mut want = vec![0f32; spec.block_elems];
        for (b, block) in bytes.chunks_exact(spec.block_bytes).enumerate() {
            eval::eval_block(spec, block, &mut want);
            for (k, w) in want.iter().enumerate() {
                let g = got[b * spec.block_elems + k];
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{t} block {b} elem {k}: {g:e} vs IR {w:e}"
                );
            }
        }
    }
}

/// Single-thread throughput of `dot_row` over a 4096 x 4096 matrix, per type, in GB/s of
/// weight bytes and in weights per second (best of several passes, thread CPU time).
/// `cargo test --release -p ds4-ir --test quant_golden -- --ignored --nocapture bench`
#[test]
#[ignore]
fn bench_dot_row() {
    let (rows, cols) = (4096usize, 4096usize);
    let x = gaussian(cols, 3);
    let w = gaussian(32 * cols, 5);
    for &t in quant::supported() {
        let row_bytes = cols / t.block_elems() * t.block_bytes();
        // Quantize 32 distinct rows and repeat them: realistic values (no NaNs or
        // subnormals from random bytes) without waiting for the slower quantizers.
        let distinct = 32;
        let mut q = vec![0u8; distinct * row_bytes];
        for r in 0..distinct {
            quant::quantize_row(
                t,
                &w[r * cols..(r + 1) * cols],
                &mut q[r * row_bytes..(r + 1) * row_bytes],
            )
            .unwrap();
        }
        let m: Vec<u8> = q.iter().copied().cycle().take(rows * row_bytes).collect();
        let cpu = quant::cpu(t).unwrap();
        let mut best = f64::INFINITY;
        let mut sink = 0f32;
        for _ in 0..10 {
            let t0 = thread_cpu_seconds();
            for r in 0..rows {
                sink += (cpu.dot_row)(&m[r * row_bytes..(r + 1) * row_bytes], &x);
            }
            best = best.min(thread_cpu_seconds() - t0);
        }
        std::hint::black_box(sink);
        let gbs = m.len() as f64 / best / 1e9;
        let gw = (rows * cols) as f64 / best / 1e9;
        eprintln!(
            "{:>8}: {gbs:6.2} GB/s  {gw:5.2} Gweights/s  ({:.2} ms per 4096x4096)",
            t.name(),
            best * 1e3
        );
    }
}

/// IQ2_XXS_R (a device layout, no golden file of its own) holds the same numbers as the
/// IQ2_XXS blocks it regroups: the golden IQ2_XXS rows, regrouped, de-quantize to the
/// golden values bit for bit (every eighth sign from the stored parity), and their dot
/// products agree with IQ2_XXS's.
#[test]
fn regrouped_iq2_xxs_dequantizes_as_the_golden_iq2_xxs() {
    let (raw, got) = regrouped_rows_match_golden(GgmlType::Iq2Xxs, GgmlType::Iq2XxsR, quant::regroup_iq2_xxs);
    let negatives = got.iter().filter(|v| v.is_sign_negative() && **v != 0.0).count();
    assert!(negatives > got.len() / 4, "the golden rows exercise the signs ({negatives} negatives)");
    // Whole IQ2_XXS blocks only, and a destination of 72 bytes a block.
    let mut regrouped = vec![0u8; 72];
    assert!(quant::regroup_iq2_xxs(&raw[..65], &mut regrouped[..72]).is_err());
    assert!(quant::regroup_iq2_xxs(&raw[..66], &mut regrouped[..66]).is_err());
    assert!(quant::regroup_iq2_xxs(&raw[..66], &mut regrouped[..72]).is_ok());
}

/// IQ2_XXS_R's quantizer is IQ2_XXS's, regrouped: the same values back.
#[test]
fn iq2_xxs_r_quantizes_as_iq2_xxs() {
    let g = Golden::load(GgmlType::Iq2Xxs).unwrap();
    let (dshape, vals) = g.f32("dequant");
    let cols = dshape[1];
    let row = &vals[..cols];
    let mut a = vec![0u8; GgmlType::Iq2Xxs.bytes_for(cols as u64).unwrap() as usize];
    let mut b = vec![0u8; GgmlType::Iq2XxsR.bytes_for(cols as u64).unwrap() as usize];
    quant::quantize_row(GgmlType::Iq2Xxs, row, &mut a).unwrap();
    quant::quantize_row(GgmlType::Iq2XxsR, row, &mut b).unwrap();
    let mut regrouped = vec![0u8; b.len()];
    quant::regroup_iq2_xxs(&a, &mut regrouped).unwrap();
    assert!(regrouped == b, "quantize_row(IQ2_XXS_R) is IQ2_XXS's regrouped");
}
