//! GPU tests of the GPT-2 pre-tokenizer. Ignored by default; run on the GPU
//! machine with `bash .gpu/run.sh gpu_`. Every GPU result, eager and graph, is
//! compared with the external oracle (`fancy-regex` running the pattern, under
//! the invalid-UTF-8 rule), the plain CPU splitter and, where the text is small
//! enough, the reference interpreter running the same programs.

#[path = "support/driver_calls.rs"]
mod driver_calls;
mod oracle;
#[path = "../../tests/support/sanitizer.rs"]
mod sanitizer;

use std::collections::HashMap;

use vyre_tokenizer::pretokenize;

use oracle::{corpus, random_bytes, random_string, utf8_boundary_texts, Oracle};
use pretokenize::cpu;
use pretokenize::pipeline::{run_reference, CudaPipeline};
use pretokenize::programs::{programs, Programs};
use pretokenize::text::{generate, Shape, SplitMix64};

/// The backend of device 0; GPU tests are ignored unless run on a CUDA machine,
/// where a missing device is a real failure.
fn gpu_backend() -> vyre_cuda::backend::CudaBackend {
    vyre_cuda::backend::CudaBackend::acquire()
        .unwrap_or_else(|e| panic!("gpu test needs a CUDA device: {e}"))
}

fn shown(text: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(text))
}

/// Pipelines by text length, built on first use (one per length: buffers are
/// sized for it).
struct Pipelines<'a> {
    gpu: &'a vyre_cuda::backend::CudaBackend,
    programs: &'a Programs,
    by_length: HashMap<usize, CudaPipeline>,
}

impl Pipelines<'_> {
    fn get(&mut self, text_len: usize) -> &mut CudaPipeline {
        let (gpu, programs) = (self.gpu, self.programs);
        self.by_length
            .entry(text_len)
            .or_insert_with(|| CudaPipeline::new(gpu, programs, text_len).expect("pipeline"))
    }

    /// Encodes `text` eagerly and as a graph; both must give `expected`.
    fn check(&mut self, text: &[u8], expected: &[u32], what: &str) {
        let pipeline = self.get(text.len());
        pipeline.encode(text).expect("eager encode");
        assert_eq!(
            pipeline.piece_starts(),
            expected,
            "{what} eager: {}",
            shown(text)
        );
        pipeline.encode_graph(text).expect("graph encode");
        assert_eq!(
            pipeline.piece_starts(),
            expected,
            "{what} graph: {}",
            shown(text)
        );
    }
}

/// Locks out any disagreement between the GPU and the oracle on the example's
/// workload: all three shapes at 262,144 bytes, each encoded on the hot path,
/// the timed path and as graph replays, alternating with a different text of the
/// same length (stale device data from the previous encode must never leak into
/// the next). The reference interpreter runs the same programs on a 16 KiB prefix.
/// (32,768 bytes under compute-sanitizer.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_all_shapes_match_oracle_at_262144_bytes() {
    let gpu = gpu_backend();
    let programs = programs();
    let regex = Oracle::new();
    let bytes = sanitizer::sized_for_tools("shape bytes", 262_144, 32_768);
    let mut pipeline = CudaPipeline::new(&gpu, &programs, bytes).unwrap();
    for shape in Shape::ALL {
        let text = generate(shape, bytes, 42);
        let other = generate(shape, bytes, 43);
        let expected = regex.starts(&text);
        let expected_other = regex.starts(&other);
        assert_eq!(
            cpu::piece_starts(&text).unwrap(),
            expected,
            "{shape}: CPU vs oracle"
        );
        let prefix = &text[..16_384];
        assert_eq!(
            run_reference(&programs, prefix).unwrap().piece_starts,
            regex.starts(prefix),
            "{shape}: reference vs oracle on 16 KiB"
        );
        pipeline.encode(&text).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected[..],
            "{shape}: GPU vs oracle"
        );
        pipeline.encode_timed(&text).unwrap();
        assert_eq!(pipeline.piece_starts(), &expected[..], "{shape} timed");
        pipeline.encode(&other).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected_other[..],
            "{shape} seed 43"
        );
        for (text, expected, seed) in [
            (&text, &expected, 42),
            (&other, &expected_other, 43),
            (&text, &expected, 42),
        ] {
            let timing = pipeline.encode_graph(text).unwrap();
            assert_eq!(
                pipeline.piece_starts(),
                &expected[..],
                "{shape} graph seed {seed}"
            );
            assert!(timing.wall_ns >= timing.replay.wall_ns);
        }
        pipeline.encode_graph_timed(&other).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected_other[..],
            "{shape} timed graph"
        );
    }
}

