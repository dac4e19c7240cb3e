//! Test texts for the cl100k and o200k splits (and GPT-2's again): the
//! hand-written corpus of `oracle::corpus` extended with what the newer patterns
//! tell apart (case-insensitive contractions and the letters that fold to theirs,
//! digit groups of three in many scripts, `\r\n` and white space before line
//! breaks, `/` after punctuation, marks and caseless letters next to upper- and
//! lower-case ones, titlecase, CamelCase), long runs, and a seeded generator of
//! random strings over an alphabet with every kind of character and every
//! boundary between them. Shared by `tests/split.rs` and any test that wants the
//! same inputs (through `mod split_corpus;` beside `mod oracle;`, whose corpus
//! and damage it extends).

#![allow(dead_code)]

use vyre_tokenizer::pretokenize::text::SplitMix64;

/// The seven contractions, lower case.
pub const CONTRACTIONS: [&str; 7] = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"];

/// Every upper/lower-case spelling of `word` (ASCII letters only).
pub fn case_variants(word: &str) -> Vec<String> {
    let letters: Vec<char> = word.chars().collect();
    let cased: Vec<usize> = (0..letters.len())
        .filter(|&index| letters[index].is_ascii_alphabetic())
        .collect();
    (0..1u32 << cased.len())
        .map(|mask| {
            let mut variant = letters.clone();
            for (bit, &index) in cased.iter().enumerate() {
                if mask >> bit & 1 == 1 {
                    variant[index] = variant[index].to_ascii_uppercase();
                }
            }
            variant.into_iter().collect()
        })
        .collect()
}

/// Contractions in every case, in every context: at the start and end, after
/// lower- and upper-case letters, caseless letters, marks, digits, spaces, line
/// breaks and punctuation, followed by letters of each case, digits, marks and
/// more contractions; and the non-ASCII letters that case-fold to a contraction
/// letter (U+017F LONG S folds to `s`) or to another letter (U+212A KELVIN SIGN
/// folds to `k`, U+0130 and U+0131 are not `i`).
pub fn contraction_texts() -> Vec<String> {
    let mut texts = Vec::new();
    let before = [
        "", "x", "X", "日", "é", "e\u{301}", "\u{301}", "7", " ", "  ", "\t", "\n", ".", "..", "'",
        "-", "ǅ", "ʰ",
    ];
    let after = ["", "a", "A", "1", "\u{301}", " ", "'s", ".", "日"];
    for contraction in CONTRACTIONS {
        for variant in case_variants(contraction) {
            for prefix in before {
                texts.push(format!("{prefix}{variant}"));
            }
            for suffix in after {
                texts.push(format!("it{variant}{suffix}"));
                texts.push(format!("IT{variant}{suffix}"));
            }
        }
    }
    texts.extend(
        [
            "DON'T",
            "don't",
            "Don't",
            "you'Ll",
            "YOU'LL",
            "you'll've",
            "'S",
            "'s",
            "I'M",
            "WE'RE",
            "they'VE",
            "He'D",
            "it'S",
            "O'Neil",
            "O'NEIL'S",
            "McDonald's",
            "rock'n'roll",
            "don'tknow",
            "DON'Tknow",
            "DON'TKNOW",
            "x's's",
            "x'sa",
            "x's'",
            "'''s",
            "''s",
            "' s",
            "'r",
            "'v",
            "'l",
            "'e",
            "'rx",
            "'vx",
            "'lx",
            "'R",
            "'LE",
            "'Rv",
            "'LLama",
            // Letters that fold to a contraction letter, and ones that do not.
            "x'\u{17F}",
            "x'\u{17F}a",
            "X'\u{17F}",
            "\u{17F}'s",
            "'\u{17F}",
            "it'\u{17F}\u{17F}",
            "x'\u{212A}",
            "x'\u{212A}a",
            "x'k",
            "x'\u{130}",
            "x'\u{131}",
            "x'\u{1E9E}",
            "x'ſt",
            "x'\u{FB05}",
            "x'\u{2C6}",
            "x'\u{2D1}",
            // Contractions after caseless letters and marks (o200k: part of the piece).
            "日本's",
            "日本'S",
            "\u{301}'s",
            ".\u{301}'s",
            "a\u{301}'ll",
            "A\u{301}'LL",
            "ABC日'd",
            "ABC日D'd",
            "ʰ're",
            "ǅ've",
        ]
        .iter()
        .map(|text| text.to_string()),
    );
    texts
}

