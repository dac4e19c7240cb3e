//! Running the two programs: on the CPU reference interpreter (the oracle, and
//! the fallback without a GPU) or on a CUDA device over device buffers (and one
//! host-mapped buffer for the piece starts), eagerly or as one CUDA graph.
//!
//! All three runs follow the one description of the pipeline in
//! [`programs::STEPS`](super::programs::STEPS): which program runs over which
//! buffers on which grid, and what the eager run reads back after it. The length
//! check ([`check_encode_len`]), the count check ([`piece_count`]) and the
//! byte-order fix (`words_of`) exist once and serve all three.
//!
//! The CUDA path is built for a tokenizer's hot loop (measured on the H200: launch + synchronize is
//! 8.5–9.8 µs on the raw driver, so the host cost per encode is counted in
//! synchronizes): every buffer is allocated once in [`CudaPipeline::new`] and the
//! class table uploaded then, kernels are compiled once (dispatches through
//! [`Kernel`] skip every cache lookup), the split reads nothing back, the
//! compaction's dispatch brings back only the 4-byte piece count (in its epilogue,
//! through mapped memory: no copy) and stores the piece starts straight into
//! host-mapped pinned memory ([`BufferRole::host_mapped`]), so they are on
//! the host when its synchronize returns and [`CudaPipeline::piece_starts`] is a
//! view of them: no copy and no read of its own, whatever the count. Eager, per
//! encode: two dispatches submitted back to back, the compaction ordered after
//! the split on the device (an event, [`Dispatch::after`]), one blocking
//! synchronize for both (the split's own then finds its stream idle: measured
//! 1.8 µs), the text up as a host binding of the split (staged on its stream),
//! no DMA copy back, no driver allocation once warm. As a graph: one replay (upload, two kernels, the count)
//! and one synchronize, nothing else. (Measured on the H200, 2026-12-01, before
//! the mapped piece starts: the separate read of exactly the piece starts after a
//! replay cost 14–30 µs for 90–290 KB.)
//!
//! Every use of the backend's API by this module (allocation, upload, dispatch,
//! recording, readback) is in [`CudaPipeline`]'s methods `new`,
//! `encode_stepwise`, `encode_chained`, `record_graph` and `encode_graph_with`, so
//! a port to another API touches only those.

use std::time::Instant;

use smallvec::{smallvec, SmallVec};

use super::programs::{BufferRole, Grid, Programs, Step, StepReadback, STEPS};
use super::unicode::class_table;
use super::{check_text_len, PretokenizeError};
use vyre_cuda::backend::{
    Binding, CudaBackend, DeviceBuffer, Dispatch, Kernel, PendingDispatch, Timing, Timings,
};
use vyre_cuda::graph::{DispatchGraph, InputSlot, OutputSlot};
use vyre_cuda::ir::{Access, Program};
use vyre_cuda::reference;
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// Number of dispatches per encode.
pub const DISPATCHES_PER_ENCODE: usize = STEPS.len();

const ROLES: usize = BufferRole::ALL.len();

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// `bytes` (the host-mapped piece starts, page-aligned) as little-endian words
/// in place; `None` when they are not 4-byte aligned (never for page-locked
/// memory) or the host is big-endian (the caller converts into a copy then).
fn words_in_place(bytes: &[u8]) -> Option<&[u32]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    // Whole words only; refused (not shifted) when the start is not 4-byte aligned.
    bytemuck::try_cast_slice(&bytes[..bytes.len() / 4 * 4]).ok()
}

/// The little-endian words of device bytes, in host order (the byte-order fix of
/// every run that copies them).
fn words_of(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|chunk| u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
}

/// The length check of an encode: a pipeline built for `expected` bytes takes
/// texts of exactly that length.
pub fn check_encode_len(expected: usize, text: &[u8]) -> Result<(), PretokenizeError> {
    if text.len() != expected {
        return Err(PretokenizeError::new(format!(
            "Fix: this CudaPipeline was built for {expected} bytes but the text has {}; build one for {} bytes",
            text.len(),
            text.len()
        )));
    }
    Ok(())
}

