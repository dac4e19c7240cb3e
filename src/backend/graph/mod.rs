//! Dispatch graphs: a repeated chain of dispatches captured once into a CUDA graph
//! and replayed with one launch and one synchronize. This module lives inside the
//! backend because a capture records exactly the stream operations a dispatch
//! enqueues (`StreamOps::dispatch`, the constructor both use) over the backend's own
//! memory, contexts and result areas.
//!
//! # Why this module exists
//!
//! Measured on the H200 machine: 3.6 µs of host time to issue each eager kernel
//! and 8.5–9.8 µs for launch + synchronize, but 8.5 µs for a whole graph replay of
//! one kernel + a 16-byte readback + synchronize, and 1.0 µs per further kernel node.
//! A tokenizer runs the same 4–6 dispatches per encode; captured once, they cost one
//! graph launch and one synchronize per encode instead of one issue per kernel and
//! a synchronize per readback.
//!
//! # Shape
//!
//! ```no_run
//! use vyre_cuda::backend::{Binding, CudaBackend, Dispatch};
//! use vyre_cuda::ir::*;
//! use vyre_cuda::DispatchConfig;
//!
//! # fn main() -> Result<(), vyre_cuda::backend::BackendError> {
//! let gpu = CudaBackend::acquire()?;
//! let double = Program::builder([64, 1, 1])
//!     .buffer("x", 0, Access::ReadWrite, ElemType::U32, BufferCount::Runtime)
//!     .body(|b| {
//!         let i = b.let_("i", Expr::global_id(Axis::X));
//!         b.if_(i.clone().less_than(Expr::length("x")), |b| {
//!             b.store("x", i.clone(), Expr::load("x", i.clone()) * 2u32);
//!         });
//!     })
//!     .build();
//! let config = DispatchConfig::linear(4);
//! let kernel = gpu.compile(&double, &config)?;
//! let x = gpu.buffer(4 * 256)?;
//! let bindings = [Binding::from(&x)];
//! let step = Dispatch::new(&kernel, &bindings).config(&config);
//! let (mut graph, input, output) = {
//!     let mut slots = None;
//!     let graph = gpu.record(|rec| {
//!         let input = rec.upload(&x, 4 * 256)?;
//!         rec.dispatch(step)?; // the same request an eager `gpu.run(step)` takes
//!         rec.dispatch(step)?;
//!         let output = rec.read_back(&x, 0, 4 * 256)?;
//!         slots = Some((input, output));
//!         Ok(())
//!     })?;
//!     let (input, output) = slots.expect("the closure ran");
//!     (graph, input, output)
//! };
//! for round in 0..3u32 {
//!     let words: Vec<u8> = (0..256u32).flat_map(|i| (i + round).to_le_bytes()).collect();
//!     graph.input_mut(input)?.copy_from_slice(&words);
//!     graph.replay()?; // one cuGraphLaunch + one synchronize
//!     let quadrupled = graph.output(output)?;
//!     assert_eq!(quadrupled[..4], (4 * round).to_le_bytes());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # What a recording captures
//!
//! [`CudaBackend::record`] runs the caller's closure first, which only *describes*
//! the chain: every call validates at once (binding counts and sizes through the
//! same checks a dispatch uses, buffers of this device, ranges in bounds, launch
//! plan) and
//! nothing touches the driver. When the closure returns `Ok`, the chain is captured
//! on a stream the graph owns, with exactly the operations a dispatch enqueues:
//!
//! - [`GraphRecorder::upload`]: a host → device copy from the graph's own pinned
//!   input slot (write it with [`DispatchGraph::input_mut`] before each replay);
//! - [`GraphRecorder::dispatch`]: a zero fill of every `WriteOnly` binding
//!   (`WriteOnly` starts zeroed on every path), then `fixpoint_iterations` kernel
//!   launch nodes, each with the parameter values (buffer addresses, then `u32`
//!   element counts) the driver copied into the graph at capture;
//! - [`GraphRecorder::read_back`]: a device → host copy into the graph's pinned
//!   output slot (read it with [`DispatchGraph::output`] after a replay). Read-backs
//!   recorded right after a dispatch (nothing in between) of at most
//!   `readback::MAPPED_RANGE_MAX_BYTES` each, up to 16 per dispatch, are *folded*
//!   into that dispatch's last launch instead: its last thread copies them into the
//!   graph's host-mapped result area, so they cost no copy node (measured on the
//!   H200: a graph of a kernel and N copies costs 8.0–33.3 µs for N = 1–16, the
//!   kernel alone 8.5);
//! - [`GraphRecorder::scratch`]: a graph allocation node (`cuMemAllocAsync` inside
//!   the capture) at the start, zero-filled, and its free node at the end, so a
//!   scratch buffer exists (zeroed) only while a replay runs.
//!
//! Operations replay in the order they were recorded (a single chain).
//!
//! The capture uses `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only the capturing
//! thread is barred from calls that could synchronise with the capture, so other
//! threads sharing the backend keep allocating and dispatching meanwhile (global
//! mode would fail their `cuMemAlloc`s), while a stray unsafe call on the capturing
//! thread still fails loudly instead of silently escaping the graph. The closure
//! runs before the capture begins, so nothing the caller does can land in it. A
//! capture that fails half-way is ended and discarded; the stream is never left
//! capturing.
//!
//! # Parameter updates without re-capture
//!
//! [`DispatchGraph::set_element_count`] changes the `u32` element count a step
//! passes for one runtime-sized binding (this encode's text length, say), and
//! [`DispatchGraph::set_workgroups`] its grid, both through
//! `cuGraphExecKernelNodeSetParams` on every launch node of the step. Counts are
//! checked against the bound buffer's capacity, so an update can never let a
//! kernel index past its allocation.
//!
//! # Lifetimes
//!
//! A graph holds `Arc` clones of every buffer's memory it touches and of its
//! kernels: dropping a buffer while a graph exists cannot free memory under it (the
//! memory goes when the graph does), and modules stay loaded. It also holds its backend, so the context outlives it. Drop order:
//! executable graph, graph, stream and events, pinned staging, then memory.
//!
//! # Threads
//!
//! [`DispatchGraph`] is `Send` but not `Sync`: move it to the thread that replays
//! it. Replays and updates take `&mut self`, so one graph never runs twice at once;
//! every replay synchronises before returning, so input and output slots are never
//! touched by the device while the host can reach them. [`DispatchGraph::submit`]
//! enqueues a replay without waiting: its [`PendingReplay`] borrows the graph
//! mutably until `wait` (or drop, which waits), so the same holds; several graphs
//! may be in flight at once, each on its own stream. Two graphs (or a graph and
//! plain dispatches) over the same buffers are not ordered against each
//! other: a graph holds its buffers, and replaying it while a submission over the
//! same buffers is pending is ordered only by the caller.
//!
//! # Grid-sync steps
//!
//! A step whose program has a grid sync is recorded over a private instance of
//! its kernel (`BackendInner::private_instance`: the same PTX loaded again as a
//! module of the graph's own), because an eager dispatch's barrier word is
//! module-global and leased for the dispatch's whole run, which a replay
//! cannot do. The graph's word is its alone: the driver runs the launches of
//! one executable graph one after another, and each launch leaves the word's
//! arrival bits as it found them (each grid sync adds exactly the phase bit),
//! so the word, zero when the module loads, needs no clearing node before a
//! launch (a fixpoint's later iterations still clear it, as a dispatch
//! does). Until 2026-12-06 a fill node cleared it before each launch; without
//! it the tokenizer's replays of its resident kernel took 0.5–1.5 µs less (an
//! H100, the encode example, median of 30, three rounds each: 8 KiB of prose
//! 51.0–51.3 against 50.5–51.1 µs, code 67.7–68.0 against 67.2–67.3; 256 KiB of
//! code 137.4–139.1 against 136.4–137.4). The step launches cooperatively, so
//! the driver refuses a grid that cannot be co-resident, and every replay (and
//! each `set_workgroups`) first checks its grid against what the device holds
//! beside the context's running lanes (`GridTooLargeForGridSync` instead of a
//! replay that would wait for a lane forever). The eager dispatch's audit of the barrier's arrivals has no
//! replay counterpart.
//!
//! # Timing and the probe
//!
//! [`DispatchGraph::replay`] records no events (on driver 580 each event record
//! costs about 2 µs); [`DispatchGraph::replay_timed`] records one pair around the
//! graph launch for `event_window_ns`. `kernel_stamps_ns` (both) comes from the kernels'
//! own `%globaltimer` stamps (the result ABI, `backend::readback`): from the start of
//! the first launch node to the end of the last, copies between kernels included,
//! at no cost to the replay. With the
//! probe on, each replay prints one line: `prepare` (liveness check, context bind),
//! `launch` (the graph launch and its events), `release` (the synchronize and fault
//! handling), `stage` and `readback` 0 (inputs and outputs are read and written in
//! place in pinned staging, outside the replay). Counts are sums over the steps
//! (`nodes`, `ptx_bytes`, `buffers`, `bindings`, `grid_blocks`); `fixpoint` is the
//! number of launch nodes.
//!
//! # Not supported
//!
//! - A recording spans one device: a stream capture cannot span devices, so a
//!   buffer or kernel of another device's backend is refused with a `Fix:` error.
//!   Per-device recordings are stitched under one parent graph with dependency
//!   edges and cross-device copies by [`StitchBuilder`] (see [`stitch`]).
//! - Readback sizes that depend on a value computed inside the graph: a read-back
//!   range is fixed at record time.

