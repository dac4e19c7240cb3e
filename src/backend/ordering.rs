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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::driver::{DriverResult, Event, Stream};
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

struct Entry {
    stream: Arc<Stream>,
    order: Arc<Event>,
    accesses: Accesses,
}

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
    /// waited on once, not twice. Returns how many dispatches it ordered after.
    pub(in crate::backend) fn order_after(
        &self,
        accesses: &Accesses,
        stream: &Stream,
        explicit: Option<(&Stream, &Event)>,
    ) -> DriverResult<usize> {
        let mut ordered = 0;
        let mut explicit_done = false;
        if !accesses.is_empty() && self.len.load(Ordering::Acquire) != 0 {
            let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            for entry in entries
                .iter()
                .filter(|e| e.accesses.conflicts_with(accesses))
            {
                // The earlier lane is leased to its dispatch until it completes (and
                // leaves the book first), so everything on its stream is that dispatch.
                entry.order.record(&entry.stream)?;
                stream.wait_event(&entry.order)?;
                ordered += 1;
                explicit_done |=
                    explicit.is_some_and(|(earlier, _)| std::ptr::eq(&*entry.stream, earlier));
            }
        }
        if let (Some((earlier, order)), false) = (explicit, explicit_done) {
            order.record(earlier)?;
            stream.wait_event(order)?;
            ordered += 1;
        }
        Ok(ordered)
    }

    /// Enter a dispatch just enqueued on `stream`.
    pub(in crate::backend) fn enter(
        &self,
        stream: &Arc<Stream>,
        order: &Arc<Event>,
        accesses: Accesses,
    ) {
        if accesses.is_empty() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.push(Entry {
            stream: Arc::clone(stream),
            order: Arc::clone(order),
            accesses,
        });
        self.len.store(entries.len(), Ordering::Release);
    }

    /// Remove the dispatch of `stream` (it completed, or failed before running).
    pub(in crate::backend) fn leave(&self, stream: &Arc<Stream>) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|e| !Arc::ptr_eq(&e.stream, stream));
        self.len.store(entries.len(), Ordering::Release);
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
