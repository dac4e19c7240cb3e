//! Hostile input through lowering, PTX generation and the reference interpreter
//!: nesting 10^6 deep on a 2 MiB thread, blocks shared 2^64 ways, 1 MiB
//! names, subgroup sizes that do not match, grids too large to hold, runaway work.
//! Every entry point must answer promptly with a `Fix:` error (or the right result),
//! never overflow the stack, hang, or allocate gigabytes.

use std::sync::Arc;

use vyre_cuda::codegen::ptx::MAX_PTX_BYTES;
use vyre_cuda::codegen::{program_to_ptx, CodegenError};
use vyre_cuda::ir::validate::Rule;
use vyre_cuda::ir::*;
use vyre_cuda::lower::{
    lower, lower_workgroup_reductions, lowered_subgroup_size, LoweringCaps, LoweringError,
};
use vyre_cuda::reference::{self, ReferenceOptions};
use vyre_cuda::{CodegenOptions, DispatchConfig};

const WARP: LoweringCaps = LoweringCaps {
    subgroup_ops: true,
    subgroup_size: 32,
};

/// Stack of the threads the deep tests run on: what a caller on a worker pool has.
const SMALL_STACK: usize = 2 << 20;

/// Run `work` on a fresh thread with a 2 MiB stack and return its answer (a stack
/// overflow aborts the whole test binary, which is the defect these tests lock out).
fn on_small_stack<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(work)
        .expect("spawn")
        .join()
        .expect("the worker panicked")
}

fn out_buffer() -> BufferDecl {
    BufferDecl::new(
        "out",
        0,
        Access::ReadWrite,
        ElemType::U32,
        BufferCount::Static(1),
    )
}

/// `levels` nested ifs around one store, built iteratively.
fn nested_ifs(levels: usize) -> Program {
    let mut block: Block = Arc::from(vec![Node::Store {
        buffer: "out".into(),
        index: Expr::u32(0),
        value: Expr::u32(7),
    }]);
    for _ in 0..levels {
        block = Arc::from(vec![Node::If {
            condition: Expr::bool(true),
            then_body: block,
            else_body: Arc::from(Vec::new()),
        }]);
    }
    Program::new(vec![out_buffer()], [1, 1, 1], block.to_vec())
}

/// One store of an expression `levels` deep (`((7 + 1) + 1) ...`), built iteratively.
fn nested_expression(levels: usize) -> Program {
    let mut value = Expr::u32(7);
    for _ in 0..levels {
        value = value + 1u32;
    }
    Program::new(
        vec![out_buffer()],
        [1, 1, 1],
        vec![Node::Store {
            buffer: "out".into(),
            index: Expr::u32(0),
            value,
        }],
    )
}

/// `b = [If { then: b, else: b }]`, `levels` times, around `leaf`: 2^levels paths
/// through `levels + 1` allocations.
fn shared_blocks(levels: usize, leaf: Vec<Node>, workgroup: [u32; 3]) -> Program {
    let mut block: Block = Arc::from(leaf);
    for level in 0..levels {
        // A uniform condition that the validator cannot fold away.
        let condition = Expr::workgroup_id(Axis::X).equals(level as u32);
        block = Arc::from(vec![Node::If {
            condition,
            then_body: block.clone(),
            else_body: block,
        }]);
    }
    Program::new(vec![out_buffer()], workgroup, block.to_vec())
}

fn rule_of_codegen(result: Result<String, CodegenError>) -> Rule {
    match result {
        Err(CodegenError::Invalid(error)) => {
            assert!(error.message().starts_with("Fix:"), "{error}");
            error.rule()
        }
        other => panic!(
            "expected the validator's error, got {:?}",
            other.map(|p| p.len())
        ),
    }
}

fn rule_of_lowering(result: Result<Program, LoweringError>) -> Rule {
    match result {
        Err(LoweringError::Invalid(error)) => error.rule(),
        other => panic!("expected the validator's error, got {other:?}"),
    }
}