mod record;
pub mod stitch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use crate::backend::driver::{
    self, DeviceMemory, DriverError, Event, GraphExec, GraphNode, KernelNodeHolder, PinnedMemory,
    Stream,
};
use crate::backend::kernel::KernelInner;
use crate::backend::plan::{check_rebind, scalar_position, undeclared_scalar, ScalarWords};
use crate::backend::readback::{stamp_kernel_ns, ResultArea, ResultParams};
use crate::backend::stream_ops::LaunchParameters;
use crate::backend::PerBinding;
use crate::backend::{BackendError, CudaBackend, DeviceBuffer, LaunchPlan, Timings};
use crate::ir::{Access, BufferCount, Literal};
use crate::probe::{self, Count, Phase};

pub use record::GraphRecorder;
pub(in crate::backend) use record::{
    check_recordable, check_recorded_read_back, check_recorded_upload,
};
pub use stitch::{ChildId, EdgeKind, StitchBuilder, StitchEdge, StitchedGraph, TransferRoute};

/// Source of graph identities, so a slot or step of one graph is refused by another.
static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

/// A pinned input slot of one graph: bytes copied into a device buffer at the
/// start of its upload step on every replay. Returned by [`GraphRecorder::upload`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InputSlot {
    graph: u64,
    index: u32,
}

impl InputSlot {
    pub(in crate::backend) fn new(graph: u64, index: u32) -> Self {
        InputSlot { graph, index }
    }

    /// The slot's index, checked to belong to graph `graph`.
    pub(in crate::backend) fn index_in(self, graph: u64) -> Result<usize, BackendError> {
        if self.graph != graph {
            return Err(foreign("an input slot", self.graph, graph));
        }
        Ok(self.index as usize)
    }
}

impl OutputSlot {
    pub(in crate::backend) fn new(graph: u64, index: u32) -> Self {
        OutputSlot { graph, index }
    }

    /// The slot's index, checked to belong to graph `graph`.
    pub(in crate::backend) fn index_in(self, graph: u64) -> Result<usize, BackendError> {
        if self.graph != graph {
            return Err(foreign("an output slot", self.graph, graph));
        }
        Ok(self.index as usize)
    }
}

impl StepId {
    pub(in crate::backend) fn new(graph: u64, index: u32) -> Self {
        StepId { graph, index }
    }

    /// The step's index, checked to belong to graph `graph`.
    pub(in crate::backend) fn index_in(self, graph: u64) -> Result<usize, BackendError> {
        if self.graph != graph {
            return Err(foreign("a step", self.graph, graph));
        }
        Ok(self.index as usize)
    }
}

/// A pinned output slot of one graph: bytes copied from a device buffer by its
/// read-back step on every replay. Returned by [`GraphRecorder::read_back`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutputSlot {
    graph: u64,
    index: u32,
}

/// One recorded dispatch of one graph (all its fixpoint launch nodes). Returned by
/// [`GraphRecorder::dispatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepId {
    graph: u64,
    index: u32,
}

/// A device buffer that exists only while a replay of its graph runs: allocated
/// (and zero-filled) at the start of every replay and freed at its end. Returned by
/// [`GraphRecorder::scratch`]; usable as a binding of that graph's dispatches only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScratchBuffer {
    graph: u64,
    index: u32,
    bytes: u64,
}

