//! Batches of documents for the batch split's tests (CPU and GPU): packing,
//! the expected piece starts (each document split alone by the CPU splitter,
//! which `tests/split.rs` holds to `fancy-regex`), and the documents whose
//! ends fall where a split that looked across them would differ.

#![allow(dead_code)]

use vyre_tokenizer::pretokenize::pattern::{split_into, Pattern};
use vyre_tokenizer::pretokenize::text::SplitMix64;

/// The documents back to back, and the end offset of each.
pub fn pack(documents: &[Vec<u8>]) -> (Vec<u8>, Vec<u32>) {
    let mut text = Vec::new();
    let mut ends = Vec::with_capacity(documents.len());
    for document in documents {
        text.extend_from_slice(document);
        ends.push(text.len() as u32);
    }
    (text, ends)
}

/// The piece starts of the batch, each document split alone by `pattern`'s CPU
/// splitter, as offsets into the packed text.
pub fn expected_starts(pattern: Pattern, documents: &[Vec<u8>]) -> Vec<u32> {
    let mut starts = Vec::new();
    let mut offset = 0u32;
    let mut own = Vec::new();
    for document in documents {
        own.clear();
        split_into(pattern, document, &mut own).expect("CPU split");
        starts.extend(own.iter().map(|start| start + offset));
        offset += document.len() as u32;
    }
    starts
}

/// `texts` cut into batches of about `per_batch` documents, with an empty
/// document now and then (at the start, between and at the end of batches).
pub fn batches(texts: Vec<Vec<u8>>, per_batch: usize, seed: u64) -> Vec<Vec<Vec<u8>>> {
    let mut random = SplitMix64::new(seed);
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    for text in texts {
        if random.chance(1, 8) {
            batch.push(Vec::new());
        }
        batch.push(text);
        if batch.len() >= per_batch {
            if random.chance(1, 2) {
                batch.push(Vec::new());
            }
            batches.push(std::mem::take(&mut batch));
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Pairs of documents whose boundary cuts what would otherwise be one piece or
/// one character: inside a white-space run (with and without line breaks), a
/// digit run (so the next document's groups of three start afresh), a letter
/// run of each case, a contraction, a punctuation piece's tail, an o200k
/// upper-case stretch that ends in a caseless letter, a mark after
/// punctuation, and a multi-byte character (its bytes are invalid on both
/// sides). Each pair is one batch, with empty documents around.
pub fn boundary_cases() -> Vec<Vec<Vec<u8>>> {
    let pairs: &[(&[u8], &[u8])] = &[
        (b"a  ", b"  b"),
        (b"x \n", b" \n y"),
        (b"x\r", b"\ny"),
        (b"12345", b"678"),
        (b"1", b"23456"),
        (b"hello", b"world"),
        (b"HELLO", b"world"),
        (b"ABC\xc2\xaa", b"DEF"),
        (b"ABC", b"DEFghi"),
        (b"don'", b"t"),
        (b"don", b"'t"),
        (b"you'l", b"l"),
        (b"it'", b"S"),
        (b"!", b"\n\n/x"),
        (b"x.\n", b"\n"),
        (b"..", b"\xcc\x81a"),
        (b".", b"\xcc\x81a"),
        (b" ", b"!"),
        (b"  ", b"x"),
        (b"a", b"\xcc\x81\xcc\x81"),
        (b"\xe6\x97", b"\xa5\xe6\x9c\xac"),
        (b"x\xf0\x9f", b"\x98\x80y"),
        (b"\xc3", b"\xa9t\xc3\xa9"),
        (b"7", b"\xe0\xa5\xab\xe0\xa5\xab"),
        (b"\t\t", b"\t"),
        (b"end.", b""),
    ];
    pairs
        .iter()
        .map(|(first, second)| vec![Vec::new(), first.to_vec(), second.to_vec(), Vec::new()])
        .collect()
}

/// The text of a batch split as one document would give other piece starts
/// than the batch: the documents of [`boundary_cases`] matter.
pub fn boundaries_matter(pattern: Pattern, documents: &[Vec<u8>]) -> bool {
    let (text, _) = pack(documents);
    let mut whole = Vec::new();
    split_into(pattern, &text, &mut whole).expect("CPU split");
    whole != expected_starts(pattern, documents)
}

/// A long run shortened for the reference interpreter: its first `head` bytes
/// and its last 64 (where the runs of `split_corpus::long_runs` change).
pub fn shortened(run: &[u8], head: usize) -> Vec<u8> {
    if run.len() <= head + 64 {
        return run.to_vec();
    }
    [&run[..head], &run[run.len() - 64..]].concat()
}
