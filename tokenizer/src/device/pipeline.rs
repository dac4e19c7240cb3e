//! Running the BPE steps over batches of documents: buffers grown by powers of
//! two and reused, batches cut into chunks that fit, chunks submitted so that one
//! uploads while another computes, on a CUDA device or on the reference
//! interpreter through the same calls.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Instant;

use vyre_cuda::backend::{AnyBackend, Binding, DeviceBuffer, Dispatch, Kernel, PendingDispatch, Timings};
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

use super::programs::{blocks, param, Geometry, Programs, Role, Step, STEPS};
use super::vocabulary::DeviceVocabulary;
use crate::error::{ErrorKind, TokenizerError};
use crate::pretokenize::pattern::{Pattern, Splitter};
use crate::Tokenizer;

const ROLES: usize = Role::ALL.len();

/// Default most text bytes per chunk (64 MiB).
pub const CHUNK_TEXT_BYTES: u64 = 64 << 20;

/// Default most documents per chunk.
pub const CHUNK_DOCUMENTS: u64 = 1 << 20;

/// Chunks a batch is cut into at most, in flight at once.
pub const CHUNKS_IN_FLIGHT: usize = 2;

static NO_READBACK: ReadbackPolicy = ReadbackPolicy::None;

fn backend_error(what: &str, error: vyre_cuda::backend::BackendError) -> TokenizerError {
    TokenizerError::new(
        ErrorKind::Backend,
        format!("Fix: the device encoder failed while {what}: {error}"),
    )
    .with_source(error)
}

/// How big one chunk may be: a batch is cut into chunks of whole documents, each
/// at most this many bytes and documents (a document larger than the byte limit
/// is a chunk of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLimits {
    /// Most text bytes of a chunk.
    pub text_bytes: u64,
    /// Most documents of a chunk.
    pub documents: u64,
}

impl Default for ChunkLimits {
    fn default() -> Self {
        ChunkLimits {
            text_bytes: CHUNK_TEXT_BYTES,
            documents: CHUNK_DOCUMENTS,
        }
    }
}

/// What the last encode of a chunk counted on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeCounts {
    /// Pieces that took the merge loop.
    pub merged_pieces: u32,
    /// Chunks of long pieces.
    pub chunks: u32,
    /// Pieces longer than a chunk.
    pub long_pieces: u32,
    /// Chunk boundaries whose tokens were not compatible (each then repaired).
    pub failed_boundaries: u32,
    /// Long pieces merged by the serial path.
    pub serial_pieces: u32,
}

/// One set of buffers for a chunk in flight, sized by powers of two.
struct Slot {
    text_capacity: u64,
    document_capacity: u64,
    buffers: [Option<DeviceBuffer>; ROLES],
}

impl Slot {
    fn buffer(&self, role: Role) -> Result<&DeviceBuffer, TokenizerError> {
        self.buffers[role as usize].as_ref().ok_or_else(|| {
            TokenizerError::new(
                ErrorKind::Backend,
                format!("Fix: internal: the device encoder has no {} buffer; report this as a bug", role.name()),
            )
        })
    }
}

/// Bytes of `role`'s buffer for a slot of `text` bytes and `documents`
/// documents of capacity.
fn role_bytes(geometry: &Geometry, role: Role, text: u64, documents: u64) -> u64 {
    let chunk = geometry.chunk_bytes as u64;
    match role {
        Role::Params | Role::StagedParams => 4 * param::WORDS as u64,
        Role::Text | Role::StagedText => text,
        Role::DocumentEnds | Role::StagedDocuments => 4 * documents,
        Role::Vocabulary | Role::TokenBytes => 0,
        Role::PieceCount => 16,
        Role::PieceStarts | Role::TokenAt | Role::PartStart | Role::PairRank | Role::Ids => 4 * text,
        Role::MergeList => 4 * (text / 2 + 1),
        Role::ChunkList => 8 * (2 * text / chunk + 1),
        Role::LongList => 4 * (text / chunk + 1),
        Role::BlockCounts => 4 * blocks(geometry, text) as u64,
        Role::DocumentTokenStarts => 4 * (documents + 1),
    }
}

/// The BPE steps of one encoding on one backend: the resident vocabulary, the
/// compiled kernels and reusable buffer slots. See the [module docs](super).
pub struct DeviceEncoder {
    backend: AnyBackend,
    splitter: Splitter,
    programs: Programs,
    kernels: Vec<Kernel>,
    vocabulary: DeviceBuffer,
    token_bytes: DeviceBuffer,
    vocabulary_bytes: usize,
    slots: Mutex<Vec<Slot>>,
    limits: ChunkLimits,
}

