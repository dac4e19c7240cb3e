//! The host's own work per eager device encode of one document (cl100k_base,
//! generated prose of 1,024, 262,144 and 1,048,576 bytes), for counting it on a machine
//! without a GPU: `scripts/host-path --tokenizer` runs it against a stand-in
//! driver whose calls return at once (`scripts/host-path-stub.c`: the kernels do
//! nothing, so the ids read back are none and are never checked here), and
//! counts its instructions with callgrind (repeatable where wall time is not).
//! On a GPU machine it times whole encodes instead (the `gpu_encode` bench holds
//! their ids to the CPU encoder's).
//!
//! Paths, each one document through the device encoder:
//!
//! - `into`: `encode_batch_into` into one reused vector;
//! - `batch`: `encode_batch_bytes`, a new vector per encode (what `Tokenizer`'s
//!   device encodes run);
//! - `wait`: `submit_bytes`, then `wait_into` on the calling thread (the path
//!   that never touched the copy pool: the floor the other two should reach).
//!
//! It measured the copy pool's hand-off of a one-chunk encode's ids (a worker
//! woken and waited for): `into` took 8.0–17.5 µs per 1 KiB encode with it and
//! 3.3–3.4 µs without, where `wait` took 2.8–3.0 (2-core build machine,
//! stand-in driver, 2026-12-02; the README has both sizes). Against the
//! stand-in no ids come back, so the copy of the ids themselves is not in
//! these figures.
//!
//! Run: `cargo bench -p vyre-tokenizer --bench encode_host` prints the
//! per-encode time of each path and size (minimum of 9 rotated rounds of
//! `CALLS` encodes, default 2,000).
//! `encode_host count BYTES PATH CALLS` makes CALLS encodes of one path after
//! one warm one (what callgrind counts).

use std::time::Instant;

use vyre_cuda::backend::{AnyBackend, CudaBackend};
use vyre_tokenizer::device::DeviceEncoder;
use vyre_tokenizer::pretokenize::text::{generate, Shape};
use vyre_tokenizer::{Encoding, Tokenizer};

const PATHS: [&str; 3] = ["into", "batch", "wait"];

/// The document sizes measured: a short text (the short-text kernel's case),
/// one of the split's long-text chunks, and one whose copies run on the copy
/// pool (from 1 MiB; its per-call lookups of the core count had cost about
/// 60 µs of this size's 265 µs per encode against the stand-in, 2026-12-06).
const SIZES: [usize; 3] = [1024, 262_144, 1_048_576];

const ROUNDS: usize = 9;

/// One encode of `text` by `path`, into `results` where the path reuses it;
/// returns the ids' count, so nothing is elided.
fn encode(encoder: &DeviceEncoder, path: &str, text: &[u8], results: &mut [Vec<u32>]) -> usize {
    match path {
        "into" => {
            encoder
                .encode_batch_into(&[text], results)
                .expect("encode_batch_into");
            results[0].len()
        }
        "batch" => encoder
            .encode_batch_bytes(&[text])
            .expect("encode_batch")
            .iter()
            .map(Vec::len)
            .sum(),
        _ => {
            encoder
                .submit_bytes(&[text])
                .and_then(|pending| pending.wait_into(results))
                .expect("submit and wait_into");
            results[0].len()
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .collect();
    let counting = args.first().map(String::as_str) == Some("count");
    let gpu = match CudaBackend::acquire() {
        Ok(gpu) => gpu,
        Err(error) => {
            println!(
                "encode_host: no CUDA driver ({error}); run it through scripts/host-path --tokenizer \
                 (the stand-in driver) or on a GPU machine"
            );
            // A count of nothing would read as a count of no work.
            std::process::exit(if counting { 1 } else { 0 });
        }
    };
    let device_name = gpu.caps().name.clone();
    let tokenizer = Tokenizer::for_encoding(Encoding::Cl100kBase).expect("cl100k");
    let encoder = DeviceEncoder::new(AnyBackend::Cuda(gpu), &tokenizer).expect("device encoder");
    let mut results = [Vec::new()];
    if counting {
        let bytes: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
        let path = args.get(2).map_or("into", String::as_str);
        let calls: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
        let text = generate(Shape::Prose, bytes, 5);
        let mut sink = encode(&encoder, path, &text, &mut results);
        for _ in 0..calls {
            sink ^= encode(&encoder, path, &text, &mut results);
        }
        std::hint::black_box(sink);
        return;
    }
    let calls: usize = std::env::var("CALLS")
        .ok()
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(2000);
    println!(
        "encode_host on {device_name}: one cl100k document per encode, µs per encode, \
         minimum of {ROUNDS} rotated rounds × {calls} calls:"
    );
    println!(
        "{:>8} {:>9} {:>9} {:>9}",
        "bytes", PATHS[0], PATHS[1], PATHS[2]
    );
    for bytes in SIZES {
        let text = generate(Shape::Prose, bytes, 5);
        let mut best = [f64::INFINITY; PATHS.len()];
        let mut sink = 0;
        // Warm: the slot's buffers, the copy pool's threads, the kernels' caches.
        for path in PATHS {
            for _ in 0..10 {
                sink ^= encode(&encoder, path, &text, &mut results);
            }
        }
        for round in 0..ROUNDS {
            // Rotated, so no path always runs right after the same one.
            for turn in 0..PATHS.len() {
                let index = (round + turn) % PATHS.len();
                let start = Instant::now();
                for _ in 0..calls {
                    sink ^= encode(&encoder, PATHS[index], &text, &mut results);
                }
                let per_call = start.elapsed().as_secs_f64() / calls as f64;
                best[index] = best[index].min(per_call);
            }
        }
        std::hint::black_box(sink);
        println!(
            "{bytes:>8} {:>9.2} {:>9.2} {:>9.2}",
            best[0] * 1e6,
            best[1] * 1e6,
            best[2] * 1e6
        );
    }
}
