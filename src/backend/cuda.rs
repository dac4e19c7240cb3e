//! `CudaBackend`: one per device, shared by threads. Acquiring a device (and
//! resetting it after a sticky fault), the shared state every dispatch, buffer and
//! graph of the backend reads, and its counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::ir::Limits;
use crate::lower::LoweringCaps;

use super::budget;
use super::cache::{self, CacheStats, CountedCache, ModuleKey, PtxKey, ValidationCache};
use super::caps::{self, DeviceCaps, PipelineFeatures};
use super::driver::{self, Device, PrimaryContext};
use super::kernel::KernelInner;
use super::ordering;
use super::pool::{LanePool, TransientPool};
use super::BackendError;

/// Most device ordinals tracked for context-loss epochs.
const MAX_DEVICES: usize = 64;

/// Per device: bumped when a sticky fault destroys the primary context, so every
/// backend on that device sees (with one relaxed load per call) that its handles died.
static DEVICE_EPOCH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Per device: the epoch whose context has been reset already.
static DEVICE_RESET_EPOCH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Serialises acquire/reset per process.
static ACQUIRE_LOCK: Mutex<()> = Mutex::new(());
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// Low bits of a backend id that hold its device ordinal (`MAX_DEVICES` ≤ 2^8), so
/// a kernel (which carries only its backend's id) names its device too: a
/// recording can refuse another device's kernel with a message that says so
/// (`graph::stitch`), without a registry or a lock.
const DEVICE_BITS: u32 = 8;
const _: () = assert!(MAX_DEVICES <= 1 << DEVICE_BITS);

/// A fresh backend id for device `ordinal`: a serial number, then the ordinal.
fn next_backend_id(ordinal: usize) -> u64 {
    NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed) << DEVICE_BITS | ordinal as u64
}

/// The device ordinal of the backend with id `id`.
pub(in crate::backend) fn device_of_backend(id: u64) -> usize {
    (id & ((1 << DEVICE_BITS) - 1)) as usize
}

/// Counts of pooled resources, for tests that prove a warm path allocates nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Dispatch lanes (stream + events + pinned staging) ever created.
    pub lanes_created: u64,
    /// Pinned staging buffers (re)allocated.
    pub staging_allocations: u64,
    /// Transient device buffers allocated from the driver.
    pub transient_allocations: u64,
    /// Bytes idle in the transient pool.
    pub pooled_bytes: u64,
    /// Bytes held by live [`DeviceBuffer`](super::DeviceBuffer)s in device memory.
    pub buffer_bytes: u64,
    /// Live [`DeviceBuffer`](super::DeviceBuffer)s in device memory.
    pub live_buffers: u64,
}

/// The memory budget at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryBudget {
    /// What it was computed from.
    pub inputs: budget::BudgetInputs,
    /// Bytes a new dispatch or allocation may take.
    pub available: u64,
}

/// A CUDA device, ready to compile and dispatch programs. Cheap to clone (an
/// `Arc`); `Send + Sync`: threads may dispatch through one backend concurrently,
/// each dispatch on its own pooled stream.
#[derive(Clone)]
pub struct CudaBackend {
    pub(super) inner: Arc<BackendInner>,
}

pub(in crate::backend) struct BackendInner {
    pub(in crate::backend) id: u64,
    pub(in crate::backend) caps: DeviceCaps,
    pub(in crate::backend) limits: Limits,
    pub(in crate::backend) lowering: LoweringCaps,
    pub(in crate::backend) features: PipelineFeatures,
    pub(in crate::backend) epoch: u64,
    pub(in crate::backend) validation: ValidationCache,
    pub(in crate::backend) ptx: CountedCache<PtxKey, Arc<str>>,
    pub(in crate::backend) kernels: CountedCache<ModuleKey, Arc<KernelInner>>,
    pub(in crate::backend) plan_counter: cache::Counter,
    pub(in crate::backend) lanes: LanePool,
    pub(in crate::backend) transients: TransientPool,
    pub(in crate::backend) staging_allocations: AtomicU64,
    pub(in crate::backend) lost: Mutex<Option<String>>,
    /// Bytes held by live [`DeviceBuffer`](super::DeviceBuffer)s in device memory.
    pub(in crate::backend) owned_bytes: AtomicU64,
    /// Live [`DeviceBuffer`](super::DeviceBuffer)s in device memory.
    pub(in crate::backend) owned_buffers: AtomicU64,
    /// Submissions pending ([`PendingDispatch`](super::PendingDispatch)), at most
    /// [`MAX_PENDING`](super::MAX_PENDING).
    pub(in crate::backend) pending: std::sync::atomic::AtomicUsize,
    /// Dispatches in flight and the shared memory each touches (`ordering`).
    pub(in crate::backend) in_flight: ordering::OrderBook,
    // Declared last: dropped after every handle above was released in its context.
    pub(in crate::backend) context: PrimaryContext,
}

