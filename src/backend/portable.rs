//! One interface over the CUDA backend and the reference interpreter (issue 11,
//! SPEC §12): write the hot loop once, run it with or without a GPU.
//!
//! # Why this module exists
//!
//! The CPU fallback used to cover only `dispatch` of borrowed bytes: resident
//! buffers, compiled kernels, graphs and pending results had none, and
//! `reference::run` ignores the readback policy, so with `None` or `Ranges` the CPU
//! and the GPU returned different outputs for the same request. [`AnyBackend`] is
//! an enum over [`CudaBackend`] and [`ReferenceBackend`]; every object it makes —
//! [`AnyBuffer`], [`AnyKernel`], [`AnyPending`], [`AnyGraph`] — is an enum of the
//! same two kinds, and every method gives byte-identical outputs in the same shapes
//! on both. On the reference side:
//! - buffers are host memory that keeps its bytes between dispatches, like device
//!   memory (outputs of a dispatch stay in the buffer; `WriteOnly` starts zeroed);
//! - bindings are checked and the readback policy planned by the same pure code the
//!   CUDA backend uses (`backend::plan`), so sizes, ranges and their `Fix:` errors
//!   match, and the policy is applied to the interpreter's whole outputs;
//! - a pending result is computed at submission (the interpreter is synchronous);
//! - a graph replays its recorded uploads, dispatches and read-backs in order, with
//!   the CUDA recorder's rules (no readback ranges, no grid sync inside a graph).
//!
//! Timings on the reference side: `wall_ns` only; device times are 0.
//!
//! ```
//! use vyre_cuda::backend::{AnyBackend, AnyBinding};
//! use vyre_cuda::ir::*;
//! use vyre_cuda::DispatchConfig;
//!
//! # fn main() -> Result<(), vyre_cuda::backend::BackendError> {
//! let program = Program::builder([64, 1, 1])
//!     .buffer("x", 0, Access::ReadWrite, ElemType::U32, BufferCount::Runtime)
//!     .body(|b| {
//!         let i = b.let_("i", Expr::global_id(Axis::X));
//!         b.if_(i.clone().less_than(Expr::length("x")), |b| {
//!             b.store("x", i.clone(), Expr::load("x", i.clone()) + 1u32);
//!         });
//!     })
//!     .build();
//! // The GPU where there is one, the reference interpreter otherwise.
//! let backend = AnyBackend::cuda_or_reference();
//! let config = DispatchConfig::linear(1);
//! let kernel = backend.compile(&program, &config)?;
//! let x = backend.buffer_from(&[0u8; 256])?;
//! let pending = backend.submit(&kernel, &[AnyBinding::Buffer(&x)], &config)?;
//! let outputs = pending.wait()?.outputs;
//! assert_eq!(outputs[0][..4], 1u32.to_le_bytes());
//! assert_eq!(backend.read(&x)?[..4], 1u32.to_le_bytes()); // outputs stay in the buffer
//! # Ok(())
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use smallvec::SmallVec;

use crate::config::{DispatchConfig, ReadbackPolicy};
use crate::graph::{DispatchGraph, GraphBinding, GraphRecorder, InputSlot, OutputSlot, StepId};
use crate::ir::{Node, Program};

use super::outputs::Outputs;
use super::plan::{binding_slots, check_binding_sizes, plan_readback, ReadItem};
use super::{
    BackendError, Binding, CudaBackend, DeviceBuffer, DispatchTiming, Kernel, PendingDispatch,
    TimedDispatch,
};

static NEXT_REFERENCE_ID: AtomicU64 = AtomicU64::new(1);

/// The reference interpreter as a backend: buffers in host memory, dispatches run
/// on the CPU, bit-identical to the GPU.
#[derive(Debug)]
pub struct ReferenceBackend {
    id: u64,
}

impl Default for ReferenceBackend {
    fn default() -> Self {
        ReferenceBackend::new()
    }
}

impl ReferenceBackend {
    /// A new reference backend (its buffers are refused by every other one).
    pub fn new() -> Self {
        ReferenceBackend {
            id: NEXT_REFERENCE_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// The CUDA backend or the reference interpreter, behind one interface.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyBackend {
    /// A CUDA device.
    Cuda(CudaBackend),
    /// The CPU reference interpreter.
    Reference(ReferenceBackend),
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.caps().name)
            .finish()
    }
}

