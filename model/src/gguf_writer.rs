//! GGUF v3 writer.
//!
//! Everything the reader would refuse is refused here, at the call that introduces it
//! (duplicate names, heterogeneous arrays, a data size that does not match the type and
//! dims, a bad alignment), so a file this writer produces always opens.
//!
//! Tensor data is either handed over up front (`add_tensor`) or produced while writing
//! (`add_tensor_deferred` + `write_streaming`), so a converter never has to hold a whole
//! model in memory.

use crate::gguf::{align_up, type_id, GgufError, MetaValue, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use ds4_ir::GgmlType;
use std::collections::HashSet;
use std::io::{self, BufWriter, Seek, Write};
use std::path::Path;

pub const GGUF_VERSION: u32 = 3;

/// A tensor as it will appear in the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ne order.
    pub dims: Vec<u64>,
    pub n_bytes: u64,
}

struct PendingTensor {
    spec: TensorSpec,
    /// None: produced by the callback of `write_streaming`.
    data: Option<Vec<u8>>,
}

pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl std::fmt::Debug for GgufWriter {
    // A summary: tensor data may be gigabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("alignment", &self.alignment)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Add a metadata entry (kept in insertion order). `general.alignment` also sets the
    /// alignment, as it does for a reader.
    pub fn add_meta(&mut self, key: impl Into<String>, value: MetaValue) -> Result<&mut Self, GgufError> {
        let key = key.into();
        if self.keys.contains(&key) {
            return Err(GgufError::Writer(format!("metadata key '{key}' added twice")));
        }
        check_homogeneous(&key, &value, 0)?;
        if key == ALIGNMENT_KEY {
            let a = value.as_u64().ok_or_else(|| {
                GgufError::Writer(format!("{ALIGNMENT_KEY} must be an unsigned integer, got {}", value.type_desc()))
            })?;
            check_alignment(a)?;
            self.alignment = a;
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Set the alignment of the data section and of every tensor. Records (or updates)
    /// `general.alignment` as a u32, the type the GGUF spec gives it.
    pub fn alignment(&mut self, a: u64) -> Result<&mut Self, GgufError> {
        check_alignment(a)?;
        let v = u32::try_from(a).map_err(|_| GgufError::Writer(format!("alignment {a} does not fit in a u32")))?;
        self.alignment = a;
        match self.metadata.iter_mut().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some(entry) => entry.1 = MetaValue::U32(v),
            None => {
                self.keys.insert(ALIGNMENT_KEY.to_string());
                self.metadata.push((ALIGNMENT_KEY.to_string(), MetaValue::U32(v)));
            }
        }
        Ok(self)
    }

    pub fn get_alignment(&self) -> u64 {
        self.alignment
    }

    /// Add a tensor with its data; `data.len()` must be the byte size of `dims` elements
    /// of `ty`.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let spec = self.check_tensor(name.into(), ty, dims)?;
        if data.len() as u64 != spec.n_bytes {
            return Err(GgufError::Writer(format!(
                "tensor '{}': {} {ty} elements (dims {dims:?}) take {} bytes, {} given",
                spec.name,
                dims.iter().product::<u64>(),
                spec.n_bytes,
                data.len()
            )));
        }
        self.push_tensor(spec, Some(data));
        Ok(self)
    }

    /// Add a tensor whose bytes `write_streaming` will ask for when it reaches it.
    pub fn add_tensor_deferred(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<&mut Self, GgufError> {
        let spec = self.check_tensor(name.into(), ty, dims)?;
        self.push_tensor(spec, None);
        Ok(self)
    }

    fn push_tensor(&mut self, spec: TensorSpec, data: Option<Vec<u8>>) {
        self.names.insert(spec.name.clone());
        self.tensors.push(PendingTensor { spec, data });
    }

    fn check_tensor(&self, name: String, ty: GgmlType, dims: &[u64]) -> Result<TensorSpec, GgufError> {
        let bad = |m: String| Err(GgufError::Writer(format!("tensor '{name}': {m}")));
        if self.names.contains(&name) {
            return bad("added twice".into());
        }
        if dims.len() > MAX_DIMS {
            return bad(format!("{} dims, at most {MAX_DIMS} allowed", dims.len()));
        }
        let Some(n) = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) else {
            return bad(format!("dims {dims:?}: element count overflows u64"));
        };
        let block = ty.block_elems() as u64;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % block != 0 {
            return bad(format!("ne[0] = {ne0} is not a multiple of the {ty} block size {block}"));
        }
        let Some(n_bytes) = ty.bytes_for(n) else {
            return bad(format!("dims {dims:?}: byte size overflows u64"));
        };
        Ok(TensorSpec { name, ggml_type: ty, dims: dims.to_vec(), n_bytes })
    }

    /// Names of the tensors added without data.
    pub fn deferred_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().filter(|t| t.data.is_none()).map(|t| t.spec.name.as_str())
    }

    pub fn tensor_specs(&self) -> impl Iterator<Item = &TensorSpec> {
        self.tensors.iter().map(|t| &t.spec)
    }

    /// Data-section offsets of the tensors, in order (each aligned).
    fn layout(&self) -> Result<Vec<u64>, GgufError> {
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut at = 0u64;
        for t in &self.tensors {
            at = align_up(at, self.alignment).ok_or_else(|| GgufError::Writer("data section size overflows".into()))?;
            offsets.push(at);
            at = at.checked_add(t.spec.n_bytes).ok_or_else(|| GgufError::Writer("data section size overflows".into()))?;
        }
        Ok(offsets)
    }

    /// The whole file in memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        self.write_to(&mut out, &mut no_deferred).map_err(|e| GgufError::Writer(e.to_string()))?;
        Ok(out)
    }

    /// Stream the file to `path` (tensor data is not copied).
    pub fn write(&self, path: &Path) -> Result<(), GgufError> {
        self.write_streaming(path, no_deferred)
    }

    /// Stream the file to `path`, calling `fill(spec, out)` for each deferred tensor, in
    /// table order; it must write exactly `spec.n_bytes` bytes.
    pub fn write_streaming<F>(&self, path: &Path, mut fill: F) -> Result<(), GgufError>
    where
        F: FnMut(&TensorSpec, &mut dyn Write) -> io::Result<()>,
    {
        let io = |err| GgufError::Io { path: path.to_path_buf(), err };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        self.write_to(&mut w, &mut fill).map_err(io)?;
        w.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)
    }

    /// Serialize to any writer.
    pub fn write_to<W: Write>(
        &self,
        w: &mut W,
        fill: &mut dyn FnMut(&TensorSpec, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let offsets = self.layout().map_err(io::Error::other)?;
        let mut w = Counting { inner: w, n: 0 };
        self.write_header(&mut w, &offsets)?;
        let data_start = w.n;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            pad_to(&mut w, self.alignment)?;
            debug_assert_eq!(w.n - data_start, off);
            let before = w.n;
            match &t.data {
                Some(d) => w.write_all(d)?,
                None => fill(&t.spec, &mut w)?,
            }
            let wrote = w.n - before;
            if wrote != t.spec.n_bytes {
                return Err(io::Error::other(format!(
                    "tensor '{}': {wrote} bytes written, {} expected",
                    t.spec.name, t.spec.n_bytes
                )));
            }
        }
        // The file ends aligned too, as llama.cpp and the gguf Python package write it, so
        // that files can be concatenated or compared byte for byte.
        pad_to(&mut w, self.alignment)?;
        w.flush()
    }

    /// The header (magic, counts, metadata, tensor table) and the padding after it.
    fn write_header<W: Write>(&self, w: &mut Counting<W>, offsets: &[u64]) -> io::Result<()> {
        w.write_all(GGUF_MAGIC)?;
        w.write_all(&GGUF_VERSION.to_le_bytes())?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            write_str(w, k)?;
            w.write_all(&v.type_id().to_le_bytes())?;
            write_value(w, v)?;
        }
        for (t, &off) in self.tensors.iter().zip(offsets) {
            write_str(w, &t.spec.name)?;
            w.write_all(&(t.spec.dims.len() as u32).to_le_bytes())?;
            for d in &t.spec.dims {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&t.spec.ggml_type.id().to_le_bytes())?;
            w.write_all(&off.to_le_bytes())?;
        }
        pad_to(w, self.alignment)
    }

    /// Writes the file to `path` as a sparse file: header and tensors with data, deferred
    /// tensors left as holes (they read as zeros and cost no disk), so a full-size layout
    /// with its large tensors deferred costs only its small tensors (synthetic benches).
    pub fn write_sparse(&self, path: &Path) -> Result<(), GgufError> {
        let io = |err| GgufError::Io { path: path.to_path_buf(), err };
        let offsets = self.layout()?;
        let mut head = Vec::new();
        self.write_header(&mut Counting { inner: &mut head, n: 0 }, &offsets).map_err(io)?;
        let end = match (self.tensors.last(), offsets.last()) {
            (Some(t), Some(&o)) => o + t.spec.n_bytes,
            _ => 0,
        };
        let total = align_up(head.len() as u64 + end, self.alignment).ok_or_else(|| GgufError::Writer("file size overflows".into()))?;
        let mut f = std::fs::File::create(path).map_err(io)?;
        f.set_len(total).map_err(io)?;
        f.write_all(&head).map_err(io)?;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            if let Some(d) = &t.data {
                f.seek(io::SeekFrom::Start(head.len() as u64 + off)).map_err(io)?;
                f.write_all(d).map_err(io)?;
            }
        }
        Ok(())
    }
}

