//! # vyre-tokenizer
//!
//! Byte-level BPE tokenization exactly as tiktoken does it (the same ids for
//! r50k_base, p50k_base, cl100k_base and o200k_base), on the CPU, and on a CUDA
//! GPU through vyre-cuda's public API: text up, token ids down. This crate is
//! vyre-cuda's first user, built as a user would build it: it links the backend
//! like any other dependency.
//!
//! ```
//! use vyre_tokenizer::{Backend, Tokenizer};
//!
//! let tokenizer = Tokenizer::cl100k_base()?; // vocabulary embedded, parsed once per process
//! let ids = tokenizer.encode_ordinary("Hello, world!");
//! assert_eq!(ids, [9906, 11, 1917, 0]);
//! assert_eq!(tokenizer.decode(&ids)?, "Hello, world!");
//! let ids = tokenizer.encode("<|endoftext|>", &["<|endoftext|>"])?; // allowed special tokens
//! assert_eq!(ids, [100257]);
//! let batch = tokenizer.encode_batch(&["one", "two"]); // all threads
//! assert_eq!(batch.len(), 2);
//! let gpu = Tokenizer::r50k_base()?.with_backend(Backend::Auto)?; // the GPU where there is one
//! assert_eq!(gpu.encode_ordinary("Hello"), [15496]);
//! # Ok::<(), vyre_tokenizer::TokenizerError>(())
//! ```
//!
//! - [`Tokenizer`]: the four built-in encodings (vocabularies embedded, parsed
//!   once per process), or any `.tiktoken` vocabulary with a [`Pattern`] and
//!   special tokens; `encode_ordinary`, `encode` with allowed special tokens,
//!   `encode_batch` on all threads, `decode` and `decode_bytes`.
//! - [`Backend`]: the CPU, the GPU, or the GPU where there is one.
//! - [`device`]: the whole encode on a device ([`device::DeviceEncoder`]:
//!   text up, ids down; the resident vocabulary, the split and BPE programs,
//!   batches, pipelining, graphs), on CUDA or the reference interpreter.
//! - [`Vocabulary`]: the strict `.tiktoken` reader.
//! - [`pretokenize`]: the pre-tokenizers (the patterns, the CPU split, the
//!   splits as vyre-cuda programs).
//!
//! Every error is a [`TokenizerError`] whose message starts with `Fix:`.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod bpe;
pub mod device;
mod error;
pub mod occupancy;
pub mod pretokenize;
mod special;
mod table;
mod tokenizer;
mod vocab;
mod workers;

pub use bpe::SHORT_PIECE_BYTES;
pub use error::{ErrorKind, TokenizerError};
pub use pretokenize::pattern::Pattern;
pub use special::SpecialToken;
pub use tokenizer::{Backend, Encoding, Tokenizer, AUTO_GPU_MIN_BYTES, BATCH_PARALLEL_MIN_BYTES};
pub use vocab::{Vocabulary, MAX_UNUSED_RANKS};
