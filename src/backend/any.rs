//! One interface over the CUDA backend and the reference interpreter: write the
//! hot loop once, run it with or without a GPU, and get the same answer.
//!
//! # Why this module exists
//!
//! [`AnyBackend`] sits above both backends: it is `Cuda(CudaBackend)` or
//! `Reference(ReferenceBackend)`, and every method hands the same request to the
//! one it holds. Both backends make the same types — [`DeviceBuffer`], [`Kernel`],
//! [`PendingDispatch`] — and take the same [`Dispatch`] request, so nothing here
//! converts bindings or wraps buffers; only graphs differ in kind ([`AnyGraph`]).
//! The reference side answers exactly as CUDA does, errors included (see
//! [`ReferenceBackend`]): the same validation at `compile`, the same binding,
//! grid, pending and memory limits with the same `Fix:` messages, byte-identical
//! outputs in the same shapes. Which one runs is visible: [`AnyBackend::kind`], and
//! [`AnyBackend::notice`] for a line a program can print.
//!
//! ```
//! use vyre_cuda::backend::{AnyBackend, Binding, Dispatch};
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
//! eprintln!("{}", backend.notice());
//! let kernel = backend.compile(&program, &DispatchConfig::linear(1))?;
//! let x = backend.buffer_from(&[0u32; 64])?;
//! let pending = backend.submit(Dispatch::new(&kernel, &[Binding::from(&x)]))?;
//! let finished = pending.wait()?;
//! assert_eq!(finished.outputs.read::<u32>("x")?[0], 1);
//! assert_eq!(backend.read::<u32>(&x)?[0], 1); // outputs stay in the buffer
//! # Ok(())
//! # }
//! ```

use bytemuck::Pod;

use crate::config::DispatchConfig;
use crate::ir::{Literal, Program};
use crate::reference::ReferenceOptions;

use super::graph::{DispatchGraph, GraphRecorder, InputSlot, OutputSlot, PendingReplay, StepId};
use super::reference_backend::{ReferenceGraph, ReferenceLane, ReferenceRecorder};
use super::{
    BackendError, CudaBackend, DeviceBuffer, Dispatch, Finished, Kernel, Lane, LaneOptions,
    PendingDispatch, PinnedBuffer, ReferenceBackend, Timings,
};

/// The CUDA backend or the reference interpreter, behind one interface.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyBackend {
    /// A CUDA device.
    Cuda(CudaBackend),
    /// The CPU reference interpreter.
    Reference(ReferenceBackend),
}

/// Which backend an [`AnyBackend`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendKind {
    /// A CUDA device.
    Cuda,
    /// The CPU reference interpreter.
    Reference,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.caps().name)
            .finish()
    }
}

impl AnyBackend {
    /// The CUDA backend of device 0 where a driver and a device exist, the
    /// reference interpreter otherwise ([`AnyBackend::notice`] says which, and why).
    pub fn cuda_or_reference() -> AnyBackend {
        match CudaBackend::acquire() {
            Ok(gpu) => AnyBackend::Cuda(gpu),
            Err(error) => {
                tracing::info!(%error, "no CUDA device: using the reference interpreter");
                AnyBackend::Reference(ReferenceBackend::fallback(error.to_string()))
            }
        }
    }

    /// A fresh reference backend with default options.
    pub fn reference() -> AnyBackend {
        AnyBackend::Reference(ReferenceBackend::new())
    }

    /// A fresh reference backend with `options` (its limits, work cap and memory
    /// cap).
    pub fn reference_with(options: ReferenceOptions) -> AnyBackend {
        AnyBackend::Reference(ReferenceBackend::with_options(options))
    }

    /// Which backend runs.
    pub fn kind(&self) -> BackendKind {
        match self {
            AnyBackend::Cuda(_) => BackendKind::Cuda,
            AnyBackend::Reference(_) => BackendKind::Reference,
        }
    }

    /// One line saying which backend runs (and, for a fallback, why CUDA does not),
    /// for a program to print:
    /// `vyre-cuda: running on CUDA device 0 (NVIDIA H200, sm_90)` or
    /// `vyre-cuda: running on the CPU reference interpreter (no CUDA: …)`.
    pub fn notice(&self) -> String {
        match self {
            AnyBackend::Cuda(gpu) => format!(
                "vyre-cuda: running on CUDA device {} ({}, sm_{})",
                gpu.ordinal(),
                gpu.caps().name,
                gpu.caps().ptx_target_sm()
            ),
            AnyBackend::Reference(reference) => match reference.fallback_reason() {
                Some(why) => {
                    format!("vyre-cuda: running on the CPU reference interpreter (no CUDA: {why})")
                }
                None => "vyre-cuda: running on the CPU reference interpreter (as requested)".into(),
            },
        }
    }

