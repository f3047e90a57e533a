//! `matvec_<type>` on CUDA: a warp per group of weight rows, staged in shared memory.
//!
//! Same contract as the generic mat-vec (`QuantKernelKind::MatVec`); what differs is how
//! the bytes travel. A decode step is bandwidth-bound, and the generic kernel reads each
//! element's bytes with a one-byte load from global memory and sums every row over the
//! whole block (two barriers a row): on the H200 that reached 15-20% of the copy
//! bandwidth. Here each warp:
//! 1. copies a chunk of each of its [`rows_per_warp`] rows (whole blocks, about 1 KiB:
//!    [`row_chunk_bytes`]) into shared memory with 16-byte `cp.async` copies;
//! 2. walks the chunks with the same factored runs as every other dot product
//!    (`Lower::rows_runs`), the declaration's fields read from the staged copies, each x
//!    element loaded once for all the rows (one row a warp, x's loads were four times
//!    the Q8_0 weight bytes and bounded the kernel);
//! 3. sums its lanes with shuffles: no block barrier per row.
//!
//! The warp's chunks (group by group, pick by pick, chunk by chunk) form one sequence of
//! jobs in two stages: the next job's copies are in flight while the current one is
//! computed, so the memory latency hides behind the arithmetic. Rows that are not 16-byte
//! aligned (odd shapes of the tiny test models) take a plain loop with byte copies.
//!
//! Blocks hold [`MATVEC_WARPS`] warps; warp w of block b takes row groups b·WARPS + w,
//! then every row_blocks·WARPS-th after it (any `row_blocks ≥ 1` covers every row). A mat-vec with few
//! rows (n · m below [`SPLIT_BELOW`]) instead gives each block one group at a time, its
//! warps sharing the group's chunks, or, with fewer than [`BLOCK_GROUPS_FROM`] groups or
//! row groups (a grouped mat-vec, each group reading its own x) that a warp's rows would
//! straddle, one row at a time (`block_rows` tells the runtime which).
//!
//! Measured on the H200 (`ds4 bench --matvec`, µs, one row a warp → four): the output
//! head 319 → 226-233, `attn_q_b` 29.0 → 22.0-22.7, the routed experts' IQ2_XXS
//! 41.6 → 30.3-31.6 and Q2_K 43.3 → 30.4-32.1; synthetic q2 decode at ctx 96
//! 51.9 → 56.3-57.0 t/s. A block per group for launches of many rows but fewer than 4096
//! groups measured slower (51.5 t/s; the IQ2_XXS experts' two jobs a group left half the
//! warps idle: 42.2 µs) and is kept for few rows only.
//!
//! The device layouts (`reads_in_place`: Q8_0_R, Q8_0 regrouped on upload) skip the
//! staging: aligned rows take the direct path (`Lower::direct_paths`), whose lanes read
//! their runs' fields straight from global memory in loads as wide as their alignment
//! allows (`Reads::Aligned`), with the same three paths and [`DIRECT_SPLIT_BELOW`] for
//! few rows.

use super::lcm;
use super::runs::{Token, Walk};
use super::{Lower, QuantGenError, Reads};
use ds4_ir::GgmlType;
use std::fmt::Write;

/// Warps per block.
pub const MATVEC_WARPS: u64 = 4;

/// Bytes a warp stages at a time on the few-rows path: the largest multiple of both the
/// block size and 16 (whole blocks, whole 16-byte vectors) that fits in 2 KiB; at least
/// one block. Large enough that a lane has four 16-byte loads in flight.
pub fn chunk_bytes(block_bytes: u64) -> u64 {
    let unit = lcm(block_bytes, 16);
    (2048 / unit).max(1) * unit
}

/// Bytes of each row a warp stages at a time on the many-rows path (two stages of
/// [`rows_per_warp`] rows): whole blocks and vectors, about 1 KiB.
pub fn row_chunk_bytes(block_bytes: u64) -> u64 {
    let unit = lcm(block_bytes, 16);
    (1024 / unit).max(1) * unit
}

/// Most rows a warp walks together on the many-rows path.
pub const MAX_ROWS_PER_WARP: u64 = 4;

/// Static shared memory the many-rows stages of a block may take.
const ROW_STAGES_LIMIT: u64 = 36 * 1024;

