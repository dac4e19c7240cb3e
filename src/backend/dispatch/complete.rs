//! The second half of a dispatch: the one synchronize, fault handling, the
//! grid-barrier audit, the device times, the host side of the readback, and the
//! lane's return.

use std::time::Instant;

use crate::probe::{self, Phase};

use super::super::driver::{self, DriverError, Event, Stream};
use super::super::kernel::KernelInner;
use super::super::pool::Lane;
use super::super::readback::{stamp_kernel_ns, Delivery};
use super::super::stream_ops::{DeviceMark, LaneTarget, Readback, StreamTarget};
use super::super::{BackendError, BackendInner, Binding, Outputs, Timings};
use super::stage::{BarrierWordAt, BARRIER_BYTES};
use super::{elapsed_ns, Bookkeeping, DeviceSpans, Held, Sink};

/// A dispatch enqueued on its lane and not yet synchronised: with its
/// [`Bookkeeping`] (the readback routes, what it holds), what
/// [`BackendInner::complete`] needs to finish it.
pub(in crate::backend) struct InFlight<'r> {
    pub(in crate::backend) lane: Lane,
    /// The bindings whose buffers the caller's borrow keeps alive (a blocking
    /// dispatch's; empty for a submission, whose bookkeeping holds its buffers).
    pub(in crate::backend) borrowed: &'r [Binding<'r>],
    /// Grid sync: what the barrier audit checks.
    pub(in crate::backend) barrier: Option<BarrierCheck>,
    pub(in crate::backend) timed: bool,
    pub(in crate::backend) window: (DeviceMark, DeviceMark),
    pub(in crate::backend) start: Instant,
    pub(in crate::backend) enqueue_ns: u64,
}

/// What a grid-sync dispatch's barrier audit checks once the stream is done: the
/// word where it came back and the grid's block count.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend) struct BarrierCheck {
    pub(in crate::backend) at: BarrierWordAt,
    pub(in crate::backend) grid_blocks: u64,
}

impl InFlight<'_> {
    /// Whether the dispatch records its device events.
    pub(in crate::backend) fn timed(&self) -> bool {
        self.timed
    }

    /// The stream and order event a later dispatch waits on to run after this one.
    pub(in crate::backend) fn order_handles(&self) -> (&Stream, &Event) {
        (&self.lane.stream, &self.lane.order)
    }
}

impl BackendInner {
    /// Wait for a submitted dispatch: the one synchronize, the barrier audit, the
    /// device times (and, for a timed dispatch, its instants after `spans`' origin
    /// event), the host side of the readback (routed as `books` says), and the
    /// lane's return.
    pub(in crate::backend) fn complete(
        &self,
        kernel: &KernelInner,
        in_flight: InFlight<'_>,
        books: &mut Bookkeeping,
        sink: Sink<'_, '_>,
        mark: Option<Instant>,
        spans: Option<(&Event, &mut Option<DeviceSpans>)>,
    ) -> Result<Timings, BackendError> {
        let InFlight {
            lane,
            borrowed,
            barrier,
            timed,
            window,
            start,
            enqueue_ns,
        } = in_flight;
        let mut target = LaneTarget::of(&lane);
        let wait_ns = match self.synchronize(&mut target, &kernel.name) {
            Ok(ns) => ns,
            Err(e) => {
                self.release(lane, &mut books.held, false, borrowed);
                return Err(e);
            }
        };
        // The stamps first: the barrier word may be in the area, which holds an
        // earlier dispatch's bytes unless this kernel finished its epilogue.
        let checked = lane
            .results
            .as_ref()
            .and_then(|area| area.stamps())
            .ok_or_else(|| {
                BackendError::internal(format!(
                    "{} completed without writing its end stamp, so its mapped results cannot be \
                     trusted",
                    kernel.name
                ))
            })
            .and_then(|stamps| audit_barrier(kernel, &lane, barrier).map(|()| stamps));
        let stamps = match checked {
            Ok(stamps) => stamps,
            Err(e) => {
                self.release(lane, &mut books.held, true, borrowed);
                return Err(e);
            }
        };
        let mut timings = Timings {
            wall_ns: 0,
            enqueue_ns,
            wait_ns,
            kernel_stamps_ns: stamp_kernel_ns(Some(stamps)),
            event_window_ns: None,
            lane_stamps: None,
        };
        if timed {
            timings.event_window_ns = Some(
                Event::elapsed_ns(target.event(window.0), target.event(window.1)).unwrap_or(0),
            );
            if let Some((origin, out)) = spans {
                let after = |mark| Event::elapsed_ns(origin, target.event(mark)).unwrap_or(0);
                *out = Some(DeviceSpans {
                    window_start_ns: after(window.0),
                    kernel_start_ns: after(DeviceMark::KernelStart),
                    kernel_end_ns: after(DeviceMark::KernelEnd),
                    window_end_ns: after(window.1),
                });
            }
        }
        let mark = probe::charge_and_mark(Phase::Release, mark);

        // readback (host side): copy mapped and staged bytes out.
        let routed = &books.routed;
        let readback = Readback::Routed {
            copies: &routed.copies,
            deliveries: &routed.deliveries,
            area_copy: None,
        };
        let area = lane.results.as_ref();
        match sink {
            Sink::Packed(out) => {
                let total = routed.deliveries.iter().map(Delivery::len).sum();
                *out = Outputs::for_items(total, &routed.item_bindings);
                readback.deliver(&lane.staging, area, |_, bytes| out.push_item(bytes));
            }
            Sink::Slices(out) => {
                readback.deliver(&lane.staging, area, |i, bytes| {
                    out[i].copy_from_slice(bytes)
                });
            }
        }
        self.release(lane, &mut books.held, true, borrowed);
        probe::charge(Phase::Readback, mark);
        timings.wall_ns = elapsed_ns(start);
        Ok(timings)
    }

