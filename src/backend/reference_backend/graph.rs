//! Recorded chains on the reference backend: the recording rules of a CUDA graph
//! (`graph::record`'s own checks), replayed operation by operation on the
//! interpreter.

use std::sync::Arc;
use std::time::Instant;

use crate::config::DispatchConfig;

use super::super::buffer::held_besides;
use super::super::graph::{
    check_recordable, check_recorded_read_back, check_recorded_upload, fed_buffer_transferred,
    fed_buffer_written, next_graph_id, InputSlot, OutputSlot, StepId,
};
use super::super::plan::{
    check_aliasing, check_binding_sizes, check_rebind, check_request_scalars, scalar_position,
    undeclared_scalar,
};
use super::super::request::ScalarValues;
use super::super::{BackendError, Binding, DeviceBuffer, Dispatch, Kernel, LaunchPlan, Timings};
use super::{HostMemory, ReferenceBackend, ReferenceKernel};
use crate::ir::{Access, Literal};

/// One operation of a recorded chain, holding the memory it touches.
enum Operation {
    Upload {
        input: usize,
        memory: Arc<HostMemory>,
    },
    Dispatch(Step),
    ReadBack {
        output: usize,
        memory: Arc<HostMemory>,
        offset: usize,
    },
}

/// One recorded dispatch.
struct Step {
    kernel: Kernel,
    memories: Vec<Arc<HostMemory>>,
    workgroups: [u32; 3],
    fixpoint_iterations: u32,
    /// Element counts set by `set_element_count`, per slot (`None`: the buffer's).
    counts: Vec<Option<u32>>,
    /// The scalar values it passes (every declared one supplied).
    scalars: ScalarValues,
}

/// A recorded chain on the reference side: its operations and its input and output
/// slots.
pub(in crate::backend) struct ReferenceGraph {
    id: u64,
    backend: ReferenceBackend,
    operations: Vec<Operation>,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
    /// Index into `operations` of each recorded dispatch.
    steps: Vec<usize>,
}

impl std::fmt::Debug for ReferenceGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceGraph")
            .field("id", &self.id)
            .field("operations", &self.operations.len())
            .finish()
    }
}

/// Describes a chain on the reference backend (the CUDA recorder's twin).
pub(in crate::backend) struct ReferenceRecorder {
    graph: ReferenceGraph,
}

impl ReferenceRecorder {
    pub(in crate::backend) fn new(backend: &ReferenceBackend) -> Self {
        ReferenceRecorder {
            graph: ReferenceGraph {
                id: next_graph_id(),
                backend: backend.clone(),
                operations: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                steps: Vec::new(),
            },
        }
    }

    /// The recorded chain; an empty recording is refused as on CUDA.
    pub(in crate::backend) fn finish(self) -> Result<ReferenceGraph, BackendError> {
        if self.graph.operations.is_empty() {
            return Err(BackendError::bad_input(
                "Fix: the recording closure recorded nothing; record at least one upload, dispatch or \
                 read-back",
            ));
        }
        Ok(self.graph)
    }

    fn memory(&self, buffer: &DeviceBuffer, verb: &str) -> Result<Arc<HostMemory>, BackendError> {
        buffer
            .host_for(&self.graph.backend.inner, verb)
            .map(Arc::clone)
    }

    pub(in crate::backend) fn upload(
        &mut self,
        buffer: &DeviceBuffer,
        bytes: u64,
    ) -> Result<InputSlot, BackendError> {
        let memory = self.memory(buffer, "record an upload into")?;
        check_recorded_upload(bytes, buffer.len())?;
        let graph = &mut self.graph;
        let index = graph.inputs.len();
        graph.inputs.push(vec![0; bytes as usize]);
        graph.operations.push(Operation::Upload {
            input: index,
            memory,
        });
        Ok(InputSlot::new(graph.id, index as u32))
    }

    pub(in crate::backend) fn dispatch(
        &mut self,
        request: Dispatch<'_>,
    ) -> Result<StepId, BackendError> {
        let backend = &self.graph.backend;
        let kernel = backend.resolve(request.target, &request.codegen)?;
        let reference = backend.reference_kernel(&kernel)?;
        let name = &reference.name;
        check_recordable(name, &request)?;
        let mut memories = Vec::with_capacity(request.bindings.len());
        for binding in request.bindings {
            match binding {
                Binding::Buffer(buffer) => {
                    memories.push(self.memory(buffer, "record a dispatch over")?)
                }
                _ => {
                    return Err(super::super::buffer::foreign_buffer(
                        "record a dispatch over",
                    ))
                }
            }
        }
        let sizes: Vec<u64> = request.bindings.iter().map(Binding::len).collect();
        check_binding_sizes(name, &reference.slots, &sizes, request.fixpoint_iterations)?;
        check_aliasing(name, &reference.slots, request.bindings)?;
        check_request_scalars(name, reference.program.scalars(), &request)?;
        check_grid_now(backend, reference, request.workgroups)?;
        let counts = vec![None; reference.slots.len()];
        let graph = &mut self.graph;
        let index = graph.steps.len();
        graph.steps.push(graph.operations.len());
        graph.operations.push(Operation::Dispatch(Step {
            kernel,
            memories,
            workgroups: request.workgroups,
            fixpoint_iterations: request.fixpoint_iterations,
            counts,
            scalars: request.scalars,
        }));
        Ok(StepId::new(graph.id, index as u32))
    }

