//! CPU tests of the pretokenize pipeline (§8): the five IR programs, run on the
//! reference interpreter, must split exactly like the plain CPU splitter, and the
//! CPU splitter must give hand-written piece starts. Inputs stay small (the
//! reference interpreter is slow in debug builds); small workgroups make short
//! texts cross many workgroup boundaries and make the scan loop over several
//! counts per thread.

use vyre_cuda::pretokenize;

use pretokenize::pipeline::run_reference;
use pretokenize::programs::{build, programs, Programs};
use pretokenize::text::{generate, Shape, SplitMix64};
use pretokenize::{class, class_of, cpu, Geometry};

/// 32-thread workgroups (a 1 KiB text is 32 blocks) and a 4-thread scan (8 counts
/// per scan thread at 1 KiB).
fn small_programs() -> Programs {
    build(Geometry {
        workgroup_size: 32,
        scan_threads: 4,
    })
    .expect("valid geometry")
}

/// Hand-written texts covering every rule, including invalid UTF-8.
fn hand_written_texts() -> Vec<Vec<u8>> {
    let mut texts: Vec<Vec<u8>> = [
        &b""[..],
        b"a",
        b" ",
        b".",
        b"\x80",
        b"\xFF",
        b"Hello, world!",
        b"abc123  def\n\n\tx",
        "日本語 text".as_bytes(),
        "混合 mixed テキスト 123, ok?".as_bytes(),
        "é😀ß€".as_bytes(),
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
        b"\xED\xA0\x80z",
    ]
    .iter()
    .map(|text| text.to_vec())
    .collect();
    // Long runs that cross 32-byte workgroups, and every byte value once.
    texts.push(b"a".repeat(300));
    texts.push(
        [
            b"x".repeat(70),
            b" ".repeat(65),
            b"7".repeat(33),
            b"!".repeat(40),
        ]
        .concat(),
    );
    texts.push("語".repeat(50).into_bytes());
    texts.push((0..=255u8).collect());
    texts.push((0..=255u8).rev().cycle().take(700).collect());
    texts
}

/// Locks out any disagreement between the IR programs (run on the reference
/// interpreter) and the plain CPU splitter on hand-written texts, valid UTF-8 or not.
#[test]
fn pipeline_on_reference_equals_cpu_splitter_on_hand_written_texts() {
    let small = small_programs();
    for text in hand_written_texts() {
        let expected = cpu::piece_starts(&text);
        let got = run_reference(&small, &text)
            .expect("reference run")
            .piece_starts;
        assert_eq!(
            got,
            expected,
            "small geometry, text {:?}",
            String::from_utf8_lossy(&text)
        );
    }
}

/// Locks out a pipeline that is only right for the small test geometry: the
/// default 256-thread geometry that the example and the GPU run must agree too.
#[test]
fn default_geometry_pipeline_equals_cpu_splitter() {
    let default = programs();
    for text in [
        "日本語 text, 123!".as_bytes().to_vec(),
        (0..=255u8).rev().cycle().take(1500).collect(),
        generate(Shape::Code, 1200, 3),
    ] {
        let got = run_reference(&default, &text)
            .expect("reference run")
            .piece_starts;
        assert_eq!(got, cpu::piece_starts(&text));
    }
}

/// Locks out disagreements on realistic inputs: all three generated shapes at
/// sizes that do and do not fill the last workgroup.
#[test]
fn pipeline_on_reference_equals_cpu_splitter_on_generated_shapes() {
    let small = small_programs();
    for shape in Shape::ALL {
        for (bytes, seed) in [(1024usize, 1u64), (999, 2), (33, 3), (1, 4)] {
            let text = generate(shape, bytes, seed);
            let got = run_reference(&small, &text)
                .expect("reference run")
                .piece_starts;
            assert_eq!(
                got,
                cpu::piece_starts(&text),
                "{shape} {bytes} bytes seed {seed}"
            );
        }
    }
}

/// Locks out drift between the classify program and `class_of`: every byte value
/// gets the same class on the reference interpreter as in plain Rust.
#[test]
fn classify_program_matches_class_of_for_every_byte() {
    let text: Vec<u8> = (0..=255u8).collect();
    let program = programs().classify;
    let outputs = vyre_cuda::reference::run(
        &program,
        &[&text, &[0u8; 256]],
        &vyre_cuda::DispatchConfig::linear(1),
    )
    .expect("reference run");
    for byte in 0..=255u8 {
        assert_eq!(
            outputs[0][byte as usize] as u32,
            class_of(byte),
            "byte {byte:#04x}"
        );
    }
    assert_eq!(class_of(0x80), class::CONTINUATION);
    assert_eq!(class_of(0xE4), class::LEAD3);
}

