//! The whole encode on a device: text up, token ids down.
//!
//! # Why this module exists
//!
//! A GPU-resident tokenizer is what vyre-cuda is for: the pre-tokenizer's
//! split and the BPE merges are the whole of an encode. On the host the best
//! CPU encoders do about 100 MB/s on all 16 cores of the H200
//! host (bpe-openai; tiktoken-rs about 60), while the same host copies 53–55
//! GB/s each way between pinned memory and the device: an encode that runs on
//! the device is bounded by the copies, not by merges. [`DeviceEncoder`] takes
//! a batch of documents, packs them into one upload, and hands back each
//! document's ids and nothing else: the text goes up, the split and the
//! merges run on the device, the ids and each document's first id index come
//! down. Nothing of the encode happens on the host in between.
//!
//! ```
//! use vyre_cuda::backend::AnyBackend;
//! use vyre_tokenizer::{device::DeviceEncoder, Tokenizer};
//!
//! let tokenizer = Tokenizer::cl100k_base()?;
//! let encoder = DeviceEncoder::new(AnyBackend::cuda_or_reference(), &tokenizer)?;
//! let ids = encoder.encode_batch(&["Hello, world!", "", "日本語"])?; // one upload, ids per document
//! let pending = encoder.submit(&["more", "documents"])?; // non-blocking
//! let more = pending.wait()?;
//! let mut graph = encoder.graph(13)?; // repeated encodes of one length: one replay each
//! assert_eq!(graph.encode(b"Hello, world!")?, ids[0]);
//! assert_eq!(ids[0], tokenizer.encode_ordinary("Hello, world!"));
//! assert_eq!(more[1], tokenizer.encode_ordinary("documents"));
//! # Ok::<(), vyre_tokenizer::TokenizerError>(())
//! ```
//!
//! # How (the [`programs`] module docs give each step)
//!
//! - **The split** is the [batch split](crate::pretokenize::batch) of the
//!   encoding's pattern (GPT-2's in one dispatch for r50k and p50k, two for
//!   cl100k and o200k), its steps composed into the pipeline over the
//!   encoder's buffers: it reads the text and document ends the `stage`
//!   kernel wrote and leaves the piece starts and count the BPE steps read;
//!   its tables (the kind table, 35 KiB, and cl100k's or o200k's word
//!   table, 43 or 181 KiB) are resident beside the vocabulary. The encoder's
//!   split also starts a piece between two bytes that no token holds side by
//!   side (the vocabulary's 8 KiB bit table of joined byte pairs, resident
//!   after the split's tables): no merge joins across them, so the ids are
//!   the same, and a CJK piece of a few ideographs that is no token arrives
//!   as pieces that mostly are (cl100k, 8 MiB of generated CJK on the H200:
//!   0.49 M pieces of which 0.35 M merged became 4.87 M pieces of which 0.87 M
//!   merge, each a few bytes; `merge` took 101–104 µs instead of 594–597,
//!   `pieces` 108–110 instead of 27–28, `phases` 213–215 instead of 181).
//! - **The vocabulary** ([`vocabulary`]) is uploaded once per encoder and
//!   stays resident: dense tables of the single bytes and the 2-byte tokens,
//!   a hash table of the longer tokens keyed by their bytes (for whole
//!   pieces) and the pair table keyed by two ranks (for merges): 6.75 MiB for
//!   r50k and p50k, 13.25 MiB for cl100k, 26.35 MiB for o200k, of which the
//!   pair table is 4, 8 and 16 MiB.
//! - **One thread per piece** looks the whole piece up (most pieces are one
//!   token: one lookup); a piece that is not goes on a list, and a thread per
//!   listed piece runs tiktoken's merge loop (lowest rank, leftmost on ties)
//!   over scratch arrays indexed by text position (each part's length and
//!   pair rank at its first byte, its rank in `token_at`, the lowest pair
//!   rank of every 16-byte block: a merge reads the block minima and
//!   refreshes at most three, moves nothing, and looks its two new pairs up
//!   by the parts' ranks in the pair table, never by their bytes), so no
//!   thread needs a local array and a range of any length fits.
//! - **Long pieces** (over 384 bytes: a run of one letter, a long number under
//!   GPT-2's pattern, a paragraph of CJK) are cut into 384-byte chunks merged
//!   in parallel and stitched where a check proves it exact: the chunks'
//!   tokens are the piece's encoding iff every pair of adjacent tokens is
//!   compatible (a property of tiktoken's rule, checked on all four
//!   vocabularies with the CPU encoder before relying on it); failing
//!   boundaries are repaired by re-encoding a small window, and a piece no
//!   window repairs is merged serially in exact order with a heap,
//!   `O(L log L)`. No input is quadratic in a piece's length.
//! - **Every document apart**: the split sees each document as if alone and
//!   never puts a piece across a document end, so a document's last piece
//!   never merges into the next document; the compaction writes the ids in
//!   text order and each document's first id index, and the host hands each
//!   document its slice.
//! - **Short and mid-size texts**: a chunk of at most 2 KiB
//!   ([`fused::DEFAULT_SHORT_TEXT_BYTES`], [`ChunkLimits::short_text_bytes`]) runs as
//!   one kernel in which one workgroup runs every step's workgroups in turn,
//!   and a chunk of at most 256 KiB ([`fused::RESIDENT_TEXT_BYTES`],
//!   [`ChunkLimits::resident_text_bytes`]) as one cooperative kernel whose
//!   resident workgroups share each step's, a grid sync between steps
//!   ([`fused`]): one dispatch instead of seven or eight, each of which such a
//!   text pays for in launches and the waits between them.
//! - **Any length, any batch**: buffers grow by powers of two and are reused;
//!   a batch is cut into chunks of whole documents (12 MiB by default, at most
//!   the split's 256 MiB), up to four on the device at once, the next one
//!   staged while they compute and earlier ones' ids handed out meanwhile; a
//!   batch of 2 GiB is 171 chunks, never an error. On CUDA the chunk is
//!   gathered on the [copy pool](host_copy) (persistent workers, one per core)
//!   straight into host-mapped pinned memory and the ids come back the same
//!   way (no DMA copy of a size the host must learn first); a batch of one
//!   chunk, with nothing to overlap, hands its ids out on the calling thread,
//!   and copies under 1 MiB run there (the pool's hand-off costs more than it
//!   saves: the [pipeline's docs](pipeline) measure it).
//! - **Ids in one result**: [`DeviceEncoder::encode_batch_ids`] fills a
//!   [`BatchIds`] (each document's ids a slice of it, reused batch after
//!   batch), into whose pinned memory the copy engine brings each large
//!   chunk's ids: the host copies no id ([`batch_ids`] gives the
//!   measurement that asked for it).
//!
//! # What it costs the device, per input byte
//!
//! The split reads each text byte, cl100k and o200k write and read a code
//! byte per text byte between their two steps, and it writes a 4-byte piece
//! start per piece (about one per 4 input bytes): about 4 bytes of traffic
//! per input byte (its cost per 256 KiB is in the [batch
//! split's](crate::pretokenize::batch) docs). For text whose pieces are
//! tokens (most pieces of prose and code): the piece threads read the piece
//! starts and the piece's bytes (about 2 bytes per input byte with the
//! hashing) and one 8-byte slot of the hashed table per piece of 3 bytes or
//! more (about 0.25 lookups per input byte; the 2 MiB to 4 MiB slot tables
//! stay in the H200's 50 MB L2 cache), and write `token_at` (4 bytes);
//! `compact` reads `token_at` again (twice: its counting pass, then the
//! compaction, just after) and writes about one
//! id per 4 input bytes into host memory. About 19 bytes of device memory
//! traffic per input byte, some 0.4 ms for 64 MiB at the H200's HBM
//! bandwidth: the copies (1 byte up, about 1 byte of ids down per input byte)
//! and the host's gather and scatter bound a batch, not the device. A piece
//! that merges costs its merge loop on top: `O(L²)` loads for a piece of
//! `L ≤ 384` bytes (the block minima, two pair-table probes of about 1.4–2.1
//! slots per merge; its scratch arrays stay in L1).
//!
//! Device memory per input byte of a chunk's capacity (buffers are powers of
//! two): the text (1), the split's piece starts (4) and codes (1, cl100k and
//! o200k), `token_at` (4), the merge scratch (8), the merge list (2) and small
//! lists: about 20 bytes; host-mapped pinned memory: the staged text (1) and
//! the ids (4).
//!
//! # Every path a user has
//!
//! The same programs run on any `AnyBackend`: on CUDA, and on the reference
//! interpreter in the CPU tests ([`DeviceEncoder::new`] takes either). An
//! encode is eager ([`DeviceEncoder::encode_batch`]), non-blocking
//! ([`DeviceEncoder::submit`], then [`PendingEncode::wait`]) or recorded as one
//! graph for repeated encodes of one length ([`DeviceEncoder::graph`]: the
//! uploads, the split and the BPE steps in one replay).
//! `Tokenizer` runs every encode of [`Backend::Gpu`](crate::Backend::Gpu)
//! (and of [`Backend::Auto`](crate::Backend::Auto) for 64 KiB and more) here.

pub mod batch_ids;
pub mod fused;
mod hand_out_helpers;
pub mod host_copy;
pub mod pipeline;
pub mod programs;
mod text_ready;
pub mod vocabulary;

pub use batch_ids::BatchIds;
pub use pipeline::{
    ChunkLimits, ChunkTimings, DeviceEncoder, EncodeCounts, EncodeGraph, PendingEncode, StepClock,
    StepTimings,
};
pub use programs::{BoundsChecks, BulkSplit, Geometry, ShortText};
pub use vocabulary::DeviceVocabulary;