/// Rows a warp walks together on the many-rows path: each x element is loaded once for
/// all of them. One row a warp loads four bytes of x per byte of Q8_0 weight, and that
/// traffic bounded the kernel: measured on the H200 with a standalone kernel (Q8_0,
/// 129280 × 4096), 1, 2, 4 rows a warp read 1.97, 3.27, 4.08 TB/s (x in shared memory
/// for 4; the copy bandwidth 4.3). At most [`MAX_ROWS_PER_WARP`], fewer where two stages
/// of that many row chunks would not fit [`ROW_STAGES_LIMIT`] (Q6_K's 1680-byte unit).
pub fn rows_per_warp(block_bytes: u64) -> u64 {
    let stage = row_chunk_bytes(block_bytes) + super::WORDS_PAD;
    let mut r = MAX_ROWS_PER_WARP;
    while r > 1 && MATVEC_WARPS * 2 * r * stage > ROW_STAGES_LIMIT {
        r /= 2;
    }
    r
}

/// Bytes of shared memory each warp stages rows in: the few-rows path's chunk or the
/// many-rows path's two stages, whichever is larger (the two paths share it).
pub fn warp_stage_bytes(block_bytes: u64) -> u64 {
    let few = chunk_bytes(block_bytes) + super::WORDS_PAD;
    let many = 2 * rows_per_warp(block_bytes) * (row_chunk_bytes(block_bytes) + super::WORDS_PAD);
    few.max(many)
}

/// Below this many rows (times blocks along y), a block of warps shares each row.
pub const SPLIT_BELOW: u64 = 4096;

/// Rows one block covers at a time in a launch of `n` rows × `m` (its grid's y), row
/// groups of `ng` rows (`groups` > 1: a grouped mat-vec, each group reading its own x):
/// one on the few-rows path (few rows, or groups that a warp's rows would straddle),
/// else a row group per warp. The kernel makes the same choice.
pub fn block_rows(ty: GgmlType, n: u64, m: u64, groups: u64, ng: u64) -> u64 {
    let r = rows_per_warp(ty.block_bytes() as u64);
    let few = n * m < split_below(ty);
    if (groups > 1 && !ng.is_multiple_of(r)) || (few && n.div_ceil(r) * m < BLOCK_GROUPS_FROM) {
        1
    } else if few {
        r
    } else {
        MATVEC_WARPS * r
    }
}

/// Rows (times blocks along y) below which a block shares each row or row group:
/// [`SPLIT_BELOW`], or [`DIRECT_SPLIT_BELOW`] for rows read in place.
pub fn split_below(ty: GgmlType) -> u64 {
    if reads_in_place(ty) {
        DIRECT_SPLIT_BELOW
    } else {
        SPLIT_BELOW
    }
}

/// [`SPLIT_BELOW`] of the direct path: a warp reading in place has only its runs' loads in
/// flight (a staged warp has its next chunks' copies), so rows need more warps sooner.
/// Measured on the H200 (`ds4 bench --matvec`, µs, 4096 → 16384): `attn_output_b` (4096
/// rows of 8192) 24.5 → 17.7, the shared expert's down 8.7 → 7.7, the rest unchanged
/// (65536: `attn_q_b` 16.1 → 22.3); decode at ctx 96 62.0 → 63.6 t/s. Four runs a
/// loop step instead of [`RUN_UNROLL`]'s two: the head 157.5 → 166.0.
pub const DIRECT_SPLIT_BELOW: u64 = 16384;

/// Few rows (n · m below [`SPLIT_BELOW`]) in at least this many row groups (times blocks
/// along y): a block per group, its warps sharing the group's chunks (x loaded once for
/// the group's rows); fewer groups: a block per row, to keep more SMs busy. Measured on
/// the H200 (`ds4 bench --matvec`, µs, a block per row → per group): `attn_q_a` (256
/// groups) 8.0 → 7.1, shared experts' gate/up (512) 11.4 → 8.8, compressor kv (F16, 256)
/// 13.6 → 9.3, but `attn_kv` (128 groups) 5.6 → 6.6.
pub const BLOCK_GROUPS_FROM: u64 = 256;

/// Blocks per SM the kernel is compiled for (`__launch_bounds__`): 24 warps, each with
/// its next stage's copies in flight, at most 80 registers a thread (four rows' sums
/// and sixteen staged buffers' addresses). Measured on the H200 (synthetic q2 decode at
/// ctx 96, t/s): 4 / 6 / 8 blocks: 54.7 / 56.3 / 54.1.
pub const MIN_BLOCKS: u32 = 6;

/// Runs a lane's loop over the staged chunk takes per iteration (`#pragma unroll`): the
/// next run's loads go out before this run's arithmetic. Measured on the H200 (`ds4 bench
/// --matvec`, µs): 1 / 2 / 4: IQ2_XXS experts 42.5 / 41.1 / 41.5, Q2_K experts 46.1 /
/// 43.3 / 43.7, Q8_0 unchanged within noise.
pub const RUN_UNROLL: u32 = 2;

