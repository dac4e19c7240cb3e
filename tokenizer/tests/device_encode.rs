//! The device encoder's programs on the reference interpreter (the same
//! programs a CUDA device runs, through `AnyBackend::reference()`), held to the
//! CPU encoder (which `tests/encode.rs` holds to tiktoken-rs and bpe-openai) on
//! small inputs: every encoding, the corpus, random strings, pieces of every
//! length class with chunks small enough that short texts cross them, batches
//! with empty documents, document ends inside runs, invalid UTF-8, and every
//! way to run an encode (eager, submitted, as a graph, through `Tokenizer`).
//! Every encode splits on the device: the pattern's batch split runs between
//! `stage` and the BPE steps.

#[path = "support/device_batches.rs"]
mod device_batches;
mod oracle;
mod split_corpus;
#[path = "support/tiktoken_text.rs"]
mod tiktoken_text;

use device_batches::{
    batch_with_empty_documents, batches_with_prose, capped_encoder, check_batch, check_batch_ids,
    device_piece_starts, documents_cut_inside_runs, long_piece_texts, random_texts,
    small_split_geometry, split_pieces_alone_and_joined, with_fused_steps_in_32_threads,
    STEP_BY_STEP,
};
use vyre_cuda::backend::AnyBackend;
use vyre_cuda::reference::{self, ReferenceOptions};
use vyre_cuda::DispatchConfig;
use vyre_tokenizer::device::fused::SHORT_TEXT_BYTES;
use vyre_tokenizer::device::pipeline::{CHUNKS_IN_FLIGHT, COPY_ENGINE_FROM};
use vyre_tokenizer::device::programs::{
    param, written_roles, Grid, KernelStep, Programs, Role, FUSED_MERGE_SLAB_BYTES,
    MAX_REGISTER_MERGE_BYTES, MERGE_SLAB_BYTES,
};
use vyre_tokenizer::device::vocabulary::{header, NO_TOKEN};
use vyre_tokenizer::device::{
    BatchIds, BoundsChecks, BulkSplit, ChunkLimits, DeviceEncoder, DeviceVocabulary, Geometry,
    ShortText,
};
use vyre_tokenizer::pretokenize::batch::COUNTER_WORDS;
use vyre_tokenizer::pretokenize::pattern::{piece_starts, Pattern};
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::pretokenize::Geometry as SplitGeometry;
use vyre_tokenizer::{Backend, Encoding, ErrorKind, Tokenizer};

fn reference_encoder(tokenizer: &Tokenizer) -> DeviceEncoder {
    DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        tokenizer,
        Geometry::default(),
        STEP_BY_STEP,
    )
    .expect("device encoder")
}

/// Chunks of 8 bytes and windows of up to 32: short texts cross many chunk
/// boundaries and repairs; split blocks of 32 bytes (16 threads of 2 bytes):
/// short texts cross many of the split's workgroups and look-backs.
fn small_geometry(repair_attempts: u32) -> Geometry {
    Geometry {
        workgroup_size: 32,
        chunk_bytes: 8,
        merge_slab_bytes: 4,
        repair_window_bytes: 32,
        repair_attempts,
        compact_workgroups: 3,
        max_loop_iterations: None,
        split: small_split_geometry(),
        ..Geometry::default()
    }
}

fn small_encoder(tokenizer: &Tokenizer) -> DeviceEncoder {
    DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        tokenizer,
        small_geometry(16),
        STEP_BY_STEP,
    )
    .expect("device encoder")
}

/// Locks out a device split that disagrees with each document split alone:
/// documents cut inside every kind of run (and long runs across many of the
/// split's workgroups), with empty documents between them, encode to the CPU
/// encoder's ids for all four encodings with the split's blocks at 32 bytes
/// and at the default geometry. (Negative control: the split of the
/// documents joined differs from their splits one after another, so a device
/// split that looked across a document end would give other pieces.)
#[test]
fn document_ends_inside_runs_split_on_the_device_as_alone() {
    let documents = documents_cut_inside_runs();
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        check_batch(
            &small_encoder(&tokenizer),
            &tokenizer,
            &documents,
            "ends inside runs, small blocks",
        );
        check_batch(
            &reference_encoder(&tokenizer),
            &tokenizer,
            &documents,
            "ends inside runs",
        );
        let (alone, joined) = split_pieces_alone_and_joined(&tokenizer, &documents);
        assert_ne!(
            joined,
            alone,
            "{}: the documents split alike joined and alone",
            encoding.name()
        );
    }
}

/// Locks out an encode whose pieces do not come from the device split: each
/// encoder's kernel steps are `stage`, its pattern's split steps (`split` for
/// r50k and p50k, `classify` and `phases` for cl100k and o200k), then the BPE
/// steps; an eager chunk times each of them; and the piece count the device
/// left for the BPE steps equals the CPU split's of each document alone with
/// the cuts between bytes no token joins (the documents joined count
/// differently for three of the four encodings, and the split without the cuts
/// for all four).
#[test]
fn the_split_runs_on_the_device_between_stage_and_the_bpe_steps() {
    let documents = documents_cut_inside_runs();
    let refs: Vec<&[u8]> = documents.iter().map(Vec::as_slice).collect();
    let mut distinguished = 0;
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = small_encoder(&tokenizer);
        let split: &[&str] = if matches!(encoding, Encoding::R50kBase | Encoding::P50kBase) {
            &["split"]
        } else {
            &["classify", "phases"]
        };
        let expected: Vec<&str> = ["stage"]
            .iter()
            .chain(split)
            .chain(&["pieces", "merge", "long", "compact"])
            .copied()
            .collect();
        assert_eq!(encoder.step_names(), expected, "{}", encoding.name());
        let (ids, timings) = encoder.encode_counted(&refs).unwrap();
        for (index, document) in documents.iter().enumerate() {
            assert_eq!(ids[index], tokenizer.encode_ordinary_bytes(document));
        }
        let timed: Vec<&str> = timings.steps.iter().map(|step| step.name).collect();
        assert_eq!(timed, expected);
        let counted = timings.counts.unwrap().pieces as usize;
        let alone = device_piece_starts(&tokenizer, &documents);
        assert_eq!(counted, alone.len(), "{}", encoding.name());
        let joined = device_piece_starts(&tokenizer, &[documents.concat()]);
        if joined.len() != counted {
            distinguished += 1;
        }
        let (uncut, _) = split_pieces_alone_and_joined(&tokenizer, &documents);
        assert_ne!(counted, uncut.len(), "{}", encoding.name());
    }
    // The documents joined count differently for most encodings (o200k's cuts
    // happen to even the counts out).
    assert!(distinguished >= 3, "{distinguished}");
}

/// Locks out any device id that differs from the CPU encoder on the
/// pre-tokenizers' corpus (valid and invalid UTF-8, as one batch per
/// encoding) and the three generated shapes, for all four encodings.
#[test]
fn device_ids_equal_cpu_on_corpus_and_shapes_every_encoding() {
    let corpus = split_corpus::corpus(oracle::corpus());
    assert!(corpus.iter().any(|text| std::str::from_utf8(text).is_err()));
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = reference_encoder(&tokenizer);
        check_batch(&encoder, &tokenizer, &corpus, "corpus");
        let shapes: Vec<Vec<u8>> = Shape::ALL
            .iter()
            .map(|&shape| generate(shape, 3000, 11))
            .collect();
        check_batch(&encoder, &tokenizer, &shapes, "shapes");
    }
}

/// Locks out disagreements on inputs nobody wrote by hand: 2,000 seeded
/// random strings per encoding (every kind of character and every boundary
/// between them; every tenth damaged into invalid UTF-8), one batch each.
#[test]
fn device_ids_equal_cpu_on_2000_random_strings_every_encoding() {
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = reference_encoder(&tokenizer);
        let mut random = SplitMix64::new(0xD0C0 + encoding as u64);
        let texts = random_texts(&mut random, 2000, 16);
        check_batch(&encoder, &tokenizer, &texts, "random strings");
    }
}

/// Locks out wrong stitching of long pieces: with chunks of 8 bytes, pieces
/// of every length class (runs of a letter, spaces, an ideograph, digits, two
/// letters; random letters and CJK) equal the CPU encoder through the boundary
/// checks and repairs, and again with repairs switched off (every failing
/// boundary sends its piece to the serial path), for all four encodings; the
/// counts show both paths ran. (Negative control: on these inputs the plain
/// concatenation of each chunk's own ids differs from the piece's ids, so a
/// pipeline that skipped the checks would fail.)
#[test]
fn long_pieces_stitch_repair_and_fall_back_exactly() {
    let mut random = SplitMix64::new(0x10A6);
    let texts = long_piece_texts(8, &mut random);
    let batch: Vec<Vec<u8>> = texts.iter().map(|(_, text)| text.clone()).collect();
    let mut naive_differs = 0;
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for attempts in [16, 0] {
            let encoder = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                small_geometry(attempts),
                STEP_BY_STEP,
            )
            .unwrap();
            check_batch(
                &encoder,
                &tokenizer,
                &batch,
                &format!("long pieces, {attempts} repairs"),
            );
            let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
            let (_, timings) = encoder.encode_counted(&refs).expect("counted encode");
            let counts = timings.counts.expect("counts were asked for");
            assert!(
                counts.long_pieces > 0 && counts.failed_boundaries > 0,
                "{counts:?}"
            );
            if attempts == 0 {
                assert!(counts.serial_pieces > 0, "{counts:?}");
            } else {
                assert!(counts.serial_pieces < counts.long_pieces, "{counts:?}");
            }
        }
        for (_, text) in &texts {
            let naive: Vec<u32> = text
                .chunks(8)
                .flat_map(|chunk| tokenizer.encode_ordinary_bytes(chunk))
                .collect();
            naive_differs += usize::from(naive != tokenizer.encode_ordinary_bytes(text));
        }
    }
    assert!(naive_differs > 0, "no input needed the boundary checks");
}

/// Locks out long pieces that go wrong at the default geometry (384-byte
/// chunks cut at character starts): runs of a letter, spaces, an ideograph and
/// digits of one and two chunks and a byte, random letters and CJK, and runs
/// whose period an odd prefix puts out of step with the chunks (`x` then
/// ideographs, `x` then `ab`), equal the CPU encoder on r50k, cl100k and
/// o200k, with boundaries that fail and are all repaired: no piece on the
/// serial path.
#[test]
fn long_pieces_at_the_default_geometry_are_repaired_without_the_serial_path() {
    let mut random = SplitMix64::new(0x384);
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for unit in ["a", " ", "日", "7"] {
        for len in [385usize, 771] {
            texts.push(unit.repeat(len.div_ceil(unit.len())).into_bytes());
        }
    }
    let letters: String = (0..500)
        .map(|_| *random.pick(&["a", "e", "s", "t", "q"]))
        .collect();
    let cjk: String = (0..200)
        .map(|_| *random.pick(&["日", "本", "語", "中", "国"]))
        .collect();
    texts.push(letters.into_bytes());
    texts.push(cjk.into_bytes());
    texts.push(format!("x{}", "日".repeat(300)).into_bytes());
    texts.push(format!("x{}", "ab".repeat(400)).into_bytes());
    let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    for encoding in [
        Encoding::R50kBase,
        Encoding::Cl100kBase,
        Encoding::O200kBase,
    ] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = reference_encoder(&tokenizer);
        let (ids, timings) = encoder.encode_counted(&refs).unwrap();
        for (index, text) in texts.iter().enumerate() {
            assert_eq!(
                ids[index],
                tokenizer.encode_ordinary_bytes(text),
                "{} text {index}",
                encoding.name()
            );
        }
        let counts = timings.counts.unwrap();
        assert!(
            counts.long_pieces > 0 && counts.failed_boundaries > 0,
            "{counts:?}"
        );
        assert_eq!(counts.serial_pieces, 0, "{}: {counts:?}", encoding.name());
    }
}

/// Locks out a document's last piece merging into the next document: each of
/// a batch of documents whose concatenation merges differently ("a" "b",
/// "hel" "lo", digits, spaces, a CJK character cut between documents) gets
/// exactly its own ids. (Negative control: encoding the concatenation gives
/// other ids than the documents' ids one after another.)
#[test]
fn documents_of_a_batch_never_merge() {
    let documents: Vec<Vec<u8>> = [
        &b"a"[..],
        b"b",
        b"hel",
        b"lo world",
        b"12",
        b"34",
        b"   ",
        b" x",
        "日本".as_bytes(),
        &"語".as_bytes()[..2],
        &"語".as_bytes()[2..],
        b"",
        b"'s",
    ]
    .iter()
    .map(|document| document.to_vec())
    .collect();
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = reference_encoder(&tokenizer);
        check_batch(
            &encoder,
            &tokenizer,
            &documents,
            "documents that merge when joined",
        );
        let one_after_another: Vec<u32> = documents
            .iter()
            .flat_map(|document| tokenizer.encode_ordinary_bytes(document))
            .collect();
        assert_ne!(
            tokenizer.encode_ordinary_bytes(&documents.concat()),
            one_after_another
        );
    }
}

/// Locks out chunking and buffer reuse that lose, reorder or mix documents:
/// batches of 1 to 200 documents (every fourth empty, some long runs) through
/// an encoder whose chunks hold at most 2,000 bytes and 25 documents (so a batch
/// is many chunks, slots are reused and grow, and a document over the byte
/// limit is a chunk of its own) equal the CPU encoder, each document's vector
/// and through one reused `BatchIds` (larger and smaller batches in turn, so
/// a part kept from a larger batch must not show), also when two threads
/// pipeline batches through the encoder at once (no thread waits for room
/// while holding some: no deadlock).
#[test]
fn batches_of_1_to_200_documents_with_empty_ones_equal_cpu() {
    let tokenizer = Tokenizer::for_encoding(Encoding::P50kBase).unwrap();
    let encoder = DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        &tokenizer,
        Geometry::default(),
        ChunkLimits {
            text_bytes: 2000,
            documents: 25,
            short_text_bytes: 0,
            resident_text_bytes: 0,
        },
    )
    .unwrap();
    let mut random = SplitMix64::new(0xBA7C);
    // One flat result reused by every batch, larger and smaller in turn.
    let mut ids = BatchIds::new();
    for count in [1, 3, 26, 200, 26, 1] {
        let batch = batch_with_empty_documents(&mut random, count);
        check_batch(&encoder, &tokenizer, &batch, &format!("{count} documents"));
        check_batch_ids(
            &encoder,
            &tokenizer,
            &batch,
            &mut ids,
            &format!("{count} documents into one BatchIds"),
        );
    }
    // Two threads pipelining batches of many chunks through one encoder at once:
    // each holds room for a chunk while it wants more, and neither waits for
    // the other forever.
    let batches: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|_| batch_with_empty_documents(&mut random, 120))
        .collect();
    std::thread::scope(|scope| {
        for (index, batch) in batches.iter().enumerate() {
            let (encoder, tokenizer) = (&encoder, &tokenizer);
            scope.spawn(move || {
                check_batch(encoder, tokenizer, batch, &format!("thread {index}"));
            });
        }
    });
}

