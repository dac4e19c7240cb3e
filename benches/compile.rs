//! Host cost of the two per-program steps a PTX cache miss pays for: the content
//! digest (the cache key's root) and PTX emission, on the §6 fixture shape
//! (`acc0 = in[0]; accK = acc(K-1) + K; out[0] = acc_last`) at three sizes.
//!
//! Why: both steps must be O(n) with a small constant, or a tokenizer's first
//! dispatch of a large program stalls. Targets: digest ≤ 100 ns per IR node, emission
//! ≤ 1 µs per IR node. Prints ns per node (the minimum of five timed regions, each
//! calibrated to last about 0.2 s); it asserts nothing about time.
//!
//! Run with `cargo bench --bench compile`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::ir::{Access, BufferCount, ElemType, Expr, Program};
use vyre_cuda::CodegenOptions;

/// The §6 fixture with `links` statements in the accumulator chain.
fn acc_chain(links: u32) -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "in",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "out",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "scratch0",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|b| {
            let mut acc = b.let_("acc0", Expr::load("in", 0u32));
            for k in 1..links {
                acc = b.let_(format!("acc{k}"), acc + k);
            }
            b.store("out", 0u32, acc);
        })
        .build()
}

/// Minimum seconds per call of `work` over five calibrated regions.
fn time_per_call(mut work: impl FnMut() -> u64) -> f64 {
    for _ in 0..3 {
        black_box(work());
    }
    let mut repetitions: u64 = 1;
    loop {
        let started = Instant::now();
        for _ in 0..repetitions {
            black_box(work());
        }
        if started.elapsed() >= Duration::from_millis(50) {
            break;
        }
        repetitions *= 4;
    }
    let probe = {
        let started = Instant::now();
        for _ in 0..repetitions {
            black_box(work());
        }
        started.elapsed().as_secs_f64() / repetitions as f64
    };
    let repetitions = ((0.2 / probe.max(1e-9)) as u64).max(1);
    (0..5)
        .map(|_| {
            let started = Instant::now();
            let mut fold = 0u64;
            for _ in 0..repetitions {
                fold = fold.wrapping_add(work());
            }
            black_box(fold);
            started.elapsed().as_secs_f64() / repetitions as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let options = CodegenOptions::default();
    println!(
        "{:>8} {:>8} {:>14} {:>14} {:>10}",
        "links", "nodes", "digest ns/node", "emit ns/node", "PTX bytes"
    );
    for links in [1u32, 1024, 16384] {
        let program = acc_chain(links);
        let nodes = program.node_count() as f64;
        let digest = time_per_call(|| {
            // A fresh value each time, so the memoised digest is really recomputed.
            let fresh =
                program.with_entry(program.buffers_shared().clone(), program.entry().clone());
            fresh.digest().0[0] as u64
        });
        let mut bytes = 0;
        let emit = time_per_call(|| {
            let ptx = program_to_ptx(&program, &options, 90, 32).expect("fixture generates");
            bytes = ptx.len();
            ptx.len() as u64
        });
        println!(
            "{links:>8} {nodes:>8} {:>14.1} {:>14.1} {bytes:>10}",
            digest * 1e9 / nodes,
            emit * 1e9 / nodes
        );
    }
    println!("targets: digest <= 100 ns/node, emission <= 1000 ns/node");
}
