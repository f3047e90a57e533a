//! `matvec_<type>` on CUDA: a warp per weight row, the row staged in shared memory.
//!
//! Same contract as the generic mat-vec (`QuantKernelKind::MatVec`); what differs is how
//! the bytes travel. A decode step is bandwidth-bound, and the generic kernel reads each
//! element's bytes with a one-byte load from global memory and sums every row over the
//! whole block (two barriers a row): on the H200 that reached 15-20% of the copy
//! bandwidth. Here each warp:
//! 1. copies a chunk of its row (whole blocks, at most [`chunk_bytes`]) into its own
//!    shared-memory buffer with 16-byte loads, so that many wide loads are in flight;
//! 2. walks the chunk with the same factored runs as every other dot product
//!    (`Lower::weight_runs`), the declaration's fields read from the staged copy;
//! 3. sums its lanes with shuffles: no block barrier per row.
//!
//! The warp's chunks (row by row, pick by pick, chunk by chunk) form one sequence of
//! jobs, and the next job's bytes are loaded into registers while the current one is
//! computed: the memory latency hides behind the arithmetic. Rows that are not 16-byte
//! aligned (odd shapes of the tiny test models) take a plain loop with byte copies.
//!
//! Blocks hold [`MATVEC_WARPS`] warps; warp w of block b takes rows b·WARPS + w,
//! + row_blocks·WARPS, .. (any `row_blocks ≥ 1` covers every row). A mat-vec with few
//! rows (n · m below [`SPLIT_BELOW`]) instead gives each block one row at a time, its
//! warps sharing the row's chunks.

use super::lcm;
use super::runs::{Token, Walk};
use super::{Lower, QuantGenError};
use std::fmt::Write;

/// Warps (rows at a time) per block.
pub const MATVEC_WARPS: u64 = 4;

/// Bytes a warp stages at a time: the largest multiple of both the block size and 16
/// (whole blocks, whole 16-byte vectors) that fits in 2 KiB; at least one block. Small
/// enough that [`MIN_BLOCKS`] blocks fit an SM's shared memory, large enough that a
/// lane has four 16-byte loads in flight.
pub fn chunk_bytes(block_bytes: u64) -> u64 {
    let unit = lcm(block_bytes, 16);
    (2048 / unit).max(1) * unit
}

/// Below this many rows (times blocks along y), a block of warps shares each row.
pub const SPLIT_BELOW: u64 = 4096;

/// Blocks per SM the kernel is compiled for (`__launch_bounds__`): 32 warps, each with
/// a chunk's loads in flight, keep the memory system busy (measured on the H200 with 6
/// resident blocks, register-limited: 12-37% occupancy, 0.4-1.8 TB/s).
pub const MIN_BLOCKS: u32 = 8;

/// Runs a lane's loop over the staged chunk takes per iteration (`#pragma unroll`): the
/// next run's loads go out before this run's arithmetic. Measured on the H200 (`ds4 bench
/// --matvec`, µs): 1 / 2 / 4: IQ2_XXS experts 42.5 / 41.1 / 41.5, Q2_K experts 46.1 /
/// 43.3 / 43.7, Q8_0 unchanged within noise.
pub const RUN_UNROLL: u32 = 2;

