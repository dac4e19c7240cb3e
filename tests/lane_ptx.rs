//! Lane modules (`codegen::ptx::lane`): a resident server and the bodies of a set of
//! programs in one PTX module. On the CPU: the real `ptxas` assembles them for `sm_90`
//! (fixtures and generated programs, every workgroup shape the generator draws), the
//! module of the fixture lane is a reviewed snapshot, a body reads its bindings, grid
//! and scalar values where the host's request record puts them, and the builder
//! refuses what a lane cannot run, unchanged.

#[path = "support/ptxas.rs"]
mod ptxas;
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use support::lane as lane_programs;
use vyre_cuda::codegen::ptx::lane::{
    record_scalar_at, DEVICE_ARRIVALS, DEVICE_GO, DEVICE_PUBLISHED, LANE_RECORD_PARAMETER,
    RECORD_BINDINGS_AT, RECORD_BINDING_BYTES, RECORD_GRID,
};
use vyre_cuda::codegen::{program_to_ptx, CodegenError, LaneModuleBuilder, LANE_ENTRY_NAME};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
use vyre_cuda::ir::*;
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::CodegenOptions;

/// `x[i] = x[i] * 2 + w[0]`, with `w[local] = workgroup_count.x` in workgroup memory
/// first (a barrier between): buffers, workgroup memory, a barrier and every builtin
/// the lane rewrites.
fn doubling() -> Program {
    doubling_at(32)
}

/// [`doubling`] in workgroups of `[x, 1, 1]` (its workgroup memory as wide).
fn doubling_at(x: u32) -> Program {
    Program::builder([x, 1, 1])
        .entry_op_id("lane_doubling")
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "w",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(x),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.store("w", Expr::local_id(Axis::X), Expr::workgroup_count(Axis::X));
            b.barrier();
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                let value = Expr::load("x", i.clone()) * 2u32 + Expr::load("w", 0u32);
                b.store("x", i.clone(), value);
            });
        })
        .build()
}

/// `out[workgroup_id.y] = sum of inp` by one thread per workgroup, an early return
/// for the others: a write-only output, a static input, a `return`.
fn summing() -> Program {
    summing_at(32)
}

/// [`summing`] in workgroups of `[x, 1, 1]`.
fn summing_at(x: u32) -> Program {
    Program::builder([x, 1, 1])
        .entry_op_id("lane_summing")
        .buffer(
            "inp",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.if_(Expr::local_id(Axis::X).not_equals(0u32), |b| {
                b.return_();
            });
            let total = b.let_mut("total", 0u32);
            b.loop_("k", 0u32, 4u32, |b, k| {
                b.assign("total", total.clone() + Expr::load("inp", k));
            });
            b.store("out", Expr::workgroup_id(Axis::Y), total);
        })
        .build()
}

fn snapshot_path() -> PathBuf {
    snapshot_named("lane_fixture")
}

fn snapshot_named(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/snapshots/ptx/{name}.ptx"))
}

/// Whether `ptx` equals the snapshot at `path` (rewritten first under
/// `VYRE_UPDATE_SNAPSHOTS=1`); the `Fix:` message otherwise.
fn matches_snapshot(ptx: &str, path: &std::path::Path) -> Result<(), String> {
    if std::env::var("VYRE_UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(path, ptx).expect("write the snapshot");
    }
    let expected = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "Fix: run `VYRE_UPDATE_SNAPSHOTS=1 cargo test --test lane_ptx` to write {}: {e}",
            path.display()
        )
    })?;
    if expected == ptx {
        return Ok(());
    }
    let first = expected
        .lines()
        .zip(ptx.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(expected.lines().count().min(ptx.lines().count()));
    Err(format!(
        "Fix: review the lane PTX change in {} (first difference at line {}) and run \
         `VYRE_UPDATE_SNAPSHOTS=1 cargo test --test lane_ptx`",
        path.display(),
        first + 1
    ))
}

/// The fixture lane: both fixtures, default options.
fn fixture_lane() -> String {
    let mut lane = LaneModuleBuilder::new(90, 32, [32, 1, 1]);
    for program in [doubling(), summing()] {
        lane.push(&program, &CodegenOptions::default())
            .expect("a fixture is a lane body");
    }
    lane.finish()
}

/// Locks out an unreviewed change to the lane's server or bodies (the server's
/// protocol is its text: a change is a diff someone reads) and a module the driver
/// would refuse: the fixture lane equals its snapshot byte for byte and ptxas
/// assembles it for sm_90. `VYRE_UPDATE_SNAPSHOTS=1` rewrites the snapshot.
#[test]
fn the_fixture_lane_matches_its_snapshot_and_assembles() {
    let ptx = fixture_lane();
    matches_snapshot(&ptx, &snapshot_path()).unwrap_or_else(|message| panic!("{message}"));
    assert!(ptx.contains(&format!(".visible .entry {LANE_ENTRY_NAME}(")));
    assert_eq!(ptx.matches(".func vyre_lane_body_").count(), 2);
    let Some(ptxas) = ptxas::require("the_fixture_lane_matches_its_snapshot_and_assembles") else {
        return;
    };
    ptxas::assemble(&ptxas, "lane_fixture", &ptx).unwrap_or_else(|report| panic!("{report}"));
}

