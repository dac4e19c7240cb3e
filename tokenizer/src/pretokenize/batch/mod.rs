//! The split of every pattern on the device, for a packed batch of documents:
//! the programs, and the one description of their steps that a longer device
//! pipeline composes (the BPE steps come after them) and that [`runner`] runs
//! alone.
//!
//! (Module docs are completed below.)

mod classify;
pub mod code;
mod gpt2;
mod ir;
mod lookback;
mod maps;
mod phases;
pub mod rules;
pub mod runner;
mod window;

use vyre_cuda::ir::{validate_lowered, ElemType, Limits, Program};
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};

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
    /// ([`kind_table_bytes`]), uploaded once and resident.
    KindTable,
    /// `u8`: one code per text byte ([`code`]), written by cl100k's and o200k's
    /// first step and read by their second (scratch).
    Codes,
    /// `u64`: the look-back status words, two per block (scratch; zeroed once
    /// when allocated, every step leaves it zeroed).
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
}

/// The split of one pattern on the device: its steps, in dispatch order.
#[derive(Clone, Debug)]
pub struct SplitPrograms {
    pattern: Pattern,
    geometry: Geometry,
    steps: Vec<SplitStep>,
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

const PHASES_BINDINGS: &[SplitBuffer] = &[
    SplitBuffer::DocumentEnds,
    SplitBuffer::Codes,
    SplitBuffer::Statuses,
    SplitBuffer::Counters,
    SplitBuffer::PieceStarts,
    SplitBuffer::PieceCount,
];

/// Status words per block: the most look-backs one step runs (cl100k's and
/// o200k's second step: states, then piece counts).
pub const STATUS_WORDS_PER_BLOCK: u32 = 2;

impl SplitPrograms {
    /// The split of `pattern` with the default [`Geometry`].
    pub fn new(pattern: Pattern) -> SplitPrograms {
        SplitPrograms::build(pattern, Geometry::default())
            .unwrap_or_else(|_| unreachable!("the default geometry is valid"))
    }

    /// The split of `pattern` for another geometry (small ones let CPU tests
    /// cross many workgroups with short texts). Only `workgroup_size` and
    /// `bytes_per_thread` matter here. A geometry whose programs need more
    /// shared memory than a device's 48 KiB (two words per byte of a block, and
    /// one per thread for each workgroup reduction once lowered to a tree: up to
    /// 256 × 8 or 512 × 4) is refused.
    pub fn build(pattern: Pattern, geometry: Geometry) -> Result<SplitPrograms, PretokenizeError> {
        geometry.check()?;
        let steps = match rules::StateMachine::of(pattern) {
            None => vec![SplitStep {
                name: "split",
                program: gpt2::program(geometry),
                bindings: GPT2_BINDINGS,
            }],
            Some(machine) => vec![
                SplitStep {
                    name: "classify",
                    program: classify::program(pattern, geometry),
                    bindings: CLASSIFY_BINDINGS,
                },
                SplitStep {
                    name: "phases",
                    program: phases::program(machine, geometry),
                    bindings: PHASES_BINDINGS,
                },
            ],
        };
        for step in &steps {
            fits_shared_memory(&step.program, geometry)?;
        }
        Ok(SplitPrograms {
            pattern,
            geometry,
            steps,
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

    /// The steps, in dispatch order.
    pub fn steps(&self) -> &[SplitStep] {
        &self.steps
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
            SplitBuffer::KindTable => kind_table()?.words().len() as u64 * 4,
            SplitBuffer::Statuses => 8 * u64::from(STATUS_WORDS_PER_BLOCK) * blocks,
            SplitBuffer::Counters => 4 * u64::from(COUNTER_WORDS),
            SplitBuffer::PieceStarts => 4 * text,
            SplitBuffer::PieceCount => 4,
        })
    }
}

/// Refuses `program` where its lowering without subgroup operations (the one
/// that needs the most shared memory: a tree per reduction) does not fit the
/// device limits.
fn fits_shared_memory(program: &Program, geometry: Geometry) -> Result<(), PretokenizeError> {
    let caps = LoweringCaps {
        subgroup_ops: false,
        subgroup_size: Limits::default().subgroup_size,
    };
    let lowered = lower_workgroup_reductions(program, &caps);
    validate_lowered(&lowered, &Limits::default()).map_err(|error| {
        PretokenizeError::new(format!(
            "Fix: the batch split's workgroups of {} threads × {} bytes do not fit the device ({error}); use fewer threads or bytes per thread",
            geometry.workgroup_size, geometry.bytes_per_thread
        ))
    })?;
    Ok(())
}

/// The resident kind table's bytes ([`SplitBuffer::KindTable`]): 35,328 bytes
/// for Unicode 16.0 (140 distinct blocks of 256 code points and 4,352 index
/// words), little-endian words.
pub fn kind_table_bytes() -> Result<Vec<u8>, PretokenizeError> {
    Ok(kind_table()?.to_le_bytes())
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
