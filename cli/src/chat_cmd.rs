//! `ds4 chat [--model M]`: an interactive conversation in the terminal.
//!
//! Replies stream as they are generated (reasoning dimmed on a terminal). The whole
//! conversation is the context of each turn; the session keeps what it has already
//! processed, so a turn only feeds the tokens that follow the part of the rendered
//! conversation it has seen. Ctrl-C stops the reply being generated; at the prompt it
//! leaves, as does Ctrl-D. Lines starting with `/` are commands (`/help`).

use crate::serve::generate::{Finish, GenParams, Generator};
use crate::serve::output::{Output, OutputOptions, Piece};
use crate::text_model::{load_text_model, TextModel};
use anyhow::{Context, Result};
use ds4_model::chat::{self, Message, ThinkMode};
use ds4_runtime::sample::SamplerOptions;
use ds4_runtime::SessionOptions;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct ChatArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Thinking: none, high or max.
    #[arg(long, default_value = "high", value_parser = parse_think)]
    pub think: ThinkMode,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n", default_value_t = 2048)]
    pub n: usize,
    #[arg(long, default_value_t = 1.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prefill batch size.
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    #[command(flatten)]
    pub on: crate::common::BackendArgs,
}

fn parse_think(s: &str) -> Result<ThinkMode, String> {
    ThinkMode::parse(s).ok_or_else(|| format!("'{s}' is not one of none, high, max"))
}

const HELP: &str = "commands: /reset (forget the conversation), /think none|high|max, /quit (or Ctrl-D); Ctrl-C stops a reply";

/// Ctrl-C: while a reply is being generated it sets `stop`; otherwise it ends the
/// program as usual.
struct Interrupt {
    generating: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Interrupt {
    fn install() -> Result<Interrupt> {
        let generating = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().context("starting the signal thread")?;
        // Registered here, before the first prompt, so no Ctrl-C can slip past it.
        let mut sigint = rt.block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) })?;
        let (g, s) = (generating.clone(), stop.clone());
        std::thread::spawn(move || {
            rt.block_on(async move {
                while sigint.recv().await.is_some() {
                    if g.load(Ordering::SeqCst) {
                        s.store(true, Ordering::SeqCst);
                    } else {
                        eprintln!();
                        std::process::exit(130);
                    }
                }
            })
        });
        Ok(Interrupt { generating, stop })
    }
}

pub fn run(a: ChatArgs) -> Result<()> {
    let sampler = crate::common::sampler_options(a.temp, a.top_p, a.min_p, a.seed)?;
    let tm = load_text_model(a.model.as_deref())?;
    let cuda = a.on.backend.load(&tm.model, &a.on.cuda_options()).context("--backend cuda")?;
    let interrupt = Interrupt::install()?;
    let mut chat = Chat {
        tm: &tm,
        // The template drops the reasoning of earlier turns, so the next prompt parts from
        // what was fed at the start of the last reply: keep enough state to rewind a
        // whole reply instead of feeding the conversation again (capped: it costs memory).
        gen: Generator::on(&tm, a.chunk, SessionOptions { max_rewind: (a.n + 16).min(4096), ..Default::default() }, cuda),
        history: a.system.iter().map(Message::system).collect(),
        think: a.think,
        sampler,
        max_tokens: a.n,
        tty_out: std::io::stdout().is_terminal(),
        tty_err: std::io::stderr().is_terminal(),
    };
    let interactive = std::io::stdin().is_terminal();
    eprintln!("ds4 chat: model '{}'. {HELP}", tm.name);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            print!("> ");
            std::io::stdout().flush().ok();
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(cmd) = text.strip_prefix('/') {
            if !chat.command(cmd) {
                break;
            }
            continue;
        }
        chat.turn(text, &interrupt)?;
    }
    Ok(())
}

struct Chat<'m> {
    tm: &'m TextModel,
    gen: Generator<'m>,
    history: Vec<Message>,
    think: ThinkMode,
    sampler: SamplerOptions,
    max_tokens: usize,
    tty_out: bool,
    tty_err: bool,
}

