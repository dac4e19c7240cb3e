//! Pools: streams with their timing events and pinned staging ("lanes"),
//! and transient device buffers in power-of-two buckets.
//!
//! Creating a stream, an event or pinned memory costs driver time far above the
//! launch floor (3.7 µs on the H200), so once a dispatch shape is warm nothing on its path
//! allocates from the driver: a dispatch leases one lane (stream + 4 events +
//! staging) for its whole life, and host, zeroed and pinned bindings take device buffers from the
//! bucket of their rounded size.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::budget::bucket_bytes;
use std::sync::Arc;

use super::driver::{DeviceMemory, DriverResult, Event, PinnedMemory, Stream};

/// Everything one dispatch needs on the host side of the stream.
pub(in crate::backend) struct Lane {
    pub(in crate::backend) stream: Arc<Stream>,
    /// Outer window: before the first enqueued operation / after the last.
    pub(in crate::backend) outer_start: Event,
    pub(in crate::backend) outer_end: Event,
    /// Kernel window: around the launch loop only.
    pub(in crate::backend) inner_start: Event,
    pub(in crate::backend) inner_end: Event,
    /// Recorded after the dispatch's operations when a later submission must run
    /// after it on the device (`Dispatch::after`); never timed.
    pub(in crate::backend) order: Arc<Event>,
    /// Page-locked staging for uploads and readback.
    pub(in crate::backend) staging: PinnedMemory,
    /// Host-mapped result area and control block (`readback`), made on first use.
    pub(in crate::backend) results: Option<super::readback::ResultArea>,
}

const INITIAL_STAGING_BYTES: usize = 64 * 1024;

impl Lane {
    fn new() -> DriverResult<Lane> {
        Ok(Lane {
            stream: Arc::new(Stream::new()?),
            outer_start: Event::new()?,
            outer_end: Event::new()?,
            inner_start: Event::new()?,
            inner_end: Event::new()?,
            order: Arc::new(Event::for_ordering()?),
            staging: PinnedMemory::allocate(INITIAL_STAGING_BYTES)?,
            results: None,
        })
    }

    /// Grow staging to hold at least `bytes` (rounded to a power of two). Returns
    /// whether the driver was asked for memory.
    pub(in crate::backend) fn ensure_staging(&mut self, bytes: usize) -> DriverResult<bool> {
        if self.staging.len() >= bytes {
            return Ok(false);
        }
        let size = bytes
            .checked_next_power_of_two()
            .unwrap_or(bytes)
            .max(INITIAL_STAGING_BYTES);
        self.staging = PinnedMemory::allocate(size)?;
        Ok(true)
    }
}

/// Idle lanes, shared by every thread of a backend.
pub(in crate::backend) struct LanePool {
    idle: Mutex<Vec<Lane>>,
    created: AtomicU64,
}

impl LanePool {
    pub(in crate::backend) fn new() -> Self {
        LanePool {
            idle: Mutex::new(Vec::with_capacity(super::MAX_PENDING)),
            created: AtomicU64::new(0),
        }
    }

    /// Take an idle lane or create one (the caller has the context bound).
    pub(in crate::backend) fn lease(&self) -> DriverResult<Lane> {
        if let Some(lane) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(lane);
        }
        self.created.fetch_add(1, Ordering::Relaxed);
        Lane::new()
    }

    /// Return a lane whose stream has no pending work.
    pub(in crate::backend) fn give_back(&self, lane: Lane) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(lane);
    }

    /// Lanes created so far (each is a stream, four events and staging).
    pub(in crate::backend) fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Drop every idle lane (or leak them when the context was reset under them).
    pub(in crate::backend) fn clear(&self, leak: bool) {
        let lanes = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        if leak {
            std::mem::forget(lanes);
        }
    }
}

/// Transient device buffers for host, zeroed and pinned bindings, by bucket size.
pub(in crate::backend) struct TransientPool {
    buckets: Mutex<HashMap<u64, Vec<DeviceMemory>>>,
    pooled_bytes: AtomicU64,
    driver_allocations: AtomicU64,
}

impl TransientPool {
    pub(in crate::backend) fn new() -> Self {
        TransientPool {
            buckets: Mutex::new(HashMap::new()),
            pooled_bytes: AtomicU64::new(0),
            driver_allocations: AtomicU64::new(0),
        }
    }

    /// Bytes held idle in the pool.
    pub(in crate::backend) fn pooled_bytes(&self) -> u64 {
        self.pooled_bytes.load(Ordering::Relaxed)
    }

    /// Driver allocations made by the pool so far.
    pub(in crate::backend) fn driver_allocations(&self) -> u64 {
        self.driver_allocations.load(Ordering::Relaxed)
    }

    /// Bytes of `requests` that the idle pool cannot serve (what a dispatch would
    /// newly allocate). Pure lookup; takes nothing.
    pub(in crate::backend) fn missing_bytes(&self, requests: &[u64]) -> Option<u64> {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut wanted: smallvec::SmallVec<[(u64, usize); 16]> = smallvec::SmallVec::new();
        let mut missing: u128 = 0;
        for &r in requests {
            let bucket = bucket_bytes(r)?;
            let used = match wanted.iter_mut().find(|(b, _)| *b == bucket) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    wanted.push((bucket, 1));
                    1
                }
            };
            let idle = buckets.get(&bucket).map_or(0, |v| v.len());
            if used > idle {
                missing += bucket as u128;
            }
        }
        u64::try_from(missing).ok()
    }

    /// A buffer of at least `bytes` (its bucket size), from the pool or the driver.
    pub(in crate::backend) fn take(&self, bytes: u64) -> DriverResult<DeviceMemory> {
        let bucket = bucket_bytes(bytes).unwrap_or(u64::MAX);
        if let Some(memory) = self
            .buckets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&bucket)
            .and_then(|v| v.pop())
        {
            self.pooled_bytes.fetch_sub(bucket, Ordering::Relaxed);
            return Ok(memory);
        }
        self.driver_allocations.fetch_add(1, Ordering::Relaxed);
        DeviceMemory::allocate(bucket)
    }

    /// Return a buffer taken with `take`.
    pub(in crate::backend) fn put(&self, memory: DeviceMemory) {
        let bucket = memory.size();
        self.pooled_bytes.fetch_add(bucket, Ordering::Relaxed);
        self.buckets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(bucket)
            .or_default()
            .push(memory);
    }

    /// Free every idle buffer (memory pressure), or leak them after a context reset.
    pub(in crate::backend) fn drain(&self, leak: bool) {
        let drained = std::mem::take(&mut *self.buckets.lock().unwrap_or_else(|p| p.into_inner()));
        self.pooled_bytes.store(0, Ordering::Relaxed);
        if leak {
            std::mem::forget(drained);
        }
    }
}
