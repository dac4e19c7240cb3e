//! Deterministic sample texts in three shapes, so every run of the example and
//! every test sees the same bytes for the same seed without shipping data files.
//!
//! A tokenizer's cost depends on the shape of its input (many short pieces in
//! code, one piece per 3 bytes in CJK, long letter runs in prose), so the example
//! times all three. The generator is a small SplitMix64 stream: stable across
//! platforms and releases, no dependency.

use std::fmt;
use std::str::FromStr;

/// The shape of a generated text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// ASCII words, punctuation, numbers and whitespace, in sentences and paragraphs.
    Prose,
    /// CJK ideographs (U+4E00..=U+9FFF, 3 bytes each in UTF-8) with ASCII
    /// punctuation, spaces and newlines.
    Cjk,
    /// Source code: identifiers, keywords, numbers, operators, indentation, newlines.
    Code,
}

impl Shape {
    /// Every shape, in the order the example prints them.
    pub const ALL: [Shape; 3] = [Shape::Prose, Shape::Cjk, Shape::Code];

    /// The lower-case name used on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Shape::Prose => "prose",
            Shape::Cjk => "cjk",
            Shape::Code => "code",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Shape {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Shape::ALL
            .into_iter()
            .find(|shape| shape.name() == text)
            .ok_or_else(|| format!("Fix: unknown shape '{text}'; use prose, cjk or code"))
    }
}

/// SplitMix64: a tiny, well-mixed, deterministic 64-bit generator.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (`bound` > 0; 0 gives 0). Multiply-shift, no modulo bias
    /// worth speaking of for the small bounds used here.
    pub fn below(&mut self, bound: u32) -> u32 {
        (((self.next_u64() >> 32) * bound as u64) >> 32) as u32
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u32, denominator: u32) -> bool {
        self.below(denominator) < numerator
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u32) as usize]
    }
}

/// Exactly `bytes` bytes of `shape` text from `seed`. Prose and code are ASCII; CJK
/// is valid UTF-8 (padded with ASCII at the end so no character is cut).
pub fn generate(shape: Shape, bytes: usize, seed: u64) -> Vec<u8> {
    // Mix the shape into the seed so the three shapes never share a stream.
    let mut random = SplitMix64::new(seed ^ (shape as u64 + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let mut out = Vec::with_capacity(bytes + 64);
    while out.len() < bytes {
        match shape {
            Shape::Prose => prose_sentence(&mut random, &mut out),
            Shape::Cjk => cjk_sentence(&mut random, &mut out, bytes),
            Shape::Code => code_line(&mut random, &mut out),
        }
    }
    out.truncate(bytes);
    out
}

const LETTERS: &[u8] = b"etaoinshrdlucmfwypvbgkjqxz";

fn prose_word(random: &mut SplitMix64, out: &mut Vec<u8>, capital: bool) {
    // About 4 letters on average, up to 11; letters skewed towards frequent ones.
    let length = 1 + random.below(5) + random.below(5) * random.below(4) / 2;
    for position in 0..length {
        let letter = LETTERS[(random.below(26) * random.below(27) / 26) as usize];
        out.push(if capital && position == 0 {
            letter.to_ascii_uppercase()
        } else {
            letter
        });
    }
}

fn prose_sentence(random: &mut SplitMix64, out: &mut Vec<u8>) {
    let words = 3 + random.below(14);
    for word in 0..words {
        if word > 0 {
            out.push(b' ');
        }
        if random.chance(1, 25) {
            out.push(*random.pick(b"\"('"));
        }
        if random.chance(1, 30) {
            let number = random.below(100_000);
            out.extend_from_slice(number.to_string().as_bytes());
        } else {
            let capital = word == 0 || random.chance(1, 20);
            prose_word(random, out, capital);
        }
        if word + 1 < words && random.chance(1, 8) {
            out.push(*random.pick(b",,,;:-)'\""));
        }
    }
    out.push(*random.pick(b"...!?"));
    if random.chance(1, 6) {
        out.extend_from_slice(b"\n\n");
    } else {
        out.push(b' ');
    }
}

fn cjk_sentence(random: &mut SplitMix64, out: &mut Vec<u8>, limit: usize) {
    let characters = 4 + random.below(30);
    for _ in 0..characters {
        if out.len() + 3 > limit {
            // Pad with ASCII rather than cut a character in half.
            out.push(b' ');
            return;
        }
        let code_point = 0x4E00 + random.below(0x9FFF - 0x4E00 + 1);
        let character = char::from_u32(code_point).unwrap_or('\u{4E00}');
        let mut buffer = [0u8; 4];
        out.extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
        if random.chance(1, 12) {
            out.push(*random.pick(b",,;:"));
        }
    }
    out.push(*random.pick(b"..!?"));
    out.push(if random.chance(1, 5) { b'\n' } else { b' ' });
}

const KEYWORDS: &[&str] = &[
    "let", "fn", "if", "else", "for", "in", "return", "match", "while", "mut",
];
const OPERATORS: &[&str] = &[
    " = ", " + ", " - ", " * ", " == ", " != ", " += ", " -> ", " && ", " < ", ".", "::",
];
const IDENTIFIER_PARTS: &[&str] = &[
    "count", "index", "buffer", "len", "value", "offset", "node", "state", "text", "piece",
    "block", "word",
];

fn identifier(random: &mut SplitMix64, out: &mut Vec<u8>) {
    let parts = 1 + random.below(3);
    let camel = random.chance(1, 3);
    for part in 0..parts {
        let name = random.pick(IDENTIFIER_PARTS).as_bytes();
        if part > 0 && camel {
            out.push(name[0].to_ascii_uppercase());
            out.extend_from_slice(&name[1..]);
        } else {
            if part > 0 {
                out.push(b'_');
            }
            out.extend_from_slice(name);
        }
    }
    if random.chance(1, 6) {
        out.push(b'0' + random.below(10) as u8);
    }
}

fn expression(random: &mut SplitMix64, out: &mut Vec<u8>, depth: u32) {
    match random.below(if depth > 2 { 2 } else { 4 }) {
        0 => identifier(random, out),
        1 => out.extend_from_slice(random.below(4096).to_string().as_bytes()),
        2 => {
            identifier(random, out);
            out.push(b'(');
            let arguments = random.below(3);
            for argument in 0..arguments {
                if argument > 0 {
                    out.extend_from_slice(b", ");
                }
                expression(random, out, depth + 1);
            }
            out.push(b')');
        }
        _ => {
            expression(random, out, depth + 1);
            out.extend_from_slice(random.pick(OPERATORS).as_bytes());
            expression(random, out, depth + 1);
        }
    }
}

fn code_line(random: &mut SplitMix64, out: &mut Vec<u8>) {
    let depth = random.below(4);
    for _ in 0..depth * 4 {
        out.push(b' ');
    }
    match random.below(8) {
        0 => {
            out.extend_from_slice(b"fn ");
            identifier(random, out);
            out.extend_from_slice(b"(a: u32, b: &[u8]) -> u32 {");
        }
        1 => out.push(b'}'),
        2 => {
            out.extend_from_slice(b"// ");
            for _ in 0..2 + random.below(6) {
                identifier(random, out);
                out.push(b' ');
            }
        }
        3 => {
            out.extend_from_slice(random.pick(KEYWORDS).as_bytes());
            out.push(b' ');
            expression(random, out, 0);
            out.extend_from_slice(b" {");
        }
        _ => {
            out.extend_from_slice(b"let ");
            identifier(random, out);
            out.extend_from_slice(b" = ");
            expression(random, out, 0);
            out.push(b';');
        }
    }
    out.push(b'\n');
}
