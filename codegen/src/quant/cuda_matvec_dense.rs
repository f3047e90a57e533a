//! `matvec_dense_<type>`: a token's mat-vec over every row of a device layout read in
//! place (Q8_0_R), in a kernel that does nothing else.
//!
//! The generated `matvec_q8_0_r` (`cuda_matvec.rs`) has one contract for every mat-vec:
//! picks of selected experts with weights, 64-bit row arithmetic, three direct paths and
//! the staged ones in one body. Its direct path's loop is this kernel's loop (the same
//! `Lower::rows_runs`, the same reads), but around it the kernel holds more state: 72
//! registers, so 7 blocks an SM where this kernel's 64 leave room for 8, and the
//! decode step's launches of 1024-2048 blocks take a wave more. Here: one block of
//! [`MATVEC_WARPS`] warps per group of [`DENSE_ROWS`] rows, the warps splitting the rows'
//! runs, x loaded once for the rows, every index 32 bits, no picks.
//!
//! H200, back-to-back launches each on a matrix not in L2 (µs; a plain 16-byte read of the
//! same bytes / the generated kernel / a standalone kernel of this shape, `nvcc`, not in
//! the tree): `attn_q_a`+`attn_kv` (1536 × 4096) 4.6 / 6.4 / 5.6, the shared expert's
//! gate+up (4096 × 4096) 7.3 / 10.9 / 8.5 and down (4096 × 2048) 5.1 / 7.6 / 6.1,
//! `attn_q_b` (32768 × 1024) 11.4 / 16.3 / 15.4, `attn_output_a` (8 groups of 1024 × 4096)
//! 11.4 / 16.5 / 13.2, `attn_output_b` (4096 × 8192) 11.4 / 17.7 / 13.1. Variants of the
//! generated kernel measured on the way (none closed the gap): 32-bit loop bounds and x
//! offsets, no staging buffer, `__ldg` loads, row addresses as 32-bit offsets, one path
//! a kernel, 8 blocks an SM (64 registers: 14.8 on `attn_output_b`).
//!
//! The runtime (`runtime/src/cuda/exec/matvec.rs`, `matvec`) takes it where [`fits`] says
//! and the weights are 16-byte aligned; `DS4_MATVEC_DENSE=0` turns it off. The sums are the
//! generated kernel's, added in the same order within a lane (`cuda_kernels` holds it to
//! the mat-vec bound).

use super::cuda_matvec::{reads_in_place, warps_sum, warps_total, BLOCK_GROUPS_FROM, MATVEC_WARPS, ROW_PTRS, RUN_UNROLL};
use super::runs::{Token, Walk};
use super::{BufElem, Lower, QParam, QuantGenError, Reads};
use crate::Target;
use ds4_ir::GgmlType;
use std::fmt::Write;

/// The device layout that has a dense kernel, and its name.
pub const DENSE_TYPE: GgmlType = GgmlType::Q8_0R;
pub const NAME: &str = "matvec_dense_q8_0_r";
/// Rows a block takes (x loaded once for them).
pub const DENSE_ROWS: u64 = 4;
/// Threads a block.
pub const THREADS: u32 = 32 * MATVEC_WARPS as u32;
/// Blocks an SM it is compiled for (`__launch_bounds__`): 64 registers, the whole grid of
/// a 4096-row launch in one wave. H200 (µs, 6 → 8, with the loads' offsets added to the
/// pointer term by term): `attn_output_b` 14.5 → 13.3, the shared expert's gate+up 9.1 →
/// 8.6, `attn_q_b` 16.7 → 16.1, `attn_q_a`+`attn_kv` 5.8 → 6.0.
pub const MIN_BLOCKS: u32 = 8;

/// One form of the kernel: its name, rows a block, blocks an SM it is compiled for.
pub struct Dense {
    pub name: &'static str,
    pub rows: u64,
    pub min_blocks: u32,
}

/// The form for rows of more than [`SHORT_MAX_K`] values.
pub const DENSE: Dense = Dense { name: NAME, rows: DENSE_ROWS, min_blocks: MIN_BLOCKS };

/// The form for short rows: `attn_q_b`'s 1024 values are one 8-value run a lane, so a
/// 4-row block is one round of loads (32 bytes a lane) between its start and its sums,
/// 8,192 blocks in ~8 waves (standalone 15.4 µs against a plain read's 11.4). Sixteen
/// rows a block keep 128 bytes a lane in flight, in a quarter of the blocks (128
/// registers, four blocks an SM).
pub const SHORT: Dense = Dense { name: "matvec_dense_q8_0_r_short", rows: 16, min_blocks: 4 };

/// Rows this long or shorter take [`SHORT`].
pub const SHORT_MAX_K: usize = 1024;

/// The form for rows of `k` values (`DS4_DENSE_SHORT=0` measures without the short one:
/// the runtime's switch).
pub fn form(k: usize, short: bool) -> &'static Dense {
    if short && k <= SHORT_MAX_K {
        &SHORT
    } else {
        &DENSE
    }
}

