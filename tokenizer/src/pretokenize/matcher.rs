//! The sequential matchers behind [`Splitter`](super::pattern::Splitter): one
//! function per pattern that, given the byte offset where a piece starts, returns
//! where it ends, trying the pattern's alternatives in order as a backtracking
//! regex engine would.
//!
//! # Why plain code and not a regex engine
//!
//! The split runs before every BPE encode on the CPU, and the encoder must beat
//! tiktoken-rs, whose time is mostly `fancy-regex` running these patterns. Each
//! alternative here is a loop over one class, so a piece costs a few table loads
//! per character and nothing else: no heap allocation, no decoded copy of the
//! text, no backtracking state. ASCII takes one load per byte from a 128-entry
//! array; other characters are decoded in place and looked up in the two-level
//! [`KindTable`]. The work is linear in the text on every input: a scan that looks
//! past a piece's end (o200k's letter runs, `\s*[\r\n]+`) is repeated at most
//! twice more by the pieces after it. `benches/split.rs` quotes the speed against
//! `fancy-regex` in the same run.
//!
//! # Invalid UTF-8
//!
//! A byte that does not begin a well-formed character (Unicode's table: no
//! overlong forms, no surrogates, nothing past U+10FFFF, nothing cut short) is one
//! character U+FFFD, like everywhere in this crate. Decoding only ever starts
//! where the previous character ended, so the characters are exactly those of a
//! left-to-right decode with that rule.

use super::unicode::{Kind, KindSet, KindTable};

/// The high bit of each byte of a `u64`.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Which ASCII letters a run takes, eight bytes at a time.
#[derive(Clone, Copy)]
enum AsciiLetters {
    /// `A-Za-z` (`\p{L}` on ASCII).
    AnyCase,
    /// `a-z` (o200k's `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` on ASCII).
    LowerCase,
}

impl AsciiLetters {
    /// The high bit of byte `k` set where `chunk[k]` is such a letter (and so
    /// ASCII): `0x61 <= x < 0x7B` for `x` the byte with its high bit cleared (and
    /// bit 5 set for any case), tested by two additions that cannot carry out of
    /// a byte.
    #[inline(always)]
    fn members(self, chunk: &[u8]) -> u64 {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let word = u64::from_le_bytes(bytes);
        let mut low = word & !HIGH_BITS;
        if let AsciiLetters::AnyCase = self {
            low |= 0x2020_2020_2020_2020;
        }
        let at_least_a = low + 0x1F1F_1F1F_1F1F_1F1F;
        let past_z = low + 0x0505_0505_0505_0505;
        at_least_a & !past_z & !word & HIGH_BITS
    }
}

/// A text and the table its characters are classified by.
#[derive(Clone, Copy)]
pub(super) struct Text<'t> {
    bytes: &'t [u8],
    table: &'t KindTable,
}

