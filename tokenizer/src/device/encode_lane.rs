//! Short texts encoded by a persistent lane: the short-text kernel
//! ([`super::fused`]) served by a vyre-cuda lane (`AnyBackend::lane`) that the
//! [`EncodeLane`] keeps running, so an encode pays no kernel launch.
//!
//! # Why it exists
//!
//! A 1 KiB text is one workgroup's work: on an H100 (2026-12-06) a batch of
//! one took 33.9 µs, of which the short-text kernel ran 24.2 by its own clock
//! and the launch, the wait for it and the host's work around them the rest,
//! about 8 µs whether the kernel was launched or replayed from a graph. A lane
//! is a kernel that stays resident and polls a host-mapped doorbell: the
//! prototype on the H200 (2026-12-01) answered in 3.14 µs where a launch and
//! synchronize of the same work took 10.20. So a caller that encodes short
//! texts one after another, and can give up one multiprocessor to do so, gets
//! that difference back on every encode.
//!
//! # How
//!
//! The lane serves the encoder's own compiled short-text kernel. Every buffer
//! the kernel binds is either one of the encoder's resident tables (the
//! vocabulary, its token bytes, the split's kind table) or a device buffer of
//! the lane's own, sized once for the most text and documents a request takes
//! ([`EncodeLane::text_capacity`], [`LANE_DOCUMENTS`]): a lane
//! cannot bind host-mapped memory, so the staged text and document ends go up
//! as the request's host inputs (the lane copies them from its own staging on
//! the device) and the ids and each document's first id index come back as
//! the request's readback. Every request has the same shape (the same
//! bindings, host inputs of the same length, the same readback ranges; only
//! the text length and document count, the kernel's scalars, differ), so the
//! lane plans it once and reuses the plan. The lane runs its requests one
//! after another, so requests from several threads never share the buffers on
//! the device at once.
//!
//! # Costs
//!
//! The lane holds one multiprocessor for as long as it lives (and, while idle,
//! polls host memory), so the encoder's resident-grid kernel gets one fewer
//! workgroup's worth of room per lane block; and while a lane runs, nothing
//! may load a new CUDA module (vyre-cuda answers such a load with a `Fix:`
//! error instead of waiting for the lane forever). Recording the resident-grid
//! kernel loads one, so while a lane of the encoder lives its eager resident
//! chunks replay only the graphs their slots already keep (the others run as
//! a cooperative dispatch of the kernel already loaded), and a
//! [`DeviceEncoder::graph`] of a resident length is such an error: record
//! those before building a lane.

use smallvec::SmallVec;
use vyre_cuda::backend::{AnyLane, Binding, DeviceBuffer, Dispatch, LaneOptions, Timings};
use vyre_cuda::{ByteRange, ReadbackPolicy};

use super::fused::{DOCUMENTS_SCALAR, SHORT_TEXT_BYTES, TEXT_LEN_SCALAR};
use super::pipeline::{backend_error, internal, DeviceEncoder, LiveLane};
use super::programs::Role;
use crate::error::{ErrorKind, TokenizerError};

/// Most documents one lane request takes (a batch of more is several
/// requests). Every request pads its document ends to this many (empty
/// documents at the text's end, which the split reads past at no cost worth
/// naming), so that every request has one shape.
pub const LANE_DOCUMENTS: u32 = 64;

/// Most global buffers the short-text kernel binds, for the request's
/// bindings on the stack.
const BINDINGS: usize = 24;

/// Where one of the short-text kernel's bindings comes from in a lane request.
enum LaneBinding {
    /// One of the encoder's resident tables.
    Table(Role),
    /// A device buffer of the lane's own.
    Owned(DeviceBuffer),
    /// The request's text, padded to the text capacity (a host input).
    StagedText,
    /// The request's document ends, padded to [`LANE_DOCUMENTS`] (a host
    /// input).
    StagedDocuments,
}