/// Names of the staged rows' buffers on the many-rows path (`Lower::wbuf` is static).
const ROW_BUFS: [&str; MAX_ROWS_PER_WARP as usize] = ["ds4_wr0", "ds4_wr1", "ds4_wr2", "ds4_wr3"];

impl Lower<'_> {
    /// The kernel body after `kernel_open` (and the tables' staging); the walk reads
    /// the fields through the staged buffers (see `Lower::wbuf`).
    pub(super) fn staged_matvec_body(&self) -> Result<String, QuantGenError> {
        let s = self.syn;
        let (bb, be) = (self.spec.block_bytes as u64, self.spec.block_elems as u64);
        let chunk = chunk_bytes(bb);
        let (rchunk, rows) = (row_chunk_bytes(bb), rows_per_warp(bb));
        let rstride = rchunk + super::WORDS_PAD;
        // 16-byte vectors per lane holding one chunk.
        let pf = chunk.div_ceil(16 * 32);
        let wa = MATVEC_WARPS;
        let mut o = String::new();
        let mut w = |depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        for l in [
            format!("__shared__ __align__(16) unsigned char ds4_stage[{wa}][{}];", warp_stage_bytes(bb)),
            "const unsigned int lane = (unsigned int)(ds4_tid & 31ull);".into(),
            "const unsigned long long warp = ds4_tid >> 5;".into(),
            "unsigned char* const ds4_stage_w = ds4_stage[warp];".into(),
            // Every chunk starts 16-byte aligned when the weights and the rows do (device
            // allocations are; chunks are multiples of 16 bytes).
            "const bool vectors = ((((unsigned long long)ds4_w) | row_bytes) & 15ull) == 0ull;".into(),
        ] {
            w(1, &l);
        }
        // A job is one chunk (`c`) of one pick (`jp`) of a row: where its bytes start and
        // how many there are. A negative pick (top-k found fewer candidates than picks)
        // adds nothing; its job reads expert 0's row, a valid address.
        let job = |w: &mut dyn FnMut(usize, &str), depth: usize, (row, jp, c): (&str, &str, &str), pre: &str, size: u64| {
            for l in [
                format!("const unsigned long long {pre}row = {row};"),
                format!("const unsigned long long {pre}jp = {jp};"),
                format!("const unsigned long long {pre}c0 = (unsigned long long)({c}) * {size}ull;"),
                format!("const unsigned long long {pre}p = ds4_by * picks + {pre}jp;"),
                format!("const int {pre}pick = has_sel != 0ull ? ds4_sel[{pre}p] : 0;"),
                format!("const unsigned long long {pre}ex = {pre}pick >= 0 ? (unsigned long long){pre}pick : 0ull;"),
                format!("const unsigned long long {pre}src = ({pre}ex * n + {pre}row) * row_bytes + {pre}c0;"),
                format!("const unsigned int {pre}len = (unsigned int)(row_bytes - {pre}c0 < {size}ull ? row_bytes - {pre}c0 : {size}ull);"),
            ] {
                w(depth, &l);
            }
        };
        // The staged chunk's dot with x into `part`, then the pick's share into `acc`
        // (one row), or into `part[r]` and `acc[r]` (several rows, buffers `bufs`); the
        // buffers are rewritten only after every lane has read them.
        // 32-bit index math inside the staged chunk (`Lower::iw`).
        let walk = Walk { first: "lane", stride: "32u", elems: "cn", bytes_at: "0u", x_at: "ce0" };
        let chunk_dot = |w: &mut dyn FnMut(usize, &str), depth: usize, acc: &str, bufs: &[&'static str]| -> Result<(), QuantGenError> {
            for l in [
                x_offset("row"),
                // The chunk's elements: whole blocks, the first at element c0 / bb · be.
                format!("const unsigned long long ce0 = (c0 / {bb}ull) * {be}ull;"),
                format!("const unsigned int cn = (len / {bb}u) * {be}u;"),
            ] {
                w(depth, &l);
            }
            self.pick_dot(w, depth, Reads::Staged, &walk, bufs, acc)
        };
        if reads_in_place(self.spec.ggml) {
            self.direct_paths(&mut w)?;
        }
        // Rows not 16-byte aligned: the chunk byte by byte.
        let byte_copy = |dst: &str, src: &str| format!("for (unsigned int i = lane; i < len; i += 32u) {dst}[i] = ds4_w[{src} + i];");

        // The next job's bytes into registers (`pf`): the loads go out together, before
        // the current job's arithmetic.
        let fetch = |w: &mut dyn FnMut(usize, &str), depth: usize| {
            w(depth, "const uint4* __restrict__ s4 = (const uint4*)(ds4_w + f_src);");
            w(depth, &format!("#pragma unroll\n{}for (int q = 0; q < {pf}; q++) {{ const unsigned int i = lane + 32u * q; if (i < (f_len >> 4)) pf[q] = s4[i]; }}", "    ".repeat(depth)));
        };
        let store = |w: &mut dyn FnMut(usize, &str), depth: usize| {
            w(depth, &format!("#pragma unroll\n{}for (int q = 0; q < {pf}; q++) {{ const unsigned int i = lane + 32u * q; if (i < (len >> 4)) ((uint4*)ds4_stage_w)[i] = pf[q]; }}", "    ".repeat(depth)));
        };

        // Few rows (n · gridDim.y below SPLIT_BELOW), or row groups a warp's rows would
        // straddle (`block_rows`): a block per row, its warps sharing the row's chunks
        // (warp w takes jobs w, w + 4, .., the next one's bytes fetched before the current
        // one is computed), their sums added through shared memory. A warp per row would
        // leave most of the GPU idle (the hyper-connection and router mat-vecs have 24-256
        // rows of up to 32 KiB).
        let split = split_below(self.spec.ggml);
        w(1, &format!("if ((groups > 1ull && ng % {rows}ull != 0ull) || (n * gridDim.y < {split}ull && (n + {}ull) / {rows}ull * gridDim.y < {BLOCK_GROUPS_FROM}ull)) {{", rows - 1));
        w(2, &format!("const unsigned int n_chunks = (unsigned int)((row_bytes + {c}ull) / {chunk}ull);", c = chunk - 1));
        w(2, "const unsigned long long row_jobs = picks * n_chunks;");
        w(2, &format!("uint4 pf[{pf}];"));
        w(2, &format!("__shared__ float ds4_red4[{wa}][1];"));
        w(2, "for (unsigned long long srow = ds4_bx; srow < n; srow += row_blocks) {");
        w(3, "float sacc = 0.0f;");
        w(3, "if (vectors && warp < row_jobs) {");
        job(&mut w, 4, ("srow", "(unsigned int)warp / n_chunks", "(unsigned int)warp % n_chunks"), "f_", chunk);
        fetch(&mut w, 4);
        w(3, "}");
        w(3, &format!("for (unsigned int job = (unsigned int)warp; job < (unsigned int)row_jobs; job += {wa}u) {{"));
        job(&mut w, 4, ("srow", "job / n_chunks", "job % n_chunks"), "", chunk);
        w(4, "if (vectors) {");
        store(&mut w, 5);
        w(5, "__syncwarp();");
        w(5, &format!("if (job + {wa}u < (unsigned int)row_jobs) {{"));
        job(&mut w, 6, ("srow", &format!("(job + {wa}u) / n_chunks"), &format!("(job + {wa}u) % n_chunks")), "f_", chunk);
        fetch(&mut w, 6);
        w(5, "}");
        w(4, "} else {");
        w(5, &byte_copy("ds4_stage_w", "src"));
        w(5, "__syncwarp();");
        w(4, "}");
        chunk_dot(&mut w, 4, "sacc", &["ds4_stage_w"])?;
        w(3, "}");
        warps_total(&mut w, 3, "ds4_red4", 1, "sacc", "srow", &s.buffer("out"));
        w(2, "}");
        w(2, "return;");
        w(1, "}");

        // Otherwise groups of `rows` rows, x loaded once for all of a group's rows: a
        // job is one chunk of one pick of a group, its row chunks copied into one of two
        // stages with `cp.async` while the other stage is computed. Rows past n read row
        // n - 1 (a valid address) and are not stored.
        for l in [
            format!("const unsigned int n_chunks = (unsigned int)((row_bytes + {c}ull) / {rchunk}ull);", c = rchunk - 1),
            "const unsigned int row_jobs = (unsigned int)picks * n_chunks;".into(),
            format!("const unsigned long long n_groups = (n + {}ull) / {rows}ull;", rows - 1),
        ] {
            w(1, &l);
        }
        // Job `jj` of the group whose first row is `g0`, its row chunks into stage `st`.
        let issue = |w: &mut dyn FnMut(usize, &str), depth: usize, g0: &str, jj: &str, st: &str| {
            job(w, depth, (g0, &format!("({jj}) / n_chunks"), &format!("({jj}) % n_chunks")), "f_", rchunk);
            w(depth, &format!("for (unsigned int r = 0u; r < {rows}u; r++) {{"));
            w(depth + 1, "const unsigned long long rr = f_row + r < n ? f_row + r : n - 1ull;");
            w(depth + 1, "const unsigned char* const from = ds4_w + (f_src + (rr - f_row) * row_bytes);");
            w(depth + 1, &format!("unsigned char* const to = ds4_stage_w + (({st}) * {rows}u + r) * {rstride}u;"));
            w(depth + 1, "for (unsigned int i = lane; i < (f_len >> 4); i += 32u) ds4_cp16(to + 16u * i, from + 16u * i, 16u);");
            w(depth, "}");
        };
        // One job: (g0, jj) in stage `st`; the warp's next job (next_g0, next_jj) is
        // copied into the other stage, last read by the previous job, before this one is
        // computed into acc[r].
        let one_job = |w: &mut dyn FnMut(usize, &str), depth: usize| -> Result<(), QuantGenError> {
            job(w, depth, ("g0", "jj / n_chunks", "jj % n_chunks"), "", rchunk);
            for (r, b) in ROW_BUFS.iter().enumerate().take(rows as usize) {
                w(depth, &format!("unsigned char* const {b} = ds4_stage_w + (st * {rows}u + {r}u) * {rstride}u;"));
            }
            w(depth, "if (vectors) {");
            // This job's copies have landed (and every lane sees every lane's).
            w(depth + 1, "ds4_cp_wait();");
            w(depth + 1, "__syncwarp();");
            w(depth + 1, "if (has_next) {");
            issue(w, depth + 2, "next_g0", "next_jj", "st ^ 1u");
            w(depth + 1, "}");
            w(depth, "} else {");
            for (r, b) in ROW_BUFS.iter().enumerate().take(rows as usize) {
                w(depth + 1, &format!("{{ const unsigned long long rr = row + {r}ull < n ? row + {r}ull : n - 1ull; {} }}", byte_copy(b, "(src + (rr - row) * row_bytes)")));
            }
            w(depth + 1, "__syncwarp();");
            w(depth, "}");
            chunk_dot(w, depth, "acc", &ROW_BUFS[..rows as usize])?;
            w(depth, "st ^= 1u;");
            Ok(())
        };
        // The groups g_first, g_first + g_step, .. below n_groups, each of the warp's jobs
        // j_first, j_first + j_step, .. of a group (its next job may be the first of its
        // next group), then `after` with the group's sums in acc[r].
        let group_loop = |w: &mut dyn FnMut(usize, &str), (g_first, g_step): (&str, &str), (j_first, j_step): (&str, &str), after: &dyn Fn(&mut dyn FnMut(usize, &str))| -> Result<(), QuantGenError> {
            w(2, "unsigned int st = 0u;");
            w(2, &format!("if (vectors && {j_first} < row_jobs && {g_first} < n_groups) {{"));
            issue(w, 3, &format!("({g_first}) * {rows}ull"), j_first, "0u");
            w(2, "}");
            w(2, &format!("for (unsigned long long g = {g_first}; g < n_groups; g += {g_step}) {{"));
            w(3, &format!("const unsigned long long g0 = g * {rows}ull;"));
            w(3, &format!("float acc[{rows}] = {{{}}};", vec!["0.0f"; rows as usize].join(", ")));
            w(3, &format!("for (unsigned int jj = {j_first}; jj < row_jobs; jj += {j_step}) {{"));
            w(4, &format!("const bool in_group = jj + {j_step} < row_jobs;"));
            w(4, &format!("const unsigned long long next_g0 = in_group ? g0 : (g + {g_step}) * {rows}ull;"));
            w(4, &format!("const unsigned int next_jj = in_group ? jj + {j_step} : {j_first};"));
            w(4, &format!("const bool has_next = in_group || g + {g_step} < n_groups;"));
            one_job(w, 4)?;
            w(3, "}");
            after(w);
            w(2, "}");
            Ok(())
        };

        // Few rows in enough groups (`block_rows`): a block per group, warp w taking jobs
        // w, w + 4, .., the warps' sums added through shared memory.
        w(1, &format!("if (n * gridDim.y < {split}ull) {{"));
        w(2, &format!("__shared__ float ds4_redr[{wa}][{rows}];"));
        group_loop(&mut w, ("ds4_bx", "row_blocks"), ("(unsigned int)warp", &format!("{wa}u")), &|w| warps_total(w, 3, "ds4_redr", rows, "acc", "g0", &s.buffer("out")))?;
        w(2, "return;");
        w(1, "}");

        // Otherwise a warp per group: the warp's jobs (group by group, pick by pick, chunk
        // by chunk) in sequence, its lanes' sums stored by lane 0.
        w(1, "{");
        group_loop(&mut w, (&format!("ds4_bx * {wa}ull + warp"), &format!("row_blocks * {wa}ull")), ("0u", "1u"), &|w| warp_store(w, 3, rows, &s.buffer("out")))?;
        w(1, "}");
        Ok(o)
    }
}

