//! IQ2_XXS: super-blocks of 256 values, 2.06 bits per weight. Per 32 values, two u32s:
//! the first holds four 8-bit indices into GRID (each entry is 8 magnitudes from
//! {8, 25, 43}), the second four 7-bit sign patterns (KSIGNS adds the 8th sign as the
//! parity bit: an even number of negatives) and a 4-bit scale in the top bits.
//! Element = d * (0.5 + scale) / 4 * grid magnitude * sign.
//! GRID and KSIGNS are llama.cpp's data; GRID_BYTES and SIGN_BYTES are views of them computed
//! at compile time, one byte per value, so that a sub-block reads contiguous bytes.
use half::f16;

ds4_macros::quant_type! {
    ggml: Iq2Xxs,
    block: 256,
    // One grid entry (8 values) per sub-block: its lookup is hoisted out of the lanes.
    sub_block: 8,
    layout {
        d: f16 @ 0,
        qs: [u32; 16] @ 2,
    }
    tables {
        GRID_BYTES: [u8; 2048],
        SIGN_BYTES: [u8; 1024],
    }
    dequant(s, j) {
        let ib = s / 4; // 32-value group: words 2*ib (grid indices) and 2*ib + 1 (signs, scale)
        let k = s % 4; // which 8 values of the group
        let aux = qs[2 * ib + 1];
        let db = (d as f32) * (0.5 + ((aux >> 28) as f32)) * 0.25;
        let g = (qs[2 * ib] >> (8 * k)) & 0xFF;
        let pattern = (aux >> (7 * k)) & 0x7F;
        // The entry's 8 magnitudes and the pattern's 8 signs are 8 contiguous bytes each
        // (one vector load on a CPU, two words on a GPU; `codegen/src/quant/runs.rs`).
        let mag = GRID_BYTES[8 * g + j] as f32;
        // A sign byte is 0x80 for a negative value: it flips the float's sign bit (exact,
        // like * -1.0).
        db * f32::from_bits(mag.to_bits() ^ ((SIGN_BYTES[8 * pattern + j] as u32) << 24))
    }
    quantize: quantize_block,
}

