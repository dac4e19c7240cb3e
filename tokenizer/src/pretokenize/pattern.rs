//! The pre-tokenizer patterns of tiktoken's encodings, and the CPU split by each.
//!
//! Byte-level BPE never merges across a piece boundary, so an encoding is its
//! vocabulary plus the regular expression that cuts text into pieces first. The
//! encoder asks this module for piece starts by [`Pattern`] ([`split_into`]) or
//! walks the pieces without allocating ([`Splitter::pieces`],
//! [`Splitter::str_pieces`]); the patterns are kept here verbatim as tiktoken
//! publishes them, and the tests hold every split to `fancy-regex` running
//! exactly that text (`tests/split.rs`).
//!
//! # Why a hand-written matcher
//!
//! tiktoken-rs spends most of its time in `fancy-regex` running these patterns,
//! and the encoder must be at least twice as fast as tiktoken-rs. The
//! [`Splitter`] runs each pattern as plain loops over a 4-bit Unicode kind table
//! (no regex engine, no allocation per piece, eight ASCII letters per step):
//! on this project's 2-core build machine (no GPU; shared with other builds, load
//! average about 7, so host_cost marked every comparison "not publishable"),
//! 256 KiB of generated text on one thread, `benches/split.rs` measured
//! 445–596 MB/s on prose, 305–483 MB/s on CJK and 365–477 MB/s on code across the
//! three patterns (fastest regions), where `fancy-regex` did 13–29 MB/s on prose
//! and code and 54–109 MB/s on CJK: median ratios (split time / regex time, same
//! run) 0.03–0.10 on prose and code and 0.12–0.34 on CJK. Every input costs
//! linear time, including 100 KiB of one letter, space, digit, apostrophe, line
//! break or mark.
//!
//! # What each pattern decides
//!
//! In GPT-2's pattern a piece is a contraction, or an optional U+0020 and a run
//! of letters, numbers or other characters, or white space (the last white
//! space before text joins the next piece). cl100k's contractions are
//! case-insensitive (under Unicode simple case folding), any one character that
//! is not `\r`, `\n`, a letter or a number may lead a letter run, numbers come
//! in groups of at most three, punctuation takes the line breaks after it, and a
//! white-space run gives `\s*[\r\n]+` everything up to its last line break.
//! o200k splits letter runs by case (an upper-case stretch, then a lower-case
//! one; Lm, Lo and marks count as both), puts contractions at the end of a letter
//! piece, and lets punctuation take `/` with its line breaks. The rule per
//! character position that a device can evaluate is in
//! [`per_position`](super::per_position).

use super::matcher::Text;
use super::unicode::{kind_table, KindTable};
use super::PretokenizeError;

/// A pre-tokenizer pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pattern {
    /// GPT-2's pattern, used by r50k_base and p50k_base.
    Gpt2,
    /// cl100k_base's pattern (GPT-3.5 and GPT-4; Llama 3 uses the same).
    Cl100k,
    /// o200k_base's pattern (GPT-4o).
    O200k,
}

impl Pattern {
    /// Every pattern, in the order above.
    pub const ALL: [Pattern; 3] = [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k];

    /// The regular expression, exactly as tiktoken publishes it.
    pub const fn regex(self) -> &'static str {
        match self {
            Pattern::Gpt2 => {
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
            }
            Pattern::Cl100k => {
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            }
            Pattern::O200k => concat!(
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
                "|",
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
                "|",
                r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        }
    }

    /// Lower-case name, as in error messages.
    pub const fn name(self) -> &'static str {
        match self {
            Pattern::Gpt2 => "gpt2",
            Pattern::Cl100k => "cl100k",
            Pattern::O200k => "o200k",
        }
    }
}

/// A pattern's CPU split, ready to run: the pattern and the process-wide
/// [`KindTable`]. `Copy`, `Send` and `Sync`; build it once (the first one builds
/// the table) and split any number of texts with it.
///
/// ```
/// use vyre_tokenizer::pretokenize::pattern::{Pattern, Splitter};
/// let splitter = Splitter::new(Pattern::O200k).unwrap();
/// let pieces: Vec<&str> = splitter.str_pieces("DON'T stop-me/now\n").collect();
/// assert_eq!(pieces, ["DON'T", " stop", "-me", "/now", "\n"]);
/// let cl100k = Splitter::new(Pattern::Cl100k).unwrap();
/// let pieces: Vec<&str> = cl100k.str_pieces("DON'T stop-me/now\n").collect();
/// assert_eq!(pieces, ["DON", "'T", " stop", "-me", "/now", "\n"]);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Splitter {
    pattern: Pattern,
    table: &'static KindTable,
}

impl Splitter {
    /// The split by `pattern`. An `Err` only if the Unicode table cannot be built
    /// (an internal error).
    pub fn new(pattern: Pattern) -> Result<Splitter, PretokenizeError> {
        Ok(Splitter {
            pattern,
            table: kind_table()?,
        })
    }

