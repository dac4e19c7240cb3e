//! Persistent lanes: a resident server kernel built from a set of compiled kernels,
//! serving the same [`Dispatch`] requests as a launch through host-mapped memory.
//!
//! # Why
//!
//! Every launch path sits near launch + synchronize: 3.7–3.9 µs of `cuLaunchKernel`
//! plus about 5.5 µs of `cuStreamSynchronize` on the H200 (untimed dispatches
//! 1.18–1.32 × that floor, graph replays 0.81 ×; measured 2026-12-01). That floor
//! belongs to the launch path: the same day a persistent one-block kernel polling a
//! host-mapped doorbell round-tripped in 3.14 µs (p99 3.14, p99.9 11.2) against 10.20 µs
//! for launch + synchronize of the same work. A host that runs the same small
//! programs thousands of times (a tokenizer encoding short prompts) pays a third of
//! the round trip through a lane.
//!
//! # What a lane is
//!
//! [`CudaBackend::lane`] writes the kernels' bodies and a server into one module
//! (`codegen::ptx::lane`), launches the server on a stream of its own with
//! [`LaneOptions::blocks`] resident blocks, and returns a [`Lane`]. [`Lane::run`],
//! [`Lane::run_into`] and [`Lane::submit`] take the same [`Dispatch`] request as
//! [`CudaBackend::run`], so switching a hot loop to a lane is one call. A request
//! writes its record (kernel, binding addresses and element counts, scalar values,
//! grid, zero fills, input copies, readback ranges) into host-mapped memory when it
//! changed (a new scalar value is a changed record, never a new module), its host
//! inputs into the slot's staging, and rings the slot's doorbell; the host then
//! spins (or yields, or sleeps: [`WaitMode`]) on the slot's host-mapped result area,
//! whose every 8-byte word carries 4 bytes of the header or the outputs and the
//! request's flag (`flagged`), until every word it needs carries the flag, and copies
//! the outputs out (one copy per stretch of adjacent items). No system-scope fence
//! is on a request's path (the server's `st.release.sys` of a completion word used
//! to hold it 0.61 µs of 4.22 µs on the H200, 2026-12-01; `codegen::ptx::lane`
//! argues the ordering), and the one GPU-scope fence comes after the result words, so
//! the delivery does not wait for it (see "Delivered is not retired"). Up to
//! [`LaneOptions::slots`] requests may be in flight; the kernel serves them in order.
//!
//! A repeat of one of the last four distinct requests (the same kernel, grid, fixpoint
//! count and readback of every output or none, over the same owned buffers at the same
//! addresses: the blocking dispatch's `Memo` match) skips planning, resolving its
//! bindings and placing its readback, which would give what the lane kept from that
//! request; it still checks its scalar values and the caller's slices, and writes and
//! compares its whole record unless it repeats the request that rang last with the same
//! scalar values (then its record is that one's, byte for byte, and the doorbell says
//! so). The host's share was what a lane request had left to shrink: on the H200
//! (2026-12-01, `VYRE_BENCH_LANES_ONLY=1 bench-dispatch`) a request of the 9-buffer
//! fixture spent 0.64 µs on the host before the doorbell and 0.41 µs delivering, of
//! 3.94 µs in all (1.42 and 0.82 of 5.44 µs at 17 buffers); the probe charged the plan
//! 0.35 µs, staging 0.24 and the record 0.28–0.31, nearly the same at 9 and 17
//! bindings. With the repeat path the same requests spent 0.28 / 0.30 µs before the
//! doorbell and 0.32 / 0.40 µs delivering (4.22 / 4.34 µs in all, the rest the
//! server's and the bus's).
//!
//! # Same semantics as a launch
//!
//! Workgroups beyond the lane's blocks run in turn, each with its workgroup memory
//! zeroed at entry and its own `local_id`/`workgroup_id` (every kernel of a lane has
//! one workgroup shape: the blocks'); `WriteOnly` bindings start zeroed and host,
//! zeroed and pinned bindings get fresh transient device buffers (filled or zeroed on
//! the device before the first workgroup); fixpoint iterations are separated by a
//! lane-wide barrier; outputs stay in owned buffers; each slot has its own area,
//! whose header carries the ticket it answered, so no byte of one request reaches
//! another. Grid sync is refused (a kernel with one cannot join a lane: the grid's
//! workgroups do not all run at once). Lane requests enter the backend's order book:
//! ordering against eager dispatches that share memory is kept on the host
//! (`backend::ordering`).
//!
//! # Delivered is not retired
//!
//! The server's publish fence (`fence.acq_rel.gpu`, which makes the request's outputs
//! in device memory visible at GPU scope) used to come before the result words, and
//! held every one of them: the readback phase took 0.96–1.06 µs on the H200
//! (2026-12-02), about 0.3 µs of it the fence, and the host's delivery waited for all
//! of it although the host reads no output through device memory. The fence now
//! follows the result words and precedes only the completion word (an earlier build
//! of this order measured the readback phase at 0.64–0.74 µs). So a delivered request's
//! outputs in device memory may still be on their way to L2 when the host has its
//! result words, and only the completion word says they arrived.
//!
//! The host therefore keeps a delivered request until its completion word covers it:
//! its order-book entry stays, so an eager dispatch, a blocking copy or clear
//! ([`CudaBackend::wait_for_lane_requests`]) or another lane's request that touches its
//! buffers waits for the completion word first, as for a request not yet delivered;
//! and its transient buffers stay out of the pool. On delivery its holds move into the
//! lane's `retiring` list, and [`LaneShared::retire`] releases them and takes the
//! entries out once the completion word covers them, looking at the word once per
//! [`RETIRE_BATCH`] delivered requests (the usual request, over owned buffers, holds
//! nothing: one look and one pass over the book per batch, not per request), and at
//! every delivery and submission while a retiring request holds transient memory. A
//! request holding transients waits for its own completion word (the publish fence,
//! a fraction of a microsecond) before its delivery returns, so that a lane used
//! once and then left idle does not keep them out of the pool; and a dispatch that
//! meets a delivered request in the book (over its buffers) retires it, and the rest
//! its completion word covers, once that word arrived, so an idle lane's entries do
//! not stay in every later dispatch's way. The book holds the lane weakly, so a
//! dropped lane still stops: its stop waits for its newest delivered request's
//! completion word and retires everything before the book forgets the lane.
//!
//! Requests of one lane need no host order among themselves, whatever its blocks: the
//! server runs them one after another (one block: on the same threads, with block
//! barriers between; several: no block starts a request before the previous one is
//! published, `codegen::ptx::lane`).
//!
//! A lane request cannot bind a host-mapped buffer
//! ([`CudaBackend::host_mapped_buffer`]): the server's one fence is GPU-scope, so its
//! stores into host memory are not ordered with the result words the host delivers
//! from, and a request holds no claim on an owned buffer, so
//! [`DeviceBuffer::mapped_bytes`](crate::backend::DeviceBuffer::mapped_bytes) could
//! read it while the request still writes. Such a binding is a `Fix:` error.
//!
//! # Placement
//!
//! How soon a request's words cross PCIe depends on where its host-mapped memory lies
//! *and* on the SM that serves it. On the H200 (2026-12-03, a one-block kernel
//! answering 600 host pings through each of ten fresh host-mapped allocations, from
//! six SMs in turn; median ping, ns): from SMs 24, 86 and 128 the pings took
//! 2,124–2,301 through seven of the allocations and 2,476–2,575 through the other
//! three; from SMs 3, 66 and 123 they took 2,363–2,495 through every one, the
//! slow three among the fastest there. The host's CPU does not matter (pinned to
//! each of the 16 cores in turn, one allocation's medians stayed within 0.1 µs). A
//! lane is one such pairing for its whole life: the sixteenth session measured lanes
//! of identical options at about 4.2 or 4.85 µs per (17, 62) request.
//!
//! So the server chooses. A lane allocates [`LaneOptions::memory_candidates`] copies
//! of its host-mapped memory (3 by default; each allocated before any is released,
//! so none reuses another's pages) and passes all of them to its kernel. Before it
//! serves anything, block 0's leader times, from its own SM, loads of each
//! candidate's lines that every request touches (the completion line, every doorbell
//! copy, each slot's first result-area line; the least of four loads each, summed),
//! keeps the candidate of least total, and tells the other blocks (a device word)
//! and the host (a word in the first candidate's completion line, which
//! [`CudaBackend::lane`] waits for, at most the timeout); every thread then serves
//! through it. The candidates it did not choose stay allocated until the lane stops
//! (about 0.8 MB each at the default slots and areas); the timing takes about 0.1 ms
//! per candidate when the lane starts. [`Lane::memory_placement`] says which it
//! chose; [`LaneOptions::memory_candidates`]`(1)` leaves the choice out.
//!
//! Why a device's own loads decide: in a second probe the same day, one block on each
//! of eight SMs in turn timed a load of each of ten allocations (the least of 16:
//! 992–1,248 ns) and then answered host pings through each; the allocation its loads
//! reached soonest was within 30 ns of the fastest by host ping from that SM in 7 of
//! 8 (on average 9 ns slower), where the slowest was 0.12–0.50 µs slower. In the
//! dispatch bench's lane rows (five runs, H200, 2026-12-03) the default lane served
//! (17, 62) in 4.02–4.35 µs; lanes of one candidate built beside it took 4.11–4.89,
//! both of one run 4.82 and 4.89.
//!
//! # Threads
//!
//! A [`Lane`] is `Send + Sync`: threads may share one and call [`Lane::run`],
//! [`Lane::run_into`] and [`Lane::submit`] at once, and a request may be waited for on
//! another thread than the one that submitted it. Tickets go out in the order of the
//! lane's lock, and request `n` uses slot `n mod slots` (the server's rule). A slot
//! takes a new request only once its last one was delivered (its area read; the server
//! read its record and staging before it wrote the area): a submission whose slot is
//! still busy lets go of the lock and waits, in the lane's [`WaitMode`], until that
//! request's waiter has delivered it, at most [`LaneOptions::timeout`] (then a `Fix:`
//! error, and the lane still serves). So more threads than slots queue for slots
//! instead of failing, and a thread that holds `slots` requests unwaited (or, while
//! other threads submit too, any request of its own) can wait for itself until the
//! timeout: wait for a request before submitting past the slots. `slots` argues the
//! rule (a slot counted free once its waiter took the request out used to let ticket
//! `n + slots` overwrite the doorbell or staging of a request the server had not read
//! yet); a request pays a load and two stores of the slot's flag for it, no lock or
//! system call.
//!
//! # Costs, stated
//!
//! - **Blocks.** The lane holds [`LaneOptions::blocks`] blocks (default 1) of its
//!   workgroup shape for its whole life: their SMs' share of threads, registers and
//!   shared memory (the record's 4 KiB plus the largest kernel's workgroup memory) is
//!   not available to other kernels, and a cooperative dispatch (a grid sync: every
//!   workgroup resident at once) beside a running lane gets the multiprocessors the
//!   lane leaves: a lane's block may take so much of its multiprocessor (its
//!   registers, its shared memory) that no workgroup of the grid fits beside it, and a
//!   cooperative grid that counted on that multiprocessor would wait for the lane to
//!   stop, which it never does on its own. So while lanes run in a context, a
//!   grid-sync dispatch there may have [`CudaBackend::coresident_workgroups`]
//!   workgroups, one multiprocessor's worth fewer per lane block than
//!   [`Kernel::max_coresident_workgroups`], and a larger grid is
//!   `GridTooLargeForGridSync` (the reference backend counts its lanes the same way).
//!   Eager dispatches and graph replays on other
//!   streams run beside it on the rest of the device. With several blocks the lane
//!   serves one request at a time: a block done with its share of a request waits until
//!   the request is published before any block starts the next (`codegen::ptx::lane`,
//!   "Requests of one lane").
//! - **A host thread.** Waiting spins on the result area's words by default
//!   ([`WaitMode::Spin`]: one core busy for the length of the request);
//!   [`WaitMode::SpinThenYield`] yields the core after a while, [`WaitMode::Sleep`]
//!   sleeps between looks (each costs wake-up latency; the dispatch bench's lane rows
//!   measure all three).
//! - **Poller warps.** By default ([`DEFAULT_LANE_POLLER_WARPS`]) each block also
//!   holds four warps beside the workgroup whose first threads poll block 0's doorbell,
//!   each on its own copy, staggered over a PCIe round trip, so a ring waits less for
//!   the next poll (`codegen::ptx::lane`, "Doorbell pollers", has the measurements).
//!   They take four warp slots and their registers on the lane's SMs; a lane of a
//!   multi-dimensional workgroup, or of one too wide to leave room in a block of 1,024
//!   threads, holds none or fewer ([`Lane::poller_warps`]), and
//!   [`LaneOptions::poller_warps`]`(0)` leaves them out.
//! - **Memory candidates.** A lane holds [`LaneOptions::memory_candidates`] copies of
//!   its host-mapped memory (default 3, about 0.8 MB each at the default slots and
//!   areas) for its whole life, of which it serves through one, and its start times
//!   each for about 0.1 ms (see "Placement").
//! - **Idle power.** While block 0's leader waits for a ticket, its pollers (or, with
//!   none, the leader itself) poll host memory over PCIe, one load in flight each (the
//!   others wait at a barrier); [`LaneOptions::poll_sleep`] makes every poller
//!   sleep between polls (`nanosleep`), trading wake-up latency for idle power. The
//!   `host_cost_lane_idle_power` instrument reads `nvidia-smi --query-gpu=power.draw`
//!   with and without an idle lane.
//! - **Releases wait.** Freeing device or pinned memory and unloading modules wait
//!   for an idle device, which a lane never is: while a lane runs, the backend queues
//!   those releases and makes them when the device's last lane stops (`driver`'s
//!   `resident`). Allocating is not queued and need not be (device, pinned and
//!   host-mapped allocations beside a lane finished on the H200).
//! - **Module loads wait.** Since CUDA 12.2 the driver loads modules lazily by default
//!   (`CUDA_MODULE_LOADING=LAZY`), and NVIDIA's programming guide warns that loading a
//!   kernel may need the context to synchronize, which deadlocks a program whose
//!   kernels wait on each other: a lane's kernel never finishes on its own. So while
//!   a lane runs under lazy loading, every module load (compiling a program not in
//!   the backend's cache, building another lane) is a `Fix:` error instead of a host
//!   that hangs ([`CudaBackend::lazy_module_loading`] says which mode the process
//!   runs in). Compile every kernel, and warm the eager paths a program uses beside a
//!   lane, before building it; or run the process with `CUDA_MODULE_LOADING=EAGER`.
//!   Build one lane at a time even so: under `EAGER`, a lane built while another ran
//!   hung the dispatch bench on the H200 (2026-12-02, before any row printed; which
//!   call waited was not isolated).
//!   Every module load finishes loading its kernels (`cuFuncLoad`) before it returns,
//!   so a kernel compiled before the lane launches beside it with nothing left to
//!   load. The guard is per process: a module load in another process on the same
//!   device is outside it.
//!
//! # Faults, timeouts, stop
//!
//! A kernel fault inside the lane is a [`BackendError::KernelFault`] naming the
//! program of the request being served; a wait longer than [`LaneOptions::timeout`]
//! is a `Fix:` error; after either the lane is dead and every later call says so.
//! Dropping the lane (its last handle: pending requests hold it) rings a stop and
//! waits for the kernel to leave, at most the timeout; a kernel that does not leave
//! (a body that never finishes) is abandoned with its memory rather than hanging the
//! host.