/// The 256 grid points, 8 magnitudes each (one per byte, element 0 in the low byte),
/// as in llama.cpp's `iq2xxs_grid`.
#[rustfmt::skip]
const GRID: [u64; 256] = [
    0x0808080808080808, 0x080808080808082b, 0x0808080808081919, 0x0808080808082b08,
    0x0808080808082b2b, 0x0808080808190819, 0x0808080808191908, 0x08080808082b0808,
    0x08080808082b082b, 0x08080808082b2b08, 0x08080808082b2b2b, 0x0808080819080819,
    0x0808080819081908, 0x0808080819190808, 0x0808080819192b08, 0x08080808192b0819,
    0x08080808192b1908, 0x080808082b080808, 0x080808082b08082b, 0x080808082b082b2b,
    0x080808082b2b082b, 0x0808081908080819, 0x0808081908081908, 0x0808081908190808,
    0x0808081908191919, 0x0808081919080808, 0x080808192b081908, 0x080808192b192b08,
    0x0808082b08080808, 0x0808082b0808082b, 0x0808082b082b082b, 0x0808082b2b08082b,
    0x0808190808080819, 0x0808190808081908, 0x0808190808190808, 0x08081908082b0819,
    0x08081908082b1908, 0x0808190819080808, 0x080819081908082b, 0x0808190819082b08,
    0x08081908192b0808, 0x080819082b080819, 0x080819082b081908, 0x080819082b190808,
    0x080819082b2b1908, 0x0808191908080808, 0x080819190808082b, 0x0808191908082b08,
    0x08081919082b0808, 0x080819191908192b, 0x08081919192b2b19, 0x080819192b080808,
    0x080819192b190819, 0x0808192b08082b19, 0x0808192b08190808, 0x0808192b19080808,
    0x0808192b2b081908, 0x0808192b2b2b1908, 0x08082b0808080808, 0x08082b0808081919,
    0x08082b0808082b08, 0x08082b0808191908, 0x08082b08082b2b08, 0x08082b0819080819,
    0x08082b0819081908, 0x08082b0819190808, 0x08082b081919082b, 0x08082b082b082b08,
    0x08082b1908081908, 0x08082b1919080808, 0x08082b2b0808082b, 0x08082b2b08191908,
    0x0819080808080819, 0x0819080808081908, 0x0819080808190808, 0x08190808082b0819,
    0x0819080819080808, 0x08190808192b0808, 0x081908082b081908, 0x081908082b190808,
    0x081908082b191919, 0x0819081908080808, 0x0819081908082b08, 0x08190819082b0808,
    0x0819081919190808, 0x0819081919192b2b, 0x081908192b080808, 0x0819082b082b1908,
    0x0819082b19081919, 0x0819190808080808, 0x0819190808082b08, 0x08191908082b0808,
    0x08191908082b1919, 0x0819190819082b19, 0x081919082b080808, 0x0819191908192b08,
    0x08191919192b082b, 0x0819192b08080808, 0x0819192b0819192b, 0x08192b0808080819,
    0x08192b0808081908, 0x08192b0808190808, 0x08192b0819080808, 0x08192b082b080819,
    0x08192b1908080808, 0x08192b1908081919, 0x08192b192b2b0808, 0x08192b2b19190819,
    0x082b080808080808, 0x082b08080808082b, 0x082b080808082b2b, 0x082b080819081908,
    0x082b0808192b0819, 0x082b08082b080808, 0x082b08082b08082b, 0x082b0819082b2b19,
    0x082b081919082b08, 0x082b082b08080808, 0x082b082b0808082b, 0x082b190808080819,
    0x082b190808081908, 0x082b190808190808, 0x082b190819080808, 0x082b19081919192b,
    0x082b191908080808, 0x082b191919080819, 0x082b1919192b1908, 0x082b192b2b190808,
    0x082b2b0808082b08, 0x082b2b08082b0808, 0x082b2b082b191908, 0x082b2b2b19081908,
    0x1908080808080819, 0x1908080808081908, 0x1908080808190808, 0x1908080808192b08,
    0x19080808082b0819, 0x19080808082b1908, 0x1908080819080808, 0x1908080819082b08,
    0x190808081919192b, 0x19080808192b0808, 0x190808082b080819, 0x190808082b081908,
    0x190808082b190808, 0x1908081908080808, 0x19080819082b0808, 0x19080819192b0819,
    0x190808192b080808, 0x190808192b081919, 0x1908082b08080819, 0x1908082b08190808,
    0x1908082b19082b08, 0x1908082b1919192b, 0x1908082b192b2b08, 0x1908190808080808,
    0x1908190808082b08, 0x19081908082b0808, 0x190819082b080808, 0x190819082b192b19,
    0x190819190819082b, 0x19081919082b1908, 0x1908192b08080808, 0x19082b0808080819,
    0x19082b0808081908, 0x19082b0808190808, 0x19082b0819080808, 0x19082b0819081919,
    0x19082b1908080808, 0x19082b1919192b08, 0x19082b19192b0819, 0x19082b192b08082b,
    0x19082b2b19081919, 0x19082b2b2b190808, 0x1919080808080808, 0x1919080808082b08,
    0x1919080808190819, 0x1919080808192b19, 0x19190808082b0808, 0x191908082b080808,
    0x191908082b082b08, 0x1919081908081908, 0x191908191908082b, 0x191908192b2b1908,
    0x1919082b2b190819, 0x191919082b190808, 0x191919082b19082b, 0x1919191908082b2b,
    0x1919192b08080819, 0x1919192b19191908, 0x19192b0808080808, 0x19192b0808190819,
    0x19192b0808192b19, 0x19192b08192b1908, 0x19192b1919080808, 0x19192b2b08082b08,
    0x192b080808081908, 0x192b080808190808, 0x192b080819080808, 0x192b0808192b2b08,
    0x192b081908080808, 0x192b081919191919, 0x192b082b08192b08, 0x192b082b192b0808,
    0x192b190808080808, 0x192b190808081919, 0x192b191908190808, 0x192b19190819082b,
    0x192b19192b081908, 0x192b2b081908082b, 0x2b08080808080808, 0x2b0808080808082b,
    0x2b08080808082b2b, 0x2b08080819080819, 0x2b0808082b08082b, 0x2b08081908081908,
    0x2b08081908192b08, 0x2b08081919080808, 0x2b08082b08190819, 0x2b08190808080819,
    0x2b08190808081908, 0x2b08190808190808, 0x2b08190808191919, 0x2b08190819080808,
    0x2b081908192b0808, 0x2b08191908080808, 0x2b0819191908192b, 0x2b0819192b191908,
    0x2b08192b08082b19, 0x2b08192b19080808, 0x2b08192b192b0808, 0x2b082b080808082b,
    0x2b082b1908081908, 0x2b082b2b08190819, 0x2b19080808081908, 0x2b19080808190808,
    0x2b190808082b1908, 0x2b19080819080808, 0x2b1908082b2b0819, 0x2b1908190819192b,
    0x2b1908192b080808, 0x2b19082b19081919, 0x2b19190808080808, 0x2b191908082b082b,
    0x2b19190819081908, 0x2b19191919190819, 0x2b192b082b080819, 0x2b192b19082b0808,
    0x2b2b08080808082b, 0x2b2b080819190808, 0x2b2b08082b081919, 0x2b2b081908082b19,
    0x2b2b082b08080808, 0x2b2b190808192b08, 0x2b2b2b0819190808, 0x2b2b2b1908081908,
];