/// The count check: the 4 little-endian bytes the compaction wrote, which for a text
/// of `text_len > 0` bytes must be 1 to `text_len` (every character starts at most
/// one piece, and byte 0 always starts one).
pub fn piece_count(count_bytes: &[u8], text_len: usize) -> Result<usize, PretokenizeError> {
    let count = words_of(count_bytes).next().map(|count| count as usize);
    match count {
        Some(count) if (1..=text_len).contains(&count) => Ok(count),
        _ => Err(PretokenizeError::new(format!(
            "Fix: internal: the compaction counted {count:?} pieces in {text_len} bytes (expected 1 to {text_len}); report this as a bug"
        ))),
    }
}

/// Sizes and grids of one pipeline run, from the text length and geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    text_len: usize,
    blocks: u32,
    compaction_workgroups: u32,
    table_bytes: usize,
}

impl Layout {
    fn new(programs: &Programs, text_len: usize, table_bytes: usize) -> Layout {
        let blocks = programs.geometry.blocks_for(text_len);
        Layout {
            text_len,
            blocks,
            compaction_workgroups: programs.geometry.compaction_workgroups(blocks),
            table_bytes,
        }
    }

    fn bytes(&self, role: BufferRole) -> u64 {
        role.bytes(self.text_len, self.blocks, self.table_bytes)
    }

    fn workgroups(&self, grid: Grid) -> u32 {
        match grid {
            Grid::PerByte => self.blocks,
            Grid::Compaction => self.compaction_workgroups,
        }
    }

    /// Bytes to allocate for `role`: exactly [`Layout::bytes`], because the
    /// programs read a buffer's length as its element count (a padded `text` would
    /// be a longer text). Only an empty buffer (a 0-byte pipeline, which never
    /// dispatches) gets 1 byte, so it still holds a valid handle.
    fn allocation_bytes(&self, role: BufferRole) -> u64 {
        match self.bytes(role) {
            0 => 1,
            bytes => bytes,
        }
    }
}

/// Binding index of `role` in `step` (the position of its buffer in the program).
fn binding_of(step: &Step, role: BufferRole) -> Result<u32, PretokenizeError> {
    step.bindings
        .iter()
        .position(|&bound| bound == role)
        .map(|index| index as u32)
        .ok_or_else(|| {
            PretokenizeError::new(format!(
                "Fix: internal: step {} reads back {} but does not bind it; report this as a bug",
                step.name,
                role.name()
            ))
        })
}

/// One run of the pipeline on the reference interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceRun {
    /// Piece start offsets, increasing.
    pub piece_starts: Vec<u32>,
    /// Host time of each step, in dispatch order.
    pub step_ns: [u64; DISPATCHES_PER_ENCODE],
}

/// Runs the programs on the reference interpreter, step by step as
/// [`STEPS`] describes, each step's outputs feeding the next exactly as the device
/// buffers do. An empty text has no pieces (and runs nothing: a grid of zero
/// workgroups is not a dispatch).
pub fn run_reference(programs: &Programs, text: &[u8]) -> Result<ReferenceRun, PretokenizeError> {
    check_text_len(text.len())?;
    let mut step_ns = [0u64; DISPATCHES_PER_ENCODE];
    if text.is_empty() {
        return Ok(ReferenceRun {
            piece_starts: Vec::new(),
            step_ns,
        });
    }
    let table = class_table()?.to_le_bytes();
    let layout = Layout::new(programs, text.len(), table.len());
    let mut buffers: [Vec<u8>; ROLES] = BufferRole::ALL.map(|role| match role {
        BufferRole::Text => text.to_vec(),
        BufferRole::ClassTable => table.clone(),
        _ => vec![0u8; layout.bytes(role) as usize],
    });
    for ((step, program), ns) in programs.steps().into_iter().zip(&mut step_ns) {
        let inputs: SmallVec<[&[u8]; 4]> = step
            .bindings
            .iter()
            .map(|&role| buffers[role as usize].as_slice())
            .collect();
        let config = DispatchConfig::linear(layout.workgroups(step.grid));
        let start = Instant::now();
        let outputs = reference::run(program, &inputs, &config)?;
        *ns = elapsed_ns(start);
        drop(inputs);
        let written = written_roles(step, program)?;
        if outputs.len() != written.len() {
            return Err(PretokenizeError::new(format!(
                "Fix: internal: {} returned {} outputs for {} written buffers; report this as a bug",
                program.display_name(),
                outputs.len(),
                written.len()
            )));
        }
        for (role, bytes) in written.into_iter().zip(outputs) {
            buffers[role as usize] = bytes;
        }
    }
    let count = piece_count(&buffers[BufferRole::PieceCount as usize], text.len())?;
    let piece_starts = words_of(&buffers[BufferRole::PieceStarts as usize][..4 * count]).collect();
    Ok(ReferenceRun {
        piece_starts,
        step_ns,
    })
}

