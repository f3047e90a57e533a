//! The token loop shared by `ds4 serve` and `ds4 chat`: bring a session to a prompt,
//! then sample one token at a time until end of sequence, a limit, the caller's "stop",
//! or cancellation.
//!
//! A `Generator` owns one session (on the CPU, or on a CUDA backend that the server loads
//! once). The server makes one per request, so requests share nothing mutable; the chat
//! keeps one for the whole conversation and, on each turn, feeds only what follows the
//! longest prefix it has already fed.

use crate::text_model::TextModel;
use anyhow::Result;
use ds4_runtime::sample::{Sampler, SamplerOptions};
use ds4_runtime::cuda::{AnySession, CudaBackend};
use ds4_runtime::SessionOptions;
use std::sync::Arc;

/// Whether the caller wants more tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model produced one of the stop ids (end of sentence).
    StopToken,
    /// `max_tokens` were produced, or the context is full.
    Length,
    /// The caller's `on_token` said stop (a stop string, a complete tool call).
    Caller,
    /// `cancelled()` became true (client gone, Ctrl-C, server shutdown).
    Cancelled,
}

pub struct GenParams {
    pub sampler: SamplerOptions,
    pub max_tokens: usize,
    /// Sampling one of these ends the generation; the token itself is not passed on.
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Tokens sampled, the final stop token included.
    pub completion_tokens: usize,
    /// Prompt tokens that were already in the session and not fed again.
    pub reused_tokens: usize,
}

pub struct Generator<'m> {
    tm: &'m TextModel,
    session: AnySession<'m>,
    /// The GPU the session runs on (none: the CPU).
    cuda: Option<Arc<CudaBackend<'m>>>,
    /// Exactly the tokens the session has been fed, in order.
    fed: Vec<u32>,
    /// Prefill batch size. Only the last row of each batch's logits is kept, so this
    /// bounds the memory a prefill needs (rows × vocab floats).
    chunk: usize,
}

impl<'m> Generator<'m> {
    /// A generator on the CPU, or on `cuda`'s GPU where given. `opts.max_rewind` bounds how
    /// far back a later prompt may part from what was fed and still reuse the rest; past
    /// it, the whole prompt is fed again.
    pub fn on(tm: &'m TextModel, chunk: usize, opts: SessionOptions, cuda: Option<Arc<CudaBackend<'m>>>) -> Self {
        Generator { tm, session: AnySession::on(&tm.model, cuda.as_ref(), opts), cuda, fed: Vec::new(), chunk: chunk.max(1) }
    }

    /// Forget everything fed so far.
    pub fn reset(&mut self) {
        self.session = AnySession::on(&self.tm.model, self.cuda.as_ref(), self.session.options().clone());
        self.fed.clear();
    }

    /// Feed the session so that it holds exactly `prompt`, reusing what it already holds,
    /// and return the logits after the last prompt token (`None` when cancelled first).
    /// `progress(done, total)` is told after each batch of newly fed prompt tokens.
    fn prefill(
        &mut self,
        prompt: &[u32],
        cancelled: &dyn Fn() -> bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Option<(Vec<f32>, usize)>> {
        let common = self.fed.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        // At least the last prompt token is fed again: its logits are what we need.
        let keep = common.min(prompt.len().saturating_sub(1));
        let drop = self.fed.len() - keep;
        if drop > 0 && self.session.rewind(drop).is_err() {
            // Further back than the session keeps state for: start over.
            self.reset();
        }
        let keep = self.fed.len().min(keep);
        self.fed.truncate(keep);
        let todo = &prompt[keep..];
        let mut last = Vec::new();
        for (i, batch) in todo.chunks(self.chunk).enumerate() {
            if cancelled() {
                return Ok(None);
            }
            last = self.session.feed_last(batch)?;
            self.fed.extend_from_slice(batch);
            progress((i * self.chunk + batch.len()).min(todo.len()), todo.len());
        }
        Ok(Some((last, keep)))
    }

    /// Generate after `prompt`. `on_token` gets every sampled token except a stop id.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        cancelled: &dyn Fn() -> bool,
        progress: &mut dyn FnMut(usize, usize),
        on_token: &mut dyn FnMut(u32) -> Flow,
    ) -> Result<Outcome> {
        let mut out = Outcome { finish: Finish::Cancelled, prompt_tokens: prompt.len(), completion_tokens: 0, reused_tokens: 0 };
        if prompt.is_empty() {
            anyhow::bail!("the prompt is empty");
        }
        let Some((mut logits, reused)) = self.prefill(prompt, cancelled, progress)? else {
            return Ok(out);
        };
        out.reused_tokens = reused;
        let room = self.tm.model.hp.context_length.saturating_sub(prompt.len());
        let max_tokens = params.max_tokens.min(room);
        let mut sampler = Sampler::new(params.sampler.clone());
        out.finish = Finish::Length;
        if params.sampler.temperature <= 0.0 && max_tokens > 0 {
            self.generate_greedy(&logits, max_tokens, params, cancelled, on_token, &mut out)?;
            return Ok(out);
        }
        for i in 0..max_tokens {
            let t = sampler.sample(&logits) as u32;
            if !take(t, params, cancelled, on_token, &mut out) {
                break;
            }
            // The last token is not fed: nothing would read its logits.
            if i + 1 < max_tokens {
                logits = self.session.feed(&[t])?;
                self.fed.push(t);
            }
        }
        Ok(out)
    }

