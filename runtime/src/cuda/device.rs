//! The device: one CUDA context on GPU 0, raw allocations, copies and launches.
//!
//! Everything goes through the driver API, loaded at run time (cudarc's dynamic loading):
//! a machine without a driver builds and runs the rest of ds4, and [`probe`] says why
//! there is no device. Copies are synchronous and launches go to the legacy default
//! stream, so the order of calls is the order of execution. While a decode step records
//! (`launch_plan.rs`), launches and device copies are queued and go to the same stream as
//! graphs; every host copy, synchronize and free to the driver submits the queue first.

use super::launch_plan::{LaunchPlan, Step};
use cudarc::driver::{result, sys, CudaContext, CudaFunction};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Why the CUDA backend cannot run here, or the device it found.
pub fn probe() -> Result<String, String> {
    // SAFETY: only tries to dlopen the libraries.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda) on this machine".into());
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("no NVRTC library (libnvrtc; add /usr/local/cuda/lib64 to LD_LIBRARY_PATH)".into());
    }
    result::init().map_err(|e| format!("CUDA driver did not initialise: {e}"))?;
    let n = CudaContext::device_count().map_err(|e| format!("cannot count CUDA devices: {e}"))?;
    if n < 1 {
        return Err("the CUDA driver sees no device".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("cannot open CUDA device 0: {e}"))?;
    let (maj, min) = ctx.compute_capability().map_err(|e| e.to_string())?;
    Ok(format!("{} (sm_{maj}{min})", ctx.name().unwrap_or_else(|_| "CUDA device".into())))
}

/// An error from the driver or from our use of it.
#[derive(Debug, thiserror::Error)]
#[error("cuda: {0}")]
pub struct CudaError(pub String);

impl From<result::DriverError> for CudaError {
    fn from(e: result::DriverError) -> Self {
        CudaError(e.to_string())
    }
}

/// Bytes for a person: GB (10^9) from 1 GB, else MB.
pub fn bytes_text(b: usize) -> String {
    match b as f64 {
        x if x >= 1e9 => format!("{:.2} GB", x / 1e9),
        x => format!("{:.1} MB", x / 1e6),
    }
}

/// A failed allocation of `bytes` as a sentence: how much was asked for and, where the
/// driver said, how much the device has free.
fn out_of_memory(bytes: usize, memory: Option<(usize, usize)>, device: &str) -> CudaError {
    let have = memory.map_or(String::new(), |(free, total)| format!(" ({} free of {})", bytes_text(free), bytes_text(total)));
    CudaError(format!("out of device memory on the {device}: {} asked for{have}", bytes_text(bytes)))
}

/// GPU 0's context.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    /// Compute capability as `major * 10 + minor` (90 on Hopper).
    pub sm: u32,
    pub name: String,
    /// Streaming multiprocessors (132 on the H200): how many blocks fill the GPU.
    pub sms: usize,
    /// The most shared memory a block may have (227 KiB on Hopper, 99 KiB on sm_120 and
    /// sm_89): what a kernel's launches may ask for (`compile::shared_room`), or less where
    /// the backend's options say so (`CudaOptions::shared_optin`).
    pub shared_optin: u32,
    /// Freed activation buffers by bucket size, reused by [`Device::alloc`]: cuMemFree
    /// synchronizes the whole device, and a decode step allocates hundreds of buffers.
    pool: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    /// Buffers freed while a side branch is open (`launch_plan.rs`), pooled at its join: a
    /// buffer one lane has finished with may still be read by the other lane's queued
    /// steps, which are not ordered before anything queued later until the join.
    held: Mutex<Vec<(usize, sys::CUdeviceptr)>>,
    /// Whether a branch is open: the plan's state, copied here so that a buffer's drop
    /// need not take the plan's lock.
    branching: std::sync::atomic::AtomicBool,
    /// Executor runs in progress (sessions on other threads): side branches only while
    /// one is (`begin_run`).
    runs: std::sync::atomic::AtomicUsize,
    /// Launches and copies queued for a graph while recording (`launch_plan.rs`).
    plan: Mutex<LaunchPlan>,
}

/// The pool's bucket for a request: 256-byte granules, and at most 1/8 slack above that,
/// so that sizes that differ a little (prefill chunks) share buffers.
fn bucket(bytes: usize) -> usize {
    let b = bytes.max(1).next_multiple_of(256);
    let granule = (b.next_power_of_two() / 8).max(256);
    b.next_multiple_of(granule)
}

