//! The split of every pattern (GPT-2's, cl100k's, o200k's) on the device, for
//! a packed batch of documents: the programs, and the one description of their
//! steps ([`SplitPrograms`]) that a longer device pipeline composes (the BPE
//! steps come after them, in the same stream or graph) and that [`runner`]
//! runs alone on an `AnyBackend`.
//!
//! # Why this module exists
//!
//! A GPU-resident tokenizer uploads text and downloads token ids; the split is
//! its first step and must run on the device for every encoding, for many
//! documents at once (`encode_batch` packs them into one upload), and give
//! exactly [`pattern::split_into`](super::pattern::split_into)'s piece starts
//! for each document, as if it were alone. GPT-2's single-document
//! [`CudaPipeline`](super::pipeline::CudaPipeline) (two dispatches, measured at
//! 54–59 µs per 256 KiB as a graph on the H200) stays as it is; these programs
//! take any batch and every pattern.
//!
//! # The contract
//!
//! Inputs, per batch: [`SplitBuffer::Text`] (`u8`: the documents back to back)
//! and [`SplitBuffer::DocumentEnds`] (`u32`: the exclusive end offset of each
//! document in the text, never decreasing, the last equal to the text length;
//! empty documents allowed: [`check_batch`]). Outputs:
//! [`SplitBuffer::PieceStarts`] (`u32`: global byte offsets, increasing; every
//! non-empty document's first byte is a piece start; no piece crosses a
//! document end; look-behind and look-ahead never see another document: each
//! document splits exactly as it would alone) and [`SplitBuffer::PieceCount`]
//! (`u32[1]`). Resident: [`SplitBuffer::KindTable`] ([`table_bytes`]: the
//! kind table, 35,328 bytes, and cl100k's and o200k's word tables; uploaded
//! once). Scratch: [`SplitBuffer::Statuses`] and
//! [`SplitBuffer::Counters`] (zeroed once when allocated; every step leaves
//! them zeroed, or in a fused kernel a later step of it: [`SplitBuild`], so
//! nothing clears them between runs) and, for cl100k and
//! o200k, [`SplitBuffer::Codes`] (one byte per text byte, between their two
//! steps).
//!
//! Every step ([`SplitPrograms::steps`]: its program and the buffers it binds,
//! in binding order) runs on [`SplitPrograms::workgroups`]`(text length)`
//! workgroups (at least one, so an empty batch writes a count of 0); sizes are
//! [`SplitPrograms::buffer_bytes`]`(buffer, text length, documents)`. The text
//! length the programs use is the last document end (capped at the text
//! buffer's length), so a larger `Text` buffer serves (its bytes past the end
//! are never read), and so does a longer `DocumentEnds` whose extra entries
//! repeat the text length (empty documents); scratch and output buffers may be
//! larger. In a recorded graph, `DispatchGraph::set_element_count` and
//! `set_workgroups` move one recording to another batch size.
//!
//! | pattern | steps | reads | writes |
//! |---|---|---|---|
//! | GPT-2 | `split` | text, document ends, kind table | piece starts, piece count |
//! | cl100k, o200k | `classify` | text, document ends, kind table | codes |
//! | | `phases` | document ends, word table, codes (and the text, cutting) | piece starts, piece count |
//!
//! An encoder builds them with [`SplitPrograms::build_cutting_unjoined`]: the
//! last step also starts a piece between two bytes that no token of the
//! vocabulary holds side by side (a bit table after the resident tables:
//! [`cutting_table_bytes`]); the ids stay exact and the pieces get shorter.
//!
//! Device memory per text byte: text 1, piece starts 4, codes 1 (cl100k,
//! o200k), and 32 bytes per 1 KiB block of status words (two sets of two:
//! [`SplitBuild`]): about 6 bytes.
//!
//! # How: the rule per position, as kernels
//!
//! Block `g` of `W` threads and `K` bytes per thread owns `S = W·K` bytes
//! (1 KiB by default). Every program starts with the window (module `window`): the
//! document starts near the block (a search of the document ends that narrows
//! `W`-fold per round, then a binary search per position), every byte decoded
//! inside its own document (a character cut by a document end is invalid
//! there, as at the end of a text: the
//! [invalid-byte rule](crate::pretokenize#the-split)) and every character's
//! [`Kind`](crate::pretokenize::unicode::Kind) from the resident 4-bit table
//! (two dependent loads). Thread `t` then decides its `K` consecutive bytes.
//!
//! - **GPT-2** needs only a bounded window: the [rule per
//!   byte](crate::pretokenize#the-rule-per-byte-gpt-2-on-the-gpu) over codes
//!   seven bytes back and four ahead. One dispatch: window, rule, the count per
//!   thread, the IR's workgroup scan, a look-back for the block's first piece
//!   index, the stores.
//! - **cl100k and o200k** need facts from arbitrarily far away, in both
//!   directions. [`per_position`](crate::pretokenize::per_position) states
//!   them: `break_ahead` and `upper_to_end` look ahead; the digit count of a
//!   number run (groups of three counted from the run's start, in characters),
//!   a punctuation piece's line-break tail and o200k's caseless letters before
//!   or after the first lower-case one look back. Step 1 (`classify`) computes
//!   the two look-ahead facts as suffix minima of "the first character that
//!   decides" (in the thread, the IR's minimum scan across the workgroup, a
//!   look-back towards the end of the text across workgroups) and stores one
//!   code byte per text byte. Step 2 (`phases`) runs the split as a [state
//!   machine](rules) of eight states (the sixteen phases merged where the
//!   window tells them apart): each character's transition map (a nibble per
//!   state, one `u32`) and start bits (8), the maps composed per thread, a
//!   Hillis–Steele scan of maps across the workgroup (module `maps`), a look-back of
//!   maps across workgroups, then every byte's state and "a piece starts here"
//!   bit; then the same count, scan, look-back and stores as GPT-2.
//!
//! No thread ever walks a run: a 100 KiB digit run, white-space run or
//! upper-case stretch costs what any 100 KiB costs.
//!
//! The look-back (module `lookback`; decoupled: each block publishes its aggregate,
//! then combines the blocks before it `W` status words at a time until one
//! that has published its inclusive prefix) replaces a scan dispatch per
//! prefix; blocks take their place in the text by a ticket in the order they
//! start, so a block only ever waits for blocks that started before it.
//!
//! # Cost per 256 KiB (expected; the lead measures on the H200)
//!
//! GPT-2: one dispatch where the single-document pipeline has two (split,
//! then compaction), and no marks array in between (256 KiB written and read
//! back). Per byte about 30 integer operations of decode and table lookup
//! (ASCII skips the decode), 25 of rule; per block nine workgroup reductions
//! or scans (ticket, two in the document-end search, count scan and sum, three
//! in the look-back, the last-block count) of two barriers each. Expected:
//! about the single-document split's 6 µs of kernel plus a few µs of barriers
//! and look-back, against 14–18 µs for the two kernels today, and one launch
//! (3.6 µs eager, 1.0 µs as a graph node) less.
//!
//! cl100k and o200k: two dispatches. `classify` is GPT-2's window plus one or
//! two minimum scans (about 10 operations per byte) and a byte store per text
//! byte; `phases` reads one byte per text byte, looks up each character's
//! word (its pattern's eight states: five loads of class offsets and two of
//! the [word table](mod@word_table)'s entry, where evaluating the rules took
//! about 190 instructions), composes maps (about 16 instructions each with
//! byte permutes, 48 before them: `K − 1` per thread, `log2 W` rounds of the
//! workgroup scan) and runs two look-backs. Expected: 8–12 µs of kernel each,
//! 20–25 µs together.
//!
//! All of it was checked on the reference interpreter (`tests/batch_split.rs`);
//! the GPU figures are estimates until `gpu_batch_split` and the bench run on
//! a device.