impl Lower<'_> {
    /// Rows read in place (`reads_in_place`: Q8_0_R) when they are 16-byte aligned: every
    /// block starts at least 4-byte aligned, and the lanes read their runs' fields in
    /// place, in loads as wide as the fields' alignment allows (`Reads::Aligned`), with no
    /// staging. The same three paths as the staged kernel (`block_rows`), each lane
    /// walking runs `first`, `first + stride`, .. of whole rows. Measured on the H200 with
    /// a standalone kernel (µs, Q8_0 staged → regrouped in place, 8-byte loads): the output
    /// head 223 → 138; in `ds4 bench --matvec` (Q8_0 → Q8_0_R): the head 231 → 163,
    /// `attn_q_b` 22.1 → 16.3, `attn_output_b` 27.9 → 17.9.
    fn direct_paths(&self, w: &mut dyn FnMut(usize, &str)) -> Result<(), QuantGenError> {
        let bb = self.spec.block_bytes as u64;
        let rows = rows_per_warp(bb);
        let wa = MATVEC_WARPS;
        // Every pick of the rows from `row` (`n_rows` of them, the last ones clamped to row
        // n - 1, a valid address) into `acc` (an array for more than one row).
        let picks = |w: &mut dyn FnMut(usize, &str), depth: usize, row: &str, n_rows: u64, (first, stride): (&str, &str), acc: &str| -> Result<(), QuantGenError> {
            w(depth, "for (unsigned long long jp = 0ull; jp < picks; jp++) {");
            for l in [
                "const unsigned long long p = ds4_by * picks + jp;".to_string(),
                "const int pick = has_sel != 0ull ? ds4_sel[p] : 0;".into(),
                "const unsigned long long ex = pick >= 0 ? (unsigned long long)pick : 0ull;".into(),
                x_offset(&format!("({row})")),
            ] {
                w(depth + 1, &l);
            }
            for (r, b) in ROW_PTRS.iter().enumerate().take(n_rows as usize) {
                w(depth + 1, &format!("const unsigned char* const {b} = ds4_w + (ex * n + ({row} + {r}ull < n ? {row} + {r}ull : n - 1ull)) * row_bytes;"));
            }
            let walk = Walk { first, stride, elems: "k", bytes_at: "0u", x_at: "" };
            self.pick_dot(w, depth + 1, Reads::Aligned, &walk, &ROW_PTRS[..n_rows as usize], acc)?;
            w(depth, "}");
            Ok(())
        };
        let block_lanes = ("lane + 32u * (unsigned int)warp", "32u * 4u");
        debug_assert_eq!(wa, 4);
        w(1, "if (vectors) {");
        w(2, &format!("const unsigned long long n_groups = (n + {}ull) / {rows}ull;", rows - 1));
        // A block per row: its warps' lanes share the row.
        let split = split_below(self.spec.ggml);
        w(2, &format!("if ((groups > 1ull && ng % {rows}ull != 0ull) || (n * gridDim.y < {split}ull && n_groups * gridDim.y < {BLOCK_GROUPS_FROM}ull)) {{"));
        w(3, &format!("__shared__ float ds4_red1[{wa}][1];"));
        w(3, "for (unsigned long long srow = ds4_bx; srow < n; srow += row_blocks) {");
        w(4, "float sacc = 0.0f;");
        picks(w, 4, "srow", 1, block_lanes, "sacc")?;
        warps_total(w, 4, "ds4_red1", 1, "sacc", "srow", &self.syn.buffer("out"));
        w(3, "}");
        w(3, "return;");
        w(2, "}");
        // Few rows in enough groups: a block per group.
        w(2, &format!("if (n * gridDim.y < {split}ull) {{"));
        w(3, &format!("__shared__ float ds4_redg[{wa}][{rows}];"));
        w(3, "for (unsigned long long g = ds4_bx; g < n_groups; g += row_blocks) {");
        w(4, &format!("const unsigned long long g0 = g * {rows}ull;"));
        w(4, &format!("float acc[{rows}] = {{{}}};", vec!["0.0f"; rows as usize].join(", ")));
        picks(w, 4, "g0", rows, block_lanes, "acc")?;
        warps_total(w, 4, "ds4_redg", rows, "acc", "g0", &self.syn.buffer("out"));
        w(3, "}");
        w(3, "return;");
        w(2, "}");
        // Otherwise a warp per group.
        w(2, &format!("for (unsigned long long g = ds4_bx * {wa}ull + warp; g < n_groups; g += row_blocks * {wa}ull) {{"));
        w(3, &format!("const unsigned long long g0 = g * {rows}ull;"));
        w(3, &format!("float acc[{rows}] = {{{}}};", vec!["0.0f"; rows as usize].join(", ")));
        picks(w, 3, "g0", rows, ("lane", "32u"), "acc")?;
        warp_store(w, 3, rows, &self.syn.buffer("out"));
        w(2, "}");
        w(2, "return;");
        w(1, "}");
        Ok(())
    }
}

