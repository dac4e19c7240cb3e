//! Recording: the caller's closure describes the chain (every call validated at
//! once, no driver work), then one stream capture records it, the graph is
//! instantiated, and the result becomes a [`DispatchGraph`].

use std::sync::Arc;

use smallvec::SmallVec;

use crate::backend::dispatch::{check_coresident, foreign_kernel};
use crate::backend::driver::{
    self, Capture, DeviceMemory, DriverError, DriverResult, Event, GraphNode, GraphNodeKind,
    LoadedModule, PinnedMemory, Stream,
};
use crate::backend::kernel::{KernelInner, KernelKind};
use crate::backend::plan::{check_aliasing, check_binding_sizes, check_request_scalars};
use crate::backend::readback::{
    mapped_range_limit, AreaCopy, ResultArea, ResultParams, RESULT_AREA_BYTES, STAMP_BYTES,
};
use crate::backend::stream_ops::{
    enqueue, BufferCopy, Clear, DeviceMark, KernelLaunch, PinnedCopy, Readback, StagedCopy,
    StreamOps, StreamTarget,
};
use crate::backend::{
    device_of_backend, BackendError, BackendInner, Binding, CudaBackend, DeviceBuffer, Dispatch,
    LaunchPlan, PerBinding,
};
use crate::config::ReadbackPolicy;

use super::{
    next_graph_id, BoundAddress, DispatchGraph, InputSlot, OutputSlot, Resources, ScratchBuffer,
    StagedRange, Step, StepId,
};

/// Staging slots start on 256-byte boundaries, like a dispatch's staging.
const STAGING_ALIGN: usize = 256;

/// One operation of the chain, in capture order.
#[derive(Clone, Copy, Debug)]
enum Operation {
    /// Copy input slot `input` to `address`.
    Upload { input: u32, address: u64 },
    /// Run step `step` (its clears and launches).
    Dispatch { step: u32 },
    /// Copy from `address` into output slot `output`; the buffer read occupies
    /// device addresses `memory` (a folded read-back may read a whole 16-byte block
    /// of it, never past it).
    ReadBack {
        output: u32,
        address: u64,
        memory: (u64, u64),
    },
}

/// Describes a chain of dispatches inside [`CudaBackend::record`]. Every method
/// validates its arguments at once and returns an `Err` starting `Fix:`; nothing
/// runs on the device until the graph is replayed.
pub struct GraphRecorder<'b> {
    backend: &'b CudaBackend,
    id: u64,
    operations: Vec<Operation>,
    inputs: Vec<StagedRange>,
    input_bytes: usize,
    outputs: Vec<StagedRange>,
    output_bytes: usize,
    steps: Vec<Step>,
    /// Byte sizes of the scratch buffers.
    scratch: Vec<u64>,
    memory: Vec<Arc<DeviceMemory>>,
}

impl CudaBackend {
    /// Record a chain of dispatches into a replayable CUDA graph. `build`
    /// describes the chain through the [`GraphRecorder`]; when it returns `Ok`, the
    /// chain is captured once and instantiated. See the [`crate::graph`] docs.
    pub fn record(
        &self,
        build: impl FnOnce(&mut GraphRecorder<'_>) -> Result<(), BackendError>,
    ) -> Result<DispatchGraph, BackendError> {
        self.shared().check_alive()?;
        crate::backend::driver::load_graph_symbols().map_err(|e| BackendError::NoDriver {
            detail: match e {
                crate::backend::driver::LoadError::SymbolMissing(symbol) => format!(
                    "libcuda.so lacks {symbol}, which dispatch graphs need (plain dispatches still work); \
                     upgrade the driver or dispatch without record()"
                ),
                crate::backend::driver::LoadError::LibraryMissing => "libcuda.so could not be opened".into(),
            },
        })?;
        let mut recorder = GraphRecorder {
            backend: self,
            id: next_graph_id(),
            operations: Vec::new(),
            inputs: Vec::new(),
            input_bytes: 0,
            outputs: Vec::new(),
            output_bytes: 0,
            steps: Vec::new(),
            scratch: Vec::new(),
            memory: Vec::new(),
        };
        build(&mut recorder)?;
        recorder.finish()
    }
}

fn staged_len(bytes: u64, what: &str) -> Result<usize, BackendError> {
    usize::try_from(bytes).map_err(|_| {
        BackendError::bad_input(format!(
            "Fix: a {what} of {bytes} bytes does not fit this host's address space; use a smaller range"
        ))
    })
}

fn align_up(offset: usize, len: usize) -> Result<usize, BackendError> {
    len.div_ceil(STAGING_ALIGN)
        .checked_mul(STAGING_ALIGN)
        .and_then(|aligned| offset.checked_add(aligned))
        .ok_or_else(|| {
            BackendError::bad_input(
                "Fix: the graph's pinned staging would overflow the address space; record fewer or \
                 smaller uploads and read-backs",
            )
        })
}

impl GraphRecorder<'_> {
    /// Copy the first `bytes` bytes of a fresh pinned input slot into the start of
    /// `handle` at this point of every replay. Write the slot with
    /// [`DispatchGraph::input_mut`] before replaying; it starts zeroed.
    pub fn upload(&mut self, buffer: &DeviceBuffer, bytes: u64) -> Result<InputSlot, BackendError> {
        let (memory, capacity) = self.hold(buffer, "record an upload into")?;
        check_recorded_upload(bytes, capacity)?;
        let len = staged_len(bytes, "upload")?;
        let end = align_up(self.input_bytes, len)?;
        let index = slot_index(self.inputs.len())?;
        self.inputs.push(StagedRange {
            offset: self.input_bytes,
            len,
        });
        self.input_bytes = end;
        self.operations.push(Operation::Upload {
            input: index,
            address: memory.address(),
        });
        self.memory.push(memory);
        Ok(InputSlot {
            graph: self.id,
            index,
        })
    }

