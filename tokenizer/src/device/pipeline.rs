//! Running the encode's kernel steps (`stage`, the split's, the BPE steps:
//! [`Programs`]) over batches of documents: buffers grown by powers of two and
//! reused, batches cut into chunks that fit, chunks submitted so that one
//! is staged while others compute and earlier ones' ids are handed out, on a
//! CUDA device or on the reference interpreter through the same calls.
//!
//! # Text up, ids down
//!
//! On CUDA the host writes a chunk straight into host-mapped pinned memory (the
//! documents gathered on the [copy pool](super::host_copy): ordinary `&str`s
//! copy at 7–12 GB/s from pageable memory by DMA, measured on the H200 host,
//! but a parallel gather into pinned memory runs at memory speed), the `stage`
//! kernel pulls it into device memory (from [`TEXT_COPY_ENGINE_FROM`], 512 KiB,
//! the text is gathered into pinned memory and goes up by DMA instead, and
//! `stage` copies device memory), the split and the merges run there, and
//! `compact` writes each document's first id index (and the total) straight
//! back into host-mapped memory. The ids themselves go the same way in chunks
//! below [`COPY_ENGINE_FROM`] (1 MiB): no DMA copy and no read of a size
//! the host must learn first. From 1 MiB `compact` stores them into device
//! memory, and once the chunk is done the host, having read the total, has the
//! copy engine bring exactly that many into the slot's host-mapped memory
//! ([`AnyBackend::copy`]): a kernel storing 34 MB of ids across PCIe held SMs
//! that the other chunks' steps needed (the constant's docs give the
//! measurement). The host then hands each document its ids from that memory,
//! again on the pool. A graph encode uploads the same buffers from the graph's
//! pinned input slots instead of the `stage` kernel.
//!
//! # Why the host's work overlaps the device's
//!
//! On the H200 (2026-12-02) a 64 MiB cl100k batch of 7,689 documents (four
//! 16 MiB chunks) took 26–35 ms, 1.9–2.6 GB/s, against about 5 ms of kernels
//! per chunk: the calling thread gathered chunk N+1 (1.1–4.0 ms), then waited
//! for chunk N and handed out its ids (0.9–3.8 ms), with two chunks on the
//! device at most, so the host's copies, not the kernels, set the pace and the
//! device idled between chunks. [`DeviceEncoder::encode_batch_into`] now:
//!
//! - gathers each chunk into its slot *before* asking for room on the device,
//!   while the chunks already there compute, and submits it as soon as there
//!   is room;
//! - waits for the oldest chunk when there is none, gives its room back at
//!   once, and runs its hand-out asynchronously on a pool of two threads of
//!   its own (not the copy pool, where it queued behind the next chunk's
//!   gather: `hand_out_pool`), so the calling thread goes on staging the
//!   next chunk while the device computes (at most two hand-outs run at once
//!   per encode: each holds its chunk's buffers);
//! - keeps up to [`CHUNKS_IN_FLIGHT`] (4) chunks on the device, since a
//!   backend now takes 32 pending dispatches.
//!
//! A batch then costs about the first chunk's gather, the kernels of every
//! chunk, and the last chunk's hand-out, where the host's copies keep up with
//! the device. The `gpu_encode` bench prints the copies alone at the batch's
//! sizes beside the pipeline.
//!
//! # One chunk hands out on the calling thread
//!
//! A batch of one chunk (any batch within [`ChunkLimits`], 12 MiB by default,
//! so every `Tokenizer` device encode of one text up to that size, which goes
//! through [`DeviceEncoder::encode_batch_into`]) has nothing to overlap its
//! hand-out with, so it runs on the calling thread, as
//! [`PendingEncode::wait_into`] always did; only a batch of several chunks
//! hands out on the hand-out pool. A pool's hand-off (waking a worker, then waiting
//! for it) had cost the host more than the encode's own work: against the
//! stand-in driver (`scripts/host-path --tokenizer`, 2-core build machine,
//! 2026-12-02), 8.0–17.5 µs per 1 KiB encode with it and 3.3–3.4 µs without
//! (`submit_bytes` and `wait_into`: 2.8–3.0), 18.8–48 µs and 13.9–14.3 µs per
//! 256 KiB; callgrind counts 35,771–39,353 and 32,678–33,360 instructions
//! per 1 KiB encode.
//!
//! The gather (the caller's texts into pinned memory) never hands a chunk to
//! the pool: the calling thread stages it, and spreads the copy over the
//! pool's workers only from [`host_copy::PARALLEL_COPY_BYTES`] (1 MiB) up,
//! where a parallel copy pays.
//!
//! # Two shapes of the split
//!
//! Chunks of at least [`BulkSplit::from_bytes`](super::programs::BulkSplit)
//! bytes (1 MiB by default) run the split in larger blocks
//! ([`Geometry::bulk_split`]: 8 KiB instead of 1 KiB), the other chunks at
//! [`Geometry::split`]; the encoder compiles both sets of steps once (the
//! steps other than the split's are the same programs, which the backend's
//! caches compile once), and a slot's buffers have room for either, since a
//! slot serves every chunk up to its capacity. `BulkSplit` says why.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Instant;

use vyre_cuda::backend::host_cache::demote_from_core_caches;
use vyre_cuda::backend::{
    AnyBackend, AnyGraph, BackendError, Binding, DeviceBuffer, Dispatch, Kernel, PendingDispatch,
    PinnedBuffer, Timings, MAX_PENDING,
};
use vyre_cuda::graph::{InputSlot, StepId};
use vyre_cuda::ir::Literal;
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

use super::batch_ids::{BatchIds, Part};
use super::fused::{
    resident_program, short_program, ShortProgram, Spread, DEFAULT_SHORT_TEXT_BYTES,
    DOCUMENTS_SCALAR, RESIDENT_TEXT_BYTES, SHORT_TEXT_BYTES, TEXT_LEN_SCALAR,
};
use super::hand_out_helpers::{self, Helpers};
use super::host_copy;
use super::programs::{
    blocks, param, Geometry, Programs, Role, DEVICE_COMPACT_WORKGROUPS, DEVICE_STAGE_WORKGROUPS,
    MAX_KERNEL_STEPS,
};
use super::text_ready::{self, ReadyFlags};
use super::vocabulary::DeviceVocabulary;
use crate::error::{ErrorKind, TokenizerError};
use crate::pretokenize::batch::cutting_table_bytes;
use crate::pretokenize::pattern::Pattern;
use crate::pretokenize::MAX_TEXT_BYTES;
use crate::vocab::Vocabulary;
use crate::Tokenizer;

const ROLES: usize = Role::ALL.len();

/// Default most text bytes per chunk: 12 MiB, so a 64 MiB batch is six chunks
/// (the last of 4 MiB), four of them (48 MiB, about 6,000 of the bulk split's
/// blocks) on the device at once while the next is staged and earlier ones are
/// handed out. A chunk takes buffers of the next power of two (16 MiB). At
/// most [`MAX_TEXT_BYTES`] (256 MiB), the split's limit.
///
/// Why 12: on 2026-12-05 (H200, the 64 MiB cl100k batch into a reused
/// [`BatchIds`], the bench's rotated rounds, after the look-backs got cheaper)
/// 12 MiB chunks had a lower median than 8 MiB in all seven runs of three
/// builds, and the lowest of the sizes swept in six (16 MiB's was lower once):
/// 6.38 and 6.39 ms (10.5 GB/s) on the landed build's two runs, against 6.80
/// and 7.12 for 8 MiB, 6.73 and 6.72 for 16, 6.95 and 7.17 for 6 and 8.08 and
/// 8.29 for 4 (minimums 6.20 and 6.25 against 6.32 and 6.68 for 8 MiB). Fewer chunks pay fewer fixed costs (a ticket counter, look-backs
/// and hand-outs each), and four of them still leave a chunk being staged.
///
/// Why not 16 MiB, in the nineteenth session: a batch costs about the first
/// chunk's gather, the device's work and the last chunks' hand-outs (the
/// bench's per-chunk timeline, H200, 2026-12-03: four 16 MiB chunks all done
/// on the device by 8.74 ms, their last hand-outs until 10.6 ms), and both
/// ends halve with the chunk. In the `gpu_encode` bench's rows of the same runs (a 64 MiB cl100k
/// batch into new vectors, seven runs over the nineteenth session, before and
/// after the copy engine took the text and ids) chunks of 8 MiB took 10.59,
/// 10.67, 11.43, 11.91, 12.09 and 14.47 ms where 16 MiB took 12.79, 13.09,
/// 15.26, 13.44, 14.44 and 14.77 ms; in one run 14.02 against 13.42. With 8 MiB
/// the default, the next run gave 11.27 ms (5.96 GB/s; `encode_batch_into`
/// 9.60 ms) against 12.96 ms for 16 MiB chunks, the last of its nine chunks
/// handed out 0.9 ms after the device's last step.
///
/// Tried and not kept (H200, 2026-12-03, one run, `encode_batch_into`, nine
/// rotated rounds, median): chunks that take the device one after another (a
/// chunk's first computing step named the previous chunk's last step as its
/// predecessor, so each chunk's ids could be handed out while the next
/// computed) took 11.55 ms against 9.72 ms for chunks sharing the device, as
/// they do: the batch mixes prose, code and CJK, and the other chunks' steps
/// fill the SMs that a chunk's `merge` leaves idle while its longest pieces
/// finish (in order, `merge` took 380–400 µs of an 8 MiB chunk's 1.05 ms).
/// Nor did a ramp pay (the first chunk a quarter of the others and each next
/// one twice the one before; the last ones halving again): 10.23 ms sharing
/// the device against 9.72, 10.91 in order. The first chunk's staging fell
/// from 0.33 to 0.13 ms, but twelve chunks pay more fixed costs than nine.
/// Nor, on 2026-12-04 (one call each, alternating), a ramp at the end only
/// (each chunk at most half of what remains, at least 2 MiB: eleven chunks):
/// 8.58 and 8.20 ms into vectors against 8.15 and 8.03, and 7.85 ms into a
/// reused [`BatchIds`] against 7.46–7.63 for the default; nor a first chunk of
/// 2 MiB (the device starts 0.3 ms sooner): 7.93 ms into a `BatchIds`. Nor
/// stream priorities (each chunk's steps on a higher priority than the next
/// chunk's, so that chunks finish in order while the younger ones fill idle
/// multiprocessors): 7.88 and 8.20 ms into vectors against 8.15 and 8.03, 7.55
/// and 7.61 into a `BatchIds` against 7.42 and 7.64; the chunks' steps finished
/// in the same order either way. Nor, on 2026-12-04 (a 64 MiB batch into a
/// reused `BatchIds`, builds alternating in the same calls): chunks of even
/// size (as many as the byte limit needs, each about the batch's bytes over
/// their count, so no 30 KB last chunk): 7.46, 7.44 and 7.60 ms against 7.27,
/// 7.29 and 7.17; a first chunk of half the limit: 7.45 and 7.96 ms (and one
/// run of 9.70) against 7.29, 7.38 and 8.73 — its gather ended no sooner (0.21
/// against 0.20 ms: waking the copy pool, not copying, sets it); and the last,
/// 30 KB chunk step by step instead of as the resident-grid kernel beside the
/// chunks still computing: medians of fifteen alternating encodes 7.50 against
/// 7.74 ms in one run, 7.71 against 7.67 in the next.
pub const CHUNK_TEXT_BYTES: u64 = 12 << 20;

/// Default most documents per chunk.
pub const CHUNK_DOCUMENTS: u64 = 1 << 20;

/// Chunks on the device at once per encoder (or per backend, for the encoders
/// a `Tokenizer` shares on one): submitted and not yet waited for. Each is one
/// pending dispatch per kernel step (at most [`MAX_KERNEL_STEPS`], 7; each
/// wait hands over its step's timings), and a backend takes at most
/// `MAX_PENDING` (32) pending dispatches: 4. With the chunk being staged
/// and the ones whose ids are being handed out, that keeps the device fed
/// while the host copies.
///
/// More would not pay: with a backend built for 64 pending dispatches, a
/// 64 MiB cl100k batch into a reused [`BatchIds`] took 8.00 ms with six chunks
/// in flight and 8.05 ms with eight (and 32 hardware queues,
/// `CUDA_DEVICE_MAX_CONNECTIONS`, instead of the default 8), against 7.67 and
/// 7.60 ms with four in the same call (H200, 2026-12-04): four 8 MiB chunks
/// already fill the device, and more only stretch each chunk's kernels. Nor
/// fewer (later the same day, alternating in one call): three took 7.78, 7.52
/// and 7.57 ms and two 8.08, 8.03 and 8.35 against 7.74, 7.61 and 7.72 with
/// four.
pub const CHUNKS_IN_FLIGHT: usize = MAX_PENDING / MAX_KERNEL_STEPS;

/// Who may put a chunk on a backend: at most [`CHUNKS_IN_FLIGHT`] at once. A
/// thread holding none waits for room; a thread that already holds one never
/// waits (it could wait for a thread waiting for it): it finishes its own
/// first, or is told to.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    /// The thread that submitted each chunk now on the device.
    holders: Mutex<Vec<ThreadId>>,
    finished: Condvar,
}

impl Admission {
    /// Room for one more chunk: `Ok(true)` when taken; `Ok(false)` when there is
    /// none and this thread holds some (it must finish one of its own first);
    /// a thread that holds none waits.
    fn admit(&self) -> Result<bool, TokenizerError> {
        let me = std::thread::current().id();
        let mut holders = self
            .holders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while holders.len() >= CHUNKS_IN_FLIGHT {
            if holders.contains(&me) {
                return Ok(false);
            }
            holders = self
                .finished
                .wait(holders)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        holders.push(me);
        Ok(true)
    }

    /// One chunk left the device (submitted by any thread).
    fn release(&self) {
        let me = std::thread::current().id();
        let mut holders = self
            .holders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = holders.iter().position(|&holder| holder == me).unwrap_or(0);
        if index < holders.len() {
            holders.swap_remove(index);
        }
        self.finished.notify_all();
    }
}

static NO_READBACK: ReadbackPolicy = ReadbackPolicy::None;

pub(super) fn backend_error(what: &str, error: BackendError) -> TokenizerError {
    TokenizerError::new(
        ErrorKind::Backend,
        format!("Fix: the device encoder failed while {what}: {error}"),
    )
    .with_source(error)
}

pub(super) fn internal(what: String) -> TokenizerError {
    TokenizerError::new(
        ErrorKind::Backend,
        format!("Fix: internal: {what}; report this as a bug"),
    )
}

/// How big one chunk may be: a batch is cut into chunks of whole documents, each
/// at most this many bytes and documents (a document larger than the byte limit
/// is a chunk of its own); and up to which sizes a chunk runs as one dispatch:
/// the short-text kernel in one workgroup, or the same steps on a resident grid
/// ([`fused`](super::fused)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLimits {
    /// Most text bytes of a chunk.
    pub text_bytes: u64,
    /// Most documents of a chunk.
    pub documents: u64,
    /// A chunk of at most this many text bytes runs every step in one
    /// workgroup, in one dispatch (default [`DEFAULT_SHORT_TEXT_BYTES`]; at most
    /// [`SHORT_TEXT_BYTES`]; 0: none does).
    pub short_text_bytes: u64,
    /// A larger chunk of at most this many text bytes runs every step in one
    /// cooperative dispatch on a grid of resident workgroups, a grid sync
    /// between steps (default [`RESIDENT_TEXT_BYTES`]; 0: none does; a device
    /// without cooperative launch runs them step by step).
    pub resident_text_bytes: u64,
}

impl Default for ChunkLimits {
    fn default() -> Self {
        ChunkLimits {
            text_bytes: CHUNK_TEXT_BYTES,
            documents: CHUNK_DOCUMENTS,
            short_text_bytes: DEFAULT_SHORT_TEXT_BYTES,
            resident_text_bytes: RESIDENT_TEXT_BYTES,
        }
    }
}

/// What the device counted while encoding a chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeCounts {
    /// Pieces that took the merge loop (the rest were whole tokens).
    pub merged_pieces: u32,
    /// Chunks of long pieces.
    pub chunks: u32,
    /// Pieces longer than a chunk.
    pub long_pieces: u32,
    /// Chunk boundaries whose tokens were not compatible (each then repaired).
    pub failed_boundaries: u32,
    /// Long pieces merged by the serial path.
    pub serial_pieces: u32,
    /// Pieces the split found.
    pub pieces: u32,
}

impl EncodeCounts {
    fn of(params: &[u32], pieces: u32) -> EncodeCounts {
        let at = |index: u32| params.get(index as usize).copied().unwrap_or(0);
        EncodeCounts {
            pieces,
            merged_pieces: at(param::MERGE_COUNT),
            chunks: at(param::CHUNK_COUNT),
            long_pieces: at(param::LONG_COUNT),
            failed_boundaries: at(param::FAILED_BOUNDARIES),
            serial_pieces: at(param::SERIAL_PIECES),
        }
    }
}

/// One kernel step's timings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTimings {
    /// The step's name ([`KernelStep::name`](super::programs::KernelStep::name); `short` for the short-text kernel).
    pub name: &'static str,
    /// Its dispatch's timings (`kernel_stamps_ns` is the kernel's own device
    /// time).
    pub timings: Timings,
}

/// Timings of one chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkTimings {
    /// From staging the text to the ids in the caller's hands, host clock.
    pub wall_ns: u64,
    /// Host time staging the chunk (the gather) and submitting its steps.
    pub submit_ns: u64,
    /// The part of `submit_ns` before the first submission: laying the chunk
    /// out, taking a slot and gathering the text into it.
    pub staged_ns: u64,
    /// The part of `staged_ns` that wrote the chunk's layout and gathered its
    /// text into the slot's staging (shared with the hand-out helpers' crew
    /// where the chunk has it and the crew is awake); the rest of the staging
    /// is the slot and its graph. A chunk whose text is fed to its running
    /// resident kernel ([`DeviceEncoder::with_text_fed`]) gathers it after
    /// `staged_ns`, during the replay: that gather is counted here too, so
    /// this can exceed `staged_ns`.
    pub gathered_ns: u64,
    /// Host time handing each document its ids after the wait (with the copy
    /// of the ids to the host, `copy_ns`, where the chunk takes one).
    pub scatter_ns: u64,
    /// Host time of the ids' copy from device memory into host memory at the
    /// start of the hand-out (chunks from [`COPY_ENGINE_FROM`] on CUDA; 0
    /// for the others).
    pub copy_ns: u64,
    /// From staging the text until its steps were found done, host clock.
    pub ready_ns: u64,
    /// When staging began, from the start of the
    /// [`DeviceEncoder::encode_batch_into`] (or
    /// [`DeviceEncoder::encode_batch_ids`]) call that ran the chunk (0 for a
    /// chunk submitted alone): with `submit_ns`, `ready_ns` and `wall_ns`, the
    /// batch's timeline.
    pub began_ns: u64,
    /// Each kernel step's timings, in dispatch order
    /// ([`DeviceEncoder::step_names`], or `short` or `resident` alone for a
    /// chunk that runs a fused kernel: [`DeviceEncoder::runs_short`],
    /// [`DeviceEncoder::runs_resident`]; empty for an empty chunk).
    pub steps: Vec<StepTimings>,
    /// Whether the chunk replayed the fused kernel's graph that its slot keeps
    /// ([`DeviceEncoder::with_fused_graphs`]) instead of submitting a
    /// dispatch.
    pub replayed: bool,
    /// What the device counted, when asked for ([`DeviceEncoder::encode_counted`]:
    /// one small read after the wait).
    pub counts: Option<EncodeCounts>,
    /// A fused kernel's steps by the kernel's own clock, read with the counts
    /// (empty where the chunk ran a dispatch per step, and where no counts
    /// were asked for).
    pub step_clocks: Vec<StepClock>,
}

/// Where one step of a fused kernel (the short-text or the resident-grid
/// kernel, one dispatch for every step) ended, by the kernel's own clock: the
/// one dispatch's timings cannot say how its time divides between the steps.
/// Workgroup 0 keeps the clock after the barrier or grid sync that ends each
/// step, so the step took from the end before it (or the kernel's start) to
/// this one; a resident grid's last step ends with workgroup 0's own end, and
/// the kernel's last workgroup may end later (its `kernel_stamps_ns` says when).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepClock {
    /// The step's name ([`KernelStep::name`](super::programs::KernelStep::name)).
    pub name: &'static str,
    /// The clock at the step's end since the kernel's first thread read it:
    /// nanoseconds on CUDA (`%globaltimer`, in 32 ns ticks on an H200), the
    /// reference interpreter's units of work on the reference backend.
    pub end: u64,
}

