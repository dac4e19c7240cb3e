//! The device encoder on the reference interpreter.

use vyre_cuda::backend::AnyBackend;
use vyre_tokenizer::device::DeviceEncoder;
use vyre_tokenizer::{Encoding, Tokenizer};

#[test]
fn thin_slice_r50k_one_document() {
    let tokenizer = Tokenizer::for_encoding(Encoding::R50kBase).unwrap();
    let encoder = DeviceEncoder::new(AnyBackend::reference(), &tokenizer).unwrap();
    let text = "Hello, world! It's 42 degrees: tokenization isn't hard.";
    let (ids, timings) = encoder.encode_timed(text.as_bytes()).unwrap();
    eprintln!("{timings:?}");
    assert_eq!(ids, tokenizer.encode_ordinary(text));
}