    /// A zeroed buffer of `bytes` bytes, checked against the memory budget (an
    /// impossible size is [`BackendError::OverBudget`] on both backends).
    pub fn buffer(&self, bytes: u64) -> Result<DeviceBuffer, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.buffer(bytes),
            AnyBackend::Reference(reference) => reference.buffer(bytes),
        }
    }

    /// A buffer holding a copy of `values`.
    pub fn buffer_from<T: Pod>(&self, values: &[T]) -> Result<DeviceBuffer, BackendError> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let buffer = self.buffer(bytes.len() as u64)?;
        self.upload(&buffer, bytes)?;
        Ok(buffer)
    }

    /// Copy `values` into the start of `buffer` (they may be shorter).
    pub fn upload<T: Pod>(&self, buffer: &DeviceBuffer, values: &[T]) -> Result<(), BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.upload(buffer, values),
            AnyBackend::Reference(reference) => {
                reference.upload(buffer, bytemuck::cast_slice(values))
            }
        }
    }

    /// Read a whole buffer as values of `T`.
    pub fn read<T: Pod>(&self, buffer: &DeviceBuffer) -> Result<Vec<T>, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.read(buffer),
            AnyBackend::Reference(reference) => reference.read_values(buffer),
        }
    }

    /// Read the first `out.len()` values of `buffer` into `out`.
    pub fn read_into<T: Pod>(
        &self,
        buffer: &DeviceBuffer,
        out: &mut [T],
    ) -> Result<(), BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.read_into(buffer, out),
            AnyBackend::Reference(reference) => {
                reference.read_into(buffer, bytemuck::cast_slice_mut(out))
            }
        }
    }

    /// Copy `bytes` bytes of `from` at `from_offset` into `to` at `to_offset`
    /// ([`CudaBackend::copy`]: by the copy engine on CUDA, ordered after the
    /// dispatches in flight that conflict with it; the same checks and errors on
    /// both backends).
    pub fn copy(
        &self,
        from: &DeviceBuffer,
        from_offset: u64,
        to: &DeviceBuffer,
        to_offset: u64,
        bytes: u64,
    ) -> Result<(), BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.copy(from, from_offset, to, to_offset, bytes),
            AnyBackend::Reference(reference) => {
                reference.copy(from, from_offset, to, to_offset, bytes)
            }
        }
    }

    /// Copy `bytes` bytes of `from` at `from_offset` into the caller's pinned
    /// `to` at `to_offset` ([`CudaBackend::download`]: by the copy engine, no
    /// staging; the same checks and errors on both backends, and on the
    /// reference backend, which owns no pinned memory, the error for a pinned
    /// buffer of another backend).
    pub fn download(
        &self,
        from: &DeviceBuffer,
        from_offset: u64,
        to: &mut PinnedBuffer,
        to_offset: u64,
        bytes: u64,
    ) -> Result<(), BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.download(from, from_offset, to, to_offset, bytes),
            AnyBackend::Reference(reference) => {
                reference.download(from, from_offset, to, to_offset, bytes)
            }
        }
    }

    /// Validate and compile `program` (only `config.codegen` matters): the same
    /// validation, against the same limits, on both backends.
    pub fn compile(
        &self,
        program: &Program,
        config: &DispatchConfig,
    ) -> Result<Kernel, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.compile(program, config),
            AnyBackend::Reference(reference) => reference.compile(program, &config.codegen),
        }
    }

    /// Most workgroups a dispatch of the grid-sync `kernel` may have now, beside the
    /// backend's running lanes ([`CudaBackend::coresident_workgroups`]); `None` for a
    /// kernel without grid sync.
    pub fn coresident_workgroups(&self, kernel: &Kernel) -> Option<u64> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.coresident_workgroups(kernel),
            AnyBackend::Reference(reference) => reference.coresident_workgroups(kernel),
        }
    }

    /// Run `request` and wait ([`CudaBackend::run`]).
    pub fn run(&self, request: Dispatch<'_>) -> Result<Finished, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.run(request),
            AnyBackend::Reference(reference) => reference.run(request),
        }
    }

    /// Run `request` into caller buffers ([`CudaBackend::run_into`]).
    pub fn run_into(
        &self,
        request: Dispatch<'_>,
        outputs: &mut [&mut [u8]],
    ) -> Result<Timings, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.run_into(request, outputs),
            AnyBackend::Reference(reference) => reference.run_into(request, outputs),
        }
    }

    /// Submit `request` without waiting ([`CudaBackend::submit`]; the reference
    /// runs it at once and `wait` hands the result over).
    pub fn submit(&self, request: Dispatch<'_>) -> Result<PendingDispatch, BackendError> {
        match self {
            AnyBackend::Cuda(gpu) => gpu.submit(request),
            AnyBackend::Reference(reference) => reference.submit(request),
        }
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
                    build(&mut AnyRecorder {
                        kind: RecorderKind::Cuda(recorder),
                    })
                })?;
                Ok(AnyGraph {
                    kind: GraphKind::Cuda(graph),
                })
            }
            AnyBackend::Reference(reference) => {
                let mut recorder = ReferenceRecorder::new(reference);
                build(&mut AnyRecorder {
                    kind: RecorderKind::Reference(&mut recorder),
                })?;
                Ok(AnyGraph {
                    kind: GraphKind::Reference(recorder.finish()?),
                })
            }
        }
    }
}