/// The short-text kernel of a [`DeviceEncoder`] served by a persistent lane
/// ([`DeviceEncoder::lane`]; see the [module docs](self) for why and what it
/// costs). Texts of up to [`EncodeLane::text_capacity`] bytes; `Send` and
/// `Sync`, so threads may share one.
pub struct EncodeLane<'e> {
    /// First, so that the lane stops before the buffers it binds drop.
    lane: AnyLane,
    /// Counts the lane as live on the encoder, after it stopped.
    _live: LiveLane<'e>,
    encoder: &'e DeviceEncoder,
    bindings: Vec<LaneBinding>,
    /// The readback: the ids binding's first `4 · text_capacity` bytes, then
    /// the document starts binding's `4 · (LANE_DOCUMENTS + 1)`.
    readback: ReadbackPolicy,
    text_capacity: u32,
    kernel_name: String,
}

impl std::fmt::Debug for EncodeLane<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodeLane")
            .field("kernel", &self.kernel_name)
            .field("text_capacity", &self.text_capacity)
            .field("lane", &self.lane)
            .finish_non_exhaustive()
    }
}

impl<'e> EncodeLane<'e> {
    /// The lane of `encoder`'s short-text kernel with `options`; see
    /// [`DeviceEncoder::lane`].
    pub(super) fn new(
        encoder: &'e DeviceEncoder,
        options: LaneOptions,
    ) -> Result<Self, TokenizerError> {
        let text_capacity = encoder.limits().short_text_bytes.min(SHORT_TEXT_BYTES);
        let (kernel, roles, kernel_name) = encoder
            .short_text_kernel()
            .filter(|_| text_capacity > 0)
            .ok_or_else(|| {
                TokenizerError::new(
                    ErrorKind::Backend,
                    "Fix: this encoder has no short-text kernel for a lane to serve (its \
                     ChunkLimits::short_text_bytes is 0, its geometry caps loop iterations, or \
                     the device could not compile the kernel); build the encoder with \
                     DeviceEncoder::new or a short_text_bytes above 0"
                        .to_owned(),
                )
            })?;
        // Buffers sized by powers of two, as the encoder's slots are.
        let text_capacity = text_capacity.max(16).next_power_of_two();
        let documents = u64::from(LANE_DOCUMENTS);
        let backend = encoder.backend();
        let bindings = roles
            .iter()
            .map(|&role| match role {
                Role::Vocabulary | Role::TokenBytes | Role::KindTable => {
                    Ok(LaneBinding::Table(role))
                }
                Role::StagedText => Ok(LaneBinding::StagedText),
                Role::StagedDocuments => Ok(LaneBinding::StagedDocuments),
                _ => {
                    let bytes = encoder
                        .slot_role_bytes(role, text_capacity, documents)
                        .max(4);
                    backend
                        .buffer(bytes)
                        .map(LaneBinding::Owned)
                        .map_err(|error| {
                            backend_error(&format!("allocating the lane's {role:?} buffer"), error)
                        })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let binding_of = |wanted: Role| {
            roles
                .iter()
                .position(|&role| role == wanted)
                .and_then(|index| u32::try_from(index).ok())
                .ok_or_else(|| internal(format!("{kernel_name} binds no {wanted:?} buffer")))
        };
        let readback = ReadbackPolicy::Ranges(
            [
                ByteRange {
                    binding: binding_of(Role::Ids)?,
                    offset: 0,
                    len: 4 * text_capacity,
                },
                ByteRange {
                    binding: binding_of(Role::DocumentTokenStarts)?,
                    offset: 0,
                    len: 4 * (documents + 1),
                },
            ]
            .into_iter()
            .collect(),
        );
        // Counted before it starts, so that no encode records beside it.
        let live = encoder.count_lane();
        let lane = backend
            .lane(&[kernel], options)
            .map_err(|error| backend_error(&format!("starting a lane of {kernel_name}"), error))?;
        Ok(EncodeLane {
            lane,
            _live: live,
            encoder,
            bindings,
            readback,
            text_capacity: u32::try_from(text_capacity)
                .map_err(|_| internal(format!("a lane of {text_capacity} text bytes")))?,
            kernel_name: kernel_name.to_owned(),
        })
    }

    /// Most text bytes one request takes: a document of up to this many bytes
    /// encodes in one request, and a batch's documents are packed into
    /// requests of up to this many bytes and [`LANE_DOCUMENTS`] documents.
    pub fn text_capacity(&self) -> usize {
        self.text_capacity as usize
    }

    /// The lane itself (its options, its kernels, `as_cuda` for its placement).
    pub fn lane(&self) -> &AnyLane {
        &self.lane
    }

    /// The ids of `text`, as [`crate::Tokenizer::encode_ordinary_bytes`] gives
    /// them.
    pub fn encode(&self, text: &[u8]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        self.encode_into(text, &mut ids)?;
        Ok(ids)
    }

    /// [`EncodeLane::encode`] into `ids` (its contents replaced, its capacity
    /// kept when it has room), with the request's timings (`None` for an
    /// empty text, which needs no request). `Err` with a `Fix:` message for a
    /// text longer than [`EncodeLane::text_capacity`].
    pub fn encode_into(
        &self,
        text: &[u8],
        ids: &mut Vec<u32>,
    ) -> Result<Option<Timings>, TokenizerError> {
        ids.clear();
        if text.is_empty() {
            return Ok(None);
        }
        self.check_length(text.len())?;
        // The ids straight into the caller's vector: room for one per byte,
        // then cut to the count.
        ids.resize(self.text_capacity as usize, 0);
        let mut starts = [0u32; LANE_DOCUMENTS as usize + 1];
        let timings = self.request(&[text], ids, &mut starts)?;
        let total = self.checked_total(&starts, 1)?;
        ids.truncate(total);
        Ok(Some(timings))
    }

    /// The ids of every text: `results[i]` (replaced) is the ids of `texts[i]`.
    /// Consecutive texts share a request up to [`EncodeLane::text_capacity`]
    /// bytes and [`LANE_DOCUMENTS`] documents; empty texts need none. `Err`
    /// with a `Fix:` message for a text longer than the capacity, or
    /// `results` of another length than `texts`, before any request.
    pub fn encode_batch_into(
        &self,
        texts: &[&[u8]],
        results: &mut [Vec<u32>],
    ) -> Result<(), TokenizerError> {
        if results.len() != texts.len() {
            return Err(TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: EncodeLane::encode_batch_into got {} result vectors for {} texts; pass \
                     one per text",
                    results.len(),
                    texts.len()
                ),
            ));
        }
        for text in texts {
            self.check_length(text.len())?;
        }
        let mut ids = vec![0u32; self.text_capacity as usize];
        let mut starts = [0u32; LANE_DOCUMENTS as usize + 1];
        let mut first = 0;
        while first < texts.len() {
            let end = self.request_end(texts, first);
            let batch = &texts[first..end];
            let outputs = &mut results[first..end];
            first = end;
            if batch.iter().all(|text| text.is_empty()) {
                outputs.iter_mut().for_each(Vec::clear);
                continue;
            }
            self.request(batch, &mut ids, &mut starts)?;
            self.checked_total(&starts, batch.len())?;
            for (document, output) in outputs.iter_mut().enumerate() {
                let range = starts[document] as usize..starts[document + 1] as usize;
                output.clear();
                output.extend_from_slice(&ids[range]);
            }
        }
        Ok(())
    }

    /// [`EncodeLane::encode_batch_into`] into new vectors.
    pub fn encode_batch(&self, texts: &[&[u8]]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        let mut results = vec![Vec::new(); texts.len()];
        self.encode_batch_into(texts, &mut results)?;
        Ok(results)
    }

    /// The end of the request that starts at `texts[first]`: as many texts as
    /// fit the text capacity and [`LANE_DOCUMENTS`] (at least one).
    fn request_end(&self, texts: &[&[u8]], first: usize) -> usize {
        let mut bytes = 0usize;
        let mut end = first;
        while end < texts.len()
            && end - first < LANE_DOCUMENTS as usize
            && bytes + texts[end].len() <= self.text_capacity as usize
        {
            bytes += texts[end].len();
            end += 1;
        }
        end.max(first + 1)
    }

    /// `Err` with a `Fix:` message for a text the lane cannot take.
    fn check_length(&self, bytes: usize) -> Result<(), TokenizerError> {
        if bytes <= self.text_capacity as usize {
            return Ok(());
        }
        Err(TokenizerError::new(
            ErrorKind::Backend,
            format!(
                "Fix: a text of {bytes} bytes is longer than this EncodeLane takes ({} bytes, the \
                 encoder's short-text limit); encode it with DeviceEncoder::encode_batch, or \
                 raise ChunkLimits::short_text_bytes (at most {SHORT_TEXT_BYTES})",
                self.text_capacity
            ),
        ))
    }

    /// The total of a finished request's `documents` documents from its
    /// starts, checked: the first document at 0, every start at most the
    /// next, the total within the ids' room.
    fn checked_total(&self, starts: &[u32], documents: usize) -> Result<usize, TokenizerError> {
        let read = &starts[..=documents];
        let total = read[documents] as usize;
        if read[0] != 0
            || read.windows(2).any(|pair| pair[0] > pair[1])
            || total > self.text_capacity as usize
        {
            return Err(internal(format!(
                "{} answered document starts {read:?} for {documents} documents with room for {} \
                 ids",
                self.kernel_name, self.text_capacity
            )));
        }
        Ok(total)
    }

    /// One request of `texts` (together at most the text capacity, at most
    /// [`LANE_DOCUMENTS`]): the ids into `ids` (`text_capacity` words), the
    /// document starts into `starts`.
    fn request(
        &self,
        texts: &[&[u8]],
        ids: &mut [u32],
        starts: &mut [u32; LANE_DOCUMENTS as usize + 1],
    ) -> Result<Timings, TokenizerError> {
        // The text padded to the capacity and the ends padded to
        // LANE_DOCUMENTS, so that every request has one shape.
        let mut text = [0u8; SHORT_TEXT_BYTES as usize];
        let mut ends = [0u32; LANE_DOCUMENTS as usize];
        let mut offset = 0usize;
        for (end, part) in ends.iter_mut().zip(texts) {
            text[offset..offset + part.len()].copy_from_slice(part);
            offset += part.len();
            *end = offset as u32;
        }
        let text_len = offset as u32;
        let documents = texts.len() as u32;
        let mut bindings: SmallVec<[Binding<'_>; BINDINGS]> = SmallVec::new();
        for binding in &self.bindings {
            bindings.push(match binding {
                LaneBinding::Table(role) => self
                    .encoder
                    .resident_table(*role)
                    .ok_or_else(|| internal(format!("no resident {role:?} table")))?,
                LaneBinding::Owned(buffer) => Binding::from(buffer),
                LaneBinding::StagedText => Binding::Host(&text[..self.text_capacity as usize]),
                LaneBinding::StagedDocuments => Binding::host(&ends[..]),
            });
        }
        let kernel = self
            .lane
            .kernels()
            .first()
            .ok_or_else(|| internal("a lane without its kernel".to_owned()))?;
        let request = Dispatch::new(kernel, &bindings)
            .workgroups([1, 1, 1])
            .scalar(TEXT_LEN_SCALAR, text_len)
            .scalar(DOCUMENTS_SCALAR, documents)
            .readback(&self.readback);
        let mut outputs: [&mut [u8]; 2] = [
            bytemuck::cast_slice_mut(&mut ids[..self.text_capacity as usize]),
            bytemuck::cast_slice_mut(&mut starts[..]),
        ];
        self.lane.run_into(request, &mut outputs).map_err(|error| {
            backend_error(
                &format!("encoding on the lane of {}", self.kernel_name),
                error,
            )
        })
    }
}