    pub(in crate::backend) fn read_back(
        &mut self,
        buffer: &DeviceBuffer,
        offset: u64,
        len: u64,
    ) -> Result<OutputSlot, BackendError> {
        let memory = self.memory(buffer, "record a read-back of")?;
        check_recorded_read_back(offset, len, buffer.len())?;
        let graph = &mut self.graph;
        let index = graph.outputs.len();
        graph.outputs.push(vec![0; len as usize]);
        graph.operations.push(Operation::ReadBack {
            output: index,
            memory,
            offset: offset as usize,
        });
        Ok(OutputSlot::new(graph.id, index as u32))
    }
}

impl ReferenceGraph {
    /// Number of recorded dispatches.
    pub(in crate::backend) fn step_count(&self) -> usize {
        self.steps.len()
    }

    pub(in crate::backend) fn input_mut(
        &mut self,
        slot: InputSlot,
    ) -> Result<&mut [u8], BackendError> {
        let index = slot.index_in(self.id)?;
        self.inputs
            .get_mut(index)
            .map(Vec::as_mut_slice)
            .ok_or_else(|| forged("input slot"))
    }

    pub(in crate::backend) fn output(&self, slot: OutputSlot) -> Result<&[u8], BackendError> {
        let index = slot.index_in(self.id)?;
        self.outputs
            .get(index)
            .map(Vec::as_slice)
            .ok_or_else(|| forged("output slot"))
    }

    /// The recorded dispatch `step` and its backend.
    fn step(&self, step: StepId) -> Result<(&Step, &ReferenceBackend), BackendError> {
        let at = self.operation_of(step)?;
        match self.operations.get(at) {
            Some(Operation::Dispatch(step)) => Ok((step, &self.backend)),
            _ => Err(forged("step")),
        }
    }

    /// [`ReferenceGraph::step`], to change.
    fn step_mut(&mut self, step: StepId) -> Result<(&mut Step, &ReferenceBackend), BackendError> {
        let at = self.operation_of(step)?;
        match self.operations.get_mut(at) {
            Some(Operation::Dispatch(step)) => Ok((step, &self.backend)),
            _ => Err(forged("step")),
        }
    }

    /// Where in `operations` the recorded dispatch `step` is.
    fn operation_of(&self, step: StepId) -> Result<usize, BackendError> {
        let index = step.index_in(self.id)?;
        self.steps.get(index).copied().ok_or_else(|| forged("step"))
    }

    pub(in crate::backend) fn set_element_count(
        &mut self,
        step: StepId,
        binding: u32,
        elements: u32,
    ) -> Result<(), BackendError> {
        let (step, backend) = self.step_mut(step)?;
        let kernel = backend.reference_kernel(&step.kernel)?;
        let name = &kernel.name;
        let index = slot_of(kernel, binding)?;
        let slot = &kernel.slots[index];
        if let crate::ir::BufferCount::Static(n) = slot.count {
            return Err(BackendError::bad_input(format!(
                "Fix: buffer '{}' (binding {binding}) of {name} has a static count of {n} elements, \
                 which the kernel uses instead of the parameter; only runtime-sized buffers take \
                 element count updates",
                slot.name
            )));
        }
        let capacity = step.memories[index].lock().len() as u64 / slot.elem.size_bytes() as u64;
        if elements as u64 > capacity {
            return Err(BackendError::bad_input(format!(
                "Fix: buffer '{}' (binding {binding}) of {name} holds {capacity} elements, so it \
                 cannot pass {elements}; pass at most {capacity} or record the graph over a larger \
                 buffer",
                slot.name
            )));
        }
        step.counts[index] = Some(elements);
        Ok(())
    }