impl CudaBackend {
    /// The backend of device 0.
    pub fn acquire() -> Result<CudaBackend, BackendError> {
        Self::acquire_device(0)
    }

    /// The backend of device `ordinal`. Loads libcuda at run time: on a machine
    /// without a driver this is an `Err` (never a panic), so callers can fall back
    /// to [`crate::reference`]. If an earlier kernel fault destroyed the device's
    /// context, this resets it first.
    pub fn acquire_device(ordinal: usize) -> Result<CudaBackend, BackendError> {
        let count = Self::device_count()?;
        if ordinal >= count || ordinal >= MAX_DEVICES {
            return Err(BackendError::NoDevice {
                ordinal,
                available: count,
            });
        }
        let _guard = ACQUIRE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let device = Device::get(ordinal as i32)
            .map_err(|e| BackendError::driver("opening the device", e))?;
        let epoch = DEVICE_EPOCH[ordinal].load(Ordering::Acquire);
        let recovering = DEVICE_RESET_EPOCH[ordinal].load(Ordering::Acquire) != epoch;
        // After a sticky fault the driver may refuse every call in this process
        // (CUDA documents that such errors need a process restart); say so plainly.
        let unrecoverable =
            |error: driver::DriverError| BackendError::DeviceUnrecoverable { ordinal, error };
        if recovering {
            PrimaryContext::reset_device(device).map_err(unrecoverable)?;
            tracing::warn!(ordinal, "reset the primary context after a kernel fault");
        }
        let context = PrimaryContext::retain(device).map_err(|e| {
            if recovering || e.is_sticky() {
                unrecoverable(e)
            } else {
                BackendError::driver("retaining the primary context", e)
            }
        })?;
        context
            .bind()
            .and_then(|_| driver::memory_info())
            .map_err(|e| {
                if recovering || e.is_sticky() {
                    unrecoverable(e)
                } else {
                    BackendError::driver("binding the primary context", e)
                }
            })?;
        if recovering {
            DEVICE_RESET_EPOCH[ordinal].store(epoch, Ordering::Release);
        }
        let caps = caps::read_caps(ordinal, device)
            .map_err(|e| BackendError::driver("reading device attributes", e))?;
        tracing::info!(name = %caps.name, sm = caps.ptx_target_sm(), "acquired CUDA device");
        Ok(CudaBackend {
            inner: Arc::new(BackendInner {
                id: next_backend_id(ordinal),
                limits: caps.limits(),
                lowering: caps.lowering_caps(),
                features: caps.pipeline_features(),
                caps,
                epoch,
                validation: CountedCache::new(),
                ptx: CountedCache::new(),
                kernels: CountedCache::new(),
                plan_counter: cache::Counter::default(),
                lanes: LanePool::new(),
                transients: TransientPool::new(),
                staging_allocations: AtomicU64::new(0),
                lost: Mutex::new(None),
                owned_bytes: AtomicU64::new(0),
                owned_buffers: AtomicU64::new(0),
                pending: std::sync::atomic::AtomicUsize::new(0),
                in_flight: ordering::OrderBook::default(),
                context,
            }),
        })
    }

    /// Number of CUDA devices on this host (loads and initialises the driver; no
    /// driver is an `Err`, never a panic). One backend per device: [`CudaBackend::acquire_device`]
    /// with each ordinal below this count; stitch their recorded graphs with
    /// [`crate::graph::StitchBuilder`].
    pub fn device_count() -> Result<usize, BackendError> {
        driver::load_driver().map_err(|e| BackendError::NoDriver {
            detail: match e {
                driver::LoadError::LibraryMissing => "libcuda.so could not be opened".into(),
                driver::LoadError::SymbolMissing(s) => {
                    format!("libcuda.so lacks {s}; the driver is too old (need CUDA 12.0+)")
                }
            },
        })?;
        driver::init().map_err(|e| BackendError::NoDriver {
            detail: e.to_string(),
        })?;
        let count =
            driver::device_count().map_err(|e| BackendError::driver("counting devices", e))?;
        Ok(count.max(0) as usize)
    }

    /// The ordinal of this backend's device.
    pub fn ordinal(&self) -> usize {
        self.inner.caps.ordinal
    }

    /// What the device offers.
    pub fn caps(&self) -> &DeviceCaps {
        &self.inner.caps
    }