impl ChunkTimings {
    /// Device time of the kernels: the sum of the steps' `kernel_stamps_ns`.
    pub fn kernel_ns(&self) -> u64 {
        self.steps.iter().fold(0, |sum, step| {
            sum.saturating_add(step.timings.kernel_stamps_ns)
        })
    }

    /// Where the chunk's wall time went, in µs, as the example and the bench
    /// print it: `wall W = host H (staging and submitting S, of it staging G;
    /// handing out O) + kernels K (`[`kernel_line`](Self::kernel_line)`) +
    /// launches, gaps and the wait R; the dispatches enqueued in E µs and
    /// waited D µs`. The host's share is its own work (`submit_ns` and
    /// `scatter_ns`), the kernels' their own stamps, and the rest whatever
    /// neither covers: the launches, the gaps between dependent steps, the
    /// wait's wake-up and (with [`DeviceEncoder::encode_counted`]) the read of
    /// the counts. A cooperative launch (the resident grid) returned on the
    /// H200 only once its kernel had ended (256 KiB, 2026-12-05: a submission
    /// of 127.7 µs in an encode of 142.2 whose kernel took 79.2), so there the
    /// kernel's time is inside the submission's and the rest comes out as
    /// nothing; the dispatches' own clocks (enqueued, waited) say what the
    /// stream did besides the kernel. A chunk that replayed its slot's graph
    /// says `its graph launched in E µs and waited D µs` instead.
    pub fn wall_line(&self) -> String {
        let (wall, host, kernels) = (
            self.wall_ns as f64 / 1e3,
            (self.submit_ns + self.scatter_ns) as f64 / 1e3,
            self.kernel_ns() as f64 / 1e3,
        );
        let (enqueued, waited) = self.steps.iter().fold((0u64, 0u64), |(e, w), step| {
            (e + step.timings.enqueue_ns, w + step.timings.wait_ns)
        });
        let (submitted, enqueued_as) = match self.replayed {
            true => ("its graph", "launched"),
            false => ("the dispatches", "enqueued"),
        };
        format!(
            "wall {wall:.1} µs = host {host:.1} (staging and submitting {:.1}, of it staging {:.1} with the text's gather {:.1}; handing out {:.1}) + kernels {kernels:.1} ({}) + launches, gaps and the wait {:.1}; {submitted} {enqueued_as} in {:.1} µs and waited {:.1} µs",
            self.submit_ns as f64 / 1e3,
            self.staged_ns as f64 / 1e3,
            self.gathered_ns as f64 / 1e3,
            self.scatter_ns as f64 / 1e3,
            self.kernel_line(),
            (wall - host - kernels).max(0.0),
            enqueued as f64 / 1e3,
            waited as f64 / 1e3
        )
    }

    /// Each kernel step's own device time in µs, in dispatch order, as
    /// `stage 1.2, classify 3.4, ...` (the example's and the bench's line); a
    /// fused kernel's steps by its own clock in brackets after it, where they
    /// were read: `short 34.8 [stage 2.0, classify 4.1, ...]`.
    pub fn kernel_line(&self) -> String {
        let mut line = self
            .steps
            .iter()
            .map(|step| {
                format!(
                    "{} {:.1}",
                    step.name,
                    step.timings.kernel_stamps_ns as f64 / 1e3
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if !self.step_clocks.is_empty() {
            let mut before = 0;
            let inside: Vec<String> = self
                .step_clocks
                .iter()
                .map(|clock| {
                    let took = clock.end.saturating_sub(before);
                    before = clock.end;
                    format!("{} {:.1}", clock.name, took as f64 / 1e3)
                })
                .collect();
            line.push_str(&format!(" [{}]", inside.join(", ")));
        }
        line
    }
}

/// From this many bytes of text capacity (1 MiB, where the split takes its bulk
/// blocks) a CUDA slot moves the text and the ids across PCIe by the copy
/// engine instead of by kernels:
///
/// - the text is gathered into a [`PinnedBuffer`] that the `stage` dispatch
///   binds as [`Binding::Pinned`], so its upload is one DMA into a transient
///   device buffer before the kernel, which then reads device memory (the
///   whole buffer goes up, as large as the slot: a chunk that reuses a larger
///   slot uploads its unused tail too);
/// - `compact` stores the ids into device memory, and the copy engine brings
///   exactly the ids the chunk produced into the slot's host-mapped memory
///   once the host has read their count ([`AnyBackend::copy`]).
///
/// Why: a kernel that stores into host-mapped memory holds multiprocessors
/// while it waits on PCIe, and on the H200 the steps of one chunk fill the
/// device, so every chunk's PCIe time added to the batch's. On the H200
/// (2026-12-03, a 64 MiB cl100k batch in four 16 MiB chunks) the batch took
/// 13.44 ms with the device's default 8 hardware queues and 14.77 ms with one
/// (every step of every chunk one after another): only 1.3 ms of overlap,
/// while `compact` alone took 0.72–0.87 ms per chunk for about 34 MB of ids
/// and `stage` 0.38 ms. A copy by the copy engine takes no multiprocessor, so
/// the other chunks' steps run beside it: with the ids copied, the same batch's
/// `compact` took 0.11–0.34 ms per chunk and `encode_batch_into` 10.89 ms
/// against 11.44 (the figures with the text's DMA are in the README). Below
/// 1 MiB the ids are few (a 256 KiB text's about 240 KB take `compact` about
/// 5 µs across PCIe) and a copy's own round trip would cost more than it
/// saves.
pub const COPY_ENGINE_FROM: u64 = 1 << 20;

/// From this many bytes of text capacity (512 KiB) a CUDA slot's text goes up
/// by the copy engine (a [`PinnedBuffer`] bound as [`Binding::Pinned`], one
/// DMA before the first kernel), and its ids too from [`COPY_ENGINE_FROM`].
/// Below it the first kernel reads the text across PCIe from the slot's
/// host-mapped staging.
///
/// Why 512 KiB: the DMA of a 256 KiB text costs its encode more than the
/// kernel's PCIe reads do. On an H100 (2026-12-06, the `gpu_encode` bench,
/// median of 200, three alternating rounds) one 256 KiB document with its
/// text read across PCIe took 106.0 µs eagerly against 112.9–113.5 with the
/// DMA (prose; CJK 130.1–130.3 against 135.6–138.2, code 124.5–124.6
/// against 131.5–131.8), and into a reused [`BatchIds`] 84.5–93.8 against
/// 91.6–91.7 (prose; CJK 91.6–91.9 against 97.6–98.3), although the kernel
/// itself took 64.8–66.5 µs against 55.3–56.0 (prose): the upload is a copy
/// and a wait of its own before the kernel (19.4 µs for the upload and a
/// one-thread kernel, 10.6 without the upload, same run). An earlier
/// measurement (H200, 2026-12-05: `stage` 18.8–19.7 µs reading the text
/// across PCIe) had set 256 KiB; every thread of that kernel also read the
/// staged parameters across PCIe, which none does since they became
/// scalars. The ids stay host-mapped below 1 MiB: their copy would need
/// their count on the host first (a wait, then the copy's own round trip).
///
/// It held on a host whose kernels read across PCIe 2–3 times slower
/// (H100, 2026-12-07: 256 KiB in the step-by-step `stage` in 12–22 µs, the
/// fed resident kernel's `stage` 28–38 µs of its 73–89; the DMA of 256 KiB
/// and a one-thread kernel 20.5–23.2 µs against 12.6–13.3 without it). The
/// `gpu_encode` bench's single-document rounds (three each, median of 200)
/// there: 256 KiB eagerly with the text fed 101.0–103.8 µs, gathered first
/// 108.3–111.4, by the copy engine 122.0–126.9 (prose; CJK 116.3–119.3 /
/// 125.5–126.6 / 137.9–175.3, code 124.7–131.4 / 131.3–139.3 /
/// 147.6–152.2), although the kernel's own clock with the copy engine was
/// 67–71 µs against 73–77 fed (prose). The bench compares the three ways on
/// each host it runs on.
pub const TEXT_COPY_ENGINE_FROM: u64 = 512 << 10;

/// How a CUDA slot moves its text up and its ids down: by the copy engine
/// ([`TEXT_COPY_ENGINE_FROM`], [`COPY_ENGINE_FROM`]) or through host-mapped
/// memory that a kernel reads or writes (every slot of another backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Transfers {
    /// The text is pinned and goes up by DMA; `stage` reads device memory.
    text_by_copy_engine: bool,
    /// `compact` stores the ids into device memory and the copy engine brings
    /// them into host-mapped memory.
    ids_by_copy_engine: bool,
}

impl Transfers {
    /// One index per kind of slot, for keeping a few of each.
    fn kind(self) -> usize {
        usize::from(self.text_by_copy_engine) | usize::from(self.ids_by_copy_engine) << 1
    }

    /// Whether `role`'s buffer is in device memory with a host-side copy the
    /// copy engine fills or empties (the text pinned, the ids host-mapped).
    fn by_copy_engine(self, role: Role) -> bool {
        match role {
            Role::StagedText => self.text_by_copy_engine,
            Role::Ids => self.ids_by_copy_engine,
            _ => false,
        }
    }
}

/// Whether the host writes or reads `role` itself: on CUDA it lives in
/// host-mapped pinned memory (the ids only in slots below
/// [`COPY_ENGINE_FROM`]; larger ones keep them in device memory and copy
/// them into [`Slot::ids_host`]; the staged text only in slots below
/// [`TEXT_COPY_ENGINE_FROM`], larger ones stage it in a [`PinnedBuffer`]
/// that goes up by DMA: [`Transfers`]).
fn host_visible(role: Role) -> bool {
    matches!(
        role,
        Role::StagedParams
            | Role::StagedText
            | Role::StagedDocuments
            | Role::Ids
            | Role::DocumentTokenStarts
            | Role::TextReady
    )
}

/// Bytes of `role`'s buffer for a slot of `text` bytes and `documents`
/// documents of capacity (0: not a per-slot buffer, or one no step binds).
/// The split's scratch takes the split's own sizes.
fn role_bytes(programs: &Programs, role: Role, text: u64, documents: u64) -> u64 {
    let geometry = &programs.geometry;
    // What the split asks for the buffer of the split this role holds.
    let split_bytes = || {
        role.split_buffer()
            .and_then(|buffer| {
                let (text, documents) = (usize::try_from(text).ok()?, documents as usize);
                programs.split().buffer_bytes(buffer, text, documents).ok()
            })
            .unwrap_or(0)
    };
    let chunk = geometry.chunk_bytes as u64;
    match role {
        Role::Params | Role::StagedParams => 4 * param::WORDS as u64,
        Role::Text | Role::StagedText => text,
        Role::DocumentEnds | Role::StagedDocuments => 4 * documents,
        Role::Vocabulary | Role::TokenBytes | Role::KindTable => 0,
        Role::PieceCount => 4,
        Role::PieceStarts | Role::TokenAt | Role::MergeMinima | Role::MergeParts | Role::Ids => {
            4 * text
        }
        Role::MergeList => 4 * (text / 2 + 1),
        Role::ChunkList => 8 * (2 * text / chunk + 1),
        Role::LongList => 4 * (text / chunk + 1),
        Role::DocumentTokenStarts => 4 * (documents + 1),
        Role::SplitCodes | Role::SplitCounters => split_bytes(),
        // `compact`'s look-back also takes an 8-byte status word per
        // workgroup, at most one per block.
        Role::SplitStatuses => split_bytes().max(8 * blocks(geometry, text) as u64),
        Role::TextReady => text_ready::flag_bytes(text),
    }
}

/// Buffer capacities for a chunk: powers of two, at least 16 bytes and 4
/// documents.
fn capacities(text_len: u64, documents: u64) -> (u64, u64) {
    (
        text_len.max(16).next_power_of_two(),
        documents.max(4).next_power_of_two(),
    )
}

/// Every step in one kernel ([`fused`](super::fused)): in one workgroup (the
/// short-text kernel) or on a resident grid.
struct FusedKernel {
    kernel: Kernel,
    /// Which of the two.
    spread: Spread,
    /// One role per global buffer, in binding order.
    bindings: Vec<Role>,
    /// The program's name, for errors.
    name: String,
    /// Its steps' names, whose clocks it keeps ([`param::STEP_CLOCK`]).
    step_names: Vec<&'static str>,
}

/// `fused` compiled (`None` for none: off, or steps that do not fuse, see
/// [`short_program`]).
fn compile_fused(
    backend: &AnyBackend,
    fused: Option<ShortProgram>,
    geometry: &Geometry,
) -> Result<Option<FusedKernel>, TokenizerError> {
    let Some(fused) = fused else {
        return Ok(None);
    };
    let name = fused.program.display_name();
    let config = DispatchConfig::linear(1).with_codegen(geometry.fused_codegen());
    match backend.compile(&fused.program, &config) {
        Ok(kernel) => Ok(Some(FusedKernel {
            kernel,
            spread: fused.spread,
            bindings: fused.bindings,
            name,
            step_names: fused.step_names,
        })),
        // Every step's workgroup buffers at once can pass a device's limit
        // where each step alone fits (large workgroups on a device of 48 KiB),
        // and a device without cooperative launch cannot run a grid sync:
        // chunks then run their steps one by one.
        Err(BackendError::InvalidProgram { .. } | BackendError::Launch { .. }) => Ok(None),
        Err(error) => Err(backend_error(&format!("compiling {name}"), error)),
    }
}

/// The kernel steps of one geometry, compiled: [`Programs`] and a kernel per
/// step, in dispatch order.
struct CompiledSteps {
    programs: Programs,
    kernels: Vec<Kernel>,
}

impl CompiledSteps {
    /// Compiles every step of `programs` on `backend`, each with its occupancy
    /// request for the device's multiprocessors (none on the reference); `Err`
    /// names the program that failed.
    fn compile(backend: &AnyBackend, programs: Programs) -> Result<Self, (String, BackendError)> {
        let geometry = programs.geometry;
        let multiprocessor = crate::occupancy::multiprocessor_limits(backend);
        let kernels = programs
            .steps()
            .iter()
            .map(|step| {
                let codegen = step.codegen(&geometry, multiprocessor.as_ref());
                backend
                    .compile(
                        &step.program,
                        &DispatchConfig::linear(1).with_codegen(codegen),
                    )
                    .map_err(|error| (step.program_name().to_owned(), error))
            })
            .collect::<Result<_, _>>()?;
        Ok(CompiledSteps { programs, kernels })
    }
}

/// One set of buffers for a chunk in flight, sized by powers of two.
struct Slot {
    /// A fused kernel recorded over this slot's buffers, which the eager
    /// chunks of its lengths that the slot serves replay ([`ReplayedFused`]);
    /// recorded by the first. First, so that it drops before the buffers it
    /// binds.
    fused: Option<ReplayedFused>,
    text_capacity: u64,
    document_capacity: u64,
    buffers: [Option<DeviceBuffer>; ROLES],
    /// Where the copy engine brings the ids when `compact` stores them into
    /// device memory (CUDA slots from [`COPY_ENGINE_FROM`] bytes):
    /// host-mapped, as large as the `ids` buffer. `None`: the `ids` buffer is
    /// host-visible itself.
    ids_host: Option<DeviceBuffer>,
    /// The staged text, when the `stage` dispatch uploads it by DMA (CUDA slots
    /// from [`TEXT_COPY_ENGINE_FROM`] bytes): it takes the place of the
    /// `staged_text` buffer, which the slot then does not have.
    staged_text_pinned: Option<PinnedBuffer>,
}

impl Slot {
    /// How the slot moves its text and ids: by the copy engine where it has
    /// their pinned and host-mapped buffers.
    fn transfers(&self) -> Transfers {
        Transfers {
            text_by_copy_engine: self.staged_text_pinned.is_some(),
            ids_by_copy_engine: self.ids_host.is_some(),
        }
    }

    fn buffer(&self, role: Role) -> Result<&DeviceBuffer, TokenizerError> {
        self.buffers[role as usize]
            .as_ref()
            .ok_or_else(|| internal(format!("the device encoder has no {} buffer", role.name())))
    }

    fn buffer_mut(&mut self, role: Role) -> Result<&mut DeviceBuffer, TokenizerError> {
        self.buffer_beside_graph(role).map(|(buffer, _)| buffer)
    }

    /// The buffer of `role` with the slot's recorded graph, if it has one: a
    /// graph holds the host-mapped buffers it binds for its whole life, so the
    /// host reads and writes them in place beside it
    /// ([`DeviceBuffer::mapped_bytes_mut_beside`]).
    fn buffer_beside_graph(
        &mut self,
        role: Role,
    ) -> Result<(&mut DeviceBuffer, Option<&mut AnyGraph>), TokenizerError> {
        self.buffer_and_fused(role)
            .map(|(buffer, fused)| (buffer, fused.map(|fused| &mut fused.graph)))
    }

    /// The staged text and the ready flags, both writable (for the host
    /// beside a graph that binds them), and the ids buffer (whose lent ids a
    /// graph demotes during its replay), with the slot's recorded graph and
    /// what it recorded, if it keeps one.
    fn text_ready_and_ids(
        &mut self,
    ) -> Result<
        (
            Option<&mut ReplayedFused>,
            [&mut DeviceBuffer; 2],
            &DeviceBuffer,
        ),
        TokenizerError,
    > {
        let [text, ready, ids] = self
            .buffers
            .get_disjoint_mut([
                Role::StagedText as usize,
                Role::TextReady as usize,
                Role::Ids as usize,
            ])
            .map_err(|_| {
                internal("the staged text, ready flags and ids in one place".to_owned())
            })?;
        match (text.as_mut(), ready.as_mut(), ids.as_ref()) {
            (Some(text), Some(ready), Some(ids)) => Ok((self.fused.as_mut(), [text, ready], ids)),
            _ => Err(internal(
                "the device encoder has no staged text, ready flags or ids".to_owned(),
            )),
        }
    }

    /// The buffer of `role` with the slot's recorded graph and what it
    /// recorded ([`ReplayedFused`]), if it keeps one.
    fn buffer_and_fused(
        &mut self,
        role: Role,
    ) -> Result<(&mut DeviceBuffer, Option<&mut ReplayedFused>), TokenizerError> {
        let buffer = self.buffers[role as usize]
            .as_mut()
            .ok_or_else(|| internal(format!("the device encoder has no {} buffer", role.name())))?;
        Ok((buffer, self.fused.as_mut()))
    }
}

/// A fused kernel (the resident grid's or the short-text kernel's) recorded
/// as a graph over one slot's buffers, so that an eager chunk it runs is one
/// graph launch instead of a dispatch. A slot keeps one (a graph holds the
/// host-mapped buffers it binds, and the host can read and write them in
/// place beside one graph only); [`DeviceEncoder::take_slot`] prefers an idle
/// slot that keeps the one a chunk wants.
///
/// # Why
///
/// A cooperative dispatch's submission returns only once its kernel has ended
/// (the kernel's grid-barrier words are leased per launch), and the eager
/// encode paid for the launch, the lease and the barrier's audit besides; a
/// dispatch of the short-text kernel costs the backend's work per dispatch
/// where a graph launch costs one driver call. [`DeviceEncoder::graph`]
/// replays such a kernel for one length; this graph serves every length the
/// slot holds: the text's length, the documents and the grid are its kernel
/// node's parameters, passed before every replay and written when they
/// change, all in one write of the node ([`AnyGraph::set_launch`], which
/// writes nothing when nothing changed; a write per change cost an encode
/// after one of another length two node updates where one does, about 1.3 µs
/// each on an H100 host).
///
/// A replay returns once its kernel has ended, as the cooperative dispatch's
/// submission did; the short-text kernel's dispatch returns at once, so its
/// graph is replayed only where the caller waits at once (a batch of one
/// chunk), never for [`DeviceEncoder::submit_bytes`].
///
/// Measured with it on an H100 (2026-12-06): the encode example, cl100k, two
/// rounds of the median of 20 encodes (each with a read of the device's
/// counts, which both sides paid), dispatch / slot graph: 8 KiB of prose 75.7,
/// 76.8 / 70.0, 71.2 µs, 64 KiB 95.2, 93.7 / 89.6, 85.1; the `gpu_encode`
/// bench, 256 KiB eager in one run, dispatch / slot graph: prose 142.9 /
/// 127.3 µs, CJK 196.9 / 166.8, code 158.8 / 144.3 (in a second run prose
/// 129.2 / 128.2, CJK 180.2 / 152.3, code 149.6 / 144.7). The short-text
/// kernel's graph, the example's eager rows as a caller encodes (median of
/// 30, two rounds), dispatch / slot graph: 1 KiB of prose 40.4, 41.0 / 32.7,
/// 33.2 µs, CJK 39.9, 44.4 / 36.2, 34.3, code 55.4, 58.8 / 50.5, 50.6; 2 KiB
/// of prose 61.0, 61.2 / 52.8, 52.5.
///
/// # How it reads the text
///
/// Below [`TEXT_COPY_ENGINE_FROM`] the kernel reads the slot's host-mapped
/// staging in place, as the dispatch does. From it the slot's text waits in a
/// pinned buffer for the dispatch's copy, which a graph cannot bind (a replay
/// outlives any caller's buffer): the graph then uploads the text from its
/// own pinned input slot, of the slot's text capacity, into a device buffer of
/// its own, and the staging gathers the text into that input slot instead.
///
/// # Ids that a [`BatchIds`] takes in place
///
/// A [`BatchIds`] part takes the slot's host-mapped ids buffer itself and
/// leaves another one in the slot; the graph, which binds the first and holds
/// it, is rebound to the one left ([`AnyGraph::set_buffer`]: the kernel node's
/// address rewritten, the hold moved), so the part can take the buffer out of
/// its reach and the next replay writes where the slot reads. On the H100
/// (2026-12-06, the encode example, median of 30, two rounds), into a reused
/// `BatchIds`, the dispatch / the rebound graph: 180,000 bytes of prose 102.0,
/// 100.5 / 92.8, 94.8 µs, code 116.5, 112.3 / 116.0, 112.8; 256 KiB of code
/// 143.4, 136.1 / 130.4, 133.6 (the rebind itself about 3 µs).
struct ReplayedFused {
    /// Which fused kernel it replays.
    spread: Spread,
    graph: AnyGraph,
    step: StepId,
    /// The kernel's binding of the slot's `ids` buffer, which a [`BatchIds`]
    /// part takes in place: the graph is rebound to the buffer the part gives
    /// the slot instead ([`AnyGraph::set_buffer`]).
    ids_binding: u32,
    /// The graph's input slot of the text, where the slot's text goes up by
    /// the copy engine; `None` where the kernel reads the slot's staging.
    text: Option<InputSlot>,
}

/// Which of its slot's fused graphs ([`ReplayedFused`]) a chunk may replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replays {
    /// The resident grid's: the caller waits later, and a replay returns only
    /// once its kernel has ended (as the cooperative dispatch did).
    Resident,
    /// Either fused kernel's: the caller waits at once.
    EitherFused,
}

/// A chunk's documents laid out as the device reads them.
struct Layout {
    /// The chunk's text length.
    text_len: u32,
    /// Each document's end offset.
    ends: Vec<u32>,
}

impl Layout {
    /// One document of `text_len` bytes: what a graph's slot holds for every
    /// replay.
    fn one_document(text_len: u32) -> Layout {
        Layout {
            text_len,
            ends: vec![text_len],
        }
    }
}

/// A chunk gathered into a slot's staging and not yet submitted; dropping it
/// gives the slot back.
struct StagedChunk<'e> {
    encoder: &'e DeviceEncoder,
    /// `None` for an empty chunk, which runs nothing.
    slot: Option<Slot>,
    text_len: u32,
    documents: usize,
    /// Whether the chunk replays its slot's fused graph, whose input slot
    /// may hold its text ([`ReplayedFused`]).
    replays: bool,
    /// Whether its text is still to be gathered, into the slot's host-mapped
    /// staging while the replayed resident kernel already runs
    /// ([`DeviceEncoder::replay_fused`]).
    feeds: bool,
    /// The hand-out helpers' crew, where the chunk has it.
    helpers: Option<Helpers>,
    /// When staging began.
    start: Instant,
    /// Host time of the staging itself ([`ChunkTimings::staged_ns`]).
    staged_ns: u64,
    /// The part of it that gathered the text ([`ChunkTimings::gathered_ns`]).
    gathered_ns: u64,
}

