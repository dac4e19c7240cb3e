//! The Unicode character classes the three patterns need, as two compact
//! tables: the 2-bit [`ClassTable`] that GPT-2's GPU programs, the reference
//! interpreter and [`cpu`](super::cpu) read, and the 4-bit [`KindTable`] that
//! the CPU split of every pattern reads (laid out the same way, for a device to
//! hold resident when cl100k and o200k get GPU programs).
//!
//! # Why this module exists
//!
//! The patterns' `\p{L}`, `\p{N}`, `\s`, `\p{Lu}`, `\p{M}`, ... and the
//! case-insensitive `(?i:'s|...)` must mean exactly what they mean to the oracle
//! (`fancy-regex`, which hands its character classes to the `regex` crate, which
//! takes them from `regex-syntax`). So the tables are built from `regex-syntax`
//! itself: the same crate, the same version in `Cargo.lock`, the same ranges and
//! the same simple case folding (U+017F LATIN SMALL LETTER LONG S is a
//! contraction's `s`; U+212A KELVIN SIGN folds to `k`, which no contraction
//! has) — [`UNICODE_VERSION`] is the Unicode version of its generated tables.
//! Tests compare both tables with the oracle's own matches on every code point
//! `0..=0x10FFFF`, class by class (`tests/pretokenize_tables.rs`,
//! `tests/split_tables.rs`).
//!
//! # Layout (one `u32` buffer each)
//!
//! Code points come in blocks of 256; blocks with the same 256 codes are stored
//! once. The first [`INDEX_ENTRIES`] words map `code_point >> 8` to the word
//! offset of its block. In the [`ClassTable`] every code point has a 2-bit
//! [`CharClass`] and a block is [`WORDS_PER_BLOCK`] words of 16 classes each; a
//! lookup is two dependent loads:
//!
//! ```text
//! base  = table[cp >> 8]
//! word  = table[base + ((cp >> 4) & 15)]
//! class = (word >> ((cp & 15) * 2)) & 3
//! ```
//!
//! The [`KindTable`] is the same with a 4-bit [`Kind`] per code point
//! ([`KIND_WORDS_PER_BLOCK`] words of 8 kinds per block; see its docs). With
//! Unicode 16.0 the class table has 133 distinct blocks, 25,920 bytes in all,
//! and the kind table 140 blocks, 35,328 bytes (an earlier version of these docs
//! said "a few hundred blocks, about 40 KB" for the class table; the test
//! bounds are below 1,000 blocks and 100,000 bytes): each stays in a device's
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
    table: TwoLevel<2>,
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

/// A two-level table of `BITS`-bit codes, one per code point: the layout of the
/// module docs ([`INDEX_ENTRIES`] index words, then each distinct block of 256
/// codes once, `32 / BITS` codes per word, low bits first). Both tables are one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TwoLevel<const BITS: u32> {
    words: Vec<u32>,
}

impl<const BITS: u32> TwoLevel<BITS> {
    const PER_WORD: u32 = 32 / BITS;
    const WORDS_PER_BLOCK: u32 = (1 << BLOCK_SHIFT) / Self::PER_WORD;

    /// Packs `codes[cp]` (each below `1 << BITS`) for every code point.
    fn pack(codes: &[u8]) -> TwoLevel<BITS> {
        let per_word = Self::PER_WORD as usize;
        let mut words = vec![0u32; INDEX_ENTRIES as usize];
        let mut seen: HashMap<Vec<u32>, u32> = HashMap::new();
        for (block, chunk) in codes.chunks_exact(1 << BLOCK_SHIFT).enumerate() {
            let mut packed = vec![0u32; Self::WORDS_PER_BLOCK as usize];
            for (offset, &code) in chunk.iter().enumerate() {
                packed[offset / per_word] |= (code as u32) << ((offset % per_word) as u32 * BITS);
            }
            let next_base = u32::try_from(words.len()).unwrap_or(u32::MAX);
            let base = *seen.entry(packed).or_insert_with_key(|packed| {
                words.extend_from_slice(packed);
                next_base
            });
            words[block] = base;
        }
        TwoLevel { words }
    }