/// Defect locked out: PTX emission, lowering and the interpreter recurse once per
/// nesting level before (or without) validating, so a program nested 10^6 deep
/// overflows a 2 MiB thread's stack (it did at 3.1k levels for PTX, 5.9k for
/// lowering) and aborts the process. Each must return `NestingTooDeep`.
/// Negative control: the same shapes 100 deep go through every entry point on the
/// same small stack, so the guard is not refusing everything.
#[test]
fn nesting_a_million_deep_is_refused_on_a_small_stack() {
    for (shape, build) in [
        ("ifs", nested_ifs as fn(usize) -> Program),
        ("expression", nested_expression),
    ] {
        let rules = on_small_stack(move || {
            let program = build(1_000_000);
            let ptx = rule_of_codegen(program_to_ptx(&program, &CodegenOptions::default(), 90, 32));
            let lowered = rule_of_lowering(lower(&program, &WARP));
            let unchanged = lower_workgroup_reductions(&program, &WARP);
            assert!(Program::ptr_eq(&unchanged, &program));
            let reference = reference::run(&program, &[&[0; 4]], &DispatchConfig::linear(1))
                .expect_err("a program nested 10^6 deep must be refused")
                .to_string();
            // Dropping them here, on the small stack, is part of the check.
            drop(unchanged);
            drop(program);
            (ptx, lowered, reference)
        });
        assert_eq!(rules.0, Rule::NestingTooDeep, "{shape}");
        assert_eq!(rules.1, Rule::NestingTooDeep, "{shape}");
        assert!(
            rules.2.starts_with("Fix:") && rules.2.contains("nest deeper"),
            "{shape}: {}",
            rules.2
        );

        // Negative control.
        let outputs = on_small_stack(move || {
            let program = build(100);
            program_to_ptx(&program, &CodegenOptions::default(), 90, 32).expect("ptx");
            lower(&program, &WARP).expect("lower");
            reference::run(&program, &[&[0; 4]], &DispatchConfig::linear(1)).expect("run")
        });
        assert_ne!(outputs[0], [0; 4], "{shape}");
    }
}

/// Defect locked out: `b = [If { then: b, else: b }]` 64 times describes 2^64
/// statements in 65 allocations; a walk that follows every path never ends and PTX
/// of it takes gigabytes. Lowering, PTX and the interpreter must refuse it
/// promptly (`TooManyNodes`); the scan for reductions visits each allocation once.
#[test]
fn blocks_shared_two_to_the_64_ways_are_refused_promptly() {
    let leaf = vec![Node::WorkgroupReduce {
        name: "r".into(),
        op: ReduceOp::Sum,
        value: Expr::u32(1),
    }];
    let program = shared_blocks(64, leaf, [64, 1, 1]);
    assert!(needs_lowering_of(&program));
    assert_eq!(rule_of_lowering(lower(&program, &WARP)), Rule::TooManyNodes);
    assert!(Program::ptr_eq(
        &lower_workgroup_reductions(&program, &WARP),
        &program
    ));
    let error = program_to_ptx(&program, &CodegenOptions::default(), 90, 32);
    assert!(matches!(error, Err(CodegenError::Invalid(_))), "{error:?}");
    let error = reference::run(&program, &[&[0; 4]], &DispatchConfig::linear(1)).unwrap_err();
    assert!(error.to_string().contains("more than"), "{error}");
}

fn needs_lowering_of(program: &Program) -> bool {
    vyre_cuda::lower::needs_lowering(program)
}

/// Defect locked out: lowering rewrites a shared block once per path through it, so
/// its output grows to the expanded tree (2^levels copies) and every copy gets its
/// own shared-memory buffer. A shared block must be rewritten once and stay shared.
/// Checked on 10 levels (1,024 paths): the lowered program's arms are still one
/// allocation, it declares exactly one reduction buffer, and it computes what the
/// original computes (the workgroup sum of 64 ones is 64, stored by lane 0).
/// Negative control: the same program with unshared (equal but separate) blocks
/// lowers to separate blocks.
#[test]
fn a_shared_block_is_lowered_once_and_stays_shared() {
    let leaf = vec![
        Node::WorkgroupReduce {
            name: "r".into(),
            op: ReduceOp::Sum,
            value: Expr::u32(1),
        },
        Node::If {
            condition: Expr::local_id(Axis::X).equals(0u32),
            then_body: Arc::from(vec![Node::Store {
                buffer: "out".into(),
                index: Expr::u32(0),
                value: Expr::var("r"),
            }]),
            else_body: Arc::from(Vec::new()),
        },
    ];
    check_shared_block_lowered_once(leaf);
}

