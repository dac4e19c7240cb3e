//! The raw driver layer: every `unsafe` call into libcuda lives here, split by
//! concern: [`context`] (devices, primary contexts, peer access), [`memory`]
//! (device, pinned and host-mapped memory, copies and fills), [`stream`] (streams
//! and events), [`module`] (JIT-loaded modules and launches) and [`graph`] (stream
//! capture, executable graphs, node updates, the nodes of stitched parents). This
//! file holds what they share: the error type, the per-thread call counts, symbol
//! loading and driver initialisation.
//!
//! Like cudarc's `sys` → `result` → `safe` split, each function below is one
//! driver call with its status turned into a `Result`, and the handle types own
//! what they create (dropping frees it). Everything above this module is safe Rust.
//!
//! We call `cudarc::driver::sys` directly instead of cudarc's safe launch builder
//! because the builder records an event per argument per launch (measured on the
//! H200: 4.0 µs per issue against 3.7 µs for a prebuilt `cuLaunchKernel`); the hot
//! path here passes a prebuilt parameter array and nothing else.

mod context;
mod graph;
mod memory;
mod module;
mod resident;
mod stream;

use std::ffi::{c_void, CStr};
use std::fmt;

use cudarc::driver::sys;

pub use context::{can_access_peer, memory_info, Attribute, Device, PrimaryContext};
pub use graph::{
    set_kernel_node_params, Capture, CopyEnd, Graph, GraphExec, GraphNode, GraphNodeKind,
    KernelNodeHolder,
};
#[cfg(feature = "testing")]
pub use memory::copy_to_host_blocking_raw;
pub use memory::{
    allocate_async, copy_between_async, copy_to_device_async, copy_to_device_blocking,
    copy_to_host_async, fill_bytes_async, fill_words_async, free_async, DeviceMemory, MappedMemory,
    PinnedMemory,
};
pub use module::{launch, lazy_module_loading, LoadedModule};
#[cfg(feature = "testing")]
pub use resident::deferred_releases;
pub use resident::{resident_blocks, resident_started, resident_stopped};
pub use stream::{Event, Stream};

/// A CUDA driver status other than success, with the call that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverError {
    /// The raw status.
    pub(in crate::backend) code: sys::CUresult,
    /// The driver function that returned it.
    pub(in crate::backend) call: &'static str,
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
    pub(in crate::backend) fn not_found(call: &'static str) -> DriverError {
        DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND,
            call,
        }
    }

    /// "Not supported" (an operation a context refuses, e.g. inside a capture).
    pub(in crate::backend) fn not_supported(call: &'static str) -> DriverError {
        DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            call,
        }
    }

    /// The refusal of a module load while a resident kernel (a lane) runs in the
    /// current context under lazy module loading ([`LoadedModule::load_entries`]):
    /// the load would wait for that kernel, which only ends when the host stops it.
    pub(in crate::backend) fn module_load_refused_beside_a_lane() -> DriverError {
        DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_PERMITTED,
            call: MODULE_LOAD_REFUSED,
        }
    }

    /// Whether this is [`DriverError::module_load_refused_beside_a_lane`].
    pub(in crate::backend) fn is_module_load_refused_beside_a_lane(&self) -> bool {
        self.code == sys::CUresult::CUDA_ERROR_NOT_PERMITTED && self.call == MODULE_LOAD_REFUSED
    }

    /// A cooperative launch whose grid cannot be co-resident.
    pub(in crate::backend) fn is_cooperative_launch_too_large(&self) -> bool {
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

/// The call a refused module load names (no driver call was made).
const MODULE_LOAD_REFUSED: &str =
    "cuModuleLoadData (not called: lazy module loading would wait for a running lane)";

/// Driver result alias.
pub type DriverResult<T> = Result<T, DriverError>;

/// Driver calls made by the current thread, by kind: what tests count to prove
/// invariant 4 ("one synchronize per dispatch") on the real driver. One
/// thread-local increment per counted call (a few nanoseconds against the
/// microseconds of the call itself).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCallCounts {
    /// `cuStreamSynchronize` of a stream the backend made (the one-time wait of
    /// `copy_to_device_blocking` for its own copy is not counted).
    pub synchronizes: u64,
    /// `cuLaunchKernel` and `cuLaunchCooperativeKernel`.
    pub launches: u64,
    /// `cuGraphLaunch`.
    pub graph_launches: u64,
    /// Async copies, either direction.
    pub async_copies: u64,
    /// Async fills (`cuMemsetD8Async`, `cuMemsetD32Async`): zeroed outputs and
    /// grid-barrier resets.
    pub fills: u64,
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
            fills: self.fills - before.fills,
            stream_waits: self.stream_waits - before.stream_waits,
        }
    }
}

thread_local! {
    static CALLS: std::cell::Cell<DriverCallCounts> =
        const { std::cell::Cell::new(DriverCallCounts { synchronizes: 0, launches: 0, graph_launches: 0, async_copies: 0, fills: 0, stream_waits: 0 }) };
}

#[inline]
pub(super) fn count(bump: impl FnOnce(&mut DriverCallCounts)) {
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
pub(super) fn check(code: sys::CUresult, call: &'static str) -> DriverResult<()> {
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
    "cuMemcpyAsync",
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

/// Driver symbols only the mapped readback path needs. Checked on first use, so a
/// driver that lacks one still serves the copy path.
const MAPPED_SYMBOLS: &[&str] = &["cuMemHostGetDevicePointer_v2", "cuMemcpyHtoD_v2"];

/// Driver symbols only lanes (`backend::lane`) need. Checked when a lane is built,
/// so a driver that lacks one still serves every other path.
const LANE_SYMBOLS: &[&str] = &["cuStreamQuery", "cuEventSynchronize"];

/// Whether libcuda has `name` (for calls newer than the drivers we require, used
/// only where present). The answer for each name is cached by its caller.
pub(super) fn has_symbol(name: &'static str) -> bool {
    load_driver().is_ok() && check_symbols(&[name]).is_ok()
}

/// Checks the symbols lanes use (after the mapped symbols). Cached.
pub fn load_lane_symbols() -> Result<(), LoadError> {
    static LOADED: std::sync::OnceLock<Result<(), LoadError>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            load_mapped_symbols()?;
            check_symbols(LANE_SYMBOLS)
        })
        .clone()
}

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
