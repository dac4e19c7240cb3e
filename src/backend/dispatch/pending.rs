//! Non-blocking submission: [`CudaBackend::submit`] enqueues a request on its own
//! lane and returns a [`PendingDispatch`]; `wait` does the one synchronize.
//!
//! # Why
//!
//! While batch N computes, the host stages and enqueues batch N+1 on another lane:
//! its upload runs on the copy engine beside N's kernel (two submissions in flight
//! gave 1.64 × the blocking loop's throughput on the H200, 2026-12-01). `wait`
//! consumes the pending result, so waiting twice does not compile; dropping one
//! without waiting synchronises its lane first (a documented blocking wait) and only
//! then reuses its staging.
//!
//! At most [`MAX_PENDING`] submissions may be pending per backend (the reference
//! interpreter's backend counts the same way); one more is an `Err` starting `Fix:`
//! (wait for an earlier one first), never an unbounded pile of streams. Grid-sync
//! kernels complete inside `submit` (their barrier counter is module-global and
//! leased until the synchronize), so their pending result is already done.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::super::driver::{Event, Stream};
use super::super::kernel::KernelInner;
use super::super::lane::{LaneShared, LaneTicket};
use super::super::reference_backend::ReferenceInner;
use super::super::{BackendError, BackendInner, CudaBackend, Dispatch, Finished, Kernel, Outputs};
use super::{foreign_kernel, Bookkeeping, InFlight, Sink, Submitted};

/// Most submissions pending at once on one backend (each holds a lane on CUDA:
/// a stream, five events and 64 KiB of pinned staging until an upload needs
/// more). 32: a chain of dependent steps holds one pending submission per step
/// (each wait hands over that step's timings), so the tokenizer's chunks of
/// seven steps fit four on a backend at once, enough that the device always
/// has the next chunk queued while the host stages one and hands out another;
/// 32 idle lanes cost about 2 MiB of pinned memory.
pub const MAX_PENDING: usize = 32;

/// A dispatch submitted by a backend's `submit` and not yet waited for. `Send`: it
/// may be waited for on another thread.
///
/// On CUDA each pending dispatch holds its own lane (stream, events, pinned
/// staging), so while batch N computes the host can stage and enqueue batch N+1,
/// whose upload runs on the copy engine beside N's kernel. [`PendingDispatch::wait`]
/// consumes the value: waiting twice does not compile. Dropping it without waiting
/// blocks until the dispatch is done, and only then are its staging and buffers
/// reused. At most [`MAX_PENDING`] may be pending per backend; one more is an `Err`
/// starting `Fix:`. A pending dispatch holds its backend (and every buffer it binds)
/// alive, so dropping the backend or a buffer meanwhile is safe. Submissions print
/// no probe line. On the reference interpreter the dispatch ran at submission and
/// `wait` hands its result over.
#[must_use = "a pending dispatch does nothing visible until `wait`; dropping it blocks until it finishes"]
pub struct PendingDispatch {
    kernel: Kernel,
    pub(in crate::backend) state: PendingState,
    pub(in crate::backend) origin: PendingOrigin,
}

// The in-flight variant is a few hundred bytes inline (the lane and the clock),
// moved once when `submit` returns: cheaper than a second allocation per submission.
#[allow(clippy::large_enum_variant)]
pub(in crate::backend) enum PendingState {
    /// Enqueued: the dispatch in flight and its bookkeeping (the submission's one
    /// allocation, filled in place).
    InFlight(InFlight<'static>, Box<Bookkeeping>),
    /// A lane request rung and not yet delivered.
    Lane(Box<LaneTicket>),
    /// Completed at submission (grid-sync kernels, the reference interpreter).
    Done(Box<Result<Finished, BackendError>>),
    /// Waited for or dropped.
    Finished,
}

/// The backend a pending dispatch counts against.
pub(in crate::backend) enum PendingOrigin {
    Cuda(CudaBackend),
    Reference(Arc<ReferenceInner>),
    /// A lane (its slots bound its pending requests).
    Lane(Arc<LaneShared>),
}

impl PendingOrigin {
    fn pending(&self) -> &std::sync::atomic::AtomicUsize {
        match self {
            PendingOrigin::Cuda(backend) => &backend.inner.pending,
            PendingOrigin::Reference(inner) => &inner.pending,
            PendingOrigin::Lane(lane) => &lane.pending,
        }
    }
}

impl std::fmt::Debug for PendingDispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingDispatch")
            .field("program", &self.kernel.name())
            .finish()
    }
}