/// Defect locked out: the same for a workgroup scan (the prefix sum of 64 ones is
/// 64 in the last thread, which stores it).
#[test]
fn a_shared_block_with_a_scan_is_lowered_once_and_stays_shared() {
    let leaf = vec![
        Node::WorkgroupScan {
            name: "s".into(),
            op: ReduceOp::Sum,
            kind: ScanKind::Inclusive,
            value: Expr::u32(1),
        },
        Node::If {
            condition: Expr::local_id(Axis::X).equals(63u32),
            then_body: Arc::from(vec![Node::Store {
                buffer: "out".into(),
                index: Expr::u32(0),
                value: Expr::var("s"),
            }]),
            else_body: Arc::from(Vec::new()),
        },
    ];
    check_shared_block_lowered_once(leaf);
}

/// `leaf` (a collective and a store of 64 into `out[0]`) under 10 levels of shared
/// blocks lowers once into one shared block with one buffer and computes 64; the
/// same leaf in two separate arms lowers to two blocks.
fn check_shared_block_lowered_once(leaf: Vec<Node>) {
    let program = shared_blocks(10, leaf.clone(), [64, 1, 1]);
    let lowered = lower(&program, &WARP).expect("lower");
    assert!(arms_shared(&lowered), "{lowered}");
    let collective_buffers = lowered
        .buffers()
        .iter()
        .filter(|b| b.access == Access::Workgroup)
        .count();
    assert_eq!(collective_buffers, 1);
    let expected = reference::run(&program, &[&[0; 4]], &DispatchConfig::linear(1)).unwrap();
    let actual = reference::run(&lowered, &[&[0; 4]], &DispatchConfig::linear(1)).unwrap();
    assert_eq!(expected, actual);
    assert_eq!(actual[0], 64u32.to_le_bytes());

    // Negative control: unshared arms stay distinct allocations after lowering.
    let unshared = Program::new(
        vec![out_buffer()],
        [64, 1, 1],
        vec![Node::If {
            condition: Expr::workgroup_id(Axis::X).equals(0u32),
            then_body: Arc::from(leaf.clone()),
            else_body: Arc::from(leaf),
        }],
    );
    let lowered = lower(&unshared, &WARP).expect("lower");
    assert!(!arms_shared(&lowered), "{lowered}");
}

/// Whether the first `if` of `program`'s entry has one block for both arms.
fn arms_shared(program: &Program) -> bool {
    match program
        .entry()
        .iter()
        .find(|node| matches!(node, Node::If { .. }))
    {
        Some(Node::If {
            then_body,
            else_body,
            ..
        }) => Arc::ptr_eq(then_body, else_body),
        _ => panic!("no if in\n{program}"),
    }
}

/// Defect locked out: PTX of shared blocks grows with the expanded tree without
/// bound (the validator admits 2^20 copies of a store, about 300 MB of PTX).
/// Emission must stop at the module limit with `TooLarge`. Negative control: 8
/// levels (256 copies) emit normally.
#[test]
fn ptx_of_many_shared_copies_stops_at_the_size_limit() {
    let leaf = vec![Node::Store {
        buffer: "out".into(),
        index: Expr::u32(0),
        value: Expr::u32(7),
    }];
    let program = shared_blocks(18, leaf.clone(), [1, 1, 1]);
    match program_to_ptx(&program, &CodegenOptions::default(), 90, 32) {
        Err(error @ CodegenError::TooLarge { limit_bytes, .. }) => {
            assert_eq!(limit_bytes, MAX_PTX_BYTES);
            assert!(error.to_string().starts_with("Fix: split"), "{error}")
        }
        other => panic!("expected TooLarge, got {:?}", other.map(|p| p.len())),
    }
    // The largest program the seed comparison uses (4,096 nodes, 9 buffers) is far
    // below the limit.
    let fixture =
        vyre_cuda::fixtures::host_cost_fixture(9, vyre_cuda::fixtures::chain_for_nodes(4096));
    let fixture_ptx = program_to_ptx(&fixture, &CodegenOptions::default(), 90, 32).expect("ptx");
    assert!(
        fixture_ptx.len() * 20 < MAX_PTX_BYTES,
        "{} bytes",
        fixture_ptx.len()
    );
    let small = shared_blocks(8, leaf, [1, 1, 1]);
    let ptx = program_to_ptx(&small, &CodegenOptions::default(), 90, 32).expect("ptx");
    assert_eq!(ptx.matches("st.global.u32").count(), 256);
}