/// Host memory of a reference buffer.
#[derive(Debug)]
struct HostMemory {
    backend: u64,
    bytes: Mutex<Vec<u8>>,
}

impl HostMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A buffer of an [`AnyBackend`]: device memory freed on drop, or reference host
/// memory. Starts zeroed.
#[derive(Debug)]
pub struct AnyBuffer {
    kind: BufferKind,
}

#[derive(Debug)]
enum BufferKind {
    Cuda(DeviceBuffer),
    Reference(Arc<HostMemory>),
}

impl AnyBuffer {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        match &self.kind {
            BufferKind::Cuda(buffer) => buffer.len(),
            BufferKind::Reference(memory) => memory.lock().len() as u64,
        }
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The CUDA buffer, when this is one.
    pub fn as_cuda(&self) -> Option<&DeviceBuffer> {
        match &self.kind {
            BufferKind::Cuda(buffer) => Some(buffer),
            BufferKind::Reference(_) => None,
        }
    }
}

/// One binding of an [`AnyBackend`] dispatch, in binding order.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum AnyBinding<'a> {
    /// A buffer of the same backend, used in place (outputs stay in it).
    Buffer(&'a AnyBuffer),
    /// Host bytes for this dispatch only (`WriteOnly`: only the length matters).
    Bytes(&'a [u8]),
}

impl<'a> From<&'a AnyBuffer> for AnyBinding<'a> {
    fn from(buffer: &'a AnyBuffer) -> Self {
        AnyBinding::Buffer(buffer)
    }
}

/// A compiled kernel of an [`AnyBackend`].
#[derive(Clone, Debug)]
pub struct AnyKernel {
    kind: KernelKind,
}

#[derive(Clone, Debug)]
enum KernelKind {
    Cuda(Kernel),
    Reference { backend: u64, program: Program },
}

impl AnyKernel {
    /// The program it was compiled from.
    pub fn program(&self) -> &Program {
        match &self.kind {
            KernelKind::Cuda(kernel) => kernel.program(),
            KernelKind::Reference { program, .. } => program,
        }
    }
}

/// A submitted dispatch of an [`AnyBackend`]; [`AnyPending::wait`] yields its
/// outputs and timings. Dropping it without waiting waits (CUDA) or discards the
/// already computed result (reference).
#[derive(Debug)]
#[must_use = "a pending dispatch does nothing visible until `wait`"]
pub struct AnyPending {
    kind: PendingKind,
}

#[derive(Debug)]
enum PendingKind {
    Cuda(PendingDispatch),
    Reference(Result<TimedDispatch, BackendError>),
}

impl AnyPending {
    /// Wait for the dispatch and return its outputs (per its readback policy) and
    /// timings.
    pub fn wait(self) -> Result<TimedDispatch, BackendError> {
        match self.kind {
            PendingKind::Cuda(pending) => pending.wait(),
            PendingKind::Reference(result) => result,
        }
    }
}

fn mismatch(what: &str, backend: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {what} belongs to another backend than this {backend} AnyBackend; use objects made by the \
         backend you pass them to"
    ))
}

impl AnyBackend {
    /// The CUDA backend of device 0 where a driver and a device exist, the
    /// reference interpreter otherwise.
    pub fn cuda_or_reference() -> AnyBackend {
        match CudaBackend::acquire() {
            Ok(gpu) => AnyBackend::Cuda(gpu),
            Err(error) => {
                tracing::info!(%error, "no CUDA device: using the reference interpreter");
                AnyBackend::Reference(ReferenceBackend::new())
            }
        }
    }

    /// A fresh reference backend.
    pub fn reference() -> AnyBackend {
        AnyBackend::Reference(ReferenceBackend::new())
    }