impl ScratchBuffer {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// True for a zero-byte buffer (never: recording refuses them).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// A place in a pinned staging buffer.
#[derive(Clone, Copy, Debug)]
struct StagedRange {
    offset: usize,
    len: usize,
}

/// Where a binding's device address comes from.
#[derive(Clone, Copy, Debug)]
enum BoundAddress {
    /// An owned buffer's address (its memory is held in `Resources::memory`).
    Fixed(u64),
    /// A scratch buffer's graph allocation, known once the capture allocates it.
    Scratch(u32),
}

/// One recorded dispatch.
struct Step {
    kernel: Arc<KernelInner>,
    bound: SmallVec<[BoundAddress; 16]>,
    /// Bytes bound per slot (binding order).
    sizes: PerBinding<u64>,
    /// Device addresses per slot, resolved during the capture.
    addresses: PerBinding<u64>,
    /// Element counts passed per slot (the kernel's second parameter half).
    counts: PerBinding<u32>,
    plan: LaunchPlan,
    iterations: u32,
    /// The launch nodes of this step, one per fixpoint iteration.
    nodes: SmallVec<[GraphNode; 4]>,
    /// The result-ABI values its launches were captured with (stamp flags and the
    /// descriptors of the read-backs folded into its last launch).
    results: ResultParams,
    /// The scalar parameter words its launches pass (declaration order).
    scalars: ScalarWords,
}

/// Driver resources of a graph, in drop order.
struct Resources {
    exec: GraphExec,
    /// The captured graph `exec` was instantiated from (its node handles point into
    /// it); parameter updates are written into both, so a parent graph cloned from
    /// it (`stitch`) starts from the current values.
    graph: driver::Graph,
    stream: Stream,
    window_start: Event,
    window_end: Event,
    inputs: PinnedMemory,
    outputs: PinnedMemory,
    /// The result area every launch's result-ABI parameters point at: the stamps,
    /// and the read-backs folded into a dispatch's epilogue.
    /// Boxed: a graph value stays small (it sits in `AnyBackend`'s graph enum).
    results: Box<ResultArea>,
    /// Bytes of `results` in use (stamps and folded read-backs).
    results_used: usize,
    /// Keeps every buffer the graph touches alive (and says which:
    /// [`DispatchGraph::holdings_of`]).
    memory: Vec<Arc<DeviceMemory>>,
}

/// A captured, replayable chain of dispatches; see the [module docs](self).
/// `Send`, not `Sync`.
pub struct DispatchGraph {
    id: u64,
    name: String,
    /// `Some` until drop.
    resources: Option<Resources>,
    steps: Vec<Step>,
    inputs: Vec<StagedRange>,
    outputs: Vec<StagedRange>,
    /// Per output slot: its offset in the result area when the read-back was folded
    /// into the preceding dispatch's epilogue (no copy node), else `None`.
    folded_outputs: Box<[Option<usize>]>,
    graph_nodes: usize,
    /// Scratch buffers (graph allocation nodes): a graph with any cannot be a child
    /// of a stitched parent (the driver refuses allocation nodes in child graphs).
    scratch_buffers: usize,
    /// Set when a parameter update failed half-way: the executable may mix old and
    /// new parameters, so it must not run again.
    broken: Option<String>,
    // Last: the context outlives every handle above.
    backend: CudaBackend,
}

impl std::fmt::Debug for DispatchGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchGraph")
            .field("name", &self.name)
            .field("steps", &self.steps.len())
            .field("inputs", &self.inputs.len())
            .field("outputs", &self.outputs.len())
            .field("graph_nodes", &self.graph_nodes)
            .finish()
    }
}

/// The `Fix:` error for a fed buffer that `program` binds as `binding` with an
/// `access` that writes it ([`DispatchGraph::replay_feeding`]; the reference's
/// graph gives the same).
pub(in crate::backend) fn fed_buffer_written(
    program: &str,
    binding: &str,
    access: Access,
) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {program} binds the fed buffer as '{binding}' ({} access), so the device could \
         write it while the host does; feed only a buffer every step reads (declared \
         read_only), or write it before a plain replay",
        access.name()
    ))
}

