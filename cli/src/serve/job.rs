//! One generation request, run to the end on a blocking thread: its own session, its
//! own sampler, and a sink that carries the result to the client.
//!
//! The job stops early when the client goes away (the sink reports it closed) or when
//! the server gives up waiting at shutdown; both are checked between tokens.

use crate::serve::error::ApiError;
use crate::serve::generate::{Finish, Generator};
use crate::serve::openai::{Sink, Usage};
use crate::serve::output::Output;
use crate::serve::request::GenRequest;
use crate::serve::State;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Counts a job as active for as long as it lives, whichever way it ends.
struct Active<'a>(&'a State);

impl<'a> Active<'a> {
    fn new(s: &'a State) -> Self {
        s.stats.active.fetch_add(1, Ordering::SeqCst);
        Active(s)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.stats.active.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn run(state: &State, id: &str, req: GenRequest, sink: Box<dyn Sink>) {
    let _active = Active::new(state);
    let t0 = Instant::now();
    let tm = state.tm;
    let sink = RefCell::new(sink);
    let mut output = Output::new(&tm.tok, req.output);
    let mut gen = Generator::on(tm, state.chunk, Default::default(), state.cuda.clone());
    let cancelled = || state.stopping.load(Ordering::Relaxed) || sink.borrow().closed();
    let mut emit = |p| sink.borrow_mut().piece(p);
    let result = gen.generate(&req.prompt, &req.params, &cancelled, &mut |_, _| {}, &mut |t| output.push(t, &mut emit));
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ds4 serve: {id}: generation failed: {e:#}");
            sink.borrow_mut().fail(ApiError::internal(format!("generation failed: {e:#}")));
            return;
        }
    };
    let calls = output.finish(&mut emit);
    let reason = match outcome.finish {
        _ if !calls.is_empty() => "tool_calls",
        Finish::StopToken | Finish::Caller => "stop",
        // Cut short: by the limit, or by a shutdown that could not wait any longer.
        Finish::Length | Finish::Cancelled => "length",
    };
    let counter = if outcome.finish == Finish::Cancelled { &state.stats.cancelled } else { &state.stats.completed };
    counter.fetch_add(1, Ordering::SeqCst);
    let usage = Usage { prompt_tokens: outcome.prompt_tokens, completion_tokens: outcome.completion_tokens };
    sink.borrow_mut().finish(calls, reason, usage);
    eprintln!(
        "ds4 serve: {id}: {} prompt tokens, {} generated, {:?}, {:.2}s",
        usage.prompt_tokens,
        usage.completion_tokens,
        outcome.finish,
        t0.elapsed().as_secs_f64()
    );
}
