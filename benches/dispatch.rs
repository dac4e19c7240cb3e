//! A program request (`run(Dispatch::program(..))`) of the measurement fixture over
//! device buffers against the raw-driver floor, measured in the same run:
//!
//! - ratio to the floor at (buffers, IR nodes) = (9, 64), (9, 1,024), (9, 16,384),
//!   (2, 64), (17, 64), every writable buffer read back (target ≤ 1.15);
//! - flatness: the 16,384-node dispatch against the 1-node dispatch (target ≤ 1.05);
//! - cold first dispatch of a new 4,096-node program: lower + emit + driver JIT +
//!   launch (target ≤ 100 ms);
//! - pipelining: submit + wait against a blocking `run` of the same kernel request
//!   (no hot-path regression),
//!   and a loop with two submissions in flight against the blocking loop (target:
//!   ≥ 1.6× its throughput).
//!
//! First, the three floors, measured in the same run and quoted beside every
//! dispatch figure (`floors_table`, minimum of 9 rotated rounds, the method of the
//! measured readback table): launch + sync (the physical floor), the best raw readback
//! (the kernel writes host-mapped memory; also the result ABI's raw mechanism), and
//! the per-output-copy floor. Then the readback size sweep that sets
//! `readback::MAPPED_RANGE_MAX_BYTES` (`readback_sweep`). Set `VYRE_BENCH_FLOORS_ONLY=1`
//! to stop after those two.
//!
//! Then persistent lanes (`lane_table`, `lane_chain`): a lane request at (9, 64),
//! (17, 64) and (9, 16,384) against launch + sync measured in the same rotated rounds
//! (target ≤ 0.45 ×, moonshot ≤ 0.35 ×), each waiting mode's cost, the same request
//! with nothing read back (what the readback adds), the minimum with
//! p50 / p99 / p99.9 of 20,000 single requests beside those of launch + sync, where
//! a request's time goes (medians of the host's phases and the server's stamps), and a
//! chain of two dependent requests against the same chain eager (target ≤ 0.5 ×). The
//! lane rows also compare lanes with other numbers of doorbell-polling warps
//! (`VYRE_BENCH_LANE_POLLERS`, a comma-separated list; default 0 and 2) and lanes of
//! other numbers of host-mapped memory candidates (`VYRE_BENCH_LANE_CANDIDATES`;
//! default 1: no choice), each row naming the candidate its lane chose. Set
//! `VYRE_BENCH_LANES_ONLY=1` to run only the lane rows.
//!
//! First of all, what changing a recorded graph step's scalars and grid costs the
//! host (`graph_updates`: one call per change against one `set_launch`; set
//! `VYRE_BENCH_GRAPH_UPDATES_ONLY=1` to run only that).
//!
//! Each comparison below is a paired ABBA run of host_cost (`Paired::compare`): the floor is
//! a prebuilt `cuLaunchKernel` + one 16-byte async copy per output + one synchronize
//! on one stream (`backend::floor::RawFloor`). Run: `cargo bench --bench dispatch`
//! (on the GPU machine: `.gpu/bin/bench-dispatch`). Set `VYRE_BENCH_QUICK=1` for
//! shorter regions.

mod common;

use std::time::Instant;

use vyre_cuda::backend::floor::{EpilogueAnatomy, LaunchParameterSweep, RawFloor, ReadbackSweep};
use vyre_cuda::backend::readback::{FLAG_END_STAMP, FLAG_START_STAMP};
use vyre_cuda::backend::{
    Binding, CudaBackend, DeviceBuffer, Dispatch, Finished, Lane, LaneOptions, PendingDispatch,
    Timings, WaitMode,
};
use vyre_cuda::fixtures::{chain_for_nodes, host_cost_fixture, host_cost_fixture_salted};
use vyre_cuda::host_cost::{Paired, Report};
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Literal, Program, ScalarType};
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

struct Shape {
    buffers: u32,
    nodes: u32,
}

/// One device buffer per global buffer of `program`, each filled with ones.
fn resident_inputs(gpu: &CudaBackend, program: &Program) -> Vec<DeviceBuffer> {
    program
        .global_buffers()
        .iter()
        .map(|b| {
            let bytes = b.static_size_bytes().unwrap_or(16);
            gpu.buffer_from(&vec![1u8; bytes as usize])
                .expect("allocate and upload")
        })
        .collect()
}

/// The bindings of `buffers`, in order.
fn on(buffers: &[DeviceBuffer]) -> Vec<Binding<'_>> {
    buffers.iter().map(Binding::from).collect()
}

/// A blocking program request over `bindings` (what `dispatch_resident` was).
fn run_program(
    gpu: &CudaBackend,
    program: &Program,
    bindings: &[Binding<'_>],
    config: &DispatchConfig,
) -> Finished {
    gpu.run(Dispatch::program(program, bindings).config(config))
        .expect("dispatch")
}

/// The first byte of the first output (what keeps a measured arm's work observable).
fn first_byte(finished: &Finished) -> u64 {
    finished
        .outputs
        .item(0)
        .and_then(|item| item.first())
        .map_or(0, |&byte| byte as u64)
}

/// One paired ABBA comparison of two per-unit arms; prints and records its row.
fn pair(
    report: &mut Report,
    lines: &mut Vec<String>,
    (name_a, arm_a): (&str, &mut dyn FnMut() -> u64),
    (name_b, arm_b): (&str, &mut dyn FnMut() -> u64),
) -> Option<Paired> {
    let repeat = |arm: &mut dyn FnMut() -> u64, n: u64| (0..n).fold(0u64, |acc, _| acc ^ arm());
    match Paired::compare(
        name_a,
        |n| repeat(&mut *arm_a, n),
        name_b,
        |n| repeat(&mut *arm_b, n),
        &common::options(),
    ) {
        Ok(p) => {
            let line = common::row(&p, "dispatch", 34, 3);
            println!("{line}");
            lines.push(line);
            report.add_paired(p.clone());
            Some(p)
        }
        Err(e) => {
            println!("{name_b} vs {name_a}: {e}");
            report.add_failure(name_b, &e);
            None
        }
    }
}

/// A named measured operation (returns a value so the work cannot be elided).
type Arm<'a> = (String, Box<dyn FnMut() -> u64 + 'a>);

