//! GPT-2's pre-tokenizer split of 256 KiB: eager encode and graph encode
//! against the raw-driver floor measured in the same run, plus the
//! plain medians the targets are stated in (H200: ≤ 100 µs eager, ≤ 60 µs as
//! one CUDA graph) and the regex oracle's MB/s on the same text.
//!
//! Each comparison is a paired ABBA run of host_cost (`Paired::compare`); the floor
//! is one prebuilt `cuLaunchKernel` + one 16-byte async copy + one synchronize
//! (`backend::floor::RawFloor`), so the ratio says how many "floors" an encode
//! costs. Every encode's piece starts are checked against the oracle once before
//! timing. Run: `cargo bench --bench pretokenize` (on the GPU machine:
//! `.gpu/bin/bench-pretokenize`); `VYRE_BENCH_QUICK=1` for shorter regions.

#[path = "../tests/oracle/mod.rs"]
mod oracle;

#[path = "../../benches/common/mod.rs"]
mod common;
#[path = "../tests/support/driver_calls.rs"]
mod driver_calls;

use std::time::Instant;

use driver_calls::{describe_driver_calls, encode_driver_calls};
use vyre_cuda::backend::floor::RawFloor;
use vyre_cuda::backend::CudaBackend;
use vyre_cuda::fixtures::host_cost_fixture;
use vyre_cuda::host_cost::{Paired, Report};
use vyre_tokenizer::pretokenize::pipeline::CudaPipeline;
use vyre_tokenizer::pretokenize::programs::{self, build, programs};
use vyre_tokenizer::pretokenize::text::{generate, Shape};
use vyre_tokenizer::pretokenize::Geometry;

const TEXT_BYTES: usize = 262_144;
const MEDIAN_ENCODES: usize = 1000;

fn median_us(mut samples: Vec<u64>) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2] as f64 / 1e3
}

fn main() {
    let gpu = match CudaBackend::acquire() {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("no CUDA device ({e}): the pretokenize bench needs one; nothing measured");
            return;
        }
    };
    println!(
        "device: {} (sm_{}), driver {}",
        gpu.caps().name,
        gpu.caps().ptx_target_sm(),
        gpu.caps().driver_version
    );
    let mut report = Report::new("bench_pretokenize");
    let floor_program = host_cost_fixture(2, 0);
    let mut floor = RawFloor::new(&gpu, &floor_program, [1, 1, 1]).expect("raw floor");
    let programs = programs();
    let regex = oracle::Oracle::new();
    let mut pipeline = CudaPipeline::new(&gpu, &programs, TEXT_BYTES).expect("pipeline");
    for shape in Shape::ALL {
        let text = generate(shape, TEXT_BYTES, 42);
        let start = Instant::now();
        let expected = regex.starts(&text);
        let oracle_ns = start.elapsed().as_nanos() as f64;
        check_against_oracle(&mut pipeline, &text, &expected, &shape.to_string());
        let calls = encode_driver_calls(&mut pipeline, &text).expect("encodes");
        println!("  {shape}: {}", describe_driver_calls(&calls));
        let (steps, graph_kernels) = kernel_medians(&mut pipeline, &text, MEDIAN_ENCODES / 4);
        println!(
            "  {shape}: kernel medians (µs, the kernels' own stamps): eager {steps}; graph, first start to last end {graph_kernels:.1}",
        );
        for (label, graph) in [("eager", false), ("graph", true)] {
            // An encode's wall time (also what the paired arm folds, so the work
            // cannot be optimised away). Folding anything else into it (the piece
            // count, say) would corrupt the medians below.
            let mut encode = || {
                if graph {
                    pipeline.encode_graph(&text).expect("graph encode").wall_ns
                } else {
                    pipeline.encode(&text).expect("encode").wall_ns
                }
            };
            let walls: Vec<u64> = (0..MEDIAN_ENCODES).map(|_| encode()).collect();
            let name = format!("{shape} {label} encode");
            match Paired::compare(
                "floor",
                |n| {
                    (0..n).fold(0u64, |acc, _| {
                        acc ^ floor.launch_async_reads_sync(1).expect("floor")
                    })
                },
                &name,
                |n| (0..n).fold(0u64, |acc, _| acc ^ encode()),
                &common::options(),
            ) {
                Ok(p) => {
                    println!("{}", common::row(&p, "encode", 28, 2));
                    report.add_paired(p);
                }
                Err(e) => {
                    println!("{name}: {e}");
                    report.add_failure(&name, &e);
                }
            }
            let median = median_us(walls);
            println!(
                "  {shape} {label}: median encode {median:.1} µs over {MEDIAN_ENCODES} ({:.0} MB/s; target ≤ {} µs)",
                TEXT_BYTES as f64 / median,
                if graph { 60 } else { 100 }
            );
        }
        println!(
            "  {shape}: {} pieces; regex oracle (fancy-regex, one CPU thread) {:.1} ms ({:.1} MB/s)",
            expected.len(),
            oracle_ns / 1e6,
            TEXT_BYTES as f64 * 1e3 / oracle_ns
        );
    }
    geometry_sweep(&gpu, &regex);
    if let Err(e) = report.finish() {
        println!("could not write the report files: {e}");
    }
}