mod classify;
pub mod code;
mod gpt2;
mod ir;
pub(crate) mod lookback;
mod maps;
mod phases;
mod pieces;
pub mod rules;
pub mod runner;
mod window;
pub mod word_table;

use std::sync::OnceLock;

use vyre_cuda::ir::{ElemType, Program};
use word_table::WordTable;

use super::pattern::Pattern;
use super::unicode::kind_table;
use super::{Geometry, PretokenizeError, MAX_TEXT_BYTES};

pub use lookback::COUNTER_WORDS;
pub use window::HALO;

/// A buffer of the split, by what it holds. Each step binds some of them in
/// its own order ([`SplitStep::bindings`]); the sizes are
/// [`SplitPrograms::buffer_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitBuffer {
    /// `u8`: the documents' bytes back to back (input).
    Text,
    /// `u32`: the exclusive end offset of each document in `Text`,
    /// non-decreasing (an empty document repeats the offset), the last equal to
    /// the text length (input).
    DocumentEnds,
    /// `u32`: the Unicode [kind table](crate::pretokenize::unicode::KindTable)
    /// ([`table_bytes`]), then for cl100k and o200k their state machine's
    /// [word table](mod@word_table), then for a split that cuts between
    /// unjoined bytes the table of joined byte pairs
    /// ([`cutting_table_bytes`]); uploaded once and resident.
    KindTable,
    /// `u8`: one code per text byte ([`code`]), written by cl100k's and o200k's
    /// first step and read by their second (scratch).
    Codes,
    /// `u64`: the look-back status words, two sets of two per block (the
    /// second for fused kernels: [`SplitBuild`]) (scratch; zeroed once
    /// when allocated, every dispatch leaves it zeroed: a dispatched step
    /// itself, a fused kernel's split steps through a later step of the
    /// kernel).
    Statuses,
    /// `u32`: [`COUNTER_WORDS`] counters (scratch; zeroed once when allocated,
    /// every step leaves it zeroed).
    Counters,
    /// `u32`: the piece start offsets, increasing (output; room for one per text
    /// byte).
    PieceStarts,
    /// `u32`: the number of pieces, one word (output).
    PieceCount,
}

