//! GGUF reader (versions 2 and 3, little-endian), zero-copy over a memory map.
//!
//! The header (metadata and tensor table) is parsed into owned values at open; tensor data
//! is never copied: `tensor_data` hands out slices of the mapping. Every count, length and
//! offset read from the file is untrusted: arithmetic is checked, every read is bounds
//! checked, and counts are compared with the bytes left in the file *before* anything is
//! allocated for them, so a corrupt or hostile file gives a `GgufError`, never a panic or
//! a huge allocation.
//!
//! Layout (all little-endian):
//! ```text
//! "GGUF" u32 version, u64 n_tensors, u64 n_kv
//! n_kv × { string key, u32 value_type, value }
//! n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//! padding to `general.alignment` (default 32), then the data section;
//! string = u64 length + UTF-8 bytes; array = u32 element type + u64 count + elements.
//! ```

use ds4_ir::GgmlType;
use memmap2::Mmap;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;
/// Arrays may nest; a limit keeps a file of nested empty arrays from exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// On-disk value type ids.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The name of an on-disk value type id, for messages.
pub fn value_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        type_id::U8 => "u8",
        type_id::I8 => "i8",
        type_id::U16 => "u16",
        type_id::I16 => "i16",
        type_id::U32 => "u32",
        type_id::I32 => "i32",
        type_id::F32 => "f32",
        type_id::BOOL => "bool",
        type_id::STRING => "str",
        type_id::ARRAY => "array",
        type_id::U64 => "u64",
        type_id::I64 => "i64",
        type_id::F64 => "f64",
        _ => return None,
    })
}