impl Device {
    pub fn open() -> Result<Arc<Device>, CudaError> {
        Device::open_with(None)
    }

    /// `open`, a block's shared memory bounded by `shared_optin` bytes where that is less
    /// than the device's (to run a smaller device's paths on a larger one).
    pub fn open_with(shared_optin: Option<u32>) -> Result<Arc<Device>, CudaError> {
        probe().map_err(CudaError)?;
        let ctx = CudaContext::new(0)?;
        let (maj, min) = ctx.compute_capability()?;
        let name = ctx.name()?;
        let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize;
        let optin = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as u32;
        let shared_optin = shared_optin.map_or(optin, |v| v.min(optin));
        Ok(Arc::new(Device { ctx, sm: (maj * 10 + min) as u32, name, sms, shared_optin, pool: Mutex::new(HashMap::new()), held: Mutex::new(Vec::new()), branching: Default::default(), runs: Default::default(), plan: Mutex::new(LaunchPlan::default()) }))
    }

    /// Makes the context current on the calling thread (every entry point calls this).
    pub fn bind(&self) -> Result<(), CudaError> {
        Ok(self.ctx.bind_to_thread()?)
    }

    /// A buffer of `bytes` for activations, from the pool (back to it when dropped). Work
    /// is ordered on one stream, so a buffer reused before an earlier kernel that read it
    /// has run is still read first.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuf, CudaError> {
        let size = bucket(bytes);
        let reuse = self.pool.lock().map_err(|_| CudaError("buffer pool poisoned".into()))?.get_mut(&size).and_then(|v| v.pop());
        let ptr = match reuse {
            Some(p) => p,
            None => self.malloc(size)?,
        };
        Ok(DeviceBuf { dev: self.clone(), ptr, bytes, pooled: Some(size) })
    }

    /// `bytes` of device memory of its own (weights), freed when dropped.
    pub fn alloc_owned(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuf, CudaError> {
        let ptr = self.malloc(bytes.max(1))?;
        Ok(DeviceBuf { dev: self.clone(), ptr, bytes, pooled: None })
    }

    /// Device memory free now and in all, in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        self.bind()?;
        Ok(result::mem_get_info()?)
    }

    fn malloc(&self, bytes: usize) -> Result<sys::CUdeviceptr, CudaError> {
        self.bind()?;
        // SAFETY: a plain cuMemAlloc; freed once (DeviceBuf's or Device's Drop).
        let first = unsafe { result::malloc_sync(bytes) };
        match first {
            Ok(p) => Ok(p),
            Err(_) => {
                // Out of memory with buffers parked in the pool: give them back and retry.
                self.release_pool();
                // SAFETY: as above.
                unsafe { result::malloc_sync(bytes) }.map_err(|e| match e.0 {
                    sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => out_of_memory(bytes, self.memory().ok(), &self.name),
                    _ => e.into(),
                })
            }
        }
    }

    fn release_pool(&self) {
        // Queued work may still read pooled buffers.
        let _ = self.submit_plan();
        let Ok(mut pool) = self.pool.lock() else { return };
        if self.bind().is_err() {
            return;
        }
        for (_, ptrs) in pool.drain() {
            for p in ptrs {
                // SAFETY: each pooled pointer came from malloc_sync and is owned by the pool.
                let _ = unsafe { result::free_sync(p) };
            }
        }
    }

    pub fn upload<T: Copy>(self: &Arc<Self>, data: &[T]) -> Result<DeviceBuf, CudaError> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        b.write(0, data)?;
        Ok(b)
    }

    /// Device-to-device copy bandwidth in GB/s, STREAM convention (bytes read + bytes
    /// written): the best of `passes` copies of `bytes`.
    pub fn copy_bandwidth(self: &Arc<Self>, bytes: usize, passes: usize) -> Result<f64, CudaError> {
        let (a, b) = (self.alloc_owned(bytes)?, self.alloc_owned(bytes)?);
        let mut best = f64::INFINITY;
        for _ in 0..passes.max(1) + 1 {
            self.synchronize()?;
            let t = std::time::Instant::now();
            b.copy_from(0, &a, 0, bytes)?;
            self.synchronize()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best / 1e9)
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.submit_plan()?;
        Ok(self.ctx.synchronize()?)
    }

    fn plan(&self) -> Result<std::sync::MutexGuard<'_, LaunchPlan>, CudaError> {
        self.plan.lock().map_err(|_| CudaError("launch plan poisoned".into()))
    }

    /// Makes device copies queued for a graph launches of `copy_spans` (`f`, which must stay
    /// loaded while the device records: the backend holds both), merged where they follow
    /// each other on a lane (`LaunchPlan::join_copy`). `DS4_COPY_KERNEL=0` keeps copy nodes.
    pub fn set_copy_kernel(&self, f: &CudaFunction) -> Result<(), CudaError> {
        if !switched_off!("DS4_COPY_KERNEL") {
            self.plan()?.copy_kernel = Some(super::launch_plan::CopyKernel(f.cu_function()));
        }
        Ok(())
    }

    /// Starts or stops (one run's) queueing of launches and device copies for graphs
    /// (`launch_plan.rs`); stopping submits what is queued.
    pub fn record_launches(&self, on: bool) -> Result<(), CudaError> {
        self.plan()?.set_recording(on);
        if !on {
            self.submit_plan()?;
        }
        Ok(())
    }

    /// Submits the queued launches (as a graph when there are enough of them); called
    /// before anything the host does to device memory.
    pub fn submit_plan(&self) -> Result<(), CudaError> {
        self.submit_plan_as(false)
    }

    /// `submit_plan`, `ahead` where the host goes on without waiting for what it submits
    /// (`LaunchPlan::submit_ahead`).
    fn submit_plan_as(&self, ahead: bool) -> Result<(), CudaError> {
        self.bind()?;
        let mut plan = self.plan()?;
        if ahead {
            plan.submit_ahead(self.ctx.cu_ctx())
        } else {
            plan.submit(self.ctx.cu_ctx())
        }
    }

    /// Runs a launch or device copy now, or queues it while recording (`launch_plan.rs`).
    fn run_step(&self, step: Step) -> Result<(), CudaError> {
        self.bind()?;
        self.plan()?.run(step, self.ctx.cu_ctx())
    }

    /// Queues the next launches on the side lane of a graph (`side`) or the main lane
    /// (`launch_plan.rs`); nothing happens unless this run records alone.
    pub fn lane(&self, side: bool) -> Result<(), CudaError> {
        let mut plan = self.plan()?;
        // Read under the plan's lock, where `begin_run` counts: no branch opens once a
        // second run has begun.
        if self.runs.load(std::sync::atomic::Ordering::SeqCst) > 1 {
            return Ok(());
        }
        if plan.lane(side) && side {
            self.branching.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// An executor run starts; with another in progress (a session on another thread),
    /// an open side branch joins and none opens until one run is left: the runs' steps
    /// interleave in one queue. [`Device::end_run`] when it ends.
    pub fn begin_run(&self) -> Result<(), CudaError> {
        let mut plan = self.plan()?;
        if self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            plan.join();
            drop(plan);
            self.release_held()?;
        }
        Ok(())
    }

    pub fn end_run(&self) {
        self.runs.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes the side branch (the next launch waits for it) and pools the buffers freed
    /// while it was open.
    pub fn join(&self) -> Result<(), CudaError> {
        self.plan()?.join();
        self.release_held()
    }

    /// The buffers freed while a branch was open, into the pool (the branch has joined:
    /// whatever is queued next waits for both lanes).
    fn release_held(&self) -> Result<(), CudaError> {
        self.branching.store(false, std::sync::atomic::Ordering::SeqCst);
        let held = std::mem::take(&mut *self.held.lock().map_err(|_| CudaError("held buffers poisoned".into()))?);
        let mut pool = self.pool.lock().map_err(|_| CudaError("buffer pool poisoned".into()))?;
        for (size, ptr) in held {
            pool.entry(size).or_default().push(ptr);
        }
        Ok(())
    }

    /// (graph launches, launches and copies they carried) so far.
    pub fn graph_stats(&self) -> (u64, u64) {
        self.plan.lock().map_or((0, 0), |p| (p.graphs_launched, p.steps_in_graphs))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Ok(mut p) = self.plan.lock() {
            p.clear();
        }
        if let Ok(mut held) = self.held.lock() {
            if let Ok(mut pool) = self.pool.lock() {
                for (size, ptr) in held.drain(..) {
                    pool.entry(size).or_default().push(ptr);
                }
            }
        }
        self.release_pool();
    }
}

/// One device allocation, freed (or returned to the pool) when the owner drops.
pub struct DeviceBuf {
    dev: Arc<Device>,
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    /// The pool bucket it came from, if any.
    pooled: Option<usize>,
}

impl DeviceBuf {
    /// Copies `data` to byte offset `at`.
    pub fn write<T: Copy>(&self, at: usize, data: &[T]) -> Result<(), CudaError> {
        let n = std::mem::size_of_val(data);
        if at + n > self.bytes {
            return Err(CudaError(format!("write of {n} bytes at {at} into a buffer of {}", self.bytes)));
        }
        if n == 0 {
            return Ok(());
        }
        // Queued work may read this buffer's old contents.
        self.dev.submit_plan()?;
        // SAFETY: in bounds (checked above); synchronous copy from a live slice.
        unsafe { result::memcpy_htod_sync(self.ptr + at as u64, data) }?;
        Ok(())
    }

    /// The device this buffer lives on.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Copies the first `n` elements back.
    pub fn read<T: Copy + Default>(&self, n: usize) -> Result<Vec<T>, CudaError> {
        self.read_at(0, n)
    }

    /// Copies `n` elements back, starting at byte offset `at`.
    pub fn read_at<T: Copy + Default>(&self, at: usize, n: usize) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); n];
        if at + std::mem::size_of_val(&out[..]) > self.bytes {
            return Err(CudaError(format!("read of {n} elements at byte {at} from a buffer of {} bytes", self.bytes)));
        }
        if n > 0 {
            self.dev.submit_plan()?;
            // SAFETY: in bounds (checked above); synchronous copy into a live slice.
            unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr + at as u64) }?;
        }
        Ok(out)
    }

    /// Copies `bytes` from `src` (at `src_at`) to this buffer at `at`.
    pub fn copy_from(&self, at: usize, src: &DeviceBuf, src_at: usize, bytes: usize) -> Result<(), CudaError> {
        if at + bytes > self.bytes || src_at + bytes > src.bytes {
            return Err(CudaError("device copy out of bounds".into()));
        }
        if bytes == 0 {
            return Ok(());
        }
        // Bounds checked above, as `Step::Copy` requires.
        self.dev.run_step(Step::Copy { dst: self.ptr + at as u64, src: src.ptr + src_at as u64, bytes })
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        if let Some(size) = self.pooled {
            if self.dev.branching.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(mut held) = self.dev.held.lock() {
                    held.push((size, self.ptr));
                    return;
                }
            }
            if let Ok(mut pool) = self.dev.pool.lock() {
                pool.entry(size).or_default().push(self.ptr);
                return;
            }
        }
        // Queued work may still read it.
        if self.dev.submit_plan().is_ok() {
            // SAFETY: allocated by malloc_sync, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory that kernels write through its mapped device address: the
/// greedy picks (`ds4_codegen::cuda_argmax`), read by the host once a [`Marker`] queued
/// after their kernel has passed, without a copy or a synchronization of the device.
pub struct MappedI32 {
    dev: Arc<Device>,
    host: *mut i32,
    ptr: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the memory is the driver's, freed once (drop); reads are volatile.
unsafe impl Send for MappedI32 {}
unsafe impl Sync for MappedI32 {}

impl MappedI32 {
    /// `len` zeroed values.
    pub fn new(dev: &Arc<Device>, len: usize) -> Result<MappedI32, CudaError> {
        dev.bind()?;
        let bytes = 4 * len.max(1);
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the driver allocates `bytes` of page-locked, device-mapped memory.
        unsafe { sys::cuMemHostAlloc(&mut host, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP).result() }?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated mapped.
        if let Err(e) = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ptr, host, 0).result() } {
            // SAFETY: allocated above, not shared yet.
            unsafe {
                let _ = sys::cuMemFreeHost(host);
            }
            return Err(e.into());
        }
        // SAFETY: `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes) };
        Ok(MappedI32 { dev: dev.clone(), host: host as *mut i32, ptr, len })
    }

    /// The device address kernels write to.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// How many values.
    pub fn count(&self) -> usize {
        self.len
    }

    /// Value `i` as the device last wrote it (after a [`Marker`] past the writing kernel).
    pub fn get(&self, i: usize) -> i32 {
        assert!(i < self.len, "mapped value {i} of {}", self.len);
        // SAFETY: in bounds; the device writes it, hence the volatile read.
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }
}