/// The same encode at other bytes per thread (the default is
/// `pretokenize::BYTES_PER_THREAD`): plain medians, kernel medians per step and
/// of the graph, so the default can be chosen from this machine's figures.
fn geometry_sweep(gpu: &CudaBackend, regex: &oracle::Oracle) {
    const SWEEP_ENCODES: usize = 300;
    let text = generate(Shape::Prose, TEXT_BYTES, 42);
    let expected = regex.starts(&text);
    println!(
        "geometry sweep ({} prose, {SWEEP_ENCODES} encodes each, medians):",
        TEXT_BYTES
    );
    for bytes_per_thread in [1, 2, 4, 8] {
        let geometry = Geometry {
            bytes_per_thread,
            ..Geometry::default()
        };
        let programs = build(geometry).expect("valid geometry");
        let mut pipeline = CudaPipeline::new(gpu, &programs, TEXT_BYTES).expect("pipeline");
        check_against_oracle(&mut pipeline, &text, &expected, &format!("{geometry:?}"));
        let eager = (0..SWEEP_ENCODES)
            .map(|_| pipeline.encode(&text).expect("encode").wall_ns)
            .collect();
        let graph = (0..SWEEP_ENCODES)
            .map(|_| pipeline.encode_graph(&text).expect("graph encode").wall_ns)
            .collect();
        let (steps, graph_kernels) = kernel_medians(&mut pipeline, &text, SWEEP_ENCODES);
        println!(
            "  {bytes_per_thread} bytes/thread ({} blocks): eager {:.1} µs, graph {:.1} µs; kernels µs: {}; graph kernels {:.1}",
            geometry.blocks_for(TEXT_BYTES),
            median_us(eager),
            median_us(graph),
            steps,
            graph_kernels
        );
    }
}

/// Medians of the kernels' own stamps over `encodes` timed eager encodes (per
/// step, as "name µs, ...") and graph replays (first start to last end, µs).
fn kernel_medians(pipeline: &mut CudaPipeline, text: &[u8], encodes: usize) -> (String, f64) {
    let timed: Vec<_> = (0..encodes)
        .map(|_| pipeline.encode_timed(text).expect("timed encode"))
        .collect();
    let steps: Vec<String> = programs::STEPS
        .iter()
        .enumerate()
        .map(|(index, step)| {
            let kernel = timed
                .iter()
                .map(|t| t.steps[index].kernel_stamps_ns)
                .collect();
            format!("{} {:.1}", step.name, median_us(kernel))
        })
        .collect();
    let graph = (0..encodes)
        .map(|_| {
            pipeline
                .encode_graph(text)
                .expect("graph encode")
                .replay
                .kernel_stamps_ns
        })
        .collect();
    (steps.join(", "), median_us(graph))
}

/// One eager and one graph encode, each checked against the oracle's starts.
fn check_against_oracle(pipeline: &mut CudaPipeline, text: &[u8], expected: &[u32], what: &str) {
    pipeline.encode(text).expect("encode");
    assert_eq!(pipeline.piece_starts(), expected, "{what}: eager vs oracle");
    pipeline.encode_graph(text).expect("graph encode");
    assert_eq!(pipeline.piece_starts(), expected, "{what}: graph vs oracle");
}
