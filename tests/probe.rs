//! Tests of the dispatch phase probe and its report tool.
//!
//! Tests that switch the probe take [`probe::override_enabled`], which
//! serializes them across the test threads of this binary. The subprocess test
//! re-runs this test binary with `VYRE_CUDA_DISPATCH_PHASE_PROBE` set, so the
//! environment path (read once per process) is exercised without an override.

use std::cell::Cell;
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use vyre_cuda::probe::report::{
    classify_line, render_json, render_table, summarize, summarize_log, summarize_reader, LineKind,
    RowKind, MAX_LINE_BYTES,
};
use vyre_cuda::probe::{
    self, Count, DispatchRecord, DispatchTiming, LineError, Phase, Sink, SubPhase, LINE_KEYS,
    PHASE_COUNT,
};

/// The key list exactly as the README documents it.
const DOCUMENTED_KEYS: &str = "seq= nodes= ptx_bytes= buffers= bindings= fixpoint= \
grid_blocks= wall_ns= enqueue_ns= wait_ns= device_window_ns= kernel_ns= prepare_ns= \
ptx_ns= modkey_ns= stage_ns= resolve_ns= lease_ns= launch_ns= release_ns= \
readback_ns= sub_ptx_digest_ns= sub_ptx_vsa_ns= named_host_ns= unattributed_ns= \
ptx_cache_hits= ptx_cache_misses=";

/// Environment marker that turns a re-executed test into the child side.
const CHILD_MARKER: &str = "VYRE_CUDA_PROBE_TEST_CHILD";

/// The documented keys, then the fields appended after it (`program`, at the end so a
/// consumer that reads the documented order is not disturbed).
fn spec_keys() -> Vec<&'static str> {
    DOCUMENTED_KEYS
        .split_whitespace()
        .map(|key| key.trim_end_matches('='))
        .chain(["program"])
        .collect()
}

fn keys_of_line(line: &str) -> Vec<String> {
    line.split_whitespace()
        .skip(1)
        .map(|field| field.split('=').next().unwrap_or("").to_string())
        .collect()
}

fn first_duplicate<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = HashSet::new();
    names.into_iter().find(|name| !seen.insert(*name))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/probe")
        .join(name)
}

/// Runs one synthetic dispatch charging every phase and sub-phase with the
/// given nanoseconds (no clock involved) and returns its captured lines.
fn synthetic_dispatch(phase_ns: [u64; PHASE_COUNT], wall_ns: u64) -> Vec<String> {
    let ((), lines) = probe::capture_lines(|| {
        let dispatch = probe::begin_dispatch().expect("probe forced on");
        for phase in Phase::ALL {
            probe::add_phase_ns(phase, phase_ns[phase.index()]);
        }
        probe::add_sub_phase_ns(SubPhase::PtxDigest, 7);
        probe::add_sub_phase_ns(SubPhase::PtxVsa, 3);
        dispatch.finish(DispatchTiming {
            wall_ns,
            ..DispatchTiming::default()
        });
    });
    lines
}

/// Locks out a phase whose index falls outside the accumulator array, phases
/// listed out of order, and two phases (or keys) sharing a label.
#[test]
fn phase_indices_fit_the_accumulator_and_labels_are_distinct() {
    let record = DispatchRecord::default();
    assert_eq!(record.phases.len(), PHASE_COUNT);
    assert_eq!(Phase::ALL.len(), PHASE_COUNT);
    for (position, phase) in Phase::ALL.into_iter().enumerate() {
        assert_eq!(phase.index(), position, "{phase:?} out of order");
        assert!(phase.index() < record.phases.len());
    }
    for (position, sub) in SubPhase::ALL.into_iter().enumerate() {
        assert_eq!(sub.index(), position);
    }
    for (position, count) in Count::ALL.into_iter().enumerate() {
        assert_eq!(count.index(), position);
    }
    let labels = Phase::ALL
        .iter()
        .map(|p| p.label())
        .chain(SubPhase::ALL.iter().map(|s| s.label()));
    assert_eq!(first_duplicate(labels), None);
    assert_eq!(first_duplicate(LINE_KEYS), None);
    // Negative control: the duplicate check does catch a repeated label.
    let repeated = [Phase::Stage.label(), Phase::Launch.label(), "stage"];
    assert_eq!(first_duplicate(repeated), Some("stage"));
}

