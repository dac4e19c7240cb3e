//! The result ABI of the PTX back end (`codegen::program_to_ptx_with_results`): the
//! kernel stamps its own device time and its last thread copies readback ranges into
//! host-mapped memory. These tests need no GPU; `gpu_readback` runs the kernels.
//!
//! ptxas is found as `support/ptxas.rs` says; without it the assembler test prints
//! "skipped", unless `VYRE_REQUIRE_PTXAS=1`.

#[path = "support/ptxas.rs"]
mod ptxas;

use vyre_cuda::codegen::{program_to_ptx, program_to_ptx_with_results, RESULT_RANGE_SLOTS};
use vyre_cuda::fixtures::{chain_for_nodes, host_cost_fixture};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
use vyre_cuda::ir::*;
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::CodegenOptions;

fn early_return() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            b.if_(gid.clone().greater_equal(Expr::length("out")), |b| {
                b.return_();
            });
            b.store("out", gid.clone(), 7u32);
            b.return_();
        })
        .build()
}

/// Locks out a result-ABI kernel that lets a thread exit without counting itself
/// finished (the last thread would never be found, so no stamp and no readback would
/// ever be written): the only `ret` is the epilogue's last instruction, and every IR
/// `return` became a branch to the epilogue. Negative control: the plain ABI of the
/// same program has one `ret` per IR `return` plus the final one, and no result
/// parameters, so the check distinguishes the two.
#[test]
fn result_abi_kernels_exit_only_through_the_epilogue() {
    let program = early_return();
    let with = program_to_ptx_with_results(&program, &CodegenOptions::default(), 90, 32).unwrap();
    let plain = program_to_ptx(&program, &CodegenOptions::default(), 90, 32).unwrap();
    let rets = |ptx: &str| ptx.lines().filter(|l| l.trim() == "ret;").count();
    assert_eq!(rets(&with), 1, "{with}");
    assert!(with.trim_end().ends_with("ret;\n}") || with.trim_end().ends_with('}'));
    let last_instruction = with
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && *l != "}")
        .unwrap();
    assert_eq!(last_instruction, "ret;");
    assert_eq!(with.matches("bra $L_vyre_results;").count(), 2, "{with}");
    for parameter in [
        "vyre_control",
        "vyre_results",
        "vyre_launch_flags",
        "vyre_range_count",
        "vyre_ranges[256]",
    ] {
        assert!(
            with.contains(&format!(" {parameter}")),
            "{parameter} missing:\n{with}"
        );
        assert!(!plain.contains(parameter), "plain ABI has {parameter}");
    }
    assert_eq!(
        rets(&plain),
        3,
        "negative control: the plain ABI exits at each return"
    );
    assert_eq!(RESULT_RANGE_SLOTS * 16, 256);
}