/// Locks out a batch of nothing breaking the pipeline: an empty batch, one
/// empty document, 100,000 empty documents, and 100,000 empty documents with
/// three short ones among them (at the start, the middle, the end) encode to
/// the right number of results, each empty or its CPU ids.
#[test]
fn empty_batches_and_100000_empty_documents() {
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let encoder = reference_encoder(&tokenizer);
    assert!(encoder.encode_batch_bytes(&[]).unwrap().is_empty());
    assert_eq!(encoder.encode_batch(&[""]).unwrap(), [Vec::<u32>::new()]);
    let mut ids = BatchIds::new();
    encoder.encode_batch_ids(&[], &mut ids).unwrap();
    assert!(ids.is_empty() && ids.iter().next().is_none());
    let mut batch: Vec<&[u8]> = vec![b""; 100_000];
    let results = encoder.encode_batch_bytes(&batch).unwrap();
    assert_eq!(results.len(), 100_000);
    assert!(results.iter().all(Vec::is_empty));
    encoder.encode_batch_ids(&batch, &mut ids).unwrap();
    assert_eq!((ids.len(), ids.token_count()), (100_000, 0));
    assert!(ids.iter().all(<[u32]>::is_empty));
    batch[0] = b"first";
    batch[50_000] = b"middle one";
    batch[99_999] = b"last";
    let results = encoder.encode_batch_bytes(&batch).unwrap();
    for (index, text) in batch.iter().enumerate() {
        assert_eq!(
            results[index],
            tokenizer.encode_ordinary_bytes(text),
            "document {index}"
        );
    }
}

/// An encoder (p50k, default geometry, no short-text kernel) whose chunks hold
/// at most `text_bytes` bytes and `documents` documents.
fn chunked_encoder(tokenizer: &Tokenizer, text_bytes: u64, documents: u64) -> DeviceEncoder {
    DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        tokenizer,
        Geometry::default(),
        ChunkLimits {
            text_bytes,
            documents,
            short_text_bytes: 0,
            resident_text_bytes: 0,
        },
    )
    .unwrap()
}

/// Locks out an overlapped pipeline that hands a chunk's ids to the wrong
/// documents, loses a chunk whose hand-out runs on the copy pool, or lets a
/// document cross a chunk boundary: batches of 1, 2 and 1,000 short documents
/// (every fourth empty, four runs longer than a chunk) through chunks of at
/// most 1,024 bytes and 64 documents (about twenty chunks, `CHUNKS_IN_FLIGHT`
/// on the device at once, a document larger than a chunk alone in its own),
/// into reused result vectors holding other ids (more and fewer than they get)
/// and into new ones, equal the CPU encoder document by document, with one
/// timing per chunk (a chunk's wall covers its own hand-out).
#[test]
fn many_chunks_in_flight_hand_out_every_document_in_order() {
    let tokenizer = Tokenizer::for_encoding(Encoding::P50kBase).unwrap();
    let (chunk_bytes, chunk_documents) = (1024, 64);
    let encoder = chunked_encoder(&tokenizer, chunk_bytes as u64, chunk_documents as u64);
    let mut random = SplitMix64::new(0xF11E);
    for count in [1, 2, 1000] {
        let batch: Vec<Vec<u8>> = (0..count)
            .map(|index| match index % 4 {
                0 => Vec::new(),
                1 if index % 250 == 1 => "y".repeat(1500).into_bytes(),
                1 => "x".repeat(random.below(100) as usize).into_bytes(),
                _ => split_corpus::random_string(&mut random, 3).into_bytes(),
            })
            .collect();
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        let expected: Vec<Vec<u32>> = refs
            .iter()
            .map(|text| tokenizer.encode_ordinary_bytes(text))
            .collect();
        // Reused vectors: some with more room than their ids need, some with less.
        let mut results: Vec<Vec<u32>> = (0..count)
            .map(|index| vec![u32::MAX; if index % 2 == 0 { 200 } else { 1 }])
            .collect();
        let timings = encoder.encode_batch_into(&refs, &mut results).unwrap();
        assert!(results == expected, "{count} documents into reused vectors");
        if count < 3 {
            assert_eq!(encoder.encode_batch_bytes(&refs).unwrap(), expected);
        }
        // The chunks the limits cut, in order: a document over a chunk's bytes
        // alone in one.
        let chunks = encoder.chunks(&refs);
        assert_eq!(chunks.first().map_or(0, |chunk| chunk.start), 0);
        assert_eq!(chunks.last().map_or(0, |chunk| chunk.end), count);
        for (chunk, next) in chunks.iter().zip(chunks.iter().skip(1)) {
            assert_eq!(chunk.end, next.start);
        }
        for chunk in &chunks {
            let bytes: usize = refs[chunk.clone()].iter().map(|text| text.len()).sum();
            assert!(chunk.len() <= chunk_documents, "{chunk:?}");
            assert!(bytes <= chunk_bytes || chunk.len() == 1, "{chunk:?}");
        }
        assert_eq!(
            timings.len(),
            chunks.len(),
            "{count} documents: one timing per chunk"
        );
        assert!(
            count < 1000 || chunks.len() > 2 * CHUNKS_IN_FLIGHT,
            "{} chunks",
            chunks.len()
        );
        for chunk in &timings {
            assert!(chunk.wall_ns >= chunk.scatter_ns, "{chunk:?}");
        }
    }
}

/// Locks out a hand-out whose ids depend on where it runs: a batch of one
/// chunk hands its ids out on the calling thread and a batch of several on the
/// copy pool (`encode_batch_into`), and either must give every document exactly
/// the CPU encoder's ids. With chunks of at most 2,048 bytes and 64 documents
/// and the short-text kernel on (as on a device): one 1,024-byte document, 40
/// short documents in one chunk (every fifth empty) and 200 in several (one
/// timing per chunk says which branch each took), each into reused vectors
/// holding other ids (more and fewer than they get), into new ones and through
/// `submit_bytes` and `wait_into`, equal the CPU encoder; (negative control)
/// one result vector too few is a `Fix:` error that leaves them untouched.
#[test]
fn one_chunk_and_many_chunks_hand_out_the_cpu_ids() {
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let encoder = DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        &tokenizer,
        Geometry::default(),
        ChunkLimits {
            text_bytes: 2048,
            documents: 64,
            ..ChunkLimits::default()
        },
    )
    .unwrap();
    let mut random = SplitMix64::new(0x1C4A);
    let mut short_documents = |count: usize, most_bytes: u32| -> Vec<Vec<u8>> {
        (0..count)
            .map(|index| {
                let bytes = if index % 5 == 0 {
                    0
                } else {
                    random.below(most_bytes) as usize
                };
                generate(Shape::ALL[index % 3], bytes, index as u64)
            })
            .collect()
    };
    let batches = [
        (
            "one 1,024-byte document",
            vec![generate(Shape::Prose, 1024, 5)],
            false,
        ),
        ("40 documents in one chunk", short_documents(40, 50), false),
        (
            "200 documents in several chunks",
            short_documents(200, 100),
            true,
        ),
    ];
    for (what, batch, several_chunks) in &batches {
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        let expected: Vec<Vec<u32>> = refs
            .iter()
            .map(|text| tokenizer.encode_ordinary_bytes(text))
            .collect();
        let mut results: Vec<Vec<u32>> = (0..refs.len())
            .map(|index| vec![u32::MAX; if index % 2 == 0 { 300 } else { 1 }])
            .collect();
        let timings = encoder.encode_batch_into(&refs, &mut results).unwrap();
        assert!(results == expected, "{what}: into reused vectors");
        assert_eq!(
            timings.len() > 1,
            *several_chunks,
            "{what}: {} chunks",
            timings.len()
        );
        assert!(
            encoder.encode_batch_bytes(&refs).unwrap() == expected,
            "{what}: new vectors"
        );
        if !several_chunks {
            let waited = encoder.submit_bytes(&refs).unwrap().wait().unwrap();
            assert!(waited == expected, "{what}: submitted");
        }
        let before = results.clone();
        let error = encoder
            .encode_batch_into(&refs, &mut results[1..])
            .unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{what}: {error}");
        assert!(results == before, "{what}: untouched after the error");
    }
}

/// Locks out a shared copy pool or admission that mixes up concurrent encodes
/// or deadlocks them: four threads share one `Tokenizer` on the reference
/// device (one encoder, one admission, one copy pool) and three threads share
/// one encoder of 1 KiB chunks (each batch about a dozen chunks,
/// `CHUNKS_IN_FLIGHT` on the device at once among them all, so threads wait
/// for room while others hand out); every thread's every document equals the
/// CPU encoder.
#[test]
fn threaded_encodes_sharing_a_tokenizer_and_an_encoder_equal_cpu() {
    let cpu = Tokenizer::for_encoding(Encoding::P50kBase).unwrap();
    let device = cpu.clone().with_device(AnyBackend::reference()).unwrap();
    let chunked = chunked_encoder(&cpu, 1024, 64);
    let mut random = SplitMix64::new(0x7A8D);
    let batches: Vec<Vec<Vec<u8>>> = (0..7)
        .map(|_| batch_with_empty_documents(&mut random, 90))
        .collect();
    std::thread::scope(|scope| {
        for (index, batch) in batches.iter().enumerate() {
            let (device, cpu, chunked) = (&device, &cpu, &chunked);
            scope.spawn(move || {
                if index < 4 {
                    let strings: Vec<String> = batch
                        .iter()
                        .map(|text| String::from_utf8_lossy(text).into_owned())
                        .collect();
                    let refs: Vec<&str> = strings.iter().map(String::as_str).collect();
                    // Through the tokenizer's own encoder: `encode_batch` would
                    // fall back to the CPU on a device error.
                    let encoder = device.device_encoder().expect("on the device");
                    assert_eq!(
                        encoder.encode_batch(&refs).unwrap(),
                        cpu.encode_batch(&refs),
                        "thread {index}"
                    );
                } else {
                    check_batch(chunked, cpu, batch, &format!("thread {index}"));
                }
            });
        }
    });
}

/// Locks out a submitted or recorded encode that differs from the eager one:
/// `CHUNKS_IN_FLIGHT` submissions in flight waited in reverse order, and a
/// graph recorded for one length replayed with three texts of that length
/// (and once into a reused vector, which keeps its room, and with the ids read
/// where the graph left them, after a text with other ids), equal the CPU
/// encoder; (negative controls) one more submission on the same
/// thread (more than the backend's pending limit allows) and a graph text of
/// another length are `Fix:` errors, not a deadlock or a wrong result.
#[test]
fn submitted_and_graph_encodes_equal_cpu() {
    let tokenizer = Tokenizer::for_encoding(Encoding::O200kBase).unwrap();
    let encoder = reference_encoder(&tokenizer);
    let first = ["Hello there, General Kenobi!", "", "日本語のテキスト"];
    let second = ["The quick brown fox", "jumps over the lazy dog 12345"];
    let pending_first = encoder.submit(&first).unwrap();
    let more: Vec<_> = (1..CHUNKS_IN_FLIGHT)
        .map(|_| encoder.submit(&second).unwrap())
        .collect();
    let one_more = encoder.submit(&second).unwrap_err();
    assert!(
        one_more.message().starts_with("Fix:") && one_more.message().contains("wait for one"),
        "{one_more}"
    );
    let cpu = |texts: &[&str]| -> Vec<Vec<u32>> {
        texts
            .iter()
            .map(|text| tokenizer.encode_ordinary(text))
            .collect()
    };
    for pending_second in more.into_iter().rev() {
        assert_eq!(pending_second.wait().unwrap(), cpu(&second));
    }
    assert_eq!(pending_first.wait().unwrap(), cpu(&first));
    let texts = [
        "tokenize me, please!",
        "TOKENIZE ME, PLEASE!",
        "日本語 x 'll 123 !!!",
    ];
    let mut graph = encoder.graph(texts[0].len()).unwrap();
    for text in texts.iter().filter(|text| text.len() == texts[0].len()) {
        assert_eq!(
            graph.encode(text.as_bytes()).unwrap(),
            tokenizer.encode_ordinary(text)
        );
    }
    // Into a reused vector: its old contents replaced, its room kept.
    let mut ids = vec![7u32; 1000];
    let capacity = ids.capacity();
    graph.encode_into(texts[0].as_bytes(), &mut ids).unwrap();
    assert_eq!(ids, tokenizer.encode_ordinary(texts[0]));
    assert_eq!(ids.capacity(), capacity);
    // In place, alternating between two texts of one length: each read gives
    // the last replay's ids, not the text's before.
    for text in [texts[1], texts[0], texts[1]] {
        let (in_place, _) = graph.encode_in_place(text.as_bytes()).unwrap();
        assert_eq!(in_place, tokenizer.encode_ordinary(text), "{text}");
    }
    let error = graph.encode(b"short").unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    let error = graph.encode_into(b"short", &mut ids).unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    let error = graph.encode_in_place(b"short").unwrap_err();
    assert!(error.message().starts_with("Fix:"), "{error}");
    assert!(encoder.graph(0).is_err());
}

