//! The CPU tokenizers we measure against, behind one interface: our encoder,
//! `tiktoken-rs`, and any other encoder given as a function (the `encode`
//! bench adds `bpe-openai` that way: this module does not name it, so the
//! example and the GPU bench, which include it, do not link bpe-openai's
//! 47 MB of tables and stay small enough for the GPU machine), each on one
//! thread over a whole text and on all threads over the same chunks. Shared by
//! the `encode` example and the `encode` and `gpu_encode` benches. Include it
//! with `#[path = "…/support/peers.rs"] mod peers;`.
#![allow(dead_code)]

use std::time::Instant;

use vyre_tokenizer::{Encoding, Tokenizer};

/// One tokenizer to time.
#[derive(Clone, Copy)]
pub enum Peer<'a> {
    /// This crate's encoder.
    Ours(&'a Tokenizer),
    /// tiktoken's core, ported.
    Tiktoken(&'static tiktoken_rs::CoreBPE),
    /// Another encoder: its name and its encode function.
    Other(&'static str, fn(&str) -> Vec<u32>),
}

impl Peer<'_> {
    /// The name printed beside its figures.
    pub fn name(&self) -> &'static str {
        match self {
            Peer::Ours(_) => "vyre-tokenizer",
            Peer::Tiktoken(_) => "tiktoken-rs",
            Peer::Other(name, _) => name,
        }
    }

    /// The ids of `text` on this thread.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Peer::Ours(tokenizer) => tokenizer.encode_ordinary(text),
            Peer::Tiktoken(core) => core.encode_ordinary(text),
            Peer::Other(_, encode) => encode(text),
        }
    }

    /// The ids of every chunk, on all threads (ours through `encode_batch`, the
    /// others interleaved over the threads: equal chunks, so equal shares).
    pub fn encode_chunks(&self, chunks: &[&str]) -> Vec<Vec<u32>> {
        if let Peer::Ours(tokenizer) = self {
            return tokenizer.encode_batch(chunks);
        }
        // Thread `t` takes chunks t, t + T, t + 2T, ...
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut results = vec![Vec::new(); chunks.len()];
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|first| {
                    scope.spawn(move || {
                        (first..chunks.len())
                            .step_by(threads)
                            .map(|index| (index, self.encode(chunks[index])))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for worker in workers {
                for (index, ids) in worker.join().expect("peer worker") {
                    results[index] = ids;
                }
            }
        });
        results
    }
}

/// Our tokenizer's peer for `encoding` that every binary links: tiktoken-rs.
pub fn peers_of(encoding: Encoding) -> Vec<Peer<'static>> {
    let tiktoken = match encoding {
        Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
        Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        _ => tiktoken_rs::o200k_base_singleton(),
    };
    vec![Peer::Tiktoken(tiktoken)]
}

/// `text` cut into chunks of about `target` bytes, each ending after a line
/// feed where there is one (so the chunks are what a batch of documents or
/// lines would be), at a character boundary otherwise.
pub fn chunks_of(text: &str, target: usize) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + target).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        if end < text.len() {
            end = text[start..end]
                .rfind('\n')
                .map_or(end, |at| start + at + 1);
        }
        chunks.push(&text[start..end]);
        start = end;
    }
    chunks
}

/// Median wall time in seconds of `iterations` runs of `run` (after one
/// warm-up run), and the last run's result.
pub fn median_seconds<T>(iterations: usize, mut run: impl FnMut() -> T) -> (f64, T) {
    let mut result = run();
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations.max(1) {
        let start = Instant::now();
        result = run();
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], result)
}