/// The roles of the buffers `program` writes (every global buffer that is not
/// read-only, ascending binding: the order the reference interpreter returns them).
fn written_roles(
    step: &Step,
    program: &Program,
) -> Result<SmallVec<[BufferRole; 4]>, PretokenizeError> {
    let declared = program.global_buffers();
    let names_match = declared.len() == step.bindings.len()
        && declared
            .iter()
            .zip(step.bindings)
            .all(|(decl, role)| decl.name.as_ref() == role.name());
    if !names_match {
        return Err(PretokenizeError::new(format!(
            "Fix: internal: step {} binds {:?} but {} declares other buffers; report this as a bug",
            step.name,
            step.bindings,
            program.display_name()
        )));
    }
    Ok(declared
        .iter()
        .zip(step.bindings)
        .filter(|(decl, _)| decl.access != Access::ReadOnly)
        .map(|(_, &role)| role)
        .collect())
}

/// Timings of one encode on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeTiming {
    /// The whole encode, host clock: two dispatches (the first stages the text,
    /// the last stores the piece starts into host-mapped memory).
    pub wall_ns: u64,
    /// Each dispatch's timings, in dispatch order; the split's include the text's
    /// staging and copy to the device. `wall_ns` and `kernel_stamps_ns` (the
    /// kernel's own `%globaltimer` stamps) are always set; `event_window_ns` only by
    /// [`CudaPipeline::encode_timed`] (`None` otherwise). In the chained hot path
    /// ([`CudaPipeline::encode`]) each `wall_ns` runs from the step's submission
    /// to the end of its wait, so the steps' walls overlap.
    pub steps: [Timings; DISPATCHES_PER_ENCODE],
}

impl EncodeTiming {
    /// Device time of the kernels (the sum of the steps' `kernel_stamps_ns`).
    pub fn kernel_ns(&self) -> u64 {
        self.steps
            .iter()
            .fold(0u64, |sum, step| sum.saturating_add(step.kernel_stamps_ns))
    }

    /// Everything in the encode that is not a kernel running: `wall − Σ kernel`.
    /// It includes the driver calls, launch latency, the upload's and readback's
    /// copies and synchronize wake-ups.
    pub fn host_ns(&self) -> u64 {
        self.wall_ns.saturating_sub(self.kernel_ns())
    }
}

/// The host cost of one timed dispatch: `wall − kernel`.
pub fn dispatch_host_ns(step: &Timings) -> u64 {
    step.wall_ns.saturating_sub(step.kernel_stamps_ns)
}

/// Timings of one graph encode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphEncodeTiming {
    /// The whole encode, host clock: text into the graph's input slot, one replay
    /// (the piece starts are in host-mapped memory when it returns).
    pub wall_ns: u64,
    /// The replay (one graph launch and one synchronize); its `event_window_ns` is
    /// set only by [`CudaPipeline::encode_graph_timed`].
    pub replay: Timings,
}