    /// The pattern it splits by.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// The pieces of `text`, in order, without allocating: each is a byte slice of
    /// `text`, and together they are `text`. Bytes that are not valid UTF-8
    /// follow the [invalid-byte rule](super#the-split) (each is a character
    /// U+FFFD). Any length is fine here; [`Pieces::offset`] gives the byte offset
    /// of the next piece.
    pub fn pieces<'t>(&self, text: &'t [u8]) -> Pieces<'t> {
        Pieces {
            text: Text::new(text, self.table),
            pattern: self.pattern,
            at: 0,
        }
    }

    /// The pieces of a string, in order, without allocating. Every piece boundary
    /// of valid UTF-8 is a character boundary, so each piece is a `&str`.
    pub fn str_pieces<'t>(&self, text: &'t str) -> StrPieces<'t> {
        StrPieces {
            pieces: self.pieces(text.as_bytes()),
            text,
        }
    }

    /// Appends the byte offset of every piece start of `text` to `starts`
    /// (increasing). A text over [`super::MAX_TEXT_BYTES`] (offsets are `u32`,
    /// like the GPU's) is an `Err` starting `Fix:`, and nothing is appended.
    pub fn split_into(&self, text: &[u8], starts: &mut Vec<u32>) -> Result<(), PretokenizeError> {
        super::check_text_len(text.len())?;
        let text = Text::new(text, self.table);
        // One loop per pattern, so the matcher inlines into it.
        match self.pattern {
            Pattern::Gpt2 => push_starts(text, starts, Text::gpt2_end),
            Pattern::Cl100k => push_starts(text, starts, Text::cl100k_end),
            Pattern::O200k => push_starts(text, starts, Text::o200k_end),
        }
        Ok(())
    }
}

#[inline(always)]
fn push_starts<'t>(
    text: Text<'t>,
    starts: &mut Vec<u32>,
    end_of: impl Fn(&Text<'t>, usize) -> usize,
) {
    starts.reserve(text.len() / 5 + 1);
    let mut at = 0;
    while at < text.len() {
        // The text fits u32 offsets (checked by the caller).
        starts.push(at as u32);
        at = end_of(&text, at);
    }
}

/// The pieces of a byte text ([`Splitter::pieces`]).
#[derive(Clone)]
pub struct Pieces<'t> {
    text: Text<'t>,
    pattern: Pattern,
    at: usize,
}

impl<'t> Pieces<'t> {
    /// Byte offset where the next piece starts (the text's length after the last).
    pub fn offset(&self) -> usize {
        self.at
    }
}

impl<'t> Iterator for Pieces<'t> {
    type Item = &'t [u8];

    #[inline]
    fn next(&mut self) -> Option<&'t [u8]> {
        let start = self.at;
        if start >= self.text.len() {
            return None;
        }
        let end = match self.pattern {
            Pattern::Gpt2 => self.text.gpt2_end(start),
            Pattern::Cl100k => self.text.cl100k_end(start),
            Pattern::O200k => self.text.o200k_end(start),
        };
        self.at = end;
        self.text.bytes().get(start..end)
    }
}

impl std::iter::FusedIterator for Pieces<'_> {}

/// The pieces of a string ([`Splitter::str_pieces`]).
#[derive(Clone)]
pub struct StrPieces<'t> {
    pieces: Pieces<'t>,
    text: &'t str,
}

impl<'t> Iterator for StrPieces<'t> {
    type Item = &'t str;

    #[inline]
    fn next(&mut self) -> Option<&'t str> {
        let start = self.pieces.offset();
        let piece = self.pieces.next()?;
        // Valid UTF-8 decodes whole characters only, so both ends are character
        // boundaries.
        Some(&self.text[start..start + piece.len()])
    }
}

impl std::iter::FusedIterator for StrPieces<'_> {}

/// Appends the byte offset of every piece start of `text` to `starts`
/// (increasing), by `pattern` ([`Splitter::split_into`]). Bytes that are not
/// valid UTF-8 follow the module's invalid-byte rule (each is a character
/// U+FFFD). A text over [`super::MAX_TEXT_BYTES`] is an `Err` starting `Fix:`.
pub fn split_into(
    pattern: Pattern,
    text: &[u8],
    starts: &mut Vec<u32>,
) -> Result<(), PretokenizeError> {
    Splitter::new(pattern)?.split_into(text, starts)
}

/// The byte offset of every piece start of `text` by `pattern` ([`split_into`]).
pub fn piece_starts(pattern: Pattern, text: &[u8]) -> Result<Vec<u32>, PretokenizeError> {
    let mut starts = Vec::new();
    split_into(pattern, text, &mut starts)?;
    Ok(starts)
}