    /// Another buffer for `binding` of `step`, checked as the CUDA graph checks
    /// it; the kernel keeps the element count the step was recorded with.
    pub(in crate::backend) fn set_buffer(
        &mut self,
        step: StepId,
        binding: u32,
        buffer: &DeviceBuffer,
    ) -> Result<(), BackendError> {
        let memory =
            Arc::clone(buffer.host_for(&self.backend.inner, "rebind a recorded dispatch to")?);
        let transfers: Vec<Arc<HostMemory>> = self
            .operations
            .iter()
            .filter_map(|operation| match operation {
                Operation::Upload { memory, .. } | Operation::ReadBack { memory, .. } => {
                    Some(Arc::clone(memory))
                }
                Operation::Dispatch(_) => None,
            })
            .collect();
        let (step, backend) = self.step_mut(step)?;
        let kernel = backend.reference_kernel(&step.kernel)?;
        let name = &kernel.name;
        let index = slot_of(kernel, binding)?;
        let recorded = step.memories[index].lock().len() as u64;
        let also_bound_at: Vec<usize> = (0..step.memories.len())
            .filter(|&other| other != index && Arc::ptr_eq(&step.memories[other], &memory))
            .collect();
        check_rebind(
            name,
            &kernel.slots,
            index,
            (recorded, buffer.len()),
            &also_bound_at,
            transfers
                .iter()
                .any(|held| Arc::ptr_eq(held, &step.memories[index])),
        )?;
        // The recorded count, as the CUDA step keeps passing it.
        let slot = &kernel.slots[index];
        if step.counts[index].is_none() && !matches!(slot.count, crate::ir::BufferCount::Static(_))
        {
            let elements = recorded / slot.elem.size_bytes() as u64;
            step.counts[index] = Some(u32::try_from(elements).map_err(|_| {
                BackendError::internal("a recorded buffer of more than u32::MAX elements")
            })?);
        }
        step.memories[index] = memory;
        Ok(())
    }

    /// The new grid is checked as the CUDA graph checks it (its launch plan).
    pub(in crate::backend) fn set_workgroups(
        &mut self,
        step: StepId,
        workgroups: [u32; 3],
    ) -> Result<(), BackendError> {
        self.set_launch(step, &[], Some(workgroups))
    }