/// The pipeline on a CUDA device for texts of one length: compiled kernels and
/// device buffers (the class table among them, uploaded once), made once, then
/// [`CudaPipeline::encode`] per text. Its buffers free themselves when it drops.
pub struct CudaPipeline {
    backend: CudaBackend,
    kernels: [Kernel; DISPATCHES_PER_ENCODE],
    /// Each step's dispatch configuration without readback (the graph's).
    configs: [DispatchConfig; DISPATCHES_PER_ENCODE],
    /// The same with the eager readback of each step ([`Step::readback`]).
    eager_configs: [DispatchConfig; DISPATCHES_PER_ENCODE],
    layout: Layout,
    /// Indexed by `BufferRole as usize`; `None` for the host-mapped role.
    buffers: [Option<DeviceBuffer>; ROLES],
    /// [`BufferRole::PieceStarts`]: host-mapped, room for every possible piece
    /// start; the compaction's stores land here directly.
    mapped_starts: DeviceBuffer,
    /// The piece starts in host order on a big-endian host (empty elsewhere: the
    /// mapped words are handed out in place).
    host_order: Vec<u32>,
    piece_count: usize,
    /// The whole encode as one CUDA graph, recorded on first use.
    graph: Option<EncodeGraph>,
}

/// The recorded graph of one encode and its staging slots.
struct EncodeGraph {
    graph: DispatchGraph,
    text: InputSlot,
    count: OutputSlot,
}

impl std::fmt::Debug for CudaPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPipeline")
            .field("text_len", &self.layout.text_len)
            .field("blocks", &self.layout.blocks)
            .field("kernels", &self.kernels)
            .finish()
    }
}

impl CudaPipeline {
    /// Compiles the programs, allocates every device and host buffer for texts of
    /// exactly `text_len` bytes and uploads the class table. A pipeline for 0 bytes
    /// is valid: its encodes dispatch nothing and give no pieces (an empty text has
    /// none), as on the reference interpreter and the CPU splitter.
    pub fn new(
        backend: &CudaBackend,
        programs: &Programs,
        text_len: usize,
    ) -> Result<Self, PretokenizeError> {
        check_text_len(text_len)?;
        let table = class_table()?.to_le_bytes();
        let layout = Layout::new(programs, text_len, table.len());
        let steps = programs.steps();
        let configs = steps.map(|(step, _)| {
            DispatchConfig::linear(layout.workgroups(step.grid)).with_readback(ReadbackPolicy::None)
        });
        let mut kernels = Vec::with_capacity(DISPATCHES_PER_ENCODE);
        for ((step, program), config) in steps.iter().zip(&configs) {
            written_roles(step, program)?;
            kernels.push(backend.compile(program, config)?);
        }
        let kernels: [Kernel; DISPATCHES_PER_ENCODE] = kernels.try_into().map_err(|_| {
            PretokenizeError::new("Fix: internal: wrong number of kernels; report this as a bug")
        })?;
        let mut eager_configs = configs.clone();
        for (((step, _), config), eager) in steps.iter().zip(&configs).zip(&mut eager_configs) {
            if step.readback == StepReadback::PieceCount {
                let count = ByteRange {
                    binding: binding_of(step, BufferRole::PieceCount)?,
                    offset: 0,
                    len: 4,
                };
                *eager = config
                    .clone()
                    .with_readback(ReadbackPolicy::Ranges(smallvec![count]));
            }
        }
        let mut mapped_starts =
            backend.host_mapped_buffer(layout.allocation_bytes(BufferRole::PieceStarts))?;
        if cfg!(target_endian = "little") && words_in_place(mapped_starts.mapped_bytes()?).is_none()
        {
            return Err(PretokenizeError::new(
                "Fix: internal: host-mapped memory is not 4-byte aligned; report this as a bug",
            ));
        }
        let mut buffers: [Option<DeviceBuffer>; ROLES] = std::array::from_fn(|_| None);
        for role in BufferRole::ALL {
            if !role.host_mapped() {
                // On error the buffers made so far drop here and free themselves.
                buffers[role as usize] = Some(backend.buffer(layout.allocation_bytes(role))?);
            }
        }
        let pipeline = CudaPipeline {
            backend: backend.clone(),
            kernels,
            configs,
            eager_configs,
            layout,
            buffers,
            mapped_starts,
            host_order: if cfg!(target_endian = "big") {
                Vec::with_capacity(text_len)
            } else {
                Vec::new()
            },
            piece_count: 0,
            graph: None,
        };
        // On error the pipeline drops here and frees its buffers.
        backend.upload(pipeline.device_buffer(BufferRole::ClassTable)?, &table)?;
        Ok(pipeline)
    }

