//! Inputs and checks shared by the device encoder's tests on the reference
//! interpreter (`tests/device_encode.rs`) and on CUDA (`tests/gpu_encode.rs`):
//! texts whose pieces fall in every length class, batches with empty
//! documents, documents cut inside runs, and the check that holds a device
//! batch to the CPU encoder.
//! Include it with `#[path = "support/device_batches.rs"] mod device_batches;`
//! beside `mod oracle;` and `mod split_corpus;`.
#![allow(dead_code)]

use vyre_cuda::backend::AnyBackend;
use vyre_tokenizer::device::fused::{RESIDENT_TEXT_BYTES, SHORT_TEXT_BYTES};
use vyre_tokenizer::device::pipeline::{CHUNK_DOCUMENTS, CHUNK_TEXT_BYTES};
use vyre_tokenizer::device::{BatchIds, ChunkLimits, DeviceEncoder, Geometry, ShortText};
use vyre_tokenizer::pretokenize::pattern::piece_starts;
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::pretokenize::Geometry as SplitGeometry;
use vyre_tokenizer::Tokenizer;

use crate::{oracle, split_corpus};

/// Each text's device ids, asserted equal to the CPU encoder's
/// (`encode_ordinary_bytes`, which `tests/encode.rs` holds to tiktoken-rs and
/// bpe-openai); `what` names the batch in a failure.
pub fn check_batch(encoder: &DeviceEncoder, tokenizer: &Tokenizer, texts: &[Vec<u8>], what: &str) {
    let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    let got = encoder.encode_batch_bytes(&refs).unwrap_or_else(|error| {
        panic!("{} {what}: device encode failed: {error}", tokenizer.name())
    });
    assert_eq!(got.len(), texts.len(), "{what}: one result per text");
    for (index, ids) in got.iter().enumerate() {
        assert_cpu_ids(tokenizer, texts, index, ids, what);
    }
}

/// Asserts `got`, the device's ids of `texts[index]`, equal to the CPU
/// encoder's, naming the text and both ids' starts in a failure; the CPU's
/// count of ids.
fn assert_cpu_ids(
    tokenizer: &Tokenizer,
    texts: &[Vec<u8>],
    index: usize,
    got: &[u32],
    what: &str,
) -> usize {
    let text = &texts[index];
    let expected = tokenizer.encode_ordinary_bytes(text);
    if got != expected {
        panic!(
            "{} {what}: text {index} of {} ({} bytes) differs: device {:?}, cpu {:?}, text {:?}",
            tokenizer.name(),
            texts.len(),
            text.len(),
            &got[..got.len().min(40)],
            &expected[..expected.len().min(40)],
            String::from_utf8_lossy(&text[..text.len().min(120)])
        );
    }
    expected.len()
}

/// Each text's device ids through `encode_batch_ids` into `ids` (reused from
/// whatever batch it held before), asserted equal to the CPU encoder's, with
/// exactly one document per text and nothing past the last; `what` names the
/// batch in a failure.
pub fn check_batch_ids(
    encoder: &DeviceEncoder,
    tokenizer: &Tokenizer,
    texts: &[Vec<u8>],
    ids: &mut BatchIds,
    what: &str,
) {
    let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
    encoder
        .encode_batch_ids(&refs, ids)
        .unwrap_or_else(|error| {
            panic!("{} {what}: device encode failed: {error}", tokenizer.name())
        });
    assert_eq!(ids.len(), texts.len(), "{what}: one document per text");
    assert_eq!(ids.get(texts.len()), None, "{what}: nothing past the last");
    let mut tokens = 0;
    for (index, got) in ids.iter().enumerate() {
        tokens += assert_cpu_ids(tokenizer, texts, index, got, what);
        assert_eq!(
            ids.get(index),
            Some(got),
            "{what}: get({index}) against iter"
        );
    }
    assert_eq!(ids.token_count(), tokens, "{what}: token count");
}

/// Texts whose pieces fall in every length class of a device encoder whose
/// chunks are `chunk` bytes: one byte, short, exactly a chunk, a chunk and one,
/// several chunks, many chunks; made of runs of one letter, spaces, an
/// ideograph, digits, two alternating letters, random letters (short and long
/// tokens next to each other) and random CJK.
pub fn long_piece_texts(chunk: usize, random: &mut SplitMix64) -> Vec<(String, Vec<u8>)> {
    let lengths = [
        1,
        2,
        3,
        chunk - 1,
        chunk,
        chunk + 1,
        2 * chunk + 3,
        4 * chunk + 5,
    ];
    let mut texts = Vec::new();
    for unit in ["a", " ", "日", "7", "ab", "\t", "é"] {
        for &len in &lengths {
            let count = len.div_ceil(unit.len());
            texts.push((
                format!("{count} × {unit:?}"),
                unit.repeat(count).into_bytes(),
            ));
        }
    }
    for &len in &lengths {
        let letters: String = (0..len)
            .map(|_| *random.pick(&["a", "b", "e", "i", "n", "s", "t", "x", "q", "z"]))
            .collect();
        texts.push((format!("{len} random letters"), letters.into_bytes()));
        let cjk: String = (0..len.div_ceil(3))
            .map(|_| *random.pick(&["日", "本", "語", "中", "国", "人", "の", "は"]))
            .collect();
        texts.push((format!("{len} bytes of random CJK"), cjk.into_bytes()));
    }
    texts
}

