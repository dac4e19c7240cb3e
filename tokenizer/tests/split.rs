//! CPU tests of the splits by pattern (GPT-2, cl100k, o200k): the sequential
//! `Splitter` (through `split_into`, the byte-piece iterator and the string-piece
//! iterator) and the per-position rule (`per_position`) must give exactly the
//! piece starts of the external oracle, `fancy-regex` running the pattern text
//! from `Pattern::regex()`, on valid UTF-8, and the oracle's starts on the text
//! with every invalid byte replaced by U+FFFD (mapped back) on the rest.

mod oracle;
mod split_corpus;

use oracle::Oracle;
use vyre_tokenizer::pretokenize::pattern::{piece_starts, split_into, Pattern, Splitter};
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::pretokenize::{cpu, per_position, MAX_TEXT_BYTES};

fn shown(text: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(text))
}

/// Every formulation's piece starts of `text`, each checked against `expected`.
fn assert_all_formulations(pattern: Pattern, text: &[u8], expected: &[u32], what: &str) {
    let splitter = Splitter::new(pattern).expect("splitter");
    let mut starts = vec![7];
    splitter.split_into(text, &mut starts).expect("split");
    assert_eq!(
        &starts[1..],
        expected,
        "{pattern:?} split_into, {what}: {}",
        shown(text)
    );
    let mut pieces = splitter.pieces(text);
    let mut offsets = Vec::new();
    let mut rebuilt = Vec::new();
    while let Some(piece) = {
        offsets.push(pieces.offset() as u32);
        pieces.next()
    } {
        assert!(!piece.is_empty(), "{pattern:?} empty piece, {what}");
        rebuilt.extend_from_slice(piece);
    }
    assert_eq!(
        offsets.pop(),
        Some(text.len() as u32),
        "{pattern:?} offset after the last piece"
    );
    assert_eq!(
        offsets,
        expected,
        "{pattern:?} pieces, {what}: {}",
        shown(text)
    );
    assert_eq!(rebuilt, text, "{pattern:?} pieces tile the text, {what}");
    assert_eq!(pieces.next(), None, "{pattern:?} pieces stay ended");
    if let Ok(valid) = std::str::from_utf8(text) {
        let mut offset = 0;
        let mut str_starts = Vec::new();
        for piece in splitter.str_pieces(valid) {
            str_starts.push(offset as u32);
            offset += piece.len();
        }
        assert_eq!(
            str_starts, expected,
            "{pattern:?} str_pieces, {what}: {valid:?}"
        );
    }
    assert_eq!(
        per_position::piece_starts(pattern, text).expect("per-position rule"),
        expected,
        "{pattern:?} per-position rule, {what}: {}",
        shown(text)
    );
    if pattern == Pattern::Gpt2 {
        assert_eq!(
            cpu::piece_starts(text).expect("cpu"),
            expected,
            "GPT-2 cpu.rs, {what}"
        );
    }
}

/// Locks out any disagreement with the oracle on the hand-written corpus
/// (GPT-2's corpus plus contractions in every case and after every kind of
/// character, the letters that case-fold to contraction letters, digit runs of 1
/// to 12 in nine scripts, `\r\n` mixtures and Unicode spaces before line breaks,
/// `/` after punctuation, marks at a start and after spaces, digits and
/// punctuation, titlecase and caseless letters, CamelCase, emoji, CJK, invalid and
/// cut UTF-8, every lead byte with every boundary second byte of Unicode's
/// well-formed table) and on the three generated shapes, for every pattern and
/// every formulation.
#[test]
fn splits_equal_oracle_on_corpus_and_shapes() {
    let mut texts = split_corpus::corpus(oracle::corpus());
    texts.extend(oracle::utf8_boundary_texts());
    for shape in Shape::ALL {
        texts.push(generate(shape, 20_000, 1));
    }
    assert!(texts.len() > 2_000, "{} texts", texts.len());
    for pattern in Pattern::ALL {
        let oracle = Oracle::for_pattern(pattern);
        for (index, text) in texts.iter().enumerate() {
            assert_all_formulations(
                pattern,
                text,
                &oracle.starts(text),
                &format!("text {index}"),
            );
        }
    }
}