/// The `Fix:` error for a fed buffer the graph uploads into or reads back from.
pub(in crate::backend) fn fed_buffer_transferred() -> BackendError {
    BackendError::bad_input(
        "Fix: the graph uploads into or reads back from the fed buffer, so the device would \
         write it (or the host read it) while the host writes it; feed a buffer the graph's \
         steps only bind, or write it before a plain replay",
    )
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl DispatchGraph {
    /// How many references to `memory` this graph holds (0 when it does not bind it):
    /// what [`DeviceBuffer::mapped_bytes_beside`](crate::backend::DeviceBuffer::mapped_bytes_beside)
    /// subtracts to prove nothing else holds a buffer.
    pub(in crate::backend) fn holdings_of(&self, memory: &Arc<DeviceMemory>) -> usize {
        self.resources.as_ref().map_or(0, |resources| {
            resources
                .memory
                .iter()
                .filter(|held| Arc::ptr_eq(held, memory))
                .count()
        })
    }

    /// `buffer`'s host-mapped bytes, writable between replays: the body of
    /// [`DeviceBuffer::mapped_bytes_mut_beside`](crate::backend::DeviceBuffer::mapped_bytes_mut_beside),
    /// here beside the replays whose absence it relies on.
    pub(in crate::backend) fn mapped_bytes_mut_of<'a>(
        &'a mut self,
        buffer: &'a mut DeviceBuffer,
    ) -> Result<&'a mut [u8], BackendError> {
        let len = buffer.len() as usize;
        let mapped = buffer.mapped_beside(self, "writing it in place")?;
        let (host, len) = (mapped.host_address(), mapped.len().min(len));
        // SAFETY: [host, host + len) lies within the allocation, which `buffer` keeps
        // alive for 'a. `mapped_beside` counted its holders: `buffer` (borrowed
        // mutably for 'a, so no dispatch can bind it) and this graph (borrowed
        // mutably for 'a, so it cannot replay, and a replay it submitted earlier was
        // waited for before that borrow could be taken; a graph touches the bytes
        // only in a replay). No kernel using the memory is enqueued or running and no
        // other reference to the bytes exists while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(host, len) })
    }

    /// Diagnostic name: the graph's number and its steps' program names.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of recorded dispatches.
    pub fn step_count(&self) -> usize {
        self.steps.len()
    }

    /// Number of kernel launch nodes (the sum of the steps' fixpoint iterations).
    pub fn launch_nodes(&self) -> usize {
        self.steps.iter().map(|s| s.nodes.len()).sum()
    }

    /// Number of nodes in the captured graph (launches, copies, fills, allocations).
    pub fn graph_nodes(&self) -> usize {
        self.graph_nodes
    }

    /// The element count `step` currently passes for `binding`.
    pub fn element_count(&self, step: StepId, binding: u32) -> Result<u32, BackendError> {
        let (step, slot) = self.step_slot(step, binding, "read the element count of")?;
        Ok(self.steps[step].counts[slot])
    }

    /// The workgroups `step` currently launches.
    pub fn workgroups(&self, step: StepId) -> Result<[u32; 3], BackendError> {
        let step = self.step_index(step)?;
        Ok(self.steps[step].plan.grid)
    }

    /// The pinned bytes `slot` uploads on every replay; write this replay's input
    /// here. Starts zeroed.
    pub fn input_mut(&mut self, slot: InputSlot) -> Result<&mut [u8], BackendError> {
        let range = self.input_range(slot)?;
        let resources = self.resources_mut()?;
        Ok(resources.inputs.slice_mut(range.offset, range.len))
    }

    /// The bytes `slot` read back during the last replay (zeroed before the first).
    pub fn output(&self, slot: OutputSlot) -> Result<&[u8], BackendError> {
        if slot.graph != self.id {
            return Err(foreign("an output slot", slot.graph, self.id));
        }
        let range = *self
            .outputs
            .get(slot.index as usize)
            .ok_or_else(|| forged("output slot", slot.index))?;
        let resources = self.resources.as_ref().ok_or_else(dropping)?;
        match self
            .folded_outputs
            .get(slot.index as usize)
            .copied()
            .flatten()
        {
            Some(offset) => Ok(resources.results.bytes(offset, range.len)),
            None => Ok(resources.outputs.slice(range.offset, range.len)),
        }
    }

    /// Replay the whole chain: one `cuGraphLaunch` and one synchronize. Records no
    /// timing events (device times read 0 unless the probe is on); see
    /// [`DispatchGraph::replay_timed`].
    pub fn replay(&mut self) -> Result<Timings, BackendError> {
        self.run(false, || ()).map(|(timing, ())| timing)
    }

    /// [`DispatchGraph::replay`] that runs `beside` on the calling thread between
    /// the launch and the synchronize, and returns its result with the replay's
    /// timings: host work that needs nothing the replay writes (preparing where its
    /// outputs go, waking the threads that will read them) overlaps the replay
    /// instead of preceding or following it. `beside` cannot touch the graph (it is
    /// borrowed); its host time counts in the replay's wall time and, under the
    /// probe, in the wait phase.
    pub fn replay_beside<R>(
        &mut self,
        beside: impl FnOnce() -> R,
    ) -> Result<(Timings, R), BackendError> {
        self.run(false, beside)
    }

    /// [`DispatchGraph::replay_beside`] that hands `beside` the bytes of `input`, a
    /// host-mapped buffer the graph's kernels only read, to write while the replay
    /// runs: the host feeds a kernel that is already running instead of filling
    /// the buffer before the launch. The kernels see the bytes as they arrive, in
    /// no promised order; the program and `beside` agree on how a kernel knows a
    /// part is written: `beside` publishes a flag with a release store
    /// ([`DeviceBuffer::host_words`] of another host-mapped buffer the graph reads)
    /// and the kernel polls it with `Node::AcquireLoad`, whose acquire makes the
    /// bytes written before the flag visible to the loads after it.
    ///
    /// `beside` must publish every flag a kernel waits for, on every path: a
    /// kernel left polling never ends, and this call's synchronize (or, if
    /// `beside` unwinds, the next synchronize of the graph's stream) waits for it
    /// forever. Its host time counts in the replay's wall time.
    ///
    /// An `Err` starting `Fix:` (nothing launched) for a buffer in device memory,
    /// one anything besides this graph holds (a dispatch in flight, another
    /// graph), and one a step of the graph writes (bound to a binding that is not
    /// read-only) or the graph uploads into or reads back from: the host's
    /// `&mut [u8]` must be the only writer of the bytes.
    ///
    /// ```no_run
    /// use std::sync::atomic::Ordering;
    /// use vyre_cuda::backend::{Binding, CudaBackend, Dispatch};
    /// use vyre_cuda::ir::*;
    /// use vyre_cuda::{DispatchConfig, ReadbackPolicy};
    ///
    /// # fn main() -> Result<(), vyre_cuda::backend::BackendError> {
    /// // Workgroup `w` copies piece `w` (64 words) once `ready[w]` is set.
    /// let copy = Program::builder([64, 1, 1])
    ///     .buffer("data", 0, Access::ReadOnly, ElemType::U32, BufferCount::Runtime)
    ///     .buffer("ready", 1, Access::ReadOnly, ElemType::U32, BufferCount::Runtime)
    ///     .buffer("out", 2, Access::ReadWrite, ElemType::U32, BufferCount::Runtime)
    ///     .body(|b| {
    ///         b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
    ///             let seen = b.let_mut("seen", 0u32);
    ///             b.while_(seen.equals(0u32), |b| {
    ///                 let flag = b.acquire_load("flag", "ready", Expr::workgroup_id(Axis::X));
    ///                 b.assign("seen", flag);
    ///             });
    ///         });
    ///         b.barrier(); // carries the first thread's acquire to the others
    ///         let i = b.let_("i", Expr::global_id(Axis::X));
    ///         b.store("out", i.clone(), Expr::load("data", i));
    ///     })
    ///     .build();
    /// let gpu = CudaBackend::acquire()?;
    /// let config = DispatchConfig::linear(4).with_readback(ReadbackPolicy::None);
    /// let kernel = gpu.compile(&copy, &config)?;
    /// let mut data = gpu.host_mapped_buffer(4 * 256)?;
    /// let ready = gpu.host_mapped_buffer(4 * 4)?;
    /// let out = gpu.buffer(4 * 256)?;
    /// let bindings = [Binding::from(&data), Binding::from(&ready), Binding::from(&out)];
    /// let mut graph = gpu.record(|rec| {
    ///     rec.dispatch(Dispatch::new(&kernel, &bindings).config(&config))?;
    ///     Ok(())
    /// })?;
    /// let flags = ready.host_words()?;
    /// flags.iter().for_each(|flag| flag.store(0, Ordering::Relaxed)); // before the launch
    /// graph.replay_feeding(&mut data, |bytes| {
    ///     for (piece, part) in bytes.chunks_mut(4 * 64).enumerate() {
    ///         part.fill(piece as u8); // the piece first, then its flag
    ///         flags[piece].store(1, Ordering::Release);
    ///     }
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn replay_feeding<R>(
        &mut self,
        input: &mut DeviceBuffer,
        beside: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<(Timings, R), BackendError> {
        let len = input.len() as usize;
        let mapped = input.mapped_beside(self, "feeding it to a replay")?;
        let (host, address) = (mapped.host_address(), mapped.device_address(0));
        let len = mapped.len().min(len);
        self.check_only_read(address)?;
        self.run(false, move || {
            // SAFETY: [host, host + len) lies within the allocation, which `input` keeps
            // alive (borrowed mutably for this call). `mapped_beside` counted its
            // holders: `input` (so no dispatch can bind it) and this graph, whose
            // steps only read it and which neither uploads into it nor reads it back
            // (`check_only_read`): the device never writes the bytes, and no other
            // host reference to them exists while the slice lives (it does not
            // outlive `beside`). The running kernels' reads of bytes the slice
            // writes are outside the host's memory model; what they see is the
            // program's protocol.
            let bytes = unsafe { std::slice::from_raw_parts_mut(host, len) };
            beside(bytes)
        })
    }

    /// `Ok` when every binding of the memory at device `address` in this graph is
    /// read-only and the graph holds it for those bindings alone (no upload into
    /// it, no read-back from it); the `Fix:` error naming the step otherwise.
    fn check_only_read(&self, address: u64) -> Result<(), BackendError> {
        let mut bindings = 0;
        for step in &self.steps {
            for (slot, bound) in step.bound.iter().enumerate() {
                if !matches!(bound, BoundAddress::Fixed(at) if *at == address) {
                    continue;
                }
                bindings += 1;
                let param = &step.kernel.slots[slot];
                if param.access != Access::ReadOnly {
                    return Err(fed_buffer_written(
                        &step.kernel.name,
                        &param.name,
                        param.access,
                    ));
                }
            }
        }
        let held = self.resources.as_ref().map_or(0, |resources| {
            resources
                .memory
                .iter()
                .filter(|held| held.address() == address)
                .count()
        });
        if held > bindings {
            return Err(fed_buffer_transferred());
        }
        Ok(())
    }

    /// [`DispatchGraph::replay`] with `event_window_ns` from an event pair around
    /// the graph launch (about 2 µs of host time per event on driver 580).
    pub fn replay_timed(&mut self) -> Result<Timings, BackendError> {
        self.run(true, || ()).map(|(timing, ())| timing)
    }

    /// Change the element count `step` passes for `binding` (a runtime-sized buffer
    /// of its program) on later replays, without re-capture. `elements` may not
    /// exceed what the bound buffer holds.
    pub fn set_element_count(
        &mut self,
        step: StepId,
        binding: u32,
        elements: u32,
    ) -> Result<(), BackendError> {
        let (index, slot) = self.step_slot(step, binding, "set the element count of")?;
        let kernel_slot = &self.steps[index].kernel.slots[slot];
        let program = self.steps[index].kernel.name.clone();
        if let BufferCount::Static(n) = kernel_slot.count {
            return Err(BackendError::bad_input(format!(
                "Fix: buffer '{}' (binding {binding}) of {program} has a static count of {n} elements, \
                 which the kernel uses instead of the parameter; only runtime-sized buffers take element \
                 count updates",
                kernel_slot.name
            )));
        }
        let elem = kernel_slot.elem.size_bytes() as u64;
        let capacity = self.steps[index].sizes[slot] / elem;
        if elements as u64 > capacity {
            return Err(BackendError::bad_input(format!(
                "Fix: buffer '{}' (binding {binding}) of {program} holds {capacity} elements, so it cannot \
                 pass {elements}; pass at most {capacity} or record the graph over a larger buffer",
                kernel_slot.name
            )));
        }
        let mut counts = self.steps[index].counts.clone();
        counts[slot] = elements;
        let step = &self.steps[index];
        let (plan, scalars) = (step.plan, step.scalars.clone());
        self.update_step(index, counts, plan, scalars)
    }

    /// Change the workgroups `step` launches on later replays, without re-capture
    /// (the grid is part of each launch node's parameters). Checked like a
    /// dispatch's launch plan.
    pub fn set_workgroups(
        &mut self,
        step: StepId,
        workgroups: [u32; 3],
    ) -> Result<(), BackendError> {
        self.set_launch(step, &[], Some(workgroups))
    }

    /// Change several scalar values of `step` and, with `workgroups`, its grid,
    /// on later replays, in one write of its launch nodes: each change checked
    /// as [`DispatchGraph::set_scalar`] and [`DispatchGraph::set_workgroups`]
    /// check it, all of them before any is made (an `Err` changes nothing). A
    /// call that leaves every value as it is writes nothing, so a caller may
    /// pass its current values before every replay.
    ///
    /// Why: every write of a launch node is a `cuGraphExecKernelNodeSetParams`
    /// and its captured graph's twin, so a caller whose every replay takes a
    /// new length and grid paid that once per change. On an H100 (2026-12-06,
    /// the dispatch bench's `graph_updates`, three runs, host time per change
    /// of two scalars and the grid): one call each 2.96–4.15 µs, one
    /// `set_launch` 1.09–1.58 (a replay of the same graph 9.3–10.2).
    pub fn set_launch(
        &mut self,
        step: StepId,
        scalars: &[(&str, Literal)],
        workgroups: Option<[u32; 3]>,
    ) -> Result<(), BackendError> {
        let index = self.step_index(step)?;
        let recorded = &self.steps[index];
        let mut words = recorded.scalars.clone();
        for &(name, value) in scalars {
            let position = scalar_position(
                &recorded.kernel.name,
                recorded.kernel.program.scalars(),
                name,
                value,
            )?;
            words[position] = value.bits();
        }
        let plan = match workgroups {
            Some(workgroups) => {
                let inner = Arc::clone(self.backend.shared());
                inner.check_alive()?;
                let plan = inner.launch_plan(&recorded.kernel, workgroups)?;
                record::check_grid_sync_fits(&inner, &recorded.kernel, &plan)?;
                plan
            }
            None => recorded.plan,
        };
        if words == recorded.scalars && plan == recorded.plan {
            return Ok(());
        }
        let counts = recorded.counts.clone();
        self.update_step(index, counts, plan, words)
    }

    /// Bind `buffer` in place of the buffer `step` passes for `binding` on later
    /// replays, without re-capture: the address is a kernel parameter, written
    /// through `cuGraphExecKernelNodeSetParams` into every launch node of the
    /// step, and the graph then holds the new buffer's memory instead of the old
    /// one's (which a [`DeviceBuffer::into_mapped_view`] of the old buffer then
    /// no longer finds held). The kernel keeps the element count the step was
    /// recorded with ([`DispatchGraph::set_element_count`] changes it). Refused
    /// (`Fix:`) for a scratch binding, a write-only binding (its clear keeps the
    /// recorded address), a buffer smaller than the recorded one, one the step
    /// already binds where either binding is written, and a buffer the graph also
    /// uploads into or reads back from.
    ///
    /// Why: a caller that takes a result buffer out of a graph's reach (a
    /// host-mapped buffer kept as a [`MappedView`](crate::backend::MappedView))
    /// and gives the graph another one would otherwise record the graph again.
    pub fn set_buffer(
        &mut self,
        step: StepId,
        binding: u32,
        buffer: &DeviceBuffer,
    ) -> Result<(), BackendError> {
        let (index, slot) = self.step_slot(step, binding, "rebind")?;
        let inner = Arc::clone(self.backend.shared());
        inner.check_alive()?;
        let (memory, new_bytes) =
            record::hold_memory(&inner, buffer, "rebind a recorded dispatch to")?;
        let recorded = &self.steps[index];
        let BoundAddress::Fixed(old) = recorded.bound[slot] else {
            return Err(BackendError::bad_input(format!(
                "Fix: binding {binding} of {} is a scratch buffer of the recording, which \
                 the graph allocates itself; rebind only the buffers a dispatch was \
                 recorded over",
                recorded.kernel.name
            )));
        };
        let resources = self.resources.as_ref().ok_or_else(dropping)?;
        let old_memory = resources
            .memory
            .iter()
            .find(|held| held.address() == old)
            .cloned()
            .ok_or_else(|| BackendError::internal("a recorded binding's memory is not held"))?;
        // Each binding holds the memory once, each upload and read-back once more.
        let bindings_of_old = self
            .steps
            .iter()
            .flat_map(|step| step.bound.iter())
            .filter(|bound| matches!(bound, BoundAddress::Fixed(address) if *address == old))
            .count();
        let also_bound_at: PerBinding<usize> = (0..recorded.bound.len())
            .filter(|&other| {
                other != slot
                    && matches!(recorded.bound[other], BoundAddress::Fixed(address) if address == memory.address())
            })
            .collect();
        check_rebind(
            &recorded.kernel.name,
            &recorded.kernel.slots,
            slot,
            (recorded.sizes[slot], new_bytes),
            &also_bound_at,
            self.holdings_of(&old_memory) > bindings_of_old,
        )?;
        let step = &mut self.steps[index];
        let address = memory.address();
        step.bound[slot] = BoundAddress::Fixed(address);
        let before = std::mem::replace(&mut step.addresses[slot], address);
        let (counts, plan, scalars) = (step.counts.clone(), step.plan, step.scalars.clone());
        if let Err(error) = self.update_step(index, counts, plan, scalars) {
            let step = &mut self.steps[index];
            step.bound[slot] = BoundAddress::Fixed(old);
            step.addresses[slot] = before;
            return Err(error);
        }
        let resources = self.resources.as_mut().ok_or_else(dropping)?;
        if let Some(at) = resources
            .memory
            .iter()
            .position(|held| Arc::ptr_eq(held, &old_memory))
        {
            resources.memory.swap_remove(at);
        }
        resources.memory.push(memory);
        Ok(())
    }

    /// The value `step` currently passes for its program's scalar parameter `name`.
    pub fn scalar(&self, step: StepId, name: &str) -> Result<Literal, BackendError> {
        let step = &self.steps[self.step_index(step)?];
        let program = &step.kernel.program;
        let (position, decl) = program
            .scalar(name)
            .ok_or_else(|| undeclared_scalar(&step.kernel.name, program.scalars(), name))?;
        Ok(Literal::from_bits(decl.ty, step.scalars[position]))
    }

    /// Change the value `step` passes for its program's scalar parameter `name` on
    /// later replays, without re-capture: a scalar is a kernel parameter, written
    /// through `cuGraphExecKernelNodeSetParams` into every launch node of the step
    /// (no new PTX, no new JIT). `value` must have the declared type, exactly as
    /// for [`Dispatch::scalar`](crate::backend::Dispatch::scalar).
    pub fn set_scalar(
        &mut self,
        step: StepId,
        name: &str,
        value: impl Into<Literal>,
    ) -> Result<(), BackendError> {
        self.set_launch(step, &[(name, value.into())], None)
    }

    /// Write `counts`, `plan` and `scalars` into every launch node of step `index`.
    fn update_step(
        &mut self,
        index: usize,
        counts: PerBinding<u32>,
        plan: LaunchPlan,
        scalars: ScalarWords,
    ) -> Result<(), BackendError> {
        self.usable()?;
        let inner = Arc::clone(self.backend.shared());
        inner.check_alive()?;
        inner.bind()?;
        let name = self.name.clone();
        let resources = self.resources.as_ref().ok_or_else(dropping)?;
        let step = &self.steps[index];
        let mut parameters = LaunchParameters {
            addresses: step.addresses.clone(),
            counts: counts.clone(),
            results: Some(step.results.clone()),
            scalars: scalars.clone(),
        };
        let mut params = parameters.pointer_array();
        let mut updated = 0usize;
        let mut partly = false;
        let mut failure: Option<DriverError> = None;
        let iterations = step.nodes.len() as u32;
        for (iteration, node) in step.nodes.iter().enumerate() {
            // The same per-launch result values the capture used for this node.
            parameters.set_launch(iteration as u32, iterations);
            // SAFETY: `node` is a launch node of `resources.graph` (the `Captured`
            // holder), from which `resources.exec` (the `Executable` one) was
            // instantiated, launching this step's kernel; `params` points into
            // `parameters`, alive and unmoved until after the call, in the kernel's
            // parameter order; every address is held by the graph (buffer memory in
            // `resources.memory`, scratch allocated by the graph itself), and a stitched
            // parent cloned from it owns this graph; the last replay synchronised, so no
            // launch of the executable is running.
            let mut set = |holder| unsafe {
                driver::set_kernel_node_params(
                    holder,
                    *node,
                    &step.kernel.module,
                    plan.grid,
                    plan.block,
                    &mut params,
                )
            };
            let in_exec = set(KernelNodeHolder::Executable(&resources.exec));
            // The captured graph gets the same values, so it always describes what its
            // executable runs: a graph stitched under a parent later (`stitch`) is
            // cloned from it, and the parent's child-node update reads it.
            let result = in_exec.and_then(|()| set(KernelNodeHolder::Captured(&resources.graph)));
            match result {
                Ok(()) => updated += 1,
                Err(e) => {
                    // A failure of the second call leaves the executable changed.
                    partly = in_exec.is_ok();
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(error) = failure {
            if error.is_sticky() {
                inner.mark_context_lost(format!("updating {name} failed: {error}"));
            }
            if updated > 0 || partly {
                self.broken = Some(format!(
                    "a parameter update failed after {updated} of {} launch nodes ({error})",
                    step.nodes.len()
                ));
            }
            return Err(BackendError::driver(
                format!("updating the launch parameters of {name}"),
                error,
            ));
        }
        let step = &mut self.steps[index];
        step.counts = counts;
        step.plan = plan;
        step.scalars = scalars;
        Ok(())
    }

    /// Enqueue one replay and return at once; [`PendingReplay::wait`] does the one
    /// synchronize. The pending replay borrows the graph mutably, so its input and
    /// output slots cannot be touched (nor the graph replayed again) until it is
    /// waited for or dropped (dropping waits). Several graphs may be in flight at
    /// once, each on its own stream. Records the window events (`event_window_ns`);
    /// submissions are not charged to the probe.
    pub fn submit(&mut self) -> Result<PendingReplay<'_>, BackendError> {
        let start = Instant::now();
        self.ready()?;
        let launched = self.launch(true)?;
        Ok(PendingReplay {
            graph: self,
            start,
            enqueued: launched,
            waited: false,
        })
    }

    /// One replay, charged to the probe, with `beside` run between its launch and
    /// its wait.
    fn run<R>(
        &mut self,
        want_timing: bool,
        beside: impl FnOnce() -> R,
    ) -> Result<(Timings, R), BackendError> {
        let dispatch_probe = probe::begin_dispatch();
        let start = Instant::now();
        let want_timing = want_timing || dispatch_probe.is_some();
        let mark = probe::mark();
        self.ready()?;
        if dispatch_probe.is_some() {
            count_steps_for_probe(self.steps.iter());
        }
        let mark = probe::charge_and_mark(Phase::Prepare, mark);
        let enqueued = self.launch(want_timing)?;
        let mark = probe::charge_and_mark(Phase::Launch, mark);
        let beside = beside();
        let timing = self.wait_replay(want_timing, start, enqueued)?;
        let mark = probe::charge_and_mark(Phase::Release, mark);
        // Outputs stay in pinned staging (read in place through `output`): nothing
        // to copy, so the readback phase is only this boundary.
        probe::charge(Phase::Readback, mark);
        let timing = Timings {
            wall_ns: elapsed_ns(start),
            ..timing
        };
        if let Some(dispatch_probe) = dispatch_probe {
            dispatch_probe.finish(timing.probe());
        }
        Ok((timing, beside))
    }

    /// Every grid-sync step's grid against the device now, before a replay: a
    /// lane may have started since the recording, and a cooperative launch that
    /// counted on its multiprocessors would wait for it forever.
    fn check_grid_syncs_fit(&self) -> Result<(), BackendError> {
        let inner = self.backend.shared();
        self.steps
            .iter()
            .try_for_each(|step| record::check_grid_sync_fits(inner, &step.kernel, &step.plan))
    }

    /// Enqueue one graph launch (bracketed by the window events when timed);
    /// returns the instant the last operation was enqueued.
    fn launch(&mut self, want_timing: bool) -> Result<Instant, BackendError> {
        let inner = Arc::clone(self.backend.shared());
        let name = &self.name;
        let resources = self.resources.as_mut().ok_or_else(dropping)?;
        let results_used = resources.results_used;
        let enqueue_error = |what: &str, e: DriverError| inner.stream_failed(name, what, e);
        resources
            .results
            .arm(&resources.stream)
            .map_err(|e| enqueue_error("clearing the result stamps", e))?;
        if want_timing {
            resources
                .window_start
                .record(&resources.stream)
                .map_err(|e| enqueue_error("recording the window start event", e))?;
        }
        // SAFETY: every device allocation the graph touches is held by `resources.memory`
        // (owned buffers) or allocated and freed by the graph itself
        // (scratch); the pinned input and output staging live in `resources` and are
        // reachable by the host only through `&mut self`/`&self` methods, which cannot
        // run until the synchronize: `replay` waits before returning, and a
        // `PendingReplay` borrows the graph mutably until it has waited.
        unsafe { resources.exec.launch(&resources.stream) }
            .map_err(|e| enqueue_error("launching the graph", e))?;
        // SAFETY: the graph owns the area (device memory and mirror) for its life; the
        // mirror is read only after the synchronize below. No-op for a mapped area.
        unsafe {
            resources
                .results
                .enqueue_copy_back(results_used, &resources.stream)
        }
        .map_err(|e| enqueue_error("copying the result area back", e))?;
        if want_timing {
            resources
                .window_end
                .record(&resources.stream)
                .map_err(|e| enqueue_error("recording the window end event", e))?;
        }
        Ok(Instant::now())
    }

    /// Prepare: the graph is not broken, the context alive and bound.
    fn ready(&self) -> Result<(), BackendError> {
        self.usable()?;
        let inner = self.backend.shared();
        inner.check_alive()?;
        inner.bind()?;
        self.check_grid_syncs_fit()?;
        // A persistent lane's request over one of the graph's buffers runs beside the
        // replay, unordered on the device, and its outputs in device memory are visible
        // to the replay only once its completion word is (even after its delivery):
        // wait for the lane requests touching any of them (the graph's access of each
        // is not kept here, so as a writer). One load when the order book is empty.
        let resources = self.resources.as_ref().ok_or_else(dropping)?;
        let buffers = resources.memory.iter().map(|memory| memory.address());
        self.backend
            .wait_for_lane_requests(buffers, true, &self.name)
    }

    /// The one synchronize of a replay and its device window.
    fn wait_replay(
        &mut self,
        want_timing: bool,
        start: Instant,
        enqueued: Instant,
    ) -> Result<Timings, BackendError> {
        let inner = Arc::clone(self.backend.shared());
        inner.bind()?;
        let name = &self.name;
        let resources = self.resources.as_ref().ok_or_else(dropping)?;
        let wait_ns = inner.synchronize_with(name, || resources.stream.synchronize())?;
        let mut timing = Timings {
            wall_ns: 0,
            enqueue_ns: u64::try_from(enqueued.duration_since(start).as_nanos())
                .unwrap_or(u64::MAX),
            wait_ns,
            kernel_stamps_ns: 0,
            event_window_ns: None,
            lane_stamps: None,
        };
        if want_timing {
            timing.event_window_ns = Some(
                Event::elapsed_ns(&resources.window_start, &resources.window_end).unwrap_or(0),
            );
        }
        timing.kernel_stamps_ns = self.stamped_kernel_ns()?;
        Ok(timing)
    }

    /// After a synchronize: the kernels' own stamps, from the first launch's start to
    /// the last one's end (0 for a graph of copies only); an error when the last
    /// kernel did not write its end stamp (its folded read-backs cannot be trusted).
    fn stamped_kernel_ns(&self) -> Result<u64, BackendError> {
        if self.steps.is_empty() {
            return Ok(0);
        }
        let resources = self.resources.as_ref().ok_or_else(dropping)?;
        let stamps = resources.results.stamps();
        if stamps.is_none() {
            return Err(BackendError::internal(format!(
                "{} replayed without its last kernel writing the end stamp, so its folded \
                 read-backs cannot be trusted",
                self.name
            )));
        }
        Ok(stamp_kernel_ns(stamps))
    }

    /// Before a stitched parent's launch (`stitch`): clear this child's result
    /// stamps. A mapped area is cleared by the host; a device-memory area by a fill
    /// on the child's own stream, waited for here so the parent's launch (on another
    /// stream, maybe another device) cannot overtake it.
    pub(in crate::backend) fn arm_as_child(&mut self) -> Result<(), BackendError> {
        self.ready()?;
        let inner = Arc::clone(self.backend.shared());
        let name = self.name.clone();
        let resources = self.resources.as_mut().ok_or_else(dropping)?;
        resources
            .results
            .arm(&resources.stream)
            .map_err(|e| inner.stream_failed(&name, "clearing the result stamps", e))?;
        if !resources.results.is_mapped() {
            inner.synchronize_with(&name, || resources.stream.synchronize())?;
        }
        Ok(())
    }

    /// After a stitched parent's synchronize: bring a device-memory result area back
    /// (one copy and a synchronize on the child's stream; nothing for a mapped area)
    /// and read the child's kernel time from its stamps.
    pub(in crate::backend) fn collect_as_child(&mut self) -> Result<u64, BackendError> {
        let inner = Arc::clone(self.backend.shared());
        inner.bind()?;
        let name = self.name.clone();
        let resources = self.resources.as_mut().ok_or_else(dropping)?;
        if !resources.results.is_mapped() {
            let used = resources.results_used;
            // SAFETY: the graph owns the area for its life; the mirror is read only
            // after the synchronize just below.
            unsafe { resources.results.enqueue_copy_back(used, &resources.stream) }
                .map_err(|e| inner.stream_failed(&name, "copying the result area back", e))?;
            inner.synchronize_with(&name, || resources.stream.synchronize())?;
        }
        self.stamped_kernel_ns()
    }

    fn usable(&self) -> Result<(), BackendError> {
        match &self.broken {
            None => Ok(()),
            Some(why) => Err(BackendError::bad_input(format!(
                "Fix: {} cannot replay: {why}; record the graph again",
                self.name
            ))),
        }
    }

    fn resources_mut(&mut self) -> Result<&mut Resources, BackendError> {
        self.resources.as_mut().ok_or_else(dropping)
    }

    fn input_range(&self, slot: InputSlot) -> Result<StagedRange, BackendError> {
        if slot.graph != self.id {
            return Err(foreign("an input slot", slot.graph, self.id));
        }
        self.inputs
            .get(slot.index as usize)
            .copied()
            .ok_or_else(|| forged("input slot", slot.index))
    }

    fn step_index(&self, step: StepId) -> Result<usize, BackendError> {
        if step.graph != self.id {
            return Err(foreign("a step", step.graph, self.id));
        }
        let index = step.index as usize;
        if index >= self.steps.len() {
            return Err(forged("step", step.index));
        }
        Ok(index)
    }

    /// The step index and the kernel slot index of `binding` in it.
    fn step_slot(
        &self,
        step: StepId,
        binding: u32,
        verb: &str,
    ) -> Result<(usize, usize), BackendError> {
        let index = self.step_index(step)?;
        let kernel = &self.steps[index].kernel;
        let slot = kernel.slots.iter().position(|s| s.binding == binding);
        match slot {
            Some(slot) => Ok((index, slot)),
            None => {
                let bindings: Vec<String> = kernel
                    .slots
                    .iter()
                    .map(|s| format!("{} ({})", s.binding, s.name))
                    .collect();
                Err(BackendError::bad_input(format!(
                    "Fix: cannot {verb} binding {binding} of {}: its global buffers are bindings [{}]; \
                     name one of those",
                    kernel.name,
                    bindings.join(", ")
                )))
            }
        }
    }
}

/// The probe's counts of one replay: sums over `steps` (`nodes`, `ptx_bytes`,
/// `buffers`, `bindings`, `grid_blocks`; `fixpoint` is the number of launch nodes).
/// Shared by graph and stitched replays.
fn count_steps_for_probe<'s>(steps: impl Iterator<Item = &'s Step> + Clone) {
    let sum = |f: &dyn Fn(&Step) -> u64| {
        steps
            .clone()
            .fold(0u64, |total, step| total.saturating_add(f(step)))
    };
    probe::count_with(Count::Nodes, || sum(&|s| s.kernel.program.node_count()));
    probe::count_with(Count::PtxBytes, || sum(&|s| s.kernel.ptx.len() as u64));
    probe::count_with(Count::Buffers, || {
        sum(&|s| s.kernel.program.buffers().len() as u64)
    });
    probe::count_with(Count::Bindings, || sum(&|s| s.bound.len() as u64));
    probe::count_with(Count::Fixpoint, || sum(&|s| s.nodes.len() as u64));
    probe::count_with(Count::GridBlocks, || sum(&|s| s.plan.grid_blocks));
}

fn foreign(what: &str, owner: u64, this: u64) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {what} of dispatch graph #{owner} was passed to dispatch graph #{this}; use the slots and \
         steps each graph's recording returned with that graph only"
    ))
}

