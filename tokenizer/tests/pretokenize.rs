//! CPU tests of the GPT-2 pre-tokenizer: the plain CPU splitter and the
//! three IR programs (run on the reference interpreter) must give exactly the
//! external oracle's piece starts (`fancy-regex` running the pattern) on valid
//! UTF-8, and follow the documented rule (invalid bytes are U+FFFD) on the rest.
//! Reference-interpreter inputs stay small (it is slow in debug builds); small
//! workgroups make short texts cross many workgroup boundaries and make the scan
//! loop over several counts per thread.

mod oracle;

use vyre_tokenizer::pretokenize;

use oracle::{corpus, random_bytes, random_string, utf8_boundary_texts, Oracle};
use pretokenize::pipeline::run_reference;
use pretokenize::programs::{build, programs, Programs, STEPS};
use pretokenize::text::{generate, Shape, SplitMix64};
use pretokenize::{check_text_len, cpu, Geometry, MAX_TEXT_BYTES};

/// 16-thread workgroups (the smallest the split accepts), 3 bytes per thread (a
/// 1 KiB text is 22 blocks of 48 bytes, the last one short) and at most 3
/// compaction workgroups (8, 8 and 6 blocks at 1 KiB: prefixes, several blocks
/// per workgroup and an uneven split).
fn small_programs() -> Programs {
    build(Geometry {
        workgroup_size: 16,
        bytes_per_thread: 3,
        compact_workgroups: 3,
    })
    .expect("valid geometry")
}

fn shown(text: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(text))
}

/// Locks out any disagreement between the CPU splitter and the oracle on the
/// hand-written corpus (contractions, white-space runs, scripts, marks, emoji,
/// invalid and cut UTF-8) and on the three generated shapes.
#[test]
fn cpu_splitter_equals_oracle_on_corpus_and_shapes() {
    let oracle = Oracle::new();
    let mut texts = corpus();
    for shape in Shape::ALL {
        texts.push(generate(shape, 20_000, 1));
    }
    for text in texts {
        assert_eq!(
            cpu::piece_starts(&text).unwrap(),
            oracle.starts(&text),
            "text {}",
            shown(&text)
        );
    }
}

/// Locks out disagreements on inputs nobody thought of: 12,000 seeded random
/// Unicode strings (weighted toward contractions, Unicode spaces, letters and
/// digits of many scripts, marks, emoji and symbols), valid UTF-8, and 4,000 damaged
/// ones (cut mid-character, bytes overwritten or inserted) under the invalid rule.
#[test]
fn cpu_splitter_equals_oracle_on_random_strings() {
    let oracle = Oracle::new();
    let mut random = SplitMix64::new(0x5EED_0009);
    for case in 0..12_000 {
        let text = random_string(&mut random, 24);
        assert_eq!(
            cpu::piece_starts(text.as_bytes()).unwrap(),
            oracle.starts_of_str(&text),
            "case {case}: {text:?}"
        );
    }
    let mut invalid = 0;
    for case in 0..4_000 {
        let text = random_bytes(&mut random, 24);
        invalid += usize::from(std::str::from_utf8(&text).is_err());
        assert_eq!(
            cpu::piece_starts(&text).unwrap(),
            oracle.starts(&text),
            "damaged case {case}: {}",
            shown(&text)
        );
    }
    assert!(
        invalid > 500,
        "only {invalid} damaged strings were invalid UTF-8"
    );
}

/// Locks out any disagreement between the IR programs (on the reference
/// interpreter, small and default geometry) and the oracle on the corpus.
#[test]
fn reference_pipeline_equals_oracle_on_corpus() {
    let oracle = Oracle::new();
    let small = small_programs();
    let default = programs();
    for text in corpus() {
        let expected = oracle.starts(&text);
        let got = run_reference(&small, &text)
            .expect("reference run")
            .piece_starts;
        assert_eq!(got, expected, "small geometry, text {}", shown(&text));
        if text.len() > 200 {
            let got = run_reference(&default, &text)
                .expect("reference run")
                .piece_starts;
            assert_eq!(got, expected, "default geometry, text {}", shown(&text));
        }
    }
}

/// Locks out disagreements of the per-byte rule on random inputs: 600 random
/// strings, valid and damaged, concatenated into texts of a few hundred bytes so
/// each reference run crosses many 16-byte workgroups.
#[test]
fn reference_pipeline_equals_oracle_on_random_strings() {
    let oracle = Oracle::new();
    let small = small_programs();
    let mut random = SplitMix64::new(0xBADC_0FFE);
    for round in 0..40 {
        let mut text = Vec::new();
        for _ in 0..15 {
            if random.chance(1, 3) {
                text.extend_from_slice(&random_bytes(&mut random, 16));
            } else {
                text.extend_from_slice(random_string(&mut random, 16).as_bytes());
            }
        }
        let got = run_reference(&small, &text)
            .expect("reference run")
            .piece_starts;
        assert_eq!(got, oracle.starts(&text), "round {round}: {}", shown(&text));
    }
}

