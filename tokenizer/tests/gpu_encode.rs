//! GPU tests of the tokenizer's GPU backend (GPT-2's split on the device, the
//! merges on the CPU): its ids must be the CPU encoder's (which `tests/encode.rs`
//! holds to tiktoken-rs and bpe-openai). Ignored by default; run on the GPU
//! machine (`bash .gpu/run.sh gpu_`). This binary links neither tiktoken-rs nor
//! bpe-openai, to stay small for the trip to the GPU machine.
//!
//! The checks go through `Tokenizer::encode`, which reports a GPU failure as an
//! `Err` (`encode_ordinary` would quietly split on the CPU instead).

mod oracle;
mod split_corpus;

use oracle::corpus;
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::{Backend, Encoding, Tokenizer, AUTO_GPU_MIN_BYTES};

/// The CPU and GPU tokenizers of `encoding`; a missing device is a failure.
fn cpu_and_gpu(encoding: Encoding) -> (Tokenizer, Tokenizer) {
    let cpu = Tokenizer::for_encoding(encoding).expect("built-in encoding");
    let gpu = cpu
        .clone()
        .with_backend(Backend::Gpu)
        .unwrap_or_else(|error| panic!("gpu test needs a CUDA device: {error}"));
    (cpu, gpu)
}

/// Both tokenizers' ids of `text` with every special token allowed; the GPU's
/// must be the CPU's.
fn check(cpu: &Tokenizer, gpu: &Tokenizer, text: &str, what: &str) {
    let specials: Vec<&str> = cpu
        .special_tokens()
        .iter()
        .map(|token| token.text.as_str())
        .collect();
    let expected = cpu.encode(text, &specials).expect("cpu encode");
    let got = gpu
        .encode(text, &specials)
        .unwrap_or_else(|error| panic!("{what}: gpu encode failed: {error}"));
    assert_eq!(got, expected, "{} {what}: {text:?}", cpu.name());
}

/// Locks out any GPU split that changes ids: r50k_base and p50k_base on the
/// GPU equal the CPU encoder on the pre-tokenizers' corpus (`split_corpus`),
/// 400 random strings and the three shapes at 262,144 bytes; damaged bytes
/// follow the same invalid-UTF-8 rule on both.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_ids_equal_cpu_on_corpus_shapes_and_random_strings() {
    for encoding in [Encoding::R50kBase, Encoding::P50kBase] {
        let (cpu, gpu) = cpu_and_gpu(encoding);
        let texts: Vec<String> = split_corpus::corpus(corpus())
            .into_iter()
            .filter_map(|text| String::from_utf8(text).ok())
            .collect();
        for text in &texts {
            check(&cpu, &gpu, text, "corpus");
        }
        let mut random = SplitMix64::new(0x06E0_0050);
        for case in 0..400 {
            let text = split_corpus::random_string(&mut random, 20);
            check(&cpu, &gpu, &text, &format!("random case {case}"));
            let bytes = split_corpus::random_bytes(&mut random, 20);
            assert_eq!(
                gpu.encode_ordinary_bytes(&bytes),
                cpu.encode_ordinary_bytes(&bytes),
                "damaged case {case}"
            );
        }
        for shape in Shape::ALL {
            let text = String::from_utf8(generate(shape, 262_144, 42)).expect("shapes are UTF-8");
            check(&cpu, &gpu, &text, shape.name());
        }
    }
}

/// Locks out `Backend::Auto` leaving the GPU idle where it can run: for r50k and
/// p50k it splits texts of at least `AUTO_GPU_MIN_BYTES` on the GPU (and
/// shorter ones on the CPU), with the same ids as the CPU; for cl100k and o200k
/// (no GPU split) it runs on the CPU.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_auto_picks_the_gpu_for_gpt2_encodings() {
    for encoding in [Encoding::R50kBase, Encoding::P50kBase] {
        let cpu = Tokenizer::for_encoding(encoding).unwrap();
        let auto = cpu.clone().with_backend(Backend::Auto).unwrap();
        assert!(auto.device_name().is_some(), "Auto found no device");
        assert_eq!(auto.runs_on(262_144), Backend::Gpu);
        assert_eq!(auto.runs_on(AUTO_GPU_MIN_BYTES), Backend::Gpu);
        assert_eq!(auto.runs_on(AUTO_GPU_MIN_BYTES - 1), Backend::Cpu);
        let text = String::from_utf8(generate(Shape::Prose, 262_144, 7)).unwrap();
        check(&cpu, &auto, &text, "auto");
    }
    for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
        if let Ok(cpu) = Tokenizer::for_encoding(encoding) {
            let auto = cpu.with_backend(Backend::Auto).unwrap();
            assert_eq!(auto.runs_on(262_144), Backend::Cpu, "{}", encoding.name());
        }
    }
}

/// Locks out a pipeline cache that mixes up lengths or threads: eight threads
/// share one GPU tokenizer and encode texts of many lengths (more lengths than
/// the cache keeps, each several times, some over 1 MiB), every result equal to
/// the CPU's; `encode_batch` on the GPU equals the CPU's too.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_pipeline_cache_serves_many_lengths_and_threads() {
    let (cpu, gpu) = cpu_and_gpu(Encoding::R50kBase);
    let texts: Vec<String> = (0..48)
        .map(|index| {
            let shape = Shape::ALL[index % 3];
            let bytes = [1, 700, 4096, 70_000, 262_144, 1_200_000][index % 6] + index / 6;
            String::from_utf8(generate(shape, bytes, index as u64)).unwrap()
        })
        .collect();
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let (cpu, gpu, texts) = (&cpu, &gpu, &texts);
            scope.spawn(move || {
                for round in 0..3 {
                    for (index, text) in texts.iter().enumerate().skip(thread % 4) {
                        check(
                            cpu,
                            gpu,
                            text,
                            &format!("thread {thread} round {round} text {index}"),
                        );
                    }
                }
            });
        }
    });
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert_eq!(gpu.encode_batch(&refs), cpu.encode_batch(&refs));
}