mod flagged;
mod mapped;
mod record;
mod retire;
mod slots;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::codegen::ptx::lane::{
    area_flag, lane_device_bytes, lane_doorbell_copies, DOORBELL_CHUNKS_SHIFT, DOORBELL_EARLIER,
    DOORBELL_RELOAD, DOORBELL_SAME, DOORBELL_STOP, MAX_STAMPED_SLOTS, PROLOGUE_ZERO, RECORD_BYTES,
};
use crate::codegen::{LaneModuleBuilder, LANE_ENTRY_NAME};
use crate::ir::Access;
use crate::lower;
use crate::probe::{self, Phase};

use super::cache::ModuleKey;
use super::dispatch::{
    address_on, count_for_probe, elapsed_ns, foreign_predecessor, kernel_identity, Held, Memo, Sink,
};
use super::driver::{self, DeviceMemory, LoadedModule, Stream};
use super::kernel::KernelInner;
use super::ordering::Accesses;
use super::plan::{
    check_output_slices, check_request_scalars, plan_request, RequestPlan, ScalarWords,
};
use super::request::Target;
use super::{
    BackendError, Binding, CudaBackend, Dispatch, Finished, Kernel, Outputs, PendingDispatch,
    PerBinding, Timings,
};

use flagged::{request_words, scrub_flag, scrub_window, split_into_items, Arrival, Landing};
use mapped::{AreaHeader, LaneMemory};
pub use record::MAX_LANE_KERNELS;
pub(in crate::backend) use record::{
    check_lane_blocks, check_lane_kernels, check_lane_request, check_lane_shared, lane_name,
    LaneKernelShape,
};
use record::{
    place_readbacks, record_route, write_record, Placed, PrologueOp, RecordParts, RecordRoute,
};
use retire::{RetireQueue, Retiring, Served, RETIRE_BATCH};
use slots::SlotGate;

/// Most resident blocks a lane may hold.
pub const MAX_LANE_BLOCKS: u32 = 1024;

/// Most request slots (requests in flight) of a lane.
pub const MAX_LANE_SLOTS: u32 = 16;
// The server keeps stamps per slot in its device words.
const _: () = assert!(MAX_LANE_SLOTS as usize <= MAX_STAMPED_SLOTS);

/// Largest result area or input staging per slot.
pub const MAX_LANE_AREA_BYTES: u32 = 64 << 20;

/// Most doorbell-polling warps a lane's block holds ([`LaneOptions::poller_warps`]).
pub use crate::codegen::ptx::lane::MAX_LANE_POLLER_WARPS;

/// Default [`LaneOptions::poller_warps`].
pub const DEFAULT_LANE_POLLER_WARPS: u32 = 4;

/// Most host-mapped allocations a lane's server chooses among
/// ([`LaneOptions::memory_candidates`]).
pub use crate::codegen::ptx::lane::MAX_LANE_CANDIDATES;

/// Default [`LaneOptions::memory_candidates`]: 3 (see the module docs' "Placement").
pub const DEFAULT_LANE_CANDIDATES: u32 = 3;

/// Longest sleep between the device's doorbell polls.
pub const MAX_LANE_POLL_SLEEP: Duration = Duration::from_millis(1);

/// The next lane's id ([`LaneShared::id`]).
static NEXT_LANE_ID: AtomicU64 = AtomicU64::new(0);

/// How a host thread waits for a lane request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitMode {
    /// Spin on the result area's words (`std::hint::spin_loop`): the lowest latency, one
    /// core busy while the request runs.
    #[default]
    Spin,
    /// Spin for the given time, then yield the core between looks
    /// (`std::thread::yield_now`).
    SpinThenYield(Duration),
    /// Sleep the given time between looks (`std::thread::sleep`; at least 1 µs): the
    /// core is free, each look costs a wake-up (tens of µs on Linux).
    Sleep(Duration),
}

/// How a lane is built and waited for. Defaults: 1 block, 4 slots, 64 KiB of result
/// area and of input staging per slot, [`WaitMode::Spin`], a 10 s timeout, no sleep
/// between the device's polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneOptions {
    /// Resident blocks (1 to [`MAX_LANE_BLOCKS`], and no more than the device can
    /// hold at once with the lane's kernel: checked at build, like a cooperative
    /// launch). More blocks run a request's workgroups in parallel.
    pub blocks: u32,
    /// Requests that may be in flight at once (1 to [`MAX_LANE_SLOTS`]); each has its
    /// own record, staging and result area.
    pub slots: u32,
    /// Bytes of each slot's result area: a 48-byte header, then every readback item
    /// 16-byte aligned (256 bytes to [`MAX_LANE_AREA_BYTES`], a multiple of 128). The
    /// host-mapped allocation holds twice this: every 4 bytes travel in an 8-byte word
    /// with the request's flag.
    pub result_bytes: u32,
    /// Bytes of each slot's host-mapped input staging for host and pinned bindings
    /// (0 to [`MAX_LANE_AREA_BYTES`], a multiple of 128).
    pub staging_bytes: u32,
    /// How the host waits.
    pub wait: WaitMode,
    /// Longest wait for one request (or for the kernel to stop); more than zero.
    pub timeout: Duration,
    /// Sleep of the device's polling thread between polls (`nanosleep`; zero spins;
    /// at most [`MAX_LANE_POLL_SLEEP`]).
    pub poll_sleep: Duration,
    /// Warps beside the workgroup in each block that poll the doorbell, each starting
    /// its polls a share of a PCIe round trip after the last (0 to
    /// [`MAX_LANE_POLLER_WARPS`]; 0: block 0's first thread polls). A lane holds fewer
    /// where its workgroup is not one-dimensional or the block has no room
    /// ([`Lane::poller_warps`] says how many it holds).
    pub poller_warps: u32,
    /// Host-mapped allocations the lane's server chooses among when it starts, by
    /// timing its own loads of each (1 to [`MAX_LANE_CANDIDATES`]; 1: no choice). The
    /// ones it does not choose stay allocated until the lane stops. See the module
    /// docs' "Placement".
    pub memory_candidates: u32,
}

impl Default for LaneOptions {
    fn default() -> Self {
        LaneOptions {
            blocks: 1,
            slots: 4,
            result_bytes: 64 << 10,
            staging_bytes: 64 << 10,
            wait: WaitMode::Spin,
            timeout: Duration::from_secs(10),
            poll_sleep: Duration::ZERO,
            poller_warps: DEFAULT_LANE_POLLER_WARPS,
            memory_candidates: DEFAULT_LANE_CANDIDATES,
        }
    }
}

impl LaneOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resident blocks.
    pub fn blocks(mut self, blocks: u32) -> Self {
        self.blocks = blocks;
        self
    }

    /// Requests in flight at once.
    pub fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// Bytes of each slot's result area.
    pub fn result_bytes(mut self, bytes: u32) -> Self {
        self.result_bytes = bytes;
        self
    }

    /// Bytes of each slot's input staging.
    pub fn staging_bytes(mut self, bytes: u32) -> Self {
        self.staging_bytes = bytes;
        self
    }

    /// How the host waits.
    pub fn wait(mut self, wait: WaitMode) -> Self {
        self.wait = wait;
        self
    }

    /// Longest wait for one request.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sleep of the device's poller between polls.
    pub fn poll_sleep(mut self, sleep: Duration) -> Self {
        self.poll_sleep = sleep;
        self
    }

    /// Doorbell-polling warps beside the workgroup.
    pub fn poller_warps(mut self, warps: u32) -> Self {
        self.poller_warps = warps;
        self
    }

    /// Host-mapped allocations the server chooses among.
    pub fn memory_candidates(mut self, candidates: u32) -> Self {
        self.memory_candidates = candidates;
        self
    }

    /// Every bound, each a `Fix:` error naming the field (the same checks on every
    /// backend).
    pub fn validate(&self) -> Result<(), BackendError> {
        let fix = |message: String| Err(BackendError::bad_input(message));
        if !(1..=MAX_LANE_BLOCKS).contains(&self.blocks) {
            return fix(format!(
                "Fix: LaneOptions::blocks is {}; use 1 to {MAX_LANE_BLOCKS}",
                self.blocks
            ));
        }
        if !(1..=MAX_LANE_SLOTS).contains(&self.slots) {
            return fix(format!(
                "Fix: LaneOptions::slots is {}; use 1 to {MAX_LANE_SLOTS}",
                self.slots
            ));
        }
        for (field, bytes, least) in [
            ("result_bytes", self.result_bytes, 256),
            ("staging_bytes", self.staging_bytes, 0),
        ] {
            if bytes < least || bytes > MAX_LANE_AREA_BYTES || !bytes.is_multiple_of(128) {
                return fix(format!(
                    "Fix: LaneOptions::{field} is {bytes}; use a multiple of 128 from {least} to \
                     {MAX_LANE_AREA_BYTES}"
                ));
            }
        }
        if self.timeout.is_zero() {
            return fix(
                "Fix: LaneOptions::timeout is zero, so every wait would fail at once; give the \
                 longest a request may take (default 10 s)"
                    .into(),
            );
        }
        if self.poll_sleep > MAX_LANE_POLL_SLEEP {
            return fix(format!(
                "Fix: LaneOptions::poll_sleep is {:?}; use at most {MAX_LANE_POLL_SLEEP:?} (each poll \
                 waits that long before it sees a new request)",
                self.poll_sleep
            ));
        }
        if self.poller_warps > MAX_LANE_POLLER_WARPS {
            return fix(format!(
                "Fix: LaneOptions::poller_warps is {}; use at most {MAX_LANE_POLLER_WARPS}",
                self.poller_warps
            ));
        }
        if !(1..=MAX_LANE_CANDIDATES).contains(&self.memory_candidates) {
            return fix(format!(
                "Fix: LaneOptions::memory_candidates is {}; use 1 (no choice) to \
                 {MAX_LANE_CANDIDATES}",
                self.memory_candidates
            ));
        }
        match self.wait {
            WaitMode::Sleep(interval) if interval < Duration::from_micros(1) => fix(format!(
                "Fix: WaitMode::Sleep({interval:?}) sleeps less than 1 µs; use WaitMode::Spin, or sleep \
                 at least 1 µs"
            )),
            WaitMode::Sleep(interval) if interval > self.timeout => fix(format!(
                "Fix: WaitMode::Sleep({interval:?}) sleeps longer than LaneOptions::timeout ({:?}), so a \
                 wait could not end on time; sleep less than the timeout",
                self.timeout
            )),
            _ => Ok(()),
        }
    }
}

