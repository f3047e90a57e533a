//! The CPU target's kernels: one module per kernel, rendered from kernel IR at build time
//! (see build.rs). Each is `pub fn <name><F: Real>(item, out, ...)`, the same signature
//! as the body it was lowered from in `ds4_ir::kernels`.
#![allow(clippy::all, unused_parens, unused_mut, unused_imports)]
include!(concat!(env!("OUT_DIR"), "/cpu_kernels.rs"));
