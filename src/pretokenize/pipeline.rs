//! Running the three programs: on the CPU reference interpreter (the oracle, and
//! the fallback without a GPU) or on a CUDA device over resident buffers, eagerly
//! or as one CUDA graph.
//!
//! All three runs follow the one description of the pipeline in
//! [`programs::STEPS`](super::programs::STEPS): which program runs over which
//! buffers on which grid, and what the eager run reads back after it. The length
//! check ([`check_encode_len`]), the count check ([`piece_count`]) and the
//! byte-order fix ([`words_from_device`]) exist once and serve all three.
//!
//! The CUDA path is built for a tokenizer's hot loop (§0: launch + synchronize is
//! 8.5–9.8 µs on the raw driver, so the host cost per encode is counted in
//! synchronizes): every device buffer is allocated once in [`CudaPipeline::new`]
//! and the class table uploaded then, kernels are compiled once (dispatches
//! through [`Kernel`] skip every cache lookup), the split reads nothing back, the
//! scan reads back only the 4-byte piece count, and the compaction reads back
//! exactly the `4 × count` bytes of piece starts into a buffer allocated once.
//! Eager, per encode: three dispatches, three synchronizes (the text goes up as a
//! borrowed binding of the split dispatch, staged on its stream, so it costs no
//! synchronize of its own), no allocation once warm. As a graph: one replay (upload, three kernels, the count)
//! and one read of exactly the piece starts.
//!
//! Every use of the backend's API by this module (allocation, upload, dispatch,
//! recording, readback) is in [`CudaPipeline`]'s methods `new`, `encode_with`,
//! `record_graph` and `encode_graph_with`, so a port to another API touches only
//! those.

use std::time::Instant;

use smallvec::{smallvec, SmallVec};

use super::programs::{BufferRole, Grid, Programs, Step, StepReadback, STEPS};
use super::unicode::class_table;
use super::{check_text_len, PretokenizeError};
use crate::backend::{Binding, CudaBackend, DispatchTiming, Kernel, ResidentBuffer};
use crate::config::{ByteRange, DispatchConfig, ReadbackPolicy};
use crate::graph::{DispatchGraph, InputSlot, OutputSlot};
use crate::ir::{Access, Program};
use crate::reference;

/// Number of dispatches per encode.
pub const DISPATCHES_PER_ENCODE: usize = STEPS.len();

const ROLES: usize = BufferRole::ALL.len();

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The bytes of `words`, for reading device output straight into them; follow
/// with [`words_from_device`].
fn words_as_bytes_mut(words: &mut [u32]) -> &mut [u8] {
    let len = std::mem::size_of_val(words);
    // SAFETY: `u8` has alignment 1 and every byte pattern is a valid `u32`, so the
    // words' memory may be viewed as `len` bytes; the view reborrows `words`
    // mutably, so nothing else can touch them while it lives.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

/// Turns words whose bytes came from the device (little-endian) into host order:
/// a no-op on little-endian hosts (every CUDA host), a swap elsewhere.
pub fn words_from_device(words: &mut [u32]) {
    if cfg!(target_endian = "big") {
        for word in words {
            *word = u32::from_le(*word);
        }
    }
}

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

/// The count check: the 4 little-endian bytes the scan wrote, which for a text
/// of `text_len > 0` bytes must be 1 to `text_len` (every character starts at most
/// one piece, and byte 0 always starts one).
pub fn piece_count(count_bytes: &[u8], text_len: usize) -> Result<usize, PretokenizeError> {
    let count = words_of(count_bytes).next().map(|count| count as usize);
    match count {
        Some(count) if (1..=text_len).contains(&count) => Ok(count),
        _ => Err(PretokenizeError::new(format!(
            "Fix: internal: the scan counted {count:?} pieces in {text_len} bytes (expected 1 to {text_len}); report this as a bug"
        ))),
    }
}

/// Sizes and grids of one pipeline run, from the text length and geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    text_len: usize,
    blocks: u32,
    table_bytes: usize,
}

impl Layout {
    fn new(programs: &Programs, text_len: usize, table_bytes: usize) -> Layout {
        Layout {
            text_len,
            blocks: programs.geometry.blocks_for(text_len),
            table_bytes,
        }
    }

    fn bytes(&self, role: BufferRole) -> u64 {
        role.bytes(self.text_len, self.blocks, self.table_bytes)
    }

