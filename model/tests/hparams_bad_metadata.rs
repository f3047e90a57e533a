//! Metadata the graph cannot be built from is refused with a message naming the key.

use ds4_model::gguf::{GgufFile, MetaValue};
use ds4_model::gguf_writer::GgufWriter;
use ds4_model::hparams::HParams;

fn golden_f32() -> GgufFile {
    let base = std::env::var("DS4_GOLDEN_DIR").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden").to_string());
    GgufFile::open(&std::path::Path::new(&base).join("models/tiny-f32/model.gguf")).unwrap()
}

/// tiny-f32's metadata with `key` replaced (or removed when `value` is None); no tensors.
fn with_meta(key: &str, value: Option<MetaValue>) -> GgufFile {
    let src = golden_f32();
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        if k == key {
            if let Some(v) = &value {
                w.add_meta(k.clone(), v.clone()).unwrap();
            }
        } else {
            w.add_meta(k.clone(), v.clone()).unwrap();
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn refused(key: &str, value: Option<MetaValue>, needle: &str) {
    let e = HParams::from_gguf(&with_meta(key, value)).unwrap_err().to_string();
    assert!(e.contains(needle), "{key}: '{needle}' not in '{e}'");
}

#[test]
fn golden_metadata_is_accepted() {
    let hp = HParams::from_gguf(&golden_f32()).unwrap();
    assert_eq!((hp.n_layer, hp.d, hp.vocab, hp.hd, hp.window), (6, 128, 384, 128, 16));
    assert_eq!(hp.compress_ratios, vec![0, 0, 4, 8, 4, 8]);
}

#[test]
fn bad_metadata_is_refused_naming_the_key() {
    refused("deepseek4.block_count", None, "deepseek4.block_count");
    refused("deepseek4.embedding_length", Some(MetaValue::Str("wide".into())), "deepseek4.embedding_length");
    refused("deepseek4.attention.head_count", Some(MetaValue::U32(0)), "head_count must be positive");
    refused("deepseek4.embedding_length", Some(MetaValue::U64(1 << 40)), "absurdly large");
    refused("deepseek4.attention.compress_ratios", Some(MetaValue::Array(vec![MetaValue::U32(0); 5])), "compress_ratios has 5 entries");
    refused("deepseek4.swiglu_clamp_exp", Some(MetaValue::Array(vec![MetaValue::F32(10.0); 2])), "swiglu_clamp_exp has 2 entries");
    refused("deepseek4.attention.head_count_kv", Some(MetaValue::U32(2)), "one shared KV head");
    refused("deepseek4.rope.dimension_count", Some(MetaValue::U32(63)), "must be even");
    refused("deepseek4.expert_used_count", Some(MetaValue::U32(99)), "expert_used_count 99 > expert_count");
    refused("general.architecture", Some(MetaValue::Str("llama".into())), "expected 'deepseek4'");
}
