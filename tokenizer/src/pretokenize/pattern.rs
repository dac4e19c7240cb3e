//! The pre-tokenizer patterns of tiktoken's encodings, and the CPU split by each.
//!
//! Byte-level BPE never merges across a piece boundary, so an encoding is its
//! vocabulary plus the regular expression that cuts text into pieces first. The
//! encoder asks this module for piece starts by [`Pattern`]; the patterns are kept
//! here verbatim as tiktoken publishes them, and the tests hold every split to
//! `fancy-regex` running exactly that text.

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

/// Appends the byte offset of every piece start of `text` to `starts`
/// (increasing), by `pattern`. Bytes that are not valid UTF-8 follow the module's
/// invalid-byte rule (each is a character U+FFFD). A text over
/// [`super::MAX_TEXT_BYTES`] is an `Err` starting `Fix:`.
pub fn split_into(
    pattern: Pattern,
    text: &[u8],
    starts: &mut Vec<u32>,
) -> Result<(), PretokenizeError> {
    match pattern {
        Pattern::Gpt2 => {
            starts.extend(super::cpu::piece_starts(text)?);
            Ok(())
        }
        other => Err(PretokenizeError::new(format!(
            "Fix: the {} split is not available yet; use Pattern::Gpt2",
            other.name()
        ))),
    }
}

/// The byte offset of every piece start of `text` by `pattern` ([`split_into`]).
pub fn piece_starts(pattern: Pattern, text: &[u8]) -> Result<Vec<u32>, PretokenizeError> {
    let mut starts = Vec::new();
    split_into(pattern, text, &mut starts)?;
    Ok(starts)
}
