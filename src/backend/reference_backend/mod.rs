//! The reference interpreter as a backend: the CPU side of
//! [`AnyBackend`](super::AnyBackend), answering every request exactly as the CUDA
//! backend does.
//!
//! # Why this module exists
//!
//! A program written against [`AnyBackend`](super::AnyBackend) runs on CUDA where
//! there is a device and here where there is none (a laptop, CI), and it must not be
//! able to tell the difference except by speed. The fallback used to be a thin
//! wrapper over [`crate::reference::run`] and differed from CUDA where it mattered to
//! a caller: `compile` validated nothing, a grid of 70,000 workgroups on y ran,
//! 20 pending submissions were accepted, `buffer(u64::MAX)` panicked and
//! `buffer(1 << 40)` aborted the process, and one buffer bound as input and as
//! write-only output gave other bytes than on the GPU. Now every request goes through
//! the same checks in the same order as on CUDA, with the same errors:
//!
//! - `compile` validates against the same limits (a device's, H200-like by default:
//!   [`ReferenceOptions::limits`]) and refuses what the CUDA backend refuses of a
//!   valid program (more buffers than the result ABI passes);
//! - a request is planned by the CUDA backend's own pure code (`plan::plan_request`:
//!   binding count and sizes, fixpoint iterations, buffers bound twice, readback),
//!   then its grid by the same [`LaunchPlan`] rules against device-like caps
//!   ([`ReferenceBackend::caps`]);
//! - buffers and transient bindings are checked against a memory budget computed as
//!   on CUDA, with [`ReferenceOptions::max_memory_bytes`] as the device's memory, and
//!   allocated fallibly: an impossible size is [`BackendError::OverBudget`], never a
//!   panic or an abort;
//! - at most [`MAX_PENDING`](super::MAX_PENDING) submissions are pending at once.
//!
//! Buffers are host memory that keeps its bytes between dispatches, like device
//! memory (outputs of a dispatch stay in the buffer; `WriteOnly` starts zeroed). A
//! submission runs at once (the interpreter is synchronous); errors a CUDA
//! submission reports at once (plan, grid, budget) come from `submit`, errors of the
//! run itself (the interpreter's work cap, an out-of-range access without bounds
//! checks) from `wait`, as a kernel fault would. Timings: `wall_ns` and
//! `enqueue_ns` only; there are no kernel stamps and no events.

mod graph;
mod lane;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use smallvec::SmallVec;

use crate::config::{CodegenOptions, DispatchConfig, ReadbackPolicy};
use crate::ir::validate::MAX_SCALARS;
use crate::ir::{self, Literal, Program, ValidProgram};
use crate::lower;
use crate::reference::{self, ReferenceOptions};

use super::budget::{self, BudgetInputs};
use super::buffer::{check_copy, check_download, whole_values, Storage};
use super::dispatch::{foreign_kernel, PendingOrigin, Sink};
use super::kernel::KernelKind;
use super::plan::{binding_slots, check_output_slices, plan_request, ParamSlot, RequestPlan};
use super::request::{ScalarValues, Target};
use super::{
    BackendError, Binding, DeviceBuffer, DeviceCaps, Dispatch, Finished, Kernel, LaunchPlan,
    Outputs, PendingDispatch, PinnedBuffer, Timings,
};

pub(in crate::backend) use graph::{ReferenceGraph, ReferenceRecorder};
pub(in crate::backend) use lane::ReferenceLane;

static NEXT_REFERENCE_ID: AtomicU64 = AtomicU64::new(1);

/// The reference interpreter as a backend: buffers in host memory, dispatches run
/// on the CPU, bit-identical to the GPU, every request checked as CUDA checks it.
/// Use it through [`AnyBackend`](super::AnyBackend) (`AnyBackend::reference`,
/// `AnyBackend::reference_with`, or the fallback of `cuda_or_reference`). Cheap to
/// clone.
#[derive(Clone)]
pub struct ReferenceBackend {
    pub(in crate::backend) inner: Arc<ReferenceInner>,
}

