//! The phase probe on a real device: a child process started with
//! `VYRE_CUDA_DISPATCH_PHASE_PROBE=1` dispatches, and its stderr lines must parse
//! and attribute the wall time.

mod support;

use std::process::Command;

use vyre_cuda::fixtures::host_cost_fixture;
use vyre_cuda::probe::{self, parse_line, Phase};
use vyre_cuda::DispatchConfig;

const CHILD_MARKER: &str = "VYRE_CUDA_GPU_PROBE_CHILD";

/// The child's body: warm dispatches of the measurement fixture (9 buffers, 64
/// nodes) over device buffers.
fn child_dispatches() {
    let gpu = support::backend();
    let program = host_cost_fixture(9, 64);
    let buffers: Vec<_> = program
        .global_buffers()
        .iter()
        .map(|b| gpu.buffer(b.static_size_bytes().unwrap()).unwrap())
        .collect();
    let config = DispatchConfig::linear(1);
    for _ in 0..300 {
        support::run_buffers(&gpu, &program, &buffers, &config).unwrap();
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

/// Locks out the report merging two kernels of the same shape: the
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
    let buffers: Vec<_> = plain
        .global_buffers()
        .iter()
        .map(|b| gpu.buffer(b.static_size_bytes().unwrap()).unwrap())
        .collect();
    let config = DispatchConfig::linear(1);
    let _on = probe::override_enabled(Some(true));
    let ((), lines) = probe::capture_lines(|| {
        for _ in 0..3 {
            support::run_buffers(&gpu, &plain, &buffers, &config).unwrap();
            support::run_buffers(&gpu, &salted, &buffers, &config).unwrap();
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
}

/// The CPU half of `gpu_probe_lines_tell_same_shape_programs_apart`, which failed on
/// the H200 with 262 vs 264 nodes: the salted fixture used to compute
/// `in[0] ^ salt` (two more nodes), so it was not "the same shape". Locks out a salt
/// that changes the tree: both programs have the same (nodes, buffers), different
/// digests, the salted output is the plain one plus the salt, and probe lines that
/// differ only in the program identity give two report groups of three.
/// Negative controls: the old `in[0] ^ salt` form has another node count, and lines
/// with one identity collapse into one group.
#[test]
fn salted_fixture_has_the_same_shape_and_other_content() {
    use vyre_cuda::fixtures::{host_cost_fixture_expected, host_cost_fixture_salted};
    use vyre_cuda::ir::{Access, BufferCount, ElemType, Expr, Program};
    let plain = host_cost_fixture(9, 64);
    let salted = host_cost_fixture_salted(9, 64, Some(0x5a5a));
    assert_eq!(plain.node_count(), salted.node_count());
    assert_eq!(plain.global_buffers().len(), salted.global_buffers().len());
    assert_ne!(plain.digest(), salted.digest());
    let inputs: Vec<Vec<u8>> = plain
        .global_buffers()
        .iter()
        .map(|b| {
            let mut bytes = vec![0u8; b.static_size_bytes().unwrap() as usize];
            bytes[..4].copy_from_slice(&7u32.to_le_bytes());
            bytes
        })
        .collect();
    let config = DispatchConfig::linear(1);
    let out_word = |program: &Program| {
        let outputs = support::reference(program, &inputs, &config);
        u32::from_le_bytes(outputs[0][..4].try_into().unwrap())
    };
    assert_eq!(out_word(&plain), host_cost_fixture_expected(7, 64));
    assert_eq!(
        out_word(&salted),
        host_cost_fixture_expected(7, 64).wrapping_add(0x5a5a)
    );

    // Negative control: the former salted form is a different shape.
    let old_salted = Program::builder([1, 1, 1])
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
        .body(|b| {
            let mut acc = b.let_("acc0", Expr::load("in", 0u32) ^ 0x5a5au32);
            for k in 1..=64u32 {
                acc = b.let_(format!("acc{k}"), acc + k);
            }
            b.store("out", 0u32, acc);
        })
        .build();
    let old_plain = host_cost_fixture(2, 64);
    assert_eq!(old_salted.node_count(), old_plain.node_count() + 2);

    // The report side: lines differing only in identity make two groups.
    let line = |program: &Program, identity: u64, seq: u64| {
        probe::format_line(&probe::DispatchRecord {
            seq,
            nodes: program.node_count(),
            buffers: program.global_buffers().len() as u64,
            bindings: program.global_buffers().len() as u64,
            fixpoint: 1,
            grid_blocks: 1,
            wall_ns: 1_000,
            program: identity,
            ..Default::default()
        })
    };
    let identity =
        |program: &Program| u64::from_le_bytes(program.digest().0[..8].try_into().unwrap());
    let mut lines = Vec::new();
    for round in 0..3 {
        lines.push(line(&plain, identity(&plain), 2 * round));
        lines.push(line(&salted, identity(&salted), 2 * round + 1));
    }
    let summary = probe::report::summarize_log(&lines.join("\n"));
    assert_eq!(summary.groups.len(), 2, "{summary:?}");
    assert!(summary.groups.iter().all(|group| group.dispatches == 3));
    let one_identity: Vec<String> = (0..6)
        .map(|seq| line(&plain, identity(&plain), seq))
        .collect();
    let collapsed = probe::report::summarize_log(&one_identity.join("\n"));
    assert_eq!(collapsed.groups.len(), 1, "{collapsed:?}");
}
