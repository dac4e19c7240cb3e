//! Streams and events.

use cudarc::driver::sys;

use super::{check, count, DriverResult};

/// A non-blocking stream. Destroyed on drop.
pub struct Stream {
    pub(in crate::backend) raw: sys::CUstream,
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

    /// Whether all work on the stream is done (`cuStreamQuery`): `Ok(true)` done,
    /// `Ok(false)` still running, `Err` when it failed (a kernel fault on it is
    /// reported here without waiting).
    pub fn query(&self) -> DriverResult<bool> {
        // SAFETY: live stream handle.
        let status = unsafe { sys::cuStreamQuery(self.raw) };
        if status == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(status, "cuStreamQuery").map(|()| true)
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

    /// Block the host until the event's last record has completed
    /// (`cuEventSynchronize`): how work outside the stream model (a lane) waits for a
    /// dispatch in flight.
    pub fn synchronize(&self) -> DriverResult<()> {
        // SAFETY: live event handle.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
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
