//! Chat rendering and DSML tool calls. The expected prompt texts below were produced by
//! antirez's ds4 server (its `render_chat_prompt_text` and `parse_generated_message_ex`,
//! built from its C source) from the same conversations given as OpenAI requests.
//! `DS4_CHAT_EXTRA_CASES` can point at more such reference cases (see
//! `ds4_reference_cases_from_env`).

use std::path::PathBuf;

use ds4_model::chat::{
    self, parse_generated, parse_tool_calls, render, render_tool_calls, Message, Role, ThinkMode, ToolCall, ToolSpec,
    REASONING_EFFORT_MAX_PREFIX,
};
use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;
use serde_json::value::RawValue;
use serde_json::Value;

fn conversation() -> Vec<Message> {
    vec![
        Message::system("You are helpful."),
        Message::user("Hi"),
        Message::assistant("Hello! How can I help?").with_reasoning("The user greets."),
        Message::user("What is 2+2?"),
        Message::assistant("4").with_reasoning("Simple."),
        Message::user("Thanks"),
    ]
}

#[test]
fn multi_turn_history() {
    let m = conversation();
    // Past assistant turns end with EOS; without tools their reasoning is dropped.
    let history = "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜></think>Hello! How can I help?\
<｜end▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜>";
    assert_eq!(render(&m, &[], ThinkMode::Off), format!("{history}</think>"));
    assert_eq!(render(&m, &[], ThinkMode::On), format!("{history}<think>"));
    let max = render(&m, &[], ThinkMode::Max);
    let expected_max = format!(
        "<｜begin▁of▁sentence｜>{REASONING_EFFORT_MAX_PREFIX}{}<think>",
        &history["<｜begin▁of▁sentence｜>".len()..]
    );
    assert_eq!(max, expected_max);
    assert!(max.contains("Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough"));

    // An assistant turn after the last user message keeps its reasoning when thinking.
    let m = [Message::user("Hi"), Message::assistant("Hello").with_reasoning("greet")];
    assert_eq!(
        render(&m, &[], ThinkMode::On),
        "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>greet</think>Hello<｜end▁of▁sentence｜>"
    );
    assert_eq!(
        render(&m, &[], ThinkMode::Off),
        "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜>"
    );
}

#[test]
fn think_mode_helpers() {
    assert_eq!(ThinkMode::Max.for_context(100_000), ThinkMode::On);
    assert_eq!(ThinkMode::Max.for_context(400_000), ThinkMode::Max);
    assert_eq!(ThinkMode::Off.for_context(100), ThinkMode::Off);
    assert_eq!(ThinkMode::parse("max"), Some(ThinkMode::Max));
    assert_eq!(ThinkMode::parse("none"), Some(ThinkMode::Off));
    assert_eq!(Role::parse("developer"), Some(Role::System));
    assert_eq!(Role::parse("function"), Some(Role::Tool));
}

fn weather_tool() -> ToolSpec {
    ToolSpec::from_json(
        r#"{"type":"function","function":{"name":"get_weather","description":"Get weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}"#,
    )
    .unwrap()
}

fn tool_conversation() -> Vec<Message> {
    vec![
        Message::system("S1"),
        Message::user("Hi"),
        Message::assistant("Hello").with_reasoning("think1"),
        Message::user("Weather?"),
        Message::assistant("Checking.").with_reasoning("need tool").with_tool_calls(vec![ToolCall::new(
            "get_weather",
            r#"{"city": "Paris", "days": 3, "opts": {"a": [1, 2]}}"#,
        )]),
        Message::tool("Sunny </tool_result> 20C"),
        Message::tool("second"),
    ]
}

const TOOLS_SECTION: &str = "## Tools\n\n\
You have access to a set of tools to help answer the user question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n\
<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n\
<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n\
<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n\
String parameters should be specified as raw text and set `string=\"true\"`. Preserve characters such as `>`, `&`, and `&&` exactly; \
never replace normal string characters with XML or HTML entity escapes. Only if a string value itself contains the exact closing \
parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, \
booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n\
If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any \
tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n\
### Available Tool Schemas\n\n\
{\"name\":\"get_weather\",\"description\":\"Get weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}\n\n\
You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. Use the exact parameter names from the schemas.";

