//! `ds4`: the command line. One file per subcommand; this one parses and dispatches.

mod bench;
mod bench_matvec;
mod chat_cmd;
mod common;
mod gen_cmd;
mod inspect_cmd;
mod logits_cmd;
mod quantize_cmd;
mod run_cmd;
mod serve;
mod text_model;
mod tokenize_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ds4", version, about = "DeepSeek-V4 inference engine")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate tokens from a prompt.
    Run(run_cmd::RunArgs),
    /// Write the logits of one prefill to a safetensors file.
    Logits(logits_cmd::LogitsArgs),
    /// Print a GGUF file's metadata and tensors.
    Inspect(inspect_cmd::InspectArgs),
    /// Measure prefill and decode speed.
    Bench(bench::BenchArgs),
    /// Convert an F32/F16/BF16 GGUF to the q2, q4 or q8_0 layout.
    Quantize(quantize_cmd::QuantizeArgs),
    /// Talk to the model in the terminal.
    Chat(chat_cmd::ChatArgs),
    /// Write the generated kernel sources of a target, with manifest.json.
    Gen(gen_cmd::GenArgs),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Token ids of text (`--text`, or `--jsonl` lines of {"text": ...}).
    Tokenize(tokenize_cmd::TokenizeArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run(a) => run_cmd::run(a),
        Cmd::Logits(a) => logits_cmd::run(a),
        Cmd::Inspect(a) => inspect_cmd::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Chat(a) => chat_cmd::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Gen(a) => gen_cmd::run(a),
        Cmd::Quantize(a) => quantize_cmd::run(a),
        Cmd::Tokenize(a) => tokenize_cmd::main(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