/// Device instants of one timed dispatch, in nanoseconds after a [`DeviceClock`]
/// origin: comparable across dispatches on different lanes (the overlap of an
/// upload with another dispatch's kernel is visible here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpans {
    /// The dispatch's first stream operation (its uploads and clears start here).
    pub window_start_ns: u64,
    /// Its launch loop starts (uploads are done).
    pub kernel_start_ns: u64,
    /// Its launch loop ends.
    pub kernel_end_ns: u64,
    /// Its last stream operation ends.
    pub window_end_ns: u64,
}

/// An origin on the device's clock: one event recorded and completed, against
/// which [`PendingDispatch::wait_spans`] measures a dispatch's instants.
pub struct DeviceClock {
    event: Event,
    // Last: the context outlives the event.
    backend: CudaBackend,
}

impl Drop for DeviceClock {
    fn drop(&mut self) {
        // The event is destroyed right after this, in the backend's context.
        let _ = self.backend.inner.bind();
    }
}

impl std::fmt::Debug for DeviceClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceClock").finish()
    }
}

/// Count one more pending submission against `counter`: the `Fix:` error (and no
/// count) when [`MAX_PENDING`] are pending already. Shared by every backend.
pub(in crate::backend) fn count_pending(
    counter: &std::sync::atomic::AtomicUsize,
    name: &str,
) -> Result<(), BackendError> {
    let pending = counter.fetch_add(1, Ordering::AcqRel);
    if pending >= MAX_PENDING {
        counter.fetch_sub(1, Ordering::AcqRel);
        return Err(BackendError::bad_input(format!(
            "Fix: {MAX_PENDING} dispatches are already pending on this backend; wait for an earlier \
             PendingDispatch before submitting {name}"
        )));
    }
    Ok(())
}

/// The `Fix:` error for a predecessor submitted on another backend.
pub(in crate::backend) fn foreign_predecessor(name: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: the PendingDispatch to order {name} after belongs to another backend; submit both on \
         the same backend"
    ))
}

/// The dispatch in flight `request` must run after on the device: its `after`,
/// checked to come from this backend (`None` when it already completed).
pub(in crate::backend) fn predecessor<'r>(
    inner: &BackendInner,
    request: &Dispatch<'r>,
    kernel: &KernelInner,
) -> Result<Option<&'r InFlight<'static>>, BackendError> {
    let Some(previous) = request.after else {
        return Ok(None);
    };
    match (&previous.origin, &previous.state) {
        (PendingOrigin::Cuda(backend), state) if backend.inner.id == inner.id => match state {
            PendingState::InFlight(in_flight, _) => Ok(Some(in_flight)),
            // Completed at its submission: nothing to wait for.
            PendingState::Done(_) | PendingState::Lane(_) => Ok(None),
            PendingState::Finished => Err(BackendError::internal(
                "ordering after a pending dispatch that was already finished",
            )),
        },
        // A lane's kernel never ends: a dispatch after one of its requests waits for
        // it on the host, before anything is enqueued.
        (PendingOrigin::Lane(lane), PendingState::Lane(ticket))
            if lane.backend_id() == inner.id =>
        {
            lane.wait_for(ticket.ticket, &kernel.name)?;
            Ok(None)
        }
        (PendingOrigin::Lane(lane), _) if lane.backend_id() == inner.id => Ok(None),
        _ => Err(foreign_predecessor(&kernel.name)),
    }
}

