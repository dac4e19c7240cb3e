//! GPT-2's pre-tokenizer on the GPU (§10): split UTF-8 text into the pieces a
//! byte-level BPE tokenizer (GPT-2; tiktoken's r50k and p50k) encodes, with two
//! small programs written in this crate's IR.
//!
//! # Why this module exists
//!
//! vyre-cuda exists for a GPU-resident tokenizer, and this split dominates a
//! byte-level BPE tokenizer's CPU time (§10: 20–124 ms for 256 KiB through the
//! usual CPU engines). The example a user runs first (`examples/pretokenize.rs`),
//! the CPU tests and the GPU tests all exercise the same programs: the text goes
//! up once per encode, two dispatches run over buffers allocated once (the class
//! table among them, uploaded once per pipeline), and only the piece count and
//! exactly the piece starts come back, both through host-mapped memory.
//!
//! # The split
//!
//! Exactly the pattern
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! (leftmost-first, greedy; `\p{L}` = general category L*, `\p{N}` = N*, `\s` =
//! White_Space, from the [Unicode table](unicode), Unicode
//! [`unicode::UNICODE_VERSION`]). The output is the byte offset of every match
//! start, increasing. The matches tile the text (every character begins some
//! alternative), so the pieces are the text cut at those offsets; an empty text
//! has none. Verified against `fancy-regex` (the engine tiktoken's Rust core
//! uses) on every generated and hand-written test text and on tens of thousands of
//! random strings (`tests/pretokenize.rs`).
//!
//! **Invalid UTF-8.** Every byte that is not part of a valid UTF-8 character (by
//! Unicode's table of well-formed sequences: no overlong forms, no surrogates,
//! nothing past U+10FFFF, nothing cut short) is a character of its own that
//! decodes as U+FFFD, so of class "other". The split of any byte string is
//! therefore the oracle's split of the string with each such byte replaced by
//! U+FFFD, mapped back to the original offsets; the tests check exactly that. Text
//! cut mid-character is the same rule: the cut character's bytes are invalid.
//!
//! # The rule per byte
//!
//! The GPU decides for each byte on its own whether a piece starts there. Say
//! "character" for a decoded character, `c` for the one starting at the byte (no
//! piece starts inside a character), `p` for the character before it and `x` for
//! the one after. A piece starts at `c` iff `p` does not exist, or `c` is not the
//! second or third character of a contraction and
//!
//! - a contraction ends just before `c`, or
//! - `c` is white space and `p` is not, or
//! - `c` and `p` are white space and `x` exists and is not (`\s+(?!\S)` leaves
//!   the last white space of a run to the next piece), or
//! - `c` is not white space, `p` is white space other than U+0020 (only U+0020
//!   joins the next piece through ` ?`), or
//! - neither is white space and their classes differ.
//!
//! A contraction is `'` followed by `s t m d` or `re ve ll` where the `'` starts a
//! match, that is where the character before it is a letter, a number, white space
//! other than U+0020, or nothing. (Any other `'` is inside a run of "other"
//! characters or joins a preceding U+0020.) Contractions consist of ASCII, so
//! the rule needs the codes of at most 7 bytes back and 4 ahead. [`cpu`] is a
//! plain sequential matcher that tries the alternatives in order instead; the two
//! formulations and the oracle agree on every test input.
//!
//! ```
//! use vyre_tokenizer::pretokenize::{cpu, pipeline, programs};
//! let text = "Hello, world!  It's 42 €\n".as_bytes();
//! // The three IR programs on the CPU reference interpreter (a CUDA device runs the
//! // same programs through `pipeline::CudaPipeline`).
//! let starts = pipeline::run_reference(&programs::programs(), text).unwrap().piece_starts;
//! assert_eq!(starts, cpu::piece_starts(text).unwrap());
//! let pieces: Vec<&str> = cpu::pieces(text, &starts)
//!     .into_iter()
//!     .map(|piece| std::str::from_utf8(piece).unwrap())
//!     .collect();
//! assert_eq!(pieces, ["Hello", ",", " world", "!", " ", " It", "'s", " 42", " €", "\n"]);
//! ```
//!
//! # The pipeline
//!
//! `n` bytes, `B = ceil(n / 1024)` blocks of [`WORKGROUP_SIZE`] threads and
//! [`BYTES_PER_THREAD`] bytes per thread (the default [`Geometry`]; tests build
//! smaller ones). [`programs::STEPS`] is the one
//! description of the steps that the reference run, the eager CUDA run and the
//! graph recording follow:
//!
//! | step | program | reads | writes |
//! |---|---|---|---|
//! | 1 | `split` | `text` (u8), `class_table` (u32) | `marks[i]` = 1 where a piece starts, `block_counts[b]` |
//! | 2 | `compact` (at most [`COMPACT_WORKGROUPS`] workgroups) | `marks`, `block_counts` | `piece_starts[Σ block_counts[..b] + rank] = i` (host-mapped), `piece_count[0]` |
//!
//! The compaction sums the counts before its blocks itself, so no scan dispatch
//! runs between the two (measured on the H200, 2026-12-01: three dispatches took
//! 102–108 µs eager per 256 KiB encode, a synchronize each, and the scan's single
//! workgroup was a kernel node of its own in the graph).
//!
//! [`programs`] holds the IR, [`pipeline`] runs it on the reference interpreter
//! or on a CUDA device, [`unicode`] builds the class table, [`text`] generates
//! the sample inputs.

pub mod cpu;
mod matcher;
pub mod pattern;
pub mod per_position;
pub mod pipeline;
pub mod programs;
pub mod text;
pub mod unicode;

use std::fmt;

/// Threads per workgroup of the per-byte programs (split, compact) in the default
/// [`Geometry`].
pub const WORKGROUP_SIZE: u32 = 256;

/// Bytes each thread of both programs handles in the default [`Geometry`] (a
/// block of the split is `WORKGROUP_SIZE · BYTES_PER_THREAD` = 1 KiB).
///
/// Why not one: every warp of a kernel ends with one atomic on a single
/// per-launch counter (the result ABI's end-of-grid detection, `codegen::ptx`),
/// and 1 byte per thread is 8,192 warps per kernel for 256 KiB; 4 bytes per
/// thread cut that to 2,048, with the thread's text and table loads unrolled so
/// they overlap.
pub const BYTES_PER_THREAD: u32 = 4;

/// Most workgroups of the compaction in the default [`Geometry`]: texts up to
/// 1 MiB get one block of the split per compaction workgroup.
pub const COMPACT_WORKGROUPS: u32 = 1024;

/// The workgroup shapes the programs are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Threads per workgroup of both programs: 16..=1024 (the split program's
    /// first `2 · HALO` threads fill the window's far side).
    pub workgroup_size: u32,
    /// Bytes each thread handles, 1..=8: thread `t` of a block takes its bytes
    /// `t, t + W, t + 2W, ...`, so a block of the split is `W · bytes_per_thread`
    /// bytes ([`Geometry::block_bytes`]).
    pub bytes_per_thread: u32,
    /// Most workgroups of the compaction, 1..=65536: each sums the counts of the
    /// blocks before its own (so all of them together load at most
    /// `compact_workgroups · B / 2` counts) and then compacts
    /// `ceil(B / compact_workgroups)` blocks one after another.
    pub compact_workgroups: u32,
}