/// `xo`, the offset of the x row that pick `p` of row `row` (an expression) reads, with
/// 32-bit divisions (a 64-bit one is a long software routine).
fn x_offset(row: &str) -> String {
    format!("const unsigned long long xo = ((unsigned long long)((unsigned int)p / (unsigned int)x_div) * groups + (unsigned int){row} / (unsigned int)ng) * k;")
}

impl Lower<'_> {
    /// One pick's dot of the rows in `bufs` (read as `reads` says) with x, walked as
    /// `walk` says, into `part` (one row) or `part[r]`, then the pick's weighted share
    /// into `acc` / `acc[r]`. Staged buffers are rewritten only after every lane has read
    /// them (the `__syncwarp`).
    fn pick_dot(&self, w: &mut dyn FnMut(usize, &str), depth: usize, reads: Reads, walk: &Walk, bufs: &[&'static str], acc: &str) -> Result<(), QuantGenError> {
        let n_rows = bufs.len();
        if n_rows == 1 {
            w(depth, "float part = 0.0f;");
        } else {
            w(depth, &format!("float part[{n_rows}] = {{{}}};", vec!["0.0f"; n_rows].join(", ")));
        }
        w(depth, &format!("#pragma unroll {RUN_UNROLL}"));
        let lower = Lower { reads, dot: true, ..*self };
        for (d, l) in lower.rows_runs(walk, &[Token { xo: "xo".into(), acc: "part".into() }], bufs)? {
            w(depth + d, &l);
        }
        if reads == Reads::Staged {
            w(depth, "__syncwarp();");
        }
        w(depth, "const float pw = has_wts != 0ull ? ds4_wts[p] : 1.0f;");
        if n_rows == 1 {
            w(depth, &format!("if (pick >= 0) {{ {acc} = {acc} + pw * part; }}"));
        } else {
            w(depth, &format!("if (pick >= 0) {{ for (int r = 0; r < {n_rows}; r++) {acc}[r] = {acc}[r] + pw * part[r]; }}"));
        }
        Ok(())
    }
}