    /// The code of `code_point` (below U+110000): two dependent loads.
    #[inline(always)]
    fn code(&self, code_point: u32) -> u32 {
        let base = self.words[(code_point >> BLOCK_SHIFT) as usize];
        let offset = code_point & ((1 << BLOCK_SHIFT) - 1);
        let word = self.words[(base + offset / Self::PER_WORD) as usize];
        (word >> ((offset % Self::PER_WORD) * BITS)) & ((1 << BITS) - 1)
    }

    fn le_bytes(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect()
    }

    fn distinct_blocks(&self) -> usize {
        (self.words.len() - INDEX_ENTRIES as usize) / Self::WORDS_PER_BLOCK as usize
    }
}

/// A table built on first use and shared by the whole process.
fn built_once<T>(
    cell: &'static OnceLock<Result<T, PretokenizeError>>,
    build: fn() -> Result<T, PretokenizeError>,
) -> Result<&'static T, PretokenizeError> {
    cell.get_or_init(build).as_ref().map_err(Clone::clone)
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
        Ok(ClassTable {
            table: TwoLevel::pack(&classes),
        })
    }

    /// The class of `code_point`, by the same arithmetic the device runs. A value
    /// past U+10FFFF is [`CharClass::Other`].
    pub fn class_of(&self, code_point: u32) -> CharClass {
        if code_point >= CODE_POINTS {
            return CharClass::Other;
        }
        CharClass::from_code(self.table.code(code_point))
    }

    /// The table's words (index, then blocks).
    pub fn words(&self) -> &[u32] {
        &self.table.words
    }

    /// The table as the device stores it: little-endian words.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.table.le_bytes()
    }

    /// Distinct blocks of 256 code points stored.
    pub fn distinct_blocks(&self) -> usize {
        self.table.distinct_blocks()
    }
}

/// The class table, built on first use and shared by the whole process.
pub fn class_table() -> Result<&'static ClassTable, PretokenizeError> {
    static TABLE: OnceLock<Result<ClassTable, PretokenizeError>> = OnceLock::new();
    built_once(&TABLE, ClassTable::build)
}

/// Bits per code point of the [`KindTable`].
pub const KIND_BITS: u32 = 4;

/// Words per block of the [`KindTable`]: 256 code points × 4 bits.
pub const KIND_WORDS_PER_BLOCK: u32 = (1 << BLOCK_SHIFT) * KIND_BITS / 32;

/// What a character is to the cl100k and o200k patterns (and to GPT-2's, which
/// needs less): its general category as far as a pattern tells them apart, and
/// for the letters a case-insensitive contraction names, which contraction
/// letter it is.
///
/// Every code point has one kind. Codes `0..=14` are stored in the
/// [`KindTable`] (four bits); the five ASCII characters the patterns name
/// literally (`'`, `/`, U+0020, `\r`, `\n`) are stored there under their general
/// kind (`Other` or `WhiteSpace`) and get their own kinds from
/// [`KindTable::kind_of`] (a device recognises them by their byte).
/// [`Kind::End`] is no character: it is what a scanner sees past the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// `[^\s\p{L}\p{N}\p{M}]` other than `'` and `/`: punctuation, symbols,
    /// controls, unassigned and private-use code points, surrogates, and every
    /// byte that is not valid UTF-8 (it decodes as U+FFFD, a symbol).
    Other = 0,
    /// `\p{M}`: a mark (Mn, Mc, Me). The GPT-2 and cl100k patterns treat it like
    /// `Other`; o200k's letter runs take it too.
    Mark = 1,
    /// `\p{N}`: a number (Nd, Nl, No).
    Number = 2,
    /// `\s` (White_Space) other than U+0020, `\r` and `\n`.
    WhiteSpace = 3,
    /// Lu or Lt, and not a contraction letter: only o200k's first letter class
    /// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` takes it.
    Upper = 4,
    /// Ll, and not a contraction letter: only o200k's second letter class
    /// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` takes it.
    Lower = 5,
    /// Lm or Lo: both of o200k's letter classes take it.
    OtherLetter = 6,
    /// An Lu letter that case-folds to `s`, `t`, `m` or `d` (a contraction's
    /// only letter: `'S`).
    UpperStmd = 7,
    /// An Ll letter that case-folds to `s`, `t`, `m` or `d` (U+017F LATIN SMALL
    /// LETTER LONG S among them).
    LowerStmd = 8,
    /// An Lu letter that case-folds to `r` or `v` (`'RE`, `'VE` need an `e` next).
    UpperRv = 9,
    /// An Ll letter that case-folds to `r` or `v`.
    LowerRv = 10,
    /// An Lu letter that case-folds to `e`.
    UpperE = 11,
    /// An Ll letter that case-folds to `e`.
    LowerE = 12,
    /// An Lu letter that case-folds to `l` (`'LL`).
    UpperL = 13,
    /// An Ll letter that case-folds to `l`.
    LowerL = 14,
    /// U+0027 APOSTROPHE, which opens a contraction.
    Apostrophe = 15,
    /// U+002F SOLIDUS, which o200k's `[\r\n/]*` takes after punctuation.
    Slash = 16,
    /// U+0020 SPACE, the only white space a ` ?` takes.
    Space = 17,
    /// `\r` or `\n` (the patterns never tell them apart).
    LineBreak = 18,
    /// Past the end of the text: in no class.
    End = 19,
}

