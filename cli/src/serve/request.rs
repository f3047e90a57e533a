//! Reading and checking an OpenAI request body. Everything a generation needs is
//! decided here, before any model work, so a bad request costs nothing and gets a 400
//! that names the field at fault.
//!
//! Fields this server does not know are ignored, as OpenAI-compatible servers do, so
//! that clients sending extras keep working. Known fields are checked strictly, and
//! features that are known but not provided (n > 1, logprobs, JSON output modes, echo)
//! are refused rather than silently ignored.

use crate::serve::error::ApiError;
use crate::serve::generate::GenParams;
use crate::serve::output::OutputOptions;
use crate::text_model::TextModel;
use ds4_model::chat::{self, Message, Role, ThinkMode, ToolCall, ToolSpec};
use ds4_runtime::sample::SamplerOptions;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;

/// OpenAI allows at most four stop sequences.
const MAX_STOP: usize = 4;

/// Server-wide settings a request falls back on.
#[derive(Clone, Debug)]
pub struct Defaults {
    pub think: ThinkMode,
    pub max_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub output: OutputOptions,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries the token counts.
    pub include_usage: bool,
}

/// The top-level object with each field's raw text: fields are parsed one by one (so an
/// error names its field), and tool schemas keep their original key order.
struct Fields<'a>(HashMap<String, &'a RawValue>);

impl<'a> Fields<'a> {
    fn parse(body: &'a [u8]) -> Result<Self, ApiError> {
        let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
        if text.trim().is_empty() {
            return Err(ApiError::bad_request("the request body is empty; expected a JSON object"));
        }
        let raw: &RawValue = serde_json::from_str(text).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
        if !raw.get().starts_with('{') {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        let map = serde_json::from_str(raw.get()).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
        Ok(Fields(map))
    }

    fn raw(&self, key: &str) -> Option<&'a RawValue> {
        self.0.get(key).copied().filter(|r| r.get() != "null")
    }

    /// A field's value; `null` counts as absent, as in OpenAI's API.
    fn value(&self, key: &str) -> Option<Value> {
        self.raw(key).map(|r| serde_json::from_str(r.get()).expect("a RawValue is valid JSON"))
    }

    fn number(&self, key: &str, lo: f64, hi: f64, lo_open: bool) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.value(key) else { return Ok(None) };
        let x = v.as_f64().ok_or_else(|| ApiError::bad_param(key, format!("'{key}' must be a number")))?;
        let below = if lo_open { x <= lo } else { x < lo };
        if below || x > hi {
            let open = if lo_open { "(" } else { "[" };
            return Err(ApiError::bad_param(key, format!("'{key}' is {x}; it must be in {open}{lo}, {hi}]")));
        }
        Ok(Some(x as f32))
    }

    fn integer(&self, key: &str, min: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.value(key) else { return Ok(None) };
        let x = v.as_i64().ok_or_else(|| ApiError::bad_param(key, format!("'{key}' must be an integer")))?;
        if x < min {
            return Err(ApiError::bad_param(key, format!("'{key}' is {x}; it must be at least {min}")));
        }
        Ok(Some(x))
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        let Some(v) = self.value(key) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| ApiError::bad_param(key, format!("'{key}' must be true or false")))
    }

    fn string(&self, key: &str) -> Result<Option<String>, ApiError> {
        let Some(v) = self.value(key) else { return Ok(None) };
        match v {
            Value::String(s) => Ok(Some(s)),
            _ => Err(ApiError::bad_param(key, format!("'{key}' must be a string"))),
        }
    }
}

