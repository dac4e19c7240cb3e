//! UTF-8 decoding written in vyre-cuda's IR, shared by every split program
//! (GPT-2's single-document programs and the batch programs): Unicode's table
//! of well-formed byte sequences, and the decode of the character that covers
//! a byte from the seven bytes around it. One copy, so the device's rule for
//! invalid bytes cannot differ between programs.

use vyre_cuda::ir::{BlockBuilder, Expr, ScalarType};

/// `low <= value <= high`, with one wrapping subtraction.
pub(super) fn in_range(value: &Expr, low: u32, high: u32) -> Expr {
    (value.clone() - low).less_equal(high - low)
}

/// `value` is a UTF-8 continuation byte `0x80..=0xBF`.
pub(super) fn continuation(value: &Expr) -> Expr {
    (value.clone() & 0xC0u32).equals(0x80u32)
}

/// Length of the valid UTF-8 sequence that starts with `bytes[0]` (1 for ASCII),
/// or 0 where none does: Unicode's table of well-formed byte sequences (no
/// overlong forms, no surrogates, nothing past U+10FFFF). A byte past the text
/// reads as 0, so a sequence cut by the end of the text is not valid.
pub(super) fn valid_length(bytes: [&Expr; 4]) -> Expr {
    let [b0, b1, b2, b3] = bytes;
    let two = in_range(b0, 0xC2, 0xDF).and(continuation(b1));
    let second_of_three = b0
        .clone()
        .equals(0xE0u32)
        .and(in_range(b1, 0xA0, 0xBF))
        .or(b0.clone().equals(0xEDu32).and(in_range(b1, 0x80, 0x9F)))
        .or(b0
            .clone()
            .not_equals(0xE0u32)
            .and(b0.clone().not_equals(0xEDu32))
            .and(continuation(b1)));
    let three = in_range(b0, 0xE0, 0xEF)
        .and(second_of_three)
        .and(continuation(b2));
    let second_of_four = b0
        .clone()
        .equals(0xF0u32)
        .and(in_range(b1, 0x90, 0xBF))
        .or(b0.clone().equals(0xF4u32).and(in_range(b1, 0x80, 0x8F)))
        .or(b0
            .clone()
            .not_equals(0xF0u32)
            .and(b0.clone().not_equals(0xF4u32))
            .and(continuation(b1)));
    let four = in_range(b0, 0xF0, 0xF4)
        .and(second_of_four)
        .and(continuation(b2))
        .and(continuation(b3));
    b0.clone().less_than(0x80u32).select(
        1u32,
        two.select(2u32, three.select(3u32, four.select(4u32, 0u32))),
    )
}

/// Emits the decode of a non-ASCII byte from `bytes`, the seven bytes at
/// distances -3..=3 from it (index 3 is the byte itself; a byte the decode may
/// not see, past the text or across a document boundary, is 0): assigns the
/// `u32` variable `covered` 1 where a valid sequence starting one to three bytes
/// before covers the byte (it is inside that character), and `code_point` the
/// code point of the valid sequence starting at the byte, or U+FFFD where none
/// does. `name` makes the names of the lets it emits unique.
pub(super) fn decode_non_ascii(
    b: &mut BlockBuilder,
    name: &dyn Fn(&str) -> String,
    bytes: [&Expr; 7],
    covered: &str,
    code_point: &str,
) {
    // Valid sequence lengths at the byte - 3, - 2 and - 1.
    let before: Vec<Expr> = (0..3)
        .map(|start| {
            b.let_(
                name(&format!("valid_length{start}")),
                valid_length([
                    bytes[start],
                    bytes[start + 1],
                    bytes[start + 2],
                    bytes[start + 3],
                ]),
            )
        })
        .collect();
    b.assign(
        covered,
        covered_by([&before[2], &before[1], &before[0]]).cast(ScalarType::U32),
    );
    let own = b.let_(
        name("valid_length3"),
        valid_length([bytes[3], bytes[4], bytes[5], bytes[6]]),
    );
    b.assign(
        code_point,
        code_point_of(&own, [bytes[3], bytes[4], bytes[5], bytes[6]]),
    );
}

/// Emits the decode of the sequence that starts with the non-ASCII byte
/// `bytes[0]` (the next three bytes after it; one the decode may not see, past
/// the text or across a document boundary, is 0): assigns the `u32` variable
/// `length` the sequence's length (0 where none is valid) and `code_point` its
/// code point (U+FFFD where none is valid). Whether a sequence before covers
/// the byte is [`covered_by`] those sequences' lengths.
pub(super) fn decode_own(
    b: &mut BlockBuilder,
    name: &dyn Fn(&str) -> String,
    bytes: [&Expr; 4],
    length: &str,
    code_point: &str,
) {
    let own = b.let_(name("valid_length"), valid_length(bytes));
    b.assign(length, own.clone());
    b.assign(code_point, code_point_of(&own, bytes));
}

/// A byte lies inside a character (not its first byte) when a valid sequence
/// that starts one, two or three bytes before it reaches it: `lengths[d - 1]`
/// is the valid length ([`valid_length`]) at `d` bytes before.
pub(super) fn covered_by(lengths: [&Expr; 3]) -> Expr {
    let [one_back, two_back, three_back] = lengths;
    one_back
        .clone()
        .greater_equal(2u32)
        .or(two_back.clone().greater_equal(3u32))
        .or(three_back.clone().equals(4u32))
}

/// The code point of the sequence `bytes` whose valid length is `length`, or
/// U+FFFD where none is valid (`length` 0; ASCII is not decoded here).
fn code_point_of(length: &Expr, bytes: [&Expr; 4]) -> Expr {
    let [b0, b1, b2, b3] = bytes;
    let low6 = |byte: &Expr| byte.clone() & 0x3Fu32;
    length.clone().equals(2u32).select(
        ((b0.clone() & 0x1Fu32) << 6u32) | low6(b1),
        length.clone().equals(3u32).select(
            ((b0.clone() & 0x0Fu32) << 12u32) | (low6(b1) << 6u32) | low6(b2),
            length.clone().equals(4u32).select(
                ((b0.clone() & 0x07u32) << 18u32)
                    | (low6(b1) << 12u32)
                    | (low6(b2) << 6u32)
                    | low6(b3),
                0xFFFDu32,
            ),
        ),
    )
}
