//! GPU tests of the batch split (`pretokenize::batch`) for all three patterns:
//! every result, eager and as a graph replay, equal to each document split
//! alone by the CPU splitter (which `tests/split.rs` holds to `fancy-regex`),
//! and on the corpus to `fancy-regex` itself. Ignored by default; run on the GPU
//! machine (`cargo test --release -p vyre-tokenizer --test gpu_batch_split --
//! --ignored gpu_`). The binary links no oracle crate besides `fancy-regex`,
//! so it stays small enough to carry to the GPU machine.

#[path = "support/batches.rs"]
mod batches;
mod oracle;
#[path = "../../tests/support/sanitizer.rs"]
mod sanitizer;
mod split_corpus;

use batches::{boundary_cases, expected_starts, pack};
use oracle::Oracle;
use vyre_cuda::backend::{AnyBackend, CudaBackend};
use vyre_tokenizer::pretokenize::batch::runner::BatchSplitter;
use vyre_tokenizer::pretokenize::batch::SplitPrograms;
use vyre_tokenizer::pretokenize::pattern::Pattern;
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::pretokenize::Geometry;

/// Device 0; GPU tests are ignored unless run on a CUDA machine, where a
/// missing device is a real failure.
fn gpu() -> AnyBackend {
    AnyBackend::Cuda(
        CudaBackend::acquire().unwrap_or_else(|e| panic!("gpu test needs a CUDA device: {e}")),
    )
}

fn splitter(backend: &AnyBackend, pattern: Pattern) -> BatchSplitter {
    BatchSplitter::new(backend, SplitPrograms::new(pattern)).expect("splitter")
}

fn shown(text: &[u8]) -> String {
    let shown = String::from_utf8_lossy(text);
    if shown.len() > 200 {
        format!(
            "{:?}… ({} bytes)",
            &shown[..shown.floor_char_boundary(200)],
            text.len()
        )
    } else {
        format!("{shown:?}")
    }
}

/// Eager and graph runs of `documents` must both give each document's own split.
fn check(splitter: &mut BatchSplitter, documents: &[Vec<u8>], what: &str) {
    let pattern = splitter.programs().pattern();
    let (text, ends) = pack(documents);
    let expected = expected_starts(pattern, documents);
    let eager = splitter.split(&text, &ends).expect("eager split");
    assert!(
        eager == expected,
        "{pattern:?} eager, {what}: {}",
        shown(&text)
    );
    let graph = splitter.split_graph(&text, &ends).expect("graph split");
    assert!(
        graph == expected,
        "{pattern:?} graph, {what}: {}",
        shown(&text)
    );
}

/// `text` cut into documents of 1 to 16 KiB (cuts anywhere, mid-character too).
fn cut(text: &[u8], seed: u64) -> Vec<Vec<u8>> {
    let mut random = SplitMix64::new(seed);
    let mut documents = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let end = (start + 1024 + random.below(15 * 1024) as usize).min(text.len());
        documents.push(text[start..end].to_vec());
        start = end;
    }
    documents
}

/// Locks out any disagreement on the example's workload: the three shapes at
/// 262,144 bytes for every pattern, as one document and cut into documents of
/// 1 to 16 KiB, eager and as a graph, alternating with another text of the
/// same length (stale data must never leak into the next run); the reference
/// interpreter runs the same programs on a 16 KiB prefix.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_split_matches_on_three_shapes_at_262144_bytes() {
    let backend = gpu();
    let shape_bytes = sanitizer::sized_for_tools("shape bytes", 262_144, 32_768);
    let reference = AnyBackend::reference();
    for pattern in Pattern::ALL {
        let mut splitter = splitter(&backend, pattern);
        let mut on_reference = self::splitter(&reference, pattern);
        for shape in Shape::ALL {
            for seed in [42, 43, 42] {
                let text = generate(shape, shape_bytes, seed);
                check(
                    &mut splitter,
                    std::slice::from_ref(&text),
                    &format!("{shape} seed {seed}"),
                );
                check(
                    &mut splitter,
                    &cut(&text, seed),
                    &format!("{shape} seed {seed} in documents"),
                );
            }
            let prefix = generate(shape, 16_384, 42);
            let expected = expected_starts(pattern, std::slice::from_ref(&prefix));
            let (text, ends) = pack(&[prefix]);
            assert_eq!(
                on_reference.split(&text, &ends).expect("reference"),
                &expected[..],
                "{pattern:?} {shape}: reference on 16 KiB"
            );
        }
    }
}

/// Locks out GPU-only disagreements on the hard cases: the whole corpus in
/// batches of about 50 documents (each document's split also equal to
/// `fancy-regex` on it), and 2,000 random strings per pattern (a third
/// damaged; 200 under compute-sanitizer), in batches of 100 and the first
/// tenth alone, eager and as a graph.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_split_matches_on_corpus_and_2000_random_strings() {
    let backend = gpu();
    let mut corpus = split_corpus::corpus(oracle::corpus());
    corpus.extend(oracle::utf8_boundary_texts());
    for (pattern, seed) in [
        (Pattern::Gpt2, 0x6B5_0001u64),
        (Pattern::Cl100k, 0x6B5_0002),
        (Pattern::O200k, 0x6B5_0003),
    ] {
        let regex = Oracle::for_pattern(pattern);
        for text in &corpus {
            assert_eq!(
                expected_starts(pattern, std::slice::from_ref(text)),
                regex.starts(text),
                "{pattern:?} CPU vs fancy-regex: {}",
                shown(text)
            );
        }
        let mut splitter = splitter(&backend, pattern);
        for (index, batch) in batches::batches(corpus.clone(), 50, seed)
            .iter()
            .enumerate()
        {
            check(&mut splitter, batch, &format!("corpus batch {index}"));
        }
        let mut random = SplitMix64::new(seed);
        let count = sanitizer::sized_for_tools("random strings", 2_000, 60);
        let strings: Vec<Vec<u8>> = (0..count)
            .map(|_| split_corpus::random_bytes(&mut random, 24))
            .collect();
        for (index, batch) in batches::batches(strings.clone(), 100, seed)
            .iter()
            .enumerate()
        {
            check(&mut splitter, batch, &format!("random batch {index}"));
        }
        for (index, string) in strings.iter().take(count / 10).enumerate() {
            if !string.is_empty() {
                check(
                    &mut splitter,
                    std::slice::from_ref(string),
                    &format!("random string {index}"),
                );
            }
        }
    }
}

