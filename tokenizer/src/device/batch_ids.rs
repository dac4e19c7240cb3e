//! A batch's token ids in one reusable result that the copy engine fills in
//! place: [`BatchIds`], each document's ids a slice of it.
//!
//! # Why this module exists
//!
//! [`DeviceEncoder::encode_batch_into`](super::DeviceEncoder::encode_batch_into)
//! hands each document its own `Vec<u32>`: the copy engine brings a chunk's
//! ids into pinned staging, and the host then copies them into the vectors.
//! On the H200 host (2026-12-04, a 64 MiB cl100k batch of 7,689 documents,
//! 33.9 M tokens) that second copy alone, 136 MB into reused vectors on all
//! 16 cores, took 2.61 ms (51.9 GB/s), against 6.4 ms for the device's whole
//! share of the batch; and at the batch's end the last chunks' copies ran
//! 0.9–1.5 ms after the device's last step, since the four chunks on the
//! device finish within a fraction of a millisecond of each other.
//!
//! Here the copy engine writes each chunk's ids straight into page-locked
//! memory that the result owns ([`AnyBackend::download`]), where the caller
//! reads them: no host copy of the ids at all, only each document's first id
//! index (one word per document). The memory is kept for the next batch (a
//! chunk's part grows by powers of two), so a caller encoding batch after
//! batch into one `BatchIds` allocates and pins memory only while its
//! batches grow.
//!
//! A chunk below [`COPY_ENGINE_FROM`](super::pipeline::COPY_ENGINE_FROM) has
//! its ids written by `compact` straight into host-mapped memory, the slot's
//! `ids` buffer: its part takes that buffer itself (a [`MappedView`], read in
//! place) and gives the slot the one it held from the batch before, of the
//! same size, so no id is copied on the host either. Why: for one 256 KiB
//! document that copy into the caller's memory was the hand-out's whole cost
//! on the H200 (2026-12-05: 21.2 µs of prose's 174.7 µs eager, 42.3 of CJK's
//! 198.5). On the reference backend (and where the slot's buffer cannot be
//! taken) a part holds its ids in an ordinary vector, copied there.

use vyre_cuda::backend::{AnyBackend, DeviceBuffer, MappedView, PinnedBuffer};

use super::pipeline::backend_error;
use crate::error::TokenizerError;

/// The token ids of every document of a batch, in document order, in one
/// result the next batch reuses: [`BatchIds::get`] gives document `i`'s ids as
/// a slice. Filled by
/// [`DeviceEncoder::encode_batch_ids`](super::DeviceEncoder::encode_batch_ids)
/// (and [`Tokenizer::encode_batch_ids`](crate::Tokenizer::encode_batch_ids)),
/// which replace its contents; after a failed encode it holds no document.
///
/// ```
/// use vyre_cuda::backend::AnyBackend;
/// use vyre_tokenizer::{device::{BatchIds, DeviceEncoder}, Tokenizer};
///
/// let tokenizer = Tokenizer::cl100k_base()?;
/// let encoder = DeviceEncoder::new(AnyBackend::cuda_or_reference(), &tokenizer)?;
/// let mut ids = BatchIds::new();
/// encoder.encode_batch_ids(&[&b"Hello, world!"[..], b"", "日本語".as_bytes()], &mut ids)?;
/// assert_eq!(ids.len(), 3);
/// assert_eq!(ids.get(0), Some(&tokenizer.encode_ordinary("Hello, world!")[..]));
/// assert_eq!(ids.get(1), Some(&[][..]));
/// assert_eq!(ids.iter().map(<[u32]>::len).sum::<usize>(), ids.token_count());
/// # Ok::<(), vyre_tokenizer::TokenizerError>(())
/// ```
#[derive(Default)]
pub struct BatchIds {
    /// One part per chunk of the last encode (the first `filled`), then parts
    /// kept from earlier, larger batches for their memory.
    parts: Vec<Part>,
    /// Parts holding the last encode's documents.
    filled: usize,
}

