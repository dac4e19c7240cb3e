//! GPU tests of the device encoder: its ids must be the CPU encoder's (which
//! `tests/encode.rs` holds to tiktoken-rs and bpe-openai) and tiktoken-rs's on
//! valid UTF-8, for all four encodings, on the corpus, 2,000 random strings per
//! encoding, 100 KiB runs, the three shapes, documents cut inside runs, and
//! batches of 1 to 1,000 documents with empty ones, encoded eagerly,
//! submitted and as a graph. Every encode splits on the device (the pattern's
//! batch split between `stage` and the BPE steps).
//! Ignored by default; run on the GPU machine (`cargo test --release -p
//! vyre-tokenizer --test gpu_encode -- --ignored`). This binary links
//! tiktoken-rs but not bpe-openai (about 50 MB of tables), so it stays small
//! enough for the trip to the GPU machine. Under compute-sanitizer
//! (`VYRE_UNDER_SANITIZER=1`) the largest draws shrink, each test says to what
//! (the root crate's `tests/support/sanitizer.rs` says why).

#[path = "support/device_batches.rs"]
mod device_batches;
mod oracle;
#[path = "../../tests/support/sanitizer.rs"]
mod sanitizer;
mod split_corpus;

use device_batches::{
    batch_with_empty_documents, batches_with_prose, check_batch, check_batch_ids,
    device_piece_starts, documents_cut_inside_runs, long_piece_texts, random_texts,
    small_split_geometry, with_fused_steps_in_32_threads, SHORT_UP_TO_ITS_LIMIT, STEP_BY_STEP,
};
use sanitizer::{sized_for_tools, under_sanitizer};
use vyre_cuda::backend::{AnyBackend, CudaBackend};
use vyre_tokenizer::device::pipeline::{
    COPY_ENGINE_FROM, HAND_OUT_HELPERS, HELPED_FROM_TEXT_BYTES, TEXT_COPY_ENGINE_FROM,
};
use vyre_tokenizer::device::programs::BULK_SPLIT_FROM_BYTES;
use vyre_tokenizer::device::{
    BatchIds, BoundsChecks, BulkSplit, ChunkLimits, DeviceEncoder, Geometry, ShortText,
};
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::{Backend, Encoding, Tokenizer, AUTO_GPU_MIN_BYTES};

/// The CPU tokenizer of `encoding` and its device encoder on CUDA device 0; a
/// missing device is a failure.
fn cpu_and_device(encoding: Encoding) -> (Tokenizer, Tokenizer) {
    let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
    let gpu = cpu
        .clone()
        .with_backend(Backend::Gpu)
        .unwrap_or_else(|error| panic!("gpu test needs a CUDA device: {error}"));
    (cpu, gpu)
}

/// The device encoder of `cpu`'s encoding on CUDA device 0 with `geometry` and
/// `limits`; a missing device is a failure.
fn cuda_encoder(cpu: &Tokenizer, geometry: Geometry, limits: ChunkLimits) -> DeviceEncoder {
    let gpu = CudaBackend::acquire()
        .unwrap_or_else(|error| panic!("gpu test needs a CUDA device: {error}"));
    DeviceEncoder::with_geometry(AnyBackend::Cuda(gpu), cpu, geometry, limits)
        .unwrap_or_else(|error| panic!("device encoder at {geometry:?}: {error}"))
}

fn device(gpu: &Tokenizer) -> &DeviceEncoder {
    gpu.device_encoder()
        .expect("Backend::Gpu has a device encoder")
}

fn tiktoken(encoding: Encoding) -> &'static tiktoken_rs::CoreBPE {
    match encoding {
        Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
        Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        _ => tiktoken_rs::o200k_base_singleton(),
    }
}

/// Locks out any device id that differs from the CPU encoder or tiktoken-rs on
/// the corpus (one batch per encoding, invalid UTF-8 included; valid texts
/// also against tiktoken-rs), the three shapes at 262,144 bytes (eager and as
/// a graph; 32,768 under compute-sanitizer), and through `Tokenizer::encode`
/// with every special token allowed (every twentieth text under compute-sanitizer).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_ids_equal_cpu_and_tiktoken_on_corpus_and_shapes() {
    let corpus = split_corpus::corpus(oracle::corpus());
    let shape_bytes = sized_for_tools("shape bytes", 262_144, 32_768);
    // Each text alone is one encode of its own, a few launches: under the tools,
    // whose every launch costs tens of milliseconds, every twentieth.
    let stride = sized_for_tools("one text alone in every", 1, 20);
    for encoding in Encoding::ALL {
        let (cpu, gpu) = cpu_and_device(encoding);
        let encoder = device(&gpu);
        check_batch(encoder, &cpu, &corpus, "corpus");
        let refs: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        let ids = encoder.encode_batch_bytes(&refs).unwrap();
        let specials: Vec<&str> = cpu
            .special_tokens()
            .iter()
            .map(|t| t.text.as_str())
            .collect();
        for (index, text) in corpus.iter().enumerate() {
            if let Ok(text) = std::str::from_utf8(text) {
                assert_eq!(
                    ids[index],
                    tiktoken(encoding).encode_ordinary(text),
                    "tiktoken-rs, corpus {index}"
                );
                if index % stride != 0 {
                    continue;
                }
                assert_eq!(
                    gpu.encode(text, &specials).unwrap(),
                    cpu.encode(text, &specials).unwrap()
                );
            }
        }
        for shape in Shape::ALL {
            let text = generate(shape, shape_bytes, 42);
            let expected = cpu.encode_ordinary_bytes(&text);
            assert_eq!(
                encoder.encode_batch_bytes(&[&text]).unwrap()[0],
                expected,
                "{} {shape}",
                encoding.name()
            );
            let mut graph = encoder.graph(text.len()).unwrap();
            assert_eq!(
                graph.encode(&text).unwrap(),
                expected,
                "{} {shape} graph",
                encoding.name()
            );
            let valid = std::str::from_utf8(&text).unwrap();
            assert_eq!(
                expected,
                tiktoken(encoding).encode_ordinary(valid),
                "{} {shape} tiktoken-rs",
                encoding.name()
            );
        }
    }
}

