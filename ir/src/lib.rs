//! ds4-ir: dtypes, symbolic shapes, the op set, the typed graph, and the kernel bodies
//! that are both the float64 reference and the source of every target's kernels.
pub mod dtype;
pub mod kernels;
pub mod real;
pub use dtype::{DType, GgmlType};
pub use real::Real;
