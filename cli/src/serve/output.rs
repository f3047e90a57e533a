//! Generated tokens → what a client sees: reasoning text, answer text and tool calls,
//! produced incrementally so that streaming and non-streaming responses are the same
//! text cut differently.
//!
//! With thinking on, the prompt ends with `<think>`, so everything up to the `</think>`
//! token is reasoning. After it comes the answer, which is checked against the
//! request's stop strings and, when tools are offered, for the start of a DSML
//! tool-call block. Text that could still turn out to be the start of a stop string or
//! of a block is held back until it is decided, so a stop string never reaches the
//! client. A block is collected whole and parsed with `chat::parse_tool_calls` at the
//! end; a block that does not parse is passed on as plain answer text.

use crate::serve::generate::Flow;
use ds4_model::chat::{self, ToolCall};
use ds4_model::tokenizer::{StreamDecoder, Tokenizer};

// The tool-call block's tag spellings, shared with `chat::parse_tool_calls`.
use ds4_model::chat::{TOOL_BLOCK_ENDS as BLOCK_ENDS, TOOL_BLOCK_STARTS as BLOCK_STARTS};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

pub struct OutputOptions {
    /// The prompt opened a `<think>` block.
    pub thinking: bool,
    /// Tools were offered: look for a tool-call block in the answer.
    pub tools: bool,
    pub stop: Vec<String>,
    /// Text the prompt already put into the answer (a forced tool-call opening); the
    /// generation continues it.
    pub forced_prefix: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Reasoning,
    Answer,
    ToolBlock,
}

pub struct Output<'t> {
    tok: &'t Tokenizer,
    opts: OutputOptions,
    decoder: StreamDecoder,
    phase: Phase,
    think_start: Option<u32>,
    think_end: Option<u32>,
    /// Answer text not yet passed on.
    held: String,
    /// Whitespace between the answer and a tool-call block: dropped if the block parses.
    gap: String,
    /// The tool-call block so far, from its opening tag.
    block: String,
}

impl<'t> Output<'t> {
    pub fn new(tok: &'t Tokenizer, opts: OutputOptions) -> Self {
        let phase = if !opts.forced_prefix.is_empty() {
            Phase::ToolBlock
        } else if opts.thinking {
            Phase::Reasoning
        } else {
            Phase::Answer
        };
        let block = opts.forced_prefix.clone();
        Output {
            tok,
            think_start: tok.token_to_id(chat::THINK_START),
            think_end: tok.token_to_id(chat::THINK_END),
            opts,
            decoder: StreamDecoder::new(),
            phase,
            held: String::new(),
            gap: String::new(),
            block,
        }
    }

    /// Take one generated token; `emit` gets the text it makes final.
    pub fn push(&mut self, id: u32, emit: &mut dyn FnMut(Piece)) -> Flow {
        if self.phase == Phase::Reasoning {
            if Some(id) == self.think_end {
                let rest = self.decoder.finish();
                emit_nonempty(emit, Piece::Reasoning(rest));
                self.phase = Phase::Answer;
                return Flow::Continue;
            }
            if Some(id) == self.think_start {
                return Flow::Continue;
            }
            let text = self.decoder.push(self.tok, id);
            emit_nonempty(emit, Piece::Reasoning(text));
            return Flow::Continue;
        }
        let text = self.decoder.push(self.tok, id);
        self.take_answer_text(&text, emit)
    }

    fn take_answer_text(&mut self, text: &str, emit: &mut dyn FnMut(Piece)) -> Flow {
        if self.phase == Phase::ToolBlock {
            self.block.push_str(text);
            // Text after a closed block is dropped anyway: no need to generate it.
            let closed = BLOCK_ENDS.iter().any(|e| self.block.contains(e));
            return if closed && !chat::parse_tool_calls(&self.block).1.is_empty() { Flow::Stop } else { Flow::Continue };
        }
        self.held.push_str(text);
        if let Some(k) = earliest(&self.held, &self.opts.stop) {
            let before = self.held[..k].to_string();
            self.held.clear();
            emit_nonempty(emit, Piece::Content(before));
            return Flow::Stop;
        }
        if self.opts.tools {
            if let Some(k) = earliest(&self.held, &BLOCK_STARTS) {
                let content_end = self.held[..k].trim_end_matches(|c: char| c.is_ascii_whitespace()).len();
                emit_nonempty(emit, Piece::Content(self.held[..content_end].to_string()));
                self.gap = self.held[content_end..k].to_string();
                self.block = self.held[k..].to_string();
                self.held.clear();
                self.phase = Phase::ToolBlock;
                return self.take_answer_text("", emit);
            }
        }
        let ready = self.held.len() - self.undecided_tail();
        if ready > 0 {
            let rest = self.held.split_off(ready);
            emit(Piece::Content(std::mem::replace(&mut self.held, rest)));
        }
        Flow::Continue
    }

    /// Bytes at the end of `held` that may still grow into a stop string or a block
    /// opening (and, with tools, trailing whitespace that would precede a block).
    fn undecided_tail(&self) -> usize {
        let h = &self.held;
        let mut tail = 0;
        let markers = self.opts.stop.iter().map(String::as_str).chain(if self.opts.tools { &BLOCK_STARTS[..] } else { &[] }.iter().copied());
        for m in markers {
            tail = tail.max(longest_suffix_prefix(h, m));
        }
        if self.opts.tools {
            let body = &h[..h.len() - tail];
            tail += body.len() - body.trim_end_matches(|c: char| c.is_ascii_whitespace()).len();
        }
        tail
    }

