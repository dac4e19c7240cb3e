//! The GPT-2 split in plain Rust, one thread, no IR: the second formulation of
//! the GPU programs, kept simple rather than fast (it decodes the whole text into
//! a vector first; the fast CPU split of every pattern is
//! [`Splitter`](super::pattern::Splitter), checked against this one too).
//!
//! The GPU programs decide "does a piece start at byte `i`" from a window of
//! bytes around `i`; this splitter instead walks the text the way a regex engine
//! does, trying the pattern's alternatives in order at each match start:
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! Two formulations that agree with each other and with the external oracle
//! (`fancy-regex`, in the tests) on every test input are much stronger evidence
//! than one formulation run twice. Characters come from the standard library's
//! UTF-8 decoder ([`<[u8]>::utf8_chunks`]); every byte that is not part of a valid
//! character is a one-byte character decoded as U+FFFD (the crate's invalid-UTF-8
//! rule, [module docs](super)).

use super::unicode::{class_table, CharClass, ClassTable};
use super::PretokenizeError;

/// One decoded character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Character {
    /// Byte offset of its first byte.
    pub start: u32,
    /// Its code point (U+FFFD for a byte that is not part of a valid character).
    pub code_point: u32,
    /// Its class for the pattern.
    pub class: CharClass,
}

/// The characters of `text` under the invalid-UTF-8 rule, as (byte offset,
/// code point): valid sequences decode as usual (by the standard library's
/// decoder, [`<[u8]>::utf8_chunks`]), every other byte is one character U+FFFD.
pub fn code_points(text: &[u8]) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(text.len());
    let mut offset = 0u32;
    for chunk in text.utf8_chunks() {
        for character in chunk.valid().chars() {
            out.push((offset, character as u32));
            offset += character.len_utf8() as u32;
        }
        for _ in chunk.invalid() {
            out.push((offset, 0xFFFD));
            offset += 1;
        }
    }
    out
}

/// The characters of `text` under the invalid-UTF-8 rule ([`code_points`]),
/// classified by `table`.
pub fn characters(table: &ClassTable, text: &[u8]) -> Vec<Character> {
    code_points(text)
        .into_iter()
        .map(|(start, code_point)| Character {
            start,
            code_point,
            class: table.class_of(code_point),
        })
        .collect()
}

/// Length in characters of a contraction (`'s 't 're 've 'm 'll 'd`, case
/// sensitive) starting at `characters[at]`, or 0.
fn contraction_len(characters: &[Character], at: usize) -> usize {
    let code = |offset: usize| characters.get(at + offset).map(|c| c.code_point);
    if code(0) != Some('\'' as u32) {
        return 0;
    }
    let second = code(1).and_then(char::from_u32);
    let third = code(2).and_then(char::from_u32);
    match (second, third) {
        (Some('s' | 't' | 'm' | 'd'), _) => 2,
        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => 3,
        _ => 0,
    }
}

/// Index (in characters) one past the match that starts at `characters[at]`.
fn match_end(characters: &[Character], at: usize) -> usize {
    let contraction = contraction_len(characters, at);
    if contraction > 0 {
        return at + contraction;
    }
    let class_at = |index: usize| characters.get(index).map(|c| c.class);
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional U+0020, then a
    // maximal run of one class.
    let body = if characters[at].code_point == ' ' as u32
        && class_at(at + 1).is_some_and(|class| class != CharClass::Whitespace)
    {
        at + 1
    } else {
        at
    };
    let run_end = |from: usize, class: CharClass| {
        let mut end = from;
        while class_at(end) == Some(class) {
            end += 1;
        }
        end
    };
    let body_class = characters[body].class;
    if body_class != CharClass::Whitespace {
        return run_end(body, body_class);
    }
    // `\s+(?!\S)`: the longest white-space run not followed by a non-space, that is
    // the whole run at the end of the text, else the run less its last character.
    // If that leaves nothing, `\s+` takes the one character.
    let end = run_end(at, CharClass::Whitespace);
    if end == characters.len() || end - at == 1 {
        end
    } else {
        end - 1
    }
}

/// The byte offset of every piece start of `text`, increasing. Offsets are `u32`
/// like the GPU's; a text over [`super::MAX_TEXT_BYTES`] is an `Err` starting `Fix:`.
pub fn piece_starts(text: &[u8]) -> Result<Vec<u32>, PretokenizeError> {
    super::check_text_len(text.len())?;
    let characters = characters(class_table()?, text);
    let mut starts = Vec::new();
    let mut at = 0;
    while at < characters.len() {
        starts.push(characters[at].start);
        at = match_end(&characters, at);
    }
    Ok(starts)
}

/// The pieces themselves, as byte slices of `text` (for printing and tests). A
/// start past the text or not above the previous one gives an empty piece.
pub fn pieces<'t>(text: &'t [u8], starts: &[u32]) -> Vec<&'t [u8]> {
    starts
        .iter()
        .enumerate()
        .map(|(index, &start)| {
            let start = start as usize;
            let end = starts
                .get(index + 1)
                .map_or(text.len(), |&next| next as usize);
            text.get(start..end.max(start)).unwrap_or(&[])
        })
        .collect()
}
