//! The CPU encoder against its two oracles: `tiktoken-rs` (tiktoken's core,
//! ported; all four encodings) and `bpe-openai` (an independent implementation;
//! cl100k and o200k). Ids must be identical on the pre-tokenizers' corpus
//! (`oracle::corpus` extended by `split_corpus`: contractions in every case,
//! digit runs in several scripts, `\r\n` mixtures, `x/y/z`, marks, titlecase,
//! emoji ZWJ sequences), the three generated shapes, 10,000 seeded random strings
//! per encoding and 100 KiB runs; plus round trips, special tokens, batches, the
//! invalid-UTF-8 rule and inputs that must not panic.

mod oracle;
mod split_corpus;

use oracle::{corpus, random_bytes, random_string};
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::{Backend, Encoding, ErrorKind, Tokenizer, Vocabulary};

/// The tokenizer under test and its oracles for one encoding.
struct Oracles {
    ours: Tokenizer,
    tiktoken: &'static tiktoken_rs::CoreBPE,
    bpe: Option<&'static bpe_openai::Tokenizer>,
}

impl Oracles {
    fn new(encoding: Encoding) -> Oracles {
        let ours = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        let (tiktoken, bpe) = match encoding {
            Encoding::R50kBase => (tiktoken_rs::r50k_base_singleton(), None),
            Encoding::P50kBase => (tiktoken_rs::p50k_base_singleton(), None),
            Encoding::Cl100kBase => (
                tiktoken_rs::cl100k_base_singleton(),
                Some(bpe_openai::cl100k_base()),
            ),
            Encoding::O200kBase => (
                tiktoken_rs::o200k_base_singleton(),
                Some(bpe_openai::o200k_base()),
            ),
            other => panic!("no oracle for {other:?}"),
        };
        Oracles {
            ours,
            tiktoken,
            bpe,
        }
    }

    /// Our ids of `text`, asserted equal to both oracles'.
    fn check(&self, text: &str, what: &str) -> Vec<u32> {
        let ids = self.ours.encode_ordinary(text);
        let expected = self.tiktoken.encode_ordinary(text);
        assert_eq!(
            ids,
            expected,
            "{} vs tiktoken-rs, {what}: {text:?}",
            self.ours.name()
        );
        if let Some(bpe) = self.bpe {
            assert_eq!(
                ids,
                bpe.encode(text),
                "{} vs bpe-openai, {what}: {text:?}",
                self.ours.name()
            );
        }
        ids
    }
}

/// Every valid text of the pre-tokenizers' corpus (tiktoken takes `&str`).
fn all_corpus_texts() -> Vec<String> {
    split_corpus::corpus(corpus())
        .into_iter()
        .filter_map(|text| String::from_utf8(text).ok())
        .collect()
}

fn corpus_and_shapes(encoding: Encoding) {
    let oracles = Oracles::new(encoding);
    for text in all_corpus_texts() {
        oracles.check(&text, "corpus");
    }
    for shape in Shape::ALL {
        let text = String::from_utf8(generate(shape, 20_000, 3)).expect("shapes are UTF-8");
        oracles.check(&text, shape.name());
    }
}

/// Locks out any id that differs from tiktoken-rs on r50k_base over the corpus
/// (contractions, white space, scripts, marks, emoji, digit runs, line breaks)
/// and the three generated shapes.
#[test]
fn r50k_ids_equal_tiktoken_on_corpus_and_shapes() {
    corpus_and_shapes(Encoding::R50kBase);
}

/// The same for p50k_base (the vocabulary with a gap at 50256).
#[test]
fn p50k_ids_equal_tiktoken_on_corpus_and_shapes() {
    corpus_and_shapes(Encoding::P50kBase);
}

/// The same for cl100k_base, against tiktoken-rs and bpe-openai.
#[test]
fn cl100k_ids_equal_both_oracles_on_corpus_and_shapes() {
    corpus_and_shapes(Encoding::Cl100kBase);
}

/// The same for o200k_base, against tiktoken-rs and bpe-openai.
#[test]
fn o200k_ids_equal_both_oracles_on_corpus_and_shapes() {
    corpus_and_shapes(Encoding::O200kBase);
}

