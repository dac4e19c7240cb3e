//! Which slot a new lane request may take: a slot goes to the next request of its
//! turn only once the request it holds was delivered.
//!
//! # Why
//!
//! Request `n` uses slot `n mod slots` (the server's rule, `codegen::ptx::lane`): the
//! slot's record, staging, doorbell and result area. The server waits until the slot's
//! doorbell holds exactly `n + 1`, reads the record and the staging, and writes the
//! area, so the slot is request `n`'s until the host has read its area. The host used
//! to count a slot free as soon as a waiter took the request out of it (to wait without
//! the lane's lock), so on a lane shared by more threads than it has slots (`run` from
//! `slots + 1` threads, or requests waited for on another thread than the one that
//! submits) ticket `n + slots` could ring the slot while `n` was in flight: its doorbell
//! overwritten before the server saw `n + 1` (the server waits for it forever: every
//! waiter times out and the lane dies), its staging or record overwritten before the
//! server read them (`n` runs on another request's inputs, and nothing says so), or its
//! area rewritten while `n`'s waiter copied it out. And a submitter that found the
//! slot's request not yet taken out was refused with a `Fix:` error, so such a lane
//! also refused requests at random.
//!
//! # The rule
//!
//! Each slot has a busy flag beside the lane's lock ([`SlotGate`]). A submission sets
//! it when it rings the slot; the request's delivery clears it (`Release`) once it has
//! read every word of the area it needs (the server read the record and the staging
//! before it wrote the area's first word: the prologue runs before the first
//! workgroup). A submission looks at its ticket's slot under the lane's lock
//! ([`SlotGate::admit`]); while the slot is busy it lets go of the lock, waits (in the
//! lane's `WaitMode`) until the flag clears, takes the lock again and looks at the
//! ticket current then, all within the lane's timeout. The lock is free while it
//! waits, so the deliveries it waits for (each takes the lock) go on. A submission
//! keeps the lock from its look at the slot to its doorbell, so tickets ring in the
//! order the lock hands them out and the record routes (`DOORBELL_SAME`,
//! `DOORBELL_EARLIER`) follow the tickets, as before.
//!
//! A wait that runs out is a `Fix:` error, and the lane keeps serving: the request
//! waited for may be held, not waited for, by the very thread that submits (`slots`
//! requests submitted without a wait; or, with other threads submitting between, any
//! request of its own still pending), and only a wait for it frees its slot.
//!
//! # Cost
//!
//! A load of the flag and a store per submission, a store per delivery: no
//! read-modify-write, lock or system call on a request's path (x86-64 compiles each to
//! a plain move). Pure (the lock and the wait are the caller's), so the rule is tested
//! on the CPU against a server that follows the device's rules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::WaitStop;

/// Whether each slot of a lane holds a request not yet delivered (see the module docs).
pub(super) struct SlotGate {
    busy: Box<[AtomicBool]>,
}

