//! Device order between dispatches that share memory.
//!
//! # Why
//!
//! Every dispatch runs on its own leased stream, so two dispatches in flight at once
//! (a [`PendingDispatch`](super::PendingDispatch) and the next submission, or two
//! pipelined submissions) are unordered on the device. When both bind the same
//! device memory and one of them writes it, the device could run them at once and
//! the second could read the first's input, or both could write: found on the H200
//! under compute-sanitizer (2026-12-01), where two submissions that each add one to
//! the same buffer left it one short, because the sanitizer's slower kernels
//! overlapped.
//!
//! The order book records, for every dispatch in flight, the device addresses it
//! reads and writes through owned buffers (host, zeroed and pinned
//! bindings get a fresh transient per dispatch, so they never conflict). A new
//! dispatch that conflicts with one in flight waits for it on the device (an event
//! recorded on the earlier stream, `cuStreamWaitEvent` on the new one): nothing
//! waits on the host, and dispatches over disjoint memory still overlap. The order
//! is program order: a dispatch is ordered after every conflicting dispatch that
//! was enqueued when it started (two threads racing to submit over the same memory
//! are ordered one way or the other, each seeing the other only once it is
//! enqueued).
//!
//! Lane requests (`backend::lane`) are in the book too. A lane's kernel is always
//! running, so nothing can be ordered before or after it on the device: the order
//! between a lane request and an eager dispatch is kept on the host. A lane request
//! waits, before its doorbell rings, for every conflicting eager dispatch in flight
//! (an event recorded on its stream, `cuEventSynchronize`) and every conflicting
//! request of another lane; an eager dispatch waits, before it enqueues anything, for
//! every conflicting lane request in flight (its completion word). Requests of one
//! lane run in order on its kernel and need nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::driver::{DriverResult, Event, Stream};
use super::lane::LaneShared;
use super::PerBinding;

/// The memory one dispatch touches through shared buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::backend) struct Accesses {
    pub(in crate::backend) reads: PerBinding<u64>,
    pub(in crate::backend) writes: PerBinding<u64>,
}

impl Accesses {
    /// Whether the two cannot run at once: one writes what the other touches.
    pub(in crate::backend) fn conflicts_with(&self, other: &Accesses) -> bool {
        let touches = |set: &Accesses, address: &u64| {
            set.writes.contains(address) || set.reads.contains(address)
        };
        self.writes.iter().any(|a| touches(other, a))
            || other.writes.iter().any(|a| self.reads.contains(a))
    }

    pub(in crate::backend) fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }
}

/// Who holds the memory of one entry.
enum Holder {
    /// An eager dispatch on its leased stream, with the stream's order event.
    Stream {
        stream: Arc<Stream>,
        order: Arc<Event>,
    },
    /// Request `ticket` of a lane.
    Lane { lane: Arc<LaneShared>, ticket: u64 },
}

struct Entry {
    holder: Holder,
    accesses: Accesses,
}

/// Lane requests a dispatch must wait for on the host before it runs.
pub(in crate::backend) type LaneWaits = SmallVec<[(Arc<LaneShared>, u64); 2]>;

/// Eager dispatches a lane request must wait for on the host before it rings: the
/// order event of each, recorded on its stream.
pub(in crate::backend) type EventWaits = SmallVec<[Arc<Event>; 2]>;

/// Every dispatch in flight on one backend with the memory it touches.
#[derive(Default)]
pub(in crate::backend) struct OrderBook {
    entries: Mutex<Vec<Entry>>,
    /// Entries, readable without the lock (an empty book costs one load).
    len: AtomicUsize,
}

impl OrderBook {
    /// Order `stream` (the new dispatch's, nothing enqueued on it yet) after every
    /// dispatch in flight whose accesses conflict with `accesses`, and after
    /// `explicit` (a dispatch the caller named, as its stream and that stream's
    /// order event), each once: an explicit predecessor that also conflicts is
    /// waited on once, not twice. Returns how many dispatches it ordered after on the
    /// device, and the conflicting lane requests in flight, which the caller waits
    /// for on the host (outside the book's lock) before it enqueues anything.
    pub(in crate::backend) fn order_after(
        &self,
        accesses: &Accesses,
        stream: &Stream,
        explicit: Option<(&Stream, &Event)>,
    ) -> DriverResult<(usize, LaneWaits)> {
        let mut ordered = 0;
        let mut explicit_done = false;
        let mut lanes = LaneWaits::new();
        if !accesses.is_empty() && self.len.load(Ordering::Acquire) != 0 {
            let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            for entry in entries
                .iter()
                .filter(|e| e.accesses.conflicts_with(accesses))
            {
                match &entry.holder {
                    Holder::Stream {
                        stream: earlier,
                        order,
                    } => {
                        // The earlier lane is leased to its dispatch until it completes
                        // (and leaves the book first), so everything on its stream is
                        // that dispatch.
                        order.record(earlier)?;
                        stream.wait_event(order)?;
                        ordered += 1;
                        explicit_done |=
                            explicit.is_some_and(|(named, _)| std::ptr::eq(&**earlier, named));
                    }
                    Holder::Lane { lane, ticket } => lanes.push((Arc::clone(lane), *ticket)),
                }
            }
        }
        if let (Some((earlier, order)), false) = (explicit, explicit_done) {
            order.record(earlier)?;
            stream.wait_event(order)?;
            ordered += 1;
        }
        Ok((ordered, lanes))
    }

