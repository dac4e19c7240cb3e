//! The example a user runs first: text to token ids, exactly as tiktoken.
//!
//! ```text
//! cargo run --release -p vyre-tokenizer --example encode
//! cargo run --release -p vyre-tokenizer --example encode -- --encoding o200k --input README.md
//! cargo run --release -p vyre-tokenizer --example encode -- --encoding r50k --backend gpu
//! cargo run --release -p vyre-tokenizer --example encode -- --input FILE --ids ids.txt --offsets starts.txt
//! ```
//!
//! It encodes 262,144 bytes of generated prose, CJK and code (or `--input FILE`)
//! with one of tiktoken's encodings (`--encoding r50k|p50k|cl100k|o200k`, default
//! cl100k) and prints, per text, the token count and the median time, MB/s and
//! tokens/s over `--iterations` encodes of this crate's encoder beside
//! `tiktoken-rs` on the same text, on one thread (the whole text) and on all
//! threads (the text cut into chunks after line feeds, each chunk a batch item:
//! `encode_batch` for ours, the chunks interleaved over the threads for
//! tiktoken-rs). Every run's ids are checked: identical to tiktoken-rs's, on one
//! thread and batched, or the example fails. (bpe-openai, the other peer, is in
//! the `encode` bench: its 47 MB of tables would keep this example from
//! travelling to a GPU machine.)
//!
//! `--backend auto|cpu|gpu` picks where the encode runs (auto: the GPU where
//! there is one, for texts of 64 KiB and more; `reference` runs the device's
//! programs on the CPU reference interpreter, slowly: keep `--bytes` small);
//! one line says which ran and why. On the device it also prints, per text,
//! what each kernel step took (its own `%globaltimer` stamps: `stage`, the
//! split's steps, `split` or `classify` and `phases`, then `pieces`, `merge`,
//! `long`, `compact`) and where the rest of the wall time went (the host's
//! own work, staging and submitting and handing out the ids; the launches,
//! the gaps and the wait), eager and as one graph, and what the device counted
//! (pieces the device split found, pieces merged, long pieces, boundaries
//! repaired). `--hand-out-helpers N` runs those device rows through an encoder
//! that wakes `N` threads to share the staging and the ids' hand-out
//! (`DeviceEncoder::with_hand_out_helpers`). `--ids
//! FILE` writes our ids, one decimal per line; `--offsets FILE` the
//! pre-tokenizer's piece start byte offsets, one per line (both for one text:
//! `--input`, or `--shape`). An input that is not valid UTF-8 is encoded by the
//! pre-tokenizer's rule for invalid bytes (each is a character U+FFFD for the
//! split, and merges as the byte it is); one line says so, and tiktoken-rs
//! (which takes `&str`) is skipped for it.
//!
//! The `pretokenize` example (GPT-2's split alone, on the GPU, with its phase
//! table) is still there for what it shows.

#[path = "../tests/support/peers.rs"]
mod peers;

use std::io::Write;
use std::process::ExitCode;

use peers::{chunks_of, median_seconds, peers_of, Peer};
use vyre_tokenizer::device::pipeline::HELPED_FROM_TEXT_BYTES;
use vyre_tokenizer::device::{BatchIds, ChunkTimings, DeviceEncoder};
use vyre_tokenizer::pretokenize::pattern;
use vyre_tokenizer::pretokenize::text::{generate, Shape};
use vyre_tokenizer::{Backend, Encoding, Tokenizer};

const DEFAULT_BYTES: usize = 262_144;
const DEFAULT_ITERATIONS: usize = 10;
const DEFAULT_SEED: u64 = 42;
/// Chunk size of the all-threads runs.
const CHUNK_BYTES: usize = 8 << 10;

const HELP: &str = "\
encode: text to token ids with tiktoken's encodings, beside tiktoken-rs

USAGE: cargo run --release -p vyre-tokenizer --example encode -- [FLAGS]