impl SlotGate {
    /// `slots` free slots.
    pub(super) fn new(slots: usize) -> SlotGate {
        SlotGate {
            busy: (0..slots).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether `slot`'s last request was delivered (or none rang it). `Acquire`: the
    /// delivery's reads of the slot's area happen before what the caller writes next.
    pub(super) fn is_free(&self, slot: usize) -> bool {
        !self.busy[slot].load(Ordering::Acquire)
    }

    /// `slot` takes a request (under the lane's lock, before its doorbell rings; the
    /// lock orders this against other submissions, and the request's delivery learns
    /// of it through the submission's return).
    pub(super) fn occupy(&self, slot: usize) {
        self.busy[slot].store(true, Ordering::Relaxed);
    }

    /// `slot`'s request was delivered: its area is read, and the server is done with
    /// its record and staging.
    pub(super) fn free(&self, slot: usize) {
        self.busy[slot].store(false, Ordering::Release);
    }

    /// The lane's lock `guard`, given back once the slot of the next ticket
    /// (`slot_of(&guard)`) is free, and that slot. While it is busy the lock is let
    /// go, `wait(slot, left)` waits until it is free (at most `left`), `lock()` takes
    /// the lock again and the ticket current then is looked at; `timeout` bounds all
    /// the waits together. A wait's error ends it, with the slot it waited for.
    pub(super) fn admit<G>(
        &self,
        guard: G,
        lock: impl Fn() -> G,
        slot_of: impl Fn(&G) -> usize,
        timeout: Duration,
        mut wait: impl FnMut(usize, Duration) -> Result<(), WaitStop>,
    ) -> Result<(G, usize), (usize, WaitStop)> {
        let mut guard = guard;
        let mut started: Option<Instant> = None;
        loop {
            let slot = slot_of(&guard);
            if self.is_free(slot) {
                return Ok((guard, slot));
            }
            drop(guard);
            let left = timeout.saturating_sub(started.get_or_insert_with(Instant::now).elapsed());
            wait(slot, left).map_err(|stop| (slot, stop))?;
            guard = lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{poll_until, BackendError, WaitMode};
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;
    use std::thread;

    /// The host-mapped words of a lane of `slots` slots, one `u64` per slot each, as
    /// the server sees them: the doorbell (`n + 1`), the staging (the request's input,
    /// its ticket in the high half) and the area (the answer, the flag `n + 1` in the
    /// high half); and `stop`, set by whichever side gives up, so the other does not
    /// wait for it.
    struct Words {
        slots: u64,
        doorbells: Vec<AtomicU64>,
        staging: Vec<AtomicU64>,
        areas: Vec<AtomicU64>,
        stop: AtomicBool,
    }

    impl Words {
        fn new(slots: u64) -> Words {
            let words = || (0..slots).map(|_| AtomicU64::new(0)).collect();
            Words {
                slots,
                doorbells: words(),
                staging: words(),
                areas: words(),
                stop: AtomicBool::new(false),
            }
        }
    }

    /// What the server answers for an input.
    fn answer(input: u32) -> u32 {
        input.wrapping_mul(3).wrapping_add(1)
    }

    /// The server's rules (`codegen::ptx::lane`) for requests `0..requests`: request
    /// `n` waits until its slot's doorbell holds exactly `n + 1`, reads the slot's
    /// staging, works a little and writes its answer flagged `n + 1` into the slot's
    /// area. Why it could not go on: a doorbell rung for a later request before the
    /// server saw `n`'s (the device would wait for `n + 1` forever), a staging holding
    /// another request's input (it would run on them), or `stop` (a host gave up); it
    /// sets `stop` when it gives up.
    fn serve(words: &Words, requests: u64) -> Result<(), String> {
        serve_all(words, requests).inspect_err(|_| words.stop.store(true, Ordering::Relaxed))
    }

    fn serve_all(words: &Words, requests: u64) -> Result<(), String> {
        for n in 0..requests {
            let slot = (n % words.slots) as usize;
            let mut looks = 0u32;
            loop {
                let bell = words.doorbells[slot].load(Ordering::Acquire);
                if bell == n + 1 {
                    break;
                }
                if bell > n + 1 {
                    return Err(format!(
                        "request {n}: slot {slot}'s doorbell was rung for request {} before the \
                         server saw request {n}'s",
                        bell - 1
                    ));
                }
                if words.stop.load(Ordering::Relaxed) {
                    return Err(format!("stopped waiting for request {n}"));
                }
                looks = looks.wrapping_add(1);
                if looks.is_multiple_of(64) {
                    thread::yield_now();
                }
                std::hint::spin_loop();
            }
            let staged = words.staging[slot].load(Ordering::Relaxed);
            if staged >> 32 != n {
                return Err(format!(
                    "request {n}: slot {slot}'s staging holds request {}'s input",
                    staged >> 32
                ));
            }
            // A body's worth of work: the window in which a slot taken too early shows.
            for _ in 0..200 {
                std::hint::spin_loop();
            }
            let word = ((n + 1) << 32) | u64::from(answer(staged as u32));
            words.areas[slot].store(word, Ordering::Release);
        }
        Ok(())
    }

    /// When a delivery frees its slot.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Rule {
        /// Once its area was read (the rule).
        Delivered,
        /// As soon as its waiter took it out of the slot (the defect).
        Taken,
    }

    /// The host's side of a lane, as `LaneShared` does it: the lock over the next
    /// ticket, the gate.
    struct Host {
        submitted: Mutex<u64>,
        gate: SlotGate,
        timeout: Duration,
    }

    impl Host {
        fn new(slots: u64, timeout: Duration) -> Host {
            Host {
                submitted: Mutex::new(0),
                gate: SlotGate::new(slots as usize),
                timeout,
            }
        }

        /// `LaneShared::submit_request`'s share: admission, the staging, the flag, the
        /// doorbell, the next ticket. The ticket and slot taken.
        fn submit(&self, words: &Words, input: u32) -> Result<(u64, usize), (usize, WaitStop)> {
            let lock = || self.submitted.lock().unwrap();
            let (mut submitted, slot) = self.gate.admit(
                lock(),
                lock,
                |submitted| (**submitted % words.slots) as usize,
                self.timeout,
                |slot, left| {
                    poll_until(
                        WaitMode::SpinThenYield(Duration::ZERO),
                        left,
                        || self.gate.is_free(slot),
                        || match words.stop.load(Ordering::Relaxed) {
                            true => Err(BackendError::internal("the server gave up")),
                            false => Ok(()),
                        },
                    )
                    .map(drop)
                },
            )?;
            let ticket = *submitted;
            words.staging[slot].store((ticket << 32) | u64::from(input), Ordering::Relaxed);
            self.gate.occupy(slot);
            words.doorbells[slot].store(ticket + 1, Ordering::Release);
            *submitted += 1;
            Ok((ticket, slot))
        }

        /// `LaneShared::complete`'s share: take the request under the lock, wait for
        /// its area's flag, read the answer, free the slot when `rule` says. A flag of
        /// a later request (its area rewritten before it was read), a server that gave
        /// up, or no flag within the timeout is an error.
        ///
        fn deliver(
            &self,
            words: &Words,
            (ticket, slot): (u64, usize),
            rule: Rule,
        ) -> Result<u32, String> {
            {
                let _state = self.submitted.lock().unwrap();
                if rule == Rule::Taken {
                    self.gate.free(slot);
                }
            }
            let started = Instant::now();
            let word = loop {
                let word = words.areas[slot].load(Ordering::Acquire);
                let flag = word >> 32;
                if flag == ticket + 1 {
                    break word;
                }
                if flag > ticket + 1 {
                    return Err(format!(
                        "request {ticket}: its area was rewritten for request {}",
                        flag - 1
                    ));
                }
                if words.stop.load(Ordering::Relaxed) {
                    return Err(format!("request {ticket}: the server gave up"));
                }
                if started.elapsed() > self.timeout {
                    return Err(format!("request {ticket} was never answered"));
                }
                thread::yield_now();
            };
            if rule == Rule::Delivered {
                self.gate.free(slot);
            }
            Ok(word as u32)
        }
    }

    /// Locks out a slot handed to a new request before its request was delivered (a
    /// submitter on a shared lane overwrote the doorbell of a request the server had not
    /// seen yet: a lane that hangs), and an admission that holds the lane's lock while
    /// it waits (the delivery it waits for needs the lock), waits forever, or swallows
    /// a failed wait. On a lane of two slots with requests 0 and 1 rung and the server
    /// not yet at them, a waiter takes request 0 out of its slot; a submission from
    /// another thread must wait, with the lock free meanwhile, until request 0 was
    /// delivered, then take slot 0 as request 2, and all three requests get their own
    /// answers. A submission whose slot nobody frees ends with the timeout, and a wait
    /// that fails ends it with the failure. Negative control: freeing the slot when its
    /// request is taken out (the rule before) admits request 2 at once, and the server
    /// finds slot 0's doorbell rung for request 2 before it saw request 0's.
    #[test]
    fn a_slot_goes_to_a_new_request_only_after_its_delivery() {
        let long = Duration::from_secs(10);

        let (words, host) = (Words::new(2), Host::new(2, long));
        let first = host.submit(&words, 10).unwrap();
        host.submit(&words, 11).unwrap();
        host.gate.free(first.1); // what taking request 0 out of its slot did
        assert_eq!(host.submit(&words, 12).unwrap(), (2, 0));
        let refusal = serve(&words, 3).unwrap_err();
        assert!(refusal.contains("rung for request 2 before"), "{refusal}");

        let (words, host) = (Words::new(2), Host::new(2, long));
        let first = host.submit(&words, 10).unwrap();
        let second = host.submit(&words, 11).unwrap();
        let admitted = AtomicBool::new(false);
        thread::scope(|scope| {
            let late = scope.spawn(|| {
                let taken = host.submit(&words, 12);
                admitted.store(true, Ordering::Release);
                taken
            });
            thread::sleep(Duration::from_millis(50));
            assert!(
                !admitted.load(Ordering::Acquire),
                "request 2 took a busy slot"
            );
            // A waiter that held the lock would hold it at every look (nothing admits it).
            let free = (0..100).any(|_| {
                thread::sleep(Duration::from_millis(1));
                host.submitted.try_lock().is_ok()
            });
            assert!(free, "the lock was held while waiting");
            let server = scope.spawn(|| serve(&words, 3));
            assert_eq!(host.deliver(&words, first, Rule::Delivered), Ok(answer(10)));
            let third = late.join().unwrap().unwrap();
            assert_eq!(third, (2, 0));
            assert_eq!(
                host.deliver(&words, second, Rule::Delivered),
                Ok(answer(11))
            );
            assert_eq!(host.deliver(&words, third, Rule::Delivered), Ok(answer(12)));
            assert_eq!(server.join().unwrap(), Ok(()));
        });

        // Request 0 holds slot 0 and nobody waits for it.
        let short = Host::new(2, Duration::from_millis(20));
        let words = Words::new(2);
        short.submit(&words, 10).unwrap();
        short.submit(&words, 11).unwrap();
        let started = Instant::now();
        match short.submit(&words, 12) {
            Err((0, WaitStop::TimedOut)) => {}
            other => panic!(
                "expected the timeout on slot 0, got {:?}",
                other.map_err(|(slot, _)| slot)
            ),
        }
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(
            !short.gate.is_free(0),
            "a timed-out admission freed the slot"
        );
        assert_eq!(
            *short.submitted.lock().unwrap(),
            2,
            "a refused request took a ticket"
        );

        let lock = || short.submitted.lock().unwrap();
        let failed = short.gate.admit(
            lock(),
            lock,
            |_| 1,
            long,
            |_, _| {
                Err(WaitStop::Failed(BackendError::internal(
                    "the lane's kernel faulted",
                )))
            },
        );
        match failed {
            Err((1, WaitStop::Failed(error))) => assert!(error.to_string().contains("faulted")),
            _ => panic!("a failed wait must end the admission"),
        }
    }

    /// Locks out slots handed on before delivery, lost wake-ups and crossed answers on
    /// a lane shared by more threads than it has slots (the case that overwrote a
    /// doorbell the server had not seen, or a staging it had not read): lanes of 1, 2
    /// and 4 slots, each shared by twice as many threads, each thread submitting 150
    /// requests of its own inputs and delivering each before the next, against a
    /// server that follows the device's rules and reports a doorbell rung early or a
    /// staging overwritten. Every answer is its own request's and the server serves
    /// them all. Negative control, run by hand with `Rule::Taken` (the rule before) in
    /// the delivery: every run failed within 0.1 s (six of six as written, seven of
    /// seven with the 2- and 4-slot lanes alone), mostly with the server finding a
    /// slot's doorbell rung for a later request before it saw the one it waited for,
    /// otherwise with a host finding its area rewritten for a later request before it
    /// read it.
    #[test]
    fn more_threads_than_slots_get_their_own_answers() {
        const REQUESTS: u32 = 150;
        for slots in [1u64, 2, 4] {
            let threads = 2 * slots as u32;
            let words = Words::new(slots);
            let host = Host::new(slots, Duration::from_secs(10));
            let client = |thread: u32| -> Result<(), String> {
                for round in 0..REQUESTS {
                    let input = (thread << 16) | round;
                    let fail = |why: String| {
                        words.stop.store(true, Ordering::Relaxed);
                        format!("{slots} slots, thread {thread}, round {round}: {why}")
                    };
                    let taken = host
                        .submit(&words, input)
                        .map_err(|(slot, stop)| fail(format!("slot {slot}: {stop:?}")))?;
                    let got = host.deliver(&words, taken, Rule::Delivered).map_err(fail)?;
                    if got != answer(input) {
                        let own = answer(input);
                        return Err(fail(format!("answer {got:#x}, not its own {own:#x}")));
                    }
                }
                Ok(())
            };
            let (served, clients) = thread::scope(|scope| {
                let server = scope.spawn(|| serve(&words, u64::from(threads * REQUESTS)));
                let clients: Vec<_> = (0..threads)
                    .map(|thread| scope.spawn(move || client(thread)))
                    .collect();
                let clients: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
                (server.join().unwrap(), clients)
            });
            let failed: Vec<&String> = clients.iter().filter_map(|c| c.as_ref().err()).collect();
            assert_eq!(served, Ok(()), "{slots} slots; hosts: {failed:?}");
            assert!(failed.is_empty(), "{failed:?}");
        }
    }
}