/// `POST /v1/chat/completions`.
pub fn parse_chat(body: &[u8], tm: &TextModel, defaults: &Defaults, fallback_seed: u64) -> Result<GenRequest, ApiError> {
    let f = Fields::parse(body)?;
    let common = parse_common(&f, defaults, fallback_seed)?;
    let messages = parse_messages(&f)?;
    let tools = parse_tools(&f)?;
    let choice = parse_tool_choice(&f, &tools)?;
    let mut think = parse_think(&f, defaults.think)?.for_context(tm.model.hp.context_length.min(u32::MAX as usize) as u32);

    // A forced call is started by the prompt itself: the answer opens with the block
    // (and the invoke, for a named function), so the model can only fill it in. The
    // block must come straight after `</think>`, so thinking is off for such a turn.
    let forced_prefix = match &choice {
        ToolChoice::Required => format!("<{}tool_calls>\n", chat::DSML),
        ToolChoice::Named(name) => format!("<{d}tool_calls>\n<{d}invoke name=\"{name}\">\n", d = chat::DSML),
        ToolChoice::Auto | ToolChoice::None => String::new(),
    };
    if !forced_prefix.is_empty() {
        think = ThinkMode::Off;
    }
    let offered: &[ToolSpec] = if choice == ToolChoice::None { &[] } else { &tools };
    let text = chat::render(&messages, offered, think) + &forced_prefix;
    let prompt = tm.tok.encode_chat(&text);
    check_length(&prompt, tm)?;

    let mut stop_ids = vec![tm.tok.eos()];
    // A model that starts the next user turn has finished its own.
    stop_ids.extend(tm.tok.token_to_id(chat::USER));
    Ok(GenRequest {
        prompt,
        params: GenParams { sampler: common.sampler, max_tokens: common.max_tokens, stop_ids },
        output: OutputOptions { thinking: think.thinking(), tools: !offered.is_empty(), stop: common.stop, forced_prefix },
        stream: common.stream,
        include_usage: common.include_usage,
    })
}

/// `POST /v1/completions`: a raw prompt, text or token ids; no chat template.
pub fn parse_completion(body: &[u8], tm: &TextModel, defaults: &Defaults, fallback_seed: u64) -> Result<GenRequest, ApiError> {
    let f = Fields::parse(body)?;
    let common = parse_common(&f, defaults, fallback_seed)?;
    if f.boolean("echo")? == Some(true) {
        return Err(ApiError::bad_param("echo", "'echo' is not supported"));
    }
    if f.value("suffix").is_some() {
        return Err(ApiError::bad_param("suffix", "'suffix' is not supported"));
    }
    if f.integer("best_of", 1)?.is_some_and(|b| b != 1) {
        return Err(ApiError::bad_param("best_of", "only best_of = 1 is supported"));
    }
    let mut prompt = match f.value("prompt") {
        None => return Err(ApiError::bad_param("prompt", "'prompt' is required")),
        Some(v) => prompt_ids(v, tm)?,
    };
    // The model was trained with BOS first; text prompts rarely spell it out.
    if prompt.first() != Some(&tm.tok.bos()) {
        prompt.insert(0, tm.tok.bos());
    }
    check_length(&prompt, tm)?;
    Ok(GenRequest {
        prompt,
        params: GenParams { sampler: common.sampler, max_tokens: common.max_tokens, stop_ids: vec![tm.tok.eos()] },
        output: OutputOptions { thinking: false, tools: false, stop: common.stop, forced_prefix: String::new() },
        stream: common.stream,
        include_usage: common.include_usage,
    })
}

/// A completion prompt: a string, a one-string array, an array of token ids, or a
/// one-element array of those.
fn prompt_ids(v: Value, tm: &TextModel) -> Result<Vec<u32>, ApiError> {
    let bad = || ApiError::bad_param("prompt", "'prompt' must be a string or an array of token ids (batches of prompts are not supported)");
    let ids = match v {
        Value::String(s) => return Ok(tm.tok.encode(&s)),
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] => return Ok(tm.tok.encode(s)),
            [Value::Array(inner)] => inner.clone(),
            _ if items.iter().all(Value::is_number) => items,
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    let vocab = tm.model.hp.vocab;
    ids.iter()
        .map(|x| match x.as_u64() {
            Some(t) if (t as usize) < vocab => Ok(t as u32),
            _ => Err(ApiError::bad_param("prompt", format!("prompt token {x} is not an id of this model (vocabulary {vocab})"))),
        })
        .collect()
}

fn check_length(prompt: &[u32], tm: &TextModel) -> Result<(), ApiError> {
    let ctx = tm.model.hp.context_length;
    if prompt.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    if prompt.len() >= ctx {
        return Err(ApiError::bad_request(format!("the prompt is {} tokens; this model's context is {ctx}", prompt.len()))
            .with_code("context_length_exceeded"));
    }
    Ok(())
}

/// What both endpoints share: sampling, limits, stop strings, streaming.
struct Common {
    sampler: SamplerOptions,
    max_tokens: usize,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
}

