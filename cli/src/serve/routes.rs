//! Request routing and the endpoint handlers.
//!
//! | route | |
//! |---|---|
//! | `GET /health` | liveness and counters (active, queued, completed, cancelled) |
//! | `GET /v1/models`, `GET /v1/models/{id}` | the one model this server runs |
//! | `POST /v1/chat/completions` | chat, streamed (SSE) or not |
//! | `POST /v1/completions` | raw text completion, streamed or not |
//!
//! The `/v1` prefix is optional, as several OpenAI-compatible servers allow.

use crate::serve::error::ApiError;
use crate::serve::http::{self, Body};
use crate::serve::openai::{CollectSink, Meta, Sink, StreamSink};
use crate::serve::request::{self, Endpoint, GenRequest};
use crate::serve::{ids, job, State};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Server-sent events waiting to be written, per stream. Small: when a client reads
/// slowly, the generation waits instead of piling up text.
const STREAM_BUFFER: usize = 32;

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let route = path.strip_prefix("/v1").filter(|r| r.starts_with('/')).unwrap_or(&path);
    let res = match (req.method(), route) {
        (&Method::GET, "/health") => Ok(health(&state)),
        (&Method::GET, "/models") => Ok(models(&state)),
        (&Method::GET, r) if r.starts_with("/models/") => model(&state, &percent_decode(&r["/models/".len()..])),
        (&Method::POST, "/chat/completions") => generate(state, req, Endpoint::Chat).await,
        (&Method::POST, "/completions") => generate(state, req, Endpoint::Completion).await,
        (m, "/health" | "/models" | "/chat/completions" | "/completions") => {
            Err(ApiError::method_not_allowed(format!("{m} is not allowed on {path}")))
        }
        _ => Err(ApiError::not_found(format!("no route for {path}"))),
    };
    Ok(res.unwrap_or_else(|e| http::error(&e)))
}

fn health(state: &State) -> Response<Body> {
    let s = &state.stats;
    http::json(
        StatusCode::OK,
        &json!({
            "status": if state.draining.load(Ordering::Relaxed) { "shutting_down" } else { "ok" },
            "model": state.tm.name,
            "active": s.active.load(Ordering::SeqCst),
            "queued": s.queued.load(Ordering::SeqCst),
            "completed": s.completed.load(Ordering::SeqCst),
            "cancelled": s.cancelled.load(Ordering::SeqCst),
        }),
    )
}

fn model_json(state: &State) -> serde_json::Value {
    json!({ "id": state.tm.name, "object": "model", "created": state.started, "owned_by": "ds4" })
}

fn models(state: &State) -> Response<Body> {
    http::json(StatusCode::OK, &json!({ "object": "list", "data": [model_json(state)] }))
}

fn model(state: &State, id: &str) -> Result<Response<Body>, ApiError> {
    if id == state.tm.name {
        Ok(http::json(StatusCode::OK, &model_json(state)))
    } else {
        Err(ApiError::not_found(format!("the model '{id}' does not exist")).with_code("model_not_found"))
    }
}

async fn generate(state: Arc<State>, req: Request<Incoming>, endpoint: Endpoint) -> Result<Response<Body>, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let body = http::read_body(req, state.max_body).await?;
    // Tokenizing a long prompt is real work: keep it off the I/O threads.
    let st = state.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        let seed = ids::random_u64();
        match endpoint {
            Endpoint::Chat => request::parse_chat(&body, st.tm, &st.defaults, seed),
            Endpoint::Completion => request::parse_completion(&body, st.tm, &st.defaults, seed),
        }
    })
    .await
    .map_err(|e| ApiError::internal(format!("request parsing failed: {e}")))??;

    // Wait for a generation slot. A client that leaves meanwhile drops this future,
    // and its place in the queue with it.
    state.stats.queued.fetch_add(1, Ordering::SeqCst);
    let permit = state.permits.clone().acquire_owned().await;
    state.stats.queued.fetch_sub(1, Ordering::SeqCst);
    let permit = permit.map_err(|_| ApiError::unavailable("the server is shutting down"))?;

    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let meta = Meta { id: format!("{prefix}-{}", ids::random_hex(12)), created: unix_now(), model: state.tm.name.clone(), endpoint };
    let stream = parsed.stream;
    if stream {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let include_usage = parsed.include_usage;
        spawn_job(state, parsed, permit, move |meta| Box::new(StreamSink::new(meta, tx, include_usage)), meta);
        Ok(http::event_stream(rx))
    } else {
        let (tx, rx) = oneshot::channel();
        spawn_job(state, parsed, permit, move |meta| Box::new(CollectSink::new(meta, tx)), meta);
        match rx.await {
            Ok(Ok(v)) => Ok(http::json(StatusCode::OK, &v)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ApiError::internal("the generation ended without a result")),
        }
    }
}

/// Run the job on a blocking thread; the sink is made there because a streaming sink
/// sends its first event as it is made, with a blocking send.
fn spawn_job(
    state: Arc<State>,
    req: GenRequest,
    permit: tokio::sync::OwnedSemaphorePermit,
    make_sink: impl FnOnce(Meta) -> Box<dyn Sink> + Send + 'static,
    meta: Meta,
) {
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let id = meta.id.clone();
        job::run(&state, &id, req, make_sink(meta));
    });
}

/// `%XX` escapes in a path segment (model names may hold spaces); anything malformed
/// is kept as written.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).and_then(|&c| hex(c)), b.get(i + 2).and_then(|&c| hex(c))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