    /// Whether this runs on a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, AnyBackend::Cuda(_))
    }

    fn kind_name(&self) -> &'static str {
        match self {
            AnyBackend::Cuda(_) => "CUDA",
            AnyBackend::Reference(_) => "reference",
        }
    }

    /// A zeroed buffer of `bytes` bytes.
    pub fn buffer(&self, bytes: u64) -> Result<AnyBuffer, BackendError> {
        let kind = match self {
            AnyBackend::Cuda(gpu) => BufferKind::Cuda(gpu.buffer(bytes)?),
            AnyBackend::Reference(reference) => {
                let len = usize::try_from(bytes).map_err(|_| {
                    BackendError::bad_input(format!(
                        "Fix: a buffer of {bytes} bytes does not fit this host's address space; ask for less"
                    ))
                })?;
                BufferKind::Reference(Arc::new(HostMemory {
                    backend: reference.id,
                    bytes: Mutex::new(vec![0; len]),
                }))
            }
        };
        Ok(AnyBuffer { kind })
    }

    /// A buffer holding a copy of `data`.
    pub fn buffer_from(&self, data: &[u8]) -> Result<AnyBuffer, BackendError> {
        let buffer = self.buffer(data.len() as u64)?;
        self.upload(&buffer, data)?;
        Ok(buffer)
    }

    /// Copy `data` into the start of `buffer` (`data` may be shorter).
    pub fn upload(&self, buffer: &AnyBuffer, data: &[u8]) -> Result<(), BackendError> {
        match (self, &buffer.kind) {
            (AnyBackend::Cuda(gpu), BufferKind::Cuda(device)) => gpu.upload(device, data),
            (AnyBackend::Reference(reference), BufferKind::Reference(memory))
                if memory.backend == reference.id =>
            {
                let mut bytes = memory.lock();
                if data.len() > bytes.len() {
                    return Err(BackendError::bad_input(format!(
                        "Fix: cannot upload {} bytes: the buffer holds {} bytes; allocate a larger one or \
                         upload fewer bytes",
                        data.len(),
                        bytes.len()
                    )));
                }
                bytes[..data.len()].copy_from_slice(data);
                Ok(())
            }
            _ => Err(mismatch("the buffer", self.kind_name())),
        }
    }

    /// Read a whole buffer.
    pub fn read(&self, buffer: &AnyBuffer) -> Result<Vec<u8>, BackendError> {
        match (self, &buffer.kind) {
            (AnyBackend::Cuda(gpu), BufferKind::Cuda(device)) => gpu.read(device),
            (AnyBackend::Reference(reference), BufferKind::Reference(memory))
                if memory.backend == reference.id =>
            {
                Ok(memory.lock().clone())
            }
            _ => Err(mismatch("the buffer", self.kind_name())),
        }
    }

    /// Compile `program` (only `config.codegen` matters). The reference side
    /// validates nothing here: its dispatches do.
    pub fn compile(
        &self,
        program: &Program,
        config: &DispatchConfig,
    ) -> Result<AnyKernel, BackendError> {
        let kind = match self {
            AnyBackend::Cuda(gpu) => KernelKind::Cuda(gpu.compile(program, config)?),
            AnyBackend::Reference(reference) => KernelKind::Reference {
                backend: reference.id,
                program: program.clone(),
            },
        };
        Ok(AnyKernel { kind })
    }

    /// Dispatch `kernel` and wait: outputs per `config.readback`, and timings.
    pub fn dispatch(
        &self,
        kernel: &AnyKernel,
        bindings: &[AnyBinding<'_>],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => {
                let kernel = self.cuda_kernel(kernel)?;
                let bindings = self.cuda_bindings(bindings)?;
                gpu.dispatch_kernel(kernel, &bindings, config)
            }
            AnyBackend::Reference(reference) => {
                let program = self.reference_program(reference, kernel)?;
                reference_dispatch(reference, program, bindings, config)
            }
        }
    }

    /// Submit a dispatch without waiting (CUDA: on its own lane, see
    /// [`CudaBackend::submit_kernel_timed`]; reference: computed now).
    pub fn submit(
        &self,
        kernel: &AnyKernel,
        bindings: &[AnyBinding<'_>],
        config: &DispatchConfig,
    ) -> Result<AnyPending, BackendError> {
        let kind = match self {
            AnyBackend::Cuda(gpu) => {
                let kernel = self.cuda_kernel(kernel)?;
                let bindings = self.cuda_bindings(bindings)?;
                PendingKind::Cuda(gpu.submit_kernel_timed(kernel, &bindings, config)?)
            }
            AnyBackend::Reference(reference) => {
                let program = self.reference_program(reference, kernel)?;
                PendingKind::Reference(reference_dispatch(reference, program, bindings, config))
            }
        };
        Ok(AnyPending { kind })
    }

    /// Record a chain of uploads, dispatches and read-backs into a replayable graph
    /// (CUDA: one CUDA graph, see [`crate::graph`]).
    pub fn record(
        &self,
        build: impl FnOnce(&mut AnyRecorder<'_, '_>) -> Result<(), BackendError>,
    ) -> Result<AnyGraph, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => {
                let graph = gpu.record(|recorder| {
                    let mut any = AnyRecorder {
                        kind: RecorderKind::Cuda(recorder),
                    };
                    build(&mut any)
                })?;
                Ok(AnyGraph {
                    kind: GraphKind::Cuda(graph),
                })
            }
            AnyBackend::Reference(reference) => {
                let mut graph = ReferenceGraph {
                    id: crate::graph::next_graph_id(),
                    backend: reference.id,
                    operations: Vec::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    steps: Vec::new(),
                };
                let mut any = AnyRecorder {
                    kind: RecorderKind::Reference(&mut graph),
                };
                build(&mut any)?;
                if graph.operations.is_empty() {
                    return Err(BackendError::bad_input(
                        "Fix: the recording closure recorded nothing; record at least one upload, dispatch or \
                         read-back",
                    ));
                }
                Ok(AnyGraph {
                    kind: GraphKind::Reference(graph),
                })
            }
        }
    }

    fn cuda_kernel<'k>(&self, kernel: &'k AnyKernel) -> Result<&'k Kernel, BackendError> {
        match &kernel.kind {
            KernelKind::Cuda(kernel) => Ok(kernel),
            KernelKind::Reference { .. } => Err(mismatch("the kernel", self.kind_name())),
        }
    }

    fn cuda_bindings<'a>(
        &self,
        bindings: &[AnyBinding<'a>],
    ) -> Result<SmallVec<[Binding<'a>; 16]>, BackendError> {
        bindings
            .iter()
            .map(|binding| match *binding {
                AnyBinding::Bytes(bytes) => Ok(Binding::Borrowed(bytes)),
                AnyBinding::Buffer(buffer) => match &buffer.kind {
                    BufferKind::Cuda(device) => Ok(Binding::Buffer(device)),
                    BufferKind::Reference(_) => Err(mismatch("a bound buffer", self.kind_name())),
                },
            })
            .collect()
    }

    fn reference_program<'k>(
        &self,
        reference: &ReferenceBackend,
        kernel: &'k AnyKernel,
    ) -> Result<&'k Program, BackendError> {
        match &kernel.kind {
            KernelKind::Reference { backend, program } if *backend == reference.id => Ok(program),
            _ => Err(mismatch("the kernel", self.kind_name())),
        }
    }
}

