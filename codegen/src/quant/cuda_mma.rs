//! `matmul_mma_<type>`: the prefill matmul on tensor cores (CUDA, sm_80 and later).
//!
//! Same contract as the SIMT `matmul_<type>` (see `QuantKernelKind::MatMul`), with tiles
//! of [`MMA_ROWS`] weight rows × [`MMA_TOKENS`] tokens per block of 4 warps. Each step of
//! `KS` (64) columns, the block stages its 64 × 64 weight tile and the tokens' 64 × 64 x
//! tile in shared memory, then each warp multiplies its 32 × 32 quarter with
//! `mma.sync.m16n8k8` on TF32. TF32 keeps 11 significant bits, so x is split in two TF32
//! numbers (`big = tf32(v)`, `small = tf32(v − big)`, 21 of f32's 24 bits) as each warp
//! reads its fragments (splitting when staging would double the x tile's shared memory,
//! and the kernel is latency-bound: fewer resident blocks cost more than the splits, as
//! measured on the H200). The weights come in one of two forms:
//!
//! - **factored** (most quant types): the declaration's value is `scale · e + offset`
//!   (see `runs::Factored`) where the element factor `e` needs at most 11 bits (a narrow
//!   integer, a grid magnitude times a sign, an f16): exact in TF32. The tile holds `e`,
//!   and per row and sub-block the scale and offset; the tensor cores sum `e · big +
//!   e · small` over each sub-block, and the sub-block's total is scaled and offset
//!   (`scale · Σ e·x + offset · Σ x`, the reassociation every dot product here uses). Two
//!   MMAs per product.
//! - **split** (the rest, e.g. F32): the de-quantized value (the declaration's expression
//!   through `Lower::value_runs`, bit for bit) is split like x, and three products are
//!   accumulated: `big·big + big·small + small·big` (the dropped `small·small` is below
//!   2^-22 of the product).
//!
//! Either way the result matches an f32 dot product to about f32 rounding, which is what
//! the kernel parity test holds it to (the same bound as the SIMT kernel).
//!
//! A tile must not straddle two row groups of a grouped matmul: the runtime uses this
//! kernel when `groups == 1` or `ng` is a multiple of [`MMA_ROWS`], the SIMT one otherwise.

use super::{Lower, QuantGenError};
use std::fmt::Write;

/// Weight rows per block.
pub const MMA_ROWS: u64 = 64;
/// Tokens per block (and rows per expert group when the rows are listed).
pub const MMA_TOKENS: u64 = 64;
/// Shared memory, at most: the weight and x tiles (64 × 36 words each, padded against bank
/// conflicts), per row and sub-block a scale and an offset, per token and 8 columns a sum
/// of x, and the tokens' x offsets and output rows.
pub const MMA_SHARED_BYTES: u32 = 2 * 64 * KS as u32 * 4 + 2 * 64 * 8 * 4 + 64 * 8 * 4 + 64 * 8 + 64 * 8;

/// Columns per step: each thread de-quantizes KS / 2 weights and stages KS / 2 x values
/// per step, so that more loads are in flight per barrier.
const KS: u64 = 64;

/// Helpers placed before the kernel: the tiles' layouts, the TF32 split and one MMA.
///
/// The tiles are stored in the order the MMA reads them, so that a lane loads its whole
/// fragment at once (one 16-byte load for A, one 8-byte load for B) instead of one word
/// at a time: the kernel is limited by its shared-memory and load instructions (Nsight
/// Compute on the H200: 94% of the memory pipes busy, tensor cores at a third).
const MMA_HELPERS: &str = r#"// Element (row r, column c) of the 64 × KS weight tile: per 16 rows and 8 columns, lane
// (r % 8) · 4 + c % 4 holds its four A-fragment values (rows g, g + 8 × columns t4, t4 + 4)
// side by side.
__device__ __forceinline__ unsigned int ds4_a_at(const unsigned int r, const unsigned int c) {
    return ((((r >> 4) * (KS / 8u) + (c >> 3)) * 32u + (r & 7u) * 4u + (c & 3u)) * 4u) + ((r >> 3) & 1u) + ((c >> 2) & 1u) * 2u;
}

