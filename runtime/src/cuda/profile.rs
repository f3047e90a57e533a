//! `DS4_PROFILE=1`: device time per op kind, for finding where a step's time goes. Each
//! node is followed by a device synchronize, so the totals are exact per op but the run
//! is slower than without profiling. `ds4 bench` prints the table at the end.
//!
//! `DS4_PROFILE=label`: as `1`, per op and node label (layer numbers folded to `#`), to
//! tell apart the matmuls of one op kind.
//!
//! `DS4_PROFILE=host`: no synchronization; each op's time is what the host spends on it
//! (graph walking, argument matching, launches, and the waits of the ops that read
//! results back). Where this total is close to the run's time, the host is the limit.

use super::device::{CudaError, Device};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Off, device time per op (synchronizing; per label too), or host time per op.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Device,
    Labels,
    Host,
}

fn mode() -> Mode {
    static ON: OnceLock<Mode> = OnceLock::new();
    *ON.get_or_init(|| match std::env::var("DS4_PROFILE").as_deref() {
        Ok("host") => Mode::Host,
        Ok("label") => Mode::Labels,
        Ok(v) if v != "0" && !v.is_empty() => Mode::Device,
        _ => Mode::Off,
    })
}

/// (calls, seconds) per op name.
static TOTALS: Mutex<Option<HashMap<String, (u64, f64)>>> = Mutex::new(None);

/// The start of a node's work (None when profiling is off).
pub fn start(dev: &Device) -> Result<Option<Instant>, CudaError> {
    match mode() {
        Mode::Off => return Ok(None),
        Mode::Device | Mode::Labels => dev.synchronize()?,
        Mode::Host => {}
    }
    Ok(Some(Instant::now()))
}

pub fn stop(dev: &Device, t: Option<Instant>, op: &'static str, label: &str) -> Result<(), CudaError> {
    let Some(t) = t else { return Ok(()) };
    if matches!(mode(), Mode::Device | Mode::Labels) {
        dev.synchronize()?;
    }
    let dt = t.elapsed().as_secs_f64();
    let key = if mode() == Mode::Labels {
        let folded: String = label.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
        format!("{op} {folded}")
    } else {
        op.to_string()
    };
    if let Ok(mut g) = TOTALS.lock() {
        let e = g.get_or_insert_with(HashMap::new).entry(key).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += dt;
    }
    Ok(())
}

/// The table so far (op, calls, seconds, share), most expensive first; empty when off.
pub fn report() -> String {
    let Ok(mut g) = TOTALS.lock() else { return String::new() };
    let Some(m) = g.take() else { return String::new() };
    let total: f64 = m.values().map(|v| v.1).sum();
    let mut rows: Vec<_> = m.into_iter().collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(18);
    let mut out = format!("{:<w$} {:>9} {:>10} {:>6}\n", "op", "calls", "seconds", "share");
    for (op, (n, s)) in rows {
        out += &format!("{op:<w$} {n:>9} {s:>10.4} {:>5.1}%\n", 100.0 * s / total.max(1e-12));
    }
    out
}
