//! DS4 chat prompts: rendering a conversation to the DeepSeek-V4 prompt text, and
//! turning generated text back into reasoning, content and tool calls.
//!
//! The format follows antirez's ds4 engine (its server's prompt renderer and DSML
//! tool-call parser):
//!
//! ```text
//! <｜begin▁of▁sentence｜>[max-effort prefix][tools prompt][system text]
//! <｜User｜>question<｜Assistant｜></think>answer[DSML tool calls]<｜end▁of▁sentence｜>
//! <｜User｜><tool_result>output</tool_result><｜Assistant｜><think>
//! ```
//! (without the line breaks). The prompt ends with `<｜Assistant｜>` and `<think>` when
//! thinking is on, `</think>` when it is off. Earlier assistant turns end with the
//! end-of-sentence token; their reasoning is kept only when thinking is on and either
//! tools are in play or the turn comes after the last user message, as DeepSeek's
//! template does (otherwise the turn opens with a bare `</think>`).
//!
//! Tool calls use DSML, DeepSeek's XML-like call syntax around the `｜DSML｜` token:
//!
//! ```text
//! <｜DSML｜tool_calls>
//! <｜DSML｜invoke name="get_weather">
//! <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
//! <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜tool_calls>
//! ```
//! String arguments are raw text (`string="true"`), every other JSON value is written as
//! minified JSON (`string="false"`).

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::tokenizer::Tokenizer;

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";
pub const DSML: &str = "｜DSML｜";

/// Put after BOS when reasoning effort is "max" (the model still enters via `<think>`).
pub const REASONING_EFFORT_MAX_PREFIX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, \
rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, \
and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// DeepSeek recommends max effort only with a context of at least 384K tokens; below
/// that, [`ThinkMode::for_context`] falls back to ordinary thinking.
pub const THINK_MAX_MIN_CONTEXT: u32 = 393_216;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// OpenAI-style role names; "developer" is a system message and "function" a tool
    /// result, as ds4 treats them.
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" | "function" => Some(Role::Tool),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// An OpenAI-style tool call: the function name and its arguments as a JSON object text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall { name: name.into(), arguments: arguments.into() }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's thinking (the text between `<think>` and `</think>`).
    pub reasoning: Option<String>,
    /// An assistant turn's tool calls.
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message { role, content: content.into(), reasoning: None, tool_calls: Vec::new() }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
    /// A tool result.
    pub fn tool(content: impl Into<String>) -> Self {
        Self::new(Role::Tool, content)
    }
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning = Some(reasoning.into());
        self
    }
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ThinkMode {
    /// The assistant answers directly after `</think>`.
    Off,
    /// The assistant starts with `<think>`.
    #[default]
    On,
    /// As `On`, with [`REASONING_EFFORT_MAX_PREFIX`] after BOS.
    Max,
}

impl ThinkMode {
    pub fn thinking(self) -> bool {
        self != ThinkMode::Off
    }

    /// `Max` becomes `On` when the context is too small for it, as ds4 does.
    pub fn for_context(self, ctx_size: u32) -> ThinkMode {
        if self == ThinkMode::Max && ctx_size < THINK_MAX_MIN_CONTEXT {
            ThinkMode::On
        } else {
            self
        }
    }

