//! The example a user runs first: GPT-2's pre-tokenizer on the GPU.
//!
//! ```text
//! cargo run --release --example pretokenize
//! cargo run --release --example pretokenize -- --shape cjk --iterations 1000
//! cargo run --release --example pretokenize -- --input src/lib.rs --offsets offsets.txt
//! cargo run --release --example pretokenize -- --backend reference --bytes 4096
//! ```
//!
//! It splits 262,144 bytes of generated text (prose, CJK, code), or `--input
//! FILE`, by GPT-2's pre-tokenizer pattern
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! with two dispatches per encode (split: decode, class lookup, piece-start rule
//! and per-block count; compaction: each workgroup sums the counts before its
//! blocks, then writes the piece starts into host-mapped memory; the programs and
//! the rule are in `src/pretokenize/`), checks every result against the external
//! regex oracle (`fancy-regex`, tiktoken's engine), the CPU reference interpreter
//! and a plain Rust splitter, prints the first pieces, and per text:
//!
//! * **oracle**: the time `fancy-regex` takes for the same split on this CPU, and
//!   its MB/s, beside the GPU's.
//! * **encode**: min and median wall time of one whole encode over `--iterations`
//!   encodes of **pass 1**, the hot path a tokenizer runs: two dispatches (the
//!   first staging the text) enqueued back to back, ordered on the device, one
//!   blocking synchronize, no timing events; the piece count and starts arrive
//!   through host-mapped memory (no copy back). Throughput is text bytes over the
//!   median encode.
//! * **per step**: `kernel`, its median device time in pass 1 (the kernel's own
//!   `%globaltimer` stamps); `timed wall`, its median host wall time in **pass 2**,
//!   the same number of encodes one dispatch at a time with timing events (events
//!   and the per-dispatch synchronize cost host time of their own, which is why
//!   the hot path does neither); `host = timed wall − kernel`: everything that was
//!   not the kernel running (driver calls, launch latency, synchronize wake-up);
//!   `enqueue`, host time until the last asynchronous operation was enqueued
//!   (pass 2). The encode's **host overhead** is `median encode − Σ median
//!   kernels`, so it also counts the text's staging: nothing is hidden.
//! * **driver calls**: synchronizes, launches and async copies of one eager and
//!   one graph encode, counted on the real driver.
//! * **phase table**: pass 2 also runs with the phase probe on, its lines
//!   captured and summarized per program: where each dispatch's host time went.
//!
//! Without a CUDA device (or with `--backend reference`) the same programs run on
//! the reference interpreter: one line says so, the tables carry no device
//! figures, and only a few encodes run (the interpreter is slow).
//!
//! `--offsets FILE` writes the piece start byte offsets of the (one) text, one
//! decimal per line, so any external tool can check them.

#[path = "../tests/support/driver_calls.rs"]
mod driver_calls;
#[path = "../tests/oracle/mod.rs"]
mod oracle;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use vyre_tokenizer::pretokenize;

use driver_calls::{describe_driver_calls, encode_driver_calls};
use pretokenize::pipeline::{run_reference, CudaPipeline, EncodeTiming, DISPATCHES_PER_ENCODE};
use pretokenize::programs::{programs, Programs, STEPS};
use pretokenize::text::{generate, Shape};
use pretokenize::{cpu, MAX_TEXT_BYTES};
use vyre_cuda::backend::{BackendError, CudaBackend, Timings};
use vyre_cuda::probe::{self, report};

const DEFAULT_BYTES: usize = 262_144;
const DEFAULT_ITERATIONS: u32 = 200;
const DEFAULT_REFERENCE_ITERATIONS: u32 = 3;
const DEFAULT_SEED: u64 = 42;
const WARMUP_ENCODES: u32 = 5;
/// The targets on the H200 for a 256 KiB encode: median eager encode and
/// median encode as one CUDA graph.
const TARGET_ENCODE_NS: u64 = 100_000;
const TARGET_GRAPH_NS: u64 = 60_000;
/// Pieces printed per text.
const PIECES_SHOWN: usize = 16;

const HELP: &str = "\
pretokenize: GPT-2's pre-tokenizer split on the GPU (3 dispatches per encode)

USAGE: cargo run --release --example pretokenize -- [FLAGS]

FLAGS:
  --shape prose|cjk|code|all   generated text shape (default all)
  --bytes N                    bytes of generated text per shape (default 262144)
  --input FILE                 split FILE instead of generated text (not with --shape/--bytes)
  --seed N                     generator seed (default 42)
  --iterations N               timed encodes per shape (default 200; 3 on the reference interpreter)
  --offsets FILE               write the piece start offsets, one decimal per line
                               (one text only: with --input, or one --shape)
  --backend auto|cuda|reference
                               auto (default): CUDA if a device answers, else the CPU
                               reference interpreter; cuda: fail without a device
  --help                       this text

Every result is checked against the regex oracle (fancy-regex), the reference
interpreter and a plain CPU splitter.";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BackendChoice {
    Auto,
    Cuda,
    Reference,
}