/// Locks out a line whose keys drift from the documented order (a consumer that
/// splits on position would misread every field after the drift).
#[test]
fn line_keys_follow_the_spec_order() {
    assert_eq!(LINE_KEYS.to_vec(), spec_keys());
    let line = probe::format_line(&DispatchRecord::default());
    assert!(line.starts_with("vyre-cuda-dispatch-phase seq=0 nodes=0 "));
    assert!(!line.ends_with('\n'));
    assert_eq!(keys_of_line(&line), spec_keys());
    // Negative control: swapping two keys makes the line unparseable.
    let swapped = line.replace("stage_ns=0 resolve_ns=0", "resolve_ns=0 stage_ns=0");
    assert_ne!(swapped, line);
    assert_eq!(probe::parse_line(&swapped), None);
}

/// Locks out a probe that records, counts or prints anything while off, or
/// that computes a count closure while off.
#[test]
fn disabled_records_nothing() {
    fn instrumented_dispatch(counted: &Cell<u32>) -> bool {
        let dispatch = probe::begin_dispatch();
        let began = dispatch.is_some();
        let mark = probe::mark();
        probe::charge(Phase::Prepare, mark);
        let value = probe::timed(Phase::Stage, || 41 + 1);
        assert_eq!(value, 42);
        probe::timed_sub(SubPhase::PtxDigest, || ());
        probe::count_with(Count::Nodes, || {
            counted.set(counted.get() + 1);
            64
        });
        probe::note_ptx_cache(true);
        probe::add_phase_ns(Phase::Launch, 5);
        if let Some(dispatch) = dispatch {
            dispatch.finish(DispatchTiming::default());
        }
        began
    }

    let counted = Cell::new(0);
    {
        let _off = probe::override_enabled(Some(false));
        assert!(!probe::enabled());
        assert!(probe::mark().is_none());
        let (began, lines) = probe::capture_lines(|| instrumented_dispatch(&counted));
        assert!(!began);
        assert!(lines.is_empty(), "off printed {lines:?}");
        assert_eq!(counted.get(), 0, "count closure ran while off");
    }
    // Negative control: the same dispatch with the probe on records one line.
    let _on = probe::override_enabled(Some(true));
    let (began, lines) = probe::capture_lines(|| instrumented_dispatch(&counted));
    assert!(began);
    assert_eq!(lines.len(), 1);
    assert_eq!(counted.get(), 1);
    let record = probe::parse_line(&lines[0]).expect("parseable");
    assert_eq!(record.nodes, 64);
    assert_eq!(record.ptx_cache_hits, 1);
    assert!(record.phase_ns(Phase::Launch) >= 5);
}

/// Locks out a named total that is anything but the plain sum of the nine
/// phases (sub-phases added in, or a phase left out), and an unattributed
/// figure that is not wall minus named.
#[test]
fn named_total_is_the_plain_sum_of_phases() {
    let _on = probe::override_enabled(Some(true));
    let phase_ns = [1, 20, 300, 4_000, 50_000, 600_000, 7_000_000, 80, 9];
    let lines = synthetic_dispatch(phase_ns, 10_000_000);
    assert_eq!(lines.len(), 1);
    let record = probe::parse_line(&lines[0]).expect("parseable");
    assert_eq!(record.phases, phase_ns);
    assert_eq!(record.named_host_ns(), 7_654_410);
    assert_eq!(record.unattributed_ns(), 10_000_000 - 7_654_410);
    assert_eq!((record.sub_ptx_digest_ns, record.sub_ptx_vsa_ns), (7, 3));
    assert!(lines[0].contains(" named_host_ns=7654410 unattributed_ns=2345590 "));
    // Negative control: a line whose named total includes the sub-phases
    // (7 + 3 more) is rejected as corrupt.
    let inflated = lines[0].replace("named_host_ns=7654410", "named_host_ns=7654420");
    assert_eq!(probe::parse_line(&inflated), None);
    // Phases over-covering the wall read 0 unattributed, never wrap.
    let over = synthetic_dispatch(phase_ns, 1_000);
    let over = probe::parse_line(&over[0]).expect("parseable");
    assert_eq!(over.unattributed_ns(), 0);
    assert_eq!(over.named_host_ns(), 7_654_410);
}