/// The fewest bytes one value of a type takes in the file. Used to reject absurd array
/// lengths before allocating: `len × min_bytes` must fit in what is left of the file.
fn min_value_bytes(id: u32) -> u64 {
    match id {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        type_id::STRING => 8,     // the length, for an empty string
        type_id::ARRAY => 4 + 8,  // element type + count, for an empty array
        _ => 1,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("empty file (0 bytes): not a GGUF file")]
    Empty,
    #[error("not a GGUF file: magic is {found:?}, expected \"GGUF\"")]
    BadMagic { found: String },
    #[error("{0}")]
    UnsupportedVersion(String),
    #[error("file truncated: {what} at offset {offset} needs {need} bytes, but the file has {len}")]
    Truncated { what: String, offset: u64, need: u64, len: u64 },
    /// Header-level problems: counts, alignment, data offset.
    #[error("GGUF header: {0}")]
    Header(String),
    #[error("metadata key '{key}': {problem}")]
    Meta { key: String, problem: String },
    #[error("tensor '{name}': {problem}")]
    Tensor { name: String, problem: String },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongType { key: String, expected: String, found: String },
    #[error("metadata key '{key}': value {value} is out of range for {ty}")]
    OutOfRange { key: String, value: String, ty: &'static str },
    /// Refusals of the writer (invalid tensor, duplicate name, heterogeneous array, ...).
    #[error("GGUF writer: {0}")]
    Writer(String),
}

/// A metadata value. Arrays in a file are homogeneous; nested arrays are allowed.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    pub fn type_name(&self) -> &'static str {
        value_type_name(self.type_id()).unwrap_or("?")
    }

    /// The on-disk type id.
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => type_id::U8,
            MetaValue::I8(_) => type_id::I8,
            MetaValue::U16(_) => type_id::U16,
            MetaValue::I16(_) => type_id::I16,
            MetaValue::U32(_) => type_id::U32,
            MetaValue::I32(_) => type_id::I32,
            MetaValue::F32(_) => type_id::F32,
            MetaValue::Bool(_) => type_id::BOOL,
            MetaValue::Str(_) => type_id::STRING,
            MetaValue::Array(_) => type_id::ARRAY,
            MetaValue::U64(_) => type_id::U64,
            MetaValue::I64(_) => type_id::I64,
            MetaValue::F64(_) => type_id::F64,
        }
    }

    /// Any integer type, widened; None for non-integers.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v as i128,
            MetaValue::I8(v) => v as i128,
            MetaValue::U16(v) => v as i128,
            MetaValue::I16(v) => v as i128,
            MetaValue::U32(v) => v as i128,
            MetaValue::I32(v) => v as i128,
            MetaValue::U64(v) => v as i128,
            MetaValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any number (integers are converted, possibly with rounding for huge 64-bit values).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description of the type for messages: `u32`, `[str; 129280]`.
    pub fn type_desc(&self) -> String {
        match self {
            MetaValue::Array(a) => match a.first() {
                Some(e) => format!("[{}; {}]", e.type_desc_elem(), a.len()),
                None => "[; 0]".to_string(),
            },
            _ => self.type_name().to_string(),
        }
    }

    // Inside an array description, nested arrays show only their element type: the
    // lengths of inner arrays may differ.
    fn type_desc_elem(&self) -> String {
        match self {
            MetaValue::Array(a) => match a.first() {
                Some(e) => format!("[{}]", e.type_desc_elem()),
                None => "[]".to_string(),
            },
            _ => self.type_name().to_string(),
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ne order: dims[0] is the contiguous dimension.
    pub dims: Vec<u64>,
    /// Relative to the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of the dims (checked at open, so it cannot overflow here).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The bytes behind a `GgufFile`: a read-only mapping of a file, or an owned buffer.
enum Backing {
    Mmap(Arc<Mmap>),
    Bytes(Arc<Vec<u8>>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Bytes(b) => b,
        }
    }
}

pub struct GgufFile {
    pub version: u32,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    /// In file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    backing: Backing,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_size", &self.file_size())
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map a file and parse its header.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |err| GgufError::Io { path: path.to_path_buf(), err };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // Some platforms refuse to map an empty file; the answer is the same anyway.
            return Err(GgufError::Empty);
        }
        // SAFETY: the mapping is read-only. If another process truncates or rewrites the
        // file while it is mapped, reads may fault or see changed bytes; that is the
        // accepted contract of every mmap-based model loader (the file is treated as
        // immutable while in use). All bounds were checked against the length at open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Mmap(Arc::new(map)))
    }

    /// Parse a GGUF held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Backing::Bytes(Arc::new(bytes)))
    }

    fn parse(backing: Backing) -> Result<Self, GgufError> {
        let h = parse_header(backing.bytes())?;
        Ok(GgufFile {
            version: h.version,
            alignment: h.alignment,
            data_offset: h.data_offset,
            metadata: h.metadata,
            tensors: h.tensors,
            backing,
            meta_index: h.meta_index,
            tensor_index: h.tensor_index,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    pub fn file_size(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// From the data offset to the end of the file (empty if the file ends before it,
    /// which is allowed when there are no tensor bytes).
    pub fn data_section(&self) -> &[u8] {
        let b = self.bytes();
        let start = usize::try_from(self.data_offset).unwrap_or(usize::MAX).min(b.len());
        &b[start..]
    }

    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file. Bounds were checked at open; a `TensorInfo`
    /// that does not come from this file gives an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = self
            .data_offset
            .checked_add(t.offset)
            .and_then(|s| Some((s, s.checked_add(t.n_bytes)?)))
            .and_then(|(s, e)| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?));
        range.and_then(|r| self.bytes().get(r)).unwrap_or(&[])
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.meta(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        int_as(key, self.require(key)?, "u32")
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        int_as(key, self.require(key)?, "u64")
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        int_as(key, self.require(key)?, "i64")
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        float_as_f32(key, self.require(key)?)
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| wrong_type(key, "a number", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| wrong_type(key, "bool", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "str", v))
    }

    fn get_array(&self, key: &str, expected: &str) -> Result<&[MetaValue], GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| wrong_type(key, expected, v))
    }

    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        let a = self.get_array(key, "an array of integers")?;
        a.iter().enumerate().map(|(i, v)| int_as(&format!("{key}[{i}]"), v, "u32")).collect()
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let a = self.get_array(key, "an array of integers")?;
        a.iter().enumerate().map(|(i, v)| int_as(&format!("{key}[{i}]"), v, "i32")).collect()
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let a = self.get_array(key, "an array of numbers")?;
        a.iter().enumerate().map(|(i, v)| float_as_f32(&format!("{key}[{i}]"), v)).collect()
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let a = self.get_array(key, "an array of strings")?;
        a.iter()
            .enumerate()
            .map(|(i, v)| v.as_str().ok_or_else(|| wrong_type(&format!("{key}[{i}]"), "str", v)))
            .collect()
    }
}

