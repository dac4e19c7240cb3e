//! Texts for the encoders' oracle tests beyond the GPT-2 corpus
//! (`tests/oracle/mod.rs`): the cases where cl100k's and o200k's patterns differ
//! from GPT-2's (case-insensitive contractions, digit runs cut in threes, line
//! breaks and the white space before them, `/` after punctuation, combining
//! marks and case classes), plus a seeded random generator weighted toward them.
//! Include it with `#[path = "support/encoding_corpus.rs"] mod encoding_corpus;`.
#![allow(dead_code)]

use vyre_tokenizer::pretokenize::text::SplitMix64;

/// Hand-written texts (all valid UTF-8: tiktoken takes `&str`).
pub fn extended_corpus() -> Vec<String> {
    let mut texts: Vec<String> = [
        // contractions in every case
        "'s 'S 't 'T 're 'RE 'Re 'rE 've 'VE 'Ve 'vE 'm 'M 'll 'LL 'Ll 'lL 'd 'D",
        "DON'T you'Ll I'M we'RE they'Ve he'D it'S SHE'LL",
        "don't DON'T Don't dOn'T",
        "O'Neil O'NEIL rock'N'roll 'TIS",
        "x'S y'T z'Re w'vE",
        "''S '''RE ''LL",
        "it'sX IT'SX it'llx IT'LLX",
        "Straße'S ΣΑΣ'S",
        // digit runs of 1 to 12 in several scripts
        "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 12345678901 123456789012",
        "a1b12c123d1234e12345f123456g1234567",
        "٣ ٣٤ ٣٤٥ ٣٤٥٦ ٣٤٥٦٧ ٣٤٥٦٧٨٩",
        "१ १२ १२३ १२३४ १२३४५६७",
        "０ ０１ ０１２ ０１２３ ０１２３４５６",
        "𝟘𝟙𝟚𝟛𝟜𝟝𝟞",
        "Ⅻ½²①⅔ 12½ ²³",
        "3.14159 2,718,281 1e10 0x1F -42 +7 100%",
        "$1,234.56 €99 ¥1000",
        "2024-12-01T13:45:00Z",
        // \r\n mixtures and spaces before newlines
        "a\r\nb",
        "a\n\rb",
        "a\r\r\nb",
        "a \nb",
        "a  \nb",
        "a \r\nb",
        "a\t\nb",
        "a \n \n b",
        "a\n\n\nb",
        "a \n\n  b",
        "  \n",
        "\r\n\r\n",
        "x\r",
        "end \r\n",
        "one.\r\ntwo!\n\nthree?\r\n\r\n",
        "\u{A0}\n\u{3000}\r\n",
        "}\n\n    fn x() {\r\n        y\r\n    }\n",
        ".\n",
        ".\r\n",
        "!!\n\n",
        "?\r\r",
        // x/y/z for o200k
        "x/y/z",
        "a/b",
        "/usr/local/bin",
        "and/or  https://example.com/a/b?c=d",
        "./x ../y //z ///",
        "1/2/3",
        "x /y/ z/",
        "!/ ?// .\n/",
        // combining marks and decomposed accents
        "e\u{301}te\u{301} cafe\u{301} nai\u{308}ve",
        "E\u{301}COLE A\u{30A}NGSTRO\u{308}M",
        "\u{301}\u{301}abc",
        "x\u{20DD}y \u{20DD}",
        "क्षत्रिय हिन्दी",
        "ทดสอบภาษาไทย",
        "a\u{300}\u{301}\u{302}\u{303}\u{304}b",
        // titlecase letters and case runs
        "ǅemal ǈubljana ǋegoš",
        "ǄǅǆǇǈǉ",
        "HTTPServer XMLHttpRequest iPhone eBay McDonald",
        "ABCdef abcDEF AbCdEf",
        "ΣΊΣΥΦΟΣ σίσυφος",
        "İstanbul ıi",
        "ʰʲʷ ˤˠ ᵃᵇᶜ",
        "ꟸꟹ Ⓐⓑ",
        // emoji ZWJ sequences and modifiers
        "👨\u{200D}👩\u{200D}👧\u{200D}👦 family",
        "👩🏽\u{200D}💻 coder",
        "🏳\u{FE0F}\u{200D}🌈 flag",
        "👍🏻👍🏼👍🏽👍🏾👍🏿",
        "🇺🇸🇯🇵🇩🇪",
        "❤\u{FE0F}\u{200D}🔥",
        "a👍b 1👍2",
        // mixed
        "Hello, world! It's 2024 and I'M here.\r\n",
        "C++ and C# and F# (and .NET/JVM)",
        "<|endoftext|> <|fim_prefix|> <|endofprompt|>",
        "<|endoftext",
        "   leading and trailing   ",
        "\t\ttabs\tand\t\t",
    ]
    .iter()
    .map(|text| text.to_string())
    .collect();
    texts.push("x".repeat(200) + &"9".repeat(50) + &" ".repeat(40) + &"\r\n".repeat(10));
    texts.push("ab".repeat(300));
    texts
}

const EXTRA_UNITS: &[&str] = &[
    "'S",
    "'T",
    "'Re",
    "'rE",
    "'VE",
    "'vE",
    "'M",
    "'LL",
    "'lL",
    "'D",
    "'",
    "n'T",
    "DON'T",
    "/",
    "//",
    "\r\n",
    "\n",
    "\r",
    " \n",
    "  \r\n",
    "\t\n",
    "\u{301}",
    "\u{308}",
    "\u{20DD}",
    "ǅ",
    "ǈ",
    "Σ",
    "σ",
    "İ",
    "ʰ",
    "A",
    "B",
    "Q",
    "\u{200D}",
    "👨\u{200D}👩",
    "👍🏽",
    "🇯🇵",
];

const DIGIT_RUNS: &[&str] = &["0", "1", "5", "9", "٣", "۴", "१", "０", "𝟙", "½", "Ⅻ"];

/// A random string: the GPT-2 generator's units (`oracle::random_string`, passed
/// in as `base`) mixed with case-mixed contractions, line breaks, `/`, marks,
/// titlecase and capital letters, emoji sequences and digit runs of 1 to 12.
pub fn random_text(
    random: &mut SplitMix64,
    base: impl Fn(&mut SplitMix64, u32) -> String,
    max_units: u32,
) -> String {
    let units = random.below(max_units + 1);
    let mut out = String::new();
    for _ in 0..units {
        match random.below(10) {
            0..=3 => out.push_str(&base(random, 3)),
            4..=7 => out.push_str(random.pick::<&str>(EXTRA_UNITS)),
            _ => {
                let digit = *random.pick(DIGIT_RUNS);
                for _ in 0..1 + random.below(12) {
                    out.push_str(digit);
                }
            }
        }
    }
    out
}