/// Locks out lane bodies whose workgroup barriers require a converged warp: a
/// body is called once per workgroup from the server's loop, and threads that
/// returned early from the previous call need not have reconverged, so an aligned
/// `bar.sync` there may wait forever (it hung on the H200). Every barrier of the
/// fixture lane's bodies (the entry clear of workgroup memory and the program's own)
/// is the non-aligned `barrier.sync 0`. Negative control: the same program as a
/// launched kernel uses the aligned `bar.sync 0`, which the check would catch.
#[test]
fn lane_bodies_use_barriers_that_allow_a_diverged_warp() {
    let aligned = |ptx: &str| ptx.lines().any(|line| line.trim() == "bar.sync 0;");
    let ptx = fixture_lane();
    let bodies: String = ptx
        .split(".func vyre_lane_body_")
        .skip(1)
        .map(|body| body.split(".visible .entry").next().unwrap_or(body))
        .collect();
    assert!(bodies.contains("barrier.sync 0;"), "{bodies}");
    assert!(!aligned(&bodies), "{bodies}");
    let launched = program_to_ptx(&doubling(), &CodegenOptions::default(), 90, 32).unwrap();
    assert!(aligned(&launched), "{launched}");
}

/// Locks out a lane that refuses a body polling host-written flags, or emits its
/// acquire loads as something else: a body whose first thread waits on its piece's
/// `ready` flag with an acquire load, then (after a barrier) reads the piece
/// (`support::copy_when_ready`), holds one bounds-checked
/// `ld.relaxed.sys.global.u32` followed at once by `fence.acq_rel.sys` (the acquire
/// pattern launched kernels emit, never `ld.acquire`), and the module assembles with
/// ptxas for sm_90.
#[test]
fn a_body_polls_with_acquire_loads_and_assembles() {
    let program = support::copy_when_ready();
    let mut lane = LaneModuleBuilder::new(90, 32, [64, 1, 1]);
    lane.push(&program, &CodegenOptions::default())
        .expect("a body with acquire loads");
    let ptx = lane.finish();
    let body = ptx
        .split(".func vyre_lane_body_")
        .nth(1)
        .and_then(|body| body.split(".visible .entry").next())
        .expect("one body");
    let lines: Vec<&str> = body.lines().map(str::trim).collect();
    let acquires: Vec<(&str, Option<&&str>)> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.contains("ld.relaxed.sys") || line.contains("ld.acquire"))
        .map(|(at, line)| (*line, lines.get(at + 1)))
        .collect();
    assert_eq!(acquires.len(), 1, "{body}");
    let (load, next) = acquires[0];
    assert!(
        load.starts_with('@') && load.contains("ld.relaxed.sys.global.u32 "),
        "{body}"
    );
    assert_eq!(next, Some(&"fence.acq_rel.sys;"), "{body}");
    let Some(ptxas) = ptxas::require("a_body_polls_with_acquire_loads_and_assembles") else {
        return;
    };
    ptxas::assemble(&ptxas, "lane_acquire", &ptx).unwrap_or_else(|report| panic!("{report}"));
}

/// Whether the completion's arrival (`completion`: the text from `$L_lane_complete:`
/// to `$L_lane_arrived:`) counts with one `atom.inc` that wraps at the last arrival's
/// count, and writes the counter nothing else.
fn arrival_resets_atomically(completion: &str) -> Result<(), String> {
    let arrivals = "[%device+0]";
    let inc = format!("atom.acq_rel.gpu.global.inc.u32 %arrived, {arrivals}, %last_arrival;");
    let lines: Vec<&str> = completion.lines().map(str::trim).collect();
    if !lines.contains(&inc.as_str()) {
        return Err("the arrival is not the wrapping atom.inc".into());
    }
    // A line that names the counter and is not a load (after its predicate) writes it.
    let writes = |line: &&&str| {
        let instruction = match line.split_once(' ') {
            Some((predicate, rest)) if predicate.starts_with('@') => rest,
            _ => line,
        };
        line.contains(arrivals) && !instruction.starts_with("ld.")
    };
    match lines.iter().filter(writes).count() {
        1 => Ok(()),
        n => Err(format!(
            "{n} writes of the arrival counter where only the atom.inc may write it"
        )),
    }
}

/// Locks out a completion that erases an arrival of the next request, or whose reset of
/// the arrival counter is still in flight when the next request arrives: with several
/// blocks the last one to arrive at the device counter publishes, and (before block 0
/// waited for each request's publication:
/// `block_zero_starts_a_request_only_after_the_previous_is_published`) the others could
/// already serve the next request and arrive for it. A store of 0 after the
/// publisher's atomic add would erase such an arrival (the next completion waits
/// forever for a block that already came); a take-back by a separate `red` of minus
/// the block count returns nothing, so nothing waits for it, and with the publish
/// fence behind the result words nothing orders it before the header the host sees
/// (the next request could arrive before it and find the counter off by a whole
/// request). The fixture lane's arrival is one `atom.inc` that wraps at the last
/// arrival's count, so the reset is performed when the last arrival returns, before
/// the publish it decides, and nothing else writes the counter. Negative controls: the
/// store of 0 and the `red` take-back the server used before are caught, after the
/// plain atomic add they followed and beside the wrapping arrival.
#[test]
fn the_completion_resets_its_arrivals_inside_the_arrival() {
    let ptx = fixture_lane();
    let completion = ptx
        .split("$L_lane_complete:")
        .nth(1)
        .and_then(|rest| rest.split("$L_lane_arrived:").next())
        .expect("the completion's arrival");
    assert_eq!(
        arrival_resets_atomically(completion),
        Ok(()),
        "{completion}"
    );
    assert!(!ptx.contains("%minus_blocks"), "{completion}");
    let inc = "atom.acq_rel.gpu.global.inc.u32 %arrived, [%device+0], %last_arrival;";
    let added = "atom.acq_rel.gpu.global.add.u32 %arrived, [%device+0], 1;";
    for reset in [
        "@%take st.relaxed.gpu.global.u32 [%device+0], 0;",
        "@%take red.relaxed.gpu.global.add.u32 [%device+0], %minus_blocks;",
    ] {
        // The reset beside the wrapping arrival: a second write of the counter.
        let beside = completion.replace(inc, &format!("{inc}\n\t{reset}"));
        let error = arrival_resets_atomically(&beside).expect_err(reset);
        assert!(error.contains("2 writes"), "{error}");
        // The reset after a plain add, as the server had it.
        let before = completion.replace(inc, &format!("{added}\n\t{reset}"));
        let error = arrival_resets_atomically(&before).expect_err(reset);
        assert!(error.contains("not the wrapping atom.inc"), "{error}");
    }
}