pub(in crate::backend) struct ReferenceInner {
    pub(in crate::backend) id: u64,
    options: ReferenceOptions,
    /// The device the interpreter answers as: its launch-geometry limits and
    /// memory.
    caps: DeviceCaps,
    /// Bytes held by live buffers (the budget's "resident" input).
    held: AtomicU64,
    /// Submissions pending, at most [`MAX_PENDING`](super::MAX_PENDING).
    pub(in crate::backend) pending: AtomicUsize,
    /// Why CUDA was not used, when this backend is a fallback.
    pub(in crate::backend) fallback: Option<String>,
    /// Blocks of its live lanes, which a grid-sync dispatch leaves out as on CUDA
    /// (`dispatch::coresident_beside_lanes`).
    pub(in crate::backend) lane_blocks: AtomicU64,
}

/// Host memory of a reference buffer; counts its bytes against its backend while it
/// lives (a graph may hold it after the buffer is dropped, as on CUDA).
pub(in crate::backend) struct HostMemory {
    pub(in crate::backend) owner: Arc<ReferenceInner>,
    bytes: Mutex<Vec<u8>>,
}

impl HostMemory {
    pub(in crate::backend) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let len = self.bytes.get_mut().map_or(0, |bytes| bytes.len()) as u64;
        self.owner.held.fetch_sub(len, Ordering::Relaxed);
    }
}

/// A compiled program on the reference backend: validated against its limits, with
/// the binding plan the CUDA backend would make of it.
pub(in crate::backend) struct ReferenceKernel {
    pub(in crate::backend) backend_id: u64,
    pub(in crate::backend) name: String,
    pub(in crate::backend) program: ValidProgram,
    pub(in crate::backend) codegen: CodegenOptions,
    pub(in crate::backend) slots: SmallVec<[ParamSlot; 16]>,
    pub(in crate::backend) outputs: SmallVec<[u16; 16]>,
    pub(in crate::backend) workgroup_size: [u32; 3],
    pub(in crate::backend) grid_sync: bool,
    pub(in crate::backend) max_coresident_blocks: u64,
}

impl std::fmt::Debug for ReferenceBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceBackend")
            .field("id", &self.inner.id)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl Default for ReferenceBackend {
    fn default() -> Self {
        ReferenceBackend::new()
    }
}

impl ReferenceBackend {
    /// A reference backend with default [`ReferenceOptions`] (its buffers and
    /// kernels are refused by every other backend).
    pub fn new() -> Self {
        Self::with_options(ReferenceOptions::default())
    }

    /// A reference backend with `options`: the limits programs are validated and
    /// launches checked against, the work one dispatch may do, and the memory its
    /// buffers and runs may take.
    pub fn with_options(options: ReferenceOptions) -> Self {
        Self::build(options, None)
    }

    /// A reference backend standing in for CUDA, which was not usable because of
    /// `why`.
    pub(in crate::backend) fn fallback(why: String) -> Self {
        Self::build(ReferenceOptions::default(), Some(why))
    }

    fn build(options: ReferenceOptions, fallback: Option<String>) -> Self {
        ReferenceBackend {
            inner: Arc::new(ReferenceInner {
                id: NEXT_REFERENCE_ID.fetch_add(1, Ordering::Relaxed),
                caps: reference_caps(&options),
                options,
                held: AtomicU64::new(0),
                pending: AtomicUsize::new(0),
                fallback,
                lane_blocks: AtomicU64::new(0),
            }),
        }
    }

    /// Of `max_coresident` workgroups of a grid-sync kernel, those the device it
    /// answers as holds beside its live lanes' blocks, as on CUDA.
    fn coresident_now(&self, max_coresident: u64) -> u64 {
        super::dispatch::coresident_beside_lanes(
            max_coresident,
            self.inner.caps.sm_count,
            self.inner.lane_blocks.load(Ordering::Acquire),
        )
    }