    fn workgroups(&self, grid: Grid) -> u32 {
        match grid {
            Grid::PerByte => self.blocks,
            Grid::Single => 1,
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

    /// Byte offset of the piece count in [`BufferRole::BlockOffsets`].
    fn count_offset(&self) -> u64 {
        4 * self.blocks as u64
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
    let offset = layout.count_offset() as usize;
    let count_bytes = buffers[BufferRole::BlockOffsets as usize]
        .get(offset..offset + 4)
        .unwrap_or(&[]);
    let count = piece_count(count_bytes, text.len())?;
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
    /// The whole encode, host clock: three dispatches (the first stages the text,
    /// the last reads the piece starts straight into the pipeline's `u32` buffer).
    pub wall_ns: u64,
    /// Each dispatch's timings, in dispatch order; the split's include the text's
    /// staging and copy to the device. `wall_ns` is always set; the device fields
    /// only by [`CudaPipeline::encode_timed`] (0 otherwise).
    pub steps: [DispatchTiming; DISPATCHES_PER_ENCODE],
}

impl EncodeTiming {
    /// Device time of the kernels (each dispatch's inner event pair; 0 for an
    /// untimed encode).
    pub fn kernel_ns(&self) -> u64 {
        self.steps
            .iter()
            .fold(0u64, |sum, step| sum.saturating_add(step.kernel_ns))
    }

    /// Everything in the encode that is not a kernel running: `wall − Σ kernel`.
    /// It includes the driver calls, launch latency, the upload's and readback's
    /// copies and synchronize wake-ups.
    pub fn host_ns(&self) -> u64 {
        self.wall_ns.saturating_sub(self.kernel_ns())
    }
}

/// The host cost of one timed dispatch: `wall − kernel`.
pub fn dispatch_host_ns(step: &DispatchTiming) -> u64 {
    step.wall_ns.saturating_sub(step.kernel_ns)
}

/// Timings of one graph encode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphEncodeTiming {
    /// The whole encode, host clock: text into staging, one replay, the read of
    /// exactly the piece starts.
    pub wall_ns: u64,
    /// The replay (one graph launch and one synchronize); its `device_window_ns` is
    /// set only by [`CudaPipeline::encode_graph_timed`].
    pub replay: DispatchTiming,
    /// The read of the `4 × count` bytes of piece starts after the replay.
    pub readback_ns: u64,
}

/// The pipeline on a CUDA device for texts of one length: compiled kernels and
/// resident buffers (the class table among them, uploaded once), made once, then
/// [`CudaPipeline::encode`] per text.
pub struct CudaPipeline {
    backend: CudaBackend,
    kernels: [Kernel; DISPATCHES_PER_ENCODE],
    /// Each step's dispatch configuration without readback.
    configs: [DispatchConfig; DISPATCHES_PER_ENCODE],
    layout: Layout,
    /// Indexed by `BufferRole as usize`.
    buffers: [ResidentBuffer; ROLES],
    count_bytes: [u8; 4],
    /// Room for every possible piece start; the device's bytes land here directly.
    piece_starts: Vec<u32>,
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
        let mut allocated: Vec<ResidentBuffer> = Vec::with_capacity(ROLES);
        for role in BufferRole::ALL {
            match backend.allocate_resident(layout.allocation_bytes(role)) {
                Ok(handle) => allocated.push(handle),
                Err(error) => {
                    for handle in allocated {
                        let _ = backend.free_resident(handle);
                    }
                    return Err(error.into());
                }
            }
        }
        let buffers: [ResidentBuffer; ROLES] = allocated.try_into().map_err(|_| {
            PretokenizeError::new("Fix: internal: wrong number of buffers; report this as a bug")
        })?;
        let pipeline = CudaPipeline {
            backend: backend.clone(),
            kernels,
            configs,
            layout,
            buffers,
            count_bytes: [0; 4],
            piece_starts: vec![0; text_len],
            piece_count: 0,
            graph: None,
        };
        // On error the pipeline drops here and frees its buffers.
        backend.upload_resident(&pipeline.buffer(BufferRole::ClassTable), &table)?;
        Ok(pipeline)
    }

    fn buffer(&self, role: BufferRole) -> ResidentBuffer {
        self.buffers[role as usize]
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
    /// after a failed one).
    pub fn piece_starts(&self) -> &[u32] {
        &self.piece_starts[..self.piece_count]
    }

    /// Splits `text` (exactly [`CudaPipeline::text_len`] bytes): three dispatches
    /// (the first stages the text), read back the piece starts. The result is in
    /// [`CudaPipeline::piece_starts`] until the next encode. This is the hot path:
    /// its dispatches record no device timing events, so the returned steps hold
    /// only host wall times (measured here); see [`CudaPipeline::encode_timed`].
    pub fn encode(&mut self, text: &[u8]) -> Result<EncodeTiming, PretokenizeError> {
        self.encode_with(text, false)
    }

    /// [`CudaPipeline::encode`] with device timing events on every dispatch, so the
    /// steps also carry `kernel_ns`, `device_window_ns`, `enqueue_ns` and
    /// `wait_ns`. The events cost host time of their own, so time the hot path
    /// with [`CudaPipeline::encode`] and take device times from here.
    pub fn encode_timed(&mut self, text: &[u8]) -> Result<EncodeTiming, PretokenizeError> {
        self.encode_with(text, true)
    }

    /// [`CudaPipeline::encode`] as one CUDA graph (§7): the upload, the three
    /// kernels and the count's readback are recorded once, then every encode is one
    /// graph launch and one synchronize, then one read of exactly the `4 × count`
    /// bytes of piece starts (a graph cannot size a readback from a count it
    /// computes, and reading the whole 4-bytes-per-text-byte buffer would cost more
    /// than the extra synchronize).
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
        let graph = self.backend.record(|rec| {
            let text = rec.upload(&self.buffer(BufferRole::Text), layout.text_len as u64)?;
            for ((step, kernel), config) in STEPS.iter().zip(&self.kernels).zip(&self.configs) {
                let bindings: SmallVec<[ResidentBuffer; 4]> = step
                    .bindings
                    .iter()
                    .map(|&role| self.buffer(role))
                    .collect();
                rec.dispatch(kernel, &bindings, config)?;
            }
            let count = rec.read_back(
                &self.buffer(BufferRole::BlockOffsets),
                layout.count_offset(),
                4,
            )?;
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
        check_encode_len(self.layout.text_len, text)?;
        self.piece_count = 0;
        if text.is_empty() {
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
        let read_start = Instant::now();
        let starts = self.buffers[BufferRole::PieceStarts as usize];
        self.backend
            .read_resident_into(&starts, words_as_bytes_mut(&mut self.piece_starts[..count]))?;
        words_from_device(&mut self.piece_starts[..count]);
        let readback_ns = elapsed_ns(read_start);
        self.piece_count = count;
        Ok(GraphEncodeTiming {
            wall_ns: elapsed_ns(start),
            replay,
            readback_ns,
        })
    }

    fn encode_with(&mut self, text: &[u8], timed: bool) -> Result<EncodeTiming, PretokenizeError> {
        check_encode_len(self.layout.text_len, text)?;
        self.piece_count = 0;
        if text.is_empty() {
            return Ok(EncodeTiming::default());
        }
        let start = Instant::now();
        let mut steps = [DispatchTiming::default(); DISPATCHES_PER_ENCODE];
        let mut count = 0usize;
        for (index, step) in STEPS.iter().enumerate() {
            let bindings: SmallVec<[Binding<'_>; 4]> = step
                .bindings
                .iter()
                .map(|&role| match role {
                    // The text rides the split dispatch as a borrowed binding: its copy
                    // to the device is enqueued on the dispatch's stream and waited for
                    // by the dispatch's one synchronize, not by a separate upload's.
                    BufferRole::Text => Binding::Borrowed(text),
                    _ => Binding::Resident(self.buffers[role as usize]),
                })
                .collect();
            let (range, output): (Option<ByteRange>, &mut [u8]) = match step.readback {
                StepReadback::Nothing => (None, &mut []),
                StepReadback::PieceCount => (
                    Some(ByteRange {
                        binding: binding_of(step, BufferRole::BlockOffsets)?,
                        offset: self.layout.count_offset(),
                        len: 4,
                    }),
                    &mut self.count_bytes,
                ),
                StepReadback::PieceStarts if count == 0 => {
                    return Err(PretokenizeError::new(format!(
                        "Fix: internal: step {} reads the piece starts before any step read the count; report this as a bug",
                        step.name
                    )));
                }
                StepReadback::PieceStarts => (
                    Some(ByteRange {
                        binding: binding_of(step, BufferRole::PieceStarts)?,
                        offset: 0,
                        len: 4 * count as u64,
                    }),
                    words_as_bytes_mut(&mut self.piece_starts[..count]),
                ),
            };
            let config = match range {
                None => self.configs[index].clone(),
                Some(range) => self.configs[index]
                    .clone()
                    .with_readback(ReadbackPolicy::Ranges(smallvec![range])),
            };
            let kernel = &self.kernels[index];
            let step_start = Instant::now();
            let mut outputs: SmallVec<[&mut [u8]; 1]> = SmallVec::new();
            if range.is_some() {
                outputs.push(output);
            }
            let mut timing = if timed {
                self.backend
                    .dispatch_kernel_into_timed(kernel, &bindings, &config, &mut outputs)?
            } else {
                self.backend
                    .dispatch_kernel_into(kernel, &bindings, &config, &mut outputs)?
            };
            drop(outputs);
            if timing.wall_ns == 0 {
                timing.wall_ns = elapsed_ns(step_start);
            }
            steps[index] = timing;
            match step.readback {
                StepReadback::Nothing => {}
                StepReadback::PieceCount => {
                    count = piece_count(&self.count_bytes, self.layout.text_len)?;
                }
                StepReadback::PieceStarts => {
                    words_from_device(&mut self.piece_starts[..count]);
                }
            }
        }
        self.piece_count = count;
        Ok(EncodeTiming {
            wall_ns: elapsed_ns(start),
            steps,
        })
    }
}

impl Drop for CudaPipeline {
    fn drop(&mut self) {
        for handle in self.buffers {
            // Nothing useful to do with an error while dropping: a lost context
            // already released the memory.
            let _ = self.backend.free_resident(handle);
        }
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
            bindings: &[BufferRole::BlockOffsets, BufferRole::BlockCounts],
            ..STEPS[1]
        };
        let error = written_roles(&reordered, &programs.block_scan).unwrap_err();
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