impl Drop for StagedChunk<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.encoder.give_back(slot);
        }
    }
}

/// The pool a batch of `chunks` chunks runs its hand-outs on: a pool of its
/// own, [`HAND_OUTS_RUNNING`] threads, from two chunks up, where a chunk's
/// hand-out overlaps the next chunk's staging and the device's work; `None`
/// (each hand-out on the calling thread, as without a pool) for one chunk or
/// none, whose hand-out has nothing to overlap and which would only wake a
/// thread and wait for it (8.0–17.5 µs per 1 KiB encode with the hand-off,
/// 3.4 µs without: the [module docs](self)), and where its threads cannot be
/// started. A hand-out of 1 MiB of ids or more still copies on the copy
/// pool's workers ([`host_copy::PARALLEL_COPY_BYTES`]).
///
/// # Why not the copy pool
///
/// A job spawned into a rayon pool from outside it waits until the pool's
/// workers find no work in their own queues or each other's: the hand-outs
/// ran on the copy pool, behind the pieces of the next chunk's gather. On the
/// H200 (2026-12-04, the `gpu_encode` bench, 594 hand-outs) a hand-out started
/// a median of 40 µs after it was spawned but 575 µs at the 90th percentile and
/// up to 4.8 ms, and each µs of it held back the copy of that chunk's ids,
/// which at the batch's end is the time the caller waits. On their own pool
/// the 64 MiB batch into one `BatchIds` took 7.27, 7.29 and 7.17 ms against
/// 7.39, 7.39 and 7.31 ms on the copy pool, and 7.30 and 7.33 ms in a second
/// call (runs alternating in the same calls).
fn hand_out_pool(chunks: usize) -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    crate::workers::persistent_pool(&POOL, HAND_OUTS_RUNNING, "hand-out").filter(|_| chunks > 1)
}

/// How many threads at most (and one fewer than the host's cores) an encode
/// on CUDA wakes to share its staging and its hand-out
/// ([`DeviceEncoder::with_hand_out_helpers`]; none on the reference
/// interpreter, which computes on the calling thread).
///
/// Why three: on an H100 host of 16 cores (2026-12-06, the `gpu_encode`
/// bench, median of 200, three alternating rounds, one 256 KiB document,
/// eagerly) three helpers took 100.8–104.9 µs against 112.9–113.5 alone
/// (prose: hand-out 8.4–12.4 µs against 15.5–16.0), 111.3–113.3 against
/// 135.6–138.2 (CJK, whose ids are twice as many: 11.6–16.9 against
/// 29.7–30.0) and 125.9–126.2 against 131.5–131.8 (code); one helper took
/// 105.4–110.0, 113.0–118.3 and 130.8–131.5. A graph into a reused vector
/// gained as much (prose 99.2–105.7 against 111.4–112.2); an encode into a
/// [`BatchIds`], which hands nothing out, neither gained nor lost
/// (92.2–93.0 against 91.6–91.7). A graph whose ids are read in place wakes
/// them too, for the staging and for the kernel's sake
/// ([`EncodeGraph::encode_in_place`] gives the figures).
pub const HAND_OUT_HELPERS: usize = 3;

/// From this many bytes of text a chunk the caller waits for at once wakes
/// threads to share its hand-out ([`DeviceEncoder::with_hand_out_helpers`]).
///
/// Why not below: a short text has little to share, and a thread spinning
/// through its device wait did not speed its kernel as it does a 256 KiB
/// one's (see [`EncodeGraph::encode_in_place`]): 1 KiB of prose in a batch of
/// one took 34.3–36.5 µs alone against 34.6–36.8 with one helper spinning
/// from the first byte (`with_hand_out_helpers(1, 0)`), its short-text kernel
/// 23.9–24.3 against 24.2–24.6 by its own clock (H100, 2026-12-06, the
/// `gpu_encode` bench, three alternating rounds in each of three runs, median
/// of 200 each).
pub const HELPED_FROM_TEXT_BYTES: u64 = 64 << 10;

/// Hand-outs an encode may have running before it stages another chunk (and
/// the threads of [`hand_out_pool`]): each holds its chunk's buffers until its
/// ids are out.
const HAND_OUTS_RUNNING: usize = 2;

/// Buffer slots of each kind (moving text and ids by the copy engine or not:
/// [`COPY_ENGINE_FROM`]) an encoder keeps idle for the next chunks: one per
/// chunk on the device, the one being staged, and those of running hand-outs.
const SLOTS_KEPT: usize = CHUNKS_IN_FLIGHT + 1 + HAND_OUTS_RUNNING;

/// One chunk's hand-out, run on the copy pool (or at once without one).
type HandOutJob<'s> = Box<dyn FnOnce() + Send + 's>;

/// The hand-outs of one batch encode still running.
#[derive(Debug, Default)]
struct HandOuts {
    running: Mutex<usize>,
    finished: Condvar,
}

/// One running hand-out: counted until dropped (also when its job unwinds).
struct RunningHandOut<'h>(&'h HandOuts);

impl HandOuts {
    fn begin(&self) -> RunningHandOut<'_> {
        *self
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) += 1;
        RunningHandOut(self)
    }

    /// Returns once fewer than `limit` are running.
    fn wait_below(&self, limit: usize) {
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while *running >= limit {
            running = self
                .finished
                .wait(running)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

impl Drop for RunningHandOut<'_> {
    fn drop(&mut self) {
        *self
            .0
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) -= 1;
        self.0.finished.notify_all();
    }
}

/// The encode of one encoding on one backend (the split and the BPE steps):
/// the resident vocabulary and kind table, the compiled kernels and reusable
/// buffer slots. See the [module docs](self).
pub struct DeviceEncoder {
    backend: AnyBackend,
    /// The steps at [`Geometry::split`]: every chunk below the bulk split's size.
    steps: CompiledSteps,
    /// The steps at [`Geometry::bulk_split`], for chunks of at least its size
    /// (`None`: none asked for, or the device cannot hold its workgroups).
    bulk: Option<CompiledSteps>,
    short: Option<FusedKernel>,
    /// Every step on a resident grid, for chunks up to
    /// [`ChunkLimits::resident_text_bytes`].
    resident: Option<FusedKernel>,
    vocabulary: DeviceBuffer,
    token_bytes: DeviceBuffer,
    kind_table: DeviceBuffer,
    vocabulary_bytes: usize,
    slots: Mutex<Vec<Slot>>,
    limits: ChunkLimits,
    admission: Arc<Admission>,
    /// Whether an eager chunk that runs a fused kernel may replay its slot's
    /// graph of it ([`DeviceEncoder::with_fused_graphs`]).
    fused_graphs: bool,
    /// Held across each replay of a slot's resident-grid graph: one resident
    /// grid of this encoder on the device at a time, as the cooperative
    /// dispatch's lease of its kernel's barrier words kept it (each grid asks
    /// for every workgroup the device holds at once).
    resident_replay: Mutex<()>,
    /// How many threads a chunk the caller waits for at once wakes to share
    /// its hand-out, and from how many bytes of text
    /// ([`DeviceEncoder::with_hand_out_helpers`]).
    hand_out_helpers: (usize, u64),
    /// From how many bytes of slot capacity the text goes up by the copy
    /// engine ([`DeviceEncoder::with_text_copy_engine_from`]).
    text_copy_engine_from: u64,
    /// Whether a resident chunk's text is gathered while its kernel runs
    /// ([`DeviceEncoder::with_text_fed`]).
    feeds_text: bool,
}

impl std::fmt::Debug for DeviceEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceEncoder")
            .field("backend", &self.backend.kind())
            .field("geometry", &self.steps.programs.geometry)
            .field("vocabulary_bytes", &self.vocabulary_bytes)
            .finish_non_exhaustive()
    }
}

impl DeviceEncoder {
    /// The encoder of `tokenizer`'s encoding on `backend`, with the default
    /// [`Geometry`] and [`ChunkLimits`]: compiles the programs and uploads the
    /// vocabulary once.
    pub fn new(backend: AnyBackend, tokenizer: &Tokenizer) -> Result<Self, TokenizerError> {
        Self::with_geometry(
            backend,
            tokenizer,
            Geometry::default(),
            ChunkLimits::default(),
        )
    }

    /// [`DeviceEncoder::new`] with another geometry and chunk limits (small ones
    /// let tests cross chunk and piece boundaries with short texts).
    pub fn with_geometry(
        backend: AnyBackend,
        tokenizer: &Tokenizer,
        geometry: Geometry,
        limits: ChunkLimits,
    ) -> Result<Self, TokenizerError> {
        Self::for_vocabulary(
            backend,
            tokenizer.vocabulary(),
            tokenizer.pattern(),
            geometry,
            limits,
            Arc::default(),
        )
    }