/// A batch of `count` documents: every fourth one empty, the rest random
/// strings (every kind of character) or runs long enough to be cut into chunks.
pub fn batch_with_empty_documents(random: &mut SplitMix64, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|index| match index % 4 {
            0 => Vec::new(),
            1 => "x".repeat(random.below(900) as usize).into_bytes(),
            _ => split_corpus::random_string(random, 24).into_bytes(),
        })
        .collect()
}

/// `count` random strings (every kind of character and every boundary between
/// them, up to `max_units` units), every tenth damaged into invalid UTF-8.
pub fn random_texts(random: &mut SplitMix64, count: usize, max_units: u32) -> Vec<Vec<u8>> {
    (0..count)
        .map(|index| {
            let mut text = split_corpus::random_string(random, max_units).into_bytes();
            if index % 10 == 0 {
                oracle::damage(random, &mut text, 4);
            }
            text
        })
        .collect()
}

/// Documents whose ends fall inside runs that the split would carry across
/// them (digits, spaces before a word, letters, a contraction, line breaks,
/// upper then lower case, punctuation, CJK, a character cut in two, rare
/// ideographs), empty
/// documents between them, and runs of 200 bytes that cross many 32-byte
/// blocks of the split.
pub fn documents_cut_inside_runs() -> Vec<Vec<u8>> {
    let mut documents: Vec<Vec<u8>> = [
        &b"123"[..],
        b"4567 89",
        b"",
        b"   ",
        b"  x",
        b"abc",
        b"def ghi",
        b"don",
        b"'t stop",
        b"\n\n",
        b"\n  \nx",
        b"HELLO",
        b"World CamelCase",
        b"",
        b"",
        b"!!!",
        b"?! ...",
        "日本".as_bytes(),
        "語です".as_bytes(),
        &"語".as_bytes()[..2],
        &"語".as_bytes()[2..],
        b"x",
        // Rare ideographs: bytes that no token of any encoding holds side by
        // side, where an encoder's split cuts.
        "鱻龘靐齉".as_bytes(),
    ]
    .iter()
    .map(|document| document.to_vec())
    .collect();
    for unit in ["7", " ", "a", "日", "\n", "Ab"] {
        documents.push(unit.repeat(200 / unit.len()).into_bytes());
        documents.push(Vec::new());
        documents.push(unit.repeat(67 / unit.len() + 1).into_bytes());
    }
    documents
}

/// The split's workgroups at 16 threads of 2 bytes: blocks of 32 bytes, so
/// short texts cross many of the split's workgroups and look-backs.
pub fn small_split_geometry() -> SplitGeometry {
    SplitGeometry {
        workgroup_size: 16,
        bytes_per_thread: 2,
        compact_workgroups: 1,
    }
}

/// The CPU split's piece starts of `documents`, each split alone (offset into
/// the batch) and all of them joined into one text.
pub fn split_pieces_alone_and_joined(
    tokenizer: &Tokenizer,
    documents: &[Vec<u8>],
) -> (Vec<u32>, Vec<u32>) {
    let pattern = tokenizer.pattern();
    let mut alone = Vec::new();
    let mut offset = 0;
    for document in documents {
        let starts = piece_starts(pattern, document).expect("split");
        alone.extend(starts.iter().map(|start| start + offset));
        offset += document.len() as u32;
    }
    let joined = piece_starts(pattern, &documents.concat()).expect("split");
    (alone, joined)
}

/// The piece starts an encoder's device split leaves for the BPE steps, for
/// `documents` packed into one batch: the CPU split's of each document alone
/// (offset into the batch), and every other byte whose byte before it is one
/// that no token of `tokenizer`'s vocabulary holds right before it (the
/// encoder's split cuts there: no merge joins across such bytes).
pub fn device_piece_starts(tokenizer: &Tokenizer, documents: &[Vec<u8>]) -> Vec<u32> {
    let vocabulary = tokenizer.vocabulary();
    let mut starts = Vec::new();
    let mut offset = 0;
    for document in documents {
        let split = piece_starts(tokenizer.pattern(), document).expect("split");
        let mut split = split.iter().peekable();
        for at in 0..document.len() as u32 {
            let piece_start = split.next_if_eq(&&at).is_some();
            let cut = at > 0 && !vocabulary.joins(document[at as usize - 1], document[at as usize]);
            if piece_start || cut {
                starts.push(offset + at);
            }
        }
        offset += document.len() as u32;
    }
    starts
}

