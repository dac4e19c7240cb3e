//! What the dispatch phase probe costs:
//!
//! - **probe on vs off**: a paired ABBA comparison (`host_cost::Paired`) of warm resident
//!   dispatches of the host-cost fixture (9 buffers, 64 nodes), switching the probe in-process
//!   with `probe::override_enabled` held for each arm's whole region. Target: on/off
//!   ratio ≤ 1.05. While on, the probe lines are captured in memory
//!   (`probe::capture_lines`) rather than written to stderr, so the figure is the probe's
//!   own cost (clock reads, accumulation, formatting), not the terminal's; both arms run
//!   inside a capture so the only difference between them is the switch.
//! - **one disabled probe point**: a cell of 1,000 `probe::mark()` +
//!   `probe::charge(Phase::Stage, mark)` pairs per unit with the probe forced off, divided
//!   by 1,000. Target: ≤ 2 ns. The same cell with the probe forced on (outside any
//!   dispatch: two clock reads, nothing accumulated) is printed beside it as the contrast
//!   that shows the cell measures the switch.
//!
//! Targets are printed, never failed on. The process exits non-zero only when something
//! is broken: a device error, a wrong fixture result, a cell optimised away, a probe that
//! prints nothing while on or something while off. Without a CUDA device it prints
//! "no CUDA device: skipping the dispatch pair" and still runs the probe-point cells.
//!
//! Run: `cargo bench --bench probe_overhead` (GPU machine: `.gpu/bin/bench-probe_overhead`);
//! `VYRE_BENCH_QUICK=1` shortens the regions. Files go to
//! `vyre_cuda::host_cost::report_dir()` as `probe_overhead.*.json`.

use std::cell::{Cell as StdCell, RefCell};
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Duration;

use vyre_cuda::backend::{Binding, CudaBackend, DeviceBuffer, Dispatch};
use vyre_cuda::fixtures::{chain_for_nodes, host_cost_fixture, host_cost_fixture_expected};
use vyre_cuda::host_cost::{Cell, CellOptions, PairOptions, Paired, Report};
use vyre_cuda::ir::Program;
use vyre_cuda::probe::{self, Phase};
use vyre_cuda::DispatchConfig;

/// Probe points per unit of the probe-point cells.
const POINTS: u64 = 1_000;
/// Target for the on/off ratio of a warm dispatch.
const RATIO_TARGET: f64 = 1.05;
/// Target for one disabled probe point, ns.
const POINT_TARGET_NS: f64 = 2.0;
/// `in[0]` of the fixture.
const INPUT: u32 = 5;

fn quick() -> bool {
    std::env::var_os("VYRE_BENCH_QUICK").is_some()
}

fn cell_options() -> CellOptions {
    if quick() {
        CellOptions::with_targets(Duration::from_millis(50), Duration::from_millis(10))
    } else {
        CellOptions::with_targets(Duration::from_millis(200), Duration::from_millis(20))
    }
}

fn pair_options() -> PairOptions {
    if quick() {
        PairOptions::with_targets(Duration::from_millis(20), Duration::from_millis(5), 10)
    } else {
        PairOptions::with_targets(Duration::from_millis(60), Duration::from_millis(15), 12)
    }
}

/// `POINTS` probe points per unit with the switch in whatever state the caller forced.
fn probe_points(iterations: u64) -> u64 {
    let mut live = 0u64;
    for _ in 0..iterations {
        for _ in 0..POINTS {
            let mark = black_box(probe::mark());
            live += u64::from(mark.is_some());
            probe::charge(Phase::Stage, mark);
        }
    }
    live ^ iterations
}