/// Both forms, for the tables that list every kernel.
pub const FORMS: [&Dense; 2] = [&DENSE, &SHORT];
const _: () = assert!(SHORT.rows as usize <= ROW_PTRS.len());

/// Parameters in launch order: out (m · n floats), the weights (n rows of `row_bytes`),
/// x (token t's row group g at (t · groups + g) · k), rows, row length, bytes a row,
/// row groups, rows a group; then the expand's (`cuda_hc_expand::params`, `enh` = 0 for
/// none).
pub fn params() -> Vec<QParam> {
    let b = |name, elem, mutable| QParam::Buffer { name, elem, mutable };
    let s = |name| QParam::Scalar { name };
    let mut p = vec![b("out", BufElem::F32, true), b("w", BufElem::Bytes, false), b("x", BufElem::F32, false), s("n"), s("k"), s("row_bytes"), s("groups"), s("ng")];
    p.extend(crate::cuda_hc_expand::params());
    p.extend(crate::cuda_hc_pre::ride_params());
    p
}

/// Whether a launch of `form` can also make the `hc_expand` of its output
/// (`cuda_hc_expand.rs`): one row group (the output is a token's y) of nh streams.
pub fn expand_fits(form: &Dense, groups: usize, nh: usize) -> bool {
    groups == 1 && crate::cuda_hc_expand::fits(nh, form.rows as usize, THREADS as usize)
}

/// Whether a mat-vec takes `form`: weights of [`DENSE_TYPE`], every row once (no
/// selection, no pick weights, one pick, each token its own x), a block's rows in one row
/// group, rows of whole runs, and enough groups of rows to fill the GPU (fewer: the
/// generated kernel's block per row). 32-bit indices must hold.
#[allow(clippy::too_many_arguments)]
pub fn fits(form: &Dense, ty: GgmlType, n: usize, k: usize, m: usize, groups: usize, ng: usize, picks: usize, x_div: usize, selected: bool, weighted: bool) -> bool {
    let rows = form.rows as usize;
    ty == DENSE_TYPE
        && picks == 1
        && x_div == 1
        && !selected
        && !weighted
        && n > 0
        && k.is_multiple_of(256)
        && (groups == 1 || ng.is_multiple_of(rows))
        && n.div_ceil(rows) * m >= BLOCK_GROUPS_FROM as usize
        && (m * groups * k) < u32::MAX as usize
        && ty.bytes_for(k as u64).is_some_and(|b| (b as usize) * rows < u32::MAX as usize)
}

/// The launch grid: a block per group of `form.rows` rows, one row of blocks a token; with
/// a Sinkhorn riding (`comb`, `cuda_hc_pre::ride_params`), a block more at the head of each.
pub fn grid(form: &Dense, n: usize, m: usize, comb: bool) -> (u32, u32) {
    (n.div_ceil(form.rows as usize) as u32 + comb as u32, m as u32)
}

/// The CUDA source of [`DENSE`] (None on other targets, or if the type could not be
/// lowered).
pub fn source(target: Target) -> Option<String> {
    form_source(target, &DENSE)
}

/// The CUDA source of [`SHORT`].
pub fn short_source(target: Target) -> Option<String> {
    form_source(target, &SHORT)
}

/// A form's source (a `TextKernel`'s `source` is a function of the target alone: the two
/// above name the forms).
fn form_source(target: Target, form: &Dense) -> Option<String> {
    if !target.is_cuda() {
        return None;
    }
    let spec = ds4_ir::quant::spec(DENSE_TYPE)?;
    debug_assert!(reads_in_place(DENSE_TYPE));
    let syn = super::syntax(target)?;
    let lower = Lower { syn: syn.as_ref(), spec, shared_tables: false, wbuf: "ds4_w", reads: Reads::Aligned, run_elem: None, dot: true };
    let mut src = syn.prelude(form.name, spec);
    src.push_str(&lower.helpers().ok()?);
    src.push_str(&crate::cuda_hc_expand::helpers());
    src.push_str(&crate::cuda_hc_pre::comb_helpers());
    src.push_str(&syn.kernel_open(form.name, &params(), 0, Some(form.min_blocks)));
    src.push_str(&lower.dense_body(form.rows).ok()?);
    src.push_str("}\n");
    Some(src)
}

/// Shared memory a launch of `form` states (the warps' sums, the expand's staging).
pub fn shared_bytes(form: &Dense) -> u32 {
    (THREADS / 32) * form.rows as u32 * 4 + crate::cuda_hc_expand::shared_bytes(form.rows as usize)
}