/// Locks out a device split that disagrees with each document split alone:
/// documents cut inside every kind of run, with empty documents between them
/// and long runs across many of the split's workgroups, equal the CPU encoder
/// on all four encodings, at the default geometry and with the split's blocks
/// at 32 bytes, and the piece count the device split left for the BPE steps is
/// the CPU split's of each document alone (negative control: not the count of
/// the documents joined). Prints each step's kernel time.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_document_ends_inside_runs_split_on_the_device_as_alone() {
    let documents = documents_cut_inside_runs();
    let refs: Vec<&[u8]> = documents.iter().map(Vec::as_slice).collect();
    for encoding in Encoding::ALL {
        let (cpu, gpu) = cpu_and_device(encoding);
        let small = cuda_encoder(
            &cpu,
            Geometry {
                split: small_split_geometry(),
                ..Geometry::default()
            },
            ChunkLimits::default(),
        );
        let alone = device_piece_starts(&cpu, &documents);
        let joined = device_piece_starts(&cpu, &[documents.concat()]);
        assert_ne!(alone.len(), joined.len());
        for encoder in [device(&gpu), &small] {
            check_batch(encoder, &cpu, &documents, "ends inside runs");
            let (_, timings) = encoder.encode_counted(&refs).unwrap();
            assert_eq!(
                timings.counts.unwrap().pieces as usize,
                alone.len(),
                "{}",
                encoding.name()
            );
            println!("{}: kernels µs: {}", encoding.name(), timings.kernel_line());
        }
    }
}

/// Locks out disagreements on inputs nobody wrote by hand: 2,000 random
/// strings per encoding (200 under compute-sanitizer) (every tenth damaged into invalid UTF-8) in one batch
/// equal the CPU encoder, and the valid ones tiktoken-rs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_ids_equal_cpu_and_tiktoken_on_2000_random_strings_every_encoding() {
    for encoding in Encoding::ALL {
        let (cpu, gpu) = cpu_and_device(encoding);
        let mut random = SplitMix64::new(0x6D0C + encoding as u64);
        let count = sized_for_tools("random strings", 2000, 60);
        let texts = random_texts(&mut random, count, 24);
        check_batch(device(&gpu), &cpu, &texts, "random strings");
        for text in texts
            .iter()
            .filter_map(|text| std::str::from_utf8(text).ok())
        {
            assert_eq!(
                gpu.encode_ordinary(text),
                tiktoken(encoding).encode_ordinary(text),
                "{text:?}"
            );
        }
    }
}

/// Locks out long pieces that go wrong on the device: the 100 KiB runs of
/// `split_corpus::long_runs` (letters of each case, an ideograph, spaces, tabs,
/// digits of two scripts, apostrophes, line breaks, marks), 100 KiB of digits
/// (one piece under GPT-2's pattern), runs an odd prefix puts out of step with
/// the chunks, and pieces of every length class around 384 bytes equal the
/// CPU encoder on all four encodings; with 8-byte chunks and repairs off the
/// same pieces go through the serial path and still do. Prints what the device
/// counted. (Runs of 12 KiB under compute-sanitizer.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_long_runs_and_length_classes_equal_cpu() {
    let mut random = SplitMix64::new(0x100C);
    let run_bytes = sized_for_tools("run bytes", 100 << 10, 12 << 10);
    let mut texts: Vec<(String, Vec<u8>)> = split_corpus::long_runs_of(run_bytes)
        .into_iter()
        .map(|(what, text)| (what.to_owned(), text))
        .collect();
    texts.push((
        format!("{run_bytes} bytes of digits"),
        "7".repeat(run_bytes).into_bytes(),
    ));
    texts.push((
        "x then ideographs".into(),
        format!("x{}", "日".repeat(run_bytes * 30_000 / (100 << 10))).into_bytes(),
    ));
    texts.push((
        "x then ab".into(),
        format!("x{}", "ab".repeat(run_bytes * 50_000 / (100 << 10))).into_bytes(),
    ));
    texts.extend(long_piece_texts(384, &mut random));
    let batch: Vec<Vec<u8>> = texts.iter().map(|(_, text)| text.clone()).collect();
    let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
    for encoding in Encoding::ALL {
        let (cpu, gpu) = cpu_and_device(encoding);
        let (ids, timings) = device(&gpu).encode_counted(&refs).unwrap();
        for (index, (what, text)) in texts.iter().enumerate() {
            assert_eq!(
                ids[index],
                cpu.encode_ordinary_bytes(text),
                "{} {what}",
                encoding.name()
            );
        }
        println!(
            "{}: {:?}, kernels {} µs",
            encoding.name(),
            timings.counts,
            timings.kernel_ns() / 1000
        );
        let serial = cuda_encoder(
            &cpu,
            Geometry {
                chunk_bytes: 8,
                repair_window_bytes: 32,
                repair_attempts: 0,
                ..Geometry::default()
            },
            ChunkLimits::default(),
        );
        let small: Vec<Vec<u8>> = long_piece_texts(8, &mut random)
            .into_iter()
            .map(|(_, text)| text)
            .collect();
        check_batch(&serial, &cpu, &small, "8-byte chunks, serial path");
    }
}

/// Locks out chunking, slot reuse and pipelining that lose, reorder or mix
/// documents: batches of 1 to 1,000 documents (every fourth empty) through the
/// default encoder and through one whose chunks hold at most 64 KiB and 100
/// documents (many chunks, four in flight), each document's vector and
/// through one reused `BatchIds` per encoder (larger and smaller batches in
/// turn), and a batch of 100,000 empty documents with three short ones, equal
/// the CPU encoder.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batches_of_1_to_1000_documents_with_empty_ones() {
    let (cpu, gpu) = cpu_and_device(Encoding::Cl100kBase);
    let small = cuda_encoder(
        &cpu,
        Geometry::default(),
        ChunkLimits {
            text_bytes: 64 << 10,
            documents: 100,
            ..ChunkLimits::default()
        },
    );
    let mut random = SplitMix64::new(0xBA7C4);
    let (mut ids, mut small_ids) = (BatchIds::new(), BatchIds::new());
    for count in [1, 2, 3, 10, 100, 101, 999, 1000, 101, 2] {
        let batch = batch_with_empty_documents(&mut random, count);
        check_batch(device(&gpu), &cpu, &batch, &format!("{count} documents"));
        check_batch(
            &small,
            &cpu,
            &batch,
            &format!("{count} documents, small chunks"),
        );
        check_batch_ids(
            device(&gpu),
            &cpu,
            &batch,
            &mut ids,
            &format!("{count} documents into one BatchIds"),
        );
        check_batch_ids(
            &small,
            &cpu,
            &batch,
            &mut small_ids,
            &format!("{count} documents, small chunks, into one BatchIds"),
        );
    }
    let mut empty: Vec<Vec<u8>> = vec![Vec::new(); 100_000];
    empty[0] = b"first".to_vec();
    empty[50_000] = b"middle one".to_vec();
    empty[99_999] = b"last".to_vec();
    check_batch(device(&gpu), &cpu, &empty, "100,000 mostly empty documents");
}

