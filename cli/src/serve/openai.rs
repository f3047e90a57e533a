//! The OpenAI response shapes, and the two ways a generation reaches its client: as
//! server-sent events while it runs, or collected into one JSON object at the end.

use crate::serve::error::ApiError;
use crate::serve::output::Piece;
use crate::serve::request::Endpoint;
use bytes::Bytes;
use ds4_model::chat::ToolCall;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

/// What every response object of one request repeats.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// Where a running generation sends what it produces. Every method returns quickly:
/// the generation thread calls them between tokens.
pub trait Sink: Send {
    fn piece(&mut self, p: Piece);
    fn finish(&mut self, calls: Vec<ToolCall>, finish_reason: &str, usage: Usage);
    fn fail(&mut self, err: ApiError);
    /// The client is gone: nothing more will be read.
    fn closed(&self) -> bool;
}

fn tool_calls_json(calls: &[ToolCall], with_index: bool) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": format!("call_{}", crate::serve::ids::random_hex(12)),
                "type": "function",
                "function": { "name": c.name, "arguments": c.arguments },
            });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect();
    Value::Array(calls)
}

/// Server-sent events: one `data: {json}` event per chunk, `data: [DONE]` at the end.
pub struct StreamSink {
    meta: Meta,
    tx: mpsc::Sender<Bytes>,
    include_usage: bool,
}

impl StreamSink {
    /// Sends the opening chunk (the assistant role) right away, so the client sees the
    /// response start before the prompt is processed.
    pub fn new(meta: Meta, tx: mpsc::Sender<Bytes>, include_usage: bool) -> Self {
        let mut s = StreamSink { meta, tx, include_usage };
        if s.meta.endpoint == Endpoint::Chat {
            s.chunk(json!({ "role": "assistant", "content": "" }), None);
        }
        s
    }

    fn send(&mut self, event: String) {
        // A failed send means the client is gone; `closed()` tells the generation.
        let _ = self.tx.blocking_send(Bytes::from(event));
    }

    fn send_json(&mut self, v: &Value) {
        self.send(format!("data: {v}\n\n"));
    }

    /// One chunk with a chat `delta` (or completion `text`) and a finish reason.
    fn chunk(&mut self, delta: Value, finish_reason: Option<&str>) {
        let m = &self.meta;
        let v = match m.endpoint {
            Endpoint::Chat => json!({
                "id": m.id, "object": "chat.completion.chunk", "created": m.created, "model": m.model,
                "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason }],
            }),
            Endpoint::Completion => json!({
                "id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
                "choices": [{ "index": 0, "text": delta, "logprobs": null, "finish_reason": finish_reason }],
            }),
        };
        self.send_json(&v);
    }
}

impl Sink for StreamSink {
    fn piece(&mut self, p: Piece) {
        let delta = match (self.meta.endpoint, p) {
            (Endpoint::Chat, Piece::Reasoning(s)) => json!({ "reasoning_content": s }),
            (Endpoint::Chat, Piece::Content(s)) => json!({ "content": s }),
            (Endpoint::Completion, Piece::Reasoning(s) | Piece::Content(s)) => json!(s),
        };
        self.chunk(delta, None);
    }

    fn finish(&mut self, calls: Vec<ToolCall>, finish_reason: &str, usage: Usage) {
        if !calls.is_empty() {
            self.chunk(json!({ "tool_calls": tool_calls_json(&calls, true) }), None);
        }
        let empty = if self.meta.endpoint == Endpoint::Chat { json!({}) } else { json!("") };
        self.chunk(empty, Some(finish_reason));
        if self.include_usage {
            let m = &self.meta;
            let object = if m.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
            let v = json!({ "id": m.id, "object": object, "created": m.created, "model": m.model, "choices": [], "usage": usage.json() });
            self.send_json(&v);
        }
        self.send("data: [DONE]\n\n".into());
    }

    fn fail(&mut self, err: ApiError) {
        // The status line is long gone: the error travels as an event, and the stream
        // ends without [DONE].
        self.send_json(&err.body());
    }