/// GRID as 8 bytes per entry (entry g's magnitude k at 8 * g + k): one entry's 8
/// magnitudes are one contiguous read.
pub(super) const GRID_BYTES: [u8; 2048] = {
    let mut b = [0u8; 2048];
    let mut i = 0;
    while i < 2048 {
        b[i] = (GRID[i / 8] >> (8 * (i % 8))) as u8;
        i += 1;
    }
    b
};

/// Sign patterns: entry i is i with bit 7 set when i has an odd number of bits, so every
/// pattern has an even number of negative signs (llama.cpp's `ksigns_iq2xs`).
#[rustfmt::skip]
const KSIGNS: [u8; 128] = [
    0x00, 0x81, 0x82, 0x03, 0x84, 0x05, 0x06, 0x87, 0x88, 0x09, 0x0a, 0x8b, 0x0c, 0x8d, 0x8e, 0x0f,
    0x90, 0x11, 0x12, 0x93, 0x14, 0x95, 0x96, 0x17, 0x18, 0x99, 0x9a, 0x1b, 0x9c, 0x1d, 0x1e, 0x9f,
    0xa0, 0x21, 0x22, 0xa3, 0x24, 0xa5, 0xa6, 0x27, 0x28, 0xa9, 0xaa, 0x2b, 0xac, 0x2d, 0x2e, 0xaf,
    0x30, 0xb1, 0xb2, 0x33, 0xb4, 0x35, 0x36, 0xb7, 0xb8, 0x39, 0x3a, 0xbb, 0x3c, 0xbd, 0xbe, 0x3f,
    0xc0, 0x41, 0x42, 0xc3, 0x44, 0xc5, 0xc6, 0x47, 0x48, 0xc9, 0xca, 0x4b, 0xcc, 0x4d, 0x4e, 0xcf,
    0x50, 0xd1, 0xd2, 0x53, 0xd4, 0x55, 0x56, 0xd7, 0xd8, 0x59, 0x5a, 0xdb, 0x5c, 0xdd, 0xde, 0x5f,
    0x60, 0xe1, 0xe2, 0x63, 0xe4, 0x65, 0x66, 0xe7, 0xe8, 0x69, 0x6a, 0xeb, 0x6c, 0xed, 0xee, 0x6f,
    0xf0, 0x71, 0x72, 0xf3, 0x74, 0xf5, 0xf6, 0x77, 0x78, 0xf9, 0xfa, 0x7b, 0xfc, 0x7d, 0x7e, 0xff,
];

/// KSIGNS one byte per sign: byte k of pattern p (at 8 * p + k) is 0x80 where sign k is
/// negative, else 0.
const SIGN_BYTES: [u8; 1024] = {
    let mut b = [0u8; 1024];
    let mut i = 0;
    while i < 1024 {
        b[i] = ((KSIGNS[i / 8] >> (i % 8)) & 1) << 7;
        i += 1;
    }
    b
};

/// Candidate sub-block scales, as fractions of (largest |x| / largest grid magnitude).
const SCALE_CANDIDATES: [f32; 16] = [
    0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4,
];

