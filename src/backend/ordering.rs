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
//! steps over shared buffers (the tokenizer's encode: seven steps, most of them
//! touching what several earlier ones wrote) then waits on one event per step
//! instead of one per earlier conflicting step. Each entry remembers the entries
//! it was ordered after by id (never by stream: a stream is leased again once its
//! dispatch completes, and would then name a dispatch nothing waited for).
//!
//! Lane requests (`backend::lane`) are in the book too. A lane's kernel is always
//! running, so nothing can be ordered before or after it on the device: the order
//! between a lane request and an eager dispatch is kept on the host. A lane request
//! waits, before its doorbell rings, for every conflicting eager dispatch in flight (an
//! event recorded on its stream, `cuEventSynchronize`) and every conflicting request of
//! another lane; an eager dispatch waits, before it enqueues anything, for every
//! conflicting lane request in flight (its completion word), and so does a blocking
//! transfer (an upload, a read, a clear, a copy between buffers: each in the book like
//! a dispatch), and a graph replay over a buffer a lane request binds
//! ([`OrderBook::lanes_touching`]; a replay is not in the book otherwise). A lane request
//! stays in the book after its delivery, until its completion word shows it served: the
//! lane's server publishes the result words before its GPU-scope fence, so a delivered
//! request's outputs in device memory are visible to later device work only once the
//! completion word is (`codegen::ptx::lane` argues it; `LaneShared::retire` takes the
//! entries out, a few at a time). Requests of one lane need nothing among themselves:
//! the server runs them one after another, every access of one before every access of
//! the next (with one block, block barriers between them on the same threads; with
//! several, no block starts a request before the previous one is published), so
//! [`OrderBook::lane_conflicts`] skips the lane's own entries before it compares any
//! address.
//!
//! The book holds a lane weakly ([`Weak`]): a request entry that kept its lane alive
//! would keep a dropped lane from stopping until the request retired, and the lane's
//! retirement runs only while it is used. A dispatch that meets a lane's entry
//! borrows the lane (upgrades the weak hold, under the book's lock) for the length of
//! its wait for the request's completion word. The lane's last handle, before it
//! goes, ends the lending ([`OrderBook::stop_lending_lane`]) and waits for the
//! borrowers to finish, so the lane stops on its owner's thread and `Lane::stop`
//! reports that stop instead of failing because a borrower held the lane for a
//! moment. A stopping lane waits for its newest delivered request's completion word
//! before it leaves the book, and a dispatch that meets its entries meanwhile waits
//! for them to leave ([`OrderBook::wait_for_lanes`]), at most the entries' patience
//! (a stop that never finishes is a `Fix:` error, not a hang).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use super::driver::{DriverResult, Event, Stream};
use super::lane::LaneShared;
use super::{BackendError, PerBinding};

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

    /// Work that reads the owned buffer at device address `buffer` and nothing else.
    pub(in crate::backend) fn reading(buffer: u64) -> Accesses {
        let mut accesses = Accesses::default();
        accesses.reads.push(buffer);
        accesses
    }

    /// Work that writes the owned buffer at device address `buffer` and nothing else.
    pub(in crate::backend) fn writing(buffer: u64) -> Accesses {
        let mut accesses = Accesses::default();
        accesses.writes.push(buffer);
        accesses
    }
}

/// Who holds the memory of one entry.
enum Holder {
    /// An eager dispatch on its leased stream, with the stream's order event.
    Stream {
        stream: Arc<Stream>,
        order: Arc<Event>,
    },
    /// Request `ticket` of the lane whose id is `id` ([`LaneShared::id`]), from its
    /// doorbell until its completion word shows it served (after its delivery, until
    /// the lane retires it). Weak: the book keeps no lane alive (see the module docs);
    /// the id names the lane once it is no longer lent ([`OrderBook::stop_lending_lane`]
    /// empties `lane`). `patience` bounds a wait for a stopping lane's entries to leave.
    Lane {
        lane: Weak<LaneShared>,
        id: u64,
        ticket: u64,
        patience: Duration,
    },
}

impl Holder {
    /// Whether it is a request of lane `id`.
    fn of_lane(&self, lane: u64) -> bool {
        matches!(self, Holder::Lane { id, .. } if *id == lane)
    }