/// Locks out a UTF-8 validity rule in the split program that differs from the
/// standard's at the edges of the well-formed table (C1/C2, E0 A0, ED 9F/A0, F0 90,
/// F4 8F/90, F5): every lead of interest with every boundary second byte and
/// complete, short and interrupted tails, on the reference interpreter and the CPU
/// splitter, against the oracle under the invalid rule. (Overlong forms are caught:
/// accepting them decodes letters and digits. Accepting surrogates `ED A0..BF`
/// would change no piece: U+D800..U+DFFF would be class "other", like the bytes.)
#[test]
fn utf8_boundaries_follow_the_invalid_rule() {
    let oracle = Oracle::new();
    let small = small_programs();
    for text in utf8_boundary_texts() {
        let lead = text[1];
        let expected = oracle.starts(&text);
        assert_eq!(
            cpu::piece_starts(&text).unwrap(),
            expected,
            "CPU, lead {lead:#x}"
        );
        let got = run_reference(&small, &text)
            .expect("reference run")
            .piece_starts;
        assert_eq!(got, expected, "reference, lead {lead:#x}: {}", shown(&text));
    }
}

/// Locks out disagreements on realistic inputs: all three generated shapes at
/// sizes that do and do not fill the last workgroup, both geometries.
#[test]
fn reference_pipeline_equals_cpu_splitter_on_generated_shapes() {
    let small = small_programs();
    let default = programs();
    for shape in Shape::ALL {
        for (bytes, seed) in [(1024usize, 1u64), (999, 2), (33, 3), (1, 4)] {
            let text = generate(shape, bytes, seed);
            let expected = cpu::piece_starts(&text).unwrap();
            for programs in [&small, &default] {
                let got = run_reference(programs, &text)
                    .expect("reference run")
                    .piece_starts;
                assert_eq!(got, expected, "{shape} {bytes} bytes seed {seed}");
            }
        }
    }
}

/// Locks out a split or compaction that loses or misplaces pieces when threads
/// own several bytes, workgroups own several blocks of the split or sum long
/// prefixes: one byte per thread and one workgroup for every block (prefixes of
/// up to 255 counts: four rounds of four loads), one workgroup for all of them (no
/// prefix, many blocks in a row), uneven splits, 2 to 8 bytes per thread (a
/// block's mask of several words and the window's halo across them) and a
/// workgroup size that is not a power of two, each on 4 KiB of every shape.
#[test]
fn reference_pipeline_equals_cpu_splitter_across_compaction_grids() {
    for (workgroup_size, bytes_per_thread, compact_workgroups) in [
        (16, 1, 1024),
        (16, 1, 1),
        (16, 2, 7),
        (16, 8, 3),
        (48, 5, 5),
        (32, 4, 1024),
    ] {
        let programs = build(Geometry {
            workgroup_size,
            bytes_per_thread,
            compact_workgroups,
        })
        .expect("valid geometry");
        for shape in Shape::ALL {
            let text = generate(shape, 4096, 7);
            let got = run_reference(&programs, &text)
                .expect("reference run")
                .piece_starts;
            assert_eq!(
                got,
                cpu::piece_starts(&text).unwrap(),
                "{shape}, {workgroup_size}-thread workgroups, {bytes_per_thread} bytes per thread, at most {compact_workgroups} compaction workgroups"
            );
        }
    }
}

/// Locks out a wrong oracle wrapper or CPU splitter: hand-computed pieces of the
/// pattern's hard cases (contractions, `\s+(?!\S)`, ` ?` attaching only U+0020,
/// marks not being letters, invalid bytes as U+FFFD).
#[test]
fn hand_computed_pieces() {
    let oracle = Oracle::new();
    let cases: &[(&[u8], &[&[u8]])] = &[
        (b"", &[][..]),
        (b"it's", &[b"it", b"'s"]),
        (b"it'sa", &[b"it", b"'s", b"a"]),
        (b" 's", &[b" '", b"s"]),
        (b".'s", &[b".'", b"s"]),
        (b"\n's", &[b"\n", b"'s"]),
        (b"'re're", &[b"'re", b"'re"]),
        (b"'RE", &[b"'", b"RE"]),
        (b"a  b", &[b"a", b" ", b" b"]),
        (b"a \n b", &[b"a", b" \n", b" b"]),
        (b"\n\nword", &[b"\n", b"\n", b"word"]),
        (b"end  ", &[b"end", b"  "]),
        ("x\u{A0}y".as_bytes(), &[b"x", "\u{A0}".as_bytes(), b"y"]),
        ("e\u{301}t".as_bytes(), &[b"e", "\u{301}".as_bytes(), b"t"]),
        ("a 42 €".as_bytes(), &[b"a", b" 42", " €".as_bytes()]),
        (b"ab \xC3", &[b"ab", b" \xC3"]),
    ];
    for (text, expected) in cases {
        let starts = cpu::piece_starts(text).unwrap();
        let pieces = cpu::pieces(text, &starts);
        assert_eq!(&pieces[..], &expected[..], "text {}", shown(text));
        assert_eq!(oracle.starts(text), starts, "oracle, text {}", shown(text));
    }
}