/// Locks out submitted encodes that interfere: two chunks submitted at once
/// (the most one thread may have pending) and waited in reverse order, and
/// eight threads sharing one tokenizer with 48 texts of many lengths (some
/// over 1 MiB; two threads and 12 texts of at most 70,000 bytes under
/// compute-sanitizer), equal the
/// CPU encoder; so does `encode_batch` of all of them.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_submitted_encodes_and_threads_equal_cpu() {
    let (cpu, gpu) = cpu_and_device(Encoding::O200kBase);
    let count = sized_for_tools("texts", 48, 12);
    let threads = sized_for_tools("threads", 8, 2);
    let largest = sized_for_tools("largest text bytes", 1_200_000, 70_000);
    let texts: Vec<String> = (0..count)
        .map(|index| {
            let shape = Shape::ALL[index % 3];
            let bytes =
                [1, 700, 4096, 70_000, 262_144, 1_200_000][index % 6].min(largest) + index / 6;
            String::from_utf8(generate(shape, bytes, index as u64)).unwrap()
        })
        .collect();
    let encoder = device(&gpu);
    let pending: Vec<_> = texts[..2]
        .iter()
        .map(|text| encoder.submit(&[text.as_str(), "", text.as_str()]).unwrap())
        .collect();
    for (index, submitted) in pending.into_iter().enumerate().rev() {
        let ids = cpu.encode_ordinary(&texts[index]);
        assert_eq!(submitted.wait().unwrap(), [ids.clone(), Vec::new(), ids]);
    }
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (cpu, gpu, texts) = (&cpu, &gpu, &texts);
            scope.spawn(move || {
                for (index, text) in texts.iter().enumerate().skip(thread % 4) {
                    assert_eq!(
                        gpu.encode(text, &[]).unwrap(),
                        cpu.encode_ordinary(text),
                        "thread {thread} text {index}"
                    );
                }
            });
        }
    });
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert_eq!(gpu.encode_batch(&refs), cpu.encode_batch(&refs));
}

/// Locks out `Backend::Auto` leaving the device idle where it runs: every
/// encoding runs texts of at least `AUTO_GPU_MIN_BYTES` on the device and
/// shorter ones on the CPU, with the CPU's ids either way.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_auto_runs_long_texts_on_the_device() {
    for encoding in Encoding::ALL {
        let cpu = Tokenizer::for_encoding(encoding).unwrap();
        let auto = cpu.clone().with_backend(Backend::Auto).unwrap();
        assert!(auto.device_name().is_some(), "Auto found no device");
        assert_eq!(auto.runs_on(AUTO_GPU_MIN_BYTES), Backend::Gpu);
        assert_eq!(auto.runs_on(AUTO_GPU_MIN_BYTES - 1), Backend::Cpu);
        let text = String::from_utf8(generate(Shape::Prose, 262_144, 7)).unwrap();
        assert_eq!(auto.encode(&text, &[]).unwrap(), cpu.encode_ordinary(&text));
    }
}

/// Locks out a batch larger than one chunk being refused: 200 MiB of
/// documents of 1 to 16 KiB (cl100k, the three shapes; 40 MiB under
/// compute-sanitizer) through the default encoder (chunks of at most 8 MiB,
/// four in flight) equal the CPU encoder's batch.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_a_batch_larger_than_a_chunk_is_cut_not_refused() {
    let (cpu, gpu) = cpu_and_device(Encoding::Cl100kBase);
    let mut random = SplitMix64::new(0x200);
    let mut texts = Vec::new();
    let mut total = 0;
    let batch_bytes = sized_for_tools("batch bytes", 200 << 20, 40 << 20);
    while total < batch_bytes {
        let bytes = 1024 + random.below(15 << 10) as usize;
        let text = String::from_utf8(generate(
            Shape::ALL[texts.len() % 3],
            bytes,
            texts.len() as u64,
        ))
        .unwrap();
        total += text.len();
        texts.push(text);
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let expected = cpu.encode_batch(&refs);
    let encoder = device(&gpu);
    let bytes: Vec<&[u8]> = refs.iter().map(|text| text.as_bytes()).collect();
    let mut results = vec![Vec::new(); bytes.len()];
    let timings = encoder.encode_batch_into(&bytes, &mut results).unwrap();
    let chunk_bytes = ChunkLimits::default().text_bytes as usize;
    assert!(
        timings.len() >= total.div_ceil(chunk_bytes),
        "{} chunks of {total} bytes",
        timings.len()
    );
    assert!(results == expected, "the 200 MiB batch differs");
}

/// Locks out a batch refused, truncated or mixed up for its size alone (offsets
/// past 32 bits of the whole batch, a chunk count that wraps, documents handed
/// to the wrong caller slot): a 2 GiB batch of cl100k documents through the
/// default encoder (171 chunks of 12 MiB), each document's ids equal to the CPU
/// encoder's ids of its text. The batch repeats 2,048 distinct documents of 1 to
/// 16 KiB (the three shapes), each at its own positions, so the host holds one
/// copy of each text and of its expected ids, and about 4 GiB of results.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_a_two_gib_batch_is_cut_into_chunks_not_refused() {
    let (cpu, gpu) = cpu_and_device(Encoding::Cl100kBase);
    let mut random = SplitMix64::new(0x2_61B);
    let distinct: Vec<Vec<u8>> = (0..2048u64)
        .map(|index| {
            let bytes = 1024 + random.below(15 << 10) as usize;
            generate(Shape::ALL[index as usize % 3], bytes, index)
        })
        .collect();
    let refs: Vec<&[u8]> = distinct.iter().map(Vec::as_slice).collect();
    let expected: Vec<Vec<u32>> = refs
        .iter()
        .map(|text| cpu.encode_ordinary_bytes(text))
        .collect();
    let mut batch: Vec<&[u8]> = Vec::new();
    let mut sources = Vec::new();
    let mut total = 0usize;
    while total < 2 << 30 {
        let source = random.below(distinct.len() as u32) as usize;
        batch.push(refs[source]);
        sources.push(source);
        total += refs[source].len();
    }
    let mut results = vec![Vec::new(); batch.len()];
    let timings = device(&gpu)
        .encode_batch_into(&batch, &mut results)
        .unwrap_or_else(|error| panic!("a 2 GiB batch ({total} bytes): {error}"));
    assert!(timings.len() >= 128, "{} chunks", timings.len());
    for (index, (got, &source)) in results.iter().zip(&sources).enumerate() {
        assert!(
            *got == expected[source],
            "document {index} of {} (distinct text {source}) differs",
            batch.len()
        );
    }
}

