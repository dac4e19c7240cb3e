//! A tokenizer-shaped GPU pipeline (§8): split UTF-8 text into pre-token pieces
//! with five small programs written in this crate's IR.
//!
//! # Why this module exists
//!
//! vyre-cuda exists for a GPU-resident tokenizer that calls the same few small
//! programs thousands of times. This module is that workload in miniature, so the
//! example a user runs first (`examples/pretokenize.rs`), the CPU tests and the GPU
//! tests all exercise the same programs: text goes up once, five dispatches run
//! over resident buffers with no intermediate readback, and only the piece starts
//! come back. It is also a worked example of writing kernels in the IR: a byte
//! classifier, a stencil, a workgroup reduction, a single-workgroup scan with
//! barriers, and a compaction whose in-block ranks come from a shared-memory bit
//! mask and population counts.
//!
//! # Splitting rules
//!
//! The rules are a simple GPT-2-like pre-tokenizer, defined structurally on bytes
//! so the GPU, the reference interpreter and the plain CPU splitter ([`cpu`]) can
//! agree on every input, valid UTF-8 or not:
//!
//! 1. **Characters.** A *lead byte* `0xC0..=0xDF`, `0xE0..=0xEF` or `0xF0..=0xF7`
//!    announces a sequence of 2, 3 or 4 bytes. It takes up to that many minus one
//!    immediately following continuation bytes (`0x80..=0xBF`), fewer if a
//!    non-continuation byte or the end of the text comes first (a *truncated*
//!    character keeps what it has). Every other byte is a character of one byte:
//!    ASCII `0x00..=0x7F`, the invalid bytes `0xF8..=0xFF`, and every continuation
//!    byte no lead took (a *stray* continuation). Encodings are not validated
//!    beyond this: overlong forms and surrogates are grouped like valid ones.
//! 2. **Kinds.** An ASCII letter (`A-Z a-z`) is a *letter*, `0-9` a *digit*, and
//!    space, `\t`, `\n`, `\x0B`, `\x0C`, `\r` are *whitespace*. Every other
//!    character (ASCII punctuation and control bytes, every non-ASCII character,
//!    stray continuations, `0xF8..=0xFF`) is a *single*.
//! 3. **Pieces.** A piece starts at the first byte of the text, at every
//!    single, and at every letter, digit or whitespace character whose kind differs
//!    from the previous character's. So pieces are maximal runs of letters, runs of
//!    digits and runs of whitespace, and every single is a piece of its own (each
//!    CJK ideograph, each punctuation byte, each stray continuation byte).
//!
//! The output is the byte offset of every piece start, increasing; the number of
//! pieces is its length. An empty text has no pieces.
//!
//! ```
//! use vyre_cuda::pretokenize::{cpu, pipeline, programs};
//! let text = "Hello, 世界 42!".as_bytes();
//! // The five IR programs on the CPU reference interpreter (a CUDA device runs the
//! // same programs through `pipeline::CudaPipeline`).
//! let starts = pipeline::run_reference(&programs::programs(), text).unwrap().piece_starts;
//! assert_eq!(starts, cpu::piece_starts(text));
//! let pieces: Vec<&str> = cpu::pieces(text, &starts)
//!     .into_iter()
//!     .map(|piece| std::str::from_utf8(piece).unwrap())
//!     .collect();
//! assert_eq!(pieces, ["Hello", ",", " ", "世", "界", " ", "42", "!"]);
//! ```
//!
//! # The pipeline
//!
//! `n` bytes, `B = ceil(n / 256)` workgroups of [`WORKGROUP_SIZE`] threads (the
//! default [`Geometry`]; tests build smaller ones):
//!
//! | step | program | reads | writes |
//! |---|---|---|---|
//! | 1 | `classify` | `text` (u8) | `classes[i]`: a [`class`] code per byte |
//! | 2 | `mark` | `classes` | `marks[i]` = 1 where a piece starts |
//! | 3 | `block_count` | `marks` | `block_counts[b]` (a `WorkgroupReduce` sum) |
//! | 4 | `block_scan` | `block_counts` | `block_offsets[b]` exclusive, `block_offsets[B]` = total (one workgroup of [`SCAN_THREADS`]) |
//! | 5 | `compact` | `marks`, `block_offsets` | `piece_starts[block_offsets[b] + rank] = i` |
//!
//! Step 2 applies the rules to class codes: a continuation byte at `i` is taken by
//! a lead iff the nearest non-continuation byte among `i-1, i-2, i-3` is a lead
//! whose sequence length exceeds its distance; any other byte starts a piece when
//! `i == 0`, when its class is a single, or when its class differs from byte
//! `i-1`'s (a preceding continuation byte belongs to a single, so it always
//! differs). [`programs`] holds the IR, [`pipeline`] runs it on the reference
//! interpreter or on a CUDA device, [`text`] generates the sample inputs.

pub mod cpu;
pub mod pipeline;
pub mod programs;
pub mod text;

use std::fmt;