    /// The loop of `generate` at temperature 0, through `AnySession::decode_greedy`: the
    /// same tokens (the arg-max of each step's logits), but on CUDA the picks stay on the
    /// device and the host queues each step before it hands on the last one. The session is
    /// left as the loop above leaves it: the prompt and every token but the last.
    fn generate_greedy(
        &mut self,
        logits: &[f32],
        max_tokens: usize,
        params: &GenParams,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(u32) -> Flow,
        out: &mut Outcome,
    ) -> Result<()> {
        let first = ds4_runtime::sample::argmax(logits) as u32;
        if !take(first, params, cancelled, on_token, out) || max_tokens == 1 {
            return Ok(());
        }
        let picks = self.session.decode_greedy(first, max_tokens - 1, |t| take(t, params, cancelled, on_token, out))?;
        // Fed: `first` and every pick but the last.
        self.fed.push(first);
        self.fed.extend_from_slice(&picks[..picks.len().saturating_sub(1)]);
        Ok(())
    }
}

/// Whether the generation goes on after sampled token `t` (both of `generate`'s loops):
/// not if it was cancelled (the token not counted), if `t` is a stop id (counted, not
/// passed on) or if `on_token` says stop; `out` says why it ended.
fn take(t: u32, params: &GenParams, cancelled: &dyn Fn() -> bool, on_token: &mut dyn FnMut(u32) -> Flow, out: &mut Outcome) -> bool {
    if cancelled() {
        out.finish = Finish::Cancelled;
        return false;
    }
    out.completion_tokens += 1;
    if params.stop_ids.contains(&t) {
        out.finish = Finish::StopToken;
        return false;
    }
    if on_token(t) == Flow::Stop {
        out.finish = Finish::Caller;
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text_model::load_text_model;

    /// At temperature 0 `generate` takes `decode_greedy`: its tokens are each step's
    /// arg-max (a session fed a token at a time), and each way of ending (the length, a stop
    /// id, the caller) ends where the step-at-a-time loop ends, with the session holding
    /// the prompt and every token but the last (what the chat's next turn reuses).
    #[test]
    fn greedy_generation_is_feed_and_argmax() {
        let tm = load_text_model(None).unwrap();
        let prompt = [0u32, 5, 9];
        let mut s = AnySession::on(&tm.model, None, SessionOptions::default());
        let mut logits = s.feed_last(&prompt).unwrap();
        let mut want = Vec::new();
        for _ in 0..8 {
            want.push(ds4_runtime::sample::argmax(&logits) as u32);
            logits = s.feed(&[*want.last().unwrap()]).unwrap();
        }
        let fed_then = |n: usize| [&prompt[..], &want[..n]].concat();
        // A stop id first seen at step j ≥ 2 (the tiny model repeats itself).
        let j = (2..8).find(|&j| !want[..j].contains(&want[j])).expect("a new token after the second");
        let cases = [(usize::MAX, vec![], Finish::Length, 8, 8, 7), (3, vec![], Finish::Caller, 3, 3, 2), (usize::MAX, vec![want[j]], Finish::StopToken, j + 1, j, j)];
        for (stop_after, stop_ids, finish, completion, seen, fed) in cases {
            let mut g = Generator::on(&tm, 64, SessionOptions::default(), None);
            let params = GenParams { sampler: SamplerOptions::default(), max_tokens: 8, stop_ids };
            let mut got = Vec::new();
            let out = g
                .generate(&prompt, &params, &|| false, &mut |_, _| {}, &mut |t| {
                    got.push(t);
                    if got.len() == stop_after {
                        Flow::Stop
                    } else {
                        Flow::Continue
                    }
                })
                .unwrap();
            assert_eq!((out.finish, out.completion_tokens), (finish, completion));
            assert_eq!(got, want[..seen], "{finish:?}");
            assert_eq!(g.fed, fed_then(fed), "{finish:?}: what the session holds");
            assert_eq!(g.session.pos(), g.fed.len());
        }
    }
}
