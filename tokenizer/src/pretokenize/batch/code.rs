//! The code of one text position, as the batch programs keep it: in shared
//! memory during a program (`u32`), and in the `codes` buffer between cl100k's
//! and o200k's two steps (one byte per text byte, the low eight bits).
//!
//! | bits | meaning |
//! |---|---|
//! | 0..=4 | the character's [`Kind`] code (0..=18), [`Kind::End`] (19) outside the text, [`CONTINUATION`] (31) for a byte inside a character |
//! | 5 | [`DOCUMENT_START`]: the character starts a document (set outside the text too) |
//! | 6 | [`BREAK_AHEAD`] (step 1 of cl100k and o200k, at character starts) |
//! | 7 | [`UPPER_TO_END`] (step 1 of o200k, at character starts) |
//! | 8..=15 | the byte, for an ASCII character (GPT-2's program only: its contractions are case-sensitive ASCII) |

use vyre_cuda::ir::Expr;

use super::ir::has_bit;
use crate::pretokenize::unicode::Kind;

/// The kind bits.
pub const KIND_MASK: u32 = 0x1F;
/// The kind code of a byte that does not start a character.
pub const CONTINUATION: u32 = 0x1F;
/// The character starts a document: nothing before it is seen.
pub const DOCUMENT_START: u32 = 1 << 5;
/// `break_ahead` holds at the character.
pub const BREAK_AHEAD: u32 = 1 << 6;
/// `upper_to_end` holds at the character.
pub const UPPER_TO_END: u32 = 1 << 7;
/// Where an ASCII character's byte sits.
pub const ASCII_SHIFT: u32 = 8;
/// A position outside the text: no character (`Kind::End`), and nothing seen
/// across it.
pub const OUTSIDE: u32 = Kind::End as u32 | DOCUMENT_START;

/// The kind code of a code.
pub(super) fn kind(value: &Expr) -> Expr {
    value.clone() & KIND_MASK
}

/// The code starts a character (or lies outside the text).
pub(super) fn starts_character(value: &Expr) -> Expr {
    kind(value).not_equals(CONTINUATION)
}

/// The code starts a document (or lies outside the text).
pub(super) fn starts_document(value: &Expr) -> Expr {
    has_bit(value, DOCUMENT_START)
}

/// The code lies outside the text.
pub(super) fn outside(value: &Expr) -> Expr {
    kind(value).equals(Kind::End as u32)
}

/// The first of four codes that starts a character: the nearest character in
/// that direction (a character is at most four bytes, so one of four does).
pub(super) fn first_character(codes: [&Expr; 4]) -> Expr {
    let [a, b, c, d] = codes;
    starts_character(a).select(
        a.clone(),
        starts_character(b).select(b.clone(), starts_character(c).select(c.clone(), d.clone())),
    )
}