/// One reference dispatch: the CUDA backend's binding checks and readback plan,
/// the interpreter over copies of the bound bytes, outputs written back into bound
/// buffers, then the policy applied to the final bytes.
fn reference_dispatch(
    reference: &ReferenceBackend,
    program: &Program,
    bindings: &[AnyBinding<'_>],
    config: &DispatchConfig,
) -> Result<TimedDispatch, BackendError> {
    let start = Instant::now();
    let name = program.display_name();
    let (slots, outputs) = binding_slots(program);
    let mut inputs: Vec<Vec<u8>> = Vec::with_capacity(bindings.len());
    for binding in bindings {
        inputs.push(match *binding {
            AnyBinding::Bytes(bytes) => bytes.to_vec(),
            AnyBinding::Buffer(buffer) => match &buffer.kind {
                BufferKind::Reference(memory) if memory.backend == reference.id => {
                    memory.lock().clone()
                }
                _ => return Err(mismatch("a bound buffer", "reference")),
            },
        });
    }
    let sizes: SmallVec<[u64; 16]> = inputs.iter().map(|v| v.len() as u64).collect();
    check_binding_sizes(&name, &slots, &sizes, config.fixpoint_iterations)?;
    let mut reads: crate::backend::PerBinding<ReadItem> = SmallVec::new();
    plan_readback(
        &name,
        &slots,
        &outputs,
        &sizes,
        &config.readback,
        0,
        &mut reads,
    )?;
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let results = crate::reference::run(program, &borrowed, config).map_err(|error| {
        BackendError::Reference {
            program: name.clone(),
            error,
        }
    })?;
    // The interpreter returns every output buffer whole, ascending binding: the
    // final bytes of those slots.
    for (&slot, bytes) in outputs.iter().zip(results) {
        let slot = slot as usize;
        if let AnyBinding::Buffer(buffer) = bindings[slot] {
            if let BufferKind::Reference(memory) = &buffer.kind {
                memory.lock().copy_from_slice(&bytes);
            }
        }
        inputs[slot] = bytes;
    }
    let mut outputs = Outputs::with_capacity(reads.iter().map(|read| read.len as usize).sum());
    for read in &reads {
        let start = read.offset as usize;
        outputs.push(&inputs[read.slot as usize][start..start + read.len as usize]);
    }
    let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(TimedDispatch {
        outputs,
        wall_ns,
        enqueue_ns: wall_ns,
        wait_ns: 0,
        device_window_ns: 0,
        kernel_ns: 0,
    })
}

/// Describes a chain inside [`AnyBackend::record`]; mirrors [`GraphRecorder`].
pub struct AnyRecorder<'r, 'b> {
    kind: RecorderKind<'r, 'b>,
}

enum RecorderKind<'r, 'b> {
    Cuda(&'r mut GraphRecorder<'b>),
    Reference(&'r mut ReferenceGraph),
}

impl AnyRecorder<'_, '_> {
    /// Copy the first `bytes` bytes of a fresh input slot into the start of
    /// `buffer` at this point of every replay ([`GraphRecorder::upload`]).
    pub fn upload(&mut self, buffer: &AnyBuffer, bytes: u64) -> Result<InputSlot, BackendError> {
        match (&mut self.kind, &buffer.kind) {
            (RecorderKind::Cuda(recorder), BufferKind::Cuda(device)) => {
                recorder.upload(device, bytes)
            }
            (RecorderKind::Reference(graph), BufferKind::Reference(memory))
                if memory.backend == graph.backend =>
            {
                let capacity = memory.lock().len() as u64;
                if bytes == 0 || bytes > capacity {
                    return Err(BackendError::bad_input(format!(
                        "Fix: cannot record an upload of {bytes} bytes into a buffer of {capacity} bytes; \
                         upload between 1 byte and the buffer's size"
                    )));
                }
                let index = graph.inputs.len() as u32;
                graph.inputs.push(vec![0; bytes as usize]);
                graph.operations.push(ReferenceOperation::Upload {
                    input: index as usize,
                    memory: Arc::clone(memory),
                });
                Ok(InputSlot::new(graph.id, index))
            }
            _ => Err(mismatch("the buffer", "recording")),
        }
    }

    /// A dispatch of `kernel` over buffers, one per global buffer in binding order
    /// ([`GraphRecorder::dispatch`]); `config.readback` must not be `Ranges`.
    pub fn dispatch(
        &mut self,
        kernel: &AnyKernel,
        buffers: &[&AnyBuffer],
        config: &DispatchConfig,
    ) -> Result<StepId, BackendError> {
        match (&mut self.kind, &kernel.kind) {
            (RecorderKind::Cuda(recorder), KernelKind::Cuda(kernel)) => {
                let bindings: SmallVec<[GraphBinding<'_>; 16]> = buffers
                    .iter()
                    .map(|buffer| match &buffer.kind {
                        BufferKind::Cuda(device) => Ok(GraphBinding::Buffer(device)),
                        BufferKind::Reference(_) => Err(mismatch("a bound buffer", "recording")),
                    })
                    .collect::<Result<_, _>>()?;
                recorder.dispatch_bindings(kernel, &bindings, config)
            }
            (RecorderKind::Reference(graph), KernelKind::Reference { backend, program })
                if *backend == graph.backend =>
            {
                let name = program.display_name();
                if let ReadbackPolicy::Ranges(_) = config.readback {
                    return Err(BackendError::bad_input(format!(
                        "Fix: DispatchConfig::readback ranges do not apply inside a dispatch graph (recording \
                         {name}); use ReadbackPolicy::None and record a read_back for the bytes you need"
                    )));
                }
                if contains_grid_sync(program.entry()) {
                    return Err(BackendError::bad_input(format!(
                        "Fix: {name} uses grid_sync, which dispatch graphs do not support; dispatch it outside \
                         the graph"
                    )));
                }
                let mut memories = Vec::with_capacity(buffers.len());
                for buffer in buffers {
                    match &buffer.kind {
                        BufferKind::Reference(memory) if memory.backend == graph.backend => {
                            memories.push(Arc::clone(memory))
                        }
                        _ => return Err(mismatch("a bound buffer", "recording")),
                    }
                }
                let (slots, _) = binding_slots(program);
                let sizes: SmallVec<[u64; 16]> =
                    memories.iter().map(|m| m.lock().len() as u64).collect();
                check_binding_sizes(&name, &slots, &sizes, config.fixpoint_iterations)?;
                let index = graph.steps.len() as u32;
                graph.steps.push(graph.operations.len());
                graph.operations.push(ReferenceOperation::Dispatch {
                    program: program.clone(),
                    memories,
                    config: config.clone().with_readback(ReadbackPolicy::None),
                    counts: vec![None; slots.len()],
                });
                Ok(StepId::new(graph.id, index))
            }
            _ => Err(mismatch("the kernel", "recording")),
        }
    }

    /// Copy `len` bytes of `buffer` from byte `offset` into a fresh output slot at
    /// this point of every replay ([`GraphRecorder::read_back`]).
    pub fn read_back(
        &mut self,
        buffer: &AnyBuffer,
        offset: u64,
        len: u64,
    ) -> Result<OutputSlot, BackendError> {
        match (&mut self.kind, &buffer.kind) {
            (RecorderKind::Cuda(recorder), BufferKind::Cuda(device)) => {
                recorder.read_back(device, offset, len)
            }
            (RecorderKind::Reference(graph), BufferKind::Reference(memory))
                if memory.backend == graph.backend =>
            {
                let capacity = memory.lock().len() as u64;
                if len == 0 || offset.checked_add(len).is_none_or(|end| end > capacity) {
                    return Err(BackendError::bad_input(format!(
                        "Fix: read-back range {offset}..+{len} is empty or past the buffer's {capacity} bytes; \
                         keep offset + len within the buffer"
                    )));
                }
                let index = graph.outputs.len() as u32;
                graph.outputs.push(vec![0; len as usize]);
                graph.operations.push(ReferenceOperation::ReadBack {
                    output: index as usize,
                    memory: Arc::clone(memory),
                    offset: offset as usize,
                });
                Ok(OutputSlot::new(graph.id, index))
            }
            _ => Err(mismatch("the buffer", "recording")),
        }
    }
}

/// Whether `block` reaches a grid sync anywhere (the program here has not been
/// validated: the walk is iterative and visits each shared block once).
fn contains_grid_sync(block: &[Node]) -> bool {
    crate::ir::any_node(block, |node| matches!(node, Node::GridSync))
}

#[derive(Debug)]
enum ReferenceOperation {
    Upload {
        input: usize,
        memory: Arc<HostMemory>,
    },
    Dispatch {
        program: Program,
        memories: Vec<Arc<HostMemory>>,
        config: DispatchConfig,
        /// Element counts set by `set_element_count`, per slot (`None`: the buffer's).
        counts: Vec<Option<u32>>,
    },
    ReadBack {
        output: usize,
        memory: Arc<HostMemory>,
        offset: usize,
    },
}

/// A recorded chain on the reference side: its operations (holding their buffers)
/// and its input and output slots.
#[derive(Debug)]
struct ReferenceGraph {
    id: u64,
    backend: u64,
    operations: Vec<ReferenceOperation>,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
    /// Index into `operations` of each recorded dispatch.
    steps: Vec<usize>,
}

/// A replayable chain of an [`AnyBackend`] ([`DispatchGraph`] on CUDA).
#[derive(Debug)]
pub struct AnyGraph {
    kind: GraphKind,
}

#[derive(Debug)]
enum GraphKind {
    Cuda(DispatchGraph),
    Reference(ReferenceGraph),
}

impl AnyGraph {
    /// The bytes `slot` uploads on every replay ([`DispatchGraph::input_mut`]).
    pub fn input_mut(&mut self, slot: InputSlot) -> Result<&mut [u8], BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.input_mut(slot),
            GraphKind::Reference(graph) => {
                let index = slot.index_in(graph.id)?;
                graph
                    .inputs
                    .get_mut(index)
                    .map(|v| v.as_mut_slice())
                    .ok_or_else(|| forged("input slot"))
            }
        }
    }

    /// The bytes `slot` read back during the last replay ([`DispatchGraph::output`]).
    pub fn output(&self, slot: OutputSlot) -> Result<&[u8], BackendError> {
        match &self.kind {
            GraphKind::Cuda(graph) => graph.output(slot),
            GraphKind::Reference(graph) => {
                let index = slot.index_in(graph.id)?;
                graph
                    .outputs
                    .get(index)
                    .map(|v| v.as_slice())
                    .ok_or_else(|| forged("output slot"))
            }
        }
    }

    /// Change the element count `step` passes for `binding` (a runtime-sized buffer)
    /// on later replays ([`DispatchGraph::set_element_count`]).
    pub fn set_element_count(
        &mut self,
        step: StepId,
        binding: u32,
        elements: u32,
    ) -> Result<(), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.set_element_count(step, binding, elements),
            GraphKind::Reference(graph) => {
                let (program, memories, counts) = graph.step_mut(step)?;
                let (slots, _) = binding_slots(program);
                let name = program.display_name();
                let Some(index) = slots.iter().position(|s| s.binding == binding) else {
                    return Err(BackendError::bad_input(format!(
                        "Fix: {name} has no global buffer at binding {binding}; name one of its bindings"
                    )));
                };
                let slot = &slots[index];
                if let crate::ir::BufferCount::Static(n) = slot.count {
                    return Err(BackendError::bad_input(format!(
                        "Fix: buffer '{}' (binding {binding}) of {name} has a static count of {n} elements, \
                         which the kernel uses instead of the parameter; only runtime-sized buffers take \
                         element count updates",
                        slot.name
                    )));
                }
                let capacity = memories[index].lock().len() as u64 / slot.elem.size_bytes() as u64;
                if elements as u64 > capacity {
                    return Err(BackendError::bad_input(format!(
                        "Fix: buffer '{}' (binding {binding}) of {name} holds {capacity} elements, so it \
                         cannot pass {elements}; pass at most {capacity} or record the graph over a larger \
                         buffer",
                        slot.name
                    )));
                }
                counts[index] = Some(elements);
                Ok(())
            }
        }
    }

    /// Change the workgroups `step` launches on later replays, without re-capture
    /// ([`DispatchGraph::set_workgroups`]). The reference side checks the new grid
    /// at once with the interpreter's own grid rules (`reference::check_grid`).
    pub fn set_workgroups(
        &mut self,
        step: StepId,
        workgroups: [u32; 3],
    ) -> Result<(), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.set_workgroups(step, workgroups),
            GraphKind::Reference(graph) => {
                let (program, config) = graph.step_config_mut(step)?;
                crate::reference::check_grid(program, workgroups).map_err(|error| {
                    BackendError::Reference {
                        program: program.display_name(),
                        error,
                    }
                })?;
                config.workgroups = workgroups;
                Ok(())
            }
        }
    }

    /// [`AnyGraph::replay`] with `device_window_ns` from an event pair on CUDA
    /// ([`DispatchGraph::replay_timed`]); the reference has no device, so its
    /// device times stay 0 and this is its plain replay.
    pub fn replay_timed(&mut self) -> Result<DispatchTiming, BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.replay_timed(),
            GraphKind::Reference(_) => self.replay(),
        }
    }

    /// Enqueue one replay without waiting ([`DispatchGraph::submit`]; the reference
    /// replays at once). The pending replay borrows the graph until `wait` or drop.
    pub fn submit(&mut self) -> Result<AnyPendingReplay<'_>, BackendError> {
        if let GraphKind::Reference(_) = self.kind {
            return Ok(AnyPendingReplay {
                kind: PendingReplayKind::Reference(self.replay()),
            });
        }
        let kind = match &mut self.kind {
            GraphKind::Cuda(graph) => PendingReplayKind::Cuda(graph.submit()?),
            GraphKind::Reference(_) => {
                return Err(BackendError::internal(
                    "a reference graph reached the CUDA arm",
                ))
            }
        };
        Ok(AnyPendingReplay { kind })
    }

    /// Replay the whole chain ([`DispatchGraph::replay`]).
    pub fn replay(&mut self) -> Result<DispatchTiming, BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.replay(),
            GraphKind::Reference(graph) => {
                let start = Instant::now();
                for operation in &graph.operations {
                    match operation {
                        ReferenceOperation::Upload { input, memory } => {
                            let data = &graph.inputs[*input];
                            memory.lock()[..data.len()].copy_from_slice(data);
                        }
                        ReferenceOperation::Dispatch {
                            program,
                            memories,
                            config,
                            counts,
                        } => replay_dispatch(program, memories, config, counts)?,
                        ReferenceOperation::ReadBack {
                            output,
                            memory,
                            offset,
                        } => {
                            let out = &mut graph.outputs[*output];
                            let len = out.len();
                            out.copy_from_slice(&memory.lock()[*offset..*offset + len]);
                        }
                    }
                }
                let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                Ok(DispatchTiming {
                    wall_ns,
                    enqueue_ns: wall_ns,
                    ..DispatchTiming::default()
                })
            }
        }
    }
}