    fn closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The whole response as one object, handed over when the generation ends.
pub struct CollectSink {
    meta: Meta,
    tx: Option<oneshot::Sender<Result<Value, ApiError>>>,
    reasoning: String,
    content: String,
}

impl CollectSink {
    pub fn new(meta: Meta, tx: oneshot::Sender<Result<Value, ApiError>>) -> Self {
        CollectSink { meta, tx: Some(tx), reasoning: String::new(), content: String::new() }
    }

    fn deliver(&mut self, r: Result<Value, ApiError>) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(r);
        }
    }
}

impl Sink for CollectSink {
    fn piece(&mut self, p: Piece) {
        match p {
            Piece::Reasoning(s) => self.reasoning.push_str(&s),
            Piece::Content(s) => self.content.push_str(&s),
        }
    }

    fn finish(&mut self, calls: Vec<ToolCall>, finish_reason: &str, usage: Usage) {
        let m = &self.meta;
        let v = match m.endpoint {
            Endpoint::Chat => {
                let mut message = json!({ "role": "assistant", "content": self.content });
                if !self.reasoning.is_empty() {
                    message["reasoning_content"] = json!(self.reasoning);
                }
                if !calls.is_empty() {
                    message["tool_calls"] = tool_calls_json(&calls, false);
                    if self.content.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({
                    "id": m.id, "object": "chat.completion", "created": m.created, "model": m.model,
                    "choices": [{ "index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason }],
                    "usage": usage.json(),
                })
            }
            Endpoint::Completion => json!({
                "id": m.id, "object": "text_completion", "created": m.created, "model": m.model,
                "choices": [{ "index": 0, "text": self.content, "logprobs": null, "finish_reason": finish_reason }],
                "usage": usage.json(),
            }),
        };
        self.deliver(Ok(v));
    }

    fn fail(&mut self, err: ApiError) {
        self.deliver(Err(err));
    }

    fn closed(&self) -> bool {
        self.tx.as_ref().is_none_or(|tx| tx.is_closed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(endpoint: Endpoint) -> Meta {
        Meta { id: "chatcmpl-x".into(), created: 1, model: "m".into(), endpoint }
    }

    fn call() -> ToolCall {
        ToolCall::new("get_weather", "{\"city\": \"Paris\"}")
    }

    #[test]
    fn collected_chat_with_tool_calls() {
        let (tx, mut rx) = oneshot::channel();
        let mut s = CollectSink::new(meta(Endpoint::Chat), tx);
        s.piece(Piece::Reasoning("think".into()));
        s.finish(vec![call()], "tool_calls", Usage { prompt_tokens: 5, completion_tokens: 7 });
        let v = rx.try_recv().unwrap().unwrap();
        let m = &v["choices"][0]["message"];
        assert_eq!(m["content"], Value::Null, "no text besides the call");
        assert_eq!(m["reasoning_content"], "think");
        assert_eq!(m["tool_calls"][0]["type"], "function");
        assert!(m["tool_calls"][0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(m["tool_calls"][0]["function"], json!({ "name": "get_weather", "arguments": "{\"city\": \"Paris\"}" }));
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(v["usage"]["total_tokens"], 12);
    }

    #[test]
    fn streamed_chat_events() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut s = StreamSink::new(meta(Endpoint::Chat), tx, true);
        s.piece(Piece::Content("Hi".into()));
        s.finish(vec![call()], "tool_calls", Usage { prompt_tokens: 1, completion_tokens: 2 });
        let mut events = Vec::new();
        while let Ok(b) = rx.try_recv() {
            let text = String::from_utf8(b.to_vec()).unwrap();
            events.push(text.strip_prefix("data: ").unwrap().strip_suffix("\n\n").unwrap().to_string());
        }
        assert_eq!(events.len(), 6, "{events:?}");
        assert_eq!(events[5], "[DONE]");
        let v: Vec<Value> = events[..5].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert_eq!(v[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v[1]["choices"][0]["delta"]["content"], "Hi");
        assert_eq!(v[2]["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(v[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(v[4]["usage"]["completion_tokens"], 2);
        assert!(v.iter().all(|c| c["object"] == "chat.completion.chunk"));
    }

    #[test]
    fn a_dropped_receiver_reads_as_closed() {
        let (tx, rx) = mpsc::channel(1);
        let s = StreamSink { meta: meta(Endpoint::Completion), tx, include_usage: false };
        assert!(!s.closed());
        drop(rx);
        assert!(s.closed());
    }
}
