//! The external oracle for the GPT-2 split: `fancy-regex` (the engine tiktoken's
//! Rust core uses) running the pattern itself, plus the shared test corpus and a
//! seeded generator of random Unicode strings weighted toward the pattern's hard
//! cases. Shared by `tests/pretokenize.rs`, `tests/gpu_pretokenize.rs` and the
//! example (through `#[path]`).

#![allow(dead_code)]

use vyre_tokenizer::pretokenize::text::SplitMix64;

/// GPT-2's pre-tokenizer pattern, exactly as tiktoken's r50k/p50k encodings use it.
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The compiled pattern.
pub struct Oracle {
    regex: fancy_regex::Regex,
}

impl Oracle {
    /// Compiles [`GPT2_PATTERN`].
    pub fn new() -> Oracle {
        Oracle {
            regex: fancy_regex::Regex::new(GPT2_PATTERN).expect("the GPT-2 pattern compiles"),
        }
    }

    /// Compiles `pattern`'s regular expression, exactly as tiktoken publishes it.
    pub fn for_pattern(pattern: vyre_tokenizer::pretokenize::pattern::Pattern) -> Oracle {
        Oracle {
            regex: fancy_regex::Regex::new(pattern.regex()).expect("the pattern compiles"),
        }
    }

    /// Byte offsets of the match starts in a valid string. Panics if the matches do
    /// not tile the text (they always do for this pattern: a broken oracle must
    /// not pass silently).
    pub fn starts_of_str(&self, text: &str) -> Vec<u32> {
        let mut starts = Vec::new();
        let mut end = 0;
        for found in self.regex.find_iter(text) {
            let found = found.expect("fancy-regex ran out of backtracking budget");
            assert_eq!(found.start(), end, "oracle matches do not tile {text:?}");
            starts.push(found.start() as u32);
            end = found.end();
        }
        assert_eq!(
            end,
            text.len(),
            "oracle matches do not reach the end of {text:?}"
        );
        starts
    }

    /// The documented rule for any bytes: the oracle's split of the text with each
    /// byte that is not part of a valid UTF-8 character replaced by U+FFFD,
    /// mapped back to the original byte offsets.
    pub fn starts(&self, text: &[u8]) -> Vec<u32> {
        if let Ok(valid) = std::str::from_utf8(text) {
            return self.starts_of_str(valid);
        }
        let mut replaced = String::with_capacity(text.len() + 16);
        // original offset of every byte of `replaced` that starts a character
        let mut original = vec![u32::MAX; 0];
        let mut offset = 0u32;
        for chunk in text.utf8_chunks() {
            for character in chunk.valid().chars() {
                original.resize(replaced.len() + 1, u32::MAX);
                original[replaced.len()] = offset;
                replaced.push(character);
                offset += character.len_utf8() as u32;
            }
            for _ in chunk.invalid() {
                original.resize(replaced.len() + 1, u32::MAX);
                original[replaced.len()] = offset;
                replaced.push('\u{FFFD}');
                offset += 1;
            }
        }
        self.starts_of_str(&replaced)
            .into_iter()
            .map(|start| original[start as usize])
            .collect()
    }
}

