//! A decode token's mat-vecs in integer dot products (`dp4a`) against x split into int8
//! digits, CUDA text: the routed experts' IQ2_XXS gate and up ([`MATVEC_IQ2_XXS`]) and
//! Q2_K down ([`MATVEC_Q2_K`]), and short Q8_0_R rows ([`MATVEC_Q8_0_R`], `attn_q_b`),
//! with [`X_DIGITS`], which makes the digits.
//!
//! The generated mat-vec (`quant/cuda_matvec.rs`) spends ~12 instructions a weight on
//! IQ2_XXS (Nsight Compute on the H200: 19.6 M for 50 M weights, the issue slots 64% busy):
//! each element's grid byte becomes a float (a byte permute and a subtraction), its sign
//! is moved into the float's sign bit, then one FMA. In integers, four elements are one
//! word and one `dp4a` multiplies them with four int8 values of x. The word is one byte
//! permute (`prmt`): the grid, held in shared memory as eight selector nibbles an entry
//! (which of the three magnitudes each weight has), picks bytes from {8, 25, 43} and their
//! negations, each nibble's bit 2 the weight's sign, ORed in from the group's sign word by
//! one shift. That needs the experts as IQ2_XXS_R (`ds4_ir::quant`'s `iq2_xxs_r.rs`, what
//! the upload makes of IQ2_XXS): the eighth sign of each entry stored (IQ2_XXS: the parity
//! of seven, a `popc` and more), the signs laid out for the shift, a group's words one
//! aligned 8-byte load (IQ2_XXS: five 2-byte loads). H200, standalone, six picks of 2048 ×
//! 4096 gate and up: 22.8 µs from the file's layout (the grid as 8-byte entries, signs
//! spread to bytes by multiplies), 17.7 from IQ2_XXS_R, the same sums bit for bit (a plain
//! read of the bytes: 11.9).
//!
//! x is not quantized to 8 bits: [`X_DIGITS`] writes each 32-value block of x as `2^E ·
//! Σ_p d_p · 2^-7(p+1)`, p < [`DIGITS`] = 3, with E the block's exponent (its largest |x|
//! is below 2^E) and d_p int8 digits (r = x / 2^E; d = trunc(128 r); r = 128 r − d; three
//! times, every step exact in f32). The digits keep 21 bits below 2^E: every value to
//! within 2^(E−21), at most 2^-20 of the block's largest |x| (an f32 rounds to 2^-24 of a
//! value). Each group of 32 weights then takes three `dp4a` sums per word (one per digit,
//! exact in int32: at most 43 · 127 · 32), combined in f32 as `(acc₂ 2^-7 + acc₁) 2^-7 +
//! acc₀`, times 2^(E−7) and the group's scale. `cuda_kernels` holds the result to 1e-5
//! of Σ|w·x| against the f64 product, as every mat-vec (measured ~3e-7); llama.cpp's
//! `q8_1` path rounds x to 8 bits.
//!
//! Three digits, not four (H100, a standalone harness of the generated kernels, six picks
//! of 256 experts, µs a launch): gate and up 26.05 → 23.77, and 22.9 with
//! `__launch_bounds__(128, 6)` (80 registers, six blocks an SM instead of five); the down
//! 15.1 → 13.6 with `__launch_bounds__(256, 3)` (80 registers; four digits took 15.1 at
//! 80 and 16.0 at two blocks an SM). Four digits kept the block's largest value exact (28
//! bits); the kernels are bound by issue and latency at low occupancy (Nsight Compute:
//! 96 registers, 20 warps an SM, 6.8 cycles between a warp's instructions).
//!
//! One launch makes both gate and up (grid y: the picks of gate, then those of up; both
//! read the same x digits), four rows a warp, a 32-weight group a lane at a time, each
//! group's x digit words loaded once for the four rows. H200, a standalone timing of one
//! expert mat-vec (6 picks × 2048 rows × 4096): 28.3 µs generated, 19.4 µs here.
//!
//! The runtime (`runtime/src/cuda/exec/digits.rs`, `digits_experts`) uses it for a decode
//! token's IQ2_XXS (on the device IQ2_XXS_R) experts with rows of whole blocks and a
//! multiple of [`ROWS_PER_BLOCK`] rows; `DS4_DIGITS=0` turns it off. Where the down runs
//! in integers too and the experts' rows are whole [`X_BLOCK`]s, [`MATVEC_IQ2_XXS_SWIGLU`]
//! (the same loop, eight rows a warp) makes the digits of their SwiGLU for it instead of
//! the rows (`digits_experts_swiglu`; `DS4_SWIGLU_DIGITS=0` turns it off).

use crate::quant::{BufElem, QParam};
use crate::Target;
use ds4_ir::quant::TableData;
use ds4_ir::GgmlType;
use std::fmt::Write;

/// The x digits kernel.
pub const X_DIGITS: &str = "x_digits";
/// A token's RMS norm and the digits of its output.
pub const NORM_DIGITS: &str = "rms_norm_digits";
/// The experts' gate and up mat-vec (IQ2_XXS, read as IQ2_XXS_R).
pub const MATVEC_IQ2_XXS: &str = "matvec_digits_iq2_xxs";
/// The experts' gate and up mat-vec that makes the digits of their SwiGLU for the down
/// (gate and up rows of one pick in one block): `x_digits` of the SwiGLU, one launch fewer.
pub const MATVEC_IQ2_XXS_SWIGLU: &str = "matvec_digits_iq2_xxs_swiglu";
/// The experts' down mat-vec (Q2_K), summed over the picks with their weights.
pub const MATVEC_Q2_K: &str = "matvec_digits_q2_k";
/// Digit planes of x (int8 each): 21 bits below each block's exponent (module doc).
pub const DIGITS: usize = 3;
/// Values per x block (one exponent each).
pub const X_BLOCK: usize = 32;
/// Values per sum of x (Q2_K's sub-block).
pub const SUM_SPAN: usize = 16;
/// Threads of an `x_digits` block: a warp per x block.
pub const X_THREADS: u32 = 256;
/// Threads of a mat-vec block: four warps of four rows.
pub const THREADS: u32 = 128;
/// Weight rows a gate-and-up block takes (four warps of four).
pub const ROWS_PER_BLOCK: usize = 16;
/// Threads of a [`MATVEC_IQ2_XXS_SWIGLU`] block: four warps of eight gate rows, four of
/// the same eight up rows, so that a block has the [`X_BLOCK`] SwiGLU values of one digit
/// block.
pub const SWIGLU_THREADS: u32 = 256;
/// Weight rows a down block takes: four, a warp per pick.
pub const DOWN_ROWS_PER_BLOCK: usize = 4;
/// A token's dense Q8_0_R mat-vec against x's digits.
pub const MATVEC_Q8_0_R: &str = "matvec_digits_q8_0_r";
/// The longest rows [`MATVEC_Q8_0_R`] takes (`attn_q_b`'s; longer rows keep the float
/// dense kernel, which reads them at a plain read's pace).
pub const DENSE_MAX_K: usize = 1024;
/// Blocks an SM the dense integer mat-vec asks for.
const DENSE_MIN_BLOCKS: u32 = 6;
/// Its group loop's unroll.
const DENSE_UNROLL: u32 = 2;
/// The most picks a down launch takes (a warp each).
pub const MAX_PICKS: usize = 8;
/// Threads of a down block with the most picks.
const DOWN_MAX_THREADS: usize = 32 * MAX_PICKS;

