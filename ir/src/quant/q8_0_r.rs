//! Q8_0_R: Q8_0 regrouped, a device layout (never in a GGUF file). Two Q8_0 blocks
//! become one block of 64 values: their two f16 scales (4 bytes), then their 64 signed
//! bytes. Element = d[s] * q: the same numbers as Q8_0, in the same 34 bytes per 32
//! values.
//!
//! Why: Q8_0's 34-byte blocks leave its quants 2-byte aligned, so the CUDA mat-vec
//! stages rows through shared memory and reassembles words there. Here every block
//! starts 4-byte aligned in a 16-byte aligned row, and a lane loads its run's eight quants
//! (two aligned words) and their scale straight from global memory
//! (`codegen/src/quant/cuda_matvec.rs`, the direct path): the output head's mat-vec on
//! the H200 231 → 163 µs, decode at ctx 2048 +5% (bench/RESULTS.md). Two blocks, not
//! more: the prefill's tensor-core matmul stages whole blocks, and blocks of 256 or 128
//! values (8-byte loads, the head 157 µs) made its staging larger and the prefill 5% and
//! 3.5% slower; at 64 values it stages what it staged for Q8_0 (prefill unchanged).
//! The CUDA backend regroups Q8_0 tensors when it uploads them
//! (`ds4_codegen::quant::device_type`, `regroup_q8_0`).
use super::q8_0;

ds4_macros::quant_type! {
    ggml: Q8_0R,
    block: 64,
    sub_block: 32,
    layout {
        d: [f16; 2] @ 0,
        qs: [i8; 64] @ 4,
    }
    dequant(s, j) {
        let d32 = d[s] as f32;
        (qs[s * 32 + j] as f32) * d32
    }
    quantize: quantize_block,
}

/// Q8_0's quantizer on each sub-block (what regrouping its blocks gives).
fn quantize_block(x: &[f32; 64]) -> Block {
    let mut b = Block { d: [half::f16::ZERO; 2], qs: [0; 64] };
    for s in 0..2 {
        let q = q8_0::quantize_block(x[32 * s..32 * (s + 1)].try_into().expect("32 values"));
        b.d[s] = q.d;
        b.qs[32 * s..32 * (s + 1)].copy_from_slice(&q.qs);
    }
    b
}

/// Q8_0 blocks (`src`, a multiple of four) into Q8_0_R (`dst`, as long): block i from
/// Q8_0 blocks 4i .. 4i + 4.
pub fn regroup(src: &[u8], dst: &mut [u8]) {
    for (from, to) in src.chunks_exact(2 * 34).zip(dst.chunks_exact_mut(68)) {
        for (i, b) in from.chunks_exact(34).enumerate() {
            to[2 * i..2 * i + 2].copy_from_slice(&b[..2]);
            to[4 + 32 * i..4 + 32 * (i + 1)].copy_from_slice(&b[2..]);
        }
    }
}