/// Digit runs of 1 to 12 in several scripts (ASCII, Arabic-Indic, extended
/// Arabic-Indic, Devanagari, fullwidth, mathematical bold (4 bytes each),
/// superscripts and other N characters: Roman numerals (Nl), fractions and
/// circled numbers (No)), alone, between letters, after spaces and punctuation,
/// and scripts mixed in one run.
pub fn digit_texts() -> Vec<String> {
    let scripts = [
        "0123456789",
        "٠١٢٣٤٥٦٧٨٩",
        "۰۱۲۳۴۵۶۷۸۹",
        "०१२३४५६७८९",
        "０１２３４５６７８９",
        "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗",
        "⁰¹²³⁴⁵⁶⁷⁸⁹",
        "ⅠⅡⅢⅣⅤⅥⅦⅧⅨⅩ",
        "½⅓¼①②③⑩〇፩",
    ];
    let mut texts = Vec::new();
    for digits in scripts {
        let digits: Vec<char> = digits.chars().collect();
        for length in 1..=12 {
            let run: String = (0..length)
                .map(|index| digits[index % digits.len()])
                .collect();
            texts.push(run.clone());
            texts.push(format!("a{run}b"));
            texts.push(format!(" {run} "));
            texts.push(format!("x {run}"));
            texts.push(format!(".{run}."));
            texts.push(format!("{run}\n"));
            texts.push(format!("A{run}\u{301}"));
        }
    }
    texts.extend(
        [
            "1٣५２𝟘²Ⅻ½①",
            "12,345,678.90",
            "3.14159265358979",
            "v1.2.3",
            "0x1F600",
            "2024-12-01",
            "+1 (555) 123-4567",
            "1st 2nd 3rd 4th",
            "x²+y²",
            "H₂O",
            "10％",
            "١٢٣abc٤٥٦",
        ]
        .iter()
        .map(|text| text.to_string()),
    );
    texts
}

/// Line breaks and the white space around them: `\r\n` mixtures, `\r` alone,
/// spaces, tabs, NBSP and other Unicode spaces before and after line breaks, line
/// breaks after punctuation (the punctuation piece takes them) and, for o200k,
/// `/` among them.
pub fn line_break_texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        "a\nb",
        "one\ntwo\rthree",
        "\nstart",
        "\rstart",
        "a\r\nb",
        "a\r\n\r\nb",
        "a\n\rb",
        "\r",
        "\r\r",
        "a\rb",
        "a\r",
        "\r\r\n",
        "\r\n",
        "\n\n",
        "a  \nb",
        "a \t\n b",
        "a\u{A0}\nb",
        "a\u{3000}\n\u{3000}b",
        "a \n \n b",
        "a\n \nb",
        "a\n  b",
        "a\n\t\tb",
        "a\n \u{A0}b",
        " \n",
        "  \n  ",
        "\t\n",
        "\n\t",
        "\n ",
        "\n x",
        "\u{85}\n",
        "\u{85}x",
        "a\u{2028}b",
        "a\u{2029}\u{2029}b",
        "\x0B\x0C\n",
        "x\x0B\n\x0Cy",
        ".\n\n x",
        ".\n\nx",
        ".\r\n",
        ".\n \n",
        ". \n",
        "!\n\n\n",
        "!\n!\n",
        "end\n",
        "end \n",
        "end\n ",
        "x\n\n\n\n\n\ny",
        "a\u{A0}\u{A0}b",
        "a\u{A0} b",
        "a \u{A0}b",
        "a\t b",
        "1\n2",
        "1 \n 2",
        "日\n本",
        "a.\r\n\r\n  b",
        "' \n",
        "'\n's",
        // `/` after punctuation and line breaks (o200k's `[\r\n/]*`).
        "x/y/z",
        "a/\n",
        "a/\nb",
        "//",
        "///a",
        "a//b",
        "http://x.y/z",
        "./\n/\n/a",
        ".\n/",
        ".\n/x",
        ".\n//\n/.",
        "\n/a",
        "/\n/",
        " /\n/",
        "a\n/b",
        "!/\r\n/\r\n",
        ".\u{301}\n/",
        "..\u{301}\n/a",
        "1/2",
        "a / b",
        "path/to/file.rs\n",
    ]
    .iter()
    .map(|text| text.to_string())
    .collect();
    let spaces = [
        " ", "  ", "\t", "\u{A0}", "\u{3000}", "\u{2003}", " \t", "\u{85}",
    ];
    let breaks = ["\n", "\r\n", "\r", "\n\n", "\r\n\r\n", "\n\r"];
    for space in spaces {
        for line_break in breaks {
            texts.push(format!("a{space}{line_break}b"));
            texts.push(format!("a{line_break}{space}b"));
            texts.push(format!("a{space}{line_break}{space}"));
            texts.push(format!(".{line_break}{space}."));
            texts.push(format!("{space}{line_break}{space}{line_break}x"));
        }
    }
    texts
}