/// A replay submitted by [`AnyGraph::submit`]; borrows its graph until
/// [`AnyPendingReplay::wait`] (or drop, which waits).
#[derive(Debug)]
#[must_use = "a pending replay does nothing visible until `wait`"]
pub struct AnyPendingReplay<'g> {
    kind: PendingReplayKind<'g>,
}

#[derive(Debug)]
enum PendingReplayKind<'g> {
    Cuda(crate::graph::PendingReplay<'g>),
    Reference(Result<DispatchTiming, BackendError>),
}

impl AnyPendingReplay<'_> {
    /// Wait for the replay; its outputs are in the graph's output slots.
    pub fn wait(self) -> Result<DispatchTiming, BackendError> {
        match self.kind {
            PendingReplayKind::Cuda(pending) => pending.wait(),
            PendingReplayKind::Reference(result) => result,
        }
    }
}

/// A recorded reference step's program, buffers and element counts.
type StepParts<'g> = (&'g Program, &'g [Arc<HostMemory>], &'g mut Vec<Option<u32>>);

impl ReferenceGraph {
    /// The program, buffers and element counts of recorded step `step`.
    /// The program and dispatch configuration of recorded step `step`.
    fn step_config_mut(
        &mut self,
        step: StepId,
    ) -> Result<(&Program, &mut DispatchConfig), BackendError> {
        let index = step.index_in(self.id)?;
        let operation = self
            .steps
            .get(index)
            .and_then(|&at| self.operations.get_mut(at));
        match operation {
            Some(ReferenceOperation::Dispatch {
                program, config, ..
            }) => Ok((program, config)),
            _ => Err(forged("step")),
        }
    }