impl Kind {
    /// Every kind by its code (`Kind::ALL[k as usize] == k`).
    pub const ALL: [Kind; 20] = [
        Kind::Other,
        Kind::Mark,
        Kind::Number,
        Kind::WhiteSpace,
        Kind::Upper,
        Kind::Lower,
        Kind::OtherLetter,
        Kind::UpperStmd,
        Kind::LowerStmd,
        Kind::UpperRv,
        Kind::LowerRv,
        Kind::UpperE,
        Kind::LowerE,
        Kind::UpperL,
        Kind::LowerL,
        Kind::Apostrophe,
        Kind::Slash,
        Kind::Space,
        Kind::LineBreak,
        Kind::End,
    ];

    /// The kind with code `code` ([`Kind::End`] for a code past the last kind).
    pub const fn from_code(code: u32) -> Kind {
        if code < Kind::ALL.len() as u32 {
            Kind::ALL[code as usize]
        } else {
            Kind::End
        }
    }

    /// The class GPT-2's pattern sees (marks are "other" there).
    pub const fn gpt2_class(self) -> CharClass {
        if KindSet::LETTER.contains(self) {
            CharClass::Letter
        } else if KindSet::NUMBER.contains(self) {
            CharClass::Number
        } else if KindSet::WHITE_SPACE.contains(self) {
            CharClass::Whitespace
        } else {
            CharClass::Other
        }
    }
}

/// A set of [`Kind`]s: one bit per kind, so membership is a shift and a mask.
/// The constants are the classes the patterns are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KindSet(u32);

impl KindSet {
    /// The set of `kinds`.
    pub const fn of(kinds: &[Kind]) -> KindSet {
        let mut bits = 0u32;
        let mut index = 0;
        while index < kinds.len() {
            bits |= 1 << kinds[index] as u32;
            index += 1;
        }
        KindSet(bits)
    }

    /// The union of two sets.
    pub const fn union(self, other: KindSet) -> KindSet {
        KindSet(self.0 | other.0)
    }

    /// The set as a bit mask: bit `k` is set where [`Kind`] code `k` is in the
    /// set (what a device tests with one shift and one mask).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether `kind` is in the set.
    #[inline(always)]
    pub const fn contains(self, kind: Kind) -> bool {
        (self.0 >> kind as u32) & 1 != 0
    }