    /// The encoder of `vocabulary` with pieces by `pattern`, admitting chunks
    /// through `admission` (shared by the encoders of one backend).
    pub(crate) fn for_vocabulary(
        backend: AnyBackend,
        vocabulary: &Vocabulary,
        pattern: Pattern,
        geometry: Geometry,
        limits: ChunkLimits,
        admission: Arc<Admission>,
    ) -> Result<Self, TokenizerError> {
        let programs = Programs::new(pattern, geometry)
            .map_err(|message| TokenizerError::new(ErrorKind::Backend, message))?;
        if limits.text_bytes == 0 || limits.documents == 0 {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                "Fix: ChunkLimits must allow at least one byte and one document per chunk",
            ));
        }
        if limits.short_text_bytes > SHORT_TEXT_BYTES {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: ChunkLimits::short_text_bytes is {}, over the short-text kernel's {SHORT_TEXT_BYTES} bytes; use at most {SHORT_TEXT_BYTES} (0 turns it off)",
                    limits.short_text_bytes
                ),
            ));
        }
        if limits.text_bytes > MAX_TEXT_BYTES as u64 {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: ChunkLimits::text_bytes is {}, over the device split's limit of {MAX_TEXT_BYTES} bytes per chunk; use at most {MAX_TEXT_BYTES}",
                    limits.text_bytes
                ),
            ));
        }
        let device_vocabulary = DeviceVocabulary::new(vocabulary)?;
        let compile_error = |(name, error): (String, BackendError)| {
            backend_error(&format!("compiling {name}"), error)
        };
        let steps = CompiledSteps::compile(&backend, programs).map_err(compile_error)?;
        let bulk = match geometry.bulk_split {
            None => None,
            Some(_) => {
                let programs = Programs::new(pattern, geometry.bulk())
                    .map_err(|message| TokenizerError::new(ErrorKind::Backend, message))?;
                match CompiledSteps::compile(&backend, programs) {
                    Ok(bulk) => Some(bulk),
                    // Its workgroups need more workgroup memory than this device
                    // gives a kernel: every chunk takes `Geometry::split`.
                    Err((_, BackendError::InvalidProgram { .. })) => None,
                    Err(failed) => return Err(compile_error(failed)),
                }
            }
        };
        let fused_steps = |geometry: Geometry, spread: Spread| {
            Programs::new(pattern, geometry)
                .map(|programs| programs.fused_steps(spread))
                .map_err(|message| TokenizerError::new(ErrorKind::Backend, message))
        };
        // A loop cap is for the stage and BPE steps alone (see Geometry), which
        // one program cannot give to some of its loops: no fused kernel with one.
        let uncapped = geometry.max_loop_iterations.is_none();
        let short = if limits.short_text_bytes > 0 && uncapped {
            let short_geometry = geometry.short();
            let short = short_program(
                &fused_steps(short_geometry, Spread::OneWorkgroup)?,
                &short_geometry,
            )
            .ok();
            compile_fused(&backend, short, &short_geometry)?
        } else {
            None
        };
        let resident = if limits.resident_text_bytes > limits.short_text_bytes && uncapped {
            let resident =
                resident_program(&fused_steps(geometry, Spread::ResidentGrid)?, &geometry).ok();
            // A device that holds no workgroup of it at once cannot run it.
            compile_fused(&backend, resident, &geometry)?
                .filter(|fused| fused.kernel.max_coresident_workgroups() != Some(0))
        } else {
            None
        };
        let vocabulary_buffer = backend
            .buffer_from(device_vocabulary.words())
            .map_err(|error| backend_error("uploading the vocabulary", error))?;
        let token_bytes = backend
            .buffer_from(device_vocabulary.token_bytes())
            .map_err(|error| backend_error("uploading the vocabulary", error))?;
        let kind_table = backend
            .buffer_from(&cutting_table_bytes(
                pattern,
                vocabulary.joined_pair_bits(),
            )?)
            .map_err(|error| backend_error("uploading the split's tables", error))?;
        // The reference interpreter computes on the calling thread: spinning
        // helpers would take cores from it and save nothing.
        let default_helpers = match backend {
            AnyBackend::Cuda(_) => HAND_OUT_HELPERS,
            _ => 0,
        };
        Ok(DeviceEncoder {
            backend,
            steps,
            bulk,
            short,
            resident,
            vocabulary: vocabulary_buffer,
            token_bytes,
            kind_table,
            vocabulary_bytes: device_vocabulary.device_bytes(),
            slots: Mutex::new(Vec::new()),
            limits,
            admission,
            fused_graphs: true,
            resident_replay: Mutex::new(()),
            hand_out_helpers: (default_helpers, HELPED_FROM_TEXT_BYTES),
            text_copy_engine_from: TEXT_COPY_ENGINE_FROM,
            feeds_text: true,
        })
    }

    /// Whether an eager chunk that runs a fused kernel replays a graph of
    /// that kernel which its buffers' slot keeps (`true`, the default) or
    /// submits the dispatch (`false`): every chunk that runs the resident grid
    /// ([`DeviceEncoder::runs_resident`]), and one that runs the short-text
    /// kernel ([`DeviceEncoder::runs_short`]) where the caller waits for it at
    /// once (a batch of one chunk; a replay returns once its kernel has
    /// ended, where that dispatch returns at once). The ids are the same; the
    /// graph's launch waits less around the kernel (on an H100, 2026-12-06,
    /// 256 KiB of prose 127.3 against 142.9 µs eagerly, 1 KiB in a batch of one
    /// 32.7–33.2 against 40.4–41.0; the README gives the runs). The
    /// first chunk a slot serves this way records the graph (a chunk whose
    /// ids a [`BatchIds`] takes in place too: the graph then follows the ids
    /// buffer the part leaves in the slot).
    pub fn with_fused_graphs(mut self, replay: bool) -> Self {
        self.fused_graphs = replay;
        self
    }

    /// How many threads (at most three, and one fewer than the host's cores)
    /// an encode the caller waits for at once (a batch of one chunk,
    /// [`DeviceEncoder::submit_bytes`], or an [`EncodeGraph`]'s replay)
    /// wakes while the device computes, to share the copy of its ids into the
    /// caller's vectors once it is done (a [`BatchIds`] and
    /// [`EncodeGraph::encode_in_place`] read them in place, and keep the
    /// threads spinning for the kernel's sake),
    /// for a chunk of at least `from_text_bytes` bytes of text (see
    /// [`HELPED_FROM_TEXT_BYTES`]). The threads spin through the device wait
    /// (at most a millisecond) and for a quarter of a millisecond after the
    /// hand-out, so that an encode that follows at once shares its staging
    /// with them too; one encode at a time has them, and one that finds them
    /// taken copies alone. The ids are the same. The default on CUDA is
    /// [`HAND_OUT_HELPERS`] (three, whose measurement its docs give) from
    /// [`HELPED_FROM_TEXT_BYTES`]; 0 (the calling thread copies alone) turns
    /// them off, as on the reference interpreter.
    pub fn with_hand_out_helpers(mut self, helpers: usize, from_text_bytes: u64) -> Self {
        self.hand_out_helpers = (helpers, from_text_bytes);
        self
    }

    /// Whether a chunk that replays the resident-grid kernel over text read
    /// across PCIe (a slot below [`TEXT_COPY_ENGINE_FROM`] on CUDA) launches
    /// first and gathers its text while the kernel runs, the kernel reading
    /// each piece as its ready flag goes up (`true`, the default), or gathers
    /// it before the launch and sets every flag first (`false`). The ids are
    /// the same. Why feeding: the gather (about 10 µs for 256 KiB), the launch
    /// and the kernel's reads of the text across PCIe ran one after another.
    /// On an H200 (2026-12-06, the `gpu_encode` bench, three alternating
    /// rounds, one 256 KiB document, median of 200 each, three hand-out
    /// helpers) fed against gathered first took prose 95.8–96.6 µs eagerly
    /// against 101.4–103.3 (as a graph read in place 90.7–91.0 against
    /// 96.3–97.0, into a reused [`BatchIds`] 85.4–85.7 against 92.4–93.0),
    /// CJK 110.9–113.4 against 116.7–120.8 and code 117.3–118.7 against
    /// 125.3–126.8; the kernel's own clock is longer fed (prose 72.4–74.6
    /// against 65.8–69.5 µs), since it starts before its text is there.
    pub fn with_text_fed(mut self, fed: bool) -> Self {
        self.feeds_text = fed;
        self
    }

    /// From how many bytes of slot capacity (a power of two) a chunk's text
    /// goes up by the copy engine, one DMA before the kernels, instead of
    /// being read by the first kernel across PCIe from host-mapped memory
    /// (default [`TEXT_COPY_ENGINE_FROM`], 512 KiB; at most
    /// [`COPY_ENGINE_FROM`], where the ids go down by the copy engine too).
    /// Set it on a new encoder: slots already made keep their way. The ids
    /// are the same. Why it can be set: the threshold is where a DMA's own
    /// wait costs less than the kernel's PCIe reads, which depends on the
    /// host's link and the kernel; the `gpu_encode` bench's single-document
    /// rows compare the default with 256 KiB. An `Err` above
    /// [`COPY_ENGINE_FROM`].
    pub fn with_text_copy_engine_from(mut self, bytes: u64) -> Result<Self, TokenizerError> {
        if bytes > COPY_ENGINE_FROM {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: with_text_copy_engine_from got {bytes} bytes; pass at most {COPY_ENGINE_FROM} \
                     (from there the slot's ids go by the copy engine, and its text with them)"
                ),
            ));
        }
        self.text_copy_engine_from = bytes;
        Ok(self)
    }

    /// The hand-out helpers' crew for a chunk of `text_len` bytes, where the
    /// caller waits for it at once (`helped`) and the encoder asks for helpers
    /// at that size: one per 64 KiB of text (at least one), up to the
    /// encoder's count, from its threshold up; none from 1 MiB of text, whose
    /// ids the copy pool's workers take. `None` too where another encode holds
    /// the crew.
    fn crew_for(&self, text_len: u64, helped: bool) -> Option<Helpers> {
        let (most, from) = self.hand_out_helpers;
        if !helped
            || most == 0
            || text_len < from
            || text_len >= host_copy::PARALLEL_COPY_BYTES as u64
        {
            return None;
        }
        let count = usize::try_from(text_len / (64 << 10))
            .unwrap_or(usize::MAX)
            .clamp(1, most);
        Helpers::take(count)
    }

    /// The CUDA device's name, or `None` on the reference interpreter.
    pub fn device_name(&self) -> Option<&str> {
        match &self.backend {
            AnyBackend::Cuda(gpu) => Some(&gpu.caps().name),
            _ => None,
        }
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &AnyBackend {
        &self.backend
    }

    /// The pattern it splits by.
    pub fn pattern(&self) -> Pattern {
        self.steps.programs.pattern()
    }

    /// Its kernel steps' names, in dispatch order (`stage`, the split's, the
    /// BPE steps): what [`ChunkTimings::steps`] holds for an eager chunk.
    pub fn step_names(&self) -> Vec<&'static str> {
        self.steps
            .programs
            .steps()
            .iter()
            .map(|step| step.name)
            .collect()
    }

    /// Its programs at [`Geometry::split`] (those of every chunk below the bulk
    /// split's size, see [`DeviceEncoder::programs_for`]).
    pub fn programs(&self) -> &Programs {
        &self.steps.programs
    }

    /// The programs a chunk of `text_len` bytes runs: those at
    /// [`Geometry::bulk_split`] from its size on (where the device could
    /// compile them), the others below it and for a chunk that runs as the
    /// short-text kernel.
    pub fn programs_for(&self, text_len: u64) -> &Programs {
        &self.steps_for(text_len).programs
    }

    /// Whether chunks of `text_len` bytes run the split at
    /// [`Geometry::bulk_split`].
    pub fn runs_bulk(&self, text_len: u64) -> bool {
        self.bulk.is_some()
            && self
                .steps
                .programs
                .geometry
                .bulk_split
                .is_some_and(|bulk| text_len >= bulk.from_bytes)
            && self.fused_kernel(text_len).is_none()
    }

    /// The compiled steps of a chunk of `text_len` bytes.
    fn steps_for(&self, text_len: u64) -> &CompiledSteps {
        match &self.bulk {
            Some(bulk) if self.runs_bulk(text_len) => bulk,
            _ => &self.steps,
        }
    }

    /// Bytes of `role`'s buffer in a slot of `text` bytes and `documents`
    /// documents of capacity: enough for either set of steps, since a slot
    /// serves chunks of every size up to its capacity.
    fn slot_role_bytes(&self, role: Role, text: u64, documents: u64) -> u64 {
        std::iter::once(&self.steps)
            .chain(&self.bulk)
            .map(|compiled| role_bytes(&compiled.programs, role, text, documents))
            .max()
            .unwrap_or(0)
    }

    /// The geometry its programs were built for.
    pub fn geometry(&self) -> Geometry {
        self.steps.programs.geometry
    }

    /// The chunk limits it cuts batches by.
    pub fn limits(&self) -> ChunkLimits {
        self.limits
    }

    /// Bytes the resident vocabulary takes on the device.
    pub fn vocabulary_bytes(&self) -> usize {
        self.vocabulary_bytes
    }

    /// Bytes of the buffers one chunk of `text_bytes` bytes and `documents`
    /// documents takes: `(device, host-visible)`, where host-visible buffers are
    /// host-mapped pinned memory on CUDA (capacities are powers of two).
    pub fn chunk_buffer_bytes(&self, text_bytes: u64, documents: u64) -> (u64, u64) {
        let (text, documents) = capacities(text_bytes, documents);
        let mut device = 0;
        let mut host = 0;
        let transfers = self.transfers(text);
        for role in Role::ALL {
            let bytes = self.slot_role_bytes(role, text, documents);
            if transfers.by_copy_engine(role) {
                // The ids in device memory, copied into as many host-mapped bytes;
                // the text pinned on the host, uploaded into a transient device
                // buffer of its size while the chunk is in flight.
                device += bytes;
                host += bytes;
            } else if host_visible(role) {
                host += bytes;
            } else {
                device += bytes;
            }
        }
        (device, host)
    }

    /// The ids of every text: `result[i]` is the ids of `texts[i]`, as
    /// [`Tokenizer::encode_ordinary_bytes`] gives them. The batch is cut into
    /// chunks ([`ChunkLimits`]); up to [`CHUNKS_IN_FLIGHT`] are on the device at
    /// once.
    pub fn encode_batch_bytes(&self, texts: &[&[u8]]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let mut results = vec![Vec::new(); texts.len()];
        self.encode_batch_into(texts, &mut results)?;
        Ok(results)
    }

    /// [`DeviceEncoder::encode_batch_bytes`] of strings.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let bytes: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
        self.encode_batch_bytes(&bytes)
    }

    /// [`DeviceEncoder::encode_batch_bytes`] into `results` (one per text;
    /// each replaced), returning the timings of every chunk. The host copies
    /// every id into its vector; [`DeviceEncoder::encode_batch_ids`] spares that
    /// copy (the faster way to take a large batch's ids).
    pub fn encode_batch_into(
        &self,
        texts: &[&[u8]],
        results: &mut [Vec<u32>],
    ) -> Result<Vec<ChunkTimings>, TokenizerError> {
        if results.len() != texts.len() {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: encode_batch_into got {} result vectors for {} texts; pass one per text",
                    results.len(),
                    texts.len()
                ),
            ));
        }
        let ranges = chunk_ranges(texts, &self.limits);
        let mut rest = results;
        let destinations = ranges
            .iter()
            .map(|range| {
                let (mine, others) = std::mem::take(&mut rest).split_at_mut(range.len());
                rest = others;
                ChunkIds::Vectors(mine)
            })
            .collect();
        self.run_batch(texts, &ranges, destinations)
    }

    /// The ids of every text into `ids` ([`BatchIds`]: one result, each
    /// document's ids a slice of it, its memory reused by the next batch),
    /// returning the timings of every chunk. On CUDA the copy engine writes
    /// each chunk's ids straight into the result's pinned memory, so the host
    /// copies no id (the [`BatchIds`] docs give the measurement); otherwise as
    /// [`DeviceEncoder::encode_batch_into`]. After an `Err`, `ids` holds no
    /// document.
    pub fn encode_batch_ids(
        &self,
        texts: &[&[u8]],
        ids: &mut BatchIds,
    ) -> Result<Vec<ChunkTimings>, TokenizerError> {
        let ranges = chunk_ranges(texts, &self.limits);
        let firsts: Vec<usize> = ranges.iter().map(|range| range.start).collect();
        let destinations = ids.begin(&firsts).iter_mut().map(ChunkIds::Part).collect();
        let timings = self.run_batch(texts, &ranges, destinations)?;
        ids.finish(ranges.len());
        Ok(timings)
    }

    /// The chunks of `ranges` through [`DeviceEncoder::pipeline`], each chunk's
    /// ids into its destination, the hand-outs on the hand-out pool for a batch
    /// of several chunks; the timings of every chunk.
    fn run_batch<'s>(
        &'s self,
        texts: &[&[u8]],
        ranges: &[Range<usize>],
        destinations: Vec<ChunkIds<'s>>,
    ) -> Result<Vec<ChunkTimings>, TokenizerError> {
        let batch_start = Instant::now();
        // Each chunk's timings, filled in by its hand-out (on the pool).
        let outcomes: Vec<Mutex<Option<Result<ChunkTimings, TokenizerError>>>> =
            ranges.iter().map(|_| Mutex::new(None)).collect();
        let hand_outs = HandOuts::default();
        let pipelined = match hand_out_pool(ranges.len()) {
            Some(pool) => pool.in_place_scope(|scope| {
                self.pipeline(
                    (texts, ranges, batch_start),
                    destinations,
                    &outcomes,
                    &hand_outs,
                    &mut |job| {
                        scope.spawn(move |_| job());
                    },
                )
            }),
            None => self.pipeline(
                (texts, ranges, batch_start),
                destinations,
                &outcomes,
                &hand_outs,
                &mut |job| job(),
            ),
        };
        pipelined?;
        outcomes
            .into_iter()
            .map(|outcome| {
                outcome
                    .into_inner()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .unwrap_or_else(|| {
                        Err(internal("a chunk's ids were never handed out".to_owned()))
                    })
            })
            .collect()
    }

    /// How [`DeviceEncoder::encode_batch_into`] cuts `texts` into chunks: the
    /// documents of each, in order, by [`DeviceEncoder::limits`].
    pub fn chunks(&self, texts: &[&[u8]]) -> Vec<Range<usize>> {
        chunk_ranges(texts, &self.limits)
    }

    /// The chunks of `ranges` through the device: each staged (gathered into a
    /// slot) while the chunks before it compute, then submitted once there is
    /// room; a finished chunk's hand-out goes to `spawn` (the hand-out pool,
    /// where it runs while the calling thread stages the next chunk), its timings to
    /// `outcomes` (each chunk's `began_ns` counted from `batch_start`).
    fn pipeline<'s>(
        &'s self,
        (texts, ranges, batch_start): (&[&[u8]], &[Range<usize>], Instant),
        destinations: Vec<ChunkIds<'s>>,
        outcomes: &'s [Mutex<Option<Result<ChunkTimings, TokenizerError>>>],
        hand_outs: &'s HandOuts,
        spawn: &mut dyn FnMut(HandOutJob<'s>),
    ) -> Result<(), TokenizerError> {
        let mut hand_out = |index: usize, pending: PendingEncode<'s>, mine: ChunkIds<'s>| {
            let finished = pending.finish()?;
            let began_ns = u64::try_from(
                finished
                    .start
                    .saturating_duration_since(batch_start)
                    .as_nanos(),
            )
            .unwrap_or(u64::MAX);
            let running = hand_outs.begin();
            spawn(Box::new(move || {
                let outcome = finished.hand_out(mine).map(|mut timings| {
                    timings.began_ns = began_ns;
                    timings
                });
                *outcomes[index]
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(outcome);
                drop(running);
            }));
            Ok::<(), TokenizerError>(())
        };
        if destinations.len() != ranges.len() {
            return Err(internal(format!(
                "{} destinations for {} chunks",
                destinations.len(),
                ranges.len()
            )));
        }
        let mut destinations: Vec<Option<ChunkIds<'s>>> =
            destinations.into_iter().map(Some).collect();
        let lengths: Vec<u64> = ranges
            .iter()
            .map(|range| {
                texts[range.clone()]
                    .iter()
                    .map(|text| text.len() as u64)
                    .sum()
            })
            .collect();
        let order = submission_order(&lengths, |len| self.fused_kernel(len).is_some());
        let mut in_flight: VecDeque<(usize, PendingEncode<'s>, ChunkIds<'s>)> = VecDeque::new();
        for index in order {
            let (range, Some(mine)) = (&ranges[index], destinations[index].take()) else {
                return Err(internal(format!("chunk {index} submitted twice")));
            };
            // Each slot of a hand-out still running is one more chunk's buffers.
            hand_outs.wait_below(HAND_OUTS_RUNNING);
            // Staged while the chunks in flight compute.
            // A chunk alone is handed out at once after its submission.
            let replays = match ranges.len() {
                1 => Replays::EitherFused,
                _ => Replays::Resident,
            };
            // A chunk alone has the crew for its copies (its staging, and its
            // hand-out where its ids go into vectors).
            let staged = self.stage(&texts[range.clone()], replays, ranges.len() == 1)?;
            // Room for it: a chunk of ours finishes first when there is none
            // (waiting for room while holding some could wait forever).
            while in_flight.len() == CHUNKS_IN_FLIGHT || !self.admission.admit()? {
                let Some((done, oldest, its_results)) = in_flight.pop_front() else {
                    return Err(internal(
                        "no room on the device and no chunk of ours to finish".to_owned(),
                    ));
                };
                hand_out(done, oldest, its_results)?;
            }
            // A part's ids from the batch before, read by the caller in
            // place, go back to a slot at this chunk's hand-out and are
            // written by the encode after: demoted while this one runs, by a
            // caller that waits for its one chunk anyway (the calling thread
            // of a longer batch stages the next chunk meanwhile).
            let lent = match (&mine, ranges.len()) {
                (ChunkIds::Part(part), 1) => {
                    LentIds::part(part.ids_read_in_place(), lengths[index] as usize)
                }
                _ => LentIds::None,
            };
            let pending = self.submit_staged(staged, &texts[range.clone()], lent)?;
            in_flight.push_back((index, pending, mine));
        }
        while let Some((done, oldest, its_results)) = in_flight.pop_front() {
            hand_out(done, oldest, its_results)?;
        }
        Ok(())
    }

    /// Stages `texts` as one chunk (whatever its size) and submits every step
    /// without waiting: the texts are copied before this returns, so the caller
    /// may reuse them at once. [`PendingEncode::wait`] gives the ids.
    pub fn submit_bytes(&self, texts: &[&[u8]]) -> Result<PendingEncode<'_>, TokenizerError> {
        if !self.admission.admit()? {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: the device already has {CHUNKS_IN_FLIGHT} encodes pending and this thread \
                     submitted one of them; wait for one of yours before submitting another"
                ),
            ));
        }
        self.submit_admitted(texts)
    }

    /// [`DeviceEncoder::submit_bytes`] once admitted: the admission is given
    /// back when the encode is waited for or dropped, or here on an error.
    fn submit_admitted(&self, texts: &[&[u8]]) -> Result<PendingEncode<'_>, TokenizerError> {
        match self.stage(texts, Replays::Resident, true) {
            Ok(staged) => self.submit_staged(staged, texts, LentIds::None),
            Err(error) => {
                self.admission.release();
                Err(error)
            }
        }
    }

    /// `texts` laid out and gathered into a slot's staging (no slot for an
    /// empty chunk), nothing submitted yet; `replays` says which of its slot's
    /// graphs the chunk may replay; a `helped` chunk (one whose caller waits
    /// for it at once) takes the hand-out helpers' crew where the encoder asks
    /// for it
    /// ([`DeviceEncoder::with_hand_out_helpers`]), and shares its staging with
    /// the crew where it still spins.
    fn stage(
        &self,
        texts: &[&[u8]],
        replays: Replays,
        helped: bool,
    ) -> Result<StagedChunk<'_>, TokenizerError> {
        let start = Instant::now();
        let layout = self.layout(texts)?;
        let helpers = self.crew_for(u64::from(layout.text_len), helped);
        let mut staged = StagedChunk {
            encoder: self,
            slot: None,
            text_len: layout.text_len,
            documents: texts.len(),
            replays: false,
            feeds: false,
            helpers,
            start,
            staged_ns: 0,
            gathered_ns: 0,
        };
        if layout.text_len > 0 {
            let replayed = self.replayed_kernel(layout.text_len, replays);
            let slot = staged.slot.insert(self.take_slot(
                layout.text_len as u64,
                texts.len() as u64,
                replayed.map(|fused| fused.spread),
            )?);
            if let Some(fused) = replayed {
                self.ready_replay(slot, fused, layout.text_len, texts.len())?;
                staged.replays = true;
                // `replay_fed` feeds it where the staging is host-mapped and
                // stages it first elsewhere; a text the copy engine brings up
                // is never fed.
                staged.feeds = self.feeds_text
                    && fused.spread == Spread::ResidentGrid
                    && !slot.transfers().text_by_copy_engine;
            }
            if staged.feeds {
                // The text goes in while the kernel runs; the layout now.
                self.write_layout(slot, &layout)?;
                staged.staged_ns = elapsed_ns(start);
                return Ok(staged);
            }
            let gather = Instant::now();
            self.write_staging(
                slot,
                texts,
                &layout,
                staged.replays,
                staged.helpers.as_ref(),
            )?;
            staged.gathered_ns = elapsed_ns(gather);
        }
        staged.staged_ns = elapsed_ns(start);
        Ok(staged)
    }

    /// Submits every step of a staged chunk once admitted: the admission is
    /// given back when the encode is waited for or dropped, or here on an
    /// error or for an empty chunk (which runs nothing and holds no room).
    /// A chunk with the hand-out helpers' crew wakes it once the device has
    /// the chunk, and `lent` is demoted then ([`while_the_device_runs`]).
    fn submit_staged(
        &self,
        mut staged: StagedChunk<'_>,
        texts: &[&[u8]],
        lent: LentIds<'_>,
    ) -> Result<PendingEncode<'_>, TokenizerError> {
        let text_len = staged.text_len;
        let helpers = staged.helpers.take();
        let Some(mut slot) = staged.slot.take() else {
            self.admission.release();
            return Ok(PendingEncode {
                encoder: self,
                slot: None,
                pending: Vec::new(),
                replayed: None,
                helpers,
                text_len: 0,
                documents: staged.documents,
                start: staged.start,
                submit_ns: elapsed_ns(staged.start),
                staged_ns: staged.staged_ns,
                gathered_ns: staged.gathered_ns,
                want_counts: false,
            });
        };
        let fed = staged.feeds.then_some(texts);
        let submitted = if staged.replays {
            self.replay_fused(
                &mut slot,
                (text_len, staged.documents),
                helpers.as_ref(),
                fed,
                lent,
            )
            .map(|(spread, timings, gathered_ns)| {
                staged.gathered_ns += gathered_ns;
                (Vec::new(), Some((spread, timings)))
            })
        } else {
            self.submit_steps(&slot, text_len, staged.documents)
                .map(|pending| {
                    while_the_device_runs(helpers.as_ref(), lent);
                    (pending, None)
                })
        };
        match submitted {
            Ok((pending, replayed)) => Ok(PendingEncode {
                encoder: self,
                slot: Some(slot),
                pending,
                replayed,
                helpers,
                text_len: u64::from(text_len),
                documents: staged.documents,
                start: staged.start,
                submit_ns: elapsed_ns(staged.start),
                staged_ns: staged.staged_ns,
                gathered_ns: staged.gathered_ns,
                want_counts: false,
            }),
            Err(error) => {
                self.give_back(slot);
                self.admission.release();
                Err(error)
            }
        }
    }

    /// [`DeviceEncoder::submit_bytes`] of strings.
    pub fn submit(&self, texts: &[&str]) -> Result<PendingEncode<'_>, TokenizerError> {
        let bytes: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
        self.submit_bytes(&bytes)
    }

    /// The ids of `texts` as one chunk (whatever its size), its timings and
    /// what the device counted (reading the counts costs one small read after
    /// the wait).
    pub fn encode_counted(
        &self,
        texts: &[&[u8]],
    ) -> Result<(Vec<Vec<u32>>, ChunkTimings), TokenizerError> {
        let mut pending = self.submit_bytes(texts)?;
        pending.want_counts = true;
        let mut results = vec![Vec::new(); texts.len()];
        let timings = pending.wait_into(&mut results)?;
        Ok((results, timings))
    }

    /// The documents' end offsets, back to back; `Err` for a chunk over the
    /// split's limit (one document over it: a chunk of its own).
    fn layout(&self, texts: &[&[u8]]) -> Result<Layout, TokenizerError> {
        let total: u64 = texts.iter().map(|text| text.len() as u64).sum();
        let text_len = u32::try_from(total)
            .ok()
            .filter(|&len| len as usize <= MAX_TEXT_BYTES)
            .ok_or_else(|| {
                TokenizerError::new(
                    ErrorKind::Backend,
                    format!(
                        "Fix: a chunk of {total} bytes is over the device split's limit of \
                         {MAX_TEXT_BYTES} bytes; encode documents of at most {MAX_TEXT_BYTES} bytes \
                         on the device (or this one on the CPU)"
                    ),
                )
            })?;
        let mut ends = Vec::with_capacity(texts.len());
        let mut offset = 0u32;
        for text in texts {
            offset += text.len() as u32;
            ends.push(offset);
        }
        Ok(Layout { text_len, ends })
    }

    /// A slot with room for `text_len` bytes and `documents` documents: an idle
    /// one that is large enough (one that keeps a graph of the fused kernel
    /// `replayed` first, then one that keeps no graph), or a new one (powers
    /// of two).
    fn take_slot(
        &self,
        text_len: u64,
        documents: u64,
        replayed: Option<Spread>,
    ) -> Result<Slot, TokenizerError> {
        let (text, documents) = capacities(text_len, documents);
        let transfers = self.transfers(text);
        {
            let mut slots = self
                .slots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // A small chunk never takes a slot that moves its text or ids by the
            // copy engine: the whole pinned text would go up and the ids would take
            // a copy's round trip, for a few KiB.
            let fits = |slot: &Slot| {
                slot.text_capacity >= text
                    && slot.document_capacity >= documents
                    && slot.transfers() == transfers
            };
            let kept = |slot: &Slot| slot.fused.as_ref().map(|fused| fused.spread);
            let preferred = slots
                .iter()
                .position(|slot| fits(slot) && kept(slot) == replayed)
                .or_else(|| {
                    slots
                        .iter()
                        .position(|slot| fits(slot) && kept(slot).is_none())
                })
                .or_else(|| slots.iter().position(fits));
            if let Some(index) = preferred {
                return Ok(slots.swap_remove(index));
            }
        }
        let mut buffers: [Option<DeviceBuffer>; ROLES] = std::array::from_fn(|_| None);
        let mut ids_host = None;
        let mut staged_text_pinned = None;
        for role in Role::ALL {
            let bytes = self.slot_role_bytes(role, text, documents);
            if bytes == 0 {
                continue;
            }
            if let (Role::StagedText, true, AnyBackend::Cuda(gpu)) =
                (role, transfers.text_by_copy_engine, &self.backend)
            {
                let pinned = usize::try_from(bytes)
                    .map_err(|_| internal(format!("a slot of {bytes} text bytes on this host")))?;
                let pinned = gpu.pinned_buffer(pinned).map_err(|error| {
                    backend_error(
                        &format!("allocating {bytes} pinned bytes for the text"),
                        error,
                    )
                })?;
                staged_text_pinned = Some(pinned);
                continue;
            }
            if role == Role::Ids && transfers.ids_by_copy_engine {
                let host = host_visible_buffer(&self.backend, bytes).map_err(|error| {
                    backend_error(&format!("allocating {bytes} host bytes for the ids"), error)
                })?;
                ids_host = Some(host);
            }
            let buffer = if host_visible(role) && !transfers.by_copy_engine(role) {
                host_visible_buffer(&self.backend, bytes)
            } else {
                self.backend.buffer(bytes)
            }
            .map_err(|error| {
                backend_error(
                    &format!("allocating {bytes} bytes for {}", role.name()),
                    error,
                )
            })?;
            buffers[role as usize] = Some(buffer);
        }
        Ok(Slot {
            fused: None,
            text_capacity: text,
            document_capacity: documents,
            buffers,
            ids_host,
            staged_text_pinned,
        })
    }

    /// How a slot of `text_capacity` bytes moves its text and ids
    /// ([`DeviceEncoder::with_text_copy_engine_from`], [`COPY_ENGINE_FROM`];
    /// only on CUDA).
    fn transfers(&self, text_capacity: u64) -> Transfers {
        let cuda = matches!(self.backend, AnyBackend::Cuda(_));
        Transfers {
            text_by_copy_engine: cuda && text_capacity >= self.text_copy_engine_from,
            ids_by_copy_engine: cuda && text_capacity >= COPY_ENGINE_FROM,
        }
    }

    fn give_back(&self, slot: Slot) {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.push(slot);
        // Keep the largest few of each kind (a slot is tens of bytes per text
        // byte), so that small chunks still find a slot of theirs after a batch
        // of large ones.
        slots.sort_by_key(|slot| std::cmp::Reverse(slot.text_capacity));
        let mut kept = [0usize; 4];
        slots.retain(|slot| {
            let kind = &mut kept[slot.transfers().kind()];
            *kind += 1;
            *kind <= SLOTS_KEPT
        });
    }

    /// Writes the chunk into the slot's staging: the parameters, the document
    /// ends and the text (gathered on the copy pool), which goes into the
    /// input slot of the slot's fused graph where the chunk `replays` that
    /// graph and the graph uploads the text.
    fn write_staging(
        &self,
        slot: &mut Slot,
        texts: &[&[u8]],
        layout: &Layout,
        replays: bool,
        helpers: Option<&Helpers>,
    ) -> Result<(), TokenizerError> {
        self.write_layout(slot, layout)?;
        let backend = &self.backend;
        let text_len = layout.text_len as usize;
        if let Some(pinned) = slot.staged_text_pinned.as_mut() {
            let out = match (replays, slot.fused.as_mut()) {
                (false, _) => pinned
                    .as_mut_slice()
                    .map_err(|error| backend_error("staging the chunk", error))?,
                (
                    true,
                    Some(ReplayedFused {
                        graph,
                        text: Some(text),
                        ..
                    }),
                ) => input(graph, *text)?,
                (true, _) => {
                    return Err(internal(
                        "a replay of pinned text without the graph's text input".to_owned(),
                    ))
                }
            };
            let room = out.len();
            let out = out
                .get_mut(..text_len)
                .ok_or_else(|| internal(format!("{text_len} text bytes in {room} of staging")))?;
            hand_out_helpers::gather(out, texts, helpers, None)?;
        } else {
            let (buffer, graph) = slot.buffer_beside_graph(Role::StagedText)?;
            write_host_visible(backend, buffer, graph, |out| {
                hand_out_helpers::gather(&mut out[..text_len], texts, helpers, None)
            })?;
        }
        // The resident kernel reads the text once its flags are set.
        if self.resident_kernel(u64::from(layout.text_len)).is_some() {
            let (buffer, graph) = slot.buffer_beside_graph(Role::TextReady)?;
            publish_ready(backend, buffer, graph, text_len)?;
        }
        Ok(())
    }

    /// Writes a chunk's parameters and document ends into the slot's staging.
    fn write_layout(&self, slot: &mut Slot, layout: &Layout) -> Result<(), TokenizerError> {
        let mut params = [0u32; param::WORDS as usize];
        params[param::TEXT_LEN as usize] = layout.text_len;
        params[param::DOCUMENTS as usize] = layout.ends.len() as u32;
        let backend = &self.backend;
        let (buffer, graph) = slot.buffer_beside_graph(Role::StagedParams)?;
        write_host_visible(backend, buffer, graph, |out| {
            copy_words(out, &params);
            Ok(())
        })?;
        let (buffer, graph) = slot.buffer_beside_graph(Role::StagedDocuments)?;
        write_host_visible(backend, buffer, graph, |out| {
            copy_words(out, &layout.ends);
            Ok(())
        })
    }

    /// Submits every step of a staged chunk of `text_len` bytes and
    /// `documents` documents, each ordered after the one before on the device.
    fn submit_steps(
        &self,
        slot: &Slot,
        text_len: u32,
        documents: usize,
    ) -> Result<Vec<PendingDispatch>, TokenizerError> {
        let backend = &self.backend;
        if let Some(fused) = self.fused_kernel(u64::from(text_len)) {
            // Every step, `stage` included, in one kernel.
            let bindings = self.bindings(slot, &fused.bindings)?;
            let documents = dispatch_documents(documents)?;
            let request = Dispatch::new(&fused.kernel, &bindings)
                .workgroups([self.fused_workgroups(fused, u64::from(text_len)), 1, 1])
                .scalar(TEXT_LEN_SCALAR, text_len)
                .scalar(DOCUMENTS_SCALAR, documents)
                .readback(&NO_READBACK);
            let submitted = backend
                .submit(request)
                .map_err(|error| backend_error(&format!("submitting {}", fused.name), error))?;
            return Ok(vec![submitted]);
        }
        let compiled = self.steps_for(u64::from(text_len));
        let geometry = &compiled.programs.geometry;
        let steps = compiled.programs.steps();
        // `stage` and `compact` over device memory need no cap for PCIe's sake.
        let transfers = slot.transfers();
        let grid_geometry = &Geometry {
            stage_workgroups: if transfers.text_by_copy_engine {
                DEVICE_STAGE_WORKGROUPS
            } else {
                geometry.stage_workgroups
            },
            compact_workgroups: if transfers.ids_by_copy_engine {
                DEVICE_COMPACT_WORKGROUPS
            } else {
                geometry.compact_workgroups
            },
            ..*geometry
        };
        let mut pending: Vec<PendingDispatch> = Vec::with_capacity(steps.len());
        for (step, kernel) in steps.iter().zip(&compiled.kernels) {
            let workgroups = step
                .grid
                .workgroups(grid_geometry, text_len as u64, documents as u64);
            let bindings = self.bindings(slot, &step.bindings)?;
            let request = Dispatch::new(kernel, &bindings)
                .workgroups([workgroups, 1, 1])
                .readback(&NO_READBACK);
            let submitted = backend
                .submit(request.after_last(&pending))
                .map_err(|error| {
                    backend_error(&format!("submitting {}", step.program_name()), error)
                })?;
            pending.push(submitted);
        }
        Ok(pending)
    }

    /// The fused kernel whose slot graph a chunk of `text_len` bytes replays,
    /// where it runs one and `replays` allows it ([`ReplayedFused`]).
    fn replayed_kernel(&self, text_len: u32, replays: Replays) -> Option<&FusedKernel> {
        let fused = self
            .fused_kernel(u64::from(text_len))
            .filter(|_| self.fused_graphs)?;
        match (replays, fused.spread) {
            (Replays::EitherFused, _) | (Replays::Resident, Spread::ResidentGrid) => Some(fused),
            _ => None,
        }
    }

    /// Readies `slot` to replay its graph of `fused` for a chunk of `text_len`
    /// bytes in `documents` documents: records it over the slot where the slot
    /// keeps none, or one of the other fused kernel (which it drops). The
    /// recording's length, documents and grid are the first replay's, which
    /// [`DeviceEncoder::replay_fused`] passes again.
    fn ready_replay(
        &self,
        slot: &mut Slot,
        fused: &FusedKernel,
        text_len: u32,
        documents: usize,
    ) -> Result<(), TokenizerError> {
        if slot
            .fused
            .as_ref()
            .is_some_and(|kept| kept.spread == fused.spread)
        {
            return Ok(());
        }
        // The host reads and writes a slot's mapped buffers beside one graph.
        slot.fused = None;
        let documents = dispatch_documents(documents)?;
        let upload = slot
            .staged_text_pinned
            .is_some()
            .then(|| self.slot_role_bytes(Role::StagedText, slot.text_capacity, 1));
        let (graph, step, text) = self.record_fused(slot, fused, (text_len, documents), upload)?;
        let ids_binding = fused
            .bindings
            .iter()
            .position(|&role| role == Role::Ids)
            .and_then(|binding| u32::try_from(binding).ok())
            .ok_or_else(|| internal(format!("{} binds no ids buffer", fused.name)))?;
        slot.fused = Some(ReplayedFused {
            spread: fused.spread,
            graph,
            step,
            ids_binding,
            text,
        });
        Ok(())
    }

    /// One replay of `slot`'s fused graph for a chunk of `text_len` bytes in
    /// `documents` documents (staged by [`DeviceEncoder::stage`]), its kernel
    /// node given the chunk's scalars and grid first (rewritten only where
    /// they differ from the last replay's); returns once the kernel has ended,
    /// with the kernel's kind, the replay's timings and the host time of a
    /// gather done during it; `helpers`, the hand-out helpers' crew where the
    /// chunk has it, is woken while the kernel runs, and `lent` demoted then.
    /// `fed`: the chunk's texts, where the stage left them to be gathered into
    /// the slot's staging while the resident kernel runs ([`replay_fed`]).
    fn replay_fused(
        &self,
        slot: &mut Slot,
        (text_len, documents): (u32, usize),
        helpers: Option<&Helpers>,
        fed: Option<&[&[u8]]>,
        lent: LentIds<'_>,
    ) -> Result<(Spread, Timings, u64), TokenizerError> {
        let (kept, [staged_text, ready]) = match fed {
            Some(_) => slot
                .text_ready_and_ids()
                .map(|(kept, [text, ready], _)| (kept, [Some(text), Some(ready)]))?,
            None => (slot.fused.as_mut(), [None, None]),
        };
        let kept =
            kept.ok_or_else(|| internal("a replay of a slot without its graph".to_owned()))?;
        let fused = match kept.spread {
            Spread::OneWorkgroup => self.short.as_ref(),
            Spread::ResidentGrid => self.resident.as_ref(),
        }
        .ok_or_else(|| internal("a replay of a fused kernel the encoder lacks".to_owned()))?;
        let workgroups = self.fused_workgroups(fused, u64::from(text_len));
        let documents = dispatch_documents(documents)?;
        let failed = |error| backend_error(&format!("replaying {}", fused.name), error);
        kept.graph
            .set_launch(
                kept.step,
                &[
                    (TEXT_LEN_SCALAR, Literal::from(text_len)),
                    (DOCUMENTS_SCALAR, Literal::from(documents)),
                ],
                Some([workgroups, 1, 1]),
            )
            .map_err(failed)?;
        let _one_grid = (kept.spread == Spread::ResidentGrid).then(|| {
            self.resident_replay
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        });
        if let (Some(texts), Some(staged_text), Some(ready)) = (fed, staged_text, ready) {
            let fed = Fed {
                texts,
                text_len: text_len as usize,
                helpers,
                while_running: true,
                lent,
            };
            let (timings, gathered_ns) =
                replay_fed(&self.backend, &mut kept.graph, staged_text, ready, fed)?;
            return Ok((kept.spread, timings, gathered_ns));
        }
        let (timings, ()) = kept
            .graph
            .replay_beside(|| while_the_device_runs(helpers, lent))
            .map_err(failed)?;
        Ok((kept.spread, timings, 0))
    }

    /// The short-text kernel, when a chunk of `text_len` bytes takes it.
    fn short_kernel(&self, text_len: u64) -> Option<&FusedKernel> {
        self.short
            .as_ref()
            .filter(|_| text_len <= self.limits.short_text_bytes)
    }

    /// Whether a chunk of `text_len` bytes runs as the short-text kernel (every
    /// step in one workgroup, see [`fused`](super::fused)) instead of one
    /// dispatch per step.
    pub fn runs_short(&self, text_len: u64) -> bool {
        text_len > 0 && self.short_kernel(text_len).is_some()
    }

    /// The resident-grid kernel, when a chunk of `text_len` bytes takes it: too
    /// large for the short-text kernel, at most
    /// [`ChunkLimits::resident_text_bytes`].
    fn resident_kernel(&self, text_len: u64) -> Option<&FusedKernel> {
        if self.short_kernel(text_len).is_some() {
            return None;
        }
        self.resident
            .as_ref()
            .filter(|_| text_len <= self.limits.resident_text_bytes)
            // Beside lanes on every multiprocessor no workgroup of it fits: the
            // steps run one by one.
            .filter(|fused| self.resident_capacity(fused) != Some(0))
    }

    /// Workgroups of the resident-grid kernel `fused` the device holds at once
    /// now (`None`: no limit): fewer while lanes run on the backend, whose
    /// blocks a cooperative grid cannot count on
    /// ([`AnyBackend::coresident_workgroups`]).
    fn resident_capacity(&self, fused: &FusedKernel) -> Option<u64> {
        self.backend.coresident_workgroups(&fused.kernel)
    }

    /// The fused kernel a chunk of `text_len` bytes runs as, when it runs as one
    /// (the short-text kernel first, then the resident grid).
    fn fused_kernel(&self, text_len: u64) -> Option<&FusedKernel> {
        self.short_kernel(text_len)
            .or_else(|| self.resident_kernel(text_len))
    }

    /// Whether a chunk of `text_len` bytes runs as one cooperative dispatch of
    /// every step on a grid of resident workgroups (see
    /// [`fused`](super::fused)) instead of one dispatch per step.
    pub fn runs_resident(&self, text_len: u64) -> bool {
        text_len > 0 && self.resident_kernel(text_len).is_some()
    }

    /// Workgroups of `fused` for a chunk of `text_len` bytes: one for the
    /// short-text kernel; for the resident grid one per split block (the step
    /// with the most groups at the default shape), at most what the device
    /// holds at once beside any running lane and
    /// [`Geometry::resident_workgroups`].
    fn fused_workgroups(&self, fused: &FusedKernel, text_len: u64) -> u32 {
        if fused.spread == Spread::OneWorkgroup {
            return 1;
        }
        let geometry = &self.steps.programs.geometry;
        let blocks = text_len
            .div_ceil(u64::from(geometry.split.block_bytes()))
            .max(1);
        let most = self.resident_capacity(fused).unwrap_or(u64::MAX);
        let asked = geometry.resident_workgroups.map_or(u64::MAX, u64::from);
        u32::try_from(blocks.min(most).min(asked).max(1)).unwrap_or(u32::MAX)
    }

    /// The bindings of `roles`: the resident tables, or the slot's buffers.
    fn bindings<'a>(
        &'a self,
        slot: &'a Slot,
        roles: &[Role],
    ) -> Result<Vec<Binding<'a>>, TokenizerError> {
        roles
            .iter()
            .map(|&role| match role {
                Role::Vocabulary => Ok(Binding::from(&self.vocabulary)),
                Role::TokenBytes => Ok(Binding::from(&self.token_bytes)),
                Role::KindTable => Ok(Binding::from(&self.kind_table)),
                Role::StagedText => match &slot.staged_text_pinned {
                    Some(pinned) => Ok(Binding::Pinned(pinned)),
                    None => slot.buffer(role).map(Binding::from),
                },
                _ => slot.buffer(role).map(Binding::from),
            })
            .collect()
    }

    /// Records the encode of one text of exactly `text_len` bytes as one graph,
    /// which [`EncodeGraph::encode`] replays. A text that runs the short-text
    /// kernel ([`DeviceEncoder::runs_short`]) is that one kernel, which reads
    /// the text where the host wrote it (the slot's host-mapped staging) and
    /// writes the ids where the host reads them; a text that runs the resident
    /// grid ([`DeviceEncoder::runs_resident`]) is that one cooperative kernel
    /// (vyre-cuda records a grid-sync kernel over a module of the graph's
    /// own), which reads the text across PCIe from the slot's host-mapped
    /// staging as an eager encode does, or, from [`TEXT_COPY_ENGINE_FROM`]
    /// bytes of slot, the upload of its text from the graph's pinned input
    /// slot before it; any other text is the uploads of the parameters, the
    /// text and the document ends from the graph's pinned input slots, then
    /// every step but `stage` (the split's included), each its own kernel
    /// node.
    ///
    /// Why the short kernel: recorded step by step, a 1 KiB text took
    /// longer as a graph than eagerly through the short-text kernel (61.7
    /// against 49.3 µs on the H200, 2026-12-05): seven kernel nodes of a few
    /// µs each and three upload nodes cost more than the one kernel's serial
    /// steps.
    pub fn graph(&self, text_len: usize) -> Result<EncodeGraph<'_>, TokenizerError> {
        let text_len_u32 = u32::try_from(text_len).map_err(|_| {
            TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: a graph of {text_len} bytes does not fit the device's 32-bit offsets"
                ),
            )
        })?;
        if text_len == 0 {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                "Fix: a graph encodes texts of one length of at least 1 byte; an empty text has no ids",
            ));
        }
        let mut slot = self.take_slot(text_len as u64, 1, None)?;
        // The graph binds the slot's buffers itself; the host then reads and
        // writes them in place beside that graph alone.
        slot.fused = None;
        let recorded = if let Some(fused) = self.short_kernel(text_len as u64) {
            self.record_short(&mut slot, fused, text_len_u32)
                .map(|graph| (graph, GraphInputs::Staging))
        } else if let Some(fused) = self.resident_kernel(text_len as u64) {
            // Below the copy engine's threshold the kernel reads the slot's
            // host-mapped staging, as an eager encode of the same slot does.
            let upload = slot
                .transfers()
                .text_by_copy_engine
                .then_some(text_len as u64);
            self.write_layout(&mut slot, &Layout::one_document(text_len_u32))
                .and_then(|()| self.record_fused(&slot, fused, (text_len_u32, 1), upload))
                .map(|(graph, _, input)| {
                    let inputs = input.map_or(GraphInputs::Fed, GraphInputs::Text);
                    (graph, inputs)
                })
        } else {
            self.record_steps(&slot, text_len_u32)
                .map(|(graph, inputs)| (graph, GraphInputs::Uploads(inputs)))
        };
        match recorded {
            Ok((graph, inputs)) => Ok(EncodeGraph {
                encoder: self,
                graph: Some(graph),
                slot: Some(slot),
                inputs,
                text_len: text_len_u32,
                read_back: Vec::new(),
                ids_lent: 0,
            }),
            Err(error) => {
                self.give_back(slot);
                Err(error)
            }
        }
    }

    /// The graph of one text of `text_len` bytes step by step over `slot`:
    /// the uploads of the parameters, the text and the document ends (their
    /// input slots returned with it), then every step but `stage`.
    fn record_steps(
        &self,
        slot: &Slot,
        text_len: u32,
    ) -> Result<(AnyGraph, [InputSlot; 3]), TokenizerError> {
        let compiled = self.steps_for(u64::from(text_len));
        let geometry = compiled.programs.geometry;
        let steps = &compiled.programs.steps()[1..];
        let mut slots: Option<[InputSlot; 3]> = None;
        let bindings: Vec<Vec<Binding<'_>>> = steps
            .iter()
            .map(|step| self.bindings(slot, &step.bindings))
            .collect::<Result<_, _>>()?;
        let graph = self
            .backend
            .record(|recorder| {
                let upload = |recorder: &mut vyre_cuda::backend::AnyRecorder<'_, '_>,
                              role: Role,
                              bytes: u64| {
                    recorder.upload(slot.buffer(role).map_err(to_backend)?, bytes)
                };
                let inputs = [
                    upload(recorder, Role::Params, 4 * param::WORDS as u64)?,
                    upload(recorder, Role::Text, u64::from(text_len))?,
                    upload(recorder, Role::DocumentEnds, 4 * slot.document_capacity)?,
                ];
                for ((step, kernel), bindings) in
                    steps.iter().zip(&compiled.kernels[1..]).zip(&bindings)
                {
                    let workgroups = step.grid.workgroups(&geometry, u64::from(text_len), 1);
                    recorder.dispatch(
                        Dispatch::new(kernel, bindings)
                            .workgroups([workgroups, 1, 1])
                            .readback(&NO_READBACK),
                    )?;
                }
                slots = Some(inputs);
                Ok(())
            })
            .map_err(|error| backend_error("recording the encode graph", error))?;
        let inputs =
            slots.ok_or_else(|| internal("the encode graph recorded no input slots".to_owned()))?;
        Ok((graph, inputs))
    }

    /// The graph of `documents` documents of `text_len` bytes in all through
    /// the fused kernel `fused` over `slot` (the resident grid's cooperative
    /// kernel, or the short-text kernel's one workgroup): the one kernel,
    /// which takes the text length and the documents from its scalars
    /// (its `stage` reads no staged parameter), reading the text from the
    /// slot's staging in place, or with `upload` bytes of it first uploaded
    /// from the graph's pinned input slot (returned with the step) into a
    /// device buffer of the graph's own (the graph holds its memory once
    /// recorded). A replay checks the grid against the device as it is then:
    /// beside lanes that leave it too few multiprocessors it is a `Fix:`
    /// error, where an eager encode would run the steps one by one.
    fn record_fused(
        &self,
        slot: &Slot,
        fused: &FusedKernel,
        (text_len, documents): (u32, u32),
        upload: Option<u64>,
    ) -> Result<(AnyGraph, StepId, Option<InputSlot>), TokenizerError> {
        // The graph's own text buffer and the bytes uploaded into it.
        let staged = upload
            .map(|bytes| {
                let capacity = self.slot_role_bytes(Role::StagedText, slot.text_capacity, 1);
                self.backend
                    .buffer(capacity)
                    .map(|buffer| (buffer, bytes))
                    .map_err(|error| {
                        backend_error(
                            &format!("allocating {capacity} bytes for a graph's text"),
                            error,
                        )
                    })
            })
            .transpose()?;
        let bindings: Vec<Binding<'_>> = fused
            .bindings
            .iter()
            .zip(self.bindings(slot, &fused.bindings)?)
            .map(|(&role, binding)| match (role, &staged) {
                (Role::StagedText, Some((staged, _))) => Binding::from(staged),
                _ => binding,
            })
            .collect();
        let workgroups = self.fused_workgroups(fused, u64::from(text_len));
        let mut recorded = None;
        let graph = self
            .backend
            .record(|recorder| {
                let text = match &staged {
                    Some((staged, bytes)) => Some(recorder.upload(staged, *bytes)?),
                    None => None,
                };
                let step = recorder.dispatch(
                    Dispatch::new(&fused.kernel, &bindings)
                        .workgroups([workgroups, 1, 1])
                        .scalar(TEXT_LEN_SCALAR, text_len)
                        .scalar(DOCUMENTS_SCALAR, documents)
                        .readback(&NO_READBACK),
                )?;
                recorded = Some((step, text));
                Ok(())
            })
            .map_err(|error| backend_error(&format!("recording {}", fused.name), error))?;
        let (step, text) =
            recorded.ok_or_else(|| internal("the fused graph recorded no step".to_owned()))?;
        Ok((graph, step, text))
    }

    /// The graph of one text of `text_len` bytes through the short-text
    /// kernel `fused`: the layout of one document of that length written into
    /// `slot`'s staging once, then the kernel recorded over the slot.
    fn record_short(
        &self,
        slot: &mut Slot,
        fused: &FusedKernel,
        text_len: u32,
    ) -> Result<AnyGraph, TokenizerError> {
        self.write_layout(slot, &Layout::one_document(text_len))?;
        let bindings = self.bindings(slot, &fused.bindings)?;
        self.backend
            .record(|recorder| {
                recorder.dispatch(
                    Dispatch::new(&fused.kernel, &bindings)
                        .workgroups([1, 1, 1])
                        .scalar(TEXT_LEN_SCALAR, text_len)
                        .scalar(DOCUMENTS_SCALAR, 1u32)
                        .readback(&NO_READBACK),
                )?;
                Ok(())
            })
            .map_err(|error| backend_error(&format!("recording {}", fused.name), error))
    }

    /// What the device counted for a finished chunk of `text_len` bytes in
    /// `slot`, and its fused kernel's step clocks (none where it ran a dispatch
    /// per step).
    fn counts_of(
        &self,
        slot: &Slot,
        text_len: u64,
    ) -> Result<(EncodeCounts, Vec<StepClock>), TokenizerError> {
        let read = |role| {
            self.backend
                .read::<u32>(slot.buffer(role)?)
                .map_err(|error| backend_error("reading the counts", error))
        };
        let pieces = read(Role::PieceCount)?.first().copied().unwrap_or(0);
        let params = read(Role::Params)?;
        let clocks = match self.fused_kernel(text_len) {
            Some(fused) => fused
                .step_names
                .iter()
                .zip(params.iter().skip(param::STEP_CLOCK as usize))
                .map(|(&name, &end)| StepClock {
                    name,
                    end: u64::from(end),
                })
                .collect(),
            None => Vec::new(),
        };
        Ok((EncodeCounts::of(&params, pieces), clocks))
    }
}

