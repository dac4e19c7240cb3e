//! The `.tiktoken` reader on bad input: every malformed file is an `Err` whose
//! message starts `Fix:` and names the line, nothing panics, and the legal
//! oddities (gaps in the ranks, a CRLF file) load.

#[path = "support/tiktoken_text.rs"]
mod tiktoken_text;

use tiktoken_text::{base64, vocabulary_text};
use vyre_tokenizer::{Encoding, ErrorKind, Pattern, Tokenizer, Vocabulary};

fn expect_error(text: &str, line: usize, says: &str) {
    let error = Vocabulary::from_tiktoken_bytes(text.as_bytes()).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Vocabulary, "{error}");
    let message = error.message();
    assert!(message.starts_with("Fix:"), "{message}");
    assert!(
        message.contains(&format!("line {line}")),
        "expected line {line}: {message}"
    );
    assert!(message.contains(says), "expected {says:?}: {message}");
}

/// Locks out malformed vocabularies loading (or panicking): each defect is an
/// `Err` starting `Fix:` that names its line; (negative control) the same file
/// without the defect loads.
#[test]
fn malformed_vocabularies_are_errors_naming_the_line() {
    let good = vocabulary_text(&format!("{} 256\n", base64(b"ab")));
    let vocabulary = Vocabulary::from_tiktoken_bytes(good.as_bytes()).unwrap();
    assert_eq!((vocabulary.len(), vocabulary.rank(b"ab")), (257, Some(256)));
    // Line 257 is the extra line.
    expect_error(&vocabulary_text("YWI= 256"), 257, "cut off");
    expect_error(&good[..good.len() - 3], 257, "cut off");
    expect_error(&vocabulary_text("\n"), 257, "empty");
    expect_error(&vocabulary_text("YWI=256\n"), 257, "no space");
    expect_error(&vocabulary_text("YW!= 256\n"), 257, "not valid base64");
    expect_error(&vocabulary_text("YWI 256\n"), 257, "not valid base64");
    expect_error(&vocabulary_text("YWJ= 256\n"), 257, "not valid base64");
    expect_error(&vocabulary_text(" 256\n"), 257, "empty");
    expect_error(&vocabulary_text("YWI= \n"), 257, "rank");
    expect_error(&vocabulary_text("YWI= -1\n"), 257, "not a decimal");
    expect_error(&vocabulary_text("YWI= 2 5\n"), 257, "not a decimal");
    expect_error(
        &vocabulary_text("YWI= 4294967296\n"),
        257,
        "does not fit a u32",
    );
    expect_error(
        &vocabulary_text("YWI= 99999999999999999999999\n"),
        257,
        "does not fit a u32",
    );
    expect_error(
        &vocabulary_text("YWI= 4294967295\n"),
        257,
        "does not fit a u32",
    );
    expect_error(
        &vocabulary_text("YWI= 7\n"),
        257,
        "repeats rank 7 of line 8",
    );
    expect_error(
        &vocabulary_text("YWI= 256\nYWI= 257\n"),
        258,
        "repeats the token of line 257",
    );
    expect_error(
        &vocabulary_text("YQ== 256\n"),
        98,
        "repeats the token of line 98",
    );
    expect_error(
        &vocabulary_text("YWI= 2000000\n"),
        257,
        "number the tokens densely",
    );
}

/// Locks out refusing what correct files contain: gaps in the ranks (p50k_base
/// has one), CRLF line ends, ranks in any order; and a missing single byte is
/// refused (byte-level BPE starts from the bytes).
#[test]
fn gaps_crlf_and_order_are_legal_missing_bytes_are_not() {
    let gapped = vocabulary_text(&format!("{} 300\n{} 258\n", base64(b"ab"), base64(b"abc")));
    let vocabulary = Vocabulary::from_tiktoken_bytes(gapped.as_bytes()).unwrap();
    assert_eq!(vocabulary.rank_bound(), 301);
    assert_eq!(vocabulary.token(299), None);
    assert_eq!(vocabulary.token(258), Some(&b"abc"[..]));
    let crlf = gapped.replace('\n', "\r\n");
    assert_eq!(
        Vocabulary::from_tiktoken_bytes(crlf.as_bytes())
            .unwrap()
            .len(),
        258
    );
    let without_byte: String = vocabulary_text("")
        .lines()
        .filter(|line| !line.ends_with(" 65"))
        .map(|line| format!("{line}\n"))
        .collect();
    let error = Vocabulary::from_tiktoken_bytes(without_byte.as_bytes()).unwrap_err();
    assert!(
        error.message().starts_with("Fix:") && error.message().contains("0x41"),
        "{error}"
    );
    let error = Vocabulary::from_tiktoken_bytes(b"").unwrap_err();
    assert!(
        error.message().starts_with("Fix:") && error.message().contains("empty"),
        "{error}"
    );
}

