//! Kernel bodies: the math of every op, written once.
//!
//! Each kernel is a plain function generic over `F: Real`, computing one *work item*
//! (one output row) into `out`, the slice of the output that belongs to that item. The
//! executor runs items in parallel (CPU: rayon over rows; GPU: one block per item).
//! `F = f64` is the op's float64 reference, `F = f32` the CPU kernel.
//!
//! Bodies keep to a small subset of Rust so that `#[kernel]` can lower them to kernel IR
//! for the GPU targets: scalar locals, `for` over ranges, `if`, indexing, arithmetic and
//! the `Real` methods. No allocation, no closures, no early return.

pub mod attention;
pub mod compress;
pub mod hc;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod roundtrip;

/// Every kernel's IR, as `#[ds4_macros::kernel]` read it from the bodies above (the
/// renderers and the IR-vs-body test iterate over this list).
pub fn all() -> Vec<crate::kir::Kernel> {
    vec![
        norm::rms_norm_kir(),
        norm::rms_norm_plain_kir(),
        norm::add_kir(),
        rope::rope_kir(),
        attention::attention_partial_kir(),
        attention::attention_merge_kir(),
        compress::compress_gather_kir(),
        compress::compress_pool_kir(),
        compress::indexer_head_dots_kir(),
        compress::indexer_combine_kir(),
        compress::top_k_kir(),
        hc::hc_mix_kir(),
        hc::hc_head_mix_kir(),
        hc::hc_collapse_kir(),
        hc::hc_expand_kir(),
        hc::hc_broadcast_kir(),
        moe::router_scores_kir(),
        moe::router_biased_kir(),
        moe::router_hash_kir(),
        moe::router_weights_kir(),
        moe::swiglu_kir(),
        moe::moe_combine_kir(),
        roundtrip::fp8_roundtrip_kir(),
        roundtrip::hadamard_fp4_kir(),
    ]
}
