//! The CUDA-text kernels in one list: what `ds4 gen` writes and states in the manifest and
//! what the runtime compiles (`runtime/src/cuda/compile.rs`) both come from here, so a new
//! one is an entry here and a line in `manifest::cuda_kernels` for the ops that run it.
//!
//! Each kernel either takes an IR kernel's contract (its parameters and output layout, as
//! the generated kernel it stands for: `attention_tiled`, `attention_merge_warp`,
//! `hc_mix_warp`, `top_k_sort`) or its own parameter list in the quant kernels' form
//! (`hc_pre`, `hc_comb`, `router_select` (and with x's digits), the integer mat-vecs and
//! their digits (`x_digits`, `rms_norm_digits`), `matvec_f16_vec`, `norm_rope`,
//! `matvec_dense_q8_0_r` (generated from its quant declaration, CUDA's only),
//! `attention_merge_rope`, `split_x_bf16x3`, `copy_spans`, `argmax_rows`).

use crate::quant::{cuda_matvec_dense, cuda_split, QParam};
use crate::{cuda_argmax, cuda_attention, cuda_attention_merge, cuda_copy, cuda_digits, cuda_f16_vec, cuda_hc_mix, cuda_hc_pre, cuda_indexer_scores, cuda_norm_rope, cuda_router, cuda_top_k, cuda_top_k_radix, Target};
use ds4_ir::kir::Kernel;

/// A CUDA-text kernel's parameters.
pub enum TextParams {
    /// An IR kernel's contract.
    Contract(Kernel),
    /// Its own, in launch order.
    Own(Vec<QParam>),
}

/// One CUDA-text kernel.
pub struct TextKernel {
    pub name: &'static str,
    pub params: TextParams,
    /// Threads a block (the most, where a launch picks fewer).
    pub threads: u32,
    /// Dynamic shared memory the kernel may ask for (set as its attribute at load).
    pub dyn_shared: u32,
    /// The manifest's launch fields (a JSON object's inside).
    pub launch: String,
    /// The shared memory the manifest states.
    pub manifest_shared: u32,
    source: fn(Target) -> Option<String>,
}

impl TextKernel {
    /// The kernel's source on `target` (None on the targets that are not CUDA).
    pub fn source(&self, target: Target) -> Option<String> {
        (self.source)(target)
    }
}

/// A source that takes no target: CUDA's alone.
fn cuda_only(target: Target, source: fn() -> String) -> Option<String> {
    target.is_cuda().then(source)
}

/// A kernel that asks for no dynamic shared memory (and states none).
fn unshared(name: &'static str, params: TextParams, threads: u32, launch: String, source: fn(Target) -> Option<String>) -> TextKernel {
    TextKernel { name, params, threads, dyn_shared: 0, launch, manifest_shared: 0, source }
}

/// A form of `matvec_dense_q8_0_r` (`cuda_matvec_dense::FORMS`) for rows of `k` values.
fn dense_kernel(form: &cuda_matvec_dense::Dense, source: fn(Target) -> Option<String>, k: String) -> TextKernel {
    TextKernel {
        name: form.name,
        params: TextParams::Own(cuda_matvec_dense::params()),
        threads: cuda_matvec_dense::THREADS,
        dyn_shared: 0,
        launch: format!("\"grid\": \"[ceil(n / {}), m, 1]\", \"block\": [{}, 1, 1], \"k\": \"{k}\"", form.rows, cuda_matvec_dense::THREADS),
        manifest_shared: cuda_matvec_dense::shared_bytes(form),
        source,
    }
}

/// A form of `attention_tiled` (`extra`: more of its launch description).
fn attention_form(name: &'static str, extra: &str, source: fn(Target) -> Option<String>) -> TextKernel {
    TextKernel {
        name,
        params: TextParams::Contract(cuda_attention::contract()),
        threads: cuda_attention::THREADS,
        dyn_shared: cuda_attention::DYN_SHARED_BYTES,
        launch: format!(
            "\"grid\": \"[tokens · ceil(heads / {}) · nc, 1, 1]\", \"block\": [{}, 1, 1], \"max_hd\": {}{extra}",
            cuda_attention::TILE_HEADS,
            cuda_attention::THREADS,
            cuda_attention::MAX_HD
        ),
        manifest_shared: cuda_attention::SHARED_BYTES + cuda_attention::DYN_SHARED_BYTES,
        source,
    }
}