/// Locks out a staging or hand-out shared with helper threads that differs
/// from the calling thread's own, or a crew of helpers that stays taken after
/// an encode (the next encode would then copy alone, or a second encode would
/// queue its pieces behind the first's crew): with the crew asked for every
/// text, single
/// documents submitted and waited for (into new vectors and reused ones of
/// other lengths), in a batch of one chunk (into vectors and into a
/// `BatchIds`), through a graph into a reused
/// vector, and from four threads at once (one holds the helpers, the others
/// copy alone) all equal the CPU encoder, and so does the same encoder with
/// no helpers (the control).
#[test]
fn helped_hand_outs_equal_cpu() {
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let texts: Vec<Vec<u8>> = Shape::ALL
        .iter()
        .map(|&shape| generate(shape, 2500, 17))
        .collect();
    let cpu = |text: &[u8]| tokenizer.encode_ordinary_bytes(text);
    for helpers in [3, 0] {
        let encoder = reference_encoder(&tokenizer).with_hand_out_helpers(helpers, 1);
        let mut reused = [vec![9u32; 5000]];
        for text in &texts {
            let pending = encoder.submit_bytes(&[text]).unwrap();
            assert_eq!(pending.wait().unwrap(), [cpu(text)], "{helpers} helpers");
            let pending = encoder.submit_bytes(&[text]).unwrap();
            pending.wait_into(&mut reused).unwrap();
            assert_eq!(reused[0], cpu(text), "{helpers} helpers, reused");
            assert_eq!(
                encoder.encode_batch_bytes(&[text]).unwrap(),
                [cpu(text)],
                "{helpers} helpers, a batch of one"
            );
            let mut in_place = BatchIds::new();
            encoder.encode_batch_ids(&[text], &mut in_place).unwrap();
            assert_eq!(
                in_place.get(0),
                Some(&cpu(text)[..]),
                "{helpers} helpers, BatchIds"
            );
        }
        let mut graph = encoder.graph(texts[0].len()).unwrap();
        let mut ids = vec![1u32; 3];
        graph.encode_into(&texts[0], &mut ids).unwrap();
        assert_eq!(ids, cpu(&texts[0]), "{helpers} helpers, graph");
        drop(graph);
        std::thread::scope(|scope| {
            for text in texts.iter().chain(&texts[..1]) {
                let (encoder, cpu) = (&encoder, &cpu);
                scope.spawn(move || {
                    let pending = encoder.submit_bytes(&[text]).unwrap();
                    assert_eq!(pending.wait().unwrap(), [cpu(text)], "threaded");
                });
            }
        });
    }
}

/// Records `encoder`'s graph for the length of `texts` (all one length),
/// checks it makes `dispatches` dispatches, and replays the texts in turn, each
/// read in place and into a vector, against the CPU encoder; consecutive texts
/// of more than one byte must have other ids (the negative control that makes
/// a stale text fail).
fn check_graph_texts(
    encoder: &DeviceEncoder,
    tokenizer: &Tokenizer,
    texts: &[Vec<u8>],
    dispatches: usize,
    what: &str,
) {
    let mut graph = encoder.graph(texts[0].len()).unwrap();
    assert_eq!(graph.dispatches(), dispatches, "{what}");
    let mut before: Option<Vec<u32>> = None;
    let mut copied = Vec::new();
    for (index, text) in texts.iter().enumerate() {
        let expected = tokenizer.encode_ordinary_bytes(text);
        if text.len() > 1 {
            assert_ne!(before.as_ref(), Some(&expected), "negative control, {what}");
        }
        let (in_place, _) = graph.encode_in_place(text).unwrap();
        assert_eq!(in_place, &expected[..], "{what}, text {index} in place");
        graph.encode_into(text, &mut copied).unwrap();
        assert_eq!(copied, expected, "{what}, text {index} into a vector");
        before = Some(expected);
    }
}

/// Locks out a short text's graph recorded step by step (seven kernel nodes
/// and three uploads, which took longer than one eager short-text kernel) and
/// one that replays a stale text (the text written where the short-text
/// kernel does not read it, or its layout missing): on cl100k and r50k,
/// graphs of 1, 13, 1,000 and 4,096 bytes through an encoder that runs the
/// short-text kernel up to 4,096 bytes record one dispatch, and three texts of
/// each length in turn (prose, the same upper-cased, the first again; each
/// read in place and into a vector) equal the CPU encoder. Negative controls:
/// consecutive texts have other ids (so a stale text fails); the same lengths
/// through an encoder without the short-text kernel, and 4,097 bytes through
/// this one, record every step but `stage` and give the same ids.
#[test]
fn short_text_graphs_run_the_short_kernel() {
    for encoding in [Encoding::Cl100kBase, Encoding::R50kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let short = DeviceEncoder::with_geometry(
            AnyBackend::reference(),
            &tokenizer,
            Geometry::default(),
            ChunkLimits {
                short_text_bytes: SHORT_TEXT_BYTES,
                resident_text_bytes: 0,
                ..ChunkLimits::default()
            },
        )
        .unwrap();
        let step_by_step = reference_encoder(&tokenizer);
        let steps = step_by_step.step_names().len();
        for bytes in [1, 13, 1000, 4096, 4097] {
            let prose = generate(Shape::Prose, bytes, bytes as u64);
            let texts = [prose.clone(), prose.to_ascii_uppercase(), prose];
            for (encoder, one_kernel) in [
                (&short, bytes as u64 <= SHORT_TEXT_BYTES),
                (&step_by_step, false),
            ] {
                let what = format!("{encoding:?}, {bytes} bytes, one kernel {one_kernel}");
                let dispatches = if one_kernel { 1 } else { steps - 1 };
                check_graph_texts(encoder, &tokenizer, &texts, dispatches, &what);
            }
        }
    }
}

/// The small geometry, with chunks of at least `from_bytes` bytes split in
/// blocks of 256 bytes (64 threads × 4 bytes) instead of its 32-byte ones.
fn bulk_geometry(from_bytes: u64) -> Geometry {
    Geometry {
        bulk_split: Some(BulkSplit {
            from_bytes,
            split: SplitGeometry {
                workgroup_size: 64,
                bytes_per_thread: 4,
                ..small_split_geometry()
            },
        }),
        ..small_geometry(16)
    }
}

/// Locks out large chunks that do not run the bulk split's programs (a bulk
/// split never taken, or taken below its size or for a short text), ids that
/// depend on which shape split a chunk, and slots sized for one shape that the
/// other overruns: batches just below, at and above the bulk split's size,
/// eager, submitted and as a graph, equal the CPU encoder's ids for every
/// encoding. The 5,000-byte batch comes after the 7,000-byte one and reuses its
/// slot (both 8 KiB of capacity): sized for the bulk split alone, that slot's
/// status words would hold 32 of the 157 blocks the small split needs there
/// (negative control: sized so, r50k's 5,000-byte batch comes out with other
/// ids).
#[test]
fn chunks_from_the_bulk_size_take_the_bulk_split_and_equal_cpu() {
    let limits = ChunkLimits {
        short_text_bytes: 1_024,
        resident_text_bytes: 0,
        ..ChunkLimits::default()
    };
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = DeviceEncoder::with_geometry(
            AnyBackend::reference(),
            &tokenizer,
            bulk_geometry(6_000),
            limits,
        )
        .expect("device encoder");
        assert!(!encoder.runs_bulk(5_999) && encoder.runs_bulk(6_000));
        assert_eq!(
            encoder.programs_for(6_000).geometry.split.workgroup_size,
            64
        );
        assert_eq!(
            encoder.programs_for(5_999).geometry.split.workgroup_size,
            16
        );
        for (bytes, seed) in [(7_000, 1), (5_000, 2), (6_000, 3)] {
            let text = generate(Shape::Prose, bytes, seed);
            // Three documents, the last one empty, in one chunk of `bytes` bytes.
            let cut = bytes / 3;
            let documents = [text[..cut].to_vec(), text[cut..].to_vec(), Vec::new()];
            check_batch(&encoder, &tokenizer, &documents, &format!("{bytes} bytes"));
        }
        let text = generate(Shape::Code, 6_500, 4);
        let expected = tokenizer.encode_ordinary_bytes(&text);
        let pending = encoder.submit_bytes(&[&text]).unwrap();
        assert_eq!(pending.wait().unwrap(), std::slice::from_ref(&expected));
        let mut graph = encoder.graph(text.len()).unwrap();
        assert_eq!(graph.encode(&text).unwrap(), expected);
    }
    // A bulk size at or below the short-text limit: the short kernel still
    // takes the texts it can, and the bulk split the others.
    // (The short-text kernel needs the split at the BPE steps' 32 threads.)
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let encoder = DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        &tokenizer,
        Geometry {
            split: SplitGeometry {
                workgroup_size: 32,
                ..small_split_geometry()
            },
            ..bulk_geometry(512)
        },
        limits,
    )
    .expect("device encoder");
    assert!(encoder.runs_short(1_000) && !encoder.runs_bulk(1_000));
    assert!(!encoder.runs_short(1_025) && encoder.runs_bulk(1_025));
    for bytes in [1_000, 1_025] {
        let text = generate(Shape::Cjk, bytes, 5);
        check_batch(&encoder, &tokenizer, &[text], &format!("{bytes} bytes"));
    }
}

/// Locks out a `Tokenizer` on a device that encodes differently from the CPU:
/// through `with_device` on the reference interpreter, `encode_ordinary`,
/// `encode_ordinary_bytes` (invalid UTF-8), `encode` with allowed special
/// tokens, `encode_with_special_tokens`, `encode_batch` and `encode_batch_ids`
/// equal the CPU tokenizer (whose `encode_batch_ids` gives its `encode_batch`),
/// and the tokenizer says it runs on the device.
#[test]
fn tokenizer_on_the_reference_device_equals_cpu() {
    let cpu = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let device = cpu.clone().with_device(AnyBackend::reference()).unwrap();
    assert_eq!(device.backend(), Backend::Gpu);
    assert_eq!(device.runs_on(1), Backend::Gpu);
    assert!(device.device_encoder().is_some());
    let text = "Hi<|endoftext|> there <|fim_prefix|>x<|endoftext|>";
    assert_eq!(device.encode_ordinary(text), cpu.encode_ordinary(text));
    assert_eq!(
        device
            .encode(text, &["<|endoftext|>", "<|fim_prefix|>"])
            .unwrap(),
        cpu.encode(text, &["<|endoftext|>", "<|fim_prefix|>"])
            .unwrap()
    );
    assert_eq!(
        device.encode_with_special_tokens(text),
        cpu.encode_with_special_tokens(text)
    );
    assert_eq!(
        device.encode(text, &["<|endoftext|>"]).unwrap_err().kind(),
        ErrorKind::DisallowedSpecialToken
    );
    let damaged = b"caf\xC3 \xFF\xFE ok";
    assert_eq!(
        device.encode_ordinary_bytes(damaged),
        cpu.encode_ordinary_bytes(damaged)
    );
    let batch = ["one", "", "two three", "日本"];
    assert_eq!(device.encode_batch(&batch), cpu.encode_batch(&batch));
    let (mut on_device, mut on_cpu) = (BatchIds::new(), BatchIds::new());
    device.encode_batch_ids(&batch, &mut on_device);
    cpu.encode_batch_ids(&batch, &mut on_cpu);
    assert_eq!(on_device.to_vecs(), cpu.encode_batch(&batch));
    assert_eq!(on_cpu.to_vecs(), cpu.encode_batch(&batch));
}

/// Locks out a device failure that is lost or turns into wrong ids: on a
/// reference interpreter whose work cap is too small for the programs,
/// `encode` is an `Err` of kind `Backend` starting `Fix:` that names the
/// failing program and keeps the backend's error as its source, while
/// `encode_ordinary` and `encode_batch` fall back to the CPU and give its ids;
/// with every `while` loop capped below what a long piece needs, its encode is
/// an error naming the program (and a `BatchIds` it failed to fill holds no
/// document), while texts that stay under the cap encode.
#[test]
fn device_failures_are_fix_errors_and_ordinary_encodes_fall_back() {
    let cpu = Tokenizer::for_encoding(Encoding::R50kBase).unwrap();
    let starved = AnyBackend::reference_with(ReferenceOptions {
        max_work: 5_000,
        ..ReferenceOptions::default()
    });
    let device = cpu.clone().with_device(starved).unwrap();
    let text = "a text long enough to need more work than the cap allows";
    let error = device.encode(text, &[]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Backend);
    assert!(
        error.message().starts_with("Fix:") && error.message().contains("bpe."),
        "{error}"
    );
    assert!(std::error::Error::source(&error).is_some());
    assert_eq!(device.encode_ordinary(text), cpu.encode_ordinary(text));
    assert_eq!(
        device.encode_batch(&[text, "b"]),
        cpu.encode_batch(&[text, "b"])
    );
    let mut ids = BatchIds::new();
    device.encode_batch_ids(&[text, "b"], &mut ids);
    assert_eq!(ids.to_vecs(), cpu.encode_batch(&[text, "b"]));
    // A loop cap the long piece's merges pass: the program stops with an error
    // naming it (on CUDA the same cap traps: a KernelFault, gpu_encode_fault.rs).
    let capped = capped_encoder(AnyBackend::reference(), &cpu);
    let error = capped.encode_batch(&[&"x".repeat(1000)]).unwrap_err();
    assert!(
        error.message().starts_with("Fix:") && error.message().contains("bpe."),
        "{error}"
    );
    // A failed encode into a flat result leaves no document of the batch
    // before it there (the negative control: it held one).
    capped.encode_batch_ids(&[b"one before"], &mut ids).unwrap();
    assert_eq!(ids.len(), 1);
    let long = "x".repeat(1000);
    assert!(capped
        .encode_batch_ids(&[long.as_bytes()], &mut ids)
        .is_err());
    assert!(ids.is_empty() && ids.get(0).is_none(), "{ids:?}");
    let fine = "short pieces, each a token";
    assert_eq!(
        capped.encode_batch(&[fine]).unwrap(),
        [cpu.encode_ordinary(fine)]
    );
}