impl SplitBuffer {
    /// Every buffer; `buffer as usize` indexes it.
    pub const ALL: [SplitBuffer; 8] = [
        SplitBuffer::Text,
        SplitBuffer::DocumentEnds,
        SplitBuffer::KindTable,
        SplitBuffer::Codes,
        SplitBuffer::Statuses,
        SplitBuffer::Counters,
        SplitBuffer::PieceStarts,
        SplitBuffer::PieceCount,
    ];

    /// The buffer's name in the programs.
    pub const fn name(self) -> &'static str {
        match self {
            SplitBuffer::Text => "text",
            SplitBuffer::DocumentEnds => "document_ends",
            SplitBuffer::KindTable => "kind_table",
            SplitBuffer::Codes => "codes",
            SplitBuffer::Statuses => "statuses",
            SplitBuffer::Counters => "counters",
            SplitBuffer::PieceStarts => "piece_starts",
            SplitBuffer::PieceCount => "piece_count",
        }
    }

    /// Its element type.
    pub const fn element(self) -> ElemType {
        match self {
            SplitBuffer::Text | SplitBuffer::Codes => ElemType::U8,
            SplitBuffer::Statuses => ElemType::U64,
            _ => ElemType::U32,
        }
    }
}

/// One step of a split: a program and the buffers it binds, in binding order.
/// Every step runs on [`SplitPrograms::workgroups`] workgroups.
#[derive(Clone, Debug)]
pub struct SplitStep {
    /// The step's name (`split`, `classify`, `phases`).
    pub name: &'static str,
    /// The program (its entry op id is `pretokenize.batch.<pattern>...`).
    pub program: Program,
    /// One buffer per global buffer of the program, in binding order.
    pub bindings: &'static [SplitBuffer],
    /// Registers per thread its body keeps without spilling inside a loop
    /// (`ptxas -v` and `nvdisasm`, `sm_90`; see [`crate::occupancy`]).
    pub body_registers: u32,
}

/// The split of one pattern on the device: its steps, in dispatch order.
#[derive(Clone, Debug)]
pub struct SplitPrograms {
    pattern: Pattern,
    geometry: Geometry,
    cuts_unjoined: bool,
    steps: Vec<SplitStep>,
    /// The same steps built for a fused kernel ([`SplitBuild::Fused`]).
    fused_steps: Vec<SplitStep>,
}

const GPT2_BINDINGS: &[SplitBuffer] = &[
    SplitBuffer::Text,
    SplitBuffer::DocumentEnds,
    SplitBuffer::KindTable,
    SplitBuffer::Statuses,
    SplitBuffer::Counters,
    SplitBuffer::PieceStarts,
    SplitBuffer::PieceCount,
];

const CLASSIFY_BINDINGS: &[SplitBuffer] = &[
    SplitBuffer::Text,
    SplitBuffer::DocumentEnds,
    SplitBuffer::KindTable,
    SplitBuffer::Codes,
    SplitBuffer::Statuses,
    SplitBuffer::Counters,
];

/// `phases` of a split that cuts between unjoined bytes binds every buffer, in
/// [`SplitBuffer::ALL`]'s order (it reads the text for the cuts).
const PHASES_CUTTING_BINDINGS: &[SplitBuffer] = SplitBuffer::ALL.as_slice();