/// Locks out a short-text kernel that differs on the device from the steps it
/// fuses (a rewritten builtin, a workgroup buffer shared by two steps and not
/// cleared, a step reading what the one before has not yet written, a
/// look-back that waits for a group it is itself to run): 2,000 random strings
/// per encoding (24 under compute-sanitizer), one text per encode, and batches
/// of long pieces and of empty and short documents of at most 4,096 bytes, run
/// as one dispatch of the short-text kernel and equal the CPU encoder, at the
/// default geometry, with every step in 32-thread workgroups (many groups per
/// step), in the other workgroups the bench's short-text sweep measures
/// (512 and 1,024 threads; one group or several per step), and with bounds
/// checks (`BoundsChecks::Everywhere`; the default compiles the fused kernels
/// without them, so every access must be in range).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_short_texts_through_one_workgroup_equal_cpu() {
    let geometries = [
        Geometry::default(),
        checked(),
        thirty_two_threads(),
        short_text(512, 2),
        short_text(1024, 1),
        short_text(1024, 4),
    ];
    for encoding in Encoding::ALL {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        let mut random = SplitMix64::new(0x5407 + encoding as u64);
        let count = sized_for_tools("random strings", 2000, 24);
        let texts = random_texts(&mut random, count, 24);
        let mut batches: Vec<Vec<Vec<u8>>> = long_piece_texts(8, &mut random)
            .into_iter()
            .map(|(_, text)| vec![text])
            .filter(|batch| batch[0].len() <= 4096)
            .collect();
        batches.push(batch_with_empty_documents(&mut random, 40));
        for geometry in geometries {
            let encoder = cuda_encoder(&cpu, geometry, SHORT_UP_TO_ITS_LIMIT);
            assert!(encoder.runs_short(4096), "{geometry:?}");
            let what = format!(
                "short-text workgroup of {} threads × {} bytes, bounds checks {:?}",
                geometry.short_text.workgroup_size,
                geometry.short_text.bytes_per_thread,
                geometry.bounds_checks
            );
            for (index, text) in texts.iter().enumerate() {
                let mut results = [Vec::new()];
                let timings = encoder
                    .submit_bytes(&[text])
                    .and_then(|pending| pending.wait_into(&mut results))
                    .unwrap_or_else(|error| panic!("{what}, text {index}: {error}"));
                assert_eq!(
                    results[0],
                    cpu.encode_ordinary_bytes(text),
                    "{what}, text {index}: {:?}",
                    String::from_utf8_lossy(text)
                );
                if !text.is_empty() {
                    let names: Vec<&str> = timings.steps.iter().map(|step| step.name).collect();
                    assert_eq!(names, ["short"], "{what}, text {index}");
                }
            }
            for (index, batch) in batches.iter().enumerate() {
                check_batch(&encoder, &cpu, batch, &format!("{what}, batch {index}"));
            }
        }
    }
}

/// Locks out a resident-grid kernel that differs on the device from the steps
/// it fuses (a grid sync that does not hold every workgroup until the step
/// before is done everywhere, a look-back that waits for a group its own
/// workgroup is to run in a later round, a co-residency limit that the driver
/// refuses or that deadlocks the grid sync, `stage` or `pieces` striding over
/// another grid than the one launched): on all four encodings the three shapes
/// at 5 KiB, 64 KiB, 256 KiB and 1 MiB, batches of random strings (of more
/// than 4 KiB each), of long pieces and of empty documents, run as one
/// `resident` dispatch and equal the CPU encoder, with the grid as the text
/// asks, capped at 7 workgroups (many rounds of each step), at 32-thread
/// workgroups (many groups per round) and with bounds checks (the default
/// compiles the fused kernels without them).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_resident_grid_equals_cpu() {
    let geometries = [
        Geometry::default(),
        Geometry {
            resident_workgroups: Some(7),
            ..Geometry::default()
        },
        thirty_two_threads(),
        checked(),
    ];
    for encoding in Encoding::ALL {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        let mut random = SplitMix64::new(0x7e51 + encoding as u64);
        let count = sized_for_tools("random strings", 2000, 200);
        let texts = random_texts(&mut random, count, 24);
        let mut batches: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut batch: Vec<Vec<u8>> = Vec::new();
        for text in texts {
            batch.push(text);
            if batch.iter().map(Vec::len).sum::<usize>() > 16 << 10 {
                batches.push(std::mem::take(&mut batch));
            }
        }
        let mut long_pieces: Vec<Vec<u8>> = long_piece_texts(8, &mut random)
            .into_iter()
            .map(|(_, text)| text)
            .collect();
        long_pieces.extend(batch_with_empty_documents(&mut random, 400));
        // Past the short-text kernel's limit whatever the pieces' lengths.
        long_pieces.push(generate(Shape::Code, 5 << 10, 41));
        batches.push(long_pieces);
        let sizes: &[usize] = if under_sanitizer() {
            &[5 << 10, 64 << 10]
        } else {
            &[5 << 10, 64 << 10, 256 << 10, 1 << 20]
        };
        for &bytes in sizes {
            for shape in Shape::ALL {
                batches.push(vec![generate(shape, bytes, 43)]);
            }
        }
        // Past the default limit: 1 MiB asks for more workgroups than an H200
        // holds at once, so every workgroup runs several rounds.
        let limits = ChunkLimits {
            resident_text_bytes: 1 << 20,
            ..ChunkLimits::default()
        };
        for geometry in geometries {
            let encoder = cuda_encoder(&cpu, geometry, limits);
            let what = format!(
                "split {} threads × {} bytes, resident grid {:?}, bounds checks {:?}",
                geometry.split.workgroup_size,
                geometry.split.bytes_per_thread,
                geometry.resident_workgroups,
                geometry.bounds_checks
            );
            for (index, batch) in batches.iter().enumerate() {
                let bytes: usize = batch.iter().map(Vec::len).sum();
                assert!(
                    encoder.runs_resident(bytes as u64),
                    "{what}, batch {index}: {bytes} bytes"
                );
                let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
                let mut results = vec![Vec::new(); refs.len()];
                let timings = encoder
                    .submit_bytes(&refs)
                    .and_then(|pending| pending.wait_into(&mut results))
                    .unwrap_or_else(|error| panic!("{what}, batch {index}: {error}"));
                let names: Vec<&str> = timings.steps.iter().map(|step| step.name).collect();
                assert_eq!(names, ["resident"], "{what}, batch {index}");
                for (document, (got, text)) in results.iter().zip(batch).enumerate() {
                    assert_eq!(
                        *got,
                        cpu.encode_ordinary_bytes(text),
                        "{what}, batch {index}, document {document}"
                    );
                }
            }
        }
    }
}

/// The default geometry with every kernel compiled with bounds checks.
fn checked() -> Geometry {
    Geometry {
        bounds_checks: BoundsChecks::Everywhere,
        ..Geometry::default()
    }
}

