//! ds4-runtime: weights, the graph executor, per-session state, sessions and sampling.
pub mod all_rows;
pub mod cuda;
pub mod cpu_kernels;
pub mod exec;
pub mod grow_log;
pub mod sample;
pub mod session;
pub mod slot_ops;
pub mod state;
pub mod traffic;
pub mod weights;
pub use session::{Model, ModelError, Session, SessionOptions};