    /// No kind.
    pub const NONE: KindSet = KindSet(0);
    /// `\p{Lu}` and `\p{Lt}`.
    pub const UPPER_CASE: KindSet = KindSet::of(&[
        Kind::Upper,
        Kind::UpperStmd,
        Kind::UpperRv,
        Kind::UpperE,
        Kind::UpperL,
    ]);
    /// `\p{Ll}`.
    pub const LOWER_CASE: KindSet = KindSet::of(&[
        Kind::Lower,
        Kind::LowerStmd,
        Kind::LowerRv,
        Kind::LowerE,
        Kind::LowerL,
    ]);
    /// `\p{L}`.
    pub const LETTER: KindSet = KindSet::UPPER_CASE
        .union(KindSet::LOWER_CASE)
        .union(KindSet::of(&[Kind::OtherLetter]));
    /// `\p{N}`.
    pub const NUMBER: KindSet = KindSet::of(&[Kind::Number]);
    /// `\s`.
    pub const WHITE_SPACE: KindSet = KindSet::of(&[Kind::WhiteSpace, Kind::Space, Kind::LineBreak]);
    /// `[\r\n]`.
    pub const LINE_BREAK: KindSet = KindSet::of(&[Kind::LineBreak]);
    /// `[\r\n/]`, o200k's tail after punctuation.
    pub const LINE_BREAK_OR_SLASH: KindSet = KindSet::of(&[Kind::LineBreak, Kind::Slash]);
    /// `[^\s\p{L}\p{N}]`: punctuation, symbols, marks and the rest.
    pub const OTHER: KindSet =
        KindSet::of(&[Kind::Other, Kind::Mark, Kind::Apostrophe, Kind::Slash]);
    /// `[^\r\n\p{L}\p{N}]`: the optional character before a letter run.
    pub const PREFIX: KindSet = KindSet::OTHER.union(KindSet::of(&[Kind::WhiteSpace, Kind::Space]));
    /// `\p{M}`, `\p{Lm}` and `\p{Lo}`: in both of o200k's letter classes.
    pub const CASELESS: KindSet = KindSet::of(&[Kind::Mark, Kind::OtherLetter]);
    /// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`: o200k's first letter class.
    pub const O200K_UPPER: KindSet = KindSet::UPPER_CASE.union(KindSet::CASELESS);
    /// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`: o200k's second letter class.
    pub const O200K_LOWER: KindSet = KindSet::LOWER_CASE.union(KindSet::CASELESS);
    /// `[\p{L}\p{M}]`: what o200k's letter runs are made of.
    pub const WORD: KindSet = KindSet::LETTER.union(KindSet::CASELESS);
    /// `(?i:s|t|m|d)`: a contraction's only letter.
    pub const CONTRACTION_STMD: KindSet = KindSet::of(&[Kind::UpperStmd, Kind::LowerStmd]);
    /// `(?i:r|v)`: the first letter of `'re` or `'ve`.
    pub const CONTRACTION_RV: KindSet = KindSet::of(&[Kind::UpperRv, Kind::LowerRv]);
    /// `(?i:e)`.
    pub const CONTRACTION_E: KindSet = KindSet::of(&[Kind::UpperE, Kind::LowerE]);
    /// `(?i:l)`.
    pub const CONTRACTION_L: KindSet = KindSet::of(&[Kind::UpperL, Kind::LowerL]);
}

/// The [`Kind`] of every code point, two levels like the [`ClassTable`] with four
/// bits per code point: the first [`INDEX_ENTRIES`] words map `code_point >> 8`
/// to the word offset of its block, a block is [`KIND_WORDS_PER_BLOCK`] words of
/// eight codes each:
///
/// ```text
/// base = table[cp >> 8]
/// word = table[base + ((cp >> 3) & 31)]
/// code = (word >> ((cp & 7) * 4)) & 15        // Kind::from_code(code), 0..=14
/// ```
///
/// Built from `regex-syntax` (general categories, White_Space, and the
/// case-insensitive classes `(?i:s)`, `(?i:t)`, ... of the contraction letters),
/// so it means what the oracle means; `tests/split_tables.rs` compares every
/// class on every code point with `fancy-regex`. The GPT-2 pipeline keeps its own
/// 2-bit [`ClassTable`]; this one serves the CPU splitter of every pattern and is
/// laid out for a device to hold resident like that one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindTable {
    table: TwoLevel<KIND_BITS>,
    /// The kinds of U+0000..=U+007F with the five named characters in place:
    /// the CPU's fast path, one load per ASCII byte.
    ascii: [Kind; 128],
}