/// Every step, the fused kernels' included, in workgroups of 32 threads, the
/// split's taking 2 bytes each: many groups per step.
fn thirty_two_threads() -> Geometry {
    with_fused_steps_in_32_threads(Geometry {
        workgroup_size: 32,
        chunk_bytes: 8,
        repair_window_bytes: 32,
        compact_workgroups: 3,
        ..Geometry::default()
    })
}

/// The default geometry with the short-text kernel in workgroups of
/// `workgroup_size` threads, the split's taking `bytes_per_thread` bytes each.
fn short_text(workgroup_size: u32, bytes_per_thread: u32) -> Geometry {
    Geometry {
        short_text: ShortText {
            workgroup_size,
            bytes_per_thread,
            ..ShortText::default()
        },
        ..Geometry::default()
    }
}

/// `cpu`'s device encoder on CUDA device 0 at `geometry`, every step its own
/// dispatch.
fn step_by_step_encoder(cpu: &Tokenizer, geometry: Geometry) -> DeviceEncoder {
    cuda_encoder(cpu, geometry, STEP_BY_STEP)
}

/// Locks out a striding `pieces` that loses, repeats or misplaces pieces on
/// the device past the first pass of its grid (a tile loop that stops early or
/// steps wrong, or a race on the workgroup word that hands a tile's merge-list
/// entries out: the last thread writes tile `k + 2`'s word while slower warps
/// may still read tile `k`'s, which the reference interpreter cannot show): on
/// every encoding, 256-thread workgroups of `pieces` on 1 and 5 workgroups and
/// 32-thread ones on 3, the three shapes at 64 KiB (8 KiB under
/// compute-sanitizer), long pieces and a batch with empty documents, each step
/// its own dispatch, equal the CPU encoder; the device counts show more pieces
/// than one pass of the grid takes.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_pieces_past_one_pass_of_the_grid_equal_cpu() {
    let small = Geometry {
        workgroup_size: 32,
        chunk_bytes: 8,
        repair_window_bytes: 32,
        pieces_workgroups: 3,
        split: small_split_geometry(),
        ..Geometry::default()
    };
    let geometries = [
        Geometry {
            pieces_workgroups: 1,
            ..Geometry::default()
        },
        Geometry {
            pieces_workgroups: 5,
            ..Geometry::default()
        },
        small,
    ];
    let bytes = sized_for_tools("shape bytes", 64 << 10, 8 << 10);
    // Prose in every batch: more pieces than one pass of every grid above.
    let batches = batches_with_prose(
        &mut SplitMix64::new(0x9_1EC6),
        [bytes, bytes],
        23,
        &[384, 8],
        200,
    );
    for encoding in Encoding::ALL {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        for geometry in geometries {
            let encoder = step_by_step_encoder(&cpu, geometry);
            let one_pass = geometry.pieces_workgroups * geometry.workgroup_size;
            for (index, batch) in batches.iter().enumerate() {
                let what = format!(
                    "{} workgroups of {} threads, batch {index}",
                    geometry.pieces_workgroups, geometry.workgroup_size
                );
                check_batch(&encoder, &cpu, batch, &what);
                let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
                let (_, timings) = encoder.encode_counted(&refs).unwrap();
                let counts = timings.counts.expect("counts were asked for");
                assert!(counts.pieces > one_pass, "{what}: {counts:?}");
            }
        }
    }
}

/// Locks out large chunks that do not take the bulk split on a device that can
/// hold its workgroups (the default's 1,024 threads × 8 bytes need more than
/// the static 48 KiB of workgroup memory: the device's opt-in limit), and ids that depend on
/// which split shape a chunk ran: on the H200 the default encoder takes the
/// bulk split from [`BULK_SPLIT_FROM_BYTES`] on; for r50k (one split step) and cl100k (two), one
/// chunk of documents just below, at and above that size, eager and (above) as
/// a graph, equals the CPU encoder. Under compute-sanitizer the bulk split
/// starts at 256 KiB instead (the chunks shrink with it).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_chunks_from_the_bulk_size_take_the_bulk_split_and_equal_cpu() {
    let from_bytes = sized_for_tools(
        "bulk split bytes",
        BULK_SPLIT_FROM_BYTES as usize,
        256 << 10,
    );
    let geometry = Geometry {
        bulk_split: Some(BulkSplit {
            from_bytes: from_bytes as u64,
            ..BulkSplit::default()
        }),
        ..Geometry::default()
    };
    for encoding in [Encoding::R50kBase, Encoding::Cl100kBase] {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        // The resident-grid kernel off: under the sanitizer the bulk size is
        // one it would take.
        let limits = ChunkLimits {
            resident_text_bytes: 0,
            ..ChunkLimits::default()
        };
        let encoder = cuda_encoder(&cpu, geometry, limits);
        assert!(
            encoder.runs_bulk(from_bytes as u64) && !encoder.runs_bulk(from_bytes as u64 - 1),
            "the device did not take the bulk split from {from_bytes} bytes"
        );
        for (bytes, seed) in [
            (from_bytes - 1, 31),
            (from_bytes, 32),
            (from_bytes + 4093, 33),
        ] {
            // Documents of the three shapes, 1 to 16 KiB, then one that ends the
            // chunk at exactly `bytes` bytes.
            let mut random = SplitMix64::new(seed);
            let mut documents = Vec::new();
            let mut total = 0;
            while total < bytes {
                let length = (1024 + random.below(15 << 10) as usize).min(bytes - total);
                documents.push(generate(Shape::ALL[documents.len() % 3], length, seed));
                total += length;
            }
            check_batch(
                &encoder,
                &cpu,
                &documents,
                &format!("a chunk of {bytes} bytes"),
            );
        }
        let text = generate(Shape::Code, from_bytes + 4093, 34);
        let mut graph = encoder.graph(text.len()).unwrap();
        assert_eq!(
            graph.encode(&text).unwrap(),
            cpu.encode_ordinary_bytes(&text),
            "{}: the bulk split's graph",
            encoding.name()
        );
    }
}