/// The grid as magnitudes: `grid[g][k]`.
fn grid_values() -> [[f32; 8]; 256] {
    GRID.map(|g| std::array::from_fn(|k| ((g >> (8 * k)) & 0xFF) as f32))
}

/// Best grid entry for 8 target values at scale `db`, and its squared error.
fn best_entry(grid: &[[f32; 8]; 256], t: &[f32; 8], db: f32) -> (u8, f32) {
    let mut best = (0u8, f32::INFINITY);
    for (g, vals) in grid.iter().enumerate() {
        let mut e = 0f32;
        for k in 0..8 {
            let r = db * vals[k] - t[k];
            e += r * r;
        }
        if e < best.1 {
            best = (g as u8, e);
        }
    }
    best
}

/// One 32-value group: its sign patterns (7 bits each), the targets the magnitudes must
/// match (|x|, negated where the parity rule forces a wrong sign), and the real-valued
/// scale that fits them best.
struct Group {
    signs: [u8; 4],
    targets: [[f32; 8]; 4],
    scale: f32,
}

fn fit_group(grid: &[[f32; 8]; 256], x: &[f32]) -> Group {
    let mut signs = [0u8; 4];
    let mut targets = [[0f32; 8]; 4];
    for k in 0..4 {
        let v = &x[8 * k..8 * k + 8];
        let mut mask = 0u8;
        for (i, &xi) in v.iter().enumerate() {
            targets[k][i] = xi.abs();
            if xi < 0.0 {
                mask |= 1 << i;
            }
        }
        if mask.count_ones() % 2 == 1 {
            // Odd number of negatives: flip the sign of the smallest value, and ask the grid
            // for a magnitude as close as possible to -|x| there (i.e. the smallest).
            let i = (0..8).min_by(|&a, &b| v[a].abs().total_cmp(&v[b].abs())).unwrap();
            mask ^= 1 << i;
            targets[k][i] = -targets[k][i];
        }
        signs[k] = mask & 0x7F;
    }
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut best = (0f32, f32::INFINITY);
    if amax > 0.0 {
        for c in SCALE_CANDIDATES {
            let db = c * amax / 43.0;
            // Error with the best grid entry per 8, then the least-squares scale for those
            // entries (which can only lower the error for them).
            let entries: Vec<u8> = targets.iter().map(|t| best_entry(grid, t, db).0).collect();
            let (mut gt, mut gg) = (0f32, 0f32);
            for (t, &g) in targets.iter().zip(&entries) {
                for k in 0..8 {
                    gt += grid[g as usize][k] * t[k];
                    gg += grid[g as usize][k] * grid[g as usize][k];
                }
            }
            let refined = if gg > 0.0 && gt > 0.0 { gt / gg } else { db };
            let err: f32 = targets.iter().map(|t| best_entry(grid, t, refined).1).sum();
            if err < best.1 {
                best = (refined, err);
            }
        }
    }
    Group { signs, targets, scale: best.0 }
}

/// Per group: signs, a real scale, then the block's f16 `d` from the largest scale, each
/// group's 4-bit scale code, and the grid entries re-chosen for the scale the decoder will
/// use.
pub(super) fn quantize_block(x: &[f32; 256]) -> Block {
    let grid = grid_values();
    let groups: Vec<Group> = (0..8).map(|ib| fit_group(&grid, &x[32 * ib..32 * ib + 32])).collect();
    let max_scale = groups.iter().fold(0f32, |m, g| m.max(g.scale));
    // db = d * (0.5 + code) / 4, code <= 15: the largest scale takes code 15.
    let d = f16::from_f32(max_scale / 3.875);
    let d32 = d.to_f32();
    let mut qs = [0u32; 16];
    for (ib, g) in groups.iter().enumerate() {
        let code = if d32 > 0.0 { ((g.scale / (0.25 * d32)) - 0.5).round().clamp(0.0, 15.0) as u32 } else { 0 };
        let db = d32 * (0.5 + code as f32) * 0.25;
        let mut indices = 0u32;
        let mut aux = code << 28;
        for k in 0..4 {
            indices |= (best_entry(&grid, &g.targets[k], db).0 as u32) << (8 * k);
            aux |= (g.signs[k] as u32) << (7 * k);
        }
        qs[2 * ib] = indices;
        qs[2 * ib + 1] = aux;
    }
    Block { d, qs }
}