    /// A dispatch exactly as an eager run of `request` would enqueue it
    /// (`StreamOps::dispatch`, the constructor both share): `WriteOnly` buffers are
    /// zeroed first, then `fixpoint_iterations` launches over the request's
    /// workgroups. Its bindings are owned buffers (held by the graph from now on) or
    /// scratch buffers of this recording: a replay outlives any host slice, so host,
    /// zeroed and pinned bindings are refused. Its readback must be `AllOutputs` (the
    /// default) or `None`, both meaning "nothing": inside a graph, bytes come back
    /// only through [`GraphRecorder::read_back`]. It may not name a predecessor (the
    /// graph's operations run in recording order); its timing is the replay's.
    pub fn dispatch(&mut self, request: Dispatch<'_>) -> Result<StepId, BackendError> {
        let inner = self.backend.shared();
        let (resolved, _) = inner.resolve(request.target, &request.codegen, None)?;
        let name = resolved.name().to_string();
        let KernelKind::Cuda(kernel) = &resolved.kind else {
            return Err(foreign_kernel(&name));
        };
        let mut kernel = Arc::clone(kernel);
        check_device(
            &format!("the kernel for {name}"),
            device_of_backend(kernel.backend_id),
            inner.caps.ordinal,
        )?;
        if kernel.backend_id != inner.id {
            return Err(foreign_kernel(&name));
        }
        check_recordable(&name, &request)?;
        if kernel.grid_barrier.is_some() {
            // Grid barrier word of this graph's own (`private_instance`).
            kernel = Arc::new(inner.private_instance(&kernel)?);
        }
        let mut sizes: PerBinding<u64> = SmallVec::new();
        for binding in request.bindings {
            if let Binding::Scratch(scratch) = binding {
                self.check_scratch(scratch)?;
            }
            sizes.push(binding.len());
        }
        check_binding_sizes(&name, &kernel.slots, &sizes, request.fixpoint_iterations)?;
        check_aliasing(&name, &kernel.slots, request.bindings)?;
        let declared = kernel.program.scalars();
        check_request_scalars(&name, declared, &request)?;
        let scalars = request.scalars.words()[..declared.len()].into();
        let plan = inner.launch_plan(&kernel, request.workgroups)?;
        check_grid_sync_fits(inner, &kernel, &plan)?;
        let mut bound: SmallVec<[BoundAddress; 16]> = SmallVec::new();
        let mut held: SmallVec<[Arc<DeviceMemory>; 16]> = SmallVec::new();
        for binding in request.bindings {
            match binding {
                Binding::Buffer(buffer) => {
                    let (memory, _) = hold_memory(inner, buffer, "record a dispatch over")?;
                    bound.push(BoundAddress::Fixed(memory.address()));
                    held.push(memory);
                }
                Binding::Scratch(scratch) => bound.push(BoundAddress::Scratch(scratch.index)),
                _ => {
                    return Err(BackendError::internal(
                        "check_recordable let a binding through",
                    ))
                }
            }
        }
        let counts: PerBinding<u32> = kernel
            .slots
            .iter()
            .zip(&sizes)
            // check_binding_sizes proved every size is a whole number of elements ≤ u32::MAX.
            .map(|(slot, &bytes)| (bytes / slot.elem.size_bytes() as u64) as u32)
            .collect();
        let index = slot_index(self.steps.len())?;
        self.steps.push(Step {
            kernel,
            bound,
            sizes,
            addresses: SmallVec::new(),
            counts,
            plan,
            iterations: request.fixpoint_iterations,
            nodes: SmallVec::new(),
            results: ResultParams::default(),
            scalars,
        });
        self.operations.push(Operation::Dispatch { step: index });
        self.memory.extend(held);
        Ok(StepId {
            graph: self.id,
            index,
        })
    }

