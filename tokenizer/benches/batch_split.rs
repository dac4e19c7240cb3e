//! The batch split (`pretokenize::batch`) of 256 KiB on the GPU, per pattern:
//! median wall time of an eager split (the steps submitted back to back, one
//! wait) and of a graph replay, the kernels' own times per step, and for GPT-2
//! the single-document `CudaPipeline` on the same text in the same run (the
//! target: ≤ 60 µs as a graph), so whether GPT-2's pipeline can
//! move onto the batch programs is read off one table. Also the raw floor
//! (one prebuilt launch, one 16-byte read, one synchronize) measured in the
//! same run. Every split is checked against the CPU splitter first.
//!
//! Run: `cargo bench -p vyre-tokenizer --bench batch_split` (on the GPU machine);
//! `VYRE_BENCH_QUICK=1` for fewer runs.

use vyre_cuda::backend::floor::RawFloor;
use vyre_cuda::backend::{AnyBackend, CudaBackend};
use vyre_cuda::fixtures::host_cost_fixture;
use vyre_tokenizer::pretokenize::batch::runner::BatchSplitter;
use vyre_tokenizer::pretokenize::batch::SplitPrograms;
use vyre_tokenizer::pretokenize::pattern::{piece_starts, Pattern};
use vyre_tokenizer::pretokenize::pipeline::CudaPipeline;
use vyre_tokenizer::pretokenize::programs::programs;
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};

const TEXT_BYTES: usize = 262_144;

fn median_us(mut samples: Vec<u64>) -> f64 {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or(0) as f64 / 1e3
}

fn main() {
    let gpu = match CudaBackend::acquire() {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("no CUDA device ({e}): the batch split bench needs one; nothing measured");
            return;
        }
    };
    let runs = if std::env::var_os("VYRE_BENCH_QUICK").is_some() {
        100
    } else {
        1000
    };
    println!(
        "device: {} (sm_{}), {runs} runs per median",
        gpu.caps().name,
        gpu.caps().ptx_target_sm()
    );
    let floor_program = host_cost_fixture(2, 0);
    let mut floor = RawFloor::new(&gpu, &floor_program, [1, 1, 1]).expect("raw floor");
    let floor_us = median_us(
        (0..runs)
            .map(|_| {
                let start = std::time::Instant::now();
                floor.launch_async_reads_sync(1).expect("floor");
                start.elapsed().as_nanos() as u64
            })
            .collect(),
    );
    println!("raw floor (launch + 16 B read + synchronize): {floor_us:.1} µs");
    let backend = AnyBackend::Cuda(gpu.clone());
    let mut single = CudaPipeline::new(&gpu, &programs(), TEXT_BYTES).expect("pipeline");
    for pattern in Pattern::ALL {
        let mut splitter =
            BatchSplitter::new(&backend, SplitPrograms::new(pattern)).expect("splitter");
        for shape in Shape::ALL {
            let text = generate(shape, TEXT_BYTES, 42);
            let one = [TEXT_BYTES as u32];
            let documents = documents_of(TEXT_BYTES, 42);
            for (label, ends) in [
                ("one document", &one[..]),
                ("1–16 KiB documents", &documents[..]),
            ] {
                let expected = expected(pattern, &text, ends);
                assert!(
                    splitter.split(&text, ends).expect("split") == expected,
                    "{pattern:?} {shape} eager"
                );
                assert!(
                    splitter.split_graph(&text, ends).expect("graph") == expected,
                    "{pattern:?} {shape} graph"
                );
                let mut eager_walls = Vec::new();
                let mut eager_kernels: Vec<Vec<u64>> =
                    vec![Vec::new(); splitter.programs().steps().len()];
                for _ in 0..runs {
                    let start = std::time::Instant::now();
                    splitter.split(&text, ends).expect("split");
                    eager_walls.push(start.elapsed().as_nanos() as u64);
                    for (step, timings) in splitter.timings().iter().enumerate() {
                        eager_kernels[step].push(timings.kernel_stamps_ns);
                    }
                }
                let mut graph_walls = Vec::new();
                let mut graph_kernels = Vec::new();
                for _ in 0..runs {
                    let start = std::time::Instant::now();
                    splitter.split_graph(&text, ends).expect("graph");
                    graph_walls.push(start.elapsed().as_nanos() as u64);
                    graph_kernels.push(splitter.timings()[0].kernel_stamps_ns);
                }
                let steps: Vec<String> = splitter
                    .programs()
                    .steps()
                    .iter()
                    .zip(eager_kernels)
                    .map(|(step, kernels)| format!("{} {:.1}", step.name, median_us(kernels)))
                    .collect();
                let graph = median_us(graph_walls);
                let eager = median_us(eager_walls);
                println!(
                    "{:6} {shape:5} {label:19} {:6} pieces: eager {:.1} µs ({:.2} × floor), graph {graph:.1} µs ({:.0} MB/s); kernels µs: {}; graph kernels {:.1}",
                    pattern.name(),
                    expected.len(),
                    eager,
                    eager / floor_us.max(1e-3),
                    TEXT_BYTES as f64 / graph,
                    steps.join(", "),
                    median_us(graph_kernels),
                );
            }
            if pattern == Pattern::Gpt2 {
                let expected = expected(pattern, &text, &[TEXT_BYTES as u32]);
                single.encode(&text).expect("encode");
                assert!(
                    single.piece_starts() == &expected[..],
                    "CudaPipeline {shape}"
                );
                let eager = (0..runs)
                    .map(|_| single.encode(&text).expect("encode").wall_ns)
                    .collect();
                let graph = (0..runs)
                    .map(|_| single.encode_graph(&text).expect("graph encode").wall_ns)
                    .collect();
                let kernels = (0..runs)
                    .map(|_| {
                        single
                            .encode_graph(&text)
                            .expect("graph encode")
                            .replay
                            .kernel_stamps_ns
                    })
                    .collect();
                println!(
                    "gpt2   {shape:5} CudaPipeline (single document, two dispatches): eager {:.1} µs, graph {:.1} µs; graph kernels {:.1} µs",
                    median_us(eager),
                    median_us(graph),
                    median_us(kernels)
                );
            }
        }
    }
}

/// Document ends cutting `bytes` into documents of 1 to 16 KiB.
fn documents_of(bytes: usize, seed: u64) -> Vec<u32> {
    let mut random = SplitMix64::new(seed);
    let mut ends = Vec::new();
    let mut end = 0;
    while end < bytes {
        end = (end + 1024 + random.below(15 * 1024) as usize).min(bytes);
        ends.push(end as u32);
    }
    ends
}

/// Each document's CPU split, as offsets into the batch.
fn expected(pattern: Pattern, text: &[u8], ends: &[u32]) -> Vec<u32> {
    let mut starts = Vec::new();
    let mut start = 0usize;
    for &end in ends {
        let end = end as usize;
        starts.extend(
            piece_starts(pattern, &text[start..end])
                .expect("CPU split")
                .into_iter()
                .map(|offset| offset + start as u32),
        );
        start = end;
    }
    starts
}
