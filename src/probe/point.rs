//! The probe points a dispatch path calls, and the per-thread accumulators they charge.
//!
//! Crate-private: the backend and the graph paths are the only callers (the `testing`
//! feature makes them public to the crate's own tests and benches, which drive
//! synthetic dispatches through them). A user sees only their effect, the lines.
//!
//! # Cost when off
//!
//! Every probe point ([`begin_dispatch`], [`mark`], [`count_with`], ...) costs one
//! relaxed load of a cached byte and reads no clock while the probe is off; [`charge`]
//! with the `None` that [`mark`] returned then costs nothing. Counts (IR nodes, PTX
//! bytes, ...) are passed as closures to [`count_with`] so they are only computed while
//! the probe is on.
//!
//! # Semantics
//!
//! * **Thread-local stack of accumulators.** [`begin_dispatch`] pushes a fresh
//!   accumulator on the calling thread's stack and returns a [`DispatchProbe`] guard;
//!   the free functions ([`charge`], [`add_phase_ns`], [`count_with`],
//!   [`note_ptx_cache`], ...) charge the accumulator on top of the calling thread's
//!   stack. A dispatch nested inside another one (a graph record, a helper dispatch)
//!   gets its own accumulator and its own line; the outer dispatch only sees the nested
//!   one's time inside whatever outer phase encloses it. Threads never share
//!   accumulators. Charges made while no dispatch is open on the thread (for example a
//!   `compile` outside any dispatch) are dropped.
//! * **Disjoint leaves.** The nine [`Phase`]s must not nest inside each other.
//! * **PTX cache counters** are per dispatch: the number of PTX source cache lookups
//!   that hit / missed inside this dispatch, reported through [`note_ptx_cache`].
//! * **`seq`** is a process-wide sequence number taken when the line is written, so
//!   lines of one thread appear in increasing `seq` order.
//! * **Wall.** `wall_ns` is the value the backend passes in [`DispatchTiming`]; when
//!   that is 0 (an untimed dispatch path) the probe substitutes the time from
//!   [`begin_dispatch`] to [`DispatchProbe::finish`].
//! * **Never an error or a panic** while on: arithmetic saturates, thread-local access
//!   during thread teardown is skipped.
//!
//! # Usage in a dispatch path
//!
//! ```text
//! let dispatch_probe = probe::begin_dispatch(); // None when off
//! let mark = probe::mark();
//! // ... binding plan, launch plan, validation ...
//! let mark = probe::charge_and_mark(Phase::Prepare, mark);
//! probe::count_with(Count::Buffers, || 9);
//! // ... readback ...
//! probe::charge(Phase::Readback, mark);
//! if let Some(dispatch_probe) = dispatch_probe {
//!     dispatch_probe.finish(DispatchTiming { wall_ns: 0, ..DispatchTiming::default() });
//! }
//! ```

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{
    enabled, encode_record, write_to_sink, Count, DispatchRecord, DispatchTiming, LineBuffer,
    Phase, SubPhase, COUNT_COUNT, LINE_CAPACITY, PHASE_COUNT, SUB_PHASE_COUNT,
};

/// Everything one open dispatch has been charged so far.
struct Accumulator {
    started: Instant,
    phases: [u64; PHASE_COUNT],
    sub_phases: [u64; SUB_PHASE_COUNT],
    counts: [u64; COUNT_COUNT],
    ptx_cache_hits: u64,
    ptx_cache_misses: u64,
    program: u64,
}

thread_local! {
    /// Open dispatches of this thread, innermost last.
    static STACK: RefCell<Vec<Accumulator>> = const { RefCell::new(Vec::new()) };
}

