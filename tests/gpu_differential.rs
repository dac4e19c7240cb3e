//! GPU differential test at scale: at least 10,000 random valid
//! programs per run, each byte-identical on the GPU and on the reference
//! interpreter, and the batch compilation it relies on (`CudaBackend::compile_batch`).
//! Ignored by default; run on the GPU machine with `bash .gpu/run.sh gpu_differential`.
//! `VYRE_DIFFERENTIAL_PROGRAMS` changes the count (default 10,000),
//! `VYRE_DIFFERENTIAL_PROCESSES` the processes they are spread over (default
//! [`DEFAULT_PROCESSES`]; 1 = all in this process), `VYRE_DIFFERENTIAL_THREADS` the
//! threads per process (default: the cores divided by the processes),
//! `VYRE_DIFFERENTIAL_BATCH` the programs compiled per `compile_batch` call (default
//! [`DEFAULT_BATCH`]; 1 = one `compile`, so one module and one driver JIT, per
//! program, the path before batching).
//!
//! Where the time goes: every program is new, so each one pays the driver's JIT
//! (`cuModuleLoadData`); generation, the reference interpreter and lowering + PTX
//! text together take ~0.4 ms per program (release, measured on 40 seeds). H200 run 2:
//! 10,000 programs in ~200 s with one module per program. Once the writer hid
//! constants from the JIT (the opaque zero word, tests/jit_folding.rs) one module
//! per program cost ~44 ms and the loads of concurrent threads did not overlap:
//! 2,500 programs did not finish in 110 s. Two answers, each measurable alone:
//! - programs are compiled in batches, one module (one JIT) per batch, which pays
//!   whatever the JIT costs per call once per batch;
//! - the programs are spread over child processes (this test binary again, each
//!   checking the indices that are its number modulo the process count): if the
//!   driver serialises module loads within a process, separate processes (separate
//!   contexts) JIT in parallel.
//!
//!
//! Measured on the 2-core build machine with ptxas 12.9 (`-arch=sm_90`, the JIT's
//! compiler run standalone) on the first 64 programs of this test (2.6 MB of PTX):
//! one module of 64 kernels 9.1 s, 64 one-kernel modules 10.6 s, an empty module
//! 0.03 s. The work is per kernel, so batching saves only the per-call part; the
//! processes are what can divide the JIT time (if the driver serialises it within a
//! process), hence [`DEFAULT_PROCESSES`] of them.
//!
//! Each process prints its compile time per program (JIT included) and per module;
//! the parent asserts that the processes' counts add up to the programs asked for.
//!
//! Each thread has its own backend, replaced once it has served
//! [`PROGRAMS_PER_BACKEND`] programs: a program is used once, so its module-cache
//! entry is dead weight; dropping the backend unloads its modules, so the driver
//! holds at most a few modules per thread instead of all of them.

mod support;

#[path = "jit_folding/cases.rs"]
mod jit_folding_cases;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use support::backend;
use vyre_cuda::backend::{
    BackendError, Binding, CudaBackend, Dispatch, Kernel, Lane, LaneOptions, MAX_BATCH_PROGRAMS,
};
use vyre_cuda::ir::generate::{
    constructs_used, differential_case, valid_program, Construct, GeneratorOptions, RandomCase,
};
use vyre_cuda::ir::{Expr, Literal, Node, Program};
use vyre_cuda::DispatchConfig;

/// First seed: disjoint from the 400 seeds of `gpu_random_programs_match_reference_byte_for_byte`.
const FIRST_SEED: u64 = 1_000_000;

/// Programs one backend serves before it is dropped (unloading its modules).
const PROGRAMS_PER_BACKEND: u64 = 256;

/// Programs per `compile_batch` call (one module, one driver JIT) by default.
const DEFAULT_BATCH: u64 = 64;

/// Processes the programs are spread over by default (each its own CUDA context and
/// driver JIT; see the module docs): half the H200 host's 16 cores, two threads each.
const DEFAULT_PROCESSES: u64 = 8;