    /// Hit/miss counters of every cache.
    pub fn cache_stats(&self) -> CacheStats {
        let inner = &self.inner;
        CacheStats {
            validation: inner.validation.counter.read(),
            ptx: inner.ptx.counter.read(),
            module: inner.kernels.counter.read(),
            plan: inner.plan_counter.read(),
            ptx_entries: inner.ptx.len(),
            module_entries: inner.kernels.len(),
        }
    }

    /// Counts of pooled resources and of the bytes buffers hold.
    pub fn pool_stats(&self) -> PoolStats {
        let inner = &self.inner;
        PoolStats {
            lanes_created: inner.lanes.created(),
            staging_allocations: inner.staging_allocations.load(Ordering::Relaxed),
            transient_allocations: inner.transients.driver_allocations(),
            pooled_bytes: inner.transients.pooled_bytes(),
            buffer_bytes: inner.held_bytes(),
            live_buffers: inner.owned_buffers.load(Ordering::Relaxed),
        }
    }

    /// The memory budget a new allocation is checked against now; asks the driver
    /// for live free memory.
    pub fn memory_budget(&self) -> Result<MemoryBudget, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let (live_free, _) =
            driver::memory_info().map_err(|e| BackendError::driver("querying free memory", e))?;
        let inputs = budget::BudgetInputs {
            total: inner.caps.total_memory,
            resident: inner.held_bytes(),
            pooled: inner.transients.pooled_bytes(),
            live_free,
        };
        Ok(MemoryBudget {
            inputs,
            available: budget::available_bytes(&inputs),
        })
    }

    /// Bytes held by live [`DeviceBuffer`](super::DeviceBuffer)s in device memory.
    pub fn buffer_bytes(&self) -> u64 {
        self.inner.held_bytes()
    }

    /// Free every idle transient buffer (they are re-allocated on demand).
    pub fn trim_pools(&self) {
        if self.inner.check_alive().is_ok() && self.inner.context.bind().is_ok() {
            self.inner.transients.drain(false);
        }
    }

    /// Whether the backend's context is still usable (no sticky kernel fault).
    pub fn is_usable(&self) -> bool {
        self.inner.check_alive().is_ok()
    }

    /// The shared state (for `graph`).
    pub(super) fn shared(&self) -> &Arc<BackendInner> {
        &self.inner
    }
}

impl BackendInner {
    /// One relaxed load on the happy path.
    #[inline]
    pub(in crate::backend) fn check_alive(&self) -> Result<(), BackendError> {
        let current = DEVICE_EPOCH[self.caps.ordinal].load(Ordering::Relaxed);
        if current == self.epoch {
            return Ok(());
        }
        let cause = self
            .lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "a kernel fault on this device, through another backend".into());
        Err(BackendError::ContextLost { cause })
    }

    /// Record a sticky fault: every backend of this device is now stale.
    pub(in crate::backend) fn mark_context_lost(&self, cause: String) {
        *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(cause);
        let _ = DEVICE_EPOCH[self.caps.ordinal].compare_exchange(
            self.epoch,
            self.epoch + 1,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Bytes held by owned buffers in device memory (the budget's "resident" input).
    pub(in crate::backend) fn held_bytes(&self) -> u64 {
        self.owned_bytes.load(Ordering::Relaxed)
    }

    pub(in crate::backend) fn bind(&self) -> Result<(), BackendError> {
        self.context
            .bind()
            .map_err(|e| BackendError::driver("binding the CUDA context to this thread", e))
    }
}

impl Drop for BackendInner {
    fn drop(&mut self) {
        // Handles die with a reset context: freeing them then would be invalid, so
        // after a fault they are forgotten instead (the reset already released them).
        let leak = self.check_alive().is_err() || self.context.bind().is_err();
        self.kernels.clear(leak);
        self.lanes.clear(leak);
        self.transients.drain(leak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a backend id that loses its device (a recording could then not tell
    /// another device's kernel from a foreign backend's of the same device, and its
    /// refusal would point the wrong way) or that repeats: every ordinal
    /// below `MAX_DEVICES` comes back out, and ids stay distinct.
    #[test]
    fn backend_ids_carry_their_device() {
        let ids: Vec<u64> = (0..MAX_DEVICES).map(next_backend_id).collect();
        for (ordinal, &id) in ids.iter().enumerate() {
            assert_eq!(device_of_backend(id), ordinal, "id {id:#x}");
        }
        let again = next_backend_id(0);
        assert!(!ids.contains(&again));
        assert_eq!(device_of_backend(again), 0);
    }
}