#[test]
fn tools_and_tool_calls_render_like_ds4() {
    let m = tool_conversation();
    let calls = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n\
<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\":[1,2]}</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    // With tools in play, thinking replays every turn's reasoning; consecutive tool
    // results share one user turn; a result cannot close its own wrapper.
    let on = format!(
        "<｜begin▁of▁sentence｜>{TOOLS_SECTION}\n\nS1<｜User｜>Hi<｜Assistant｜><think>think1</think>Hello<｜end▁of▁sentence｜>\
<｜User｜>Weather?<｜Assistant｜><think>need tool</think>Checking.{calls}<｜end▁of▁sentence｜>\
<｜User｜><tool_result>Sunny &lt;/tool_result> 20C</tool_result><tool_result>second</tool_result><｜Assistant｜><think>"
    );
    assert_eq!(render(&m, &[weather_tool()], ThinkMode::On), on);
    let off = format!(
        "<｜begin▁of▁sentence｜>{TOOLS_SECTION}\n\nS1<｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜>\
<｜User｜>Weather?<｜Assistant｜></think>Checking.{calls}<｜end▁of▁sentence｜>\
<｜User｜><tool_result>Sunny &lt;/tool_result> 20C</tool_result><tool_result>second</tool_result><｜Assistant｜></think>"
    );
    assert_eq!(render(&m, &[weather_tool()], ThinkMode::Off), off);

    // The constructed form of the same tool: the same schema (serde_json's `Value`
    // orders object keys, so the `parameters` text is sorted).
    let built = ToolSpec::function(
        "get_weather",
        "Get weather",
        &serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    );
    assert_eq!(
        built.schema_json(),
        r#"{"name":"get_weather","description":"Get weather","parameters":{"properties":{"city":{"type":"string"}},"type":"object"}}"#
    );
    assert!(json_eq(built.schema_json(), weather_tool().schema_json()));
    assert_eq!(built.name, "get_weather");
    // A bare function object is accepted too; a tool without a name is not.
    assert_eq!(
        ToolSpec::from_json(r#"{"name": "f", "parameters": {}}"#).unwrap().schema_json(),
        r#"{"name": "f", "parameters": {}}"#
    );
    assert!(ToolSpec::from_json(r#"{"type":"function","function":{"description":"x"}}"#).is_err());
    assert!(ToolSpec::from_json("[1]").is_err());
    assert!(ToolSpec::from_json("{bad").is_err());
}

#[test]
fn tool_call_escaping() {
    let calls = [
        ToolCall::new("a\"b<c>", r#"{"s": "x </｜DSML｜parameter> y & z", "o": ["</｜DSML｜parameter>"]}"#),
        ToolCall::new("f", "not json"),
    ];
    assert_eq!(
        render_tool_calls(&calls),
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a&quot;b&lt;c&gt;\">\n\
<｜DSML｜parameter name=\"s\" string=\"true\">x &lt;/｜DSML｜parameter> y & z</｜DSML｜parameter>\n\
<｜DSML｜parameter name=\"o\" string=\"false\">[\"\\u003c/｜DSML｜parameter>\"]</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n<｜DSML｜invoke name=\"f\">\n\
<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n\
</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    );
    assert_eq!(render_tool_calls(&[]), "");
}

fn json_eq(a: &str, b: &str) -> bool {
    serde_json::from_str::<Value>(a).unwrap() == serde_json::from_str::<Value>(b).unwrap()
}

#[test]
fn tool_calls_round_trip() {
    let calls = vec![
        ToolCall::new("get_weather", r#"{"city": "Paris & <Rome>", "days": 3, "units": null}"#),
        ToolCall::new(
            "run",
            r#"{"cmd": "ls -l | grep \"x\" && echo '</｜DSML｜parameter>'\n", "env": {"A": [1, 2.5, true]}}"#,
        ),
        ToolCall::new("noargs", "{}"),
    ];
    let text = format!("Let me check.{}", render_tool_calls(&calls));
    let (content, parsed) = parse_tool_calls(&text);
    assert_eq!(content, "Let me check.");
    assert_eq!(parsed.len(), calls.len());
    for (p, c) in parsed.iter().zip(&calls) {
        assert_eq!(p.name, c.name);
        assert!(json_eq(&p.arguments, &c.arguments), "{} vs {}", p.arguments, c.arguments);
    }
    // Parsed arguments keep their order and render to the very same DSML: a stable
    // cache key for the next turn's prompt.
    assert_eq!(parsed[0].arguments, r#"{"city": "Paris & <Rome>", "days": 3, "units": null}"#);
    assert_eq!(render_tool_calls(&parsed), render_tool_calls(&calls));

    // Inside a whole rendered conversation: the assistant turn's text between the
    // `</think>` and EOS parses back to the message.
    let m = vec![
        Message::user("Weather in Paris?"),
        Message::assistant("Checking.").with_reasoning("use the tool").with_tool_calls(calls.clone()),
    ];
    let prompt = render(&m, &[weather_tool()], ThinkMode::On);
    let turn = prompt.rsplit("<｜Assistant｜><think>").next().unwrap().strip_suffix("<｜end▁of▁sentence｜>").unwrap();
    let g = parse_generated(turn, true);
    assert_eq!(g.reasoning.as_deref(), Some("use the tool"));
    assert_eq!(g.content, "Checking.");
    assert_eq!(render_tool_calls(&g.tool_calls), render_tool_calls(&calls));
    assert!(!g.tool_parse_error);
}

#[test]
fn parse_generated_variants() {
    // Reasoning and answer, no tools.
    let g = parse_generated("hmm</think>The answer is 4.", true);
    assert_eq!((g.reasoning.as_deref(), g.content.as_str()), (Some("hmm"), "The answer is 4."));
    assert!(g.tool_calls.is_empty());
    // Thinking never closed (e.g. cut by the length limit): all content, as ds4 does.
    let g = parse_generated("still thinking <｜DSML｜tool_calls>", true);
    assert_eq!((g.reasoning, g.content.as_str()), (None, "still thinking <｜DSML｜tool_calls>"));
    // DSML inside the reasoning is not a call.
    let inside = "I could write <｜DSML｜tool_calls>\n</｜DSML｜tool_calls></think>No tool needed.";
    let g = parse_generated(inside, true);
    assert!(g.tool_calls.is_empty());
    assert_eq!(g.content, "No tool needed.");

    // The spellings models drift into: no first bar, and no DSML at all.
    for (pre, bar) in [("DSML｜", ""), ("", "")] {
        let text = format!(
            "ok\n\n<{pre}tool_calls>\n<{pre}invoke name=\"f\">\n<{pre}parameter name=\"x\" string=\"false\">[1, 2]</{pre}parameter>\n</{pre}invoke>\n</{pre}tool_calls>{bar}"
        );
        let (content, calls) = parse_tool_calls(&text);
        assert_eq!(content, "ok");
        assert_eq!(calls, vec![ToolCall::new("f", r#"{"x": [1,2]}"#)]);
    }

    // Nested parameters without a `string` attribute become an object.
    let text = "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"o\">\
<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter><｜DSML｜parameter name=\"b\" string=\"false\">2</｜DSML｜parameter>\
</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>";
    let (_, calls) = parse_tool_calls(text);
    assert_eq!(calls[0].arguments, r#"{"o": {"a": "1", "b": 2}}"#);

    // Entities in string values and names are undone; a value that should be JSON but
    // is not becomes a string, so the arguments are always valid JSON.
    let text = "<｜DSML｜tool_calls><｜DSML｜invoke name=\"a&amp;b\"><｜DSML｜parameter name=\"s\" string=\"true\">x &lt; y &amp;&amp; z</｜DSML｜parameter>\
<｜DSML｜parameter name=\"bad\" string=\"false\">not json</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>";
    let (_, calls) = parse_tool_calls(text);
    assert_eq!(calls, vec![ToolCall::new("a&b", r#"{"s": "x < y && z", "bad": "not json"}"#)]);

    // A block that does not parse: the text comes back whole, no calls.
    let broken =
        "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">1";
    assert_eq!(parse_tool_calls(broken), (broken.to_string(), vec![]));
    let g = parse_generated(&format!("r</think>{broken}"), true);
    assert!(g.tool_parse_error && g.tool_calls.is_empty());
    assert_eq!(g.content, format!("r</think>{broken}"));
    assert_eq!(parse_tool_calls("plain answer"), ("plain answer".to_string(), vec![]));
}

fn golden_dir() -> PathBuf {
    match std::env::var_os("DS4_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden")),
    }
}

#[test]
fn prompt_tokens_use_single_marker_tokens() {
    let path = golden_dir().join("tokenizer/tokenizer.gguf");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let m = tool_conversation();
    let ids = chat::encode_prompt(&tok, &m, &[weather_tool()], ThinkMode::On);
    let rendered = render(&m, &[weather_tool()], ThinkMode::On);
    assert_eq!(tok.decode(&ids), rendered);
    let id = |s: &str| tok.token_to_id(s).unwrap();
    assert_eq!(ids[0], tok.bos());
    assert_eq!(*ids.last().unwrap(), id("<think>"));
    let count = |t: u32| ids.iter().filter(|&&x| x == t).count();
    assert_eq!(count(id("<｜User｜>")), 3);
    assert_eq!(count(id("<｜Assistant｜>")), 3);
    assert_eq!(count(tok.eos()), 2);
    // ｜DSML｜: 11 in the tools section, 10 in the rendered call (3 parameters).
    assert_eq!(count(id("｜DSML｜")), 21);
    // `<tool_result>` is ordinary text, not an added token.
    assert!(tok.token_to_id("<tool_result>").is_none());
}

/// Converts an OpenAI-style chat request (as raw JSON, so that tool schemas keep their
/// text) to messages and tools.
fn request_from_json(body: &str) -> (Vec<Message>, Vec<ToolSpec>) {
    #[derive(serde::Deserialize)]
    struct Req<'a> {
        messages: Vec<Value>,
        #[serde(borrow, default)]
        tools: Vec<&'a RawValue>,
    }
    let req: Req = serde_json::from_str(body).unwrap();
    let messages = req
        .messages
        .iter()
        .map(|m| {
            let mut msg =
                Message::new(Role::parse(m["role"].as_str().unwrap()).unwrap(), m["content"].as_str().unwrap_or(""));
            msg.reasoning = m["reasoning_content"].as_str().map(str::to_string);
            if let Some(calls) = m["tool_calls"].as_array() {
                msg.tool_calls = calls
                    .iter()
                    .map(|c| {
                        ToolCall::new(
                            c["function"]["name"].as_str().unwrap(),
                            c["function"]["arguments"].as_str().unwrap(),
                        )
                    })
                    .collect();
            }
            msg
        })
        .collect();
    let tools = req.tools.iter().map(|t| ToolSpec::from_json(t.get()).unwrap()).collect();
    (messages, tools)
}

/// Reference cases from ds4's C renderer and parser, one JSON object a line:
/// `{"kind":"render","body":<OpenAI request text>,"think":0|1|2,"rendered":…}` or
/// `{"kind":"parse","text":…,"thinking":bool,"parsed":{"ok","content","reasoning","calls"}}`.
/// Skipped unless `DS4_CHAT_EXTRA_CASES` names such a file.
#[test]
fn ds4_reference_cases_from_env() {
    let Some(path) = std::env::var_os("DS4_CHAT_EXTRA_CASES") else {
        println!("DS4_CHAT_EXTRA_CASES not set: skipped");
        return;
    };
    let text = std::fs::read_to_string(path).unwrap();
    let (mut renders, mut parses, mut lenient) = (0, 0, 0);
    for (i, line) in text.lines().enumerate() {
        let case: Value = serde_json::from_str(line).unwrap();
        let line_no = i + 1;
        match case["kind"].as_str().unwrap() {
            "render" => {
                let (messages, tools) = request_from_json(case["body"].as_str().unwrap());
                let think = [ThinkMode::Off, ThinkMode::On, ThinkMode::Max][case["think"].as_u64().unwrap() as usize];
                assert_eq!(render(&messages, &tools, think), case["rendered"].as_str().unwrap(), "line {line_no}");
                renders += 1;
            }
            "parse" => {
                let g = parse_generated(case["text"].as_str().unwrap(), case["thinking"].as_bool().unwrap());
                let want = &case["parsed"];
                if !want["ok"].as_bool().unwrap() {
                    assert!(g.tool_parse_error, "line {line_no}: ds4 failed to parse, we did not");
                    assert_eq!(g.content, case["text"].as_str().unwrap(), "line {line_no}");
                    parses += 1;
                    continue;
                }
                assert!(!g.tool_parse_error, "line {line_no}");
                assert_eq!(g.content, want["content"].as_str().unwrap(), "line {line_no}: content");
                assert_eq!(g.reasoning.as_deref(), want["reasoning"].as_str(), "line {line_no}: reasoning");
                let calls = want["calls"].as_array().unwrap();
                assert_eq!(g.tool_calls.len(), calls.len(), "line {line_no}: calls");
                for (ours, theirs) in g.tool_calls.iter().zip(calls) {
                    assert_eq!(ours.name, theirs["name"].as_str().unwrap(), "line {line_no}");
                    let theirs_args = theirs["arguments"].as_str().unwrap();
                    let ours_v: Value = serde_json::from_str(&ours.arguments).expect("our arguments are valid JSON");
                    match serde_json::from_str::<Value>(theirs_args) {
                        // Same text when ds4's is valid JSON.
                        Ok(_) => assert_eq!(ours.arguments, theirs_args, "line {line_no}"),
                        // ds4 passes a non-JSON `string="false"` value through raw; we
                        // make it a string. Only that may differ.
                        Err(_) => {
                            assert!(ours_v.is_object());
                            lenient += 1;
                        }
                    }
                }
                parses += 1;
            }
            other => panic!("line {line_no}: unknown kind {other}"),
        }
    }
    println!("{renders} render and {parses} parse cases match ds4 ({lenient} calls with non-JSON values made valid)");
}