impl AnyBackend {
    /// A persistent lane serving `kernels` ([`CudaBackend::lane`]). On the reference
    /// interpreter there is no resident kernel: the lane checks everything a CUDA lane
    /// checks, with the same `Fix:` errors (its kernels, options, each request's
    /// membership, grid and capacities), then runs each request as
    /// [`AnyBackend::run`] would, so code written against [`AnyLane`] gets the same
    /// answers with or without a GPU.
    pub fn lane(&self, kernels: &[&Kernel], options: LaneOptions) -> Result<AnyLane, BackendError> {
        let kind = match self {
            AnyBackend::Cuda(gpu) => LaneKind::Cuda(gpu.lane(kernels, options)?),
            AnyBackend::Reference(reference) => {
                LaneKind::Reference(reference.lane(kernels, options)?)
            }
        };
        Ok(AnyLane { kind })
    }
}

/// A lane of an [`AnyBackend`] ([`Lane`] on CUDA; see [`AnyBackend::lane`]).
pub struct AnyLane {
    kind: LaneKind,
}

enum LaneKind {
    Cuda(Lane),
    Reference(ReferenceLane),
}

impl std::fmt::Debug for AnyLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            LaneKind::Cuda(lane) => lane.fmt(f),
            LaneKind::Reference(lane) => f
                .debug_struct("AnyLane")
                .field("backend", &"reference")
                .field("kernels", &lane.kernels().len())
                .field("workgroup_size", &lane.workgroup_size())
                .finish(),
        }
    }
}

impl AnyLane {
    /// The CUDA lane, when this is one.
    pub fn as_cuda(&self) -> Option<&Lane> {
        match &self.kind {
            LaneKind::Cuda(lane) => Some(lane),
            LaneKind::Reference(_) => None,
        }
    }

    /// Run `request` on the lane and wait ([`Lane::run`]).
    pub fn run(&self, request: Dispatch<'_>) -> Result<Finished, BackendError> {
        match &self.kind {
            LaneKind::Cuda(lane) => lane.run(request),
            LaneKind::Reference(lane) => lane.run(request),
        }
    }

    /// Run `request` into caller buffers ([`Lane::run_into`]).
    pub fn run_into(
        &self,
        request: Dispatch<'_>,
        outputs: &mut [&mut [u8]],
    ) -> Result<Timings, BackendError> {
        match &self.kind {
            LaneKind::Cuda(lane) => lane.run_into(request, outputs),
            LaneKind::Reference(lane) => lane.run_into(request, outputs),
        }
    }

    /// Ring `request` without waiting ([`Lane::submit`]; the reference runs it at once).
    pub fn submit(&self, request: Dispatch<'_>) -> Result<PendingDispatch, BackendError> {
        match &self.kind {
            LaneKind::Cuda(lane) => lane.submit(request),
            LaneKind::Reference(lane) => lane.submit(request),
        }
    }

    /// Its kernels, in body order.
    pub fn kernels(&self) -> &[Kernel] {
        match &self.kind {
            LaneKind::Cuda(lane) => lane.kernels(),
            LaneKind::Reference(lane) => lane.kernels(),
        }
    }

    /// The options it was built with.
    pub fn options(&self) -> &LaneOptions {
        match &self.kind {
            LaneKind::Cuda(lane) => lane.options(),
            LaneKind::Reference(lane) => lane.options(),
        }
    }