/// The indices of the lines of `lines` that `keep` holds for, in order.
fn positions(lines: &[&str], keep: impl Fn(&str) -> bool) -> Vec<usize> {
    (0..lines.len()).filter(|&at| keep(lines[at])).collect()
}

/// The publish path's order in a lane module's text: from `$L_lane_publish:` to the
/// completion word's store, exactly one publish fence (`fence.acq_rel.gpu;`,
/// unpredicated), after every store of a result word (`st.relaxed.sys` into the result
/// area: every such store of the module other than the completion word's lies on this
/// path) and before the completion word's store, with no label, branch or store
/// between the fence and that store (every path to the completion word passes the
/// fence).
fn publish_fence_order(ptx: &str) -> Result<(), String> {
    let publish = ptx
        .split("$L_lane_publish:")
        .nth(1)
        .ok_or("no publish path")?;
    let lines: Vec<&str> = publish.lines().map(str::trim).collect();
    let completion = lines
        .iter()
        .position(|line| line.contains("[%completion]"))
        .ok_or("no completion word store")?;
    if !lines[completion].starts_with("st.relaxed.sys.global.u64 [%completion]") {
        return Err(format!(
            "the completion word store is `{}`",
            lines[completion]
        ));
    }
    let path = &lines[..completion];
    let fences = positions(path, |line| line.contains("fence."));
    let fence = match fences[..] {
        [] => return Err("no publish fence before the completion word".into()),
        [one] if path[one] == "fence.acq_rel.gpu;" => one,
        [one] => return Err(format!("the publish fence is `{}`", path[one])),
        _ => return Err(format!("{} fences on the publish path", fences.len())),
    };
    let result_words = positions(path, |line| line.contains("st.relaxed.sys"));
    if result_words.is_empty() {
        return Err("no result word on the publish path".into());
    }
    if let Some(after) = result_words.iter().find(|&&at| at > fence) {
        return Err(format!("a result word after the fence: `{}`", path[*after]));
    }
    // The placement word (stored once, when the lane starts, into the completion line
    // at an offset) is no store of a request.
    let everywhere = ptx
        .lines()
        .filter(|line| line.contains("st.relaxed.sys") && !line.contains("[%completion+"))
        .count();
    if everywhere != result_words.len() + 1 {
        return Err(format!(
            "{everywhere} system-scope stores of requests in the module, {} result words on the \
             publish path and the completion word",
            result_words.len()
        ));
    }
    let between = &path[fence + 1..];
    if let Some(line) = between
        .iter()
        .find(|line| line.ends_with(':') || line.contains("bra") || line.contains("st."))
    {
        return Err(format!(
            "`{line}` between the fence and the completion word"
        ));
    }
    Ok(())
}

/// Locks out two defects of the publish fence's place. Before the result words (where
/// it was), the fence held every result word, and so the host's delivery, for about
/// 0.3 µs of a readback phase of 0.96–1.06 µs on the H200, though the host reads no
/// output through device memory. Missing, or after the completion word, it would let
/// the host see the completion word (which orders eager dispatches, blocking copies and
/// other lanes' requests after the request, and releases its memory) while an output
/// is not yet visible at GPU scope. In the fixture lane's server the publish fence
/// comes after every result word (`st.relaxed.sys` into the result area) and before
/// the completion word's store, on a straight path. Negative controls: the fence
/// moved before the first result word, and no fence at all, are caught.
#[test]
fn the_publish_fence_follows_every_result_word_and_precedes_the_completion() {
    let ptx = fixture_lane();
    assert_eq!(publish_fence_order(&ptx), Ok(()));
    // The publish fence: the last fence line before the completion word's store.
    let fence = "\tfence.acq_rel.gpu;\n";
    let completion = ptx.find("[%completion]").expect("the completion word");
    let at = ptx[..completion].rfind(fence).expect("the publish fence");
    let unfenced = format!("{}{}", &ptx[..at], &ptx[at + fence.len()..]);
    let error = publish_fence_order(&unfenced).expect_err("no fence");
    assert!(error.contains("no publish fence"), "{error}");
    let early = unfenced.replacen(
        "$L_lane_publish:\n",
        "$L_lane_publish:\n\tfence.acq_rel.gpu;\n",
        1,
    );
    let error = publish_fence_order(&early).expect_err("the fence before the result words");
    assert!(error.contains("a result word after the fence"), "{error}");
}