// Token t, column c of the x tile: per 8 tokens and 8 columns, lane (t % 8) · 4 + c % 4
// holds its two B-fragment values (columns t4, t4 + 4) side by side.
__device__ __forceinline__ unsigned int ds4_b_at(const unsigned int t, const unsigned int c) {
    return (((t >> 3) * (KS / 8u) + (c >> 3)) * 32u + (t & 7u) * 4u + (c & 3u)) * 2u + ((c >> 2) & 1u);
}

// v = big + small, both TF32 (round to nearest): 21 of f32's 24 bits survive.
__device__ __forceinline__ void ds4_split_tf32(const float v, unsigned int& big, unsigned int& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(v));
    const float rest = v - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
}

// c (16 × 8, f32) += a (16 × 8, TF32, row-major) · b (8 × 8, TF32, column-major).
__device__ __forceinline__ void ds4_mma_tf32(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

"#;

/// How the weight tile is held (see the module comment).
enum Form {
    /// `groups` scale groups of `len` columns per step of 32 (1 × 32 without a scale);
    /// `scaled`: a scale other than 1; `offset`: an offset term.
    Factored { groups: u64, len: u64, scaled: bool, offset: bool },
    Split,
}

impl Lower<'_> {
    /// The helpers and the body of `matmul_mma_<type>` (after `kernel_open`).
    pub(super) fn mma_helpers(&self) -> String {
        MMA_HELPERS.replace("KS", &format!("{KS}"))
    }

    /// The factored form, or for one-element blocks (F16, ...) the value itself as the
    /// element factor.
    fn mma_factors(&self) -> super::runs::Factored<'static> {
        self.factored().unwrap_or(super::runs::Factored { scale: Vec::new(), elem: vec![self.spec.value], offset: None })
    }

    fn mma_form(&self) -> Form {
        let f = self.mma_factors();
        if self.elem_bits(&f) > 11 {
            return Form::Split;
        }
        let (scaled, offset) = (!f.scale.is_empty(), f.offset.is_some());
        if !scaled && !offset {
            return Form::Factored { groups: 1, len: KS, scaled, offset };
        }
        // A scale group must be whole MMA steps (8 columns) inside a step, and a thread's
        // KS / 2 columns whole runs of the in-sub-block walk.
        let sb = self.spec.sub_block as u64;
        let runs_fit = self.sub_run().is_some_and(|r| (KS / 2) % r == 0);
        if sb < 8 || !(KS % sb == 0 || sb % KS == 0) || !runs_fit {
            return Form::Split;
        }
        let len = sb.min(KS);
        Form::Factored { groups: KS / len, len, scaled, offset }
    }

    pub(super) fn mma_body(&self) -> Result<String, QuantGenError> {
        let form = self.mma_form();
        let mut o = String::new();
        let w = |o: &mut String, depth: usize, text: &str| {
            let _ = writeln!(o, "{}{text}", "    ".repeat(depth));
        };
        let g_count = match form {
            Form::Factored { groups, .. } => groups,
            Form::Split => 1,
        };
        // Tile bookkeeping: which tokens (x offsets, output rows) this block serves.
        for l in [
            &format!("__shared__ __align__(16) unsigned int ws[64 * {KS}];"),
            &format!("__shared__ __align__(16) float xs[64 * {KS}];"),
            &format!("__shared__ float scs[64 * {g_count}];"),
            &format!("__shared__ float ofs[64 * {g_count}];"),
            &format!("__shared__ float xs8[64 * {}];", KS / 8),
            "__shared__ unsigned long long xrow[64];",
            "__shared__ long long prow[64];",
            "const unsigned int lane = (unsigned int)(ds4_tid & 31ull);",
            "const unsigned int warp = (unsigned int)(ds4_tid >> 5);",
            "const unsigned int g = lane >> 2;",
            "const unsigned int t4 = lane & 3u;",
            "const unsigned int wm = warp >> 1;",
            "const unsigned int wn = warp & 1u;",
            "const unsigned long long r0 = ds4_bx * 64ull;",
            "const unsigned long long ex = has_idx != 0ull ? (unsigned long long)ds4_gexp[ds4_by] : 0ull;",
            "const unsigned long long xg = r0 / ng;",
            "if (ds4_tid < 64ull) {",
            "    long long p;",
            "    if (has_idx != 0ull) {",
            "        p = (long long)ds4_idx[ds4_by * 64ull + ds4_tid];",
            "    } else {",
            "        const unsigned long long tt = ds4_by * 64ull + ds4_tid;",
            "        p = tt < m ? (long long)tt : -1ll;",
            "    }",
            "    prow[ds4_tid] = p;",
            "    xrow[ds4_tid] = p >= 0 ? (((unsigned long long)p / x_div) * groups + xg) * k : 0ull;",
            "}",
            "__syncthreads();",
            "float c[2][4][4];",
            "for (int i = 0; i < 2; i++) for (int j = 0; j < 4; j++) for (int q = 0; q < 4; q++) c[i][j][q] = 0.0f;",
            // Each thread stages 16 weights of one row and 16 x values of one token per step.
            "const unsigned long long trow = ds4_tid >> 1;",
            &format!("const unsigned long long half = (ds4_tid & 1ull) * {}ull;", KS / 2),
            "const unsigned long long wrow = r0 + trow;",
            "const unsigned long long row_base = (ex * n + (wrow < n ? wrow : 0ull)) * row_bytes;",
            "const bool tok_ok = prow[trow] >= 0;",
            "const unsigned long long tok_x = xrow[trow];",
            &format!("for (unsigned long long k0 = 0ull; k0 < k; k0 += {KS}ull) {{"),
        ] {
            w(&mut o, 1, l);
        }
        w(&mut o, 2, "const unsigned long long e0 = k0 + half;");
        w(&mut o, 2, "const unsigned int wr = (unsigned int)trow, wc = (unsigned int)half;");
        w(&mut o, 2, "if (wrow < n) {");
        match form {
            Form::Factored { groups, len, .. } => {
                let f = self.mma_factors();
                let store = |i: u64, v: &str| format!("ws[ds4_a_at(wr, wc + {i}u)] = __float_as_uint({v});");
                // The run starting at column `half + i` of the step is in scale group
                // (half + i) / len.
                let scale = |i: u64, sc: &str, of: Option<&str>| {
                    let at = format!("trow * {groups}ull + (half + {i}ull) / {len}ull");
                    let mut t = format!("scs[{at}] = {sc};");
                    if let Some(of) = of {
                        t.push_str(&format!(" ofs[{at}] = {of};"));
                    }
                    t
                };
                for (d, l) in self.factored_runs(&f, KS / 2, &store, &scale)? {
                    w(&mut o, 3 + d, &l);
                }
            }
            Form::Split => {
                let store = |i: u64, v: &str| format!("ws[ds4_a_at(wr, wc + {i}u)] = __float_as_uint({v});");
                for (d, l) in self.value_runs(KS / 2, &store)? {
                    w(&mut o, 3 + d, &l);
                }
            }
        }
        w(&mut o, 2, "} else {");
        w(&mut o, 3, &format!("for (unsigned int i = 0u; i < {}u; i++) ws[ds4_a_at(wr, wc + i)] = 0u;", KS / 2));
        // Rows past n: zero scales and offsets too (0 · e, never 0 · garbage).
        w(&mut o, 3, &format!("for (int i = 0; i < {g_count}; i++) {{ scs[trow * {g_count}ull + i] = 0.0f; ofs[trow * {g_count}ull + i] = 0.0f; }}"));
        w(&mut o, 2, "}");
        let hk = KS / 2;
        for l in [
            // x, and its sums per 8 columns (the offsets' Σ x).
            format!("float xv[{hk}];"),
            format!("if (tok_ok && e0 + {hk}ull <= k && (k & 3ull) == 0ull) {{"),
            "    const float4* src = (const float4*)(&ds4_x[tok_x + e0]);".into(),
            format!("    for (int q = 0; q < {}; q++) {{", hk / 4),
            "        const float4 v = src[q];".into(),
            "        xv[4 * q] = v.x; xv[4 * q + 1] = v.y; xv[4 * q + 2] = v.z; xv[4 * q + 3] = v.w;".into(),
            "    }".into(),
            "} else {".into(),
            format!("    for (unsigned long long i = 0ull; i < {hk}ull; i++) xv[i] = (tok_ok && e0 + i < k) ? ds4_x[tok_x + e0 + i] : 0.0f;"),
            "}".into(),
            format!("for (unsigned int i = 0u; i < {hk}u; i++) xs[ds4_b_at(wr, wc + i)] = xv[i];"),
            format!("for (int h = 0; h < {}; h++) {{", hk / 8),
            "    float sx = 0.0f;".into(),
            "    for (int i = 0; i < 8; i++) sx += xv[8 * h + i];".into(),
            format!("    xs8[trow * {}ull + half / 8ull + h] = sx;", KS / 8),
            "}".into(),
            "__syncthreads();".into(),
        ] {
            w(&mut o, 2, &l);
        }
        match form {
            Form::Factored { groups, len, scaled, offset } => {
                let direct = !scaled && !offset;
                for gi in 0..groups {
                    w(&mut o, 2, "{");
                    let acc = if direct { "c" } else { "t" };
                    if !direct {
                        w(&mut o, 3, "float t[2][4][4];");
                        w(&mut o, 3, "for (int i = 0; i < 2; i++) for (int j = 0; j < 4; j++) for (int q = 0; q < 4; q++) t[i][j][q] = 0.0f;");
                    }
                    for l in [
                        &format!("for (int kk = {}; kk < {}; kk += 8) {{", gi * len, (gi + 1) * len),
                        "    unsigned int a[2][4], bb[4][2], bs[4][2];",
                        "    for (int i = 0; i < 2; i++) {",
                        &format!("        const uint4 av = *(const uint4*)&ws[(((wm * 2u + i) * {}u + kk / 8) * 32u + lane) * 4u];", KS / 8),
                        "        a[i][0] = av.x; a[i][1] = av.y; a[i][2] = av.z; a[i][3] = av.w;",
                        "    }",
                        "    for (int j = 0; j < 4; j++) {",
                        &format!("        const float2 bv = *(const float2*)&xs[(((wn * 4u + j) * {}u + kk / 8) * 32u + lane) * 2u];", KS / 8),
                        "        ds4_split_tf32(bv.x, bb[j][0], bs[j][0]);",
                        "        ds4_split_tf32(bv.y, bb[j][1], bs[j][1]);",
                        "    }",
                        "    for (int i = 0; i < 2; i++) {",
                        "        for (int j = 0; j < 4; j++) {",
                        &format!("            ds4_mma_tf32({acc}[i][j], a[i], bs[j]);"),
                        &format!("            ds4_mma_tf32({acc}[i][j], a[i], bb[j]);"),
                        "        }",
                        "    }",
                        "}",
                    ] {
                        w(&mut o, 3, l);
                    }
                    if !direct {
                        // c += scale(row) · t (+ offset(row) · Σ x(token) over the group).
                        let xsum: Vec<String> = (gi * len / 8..(gi + 1) * len / 8).map(|c| format!("xs8[tt * {}u + {c}u]", KS / 8)).collect();
                        for l in [
                            "for (int i = 0; i < 2; i++) {",
                            "    for (int j = 0; j < 4; j++) {",
                            "        for (int q = 0; q < 4; q++) {",
                            &format!("            const unsigned int rr = (wm * 32u + i * 16u + g + (q >> 1) * 8u) * {groups}u + {gi}u;"),
                        ] {
                            w(&mut o, 3, l);
                        }
                        if scaled {
                            w(&mut o, 6, "c[i][j][q] = fmaf(scs[rr], t[i][j][q], c[i][j][q]);");
                        } else {
                            w(&mut o, 6, "c[i][j][q] += t[i][j][q];");
                        }
                        if offset {
                            w(&mut o, 6, "const unsigned int tt = wn * 32u + j * 8u + 2u * t4 + (q & 1);");
                            w(&mut o, 6, &format!("c[i][j][q] = fmaf(ofs[rr], {}, c[i][j][q]);", xsum.join(" + ")));
                        }
                        for l in ["        }", "    }", "}"] {
                            w(&mut o, 3, l);
                        }
                    }
                    w(&mut o, 2, "}");
                }
            }
            Form::Split => {
                for l in [
                    &format!("for (int kk = 0; kk < {KS}; kk += 8) {{"),
                    "    unsigned int ab[2][4], as_[2][4], bb[4][2], bs[4][2];",
                    "    for (int i = 0; i < 2; i++) {",
                    &format!("        const float4 av = *(const float4*)&ws[(((wm * 2u + i) * {}u + kk / 8) * 32u + lane) * 4u];", KS / 8),
                    "        ds4_split_tf32(av.x, ab[i][0], as_[i][0]);",
                    "        ds4_split_tf32(av.y, ab[i][1], as_[i][1]);",
                    "        ds4_split_tf32(av.z, ab[i][2], as_[i][2]);",
                    "        ds4_split_tf32(av.w, ab[i][3], as_[i][3]);",
                    "    }",
                    "    for (int j = 0; j < 4; j++) {",
                    &format!("        const float2 bv = *(const float2*)&xs[(((wn * 4u + j) * {}u + kk / 8) * 32u + lane) * 2u];", KS / 8),
                    "        ds4_split_tf32(bv.x, bb[j][0], bs[j][0]);",
                    "        ds4_split_tf32(bv.y, bb[j][1], bs[j][1]);",
                    "    }",
                    "    for (int i = 0; i < 2; i++) {",
                    "        for (int j = 0; j < 4; j++) {",
                    "            ds4_mma_tf32(c[i][j], as_[i], bb[j]);",
                    "            ds4_mma_tf32(c[i][j], ab[i], bs[j]);",
                    "            ds4_mma_tf32(c[i][j], ab[i], bb[j]);",
                    "        }",
                    "    }",
                    "}",
                ] {
                    w(&mut o, 2, l);
                }
            }
        }
        w(&mut o, 2, "__syncthreads();");
        w(&mut o, 1, "}");
        // c[i][j][q]: row g (+8 for q ≥ 2) of the warp's i-th 16 rows, token 2·t4 (+1 for
        // odd q) of its j-th 8 tokens.
        for l in [
            "for (int i = 0; i < 2; i++) {",
            "    for (int j = 0; j < 4; j++) {",
            "        for (int q = 0; q < 4; q++) {",
            "            const unsigned long long row = r0 + wm * 32u + i * 16u + g + (q >> 1) * 8u;",
            "            const long long p = prow[wn * 32u + j * 8u + 2u * t4 + (q & 1)];",
            "            if (p >= 0 && row < n) {",
            "                ds4_out[(unsigned long long)p * n + row] = c[i][j][q];",
            "            }",
            "        }",
            "    }",
            "}",
        ] {
            w(&mut o, 1, l);
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_ir::GgmlType::*;

    /// Which types take the two-MMA factored form: every type whose element factor is
    /// exact in TF32 and whose scales fit the 32-column steps.
    #[test]
    fn factored_form_where_the_element_factor_is_exact_in_tf32() {
        for t in [Q8_0, Q2K, Q4K, Q6K, Iq2Xxs, Mxfp4, F16, F32, Bf16] {
            let spec = ds4_ir::quant::spec(t).unwrap();
            let syn = crate::quant::syntax(crate::Target::CudaSm90).unwrap();
            let lower = Lower { syn: syn.as_ref(), spec, shared_tables: false, wbuf: "ds4_w" };
            let factored = matches!(lower.mma_form(), Form::Factored { .. });
            assert_eq!(factored, !matches!(t, F32 | Bf16), "{t}");
        }
    }
}