impl Drop for MappedI32 {
    fn drop(&mut self) {
        // Queued kernels may still write it.
        if self.dev.synchronize().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            unsafe {
                let _ = sys::cuMemFreeHost(self.host as *mut std::ffi::c_void);
            }
        }
    }
}

/// A point in the device's queue: [`Marker::set`] submits what is queued and marks its end;
/// [`Marker::wait`] returns once the device has passed it (work queued later may still run).
pub struct Marker {
    dev: Arc<Device>,
    ev: sys::CUevent,
}

// SAFETY: a driver event handle, used under the device's context.
unsafe impl Send for Marker {}
unsafe impl Sync for Marker {}

impl Marker {
    pub fn new(dev: &Arc<Device>) -> Result<Marker, CudaError> {
        dev.bind()?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: creates an event of the bound context.
        unsafe { sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32).result() }?;
        Ok(Marker { dev: dev.clone(), ev })
    }

    /// Submits the queued launches and marks their end (on the stream the graphs run on).
    /// The host goes on without waiting (greedy decoding records the next step while the
    /// GPU runs this one), so the next graph chunk may be a long one
    /// (`LaunchPlan::submit_ahead`).
    pub fn set(&self) -> Result<(), CudaError> {
        self.dev.submit_plan_as(true)?;
        // SAFETY: a live event; the legacy default stream, as `launch_plan.rs` launches.
        unsafe { sys::cuEventRecord(self.ev, std::ptr::null_mut()).result() }?;
        Ok(())
    }

    /// Waits for the device to pass the mark.
    pub fn wait(&self) -> Result<(), CudaError> {
        self.dev.bind()?;
        // SAFETY: a live event.
        unsafe { sys::cuEventSynchronize(self.ev).result() }?;
        Ok(())
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.ev);
        }
    }
}