/// Defect locked out: names are copied whole into PTX comments, so a 1 MiB name
/// used 500 times made 1 GB of PTX. The module's size must not depend on the name's
/// length (64 KiB and 128 KiB names used 400 times: 26 and 52 MB uncapped), and a
/// comment must still show the start of the name. Negative control: a short name
/// appears whole.
#[test]
fn long_names_do_not_multiply_into_the_ptx() {
    let build = |name: &str| {
        let name: Name = name.into();
        let body = (0..200u32)
            .map(|i| Node::Store {
                buffer: name.clone(),
                index: Expr::u32(0),
                value: Expr::Load {
                    buffer: name.clone(),
                    index: Box::new(Expr::u32(0)),
                } + i,
            })
            .collect();
        let buffer = BufferDecl::new(
            name,
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        );
        Program::new(vec![buffer], [1, 1, 1], body)
    };
    let long_name = format!("n{}", "x".repeat(64 << 10));
    let ptx = program_to_ptx(&build(&long_name), &CodegenOptions::default(), 90, 32).unwrap();
    let longer_name = format!("n{}", "x".repeat(128 << 10));
    let longer = program_to_ptx(&build(&longer_name), &CodegenOptions::default(), 90, 32).unwrap();
    assert_eq!(ptx.len(), longer.len());
    assert!(ptx.len() < 200 << 10, "{} bytes of PTX", ptx.len());
    assert!(
        ptx.contains("// nxxxxxxxx"),
        "comments keep the start of the name"
    );
    assert!(ptx.contains("..."), "a truncated comment says so");

    let ptx = program_to_ptx(&build("short"), &CodegenOptions::default(), 90, 32).unwrap();
    assert!(ptx.contains("short[0u] = (short[0u] + 199u)"), "{ptx}");
}

fn sum_of_ones(threads: u32) -> Program {
    Program::builder([threads, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            let total = b.workgroup_reduce("total", ReduceOp::Sum, 1u32);
            b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
                b.store("out", 0u32, total);
            });
        })
        .build()
}

fn run_with_subgroups(program: &Program, subgroup_size: u32) -> Result<u32, String> {
    let options = ReferenceOptions {
        subgroup_size,
        ..ReferenceOptions::default()
    };
    reference::run_with_options(program, &[&[0; 4]], &DispatchConfig::linear(1), &options)
        .map(|out| u32::from_le_bytes([out[0][0], out[0][1], out[0][2], out[0][3]]))
        .map_err(|e| e.to_string())
}