fn random_strings(encoding: Encoding, seed: u64) {
    let oracles = Oracles::new(encoding);
    let mut random = SplitMix64::new(seed);
    for case in 0..10_000 {
        let text = if case % 2 == 0 {
            random_string(&mut random, 24)
        } else {
            split_corpus::random_string(&mut random, 16)
        };
        oracles.check(&text, &format!("random case {case}"));
    }
}

/// Locks out disagreements on inputs nobody wrote by hand: 10,000 seeded random
/// strings on r50k_base (half from the GPT-2 split's generator, half from the
/// newer patterns': every kind of character and every boundary between them).
#[test]
fn r50k_ids_equal_tiktoken_on_10000_random_strings() {
    random_strings(Encoding::R50kBase, 0x7E57_0050);
}

/// The same on p50k_base.
#[test]
fn p50k_ids_equal_tiktoken_on_10000_random_strings() {
    random_strings(Encoding::P50kBase, 0x7E57_0051);
}

/// The same on cl100k_base, against both oracles.
#[test]
fn cl100k_ids_equal_both_oracles_on_10000_random_strings() {
    random_strings(Encoding::Cl100kBase, 0x7E57_0100);
}

/// The same on o200k_base, against both oracles.
#[test]
fn o200k_ids_equal_both_oracles_on_10000_random_strings() {
    random_strings(Encoding::O200kBase, 0x7E57_0200);
}

/// Runs of one character: `bytes` of each of a letter, spaces, digits and
/// apostrophes, plus a letter run broken by a newline (GPT-2's encodings; the
/// others take `split_corpus::long_runs`, which holds these and more).
fn runs(bytes: usize) -> Vec<(String, String)> {
    ["a", " ", "7", "'"]
        .iter()
        .map(|unit| (format!("{bytes} × {unit:?}"), unit.repeat(bytes)))
        .chain([(
            format!("{bytes} letters, a newline, letters"),
            "x".repeat(bytes / 2) + "\n" + &"y".repeat(bytes / 2),
        )])
        .collect()
}

/// Locks out a merge loop that goes wrong on long pieces (the bucket path):
/// `split_corpus::long_runs` (100 KiB of a letter of each case, an ideograph,
/// spaces, tabs, digits of two scripts, apostrophes, `\r\n`, newlines, marks,
/// short-piece pairs) against bpe-openai (linear in a piece's length;
/// tiktoken's own loop is quadratic there).
fn long_runs_against_bpe_openai(encoding: Encoding) {
    let ours = Tokenizer::for_encoding(encoding).expect("built-in encoding");
    let bpe = match encoding {
        Encoding::Cl100kBase => bpe_openai::cl100k_base(),
        _ => bpe_openai::o200k_base(),
    };
    // The peers take `&str`: the runs of invalid bytes are for the splits alone.
    let runs = split_corpus::long_runs()
        .into_iter()
        .filter_map(|(what, bytes)| Some((what, String::from_utf8(bytes).ok()?)));
    for (what, text) in runs {
        assert_eq!(
            ours.encode_ordinary(&text),
            bpe.encode(&text),
            "{} {what}",
            ours.name()
        );
    }
}

/// Locks out wrong merges of 100 KiB pieces on cl100k_base.
#[test]
fn cl100k_long_runs_equal_bpe_openai() {
    long_runs_against_bpe_openai(Encoding::Cl100kBase);
}

/// Locks out wrong merges of 100 KiB pieces on o200k_base.
#[test]
fn o200k_long_runs_equal_bpe_openai() {
    long_runs_against_bpe_openai(Encoding::O200kBase);
}

/// Locks out wrong merges of long pieces on GPT-2's encodings, which bpe-openai
/// lacks: 6 KiB runs (long enough for the bucket path, short enough for
/// tiktoken's quadratic loop) against tiktoken-rs.
#[test]
fn gpt2_encodings_long_runs_equal_tiktoken() {
    for encoding in [Encoding::R50kBase, Encoding::P50kBase] {
        let oracles = Oracles::new(encoding);
        for (what, text) in runs(6 << 10) {
            oracles.check(&text, &what);
        }
    }
}