/// 10,000 valid and 3,000 damaged seeded random strings for `pattern`, each
/// checked in every formulation against the oracle.
fn random_strings_equal_oracle(pattern: Pattern, seed: u64) {
    let oracle = Oracle::for_pattern(pattern);
    let mut random = SplitMix64::new(seed);
    for case in 0..10_000 {
        let text = split_corpus::random_string(&mut random, 16);
        let expected = oracle.starts_of_str(&text);
        assert_all_formulations(pattern, text.as_bytes(), &expected, &format!("case {case}"));
    }
    let mut invalid = 0;
    for case in 0..3_000 {
        let text = split_corpus::random_bytes(&mut random, 16);
        invalid += usize::from(std::str::from_utf8(&text).is_err());
        let expected = oracle.starts(&text);
        assert_all_formulations(pattern, &text, &expected, &format!("damaged case {case}"));
    }
    assert!(
        invalid > 500,
        "only {invalid} damaged strings were invalid UTF-8"
    );
}

/// Locks out GPT-2 disagreements on inputs nobody thought of: 13,000 random
/// strings over every kind of character (contractions in all cases and with
/// case-folding letters, letters of each case class, marks, numbers of many
/// scripts, Unicode spaces and line breaks, punctuation, `/`, emoji), 3,000 of
/// them damaged into invalid UTF-8.
#[test]
fn gpt2_splits_equal_oracle_on_random_strings() {
    random_strings_equal_oracle(Pattern::Gpt2, 0x5EED_0019);
}

/// Locks out cl100k disagreements on the random strings of the GPT-2 test.
#[test]
fn cl100k_splits_equal_oracle_on_random_strings() {
    random_strings_equal_oracle(Pattern::Cl100k, 0xC1_100C);
}

/// Locks out o200k disagreements on the random strings of the GPT-2 test.
#[test]
fn o200k_splits_equal_oracle_on_random_strings() {
    random_strings_equal_oracle(Pattern::O200k, 0x0200_C0DE);
}

/// Locks out disagreements and super-linear work on long runs: 100 KiB of one
/// letter (lower, upper: o200k's first alternative fails after the whole run),
/// of ideographs, spaces, digits, apostrophes, `\r\n`, newlines, marks, and of
/// short repeated pieces, for every pattern and formulation.
#[test]
fn splits_equal_oracle_on_long_runs() {
    for pattern in Pattern::ALL {
        let oracle = Oracle::for_pattern(pattern);
        for (name, text) in split_corpus::long_runs() {
            assert_all_formulations(pattern, &text, &oracle.starts(&text), name);
        }
    }
}

/// The pieces of `text` by `pattern`, as strings.
fn pieces(pattern: Pattern, text: &str) -> Vec<&str> {
    Splitter::new(pattern)
        .expect("splitter")
        .str_pieces(text)
        .collect()
}