/// Measures the probe-point cell with the probe forced to `on`; returns ns per point.
fn point_cell(report: &mut Report, broken: &mut Vec<String>, on: bool) -> Option<f64> {
    let name = format!(
        "{POINTS} probe points, probe {}",
        if on { "on" } else { "off" }
    );
    let _switch = probe::override_enabled(Some(on));
    let live = probe::mark().is_some();
    if live != on {
        broken.push(format!(
            "probe::override_enabled(Some({on})) left probe::mark() returning {}",
            if live { "Some" } else { "None" }
        ));
    }
    match Cell::measure(&name, &cell_options(), probe_points) {
        Ok(cell) => Some(report.add_cell(cell).minimum_ns_per_unit / POINTS as f64),
        Err(error) => {
            broken.push(format!("{name}: {error}"));
            report.add_failure(&name, &error);
            None
        }
    }
}

/// Device buffers of `program` (declared sizes), `in[0] = INPUT`.
fn upload(backend: &CudaBackend, program: &Program) -> Result<Vec<DeviceBuffer>, String> {
    let mut buffers = Vec::new();
    for decl in program.global_buffers() {
        let bytes = decl
            .static_size_bytes()
            .ok_or_else(|| format!("fixture buffer '{}' has no static size", decl.name))?;
        let mut data = vec![0u8; bytes as usize];
        if &*decl.name == "in" {
            if let Some(word) = data.first_chunk_mut::<4>() {
                *word = INPUT.to_le_bytes();
            }
        }
        let buffer = backend
            .buffer_from(&data)
            .map_err(|e| format!("allocating and filling a fixture buffer: {e}"))?;
        buffers.push(buffer);
    }
    Ok(buffers)
}

fn first_word(outputs: &vyre_cuda::backend::Outputs) -> u64 {
    outputs
        .item(0)
        .and_then(|output| output.first_chunk::<4>())
        .map_or(0, |b| u64::from(u32::from_le_bytes(*b)))
}

/// What the dispatch pair found.
struct PairSummary {
    ratio: f64,
    delta_ns: f64,
    publishable: bool,
    reasons: Vec<String>,
}

/// The on/off pair; `Err` only when something is broken.
fn dispatch_pair(backend: &CudaBackend, report: &mut Report) -> Result<PairSummary, String> {
    let chain = chain_for_nodes(64);
    let program = host_cost_fixture(9, chain);
    let config = DispatchConfig::linear(1);
    let buffers = upload(backend, &program)?;
    let bindings: Vec<Binding> = buffers.iter().map(Binding::from).collect();
    let request = Dispatch::program(&program, &bindings).config(&config);
    let expected = u64::from(host_cost_fixture_expected(INPUT, chain));
    {
        let _off = probe::override_enabled(Some(false));
        let timed = backend
            .run(request)
            .map_err(|e| format!("warm dispatch: {e}"))?;
        if first_word(&timed.outputs) != expected {
            return Err(format!(
                "the fixture returned out[0] = {}, expected {expected}: the dispatch path is \
                 broken",
                first_word(&timed.outputs)
            ));
        }
    }
    let error: RefCell<Option<String>> = RefCell::new(None);
    let lines_on = StdCell::new(0u64);
    let dispatches_on = StdCell::new(0u64);
    let lines_off = StdCell::new(0u64);
    let first_line: RefCell<Option<String>> = RefCell::new(None);
    let arm = |iterations: u64, on: bool| -> u64 {
        if error.borrow().is_some() {
            return 0;
        }
        let _switch = probe::override_enabled(Some(on));
        let ((digest, done), lines) = probe::capture_lines(|| {
            let mut digest = 0u64;
            let mut done = 0u64;
            for _ in 0..iterations {
                match backend.run(request) {
                    Ok(timed) => {
                        digest = digest.rotate_left(5) ^ first_word(&timed.outputs);
                        done += 1;
                    }
                    Err(e) => {
                        *error.borrow_mut() = Some(format!("dispatch (probe on: {on}): {e}"));
                        break;
                    }
                }
            }
            (digest, done)
        });
        if on {
            lines_on.set(lines_on.get() + lines.len() as u64);
            dispatches_on.set(dispatches_on.get() + done);
            if first_line.borrow().is_none() {
                *first_line.borrow_mut() = lines.into_iter().next();
            }
        } else {
            lines_off.set(lines_off.get() + lines.len() as u64);
        }
        digest
    };
    let result = Paired::compare(
        "probe off",
        |n| arm(n, false),
        "probe on",
        |n| arm(n, true),
        &pair_options(),
    );
    drop(bindings);
    drop(buffers);
    if let Some(error) = error.into_inner() {
        return Err(error);
    }
    let paired = result.map_err(|e| format!("probe on vs probe off: {e}"))?;
    if lines_off.get() != 0 {
        return Err(format!(
            "the probe was forced off but {} lines were printed",
            lines_off.get()
        ));
    }
    if lines_on.get() != dispatches_on.get() {
        return Err(format!(
            "the probe was forced on for {} dispatches but printed {} lines (one per dispatch \
             expected)",
            dispatches_on.get(),
            lines_on.get()
        ));
    }
    match first_line.into_inner() {
        Some(line) if probe::parse_line(&line).is_some() => {}
        Some(line) => return Err(format!("a probe line does not parse: {line}")),
        None => return Err("the probe was forced on but printed no line".to_string()),
    }
    let summary = PairSummary {
        ratio: paired.median_ratio,
        delta_ns: paired.median_delta_ns_per_unit,
        publishable: paired.publishable(),
        reasons: paired
            .not_publishable
            .iter()
            .map(|r| r.to_string())
            .collect(),
    };
    report.add_paired(paired);
    Ok(summary)
}

