//! The CPU split of each pattern (GPT-2, cl100k, o200k) against `fancy-regex`
//! running the same pattern (the engine tiktoken-rs splits with), on 256 KiB of
//! each generated shape, one thread.
//!
//! Each line is a paired ABBA comparison of host_cost (`Paired::compare`): arm A
//! is `fancy-regex` finding every match, arm B is `Splitter::split_into` into a
//! reused vector (then the zero-allocation piece iterator, on its own line). The
//! ratio B/A is the quoted figure (below 1: the split is faster); the MB/s of both
//! arms come from their fastest regions in the same run. Every split is checked
//! against the regex once before timing. Run: `cargo bench -p vyre-tokenizer
//! --bench split`; `VYRE_BENCH_QUICK=1` for shorter regions.

#[path = "../../benches/common/mod.rs"]
mod common;

use vyre_cuda::host_cost::{Paired, Report};
use vyre_tokenizer::pretokenize::pattern::{Pattern, Splitter};
use vyre_tokenizer::pretokenize::text::{generate, Shape};

const TEXT_BYTES: usize = 262_144;

/// One arm of a comparison: `iterations` splits, a digest of them.
type Arm<'a> = Box<dyn FnMut(u64) -> u64 + 'a>;

fn mb_per_s(ns_per_text: f64) -> f64 {
    TEXT_BYTES as f64 * 1e3 / ns_per_text
}

fn main() {
    let mut report = Report::new("bench_split");
    println!("split of {TEXT_BYTES} bytes, one thread; ratio = split time / fancy-regex time");
    for pattern in Pattern::ALL {
        let splitter = Splitter::new(pattern).expect("splitter");
        let regex = fancy_regex::Regex::new(pattern.regex()).expect("pattern compiles");
        for shape in Shape::ALL {
            let bytes = generate(shape, TEXT_BYTES, 42);
            let text = std::str::from_utf8(&bytes).expect("generated text is UTF-8");
            let expected: Vec<u32> = regex
                .find_iter(text)
                .map(|found| found.expect("regex match").start() as u32)
                .collect();
            let mut starts = Vec::new();
            splitter.split_into(&bytes, &mut starts).expect("split");
            assert_eq!(
                starts, expected,
                "{pattern:?} {shape}: split vs fancy-regex"
            );
            let pieces = splitter.str_pieces(text).count();
            assert_eq!(
                pieces,
                expected.len(),
                "{pattern:?} {shape}: piece iterator"
            );

            let regex_arm = |iterations: u64| {
                (0..iterations).fold(0u64, |digest, _| {
                    digest ^ regex.find_iter(text).count() as u64
                })
            };
            let arms: [(&str, Arm<'_>); 2] = [
                (
                    "split_into",
                    Box::new(|iterations: u64| {
                        (0..iterations).fold(0u64, |digest, _| {
                            starts.clear();
                            splitter.split_into(&bytes, &mut starts).expect("split");
                            digest ^ starts.len() as u64
                        })
                    }),
                ),
                (
                    "str_pieces",
                    Box::new(|iterations: u64| {
                        (0..iterations).fold(0u64, |digest, _| {
                            digest ^ splitter.str_pieces(text).count() as u64
                        })
                    }),
                ),
            ];
            for (label, mut arm) in arms {
                let name = format!("{} {shape} {label}", pattern.name());
                match Paired::compare(
                    "fancy-regex",
                    regex_arm,
                    &name,
                    &mut arm,
                    &common::options(),
                ) {
                    Ok(paired) => {
                        println!("{}", common::row(&paired, "split", 30, 4));
                        println!(
                            "{:<30} fancy-regex {:>7.1} MB/s, split {:>7.1} MB/s: {:.0} x",
                            "",
                            mb_per_s(paired.minimum_ns_per_unit_a),
                            mb_per_s(paired.minimum_ns_per_unit_b),
                            1.0 / paired.median_ratio
                        );
                        report.add_paired(paired);
                    }
                    Err(error) => {
                        println!("{name}: {error}");
                        report.add_failure(&name, &error);
                    }
                }
            }
        }
    }
    if let Err(error) = report.finish() {
        println!("could not write the report files: {error}");
    }
}
