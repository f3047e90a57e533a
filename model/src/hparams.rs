//! DS4 hyper-parameters, read from `deepseek4.*` GGUF metadata. Nothing here assumes the
//! DS4-Flash values: the tiny golden models use other ones.

use crate::gguf::{GgufError, GgufFile};

#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub n_layer: usize,
    /// D: the embedding width.
    pub d: usize,
    pub vocab: usize,
    pub n_head: usize,
    /// Head width of the one shared K=V head.
    pub hd: usize,
    /// RoPE channels: the last `n_rot` of a head.
    pub n_rot: usize,
    pub q_lora: usize,
    pub o_groups: usize,
    pub o_lora: usize,
    /// Sliding window, current token included.
    pub window: usize,
    /// Per layer: 0 sliding only, 4 CSA, other HCA.
    pub compress_ratios: Vec<usize>,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_top_k: usize,
    pub rope_base: f64,
    pub compress_rope_base: f64,
    pub yarn_factor: f64,
    pub yarn_orig_ctx: f64,
    pub yarn_beta_fast: f64,
    pub yarn_beta_slow: f64,
    pub rms_eps: f32,
    /// nh: hyper-connection streams.
    pub hc: usize,
    pub hc_iters: usize,
    pub hc_eps: f32,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    pub n_shared: usize,
    /// Layers [0, n_hash) route by the token-id hash table.
    pub n_hash: usize,
    pub expert_weights_scale: f32,
    pub expert_weights_norm: bool,
    pub swiglu_clamp: Vec<f32>,
    pub n_mtp: usize,
    pub context_length: usize,
}

/// The compress ratio that means CSA (two overlapping halves plus the lightning indexer).
pub const CSA_RATIO: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum HParamsError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{0}")]
    Invalid(String),
}

fn key(k: &str) -> String {
    format!("deepseek4.{k}")
}

impl HParams {
    pub fn from_gguf(f: &GgufFile) -> Result<HParams, HParamsError> {
        let arch = f.get_str("general.architecture")?;
        if arch != "deepseek4" {
            return Err(HParamsError::Invalid(format!("general.architecture is '{arch}', expected 'deepseek4'")));
        }
        let u = |k: &str| -> Result<usize, HParamsError> { Ok(f.get_u64(&key(k))? as usize) };
        let fl = |k: &str| -> Result<f32, HParamsError> { Ok(f.get_f32(&key(k))?) };
        let n_layer = u("block_count")?;
        let hp = HParams {
            n_layer,
            d: u("embedding_length")?,
            vocab: u("vocab_size")?,
            n_head: u("attention.head_count")?,
            hd: u("attention.key_length")?,
            n_rot: u("rope.dimension_count")?,
            q_lora: u("attention.q_lora_rank")?,
            o_groups: u("attention.output_group_count")?,
            o_lora: u("attention.output_lora_rank")?,
            window: u("attention.sliding_window")?,
            compress_ratios: f.get_u32_array(&key("attention.compress_ratios"))?.into_iter().map(|r| r as usize).collect(),
            idx_heads: u("attention.indexer.head_count")?,
            idx_dim: u("attention.indexer.key_length")?,
            idx_top_k: u("attention.indexer.top_k")?,
            rope_base: fl("rope.freq_base")? as f64,
            compress_rope_base: fl("attention.compress_rope_freq_base")? as f64,
            yarn_factor: fl("rope.scaling.factor")? as f64,
            yarn_orig_ctx: u("rope.scaling.original_context_length")? as f64,
            yarn_beta_fast: fl("rope.scaling.yarn_beta_fast")? as f64,
            yarn_beta_slow: fl("rope.scaling.yarn_beta_slow")? as f64,
            rms_eps: fl("attention.layer_norm_rms_epsilon")?,
            hc: u("hyper_connection.count")?,
            hc_iters: u("hyper_connection.sinkhorn_iterations")?,
            hc_eps: fl("hyper_connection.epsilon")?,
            n_expert: u("expert_count")?,
            n_expert_used: u("expert_used_count")?,
            expert_ff: u("expert_feed_forward_length")?,
            n_shared: u("expert_shared_count")?,
            n_hash: u("hash_layer_count")?,
            expert_weights_scale: fl("expert_weights_scale")?,
            expert_weights_norm: f.get_bool(&key("expert_weights_norm"))?,
            swiglu_clamp: f.get_f32_array(&key("swiglu_clamp_exp"))?,
            n_mtp: f.meta(&key("nextn_predict_layers")).and_then(|v| v.as_u64()).unwrap_or(0) as usize,
            context_length: f.meta(&key("context_length")).and_then(|v| v.as_u64()).unwrap_or(1 << 20) as usize,
        };
        let kv = u("attention.head_count_kv")?;
        if kv != 1 {
            return Err(HParamsError::Invalid(format!("deepseek4.attention.head_count_kv = {kv}: only one shared KV head is supported")));
        }
        let vl = u("attention.value_length")?;
        if vl != hp.hd {
            return Err(HParamsError::Invalid(format!("deepseek4.attention.value_length = {vl} differs from key_length = {}", hp.hd)));
        }
        hp.validate()?;
        Ok(hp)
    }

