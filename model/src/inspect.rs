//! `ds4 inspect`: a readable (or JSON) summary of a GGUF file's header.
//!
//! Long arrays and strings are abbreviated so that a real model (a 129,280-entry token
//! list, a multi-kilobyte chat template) still gives a summary that fits on a screen.

use crate::gguf::{GgufFile, MetaValue};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Array elements shown before "… N more".
const ARRAY_PREFIX: usize = 5;
/// Characters of a string shown before "…".
const STRING_CHARS: usize = 80;
/// Characters of a string inside an array.
const ARRAY_STRING_CHARS: usize = 32;

/// `s` cut to `max` characters (on a char boundary), and whether it was cut.
fn truncate(s: &str, max: usize) -> (&str, bool) {
    match s.char_indices().nth(max) {
        Some((i, _)) => (&s[..i], true),
        None => (s, false),
    }
}

/// A string as a quoted, escaped literal, cut if long.
fn quoted(s: &str, max: usize) -> String {
    let (t, cut) = truncate(s, max);
    let mut out = format!("{t:?}");
    if cut {
        let _ = write!(out, "… ({} chars)", s.chars().count());
    }
    out
}

fn render_value(v: &MetaValue, str_max: usize) -> String {
    match v {
        MetaValue::Str(s) => quoted(s, str_max),
        MetaValue::Array(a) => {
            let shown: Vec<String> =
                a.iter().take(ARRAY_PREFIX).map(|e| render_value(e, ARRAY_STRING_CHARS)).collect();
            let mut out = format!("[{}", shown.join(", "));
            if a.len() > ARRAY_PREFIX {
                let _ = write!(out, ", … {} more", a.len() - ARRAY_PREFIX);
            }
            out.push(']');
            out
        }
        MetaValue::F32(x) => format!("{x:?}"),
        MetaValue::F64(x) => format!("{x:?}"),
        MetaValue::U8(x) => x.to_string(),
        MetaValue::I8(x) => x.to_string(),
        MetaValue::U16(x) => x.to_string(),
        MetaValue::I16(x) => x.to_string(),
        MetaValue::U32(x) => x.to_string(),
        MetaValue::I32(x) => x.to_string(),
        MetaValue::U64(x) => x.to_string(),
        MetaValue::I64(x) => x.to_string(),
        MetaValue::Bool(b) => b.to_string(),
    }
}

fn shape_str(dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(", "))
}

/// Per GGML type: tensor count and bytes (ordered by type name for stable output).
fn totals_by_type(f: &GgufFile) -> BTreeMap<&'static str, (usize, u64)> {
    let mut m = BTreeMap::new();
    for t in &f.tensors {
        let e = m.entry(t.ggml_type.name()).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    m
}

pub fn inspect_text(f: &GgufFile) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "GGUF version {}, alignment {}, data offset {}, file size {} bytes",
        f.version,
        f.alignment,
        f.data_offset,
        f.file_size()
    );

    let _ = writeln!(s, "\nmetadata ({} keys):", f.metadata.len());
    let kw = f.metadata.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    for (k, v) in &f.metadata {
        let _ = writeln!(s, "  {k:<kw$}  {} = {}", v.type_desc(), render_value(v, STRING_CHARS));
    }

    let _ = writeln!(s, "\ntensors ({}):", f.tensors.len());
    let nw = f.tensors.iter().map(|t| t.name.chars().count()).max().unwrap_or(0).max(4);
    let shapes: Vec<String> = f.tensors.iter().map(|t| shape_str(&t.dims)).collect();
    let sw = shapes.iter().map(String::len).max().unwrap_or(0).max(9);
    let _ = writeln!(s, "  {:<nw$}  {:<7}  {:<sw$}  {:>12}  {:>12}", "name", "type", "shape(ne)", "bytes", "offset");
    for (t, shape) in f.tensors.iter().zip(&shapes) {
        let _ = writeln!(
            s,
            "  {:<nw$}  {:<7}  {:<sw$}  {:>12}  {:>12}",
            t.name,
            t.ggml_type.name(),
            shape,
            t.n_bytes,
            t.offset
        );
    }

    let n_elem: u64 = f.tensors.iter().map(|t| t.n_elements()).sum();
    let n_bytes: u64 = f.tensors.iter().map(|t| t.n_bytes).sum();
    let _ = writeln!(s, "\ntotal: {} tensors, {} elements, {} bytes of tensor data", f.tensors.len(), n_elem, n_bytes);
    for (ty, (count, bytes)) in totals_by_type(f) {
        let _ = writeln!(s, "  {ty:<7} {count:>6} tensors  {bytes:>14} bytes");
    }
    s
}

/// A metadata value for JSON: scalars as themselves, strings cut at a longer limit than the
/// text form, arrays as `{"len", "head", "truncated"}` around a prefix.
fn value_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::Str(s) => {
            let (t, cut) = truncate(s, 4 * STRING_CHARS);
            if cut {
                json!({ "prefix": t, "chars": s.chars().count(), "truncated": true })
            } else {
                json!(s)
            }
        }
        MetaValue::Array(a) => json!({
            "len": a.len(),
            "head": a.iter().take(ARRAY_PREFIX).map(value_json).collect::<Vec<_>>(),
            "truncated": a.len() > ARRAY_PREFIX,
        }),
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        // NaN and infinities have no JSON form; serde_json turns them into null.
        MetaValue::F32(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        MetaValue::Bool(b) => json!(b),
    }
}

pub fn inspect_json(f: &GgufFile) -> Value {
    let metadata: Vec<Value> = f
        .metadata
        .iter()
        .map(|(k, v)| json!({ "key": k, "type": v.type_desc(), "value": value_json(v) }))
        .collect();
    let tensors: Vec<Value> = f
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ggml_type.name(),
                "shape": t.dims,
                "n_elements": t.n_elements(),
                "bytes": t.n_bytes,
                "offset": t.offset,
            })
        })
        .collect();
    let by_type: serde_json::Map<String, Value> = totals_by_type(f)
        .into_iter()
        .map(|(ty, (count, bytes))| (ty.to_string(), json!({ "tensors": count, "bytes": bytes })))
        .collect();
    json!({
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "file_size": f.file_size(),
        "metadata": metadata,
        "tensors": tensors,
        "totals": {
            "tensors": f.tensors.len(),
            "elements": f.tensors.iter().map(|t| t.n_elements()).sum::<u64>(),
            "bytes": f.tensors.iter().map(|t| t.n_bytes).sum::<u64>(),
            "by_type": by_type,
        },
    })
}