FLAGS:
  --encoding r50k|p50k|cl100k|o200k  the encoding (default cl100k)
  --input FILE                       encode FILE instead of generated text
  --shape prose|cjk|code|all         generated text shape (default all)
  --bytes N                          bytes of generated text per shape (default 262144)
  --seed N                           generator seed (default 42)
  --iterations N                     timed encodes per text and tokenizer (default 10)
  --backend auto|cpu|gpu|reference   where the encode runs (default auto; reference:
                                     the device programs on the CPU interpreter)
  --hand-out-helpers N               the device rows through an encoder whose staging and
                                     hand-out N threads share (default 3)
  --ids FILE                         write our token ids, one decimal per line (one text)
  --offsets FILE                     write the piece start byte offsets, one per line (one text)
  --help                             this text";

struct Options {
    encoding: Encoding,
    input: Option<String>,
    shapes: Vec<Shape>,
    bytes: usize,
    seed: u64,
    iterations: usize,
    backend: Backend,
    /// Run the device programs on the reference interpreter.
    reference: bool,
    /// Threads that share the device rows' staging and hand-out (`None`: the
    /// encoder's default).
    hand_out_helpers: Option<usize>,
    ids: Option<String>,
    offsets: Option<String>,
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut options = Options {
        encoding: Encoding::Cl100kBase,
        input: None,
        shapes: Shape::ALL.to_vec(),
        bytes: DEFAULT_BYTES,
        seed: DEFAULT_SEED,
        iterations: DEFAULT_ITERATIONS,
        backend: Backend::Auto,
        reference: false,
        hand_out_helpers: None,
        ids: None,
        offsets: None,
    };
    let mut args = args.peekable();
    let mut shape_given = false;
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("Fix: {flag} needs a value (see --help)"))
        };
        let number = |text: String, what: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("Fix: {flag} takes {what}, not {text:?}"))
        };
        match flag.as_str() {
            "--encoding" => {
                options.encoding = value()?
                    .parse()
                    .map_err(|e: vyre_tokenizer::TokenizerError| e.to_string())?
            }
            "--input" => options.input = Some(value()?),
            "--shape" => {
                let name = value()?;
                shape_given = true;
                options.shapes = if name == "all" {
                    Shape::ALL.to_vec()
                } else {
                    vec![name.parse()?]
                };
            }
            "--bytes" => options.bytes = number(value()?, "a byte count")? as usize,
            "--seed" => options.seed = number(value()?, "a number")?,
            "--iterations" => {
                options.iterations = number(value()?, "a count of at least 1")?.max(1) as usize
            }
            "--backend" => {
                let name = value()?;
                options.reference = name == "reference";
                options.backend = if options.reference {
                    "gpu".to_owned()
                } else {
                    name
                }
                .parse()
                .map_err(|e: vyre_tokenizer::TokenizerError| e.to_string())?
            }
            "--hand-out-helpers" => {
                options.hand_out_helpers = Some(number(value()?, "a count of threads")? as usize)
            }
            "--ids" => options.ids = Some(value()?),
            "--offsets" => options.offsets = Some(value()?),
            _ => {
                return Err(format!(
                    "Fix: unknown argument {arg:?}; run with --help to see the flags"
                ))
            }
        }
    }
    if options.input.is_some() && shape_given {
        return Err("Fix: give --input or --shape, not both".to_owned());
    }
    let one_text = options.input.is_some() || options.shapes.len() == 1;
    if (options.ids.is_some() || options.offsets.is_some()) && !one_text {
        return Err(
            "Fix: --ids and --offsets write one text's results; add --input FILE or one --shape"
                .to_owned(),
        );
    }
    Ok(Some(options))
}