/// Defect locked out: a workgroup sum of 64 lowered for 16-lane (or 1- or 64-lane)
/// subgroups read 128 (2048, 32) when emitted or interpreted for 32 lanes, and every
/// later check passed. The lowered program records its size; PTX for 32 lanes and
/// an interpretation at 32 lanes refuse it. Negative controls: interpreted at its
/// own size it gives 64, and the program lowered for 32 emits and gives 64.
#[test]
fn a_program_lowered_for_one_subgroup_size_is_refused_for_another() {
    let program = sum_of_ones(64);
    for size in [1, 16, 64] {
        let caps = LoweringCaps::new(true, size).expect("caps");
        let lowered = lower(&program, &caps).expect("lower");
        assert_eq!(lowered_subgroup_size(&lowered), Some(size));
        let error = program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32).unwrap_err();
        assert_eq!(
            error,
            CodegenError::LoweredForOtherSubgroupSize {
                lowered_for: size,
                subgroup_size: 32
            }
        );
        assert!(
            error.to_string().starts_with("Fix: lower the program"),
            "{error}"
        );
        let refused = run_with_subgroups(&lowered, 32).unwrap_err();
        assert!(
            refused.starts_with("Fix:") && refused.contains("lowered for"),
            "{refused}"
        );
        assert_eq!(
            run_with_subgroups(&lowered, size),
            Ok(64),
            "lowered for {size}"
        );
    }
    let lowered = lower(&program, &WARP).expect("lower");
    assert_eq!(lowered_subgroup_size(&lowered), Some(32));
    program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32).expect("ptx");
    assert_eq!(run_with_subgroups(&lowered, 32), Ok(64));
    // The tree form does not depend on the subgroup size: nothing is recorded.
    let tree = lower(
        &program,
        &LoweringCaps {
            subgroup_ops: false,
            subgroup_size: 16,
        },
    )
    .unwrap();
    assert_eq!(lowered_subgroup_size(&tree), None);
    assert_eq!(run_with_subgroups(&tree, 32), Ok(64));
}

/// Defect locked out: capabilities that make no sense (subgroup ops on 0-lane
/// subgroups) are accepted silently. Negative control: the device's caps pass.
#[test]
fn senseless_lowering_caps_get_a_fix_error() {
    let error = LoweringCaps::new(true, 0).unwrap_err();
    assert!(
        error.to_string().starts_with("Fix: derive LoweringCaps"),
        "{error}"
    );
    let caps = LoweringCaps {
        subgroup_ops: true,
        subgroup_size: 0,
    };
    assert_eq!(lower(&sum_of_ones(64), &caps).unwrap_err(), error);
    assert!(LoweringCaps::new(true, 32).is_ok());
    assert!(LoweringCaps::new(false, 0).is_ok());
}

/// Defect locked out: `DispatchConfig::new([u32::MAX, 1, 1])` allocated every
/// per-lane vector up front (past 3 GB in 4 s, then an OOM kill). The run must be
/// refused before allocating, with the bytes in the message. Negative control: the
/// estimate is the threshold: a small run whose budget is set to exactly its
/// estimate runs, one byte less is refused.
#[test]
fn a_grid_too_large_to_hold_is_refused_before_allocating() {
    let program = Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.store("out", i.clone(), i);
        })
        .build();
    let error = reference::run(&program, &[&[0; 4]], &DispatchConfig::new([u32::MAX, 1, 1]))
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("Fix:") && error.contains("bytes") && error.contains("max_memory_bytes"),
        "{error}"
    );

    let small = DispatchConfig::linear(1000);
    let tight = ReferenceOptions {
        max_memory_bytes: 1000,
        ..ReferenceOptions::default()
    };
    let error = reference::run_with_options(&program, &[&[0; 4000]], &small, &tight)
        .unwrap_err()
        .to_string();
    let needed: u64 = error
        .split("needs about ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {error}"));
    let exact = ReferenceOptions {
        max_memory_bytes: needed,
        ..ReferenceOptions::default()
    };
    let out = reference::run_with_options(&program, &[&[0; 4000]], &small, &exact).unwrap();
    assert_eq!(&out[0][4..8], &1u32.to_le_bytes());
    let short = ReferenceOptions {
        max_memory_bytes: needed - 1,
        ..ReferenceOptions::default()
    };
    assert!(reference::run_with_options(&program, &[&[0; 4000]], &small, &short).is_err());
}

