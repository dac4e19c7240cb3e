//! The phase probe on a real device (§5): a child process started with
//! `VYRE_CUDA_DISPATCH_PHASE_PROBE=1` dispatches, and its stderr lines must parse
//! and attribute the wall time.

mod support;

use std::process::Command;

use vyre_cuda::fixtures::host_cost_fixture;
use vyre_cuda::probe::{self, parse_line, Phase};
use vyre_cuda::DispatchConfig;

const CHILD_MARKER: &str = "VYRE_CUDA_GPU_PROBE_CHILD";

/// The child's body: warm resident dispatches of the §6 fixture (9 buffers, 64 nodes).
fn child_dispatches() {
    let gpu = support::backend();
    let program = host_cost_fixture(9, 64);
    let handles: Vec<_> = program
        .global_buffers()
        .iter()
        .map(|b| {
            let h = gpu
                .allocate_resident(b.static_size_bytes().unwrap())
                .unwrap();
            gpu.upload_resident(&h, &[0u8; 16]).unwrap();
            h
        })
        .collect();
    let config = DispatchConfig::linear(1);
    for _ in 0..300 {
        gpu.dispatch_resident_timed(&program, &handles, &config)
            .unwrap();
    }
}

/// Locks out a probe whose phases do not cover the dispatch, or device windows in
/// the wrong order: in a child process with the variable set, warm resident
/// dispatches print parseable lines whose nine phases add up to ≥ 90 % of wall
/// (median), with kernel_ns ≤ device_window_ns on every line.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_probe_lines_attribute_warm_resident_dispatches() {
    if std::env::var_os(CHILD_MARKER).is_some() {
        child_dispatches();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args([
            "--exact",
            "gpu_probe_lines_attribute_warm_resident_dispatches",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_MARKER, "1")
        .env(probe::ENV_VAR, "1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let records: Vec<_> = stderr.lines().filter_map(parse_line).collect();
    assert!(
        records.len() >= 300,
        "expected ≥ 300 probe lines, got {}",
        records.len()
    );
    let warm = &records[records.len() - 200..];
    let mut shares: Vec<f64> = warm
        .iter()
        .map(|r| r.named_host_ns() as f64 / r.wall_ns.max(1) as f64)
        .collect();
    shares.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = shares[shares.len() / 2];
    eprintln!("median attributed share of wall: {:.1} %", median * 100.0);
    assert!(
        median >= 0.90,
        "phases cover only {:.1} % of wall",
        median * 100.0
    );
    for r in warm {
        assert!(r.kernel_ns <= r.device_window_ns, "{r:?}");
        assert_eq!(
            r.named_host_ns(),
            Phase::ALL.iter().map(|&p| r.phase_ns(p)).sum::<u64>()
        );
        assert_eq!(r.nodes, program_nodes());
        assert_eq!(r.buffers, 9);
        assert_eq!(r.ptx_cache_hits, 1, "warm dispatches hit the PTX cache");
        assert_eq!(r.sub_ptx_digest_ns, 0, "a cache hit computes no digest");
        assert_eq!(r.sub_ptx_vsa_ns, 0, "a cache hit walks no program");
    }
}

fn program_nodes() -> u64 {
    host_cost_fixture(9, 64).node_count()
}

/// Locks out the report merging two kernels of the same shape (issue 12 item 5): the
/// fixture and its salted twin have the same (nodes, buffers) but different content;
/// their probe lines carry different, non-zero `program` identities, each program's
/// identity is the same on every dispatch, and the report gives two groups.
/// Negative control: the identities of the unsalted program agree with each other.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_probe_lines_tell_same_shape_programs_apart() {
    use vyre_cuda::fixtures::host_cost_fixture_salted;
    let gpu = support::backend();
    let plain = host_cost_fixture(9, 64);
    let salted = host_cost_fixture_salted(9, 64, Some(0x5a5a));
    assert_eq!(plain.node_count(), salted.node_count());
    let handles: Vec<_> = plain
        .global_buffers()
        .iter()
        .map(|b| {
            let h = gpu
                .allocate_resident(b.static_size_bytes().unwrap())
                .unwrap();
            gpu.upload_resident(&h, &[0u8; 16]).unwrap();
            h
        })
        .collect();
    let config = DispatchConfig::linear(1);
    let _on = probe::override_enabled(Some(true));
    let ((), lines) = probe::capture_lines(|| {
        for _ in 0..3 {
            gpu.dispatch_resident_timed(&plain, &handles, &config)
                .unwrap();
            gpu.dispatch_resident_timed(&salted, &handles, &config)
                .unwrap();
        }
    });
    let records: Vec<_> = lines.iter().filter_map(|line| parse_line(line)).collect();
    assert_eq!(records.len(), 6, "{lines:?}");
    let plain_ids: Vec<u64> = records.iter().step_by(2).map(|r| r.program).collect();
    let salted_ids: Vec<u64> = records
        .iter()
        .skip(1)
        .step_by(2)
        .map(|r| r.program)
        .collect();
    assert!(
        plain_ids.iter().all(|&id| id != 0 && id == plain_ids[0]),
        "{plain_ids:x?}"
    );
    assert!(
        salted_ids.iter().all(|&id| id != 0 && id == salted_ids[0]),
        "{salted_ids:x?}"
    );
    assert_ne!(plain_ids[0], salted_ids[0]);
    let summary = probe::report::summarize_log(&lines.join("\n"));
    assert_eq!(summary.groups.len(), 2, "{summary:?}");
    assert!(summary.groups.iter().all(|group| group.dispatches == 3));
    for handle in handles {
        gpu.free_resident(handle).unwrap();
    }
}