/// `x_digits(xd, xs, xsum, x, k)`: x (k floats, k a multiple of [`X_BLOCK`]) as [`DIGITS`]
/// planes of k int8 digits (`xd`, laid out as [`digit_at`] says), a scale 2^(E−7) per
/// block (`xs`) and the sum of every [`SUM_SPAN`] values (`xsum`, for the types whose
/// values have an offset).
pub fn x_digits_params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "xd", elem: BufElem::Bytes, mutable: true },
        QParam::Buffer { name: "xs", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "xsum", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "x", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "u", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "k" },
        QParam::Float { name: "clamp" },
        QParam::Scalar { name: "swiglu" },
    ]
}

/// Bytes of the digits of k values (the planes; the scales are `k / X_BLOCK` floats).
pub fn digit_bytes(k: usize) -> usize {
    DIGITS * k
}

/// Where digit `plane` of value `j` of k lies in the digit bytes. Each plane (k bytes) holds
/// the first halves of the 32-value blocks, 16 bytes each in block order, then their second
/// halves: a warp whose lanes take consecutive blocks loads one half of a plane as 512
/// contiguous bytes (four L1 wavefronts), where whole 32-byte blocks a lane put each
/// 16-byte load across 1 KB (eight).
pub fn digit_at(k: usize, plane: usize, j: usize) -> usize {
    plane * k + (j % X_BLOCK) / 16 * (k / 2) + j / X_BLOCK * 16 + j % 16
}

/// Blocks of an `x_digits` launch over k values.
pub fn x_digits_blocks(k: usize) -> usize {
    (k / X_BLOCK).div_ceil(X_THREADS as usize / 32).max(1)
}

/// The mat-vec's parameters: `out_g` / `out_u` (picks × n floats each) from the picked
/// experts of `wg` / `wu` (rows of `row_bytes`, n rows an expert) against x's digits.
pub fn matvec_params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out_g", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "out_u", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "wg", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "wu", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "xd", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "xs", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "sel", elem: BufElem::I32, mutable: false },
        QParam::Scalar { name: "n" },
        QParam::Scalar { name: "k" },
        QParam::Scalar { name: "row_bytes" },
        QParam::Scalar { name: "picks" },
    ]
}

/// [`MATVEC_IQ2_XXS_SWIGLU`]'s parameters: [`matvec_params`]' inputs, and instead of the
/// gate and up rows the `x_digits` of their clamped SwiGLU (`clamp`): `out_d`, `out_s`,
/// `out_sum` for picks · n values, as the down reads them.
pub fn swiglu_params() -> Vec<QParam> {
    let mut p = vec![
        QParam::Buffer { name: "out_d", elem: BufElem::Bytes, mutable: true },
        QParam::Buffer { name: "out_s", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "out_sum", elem: BufElem::F32, mutable: true },
    ];
    p.extend(matvec_params().into_iter().filter(|q| !matches!(q, QParam::Buffer { mutable: true, .. })));
    p.push(QParam::Float { name: "clamp" });
    p
}

/// Whether [`MATVEC_IQ2_XXS_SWIGLU`] takes experts of `n` rows (whole digit blocks of them).
pub fn swiglu_fits(n: usize) -> bool {
    n > 0 && n.is_multiple_of(X_BLOCK)
}

/// The down mat-vec's parameters: `out` (n floats) = Σ over picks p of `wts[p]` × the
/// picked expert of `w` (rows of `row_bytes`, n rows an expert) against x row p's digits,
/// plus `addend` where `has_addend` is 1 (the graph's `Add` of the shared expert's output,
/// one f32 addition after the sum, as that op makes it); then the `hc_expand` of out
/// (`cuda_hc_expand::params`, `enh` = 0 for none).
pub fn down_params() -> Vec<QParam> {
    let mut p = vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "w", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "xd", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "xs", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "xsum", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "sel", elem: BufElem::I32, mutable: false },
        QParam::Buffer { name: "wts", elem: BufElem::F32, mutable: false },
        QParam::Buffer { name: "addend", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
        QParam::Scalar { name: "k" },
        QParam::Scalar { name: "row_bytes" },
        QParam::Scalar { name: "picks" },
        QParam::Scalar { name: "has_addend" },
    ];
    p.extend(crate::cuda_hc_expand::params());
    p
}

/// Static shared memory of a down launch: the picks' row sums and the expand's staging.
pub fn down_shared_bytes() -> u32 {
    (MAX_PICKS * DOWN_ROWS_PER_BLOCK * 4) as u32 + crate::cuda_hc_expand::shared_bytes(DOWN_ROWS_PER_BLOCK)
}

/// Whether a down launch can also make the `hc_expand` of its output, of nh streams (the
/// fewest threads a launch has: a warp).
pub fn down_expand_fits(nh: usize) -> bool {
    crate::cuda_hc_expand::fits(nh, DOWN_ROWS_PER_BLOCK, 32)
}

/// Whether a decode token's expert gate and up of type `ty`, n rows of k, can take
/// [`MATVEC_IQ2_XXS`].
pub fn gate_up_fits(ty: GgmlType, n: usize, k: usize) -> bool {
    ty == GgmlType::Iq2XxsR && whole(ty, n, k)
}

/// Whether a decode token's expert down of type `ty`, n rows of k, `picks` experts, can
/// take [`MATVEC_Q2_K`].
pub fn down_fits(ty: GgmlType, n: usize, k: usize, picks: usize) -> bool {
    ty == GgmlType::Q2K && whole(ty, n, k) && (1..=MAX_PICKS).contains(&picks)
}

/// Threads of a down launch of `picks` picks.
pub fn down_threads(picks: usize) -> u32 {
    (32 * picks) as u32
}

/// Rows of whole blocks, and whole blocks of rows.
fn whole(ty: GgmlType, n: usize, k: usize) -> bool {
    n > 0 && n.is_multiple_of(ROWS_PER_BLOCK) && k > 0 && k.is_multiple_of(ty.block_elems())
}