/// Defect locked out: kernel runs were not work, so `fixpoint_iterations = u32::MAX`
/// over an empty body never tripped the cap (about 30 minutes). Negative control:
/// 1,000 iterations of the same program finish, and cost one unit per lane per run.
#[test]
fn fixpoint_iterations_count_against_the_work_cap() {
    let program = Program::builder([64, 1, 1]).build();
    // 256 lanes: a cap of 2^20 is reached after 2^12 runs (the default cap's time is
    // what `reference_work_cap_figures` measures).
    let capped = ReferenceOptions {
        max_work: 1 << 20,
        ..ReferenceOptions::default()
    };
    let error = reference::run_with_options(
        &program,
        &[],
        &DispatchConfig::linear(4).with_fixpoint_iterations(u32::MAX),
        &capped,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("Fix:") && error.contains("max_work"),
        "{error}"
    );
    let (_, stats) = reference::run_with_stats(
        &program,
        &[],
        &DispatchConfig::linear(4).with_fixpoint_iterations(1000),
        &ReferenceOptions::default(),
    )
    .unwrap();
    assert_eq!(stats.work(), 1000 * 4 * 64);
}

/// An empty program on 1-thread workgroups with one workgroup buffer of `count`
/// elements of `elem`: all a kernel run does is reset its lane and zero that memory.
fn empty_with_workgroup_memory(elem: ElemType, count: u32) -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "shared",
            0,
            Access::Workgroup,
            elem,
            BufferCount::Static(count),
        )
        .build()
}

/// Defect locked out: zeroing workgroup memory at the start of each kernel
/// run was not work, so an empty program with a 48 KiB workgroup buffer and
/// `fixpoint_iterations = u32::MAX` was charged one unit per run and zeroed 48 KiB
/// 2^31 times before the cap stopped it (over ten minutes). It must end with the
/// cap's `Fix:` error under the default cap (12,289 units a run: about 175,000 runs,
/// 0.15 s in a release build; the buffer here is of bytes, whose zeroing is a `memset`
/// even in a debug build, where a `u32` buffer's takes 7 s). Negative control: the count grows with the memory reset, exactly: a run costs one
/// unit per thread plus one per 4-byte word of workgroup memory over all workgroups
/// (at least 32 units, like every step of the interpreter),
/// so doubling the buffer or the workgroups doubles the words, byte buffers count in
/// whole words, and fixpoint iterations multiply the whole.
#[test]
fn workgroup_memory_resets_count_against_the_work_cap() {
    let words_48_kib = 48 * 1024 / 4;
    // The counts first: under the defect they fail at once, where the capped run
    // below would take half an hour.
    let work = |elem: ElemType, count: u32, workgroups: u32, runs: u32| {
        let (_, stats) = reference::run_with_stats(
            &empty_with_workgroup_memory(elem, count),
            &[],
            &DispatchConfig::linear(workgroups).with_fixpoint_iterations(runs),
            &ReferenceOptions::default(),
        )
        .unwrap();
        stats.work()
    };
    let one_run = work(ElemType::U32, words_48_kib, 1, 1);
    assert_eq!(one_run, 1 + u64::from(words_48_kib));
    assert_eq!(work(ElemType::U32, words_48_kib / 2, 1, 1), 1 + 6144);
    assert_eq!(work(ElemType::U32, words_48_kib, 2, 1), 2 * one_run);
    assert_eq!(work(ElemType::U8, 48 * 1024, 1, 1), one_run);
    assert_eq!(
        work(ElemType::U8, 161, 1, 1),
        1 + 41,
        "a partial word counts whole"
    );
    assert_eq!(work(ElemType::U8, 5, 1, 1), 32, "at least 32 units a run");
    assert_eq!(work(ElemType::U32, words_48_kib, 1, 3), 3 * one_run);

    let error = reference::run_with_options(
        &empty_with_workgroup_memory(ElemType::U8, 48 * 1024),
        &[],
        &DispatchConfig::linear(1).with_fixpoint_iterations(u32::MAX),
        &ReferenceOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("Fix:") && error.contains("max_work"),
        "{error}"
    );
}

/// A balanced tree of `+` with `2^depth` leaves (`2^(depth+1) - 1` nodes), each leaf
/// the lane's id.
fn balanced_sum(depth: u32) -> Expr {
    let mut level: Vec<Expr> = (0..1u32 << depth)
        .map(|_| Expr::global_id(Axis::X))
        .collect();
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len() / 2);
        let mut items = level.into_iter();
        while let (Some(a), Some(b)) = (items.next(), items.next()) {
            next.push(a + b);
        }
        level = next;
    }
    level.pop().expect("one root")
}