/// tiktoken's rule written as plainly as possible (our own): repeatedly merge
/// the adjacent pair of lowest rank, the leftmost (or, for the negative
/// control, the rightmost) of equal ranks.
fn reference_merge(vocabulary: &Vocabulary, piece: &[u8], leftmost: bool) -> Vec<u32> {
    let mut parts: Vec<&[u8]> = piece.chunks(1).collect();
    loop {
        let mut best: Option<(u32, usize)> = None;
        for index in 0..parts.len().saturating_sub(1) {
            let joined = [parts[index], parts[index + 1]].concat();
            if let Some(rank) = vocabulary.rank(&joined) {
                let better = match best {
                    None => true,
                    Some((best_rank, _)) => rank < best_rank || (rank == best_rank && !leftmost),
                };
                if better {
                    best = Some((rank, index));
                }
            }
        }
        let Some((_, index)) = best else { break };
        let end =
            parts[index + 1].as_ptr() as usize + parts[index + 1].len() - piece.as_ptr() as usize;
        let start = parts[index].as_ptr() as usize - piece.as_ptr() as usize;
        parts[index] = &piece[start..end];
        parts.remove(index + 1);
    }
    parts
        .iter()
        .map(|part| vocabulary.rank(part).expect("every part is a token"))
        .collect()
}

/// Locks out a merge order other than tiktoken's inside pieces of every length
/// class (whole tokens, the stack scan up to 64 bytes, the bucket path above):
/// on 3,000 random pieces built from short tokens, ids equal the plain
/// reference rule; (negative control) the rule with rightmost ties differs from
/// it on some of them, so the pieces do exercise ties.
#[test]
fn merges_equal_the_plain_rule_on_random_pieces() {
    let tokenizer = Tokenizer::r50k_base().unwrap();
    let vocabulary = tokenizer.vocabulary();
    // Pieces of letters only, so GPT-2's split keeps each one whole.
    let alphabet = b"aabbeeiilnnorssttz";
    let mut random = SplitMix64::new(0xB0CE);
    let mut rightmost_differs = 0;
    for case in 0..3_000 {
        let len = 2 + random.below(if case % 10 == 0 { 300 } else { 80 }) as usize;
        let piece: Vec<u8> = (0..len).map(|_| *random.pick(alphabet)).collect();
        let expected = reference_merge(vocabulary, &piece, true);
        let text = std::str::from_utf8(&piece).unwrap();
        assert_eq!(
            tokenizer.encode_ordinary(text),
            expected,
            "case {case}: {text:?}"
        );
        rightmost_differs += usize::from(reference_merge(vocabulary, &piece, false) != expected);
    }
    assert!(rightmost_differs > 0, "no piece had a tie that mattered");
}

/// Locks out ids that lose or change text: decode(encode(x)) == x on the corpus
/// and 2,000 random strings for every encoding, and
/// decode_bytes(encode_ordinary_bytes(x)) == x on 2,000 damaged byte strings.
#[test]
fn decode_inverts_encode() {
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for text in all_corpus_texts() {
            let ids = tokenizer.encode_ordinary(&text);
            assert_eq!(tokenizer.decode(&ids).unwrap(), text);
        }
        let mut random = SplitMix64::new(0xDEC0DE);
        for _ in 0..2_000 {
            let text = split_corpus::random_string(&mut random, 12);
            assert_eq!(
                tokenizer.decode(&tokenizer.encode_ordinary(&text)).unwrap(),
                text
            );
            let bytes = random_bytes(&mut random, 12);
            let ids = tokenizer.encode_ordinary_bytes(&bytes);
            assert_eq!(tokenizer.decode_bytes(&ids).unwrap(), bytes);
        }
    }
}

/// Locks out a bytes entry point that departs from the documented rule: on
/// 3,000 damaged byte strings the ids are the plain merge rule applied to each
/// piece of the split under the invalid-UTF-8 rule (the oracle's split of the
/// text with each invalid byte replaced by U+FFFD, at the original offsets),
/// and on valid UTF-8 they are `encode_ordinary`'s.
#[test]
fn bytes_entry_point_follows_the_invalid_utf8_rule() {
    let tokenizer = Tokenizer::r50k_base().unwrap();
    let split = oracle::Oracle::new();
    let mut random = SplitMix64::new(0x0BAD_B17E);
    let mut invalid = 0;
    for case in 0..3_000 {
        let bytes = random_bytes(&mut random, 16);
        let starts = split.starts(&bytes);
        let mut expected = Vec::new();
        for (index, &start) in starts.iter().enumerate() {
            let end = starts
                .get(index + 1)
                .map_or(bytes.len(), |&end| end as usize);
            expected.extend(reference_merge(
                tokenizer.vocabulary(),
                &bytes[start as usize..end],
                true,
            ));
        }
        assert_eq!(
            tokenizer.encode_ordinary_bytes(&bytes),
            expected,
            "case {case}: {bytes:?}"
        );
        match std::str::from_utf8(&bytes) {
            Ok(text) => assert_eq!(tokenizer.encode_ordinary(text), expected),
            Err(_) => invalid += 1,
        }
    }
    assert!(invalid > 300, "only {invalid} strings were invalid UTF-8");
}