/// Hand-written texts: every contraction at the start, middle and end of words and
/// after punctuation and spaces; runs of mixed white space; non-ASCII letters and
/// digits; emoji, symbols, combining marks; CRLF, tabs, NBSP and the other Unicode
/// spaces; text cut mid-character and other invalid UTF-8.
pub fn corpus() -> Vec<Vec<u8>> {
    let mut texts: Vec<Vec<u8>> = Vec::new();
    let strings: &[&str] = &[
        "",
        "a",
        " ",
        "  ",
        ".",
        "'",
        "''",
        "Hello, world!",
        "Hello, world!  It's 42 €\n",
        // contractions everywhere
        "'s 't 're 've 'm 'll 'd",
        "it's don't we're they've I'm we'll he'd",
        "'sa 'tb 'rec 'vex 'mm 'lll 'dd",
        "x's y't z're w've v'm u'll t'd",
        "it'llx we'rey they'vez I'mq he'dq it'sq don'tq",
        "dogs' 'tis' rock'n'roll ''s '''re",
        ".'s ,'t !'re ?'ve -'m ('ll )'d",
        " 's  't\t're\n've\u{A0}'m\u{3000}'ll\r\n'd",
        "1's 2't 3're 4've 5'm 6'll 7'd",
        "é's 日't ж're",
        "'S 'T 'RE 'Ve 'M 'LL 'D",
        "'r 'v 'l 'e 'x",
        "'",
        "a'",
        "a''",
        "'s'",
        "'s's's",
        "'ll'll",
        "'re're",
        // white space
        "a b",
        "a  b",
        "a   b",
        "a \n b",
        "a\n\nb",
        "a\t\tb",
        "a \t b",
        "a\r\nb",
        "a\r\n\r\nb",
        " \n",
        "  end  ",
        "\n",
        "\n\n\n",
        "x\u{A0}y",
        "x \u{A0}y",
        "x\u{A0} y",
        "x\u{2003}\u{2003}y",
        "\u{3000}中\u{3000}\u{3000}文",
        "\u{85}\u{1680}\u{2000}\u{2001}\u{2002}\u{2003}\u{2004}\u{2005}\u{2006}\u{2007}\u{2008}\u{2009}\u{200A}\u{2028}\u{2029}\u{202F}\u{205F}\u{3000}x",
        "\u{200B}zero\u{200B}width\u{FEFF}bom\u{180E}mvs",
        "\x0B\x0Cvt ff\x0B",
        "\u{1C}\u{1D}\u{1E}\u{1F}separators",
        // letters and digits of many scripts
        "café naïve Ωmega Straße",
        "Привет мир 123",
        "Καλημέρα κόσμε",
        "日本語のテキスト、中文文本。한국어",
        "नमस्ते दुनिया १२३",
        "مرحبا ٣٤٥ ۴۵۶",
        "０１２３ＡＢＣ",
        "Ⅻ ½ ² ① ⅔",
        "𝐀𝐁𝐂 𝟘𝟙 𠀀𠀁",
        "ǅemal ʰa ˤb",
        // combining marks, emoji, symbols
        "e\u{301}e\u{301} a\u{308}",
        "\u{301}start",
        "क\u{94D}ष",
        "\u{903}\u{20DD}",
        "😀😀 👍🏽 ❤\u{FE0F} 👨\u{200D}👩\u{200D}👧 🇺🇸",
        "© ™ € £ ¥ — … « » ¿ ¡ §",
        "a+b=c; x->y && z || !w",
        "fn main() { println!(\"{}\", 42); }",
        "\0\u{1}\u{7F}\u{80}\u{9F}\u{FFFD}",
        "123abc456",
        "abc 123 def",
        " 123 abc ... ",
    ];
    for text in strings {
        texts.push(text.as_bytes().to_vec());
    }
    // Cut mid-character and other invalid UTF-8.
    let invalid: &[&[u8]] = &[
        b"\x80",
        b"\xFF",
        b"\x80abc",
        b"\xE6\x97a",
        b"\xFF\xFFab",
        b"\xC3\xA9\xA9",
        b"\xF0\x9F\x98\x80\x80",
        b"x\xE6y",
        b"\x80\x80\x80\x80",
        b"\xE6\x97\xA5\x80\x80\x80",
        b"\xF8\x80\x80\x80\x80",
        b"\xC0\xAF\xE0\x80\xAF",
        b"\xF0\x80",
        b"\xF0\x80\x80",
        b"ab\xC3",
        b"ab \xC3",
        b"\xED\xA0\x80z",
        b"\xF4\x90\x80\x80",
        b"\xF5\x80\x80\x80",
        b"\xC1\xBF",
        b"it\x80's",
        b"\x80's",
        b" \x80 \xFF",
        b"\xE2\x80",
        b"\xE2\x80 x",
    ];
    for text in invalid {
        texts.push(text.to_vec());
    }
    let cut = "日本語😀é".as_bytes();
    for end in 0..cut.len() {
        texts.push(cut[..end].to_vec());
        texts.push(cut[end..].to_vec());
    }
    // Long runs that cross workgroups, and every byte value.
    texts.push(b"a".repeat(300));
    texts.push(
        [
            b"x".repeat(70),
            b" ".repeat(65),
            b"7".repeat(33),
            b"!".repeat(40),
            b"\n".repeat(20),
        ]
        .concat(),
    );
    texts.push("語".repeat(50).into_bytes());
    texts.push(" it's".repeat(40).into_bytes());
    texts.push((0..=255u8).collect());
    texts.push((0..=255u8).rev().cycle().take(700).collect());
    texts
}