/// The block's warps' sums for `rows` rows (`acc`, an array for more than one) added
/// through shared memory `red` ([warps][rows]); thread r stores row `first` + r into
/// `out`. Every warp of the block reaches it.
pub(super) fn warps_total(w: &mut dyn FnMut(usize, &str), depth: usize, red: &str, rows: u64, acc: &str, first: &str, out: &str) {
    let at = |r: &str| if rows == 1 { acc.to_string() } else { format!("{acc}[{r}]") };
    w(depth, &format!("for (unsigned int r = 0u; r < {rows}u; r++) {{"));
    w(depth + 1, &format!("float v = {};", at("r")));
    w(depth + 1, "for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);");
    w(depth + 1, &format!("if (lane == 0u) {red}[warp][r] = v;"));
    w(depth, "}");
    w(depth, "__syncthreads();");
    w(depth, &format!("if (ds4_tid < {rows}ull && {first} + ds4_tid < n) {{ {out}[ds4_by * n + {first} + ds4_tid] = {}; }}", warps_sum(red, "ds4_tid")));
    w(depth, "__syncthreads();");
}

/// Row `r`'s total from the warps' sums in `red`, added in warp order.
pub(super) fn warps_sum(red: &str, r: &str) -> String {
    (0..MATVEC_WARPS).map(|i| format!("{red}[{i}][{r}]")).collect::<Vec<_>>().join(" + ")
}