/// Locks out special-token ids other than tiktoken's: every special token of
/// every encoding, alone and between text, allowed, equals tiktoken-rs's
/// `encode_with_special_tokens`; ordinary encoding keeps it as text.
#[test]
fn special_tokens_equal_tiktoken() {
    for encoding in Encoding::ALL {
        let ours = Tokenizer::for_encoding(encoding);
        let tiktoken = Oracles::tiktoken_only(encoding);
        let names: Vec<&str> = encoding
            .special_tokens()
            .iter()
            .map(|&(text, _)| text)
            .collect();
        let tiktoken_names = tiktoken.special_tokens();
        for &(text, id) in encoding.special_tokens() {
            assert!(
                tiktoken_names.contains(text),
                "{} lacks {text}",
                encoding.name()
            );
            assert_eq!(tiktoken.encode_with_special_tokens(text), [id], "{text}");
            let Ok(ours) = &ours else { continue };
            for sample in [text.to_owned(), format!("Hello{text} world{text}{text}!")] {
                let expected = tiktoken.encode_with_special_tokens(&sample);
                assert_eq!(ours.encode(&sample, &names).unwrap(), expected, "{sample}");
                assert_eq!(
                    ours.encode_with_special_tokens(&sample),
                    expected,
                    "{sample}"
                );
                assert_eq!(ours.encode(&sample, &[text]).unwrap(), expected, "{sample}");
                assert_eq!(ours.decode(&expected).unwrap(), sample);
            }
        }
        if let Ok(ours) = &ours {
            assert_eq!(ours.special_tokens().len(), tiktoken_names.len());
        }
    }
}

impl Oracles {
    fn tiktoken_only(encoding: Encoding) -> &'static tiktoken_rs::CoreBPE {
        match encoding {
            Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
            Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            _ => tiktoken_rs::o200k_base_singleton(),
        }
    }
}

/// Locks out a special token slipping through: a disallowed one anywhere in the
/// text is an `Err` that starts `Fix:` and names it, as Python tiktoken's
/// default does; allowing it encodes its id; `encode_ordinary` encodes its text
/// as tiktoken does; a name that is no special token is refused.
#[test]
fn disallowed_special_tokens_are_errors_naming_them() {
    let tokenizer = Tokenizer::r50k_base().unwrap();
    let text = "Say <|endoftext|> now";
    let error = tokenizer.encode(text, &[]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::DisallowedSpecialToken);
    assert!(error.message().starts_with("Fix:"), "{error}");
    assert!(
        error.message().contains("<|endoftext|>") && error.message().contains("byte 4"),
        "{error}"
    );
    assert!(tokenizer
        .encode(text, &["<|endoftext|>"])
        .unwrap()
        .contains(&50256));
    assert_eq!(
        tokenizer.encode_ordinary(text),
        tiktoken_rs::r50k_base_singleton().encode_ordinary(text)
    );
    assert!(!tokenizer.encode_ordinary(text).contains(&50256));
    let error = tokenizer.encode("x", &["<|fim_prefix|>"]).unwrap_err();
    assert!(
        error.message().starts_with("Fix:") && error.message().contains("<|fim_prefix|>"),
        "{error}"
    );
    // Negative control: a text without special tokens encodes under any setting.
    assert_eq!(
        tokenizer.encode("Say now", &[]).unwrap(),
        tokenizer.encode_ordinary("Say now")
    );
}