impl CudaBackend {
    /// Enqueue `request` and return at once (see [`PendingDispatch`]): host bindings
    /// are copied into the lane's pinned staging before this returns, so the slices
    /// may be reused immediately. [`PendingDispatch::wait`] gives what
    /// [`CudaBackend::run`] would have returned.
    pub fn submit(&self, request: Dispatch<'_>) -> Result<PendingDispatch, BackendError> {
        let start = Instant::now();
        let (kernel, _) = self.inner.resolve(request.target, &request.codegen, None)?;
        let inner = self.inner.cuda_kernel(&kernel)?;
        let after = predecessor(&self.inner, &request, inner)?;
        count_pending(&self.inner.pending, &inner.name)?;
        let mut outputs = Outputs::default();
        let mut books: Box<Bookkeeping> = Box::default();
        let submitted = self.inner.submit_request(
            inner,
            &request,
            (&Sink::Packed(&mut outputs), &mut books, &[]),
            (start, None),
            false,
            after,
        );
        let state = match submitted {
            Err(e) => {
                self.inner.pending.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
            Ok(Submitted {
                in_flight,
                lease: Some(lease),
                mark,
            }) => {
                // Grid sync: the barrier lease cannot outlive this call, so wait now.
                let done = self
                    .inner
                    .complete(
                        inner,
                        in_flight,
                        &mut books,
                        Sink::Packed(&mut outputs),
                        mark,
                        None,
                    )
                    .map(|timings| {
                        outputs.name_by(kernel.clone());
                        Finished { outputs, timings }
                    });
                drop(lease);
                PendingState::Done(Box::new(done))
            }
            Ok(Submitted { in_flight, .. }) => PendingState::InFlight(in_flight, books),
        };
        Ok(PendingDispatch {
            kernel: kernel.clone(),
            state,
            origin: PendingOrigin::Cuda(self.clone()),
        })
    }

    /// Record an origin event on the device's clock and wait for it.
    pub fn device_clock(&self) -> Result<DeviceClock, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let event = Event::new().map_err(|e| BackendError::driver("creating a clock event", e))?;
        let stream =
            Stream::new().map_err(|e| BackendError::driver("creating a clock stream", e))?;
        event
            .record(&stream)
            .map_err(|e| BackendError::driver("recording a clock event", e))?;
        inner.synchronize_with("the device clock origin", || stream.synchronize())?;
        Ok(DeviceClock {
            event,
            backend: self.clone(),
        })
    }
}

impl PendingDispatch {
    /// A dispatch that completed at submission (the reference interpreter's).
    pub(in crate::backend) fn done(
        kernel: Kernel,
        result: Result<Finished, BackendError>,
        origin: PendingOrigin,
    ) -> PendingDispatch {
        PendingDispatch {
            kernel,
            state: PendingState::Done(Box::new(result)),
            origin,
        }
    }

    /// A lane request in flight ([`Lane::submit`](super::super::Lane::submit)).
    pub(in crate::backend) fn lane(kernel: Kernel, ticket: LaneTicket) -> PendingDispatch {
        let origin = PendingOrigin::Lane(Arc::clone(&ticket.lane));
        PendingDispatch {
            kernel,
            state: PendingState::Lane(Box::new(ticket)),
            origin,
        }
    }

    /// Wait for the dispatch: the one synchronize, then its outputs (per its
    /// readback policy) and timings.
    pub fn wait(mut self) -> Result<Finished, BackendError> {
        self.finish(None).map(|(finished, _)| finished)
    }

