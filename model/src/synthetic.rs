//! Synthetic DS4-architecture models with random weights from a fixed seed: the embedded
//! default that `ds4 run` uses without `--model`, and test fixtures. The tensor names,
//! GGUF shapes and metadata follow the real layout, so the normal loader reads them.

use crate::gguf::{GgufError, MetaValue};
use crate::gguf_writer::GgufWriter;
use ds4_ir::GgmlType;

/// The shape of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthConfig {
    pub name: String,
    pub n_layer: usize,
    pub d: usize,
    pub vocab: usize,
    pub n_head: usize,
    pub hd: usize,
    pub n_rot: usize,
    pub q_lora: usize,
    pub o_groups: usize,
    pub o_lora: usize,
    pub n_expert: usize,
    pub top_k: usize,
    pub ff: usize,
    pub n_hash: usize,
    pub window: usize,
    pub ratios: Vec<usize>,
    pub idx_heads: usize,
    pub idx_top_k: usize,
    pub seed: u64,
    /// `None`: every matrix F32 (F16 embedding and head), all data generated here.
    /// `Some(recipe)`: the real files' tensor types for that recipe, and the quantized and
    /// large F16 tensors *deferred* (no data; see [`build_writer`]).
    pub real_layout: Option<RealLayout>,
}

/// The tensor types of real DeepSeek-V4-Flash GGUFs (DS4_FORWARD.md): Q8_0 attention,
/// shared experts and head, F16 small matrices, routed experts by recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RealLayout {
    /// Routed gate/up IQ2_XXS, down Q2_K.
    Q2,
    /// Routed experts Q4_K.
    Q4,
}

impl RealLayout {
    pub fn parse(s: &str) -> Option<RealLayout> {
        match s {
            "q2" => Some(RealLayout::Q2),
            "q4" => Some(RealLayout::Q4),
            _ => None,
        }
    }

    /// The type of tensor `name` in a real file (`generated`: what the tiny layout uses).
    fn type_of(self, name: &str, generated: GgmlType) -> GgmlType {
        let routed = name.contains("_exps.");
        if routed {
            return match (self, name.contains("ffn_down")) {
                (RealLayout::Q4, _) => GgmlType::Q4K,
                (RealLayout::Q2, true) => GgmlType::Q2K,
                (RealLayout::Q2, false) => GgmlType::Iq2Xxs,
            };
        }
        let q8 = ["attn_q_a.", "attn_q_b.", "attn_kv.", "attn_output_a.", "attn_output_b.", "_shexp.", "output.weight"];
        if q8.iter().any(|p| name.contains(p)) && !name.contains("indexer") {
            return GgmlType::Q8_0;
        }
        match generated {
            GgmlType::F32 => GgmlType::F16,
            t => t,
        }
    }
}

impl SynthConfig {
    /// The embedded default: tiny, six layers covering every layer kind, the real DS4
    /// vocabulary size so real token ids fit.
    pub fn tiny_default() -> SynthConfig {
        SynthConfig {
            name: "ds4-embedded-tiny (random weights)".into(),
            n_layer: 6,
            d: 128,
            vocab: 129_280,
            n_head: 4,
            hd: 128,
            n_rot: 64,
            q_lora: 64,
            o_groups: 2,
            o_lora: 32,
            n_expert: 8,
            top_k: 2,
            ff: 128,
            n_hash: 2,
            window: 16,
            ratios: vec![0, 0, 4, 8, 4, 8],
            idx_heads: 4,
            idx_top_k: 8,
            seed: 0x05D4,
            real_layout: None,
        }
    }

