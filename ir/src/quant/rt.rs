//! Run-time support for the CPU code that `quant_type!` generates. Nothing here knows any
//! quant type: little-endian loads at offsets the macro has proven in bounds, the f16 to
//! f32 conversion in a form LLVM vectorizes, the lane reduction, the multiply-add and the
//! 32-byte integer dot product of both kernel variants, the run-time choice between the
//! variants, and `CpuQuant`, the function table each declaration exports to the registry.

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
    /// The integer dot product against quantized activations, for types whose element
    /// term is a small integer (see `quant::acts`); None: the fast path uses `dot_row`.
    pub dot_row_q8: Option<DotRowQ8>,
}

/// `dot_row_q8(row, q, d, s16)`: a row of whole blocks against activations quantized in
/// blocks of 32 (`q` int8 values, `d` their f32 scale per 32, `s16` the de-quantized sum
/// `d * Σ q` per 16 values). Lengths as for `dot_row` (`q.len()` elements).
pub type DotRowQ8 = fn(&[u8], &[i8], &[f32], &[f32]) -> f32;

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
    // A signed compare (em < 2^15): SSE2 has no unsigned one.
    let mag = if (em as i32) >= 0x7c00 {
        inf_nan
    } else {
        finite
    };
    f32::from_bits(mag.to_bits() | sign)
}

/// [`f16_to_f32`], or with `F16C` the x86 conversion instruction (`vcvtph2ps`: also exact,
/// one instruction instead of a dozen), in a form LLVM vectorizes: for values converted
/// lane by lane (F16 rows), it becomes one `vcvtph2ps` per 8. The generated code passes
/// `F16C` = true only in its AVX2 variant, which runs only where the CPU has F16C.
#[doc(hidden)]
#[inline(always)]
pub fn f16_to_f32_lanes<const F16C: bool>(h: u16) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: F16C is checked at run time before the AVX2 variant runs (`avx2_fma`).
        return unsafe { x86::f16_to_f32(h) };
    }
    f16_to_f32(h)
}

/// As [`f16_to_f32_lanes`], for single values (a block's scale). The intrinsic form, used
/// on one value, lets LLVM insert the value into whatever register holds garbage in the
/// unused lanes, which is often an accumulator: the conversion then waits for the
/// accumulator's last multiply-add every block (Q8_0's dot product ran at half speed).
/// This form moves the value into a fresh register first.
#[doc(hidden)]
#[inline(always)]
pub fn f16_to_f32_scalar<const F16C: bool>(h: u16) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: as above.
        return unsafe { x86::f16_to_f32_fresh(h) };
    }
    f16_to_f32(h)
}

/// f32 to binary16 bits, round to nearest even (overflow to infinity).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Whether the fused multiply-add is part of the baseline target: the portable variant of
/// the generated kernels uses it there (aarch64), and plain multiply + add elsewhere (on
/// x86-64's baseline, `mul_add` would be a call to the C library's `fmaf`).
pub const PORTABLE_FMA: bool = cfg!(target_arch = "aarch64");

/// `a * b + c`: fused (one rounding) when `FMA`, else two roundings. Only for accumulation
/// in the dot products: de-quantized values never go through it (they must be bit-exact).
#[doc(hidden)]
#[inline(always)]
pub fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Whether the generated kernels may use their AVX2 + FMA (+ F16C) variant: the CPU has them, and
/// `DS4_SIMD=portable` is not set (to measure or test the portable variant on a machine
/// with AVX2). Detected once, then one relaxed load per call.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn avx2_fma() -> bool {
    match SIMD_LEVEL.load(Ordering::Relaxed) {
        0 => {
            let yes =
                std::env::var_os("DS4_SIMD").is_none_or(|v| v != "portable") && cpu_has_avx2_fma();
            SIMD_LEVEL.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        l => l == 2,
    }
}

use std::sync::atomic::{AtomicU8, Ordering};

/// The kernel variant in use: 0 not yet detected, 1 portable, 2 AVX2 + FMA.
static SIMD_LEVEL: AtomicU8 = AtomicU8::new(0);

