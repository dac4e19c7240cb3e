//! The raw driver layer: every `unsafe` call into libcuda lives here.
//!
//! Like cudarc's `sys` → `result` → `safe` split, each function below is one
//! driver call with its status turned into a `Result`, and the handle types own
//! what they create (dropping frees it). Everything above this module is safe Rust.
//!
//! We call `cudarc::driver::sys` directly instead of cudarc's safe launch builder
//! because the builder records an event per argument per launch (§0: 4.0 µs per
//! issue against 3.7 µs for a prebuilt `cuLaunchKernel`); the hot path here passes a
//! prebuilt parameter array and nothing else.

use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys;

/// A CUDA driver status other than success, with the call that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverError {
    /// The raw status.
    pub(crate) code: sys::CUresult,
    /// The driver function that returned it.
    pub(crate) call: &'static str,
}

impl DriverError {
    /// The driver function that returned the status.
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The raw `CUresult` value.
    pub fn raw_status(&self) -> u32 {
        self.code as u32
    }

    /// "Not found" (a module symbol the kernel needs is missing).
    pub(crate) fn not_found(call: &'static str) -> DriverError {
        DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND,
            call,
        }
    }

    /// "Not supported" (an operation a context refuses, e.g. inside a capture).
    pub(crate) fn not_supported(call: &'static str) -> DriverError {
        DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            call,
        }
    }

    /// A cooperative launch whose grid cannot be co-resident.
    pub(crate) fn is_cooperative_launch_too_large(&self) -> bool {
        self.code == sys::CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    }

    /// The driver's name for the status, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn name(&self) -> String {
        let mut ptr: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static, NUL-terminated string
        // (or leaves it null for an unknown code); we only read it when non-null.
        let status = unsafe { sys::cuGetErrorName(self.code, &mut ptr) };
        if status == sys::CUresult::CUDA_SUCCESS && !ptr.is_null() {
            // SAFETY: checked non-null above; the driver owns the static string.
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("{:?}", self.code)
        }
    }

    /// True when the status leaves the context unusable (a sticky kernel fault):
    /// every later call in this context fails until the primary context is reset.
    pub fn is_sticky(&self) -> bool {
        use sys::CUresult::*;
        matches!(
            self.code,
            CUDA_ERROR_ILLEGAL_ADDRESS
                | CUDA_ERROR_LAUNCH_FAILED
                | CUDA_ERROR_ILLEGAL_INSTRUCTION
                | CUDA_ERROR_MISALIGNED_ADDRESS
                | CUDA_ERROR_INVALID_ADDRESS_SPACE
                | CUDA_ERROR_INVALID_PC
                | CUDA_ERROR_HARDWARE_STACK_ERROR
                | CUDA_ERROR_ASSERT
                | CUDA_ERROR_CONTEXT_IS_DESTROYED
                | CUDA_ERROR_ECC_UNCORRECTABLE
        )
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} returned {}", self.call, self.name())
    }
}

impl std::error::Error for DriverError {}

/// Driver result alias.
pub type DriverResult<T> = Result<T, DriverError>;

/// Driver calls made by the current thread, by kind: what tests count to prove
/// invariant 4 ("one synchronize per dispatch") on the real driver. One
/// thread-local increment per counted call (a few nanoseconds against the
/// microseconds of the call itself).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCallCounts {
    /// `cuStreamSynchronize`.
    pub synchronizes: u64,
    /// `cuLaunchKernel` and `cuLaunchCooperativeKernel`.
    pub launches: u64,
    /// `cuGraphLaunch`.
    pub graph_launches: u64,
    /// Async copies, either direction.
    pub async_copies: u64,
    /// `cuStreamWaitEvent`: device-side waits of one stream on another's work.
    pub stream_waits: u64,
}

impl DriverCallCounts {
    /// The calls made since `before` (an earlier reading of the same thread).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub fn since(&self, before: &DriverCallCounts) -> DriverCallCounts {
        DriverCallCounts {
            synchronizes: self.synchronizes - before.synchronizes,
            launches: self.launches - before.launches,
            graph_launches: self.graph_launches - before.graph_launches,
            async_copies: self.async_copies - before.async_copies,
            stream_waits: self.stream_waits - before.stream_waits,
        }
    }
}

thread_local! {
    static CALLS: std::cell::Cell<DriverCallCounts> =
        const { std::cell::Cell::new(DriverCallCounts { synchronizes: 0, launches: 0, graph_launches: 0, async_copies: 0, stream_waits: 0 }) };
}

#[inline]
fn count(bump: impl FnOnce(&mut DriverCallCounts)) {
    CALLS.with(|calls| {
        let mut counts = calls.get();
        bump(&mut counts);
        calls.set(counts);
    });
}

/// The driver calls the current thread has made so far.
#[cfg(feature = "testing")]
pub fn thread_call_counts() -> DriverCallCounts {
    CALLS.with(|calls| calls.get())
}

#[inline]
fn check(code: sys::CUresult, call: &'static str) -> DriverResult<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError { code, call })
    }
}

/// Every driver symbol this crate calls. Checked once before first use, because
/// cudarc's dynamic loader panics on a missing symbol and we promise never to panic.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventElapsedTime",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemGetInfo_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemsetD8Async",
    "cuMemsetD32Async",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuLaunchKernel",
    "cuLaunchCooperativeKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuGetErrorName",
];

/// Driver symbols only dispatch graphs (`crate::graph`) need. Checked separately, on
/// first use of a graph, so a driver that lacks one still serves plain dispatches.
const GRAPH_SYMBOLS: &[&str] = &[
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamGetCaptureInfo_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphExecKernelNodeSetParams_v2",
    "cuGraphKernelNodeSetParams_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
];

/// Why the driver library could not be used at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadError {
    /// No `libcuda.so` could be opened.
    LibraryMissing,
    /// The library lacks a symbol we need (driver too old).
    SymbolMissing(&'static str),
}

/// Opens libcuda and checks every symbol a plain dispatch uses. Cached: the first
/// answer stands.
pub fn load_driver() -> Result<(), LoadError> {
    static LOADED: std::sync::OnceLock<Result<(), LoadError>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: is_culib_present only tries to dlopen candidate library names.
            if !unsafe { sys::is_culib_present() } {
                return Err(LoadError::LibraryMissing);
            }
            check_symbols(REQUIRED_SYMBOLS)
        })
        .clone()
}

