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
    // Valid sequence lengths at the byte - 3, - 2, - 1 and at the byte.
    let lengths: Vec<Expr> = (0..4)
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
        lengths[2]
            .clone()
            .greater_equal(2u32)
            .or(lengths[1].clone().greater_equal(3u32))
            .or(lengths[0].clone().equals(4u32))
            .cast(ScalarType::U32),
    );
    let [b0, b1, b2, b3] = [bytes[3], bytes[4], bytes[5], bytes[6]];
    let low6 = |byte: &Expr| byte.clone() & 0x3Fu32;
    let own = &lengths[3];
    // A byte that starts no valid sequence decodes as U+FFFD.
    b.assign(
        code_point,
        own.clone().equals(2u32).select(
            ((b0.clone() & 0x1Fu32) << 6u32) | low6(b1),
            own.clone().equals(3u32).select(
                ((b0.clone() & 0x0Fu32) << 12u32) | (low6(b1) << 6u32) | low6(b2),
                own.clone().equals(4u32).select(
                    ((b0.clone() & 0x07u32) << 18u32)
                        | (low6(b1) << 12u32)
                        | (low6(b2) << 6u32)
                        | low6(b3),
                    0xFFFDu32,
                ),
            ),
        ),
    );
}