/// Defect locked out: expression evaluation was not counted against the work cap, so
/// one statement with a 2^19-node expression over 2^20 lanes (2^39 operations) ran
/// unchecked. It must trip the cap. Negative control: the count is exact: on 64
/// lanes the same expression costs its node count times the lanes, plus the
/// statement and the kernel run, and runs under the default cap.
#[test]
fn expression_nodes_count_against_the_work_cap() {
    let program = |threads: u32| {
        Program::builder([threads, 1, 1])
            .buffer(
                "out",
                0,
                Access::WriteOnly,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .body(|b| {
                b.let_("big", balanced_sum(18));
            })
            .build()
    };
    let many = ReferenceOptions {
        max_work: 1 << 28,
        ..ReferenceOptions::default()
    };
    let error = reference::run_with_options(
        &program(1024),
        &[&[0; 4]],
        &DispatchConfig::linear(1024),
        &many,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("max_work"), "{error}");

    let (_, stats) = reference::run_with_stats(
        &program(64),
        &[&[0; 4]],
        &DispatchConfig::linear(1),
        &ReferenceOptions::default(),
    )
    .unwrap();
    let nodes = (1u64 << 19) - 1;
    assert_eq!(stats.lane_ops, nodes * 64);
    assert_eq!(stats.work(), nodes * 64 + 64 + 64);
}

/// Measurement (not a guard; no time is asserted): how long the default work cap
/// lets a runaway program run before its `Err`. The program is a valid 1,024-thread
/// loop of `u32::MAX` iterations over a few statements (a hostile 83-node program
/// ran 48 s under the old cap), and a one-thread `while true`. Run with
/// `cargo test --release --test hostile_lowering -- --ignored --nocapture reference_work_cap_figures`.
#[test]
#[ignore = "measurement: run in release with --nocapture"]
fn reference_work_cap_figures() {
    let program = Program::builder([256, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let lane = b.let_("lane", Expr::global_id(Axis::X));
            b.loop_("i", 0u32, u32::MAX, |b, i| {
                let mixed = b.let_("mixed", (i.clone() ^ lane.clone()) * 2_654_435_761u32);
                let index = b.let_("index", mixed.clone() % Expr::length("out"));
                b.store("out", index, mixed + (i >> 3u32));
            });
        })
        .build();
    let input = vec![0u8; 4 * 1024];
    let started = std::time::Instant::now();
    let Err(error) = reference::run_with_stats(
        &program,
        &[&input],
        &DispatchConfig::linear(4),
        &ReferenceOptions::default(),
    ) else {
        panic!("a loop of u32::MAX iterations cannot finish under the cap")
    };
    println!(
        "default work cap ({}): runaway {}-node program stopped after {:.2} s: {}",
        ReferenceOptions::default().max_work,
        program.node_count(),
        started.elapsed().as_secs_f64(),
        error
    );
    // A one-thread `while true`: each iteration costs the interpreter the same fixed
    // amount whatever its lanes, which the cap charges as 32 lanes.
    let runaway = Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let n = b.let_mut("n", 0u32);
            b.while_(true, |b| {
                b.assign("n", n.clone() + 1u32);
            });
        })
        .build();
    let started = std::time::Instant::now();
    let Err(error) = reference::run(&runaway, &[&input], &DispatchConfig::linear(1)) else {
        panic!("a while true loop cannot finish")
    };
    println!(
        "default work cap: one-thread `while true` stopped after {:.2} s: {error}",
        started.elapsed().as_secs_f64()
    );
    // The measured run: an empty body, 48 KiB of workgroup memory, u32::MAX runs.
    let started = std::time::Instant::now();
    let outcome = reference::run_with_options(
        &empty_with_workgroup_memory(ElemType::U32, 48 * 1024 / 4),
        &[],
        &DispatchConfig::linear(1).with_fixpoint_iterations(u32::MAX),
        &ReferenceOptions::default(),
    );
    println!(
        "default work cap: empty program with 48 KiB of u32 workgroup memory, u32::MAX fixpoint iterations, stopped after {:.2} s (an error: {})",
        started.elapsed().as_secs_f64(),
        outcome.is_err()
    );
}

