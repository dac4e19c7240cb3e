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