/// A warp's sums `acc[r]` of rows `g0 + r` (the `rows` of its group) over its lanes, stored
/// into `out` by lane 0.
fn warp_store(w: &mut dyn FnMut(usize, &str), depth: usize, rows: u64, out: &str) {
    w(depth, &format!("for (unsigned int r = 0u; r < {rows}u; r++) {{"));
    w(depth + 1, "float v = acc[r];");
    w(depth + 1, "for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);");
    w(depth + 1, &format!("if (lane == 0u && g0 + r < n) {{ {out}[ds4_by * n + g0 + r] = v; }}"));
    w(depth, "}");
}

/// Whether rows of `ty` are read in place (the direct path): the device layouts, made
/// for it (Q8_0_R: 4-byte aligned blocks in 16-byte aligned rows, a run's quants two
/// aligned words). The GGUF types keep staging: Q2_K's 84-byte blocks are 4-byte aligned
/// too, but its routed experts measured 31.2 µs staged and 38.9 read in place; F16 in
/// place (a 16-bit load per element) 8.2 → 11.1 µs on the hyper-connection projections,
/// 13.3 → 17.3 on the indexer's `q_b` (H200, `ds4 bench --matvec`).
pub fn reads_in_place(ty: GgmlType) -> bool {
    ty.is_device_layout()
}