/// The tokenizer on the backend asked for, and the line saying where it runs.
fn tokenizer_for(options: &Options) -> Result<(Tokenizer, String), String> {
    let tokenizer = Tokenizer::for_encoding(options.encoding).map_err(|e| e.to_string())?;
    let name = options.encoding.name();
    if options.reference {
        let device = tokenizer
            .with_device(vyre_cuda::backend::AnyBackend::reference())
            .map_err(|e| e.to_string())?;
        let line = "backend: the device programs on the CPU reference interpreter (asked for)";
        return Ok((device, line.to_owned()));
    }
    match options.backend {
        Backend::Cpu => Ok((tokenizer, "backend: cpu (asked for)".to_owned())),
        Backend::Gpu => {
            let gpu = tokenizer
                .with_backend(Backend::Gpu)
                .map_err(|e| e.to_string())?;
            let line = format!(
                "backend: gpu ({}): the encode runs on the device",
                gpu.device_name().unwrap_or("CUDA device")
            );
            Ok((gpu, line))
        }
        Backend::Auto => {
            let why_not = match tokenizer.clone().with_backend(Backend::Gpu) {
                Ok(_) => None,
                // The device's own reason where there is one (no driver, say).
                Err(error) => Some(
                    std::error::Error::source(&error)
                        .map_or_else(|| error.to_string(), |source| source.to_string()),
                ),
            };
            let auto = tokenizer
                .with_backend(Backend::Auto)
                .map_err(|e| e.to_string())?;
            let line = match (auto.device_name(), why_not) {
                (Some(device), _) => format!(
                    "backend: auto → gpu ({device}) for texts of {} bytes or more, the CPU below",
                    vyre_tokenizer::AUTO_GPU_MIN_BYTES
                ),
                (None, Some(reason)) => format!("backend: auto → cpu for {name} ({reason})"),
                (None, None) => "backend: auto → cpu".to_owned(),
            };
            Ok((auto, line))
        }
    }
}

fn run(options: &Options) -> Result<(), String> {
    let (tokenizer, backend_line) = tokenizer_for(options)?;
    println!(
        "{} ({:?} pattern, {} tokens)",
        tokenizer.name(),
        tokenizer.pattern(),
        tokenizer.vocabulary().len()
    );
    println!("{backend_line}");
    let texts: Vec<(String, Vec<u8>)> = match &options.input {
        Some(path) => {
            let bytes =
                std::fs::read(path).map_err(|e| format!("Fix: cannot read --input {path}: {e}"))?;
            vec![(path.clone(), bytes)]
        }
        None => options
            .shapes
            .iter()
            .map(|&shape| {
                (
                    format!("{shape} ({} bytes generated)", options.bytes),
                    generate(shape, options.bytes, options.seed),
                )
            })
            .collect(),
    };
    let peers = peers_of(options.encoding);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, bytes) in &texts {
        println!();
        let ids = match std::str::from_utf8(bytes) {
            Ok(text) => encode_and_compare(
                &tokenizer,
                &peers,
                name,
                text,
                options.iterations,
                threads,
                options.hand_out_helpers,
            )?,
            Err(error) => {
                println!(
                    "{name}: not valid UTF-8 (first bad byte at {}): encoded by the pre-tokenizer's rule for invalid \
                     bytes (each is a character U+FFFD for the split, merged as the byte it is); the peers take only \
                     UTF-8 and are skipped",
                    error.valid_up_to()
                );
                let (seconds, ids) = median_seconds(options.iterations, || {
                    tokenizer.encode_ordinary_bytes(bytes)
                });
                print_figures(
                    "vyre-tokenizer, one thread",
                    bytes.len(),
                    ids.len(),
                    seconds,
                    None,
                );
                ids
            }
        };
        if tokenizer.decode_bytes(&ids).map_err(|e| e.to_string())? != *bytes {
            return Err(format!("{name}: decode(encode(text)) is not the text"));
        }
        if let Some(path) = &options.ids {
            write_lines(path, ids.iter())?;
            println!("wrote {} ids to {path}", ids.len());
        }
        if let Some(path) = &options.offsets {
            let starts =
                pattern::piece_starts(tokenizer.pattern(), bytes).map_err(|e| e.to_string())?;
            write_lines(path, starts.iter())?;
            println!("wrote {} piece start offsets to {path}", starts.len());
        }
    }
    Ok(())
}

/// One way of running a tokenizer over the text: its ids, as a list of chunks.
type Run<'a> = dyn Fn(&Peer) -> Vec<Vec<u32>> + 'a;