/// Checks the symbols dispatch graphs use (after [`load_driver`] succeeded). Cached.
pub fn load_graph_symbols() -> Result<(), LoadError> {
    static LOADED: std::sync::OnceLock<Result<(), LoadError>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            load_driver()?;
            check_symbols(GRAPH_SYMBOLS)
        })
        .clone()
}

fn check_symbols(names: &[&'static str]) -> Result<(), LoadError> {
    // SAFETY: only called after is_culib_present() proved the library opens, so
    // culib() does not reach its panic path.
    let lib = unsafe { sys::culib() };
    for name in names {
        // SAFETY: we only look the symbol up; its type is never used.
        let found = unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok();
        if !found {
            return Err(LoadError::SymbolMissing(name));
        }
    }
    Ok(())
}

/// `cuInit(0)`.
pub fn init() -> DriverResult<()> {
    // SAFETY: cuInit has no preconditions; load_driver() ran first (callers ensure).
    check(unsafe { sys::cuInit(0) }, "cuInit")
}

/// The driver's CUDA version, e.g. 13000.
pub fn driver_version() -> DriverResult<i32> {
    let mut v = 0;
    // SAFETY: writes one int.
    check(
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
    )?;
    Ok(v)
}

/// Number of CUDA devices.
pub fn device_count() -> DriverResult<i32> {
    let mut n = 0;
    // SAFETY: writes one int; cuInit was called.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// A device ordinal resolved to a driver handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device(pub(crate) sys::CUdevice);

impl Device {
    /// `cuDeviceGet`.
    pub fn get(ordinal: i32) -> DriverResult<Device> {
        let mut d = 0;
        // SAFETY: writes one device handle; the driver validates the ordinal.
        check(unsafe { sys::cuDeviceGet(&mut d, ordinal) }, "cuDeviceGet")?;
        Ok(Device(d))
    }

    /// One integer attribute.
    pub fn attribute(self, attribute: sys::CUdevice_attribute) -> DriverResult<i32> {
        let mut v = 0;
        // SAFETY: writes one int for a valid device handle.
        check(
            unsafe { sys::cuDeviceGetAttribute(&mut v, attribute, self.0) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    /// Whether the device has stream-ordered memory pools (graph allocations).
    pub fn memory_pools_supported(self) -> DriverResult<bool> {
        Ok(
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?
                != 0,
        )
    }

    /// Marketing name.
    pub fn name(self) -> DriverResult<String> {
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the driver writes at most len bytes, NUL-terminated.
        check(
            unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, self.0) },
            "cuDeviceGetName",
        )?;
        // SAFETY: the buffer is NUL-terminated by the driver (and zero-initialised).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Total memory in bytes.
    pub fn total_memory(self) -> DriverResult<u64> {
        let mut v = 0usize;
        // SAFETY: writes one size_t.
        check(
            unsafe { sys::cuDeviceTotalMem_v2(&mut v, self.0) },
            "cuDeviceTotalMem_v2",
        )?;
        Ok(v as u64)
    }
}

/// A retained primary context. Released on drop.
pub struct PrimaryContext {
    pub(crate) raw: sys::CUcontext,
    device: Device,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is
// thread-safe; each thread makes it current before use, see `bind`).
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; shared references only read the handle value.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retain the device's primary context.
    pub fn retain(device: Device) -> DriverResult<PrimaryContext> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one context handle for a valid device.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, device.0) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(PrimaryContext { raw, device })
    }

    /// Reset the device's primary context: destroys every allocation and module in
    /// it. The only way back from a sticky kernel fault.
    pub(crate) fn reset_device(device: Device) -> DriverResult<()> {
        // SAFETY: valid device handle; callers guarantee no live handle of theirs is
        // used afterwards (the backend's epoch check enforces it).
        check(
            unsafe { sys::cuDevicePrimaryCtxReset_v2(device.0) },
            "cuDevicePrimaryCtxReset_v2",
        )
    }

    /// Make this context current on the calling thread (cheap when it already is).
    #[inline]
    pub fn bind(&self) -> DriverResult<()> {
        let mut current = std::ptr::null_mut();
        // SAFETY: writes one handle.
        let status = unsafe { sys::cuCtxGetCurrent(&mut current) };
        if status == sys::CUresult::CUDA_SUCCESS && current == self.raw {
            return Ok(());
        }
        // SAFETY: self.raw is a retained, live context.
        check(unsafe { sys::cuCtxSetCurrent(self.raw) }, "cuCtxSetCurrent")
    }

    /// Device of the context.
    pub fn device(&self) -> Device {
        self.device
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balanced with the retain in `retain`; errors are ignored on drop.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.device.0);
        }
    }
}

/// `cuMemGetInfo`: (free, total) bytes of the current context's device.
pub fn memory_info() -> DriverResult<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two size_t; a context is current (callers bind first).
    check(
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo_v2",
    )?;
    Ok((free as u64, total as u64))
}

/// A non-blocking stream. Destroyed on drop.
pub struct Stream {
    pub(crate) raw: sys::CUstream,
}

// SAFETY: stream handles are usable from any thread; the backend leases each
// stream to one dispatch at a time, so no two threads enqueue on it concurrently.
unsafe impl Send for Stream {}
// SAFETY: shared access only reads the handle value.
unsafe impl Sync for Stream {}

impl Stream {
    /// `cuStreamCreate(CU_STREAM_NON_BLOCKING)`.
    pub fn new() -> DriverResult<Stream> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle; a context is current.
        check(
            unsafe {
                sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
        )?;
        Ok(Stream { raw })
    }

