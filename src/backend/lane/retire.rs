//! Delivered lane requests that are not yet retired: which ones wait for the
//! completion word, when the host looks at it for them, and which ones a look
//! retires.
//!
//! # Why
//!
//! The server publishes a request's result words before its GPU-scope publish fence,
//! and stores the completion word after it (`codegen::ptx::lane`). With the fence
//! before the result words the readback phase took 0.96–1.06 µs on the H200
//! (2026-12-02), about 0.3 µs of it the fence, and the host's delivery waited for all
//! of it; behind them an earlier build measured 0.64–0.74 µs. The price is that a
//! delivered request's outputs in device memory are visible to later device work only
//! once its completion word is. Until then the request keeps its order-book entry
//! (later readers of its buffers wait for it) and its transient buffers (another
//! dispatch could get one from the pool while the request's last stores to it are in
//! flight), and this queue holds them.
//!
//! Looking at the completion word is one load of host memory, but retiring takes the
//! order book's lock and a pass over its entries, which every request used to pay at
//! its delivery. Requests over owned buffers alone (the usual one: it holds nothing)
//! retire in batches of [`RETIRE_BATCH`]: one look and one pass per batch, and the book
//! holds at most a batch of a lane's delivered requests besides its pending ones, so
//! the other dispatches' passes over it stay short. (The batch size is not measured on
//! its own; the dispatch bench's lane rows show the host's delivery.) A request that
//! holds transient buffers makes the next look due at once (every delivery and
//! submission looks while one waits), so the pool gets its memory back without waiting
//! for a batch. Pure: the completion word is a value passed in, so every rule here is
//! tested on the CPU.

use smallvec::SmallVec;

use super::super::dispatch::Held;
use super::completion_covers;

/// Delivered requests over owned buffers alone that wait for retirement before the
/// host looks at the completion word for them.
pub(super) const RETIRE_BATCH: usize = 8;

/// Tickets of order-book entries one look retires (inline up to two batches).
pub(super) type Served = SmallVec<[u64; 2 * RETIRE_BATCH]>;

/// A delivered request not yet retired.
pub(super) struct Retiring {
    pub(super) ticket: u64,
    pub(super) held: Held,
    /// Whether it has an order-book entry (it binds owned buffers).
    pub(super) booked: bool,
    /// Whether it holds transient buffers (its retirement is due at the next look).
    pub(super) transients: bool,
}

impl Retiring {
    /// Delivered request `ticket`, holding `held`, `booked` when it has an entry.
    pub(super) fn new(ticket: u64, held: Held, booked: bool) -> Retiring {
        let transients = !held.transients.is_empty();
        Retiring {
            ticket,
            held,
            booked,
            transients,
        }
    }

    /// Whether it has nothing to retire (no entry, no hold).
    pub(super) fn is_empty(&self) -> bool {
        !self.booked && !self.transients && self.held.is_empty()
    }
}

/// The delivered requests of one lane that wait for their completion word.
#[derive(Default)]
pub(super) struct RetireQueue {
    requests: Vec<Retiring>,
    /// How many of `requests` hold transient buffers.
    holding_transients: usize,
}

impl RetireQueue {
    /// An empty queue with room for `requests` (a warm lane's retirement allocates
    /// nothing).
    pub(super) fn with_capacity(requests: usize) -> RetireQueue {
        RetireQueue {
            requests: Vec::with_capacity(requests),
            holding_transients: 0,
        }
    }

    /// Add a delivered request (one with nothing to retire is not kept); whether a
    /// look at the completion word is due now ([`RetireQueue::due`]).
    pub(super) fn push(&mut self, request: Retiring) -> bool {
        if !request.is_empty() {
            self.holding_transients += usize::from(request.transients);
            self.requests.push(request);
        }
        self.due()
    }

    /// Whether the host should look at the completion word: a batch of requests
    /// gathered, or one of them holds transient buffers.
    pub(super) fn due(&self) -> bool {
        self.holding_transients > 0 || self.requests.len() >= RETIRE_BATCH
    }

    /// Whether a waiting request holds transient buffers.
    pub(super) fn holds_transients(&self) -> bool {
        self.holding_transients > 0
    }

    /// Whether no request waits.
    pub(super) fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The newest waiting request's ticket (the server serves in order, so its
    /// completion covers every other one).
    pub(super) fn newest(&self) -> Option<u64> {
        self.requests.iter().map(|request| request.ticket).max()
    }

    /// Take out every request a completion word holding `completed` covers: the
    /// tickets of those with an order-book entry go into `served`, and each one's
    /// holds to `release`. The others stay for the next look.
    pub(super) fn take_served(
        &mut self,
        completed: u32,
        served: &mut Served,
        mut release: impl FnMut(Held),
    ) {
        let mut index = 0;
        while index < self.requests.len() {
            if !completion_covers(completed, self.requests[index].ticket) {
                index += 1;
                continue;
            }
            let done = self.requests.swap_remove(index);
            if done.booked {
                served.push(done.ticket);
            }
            self.holding_transients -= usize::from(done.transients);
            release(done.held);
        }
    }