/// Locks out a wrong oracle wrapper or a splitter and oracle wrong together:
/// hand-computed cl100k pieces of the pattern's hard cases (case-insensitive
/// contractions that start pieces of their own, one optional character before
/// letters, digit groups of three, `[\r\n]*` after punctuation, `\s*[\r\n]+`
/// against `\s+(?!\S)`).
#[test]
fn hand_computed_cl100k_pieces() {
    let cases: &[(&str, &[&str])] = &[
        ("", &[]),
        ("DON'T", &["DON", "'T"]),
        ("you'Ll", &["you", "'Ll"]),
        ("x'\u{17F}a", &["x", "'\u{17F}", "a"]),
        ("x'\u{212A}a", &["x", "'\u{212A}a"]),
        ("'re're", &["'re", "'re"]),
        (" 's", &[" '", "s"]),
        ("\t's", &["\t", "'s"]),
        ("1234567", &["123", "456", "7"]),
        ("a1234", &["a", "123", "4"]),
        (" 42", &[" ", "42"]),
        ("..abc", &["..", "abc"]),
        (".abc", &[".abc"]),
        ("e\u{301}t", &["e", "\u{301}t"]),
        (".\n\n x", &[".\n\n", " x"]),
        ("a \n b", &["a", " \n", " b"]),
        ("  \n  x", &["  \n", " ", " x"]),
        ("a\n \nb", &["a", "\n \n", "b"]),
        ("end  ", &["end", "  "]),
        ("x\u{A0}y", &["x", "\u{A0}y"]),
        ("x/y", &["x", "/y"]),
        ("HTTPServer", &["HTTPServer"]),
    ];
    let oracle = Oracle::for_pattern(Pattern::Cl100k);
    for (text, expected) in cases {
        assert_eq!(&pieces(Pattern::Cl100k, text), expected, "{text:?}");
        let starts = piece_starts(Pattern::Cl100k, text.as_bytes()).expect("split");
        assert_eq!(oracle.starts_of_str(text), starts, "oracle, {text:?}");
    }
}

/// Locks out a wrong oracle wrapper or a splitter and oracle wrong together:
/// hand-computed o200k pieces (contractions as suffixes only, upper-case runs that
/// end at a caseless letter, CamelCase, marks after one or two punctuation
/// characters, `[\r\n/]*`, a mark whose piece is itself because the letters
/// after it are all upper case).
#[test]
fn hand_computed_o200k_pieces() {
    let cases: &[(&str, &[&str])] = &[
        ("", &[]),
        ("DON'T", &["DON'T"]),
        ("don'tknow", &["don't", "know"]),
        ("you'Ll", &["you'Ll"]),
        ("x'\u{17F}a", &["x'\u{17F}", "a"]),
        ("'s", &["'s"]),
        (" 's", &[" '", "s"]),
        ("CamelCase", &["Camel", "Case"]),
        ("HTTPServer", &["HTTPServer"]),
        ("ALLCAPS", &["ALLCAPS"]),
        ("ABC日本DEF", &["ABC日本", "DEF"]),
        ("ABC日本DEFghi", &["ABC日本DEFghi"]),
        ("ǅemal", &["ǅemal"]),
        (".\u{301}a", &[".\u{301}a"]),
        ("..\u{301}a", &["..\u{301}", "a"]),
        (" .\u{301}a", &[" .\u{301}", "a"]),
        ("\u{301}ABC.", &["\u{301}", "ABC", "."]),
        ("\u{301}'s", &["\u{301}'s"]),
        ("x/y/z", &["x", "/y", "/z"]),
        ("a/\n", &["a", "/\n"]),
        (".\n/x", &[".\n/", "x"]),
        ("//", &["//"]),
        ("1234567", &["123", "456", "7"]),
        ("a \n b", &["a", " \n", " b"]),
    ];
    let oracle = Oracle::for_pattern(Pattern::O200k);
    for (text, expected) in cases {
        assert_eq!(&pieces(Pattern::O200k, text), expected, "{text:?}");
        let starts = piece_starts(Pattern::O200k, text.as_bytes()).expect("split");
        assert_eq!(oracle.starts_of_str(text), starts, "oracle, {text:?}");
    }
}

