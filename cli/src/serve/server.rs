//! The accept loop and graceful shutdown.
//!
//! On SIGTERM or SIGINT the listener closes and idle connections are closed; running
//! requests get `--shutdown-timeout` seconds to finish. After that their generations
//! are told to stop (they end with finish_reason "length"), and the process exits once
//! the last response is written or a few more seconds have passed.

use crate::serve::{routes, State};
use anyhow::{Context, Result};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A client gets this long to send a request's headers (slow-loris protection).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// After the grace period, how long stopped generations get to wind down.
const WIND_DOWN: Duration = Duration::from_secs(5);

pub async fn serve(state: Arc<State>, host: &str, port: u16, grace: Duration) -> Result<()> {
    let listener = TcpListener::bind((host, port)).await.with_context(|| format!("binding {host}:{port}"))?;
    let addr = listener.local_addr()?;
    // Tests and scripts wait for this line (with --port 0 it is the only way to learn the port).
    eprintln!("ds4 serve: listening on http://{addr} (model '{}')", state.tm.name);
    let graceful = GracefulShutdown::new();
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        eprintln!("ds4 serve: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let st = state.clone();
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service_fn(move |req| routes::handle(st.clone(), req)));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    // A client that hangs up mid-request is its own business.
                    let _ = conn.await;
                });
            }
            name = &mut signal => {
                eprintln!("ds4 serve: {name}: shutting down");
                break;
            }
        }
    }
    drop(listener);
    state.draining.store(true, Ordering::SeqCst);
    // New requests queued behind a permit will now be refused.
    state.permits.close();
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        let n = state.stats.active.load(Ordering::SeqCst);
        eprintln!("ds4 serve: {n} generation(s) still running after {:.1}s; stopping them", grace.as_secs_f64());
        state.stopping.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + WIND_DOWN;
        while state.stats.active.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Let the last events reach the sockets.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("ds4 serve: stopped");
    Ok(())
}

/// Resolves with the signal's name on SIGTERM or SIGINT.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            eprintln!("ds4 serve: cannot install signal handlers; stop the server with SIGKILL");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