    /// The buffer of a role that lives in device memory.
    fn device_buffer(&self, role: BufferRole) -> Result<&DeviceBuffer, PretokenizeError> {
        self.buffers[role as usize].as_ref().ok_or_else(|| {
            PretokenizeError::new(format!(
                "Fix: internal: {} is host-mapped, not in device memory; report this as a bug",
                role.name()
            ))
        })
    }

    /// The buffer of `role` as a binding of a recorded dispatch.
    fn graph_binding(&self, role: BufferRole) -> Result<Binding<'_>, PretokenizeError> {
        if role.host_mapped() {
            Ok(Binding::Buffer(&self.mapped_starts))
        } else {
            self.device_buffer(role).map(Binding::Buffer)
        }
    }

    /// The buffer of `role` as a binding of an eager dispatch: the text rides the
    /// split dispatch as a host binding (its copy to the device is enqueued on the
    /// dispatch's stream and waited for by the dispatch's one synchronize, not by a
    /// separate upload's).
    fn eager_binding<'a>(
        &'a self,
        role: BufferRole,
        text: &'a [u8],
    ) -> Result<Binding<'a>, PretokenizeError> {
        if role == BufferRole::Text {
            Ok(Binding::Host(text))
        } else {
            self.graph_binding(role)
        }
    }

    /// Hands out the piece starts the last encode's synchronize brought into the
    /// mapped memory: in place on little-endian hosts, converted into
    /// `host_order` on big-endian ones.
    fn take_piece_starts(&mut self, count: usize) -> Result<(), PretokenizeError> {
        if cfg!(target_endian = "big") {
            let bytes = self.mapped_starts_bytes()?;
            let words: Vec<u32> = words_of(&bytes[..4 * count]).collect();
            self.host_order = words;
        }
        self.piece_count = count;
        Ok(())
    }

    /// The host-mapped piece starts' bytes in place, after an encode's synchronize:
    /// beside the recorded graph when there is one (it holds the buffer's memory).
    fn mapped_starts_bytes(&mut self) -> Result<&[u8], PretokenizeError> {
        let bytes = match &self.graph {
            Some(encode) => self.mapped_starts.mapped_bytes_beside(&encode.graph),
            None => self.mapped_starts.mapped_bytes(),
        };
        Ok(bytes?)
    }

    /// The text length this pipeline was built for.
    pub fn text_len(&self) -> usize {
        self.layout.text_len
    }

    /// Workgroups of the per-byte dispatches.
    pub fn blocks(&self) -> u32 {
        self.layout.blocks
    }

    /// The compiled kernels, in dispatch order.
    pub fn kernels(&self) -> &[Kernel; DISPATCHES_PER_ENCODE] {
        &self.kernels
    }

    /// Piece starts of the last successful encode (empty before the first and
    /// after a failed one): a view of the host-mapped memory the compaction wrote
    /// (no copy), valid until the next encode (which needs `&mut self`, so it cannot
    /// start while the view lives).
    pub fn piece_starts(&mut self) -> &[u32] {
        if self.piece_count == 0 {
            return &[];
        }
        if cfg!(target_endian = "big") {
            return &self.host_order[..self.piece_count];
        }
        // Every encode that set `piece_count` has synchronised the stream that wrote
        // the mapped memory, and `&mut self` keeps the next one from starting.
        let count = self.piece_count;
        self.mapped_starts_bytes()
            .ok()
            .and_then(words_in_place)
            .and_then(|words| words.get(..count))
            .unwrap_or(&[])
    }

    /// Splits `text` (exactly [`CudaPipeline::text_len`] bytes): the two
    /// dispatches are submitted back to back, the compaction ordered after the
    /// split on the device ([`Dispatch::after`]; the split stages
    /// the text), and one blocking synchronize waits for both (the split's own
    /// then finds its stream idle). The result is in [`CudaPipeline::piece_starts`]
    /// until the next encode. This is the hot path: no device timing events, and
    /// submissions print no probe line; each step's `kernel_stamps_ns` is its kernel's own
    /// stamps, its `wall_ns` runs from its submission to the end of its wait. See
    /// [`CudaPipeline::encode_timed`].
    pub fn encode(&mut self, text: &[u8]) -> Result<EncodeTiming, PretokenizeError> {
        self.encode_chained(text)
    }

    /// The same split, one dispatch at a time (each waits for the one before on
    /// the host), with device timing events on every dispatch and a probe line
    /// each, so the steps also carry `event_window_ns` and disjoint `wall_ns`,
    /// `enqueue_ns` and `wait_ns`, and the probe's phase table sees every step.
    /// The events and the extra synchronize cost host time of their own, so time
    /// the hot path with [`CudaPipeline::encode`] and take device times and phases
    /// from here.
    pub fn encode_timed(&mut self, text: &[u8]) -> Result<EncodeTiming, PretokenizeError> {
        self.encode_stepwise(text)
    }

    /// [`CudaPipeline::encode`] as one CUDA graph: the upload, the two
    /// kernels and the count's readback (folded into the last kernel's epilogue)
    /// are recorded once, then every encode is one graph launch and one
    /// synchronize, nothing else: the compaction stored the piece starts into
    /// host-mapped memory, so no read sized by the count follows.
    pub fn encode_graph(&mut self, text: &[u8]) -> Result<GraphEncodeTiming, PretokenizeError> {
        self.encode_graph_with(text, false)
    }

    /// [`CudaPipeline::encode_graph`] with the replay's device window measured.
    pub fn encode_graph_timed(
        &mut self,
        text: &[u8],
    ) -> Result<GraphEncodeTiming, PretokenizeError> {
        self.encode_graph_with(text, true)
    }

    fn record_graph(&self) -> Result<EncodeGraph, PretokenizeError> {
        let layout = self.layout;
        let mut slots = None;
        let text_buffer = self.device_buffer(BufferRole::Text)?;
        let count_buffer = self.device_buffer(BufferRole::PieceCount)?;
        let mut step_bindings: SmallVec<[SmallVec<[Binding<'_>; 4]>; 3]> = SmallVec::new();
        for step in &STEPS {
            step_bindings.push(
                step.bindings
                    .iter()
                    .map(|&role| self.graph_binding(role))
                    .collect::<Result<_, _>>()?,
            );
        }
        let graph = self.backend.record(|rec| {
            let text = rec.upload(text_buffer, layout.text_len as u64)?;
            for ((bindings, kernel), config) in
                step_bindings.iter().zip(&self.kernels).zip(&self.configs)
            {
                rec.dispatch(Dispatch::new(kernel, bindings).config(config))?;
            }
            let count = rec.read_back(count_buffer, 0, 4)?;
            slots = Some((text, count));
            Ok(())
        })?;
        let (text, count) = slots.ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the encode graph recorded no slots; report this")
        })?;
        Ok(EncodeGraph { graph, text, count })
    }

    fn encode_graph_with(
        &mut self,
        text: &[u8],
        timed: bool,
    ) -> Result<GraphEncodeTiming, PretokenizeError> {
        if !self.begin_encode(text)? {
            return Ok(GraphEncodeTiming::default());
        }
        if self.graph.is_none() {
            self.graph = Some(self.record_graph()?);
        }
        let Some(encode) = self.graph.as_mut() else {
            return Err(PretokenizeError::new(
                "Fix: internal: the encode graph is missing; report this",
            ));
        };
        let start = Instant::now();
        encode.graph.input_mut(encode.text)?.copy_from_slice(text);
        let replay = if timed {
            encode.graph.replay_timed()?
        } else {
            encode.graph.replay()?
        };
        let count = piece_count(encode.graph.output(encode.count)?, self.layout.text_len)?;
        self.take_piece_starts(count)?;
        Ok(GraphEncodeTiming {
            wall_ns: elapsed_ns(start),
            replay,
        })
    }

    /// The start of every encode: the length check, the last result cleared;
    /// `false` for an empty text (no pieces, nothing to run).
    fn begin_encode(&mut self, text: &[u8]) -> Result<bool, PretokenizeError> {
        check_encode_len(self.layout.text_len, text)?;
        self.piece_count = 0;
        Ok(!text.is_empty())
    }

    /// The bindings of `step` for an eager run over `text`.
    fn eager_bindings<'a>(
        &'a self,
        step: &Step,
        text: &'a [u8],
    ) -> Result<SmallVec<[Binding<'a>; 4]>, PretokenizeError> {
        step.bindings
            .iter()
            .map(|&role| self.eager_binding(role, text))
            .collect()
    }

    /// The piece count of an eager run: the readback of the step that reads it.
    fn eager_count(
        &self,
        step: &Step,
        first_output: Option<&[u8]>,
        count: &mut Option<usize>,
    ) -> Result<(), PretokenizeError> {
        if step.readback == StepReadback::PieceCount {
            let bytes = first_output.unwrap_or(&[]);
            *count = Some(piece_count(bytes, self.layout.text_len)?);
        }
        Ok(())
    }

    /// Ends an eager run: the count some step read, the piece starts handed out.
    fn finish_eager(
        &mut self,
        count: Option<usize>,
        start: Instant,
        steps: [Timings; DISPATCHES_PER_ENCODE],
    ) -> Result<EncodeTiming, PretokenizeError> {
        let count = count.ok_or_else(|| {
            PretokenizeError::new(
                "Fix: internal: no step read the piece count; report this as a bug",
            )
        })?;
        self.take_piece_starts(count)?;
        Ok(EncodeTiming {
            wall_ns: elapsed_ns(start),
            steps,
        })
    }

    fn encode_stepwise(&mut self, text: &[u8]) -> Result<EncodeTiming, PretokenizeError> {
        if !self.begin_encode(text)? {
            return Ok(EncodeTiming::default());
        }
        let start = Instant::now();
        let mut steps = [Timings::default(); DISPATCHES_PER_ENCODE];
        let mut count = None;
        for (index, step) in STEPS.iter().enumerate() {
            let bindings = self.eager_bindings(step, text)?;
            let mut count_bytes = [0u8; 4];
            let mut outputs: SmallVec<[&mut [u8]; 1]> = SmallVec::new();
            if step.readback == StepReadback::PieceCount {
                outputs.push(&mut count_bytes);
            }
            let step_start = Instant::now();
            let request = Dispatch::new(&self.kernels[index], &bindings)
                .config(&self.eager_configs[index])
                .timing(Timing::EventWindow);
            let mut timing = self.backend.run_into(request, &mut outputs)?;
            drop(outputs);
            drop(bindings);
            if timing.wall_ns == 0 {
                timing.wall_ns = elapsed_ns(step_start);
            }
            steps[index] = timing;
            self.eager_count(step, Some(&count_bytes[..]), &mut count)?;
        }
        self.finish_eager(count, start, steps)
    }

    fn encode_chained(&mut self, text: &[u8]) -> Result<EncodeTiming, PretokenizeError> {
        if !self.begin_encode(text)? {
            return Ok(EncodeTiming::default());
        }
        let start = Instant::now();
        // Every step is submitted at once, each ordered after the one before on the
        // device; nothing waits until all are enqueued.
        let mut pending: SmallVec<[PendingDispatch; DISPATCHES_PER_ENCODE]> = SmallVec::new();
        for ((step, kernel), config) in STEPS.iter().zip(&self.kernels).zip(&self.eager_configs) {
            let bindings = self.eager_bindings(step, text)?;
            let request = Dispatch::new(kernel, &bindings).config(config);
            let submitted = self.backend.submit(request.after_last(&pending))?;
            pending.push(submitted);
        }
        // The last step's synchronize covers the whole chain; the earlier steps'
        // streams are idle by then, so their waits return at once.
        let mut steps = [Timings::default(); DISPATCHES_PER_ENCODE];
        let mut count = None;
        for (index, submitted) in pending.into_iter().enumerate().rev() {
            let done = submitted.wait()?;
            steps[index] = done.timings;
            self.eager_count(&STEPS[index], done.outputs.item(0), &mut count)?;
        }
        self.finish_eager(count, start, steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretokenize::programs::programs;

    /// Locks out a step description that drifts from its program: the real
    /// steps pass the binding check, and (negative control) a step that binds the
    /// buffers in another order is rejected with a `Fix:` error instead of feeding
    /// a program the wrong buffers.
    #[test]
    fn binding_check_accepts_the_steps_and_rejects_a_reordered_one() {
        let programs = programs();
        for (step, program) in programs.steps() {
            written_roles(step, program).expect("the real steps bind their programs' buffers");
        }
        let reordered = Step {
            bindings: &[
                BufferRole::BlockCounts,
                BufferRole::Marks,
                BufferRole::PieceStarts,
                BufferRole::PieceCount,
            ],
            ..STEPS[1]
        };
        let error = written_roles(&reordered, &programs.compact).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
    }

    /// Locks out padded device buffers: the programs take a buffer's length as its
    /// element count, so a 1-byte text in a 4-byte buffer was split as 4 bytes
    /// (seen on the H200: "the scan counted 2 pieces in 1 bytes"). Every role is
    /// allocated at exactly its size for every text length from 1 up; only the
    /// never-dispatched 0-byte pipeline rounds its empty buffers up to 1 byte.
    #[test]
    fn buffers_are_allocated_at_exactly_their_size() {
        let programs = programs();
        for text_len in [1usize, 2, 3, 4, 5, 255, 256, 257, 262_144] {
            let layout = Layout::new(&programs, text_len, 4);
            for role in BufferRole::ALL {
                assert_eq!(
                    layout.allocation_bytes(role),
                    layout.bytes(role),
                    "{role:?} at {text_len} bytes"
                );
            }
            assert_eq!(layout.allocation_bytes(BufferRole::Text), text_len as u64);
        }
        let empty = Layout::new(&programs, 0, 4);
        assert_eq!(empty.allocation_bytes(BufferRole::Text), 1);
    }

    /// Locks out a misread of the host-mapped piece starts: aligned little-endian
    /// bytes are viewed as exactly their words in place; (negative control) a
    /// view that starts one byte off is refused instead of shifting every word.
    #[test]
    fn mapped_words_are_viewed_in_place_only_when_aligned() {
        let words: Vec<u32> = vec![0x0403_0201, 7, u32::MAX];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        // A Vec<u32>'s buffer is 4-byte aligned; view its bytes.
        let backing: Vec<u32> = words_of(&bytes).collect();
        let aligned: &[u8] = bytemuck::cast_slice(&backing);
        if cfg!(target_endian = "little") {
            assert_eq!(words_in_place(aligned), Some(&words[..]));
            assert_eq!(words_in_place(&aligned[1..9]), None);
        } else {
            assert_eq!(words_in_place(aligned), None);
        }
    }

    /// Locks out a count check that lets a wrong count through: 0 pieces, more
    /// pieces than bytes and a short read are all errors; 1 and `text_len` are not.
    #[test]
    fn piece_count_rejects_impossible_counts() {
        assert_eq!(piece_count(&1u32.to_le_bytes(), 10), Ok(1));
        assert_eq!(piece_count(&10u32.to_le_bytes(), 10), Ok(10));
        for bytes in [
            &0u32.to_le_bytes()[..],
            &11u32.to_le_bytes()[..],
            &[1, 0][..],
        ] {
            let error = piece_count(bytes, 10).unwrap_err();
            assert!(error.message().starts_with("Fix:"), "{error}");
        }
        assert!(check_encode_len(4, b"abc").is_err());
        assert!(check_encode_len(3, b"abc").is_ok());
    }
}