/// The text of `ptx` from the line `from` (a label) to the first line containing `to`
/// after it, trimmed lines; `None` when either is missing.
fn between<'a>(ptx: &'a str, from: &str, to: &str) -> Option<Vec<&'a str>> {
    let rest = ptx.split(from).nth(1)?;
    let lines: Vec<&str> = rest.lines().map(str::trim).collect();
    let end = lines.iter().position(|line| line.contains(to))?;
    Some(lines[..=end].to_vec())
}

/// Whether `path` (block 0's leader's lines, ending with its release store of the go
/// word) waits for the previous request's publication before that store: a loop that
/// loads the published word with an acquire, leaves only when it holds `%ticket`
/// (request `%ticket - 1` published), and branches back otherwise; with `barrier`, a
/// `barrier.sync 1` between the loop's exit and the go word, so that block 0's other
/// threads start the request only after the wait too.
fn waits_for_publication(path: &[&str], barrier: bool) -> Result<(), String> {
    let word = format!("[%device+{DEVICE_PUBLISHED}]");
    let go = path.len() - 1;
    let load = path[..go]
        .iter()
        .rposition(|line| line.contains(&word))
        .ok_or("no load of the published word before the go word")?;
    let loaded = path[load];
    if !loaded.starts_with("ld.acquire.gpu.") && !loaded.starts_with("ld.acquire.sys.") {
        return Err(format!("the wait loads the published word with `{loaded}`"));
    }
    let register = loaded
        .split_whitespace()
        .nth(1)
        .map(|register| register.trim_end_matches(','))
        .ok_or("a load without a register")?;
    let compare = format!("setp.eq.u32 %found, {register}, %ticket;");
    if path.get(load + 1) != Some(&compare.as_str()) {
        return Err(format!(
            "the published word is not compared with `%ticket`: `{compare}` missing"
        ));
    }
    let exit = path
        .get(load + 2)
        .and_then(|line| line.strip_prefix("@%found bra "))
        .and_then(|label| label.strip_suffix(';'))
        .ok_or("the wait does not leave when the word shows the previous request")?;
    let top = path
        .get(load.wrapping_sub(1))
        .and_then(|line| line.strip_suffix(':'))
        .ok_or("the wait's load is not the top of a loop")?;
    let back = format!("bra {top};");
    let exit_at = path
        .iter()
        .position(|line| *line == format!("{exit}:"))
        .filter(|&at| at > load && at < go)
        .ok_or("the wait's exit is not between it and the go word")?;
    if !path[load + 3..exit_at].contains(&back.as_str()) {
        return Err("the wait does not load the word again until it shows the request".into());
    }
    if barrier && !path[exit_at..go].contains(&"barrier.sync 1;") {
        return Err("no block barrier between the wait and the go word".into());
    }
    Ok(())
}

/// The published word's protocol in a lane module's text (see
/// `block_zero_starts_a_request_only_after_the_previous_is_published`).
fn publication_order(ptx: &str) -> Result<(), String> {
    let go = format!("st.release.gpu.global.u64 [%device+{DEVICE_GO}], %bell;");
    let start = between(ptx, "$L_lane_record_ready:", &go).ok_or("no go word after the record")?;
    waits_for_publication(&start, true).map_err(|e| format!("request path: {e}"))?;
    let stop = between(ptx, "$L_lane_rung:", &go).ok_or("no go word on the stop path")?;
    if stop.iter().any(|line| line.starts_with("$L_lane_poll_go")) {
        return Err("the stop path hands no go word".into());
    }
    waits_for_publication(&stop, false).map_err(|e| format!("stop path: {e}"))?;
    // The publisher: its one store of the word, a release after the arrival's acquire,
    // the readbacks' barrier and the completion word.
    let word = format!("[%device+{DEVICE_PUBLISHED}]");
    let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
    let writes = positions(&lines, |line| {
        let instruction = match line.split_once(' ') {
            Some((first, rest)) if first.starts_with('@') => rest,
            _ => line,
        };
        line.contains(&word) && !instruction.starts_with("ld.")
    });
    let store = match writes[..] {
        [one] => one,
        [] => return Err("nothing stores the published word".into()),
        _ => return Err(format!("{} writes of the published word", writes.len())),
    };
    let stored = lines[store];
    let release = [
        "st.release.gpu.",
        "st.release.sys.",
        "red.release.gpu.",
        "red.release.sys.",
    ];
    if !release.iter().any(|prefix| stored.starts_with(prefix)) || !stored.ends_with(", %want;") {
        return Err(format!(
            "the published word is stored by `{stored}`, not a release of `%want`"
        ));
    }
    let arrival = format!(
        "atom.acq_rel.gpu.global.inc.u32 %arrived, [%device+{DEVICE_ARRIVALS}], %last_arrival;"
    );
    let position = |wanted: &str| lines.iter().position(|line| line.starts_with(wanted));
    let arrived = position(&arrival).ok_or("no arrival")?;
    let publish = position("$L_lane_publish:").ok_or("no publish path")?;
    let completion =
        position("st.relaxed.sys.global.u64 [%completion]").ok_or("no completion word")?;
    if store < arrived {
        return Err("the published word is stored before the arrival".into());
    }
    if store < publish || store < completion {
        return Err(
            "the published word is stored before the result words and the completion word".into(),
        );
    }
    if !lines[publish..store].contains(&"barrier.sync 1;") {
        return Err("no block barrier between the readbacks and the published word".into());
    }
    Ok(())
}