/// Locks out capped `stage` and `compact` grids that lose, repeat or misplace
/// ids on the device (a stage cap that leaves the text's tail or the document
/// ends unstaged; an aligned copy in `compact` that overwrites the ids before
/// `running`, drops the ones past `4 · W`, or races with another workgroup's
/// block on the line they share, which the reference interpreter, running
/// workgroups one after another, cannot show): on every encoding, 256-thread
/// workgroups with `stage_workgroups` and `compact_workgroups` of 1, 5 and 24,
/// the three shapes at 56 KiB, long pieces and a batch with empty documents,
/// each step its own dispatch, equal the CPU encoder; every batch's text takes
/// more than one pass of the capped `stage` (its 8-byte words past
/// `8 · 256 · 24` bytes), and of `compact` (blocks of 1 KiB: more than 24 of
/// them), and fits a slot below `TEXT_COPY_ENGINE_FROM` (whose text `stage`
/// reads from host-mapped memory under the cap; a larger slot's comes up by
/// DMA and its `stage` takes an uncapped grid).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_capped_stage_and_compact_grids_equal_cpu() {
    let bytes = 56 << 10;
    let batches = batches_with_prose(
        &mut SplitMix64::new(0xCA_96),
        [bytes, bytes],
        25,
        &[384, 8],
        200,
    );
    for encoding in Encoding::ALL {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        for workgroups in [1, 5, 24] {
            let geometry = Geometry {
                stage_workgroups: workgroups,
                compact_workgroups: workgroups,
                ..Geometry::default()
            };
            let encoder = step_by_step_encoder(&cpu, geometry);
            let one_pass = 8 * (workgroups * geometry.workgroup_size) as usize;
            for (index, batch) in batches.iter().enumerate() {
                let text_len: usize = batch.iter().map(Vec::len).sum();
                assert!(
                    text_len > one_pass
                        && text_len > (workgroups * geometry.block_bytes()) as usize
                        && (text_len as u64).next_power_of_two() < TEXT_COPY_ENGINE_FROM,
                    "batch {index}: {text_len} bytes"
                );
                let what = format!("{workgroups} workgroups of stage and compact, batch {index}");
                check_batch(&encoder, &cpu, batch, &what);
            }
        }
    }
}

/// Locks out ids that still cross PCIe as `compact`'s stores (holding the SMs
/// the other chunks' steps need) in chunks from `COPY_ENGINE_FROM` (1 MiB), text
/// that a kernel still reads across PCIe in chunks from `TEXT_COPY_ENGINE_FROM`
/// (512 KiB), and small chunks that take a larger chunk's slot and pay its
/// copies: submitting a 2 MiB encode makes one async copy (the text's DMA) and
/// waiting for it one more, the ids' (by the copy engine, into host-mapped
/// memory), and the ids equal the CPU encoder's; then, on the same encoder, a
/// 512 KiB encode's text goes up by DMA but its wait makes no copy (its
/// `compact` stores into host-mapped memory), and a 128 KiB encode makes none
/// at all (`stage` reads its host-mapped text): each got a slot of its own
/// kind, although the larger ones were idle and large enough. The same
/// 128 KiB encode through the resident grid's one cooperative launch makes no
/// copy either: its grid barrier's words, which the backend audits, come back
/// in the kernel's result area, not by a copy of their own.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_large_chunks_bring_their_ids_up_by_the_copy_engine() {
    let cpu = Tokenizer::for_encoding(Encoding::Cl100kBase).expect("built-in encoding");
    let step_by_step = cuda_encoder(
        &cpu,
        Geometry::default(),
        ChunkLimits {
            resident_text_bytes: 0,
            ..ChunkLimits::default()
        },
    );
    let resident = cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default());
    for (encoder, bytes, text_copies, id_copies) in [
        (&step_by_step, COPY_ENGINE_FROM as usize * 2, 1, 1),
        (&step_by_step, 512 << 10, 1, 0),
        (&step_by_step, 128 << 10, 0, 0),
        (&resident, 128 << 10, 0, 0),
    ] {
        assert_eq!(
            (
                bytes as u64 >= TEXT_COPY_ENGINE_FROM,
                bytes as u64 >= COPY_ENGINE_FROM
            ),
            (text_copies == 1, id_copies == 1),
            "{bytes} bytes"
        );
        let text = generate(Shape::Prose, bytes, 11);
        let expected = cpu.encode_ordinary_bytes(&text);
        for round in 0..2 {
            let before = vyre_cuda::backend::thread_driver_calls();
            let pending = encoder.submit_bytes(&[&text]).unwrap();
            let submitted = vyre_cuda::backend::thread_driver_calls();
            let ids = pending.wait().unwrap();
            let waited = vyre_cuda::backend::thread_driver_calls().since(&submitted);
            let submitted = submitted.since(&before);
            assert_eq!(ids[0], expected, "{bytes} bytes");
            assert_eq!(
                (submitted.async_copies, waited.async_copies),
                (text_copies, id_copies),
                "{bytes} bytes, round {round}: submitted {submitted:?}, waited {waited:?}"
            );
        }
    }
}

/// Locks out an eager chunk of a fused kernel whose replay of its slot's
/// graph differs on the device from the dispatch (a kernel node left with an
/// earlier chunk's length, documents or grid; the text of a 256 KiB slot,
/// which the graph uploads from its own input slot, read past its end or from
/// the slot's pinned staging; a host-mapped buffer written or read past the
/// graph that holds it; a `BatchIds` part taking an ids buffer a graph still
/// writes), and a short-text chunk submitted alone that replays: on cl100k and
/// o200k at the default limits, lengths from 4,097 bytes to 256 KiB (140 KiB
/// after 250 KiB in one slot), three documents, the short-text kernel
/// (submitted, and replayed as a batch of one chunk, in turn with resident
/// chunks) and the steps on the same slots, `BatchIds` between replays, all
/// equal the CPU; negative control: the same encoder with
/// `with_fused_graphs(false)` replays nothing, same ids.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_eager_fused_chunks_replay_their_slots_graph() {
    for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        let encoder = || cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default());
        device_batches::assert_fused_chunks_replay_their_slots_graph(
            &encoder(),
            &encoder().with_fused_graphs(false),
            &cpu,
            (
                &[
                    8 << 10,
                    4097,
                    64 << 10,
                    250 << 10,
                    140 << 10,
                    256 << 10,
                    20 << 10,
                ],
                1000,
                300 << 10,
            ),
        );
    }
}