    /// New scalar values and grid for `step`, every one checked as the CUDA
    /// graph checks it before any is made.
    pub(in crate::backend) fn set_launch(
        &mut self,
        step: StepId,
        scalars: &[(&str, Literal)],
        workgroups: Option<[u32; 3]>,
    ) -> Result<(), BackendError> {
        let (step, backend) = self.step_mut(step)?;
        let kernel = backend.reference_kernel(&step.kernel)?;
        let positions = scalars
            .iter()
            .map(|&(name, value)| {
                scalar_position(&kernel.name, kernel.program.scalars(), name, value)
                    .map(|position| (position, value))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(workgroups) = workgroups {
            check_grid_now(backend, kernel, workgroups)?;
        }
        for (position, value) in positions {
            step.scalars.set(position, value);
        }
        if let Some(workgroups) = workgroups {
            step.workgroups = workgroups;
        }
        Ok(())
    }

    /// The value `step` passes for its scalar `name`, as the CUDA graph reads it.
    pub(in crate::backend) fn scalar(
        &self,
        step: StepId,
        name: &str,
    ) -> Result<Literal, BackendError> {
        let (step, backend) = self.step(step)?;
        let kernel = backend.reference_kernel(&step.kernel)?;
        let program = kernel.program.program();
        let (position, decl) = program
            .scalar(name)
            .ok_or_else(|| undeclared_scalar(&kernel.name, program.scalars(), name))?;
        step.scalars
            .get(position, decl.ty)
            .ok_or_else(|| BackendError::internal("a recorded step lacks a scalar value"))
    }

    /// A new value for scalar `name` of `step`, checked as the CUDA graph checks it.
    pub(in crate::backend) fn set_scalar(
        &mut self,
        step: StepId,
        name: &str,
        value: Literal,
    ) -> Result<(), BackendError> {
        self.set_launch(step, &[(name, value)], None)
    }

    /// The CUDA graph's `replay_feeding` on the interpreter: the same checks (a
    /// buffer anything besides this graph holds, one a step writes, one the graph
    /// uploads into or reads back from), then `beside` over the buffer's bytes,
    /// then the replay (which runs at once, so it sees every byte `beside`
    /// wrote, as a kernel that waits for the host's flags does).
    pub(in crate::backend) fn replay_feeding<R>(
        &mut self,
        input: &mut DeviceBuffer,
        beside: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<(Timings, R), BackendError> {
        let memory = Arc::clone(input.host_for(&self.backend.inner, "feed to a replay")?);
        let mut held = 0;
        for operation in &self.operations {
            match operation {
                Operation::Upload { memory: other, .. }
                | Operation::ReadBack { memory: other, .. } => {
                    if Arc::ptr_eq(other, &memory) {
                        return Err(fed_buffer_transferred());
                    }
                }
                Operation::Dispatch(step) => {
                    let kernel = self.backend.reference_kernel(&step.kernel)?;
                    for (slot, other) in step.memories.iter().enumerate() {
                        if !Arc::ptr_eq(other, &memory) {
                            continue;
                        }
                        held += 1;
                        let param = &kernel.slots[slot];
                        if param.access != Access::ReadOnly {
                            return Err(fed_buffer_written(
                                &kernel.name,
                                &param.name,
                                param.access,
                            ));
                        }
                    }
                }
            }
        }
        // The buffer, this clone and this graph's bindings: anything more is
        // another graph's hold.
        if Arc::strong_count(&memory) != 2 + held {
            return Err(held_besides("feeding it to a replay"));
        }
        let fed = {
            let mut bytes = memory.lock();
            let len = bytes.len().min(input.len() as usize);
            beside(&mut bytes[..len])
        };
        self.replay().map(|timings| (timings, fed))
    }

    pub(in crate::backend) fn replay(&mut self) -> Result<Timings, BackendError> {
        let start = Instant::now();
        for operation in &self.operations {
            match operation {
                Operation::Upload { input, memory } => {
                    let data = &self.inputs[*input];
                    memory.lock()[..data.len()].copy_from_slice(data);
                }
                Operation::Dispatch(step) => {
                    let kernel = self.backend.reference_kernel(&step.kernel)?;
                    // Lanes may have started since the recording.
                    check_grid_now(&self.backend, kernel, step.workgroups)?;
                    replay_dispatch(&self.backend, kernel, step)?;
                }
                Operation::ReadBack {
                    output,
                    memory,
                    offset,
                } => {
                    let out = &mut self.outputs[*output];
                    let len = out.len();
                    out.copy_from_slice(&memory.lock()[*offset..*offset + len]);
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
}

/// A recorded step's grid of `workgroups` checked as the CUDA graph checks it
/// at recording, at `set_workgroups` and before every replay: its launch plan,
/// and for a grid-sync kernel the workgroups the device holds beside the lanes
/// running now.
fn check_grid_now(
    backend: &ReferenceBackend,
    kernel: &ReferenceKernel,
    workgroups: [u32; 3],
) -> Result<(), BackendError> {
    let launch = LaunchPlan::new(workgroups, kernel.workgroup_size, backend.caps())?;
    backend.check_grid_sync_fits(kernel, &launch)
}

/// One recorded dispatch on the reference side: run over the buffers' current
/// bytes, outputs written back.
fn replay_dispatch(
    backend: &ReferenceBackend,
    kernel: &ReferenceKernel,
    step: &Step,
) -> Result<(), BackendError> {
    // A set element count passes a prefix of the buffer, as the CUDA kernel sees
    // only that many elements; the rest of the buffer is left as it was.
    let inputs: Vec<Vec<u8>> = step
        .memories
        .iter()
        .zip(&kernel.slots)
        .zip(&step.counts)
        .map(|((memory, slot), count)| {
            let bytes = memory.lock();
            match count {
                Some(n) => bytes[..*n as usize * slot.elem.size_bytes() as usize].to_vec(),
                None => bytes.clone(),
            }
        })
        .collect();
    let borrowed: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let config = DispatchConfig::new(step.workgroups)
        .with_fixpoint_iterations(step.fixpoint_iterations)
        .with_codegen(kernel.codegen);
    let results = backend.interpret(kernel, &borrowed, &step.scalars, &config)?;
    for (&slot, bytes) in kernel.outputs.iter().zip(results) {
        let mut memory = step.memories[slot as usize].lock();
        memory[..bytes.len()].copy_from_slice(&bytes);
        // `WriteOnly` starts zeroed: the CUDA step clears the whole buffer, not
        // only the elements it passes.
        if kernel.slots[slot as usize].access == crate::ir::Access::WriteOnly {
            memory[bytes.len()..].fill(0);
        }
    }
    Ok(())
}

/// The slot of `kernel`'s global buffer at `binding`.
fn slot_of(kernel: &ReferenceKernel, binding: u32) -> Result<usize, BackendError> {
    kernel
        .slots
        .iter()
        .position(|slot| slot.binding == binding)
        .ok_or_else(|| {
            BackendError::bad_input(format!(
                "Fix: {} has no global buffer at binding {binding}; name one of its bindings",
                kernel.name
            ))
        })
}

fn forged(what: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {what} does not exist in this dispatch graph; the value was forged or corrupted"
    ))
}