/// `x_digits`'s CUDA source (None off CUDA). With `swiglu` 1 the values are the clamped
/// SwiGLU of `x` (the gate rows) and `u` (the up rows), by the `swiglu` op kernel's helper
/// rendered from its IR: the routed experts' down reads the digits of their SwiGLU, which
/// is then never made (the same floats as `swiglu` then `x_digits`).
pub fn x_digits_source(target: Target) -> Option<String> {
    Some(format!(
        "// {X_DIGITS}: x as {DIGITS} int8 digit planes and a scale per {X_BLOCK} values (codegen/src/cuda_digits.rs).\n{}{}    ds4_x_digits_block(blockIdx.x, {});\n}}\n",
        x_digits_block(target)?,
        crate::cuda::own_entry(X_DIGITS, &X_THREADS.to_string(), &x_digits_params()),
        crate::quant::cuda::c_args(&x_digits_params())
    ))
}

/// `x_digits`'s work as a device function of the block index `block` and the kernel's
/// parameters, with the helpers it needs (None off CUDA): the kernel is a call of it, and
/// `router_select_digits` (`cuda_router.rs`) runs it in the blocks after its routing ones.
pub(crate) fn x_digits_block(target: Target) -> Option<String> {
    let cuda = crate::cuda::Cuda::of(target)?;
    Some(format!(
        r#"{helpers}
// Value `v` of group `b` of x (k values), the lane's of the warp that has the group: its
// digits, and with the warp's, the group's scale and sums.
__device__ __forceinline__ void ds4_x_digits_value(const float v, const unsigned long long b, unsigned char* __restrict__ ds4_xd, float* __restrict__ ds4_xs, float* __restrict__ ds4_xsum, const unsigned long long k) {{
    const unsigned int lane = threadIdx.x & 31u;
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    // The sums of each {SUM_SPAN} values (lanes 0 and {SUM_SPAN} write them).
    float sum = v;
    for (int o = {SUM_SPAN} / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane % {SUM_SPAN}u == 0u) ds4_xsum[(b * {X_BLOCK}ull + lane) / {SUM_SPAN}ull] = sum;
    // amax < 2^e (0 for a block of zeros). A block with an infinity or a NaN gets a NaN
    // scale: its sums come out NaN, as the float kernel's would not be finite either.
    int e = 0;
    const bool finite = amax <= 3.402823466e38f;
    if (finite && amax > 0.0f) frexpf(amax, &e);
    float r = finite ? ldexpf(v, -e) : 0.0f;
    #pragma unroll
    for (unsigned int p = 0; p < {DIGITS}u; p++) {{
        const float t = r * 128.0f;
        const float d = truncf(t);
        r = t - d;
        ds4_xd[p * k + (lane >> 4) * (k >> 1) + b * 16ull + (lane & 15u)] = (unsigned char)(int)d;
    }}
    if (lane == 0u) ds4_xs[b] = finite ? ldexpf(1.0f, e - 7) : __int_as_float(0x7fc00000);
}}

// Block `block` of an x_digits launch: its warps' groups of {X_BLOCK} values.
__device__ __forceinline__ void ds4_x_digits_block(const unsigned long long block, {params}) {{
    const unsigned long long b = block * (blockDim.x / 32u) + (threadIdx.x >> 5);
    if (b * {X_BLOCK}ull >= k) return;
    const unsigned long long i = b * {X_BLOCK}ull + (threadIdx.x & 31u);
    ds4_x_digits_value(swiglu != 0ull ? swiglu_value(ds4_x[i], ds4_u[i], clamp) : ds4_x[i], b, ds4_xd, ds4_xs, ds4_xsum, k);
}}
"#,
        helpers = crate::render::op_helpers(&cuda, "swiglu"),
        params = crate::quant::cuda::c_params(&x_digits_params()),
    ))
}

/// `rms_norm_digits(out, xd, xs, xsum, x, w, k, eps)`: a token's weighted RMS norm (`out`,
/// k floats: `rms_norm`'s) and `x_digits` of it, in one block of a thread a value.
pub fn norm_digits_params() -> Vec<QParam> {
    let b = |name, elem, mutable| QParam::Buffer { name, elem, mutable };
    vec![
        b("out", BufElem::F32, true),
        b("xd", BufElem::Bytes, true),
        b("xs", BufElem::F32, true),
        b("xsum", BufElem::F32, true),
        b("x", BufElem::F32, false),
        b("w", BufElem::F32, false),
        QParam::Scalar { name: "k" },
        QParam::Float { name: "eps" },
    ]
}

/// Whether `rms_norm_digits` takes a norm of `tokens` rows of `k`: one token, whole
/// [`X_BLOCK`]-value groups, a thread a value.
pub fn norm_digits_fits(tokens: usize, k: usize) -> bool {
    tokens == 1 && k > 0 && k.is_multiple_of(X_BLOCK) && k <= NORM_DIGITS_MAX_K
}

/// The most values `rms_norm_digits` takes (a block of a thread a value).
pub const NORM_DIGITS_MAX_K: usize = 1024;

/// `rms_norm_digits`' source: the norm `attn_q_a`'s output takes before `attn_q_b`, whose
/// integer mat-vec (`matvec_digits_q8_0_r`) reads its digits, in one launch where it was
/// two (the norm, then `x_digits`: 2.5 and 1.4 µs on the query's chain, H200 trace). The
/// norm as `rms_norm` launched at a thread a value (the runtime's launch of a decode
/// token's row of up to 1024), the digits as `x_digits`': the same floats and bytes.
pub fn norm_digits_source(target: Target) -> Option<String> {
    Some(format!(
        "// {NORM_DIGITS}: a token's RMS norm and x_digits of it (codegen/src/cuda_digits.rs).
{}{}{}{}    const unsigned int t = threadIdx.x;
    const float v = ds4_x[t];
    const float inv = rms_inv(ds4_block_sum(v * v), k, eps);
    const float y = rms_scaled(v, inv, ds4_w[t]);
    ds4_out[t] = y;
    ds4_x_digits_value(y, t / {X_BLOCK}u, ds4_xd, ds4_xs, ds4_xsum, k);
}}
",
        x_digits_block(target)?,
        crate::cuda::BLOCK_SUM,
        crate::cuda::text_helpers("rms_norm"),
        crate::cuda::own_entry(NORM_DIGITS, &NORM_DIGITS_MAX_K.to_string(), &norm_digits_params()),
    ))
}

/// The reference of `x_digits` for one block of [`X_BLOCK`] values: the digit planes and
/// the scale 2^(E−7), with E the least exponent for which every |x| < 2^E (0 for a block
/// of zeros), the same steps the kernel takes (r = x / 2^E; d = trunc(128 r); r = 128 r −
/// d, each exact in f32). `x` finite.
pub fn digits_of(x: &[f32; X_BLOCK]) -> ([[i8; X_BLOCK]; DIGITS], f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    // frexp: amax = f · 2^e with f in [0.5, 1).
    let e = if amax > 0.0 { (amax as f64).log2().floor() as i32 + 1 } else { 0 };
    let mut planes = [[0i8; X_BLOCK]; DIGITS];
    for (j, &v) in x.iter().enumerate() {
        let mut r = (v as f64 * 2f64.powi(-e)) as f32;
        for plane in planes.iter_mut() {
            let t = r * 128.0;
            let d = t.trunc();
            r = t - d;
            plane[j] = d as i8;
        }
    }
    (planes, (2f64.powi(e - 7)) as f32)
}

