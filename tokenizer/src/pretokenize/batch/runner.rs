//! The split steps alone on an [`AnyBackend`] (a CUDA device or the reference
//! interpreter): what the tests, the example and the bench run. A longer
//! pipeline composes the same [`SplitPrograms`] steps itself.
//!
//! Per [`BatchSplitter`]: kernels compiled once, the tables uploaded once
//! and resident, scratch and output buffers grown by powers of two and reused.
//! [`BatchSplitter::split`] submits the steps back to back (each after the one
//! before, on the device) with the text and the document ends as host
//! bindings and waits once; [`BatchSplitter::split_graph`] records the steps
//! once per capacity (uploads from the graph's input slots, the dispatches, the
//! count) and replays them with the element counts and grids of each batch,
//! set without a new capture. On CUDA the piece starts live in host-mapped
//! memory, so both hand them out in place after the one synchronize, as
//! GPT-2's [`CudaPipeline`](crate::pretokenize::pipeline::CudaPipeline) does;
//! on the reference interpreter they are read into a vector the splitter keeps.

use smallvec::smallvec;

use vyre_cuda::backend::{
    AnyBackend, AnyGraph, Binding, DeviceBuffer, Dispatch, Kernel, PendingDispatch, Timings,
};
use vyre_cuda::graph::{InputSlot, OutputSlot, StepId};
use vyre_cuda::{ByteRange, CodegenOptions, DispatchConfig, ReadbackPolicy};

use super::{check_batch, table_bytes, SplitBuffer, SplitPrograms};
use crate::occupancy::Occupancy;
use crate::pretokenize::PretokenizeError;

/// Smallest capacity (text bytes) the splitter allocates for.
const MIN_TEXT_CAPACITY: usize = 4096;

/// Smallest capacity (documents) of a recorded graph.
const MIN_DOCUMENT_CAPACITY: usize = 64;

/// Buffers sized for texts of up to `text_capacity` bytes.
struct Buffers {
    text_capacity: usize,
    codes: Option<DeviceBuffer>,
    statuses: DeviceBuffer,
    piece_starts: DeviceBuffer,
    piece_count: DeviceBuffer,
}

/// A recorded split for batches of up to `text_capacity` bytes and
/// `document_capacity` documents.
struct Recorded {
    text_capacity: usize,
    document_capacity: usize,
    graph: AnyGraph,
    text_slot: InputSlot,
    ends_slot: InputSlot,
    count_slot: OutputSlot,
    steps: Vec<StepId>,
}

/// The split of one pattern on one backend (see the module docs).
pub struct BatchSplitter {
    backend: AnyBackend,
    programs: SplitPrograms,
    kernels: Vec<Kernel>,
    kind_table: DeviceBuffer,
    counters: DeviceBuffer,
    buffers: Option<Buffers>,
    graph_text: Option<(DeviceBuffer, DeviceBuffer)>,
    recorded: Option<Recorded>,
    /// The piece starts read back (the reference interpreter, or a big-endian
    /// host); empty where they are handed out in place.
    host_starts: Vec<u32>,
    /// Timings of the last run: one per step eagerly, the replay's as a graph.
    timings: Vec<Timings>,
}

impl std::fmt::Debug for BatchSplitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSplitter")
            .field("pattern", &self.programs.pattern())
            .field("backend", &self.backend.kind())
            .finish_non_exhaustive()
    }
}

fn capacity_for(len: usize, least: usize) -> usize {
    len.max(least).next_power_of_two()
}

impl BatchSplitter {
    /// Compiles the steps on `backend` and uploads the resident tables.
    pub fn new(backend: &AnyBackend, programs: SplitPrograms) -> Result<Self, PretokenizeError> {
        let mut kernels = Vec::new();
        let limits = crate::occupancy::multiprocessor_limits(backend);
        for step in programs.steps() {
            // Each step keeps its body's registers at the most resident blocks
            // (`crate::occupancy`).
            let threads = step.program.workgroup_size().iter().product();
            let codegen = Occupancy::BodyRegisters.codegen(
                CodegenOptions::new(),
                step.body_registers,
                threads,
                limits.as_ref(),
            );
            let config = DispatchConfig::linear(1).with_codegen(codegen);
            kernels.push(backend.compile(&step.program, &config)?);
        }
        let table = table_bytes(programs.pattern())?;
        let kind_table = backend.buffer(table.len() as u64)?;
        backend.upload(&kind_table, &table)?;
        let counters = backend.buffer(programs.buffer_bytes(SplitBuffer::Counters, 0, 0)?)?;
        Ok(BatchSplitter {
            backend: backend.clone(),
            programs,
            kernels,
            kind_table,
            counters,
            buffers: None,
            graph_text: None,
            recorded: None,
            host_starts: Vec::new(),
            timings: Vec::new(),
        })
    }

