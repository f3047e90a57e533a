//! ds4-runtime: weights, the graph executor, per-session state, sessions and sampling.

/// Whether the measuring switch `$var` (an environment variable; every switch is on by
/// default) is set to `0`, read once.
macro_rules! switched_off {
    ($var:literal) => {{
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OFF.get_or_init(|| std::env::var($var).as_deref() == Ok("0"))
    }};
}

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
