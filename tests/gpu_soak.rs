//! GPU soak: 8 threads share one `CudaBackend` for 60 s and mix
//! every operation a long-lived process performs (compile, a dispatch over host
//! bytes, a dispatch over device buffers, graph record and replay, allocate,
//! upload, read and drop),
//! checking **every** result against the reference interpreter. Ignored by default;
//! run on the GPU machine with `bash .gpu/run.sh gpu_soak` (or under
//! `scripts/gpu-sanitize`). `VYRE_SOAK_SECONDS` (default 60) and
//! `VYRE_SOAK_THREADS` (default 8) shorten or widen it; `VYRE_SOAK_KINDS` narrows the
//! operations it mixes (see `soak_kinds`).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::backend;
use vyre_cuda::backend::{Binding, CudaBackend, Dispatch};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions, RandomCase};
use vyre_cuda::ir::Program;
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

/// Distinct random programs the threads draw from (each compiled once, dispatched
/// many times: the caches are exercised on hits and on racing misses).
const CASES: u64 = 96;

/// The operation kinds the soak mixes: 0 compile + dispatch, 1 dispatch, 2 resident
/// dispatch, 3 graph record + replays, 4 allocation churn. `VYRE_SOAK_KINDS` (digits,
/// e.g. `013`) narrows the mix, to tell which operation a sanitizer report comes from;
/// unset or without a valid digit, all five.
fn soak_kinds() -> Vec<u64> {
    let mut kinds: Vec<u64> = std::env::var("VYRE_SOAK_KINDS")
        .unwrap_or_default()
        .chars()
        .filter_map(|c| c.to_digit(10))
        .map(u64::from)
        .filter(|&kind| kind < 5)
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.is_empty() {
        kinds = (0..5).collect();
    }
    kinds
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// One generated case with the reference interpreter's outputs.
struct Checked {
    case: RandomCase,
    expected: Vec<Vec<u8>>,
}

fn checked_cases() -> Vec<Checked> {
    // No grid sync: graphs refuse it, and every case may be replayed in a graph.
    let options = GeneratorOptions::default();
    (0..CASES)
        .map(|seed| {
            let case = valid_program(0x50a6_0000 + seed, &options);
            let expected = support::case_reference(&case, &case.scalars);
            Checked { case, expected }
        })
        .collect()
}

/// Positions (in `inputs` order) of the output buffers.
fn output_positions(program: &Program) -> Vec<usize> {
    program
        .global_buffers()
        .iter()
        .enumerate()
        .filter(|(_, decl)| decl.access.is_output())
        .map(|(position, _)| position)
        .collect()
}

/// A splitmix64 stream per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What each kind of operation did, summed over threads.
#[derive(Default)]
struct Counts {
    compiles: AtomicU64,
    dispatches: AtomicU64,
    resident_dispatches: AtomicU64,
    graph_records: AtomicU64,
    graph_replays: AtomicU64,
    allocations: AtomicU64,
}

fn context(thread: u64, round: u64, checked: &Checked) -> String {
    format!(
        "thread {thread} round {round} seed {}\n{}",
        checked.case.seed, checked.case.program
    )
}

fn borrowed_dispatch(gpu: &CudaBackend, checked: &Checked, at: &str) {
    let got = support::run_case_host(gpu, &checked.case, &checked.case.scalars)
        .unwrap_or_else(|e| panic!("{at}: dispatch: {e}"));
    assert_eq!(
        got, checked.expected,
        "{at}: dispatch differs from the reference"
    );
}

fn resident_dispatch(gpu: &CudaBackend, checked: &Checked, at: &str) {
    let buffers: Vec<_> = checked
        .case
        .inputs
        .iter()
        .map(|input| {
            gpu.buffer_from(input)
                .unwrap_or_else(|e| panic!("{at}: allocate and upload: {e}"))
        })
        .collect();
    let got = support::run_case_buffers(gpu, &checked.case, &buffers)
        .unwrap_or_else(|e| panic!("{at}: dispatch over buffers: {e}"))
        .outputs;
    assert_eq!(got, checked.expected, "{at}: dispatch over buffers differs");
    // The buffers hold the same bytes as the read-back copies.
    for (position, expected) in output_positions(&checked.case.program)
        .into_iter()
        .zip(&checked.expected)
    {
        let stored = gpu
            .read::<u8>(&buffers[position])
            .unwrap_or_else(|e| panic!("{at}: read: {e}"));
        assert_eq!(&stored, expected, "{at}: buffer {position} differs");
    }
}

/// Compile, record upload → dispatch → read-back of every output, replay a few
/// times with the inputs rewritten each time, check each replay, free.
fn graph_round(gpu: &CudaBackend, checked: &Checked, replays: u64, counts: &Counts, at: &str) {
    let case = &checked.case;
    let kernel = gpu
        .compile(&case.program, &case.config)
        .unwrap_or_else(|e| panic!("{at}: compile: {e}"));
    counts.compiles.fetch_add(1, Ordering::Relaxed);
    let buffers: Vec<_> = case
        .inputs
        .iter()
        .map(|input| gpu.buffer(input.len() as u64).unwrap())
        .collect();
    let bound: Vec<Binding> = buffers.iter().map(Binding::from).collect();
    let config = case.config.clone().with_readback(ReadbackPolicy::None);
    let outputs = output_positions(&case.program);
    let mut slots = None;
    let mut graph = gpu
        .record(|rec| {
            let uploads = buffers
                .iter()
                .zip(&case.inputs)
                .map(|(buffer, input)| rec.upload(buffer, input.len() as u64))
                .collect::<Result<Vec<_>, _>>()?;
            let request = Dispatch::new(&kernel, &bound).config(&config);
            rec.dispatch(support::with_scalars(request, &case.program, &case.scalars))?;
            let reads = outputs
                .iter()
                .map(|&position| rec.read_back(&buffers[position], 0, buffers[position].len()))
                .collect::<Result<Vec<_>, _>>()?;
            slots = Some((uploads, reads));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{at}: record: {e}"));
    counts.graph_records.fetch_add(1, Ordering::Relaxed);
    let (uploads, reads) = slots.expect("recorded");
    for replay in 0..replays {
        for (slot, input) in uploads.iter().zip(&case.inputs) {
            graph
                .input_mut(*slot)
                .unwrap_or_else(|e| panic!("{at}: input_mut: {e}"))
                .copy_from_slice(input);
        }
        graph
            .replay()
            .unwrap_or_else(|e| panic!("{at}: replay {replay}: {e}"));
        for (slot, expected) in reads.iter().zip(&checked.expected) {
            assert_eq!(
                graph.output(*slot).unwrap(),
                expected.as_slice(),
                "{at}: replay {replay} differs from the reference"
            );
        }
        counts.graph_replays.fetch_add(1, Ordering::Relaxed);
    }
    // The graph holds its buffers: dropping them first frees nothing under it.
    drop(bound);
    drop(buffers);
    drop(graph);
}

/// Allocate buffers of random sizes, fill each with a pattern, read it back, drop.
fn allocation_churn(gpu: &CudaBackend, rng: &mut Rng, at: &str) {
    let mut held = Vec::new();
    for _ in 0..1 + rng.below(6) {
        let words = 1 + rng.below(1 << 14) as u32;
        let pattern: Vec<u32> = (0..words).map(|w| w ^ rng.next() as u32).collect();
        let buffer = gpu
            .buffer(4 * words as u64)
            .unwrap_or_else(|e| panic!("{at}: allocate {words} words: {e}"));
        gpu.upload(&buffer, &pattern).unwrap();
        held.push((buffer, pattern));
    }
    for (buffer, pattern) in held {
        assert_eq!(gpu.read::<u32>(&buffer).unwrap(), pattern, "{at}");
    }
}

/// Locks out state that degrades under long concurrent use of one backend: a race
/// in the caches, pools or resident table, a leak of device memory, a graph that
/// goes stale, or a result that drifts. Every operation's result is compared with
/// the reference interpreter (or with the bytes uploaded); at the end no resident
/// memory is left and every thread ran every kind of operation.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_soak_eight_threads_mixed_operations_stay_correct() {
    let seconds = env_or("VYRE_SOAK_SECONDS", 60);
    let threads = env_or("VYRE_SOAK_THREADS", 8);
    let gpu = backend();
    let cases = Arc::new(checked_cases());
    let counts = Arc::new(Counts::default());
    let resident_before = gpu.buffer_bytes();
    let kinds = Arc::new(soak_kinds());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let gpu = gpu.clone();
            let cases = Arc::clone(&cases);
            let counts = Arc::clone(&counts);
            let kinds = Arc::clone(&kinds);
            std::thread::spawn(move || {
                let mut rng = Rng(0x5eed ^ thread.wrapping_mul(0x1000_0001));
                let mut kinds_seen = [false; 5];
                let mut round = 0u64;
                // At least one round of each kind, then random kinds until the deadline.
                while round < kinds.len() as u64 || Instant::now() < deadline {
                    let checked = &cases[rng.below(CASES) as usize];
                    let at = context(thread, round, checked);
                    let kind = kinds[if round < kinds.len() as u64 {
                        round as usize
                    } else {
                        rng.below(kinds.len() as u64) as usize
                    }];
                    match kind {
                        0 => {
                            gpu.compile(&checked.case.program, &checked.case.config)
                                .unwrap_or_else(|e| panic!("{at}: compile: {e}"));
                            counts.compiles.fetch_add(1, Ordering::Relaxed);
                            borrowed_dispatch(&gpu, checked, &at);
                            counts.dispatches.fetch_add(1, Ordering::Relaxed);
                        }
                        1 => {
                            borrowed_dispatch(&gpu, checked, &at);
                            counts.dispatches.fetch_add(1, Ordering::Relaxed);
                        }
                        2 => {
                            resident_dispatch(&gpu, checked, &at);
                            counts.resident_dispatches.fetch_add(1, Ordering::Relaxed);
                        }
                        3 => graph_round(&gpu, checked, 1 + rng.below(8), &counts, &at),
                        _ => {
                            allocation_churn(&gpu, &mut rng, &at);
                            counts.allocations.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    kinds_seen[kind as usize] = true;
                    round += 1;
                }
                assert!(
                    kinds.iter().all(|&kind| kinds_seen[kind as usize]),
                    "thread {thread}"
                );
                round
            })
        })
        .collect();
    let rounds: u64 = workers
        .into_iter()
        .map(|worker| worker.join().expect("a soak thread failed"))
        .sum();
    assert_eq!(
        gpu.buffer_bytes(),
        resident_before,
        "device memory left after every buffer was dropped"
    );
    assert!(gpu.is_usable());
    println!(
        "soak: {threads} threads × {seconds} s: {rounds} rounds; {} compiles, {} dispatches, {} resident dispatches, {} graphs recorded, {} replays, {} allocation rounds; caches {:?}; pools {:?}",
        counts.compiles.load(Ordering::Relaxed),
        counts.dispatches.load(Ordering::Relaxed),
        counts.resident_dispatches.load(Ordering::Relaxed),
        counts.graph_records.load(Ordering::Relaxed),
        counts.graph_replays.load(Ordering::Relaxed),
        counts.allocations.load(Ordering::Relaxed),
        gpu.cache_stats(),
        gpu.pool_stats(),
    );
}

/// Every soak case once, one at a time, on the borrowed and the resident path, each
/// announced by its seed before it runs. Locks out a case whose kernel is wrong only
/// sometimes (a shared-memory race): the soak draws cases at random, so under
/// `compute-sanitizer --tool racecheck`, which reports after each kernel, only this
/// order ties a hazard report to the program that caused it (the report follows the
/// `soak case` line of its case).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_soak_cases_each_run_once_in_order() {
    let gpu = backend();
    let cases = checked_cases();
    for (index, checked) in cases.iter().enumerate() {
        println!("soak case {index} seed {:#x}", checked.case.seed);
        let at = context(0, index as u64, checked);
        borrowed_dispatch(&gpu, checked, &at);
        resident_dispatch(&gpu, checked, &at);
    }
    assert_eq!(cases.len() as u64, CASES);
    assert!(gpu.is_usable());
}

/// A CPU check of the soak's own bookkeeping (it runs in `cargo test`): the cases
/// it draws from are valid, none uses grid sync (graphs would refuse it), and the
/// output positions pick exactly the buffers the reference returns.
#[test]
fn soak_cases_fit_every_operation_of_the_soak() {
    for checked in checked_cases().iter().take(24) {
        let program = &checked.case.program;
        assert!(!format!("{program}").contains("grid_sync"), "{program}");
        assert_eq!(output_positions(program).len(), checked.expected.len());
        for (position, expected) in output_positions(program).into_iter().zip(&checked.expected) {
            assert_eq!(checked.case.inputs[position].len(), expected.len());
        }
    }
    let _ = DispatchConfig::linear(1);
}
