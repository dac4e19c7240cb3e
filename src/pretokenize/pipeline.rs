//! Running the five programs: on the CPU reference interpreter (the oracle, and
//! the fallback without a GPU) or on a CUDA device over resident buffers.
//!
//! The CUDA path is built for a tokenizer's hot loop (§0: launch + synchronize is
//! 8.5–9.8 µs on the raw driver, so the host cost per encode is counted in
//! synchronizes): every device buffer is allocated once in [`CudaPipeline::new`],
//! kernels are compiled once (dispatches through [`Kernel`] skip every cache
//! lookup), intermediate steps read nothing back, the scan step reads back only
//! the 4-byte piece count, and the compaction step reads back exactly the
//! `4 × count` bytes of piece starts into a buffer allocated once. Per encode:
//! one upload, five dispatches, six synchronizes in all, no allocation once warm.

use std::time::Instant;

use smallvec::smallvec;

use super::programs::Programs;
use super::{check_text_len, PretokenizeError};
use crate::backend::{Binding, CudaBackend, DispatchTiming, Kernel, ResidentBuffer};
use crate::config::{ByteRange, DispatchConfig, ReadbackPolicy};
use crate::graph::{DispatchGraph, InputSlot, OutputSlot};
use crate::ir::Program;
use crate::reference;

/// Number of dispatches per encode.
pub const DISPATCHES_PER_ENCODE: usize = 5;

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The bytes of `words`, for reading device output straight into them. The
/// device writes little-endian `u32`s; `encode` swaps them on a big-endian host
/// (no CUDA host is one; the swap compiles away elsewhere).
fn words_as_bytes_mut(words: &mut [u32]) -> &mut [u8] {
    let len = std::mem::size_of_val(words);
    // SAFETY: `u8` has alignment 1 and every byte pattern is a valid `u32`, so the
    // words' memory may be viewed as `len` bytes; the view reborrows `words`
    // mutably, so nothing else can touch them while it lives.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

fn words_of(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|chunk| u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
}

/// One run of the pipeline on the reference interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceRun {
    /// Piece start offsets, increasing.
    pub piece_starts: Vec<u32>,
    /// Host time of each step, in dispatch order.
    pub step_ns: [u64; DISPATCHES_PER_ENCODE],
}

/// Runs the five programs on the reference interpreter, each step's outputs
/// feeding the next exactly as the device buffers do. An empty text has no
/// pieces (and runs nothing: a grid of zero workgroups is not a dispatch).
pub fn run_reference(programs: &Programs, text: &[u8]) -> Result<ReferenceRun, PretokenizeError> {
    check_text_len(text.len())?;
    let mut step_ns = [0u64; DISPATCHES_PER_ENCODE];
    if text.is_empty() {
        return Ok(ReferenceRun {
            piece_starts: Vec::new(),
            step_ns,
        });
    }
    let n = text.len();
    let blocks = programs.geometry.blocks_for(n);
    let grid = DispatchConfig::linear(blocks);
    let run = |program: &Program, inputs: &[&[u8]], config: &DispatchConfig, ns: &mut u64| {
        let start = Instant::now();
        let outputs = reference::run(program, inputs, config);
        *ns = elapsed_ns(start);
        outputs
            .map_err(PretokenizeError::from)
            .and_then(|mut outputs| {
                outputs.pop().ok_or_else(|| {
                    PretokenizeError::new(format!(
                        "Fix: internal: {} returned no output; report this as a bug",
                        program.display_name()
                    ))
                })
            })
    };
    let zero_bytes = vec![0u8; n];
    let classes = run(
        &programs.classify,
        &[text, &zero_bytes],
        &grid,
        &mut step_ns[0],
    )?;
    let marks = run(
        &programs.mark,
        &[&classes, &zero_bytes],
        &grid,
        &mut step_ns[1],
    )?;
    let counts_zero = vec![0u8; 4 * blocks as usize];
    let block_counts = run(
        &programs.block_count,
        &[&marks, &counts_zero],
        &grid,
        &mut step_ns[2],
    )?;
    let offsets_zero = vec![0u8; 4 * (blocks as usize + 1)];
    let block_offsets = run(
        &programs.block_scan,
        &[&block_counts, &offsets_zero],
        &DispatchConfig::linear(1),
        &mut step_ns[3],
    )?;
    let count = words_of(&block_offsets).last().unwrap_or(0) as usize;
    let starts_zero = vec![0u8; 4 * n];
    let starts = run(
        &programs.compact,
        &[&marks, &block_offsets, &starts_zero],
        &grid,
        &mut step_ns[4],
    )?;
    let piece_starts = words_of(&starts).take(count.min(n)).collect();
    Ok(ReferenceRun {
        piece_starts,
        step_ns,
    })
}