/// A chunk's document count as the fused kernels' `documents` scalar.
fn dispatch_documents(documents: usize) -> Result<u32, TokenizerError> {
    u32::try_from(documents)
        .map_err(|_| internal(format!("a chunk of {documents} documents in one dispatch")))
}

fn to_backend(error: TokenizerError) -> BackendError {
    BackendError::BadInput {
        message: error.message().to_owned(),
    }
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A host-visible buffer: host-mapped pinned memory on CUDA (device memory
/// where the device cannot map it), the reference's memory otherwise.
fn host_visible_buffer(backend: &AnyBackend, bytes: u64) -> Result<DeviceBuffer, BackendError> {
    match backend {
        AnyBackend::Cuda(gpu) => gpu
            .host_mapped_buffer(bytes)
            .or_else(|_| backend.buffer(bytes)),
        _ => backend.buffer(bytes),
    }
}

/// A text to gather into a resident kernel's staging: its parts, its length
/// and the crew that shares the gather.
struct Fed<'t> {
    texts: &'t [&'t [u8]],
    text_len: usize,
    helpers: Option<&'t Helpers>,
    /// Whether to gather during the replay where the buffers allow
    /// ([`DeviceEncoder::with_text_fed`]); before it otherwise.
    while_running: bool,
    /// Ids the caller's thread read in place, demoted from its core's caches
    /// while the device runs.
    lent: LentIds<'t>,
}

