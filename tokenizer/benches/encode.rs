//! The CPU encoder against its peers (tiktoken-rs; bpe-openai for cl100k and
//! o200k), as ratios measured in the same run: one thread over a whole text,
//! and all threads over the same text cut into 8 KiB chunks after line feeds
//! (ours through `encode_batch`, the peers interleaved over the threads).
//!
//! Texts, 262,144 bytes each: the three generated shapes (prose, CJK, code) and
//! real text from the repository itself (no network: the files are on disk):
//! `real-prose` is README.md, ARCHITECTURE.md, `tokenizer/vocab/README.md` and
//! `LICENSE` (the MIT licence text) and the doc comments of every Rust source
//! under `src/` and `tokenizer/src/`; `real-code` is those Rust sources as they
//! are. Each comparison is a paired
//! ABBA run of `vyre_cuda::host_cost` (`Paired::compare`, arm A the peer, arm B
//! ours), so `ratio` is our time over the peer's and `speed-up` its inverse. The
//! last rows compare 1 MiB of one letter with 1 MiB of real text on our encoder
//! (the merge loop must stay linear: the bound is 10 ×).
//!
//! Before timing, every text's ids are checked identical across all three.
//! `VYRE_BENCH_ENCODINGS=r50k,cl100k` (the default) picks the encodings;
//! `VYRE_BENCH_QUICK=1` shortens the regions. Run:
//! `cargo bench -p vyre-tokenizer --bench encode`.

// Its options; this bench prints its own rows (MB/s and speed-ups, not µs).
#[allow(dead_code)]
#[path = "../../benches/common/mod.rs"]
mod common;
#[path = "../tests/support/peers.rs"]
mod peers;

use std::path::Path;

use peers::{chunks_of, peers_of, Peer};
use vyre_cuda::host_cost::{Paired, Report};
use vyre_tokenizer::pretokenize::text::{generate, Shape};
use vyre_tokenizer::{Encoding, Tokenizer};

const TEXT_BYTES: usize = 262_144;
const CHUNK_BYTES: usize = 8 << 10;

/// The concatenation of `files` (relative to the workspace root) that exist,
/// repeated and cut to exactly `bytes` at a character boundary.
fn real_text(files: &[&str], bytes: usize) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut text = String::new();
    for file in files {
        let path = root.join(file);
        let mut paths = vec![path.clone()];
        if path.is_dir() {
            paths = rust_files(&path);
        }
        for path in paths {
            if let Ok(contents) = std::fs::read_to_string(&path) {
                text.push_str(&contents);
                text.push('\n');
            }
        }
    }
    assert!(
        !text.is_empty(),
        "no real text found under {}",
        root.display()
    );
    repeat_to(text, bytes)
}

/// The `.rs` files under `directory`, sorted (recursively).
fn rust_files(directory: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![directory.to_path_buf()];
    while let Some(directory) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&directory) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The prose of Rust sources: their `//!` and `///` lines without the markers.
fn doc_prose(code: &str) -> String {
    code.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            line.strip_prefix("//!")
                .or_else(|| line.strip_prefix("///"))
        })
        .map(|line| format!("{}\n", line.trim_start()))
        .collect()
}

fn texts() -> Vec<(String, String)> {
    let mut texts: Vec<(String, String)> = Shape::ALL
        .iter()
        .map(|&shape| {
            let text =
                String::from_utf8(generate(shape, TEXT_BYTES, 42)).expect("shapes are UTF-8");
            (shape.name().to_owned(), text)
        })
        .collect();
    let prose = real_text(
        &[
            "README.md",
            "ARCHITECTURE.md",
            "tokenizer/vocab/README.md",
            "tokenizer/vocab/LICENSE",
        ],
        1 << 16,
    ) + &doc_prose(&real_text(&["src", "tokenizer/src"], 1 << 22));
    texts.push(("real-prose".to_owned(), repeat_to(prose, TEXT_BYTES)));
    texts.push((
        "real-code".to_owned(),
        real_text(&["src", "tokenizer/src"], TEXT_BYTES),
    ));
    texts
}

/// bpe-openai as a peer, where it has the encoding (cl100k and o200k); only
/// this bench links it.
fn bpe_openai_peer(encoding: Encoding) -> Option<Peer<'static>> {
    fn cl100k(text: &str) -> Vec<u32> {
        bpe_openai::cl100k_base().encode(text)
    }
    fn o200k(text: &str) -> Vec<u32> {
        bpe_openai::o200k_base().encode(text)
    }
    match encoding {
        Encoding::Cl100kBase => Some(Peer::Other("bpe-openai", cl100k)),
        Encoding::O200kBase => Some(Peer::Other("bpe-openai", o200k)),
        _ => None,
    }
}