    /// Relations between the values that the graph relies on.
    pub fn validate(&self) -> Result<(), HParamsError> {
        let bad = |m: String| Err(HParamsError::Invalid(m));
        let positive = [
            ("block_count", self.n_layer),
            ("embedding_length", self.d),
            ("vocab_size", self.vocab),
            ("attention.head_count", self.n_head),
            ("attention.key_length", self.hd),
            ("attention.q_lora_rank", self.q_lora),
            ("attention.output_group_count", self.o_groups),
            ("attention.output_lora_rank", self.o_lora),
            ("attention.sliding_window", self.window),
            ("hyper_connection.count", self.hc),
            ("hyper_connection.sinkhorn_iterations", self.hc_iters),
            ("expert_count", self.n_expert),
            ("expert_used_count", self.n_expert_used),
            ("expert_feed_forward_length", self.expert_ff),
        ];
        for (k, v) in positive {
            if v == 0 {
                return bad(format!("deepseek4.{k} must be positive"));
            }
        }
        // Guard the sizes the runtime multiplies together against absurd values.
        for (k, v) in [("embedding_length", self.d), ("vocab_size", self.vocab), ("attention.key_length", self.hd), ("expert_count", self.n_expert), ("block_count", self.n_layer)] {
            if v > 1 << 24 {
                return bad(format!("deepseek4.{k} = {v} is absurdly large"));
            }
        }
        if self.compress_ratios.len() != self.n_layer {
            return bad(format!("deepseek4.attention.compress_ratios has {} entries, block_count is {}", self.compress_ratios.len(), self.n_layer));
        }
        if self.swiglu_clamp.len() != self.n_layer {
            return bad(format!("deepseek4.swiglu_clamp_exp has {} entries, block_count is {}", self.swiglu_clamp.len(), self.n_layer));
        }
        if !self.n_rot.is_multiple_of(2) || self.n_rot > self.hd {
            return bad(format!("deepseek4.rope.dimension_count = {} must be even and ≤ key_length {}", self.n_rot, self.hd));
        }
        if !(self.hd - self.n_rot).is_multiple_of(64) {
            return bad(format!("key_length - rope dims = {} is not a multiple of the FP8 block (64)", self.hd - self.n_rot));
        }
        if !self.n_head.is_multiple_of(self.o_groups) {
            return bad(format!("head_count {} is not divisible by output_group_count {}", self.n_head, self.o_groups));
        }
        if self.n_expert_used > self.n_expert {
            return bad(format!("expert_used_count {} > expert_count {}", self.n_expert_used, self.n_expert));
        }
        if self.n_hash > self.n_layer {
            return bad(format!("hash_layer_count {} > block_count {}", self.n_hash, self.n_layer));
        }
        if self.compress_ratios.contains(&CSA_RATIO) && (self.idx_dim != 128 || self.idx_heads == 0 || self.idx_top_k == 0) {
            return bad(format!("indexer: key_length {} must be 128 (Hadamard-128), head_count and top_k positive", self.idx_dim));
        }
        if self.compress_ratios.contains(&1) {
            return bad("a compress ratio of 1 is not supported".into());
        }
        Ok(())
    }

    pub fn is_hash_layer(&self, layer: usize) -> bool {
        layer < self.n_hash
    }

    /// Inverse RoPE frequencies for one pair index each: plain RoPE for sliding layers,
    /// YaRN (no magnitude factor) with the compress base for compressed layers.
    pub fn inv_freq(&self, compressed: bool) -> Vec<f64> {
        let dim = self.n_rot as f64;
        let base = if compressed { self.compress_rope_base } else { self.rope_base };
        let half = self.n_rot / 2;
        let plain: Vec<f64> = (0..half).map(|i| 1.0 / base.powf(2.0 * i as f64 / dim)).collect();
        if !compressed || self.yarn_factor <= 1.0 {
            return plain;
        }
        // YaRN: interpolate the low frequencies, keep the high ones, ramp in between.
        let corr = |rot: f64| dim * (self.yarn_orig_ctx / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
        let low = corr(self.yarn_beta_fast).floor().max(0.0);
        let high = corr(self.yarn_beta_slow).ceil().min(dim - 1.0);
        let high = if low == high { high + 0.001 } else { high };
        plain
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolate = 1.0 - ramp;
                f / self.yarn_factor * (1.0 - extrapolate) + f * extrapolate
            })
            .collect()
    }
}