/// A resident server kernel serving [`Dispatch`] requests of its kernels (see the
/// module docs). `Send + Sync`: threads may share it, more of them than it has slots
/// (a submission waits for its slot: the module docs' "Threads"); requests are served
/// in the order their doorbells ring. Dropping the last handle (pending requests hold
/// one) stops the kernel.
pub struct Lane {
    shared: Arc<LaneShared>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("kernels", &self.shared.kernels.len())
            .field("workgroup_size", &self.shared.workgroup_size)
            .field("options", &self.shared.options)
            .finish()
    }
}

/// The driver objects of a running lane (dropped only once its kernel stopped).
struct Resources {
    /// The allocation the server serves through (its choice: see the module docs'
    /// "Placement").
    memory: LaneMemory,
    /// The candidates it did not choose (before launch: every candidate but the
    /// first), kept until the lane stops.
    candidates: Vec<LaneMemory>,
    device: DeviceMemory,
    stream: Stream,
    module: LoadedModule,
}

impl Resources {
    /// Serve through candidate `chosen` (0: the first, which `memory` holds at launch).
    fn serve_through(&mut self, chosen: usize) {
        if let Some(candidate) = chosen.checked_sub(1) {
            std::mem::swap(&mut self.memory, &mut self.candidates[candidate]);
        }
    }
}

/// One request in a slot, rung and not yet delivered.
struct SlotRequest {
    ticket: u64,
    kernel: usize,
    held: Held,
    /// Whether it has an order-book entry (it binds owned buffers).
    booked: bool,
    deliveries: PerBinding<(usize, usize)>,
    item_bindings: PerBinding<u32>,
    enqueue_ns: u64,
}

/// One request slot, host side.
struct Slot {
    /// The record the device's cache of this slot holds (`cached`).
    record: Box<[u8; RECORD_BYTES]>,
    record_len: usize,
    cached: bool,
    request: Option<SlotRequest>,
    /// The window of 2^31 tickets its area was last scrubbed for (`flagged`; the
    /// allocation's zeros serve window 0).
    window: u64,
}

/// What submissions and deliveries share, under the lane's lock.
struct LaneState {
    /// Requests rung so far (the next ticket).
    submitted: u64,
    slots: Vec<Slot>,
    /// Delivered requests waiting for their completion word ([`LaneShared::retire`]).
    retiring: RetireQueue,
    /// The record being built.
    scratch: Box<[u8; RECORD_BYTES]>,
    /// The previous request's record (the blocks' shared copies hold it).
    last: Box<[u8; RECORD_BYTES]>,
    last_len: usize,
    /// The distinct record before `last` (the blocks' earlier copies hold it; empty
    /// before there was one).
    earlier: Box<[u8; RECORD_BYTES]>,
    earlier_len: usize,
    /// The last distinct requests' plans, for repeats of them.
    repeats: Box<[Repeat; REMEMBERED_REQUESTS]>,
    /// The entry of `repeats` the next request that repeats none of them plans into.
    next_repeat: usize,
    /// The entry of `repeats` of the request that rang last (its record is `last`).
    last_repeat: Option<usize>,
}

impl LaneState {
    /// The oldest of the slots' requests and `delivering` (a request its waiter took
    /// out of its slot) that `unserved` keeps: its ticket and kernel.
    fn oldest_request(
        &self,
        delivering: Option<(u64, usize)>,
        unserved: impl Fn(&(u64, usize)) -> bool,
    ) -> Option<(u64, usize)> {
        self.slots
            .iter()
            .filter_map(|slot| slot.request.as_ref())
            .map(|request| (request.ticket, request.kernel))
            .chain(delivering)
            .filter(unserved)
            .min_by_key(|&(ticket, _)| ticket)
    }
}

/// Distinct requests a lane remembers for repeats ([`Repeat`]): a loop of up to this
/// many requests in turn repeats each of them (a chain of dependent requests over
/// other buffers, such as the dispatch bench's chain of two, is one request after
/// another, each differing from the one before).
const REMEMBERED_REQUESTS: usize = 4;

/// The lane shared by its handle and its pending requests (the order book holds it
/// weakly).
pub(in crate::backend) struct LaneShared {
    /// Unique in the process: names the lane in the order book, where it is held
    /// weakly and may already be stopping.
    id: u64,
    backend: CudaBackend,
    kernels: Vec<Kernel>,
    keys: Vec<ModuleKey>,
    workgroup_size: [u32; 3],
    /// The server's block: the workgroup's shape, or its warps and the poller warps.
    block_shape: [u32; 3],
    poller_warps: u32,
    /// The host-mapped allocation the server chose (0 without a choice).
    placement: usize,
    options: LaneOptions,
    resources: Option<Box<Resources>>,
    state: Mutex<LaneState>,
    /// Which slots hold a request not yet delivered (`slots`: a slot takes a new
    /// request only once its last one was delivered).
    gate: SlotGate,
    /// Set once a fault, a timeout or a stop ended the lane; `dead_cause` says why.
    dead: AtomicBool,
    dead_cause: Mutex<Option<String>>,
    /// Pending requests ([`PendingDispatch`]s not yet waited for).
    pub(in crate::backend) pending: AtomicUsize,
    /// What the lane's stop (in its drop) said, for [`Lane::stop`], which drops the
    /// lane and then reads it here.
    stop_outcome: Arc<Mutex<Option<Result<(), BackendError>>>>,
}

/// A lane request submitted by [`Lane::submit`], inside its [`PendingDispatch`].
pub(in crate::backend) struct LaneTicket {
    pub(in crate::backend) lane: Arc<LaneShared>,
    pub(in crate::backend) ticket: u64,
    pub(in crate::backend) start: Instant,
    /// Bytes its outputs take (sized before the wait).
    pub(in crate::backend) output_bytes: usize,
}

/// What [`LaneShared::submit_request`] gives the caller.
struct Submitted {
    ticket: u64,
    /// The kernel's index in the lane.
    kernel: usize,
    /// Bytes of every readback item together.
    output_bytes: usize,
    /// The probe's mark.
    mark: Option<Instant>,
}

/// Empty outputs with room for `bytes`: the outputs' one allocation, made before the
/// wait (while the device works), not after it answered.
fn outputs_for(bytes: usize) -> Outputs {
    Outputs::with_capacity(bytes, None)
}