    /// The host wait for it, when it is a lane request.
    fn lane_wait(&self) -> Option<LaneWait> {
        match self {
            Holder::Lane {
                lane,
                id,
                ticket,
                patience,
            } => Some(LaneWait {
                lane: lane.upgrade(),
                id: *id,
                ticket: *ticket,
                patience: *patience,
            }),
            Holder::Stream { .. } => None,
        }
    }
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

/// One lane request a dispatch must wait for on the host before it runs.
pub(in crate::backend) struct LaneWait {
    /// The lane, while it lives; `None` while it is stopping (its last handle is gone,
    /// and its shut-down waits for its requests before the book forgets them).
    lane: Option<Arc<LaneShared>>,
    /// The lane's id ([`LaneShared::id`]).
    id: u64,
    ticket: u64,
    /// How long a stopping lane's entries may take to leave the book.
    patience: Duration,
}

/// Lane requests a dispatch must wait for on the host before it runs
/// ([`OrderBook::wait_for_lanes`]). Dropped outside the book's lock: the last handle
/// of a lane may be one of them, and the lane's stop takes the lock.
pub(in crate::backend) type LaneWaits = SmallVec<[LaneWait; 2]>;

/// How long a dispatch sleeps between looks at the book while a stopping lane's
/// requests are still in it (the lane waits for its newest request's completion word,
/// microseconds, then leaves).
const STOPPING_LANE_LOOK: Duration = Duration::from_micros(20);

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
                    Holder::Lane { .. } => lanes.extend(entry.holder.lane_wait()),
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
    /// recorded now on its stream) and every conflicting request of another lane,
    /// delivered or not, until it retired. The lane's own entries are skipped before
    /// any address is compared: the server orders a lane's requests on the device,
    /// whatever its blocks (`codegen::ptx::lane`, "Requests of one lane"). The caller
    /// waits outside the book's lock.
    pub(in crate::backend) fn lane_conflicts(
        &self,
        accesses: &Accesses,
        lane: &Arc<LaneShared>,
    ) -> DriverResult<(EventWaits, LaneWaits)> {
        self.conflicts_of_lane(accesses, lane.id())
    }

    /// [`OrderBook::lane_conflicts`] for a request of lane `own`.
    fn conflicts_of_lane(
        &self,
        accesses: &Accesses,
        own: u64,
    ) -> DriverResult<(EventWaits, LaneWaits)> {
        let mut events = EventWaits::new();
        let mut lanes = LaneWaits::new();
        if accesses.is_empty() || self.len.load(Ordering::Acquire) == 0 {
            return Ok((events, lanes));
        }
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for entry in entries.iter() {
            // Skipped before the comparison: the usual hot loop has only its own
            // lane's entries in the book (its delivered requests, until they retire).
            if entry.holder.of_lane(own) {
                continue;
            }
            if !entry.accesses.conflicts_with(accesses) {
                continue;
            }
            match &entry.holder {
                Holder::Stream { stream, order } => {
                    order.record(stream)?;
                    events.push(Arc::clone(order));
                }
                Holder::Lane { .. } => lanes.extend(entry.holder.lane_wait()),
            }
        }
        Ok((events, lanes))
    }

    /// The lane requests (delivered or not, until they retired) that work outside the
    /// book (a blocking copy or clear, a graph replay) over the owned buffers at device
    /// addresses `buffers` must wait for before it is enqueued: those that write one of
    /// them, and, when that work writes them (`writing`), those that read one too. The
    /// caller waits outside the book's lock ([`OrderBook::wait_for_lanes`]).
    pub(in crate::backend) fn lanes_touching(
        &self,
        buffers: impl Iterator<Item = u64> + Clone,
        writing: bool,
    ) -> LaneWaits {
        let mut lanes = LaneWaits::new();
        if self.len.load(Ordering::Acquire) == 0 {
            return lanes;
        }
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for entry in entries.iter() {
            if !matches!(entry.holder, Holder::Lane { .. }) {
                continue;
            }
            let accesses = &entry.accesses;
            let touches = |buffer: u64| {
                accesses.writes.contains(&buffer) || (writing && accesses.reads.contains(&buffer))
            };
            if buffers.clone().any(touches) {
                lanes.extend(entry.holder.lane_wait());
            }
        }
        lanes
    }

    /// Wait on the host for every lane request of `lanes` (what [`OrderBook::order_after`],
    /// [`OrderBook::lane_conflicts`] or [`OrderBook::lanes_touching`] found): a live
    /// lane's completion word, and for a stopping lane's request, until the lane left
    /// the book (its stop waits for its requests first). `waiter` names what waits,
    /// for messages.
    pub(in crate::backend) fn wait_for_lanes(
        &self,
        lanes: LaneWaits,
        waiter: &str,
    ) -> Result<(), BackendError> {
        for wait in lanes {
            match &wait.lane {
                Some(lane) => lane.wait_for(wait.ticket, waiter)?,
                None => self.wait_until_lane_left(wait.id, wait.patience, waiter)?,
            }
        }
        Ok(())
    }