/// The launch + sync floor as an arm named `name` (the first row of a table: the
/// ratios' denominator), over a floor the table's other arms may share.
fn floor_arm<'a, 'f: 'a>(name: &str, floor: &'a std::cell::RefCell<&'f mut RawFloor>) -> Arm<'a> {
    (
        name.into(),
        Box::new(|| floor.borrow_mut().launch_sync().expect("floor")),
    )
}

/// Per-call minimum (ns) of each arm over `rounds` rounds of `calls` calls, the arms'
/// order rotated every round (the method of the measured floor tables).
fn rotated_minimum(arms: &mut [Arm<'_>], rounds: usize, calls: u32) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; arms.len()];
    let mut sink = 0u64;
    for round in 0..rounds {
        for k in 0..arms.len() {
            let index = (k + round) % arms.len();
            let arm = &mut arms[index].1;
            sink ^= arm(); // one warm call outside the timed region
            let start = Instant::now();
            for _ in 0..calls {
                sink ^= arm();
            }
            let per_call = start.elapsed().as_nanos() as f64 / calls as f64;
            best[index] = best[index].min(per_call);
        }
    }
    std::hint::black_box(sink);
    best
}

/// What changing a recorded step's launch costs the host, with no replay
/// between: two scalars and the grid written one call each (`set_scalar`
/// twice, then `set_workgroups`) against one `set_launch` of all three, the
/// values alternating between two sets so that every call writes; one replay
/// of the graph beside them for scale. Minimum of 9 rotated rounds (5 quick).
/// Every write of a launch node is a `cuGraphExecKernelNodeSetParams` and its
/// captured graph's twin. `VYRE_BENCH_GRAPH_UPDATES_ONLY=1` runs only this.
fn graph_updates(gpu: &CudaBackend) {
    let program = Program::builder([64, 1, 1])
        .entry_op_id("scale_and_add")
        .buffer(
            "dst",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .scalar("a", ScalarType::U32)
        .scalar("b", ScalarType::U32)
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("dst")), |b| {
                b.store("dst", i.clone(), i * Expr::scalar("a") + Expr::scalar("b"));
            });
        })
        .build();
    let config = DispatchConfig::linear(4).with_readback(ReadbackPolicy::None);
    let kernel = gpu.compile(&program, &config).expect("compile");
    let destination = gpu.buffer(4 * 256).expect("buffer");
    let bindings = [Binding::from(&destination)];
    let mut step = None;
    let graph = gpu
        .record(|rec| {
            step = Some(
                rec.dispatch(
                    Dispatch::new(&kernel, &bindings)
                        .config(&config)
                        .scalar("a", 1u32)
                        .scalar("b", 0u32),
                )?,
            );
            Ok(())
        })
        .expect("record");
    let step = step.expect("step");
    let graph = std::cell::RefCell::new(graph);
    // Each call of an arm writes the other of two value sets.
    let values = |flip: &mut bool| {
        *flip = !*flip;
        if *flip {
            (3u32, 5u32, 2u32)
        } else {
            (1, 0, 4)
        }
    };
    let (mut one_each, mut at_once) = (false, false);
    let mut arms: Vec<Arm<'_>> = vec![
        (
            "set_scalar × 2 + set_workgroups".into(),
            Box::new(|| {
                let (a, b, groups) = values(&mut one_each);
                let mut graph = graph.borrow_mut();
                graph.set_scalar(step, "a", a).expect("set_scalar");
                graph.set_scalar(step, "b", b).expect("set_scalar");
                graph
                    .set_workgroups(step, [groups, 1, 1])
                    .expect("set_workgroups");
                0
            }),
        ),
        (
            "set_launch (both scalars and the grid)".into(),
            Box::new(|| {
                let (a, b, groups) = values(&mut at_once);
                graph
                    .borrow_mut()
                    .set_launch(
                        step,
                        &[("a", Literal::from(a)), ("b", Literal::from(b))],
                        Some([groups, 1, 1]),
                    )
                    .expect("set_launch");
                0
            }),
        ),
        (
            "replay (for scale)".into(),
            Box::new(|| graph.borrow_mut().replay().expect("replay").wall_ns),
        ),
    ];
    let (rounds, calls) = if quick() { (5, 200) } else { (9, 1000) };
    let ns = rotated_minimum(&mut arms, rounds, calls);
    println!("
changing a recorded step's two scalars and grid, host time per change (minimum of {rounds} rotated rounds × {calls} calls):");
    for ((name, _), t) in arms.iter().zip(&ns) {
        println!("  {name:<44} {:>8.2} µs", t / 1e3);
    }
}

fn quick() -> bool {
    std::env::var_os("VYRE_BENCH_QUICK").is_some()
}

