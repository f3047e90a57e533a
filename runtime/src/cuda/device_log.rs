//! The stateful ops' logs in device memory: a `GrowLog` over device buffers. A batch's rows
//! join a log by a device-to-device copy, and the rows an op hands on are a view into the
//! log's buffer, so a step's state never crosses the bus.
//!
//! Safety of the views rests on stream order: every copy and launch goes to the one
//! (legacy default) stream, so a kernel queued to read a view runs before any later
//! copy that moves or overwrites those rows, and a view keeps its buffer alive (`Arc`)
//! after the log has moved to a bigger one.

use super::device::{DevSlice, DeviceBuf};
use crate::exec::ExecError;
use crate::grow_log::{GrowLog, RowBuffer};
use std::sync::Arc;

/// A slot's log on the device.
pub type DeviceLog = GrowLog<Arc<DeviceBuf>>;

/// f32 elements.
const ELEM: usize = 4;

impl RowBuffer for Arc<DeviceBuf> {
    type Src<'a> = &'a DevSlice;
    type View = DevSlice;

    fn src_len(src: &&DevSlice) -> usize {
        src.len
    }
    fn alloc(src: &&DevSlice, elems: usize) -> Result<Self, ExecError> {
        Ok(Arc::new(src.buf.device().alloc(elems * ELEM)?))
    }
    fn capacity(&self) -> usize {
        self.bytes / ELEM
    }
    fn copy(&self, at: usize, src: &Self, from: usize, n: usize) -> Result<(), ExecError> {
        Ok(self.copy_from(at * ELEM, src, from * ELEM, n * ELEM)?)
    }
    fn write(&self, at: usize, src: &&DevSlice) -> Result<(), ExecError> {
        Ok(self.copy_from(at * ELEM, &src.buf, src.off * ELEM, src.len * ELEM)?)
    }
    fn view(&self, at: usize, n: usize) -> DevSlice {
        DevSlice { buf: self.clone(), off: at, len: n }
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}