/// Times ours and every peer on `text`, one thread and all threads, checks that
/// every run's ids are identical, and returns ours.
fn encode_and_compare(
    tokenizer: &Tokenizer,
    peers: &[Peer<'static>],
    name: &str,
    text: &str,
    iterations: usize,
    threads: usize,
    hand_out_helpers: Option<usize>,
) -> Result<Vec<u32>, String> {
    let chunks = chunks_of(text, CHUNK_BYTES);
    let ours = Peer::Ours(tokenizer);
    // One thread over the whole text, then all threads over the chunks: each
    // run's ids, as a list of chunks.
    let one_thread = |peer: &Peer| vec![peer.encode(text)];
    let all_threads = |peer: &Peer| peer.encode_chunks(&chunks);
    let modes: [(String, &Run); 2] = [
        ("one thread".to_owned(), &one_thread),
        (format!("{threads} threads"), &all_threads),
    ];
    let mut our_ids = Vec::new();
    for (mode, run) in modes {
        let (seconds, ids) = median_seconds(iterations, || run(&ours));
        let tokens: usize = ids.iter().map(Vec::len).sum();
        if our_ids.is_empty() {
            println!(
                "{name}: {} bytes, {tokens} tokens ({:.2} bytes per token); the encode runs on the {}",
                text.len(),
                text.len() as f64 / tokens.max(1) as f64,
                tokenizer.runs_on(text.len()).name()
            );
            our_ids = ids.concat();
        }
        let label = match ids.len() {
            1 => format!("vyre-tokenizer, {mode}"),
            chunks => format!("vyre-tokenizer, {mode} ({chunks} chunks)"),
        };
        print_figures(&label, text.len(), tokens, seconds, None);
        for peer in peers {
            let (peer_seconds, peer_ids) = median_seconds(iterations, || run(peer));
            if peer_ids != ids {
                return Err(format!(
                    "{name}: our ids differ from {}'s ({mode})",
                    peer.name()
                ));
            }
            print_figures(
                &format!("{}, {mode}", peer.name()),
                text.len(),
                tokens,
                peer_seconds,
                Some(seconds),
            );
        }
    }
    let names: Vec<&str> = peers.iter().map(Peer::name).collect();
    println!(
        "  ids identical to {} (one thread and batched)",
        names.join(" and ")
    );
    if tokenizer.runs_on(text.len()) == Backend::Gpu {
        print_device_steps(
            tokenizer,
            text.as_bytes(),
            &our_ids,
            iterations,
            hand_out_helpers,
        )?;
    }
    Ok(our_ids)
}

/// On the device: the median eager encode's steps (kernel time each, the host's
/// share) and the median graph replay, each checked against `ids`.
fn print_device_steps(
    tokenizer: &Tokenizer,
    text: &[u8],
    ids: &[u32],
    iterations: usize,
    hand_out_helpers: Option<usize>,
) -> Result<(), String> {
    let Some(shared) = tokenizer.device_encoder() else {
        return Ok(());
    };
    // With helpers: an encoder of its own on the same device.
    let helped = match hand_out_helpers {
        None => None,
        Some(helpers) => Some(
            DeviceEncoder::new(shared.backend().clone(), tokenizer)
                .map_err(|e| e.to_string())?
                .with_hand_out_helpers(helpers, HELPED_FROM_TEXT_BYTES),
        ),
    };
    let device = helped.as_ref().unwrap_or(shared);
    // The eager encode as a caller makes it; the counts (one small read after
    // the wait, which would add its round trip to the wall) from one more.
    let mut encoded = [Vec::new()];
    let Some(eager) = median_chunk(iterations, || {
        let timings = device
            .encode_batch_into(&[text], &mut encoded)
            .map_err(|e| e.to_string())?;
        if encoded[0] != ids {
            return Err("the device's ids differ from the CPU encoder's".to_owned());
        }
        Ok(timings)
    })?
    else {
        return Ok(()); // an empty text: no chunk ran
    };
    println!("  device, eager (median): {}", eager.wall_line());
    // Into one reused `BatchIds`, whose part takes the chunk's ids in place.
    let mut batch_ids = BatchIds::new();
    if let Some(in_place) = median_chunk(iterations, || {
        let timings = device
            .encode_batch_ids(&[text], &mut batch_ids)
            .map_err(|e| e.to_string())?;
        if batch_ids.get(0) != Some(ids) {
            return Err("the device's ids into BatchIds differ from the CPU encoder's".to_owned());
        }
        Ok(timings)
    })? {
        println!(
            "  device, into a reused BatchIds (median): {}",
            in_place.wall_line()
        );
    }
    let (counted_ids, counted) = device.encode_counted(&[text]).map_err(|e| e.to_string())?;
    if counted_ids[0] != ids {
        return Err("the device's counted ids differ from the CPU encoder's".to_owned());
    }
    if !counted.step_clocks.is_empty() {
        println!(
            "  device, one counted encode's kernel by its own clock: {}",
            counted.kernel_line()
        );
    }
    if let Some(counts) = counted.counts {
        println!(
            "  device counted: {} pieces (the device split), {} merged, {} long pieces in {} chunks, {} boundaries repaired, {} pieces on the serial path",
            counts.pieces,
            counts.merged_pieces,
            counts.long_pieces,
            counts.chunks,
            counts.failed_boundaries,
            counts.serial_pieces
        );
    }
    let mut graph = device.graph(text.len()).map_err(|e| e.to_string())?;
    let (encoded, _) = graph.encode_timed(text).map_err(|e| e.to_string())?;
    if encoded != ids {
        return Err("the device graph's ids differ from the CPU encoder's".to_owned());
    }
    let (seconds, last) = median_seconds(iterations, || graph.encode_timed(text));
    let (_, replay) = last.map_err(|e| e.to_string())?;
    println!(
        "  device, one graph (median): {:.1} µs per encode, replay kernels {:.1} µs",
        seconds * 1e6,
        replay.kernel_stamps_ns as f64 / 1e3
    );
    Ok(())
}

/// The timings of the median chunk (by wall time) of `iterations` runs of
/// `encode` (one chunk each) after one more run that warms up; `None` where no
/// chunk ran (an empty text).
fn median_chunk(
    iterations: usize,
    mut encode: impl FnMut() -> Result<Vec<ChunkTimings>, String>,
) -> Result<Option<ChunkTimings>, String> {
    encode()?; // the warm-up run, all of its chunks
    let mut runs = Vec::with_capacity(iterations.max(1));
    for _ in 0..iterations.max(1) {
        runs.extend(encode()?);
    }
    if runs.is_empty() {
        return Ok(None);
    }
    runs.sort_by_key(|timings| timings.wall_ns);
    Ok(Some(runs.swap_remove(runs.len() / 2)))
}

/// One line of figures; `ours` (seconds) adds how many times faster ours is.
fn print_figures(label: &str, bytes: usize, tokens: usize, seconds: f64, ours: Option<f64>) {
    let versus = ours.map_or(String::new(), |ours| {
        format!("   (vyre-tokenizer {:.2} ×)", seconds / ours)
    });
    println!(
        "  {label:<38} {:>9.2} ms {:>8.1} MB/s {:>8.2} M tokens/s{versus}",
        seconds * 1e3,
        bytes as f64 / seconds / 1e6,
        tokens as f64 / seconds / 1e6
    );
}

fn write_lines<T: std::fmt::Display>(
    path: &str,
    items: impl Iterator<Item = T>,
) -> Result<(), String> {
    let file =
        std::fs::File::create(path).map_err(|e| format!("Fix: cannot create {path}: {e}"))?;
    let mut out = std::io::BufWriter::new(file);
    for item in items {
        writeln!(out, "{item}").map_err(|e| format!("Fix: cannot write {path}: {e}"))?;
    }
    out.flush()
        .map_err(|e| format!("Fix: cannot write {path}: {e}"))
}