/// Locks out shapes the programs cannot run with becoming a panic or a wrong
/// result: a workgroup of 33 threads, chunks of 1 byte, slabs of 13 bytes at 256 threads
/// (over the 12 KiB the merge slabs may take), registers for ranges of 1 or 32
/// bytes (a key's offset has 5 bits), a fused slab of 32 or 2^23 bytes a
/// thread (its part starts are the bits of one word), no (or more than 65,536)
/// workgroups of `compact`, `pieces` or `stage`, chunk limits of nothing, a
/// split of 9 bytes per thread, a bulk split of 2,048 threads and chunks over
/// the split's 256 MiB are each a `Fix:` error naming what to change (the bulk
/// split's by its place in the geometry), and so is a text copy-engine
/// threshold past the ids' (the threshold at the ids' is the control).
#[test]
fn bad_geometries_and_limits_are_fix_errors() {
    let tokenizer = Tokenizer::for_encoding(Encoding::R50kBase).unwrap();
    let mut bad = vec![
        (
            Geometry {
                workgroup_size: 33,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "workgroup_size",
        ),
        (
            Geometry {
                chunk_bytes: 1,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "chunk_bytes",
        ),
        (
            Geometry {
                merge_slab_bytes: 1 << 23,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "merge_slab_bytes",
        ),
        (
            Geometry {
                register_merge_bytes: 1,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "register_merge_bytes is 1",
        ),
        (
            Geometry {
                register_merge_bytes: MAX_REGISTER_MERGE_BYTES + 1,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "register_merge_bytes is 32",
        ),
        (
            Geometry {
                short_text: ShortText {
                    register_merge_bytes: MAX_REGISTER_MERGE_BYTES + 1,
                    ..ShortText::default()
                },
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "short_text.register_merge_bytes is 32",
        ),
        (
            Geometry {
                fused_merge_slab_bytes: 1 << 23,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "fused_merge_slab_bytes is 8388608",
        ),
        (
            Geometry {
                fused_merge_slab_bytes: MAX_REGISTER_MERGE_BYTES + 1,
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "fused_merge_slab_bytes is 32",
        ),
        (
            Geometry::default(),
            ChunkLimits {
                text_bytes: 0,
                documents: 1,
                ..ChunkLimits::default()
            },
            "ChunkLimits",
        ),
        (
            Geometry {
                split: SplitGeometry {
                    bytes_per_thread: 9,
                    ..small_split_geometry()
                },
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "Geometry::split.bytes_per_thread",
        ),
        (
            Geometry {
                bulk_split: Some(BulkSplit {
                    from_bytes: 1 << 20,
                    split: SplitGeometry {
                        workgroup_size: 2048,
                        ..small_split_geometry()
                    },
                }),
                ..Geometry::default()
            },
            ChunkLimits::default(),
            "Geometry::bulk_split.split.workgroup_size",
        ),
        (
            Geometry::default(),
            ChunkLimits {
                text_bytes: 512 << 20,
                documents: 1,
                ..ChunkLimits::default()
            },
            "ChunkLimits::text_bytes",
        ),
    ];
    // Each step's cap on its workgroups: none, and more than 65,536.
    type SetCap = fn(&mut Geometry, u32);
    let caps: [(&str, SetCap); 3] = [
        ("compact_workgroups", |geometry, cap| {
            geometry.compact_workgroups = cap
        }),
        ("pieces_workgroups", |geometry, cap| {
            geometry.pieces_workgroups = cap
        }),
        ("stage_workgroups", |geometry, cap| {
            geometry.stage_workgroups = cap
        }),
    ];
    for (what, set) in caps {
        for cap in [0, 65_537] {
            let mut geometry = Geometry::default();
            set(&mut geometry, cap);
            bad.push((geometry, ChunkLimits::default(), what));
        }
    }
    for (geometry, limits, what) in bad {
        let error =
            DeviceEncoder::with_geometry(AnyBackend::reference(), &tokenizer, geometry, limits)
                .unwrap_err();
        assert!(
            error.message().starts_with("Fix:") && error.message().contains(what),
            "{error}"
        );
    }
    // The text's copy-engine threshold: up to the ids' own, not past it.
    let encoder = || reference_encoder(&tokenizer);
    assert!(encoder()
        .with_text_copy_engine_from(COPY_ENGINE_FROM)
        .is_ok());
    let error = encoder()
        .with_text_copy_engine_from(COPY_ENGINE_FROM + 1)
        .unwrap_err();
    assert!(
        error.message().starts_with("Fix:")
            && error.message().contains("with_text_copy_engine_from"),
        "{error}"
    );
}

/// Locks out a striding `pieces` that loses or repeats pieces past the first
/// pass of its fixed grid (a tile loop that stops early or steps by the wrong
/// amount; checked: a step of twice the grid fails here; a race on the
/// workgroup word of a tile's first merge-list entry is a device matter, which
/// the reference interpreter does not show): with 32-thread workgroups, 8-byte
/// chunks and one or three workgroups of `pieces`, texts of several hundred
/// pieces (many tiles per workgroup, merge-listed and long pieces among them)
/// and batches with empty documents encode to the CPU encoder's ids on all four
/// encodings. The device counts show the grid took more than one pass over the
/// pieces, so a grid that covered them in one (the per-byte grid before) is
/// not what passes; `pieces_lists_the_same_entries_on_any_grid` is the negative
/// control of a grid that covers one pass.
#[test]
fn pieces_past_one_pass_of_the_grid_equal_cpu() {
    let mut random = SplitMix64::new(0x57_21DE);
    // Prose in every batch: more pieces than one pass of three workgroups.
    let batches = batches_with_prose(&mut random, [1500, 1500], 21, &[8], 60);
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for pieces_workgroups in [1, 3] {
            let geometry = Geometry {
                pieces_workgroups,
                ..small_geometry(16)
            };
            let encoder = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                geometry,
                STEP_BY_STEP,
            )
            .unwrap();
            let one_pass = pieces_workgroups * geometry.workgroup_size;
            let [mut merged, mut long] = [0, 0];
            for (index, batch) in batches.iter().enumerate() {
                let what = format!("{pieces_workgroups} workgroups of pieces, batch {index}");
                check_batch(&encoder, &tokenizer, batch, &what);
                let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
                let (_, timings) = encoder.encode_counted(&refs).unwrap();
                let counts = timings.counts.unwrap();
                assert!(counts.pieces > one_pass, "{what}: {counts:?}");
                merged += counts.merged_pieces;
                long += counts.long_pieces;
            }
            assert!(merged > 0 && long > 0, "{}", tokenizer.name());
        }
    }
}

/// What `pieces` wrote: `token_at`, and the merge, long and chunk lists as
/// sorted multisets (entries are appended through counters, in no set order).
#[derive(Debug, PartialEq, Eq)]
struct PiecesOutput {
    token_at: Vec<u32>,
    merge_list: Vec<u32>,
    long_list: Vec<u32>,
    chunk_list: Vec<(u32, u32)>,
}

impl PiecesOutput {
    /// How `self` differs from `expected`, short enough for a failure message.
    fn differences(&self, expected: &PiecesOutput) -> String {
        let tokens = self
            .token_at
            .iter()
            .zip(&expected.token_at)
            .filter(|(got, want)| got != want)
            .count();
        format!(
            "{tokens} token_at words differ; merge, long and chunk list entries {:?}, expected {:?}",
            [self.merge_list.len(), self.long_list.len(), self.chunk_list.len()],
            [
                expected.merge_list.len(),
                expected.long_list.len(),
                expected.chunk_list.len()
            ],
        )
    }
}

/// The step called `name` of `programs`.
fn step_named<'p>(programs: &'p Programs, name: &str) -> &'p KernelStep {
    programs
        .steps()
        .iter()
        .find(|step| step.name == name)
        .unwrap_or_else(|| panic!("no step `{name}`"))
}

/// The `params` words of a chunk of `text_len` bytes and `documents`
/// documents, every other word zero, as a step reads them.
fn chunk_params(text_len: u32, documents: u32) -> Vec<u32> {
    let mut params = vec![0u32; param::WORDS as usize];
    params[param::TEXT_LEN as usize] = text_len;
    params[param::DOCUMENTS as usize] = documents;
    params
}

/// `values` as the little-endian bytes of a `u32` buffer.
fn words(values: &[u32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

/// `bytes` of a `u32` buffer as its words.
fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|word| u32::from_le_bytes(word.try_into().unwrap()))
        .collect()
}

/// What one step run alone wrote: one buffer per written role, in binding
/// order ([`written_roles`]).
struct StepOutputs {
    roles: Vec<Role>,
    buffers: Vec<Vec<u8>>,
}

impl StepOutputs {
    /// The bytes the step left in the buffer of `role` (which it writes).
    fn of(&self, role: Role) -> &[u8] {
        let index = self.roles.iter().position(|&written| written == role);
        &self.buffers[index.unwrap_or_else(|| panic!("the step writes no {role:?}"))]
    }
}

/// `step` alone on the reference interpreter over `inputs` (one per binding,
/// in binding order) on `workgroups` workgroups.
fn run_step_alone(step: &KernelStep, inputs: &[Vec<u8>], workgroups: u32) -> StepOutputs {
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let buffers = reference::run(&step.program, &refs, &DispatchConfig::linear(workgroups))
        .unwrap_or_else(|error| panic!("`{}` on {workgroups} workgroups: {error}", step.name));
    let written = written_roles(step.name);
    StepOutputs {
        roles: step
            .bindings
            .iter()
            .copied()
            .filter(|role| written.contains(role))
            .collect(),
        buffers,
    }
}

/// The inputs of `step` (`pieces`, `merge` or `long`: they bind alike) run
/// alone over `text` with `params` and `piece_starts` (their count in the piece
/// count): `token_at` and the merge scratch all [`NO_TOKEN`], each list
/// `list_words` words of zeros, the vocabulary tables `(words, token_bytes)`.
fn bpe_step_inputs(
    step: &KernelStep,
    (vocabulary_words, token_bytes): (&[u32], &[u8]),
    text: &[u8],
    params: &[u32],
    piece_starts: &[u32],
    list_words: usize,
) -> Vec<Vec<u8>> {
    let per_byte = words(&vec![NO_TOKEN; text.len()]);
    let mut padded_text = text.to_vec();
    padded_text.resize(text.len().next_multiple_of(4), 0);
    step.bindings
        .iter()
        .map(|role| match role {
            Role::TokenAt | Role::MergeMinima | Role::MergeParts => per_byte.clone(),
            Role::MergeList | Role::ChunkList | Role::LongList => words(&vec![0; list_words]),
            Role::PieceStarts => words(piece_starts),
            Role::PieceCount => words(&[piece_starts.len() as u32]),
            Role::Params => words(params),
            Role::Text => padded_text.clone(),
            Role::Vocabulary => words(vocabulary_words),
            Role::TokenBytes => token_bytes.to_vec(),
            other => panic!("`{}` binds {other:?}", step.name),
        })
        .collect()
}

/// The `pieces` program alone on the reference interpreter at `geometry` and
/// `workgroups`, for the first `piece_count` of `starts` over `text` (the last
/// of them ending at `text_end`).
fn run_pieces(
    tokenizer: &Tokenizer,
    text: &[u8],
    starts: &[u32],
    [piece_count, text_end]: [u32; 2],
    geometry: Geometry,
    workgroups: u32,
) -> PiecesOutput {
    let programs = Programs::new(tokenizer.pattern(), geometry).unwrap();
    let step = step_named(&programs, "pieces");
    let params = chunk_params(text_end, 1);
    let starts = &starts[..piece_count as usize];
    let vocabulary = DeviceVocabulary::new(tokenizer.vocabulary()).unwrap();
    let inputs = bpe_step_inputs(
        step,
        (vocabulary.words(), vocabulary.token_bytes()),
        text,
        &params,
        starts,
        2 * text.len() + 2,
    );
    let outputs = run_step_alone(step, &inputs, workgroups);
    let output = |role: Role| words_of(outputs.of(role));
    let params = output(Role::Params);
    let listed = |role: Role, counter: u32| {
        let mut entries = output(role);
        entries.truncate(params[counter as usize] as usize);
        entries.sort_unstable();
        entries
    };
    let mut chunk_list: Vec<(u32, u32)> = output(Role::ChunkList)
        .chunks_exact(2)
        .take(params[param::CHUNK_COUNT as usize] as usize)
        .map(|pair| (pair[0], pair[1]))
        .collect();
    chunk_list.sort_unstable();
    let mut token_at = output(Role::TokenAt);
    token_at.truncate(text.len());
    PiecesOutput {
        token_at,
        merge_list: listed(Role::MergeList, param::MERGE_COUNT),
        long_list: listed(Role::LongList, param::LONG_COUNT),
        chunk_list,
    }
}

/// Locks out a striding `pieces` whose writes depend on its grid: the step
/// alone, on texts of several hundred pieces with 32-thread workgroups and
/// 8-byte chunks, writes the same `token_at` and the same merge, long and
/// chunk list entries (as multisets: no later step depends on their order) on
/// one, two and three workgroups as on one workgroup per tile of 32 pieces
/// (what the per-byte grid covered). (Negative control: a grid of three
/// workgroups that each took one tile, which a `pieces` that does not stride
/// runs, leaves the pieces past the first 96 unwritten and unlisted, and the
/// comparison tells it apart.)
#[test]
fn pieces_lists_the_same_entries_on_any_grid() {
    let geometry = Geometry {
        pieces_workgroups: 3,
        ..small_geometry(16)
    };
    let mut random = SplitMix64::new(0x9_1EC5);
    let mut texts: Vec<Vec<u8>> = Shape::ALL
        .iter()
        .map(|&shape| generate(shape, 1500, 5))
        .collect();
    texts.push(
        long_piece_texts(8, &mut random)
            .into_iter()
            .flat_map(|(_, text)| [text, b" ".to_vec()])
            .flatten()
            .collect(),
    );
    // Prose after each: more pieces than one pass of three workgroups.
    for text in &mut texts {
        text.extend(generate(Shape::Prose, 1500, 6));
    }
    for encoding in [Encoding::R50kBase, Encoding::Cl100kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let [mut merged, mut long] = [0, 0];
        for (index, text) in texts.iter().enumerate() {
            let starts = piece_starts(tokenizer.pattern(), text).unwrap();
            let count = starts.len() as u32;
            let full = [count, text.len() as u32];
            let tiles = count.div_ceil(geometry.workgroup_size);
            let one_per_tile = run_pieces(&tokenizer, text, &starts, full, geometry, tiles);
            let what = format!("{} text {index}, {count} pieces", tokenizer.name());
            merged += one_per_tile.merge_list.len();
            long += one_per_tile.long_list.len();
            for workgroups in [1, 2, 3] {
                let strided = run_pieces(&tokenizer, text, &starts, full, geometry, workgroups);
                assert!(
                    strided == one_per_tile,
                    "{what}, {workgroups} workgroups: {}",
                    strided.differences(&one_per_tile)
                );
            }
            // One tile per workgroup on three workgroups: the first 96 pieces
            // with their true ends, none after.
            let one_pass = 3 * geometry.workgroup_size;
            assert!(count > one_pass, "{what}");
            let first_pass = [one_pass, starts[one_pass as usize]];
            assert!(
                run_pieces(&tokenizer, text, &starts, first_pass, geometry, 3) != one_per_tile,
                "{what}: the negative control"
            );
        }
        assert!(merged > 0 && long > 0, "{}", tokenizer.name());
    }
}

/// The `stage` program alone on the reference interpreter at `geometry` and
/// `workgroups`: the staged parameters, `text` (padded to whole `u64` words)
/// and `ends`, into device buffers of zeros whose document ends hold
/// `end_capacity` words; what it left in `(params, text, document_ends)`.
fn run_stage(
    geometry: Geometry,
    text: &[u8],
    ends: &[u32],
    end_capacity: usize,
    workgroups: u32,
) -> (Vec<u32>, Vec<u8>, Vec<u32>) {
    let tokenizer = Tokenizer::for_encoding(Encoding::R50kBase).unwrap();
    let programs = Programs::new(tokenizer.pattern(), geometry).unwrap();
    let step = step_named(&programs, "stage");
    let params = chunk_params(text.len() as u32, ends.len() as u32);
    let mut staged_text = text.to_vec();
    staged_text.resize(text.len().next_multiple_of(8), 0);
    let inputs: Vec<Vec<u8>> = step
        .bindings
        .iter()
        .map(|role| match role {
            Role::StagedParams => words(&params),
            Role::StagedText => staged_text.clone(),
            Role::StagedDocuments => words(ends),
            Role::Params => words(&[0; param::WORDS as usize]),
            Role::Text => vec![0; staged_text.len()],
            Role::DocumentEnds => words(&vec![0; end_capacity]),
            other => panic!("`stage` binds {other:?}"),
        })
        .collect();
    let outputs = run_step_alone(step, &inputs, workgroups);
    (
        words_of(outputs.of(Role::Params)),
        outputs.of(Role::Text).to_vec(),
        words_of(outputs.of(Role::DocumentEnds)),
    )
}

/// Locks out a capped `stage` grid that leaves part of the staging undone (a
/// cap that leaves the text's tail or the document ends past one pass of the
/// grid unstaged, or strides by the wrong amount): with 32-thread workgroups,
/// `stage` on 1, 3 and 5 workgroups (`Grid::Stage` at
/// `Geometry::stage_workgroups` of 1, 3 and 5) over 4,999 bytes of text (625
/// words) and 300 document ends in a buffer of 400 (the tail padded with the
/// text's length) writes the same parameters, text and document ends as on
/// its uncapped grid, and those are the staged ones. The text and the ends
/// past one pass of each grid are not zero (what the device buffers held), so
/// a grid that staged one pass and stopped would differ.
#[test]
fn stage_on_a_capped_grid_stages_the_same_buffers() {
    let geometry = small_geometry(16);
    let mut random = SplitMix64::new(0x57A6E);
    let text: Vec<u8> = (0..4_999).map(|_| b'a' + random.below(26) as u8).collect();
    let mut ends: Vec<u32> = (0..300).map(|_| random.below(4_999) + 1).collect();
    ends.sort_unstable();
    let end_capacity = 400;
    let documents = ends.len() as u64;
    let text_len = text.len() as u64;
    let uncapped = Grid::Stage.workgroups(&geometry, text_len, documents);
    // One thread per 16 bytes: 313 threads, 10 workgroups, each thread two of
    // the 625 words.
    assert_eq!(uncapped, 10);
    let expected = run_stage(geometry, &text, &ends, end_capacity, uncapped);
    let staged_params = chunk_params(text.len() as u32, ends.len() as u32);
    let mut padded_ends = ends.clone();
    padded_ends.resize(end_capacity, text.len() as u32);
    assert_eq!(expected.0, staged_params);
    assert_eq!(&expected.1[..text.len()], &text[..]);
    assert_eq!(expected.2, padded_ends);
    for cap in [1, 3, 5] {
        let capped = Geometry {
            stage_workgroups: cap,
            ..geometry
        };
        let workgroups = Grid::Stage.workgroups(&capped, text_len, documents);
        assert_eq!(workgroups, cap, "the cap sets the grid");
        let one_pass = (cap * geometry.workgroup_size) as usize;
        assert!(
            text[8 * one_pass..].iter().any(|&byte| byte != 0)
                && padded_ends[one_pass..].iter().any(|&end| end != 0),
            "the staging past one pass of {cap} workgroups differs from zeros"
        );
        assert!(
            run_stage(capped, &text, &ends, end_capacity, workgroups) == expected,
            "`stage` on {cap} workgroups"
        );
    }
}

/// Per block of `block_bytes` bytes of `text_len` bytes whose tokens start at
/// `token_starts` (increasing): the ids before it (where its first id goes)
/// and its own token count.
fn block_runs(token_starts: &[u32], text_len: u32, block_bytes: u32) -> Vec<(u32, u32)> {
    let mut runs = Vec::new();
    let mut next = 0;
    for block_start in (0..text_len).step_by(block_bytes as usize) {
        let running = next as u32;
        while next < token_starts.len() && token_starts[next] < block_start + block_bytes {
            next += 1;
        }
        runs.push((running, next as u32 - running));
    }
    runs
}

/// Locks out an aligned copy in `compact` that drops, duplicates or misplaces
/// ids (stores before `running` over the blocks' before, reads
/// `block_ids[at − running]` off by the lead, skips the extra pass a block
/// needs when its lead and its ids pass `4 · W`): `compact` alone, with
/// 32-thread workgroups (blocks of 128 bytes) on 1, 2 and 3 workgroups and its
/// uncapped grid (so the look-back that carries the token counts from
/// workgroup to workgroup runs over 1 to 65 of them), over a `token_at` whose
/// blocks start at every `running mod 32` with tokens, hold 0 tokens, hold 128
/// (a full block) at leads 0 and 31, and end in a partial last block, writes
/// every id once in text order, leaves the words past the total as they were,
/// gives each document (empty ones, one at the text's end) the index of its
/// first id and the total after them, and leaves the status words and counters
/// zero for the next dispatch. The token positions and ids are drawn at random; every id is
/// distinct, so a duplicate or a loss shows.
#[test]
fn compact_stores_every_id_once_at_any_alignment() {
    let geometry = small_geometry(16);
    let block_bytes = geometry.block_bytes();
    let mut counts: Vec<u32> = vec![33; 32];
    counts.extend([0, 31, 128, 1, 128, 127, 0, 97, 128, 128, 5, 0]);
    let mut random = SplitMix64::new(0xC0_A11C);
    counts.extend((0..20).map(|_| random.below(129)));
    // The partial last block: 77 bytes, 60 tokens.
    let text_len = counts.len() as u32 * block_bytes + 77;
    counts.push(60);
    let mut token_at = vec![NO_TOKEN; text_len as usize];
    let mut next_id = 1_000;
    let mut expected_ids = Vec::new();
    for (block, &count) in counts.iter().enumerate() {
        let start = block as u32 * block_bytes;
        let len = (text_len - start).min(block_bytes);
        let mut offsets: Vec<u32> = (0..len).collect();
        for at in 0..offsets.len() {
            let other = at + random.below((offsets.len() - at) as u32) as usize;
            offsets.swap(at, other);
        }
        offsets.truncate(count as usize);
        offsets.sort_unstable();
        for offset in offsets {
            token_at[(start + offset) as usize] = next_id;
            expected_ids.push(next_id);
            next_id += 7;
        }
    }
    let token_starts: Vec<u32> = (0..text_len)
        .filter(|&at| token_at[at as usize] != NO_TOKEN)
        .collect();
    let runs = block_runs(&token_starts, text_len, block_bytes);
    let counts_seen: Vec<u32> = runs.iter().map(|&(_, count)| count).collect();
    assert_eq!(counts_seen, counts);
    let leads = |wanted: u32| {
        runs.iter()
            .filter(move |&&(_, count)| count == wanted)
            .map(|&(running, _)| running % 32)
            .collect::<Vec<u32>>()
    };
    let mut with_tokens: Vec<u32> = runs
        .iter()
        .filter(|&&(_, count)| count > 0)
        .map(|&(running, _)| running % 32)
        .collect();
    with_tokens.sort_unstable();
    with_tokens.dedup();
    assert_eq!(with_tokens, (0..32).collect::<Vec<u32>>());
    assert!(leads(128).contains(&0) && leads(128).contains(&31));
    assert!(!leads(0).is_empty());
    // Documents: empty ones, ends inside blocks and on their edges, the last
    // at the text's end and one empty after it.
    let mut ends: Vec<u32> = (0..40).map(|_| random.below(text_len)).collect();
    ends.extend([0, 0, block_bytes, 5 * block_bytes, text_len, text_len]);
    ends.sort_unstable();
    let documents = ends.len() as u32;
    let mut expected_starts: Vec<u32> = std::iter::once(0)
        .chain(ends[..ends.len() - 1].iter().copied())
        .map(|start| token_starts.partition_point(|&at| at < start) as u32)
        .collect();
    expected_starts.push(token_starts.len() as u32);
    let params = chunk_params(text_len, documents);
    const UNWRITTEN: u32 = 0xDEAD_BEEF;
    let tail = 64;
    let programs = Programs::new(
        Tokenizer::for_encoding(Encoding::R50kBase)
            .unwrap()
            .pattern(),
        geometry,
    )
    .unwrap();
    let step = step_named(&programs, "compact");
    let inputs: Vec<Vec<u8>> = step
        .bindings
        .iter()
        .map(|role| match role {
            Role::Params => words(&params),
            Role::DocumentEnds => words(&ends),
            Role::TokenAt => words(&token_at),
            Role::Ids => words(&vec![UNWRITTEN; expected_ids.len() + tail]),
            Role::DocumentTokenStarts => words(&vec![UNWRITTEN; ends.len() + 1 + tail]),
            // One status word per block at most (the workgroups' look-back),
            // and the ticket and done counters, zero as the split leaves them.
            Role::SplitStatuses => vec![0; 8 * counts.len()],
            Role::SplitCounters => vec![0; 4 * COUNTER_WORDS as usize],
            other => panic!("`compact` binds {other:?}"),
        })
        .collect();
    let mut ids = expected_ids.clone();
    ids.resize(expected_ids.len() + tail, UNWRITTEN);
    let mut starts = expected_starts.clone();
    starts.resize(expected_starts.len() + tail, UNWRITTEN);
    for compact_workgroups in [1, 2, 3, 1024] {
        let capped = Geometry {
            compact_workgroups,
            ..geometry
        };
        let workgroups =
            Grid::Compaction.workgroups(&capped, u64::from(text_len), u64::from(documents));
        let outputs = run_step_alone(step, &inputs, workgroups);
        let what = format!("`compact` on {workgroups} workgroups");
        let got = words_of(outputs.of(Role::Ids));
        if got != ids {
            let first = got.iter().zip(&ids).position(|(got, want)| got != want);
            panic!("{what}: the ids differ first at {first:?}");
        }
        assert_eq!(
            words_of(outputs.of(Role::DocumentTokenStarts)),
            starts,
            "{what}: document starts"
        );
        for scratch in [Role::SplitStatuses, Role::SplitCounters] {
            assert!(
                outputs.of(scratch).iter().all(|&byte| byte == 0),
                "{what}: {scratch:?} not left zero for the next dispatch"
            );
        }
    }
}

/// Each document's token start offsets in the documents joined, from the CPU
/// encoder's ids (each token's bytes, one after another).
fn token_starts_joined(tokenizer: &Tokenizer, batch: &[Vec<u8>]) -> Vec<u32> {
    let mut starts = Vec::new();
    let mut at = 0u32;
    for document in batch {
        for id in tokenizer.encode_ordinary_bytes(document) {
            starts.push(at);
            at += tokenizer.decode_bytes(&[id]).unwrap().len() as u32;
        }
    }
    starts
}

/// Locks out capped `stage` and `compact` grids that lose, repeat or misplace
/// ids through the whole encode (a stage cap that leaves the text's tail or
/// the document ends unstaged; an aligned copy that overwrites the ids before
/// `running` or drops the ones past `4 · W`): with 32-thread workgroups (blocks
/// of 128 bytes), `stage_workgroups` and `compact_workgroups` of 1, 2 and 3,
/// batches of dozens of blocks (every shape, long pieces, empty documents, 120
/// documents of 20–800 bytes) encode to the CPU encoder's ids on all four
/// encodings. For each encoding the blocks start at every `running mod 32`
/// (with tokens) and so do the documents, and every batch's text (and the 120
/// documents' ends) take more than one pass of the capped `stage`.
#[test]
fn capped_stage_and_compact_grids_equal_cpu() {
    let mut random = SplitMix64::new(0xCA_95);
    let mut batches = batches_with_prose(&mut random, [3_000, 2_001], 31, &[8], 60);
    batches.push(
        (0..120)
            .map(|index| {
                generate(
                    Shape::ALL[index % 3],
                    20 + random.below(781) as usize,
                    index as u64,
                )
            })
            .collect(),
    );
    let geometry = small_geometry(16);
    let block_bytes = geometry.block_bytes();
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let [mut block_leads, mut document_leads] = [[false; 32]; 2];
        for batch in &batches {
            let starts = token_starts_joined(&tokenizer, batch);
            let text_len: usize = batch.iter().map(Vec::len).sum();
            for (running, count) in block_runs(&starts, text_len as u32, block_bytes) {
                block_leads[running as usize % 32] |= count > 0;
            }
            let mut running = 0;
            for document in batch {
                document_leads[running % 32] = true;
                running += tokenizer.encode_ordinary_bytes(document).len();
            }
        }
        assert!(
            block_leads.iter().all(|&seen| seen) && document_leads.iter().all(|&seen| seen),
            "{}: blocks {block_leads:?}, documents {document_leads:?}",
            tokenizer.name()
        );
        for [stage_workgroups, compact_workgroups] in [[1, 3], [2, 2], [3, 1]] {
            let capped = Geometry {
                stage_workgroups,
                compact_workgroups,
                ..geometry
            };
            let encoder = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                capped,
                STEP_BY_STEP,
            )
            .unwrap();
            let one_pass = (stage_workgroups * geometry.workgroup_size) as usize;
            for (index, batch) in batches.iter().enumerate() {
                let text_len: usize = batch.iter().map(Vec::len).sum();
                assert!(text_len > 8 * one_pass, "batch {index}");
                let what = format!(
                    "{stage_workgroups} workgroups of stage, {compact_workgroups} of compact, batch {index}"
                );
                check_batch(&encoder, &tokenizer, batch, &what);
            }
        }
    }
}

/// Locks out a merge loop that loses tiktoken's order (lowest rank, leftmost
/// on ties) on the inputs where merges overlap and new pairs form next to old
/// ones: every piece length from 1 to 384 bytes (the longest the merge step
/// takes at the default geometry) of a run of one letter, of `ab` repeated and
/// of random letters from `a`, `b`, `c`, each a document of one piece, equal
/// the CPU encoder for all four encodings.
#[test]
fn pieces_of_1_to_384_bytes_equal_cpu_every_encoding() {
    let mut random = SplitMix64::new(0x384A);
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for len in 1..=384usize {
        texts.push(vec![b'a'; len]);
        texts.push(b"ab".repeat(len.div_ceil(2))[..len].to_vec());
        texts.push((0..len).map(|_| *random.pick(b"abc")).collect());
    }
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        check_batch(
            &reference_encoder(&tokenizer),
            &tokenizer,
            &texts,
            "pieces of 1 to 384 bytes",
        );
    }
}

/// Locks out a scratch merge that finds the wrong part before its first part
/// (a part's last byte names the part's length, read instead of a walk back)
/// or leaves a block minimum stale (the part before's and the second part's
/// blocks are recomputed only when their minimum named the word that
/// changed): pieces of 13 to 160 bytes (past the slab, so in the scratch
/// arrays) of parts of one to several bytes that straddle the 16-byte blocks
/// (runs of spaces, random ideographs, ideographs and lower-case letters
/// mixed), each merged alone by the `merge` program, equal the CPU encoder on
/// all four encodings. Control: each one did merge in the scratch arrays; and
/// a build whose back words named one byte less, or that never recomputed the
/// second part's block, failed it (2026-12-04).
#[test]
fn scratch_merges_across_blocks_equal_cpu_every_encoding() {
    let mut random = SplitMix64::new(0xBAC_0DE);
    let mut texts: Vec<Vec<u8>> = Vec::new();
    let ideograph = |random: &mut SplitMix64| {
        let code_point = 0x4E00 + random.below(0x9FFF - 0x4E00 + 1);
        char::from_u32(code_point).unwrap_or('\u{4E00}').to_string()
    };
    for len in (13..=160usize).step_by(3) {
        texts.push(vec![b' '; len]);
        let mut cjk = String::new();
        while cjk.len() < len {
            cjk.push_str(&ideograph(&mut random));
        }
        texts.push(cjk.into_bytes());
        let mut mixed = String::new();
        while mixed.len() < len {
            if random.chance(1, 2) {
                mixed.push_str(&ideograph(&mut random));
            } else {
                mixed.push(*random.pick(&['a', 'b', 'n', 'e']));
            }
        }
        texts.push(mixed.into_bytes());
    }
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let vocabulary = DeviceVocabulary::new(tokenizer.vocabulary()).unwrap();
        for text in &texts {
            let (ids, _, scratch_written) = merge_one_piece_over(
                &tokenizer,
                text,
                Geometry::default(),
                (vocabulary.words(), vocabulary.token_bytes()),
            );
            let shown = String::from_utf8_lossy(text);
            assert_eq!(
                ids,
                tokenizer.encode_ordinary_bytes(text),
                "{} {shown:?}",
                encoding.name()
            );
            assert!(scratch_written, "{} {shown:?}", encoding.name());
        }
    }
}

/// One piece (the whole `text`, one token or not: listed, `merge` skips its
/// whole lookup, and a token's bytes merge to itself) through the `merge`
/// program alone on the reference interpreter at `geometry`: its ids (the ranks
/// `token_at` holds, in text order), the interpreter's work count and whether
/// it wrote the global scratch array `merge_parts`.
fn merge_one_piece(
    tokenizer: &Tokenizer,
    text: &[u8],
    geometry: Geometry,
) -> (Vec<u32>, u64, bool) {
    let vocabulary = DeviceVocabulary::new(tokenizer.vocabulary()).unwrap();
    merge_one_piece_over(
        tokenizer,
        text,
        geometry,
        (vocabulary.words(), vocabulary.token_bytes()),
    )
}

/// [`merge_one_piece`] over the vocabulary tables `(words, token_bytes)`.
fn merge_one_piece_over(
    tokenizer: &Tokenizer,
    text: &[u8],
    geometry: Geometry,
    (vocabulary_words, token_bytes): (&[u32], &[u8]),
) -> (Vec<u32>, u64, bool) {
    let programs = Programs::new(tokenizer.pattern(), geometry).unwrap();
    let step = step_named(&programs, "merge");
    let len = text.len() as u32;
    let mut params = chunk_params(len, 1);
    params[param::MERGE_COUNT as usize] = 1;
    let per_byte = words(&vec![NO_TOKEN; text.len()]);
    let inputs = bpe_step_inputs(
        step,
        (vocabulary_words, token_bytes),
        text,
        &params,
        &[0],
        2,
    );
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let workgroups = step
        .grid
        .workgroups(&programs.geometry, text.len() as u64, 1);
    let (outputs, stats) = reference::run_with_stats(
        &step.program,
        &refs,
        &DispatchConfig::linear(workgroups),
        &ReferenceOptions::default(),
    )
    .unwrap();
    let output = |wanted: Role| {
        &outputs[step
            .bindings
            .iter()
            .position(|&role| role == wanted)
            .unwrap()]
    };
    let token_at = output(Role::TokenAt);
    let scratch_written = output(Role::MergeParts)[..per_byte.len()] != per_byte[..];
    let ids = token_at
        .chunks_exact(4)
        .take(text.len())
        .map(|word| u32::from_le_bytes(word.try_into().unwrap()))
        .filter(|&rank| rank != NO_TOKEN)
        .collect();
    (ids, stats.work(), scratch_written)
}

/// Locks out a merge loop that looks its pairs up by their bytes (hashing the
/// merged bytes of the text and comparing them with the token's: 20–45 loads
/// per merge where the pair table of ranks takes 8–10) or loses a merge of the
/// pair table: a listed piece (no whole lookup) merged by the `merge` program
/// alone with every token byte zeroed still gets the CPU encoder's ids, in the
/// global scratch arrays and in the slab, for r50k and o200k (whose ranks
/// fill the slots' 18-bit fields). Negative control: with the pair table
/// emptied the same pieces stop after the first round of merges (of two
/// single bytes, from the dense 2-byte table): no token over 2 bytes, other
/// ids.
#[test]
fn merges_look_pairs_up_by_ranks_in_the_pair_table() {
    for encoding in [Encoding::R50kBase, Encoding::O200kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let vocabulary = DeviceVocabulary::new(tokenizer.vocabulary()).unwrap();
        let zeroed = vec![0u8; vocabulary.token_bytes().len()];
        let mut emptied = vocabulary.words().to_vec();
        let pairs_at = emptied[header::PAIR_SLOTS_AT as usize] as usize;
        emptied[pairs_at..].fill(NO_TOKEN);
        for text in [
            "internationalization",
            "antidisestablishmentarianism",
            "tokenizer",
            "aaaaaaaaaaa",
        ] {
            let text = text.as_bytes();
            assert!(text.len() > 12 || text.len() <= MERGE_SLAB_BYTES as usize);
            let expected = tokenizer.encode_ordinary_bytes(text);
            assert!(expected.len() < text.len(), "{text:?} merges");
            let (ids, _, _) = merge_one_piece_over(
                &tokenizer,
                text,
                Geometry::default(),
                (vocabulary.words(), &zeroed),
            );
            assert_eq!(ids, expected, "{}: {text:?}", encoding.name());
            let (unmerged, _, _) = merge_one_piece_over(
                &tokenizer,
                text,
                Geometry::default(),
                (&emptied, vocabulary.token_bytes()),
            );
            let longest = unmerged
                .iter()
                .map(|&id| tokenizer.vocabulary().token(id).unwrap().len())
                .max();
            assert_eq!(longest, Some(2), "{}: {text:?} control", encoding.name());
            assert_ne!(unmerged, expected, "{}: {text:?} control", encoding.name());
        }
    }
}

/// Locks out a merge loop whose cost grows with the square of a piece's
/// length (each merge rescanning every pair and shifting the parts after it
/// down one place in global memory: 1.8–2.1 ms of `merge` on an H200 for
/// pieces of ~200 bytes): the `merge` program's reference-interpreter work
/// for a 384-byte run of one letter, of spaces and of `ab` is at most 6 times
/// its work for a 96-byte one (4 times the bytes; the block minima scan grows
/// with the length too: 4.9–5.2 measured), with the CPU encoder's ids, on
/// r50k and cl100k. (Negative control: the shifting loop this replaced
/// measured 11.7–13.3 on the same inputs, 3.1 only for r50k's spaces, which
/// merge little.)
#[test]
fn merge_work_grows_linearly_with_a_run() {
    for encoding in [Encoding::R50kBase, Encoding::Cl100kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for unit in ["a", " ", "ab"] {
            let work: Vec<u64> = [96usize, 384]
                .iter()
                .map(|&len| {
                    let text = unit.repeat(len / unit.len()).into_bytes();
                    let (ids, work, _) = merge_one_piece(&tokenizer, &text, Geometry::default());
                    assert_eq!(
                        ids,
                        tokenizer.encode_ordinary_bytes(&text),
                        "{unit:?} × {len}"
                    );
                    work
                })
                .collect();
            let ratio = work[1] as f64 / work[0] as f64;
            eprintln!(
                "{} {unit:?}: work {work:?}, ratio {ratio:.2}",
                encoding.name()
            );
            assert!(
                ratio <= 6.0,
                "{} {unit:?}: work {work:?}, ratio {ratio:.2}",
                encoding.name()
            );
        }
    }
}

/// Locks out a slab path of the merge loop that takes the wrong ranges or
/// loses tiktoken's order: ranges of at most [`MERGE_SLAB_BYTES`] bytes merge
/// in the thread's slab of workgroup memory, longer ones in the global
/// scratch arrays. A range of exactly the slab's length that is not one token
/// leaves `merge_parts` as it was (negative control: with the slab off the
/// same range writes it), one byte longer writes it, both with the CPU
/// encoder's ids; and on all four encodings, batches of one-piece documents
/// of every length from 1 to twice the slab and two bytes (runs of one
/// letter, `ab` repeated, random letters: pieces that merge to one token and
/// pieces that do not, in neighbouring threads whose slabs interleave, a
/// thread taking several pieces in turn) equal the CPU encoder, step by step,
/// through the short-text kernel and through the resident grid (where such a
/// range merges in registers instead, up to `ShortText::register_merge_bytes`
/// and `Geometry::register_merge_bytes`, then in a keyed slab), at the
/// default geometry (16 bytes in the short-text kernel's registers, none in
/// the resident grid's, then up to 20 in their slab), at 32-thread
/// workgroups with 4-byte slabs, with 24-byte slabs, and with both fused
/// kernels' registers at their most (31 bytes: lengths up to 33 cross it) and
/// at none with no slab (every range in the scratch arrays there too), and
/// with their slab at other lengths (16 bytes in registers, then up to 24 in
/// the slab; none in registers, up to 31 in the slab). Each encoder is
/// checked to take the path its row names.
#[test]
fn ranges_up_to_the_slab_length_merge_in_the_slab_exactly() {
    let slab = MERGE_SLAB_BYTES as usize;
    let without = Geometry {
        merge_slab_bytes: 0,
        ..Geometry::default()
    };
    for encoding in [Encoding::R50kBase, Encoding::Cl100kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for unit in ["ab", "zqx", "a"] {
            for len in [slab, slab + 1] {
                let text = unit.repeat(len.div_ceil(unit.len())).into_bytes()[..len].to_vec();
                let expected = tokenizer.encode_ordinary_bytes(&text);
                let (ids, work, scratch) = merge_one_piece(&tokenizer, &text, Geometry::default());
                let (ids_without, work_without, scratch_without) =
                    merge_one_piece(&tokenizer, &text, without);
                assert_eq!(ids, expected, "{unit:?} × {len}");
                assert_eq!(ids_without, expected, "{unit:?} × {len}");
                eprintln!(
                    "{} {unit:?} × {len}: {} tokens, merge work {work} with the slab, {work_without} without",
                    encoding.name(),
                    expected.len()
                );
                if expected.len() > 1 {
                    assert!(scratch_without, "{unit:?} × {len}: control");
                    assert_eq!(scratch, len > slab, "{unit:?} × {len}: scratch written");
                }
            }
        }
    }
    let mut random = SplitMix64::new(0x51AB);
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for len in 1..=(2 * slab).max(MAX_REGISTER_MERGE_BYTES as usize) + 2 {
        texts.push(vec![b'a'; len]);
        texts.push(b"ab".repeat(len.div_ceil(2))[..len].to_vec());
        texts.push((0..len).map(|_| *random.pick(b"abcdefgz")).collect());
    }
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for (label, geometry) in [
            ("default", Geometry::default()),
            ("32 threads", short_geometry()),
            (
                "24-byte slabs",
                Geometry {
                    merge_slab_bytes: 24,
                    ..Geometry::default()
                },
            ),
            (
                "31 bytes in registers",
                fused_merge(MAX_REGISTER_MERGE_BYTES, FUSED_MERGE_SLAB_BYTES),
            ),
            ("no registers, no slab", fused_merge(0, 0)),
            (
                "16 bytes in registers, then a 24-byte slab",
                fused_merge(16, 24),
            ),
            ("no registers, a 31-byte slab", fused_merge(0, 31)),
            (
                "short-text workgroup of 1,024 threads × 1 byte",
                Geometry {
                    short_text: ShortText {
                        workgroup_size: 1024,
                        bytes_per_thread: 1,
                        ..ShortText::default()
                    },
                    ..Geometry::default()
                },
            ),
        ] {
            for (path, limits) in [
                ("step by step", STEP_BY_STEP),
                ("short", ChunkLimits::default()),
                ("resident", resident_from_the_first_byte()),
            ] {
                let encoder = DeviceEncoder::with_geometry(
                    AnyBackend::reference(),
                    &tokenizer,
                    geometry,
                    limits,
                )
                .unwrap();
                let bytes = texts.iter().map(|text| text.len() as u64).sum();
                assert_eq!(
                    encoder.runs_resident(bytes),
                    path == "resident",
                    "{label}, {path}"
                );
                check_batch(&encoder, &tokenizer, &texts, &format!("{label}, {path}"));
            }
        }
    }
}