/// Locks out overflow panics (debug builds) or wraps when charges are huge.
#[test]
fn huge_values_saturate_instead_of_panicking() {
    let _on = probe::override_enabled(Some(true));
    let ((), lines) = probe::capture_lines(|| {
        let dispatch = probe::begin_dispatch().expect("on");
        for phase in Phase::ALL {
            probe::add_phase_ns(phase, u64::MAX);
            dispatch.add_phase_ns(phase, u64::MAX);
        }
        probe::add_sub_phase_ns(SubPhase::PtxVsa, u64::MAX);
        probe::add_sub_phase_ns(SubPhase::PtxVsa, u64::MAX);
        dispatch.set_count(Count::GridBlocks, u64::MAX);
        dispatch.finish(DispatchTiming {
            wall_ns: u64::MAX,
            enqueue_ns: u64::MAX,
            wait_ns: u64::MAX,
            device_window_ns: u64::MAX,
            kernel_ns: u64::MAX,
        });
    });
    let record = probe::parse_line(&lines[0]).expect("parseable");
    assert_eq!(record.phases, [u64::MAX; PHASE_COUNT]);
    assert_eq!(record.named_host_ns(), u64::MAX);
    assert_eq!(record.unattributed_ns(), 0);
    assert_eq!(record.sub_ptx_vsa_ns, u64::MAX);
    assert_eq!(record.grid_blocks, u64::MAX);
}

/// Locks out a nested dispatch (a dispatch inside a dispatch, such as a graph
/// record) charging the outer one's accumulator, or ending it.
#[test]
fn nested_dispatch_does_not_corrupt_the_outer_one() {
    let _on = probe::override_enabled(Some(true));
    let ((), lines) = probe::capture_lines(|| {
        let outer = probe::begin_dispatch().expect("on");
        probe::add_phase_ns(Phase::Stage, 10);
        probe::count_with(Count::Nodes, || 100);
        {
            let inner = probe::begin_dispatch().expect("on");
            probe::add_phase_ns(Phase::Stage, 5);
            probe::count_with(Count::Nodes, || 7);
            // The outer guard still reaches its own accumulator.
            outer.add_phase_ns(Phase::Readback, 11);
            inner.finish(DispatchTiming {
                wall_ns: 50,
                ..DispatchTiming::default()
            });
        }
        probe::add_phase_ns(Phase::Launch, 7);
        outer.finish(DispatchTiming {
            wall_ns: 100,
            ..DispatchTiming::default()
        });
    });
    assert_eq!(lines.len(), 2, "{lines:?}");
    let inner = probe::parse_line(&lines[0]).expect("inner");
    let outer = probe::parse_line(&lines[1]).expect("outer");
    assert_eq!((inner.nodes, inner.phase_ns(Phase::Stage)), (7, 5));
    assert_eq!(inner.named_host_ns(), 5);
    assert_eq!(outer.nodes, 100);
    assert_eq!(outer.phase_ns(Phase::Stage), 10);
    assert_eq!(outer.phase_ns(Phase::Launch), 7);
    assert_eq!(outer.phase_ns(Phase::Readback), 11);
    assert!(outer.seq > inner.seq);
}

/// Locks out an error path (guard dropped without finish) leaving its
/// accumulator on the stack, where it would swallow the next dispatch's charges.
#[test]
fn dropped_dispatch_prints_nothing_and_leaves_no_residue() {
    let _on = probe::override_enabled(Some(true));
    let ((), lines) = probe::capture_lines(|| {
        let abandoned = probe::begin_dispatch().expect("on");
        probe::add_phase_ns(Phase::Stage, 999);
        drop(abandoned);
        // No dispatch open: this charge goes nowhere.
        probe::add_phase_ns(Phase::Stage, 555);
        let next = probe::begin_dispatch().expect("on");
        probe::add_phase_ns(Phase::Launch, 3);
        next.finish(DispatchTiming {
            wall_ns: 10,
            ..DispatchTiming::default()
        });
    });
    assert_eq!(lines.len(), 1);
    let record = probe::parse_line(&lines[0]).expect("parseable");
    assert_eq!(record.phase_ns(Phase::Stage), 0);
    assert_eq!(record.phase_ns(Phase::Launch), 3);
}