    /// A reasoning-effort name as ds4's API takes it: "none" is off, "max" is max, and
    /// every other level ("minimal", "low", "medium", "high", "xhigh") is ordinary
    /// thinking, the only level DS4 has between the two. "off"/"on" are accepted too.
    pub fn parse(name: &str) -> Option<ThinkMode> {
        match name {
            "none" | "off" => Some(ThinkMode::Off),
            "minimal" | "low" | "medium" | "high" | "xhigh" | "on" => Some(ThinkMode::On),
            "max" => Some(ThinkMode::Max),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("tool definition is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("tool definition: {0}")]
    Tool(String),
}

/// A tool the model may call: its name and its schema as one JSON object text
/// (`{"name":…,"description":…,"parameters":{…}}`), rendered verbatim into the prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: String,
    schema: String,
}

impl ToolSpec {
    /// A function tool from its parts. `parameters` is the JSON schema of the arguments.
    pub fn function(name: &str, description: &str, parameters: &serde_json::Value) -> ToolSpec {
        let schema = format!(
            "{{\"name\":{},\"description\":{},\"parameters\":{}}}",
            serde_json::Value::from(name),
            serde_json::Value::from(description),
            parameters
        );
        ToolSpec { name: name.to_string(), schema }
    }

    /// A tool from an OpenAI `tools[]` entry (`{"type":"function","function":{…}}`) or
    /// a bare function object. As ds4 does, the function object's text is kept as
    /// written (key order and all) and that is what the prompt shows.
    pub fn from_json(json: &str) -> Result<ToolSpec, ChatError> {
        let outer = ordered_entries(json)?.ok_or_else(|| ChatError::Tool("expected a JSON object".into()))?;
        // `json` is valid JSON here, so trimming its whitespace leaves the object's text.
        let schema_raw = match outer.iter().find(|(k, _)| k == "function") {
            Some((_, function)) => function.get(),
            None => json.trim_matches(|c: char| c.is_ascii_whitespace()),
        };
        let entries =
            ordered_entries(schema_raw)?.ok_or_else(|| ChatError::Tool("'function' is not an object".into()))?;
        let name = entries
            .iter()
            .find(|(k, _)| k == "name")
            .and_then(|(_, v)| serde_json::from_str::<String>(v.get()).ok())
            .ok_or_else(|| ChatError::Tool("the function has no string 'name'".into()))?;
        Ok(ToolSpec { name, schema: schema_raw.to_string() })
    }

    /// The schema text as it appears in the prompt.
    pub fn schema_json(&self) -> &str {
        &self.schema
    }
}

/// The system-prompt section that teaches the model DSML and lists the tools.
pub fn tools_prompt(tools: &[ToolSpec]) -> String {
    let mut s = String::from(
        "## Tools\n\n\
You have access to a set of tools to help answer the user question. \
You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n\
<｜DSML｜tool_calls>\n\
<｜DSML｜invoke name=\"$TOOL_NAME\">\n\
<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n\
...\n\
</｜DSML｜invoke>\n\
<｜DSML｜invoke name=\"$TOOL_NAME2\">\n\
...\n\
</｜DSML｜invoke>\n\
</｜DSML｜tool_calls>\n\n\
String parameters should be specified as raw text and set `string=\"true\"`. \
Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. \
Only if a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. \
For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n\
Otherwise, output directly after </think> with tool calls or final response.\n\n\
### Available Tool Schemas\n\n",
    );
    for (i, t) in tools.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(&t.schema);
    }
    s.push_str(
        "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. \
Use the exact parameter names from the schemas.",
    );
    s
}

/// Renders a conversation as the DS4 prompt text, ending with the assistant prefix when
/// the last turn is not the assistant's. Tokenize it with [`Tokenizer::encode_chat`]
/// (or use [`encode_prompt`]).
pub fn render(messages: &[Message], tools: &[ToolSpec], think: ThinkMode) -> String {
    let thinking = think.thinking();
    // Reasoning of past turns is replayed whenever tools are involved: a tool loop is
    // one logical answer whose thinking must stay visible.
    let tool_context = !tools.is_empty()
        || messages.iter().any(|m| m.role == Role::Tool || (m.role == Role::Assistant && !m.tool_calls.is_empty()));
    let last_user = messages.iter().rposition(|m| matches!(m.role, Role::User | Role::Tool));

    // All system text goes up front: the tools section first (so that a client's
    // changing system text is the tail of the shared prefix), then every system message.
    let mut system = if tools.is_empty() { String::new() } else { tools_prompt(tools) };
    for m in messages.iter().filter(|m| m.role == Role::System) {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&m.content);
    }

    let mut out =
        String::with_capacity(system.len() + messages.iter().map(|m| m.content.len() + 32).sum::<usize>() + 64);
    out.push_str(BOS);
    if think == ThinkMode::Max {
        out.push_str(REASONING_EFFORT_MAX_PREFIX);
    }
    out.push_str(&system);

