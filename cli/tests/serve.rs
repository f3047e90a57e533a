//! `ds4 serve` and `ds4 chat` driven from outside, as a client would: the real binary on
//! a free loopback port, raw HTTP/1.1 over a TCP socket (so SSE framing, status codes
//! and disconnects are exactly what goes over the wire), and the `openai` Python client
//! (tests/python/test_server_openai.py).
//!
//! The server runs the embedded default model (random weights, the DS4 tokenizer): its
//! text is noise but deterministic at temperature 0, which is what these tests compare.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const IO_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `ds4 serve`, killed when dropped.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::try_start(extra).unwrap_or_else(|(code, log)| panic!("ds4 serve did not start (exit {code:?}): {log}"))
    }

    /// A server, or the exit code and log of one that did not start.
    fn try_start(extra: &[&str]) -> Result<Server, (Option<i32>, String)> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ds4"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting ds4 serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        // Keep draining stderr (a full pipe would block the server); report the address.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                log2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => Ok(Server { child, addr, log }),
            // The server ended (or never listened): its exit code and log.
            Err(_) => {
                let _ = child.kill();
                let code = child.wait().ok().and_then(|s| s.code());
                let log = log.lock().unwrap().clone();
                Err((code, log))
            }
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connecting to ds4 serve");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s
    }

    /// One request on its own connection; the response read to the end.
    fn raw(&self, request: &[u8]) -> Resp {
        let mut s = self.connect();
        // The server may answer (e.g. 413) and close before reading everything we sent,
        // so a failed write is not an error here; the response decides.
        let _ = s.write_all(request);
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        Resp::parse(&buf)
    }

    fn request(&self, method: &str, path: &str, body: &[u8]) -> Resp {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.addr,
            body.len()
        );
        self.raw(&[head.as_bytes(), body].concat())
    }

    fn post(&self, path: &str, body: &Value) -> Resp {
        self.request("POST", path, body.to_string().as_bytes())
    }

    fn get(&self, path: &str) -> Resp {
        self.request("GET", path, b"")
    }

    fn health(&self) -> Value {
        let r = self.get("/health");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn parse(buf: &[u8]) -> Resp {
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no HTTP response head in {:?}", String::from_utf8_lossy(buf)));
        let head = String::from_utf8_lossy(&buf[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> =
            lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
        let raw = &buf[split + 4..];
        let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked { dechunk(raw) } else { raw.to_vec() };
        Resp { status, headers, body }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The `data:` payloads of an event stream, in order.
    fn events(&self) -> Vec<String> {
        sse_events(&self.text())
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        let end = (start + size).min(raw.len());
        out.extend_from_slice(&raw[start..end]);
        raw = &raw[(end + 2).min(raw.len())..];
    }
    out
}

fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
}

/// A stream's chunks (without `[DONE]`) as JSON, and whether `[DONE]` ended it.
fn chunks(events: &[String]) -> (Vec<Value>, bool) {
    let done = events.last().map(String::as_str) == Some("[DONE]");
    let v = events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("bad chunk {e}"))).collect();
    (v, done)
}

