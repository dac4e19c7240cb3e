//! `dispatch_resident_timed` of the §6 fixture against the raw-driver floor,
//! measured in the same run (SPEC §9, issue 3):
//!
//! - ratio to the floor at (buffers, IR nodes) = (9, 64), (9, 1,024), (9, 16,384),
//!   (2, 64), (17, 64), every writable buffer read back (target ≤ 1.15);
//! - flatness: the 16,384-node dispatch against the 1-node dispatch (target ≤ 1.05);
//! - cold first dispatch of a new 4,096-node program: lower + emit + driver JIT +
//!   launch (target ≤ 100 ms);
//! - pipelining: submit + wait against `dispatch_kernel` (no hot-path regression),
//!   and a loop with two submissions in flight against the blocking loop (target:
//!   ≥ 1.6× its throughput).
//!
//! Each comparison is a paired ABBA run of host_cost (`Paired::compare`): the floor is
//! a prebuilt `cuLaunchKernel` + one 16-byte async copy per output + one synchronize
//! on one stream (`backend::floor::RawFloor`). Run: `cargo bench --bench dispatch`
//! (on the GPU machine: `.gpu/bin/bench-dispatch`). Set `VYRE_BENCH_QUICK=1` for
//! shorter regions.

use std::time::{Duration, Instant};

use vyre_cuda::backend::floor::RawFloor;
use vyre_cuda::backend::{Binding, CudaBackend, PendingDispatch, ResidentBuffer};
use vyre_cuda::fixtures::{chain_for_nodes, host_cost_fixture, host_cost_fixture_salted};
use vyre_cuda::host_cost::{PairOptions, Paired, Report};
use vyre_cuda::ir::Program;
use vyre_cuda::DispatchConfig;

struct Shape {
    buffers: u32,
    nodes: u32,
}

fn resident_inputs(gpu: &CudaBackend, program: &Program) -> Vec<ResidentBuffer> {
    program
        .global_buffers()
        .iter()
        .map(|b| {
            let bytes = b.static_size_bytes().unwrap_or(16);
            let h = gpu.allocate_resident(bytes).expect("allocate resident");
            gpu.upload_resident(&h, &vec![1u8; bytes as usize])
                .expect("upload");
            h
        })
        .collect()
}

fn options() -> PairOptions {
    if std::env::var_os("VYRE_BENCH_QUICK").is_some() {
        PairOptions::with_targets(Duration::from_millis(20), Duration::from_millis(5), 10)
    } else {
        PairOptions::with_targets(Duration::from_millis(60), Duration::from_millis(15), 12)
    }
}