    /// Stop it now ([`Lane::stop`]; nothing to stop on the reference).
    pub fn stop(self) -> Result<(), BackendError> {
        match self.kind {
            LaneKind::Cuda(lane) => lane.stop(),
            LaneKind::Reference(_) => Ok(()),
        }
    }
}

/// Describes a chain inside [`AnyBackend::record`]; mirrors [`GraphRecorder`].
pub struct AnyRecorder<'r, 'b> {
    kind: RecorderKind<'r, 'b>,
}

enum RecorderKind<'r, 'b> {
    Cuda(&'r mut GraphRecorder<'b>),
    Reference(&'r mut ReferenceRecorder),
}

impl AnyRecorder<'_, '_> {
    /// Copy the first `bytes` bytes of a fresh input slot into the start of
    /// `buffer` at this point of every replay ([`GraphRecorder::upload`]).
    pub fn upload(&mut self, buffer: &DeviceBuffer, bytes: u64) -> Result<InputSlot, BackendError> {
        match &mut self.kind {
            RecorderKind::Cuda(recorder) => recorder.upload(buffer, bytes),
            RecorderKind::Reference(recorder) => recorder.upload(buffer, bytes),
        }
    }

    /// A dispatch of `request` at this point of every replay
    /// ([`GraphRecorder::dispatch`]: owned buffers only, no readback ranges, no
    /// predecessor).
    pub fn dispatch(&mut self, request: Dispatch<'_>) -> Result<StepId, BackendError> {
        match &mut self.kind {
            RecorderKind::Cuda(recorder) => recorder.dispatch(request),
            RecorderKind::Reference(recorder) => recorder.dispatch(request),
        }
    }

    /// Copy `len` bytes of `buffer` from byte `offset` into a fresh output slot at
    /// this point of every replay ([`GraphRecorder::read_back`]).
    pub fn read_back(
        &mut self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<OutputSlot, BackendError> {
        match &mut self.kind {
            RecorderKind::Cuda(recorder) => recorder.read_back(buffer, offset, len),
            RecorderKind::Reference(recorder) => recorder.read_back(buffer, offset, len),
        }
    }
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
    /// The CUDA graph, when this is one (for what only CUDA graphs do: stitching,
    /// device spans).
    pub fn as_cuda(&mut self) -> Option<&mut DispatchGraph> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => Some(graph),
            GraphKind::Reference(_) => None,
        }
    }

    /// Number of recorded dispatches ([`DispatchGraph::step_count`]).
    pub fn step_count(&self) -> usize {
        match &self.kind {
            GraphKind::Cuda(graph) => graph.step_count(),
            GraphKind::Reference(graph) => graph.step_count(),
        }
    }

