//! `QuantSpec`: everything a code generator needs to know about one quant type — block
//! geometry, the byte layout of a block, constant tables, and the de-quantization of one
//! element as an expression tree. `quant_type!` emits one `static SPEC` per type.

use std::fmt;

use super::expr::{Expr, Level, Ty};
use crate::GgmlType;

/// A named field of a block: a scalar (`len == None`) or an array, little-endian, at a
/// byte offset. Fields tile the block exactly (the macro rejects gaps and overlaps).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Field {
    pub name: &'static str,
    /// Element type (never Bool).
    pub ty: Ty,
    pub len: Option<usize>,
    pub offset: usize,
}

impl Field {
    pub fn elems(&self) -> usize {
        self.len.unwrap_or(1)
    }
    pub fn bytes(&self) -> usize {
        self.elems() * self.ty.bytes()
    }
}

/// The values of a constant table (e.g. the IQ2_XXS grid).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TableData {
    U8(&'static [u8]),
    I8(&'static [i8]),
    U16(&'static [u16]),
    I16(&'static [i16]),
    U32(&'static [u32]),
    I32(&'static [i32]),
    U64(&'static [u64]),
    F32(&'static [f32]),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Table {
    pub name: &'static str,
    pub ty: Ty,
    pub data: TableData,
}

impl Table {
    pub fn len(&self) -> usize {
        match self.data {
            TableData::U8(v) => v.len(),
            TableData::I8(v) => v.len(),
            TableData::U16(v) => v.len(),
            TableData::I16(v) => v.len(),
            TableData::U32(v) => v.len(),
            TableData::I32(v) => v.len(),
            TableData::U64(v) => v.len(),
            TableData::F32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Entry `i` as raw bits (integers zero- or sign-extended into the u64, f32 as its bits).
    pub fn bits(&self, i: usize) -> u64 {
        match self.data {
            TableData::U8(v) => v[i] as u64,
            TableData::I8(v) => v[i] as i64 as u64,
            TableData::U16(v) => v[i] as u64,
            TableData::I16(v) => v[i] as i64 as u64,
            TableData::U32(v) => v[i] as u64,
            TableData::I32(v) => v[i] as i64 as u64,
            TableData::U64(v) => v[i],
            TableData::F32(v) => v[i].to_bits() as u64,
        }
    }
}

/// `let name: ty = value;` inside the de-quantization. `level` says where it can be hoisted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Let {
    pub name: &'static str,
    pub ty: Ty,
    pub level: Level,
    pub value: &'static Expr,
}

/// One quant type, as declared by `quant_type!`.
///
/// Element `s * sub_block + j` of a block de-quantizes to `value` (an f32) evaluated with
/// `Expr::Sub = s`, `Expr::Lane = j`, after the `lets` in order.
#[derive(Debug)]
pub struct QuantSpec {
    pub ggml: GgmlType,
    pub block_elems: usize,
    pub block_bytes: usize,
    /// Elements per sub-block: the granularity at which `Level::Sub` values change.
    pub sub_block: usize,
    pub fields: &'static [Field],
    pub tables: &'static [Table],
    pub lets: &'static [Let],
    pub value: &'static Expr,
}

impl QuantSpec {
    pub fn sub_blocks(&self) -> usize {
        self.block_elems / self.sub_block
    }
    pub fn field(&self, name: &str) -> Option<&'static Field> {
        self.fields.iter().find(|f| f.name == name)
    }
    pub fn table(&self, name: &str) -> Option<&'static Table> {
        self.tables.iter().find(|t| t.name == name)
    }
    pub fn let_(&self, name: &str) -> Option<&'static Let> {
        self.lets.iter().find(|l| l.name == name)
    }
}

/// The declaration, re-printed: for snapshots, error messages and comments in generated code.
impl fmt::Display for QuantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} elements in {} bytes, sub-blocks of {}",
            self.ggml, self.block_elems, self.block_bytes, self.sub_block
        )?;
        for fd in self.fields {
            match fd.len {
                Some(n) => writeln!(f, "  {}: [{}; {n}] @ {}", fd.name, fd.ty, fd.offset)?,
                None => writeln!(f, "  {}: {} @ {}", fd.name, fd.ty, fd.offset)?,
            }
        }
        for t in self.tables {
            writeln!(f, "  table {}: [{}; {}]", t.name, t.ty, t.len())?;
        }
        for l in self.lets {
            writeln!(
                f,
                "  let {}: {} = {};  // per {:?}",
                l.name, l.ty, l.value, l.level
            )?;
        }
        writeln!(f, "  value = {}", self.value)
    }
}