/// One replay of `graph`, whose resident kernel reads `staged_text` as the
/// flags in `ready` go up ([`ready_stage`](super::programs::ready_stage)),
/// with `fed` gathered into it; returns the replay's timings and the
/// gather's host time. Where both buffers are host-mapped (CUDA) the flags
/// are cleared, the graph launched, and the text gathered while the kernel
/// runs, each piece's flag set after it (`AnyGraph::replay_feeding`); the
/// crew is then woken for the device wait. Elsewhere (the reference, whose
/// replay runs at once), and where `fed` asks for it, the text and every
/// flag are written first.
fn replay_fed(
    backend: &AnyBackend,
    graph: &mut AnyGraph,
    staged_text: &mut DeviceBuffer,
    ready: &mut DeviceBuffer,
    fed: Fed<'_>,
) -> Result<(Timings, u64), TokenizerError> {
    let Fed {
        texts,
        text_len,
        helpers,
        while_running,
        lent,
    } = fed;
    let wake = || while_the_device_runs(helpers, lent);
    let failed = |error| backend_error("replaying the resident kernel", error);
    let words = ready.host_words().ok().filter(|_| while_running);
    if let (true, Some(words)) = (staged_text.is_host_mapped(), words) {
        let flags = ReadyFlags::new(words, text_len)?;
        flags.clear();
        let (timings, gathered) = graph
            .replay_feeding(staged_text, |bytes| {
                let start = Instant::now();
                let gathered = match bytes.get_mut(..text_len) {
                    Some(out) => hand_out_helpers::gather(out, texts, helpers, Some(flags)),
                    None => {
                        flags.publish_all();
                        Err(internal(format!(
                            "{text_len} text bytes in {} of staging",
                            bytes.len()
                        )))
                    }
                };
                let gathered_ns = elapsed_ns(start);
                wake();
                gathered.map(|()| gathered_ns)
            })
            .map_err(failed)?;
        return Ok((timings, gathered?));
    }
    let start = Instant::now();
    write_host_visible(backend, staged_text, Some(graph), |out| {
        let out = out
            .get_mut(..text_len)
            .ok_or_else(|| internal(format!("{text_len} text bytes of staging")))?;
        hand_out_helpers::gather(out, texts, helpers, None)
    })?;
    let gathered_ns = elapsed_ns(start);
    publish_ready(backend, ready, Some(graph), text_len)?;
    let (timings, ()) = graph.replay_beside(wake).map_err(failed)?;
    Ok((timings, gathered_ns))
}

/// What the calling thread does once a kernel runs: wakes the hand-out
/// helpers for the wait, then demotes the ids it was lent ([`LentIds`])
/// while the device computes.
fn while_the_device_runs(helpers: Option<&Helpers>, lent: LentIds<'_>) {
    if let Some(helpers) = helpers {
        helpers.wake();
    }
    lent.demote();
}

/// Ids the caller read in place from host-mapped memory that a later kernel
/// writes again, to demote from the calling core's caches
/// ([`demote_from_core_caches`]) while a kernel runs: the device's write of a
/// line the host holds waits for the host to give it up. Measured on an H100
/// host (2026-12-07, the `gpu_encode` bench, one 256 KiB document encoded
/// again and again, its ids read after every encode; two runs of two rounds
/// each, alternating with the build before): into a reused [`BatchIds`],
/// prose 73.2–74.5 µs an encode against 79.0–82.8 (never read: 72.9–74.2),
/// code 84.2–84.6 against 88.2–88.8, CJK 80.9–81.7 against 80.9–82.1; as a
/// graph read in place, CJK 73.7–76.2 against 78.7–83.9 once its demote was
/// cut to what the kernel outlasts ([`LentIds::within_a_kernel_of`]), prose
/// 68.2–68.8 against 69.5–69.7, code 79.1–79.5 against 79.0–79.4.
#[derive(Clone, Copy, Debug)]
enum LentIds<'a> {
    None,
    /// An [`EncodeGraph`]'s ids buffer, lent by its last replay and written
    /// by the next one.
    Graph(&'a [AtomicU32]),
    /// A [`BatchIds`] part's ids from the batch before, which the part gives
    /// a slot at this encode's hand-out for the encode after to write.
    Part(&'a [u32]),
}

/// Text bytes a kernel runs for each id lent to it to demote
/// ([`LentIds::within_a_kernel_of`]).
const TEXT_BYTES_PER_DEMOTED_ID: usize = 2;

impl<'a> LentIds<'a> {
    /// The first `count` ids of a graph's `ids` where the host reads them in
    /// place (a host-mapped buffer), as words the device writes again, lent
    /// while a replay of `text_len` bytes runs; none otherwise.
    fn graph(ids: &'a DeviceBuffer, count: usize, text_len: usize) -> Self {
        match ids.host_words() {
            Ok(words) => LentIds::Graph(&words[..count.min(words.len())]),
            Err(_) => LentIds::None,
        }
        .within_a_kernel_of(text_len)
    }

    /// A [`BatchIds`] part's `ids` read in place, lent while a chunk of
    /// `text_len` bytes runs.
    fn part(ids: &'a [u32], text_len: usize) -> Self {
        LentIds::Part(ids).within_a_kernel_of(text_len)
    }

    /// The first of these ids, as many as the calling thread demotes before a
    /// kernel of `text_len` text bytes ends: at most one id for every
    /// [`TEXT_BYTES_PER_DEMOTED_ID`] bytes. What bounds it, on the H100 hosts'
    /// Xeons (2026-12-07): a demote takes about 6 ns a 64-byte line (16 ids)
    /// and the resident kernel 59–72 µs for 256 KiB, so 131,072 ids, 8,192
    /// lines, about 49 µs, end inside it. That is every id of 256 KiB of
    /// prose (120,020) or code (70,511) and 64 % of CJK's (206,380, whose
    /// 12,900 lines take about 77 µs: every one of them, demoted while a
    /// 256 KiB document went into a reused [`BatchIds`] read after every
    /// encode, outlasted the kernel: 106.8–117.2 µs an encode against
    /// 81.1–94.5 without the demote, the `gpu_encode` bench, alternating
    /// builds in one run; cut, 80.9–81.7 against 80.9–82.1).
    fn within_a_kernel_of(self, text_len: usize) -> Self {
        let at_most = text_len / TEXT_BYTES_PER_DEMOTED_ID;
        match self {
            LentIds::None => LentIds::None,
            LentIds::Graph(words) => LentIds::Graph(&words[..at_most.min(words.len())]),
            LentIds::Part(ids) => LentIds::Part(&ids[..at_most.min(ids.len())]),
        }
    }

    fn demote(self) {
        match self {
            LentIds::None => {}
            LentIds::Graph(words) => demote_from_core_caches(words),
            LentIds::Part(ids) => demote_from_core_caches(ids),
        }
    }
}

/// Sets the ready flags of a text of `text_len` bytes before a launch of
/// the resident kernel whose text is already staged (every path that does
/// not feed it while it runs).
fn publish_ready(
    backend: &AnyBackend,
    ready: &mut DeviceBuffer,
    graph: Option<&mut AnyGraph>,
    text_len: usize,
) -> Result<(), TokenizerError> {
    if let Ok(words) = ready.host_words() {
        ReadyFlags::new(words, text_len)?.publish_all();
        return Ok(());
    }
    write_host_visible(backend, ready, graph, |out| {
        text_ready::write_all_set(out, text_len)
    })
}

/// Fills the start of a host-visible buffer with `fill`: in place in mapped
/// memory (beside `graph` when a graph binds it, between its replays),
/// through one upload otherwise.
fn write_host_visible(
    backend: &AnyBackend,
    buffer: &mut DeviceBuffer,
    graph: Option<&mut AnyGraph>,
    fill: impl FnOnce(&mut [u8]) -> Result<(), TokenizerError>,
) -> Result<(), TokenizerError> {
    if buffer.is_host_mapped() {
        let bytes = match graph.and_then(AnyGraph::as_cuda) {
            Some(graph) => buffer.mapped_bytes_mut_beside(graph),
            None => buffer.mapped_bytes_mut(),
        }
        .map_err(|error| backend_error("staging the chunk", error))?;
        return fill(bytes);
    }
    let mut bytes = vec![0u8; buffer.len() as usize];
    fill(&mut bytes)?;
    backend
        .upload(buffer, &bytes)
        .map_err(|error| backend_error("staging the chunk", error))
}

/// The first `count` words of a host-visible buffer, where they are: in place
/// in mapped memory (beside `graph` when a graph holds it), else read back
/// into `scratch`.
fn host_visible_words<'a>(
    backend: &AnyBackend,
    buffer: &'a mut DeviceBuffer,
    graph: Option<&'a mut AnyGraph>,
    count: usize,
    scratch: &'a mut Vec<u32>,
) -> Result<&'a [u32], TokenizerError> {
    if count as u64 * 4 > buffer.len() {
        return Err(internal(format!(
            "a read of {count} words from a buffer of {} bytes",
            buffer.len()
        )));
    }
    if buffer.is_host_mapped() {
        let bytes = match graph.and_then(AnyGraph::as_cuda) {
            Some(graph) => buffer.mapped_bytes_beside(graph),
            None => buffer.mapped_bytes(),
        }
        .map_err(|error| backend_error("reading the ids", error))?;
        return match bytemuck::try_cast_slice::<u8, u32>(&bytes[..count * 4]) {
            Ok(words) if cfg!(target_endian = "little") => Ok(words),
            _ => Err(internal(
                "host-mapped memory that is not word-aligned little-endian words".to_owned(),
            )),
        };
    }
    scratch.clear();
    scratch.resize(count, 0);
    if count > 0 {
        backend
            .read_into(buffer, scratch)
            .map_err(|error| backend_error("reading the ids", error))?;
    }
    Ok(scratch)
}

/// Little-endian words into the start of `out`.
fn copy_words(out: &mut [u8], words: &[u32]) {
    for (chunk, word) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
}

/// A chunk on the device: [`PendingEncode::wait`] gives each document its ids.
/// Dropping it waits for the device and gives the buffers back.
#[must_use = "a pending encode holds its buffers until it is waited for"]
pub struct PendingEncode<'e> {
    encoder: &'e DeviceEncoder,
    slot: Option<Slot>,
    pending: Vec<PendingDispatch>,
    /// Which fused kernel's slot graph the chunk replayed, and the replay's
    /// timings (it has ended: [`DeviceEncoder::replay_fused`]).
    replayed: Option<(Spread, Timings)>,
    /// Threads spinning through the device wait to share the hand-out
    /// ([`hand_out_helpers`]), for a chunk the caller waits for at once.
    helpers: Option<Helpers>,
    /// The chunk's text bytes: which steps it runs.
    text_len: u64,
    documents: usize,
    start: Instant,
    submit_ns: u64,
    staged_ns: u64,
    gathered_ns: u64,
    want_counts: bool,
}