impl Lower<'_> {
    /// After `kernel_open`: the block's rows, their runs walked by all its lanes, the
    /// warps' sums added.
    fn dense_body(&self, rows: u64) -> Result<String, QuantGenError> {
        let mut o = String::new();
        let mut w = |depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        // A Sinkhorn riding in block 0 (an `hc_pre`'s, `cuda_hc_pre::ride_params`).
        w(1, crate::cuda_hc_pre::RIDE_CALL);
        for l in [
            "const unsigned int lane = threadIdx.x & 31u;".to_string(),
            "const unsigned int warp = threadIdx.x >> 5;".into(),
            "const unsigned int k32 = (unsigned int)k;".into(),
            "const unsigned int rb = (unsigned int)row_bytes;".into(),
            "const unsigned int last = (unsigned int)n - 1u;".into(),
            format!("const unsigned int g0 = row_block * {rows}u;"),
            "const unsigned int xo = (blockIdx.y * (unsigned int)groups + g0 / (unsigned int)ng) * k32;".into(),
            "const unsigned char* const ds4_wd0 = ds4_w + (unsigned long long)g0 * row_bytes;".into(),
        ] {
            w(1, &l);
        }
        // The expand's inputs on their way to shared memory while the rows are read.
        w(1, &crate::cuda_hc_expand::stage_call(rows, "g0", "blockIdx.y"));
        // Rows past the last read the last one (a valid address; nothing stores them).
        for (r, b) in ROW_PTRS.iter().enumerate().take(rows as usize).skip(1) {
            w(1, &format!("const unsigned char* const {b} = ds4_wd0 + (g0 + {r}u < last ? {r}u : last - g0) * rb;"));
        }
        w(1, &format!("float acc[{rows}] = {{{}}};", vec!["0.0f"; rows as usize].join(", ")));
        w(1, &format!("#pragma unroll {RUN_UNROLL}"));
        let walk = Walk { first: "threadIdx.x", stride: &format!("{THREADS}u"), elems: "k32", bytes_at: "0u", x_at: "" };
        for (d, l) in self.rows_runs(&walk, &[Token { xo: "xo".into(), acc: "acc".into() }], &ROW_PTRS[..rows as usize])? {
            w(1 + d, &l);
        }
        w(1, crate::cuda::GRID_TRIGGER);
        w(1, &format!("__shared__ float ds4_red[{MATVEC_WARPS}][{rows}];"));
        warps_total(&mut w, 1, "ds4_red", rows, "acc", "g0", &self.syn.buffer("out"));
        w(1, &crate::cuda_hc_expand::store_call(rows, "g0", "blockIdx.y", &|q| warps_sum("ds4_red", q)));
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dense kernel reads in place like the direct path (aligned words, one 16-bit
    /// scale load, no funnel shift) with 32-bit loop bounds, and only on CUDA.
    #[test]
    fn dense_kernel_reads_in_place_with_32_bit_indices() {
        let src = source(Target::CudaSm90).unwrap();
        assert!(src.contains(&format!("extern \"C\" __global__ void __launch_bounds__({THREADS}, {MIN_BLOCKS}) {NAME}(")), "{src}");
        assert!(!src.contains("__funnelshift_r"), "{src}");
        assert!(src.contains("*(const unsigned int*)(ds4_wd3 + ds4_ra0 + 4u)"), "{src}");
        assert!(src.contains("u < k32 / 8u; u += 128u"), "{src}");
        assert!(source(Target::Wgsl).is_none());
        let short = short_source(Target::CudaSm90).unwrap();
        assert!(short.contains(&format!("__launch_bounds__({THREADS}, {}) {}(", SHORT.min_blocks, SHORT.name)) && short.contains("ds4_wd15") && short.contains("acc[15]"), "{short}");
    }

    #[test]
    fn fits_only_dense_launches_of_many_rows() {
        let (q, d) = (DENSE_TYPE, &DENSE);
        assert!(fits(d, q, 4096, 8192, 1, 1, 4096, 1, 1, false, false));
        assert!(fits(d, q, 8192, 4096, 1, 8, 1024, 1, 1, false, false));
        assert!(!fits(d, GgmlType::Q8_0, 4096, 8192, 1, 1, 4096, 1, 1, false, false));
        assert!(!fits(d, q, 4096, 8192, 1, 1, 4096, 6, 1, true, true), "expert picks");
        assert!(!fits(d, q, 512, 4096, 1, 1, 512, 1, 1, false, false), "128 groups: a block per row fills more SMs");
        assert!(!fits(d, q, 8190, 4096, 1, 3, 2730, 1, 1, false, false), "groups a block would straddle");
        assert!(!fits(d, q, 4096, 100, 1, 1, 4096, 1, 1, false, false), "rows of part runs");
        assert_eq!(grid(d, 4097, 2, false), (1025, 2));
        assert_eq!(grid(d, 4097, 2, true), (1026, 2), "a block more for a riding Sinkhorn");
        // Short rows: attn_q_b's shape, sixteen rows a block.
        assert_eq!(form(1024, true).name, SHORT.name);
        assert_eq!(form(1024, false).name, NAME);
        assert_eq!(form(2048, true).name, NAME);
        assert!(fits(&SHORT, q, 32768, 1024, 1, 1, 32768, 1, 1, false, false));
        assert!(!fits(&SHORT, q, 2048, 1024, 1, 1, 2048, 1, 1, false, false), "128 blocks");
        assert_eq!(grid(&SHORT, 32768, 1, false), (2048, 1));
    }
}