impl Default for Geometry {
    /// [`WORKGROUP_SIZE`], [`BYTES_PER_THREAD`] and [`COMPACT_WORKGROUPS`].
    fn default() -> Self {
        Geometry {
            workgroup_size: WORKGROUP_SIZE,
            bytes_per_thread: BYTES_PER_THREAD,
            compact_workgroups: COMPACT_WORKGROUPS,
        }
    }
}

impl Geometry {
    /// Rejects shapes the programs cannot run with.
    pub fn check(&self) -> Result<(), PretokenizeError> {
        if !(2 * programs::HALO..=1024).contains(&self.workgroup_size) {
            return Err(PretokenizeError::new(format!(
                "Fix: Geometry::workgroup_size is {}; use 16 to 1024 threads",
                self.workgroup_size
            )));
        }
        if !(1..=8).contains(&self.bytes_per_thread) {
            return Err(PretokenizeError::new(format!(
                "Fix: Geometry::bytes_per_thread is {}; use 1 to 8",
                self.bytes_per_thread
            )));
        }
        if !(1..=65_536).contains(&self.compact_workgroups) {
            return Err(PretokenizeError::new(format!(
                "Fix: Geometry::compact_workgroups is {}; use 1 to 65536",
                self.compact_workgroups
            )));
        }
        Ok(())
    }

    /// Bytes of one block of the split: `workgroup_size · bytes_per_thread`.
    pub fn block_bytes(&self) -> u32 {
        self.workgroup_size.saturating_mul(self.bytes_per_thread)
    }

    /// Workgroups of the split (`B`, one per [`Geometry::block_bytes`] bytes) for a
    /// text of `text_len` bytes.
    pub fn blocks_for(&self, text_len: usize) -> u32 {
        let blocks = text_len.div_ceil(self.block_bytes().max(1) as usize);
        u32::try_from(blocks).unwrap_or(u32::MAX)
    }

    /// Workgroups of the compaction for `blocks` blocks of the split: `ceil(B /
    /// per)` with `per = ceil(B / compact_workgroups)` blocks each, so none is
    /// idle.
    pub fn compaction_workgroups(&self, blocks: u32) -> u32 {
        let per = blocks.div_ceil(self.compact_workgroups.max(1)).max(1);
        blocks.div_ceil(per)
    }
}

/// Largest text the pipeline accepts (256 MiB): every buffer then fits `u32`
/// element counts with room to spare, and a dispatch needs at most 2^20 workgroups.
pub const MAX_TEXT_BYTES: usize = 256 << 20;

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

impl From<vyre_cuda::reference::ReferenceError> for PretokenizeError {
    fn from(error: vyre_cuda::reference::ReferenceError) -> Self {
        PretokenizeError::new(error.message())
    }
}

impl From<vyre_cuda::backend::BackendError> for PretokenizeError {
    fn from(error: vyre_cuda::backend::BackendError) -> Self {
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