/// `phases` of the split alone: every buffer but the text.
const PHASES_BINDINGS: &[SplitBuffer] = PHASES_CUTTING_BINDINGS.split_at(1).1;

const _: () = assert!(matches!(PHASES_CUTTING_BINDINGS[0], SplitBuffer::Text));

/// The buffers `phases` binds: the cutting list when it cuts between unjoined
/// bytes (`cuts`, the joined-pairs table's word), else the other.
fn phases_bindings(cuts: Option<u32>) -> &'static [SplitBuffer] {
    match cuts {
        Some(_) => PHASES_CUTTING_BINDINGS,
        None => PHASES_BINDINGS,
    }
}

/// Status words per block in each of the two sets of regions
/// ([`SplitBuild`]): the most look-backs one step runs (cl100k's and o200k's
/// second step: states, then piece counts).
pub const STATUS_WORDS_PER_BLOCK: u32 = 2;

/// How a split program is built: dispatched on its own, or as a step of a
/// kernel that runs every step (the encoder's fused kernels).
///
/// A step dispatched on its own orders its workgroups by a ticket each takes
/// as it starts (a look-back then waits only for workgroups that run), uses
/// the first set of status words (the buffer's first half) and ends with
/// `lookback::finish`: the last workgroup to count itself done clears the
/// words and counters for the next dispatch. A fused kernel runs each step's
/// groups in index order (one workgroup) or all at once (a cooperative grid),
/// with a barrier or a grid sync between steps, so there a group's index is
/// its place and no ticket is taken; and the split's steps leave their status
/// words to a later step instead of counting themselves done: `classify` uses
/// the first set and `phases` clears its words there (every group the word of
/// its block) while it uses the second set (the buffer's second half), as GPT-2's
/// `split` does; the encoder's `compact`, the kernel's last step, clears the
/// second set and uses the first, ending with `finish` as a dispatch does. So
/// every word and counter is zero again when the kernel ends, as after steps
/// dispatched one by one, and the two steps spare a contended atomic for the
/// ticket, and two fences around another for the done count, on every group's
/// serial path. On an H100 (2026-12-06, the encode example, 256 KiB, cl100k,
/// three rounds alternating with the build before, the resident kernel's own
/// clock) prose took 53.1–54.2 against 55.0–57.8 µs (`classify` 6.4–6.6
/// against 7.9–8.2, `phases` 8.2 against 9.9–10.0, `compact`, which keeps its
/// done count but takes no ticket, 6.5–6.6 against 7.4–7.5), CJK 59.1–61.3
/// against 63.0–63.8 and code 81.9–82.0 against 85.4–86.7.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitBuild {
    /// Each program is its own dispatch.
    Dispatched,
    /// The programs are steps of a fused kernel (see above).
    Fused,
}

impl SplitPrograms {
    /// The split of `pattern` with the default [`Geometry`].
    pub fn new(pattern: Pattern) -> SplitPrograms {
        SplitPrograms::build(pattern, Geometry::default())
            .unwrap_or_else(|_| unreachable!("the default geometry is valid"))
    }

    /// The split of `pattern` for another geometry (small ones let CPU tests
    /// cross many workgroups with short texts). Only `workgroup_size` and
    /// `bytes_per_thread` matter here. The programs' workgroup memory (two
    /// words and a byte per byte of a block, and one word per thread for each
    /// workgroup reduction once lowered to a tree: over 48 KiB for blocks of
    /// 4 KiB) is
    /// the device's to check: compiling them on a backend validates them against
    /// its limit (an H200 gives a kernel 227 KiB, so blocks of 8 KiB fit; a lane
    /// or a device without opt-in shared memory 48 KiB, blocks of 2 KiB).
    pub fn build(pattern: Pattern, geometry: Geometry) -> Result<SplitPrograms, PretokenizeError> {
        SplitPrograms::build_with(pattern, geometry, false)
    }

    /// [`SplitPrograms::build`] for an encoder: the programs also start a
    /// piece at every byte whose byte before it (in its document) is one no
    /// token of the vocabulary holds right before it. No merge can join two
    /// parts across such a boundary (every part a merge makes is a token, and
    /// it would hold the two bytes), so each side merges exactly as it would
    /// alone and the ids are unchanged; the pieces are shorter, and most of
    /// them are whole tokens. (cl100k holds 6,611 of the 65,536 byte pairs; a
    /// piece of generated CJK text that is no token, 23 bytes on average,
    /// falls into 13.4 such pieces, 9.8 of them one token, measured by the
    /// CPU encoder, which merges the same segments.)
    ///
    /// The table of joined pairs is [`JOINED_PAIR_WORDS`] words right after
    /// [`table_bytes`] in [`SplitBuffer::KindTable`] ([`cutting_table_bytes`]
    /// writes both); `phases` then binds the text as well.
    pub fn build_cutting_unjoined(
        pattern: Pattern,
        geometry: Geometry,
    ) -> Result<SplitPrograms, PretokenizeError> {
        SplitPrograms::build_with(pattern, geometry, true)
    }