    /// Copy `len` bytes of `handle` starting at byte `offset` into a fresh pinned
    /// output slot at this point of every replay; read it with
    /// [`DispatchGraph::output`] after a replay.
    pub fn read_back(
        &mut self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<OutputSlot, BackendError> {
        let (memory, capacity) = self.hold(buffer, "record a read-back of")?;
        check_recorded_read_back(offset, len, capacity)?;
        let staged = staged_len(len, "read-back")?;
        let end = align_up(self.output_bytes, staged)?;
        let index = slot_index(self.outputs.len())?;
        self.outputs.push(StagedRange {
            offset: self.output_bytes,
            len: staged,
        });
        self.output_bytes = end;
        self.operations.push(Operation::ReadBack {
            output: index,
            address: memory.address() + offset,
            memory: (memory.address(), memory.address() + capacity),
        });
        self.memory.push(memory);
        Ok(OutputSlot {
            graph: self.id,
            index,
        })
    }

    /// A device buffer of `bytes` bytes that exists only while a replay runs: the
    /// capture records an allocation node (`cuMemAllocAsync`) and a zero fill at the
    /// start of the graph and the matching free node at its end, so every replay
    /// sees it zeroed and no memory is held between replays. Bind it with
    /// [`Binding::Scratch`] in [`GraphRecorder::dispatch`]. Needs a device with memory
    /// pools.
    pub fn scratch(&mut self, bytes: u64) -> Result<ScratchBuffer, BackendError> {
        if bytes == 0 {
            return Err(BackendError::bad_input(
                "Fix: a scratch buffer of 0 bytes holds nothing; ask for at least 1 byte",
            ));
        }
        staged_len(bytes, "scratch buffer")?;
        let inner = self.backend.shared();
        let pools = inner
            .context
            .device()
            .memory_pools_supported()
            .map_err(|e| BackendError::driver("asking whether the device has memory pools", e))?;
        if !pools {
            return Err(BackendError::bad_input(
                "Fix: this device has no memory pools, so a graph cannot allocate scratch memory; allocate \
                 a DeviceBuffer instead and bind it",
            ));
        }
        let index = slot_index(self.scratch.len())?;
        self.scratch.push(bytes);
        Ok(ScratchBuffer {
            graph: self.id,
            index,
            bytes,
        })
    }

    fn check_scratch(&self, scratch: &ScratchBuffer) -> Result<(), BackendError> {
        if scratch.graph != self.id {
            return Err(BackendError::bad_input(format!(
                "Fix: scratch buffer {} belongs to dispatch graph #{} but is bound in the recording of graph #{}; \
                 scratch buffers live inside one graph: ask this recorder for its own",
                scratch.index, scratch.graph, self.id
            )));
        }
        match self.scratch.get(scratch.index as usize) {
            Some(&bytes) if bytes == scratch.bytes => Ok(()),
            _ => Err(BackendError::bad_input(format!(
                "Fix: scratch buffer {} does not exist in this recording; the value was forged or corrupted",
                scratch.index
            ))),
        }
    }

    /// The memory behind a live owned buffer (kept alive by the returned `Arc`) and
    /// its size.
    fn hold(
        &self,
        buffer: &DeviceBuffer,
        verb: &str,
    ) -> Result<(Arc<DeviceMemory>, u64), BackendError> {
        hold_memory(self.backend.shared(), buffer, verb)
    }

    /// Capture the described chain and instantiate it.
    fn finish(mut self) -> Result<DispatchGraph, BackendError> {
        if self.operations.is_empty() {
            return Err(BackendError::bad_input(
                "Fix: the recording closure recorded nothing; record at least one upload, dispatch or read-back",
            ));
        }
        let backend = self.backend.clone();
        let inner = Arc::clone(backend.shared());
        inner.check_alive()?;
        inner.bind()?;
        let scratch_bytes = self
            .scratch
            .iter()
            .try_fold(0u64, |total, &bytes| total.checked_add(bytes));
        if !self.scratch.is_empty() {
            let required = scratch_bytes.unwrap_or(u64::MAX);
            let available = backend.memory_budget()?.available;
            if required > available {
                return Err(BackendError::OverBudget {
                    required,
                    available,
                });
            }
        }
        let name = if self.steps.is_empty() {
            format!("dispatch graph #{} [copies only]", self.id)
        } else {
            let names: Vec<&str> = self.steps.iter().map(|s| s.kernel.name.as_str()).collect();
            format!("dispatch graph #{} [{}]", self.id, names.join(" → "))
        };
        let resource_error =
            |what: &str, e: DriverError| BackendError::driver(format!("{what} for {name}"), e);
        let stream = Stream::new().map_err(|e| resource_error("creating the stream", e))?;
        let window_start =
            Event::new().map_err(|e| resource_error("creating a timing event", e))?;
        let window_end = Event::new().map_err(|e| resource_error("creating a timing event", e))?;
        let mut inputs = PinnedMemory::allocate(self.input_bytes)
            .map_err(|e| resource_error("allocating pinned input staging", e))?;
        let mut outputs = PinnedMemory::allocate(self.output_bytes)
            .map_err(|e| resource_error("allocating pinned output staging", e))?;
        let input_len = inputs.len();
        inputs.slice_mut(0, input_len).fill(0);
        let output_len = outputs.len();
        outputs.slice_mut(0, output_len).fill(0);

        let results =
            ResultArea::new().map_err(|e| resource_error("allocating the result area", e))?;
        let folding = self.fold_read_backs(&results);
        let captured = self.capture(&stream, &inputs, &outputs, &folding, &name);
        let failed = |what: &str, e: DriverError| {
            if e.is_sticky() {
                inner.mark_context_lost(format!("recording {name} failed: {e}"));
            }
            BackendError::driver(format!("{what} for {name}"), e)
        };
        let graph = captured?;
        let graph_nodes = graph
            .node_count()
            .map_err(|e| failed("counting the graph's nodes", e))?;
        let exec = graph
            .instantiate()
            .map_err(|e| failed("instantiating the graph", e))?;
        Ok(DispatchGraph {
            id: self.id,
            name,
            resources: Some(Resources {
                exec,
                graph,
                stream,
                window_start,
                window_end,
                inputs,
                outputs,
                results: Box::new(results),
                results_used: folding.used,
                memory: std::mem::take(&mut self.memory),
            }),
            steps: std::mem::take(&mut self.steps),
            inputs: std::mem::take(&mut self.inputs),
            outputs: std::mem::take(&mut self.outputs),
            folded_outputs: folding.outputs.into_boxed_slice(),
            graph_nodes,
            scratch_buffers: self.scratch.len(),
            broken: None,
            backend,
        })
    }

    /// Which read-backs ride in a dispatch's epilogue: those recorded right after a
    /// dispatch (only read-backs in between), each at most `MAPPED_RANGE_MAX_BYTES`,
    /// up to `RESULT_RANGE_SLOTS` per dispatch, while the area has room. Fills every
    /// step's result parameters (stamp flags, descriptors) and says where each
    /// folded output lands in the area.
    fn fold_read_backs(&mut self, area: &ResultArea) -> Folding {
        let steps = self.steps.len();
        let mut params: Vec<ResultParams> = (0..steps)
            .map(|index| {
                let mut params = area.params();
                params.stamps_start = index == 0;
                params.stamps_end = index + 1 == steps;
                params
            })
            .collect();
        let limits: Vec<u64> = self
            .steps
            .iter()
            .map(|step| mapped_range_limit(step.kernel.workgroup_size.iter().product::<u32>()))
            .collect();
        let folding = plan_folding(&self.operations, &self.outputs, &limits, &mut params);
        for (step, params) in self.steps.iter_mut().zip(params) {
            step.results = params;
        }
        folding
    }

    /// One stream capture of every operation in order, between the scratch
    /// allocations and their frees. Any failure ends and discards the capture
    /// (`Capture`'s drop), so the stream never stays capturing.
    fn capture(
        &mut self,
        stream: &Stream,
        inputs: &PinnedMemory,
        outputs: &PinnedMemory,
        folding: &Folding,
        name: &str,
    ) -> Result<driver::Graph, BackendError> {
        let inner = Arc::clone(self.backend.shared());
        let failed = |what: &str, e: DriverError| {
            if e.is_sticky() {
                inner.mark_context_lost(format!("recording {name} failed: {e}"));
            }
            BackendError::driver(format!("{what} while recording {name}"), e)
        };
        let capture = Capture::begin(stream).map_err(|e| failed("beginning the capture", e))?;
        let mut scratch_addresses: SmallVec<[u64; 4]> = SmallVec::new();
        for &bytes in &self.scratch {
            // SAFETY: inside the capture this records an allocation node; its free
            // node is recorded below, after every use, before the capture ends.
            let address = unsafe { driver::allocate_async(bytes, stream) }
                .map_err(|e| failed("recording a scratch allocation", e))?;
            scratch_addresses.push(address);
            // SAFETY: [address, address + bytes) is the graph allocation just recorded.
            unsafe { driver::fill_bytes_async(address, 0, bytes as usize, stream) }
                .map_err(|e| failed("recording a scratch zero fill", e))?;
        }
        let mut target = CaptureTarget {
            capture: &capture,
            inputs,
            outputs,
            nodes: SmallVec::new(),
        };
        for operation in &self.operations {
            let mut ops: StreamOps<'_, LoadedModule> = StreamOps::empty();
            let read_back;
            let mut step_index = None;
            match *operation {
                Operation::Upload { input, address } => {
                    let range = self.inputs[input as usize];
                    ops.uploads.push(StagedCopy {
                        device: address,
                        staging_offset: range.offset,
                        len: range.len,
                    });
                }
                Operation::ReadBack { output, .. }
                    if folding.outputs[output as usize].is_some() =>
                {
                    // Folded into the preceding dispatch's epilogue: no copy node.
                    continue;
                }
                Operation::ReadBack {
                    output, address, ..
                } => {
                    let range = self.outputs[output as usize];
                    read_back = [StagedCopy {
                        device: address,
                        staging_offset: range.offset,
                        len: range.len,
                    }];
                    ops.readback = Readback::StagedCopies(&read_back);
                }
                Operation::Dispatch { step } => {
                    let step = &mut self.steps[step as usize];
                    step.addresses = step
                        .bound
                        .iter()
                        .map(|bound| match *bound {
                            BoundAddress::Fixed(address) => address,
                            BoundAddress::Scratch(index) => scratch_addresses[index as usize],
                        })
                        .collect();
                    step_index = Some(operation);
                }
            }
            if let Some(&Operation::Dispatch { step }) = step_index {
                ops = step_operations(&self.steps[step as usize]);
            }
            // SAFETY: upload and read-back staging ranges were sized at recording
            // and live in the graph (as long as its executable); device ranges lie
            // inside buffers whose memory the graph holds (bounds checked at
            // recording) or graph allocations freed only at the end of the chain; the
            // result area (control block, mapped bytes) lives in the graph's resources
            // and every folded descriptor's destination was placed inside it; the
            // host touches the staging and the area only between replays, after a
            // synchronize.
            unsafe { enqueue(&mut ops, &mut target) }.map_err(|f| failed(f.what, f.error))?;
            if let Some(&Operation::Dispatch { step }) = step_index {
                self.steps[step as usize].nodes = std::mem::take(&mut target.nodes);
            }
        }
        for &address in &scratch_addresses {
            // SAFETY: the allocation came from allocate_async above and every use of it
            // was recorded before this point of the chain.
            unsafe { driver::free_async(address, stream) }
                .map_err(|e| failed("recording a scratch free", e))?;
        }
        let graph = capture.end().map_err(|e| failed("ending the capture", e))?;
        self.check_launch_nodes(&graph, name, &failed)?;
        Ok(graph)
    }

    /// Every recorded launch became a kernel node of `graph` (the nodes parameter
    /// updates write).
    fn check_launch_nodes(
        &self,
        graph: &driver::Graph,
        name: &str,
        failed: &dyn Fn(&str, DriverError) -> BackendError,
    ) -> Result<(), BackendError> {
        for step in &self.steps {
            for &node in &step.nodes {
                let kind = graph
                    .node_kind(node)
                    .map_err(|e| failed("checking a launch node", e))?;
                if kind != GraphNodeKind::Kernel {
                    return Err(BackendError::internal(format!(
                        "a recorded launch of {} did not become a kernel node of {name}",
                        step.kernel.name
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The stream operations of one recorded step: the same description an eager
/// dispatch enqueues (`StreamOps::dispatch`: the `WriteOnly` clears, then the launch
/// loop), without its events and readback copies, with the result ABI's values of
/// the graph (its stamps and this step's folded read-backs, copied by its last
/// launch's last thread).
fn step_operations(step: &Step) -> StreamOps<'_, LoadedModule> {
    let kernel = &step.kernel;
    let mut ops = StreamOps::dispatch(
        &kernel.slots,
        &step.addresses,
        &step.sizes,
        &step.scalars,
        KernelLaunch {
            module: &kernel.module,
            grid: step.plan.grid,
            block: step.plan.block,
            iterations: step.iterations,
            // Its own word (a graph's private instance), zero when its module
            // loads and never cleared by a node: every grid sync adds exactly the
            // phase bit to it (the first workgroup 2^31 - (G - 1), every other
            // one 1), so a launch that returns leaves the arrival bits as it found
            // them, whatever its grid, and a waiter compares the phase bit across
            // its own sync only. A launch that does not return (a trap) leaves the
            // context unusable, and the graph with it.
            grid_barrier: kernel.grid_barrier,
            barrier_settled: true,
        },
    );
    ops.parameters.results = Some(step.results.clone());
    ops
}

impl Drop for GraphRecorder<'_> {
    /// A recording that failed (or whose graph took its resources) releases the
    /// memory it held; with the context bound, or forgotten after a context loss.
    fn drop(&mut self) {
        if self.memory.is_empty() && self.steps.is_empty() {
            return;
        }
        let inner = self.backend.shared();
        if inner.check_alive().is_err() || inner.bind().is_err() {
            for memory in self.memory.drain(..) {
                std::mem::forget(memory);
            }
            for step in self.steps.drain(..) {
                std::mem::forget(step.kernel);
            }
        }
    }
}

/// The memory behind a live owned buffer of `inner`'s backend (kept alive by the
/// returned `Arc`) and its size. A buffer of another device is refused with the
/// cross-device message first: one recording is one stream capture on one device,
/// and a capture that touches (or waits on) another device's work fails in the
/// driver (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and can leave the stream
/// unusable. Shared by recordings and stitches.
pub(super) fn hold_memory(
    inner: &BackendInner,
    buffer: &DeviceBuffer,
    verb: &str,
) -> Result<(Arc<DeviceMemory>, u64), BackendError> {
    if let Some(owner) = buffer.device_ordinal() {
        check_device("a buffer", owner, inner.caps.ordinal)?;
    }
    Ok((Arc::clone(buffer.memory_for(inner, verb)?), buffer.len()))
}

/// The rules a recorded dispatch follows beyond an eager one's, the same on every
/// backend: no predecessor (a graph runs its operations in recording order), no
/// readback ranges (bytes come back through read-backs), and only buffers that
/// outlive the recording (a replay outlives any host slice).
pub(in crate::backend) fn check_recordable(
    name: &str,
    request: &Dispatch<'_>,
) -> Result<(), BackendError> {
    if request.after.is_some() {
        return Err(BackendError::bad_input(format!(
            "Fix: the recorded dispatch of {name} names a predecessor; inside a dispatch graph \
             operations run in the order they were recorded, so record it after the one it follows \
             instead of naming it"
        )));
    }
    if let ReadbackPolicy::Ranges(_) = request.readback {
        return Err(BackendError::bad_input(format!(
            "Fix: readback ranges do not apply inside a dispatch graph (recording {name}); use \
             ReadbackPolicy::None and record a read_back for the bytes you need"
        )));
    }
    for (index, binding) in request.bindings.iter().enumerate() {
        if !matches!(binding, Binding::Buffer(_) | Binding::Scratch(_)) {
            return Err(BackendError::bad_input(format!(
                "Fix: binding {index} of the recorded dispatch of {name} is host data (host, zeroed \
                 or pinned); a replay outlives it: bind a DeviceBuffer (record an upload into it for \
                 fresh inputs) or a scratch buffer of the recording"
            )));
        }
    }
    Ok(())
}

/// A recorded upload of `bytes` bytes into a buffer of `capacity` bytes: at least
/// one byte, at most the buffer (the same rule on every backend).
pub(in crate::backend) fn check_recorded_upload(
    bytes: u64,
    capacity: u64,
) -> Result<(), BackendError> {
    if bytes == 0 {
        return Err(BackendError::bad_input(
            "Fix: an upload of 0 bytes copies nothing; upload at least 1 byte or leave the upload out",
        ));
    }
    if bytes > capacity {
        return Err(BackendError::bad_input(format!(
            "Fix: cannot record an upload of {bytes} bytes: the buffer holds {capacity} bytes; upload \
             at most that many or allocate a larger buffer"
        )));
    }
    Ok(())
}

/// A recorded read-back of `len` bytes from byte `offset` of a buffer of `capacity`
/// bytes: at least one byte, inside the buffer (the same rule on every backend).
pub(in crate::backend) fn check_recorded_read_back(
    offset: u64,
    len: u64,
    capacity: u64,
) -> Result<(), BackendError> {
    if len == 0 {
        return Err(BackendError::bad_input(
            "Fix: a read-back of 0 bytes copies nothing; read at least 1 byte or leave the read-back out",
        ));
    }
    if offset.checked_add(len).is_none_or(|end| end > capacity) {
        return Err(BackendError::bad_input(format!(
            "Fix: read-back range {offset}..+{len} is past the buffer's {capacity} bytes; keep offset + \
             len within the buffer"
        )));
    }
    Ok(())
}

/// A grid-sync step's grid against the workgroups the device holds at once now,
/// beside the context's running lanes (`GridTooLargeForGridSync` where its
/// cooperative launch would wait forever); nothing for other kernels. Checked
/// when the step is recorded and before every replay, since a lane may start
/// in between.
pub(super) fn check_grid_sync_fits(
    inner: &BackendInner,
    kernel: &KernelInner,
    plan: &LaunchPlan,
) -> Result<(), BackendError> {
    if kernel.grid_barrier.is_none() {
        return Ok(());
    }
    check_coresident(
        &kernel.name,
        true,
        plan,
        inner.coresident_now(kernel.max_coresident_blocks),
    )
}

/// `Ok` when `owner` (the device of a buffer or kernel) is `recording` (the device
/// of the recording's backend), else the cross-device `Fix:` error. Pure.
pub(super) fn check_device(what: &str, owner: usize, recording: usize) -> Result<(), BackendError> {
    if owner == recording {
        return Ok(());
    }
    Err(BackendError::bad_input(format!(
        "Fix: {what} of device {owner} is used in a recording on device {recording}; one recording is \
         one stream capture on one device and cannot bind or wait on another device's buffers, kernels \
         or work. Record device {owner}'s part with its own backend (CudaBackend::acquire_device({owner})), \
         then stitch the per-device graphs with graph::StitchBuilder (depend for ordering, transfer \
         for the bytes that cross)"
    )))
}

/// The folding rule of `GraphRecorder::fold_read_backs` (pure): walk the operations;
/// after a dispatch, each read-back (until the next upload or dispatch) that fits the
/// step's size limit (`limits`, from `readback::mapped_range_limit`), a free descriptor of that step and the area is described in `steps`
/// (one `ResultParams` per step) and placed at the next 16-byte aligned offset.
fn plan_folding(
    operations: &[Operation],
    outputs: &[StagedRange],
    limits: &[u64],
    steps: &mut [ResultParams],
) -> Folding {
    let mut folded = vec![None; outputs.len()];
    let mut next = STAMP_BYTES;
    let mut current: Option<usize> = None;
    for operation in operations {
        match *operation {
            Operation::Dispatch { step } => current = Some(step as usize),
            Operation::ReadBack {
                output,
                address,
                memory,
            } => {
                let Some(step) = current else { continue };
                let len = outputs[output as usize].len;
                // Whole 16-byte blocks per placement: a window's store writes one.
                let footprint = len.div_ceil(16) * 16;
                let fits = len as u64 <= limits[step]
                    && next + footprint <= RESULT_AREA_BYTES
                    && u32::try_from(next).is_ok();
                if !fits {
                    continue;
                }
                if let Some(delivered) =
                    steps[step].describe(address, len as u32, next as u32, memory.0..memory.1)
                {
                    folded[output as usize] = Some(delivered as usize);
                    next += footprint;
                }
            }
            Operation::Upload { .. } => current = None,
        }
    }
    Folding {
        outputs: folded,
        used: next,
    }
}

/// The read-backs folded into dispatch epilogues (`GraphRecorder::fold_read_backs`).
struct Folding {
    /// Per output slot, its offset in the result area when folded.
    outputs: Vec<Option<usize>>,
    /// Bytes of the area in use (stamps included).
    used: usize,
}

fn slot_index(len: usize) -> Result<u32, BackendError> {
    u32::try_from(len).map_err(|_| {
        BackendError::bad_input(
            "Fix: a recording holds at most u32::MAX operations of one kind; record fewer",
        )
    })
}

/// The capturing stream as a [`StreamTarget`]: uploads read the graph's input
/// staging, read-backs write its output staging, and every launch's node is kept
/// for later parameter updates.
struct CaptureTarget<'c, 's> {
    capture: &'c Capture<'s>,
    inputs: &'c PinnedMemory,
    outputs: &'c PinnedMemory,
    nodes: SmallVec<[GraphNode; 4]>,
}

impl StreamTarget for CaptureTarget<'_, '_> {
    type Module = LoadedModule;

    fn record(&mut self, _mark: DeviceMark) -> DriverResult<()> {
        // Graph steps are described untimed; a replay times the whole launch.
        Ok(())
    }

    unsafe fn upload(&mut self, copy: StagedCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe {
            driver::copy_to_device_async(
                copy.device,
                self.inputs.address(copy.staging_offset),
                copy.len,
                self.capture.stream(),
            )
        }
    }

    unsafe fn clear(&mut self, clear: Clear) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe { driver::fill_bytes_async(clear.device, 0, clear.bytes, self.capture.stream()) }
    }

    unsafe fn copy_between(&mut self, _copy: BufferCopy) -> DriverResult<()> {
        // Graph steps are dispatches and read-backs; no description copies buffers.
        Err(DriverError::not_supported(
            "a buffer-to-buffer copy inside a graph capture",
        ))
    }

    unsafe fn upload_pinned(&mut self, _copy: PinnedCopy) -> DriverResult<()> {
        // A replay outlives any caller buffer: recordings bind no pinned buffers.
        Err(DriverError::not_supported(
            "a caller pinned-buffer upload inside a graph capture",
        ))
    }

    unsafe fn reset_grid_barrier(&mut self, counter: u64) -> DriverResult<()> {
        // SAFETY: forwarded obligation: the symbol (of the step's private module,
        // which the graph holds) holds GRID_BARRIER_WORDS words.
        unsafe {
            driver::fill_words_async(
                counter,
                0,
                crate::codegen::GRID_BARRIER_WORDS,
                self.capture.stream(),
            )
        }
    }

    unsafe fn launch(
        &mut self,
        launch: &KernelLaunch<'_, LoadedModule>,
        params: &mut [*mut std::ffi::c_void],
    ) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait); the driver copies the
        // parameter values into the graph node.
        unsafe {
            driver::launch(
                launch.module,
                launch.grid,
                launch.block,
                self.capture.stream(),
                params,
                launch.grid_barrier.is_some(),
            )
        }?;
        self.nodes.push(self.capture.last_node()?);
        Ok(())
    }

    unsafe fn read_back(&mut self, copy: StagedCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe {
            driver::copy_to_host_async(
                self.outputs.address(copy.staging_offset),
                copy.device,
                copy.len,
                self.capture.stream(),
            )
        }
    }

    unsafe fn copy_area_back(&mut self, copy: AreaCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe {
            driver::copy_to_host_async(copy.host, copy.device, copy.len, self.capture.stream())
        }
    }

    fn synchronize(&mut self) -> DriverResult<()> {
        // A capturing stream cannot be synchronised; a replay synchronises instead.
        Err(DriverError::not_supported(
            "synchronize inside a graph capture",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::readback::MAPPED_RANGE_MAX_BYTES;

    fn range(len: usize) -> StagedRange {
        StagedRange { offset: 0, len }
    }

    /// Locks out folding a read-back that does not directly follow its dispatch
    /// (an upload in between could change the bytes), folding one too large for the
    /// mapped route, and overlapping places in the area: only read-backs after a
    /// dispatch and before the next upload, each at most the limit, are folded, into
    /// the step they follow, at aligned offsets after the stamps.
    #[test]
    fn read_backs_fold_only_right_after_their_dispatch() {
        // Each read buffer spans its 16-byte block, but output 3's (bytes 0x44..0x4c
        // of a 32-byte buffer) is the only folded one inside a single block: a window,
        // delivered 4 bytes into its placement.
        let read = |output: u32, address: u64, memory: (u64, u64)| Operation::ReadBack {
            output,
            address,
            memory,
        };
        let operations = [
            read(0, 0x10, (0x10, 0x20)), // before any dispatch
            Operation::Dispatch { step: 0 },
            read(1, 0x20, (0x20, 0x40)),
            read(2, 0x30, (0x30, 0x2000)), // too large
            read(3, 0x44, (0x40, 0x60)),
            Operation::Upload {
                input: 0,
                address: 0x50,
            },
            read(4, 0x60, (0x60, 0x70)), // after an upload
            Operation::Dispatch { step: 1 },
            read(5, 0x70, (0x70, 0x80)),
        ];
        let outputs = [
            range(4),
            range(20),
            range(MAPPED_RANGE_MAX_BYTES as usize + 4),
            range(8),
            range(4),
            range(16),
        ];
        let mut steps = vec![ResultParams::new(1, 2), ResultParams::new(1, 2)];
        let folding = plan_folding(
            &operations,
            &outputs,
            &[MAPPED_RANGE_MAX_BYTES; 2],
            &mut steps,
        );
        assert_eq!(
            folding.outputs,
            [None, Some(16), None, Some(52), None, Some(64)]
        );
        assert_eq!(folding.used, 80);
        assert_eq!(steps[0], {
            let mut p = ResultParams::new(1, 2);
            assert_eq!(p.describe(0x20, 20, 16, 0x20..0x40), Some(16));
            assert_eq!(p.describe(0x44, 8, 48, 0x40..0x60), Some(52));
            p
        });
        assert_eq!(steps[1], {
            let mut p = ResultParams::new(1, 2);
            assert_eq!(p.describe(0x70, 16, 64, 0x70..0x80), Some(64));
            p
        });
    }
}