    /// The bytes `slot` uploads on every replay ([`DispatchGraph::input_mut`]).
    pub fn input_mut(&mut self, slot: InputSlot) -> Result<&mut [u8], BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.input_mut(slot),
            GraphKind::Reference(graph) => graph.input_mut(slot),
        }
    }

    /// The bytes `slot` read back during the last replay ([`DispatchGraph::output`]).
    pub fn output(&self, slot: OutputSlot) -> Result<&[u8], BackendError> {
        match &self.kind {
            GraphKind::Cuda(graph) => graph.output(slot),
            GraphKind::Reference(graph) => graph.output(slot),
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
            GraphKind::Reference(graph) => graph.set_element_count(step, binding, elements),
        }
    }

    /// Bind another buffer for `binding` of `step` on later replays, without
    /// re-capture ([`DispatchGraph::set_buffer`]; the same rules on both
    /// backends).
    pub fn set_buffer(
        &mut self,
        step: StepId,
        binding: u32,
        buffer: &DeviceBuffer,
    ) -> Result<(), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.set_buffer(step, binding, buffer),
            GraphKind::Reference(graph) => graph.set_buffer(step, binding, buffer),
        }
    }

    /// Change the workgroups `step` launches on later replays, without re-capture
    /// ([`DispatchGraph::set_workgroups`]); checked against the launch limits at
    /// once on both backends.
    pub fn set_workgroups(
        &mut self,
        step: StepId,
        workgroups: [u32; 3],
    ) -> Result<(), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.set_workgroups(step, workgroups),
            GraphKind::Reference(graph) => graph.set_workgroups(step, workgroups),
        }
    }

    /// Change several scalar values of `step` and, with `workgroups`, its grid,
    /// in one write ([`DispatchGraph::set_launch`]; none where nothing changes);
    /// every change checked before any is made, with the same errors on both
    /// backends.
    pub fn set_launch(
        &mut self,
        step: StepId,
        scalars: &[(&str, Literal)],
        workgroups: Option<[u32; 3]>,
    ) -> Result<(), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.set_launch(step, scalars, workgroups),
            GraphKind::Reference(graph) => graph.set_launch(step, scalars, workgroups),
        }
    }

    /// The value `step` passes for its scalar parameter `name`
    /// ([`DispatchGraph::scalar`]).
    pub fn scalar(&self, step: StepId, name: &str) -> Result<Literal, BackendError> {
        match &self.kind {
            GraphKind::Cuda(graph) => graph.scalar(step, name),
            GraphKind::Reference(graph) => graph.scalar(step, name),
        }
    }

    /// Change the value `step` passes for its scalar parameter `name` on later
    /// replays, without re-capture ([`DispatchGraph::set_scalar`]); checked as a
    /// request's value is, with the same errors on both backends.
    pub fn set_scalar(
        &mut self,
        step: StepId,
        name: &str,
        value: impl Into<Literal>,
    ) -> Result<(), BackendError> {
        let value = value.into();
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.set_scalar(step, name, value),
            GraphKind::Reference(graph) => graph.set_scalar(step, name, value),
        }
    }

    /// Replay the whole chain ([`DispatchGraph::replay`]).
    pub fn replay(&mut self) -> Result<Timings, BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.replay(),
            GraphKind::Reference(graph) => graph.replay(),
        }
    }

    /// [`AnyGraph::replay`] running `beside` on the calling thread between the
    /// launch and the wait ([`DispatchGraph::replay_beside`]; the reference replays
    /// first, then runs it).
    pub fn replay_beside<R>(
        &mut self,
        beside: impl FnOnce() -> R,
    ) -> Result<(Timings, R), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.replay_beside(beside),
            GraphKind::Reference(graph) => graph.replay().map(|timing| (timing, beside())),
        }
    }

    /// [`AnyGraph::replay_beside`] that hands `beside` the bytes of `input` to
    /// write while the replay runs ([`DispatchGraph::replay_feeding`], with its
    /// `Fix:` errors on both backends; the reference runs `beside` first, then
    /// the replay, which therefore sees every byte written).
    pub fn replay_feeding<R>(
        &mut self,
        input: &mut DeviceBuffer,
        beside: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<(Timings, R), BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.replay_feeding(input, beside),
            GraphKind::Reference(graph) => graph.replay_feeding(input, beside),
        }
    }

    /// [`AnyGraph::replay`] with `event_window_ns` from an event pair on CUDA
    /// ([`DispatchGraph::replay_timed`]); the reference has no device, so this is its
    /// plain replay.
    pub fn replay_timed(&mut self) -> Result<Timings, BackendError> {
        match &mut self.kind {
            GraphKind::Cuda(graph) => graph.replay_timed(),
            GraphKind::Reference(graph) => graph.replay(),
        }
    }

    /// Enqueue one replay without waiting ([`DispatchGraph::submit`]; the reference
    /// replays at once). The pending replay borrows the graph until `wait` or drop.
    pub fn submit(&mut self) -> Result<AnyPendingReplay<'_>, BackendError> {
        let kind = match &mut self.kind {
            GraphKind::Cuda(graph) => PendingReplayKind::Cuda(graph.submit()?),
            GraphKind::Reference(graph) => PendingReplayKind::Reference(graph.replay()),
        };
        Ok(AnyPendingReplay { kind })
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
    Cuda(PendingReplay<'g>),
    Reference(Result<Timings, BackendError>),
}

impl AnyPendingReplay<'_> {
    /// Wait for the replay; its outputs are in the graph's output slots.
    pub fn wait(self) -> Result<Timings, BackendError> {
        match self.kind {
            PendingReplayKind::Cuda(pending) => pending.wait(),
            PendingReplayKind::Reference(result) => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a fallback nobody can see: the notice names the interpreter, and
    /// for a fallback the reason CUDA was not used; a requested reference says so.
    #[test]
    fn the_notice_says_which_backend_runs_and_why() {
        let requested = AnyBackend::reference();
        assert_eq!(requested.kind(), BackendKind::Reference);
        assert!(
            requested.notice().contains("as requested"),
            "{}",
            requested.notice()
        );
        let fallback =
            AnyBackend::Reference(ReferenceBackend::fallback("libcuda.so missing".into()));
        let notice = fallback.notice();
        assert!(notice.contains("reference interpreter") && notice.contains("libcuda.so missing"));
        assert!(!notice.contains('\n'), "one line: {notice}");
    }
}