/// Marks and letters of every case class: combining and decomposed accents, marks
/// at a text start, after a space, after digits and after punctuation (once or
/// twice: o200k puts `..\u{301}` in one punctuation piece but `.\u{301}` in a
/// letter piece), titlecase letters, modifier and other letters, CamelCase,
/// ALLCAPS, `HTTPServer`, upper-case runs that end in a caseless letter.
pub fn letter_and_mark_texts() -> Vec<String> {
    [
        "e\u{301}",
        "\u{301}",
        "\u{301}a",
        "\u{301}A",
        " \u{301}a",
        " \u{301}",
        "1\u{301}",
        "a1\u{301}",
        ".\u{301}",
        "..\u{301}",
        " .\u{301}a",
        ".\u{301}a",
        ".\u{301}.",
        "..\u{301}a",
        ".\u{301}.\u{301}..\u{301}",
        "\u{301}\u{301}\u{301}",
        "A\u{301}B",
        "AB\u{301}C",
        "ABC\u{301}",
        "\u{301}ABC.",
        "\u{301}ABc",
        "Ab\u{301}C",
        "\t\u{301}x",
        "\n\u{301}",
        "\u{301}\n",
        "Cafe\u{301}",
        "CAFE\u{301}S",
        "CAFE\u{301}",
        "n\u{303}o",
        "N\u{303}O",
        "\u{20DD}",
        "a\u{FE0F}",
        "क्षत्रिय",
        "नमस्ते",
        "\u{903}\u{20DD}",
        "a\u{200D}b",
        "ǅ",
        "ǅemal",
        "ǅEMAL",
        "aǅ",
        "Aǅ",
        "ǈ",
        "ǋa",
        "ǲ",
        "ʰ",
        "aʰB",
        "ʰA",
        "Aʰ",
        "AʰB",
        "AʰBc",
        "ˤb",
        "ª",
        "ªB",
        "BªC",
        "ᵃᵇᶜ",
        "CamelCase",
        "camelCase",
        "ALLCAPS",
        "HTTPServer",
        "getHTTPResponseCode",
        "XMLHttpRequest",
        "iPhone",
        "IPhone",
        "ABC日本DEF",
        "ABC日本DEFghi",
        "abc日本DEF",
        "日本ABC",
        "日本abc",
        "ABC日",
        "日ABC日",
        "ÀÉÎ",
        "ÀÉÎõ",
        "Straße",
        "STRASSE",
        "ΣΊΣΥΦΟΣ",
        "Ωmega",
        "ΩMEGA",
        "Привет МИР",
        "İstanbul",
        "ǆungla",
        "ﬁne",
        "ＡＢＣａｂｃ",
        "𝐀𝐁𝐂𝐚𝐛𝐜",
        "ⅰⅱ",
        "ⓐⓑ",
        "A.B.C.",
        "a.b.c",
        "A-B-C",
        "x_y_Z",
        "__init__",
        "$var",
        "@Mention",
        "#HashTag",
    ]
    .iter()
    .map(|text| text.to_string())
    .collect()
}

/// Emoji, ZWJ sequences, flags, CJK and mixed scripts.
pub fn emoji_and_cjk_texts() -> Vec<String> {
    [
        "😀",
        "😀😀",
        "👍🏽",
        "❤\u{FE0F}",
        "👨\u{200D}👩\u{200D}👧",
        "🇺🇸",
        "a😀b",
        " 😀",
        "😀\n",
        "🏳\u{FE0F}\u{200D}🌈",
        "👩🏻\u{200D}💻 works",
        "x 👨\u{200D}👩\u{200D}👧 y",
        "日本語のテキスト、中文文本。한국어",
        "中文 English 混合",
        "漢字123",
        "テスト。テスト",
        "ｶﾀｶﾅ",
        "한국어 텍스트입니다.",
        "中文，标点。",
        "「引用」",
        "日本\n\n語",
    ]
    .iter()
    .map(|text| text.to_string())
    .collect()
}

/// Every hand-written text: `oracle::corpus()` (GPT-2's corpus, invalid and cut
/// UTF-8 included) and the groups above.
pub fn corpus(gpt2_corpus: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut texts = gpt2_corpus;
    for group in [
        contraction_texts(),
        digit_texts(),
        line_break_texts(),
        letter_and_mark_texts(),
        emoji_and_cjk_texts(),
    ] {
        texts.extend(group.into_iter().map(String::into_bytes));
    }
    texts
}

/// 100 KiB runs of one thing each: a letter (lower, upper, caseless), spaces,
/// digits, apostrophes, `\r\n`, newlines, marks, and pairs whose pieces are short
/// (contractions, mark after punctuation, `a/`).
pub fn long_runs() -> Vec<(&'static str, Vec<u8>)> {
    long_runs_of(100 << 10)
}