/// `text` repeated and cut to `bytes` at a character boundary.
fn repeat_to(mut text: String, bytes: usize) -> String {
    while text.len() < bytes {
        text = text.repeat(2);
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// Arm closure: `n` encodes of `text` by `peer`, the token counts folded so the
/// work is observable.
fn one_thread<'a>(peer: Peer<'a>, text: &'a str) -> impl FnMut(u64) -> u64 + 'a {
    move |n| (0..n).fold(0u64, |acc, _| acc ^ peer.encode(text).len() as u64)
}

fn all_threads<'a>(peer: Peer<'a>, chunks: &'a [&'a str]) -> impl FnMut(u64) -> u64 + 'a {
    move |n| {
        (0..n).fold(0u64, |acc, _| {
            acc ^ peer
                .encode_chunks(chunks)
                .iter()
                .map(|ids| ids.len() as u64)
                .sum::<u64>()
        })
    }
}

fn compare(
    report: &mut Report,
    name_a: &str,
    arm_a: impl FnMut(u64) -> u64,
    name_b: &str,
    arm_b: impl FnMut(u64) -> u64,
    bytes: usize,
) {
    match Paired::compare(name_a, arm_a, name_b, arm_b, &common::options()) {
        Ok(paired) => {
            let mb_per_s = |ns: f64| bytes as f64 / ns * 1e3;
            println!(
                "  {:<58} {:>7.1} MB/s vs {:>7.1} MB/s  ratio {:.3}  speed-up {:.2} ×  {}",
                paired.name,
                mb_per_s(paired.minimum_ns_per_unit_b),
                mb_per_s(paired.minimum_ns_per_unit_a),
                paired.median_ratio,
                1.0 / paired.median_ratio,
                if paired.publishable() {
                    "publishable".to_owned()
                } else {
                    format!("not publishable: {:?}", paired.not_publishable)
                }
            );
            report.add_paired(paired);
        }
        Err(error) => {
            let name = format!("{name_b} vs {name_a}");
            println!("  {name}: {error}");
            report.add_failure(&name, &error);
        }
    }
}

fn main() {
    let encodings =
        std::env::var("VYRE_BENCH_ENCODINGS").unwrap_or_else(|_| "r50k,cl100k".to_owned());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let texts = texts();
    let mut report = Report::new("bench_encode");
    println!("{threads} threads; texts of {TEXT_BYTES} bytes; all-threads runs over {CHUNK_BYTES}-byte chunks");
    for name in encodings.split(',') {
        let encoding: Encoding = match name.trim().parse() {
            Ok(encoding) => encoding,
            Err(error) => {
                println!("{error}");
                continue;
            }
        };
        let tokenizer = match Tokenizer::for_encoding(encoding) {
            Ok(tokenizer) => tokenizer,
            Err(error) => {
                println!("{}: skipped ({error})", encoding.name());
                continue;
            }
        };
        let ours = Peer::Ours(&tokenizer);
        let mut peers = peers_of(encoding);
        peers.extend(bpe_openai_peer(encoding));
        println!("{}:", encoding.name());
        for (text_name, text) in &texts {
            let chunks = chunks_of(text, CHUNK_BYTES);
            let ids = ours.encode(text);
            let batch = ours.encode_chunks(&chunks);
            for peer in &peers {
                assert_eq!(
                    peer.encode(text),
                    ids,
                    "{text_name}: ids differ from {}",
                    peer.name()
                );
                assert_eq!(
                    peer.encode_chunks(&chunks),
                    batch,
                    "{text_name}: batched ids differ from {}",
                    peer.name()
                );
            }
            println!(" {text_name}: {} tokens", ids.len());
            for peer in &peers {
                compare(
                    &mut report,
                    &format!("{} {text_name} 1 thread", peer.name()),
                    one_thread(*peer, text),
                    &format!("{} {text_name}", encoding.name()),
                    one_thread(ours, text),
                    text.len(),
                );
                compare(
                    &mut report,
                    &format!("{} {text_name} {threads} threads", peer.name()),
                    all_threads(*peer, &chunks),
                    &format!("{} {text_name} batch", encoding.name()),
                    all_threads(ours, &chunks),
                    text.len(),
                );
            }
        }
        let real = real_text(&["src", "tokenizer/src"], 1 << 20);
        let letters = "a".repeat(1 << 20);
        compare(
            &mut report,
            "1 MiB real code",
            one_thread(ours, &real),
            &format!("{} 1 MiB of one letter", encoding.name()),
            one_thread(ours, &letters),
            1 << 20,
        );
    }
    if let Err(error) = report.finish() {
        println!("could not write the report files: {error}");
    }
}