    fn build_with(
        pattern: Pattern,
        geometry: Geometry,
        cuts_unjoined: bool,
    ) -> Result<SplitPrograms, PretokenizeError> {
        geometry.check()?;
        let cuts = match cuts_unjoined {
            true => Some(joined_pairs_start(pattern)?),
            false => None,
        };
        let words = word_table(pattern)?;
        let steps_for = |build: SplitBuild| match words {
            None => vec![SplitStep {
                name: "split",
                program: gpt2::program(geometry, cuts, build),
                bindings: GPT2_BINDINGS,
                body_registers: 32,
            }],
            Some(words) => vec![
                SplitStep {
                    name: "classify",
                    program: classify::program(pattern, geometry, build),
                    bindings: CLASSIFY_BINDINGS,
                    body_registers: 32,
                },
                SplitStep {
                    name: "phases",
                    program: phases::program(words, geometry, cuts, build),
                    bindings: phases_bindings(cuts),
                    body_registers: 64,
                },
            ],
        };
        Ok(SplitPrograms {
            pattern,
            geometry,
            cuts_unjoined,
            steps: steps_for(SplitBuild::Dispatched),
            fused_steps: steps_for(SplitBuild::Fused),
        })
    }

    /// The pattern.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// The geometry the programs were built for.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Whether they also cut between bytes no token joins
    /// ([`SplitPrograms::build_cutting_unjoined`]).
    pub fn cuts_unjoined(&self) -> bool {
        self.cuts_unjoined
    }

    /// The steps, in dispatch order.
    pub fn steps(&self) -> &[SplitStep] {
        &self.steps
    }

    /// The steps built for a fused kernel ([`SplitBuild::Fused`]), in order.
    pub fn fused_steps(&self) -> &[SplitStep] {
        &self.fused_steps
    }

    /// Workgroups of every step for a text of `text_len` bytes: one per block of
    /// [`Geometry::block_bytes`], at least one (an empty batch still writes a
    /// piece count of 0).
    pub fn workgroups(&self, text_len: usize) -> u32 {
        self.geometry.blocks_for(text_len).max(1)
    }

    /// Whether any step binds `buffer`.
    pub fn binds(&self, buffer: SplitBuffer) -> bool {
        self.steps
            .iter()
            .any(|step| step.bindings.contains(&buffer))
    }

    /// The least size in bytes of `buffer` for `text_len` bytes in
    /// `document_count` documents (0 for a buffer no step binds). Larger buffers
    /// serve too (capacity), except that `Text` and `DocumentEnds` are read to
    /// their length: bind exactly the batch, or pad `DocumentEnds` with the text
    /// length (empty documents) and `Text` with anything (bytes past the last
    /// document end are never read).
    pub fn buffer_bytes(
        &self,
        buffer: SplitBuffer,
        text_len: usize,
        document_count: usize,
    ) -> Result<u64, PretokenizeError> {
        if !self.binds(buffer) {
            return Ok(0);
        }
        let text = text_len as u64;
        let blocks = u64::from(self.workgroups(text_len));
        Ok(match buffer {
            SplitBuffer::Text | SplitBuffer::Codes => text,
            SplitBuffer::DocumentEnds => 4 * document_count as u64,
            SplitBuffer::KindTable => {
                let joined = match self.cuts_unjoined {
                    true => JOINED_PAIR_WORDS,
                    false => 0,
                };
                4 * u64::from(joined_pairs_start(self.pattern)? + joined)
            }
            SplitBuffer::Statuses => 2 * 8 * u64::from(STATUS_WORDS_PER_BLOCK) * blocks,
            SplitBuffer::Counters => 4 * u64::from(COUNTER_WORDS),
            SplitBuffer::PieceStarts => 4 * text,
            SplitBuffer::PieceCount => 4,
        })
    }
}