fn forged(what: &str, index: u32) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {what} {index} does not exist in this dispatch graph; the value was forged or corrupted"
    ))
}

fn dropping() -> BackendError {
    BackendError::internal("the dispatch graph's resources are gone before its drop")
}

impl Drop for DispatchGraph {
    fn drop(&mut self) {
        let Some(resources) = self.resources.take() else {
            return;
        };
        let inner = self.backend.shared();
        // After a sticky fault the context (and every handle in it) is gone: freeing
        // them would be invalid, so they are forgotten, as the backend does.
        let alive = inner.check_alive().is_ok() && inner.bind().is_ok();
        if alive && resources.stream.synchronize().is_ok() {
            // Field order: exec, graph, stream, events, staging, memory.
            drop(resources);
        } else {
            std::mem::forget(resources);
            for step in self.steps.drain(..) {
                std::mem::forget(step.kernel);
            }
        }
    }
}

/// A replay enqueued by [`DispatchGraph::submit`]. Borrows its graph mutably until
/// [`PendingReplay::wait`] (consuming: waiting twice does not compile) or drop
/// (which waits, discarding errors).
#[must_use = "a pending replay does nothing visible until `wait`; dropping it blocks until it finishes"]
pub struct PendingReplay<'g> {
    graph: &'g mut DispatchGraph,
    start: Instant,
    enqueued: Instant,
    waited: bool,
}

impl std::fmt::Debug for PendingReplay<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingReplay")
            .field("graph", &self.graph.name)
            .finish()
    }
}

impl PendingReplay<'_> {
    /// Wait for the replay: its timings (outputs are in the graph's output slots).
    pub fn wait(mut self) -> Result<Timings, BackendError> {
        self.waited = true;
        let timing = self.graph.wait_replay(true, self.start, self.enqueued)?;
        Ok(Timings {
            wall_ns: elapsed_ns(self.start),
            ..timing
        })
    }
}

impl Drop for PendingReplay<'_> {
    fn drop(&mut self) {
        if !self.waited {
            let _ = self.graph.wait_replay(false, self.start, self.enqueued);
        }
    }
}

/// Graph identities, shared by the recorder (and the reference backend's recorded
/// graphs, whose slots use the same types).
pub(in crate::backend) fn next_graph_id() -> u64 {
    NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed)
}
