//! The pre-tokenizers: split UTF-8 text into the pieces a byte-level BPE
//! tokenizer encodes, by the pattern of its encoding (GPT-2's for r50k and p50k,
//! cl100k's, o200k's), on the CPU and on the GPU for all three, with programs
//! written in vyre-cuda's IR: GPT-2's single-document pipeline (two programs,
//! [`pipeline`]) and the split of a packed batch of documents by any pattern
//! ([`batch`]: one dispatch for GPT-2, two for cl100k and o200k).
//!
//! # Why this module exists
//!
//! vyre-cuda exists for a GPU-resident tokenizer, and this split dominates a
//! byte-level BPE tokenizer's CPU time (measured on the GPU machine's CPU,
//! 256 KiB of real text: 20–124 ms through the usual CPU engines). The example a
//! user runs first (`examples/pretokenize.rs`), the CPU tests and the GPU tests
//! all exercise the same programs: the text goes up once per encode, two
//! dispatches run over buffers allocated once (the class table among them,
//! uploaded once per pipeline), and only the piece count and exactly the piece
//! starts come back, both through host-mapped memory. The BPE encoder's CPU path
//! splits with [`pattern::Splitter`], hundreds of MB/s on one thread where
//! `fancy-regex` (what tiktoken-rs splits with) does tens (`benches/split.rs`).
//!
//! # The split
//!
//! Exactly the pattern of a [`pattern::Pattern`], as tiktoken publishes it; for
//! GPT-2
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! (leftmost-first, greedy; `\p{L}` = general category L*, `\p{N}` = N*, `\s` =
//! White_Space, from the [Unicode tables](unicode), Unicode
//! [`unicode::UNICODE_VERSION`]). The output is the byte offset of every match
//! start, increasing. The matches tile the text (every character begins some
//! alternative of each pattern), so the pieces are the text cut at those
//! offsets; an empty text has none. Verified against `fancy-regex` (the engine
//! tiktoken's Rust core uses) running each pattern's text on every generated and
//! hand-written test text and on tens of thousands of random strings
//! (`tests/pretokenize.rs`, `tests/split.rs`).
//!
//! **Invalid UTF-8**, for every pattern and every path. Every byte that is not
//! part of a valid UTF-8 character (by Unicode's table of well-formed sequences:
//! no overlong forms, no surrogates, nothing past U+10FFFF, nothing cut short) is
//! a character of its own that decodes as U+FFFD, so of class "other" (a symbol).
//! The split of any byte string is therefore the oracle's split of the string
//! with each such byte replaced by U+FFFD, mapped back to the original offsets;
//! the tests check exactly that. Text cut mid-character is the same rule: the cut
//! character's bytes are invalid.
//!
//! # Three formulations
//!
//! - [`pattern::Splitter`]: the fast CPU split of every pattern, a sequential
//!   matcher that tries the alternatives in order at each piece start (what the
//!   encoder calls: [`pattern::split_into`], or its piece iterators).
//! - [`per_position`]: every pattern as a rule evaluated at each character
//!   position from a bounded window, two look-ahead facts and the phase of the
//!   character before: the plan for the GPU programs of cl100k and o200k, run on
//!   the CPU and checked like the others.
//! - For GPT-2, the GPU programs ([`programs`], the rule per byte below) and
//!   [`cpu`], the first plain-Rust formulation they were checked against.
//! - For cl100k and o200k, [`batch::rules`]: the phases merged into a state
//!   machine of eight states, the form the batch programs evaluate, run on the
//!   CPU and held to the oracle like the others.
//!
//! # The rule per byte (GPT-2, on the GPU)
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
//! # The rule per position (cl100k and o200k)
//!
//! Their patterns cut digit runs into groups of three, give a run of white
//! space to `\s*[\r\n]+` up to its last line break, let punctuation take the
//! line breaks after it, and (o200k) split letter runs by case with
//! backtracking, so some starts depend on characters arbitrarily far away. In
//! the words of the GPT-2 rule (`c`, `p` before it, `x` after it), a cl100k
//! piece starts at `c` iff `p` does not exist, or `c` is not inside a
//! contraction (`(?i:'s|'t|'re|'ve|'m|'ll|'d)`, starting where `p` of the `'`
//! is not punctuation and not U+0020) and
//!
//! - `c` is a number and `p` is not, or the number run before `c` has a
//!   multiple of three characters (*unbounded*: counted from the run's start);
//! - `p` is a number and `c` is not, or a contraction ends just before `c`;
//! - `c` is a letter and `p` is `\r`, `\n`, or punctuation at which no piece
//!   starts (the character before `p` is punctuation or U+0020); any other
//!   white space or punctuation before a letter is that piece's optional first
//!   character;
//! - `c` is punctuation (`[^\s\p{L}\p{N}]`) and `p` is neither punctuation nor
//!   U+0020;
//! - `c` is white space and `p` is not, unless `c` is `\r` or `\n` after
//!   punctuation (the punctuation piece's `[\r\n]*` takes it);
//! - `c` and `p` are white space, `c` is not `\r` or `\n`, and either `x`
//!   exists and is not white space (the last white space before text starts the
//!   next piece), or `p` is `\r` or `\n` and the nearest character before `p`
//!   that is not `\r` or `\n` is punctuation (*unbounded*: `p` ends a
//!   punctuation piece's tail), or `p` is `\r` or `\n` and none follows `c` in
//!   its white-space run (*unbounded*: `\s*[\r\n]+` ends at the run's last
//!   line break).
//!
//! ("Punctuation" is `[^\s\p{L}\p{N}]`: marks, symbols and U+FFFD too.)
//!
//! o200k has the same number, white-space and punctuation rules (its tail is
//! `[\r\n/]*`), contractions only as a suffix of a letter piece, and letter
//! pieces that need more: inside a run of letters and marks a piece starts at an
//! Lu or Lt letter after an Ll letter, or after Lm/Lo/M characters that follow
//! an Ll letter of the same piece (*unbounded* back), or after Lm/Lo/M
//! characters when the run is Lu/Lt from `c` to its end (*unbounded* ahead: the
//! first alternative backtracks to after the last caseless character); and a
//! mark after punctuation belongs to the punctuation piece or to a letter piece
//! depending on how that punctuation run began (*unbounded* back: `.\u{301}a` is
//! one piece, `..\u{301}a` two). [`per_position`] states all of it exactly, as
//! phases and two look-ahead facts a device computes with scans; [`batch`]
//! computes them (a suffix minimum for the facts, a prefix scan of transition
//! maps for the phases, decoupled look-back across workgroups).
//!
//! # GPT-2's single-document pipeline
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

pub mod batch;
pub mod cpu;
mod matcher;
pub mod pattern;
pub mod per_position;
pub mod pipeline;
pub mod programs;
pub mod text;
pub mod unicode;
mod utf8_ir;

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