impl Lower<'_> {
    /// The kernel body after `kernel_open` (and the tables' staging); the walk reads
    /// the fields through `ds4_stage_w` (see `Lower::wbuf`).
    pub(super) fn staged_matvec_body(&self) -> Result<String, QuantGenError> {
        let s = self.syn;
        let (bb, be) = (self.spec.block_bytes as u64, self.spec.block_elems as u64);
        let chunk = chunk_bytes(bb);
        // 16-byte vectors per lane holding one chunk.
        let pf = chunk.div_ceil(16 * 32);
        let wa = MATVEC_WARPS;
        let mut o = String::new();
        let mut w = |depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        for l in [
            format!("__shared__ __align__(16) unsigned char ds4_stage[{wa}][{}];", chunk + super::WORDS_PAD),
            "const unsigned int lane = (unsigned int)(ds4_tid & 31ull);".into(),
            "const unsigned long long warp = ds4_tid >> 5;".into(),
            "unsigned char* const ds4_stage_w = ds4_stage[warp];".into(),
            format!("const unsigned int n_chunks = (unsigned int)((row_bytes + {c}ull) / {chunk}ull);", c = chunk - 1),
            "const unsigned long long row_jobs = picks * n_chunks;".into(),
            // Every chunk starts 16-byte aligned when the weights and the rows do (device
            // allocations are; chunks are multiples of 16 bytes).
            "const bool vectors = ((((unsigned long long)ds4_w) | row_bytes) & 15ull) == 0ull;".into(),
        ] {
            w(1, &l);
        }
        // A job is one chunk (`c`) of one pick (`jp`) of a row: where its bytes start and
        // how many there are. A negative pick (top-k found fewer candidates than picks)
        // adds nothing; its job reads expert 0's row, a valid address.
        let job = |w: &mut dyn FnMut(usize, &str), depth: usize, (row, jp, c): (&str, &str, &str), pre: &str| {
            for l in [
                format!("const unsigned long long {pre}row = {row};"),
                format!("const unsigned long long {pre}jp = {jp};"),
                format!("const unsigned long long {pre}c0 = (unsigned long long)({c}) * {chunk}ull;"),
                format!("const unsigned long long {pre}p = ds4_by * picks + {pre}jp;"),
                format!("const int {pre}pick = has_sel != 0ull ? ds4_sel[{pre}p] : 0;"),
                format!("const unsigned long long {pre}ex = {pre}pick >= 0 ? (unsigned long long){pre}pick : 0ull;"),
                format!("const unsigned long long {pre}src = ({pre}ex * n + {pre}row) * row_bytes + {pre}c0;"),
                format!("const unsigned int {pre}len = (unsigned int)(row_bytes - {pre}c0 < {chunk}ull ? row_bytes - {pre}c0 : {chunk}ull);"),
            ] {
                w(depth, &l);
            }
        };
        // The staged chunk's dot with x into `part`, then the pick's share into `acc`; the
        // buffer is rewritten only after every lane has read it.
        let staged = Lower { wbuf: "ds4_stage_w", words: true, dot: true, ..*self };
        // 32-bit index math inside the staged chunk (`Lower::iw`).
        let walk = Walk { first: "lane", stride: "32u", elems: "cn", bytes_at: "0u", x_at: "ce0" };
        let chunk_dot = |w: &mut dyn FnMut(usize, &str), depth: usize, acc: &str| -> Result<(), QuantGenError> {
            for l in [
                // 32-bit divisions (a 64-bit one is a long software routine).
                "const unsigned long long xo = ((unsigned long long)((unsigned int)p / (unsigned int)x_div) * groups + (unsigned int)row / (unsigned int)ng) * k;".to_string(),
                // The chunk's elements: whole blocks, the first at element c0 / bb · be.
                format!("const unsigned long long ce0 = (c0 / {bb}ull) * {be}ull;"),
                format!("const unsigned int cn = (len / {bb}u) * {be}u;"),
                "float part = 0.0f;".into(),
            ] {
                w(depth, &l);
            }
            w(depth, &format!("#pragma unroll {RUN_UNROLL}"));
            for (d, l) in staged.weight_runs(&walk, &[Token { xo: "xo".into(), acc: "part".into() }])? {
                w(depth + d, &l);
            }
            w(depth, "__syncwarp();");
            w(depth, &format!("if (pick >= 0) {{ {acc} = {acc} + (has_wts != 0ull ? ds4_wts[p] : 1.0f) * part; }}"));
            Ok(())
        };
        // Rows not 16-byte aligned: the chunk byte by byte.
        let byte_copy = "for (unsigned int i = lane; i < len; i += 32u) ds4_stage_w[i] = ds4_w[src + i];";

        // The next job's bytes into registers (`pf`): the loads go out together, before
        // the current job's arithmetic.
        let fetch = |w: &mut dyn FnMut(usize, &str), depth: usize| {
            w(depth, "const uint4* __restrict__ s4 = (const uint4*)(ds4_w + f_src);");
            w(depth, &format!("#pragma unroll\n{}for (int q = 0; q < {pf}; q++) {{ const unsigned int i = lane + 32u * q; if (i < (f_len >> 4)) pf[q] = s4[i]; }}", "    ".repeat(depth)));
        };
        let store = |w: &mut dyn FnMut(usize, &str), depth: usize| {
            w(depth, &format!("#pragma unroll\n{}for (int q = 0; q < {pf}; q++) {{ const unsigned int i = lane + 32u * q; if (i < (len >> 4)) ((uint4*)ds4_stage_w)[i] = pf[q]; }}", "    ".repeat(depth)));
        };
        w(1, &format!("uint4 pf[{pf}];"));

        // Few rows (n · gridDim.y below SPLIT_BELOW): a block per row, its warps sharing
        // the row's chunks (warp w takes jobs w, w + 4, .., the next one's bytes fetched
        // before the current one is computed), their sums added through shared memory. A
        // warp per row would leave most of the GPU idle (the hyper-connection and router
        // mat-vecs have 24-256 rows of up to 32 KiB).
        w(1, &format!("if (n * gridDim.y < {SPLIT_BELOW}ull) {{"));
        w(2, &format!("__shared__ float ds4_red4[{wa}];"));
        w(2, "for (unsigned long long srow = ds4_bx; srow < n; srow += row_blocks) {");
        w(3, "float sacc = 0.0f;");
        w(3, "if (vectors && warp < row_jobs) {");
        job(&mut w, 4, ("srow", "(unsigned int)warp / n_chunks", "(unsigned int)warp % n_chunks"), "f_");
        fetch(&mut w, 4);
        w(3, "}");
        w(3, &format!("for (unsigned int job = (unsigned int)warp; job < (unsigned int)row_jobs; job += {wa}u) {{"));
        job(&mut w, 4, ("srow", "job / n_chunks", "job % n_chunks"), "");
        w(4, "if (vectors) {");
        store(&mut w, 5);
        w(5, "__syncwarp();");
        w(5, &format!("if (job + {wa}u < (unsigned int)row_jobs) {{"));
        job(&mut w, 6, ("srow", &format!("(job + {wa}u) / n_chunks"), &format!("(job + {wa}u) % n_chunks")), "f_");
        fetch(&mut w, 6);
        w(5, "}");
        w(4, "} else {");
        w(5, byte_copy);
        w(5, "__syncwarp();");
        w(4, "}");
        chunk_dot(&mut w, 4, "sacc")?;
        w(3, "}");
        w(3, "for (int o = 16; o > 0; o >>= 1) sacc += __shfl_xor_sync(0xffffffffu, sacc, o);");
        w(3, "if (lane == 0u) ds4_red4[warp] = sacc;");
        w(3, "__syncthreads();");
        let total: Vec<String> = (0..wa).map(|i| format!("ds4_red4[{i}]")).collect();
        w(3, &format!("if (ds4_tid == 0ull) {{ {}[ds4_by * n + srow] = {}; }}", s.buffer("out"), total.join(" + ")));
        w(3, "__syncthreads();");
        w(2, "}");
        w(2, "return;");
        w(1, "}");

        // Otherwise a warp per row: the warp's jobs (row by row, pick by pick, chunk by
        // chunk) in sequence, counted without divisions, the next job's bytes loaded into
        // registers (`pf`) before the current one is computed.
        for l in [
            format!("const unsigned long long first_row = ds4_bx * {wa}ull + warp;"),
            format!("const unsigned long long row_step = row_blocks * {wa}ull;"),
            "const unsigned long long n_rows = first_row < n ? (n - first_row + row_step - 1ull) / row_step : 0ull;".into(),
            "const unsigned long long jobs = n_rows * row_jobs;".into(),
            "float acc = 0.0f;".into(),
            "unsigned int j_c = 0u, j_p = 0u, j_r = 0u;".into(),
        ] {
            w(1, &l);
        }
        w(1, "if (vectors && jobs > 0ull) {");
        job(&mut w, 2, ("first_row", "0u", "0u"), "f_");
        fetch(&mut w, 2);
        w(1, "}");
        w(1, "for (unsigned long long jb = 0ull; jb < jobs; jb += 1ull) {");
        job(&mut w, 2, ("first_row + (unsigned long long)j_r * row_step", "j_p", "j_c"), "");
        w(2, "unsigned int n_c = j_c + 1u, n_p = j_p, n_r = j_r;");
        w(2, "if (n_c == n_chunks) { n_c = 0u; n_p += 1u; if (n_p == (unsigned int)picks) { n_p = 0u; n_r += 1u; } }");
        w(2, "if (vectors) {");
        store(&mut w, 3);
        w(3, "__syncwarp();");
        // The next job's loads go out before this one's arithmetic.
        w(3, "if (jb + 1ull < jobs) {");
        job(&mut w, 4, ("first_row + (unsigned long long)n_r * row_step", "n_p", "n_c"), "f_");
        fetch(&mut w, 4);
        w(3, "}");
        w(2, "} else {");
        w(3, byte_copy);
        w(3, "__syncwarp();");
        w(2, "}");
        chunk_dot(&mut w, 2, "acc")?;
        w(2, "if (c0 + len == row_bytes && jp + 1ull == picks) {");
        w(3, "for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);");
        w(3, &format!("if (lane == 0u) {{ {}[ds4_by * n + row] = acc; }}", s.buffer("out")));
        w(3, "acc = 0.0f;");
        w(2, "}");
        w(2, "j_c = n_c; j_p = n_p; j_r = n_r;");
        w(1, "}");
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_hold_whole_blocks_and_whole_vectors() {
        for bb in [2u64, 4, 34, 66, 84, 144, 210, 17] {
            let c = chunk_bytes(bb);
            assert_eq!(c % bb, 0, "{bb}");
            assert_eq!(c % 16, 0, "{bb}");
            assert!(c <= 2048 || c == lcm(bb, 16), "{bb}: {c}");
        }
        assert_eq!(chunk_bytes(34), 1904);
        assert_eq!(chunk_bytes(2), 2048);
    }
}