const CONTRACTIONS: &[&str] = &[
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'RE", "'r", "'l", "'v", "'", "''",
];
const SPACES: &[&str] = &[
    " ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\x0B", "\x0C", "\u{85}", "\u{A0}", "\u{1680}",
    "\u{2000}", "\u{2007}", "\u{200A}", "\u{2028}", "\u{2029}", "\u{202F}", "\u{205F}", "\u{3000}",
    "\u{200B}", "\u{180E}", "\u{FEFF}", "\u{1C}",
];
const LETTERS: &[&str] = &[
    "a", "z", "Q", "s", "t", "e", "l", "é", "ß", "Ж", "д", "λ", "Ω", "中", "日", "ア", "あ", "한",
    "ह", "अ", "ع", "א", "ǅ", "ʰ", "𝐀", "𠀀", "ª", "ー",
];
const NUMBERS: &[&str] = &[
    "0", "7", "٣", "۴", "५", "０", "９", "Ⅻ", "½", "²", "𝟘", "①", "〇", "፩",
];
const MARKS: &[&str] = &[
    "\u{301}", "\u{308}", "\u{903}", "\u{94D}", "\u{20DD}", "\u{FE0F}", "\u{200D}",
];
const OTHERS: &[&str] = &[
    ".", ",", "!", "?", "-", "(", ")", "\"", ";", ":", "@", "#", "$", "%", "&", "*", "_", "+", "=",
    "[", "]", "{", "}", "|", "\\", "/", "<", ">", "~", "`", "^", "€", "£", "©", "™", "—", "…", "«",
    "»", "¿", "。", "、", "😀", "👍🏽", "🇺🇸", "\0", "\u{7F}", "\u{80}", "\u{FFFD}",
];

/// A random string of up to `max_units` units, each a contraction, white space, a
/// letter or digit run of some script, a combining mark, emoji, symbol or control
/// character, or (rarely) any code point at all.
pub fn random_string(random: &mut SplitMix64, max_units: u32) -> String {
    let units = random.below(max_units + 1);
    let mut out = String::new();
    for _ in 0..units {
        match random.below(20) {
            0..=3 => out.push_str(random.pick::<&str>(CONTRACTIONS)),
            4..=8 => out.push_str(random.pick::<&str>(SPACES)),
            9..=12 => {
                for _ in 0..1 + random.below(4) {
                    out.push_str(random.pick::<&str>(LETTERS));
                }
            }
            13..=14 => {
                for _ in 0..1 + random.below(3) {
                    out.push_str(random.pick::<&str>(NUMBERS));
                }
            }
            15 => out.push_str(random.pick::<&str>(MARKS)),
            16..=18 => out.push_str(random.pick::<&str>(OTHERS)),
            _ => {
                let code_point = random.below(0x11_0000);
                out.push(char::from_u32(code_point).unwrap_or('\u{FFFD}'));
            }
        }
    }
    out
}

/// [`random_string`]'s bytes, sometimes damaged: cut at a random byte (often
/// mid-character) or with random bytes overwritten or inserted. About a quarter
/// of the results are invalid UTF-8.
pub fn random_bytes(random: &mut SplitMix64, max_units: u32) -> Vec<u8> {
    let mut bytes = random_string(random, max_units).into_bytes();
    damage(random, &mut bytes, 12);
    bytes
}

/// Damages `bytes` one time in `one_in / 3`: cuts them at a random byte (often
/// mid-character), overwrites a byte with a random one, or inserts a lead,
/// continuation or never-valid byte, each one time in `one_in`.
pub fn damage(random: &mut SplitMix64, bytes: &mut Vec<u8>, one_in: u32) {
    if bytes.is_empty() {
        return;
    }
    match random.below(one_in) {
        0 => {
            let cut = random.below(bytes.len() as u32) as usize;
            bytes.truncate(cut);
        }
        1 => {
            let at = random.below(bytes.len() as u32) as usize;
            bytes[at] = random.below(256) as u8;
        }
        2 => {
            let at = random.below(bytes.len() as u32 + 1) as usize;
            let byte =
                *random.pick(&[0x80u8, 0xBF, 0xC0, 0xC3, 0xE0, 0xED, 0xF0, 0xF4, 0xF8, 0xFF]);
            bytes.insert(at, byte);
        }
        _ => {}
    }
}

/// One text per lead byte of interest (C1/C2, DF, E0, E1, EC, ED, EE, EF, F0, F1,
/// F3, F4, F5): the lead with every boundary second byte of the well-formed table
/// and complete, short and interrupted tails, each sequence between a letter and a
/// digit, so a sequence decoded to the wrong class (or wrongly valid) joins a
/// neighbour and moves a piece start.
pub fn utf8_boundary_texts() -> Vec<Vec<u8>> {
    let leads = [
        0xC1u8, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5,
    ];
    let seconds = [0x7Fu8, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0];
    let tails: [&[u8]; 4] = [b"\x80\x80", b"\x80", b"\x80a", b""];
    leads
        .iter()
        .map(|&lead| {
            let mut text = Vec::new();
            for second in seconds {
                for tail in tails {
                    text.push(b'x');
                    text.push(lead);
                    text.push(second);
                    text.extend_from_slice(tail);
                    text.push(b'1');
                }
            }
            text
        })
        .collect()
}