/// Locks out a lane of several blocks that starts request `n + 1` in any block while a
/// block still serves request `n`. A block that was not the last to arrive used to go
/// straight on to the next request: block 0 could start `n + 1` (and hand its go word
/// out) while another block still wrote `n`'s outputs or the publisher still loaded
/// its readbacks, so the host had to order a lane's own requests; a fast block could
/// arrive for `n + 1` before a slow one arrived for `n`, and the arrival counter cannot
/// tell them apart (`n + 1` published with work undone, `n` never); and block 0 could
/// overwrite the go word before a slow block read it (that block then waits forever).
/// In the fixture lane's server, block 0's leader, after the record and before the block
/// barrier and the go word's release, loops on an `ld.acquire.gpu` of the published
/// word until it shows the previous request (and on a stop, before the go word too),
/// and the publisher's only store of that word is a release of the request's ticket
/// field, after its arrival's acquire, the barrier after its readbacks and the
/// completion word. Negative controls: the wait removed (from the request path, from
/// the stop path), the wait's load relaxed, the go word released before the wait, and
/// the store moved before the arrival (or made relaxed) are each caught.
#[test]
fn block_zero_starts_a_request_only_after_the_previous_is_published() {
    let ptx = fixture_lane();
    assert_eq!(publication_order(&ptx), Ok(()));
    let published = format!("[%device+{DEVICE_PUBLISHED}]");
    let go = format!("st.release.gpu.global.u64 [%device+{DEVICE_GO}], %bell;");
    // The request path's wait, from its loop's top to its exit.
    let top = "$L_lane_wait_published:\n";
    let at = ptx.find(top).expect("the request path's wait");
    let exit = "$L_lane_previous_published:\n";
    let end = ptx.find(exit).expect("the wait's exit");
    let unwaited = format!("{}{}", &ptx[..at], &ptx[end..]);
    let error = publication_order(&unwaited).expect_err("no wait");
    assert!(error.starts_with("request path:"), "{error}");
    // The stop path's wait removed: the stop's go word could overwrite the last
    // request's before a slow block read it.
    let stop_at = ptx
        .find("$L_lane_stop_wait:\n")
        .expect("the stop path's wait");
    let stop_end = ptx.find("$L_lane_stop_published:\n").expect("its exit");
    let unwaited_stop = format!("{}{}", &ptx[..stop_at], &ptx[stop_end..]);
    let error = publication_order(&unwaited_stop).expect_err("no wait before the stop");
    assert!(error.starts_with("stop path:"), "{error}");
    let relaxed = ptx.replace(
        &format!("ld.acquire.gpu.global.u32 %published, {published};"),
        &format!("ld.relaxed.gpu.global.u32 %published, {published};"),
    );
    let error = publication_order(&relaxed).expect_err("a relaxed wait");
    assert!(
        error.starts_with("request path: the wait loads the published word with"),
        "{error}"
    );
    // The go word's line released before the wait (block 0's old order).
    let go_at = at + ptx[at..].find(&go).expect("the go word after the wait");
    let line_start = ptx[..go_at].rfind('\n').map_or(0, |newline| newline + 1);
    let line_end = go_at + ptx[go_at..].find('\n').expect("a line end") + 1;
    let early = format!(
        "{}{}{}{}",
        &ptx[..at],
        &ptx[line_start..line_end],
        &ptx[at..line_start],
        &ptx[line_end..]
    );
    let error = publication_order(&early).expect_err("the go word before the wait");
    assert!(error.starts_with("request path:"), "{error}");
    // The publisher's store before the arrival, and a relaxed store.
    let store = format!("\tst.release.gpu.global.u32 {published}, %want;\n");
    let arrival = "\tatom.acq_rel.gpu.global.inc.u32";
    let without = ptx.replacen(&store, "", 1);
    let arrival_at = without.find(arrival).expect("the arrival");
    let before = format!(
        "{}{store}{}",
        &without[..arrival_at],
        &without[arrival_at..]
    );
    let error = publication_order(&before).expect_err("the store before the arrival");
    assert!(error.contains("before the arrival"), "{error}");
    let relaxed_store = ptx.replacen(
        &store,
        &store.replace("st.release.gpu", "st.relaxed.gpu"),
        1,
    );
    let error = publication_order(&relaxed_store).expect_err("a relaxed store");
    assert!(error.contains("not a release"), "{error}");
}

/// Whether the server's record exchanges change roles without copying: the path from
/// `$L_lane_exchange_record` (a request whose record is the earlier one) to
/// `$L_lane_record_ready` touches no shared memory, and every body call passes the
/// server's `%record` (the current copy's address) as its last argument.
fn records_change_roles(ptx: &str) -> Result<(), String> {
    let exchange = between(ptx, "$L_lane_exchange_record:", "$L_lane_record_ready:")
        .ok_or("no exchange path")?;
    if let Some(line) = exchange.iter().find(|line| line.contains(".shared")) {
        return Err(format!("the exchange path copies a record: {line}"));
    }
    let calls: Vec<&str> = ptx
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("call vyre_lane_body_"))
        .collect();
    if calls.is_empty() {
        return Err("no body call".into());
    }
    let passed = "st.param.b64 [vyre_lane_argument_record], %record;";
    if !ptx.lines().any(|line| line.trim() == passed) {
        return Err(format!(
            "no body gets the current record: `{passed}` is missing"
        ));
    }
    match calls
        .iter()
        .find(|call| !call.ends_with("vyre_lane_argument_record);"))
    {
        Some(call) => Err(format!("a body call without the record: {call}")),
        None => Ok(()),
    }
}