    /// A grid-sync kernel's grid against the workgroups the device holds at once
    /// now, beside running lanes (`GridTooLargeForGridSync` where it would wait
    /// forever); nothing for other kernels. Eager dispatches and every replay of
    /// a recorded one check it.
    pub(in crate::backend) fn check_grid_sync_fits(
        &self,
        reference: &ReferenceKernel,
        launch: &LaunchPlan,
    ) -> Result<(), BackendError> {
        super::dispatch::check_coresident(
            &reference.name,
            reference.grid_sync,
            launch,
            self.coresident_now(reference.max_coresident_blocks),
        )
    }

    /// [`CudaBackend::coresident_workgroups`](super::CudaBackend::coresident_workgroups)
    /// on the device the interpreter answers as, beside its live lanes.
    pub fn coresident_workgroups(&self, kernel: &Kernel) -> Option<u64> {
        let reference = self.reference_kernel(kernel).ok()?;
        if !reference.grid_sync {
            return None;
        }
        Some(self.coresident_now(reference.max_coresident_blocks))
    }

    /// The options it runs with.
    pub fn options(&self) -> &ReferenceOptions {
        &self.inner.options
    }

    /// The device it answers as: an H200's launch-geometry limits with the
    /// options' workgroup limits, and [`ReferenceOptions::max_memory_bytes`] as its
    /// memory.
    pub fn caps(&self) -> &DeviceCaps {
        &self.inner.caps
    }