fn wrong_type(key: &str, expected: &str, found: &MetaValue) -> GgufError {
    GgufError::WrongType { key: key.to_string(), expected: expected.to_string(), found: found.type_desc() }
}

/// An integer of any stored type converted to `T`, with a range error naming the key.
fn int_as<T: TryFrom<i128>>(key: &str, v: &MetaValue, ty: &'static str) -> Result<T, GgufError> {
    let i = v.as_i128().ok_or_else(|| wrong_type(key, "an integer", v))?;
    T::try_from(i).map_err(|_| GgufError::OutOfRange { key: key.to_string(), value: i.to_string(), ty })
}

fn float_as_f32(key: &str, v: &MetaValue) -> Result<f32, GgufError> {
    match *v {
        MetaValue::F32(x) => Ok(x),
        MetaValue::F64(x) => {
            // A finite f64 beyond f32's range would silently become infinity.
            if x.is_finite() && x.abs() > f32::MAX as f64 {
                Err(GgufError::OutOfRange { key: key.to_string(), value: format!("{x:?}"), ty: "f32" })
            } else {
                Ok(x as f32)
            }
        }
        // Integers are accepted: writers differ in how they store e.g. a RoPE base.
        _ => v.as_f64().map(|x| x as f32).ok_or_else(|| wrong_type(key, "a float", v)),
    }
}

struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn len(&self) -> u64 {
        self.buf.len() as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// `n` bytes, or a truncation error describing what was being read.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { what: what(), offset: self.pos as u64, need: n, len: self.len() });
        }
        let n = n as usize; // fits: n <= remaining <= usize::MAX
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string. `what` names the thing that owns it, for messages.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let n = self.u64(&|| format!("{} (length)", what()))?;
        // Compare with the bytes left before touching them, so a bogus length of 2^60
        // is reported as such rather than as an allocation failure.
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: format!("{} (string of length {n})", what()),
                offset: at,
                need: n.saturating_add(8),
                len: self.len(),
            });
        }
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| GgufError::Header(format!("{} at offset {at}: string is not valid UTF-8 ({e})", what())))
    }
}

fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    if buf.is_empty() {
        return Err(GgufError::Empty);
    }
    if buf.len() < 4 || &buf[..4] != GGUF_MAGIC {
        let found: String = buf.iter().take(4).map(|&b| (b as char).escape_default().to_string()).collect();
        return Err(GgufError::BadMagic { found });
    }
    let mut r = Reader { buf, pos: 4 };
    let version = r.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(GgufError::UnsupportedVersion(
                "GGUF version 1 is not supported (it used 32-bit counts and lengths; re-convert the model)".into(),
            ))
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(GgufError::UnsupportedVersion(format!(
                "big-endian GGUF (version {}) is not supported",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(GgufError::UnsupportedVersion(format!(
                "GGUF version {v} is not supported (supported: 2 and 3)"
            )))
        }
    }
    let n_tensors = r.u64(&|| "tensor count".into())?;
    let n_kv = r.u64(&|| "metadata key count".into())?;

    // Reject absurd counts before allocating. Each key/value pair takes at least a key
    // length (8), a value type (4) and a 1-byte value; each tensor info at least a name
    // length (8), n_dims (4), a type (4) and an offset (8).
    const MIN_KV_BYTES: u64 = 8 + 4 + 1;
    const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;
    let need = n_kv
        .checked_mul(MIN_KV_BYTES)
        .and_then(|a| a.checked_add(n_tensors.checked_mul(MIN_TENSOR_BYTES)?));
    if need.is_none_or(|n| n > r.remaining()) {
        return Err(GgufError::Header(format!(
            "{n_kv} metadata keys and {n_tensors} tensors cannot fit in the {} bytes left in the file \
             (file size {}): counts are corrupt or the file is truncated",
            r.remaining(),
            r.len()
        )));
    }

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut meta_index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = r.string(&|| format!("metadata key #{i}"))?;
        let ty = r.u32(&|| format!("metadata key '{key}' (value type)"))?;
        let value = read_value(&mut r, &key, ty, 0)?;
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::Meta { key, problem: "duplicate key".into() });
        }
        metadata.push((key, value));
    }

    let alignment = match meta_index.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let v = &metadata[i].1;
            let a = v.as_u64().ok_or_else(|| GgufError::Meta {
                key: ALIGNMENT_KEY.into(),
                problem: format!("must be a non-negative integer, found {} {}", v.type_desc(), describe(v)),
            })?;
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::Meta {
                    key: ALIGNMENT_KEY.into(),
                    problem: format!("alignment {a} is not a non-zero power of two"),
                });
            }
            a
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut r, i, alignment)?;
        if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(GgufError::Tensor { name: t.name, problem: "duplicate tensor name".into() });
        }
        tensors.push(t);
    }

    let header_end = r.pos as u64;
    let data_offset = align_up(header_end, alignment).ok_or_else(|| {
        GgufError::Header(format!("header end {header_end} rounded up to alignment {alignment} overflows"))
    })?;
    check_tensor_extents(&tensors, data_offset, r.len())?;

    Ok(Header { version, alignment, data_offset, metadata, tensors, meta_index, tensor_index })
}

/// `x` rounded up to a multiple of `a` (a power of two), or None on overflow.
pub fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? & !(a - 1))
}

/// A short rendering of a scalar for error messages.
fn describe(v: &MetaValue) -> String {
    match v {
        MetaValue::Str(s) => format!("{:?}", s.chars().take(40).collect::<String>()),
        MetaValue::Array(a) => format!("with {} elements", a.len()),
        _ => format!("{v:?}"),
    }
}

fn read_value(r: &mut Reader, key: &str, ty: u32, depth: usize) -> Result<MetaValue, GgufError> {
    let what = || format!("metadata key '{key}' ({} value)", value_type_name(ty).unwrap_or("?"));
    Ok(match ty {
        type_id::U8 => MetaValue::U8(u8::from_le_bytes(r.array(&what)?)),
        type_id::I8 => MetaValue::I8(i8::from_le_bytes(r.array(&what)?)),
        type_id::U16 => MetaValue::U16(u16::from_le_bytes(r.array(&what)?)),
        type_id::I16 => MetaValue::I16(i16::from_le_bytes(r.array(&what)?)),
        type_id::U32 => MetaValue::U32(u32::from_le_bytes(r.array(&what)?)),
        type_id::I32 => MetaValue::I32(i32::from_le_bytes(r.array(&what)?)),
        type_id::F32 => MetaValue::F32(f32::from_le_bytes(r.array(&what)?)),
        type_id::U64 => MetaValue::U64(u64::from_le_bytes(r.array(&what)?)),
        type_id::I64 => MetaValue::I64(i64::from_le_bytes(r.array(&what)?)),
        type_id::F64 => MetaValue::F64(f64::from_le_bytes(r.array(&what)?)),
        type_id::BOOL => {
            let [b] = r.array(&what)?;
            match b {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                _ => {
                    return Err(GgufError::Meta { key: key.into(), problem: format!("invalid bool byte {b}") })
                }
            }
        }
        type_id::STRING => MetaValue::Str(r.string(&|| format!("metadata key '{key}' (string value)"))?),
        type_id::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::Meta {
                    key: key.into(),
                    problem: format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"),
                });
            }
            let elem = r.u32(&|| format!("metadata key '{key}' (array element type)"))?;
            if value_type_name(elem).is_none() {
                return Err(GgufError::Meta { key: key.into(), problem: format!("unknown array element type {elem}") });
            }
            let at = r.pos as u64;
            let n = r.u64(&|| format!("metadata key '{key}' (array length)"))?;
            let min = min_value_bytes(elem);
            if n.checked_mul(min).is_none_or(|b| b > r.remaining()) {
                return Err(GgufError::Meta {
                    key: key.into(),
                    problem: format!(
                        "array of {n} {} elements at offset {at} cannot fit in the {} bytes left in the file \
                         (file size {})",
                        value_type_name(elem).unwrap_or("?"),
                        r.remaining(),
                        r.len()
                    ),
                });
            }
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(read_value(r, key, elem, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        _ => return Err(GgufError::Meta { key: key.into(), problem: format!("unknown value type {ty}") }),
    })
}