impl<'t> Text<'t> {
    pub(super) fn new(bytes: &'t [u8], table: &'t KindTable) -> Text<'t> {
        Text { bytes, table }
    }

    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn bytes(&self) -> &'t [u8] {
        self.bytes
    }

    /// The kind and byte length of the character at `at` (a character boundary);
    /// `(Kind::End, 0)` at or past the end.
    #[inline(always)]
    fn char_at(&self, at: usize) -> (Kind, usize) {
        match self.bytes.get(at) {
            Some(&byte) if byte < 0x80 => (self.table.ascii_kind(byte), 1),
            Some(_) => self.decode(at),
            None => (Kind::End, 0),
        }
    }

    /// [`Text::char_at`] for a non-ASCII lead byte: a well-formed sequence is
    /// one character, anything else one byte of kind U+FFFD.
    ///
    /// Well-formed means Unicode's table: a lead `C2..=F4` and its continuation
    /// bytes `80..=BF`, decoding to a code point that needs that many bytes (no
    /// overlong form), is no surrogate and is at most U+10FFFF. Those bounds on
    /// the code point are exactly the table's special second-byte ranges (`E0`:
    /// `A0..`, `ED`: `..9F`, `F0`: `90..`, `F4`: `..8F`).
    #[inline]
    fn decode(&self, at: usize) -> (Kind, usize) {
        let bytes = &self.bytes[at..];
        let lead = u32::from(bytes[0]);
        // The six payload bits of byte `index` if it is a continuation byte.
        let payload = |index: usize| {
            bytes
                .get(index)
                .map(|&byte| u32::from(byte ^ 0x80))
                .filter(|&bits| bits < 0x40)
        };
        let decoded =
            match lead {
                0xC2..=0xDF => payload(1).map(|second| ((lead & 0x1F) << 6 | second, 2)),
                0xE0..=0xEF => payload(1).zip(payload(2)).and_then(|(second, third)| {
                    let code_point = (lead & 0x0F) << 12 | second << 6 | third;
                    (code_point >= 0x800 && !(0xD800..=0xDFFF).contains(&code_point))
                        .then_some((code_point, 3))
                }),
                0xF0..=0xF4 => payload(1).zip(payload(2)).zip(payload(3)).and_then(
                    |((second, third), fourth)| {
                        let code_point = (lead & 0x07) << 18 | second << 12 | third << 6 | fourth;
                        (0x1_0000..=0x10_FFFF)
                            .contains(&code_point)
                            .then_some((code_point, 4))
                    },
                ),
                _ => None,
            };
        match decoded {
            Some((code_point, len)) => (self.table.stored_kind(code_point), len),
            None => (self.table.stored_kind(0xFFFD), 1),
        }
    }

    /// One past the longest run of `set` characters starting at `at`.
    #[inline(always)]
    fn run_end(&self, mut at: usize, set: KindSet) -> usize {
        // Letter runs (the commonest) take eight ASCII bytes per step.
        let ascii_letters = if set == KindSet::LETTER {
            Some(AsciiLetters::AnyCase)
        } else if set == KindSet::O200K_LOWER {
            Some(AsciiLetters::LowerCase)
        } else {
            None
        };
        loop {
            if let Some(letters) = ascii_letters {
                while let Some(chunk) = self.bytes.get(at..at + 8) {
                    let members = letters.members(chunk);
                    if members != HIGH_BITS {
                        at += ((!members & HIGH_BITS).trailing_zeros() / 8) as usize;
                        break;
                    }
                    at += 8;
                }
            }
            while let Some(&byte) = self.bytes.get(at) {
                if byte >= 0x80 {
                    break;
                }
                if !set.contains(self.table.ascii_kind(byte)) {
                    return at;
                }
                at += 1;
            }
            // Non-ASCII characters, or the end (`Kind::End` is in no set).
            loop {
                let (kind, len) = self.char_at(at);
                if !set.contains(kind) {
                    return at;
                }
                at += len;
                if self.bytes.get(at).is_none_or(|&byte| byte < 0x80) {
                    break;
                }
            }
        }
    }

    /// `\p{N}{1,3}` after its first number, which ends at `at`.
    #[inline]
    fn digits_end(&self, mut at: usize) -> usize {
        for _ in 0..2 {
            let (kind, len) = self.char_at(at);
            if kind != Kind::Number {
                break;
            }
            at += len;
        }
        at
    }

    /// Bytes of `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `at`, or 0.
    #[inline]
    fn contraction_len(&self, at: usize) -> usize {
        if self.bytes.get(at) != Some(&b'\'') {
            return 0;
        }
        let (first, first_len) = self.char_at(at + 1);
        if KindSet::CONTRACTION_STMD.contains(first) {
            return 1 + first_len;
        }
        let second_set = if KindSet::CONTRACTION_RV.contains(first) {
            KindSet::CONTRACTION_E
        } else if KindSet::CONTRACTION_L.contains(first) {
            KindSet::CONTRACTION_L
        } else {
            return 0;
        };
        let (second, second_len) = self.char_at(at + 1 + first_len);
        if second_set.contains(second) {
            1 + first_len + second_len
        } else {
            0
        }
    }

    /// Bytes of GPT-2's case-sensitive `'s|'t|'re|'ve|'m|'ll|'d` at `at` (an
    /// apostrophe), or 0.
    #[inline]
    fn gpt2_contraction_len(&self, at: usize) -> usize {
        match self.bytes.get(at + 1..) {
            Some([b's' | b't' | b'm' | b'd', ..]) => 2,
            Some([b'r' | b'v', b'e', ..] | [b'l', b'l', ..]) => 3,
            _ => 0,
        }
    }

    /// The white-space alternatives at `at` (a white-space character):
    /// `\s*[\r\n]+` when `line_breaks` (up to the run's last line break, if it
    /// has one), then `\s+(?!\S)` (the run, less its last character unless the
    /// run ends the text), then `\s+` (one character).
    #[inline]
    fn white_space_end(&self, at: usize, line_breaks: bool) -> usize {
        let mut end = at;
        let mut last_start = at;
        let mut after_break = None;
        loop {
            let (kind, len) = self.char_at(end);
            if !KindSet::WHITE_SPACE.contains(kind) {
                break;
            }
            if kind == Kind::LineBreak {
                after_break = Some(end + len);
            }
            last_start = end;
            end += len;
        }
        match after_break {
            Some(after) if line_breaks => after,
            _ if end == self.bytes.len() || last_start == at => end,
            _ => last_start,
        }
    }

    /// A run of `[^\s\p{L}\p{N}]` from `at`, then a run of `tail`.
    #[inline]
    fn other_end(&self, at: usize, tail: KindSet) -> usize {
        self.run_end(self.run_end(at, KindSet::OTHER), tail)
    }

    /// End of the GPT-2 piece starting at `at`:
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    #[inline]
    pub(super) fn gpt2_end(&self, at: usize) -> usize {
        let (kind, len) = self.char_at(at);
        if kind == Kind::Apostrophe {
            let contraction = self.gpt2_contraction_len(at);
            if contraction > 0 {
                return at + contraction;
            }
        }
        let (body, body_end) = match kind {
            Kind::Space => match self.char_at(at + len) {
                (next, next_len) if next != Kind::End && !KindSet::WHITE_SPACE.contains(next) => {
                    (next, at + len + next_len)
                }
                _ => (kind, at + len),
            },
            _ => (kind, at + len),
        };
        let class = if KindSet::LETTER.contains(body) {
            KindSet::LETTER
        } else if KindSet::NUMBER.contains(body) {
            KindSet::NUMBER
        } else if KindSet::OTHER.contains(body) {
            KindSet::OTHER
        } else {
            return self.white_space_end(at, false);
        };
        self.run_end(body_end, class)
    }

    /// End of the cl100k piece starting at `at`:
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    #[inline]
    pub(super) fn cl100k_end(&self, at: usize) -> usize {
        let (kind, len) = self.char_at(at);
        let next = at + len;
        if KindSet::LETTER.contains(kind) {
            return self.run_end(next, KindSet::LETTER);
        }
        match kind {
            Kind::Number => return self.digits_end(next),
            Kind::LineBreak => return self.white_space_end(at, true),
            Kind::Apostrophe => {
                let contraction = self.contraction_len(at);
                if contraction > 0 {
                    return at + contraction;
                }
            }
            _ => {}
        }
        // `kind` is in `[^\r\n\p{L}\p{N}]`: an optional first character.
        let (next_kind, next_len) = self.char_at(next);
        if KindSet::LETTER.contains(next_kind) {
            return self.run_end(next + next_len, KindSet::LETTER);
        }
        if KindSet::OTHER.contains(kind) {
            return self.other_end(next, KindSet::LINE_BREAK);
        }
        if kind == Kind::Space && KindSet::OTHER.contains(next_kind) {
            return self.other_end(next + next_len, KindSet::LINE_BREAK);
        }
        self.white_space_end(at, true)
    }

    /// End of the o200k piece starting at `at` (the pattern in
    /// [`Pattern::O200k`](super::pattern::Pattern::O200k)).
    #[inline]
    pub(super) fn o200k_end(&self, at: usize) -> usize {
        let (kind, len) = self.char_at(at);
        let next = at + len;
        if KindSet::WORD.contains(kind) {
            // A mark is also `[^\r\n\p{L}\p{N}]`, so the first alternative first
            // tries it as its optional first character. Without that character
            // the first alternative matches at any mark, lower-case or caseless
            // letter; it can fail only at Lu or Lt, where the second one matches.
            if kind == Kind::Mark {
                if let Some(end) = self.o200k_lower_end(next) {
                    return end;
                }
            }
            return self
                .o200k_lower_end(at)
                .unwrap_or_else(|| self.o200k_upper_end(at));
        }
        if kind == Kind::Number {
            return self.digits_end(next);
        }
        if KindSet::PREFIX.contains(kind) {
            // An optional first character before a letter or mark: the first
            // alternative fails only where the second matches (the letter is
            // Lu or Lt).
            let (next_kind, next_len) = self.char_at(next);
            if KindSet::WORD.contains(next_kind) {
                return self
                    .o200k_lower_end(next)
                    .unwrap_or_else(|| self.o200k_upper_end(next));
            }
            if KindSet::OTHER.contains(kind) {
                return self.other_end(next, KindSet::LINE_BREAK_OR_SLASH);
            }
            if kind == Kind::Space && KindSet::OTHER.contains(next_kind) {
                return self.other_end(next + next_len, KindSet::LINE_BREAK_OR_SLASH);
            }
        }
        self.white_space_end(at, true)
    }

    /// o200k's first letter alternative without its optional first character,
    /// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?`,
    /// from `from`; `None` where it does not match.
    ///
    /// The first class runs as far as it can. If a `Ll` letter follows, the second
    /// class runs from there. Otherwise the engine backtracks into the first run:
    /// the second class needs a character of both classes (Lm, Lo, M), so the
    /// match ends after the last one in the run, and fails if there is none.
    #[inline]
    fn o200k_lower_end(&self, from: usize) -> Option<usize> {
        let mut at = from;
        let mut after_caseless = None;
        loop {
            let (kind, len) = self.char_at(at);
            if !KindSet::O200K_UPPER.contains(kind) {
                if KindSet::LOWER_CASE.contains(kind) {
                    let end = self.run_end(at + len, KindSet::O200K_LOWER);
                    return Some(end + self.contraction_len(end));
                }
                break;
            }
            if KindSet::CASELESS.contains(kind) {
                after_caseless = Some(at + len);
            }
            at += len;
        }
        after_caseless.map(|end| end + self.contraction_len(end))
    }

    /// o200k's second letter alternative without its optional first character,
    /// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...)?`,
    /// from `from`, whose character is in the first class.
    #[inline]
    fn o200k_upper_end(&self, from: usize) -> usize {
        let upper_end = self.run_end(from, KindSet::O200K_UPPER);
        let end = self.run_end(upper_end, KindSet::O200K_LOWER);
        end + self.contraction_len(end)
    }
}