/// Locks out scans that stop at a workgroup or a look-back round: every
/// 100 KiB run of `split_corpus::long_runs` (a hundred blocks: a digit run's
/// groups of three, a white-space run decided by what follows it, an
/// upper-case stretch decided by its end) alone, after a short document, and
/// cut in two documents in its middle; and the documents whose ends cut runs
/// and characters. (Runs of 6 KiB under compute-sanitizer.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_split_matches_on_100_kib_runs_and_document_boundaries() {
    let backend = gpu();
    let run_bytes = sanitizer::sized_for_tools("run bytes", 100 << 10, 6 << 10);
    for pattern in Pattern::ALL {
        let mut splitter = splitter(&backend, pattern);
        for (name, run) in split_corpus::long_runs_of(run_bytes) {
            check(&mut splitter, std::slice::from_ref(&run), name);
            check(&mut splitter, &[b"x".to_vec(), run.clone()], name);
            let (head, tail) = run.split_at(run.len() / 2 + 1);
            check(&mut splitter, &[head.to_vec(), tail.to_vec()], name);
        }
        for (index, documents) in boundary_cases().iter().enumerate() {
            check(&mut splitter, documents, &format!("boundary case {index}"));
        }
    }
}

/// Locks out trouble with batch sizes: batches of 1, 2, 10, 100 and 1,000
/// documents of 0 to 2 KiB of every shape (one in six empty), a batch of
/// 100,000 empty documents around three short ones, and a 4 MiB batch (4,096
/// blocks: more than the device holds at once, so blocks wait for earlier ones
/// in the look-backs), each eager and as a graph.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_split_matches_on_batches_of_1_to_1000_documents() {
    let backend = gpu();
    let large_bytes = sanitizer::sized_for_tools("large batch bytes", 4 << 20, 512 << 10);
    let mut random = SplitMix64::new(0xBA7C4);
    for pattern in Pattern::ALL {
        let mut splitter = splitter(&backend, pattern);
        for documents in [1usize, 2, 10, 100, 1_000] {
            let batch: Vec<Vec<u8>> = (0..documents)
                .map(|index| {
                    if random.chance(1, 6) {
                        Vec::new()
                    } else {
                        let shape = Shape::ALL[index % Shape::ALL.len()];
                        generate(shape, random.below(2_048) as usize + 1, random.next_u64())
                    }
                })
                .collect();
            check(&mut splitter, &batch, &format!("{documents} documents"));
        }
        let mut crowded = vec![Vec::new(); 50_000];
        crowded.push(b"Hello  world 12345".to_vec());
        crowded.extend(vec![Vec::new(); 50_000]);
        crowded.push(b"'s DON'T".to_vec());
        crowded.push(b"\n\n  x".to_vec());
        check(&mut splitter, &crowded, "100,000 empty documents");
        let large = generate(Shape::Prose, large_bytes, 7);
        check(
            &mut splitter,
            &cut(&large, 7),
            &format!("{large_bytes} bytes in documents"),
        );
    }
}

/// Locks out state one run leaves for the next: 300 runs on one device
/// alternating patterns, sizes, eager and graph, each checked (the status words
/// and counters a run leaves must be clean, or the next run's blocks take the
/// wrong places or wait forever); and a small geometry (16 threads of 2 bytes:
/// 8,192 blocks for 256 KiB, so the look-backs walk many rounds).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_split_repeated_runs_leave_no_state() {
    let backend = gpu();
    let mut splitters: Vec<BatchSplitter> = Pattern::ALL
        .iter()
        .map(|&pattern| splitter(&backend, pattern))
        .collect();
    let mut random = SplitMix64::new(0x5747E);
    for round in 0..sanitizer::sized_for_tools("rounds", 300, 60) {
        let splitter = &mut splitters[round % 3];
        let bytes = [1usize, 100, 5_000, 70_000][random.below(4) as usize];
        let text = generate(Shape::ALL[round % 3], bytes, round as u64);
        let documents = cut(&text, round as u64);
        check(splitter, &documents, &format!("round {round}"));
    }
    let small_geometry_bytes = sanitizer::sized_for_tools("small-geometry bytes", 262_144, 32_768);
    let small = Geometry {
        workgroup_size: 16,
        bytes_per_thread: 2,
        compact_workgroups: 1,
    };
    for pattern in Pattern::ALL {
        let programs = SplitPrograms::build(pattern, small).expect("geometry");
        let mut splitter = BatchSplitter::new(&backend, programs).expect("splitter");
        for shape in Shape::ALL {
            let text = generate(shape, small_geometry_bytes, 5);
            check(
                &mut splitter,
                &cut(&text, 5),
                &format!("{shape}, 32-byte blocks"),
            );
        }
    }
}