impl Chat<'_> {
    /// A `/command`; false to leave.
    fn command(&mut self, cmd: &str) -> bool {
        let mut words = cmd.split_whitespace();
        match (words.next(), words.next()) {
            (Some("quit" | "exit" | "q"), _) => return false,
            (Some("reset"), _) => {
                self.history.retain(|m| m.role == chat::Role::System);
                self.gen.reset();
                eprintln!("(conversation cleared)");
            }
            (Some("think"), Some(mode)) => match ThinkMode::parse(mode) {
                Some(t) => {
                    self.think = t;
                    eprintln!("(thinking: {mode})");
                }
                None => eprintln!("(unknown mode '{mode}': none, high or max)"),
            },
            _ => eprintln!("({HELP})"),
        }
        true
    }

    /// One user message and the streamed reply.
    fn turn(&mut self, text: &str, interrupt: &Interrupt) -> Result<()> {
        self.history.push(Message::user(text));
        let prompt = chat::encode_prompt(&self.tm.tok, &self.history, &[], self.think);
        let mut stop_ids = vec![self.tm.tok.eos()];
        stop_ids.extend(self.tm.tok.token_to_id(chat::USER));
        let params = GenParams { sampler: self.sampler.clone(), max_tokens: self.max_tokens, stop_ids };
        let mut output = Output::new(
            &self.tm.tok,
            OutputOptions { thinking: self.think.thinking(), tools: false, stop: Vec::new(), forced_prefix: String::new() },
        );
        let mut printer = Printer { tty: self.tty_out, in_reasoning: false, reasoning: String::new(), content: String::new() };
        let bar = self.tty_err;
        // Whether an unfinished bar is on screen (to be cleared if Ctrl-C cuts the prefill).
        let mut bar_up = false;
        let mut progress = |done: usize, total: usize| bar_up = progress_bar(bar, done, total);

        interrupt.stop.store(false, Ordering::SeqCst);
        interrupt.generating.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        let stop = &interrupt.stop;
        let result = self.gen.generate(&prompt, &params, &|| stop.load(Ordering::SeqCst), &mut progress, &mut |t| {
            output.push(t, &mut |p| printer.print(p))
        });
        interrupt.generating.store(false, Ordering::SeqCst);
        if bar_up {
            eprint!("\r\x1b[K");
        }
        let outcome = result?;
        output.finish(&mut |p| printer.print(p));
        let secs = t0.elapsed().as_secs_f64();
        if outcome.finish == Finish::Cancelled && outcome.completion_tokens == 0 {
            // Stopped before any answer: as if the message had not been sent.
            self.history.pop();
            eprintln!("[stopped; message dropped]");
            return Ok(());
        }
        printer.end();
        if outcome.finish == Finish::Cancelled {
            eprintln!("[stopped]");
        }
        eprintln!(
            "({} prompt tokens, {} reused; {} generated in {secs:.1}s)",
            outcome.prompt_tokens, outcome.reused_tokens, outcome.completion_tokens
        );
        // What was said stays in the conversation, a stopped reply included.
        let mut reply = Message::assistant(printer.content);
        if !printer.reasoning.is_empty() {
            reply = reply.with_reasoning(printer.reasoning);
        }
        self.history.push(reply);
        Ok(())
    }
}

/// Writes a streamed reply to stdout: reasoning dimmed on a terminal, between
/// `<think>` tags otherwise, then the answer.
struct Printer {
    tty: bool,
    in_reasoning: bool,
    reasoning: String,
    content: String,
}

impl Printer {
    fn print(&mut self, p: Piece) {
        let mut out = std::io::stdout().lock();
        match p {
            Piece::Reasoning(s) => {
                if !self.in_reasoning {
                    let _ = write!(out, "{}", if self.tty { "\x1b[2m" } else { "<think>" });
                    self.in_reasoning = true;
                }
                let _ = write!(out, "{s}");
                self.reasoning.push_str(&s);
            }
            Piece::Content(s) => {
                self.close_reasoning(&mut out);
                let _ = write!(out, "{s}");
                self.content.push_str(&s);
            }
        }
        let _ = out.flush();
    }

    fn close_reasoning(&mut self, out: &mut impl Write) {
        if self.in_reasoning {
            let _ = write!(out, "{}", if self.tty { "\x1b[0m\n\n" } else { "</think>\n" });
            self.in_reasoning = false;
        }
    }

    fn end(&mut self) {
        let mut out = std::io::stdout().lock();
        self.close_reasoning(&mut out);
        let _ = writeln!(out);
        let _ = out.flush();
    }
}

/// A one-line bar on stderr while a long prompt is processed; cleared when done. Only on
/// a terminal: in a log it would be noise. Returns whether a bar is left on screen.
fn progress_bar(enabled: bool, done: usize, total: usize) -> bool {
    const WIDTH: usize = 30;
    if !enabled || total <= 256 {
        return false;
    }
    let mut err = std::io::stderr().lock();
    let up = done < total;
    if up {
        let filled = WIDTH * done / total;
        let _ = write!(err, "\rprompt [{}{}] {done}/{total} tokens", "#".repeat(filled), "-".repeat(WIDTH - filled));
    } else {
        let _ = write!(err, "\r\x1b[K");
    }
    let _ = err.flush();
    up
}