    /// Block until all work on the stream is done.
    #[inline]
    pub fn synchronize(&self) -> DriverResult<()> {
        count(|c| c.synchronizes += 1);
        // SAFETY: live stream handle.
        check(
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }

    /// Make work enqueued on this stream from now on wait for `event`'s last
    /// record (`cuStreamWaitEvent`): device-side ordering, nothing waits on the host.
    pub fn wait_event(&self, event: &Event) -> DriverResult<()> {
        count(|c| c.stream_waits += 1);
        // SAFETY: live stream and event handles of the same context.
        check(
            unsafe { sys::cuStreamWaitEvent(self.raw, event.raw, 0) },
            "cuStreamWaitEvent",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: we own the handle; errors ignored on drop.
        unsafe {
            sys::cuStreamDestroy_v2(self.raw);
        }
    }
}

/// A timing event. Destroyed on drop.
pub struct Event {
    raw: sys::CUevent,
}

// SAFETY: event handles are usable from any thread; leased like streams.
unsafe impl Send for Event {}
// SAFETY: shared access only reads the handle value.
unsafe impl Sync for Event {}

impl Event {
    /// A timing-capable event.
    pub fn new() -> DriverResult<Event> {
        Event::with_flags(sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    /// An event for ordering streams only (`CU_EVENT_DISABLE_TIMING`: cheaper to
    /// record and wait on; it cannot be timed).
    pub fn for_ordering() -> DriverResult<Event> {
        Event::with_flags(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    fn with_flags(flags: sys::CUevent_flags) -> DriverResult<Event> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle; a context is current.
        check(
            unsafe { sys::cuEventCreate(&mut raw, flags as u32) },
            "cuEventCreate",
        )?;
        Ok(Event { raw })
    }

    /// Record on a stream.
    #[inline]
    pub fn record(&self, stream: &Stream) -> DriverResult<()> {
        // SAFETY: live event and stream of the same context.
        check(
            unsafe { sys::cuEventRecord(self.raw, stream.raw) },
            "cuEventRecord",
        )
    }

    /// Nanoseconds between two recorded, completed events (0.5 µs resolution).
    pub fn elapsed_ns(start: &Event, end: &Event) -> DriverResult<u64> {
        let mut ms = 0f32;
        // SAFETY: both events were recorded and their stream synchronised.
        check(
            unsafe { sys::cuEventElapsedTime(&mut ms, start.raw, end.raw) },
            "cuEventElapsedTime",
        )?;
        Ok((ms.max(0.0) as f64 * 1.0e6) as u64)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe {
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}

/// Device memory. Freed on drop (the owning context must still be alive, which
/// the backend guarantees by dropping buffers before its context).
///
/// Or host-mapped memory seen through its device address
/// ([`DeviceMemory::allocate_host_mapped`]): kernels read and write it like device
/// memory, and its stores reach the host with no copy enqueued.
pub struct DeviceMemory {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: u64,
    /// The host pages `ptr` addresses when this is host-mapped memory (freed by
    /// their own drop instead of `cuMemFree`).
    host_mapped: Option<MappedMemory>,
}

impl DeviceMemory {
    /// `cuMemAlloc` of at least one byte.
    pub fn allocate(bytes: u64) -> DriverResult<DeviceMemory> {
        let mut ptr = 0;
        let request = bytes.max(1) as usize;
        // SAFETY: writes one device pointer; a context is current.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, request) },
            "cuMemAlloc_v2",
        )?;
        Ok(DeviceMemory {
            ptr,
            bytes,
            host_mapped: None,
        })
    }

    /// Host-mapped pinned memory of at least one byte, zeroed, addressed by kernels
    /// through its device pointer ([`MappedMemory`]).
    pub fn allocate_host_mapped(bytes: u64) -> DriverResult<DeviceMemory> {
        let request = usize::try_from(bytes).map_err(|_| DriverError {
            code: sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            call: "cuMemHostAlloc(DEVICEMAP) (size past the host's address space)",
        })?;
        let mapped = MappedMemory::allocate(request)?;
        Ok(DeviceMemory {
            ptr: mapped.device_address(0),
            bytes,
            host_mapped: Some(mapped),
        })
    }

    /// The host side of host-mapped memory (`None` for device memory). Read it only
    /// after every stream whose kernels write it was synchronised.
    pub fn host_mapped(&self) -> Option<&MappedMemory> {
        self.host_mapped.as_ref()
    }

    /// [`DeviceMemory::host_mapped`], writable. Write it only while no kernel using
    /// it is enqueued or running.
    pub fn host_mapped_mut(&mut self) -> Option<&mut MappedMemory> {
        self.host_mapped.as_mut()
    }

    /// Device address.
    pub fn address(&self) -> u64 {
        self.ptr
    }

    /// Usable size in bytes.
    pub fn size(&self) -> u64 {
        self.bytes
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.host_mapped.is_some() {
            // The host pages are freed by the `MappedMemory` drop right after this.
            return;
        }
        // SAFETY: we own the allocation; errors ignored on drop.
        unsafe {
            sys::cuMemFree_v2(self.ptr);
        }
    }
}

/// Page-locked host memory for asynchronous copies. Freed on drop.
pub struct PinnedMemory {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: plain host memory; the backend leases each staging buffer to one
// dispatch at a time.
unsafe impl Send for PinnedMemory {}
// SAFETY: shared access never writes.
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    /// `cuMemHostAlloc(PORTABLE)`.
    pub fn allocate(bytes: usize) -> DriverResult<PinnedMemory> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let request = bytes.max(1);
        // SAFETY: writes one host pointer; a context is current.
        check(
            unsafe { sys::cuMemHostAlloc(&mut ptr, request, sys::CU_MEMHOSTALLOC_PORTABLE) },
            "cuMemHostAlloc",
        )?;
        Ok(PinnedMemory {
            ptr: ptr as *mut u8,
            bytes: request,
        })
    }

    /// Capacity in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Host address of byte `offset`; callers keep offset + length within `len()`.
    pub(crate) fn address(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.bytes);
        self.ptr.wrapping_add(offset)
    }

    /// Copy bytes in. Panics never: callers size the buffer first; out-of-range
    /// requests are truncated to capacity.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        let end = offset.saturating_add(data.len()).min(self.bytes);
        let n = end.saturating_sub(offset);
        // SAFETY: [offset, offset+n) lies within our allocation, and `data` cannot
        // overlap page-locked memory we own exclusively (&mut self).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), n) };
    }

    /// Read `len` bytes at `offset`.
    pub fn slice(&self, offset: usize, len: usize) -> &[u8] {
        let end = offset.saturating_add(len).min(self.bytes);
        let start = offset.min(end);
        // SAFETY: [start, end) lies within our allocation; the caller synchronised
        // the stream that wrote it before reading.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), end - start) }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        // SAFETY: we own the allocation.
        unsafe {
            sys::cuMemFreeHost(self.ptr as *mut c_void);
        }
    }
}

/// Enqueue a host → device copy from pinned memory.
///
/// # Safety
/// `src` must stay valid and unmodified until the stream reaches the copy, and
/// `dst`+`len` must lie inside a live device allocation.
#[inline]
pub unsafe fn copy_to_device_async(
    dst: u64,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> DriverResult<()> {
    count(|c| c.async_copies += 1);
    check(
        sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream.raw),
        "cuMemcpyHtoDAsync_v2",
    )
}

/// Enqueue a device → host copy into pinned memory.
///
/// # Safety
/// `dst` must stay valid and unread until the stream is synchronised, and
/// `src`+`len` must lie inside a live device allocation.
#[inline]
pub unsafe fn copy_to_host_async(
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: &Stream,
) -> DriverResult<()> {
    count(|c| c.async_copies += 1);
    check(
        sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream.raw),
        "cuMemcpyDtoHAsync_v2",
    )
}

/// A blocking device → host copy of raw addresses (instruments only).
#[cfg(feature = "testing")]
///
/// # Safety
/// `src`+`dst.len()` must lie inside a live device allocation.
pub unsafe fn copy_to_host_blocking_raw(dst: &mut [u8], src: u64) -> DriverResult<()> {
    check(
        sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len()),
        "cuMemcpyDtoH_v2",
    )
}

/// Enqueue a byte fill.
///
/// # Safety
/// `dst`+`len` must lie inside a live device allocation.
#[inline]
pub unsafe fn fill_bytes_async(
    dst: u64,
    value: u8,
    len: usize,
    stream: &Stream,
) -> DriverResult<()> {
    check(
        sys::cuMemsetD8Async(dst, value, len, stream.raw),
        "cuMemsetD8Async",
    )
}

/// Enqueue a 32-bit word fill.
///
/// # Safety
/// `dst`+`4*words` must lie inside a live device allocation, 4-byte aligned.
#[inline]
pub unsafe fn fill_words_async(
    dst: u64,
    value: u32,
    words: usize,
    stream: &Stream,
) -> DriverResult<()> {
    check(
        sys::cuMemsetD32Async(dst, value, words, stream.raw),
        "cuMemsetD32Async",
    )
}

/// A loaded module, unloaded when the last [`LoadedModule`] of its entries drops.
struct ModuleHandle(sys::CUmodule);

// SAFETY: a module handle is usable from any thread of the process; it is only
// read after loading and unloaded once, by the last owner's drop.
unsafe impl Send for ModuleHandle {}
// SAFETY: as above: shared owners only read the handle.
unsafe impl Sync for ModuleHandle {}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `LoadedModule::load_entries` and this is
        // the last owner (the `Arc` in every `LoadedModule` of it is gone).
        unsafe {
            sys::cuModuleUnload(self.0);
        }
    }
}