    /// A driver call on a stream failed: a sticky status poisons the device (every
    /// backend of it refuses further work). Shared by dispatches, graphs and buffer
    /// transfers.
    pub(in crate::backend) fn stream_failed(
        &self,
        name: &str,
        what: &str,
        error: DriverError,
    ) -> BackendError {
        if error.is_sticky() {
            self.mark_context_lost(format!("{name} failed while {what}: {error}"));
        }
        BackendError::driver(format!("{what} for {name}"), error)
    }

    /// The one synchronize of a dispatch (or replay, or transfer) and its fault
    /// handling: a failure is a `KernelFault` naming `name`, and a sticky one
    /// marks the context lost. Returns the host time blocked.
    pub(in crate::backend) fn synchronize<T: StreamTarget>(
        &self,
        target: &mut T,
        name: &str,
    ) -> Result<u64, BackendError> {
        self.synchronize_with(name, || target.synchronize())
    }

    /// [`BackendInner::synchronize`] around any synchronizing call (a graph
    /// replay's stream).
    pub(in crate::backend) fn synchronize_with(
        &self,
        name: &str,
        synchronize: impl FnOnce() -> driver::DriverResult<()>,
    ) -> Result<u64, BackendError> {
        let wait_start = Instant::now();
        let synced = synchronize();
        let wait_ns = elapsed_ns(wait_start);
        match synced {
            Ok(()) => Ok(wait_ns),
            Err(error) => {
                let context_usable = !error.is_sticky();
                if !context_usable {
                    self.mark_context_lost(format!("{name} faulted: {error}"));
                }
                Err(BackendError::KernelFault {
                    program: name.to_string(),
                    error,
                    context_usable,
                })
            }
        }
    }

    /// Return a dispatch's lane and transient buffers, and let go of what it held.
    /// After a failure the stream may still hold work, so it is synchronised first;
    /// when that fails or the context is gone, everything is forgotten instead (its
    /// handles died with the context, or the device may still use the memory), and
    /// the memory of the `borrowed` bindings' buffers is pinned for good the same way.
    pub(in crate::backend) fn release(
        &self,
        lane: Lane,
        held: &mut Held,
        stream_idle: bool,
        borrowed: &[Binding<'_>],
    ) {
        self.in_flight.leave(&lane.stream);
        let alive = self.check_alive().is_ok();
        let idle = alive && (stream_idle || lane.stream.synchronize().is_ok());
        if idle {
            for memory in held.transients.drain(..) {
                self.transients.put(memory);
            }
            self.lanes.give_back(lane);
            held.buffers.clear();
            held.pinned.clear();
            return;
        }
        // Dead context: the handles died with it. Busy stream: the device may still
        // use the memory, so leaking it is the only safe choice.
        for memory in held.transients.drain(..) {
            std::mem::forget(memory);
        }
        std::mem::forget(lane);
        for memory in held.buffers.drain(..) {
            std::mem::forget(memory);
        }
        for memory in held.pinned.drain(..) {
            std::mem::forget(memory);
        }
        for binding in borrowed {
            if let Binding::Buffer(buffer) = binding {
                if let Ok(memory) = buffer.memory_for(self, "pin") {
                    std::mem::forget(std::sync::Arc::clone(memory));
                }
            }
        }
    }
}

/// A grid-sync dispatch's barrier word after the synchronize: every workgroup
/// arrived at every barrier (the phase's arrivals back to 0 below the phase bit;
/// a grid whose arrivals leave them so arrived a multiple of its blocks). A pass
/// leaves the word settled for the next launch (`KernelInner::barrier_settled`);
/// a failure leaves it unknown, so the next launch resets it.
fn audit_barrier(
    kernel: &KernelInner,
    lane: &Lane,
    barrier: Option<BarrierCheck>,
) -> Result<(), BackendError> {
    let Some(BarrierCheck { at, grid_blocks }) = barrier else {
        return Ok(());
    };
    let raw = match (at, lane.results.as_ref()) {
        (BarrierWordAt::Area(offset), Some(area)) => area.bytes(offset, BARRIER_BYTES),
        (BarrierWordAt::Staging(offset), _) => lane.staging.slice(offset, BARRIER_BYTES),
        (BarrierWordAt::Area(_), None) => {
            return Err(BackendError::internal(
                "the grid barrier's word was routed to a result area the lane does not have",
            ))
        }
    };
    let word = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    if word & !crate::codegen::GRID_BARRIER_PHASE_BIT != 0 || grid_blocks == 0 {
        return Err(BackendError::GridBarrierAudit {
            program: kernel.name.clone(),
            word,
            grid_blocks,
        });
    }
    kernel
        .barrier_settled
        .store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}