/// The corpus texts and random strings on which `near_miss` (a pattern one
/// detail away from `pattern`) splits differently from the oracle.
fn near_miss_catches(pattern: Pattern, near_miss: &str) -> (usize, usize) {
    let oracle = Oracle::for_pattern(pattern);
    let regex = fancy_regex::Regex::new(near_miss).expect("near-miss pattern");
    let starts = |text: &str| -> Vec<u32> {
        regex
            .find_iter(text)
            .map(|found| found.expect("match").start() as u32)
            .collect()
    };
    let corpus = split_corpus::corpus(oracle::corpus())
        .into_iter()
        .filter_map(|text| String::from_utf8(text).ok())
        .filter(|text| starts(text) != oracle.starts_of_str(text))
        .count();
    let mut random = SplitMix64::new(0xAB5E_0019);
    let random = (0..2_000)
        .map(|_| split_corpus::random_string(&mut random, 16))
        .filter(|text| starts(text) != oracle.starts_of_str(text))
        .count();
    (corpus, random)
}

/// Negative control for the oracle comparisons above: the corpus and the random
/// strings catch a splitter one detail away from each pattern (contractions
/// case-sensitive or folded by ASCII alone, digit runs not cut in threes, no
/// line-break tail after punctuation or no `/` in o200k's, white-space
/// alternatives in the other order, marks left out of o200k's letter classes, its
/// two letter alternatives swapped, the optional first character allowed to be a
/// line break).
#[test]
fn negative_control_near_miss_patterns_are_caught() {
    let replace = |pattern: Pattern, from: &str, to: &str| {
        let text = pattern.regex();
        assert!(text.contains(from), "{from} is in {pattern:?}");
        text.replace(from, to)
    };
    let o200k_letters_first = Pattern::O200k
        .regex()
        .split('|')
        .next()
        .expect("first")
        .to_string();
    let near_misses = [
        (
            Pattern::Cl100k,
            "case-sensitive contractions",
            replace(
                Pattern::Cl100k,
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)",
                "'s|'t|'re|'ve|'m|'ll|'d",
            ),
        ),
        (
            Pattern::Cl100k,
            "ASCII case folding",
            replace(
                Pattern::Cl100k,
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)",
                "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]",
            ),
        ),
        (
            Pattern::Cl100k,
            "unbounded digit runs",
            replace(Pattern::Cl100k, r"\p{N}{1,3}", r"\p{N}+"),
        ),
        (
            Pattern::Cl100k,
            "no tail after punctuation",
            replace(
                Pattern::Cl100k,
                r"[^\s\p{L}\p{N}]+[\r\n]*",
                r"[^\s\p{L}\p{N}]+",
            ),
        ),
        (
            Pattern::Cl100k,
            "white space alternatives swapped",
            replace(
                Pattern::Cl100k,
                r"\s*[\r\n]+|\s+(?!\S)",
                r"\s+(?!\S)|\s*[\r\n]+",
            ),
        ),
        (
            Pattern::Cl100k,
            "line break as first character",
            replace(
                Pattern::Cl100k,
                r"[^\r\n\p{L}\p{N}]?\p{L}+",
                r"[^\p{L}\p{N}]?\p{L}+",
            ),
        ),
        (
            Pattern::O200k,
            "ASCII case folding",
            Pattern::O200k.regex().replace(
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)",
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
            ),
        ),
        (
            Pattern::O200k,
            "no marks in letter classes",
            Pattern::O200k.regex().replace(r"\p{M}]", "]"),
        ),
        (
            Pattern::O200k,
            "no slash in the tail",
            replace(Pattern::O200k, r"[\r\n/]*", r"[\r\n]*"),
        ),
        (Pattern::O200k, "letter alternatives swapped", {
            let rest = Pattern::O200k.regex()[o200k_letters_first.len() + 1..].to_string();
            let second = rest.split('|').next().expect("second").to_string();
            format!("{second}|{o200k_letters_first}{}", &rest[second.len()..])
        }),
        (
            Pattern::O200k,
            "unbounded digit runs",
            replace(Pattern::O200k, r"\p{N}{1,3}", r"\p{N}+"),
        ),
    ];
    for (pattern, what, near_miss) in near_misses {
        assert_ne!(near_miss, pattern.regex(), "{what}: the near miss differs");
        let (corpus, random) = near_miss_catches(pattern, &near_miss);
        assert!(
            corpus >= 3,
            "{pattern:?} {what}: only {corpus} corpus texts catch it"
        );
        assert!(
            random >= 10,
            "{pattern:?} {what}: only {random} random strings catch it"
        );
    }
}