fn no_deferred(spec: &TensorSpec, _: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::other(format!(
        "tensor '{}' was added without data: use write_streaming to produce it",
        spec.name
    )))
}

fn check_alignment(a: u64) -> Result<(), GgufError> {
    if a == 0 || !a.is_power_of_two() || a > u32::MAX as u64 {
        return Err(GgufError::Writer(format!("alignment {a} is not a non-zero power of two that fits in a u32")));
    }
    Ok(())
}

/// GGUF arrays carry one element type; nested arrays each carry their own.
fn check_homogeneous(key: &str, v: &MetaValue, depth: usize) -> Result<(), GgufError> {
    if let MetaValue::Array(items) = v {
        if depth >= crate::gguf::MAX_ARRAY_DEPTH {
            return Err(GgufError::Writer(format!("metadata key '{key}': arrays nested too deep")));
        }
        if let Some(first) = items.first() {
            let ty = first.type_id();
            for (i, e) in items.iter().enumerate() {
                if e.type_id() != ty {
                    return Err(GgufError::Writer(format!(
                        "metadata key '{key}': array mixes {} (element 0) and {} (element {i})",
                        first.type_name(),
                        e.type_name()
                    )));
                }
                check_homogeneous(key, e, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// Counts bytes written, for padding and for checking deferred tensors.
struct Counting<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pad_to<W: Write>(w: &mut Counting<W>, a: u64) -> io::Result<()> {
    let pad = (a - w.n % a) % a;
    // Alignments are at most u32::MAX, so write zeros in chunks rather than allocate.
    let zeros = [0u8; 4096];
    let mut left = pad;
    while left > 0 {
        let k = left.min(zeros.len() as u64) as usize;
        w.write_all(&zeros[..k])?;
        left -= k as u64;
    }
    Ok(())
}

fn write_str<W: Write>(w: &mut W, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value<W: Write>(w: &mut W, v: &MetaValue) -> io::Result<()> {
    match v {
        MetaValue::U8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I8(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I16(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::U32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F32(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::Bool(b) => w.write_all(&[*b as u8]),
        MetaValue::Str(s) => write_str(w, s),
        MetaValue::U64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::I64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::F64(x) => w.write_all(&x.to_le_bytes()),
        MetaValue::Array(items) => {
            // An empty array has no element to take a type from; any type reads back as
            // the same empty array, so u32 (the commonest) is used.
            let elem = items.first().map_or(type_id::U32, MetaValue::type_id);
            w.write_all(&elem.to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|e| write_value(w, e))
        }
    }
}