/// [`long_runs`] with runs of about `bytes` each (the GPU tests shrink them under
/// compute-sanitizer, whose tools slow a long piece's serial merge a thousandfold).
pub fn long_runs_of(bytes: usize) -> Vec<(&'static str, Vec<u8>)> {
    let run = |unit: &str| unit.repeat(bytes / unit.len()).into_bytes();
    vec![
        ("lower-case letter", run("a")),
        ("upper-case letter", run("A")),
        (
            "upper case then one lower",
            [run("A"), b"a".to_vec()].concat(),
        ),
        ("ideograph", run("日")),
        ("spaces", run(" ")),
        ("spaces then a letter", [run(" "), b"x".to_vec()].concat()),
        (
            "tabs then a line break",
            [run("\t"), b"\n".to_vec()].concat(),
        ),
        ("digits", run("7")),
        ("Devanagari digits", run("५")),
        ("apostrophes", run("'")),
        ("\\r\\n", run("\r\n")),
        ("newlines", run("\n")),
        ("marks", run("\u{301}")),
        (
            "marks after a letter",
            [b"a".to_vec(), run("\u{301}")].concat(),
        ),
        ("upper-case letter and mark", run("A\u{301}")),
        (
            "upper case, one mark, upper case",
            [run("A"), "\u{301}".into(), run("B")].concat(),
        ),
        ("contractions", run("'s")),
        ("mark after punctuation", run(".\u{301}")),
        ("slash after a letter", run("a/")),
        ("line break and slash", [b".".to_vec(), run("\n/")].concat()),
        ("invalid bytes", vec![0xFF; bytes]),
    ]
}

/// What random strings are made of: every [`Kind`] of character and the
/// sequences whose boundaries the patterns decide.
///
/// [`Kind`]: vyre_tokenizer::pretokenize::unicode::Kind
const UNITS: &[&[&str]] = &[
    // contractions and apostrophes
    &[
        "'s",
        "'t",
        "'re",
        "'ve",
        "'m",
        "'ll",
        "'d",
        "'S",
        "'RE",
        "'Ll",
        "'lL",
        "'D",
        "'\u{17F}",
        "'\u{212A}",
        "'r",
        "'l",
        "'",
        "''",
    ],
    // lower-case letters (contraction letters among them)
    &[
        "a",
        "s",
        "t",
        "e",
        "l",
        "r",
        "v",
        "m",
        "d",
        "x",
        "é",
        "ß",
        "ж",
        "λ",
        "\u{17F}",
        "ǆ",
        "𝐚",
        "letters",
        "abcdefghijklmnopqrstuvwxyz",
    ],
    // upper-case and titlecase letters
    &[
        "A",
        "S",
        "T",
        "E",
        "L",
        "R",
        "V",
        "M",
        "D",
        "X",
        "É",
        "Ж",
        "Ω",
        "\u{212A}",
        "İ",
        "ǅ",
        "𝐀",
        "HTTPSERVER",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    ],
    // caseless letters (Lm, Lo)
    &[
        "日", "中", "ア", "한", "ह", "ع", "א", "ʰ", "ª", "ー", "𠀀", "ᵃ",
    ],
    // marks (Mn, Mc, Me)
    &[
        "\u{301}",
        "\u{308}",
        "\u{903}",
        "\u{94D}",
        "\u{20DD}",
        "\u{FE0F}",
        "\u{E0100}",
    ],
    // numbers
    &["0", "7", "٣", "۴", "५", "０", "𝟘", "²", "Ⅻ", "½", "①", "〇"],
    // white space
    &[
        " ", " ", " ", "\t", "\n", "\r", "\r\n", "\u{A0}", "\u{3000}", "\u{85}", "\u{2028}",
        "\u{2003}", "\x0B", "\x0C",
    ],
    // punctuation, symbols, controls, slash
    &[
        ".", ",", "!", "-", "/", "/", ".\n", "/\r\n", "\"", "(", "@", "[", "`", "{", "_", "€",
        "😀", "👍🏽", "\u{200D}", "\0", "\u{7F}", "\u{FFFD}", "\u{E000}",
    ],
];

/// A random string of up to `max_units` units from [`UNITS`] (each group equally
/// likely), now and then a run of two to four units of one group.
pub fn random_string(random: &mut SplitMix64, max_units: u32) -> String {
    let units = random.below(max_units + 1);
    let mut out = String::new();
    for _ in 0..units {
        let group = *random.pick::<&[&str]>(UNITS);
        let repeat = if random.chance(1, 4) {
            2 + random.below(3)
        } else {
            1
        };
        for _ in 0..repeat {
            out.push_str(random.pick::<&str>(group));
        }
    }
    out
}

/// [`random_string`]'s bytes, one time in three damaged (`oracle::damage`).
pub fn random_bytes(random: &mut SplitMix64, max_units: u32) -> Vec<u8> {
    let mut bytes = random_string(random, max_units).into_bytes();
    super::oracle::damage(random, &mut bytes, 9);
    bytes
}