/// Locks out GPU-only disagreements on the hard cases: the whole hand-written
/// corpus (contractions, white-space runs, scripts, marks, emoji, Unicode
/// spaces, cut and invalid UTF-8), the UTF-8 well-formedness boundary texts and
/// 2,400 seeded random strings (valid and damaged), eager and graph, each
/// byte-identical to the oracle; then 100 texts of 40 random strings each, so the
/// rule is exercised across workgroup boundaries (240 strings and 10 texts under
/// compute-sanitizer).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_corpus_and_random_strings_match_oracle() {
    let gpu = gpu_backend();
    let programs = programs();
    let regex = Oracle::new();
    let mut pipelines = Pipelines {
        gpu: &gpu,
        programs: &programs,
        by_length: HashMap::new(),
    };
    for text in corpus().into_iter().chain(utf8_boundary_texts()) {
        pipelines.check(&text, &regex.starts(&text), "corpus");
    }
    let mut random = SplitMix64::new(0x6B_0009);
    let cases = sanitizer::sized_for_tools("random cases", 2_400, 80);
    for case in 0..cases {
        let text = if case % 4 == 3 {
            random_bytes(&mut random, 24)
        } else {
            random_string(&mut random, 24).into_bytes()
        };
        pipelines.check(&text, &regex.starts(&text), &format!("random case {case}"));
    }
    for round in 0..sanitizer::sized_for_tools("rounds of 40 strings", 100, 10) {
        let mut text = Vec::new();
        for _ in 0..40 {
            if random.chance(1, 4) {
                text.extend_from_slice(&random_bytes(&mut random, 24));
            } else {
                text.extend_from_slice(random_string(&mut random, 24).as_bytes());
            }
        }
        pipelines.check(&text, &regex.starts(&text), &format!("long round {round}"));
    }
}

/// Locks out errors at the edges: invalid UTF-8 of every byte value, texts that
/// end inside a workgroup, one byte, and 262,145 bytes (1,025 blocks, so each scan
/// thread sums two counts) with a stray continuation inside and a cut character at
/// the very end.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_invalid_utf8_and_odd_lengths_match_oracle() {
    let gpu = gpu_backend();
    let programs = programs();
    let regex = Oracle::new();
    let every_byte: Vec<u8> = (0..=255u8).rev().cycle().take(70_001).collect();
    let mut long = generate(Shape::Cjk, 262_145, 5);
    long[1000] = 0x80; // a stray continuation byte
    long[262_144] = 0xE6; // a cut lead at the very end
    for text in [
        every_byte,
        long,
        b"x".to_vec(),
        b"\xC3".to_vec(),
        generate(Shape::Code, 257, 9),
    ] {
        let expected = regex.starts(&text);
        assert_eq!(
            cpu::piece_starts(&text).unwrap(),
            expected,
            "{} bytes: CPU",
            text.len()
        );
        let mut pipeline = CudaPipeline::new(&gpu, &programs, text.len()).unwrap();
        pipeline.encode(&text).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected[..],
            "{} bytes: GPU",
            text.len()
        );
        pipeline.encode_graph(&text).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected[..],
            "{} bytes: graph",
            text.len()
        );
    }
}

/// Locks out per-encode allocation: once warm, eager and graph encodes create no
/// stream lanes, no pinned staging, no transient or resident device buffers.
/// Negative control: building a second pipeline does show up in the same counters.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_encodes_allocate_nothing_once_warm() {
    let gpu = gpu_backend();
    let programs = programs();
    let text = generate(Shape::Prose, 262_144, 1);
    let mut pipeline = CudaPipeline::new(&gpu, &programs, text.len()).unwrap();
    for _ in 0..3 {
        pipeline.encode(&text).unwrap();
        pipeline.encode_graph(&text).unwrap();
    }
    let before = gpu.pool_stats();
    for _ in 0..20 {
        pipeline.encode(&text).unwrap();
        pipeline.encode_graph(&text).unwrap();
    }
    assert_eq!(gpu.pool_stats(), before, "encodes allocated");
    let second = CudaPipeline::new(&gpu, &programs, 1000).unwrap();
    assert_ne!(
        gpu.pool_stats(),
        before,
        "negative control: a new pipeline allocates"
    );
    drop(second);
}