fn env_count(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

/// The case of `seed`: every tenth program may use a grid sync.
fn case_of(seed: u64) -> RandomCase {
    differential_case(seed)
}

/// One set of scalar values and the reference's outputs for them.
type ValuesAndOutputs = (Vec<Literal>, Vec<Vec<u8>>);

/// Programs using each construct (`Construct::ALL` order), counted as they are drawn.
type ConstructCounts = [AtomicU64; Construct::ALL.len()];

fn count_constructs(counts: &ConstructCounts, program: &Program) {
    for (count, used) in counts.iter().zip(constructs_used(program)) {
        if used {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `name share%` for each construct, one line.
fn construct_shares(counts: &[u64], programs: u64) -> String {
    Construct::ALL
        .iter()
        .zip(counts)
        .map(|(construct, &count)| {
            format!(
                "{} {:.1}%",
                construct.name(),
                100.0 * count as f64 / programs.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernels of `cases`: one `compile` each when `batch` is 1, else one
/// `compile_batch` call (the caller passes at most `batch` cases).
fn compile_cases(gpu: &CudaBackend, cases: &[RandomCase], batch: u64) -> Vec<Kernel> {
    let seeds = || format!("seeds {}..", cases[0].seed);
    if batch == 1 {
        return cases
            .iter()
            .map(|case| {
                gpu.compile(&case.program, &case.config)
                    .unwrap_or_else(|e| panic!("seed {}: {e}\n{}", case.seed, case.program))
            })
            .collect();
    }
    // One codegen policy per batch: the generator never varies it.
    assert!(cases
        .iter()
        .all(|case| case.config.codegen == cases[0].config.codegen));
    let programs: Vec<&Program> = cases.iter().map(|case| &case.program).collect();
    gpu.compile_batch(&programs, &cases[0].config)
        .unwrap_or_else(|e| panic!("{}: {e}", seeds()))
}

/// Set in a child process of the differential: `k/P`, the child's share of the
/// programs (those whose index is `k` modulo `P`).
const CHILD_SHARE: &str = "VYRE_DIFFERENTIAL_CHILD";

/// Which programs one process checks: every index that is `index` modulo `of`.
#[derive(Clone, Copy)]
struct Share {
    index: u64,
    of: u64,
}

impl Share {
    /// This process's share: from [`CHILD_SHARE`], or every program.
    fn of_this_process() -> Share {
        let parsed = std::env::var(CHILD_SHARE).ok().and_then(|value| {
            let (index, of) = value.split_once('/')?;
            Some(Share {
                index: index.parse().ok()?,
                of: of.parse().ok()?,
            })
        });
        parsed
            .filter(|share| share.index < share.of)
            .unwrap_or(Share { index: 0, of: 1 })
    }

    /// How many of `programs` fall in this share.
    fn programs(self, programs: u64) -> u64 {
        programs / self.of + u64::from(self.index < programs % self.of)
    }

    /// The program indices below `programs` in this share, in order.
    fn indices(self, programs: u64) -> impl Iterator<Item = u64> {
        (self.index..programs).step_by(self.of as usize)
    }

    fn label(self) -> String {
        if self.of == 1 {
            String::new()
        } else {
            format!(" (process {} of {})", self.index + 1, self.of)
        }
    }
}

/// This process's share of `test`'s `programs` programs; `None` when this is the
/// parent of a split run (`VYRE_DIFFERENTIAL_PROCESSES` > 1), which ran the shares in
/// child processes and checked their counts (the test is done).
fn share_or_spawn(test: &str, programs: u64, case: fn(u64) -> RandomCase) -> Option<Share> {
    let share = Share::of_this_process();
    let processes = env_count("VYRE_DIFFERENTIAL_PROCESSES")
        .unwrap_or(DEFAULT_PROCESSES)
        .clamp(1, 16);
    if share.of == 1 && processes > 1 {
        run_in_child_processes(test, processes, programs, case);
        return None;
    }
    Some(share)
}

/// The test binary again, once per share, each running `test` on its share; their
/// counts must add up to `programs` (`case` gives program `index` for the
/// construct counts).
fn run_in_child_processes(test: &str, processes: u64, programs: u64, case: fn(u64) -> RandomCase) {
    let exe = std::env::current_exe().expect("the test binary");
    let started = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|index| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    test,
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_SHARE, format!("{index}/{processes}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a differential process")
        })
        .collect();
    // The children's own construct lines are not passed on: count every program here
    // (generation alone) while they run.
    let constructs: ConstructCounts = Default::default();
    for index in 0..programs {
        count_constructs(&constructs, &case(index).program);
    }
    let mut checked = 0;
    for (index, child) in children.into_iter().enumerate() {
        let output = child
            .wait_with_output()
            .expect("wait for a differential process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "differential process {index} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // libtest prints `test NAME ... ` without a newline first, so the summary
        // may share its line.
        let line = stdout
            .lines()
            .find_map(|line| line.find("differential (").map(|at| &line[at..]))
            .unwrap_or_else(|| panic!("process {index} printed no summary:\n{stdout}"));
        println!("{line}");
        checked += line
            .split_once("): ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|count| count.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("unreadable summary: {line}"));
    }
    assert_eq!(
        checked, programs,
        "the processes did not check every program"
    );
    println!(
        "differential: {programs} random programs byte-identical on GPU and reference in {:.1} s \
         with {processes} processes",
        started.elapsed().as_secs_f64()
    );
    let counts: Vec<u64> = constructs
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect();
    println!(
        "constructs (share of the {programs} programs using each): {}",
        construct_shares(&counts, programs)
    );
}

/// Locks out semantic drift between the PTX writer and the reference interpreter
/// that 400 programs do not reach (a rare operator/type pair, a lowering shape, a
/// grid-sync protocol slip, a JIT rewrite such as the f32 tie folding of seed
/// 1008915), and batch kernels that differ from their single-program kernels: every
/// program of 10,000 must give byte-identical outputs on both. The count of
/// programs checked is asserted (per process, and their sum), so a run that skipped
/// programs fails.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_differential_ten_thousand_random_programs_match_reference() {
    let programs = env_count("VYRE_DIFFERENTIAL_PROGRAMS").unwrap_or(10_000);
    let Some(share) = share_or_spawn(
        "gpu_differential_ten_thousand_random_programs_match_reference",
        programs,
        |index| case_of(FIRST_SEED + index),
    ) else {
        return;
    };
    let cores = std::thread::available_parallelism().map_or(8, |n| n.get() as u64);
    let threads = env_count("VYRE_DIFFERENTIAL_THREADS")
        .unwrap_or((cores / share.of).max(1))
        .clamp(1, 64);
    let batch = env_count("VYRE_DIFFERENTIAL_BATCH")
        .unwrap_or(DEFAULT_BATCH)
        .clamp(1, MAX_BATCH_PROGRAMS as u64);
    let checked = Arc::new(AtomicU64::new(0));
    let compiles = Arc::new(AtomicU64::new(0));
    let constructs: Arc<ConstructCounts> = Arc::new(Default::default());
    // Thread-time totals in nanoseconds: generate + reference, compile, dispatch.
    let phase_ns: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let checked = Arc::clone(&checked);
            let compiles = Arc::clone(&compiles);
            let phase_ns = Arc::clone(&phase_ns);
            let constructs = Arc::clone(&constructs);
            std::thread::spawn(move || {
                let mine: Vec<u64> = share
                    .indices(programs)
                    .skip(thread as usize)
                    .step_by(threads as usize)
                    .collect();
                let mut gpu = backend();
                let mut served = 0u64;
                for chunk in mine.chunks(batch as usize) {
                    if served >= PROGRAMS_PER_BACKEND {
                        gpu = backend();
                        served = 0;
                    }
                    let start = Instant::now();
                    let cases: Vec<RandomCase> = chunk
                        .iter()
                        .map(|&index| case_of(FIRST_SEED + index))
                        .collect();
                    for case in &cases {
                        count_constructs(&constructs, &case.program);
                    }
                    // Each case's own scalar values, and for a program with scalars a
                    // second draw dispatched through the same kernel.
                    let expected: Vec<Vec<ValuesAndOutputs>> = cases
                        .iter()
                        .map(|case| {
                            support::value_draws(case)
                                .map(|values| {
                                    let outputs = support::case_reference(case, &values);
                                    (values, outputs)
                                })
                                .collect()
                        })
                        .collect();
                    let compile_start = Instant::now();
                    let kernels = compile_cases(&gpu, &cases, batch);
                    compiles.fetch_add(
                        if batch == 1 { cases.len() as u64 } else { 1 },
                        Ordering::Relaxed,
                    );
                    let dispatch_start = Instant::now();
                    for ((case, kernel), expected) in cases.iter().zip(&kernels).zip(&expected) {
                        let bindings: Vec<Binding<'_>> =
                            case.inputs.iter().map(|v| Binding::Host(v)).collect();
                        for (values, expected) in expected {
                            let request = Dispatch::new(kernel, &bindings).config(&case.config);
                            let request = support::with_scalars(request, &case.program, values);
                            let got = gpu.run(request).unwrap_or_else(|e| {
                                panic!("seed {}: {e}\n{}", case.seed, case.program)
                            });
                            assert_eq!(
                                &got.outputs, expected,
                                "seed {}: GPU and reference differ (scalars {values:?})\n{}",
                                case.seed, case.program
                            );
                        }
                    }
                    let done = Instant::now();
                    for (slot, (from, to)) in [
                        (start, compile_start),
                        (compile_start, dispatch_start),
                        (dispatch_start, done),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        phase_ns[slot].fetch_add((to - from).as_nanos() as u64, Ordering::Relaxed);
                    }
                    checked.fetch_add(cases.len() as u64, Ordering::Relaxed);
                    served += cases.len() as u64;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a differential thread failed");
    }
    assert_eq!(checked.load(Ordering::Relaxed), share.programs(programs));
    let seconds = |slot: usize| phase_ns[slot].load(Ordering::Relaxed) as f64 / 1e9;
    let modules = compiles.load(Ordering::Relaxed).max(1);
    println!(
        "differential{}: {} random programs byte-identical on GPU and reference in {:.1} s \
         with {threads} threads, {batch} programs per module ({modules} modules); thread time: \
         generate + reference {:.1} s, compile (lower + PTX + JIT) {:.1} s = {:.2} ms per program, \
         {:.1} ms per module, dispatch {:.1} s",
        share.label(),
        share.programs(programs),
        started.elapsed().as_secs_f64(),
        seconds(0),
        seconds(1),
        seconds(1) * 1e3 / share.programs(programs).max(1) as f64,
        seconds(1) * 1e3 / modules as f64,
        seconds(2)
    );
    let counts: Vec<u64> = constructs
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect();
    println!(
        "constructs{} (share of the {} programs using each): {}",
        share.label(),
        share.programs(programs),
        construct_shares(&counts, share.programs(programs))
    );
}

/// First seed of the lane differential (disjoint from the launch differential's).
const LANE_FIRST_SEED: u64 = 3_000_000;

/// Program `index` of the lane differential: the default generator (no grid sync,
/// which a lane refuses).
fn lane_case(index: u64) -> RandomCase {
    valid_program(LANE_FIRST_SEED + index, &GeneratorOptions::default())
}

/// Locks out a lane that runs a program differently from a launch (a builtin read
/// from the wrong place, workgroup memory not zeroed between workgroups run in turn,
/// a write-only output not zeroed, a fixpoint iteration racing the next, a readback
/// copied wrong, a body of a lane running another's code, a scalar value read from
/// the wrong word or served stale from the previous record): 2,000 random programs
/// (`VYRE_LANE_DIFFERENTIAL_PROGRAMS`), every construct of the generator among them,
/// grouped by workgroup shape into lanes of up to 64 kernels compiled in one batch,
/// lanes of 1, 2 or 3 blocks, every request over host bindings with the case's scalar
/// values and, for a program with scalars, a second draw of them right after,
/// byte-identical to the reference interpreter. Spread over `VYRE_DIFFERENTIAL_PROCESSES` processes of one
/// thread each (a process's lanes and its module loads then never wait on each
/// other); the count of programs checked is asserted. Each phase of each lane
/// (compiling, building, serving, stopping) prints a line on stderr and arms a
/// watchdog, so a hang fails its process naming the phase.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_differential_lanes_run_random_programs_as_the_reference_does() {
    let programs = env_count("VYRE_LANE_DIFFERENTIAL_PROGRAMS").unwrap_or(2_000);
    let Some(share) = share_or_spawn(
        "gpu_differential_lanes_run_random_programs_as_the_reference_does",
        programs,
        lane_case,
    ) else {
        return;
    };
    let started = Instant::now();
    let cases: Vec<RandomCase> = share.indices(programs).map(lane_case).collect();
    let mut by_shape: std::collections::BTreeMap<[u32; 3], Vec<&RandomCase>> =
        std::collections::BTreeMap::new();
    for case in &cases {
        by_shape
            .entry(case.program.workgroup_size())
            .or_default()
            .push(case);
    }
    let options = LaneOptions::new()
        .slots(2)
        .result_bytes(1 << 20)
        .staging_bytes(1 << 20);
    let mut gpu = backend();
    let (mut checked, mut lanes, mut served) = (0u64, 0u64, 0u64);
    // A line per phase on stderr (shown when a process fails) and a watchdog per
    // phase, so a hang ends the process naming its phase instead of an outer timeout
    // ending it silently.
    let label = share.label();
    let phase = |what: &str, seed: u64| {
        eprintln!(
            "differential{label}: seeds {seed}..: {what} ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        support::watchdog(
            120,
            "a lane differential phase (the last line above names it)",
        )
    };
    for group in by_shape.values() {
        for batch in group.chunks(64) {
            let seed = batch[0].seed;
            let guard = phase("compiling", seed);
            if served >= PROGRAMS_PER_BACKEND {
                gpu = backend();
                served = 0;
            }
            let owned: Vec<RandomCase> = batch.iter().map(|&case| case.clone()).collect();
            let kernels = compile_cases(&gpu, &owned, owned.len() as u64);
            let refs: Vec<&Kernel> = kernels.iter().collect();
            let blocks = 1 + (lanes % 3) as u32;
            drop(guard);
            let guard = phase("building the lane", seed);
            let lane = gpu
                .lane(&refs, options.blocks(blocks))
                .unwrap_or_else(|e| panic!("a lane of seeds {seed}..: {e}"));
            drop(guard);
            let guard = phase("serving", seed);
            lanes += 1;
            for (case, kernel) in owned.iter().zip(&kernels) {
                run_case_through_lane(&lane, kernel, case, blocks);
                checked += 1;
            }
            drop(guard);
            let _guard = phase("stopping the lane", seed);
            lane.stop()
                .unwrap_or_else(|e| panic!("stopping a lane of seeds {seed}..: {e}"));
            served += owned.len() as u64;
        }
    }
    assert_eq!(checked, share.programs(programs));
    println!(
        "differential{}: {checked} random programs byte-identical through lanes and on the \
         reference in {:.1} s ({lanes} lanes)",
        share.label(),
        started.elapsed().as_secs_f64()
    );
}

/// `case` through `lane` (its `kernel`, a lane of `blocks` blocks) over host
/// bindings, with the case's own scalar values and, for a program with scalars, a
/// second draw through the same body (a new record, the same module): each run
/// byte-identical to the reference interpreter.
fn run_case_through_lane(lane: &Lane, kernel: &Kernel, case: &RandomCase, blocks: u32) {
    let bindings = support::host_bindings(&case.inputs);
    for values in support::value_draws(case) {
        let expected = support::case_reference(case, &values);
        let request = Dispatch::new(kernel, &bindings).config(&case.config);
        let got = lane
            .run(support::with_scalars(request, &case.program, &values))
            .unwrap_or_else(|e| {
                panic!(
                    "seed {} ({blocks} blocks): {e}\n{}",
                    case.seed, case.program
                )
            });
        assert_eq!(
            got.outputs, expected,
            "seed {} ({blocks} blocks): lane and reference differ (scalars {values:?})\n{}",
            case.seed, case.program
        );
    }
}

/// Seeds of the lane differential that once failed on the GPU, each with what it
/// found: 3001889 (a `return` inside a loop inside divergent branches) left its
/// warp diverged when the server called the next workgroup's body, whose aligned
/// entry barrier then waited forever, so the request timed out.
const LANE_REGRESSION_SEEDS: [u64; 1] = [3_001_889];

/// Locks out the lane defects the differential found (see [`LANE_REGRESSION_SEEDS`]):
/// each seed alone through lanes of 1, 2 and 3 blocks, each with every draw of its
/// scalar values, byte-identical to the reference interpreter within a 5 s lane
/// timeout. Negative control (run on the H200): with the aligned barrier in lane
/// bodies, seed 3001889 timed out in its lane of 1 block.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_differential_lane_regression_seeds_match_reference() {
    let _watchdog = support::watchdog(60, "the lane regression seeds");
    let gpu = backend();
    for seed in LANE_REGRESSION_SEEDS {
        let case = lane_case(seed - LANE_FIRST_SEED);
        let kernels = compile_cases(&gpu, std::slice::from_ref(&case), 1);
        for blocks in 1..=3u32 {
            let lane = gpu
                .lane(
                    &[&kernels[0]],
                    LaneOptions::new()
                        .blocks(blocks)
                        .result_bytes(1 << 20)
                        .staging_bytes(1 << 20)
                        .timeout(std::time::Duration::from_secs(5)),
                )
                .unwrap_or_else(|e| panic!("a lane of seed {seed}: {e}"));
            run_case_through_lane(&lane, &kernels[0], &case, blocks);
            lane.stop().unwrap();
        }
    }
}

/// Locks out a lane differential that fails on its own options instead of on a real
/// difference: each of its first 2,000 programs binds at most 64 buffers, and its
/// outputs (every output buffer, 16-byte aligned, after the area's header) and host
/// inputs fit the 1 MiB result area and staging it runs with. Runs on the CPU.
/// Negative control: the same sums over a 4 KiB area do not all fit.
#[test]
fn lane_differential_programs_fit_their_lanes() {
    use vyre_cuda::ir::Access;
    let sizes = |case: &RandomCase| {
        let globals = case.program.global_buffers();
        assert!(globals.len() <= 64, "seed {}", case.seed);
        let header = vyre_cuda::codegen::ptx::lane::AREA_HEADER_BYTES as u64;
        let (mut outputs, mut inputs) = (header, 0u64);
        for (decl, bytes) in globals.iter().zip(&case.inputs) {
            let padded = (bytes.len() as u64).div_ceil(16) * 16;
            if matches!(decl.access, Access::ReadWrite | Access::WriteOnly) {
                outputs += padded;
            }
            if decl.access != Access::WriteOnly {
                inputs += padded;
            }
        }
        (outputs, inputs)
    };
    let all: Vec<(u64, u64)> = (0..2_000).map(|index| sizes(&lane_case(index))).collect();
    assert!(all
        .iter()
        .all(|&(outputs, inputs)| outputs <= 1 << 20 && inputs <= 1 << 20));
    assert!(all.iter().any(|&(outputs, _)| outputs > 4096));
}

/// Locks out a batch module whose kernels are mixed up (kernel i running program
/// j's code, a grid barrier shared between kernels, a kernel whose module was
/// unloaded) and a batch that loads one module per program: 40 generated programs
/// (grid syncs among them) compiled in one call share one module, each kernel's
/// dispatch gives the reference interpreter's bytes, and `compile` of each program
/// afterwards is a module-cache hit returning a kernel of that same module.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_compile_batch_kernels_match_reference_and_share_one_module() {
    let gpu = backend();
    let cases: Vec<RandomCase> = (2_000_000..2_000_040).map(case_of).collect();
    let before = gpu.cache_stats();
    let kernels = compile_cases(&gpu, &cases, cases.len() as u64);
    assert_eq!(kernels.len(), cases.len());
    assert!(
        kernels.iter().any(Kernel::uses_grid_sync),
        "no grid-sync program in the batch"
    );
    // One module-cache entry per distinct program (the batch loads each once).
    let distinct: std::collections::HashSet<_> = kernels.iter().map(Kernel::module_key).collect();
    assert_eq!(
        gpu.cache_stats().module_entries,
        before.module_entries + distinct.len() as u64
    );
    for (index, (case, kernel)) in cases.iter().zip(&kernels).enumerate() {
        assert!(
            kernel.shares_module_with(&kernels[0]),
            "kernel {index} has its own module"
        );
        let expected = support::case_reference(case, &case.scalars);
        let bindings = support::host_bindings(&case.inputs);
        let request = Dispatch::new(kernel, &bindings).config(&case.config);
        let got = gpu
            .run(support::with_scalars(request, &case.program, &case.scalars))
            .unwrap_or_else(|e| panic!("program {index}: {e}\n{}", case.program));
        assert_eq!(
            got.outputs, expected,
            "program {index}: GPU and reference differ\n{}",
            case.program
        );
    }
    let hits_before = gpu.cache_stats().module.hits;
    for (case, kernel) in cases.iter().zip(&kernels) {
        let again = gpu.compile(&case.program, &case.config).expect("compile");
        assert_eq!(again.module_key(), kernel.module_key());
        assert!(again.shares_module_with(kernel));
    }
    assert_eq!(
        gpu.cache_stats().module.hits,
        hits_before + cases.len() as u64
    );
}

/// Locks out a batch error that hides the failing program or loads half a batch: a
/// store into an undeclared buffer at index 2 refuses the whole batch with the
/// validator's `Fix:` error naming "program 2 of the batch" and loads nothing; a
/// program given twice gets one kernel; more than `MAX_BATCH_PROGRAMS` programs is a
/// `Fix:` error.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_compile_batch_refuses_a_bad_batch_and_loads_nothing() {
    let gpu = backend();
    let cases: Vec<RandomCase> = (2_100_000..2_100_004).map(case_of).collect();
    // Stores into a buffer it does not declare.
    let store = Node::Store {
        buffer: "missing".into(),
        index: Expr::u32(0),
        value: Expr::u32(1),
    };
    let invalid = Program::new(Vec::new(), [1, 1, 1], vec![store]);
    let mut programs: Vec<Program> = cases.iter().map(|case| case.program.clone()).collect();
    programs.insert(2, invalid);
    let config = DispatchConfig::linear(1);
    let before = gpu.cache_stats().module_entries;
    let error = gpu
        .compile_batch(&programs, &config)
        .expect_err("invalid program");
    let message = error.to_string();
    assert!(
        matches!(error, BackendError::InvalidProgram { .. }),
        "{error:?}"
    );
    assert!(message.starts_with("Fix:"), "{message}");
    assert!(message.contains("program 2 of the batch"), "{message}");
    assert_eq!(
        gpu.cache_stats().module_entries,
        before,
        "a refused batch loaded kernels"
    );

    let repeated = [&cases[0].program, &cases[1].program, &cases[0].program];
    let kernels = gpu
        .compile_batch(&repeated, &config)
        .expect("repeated program");
    assert_eq!(kernels[0].module_key(), kernels[2].module_key());
    assert_eq!(gpu.cache_stats().module_entries, before + 2);

    let too_many = vec![&cases[0].program; MAX_BATCH_PROGRAMS + 1];
    let error = gpu
        .compile_batch(&too_many, &config)
        .expect_err("too many programs");
    assert!(error.to_string().starts_with("Fix:"), "{error}");
}

/// Locks out the two JIT rewrites the differential found (tests/jit_folding.rs has
/// the root causes): the minimised programs, and the two original seeds, give the
/// reference's bytes on the GPU. (Before the fix: `-26627842` instead of
/// `-26627844` for the tie, and `0xb1652400` instead of `0x4e9adc00` for the
/// nested max of an absolute value.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_jit_folding_regressions_match_reference() {
    let gpu = backend();
    let config = DispatchConfig::linear(1);
    let tie = support::run_host(
        &gpu,
        &jit_folding_cases::tie_program(),
        &[&[0u8; 12]],
        &config,
    )
    .expect("dispatch");
    assert_eq!(tie, vec![jit_folding_cases::tie_expected()]);
    let negation = support::run_host(
        &gpu,
        &jit_folding_cases::negation_program(),
        &[&jit_folding_cases::negation_inputs(), &[0u8; 12]],
        &config,
    )
    .expect("dispatch");
    assert_eq!(negation, vec![jit_folding_cases::negation_expected()]);
    for seed in [1_007_798u64, 1_008_915] {
        // `core_only`: the generator that printed these seeds.
        let case = valid_program(seed, &GeneratorOptions::default().core_only());
        let inputs: Vec<&[u8]> = case.inputs.iter().map(|v| v.as_slice()).collect();
        let expected = vyre_cuda::reference::run(&case.program, &inputs, &case.config)
            .unwrap_or_else(|e| panic!("seed {seed}: reference failed: {e}"));
        let got = support::run_host(&gpu, &case.program, &inputs, &case.config)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(got, expected, "seed {seed}: GPU and reference differ");
    }
}

/// Locks out a split over processes that skips or repeats programs (the parent's
/// count check would then fail on the GPU, or pass with programs unchecked): for
/// every process count up to 16 and program counts around it, the shares' indices
/// are disjoint, cover every program, and each share's count is what
/// `Share::programs` says. Runs on the CPU. Negative control: the count without
/// the remainder (`programs / of`) is wrong for the first share of 10 over 3.
#[test]
fn differential_shares_cover_every_program_once() {
    assert_ne!(Share { index: 0, of: 3 }.programs(10), 10 / 3);
    for of in 1..=16u64 {
        for programs in [0, 1, of - 1, of, of + 1, 10_000] {
            let mut seen = vec![0u32; programs as usize];
            for index in 0..of {
                let share = Share { index, of };
                let mine: Vec<u64> = share.indices(programs).collect();
                assert_eq!(
                    mine.len() as u64,
                    share.programs(programs),
                    "{index}/{of} of {programs}"
                );
                for i in mine {
                    seen[i as usize] += 1;
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "{of} processes, {programs} programs"
            );
        }
    }
}

/// Locks out a differential that stops drawing a construct (a generator change that
/// makes it rare would leave it untested on the GPU without a sound): across the
/// differential's first 2,000 seeds every construct appears in at least 2% of the
/// programs (grid syncs are allowed in one in ten), and each of the later ones
/// (`while`, `break`, `continue`, returning atomics, atomic loads, acquire loads, 64-bit
/// integers, local arrays, scans) in at least 15%. Prints the shares. Runs on the
/// CPU. Negative control: the same count over `core_only` programs finds none of the
/// later ones.
#[test]
fn differential_programs_draw_every_construct() {
    const SEEDS: u64 = 2_000;
    let count = |case: &dyn Fn(u64) -> RandomCase| {
        let counts: ConstructCounts = Default::default();
        for index in 0..SEEDS {
            count_constructs(&counts, &case(FIRST_SEED + index).program);
        }
        counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect::<Vec<u64>>()
    };
    let counts = count(&case_of);
    println!("constructs: {}", construct_shares(&counts, SEEDS));
    let later = [
        Construct::While,
        Construct::Break,
        Construct::Continue,
        Construct::WideIntegers,
        Construct::LocalArray,
        Construct::AtomicFetch,
        Construct::CompareExchange,
        Construct::AtomicLoad,
        Construct::AcquireLoad,
        Construct::WorkgroupScan,
        Construct::Scalar,
    ];
    for (construct, &count) in Construct::ALL.iter().zip(&counts) {
        let floor = if later.contains(construct) { 15 } else { 2 };
        assert!(
            count * 100 >= SEEDS * floor,
            "{} in only {count} of {SEEDS} programs",
            construct.name()
        );
    }
    let core = count(&|seed| {
        let options = GeneratorOptions {
            allow_grid_sync: seed % 10 == 9,
            ..GeneratorOptions::default()
        };
        valid_program(seed, &options.core_only())
    });
    for (construct, &count) in Construct::ALL.iter().zip(&core) {
        if later.contains(construct) {
            assert_eq!(count, 0, "{} in a core_only program", construct.name());
        }
    }
}

/// The outputs of `case` on the reference interpreter, with atomics applied in
/// ascending or in descending lane order.
fn reference_in_order(case: &RandomCase, reverse_atomic_order: bool) -> Vec<Vec<u8>> {
    let options = vyre_cuda::reference::ReferenceOptions {
        reverse_atomic_order,
        ..Default::default()
    };
    vyre_cuda::reference::run_with_scalars(
        &case.program,
        &case.input_slices(),
        &case.scalars,
        &case.config,
        &options,
    )
    .map(|(outputs, _)| outputs)
    .unwrap_or_else(|e| panic!("the reference refused it: {e}\n{}", case.program))
}

/// Locks out generated programs whose outputs depend on the order threads run their
/// atomics in, which the GPU does not keep (first found on the H200: every counter
/// site folded its returned value into the tally through its own function and slot,
/// so which site got which value was up to the order): the differential's first
/// 1,000 cases and `gpu_random_programs_match_reference_byte_for_byte`'s 400 give the
/// same bytes with each atomic statement's lanes applied in ascending and in
/// descending order. Runs on the CPU. Negative control: a program that stores each
/// thread's fetch-add result is told apart by the same comparison.
#[test]
fn generated_programs_do_not_depend_on_the_order_of_atomics() {
    let differential = (FIRST_SEED..FIRST_SEED + 1_000).map(case_of);
    let random = (0..400).map(|seed| valid_program(seed, &GeneratorOptions::default()));
    for case in differential.chain(random) {
        assert_eq!(
            reference_in_order(&case, false),
            reference_in_order(&case, true),
            "the order of atomics changes the outputs of\n{}",
            case.program
        );
    }

    use vyre_cuda::ir::{Access, AtomicOp, Axis, BufferCount, ElemType, Expr, Program};
    let program = Program::builder([64, 1, 1])
        .buffer(
            "next",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "slot",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(64),
        )
        .body(|b| {
            let slot = b.atomic_fetch("taken", AtomicOp::Add, "next", 0u32, 1u32);
            b.store("slot", Expr::global_id(Axis::X), slot);
        })
        .build();
    let control = RandomCase {
        seed: 0,
        program,
        inputs: vec![vec![0; 4], vec![0; 256]],
        config: vyre_cuda::DispatchConfig::linear(1),
        scalars: Vec::new(),
    };
    assert_ne!(
        reference_in_order(&control, false),
        reference_in_order(&control, true)
    );
}
