//! Run-time support for the CPU code that `quant_type!` generates. Nothing here knows any
//! quant type: little-endian loads at offsets the macro has proven in bounds, the f16 to
//! f32 conversion in a form LLVM vectorizes, the lane reduction, and `CpuQuant`, the
//! function table each declaration exports to the registry.

use super::spec::QuantSpec;

pub use half::f16;

/// What one `quant_type!` declaration provides to the registry. The row functions assume
/// the lengths have been checked (whole blocks, matching element counts); the public API in
/// `quant::api` checks them. Given other lengths they process the whole blocks that fit and
/// never panic.
pub struct CpuQuant {
    pub spec: &'static QuantSpec,
    pub dequantize_row: fn(&[u8], &mut [f32]),
    pub dot_row: fn(&[u8], &[f32]) -> f32,
    pub quantize_row: Option<QuantizeRow>,
}

/// `quantize_row(src, dst)` of a type that has a quantizer.
pub type QuantizeRow = fn(&[f32], &mut [u8]);

// The loads below are `unsafe` because they skip the bounds check. The macro only emits
// them after proving, by interval analysis over the index expression (s and j ranges, the
// value ranges of loaded data, masks and shifts), that `at + size <= N`; the
// debug_assert re-checks that proof in debug and test builds.

#[doc(hidden)]
#[inline(always)]
pub unsafe fn ld_u8<const N: usize>(b: &[u8; N], at: usize) -> u8 {
    debug_assert!(at < N);
    *b.get_unchecked(at)
}

#[doc(hidden)]
#[inline(always)]
pub unsafe fn ld_u16<const N: usize>(b: &[u8; N], at: usize) -> u16 {
    debug_assert!(at + 2 <= N);
    u16::from_le_bytes(b.as_ptr().add(at).cast::<[u8; 2]>().read())
}

#[doc(hidden)]
#[inline(always)]
pub unsafe fn ld_u32<const N: usize>(b: &[u8; N], at: usize) -> u32 {
    debug_assert!(at + 4 <= N);
    u32::from_le_bytes(b.as_ptr().add(at).cast::<[u8; 4]>().read())
}

#[doc(hidden)]
#[inline(always)]
pub unsafe fn ld_u64<const N: usize>(b: &[u8; N], at: usize) -> u64 {
    debug_assert!(at + 8 <= N);
    u64::from_le_bytes(b.as_ptr().add(at).cast::<[u8; 8]>().read())
}

/// Table entry `i`, proven in bounds by the macro.
#[doc(hidden)]
#[inline(always)]
pub unsafe fn tab<T: Copy>(t: &[T], i: usize) -> T {
    debug_assert!(i < t.len());
    *t.get_unchecked(i)
}

/// IEEE binary16 bits to f32, exactly (subnormals, infinities and NaN payloads included).
/// Branch-free so that the element loop stays vectorizable: moving the exponent and
/// mantissa into f32 position and multiplying by 2^112 re-biases the exponent and
/// normalises subnormals in one exact multiplication; only Inf/NaN need a select.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    const POW2_112: u32 = (127 + 112) << 23;
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let finite = f32::from_bits(em << 13) * f32::from_bits(POW2_112);
    let inf_nan = f32::from_bits((em << 13) | 0x7f80_0000);
    let mag = if em >= 0x7c00 { inf_nan } else { finite };
    f32::from_bits(mag.to_bits() | sign)
}

/// f32 to binary16 bits, round to nearest even (overflow to infinity).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Sum of the accumulator lanes, pairwise in a fixed order (deterministic, and a little more
/// accurate than a running sum).
#[inline]
pub fn sum_lanes(v: &[f32]) -> f32 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        n => {
            let (a, b) = v.split_at(n / 2);
            sum_lanes(a) + sum_lanes(b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
                assert_eq!(
                    got.to_bits() & 0x803f_ffff,
                    want.to_bits() & 0x803f_ffff,
                    "{h:#06x}"
                );
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }
}