/// Locks out a panic anywhere in the reader: 3,000 damaged copies of a small
/// vocabulary (bytes overwritten, removed, inserted, the file cut anywhere)
/// each load or fail with a `Fix:` error.
#[test]
fn damaged_vocabularies_never_panic() {
    let good =
        vocabulary_text(&format!("{} 256\n{} 257\n", base64(b"ab"), base64(b"abc"))).into_bytes();
    let mut random = vyre_tokenizer::pretokenize::text::SplitMix64::new(0x0007_0CAB);
    let mut failed = 0;
    for _ in 0..3_000 {
        let mut bytes = good.clone();
        for _ in 0..1 + random.below(3) {
            let at = random.below(bytes.len() as u32) as usize;
            match random.below(4) {
                0 => bytes[at] = random.below(256) as u8,
                1 => {
                    bytes.remove(at);
                }
                2 => bytes.insert(at, *random.pick(b" \n=0A9+/\r\xFF")),
                _ => bytes.truncate(at),
            }
        }
        match Vocabulary::from_tiktoken_bytes(&bytes) {
            Ok(vocabulary) => assert!(vocabulary.len() >= 256),
            Err(error) => {
                failed += 1;
                assert!(error.message().starts_with("Fix:"), "{error}");
            }
        }
    }
    assert!(failed > 1_000, "only {failed} damaged files were refused");
}

/// Locks out a file path that fails without saying which file, and a
/// constructor that skips the vocabulary checks: a missing file is an `Err`
/// naming the path with the I/O error as its source; a real file loads into a
/// tokenizer that encodes like the built-in one; an error inside it names the
/// line and the file.
#[test]
fn tiktoken_files_load_from_paths() {
    let directory = tempfile::tempdir().unwrap();
    let missing = directory.path().join("missing.tiktoken");
    let error = Vocabulary::from_tiktoken_file(&missing).unwrap_err();
    assert!(
        error.message().starts_with("Fix:") && error.message().contains("missing.tiktoken"),
        "{error}"
    );
    assert!(std::error::Error::source(&error).is_some());
    let path = directory.path().join("r50k_base.tiktoken");
    std::fs::write(&path, Encoding::R50kBase.tiktoken_bytes()).unwrap();
    let tokenizer =
        Tokenizer::from_tiktoken_file(&path, Pattern::Gpt2, &[("<|endoftext|>", 50256)]).unwrap();
    let built_in = Tokenizer::r50k_base().unwrap();
    let text = "Hello <|endoftext|> world, it's 2024!";
    assert_eq!(
        tokenizer.encode_ordinary(text),
        built_in.encode_ordinary(text)
    );
    assert_eq!(
        tokenizer.encode(text, &["<|endoftext|>"]).unwrap(),
        built_in.encode(text, &["<|endoftext|>"]).unwrap()
    );
    let bad = directory.path().join("bad.tiktoken");
    std::fs::write(&bad, vocabulary_text("YWI 256\n")).unwrap();
    let error = Tokenizer::from_tiktoken_file(&bad, Pattern::Gpt2, &[]).unwrap_err();
    assert!(
        error.message().contains("line 257") && error.message().contains("bad.tiktoken"),
        "{error}"
    );
}

/// Locks out unusable special tokens: an id that is an ordinary rank, a repeated
/// text or id and an empty text are each an `Err` starting `Fix:`; (negative
/// control) distinct ones outside the ranks are accepted.
#[test]
fn special_tokens_are_checked_against_the_vocabulary() {
    let vocabulary = Vocabulary::from_tiktoken_bytes(vocabulary_text("").as_bytes()).unwrap();
    let build =
        |special: &[(&str, u32)]| Tokenizer::new(vocabulary.clone(), Pattern::Gpt2, special);
    for bad in [
        &[("<|x|>", 65)][..],
        &[("<|x|>", 300), ("<|x|>", 301)],
        &[("<|x|>", 300), ("<|y|>", 300)],
        &[("", 300)],
        &[("<|x|>", u32::MAX)],
    ] {
        let error = build(bad).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::SpecialTokens);
        assert!(error.message().starts_with("Fix:"), "{error}");
    }
    let tokenizer = build(&[("<|x|>", 300), ("<|y|>", 256)]).unwrap();
    assert_eq!(tokenizer.encode("a<|y|>", &["<|y|>"]).unwrap(), [97, 256]);
    assert_eq!(tokenizer.decode(&[300, 97]).unwrap(), "<|x|>a");
}