/// The default geometry with both fused kernels' `merge` keeping ranges of up
/// to `registers` bytes in registers (the short-text kernel's and the
/// resident grid's alike), then up to `slab` bytes in a slab.
fn fused_merge(registers: u32, slab: u32) -> Geometry {
    Geometry {
        register_merge_bytes: registers,
        fused_merge_slab_bytes: slab,
        short_text: ShortText {
            register_merge_bytes: registers,
            ..ShortText::default()
        },
        ..Geometry::default()
    }
}

/// No short-text kernel, the resident grid up to 24 KiB: every text of at
/// most that takes the resident grid.
fn resident_from_the_first_byte() -> ChunkLimits {
    ChunkLimits {
        short_text_bytes: 0,
        ..resident_up_to_24_kib()
    }
}

/// Locks out a lookup by bytes that takes a piece for a token whose hash and
/// length match but whose bytes do not (the compare with the token's bytes:
/// byte by byte in the standalone steps, in rounds in the fused kernels): two
/// 6-letter words with one device hash, the first a token of a small
/// vocabulary (every byte, that word, and the second's byte pairs, so that
/// the encoder's split keeps the second one piece) and the second not. The
/// second alone, the first alone, and 3 KiB of both on lines of their own
/// encode to the CPU encoder's ids step by step, through the
/// short-text kernel and through the resident grid. Negative control: the two
/// words do collide, and the host's table finds the first and not the second.
#[test]
fn a_piece_whose_hash_matches_a_token_is_not_that_token() {
    use std::collections::hash_map::{Entry, HashMap};
    use vyre_tokenizer::device::vocabulary::{hash, DeviceVocabulary};
    use vyre_tokenizer::Vocabulary;
    let mut random = SplitMix64::new(0xC011);
    let mut seen: HashMap<u32, Vec<u8>> = HashMap::new();
    let (token, other) = loop {
        let word: Vec<u8> = (0..6)
            .map(|_| *random.pick(b"abcdefghijklmnopqrstuvwxyz"))
            .collect();
        match seen.entry(hash(&word)) {
            Entry::Occupied(first) if *first.get() != word => break (first.get().clone(), word),
            Entry::Occupied(_) => {}
            Entry::Vacant(slot) => {
                slot.insert(word);
            }
        }
    };
    assert_eq!(hash(&token), hash(&other));
    let mut lines =
        tiktoken_text::vocabulary_text(&format!("{} 256\n", tiktoken_text::base64(&token)));
    // The second word's byte pairs are tokens too: the encoder's split cuts
    // between bytes no token joins, and the word must stay one piece.
    let mut pairs: Vec<&[u8]> = other.windows(2).collect();
    pairs.sort();
    pairs.dedup();
    for (rank, pair) in (257..).zip(pairs) {
        lines.push_str(&format!("{} {rank}\n", tiktoken_text::base64(pair)));
    }
    let vocabulary = Vocabulary::from_tiktoken_bytes(lines.as_bytes()).unwrap();
    let tokenizer = Tokenizer::new(vocabulary, Pattern::Cl100k, &[]).unwrap();
    let device = DeviceVocabulary::new(tokenizer.vocabulary()).unwrap();
    assert_eq!(device.lookup(&token), Some(256));
    assert_eq!(device.lookup(&other), None);
    assert_ne!(tokenizer.encode_ordinary_bytes(&other), [256]);
    let mut both = Vec::new();
    while both.len() < 3 << 10 {
        for word in [&token, &other] {
            both.extend_from_slice(word);
            both.push(b'\n');
        }
    }
    for (path, limits) in [
        ("step by step", STEP_BY_STEP),
        ("fused", ChunkLimits::default()),
    ] {
        let encoder = DeviceEncoder::with_geometry(
            AnyBackend::reference(),
            &tokenizer,
            Geometry::default(),
            limits,
        )
        .unwrap();
        for text in [&other, &token, &both] {
            check_batch(
                &encoder,
                &tokenizer,
                std::slice::from_ref(text),
                &format!("{path}, {} bytes", text.len()),
            );
        }
    }
}

