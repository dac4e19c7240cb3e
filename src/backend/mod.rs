//! The backends: the CUDA backend ([`CudaBackend`], one per device, shared by
//! threads), the reference interpreter as a backend ([`ReferenceBackend`]), and
//! [`AnyBackend`] over both; the one dispatch request ([`Dispatch`]) they all take,
//! and the one buffer model ([`DeviceBuffer`]) they all make.
//!
//! Why it looks the way it does: on the H200 the raw driver costs 3.7 µs per launch
//! issue and 11.8–12.4 µs for launch + one async readback + one synchronize, while a
//! well-known backend spent 44–110 µs per resident dispatch, growing with program
//! size. Everything here exists to stay near the raw floor and flat in program size:
//! - caches keyed by memoised digests, so a warm dispatch walks no program (`cache`);
//! - [`Kernel`] handles that skip even the cache lookups (`kernel`);
//! - pooled streams, events, pinned staging and transient buffers (`pool`);
//! - outputs read without a copy (the kernel's result ABI, `readback`) or with async
//!   copies, and one synchronize, never one blocking copy per output (16 blocking
//!   copies cost 107.5 µs against 36.8 µs async + one synchronize) (`dispatch`);
//! - raw driver calls through a prebuilt parameter array (`driver`).
//!
//! # Layout
//!
//! This file is the façade: the module list and what is public. Layers, bottom up:
//! - `driver` (one checked function per libcuda call, split by concern) is private;
//!   its `unsafe fn`s are called only from `stream_ops` (the one description of a
//!   dispatch's stream operations), `dispatch`, `readback`, `floor`, `graph` and
//!   `lane` (the server's launch), each with a `// SAFETY:` line; the public API is
//!   safe and names no driver type;
//! - `cuda` holds [`CudaBackend`] and the state its dispatches, buffers and graphs
//!   share; `request` the [`Dispatch`] request; `buffer` the owned buffers;
//!   `dispatch` the dispatch path and non-blocking submission; `graph` the CUDA
//!   graphs that capture the same stream operations; all of them are one privacy
//!   boundary: their shared internals are `pub(in crate::backend)`, invisible to the
//!   rest of the crate;
//! - `lane` holds [`Lane`], a resident server kernel serving the same [`Dispatch`]
//!   requests through host-mapped memory, below the launch floor;
//! - `reference_backend` answers the same requests on the CPU interpreter with the
//!   same checks and errors;
//! - `any` holds [`AnyBackend`], above both: nothing below it knows it exists.
//!
//! The raw driver layer cannot be reached from outside the crate:
//!
//! ```compile_fail
//! use vyre_cuda::backend::driver::Stream;
//! ```
//!
//! ```compile_fail
//! use vyre_cuda::backend::driver::PrimaryContext;
//! ```

mod any;
pub mod budget;
mod buffer;
mod cache;
pub mod caps;
mod cuda;
mod dispatch;
mod driver;
mod error;
#[cfg(feature = "testing")]
pub mod floor;
pub mod graph;
pub mod host_cache;
mod kernel;
mod lane;
mod ordering;
mod outputs;
mod plan;
mod pool;
pub mod readback;
mod reference_backend;
mod request;
mod stream_ops;

pub use any::{AnyBackend, AnyGraph, AnyLane, AnyPendingReplay, AnyRecorder, BackendKind};
pub use buffer::{DeviceBuffer, MappedView, PinnedBuffer};
pub use cache::{CacheStats, HitMiss, ModuleKey, PtxKey};
pub use caps::{DeviceCaps, LaunchPlan, PipelineFeatures};
pub use cuda::{CudaBackend, MemoryBudget, PoolStats};
pub use dispatch::{DeviceClock, DeviceSpans, PendingDispatch, MAX_PENDING};
pub use driver::DriverError;
pub use error::BackendError;
pub use kernel::{Kernel, MAX_BATCH_PROGRAMS};
pub use lane::{
    Lane, LaneOptions, WaitMode, DEFAULT_LANE_CANDIDATES, DEFAULT_LANE_POLLER_WARPS,
    MAX_LANE_AREA_BYTES, MAX_LANE_BLOCKS, MAX_LANE_CANDIDATES, MAX_LANE_KERNELS,
    MAX_LANE_POLLER_WARPS, MAX_LANE_POLL_SLEEP, MAX_LANE_SLOTS,
};
pub use outputs::{Items, Outputs, INLINE_ITEMS};
pub use reference_backend::ReferenceBackend;
pub use request::{Binding, Dispatch, Finished, LaneStamps, ScalarValues, Timing, Timings};

use cuda::{device_of_backend, BackendInner};
use plan::{ParameterArray, PerBinding};

/// Driver calls made by the current thread so far (test support: how tests prove
/// "one synchronize per dispatch" on the real driver).
#[cfg(feature = "testing")]
pub fn thread_driver_calls() -> DriverCallCounts {
    driver::thread_call_counts()
}

#[cfg(feature = "testing")]
pub use driver::DriverCallCounts;

#[cfg(test)]
mod tests {
    use super::graph::{DispatchGraph, InputSlot, StepId, StitchBuilder, StitchedGraph};
    use super::*;

    /// Locks out backend values that cannot cross threads: a pipelined encoder submits
    /// on one thread and waits on another, shares buffers between threads (they are
    /// `Sync` too) and moves graphs to a replay thread.
    #[test]
    fn backend_values_cross_threads() {
        fn assert_send<T: Send>() {}
        fn assert_sync<T: Sync>() {}
        assert_send::<AnyBackend>();
        assert_send::<Kernel>();
        assert_send::<PendingDispatch>();
        assert_send::<DeviceClock>();
        assert_send::<DeviceBuffer>();
        assert_sync::<DeviceBuffer>();
        assert_send::<PinnedBuffer>();
        assert_sync::<PinnedBuffer>();
        assert_send::<AnyGraph>();
        assert_send::<DispatchGraph>();
        assert_send::<InputSlot>();
        assert_send::<StepId>();
        assert_send::<StitchedGraph>();
        assert_send::<StitchBuilder>();
        assert_send::<Lane>();
        assert_sync::<Lane>();
        assert_send::<AnyLane>();
        assert_sync::<AnyLane>();
    }
}