    /// DeepSeek-V4-Flash's shapes and the real file layout (`ds4 bench --synthetic
    /// ds4-flash`), `n_layer` layers (43 in the real model). Big tensors are deferred: the
    /// bench generates them in device memory.
    pub fn ds4_flash(n_layer: usize, recipe: RealLayout) -> SynthConfig {
        SynthConfig {
            name: format!("ds4-flash-synthetic-{} (random weights)", if recipe == RealLayout::Q2 { "q2" } else { "q4" }),
            n_layer,
            d: 4096,
            vocab: 129_280,
            n_head: 64,
            hd: 512,
            n_rot: 64,
            q_lora: 1024,
            o_groups: 8,
            o_lora: 1024,
            n_expert: 256,
            top_k: 6,
            ff: 2048,
            n_hash: 3.min(n_layer),
            window: 128,
            // Two sliding-window-only layers, then CSA (4) and HCA (128) alternating.
            ratios: (0..n_layer).map(|l| if l < 2 { 0 } else if l % 2 == 0 { 4 } else { 128 }).collect(),
            idx_heads: 64,
            idx_top_k: 512,
            seed: 0x05D4,
            real_layout: Some(recipe),
        }
    }
}

/// F16 tensors above this many bytes are deferred in the real layout.
const DEFER_F16_BYTES: usize = 1 << 20;

/// splitmix64 normal-ish values (sum of uniforms): deterministic on every platform.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately N(0, 1): the Irwin–Hall sum of 4 uniforms, rescaled.
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * (3.0f32).sqrt()
    }
}

/// Build the GGUF bytes of a synthetic model with F32 weights (F16 embedding/output to
/// keep a large vocabulary small).
pub fn build(cfg: &SynthConfig) -> Result<Vec<u8>, GgufError> {
    build_writer(cfg)?.to_bytes()
}