/// Locks out a shared (non-thread-local) accumulator: eight threads charging
/// different amounts at once must each see only their own.
#[test]
fn eight_threads_keep_their_accumulators_apart() {
    let _on = probe::override_enabled(Some(true));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (1..=8u64)
        .map(|thread| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                probe::capture_lines(|| {
                    for round in 0..50u64 {
                        let dispatch = probe::begin_dispatch().expect("on");
                        barrier.wait();
                        for phase in Phase::ALL {
                            probe::add_phase_ns(phase, thread);
                        }
                        probe::count_with(Count::Nodes, || thread * 1000 + round);
                        if round % 10 == 0 {
                            barrier.wait();
                        }
                        dispatch.finish(DispatchTiming {
                            wall_ns: 1_000,
                            ..DispatchTiming::default()
                        });
                    }
                })
                .1
            })
        })
        .collect();
    let mut all_seq = HashSet::new();
    for (thread, handle) in (1..=8u64).zip(handles) {
        let lines = handle.join().expect("thread did not panic");
        assert_eq!(lines.len(), 50);
        for (round, line) in (0..50u64).zip(&lines) {
            let record = probe::parse_line(line).expect("parseable");
            assert_eq!(record.phases, [thread; PHASE_COUNT]);
            assert_eq!(record.nodes, thread * 1000 + round);
            assert!(all_seq.insert(record.seq), "seq {} repeated", record.seq);
        }
    }
}

/// The child side of [`subprocess_with_the_variable_set_prints_lines_that_add_up`]:
/// does nothing unless re-executed with [`CHILD_MARKER`].
#[test]
fn child_synthetic_dispatches() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    eprintln!("child: unrelated stderr output before the dispatches");
    for round in 0..4u64 {
        let started = std::time::Instant::now();
        let dispatch = probe::begin_dispatch();
        for phase in Phase::ALL {
            probe::timed(phase, || std::thread::sleep(Duration::from_micros(50)));
        }
        let mark = probe::mark();
        probe::timed_sub(SubPhase::PtxDigest, || {
            std::thread::sleep(Duration::from_micros(20))
        });
        probe::charge(Phase::Ptx, mark);
        probe::count_with(Count::Nodes, || 64);
        probe::count_with(Count::Buffers, || 9);
        probe::note_ptx_cache(round > 0);
        // The odd rounds let the probe measure the wall itself.
        let wall_ns = if round % 2 == 0 {
            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
        } else {
            0
        };
        if let Some(dispatch) = dispatch {
            dispatch.finish(DispatchTiming {
                wall_ns,
                ..DispatchTiming::default()
            });
        }
    }
}