/// One entry function of a loaded module. Every entry of a module keeps the module
/// loaded (a shared `Arc`), so the kernels of one [`LoadedModule::load_entries`]
/// call can be used and dropped independently.
pub struct LoadedModule {
    module: Arc<ModuleHandle>,
    pub(crate) function: sys::CUfunction,
    /// Address and size of a module-scope global, when requested and present.
    pub(crate) global: Option<(u64, usize)>,
}

// SAFETY: module and function handles are usable from any thread of the process.
unsafe impl Send for LoadedModule {}
// SAFETY: launches only read the handles.
unsafe impl Sync for LoadedModule {}

/// `text` as a C string for a driver call; a NUL byte inside is `CUDA_ERROR_NOT_FOUND`
/// (`INVALID_IMAGE` for the image itself) naming `call`.
fn c_string(text: &str, code: sys::CUresult, call: &'static str) -> DriverResult<CString> {
    CString::new(text).map_err(|_| DriverError { code, call })
}

impl LoadedModule {
    /// JIT-load PTX text and look up `entry` (and `global`, if given).
    pub fn load(ptx: &str, entry: &str, global: Option<&str>) -> DriverResult<LoadedModule> {
        let mut entries = Self::load_entries(ptx, &[(entry, global)])?;
        entries.pop().ok_or(DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND,
            call: "cuModuleGetFunction",
        })
    }

    /// JIT-load PTX text once (one `cuModuleLoadData`) and look up each entry
    /// function (with its module-scope global, if given), in order: a module of
    /// several kernels ([`crate::codegen::PtxModuleBuilder`]) costs one driver JIT.
    pub fn load_entries(
        ptx: &str,
        entries: &[(&str, Option<&str>)],
    ) -> DriverResult<Vec<LoadedModule>> {
        let image = c_string(
            ptx,
            sys::CUresult::CUDA_ERROR_INVALID_IMAGE,
            "cuModuleLoadData (PTX contains a NUL byte)",
        )?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: image is a NUL-terminated PTX string that outlives the call.
        check(
            unsafe { sys::cuModuleLoadData(&mut raw, image.as_ptr() as *const c_void) },
            "cuModuleLoadData",
        )?;
        let module = Arc::new(ModuleHandle(raw));
        let mut loaded = Vec::with_capacity(entries.len());
        for &(entry, global) in entries {
            let entry = c_string(
                entry,
                sys::CUresult::CUDA_ERROR_NOT_FOUND,
                "cuModuleGetFunction (name contains a NUL byte)",
            )?;
            let mut function = std::ptr::null_mut();
            // SAFETY: live module (held by `module`); writes one function handle.
            check(
                unsafe { sys::cuModuleGetFunction(&mut function, raw, entry.as_ptr()) },
                "cuModuleGetFunction",
            )?;
            let global = match global {
                None => None,
                Some(name) => {
                    let name = c_string(
                        name,
                        sys::CUresult::CUDA_ERROR_NOT_FOUND,
                        "cuModuleGetGlobal (name contains a NUL byte)",
                    )?;
                    let (mut ptr, mut size) = (0u64, 0usize);
                    // SAFETY: live module; writes one pointer and one size.
                    check(
                        unsafe {
                            sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, raw, name.as_ptr())
                        },
                        "cuModuleGetGlobal_v2",
                    )?;
                    Some((ptr, size))
                }
            };
            loaded.push(LoadedModule {
                module: Arc::clone(&module),
                function,
                global,
            });
        }
        Ok(loaded)
    }

    /// Whether `self` and `other` are entries of one loaded module.
    pub fn shares_module_with(&self, other: &LoadedModule) -> bool {
        Arc::ptr_eq(&self.module, &other.module)
    }

    /// Most co-resident blocks per SM for a block size and dynamic shared memory.
    pub fn max_active_blocks_per_sm(
        &self,
        block_threads: u32,
        dynamic_shared: usize,
    ) -> DriverResult<u32> {
        let mut n = 0;
        // SAFETY: live function handle; writes one int.
        check(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut n,
                    self.function,
                    block_threads as i32,
                    dynamic_shared,
                )
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(n.max(0) as u32)
    }
}