/// The resident tables' bytes ([`SplitBuffer::KindTable`]) for `pattern`,
/// little-endian words: the kind table (35,328 bytes for Unicode 16.0: 140
/// distinct blocks of 256 code points and 4,352 index words), then for cl100k
/// and o200k the [word table](mod@word_table) of the pattern's state machine
/// (43,648 and 184,960 bytes).
pub fn table_bytes(pattern: Pattern) -> Result<Vec<u8>, PretokenizeError> {
    let mut bytes = kind_table()?.to_le_bytes();
    if let Some(table) = word_table(pattern)? {
        bytes.extend(table.words().iter().flat_map(|word| word.to_le_bytes()));
    }
    Ok(bytes)
}

/// Words of the table of joined byte pairs that a split built by
/// [`SplitPrograms::build_cutting_unjoined`] reads: a bit per byte pair.
pub const JOINED_PAIR_WORDS: u32 = (1 << 16) / 32;

/// The word where the table of joined byte pairs starts in the resident
/// tables of a split that cuts between unjoined bytes: right after
/// [`table_bytes`]'s.
pub fn joined_pairs_start(pattern: Pattern) -> Result<u32, PretokenizeError> {
    Ok(word_table_start()? + table_words(pattern)? as u32)
}

/// The resident tables of a split built by
/// [`SplitPrograms::build_cutting_unjoined`]: [`table_bytes`], then
/// `joined_pair_bits` ([`Vocabulary::joined_pair_bits`](crate::Vocabulary::joined_pair_bits):
/// 1,024 words of 64 bits, little-endian, which the programs read as
/// [`JOINED_PAIR_WORDS`] words of 32: bit `first << 8 | second` set where
/// some token holds the byte `first` right before `second`).
pub fn cutting_table_bytes(
    pattern: Pattern,
    joined_pair_bits: &[u64],
) -> Result<Vec<u8>, PretokenizeError> {
    if joined_pair_bits.len() * 2 != JOINED_PAIR_WORDS as usize {
        return Err(PretokenizeError::new(format!(
            "Fix: the table of joined byte pairs has {} words of 64 bits; pass the vocabulary's {} (Vocabulary::joined_pair_bits)",
            joined_pair_bits.len(),
            JOINED_PAIR_WORDS / 2
        )));
    }
    let mut bytes = table_bytes(pattern)?;
    bytes.extend(joined_pair_bits.iter().flat_map(|word| word.to_le_bytes()));
    Ok(bytes)
}

/// Words of `pattern`'s word table (0 for GPT-2's split, which has none).
fn table_words(pattern: Pattern) -> Result<usize, PretokenizeError> {
    Ok(word_table(pattern)?.map_or(0, |table| table.words().len()))
}

/// The word table of `pattern`'s state machine (built once per process per
/// pattern), stored right after the kind table; `None` for GPT-2's split,
/// which has no state machine.
pub fn word_table(pattern: Pattern) -> Result<Option<&'static WordTable>, PretokenizeError> {
    static TABLES: [OnceLock<WordTable>; 2] = [OnceLock::new(), OnceLock::new()];
    let Some(machine) = rules::StateMachine::of(pattern) else {
        return Ok(None);
    };
    let slot = usize::from(pattern == Pattern::O200k);
    let first_word = word_table_start()?;
    Ok(Some(
        TABLES[slot].get_or_init(|| WordTable::build(machine, first_word)),
    ))
}

/// The word where a word table starts in the resident tables: right after the
/// kind table.
pub fn word_table_start() -> Result<u32, PretokenizeError> {
    Ok(kind_table()?.words().len() as u32)
}

/// Checks a batch against the contract: at most [`MAX_TEXT_BYTES`] bytes,
/// document ends that never decrease and whose last is the text length (no
/// documents: an empty text).
pub fn check_batch(text_len: usize, document_ends: &[u32]) -> Result<(), PretokenizeError> {
    super::check_text_len(text_len)?;
    let mut previous = 0u32;
    for (index, &end) in document_ends.iter().enumerate() {
        if end < previous {
            return Err(PretokenizeError::new(format!(
                "Fix: document end {index} is {end}, before the end before it ({previous}); document ends must not decrease"
            )));
        }
        previous = end;
    }
    let last = document_ends.last().copied().unwrap_or(0) as usize;
    if last != text_len {
        return Err(PretokenizeError::new(format!(
            "Fix: the last document ends at {last} but the text has {text_len} bytes; end the last document at the text's length"
        )));
    }
    debug_assert!(text_len <= MAX_TEXT_BYTES);
    Ok(())
}