fn run_child(variable: Option<&str>) -> String {
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command
        .args([
            "--exact",
            "child_synthetic_dispatches",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MARKER, "1")
        .stdin(Stdio::null());
    match variable {
        Some(value) => command.env(probe::ENV_VAR, value),
        None => command.env_remove(probe::ENV_VAR),
    };
    let output = command.output().expect("re-run the test binary");
    assert!(output.status.success(), "child failed: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Locks out the environment switch not working (or not being read), lines
/// that do not parse when printed for real, and phases that do not add up:
/// a child process with the variable set must print one parseable line per
/// dispatch with named == sum of phases and named + unattributed == wall.
#[test]
fn subprocess_with_the_variable_set_prints_lines_that_add_up() {
    let stderr = run_child(Some("1"));
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("vyre-cuda-dispatch-phase "))
        .collect();
    assert_eq!(lines.len(), 4, "stderr was:\n{stderr}");
    for line in &lines {
        let record = probe::parse_line(line).unwrap_or_else(|| panic!("unparseable: {line}"));
        let sum = record.phases.iter().sum::<u64>();
        assert_eq!(record.named_host_ns(), sum);
        assert_eq!(
            record.named_host_ns() + record.unattributed_ns(),
            record.wall_ns
        );
        // Each phase enclosed a 50 µs sleep (a lower bound, not a speed gate).
        for phase in Phase::ALL {
            assert!(record.phase_ns(phase) >= 50_000, "{phase:?} in {line}");
        }
        assert!(record.sub_ptx_digest_ns >= 20_000);
        assert!(record.phase_ns(Phase::Ptx) >= record.sub_ptx_digest_ns);
        assert_eq!((record.nodes, record.buffers), (64, 9));
        assert_eq!(record.ptx_cache_hits + record.ptx_cache_misses, 1);
    }
    let summary = summarize_log(&stderr);
    assert_eq!((summary.records, summary.malformed), (4, 0));
    assert!(summary.unrelated >= 1);
    // Negative controls: unset or "0" prints no probe line.
    for variable in [None, Some("0")] {
        let quiet = run_child(variable);
        assert!(
            !quiet.contains("vyre-cuda-dispatch-phase "),
            "{variable:?} printed:\n{quiet}"
        );
        assert!(quiet.contains("child: unrelated stderr output"));
    }
}

/// Locks out a parser that accepts truncated lines, garbage or signed values,
/// extra keys, or a line that does not add up; and one that rejects a
/// well-formed line with a trailing `\r`.
#[test]
fn parser_is_strict() {
    let good = probe::format_line(&DispatchRecord {
        seq: 3,
        wall_ns: 100,
        phases: [1, 2, 3, 4, 5, 6, 7, 8, 9],
        ..DispatchRecord::default()
    });
    assert!(probe::parse_line(&good).is_some());
    assert!(probe::parse_line(&format!("{good}\r")).is_some());
    let bad = [
        good[..good.len() - 1].to_string() + "x",
        good[..good.len() / 2].to_string(),
        good.replace("seq=3", "seq=+3"),
        good.replace("seq=3", "seq=-3"),
        good.replace("seq=3", "seq="),
        good.replace("seq=3", "seq=18446744073709551616"),
        good.replace("wall_ns=100", "wall_ns=101"),
        good.replace("vyre-cuda-dispatch-phase ", "vyre-cuda-dispatch-phase"),
        format!("{good} extra=1"),
        format!("x{good}"),
        String::new(),
    ];
    for line in &bad {
        assert_eq!(probe::parse_line(line), None, "accepted {line:?}");
    }
}

fn row_tokens(table: &str, group_header_prefix: &str, row: &str) -> Vec<String> {
    let group = table
        .split("\nnodes=")
        .find(|section| section.starts_with(group_header_prefix))
        .unwrap_or_else(|| panic!("no group {group_header_prefix} in\n{table}"));
    group
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|tokens| tokens.first() == Some(&row))
        .unwrap_or_else(|| panic!("no row {row} in\n{group}"))
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// Locks out miscounted or miscomputed report figures on a mixed log (probe
/// lines among unrelated output, truncated and garbage lines), worked out by
/// hand: medians and p90 by nearest rank, shares as totals over wall.
#[test]
fn report_library_gives_the_expected_numbers_on_the_mixed_fixture() {
    let text = std::fs::read_to_string(fixture("mixed.log")).expect("fixture");
    let summary = summarize_log(&text);
    assert_eq!(
        (
            summary.lines,
            summary.records,
            summary.malformed,
            summary.unrelated
        ),
        (18, 7, 6, 5)
    );
    assert_eq!(summary.groups.len(), 2);
    let small = &summary.groups[0];
    assert_eq!((small.nodes, small.buffers, small.dispatches), (64, 9, 5));
    assert_eq!(small.median_ptx_bytes, 4002);
    assert_eq!((small.ptx_cache_hits, small.ptx_cache_misses), (5, 0));
    let row = |group: &vyre_cuda::probe::report::GroupSummary, kind| {
        let row = group.row(kind).expect("row").clone();
        (row.median_ns, row.p90_ns, row.total_ns)
    };
    assert_eq!(row(small, RowKind::Wall), (30_000, 50_000, 150_000));
    assert_eq!(
        row(small, RowKind::Phase(Phase::Prepare)),
        (3_000, 5_000, 15_000)
    );
    assert_eq!(row(small, RowKind::NamedHost), (10_000, 12_000, 50_000));
    assert_eq!(row(small, RowKind::Unattributed), (20_000, 38_000, 100_000));
    let share = |group: &vyre_cuda::probe::report::GroupSummary, kind| {
        group.row(kind).expect("row").share_of_wall
    };
    assert!((share(small, RowKind::Phase(Phase::Prepare)) - 0.1).abs() < 1e-12);
    let phase_shares: f64 = Phase::ALL
        .into_iter()
        .map(|p| share(small, RowKind::Phase(p)))
        .sum();
    assert!((phase_shares + share(small, RowKind::Unattributed) - 1.0).abs() < 1e-12);

    let large = &summary.groups[1];
    assert_eq!((large.nodes, large.dispatches), (1024, 2));
    assert_eq!((large.ptx_cache_hits, large.ptx_cache_misses), (1, 1));
    assert_eq!(row(large, RowKind::Wall), (100_000, 200_000, 300_000));
    assert_eq!(row(large, RowKind::Phase(Phase::Ptx)), (0, 50_000, 50_000));
    assert_eq!(
        row(large, RowKind::SubPhase(SubPhase::PtxDigest)),
        (0, 20_000, 20_000)
    );

    // summarize() on records alone agrees with the log path.
    let records: Vec<DispatchRecord> = text
        .lines()
        .filter_map(|line| match classify_line(line) {
            LineKind::Record(record) => Some(record),
            _ => None,
        })
        .collect();
    assert_eq!(summarize(&records), summary.groups);

    let table = render_table(&summary);
    assert!(table.contains("18 lines, 7 probe records, 6 malformed (skipped), 5 unrelated"));
    assert_eq!(
        row_tokens(&table, "64 buffers=9", "prepare"),
        ["prepare", "3.000", "5.000", "10.0%"]
    );
    assert_eq!(
        row_tokens(&table, "64 buffers=9", "unattributed"),
        ["unattributed", "20.000", "38.000", "66.7%"]
    );
    assert_eq!(
        row_tokens(&table, "1024 buffers=9", "ptx"),
        ["ptx", "0.000", "50.000", "16.7%"]
    );
    let json = render_json(&summary);
    assert!(json.starts_with("{\"lines\":18,\"records\":7,\"malformed\":6,\"unrelated\":5,"));
    assert!(json.contains(
        "{\"name\":\"prepare\",\"kind\":\"phase\",\"median_ns\":3000,\"p90_ns\":5000,\"total_ns\":15000,\"share_of_wall\":0.100000}"
    ));
}

fn report_binary(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_vyre-cuda-phase-report"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn report tool");
    let mut pipe = child.stdin.take().expect("stdin");
    if let Some(bytes) = stdin {
        pipe.write_all(bytes).expect("write stdin");
    }
    drop(pipe);
    let output = child.wait_with_output().expect("report tool ran");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Locks out the binary drifting from the library (it must print exactly the
/// library's table and JSON for a file and for stdin).
#[test]
fn report_binary_prints_the_library_table_and_json() {
    let path = fixture("mixed.log");
    let text = std::fs::read_to_string(&path).expect("fixture");
    let summary = summarize_log(&text);
    let path = path.to_str().expect("utf-8 path");
    let (code, stdout, _) = report_binary(&[path], None);
    assert_eq!(code, 0);
    assert_eq!(stdout, render_table(&summary));
    let (code, stdout, _) = report_binary(&["--json", "-"], Some(text.as_bytes()));
    assert_eq!(code, 0);
    assert_eq!(stdout, render_json(&summary));
}

/// Locks out panics or crashes on hostile input: invalid UTF-8, garbage-only
/// logs, empty input, bad arguments, a missing file.
#[test]
fn report_binary_survives_garbage_and_bad_arguments() {
    let garbage = fixture("garbage.log");
    let garbage = garbage.to_str().expect("utf-8 path");
    let (code, stdout, stderr) = report_binary(&[garbage], None);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("5 lines, 0 probe records, 3 malformed (skipped), 2 unrelated"));
    assert!(stdout.contains("no probe records"));
    assert!(stderr.contains("Fix:"));
    let (code, stdout, _) = report_binary(&["--json", garbage], None);
    assert_eq!(code, 0);
    assert_eq!(
        stdout,
        "{\"lines\":5,\"records\":0,\"malformed\":3,\"unrelated\":2,\"over_record_cap\":0,\
         \"malformed_reasons\":{\"not a decimal value\":1,\"truncated\":2},\"groups\":[]}\n"
    );
    let (code, stdout, _) = report_binary(&[], Some(b""));
    assert_eq!(code, 0);
    assert!(stdout.contains("0 lines, 0 probe records"));
    let (code, stdout, _) = report_binary(&["--help"], None);
    assert_eq!(code, 0);
    assert!(stdout.contains("USAGE"));
    let (code, _, stderr) = report_binary(&["--frobnicate"], None);
    assert_eq!(code, 2);
    assert!(stderr.contains("Fix:"));
    let (code, _, stderr) = report_binary(&["/nonexistent/probe.log"], None);
    assert_eq!(code, 1);
    assert!(stderr.contains("Fix:"));
    let (code, _, stderr) = report_binary(&[garbage, garbage], None);
    assert_eq!(code, 2);
    assert!(stderr.contains("Fix:"));
}

fn one_line_dispatch(nodes: u64) {
    if let Some(dispatch) = probe::begin_dispatch() {
        dispatch.set_count(Count::Nodes, nodes);
        dispatch.finish(DispatchTiming::default());
    }
}

/// Locks out captures that leak: a panicking closure inside a capture must not
/// leave this thread capturing into a buffer nobody reads, and nested captures
/// each get only their own lines.
#[test]
fn captures_nest_and_survive_a_panicking_closure() {
    let _on = probe::override_enabled(Some(true));
    let ((), outer) = probe::capture_lines(|| {
        one_line_dispatch(1);
        let ((), inner) = probe::capture_lines(|| one_line_dispatch(2));
        assert_eq!(inner.len(), 1);
        assert_eq!(probe::parse_line(&inner[0]).map(|r| r.nodes), Some(2));
        let panicked = std::panic::catch_unwind(|| {
            probe::capture_lines(|| {
                one_line_dispatch(3);
                panic!("dispatch failed");
            })
        });
        assert!(panicked.is_err());
        one_line_dispatch(4);
    });
    let nodes: Vec<u64> = outer
        .iter()
        .filter_map(|line| probe::parse_line(line))
        .map(|record| record.nodes)
        .collect();
    assert_eq!(nodes, [1, 4]);
}

/// Locks out an override that deadlocks when nested on one thread, or that
/// does not restore the previous state when dropped.
#[test]
fn overrides_nest_and_restore() {
    let _on = probe::override_enabled(Some(true));
    assert!(probe::enabled());
    {
        let _off = probe::override_enabled(Some(false));
        assert!(!probe::enabled());
        assert!(probe::begin_dispatch().is_none());
    }
    assert!(probe::enabled());
}

// ---------------------------------------------------------------------------
// Program identity, sinks, bounded report.

fn record_line(program: u64, nodes: u64, wall_ns: u64) -> String {
    probe::format_line(&DispatchRecord {
        nodes,
        buffers: 9,
        wall_ns,
        phases: [wall_ns / 10; PHASE_COUNT],
        program,
        ..DispatchRecord::default()
    })
}

/// Locks out the report merging two kernels of the same shape: two
/// programs with the same (nodes, buffers) but different identities are two groups,
/// each with its own dispatches; the identity round-trips as 16 hex digits at the end
/// of the line. Negative control: the same identity is one group.
#[test]
fn report_groups_by_program_identity() {
    let first = record_line(0x0123_4567_89ab_cdef, 64, 10_000);
    assert!(first.ends_with(" program=0123456789abcdef"), "{first}");
    assert_eq!(
        probe::parse_line(&first).map(|r| r.program),
        Some(0x0123_4567_89ab_cdef)
    );
    let second = record_line(0xfeed, 64, 20_000);
    let text = [first.as_str(), second.as_str(), first.as_str()].join("\n");
    let summary = summarize_log(&text);
    assert_eq!(summary.groups.len(), 2, "{summary:?}");
    let counts: Vec<(u64, usize)> = summary
        .groups
        .iter()
        .map(|group| (group.program, group.dispatches))
        .collect();
    assert!(counts.contains(&(0x0123_4567_89ab_cdef, 2)), "{counts:?}");
    assert!(counts.contains(&(0xfeed, 1)), "{counts:?}");
    let table = render_table(&summary);
    assert!(table.contains("program=0123456789abcdef"), "{table}");
    let same = summarize_log(&[first.as_str(), first.as_str()].join("\n"));
    assert_eq!(same.groups.len(), 1);
}

/// Locks out a parser that accepts duplicate or overflowing fields, or a report that
/// drops the reason: each bad line is refused with its own
/// reason, counted by reason in the report, and the good line among them still counts.
/// A line from before `program` existed still parses (identity 0).
#[test]
fn bad_probe_lines_are_refused_with_their_reason() {
    let good = record_line(7, 16, 1_000);
    let legacy = good
        .rsplit_once(" program=")
        .map(|(head, _)| head.to_string())
        .expect("program field");
    assert_eq!(probe::parse_line(&legacy).map(|r| r.program), Some(0));
    let duplicate = good.replacen("nodes=16", "seq=0", 1);
    let overflow = good.replacen("nodes=16", "nodes=99999999999999999999", 1);
    let bad_identity = good.replace("program=0000000000000007", "program=7");
    let cases = [
        (duplicate.as_str(), LineError::DuplicateKey { key: "seq" }),
        (overflow.as_str(), LineError::Overflow { key: "nodes" }),
        (
            bad_identity.as_str(),
            LineError::BadValue { key: "program" },
        ),
    ];
    for (line, expected) in cases {
        assert_eq!(probe::parse_line_checked(line), Err(expected), "{line}");
    }
    let text = [good.as_str(), &duplicate, &overflow, &bad_identity].join("\n");
    let summary = summarize_log(&text);
    assert_eq!((summary.records, summary.malformed), (1, 3));
    let reasons: Vec<&str> = summary.malformed_reasons.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        reasons,
        [
            "duplicate key",
            "value overflows u64",
            "not a decimal value"
        ]
    );
    assert_eq!(summary.malformed_examples[0].0, 2, "1-based line numbers");
    assert!(render_table(&summary).contains("line 2: duplicate key `seq`"));
}

/// Locks out a report that reads its whole input before parsing (`/dev/zero`
/// grew to 3 GB): a reader that yields 16 MiB of one endless line, then a good probe
/// line, is summarized as one malformed over-long line and one record, and the report
/// never holds more than its line cap (the reader is a generator, not a buffer).
#[test]
fn report_streams_and_caps_over_long_lines() {
    struct Endless {
        remaining: usize,
        tail: std::io::Cursor<Vec<u8>>,
    }
    impl std::io::Read for Endless {
        fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
            if self.remaining == 0 {
                return self.tail.read(buffer);
            }
            let n = buffer.len().min(self.remaining);
            buffer[..n].fill(b'x');
            self.remaining -= n;
            Ok(n)
        }
    }
    let good = record_line(9, 4, 500);
    let reader = std::io::BufReader::new(Endless {
        remaining: 16 << 20,
        tail: std::io::Cursor::new(format!("\n{good}\n").into_bytes()),
    });
    let summary = summarize_reader(reader).expect("reads");
    assert_eq!(
        (summary.lines, summary.records, summary.malformed),
        (2, 1, 1)
    );
    assert_eq!(
        summary.malformed_reasons,
        vec![("line over the length cap", 1)]
    );
    // Negative control: a line exactly at the cap is classified, not refused.
    let at_cap = "y".repeat(MAX_LINE_BYTES);
    let summary = summarize_reader(at_cap.as_bytes()).expect("reads");
    assert_eq!((summary.unrelated, summary.malformed), (1, 0));
}