/// Locks out panics and silent truncation on bad requests: a text over the
/// offset limit is an `Err` starting `Fix:` from every entry point and appends
/// nothing; an empty text has no pieces; `piece_starts` agrees with `split_into`.
#[test]
fn bad_requests_get_fix_errors() {
    // Zeroed pages are not touched until read: this costs no real memory.
    let too_long = vec![0u8; MAX_TEXT_BYTES + 1];
    for pattern in Pattern::ALL {
        let mut starts = vec![1, 2];
        let error = split_into(pattern, &too_long, &mut starts).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
        assert_eq!(starts, [1, 2], "{pattern:?}: nothing appended on an error");
        let error = per_position::piece_starts(pattern, &too_long).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
        assert_eq!(piece_starts(pattern, b"").unwrap(), Vec::<u32>::new());
        let splitter = Splitter::new(pattern).unwrap();
        assert_eq!(splitter.pattern(), pattern);
        assert_eq!(splitter.pieces(b"").next(), None);
        assert_eq!(splitter.str_pieces("").next(), None);
        let text = generate(Shape::Code, 3_000, 5);
        let mut starts = Vec::new();
        splitter.split_into(&text, &mut starts).unwrap();
        assert_eq!(piece_starts(pattern, &text).unwrap(), starts);
    }
}

/// Negative control for the per-position rule: each of its two look-ahead facts
/// is needed. With `break_ahead` always false (no `\s*[\r\n]+` beyond the
/// current character) or `upper_to_end` always false (an upper-case run never
/// gives back a caseless letter), the rule disagrees with the oracle on corpus
/// texts, so the comparisons above would catch a device that got either wrong.
#[test]
fn negative_control_per_position_rule_needs_both_facts() {
    let texts = split_corpus::corpus(oracle::corpus());
    for (pattern, fact) in [
        (Pattern::Cl100k, "break_ahead"),
        (Pattern::O200k, "break_ahead"),
        (Pattern::O200k, "upper_to_end"),
    ] {
        let oracle = Oracle::for_pattern(pattern);
        let caught = texts
            .iter()
            .filter(|text| {
                let windows = per_position::windows(text).expect("windows");
                let exact = per_position::starts_from_windows(pattern, windows.iter().copied());
                assert_eq!(exact, oracle.starts(text), "{pattern:?}: {}", shown(text));
                let wrong = windows.into_iter().map(|(offset, mut window)| {
                    match fact {
                        "break_ahead" => window.break_ahead = false,
                        _ => window.upper_to_end = false,
                    }
                    (offset, window)
                });
                per_position::starts_from_windows(pattern, wrong) != exact
            })
            .count();
        assert!(
            caught >= 10,
            "{pattern:?} without {fact}: only {caught} corpus texts catch it"
        );
    }
}