/// The floors and every dispatch path of one fixture shape, in one rotated
/// measurement; prints µs and the ratio of each dispatch figure to the three floors,
/// then the targets.
fn floors_table(gpu: &CudaBackend, buffers: u32, nodes: u32) -> f64 {
    let program = host_cost_fixture(buffers, chain_for_nodes(nodes));
    let handles = resident_inputs(gpu, &program);
    let reads = (buffers - 1) as usize;
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).expect("compile");
    let bindings = on(&handles);
    let mut floor = RawFloor::new(gpu, &program, [1, 1, 1]).expect("raw floor");
    let mut out_buffers = vec![[0u8; 16]; reads];
    let mut graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &bindings).config(&config))?;
            for h in &handles[1..] {
                rec.read_back(h, 0, 16)?;
            }
            Ok(())
        })
        .expect("record");
    let floor = std::cell::RefCell::new(&mut floor);
    let mut arms: Vec<Arm<'_>> = vec![
        floor_arm("floor: launch + sync", &floor),
        (
            "floor: kernel writes mapped memory".into(),
            Box::new(|| floor.borrow_mut().launch_mapped_sync().expect("floor")),
        ),
        (
            format!("floor: result ABI, {reads} ranges"),
            Box::new(|| {
                floor
                    .borrow_mut()
                    .launch_result_abi_sync(reads)
                    .expect("floor")
            }),
        ),
        (
            format!("floor: {reads} async copies + sync"),
            Box::new(|| {
                floor
                    .borrow_mut()
                    .launch_async_reads_sync(reads)
                    .expect("floor")
            }),
        ),
        (
            "run (program, outputs) [dispatch_resident]".into(),
            Box::new(|| first_byte(&run_program(gpu, &program, &bindings, &config))),
        ),
        (
            "run (program, timings) [dispatch_resident_timed]".into(),
            Box::new(|| {
                run_program(gpu, &program, &bindings, &config)
                    .timings
                    .kernel_stamps_ns
            }),
        ),
        (
            "run_into (kernel, caller buffers) [dispatch_kernel_into]".into(),
            Box::new(|| {
                let mut outs: Vec<&mut [u8]> =
                    out_buffers.iter_mut().map(|b| b.as_mut_slice()).collect();
                gpu.run_into(Dispatch::new(&kernel, &bindings).config(&config), &mut outs)
                    .expect("dispatch")
                    .kernel_stamps_ns
            }),
        ),
        (
            "graph replay: kernel + read_backs".into(),
            Box::new(|| graph.replay().expect("replay").wall_ns),
        ),
    ];
    let (rounds, calls) = if quick() { (5, 100) } else { (9, 400) };
    let ns = rotated_minimum(&mut arms, rounds, calls);
    let (physical, mapped, copies) = (ns[0], ns[1], ns[3]);
    println!("\n(buffers {buffers}, nodes {}), {reads} outputs of 16 B, minimum of {rounds} rotated rounds × {calls} calls:", program.node_count());
    println!(
        "{:<58} {:>9} {:>11} {:>11} {:>11}",
        "", "µs", "/launch+sync", "/mapped", "/per-copy"
    );
    for ((name, _), &t) in arms.iter().zip(&ns) {
        println!(
            "{name:<58} {:>9.2} {:>11.3} {:>11.3} {:>11.3}",
            t / 1e3,
            t / physical,
            t / mapped,
            t / copies
        );
    }
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let untimed = ns[4] / physical;
    let timed = ns[5] / ns[4];
    let graph_ratio = ns[7] / physical;
    println!(
        "target untimed ≤ 1.35 × launch+sync: {untimed:.3} {}",
        verdict(untimed <= 1.35)
    );
    println!(
        "target timed ≤ 1.10 × untimed: {timed:.3} {}",
        verdict(timed <= 1.10)
    );
    println!(
        "target graph replay ≤ 1.15 × launch+sync: {graph_ratio:.3} {}",
        verdict(graph_ratio <= 1.15)
    );
    drop(arms);
    drop(graph);
    ns[4]
}

/// Where a program request's host time goes at one shape: the probe's
/// phase table over 2,000 warm dispatches (the first 500 lines dropped). The probe
/// adds its own clock reads, so the table is for comparing phases and shapes, not
/// for the dispatch's absolute cost (the floors table has that).
fn host_phases(gpu: &CudaBackend, buffers: u32, nodes: u32) {
    let program = host_cost_fixture(buffers, chain_for_nodes(nodes));
    let handles = resident_inputs(gpu, &program);
    let bindings = on(&handles);
    let config = DispatchConfig::linear(1);
    let (_, lines) = {
        let _on = vyre_cuda::probe::override_enabled(Some(true));
        vyre_cuda::probe::capture_lines(|| {
            for _ in 0..2000 {
                run_program(gpu, &program, &bindings, &config);
            }
        })
    };
    let warm = lines[lines.len().min(500)..].join("\n");
    let summary = vyre_cuda::probe::report::summarize_log(&warm);
    println!(
        "\nhost phases of run (program request over device buffers; buffers {buffers}, nodes {}), probe on:",
        program.node_count()
    );
    println!("{}", vyre_cuda::probe::report::render_table(&summary));
}

/// The size crossover between the mapped result area and one DMA copy (and, for
/// scale, the kernel writing host-mapped memory itself), sizes 16 B to 1 MiB.
fn readback_sweep(gpu: &CudaBackend) {
    const MAX: usize = 1 << 20;
    let mut sweep = ReadbackSweep::new(gpu, MAX).expect("sweep");
    let (rounds, calls) = if quick() { (5, 50) } else { (9, 200) };
    println!("\nreadback size sweep (fill kernel, then the bytes reach the host), µs, minimum of {rounds} rotated rounds:");
    println!(
        "{:>9} {:>10} {:>14} {:>16}",
        "bytes", "DMA copy", "result area", "kernel → mapped"
    );
    let mut crossover = None;
    let mut size = 16usize;
    while size <= MAX {
        let area_ok = size <= ReadbackSweep::AREA_CAPACITY;
        let sweep_cell = std::cell::RefCell::new(&mut sweep);
        let mut arms: Vec<Arm<'_>> = vec![
            (
                "copy".into(),
                Box::new(|| sweep_cell.borrow_mut().copy_sweep(size).expect("copy")),
            ),
            (
                "mapped".into(),
                Box::new(|| {
                    sweep_cell
                        .borrow_mut()
                        .mapped_write_sweep(size)
                        .expect("mapped")
                }),
            ),
        ];
        if area_ok {
            arms.push((
                "area".into(),
                Box::new(|| sweep_cell.borrow_mut().area_sweep(size).expect("area")),
            ));
        }
        let ns = rotated_minimum(&mut arms, rounds, calls);
        drop(arms);
        let area = ns.get(2).copied();
        if let Some(area) = area {
            if crossover.is_none() && area > ns[0] {
                crossover = Some(size);
            }
        }
        println!(
            "{size:>9} {:>10.2} {:>14} {:>16.2}",
            ns[0] / 1e3,
            area.map_or("-".to_string(), |a| format!("{:.2}", a / 1e3)),
            ns[1] / 1e3
        );
        size *= 4;
    }
    match crossover {
        Some(size) => println!("crossover: the result area loses to one DMA copy from {size} bytes (MAPPED_RANGE_MAX_BYTES = {})", vyre_cuda::backend::readback::MAPPED_RANGE_MAX_BYTES),
        None => println!("crossover: the result area wins up to its capacity ({} bytes)", ReadbackSweep::AREA_CAPACITY),
    }
}