/// Enqueue a launch with a prebuilt parameter array.
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, in order, each pointing at
/// a value of the parameter's size that stays alive for this call; every device
/// address passed must be live until the stream passes the launch.
#[inline]
pub unsafe fn launch(
    module: &LoadedModule,
    grid: [u32; 3],
    block: [u32; 3],
    stream: &Stream,
    params: &mut [*mut c_void],
    cooperative: bool,
) -> DriverResult<()> {
    count(|c| c.launches += 1);
    if cooperative {
        check(
            sys::cuLaunchCooperativeKernel(
                module.function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                stream.raw,
                params.as_mut_ptr(),
            ),
            "cuLaunchCooperativeKernel",
        )
    } else {
        check(
            sys::cuLaunchKernel(
                module.function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            "cuLaunchKernel",
        )
    }
}

// ---------------------------------------------------------------------------
// CUDA graphs: stream capture, instantiation, replay and kernel-node updates
// (`crate::graph`). §0 measured a graph replay of one kernel + a 16-byte copy +
// synchronize at 8.5 µs and 1.0 µs per extra kernel node (3.6 µs eager).

/// A captured (not yet executable) graph. Destroyed on drop.
pub struct Graph {
    raw: sys::CUgraph,
}

// SAFETY: a graph handle may be used from any thread; the owner (`DispatchGraph`)
// is moved between threads, never shared, and takes `&mut self` to change it.
unsafe impl Send for Graph {}

/// A node of a [`Graph`], valid while that graph lives. Transparent, so a slice of
/// nodes is an array of driver node handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct GraphNode(sys::CUgraphNode);

// SAFETY: a node handle is an opaque value; it is only passed back to the driver
// together with the graph (or its executable) that owns it.
unsafe impl Send for GraphNode {}

/// The kind of a graph node, as far as the graph module cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphNodeKind {
    /// A kernel launch.
    Kernel,
    /// Anything else (copies, fills, allocations, ...).
    Other,
}

/// An active stream capture. Dropping it without [`Capture::end`] ends the
/// capture and destroys whatever was captured, so an error half-way through a
/// capture never leaves the stream capturing.
pub struct Capture<'s> {
    stream: &'s Stream,
    ended: bool,
}

impl<'s> Capture<'s> {
    /// `cuStreamBeginCapture_v2(THREAD_LOCAL)`: from now on, work enqueued on
    /// `stream` is recorded into a graph instead of running. Thread-local mode: only
    /// this thread is barred from calls that could synchronise with the capture
    /// (allocations, blocking copies); other threads of the process are unaffected.
    pub fn begin(stream: &'s Stream) -> DriverResult<Capture<'s>> {
        // SAFETY: live stream handle; a context is current (callers bind first).
        check(
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream.raw,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture_v2",
        )?;
        Ok(Capture {
            stream,
            ended: false,
        })
    }

    /// The stream being captured (enqueue the operations to record on it).
    pub fn stream(&self) -> &'s Stream {
        self.stream
    }

    /// The node the last captured operation created (`cuStreamGetCaptureInfo_v2`):
    /// on a linear capture the stream's dependency set is exactly that one node.
    /// An error when the capture was invalidated or the set is not one node.
    pub fn last_node(&self) -> DriverResult<GraphNode> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut dependencies: *const sys::CUgraphNode = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: live, capturing stream; writes a status, a pointer to a driver-owned
        // array and its length (id and graph outputs are optional and passed null).
        check(
            unsafe {
                sys::cuStreamGetCaptureInfo_v2(
                    self.stream.raw,
                    &mut status,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut dependencies,
                    &mut count,
                )
            },
            "cuStreamGetCaptureInfo_v2",
        )?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Err(DriverError {
                code: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                call: "cuStreamGetCaptureInfo_v2 (capture is not active)",
            });
        }
        if count != 1 || dependencies.is_null() {
            return Err(DriverError {
                code: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                call: "cuStreamGetCaptureInfo_v2 (capture is not a single chain)",
            });
        }
        // SAFETY: the driver returned a non-null array of `count` (= 1) nodes, valid
        // until the next call on this stream; we copy the handle out at once.
        Ok(GraphNode(unsafe { *dependencies }))
    }

    /// `cuStreamEndCapture`: the recorded graph.
    pub fn end(mut self) -> DriverResult<Graph> {
        self.ended = true;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun in `begin`, not yet ended).
        let status = unsafe { sys::cuStreamEndCapture(self.stream.raw, &mut raw) };
        if status != sys::CUresult::CUDA_SUCCESS {
            if !raw.is_null() {
                // SAFETY: the driver handed us a graph we own; discard it.
                unsafe { sys::cuGraphDestroy(raw) };
            }
            return Err(DriverError {
                code: status,
                call: "cuStreamEndCapture",
            });
        }
        if raw.is_null() {
            return Err(DriverError {
                code: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                call: "cuStreamEndCapture (no graph returned)",
            });
        }
        Ok(Graph { raw })
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is still capturing (end was never called); ending it
        // returns the partial graph (or null when the capture was invalidated), which
        // we own and destroy; errors are ignored on this discard path.
        unsafe {
            sys::cuStreamEndCapture(self.stream.raw, &mut raw);
            if !raw.is_null() {
                sys::cuGraphDestroy(raw);
            }
        }
    }
}

