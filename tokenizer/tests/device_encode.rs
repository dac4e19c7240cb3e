//! The device encoder on the reference interpreter.

mod oracle;
mod split_corpus;

use vyre_cuda::backend::AnyBackend;
use vyre_tokenizer::device::{ChunkLimits, DeviceEncoder, Geometry};
use vyre_tokenizer::pretokenize::text::SplitMix64;
use vyre_tokenizer::{Encoding, Tokenizer};

#[test]
fn thin_slice_r50k_one_document() {
    let tokenizer = Tokenizer::for_encoding(Encoding::R50kBase).unwrap();
    let encoder = DeviceEncoder::new(AnyBackend::reference(), &tokenizer).unwrap();
    let text = "Hello, world! It's 42 degrees: tokenization isn't hard.";
    let (ids, timings) = encoder.encode_counted(text.as_bytes()).unwrap();
    eprintln!("{timings:?}");
    let mut graph = encoder.graph(text.len()).unwrap();
    assert_eq!(graph.encode(text.as_bytes()).unwrap(), ids);
    assert_eq!(
        graph.encode(text.to_uppercase().as_bytes()).unwrap(),
        tokenizer.encode_ordinary(&text.to_uppercase())
    );
    let pending = encoder.submit(&[text, "", text]).unwrap();
    assert_eq!(pending.wait().unwrap(), [ids.clone(), vec![], ids.clone()]);
    assert_eq!(ids, tokenizer.encode_ordinary(text));
}

#[test]
fn explore_small_geometry() {
    for encoding in Encoding::ALL {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for (chunk, attempts) in [(8u32, 16u32), (8, 0), (16, 4)] {
            let geometry = Geometry {
                workgroup_size: 32,
                chunk_bytes: chunk,
                repair_window_bytes: 4 * chunk,
                repair_attempts: attempts,
                compact_workgroups: 3,
            };
            let encoder = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                geometry,
                ChunkLimits {
                    text_bytes: 3000,
                    documents: 50,
                },
            )
            .unwrap();
            let mut random = SplitMix64::new(7);
            let texts: Vec<String> = (0..200)
                .map(|i| match i % 5 {
                    0 => String::new(),
                    1 => "a".repeat(random.below(60) as usize),
                    2 => " ".repeat(random.below(60) as usize) + "x",
                    _ => split_corpus::random_string(&mut random, 12),
                })
                .collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let got = encoder.encode_batch(&refs).unwrap();
            for (index, text) in texts.iter().enumerate() {
                assert_eq!(
                    got[index],
                    tokenizer.encode_ordinary(text),
                    "{} chunk {chunk} attempts {attempts} text {index} {text:?}",
                    encoding.name()
                );
            }
        }
    }
}

#[test]
fn explore_counts() {
    for encoding in [
        Encoding::R50kBase,
        Encoding::Cl100kBase,
        Encoding::O200kBase,
    ] {
        let tokenizer = Tokenizer::for_encoding(encoding).unwrap();
        for (chunk, attempts) in [(8u32, 16u32), (8, 0), (16, 4), (384, 16)] {
            let geometry = Geometry {
                workgroup_size: 32,
                chunk_bytes: chunk,
                repair_window_bytes: 4 * chunk,
                repair_attempts: attempts,
                compact_workgroups: 3,
            };
            let encoder = DeviceEncoder::with_geometry(
                AnyBackend::reference(),
                &tokenizer,
                geometry,
                ChunkLimits::default(),
            )
            .unwrap();
            for text in [
                "a".repeat(700),
                " ".repeat(900) + "x",
                "日".repeat(300),
                "7".repeat(500),
                "Hello there, this is prose. ".repeat(20),
            ] {
                let (ids, timings) = encoder.encode_counted(text.as_bytes()).unwrap();
                assert_eq!(ids, tokenizer.encode_ordinary(&text));
                eprintln!(
                    "{} chunk {chunk} attempts {attempts} {:?}: {:?}",
                    encoding.name(),
                    &text[..3],
                    timings.counts.unwrap()
                );
            }
        }
    }
}
