//! HTTP plumbing: the response body type (whole, or a stream of events fed by a
//! generation thread), JSON responses, and reading a request body within a size limit.

use crate::serve::error::ApiError;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// A response body. When hyper drops a `Stream` body (the client went away), the
/// receiver goes with it, and the generation thread sees its channel closed.
pub enum Body {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    /// Exact for a whole body, so hyper sends Content-Length instead of chunks.
    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Full(b) => hyper::body::SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

pub fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Body::Full(Some(Bytes::from(v.to_string()))));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub fn error(e: &ApiError) -> Response<Body> {
    json(e.status, &e.body())
}

pub fn event_stream(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(Body::Stream(rx));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The whole request body, refused with a 413 past `limit` bytes: at once when the
/// declared length says so, else as soon as the bytes read pass it.
pub async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_request(format!("could not read the request body: {e}"))),
    }
}