/// Locks out a probe that can only write to stderr: with a callback
/// sink the dispatch's record and line reach the callback; with a file sink the line
/// lands in the file; a panicking callback does not turn the dispatch into a panic.
/// Negative control: back on stderr, the callback sees nothing more.
#[test]
fn probe_lines_reach_the_chosen_sink() {
    let _on = probe::override_enabled(Some(true));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(u64, String)>::new()));
    let sink_seen = Arc::clone(&seen);
    probe::set_sink(Sink::Callback(Box::new(move |record, line| {
        sink_seen
            .lock()
            .expect("lock")
            .push((record.program, line.to_string()));
    })));
    let dispatch = || {
        let dispatch = probe::begin_dispatch().expect("on");
        probe::note_program(|| 0xabc);
        dispatch.finish(DispatchTiming {
            wall_ns: 1_000,
            ..DispatchTiming::default()
        })
    };
    let record = dispatch().expect("record");
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, 0xabc);
        assert_eq!(probe::parse_line(&seen[0].1), Some(record));
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("probe.log");
    probe::set_sink(Sink::file(&path).expect("file"));
    dispatch();
    dispatch();
    let written = std::fs::read_to_string(&path).expect("log");
    let summary = summarize_log(&written);
    assert_eq!(summary.records, 2, "{written}");

    probe::set_sink(Sink::Callback(Box::new(|_, _| panic!("a broken sink"))));
    assert!(
        dispatch().is_some(),
        "the dispatch survives a panicking sink"
    );

    probe::set_sink(Sink::Stderr);
    dispatch();
    assert_eq!(seen.lock().expect("lock").len(), 1);
}