    /// Every waiting request's holds, the queue left empty (a lane that stopped or
    /// died: the caller releases or forgets them).
    pub(super) fn drain_holds(&mut self) -> impl Iterator<Item = Held> + '_ {
        self.holding_transients = 0;
        self.requests.drain(..).map(|request| request.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delivered request over owned buffers alone: an entry, no hold.
    fn owned(ticket: u64) -> Retiring {
        Retiring::new(ticket, Held::default(), true)
    }

    /// A delivered request holding transient buffers (no device here: the flag
    /// stands for them) and no entry.
    fn with_transients(ticket: u64) -> Retiring {
        Retiring {
            transients: true,
            ..Retiring::new(ticket, Held::default(), false)
        }
    }

    /// The completion word's value once request `ticket` was served.
    fn served_through(ticket: u64) -> u32 {
        ticket.wrapping_add(1) as u32
    }

    /// Retire what `completed` covers; the served tickets, sorted, and how many holds
    /// were released.
    fn look(queue: &mut RetireQueue, completed: u32) -> (Vec<u64>, usize) {
        let mut served = Served::new();
        let mut released = 0;
        queue.take_served(completed, &mut served, |_| released += 1);
        let mut served = served.into_vec();
        served.sort_unstable();
        (served, released)
    }

    /// Locks out a host that looks at the completion word (and locks the order book)
    /// for every delivered request over owned buffers, and one that never retires
    /// them: seven such requests make no look due, the eighth does, and a look whose
    /// completion word covers the first seven (the eighth's fence still running)
    /// retires exactly those seven, each entry left once, leaving the eighth for the
    /// next look (no longer due: one waits). Negative control: a completion word that
    /// covers none of them retires nothing, and the batch stays due.
    #[test]
    fn owned_buffer_requests_retire_a_batch_at_a_time() {
        let mut queue = RetireQueue::with_capacity(2 * RETIRE_BATCH);
        for ticket in 0..RETIRE_BATCH as u64 - 1 {
            assert!(
                !queue.push(owned(ticket)),
                "ticket {ticket} made a look due"
            );
        }
        assert!(queue.push(owned(RETIRE_BATCH as u64 - 1)));
        assert_eq!(look(&mut queue, 0), (vec![], 0), "nothing served yet");
        assert!(queue.due());
        let (served, released) = look(&mut queue, served_through(RETIRE_BATCH as u64 - 2));
        assert_eq!(served, (0..RETIRE_BATCH as u64 - 1).collect::<Vec<_>>());
        assert_eq!(released, RETIRE_BATCH - 1);
        assert!(!queue.due() && !queue.is_empty());
        assert_eq!(queue.newest(), Some(RETIRE_BATCH as u64 - 1));
        let (served, _) = look(&mut queue, served_through(RETIRE_BATCH as u64 - 1));
        assert_eq!(served, [RETIRE_BATCH as u64 - 1]);
        assert!(queue.is_empty() && queue.newest().is_none());
    }

    /// Locks out transient memory held back for a batch: a delivered request that holds
    /// transients makes a look due at once, stays due while its completion word has not
    /// come (every delivery and submission looks again), and once covered it is
    /// released with no order-book entry to leave (it had none); a request with neither
    /// an entry nor a hold is not kept at all. Negative control: the same request
    /// without transients (an owned-buffer request) makes no look due.
    #[test]
    fn a_request_holding_transients_retires_at_the_next_look() {
        let mut queue = RetireQueue::default();
        assert!(!queue.push(Retiring::new(3, Held::default(), false)));
        assert!(queue.is_empty(), "nothing to retire, nothing kept");
        assert!(!queue.push(owned(4)));
        assert!(queue.push(with_transients(5)));
        assert_eq!(look(&mut queue, served_through(3)), (vec![], 0));
        assert!(queue.due(), "still due while the transients wait");
        assert_eq!(look(&mut queue, served_through(5)), (vec![4], 2));
        assert!(!queue.due() && queue.is_empty());
        assert!(
            !queue.push(owned(6)),
            "an owned-buffer request alone waits for a batch"
        );
    }

    /// Locks out a retirement that misreads the 32-bit completion word after 2^32
    /// requests (the server counts tickets in a `u32`): requests on both sides of the
    /// wrap retire once the word covers them, and a word just below a ticket does not
    /// cover it. Negative control: compared as plain integers, the wrapped word (small)
    /// would cover nothing.
    #[test]
    fn retirement_reads_the_completion_word_across_its_wrap() {
        let mut queue = RetireQueue::default();
        let first = (1u64 << 32) - 2;
        for ticket in first..first + 4 {
            queue.push(owned(ticket));
        }
        let (served, _) = look(&mut queue, served_through(first));
        assert_eq!(served, [first]);
        let wrapped = served_through(first + 2);
        assert!(wrapped < 4, "the word wrapped");
        let (served, _) = look(&mut queue, wrapped);
        assert_eq!(served, [first + 1, first + 2]);
        assert_eq!(queue.newest(), Some(first + 3));
        assert!(
            u64::from(wrapped) < first + 1,
            "plain comparison would cover nothing"
        );
        assert_eq!(queue.drain_holds().count(), 1);
        assert!(queue.is_empty() && !queue.due());
    }
}