/// Where a result-ABI launch's time goes: launch + sync against the size of the
/// kernel's parameters (a trivial kernel per size), and the result-ABI kernel of
/// the fixture with its epilogue's parts switched on one by one.
fn launch_anatomy(gpu: &CudaBackend) {
    let (rounds, calls) = if quick() { (5, 100) } else { (9, 400) };
    let mut sweep = LaunchParameterSweep::new(gpu).expect("parameter sweep");
    let sweep_cell = std::cell::RefCell::new(&mut sweep);
    let mut arms: Vec<Arm<'_>> = LaunchParameterSweep::SIZES
        .iter()
        .enumerate()
        .map(|(index, (size, first, words))| -> Arm<'_> {
            let sweep_cell = &sweep_cell;
            (
                format!("{size} B block, {words} words read from byte {first}"),
                Box::new(move || sweep_cell.borrow_mut().launch_sync(index).expect("sweep")),
            )
        })
        .collect();
    let ns = rotated_minimum(&mut arms, rounds, calls);
    println!("\nlaunch + sync against kernel parameter bytes (+ 8), µs, minimum of {rounds} rotated rounds × {calls} calls:");
    for ((name, _), t) in arms.iter().zip(&ns) {
        println!("{name:>44} {:>9.2}", t / 1e3);
    }
    drop(arms);
    let mut anatomy = EpilogueAnatomy::new(gpu).expect("epilogue anatomy");
    let names = anatomy.names();
    let anatomy_cell = std::cell::RefCell::new(&mut anatomy);
    let mut arms: Vec<Arm<'_>> = names
        .iter()
        .enumerate()
        .map(|(index, name)| -> Arm<'_> {
            let anatomy_cell = &anatomy_cell;
            (
                name.to_string(),
                Box::new(move || {
                    anatomy_cell
                        .borrow_mut()
                        .launch_sync(index)
                        .expect("anatomy")
                }),
            )
        })
        .collect();
    let ns = rotated_minimum(&mut arms, rounds, calls);
    println!("\none-thread kernels, launch + sync, µs:");
    for ((name, _), t) in arms.iter().zip(&ns) {
        println!("{name:>40} {:>9.2}", t / 1e3);
    }
    drop(arms);
    for buffers in [9u32, 17] {
        let program = host_cost_fixture(buffers, chain_for_nodes(64));
        let reads = (buffers - 1) as usize;
        let mut floor = RawFloor::new(gpu, &program, [1, 1, 1]).expect("raw floor");
        let floor = std::cell::RefCell::new(&mut floor);
        let stamps = FLAG_START_STAMP | FLAG_END_STAMP;
        let variant = |flags: u32, count: usize| -> Box<dyn FnMut() -> u64 + '_> {
            let floor = &floor;
            Box::new(move || {
                floor
                    .borrow_mut()
                    .launch_result_abi_flags_sync(flags, count)
                    .expect("floor")
            })
        };
        let mut arms: Vec<Arm<'_>> = vec![
            floor_arm("plain kernel: launch + sync", &floor),
            ("result ABI: counting only".into(), variant(0, 0)),
            ("result ABI: + stamps".into(), variant(stamps, 0)),
            ("result ABI: + 1 range".into(), variant(stamps, 1)),
            (
                format!("result ABI: + {reads} ranges"),
                variant(stamps, reads),
            ),
        ];
        let ns = rotated_minimum(&mut arms, rounds, calls);
        println!(
            "\nresult-ABI anatomy, (buffers {buffers}, nodes {}), µs:",
            program.node_count()
        );
        for ((name, _), t) in arms.iter().zip(&ns) {
            println!("{name:>32} {:>9.2}", t / 1e3);
        }
        drop(arms);
        // The launch call and the synchronize timed apart (medians of 2,000).
        let split = |launch: &mut dyn FnMut()| -> (f64, f64) {
            let mut launches = Vec::with_capacity(2000);
            let mut waits = Vec::with_capacity(2000);
            for _ in 0..2000 {
                let t0 = Instant::now();
                launch();
                let t1 = Instant::now();
                floor.borrow().synchronize().expect("sync");
                waits.push(t1.elapsed().as_nanos() as f64);
                launches.push((t1 - t0).as_nanos() as f64);
            }
            launches.sort_by(f64::total_cmp);
            waits.sort_by(f64::total_cmp);
            (launches[1000] / 1e3, waits[1000] / 1e3)
        };
        let plain = split(&mut || floor.borrow_mut().launch_only().expect("launch"));
        let counting = split(&mut || {
            floor
                .borrow_mut()
                .launch_result_abi_flags(0, 0)
                .expect("launch")
        });
        let full = split(&mut || {
            floor
                .borrow_mut()
                .launch_result_abi_flags(stamps, reads)
                .expect("launch")
        });
        for (name, (l, w)) in [
            ("plain", plain),
            ("result ABI counting only", counting),
            ("result ABI full", full),
        ] {
            println!("{name:>32}: launch call {l:.2} µs, synchronize {w:.2} µs (medians)");
        }
    }
}

/// Per-call nanoseconds of `calls` single calls of `arm`: the minimum, p50, p99 and
/// p99.9 (the tail a user of one request at a time sees).
fn percentiles(calls: usize, mut arm: impl FnMut() -> u64) -> [f64; 4] {
    let mut samples = Vec::with_capacity(calls);
    let mut sink = 0u64;
    for _ in 0..calls {
        let start = Instant::now();
        sink ^= arm();
        samples.push(start.elapsed().as_nanos() as f64);
    }
    std::hint::black_box(sink);
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    [samples[0], at(0.5), at(0.99), at(0.999)]
}

