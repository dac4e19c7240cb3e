//! GPU tests of the pretokenize pipeline (§8). Ignored by default; run on the GPU
//! machine with `bash .gpu/run.sh gpu_`. Every GPU result is compared with the
//! reference interpreter running the same programs and with the plain CPU splitter.

mod support;

use vyre_cuda::pretokenize;

use pretokenize::cpu;
use pretokenize::pipeline::{run_reference, CudaPipeline};
use pretokenize::programs::programs;
use pretokenize::text::{generate, Shape};
use support::backend as gpu_backend;

/// Locks out any disagreement between the GPU, the reference interpreter and the
/// CPU splitter on the example's workload: all three shapes at 262,144 bytes, each
/// encoded on the hot path, the timed path and as a graph replay, then a different text of the same
/// length (stale device data from the previous encode must never leak into the next).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_all_shapes_match_reference_and_cpu_at_262144_bytes() {
    let gpu = gpu_backend();
    let programs = programs();
    let mut pipeline = CudaPipeline::new(&gpu, &programs, 262_144).unwrap();
    for shape in Shape::ALL {
        let text = generate(shape, 262_144, 42);
        let expected = cpu::piece_starts(&text);
        let oracle = run_reference(&programs, &text).unwrap().piece_starts;
        assert_eq!(oracle, expected, "{shape}: reference vs CPU");
        pipeline.encode(&text).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected[..],
            "{shape}: GPU vs CPU"
        );
        // The timed path (events on every dispatch) must split identically.
        pipeline.encode_timed(&text).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected[..],
            "{shape} timed: GPU vs CPU"
        );
        let other = generate(shape, 262_144, 43);
        pipeline.encode(&other).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &cpu::piece_starts(&other)[..],
            "{shape} seed 43"
        );
        // The graph path (one replay per encode), alternating texts so a replay that
        // served the previous encode's bytes would be caught.
        for (text, seed) in [(&text, 42), (&other, 43), (&text, 42)] {
            pipeline.encode_graph(text).unwrap();
            assert_eq!(
                pipeline.piece_starts(),
                &cpu::piece_starts(text)[..],
                "{shape} graph seed {seed}"
            );
        }
        pipeline.encode_graph_timed(&other).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &cpu::piece_starts(&other)[..],
            "{shape} timed graph"
        );
    }
}

/// Locks out errors at the edges: invalid UTF-8 of every byte value, texts that
/// end inside a workgroup, one byte, and 262,145 bytes (1,025 blocks, so each scan
/// thread sums two counts).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_invalid_utf8_and_odd_lengths_match_reference_and_cpu() {
    let gpu = gpu_backend();
    let programs = programs();
    let every_byte: Vec<u8> = (0..=255u8).rev().cycle().take(70_001).collect();
    let mut long = generate(Shape::Cjk, 262_145, 5);
    long[1000] = 0x80; // a stray continuation byte
    long[262_144] = 0xE6; // a truncated lead at the very end
    for text in [
        every_byte,
        long,
        b"x".to_vec(),
        b"\xC3".to_vec(),
        generate(Shape::Code, 257, 9),
    ] {
        let expected = cpu::piece_starts(&text);
        assert_eq!(
            run_reference(&programs, &text).unwrap().piece_starts,
            expected,
            "{} bytes",
            text.len()
        );
        let mut pipeline = CudaPipeline::new(&gpu, &programs, text.len()).unwrap();
        pipeline.encode(&text).unwrap();
        assert_eq!(
            pipeline.piece_starts(),
            &expected[..],
            "{} bytes: GPU vs CPU",
            text.len()
        );
    }
}

/// Locks out per-encode allocation: once warm, encodes create no stream lanes,
/// no pinned staging, no transient or resident device buffers. Negative control:
/// building a second pipeline does show up in the same counters.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_encodes_allocate_nothing_once_warm() {
    let gpu = gpu_backend();
    let programs = programs();
    let text = generate(Shape::Prose, 262_144, 1);
    let mut pipeline = CudaPipeline::new(&gpu, &programs, text.len()).unwrap();
    for _ in 0..3 {
        pipeline.encode(&text).unwrap();
    }
    let before = gpu.pool_stats();
    for _ in 0..20 {
        pipeline.encode(&text).unwrap();
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

/// Locks out silent misuse: a text of another length is a `Fix:` error, and the
/// pipeline still works afterwards.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_wrong_length_is_a_fix_error() {
    let gpu = gpu_backend();
    let programs = programs();
    let mut pipeline = CudaPipeline::new(&gpu, &programs, 512).unwrap();
    let error = pipeline.encode(&[b'a'; 511]).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    assert!(CudaPipeline::new(&gpu, &programs, 0)
        .unwrap_err()
        .message()
        .starts_with("Fix:"));
    let text = generate(Shape::Prose, 512, 2);
    pipeline.encode(&text).unwrap();
    assert_eq!(pipeline.piece_starts(), &cpu::piece_starts(&text)[..]);
}
