//! TEMPORARY: plain F32/F16/BF16 rows until the quant declarations land (then deleted).
use crate::GgmlType;
pub fn supported() -> &'static [GgmlType] {
    &[GgmlType::F32, GgmlType::F16, GgmlType::Bf16]
}
pub fn dequantize_row(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), String> {
    match t {
        GgmlType::F32 => src.chunks_exact(4).zip(dst).for_each(|(c, d)| *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        GgmlType::F16 => src.chunks_exact(2).zip(dst).for_each(|(c, d)| *d = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        GgmlType::Bf16 => src.chunks_exact(2).zip(dst).for_each(|(c, d)| *d = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        _ => return Err(format!("{t} not supported")),
    }
    Ok(())
}
pub fn dot_row(t: GgmlType, src: &[u8], x: &[f32]) -> Result<f32, String> {
    let mut acc = 0f32;
    match t {
        GgmlType::F32 => src.chunks_exact(4).zip(x).for_each(|(c, v)| acc += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * v),
        _ => {
            let mut tmp = vec![0f32; x.len()];
            dequantize_row(t, src, &mut tmp)?;
            acc = tmp.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }
    Ok(acc)
}