/// Locks out a wrong CPU splitter (the second oracle): hand-computed piece starts.
#[test]
fn cpu_splitter_gives_hand_written_piece_starts() {
    let cases: [(&[u8], &[u32]); 16] = [
        (b"", &[]),
        (b"a", &[0]),
        (b"Hello, world!", &[0, 5, 6, 7, 12]),
        (b"abc123  def", &[0, 3, 6, 8]),
        ("日本語 text".as_bytes(), &[0, 3, 6, 9, 10]),
        (b"  \n\tab", &[0, 4]),
        (b"...", &[0, 1, 2]),
        // A stray continuation byte is a piece of its own.
        (b"\x80abc", &[0, 1]),
        // A truncated 3-byte character keeps its one continuation byte.
        (b"\xE6\x97a", &[0, 2]),
        // 0xFF is never valid: each is a piece.
        (b"\xFF\xFFab", &[0, 1, 2]),
        // A 2-byte character takes one continuation; the next is stray.
        (b"\xC3\xA9\xA9", &[0, 2]),
        (b"\xF0\x9F\x98\x80\x80", &[0, 4]),
        (b"x\xE6y", &[0, 1, 2]),
        (b"\x80\x80\x80\x80", &[0, 1, 2, 3]),
        // 0xF8 takes nothing; overlong forms are grouped structurally.
        (b"\xF8\x80\xC0\xAF", &[0, 1, 2]),
        (b"a1 b2", &[0, 1, 2, 3, 4]),
    ];
    for (text, expected) in cases {
        assert_eq!(
            cpu::piece_starts(text),
            expected,
            "text {:?}",
            String::from_utf8_lossy(text)
        );
    }
    let text = "ab, 語!".as_bytes();
    let pieces = cpu::pieces(text, &cpu::piece_starts(text));
    assert_eq!(pieces, [&b"ab"[..], b",", b" ", "語".as_bytes(), b"!"]);
}

/// A splitter with the invalid-UTF-8 rule left out: every continuation byte joins
/// the piece before it.
fn splitter_without_stray_rule(text: &[u8]) -> Vec<u32> {
    let mut starts = Vec::new();
    let mut previous = None;
    for (index, &byte) in text.iter().enumerate() {
        let kind = class_of(byte);
        if kind == class::CONTINUATION && index > 0 {
            continue;
        }
        let single = kind >= class::PUNCTUATION || kind == class::CONTINUATION;
        if single || previous != Some(kind) {
            starts.push(index as u32);
        }
        previous = Some(if kind >= class::LEAD2 {
            class::PUNCTUATION
        } else {
            kind
        });
    }
    starts
}

/// Negative control for the comparisons above: the hand-written texts really
/// exercise the invalid-UTF-8 rules, so a pipeline that dropped them would fail.
/// A splitter without the stray-continuation rule agrees with the real one on
/// valid text but not on the invalid inputs.
#[test]
fn negative_control_a_splitter_without_the_stray_rule_is_caught() {
    let valid = "日本語 text, 123!".as_bytes();
    assert_eq!(splitter_without_stray_rule(valid), cpu::piece_starts(valid));
    let caught = hand_written_texts()
        .iter()
        .filter(|text| splitter_without_stray_rule(text) != cpu::piece_starts(text))
        .count();
    assert!(
        caught >= 5,
        "only {caught} texts exercise the stray-continuation rule"
    );
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

/// Locks out panics and vague errors on bad requests: shape names, geometries.
#[test]
fn bad_requests_get_fix_errors() {
    assert!("poetry".parse::<Shape>().unwrap_err().starts_with("Fix:"));
    assert_eq!("cjk".parse::<Shape>(), Ok(Shape::Cjk));
    for geometry in [
        Geometry {
            workgroup_size: 0,
            scan_threads: 4,
        },
        Geometry {
            workgroup_size: 32,
            scan_threads: 6,
        },
        Geometry {
            workgroup_size: 2048,
            scan_threads: 4,
        },
    ] {
        assert!(build(geometry).unwrap_err().message().starts_with("Fix:"));
    }
    assert_eq!(
        cpu::pieces(b"abc", &[0, 2, 1, 9]),
        [&b"ab"[..], b"", b"", b""]
    );
}