/// The bodies (their lines) of the loops of `printed` (a program as `Display`
/// prints it) that write a range's first state in rounds: those whose
/// variable ends in `_init` and that look pairs of bytes up (the serial path's
/// loop, which writes one byte's rank an iteration, is not one).
fn first_state_loops(printed: &str) -> Vec<Vec<&str>> {
    let lines: Vec<&str> = printed.lines().collect();
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut loops = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() > 1 && words[0] == "for" && words[1].ends_with("_init") {
            let body = lines[index + 1..]
                .iter()
                .take_while(|body| {
                    !(indent(body) == indent(line) && body.trim_start().starts_with('}'))
                })
                .copied()
                .collect::<Vec<&str>>();
            if body.iter().any(|line| line.contains("<< 8u) |")) {
                loops.push(body);
            }
        }
    }
    loops
}

/// Whether `body` loads text (the next round's bytes) and no rank lookup in it
/// reads a byte that the same round loaded from the text.
fn ranks_read_bytes_loaded_a_round_ahead(body: &[&str]) -> bool {
    let loaded: Vec<&str> = body
        .iter()
        .filter_map(|line| {
            let (name, value) = line.trim().strip_prefix("let ")?.split_once(" = ")?;
            value.starts_with("text[").then_some(name)
        })
        .collect();
    let names = |line: &str| -> Vec<String> {
        line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map(str::to_owned)
            .collect()
    };
    !loaded.is_empty()
        && body
            .iter()
            .filter(|line| line.contains("vocabulary["))
            .all(|line| {
                !names(line)
                    .iter()
                    .any(|name| loaded.contains(&name.as_str()))
            })
}