/// Locks out silent misuse: a text of another length is a `Fix:` error on both
/// paths, and the pipeline still works afterwards; an empty text has no pieces;
/// a text over the limit is a `Fix:` error.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_wrong_length_is_a_fix_error() {
    let gpu = gpu_backend();
    let programs = programs();
    let mut pipeline = CudaPipeline::new(&gpu, &programs, 512).unwrap();
    let error = pipeline.encode(&[b'a'; 511]).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    let error = pipeline.encode_graph(&[b'a'; 513]).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    // An empty text has no pieces on the GPU too, eager and graph.
    let mut empty = CudaPipeline::new(&gpu, &programs, 0).unwrap();
    empty.encode(b"").unwrap();
    assert!(empty.piece_starts().is_empty());
    empty.encode_graph(b"").unwrap();
    assert!(empty.piece_starts().is_empty());
    assert!(empty
        .encode(b"x")
        .unwrap_err()
        .message()
        .starts_with("Fix:"));
    assert!(
        CudaPipeline::new(&gpu, &programs, pretokenize::MAX_TEXT_BYTES + 1)
            .unwrap_err()
            .message()
            .starts_with("Fix:")
    );
    let text = generate(Shape::Prose, 512, 2);
    pipeline.encode(&text).unwrap();
    assert_eq!(
        pipeline.piece_starts(),
        &cpu::piece_starts(&text).unwrap()[..]
    );
}

/// Locks out a second round trip per encode: eager is one synchronize per
/// dispatch (the dispatches are chained on the device, so only the last one
/// blocks, and each waits on the device once for the one before), one kernel
/// launch each and one async copy (the text up: the count and
/// the piece starts come back through host-mapped memory); a graph encode is one
/// graph launch and one synchronize with no copy after it. Negative control: a
/// read of the piece starts after the replay (what the pipeline did before the
/// mapped buffer) shows up as one more synchronize and one more copy.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_encodes_make_one_synchronize_per_dispatch_and_one_per_graph() {
    use driver_calls::encode_driver_calls;
    use pretokenize::pipeline::DISPATCHES_PER_ENCODE;
    use vyre_cuda::backend::thread_driver_calls;
    let gpu = gpu_backend();
    let programs = programs();
    let text = generate(Shape::Code, 262_144, 5);
    let expected = cpu::piece_starts(&text).unwrap();
    let mut pipeline = CudaPipeline::new(&gpu, &programs, text.len()).unwrap();
    encode_driver_calls(&mut pipeline, &text).unwrap(); // warm: lanes, staging, graph
    let [eager, graph] = encode_driver_calls(&mut pipeline, &text).unwrap();
    assert_eq!(pipeline.piece_starts(), &expected[..]);
    assert_eq!(
        eager.synchronizes, DISPATCHES_PER_ENCODE as u64,
        "{eager:?}"
    );
    assert_eq!(eager.launches, DISPATCHES_PER_ENCODE as u64, "{eager:?}");
    assert_eq!(eager.async_copies, 1, "{eager:?}");
    assert_eq!(
        eager.stream_waits,
        DISPATCHES_PER_ENCODE as u64 - 1,
        "each step waits once for the one before, not once per ordering rule: {eager:?}"
    );
    assert_eq!(graph.graph_launches, 1, "{graph:?}");
    assert_eq!(graph.synchronizes, 1, "{graph:?}");
    assert_eq!(graph.async_copies, 0, "{graph:?}");
    // Negative control: the counters see an extra read.
    let scratch = gpu.buffer(4 * expected.len() as u64).unwrap();
    let before = thread_driver_calls();
    let mut out = vec![0u32; expected.len()];
    gpu.read_into(&scratch, &mut out).unwrap();
    let after = thread_driver_calls();
    assert_eq!(after.synchronizes - before.synchronizes, 1);
    assert_eq!(after.async_copies - before.async_copies, 1);
}