/// Defect locked out: lowering, code generation and the interpreter re-check a
/// program the validator already accepted (a second walk per entry point). A
/// checked program (`ValidProgram`) must flow validate → `lower_valid` →
/// `valid_program_to_ptx` / `run_valid` with one validator walk for the input and
/// one for the lowered result, and give the same PTX and outputs as the plain entry
/// points. Negative control: the plain entry point on a fresh program does walk.
#[test]
fn checked_programs_are_not_validated_again() {
    use vyre_cuda::codegen::ptx::valid_program_to_ptx;
    use vyre_cuda::ir::validate::walks_on_current_thread;
    use vyre_cuda::lower::lower_valid;

    let program = sum_of_ones(64);
    let before = walks_on_current_thread();
    let valid = validate(&program, &Limits::default()).expect("valid");
    let lowered = lower_valid(&valid, &WARP).expect("lower");
    assert_eq!(lowered.form(), ProgramForm::Lowered);
    assert_eq!(
        walks_on_current_thread() - before,
        2,
        "input and result, once each"
    );
    let ptx = valid_program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32).expect("ptx");
    let outputs =
        reference::run_valid(&lowered, &[&[0; 4]], &DispatchConfig::linear(1)).expect("run");
    assert_eq!(
        walks_on_current_thread() - before,
        2,
        "nothing walked again"
    );
    assert_eq!(outputs[0], 64u32.to_le_bytes());
    assert_eq!(
        ptx,
        program_to_ptx(lowered.program(), &CodegenOptions::default(), 90, 32).unwrap()
    );

    // Negative control: a fresh program's plain entry point validates (walks).
    let fresh = sum_of_ones(32);
    let lowered_fresh = lower_workgroup_reductions(&fresh, &WARP);
    let before = walks_on_current_thread();
    program_to_ptx(&lowered_fresh, &CodegenOptions::default(), 90, 32).expect("ptx");
    assert!(walks_on_current_thread() > before);
}

/// Defect locked out: lowering, PTX emission or the interpreter store their own
/// validation verdict (against their own limits) in the program's memo slots per
/// form, so the backend's validation with the device's limits walks the program on
/// every dispatch afterwards. After all three ran, the first validation with other
/// limits walks once and the second answers from the memo. Negative control: a
/// program whose memo slots were all taken by other limits walks on every validation.
#[test]
fn lowering_ptx_and_reference_leave_the_validation_memo_to_its_user() {
    use vyre_cuda::ir::validate::walks_on_current_thread;
    let device = Limits {
        max_shared_memory_bytes: 96 * 1024,
        ..Limits::default()
    };
    let program = sum_of_ones(64);
    let lowered = lower_workgroup_reductions(&program, &WARP);
    lower(&program, &WARP).expect("lower");
    program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32).expect("ptx");
    reference::run(&program, &[&[0; 4]], &DispatchConfig::linear(1)).expect("run");
    reference::run(&lowered, &[&[0; 4]], &DispatchConfig::linear(1)).expect("run");
    for (what, checked) in [("user", &program), ("lowered", &lowered)] {
        let validate_it = |p: &Program| {
            if what == "user" {
                validate(p, &device).map(|_| ())
            } else {
                validate_lowered(p, &device).map(|_| ())
            }
        };
        let before = walks_on_current_thread();
        validate_it(checked).unwrap();
        validate_it(checked).unwrap();
        assert_eq!(walks_on_current_thread() - before, 1, "{what}: memoised");
    }

    // Negative control: a memo whose slots were all taken by other limits makes
    // every validation walk.
    let taken = sum_of_ones(32);
    for threads in [1024, 512, 256, 128] {
        let other = Limits {
            max_threads_per_workgroup: threads,
            ..Limits::default()
        };
        validate(&taken, &other).unwrap();
    }
    let before = walks_on_current_thread();
    validate(&taken, &device).unwrap();
    validate(&taken, &device).unwrap();
    assert_eq!(walks_on_current_thread() - before, 2);
}
