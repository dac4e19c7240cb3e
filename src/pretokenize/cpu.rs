//! The splitting rules in plain Rust, one thread, no IR: the second oracle.
//!
//! The GPU programs apply the rules per byte by looking back at most three bytes;
//! this splitter walks the text character by character instead, the way the rules
//! in the [module docs](super) are worded. Two formulations that agree on every
//! test input (valid, truncated and invalid UTF-8) are much stronger evidence than
//! one formulation run twice.

/// What a character is for splitting (rule 2 of the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Letter,
    Digit,
    Whitespace,
    /// Punctuation, control, non-ASCII, stray continuation, invalid: a piece alone.
    Single,
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

/// Bytes a lead byte announces (1 for anything that is not a lead byte).
fn sequence_length(byte: u8) -> usize {
    match byte {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

/// Length in bytes and kind of the character starting at `text[start]`.
fn character_at(text: &[u8], start: usize) -> (usize, Kind) {
    let byte = text[start];
    let kind = match byte {
        b'A'..=b'Z' | b'a'..=b'z' => Kind::Letter,
        b'0'..=b'9' => Kind::Digit,
        b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r' => Kind::Whitespace,
        _ => Kind::Single,
    };
    let wanted = sequence_length(byte);
    let mut length = 1;
    while length < wanted && start + length < text.len() && is_continuation(text[start + length]) {
        length += 1;
    }
    (length, kind)
}

/// The byte offset of every piece start of `text`, increasing (see the module docs
/// for the rules). Offsets are `u32` like the GPU's; texts longer than
/// `u32::MAX` bytes are outside the pipeline's limits.
pub fn piece_starts(text: &[u8]) -> Vec<u32> {
    let mut starts = Vec::new();
    let mut previous: Option<Kind> = None;
    let mut position = 0;
    while position < text.len() {
        let (length, kind) = character_at(text, position);
        let continues_run = kind != Kind::Single && previous == Some(kind);
        if !continues_run {
            starts.push(position as u32);
        }
        previous = Some(kind);
        position += length;
    }
    starts
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