/// Locks out a first state whose round loads its own bytes and then looks
/// their ranks up: a warp waits a text round trip before each round's ranks
/// can go out (on the H200, Nsight Compute put about 40 % of `merge`'s warp
/// samples on 8 MiB of CJK in that loop). Each round's lookups must read
/// bytes the round before loaded. Checked for every loop that writes a first
/// state in `merge` (slab and scratch) and `long`, at the default geometry
/// and at 32-thread workgroups, for GPT-2's and cl100k's patterns; (negative
/// control) a round that loads a byte and looks it up fails the check.
#[test]
fn first_state_rounds_look_up_bytes_loaded_a_round_ahead() {
    for pattern in [Pattern::Gpt2, Pattern::Cl100k] {
        for geometry in [Geometry::default(), short_geometry()] {
            let programs = Programs::new(pattern, geometry).expect("geometry");
            for (name, loops) in [("merge", 2), ("long", 1)] {
                let printed = step_named(&programs, name).program.to_string();
                let bodies = first_state_loops(&printed);
                assert!(bodies.len() >= loops, "{name}: {} loops", bodies.len());
                for body in &bodies {
                    assert!(
                        ranks_read_bytes_loaded_a_round_ahead(body),
                        "{pattern:?} {name}: {body:#?}"
                    );
                }
            }
        }
    }
    let same_round = "\
        for e_init in 0u..e_init_rounds {\n\
            let e_init_byte0 = text[(e_start + e_init)];\n\
            let e_init_byte1 = text[(e_start + e_init + 1u)];\n\
            let e_init_rank0 = vocabulary[(e_init_byte0 + 16u)];\n\
            let e_init_pair0 = vocabulary[(((e_init_byte0 << 8u) | e_init_byte1) + 272u)];\n\
            token_at[(e_start + e_init)] = e_init_rank0;\n\
        }\n";
    let bodies = first_state_loops(same_round);
    assert_eq!(bodies.len(), 1);
    assert!(!ranks_read_bytes_loaded_a_round_ahead(&bodies[0]));
}

/// Workgroups of 32 threads for every step, the split's included (the short-text
/// kernel needs one size), with 8-byte chunks and 64-byte split blocks: a text
/// of a few KiB is many groups of every step, which one workgroup runs in turn.
fn short_geometry() -> Geometry {
    with_fused_steps_in_32_threads(small_geometry(16))
}

/// `random` random strings of up to 60 units, the long pieces cut at 8 bytes and
/// 40 documents with empty ones, all drawn from `seed`: the fused kernels' texts.
fn mixed_texts(seed: u64, random: usize) -> Vec<Vec<u8>> {
    let mut stream = SplitMix64::new(seed);
    let mut texts = random_texts(&mut stream, random, 60);
    texts.extend(
        long_piece_texts(8, &mut stream)
            .into_iter()
            .map(|(_, text)| text),
    );
    texts.extend(batch_with_empty_documents(&mut stream, 40));
    texts
}

/// `texts` cut into batches of whole texts of at most `bytes` bytes each.
fn batches_within(texts: &[Vec<u8>], bytes: usize) -> Vec<Vec<Vec<u8>>> {
    let mut batches: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
    let mut total = 0;
    for text in texts.iter().filter(|text| text.len() <= bytes) {
        if total + text.len() > bytes {
            batches.push(Vec::new());
            total = 0;
        }
        total += text.len();
        batches
            .last_mut()
            .expect("one batch at least")
            .push(text.clone());
    }
    batches
}

/// Locks out a short-text kernel that differs from the steps it fuses (a
/// workgroup builtin rewritten wrong, a workgroup buffer not cleared between
/// the groups one workgroup runs in turn, a step's buffer bound to another
/// role, a group count off by one, a step reading what the one before it has
/// not yet written, `stage`'s text not stored as the bytes the later steps
/// read): on all four encodings, at the default geometry, at one of 32-thread
/// workgroups (many groups per step) and with the short-text kernel in one
/// workgroup of 1,024 threads, batches of random strings, of long pieces and of
/// empty and short documents, each at most 4,096 bytes, run as `short` (one
/// dispatch, so the per-step path is not what passes) and equal the CPU
/// encoder, with the same device counts as the steps one by one; a 4,097-byte
/// text runs every step.
#[test]
fn short_texts_through_one_workgroup_equal_cpu() {
    let batches = batches_within(&mixed_texts(0x5407, 120), 4096);
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for (label, geometry) in [
            ("default", Geometry::default()),
            ("32 threads", short_geometry()),
        ] {
            let short = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                geometry,
                ChunkLimits {
                    short_text_bytes: SHORT_TEXT_BYTES,
                    resident_text_bytes: 0,
                    ..ChunkLimits::default()
                },
            )
            .unwrap();
            let step_by_step = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                geometry,
                STEP_BY_STEP,
            )
            .unwrap();
            assert!(short.runs_short(4096) && !short.runs_short(4097), "{label}");
            assert!(!step_by_step.runs_short(1), "{label}");
            for (index, batch) in batches.iter().enumerate() {
                let what = format!("{label}, batch {index}");
                check_one_fused_dispatch(&short, &step_by_step, &tokenizer, batch, "short", &what);
            }
            let long = b"a".repeat(4097);
            check_every_step_runs(&short, &tokenizer, long, &format!("{label}, 4,097 bytes"));
        }
    }
}

/// Locks out a resident-grid kernel that differs from the steps it fuses (a
/// group dealt to no workgroup or to two, a step reading what another
/// workgroup has not yet written because a grid sync is missing, a look-back
/// that waits for a group dealt to a later round of its own workgroup, `stage`
/// or `pieces` striding over a grid of another size than the one they run on,
/// the text length read before `stage` copied it): on all four encodings, at
/// the default geometry with the grid as large as the text asks and at
/// 32-thread workgroups with the grid capped at 3 workgroups (each step's
/// groups dealt out over many rounds), batches of 4,097 bytes to 24 KiB of
/// random strings, long pieces, empty documents and the three shapes run as
/// one `resident` dispatch and equal the CPU encoder, with the same device
/// counts as the steps one by one; a text past the limit runs every step.
#[test]
fn resident_grid_equals_cpu() {
    let mut batches: Vec<Vec<Vec<u8>>> = batches_within(&mixed_texts(0x7e51, 400), 12 << 10)
        .into_iter()
        .filter(|batch| batch.iter().map(Vec::len).sum::<usize>() > 4096)
        .collect();
    batches.extend(
        Shape::ALL
            .iter()
            .map(|&shape| vec![generate(shape, 24 << 10, 31)]),
    );
    assert!(batches.len() >= 4, "{} batches", batches.len());
    let limits = resident_up_to_24_kib();
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for (label, geometry) in [
            ("default", Geometry::default()),
            (
                "32 threads, 3 workgroups",
                Geometry {
                    resident_workgroups: Some(3),
                    ..short_geometry()
                },
            ),
        ] {
            let resident =
                DeviceEncoder::with_geometry(AnyBackend::reference(), &tokenizer, geometry, limits)
                    .unwrap();
            let step_by_step = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                geometry,
                STEP_BY_STEP,
            )
            .unwrap();
            assert!(
                resident.runs_short(4096) && !resident.runs_resident(4096),
                "{label}"
            );
            assert!(
                resident.runs_resident(4097) && resident.runs_resident(24 << 10),
                "{label}"
            );
            assert!(!resident.runs_resident((24 << 10) + 1), "{label}");
            assert!(!step_by_step.runs_resident(4097), "{label}");
            for (index, batch) in batches.iter().enumerate() {
                let what = format!("{label}, batch {index}");
                check_one_fused_dispatch(
                    &resident,
                    &step_by_step,
                    &tokenizer,
                    batch,
                    "resident",
                    &what,
                );
            }
            let past = generate(Shape::Prose, (24 << 10) + 1, 37);
            check_every_step_runs(
                &resident,
                &tokenizer,
                past,
                &format!("{label}, past the limit"),
            );
        }
    }
}

/// Locks out an encoder that feeds its text to the running resident kernel
/// (`with_text_fed(true)`) and loses it where it cannot feed: on the reference
/// interpreter, whose buffers are not host-mapped, the gather that staging
/// leaves to the replay happens before it, with every ready flag set. Three
/// documents in one resident chunk, eagerly (twice, the slot's graph reused)
/// and one text through an `EncodeGraph`, equal the CPU encoder. Negative
/// control by hand: a fallback that skips the gather gives other ids.
#[test]
fn a_fed_encoder_stages_first_where_it_cannot_feed() {
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let encoder = resident_reference_encoder(&tokenizer).with_text_fed(true);
    let texts: Vec<Vec<u8>> = Shape::ALL
        .iter()
        .map(|&shape| generate(shape, 3 << 10, 53))
        .collect();
    let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    assert!(encoder.runs_resident(refs.iter().map(|text| text.len() as u64).sum()));
    let expected: Vec<Vec<u32>> = refs
        .iter()
        .map(|text| tokenizer.encode_ordinary_bytes(text))
        .collect();
    for _ in 0..2 {
        assert_eq!(encoder.encode_batch_bytes(&refs).unwrap(), expected);
    }
    let joined = texts.concat();
    let mut graph = encoder.graph(joined.len()).unwrap();
    assert_eq!(
        graph.encode(&joined).unwrap(),
        tokenizer.encode_ordinary_bytes(&joined)
    );
}

/// Locks out an eager chunk of a fused kernel whose replay of its slot's
/// graph differs from the dispatch (a kernel node left with an earlier
/// chunk's length, documents or grid; a slot's host-mapped buffers written or
/// read past the graph that holds them; a `BatchIds` part that takes an ids
/// buffer a graph still writes), and a short-text chunk submitted alone that
/// replays (its submission would wait for the kernel): on cl100k and r50k,
/// resident up to 24 KiB, lengths from 4,097 bytes to 24 KiB over three
/// slots, several documents, the short-text kernel (submitted, and replayed as
/// a batch of one chunk, in turn with resident chunks) and the steps on the
/// same slots, `BatchIds` between replays, all equal the CPU; negative
/// control: the same encoder with `with_fused_graphs(false)` replays nothing,
/// with the same ids.
#[test]
fn eager_fused_chunks_replay_their_slots_graph() {
    for encoding in [Encoding::Cl100kBase, Encoding::R50kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = || resident_reference_encoder(&tokenizer);
        device_batches::assert_fused_chunks_replay_their_slots_graph(
            &encoder(),
            &encoder().with_fused_graphs(false),
            &tokenizer,
            (
                &[8 << 10, 4097, 6000, 20 << 10, 13_000, 24 << 10],
                1000,
                30 << 10,
            ),
        );
    }
}