fn parse_common(f: &Fields, defaults: &Defaults, fallback_seed: u64) -> Result<Common, ApiError> {
    if f.value("model").is_some() {
        f.string("model")?; // any name is served by the one model
    }
    let base = SamplerOptions::default();
    let sampler = SamplerOptions {
        // OpenAI's default temperature is 1.
        temperature: f.number("temperature", 0.0, 2.0, false)?.unwrap_or(1.0),
        top_p: f.number("top_p", 0.0, 1.0, true)?.unwrap_or(base.top_p),
        min_p: f.number("min_p", 0.0, 1.0, false)?.unwrap_or(base.min_p),
        // Negative seeds are valid in OpenAI's API; only the bits matter here.
        seed: match f.value("seed") {
            None => fallback_seed,
            Some(v) => v.as_i64().map(|s| s as u64).or(v.as_u64()).ok_or_else(|| ApiError::bad_param("seed", "'seed' must be an integer"))?,
        },
    };
    for key in ["frequency_penalty", "presence_penalty"] {
        if f.number(key, -2.0, 2.0, false)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::bad_param(key, format!("'{key}' is not supported (only 0)")));
        }
    }
    // `max_completion_tokens` is the newer name; either may be sent.
    let max_tokens = match (f.integer("max_completion_tokens", 1)?, f.integer("max_tokens", 1)?) {
        (Some(n), _) | (None, Some(n)) => n as usize,
        (None, None) => defaults.max_tokens,
    };
    if f.integer("n", 1)?.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is supported"));
    }
    if f.boolean("logprobs")? == Some(true) || f.value("top_logprobs").is_some() {
        return Err(ApiError::bad_param("logprobs", "log probabilities are not supported"));
    }
    if let Some(rf) = f.value("response_format") {
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some(other) => return Err(ApiError::bad_param("response_format", format!("response_format '{other}' is not supported; only 'text'"))),
            None => return Err(ApiError::bad_param("response_format", "'response_format' must be an object with a 'type'")),
        }
    }
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = match f.value("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            if !stream {
                return Err(ApiError::bad_param("stream_options", "'stream_options' is only allowed with 'stream': true"));
            }
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::bad_param("stream_options.include_usage", "'include_usage' must be true or false")),
            }
        }
        Some(_) => return Err(ApiError::bad_param("stream_options", "'stream_options' must be an object")),
    };
    Ok(Common { sampler, max_tokens, stop: parse_stop(f)?, stream, include_usage })
}

fn parse_stop(f: &Fields) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad_param("stop", format!("'stop' must be a string or an array of at most {MAX_STOP} non-empty strings"));
    let stops = match f.value("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(a)) if a.len() <= MAX_STOP => {
            a.into_iter().map(|v| if let Value::String(s) = v { Ok(s) } else { Err(bad()) }).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(bad()),
    };
    if stops.iter().any(String::is_empty) {
        return Err(bad());
    }
    Ok(stops)
}

/// Thinking: `reasoning_effort` ("none", "high", "max", …, OpenAI's name) or
/// `thinking` (DeepSeek's `{"type": "enabled" | "disabled"}`, or a plain boolean).
fn parse_think(f: &Fields, default: ThinkMode) -> Result<ThinkMode, ApiError> {
    if let Some(e) = f.string("reasoning_effort")? {
        return ThinkMode::parse(&e).ok_or_else(|| {
            ApiError::bad_param("reasoning_effort", format!("unknown reasoning_effort '{e}'; use none, low, medium, high or max"))
        });
    }
    let bad = || ApiError::bad_param("thinking", "'thinking' must be true, false or {\"type\": \"enabled\" | \"disabled\"}");
    match f.value("thinking") {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(if b { ThinkMode::On } else { ThinkMode::Off }),
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("enabled") => Ok(ThinkMode::On),
            Some("disabled") => Ok(ThinkMode::Off),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

fn parse_messages(f: &Fields) -> Result<Vec<Message>, ApiError> {
    let items = match f.value("messages") {
        None => return Err(ApiError::bad_param("messages", "'messages' is required")),
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => return Err(ApiError::bad_param("messages", "'messages' must be a non-empty array")),
    };
    let messages = items.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect::<Result<Vec<_>, _>>()?;
    // The prompt must end by handing the turn to the assistant.
    match messages.iter().rev().find(|m| m.role != Role::System) {
        Some(m) if matches!(m.role, Role::User | Role::Tool) => Ok(messages),
        _ => Err(ApiError::bad_param("messages", "the last non-system message must be from the user or a tool")),
    }
}

fn parse_message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = |field: &str| format!("messages[{i}]{field}");
    let obj = m.as_object().ok_or_else(|| ApiError::bad_param(&at(""), format!("messages[{i}] must be an object")))?;
    let role_name = obj.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::bad_param(&at(".role"), format!("messages[{i}] has no string 'role'")))?;
    let role = Role::parse(role_name).ok_or_else(|| {
        ApiError::bad_param(&at(".role"), format!("messages[{i}].role '{role_name}' is not one of system, developer, user, assistant, tool"))
    })?;
    let content = match obj.get("content") {
        None | Some(Value::Null) if role == Role::Assistant => String::new(),
        None | Some(Value::Null) => return Err(ApiError::bad_param(&at(".content"), format!("messages[{i}] has no content"))),
        Some(c) => content_text(c).map_err(|why| ApiError::bad_param(&at(".content"), format!("messages[{i}].content {why}")))?,
    };
    let mut msg = Message::new(role, content);
    if role == Role::Assistant {
        if let Some(r) = obj.get("reasoning_content").filter(|v| !v.is_null()) {
            let r = r.as_str().ok_or_else(|| ApiError::bad_param(&at(".reasoning_content"), "'reasoning_content' must be a string"))?;
            msg = msg.with_reasoning(r);
        }
        if let Some(calls) = obj.get("tool_calls").filter(|v| !v.is_null()) {
            msg = msg.with_tool_calls(parse_history_tool_calls(calls).map_err(|why| ApiError::bad_param(&at(".tool_calls"), format!("messages[{i}].tool_calls {why}")))?);
        }
    }
    Ok(msg)
}