/// Every chunk runs its steps one dispatch each (the short-text and the
/// resident-grid kernels off: `short_texts_through_one_workgroup_equal_cpu`
/// and `resident_grid_equals_cpu` hold them to the same ids).
pub const STEP_BY_STEP: ChunkLimits = ChunkLimits {
    text_bytes: CHUNK_TEXT_BYTES,
    documents: CHUNK_DOCUMENTS,
    short_text_bytes: 0,
    resident_text_bytes: 0,
};

/// The short-text kernel up to its limit, 4 KiB ([`SHORT_TEXT_BYTES`]; the
/// default stops at 2 KiB, where the resident grid starts to win), and the
/// resident grid from there as by default: the short-text kernel's tests
/// reach its largest texts.
pub const SHORT_UP_TO_ITS_LIMIT: ChunkLimits = ChunkLimits {
    text_bytes: CHUNK_TEXT_BYTES,
    documents: CHUNK_DOCUMENTS,
    short_text_bytes: SHORT_TEXT_BYTES,
    resident_text_bytes: RESIDENT_TEXT_BYTES,
};

/// `geometry` (whose BPE steps take 32 threads) with the split and the
/// short-text kernel in workgroups of 32 threads of 2 bytes too, so the fused
/// kernels (which need one workgroup size for every step) are built, and a few
/// KiB of text are many groups of every step.
pub fn with_fused_steps_in_32_threads(geometry: Geometry) -> Geometry {
    Geometry {
        split: SplitGeometry {
            workgroup_size: 32,
            bytes_per_thread: 2,
            compact_workgroups: 1,
        },
        short_text: ShortText {
            workgroup_size: 32,
            bytes_per_thread: 2,
            ..geometry.short_text
        },
        ..geometry
    }
}

/// Batches for a grid that must take more than one pass: each shape at
/// `shape_bytes` (texts seeded from `seed`), the long pieces cut into chunks of
/// each of `long_chunks` bytes, `documents` documents with empty ones (those
/// two drawn from `random`), and `prose_bytes` of prose (seeded from
/// `seed + 1`) after each.
pub fn batches_with_prose(
    random: &mut SplitMix64,
    [shape_bytes, prose_bytes]: [usize; 2],
    seed: u64,
    long_chunks: &[usize],
    documents: usize,
) -> Vec<Vec<Vec<u8>>> {
    let mut batches: Vec<Vec<Vec<u8>>> = Shape::ALL
        .iter()
        .map(|&shape| vec![generate(shape, shape_bytes, seed)])
        .collect();
    let long: Vec<Vec<u8>> = long_chunks
        .iter()
        .flat_map(|&chunk| long_piece_texts(chunk, random))
        .map(|(_, text)| text)
        .collect();
    batches.push(long);
    batches.push(batch_with_empty_documents(random, documents));
    for batch in &mut batches {
        batch.push(generate(Shape::Prose, prose_bytes, seed + 1));
    }
    batches
}

/// An encoder of `tokenizer` on `backend` whose every `while` loop is capped
/// at 4 iterations: a piece of 1,000 bytes runs past the cap (an error on the
/// reference interpreter, a trap on CUDA), a text of whole tokens does not.
pub fn capped_encoder(backend: AnyBackend, tokenizer: &Tokenizer) -> DeviceEncoder {
    let geometry = Geometry {
        max_loop_iterations: Some(4),
        ..Geometry::default()
    };
    DeviceEncoder::with_geometry(backend, tokenizer, geometry, ChunkLimits::default())
        .expect("capped encoder")
}