impl std::fmt::Debug for BatchIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchIds")
            .field("documents", &self.len())
            .field("tokens", &self.token_count())
            .field("parts", &self.filled)
            .finish()
    }
}

impl BatchIds {
    /// An empty result (no memory until the first encode into it).
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of documents.
    pub fn len(&self) -> usize {
        self.filled().iter().map(Part::documents).sum()
    }

    /// True when it holds no document.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many ids the documents hold together.
    pub fn token_count(&self) -> usize {
        self.filled().iter().map(Part::token_count).sum()
    }

    /// Document `document`'s ids; `None` past the last document.
    pub fn get(&self, document: usize) -> Option<&[u32]> {
        let parts = self.filled();
        let after = parts.partition_point(|part| part.first_document <= document);
        parts.get(after.checked_sub(1)?)?.get(document)
    }

    /// Every document's ids, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u32]> + '_ {
        self.filled().iter().flat_map(|part| {
            let ids = part.ids();
            part.starts
                .windows(2)
                .map(move |range| ids.get(range[0] as usize..range[1] as usize).unwrap_or(&[]))
        })
    }

    /// Every document's ids as vectors of their own (a copy).
    pub fn to_vecs(&self) -> Vec<Vec<u32>> {
        self.iter().map(<[u32]>::to_vec).collect()
    }

    fn filled(&self) -> &[Part] {
        &self.parts[..self.filled]
    }

    /// Empties it and makes room for `chunks` parts, which the encode fills in
    /// order: part `i` gets the documents of chunk `i` from `first_documents[i]`.
    /// Until the encode succeeds ([`BatchIds::finish`]) it holds no document.
    pub(super) fn begin(&mut self, first_documents: &[usize]) -> &mut [Part] {
        self.filled = 0;
        if self.parts.len() < first_documents.len() {
            self.parts.resize_with(first_documents.len(), Part::default);
        }
        let parts = &mut self.parts[..first_documents.len()];
        for (part, &first) in parts.iter_mut().zip(first_documents) {
            part.first_document = first;
            part.starts.clear();
        }
        parts
    }

    /// The encode that [`BatchIds::begin`] started filled `chunks` parts.
    pub(super) fn finish(&mut self, chunks: usize) {
        self.filled = chunks.min(self.parts.len());
    }

    /// The ids of `documents`, one vector each, as one part (the CPU's encode).
    pub(crate) fn fill_from(&mut self, documents: Vec<Vec<u32>>) {
        let part = &mut self.begin(&[0])[0];
        part.starts.push(0);
        let mut ids = part.ids.take_vector();
        for document in &documents {
            ids.extend_from_slice(document);
            part.starts.push(ids.len() as u32);
        }
        part.ids = PartIds::Host(ids);
        self.finish(1);
    }
}

/// The ids of one chunk's documents.
#[derive(Default)]
pub(super) struct Part {
    /// The batch index of its first document.
    first_document: usize,
    /// Each document's first id index within the part, then the part's total.
    starts: Vec<u32>,
    ids: PartIds,
}

/// Where a part's ids live.
enum PartIds {
    /// An ordinary vector (the reference backend; chunks whose ids the device
    /// writes into host-mapped memory itself).
    Host(Vec<u32>),
    /// Page-locked memory the copy engine writes: its first `tokens` words.
    Pinned { memory: PinnedBuffer, tokens: usize },
    /// Host-mapped memory `compact` wrote, taken from the chunk's slot: its
    /// first `tokens` words.
    Mapped { view: MappedView, tokens: usize },
}

impl Default for PartIds {
    fn default() -> Self {
        PartIds::Host(Vec::new())
    }
}

impl PartIds {
    /// The part's vector, emptied (its capacity kept), for the caller to fill
    /// and put back; a new one where the part held pinned memory, which goes.
    fn take_vector(&mut self) -> Vec<u32> {
        match std::mem::take(self) {
            PartIds::Host(mut ids) => {
                ids.clear();
                ids
            }
            PartIds::Pinned { .. } | PartIds::Mapped { .. } => Vec::new(),
        }
    }
}

