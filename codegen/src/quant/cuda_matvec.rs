//! `matvec_<type>` on CUDA: a warp per weight row, the row staged in shared memory.
//!
//! Same contract as the generic mat-vec (`QuantKernelKind::MatVec`); what differs is how
//! the bytes travel. A decode step is bandwidth-bound, and the generic kernel reads each
//! element's bytes with a one-byte load from global memory and sums every row over the
//! whole block (two barriers a row): on the H200 that reached 15-20% of the copy
//! bandwidth. Here each warp:
//! 1. copies a chunk of its row (whole blocks, at most [`chunk_bytes`]) into its own
//!    shared-memory buffer with 16-byte loads (byte loads where the chunk is not 16-byte
//!    aligned: odd shapes of the tiny test models), so that many wide loads are in flight;
//! 2. walks the chunk with the same factored runs as every other dot product
//!    (`Lower::weight_runs`), the declaration's fields read from the staged copy;
//! 3. sums its lanes with shuffles: no block barrier per row.
//!
//! Blocks hold [`MATVEC_WARPS`] warps; warp w of block b takes rows b·WARPS + w,
//! + row_blocks·WARPS, .. (any `row_blocks ≥ 1` covers every row).

use super::runs::{Token, Walk};
use super::{Lower, QuantGenError};
use std::fmt::Write;

/// Warps (rows at a time) per block.
pub const MATVEC_WARPS: u64 = 4;

/// Bytes a warp stages at a time: the largest multiple of both the block size and 16
/// (whole blocks, whole 16-byte vectors) that fits in 4 KiB; at least one block.
pub fn chunk_bytes(block_bytes: u64) -> u64 {
    let unit = lcm(block_bytes, 16);
    (4096 / unit).max(1) * unit
}

fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

impl Lower<'_> {
    /// The kernel body after `kernel_open` (and the tables' staging); the walk reads
    /// the fields through `ds4_stage_w` (see `Lower::wbuf`).
    pub(super) fn staged_matvec_body(&self) -> Result<String, QuantGenError> {
        let s = self.syn;
        let (bb, be) = (self.spec.block_bytes as u64, self.spec.block_elems as u64);
        let chunk = chunk_bytes(bb);
        let mut o = String::new();
        let mut w = |depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        w(1, &format!("__shared__ __align__(16) unsigned char ds4_stage[{MATVEC_WARPS}][{chunk}];"));
        for l in [
            "const unsigned int lane = (unsigned int)(ds4_tid & 31ull);",
            "const unsigned long long warp = ds4_tid >> 5;",
            "unsigned char* const ds4_stage_w = ds4_stage[warp];",
            // Whether the weight buffer itself starts 16-byte aligned (device allocations
            // are; a sub-buffer view might not be).
            "const bool base_aligned = (((unsigned long long)ds4_w) & 15ull) == 0ull;",
        ] {
            w(1, l);
        }
        w(1, &format!("for (unsigned long long row = ds4_bx * {MATVEC_WARPS}ull + warp; row < n; row += row_blocks * {MATVEC_WARPS}ull) {{"));
        for l in [
            "float acc = 0.0f;",
            "for (unsigned long long jp = 0ull; jp < picks; jp += 1ull) {",
            "    const unsigned long long p = ds4_by * picks + jp;",
            "    const unsigned long long ex = has_sel != 0ull ? (unsigned long long)ds4_sel[p] : 0ull;",
            "    const float sc = has_wts != 0ull ? ds4_wts[p] : 1.0f;",
            "    const unsigned long long row_base = (ex * n + row) * row_bytes;",
            // 32-bit divisions (a 64-bit one is a long software routine, here per row).
            "    const unsigned long long xo = ((unsigned long long)((unsigned int)p / (unsigned int)x_div) * groups + (unsigned int)row / (unsigned int)ng) * k;",
            "    float part = 0.0f;",
        ] {
            w(2, l);
        }
        w(3, &format!("for (unsigned long long c0 = 0ull; c0 < row_bytes; c0 += {chunk}ull) {{"));
        for l in [
            &format!("const unsigned long long len = row_bytes - c0 < {chunk}ull ? row_bytes - c0 : {chunk}ull;"),
            "const unsigned long long src = row_base + c0;",
            "if (base_aligned && ((src | len) & 15ull) == 0ull) {",
            "    const uint4* __restrict__ s4 = (const uint4*)(ds4_w + src);",
            "    uint4* d4 = (uint4*)ds4_stage_w;",
            "    #pragma unroll 4",
            "    for (unsigned int i = lane; i < (unsigned int)(len >> 4); i += 32u) d4[i] = s4[i];",
            "} else {",
            "    for (unsigned int i = lane; i < (unsigned int)len; i += 32u) ds4_stage_w[i] = ds4_w[src + i];",
            "}",
            "__syncwarp();",
            // The chunk's elements: whole blocks, the first at element c0 / bb · be.
            &format!("const unsigned long long ce0 = (c0 / {bb}ull) * {be}ull;"),
            &format!("const unsigned long long cn = (len / {bb}ull) * {be}ull;"),
        ] {
            w(4, l);
        }
        let walk = Walk { first: "(unsigned long long)lane", stride: "32ull", elems: "cn", bytes_at: "0ull", x_at: "ce0" };
        let staged = Lower { wbuf: "ds4_stage_w", ..*self };
        for (d, l) in staged.weight_runs(&walk, &[Token { xo: "xo".into(), acc: "part".into() }])? {
            w(4 + d, &l);
        }
        // The next chunk overwrites the buffer only after every lane has read this one.
        w(4, "__syncwarp();");
        w(3, "}");
        w(3, "acc = acc + sc * part;");
        w(2, "}");
        w(2, "for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);");
        w(2, &format!("if (lane == 0u) {{ {}[ds4_by * n + row] = acc; }}", s.buffer("out")));
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
            assert!(c <= 4096 || c == lcm(bb, 16), "{bb}: {c}");
        }
        assert_eq!(chunk_bytes(34), 4080);
        assert_eq!(chunk_bytes(2), 4096);
    }
}