/// Asserts that eager chunks of fused kernels replay the graph their slot
/// keeps, whatever their length, documents and grid, with the CPU encoder's
/// ids, on `replaying` (an encoder with `resident_lengths` in its resident
/// range, its default `with_fused_graphs(true)`): one document of each
/// resident length in turn, submitted and waited for (a slot's graph replayed
/// for a shorter text after a longer one, whose bytes stay past the shorter's
/// end in the graph's text buffer, and for texts that take another slot);
/// three documents, one of them empty, in one chunk; a chunk of `short_len`
/// bytes (the short-text kernel) submitted (a dispatch: its submission may not
/// wait for the kernel) and as a batch of one chunk (replayed), in turn with
/// resident ones, and one of `steps_len` (every step its own dispatch) on the
/// same encoder, which take the same idle slots and write and read their
/// buffers beside a slot's graph; chunks into two `BatchIds` in turn, replayed
/// (each part takes the slot's ids buffer and leaves the one it held, which the
/// slot's graph is rebound to), every result keeping its own ids; then one
/// replayed into vectors again. `dispatching` is the same encoder with
/// `with_fused_graphs(false)`, the negative control: it replays nothing and
/// gives the same ids.
pub fn assert_fused_chunks_replay_their_slots_graph(
    replaying: &DeviceEncoder,
    dispatching: &DeviceEncoder,
    tokenizer: &Tokenizer,
    (resident_lengths, short_len, steps_len): (&[usize], usize, usize),
) {
    let mut random = SplitMix64::new(0x5107);
    let mut text = |len: usize| -> Vec<u8> {
        let shape = Shape::ALL[random.next_u64() as usize % Shape::ALL.len()];
        generate(shape, len, random.next_u64())
    };
    let total = |texts: &[Vec<u8>]| texts.iter().map(Vec::len).sum::<usize>() as u64;
    // Whether the chunk of `texts` replayed, submitted and waited for or
    // (`in_one_batch`) through `encode_batch_into`; its ids checked.
    let replayed = |encoder: &DeviceEncoder, texts: &[Vec<u8>], in_one_batch: bool, what: &str| {
        let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let mut results = vec![Vec::new(); texts.len()];
        let timings = if in_one_batch {
            encoder
                .encode_batch_into(&refs, &mut results)
                .map(|mut chunks| {
                    assert_eq!(chunks.len(), 1, "{what}: one chunk");
                    chunks.remove(0)
                })
        } else {
            encoder
                .submit_bytes(&refs)
                .and_then(|pending| pending.wait_into(&mut results))
        }
        .unwrap_or_else(|error| panic!("{what}: {error}"));
        for (index, ids) in results.iter().enumerate() {
            assert_cpu_ids(tokenizer, texts, index, ids, what);
        }
        timings.replayed
    };
    let by_both = |texts: &[Vec<u8>], in_one_batch: bool, what: &str| -> bool {
        let replays = replayed(replaying, texts, in_one_batch, what);
        assert!(
            !replayed(dispatching, texts, in_one_batch, what),
            "{what}: negative control"
        );
        replays
    };
    for &len in resident_lengths {
        let one = [text(len)];
        assert!(replaying.runs_resident(total(&one)), "{len} bytes");
        assert!(by_both(&one, false, &format!("{len} bytes")), "{len} bytes");
    }
    let last = *resident_lengths.last().expect("resident lengths");
    let three = [text(last / 2), Vec::new(), text(last / 3)];
    assert!(replaying.runs_resident(total(&three)));
    assert!(by_both(&three, false, "three documents"), "three documents");
    let short = [text(short_len)];
    let steps = [text(steps_len)];
    let resident = [text(resident_lengths[0])];
    assert!(replaying.runs_short(total(&short)) && !replaying.runs_resident(total(&steps)));
    assert!(!by_both(&short, false, "the short-text kernel submitted"));
    for round in 0..2 {
        let what = format!("round {round}");
        assert!(by_both(&short, true, &format!("{what}: short, one batch")));
        assert!(by_both(
            &resident,
            true,
            &format!("{what}: resident, one batch")
        ));
        assert!(!by_both(
            &steps,
            true,
            &format!("{what}: every step its own dispatch")
        ));
        assert!(by_both(
            &resident,
            false,
            &format!("{what}: resident submitted")
        ));
    }
    // Into two `BatchIds` in turn: each part takes the slot's ids buffer and
    // gives the slot (and its graph) the one it held before; every result
    // keeps its own ids while the other is encoded into.
    let mut results = [BatchIds::new(), BatchIds::new()];
    let mut held: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    for round in 0..6 {
        let texts = vec![text(if round % 3 == 2 {
            resident_lengths[0]
        } else {
            last
        })];
        let refs: Vec<&[u8]> = texts.iter().map(Vec::as_slice).collect();
        let into = round % 2;
        let timings = replaying
            .encode_batch_ids(&refs, &mut results[into])
            .unwrap_or_else(|error| panic!("into BatchIds, round {round}: {error}"));
        assert!(
            timings.iter().all(|chunk| chunk.replayed),
            "into BatchIds, round {round}: replayed"
        );
        held[into] = texts;
        for (which, kept) in results.iter().enumerate() {
            for (index, ids) in kept.iter().enumerate() {
                let what = format!("into BatchIds, round {round}, result {which}");
                assert_cpu_ids(tokenizer, &held[which], index, ids, &what);
            }
        }
    }
    assert!(by_both(&resident, false, "replayed after BatchIds"));
    let mut ids = BatchIds::new();
    check_batch_ids(
        dispatching,
        tokenizer,
        &resident,
        &mut ids,
        "into BatchIds dispatched",
    );
}