/// Concatenated `delta.content` and `delta.reasoning_content` of a chat stream, and the
/// finish reason.
fn stream_text(chunks: &[Value]) -> (String, String, Option<String>) {
    let (mut content, mut reasoning, mut finish) = (String::new(), String::new(), None);
    for c in chunks {
        for ch in c["choices"].as_array().unwrap() {
            if let Some(s) = ch["delta"]["content"].as_str() {
                content += s;
            }
            if let Some(s) = ch["delta"]["reasoning_content"].as_str() {
                reasoning += s;
            }
            if let Some(s) = ch["text"].as_str() {
                content += s;
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (content, reasoning, finish)
}

fn chat_body(user: &str, max_tokens: u32, extra: Value) -> Value {
    let mut b = json!({ "model": "ds4", "messages": [{ "role": "user", "content": user }], "max_tokens": max_tokens, "temperature": 0 });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn health_models_and_chat_streamed_and_not() {
    let s = Server::start(&[]);
    assert_eq!(s.health()["status"], "ok");
    let models = s.get("/v1/models").json();
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["object"], "list");
    assert_eq!(s.get(&format!("/v1/models/{}", id.replace(' ', "%20").replace('(', "%28").replace(')', "%29"))).status, 200);

    // Non-streamed, thinking off.
    let body = chat_body("Hello!", 12, json!({ "reasoning_effort": "none" }));
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], id.as_str());
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap().to_string();
    assert!(msg.get("reasoning_content").is_none());
    // BOS <｜User｜> Hello ! <｜Assistant｜> </think>: the golden rendering of this turn.
    assert_eq!(v["usage"]["prompt_tokens"], 6);
    let gen = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&gen));
    assert_eq!(v["usage"]["total_tokens"].as_u64().unwrap(), 6 + gen);
    if gen == 12 {
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }

    // The same streamed: the deltas add up to the same text.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({ "include_usage": true });
    let r = s.post("/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let (cs, done) = chunks(&r.events());
    assert!(done, "the stream ends with [DONE]: {}", r.text());
    assert_eq!(cs[0]["object"], "chat.completion.chunk");
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(cs.iter().all(|c| c["id"] == cs[0]["id"]));
    let (text, reasoning, finish) = stream_text(&cs);
    assert_eq!(text, content);
    assert!(reasoning.is_empty());
    assert_eq!(finish.as_deref(), v["choices"][0]["finish_reason"].as_str());
    let usage_chunk = cs.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], v["usage"]);

    // Thinking on: the text before </think> is reasoning_content, streamed or not.
    let tbody = chat_body("Hello!", 10, json!({ "reasoning_effort": "high" }));
    let v = s.post("/v1/chat/completions", &tbody).json();
    let m = &v["choices"][0]["message"];
    let mut stbody = tbody.clone();
    stbody["stream"] = json!(true);
    let (cs, _) = chunks(&s.post("/v1/chat/completions", &stbody).events());
    let (text, reasoning, _) = stream_text(&cs);
    assert_eq!(reasoning, m["reasoning_content"].as_str().unwrap_or(""));
    assert_eq!(text, m["content"].as_str().unwrap());
    assert!(!reasoning.is_empty() || !text.is_empty());

    // Raw completions, streamed and not.
    let cbody = json!({ "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0 });
    let v = s.post("/v1/completions", &cbody).json();
    assert_eq!(v["object"], "text_completion");
    let mut scbody = cbody.clone();
    scbody["stream"] = json!(true);
    let (cs, done) = chunks(&s.post("/v1/completions", &scbody).events());
    assert!(done);
    assert_eq!(stream_text(&cs).0, v["choices"][0]["text"].as_str().unwrap());
}

/// `--backend cuda` (weights packed: `scripts/gpu-check.sh` serves with the default
/// placement): without a CUDA device a clear error and exit code 1; with one, the
/// requests run on the GPU, deterministic at temperature 0.
#[test]
fn serve_on_cuda_answers_or_says_why_not() {
    match Server::try_start(&["--backend", "cuda", "--pack-weights"]) {
        Err((code, log)) => {
            assert_eq!(code, Some(1), "exit {code:?} (a panic exits 101): {log}");
            assert!(log.contains("--backend cuda"), "{log}");
            // Past the harness's capture (it takes eprint!, not the stream), as the GPU tests say it.
            let _ = writeln!(std::io::stderr(), "skipped: no CUDA device ({})", log.lines().last().unwrap_or(""));
        }
        Ok(s) => {
            assert!(s.log().contains("cuda backend on"), "{}", s.log());
            let body = chat_body("Hello!", 12, json!({ "reasoning_effort": "none" }));
            let (a, b) = (s.post("/v1/chat/completions", &body), s.post("/v1/chat/completions", &body));
            assert_eq!((a.status, b.status), (200, 200), "{} / {}", a.text(), b.text());
            let content = |r: &Resp| r.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
            assert_eq!(content(&a), content(&b), "temperature 0 on the GPU");
            assert!(a.json()["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
        }
    }
}

#[test]
fn sampling_parameters_and_stop_strings() {
    let s = Server::start(&[]);
    let content = |b: &Value| {
        let v = s.post("/v1/chat/completions", b).json();
        (v["choices"][0]["message"]["content"].as_str().unwrap().to_string(), v)
    };
    let base = chat_body("Tell me a story.", 16, json!({ "reasoning_effort": "none" }));
    let (greedy, _) = content(&base);

    // Seeded sampling repeats.
    let mut hot = base.clone();
    hot["temperature"] = json!(1.5);
    hot["top_p"] = json!(0.95);
    hot["min_p"] = json!(0.0);
    hot["seed"] = json!(7);
    assert_eq!(content(&hot).0, content(&hot).0);

    // A stop string from the middle of the greedy text: the answer is cut before it,
    // streamed or not, and the stop string itself never shows.
    let chars: Vec<char> = greedy.chars().collect();
    assert!(chars.len() >= 6, "greedy text too short to test stop strings: {greedy:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let want = &greedy[..greedy.find(&stop).unwrap()];
    let mut sb = base.clone();
    sb["stop"] = json!(["never-appears", stop]);
    let (cut, v) = content(&sb);
    assert_eq!(cut, want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    sb["stream"] = json!(true);
    let (cs, _) = chunks(&s.post("/v1/chat/completions", &sb).events());
    let (text, _, finish) = stream_text(&cs);
    assert_eq!(text, want);
    assert_eq!(finish.as_deref(), Some("stop"));

    // max_tokens bounds the answer exactly.
    let mut mb = base.clone();
    mb["max_tokens"] = json!(3);
    let (_, v) = content(&mb);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

/// The tokenizer the server pairs with the embedded model, to check what it rendered.
fn tokenizer() -> ds4_model::tokenizer::Tokenizer {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../model/assets/tokenizer.gguf");
    let g = ds4_model::gguf::GgufFile::open(std::path::Path::new(path)).unwrap();
    ds4_model::tokenizer::Tokenizer::from_gguf(&g).unwrap()
}

#[test]
fn tool_call_round_trip() {
    use ds4_model::chat::{self, Message, ThinkMode, ToolCall, ToolSpec};
    let s = Server::start(&[]);
    let tool = json!({ "type": "function", "function": { "name": "get_weather", "description": "Weather for a city",
        "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } });

    // Turn 1: tools offered, a call forced. The random model may or may not complete the
    // call; either way the answer is well-formed.
    let body = json!({ "messages": [{ "role": "user", "content": "Weather in Paris?" }], "tools": [tool], "temperature": 0,
        "max_tokens": 24, "tool_choice": { "type": "function", "function": { "name": "get_weather" } } });
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choice = &v["choices"][0];
    if choice["finish_reason"] == "tool_calls" {
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap();
    }
    let tok = tokenizer();
    let spec = ToolSpec::from_json(&tool.to_string()).unwrap();
    let forced = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n";
    let want = tok.encode_chat(&(chat::render(&[Message::user("Weather in Paris?")], std::slice::from_ref(&spec), ThinkMode::Off) + forced));
    assert_eq!(v["usage"]["prompt_tokens"], want.len());

    // Turn 2: the client sends the call and its result back; the server renders them
    // exactly as the chat template does and answers.
    let args = r#"{"city": "Paris"}"#;
    let body = json!({ "temperature": 0, "max_tokens": 8, "tools": [tool], "reasoning_effort": "high", "messages": [
        { "role": "user", "content": "Weather in Paris?" },
        { "role": "assistant", "content": null, "reasoning_content": "I should call the tool.",
          "tool_calls": [{ "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": args } }] },
        { "role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}" },
    ] });
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let history = [
        Message::user("Weather in Paris?"),
        Message::assistant("").with_reasoning("I should call the tool.").with_tool_calls(vec![ToolCall::new("get_weather", args)]),
        Message::tool("{\"temp_c\": 21}"),
    ];
    let want = chat::encode_prompt(&tok, &history, &[spec], ThinkMode::On);
    assert_eq!(r.json()["usage"]["prompt_tokens"], want.len());

    // tool_choice "none" hides the tools from the prompt.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let r = s.post("/v1/chat/completions", &none);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["prompt_tokens"], chat::encode_prompt(&tok, &history, &[], ThinkMode::On).len());
}

/// 50 bad requests, each refused with a 4xx (an OpenAI error body where the request got
/// as far as the API); the server stays healthy and still answers a good request.
#[test]
fn malformed_requests_get_4xx_and_the_server_stays_healthy() {
    let s = Server::start(&["--max-body", "65536"]);
    let msgs = json!([{ "role": "user", "content": "hi" }]);
    let chat = |extra: Value| {
        let mut b = json!({ "messages": msgs, "max_tokens": 4 });
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string().into_bytes()
    };
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("POST", "/v1/chat/completions", b"{bad json".to_vec()),
        ("POST", "/v1/chat/completions", b"".to_vec()),
        ("POST", "/v1/chat/completions", b"[1, 2, 3]".to_vec()),
        ("POST", "/v1/chat/completions", b"\"a string\"".to_vec()),
        ("POST", "/v1/chat/completions", b"null".to_vec()),
        ("POST", "/v1/chat/completions", b"{\"messages\": [}".to_vec()),
        ("POST", "/v1/chat/completions", vec![0xff, 0xfe, b'{', b'}']),
        ("POST", "/v1/chat/completions", b"{}".to_vec()),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": "hello" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [42] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "content": "no role" }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "wizard", "content": "x" }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "user" }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "user", "content": 5 }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": {} }] }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "user", "content": "a" }, { "role": "assistant", "content": "b" }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "system", "content": "only system" }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "messages": [{ "role": "assistant", "tool_calls": [{ "x": 1 }] }, { "role": "user", "content": "a" }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "temperature": 5 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "temperature": -0.5 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "temperature": "hot" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "top_p": 0 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "top_p": 1.5 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "min_p": 2 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "seed": "abc" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "seed": 1.5 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "max_tokens": 0 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "max_tokens": -3 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "max_tokens": 2.5 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "max_completion_tokens": "many" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "n": 3 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "stream": "yes" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "stream_options": { "include_usage": true } }))),
        ("POST", "/v1/chat/completions", chat(json!({ "stop": ["a", "b", "c", "d", "e"] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "stop": [""] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "stop": 7 }))),
        ("POST", "/v1/chat/completions", chat(json!({ "logprobs": true }))),
        ("POST", "/v1/chat/completions", chat(json!({ "response_format": { "type": "json_object" } }))),
        ("POST", "/v1/chat/completions", chat(json!({ "reasoning_effort": "extreme" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "thinking": "maybe" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "tools": "get_weather" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "tools": [{ "type": "function", "function": { "description": "no name" } }] }))),
        ("POST", "/v1/chat/completions", chat(json!({ "tool_choice": "required" }))),
        ("POST", "/v1/chat/completions", chat(json!({ "tools": [{ "type": "function", "function": { "name": "f" } }], "tool_choice": { "type": "function", "function": { "name": "g" } } }))),
        ("POST", "/v1/chat/completions", chat(json!({ "frequency_penalty": 1.0 }))),
        ("POST", "/v1/completions", b"{\"max_tokens\": 4}".to_vec()),
        ("POST", "/v1/completions", b"{\"prompt\": [1, 2, 99999999]}".to_vec()),
        ("POST", "/v1/completions", b"{\"prompt\": \"x\", \"echo\": true}".to_vec()),
        ("GET", "/v1/chat/completions", Vec::new()),
        ("POST", "/v1/nowhere", b"{}".to_vec()),
        ("GET", "/v1/models/no-such-model", Vec::new()),
        // Past --max-body: refused as too large, whatever it holds.
        ("POST", "/v1/chat/completions", chat(json!({ "padding": "x".repeat(70_000) }))),
    ];
    assert!(cases.len() >= 50, "{} cases", cases.len());
    for (i, (method, path, body)) in cases.iter().enumerate() {
        let r = s.request(method, path, body);
        assert!((400..500).contains(&r.status), "case {i} ({method} {path} {}) got {}: {}", String::from_utf8_lossy(body), r.status, r.text());
        let e = r.json();
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "case {i}: {e}");
        assert!(e["error"]["type"].is_string(), "case {i}: {e}");
    }
    // A body larger than the limit that does not declare its length (chunked).
    let mut s2 = s.connect();
    s2.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").unwrap();
    let chunk = vec![b'x'; 8192];
    for _ in 0..10 {
        let _ = s2.write_all(format!("{:x}\r\n", chunk.len()).as_bytes());
        let _ = s2.write_all(&chunk);
        let _ = s2.write_all(b"\r\n");
    }
    let mut buf = Vec::new();
    let _ = s2.read_to_end(&mut buf);
    assert_eq!(Resp::parse(&buf).status, 413);
    // Not even HTTP.
    let r = s.raw(b"HELLO THERE\r\n\r\n");
    assert!((400..500).contains(&r.status));

    assert_eq!(s.health()["status"], "ok");
    let r = s.post("/v1/chat/completions", &chat_body("still there?", 4, json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A client that hangs up mid-stream stops its generation.
#[test]
fn disconnecting_client_cancels_generation() {
    let s = Server::start(&[]);
    let body = chat_body("Talk forever.", 1_000_000, json!({ "stream": true, "reasoning_effort": "none" })).to_string();
    let mut c = s.connect();
    write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    // Read until a few content events have arrived: the generation is under way.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < 4 {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert_eq!(s.health()["active"], 1);
    drop(c);
    let t0 = Instant::now();
    loop {
        let h = s.health();
        if h["active"] == 0 {
            assert_eq!(h["cancelled"], 1, "{h}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "generation still running after the client left: {h}\n{}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.log().contains("Cancelled"), "{}", s.log());
}

/// 8 clients at once each get the answer they get alone (temperature 0): sessions do not
/// share state.
#[test]
fn concurrent_clients_get_their_own_answers() {
    let s = Server::start(&["--parallel", "8"]);
    let prompts: Vec<String> = (0..8).map(|i| format!("Question number {i}: what is {i} + {i}?")).collect();
    let body = |i: usize| {
        // Mixed: half streamed, half not, and different lengths.
        chat_body(&prompts[i], 6 + i as u32, json!({ "reasoning_effort": if i.is_multiple_of(3) { "high" } else { "none" }, "stream": i % 2 == 1 }))
    };
    let answer = |s: &Server, i: usize| -> (String, String) {
        let r = s.post("/v1/chat/completions", &body(i));
        assert_eq!(r.status, 200, "{}", r.text());
        if i % 2 == 1 {
            let (cs, done) = chunks(&r.events());
            assert!(done);
            let (c, reasoning, _) = stream_text(&cs);
            (reasoning, c)
        } else {
            let m = r.json()["choices"][0]["message"].clone();
            (m["reasoning_content"].as_str().unwrap_or("").to_string(), m["content"].as_str().unwrap().to_string())
        }
    };
    let alone: Vec<(String, String)> = (0..8).map(|i| answer(&s, i)).collect();
    let barrier = std::sync::Barrier::new(8);
    let together: Vec<(String, String)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (s, barrier, answer) = (&s, &barrier, &answer);
                sc.spawn(move || {
                    barrier.wait();
                    answer(s, i)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in 0..8 {
        assert_eq!(together[i], alone[i], "client {i}");
    }
    assert!(alone.iter().collect::<std::collections::HashSet<_>>().len() > 1, "different prompts should give different answers");
}

/// SIGTERM: no new connections, running streams finish (cut at the grace period), exit 0.
#[test]
fn sigterm_shuts_down_gracefully() {
    let mut s = Server::start(&["--shutdown-timeout", "1"]);
    let body = chat_body("Go on.", 1_000_000, json!({ "stream": true, "reasoning_effort": "none" })).to_string();
    let mut c = s.connect();
    write!(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while String::from_utf8_lossy(&seen).matches("data: ").count() < 3 {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    let t0 = Instant::now();
    let st = Command::new("kill").args(["-TERM", &s.child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let _ = c.read_to_end(&mut seen);
    let r = Resp::parse(&seen);
    let (cs, done) = chunks(&r.events());
    assert!(done, "the stream is finished properly: {}", r.text());
    assert_eq!(stream_text(&cs).2.as_deref(), Some("length"));
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "still running after SIGTERM:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}\n{}", s.log());
    assert!(TcpStream::connect(&s.addr).is_err(), "still accepting after shutdown");
}

/// The `openai` Python client against a running server.
#[test]
fn openai_python_client() {
    let s = Server::start(&["--parallel", "4"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/test_server_openai.py");
    let out = Command::new("python3")
        .arg(script)
        .env("DS4_BASE_URL", format!("http://{}/v1", s.addr))
        .output()
        .expect("python3 is needed for the openai client test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "the openai client test failed:\n{text}\nserver log:\n{}", s.log());
}

/// `ds4 chat` with piped input: the conversation carries over between turns (and only
/// the new part is fed), `/reset` forgets it, and at temperature 0 the same first turn
/// gives the same reply.
#[test]
fn chat_keeps_history_and_resets() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["chat", "--think", "none", "--temp", "0", "-n", "6"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Hello!\nAnd then?\n/reset\nHello!\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    // Replies are noise and may hold line breaks: compare with a one-turn run instead.
    let one = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["chat", "--think", "none", "--temp", "0", "-n", "6"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut one = one;
    one.stdin.take().unwrap().write_all(b"Hello!\n").unwrap();
    let first = String::from_utf8_lossy(&one.wait_with_output().unwrap().stdout).into_owned();
    assert!(!first.trim().is_empty());
    assert!(stdout.starts_with(&first) && stdout.ends_with(&first) && stdout.len() > 2 * first.len(), "{stdout:?} vs {first:?}");
    let stats: Vec<&str> = stderr.lines().filter(|l| l.contains("prompt tokens")).collect();
    assert_eq!(stats.len(), 3, "{stderr}");
    assert!(stats[0].starts_with("(6 prompt tokens, 0 reused"), "{}", stats[0]);
    assert!(!stats[1].contains(" 0 reused"), "the second turn reuses the first: {}", stats[1]);
    assert!(stats[2].starts_with("(6 prompt tokens, 0 reused"), "{}", stats[2]);
    assert!(stderr.contains("conversation cleared"));
}

/// Ctrl-C during a reply stops the reply, not the program.
#[test]
fn chat_ctrl_c_stops_the_reply_only() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["chat", "--think", "none", "--temp", "0", "-n", "1000000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let err_log = Arc::new(Mutex::new(String::new()));
    let e2 = err_log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            e2.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    stdin.write_all(b"Say a lot.\n").unwrap();
    stdin.flush().unwrap();
    // Wait for the reply to be under way.
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.len() < 20 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "chat ended early: {}", err_log.lock().unwrap());
        got.extend_from_slice(&buf[..n]);
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let t0 = Instant::now();
    while !err_log.lock().unwrap().contains("[stopped]") {
        assert!(t0.elapsed() < Duration::from_secs(20), "reply not stopped: {}", err_log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.try_wait().unwrap().is_none(), "Ctrl-C ended the program");
    stdin.write_all(b"/quit\n").unwrap();
    drop(stdin);
    let _ = stdout.read_to_end(&mut got);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", err_log.lock().unwrap());
}
