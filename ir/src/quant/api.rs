//! The row-level API the rest of ds4 uses: check lengths, then call the generated code of
//! the row's type. Rows are a whole number of blocks; every length problem is an error
//! naming the type, never a panic.

use super::rt::CpuQuant;
use super::spec::QuantSpec;
use super::{REGISTRY, SUPPORTED};
use crate::GgmlType;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{0}: this quant type is not supported by ds4's CPU code")]
    Unsupported(GgmlType),
    #[error("{0}: ds4 has no quantizer for this type")]
    NoQuantizer(GgmlType),
    #[error("{ty}: {bytes} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlockBytes {
        ty: GgmlType,
        bytes: usize,
        block_bytes: usize,
    },
    #[error("{ty}: {elems} values is not a whole number of {block_elems}-value blocks")]
    PartialBlockElems {
        ty: GgmlType,
        elems: usize,
        block_elems: usize,
    },
    #[error("{ty}: {what} holds {got} values, but {blocks} blocks have {want}")]
    ElemsMismatch {
        ty: GgmlType,
        what: &'static str,
        got: usize,
        want: usize,
        blocks: usize,
    },
    #[error("{ty}: destination holds {got} bytes, but {blocks} blocks need {want}")]
    BytesMismatch {
        ty: GgmlType,
        got: usize,
        want: usize,
        blocks: usize,
    },
}

/// The generated CPU functions of `t`, for callers that resolve a type once and then call
/// the row functions directly in a hot loop. Those functions assume checked lengths (see
/// [`CpuQuant`]); prefer the checked functions below unless the lengths are known good.
pub fn cpu(t: GgmlType) -> Option<&'static CpuQuant> {
    // Indexed by the enum's discriminant: the matmuls look the type up once per row.
    static BY_TYPE: std::sync::OnceLock<Vec<Option<&'static CpuQuant>>> =
        std::sync::OnceLock::new();
    let table = BY_TYPE.get_or_init(|| {
        let n = REGISTRY
            .iter()
            .map(|q| q.spec.ggml as usize + 1)
            .max()
            .unwrap_or(0);
        let mut v = vec![None; n];
        for &q in REGISTRY {
            v[q.spec.ggml as usize] = Some(q);
        }
        v
    });
    table.get(t as usize).copied().flatten()
}

pub(super) fn find(t: GgmlType) -> Result<&'static CpuQuant, QuantError> {
    cpu(t).ok_or(QuantError::Unsupported(t))
}

/// Number of blocks in `bytes` bytes of type `t`.
fn blocks_in_bytes(q: &CpuQuant, bytes: usize) -> Result<usize, QuantError> {
    let bb = q.spec.block_bytes;
    if !bytes.is_multiple_of(bb) {
        return Err(QuantError::PartialBlockBytes {
            ty: q.spec.ggml,
            bytes,
            block_bytes: bb,
        });
    }
    Ok(bytes / bb)
}

fn expect_elems(
    q: &CpuQuant,
    what: &'static str,
    got: usize,
    blocks: usize,
) -> Result<(), QuantError> {
    let want = blocks * q.spec.block_elems;
    if got != want {
        return Err(QuantError::ElemsMismatch {
            ty: q.spec.ggml,
            what,
            got,
            want,
            blocks,
        });
    }
    Ok(())
}

/// Blocks in a row of `bytes` bytes that a vector of `elems` values must match.
pub(super) fn row_blocks(q: &CpuQuant, bytes: usize, elems: usize) -> Result<usize, QuantError> {
    let blocks = blocks_in_bytes(q, bytes)?;
    expect_elems(q, "x", elems, blocks)?;
    Ok(blocks)
}

/// De-quantize a row of whole blocks: `dst.len()` must be the row's element count.
pub fn dequantize_row(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let q = find(t)?;
    let blocks = blocks_in_bytes(q, src.len())?;
    expect_elems(q, "destination", dst.len(), blocks)?;
    (q.dequantize_row)(src, dst);
    Ok(())
}