    let mut pending_assistant = false; // a user/tool turn awaits the assistant prefix
    let mut in_tool_results = false; // consecutive tool results share one user turn
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::System => {}
            Role::User => {
                out.push_str(USER);
                out.push_str(&m.content);
                pending_assistant = true;
                in_tool_results = false;
            }
            Role::Tool => {
                if !in_tool_results {
                    out.push_str(USER);
                }
                out.push_str("<tool_result>");
                push_escaping_tag(&mut out, &m.content, "</tool_result>", "&lt;");
                out.push_str("</tool_result>");
                pending_assistant = true;
                in_tool_results = true;
            }
            Role::Assistant => {
                if pending_assistant {
                    out.push_str(ASSISTANT);
                    if thinking && (tool_context || Some(i) > last_user) {
                        out.push_str(THINK_START);
                        out.push_str(m.reasoning.as_deref().unwrap_or(""));
                    }
                    out.push_str(THINK_END);
                }
                out.push_str(&m.content);
                out.push_str(&render_tool_calls(&m.tool_calls));
                out.push_str(EOS);
                pending_assistant = false;
                in_tool_results = false;
            }
        }
    }
    if pending_assistant {
        out.push_str(ASSISTANT);
        out.push_str(if thinking { THINK_START } else { THINK_END });
    }
    out
}

/// The prompt's tokens: [`render`], then ds4's rendered-chat tokenization (only the chat
/// markers are special; any other added-token text in messages stays plain text).
pub fn encode_prompt(tok: &Tokenizer, messages: &[Message], tools: &[ToolSpec], think: ThinkMode) -> Vec<u32> {
    tok.encode_chat(&render(messages, tools, think))
}

/// The DSML block for an assistant turn's tool calls, with the blank line that
/// separates it from the content; empty when there are none.
pub fn render_tool_calls(calls: &[ToolCall]) -> String {
    if calls.is_empty() {
        return String::new();
    }
    let mut b = String::from("\n\n<｜DSML｜tool_calls>\n");
    for call in calls {
        b.push_str("<｜DSML｜invoke name=\"");
        push_attr_escaped(&mut b, &call.name);
        b.push_str("\">\n");
        match ordered_entries(&call.arguments) {
            Ok(Some(args)) => {
                for (key, value) in args {
                    let raw = value.get();
                    let string = raw.starts_with('"');
                    b.push_str("<｜DSML｜parameter name=\"");
                    push_attr_escaped(&mut b, &key);
                    b.push_str(if string { "\" string=\"true\">" } else { "\" string=\"false\">" });
                    if string {
                        let text: String = serde_json::from_str(raw).unwrap_or_default();
                        push_escaping_tag(&mut b, &text, PARAM_END, "&lt;");
                    } else {
                        // A JSON string inside an array/object could hold the closing
                        // tag too; `\u003c` is the same JSON value without it.
                        push_escaping_tag(&mut b, &minify_json(raw), PARAM_END, "\\u003c");
                    }
                    b.push_str("</｜DSML｜parameter>\n");
                }
            }
            // Arguments that are not a JSON object go through as one string parameter.
            _ => {
                b.push_str("<｜DSML｜parameter name=\"arguments\" string=\"true\">");
                push_escaping_tag(&mut b, &call.arguments, PARAM_END, "&lt;");
                b.push_str("</｜DSML｜parameter>\n");
            }
        }
        b.push_str("</｜DSML｜invoke>\n");
    }
    b.push_str("</｜DSML｜tool_calls>");
    b
}

const PARAM_END: &str = "</｜DSML｜parameter>";

/// Appends `s`, replacing the leading `<` of every occurrence of `tag` with `lt`, so
/// that data can never close the element it sits in.
fn push_escaping_tag(out: &mut String, s: &str, tag: &str, lt: &str) {
    let mut rest = s;
    while let Some(k) = rest.find(tag) {
        out.push_str(&rest[..k]);
        out.push_str(lt);
        rest = &rest[k + 1..];
    }
    out.push_str(rest);
}

fn push_attr_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
}

/// The entries of a JSON object in document order (serde_json's `Map` would sort
/// them, and argument order is visible in the prompt). `Ok(None)` for valid JSON that
/// is not an object.
fn ordered_entries(json: &str) -> Result<Option<Vec<(String, &RawValue)>>, serde_json::Error> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<(String, &'de RawValue)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut v = Vec::new();
            while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                v.push(entry);
            }
            Ok(v)
        }
    }
    // Validate the whole text first, then walk the object's entries.
    let raw: &RawValue = serde_json::from_str(json)?;
    if !raw.get().starts_with('{') {
        return Ok(None);
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Ok(Some((&mut de).deserialize_map(Entries)?))
}