fn main() -> ExitCode {
    println!(
        "probe_overhead: {} (VYRE_BENCH_QUICK {})",
        if quick() {
            "cells 5 x 50 ms, pair 10 ABBA rounds x 20 ms"
        } else {
            "cells 5 x 200 ms, pair 12 ABBA rounds x 60 ms"
        },
        if quick() { "set" } else { "unset" }
    );
    let mut report = Report::new("probe_overhead");
    let mut broken = Vec::new();
    let off_point = point_cell(&mut report, &mut broken, false);
    let on_point = point_cell(&mut report, &mut broken, true);

    let pair = match CudaBackend::acquire() {
        Err(error) => {
            println!("no CUDA device: skipping the dispatch pair ({error})");
            None
        }
        Ok(backend) => {
            println!(
                "device: {} (sm_{}), driver {}",
                backend.caps().name,
                backend.caps().ptx_target_sm(),
                backend.caps().driver_version
            );
            match dispatch_pair(&backend, &mut report) {
                Ok(summary) => Some(summary),
                Err(error) => {
                    broken.push(error);
                    None
                }
            }
        }
    };

    // A write failure is printed by `finish`; it does not make the measurement broken.
    let _ = report.finish();
    println!(
        "\n{:<46} {:>12} {:>10}  status",
        "figure", "value", "target"
    );
    let status = |met: bool| if met { "met" } else { "NOT met" };
    if let Some(ns) = off_point {
        println!(
            "{:<46} {:>9.3} ns {:>7.1} ns  {}",
            "one disabled probe point (mark + charge)",
            ns,
            POINT_TARGET_NS,
            status(ns <= POINT_TARGET_NS)
        );
    }
    if let Some(ns) = on_point {
        println!(
            "{:<46} {:>9.3} ns {:>10}  contrast (probe on, no open dispatch)",
            "one enabled probe point (mark + charge)", ns, "-"
        );
    }
    if let Some(pair) = &pair {
        println!(
            "{:<46} {:>12.4} {:>10.2}  {}{}",
            "warm dispatch, probe on / off (median ratio)",
            pair.ratio,
            RATIO_TARGET,
            status(pair.ratio <= RATIO_TARGET),
            if pair.publishable {
                String::new()
            } else {
                format!(" (unpublishable: {})", pair.reasons.join("; "))
            }
        );
        println!(
            "{:<46} {:>9.1} ns {:>10}",
            "probe cost per dispatch (median delta)", pair.delta_ns, "-"
        );
    }
    if broken.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("probe_overhead: broken:\n  {}", broken.join("\n  "));
        ExitCode::FAILURE
    }
}