/// A splitter that attaches any white space (not only U+0020) to the next piece and
/// ignores contractions: the kind of near miss the corpus must catch.
fn near_miss_splitter(text: &str) -> Vec<u32> {
    let regex = fancy_regex::Regex::new(r"\s?\p{L}+|\s?\p{N}+|\s?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
        .expect("near-miss pattern");
    regex
        .find_iter(text)
        .map(|found| found.expect("match").start() as u32)
        .collect()
}

/// Negative control for the comparisons above: the corpus and the random strings
/// really exercise contractions and the U+0020-only attachment, so a splitter
/// that got either wrong would fail them.
#[test]
fn negative_control_a_near_miss_splitter_is_caught() {
    let oracle = Oracle::new();
    let caught = corpus()
        .iter()
        .filter_map(|text| std::str::from_utf8(text).ok())
        .filter(|text| near_miss_splitter(text) != oracle.starts_of_str(text))
        .count();
    assert!(
        caught >= 20,
        "only {caught} corpus texts catch the near miss"
    );
    let mut random = SplitMix64::new(3);
    let random_caught = (0..500)
        .map(|_| random_string(&mut random, 24))
        .filter(|text| near_miss_splitter(text) != oracle.starts_of_str(text))
        .count();
    assert!(
        random_caught >= 100,
        "only {random_caught} random strings catch it"
    );
}

/// Locks out drift between the one description of the steps and the programs:
/// every step binds exactly the program's global buffers, by name and order.
#[test]
fn steps_bind_exactly_the_programs_buffers() {
    for (step, program) in programs().steps() {
        let names: Vec<&str> = program
            .global_buffers()
            .iter()
            .map(|decl| decl.name.as_ref())
            .collect();
        let bound: Vec<&str> = step.bindings.iter().map(|role| role.name()).collect();
        assert_eq!(names, bound, "step {}", step.name);
    }
    assert_eq!(STEPS.len(), pretokenize::pipeline::DISPATCHES_PER_ENCODE);
}

/// Locks out a nondeterministic or wrong-length generator: the same seed gives
/// the same bytes, other seeds differ, the length is exact, CJK is valid UTF-8
/// and prose and code are ASCII.
#[test]
fn generator_is_deterministic_exact_and_well_formed() {
    for shape in Shape::ALL {
        let a = generate(shape, 4096, 7);
        assert_eq!(a.len(), 4096);
        assert_eq!(a, generate(shape, 4096, 7), "{shape}");
        assert_ne!(a, generate(shape, 4096, 8), "{shape}");
        assert!(std::str::from_utf8(&a).is_ok(), "{shape}");
        for bytes in [0usize, 1, 2, 3, 5] {
            assert_eq!(generate(shape, bytes, 1).len(), bytes);
        }
    }
    assert!(generate(Shape::Prose, 4096, 1).is_ascii());
    assert!(generate(Shape::Code, 4096, 1).is_ascii());
    let cjk = String::from_utf8(generate(Shape::Cjk, 4096, 1)).unwrap();
    let ideographs = cjk
        .chars()
        .filter(|c| ('\u{4E00}'..='\u{9FFF}').contains(c))
        .count();
    assert!(ideographs > 1000, "{ideographs} ideographs");
    let mut random = SplitMix64::new(1);
    assert!((0..1000).all(|_| random.below(7) < 7));
}

/// Locks out panics and vague errors on bad requests: shape names, geometries,
/// text over the pipeline's limit (on the CPU splitter and the reference run).
#[test]
fn bad_requests_get_fix_errors() {
    assert!("poetry".parse::<Shape>().unwrap_err().starts_with("Fix:"));
    assert_eq!("cjk".parse::<Shape>(), Ok(Shape::Cjk));
    for geometry in [
        Geometry {
            workgroup_size: 0,
            bytes_per_thread: 1,
            compact_workgroups: 4,
        },
        Geometry {
            workgroup_size: 15,
            bytes_per_thread: 1,
            compact_workgroups: 4,
        },
        Geometry {
            workgroup_size: 32,
            bytes_per_thread: 1,
            compact_workgroups: 0,
        },
        Geometry {
            workgroup_size: 32,
            bytes_per_thread: 1,
            compact_workgroups: 65_537,
        },
        Geometry {
            workgroup_size: 32,
            bytes_per_thread: 0,
            compact_workgroups: 4,
        },
        Geometry {
            workgroup_size: 32,
            bytes_per_thread: 9,
            compact_workgroups: 4,
        },
        Geometry {
            workgroup_size: 2048,
            bytes_per_thread: 1,
            compact_workgroups: 4,
        },
    ] {
        assert!(build(geometry).unwrap_err().message().starts_with("Fix:"));
    }
    assert!(check_text_len(MAX_TEXT_BYTES).is_ok());
    // Zeroed pages are not touched until read: this costs no real memory.
    let too_long = vec![0u8; MAX_TEXT_BYTES + 1];
    let error = cpu::piece_starts(&too_long).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    let error = run_reference(&programs(), &too_long).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    assert_eq!(
        cpu::pieces(b"abc", &[0, 2, 1, 9]),
        [&b"ab"[..], b"", b"", b""]
    );
}