/// `int name[DIGITS] = {0, ...}`: a group's dp4a sums, one per digit plane.
fn digit_sums(name: &str) -> String {
    format!("int {name}[{DIGITS}] = {{{}}}", ["0"; DIGITS].join(", "))
}

/// A group's digit sums `name[0..DIGITS]` combined in f32, the least significant first:
/// `(name[2] 2^-7 + name[1]) 2^-7 + name[0]` (each digit 2^-7 of the one before it).
fn digits_combined(name: &str) -> String {
    (1..DIGITS).rev().fold(format!("(float){name}[{}]", DIGITS - 1), |acc, p| format!("({acc}) * 0.0078125f + (float){name}[{}]", p - 1))
}

/// A warp's `rows` rows' sums, `value` (an expression of row r's `part[r]`) added over its
/// lanes, stored by lane 0 at `dst` (an expression of r): the integer mat-vecs' end.
fn row_sums(rows: usize, value: &str, dst: &str) -> String {
    format!(
        "    #pragma unroll
    for (unsigned int r = 0; r < {rows}u; r++) {{
        float v = {value};
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0u) {dst} = v;
    }}
"
    )
}

/// A lane's loads of one 32-value group of x: `words`, the group's first word in a digit
/// plane (4 × the group; `xw` the digits as words, `kw` a plane's words), and `group`, its
/// index (expressions): each digit plane's two 16-value halves as `xv[d][0..2]` (the
/// layout [`digit_at`] states), and the group's scale as `xscale`.
fn x_group_loads(words: &str, group: &str) -> String {
    format!(
        "        uint4 xv[{DIGITS}][2];
        #pragma unroll
        for (unsigned int d = 0; d < {DIGITS}u; d++) {{
            xv[d][0] = *(const uint4*)(xw + d * kw + {words});
            xv[d][1] = *(const uint4*)(xw + d * kw + kw / 2ull + {words});
        }}
        const float xscale = ds4_xs[{group}];
"
    )
}

/// Blocks an SM the gate-and-up kernel asks for in its launch bounds (80 registers).
const GATE_UP_MIN_BLOCKS: u32 = 6;
/// Blocks an SM the down kernel asks for in its launch bounds (80 registers).
const DOWN_MIN_BLOCKS: u32 = 3;

/// The IQ2_XXS grid's three magnitudes (8, 25, 43), from the IQ2_XXS_R declaration's
/// GRID_BYTES, least first, and each grid entry as eight selector nibbles (nibble j: the
/// index of magnitude j among them).
pub fn grid_nibbles() -> ([u8; 3], Vec<u32>) {
    let spec = ds4_ir::quant::spec(GgmlType::Iq2XxsR).expect("IQ2_XXS_R is declared");
    let t = spec.tables.iter().find(|t| t.name == "GRID_BYTES").expect("IQ2_XXS_R declares GRID_BYTES");
    let TableData::U8(bytes) = t.data else { panic!("GRID_BYTES is a byte table") };
    let mut mags: Vec<u8> = bytes.to_vec();
    mags.sort_unstable();
    mags.dedup();
    let mags: [u8; 3] = mags.try_into().expect("three grid magnitudes");
    assert!(mags.iter().all(|&m| m < 128), "magnitudes fit an int8");
    let entries = bytes
        .chunks_exact(8)
        .map(|e| e.iter().enumerate().fold(0u32, |acc, (j, b)| acc | (mags.iter().position(|m| m == b).unwrap() as u32) << (4 * j)))
        .collect();
    (mags, entries)
}

/// How far right (negative: left) half-entry `e` (0..8) of a group's sign word shifts so
/// that its four signs sit at bit 2 of four nibbles: from IQ2_XXS_R's layout
/// (`ds4_ir::quant::iq2_xxs_r_sign_bit`), whose half-entries keep their signs 4 bits apart.
pub fn sign_shift(e: usize) -> i32 {
    let (k, j0) = (e / 2, 4 * (e % 2));
    let base = ds4_ir::quant::iq2_xxs_r_sign_bit(k, j0);
    for b in 0..4 {
        assert_eq!(ds4_ir::quant::iq2_xxs_r_sign_bit(k, j0 + b), base + 4 * b as u32, "half-entry {e}: signs 4 bits apart");
    }
    base as i32 - 2
}

/// The word a byte permute (`prmt`) takes its bytes from: `mags` in bytes 0..3, byte 3
/// zero; negated (two's complement) with `negate`.
pub fn magnitude_word(mags: [u8; 3], negate: bool) -> u32 {
    mags.iter().enumerate().fold(0u32, |acc, (i, &m)| acc | (if negate { m.wrapping_neg() } else { m } as u32) << (8 * i))
}

/// Where the gate and up kernel finds IQ2_XXS_R's group words (`qs`), from the declaration
/// (`ds4_ir::quant`'s `iq2_xxs_r.rs`). The kernel reads `sc` and `d` as one 8-byte word
/// (`sc` its low half, `d` the low 16 bits of its high half): a declaration that moves them
/// fails here, when the source is generated, not in the kernel's sums.
fn iq2_xxs_r_qs_offset() -> usize {
    let spec = ds4_ir::quant::spec(GgmlType::Iq2XxsR).expect("IQ2_XXS_R is declared");
    let at = |f: &str| spec.field(f).unwrap_or_else(|| panic!("IQ2_XXS_R declares {f}")).offset;
    assert!(at("sc") == 0 && at("d") == 4, "the kernel reads IQ2_XXS_R's sc at byte 0 and d at byte 4");
    at("qs")
}

/// The mat-vec's CUDA source: IQ2_XXS_R rows (`ds4_ir::quant`'s `iq2_xxs_r.rs`), the grid
/// as selector nibbles from its declaration.
pub fn matvec_source() -> String {
    gate_up_source(None)
}

/// [`MATVEC_IQ2_XXS_SWIGLU`]'s source (None off CUDA): [`MATVEC_IQ2_XXS`]'s loop at eight
/// rows a warp, a block the same 32 rows of gate (warps 0..3) and up (4..7) of one pick,
/// then warp 0 takes the block's 32 SwiGLU values to `x_digits`' device function. The rows'
/// sums are [`MATVEC_IQ2_XXS`]'s bit for bit (a row's are the same whatever rows share its
/// warp), the SwiGLU `x_digits`' helper: the digits, scales and sums are those of
/// `matvec_digits_iq2_xxs` then `x_digits` (`cuda_kernels` checks the bits), and the down
/// is not kept waiting for a launch of its own between them (1.6 µs a layer, H200 trace).
pub fn matvec_swiglu_source(target: Target) -> Option<String> {
    Some(gate_up_source(Some(x_digits_block(target)?)))
}