impl std::fmt::Debug for PendingEncode<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingEncode")
            .field("documents", &self.documents)
            .field("steps", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl<'e> PendingEncode<'e> {
    /// Waits for the device and returns each document's ids.
    pub fn wait(self) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let mut results = vec![Vec::new(); self.documents];
        self.wait_into(&mut results)?;
        Ok(results)
    }

    /// [`PendingEncode::wait`] into `results` (one per document, each
    /// replaced), with the chunk's timings.
    pub fn wait_into(self, results: &mut [Vec<u32>]) -> Result<ChunkTimings, TokenizerError> {
        if results.len() != self.documents {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: wait_into got {} result vectors for {} documents; pass one per document",
                    results.len(),
                    self.documents
                ),
            ));
        }
        self.finish()?.hand_out(ChunkIds::Vectors(results))
    }

    /// Waits for every step (and reads the counts when asked for) and gives
    /// the chunk's room on the device back; its ids stay in its slot for
    /// [`FinishedChunk::hand_out`], which may run on another thread.
    fn finish(mut self) -> Result<FinishedChunk<'e>, TokenizerError> {
        let mut timings = ChunkTimings {
            submit_ns: self.submit_ns,
            staged_ns: self.staged_ns,
            gathered_ns: self.gathered_ns,
            replayed: self.replayed.is_some(),
            ..ChunkTimings::default()
        };
        let slot = self.slot.take();
        if let Some(staged) = &slot {
            let waited = self.wait_steps(&mut timings).and_then(|()| {
                timings.ready_ns = elapsed_ns(self.start);
                if self.want_counts {
                    let (counts, clocks) = self.encoder.counts_of(staged, self.text_len)?;
                    timings.counts = Some(counts);
                    timings.step_clocks = clocks;
                }
                Ok(())
            });
            // The admission counts chunks whose dispatches are pending: none now.
            self.encoder.admission.release();
            if let Err(error) = waited {
                if let Some(slot) = slot {
                    self.encoder.give_back(slot);
                }
                return Err(error);
            }
        } else if self.want_counts {
            timings.counts = Some(EncodeCounts::default());
        }
        Ok(FinishedChunk {
            encoder: self.encoder,
            slot,
            helpers: self.helpers.take(),
            documents: self.documents,
            start: self.start,
            timings,
        })
    }

    /// Waits for every step, the last first (its wait covers the chain; the
    /// others then find idle streams), into `timings.steps`.
    fn wait_steps(&mut self, timings: &mut ChunkTimings) -> Result<(), TokenizerError> {
        let pending = std::mem::take(&mut self.pending);
        let encoder = self.encoder;
        let steps = encoder.programs_for(self.text_len).steps();
        // Each dispatch's step name and program name.
        let fused = encoder
            .fused_kernel(self.text_len)
            .filter(|_| self.text_len > 0);
        let names: Vec<(&'static str, &str)> = match fused {
            Some(fused) => vec![(fused.spread.step_name(), &fused.name)],
            _ => steps
                .iter()
                .map(|step| (step.name, step.program_name()))
                .collect(),
        };
        timings.steps = names
            .iter()
            .map(|&(name, _)| StepTimings {
                name,
                timings: Timings::default(),
            })
            .collect();
        if let Some((spread, replayed)) = self.replayed.take() {
            timings.steps = vec![StepTimings {
                name: spread.step_name(),
                timings: replayed,
            }];
            return Ok(());
        }
        let mut first_error = None;
        for (index, submitted) in pending.into_iter().enumerate().rev() {
            match submitted.wait() {
                Ok(done) => timings.steps[index].timings = done.timings,
                Err(error) => {
                    first_error.get_or_insert_with(|| {
                        backend_error(&format!("running {}", names[index].1), error)
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A chunk whose steps are done: its ids wait in its slot's host-visible
/// memory until [`FinishedChunk::hand_out`]. Dropping it gives the slot back.
struct FinishedChunk<'e> {
    encoder: &'e DeviceEncoder,
    /// `None` for an empty chunk.
    slot: Option<Slot>,
    /// Threads spinning to share the hand-out, where the chunk has them.
    helpers: Option<Helpers>,
    documents: usize,
    /// When staging began.
    start: Instant,
    timings: ChunkTimings,
}

impl FinishedChunk<'_> {
    /// Gives each document its ids (into `destination`: one vector per
    /// document, each replaced, or a part of a [`BatchIds`]), on the copy
    /// pool; the chunk's timings.
    fn hand_out(mut self, destination: ChunkIds<'_>) -> Result<ChunkTimings, TokenizerError> {
        let mut timings = std::mem::take(&mut self.timings);
        let backend = &self.encoder.backend;
        let start = Instant::now();
        match (self.slot.as_mut(), destination) {
            (Some(slot), ChunkIds::Vectors(results)) => {
                let helpers = self.helpers.take();
                timings.copy_ns = hand_out_chunk(backend, slot, self.documents, results, helpers)?;
            }
            (Some(slot), ChunkIds::Part(part)) => {
                timings.copy_ns = hand_out_part(backend, slot, self.documents, part)?;
                // No copy to share (the part reads the ids in place): the crew
                // lingers for the next encode's staging.
                if let Some(helpers) = self.helpers.take() {
                    helpers.linger();
                }
            }
            (None, ChunkIds::Vectors(results)) => results.iter_mut().for_each(Vec::clear),
            (None, ChunkIds::Part(part)) => {
                part.set_starts(&vec![0; self.documents + 1]);
                part.copy_from(&[]);
            }
        }
        timings.scatter_ns = elapsed_ns(start);
        timings.wall_ns = elapsed_ns(self.start);
        Ok(timings)
    }
}

/// Where a chunk's ids go: one vector per document, or a part of a
/// [`BatchIds`].
enum ChunkIds<'r> {
    Vectors(&'r mut [Vec<u32>]),
    Part(&'r mut Part),
}

impl Drop for FinishedChunk<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.encoder.give_back(slot);
        }
    }
}

/// Reads the document starts and the ids of a finished chunk and gives each of
/// its `documents` documents its ids (shared with `helpers` where the chunk
/// has them); the host time of the ids' copy to the host, where the slot
/// takes one.
fn hand_out_chunk(
    backend: &AnyBackend,
    slot: &mut Slot,
    documents: usize,
    results: &mut [Vec<u32>],
    helpers: Option<Helpers>,
) -> Result<u64, TokenizerError> {
    let mut scratch = Vec::new();
    let (starts, ids, copy_ns) = chunk_ids(backend, slot, None, documents, &mut scratch)?;
    hand_out_helpers::hand_out(ids, &starts, results, helpers)?;
    Ok(copy_ns)
}

/// A finished chunk's document starts (its `documents` first id indices, then
/// its total), its ids where they are (the slot's host-mapped `ids`, read
/// beside `graph` when a graph binds it; the slot's pinned `ids_host`, where
/// the copy engine first brings them from device memory; or `scratch`, read
/// back into it on the reference backend), and the host time of that copy (0
/// for the others).
fn chunk_ids<'a>(
    backend: &AnyBackend,
    slot: &'a mut Slot,
    mut graph: Option<&'a mut AnyGraph>,
    documents: usize,
    scratch: &'a mut Vec<u32>,
) -> Result<(Vec<u32>, &'a [u32], u64), TokenizerError> {
    let (starts, total) = read_starts(backend, slot, graph.as_deref_mut(), documents)?;
    if slot.transfers().ids_by_copy_engine {
        // Exactly the chunk's ids, by the copy engine, into host memory that no
        // graph binds.
        let start = Instant::now();
        let Slot {
            ids_host: Some(host),
            buffers,
            ..
        } = slot
        else {
            return Err(internal("a slot without its ids' staging".to_owned()));
        };
        let device = buffers[Role::Ids as usize]
            .as_ref()
            .ok_or_else(|| internal("a slot without its ids buffer".to_owned()))?;
        backend
            .copy(device, 0, host, 0, 4 * total as u64)
            .map_err(|error| backend_error("copying the ids to the host", error))?;
        let copy_ns = elapsed_ns(start);
        let ids = host_visible_words(backend, host, None, total, scratch)?;
        return Ok((starts, ids, copy_ns));
    }
    let (buffer, own) = slot.buffer_beside_graph(Role::Ids)?;
    let ids = host_visible_words(backend, buffer, graph.or(own), total, scratch)?;
    Ok((starts, ids, 0))
}

/// The first id index of each of a finished chunk's `documents` documents,
/// then the chunk's total, checked against the room its ids had; and the total.
fn read_starts(
    backend: &AnyBackend,
    slot: &mut Slot,
    graph: Option<&mut AnyGraph>,
    documents: usize,
) -> Result<(Vec<u32>, usize), TokenizerError> {
    let mut scratch = Vec::new();
    let (buffer, own) = slot.buffer_beside_graph(Role::DocumentTokenStarts)?;
    let starts =
        host_visible_words(backend, buffer, graph.or(own), documents + 1, &mut scratch)?.to_vec();
    let total = starts.last().copied().unwrap_or(0) as usize;
    let ids_capacity = slot.buffer(Role::Ids)?.len() as usize / 4;
    if total > ids_capacity || starts.first() != Some(&0) {
        return Err(internal(format!(
            "the device counted {total} tokens (first document at {:?}) with room for {ids_capacity}",
            starts.first()
        )));
    }
    Ok((starts, total))
}

/// Reads the document starts and the ids of a finished chunk into `part`: by
/// the copy engine straight into its pinned memory where the chunk's ids are
/// in device memory, else by taking the slot's host-mapped ids buffer itself
/// ([`Part::take_mapped`], the slot getting the part's earlier one), or, where
/// it cannot, by copying out of it; the host time of the copy engine's copy
/// (0 for the others).
fn hand_out_part(
    backend: &AnyBackend,
    slot: &mut Slot,
    documents: usize,
    part: &mut Part,
) -> Result<u64, TokenizerError> {
    let (starts, total) = read_starts(backend, slot, None, documents)?;
    let mut copy_ns = 0;
    if slot.transfers().ids_by_copy_engine {
        let start = Instant::now();
        part.download(backend, slot.buffer(Role::Ids)?, total)?;
        copy_ns = elapsed_ns(start);
    } else {
        let (ids, mut fused) = slot.buffer_and_fused(Role::Ids)?;
        // The slot's graph follows the buffer the part leaves in the slot.
        let mut rebind = |replacement: &DeviceBuffer| match fused.as_mut() {
            Some(kept) => kept
                .graph
                .set_buffer(kept.step, kept.ids_binding, replacement)
                .map_err(|error| backend_error("rebinding the slot's graph to its ids", error)),
            None => Ok(()),
        };
        if !part.take_mapped(backend, ids, total, &mut rebind)? {
            let mut scratch = Vec::new();
            let (buffer, graph) = slot.buffer_beside_graph(Role::Ids)?;
            part.copy_from(host_visible_words(
                backend,
                buffer,
                graph,
                total,
                &mut scratch,
            )?);
        }
    }
    part.set_starts(&starts);
    Ok(copy_ns)
}

impl Drop for PendingEncode<'_> {
    fn drop(&mut self) {
        // Waiting happens in the pending dispatches' own drops; the slot goes back
        // only once they are done.
        self.pending.clear();
        if let Some(slot) = self.slot.take() {
            self.encoder.give_back(slot);
            self.encoder.admission.release();
        }
    }
}

/// The encode of texts of one length recorded as one graph
/// ([`DeviceEncoder::graph`]): every encode is the text into the graph's
/// pinned input slot (or, for the short-text kernel, the slot's host-mapped
/// staging), one replay (the split and the BPE steps) and the ids read in
/// place.
pub struct EncodeGraph<'e> {
    encoder: &'e DeviceEncoder,
    graph: Option<AnyGraph>,
    slot: Option<Slot>,
    /// Where a replay finds the text.
    inputs: GraphInputs,
    text_len: u32,
    /// The ids read back on the reference backend, whose buffers are not
    /// host-mapped ([`EncodeGraph::encode_in_place`] lends them from here).
    read_back: Vec<u32>,
    /// How many ids the last replay lent the caller in place (0: it handed
    /// them out): the caller's thread has read them since, so the next replay
    /// demotes them from its core's caches before the device writes there
    /// (where they are the host-mapped ids buffer; a slot whose ids come by
    /// the copy engine, from [`COPY_ENGINE_FROM`], lends its staging, which is
    /// not demoted: never measured).
    ids_lent: usize,
}

/// Where an [`EncodeGraph`]'s replay finds its text.
#[derive(Clone, Copy)]
enum GraphInputs {
    /// The graph's pinned input slots of params, text and document ends, which
    /// its first nodes upload.
    Uploads([InputSlot; 3]),
    /// The graph's pinned input slot of the text alone, which its first node
    /// uploads for the resident-grid kernel (the length and the one document
    /// are its scalars).
    Text(InputSlot),
    /// The slot's host-visible staging, which the short-text kernel reads in
    /// place: the layout written when the graph was recorded, the text before
    /// each replay.
    Staging,
    /// The slot's host-visible staging, which the resident-grid kernel of a
    /// slot below [`TEXT_COPY_ENGINE_FROM`] reads in place as its ready flags
    /// go up: the layout written when the graph was recorded, the text during
    /// each replay ([`replay_fed`]).
    Fed,
}

impl std::fmt::Debug for EncodeGraph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodeGraph")
            .field("text_len", &self.text_len)
            .finish_non_exhaustive()
    }
}

impl EncodeGraph<'_> {
    /// The text length it was recorded for.
    pub fn text_len(&self) -> usize {
        self.text_len as usize
    }

    /// The dispatches a replay runs: 1 for a text that runs the short-text
    /// kernel, every step but `stage` for any other.
    pub fn dispatches(&self) -> usize {
        self.graph.as_ref().map_or(0, AnyGraph::step_count)
    }

    /// The ids of `text` (exactly [`EncodeGraph::text_len`] bytes).
    pub fn encode(&mut self, text: &[u8]) -> Result<Vec<u32>, TokenizerError> {
        self.encode_timed(text).map(|(ids, _)| ids)
    }

    /// [`EncodeGraph::encode`] with the replay's timings.
    pub fn encode_timed(&mut self, text: &[u8]) -> Result<(Vec<u32>, Timings), TokenizerError> {
        let mut ids = Vec::new();
        let timings = self.encode_into(text, &mut ids)?;
        Ok((ids, timings))
    }

    /// [`EncodeGraph::encode_timed`] into `ids` (its contents replaced, its
    /// capacity kept when it has room): a caller that encodes one length again
    /// and again allocates and first touches the ids' memory once, as
    /// [`DeviceEncoder::encode_batch_into`] does for batches. On the H200 a new
    /// vector of a 256 KiB text's 56,000 ids is 55 pages of first touch per encode.
    pub fn encode_into(
        &mut self,
        text: &[u8],
        ids: &mut Vec<u32>,
    ) -> Result<Timings, TokenizerError> {
        let (in_place, timings, helpers) = self.replay(text, false)?;
        let total = u32::try_from(in_place.len())
            .map_err(|_| internal(format!("{} ids of one graph", in_place.len())))?;
        hand_out_helpers::hand_out(in_place, &[0, total], std::slice::from_mut(ids), helpers)?;
        Ok(timings)
    }

    /// The ids of `text` where the device wrote them, and the replay's
    /// timings: no copy into the caller's memory at all. On CUDA the slice is
    /// the graph's host-mapped ids buffer itself (the copy engine's pinned
    /// staging for texts from 1 MiB); the borrow of `self` keeps the next
    /// replay from writing it while the caller reads. Why: the copy of the ids
    /// into a vector was the whole of the eager hand-out's cost for one 256 KiB
    /// document on the H200 (2026-12-05: 142.2 µs eager into vectors against
    /// 122.6 µs into a reused [`BatchIds`], which reads them
    /// in place, for prose; 177.5 against 137.0 for CJK).
    ///
    /// It hands nothing out, yet it wakes the encoder's hand-out helpers
    /// ([`DeviceEncoder::with_hand_out_helpers`]) as the other encodes do: they
    /// share the staging, spin through the device wait and linger for the next
    /// encode. The spinning is for the kernel, which reads the text and writes
    /// the ids across PCIe: with threads spinning its own clock is shorter,
    /// most likely because a host whose cores idle serves those reads and
    /// writes more slowly. On an H100 (2026-12-06, the `gpu_encode` bench, two
    /// runs of three alternating rounds, one 256 KiB document, median of 200
    /// each) three helpers took prose 91.2–96.0 µs against 96.6–103.7 without
    /// helpers (its kernel 60.0–66.8 against 68.4–73.2 by its own clock), CJK
    /// 105.3–106.6 against 108.4–119.5 and code 114.5–119.3 against
    /// 121.1–125.3.
    ///
    /// The caller's thread reads the ids it is lent, so they sit in its core's
    /// caches when the next replay's kernel writes the next ids over them, and
    /// each such write waits for the core to give its line up. The next
    /// encode of this graph therefore demotes the lent ids from the calling
    /// core's caches to the CPU's shared cache
    /// ([`demote_from_core_caches`]) while the device runs the steps before
    /// it writes ids, as many as it does before the kernel ends (one id for
    /// every two text bytes). On an H100 host (Intel Xeon; 2026-12-07, the
    /// `gpu_encode` bench, one 256 KiB document, two rounds alternating with
    /// the build before, the ids read after every encode) prose took
    /// 69.6–70.7 µs against 77.9–81.0, code 79.3–81.0 against 84.4–87.8; CJK
    /// (806 KiB of ids, about 12,900 lines at some 6 ns each: longer than the
    /// kernel's wait) 81.2–91.3 against 90.0–94.1 with every id demoted, and
    /// 73.7–76.2 against 78.7–83.9 on another host the same evening with the
    /// demote cut to two thirds of them.
    ///
    /// ```
    /// use vyre_cuda::backend::AnyBackend;
    /// use vyre_tokenizer::{device::DeviceEncoder, Tokenizer};
    ///
    /// let tokenizer = Tokenizer::cl100k_base()?;
    /// let encoder = DeviceEncoder::new(AnyBackend::cuda_or_reference(), &tokenizer)?;
    /// let mut graph = encoder.graph(13)?;
    /// for text in ["Hello, world!", "HELLO, WORLD!"] {
    ///     let (ids, _timings) = graph.encode_in_place(text.as_bytes())?;
    ///     assert_eq!(ids, &tokenizer.encode_ordinary(text)[..]);
    /// }
    /// # Ok::<(), vyre_tokenizer::TokenizerError>(())
    /// ```
    pub fn encode_in_place(&mut self, text: &[u8]) -> Result<(&[u32], Timings), TokenizerError> {
        self.replay(text, true).map(|(ids, timings, helpers)| {
            if let Some(helpers) = helpers {
                helpers.linger();
            }
            (ids, timings)
        })
    }

    /// One replay for `text`: its ids where the device wrote them, the
    /// replay's timings, and the hand-out helpers' crew where the encoder asks
    /// for it, which shared the staging and was woken while the device
    /// computed (also for ids read in place: a host with threads spinning
    /// through the wait runs the kernel's PCIe reads and writes faster).
    ///
    /// `lent`: the caller reads this replay's ids in place (the next replay
    /// then demotes them, [`EncodeGraph::ids_lent`]).
    fn replay(
        &mut self,
        text: &[u8],
        lent: bool,
    ) -> Result<(&[u32], Timings, Option<Helpers>), TokenizerError> {
        if text.len() != self.text_len as usize {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: this EncodeGraph was recorded for {} bytes but the text has {}; record one for {} bytes",
                    self.text_len,
                    text.len(),
                    text.len()
                ),
            ));
        }
        let encoder = self.encoder;
        let helpers = encoder.crew_for(u64::from(self.text_len), true);
        let (Some(graph), Some(slot)) = (self.graph.as_mut(), self.slot.as_mut()) else {
            return Err(internal("the encode graph is gone".to_owned()));
        };
        let texts = [text];
        let backend = &encoder.backend;
        match self.inputs {
            GraphInputs::Uploads(inputs) => {
                let mut params = [0u32; param::WORDS as usize];
                params[param::TEXT_LEN as usize] = self.text_len;
                params[param::DOCUMENTS as usize] = 1;
                copy_words(input(graph, inputs[0])?, &params);
                let text_input = input(graph, inputs[1])?;
                hand_out_helpers::gather(text_input, &texts, helpers.as_ref(), None)?;
                // Padded with the text length: empty documents to the buffer's end.
                input(graph, inputs[2])?
                    .chunks_exact_mut(4)
                    .for_each(|word| word.copy_from_slice(&self.text_len.to_le_bytes()));
            }
            GraphInputs::Text(input_slot) => {
                let text_input = input(graph, input_slot)?;
                hand_out_helpers::gather(text_input, &texts, helpers.as_ref(), None)?;
                // The resident kernel reads its text once the flags are set.
                let ready = slot.buffer_mut(Role::TextReady)?;
                publish_ready(backend, ready, Some(graph), text.len())?;
            }
            GraphInputs::Staging => write_host_visible(
                backend,
                slot.buffer_mut(Role::StagedText)?,
                Some(graph),
                |out| {
                    let out = out.get_mut(..text.len()).ok_or_else(|| {
                        internal(format!("a graph's text of {} bytes", text.len()))
                    })?;
                    hand_out_helpers::gather(out, &texts, helpers.as_ref(), None)
                },
            )?,
            // Gathered during the replay, below.
            GraphInputs::Fed => {}
        }
        let timings = if let GraphInputs::Fed = self.inputs {
            let (_, [staged_text, ready], ids) = slot.text_ready_and_ids()?;
            let fed = Fed {
                texts: &texts,
                text_len: text.len(),
                helpers: helpers.as_ref(),
                while_running: encoder.feeds_text,
                lent: LentIds::graph(ids, self.ids_lent, text.len()),
            };
            replay_fed(backend, graph, staged_text, ready, fed)?.0
        } else {
            let lent = LentIds::graph(slot.buffer(Role::Ids)?, self.ids_lent, text.len());
            let replayed = graph.replay_beside(|| while_the_device_runs(helpers.as_ref(), lent));
            replayed
                .map_err(|error| backend_error("replaying the encode graph", error))?
                .0
        };
        let (_, ids, _) = chunk_ids(&encoder.backend, slot, Some(graph), 1, &mut self.read_back)?;
        self.ids_lent = if lent { ids.len() } else { 0 };
        Ok((ids, timings, helpers))
    }
}