/// Names of the rows read in place: the direct path's (up to [`MAX_ROWS_PER_WARP`]) and the
/// dense kernel's (up to its short form's sixteen).
pub(super) const ROW_PTRS: [&str; 16] = [
    "ds4_wd0", "ds4_wd1", "ds4_wd2", "ds4_wd3", "ds4_wd4", "ds4_wd5", "ds4_wd6", "ds4_wd7", "ds4_wd8", "ds4_wd9", "ds4_wd10", "ds4_wd11", "ds4_wd12", "ds4_wd13", "ds4_wd14", "ds4_wd15",
];
const _: () = assert!(MAX_ROWS_PER_WARP as usize <= ROW_PTRS.len());

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

    /// The direct path of Q8_0_R reads a run's quants as aligned words and its scale as
    /// one 16-bit load, never through a funnel shift (whose second word may lie past the
    /// last block of the weights).
    #[test]
    fn q8_0_r_rows_are_read_in_place_with_aligned_loads() {
        let spec = ds4_ir::quant::spec(GgmlType::Q8_0R).unwrap();
        let k = crate::quant::quant_kernel(spec, crate::quant::QuantKernelKind::MatVec, crate::Target::CudaSm90).unwrap();
        let direct = &k.source[k.source.find("if (vectors) {").unwrap()..];
        let direct = &direct[..direct.find("return;\n    }").unwrap()];
        assert!(!direct.contains("__funnelshift_r"), "{direct}");
        assert!(direct.contains("*(const unsigned int*)(ds4_wd0 + ds4_ra0 + 0u)"), "{direct}");
        assert!(direct.contains("*(const unsigned short*)(ds4_wd0 + ds4_blk + 0u + ((unsigned int)s) * 2u)"), "{direct}");
        assert!(reads_in_place(GgmlType::Q8_0R) && !reads_in_place(GgmlType::Q8_0) && !reads_in_place(GgmlType::Q2K));
    }

    #[test]
    fn row_groups_fit_the_shared_memory() {
        for bb in [2u64, 4, 34, 66, 84, 144, 210, 17] {
            let (c, r) = (row_chunk_bytes(bb), rows_per_warp(bb));
            assert_eq!(c % bb, 0, "{bb}");
            assert_eq!(c % 16, 0, "{bb}");
            assert!(MATVEC_WARPS * 2 * r * (c + crate::quant::WORDS_PAD) <= ROW_STAGES_LIMIT || r == 1, "{bb}");
            assert!(warp_stage_bytes(bb) * MATVEC_WARPS <= 48 * 1024, "{bb}");
        }
        assert_eq!(rows_per_warp(34), 4);
        // Q6_K's 1680-byte unit: two rows a warp.
        assert_eq!(rows_per_warp(210), 2);
        // A grouped mat-vec whose groups a warp's rows straddle takes the few-rows path.
        use ds4_ir::GgmlType::{Q8_0, Q8_0R};
        assert_eq!(block_rows(Q8_0, 8192, 1, 8, 1024), MATVEC_WARPS * 4);
        assert_eq!(block_rows(Q8_0, 8190, 1, 3, 2730), 1);
        // Few rows: a block per group of four, or per row when the groups are too few.
        assert_eq!(block_rows(Q8_0, 1024, 1, 1, 1024), 4);
        assert_eq!(block_rows(Q8_0, 512, 1, 1, 512), 1);
        // Read in place: a block per group of four up to 16384 rows.
        assert_eq!(block_rows(Q8_0R, 4096, 1, 1, 4096), 4);
        assert_eq!(block_rows(Q8_0R, 16384, 1, 1, 16384), MATVEC_WARPS * 4);
    }
}
