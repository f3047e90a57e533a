//! Unpredictable ids (`chatcmpl-…`, `call_…`) and default seeds, without a random-number
//! crate: std's `RandomState` is seeded from the OS once per process and perturbed per
//! instance, and a counter makes consecutive values distinct.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// `bytes` random bytes as lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes * 2);
    while s.len() < bytes * 2 {
        s.push_str(&format!("{:016x}", random_u64()));
    }
    s.truncate(bytes * 2);
    s
}