    /// What a request of `lane` touching `accesses` must wait for on the host before
    /// its doorbell rings: every conflicting eager dispatch in flight (its order event,
    /// recorded now on its stream) and every conflicting request of another lane. The
    /// caller waits outside the book's lock.
    pub(in crate::backend) fn lane_conflicts(
        &self,
        accesses: &Accesses,
        lane: &Arc<LaneShared>,
    ) -> DriverResult<(EventWaits, LaneWaits)> {
        let mut events = EventWaits::new();
        let mut lanes = LaneWaits::new();
        if accesses.is_empty() || self.len.load(Ordering::Acquire) == 0 {
            return Ok((events, lanes));
        }
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for entry in entries
            .iter()
            .filter(|e| e.accesses.conflicts_with(accesses))
        {
            match &entry.holder {
                Holder::Stream { stream, order } => {
                    order.record(stream)?;
                    events.push(Arc::clone(order));
                }
                Holder::Lane {
                    lane: other,
                    ticket,
                } if !Arc::ptr_eq(other, lane) => lanes.push((Arc::clone(other), *ticket)),
                // The same lane runs its requests in order.
                Holder::Lane { .. } => {}
            }
        }
        Ok((events, lanes))
    }

    /// Enter request `ticket` of `lane`, just rung.
    pub(in crate::backend) fn enter_lane(
        &self,
        lane: &Arc<LaneShared>,
        ticket: u64,
        accesses: Accesses,
    ) {
        self.push(
            Holder::Lane {
                lane: Arc::clone(lane),
                ticket,
            },
            accesses,
        );
    }

    /// Remove request `ticket` of `lane` (delivered, or failed before it rang).
    pub(in crate::backend) fn leave_lane(&self, lane: &Arc<LaneShared>, ticket: u64) {
        self.retain(|holder| match holder {
            Holder::Lane {
                lane: other,
                ticket: held,
            } => !(Arc::ptr_eq(other, lane) && *held == ticket),
            Holder::Stream { .. } => true,
        });
    }

    /// Remove every request of `lane` (it died: none will be delivered).
    pub(in crate::backend) fn forget_lane(&self, lane: &LaneShared) {
        self.retain(|holder| match holder {
            Holder::Lane { lane: other, .. } => !std::ptr::eq(Arc::as_ptr(other), lane),
            Holder::Stream { .. } => true,
        });
    }

    fn push(&self, holder: Holder, accesses: Accesses) {
        if accesses.is_empty() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.push(Entry { holder, accesses });
        self.len.store(entries.len(), Ordering::Release);
    }

    fn retain(&self, keep: impl Fn(&Holder) -> bool) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| keep(&e.holder));
        self.len.store(entries.len(), Ordering::Release);
    }

    /// Enter a dispatch just enqueued on `stream`.
    pub(in crate::backend) fn enter(
        &self,
        stream: &Arc<Stream>,
        order: &Arc<Event>,
        accesses: Accesses,
    ) {
        self.push(
            Holder::Stream {
                stream: Arc::clone(stream),
                order: Arc::clone(order),
            },
            accesses,
        );
    }

    /// Remove the dispatch of `stream` (it completed, or failed before running).
    pub(in crate::backend) fn leave(&self, stream: &Arc<Stream>) {
        self.retain(|holder| match holder {
            Holder::Stream { stream: other, .. } => !Arc::ptr_eq(other, stream),
            Holder::Lane { .. } => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accesses(reads: &[u64], writes: &[u64]) -> Accesses {
        Accesses {
            reads: reads.iter().copied().collect(),
            writes: writes.iter().copied().collect(),
        }
    }

    /// Locks out both wrong answers of the conflict rule: two readers of the same
    /// memory, or dispatches over disjoint memory, must stay unordered (they may
    /// overlap); a writer against a reader or another writer of the same address,
    /// in either order, must be ordered.
    #[test]
    fn only_a_writer_of_shared_memory_orders_dispatches() {
        let read_a = accesses(&[0xA], &[]);
        let write_a = accesses(&[], &[0xA]);
        let write_b = accesses(&[0xA], &[0xB]);
        assert!(!read_a.conflicts_with(&read_a));
        assert!(write_a.conflicts_with(&read_a));
        assert!(read_a.conflicts_with(&write_a));
        assert!(write_a.conflicts_with(&write_a));
        assert!(!write_b.conflicts_with(&read_a), "both only read 0xA");
        assert!(write_b.conflicts_with(&accesses(&[0xB], &[])));
        assert!(!accesses(&[0x1], &[0x2]).conflicts_with(&accesses(&[0x3], &[0x4])));
        assert!(accesses(&[], &[]).is_empty());
    }
}
