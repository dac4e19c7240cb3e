//! Inputs and checks shared by the device encoder's tests on the reference
//! interpreter (`tests/device_encode.rs`) and on CUDA (`tests/gpu_encode.rs`):
//! texts whose pieces fall in every length class, batches with empty
//! documents, and the check that holds a device batch to the CPU encoder.
//! Include it with `#[path = "support/device_batches.rs"] mod device_batches;`
//! beside `mod oracle;` and `mod split_corpus;`.
#![allow(dead_code)]

use vyre_cuda::backend::AnyBackend;
use vyre_tokenizer::device::{ChunkLimits, DeviceEncoder, Geometry};
use vyre_tokenizer::pretokenize::text::SplitMix64;
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
    for (index, text) in texts.iter().enumerate() {
        let expected = tokenizer.encode_ordinary_bytes(text);
        if got[index] != expected {
            panic!(
                "{} {what}: text {index} of {} ({} bytes) differs: device {:?}, cpu {:?}, text {:?}",
                tokenizer.name(),
                texts.len(),
                text.len(),
                &got[index][..got[index].len().min(40)],
                &expected[..expected.len().min(40)],
                String::from_utf8_lossy(&text[..text.len().min(120)])
            );
        }
    }
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