#[cfg(target_arch = "x86_64")]
fn cpu_has_avx2_fma() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Switch between the kernel variants (tests and benchmarks: both variants in one
/// process). `true` selects AVX2 + FMA only where the CPU has them; returns whether it is
/// now selected. Both variants are correct, so a switch racing with other threads'
/// kernels only changes which of two valid results they get.
#[doc(hidden)]
pub fn select_avx2_fma(on: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let yes = on && cpu_has_avx2_fma();
        SIMD_LEVEL.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
        yes
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (on, &SIMD_LEVEL, Ordering::Relaxed);
        false
    }
}

/// The variant of the generated kernels this process runs, for benchmark reports.
pub fn simd_level() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        return "x86-64 AVX2+FMA";
    }
    if cfg!(target_arch = "x86_64") {
        "x86-64 baseline (SSE2)"
    } else if PORTABLE_FMA {
        "portable (baseline target, with FMA)"
    } else {
        "portable (baseline target)"
    }
}

/// `Σ e·x` per group of four bytes: lane `k` is `Σ_{i<4} e[4k+i]·x[4k+i]`. The integer
/// core of the fast path, for element terms in `0..=127` (`dot32_u8`) or `-128..=127`
/// (`dot32_i8`) and activations in `-127..=127`; the result is exact in both variants.
///
/// # Safety
/// With `AVX2`, the CPU must support AVX2 (the generated code passes `true` only from its
/// AVX2 variant, which it runs only after checking).
#[doc(hidden)]
#[inline(always)]
pub unsafe fn dot32_u8<const AVX2: bool>(e: &[u8; 32], x: &[i8; 32]) -> [i32; 8] {
    #[cfg(target_arch = "x86_64")]
    {
        if AVX2 {
            // SAFETY: the caller guarantees AVX2.
            return unsafe { x86::dot32_u8(e, x) };
        }
        x86::dot32_sse2::<false>(e, x)
    }
    #[cfg(not(target_arch = "x86_64"))]
    dot32_scalar(e, x)
}

/// The portable integer dot product: LLVM vectorizes it where the target has widening
/// byte multiplies (aarch64); x86-64's baseline has none, hence `x86::dot32_sse2`.
#[allow(dead_code)]
#[inline(always)]
fn dot32_scalar<E: Copy + Into<i32>>(e: &[E; 32], x: &[i8; 32]) -> [i32; 8] {
    let mut r = [0i32; 8];
    for (k, r) in r.iter_mut().enumerate() {
        for i in 4 * k..4 * k + 4 {
            *r += e[i].into() * x[i] as i32;
        }
    }
    r
}

/// As [`dot32_u8`], for signed element terms.
///
/// # Safety
/// As [`dot32_u8`].
#[doc(hidden)]
#[inline(always)]
pub unsafe fn dot32_i8<const AVX2: bool>(e: &[i8; 32], x: &[i8; 32]) -> [i32; 8] {
    #[cfg(target_arch = "x86_64")]
    {
        if AVX2 {
            // SAFETY: the caller guarantees AVX2.
            return unsafe { x86::dot32_i8(e, x) };
        }
        // SAFETY: [i8; 32] and [u8; 32] have the same layout; the bytes are reinterpreted.
        x86::dot32_sse2::<true>(unsafe { &*(e as *const [i8; 32]).cast::<[u8; 32]>() }, x)
    }
    #[cfg(not(target_arch = "x86_64"))]
    dot32_scalar(e, x)
}