/// Message content: a string, or an array of text parts.
fn content_text(c: &Value) -> Result<String, String> {
    match c {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => return Err(format!("has a '{other}' part; only text is supported")),
                    _ => return Err("parts must be {\"type\": \"text\", \"text\": …}".into()),
                }
            }
            Ok(text)
        }
        _ => Err("must be a string or an array of text parts".into()),
    }
}

/// An assistant turn's past tool calls, as a client sends them back.
fn parse_history_tool_calls(v: &Value) -> Result<Vec<ToolCall>, String> {
    let calls = v.as_array().ok_or("must be an array")?;
    calls
        .iter()
        .map(|c| {
            let func = c.get("function").and_then(Value::as_object).ok_or("entries need a 'function' object")?;
            let name = func.get("name").and_then(Value::as_str).ok_or("functions need a string 'name'")?;
            let args = match func.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(obj @ Value::Object(_)) => obj.to_string(),
                Some(_) => return Err("'arguments' must be a JSON string".to_string()),
            };
            Ok(ToolCall::new(name, args))
        })
        .collect()
}

fn parse_tools(f: &Fields) -> Result<Vec<ToolSpec>, ApiError> {
    let Some(raw) = f.raw("tools") else { return Ok(Vec::new()) };
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| ApiError::bad_param("tools", "'tools' must be an array"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v: Value = serde_json::from_str(t.get()).expect("a RawValue is valid JSON");
            let bad = |why: &str| ApiError::bad_param(&format!("tools[{i}]"), format!("tools[{i}] {why}"));
            if !v.is_object() {
                return Err(bad("must be an object"));
            }
            match v.get("type").and_then(Value::as_str) {
                Some("function") => {}
                _ => return Err(bad("must have \"type\": \"function\"")),
            }
            if !v.get("function").is_some_and(Value::is_object) {
                return Err(bad("must have a 'function' object"));
            }
            // OpenAI's rule for function names; it also keeps them safe inside DSML tags.
            let name = v.pointer("/function/name").and_then(Value::as_str).unwrap_or("");
            let valid = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                return Err(bad("needs a function 'name' of 1 to 64 letters, digits, '_' or '-'"));
            }
            ToolSpec::from_json(t.get()).map_err(|e| bad(&format!("is not a usable function: {e}")))
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

fn parse_tool_choice(f: &Fields, tools: &[ToolSpec]) -> Result<ToolChoice, ApiError> {
    let bad = |msg: String| ApiError::bad_param("tool_choice", msg);
    let choice = match f.value("tool_choice") {
        None => return Ok(if tools.is_empty() { ToolChoice::None } else { ToolChoice::Auto }),
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(bad(format!("tool_choice '{other}' is not one of none, auto, required"))),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str);
            match (v.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => ToolChoice::Named(n.to_string()),
                _ => return Err(bad("tool_choice must be {\"type\": \"function\", \"function\": {\"name\": …}}".into())),
            }
        }
        Some(_) => return Err(bad("'tool_choice' must be a string or an object".into())),
    };
    match &choice {
        ToolChoice::Auto | ToolChoice::Required if tools.is_empty() => Err(bad("tool_choice needs 'tools'".into())),
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => Err(bad(format!("tool_choice names '{n}', which is not in 'tools'"))),
        _ => Ok(choice),
    }
}