#[cfg(feature = "testing")]
thread_local! {
    /// Where finished lines go when a test captures them.
    static CAPTURE: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Process-wide line sequence number.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Runs `f` on the accumulator at `index` (or on top when `None`); skipped when
/// there is none, when the stack is borrowed, or during thread teardown.
fn with_accumulator(index: Option<usize>, f: impl FnOnce(&mut Accumulator)) {
    let _ = STACK.try_with(|stack| {
        if let Ok(mut stack) = stack.try_borrow_mut() {
            let slot = match index {
                Some(index) => stack.get_mut(index),
                None => stack.last_mut(),
            };
            if let Some(accumulator) = slot {
                f(accumulator);
            }
        }
    });
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// An open dispatch on this thread; returned by [`begin_dispatch`] only while
/// the probe is on. Call [`DispatchProbe::finish`] once the dispatch's timing
/// is known; dropping it without `finish` (an error path) discards the
/// dispatch's accumulator and prints nothing.
///
/// The guard is tied to its thread (`!Send`). Guards must end innermost first;
/// ending an outer guard also discards any inner accumulators still open above
/// it, whose later `finish` then prints nothing.
#[must_use = "call finish() to print the line; dropping discards the dispatch"]
pub struct DispatchProbe {
    index: usize,
    _thread_bound: PhantomData<*const ()>,
}

/// Opens a dispatch on this thread: `None` (one relaxed load) when the probe is
/// off. Call it first thing in a dispatch so its begin-to-finish time can stand
/// in for an unmeasured wall.
#[inline]
pub fn begin_dispatch() -> Option<DispatchProbe> {
    if !enabled() {
        return None;
    }
    begin_dispatch_on()
}

#[cold]
#[inline(never)]
fn begin_dispatch_on() -> Option<DispatchProbe> {
    STACK
        .try_with(|stack| {
            let mut stack = stack.try_borrow_mut().ok()?;
            let index = stack.len();
            stack.push(Accumulator {
                started: Instant::now(),
                phases: [0; PHASE_COUNT],
                sub_phases: [0; SUB_PHASE_COUNT],
                counts: [0; COUNT_COUNT],
                ptx_cache_hits: 0,
                ptx_cache_misses: 0,
                program: 0,
            });
            Some(DispatchProbe {
                index,
                _thread_bound: PhantomData,
            })
        })
        .ok()
        .flatten()
}

impl DispatchProbe {
    /// Adds `ns` to `phase` of this dispatch (saturating), whichever dispatch is on top
    /// of the thread's stack (tests of nesting).
    #[cfg(feature = "testing")]
    pub fn add_phase_ns(&self, phase: Phase, ns: u64) {
        with_accumulator(Some(self.index), |a| {
            let slot = &mut a.phases[phase.index()];
            *slot = slot.saturating_add(ns);
        });
    }

    /// Sets a count of this dispatch (tests of saturation and grouping).
    #[cfg(feature = "testing")]
    pub fn set_count(&self, count: Count, value: u64) {
        with_accumulator(Some(self.index), |a| a.counts[count.index()] = value);
    }

    /// Ends the dispatch and writes its line to the chosen sink (or, in tests, to the
    /// current `capture_lines` buffer). Returns the record that was printed, or `None`
    /// when the accumulator was already gone (an outer guard ended first).
    pub fn finish(self, timing: DispatchTiming) -> Option<DispatchRecord> {
        let accumulator = STACK
            .try_with(|stack| {
                let mut stack = stack.try_borrow_mut().ok()?;
                if stack.len() <= self.index {
                    return None;
                }
                stack.truncate(self.index + 1);
                stack.pop()
            })
            .ok()
            .flatten()?;
        let wall_ns = if timing.wall_ns == 0 {
            elapsed_ns(accumulator.started)
        } else {
            timing.wall_ns
        };
        let counts = accumulator.counts;
        let record = DispatchRecord {
            seq: SEQ.fetch_add(1, Ordering::Relaxed),
            nodes: counts[Count::Nodes.index()],
            ptx_bytes: counts[Count::PtxBytes.index()],
            buffers: counts[Count::Buffers.index()],
            bindings: counts[Count::Bindings.index()],
            fixpoint: counts[Count::Fixpoint.index()],
            grid_blocks: counts[Count::GridBlocks.index()],
            wall_ns,
            enqueue_ns: timing.enqueue_ns,
            wait_ns: timing.wait_ns,
            device_window_ns: timing.device_window_ns,
            kernel_ns: timing.kernel_ns,
            phases: accumulator.phases,
            sub_ptx_digest_ns: accumulator.sub_phases[SubPhase::PtxDigest.index()],
            sub_ptx_vsa_ns: accumulator.sub_phases[SubPhase::PtxVsa.index()],
            ptx_cache_hits: accumulator.ptx_cache_hits,
            ptx_cache_misses: accumulator.ptx_cache_misses,
            program: accumulator.program,
        };
        emit(&record);
        Some(record)
    }
}

impl Drop for DispatchProbe {
    fn drop(&mut self) {
        let _ = STACK.try_with(|stack| {
            if let Ok(mut stack) = stack.try_borrow_mut() {
                stack.truncate(self.index);
            }
        });
    }
}

fn note_cache(a: &mut Accumulator, hit: bool) {
    if hit {
        a.ptx_cache_hits = a.ptx_cache_hits.saturating_add(1);
    } else {
        a.ptx_cache_misses = a.ptx_cache_misses.saturating_add(1);
    }
}

/// Starts timing a phase: `Some(now)` while on, `None` (one relaxed load, no
/// clock read) while off. Pass the result to [`charge`] or [`charge_sub`].
#[inline]
pub fn mark() -> Option<Instant> {
    if enabled() {
        Some(Instant::now())
    } else {
        None
    }
}

/// Charges the time since `mark` to `phase` of this thread's innermost open
/// dispatch. `None` (probe off) does nothing.
#[inline]
pub fn charge(phase: Phase, mark: Option<Instant>) {
    if let Some(started) = mark {
        add_phase_ns(phase, elapsed_ns(started));
    }
}

/// Charges the time since `mark` to `sub_phase` (not part of the sum).
#[inline]
pub fn charge_sub(sub_phase: SubPhase, mark: Option<Instant>) {
    if let Some(started) = mark {
        add_sub_phase_ns(sub_phase, elapsed_ns(started));
    }
}

/// Charges the time since `mark` to `phase` and returns a new mark taken at the
/// same instant, for back-to-back phases with one clock read per boundary.
#[inline]
pub fn charge_and_mark(phase: Phase, mark: Option<Instant>) -> Option<Instant> {
    let started = mark?;
    let now = Instant::now();
    let ns = u64::try_from(now.saturating_duration_since(started).as_nanos()).unwrap_or(u64::MAX);
    add_phase_ns(phase, ns);
    Some(now)
}

/// Runs `f` and charges its time to `phase` (no clock read while off).
#[cfg(feature = "testing")]
#[inline]
pub fn timed<R>(phase: Phase, f: impl FnOnce() -> R) -> R {
    let started = mark();
    let result = f();
    charge(phase, started);
    result
}

/// Runs `f` and charges its time to `sub_phase` (no clock read while off).
#[cfg(feature = "testing")]
#[inline]
pub fn timed_sub<R>(sub_phase: SubPhase, f: impl FnOnce() -> R) -> R {
    let started = mark();
    let result = f();
    charge_sub(sub_phase, started);
    result
}

/// Adds `ns` to `phase` of this thread's innermost open dispatch (saturating),
/// for durations measured elsewhere. Does nothing while off (one relaxed load)
/// or when no dispatch is open.
pub fn add_phase_ns(phase: Phase, ns: u64) {
    if !enabled() {
        return;
    }
    with_accumulator(None, |a| {
        let slot = &mut a.phases[phase.index()];
        *slot = slot.saturating_add(ns);
    });
}

/// Adds `ns` to `sub_phase` of this thread's innermost open dispatch.
pub fn add_sub_phase_ns(sub_phase: SubPhase, ns: u64) {
    if !enabled() {
        return;
    }
    with_accumulator(None, |a| {
        let slot = &mut a.sub_phases[sub_phase.index()];
        *slot = slot.saturating_add(ns);
    });
}

/// Sets `count` of this thread's innermost open dispatch to `value()`; the
/// closure runs only while the probe is on and a dispatch is open, so a costly
/// count (a node walk) is never paid while off.
#[inline]
pub fn count_with(count: Count, value: impl FnOnce() -> u64) {
    if enabled() {
        with_accumulator(None, |a| a.counts[count.index()] = value());
    }
}

/// Records the identity of the program the open dispatch runs (printed as
/// `program=`, 16 hex digits; the report groups by it). `identity` is only called
/// while the probe is on; the backend passes the low 64 bits of the module key.
#[inline]
pub fn note_program(identity: impl FnOnce() -> u64) {
    if enabled() {
        with_accumulator(None, |a| a.program = identity());
    }
}

/// Records one PTX source cache lookup (hit or miss) of this thread's
/// innermost open dispatch. One relaxed load while off.
#[inline]
pub fn note_ptx_cache(hit: bool) {
    if enabled() {
        with_accumulator(None, |a| note_cache(a, hit));
    }
}

/// Runs `f` and returns, with its result, the probe lines finished on this
/// thread meanwhile (without newlines) instead of printing them to stderr.
/// Captures nest: an inner capture takes the lines finished inside it.
/// Capturing does not switch the probe on; see `override_enabled`. Test support (the
/// `testing` feature): a program collects lines with a `Sink::Callback`.
#[cfg(feature = "testing")]
pub fn capture_lines<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    /// Puts the outer capture back even when `f` panics.
    struct Restore(Option<Option<Vec<String>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                let _ = CAPTURE.try_with(|capture| {
                    if let Ok(mut capture) = capture.try_borrow_mut() {
                        *capture = outer;
                    }
                });
            }
        }
    }
    let outer = CAPTURE.with(|capture| capture.borrow_mut().replace(Vec::new()));
    let mut restore = Restore(Some(outer));
    let result = f();
    let outer = restore.0.take().unwrap_or_default();
    let lines = CAPTURE.with(|capture| std::mem::replace(&mut *capture.borrow_mut(), outer));
    (result, lines.unwrap_or_default())
}