/// Locks out a batch that reorders, drops or changes texts: `encode_batch` of
/// 200 texts (empty ones included, over 64 KiB in all so it runs on every
/// thread) equals the per-text encodes in order; tiny batches too.
#[test]
fn encode_batch_equals_per_text_encodes() {
    let tokenizer = Tokenizer::p50k_base().unwrap();
    let mut random = SplitMix64::new(0xBA7C4);
    let texts: Vec<String> = (0..200)
        .map(|index| match index % 7 {
            0 => String::new(),
            1 => String::from_utf8(generate(
                Shape::Code,
                1 + random.below(6000) as usize,
                index,
            ))
            .unwrap(),
            _ => split_corpus::random_string(&mut random, 40),
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert!(
        refs.iter().map(|text| text.len()).sum::<usize>()
            >= vyre_tokenizer::BATCH_PARALLEL_MIN_BYTES
    );
    let batch = tokenizer.encode_batch(&refs);
    assert_eq!(batch.len(), texts.len());
    for (index, text) in texts.iter().enumerate() {
        assert_eq!(
            batch[index],
            tokenizer.encode_ordinary(text),
            "text {index}"
        );
    }
    assert_eq!(tokenizer.encode_batch(&[]), Vec::<Vec<u32>>::new());
    assert_eq!(tokenizer.encode_batch(&["", "a"]), [vec![], vec![64]]);
}

/// Locks out panics and lost text on huge inputs of one character: 16 MiB of a
/// letter (one piece, merged into tokens of several letters) and of spaces (one
/// piece too; p50k has tokens for runs of spaces) encode and decode back to the
/// same text.
#[test]
fn sixteen_mib_of_one_character_round_trips() {
    let tokenizer = Tokenizer::p50k_base().unwrap();
    for unit in ["a", " "] {
        let text = unit.repeat(16 << 20);
        let ids = tokenizer.encode_ordinary(&text);
        assert!(
            !ids.is_empty() && ids.len() < text.len() / 2,
            "{unit:?}: {} ids",
            ids.len()
        );
        assert!(
            tokenizer.decode(&ids).unwrap() == text,
            "{unit:?} did not round trip"
        );
    }
}

/// Locks out bad decode input turning into a panic or wrong text: an unknown id
/// (past the ranks and the special tokens) is an `Err` naming the id and position;
/// ids that cut a character are an `Err` from `decode` and bytes from
/// `decode_bytes`; the empty list is the empty text.
#[test]
fn decode_refuses_unknown_ids_and_cut_characters() {
    let tokenizer = Tokenizer::r50k_base().unwrap();
    for bad in [50257u32, 1 << 31, u32::MAX] {
        let error = tokenizer.decode(&[15496, bad]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownToken);
        assert!(
            error.message().starts_with("Fix:")
                && error.message().contains(&format!("id {bad} at position 1")),
            "{error}"
        );
        assert!(tokenizer.decode_bytes(&[bad]).is_err());
    }
    let ids = tokenizer.encode_ordinary("😀");
    assert!(ids.len() > 1, "😀 is more than one token in r50k");
    let error = tokenizer.decode(&ids[..1]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidUtf8);
    assert!(error.message().starts_with("Fix:") && std::error::Error::source(&error).is_some());
    let first = tokenizer.decode_bytes(&ids[..1]).unwrap();
    assert!(!first.is_empty() && "😀".as_bytes().starts_with(&first));
    assert_eq!(tokenizer.decode(&[]).unwrap(), "");
    assert_eq!(tokenizer.encode_ordinary(""), Vec::<u32>::new());
    assert_eq!(tokenizer.encode("", &[]).unwrap(), Vec::<u32>::new());
}

/// Locks out a tokenizer that cannot be shared between threads.
#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<Vocabulary>();
    assert_send_sync::<vyre_tokenizer::TokenizerError>();
}

/// Locks out a GPU backend that pretends to run where it cannot: for every
/// encoding, `Backend::Gpu` either finds a CUDA device (and then runs texts of
/// every length there) or is an `Err` starting `Fix:` that names CUDA and keeps
/// the device's error as its source, and `Backend::Auto` then runs on the CPU;
/// (negative control) the default backend is the CPU whatever the length.
#[test]
fn gpu_backend_is_refused_where_it_cannot_run() {
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        assert_eq!(
            tokenizer.runs_on(1 << 20),
            Backend::Cpu,
            "the default backend is the CPU"
        );
        match tokenizer.clone().with_backend(Backend::Gpu) {
            Ok(gpu) => {
                assert_eq!(gpu.runs_on(10), Backend::Gpu);
                assert!(gpu.device_name().is_some());
            }
            Err(error) => {
                assert_eq!(error.kind(), ErrorKind::Backend);
                assert!(
                    error.message().starts_with("Fix:") && error.message().contains("CUDA"),
                    "{error}"
                );
                assert!(std::error::Error::source(&error).is_some());
                let auto = tokenizer.with_backend(Backend::Auto).unwrap();
                assert_eq!(auto.runs_on(1 << 20), Backend::Cpu);
                assert_eq!(auto.device_name(), None);
            }
        }
    }
}