#[derive(Debug)]
struct Options {
    shapes: Vec<Shape>,
    bytes: Option<usize>,
    input: Option<String>,
    seed: u64,
    iterations: Option<u32>,
    backend: BackendChoice,
    offsets: Option<String>,
}

/// One text to split, with the name it is reported under.
struct Sample {
    name: String,
    text: Vec<u8>,
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
    let samples = match load_samples(&options) {
        Ok(samples) => samples,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options, &samples) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Arguments.

fn parse_number<T: std::str::FromStr>(flag: &str, value: &str, what: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("Fix: {flag} takes {what}, not '{value}'"))
}

/// `Ok(None)` means `--help`.
fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut options = Options {
        shapes: Shape::ALL.to_vec(),
        bytes: None,
        input: None,
        seed: DEFAULT_SEED,
        iterations: None,
        backend: BackendChoice::Auto,
        offsets: None,
    };
    let mut shape_given = false;
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        let (flag, inline_value) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let known = [
            "--shape",
            "--bytes",
            "--input",
            "--seed",
            "--iterations",
            "--backend",
            "--offsets",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(if flag.starts_with('-') {
                format!("Fix: unknown flag '{flag}'; run with --help to see the flags")
            } else {
                format!("Fix: unexpected argument '{arg}'; flags take the form --name VALUE (see --help)")
            });
        }
        let value = match inline_value {
            Some(value) => value,
            None => args
                .next()
                .ok_or_else(|| format!("Fix: {flag} needs a value (see --help)"))?,
        };
        match flag.as_str() {
            "--shape" => {
                shape_given = true;
                options.shapes = if value == "all" {
                    Shape::ALL.to_vec()
                } else {
                    vec![value.parse::<Shape>().map_err(|_| {
                        format!("Fix: --shape takes prose, cjk, code or all, not '{value}'")
                    })?]
                };
            }
            "--bytes" => {
                let bytes: usize = parse_number(&flag, &value, "a whole number of bytes")?;
                if bytes == 0 || bytes > MAX_TEXT_BYTES {
                    return Err(format!(
                        "Fix: --bytes takes 1 to {MAX_TEXT_BYTES} bytes, not {bytes}"
                    ));
                }
                options.bytes = Some(bytes);
            }
            "--input" => options.input = Some(value),
            "--offsets" => options.offsets = Some(value),
            "--seed" => {
                options.seed = parse_number(&flag, &value, "a whole number from 0 to 2^64 - 1")?
            }
            "--iterations" => {
                let iterations: u32 = parse_number(&flag, &value, "a whole number of encodes")?;
                if iterations == 0 {
                    return Err("Fix: --iterations takes at least 1 encode, not 0".to_owned());
                }
                options.iterations = Some(iterations);
            }
            "--backend" => {
                options.backend = match value.as_str() {
                    "auto" => BackendChoice::Auto,
                    "cuda" => BackendChoice::Cuda,
                    "reference" => BackendChoice::Reference,
                    _ => {
                        return Err(format!(
                            "Fix: --backend takes auto, cuda or reference, not '{value}'"
                        ))
                    }
                }
            }
            _ => unreachable!("flag checked against the known list"),
        }
    }
    if options.input.is_some() && (shape_given || options.bytes.is_some()) {
        return Err(
            "Fix: --input splits a file; drop --shape and --bytes, which only shape generated text"
                .to_owned(),
        );
    }
    if options.offsets.is_some() && options.input.is_none() && options.shapes.len() != 1 {
        return Err(
            "Fix: --offsets writes the offsets of one text; add --input FILE or --shape prose|cjk|code"
                .to_owned(),
        );
    }
    Ok(Some(options))
}