impl std::fmt::Debug for DeviceEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceEncoder")
            .field("backend", &self.backend.kind())
            .field("geometry", &self.programs.geometry)
            .field("vocabulary_bytes", &self.vocabulary_bytes)
            .finish_non_exhaustive()
    }
}

impl DeviceEncoder {
    /// The encoder of `tokenizer`'s encoding on `backend`, with the default
    /// [`Geometry`] and [`ChunkLimits`]: compiles the programs and uploads the
    /// vocabulary once.
    pub fn new(backend: AnyBackend, tokenizer: &Tokenizer) -> Result<Self, TokenizerError> {
        Self::with_geometry(backend, tokenizer, Geometry::default(), ChunkLimits::default())
    }

    /// [`DeviceEncoder::new`] with another geometry and chunk limits (small ones
    /// let tests cross chunk and piece boundaries with short texts).
    pub fn with_geometry(
        backend: AnyBackend,
        tokenizer: &Tokenizer,
        geometry: Geometry,
        limits: ChunkLimits,
    ) -> Result<Self, TokenizerError> {
        let programs = Programs::new(geometry).map_err(|message| TokenizerError::new(ErrorKind::Backend, message))?;
        if limits.text_bytes == 0 || limits.documents == 0 {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                "Fix: ChunkLimits must allow at least one byte and one document per chunk",
            ));
        }
        let device_vocabulary = DeviceVocabulary::new(tokenizer.vocabulary())?;
        let mut kernels = Vec::with_capacity(STEPS.len());
        for (step, program) in programs.steps() {
            let kernel = backend
                .compile(program, &DispatchConfig::linear(1))
                .map_err(|error| backend_error(&format!("compiling bpe.{}", step.name), error))?;
            kernels.push(kernel);
        }
        let vocabulary = backend
            .buffer_from(device_vocabulary.words())
            .map_err(|error| backend_error("uploading the vocabulary", error))?;
        let token_bytes = backend
            .buffer_from(device_vocabulary.token_bytes())
            .map_err(|error| backend_error("uploading the vocabulary", error))?;
        Ok(DeviceEncoder {
            splitter: Splitter::new(tokenizer.pattern())?,
            backend,
            programs,
            kernels,
            vocabulary,
            token_bytes,
            vocabulary_bytes: device_vocabulary.device_bytes(),
            slots: Mutex::new(Vec::new()),
            limits,
        })
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &AnyBackend {
        &self.backend
    }

    /// The pattern whose pieces it merges.
    pub fn pattern(&self) -> Pattern {
        self.splitter.pattern()
    }

    /// Bytes the resident vocabulary takes on the device.
    pub fn vocabulary_bytes(&self) -> usize {
        self.vocabulary_bytes
    }

    /// Device bytes of the buffers one chunk of `text_bytes` bytes and
    /// `documents` documents needs (powers of two; the host-visible staging and
    /// outputs included).
    pub fn chunk_buffer_bytes(&self, text_bytes: u64, documents: u64) -> u64 {
        let (text, documents) = capacities(text_bytes, documents);
        Role::ALL
            .iter()
            .map(|&role| role_bytes(&self.programs.geometry, role, text, documents))
            .sum()
    }

    /// The ids of every text: `result[i]` is the ids of `texts[i]`, as
    /// [`Tokenizer::encode_ordinary_bytes`] gives them. The batch is cut into
    /// chunks ([`ChunkLimits`]) and up to [`CHUNKS_IN_FLIGHT`] run at once.
    pub fn encode_batch_bytes(&self, texts: &[&[u8]]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let mut results = vec![Vec::new(); texts.len()];
        let mut in_flight: std::collections::VecDeque<Submitted> = std::collections::VecDeque::new();
        for range in chunk_ranges(texts, &self.limits) {
            if in_flight.len() == CHUNKS_IN_FLIGHT {
                if let Some(oldest) = in_flight.pop_front() {
                    self.finish(oldest, texts, &mut results)?;
                }
            }
            in_flight.push_back(self.submit_chunk(texts, range)?);
        }
        while let Some(oldest) = in_flight.pop_front() {
            self.finish(oldest, texts, &mut results)?;
        }
        Ok(results)
    }

    /// [`DeviceEncoder::encode_batch_bytes`] of strings.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let bytes: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
        self.encode_batch_bytes(&bytes)
    }

    /// The ids of one text, and what each step's kernel took and counted.
    pub fn encode_timed(&self, text: &[u8]) -> Result<(Vec<u32>, ChunkTimings), TokenizerError> {
        let texts = [text];
        let mut results = vec![Vec::new()];
        let submitted = self.submit_chunk(&texts, 0..1)?;
        let timings = self.finish(submitted, &texts, &mut results)?;
        Ok((results.pop().unwrap_or_default(), timings))
    }

    /// A slot with room for `text_len` bytes and `documents` documents: an idle
    /// one that is large enough, or a new one (powers of two).
    fn take_slot(&self, text_len: u64, documents: u64) -> Result<Slot, TokenizerError> {
        let (text, documents) = capacities(text_len, documents);
        {
            let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(index) = slots
                .iter()
                .position(|slot| slot.text_capacity >= text && slot.document_capacity >= documents)
            {
                return Ok(slots.swap_remove(index));
            }
        }
        let mut buffers: [Option<DeviceBuffer>; ROLES] = std::array::from_fn(|_| None);
        for role in Role::ALL {
            let bytes = role_bytes(&self.programs.geometry, role, text, documents);
            if bytes == 0 {
                continue;
            }
            let buffer = self
                .backend
                .buffer(bytes)
                .map_err(|error| backend_error(&format!("allocating {} bytes for {}", bytes, role.name()), error))?;
            buffers[role as usize] = Some(buffer);
        }
        Ok(Slot {
            text_capacity: text,
            document_capacity: documents,
            buffers,
        })
    }

    fn give_back(&self, slot: Slot) {
        let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.push(slot);
        // Keep the largest few: a slot is tens of bytes per text byte.
        slots.sort_by_key(|slot| std::cmp::Reverse(slot.text_capacity));
        slots.truncate(CHUNKS_IN_FLIGHT);
    }

    /// Stages the documents `range` of `texts` and submits every step.
    fn submit_chunk(&self, texts: &[&[u8]], range: Range<usize>) -> Result<Submitted, TokenizerError> {
        let documents = &texts[range.clone()];
        let text_len: u64 = documents.iter().map(|text| text.len() as u64).sum();
        let start = Instant::now();
        if text_len == 0 {
            return Ok(Submitted {
                slot: None,
                pending: Vec::new(),
                range,
                text_len,
                start,
            });
        }
        let text_len_u32 = u32::try_from(text_len).map_err(|_| {
            TokenizerError::new(
                ErrorKind::Backend,
                format!("Fix: a chunk of {text_len} bytes does not fit the device's 32-bit offsets; lower ChunkLimits::text_bytes"),
            )
        })?;
        let slot = self.take_slot(text_len, documents.len() as u64)?;
        let result = self.stage_and_submit(&slot, documents, text_len_u32);
        match result {
            Ok(pending) => Ok(Submitted {
                slot: Some(slot),
                pending,
                range,
                text_len,
                start,
            }),
            Err(error) => {
                self.give_back(slot);
                Err(error)
            }
        }
    }

    fn stage_and_submit(
        &self,
        slot: &Slot,
        documents: &[&[u8]],
        text_len: u32,
    ) -> Result<Vec<PendingDispatch>, TokenizerError> {
        let mut params = [0u32; param::WORDS as usize];
        params[param::TEXT_LEN as usize] = text_len;
        params[param::DOCUMENTS as usize] = documents.len() as u32;
        let mut text = Vec::with_capacity(text_len as usize);
        let mut ends = Vec::with_capacity(documents.len());
        let mut starts = Vec::new();
        for document in documents {
            let offset = text.len() as u32;
            let before = starts.len();
            self.splitter.split_into(document, &mut starts)?;
            for piece in &mut starts[before..] {
                *piece += offset;
            }
            text.extend_from_slice(document);
            ends.push(text.len() as u32);
        }
        // The u64 view of the staged text reads whole words.
        text.resize(text.len().next_multiple_of(8), 0);
        let upload = |role: Role, bytes: &[u8]| -> Result<(), TokenizerError> {
            self.backend
                .upload(slot.buffer(role)?, bytes)
                .map_err(|error| backend_error(&format!("uploading {}", role.name()), error))
        };
        upload(Role::StagedParams, bytemuck::cast_slice(&params))?;
        upload(Role::StagedText, &text)?;
        upload(Role::StagedDocuments, bytemuck::cast_slice(&ends))?;
        upload(Role::PieceStarts, bytemuck::cast_slice(&starts))?;
        upload(Role::PieceCount, bytemuck::cast_slice(&[starts.len() as u32]))?;
        let geometry = &self.programs.geometry;
        let mut pending: Vec<PendingDispatch> = Vec::with_capacity(STEPS.len());
        for (step, kernel) in STEPS.iter().zip(&self.kernels) {
            let bindings = self.bindings(slot, step)?;
            let workgroups = step
                .grid
                .workgroups(geometry, text_len as u64, documents.len() as u64);
            let request = Dispatch::new(kernel, &bindings)
                .workgroups([workgroups, 1, 1])
                .readback(&NO_READBACK);
            let submitted = match pending.last() {
                None => self.backend.submit(request),
                Some(previous) => self.backend.submit(request.after(previous)),
            }
            .map_err(|error| backend_error(&format!("submitting bpe.{}", step.name), error))?;
            pending.push(submitted);
        }
        Ok(pending)
    }

    fn bindings<'a>(&'a self, slot: &'a Slot, step: &Step) -> Result<Vec<Binding<'a>>, TokenizerError> {
        step.bindings
            .iter()
            .map(|&role| match role {
                Role::Vocabulary => Ok(Binding::from(&self.vocabulary)),
                Role::TokenBytes => Ok(Binding::from(&self.token_bytes)),
                _ => slot.buffer(role).map(Binding::from),
            })
            .collect()
    }

    /// Waits for a submitted chunk and hands each document its ids.
    fn finish(
        &self,
        submitted: Submitted,
        texts: &[&[u8]],
        results: &mut [Vec<u32>],
    ) -> Result<ChunkTimings, TokenizerError> {
        let Submitted {
            slot,
            pending,
            range,
            text_len,
            start,
        } = submitted;
        let Some(slot) = slot else {
            return Ok(ChunkTimings::default());
        };
        let outcome = self.collect(&slot, pending, texts, range, text_len, start, results);
        self.give_back(slot);
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    fn collect(
        &self,
        slot: &Slot,
        pending: Vec<PendingDispatch>,
        texts: &[&[u8]],
        range: Range<usize>,
        text_len: u64,
        start: Instant,
        results: &mut [Vec<u32>],
    ) -> Result<ChunkTimings, TokenizerError> {
        let mut steps = [Timings::default(); STEPS.len()];
        // The last step's wait covers the chain; the others then find idle streams.
        for (index, submitted) in pending.into_iter().enumerate().rev() {
            let done = submitted
                .wait()
                .map_err(|error| backend_error(&format!("running bpe.{}", STEPS[index].name), error))?;
            steps[index] = done.timings;
        }
        let documents = range.len();
        let read = |role: Role| -> Result<Vec<u32>, TokenizerError> {
            self.backend
                .read::<u32>(slot.buffer(role)?)
                .map_err(|error| backend_error(&format!("reading {}", role.name()), error))
        };
        let starts = read(Role::DocumentTokenStarts)?;
        let ids = read(Role::Ids)?;
        let total = starts.get(documents).copied().unwrap_or(0) as usize;
        if total as u64 > text_len || total > ids.len() {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!("Fix: internal: the device counted {total} tokens in {text_len} bytes; report this as a bug"),
            ));
        }
        for (offset, index) in range.clone().enumerate() {
            let (first, last) = (starts[offset] as usize, starts[offset + 1] as usize);
            if first > last || last > total {
                return Err(TokenizerError::new(
                    ErrorKind::Backend,
                    format!(
                        "Fix: internal: the device gave document {index} ids {first}..{last} of {total}; report this as a bug"
                    ),
                ));
            }
            results[index] = ids[first..last].to_vec();
        }
        let _ = texts;
        let params = read(Role::Params)?;
        Ok(ChunkTimings {
            wall_ns: u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
            steps,
            counts: EncodeCounts {
                merged_pieces: params[param::MERGE_COUNT as usize],
                chunks: params[param::CHUNK_COUNT as usize],
                long_pieces: params[param::LONG_COUNT as usize],
                failed_boundaries: params[param::FAILED_BOUNDARIES as usize],
                serial_pieces: params[param::SERIAL_PIECES as usize],
            },
        })
    }
}

/// Timings and counts of one chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkTimings {
    /// Staging to ids in hand, host clock.
    pub wall_ns: u64,
    /// Each step's timings, in [`STEPS`] order (`kernel_stamps_ns` is the
    /// kernel's own device time).
    pub steps: [Timings; STEPS.len()],
    /// What the device counted.
    pub counts: EncodeCounts,
}

/// A chunk on its way: its slot (none for an empty chunk), its pending steps.
struct Submitted {
    slot: Option<Slot>,
    pending: Vec<PendingDispatch>,
    range: Range<usize>,
    text_len: u64,
    start: Instant,
}

/// Buffer capacities for a chunk: powers of two, at least 16 bytes and 4
/// documents.
fn capacities(text_len: u64, documents: u64) -> (u64, u64) {
    (
        text_len.max(16).next_power_of_two(),
        documents.max(4).next_power_of_two(),
    )
}

/// Consecutive ranges of whole documents within `limits` (a document over the
/// byte limit alone in its range).
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
