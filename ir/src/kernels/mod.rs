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