/// Where single lane requests' time goes, medians of `calls` (µs): the host before
/// the doorbell, each server phase from its `%globaltimer` stamps, what the stamps do
/// not cover of the host's wait (the doorbell's and the result words' trips over
/// PCIe, the host's looks), and the host after every word arrived (the delivery). The
/// server's publish fence follows the result words, so no phase holds it.
fn lane_phases(calls: usize, mut run: impl FnMut() -> Timings) {
    let mut rows: Vec<(&str, Vec<u64>)> = [
        "host before the doorbell (enqueue)",
        "server: record + prologue",
        "server: workgroups",
        "server: readback copy (flagged words)",
        "wait not stamped: doorbell + result word trips",
        "host after every word arrived (delivery)",
        "whole request (wall)",
    ]
    .into_iter()
    .map(|name| (name, Vec::with_capacity(calls)))
    .collect();
    for _ in 0..calls {
        let timings = run();
        let stamps = timings.lane_stamps.unwrap_or_default();
        let served = timings.kernel_stamps_ns;
        let figures = [
            timings.enqueue_ns,
            stamps.setup_ns,
            stamps.workgroups_ns,
            stamps.readback_ns,
            timings.wait_ns.saturating_sub(served),
            timings
                .wall_ns
                .saturating_sub(timings.enqueue_ns + timings.wait_ns),
            timings.wall_ns,
        ];
        for ((_, samples), figure) in rows.iter_mut().zip(figures) {
            samples.push(figure);
        }
    }
    println!("where a lane request (spin) goes, medians of {calls} single requests, µs:");
    print_medians(rows);
}

/// Where a lane chain of two requests goes: medians over `calls` chains of each
/// request's host figures (from its own submit) and server stamps; the second
/// request's wait covers the first's service, so what neither server stamps is the
/// doorbells' and result words' trips and the server's turn between the two.
fn chain_phases(calls: usize, mut chain: impl FnMut() -> (Timings, Timings)) {
    let mut rows: Vec<(&str, Vec<u64>)> = [
        "first: submit (enqueue)",
        "second: submit (enqueue)",
        "second: host wait",
        "first: server (setup + workgroups + readback)",
        "second: server (setup + workgroups + readback)",
        "first: server setup (record + prologue)",
        "second: server setup (record + prologue)",
        "of the second's wait, not stamped by either server",
        "first: wall (its submit to its delivery, after the second's)",
        "second: wall (its submit to its delivery)",
    ]
    .into_iter()
    .map(|name| (name, Vec::with_capacity(calls)))
    .collect();
    for _ in 0..calls {
        let (first, second) = chain();
        let figures = [
            first.enqueue_ns,
            second.enqueue_ns,
            second.wait_ns,
            first.kernel_stamps_ns,
            second.kernel_stamps_ns,
            first.lane_stamps.unwrap_or_default().setup_ns,
            second.lane_stamps.unwrap_or_default().setup_ns,
            second
                .wait_ns
                .saturating_sub(first.kernel_stamps_ns + second.kernel_stamps_ns),
            first.wall_ns,
            second.wall_ns,
        ];
        for ((_, samples), figure) in rows.iter_mut().zip(figures) {
            samples.push(figure);
        }
    }
    println!("where a lane chain of two goes, medians of {calls} chains, µs:");
    print_medians(rows);
}

/// One line per row: its name and the median of its samples in µs.
fn print_medians(rows: Vec<(&str, Vec<u64>)>) {
    for (name, mut samples) in rows {
        samples.sort_unstable();
        let median = samples.get(samples.len() / 2).copied().unwrap_or(0);
        println!("{name:<58} {:>9.2}", median as f64 / 1e3);
    }
}