impl CudaBackend {
    /// Build a lane serving `kernels` (compiled by this backend; one workgroup shape,
    /// no grid sync) and launch its server kernel (see [`Lane`] and the module docs of
    /// `backend::lane`). One driver JIT of a module holding every kernel's body.
    ///
    /// Errors (each starting `Fix:`): options out of bounds
    /// ([`LaneOptions::validate`]), no kernel, kernels of another backend, two
    /// workgroup shapes, a grid sync, more than 64 buffers in a kernel, more blocks
    /// than the device holds at once, more shared memory than a block may have.
    pub fn lane(&self, kernels: &[&Kernel], options: LaneOptions) -> Result<Lane, BackendError> {
        options.validate()?;
        let inner = &self.inner;
        inner.check_alive()?;
        let cuda: Vec<&KernelInner> = kernels
            .iter()
            .map(|kernel| inner.cuda_kernel(kernel))
            .collect::<Result<_, _>>()?;
        let shapes: Vec<LaneKernelShape<'_>> = cuda
            .iter()
            .map(|kernel| LaneKernelShape {
                name: &kernel.name,
                workgroup_size: kernel.workgroup_size,
                grid_sync: kernel.grid_barrier.is_some(),
                global_buffers: kernel.slots.len(),
            })
            .collect();
        let workgroup_size = check_lane_kernels(&shapes)?;
        driver::load_lane_symbols().map_err(|_| BackendError::NoDriver {
            detail: "libcuda.so lacks cuStreamQuery or cuEventSynchronize, which lanes need; the \
                     driver is too old (need CUDA 12.0+)"
                .into(),
        })?;
        let caps = &inner.caps;
        let mut builder = LaneModuleBuilder::with_poller_warps(
            caps.ptx_target_sm(),
            caps.warp_size,
            workgroup_size,
            options.poller_warps,
        );
        for kernel in &cuda {
            let lowered = lower::lower_workgroup_reductions(&kernel.program, &inner.lowering);
            builder
                .push(&lowered, &kernel.codegen)
                .map_err(|error| BackendError::Codegen {
                    program: kernel.name.clone(),
                    error,
                })?;
        }
        check_lane_shared(builder.shared_bytes(), caps.max_shared_memory_per_block)?;
        let name = lane_name(&cuda[0].name, cuda.len());
        let block_shape = builder.block_shape();
        let poller_warps = builder.poller_warps();
        let ptx = builder.finish();
        inner.bind()?;
        let module = LoadedModule::load(&ptx, LANE_ENTRY_NAME, None).map_err(|error| {
            BackendError::module_load(name.clone(), caps.ptx_target_sm(), error)
        })?;
        let threads: u32 = block_shape.iter().product();
        let per_sm = module
            .max_active_blocks_per_sm(threads, 0)
            .map_err(|e| BackendError::driver("querying occupancy for a lane", e))?;
        let most = u64::from(per_sm) * u64::from(caps.sm_count);
        check_lane_blocks(&name, options.blocks, most)?;
        if options.blocks > 1 && !caps.cooperative_launch {
            return Err(BackendError::bad_input(
                "Fix: this device has no cooperative launch, which a lane of more than one block needs \
                 to be sure its blocks are resident together; use LaneOptions::blocks(1)",
            ));
        }
        let slots = options.slots as usize;
        // Every candidate is allocated before any is released, so each is memory of
        // its own (see the module docs' "Placement").
        let mut candidates = (0..options.memory_candidates)
            .map(|_| {
                LaneMemory::allocate(
                    slots,
                    lane_doorbell_copies(poller_warps),
                    options.result_bytes as usize,
                    options.staging_bytes as usize,
                )
                .map_err(|e| BackendError::driver("allocating a lane's host-mapped memory", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let memory = candidates.remove(0);
        let device_bytes = lane_device_bytes(slots);
        let device = DeviceMemory::allocate(device_bytes as u64)
            .map_err(|e| BackendError::driver("allocating a lane's device words", e))?;
        driver::copy_to_device_blocking(&device, &vec![0u8; device_bytes])
            .map_err(|e| BackendError::driver("zeroing a lane's device words", e))?;
        let stream =
            Stream::new().map_err(|e| BackendError::driver("creating a lane's stream", e))?;
        let resources = Resources {
            memory,
            candidates,
            device,
            stream,
            module,
        };
        let shared = Arc::new(LaneShared {
            id: NEXT_LANE_ID.fetch_add(1, Ordering::Relaxed),
            backend: self.clone(),
            kernels: kernels.iter().map(|&kernel| kernel.clone()).collect(),
            keys: cuda.iter().map(|kernel| kernel.module_key).collect(),
            workgroup_size,
            block_shape,
            poller_warps,
            placement: 0,
            options,
            resources: None,
            state: Mutex::new(LaneState {
                submitted: 0,
                slots: (0..slots)
                    .map(|_| Slot {
                        record: Box::new([0; RECORD_BYTES]),
                        record_len: 0,
                        cached: false,
                        request: None,
                        window: 0,
                    })
                    .collect(),
                // Room for a batch and the requests delivered before its look, so a
                // warm lane's retirement allocates nothing.
                retiring: RetireQueue::with_capacity(2 * RETIRE_BATCH + slots),
                scratch: Box::new([0; RECORD_BYTES]),
                last: Box::new([0; RECORD_BYTES]),
                last_len: 0,
                earlier: Box::new([0; RECORD_BYTES]),
                earlier_len: 0,
                repeats: Box::default(),
                next_repeat: 0,
                last_repeat: None,
            }),
            gate: SlotGate::new(slots),
            dead: AtomicBool::new(false),
            dead_cause: Mutex::new(None),
            pending: AtomicUsize::new(0),
            stop_outcome: Arc::default(),
        });
        let shared = LaneShared::launch(shared, resources, &name)?;
        // Each delivered request stays in the order book until its batch retires: room
        // for them now, not on a warm request.
        inner.in_flight.reserve(2 * RETIRE_BATCH + slots);
        Ok(Lane { shared })
    }
}

impl LaneShared {
    /// Launch the server kernel (from here on the backend defers releases that wait for
    /// an idle device) and put the resources in place.
    fn launch(
        mut shared: Arc<LaneShared>,
        resources: Resources,
        name: &str,
    ) -> Result<Arc<LaneShared>, BackendError> {
        let inner = &shared.backend.inner;
        let addresses = resources.memory.addresses();
        // Each other candidate's distance from the first (the layouts are the same).
        let delta = |index: usize| {
            resources.candidates.get(index).map_or(0, |candidate| {
                candidate
                    .addresses()
                    .completion
                    .wrapping_sub(addresses.completion)
            })
        };
        let mut words = [
            addresses.completion,
            addresses.doorbells,
            addresses.records,
            addresses.areas,
            addresses.staging,
            delta(0),
            delta(1),
            delta(2),
            resources.device.address(),
        ];
        let options = shared.options;
        let poll_sleep = u32::try_from(options.poll_sleep.as_nanos()).unwrap_or(u32::MAX);
        let area_stride = u32::try_from(resources.memory.area_stride()).unwrap_or(u32::MAX);
        let mut counts = [
            options.slots,
            area_stride,
            options.staging_bytes,
            poll_sleep,
            options.memory_candidates,
        ];
        let mut params: Vec<*mut std::ffi::c_void> = words
            .iter_mut()
            .map(|word| word as *mut u64 as *mut std::ffi::c_void)
            .chain(
                counts
                    .iter_mut()
                    .map(|count| count as *mut u32 as *mut std::ffi::c_void),
            )
            .collect();
        driver::resident_started(&inner.context, options.blocks);
        // SAFETY: `params` holds one pointer per parameter of the server entry, in the
        // order `codegen::ptx::lane::LANE_PARAMETERS` declares (nine u64 addresses and
        // distances, five u32s), each pointing at a live local for the duration of this call (the driver
        // copies the values at launch); every address names memory `resources` owns,
        // which stays alive until the kernel has stopped (`Drop for LaneShared`).
        let launched = unsafe {
            driver::launch(
                &resources.module,
                [options.blocks, 1, 1],
                shared.block_shape,
                &resources.stream,
                &mut params,
                options.blocks > 1,
            )
        };
        if let Err(error) = launched {
            driver::resident_stopped(&inner.context, options.blocks, true);
            if error.is_cooperative_launch_too_large() {
                return Err(BackendError::bad_input(format!(
                    "Fix: the device cannot hold {} blocks of {name} at once; use fewer LaneOptions::blocks",
                    options.blocks
                )));
            }
            return Err(inner.stream_failed(name, "launching a lane", error));
        }
        let chosen = shared.placement(&resources, name);
        let mut resources = resources;
        if let Ok(chosen) = chosen {
            resources.serve_through(chosen);
        }
        match Arc::get_mut(&mut shared) {
            Some(lane) => {
                lane.resources = Some(Box::new(resources));
                lane.placement = chosen.as_ref().map_or(0, |&chosen| chosen);
            }
            None => {
                return Err(BackendError::internal(
                    "a new lane was shared before it launched",
                ))
            }
        }
        // A failed choice leaves the lane to its drop: the stop, which waits at most the
        // timeout and abandons a kernel that does not leave.
        chosen?;
        Ok(shared)
    }

    /// The candidate the server chose (see the module docs' "Placement"): 0 without a
    /// choice; otherwise what its leader stored into the first candidate's placement
    /// word, waited for as a request is (a fault, checked as a request's wait checks it,
    /// or the timeout ends the wait).
    fn placement(&self, resources: &Resources, name: &str) -> Result<usize, BackendError> {
        if resources.candidates.is_empty() {
            return Ok(0);
        }
        let memory = &resources.memory;
        let waited = poll_until(
            self.options.wait,
            self.options.timeout,
            || memory.placement() != 0,
            || self.check_stream(resources, None),
        );
        match waited {
            Ok(_) => {
                let choice = memory.placement() - 1;
                if choice as usize > resources.candidates.len() {
                    return Err(BackendError::internal(format!(
                        "the lane {name} chose memory candidate {choice} of {}",
                        resources.candidates.len() + 1
                    )));
                }
                Ok(choice as usize)
            }
            Err(WaitStop::Failed(error)) => Err(error),
            Err(WaitStop::TimedOut) => Err(BackendError::bad_input(format!(
                "Fix: the lane {name} did not choose its host-mapped memory within \
                 LaneOptions::timeout ({:?}); give a longer timeout, or LaneOptions::memory_candidates(1)",
                self.options.timeout
            ))),
        }
    }

    /// The slot of request `ticket`, as the server computes it: from the ticket's low
    /// 32 bits (the server counts tickets in a `u32`, so after 2^32 requests a
    /// `u64` remainder would name another slot unless the slot count divides 2^32).
    fn slot_of(&self, ticket: u64) -> usize {
        (ticket as u32 % self.options.slots) as usize
    }

    /// The id of the backend the lane belongs to.
    pub(in crate::backend) fn backend_id(&self) -> u64 {
        self.backend.inner.id
    }

    /// The lane's id, unique in the process (the order book names it by this).
    pub(in crate::backend) fn id(&self) -> u64 {
        self.id
    }

    /// How long a dispatch waits for this lane's requests to leave the order book
    /// once it stops: its stop waits at most its timeout for the dispatches it was
    /// lent to and at most its timeout for its newest request, then forgets them all;
    /// a second more for the rest of the stop.
    pub(in crate::backend) fn stop_patience(&self) -> Duration {
        self.options
            .timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(1))
    }

    fn resources(&self) -> Result<&Resources, BackendError> {
        self.resources
            .as_deref()
            .ok_or_else(|| BackendError::internal("a lane was used after it stopped"))
    }

    fn lock(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Ok` while the lane serves requests; the `Fix:` error saying why it stopped.
    fn check_serving(&self) -> Result<(), BackendError> {
        if !self.dead.load(Ordering::Acquire) {
            return Ok(());
        }
        let cause = self
            .dead_cause
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "it was stopped".into());
        Err(BackendError::bad_input(format!(
            "Fix: this lane no longer serves requests ({cause}); drop it and build a new one with \
             CudaBackend::lane (or dispatch with run)"
        )))
    }

    /// End the lane for good, remembering why (the first cause wins). Its requests
    /// leave the order book: none will complete (a fault, a timeout), or every one did
    /// (a stop waits for its newest delivered request first), and a dispatch waiting for
    /// a stopping lane's entries waits until they leave.
    fn kill(&self, cause: String) {
        let mut slot = self.dead_cause.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(cause);
        }
        drop(slot);
        self.dead.store(true, Ordering::Release);
        self.backend.inner.in_flight.forget_lane(self.id);
    }

    /// The index in the lane of the kernel `target` names (a program is compiled
    /// through the backend's caches first), or the `Fix:` error saying it is not one.
    fn kernel_of(
        &self,
        target: Target<'_>,
        codegen: &crate::CodegenOptions,
        mark: Option<Instant>,
    ) -> Result<(usize, Option<Instant>), BackendError> {
        let inner = &self.backend.inner;
        let (kernel, mark) = inner.resolve(target, codegen, mark)?;
        let cuda = inner.cuda_kernel(&kernel)?;
        match self.keys.iter().position(|key| *key == cuda.module_key) {
            Some(index) => Ok((index, mark)),
            None => Err(not_in_lane(&cuda.name, &self.kernels)),
        }
    }

    fn kernel(&self, index: usize) -> Result<&KernelInner, BackendError> {
        let kernel = self
            .kernels
            .get(index)
            .ok_or_else(|| BackendError::internal("a lane request names no kernel"))?;
        self.backend.inner.cuda_kernel(kernel)
    }

    /// Host-side order after `request.after` (a lane's kernel never ends, so nothing
    /// can wait for another dispatch on the device).
    fn wait_after(
        self: &Arc<Self>,
        request: &Dispatch<'_>,
        name: &str,
    ) -> Result<(), BackendError> {
        use super::dispatch::{PendingOrigin, PendingState};
        let Some(previous) = request.after else {
            return Ok(());
        };
        let backend = self.backend.inner.id;
        match (&previous.origin, &previous.state) {
            // The device orders this lane's requests, whatever its blocks
            // (`codegen::ptx::lane`, "Requests of one lane").
            (PendingOrigin::Lane(lane), _) if Arc::ptr_eq(lane, self) => Ok(()),
            (PendingOrigin::Lane(lane), PendingState::Lane(ticket))
                if lane.backend.inner.id == backend =>
            {
                lane.wait_for(ticket.ticket, name)
            }
            (PendingOrigin::Cuda(other), PendingState::InFlight(in_flight, _))
                if other.inner.id == backend =>
            {
                let (stream, order) = in_flight.order_handles();
                order
                    .record(stream)
                    .and_then(|()| order.synchronize())
                    .map_err(|e| {
                        self.backend.inner.stream_failed(
                            name,
                            "waiting for the dispatch it runs after",
                            e,
                        )
                    })
            }
            (PendingOrigin::Cuda(other), _) if other.inner.id == backend => Ok(()),
            (PendingOrigin::Lane(lane), _) if lane.backend.inner.id == backend => Ok(()),
            _ => Err(foreign_predecessor(name)),
        }
    }

    /// Plan, stage, describe and ring one request. `probe_on` counts for the probe
    /// line. A repeat of a remembered request ([`Repeat`]) skips the plan, the
    /// staging and the placement: they would give what the lane kept.
    fn submit_request(
        self: &Arc<Self>,
        request: &Dispatch<'_>,
        sink: &Sink<'_, '_>,
        (start, mark): (Instant, Option<Instant>),
        probe_on: bool,
    ) -> Result<Submitted, BackendError> {
        self.check_serving()?;
        let inner = &self.backend.inner;
        inner.check_alive()?;

        // prepare: the kernel, the shared request plan, the launch and lane limits.
        let (index, mark) = self.kernel_of(request.target, &request.codegen, mark)?;
        let kernel = self.kernel(index)?;
        let identity = kernel_identity(kernel);
        // Outside the lane's lock: a wait for a predecessor on another lane or an eager
        // stream may take milliseconds, and the lane's other submitters and deliveries
        // need the lock meanwhile.
        self.wait_after(request, &kernel.name)?;
        let resources = self.resources()?;
        // The lock, once the next ticket's slot is free (its last request delivered),
        // kept until the doorbell: the ticket and slot cannot change meanwhile.
        let (mut state, slot) = self.admit(resources, &kernel.name)?;
        let state = &mut *state;
        // A delivered request's transients come back before this one takes its own
        // (a look is due while one waits; otherwise it waits for its batch).
        if state.retiring.due() {
            self.retire(state);
        }
        let address_of = |buffer: &_| address_on(inner, buffer);
        let found = state
            .repeats
            .iter()
            .position(|repeat| repeat.memo.describes(identity, request, address_of));
        let (entry, reused) = match found {
            Some(entry) => (entry, true),
            None => {
                let entry = state.next_repeat;
                state.next_repeat = (entry + 1) % REMEMBERED_REQUESTS;
                (entry, false)
            }
        };
        let repeat = &mut state.repeats[entry];
        repeat.memo.invalidate();
        if reused {
            // What the memo leaves out: the scalar values and the caller's slices.
            check_request_scalars(&kernel.name, kernel.program.scalars(), request)?;
            if let Sink::Slices(outputs) = sink {
                check_output_slices(&repeat.plan.reads, outputs)?;
            }
        } else {
            repeat.clear();
            plan_request(
                &kernel.name,
                (&kernel.slots, kernel.program.scalars()),
                &kernel.outputs,
                request,
                &mut repeat.plan,
            )?;
            if let Sink::Slices(outputs) = sink {
                check_output_slices(&repeat.plan.reads, outputs)?;
            }
            repeat.grid_blocks = inner.launch_plan(kernel, request.workgroups)?.grid_blocks;
            check_lane_plan(
                (&kernel.name, &kernel.slots),
                request,
                &repeat.plan,
                &self.options,
            )?;
        }
        if probe_on {
            count_for_probe(kernel, request, repeat.grid_blocks);
        }
        let mark = probe::charge_and_mark(Phase::Prepare, mark);

        // stage: the bindings' addresses, host inputs into the slot's staging.
        inner.bind()?;
        let ticket = state.submitted;
        debug_assert_eq!(slot, self.slot_of(ticket));
        debug_assert!(state.slots[slot].request.is_none());
        // A repeat binds owned buffers only: nothing to hold, stage or place.
        let held = if reused {
            Held::default()
        } else {
            if request.bindings.iter().any(Binding::is_transient) {
                inner.preflight(kernel, request.bindings, &repeat.plan.sizes)?;
            }
            self.stage(kernel, request, &repeat.plan, slot, &mut repeat.staged)?
        };
        let mark = probe::charge_and_mark(Phase::Stage, mark);

        // resolve: the readback placement and the record.
        if !reused {
            let sizes = &repeat.plan.sizes;
            let addresses = &repeat.staged.bindings;
            let placement = place_readbacks(
                &kernel.name,
                &repeat.plan.reads,
                |slot| {
                    let start = addresses[slot as usize].0;
                    start..start + sizes[slot as usize]
                },
                self.options.result_bytes as usize,
                &mut repeat.placed,
            );
            if let Err(e) = placement {
                self.release(held);
                return Err(e);
            }
            owned_accesses(
                &kernel.slots,
                request.bindings,
                addresses,
                &mut repeat.accesses,
            );
            repeat.item_bindings.extend(
                repeat
                    .plan
                    .reads
                    .iter()
                    .map(|read| kernel.slots[read.slot as usize].binding),
            );
        }
        let scalars = &request.scalars.words()[..kernel.program.scalars().len()];
        // A repeat of the request that rang last, with its scalar values, has its
        // record byte for byte (every other input of the record is what the repeat
        // kept, the kernel index fixed by the module key): the blocks' copies hold it,
        // and nothing is written or compared.
        let same_record =
            reused && state.last_repeat == Some(entry) && repeat.scalars.as_slice() == scalars;
        let (len, route) = if same_record {
            (state.last_len, RecordRoute::Same)
        } else {
            let parts = RecordParts {
                kernel: index as u32,
                iterations: request.fixpoint_iterations,
                grid: request.workgroups,
                bindings: &repeat.staged.bindings,
                scalars,
                prologue: &repeat.staged.prologue,
                placed: &repeat.placed,
            };
            let len = write_record(&parts, &mut state.scratch);
            let cached = &state.slots[slot];
            let route = record_route(
                &state.scratch[..len],
                &state.last[..state.last_len],
                &state.earlier[..state.earlier_len],
                cached.cached.then(|| &cached.record[..cached.record_len]),
            );
            (len, route)
        };
        let mark = probe::charge_and_mark(Phase::Resolve, mark);
        let mark = probe::charge_and_mark(Phase::Lease, mark);

        // launch: order on the host, the record, the doorbell.
        if let Err(e) = self.order(&repeat.accesses, &kernel.name) {
            self.release(held);
            return Err(e);
        }
        // The record's length, which the server reads when it loads the record (an
        // exchange only changes which of the blocks' two copies is current).
        let chunks = len as u64 / 16;
        let mut doorbell =
            u64::from(ticket.wrapping_add(1) as u32) | (chunks << DOORBELL_CHUNKS_SHIFT);
        match route {
            RecordRoute::Same => doorbell |= DOORBELL_SAME,
            RecordRoute::Earlier => doorbell |= DOORBELL_EARLIER,
            RecordRoute::Cached => {}
            RecordRoute::Reload => {
                let record = &state.scratch[..len];
                resources.memory.write_record(slot, record);
                let cached = &mut state.slots[slot];
                cached.record[..len].copy_from_slice(record);
                cached.record_len = len;
                cached.cached = true;
                doorbell |= DOORBELL_RELOAD;
            }
        }
        // As the blocks do: any record but the previous one becomes the previous, and
        // the previous becomes the earlier.
        if route != RecordRoute::Same {
            std::mem::swap(&mut state.scratch, &mut state.last);
            std::mem::swap(&mut state.scratch, &mut state.earlier);
            state.earlier_len = std::mem::replace(&mut state.last_len, len);
        }
        state.last_repeat = Some(entry);
        // The slot's first request of a window of 2^31 tickets finds no word a request
        // 2^32 tickets earlier left with its flag (`flagged`).
        if let Some(window) = scrub_window(state.slots[slot].window, ticket) {
            resources.memory.scrub_area(slot, scrub_flag(ticket));
            state.slots[slot].window = window;
        }
        // In the book before the doorbell: a dispatch that sees the entry waits for a
        // request that is (or is about to be) rung, never one that runs unseen. (The
        // book keeps no entry of a request that binds no owned buffer.)
        let booked = !repeat.accesses.is_empty();
        inner
            .in_flight
            .enter_lane(self, ticket, repeat.accesses.clone());
        self.gate.occupy(slot);
        resources.memory.ring(slot, doorbell);
        state.submitted += 1;
        let deliveries = &repeat.placed.deliveries;
        let output_bytes = deliveries.iter().map(|&(_, len)| len).sum();
        state.slots[slot].request = Some(SlotRequest {
            ticket,
            kernel: index,
            held,
            booked,
            deliveries: deliveries.clone(),
            item_bindings: repeat.item_bindings.clone(),
            enqueue_ns: elapsed_ns(start),
        });
        repeat.scalars.clear();
        repeat.scalars.extend_from_slice(scalars);
        if reused {
            repeat.memo.record(identity, request, (&[], true));
        } else {
            let addresses: PerBinding<u64> = repeat
                .staged
                .bindings
                .iter()
                .map(|&(address, _)| address)
                .collect();
            repeat.memo.record(identity, request, (&addresses, false));
        }
        let mark = probe::charge_and_mark(Phase::Launch, mark);
        Ok(Submitted {
            ticket,
            kernel: index,
            output_bytes,
            mark,
        })
    }

    /// The lane's lock, once the slot of the next ticket is free, and that slot
    /// (`slots`' rule: a slot takes a new request only once its last one was
    /// delivered). While it is busy the lock is let go and the caller waits in the
    /// lane's [`WaitMode`], at most [`LaneOptions::timeout`] in all; a dead lane or a
    /// fault ends the wait. `name` names the kernel for messages.
    fn admit(
        &self,
        resources: &Resources,
        name: &str,
    ) -> Result<(MutexGuard<'_, LaneState>, usize), BackendError> {
        let options = &self.options;
        let free = |slot: usize, left: Duration| {
            poll_until(
                options.wait,
                left,
                || self.gate.is_free(slot),
                || {
                    self.check_serving()?;
                    self.check_stream(resources, None)
                },
            )
            .map(drop)
        };
        self.gate
            .admit(
                self.lock(),
                || self.lock(),
                |state| self.slot_of(state.submitted),
                options.timeout,
                free,
            )
            .map_err(|(slot, stop)| match stop {
                WaitStop::TimedOut => BackendError::bad_input(format!(
                    "Fix: {name} waited LaneOptions::timeout ({:?}) for slot {slot} of this lane, whose \
                     request was not delivered (a lane has LaneOptions::slots = {} requests in flight, \
                     and a slot is free again once its request was waited for); wait for a \
                     PendingDispatch of this lane before submitting more (a thread that holds one \
                     unwaited can wait for itself), or build the lane with more slots",
                    options.timeout, options.slots
                )),
                WaitStop::Failed(error) => error,
            })
    }

    /// Every binding to a device address: owned buffers in place, host, zeroed and
    /// pinned bindings into transients (host bytes into the slot's staging, copied on
    /// the device), and the prologue's zero fills and copies.
    fn stage(
        &self,
        kernel: &KernelInner,
        request: &Dispatch<'_>,
        plan: &RequestPlan,
        slot: usize,
        staged: &mut Staged,
    ) -> Result<Held, BackendError> {
        let mut held = Held::default();
        match self.stage_into(kernel, request, plan, slot, staged, &mut held) {
            Ok(()) => Ok(held),
            Err(error) => {
                self.release(held);
                Err(error)
            }
        }
    }

    /// [`LaneShared::stage`] into `held` (released by the caller on an error).
    fn stage_into(
        &self,
        kernel: &KernelInner,
        request: &Dispatch<'_>,
        plan: &RequestPlan,
        slot: usize,
        staged: &mut Staged,
        held: &mut Held,
    ) -> Result<(), BackendError> {
        let inner = &self.backend.inner;
        let memory = &self.resources()?.memory;
        let mut staging = 0usize;
        for ((slot_decl, binding), &bytes) in
            kernel.slots.iter().zip(request.bindings).zip(&plan.sizes)
        {
            let reads_it = slot_decl.access != Access::WriteOnly;
            let count = (bytes >> slot_decl.elem.size_bytes().trailing_zeros()) as u32;
            let input: Option<&[u8]> = match binding {
                Binding::Host(data) => Some(data),
                Binding::Pinned(pinned) => Some(
                    pinned
                        .memory_for(inner, "dispatch with")?
                        .slice(0, bytes as usize),
                ),
                _ => None,
            };
            let address = match binding {
                // No hold on the buffer's memory (an atomic increment and decrement per
                // binding on the hot path): while the lane runs nothing of its context is
                // freed (`driver`'s `resident`), so a buffer dropped while this request is
                // pending keeps its memory, and its address, until the lane has stopped.
                Binding::Buffer(buffer) => {
                    let memory = buffer.memory_for(inner, "dispatch with")?;
                    if memory.host_mapped().is_some() {
                        return Err(host_mapped_on_a_lane(&kernel.name, &slot_decl.name));
                    }
                    memory.address()
                }
                Binding::Scratch(_) => {
                    return Err(super::dispatch::scratch_outside_a_graph(&kernel.name))
                }
                _ => inner.take_transient(bytes, held)?,
            };
            // `WriteOnly` starts zeroed (as a launch's clears), and so does a zeroed
            // transient the kernel reads.
            let zeroed =
                slot_decl.access == Access::WriteOnly || matches!(binding, Binding::Zeroed(_));
            if zeroed && bytes > 0 {
                staged.prologue.push(PrologueOp {
                    destination: address,
                    bytes: bytes as u32,
                    source: PROLOGUE_ZERO,
                });
            }
            if let (Some(data), true) = (input, reads_it) {
                if !data.is_empty() {
                    // Whole 16-byte units (the transient's bucket is at least 256 bytes
                    // and a power of two, so it holds them): the device copies them with
                    // vector loads, eight in flight per thread.
                    let padded = data.len().div_ceil(16) * 16;
                    memory.write_staging(slot, staging, data, padded - data.len());
                    staged.prologue.push(PrologueOp {
                        destination: address,
                        bytes: padded as u32,
                        source: staging as u32,
                    });
                    staging += padded;
                }
            }
            staged.bindings.push((address, count));
        }
        Ok(())
    }

    /// Wait, on the host, for every eager dispatch and every other lane's request in
    /// flight (or delivered and not yet retired) that shares written memory with this
    /// one (this lane's own are ordered on the device).
    fn order(self: &Arc<Self>, accesses: &Accesses, name: &str) -> Result<(), BackendError> {
        let inner = &self.backend.inner;
        let (events, lanes) = inner
            .in_flight
            .lane_conflicts(accesses, self)
            .map_err(|e| inner.stream_failed(name, "ordering it after a dispatch", e))?;
        for event in events {
            event.synchronize().map_err(|e| {
                inner.stream_failed(name, "waiting for a dispatch it shares memory with", e)
            })?;
        }
        inner.in_flight.wait_for_lanes(lanes, name)
    }

    /// Give transients back to the pool and drop the holds of a request that is done
    /// (its completion word seen) or never rang.
    fn release(&self, mut held: Held) {
        // A request of owned buffers holds nothing (the usual lane request): no driver
        // call for it.
        if held.is_empty() {
            return;
        }
        // The last hold of a buffer frees it in the backend's context (waits may run
        // on another thread than submissions).
        let _ = self.backend.inner.bind();
        for memory in held.transients.drain(..) {
            self.backend.inner.transients.put(memory);
        }
        held.buffers.clear();
        held.pinned.clear();
    }

    /// Wait for request `ticket` to complete (used by whatever must run after it);
    /// the `waiter` names what waits, for messages.
    pub(in crate::backend) fn wait_for(
        &self,
        ticket: u64,
        waiter: &str,
    ) -> Result<(), BackendError> {
        self.wait_ticket(ticket).map_err(|error| {
            tracing::debug!(waiter, %error, "a wait for a lane request failed");
            error
        })?;
        // What met the request was another dispatch over its memory, and the request
        // is served: retire it now rather than at the lane's next use, which may never
        // come (an idle lane's delivered requests would stay in the book, and every
        // dispatch over their buffers would wait for them here again). Not when the
        // lane's lock is taken: whoever holds it retires, or will.
        if let Ok(mut state) = self.state.try_lock() {
            self.retire(&mut state);
        }
        Ok(())
    }

    /// Whether request `ticket` has completed.
    fn served(&self, ticket: u64) -> Result<bool, BackendError> {
        Ok(completion_covers(
            self.resources()?.memory.completed(),
            ticket,
        ))
    }

    /// Spin (or yield, or sleep) until request `ticket` completes (the completion
    /// word); returns the host time waited. Past the timeout, or when the kernel
    /// faulted or ended, the lane is dead and the error says why.
    fn wait_ticket(&self, ticket: u64) -> Result<u64, BackendError> {
        if self.served(ticket)? {
            return Ok(0);
        }
        let memory = &self.resources()?.memory;
        self.wait_until(ticket, None, || {
            completion_covers(memory.completed(), ticket)
        })
    }

    /// Spin (or yield, or sleep) until `ready` says so (it is asked first); returns the
    /// host time waited. Past the timeout, or when the kernel faulted or ended, the
    /// lane is dead and the error says why (`ticket` names the request waited for;
    /// `delivering` is its kernel when the waiter already took it out of its slot, so
    /// that a fault report can still name it).
    fn wait_until(
        &self,
        ticket: u64,
        delivering: Option<usize>,
        ready: impl FnMut() -> bool,
    ) -> Result<u64, BackendError> {
        self.check_serving()?;
        let resources = self.resources()?;
        let options = &self.options;
        let delivering = delivering.map(|kernel| (ticket, kernel));
        poll_until(options.wait, options.timeout, ready, || {
            self.check_stream(resources, delivering)
        })
        .map_err(|stop| match stop {
            WaitStop::TimedOut => self.timed_out(ticket, delivering),
            WaitStop::Failed(error) => error,
        })
    }

    /// While waiting: a fault on the lane's stream (the kernel died) or an ended
    /// kernel kills the lane.
    fn check_stream(
        &self,
        resources: &Resources,
        delivering: Option<(u64, usize)>,
    ) -> Result<(), BackendError> {
        match resources.stream.query() {
            Ok(false) => Ok(()),
            Ok(true) => {
                let error =
                    BackendError::internal("a lane's kernel ended while the host waited for it");
                self.kill(error.to_string());
                Err(error)
            }
            Err(error) => {
                let program = self.serving_program(delivering);
                let inner = &self.backend.inner;
                let context_usable = !error.is_sticky();
                if !context_usable {
                    inner.mark_context_lost(format!("{program} faulted in a lane: {error}"));
                }
                self.kill(format!("{program} faulted in it: {error}"));
                Err(BackendError::KernelFault {
                    program,
                    error,
                    context_usable,
                })
            }
        }
    }

    /// The program of the oldest request not yet served (the one a fault hit), among
    /// the slots' requests and `delivering` (a request its waiter took out of its slot:
    /// ticket and kernel).
    fn serving_program(&self, delivering: Option<(u64, usize)>) -> String {
        let served = self
            .resources()
            .map(|resources| resources.memory.completed())
            .unwrap_or(0);
        let unserved = |&(ticket, _): &(u64, usize)| {
            (ticket.wrapping_add(1) as u32).wrapping_sub(served) as i32 > 0
        };
        let name =
            |(_, kernel): (u64, usize)| self.kernels.get(kernel).map(|k| k.name().to_string());
        // `try_lock`: a thread waiting for another lane while holding this one's lock
        // must not make this report wait (two lanes waiting on each other's timeout).
        let oldest = match self.state.try_lock() {
            Ok(state) => state.oldest_request(delivering, unserved),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                poisoned.into_inner().oldest_request(delivering, unserved)
            }
            Err(std::sync::TryLockError::WouldBlock) => delivering.filter(unserved),
        };
        oldest
            .and_then(name)
            .unwrap_or_else(|| "a lane request".to_string())
    }

    /// The timeout error (the lane is dead from here on).
    fn timed_out(&self, ticket: u64, delivering: Option<(u64, usize)>) -> BackendError {
        let program = self.serving_program(delivering);
        let timeout = self.options.timeout;
        self.kill(format!(
            "request {ticket} of {program} passed the {timeout:?} timeout"
        ));
        BackendError::bad_input(format!(
            "Fix: the lane request of {program} did not complete within LaneOptions::timeout \
             ({timeout:?}); the lane serves no more requests (its kernel may still be running it): give \
             longer requests a longer timeout, or cap runaway loops with \
             CodegenOptions::max_loop_iterations"
        ))
    }

    /// Wait for request `ticket` and deliver its outputs into `sink` (a packed sink
    /// made by [`outputs_for`] with the request's output bytes, so its one
    /// allocation happened while the device worked): the wait, the area's header
    /// check, the copy out, the slot's release.
    fn complete(
        self: &Arc<Self>,
        ticket: u64,
        start: Instant,
        sink: Sink<'_, '_>,
        mark: Option<Instant>,
    ) -> Result<Timings, BackendError> {
        let slot = self.slot_of(ticket);
        let resources = self.resources()?;
        let memory = &resources.memory;
        let mut state = self.lock();
        let request = match state.slots[slot].request.take() {
            Some(request) if request.ticket == ticket => request,
            other => {
                state.slots[slot].request = other;
                return Err(BackendError::internal("a lane request was delivered twice"));
            }
        };
        drop(state);
        // Every word of the header and the outputs carries the request's flag once it
        // arrived, in whatever order they travel (`flagged`); each lands in its place
        // as it is seen (`Landing`), so nothing is read again after the wait.
        let deliveries = &request.deliveries;
        let landed = match sink {
            Sink::Packed(out) => {
                let items = request.item_bindings.iter().copied();
                let lengths = deliveries.iter().map(|&(_, len)| len);
                // An `Option`, not a ready-made error: building one allocates, and a
                // warm request allocates its outputs' bytes alone (`gpu_zero_alloc`).
                let mut landed = None;
                out.push_filled(items.zip(lengths.clone()), |bytes| {
                    let destinations = split_into_items(bytes, lengths);
                    landed = Some(self.land(memory, (ticket, slot), &request, destinations));
                });
                landed.unwrap_or_else(|| Err(BackendError::internal("a lane's delivery never ran")))
            }
            Sink::Slices(out) => {
                let destinations = out.iter_mut().map(|bytes| &mut **bytes);
                self.land(memory, (ticket, slot), &request, destinations)
            }
        };
        let (wait_ns, header) = match landed {
            Ok(landed) => landed,
            Err(error) => {
                // The lane is dead: the request goes back to its slot (which stays
                // busy), whose holds the lane's stop releases (or forgets, while the
                // device may still use them).
                self.lock().slots[slot].request = Some(request);
                return Err(error);
            }
        };
        let mark = probe::charge_and_mark(Phase::Release, mark);
        let flag = area_flag(ticket);
        let result = if header.ticket != flag || header.status != 0 {
            Err(BackendError::internal(format!(
                "a lane's result area answered ticket {} with status {} where ticket {flag} was \
                 expected",
                header.ticket, header.status,
            )))
        } else {
            Ok(())
        };
        // Its area is read and the server is done with its record and staging: the
        // slot may take its next request (`slots`).
        self.gate.free(slot);
        // Delivered is not retired: the request keeps its order-book entry and its
        // transients until its completion word arrives.
        self.retire_later(ticket, request.held, request.booked);
        result?;
        probe::charge(Phase::Readback, mark);
        Ok(Timings {
            wall_ns: elapsed_ns(start),
            enqueue_ns: request.enqueue_ns,
            wait_ns,
            kernel_stamps_ns: header.end.saturating_sub(header.start),
            event_window_ns: None,
            lane_stamps: Some(header.stamps()),
        })
    }

    /// Wait until every word of request `ticket` in `slot` arrived, landing each in
    /// `destinations` (one per readback item) or the header as it is seen; the host
    /// time waited and the header.
    fn land<'a>(
        &self,
        memory: &LaneMemory,
        (ticket, slot): (u64, usize),
        request: &SlotRequest,
        destinations: impl IntoIterator<Item = &'a mut [u8]>,
    ) -> Result<(u64, AreaHeader), BackendError> {
        let flag = area_flag(ticket);
        let read = |word: usize| memory.area_word(slot, word);
        let mut landing = Landing::new(&request.deliveries, destinations);
        let mut arrival = Arrival::default();
        let waited = {
            let mut arrived = || {
                arrival.advance(
                    request_words(&request.deliveries),
                    read,
                    flag,
                    |range, first, data| landing.words(range, first, data),
                )
            };
            if arrived() {
                0
            } else {
                self.wait_until(ticket, Some(request.kernel), arrived)?
            }
        };
        Ok((waited, AreaHeader::from_words(&landing.header)))
    }

    /// Put delivered request `ticket` (holding `held`; `booked` when it has an
    /// order-book entry) among the requests waiting for their completion word, and
    /// retire them when a look is due (`retire`'s module docs say when).
    ///
    /// A request holding transient buffers is retired before this returns: its
    /// completion word follows its result words by the publish fence (a fraction of a
    /// microsecond), and a lane that is not used again would otherwise keep them out of
    /// the pool (and counted against the budget) until it is. A wait that fails (a
    /// fault, the timeout) leaves them to the lane's stop, which releases or forgets
    /// them; the delivered outputs stand.
    fn retire_later(&self, ticket: u64, held: Held, booked: bool) {
        let request = Retiring::new(ticket, held, booked);
        if request.is_empty() {
            return;
        }
        let transients = request.transients;
        let mut state = self.lock();
        if state.retiring.push(request) {
            self.retire(&mut state);
        }
        if !transients || !state.retiring.holds_transients() {
            return;
        }
        drop(state);
        match self.wait_ticket(ticket) {
            Ok(_) => self.retire(&mut self.lock()),
            Err(error) => {
                tracing::debug!(%error, "a delivered lane request's completion word never came")
            }
        }
    }

    /// Retire every delivered request the completion word covers: release its holds
    /// (transients back to the pool) and take its order-book entries out, all in one
    /// pass over the book. One load of the completion word (host memory) for the whole
    /// batch; the requests it does not cover yet wait for the next look.
    fn retire(&self, state: &mut LaneState) {
        if state.retiring.is_empty() {
            return;
        }
        let Ok(resources) = self.resources() else {
            return;
        };
        let completed = resources.memory.completed();
        let mut served = Served::new();
        state
            .retiring
            .take_served(completed, &mut served, |held| self.release(held));
        self.backend.inner.in_flight.leave_lane(self.id, &served);
    }

    /// Before the last handle goes (no request pending): stop the order book lending
    /// the lane to dispatches that meet its requests (they wait for them to leave the
    /// book instead, which the stop does), and wait, at most the lane's timeout, until
    /// the dispatches it was lent to are done with it (a lent lane's wait for a
    /// request is bounded by that timeout), so that the caller's drop of its handle is
    /// the lane's last and stops it on the caller's thread.
    fn wait_until_alone(self: &Arc<Self>) {
        if self.pending.load(Ordering::Acquire) > 0 {
            return;
        }
        self.backend.inner.in_flight.stop_lending_lane(self.id);
        let started = Instant::now();
        while Arc::strong_count(self) > 1 && started.elapsed() < self.options.timeout {
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Before a stop: wait for the newest delivered request's completion word (the
    /// server serves in order, so it covers every earlier one) and retire them all, so
    /// that the book forgets the lane only once its outputs are visible to later device
    /// work. Nothing to do when none waits, or when the context is gone (the stop
    /// abandons their holds then); a wait that fails (a fault, the timeout) leaves them
    /// to the stop's abandonment too.
    fn retire_before_stop(&self) {
        let newest = self.lock().retiring.newest();
        let Some(newest) = newest else {
            return;
        };
        let inner = &self.backend.inner;
        if inner.check_alive().is_err() || inner.bind().is_err() {
            return;
        }
        if self.wait_ticket(newest).is_ok() {
            self.retire(&mut self.lock());
        }
    }

    /// Ring the stop, wait (at most the timeout) for the kernel to leave, and release
    /// everything; a kernel that does not leave is abandoned with its memory.
    fn shut_down(&mut self) -> Result<(), BackendError> {
        if self.resources.is_none() {
            return Ok(());
        }
        self.retire_before_stop();
        let Some(resources) = self.resources.take() else {
            return Ok(());
        };
        self.kill("it was stopped".into());
        let inner = &self.backend.inner;
        let blocks = self.options.blocks;
        if inner.check_alive().is_err() || inner.bind().is_err() {
            // The context died with a fault: the kernel and every handle went with it.
            std::mem::forget(resources);
            driver::resident_stopped(&inner.context, blocks, false);
            self.abandon_requests(true);
            return Ok(());
        }
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let ticket = state.submitted;
        let slot = self.slot_of(ticket);
        resources.memory.ring(
            slot,
            u64::from(ticket.wrapping_add(1) as u32) | DOORBELL_STOP,
        );
        let started = Instant::now();
        let outcome = loop {
            match resources.stream.query() {
                Ok(true) => break Ok(()),
                Ok(false) if started.elapsed() < self.options.timeout => {
                    std::thread::sleep(Duration::from_micros(20))
                }
                Ok(false) => break Err(None),
                Err(error) => break Err(Some(error)),
            }
        };
        match outcome {
            Ok(()) => {
                driver::resident_stopped(&inner.context, blocks, true);
                self.abandon_requests(false);
                drop(resources);
                Ok(())
            }
            Err(Some(error)) => {
                let sticky = error.is_sticky();
                if sticky {
                    inner.mark_context_lost(format!("a lane faulted: {error}"));
                    std::mem::forget(resources);
                } else {
                    drop(resources);
                }
                driver::resident_stopped(&inner.context, blocks, !sticky);
                self.abandon_requests(sticky);
                Err(BackendError::KernelFault {
                    program: "a lane".into(),
                    error,
                    context_usable: !sticky,
                })
            }
            Err(None) => {
                // Still running: freeing anything it may use would wait forever (or let
                // it write freed memory), so its memory stays, and so do the device's
                // deferred releases.
                std::mem::forget(resources);
                self.abandon_requests(true);
                tracing::warn!(
                    timeout = ?self.options.timeout,
                    "a lane's kernel did not stop; it is abandoned with its memory"
                );
                Err(BackendError::bad_input(format!(
                    "Fix: the lane's kernel did not stop within LaneOptions::timeout ({:?}) (a request \
                     still runs); it is abandoned with its memory until the process ends: cap runaway \
                     loops with CodegenOptions::max_loop_iterations",
                    self.options.timeout
                )))
            }
        }
    }

    /// Requests never delivered (a dead lane), and delivered ones whose completion
    /// word was not seen: release their holds, or forget them when the device may still
    /// use the memory.
    fn abandon_requests(&mut self, forget: bool) {
        let inner = Arc::clone(&self.backend.inner);
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let undelivered = state
            .slots
            .iter_mut()
            .filter_map(|slot| slot.request.take())
            .map(|request| request.held);
        let retiring = state.retiring.drain_holds();
        for mut held in undelivered.chain(retiring) {
            if forget {
                std::mem::forget(held);
            } else {
                for memory in held.transients.drain(..) {
                    inner.transients.put(memory);
                }
            }
        }
    }
}

impl Drop for LaneShared {
    fn drop(&mut self) {
        let outcome = self.shut_down();
        *self.stop_outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
    }
}

/// Whether a completion word holding `completed` (the last ticket served, plus one,
/// in 32 bits) covers request `ticket`.
fn completion_covers(completed: u32, ticket: u64) -> bool {
    completed.wrapping_sub(ticket.wrapping_add(1) as u32) as i32 >= 0
}

/// Why a wait ended before its condition held.
#[derive(Debug)]
enum WaitStop {
    /// The timeout passed.
    TimedOut,
    /// The check of the kernel failed (a fault, or a kernel that ended).
    Failed(BackendError),
}

/// Ask `ready` in `wait` mode until it says so (it is asked first); returns the time
/// waited. The clock is read every `CLOCK_EVERY` looks (every look when sleeping),
/// and `check` (the stream: a fault, an ended kernel) runs only once a wait passes
/// `QUIET` and every `QUIET` after, so a request of microseconds pays neither; its
/// error ends the wait, and so does the timeout.
fn poll_until(
    wait: WaitMode,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
    mut check: impl FnMut() -> Result<(), BackendError>,
) -> Result<u64, WaitStop> {
    const CLOCK_EVERY: u32 = 256;
    const QUIET: Duration = Duration::from_micros(100);
    let started = Instant::now();
    let mut looks = 0u32;
    let mut next_query = QUIET;
    loop {
        if ready() {
            return Ok(elapsed_ns(started));
        }
        looks = looks.wrapping_add(1);
        if matches!(wait, WaitMode::Sleep(_)) || looks.is_multiple_of(CLOCK_EVERY) {
            let waited = started.elapsed();
            if waited >= next_query {
                next_query = waited + QUIET;
                check().map_err(WaitStop::Failed)?;
            }
            if waited >= timeout {
                return Err(WaitStop::TimedOut);
            }
            match wait {
                WaitMode::SpinThenYield(spin) if waited >= spin => std::thread::yield_now(),
                WaitMode::Sleep(interval) => std::thread::sleep(interval),
                _ => std::hint::spin_loop(),
            }
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The `Fix:` error for a kernel the lane was not built with (the same text on every
/// backend).
pub(in crate::backend) fn not_in_lane(name: &str, kernels: &[Kernel]) -> BackendError {
    let names: Vec<&str> = kernels.iter().take(4).map(Kernel::name).collect();
    let more = if kernels.len() > 4 { ", ..." } else { "" };
    BackendError::bad_input(format!(
        "Fix: {name} is not one of this lane's {} kernels ({}{more}); build a lane with it \
         (lane(&[...])) or dispatch it with run",
        kernels.len(),
        names.join(", ")
    ))
}

/// The `Fix:` error for a host-mapped buffer bound to a lane request. The server's
/// stores into host memory are not ordered with the request's result words (its one
/// fence is GPU-scope and comes after them), and a lane request holds no claim on an
/// owned buffer (see `stage_into`), so [`DeviceBuffer::mapped_bytes`] could read or
/// write the buffer while the lane still writes it.
///
/// [`DeviceBuffer::mapped_bytes`]: crate::backend::DeviceBuffer::mapped_bytes
fn host_mapped_on_a_lane(kernel: &str, binding: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: binding {binding} of {kernel} is a host-mapped DeviceBuffer, which a lane request \
         cannot bind (the lane does not order its writes to host memory with the request's \
         delivery); bind a device buffer (CudaBackend::buffer) and read what the host needs \
         through the request's readback, or dispatch this request with run"
    ))
}

/// The bindings a request resolves to.
#[derive(Default)]
struct Staged {
    /// `(device address, element count)` per binding.
    bindings: PerBinding<(u64, u32)>,
    prologue: PerBinding<PrologueOp>,
}

/// What a request's bindings ask of the lane before it runs.
pub(in crate::backend) struct LaneInputs {
    /// Staging bytes of host and pinned inputs (16-byte units).
    pub(in crate::backend) staging: u64,
    /// Zero fills and input copies.
    pub(in crate::backend) operations: usize,
    /// The largest of them, in bytes.
    pub(in crate::backend) largest: u64,
}

/// The lane rules of `request` to the kernel named `name` with `slots`, planned as
/// `plan`, on a lane built with `options` ([`check_lane_request`]; the same on every
/// backend).
pub(in crate::backend) fn check_lane_plan(
    (name, slots): (&str, &[super::plan::ParamSlot]),
    request: &Dispatch<'_>,
    plan: &RequestPlan,
    options: &LaneOptions,
) -> Result<(), BackendError> {
    let inputs = lane_inputs(slots, request.bindings, &plan.sizes);
    check_lane_request(
        name,
        request.workgroups,
        (&plan.reads, options.result_bytes as usize),
        (inputs.staging, options.staging_bytes as usize),
        (inputs.operations, inputs.largest),
    )
}

/// [`LaneInputs`] of `bindings` to `slots` bound with `sizes` bytes (pure).
fn lane_inputs(
    slots: &[super::plan::ParamSlot],
    bindings: &[Binding<'_>],
    sizes: &[u64],
) -> LaneInputs {
    let mut inputs = LaneInputs {
        staging: 0,
        operations: 0,
        largest: 0,
    };
    for ((slot, binding), &bytes) in slots.iter().zip(bindings).zip(sizes) {
        let mut operation = |bytes: u64| {
            inputs.operations += 1;
            inputs.largest = inputs.largest.max(bytes);
        };
        let write_only = slot.access == Access::WriteOnly;
        if (write_only || matches!(binding, Binding::Zeroed(_))) && bytes > 0 {
            operation(bytes);
        }
        if !write_only && matches!(binding, Binding::Host(_) | Binding::Pinned(_)) && bytes > 0 {
            let padded = bytes.div_ceil(16) * 16;
            operation(padded);
            inputs.staging += padded;
        }
    }
    inputs
}

/// The owned-buffer memory a request reads and writes (what the order book keeps),
/// pushed into `accesses`.
fn owned_accesses(
    slots: &[super::plan::ParamSlot],
    bindings: &[Binding<'_>],
    addresses: &[(u64, u32)],
    accesses: &mut Accesses,
) {
    for ((slot, binding), &(address, _)) in slots.iter().zip(bindings).zip(addresses) {
        if matches!(binding, Binding::Buffer(_)) {
            if slot.access == Access::ReadOnly {
                accesses.reads.push(address);
            } else {
                accesses.writes.push(address);
            }
        }
    }
}

/// A remembered request's plan and what it resolved to, kept under the lane's lock
/// so a repeat of it (the usual hot loop: one kernel over the same owned buffers, or
/// a chain of a few requests in turn) skips planning, staging and placing its
/// readback. `memo` says which request they were made for ([`Memo::describes`]: the
/// kernel, grid, fixpoint count, readback policy and every binding's buffer, length
/// and device address); everything the record holds follows from those and the
/// lane's options, except the kernel's index, which its module key fixes, and the
/// scalar values, which every request checks anew and writes into its record unless
/// the request repeats the one that rang last with its values (then the record is
/// that one's, byte for byte). A request with a host, zeroed or pinned binding or
/// byte ranges read back is never recorded, so never repeated; an entry's memo is
/// invalid from the start of a request that uses it until that request has rung, so
/// a request that failed halfway leaves nothing to reuse.
#[derive(Default)]
struct Repeat {
    memo: Memo,
    plan: RequestPlan,
    /// Blocks of the request's grid (the probe counts them).
    grid_blocks: u64,
    staged: Staged,
    placed: Placed,
    accesses: Accesses,
    /// The binding slot of each readback item's buffer.
    item_bindings: PerBinding<u32>,
    /// The scalar words of the request (its record holds them).
    scalars: ScalarWords,
}

impl Repeat {
    /// Empty every list a new plan fills (the memo is invalid already).
    fn clear(&mut self) {
        self.plan.sizes.clear();
        self.plan.reads.clear();
        self.staged.bindings.clear();
        self.staged.prologue.clear();
        self.placed.copies.clear();
        self.placed.deliveries.clear();
        self.accesses.reads.clear();
        self.accesses.writes.clear();
        self.item_bindings.clear();
    }
}

impl Lane {
    /// Run `request` on the lane and wait: the outputs (per its readback policy,
    /// addressable by buffer name) and [`Timings`] (`kernel_stamps_ns` from the
    /// server's stamps; no event window: a lane records no events). With the phase
    /// probe on, prints one probe line like a dispatch.
    pub fn run(&self, request: Dispatch<'_>) -> Result<Finished, BackendError> {
        let mut outputs = Outputs::default();
        let (index, timings) = self.finish(&request, Sink::Packed(&mut outputs))?;
        outputs.name_by(self.shared.kernels[index].clone());
        Ok(Finished { outputs, timings })
    }

    /// Run `request` and read its outputs into caller buffers, one per readback item,
    /// each exactly the item's length. Returns the [`Timings`].
    pub fn run_into(
        &self,
        request: Dispatch<'_>,
        outputs: &mut [&mut [u8]],
    ) -> Result<Timings, BackendError> {
        self.finish(&request, Sink::Slices(outputs))
            .map(|(_, timings)| timings)
    }

    fn finish(
        &self,
        request: &Dispatch<'_>,
        mut sink: Sink<'_, '_>,
    ) -> Result<(usize, Timings), BackendError> {
        let dispatch_probe = probe::begin_dispatch();
        let start = Instant::now();
        let mark = dispatch_probe.as_ref().map(|_| start);
        let shared = &self.shared;
        let submitted =
            shared.submit_request(request, &sink, (start, mark), dispatch_probe.is_some())?;
        if let Sink::Packed(out) = &mut sink {
            **out = outputs_for(submitted.output_bytes);
        }
        let timings = shared.complete(submitted.ticket, start, sink, submitted.mark)?;
        if let Some(dispatch_probe) = dispatch_probe {
            dispatch_probe.finish(timings.probe());
        }
        Ok((submitted.kernel, timings))
    }

    /// Ring `request` and return at once: host inputs are in the slot's staging
    /// before this returns. Up to [`LaneOptions::slots`] may be pending; the lane
    /// serves them in order, so a chain of dependent requests needs no `after`.
    /// [`PendingDispatch::wait`] gives what [`Lane::run`] would have returned.
    ///
    /// A request whose slot still holds an undelivered one waits (before ringing) until
    /// that one was waited for, on whatever thread, at most [`LaneOptions::timeout`];
    /// past it, a `Fix:` error. A thread that submits past the slots without waiting
    /// waits for itself until then (see the module docs' "Threads").
    pub fn submit(&self, request: Dispatch<'_>) -> Result<PendingDispatch, BackendError> {
        let start = Instant::now();
        let shared = &self.shared;
        // Outputs are delivered at `wait`; the sink only tells the plan there are no
        // caller slices to check.
        let mut unused = Outputs::default();
        let submitted =
            shared.submit_request(&request, &Sink::Packed(&mut unused), (start, None), false)?;
        shared.pending.fetch_add(1, Ordering::AcqRel);
        Ok(PendingDispatch::lane(
            shared.kernels[submitted.kernel].clone(),
            LaneTicket {
                lane: Arc::clone(shared),
                ticket: submitted.ticket,
                start,
                output_bytes: submitted.output_bytes,
            },
        ))
    }

    /// Stop the lane's kernel now (as dropping it does) and say how it went: `Ok` when
    /// it left, a `KernelFault` when it had faulted, a `Fix:` error when it did not
    /// leave within the timeout (it is abandoned with its memory) or when requests of
    /// it are still pending (wait for them first).
    ///
    /// Another dispatch that met one of the lane's requests in the order book may be
    /// waiting for its completion word on another thread, holding the lane meanwhile;
    /// the stop waits for it (at most the lane's timeout), so that the stop runs here
    /// and its outcome is this call's.
    pub fn stop(self) -> Result<(), BackendError> {
        let pending = self.shared.pending.load(Ordering::Acquire);
        if pending > 0 {
            return Err(BackendError::bad_input(format!(
                "Fix: {pending} requests of this lane are still pending; wait for every \
                 PendingDispatch of it before stopping it (dropping the lane stops it once the \
                 last is done)"
            )));
        }
        let outcome = Arc::clone(&self.shared.stop_outcome);
        let timeout = self.shared.options.timeout;
        // The drop waits until this handle is the lane's last, and the lane's own drop
        // then stops it on this thread and leaves its outcome.
        drop(self);
        let stopped = outcome.lock().unwrap_or_else(|p| p.into_inner()).take();
        stopped.unwrap_or_else(|| {
            Err(BackendError::bad_input(format!(
                "Fix: another thread still waited for a request of this lane after \
                 LaneOptions::timeout ({timeout:?}) (a dispatch over memory the request binds), \
                 so the lane stops when that wait ends, on that thread; stop a lane once the \
                 dispatches that share its buffers are done"
            )))
        })
    }

    /// Whether the lane still serves requests (no fault, timeout or stop).
    pub fn is_serving(&self) -> bool {
        self.shared.check_serving().is_ok()
    }

    /// Its kernels, in body order.
    pub fn kernels(&self) -> &[Kernel] {
        &self.shared.kernels
    }

    /// Its workgroup shape (every kernel's).
    pub fn workgroup_size(&self) -> [u32; 3] {
        self.shared.workgroup_size
    }

    /// The options it was built with.
    pub fn options(&self) -> &LaneOptions {
        &self.shared.options
    }

    /// The doorbell-polling warps each of its blocks holds beside the workgroup
    /// ([`LaneOptions::poller_warps`], or fewer where the workgroup leaves no room).
    pub fn poller_warps(&self) -> u32 {
        self.shared.poller_warps
    }

    /// Which of its [`LaneOptions::memory_candidates`] host-mapped allocations the
    /// lane's server chose (0 with one candidate; see the module docs' "Placement").
    pub fn memory_placement(&self) -> usize {
        self.shared.placement
    }
}

impl Drop for Lane {
    /// Stop the lane here when this is its last handle: the order book lends the lane
    /// to a dispatch that waits for one of its requests (a moment's strong hold), and
    /// without this wait that dispatch's thread could be the one to drop it last, and
    /// so to stop it. Pending requests hold the lane too: then the last of them stops
    /// it, as documented.
    fn drop(&mut self) {
        self.shared.wait_until_alone();
    }
}

impl CudaBackend {
    /// Whether the driver loads modules lazily (`CUDA_MODULE_LOADING=LAZY`, its default
    /// since CUDA 12.2). While a lane runs, lazy loading makes every module load (a
    /// `compile` of a program not compiled yet, a new lane) a `Fix:` error instead of
    /// a host that waits for the lane forever (see the module docs of `backend::lane`).
    pub fn lazy_module_loading(&self) -> bool {
        driver::lazy_module_loading()
    }

    /// Dispatches and lane requests in the backend's order book now (test support:
    /// an eager dispatch leaves it when it completes, a lane request when it retires).
    #[cfg(feature = "testing")]
    pub fn order_book_entries(&self) -> usize {
        self.inner.in_flight.len()
    }

    /// Releases (device, pinned and mapped memory, modules) queued because a lane of
    /// this device runs (test support: they are made when its last lane stops).
    #[cfg(feature = "testing")]
    pub fn deferred_releases(&self) -> Result<usize, BackendError> {
        self.inner.bind()?;
        Ok(driver::deferred_releases())
    }
}

impl LaneTicket {
    /// Wait for the request and deliver its outputs.
    pub(in crate::backend) fn finish(&self, kernel: &Kernel) -> Result<Finished, BackendError> {
        let mut outputs = outputs_for(self.output_bytes);
        let timings =
            self.lane
                .complete(self.ticket, self.start, Sink::Packed(&mut outputs), None)?;
        outputs.name_by(kernel.clone());
        Ok(Finished { outputs, timings })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a host that waits forever, or delivers, while a request's words are
    /// only partly there: a wait whose words never all arrive ends with the timeout, a
    /// fault reported while they are partial ends it with the fault, and a wait whose
    /// words arrive after a few looks returns once they did. Negative control: the
    /// fault check is not asked when the words are there at the first look.
    #[test]
    fn a_partial_delivery_ends_in_the_timeout_or_the_fault() {
        let short = Duration::from_millis(2);
        let never = poll_until(WaitMode::Spin, short, || false, || Ok(()));
        assert!(matches!(never, Err(WaitStop::TimedOut)));
        let faulted = poll_until(
            WaitMode::Sleep(Duration::from_micros(50)),
            Duration::from_secs(5),
            || false,
            || Err(BackendError::internal("the kernel faulted")),
        );
        match faulted {
            Err(WaitStop::Failed(error)) => assert!(error.to_string().contains("faulted")),
            _ => panic!("a fault while the words were partial must end the wait"),
        }
        let mut looks = 0;
        let arrived = poll_until(
            WaitMode::SpinThenYield(Duration::ZERO),
            Duration::from_secs(5),
            || {
                looks += 1;
                looks > 600
            },
            || Ok(()),
        );
        assert!(arrived.is_ok());
        let mut checked = false;
        let at_once = poll_until(
            WaitMode::Spin,
            Duration::from_secs(5),
            || true,
            || {
                checked = true;
                Ok(())
            },
        );
        assert!(at_once.is_ok());
        assert!(!checked);
    }

    /// Locks out lane options that would build a lane the device cannot hold or a wait
    /// that cannot succeed: each bound is a `Fix:` error naming its field; the defaults
    /// and the largest values pass.
    #[test]
    fn lane_options_are_bounded() {
        assert!(LaneOptions::default().validate().is_ok());
        let largest = LaneOptions::new()
            .blocks(MAX_LANE_BLOCKS)
            .slots(MAX_LANE_SLOTS)
            .result_bytes(MAX_LANE_AREA_BYTES)
            .staging_bytes(MAX_LANE_AREA_BYTES)
            .poll_sleep(MAX_LANE_POLL_SLEEP)
            .wait(WaitMode::Sleep(Duration::from_micros(1)));
        assert!(largest.validate().is_ok());
        let cases = [
            (LaneOptions::new().blocks(0), "blocks"),
            (LaneOptions::new().blocks(MAX_LANE_BLOCKS + 1), "blocks"),
            (LaneOptions::new().slots(0), "slots"),
            (LaneOptions::new().slots(MAX_LANE_SLOTS + 1), "slots"),
            (LaneOptions::new().result_bytes(128), "result_bytes"),
            (LaneOptions::new().result_bytes(300), "result_bytes"),
            (
                LaneOptions::new().staging_bytes(MAX_LANE_AREA_BYTES + 128),
                "staging_bytes",
            ),
            (
                LaneOptions::new().timeout(Duration::ZERO),
                "timeout is zero",
            ),
            (
                LaneOptions::new().poll_sleep(Duration::from_millis(2)),
                "poll_sleep",
            ),
            (
                LaneOptions::new().wait(WaitMode::Sleep(Duration::ZERO)),
                "Sleep",
            ),
            (
                LaneOptions::new()
                    .timeout(Duration::from_millis(1))
                    .wait(WaitMode::Sleep(Duration::from_millis(2))),
                "longer than LaneOptions::timeout",
            ),
        ];
        for (options, field) in cases {
            let message = options.validate().unwrap_err().to_string();
            assert!(
                message.starts_with("Fix:") && message.contains(field),
                "{message}"
            );
        }
    }
}