    /// Why CUDA is not used, when this backend is the fallback of
    /// `AnyBackend::cuda_or_reference`.
    pub(in crate::backend) fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback.as_deref()
    }

    /// A zeroed buffer of `bytes` bytes, checked against the memory budget and
    /// allocated fallibly.
    pub(in crate::backend) fn buffer(&self, bytes: u64) -> Result<DeviceBuffer, BackendError> {
        self.check_budget(bytes)?;
        let memory = zeroed_vec(bytes, self.available())?;
        self.inner.held.fetch_add(bytes, Ordering::Relaxed);
        Ok(DeviceBuffer {
            storage: Storage::Reference(Arc::new(HostMemory {
                owner: Arc::clone(&self.inner),
                bytes: Mutex::new(memory),
            })),
            bytes,
        })
    }

    pub(in crate::backend) fn upload(
        &self,
        buffer: &DeviceBuffer,
        data: &[u8],
    ) -> Result<(), BackendError> {
        let memory = buffer.host_for(&self.inner, "upload into")?;
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

    pub(in crate::backend) fn read_into(
        &self,
        buffer: &DeviceBuffer,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        let memory = buffer.host_for(&self.inner, "read")?;
        let bytes = memory.lock();
        if out.len() > bytes.len() {
            return Err(BackendError::bad_input(format!(
                "Fix: cannot read {} bytes: the buffer holds {} bytes; allocate a larger one or read \
                 fewer bytes",
                out.len(),
                bytes.len()
            )));
        }
        out.copy_from_slice(&bytes[..out.len()]);
        Ok(())
    }

    /// `CudaBackend::copy` on host memory: the same checks, the same errors.
    pub(in crate::backend) fn copy(
        &self,
        from: &DeviceBuffer,
        from_offset: u64,
        to: &DeviceBuffer,
        to_offset: u64,
        bytes: u64,
    ) -> Result<(), BackendError> {
        let source = from.host_for(&self.inner, "copy from")?;
        let destination = to.host_for(&self.inner, "copy into")?;
        let same = Arc::ptr_eq(source, destination);
        check_copy(from.len(), from_offset, to.len(), to_offset, bytes, same)?;
        // In bounds of both (checked), so these fit a usize.
        let (from_offset, to_offset, bytes) =
            (from_offset as usize, to_offset as usize, bytes as usize);
        if same {
            source
                .lock()
                .copy_within(from_offset..from_offset + bytes, to_offset);
        } else {
            // Locked in address order, so two copies between the same two buffers in
            // opposite directions on two threads cannot deadlock.
            let (source, mut destination) = if Arc::as_ptr(source) < Arc::as_ptr(destination) {
                let source = source.lock();
                (source, destination.lock())
            } else {
                let destination = destination.lock();
                (source.lock(), destination)
            };
            destination[to_offset..to_offset + bytes]
                .copy_from_slice(&source[from_offset..from_offset + bytes]);
        }
        Ok(())
    }

    /// `CudaBackend::download` here: the same checks in the same order, then the
    /// error CUDA gives a pinned buffer of another backend, since every
    /// `PinnedBuffer` belongs to a CUDA backend.
    pub(in crate::backend) fn download(
        &self,
        from: &DeviceBuffer,
        from_offset: u64,
        to: &PinnedBuffer,
        to_offset: u64,
        bytes: u64,
    ) -> Result<(), BackendError> {
        from.host_for(&self.inner, "download from")?;
        check_download(from, from_offset, to, to_offset, bytes)?;
        Err(PinnedBuffer::foreign("download into"))
    }

    /// Validate `program` against this backend's limits and make its binding plan,
    /// refusing what the CUDA backend's `compile` refuses.
    pub(in crate::backend) fn compile(
        &self,
        program: &Program,
        codegen: &CodegenOptions,
    ) -> Result<Kernel, BackendError> {
        let name = program.display_name();
        let valid = ir::validate(program, &self.inner.options.limits).map_err(|error| {
            BackendError::InvalidProgram {
                program: name.clone(),
                error,
            }
        })?;
        let lowered = lower::lower_workgroup_reductions(program, &self.inner.caps.lowering_caps());
        super::kernel::check_lowered(program, &lowered, &self.inner.options.limits)?;
        super::readback::check_result_abi_fits(&name, program).map_err(BackendError::bad_input)?;
        let (slots, outputs) = binding_slots(program);
        let workgroup_size = program.workgroup_size();
        let grid_sync = super::kernel::contains_grid_sync(program.entry());
        // The CUDA backend asks the driver's occupancy calculator; without one the
        // estimate is the thread limit per SM (registers and shared memory are not
        // modelled).
        let threads = workgroup_size
            .iter()
            .map(|&v| u64::from(v))
            .product::<u64>()
            .max(1);
        let per_sm = u64::from(self.inner.caps.max_threads_per_sm) / threads;
        Ok(Kernel {
            kind: KernelKind::Reference(Arc::new(ReferenceKernel {
                backend_id: self.inner.id,
                name,
                program: valid,
                codegen: *codegen,
                slots,
                outputs,
                workgroup_size,
                grid_sync,
                max_coresident_blocks: per_sm * u64::from(self.inner.caps.sm_count),
            })),
        })
    }

    /// The reference kernel of `target`, compiled (validated) for a program.
    fn resolve(
        &self,
        target: Target<'_>,
        codegen: &CodegenOptions,
    ) -> Result<Kernel, BackendError> {
        match target {
            Target::Kernel(kernel) => Ok(kernel.clone()),
            Target::Program(program) => self.compile(program, codegen),
        }
    }

    pub(in crate::backend) fn run(&self, request: Dispatch<'_>) -> Result<Finished, BackendError> {
        let kernel = self.resolve(request.target, &request.codegen)?;
        let mut outputs = Outputs::default();
        let prepared = self.prepare(&kernel, &request, &Sink::Packed(&mut outputs))?;
        let timings = self.execute(prepared, &request, Sink::Packed(&mut outputs))?;
        outputs.name_by(kernel);
        Ok(Finished { outputs, timings })
    }

    pub(in crate::backend) fn run_into(
        &self,
        request: Dispatch<'_>,
        outputs: &mut [&mut [u8]],
    ) -> Result<Timings, BackendError> {
        let kernel = self.resolve(request.target, &request.codegen)?;
        let prepared = self.prepare(&kernel, &request, &Sink::Slices(outputs))?;
        self.execute(prepared, &request, Sink::Slices(outputs))
    }

    /// Run now; the pending result hands the outcome to `wait` (errors of the plan
    /// come from here, as on CUDA; errors of the run from `wait`).
    pub(in crate::backend) fn submit(
        &self,
        request: Dispatch<'_>,
    ) -> Result<PendingDispatch, BackendError> {
        let kernel = self.resolve(request.target, &request.codegen)?;
        super::dispatch::count_pending(&self.inner.pending, kernel.name())?;
        let mut outputs = Outputs::default();
        let prepared = match self.prepare(&kernel, &request, &Sink::Packed(&mut outputs)) {
            Ok(prepared) => prepared,
            Err(e) => {
                self.inner.pending.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        let result = self
            .execute(prepared, &request, Sink::Packed(&mut outputs))
            .map(|timings| {
                outputs.name_by(kernel.clone());
                Finished { outputs, timings }
            });
        Ok(PendingDispatch::done(
            kernel,
            result,
            PendingOrigin::Reference(Arc::clone(&self.inner)),
        ))
    }

    /// `request`'s plan for `reference` with the caller's output slices checked
    /// against it, and its launch shape: the first checks of a dispatch and of a lane
    /// request alike, in CUDA's order.
    fn plan(
        &self,
        reference: &ReferenceKernel,
        request: &Dispatch<'_>,
        sink: &Sink<'_, '_>,
    ) -> Result<(RequestPlan, LaunchPlan), BackendError> {
        let mut plan = RequestPlan::default();
        plan_request(
            &reference.name,
            (&reference.slots, reference.program.scalars()),
            &reference.outputs,
            request,
            &mut plan,
        )?;
        if let Sink::Slices(outputs) = sink {
            check_output_slices(&plan.reads, outputs)?;
        }
        let launch = LaunchPlan::new(
            request.workgroups,
            reference.workgroup_size,
            &self.inner.caps,
        )?;
        Ok((plan, launch))
    }

    /// Every check a CUDA dispatch makes before it touches the device, in its order.
    fn prepare<'k>(
        &self,
        kernel: &'k Kernel,
        request: &Dispatch<'_>,
        sink: &Sink<'_, '_>,
    ) -> Result<Prepared<'k>, BackendError> {
        let start = Instant::now();
        let reference = self.reference_kernel(kernel)?;
        if let Some(previous) = request.after {
            match &previous.origin {
                PendingOrigin::Reference(owner) if owner.id == self.inner.id => {}
                _ => return Err(super::dispatch::foreign_predecessor(&reference.name)),
            }
        }
        let (plan, launch) = self.plan(reference, request, sink)?;
        self.check_grid_sync_fits(reference, &launch)?;
        if request.bindings.iter().any(Binding::is_transient) {
            let transient = request
                .bindings
                .iter()
                .zip(&plan.sizes)
                .filter(|(binding, _)| binding.is_transient())
                .map(|(_, &bytes)| bytes);
            let required = budget::required_bytes(transient).ok_or(BackendError::OverBudget {
                required: u64::MAX,
                available: 0,
            })?;
            self.check_budget(required)?;
        }
        Ok(Prepared {
            kernel: reference,
            plan,
            start,
        })
    }

    /// Run a prepared request: the bound bytes copied in, the interpreter, outputs
    /// written back into bound buffers, the readback items delivered.
    fn execute(
        &self,
        prepared: Prepared<'_>,
        request: &Dispatch<'_>,
        sink: Sink<'_, '_>,
    ) -> Result<Timings, BackendError> {
        let Prepared {
            kernel,
            plan,
            start,
        } = prepared;
        let mut inputs = self.gather_inputs(kernel, request.bindings, &plan.sizes)?;
        let config = DispatchConfig {
            workgroups: request.workgroups,
            fixpoint_iterations: request.fixpoint_iterations,
            readback: ReadbackPolicy::None,
            codegen: kernel.codegen,
        };
        let borrowed: SmallVec<[&[u8]; 16]> = inputs.iter().map(Vec::as_slice).collect();
        let results = self.interpret(kernel, &borrowed, &request.scalars, &config)?;
        drop(borrowed);
        // The interpreter returns every output buffer whole, ascending binding: the
        // final bytes of those slots, which bound buffers keep.
        for (&slot, bytes) in kernel.outputs.iter().zip(results) {
            let slot = slot as usize;
            if let Binding::Buffer(buffer) = request.bindings[slot] {
                buffer
                    .host_for(&self.inner, "dispatch with")?
                    .lock()
                    .copy_from_slice(&bytes);
            }
            inputs[slot] = bytes;
        }
        match sink {
            Sink::Packed(out) => {
                *out =
                    Outputs::with_capacity(plan.reads.iter().map(|r| r.len as usize).sum(), None);
                for read in &plan.reads {
                    let at = read.offset as usize;
                    let bytes = &inputs[read.slot as usize][at..at + read.len as usize];
                    out.push(kernel.slots[read.slot as usize].binding, bytes);
                }
            }
            Sink::Slices(out) => {
                for (read, out) in plan.reads.iter().zip(out.iter_mut()) {
                    let at = read.offset as usize;
                    out.copy_from_slice(&inputs[read.slot as usize][at..at + read.len as usize]);
                }
            }
        }
        let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Ok(Timings {
            wall_ns,
            enqueue_ns: wall_ns,
            ..Timings::default()
        })
    }

    /// The bytes of every binding, copied (the interpreter runs on its own copies;
    /// zeroed and host bindings are this dispatch's transients).
    fn gather_inputs(
        &self,
        kernel: &ReferenceKernel,
        bindings: &[Binding<'_>],
        sizes: &[u64],
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let mut inputs = Vec::with_capacity(bindings.len());
        for (binding, &bytes) in bindings.iter().zip(sizes) {
            inputs.push(match binding {
                Binding::Buffer(buffer) => {
                    buffer.host_for(&self.inner, "dispatch with")?.lock().clone()
                }
                Binding::Host(data) => data.to_vec(),
                Binding::Zeroed(_) => zeroed_vec(bytes, self.available())?,
                Binding::Pinned(_) => {
                    return Err(BackendError::bad_input(format!(
                        "Fix: a PinnedBuffer is bound to a dispatch of {} on the reference interpreter; \
                         pinned buffers belong to a CUDA backend: bind the bytes with Binding::Host",
                        kernel.name
                    )))
                }
                Binding::Scratch(_) => {
                    return Err(super::dispatch::scratch_outside_a_graph(&kernel.name))
                }
            });
        }
        Ok(inputs)
    }

    /// The interpreter's run of `kernel` over `inputs` with `scalars` (every declared
    /// one supplied: `plan::check_request_scalars` checked): every output buffer's
    /// final bytes, ascending binding.
    pub(in crate::backend) fn interpret(
        &self,
        kernel: &ReferenceKernel,
        inputs: &[&[u8]],
        scalars: &ScalarValues,
        config: &DispatchConfig,
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let values: SmallVec<[Literal; MAX_SCALARS]> = kernel
            .program
            .scalars()
            .iter()
            .zip(scalars.words())
            .map(|(decl, &word)| Literal::from_bits(decl.ty, word))
            .collect();
        let options = &self.inner.options;
        reference::run_valid_with_scalars(&kernel.program, inputs, &values, config, options)
            .map(|(outputs, _)| outputs)
            .map_err(|error| BackendError::Reference {
                program: kernel.name.clone(),
                error,
            })
    }

    /// The reference kernel inside `kernel`, checked to belong to this backend.
    pub(in crate::backend) fn reference_kernel<'k>(
        &self,
        kernel: &'k Kernel,
    ) -> Result<&'k ReferenceKernel, BackendError> {
        match &kernel.kind {
            KernelKind::Reference(inner) if inner.backend_id == self.inner.id => Ok(inner),
            _ => Err(foreign_kernel(kernel.name())),
        }
    }

    /// Bytes a new allocation may take: the CUDA budget's arithmetic with
    /// [`ReferenceOptions::max_memory_bytes`] as the device's memory.
    fn available(&self) -> u64 {
        let total = self.inner.caps.total_memory;
        budget::available_bytes(&BudgetInputs {
            total,
            resident: self.inner.held.load(Ordering::Relaxed),
            pooled: 0,
            live_free: total,
        })
    }

    /// [`BackendError::OverBudget`] when `bytes` do not fit the budget.
    fn check_budget(&self, bytes: u64) -> Result<(), BackendError> {
        let available = self.available();
        if bytes > available {
            return Err(BackendError::OverBudget {
                required: bytes,
                available,
            });
        }
        Ok(())
    }

    /// Read a whole buffer as values of `T`.
    pub(in crate::backend) fn read_values<T: bytemuck::Pod>(
        &self,
        buffer: &DeviceBuffer,
    ) -> Result<Vec<T>, BackendError> {
        let mut values = vec![T::zeroed(); whole_values::<T>(buffer.len())?];
        self.read_into(buffer, bytemuck::cast_slice_mut(&mut values))?;
        Ok(values)
    }
}