    fn step_mut(&mut self, step: StepId) -> Result<StepParts<'_>, BackendError> {
        let index = step.index_in(self.id)?;
        let operation = self
            .steps
            .get(index)
            .and_then(|&at| self.operations.get_mut(at));
        match operation {
            Some(ReferenceOperation::Dispatch {
                program,
                memories,
                counts,
                ..
            }) => Ok((program, memories, counts)),
            _ => Err(forged("step")),
        }
    }
}

/// One recorded dispatch on the reference side: run over the buffers' current
/// bytes, outputs written back.
fn replay_dispatch(
    program: &Program,
    memories: &[Arc<HostMemory>],
    config: &DispatchConfig,
    counts: &[Option<u32>],
) -> Result<(), BackendError> {
    let (slots, outputs) = binding_slots(program);
    // A set element count passes a prefix of the buffer, as the CUDA kernel sees
    // only that many elements; the rest of the buffer is left as it was.
    let inputs: Vec<Vec<u8>> = memories
        .iter()
        .zip(&slots)
        .zip(counts)
        .map(|((m, slot), count)| {
            let bytes = m.lock();
            match count {
                Some(n) => bytes[..*n as usize * slot.elem.size_bytes() as usize].to_vec(),
                None => bytes.clone(),
            }
        })
        .collect();
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let results = crate::reference::run(program, &borrowed, config).map_err(|error| {
        BackendError::Reference {
            program: program.display_name(),
            error,
        }
    })?;
    for (&slot, bytes) in outputs.iter().zip(results) {
        let mut memory = memories[slot as usize].lock();
        memory[..bytes.len()].copy_from_slice(&bytes);
        // `WriteOnly` starts zeroed: the CUDA step clears the whole buffer, not
        // only the elements it passes.
        if slots[slot as usize].access == crate::ir::Access::WriteOnly {
            memory[bytes.len()..].fill(0);
        }
    }
    Ok(())
}

fn forged(what: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {what} does not exist in this dispatch graph; the value was forged or corrupted"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out interface objects that cannot cross threads (a pipelined encoder
    /// waits on another thread than it submits on).
    #[test]
    fn interface_objects_are_send() {
        fn assert_send<T: Send>() {}
        assert_send::<AnyBackend>();
        assert_send::<AnyBuffer>();
        assert_send::<AnyKernel>();
        assert_send::<AnyPending>();
        assert_send::<AnyGraph>();
    }
}
