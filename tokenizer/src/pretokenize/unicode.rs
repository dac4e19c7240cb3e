//! The Unicode character classes the GPT-2 pattern needs, as one compact table
//! that the GPU, the reference interpreter and the CPU splitter all read.
//!
//! # Why this module exists
//!
//! The pattern's `\p{L}`, `\p{N}` and `\s` must mean exactly what they mean to the
//! oracle (`fancy-regex`, which hands its character classes to the `regex` crate,
//! which takes them from `regex-syntax`). So the table is built from
//! `regex-syntax` itself: the same crate, the same version in `Cargo.lock`, the same
//! ranges — [`UNICODE_VERSION`] is the Unicode version of its generated tables. A
//! test compares the table with the oracle's own matches on every code point
//! `0..=0x10FFFF` (`tests/pretokenize_tables.rs`).
//!
//! # Layout (one `u32` buffer, uploaded once per pipeline)
//!
//! Every code point has a 2-bit [`CharClass`]. Code points come in blocks of 256;
//! blocks with the same 256 classes are stored once. The first
//! [`INDEX_ENTRIES`] words map `code_point >> 8` to the word offset of its block;
//! a block is [`WORDS_PER_BLOCK`] words of 16 two-bit classes each. A lookup is two
//! dependent loads:
//!
//! ```text
//! base  = table[cp >> 8]
//! word  = table[base + ((cp >> 4) & 15)]
//! class = (word >> ((cp & 15) * 2)) & 3
//! ```
//!
//! With Unicode 16.0 the table has a few hundred distinct blocks (see
//! [`ClassTable::distinct_blocks`]), about 40 KB in all: it stays in the device's
//! caches, and ASCII text touches two cache lines of it.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

use super::PretokenizeError;

/// The Unicode version of the tables in `regex-syntax` 0.8 (its generated files say
/// `ucd-generate ... ucd-16.0.0`), and so of this table and of the oracle.
pub const UNICODE_VERSION: &str = "16.0.0";

/// Code points per block (`1 << BLOCK_SHIFT`).
pub const BLOCK_SHIFT: u32 = 8;

/// Index words: one per block of 256 code points up to U+10FFFF.
pub const INDEX_ENTRIES: u32 = 0x11_0000 >> BLOCK_SHIFT;

/// Words per block: 256 code points × 2 bits.
pub const WORDS_PER_BLOCK: u32 = (1 << BLOCK_SHIFT) * 2 / 32;

/// One past the largest code point.
pub const CODE_POINTS: u32 = 0x11_0000;

/// What a character is to the GPT-2 pattern. The three named classes are
/// disjoint (general categories L* and N* never overlap, and no White_Space
/// character is a letter or a number); the table test checks it on every code point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CharClass {
    /// Neither a letter, a number nor white space: `[^\s\p{L}\p{N}]`. Invalid UTF-8
    /// bytes are this class too (they decode as U+FFFD, a symbol).
    Other = 0,
    /// `\p{L}`: general category L (Lu, Ll, Lt, Lm, Lo).
    Letter = 1,
    /// `\p{N}`: general category N (Nd, Nl, No).
    Number = 2,
    /// `\s`: the White_Space property.
    Whitespace = 3,
}

impl CharClass {
    /// The class from its 2-bit code (only the low two bits are read).
    pub const fn from_code(code: u32) -> CharClass {
        match code & 3 {
            1 => CharClass::Letter,
            2 => CharClass::Number,
            3 => CharClass::Whitespace,
            _ => CharClass::Other,
        }
    }
}

/// The class table: see the module docs for the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassTable {
    words: Vec<u32>,
}

/// The code point ranges of one class, as `regex-syntax` parses it in Unicode mode.
fn class_ranges(pattern: &str) -> Result<Vec<(u32, u32)>, PretokenizeError> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|error| {
            PretokenizeError::new(format!(
                "Fix: internal: regex-syntax rejected {pattern}: {error}; report this as a bug"
            ))
        })?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => Ok(class
            .ranges()
            .iter()
            .map(|range| (range.start() as u32, range.end() as u32))
            .collect()),
        _ => Err(PretokenizeError::new(format!(
            "Fix: internal: regex-syntax parsed {pattern} as something other than a Unicode class; report this as a bug"
        ))),
    }
}

impl ClassTable {
    /// Builds the table from `regex-syntax`'s `\p{L}`, `\p{N}` and `\s` (about a
    /// millisecond in a release build). Prefer [`class_table`], which builds it
    /// once per process.
    pub fn build() -> Result<ClassTable, PretokenizeError> {
        let mut classes = vec![CharClass::Other as u8; CODE_POINTS as usize];
        for (pattern, class) in [
            (r"\p{L}", CharClass::Letter),
            (r"\p{N}", CharClass::Number),
            (r"\s", CharClass::Whitespace),
        ] {
            for (start, end) in class_ranges(pattern)? {
                for code_point in start..=end.min(CODE_POINTS - 1) {
                    classes[code_point as usize] = class as u8;
                }
            }
        }
        let mut words = vec![0u32; INDEX_ENTRIES as usize];
        let mut seen: HashMap<[u32; WORDS_PER_BLOCK as usize], u32> = HashMap::new();
        for (block, chunk) in classes.chunks_exact(1 << BLOCK_SHIFT).enumerate() {
            let mut packed = [0u32; WORDS_PER_BLOCK as usize];
            for (offset, &class) in chunk.iter().enumerate() {
                packed[offset / 16] |= (class as u32) << ((offset % 16) * 2);
            }
            let next_base = u32::try_from(words.len()).unwrap_or(u32::MAX);
            let base = *seen.entry(packed).or_insert(next_base);
            if base == next_base {
                words.extend_from_slice(&packed);
            }
            words[block] = base;
        }
        Ok(ClassTable { words })
    }

    /// The class of `code_point`, by the same arithmetic the device runs. A value
    /// past U+10FFFF is [`CharClass::Other`].
    pub fn class_of(&self, code_point: u32) -> CharClass {
        if code_point >= CODE_POINTS {
            return CharClass::Other;
        }
        let base = self.words[(code_point >> BLOCK_SHIFT) as usize];
        let word = self.words[(base + ((code_point >> 4) & 15)) as usize];
        CharClass::from_code(word >> ((code_point & 15) * 2))
    }

    /// The table's words (index, then blocks).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The table as the device stores it: little-endian words.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect()
    }

    /// Distinct blocks of 256 code points stored.
    pub fn distinct_blocks(&self) -> usize {
        (self.words.len() - INDEX_ENTRIES as usize) / WORDS_PER_BLOCK as usize
    }
}

/// The class table, built on first use and shared by the whole process.
pub fn class_table() -> Result<&'static ClassTable, PretokenizeError> {
    static TABLE: OnceLock<Result<ClassTable, PretokenizeError>> = OnceLock::new();
    TABLE
        .get_or_init(ClassTable::build)
        .as_ref()
        .map_err(Clone::clone)
}
