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
//! A dispatch named as the explicit predecessor (`Dispatch::after`) already runs
//! after everything it was ordered after, and after what those were ordered after:
//! a conflicting dispatch among them needs no wait of its own. A chain of dependent
//! steps over shared buffers (the tokenizer's encode: eight steps, most of them
//! touching what several earlier ones wrote) then waits on one event per step
//! instead of one per earlier conflicting step. Each entry remembers the entries
//! it was ordered after by id (never by stream: a stream is leased again once its
//! dispatch completes, and would then name a dispatch nothing waited for).
//!
//! Lane requests (`backend::lane`) are in the book too. A lane's kernel is always
//! running, so nothing can be ordered before or after it on the device: the order
//! between a lane request and an eager dispatch is kept on the host. A lane request
//! waits, before its doorbell rings, for every conflicting eager dispatch in flight
//! (an event recorded on its stream, `cuEventSynchronize`) and every conflicting
//! request of another lane; an eager dispatch waits, before it enqueues anything, for
//! every conflicting lane request in flight (its completion word). Requests of one
//! lane run in order on its kernel and need nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// Unique in the book's life.
    id: u64,
    holder: Holder,
    accesses: Accesses,
    /// The entries this one was ordered after on the device, by id.
    after: Ordered,
}

/// Ids of book entries a dispatch was ordered after on the device.
pub(in crate::backend) type Ordered = SmallVec<[u64; 8]>;

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
    /// The next entry's id.
    next_id: AtomicU64,
}