/// Locks out a lane whose chain requests copy their record between the block's two
/// shared copies (each request of a chain of two copied its whole record through one
/// thread's registers twice: 0.64 µs of record and prologue against 0.26 µs for a
/// repeated request on the H200), or whose bodies read a fixed copy while the server
/// exchanged roles (they would read the other request's bindings): the fixture lane
/// and the lane with pollers exchange by address and pass the current copy to every
/// body. Negative control: a shared store put into the exchange path, and a call
/// without the record, each fail the check.
#[test]
fn chain_requests_exchange_record_roles_without_copying() {
    let (_, pollers) = poller_lane(1, 4);
    for ptx in [fixture_lane(), pollers] {
        records_change_roles(&ptx).unwrap_or_else(|error| panic!("{error}"));
    }
    let ptx = fixture_lane();
    let copying = ptx.replacen(
        "$L_lane_exchange_record:",
        "$L_lane_exchange_record:\n\tst.shared.v4.u32 [%to], {%v0, %v1, %v2, %v3};",
        1,
    );
    let error = records_change_roles(&copying).expect_err("a copy in the exchange");
    assert!(error.contains("copies a record"), "{error}");
    let unpassed = ptx.replacen(", vyre_lane_argument_record);", ");", 1);
    let error = records_change_roles(&unpassed).expect_err("a call without the record");
    assert!(error.contains("without the record"), "{error}");
}

/// Locks out a lane body that reads its bindings or its grid anywhere but where the
/// host's record puts them (the host writes binding `i` at 64 + 16 i, its element
/// count 8 bytes on, the grid at 8): the offsets in the body's shared loads are
/// exactly those. Negative control: the plain kernel of the same program reads kernel
/// parameters, not the record.
#[test]
fn a_body_reads_its_bindings_and_grid_from_the_record() {
    let program = Program::builder([32, 1, 1])
        .buffer(
            "a",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer("b", 1, Access::ReadOnly, ElemType::U8, BufferCount::Runtime)
        .buffer(
            "c",
            2,
            Access::ReadWrite,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let sum = Expr::length("a") + Expr::length("b") + Expr::workgroup_count(Axis::Z);
            b.store("c", i, sum.cast(ScalarType::F32));
        })
        .build();
    let mut lane = LaneModuleBuilder::new(90, 32, [32, 1, 1]);
    lane.push(&program, &CodegenOptions::default()).unwrap();
    let ptx = lane.finish();
    let body =
        &ptx[ptx.find(".func vyre_lane_body_0").unwrap()..ptx.find(".visible .entry").unwrap()];
    let record = record_address(body);
    let offsets: Vec<usize> = body
        .match_indices(&record)
        .map(|(at, needle)| {
            let rest = &body[at + needle.len()..];
            rest[..rest.find(']').unwrap()].parse().unwrap()
        })
        .collect();
    let mut expected: Vec<usize> = (0..3)
        .flat_map(|i| {
            let entry = RECORD_BINDINGS_AT + RECORD_BINDING_BYTES * i;
            [entry, entry + 8]
        })
        .collect();
    expected.push(RECORD_GRID + 8);
    assert_eq!(offsets, expected, "{body}");
    assert!(
        !body.contains("vyre_ptr_") && !body.contains("%ctaid"),
        "{body}"
    );
    let plain = program_to_ptx(&program, &CodegenOptions::default(), 90, 32).unwrap();
    assert!(
        plain.contains("ld.param.u64 %rd0, [vyre_ptr_0]") && !plain.contains("vyre_lane_record")
    );
}

/// `[R+`, where `R` is the register a lane body loads its record's address into (its
/// last parameter): the prefix of every record read.
fn record_address(body: &str) -> String {
    let (parameter, _) = LANE_RECORD_PARAMETER;
    let load = body
        .lines()
        .find(|line| line.contains(&format!("[{parameter}]")))
        .unwrap_or_else(|| panic!("the body never reads {parameter}\n{body}"));
    let register = load
        .trim_start()
        .strip_prefix("ld.param.u64 ")
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("{load}"));
    format!("[{register}+")
}

/// Locks out a lane body that reads a scalar value anywhere but where the host's
/// record puts it (`record_scalar_at`: after the binding table, 8 bytes a value), at
/// another width (a 64-bit value cut to 32 bits), or from a kernel parameter a body
/// does not have, and a module the driver would refuse: the program with a scalar of
/// every type, as a lane body, loads scalar `p` with `ld.shared` of its type from
/// exactly `record_scalar_at(6, p)`, and ptxas assembles the lane for sm_90. Negative
/// control: the plain kernel of the same program reads `ld.param` scalars, not the
/// record.
#[test]
fn a_body_reads_its_scalars_from_the_record_and_assembles() {
    let program = support::every_scalar_type();
    let mut lane = LaneModuleBuilder::new(90, 32, [8, 1, 1]);
    lane.push(&program, &CodegenOptions::default()).unwrap();
    let ptx = lane.finish();
    let body =
        &ptx[ptx.find(".func vyre_lane_body_0").unwrap()..ptx.find(".visible .entry").unwrap()];
    let globals = program.global_buffers().len();
    assert_eq!(globals, 6);
    let record = record_address(body);
    for (position, ty) in ["u32", "u32", "f32", "u32", "u64", "u64"]
        .into_iter()
        .enumerate()
    {
        let at = record_scalar_at(globals, position);
        assert_eq!(
            at,
            RECORD_BINDINGS_AT + RECORD_BINDING_BYTES * 6 + 8 * position
        );
        let load = body
            .lines()
            .find(|line| line.contains(&format!("{record}{at}]")))
            .unwrap_or_else(|| panic!("scalar {position} is not read at {at}\n{body}"));
        assert!(
            load.trim_start().starts_with(&format!("ld.shared.{ty} ")),
            "{load}"
        );
    }
    assert!(!body.contains("vyre_scalar_"), "{body}");
    let plain = program_to_ptx(&program, &CodegenOptions::default(), 90, 32).unwrap();
    let reads_parameter = plain
        .lines()
        .any(|line| line.contains("ld.param.u64") && line.contains("[vyre_scalar_4]"));
    assert!(
        reads_parameter && !plain.contains("vyre_lane_record"),
        "{plain}"
    );
    let Some(ptxas) = ptxas::require("a_body_reads_its_scalars_from_the_record_and_assembles")
    else {
        return;
    };
    ptxas::assemble(&ptxas, "lane_scalars", &ptx).unwrap_or_else(|report| panic!("{report}"));
}