/// Sends a finished record to the capture buffer (tests) or to the sink (one write).
fn emit(record: &DispatchRecord) {
    let mut buffer = LineBuffer {
        bytes: [0; LINE_CAPACITY],
        len: 0,
    };
    if encode_record(record, &mut buffer).is_none() || buffer.push(b"\n").is_none() {
        return;
    }
    let line = buffer.as_bytes();
    #[cfg(feature = "testing")]
    if captured(line) {
        return;
    }
    write_to_sink(record, line);
}

/// Appends `line` (newline included) to the current capture buffer; `false` when no
/// capture is open on this thread.
#[cfg(feature = "testing")]
fn captured(line: &[u8]) -> bool {
    CAPTURE
        .try_with(|capture| match capture.try_borrow_mut() {
            Ok(mut capture) => match capture.as_mut() {
                Some(lines) => {
                    let text = &line[..line.len() - 1];
                    // The line is ASCII, so the validating conversion always takes its
                    // fast path (the lossy one walked it chunk by chunk: 20 % of a
                    // probe-on dispatch's probe cost).
                    lines.push(match std::str::from_utf8(text) {
                        Ok(ascii) => ascii.to_owned(),
                        Err(_) => String::from_utf8_lossy(text).into_owned(),
                    });
                    true
                }
                None => false,
            },
            Err(_) => false,
        })
        .unwrap_or(false)
}