/// Locks out a crew of hand-out helpers that misplaces a byte of the staging
/// or an id of the hand-out on the device's real buffers (host-mapped ids, a
/// graph's pinned input slot), and a resident kernel that reads its 256 KiB
/// text wrong across PCIe: documents of 100–256 KiB of each shape, encoded
/// back to back (so the crew lingers from one encode into the next's
/// staging) eagerly into new and reused vectors, into a `BatchIds` and through
/// a graph into a reused vector, at the defaults (three helpers, the text of
/// every slot read across PCIe, the graph's too) with the text gathered
/// while the kernel runs and read as each piece's ready flag goes up
/// (`with_text_fed(true)`, the default), equal the CPU encoder, and so do
/// three documents of 80 KiB in one chunk (their ends written before the
/// launch, their text fed); the controls gather the text before the launch,
/// and have no helpers and every slot's text going up by DMA.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_helped_copies_and_mapped_text_equal_cpu() {
    let cpu = Tokenizer::for_encoding(Encoding::Cl100kBase).expect("built-in encoding");
    let texts: Vec<Vec<u8>> = [100 << 10, 200_000, 256 << 10]
        .into_iter()
        .flat_map(|bytes| Shape::ALL.map(|shape| generate(shape, bytes, bytes as u64)))
        .collect();
    const { assert!(TEXT_COPY_ENGINE_FROM > 256 << 10 && HAND_OUT_HELPERS == 3) };
    for (helpers, text_copy_engine_from, fed) in [
        (HAND_OUT_HELPERS, TEXT_COPY_ENGINE_FROM, true),
        (HAND_OUT_HELPERS, TEXT_COPY_ENGINE_FROM, false),
        (0, 64 << 10, true),
    ] {
        let encoder = cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default())
            .with_hand_out_helpers(helpers, HELPED_FROM_TEXT_BYTES)
            .with_text_copy_engine_from(text_copy_engine_from)
            .expect("a copy-engine threshold within the limit")
            .with_text_fed(fed);
        let label = |what: &str| {
            format!(
                "{helpers} helpers, text by DMA from {text_copy_engine_from}, fed {fed}: {what}"
            )
        };
        let documents: Vec<&[u8]> = texts[..3].iter().map(|text| &text[..80 << 10]).collect();
        let expected: Vec<Vec<u32>> = documents
            .iter()
            .map(|document| cpu.encode_ordinary_bytes(document))
            .collect();
        assert!(
            encoder.encode_batch_bytes(&documents).unwrap() == expected,
            "{}",
            label("three documents in one chunk")
        );
        let mut reused = [Vec::new()];
        let mut in_place = BatchIds::new();
        for text in &texts {
            let ids = cpu.encode_ordinary_bytes(text);
            for _ in 0..3 {
                let fresh = encoder.submit_bytes(&[text]).unwrap().wait().unwrap();
                assert!(fresh[0] == ids, "{}", label("a new vector"));
                encoder
                    .submit_bytes(&[text])
                    .unwrap()
                    .wait_into(&mut reused)
                    .unwrap();
                assert!(reused[0] == ids, "{}", label("a reused vector"));
                encoder.encode_batch_ids(&[text], &mut in_place).unwrap();
                assert!(in_place.get(0) == Some(&ids[..]), "{}", label("BatchIds"));
            }
            let mut graph = encoder.graph(text.len()).unwrap();
            for _ in 0..3 {
                graph.encode_into(text, &mut reused[0]).unwrap();
                assert!(reused[0] == ids, "{}", label("a graph"));
            }
        }
    }
    let refused = cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default())
        .with_text_copy_engine_from(COPY_ENGINE_FROM + 1)
        .unwrap_err();
    assert!(refused.message().starts_with("Fix:"), "{refused}");
}

/// Locks out flat batch ids that the copy engine puts in the wrong place, that
/// a reused result shows from an earlier batch, or that differ from the CPU
/// encoder: batches of prose, CJK and code documents of 1–16 KiB cut into
/// chunks of at most 2 MiB (each from `COPY_ENGINE_FROM`, so its ids come down
/// by the copy engine straight into the result's pinned memory, and a last
/// chunk below it, whose ids the device writes into host-mapped memory) go
/// into one `BatchIds`, larger, smaller and larger again, and every document's
/// ids equal the CPU encoder's; `Tokenizer::encode_batch_ids` on the device
/// gives the same. Negative control: the two batches' first documents differ,
/// so a part kept from the first batch would fail the second's check.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_ids_come_down_into_pinned_memory_and_equal_cpu() {
    let (cpu, gpu) = cpu_and_device(Encoding::Cl100kBase);
    let encoder = cuda_encoder(
        &cpu,
        Geometry::default(),
        ChunkLimits {
            text_bytes: 2 * COPY_ENGINE_FROM,
            ..ChunkLimits::default()
        },
    );
    let total = sized_for_tools("batch bytes", 7 << 20, 9 << 19);
    let mut random = SplitMix64::new(0x1D5);
    let batch = |bytes: usize, random: &mut SplitMix64| -> Vec<Vec<u8>> {
        let mut texts = Vec::new();
        let mut held = 0;
        while held < bytes {
            let shape = Shape::ALL[texts.len() % Shape::ALL.len()];
            let len = 1024 + (random.next_u64() % (15 * 1024)) as usize;
            texts.push(generate(shape, len, random.next_u64()));
            held += len;
        }
        texts
    };
    let large = batch(total, &mut random);
    let smaller = batch(total / 3 + 12_345, &mut random);
    assert_ne!(large[0], smaller[0], "negative control");
    let chunks = encoder.chunks(&large.iter().map(Vec::as_slice).collect::<Vec<_>>());
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    let mut ids = BatchIds::new();
    for (round, texts) in [&large, &smaller, &large].into_iter().enumerate() {
        check_batch_ids(&encoder, &cpu, texts, &mut ids, &format!("round {round}"));
    }
    let strings: Vec<&str> = smaller
        .iter()
        .map(|text| std::str::from_utf8(text).unwrap())
        .collect();
    gpu.encode_batch_ids(&strings, &mut ids);
    assert!(
        ids.to_vecs() == cpu.encode_batch(&strings),
        "Tokenizer::encode_batch_ids"
    );
}

/// Locks out batch ids of small chunks that a later encode overwrites (a part
/// that reads its chunk's host-mapped ids in place while the slot keeps writing
/// there, instead of taking the buffer and giving the slot another) or that the
/// buffers' exchange loses: on one encoder, one 256 KiB document (one chunk
/// below `COPY_ENGINE_FROM`, the resident grid), then a batch of 200 short and
/// empty documents (the short-text kernel's and step-by-step sizes), each
/// encoded into two `BatchIds` in turn, again and again with other texts;
/// after every encode both results still hold their own texts' ids, equal to
/// the CPU encoder's. Negative control: the texts of consecutive encodes
/// differ, so a result showing another's ids fails its check.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_batch_ids_of_small_chunks_keep_their_memory_and_equal_cpu() {
    let cpu = Tokenizer::for_encoding(Encoding::Cl100kBase).expect("built-in encoding");
    let encoder = cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default());
    let mut random = SplitMix64::new(0xB1D5);
    let mut texts_of = |round: usize| -> Vec<Vec<u8>> {
        match round % 3 {
            0 => vec![generate(
                Shape::ALL[round / 3 % 3],
                256 << 10,
                random.next_u64(),
            )],
            1 => batch_with_empty_documents(&mut random, 200),
            _ => vec![generate(Shape::Cjk, (200 << 10) + round, random.next_u64())],
        }
    };
    let expected_of = |texts: &[Vec<u8>]| -> Vec<Vec<u32>> {
        texts
            .iter()
            .map(|text| cpu.encode_ordinary_bytes(text))
            .collect()
    };
    let mut results = [BatchIds::new(), BatchIds::new()];
    let mut expected: [Vec<Vec<u32>>; 2] = [Vec::new(), Vec::new()];
    for round in 0..12 {
        let texts = texts_of(round);
        let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        assert!(
            encoder.chunks(&refs).len() == 1
                && refs.iter().map(|text| text.len() as u64).sum::<u64>() < COPY_ENGINE_FROM,
            "round {round}: one chunk below COPY_ENGINE_FROM"
        );
        let which = round % 2;
        encoder
            .encode_batch_ids(&refs, &mut results[which])
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        let now = expected_of(&texts);
        assert_ne!(now, expected[which], "negative control, round {round}");
        expected[which] = now;
        for (index, (result, expected)) in results.iter().zip(&expected).enumerate() {
            assert!(
                result.to_vecs() == *expected,
                "round {round}: result {index} lost its ids"
            );
        }
    }
}