/// The numbers listed in the environment variable `name` (comma-separated), or
/// `default` where it is not set: the doorbell-polling warps (`VYRE_BENCH_LANE_POLLERS`,
/// default none and two) and memory candidates (`VYRE_BENCH_LANE_CANDIDATES`, default
/// one: no choice) of the lanes the lane tables compare with the default's, one at a
/// time, after the default's.
fn compared(name: &str, default: &[u32]) -> Vec<u32> {
    match std::env::var(name) {
        Ok(list) => list
            .split(',')
            .filter_map(|number| number.trim().parse().ok())
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// A lane of `kernel` waiting in `wait` mode.
fn lane_of(gpu: &CudaBackend, kernel: &vyre_cuda::backend::Kernel, wait: WaitMode) -> Lane {
    gpu.lane(&[kernel], LaneOptions::new().wait(wait))
        .expect("build a lane")
}

/// One fixture shape through a lane against launch + sync, in the same rotated
/// rounds: the lane's request (outputs and `run_into`), its waiting modes, and the
/// latency distribution of single requests. Each lane is built after every module
/// load of the shape (a module load may wait for an idle device) and measured alone.
fn lane_table(gpu: &CudaBackend, buffers: u32, nodes: u32) {
    let program = host_cost_fixture(buffers, chain_for_nodes(nodes));
    let handles = resident_inputs(gpu, &program);
    let reads = (buffers - 1) as usize;
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).expect("compile");
    let bindings = on(&handles);
    let request = Dispatch::new(&kernel, &bindings).config(&config);
    // The same work with nothing read back: what the readback adds (the flagged words
    // of the outputs in the result area, their delivery).
    let unread = request.readback(&ReadbackPolicy::None);
    let mut floor = RawFloor::new(gpu, &program, [1, 1, 1]).expect("raw floor");
    gpu.run(request).expect("warm the eager path");
    let (rounds, calls) = if quick() { (5, 100) } else { (9, 400) };
    let label = format!("(buffers {buffers}, nodes {})", program.node_count());
    println!("\nlane {label}, {reads} outputs of 16 B, minimum of {rounds} rotated rounds × {calls} calls:");
    println!("{:<58} {:>9} {:>13}", "", "µs", "/launch+sync");
    let mut lane_ratio = f64::NAN;
    for (mode, wait) in [
        ("spin", WaitMode::Spin),
        (
            "spin then yield (20 µs)",
            WaitMode::SpinThenYield(std::time::Duration::from_micros(20)),
        ),
        (
            "sleep (50 µs)",
            WaitMode::Sleep(std::time::Duration::from_micros(50)),
        ),
    ] {
        let lane = lane_of(gpu, &kernel, wait);
        let mut out_buffers = vec![[0u8; 16]; reads];
        let floor_cell = std::cell::RefCell::new(&mut floor);
        let mut arms: Vec<Arm<'_>> = vec![
            floor_arm("floor: launch + sync", &floor_cell),
            (
                format!("lane run, wait: {mode}"),
                Box::new(|| first_byte(&lane.run(request).expect("lane"))),
            ),
        ];
        if matches!(wait, WaitMode::Spin) {
            arms.push((
                format!("floor: launch + {reads} async copies + sync"),
                Box::new(|| {
                    floor_cell
                        .borrow_mut()
                        .launch_async_reads_sync(reads)
                        .expect("floor")
                }),
            ));
            arms.push((
                "run (kernel, outputs): launch + sync path".into(),
                Box::new(|| first_byte(&gpu.run(request).expect("dispatch"))),
            ));
            arms.push((
                "lane run, nothing read back".into(),
                Box::new(|| lane.run(unread).expect("lane").timings.kernel_stamps_ns),
            ));
            arms.push((
                "lane run_into (caller buffers)".into(),
                Box::new(|| {
                    let mut outs: Vec<&mut [u8]> =
                        out_buffers.iter_mut().map(|b| b.as_mut_slice()).collect();
                    lane.run_into(request, &mut outs)
                        .expect("lane")
                        .kernel_stamps_ns
                }),
            ));
        }
        let ns = rotated_minimum(&mut arms, rounds, calls);
        for ((name, _), &t) in arms.iter().zip(&ns) {
            println!("{name:<58} {:>9.2} {:>13.3}", t / 1e3, t / ns[0]);
        }
        if matches!(wait, WaitMode::Spin) {
            println!(
                "{:<58} {:>9}",
                "the default lane's memory: candidate chosen, of",
                format!(
                    "{} of {}",
                    lane.memory_placement(),
                    lane.options().memory_candidates
                )
            );
            lane_ratio = ns[1] / ns[0];
            drop(arms);
            let samples = if quick() { 2_000 } else { 20_000 };
            let sync = percentiles(samples, || floor.launch_sync().expect("floor"));
            let served = percentiles(samples, || first_byte(&lane.run(request).expect("lane")));
            println!("single calls, {samples} each, µs:            min      p50      p99    p99.9");
            for (name, figures) in [("floor: launch + sync", sync), ("lane run (spin)", served)] {
                println!(
                    "{name:<38} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                    figures[0] / 1e3,
                    figures[1] / 1e3,
                    figures[2] / 1e3,
                    figures[3] / 1e3
                );
            }
            lane_phases(samples, || lane.run(request).expect("lane").timings);
        }
    }
    // Lanes with other numbers of doorbell-polling warps or of memory candidates, one
    // at a time (building a lane loads a module, which must not happen while another
    // lane runs), each in rotated rounds with the floor.
    let others = compared("VYRE_BENCH_LANE_POLLERS", &[0, 2])
        .into_iter()
        .map(|warps| LaneOptions::new().poller_warps(warps))
        .chain(
            compared("VYRE_BENCH_LANE_CANDIDATES", &[1])
                .into_iter()
                .map(|candidates| LaneOptions::new().memory_candidates(candidates)),
        );
    for options in others {
        let lane = gpu.lane(&[&kernel], options).expect("build a lane");
        let floor_cell = std::cell::RefCell::new(&mut floor);
        let mut arms: Vec<Arm<'_>> = vec![
            floor_arm("floor: launch + sync", &floor_cell),
            (
                format!(
                    "lane run (spin), {} poller warps, memory {} of {}",
                    lane.poller_warps(),
                    lane.memory_placement(),
                    options.memory_candidates
                ),
                Box::new(|| first_byte(&lane.run(request).expect("lane"))),
            ),
        ];
        let ns = rotated_minimum(&mut arms, rounds, calls);
        let (name, _) = &arms[1];
        println!("{name:<58} {:>9.2} {:>13.3}", ns[1] / 1e3, ns[1] / ns[0]);
    }
    let verdict = if lane_ratio <= 0.35 {
        "met (moonshot met)"
    } else if lane_ratio <= 0.45 {
        "met"
    } else {
        "MISSED"
    };
    println!(
        "target lane ≤ 0.45 × launch+sync (moonshot ≤ 0.35) {label}: {lane_ratio:.3} {verdict}"
    );
}