/// Locks out result-ABI PTX that the driver JIT would reject: the fixture shapes the
/// benches use and 300 generated programs (grid syncs, barriers, early returns,
/// atomics, workgroup reductions lowered both ways) must assemble with ptxas.
#[test]
fn result_abi_kernels_assemble_with_ptxas() {
    let Some(ptxas) = ptxas::require("result_abi_kernels_assemble_with_ptxas") else {
        return;
    };
    let mut modules = Vec::new();
    let options = CodegenOptions::default();
    for (buffers, nodes) in [(2, 64), (9, 64), (17, 64), (9, 1024)] {
        let program = host_cost_fixture(buffers, chain_for_nodes(nodes));
        modules.push((
            format!("fixture_b{buffers}_n{nodes}"),
            program_to_ptx_with_results(&program, &options, 90, 32).unwrap(),
        ));
    }
    modules.push((
        "early_return".to_string(),
        program_to_ptx_with_results(&early_return(), &options, 90, 32).unwrap(),
    ));
    let generator = GeneratorOptions {
        allow_grid_sync: true,
        ..Default::default()
    };
    for seed in 0..300u64 {
        let case = valid_program(seed, &generator);
        let caps = LoweringCaps {
            subgroup_ops: seed % 2 == 0,
            subgroup_size: 32,
        };
        let program = lower_workgroup_reductions(&case.program, &caps);
        let sm = if seed % 7 == 3 { 70 } else { 90 };
        let ptx = program_to_ptx_with_results(&program, &case.config.codegen, sm, 32)
            .unwrap_or_else(|e| panic!("program {seed}: {e}\n{program}"));
        modules.push((format!("generated_{seed}"), ptx));
    }
    let directory = tempfile::tempdir().unwrap();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let halves: Vec<_> = (0..2)
            .map(|worker| {
                let (modules, ptxas, directory) = (&modules, &ptxas, directory.path());
                scope.spawn(move || {
                    modules
                        .iter()
                        .skip(worker)
                        .step_by(2)
                        .filter_map(|(name, ptx)| {
                            ptxas::assemble_in(ptxas, directory, name, ptx).err()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "{} modules rejected; first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// Locks out the atomic-free single-warp epilogue where it could deadlock or miss a
/// thread: it is emitted (guarded by a run-time one-block check) only for programs of
/// at most 32 threads whose body has no barrier or subgroup operation; a 64-thread
/// program and a 32-thread program with a barrier get only the counting epilogue.
#[test]
fn single_warp_epilogue_only_where_every_lane_reaches_it() {
    let options = CodegenOptions::default();
    let ptx = |program: &Program| program_to_ptx_with_results(program, &options, 90, 32).unwrap();
    let has_fast = |text: &str| text.contains("$L_results_general_");
    assert!(
        has_fast(&ptx(&host_cost_fixture(9, 64))),
        "one thread, no barrier"
    );
    let wide = |threads: u32, barrier: bool| {
        Program::builder([threads, 1, 1])
            .buffer(
                "out",
                0,
                Access::ReadWrite,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .body(move |b| {
                let i = b.let_("i", Expr::global_id(Axis::X));
                if barrier {
                    b.barrier();
                }
                b.if_(i.clone().less_than(Expr::length("out")), |b| {
                    b.store("out", i.clone(), i.clone());
                });
            })
            .build()
    };
    assert!(
        has_fast(&ptx(&wide(32, false))),
        "a full warp without barriers"
    );
    assert!(
        !has_fast(&ptx(&wide(64, false))),
        "two warps need the counter"
    );
    assert!(!has_fast(&ptx(&wide(32, true))), "a barrier can hold lanes");
    // Both variants still count through the control block when several blocks run.
    for text in [ptx(&wide(32, false)), ptx(&wide(64, false))] {
        assert!(text.contains("atom.acq_rel.gpu.global.add.u64"), "{text}");
    }
}

/// Locks out an epilogue that evaluates every descriptor slot whatever the range
/// count: predicated-off loads of all 16 slots cost 1.5 µs per dispatch on the H200
/// with no range described (2026-12-01, `EpilogueAnatomy` and the result-ABI rows of
/// the dispatch bench). The leader's window slots come in groups; each group must
/// first branch out of the load sequence, and again out of the store sequence, when
/// the window count does not reach it, before any of its descriptor words is read,
/// and every window copy inside a group is predicated on its own slot. Negative
/// control: the same check on the text with the guards removed finds the first
/// slot's descriptor read unguarded.
#[test]
fn epilogue_jumps_over_descriptor_slots_past_the_count() {
    let program = host_cost_fixture(9, chain_for_nodes(64));
    let ptx = program_to_ptx_with_results(&program, &CodegenOptions::default(), 90, 32)
        .expect("fixture PTX");
    let guards = |text: &str| -> Result<(), String> {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let load_guard = |l: &str| l.contains("bra $L_results_windows_loaded");
        let store_guard = |l: &str| l.contains("bra $L_results_windows_stored");
        let mut slot = 0;
        while slot < RESULT_RANGE_SLOTS {
            let read = format!("[vyre_ranges+{}];", 16 * slot);
            let at = lines
                .iter()
                .position(|l| l.starts_with("ld.param.u64") && l.ends_with(&read))
                .ok_or_else(|| format!("slot {slot}: no descriptor read"))?;
            if !lines[..at].iter().rev().take(2).any(|l| load_guard(l)) {
                return Err(format!(
                    "slot {slot}: descriptor read without a guard before it"
                ));
            }
            // The group runs until the next guard.
            let group = lines[at..]
                .iter()
                .take_while(|l| !load_guard(l) && !l.starts_with("$L_results_windows_loaded"))
                .filter(|l| l.starts_with("ld.param.u64"))
                .count();
            if group == 0 {
                return Err(format!("slot {slot}: an empty group"));
            }
            slot += group;
        }
        let loads = lines.iter().filter(|l| load_guard(l)).count();
        let stores = lines.iter().filter(|l| store_guard(l)).count();
        if loads == 0 || stores != loads {
            return Err(format!("{loads} load guards but {stores} store guards"));
        }
        for line in &lines {
            let copy =
                line.contains("ld.relaxed.gpu.global.v4.u32") || line.contains("st.global.v4.u32");
            if copy && !line.starts_with('@') {
                return Err(format!("an unpredicated window copy: {line}"));
            }
        }
        Ok(())
    };
    guards(&ptx).expect("every slot is guarded");
    let unguarded: String = ptx
        .lines()
        .filter(|l| !l.contains("bra $L_results_windows_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let error = guards(&unguarded).expect_err("the negative control must fail");
    assert!(error.starts_with("slot 0:"), "{error}");
}

/// `early_return` at `threads` threads per workgroup, with `workgroup_words` words
/// of workgroup memory (none at 0) written behind a barrier.
fn early_return_at(threads: u32, workgroup_words: u32) -> Program {
    let mut builder = Program::builder([threads, 1, 1]).buffer(
        "out",
        0,
        Access::WriteOnly,
        ElemType::U32,
        BufferCount::Runtime,
    );
    if workgroup_words > 0 {
        builder = builder.buffer(
            "scratch",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(workgroup_words),
        );
    }
    builder
        .body(move |b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            if workgroup_words > 0 {
                b.store("scratch", Expr::local_id(Axis::X), gid.clone());
                b.barrier();
            }
            b.if_(gid.clone().greater_equal(Expr::length("out")), |b| {
                b.return_();
            });
            b.store("out", gid.clone(), 7u32);
        })
        .build()
}

/// What the block-counting epilogue must hold, as lines of the kernel: the
/// counter is zeroed by one thread, before the entry barrier, before any thread
/// can branch to the epilogue; each group adds its lanes to it with one
/// block-scope atomic; only the group that completes the block passes a branch to
/// the end, fences at device scope and adds the block's `threads` to the control
/// word, the one device-scope atomic of the kernel.
fn block_counting(ptx: &str, threads: u32) -> Result<(), String> {
    let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
    let find = |what: &dyn Fn(&str) -> bool| lines.iter().position(|l| what(l));
    let count = |what: &dyn Fn(&str) -> bool| lines.iter().filter(|l| what(l)).count();
    if count(&|l| l == ".shared .align 4 .u32 vyre_block_finished;") != 1 {
        return Err("no block counter declared".into());
    }
    let zero =
        |l: &str| l.starts_with('@') && l.ends_with("st.shared.u32 [vyre_block_finished], 0;");
    if count(&zero) != 1 {
        return Err("the counter is not zeroed exactly once".into());
    }
    let zeroed = find(&zero).unwrap();
    let barrier = find(&|l| l == "bar.sync 0;").ok_or("no entry barrier")?;
    let first_exit = find(&|l| l.contains("$L_vyre_results")).ok_or("no epilogue")?;
    if !(zeroed < barrier && barrier < first_exit) {
        return Err(format!(
            "the counter is not zeroed before the entry barrier before any exit \
             (store {zeroed}, barrier {barrier}, first exit {first_exit})"
        ));
    }
    let block_atomic = |l: &str| l.contains("atom.acq_rel.cta.shared.add.u32");
    let grid_atomic = |l: &str| l.contains("atom.acq_rel.gpu.global.add.u64");
    if count(&block_atomic) != 1 || count(&grid_atomic) != 1 {
        return Err("not one block atomic and one device atomic".into());
    }
    let (block_at, grid_at) = (find(&block_atomic).unwrap(), find(&grid_atomic).unwrap());
    if !lines[block_at].contains("[vyre_block_finished], %r") {
        return Err(format!(
            "the block atomic is not on the counter: {}",
            lines[block_at]
        ));
    }
    let between = &lines[block_at..grid_at];
    let skip = between
        .iter()
        .position(|l| l.starts_with("@%p") && l.contains("bra $L_results_done_"))
        .ok_or("every group reaches the device atomic")?;
    if !between[skip..].contains(&"fence.acq_rel.gpu;") {
        return Err("no device-scope fence before the device atomic".into());
    }
    let added = lines[grid_at]
        .rsplit(", ")
        .next()
        .and_then(|operand| operand.strip_suffix(';'))
        .ok_or("no operand")?;
    if !between.contains(&format!("mov.u64 {added}, {threads};").as_str()) {
        return Err(format!(
            "the device atomic does not add the block's {threads} threads"
        ));
    }
    Ok(())
}

/// Locks out the defects counting per block could bring: a counter read before it
/// is zeroed (shared memory starts undefined, and an early `return` reaches the
/// epilogue at once), a group other than the block's last reaching the device
/// atomic (the grid count would pass its total and no group would ever be last),
/// and a device atomic that does not add the whole block. A 256-thread kernel with
/// early returns, with and without workgroup memory (whose zeroing barrier the
/// counter then shares: one entry barrier only), passes `block_counting`. Negative
/// controls: the same text without its entry barrier, with the zero moved after
/// it, without the branch that holds back the block's other groups, and the
/// per-group epilogue of a one-warp kernel each fail it.
#[test]
fn one_device_atomic_per_block_after_a_counter_zeroed_at_entry() {
    let options = CodegenOptions::default();
    let ptx = |program: &Program| program_to_ptx_with_results(program, &options, 90, 32).unwrap();
    let plain = ptx(&early_return_at(256, 0));
    block_counting(&plain, 256).unwrap_or_else(|e| panic!("{e}\n{plain}"));
    let shared = ptx(&early_return_at(96, 96));
    block_counting(&shared, 96).unwrap_or_else(|e| panic!("{e}\n{shared}"));
    let entry_barriers = |text: &str| {
        text.lines()
            .take_while(|l| !l.contains("gid"))
            .filter(|l| l.trim() == "bar.sync 0;")
            .count()
    };
    assert_eq!(entry_barriers(&shared), 1, "{shared}");
    assert_eq!(entry_barriers(&plain), 1, "{plain}");

    let without_barrier = plain.replacen("\tbar.sync 0;\n", "", 1);
    assert!(block_counting(&without_barrier, 256)
        .expect_err("negative control: no barrier")
        .contains("entry barrier"));
    let zero_line = plain
        .lines()
        .find(|l| l.contains("st.shared.u32 [vyre_block_finished], 0;"))
        .unwrap();
    let late_zero = plain.replacen(&format!("{zero_line}\n"), "", 1).replacen(
        "\tbar.sync 0;\n",
        &format!("\tbar.sync 0;\n{zero_line}\n"),
        1,
    );
    assert!(block_counting(&late_zero, 256)
        .expect_err("negative control: zeroed after the barrier")
        .contains("entry barrier"));
    let every_group: String = plain
        .lines()
        .filter(|l| !l.contains("bra $L_results_done_"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(block_counting(&every_group, 256)
        .expect_err("negative control: every group goes on")
        .contains("every group"));
    let one_warp = ptx(&early_return_at(32, 0));
    assert!(block_counting(&one_warp, 32)
        .expect_err("negative control: the per-group epilogue")
        .contains("no block counter"));
    assert_eq!(
        one_warp.matches("atom.acq_rel.gpu.global.add.u64").count(),
        1
    );
}

/// Locks out a block counter that pushes a kernel's static shared memory past
/// the 48 KiB ptxas accepts, or that collides with the dynamic pool: a kernel
/// whose workgroup buffers leave 4 bytes of the static limit gets the counter (and
/// ptxas assembles it at exactly 48 KiB), one at the limit and one past it (the
/// dynamic pool, which may be sized to the device's whole opt-in limit) keep the
/// per-group count, which the check tells apart (negative control). In a module of
/// several kernels each has its own counter symbol.
#[test]
fn block_counter_only_where_static_shared_memory_has_room() {
    let options = CodegenOptions::default();
    let ptx = |program: &Program| program_to_ptx_with_results(program, &options, 90, 32).unwrap();
    let limit_words = vyre_cuda::codegen::ptx::MAX_STATIC_SHARED_BYTES / 4;
    let fits = ptx(&early_return_at(256, limit_words - 1));
    block_counting(&fits, 256).unwrap_or_else(|e| panic!("{e}\n{fits}"));
    for words in [limit_words, limit_words + 1] {
        let text = ptx(&early_return_at(256, words));
        assert!(
            !text.contains("vyre_block_finished"),
            "{words} words: {text}"
        );
        assert!(block_counting(&text, 256).is_err());
        assert_eq!(text.matches("atom.acq_rel.gpu.global.add.u64").count(), 1);
        assert!(text.contains("fence.acq_rel.gpu;"));
    }
    let mut module = vyre_cuda::codegen::PtxModuleBuilder::with_results(&options, 90, 32);
    for program in [
        early_return_at(256, 0),
        early_return_at(32, 0),
        early_return_at(64, 4),
    ] {
        module.push(&program).expect("push");
    }
    let module = module.finish();
    for kernel in [0, 2] {
        let declaration = format!(".shared .align 4 .u32 vyre_block_finished_{kernel};");
        assert_eq!(module.matches(&declaration).count(), 1, "{module}");
    }
    assert!(!module.contains("vyre_block_finished_1"), "{module}");

    let Some(ptxas) = ptxas::require("block_counter_only_where_static_shared_memory_has_room")
    else {
        return;
    };
    let at_limit = ptx(&early_return_at(256, limit_words));
    let modules = [
        ("counter_fits", fits.as_str()),
        ("counter_left_out", at_limit.as_str()),
        ("counter_module", module.as_str()),
    ];
    ptxas::assemble_all(&ptxas, modules).unwrap_or_else(|failures| panic!("{failures}"));
    // Negative control: the counter in use beside 48 KiB of static buffers is what
    // ptxas refuses (an unused declaration it would drop).
    let fitting = format!("[{}];", 4 * (limit_words - 1));
    assert_eq!(fits.matches(&fitting).count(), 1, "{fits}");
    let over = fits.replacen(&fitting, &format!("[{}];", 4 * limit_words), 1);
    let error = ptxas::assemble(&ptxas, "counter_over_limit", &over)
        .expect_err("ptxas took 48 KiB + 4 of static shared memory");
    assert!(error.contains("shared"), "{error}");
}