/// `len` elements of 4 bytes (f32 or i32) from element `off` of a shared buffer: a value
/// flowing along a graph edge, or a view into a slot's log (`DeviceLog`).
#[derive(Clone)]
pub struct DevSlice {
    pub buf: Arc<DeviceBuf>,
    pub off: usize,
    pub len: usize,
}

impl DevSlice {
    /// All of a new buffer's first `len` elements.
    pub fn whole(buf: DeviceBuf, len: usize) -> DevSlice {
        DevSlice { buf: Arc::new(buf), off: 0, len }
    }

    /// The device address of the first element.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.buf.ptr + (self.off * 4) as u64
    }

    pub fn read<T: Copy + Default>(&self) -> Result<Vec<T>, CudaError> {
        debug_assert_eq!(std::mem::size_of::<T>(), 4);
        self.buf.read_at(self.off * 4, self.len)
    }
}

/// A kernel argument, passed by value as the generated signature declares it.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(sys::CUdeviceptr),
    U64(u64),
    I32(i32),
    F32(f32),
    Bool(bool),
}

/// Launches `f` on the default stream (queued for a graph while a decode step records).
/// `shared`: bytes of dynamic shared memory (`Loaded::dyn_shared`).
pub fn launch(dev: &Device, f: &CudaFunction, grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32, args: &[Arg]) -> Result<(), CudaError> {
    if grid.0 == 0 || grid.1 == 0 {
        return Ok(());
    }
    dev.run_step(Step::kernel(f.cu_function(), grid, block, shared, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed allocation reads as a sentence, with the free memory where known.
    #[test]
    fn out_of_memory_is_a_sentence() {
        let e = out_of_memory(3_500_000_000, Some((164_800_000, 143_700_000_000)), "NVIDIA H200").to_string();
        assert_eq!(e, "cuda: out of device memory on the NVIDIA H200: 3.50 GB asked for (164.8 MB free of 143.70 GB)");
        let e = out_of_memory(1 << 20, None, "GPU").to_string();
        assert_eq!(e, "cuda: out of device memory on the GPU: 1.0 MB asked for");
    }
}
