//! The CUDA backend (§4): one [`CudaBackend`] per device, shared by threads.
//!
//! Why it looks the way it does: §0 measured the raw driver at 3.7 µs per launch
//! issue and 11.8–12.4 µs for launch + one async readback + one synchronize, while a
//! well-known backend spent 44–110 µs per resident dispatch, growing with program
//! size. Everything here exists to stay near the raw floor and flat in program size:
//! - caches keyed by memoised digests, so a warm dispatch walks no program (`cache`);
//! - [`Kernel`] handles that skip even the cache lookups (`kernel`);
//! - pooled streams, events, pinned staging and transient buffers (`pool`);
//! - outputs read with async copies and one synchronize, never one blocking copy per
//!   output (§0: 16 blocking copies 107.5 µs vs 36.8 µs async + one sync) (`dispatch`);
//! - raw driver calls through a prebuilt parameter array (`driver`).
//!
//! Layering: `driver` is the only module that calls libcuda, and it is private
//! to the crate; its `unsafe fn`s are called only from `stream_ops` (the one
//! description of a dispatch's stream operations), `dispatch`, `floor` and
//! `crate::graph`, each with a `// SAFETY:` line; the public API is safe and names
//! no raw driver type. Owned buffers and non-blocking submission are in
//! [`DeviceBuffer`] and [`PendingDispatch`]; one interface over this backend and
//! the reference interpreter is [`AnyBackend`].
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
pub(crate) mod driver;
mod error;
#[cfg(feature = "testing")]
pub mod floor;
pub mod graph;
mod kernel;
mod ordering;
mod outputs;
mod plan;
mod pool;
pub mod readback;
mod reference_backend;
mod request;
pub(crate) mod stream_ops;

pub use any::{AnyBackend, AnyGraph, AnyPendingReplay, AnyRecorder, BackendKind};
pub use buffer::{DeviceBuffer, PinnedBuffer};
pub use cache::{CacheStats, HitMiss, ModuleKey, PtxKey};
pub use caps::{DeviceCaps, LaunchPlan, PipelineFeatures};
pub use cuda::{CudaBackend, MemoryBudget, PoolStats};
pub use dispatch::{DeviceClock, DeviceSpans, PendingDispatch, MAX_PENDING};
pub use driver::DriverError;
pub use error::BackendError;
pub use kernel::{Kernel, MAX_BATCH_PROGRAMS};
pub use outputs::{Items, Outputs, INLINE_ITEMS};
pub use reference_backend::ReferenceBackend;
pub use request::{Binding, Dispatch, Finished, Timing, Timings};

pub(crate) use cuda::{device_of_backend, BackendInner};
pub(crate) use plan::{ParameterArray, PerBinding};

/// Driver calls made by the current thread so far (test support: how tests prove
/// "one synchronize per dispatch" on the real driver).
#[cfg(feature = "testing")]
pub fn thread_driver_calls() -> DriverCallCounts {
    driver::thread_call_counts()
}

#[cfg(feature = "testing")]
pub use driver::DriverCallCounts;