/// A chain of two dependent requests (the second reads what the first writes) through
/// a lane against the same chain eager (submitted back to back with `after`, waited
/// for once), every output of both read back.
fn lane_chain(gpu: &CudaBackend) {
    let program = host_cost_fixture(9, chain_for_nodes(64));
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).expect("compile");
    let first = resident_inputs(gpu, &program);
    let second = resident_inputs(gpu, &program);
    // The second request's `in` is the first's `out`: a true dependency.
    let first_bindings = on(&first);
    let mut second_bindings = on(&second);
    second_bindings[0] = Binding::from(&first[1]);
    let a = Dispatch::new(&kernel, &first_bindings).config(&config);
    let b = Dispatch::new(&kernel, &second_bindings).config(&config);
    let mut floor = RawFloor::new(gpu, &program, [1, 1, 1]).expect("raw floor");
    let eager = || {
        let pending_a = gpu.submit(a).expect("submit");
        let pending_b = gpu.submit(b.after(&pending_a)).expect("submit");
        let done = first_byte(&pending_b.wait().expect("wait"));
        done ^ first_byte(&pending_a.wait().expect("wait"))
    };
    eager();
    let lane = lane_of(gpu, &kernel, WaitMode::Spin);
    let on_lane = || {
        let pending_a = lane.submit(a).expect("submit");
        let pending_b = lane.submit(b).expect("submit");
        let done = first_byte(&pending_b.wait().expect("wait"));
        done ^ first_byte(&pending_a.wait().expect("wait"))
    };
    let (rounds, calls) = if quick() { (5, 100) } else { (9, 400) };
    let floor_cell = std::cell::RefCell::new(&mut floor);
    let mut arms: Vec<Arm<'_>> = vec![
        floor_arm("floor: launch + sync", &floor_cell),
        (
            "chain of 2, eager (submit, submit after, wait)".into(),
            Box::new(eager),
        ),
        (
            "chain of 2, lane (submit, submit, wait)".into(),
            Box::new(on_lane),
        ),
    ];
    let ns = rotated_minimum(&mut arms, rounds, calls);
    println!("\nchain of two dependent requests (9, 62), minimum of {rounds} rotated rounds × {calls} calls:");
    for ((name, _), &t) in arms.iter().zip(&ns) {
        println!(
            "{name:<58} {:>9.2} µs {:>8.3} × launch+sync",
            t / 1e3,
            t / ns[0]
        );
    }
    drop(arms);
    let samples = if quick() { 2_000 } else { 20_000 };
    let eager_tail = percentiles(samples, eager);
    let lane_tail = percentiles(samples, on_lane);
    println!("single chains, {samples} each, µs:            min      p50      p99    p99.9");
    for (name, figures) in [("chain eager", eager_tail), ("chain lane", lane_tail)] {
        println!(
            "{name:<38} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            figures[0] / 1e3,
            figures[1] / 1e3,
            figures[2] / 1e3,
            figures[3] / 1e3
        );
    }
    chain_phases(samples, || {
        let pending_a = lane.submit(a).expect("submit");
        let pending_b = lane.submit(b).expect("submit");
        let second = pending_b.wait().expect("wait").timings;
        (pending_a.wait().expect("wait").timings, second)
    });
    let ratio = ns[2] / ns[1];
    println!(
        "target lane chain ≤ 0.5 × eager chain: {ratio:.3} {}",
        if ratio <= 0.5 { "met" } else { "MISSED" }
    );
}