/// The synthetic model as a writer; with `real_layout`, its big tensors are deferred
/// (`GgufWriter::to_zero_filled` leaves them as zeros).
pub fn build_writer(cfg: &SynthConfig) -> Result<GgufWriter, GgufError> {
    let mut rng = Rng(cfg.seed);
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("deepseek4.{s}");
    let u = |v: usize| MetaValue::U32(v as u32);
    w.add_meta("general.architecture", MetaValue::Str("deepseek4".into()))?;
    w.add_meta("general.name", MetaValue::Str(cfg.name.clone()))?;
    for (key, v) in [
        ("block_count", cfg.n_layer),
        ("context_length", 1 << 20),
        ("embedding_length", cfg.d),
        ("vocab_size", cfg.vocab),
        ("attention.head_count", cfg.n_head),
        ("attention.head_count_kv", 1),
        ("attention.key_length", cfg.hd),
        ("attention.value_length", cfg.hd),
        ("rope.dimension_count", cfg.n_rot),
        ("attention.q_lora_rank", cfg.q_lora),
        ("attention.output_lora_rank", cfg.o_lora),
        ("attention.output_group_count", cfg.o_groups),
        ("expert_count", cfg.n_expert),
        ("expert_used_count", cfg.top_k),
        ("expert_feed_forward_length", cfg.ff),
        ("expert_shared_count", 1),
        ("hash_layer_count", cfg.n_hash),
        ("attention.sliding_window", cfg.window),
        ("attention.indexer.head_count", cfg.idx_heads),
        ("attention.indexer.key_length", 128),
        ("attention.indexer.top_k", cfg.idx_top_k),
        ("hyper_connection.count", 4),
        ("hyper_connection.sinkhorn_iterations", 20),
        ("rope.scaling.original_context_length", 65536),
        ("nextn_predict_layers", 0),
    ] {
        w.add_meta(k(key), u(v))?;
    }
    for (key, v) in [
        ("hyper_connection.epsilon", 1e-6f32),
        ("rope.freq_base", 10000.0),
        ("rope.scaling.factor", 16.0),
        ("rope.scaling.yarn_beta_fast", 32.0),
        ("rope.scaling.yarn_beta_slow", 1.0),
        ("attention.compress_rope_freq_base", 160000.0),
        ("expert_weights_scale", 1.5),
        ("attention.layer_norm_rms_epsilon", 1e-6),
    ] {
        w.add_meta(k(key), MetaValue::F32(v))?;
    }
    w.add_meta(k("expert_weights_norm"), MetaValue::Bool(true))?;
    w.add_meta(k("expert_gating_func_name"), MetaValue::Str("sqrtsoftplus".into()))?;
    w.add_meta(k("attention.compress_ratios"), MetaValue::Array(cfg.ratios.iter().map(|&r| MetaValue::U32(r as u32)).collect()))?;
    w.add_meta(k("swiglu_clamp_exp"), MetaValue::Array(vec![MetaValue::F32(10.0); cfg.n_layer]))?;

    let f32_bytes = |v: Vec<f32>| -> Vec<u8> { v.into_iter().flat_map(|x| x.to_le_bytes()).collect() };
    // A random matrix with ne = dims, scaled like a fan-in init.
    let layout = cfg.real_layout;
    let mut rand_t = |w: &mut GgufWriter, name: &str, dims: &[usize], std: f32, ty: GgmlType| {
        let n: usize = dims.iter().product();
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let ty = layout.map_or(ty, |l| l.type_of(name, ty));
        if layout.is_some() && (!matches!(ty, GgmlType::F32 | GgmlType::F16) || (ty == GgmlType::F16 && n * 2 > DEFER_F16_BYTES)) {
            w.add_tensor_deferred(name, ty, &dims64).expect("synthetic tensor sizes are consistent");
            return;
        }
        let vals: Vec<f32> = (0..n).map(|_| rng.normal() * std).collect();
        let bytes = match ty {
            GgmlType::F16 => vals.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            _ => f32_bytes(vals),
        };
        w.add_tensor(name, ty, &dims64, bytes).expect("synthetic tensor sizes are consistent");
    };
    let const_t = |w: &mut GgufWriter, name: &str, dims: &[usize], v: f32| {
        let n: usize = dims.iter().product();
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        w.add_tensor(name, GgmlType::F32, &dims64, f32_bytes(vec![v; n])).expect("synthetic tensor sizes are consistent");
    };
    let (d, hc) = (cfg.d, 4usize);
    let mw = ds4_ir::kernels::hc::mix_width(hc);
    let fan = |n: usize| 1.0 / (n as f32).sqrt();
    rand_t(&mut w, "token_embd.weight", &[d, cfg.vocab], 1.0, GgmlType::F16);
    for l in 0..cfg.n_layer {
        let p = format!("blk.{l}");
        for hcn in ["hc_attn", "hc_ffn"] {
            rand_t(&mut w, &format!("{p}.{hcn}_fn.weight"), &[hc * d, mw], fan(hc * d), GgmlType::F32);
            const_t(&mut w, &format!("{p}.{hcn}_scale.weight"), &[3], 1.0);
            const_t(&mut w, &format!("{p}.{hcn}_base.weight"), &[mw], 0.0);
        }
        const_t(&mut w, &format!("{p}.attn_norm.weight"), &[d], 1.0);
        const_t(&mut w, &format!("{p}.ffn_norm.weight"), &[d], 1.0);
        rand_t(&mut w, &format!("{p}.attn_q_a.weight"), &[d, cfg.q_lora], fan(d), GgmlType::F32);
        const_t(&mut w, &format!("{p}.attn_q_a_norm.weight"), &[cfg.q_lora], 1.0);
        rand_t(&mut w, &format!("{p}.attn_q_b.weight"), &[cfg.q_lora, cfg.n_head * cfg.hd], fan(cfg.q_lora), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.attn_kv.weight"), &[d, cfg.hd], fan(d), GgmlType::F32);
        const_t(&mut w, &format!("{p}.attn_kv_a_norm.weight"), &[cfg.hd], 1.0);
        const_t(&mut w, &format!("{p}.attn_sinks.weight"), &[cfg.n_head], 0.0);
        let gin = cfg.n_head * cfg.hd / cfg.o_groups;
        rand_t(&mut w, &format!("{p}.attn_output_a.weight"), &[gin, cfg.o_groups * cfg.o_lora], fan(gin), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.attn_output_b.weight"), &[cfg.o_groups * cfg.o_lora, d], fan(cfg.o_groups * cfg.o_lora), GgmlType::F32);
        let r = cfg.ratios[l];
        if r != 0 {
            let c = if r == 4 { 2 } else { 1 };
            rand_t(&mut w, &format!("{p}.attn_compressor_kv.weight"), &[d, c * cfg.hd], fan(d), GgmlType::F32);
            rand_t(&mut w, &format!("{p}.attn_compressor_gate.weight"), &[d, c * cfg.hd], fan(d), GgmlType::F32);
            const_t(&mut w, &format!("{p}.attn_compressor_ape.weight"), &[c * cfg.hd, r], 0.0);
            const_t(&mut w, &format!("{p}.attn_compressor_norm.weight"), &[cfg.hd], 1.0);
            if r == 4 {
                rand_t(&mut w, &format!("{p}.indexer.attn_q_b.weight"), &[cfg.q_lora, cfg.idx_heads * 128], fan(cfg.q_lora), GgmlType::F32);
                rand_t(&mut w, &format!("{p}.indexer.proj.weight"), &[d, cfg.idx_heads], fan(d), GgmlType::F32);
                rand_t(&mut w, &format!("{p}.indexer_compressor_kv.weight"), &[d, 256], fan(d), GgmlType::F32);
                rand_t(&mut w, &format!("{p}.indexer_compressor_gate.weight"), &[d, 256], fan(d), GgmlType::F32);
                const_t(&mut w, &format!("{p}.indexer_compressor_ape.weight"), &[256, 4], 0.0);
                const_t(&mut w, &format!("{p}.indexer_compressor_norm.weight"), &[128], 1.0);
            }
        }
        rand_t(&mut w, &format!("{p}.ffn_gate_inp.weight"), &[d, cfg.n_expert], fan(d), GgmlType::F32);
        if l < cfg.n_hash {
            let tbl: Vec<u8> = (0..cfg.vocab * cfg.top_k)
                .map(|i| (((i / cfg.top_k) * cfg.top_k + i % cfg.top_k) % cfg.n_expert) as i32)
                .flat_map(|e| e.to_le_bytes())
                .collect();
            w.add_tensor(format!("{p}.ffn_gate_tid2eid.weight"), GgmlType::I32, &[cfg.top_k as u64, cfg.vocab as u64], tbl).expect("sizes");
        } else {
            const_t(&mut w, &format!("{p}.exp_probs_b.bias"), &[cfg.n_expert], 0.0);
        }
        rand_t(&mut w, &format!("{p}.ffn_gate_exps.weight"), &[d, cfg.ff, cfg.n_expert], fan(d), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.ffn_up_exps.weight"), &[d, cfg.ff, cfg.n_expert], fan(d), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.ffn_down_exps.weight"), &[cfg.ff, d, cfg.n_expert], fan(cfg.ff), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.ffn_gate_shexp.weight"), &[d, cfg.ff], fan(d), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.ffn_up_shexp.weight"), &[d, cfg.ff], fan(d), GgmlType::F32);
        rand_t(&mut w, &format!("{p}.ffn_down_shexp.weight"), &[cfg.ff, d], fan(cfg.ff), GgmlType::F32);
    }
    rand_t(&mut w, "output_hc_fn.weight", &[hc * d, hc], fan(hc * d), GgmlType::F32);
    const_t(&mut w, "output_hc_base.weight", &[hc], 0.0);
    const_t(&mut w, "output_hc_scale.weight", &[1], 1.0);
    const_t(&mut w, "output_norm.weight", &[d], 1.0);
    rand_t(&mut w, "output.weight", &[d, cfg.vocab], fan(d), GgmlType::F16);
    Ok(w)
}