fn load_samples(options: &Options) -> Result<Vec<Sample>, String> {
    if let Some(path) = &options.input {
        let unreadable = |error: std::io::Error| {
            format!("Fix: cannot read --input '{path}' ({error}); pass a readable file")
        };
        let size = std::fs::metadata(path).map_err(unreadable)?.len();
        if size > MAX_TEXT_BYTES as u64 {
            return Err(format!(
                "Fix: --input '{path}' has {size} bytes, more than the pipeline's limit of {MAX_TEXT_BYTES}; split it"
            ));
        }
        let text = std::fs::read(path).map_err(unreadable)?;
        if text.is_empty() {
            return Err(format!(
                "Fix: --input '{path}' is empty; pass a file with at least one byte"
            ));
        }
        return Ok(vec![Sample {
            name: format!("file {path}"),
            text,
        }]);
    }
    let bytes = options.bytes.unwrap_or(DEFAULT_BYTES);
    Ok(options
        .shapes
        .iter()
        .map(|&shape| Sample {
            name: format!("shape {shape}"),
            text: generate(shape, bytes, options.seed),
        })
        .collect())
}

// ---------------------------------------------------------------------------
// Running.

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    report::nearest_rank(&sorted, 50)
}

fn minimum(values: &[u64]) -> u64 {
    values.iter().copied().min().unwrap_or(0)
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// A duration with the unit that keeps it readable: `850.2 us`, `71.9 ms`, `2.41 s`.
fn duration(ns: u64) -> String {
    match ns {
        0..=999_999 => format!("{:.1} us", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

fn megabytes_per_second(bytes: usize, ns: u64) -> f64 {
    if ns == 0 {
        return 0.0;
    }
    bytes as f64 * 1000.0 / ns as f64
}

/// Why there is no device, in a few words.
fn no_device_reason(error: &BackendError) -> String {
    match error {
        BackendError::NoDriver { detail } => detail.clone(),
        BackendError::NoDevice { .. } => "the driver reports no CUDA device".to_owned(),
        other => other.to_string(),
    }
}

fn run(options: &Options, samples: &[Sample]) -> Result<(), String> {
    let programs = programs();
    // Build the class table now, so no timed CPU split pays for it.
    pretokenize::unicode::class_table().map_err(|error| error.to_string())?;
    let backend = match options.backend {
        BackendChoice::Reference => {
            println!("--backend reference: running on the CPU reference interpreter");
            None
        }
        BackendChoice::Cuda => Some(CudaBackend::acquire().map_err(|error| {
            format!(
                "{error} (--backend reference runs this example on the CPU reference interpreter)"
            )
        })?),
        BackendChoice::Auto => match CudaBackend::acquire() {
            Ok(backend) => Some(backend),
            Err(error) => {
                println!(
                    "no CUDA device ({}): running on the CPU reference interpreter",
                    no_device_reason(&error)
                );
                None
            }
        },
    };
    match backend {
        Some(backend) => run_cuda(options, samples, &programs, &backend),
        None => run_on_reference(options, samples, &programs),
    }
}

fn print_header(samples: &[Sample], seed: u64, iterations: u32, backend: &str) {
    let lengths: Vec<usize> = samples.iter().map(|sample| sample.text.len()).collect();
    let bytes = if lengths.windows(2).all(|pair| pair[0] == pair[1]) {
        format!("{} bytes", lengths[0])
    } else {
        format!("{lengths:?} bytes")
    };
    println!("vyre-cuda pretokenize: {bytes} per text, seed {seed}, {iterations} timed encodes per text, backend {backend}");
    let names: Vec<&str> = STEPS.iter().map(|step| step.name).collect();
    println!(
        "pipeline: GPT-2 pattern {}; {DISPATCHES_PER_ENCODE} dispatches per encode ({}), {}-thread workgroups, {} bytes per thread, at most {} compaction workgroups; Unicode {}",
        oracle::GPT2_PATTERN,
        names.join(" -> "),
        pretokenize::WORKGROUP_SIZE,
        pretokenize::BYTES_PER_THREAD,
        pretokenize::COMPACT_WORKGROUPS,
        pretokenize::unicode::UNICODE_VERSION
    );
}

fn run_on_reference(
    options: &Options,
    samples: &[Sample],
    programs: &Programs,
) -> Result<(), String> {
    let iterations = options.iterations.unwrap_or(DEFAULT_REFERENCE_ITERATIONS);
    print_header(
        samples,
        options.seed,
        iterations,
        "reference interpreter (CPU)",
    );
    if options.iterations.is_none() {
        println!(
            "({iterations} encodes per text: the interpreter is slow; --iterations changes it)"
        );
    }
    for sample in samples {
        let text = &sample.text;
        let cpu_start = Instant::now();
        let expected = cpu::piece_starts(text).map_err(|error| error.to_string())?;
        let cpu_ns = cpu_start.elapsed().as_nanos() as u64;
        let mut walls = Vec::new();
        let mut steps: Vec<[u64; DISPATCHES_PER_ENCODE]> = Vec::new();
        for _ in 0..iterations {
            let start = Instant::now();
            let run = run_reference(programs, text).map_err(|error| error.to_string())?;
            walls.push(start.elapsed().as_nanos() as u64);
            check_equal(
                &sample.name,
                "reference interpreter",
                &run.piece_starts,
                &expected,
            )?;
            steps.push(run.step_ns);
        }
        let oracle_ns = check_oracle(&sample.name, text, &expected)?;
        println!();
        println!(
            "{}: {} bytes, {} pieces; checked: reference interpreter == CPU splitter == regex oracle",
            sample.name,
            text.len(),
            expected.len()
        );
        print_pieces(text, &expected);
        write_offsets(options, &expected)?;
        let median_wall = median(&walls);
        println!(
            "  encode on the reference interpreter: min {}, median {} over {iterations} encodes ({:.2} MB/s); CPU splitter {}",
            duration(minimum(&walls)),
            duration(median_wall),
            megabytes_per_second(text.len(), median_wall),
            duration(cpu_ns)
        );
        println!(
            "  regex oracle (fancy-regex, this CPU, one thread): {} ({:.1} MB/s)",
            duration(oracle_ns),
            megabytes_per_second(text.len(), oracle_ns)
        );
        println!("  per step (median; no device figures on the interpreter):");
        println!(
            "    {:<12} {:>10} {:>8} {:>8}",
            "step", "wall", "kernel", "host"
        );
        for (index, name) in STEPS.iter().map(|step| step.name).enumerate() {
            let values: Vec<u64> = steps.iter().map(|step| step[index]).collect();
            println!(
                "    {:<12} {:>10} {:>8} {:>8}",
                name,
                duration(median(&values)),
                "-",
                "-"
            );
        }
        println!("  phase table: none (the probe times CUDA dispatches; none ran)");
    }
    Ok(())
}

/// Runs the regex oracle on `text` (the fastest of three runs, in ns) and checks
/// that the CPU splitter agreed with it.
fn check_oracle(name: &str, text: &[u8], expected: &[u32]) -> Result<u64, String> {
    let regex = oracle::Oracle::new();
    let mut best = u64::MAX;
    let mut starts = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        starts = regex.starts(text);
        best = best.min(start.elapsed().as_nanos() as u64);
    }
    if starts != expected {
        let first = starts
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(starts.len().min(expected.len()));
        return Err(format!(
            "Fix: {name}: the regex oracle found {} pieces and the CPU splitter {}, first difference at piece {first} \
             ({:?} vs {:?}); this is a bug in vyre-cuda: report it with the command line",
            starts.len(),
            expected.len(),
            starts.get(first),
            expected.get(first)
        ));
    }
    Ok(best)
}

/// Prints the first pieces of `text`, escaped.
fn print_pieces(text: &[u8], starts: &[u32]) {
    let pieces = cpu::pieces(text, starts);
    let shown: Vec<String> = pieces
        .iter()
        .take(PIECES_SHOWN)
        .map(|piece| format!("{:?}", String::from_utf8_lossy(piece)))
        .collect();
    let more = if pieces.len() > PIECES_SHOWN {
        " ..."
    } else {
        ""
    };
    println!("  pieces: {}{more}", shown.join(" "));
}

/// `--offsets FILE`: the piece starts, one decimal per line.
fn write_offsets(options: &Options, starts: &[u32]) -> Result<(), String> {
    let Some(path) = &options.offsets else {
        return Ok(());
    };
    let failed = |error: std::io::Error| {
        format!("Fix: cannot write --offsets '{path}' ({error}); pass a writable path")
    };
    let file = std::fs::File::create(path).map_err(failed)?;
    let mut out = std::io::BufWriter::new(file);
    for start in starts {
        writeln!(out, "{start}").map_err(failed)?;
    }
    out.flush().map_err(failed)?;
    println!("  wrote {} piece start offsets to {path}", starts.len());
    Ok(())
}

fn check_equal(name: &str, what: &str, got: &[u32], expected: &[u32]) -> Result<(), String> {
    if got == expected {
        return Ok(());
    }
    let first = got
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(expected.len()));
    Err(format!(
        "Fix: {name}: the {what} found {} pieces and the CPU splitter {}, first difference at piece {first} \
         ({:?} vs {:?}); this is a bug in vyre-cuda: report it with the command line",
        got.len(),
        expected.len(),
        got.get(first),
        expected.get(first)
    ))
}

/// Per-shape results for the closing summary.
struct ShapeResult {
    name: String,
    median_encode_ns: u64,
    median_host_ns: u64,
    /// The same encode as one CUDA graph: median wall and median device window.
    graph_encode_ns: u64,
    graph_window_ns: u64,
}

fn run_cuda(
    options: &Options,
    samples: &[Sample],
    programs: &Programs,
    backend: &CudaBackend,
) -> Result<(), String> {
    let iterations = options.iterations.unwrap_or(DEFAULT_ITERATIONS);
    let caps = backend.caps();
    print_header(
        samples,
        options.seed,
        iterations,
        &format!("cuda ({}, sm_{})", caps.name, caps.ptx_target_sm()),
    );
    let mut pipeline: Option<CudaPipeline> = None;
    let mut results = Vec::new();
    for sample in samples {
        let text = &sample.text;
        // Buffers are allocated once per text length (once per run for generated text).
        if pipeline.as_ref().is_none_or(|p| p.text_len() != text.len()) {
            drop(pipeline.take()); // frees the old buffers before allocating new ones
            pipeline =
                Some(CudaPipeline::new(backend, programs, text.len()).map_err(|e| e.to_string())?);
        }
        let Some(pipeline) = pipeline.as_mut() else {
            unreachable!("built above")
        };
        let cpu_start = Instant::now();
        let expected = cpu::piece_starts(text).map_err(|error| error.to_string())?;
        let cpu_ns = cpu_start.elapsed().as_nanos() as u64;
        let reference_start = Instant::now();
        let oracle = run_reference(programs, text).map_err(|e| e.to_string())?;
        let reference_ns = reference_start.elapsed().as_nanos() as u64;
        check_equal(
            &sample.name,
            "reference interpreter",
            &oracle.piece_starts,
            &expected,
        )?;
        let oracle_ns = check_oracle(&sample.name, text, &expected)?;
        let check = |what: &str, starts: &[u32]| check_equal(&sample.name, what, starts, &expected);

        // Pass 1, the hot path: untimed dispatches, probe forced off.
        let mut fast: Vec<EncodeTiming> = Vec::with_capacity(iterations as usize);
        {
            let _probe_off = probe::override_enabled(Some(false));
            for _ in 0..WARMUP_ENCODES {
                pipeline.encode(text).map_err(|e| e.to_string())?;
                check("GPU", pipeline.piece_starts())?;
            }
            for _ in 0..iterations {
                fast.push(pipeline.encode(text).map_err(|e| e.to_string())?);
                check("GPU", pipeline.piece_starts())?;
            }
        }
        // Pass 2: device timing events on every dispatch and the probe on, its
        // lines captured for the phase table.
        let mut timed: Vec<EncodeTiming> = Vec::with_capacity(iterations as usize);
        let (probe_result, lines) = {
            let _probe_on = probe::override_enabled(Some(true));
            probe::capture_lines(|| -> Result<(), String> {
                for _ in 0..iterations {
                    timed.push(pipeline.encode_timed(text).map_err(|e| e.to_string())?);
                    check("GPU", pipeline.piece_starts())?;
                }
                Ok(())
            })
        };
        probe_result?;

        // Pass 3: the same encode as one CUDA graph (one launch, one synchronize),
        // untimed for the wall, then timed for the device window.
        let mut graph_walls = Vec::with_capacity(iterations as usize);
        let mut graph_windows = Vec::with_capacity(iterations as usize);
        let mut graph_kernels = Vec::with_capacity(iterations as usize);
        {
            let _probe_off = probe::override_enabled(Some(false));
            for _ in 0..WARMUP_ENCODES {
                pipeline.encode_graph(text).map_err(|e| e.to_string())?;
                check("GPU graph", pipeline.piece_starts())?;
            }
            for _ in 0..iterations {
                let timing = pipeline.encode_graph(text).map_err(|e| e.to_string())?;
                graph_walls.push(timing.wall_ns);
                graph_kernels.push(timing.replay.kernel_stamps_ns);
                check("GPU graph", pipeline.piece_starts())?;
            }
            for _ in 0..iterations {
                let timed = pipeline
                    .encode_graph_timed(text)
                    .map_err(|e| e.to_string())?;
                graph_windows.push(timed.replay.event_window_ns.unwrap_or(0));
                check("GPU graph", pipeline.piece_starts())?;
            }
        }

        let calls = encode_driver_calls(pipeline, text).map_err(|e| e.to_string())?;
        check("GPU graph", pipeline.piece_starts())?;

        let walls: Vec<u64> = fast.iter().map(|t| t.wall_ns).collect();
        let median_encode = median(&walls);
        let step_median = |runs: &[EncodeTiming], index: usize, field: fn(&Timings) -> u64| {
            median(
                &runs
                    .iter()
                    .map(|t| field(&t.steps[index]))
                    .collect::<Vec<_>>(),
            )
        };
        let kernel_medians: Vec<u64> = (0..DISPATCHES_PER_ENCODE)
            .map(|index| step_median(&fast, index, |s| s.kernel_stamps_ns))
            .collect();
        let kernels_total: u64 = kernel_medians.iter().sum();
        let median_host = median_encode.saturating_sub(kernels_total);
        println!();
        println!(
            "{}: {} bytes, {} pieces; checked: GPU == reference interpreter == CPU splitter == regex oracle ({} encodes)",
            sample.name,
            text.len(),
            expected.len(),
            2 * WARMUP_ENCODES + 4 * iterations
        );
        print_pieces(text, &expected);
        write_offsets(options, &expected)?;
        println!(
            "  encode ({DISPATCHES_PER_ENCODE} dispatches enqueued back to back and ordered on the device, one blocking synchronize; the first stages the text, the last stores the piece starts into host-mapped memory): min {} us, median {} us -> {:.0} MB/s at the median",
            us(minimum(&walls)),
            us(median_encode),
            megabytes_per_second(text.len(), median_encode)
        );
        println!(
            "  kernels (sum of {DISPATCHES_PER_ENCODE} medians) {} us; host overhead (encode - kernels) {} us = {:.0}% of the encode",
            us(kernels_total),
            us(median_host),
            100.0 * median_host as f64 / median_encode.max(1) as f64
        );
        println!(
            "  regex oracle (fancy-regex, this CPU, one thread) {} -> {:.1} MB/s; GPU encode is {:.0}x faster",
            duration(oracle_ns),
            megabytes_per_second(text.len(), oracle_ns),
            oracle_ns as f64 / median_encode.max(1) as f64
        );
        println!(
            "  for scale: CPU splitter (plain Rust, one thread) {} -> {:.1} MB/s; reference interpreter {}",
            duration(cpu_ns),
            megabytes_per_second(text.len(), cpu_ns),
            duration(reference_ns)
        );
        println!(
            "  per step (medians, us): kernel = the kernel's own stamps in the hot path (pass 1, the steps chained on the device); \
             the rest from pass 2 (one dispatch at a time, timing events on)"
        );
        println!(
            "    {:<12} {:>8} {:>11} {:>22} {:>8}",
            "step", "kernel", "timed wall", "host=timed wall-kernel", "enqueue"
        );
        let mut dispatch_hosts = Vec::with_capacity(DISPATCHES_PER_ENCODE * timed.len());
        for (index, name) in STEPS.iter().map(|step| step.name).enumerate() {
            let kernel = kernel_medians[index];
            let timed_wall = step_median(&timed, index, |s| s.wall_ns);
            dispatch_hosts.extend(timed.iter().map(|t| {
                t.steps[index]
                    .wall_ns
                    .saturating_sub(t.steps[index].kernel_stamps_ns)
            }));
            println!(
                "    {:<12} {:>8} {:>11} {:>22} {:>8}",
                name,
                us(kernel),
                us(timed_wall),
                us(timed_wall.saturating_sub(kernel)),
                us(step_median(&timed, index, |s| s.enqueue_ns))
            );
        }
        println!(
            "  per-dispatch host cost, one dispatch at a time (timed wall - kernel): median {} us over {} dispatches",
            us(median(&dispatch_hosts)),
            dispatch_hosts.len()
        );
        let graph_encode = median(&graph_walls);
        let graph_window = median(&graph_windows);
        println!(
            "  as one CUDA graph (upload + {DISPATCHES_PER_ENCODE} kernels + the count in one replay; the {} piece-start bytes are in host-mapped memory when it returns): \
             min {} us, median {} us -> {:.0} MB/s (kernels, first start to last end: median {} us)",
            4 * expected.len(),
            us(minimum(&graph_walls)),
            us(graph_encode),
            megabytes_per_second(text.len(), graph_encode),
            us(median(&graph_kernels))
        );
        println!(
            "    device window (copies + kernels, timed replays) {} us; host overhead (encode - device window) {} us = {:.0}% of the encode",
            us(graph_window),
            us(graph_encode.saturating_sub(graph_window)),
            100.0 * graph_encode.saturating_sub(graph_window) as f64 / graph_encode.max(1) as f64
        );
        println!("  {}", describe_driver_calls(&calls));
        print_phase_table(&lines, pipeline, iterations);
        results.push(ShapeResult {
            name: sample.name.clone(),
            median_encode_ns: median_encode,
            median_host_ns: median_host,
            graph_encode_ns: graph_encode,
            graph_window_ns: graph_window,
        });
    }
    println!();
    println!(
        "targets (H200, 256 KiB text): median encode <= {} us eager, <= {} us as one CUDA graph",
        us(TARGET_ENCODE_NS),
        us(TARGET_GRAPH_NS)
    );
    for result in &results {
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        let graph_host = result
            .graph_encode_ns
            .saturating_sub(result.graph_window_ns);
        println!(
            "  {:<14} eager {:>7} us: {:<6} (host {:>3.0}%)   graph {:>7} us: {:<6} (host {:>3.0}%, host = encode - device window)",
            result.name,
            us(result.median_encode_ns),
            verdict(result.median_encode_ns <= TARGET_ENCODE_NS),
            100.0 * result.median_host_ns as f64 / result.median_encode_ns.max(1) as f64,
            us(result.graph_encode_ns),
            verdict(result.graph_encode_ns <= TARGET_GRAPH_NS),
            100.0 * graph_host as f64 / result.graph_encode_ns.max(1) as f64,
        );
    }
    Ok(())
}

/// The probe's per-program table for one text: one group per program, labelled
/// with its step and printed in dispatch order.
fn print_phase_table(lines: &[String], pipeline: &CudaPipeline, iterations: u32) {
    let records: Vec<probe::DispatchRecord> = lines
        .iter()
        .filter_map(|line| probe::parse_line(line))
        .collect();
    let summary = report::LogSummary {
        lines: lines.len(),
        records: records.len(),
        malformed: lines.len() - records.len(),
        unrelated: 0,
        groups: report::summarize(&records),
        ..report::LogSummary::default()
    };
    let table = report::render_table(&summary);
    // The report is a header, then one blank-line-separated section per group
    // whose first line starts `nodes=N buffers=B program=P:`.
    let mut sections: Vec<(usize, String)> = Vec::new();
    for (position, section) in table.split("\n\n").enumerate() {
        let mut order = usize::MAX;
        let mut text = section.to_owned();
        if position == 0 {
            order = 0;
        }
        for (index, (name, kernel)) in STEPS
            .iter()
            .map(|step| step.name)
            .zip(pipeline.kernels())
            .enumerate()
        {
            let program = kernel.program();
            let header = format!(
                "nodes={} buffers={} program=",
                program.node_count(),
                program.buffers().len()
            );
            if position > 0 && section.starts_with(&header) {
                order = index + 1;
                text = format!("{name}: {section}");
            }
        }
        sections.push((order, text));
    }
    sections.sort_by_key(|(order, _)| *order);
    println!(
        "  phase probe (pass 2: {iterations} encodes with the probe on, one table per program):"
    );
    for (index, (_, section)) in sections.iter().enumerate() {
        if index > 0 {
            println!();
        }
        for line in section.trim_end().lines() {
            println!("    {line}");
        }
    }
}