/// Threads per workgroup of the per-byte programs (classify, mark, block_count,
/// compact) in the default [`Geometry`].
pub const WORKGROUP_SIZE: u32 = 256;

/// Threads of the single workgroup that scans the per-block counts, in the
/// default [`Geometry`].
pub const SCAN_THREADS: u32 = 1024;

/// The workgroup shapes the programs are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Threads per workgroup of the per-byte programs: 1..=1024.
    pub workgroup_size: u32,
    /// Threads of the scan's single workgroup: a power of two, 1..=1024.
    pub scan_threads: u32,
}

impl Default for Geometry {
    /// [`WORKGROUP_SIZE`] and [`SCAN_THREADS`].
    fn default() -> Self {
        Geometry {
            workgroup_size: WORKGROUP_SIZE,
            scan_threads: SCAN_THREADS,
        }
    }
}

impl Geometry {
    /// Rejects shapes the programs cannot run with.
    pub fn check(&self) -> Result<(), PretokenizeError> {
        if !(1..=1024).contains(&self.workgroup_size) {
            return Err(PretokenizeError::new(format!(
                "Fix: Geometry::workgroup_size is {}; use 1 to 1024 threads",
                self.workgroup_size
            )));
        }
        if !(1..=1024).contains(&self.scan_threads) || !self.scan_threads.is_power_of_two() {
            return Err(PretokenizeError::new(format!(
                "Fix: Geometry::scan_threads is {}; use a power of two from 1 to 1024",
                self.scan_threads
            )));
        }
        Ok(())
    }

    /// Workgroups of the per-byte programs (`B`) for a text of `text_len` bytes.
    pub fn blocks_for(&self, text_len: usize) -> u32 {
        let blocks = text_len.div_ceil(self.workgroup_size.max(1) as usize);
        u32::try_from(blocks).unwrap_or(u32::MAX)
    }
}

/// Largest text the pipeline accepts (256 MiB): every buffer then fits `u32`
/// element counts with room to spare, and a dispatch needs at most 2^20 workgroups.
pub const MAX_TEXT_BYTES: usize = 256 << 20;

/// The per-byte class codes that step 1 writes and step 2 reads.
pub mod class {
    /// A continuation byte `0x80..=0xBF`.
    pub const CONTINUATION: u32 = 0;
    /// An ASCII letter `A-Z a-z`.
    pub const LETTER: u32 = 1;
    /// An ASCII digit `0-9`.
    pub const DIGIT: u32 = 2;
    /// ASCII whitespace: space, `\t`, `\n`, `\x0B`, `\x0C`, `\r`.
    pub const WHITESPACE: u32 = 3;
    /// Any other ASCII byte (punctuation, symbols, control bytes).
    pub const PUNCTUATION: u32 = 4;
    /// A lead byte `0xC0..=0xDF` of a 2-byte sequence.
    pub const LEAD2: u32 = 5;
    /// A lead byte `0xE0..=0xEF` of a 3-byte sequence (CJK ideographs start here).
    pub const LEAD3: u32 = 6;
    /// A lead byte `0xF0..=0xF7` of a 4-byte sequence.
    pub const LEAD4: u32 = 7;
    /// A byte `0xF8..=0xFF`, never valid in UTF-8.
    pub const INVALID: u32 = 8;
}

/// The [`class`] code of one byte (the rule step 1 implements in IR).
pub fn class_of(byte: u8) -> u32 {
    match byte {
        b'A'..=b'Z' | b'a'..=b'z' => class::LETTER,
        b'0'..=b'9' => class::DIGIT,
        b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r' => class::WHITESPACE,
        0x00..=0x7F => class::PUNCTUATION,
        0x80..=0xBF => class::CONTINUATION,
        0xC0..=0xDF => class::LEAD2,
        0xE0..=0xEF => class::LEAD3,
        0xF0..=0xF7 => class::LEAD4,
        0xF8..=0xFF => class::INVALID,
    }
}

/// Why a pipeline run failed. The message starts with `Fix:` and says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PretokenizeError {
    message: String,
}

impl PretokenizeError {
    /// An error from a message; a `Fix:` prefix is added when missing.
    pub fn new(message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.starts_with("Fix:") {
            message
        } else {
            format!("Fix: {message}")
        };
        PretokenizeError { message }
    }

    /// The message, starting with `Fix:`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PretokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PretokenizeError {}

impl From<crate::reference::ReferenceError> for PretokenizeError {
    fn from(error: crate::reference::ReferenceError) -> Self {
        PretokenizeError::new(error.message())
    }
}

impl From<crate::backend::BackendError> for PretokenizeError {
    fn from(error: crate::backend::BackendError) -> Self {
        PretokenizeError::new(error.to_string())
    }
}

/// Checks a text length against the pipeline's limits.
pub fn check_text_len(text_len: usize) -> Result<(), PretokenizeError> {
    if text_len > MAX_TEXT_BYTES {
        return Err(PretokenizeError::new(format!(
            "Fix: the text has {text_len} bytes, more than the pipeline's limit of {MAX_TEXT_BYTES}; split it into chunks"
        )));
    }
    Ok(())
}
