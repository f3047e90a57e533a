//! ds4-ir: dtypes, symbolic shapes, the op set, the typed graph and its float64 reference.
pub mod dtype;
pub use dtype::{DType, GgmlType};