/// The gate-and-up kernel: [`MATVEC_IQ2_XXS`], or with `swiglu` (`x_digits`' helpers)
/// [`MATVEC_IQ2_XXS_SWIGLU`].
fn gate_up_source(swiglu: Option<String>) -> String {
    let fused = swiglu.is_some();
    let (name, rows, what) = match fused {
        false => (MATVEC_IQ2_XXS, 4, "gate and up"),
        true => (MATVEC_IQ2_XXS_SWIGLU, 8, "gate and up, then the digits of their SwiGLU"),
    };
    let mut s = format!("// {name}: IQ2_XXS_R experts' {what} in dp4a against x's digits (codegen/src/cuda_digits.rs).\n\n");
    let (mags, entries) = grid_nibbles();
    let _ = write!(s, "__device__ const unsigned int DS4_GRID_NIBBLES[{}] = {{", entries.len());
    for (i, e) in entries.iter().enumerate() {
        let _ = write!(s, "{}0x{e:08x}u", if i == 0 { "" } else { ", " });
    }
    s.push_str("};\n");
    s.push_str(crate::quant::cuda::F16_TO_F32_DOT);
    if let Some(helpers) = &swiglu {
        s.push_str(helpers);
    }
    let rows_of_block = match fused {
        false => "    const unsigned long long row0 = ((unsigned long long)blockIdx.x * (blockDim.x / 32u) + (threadIdx.x >> 5)) * 4ull;
    // Grid y: gate's picks, then up's.
    const bool up = blockIdx.y >= picks;
    const unsigned long long p = up ? blockIdx.y - picks : blockIdx.y;
"
        .to_string(),
        true => format!(
            "    // Warps 0..3: gate rows, 8 a warp; warps 4..7: the same rows of up. Grid y: the picks.
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned long long row0 = (unsigned long long)blockIdx.x * {X_BLOCK}ull + (warp % 4u) * 8ull;
    const bool up = warp >= 4u;
    const unsigned long long p = blockIdx.y;
"
        ),
    };
    let end = match fused {
        false => format!("    float* const out = (up ? ds4_out_u : ds4_out_g) + p * n + row0;\n{}", row_sums(rows, "pick >= 0 ? part[r] : 0.0f", "out[r]")),
        true => format!(
            "    // The rows' sums as the gate-and-up kernel stores them, then their SwiGLU's digits
    // (`x_digits`' of picks · n values: digit block p · n / {X_BLOCK} + blockIdx.x).
    __shared__ float ds4_gu[2][{X_BLOCK}];
{sums}    __syncthreads();
    if (warp == 0u) ds4_x_digits_value(swiglu_value(ds4_gu[0][lane], ds4_gu[1][lane], clamp), p * (n / {X_BLOCK}ull) + blockIdx.x, ds4_out_d, ds4_out_s, ds4_out_sum, picks * n);
",
            sums = row_sums(rows, "pick >= 0 ? part[r] : 0.0f", "ds4_gu[up ? 1 : 0][(warp % 4u) * 8u + r]")
        ),
    };
    let entry = match fused {
        false => crate::cuda::own_entry(name, &format!("{THREADS}, {GATE_UP_MIN_BLOCKS}"), &matvec_params()),
        true => crate::cuda::own_entry(name, &format!("{SWIGLU_THREADS}, {}", GATE_UP_MIN_BLOCKS * THREADS / SWIGLU_THREADS), &swiglu_params()),
    };
    let _ = write!(
        s,
        r#"
// Four weights as int8: nibble b of `sel` picks byte b's value, the magnitude its bits 0..1
// name from {{{m0}, {m1}, {m2}}} (bytes 0..2 of `pos`), negated where bit 2 is set (bytes
// 4..6: `neg`).
__device__ __forceinline__ int ds4_pick_bytes(const unsigned int sel) {{
    unsigned int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(0x{pos:08x}u), "r"(0x{neg:08x}u), "r"(sel));
    return (int)d;
}}

// The signs of half-entry e of a group's sign word `sw` at bit 2 of four nibbles: a shift
// by IQ2_XXS_R's layout (`sign_bit`); e a constant, so one shift.
__device__ __forceinline__ unsigned int ds4_sign_nibbles(const unsigned int sw, const int e) {{
    const int sh = {shifts};
    return (sh >= 0 ? sw >> sh : sw << -sh) & 0x4444u;
}}

{entry}    __shared__ unsigned int grid[256];
    for (unsigned int i = threadIdx.x; i < 256u; i += blockDim.x) grid[i] = DS4_GRID_NIBBLES[i];
    __syncthreads();
    const unsigned int lane = threadIdx.x & 31u;
{rows_of_block}    const int pick = ds4_sel[p];
    const unsigned char* const w = (up ? ds4_wu : ds4_wg) + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = k / 4ull;
    float part[{rows}] = {{{zeros}}};
    // Lane l takes the 32-weight groups l, l + 32, ... of its warp's {rows} rows. A 32-bit
    // counter and four groups' loads in flight: 28.9 -> 27.3 µs on the H200 (six picks of
    // 2048 × 4096, standalone; the 64-bit counter kept the loop from unrolling).
    #pragma unroll 4
    for (unsigned int ib = lane; ib < (unsigned int)(k / 32ull); ib += 32u) {{
{x_loads}        #pragma unroll
        for (unsigned int r = 0; r < {rows}u; r++) {{
            // The block's scales and d, then the group's grid indices and signs: two
            // aligned 8-byte loads.
            const unsigned char* const blk = w + r * row_bytes + (ib / 8u) * {block}u;
            const uint2 hd = *(const uint2*)blk;
            const uint2 qs = *(const uint2*)(blk + {qs_at}u + 8u * (ib % 8u));
            const float db = ds4_f16_to_f32_dot(hd.y & 0xffffu) * (0.5f + (float)((hd.x >> (4u * (ib % 8u))) & 15u)) * 0.25f;
            {acc_decl};
            #pragma unroll
            for (int c = 0; c < 4; c++) {{
                // Grid index c: byte c of qs.x by one `prmt` (a shift and a mask were
                // two; 16.7 -> 16.3 µs on the H200, experts_lab).
                const unsigned int g = grid[__byte_perm(qs.x, 0u, 0x4440u + c)];
                const int w0 = ds4_pick_bytes(ds4_sign_nibbles(qs.y, 2 * c) | g);
                const int w1 = ds4_pick_bytes(ds4_sign_nibbles(qs.y, 2 * c + 1) | (g >> 16));
                #pragma unroll
                for (unsigned int d = 0; d < {DIGITS}u; d++) {{
                    const unsigned int* const x4 = (const unsigned int*)&xv[d][0];
                    acc[d] = __dp4a(w0, (int)x4[2 * c], acc[d]);
                    acc[d] = __dp4a(w1, (int)x4[2 * c + 1], acc[d]);
                }}
            }}
            const float sx = {acc_sum};
            part[r] = fmaf(db, sx * xscale, part[r]);
        }}
    }}
{end}}}
"#,
        shifts = (0..8).rev().fold(String::new(), |rest, e| if rest.is_empty() { sign_shift(e).to_string() } else { format!("e == {e} ? {} : {rest}", sign_shift(e)) }),
        m0 = mags[0],
        m1 = mags[1],
        m2 = mags[2],
        pos = magnitude_word(mags, false),
        neg = magnitude_word(mags, true),
        block = GgmlType::Iq2XxsR.block_bytes(),
        qs_at = iq2_xxs_r_qs_offset(),
        zeros = vec!["0.0f"; rows].join(", "),
        x_loads = x_group_loads("ib * 4ull", "ib"),
        acc_decl = digit_sums("acc"),
        acc_sum = digits_combined("acc"),
    );
    s
}