impl Graph {
    /// `cuGraphNodeGetType`, reduced to kernel / other.
    pub fn node_kind(&self, node: GraphNode) -> DriverResult<GraphNodeKind> {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` came from the capture that produced this live graph; writes
        // one enum value.
        check(
            unsafe { sys::cuGraphNodeGetType(node.0, &mut kind) },
            "cuGraphNodeGetType",
        )?;
        Ok(if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            GraphNodeKind::Kernel
        } else {
            GraphNodeKind::Other
        })
    }

    /// Number of nodes (`cuGraphGetNodes` with a null array).
    pub fn node_count(&self) -> DriverResult<usize> {
        let mut count = 0usize;
        // SAFETY: live graph; a null array asks only for the count.
        check(
            unsafe { sys::cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut count) },
            "cuGraphGetNodes",
        )?;
        Ok(count)
    }

    /// `cuGraphInstantiateWithFlags(0)`: an executable graph.
    pub fn instantiate(&self) -> DriverResult<GraphExec> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: live graph; writes one executable handle; a context is current.
        check(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0) },
            "cuGraphInstantiateWithFlags",
        )?;
        Ok(GraphExec { raw })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: we own the graph; every executable made from it is destroyed first
        // by its owner (field order); errors are ignored on drop.
        unsafe {
            sys::cuGraphDestroy(self.raw);
        }
    }
}

/// An executable graph. Destroyed on drop.
pub struct GraphExec {
    raw: sys::CUgraphExec,
}

// SAFETY: as for `Graph`: moved between threads, never launched concurrently (the
// owner takes `&mut self` to launch or update it).
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Enqueue one replay of the whole graph (`cuGraphLaunch`).
    ///
    /// # Safety
    /// Every device allocation and every pinned host buffer the graph's nodes read
    /// or write must stay alive, and the pinned buffers untouched by the host, until
    /// the stream is synchronised.
    #[inline]
    pub unsafe fn launch(&self, stream: &Stream) -> DriverResult<()> {
        count(|c| c.graph_launches += 1);
        check(sys::cuGraphLaunch(self.raw, stream.raw), "cuGraphLaunch")
    }
}

/// Where a kernel node's parameters are changed.
#[derive(Clone, Copy)]
pub enum KernelNodeHolder<'g> {
    /// An executable graph: later launches of it use the new values
    /// (`cuGraphExecKernelNodeSetParams_v2`).
    Executable(&'g GraphExec),
    /// The captured graph the node belongs to: what a later clone of it (a parent's
    /// child-graph node) or [`GraphExec::set_child_graph_params`] picks up
    /// (`cuGraphKernelNodeSetParams_v2`). The driver call names only the node; the
    /// graph is borrowed so the node's owner is alive for the call.
    Captured(#[allow(dead_code)] &'g Graph),
}

/// Change a kernel node's grid and parameter values in `holder`; the values are
/// copied by the call.
///
/// # Safety
/// `node` must be a kernel node of the captured graph (or of the graph the
/// executable was instantiated from), launching `module`'s function; `params` must
/// hold one pointer per kernel parameter, in order, each pointing at a value of the
/// parameter's size that stays alive for this call; every device address passed must
/// stay alive while the executable (or any clone of the graph) can be launched. No
/// launch of the executable may be running.
pub unsafe fn set_kernel_node_params(
    holder: KernelNodeHolder<'_>,
    node: GraphNode,
    module: &LoadedModule,
    grid: [u32; 3],
    block: [u32; 3],
    params: &mut [*mut c_void],
) -> DriverResult<()> {
    let node_params = kernel_node_params(module, grid, block, params);
    match holder {
        KernelNodeHolder::Executable(exec) => check(
            sys::cuGraphExecKernelNodeSetParams_v2(exec.raw, node.0, &node_params),
            "cuGraphExecKernelNodeSetParams_v2",
        ),
        KernelNodeHolder::Captured(_) => check(
            sys::cuGraphKernelNodeSetParams_v2(node.0, &node_params),
            "cuGraphKernelNodeSetParams_v2",
        ),
    }
}

/// The kernel-node parameter block of one launch of `module`'s function. The
/// function names its module's context, so the node runs on that module's device.
fn kernel_node_params(
    module: &LoadedModule,
    grid: [u32; 3],
    block: [u32; 3],
    params: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: module.function,
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: 0,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        // Ignored when `func` is set.
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: we own the executable; its owner synchronised its stream first.
        unsafe {
            sys::cuGraphExecDestroy(self.raw);
        }
    }
}

/// Enqueue a stream-ordered allocation (`cuMemAllocAsync`). Inside a capture it
/// becomes a graph allocation node whose address is fixed for the graph's life.
///
/// # Safety
/// The allocation must be freed with [`free_async`] on a stream ordered after every
/// use (inside the same capture, for a graph allocation).
pub unsafe fn allocate_async(bytes: u64, stream: &Stream) -> DriverResult<u64> {
    let mut ptr = 0;
    check(
        sys::cuMemAllocAsync(&mut ptr, bytes.max(1) as usize, stream.raw),
        "cuMemAllocAsync",
    )?;
    Ok(ptr)
}

/// Enqueue a stream-ordered free (`cuMemFreeAsync`); inside a capture, a graph
/// free node.
///
/// # Safety
/// `ptr` must come from [`allocate_async`] and nothing may use it after this point
/// in stream order.
pub unsafe fn free_async(ptr: u64, stream: &Stream) -> DriverResult<()> {
    check(sys::cuMemFreeAsync(ptr, stream.raw), "cuMemFreeAsync")
}

impl PinnedMemory {
    /// Mutable view of `len` bytes at `offset` (truncated to capacity), for callers
    /// that fill staging in place (a graph's input slots).
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        let end = offset.saturating_add(len).min(self.bytes);
        let start = offset.min(end);
        // SAFETY: [start, end) lies within our allocation; `&mut self` gives exclusive
        // access, and the caller synchronised every stream that reads it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

// ---------------------------------------------------------------------------
// Stitched graphs across the devices of one host (`crate::graph::stitch`): a parent
// graph built node by node (a stream capture cannot span devices), whose nodes are
// clones of per-device captured graphs (child-graph nodes) and copies between them.

/// Driver symbols only stitched graphs need. Checked on first use of a stitch, so a
/// driver that lacks one still serves plain dispatches and single graphs.
const STITCH_SYMBOLS: &[&str] = &[
    "cuGraphCreate",
    "cuGraphAddChildGraphNode",
    "cuGraphAddMemcpyNode",
    "cuGraphExecChildGraphNodeSetParams",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
];

/// Checks the symbols stitched graphs use (after [`load_graph_symbols`]). Cached.
pub fn load_stitch_symbols() -> Result<(), LoadError> {
    static LOADED: std::sync::OnceLock<Result<(), LoadError>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            load_graph_symbols()?;
            check_symbols(STITCH_SYMBOLS)
        })
        .clone()
}

/// `cuDeviceCanAccessPeer(device, peer)`: whether `device` can address `peer`'s
/// memory directly (peer-to-peer over NVLink or PCIe).
pub fn can_access_peer(device: Device, peer: Device) -> DriverResult<bool> {
    let mut can = 0;
    // SAFETY: writes one int for two valid device handles.
    check(
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, device.0, peer.0) },
        "cuDeviceCanAccessPeer",
    )?;
    Ok(can != 0)
}

impl PrimaryContext {
    /// Let this context address `peer`'s allocations directly
    /// (`cuCtxEnablePeerAccess`, with this context bound). Enabling an access that is
    /// already on is not an error: a stitch asks for it every time it is built.
    pub fn enable_peer_access(&self, peer: &PrimaryContext) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `peer.raw` is a retained, live context; this context is current.
        let status = unsafe { sys::cuCtxEnablePeerAccess(peer.raw, 0) };
        if status == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(status, "cuCtxEnablePeerAccess")
    }
}

/// One end of a linear copy node.
#[derive(Clone, Copy, Debug)]
pub enum CopyEnd {
    /// A device address (unified addressing: the address names its device).
    Device(u64),
    /// Pinned host memory.
    Host(*mut u8),
}

impl CopyEnd {
    /// The memory type, device address and host pointer of a `CUDA_MEMCPY3D` end.
    fn parts(self) -> (sys::CUmemorytype, u64, *const c_void) {
        match self {
            CopyEnd::Device(address) => (
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                address,
                std::ptr::null(),
            ),
            CopyEnd::Host(host) => (
                sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                0,
                host as *const c_void,
            ),
        }
    }
}

impl Graph {
    /// `cuGraphCreate`: an empty graph to add nodes to.
    pub fn empty() -> DriverResult<Graph> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one graph handle; flags must be 0.
        check(unsafe { sys::cuGraphCreate(&mut raw, 0) }, "cuGraphCreate")?;
        Ok(Graph { raw })
    }

    /// `cuGraphAddChildGraphNode`: a node running a clone of `child`, after
    /// `dependencies`. Later changes to `child` reach the clone only through
    /// [`GraphExec::set_child_graph_params`].
    pub fn add_child_graph(
        &self,
        dependencies: &[GraphNode],
        child: &Graph,
    ) -> DriverResult<GraphNode> {
        let mut node = std::ptr::null_mut();
        // SAFETY: both graphs are live; `dependencies` are nodes of this graph
        // (`GraphNode` is a transparent-by-value handle, read as an array of
        // CUgraphNode of the given length); writes one node handle.
        check(
            unsafe {
                sys::cuGraphAddChildGraphNode(
                    &mut node,
                    self.raw,
                    dependencies.as_ptr() as *const sys::CUgraphNode,
                    dependencies.len(),
                    child.raw,
                )
            },
            "cuGraphAddChildGraphNode",
        )?;
        Ok(GraphNode(node))
    }

    /// `cuGraphAddMemcpyNode`: a node copying `bytes` from `source` to `destination`
    /// in `context`, after `dependencies`.
    ///
    /// # Safety
    /// Both ends must stay valid (device allocations alive, pinned host memory alive
    /// and untouched by the host while a launch runs) for as long as an executable
    /// made from this graph can be launched, and hold at least `bytes` bytes.
    pub unsafe fn add_copy(
        &self,
        dependencies: &[GraphNode],
        source: CopyEnd,
        destination: CopyEnd,
        bytes: usize,
        context: &PrimaryContext,
    ) -> DriverResult<GraphNode> {
        // Every field named: the memory types are Rust enums with no zero variant,
        // so a zeroed struct would be invalid (Rust refuses it at run time).
        let (source_type, source_device, source_host) = source.parts();
        let (destination_type, destination_device, destination_host) = destination.parts();
        // One row of `bytes` bytes: pitches equal to the row, one row per plane.
        let copy = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: source_type,
            srcHost: source_host,
            srcDevice: source_device,
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: bytes,
            srcHeight: 1,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: destination_type,
            dstHost: destination_host as *mut c_void,
            dstDevice: destination_device,
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: bytes,
            dstHeight: 1,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
        };
        let mut node = std::ptr::null_mut();
        check(
            sys::cuGraphAddMemcpyNode(
                &mut node,
                self.raw,
                dependencies.as_ptr() as *const sys::CUgraphNode,
                dependencies.len(),
                &copy,
                context.raw,
            ),
            "cuGraphAddMemcpyNode",
        )?;
        Ok(GraphNode(node))
    }
}

impl GraphExec {
    /// Make the clone inside child-graph node `node` run with `child`'s current node
    /// parameters on later launches (`cuGraphExecChildGraphNodeSetParams`); the
    /// topology of `child` must be the one the node was cloned from.
    ///
    /// # Safety
    /// `node` is a child-graph node of the graph this executable was instantiated
    /// from, cloned from `child`; every device address in `child`'s nodes stays alive
    /// while the executable can be launched; no launch of it is running.
    pub unsafe fn set_child_graph_params(
        &self,
        node: GraphNode,
        child: &Graph,
    ) -> DriverResult<()> {
        check(
            sys::cuGraphExecChildGraphNodeSetParams(self.raw, node.0, child.raw),
            "cuGraphExecChildGraphNodeSetParams",
        )
    }
}

// ---------------------------------------------------------------------------
// Host-mapped pinned memory (`crate::backend::readback`): page-locked host memory
// the GPU addresses directly, so a kernel's stores reach the host over PCIe with no
// DMA copy enqueued. §0 (2026-12-01): a kernel writing N = 1..16 16-byte outputs into
// mapped memory costs 9.7–9.9 µs per dispatch against 8.5–8.8 µs for launch +
// synchronize alone, where N async copies cost 11.6–35.0 µs.

/// Driver symbols only the mapped readback path needs. Checked on first use, so a
/// driver that lacks one still serves the copy path.
const MAPPED_SYMBOLS: &[&str] = &["cuMemHostGetDevicePointer_v2", "cuMemcpyHtoD_v2"];

/// Checks the symbols host-mapped memory uses (after [`load_driver`] succeeded). Cached.
pub fn load_mapped_symbols() -> Result<(), LoadError> {
    static LOADED: std::sync::OnceLock<Result<(), LoadError>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            load_driver()?;
            check_symbols(MAPPED_SYMBOLS)
        })
        .clone()
}

/// Page-locked host memory mapped into the device's address space
/// (`cuMemHostAlloc(PORTABLE | DEVICEMAP)` + `cuMemHostGetDevicePointer`). Freed on
/// drop. The host side is read only after the stream that wrote it was synchronised.
pub struct MappedMemory {
    host: *mut u8,
    device: u64,
    bytes: usize,
}

// SAFETY: plain host memory plus an address value; the backend leases each mapped
// area to one dispatch at a time (like pinned staging).
unsafe impl Send for MappedMemory {}
// SAFETY: shared access never writes.
unsafe impl Sync for MappedMemory {}

impl MappedMemory {
    /// Allocate `bytes` (at least one) of mapped pinned memory in the current context.
    pub fn allocate(bytes: usize) -> DriverResult<MappedMemory> {
        load_mapped_symbols().map_err(|_| DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            call: "cuMemHostGetDevicePointer_v2 (missing from this driver)",
        })?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let request = bytes.max(1);
        // SAFETY: writes one host pointer; a context is current (callers bind first).
        check(
            unsafe {
                sys::cuMemHostAlloc(
                    &mut host,
                    request,
                    sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                )
            },
            "cuMemHostAlloc(DEVICEMAP)",
        )?;
        let mut device = 0u64;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP just above; writes one
        // device pointer; flags must be 0.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) };
        if let Err(e) = check(status, "cuMemHostGetDevicePointer_v2") {
            // SAFETY: we own the allocation made above and nothing else refers to it.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        // SAFETY: [host, host+request) is ours; zeroed so no byte of an earlier owner
        // of these pages is ever readable through it.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, request) };
        Ok(MappedMemory {
            host: host as *mut u8,
            device,
            bytes: request,
        })
    }

    /// Device address of byte `offset` (what a kernel parameter carries).
    pub fn device_address(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.device + offset as u64
    }

    /// Read `len` bytes at `offset` (truncated to capacity). The caller synchronised
    /// every stream whose kernels write this memory.
    pub fn slice(&self, offset: usize, len: usize) -> &[u8] {
        let end = offset.saturating_add(len).min(self.bytes);
        let start = offset.min(end);
        // SAFETY: [start, end) lies within our allocation; no kernel writes it while
        // the host reads (the caller synchronised first).
        unsafe { std::slice::from_raw_parts(self.host.add(start), end - start) }
    }

    /// Mutable view of `len` bytes at `offset` (truncated to capacity). The caller
    /// ensures no kernel using this memory is enqueued or running.
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        let end = offset.saturating_add(len).min(self.bytes);
        let start = offset.min(end);
        // SAFETY: [start, end) lies within our allocation; `&mut self` is exclusive on
        // the host and no kernel uses it meanwhile (caller's duty).
        unsafe { std::slice::from_raw_parts_mut(self.host.add(start), end - start) }
    }

    /// Write bytes from the host (truncated to capacity), e.g. to clear a stamp
    /// before a launch. The caller ensures no kernel using this memory is running.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        let end = offset.saturating_add(data.len()).min(self.bytes);
        let n = end.saturating_sub(offset);
        // SAFETY: [offset, offset+n) lies within our allocation; `&mut self` is
        // exclusive on the host and no kernel is running against it (caller's duty).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.host.add(offset), n) };
    }
}

impl Drop for MappedMemory {
    fn drop(&mut self) {
        // SAFETY: we own the allocation; its owner synchronised every stream that
        // used it; errors ignored on drop.
        unsafe {
            sys::cuMemFreeHost(self.host as *mut c_void);
        }
    }
}

/// A blocking host → device copy of a few bytes (one-time initialisation of a
/// device control block; never on the dispatch path).
pub fn copy_to_device_blocking(dst: &DeviceMemory, data: &[u8]) -> DriverResult<()> {
    load_mapped_symbols().map_err(|_| DriverError {
        code: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
        call: "cuMemcpyHtoD_v2 (missing from this driver)",
    })?;
    let len = (data.len() as u64).min(dst.bytes) as usize;
    // SAFETY: `data` holds len bytes; [0, len) is inside the live allocation.
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst.ptr, data.as_ptr() as *const c_void, len) },
        "cuMemcpyHtoD_v2",
    )
}

/// Every device attribute the backend's [`DeviceCaps`](super::DeviceCaps) holds.
pub(crate) fn read_caps(ordinal: usize, device: Device) -> DriverResult<super::DeviceCaps> {
    use sys::CUdevice_attribute::*;
    let attr = |a| device.attribute(a).map(|v| v.max(0) as u32);
    Ok(super::DeviceCaps {
        ordinal,
        name: device.name()?,
        compute_capability: (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        total_memory: device.total_memory()?,
        max_threads_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_threads_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
        max_block_dims: [
            attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ],
        max_grid_dims: [
            attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ],
        max_shared_memory_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        max_shared_memory_per_block_optin: attr(
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?,
        warp_size: attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
        cooperative_launch: attr(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0,
        concurrent_kernels: attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS)? != 0,
        async_engine_count: attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)?,
        driver_version: driver_version()?,
    })
}