fn read_tensor_info(r: &mut Reader, index: u64, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = r.string(&|| format!("tensor info #{index} (name)"))?;
    let what = |field: &str| {
        let n = name.clone();
        let f = field.to_string();
        move || format!("tensor '{n}' ({f})")
    };
    let bad = |problem: String| GgufError::Tensor { name: name.clone(), problem };

    let n_dims = r.u32(&what("n_dims"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(bad(format!("n_dims = {n_dims}, at most {MAX_DIMS} are supported")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64(&what("dims"))?);
    }
    let type_id = r.u32(&what("type"))?;
    let offset = r.u64(&what("offset"))?;

    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| bad(format!("unknown GGML type id {type_id}")))?;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("dims {dims:?}: element count overflows u64")))?;
    let block = ggml_type.block_elems() as u64;
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % block != 0 {
        return Err(bad(format!(
            "ne[0] = {ne0} is not a multiple of the {ggml_type} block size {block} (dims {dims:?})"
        )));
    }
    let n_bytes = ggml_type
        .bytes_for(n_elements)
        .ok_or_else(|| bad(format!("dims {dims:?}: byte size of {n_elements} {ggml_type} elements overflows u64")))?;
    if offset % alignment != 0 {
        return Err(bad(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
    }
    Ok(TensorInfo { name, ggml_type, dims, offset, n_bytes })
}

/// Every tensor's bytes lie inside the file, and no two tensors share bytes.
fn check_tensor_extents(tensors: &[TensorInfo], data_offset: u64, file_len: u64) -> Result<(), GgufError> {
    let mut extents = Vec::with_capacity(tensors.len());
    for t in tensors {
        let range = data_offset.checked_add(t.offset).and_then(|s| Some((s, s.checked_add(t.n_bytes)?)));
        let Some((start, end)) = range else {
            return Err(GgufError::Tensor {
                name: t.name.clone(),
                problem: format!("data offset {} + size {} overflows u64", t.offset, t.n_bytes),
            });
        };
        if end > file_len {
            return Err(GgufError::Tensor {
                name: t.name.clone(),
                problem: format!("data [{start}..{end}) runs past end of file (size {file_len})"),
            });
        }
        if t.n_bytes > 0 {
            extents.push((start, end, &t.name));
        }
    }
    // Overlap is never produced by a correct writer; it signals a corrupt tensor table.
    extents.sort_unstable();
    for w in extents.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if b.0 < a.1 {
            return Err(GgufError::Tensor {
                name: b.2.clone(),
                problem: format!("data [{}..{}) overlaps tensor '{}' [{}..{})", b.0, b.1, a.2, a.0, a.1),
            });
        }
    }
    Ok(())
}