/// Locks out lanes the driver would refuse for some program the generator can make:
/// 120 generated programs (workgroup memory, barriers, both lowerings, local arrays,
/// loops, atomics, early returns, scalar parameters among them), grouped by workgroup
/// shape, each group one lane module, every module assembled by ptxas for sm_90; a
/// group of one shape holds several bodies sharing the workgroup pool.
#[test]
fn lanes_of_generated_programs_assemble_with_ptxas() {
    let Some(ptxas) = ptxas::require("lanes_of_generated_programs_assemble_with_ptxas") else {
        return;
    };
    let mut groups: BTreeMap<[u32; 3], LaneModuleBuilder> = BTreeMap::new();
    let mut with_scalars = 0;
    for seed in 0..120u64 {
        let case = valid_program(9_000 + seed, &GeneratorOptions::default());
        with_scalars += usize::from(!case.program.scalars().is_empty());
        let caps = LoweringCaps::new(seed % 2 == 0, 32).unwrap();
        let lowered = lower_workgroup_reductions(&case.program, &caps);
        let shape = lowered.workgroup_size();
        let lane = groups
            .entry(shape)
            .or_insert_with(|| LaneModuleBuilder::new(90, 32, shape));
        lane.push(&lowered, &case.config.codegen)
            .unwrap_or_else(|e| panic!("seed {}: {e}", 9_000 + seed));
    }
    assert!(
        groups.values().any(|lane| lane.len() >= 4),
        "some shape repeats"
    );
    assert!(with_scalars > 0, "no generated body has scalars");
    let directory = tempfile::tempdir().unwrap();
    for (index, (shape, lane)) in groups.into_iter().enumerate() {
        let bodies = lane.len();
        let ptx = lane.finish();
        ptxas::assemble_in(&ptxas, directory.path(), &format!("lane_{index}"), &ptx)
            .unwrap_or_else(|report| panic!("shape {shape:?}, {bodies} bodies: {report}"));
    }
}