/// Timings of one encode on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeTiming {
    /// The whole encode, host clock: upload, five dispatches (the last one reads
    /// the piece starts straight into the pipeline's `u32` buffer).
    pub wall_ns: u64,
    /// The text upload (`upload_resident`: staging copy, async copy, synchronize).
    pub upload_ns: u64,
    /// Each dispatch's timings, in dispatch order. `wall_ns` is always set; the
    /// device fields only by [`CudaPipeline::encode_timed`] (0 otherwise).
    pub steps: [DispatchTiming; DISPATCHES_PER_ENCODE],
}

impl EncodeTiming {
    /// Device time of the five kernels (each dispatch's inner event pair; 0 for an
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

/// Device buffers of one pipeline, allocated once.
#[derive(Clone, Copy, Debug)]
struct DeviceBuffers {
    text: ResidentBuffer,
    classes: ResidentBuffer,
    marks: ResidentBuffer,
    block_counts: ResidentBuffer,
    block_offsets: ResidentBuffer,
    piece_starts: ResidentBuffer,
}

impl DeviceBuffers {
    fn all(&self) -> [ResidentBuffer; 6] {
        [
            self.text,
            self.classes,
            self.marks,
            self.block_counts,
            self.block_offsets,
            self.piece_starts,
        ]
    }
}

/// The pipeline on a CUDA device for texts of one length: compiled kernels and
/// resident buffers, made once, then [`CudaPipeline::encode`] per text.
pub struct CudaPipeline {
    backend: CudaBackend,
    kernels: [Kernel; DISPATCHES_PER_ENCODE],
    text_len: usize,
    blocks: u32,
    buffers: DeviceBuffers,
    intermediate: DispatchConfig,
    scan: DispatchConfig,
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
    starts: OutputSlot,
}

/// Timings of one graph encode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphEncodeTiming {
    /// The whole encode, host clock: text into staging, one replay, copy-out.
    pub wall_ns: u64,
    /// The replay (one graph launch and one synchronize); its `device_window_ns` is
    /// set only by [`CudaPipeline::encode_graph_timed`].
    pub replay: DispatchTiming,
}

impl std::fmt::Debug for CudaPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPipeline")
            .field("text_len", &self.text_len)
            .field("blocks", &self.blocks)
            .field("kernels", &self.kernels)
            .finish()
    }
}

impl CudaPipeline {
    /// Compiles the five programs and allocates every device and host buffer for
    /// texts of exactly `text_len` bytes (at least 1).
    pub fn new(
        backend: &CudaBackend,
        programs: &Programs,
        text_len: usize,
    ) -> Result<Self, PretokenizeError> {
        check_text_len(text_len)?;
        if text_len == 0 {
            return Err(PretokenizeError::new(
                "Fix: a CudaPipeline needs texts of at least 1 byte; an empty text has no pieces, skip it",
            ));
        }
        let blocks = programs.geometry.blocks_for(text_len);
        let intermediate = DispatchConfig::linear(blocks).with_readback(ReadbackPolicy::None);
        let scan =
            DispatchConfig::linear(1).with_readback(ReadbackPolicy::Ranges(smallvec![ByteRange {
                binding: 1,
                offset: 4 * blocks as u64,
                len: 4,
            }]));
        let compile = |program: &Program| backend.compile(program, &intermediate);
        let kernels = [
            compile(&programs.classify)?,
            compile(&programs.mark)?,
            compile(&programs.block_count)?,
            compile(&programs.block_scan)?,
            compile(&programs.compact)?,
        ];
        let n = text_len as u64;
        let mut allocated: Vec<ResidentBuffer> = Vec::with_capacity(6);
        let sizes = [n, n, n, 4 * blocks as u64, 4 * (blocks as u64 + 1), 4 * n];
        for bytes in sizes {
            match backend.allocate_resident(bytes) {
                Ok(handle) => allocated.push(handle),
                Err(error) => {
                    for handle in allocated {
                        let _ = backend.free_resident(handle);
                    }
                    return Err(error.into());
                }
            }
        }
        let buffers = DeviceBuffers {
            text: allocated[0],
            classes: allocated[1],
            marks: allocated[2],
            block_counts: allocated[3],
            block_offsets: allocated[4],
            piece_starts: allocated[5],
        };
        Ok(CudaPipeline {
            backend: backend.clone(),
            kernels,
            text_len,
            blocks,
            buffers,
            intermediate,
            scan,
            count_bytes: [0; 4],
            piece_starts: vec![0; text_len],
            piece_count: 0,
            graph: None,
        })
    }