impl KindTable {
    /// Builds the table from `regex-syntax` (a few milliseconds in a release
    /// build). Prefer [`kind_table`], which builds it once per process.
    pub fn build() -> Result<KindTable, PretokenizeError> {
        const UNSET: u8 = u8::MAX;
        let mut kinds = vec![UNSET; CODE_POINTS as usize];
        for (pattern, kind) in [
            (r"\p{Lu}", Kind::Upper),
            (r"\p{Lt}", Kind::Upper),
            (r"\p{Ll}", Kind::Lower),
            (r"\p{Lm}", Kind::OtherLetter),
            (r"\p{Lo}", Kind::OtherLetter),
            (r"\p{M}", Kind::Mark),
            (r"\p{N}", Kind::Number),
            (r"\s", Kind::WhiteSpace),
        ] {
            for (start, end) in class_ranges(pattern)? {
                for code_point in start..=end.min(CODE_POINTS - 1) {
                    let slot = &mut kinds[code_point as usize];
                    if *slot != UNSET {
                        return Err(PretokenizeError::new(format!(
                            "Fix: internal: U+{code_point:04X} is in {pattern} and in another class; the kind table assumes disjoint classes, report this as a bug"
                        )));
                    }
                    *slot = kind as u8;
                }
            }
        }
        for slot in &mut kinds {
            if *slot == UNSET {
                *slot = Kind::Other as u8;
            }
        }
        for (letters, upper, lower) in [
            ("stmd", Kind::UpperStmd, Kind::LowerStmd),
            ("rv", Kind::UpperRv, Kind::LowerRv),
            ("e", Kind::UpperE, Kind::LowerE),
            ("l", Kind::UpperL, Kind::LowerL),
        ] {
            for letter in letters.chars() {
                let pattern = format!("(?i:{letter})");
                for (start, end) in class_ranges(&pattern)? {
                    for code_point in start..=end.min(CODE_POINTS - 1) {
                        let slot = &mut kinds[code_point as usize];
                        *slot = match Kind::from_code(u32::from(*slot)) {
                            Kind::Upper => upper as u8,
                            Kind::Lower => lower as u8,
                            other => {
                                return Err(PretokenizeError::new(format!(
                                    "Fix: internal: U+{code_point:04X} matches {pattern} but is {other:?}, not a cased letter of one contraction; report this as a bug"
                                )))
                            }
                        };
                    }
                }
            }
        }
        let table = TwoLevel::pack(&kinds);
        let mut ascii = [Kind::Other; 128];
        for (code_point, slot) in ascii.iter_mut().enumerate() {
            *slot = match code_point as u8 {
                b'\'' => Kind::Apostrophe,
                b'/' => Kind::Slash,
                b' ' => Kind::Space,
                b'\r' | b'\n' => Kind::LineBreak,
                _ => Kind::from_code(u32::from(kinds[code_point])),
            };
        }
        Ok(KindTable { table, ascii })
    }

    /// The kind of `code_point`, the five named ASCII characters included. A value
    /// past U+10FFFF is [`Kind::Other`].
    #[inline]
    pub fn kind_of(&self, code_point: u32) -> Kind {
        match self.ascii.get(code_point as usize) {
            Some(&kind) => kind,
            None => self.stored_kind(code_point),
        }
    }

    /// The kind stored for `code_point`, by the arithmetic a device runs: the
    /// five named ASCII characters read as `Other` or `WhiteSpace` here. A value
    /// past U+10FFFF is [`Kind::Other`].
    #[inline]
    pub fn stored_kind(&self, code_point: u32) -> Kind {
        if code_point >= CODE_POINTS {
            return Kind::Other;
        }
        Kind::from_code(self.table.code(code_point))
    }

    /// The kind of an ASCII byte (`byte < 0x80`), the named characters included.
    #[inline(always)]
    pub(crate) fn ascii_kind(&self, byte: u8) -> Kind {
        self.ascii[usize::from(byte & 0x7F)]
    }

    /// The table's words (index, then blocks).
    pub fn words(&self) -> &[u32] {
        &self.table.words
    }

    /// The table as a device would store it: little-endian words.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.table.le_bytes()
    }

    /// Distinct blocks of 256 code points stored.
    pub fn distinct_blocks(&self) -> usize {
        self.table.distinct_blocks()
    }
}

/// The kind table, built on first use and shared by the whole process.
pub fn kind_table() -> Result<&'static KindTable, PretokenizeError> {
    static TABLE: OnceLock<Result<KindTable, PretokenizeError>> = OnceLock::new();
    built_once(&TABLE, KindTable::build)
}