/// A request that passed every check, ready to run.
struct Prepared<'k> {
    kernel: &'k ReferenceKernel,
    plan: RequestPlan,
    start: Instant,
}

/// `bytes` zero bytes, allocated fallibly: a size past this host's address space or
/// its allocator's reach is [`BackendError::OverBudget`] (with what the budget
/// still leaves), never a panic or an abort.
fn zeroed_vec(bytes: u64, available: u64) -> Result<Vec<u8>, BackendError> {
    let over = || BackendError::OverBudget {
        required: bytes,
        available,
    };
    let len = usize::try_from(bytes).map_err(|_| over())?;
    let mut memory = Vec::new();
    memory.try_reserve_exact(len).map_err(|_| over())?;
    memory.resize(len, 0);
    Ok(memory)
}

/// The device a reference backend answers as: an H200's caps (synthetic), with the
/// workgroup limits of `options` and its memory cap as the device's memory. The
/// limits' workgroup memory is a kernel's (the opt-in limit); a lane's static limit
/// is the H200's 48 KiB, or the limits' own where they allow less.
fn reference_caps(options: &ReferenceOptions) -> DeviceCaps {
    let limits = &options.limits;
    let h200 = DeviceCaps::synthetic_h200();
    DeviceCaps {
        name: "CPU reference interpreter".into(),
        total_memory: options.max_memory_bytes,
        max_threads_per_block: limits.max_threads_per_workgroup,
        max_block_dims: limits.max_workgroup_size,
        max_shared_memory_per_block: limits
            .max_shared_memory_bytes
            .min(h200.max_shared_memory_per_block),
        max_shared_memory_per_block_optin: limits.max_shared_memory_bytes,
        warp_size: limits.subgroup_size,
        ..h200
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out the two aborts and panics the fallback used to have on impossible
    /// sizes: `buffer(u64::MAX)` (capacity overflow) and `buffer(1 << 40)` (the
    /// allocator aborting the process) are both `OverBudget` errors starting
    /// `Fix:`; a small buffer is allocated, counted and released on drop.
    #[test]
    fn impossible_buffer_sizes_are_errors() {
        let backend = ReferenceBackend::new();
        for bytes in [u64::MAX, 1 << 40] {
            let error = backend.buffer(bytes).expect_err("over the budget");
            assert!(
                matches!(error, BackendError::OverBudget { .. }),
                "{error:?}"
            );
            assert!(error.to_string().starts_with("Fix:"), "{error}");
        }
        let buffer = backend.buffer(64).unwrap();
        assert_eq!(backend.inner.held.load(Ordering::Relaxed), 64);
        drop(buffer);
        assert_eq!(backend.inner.held.load(Ordering::Relaxed), 0);
        // Negative control: the fallible allocation itself refuses a size the host
        // cannot hold even when a budget would let it through.
        assert!(zeroed_vec(u64::MAX, u64::MAX).is_err());
    }

    /// Locks out a fallback `compile` that accepts what CUDA's refuses: an invalid
    /// program is an `InvalidProgram` error at compile time, not at the first
    /// dispatch. Negative control: the valid program compiles.
    #[test]
    fn compile_validates_against_the_limits() {
        let backend = ReferenceBackend::new();
        let too_wide = Program::builder([2048, 1, 1]).build();
        let error = backend
            .compile(&too_wide, &CodegenOptions::new())
            .expect_err("2048 threads per workgroup");
        assert!(
            matches!(error, BackendError::InvalidProgram { .. }),
            "{error:?}"
        );
        let within = Program::builder([1024, 1, 1]).build();
        assert!(backend.compile(&within, &CodegenOptions::new()).is_ok());
    }
}