/// Valid JSON text without the whitespace outside strings (order and number spelling
/// kept, unlike a parse and re-serialise).
fn minify_json(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in raw.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

/// JSON string literal, escaped as ds4 does (so the arguments text is byte-stable).
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Undoes the entities the model may use in DSML text and attributes.
fn unescape_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(k) = rest.find('&') {
        out.push_str(&rest[..k]);
        rest = &rest[k..];
        let known = [("&amp;", '&'), ("&lt;", '<'), ("&gt;", '>'), ("&quot;", '"'), ("&apos;", '\'')];
        match known.iter().find(|(e, _)| rest.starts_with(e)) {
            Some((e, c)) => {
                out.push(*c);
                rest = &rest[e.len()..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The tag names of one DSML spelling. Models sometimes drop the first bar
/// (`<DSML｜invoke`) or the DSML marker altogether (`<invoke`); ds4 accepts both.
struct Tags {
    calls_start: &'static str,
    calls_end: &'static str,
    invoke_start: &'static str,
    invoke_end: &'static str,
    param_start: &'static str,
    param_end: &'static str,
}

const DSML_TAGS: Tags = Tags {
    calls_start: "<｜DSML｜tool_calls>",
    calls_end: "</｜DSML｜tool_calls>",
    invoke_start: "<｜DSML｜invoke",
    invoke_end: "</｜DSML｜invoke>",
    param_start: "<｜DSML｜parameter",
    param_end: "</｜DSML｜parameter>",
};
const SHORT_TAGS: Tags = Tags {
    calls_start: "<DSML｜tool_calls>",
    calls_end: "</DSML｜tool_calls>",
    invoke_start: "<DSML｜invoke",
    invoke_end: "</DSML｜invoke>",
    param_start: "<DSML｜parameter",
    param_end: "</DSML｜parameter>",
};
const PLAIN_TAGS: Tags = Tags {
    calls_start: "<tool_calls>",
    calls_end: "</tool_calls>",
    invoke_start: "<invoke",
    invoke_end: "</invoke>",
    param_start: "<parameter",
    param_end: "</parameter>",
};

/// The three accepted spellings of the tool-call block's opening tag (the parser and a
/// streaming server that must hold text back both need them).
pub const TOOL_BLOCK_STARTS: [&str; 3] = [DSML_TAGS.calls_start, SHORT_TAGS.calls_start, PLAIN_TAGS.calls_start];
/// The matching closing tags.
pub const TOOL_BLOCK_ENDS: [&str; 3] = [DSML_TAGS.calls_end, SHORT_TAGS.calls_end, PLAIN_TAGS.calls_end];

/// Splits generated assistant text at its DSML tool-call block: returns the content
/// before the block (trailing whitespace trimmed) and the calls. Text without a block,
/// or with a block that does not parse, comes back whole with no calls, so the turn
/// can still be shown as a plain answer. Text after the block is dropped, as in ds4.
pub fn parse_tool_calls(text: &str) -> (String, Vec<ToolCall>) {
    match find_and_parse_block(text) {
        Some((content_end, calls)) => (text[..content_end].to_string(), calls),
        None => (text.to_string(), Vec::new()),
    }
}

/// Generated assistant text taken apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generated {
    pub reasoning: Option<String>,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// A tool-call block started but did not parse. Then, as in ds4, `content` is the
    /// whole generated text and there are no calls: the turn can still be shown, and
    /// the caller may report "invalid tool call".
    pub tool_parse_error: bool,
}

/// Parses what the model generated after the prompt. With `thinking`, the text is
/// expected to be `reasoning</think>answer` (a leading `<think>` is tolerated); a DSML
/// block counts only after the last `</think>`, since DSML inside reasoning is just
/// the model thinking about a call. Text that never closes its thinking is returned as
/// content, as ds4 does.
pub fn parse_generated(text: &str, thinking: bool) -> Generated {
    let search_from = if thinking {
        match text.rfind(THINK_END) {
            Some(k) => k + THINK_END.len(),
            None => return split_reasoning(text, Vec::new()),
        }
    } else {
        0
    };
    match find_block(&text[search_from..]) {
        None => split_reasoning(text, Vec::new()),
        Some((start, tags)) => {
            let start = search_from + start;
            match parse_block(&text[start + tags.calls_start.len()..], tags) {
                Some(calls) => split_reasoning(trim_content(&text[..start]), calls),
                None => Generated { content: text.to_string(), tool_parse_error: true, ..Default::default() },
            }
        }
    }
}

fn split_reasoning(text: &str, tool_calls: Vec<ToolCall>) -> Generated {
    let body = text.strip_prefix(THINK_START).unwrap_or(text);
    match body.find(THINK_END) {
        Some(k) => Generated {
            reasoning: Some(body[..k].to_string()),
            content: body[k + THINK_END.len()..].to_string(),
            tool_calls,
            tool_parse_error: false,
        },
        None => Generated { content: text.to_string(), tool_calls, ..Default::default() },
    }
}

/// Where the tool-call block starts (at its `<…tool_calls>` tag) and its spelling.
/// Like ds4: ds4's own spelling first, then the short, then the plain one; for each,
/// a tag after a blank line (where the renderer puts it) wins over an earlier one.
fn find_block(text: &str) -> Option<(usize, &'static Tags)> {
    for tags in [&DSML_TAGS, &SHORT_TAGS, &PLAIN_TAGS] {
        let after_blank = format!("\n\n{}", tags.calls_start);
        if let Some(k) = text.find(&after_blank) {
            return Some((k + 2, tags));
        }
        if let Some(k) = text.find(tags.calls_start) {
            return Some((k, tags));
        }
    }
    None
}

fn trim_content(s: &str) -> &str {
    s.trim_end_matches(|c: char| c.is_ascii_whitespace())
}

/// Finds the tool-call block and parses it; returns where the content before it ends
/// and the calls, or `None` if there is no block or it does not parse.
fn find_and_parse_block(text: &str) -> Option<(usize, Vec<ToolCall>)> {
    let (start, tags) = find_block(text)?;
    let calls = parse_block(&text[start + tags.calls_start.len()..], tags)?;
    Some((trim_content(&text[..start]).len(), calls))
}

/// Parses the invokes after `<…tool_calls>` up to the closing tag.
fn parse_block(mut p: &str, t: &Tags) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    loop {
        p = p.trim_start_matches(|c: char| c.is_ascii_whitespace());
        if p.starts_with(t.calls_end) {
            return Some(calls);
        }
        if !p.starts_with(t.invoke_start) {
            return None;
        }
        let tag_end = p.find('>')?;
        let name = attr(&p[..=tag_end], "name")?;
        p = &p[tag_end + 1..];
        let mut args = String::new();
        loop {
            p = p.trim_start_matches(|c: char| c.is_ascii_whitespace());
            if let Some(rest) = p.strip_prefix(t.invoke_end) {
                p = rest;
                break;
            }
            let (key, value, rest) = parse_param(p, t)?;
            if !args.is_empty() {
                args.push_str(", ");
            }
            push_json_string(&mut args, &key);
            args.push_str(": ");
            args.push_str(&value);
            p = rest;
        }
        calls.push(ToolCall { name, arguments: format!("{{{args}}}") });
    }
}

/// One `<…parameter name=… string=…>value</…parameter>`: the name, the value as JSON
/// text, and the input after it.
fn parse_param<'a>(p: &'a str, t: &Tags) -> Option<(String, String, &'a str)> {
    if !p.starts_with(t.param_start) {
        return None;
    }
    let tag_end = p.find('>')?;
    let tag = &p[..=tag_end];
    let name = attr(tag, "name")?;
    let is_string = attr(tag, "string");
    let body = &p[tag_end + 1..];

    // A parameter without a `string` attribute whose body is more parameters: long
    // generations sometimes drift into nesting; read it as an object of string leaves.
    if is_string.is_none() && body.trim_start_matches(|c: char| c.is_ascii_whitespace()).starts_with(t.param_start) {
        let mut q = body;
        let mut members = String::new();
        loop {
            q = q.trim_start_matches(|c: char| c.is_ascii_whitespace());
            if !q.starts_with(t.param_start) {
                break;
            }
            let (k, v, rest) = parse_leaf_param(q, t)?;
            if !members.is_empty() {
                members.push_str(", ");
            }
            push_json_string(&mut members, &k);
            members.push_str(": ");
            members.push_str(&v);
            q = rest;
        }
        q = q.trim_start_matches(|c: char| c.is_ascii_whitespace());
        let q = q.strip_prefix(t.param_end).unwrap_or(q);
        return Some((name, format!("{{{members}}}"), q));
    }

    let end = body.find(t.param_end)?;
    let value = json_value(&body[..end], is_string.as_deref());
    Some((name, value, &body[end + t.param_end.len()..]))
}

/// A parameter that must not nest further.
fn parse_leaf_param<'a>(p: &'a str, t: &Tags) -> Option<(String, String, &'a str)> {
    let tag_end = p.find('>')?;
    let tag = &p[..=tag_end];
    let name = attr(tag, "name")?;
    let is_string = attr(tag, "string");
    let body = &p[tag_end + 1..];
    let end = body.find(t.param_end)?;
    Some((name, json_value(&body[..end], is_string.as_deref()), &body[end + t.param_end.len()..]))
}

/// The JSON text of a parameter value. `string="true"` (or no attribute) is raw text;
/// anything else should be JSON and is minified. As in ds4, only the first JSON value
/// counts (`3 apples` is `3`). Unlike ds4, which would pass text that is not JSON at
/// all through and so make the whole arguments text invalid, such a value becomes a
/// JSON string: `arguments` is always valid JSON.
fn json_value(raw: &str, is_string: Option<&str>) -> String {
    let mut out = String::new();
    if is_string.unwrap_or("true") == "true" {
        push_json_string(&mut out, &unescape_entities(raw));
        return out;
    }
    let trimmed = raw.trim_start_matches(|c: char| c.is_ascii_whitespace());
    if trimmed.is_empty() {
        return "null".to_string();
    }
    let mut values = serde_json::Deserializer::from_str(trimmed).into_iter::<&RawValue>();
    match values.next() {
        Some(Ok(value)) => minify_json(value.get()),
        _ => {
            push_json_string(&mut out, &unescape_entities(raw));
            out
        }
    }
}

/// The value of attribute `name="…"` in a tag, entities undone.
fn attr(tag: &str, name: &str) -> Option<String> {
    let pat = format!("{name}=\"");
    // Match whole attribute names only: `name` must not be the tail of `xname`.
    let mut from = 0;
    let start = loop {
        let k = from + tag[from..].find(&pat)?;
        if k == 0 || !tag.as_bytes()[k - 1].is_ascii_alphanumeric() && tag.as_bytes()[k - 1] != b'_' {
            break k + pat.len();
        }
        from = k + 1;
    };
    let len = tag[start..].find('"')?;
    Some(unescape_entities(&tag[start..start + len]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_turn() {
        let m = [Message::system("Be brief."), Message::user("Hi")];
        assert_eq!(
            render(&m, &[], ThinkMode::Off),
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>"
        );
        assert_eq!(render(&m[1..], &[], ThinkMode::On), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>");
        let max = render(&m[1..], &[], ThinkMode::Max);
        assert_eq!(max, format!("{BOS}{REASONING_EFFORT_MAX_PREFIX}<｜User｜>Hi<｜Assistant｜><think>"));
    }

    #[test]
    fn entities_and_attributes() {
        assert_eq!(unescape_entities("a &amp;&lt;b&gt; &quot;&apos; & &x;"), "a &<b> \"' & &x;");
        assert_eq!(attr(r#"<x xname="no" name="a&amp;b">"#, "name").as_deref(), Some("a&b"));
        assert_eq!(attr(r#"<x string="true">"#, "name"), None);
        assert_eq!(minify_json("{ \"a b\" : [1, 2],\n \"c\": \"x y\" }"), "{\"a b\":[1,2],\"c\":\"x y\"}");
        let mut s = String::new();
        push_json_string(&mut s, "q\"\\\n\u{1}é");
        assert_eq!(s, "\"q\\\"\\\\\\n\\u0001é\"");
    }

    #[test]
    fn ordered_entries_keep_document_order() {
        let e = ordered_entries(r#"{"z": 1, "a": {"y": 2, "b": 3}, "m": "s"}"#).unwrap().unwrap();
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        assert_eq!(e[1].1.get(), r#"{"y": 2, "b": 3}"#);
        assert!(ordered_entries("[1]").unwrap().is_none());
        assert!(ordered_entries("{bad").is_err());
    }
}