/// The AVX2 forms of the integer dot products: `vpmaddubsw` multiplies unsigned by signed
/// bytes and adds adjacent pairs into i16 (saturating, which the operand ranges rule out:
/// 2·128·127 < 2^15), `vpmaddwd` by ones adds adjacent i16 pairs into i32 lanes.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "f16c")]
    pub fn f16_to_f32(h: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    #[inline]
    #[target_feature(enable = "f16c")]
    pub fn f16_to_f32_fresh(h: u16) -> f32 {
        let out: __m128;
        // SAFETY: two register-only instructions (F16C is enabled here); `vmovd` writes
        // the whole register, so nothing depends on its previous contents.
        unsafe {
            core::arch::asm!(
                "vmovd {v}, {h:e}",
                "vcvtph2ps {v}, {v}",
                h = in(reg) h as u32,
                v = out(xmm_reg) out,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        _mm_cvtss_f32(out)
    }

    /// The baseline (SSE2) form: bytes widened to i16 (`e` as unsigned or signed), then
    /// `pmaddwd` gives the sums of adjacent pairs, and adding adjacent pair sums (gathered
    /// by two shuffles) gives the sums of four.
    #[inline(always)]
    pub fn dot32_sse2<const SIGNED_E: bool>(e: &[u8; 32], x: &[i8; 32]) -> [i32; 8] {
        // SAFETY: SSE2 is part of the x86-64 baseline; the loads read 16 bytes from
        // 32-byte arrays at offsets 0 and 16.
        unsafe {
            let zero = _mm_setzero_si128();
            let mut quads = [zero; 2];
            for (h, q) in quads.iter_mut().enumerate() {
                let ev = _mm_loadu_si128(e.as_ptr().add(16 * h).cast());
                let xv = _mm_loadu_si128(x.as_ptr().add(16 * h).cast());
                // High bytes of the widened values: zero, or the sign (all ones if < 0).
                let eh = if SIGNED_E {
                    _mm_cmpgt_epi8(zero, ev)
                } else {
                    zero
                };
                let xh = _mm_cmpgt_epi8(zero, xv);
                let lo = _mm_madd_epi16(_mm_unpacklo_epi8(ev, eh), _mm_unpacklo_epi8(xv, xh));
                let hi = _mm_madd_epi16(_mm_unpackhi_epi8(ev, eh), _mm_unpackhi_epi8(xv, xh));
                let (lo, hi) = (_mm_castsi128_ps(lo), _mm_castsi128_ps(hi));
                let even = _mm_castps_si128(_mm_shuffle_ps::<0b10_00_10_00>(lo, hi));
                let odd = _mm_castps_si128(_mm_shuffle_ps::<0b11_01_11_01>(lo, hi));
                *q = _mm_add_epi32(even, odd);
            }
            core::mem::transmute::<[__m128i; 2], [i32; 8]>(quads)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn dot32_u8(e: &[u8; 32], x: &[i8; 32]) -> [i32; 8] {
        // SAFETY: 32-byte unaligned loads from 32-byte arrays.
        let (ev, xv) = unsafe {
            (
                _mm256_loadu_si256(e.as_ptr().cast()),
                _mm256_loadu_si256(x.as_ptr().cast()),
            )
        };
        let pairs = _mm256_maddubs_epi16(ev, xv);
        // SAFETY: __m256i and [i32; 8] have the same size, and every bit pattern is valid.
        unsafe { core::mem::transmute(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))) }
    }

    /// Signed × signed through the unsigned form: |e| · (x with e's sign).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub fn dot32_i8(e: &[i8; 32], x: &[i8; 32]) -> [i32; 8] {
        // SAFETY: 32-byte unaligned loads from 32-byte arrays.
        let (ev, xv) = unsafe {
            (
                _mm256_loadu_si256(e.as_ptr().cast()),
                _mm256_loadu_si256(x.as_ptr().cast()),
            )
        };
        // |-128| is 128 as an unsigned byte: still exact.
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(ev, ev), _mm256_sign_epi8(xv, ev));
        // SAFETY: as above.
        unsafe { core::mem::transmute(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))) }
    }
}

/// Sum of the accumulator lanes, pairwise in a fixed order (deterministic, and a little more
/// accurate than a running sum): lane i is added to lane i + ⌈n/2⌉, halving n until one
/// is left. Iterative, on a copy: it runs once per row, where the recursion it replaced
/// cost as much as a block of a 2048-value row. Not inlined: inlined, it lets LLVM see the
/// row's accumulators as reductions and vectorize the loop over blocks instead of the
/// blocks' own lanes, four times slower.
#[inline(never)]
pub fn sum_lanes(v: &[f32]) -> f32 {
    const MAX: usize = 64;
    if v.len() > MAX {
        let (a, b) = v.split_at(v.len() / 2);
        return sum_lanes(a) + sum_lanes(b);
    }
    let mut b = [0f32; MAX];
    b[..v.len()].copy_from_slice(v);
    let mut n = v.len();
    while n > 1 {
        let h = n / 2;
        for i in 0..h {
            b[i] += b[n - h + i];
        }
        n -= h;
    }
    b[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_f16_conversions_agree_on_every_non_nan_bit_pattern() {
        if !select_avx2_fma(true) {
            return; // no F16C here: only the portable conversion runs
        }
        for h in 0..=u16::MAX {
            let b = f16_to_f32(h);
            for a in [f16_to_f32_lanes::<true>(h), f16_to_f32_scalar::<true>(h)] {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{h:#06x}"
                );
            }
        }
    }

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