/// Locks out fused kernels whose step clocks are not the device's nanoseconds
/// inside the kernel (missing, misnamed, out of order, or on another clock than
/// the kernel's own stamps): on r50k and cl100k, a 1 KiB text (the short-text
/// kernel) and a 64 KiB text (the resident grid) of each shape, counted, give
/// the CPU encoder's ids and one clock per step, named as the encoder's steps,
/// the first past 0, none before the one before it, the last within the
/// kernel's own stamps (earliest block start to latest block end, on the same
/// `%globaltimer`) plus a 32 ns tick at each end.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_fused_step_clocks_divide_the_kernel() {
    for encoding in [Encoding::R50kBase, Encoding::Cl100kBase] {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        let encoder = cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default());
        for (bytes, kernel) in [(1 << 10, "short"), (64 << 10, "resident")] {
            for shape in Shape::ALL {
                let what = format!("{} {shape} {bytes} bytes", encoding.name());
                let text = generate(shape, bytes, 81);
                let (ids, timings) = encoder.encode_counted(&[&text]).unwrap();
                assert_eq!(ids[0], cpu.encode_ordinary_bytes(&text), "{what}");
                let names: Vec<&str> = timings.steps.iter().map(|step| step.name).collect();
                assert_eq!(names, [kernel], "{what}");
                let clocks = &timings.step_clocks;
                let clock_names: Vec<&str> = clocks.iter().map(|clock| clock.name).collect();
                assert_eq!(clock_names, encoder.step_names(), "{what}: {clocks:?}");
                let window = timings.steps[0].timings.kernel_stamps_ns;
                assert!(
                    clocks[0].end > 0
                        && clocks.windows(2).all(|pair| pair[0].end <= pair[1].end)
                        && clocks[clocks.len() - 1].end <= window + 64,
                    "{what}: {clocks:?} in a kernel of {window} ns"
                );
            }
        }
    }
}

/// Locks out a graph's ids read in place from the wrong memory: from the
/// slot's device-memory ids where the copy engine brings them into pinned
/// staging (texts from `COPY_ENGINE_FROM`), from the host-mapped ids before the
/// replay wrote them, or from the previous replay's; and a short text's graph
/// that replays a stale text (written where its kernel does not read it):
/// graphs of 1 KiB (the short-text kernel alone, reading the text in place
/// from host-mapped staging), 256 KiB (the resident grid's one cooperative
/// kernel after the text's upload, ids in host-mapped memory) and 1.5 MiB
/// (every step its own node, ids by the copy engine), each replayed
/// with three texts of its length in turn (two shapes, then the first again),
/// every slice equal to the CPU encoder's ids and to `encode_into`'s.
/// Negative control: consecutive texts have other ids, so a stale slice or a
/// stale text fails its check.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_ids_read_in_place_equal_cpu() {
    let cpu = Tokenizer::for_encoding(Encoding::Cl100kBase).expect("built-in encoding");
    let encoder = cuda_encoder(&cpu, Geometry::default(), ChunkLimits::default());
    let large = sized_for_tools("the large graph's text", 3 << 19, 1 << 20);
    assert!(large as u64 >= COPY_ENGINE_FROM);
    for bytes in [1 << 10, 256 << 10, large] {
        let texts = [
            generate(Shape::Prose, bytes, 71),
            generate(Shape::Cjk, bytes, 72),
            generate(Shape::Prose, bytes, 71),
        ];
        let mut graph = encoder.graph(bytes).unwrap();
        assert_eq!(
            graph.dispatches() == 1,
            encoder.runs_short(bytes as u64) || encoder.runs_resident(bytes as u64),
            "{bytes} bytes: {} dispatches",
            graph.dispatches()
        );
        let mut copied = Vec::new();
        let mut before: Option<Vec<u32>> = None;
        for (index, text) in texts.iter().enumerate() {
            let expected = cpu.encode_ordinary_bytes(text);
            if let Some(before) = &before {
                assert_ne!(
                    *before, expected,
                    "negative control, {bytes} bytes, text {index}"
                );
            }
            let (in_place, _) = graph.encode_in_place(text).unwrap();
            assert!(
                in_place == &expected[..],
                "{bytes} bytes, text {index}: the ids read in place"
            );
            graph.encode_into(text, &mut copied).unwrap();
            assert!(
                copied == expected,
                "{bytes} bytes, text {index}: encode_into"
            );
            before = Some(expected);
        }
    }
}

/// Locks out an eager encode whose steps each wait on the device for every
/// earlier step that touched their buffers (most steps read what several
/// earlier ones wrote) instead of for the one before, which already ran after
/// those: every encoding's eager encode of 64 KiB, step by step (the
/// resident-grid kernel off), waits once per step after the first, and gives
/// the CPU encoder's ids. (That the one wait still orders
/// a step after every writer is `gpu_a_chain_step_waits_once_yet_after_every_writer`'s
/// check, with its negative control.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_an_eager_encode_waits_once_per_step() {
    for encoding in Encoding::ALL {
        let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
        let limits = ChunkLimits {
            resident_text_bytes: 0,
            ..ChunkLimits::default()
        };
        let encoder = &cuda_encoder(&cpu, Geometry::default(), limits);
        let text = generate(Shape::Prose, 64 << 10, 7);
        let expected = cpu.encode_ordinary_bytes(&text);
        for round in 0..2 {
            let before = vyre_cuda::backend::thread_driver_calls();
            let pending = encoder.submit_bytes(&[&text]).unwrap();
            let calls = vyre_cuda::backend::thread_driver_calls().since(&before);
            assert_eq!(pending.wait().unwrap()[0], expected, "{encoding:?}");
            assert_eq!(
                calls.stream_waits as usize,
                encoder.step_names().len() - 1,
                "{encoding:?}, round {round}: {calls:?}"
            );
        }
    }
}