    /// The programs it runs.
    pub fn programs(&self) -> &SplitPrograms {
        &self.programs
    }

    /// The compiled kernels, one per step.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// Timings of the last successful split: one per step for
    /// [`BatchSplitter::split`] (each `wall_ns` from the step's submission to
    /// the end of its wait, so they overlap), one for the replay of
    /// [`BatchSplitter::split_graph`].
    pub fn timings(&self) -> &[Timings] {
        &self.timings
    }

    /// Makes sure the buffers hold a text of `text_len` bytes.
    fn ensure_buffers(&mut self, text_len: usize) -> Result<(), PretokenizeError> {
        if self
            .buffers
            .as_ref()
            .is_some_and(|buffers| buffers.text_capacity >= text_len)
        {
            return Ok(());
        }
        let capacity = capacity_for(text_len, MIN_TEXT_CAPACITY);
        let bytes = |buffer| self.programs.buffer_bytes(buffer, capacity, 1);
        let codes = if self.programs.binds(SplitBuffer::Codes) {
            Some(self.backend.buffer(bytes(SplitBuffer::Codes)?)?)
        } else {
            None
        };
        self.buffers = Some(Buffers {
            text_capacity: capacity,
            codes,
            statuses: self.backend.buffer(bytes(SplitBuffer::Statuses)?)?,
            piece_starts: match &self.backend {
                // Stored straight into host memory: no read after the run.
                AnyBackend::Cuda(gpu) => {
                    gpu.host_mapped_buffer(bytes(SplitBuffer::PieceStarts)?)?
                }
                _ => self.backend.buffer(bytes(SplitBuffer::PieceStarts)?)?,
            },
            piece_count: self.backend.buffer(4)?,
        });
        // A graph holds the buffers it was recorded over: record again.
        self.recorded = None;
        Ok(())
    }

    /// The start of every split: the batch checked, the last timings cleared,
    /// the buffers grown; `false` for an empty text (no pieces, nothing runs).
    fn begin(&mut self, text: &[u8], document_ends: &[u32]) -> Result<bool, PretokenizeError> {
        check_batch(text.len(), document_ends)?;
        self.timings.clear();
        if text.is_empty() {
            return Ok(false);
        }
        self.ensure_buffers(text.len())?;
        Ok(true)
    }

