//! `copy_spans`: up to [`MAX_SPANS`] device-to-device copies of 4-byte words in one launch,
//! CUDA text.
//!
//! A decode step appends rows to the stateful ops' logs by device copies (the KV window's
//! row, each compressor's KV and gate rows: `runtime/src/cuda/device_log.rs`), ~180 a step
//! on DeepSeek-V4-Flash. In a step's graph a copy node is ~1 µs and breaks the chain of
//! programmatic launches (`launch_plan.rs`): the kernel after it starts only once it has
//! finished. A CSA layer makes four in a row on its critical path (its two compressors'
//! rows, after their projections; a CUPTI trace, `scripts/ktrace/`). As a kernel, copies
//! queued one after another on a lane are one launch (`LaunchPlan::run` merges them), linked
//! like any kernel. Span s is block row y = s; its words are split over the row's blocks.

use crate::quant::QParam;

/// Kernel name.
pub const NAME: &str = "copy_spans";
/// The most copies a launch takes.
pub const MAX_SPANS: usize = 8;
/// Threads a block.
pub const THREADS: u32 = 256;
/// Blocks a span (grid x): a log row is a few KB.
pub const BLOCKS_A_SPAN: u32 = 4;

/// Parameters in launch order: the copies' count, then for each of [`MAX_SPANS`] spans its
/// destination, source (4-byte aligned addresses) and length in words (spans past the
/// count are not read).
pub fn params() -> Vec<QParam> {
    let mut p = vec![QParam::Scalar { name: "count" }];
    for (d, s, n) in SPAN_PARAMS {
        p.extend([QParam::Scalar { name: d }, QParam::Scalar { name: s }, QParam::Scalar { name: n }]);
    }
    p
}

const SPAN_PARAMS: [(&str, &str, &str); MAX_SPANS] = [("d0", "s0", "n0"), ("d1", "s1", "n1"), ("d2", "s2", "n2"), ("d3", "s3", "n3"), ("d4", "s4", "n4"), ("d5", "s5", "n5"), ("d6", "s6", "n6"), ("d7", "s7", "n7")];

/// The CUDA source. Launch: grid ([`BLOCKS_A_SPAN`], count), [`THREADS`] threads.
pub fn source() -> String {
    let cases: String = (0..MAX_SPANS).map(|i| format!("        case {i}u: d = d{i}; s = s{i}; n = n{i}; break;\n")).collect();
    format!(
        r#"// {NAME}: up to {MAX_SPANS} device copies of 4-byte words in one launch (codegen/src/cuda_copy.rs).
{entry}    if (blockIdx.y >= count) return;
    unsigned long long d = 0ull, s = 0ull, n = 0ull;
    switch (blockIdx.y) {{
{cases}        default: break;
    }}
    unsigned int* const dst = (unsigned int*)d;
    const unsigned int* const src = (const unsigned int*)s;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {{
        dst[i] = src[i];
    }}
}}
"#,
        entry = crate::cuda::own_entry(NAME, &THREADS.to_string(), &params())
    )
}