/// A form of `attention_merge_rope` (`chunks`: the chunk counts it takes, for its launch
/// description).
fn merge_rope_form(name: &'static str, chunks: String, source: fn(Target) -> Option<String>) -> TextKernel {
    TextKernel {
        name,
        params: TextParams::Own(cuda_attention_merge::rope_params()),
        threads: cuda_attention_merge::THREADS,
        dyn_shared: cuda_attention_merge::rope_shared_bytes(cuda_attention_merge::ROPE_MAX_HD),
        launch: format!("\"grid\": \"[items, 1, 1]\", \"block\": [{}, 1, 1], {chunks}, \"max_hd\": {}", cuda_attention_merge::THREADS, cuda_attention_merge::ROPE_MAX_HD),
        manifest_shared: cuda_attention_merge::rope_shared_bytes(cuda_attention_merge::ROPE_MAX_HD),
        source,
    }
}

/// Every CUDA-text kernel, in the manifest's order.
pub fn all() -> Vec<TextKernel> {
    vec![
        attention_form(cuda_attention::NAME, "", cuda_attention::source),
        attention_form(cuda_attention::ONE_NAME, ", \"blocks\": \"≤ SMs\"", cuda_attention::one_source),
        unshared(cuda_attention_merge::NAME, TextParams::Contract(cuda_attention_merge::contract()), cuda_attention_merge::THREADS, format!("\"grid\": \"[items, 1, 1]\", \"block\": [{}, 1, 1], \"max_chunks\": {}", cuda_attention_merge::THREADS, cuda_attention_merge::MAX_CHUNKS), cuda_attention_merge::source),
        merge_rope_form(cuda_attention_merge::ROPE_NAME, format!("\"max_chunks\": {}", cuda_attention_merge::MAX_CHUNKS), cuda_attention_merge::rope_source),
        merge_rope_form(cuda_attention_merge::ROPE_EARLY_NAME, format!("\"chunks\": \"{:?}\"", cuda_attention_merge::EARLY_CHUNKS), cuda_attention_merge::rope_early_source),
        unshared(cuda_hc_mix::NAME, TextParams::Contract(cuda_hc_mix::contract()), cuda_hc_mix::THREADS, format!("\"grid\": \"[items, 1, 1]\", \"block\": [{}, 1, 1], \"max_nh\": {}", cuda_hc_mix::THREADS, cuda_hc_mix::MAX_NH), cuda_hc_mix::source),
        TextKernel {
            name: cuda_top_k::NAME,
            params: TextParams::Contract(cuda_top_k::contract()),
            threads: cuda_top_k::MAX_THREADS,
            dyn_shared: cuda_top_k::MAX_SHARED_BYTES,
            launch: format!("\"grid\": \"[items, 1, 1]\", \"block\": \"[clamp(pow2(n) / 2, 32, {}), 1, 1]\", \"max_n\": {}", cuda_top_k::MAX_THREADS, cuda_top_k::MAX_N),
            manifest_shared: cuda_top_k::MAX_SHARED_BYTES,
            source: cuda_top_k::source,
        },
        TextKernel {
            name: cuda_top_k_radix::NAME,
            params: TextParams::Contract(cuda_top_k::contract()),
            threads: cuda_top_k_radix::THREADS,
            dyn_shared: cuda_top_k_radix::MAX_SHARED_BYTES,
            launch: format!("\"grid\": \"[items, 1, 1]\", \"block\": [{}, 1, 1], \"max_k\": {}, \"from_n\": {}", cuda_top_k_radix::THREADS, cuda_top_k_radix::MAX_K, cuda_top_k_radix::FROM_N),
            manifest_shared: cuda_top_k_radix::MAX_SHARED_BYTES,
            source: cuda_top_k_radix::source,
        },
        unshared(cuda_top_k_radix::ROWS_NAME, TextParams::Contract(cuda_top_k::contract()), cuda_top_k_radix::THREADS, format!("\"grid\": \"[items, 1, 1]\", \"block\": [{}, 1, 1], \"max_k\": {}, \"order\": \"rows\"", cuda_top_k_radix::THREADS, cuda_top_k_radix::MAX_K), cuda_top_k_radix::rows_source),
        TextKernel {
            name: cuda_indexer_scores::NAME,
            params: TextParams::Own(cuda_indexer_scores::params()),
            threads: cuda_indexer_scores::MAX_THREADS,
            dyn_shared: cuda_indexer_scores::MAX_SHARED_BYTES,
            launch: format!(
                "\"grid\": \"[min(ceil(n_rows / tile_rows), 2 · SMs), tokens ≤ {}, 1]\", \"block\": \"[4 · heads in whole warps, 1, 1]\", \"tile_rows\": \"4 to {}, the fewest that fill the SMs\"",
                cuda_indexer_scores::MAX_TOKENS,
                cuda_indexer_scores::TILE_ROWS
            ),
            manifest_shared: cuda_indexer_scores::MAX_SHARED_BYTES,
            source: |t| cuda_only(t, cuda_indexer_scores::source),
        },
        unshared(cuda_hc_pre::NAME, TextParams::Own(cuda_hc_pre::params()), cuda_hc_pre::THREADS, format!("\"grid\": \"[2·nh + nh² + ceil(r_rows / {}), tokens ≤ {}, 1]\", \"block\": [{}, 1, 1]", cuda_hc_pre::ROUTER_ROWS, cuda_hc_pre::MAX_TOKENS, cuda_hc_pre::THREADS), |t| cuda_only(t, cuda_hc_pre::source)),
        unshared(cuda_hc_pre::HC_COMB, TextParams::Own(cuda_hc_pre::comb_params()), 32, "\"grid\": \"[tokens, 1, 1]\", \"block\": [32, 1, 1]".to_string(), |t| cuda_only(t, cuda_hc_pre::comb_source)),
        TextKernel {
            name: cuda_router::NAME,
            params: TextParams::Own(cuda_router::params()),
            threads: cuda_top_k::MAX_THREADS,
            dyn_shared: cuda_router::MAX_SHARED_BYTES,
            launch: format!("\"grid\": \"[tokens, 1, 1]\", \"block\": \"[clamp(pow2(n) / 2, 32, {}), 1, 1]\", \"max_k\": {}", cuda_top_k::MAX_THREADS, cuda_router::MAX_K),
            manifest_shared: cuda_router::MAX_SHARED_BYTES,
            source: |t| cuda_only(t, cuda_router::source),
        },
        TextKernel {
            name: cuda_router::WITH_DIGITS,
            params: TextParams::Own(cuda_router::with_digits_params()),
            threads: cuda_top_k::MAX_THREADS,
            dyn_shared: cuda_router::MAX_SHARED_BYTES,
            launch: format!("\"grid\": \"[tokens + x_digits' blocks, 1, 1]\", \"block\": \"[clamp(pow2(n) / 2, 32, {}), 1, 1]\", \"max_k\": {}", cuda_top_k::MAX_THREADS, cuda_router::MAX_K),
            manifest_shared: cuda_router::MAX_SHARED_BYTES,
            source: cuda_router::with_digits_source,
        },
        unshared(cuda_argmax::NAME, TextParams::Own(cuda_argmax::params()), cuda_argmax::THREADS, format!("\"grid\": \"[rows, 1, 1]\", \"block\": [{}, 1, 1]", cuda_argmax::THREADS), |t| cuda_only(t, cuda_argmax::source)),
        unshared(cuda_copy::NAME, TextParams::Own(cuda_copy::params()), cuda_copy::THREADS, format!("\"grid\": \"[{}, copies ≤ {}, 1]\", \"block\": [{}, 1, 1]", cuda_copy::BLOCKS_A_SPAN, cuda_copy::MAX_SPANS, cuda_copy::THREADS), |t| cuda_only(t, cuda_copy::source)),
        unshared(cuda_digits::X_DIGITS, TextParams::Own(cuda_digits::x_digits_params()), cuda_digits::X_THREADS, format!("\"grid\": \"[ceil(k / {}), 1, 1]\", \"block\": [{}, 1, 1]", cuda_digits::X_BLOCK * cuda_digits::X_THREADS as usize / 32, cuda_digits::X_THREADS), cuda_digits::x_digits_source),
        unshared(cuda_digits::NORM_DIGITS, TextParams::Own(cuda_digits::norm_digits_params()), cuda_digits::NORM_DIGITS_MAX_K as u32, format!("\"grid\": [1, 1, 1], \"block\": \"[k ≤ {}, 1, 1]\"", cuda_digits::NORM_DIGITS_MAX_K), cuda_digits::norm_digits_source),
        unshared(cuda_digits::MATVEC_IQ2_XXS, TextParams::Own(cuda_digits::matvec_params()), cuda_digits::THREADS, format!("\"grid\": \"[n / {}, 2·picks, 1]\", \"block\": [{}, 1, 1]", cuda_digits::ROWS_PER_BLOCK, cuda_digits::THREADS), |t| cuda_only(t, cuda_digits::matvec_source)),
        unshared(cuda_digits::MATVEC_IQ2_XXS_SWIGLU, TextParams::Own(cuda_digits::swiglu_params()), cuda_digits::SWIGLU_THREADS, format!("\"grid\": \"[n / {}, picks, 1]\", \"block\": [{}, 1, 1]", cuda_digits::X_BLOCK, cuda_digits::SWIGLU_THREADS), cuda_digits::matvec_swiglu_source),
        TextKernel {
            name: cuda_digits::MATVEC_Q2_K,
            params: TextParams::Own(cuda_digits::down_params()),
            threads: cuda_digits::down_threads(cuda_digits::MAX_PICKS),
            dyn_shared: 0,
            launch: format!("\"grid\": \"[n / {}, 1, 1]\", \"block\": \"[32·picks ≤ {}, 1, 1]\"", cuda_digits::DOWN_ROWS_PER_BLOCK, 32 * cuda_digits::MAX_PICKS),
            manifest_shared: cuda_digits::down_shared_bytes(),
            source: |t| cuda_only(t, cuda_digits::down_source),
        },
        unshared(cuda_digits::MATVEC_Q8_0_R, TextParams::Own(cuda_digits::dense_params()), cuda_digits::THREADS, format!("\"grid\": \"[n / {}, 1, 1]\", \"block\": [{}, 1, 1], \"k\": \"<= {}\"", cuda_digits::ROWS_PER_BLOCK, cuda_digits::THREADS, cuda_digits::DENSE_MAX_K), |t| cuda_only(t, cuda_digits::dense_source)),
        unshared(cuda_f16_vec::NAME, TextParams::Own(cuda_f16_vec::params()), cuda_f16_vec::THREADS, format!("\"grid\": \"[ceil(n / {}), 1, 1]\", \"block\": [{}, 1, 1]", cuda_f16_vec::ROWS, cuda_f16_vec::THREADS), |t| cuda_only(t, cuda_f16_vec::source)),
        dense_kernel(&cuda_matvec_dense::DENSE, cuda_matvec_dense::source, format!("> {}", cuda_matvec_dense::SHORT_MAX_K)),
        dense_kernel(&cuda_matvec_dense::SHORT, cuda_matvec_dense::short_source, format!("<= {}", cuda_matvec_dense::SHORT_MAX_K)),
        TextKernel {
            name: cuda_norm_rope::NAME,
            params: TextParams::Own(cuda_norm_rope::params()),
            threads: cuda_norm_rope::MAX_THREADS,
            dyn_shared: cuda_norm_rope::shared_bytes(cuda_norm_rope::MAX_N),
            launch: format!("\"grid\": \"[rows, 1, 1]\", \"block\": \"[the norm's threads ≤ {}, 1, 1]\", \"max_n\": {}", cuda_norm_rope::MAX_THREADS, cuda_norm_rope::MAX_N),
            manifest_shared: cuda_norm_rope::shared_bytes(cuda_norm_rope::MAX_N),
            source: cuda_norm_rope::source,
        },
        unshared(cuda_norm_rope::ROPE_HADAMARD, TextParams::Own(cuda_norm_rope::rope_hadamard_params()), cuda_norm_rope::ROPE_HADAMARD_THREADS, format!("\"grid\": \"[ceil(rows / {}), 1, 1]\", \"block\": [{}, 1, 1], \"n\": {}", cuda_norm_rope::ROPE_HADAMARD_THREADS / 32, cuda_norm_rope::ROPE_HADAMARD_THREADS, cuda_norm_rope::HADAMARD_N), cuda_norm_rope::rope_hadamard_source),
        unshared(cuda_split::NAME, TextParams::Own(cuda_split::params()), cuda_split::THREADS, format!("\"grid\": \"[ceil(n / {}), 1, 1]\", \"block\": [{}, 1, 1]", 16 * cuda_split::THREADS, cuda_split::THREADS), |t| cuda_only(t, cuda_split::source)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique, and every kernel has CUDA source on both CUDA targets and none on
    /// the others, whose entry point declares its parameters in order (its own, or the IR
    /// kernel's contract).
    #[test]
    fn every_text_kernel_once_and_only_for_cuda() {
        let all = all();
        let mut names: Vec<_> = all.iter().map(|k| k.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len(), "a name twice");
        for k in &all {
            for t in [Target::CudaSm90, Target::CudaSm120] {
                assert!(k.source(t).is_some_and(|s| s.contains(&format!("{}(", k.name))), "{} on {t}", k.name);
                if let TextParams::Own(params) = &k.params {
                    crate::cuda::assert_declares_params(&k.source(t).unwrap(), k.name, params);
                }
            }
            if let TextParams::Contract(contract) = &k.params {
                crate::cuda::assert_takes_contract(k.source, k.name, contract);
            }
            for t in [Target::Cpu, Target::Wgsl, Target::Metal] {
                assert!(k.source(t).is_none(), "{} on {t}", k.name);
            }
        }
    }
}