    /// [`PendingDispatch::wait`], also returning the dispatch's device instants
    /// after `clock`. Needs a CUDA submission with
    /// [`Timing::EventWindow`](super::super::Timing::EventWindow).
    pub fn wait_spans(
        mut self,
        clock: &DeviceClock,
    ) -> Result<(Finished, DeviceSpans), BackendError> {
        match &self.origin {
            PendingOrigin::Cuda(backend) if backend.inner.id == clock.backend.inner.id => {}
            PendingOrigin::Lane(_) => {
                return Err(BackendError::bad_input(format!(
                    "Fix: {} ran on a lane, which records no events; submit it with \
                     CudaBackend::submit and Timing::EventWindow to read its device spans",
                    self.kernel.name()
                )))
            }
            _ => {
                return Err(BackendError::bad_input(
                    "Fix: the DeviceClock belongs to another backend; take one from the backend \
                     that ran the dispatch",
                ))
            }
        }
        match &self.state {
            PendingState::InFlight(in_flight, _) if in_flight.timed() => {}
            _ => {
                return Err(BackendError::bad_input(format!(
                "Fix: {} was submitted without timing events (or completed at submission); submit \
                     it with Timing::EventWindow to read its device spans",
                self.kernel.name()
            )))
            }
        }
        let (finished, spans) = self.finish(Some(&clock.event))?;
        Ok((finished, spans.unwrap_or_default()))
    }

    fn finish(
        &mut self,
        clock: Option<&Event>,
    ) -> Result<(Finished, Option<DeviceSpans>), BackendError> {
        let state = std::mem::replace(&mut self.state, PendingState::Finished);
        let result = match state {
            PendingState::Finished => {
                return Err(BackendError::internal(
                    "a pending dispatch was finished twice",
                ))
            }
            PendingState::Done(result) => result.map(|finished| (finished, None)),
            PendingState::InFlight(in_flight, books) => {
                self.complete_in_flight(in_flight, books, clock)
            }
            PendingState::Lane(ticket) => {
                ticket.finish(&self.kernel).map(|finished| (finished, None))
            }
        };
        self.origin.pending().fetch_sub(1, Ordering::AcqRel);
        result
    }

    /// The synchronize and readback of a CUDA dispatch in flight.
    fn complete_in_flight(
        &self,
        in_flight: InFlight<'static>,
        mut books: Box<Bookkeeping>,
        clock: Option<&Event>,
    ) -> Result<(Finished, Option<DeviceSpans>), BackendError> {
        let PendingOrigin::Cuda(backend) = &self.origin else {
            return Err(BackendError::internal("a reference dispatch was in flight"));
        };
        let inner = &backend.inner;
        let kernel = inner
            .cuda_kernel(&self.kernel)
            .map_err(|_| foreign_kernel(self.kernel.name()))?;
        // `wait` may run on another thread than `submit`.
        if let Err(e) = inner.bind() {
            // Without the context nothing can be synchronised or freed.
            std::mem::forget(in_flight);
            std::mem::forget(books);
            return Err(e);
        }
        let mut outputs = Outputs::default();
        let mut spans = None;
        let timings = inner.complete(
            kernel,
            in_flight,
            &mut books,
            Sink::Packed(&mut outputs),
            // Submissions are not charged to the probe: no phase may land in another
            // dispatch's record.
            None,
            clock.map(|origin| (origin, &mut spans)),
        )?;
        outputs.name_by(self.kernel.clone());
        Ok((Finished { outputs, timings }, spans))
    }
}

impl Drop for PendingDispatch {
    /// Dropping without `wait` blocks until the dispatch is done (its staging and
    /// buffers are released only then); errors are discarded.
    fn drop(&mut self) {
        if matches!(self.state, PendingState::Finished) {
            return;
        }
        let _ = self.finish(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out an unbounded pile of submissions: the counter admits
    /// [`MAX_PENDING`], refuses one more with a `Fix:` error, and a refusal does not
    /// count (after one wait, one more is admitted).
    #[test]
    fn pending_submissions_are_bounded() {
        let counter = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..MAX_PENDING {
            count_pending(&counter, "p").unwrap();
        }
        let message = count_pending(&counter, "p").unwrap_err().to_string();
        assert!(message.starts_with("Fix:"), "{message}");
        assert_eq!(counter.load(Ordering::Relaxed), MAX_PENDING);
        counter.fetch_sub(1, Ordering::AcqRel);
        assert!(count_pending(&counter, "p").is_ok());
    }
}