    /// The text length this pipeline was built for.
    pub fn text_len(&self) -> usize {
        self.text_len
    }

    /// Workgroups of the per-byte dispatches.
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// The compiled kernels, in dispatch order.
    pub fn kernels(&self) -> &[Kernel; DISPATCHES_PER_ENCODE] {
        &self.kernels
    }

    /// Piece starts of the last successful encode (empty before the first).
    pub fn piece_starts(&self) -> &[u32] {
        &self.piece_starts[..self.piece_count]
    }

    /// Splits `text` (exactly [`CudaPipeline::text_len`] bytes): upload, five
    /// dispatches, read back the piece starts. The result is in
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

    /// [`CudaPipeline::encode`] as one CUDA graph (§7): the upload, the five kernels
    /// and the readbacks are recorded once, then every encode is one graph launch and
    /// one synchronize instead of six. A graph cannot size a readback from a count it
    /// computes, so it reads back the whole piece-start buffer (4 bytes per text byte)
    /// and the host copies out the first `count`: more device time, far less host time.
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
        let b = self.buffers;
        let n = self.text_len as u64;
        let [classify, mark, block_count, block_scan, compact] = &self.kernels;
        let mut slots = None;
        let graph = self.backend.record(|rec| {
            let text = rec.upload(&b.text, n)?;
            rec.dispatch(classify, &[b.text, b.classes], &self.intermediate)?;
            rec.dispatch(mark, &[b.classes, b.marks], &self.intermediate)?;
            rec.dispatch(block_count, &[b.marks, b.block_counts], &self.intermediate)?;
            let scan = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
            rec.dispatch(block_scan, &[b.block_counts, b.block_offsets], &scan)?;
            rec.dispatch(
                compact,
                &[b.marks, b.block_offsets, b.piece_starts],
                &self.intermediate,
            )?;
            let count = rec.read_back(&b.block_offsets, 4 * self.blocks as u64, 4)?;
            let starts = rec.read_back(&b.piece_starts, 0, 4 * n)?;
            slots = Some((text, count, starts));
            Ok(())
        })?;
        let (text, count, starts) = slots.ok_or_else(|| {
            PretokenizeError::new("Fix: internal: the encode graph recorded no slots; report this")
        })?;
        Ok(EncodeGraph {
            graph,
            text,
            count,
            starts,
        })
    }

    fn encode_graph_with(
        &mut self,
        text: &[u8],
        timed: bool,
    ) -> Result<GraphEncodeTiming, PretokenizeError> {
        if text.len() != self.text_len {
            return Err(PretokenizeError::new(format!(
                "Fix: this CudaPipeline was built for {} bytes but the text has {}; build one for {} bytes",
                self.text_len,
                text.len(),
                text.len()
            )));
        }
        self.piece_count = 0;
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
        let count_bytes = encode.graph.output(encode.count)?;
        let count = u32::from_le_bytes([
            count_bytes[0],
            count_bytes[1],
            count_bytes[2],
            count_bytes[3],
        ]) as usize;
        if count == 0 || count > self.text_len {
            return Err(PretokenizeError::new(format!(
                "Fix: internal: the scan counted {count} pieces in {} bytes (expected 1 to {}); report this as a bug",
                self.text_len, self.text_len
            )));
        }
        let starts = encode.graph.output(encode.starts)?;
        words_as_bytes_mut(&mut self.piece_starts[..count]).copy_from_slice(&starts[..4 * count]);
        if cfg!(target_endian = "big") {
            for start in &mut self.piece_starts[..count] {
                *start = u32::from_le(*start);
            }
        }
        self.piece_count = count;
        Ok(GraphEncodeTiming {
            wall_ns: elapsed_ns(start),
            replay,
        })
    }

    fn encode_with(&mut self, text: &[u8], timed: bool) -> Result<EncodeTiming, PretokenizeError> {
        if text.len() != self.text_len {
            return Err(PretokenizeError::new(format!(
                "Fix: this CudaPipeline was built for {} bytes but the text has {}; build one for {} bytes",
                self.text_len,
                text.len(),
                text.len()
            )));
        }
        self.piece_count = 0;
        let start = Instant::now();
        let backend = &self.backend;
        let b = self.buffers;
        backend.upload_resident(&b.text, text)?;
        let upload_ns = elapsed_ns(start);
        let dispatch = |kernel: &Kernel,
                        bindings: &[Binding<'_>],
                        config: &DispatchConfig,
                        outputs: &mut [&mut [u8]]|
         -> Result<DispatchTiming, PretokenizeError> {
            let step_start = Instant::now();
            let mut timing = if timed {
                backend.dispatch_kernel_into_timed(kernel, bindings, config, outputs)?
            } else {
                backend.dispatch_kernel_into(kernel, bindings, config, outputs)?
            };
            if timing.wall_ns == 0 {
                timing.wall_ns = elapsed_ns(step_start);
            }
            Ok(timing)
        };
        let mut steps = [DispatchTiming::default(); DISPATCHES_PER_ENCODE];
        let [classify, mark, block_count, block_scan, compact] = &self.kernels;
        steps[0] = dispatch(
            classify,
            &[Binding::Resident(b.text), Binding::Resident(b.classes)],
            &self.intermediate,
            &mut [],
        )?;
        steps[1] = dispatch(
            mark,
            &[Binding::Resident(b.classes), Binding::Resident(b.marks)],
            &self.intermediate,
            &mut [],
        )?;
        steps[2] = dispatch(
            block_count,
            &[
                Binding::Resident(b.marks),
                Binding::Resident(b.block_counts),
            ],
            &self.intermediate,
            &mut [],
        )?;
        steps[3] = dispatch(
            block_scan,
            &[
                Binding::Resident(b.block_counts),
                Binding::Resident(b.block_offsets),
            ],
            &self.scan,
            &mut [&mut self.count_bytes],
        )?;
        let count = u32::from_le_bytes(self.count_bytes) as usize;
        if count == 0 || count > self.text_len {
            return Err(PretokenizeError::new(format!(
                "Fix: internal: the scan counted {count} pieces in {} bytes (expected 1 to {}); report this as a bug",
                self.text_len, self.text_len
            )));
        }
        let compact_config = self
            .intermediate
            .clone()
            .with_readback(ReadbackPolicy::Ranges(smallvec![ByteRange {
                binding: 2,
                offset: 0,
                len: 4 * count as u64,
            }]));
        steps[4] = dispatch(
            compact,
            &[
                Binding::Resident(b.marks),
                Binding::Resident(b.block_offsets),
                Binding::Resident(b.piece_starts),
            ],
            &compact_config,
            &mut [words_as_bytes_mut(&mut self.piece_starts[..count])],
        )?;
        if cfg!(target_endian = "big") {
            for start in &mut self.piece_starts[..count] {
                *start = u32::from_le(*start);
            }
        }
        self.piece_count = count;
        Ok(EncodeTiming {
            wall_ns: elapsed_ns(start),
            upload_ns,
            steps,
        })
    }
}

impl Drop for CudaPipeline {
    fn drop(&mut self) {
        for handle in self.buffers.all() {
            // Nothing useful to do with an error while dropping: a lost context
            // already released the memory.
            let _ = self.backend.free_resident(handle);
        }
    }
}