/// `dequantize(src) · x` without materialising the de-quantized row: f32 products of the
/// exactly de-quantized weights with `x`, accumulated in f32 (several lanes, summed
/// pairwise at the end). Allocation-free; the CPU matmul calls this per output row.
pub fn dot_row(t: GgmlType, src: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let q = find(t)?;
    row_blocks(q, src.len(), x.len())?;
    Ok((q.dot_row)(src, x))
}

/// Quantize a row of whole blocks into `dst` (exactly the row's byte size).
pub fn quantize_row(t: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let q = find(t)?;
    let quantize = q.quantize_row.ok_or(QuantError::NoQuantizer(t))?;
    let (be, bb) = (q.spec.block_elems, q.spec.block_bytes);
    if !src.len().is_multiple_of(be) {
        return Err(QuantError::PartialBlockElems {
            ty: t,
            elems: src.len(),
            block_elems: be,
        });
    }
    let blocks = src.len() / be;
    if dst.len() != blocks * bb {
        return Err(QuantError::BytesMismatch {
            ty: t,
            got: dst.len(),
            want: blocks * bb,
            blocks,
        });
    }
    quantize(src, dst);
    Ok(())
}

/// Layout and de-quantization expression of `t`, for code generators.
pub fn spec(t: GgmlType) -> Option<&'static QuantSpec> {
    cpu(t).map(|q| q.spec)
}

/// Every type with a declaration, in registry order.
pub fn supported() -> &'static [GgmlType] {
    SUPPORTED
}

/// Whether `quantize_row` works for `t`.
pub fn can_quantize(t: GgmlType) -> bool {
    cpu(t).is_some_and(|q| q.quantize_row.is_some())
}

/// Q8_0 bytes regrouped into the Q8_0_R device layout (`quant/q8_0_r.rs`): `src` and `dst`
/// the same length, a whole number of Q8_0_R blocks (4 Q8_0 blocks).
pub fn regroup_q8_0(src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
    let unit = (GgmlType::Q8_0R, GgmlType::Q8_0R.block_bytes());
    regroup_units(src, unit, dst, unit, super::q8_0_r::regroup)
}

pub use super::iq2_xxs_r::sign_bit as iq2_xxs_r_sign_bit;

/// IQ2_XXS bytes regrouped into the IQ2_XXS_R device layout (`quant/iq2_xxs_r.rs`): `src`
/// whole IQ2_XXS blocks (66 bytes), `dst` 72 bytes for each.
pub fn regroup_iq2_xxs(src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
    let (from, to) = (GgmlType::Iq2Xxs, GgmlType::Iq2XxsR);
    regroup_units(src, (from, from.block_bytes()), dst, (to, to.block_bytes()), super::iq2_xxs_r::regroup)
}

/// A regroup of a file type's bytes into a device layout (`regroup_q8_0`, `regroup_iq2_xxs`).
pub type Regroup = fn(&[u8], &mut [u8]) -> Result<(), QuantError>;

/// The file type that device layout `ty` is regrouped from, and the regroup; None for a
/// type that is no device layout.
pub fn regrouped_from(ty: GgmlType) -> Option<(GgmlType, Regroup)> {
    match ty {
        GgmlType::Q8_0R => Some((GgmlType::Q8_0, regroup_q8_0)),
        GgmlType::Iq2XxsR => Some((GgmlType::Iq2Xxs, regroup_iq2_xxs)),
        _ => None,
    }
}

/// `regroup` of `src`, whole units of `from.1` bytes (of type `from.0`), into `dst`, `to.1`
/// bytes (of type `to.0`) for each: the lengths checked first.
fn regroup_units(src: &[u8], from: (GgmlType, usize), dst: &mut [u8], to: (GgmlType, usize), regroup: fn(&[u8], &mut [u8])) -> Result<(), QuantError> {
    if !src.len().is_multiple_of(from.1) {
        return Err(QuantError::PartialBlockBytes { ty: from.0, bytes: src.len(), block_bytes: from.1 });
    }
    let blocks = src.len() / from.1;
    if dst.len() != blocks * to.1 {
        return Err(QuantError::BytesMismatch { ty: to.0, got: dst.len(), want: blocks * to.1, blocks });
    }
    regroup(src, dst);
    Ok(())
}