/// Locks out a lane that accepts a body it would run wrongly, and a refusal that
/// leaves the builder half-changed: another workgroup shape and a grid sync are
/// `LaneBody` errors starting `Fix:`, after which the builder holds what it held
/// (the next body still gets index 1).
#[test]
fn the_builder_refuses_other_shapes_and_grid_sync_unchanged() {
    let mut lane = LaneModuleBuilder::new(90, 32, [32, 1, 1]);
    assert_eq!(lane.push(&doubling(), &CodegenOptions::default()), Ok(0));
    let wide = lane_programs::store_one([64, 1, 1], false);
    let synced = lane_programs::store_one([32, 1, 1], true);
    for (program, expected) in [(wide, "[64, 1, 1]"), (synced, "grid sync")] {
        let error = lane
            .push(&program, &CodegenOptions::default())
            .expect_err("not a body of this lane");
        assert!(matches!(error, CodegenError::LaneBody { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.starts_with("Fix:") && message.contains(expected),
            "{message}"
        );
        assert_eq!(lane.len(), 1);
    }
    assert_eq!(lane.push(&summing(), &CodegenOptions::default()), Ok(1));
}

/// The loads of one copy loop's batch in `ptx`: those of `load` between the loop's
/// label (the first line starting with `label`) and the first `store` after it.
fn loads_before_first_store(ptx: &str, label: &str, load: &str, store: &str) -> usize {
    ptx.lines()
        .skip_while(|line| !line.starts_with(label))
        .take_while(|line| !line.contains(store))
        .filter(|line| line.contains(load))
        .count()
}

/// Locks out a lane whose one-thread blocks (the measurement fixture's shape) wait
/// for memory once per eight units: a batch's stores need its loads' values, so the
/// next batch's loads start a round trip later, and sixteen readback windows took two
/// round trips, a 600-byte record from host memory five over PCIe. With one thread,
/// a batch holds sixteen windows and sixteen record chunks; ptxas assembles that lane.
/// Negative control: blocks of 32 threads, whose 64 windows at most are two a thread,
/// keep two in flight, and their record chunks eight.
#[test]
fn a_one_thread_lane_keeps_sixteen_copies_in_flight_and_assembles() {
    let batches = |workgroup: u32| {
        let program = vyre_cuda::fixtures::host_cost_fixture(17, 14);
        let program = if workgroup == 1 { program } else { summing() };
        let mut lane = LaneModuleBuilder::new(90, 32, [workgroup, 1, 1]);
        lane.push(&program, &CodegenOptions::default())
            .expect("a lane body");
        let ptx = lane.finish();
        let windows = loads_before_first_store(
            &ptx,
            "$L_lane_windows_",
            "ld.relaxed.gpu.global.v4.u32",
            "st.relaxed.sys.global.v2.u64",
        );
        let record = loads_before_first_store(
            &ptx,
            "$L_lane_record_",
            "ld.relaxed.sys.global.v4.u32",
            "st.shared.v4.u32",
        );
        (windows, record, ptx)
    };
    let (windows, record, ptx) = batches(1);
    assert_eq!((windows, record), (16, 16));
    let one_thread = ptx;
    let (windows, record, _) = batches(32);
    assert_eq!((windows, record), (2, 8));
    let Some(ptxas) =
        ptxas::require("a_one_thread_lane_keeps_sixteen_copies_in_flight_and_assembles")
    else {
        return;
    };
    ptxas::assemble(&ptxas, "lane_one_thread", &one_thread)
        .unwrap_or_else(|report| panic!("{report}"));
}

/// The fixture lane's bodies in a lane whose blocks hold `poller_warps` doorbell
/// pollers beside a workgroup of `[x, 1, 1]` (the bodies at that width).
fn poller_lane(x: u32, poller_warps: u32) -> (LaneModuleBuilder, String) {
    let mut lane = LaneModuleBuilder::with_poller_warps(90, 32, [x, 1, 1], poller_warps);
    for program in [doubling_at(x), summing_at(x)] {
        lane.push(&program, &CodegenOptions::default())
            .expect("a fixture is a lane body");
    }
    let shape = lane.clone();
    (shape, lane.finish())
}

/// Locks out a lane with doorbell-polling warps whose workgroup barriers wait for the
/// pollers (which never arrive: the lane would hang at its first barrier), whose
/// bodies take the block's size for the workgroup's, or whose pollers read a line that
/// is not their copy of the slot's doorbell (copy `p` of slot `s` at `(P s + p) * 128`,
/// as the host stores them: a first build read line `s`, so every slot but the first
/// hung): every barrier of the bodies and the server counts the workgroup's whole
/// warps, the block is launched flat with the pollers after those warps, no body reads
/// `%ntid`, the poller's line is `slot * P + poller`, and ptxas assembles it; a lane of
/// four pollers over a one-thread workgroup equals its reviewed snapshot. Negative
/// control: the same lane without pollers has uncounted barriers, which the check
/// would catch.
#[test]
fn poller_warps_stay_out_of_the_workgroups_barriers() {
    let counted = |ptx: &str, count: u32| {
        let barriers: Vec<&str> = ptx
            .lines()
            .map(str::trim)
            .filter(|line| line.starts_with("barrier.sync 0") || line.starts_with("barrier.sync 1"))
            .collect();
        !barriers.is_empty()
            && barriers
                .iter()
                .all(|line| line.ends_with(&format!(", {count};")))
    };
    let (_, reviewed) = poller_lane(1, 4);
    matches_snapshot(&reviewed, &snapshot_named("lane_pollers"))
        .unwrap_or_else(|message| panic!("{message}"));
    for (x, warps, whole) in [(1, 4, 32), (48, 2, 64), (64, 8, 64)] {
        let (lane, ptx) = poller_lane(x, warps);
        assert_eq!(lane.poller_warps(), warps);
        assert_eq!(lane.block_shape(), [whole + 32 * warps, 1, 1]);
        assert!(
            counted(&ptx, whole),
            "[{x}, 1, 1] with {warps} pollers:\n{ptx}"
        );
        assert!(ptx.contains(&format!(".reqntid {}, 1, 1", whole + 32 * warps)));
        assert!(!ptx.contains("%ntid"), "{ptx}");
        let line = format!("mad.lo.u32 %poller_slot, %poller_slot, {warps}, %poller_index;");
        assert!(ptx.lines().any(|l| l.trim() == line), "{ptx}");
        if let Some(ptxas) = ptxas::require("poller_warps_stay_out_of_the_workgroups_barriers") {
            ptxas::assemble(&ptxas, &format!("lane_pollers_{x}_{warps}"), &ptx)
                .unwrap_or_else(|report| panic!("{report}"));
        }
    }
    let (lane, ptx) = poller_lane(64, 0);
    assert_eq!(lane.poller_warps(), 0);
    assert_eq!(lane.block_shape(), [64, 1, 1]);
    assert!(!counted(&ptx, 64), "{ptx}");
}

/// Locks out poller warps where a block cannot hold them: a workgroup of more than
/// one dimension (the block is launched flat with pollers, which would change the
/// bodies' local ids) gets none, and a wide one gets only what fits 1,024 threads.
#[test]
fn poller_warps_fit_the_block() {
    assert_eq!(
        LaneModuleBuilder::with_poller_warps(90, 32, [8, 4, 1], 4).poller_warps(),
        0
    );
    assert_eq!(
        LaneModuleBuilder::with_poller_warps(90, 32, [1024, 1, 1], 4).poller_warps(),
        0
    );
    assert_eq!(
        LaneModuleBuilder::with_poller_warps(90, 32, [960, 1, 1], 4).poller_warps(),
        2
    );
    assert_eq!(
        LaneModuleBuilder::with_poller_warps(90, 32, [1, 1, 1], 100).poller_warps(),
        8
    );
}