    /// Sleep until the book holds no request of lane `id` (a stopping lane: its stop
    /// waits, at most its timeout, for the dispatches it was lent to, then at most its
    /// timeout for its newest request's completion word, and then forgets every
    /// request of it, on every path), at most `patience`; past it, a `Fix:` error
    /// (a stop that never finished, such as one that panicked).
    fn wait_until_lane_left(
        &self,
        id: u64,
        patience: Duration,
        waiter: &str,
    ) -> Result<(), BackendError> {
        let started = std::time::Instant::now();
        loop {
            let present = {
                let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
                entries.iter().any(|entry| entry.holder.of_lane(id))
            };
            if !present {
                return Ok(());
            }
            if started.elapsed() >= patience {
                return Err(BackendError::bad_input(format!(
                    "Fix: {waiter} waited {patience:?} for a stopping lane's request over memory it \
                     touches, and the lane's stop has not finished; stop lanes (and wait for their \
                     stop) before dispatching over the buffers their requests bind"
                )));
            }
            std::thread::sleep(STOPPING_LANE_LOOK);
        }
    }

    /// Lend lane `id` to no more dispatches: its entries' waits become waits for the
    /// entries to leave the book (its stop's work). Every lending (an upgrade of an
    /// entry's [`Weak`]) happens under the book's lock, so once this returns the lane
    /// is held by its last handle and by the dispatches it was lent before, which
    /// that handle waits for (`LaneShared::wait_until_alone`).
    pub(in crate::backend) fn stop_lending_lane(&self, id: u64) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for entry in entries.iter_mut() {
            if let Holder::Lane { lane, id: of, .. } = &mut entry.holder {
                if *of == id {
                    *lane = Weak::new();
                }
            }
        }
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
                lane: Arc::downgrade(lane),
                id: lane.id(),
                ticket,
                patience: lane.stop_patience(),
            },
            accesses,
            Ordered::new(),
        );
    }

    /// Remove requests `tickets` of lane `id` (served: their completion word arrived,
    /// or failed before they rang), in one pass over the book.
    pub(in crate::backend) fn leave_lane(&self, id: u64, tickets: &[u64]) {
        if tickets.is_empty() {
            return;
        }
        self.retain(|holder| match holder {
            Holder::Lane {
                id: lane,
                ticket: held,
                ..
            } => !(*lane == id && tickets.contains(held)),
            Holder::Stream { .. } => true,
        });
    }

    /// Remove every request of lane `id` (it died or stopped: none will complete, or
    /// every one did).
    pub(in crate::backend) fn forget_lane(&self, id: u64) {
        self.retain(|holder| !holder.of_lane(id));
    }

    /// Entries in the book now (test support).
    #[cfg(feature = "testing")]
    pub(in crate::backend) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Room for `entries` more entries, so that a lane's requests, each in the book
    /// until it retires (a batch at a time), do not grow it on a warm path.
    pub(in crate::backend) fn reserve(&self, entries: usize) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reserve(entries);
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

    /// A book holding requests of lanes that no longer live (the tests have no
    /// device): `(lane id, ticket, accesses)` each.
    fn book_of_lane_requests(requests: &[(u64, u64, Accesses)]) -> OrderBook {
        book_of_stopping_lanes(requests, Duration::from_secs(10))
    }

    /// [`book_of_lane_requests`] whose waits for the lanes' stops give up after
    /// `patience`.
    fn book_of_stopping_lanes(requests: &[(u64, u64, Accesses)], patience: Duration) -> OrderBook {
        let book = OrderBook::default();
        for (id, ticket, accesses) in requests {
            book.push(
                Holder::Lane {
                    lane: Weak::new(),
                    id: *id,
                    ticket: *ticket,
                    patience,
                },
                accesses.clone(),
                Ordered::new(),
            );
        }
        book
    }

    /// `(lane id, ticket)` of each wait, in book order.
    fn named(waits: &LaneWaits) -> Vec<(u64, u64)> {
        waits.iter().map(|wait| (wait.id, wait.ticket)).collect()
    }

    /// Locks out a lane whose own earlier requests delay its next one, which the device
    /// already orders after them whatever the lane's blocks (its hot loop would wait for
    /// every earlier request's completion word; a lane of several blocks used to, while
    /// a block could start the next request before another finished this one), and a
    /// lane that skips another lane's requests: lane 1's request writing `0xA` skips
    /// its own conflicting entries and waits for lane 2's. Negative controls: the same
    /// request of lane 3 waits for lane 1's conflicting entries (the skip is by lane,
    /// not by address), and an entry over other memory is never waited for.
    #[test]
    fn a_lane_skips_its_own_requests_and_waits_for_other_lanes() {
        let book = book_of_lane_requests(&[
            (1, 10, accesses(&[0xA], &[])),
            (1, 11, accesses(&[], &[0xA])),
            (2, 4, accesses(&[0xA], &[])),
            (1, 12, accesses(&[0xB], &[])),
        ]);
        let request = accesses(&[], &[0xA]);
        let (events, own) = book.conflicts_of_lane(&request, 1).unwrap();
        assert!(events.is_empty());
        assert_eq!(named(&own), [(2, 4)]);
        let (_, other) = book.conflicts_of_lane(&request, 3).unwrap();
        assert_eq!(named(&other), [(1, 10), (1, 11), (2, 4)]);
        assert!(other.iter().all(|wait| wait.lane.is_none()));
        let (_, elsewhere) = book
            .conflicts_of_lane(&accesses(&[0xC], &[0xD]), 3)
            .unwrap();
        assert!(elsewhere.is_empty());
    }

    /// Locks out a blocking copy or clear (or a graph replay) that runs beside a lane
    /// request touching its buffer: a read of `0xA` waits for the requests that write it
    /// (not those that only read it), an upload or clear of `0xA` for those that read or
    /// write it, a copy of another buffer for none, and a replay over several buffers
    /// for the requests touching any of them. Negative control: with no lane entry in
    /// the book the same copies wait for nothing.
    #[test]
    fn blocking_copies_wait_for_the_lane_requests_touching_their_buffer() {
        let book = book_of_lane_requests(&[
            (1, 0, accesses(&[0xA], &[])),
            (1, 1, accesses(&[0xB], &[0xA])),
            (2, 0, accesses(&[], &[0xC])),
        ]);
        assert_eq!(
            named(&book.lanes_touching([0xA].into_iter(), false)),
            [(1, 1)]
        );
        assert_eq!(
            named(&book.lanes_touching([0xA].into_iter(), true)),
            [(1, 0), (1, 1)]
        );
        assert_eq!(
            named(&book.lanes_touching([0xB].into_iter(), true)),
            [(1, 1)]
        );
        assert!(book.lanes_touching([0xB].into_iter(), false).is_empty());
        assert!(book.lanes_touching([0xD].into_iter(), true).is_empty());
        // A graph replay's buffers together: any of them touched.
        assert_eq!(
            named(&book.lanes_touching([0xD, 0xC].into_iter(), false)),
            [(2, 0)]
        );
        let empty = OrderBook::default();
        assert!(empty.lanes_touching([0xA].into_iter(), true).is_empty());
    }

    /// Locks out a retirement that takes out other requests' entries or leaves its own
    /// behind, and a stopping lane whose waiters never wake: a batch of tickets of lane
    /// 1 leaves the book exactly (lane 2's entry with the same ticket stays); forgetting
    /// lane 1 removes the rest of it; a waiter for a stopping lane's request (its lane
    /// gone) returns once the lane forgot its entries on another thread. Negative
    /// control: an empty batch removes nothing.
    #[test]
    fn lane_entries_leave_in_batches_and_waiters_of_a_stopping_lane_wake() {
        let book = Arc::new(book_of_lane_requests(&[
            (1, 0, accesses(&[0xA], &[])),
            (1, 1, accesses(&[0xA], &[])),
            (1, 2, accesses(&[0xA], &[])),
            (2, 1, accesses(&[0xA], &[])),
        ]));
        book.leave_lane(1, &[]);
        assert_eq!(
            named(&book.lanes_touching([0xA].into_iter(), true)).len(),
            4
        );
        book.leave_lane(1, &[0, 1]);
        assert_eq!(
            named(&book.lanes_touching([0xA].into_iter(), true)),
            [(1, 2), (2, 1)]
        );
        let waits = book.lanes_touching([0xA].into_iter(), true);
        let stopping = Arc::clone(&book);
        let forgetting = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            stopping.forget_lane(1);
            stopping.forget_lane(2);
        });
        book.wait_for_lanes(waits, "a test").unwrap();
        assert!(book.lanes_touching([0xA].into_iter(), true).is_empty());
        forgetting.join().unwrap();
    }

    /// Locks out a dispatch that waits forever for a stopping lane whose stop never
    /// finishes (it panicked, or its thread hangs): the wait for lane 1's entry ends
    /// after the entry's patience with a `Fix:` error naming the waiter. Negative
    /// control: once the lane's entries left, the same wait returns at once.
    #[test]
    fn a_wait_for_a_stop_that_never_finishes_ends_in_a_fix_error() {
        let book =
            book_of_stopping_lanes(&[(1, 0, accesses(&[], &[0xA]))], Duration::from_millis(30));
        let waits = book.lanes_touching([0xA].into_iter(), false);
        assert_eq!(named(&waits), [(1, 0)]);
        let error = book.wait_for_lanes(waits, "a test dispatch").unwrap_err();
        let message = error.to_string();
        assert!(message.contains("Fix:"), "{message}");
        assert!(message.contains("a test dispatch"), "{message}");
        let waits = book.lanes_touching([0xA].into_iter(), false);
        book.forget_lane(1);
        book.wait_for_lanes(waits, "a test dispatch").unwrap();
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
