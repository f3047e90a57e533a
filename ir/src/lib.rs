//! ds4-ir: dtypes, symbolic shapes, the op set, the typed graph, and the kernel bodies
//! that are both the float64 reference and the source of every target's kernels.
pub mod clock;
pub mod dtype;
pub mod graph;
pub mod kernels;
pub mod op;
pub mod real;
pub mod rng;
pub mod shape;
pub use dtype::{DType, GgmlType};
pub use graph::{Graph, NodeId};
pub use op::{CompMode, IrError, Op, RopePos, Slot, TensorType};
pub use real::Real;
pub use shape::{Bind, Dim, Shape};
pub mod kir;
pub mod kir_eval;
/// Lets `#[ds4_macros::kernel]` emit `ds4_ir::kir::..` paths inside this crate too.
extern crate self as ds4_ir;
pub mod quant;