impl Drop for EncodeGraph<'_> {
    fn drop(&mut self) {
        // The graph holds the slot's memory; it goes first.
        self.graph.take();
        if let Some(slot) = self.slot.take() {
            self.encoder.give_back(slot);
        }
    }
}

/// The bytes of a graph's input slot.
fn input(graph: &mut AnyGraph, slot: InputSlot) -> Result<&mut [u8], TokenizerError> {
    graph
        .input_mut(slot)
        .map_err(|error| backend_error("staging the graph's inputs", error))
}

/// The order in which a batch's chunks (of `lengths` text bytes, in text
/// order) go to the device: in text order, but a last chunk that runs as one
/// fused dispatch (`runs_fused`: a few KiB left over after the full chunks)
/// goes first. Submitted last, such a chunk waited for room behind the full
/// chunks and held up the hand-out of the chunk before it: on the H200
/// (2026-12-04, a 64 MiB cl100k batch, eight 8 MiB chunks and one of 30 KB)
/// chunk 5's ids began their way to the host 0.23 ms after its steps were
/// done, while the calling thread submitted the 30 KB chunk. Submitted first,
/// it runs while the first full chunk is gathered, when the device is idle.
fn submission_order(lengths: &[u64], runs_fused: impl Fn(u64) -> bool) -> Vec<usize> {
    let count = lengths.len();
    match lengths.last() {
        Some(&last) if count >= 2 && last > 0 && runs_fused(last) => {
            std::iter::once(count - 1).chain(0..count - 1).collect()
        }
        _ => (0..count).collect(),
    }
}

/// Consecutive ranges of whole documents within `limits` (a document over the
/// byte limit alone in its range). An empty batch has no range.
fn chunk_ranges(texts: &[&[u8]], limits: &ChunkLimits) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut first = 0;
    let mut bytes = 0u64;
    for (index, text) in texts.iter().enumerate() {
        let len = text.len() as u64;
        let full = index > first
            && (bytes + len > limits.text_bytes || (index - first) as u64 >= limits.documents);
        if full {
            ranges.push(first..index);
            first = index;
            bytes = 0;
        }
        bytes += len;
    }
    if first < texts.len() {
        ranges.push(first..texts.len());
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a pipeline that hands the crew of hand-out helpers the wrong
    /// buffers or lengths at any entry point (the crew's own copies are its
    /// module's tests): with the crew kept spinning through the reference
    /// backend's long waits, a 100 KB text submitted and waited for into a
    /// new and into a reused vector, encoded as a batch of one into vectors and
    /// into a `BatchIds`, and through a graph into a reused vector and read in
    /// place, each equal the CPU encoder, and the crew shared copies (staging
    /// and hand-out) along the way, the staging of the graph read in place
    /// too (negative control by hand: with the in-place replay taking no
    /// crew, as before 2026-12-06, 11 copies were shared and this test
    /// fails); (control) the same encoder without helpers shares none,
    /// and neither does one at the reference interpreter's default (which
    /// computes on the calling thread, so spinning helpers would only take
    /// its cores; a default of three there fails this test).
    #[test]
    fn the_crew_shares_a_lone_chunks_copies_at_every_entry_point() {
        use super::hand_out_helpers::test_support;
        use crate::pretokenize::text::{generate, Shape};
        let _only = test_support::one_at_a_time();
        let tokenizer = Tokenizer::cl100k_base().unwrap();
        let text = generate(Shape::Prose, 100_000, 7);
        let ids = tokenizer.encode_ordinary_bytes(&text);
        let step_by_step = ChunkLimits {
            short_text_bytes: 0,
            resident_text_bytes: 0,
            ..ChunkLimits::default()
        };
        for asked in [None, Some(0), Some(3)] {
            let mut encoder = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                Geometry::default(),
                step_by_step,
            )
            .unwrap();
            if let Some(helpers) = asked {
                encoder = encoder.with_hand_out_helpers(helpers, HELPED_FROM_TEXT_BYTES);
            }
            // The reference interpreter's default is none: nothing to wait
            // for spinning (a default that woke a crew would share at least
            // the hand-outs, since a wake precedes each).
            let helpers = asked.unwrap_or(0);
            test_support::spin_at_least(std::time::Duration::from_secs(120), helpers);
            // Each encode starts with the crew spinning (a loaded machine may
            // not have run the job a share leaves behind yet).
            let ready = || {
                if helpers > 0 {
                    test_support::until_spinning();
                }
            };
            let before = test_support::copies_shared();
            ready();
            let fresh = encoder.submit_bytes(&[&text]).unwrap().wait().unwrap();
            assert!(fresh[0] == ids, "{helpers} helpers: a new vector");
            let mut reused = [vec![7u32; 3]];
            for _ in 0..2 {
                ready();
                encoder
                    .submit_bytes(&[&text])
                    .unwrap()
                    .wait_into(&mut reused)
                    .unwrap();
                assert!(reused[0] == ids, "{helpers} helpers: a reused vector");
            }
            ready();
            let batch = encoder.encode_batch_bytes(&[&text]).unwrap();
            assert!(batch[0] == ids, "{helpers} helpers: a batch of one");
            let mut in_place = BatchIds::new();
            ready();
            encoder.encode_batch_ids(&[&text], &mut in_place).unwrap();
            assert!(
                in_place.get(0) == Some(&ids[..]),
                "{helpers} helpers: BatchIds"
            );
            let mut graph = encoder.graph(text.len()).unwrap();
            ready();
            graph.encode_into(&text, &mut reused[0]).unwrap();
            assert!(reused[0] == ids, "{helpers} helpers: a graph");
            ready();
            let (read, _) = graph.encode_in_place(&text).unwrap();
            assert!(read == ids, "{helpers} helpers: a graph read in place");
            let shared = test_support::copies_shared() - before;
            test_support::quiet();
            if helpers == 0 {
                assert_eq!(
                    shared, 0,
                    "{asked:?} helpers: an encoder without helpers shared a copy"
                );
            } else if crate::workers::available() > 1 {
                // Seven encodes, each a staging and (but the BatchIds and the
                // graph read in place) a hand-out.
                assert!(shared >= 12, "only {shared} copies shared");
            }
        }
    }

    /// Locks out a graph that demotes the wrong ids before a replay: the ids
    /// an in-place encode lent the caller (and only those: none after an
    /// encode into a vector, whose hand-out read them on other threads) are
    /// the ones the next replay demotes, and demoting them changes no id
    /// (texts of one length alternating, the short-text and the resident
    /// kernel's graphs on the reference backend). Control: a buffer that is
    /// not host-mapped (the reference backend's) lends nothing to demote,
    /// whatever the count.
    /// Negative control by hand: a replay that counts its ids lent whether or
    /// not it lends them fails the "handed out" assertion.
    #[test]
    fn a_graph_demotes_exactly_the_ids_it_lent() {
        use crate::pretokenize::text::{generate, Shape};
        let tokenizer = Tokenizer::cl100k_base().unwrap();
        let encoder = DeviceEncoder::new(AnyBackend::reference(), &tokenizer).unwrap();
        // The short-text kernel's graph (its text staged before the replay)
        // and the resident kernel's (its text fed while it runs).
        for len in [3_000, 12_000] {
            let texts = [
                generate(Shape::Prose, len, 1),
                generate(Shape::Code, len, 2),
            ];
            let mut graph = encoder.graph(len).unwrap();
            let mut into = Vec::new();
            for round in 0..4 {
                let text = &texts[round % 2];
                let ids = tokenizer.encode_ordinary_bytes(text);
                let (lent, _) = graph.encode_in_place(text).unwrap();
                assert!(lent == ids, "{len} bytes, round {round}: in place");
                assert_eq!(graph.ids_lent, ids.len(), "{len} bytes, round {round}");
                graph.encode_into(text, &mut into).unwrap();
                assert!(into == ids, "{len} bytes, round {round}: into a vector");
                assert_eq!(graph.ids_lent, 0, "{len} bytes, round {round}: handed out");
            }
            let slot = graph.slot.as_ref().unwrap();
            let ids = slot.buffer(Role::Ids).unwrap();
            assert!(!ids.is_host_mapped());
            assert!(matches!(LentIds::graph(ids, 1_000, len), LentIds::None));
        }
    }

    /// Locks out a demote that outlasts the kernel it runs beside (every id of
    /// 256 KiB of CJK, lent to an encode into a reused `BatchIds`, made it
    /// 25 µs slower): lent ids are cut to one for every
    /// `TEXT_BYTES_PER_DEMOTED_ID` text bytes, fewer are kept whole, and
    /// nothing lent stays nothing. Negative control by hand: lending a part's
    /// ids uncut fails the first assertion.
    #[test]
    fn lent_ids_are_cut_to_what_a_kernel_outlasts() {
        let ids: Vec<u32> = (0..1_000).collect();
        let cut = |lent: LentIds<'_>| match lent {
            LentIds::Part(ids) => Some(ids.len()),
            LentIds::Graph(words) => Some(words.len()),
            LentIds::None => None,
        };
        assert_eq!(
            cut(LentIds::part(&ids, 600)),
            Some(600 / TEXT_BYTES_PER_DEMOTED_ID)
        );
        assert_eq!(cut(LentIds::part(&ids, 1 << 20)), Some(1_000));
        assert_eq!(cut(LentIds::part(&ids, 0)), Some(0));
        assert_eq!(cut(LentIds::None.within_a_kernel_of(1 << 20)), None);
    }

    /// Locks out a wall line that calls everything but the kernels the host's
    /// share (the example did: 27–34 µs of "host" for a 1 KiB encode whose
    /// host work was 6–10 µs, the launch and the wait counted as host): the
    /// host is its own work (submitting, handing out), the rest is what neither
    /// it nor the kernels cover, and the three add up to the wall (here the
    /// wall minus the kernels, the old "host", would be 20.0 µs). Control: a
    /// chunk whose kernels and host work fill its wall has no rest.
    #[test]
    fn wall_line_splits_host_kernels_and_the_rest() {
        let mut kernel = Timings::default();
        kernel.kernel_stamps_ns = 20_000;
        kernel.enqueue_ns = 4_000;
        kernel.wait_ns = 25_000;
        let mut timings = ChunkTimings {
            wall_ns: 40_000,
            submit_ns: 5_500,
            staged_ns: 300,
            gathered_ns: 200,
            scatter_ns: 500,
            steps: vec![StepTimings {
                name: "short",
                timings: kernel,
            }],
            ..ChunkTimings::default()
        };
        let line = timings.wall_line();
        assert!(
            line.starts_with(
                "wall 40.0 µs = host 6.0 (staging and submitting 5.5, of it staging 0.3 with \
                 the text's gather 0.2; handing out 0.5) + kernels 20.0 (short 20.0) + launches, gaps and the wait 14.0;"
            ),
            "{line}"
        );
        assert!(
            line.ends_with("enqueued in 4.0 µs and waited 25.0 µs"),
            "{line}"
        );
        assert!(!line.contains("host 20.0"), "{line}");
        timings.wall_ns = 26_000;
        assert!(
            timings
                .wall_line()
                .contains("+ launches, gaps and the wait 0.0;"),
            "{}",
            timings.wall_line()
        );
    }

    /// Locks out chunks that break the limits or lose documents: the ranges tile
    /// the batch in order, each within the byte and document limits, a document
    /// over the byte limit alone in its range; an empty batch has none.
    #[test]
    fn chunk_ranges_tile_the_batch_within_the_limits() {
        let texts: Vec<Vec<u8>> = (0..40)
            .map(|index| vec![b'a'; (index * 37) % 300])
            .collect();
        let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let limits = ChunkLimits {
            text_bytes: 500,
            documents: 4,
            ..ChunkLimits::default()
        };
        let ranges = chunk_ranges(&refs, &limits);
        assert_eq!(ranges.first().map(|range| range.start), Some(0));
        assert_eq!(ranges.last().map(|range| range.end), Some(texts.len()));
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
        }
        for range in &ranges {
            let bytes: usize = refs[range.clone()].iter().map(|text| text.len()).sum();
            assert!(
                range.len() <= 4 && (bytes <= 500 || range.len() == 1),
                "{range:?}"
            );
        }
        let huge = [&[b'x'; 900][..], b"a", b"b"];
        assert_eq!(chunk_ranges(&huge, &limits), [0..1, 1..3]);
        assert!(chunk_ranges(&[], &limits).is_empty());
    }

    /// Locks out a batch's small last chunk submitted last, where it held up
    /// the hand-out of the chunk before it: it goes first when it runs fused,
    /// every other chunk keeps text order, and every chunk is submitted once;
    /// (negative controls) a last chunk that does not run fused, an empty one
    /// and a lone one stay where they are.
    #[test]
    fn a_small_last_chunk_is_submitted_first() {
        let fused = |len: u64| len <= 4096;
        assert_eq!(
            submission_order(&[8, 8, 8, 30], |len| len < 10 || len == 30),
            [3, 0, 1, 2]
        );
        assert_eq!(submission_order(&[9000, 9000, 100], fused), [2, 0, 1]);
        assert_eq!(submission_order(&[9000, 9000, 5000], fused), [0, 1, 2]);
        assert_eq!(submission_order(&[9000, 0], fused), [0, 1]);
        assert_eq!(submission_order(&[100], fused), [0]);
        assert!(submission_order(&[], fused).is_empty());
    }

    /// Locks out a batch of one chunk handing its ids out on a pool
    /// (waking a worker and waiting for it: 8.0–17.5 µs of host time per
    /// 1 KiB encode against the stand-in driver, 3.4 µs on the calling
    /// thread): a batch of no chunk or one runs its hand-out on the calling
    /// thread; (negative control) a batch of two or more on the hand-out pool.
    #[test]
    fn only_batches_of_several_chunks_hand_out_on_the_pool() {
        assert!(hand_out_pool(0).is_none());
        assert!(hand_out_pool(1).is_none());
        let pool = hand_out_pool(2).map(std::ptr::from_ref);
        assert!(pool.is_some(), "no hand-out pool on this machine");
        for chunks in [3, 128] {
            assert_eq!(
                hand_out_pool(chunks).map(std::ptr::from_ref),
                pool,
                "{chunks} chunks"
            );
        }
    }

    /// Locks out hand-outs queued behind the copy pool's work (the next
    /// chunk's gather), where a chunk's ids came down up to 4.8 ms late: while
    /// every worker of the copy pool is busy, a job on the hand-out pool runs;
    /// (negative control) a job spawned into the busy copy pool from outside
    /// it does not start until a worker is free.
    #[test]
    fn hand_outs_run_while_the_copy_pool_is_busy() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let copy = host_copy::pool().expect("no copy pool on this machine");
        let hand_outs = hand_out_pool(2).expect("no hand-out pool on this machine");
        assert!(!std::ptr::eq(copy, hand_outs));
        assert_eq!(hand_outs.current_num_threads(), HAND_OUTS_RUNNING);
        let waited = |done: &dyn Fn() -> bool| {
            let start = Instant::now();
            while !done() && start.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            done()
        };
        let workers = copy.current_num_threads();
        let started = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(AtomicBool::new(false));
        for _ in 0..workers {
            let (started, release) = (Arc::clone(&started), Arc::clone(&release));
            copy.spawn(move || {
                started.fetch_add(1, Ordering::SeqCst);
                while !release.load(Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            });
        }
        // Released on every exit, so that a failed assertion leaves the pool free.
        struct Release(Arc<AtomicBool>);
        impl Drop for Release {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _release = Release(Arc::clone(&release));
        assert!(
            waited(&|| started.load(Ordering::SeqCst) == workers),
            "the copy pool's workers never all took a job"
        );
        let handed_out = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&handed_out);
        hand_outs.spawn(move || flag.store(true, Ordering::SeqCst));
        assert!(
            waited(&|| handed_out.load(Ordering::SeqCst)),
            "a hand-out waited for the busy copy pool"
        );
        let queued = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&queued);
        copy.spawn(move || flag.store(true, Ordering::SeqCst));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !queued.load(Ordering::SeqCst),
            "a job started on the copy pool while all its workers were busy"
        );
        release.store(true, Ordering::SeqCst);
        assert!(waited(&|| queued.load(Ordering::SeqCst)));
    }

    /// Locks out a running hand-out count that never comes down (the staging
    /// thread would then wait forever for room): with two hand-outs running, a
    /// thread waiting for fewer than two returns once one ends normally and
    /// one ends by unwinding (its job panicked), and the count is back to 0.
    #[test]
    fn hand_outs_end_also_when_their_job_unwinds() {
        let hand_outs = HandOuts::default();
        let first = hand_outs.begin();
        let second = hand_outs.begin();
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| hand_outs.wait_below(1));
            drop(first);
            let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let _running = second;
                panic!("a hand-out job failing");
            }));
            assert!(unwound.is_err());
            waiter.join().unwrap();
        });
        assert_eq!(*hand_outs.running.lock().unwrap(), 0);
    }

    /// Locks out a parallel gather or scatter that misplaces bytes: 3 MiB of
    /// documents of many sizes gather into exactly their concatenation, and
    /// ids scatter back to exactly their documents, on all threads; (negative
    /// control) offsets that run backwards or past the ids are refused.
    #[test]
    fn gather_and_scatter_on_all_threads_keep_every_document() {
        let texts: Vec<Vec<u8>> = (0..3000)
            .map(|index| vec![(index % 251) as u8; (index * 7919) % 2000])
            .collect();
        let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let total: usize = refs.iter().map(|text| text.len()).sum();
        assert!(host_copy::copy_threads() > 1 || crate::workers::available() == 1);
        let mut out = vec![0u8; total];
        host_copy::gather(&mut out, &refs).unwrap();
        assert_eq!(out, texts.concat());
        let ids: Vec<u32> = (0..total as u32).collect();
        let mut starts = vec![0u32];
        for text in &texts {
            starts.push(starts.last().unwrap() + text.len() as u32);
        }
        let mut results = vec![Vec::new(); texts.len()];
        host_copy::hand_out(&ids, &starts, &mut results).unwrap();
        for (index, result) in results.iter().enumerate() {
            let (from, to) = (starts[index], starts[index + 1]);
            assert_eq!(*result, (from..to).collect::<Vec<u32>>());
        }
        let error = host_copy::hand_out(&ids, &[0, 5, 3], &mut results[..2]).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
        assert!(host_copy::hand_out(&ids[..2], &[0, 5], &mut results[..1]).is_err());
    }
}