/// The dense Q8_0_R mat-vec's parameters: `out` (n floats) = every row of `w` (n rows of
/// `row_bytes`, Q8_0_R) against x's digits.
pub fn dense_params() -> Vec<QParam> {
    vec![
        QParam::Buffer { name: "out", elem: BufElem::F32, mutable: true },
        QParam::Buffer { name: "w", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "xd", elem: BufElem::Bytes, mutable: false },
        QParam::Buffer { name: "xs", elem: BufElem::F32, mutable: false },
        QParam::Scalar { name: "n" },
        QParam::Scalar { name: "k" },
        QParam::Scalar { name: "row_bytes" },
    ]
}

/// Whether a mat-vec of `n` rows of `ty` by `k` takes [`MATVEC_Q8_0_R`]: one token (`m`),
/// one pick, one x for every row (one row group, no x divisor), every row (no selection,
/// no pick weights), Q8_0_R rows of at most [`DENSE_MAX_K`] values (`attn_q_b`'s 1024),
/// whole blocks of rows.
#[allow(clippy::too_many_arguments)]
pub fn dense_fits(ty: GgmlType, n: usize, k: usize, m: usize, groups: usize, picks: usize, x_div: usize, selected: bool, weighted: bool) -> bool {
    m == 1
        && groups == 1
        && picks == 1
        && x_div == 1
        && !selected
        && !weighted
        && ty == GgmlType::Q8_0R
        && k > 0
        && k <= DENSE_MAX_K
        && k.is_multiple_of(64)
        && n > 0
        && n.is_multiple_of(ROWS_PER_BLOCK)
}

/// The dense integer mat-vec's CUDA source: a token's Q8_0_R rows (two f16 scales, then
/// 64 signed bytes a block) in dp4a against x's digits, four rows a warp, a lane a
/// 32-value group of each (its scale and eight words), the group's digit words loaded once
/// for the four rows.
pub fn dense_source() -> String {
    let mut s = format!("// {MATVEC_Q8_0_R}: a token's Q8_0_R mat-vec over every row in dp4a against x's digits (codegen/src/cuda_digits.rs).\n\n");
    s.push_str(crate::quant::cuda::F16_TO_F32_DOT);
    let _ = write!(
        s,
        r#"
{entry}    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long row0 = ((unsigned long long)blockIdx.x * (blockDim.x / 32u) + (threadIdx.x >> 5)) * 4ull;
    const unsigned char* const w = ds4_w + row0 * row_bytes;
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = k / 4ull;
    float part[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    // Lane l takes the 32-value groups l, l + 32, ...: sub-block ib % 2 of block ib / 2
    // (its scale d[ib % 2], its 32 signed bytes at 4 + 32 (ib % 2)).
    #pragma unroll {unroll}
    for (unsigned int ib = lane; ib < (unsigned int)(k / 32ull); ib += 32u) {{
{x_loads}        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {{
            const unsigned char* const blk = w + r * row_bytes + (ib / 2u) * 68u;
            const float d = ds4_f16_to_f32_dot(*(const unsigned short*)(blk + 2u * (ib % 2u)));
            const unsigned int* const qw = (const unsigned int*)(blk + 4u + 32u * (ib % 2u));
            {acc_decl};
            #pragma unroll
            for (unsigned int c = 0; c < 8u; c++) {{
                const int q = (int)qw[c];
                #pragma unroll
                for (unsigned int dg = 0; dg < {DIGITS}u; dg++) {{
                    const unsigned int* const x4 = (const unsigned int*)&xv[dg][c / 4u];
                    acc[dg] = __dp4a(q, (int)x4[c % 4u], acc[dg]);
                }}
            }}
            part[r] = fmaf(d, ({acc_sum}) * xscale, part[r]);
        }}
    }}
{sums}}}
"#,
        entry = crate::cuda::own_entry(MATVEC_Q8_0_R, &format!("{THREADS}, {DENSE_MIN_BLOCKS}"), &dense_params()),
        x_loads = x_group_loads("ib * 4ull", "ib"),
        unroll = DENSE_UNROLL,
        acc_decl = digit_sums("acc"),
        acc_sum = digits_combined("acc"),
        sums = row_sums(4, "part[r]", "ds4_out[row0 + r]"),
    );
    s
}