impl Part {
    fn documents(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    fn token_count(&self) -> usize {
        self.starts.last().map_or(0, |&total| total as usize)
    }

    fn ids(&self) -> &[u32] {
        match &self.ids {
            PartIds::Host(ids) => ids,
            // Pinned memory is page-aligned, so the cast holds (checked when
            // the memory was taken, `ensure_pinned`).
            PartIds::Pinned { memory, tokens } => {
                bytemuck::try_cast_slice(memory.as_slice().get(..4 * tokens).unwrap_or(&[]))
                    .unwrap_or(&[])
            }
            // Host-mapped memory is page-aligned too.
            PartIds::Mapped { view, tokens } => {
                bytemuck::try_cast_slice(view.bytes().get(..4 * tokens).unwrap_or(&[]))
                    .unwrap_or(&[])
            }
        }
    }

    /// The part's ids where the caller reads them in host-mapped memory that
    /// the part gives back to a slot at the next encode into it (for the one
    /// after to write); empty where they live in memory only the host writes
    /// or the copy engine fills.
    pub(super) fn ids_read_in_place(&self) -> &[u32] {
        match &self.ids {
            PartIds::Mapped { .. } => self.ids(),
            PartIds::Host(_) | PartIds::Pinned { .. } => &[],
        }
    }

    /// Document `document` (a batch index at or after the part's first)'s ids.
    fn get(&self, document: usize) -> Option<&[u32]> {
        let local = document - self.first_document;
        let (&start, &end) = (self.starts.get(local)?, self.starts.get(local + 1)?);
        self.ids().get(start as usize..end as usize)
    }

    /// Takes the chunk's document starts (its documents' first id indices,
    /// then the total).
    pub(super) fn set_starts(&mut self, starts: &[u32]) {
        self.starts.clear();
        self.starts.extend_from_slice(starts);
    }

    /// The chunk's `tokens` ids from the first words of `device` (device
    /// memory), by the copy engine into the part's pinned memory, grown to a
    /// power of two when it lacks room.
    pub(super) fn download(
        &mut self,
        backend: &AnyBackend,
        device: &DeviceBuffer,
        tokens: usize,
    ) -> Result<(), TokenizerError> {
        let bytes = 4 * tokens;
        let memory = self.ensure_pinned(backend, bytes)?;
        backend
            .download(device, 0, memory, 0, bytes as u64)
            .map_err(|error| {
                backend_error("copying the ids into the batch's pinned memory", error)
            })?;
        if let PartIds::Pinned { tokens: held, .. } = &mut self.ids {
            *held = tokens;
        }
        Ok(())
    }

    /// The part's pinned memory with room for `bytes` (new memory, a power of
    /// two of at least 64 KiB, when it has none or too little).
    fn ensure_pinned(
        &mut self,
        backend: &AnyBackend,
        bytes: usize,
    ) -> Result<&mut PinnedBuffer, TokenizerError> {
        let fits = matches!(&self.ids, PartIds::Pinned { memory, .. } if memory.len() >= bytes);
        if !fits {
            let AnyBackend::Cuda(gpu) = backend else {
                return Err(super::pipeline::internal(
                    "pinned memory for the ids of a backend other than CUDA".to_owned(),
                ));
            };
            let capacity = bytes
                .max(64 << 10)
                .checked_next_power_of_two()
                .unwrap_or(bytes);
            let memory = gpu.pinned_buffer(capacity).map_err(|error| {
                backend_error(
                    &format!("allocating {capacity} pinned bytes for a batch's ids"),
                    error,
                )
            })?;
            if bytemuck::try_cast_slice::<u8, u32>(memory.as_slice()).is_err() {
                return Err(super::pipeline::internal(
                    "pinned memory that is not word-aligned".to_owned(),
                ));
            }
            self.ids = PartIds::Pinned { memory, tokens: 0 };
        }
        match &mut self.ids {
            PartIds::Pinned { memory, .. } => Ok(memory),
            _ => Err(super::pipeline::internal(
                "a batch part without its pinned memory".to_owned(),
            )),
        }
    }

    /// The chunk's `tokens` ids where the device wrote them, the first words of
    /// `ids` (the slot's host-mapped buffer), without a copy: the part keeps that
    /// buffer and leaves in its place the host-mapped buffer it held, when that is
    /// of the same size, else new memory of that size, and `rebind` moves the
    /// slot's graph, if it has one, onto the buffer left in the slot (so that the
    /// graph lets the taken one go). `Ok(false)`, with `ids` as it was, where that
    /// cannot be (memory that is not host-mapped or is still held, no memory to
    /// allocate, a graph that cannot be rebound): the caller copies instead, which
    /// rewrites the part (whose own memory may then be gone). `Err` where the
    /// graph, rebound, could be neither rebound back nor let the buffer go: the
    /// chunk's ids are then in no buffer the caller can read.
    pub(super) fn take_mapped(
        &mut self,
        backend: &AnyBackend,
        ids: &mut DeviceBuffer,
        tokens: usize,
        rebind: &mut dyn FnMut(&DeviceBuffer) -> Result<(), TokenizerError>,
    ) -> Result<bool, TokenizerError> {
        if !ids.is_host_mapped() || 4 * tokens as u64 > ids.len() {
            return Ok(false);
        }
        let same_size =
            matches!(&self.ids, PartIds::Mapped { view, .. } if view.len() == ids.len());
        let replacement = if same_size {
            match std::mem::take(&mut self.ids) {
                PartIds::Mapped { view, .. } => view.into_buffer(),
                _ => return Ok(false),
            }
        } else {
            let AnyBackend::Cuda(gpu) = backend else {
                return Ok(false);
            };
            match gpu.host_mapped_buffer(ids.len()) {
                Ok(buffer) => buffer,
                Err(_) => return Ok(false),
            }
        };
        let taken = std::mem::replace(ids, replacement);
        if rebind(ids).is_err() {
            // The graph still binds the slot's buffer: put it back; the part's
            // own memory, if it gave any, goes (the caller's copy rewrites it).
            *ids = taken;
            return Ok(false);
        }
        match taken.into_mapped_view() {
            Ok(view) => {
                self.ids = PartIds::Mapped { view, tokens };
                Ok(true)
            }
            Err((taken, _)) => {
                // Something besides the graph holds it: give the slot (and its
                // graph) the buffer back that holds the chunk's ids.
                rebind(&taken)?;
                *ids = taken;
                Ok(false)
            }
        }
    }

    /// The chunk's ids copied from `ids` (host memory): into the part's pinned
    /// memory where it has room (kept for the chunks that need it), else into
    /// its vector.
    pub(super) fn copy_from(&mut self, ids: &[u32]) {
        if let PartIds::Pinned { memory, tokens } = &mut self.ids {
            let bytes: &[u8] = bytemuck::cast_slice(ids);
            if let Some(room) = memory
                .as_mut_slice()
                .ok()
                .and_then(|room| room.get_mut(..bytes.len()))
            {
                room.copy_from_slice(bytes);
                *tokens = ids.len();
                return;
            }
        }
        let mut held = self.ids.take_vector();
        held.extend_from_slice(ids);
        self.ids = PartIds::Host(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out demoting ids that no device writes again: a part whose ids
    /// the host keeps in a vector of its own (the CPU's encode, the reference
    /// backend's) lends none, though it holds some. Negative control by hand:
    /// lending `Part::ids` whatever their memory fails it.
    #[test]
    fn ids_in_host_memory_are_not_read_in_place() {
        let mut ids = BatchIds::new();
        ids.fill_from(vec![vec![1, 2, 3], Vec::new(), vec![4]]);
        assert_eq!(ids.filled()[0].ids(), &[1, 2, 3, 4]);
        assert_eq!(ids.filled()[0].ids_read_in_place(), &[] as &[u32]);
    }
}