/// The cl100k rule exactly as the module docs of `pretokenize` state it in
/// words ("a piece starts at `c` iff ..."), over the kinds and `break_ahead` of
/// `per_position::windows`, with the two backward facts (digits before `c` in
/// its run, the nearest character before `p` that is not a line break) counted
/// here.
fn cl100k_rule_in_words(text: &[u8]) -> Vec<u32> {
    use vyre_tokenizer::pretokenize::unicode::{Kind, KindSet};
    let windows = per_position::windows(text).expect("windows");
    let kinds: Vec<Kind> = windows.iter().map(|(_, window)| window.here).collect();
    let punctuation = |kind: Kind| KindSet::OTHER.contains(kind);
    let white = |kind: Kind| KindSet::WHITE_SPACE.contains(kind);
    let line_break = |kind: Kind| kind == Kind::LineBreak;
    let kind = |index: usize| kinds.get(index).copied().unwrap_or(Kind::End);
    // Contractions: where they start, which characters they cover, where they end.
    let mut inside = vec![false; kinds.len()];
    let mut ends_before = vec![false; kinds.len() + 1];
    for start in 0..kinds.len() {
        let opens = kind(start) == Kind::Apostrophe
            && (start == 0 || !(punctuation(kind(start - 1)) || kind(start - 1) == Kind::Space));
        let letters = if KindSet::CONTRACTION_STMD.contains(kind(start + 1)) {
            1
        } else if (KindSet::CONTRACTION_RV.contains(kind(start + 1))
            && KindSet::CONTRACTION_E.contains(kind(start + 2)))
            || (KindSet::CONTRACTION_L.contains(kind(start + 1))
                && KindSet::CONTRACTION_L.contains(kind(start + 2)))
        {
            2
        } else {
            0
        };
        if opens && letters > 0 {
            inside[start + 1..=start + letters].fill(true);
            ends_before[start + 1 + letters] = true;
        }
    }
    let mut starts = Vec::new();
    let mut digits_before = 0;
    for (index, (offset, window)) in windows.iter().enumerate() {
        let (c, x) = (window.here, window.after);
        let starts_here = if index == 0 {
            true
        } else if inside[index] {
            false
        } else {
            let p = kind(index - 1);
            let nearest_before_p_not_break =
                (0..index - 1).rev().map(kind).find(|&k| !line_break(k));
            (c == Kind::Number && (p != Kind::Number || digits_before % 3 == 0))
                || (p == Kind::Number && c != Kind::Number)
                || ends_before[index]
                || (KindSet::LETTER.contains(c)
                    && (line_break(p)
                        || (punctuation(p)
                            && index >= 2
                            && (punctuation(kind(index - 2)) || kind(index - 2) == Kind::Space))))
                || (punctuation(c) && !punctuation(p) && p != Kind::Space)
                || (white(c) && !white(p) && !(line_break(c) && punctuation(p)))
                || (white(c)
                    && white(p)
                    && !line_break(c)
                    && ((x != Kind::End && !white(x))
                        || (line_break(p) && nearest_before_p_not_break.is_some_and(punctuation))
                        || (line_break(p) && !window.break_ahead)))
        };
        if starts_here {
            starts.push(*offset);
        }
        digits_before = if c == Kind::Number {
            digits_before + 1
        } else {
            0
        };
    }
    starts
}

/// Locks out a wrong statement of the cl100k rule in words (the one a kernel
/// author reads in the `pretokenize` module docs): evaluated literally, it
/// gives the oracle's piece starts on the corpus, the shapes and 5,000 random
/// strings.
#[test]
fn cl100k_rule_in_words_equals_oracle() {
    let oracle = Oracle::for_pattern(Pattern::Cl100k);
    let mut texts = split_corpus::corpus(oracle::corpus());
    for shape in Shape::ALL {
        texts.push(generate(shape, 5_000, 3));
    }
    let mut random = SplitMix64::new(0x0070_0C0D);
    texts.extend((0..5_000).map(|_| split_corpus::random_bytes(&mut random, 16)));
    for text in texts {
        assert_eq!(
            cl100k_rule_in_words(&text),
            oracle.starts(&text),
            "{}",
            shown(&text)
        );
    }
}

/// Locks out a splitter that a `Send + Sync` tokenizer cannot hold, or that
/// must be rebuilt per thread: `Splitter`, its pattern and its piece iterators
/// are plain values (a compile-time check).
#[test]
fn splitter_is_copy_send_and_sync() {
    fn plain<T: Copy + Send + Sync + 'static>() {}
    fn shareable<T: Send + Sync>() {}
    plain::<Splitter>();
    plain::<Pattern>();
    shareable::<vyre_tokenizer::pretokenize::pattern::Pieces<'static>>();
    shareable::<vyre_tokenizer::pretokenize::pattern::StrPieces<'static>>();
}