/// The down mat-vec's CUDA source (Q2_K, as its declaration lays the block out: 16 scale
/// and min nibble pairs, 64 bytes of four 2-bit planes, `d`, `dmin`).
pub fn down_source() -> String {
    let mut s = format!("// {MATVEC_Q2_K}: Q2_K experts' down in dp4a against x's digits, summed over the picks (codegen/src/cuda_digits.rs).\n\n");
    s.push_str(crate::quant::cuda::F16_TO_F32_DOT);
    s.push_str(&crate::cuda_hc_expand::helpers());
    let _ = write!(
        s,
        r#"
{entry}    __shared__ float parts[{MAX_PICKS}][4];
    const unsigned int lane = threadIdx.x & 31u;
    // Warp p: pick p of the block's four rows.
    const unsigned long long p = threadIdx.x >> 5;
    const unsigned long long row0 = (unsigned long long)blockIdx.x * 4ull;
    // The expand's inputs (`cuda_hc_expand.rs`) on their way to shared memory.
    {stage}    const int pick = ds4_sel[p];
    const unsigned char* const w = ds4_w + ((unsigned long long)(pick >= 0 ? pick : 0) * n + row0) * row_bytes;
    const unsigned int* const xw = (const unsigned int*)ds4_xd;
    const unsigned long long kw = picks * k / 4ull;
    float part[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    // Lane l takes the 32-value groups l, l + 32, ... of x row p: sub-blocks 2i and 2i + 1
    // of a block (i = group % 8), whose values are the 32 bytes of plane i % 4 at byte
    // 16 + 32 (i / 4). A 32-bit counter: 16.7 -> 14.5 µs on the H200 (4096 × 2048, six
    // picks, standalone; unrolled on the 64-bit counter it took 20.8). Its passes one
    // after the other, not unrolled in pairs: 11.9 -> 11.6 µs (experts_lab).
    #pragma unroll 1
    for (unsigned int ib = lane; ib < (unsigned int)(k / 32ull); ib += 32u) {{
        const unsigned long long e0 = p * k + ib * 32ull;
{x_loads}        const float xsum0 = ds4_xsum[e0 / 16ull], xsum1 = ds4_xsum[e0 / 16ull + 1ull];
        const unsigned int i = (unsigned int)(ib % 8ull);
        const unsigned int shift = 2u * (i % 4u);
        #pragma unroll
        for (unsigned int r = 0; r < 4u; r++) {{
            const unsigned char* const blk = w + r * row_bytes + (ib / 8ull) * 84ull;
            const unsigned int* const qw = (const unsigned int*)(blk + 16u + 32u * (i / 4u));
            const unsigned int sc = *(const unsigned short*)(blk + 2u * i);
            const unsigned int dd = *(const unsigned int*)(blk + 80u);
            const float d = ds4_f16_to_f32_dot(dd & 0xffffu), dmin = ds4_f16_to_f32_dot(dd >> 16);
            {a0_decl}, {a1_decl};
            #pragma unroll
            for (unsigned int c = 0; c < 8u; c++) {{
                const int q = (int)((qw[c] >> shift) & 0x03030303u);
                #pragma unroll
                for (unsigned int dg = 0; dg < {DIGITS}u; dg++) {{
                    const unsigned int* const x4 = (const unsigned int*)&xv[dg][0];
                    if (c < 4u) a0[dg] = __dp4a(q, (int)x4[c], a0[dg]);
                    else a1[dg] = __dp4a(q, (int)x4[c], a1[dg]);
                }}
            }}
            const float s0 = {a0_sum};
            const float s1 = {a1_sum};
            // Each sub-block: d·scale·Σ q·x − dmin·min·Σ x.
            part[r] = fmaf(d * (float)(sc & 15u), s0 * xscale, part[r]);
            part[r] = fmaf(-(dmin * (float)((sc >> 4) & 15u)), xsum0, part[r]);
            part[r] = fmaf(d * (float)((sc >> 8) & 15u), s1 * xscale, part[r]);
            part[r] = fmaf(-(dmin * (float)(sc >> 12)), xsum1, part[r]);
        }}
    }}
    {trig}
{sums}    __syncthreads();
    // The picks' rows weighted and added in pick order (unused picks, -1, add nothing):
    // row threadIdx.x % 4, by the threads that store it and those that expand it.
    if (threadIdx.x < 4u * (enh != 0ull ? (unsigned int)enh : 1u)) {{
        const unsigned int r = threadIdx.x % 4u;
        float acc = 0.0f;
        for (unsigned long long q = 0; q < picks; q++) {{
            if (ds4_sel[q] >= 0) acc = acc + ds4_wts[q] * parts[q][r];
        }}
        const float y = has_addend != 0ull ? acc + ds4_addend[row0 + r] : acc;
        if (threadIdx.x < 4u) ds4_out[row0 + r] = y;
        {store}
    }}
}}
"#,
        store = crate::cuda_hc_expand::store_call(4, "row0", "0u", &|_| "y".into()),
        entry = crate::cuda::own_entry(MATVEC_Q2_K, &format!("{DOWN_MAX_THREADS}, {DOWN_MIN_BLOCKS}"), &down_params()),
        x_loads = x_group_loads("e0 / 8ull", "e0 / 32ull"),
        a0_decl = digit_sums("a0"),
        a1_decl = digit_sums("a1").replacen("int ", "", 1),
        a0_sum = digits_combined("a0"),
        a1_sum = digits_combined("a1"),
        trig = crate::cuda::GRID_TRIGGER,
        stage = crate::cuda_hc_expand::stage_call(4, "row0", "0u"),
        sums = row_sums(4, "part[r]", "parts[p][r]"),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's byte permute gives IQ2_XXS_R's values: for every grid entry and every
    /// bit of a group's sign word, the selector nibbles (`grid_nibbles`) with the signs
    /// shifted in by `sign_shift` pick the values the declaration de-quantizes the block to
    /// (`ds4_ir::quant::dequantize_row`, over the scale), magnitude and sign.
    #[test]
    fn grid_nibbles_and_signs_pick_the_declared_values() {
        let (mags, entries) = grid_nibbles();
        assert_eq!(mags, [8, 25, 43]);
        let (pos, neg) = (magnitude_word(mags, false).to_le_bytes(), magnitude_word(mags, true).to_le_bytes());
        // prmt: bytes 0..3 from pos, 4..7 from neg; selector bit 3 (sign replication) unused.
        let prmt = |sel: u32| -> [i8; 4] {
            std::array::from_fn(|b| {
                let n = (sel >> (4 * b)) & 0xF;
                assert!(n & 8 == 0, "no sign replication");
                (if n < 4 { pos[n as usize] } else { neg[n as usize - 4] }) as i8
            })
        };
        let sign_nibbles = |sw: u32, e: usize| {
            let sh = sign_shift(e);
            (if sh >= 0 { sw >> sh } else { sw << -sh }) & 0x4444
        };
        // A block whose group 0 has grid entry g in all four places and sign word sw; scale
        // code 0 and d = 1: every value is ±magnitude / 8.
        let ty = GgmlType::Iq2XxsR;
        let mut block = vec![0u8; ty.block_bytes()];
        block[4..6].copy_from_slice(&0x3c00u16.to_le_bytes());
        let mut values = vec![0f32; ty.block_elems()];
        for (g, &nib) in entries.iter().enumerate() {
            for bit in 0..33 {
                let sw = if bit < 32 { 1u32 << bit } else { 0x9e37_79b9 };
                block[8..12].copy_from_slice(&(g as u32 * 0x0101_0101).to_le_bytes());
                block[12..16].copy_from_slice(&sw.to_le_bytes());
                ds4_ir::quant::dequantize_row(ty, &block, &mut values).unwrap();
                for e in 0..8 {
                    let half = if e % 2 == 0 { nib } else { nib >> 16 };
                    for (b, &v) in prmt(sign_nibbles(sw, e) | half).iter().enumerate() {
                        let want = values[8 * (e / 2) + 4 * (e % 2) + b] * 8.0;
                        assert_eq!(v as f32, want, "entry {g}, sign word {sw:#x}, half-entry {e}, weight {b}");
                    }
                }
            }
        }
    }

    /// The split is exact to 2^(E−7·DIGITS): each value comes back within that (at or
    /// below its |x|: the digits truncate), every digit within ±127; blocks from 1e-30 to
    /// 1e30, with zeros.
    #[test]
    fn digits_give_x_back() {
        let mut seed = 0x5d4u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for b in 0..2000 {
            let mag = 10f64.powf(next() * 60.0 - 30.0);
            let mut x = [0f32; X_BLOCK];
            for (j, v) in x.iter_mut().enumerate() {
                *v = if b % 7 == 3 || (b % 5 == 1 && j % 3 == 0) { 0.0 } else { ((next() * 2.0 - 1.0) * mag) as f32 };
            }
            let (planes, scale) = digits_of(&x);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(amax == 0.0 || (amax as f64) < scale as f64 * 128.0, "block {b}: 2^E must exceed its values");
            for j in 0..X_BLOCK {
                let back: f64 = (0..DIGITS).map(|p| planes[p][j] as f64 * 128f64.powi(-(p as i32))).sum::<f64>() * scale as f64;
                assert!((back - x[j] as f64).abs() <= scale as f64 * 2f64.powi(7 - 7 * DIGITS as i32), "block {b}: {} back as {back}", x[j]);
                assert!(back.abs() <= (x[j] as f64).abs() && back * x[j] as f64 >= 0.0, "block {b}: {} back as {back}, not truncated", x[j]);
                assert!(planes.iter().all(|p| p[j] != i8::MIN), "block {b}: a digit past ±127");
            }
        }
    }

    /// Every digit has its own byte, inside the digit bytes, and a 16-value half of a
    /// block is 16 contiguous bytes (what the mat-vecs' 16-byte loads take).
    #[test]
    fn digit_layout_is_a_bijection_of_contiguous_halves() {
        let k = 4 * X_BLOCK;
        let mut seen = vec![false; digit_bytes(k)];
        for p in 0..DIGITS {
            for j in 0..k {
                let at = digit_at(k, p, j);
                assert!(!std::mem::replace(&mut seen[at], true), "plane {p}, value {j}: byte {at} twice");
                if j % 16 != 0 {
                    assert_eq!(at, digit_at(k, p, j - 1) + 1);
                } else {
                    assert_eq!(at % 16, 0);
                }
            }
        }
        assert_eq!(digit_at(k, 1, 32 + 17), k + k / 2 + 16 + 1);
    }

    #[test]
    fn tables_are_the_declarations_bytes() {
        let s = matvec_source();
        // Entry 0 of the grid is eight 8s (magnitude 0), entry 1 a 43 then seven 8s (the
        // signs are computed: the test above); the permute's words are 8, 25, 43 and their
        // negations.
        assert!(s.contains("DS4_GRID_NIBBLES[256] = {0x00000000u, 0x00000002u"), "{}", &s[..200]);
        assert!(s.contains("0x002b1908u") && s.contains("0x00d5e7f8u"));
    }

    /// The digit sums combine least significant first, each digit 2^-7 of the one before
    /// it, as many as there are planes (what the host's `digits_of` splits off).
    #[test]
    fn digit_sums_combine_every_plane() {
        assert_eq!(digit_sums("a"), format!("int a[{DIGITS}] = {{{}}}", ["0"; DIGITS].join(", ")));
        let c = digits_combined("a");
        for p in 0..DIGITS {
            assert_eq!(c.matches(&format!("(float)a[{p}]")).count(), 1, "{c}");
        }
        assert_eq!(c.matches("0.0078125f").count(), DIGITS - 1, "{c}");
        // Evaluated as the kernel does, it is Σ_p a[p] 2^-7p.
        let a = [5i32, -3, 7, 2];
        let want: f64 = (0..DIGITS).map(|p| a[p] as f64 * 128f64.powi(-(p as i32))).sum();
        let got = (1..DIGITS).rev().fold(a[DIGITS - 1] as f64, |acc, p| acc * 0.0078125 + a[p - 1] as f64);
        assert_eq!(got, want);
    }

    /// The dense integer mat-vec takes short Q8_0_R rows of whole blocks in whole groups
    /// of rows, and reads the x group loads written once.
    #[test]
    fn dense_fits_short_q8_0_r_rows() {
        let fits = |ty, n, k| dense_fits(ty, n, k, 1, 1, 1, 1, false, false);
        assert!(fits(GgmlType::Q8_0R, 32768, 1024) && fits(GgmlType::Q8_0R, 16, 64));
        assert!(!fits(GgmlType::Q8_0R, 32768, 2048) && !fits(GgmlType::Q8_0R, 32768, 96));
        assert!(!fits(GgmlType::Q8_0R, 40, 1024) && !fits(GgmlType::Q8_0, 32768, 1024) && !fits(GgmlType::Q8_0R, 0, 1024));
        // A prefill's tokens, row groups, picks, an x divisor, a selection or pick weights: not this kernel.
        let (ty, n, k) = (GgmlType::Q8_0R, 32768, 1024);
        assert!(!dense_fits(ty, n, k, 2, 1, 1, 1, false, false) && !dense_fits(ty, n, k, 1, 8, 1, 1, false, false) && !dense_fits(ty, n, k, 1, 1, 6, 1, false, false));
        assert!(!dense_fits(ty, n, k, 1, 1, 1, 2, false, false) && !dense_fits(ty, n, k, 1, 1, 1, 1, true, false) && !dense_fits(ty, n, k, 1, 1, 1, 1, false, true));
        let src = dense_source();
        assert!(src.contains(&format!("__launch_bounds__({THREADS}, {DENSE_MIN_BLOCKS}) {MATVEC_Q8_0_R}(")), "{}", &src[..300]);
        for s in [dense_source(), matvec_source(), down_source()] {
            assert_eq!(s.matches("uint4 xv[").count(), 1);
            assert!(s.contains(&digits_combined("acc")) || s.contains(&digits_combined("a0")));
        }
    }

    #[test]
    fn fits_whole_blocks_of_their_types() {
        assert!(gate_up_fits(GgmlType::Iq2XxsR, 2048, 4096) && down_fits(GgmlType::Q2K, 4096, 2048, 6));
        assert!(!gate_up_fits(GgmlType::Iq2Xxs, 2048, 4096), "the file's layout: the upload regroups it");
        assert!(!down_fits(GgmlType::Q2K, 4096, 2048, MAX_PICKS + 1) && !down_fits(GgmlType::Q2K, 4096, 2048, 0));
        assert!(!gate_up_fits(GgmlType::Iq2XxsR, 2040, 4096) && !gate_up_fits(GgmlType::Iq2XxsR, 2048, 4000));
        assert!(!gate_up_fits(GgmlType::Q2K, 2048, 4096) && !down_fits(GgmlType::Iq2Xxs, 4096, 2048, 6));
        assert_eq!(x_digits_blocks(4096), 16);
        assert_eq!(digit_bytes(4096), DIGITS * 4096);
    }

}