    /// End of generation: pass on what is held; return the tool calls, if any.
    pub fn finish(&mut self, emit: &mut dyn FnMut(Piece)) -> Vec<ToolCall> {
        let rest = self.decoder.finish();
        if self.phase == Phase::Reasoning {
            emit_nonempty(emit, Piece::Reasoning(rest));
            return Vec::new();
        }
        if self.take_answer_text(&rest, emit) == Flow::Stop && self.phase != Phase::ToolBlock {
            return Vec::new(); // a stop string completed by the last bytes
        }
        if self.phase == Phase::ToolBlock {
            let (content, calls) = chat::parse_tool_calls(&self.block);
            if !calls.is_empty() {
                // Text before the tag inside the block string (none: it starts at the tag).
                emit_nonempty(emit, Piece::Content(content));
                return calls;
            }
            // Not a valid block after all: it was answer text.
            let text = std::mem::take(&mut self.gap) + &std::mem::take(&mut self.block);
            emit_nonempty(emit, Piece::Content(text));
            return Vec::new();
        }
        let held = std::mem::take(&mut self.held);
        emit_nonempty(emit, Piece::Content(held));
        Vec::new()
    }
}

fn emit_nonempty(emit: &mut dyn FnMut(Piece), p: Piece) {
    let empty = match &p {
        Piece::Reasoning(s) | Piece::Content(s) => s.is_empty(),
    };
    if !empty {
        emit(p);
    }
}

/// The byte offset of the earliest occurrence of any of `needles` in `hay`.
fn earliest<S: AsRef<str>>(hay: &str, needles: &[S]) -> Option<usize> {
    needles.iter().filter(|n| !n.as_ref().is_empty()).filter_map(|n| hay.find(n.as_ref())).min()
}

/// The length of the longest proper prefix of `marker` that `s` ends with, on a
/// character boundary of `s`.
fn longest_suffix_prefix(s: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(s.len());
    (1..=max).rev().find(|&n| s.is_char_boundary(s.len() - n) && marker.as_bytes().starts_with(&s.as_bytes()[s.len() - n..])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `text` to an output as if generated, split into single characters.
    fn run(opts: OutputOptions, parts: &[&str]) -> (Vec<Piece>, Vec<ToolCall>, bool) {
        let tok = crate::text_model::embedded_tokenizer().unwrap();
        let mut out = Output::new(&tok, opts);
        let mut pieces = Vec::new();
        let mut stopped = false;
        for p in parts {
            for id in tok.encode(p) {
                if out.push(id, &mut |x| pieces.push(x)) == Flow::Stop {
                    stopped = true;
                    break;
                }
            }
            if stopped {
                break;
            }
        }
        let calls = out.finish(&mut |x| pieces.push(x));
        (pieces, calls, stopped)
    }

    fn opts(thinking: bool, tools: bool, stop: &[&str]) -> OutputOptions {
        OutputOptions { thinking, tools, stop: stop.iter().map(|s| s.to_string()).collect(), forced_prefix: String::new() }
    }

    fn joined(pieces: &[Piece]) -> (String, String) {
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            match p {
                Piece::Reasoning(s) => r += s,
                Piece::Content(s) => c += s,
            }
        }
        (r, c)
    }

    #[test]
    fn reasoning_then_answer() {
        let (p, calls, _) = run(opts(true, false, &[]), &["Let me think", "</think>", "The answer is 4."]);
        assert_eq!(joined(&p), ("Let me think".into(), "The answer is 4.".into()));
        assert!(calls.is_empty());
    }

    #[test]
    fn stop_strings_are_cut_and_never_leak() {
        let (p, _, stopped) = run(opts(false, false, &["STOP", "\n\n"]), &["one two ST", "OP three"]);
        assert!(stopped);
        assert_eq!(joined(&p).1, "one two ");
        // A held partial match that never completes is passed on at the end.
        let (p, _, stopped) = run(opts(false, false, &["STOP"]), &["one ST"]);
        assert!(!stopped);
        assert_eq!(joined(&p).1, "one ST");
    }

    #[test]
    fn tool_block_becomes_calls() {
        let block = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let (p, calls, stopped) = run(opts(false, true, &[]), &["Checking.\n\n", block, "ignored"]);
        assert!(stopped, "a closed block ends the generation");
        assert_eq!(joined(&p).1, "Checking.");
        assert_eq!(calls, vec![ToolCall::new("get_weather", "{\"city\": \"Paris\"}")]);
    }

    #[test]
    fn broken_block_is_plain_text() {
        let (p, calls, _) = run(opts(false, true, &[]), &["Hi \n", "<tool_calls> nonsense"]);
        assert!(calls.is_empty());
        assert_eq!(joined(&p).1, "Hi \n<tool_calls> nonsense");
    }

    #[test]
    fn forced_prefix_is_completed() {
        let o = OutputOptions { forced_prefix: "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n".into(), ..opts(false, true, &[]) };
        let (_, calls, _) = run(o, &["<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"]);
        assert_eq!(calls, vec![ToolCall::new("f", "{\"n\": 3}")]);
    }

    #[test]
    fn suffix_prefix() {
        assert_eq!(longest_suffix_prefix("abc<｜DS", "<｜DSML｜tool_calls>"), "<｜DS".len());
        assert_eq!(longest_suffix_prefix("abc", "xyz"), 0);
        assert_eq!(longest_suffix_prefix("ab", "ab"), 0, "a whole match is not a partial one");
    }
}
