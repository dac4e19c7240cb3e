//! Host cost of the two per-program steps a PTX cache miss pays for: the content
//! digest (the cache key's root) and PTX emission, on the host-cost fixture shape
//! (`acc0 = in[0]; accK = acc(K-1) + K; out[0] = acc_last`) at three sizes.
//!
//! Why: both steps must be O(n) with a small constant, or a tokenizer's first
//! dispatch of a large program stalls. Targets: digest ≤ 100 ns per IR node, emission
//! ≤ 1 µs per IR node. Prints ns per node (the minimum of five timed regions, each
//! calibrated to last about 0.2 s); it asserts nothing about time.
//!
//! Run with `cargo bench --bench compile`.

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::fixtures::host_cost_fixture;
use vyre_cuda::host_cost::{Cell, CellOptions, Report};
use vyre_cuda::CodegenOptions;

fn main() {
    let options = CodegenOptions::default();
    // The harness's estimators (warm 3, calibrate, 5 regions, minimum with its spread); regions
    // of 0.2 s instead of 0.5 s keep the whole bench under a minute.
    let cell_options = CellOptions::with_targets(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_millis(50),
    );
    let mut report = Report::new("bench_compile");
    let mut rows = Vec::new();
    for links in [0u32, 1023, 16383] {
        let program = host_cost_fixture(3, links);
        let nodes = program.node_count();
        // Each unit digests a fresh value (the memo of a clone would be a hit).
        let digest = Cell::measure(&format!("digest n{nodes}"), &cell_options, |n| {
            let mut fold = 0u64;
            for _ in 0..n {
                let fresh =
                    program.with_entry(program.buffers_shared().clone(), program.entry().clone());
                fold = fold.wrapping_add(fresh.digest().0[0] as u64);
            }
            fold
        });
        let mut bytes = 0;
        let emit = Cell::measure(&format!("emit n{nodes}"), &cell_options, |n| {
            let mut fold = 0u64;
            for _ in 0..n {
                let ptx =
                    program_to_ptx(&program, &options, 90, 32).expect("the fixture generates");
                bytes = ptx.len();
                fold = fold.wrapping_add(ptx.len() as u64);
            }
            fold
        });
        match (digest, emit) {
            (Ok(digest), Ok(emit)) => {
                rows.push(format!(
                    "{nodes:>8} {:>14.1} {:>14.1} {bytes:>10}   digest {} ±{:.1}%, emit {} ±{:.1}%",
                    digest.minimum_ns_per_unit / nodes as f64,
                    emit.minimum_ns_per_unit / nodes as f64,
                    digest.verdict.label(),
                    digest.relative_std_dev.unwrap_or(f64::NAN) * 100.0,
                    emit.verdict.label(),
                    emit.relative_std_dev.unwrap_or(f64::NAN) * 100.0,
                ));
                report.add_cell(digest);
                report.add_cell(emit);
            }
            (digest, emit) => {
                for (name, result) in [("digest", digest), ("emit", emit)] {
                    if let Err(e) = result {
                        report.add_failure(name, &e);
                    }
                }
            }
        }
    }
    println!(
        "{:>8} {:>14} {:>14} {:>10}",
        "nodes", "digest ns/node", "emit ns/node", "PTX bytes"
    );
    for row in rows {
        println!("{row}");
    }
    println!("targets: digest <= 100 ns/node, emission <= 1000 ns/node (minimum of 5 regions)");
    if let Err(e) = report.finish() {
        println!("could not write the report files: {e}");
    }
}