impl OrderBook {
    /// Order `stream` (the new dispatch's, nothing enqueued on it yet) after every
    /// dispatch in flight whose accesses conflict with `accesses`, and after
    /// `explicit` (a dispatch the caller named, as its stream and that stream's
    /// order event), each once: an explicit predecessor that also conflicts is
    /// waited on once, not twice, and a conflicting dispatch the explicit one
    /// already runs after (directly or through others in the book) is not waited on
    /// again. Returns the entries it ordered after on the device (for
    /// [`OrderBook::enter`]), and the conflicting lane requests in flight, which the
    /// caller waits for on the host (outside the book's lock) before it enqueues
    /// anything.
    pub(in crate::backend) fn order_after(
        &self,
        accesses: &Accesses,
        stream: &Stream,
        explicit: Option<(&Stream, &Event)>,
    ) -> DriverResult<(Ordered, LaneWaits)> {
        let mut ordered = Ordered::new();
        let mut lanes = LaneWaits::new();
        let holds = |entry: &Entry, named: &Stream| matches!(&entry.holder, Holder::Stream { stream, .. } if std::ptr::eq(&**stream, named));
        if !accesses.is_empty() && self.len.load(Ordering::Acquire) != 0 {
            let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            // The explicit predecessor and everything it runs after, by id.
            let implied = explicit
                .and_then(|(named, _)| entries.iter().find(|entry| holds(entry, named)))
                .map(|entry| {
                    let after_of =
                        |id: u64| entries.iter().find(|e| e.id == id).map(|e| &e.after[..]);
                    implied_by(entry.id, after_of)
                })
                .unwrap_or_default();
            for entry in entries
                .iter()
                .filter(|e| e.accesses.conflicts_with(accesses))
            {
                match &entry.holder {
                    // Waited on below (the explicit one) or through it (the rest).
                    Holder::Stream { .. } if implied.contains(&entry.id) => {}
                    Holder::Stream {
                        stream: earlier,
                        order,
                    } => {
                        // The earlier lane is leased to its dispatch until it completes
                        // (and leaves the book first), so everything on its stream is
                        // that dispatch.
                        order.record(earlier)?;
                        stream.wait_event(order)?;
                        ordered.push(entry.id);
                    }
                    Holder::Lane { lane, ticket } => lanes.push((Arc::clone(lane), *ticket)),
                }
            }
            if let Some(first) = implied.first() {
                // `implied_by` puts the explicit entry first.
                ordered.push(*first);
            }
        }
        if let Some((earlier, order)) = explicit {
            order.record(earlier)?;
            stream.wait_event(order)?;
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
        // A lane request's order is kept on the host: nothing on the device runs
        // after what it waited for through it.
        self.push(
            Holder::Lane {
                lane: Arc::clone(lane),
                ticket,
            },
            accesses,
            Ordered::new(),
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

    fn push(&self, holder: Holder, accesses: Accesses, after: Ordered) {
        if accesses.is_empty() {
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.push(Entry {
            id,
            holder,
            accesses,
            after,
        });
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

    /// Enter a dispatch just enqueued on `stream`, ordered on the device after the
    /// entries `after` ([`OrderBook::order_after`]'s answer).
    pub(in crate::backend) fn enter(
        &self,
        stream: &Arc<Stream>,
        order: &Arc<Event>,
        accesses: Accesses,
        after: Ordered,
    ) {
        self.push(
            Holder::Stream {
                stream: Arc::clone(stream),
                order: Arc::clone(order),
            },
            accesses,
            after,
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

/// `start` and every entry it runs after on the device, `start` first: the
/// entries reachable through `after_of` (an entry's direct predecessors, `None`
/// for an id no longer in the book, whose own predecessors are then not
/// followed: a conservative answer, never a wrong one).
fn implied_by<'a>(start: u64, after_of: impl Fn(u64) -> Option<&'a [u64]>) -> SmallVec<[u64; 16]> {
    let mut found: SmallVec<[u64; 16]> = SmallVec::new();
    found.push(start);
    let mut next = 0;
    while next < found.len() {
        let id = found[next];
        next += 1;
        for &before in after_of(id).unwrap_or(&[]) {
            if !found.contains(&before) {
                found.push(before);
            }
        }
    }
    found
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

    /// `implied_by` over a book given as `(id, after)` pairs.
    fn implied(book: &[(u64, &[u64])], start: u64) -> Vec<u64> {
        let after_of = |id: u64| {
            book.iter()
                .find(|(entry, _)| *entry == id)
                .map(|(_, after)| *after)
        };
        implied_by(start, after_of).into_vec()
    }

    /// Locks out a chain that waits again on what its predecessor already waits
    /// for, and a pruning that skips a wait it needs: in a chain 1 ← 2 ← 3 (each
    /// ordered after the one before), the explicit predecessor 3 implies 2 and 1
    /// (so a fourth step conflicting with all three waits on 3 alone); a diamond is
    /// followed once; an entry no longer in the book stops the walk (what was behind
    /// it is waited on again: conservative); and a dispatch on a re-leased stream
    /// (id 5, on the stream that id 2 had) is not implied by 3, though 3 waited on
    /// 2. Negative control: keyed by stream instead of id, the same book names the
    /// re-leased dispatch as already waited for, which would race.
    #[test]
    fn an_explicit_predecessor_implies_exactly_what_it_waited_for() {
        let chain: &[(u64, &[u64])] = &[(1, &[]), (2, &[1]), (3, &[2])];
        assert_eq!(implied(chain, 3), [3, 2, 1]);
        let diamond: &[(u64, &[u64])] = &[(1, &[]), (2, &[1]), (3, &[1]), (4, &[2, 3])];
        assert_eq!(implied(diamond, 4), [4, 2, 3, 1]);
        let gap: &[(u64, &[u64])] = &[(1, &[]), (3, &[2])];
        assert_eq!(
            implied(gap, 3),
            [3, 2],
            "1 is behind 2, which left the book"
        );
        let released: &[(u64, &[u64])] = &[(3, &[2]), (5, &[])];
        assert!(!implied(released, 3).contains(&5));
        // Keyed by stream: ids 2 and 5 ran on one stream, `S`.
        let stream_of = |id: u64| if id == 2 || id == 5 { 'S' } else { 'T' };
        let waited_streams: Vec<char> = implied(released, 3).into_iter().map(stream_of).collect();
        assert!(
            waited_streams.contains(&stream_of(5)),
            "the stream key aliases 5 with 2"
        );
    }
}
