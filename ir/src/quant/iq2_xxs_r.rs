//! IQ2_XXS_R: IQ2_XXS regrouped, a device layout (never in a GGUF file). A 256-value block
//! becomes 72 bytes (IQ2_XXS: 66): its eight 4-bit group scales (a word), `d`, two bytes
//! of padding, then per 32-value group two words: the four grid indices (as in IQ2_XXS)
//! and the group's 32 signs, each grid entry's eighth sign (IQ2_XXS: the parity of its
//! other seven) stored. Element = d * (0.5 + scale) / 4 * grid magnitude * sign: the same
//! numbers as IQ2_XXS.
//!
//! Why: the routed experts' gate and up at decode (`codegen/src/cuda_digits.rs`) are bound
//! by instructions and L1, and IQ2_XXS spends most of them on its signs (17 of a grid
//! entry's ~27: the parity, then four bits spread to bytes twice) and its loads (five
//! 2-byte loads a group: 66-byte blocks leave the words 2-byte aligned). Here a group's
//! words are one aligned 8-byte load, and the signs are laid out for the kernel's byte
//! permute: half-entry e (weights 4(e % 2) .. 4(e % 2) + 3 of grid entry e / 2) has the
//! sign of its weight b at bit 16(e / 4) + 4b + e % 4, so a shift puts its four signs at
//! bit 2 of four nibbles, which then pick a magnitude or its negation. Six of the 72 bytes
//! are new, +9% bytes for ~22% less time (H200, six picks of 2048 × 4096 standalone, 22.8 →
//! 17.7 µs, bench/RESULTS.md).
//! The CUDA backend regroups IQ2_XXS tensors when it uploads them
//! (`ds4_codegen::quant::device_type`, `regroup_iq2_xxs`).
use super::iq2_xxs::{self, GRID_BYTES};

ds4_macros::quant_type! {
    ggml: Iq2XxsR,
    block: 256,
    sub_block: 8,
    layout {
        sc: u32 @ 0,
        d: f16 @ 4,
        pad: u16 @ 6,
        qs: [u32; 16] @ 8,
    }
    tables {
        GRID_BYTES: [u8; 2048],
    }
    dequant(s, j) {
        let ib = s / 4; // 32-value group: words 2*ib (grid indices) and 2*ib + 1 (signs)
        let k = s % 4; // which 8 values of the group
        let db = (d as f32) * (0.5 + (((sc >> (4 * ib)) & 15) as f32)) * 0.25;
        let g = (qs[2 * ib] >> (8 * k)) & 0xFF;
        let e = 2 * k + j / 4; // half-entry: four weights
        // `sign_bit(k, j)`, written out (the golden test holds the two to each other).
        let neg = (qs[2 * ib + 1] >> (16 * (e / 4) + 4 * (j % 4) + e % 4)) & 1;
        let mag = GRID_BYTES[8 * g + j] as f32;
        db * f32::from_bits(mag.to_bits() ^ (neg << 31))
    }
    quantize: quantize_block,
}

/// IQ2_XXS's quantizer, regrouped.
fn quantize_block(x: &[f32; 256]) -> Block {
    regrouped(&iq2_xxs::quantize_block(x))
}

/// The bit of a group's sign word that holds the sign of weight `j` (0..8) of its grid
/// entry `k` (0..4): half-entry e = 2k + j / 4 keeps weight b = j % 4's at 16(e / 4) + 4b +
/// e % 4, so that one shift brings a half-entry's four to bit 2 of four nibbles (the CUDA
/// kernel's byte permute, `ds4_codegen::cuda_digits`). The layout's one statement but for
/// the declaration's `dequant`, which the expression language makes write it out.
pub const fn sign_bit(k: usize, j: usize) -> u32 {
    let e = 2 * k + j / 4;
    (16 * (e / 4) + 4 * (j % 4) + e % 4) as u32
}

/// Where grid entry k's 7-bit sign pattern p puts its eight signs in a group's sign word:
/// `SIGN_BITS[k][p]` (the eighth, the parity of the seven, included). A table so that
/// regrouping a 47 GB model's experts at upload costs seconds, not minutes.
const SIGN_BITS: [[u32; 128]; 4] = {
    let mut t = [[0u32; 128]; 4];
    let mut k = 0;
    while k < 4 {
        let mut p = 0;
        while p < 128 {
            let s8 = p as u32 | ((p as u32).count_ones() & 1) << 7;
            let mut j = 0;
            while j < 8 {
                t[k][p] |= ((s8 >> j) & 1) << sign_bit(k, j);
                j += 1;
            }
            p += 1;
        }
        k += 1;
    }
    t
};

/// One IQ2_XXS block as IQ2_XXS_R, field by field (the two declarations' `Block`s): per
/// group its grid indices as they are, its scale (the sign word's top four bits) into `sc`,
/// and its four 7-bit sign patterns with their parities into one sign word.
fn regrouped(b: &iq2_xxs::Block) -> Block {
    let mut r = Block { sc: 0, d: b.d, pad: 0, qs: [0; 16] };
    for ib in 0..8 {
        let aux = b.qs[2 * ib + 1];
        r.sc |= (aux >> 28) << (4 * ib);
        r.qs[2 * ib] = b.qs[2 * ib];
        r.qs[2 * ib + 1] = (0..4).fold(0u32, |acc, k| acc | SIGN_BITS[k][((aux >> (7 * k)) & 0x7F) as usize]);
    }
    r
}

/// IQ2_XXS bytes (`src`, whole blocks) into IQ2_XXS_R (`dst`, 72 bytes for each 66).
pub fn regroup(src: &[u8], dst: &mut [u8]) {
    for (from, to) in src.chunks_exact(iq2_xxs::BLOCK_BYTES).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let (from, to) = (from.try_into().expect("whole blocks"), to.try_into().expect("whole blocks"));
        regrouped(&iq2_xxs::Block::read(from)).write(to);
    }
}