fn row(p: &Paired) -> String {
    let verdict = if p.publishable() {
        "publishable".to_string()
    } else {
        format!("not publishable: {:?}", p.not_publishable)
    };
    format!(
        "{:<34} floor {:>7.2} µs  dispatch {:>7.2} µs  ratio {:.3} (spread {:.1} %)  {}",
        p.name,
        p.minimum_ns_per_unit_a / 1e3,
        p.minimum_ns_per_unit_b / 1e3,
        p.median_ratio,
        p.ratio_spread.unwrap_or(f64::NAN) * 100.0,
        verdict
    )
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
        &options(),
    ) {
        Ok(p) => {
            let line = row(&p);
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
        let reads = (shape.buffers - 1) as usize;
        let mut floor = RawFloor::new(&gpu, &program, [1, 1, 1]).expect("raw floor");
        gpu.dispatch_resident_timed(&program, &handles, &config)
            .expect("warm dispatch");
        let name_a = format!("floor b{} n{}", shape.buffers, program.node_count());
        let name_b = format!("dispatch b{} n{}", shape.buffers, program.node_count());
        let timed_dispatch = || {
            let t = gpu
                .dispatch_resident_timed(&program, &handles, &config)
                .expect("dispatch");
            t.outputs[0][0] as u64 ^ t.wall_ns
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
                gpu.dispatch_resident(&program, &handles, &config)
                    .expect("dispatch")[0][0] as u64
            }),
        );
        if shape.buffers == 9 && shape.nodes == 64 {
            // The same work as one graph replay (§7): the kernel and every readback in
            // one graph launch, one synchronize.
            let kernel = gpu.compile(&program, &config).expect("compile");
            let mut graph = gpu
                .record(|rec| {
                    rec.dispatch(&kernel, &handles, &config)?;
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
            // Where the host time goes: the probe's phase table over 2,000 warm dispatches.
            let (_, probe_lines) = {
                let _on = vyre_cuda::probe::override_enabled(Some(true));
                vyre_cuda::probe::capture_lines(|| {
                    for _ in 0..2000 {
                        gpu.dispatch_resident_timed(&program, &handles, &config)
                            .expect("dispatch");
                    }
                })
            };
            let warm = probe_lines[probe_lines.len().min(500)..].join("\n");
            let summary = vyre_cuda::probe::report::summarize_log(&warm);
            println!("{}", vyre_cuda::probe::report::render_table(&summary));
        }
        drop(floor);
        for h in handles {
            gpu.free_resident(h).expect("free");
        }
    }

    // Pipelining (issue 11): a loop of encodes with two in flight on separate lanes
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
        let bindings: Vec<Vec<Binding>> = sets
            .iter()
            .map(|set| set.iter().map(|h| Binding::Resident(*h)).collect())
            .collect();
        // Hot-path check: submit + wait against the blocking dispatch_kernel.
        pair(
            &mut report,
            &mut lines,
            ("dispatch_kernel b9 n64", &mut || {
                gpu.dispatch_kernel(&kernel, &bindings[0], &config)
                    .expect("dispatch")
                    .outputs[0][0] as u64
            }),
            ("submit+wait b9 n64", &mut || {
                gpu.submit_kernel(&kernel, &bindings[0], &config)
                    .expect("submit")
                    .wait()
                    .expect("wait")
                    .outputs[0][0] as u64
            }),
        );
        let mut queue: std::collections::VecDeque<PendingDispatch> =
            std::collections::VecDeque::new();
        let mut turn = 0usize;
        let pipelined = pair(
            &mut report,
            &mut lines,
            ("blocking loop b9 n64", &mut || {
                gpu.submit_kernel(&kernel, &bindings[0], &config)
                    .expect("submit")
                    .wait()
                    .expect("wait")
                    .outputs[0][0] as u64
            }),
            ("two in flight b9 n64", &mut || {
                if queue.len() == 2 {
                    let oldest = queue.pop_front().expect("two queued");
                    let slot = turn % 2;
                    let done = oldest.wait().expect("wait").outputs[0][0] as u64;
                    queue.push_back(
                        gpu.submit_kernel(&kernel, &bindings[slot], &config)
                            .expect("submit"),
                    );
                    turn += 1;
                    done
                } else {
                    queue.push_back(
                        gpu.submit_kernel(&kernel, &bindings[turn % 2], &config)
                            .expect("submit"),
                    );
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
        for set in sets {
            for h in set {
                gpu.free_resident(h).expect("free");
            }
        }
    }

    // Flatness: the largest program against the smallest, both full dispatches.
    let small = host_cost_fixture(9, 0);
    let large = host_cost_fixture(9, chain_for_nodes(16384));
    let small_handles = resident_inputs(&gpu, &small);
    let large_handles = resident_inputs(&gpu, &large);
    gpu.dispatch_resident_timed(&small, &small_handles, &config)
        .expect("warm");
    gpu.dispatch_resident_timed(&large, &large_handles, &config)
        .expect("warm");
    let arm = |program: &Program, handles: &[ResidentBuffer]| {
        gpu.dispatch_resident_timed(program, handles, &config)
            .expect("dispatch")
            .wall_ns
    };
    let small_name = format!("dispatch n{}", small.node_count());
    let large_name = format!("dispatch n{}", large.node_count());
    if let Some(p) = pair(
        &mut report,
        &mut lines,
        (&small_name, &mut || arm(&small, &small_handles)),
        (&large_name, &mut || arm(&large, &large_handles)),
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
        gpu.dispatch(&program, &[&input, &input], &config)
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