fn main() {
    let gpu = match CudaBackend::acquire() {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("no CUDA device ({e}): the dispatch bench needs one; nothing measured");
            return;
        }
    };
    println!(
        "device: {} (sm_{}), driver {}",
        gpu.caps().name,
        gpu.caps().ptx_target_sm(),
        gpu.caps().driver_version
    );
    if std::env::var_os("VYRE_BENCH_LANES_ONLY").is_some() {
        for (buffers, nodes) in [(9, 64), (17, 64), (9, 16384)] {
            lane_table(&gpu, buffers, nodes);
        }
        lane_chain(&gpu);
        return;
    }
    graph_updates(&gpu);
    if std::env::var_os("VYRE_BENCH_GRAPH_UPDATES_ONLY").is_some() {
        return;
    }
    launch_anatomy(&gpu);
    let mut untimed = Vec::new();
    for (buffers, nodes) in [(9, 64), (9, 16384), (17, 64), (2, 64)] {
        untimed.push(floors_table(&gpu, buffers, nodes));
    }
    let flat = untimed[2] / untimed[3];
    println!(
        "target untimed (17, 64) ≤ 1.15 × (2, 64): {flat:.3} {}",
        if flat <= 1.15 { "met" } else { "MISSED" }
    );
    for (buffers, nodes) in [(2, 64), (17, 64)] {
        host_phases(&gpu, buffers, nodes);
    }
    readback_sweep(&gpu);
    for (buffers, nodes) in [(9, 64), (17, 64), (9, 16384)] {
        lane_table(&gpu, buffers, nodes);
    }
    lane_chain(&gpu);
    if std::env::var_os("VYRE_BENCH_FLOORS_ONLY").is_some() {
        return;
    }
    let mut report = Report::new("bench_dispatch");
    let config = DispatchConfig::linear(1);
    let shapes = [
        Shape {
            buffers: 9,
            nodes: 64,
        },
        Shape {
            buffers: 9,
            nodes: 1024,
        },
        Shape {
            buffers: 9,
            nodes: 16384,
        },
        Shape {
            buffers: 2,
            nodes: 64,
        },
        Shape {
            buffers: 17,
            nodes: 64,
        },
    ];
    let mut lines = Vec::new();
    for shape in &shapes {
        let program = host_cost_fixture(shape.buffers, chain_for_nodes(shape.nodes));
        let handles = resident_inputs(&gpu, &program);
        let bindings = on(&handles);
        let reads = (shape.buffers - 1) as usize;
        let mut floor = RawFloor::new(&gpu, &program, [1, 1, 1]).expect("raw floor");
        run_program(&gpu, &program, &bindings, &config);
        let name_a = format!("floor b{} n{}", shape.buffers, program.node_count());
        let name_b = format!("dispatch b{} n{}", shape.buffers, program.node_count());
        let timed_dispatch = || {
            let t = run_program(&gpu, &program, &bindings, &config);
            first_byte(&t) ^ t.timings.wall_ns
        };
        pair(
            &mut report,
            &mut lines,
            (&name_a, &mut || {
                floor.launch_async_reads_sync(reads).expect("floor")
            }),
            (&name_b, &mut { timed_dispatch }),
        );
        // The same dispatch against the timed floor (the raw driver plus the event
        // records and elapsed-time queries that device timing needs).
        let name_t = format!("timed floor b{} n{}", shape.buffers, program.node_count());
        pair(
            &mut report,
            &mut lines,
            (&name_t, &mut || {
                floor
                    .launch_timed_async_reads_sync(reads)
                    .expect("timed floor")
            }),
            (&name_b, &mut { timed_dispatch }),
        );
        // Untimed resident dispatch (no events: the hot path) against the plain floor.
        let name_u = format!(
            "untimed dispatch b{} n{}",
            shape.buffers,
            program.node_count()
        );
        pair(
            &mut report,
            &mut lines,
            (&name_a, &mut || {
                floor.launch_async_reads_sync(reads).expect("floor")
            }),
            (&name_u, &mut || {
                first_byte(&run_program(&gpu, &program, &bindings, &config))
            }),
        );
        if shape.buffers == 9 && shape.nodes == 64 {
            // The same work as one graph replay: the kernel and every readback in
            // one graph launch, one synchronize.
            let kernel = gpu.compile(&program, &config).expect("compile");
            let mut graph = gpu
                .record(|rec| {
                    rec.dispatch(Dispatch::new(&kernel, &bindings).config(&config))?;
                    for h in &handles[1..] {
                        rec.read_back(h, 0, 16)?;
                    }
                    Ok(())
                })
                .expect("record");
            pair(
                &mut report,
                &mut lines,
                (&name_a, &mut || {
                    floor.launch_async_reads_sync(reads).expect("floor")
                }),
                ("graph replay b9 n62", &mut || {
                    graph.replay().expect("replay").wall_ns
                }),
            );
            // Where the host time goes: the probe's phase table.
            host_phases(&gpu, shape.buffers, shape.nodes);
        }
        drop(floor);
    }

    // Pipelining: a loop of encodes with two in flight on separate lanes
    // (submit N+1, then wait for N) against the blocking loop (submit, wait), per
    // encode, same kernel and bindings shape. Target: throughput ≥ 1.6× blocking,
    // i.e. a ratio ≤ 0.625. Each in-flight slot has its own buffers.
    {
        let program = host_cost_fixture(9, chain_for_nodes(64));
        let kernel = gpu.compile(&program, &config).expect("compile");
        let sets = [
            resident_inputs(&gpu, &program),
            resident_inputs(&gpu, &program),
        ];
        let bindings: Vec<Vec<Binding>> = sets.iter().map(|set| on(set)).collect();
        let request = |slot: usize| Dispatch::new(&kernel, &bindings[slot]).config(&config);
        // Hot-path check: submit + wait against the blocking run of the same request.
        pair(
            &mut report,
            &mut lines,
            ("run (kernel) b9 n64 [dispatch_kernel]", &mut || {
                first_byte(&gpu.run(request(0)).expect("dispatch"))
            }),
            ("submit+wait b9 n64", &mut || {
                first_byte(
                    &gpu.submit(request(0))
                        .expect("submit")
                        .wait()
                        .expect("wait"),
                )
            }),
        );
        let mut queue: std::collections::VecDeque<PendingDispatch> =
            std::collections::VecDeque::new();
        let mut turn = 0usize;
        let pipelined = pair(
            &mut report,
            &mut lines,
            ("blocking loop b9 n64", &mut || {
                first_byte(
                    &gpu.submit(request(0))
                        .expect("submit")
                        .wait()
                        .expect("wait"),
                )
            }),
            ("two in flight b9 n64", &mut || {
                if queue.len() == 2 {
                    let oldest = queue.pop_front().expect("two queued");
                    let slot = turn % 2;
                    let done = first_byte(&oldest.wait().expect("wait"));
                    queue.push_back(gpu.submit(request(slot)).expect("submit"));
                    turn += 1;
                    done
                } else {
                    queue.push_back(gpu.submit(request(turn % 2)).expect("submit"));
                    turn += 1;
                    0
                }
            }),
        );
        drop(queue);
        if let Some(p) = pipelined {
            println!(
                "pipelining: two in flight run at {:.2}× the blocking loop's throughput (target ≥ 1.6)",
                1.0 / p.median_ratio
            );
        }
    }

    // Flatness: the largest program against the smallest, both full dispatches.
    let small = host_cost_fixture(9, 0);
    let large = host_cost_fixture(9, chain_for_nodes(16384));
    let small_handles = resident_inputs(&gpu, &small);
    let large_handles = resident_inputs(&gpu, &large);
    let (small_bindings, large_bindings) = (on(&small_handles), on(&large_handles));
    run_program(&gpu, &small, &small_bindings, &config);
    run_program(&gpu, &large, &large_bindings, &config);
    let arm = |program: &Program, bindings: &[Binding<'_>]| {
        run_program(&gpu, program, bindings, &config)
            .timings
            .wall_ns
    };
    let small_name = format!("dispatch n{}", small.node_count());
    let large_name = format!("dispatch n{}", large.node_count());
    if let Some(p) = pair(
        &mut report,
        &mut lines,
        (&small_name, &mut || arm(&small, &small_bindings)),
        (&large_name, &mut || arm(&large, &large_bindings)),
    ) {
        println!(
            "flatness: {} nodes vs {} nodes: ratio {:.3} (target ≤ 1.05), {}",
            large.node_count(),
            small.node_count(),
            p.median_ratio,
            if p.publishable() {
                "publishable"
            } else {
                "not publishable"
            }
        );
    }

    // Cold first dispatch of a new 4,096-node program (distinct literals, so neither
    // our caches nor the driver's JIT cache can serve it).
    let mut cold_ms = Vec::new();
    for seed in 0..5u32 {
        let unique = std::process::id().wrapping_mul(7919).wrapping_add(seed);
        let program = host_cost_fixture_salted(2, chain_for_nodes(4096), Some(unique));
        let input = [0u8; 16];
        let start = Instant::now();
        gpu.run(
            Dispatch::program(&program, &[Binding::Host(&input), Binding::Host(&input)])
                .config(&config),
        )
        .expect("cold dispatch");
        cold_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    cold_ms.sort_by(|a, b| a.total_cmp(b));
    println!(
        "cold first dispatch of a new {}-node program (lower + emit + JIT + launch): min {:.1} ms, median {:.1} ms (target ≤ 100 ms)",
        host_cost_fixture(9, chain_for_nodes(4096)).node_count(),
        cold_ms[0],
        cold_ms[cold_ms.len() / 2]
    );
    if let Err(e) = report.finish() {
        println!("could not write the report files: {e}");
    }
    let _ = lines;
}