    /// The binding of `buffer` (one that lives in the splitter) or of an input.
    fn binding<'a>(
        &'a self,
        buffer: SplitBuffer,
        inputs: Option<(&'a [u8], &'a [u32])>,
        graph_inputs: Option<&'a (DeviceBuffer, DeviceBuffer)>,
    ) -> Result<Binding<'a>, PretokenizeError> {
        let buffers = self.buffers.as_ref().ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the splitter's buffers are missing; report this")
        })?;
        Ok(match buffer {
            SplitBuffer::Text => match (inputs, graph_inputs) {
                (Some((text, _)), _) => Binding::Host(text),
                (None, Some((text, _))) => Binding::Buffer(text),
                _ => return Err(missing_input()),
            },
            SplitBuffer::DocumentEnds => match (inputs, graph_inputs) {
                (Some((_, ends)), _) => Binding::host(ends),
                (None, Some((_, ends))) => Binding::Buffer(ends),
                _ => return Err(missing_input()),
            },
            SplitBuffer::KindTable => Binding::Buffer(&self.kind_table),
            SplitBuffer::Codes => Binding::Buffer(buffers.codes.as_ref().ok_or_else(|| {
                PretokenizeError::new(
                    "Fix: internal: no codes buffer for a step that binds one; report this",
                )
            })?),
            SplitBuffer::Statuses => Binding::Buffer(&buffers.statuses),
            SplitBuffer::Counters => Binding::Buffer(&self.counters),
            SplitBuffer::PieceStarts => Binding::Buffer(&buffers.piece_starts),
            SplitBuffer::PieceCount => Binding::Buffer(&buffers.piece_count),
        })
    }

    /// The piece starts of a batch: `text` holds the documents back to back and
    /// `document_ends` the end of each ([`check_batch`]). Each document splits
    /// exactly as it would alone; the offsets are into `text`. Eager: the steps
    /// are submitted back to back and waited for once. The starts are valid
    /// until the next split (which needs `&mut self`).
    pub fn split(
        &mut self,
        text: &[u8],
        document_ends: &[u32],
    ) -> Result<&[u32], PretokenizeError> {
        if !self.begin(text, document_ends)? {
            return Ok(&[]);
        }
        let workgroups = self.programs.workgroups(text.len());
        let steps = self.programs.steps();
        let last = steps.len() - 1;
        let count_binding = binding_index(steps[last].bindings, SplitBuffer::PieceCount)?;
        let plain = DispatchConfig::linear(workgroups).with_readback(ReadbackPolicy::None);
        let reading =
            DispatchConfig::linear(workgroups).with_readback(ReadbackPolicy::Ranges(smallvec![
                ByteRange {
                    binding: count_binding,
                    offset: 0,
                    len: 4,
                }
            ]));
        let mut pending: Vec<PendingDispatch> = Vec::with_capacity(steps.len());
        for (index, (step, kernel)) in steps.iter().zip(&self.kernels).enumerate() {
            let bindings = step
                .bindings
                .iter()
                .map(|&buffer| self.binding(buffer, Some((text, document_ends)), None))
                .collect::<Result<Vec<_>, _>>()?;
            let config = if index == last { &reading } else { &plain };
            let request = Dispatch::new(kernel, &bindings).config(config);
            let submitted = self.backend.submit(request.after_last(&pending))?;
            pending.push(submitted);
        }
        // The last step's wait covers the chain; the others find their streams idle.
        let mut count = None;
        let mut timings = vec![Timings::default(); pending.len()];
        for (index, submitted) in pending.into_iter().enumerate().rev() {
            let finished = submitted.wait()?;
            timings[index] = finished.timings;
            if count.is_none() {
                count = Some(piece_count(finished.outputs.item(0), text.len())?);
            }
        }
        self.timings = timings;
        self.piece_starts(count.unwrap_or(0))
    }

    /// [`BatchSplitter::split`] as one replay of a recorded graph (recorded on
    /// first use, and again when a batch outgrows it).
    pub fn split_graph(
        &mut self,
        text: &[u8],
        document_ends: &[u32],
    ) -> Result<&[u32], PretokenizeError> {
        if !self.begin(text, document_ends)? {
            return Ok(&[]);
        }
        let fits = self.recorded.as_ref().is_some_and(|recorded| {
            recorded.text_capacity >= text.len()
                && recorded.document_capacity >= document_ends.len()
        });
        if !fits {
            self.record(text.len(), document_ends.len())?;
        }
        let workgroups = self.programs.workgroups(text.len());
        let steps = self.programs.steps();
        let recorded = self.recorded.as_mut().ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the split graph is missing; report this")
        })?;
        recorded.graph.input_mut(recorded.text_slot)?[..text.len()].copy_from_slice(text);
        let ends: &[u8] = bytemuck::cast_slice(document_ends);
        recorded.graph.input_mut(recorded.ends_slot)?[..ends.len()].copy_from_slice(ends);
        for (step, &id) in steps.iter().zip(&recorded.steps) {
            for (binding, buffer) in step.bindings.iter().enumerate() {
                let elements = match buffer {
                    SplitBuffer::Text => text.len(),
                    SplitBuffer::DocumentEnds => document_ends.len(),
                    _ => continue,
                };
                recorded
                    .graph
                    .set_element_count(id, binding as u32, elements as u32)?;
            }
            recorded.graph.set_workgroups(id, [workgroups, 1, 1])?;
        }
        let replay = recorded.graph.replay()?;
        let count = piece_count(
            Some(recorded.graph.output(recorded.count_slot)?),
            text.len(),
        )?;
        self.timings = vec![replay];
        self.piece_starts(count)
    }

    fn record(&mut self, text_len: usize, document_count: usize) -> Result<(), PretokenizeError> {
        let buffers = self.buffers.as_ref().ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the splitter's buffers are missing; report this")
        })?;
        let text_capacity = buffers.text_capacity.max(text_len);
        let document_capacity = capacity_for(document_count, MIN_DOCUMENT_CAPACITY);
        let reuse = self.graph_text.as_ref().is_some_and(|(text, ends)| {
            text.len() >= text_capacity as u64 && ends.len() >= 4 * document_capacity as u64
        });
        if !reuse {
            self.graph_text = Some((
                self.backend.buffer(text_capacity as u64)?,
                self.backend.buffer(4 * document_capacity as u64)?,
            ));
        }
        let graph_inputs = self.graph_text.as_ref();
        let Some((text_buffer, ends_buffer)) = graph_inputs else {
            return Err(missing_input());
        };
        let workgroups = self.programs.workgroups(text_capacity);
        let config = DispatchConfig::linear(workgroups).with_readback(ReadbackPolicy::None);
        let mut step_bindings = Vec::new();
        for step in self.programs.steps() {
            step_bindings.push(
                step.bindings
                    .iter()
                    .map(|&buffer| self.binding(buffer, None, graph_inputs))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        let count_buffer = &buffers.piece_count;
        let mut slots = None;
        let graph = self.backend.record(|rec| {
            let text_slot = rec.upload(text_buffer, text_buffer.len())?;
            let ends_slot = rec.upload(ends_buffer, ends_buffer.len())?;
            let mut steps = Vec::new();
            for (bindings, kernel) in step_bindings.iter().zip(&self.kernels) {
                steps.push(rec.dispatch(Dispatch::new(kernel, bindings).config(&config))?);
            }
            let count_slot = rec.read_back(count_buffer, 0, 4)?;
            slots = Some((text_slot, ends_slot, count_slot, steps));
            Ok(())
        })?;
        let (text_slot, ends_slot, count_slot, steps) = slots.ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the split graph recorded no slots; report this")
        })?;
        self.recorded = Some(Recorded {
            text_capacity,
            document_capacity,
            graph,
            text_slot,
            ends_slot,
            count_slot,
            steps,
        });
        Ok(())
    }

    /// The first `count` piece starts, after the run's synchronize: in place in
    /// the host-mapped buffer (beside the recorded graph, which holds it), or
    /// read into `host_starts`.
    fn piece_starts(&mut self, count: usize) -> Result<&[u32], PretokenizeError> {
        let buffers = self.buffers.as_mut().ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the splitter's buffers are missing; report this")
        })?;
        if buffers.piece_starts.is_host_mapped() {
            let graph = self
                .recorded
                .as_mut()
                .and_then(|recorded| recorded.graph.as_cuda());
            let bytes = match graph {
                Some(graph) => buffers.piece_starts.mapped_bytes_beside(graph)?,
                None => buffers.piece_starts.mapped_bytes()?,
            };
            let bytes = &bytes[..4 * count];
            if cfg!(target_endian = "little") {
                if let Ok(words) = bytemuck::try_cast_slice::<u8, u32>(bytes) {
                    return Ok(words);
                }
            }
            self.host_starts.clear();
            self.host_starts.extend(
                bytes
                    .chunks_exact(4)
                    .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]])),
            );
            return Ok(&self.host_starts);
        }
        self.host_starts.clear();
        self.host_starts.resize(count, 0);
        if count > 0 {
            self.backend
                .read_into(&buffers.piece_starts, &mut self.host_starts)?;
        }
        Ok(&self.host_starts)
    }
}

fn missing_input() -> PretokenizeError {
    PretokenizeError::new(
        "Fix: internal: a split step binds an input the run did not give; report this",
    )
}

/// The position of `buffer` in a step's bindings.
fn binding_index(bindings: &[SplitBuffer], buffer: SplitBuffer) -> Result<u32, PretokenizeError> {
    bindings
        .iter()
        .position(|&bound| bound == buffer)
        .map(|index| index as u32)
        .ok_or_else(|| {
            PretokenizeError::new(format!(
                "Fix: internal: the last split step does not bind {}; report this",
                buffer.name()
            ))
        })
}

/// The piece count the last step wrote: at most one piece per byte, and at
/// least one in a text that is not empty.
fn piece_count(bytes: Option<&[u8]>, text_len: usize) -> Result<usize, PretokenizeError> {
    let count = bytes
        .and_then(|bytes| bytes.get(..4))
        .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]) as usize);
    match count {
        Some(count) if (1..=text_len).contains(&count) => Ok(count),
        _ => Err(PretokenizeError::new(format!(
            "Fix: internal: the split counted {count:?} pieces in {text_len} bytes (expected 1 to {text_len}); report this as a bug"
        ))),
    }
}