/// Locks out a wrong vendored vocabulary: every rank of all four embedded
/// vocabularies decodes to tiktoken-rs's bytes for that rank, and no other id
/// below the bound decodes (p50k's gap at 50256 included).
#[test]
fn embedded_vocabularies_equal_tiktoken_rs() {
    for encoding in Encoding::ALL {
        let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
        let tiktoken = Oracles::tiktoken_only(encoding);
        let mut seen = 0;
        for rank in 0..vocabulary.rank_bound() {
            match vocabulary.token(rank) {
                Some(bytes) => {
                    seen += 1;
                    assert_eq!(
                        tiktoken.decode_bytes(&[rank]).unwrap(),
                        bytes,
                        "{} rank {rank}",
                        encoding.name()
                    );
                }
                None => assert!(
                    encoding.special_tokens().iter().any(|&(_, id)| id == rank),
                    "{} has a gap at {rank} that is no special token",
                    encoding.name()
                ),
            }
        }
        assert_eq!(seen, vocabulary.len());
    }
    let p50k = Vocabulary::from_tiktoken_bytes(Encoding::P50kBase.tiktoken_bytes()).unwrap();
    assert_eq!(
        (p50k.len(), p50k.rank_bound(), p50k.token(50256)),
        (50280, 50281, None)
    );
}

/// Locks out a greedy encoder passing for BPE: the corpus holds texts where
/// taking the longest token from the left gives other ids than tiktoken's, so
/// the oracle tests above would catch that defect.
#[test]
fn greedy_longest_match_differs_from_tiktoken_on_the_corpus() {
    let tokenizer = Tokenizer::r50k_base().unwrap();
    let vocabulary = tokenizer.vocabulary();
    let greedy = |piece: &[u8]| {
        let mut ids = Vec::new();
        let mut at = 0;
        while at < piece.len() {
            let len = (1..=(piece.len() - at).min(vocabulary.max_token_len()))
                .rev()
                .find(|&len| vocabulary.rank(&piece[at..at + len]).is_some())
                .unwrap_or(1);
            ids.push(vocabulary.rank(&piece[at..at + len]).unwrap());
            at += len;
        }
        ids
    };
    let split = oracle::Oracle::new();
    let differing = all_corpus_texts()
        .iter()
        .filter(|text| {
            let starts = split.starts_of_str(text);
            let mut ids = Vec::new();
            for (index, &start) in starts.iter().enumerate() {
                let end = starts
                    .get(index + 1)
                    .map_or(text.len(), |&end| end as usize);
                ids.extend(greedy(&text.as_bytes()[start as usize..end]));
            }
            ids != tiktoken_rs::r50k_base_singleton().encode_ordinary(text)
        })
        .count();
    assert!(differing > 0);
}

/// Locks out a README example that drifts from the API: the README's tokenizer
/// example (`rust,ignore` there: the root crate's doctests cannot see this
/// crate) is, line for line, the crate docs' example that runs as a doctest.
#[test]
fn readme_example_is_the_crate_doc_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).unwrap();
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let start = readme
        .find("```rust,ignore\nuse vyre_tokenizer")
        .expect("README example")
        + 15;
    let readme_block = &readme[start..start + readme[start..].find("```").unwrap()];
    let doc_block: String = lib
        .lines()
        .skip_while(|line| *line != "//! ```")
        .skip(1)
        .take_while(|line| !line.starts_with("//! #") && *line != "//! ```")
        .map(|line| {
            format!(
                "{}\n",
                line.strip_prefix("//! ")
                    .unwrap_or(line.trim_start_matches("//!"))
            )
        })
        .collect();
    assert!(
        doc_block.contains("Tokenizer::"),
        "no crate doc example found"
    );
    assert_eq!(readme_block, doc_block);
}