/// Encodes `batch` with `fused` and checks the CPU encoder's ids, one dispatch of
/// the fused kernel named `kernel` (when any document is not empty), the same
/// device counts as `step_by_step`'s, and the fused kernel's step clocks: one
/// per step of the encoder, named as its steps and in their order, each later
/// than the one before (every step does work, which the reference clock
/// counts), where the steps one by one keep none.
fn check_one_fused_dispatch(
    fused: &DeviceEncoder,
    step_by_step: &DeviceEncoder,
    tokenizer: &Tokenizer,
    batch: &[Vec<u8>],
    kernel: &str,
    what: &str,
) {
    check_batch(fused, tokenizer, batch, what);
    let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
    let mut results = vec![Vec::new(); refs.len()];
    let timings = fused
        .submit_bytes(&refs)
        .and_then(|pending| pending.wait_into(&mut results))
        .unwrap();
    let names: Vec<&str> = timings.steps.iter().map(|step| step.name).collect();
    if refs.iter().any(|text| !text.is_empty()) {
        assert_eq!(names, [kernel], "{what}");
    }
    let (_, fused_counts) = fused.encode_counted(&refs).unwrap();
    let (_, step_counts) = step_by_step.encode_counted(&refs).unwrap();
    assert_eq!(fused_counts.counts, step_counts.counts, "{what}");
    assert!(step_counts.step_clocks.is_empty(), "{what}");
    if refs.iter().any(|text| !text.is_empty()) {
        let clocks = &fused_counts.step_clocks;
        let clock_names: Vec<&str> = clocks.iter().map(|clock| clock.name).collect();
        assert_eq!(clock_names, fused.step_names(), "{what}: {clocks:?}");
        assert!(
            clocks.first().is_some_and(|first| first.end > 0)
                && clocks.windows(2).all(|pair| pair[0].end < pair[1].end),
            "{what}: {clocks:?}"
        );
        assert!(fused_counts.kernel_line().contains(" [stage "), "{what}");
    }
}

/// Encodes `text` with `encoder` and checks the CPU encoder's ids and that
/// every step ran its own dispatch.
fn check_every_step_runs(
    encoder: &DeviceEncoder,
    tokenizer: &Tokenizer,
    text: Vec<u8>,
    what: &str,
) {
    check_batch(encoder, tokenizer, std::slice::from_ref(&text), what);
    let mut results = vec![Vec::new()];
    let timings = encoder
        .submit_bytes(&[&text])
        .and_then(|pending| pending.wait_into(&mut results))
        .unwrap();
    assert_eq!(
        timings.steps.len(),
        encoder.programs().steps().len(),
        "{what}: every step runs"
    );
}

/// Locks out workgroup shapes past 48 KiB of workgroup memory that build but
/// encode wrongly (a dynamic pool whose buffers overlap, or programs refused
/// that the device now takes): the split in blocks of 4 KiB (512 threads × 8
/// bytes, 1,024 × 4) and 8 KiB (1,024 × 8), and BPE workgroups of 512 threads
/// with 12-byte slabs (24 KiB of them), each build on the reference backend
/// (an H200's limits: 227 KiB a kernel) and encode 9 KiB of prose, CJK and code
/// (cl100k; o200k's split is the same pair of programs) to the CPU encoder's
/// ids, the short-text kernel on for the BPE shape. Negative control: under the
/// static 48 KiB (`Limits::default`) the 8 KiB split (64 KiB of block words) is
/// refused with the validator's `Fix:` naming 49152 bytes.
#[test]
fn device_ids_equal_cpu_with_workgroup_memory_past_48_kib() {
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let default = Geometry::default();
    let split = |workgroup_size, bytes_per_thread| {
        default.with_split_workgroups(workgroup_size, bytes_per_thread)
    };
    let texts: Vec<Vec<u8>> = Shape::ALL
        .iter()
        .map(|&shape| generate(shape, 9 * 1024, 29))
        .collect();
    let wide_bpe = Geometry {
        workgroup_size: 512,
        merge_slab_bytes: MERGE_SLAB_BYTES,
        ..default
    };
    for (geometry, limits) in [
        (split(512, 8), STEP_BY_STEP),
        (split(1024, 4), STEP_BY_STEP),
        (split(1024, 8), STEP_BY_STEP),
        (wide_bpe, ChunkLimits::default()),
    ] {
        let encoder =
            DeviceEncoder::with_geometry(AnyBackend::reference(), &tokenizer, geometry, limits)
                .unwrap_or_else(|error| panic!("{geometry:?}: {error}"));
        check_batch(&encoder, &tokenizer, &texts, &format!("{geometry:?}"));
    }
    let static_limit = AnyBackend::reference_with(ReferenceOptions {
        limits: vyre_cuda::ir::Limits::default(),
        ..ReferenceOptions::default()
    });
    let refused =
        DeviceEncoder::with_geometry(static_limit, &tokenizer, split(1024, 8), STEP_BY_STEP);
    let error = match refused {
        Ok(_) => panic!("the 8 KiB split was built under 48 KiB"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("Fix:"), "{error}");
    assert!(
        error.contains("over the device limit of 49152 bytes"),
        "{error}"
    );
}

/// Locks out a resident grid that counts on the multiprocessors of a lane
/// running on the encoder's backend (a cooperative grid waits until every
/// workgroup is resident, and a lane's blocks stay for the lane's life; the
/// backend refuses such a grid with `GridTooLargeForGridSync`): beside a lane
/// with a block on every multiprocessor no workgroup of the resident kernel
/// fits, so a mid-size text runs its steps one by one and still equals the
/// CPU encoder; once the lane is dropped it runs resident again (the negative
/// control: the same text and encoder without the lane).
#[test]
fn resident_grids_leave_a_running_lanes_multiprocessors_out() {
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).unwrap();
    let encoder = resident_reference_encoder(&tokenizer);
    let text = generate(Shape::Prose, 8 << 10, 41);
    assert!(encoder.runs_resident(text.len() as u64));
    let lane = lane_on_every_multiprocessor(encoder.backend());
    assert!(!encoder.runs_resident(text.len() as u64));
    check_every_step_runs(&encoder, &tokenizer, text.clone(), "beside the lane");
    drop(lane);
    assert!(encoder.runs_resident(text.len() as u64));
    check_batch(&encoder, &tokenizer, &[text], "after the lane");
}

/// A reference encoder at the default geometry with [`resident_up_to_24_kib`].
fn resident_reference_encoder(tokenizer: &Tokenizer) -> DeviceEncoder {
    DeviceEncoder::with_geometry(
        AnyBackend::reference(),
        tokenizer,
        Geometry::default(),
        resident_up_to_24_kib(),
    )
    .expect("device encoder")
}

/// The short-text kernel up to 4 KiB, the resident grid up to 24 KiB.
fn resident_up_to_24_kib() -> ChunkLimits {
    ChunkLimits {
        short_text_bytes: SHORT_TEXT_BYTES,
        resident_text_bytes: 24 << 10,
        ..ChunkLimits::default()
    }
}

/// A lane of the reference `backend` with a block on every multiprocessor:
/// beside it no workgroup of a cooperative grid fits.
fn lane_on_every_multiprocessor(backend: &AnyBackend) -> vyre_cuda::backend::AnyLane {
    use vyre_cuda::backend::LaneOptions;
    // Any kernel serves: with a block on every multiprocessor the lane leaves
    // no cooperative grid room, whatever it runs.
    let fixture = vyre_cuda::fixtures::host_cost_fixture(2, 1);
    let kernel = backend
        .compile(&fixture, &DispatchConfig::linear(1))
        .unwrap();
    // The reference backend's device has as many multiprocessors as an H200.
    let multiprocessors = vyre_cuda::backend::ReferenceBackend::new().caps().sm_count;
    assert!(matches!(backend, AnyBackend::Reference(_)));
    backend
        .lane(&[&kernel], LaneOptions::new().blocks(multiprocessors))
        .unwrap()
}

/// Locks out a resident-length text's graph recorded step by step (six kernel
/// nodes and three uploads where one cooperative kernel does the work), one that
/// replays a stale text, and a replay that counts on a lane's multiprocessors (on
/// CUDA it would wait for the lane forever): on cl100k and r50k, graphs of 4,097
/// bytes and 8 KiB record one dispatch, and three texts of each length in turn
/// (prose, the same upper-cased, the first again; each read in place and into a
/// vector) equal the CPU encoder; beside a lane on every multiprocessor, started
/// after the recording, a replay is a `Fix:` error, and once the lane is dropped
/// the graph replays again. Negative controls: consecutive texts have other ids
/// (so a stale text fails); the same lengths through an encoder without the
/// resident grid record every step but `stage` and give the same ids.
#[test]
fn resident_grid_graphs_run_one_cooperative_kernel() {
    for encoding in [Encoding::Cl100kBase, Encoding::R50kBase] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let resident = resident_reference_encoder(&tokenizer);
        let step_by_step = reference_encoder(&tokenizer);
        let steps = step_by_step.step_names().len();
        for bytes in [4097, 8 << 10] {
            assert!(resident.runs_resident(bytes as u64));
            let prose = generate(Shape::Prose, bytes, bytes as u64);
            let texts = [prose.clone(), prose.to_ascii_uppercase(), prose];
            for (encoder, one_kernel) in [(&resident, true), (&step_by_step, false)] {
                let what = format!("{encoding:?}, {bytes} bytes, one kernel {one_kernel}");
                let dispatches = if one_kernel { 1 } else { steps - 1 };
                check_graph_texts(encoder, &tokenizer, &texts, dispatches, &what);
            }
        }
        let text = generate(Shape::Code, 8 << 10, 5);
        let mut graph = resident.graph(text.len()).unwrap();
        let lane = lane_on_every_multiprocessor(resident.backend());
        let error = graph.encode(&text).unwrap_err();
        assert!(
            error.message().starts_with("Fix:") && error.message().contains("lane"),
            "{error}"
        );
        drop(lane);
        assert_eq!(
            graph.encode(&text).unwrap(),
            tokenizer.encode_ordinary_bytes(&text),
            "{encoding:?}, after the lane"
        );
    }
}

/// Locks out a default that is not the measured one: the fused kernels (short
/// texts, the resident grid) compiled without bounds checks, every step kernel
/// with them; and each `BoundsChecks` giving the kernels what its name says.
#[test]
fn the_default_leaves_bounds_checks_out_of_the_fused_kernels_only() {
    let checks = |bounds_checks: BoundsChecks| {
        let geometry = Geometry {
            bounds_checks,
            ..Geometry::default()
        };
        (
            geometry.step_codegen().bounds_checks,
            geometry.fused_codegen().bounds_checks,
        )
    };
    assert_eq!(Geometry::default().bounds_checks, BoundsChecks::StepKernels);
    assert_eq!(checks(BoundsChecks::StepKernels), (true, false));
    assert_eq!(checks(BoundsChecks::Everywhere), (true, true));
    assert_eq!(checks(BoundsChecks::Nowhere), (false, false));
}

/// Locks out a tokenizer kernel that reads or writes past a buffer's end, the
/// proof the default's fused kernels without bounds checks rest on
/// ([`BoundsChecks`]; here every kernel goes without): with the checks off, the
/// reference interpreter fails a dispatch whose access is out of range (an
/// `Err` naming the program) instead of reading 0, and every encoding's steps
/// one by one, its short-text kernel (chunks of at most 2 KiB) and its
/// resident grid (each batch one chunk) encode the corpus, three 3,000-byte
/// shapes and 100 random strings to the CPU encoder's ids. Negative control: a program
/// that reads one element past its buffer reads 0 with the checks on and is an
/// `Err` with them off.
#[test]
fn every_kernel_stays_inside_its_buffers_with_bounds_checks_off() {
    use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};
    let past_the_end = Program::builder([1, 1, 1])
        .entry_op_id("past_the_end")
        .buffer(
            "input",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "output",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            b.store("output", gid.clone(), Expr::load("input", gid + 1u32));
        })
        .build();
    let input = 7u32.to_le_bytes();
    let output = [0u8; 4];
    let run = |bounds_checks: BoundsChecks| {
        let codegen = Geometry {
            bounds_checks,
            ..Geometry::default()
        }
        .step_codegen();
        reference::run(
            &past_the_end,
            &[&input[..], &output[..]],
            &DispatchConfig::linear(1).with_codegen(codegen),
        )
    };
    assert_eq!(
        run(BoundsChecks::Everywhere).expect("checked").concat(),
        [0u8; 4]
    );
    let error = run(BoundsChecks::Nowhere)
        .expect_err("an unchecked access past the end")
        .to_string();
    assert!(error.contains("past_the_end"), "{error}");

    let unchecked = Geometry {
        bounds_checks: BoundsChecks::Nowhere,
        ..Geometry::default()
    };
    let corpus = split_corpus::corpus(oracle::corpus());
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        let encoder = |limits| {
            DeviceEncoder::with_geometry(AnyBackend::reference(), &tokenizer, unchecked, limits)
                .expect("device encoder")
        };
        // Chunks of at most 2 KiB: each one through the short-text kernel.
        let short = encoder(ChunkLimits {
            text_bytes: 2048,
            ..ChunkLimits::default()
        });
        let resident = encoder(ChunkLimits::default());
        let step_by_step = encoder(STEP_BY_STEP);
        let mut random = SplitMix64::new(0xB0B0 + encoding as u64);
        let texts = random_texts(&mut random, 100, 16);
        let shapes: Vec<Vec<u8>> = Shape::ALL
            .iter()
            .map(|&shape| generate(shape, 3000, 5))
            .collect();
        for (what, batch) in [
            ("corpus", &corpus),
            ("random strings", &texts),
            ("shapes", &shapes),
        ] {
            let bytes: usize = batch.iter().map(Vec::len).sum();
            assert!(short.runs_short(2048) && resident.runs_resident(bytes as u64));
            for (path, encoder) in [
                ("chunks of 2 KiB, short-text kernel", &short),
                ("one chunk, resident grid", &resident),
                ("step by step", &step_by_step),
            ] {
                check_batch(encoder, &tokenizer, batch, &format!("{what}, {path}"));
            }
        }
    }
}
