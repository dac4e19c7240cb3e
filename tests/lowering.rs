//! Tests of `lower_workgroup_reductions`: identity of no-op lowerings, memoised
//! repeat calls, rewrites that change the digest (so a PTX cache can never serve the
//! un-lowered program's code), nested reductions, the exact shape codegen receives,
//! and semantic equivalence under the reference interpreter.
//!
//! Each guard is written as a `check_*` function taking the lowering under test, so
//! the same check is run against the real lowering (must pass) and against a
//! deliberately defective one (must fail): a guard never shown to fail is not a guard.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use vyre_cuda::ir::*;
use vyre_cuda::lower::{
    lower_workgroup_reductions, needs_lowering, walks_on_current_thread, LoweringCaps,
};
use vyre_cuda::reference::{self, ReferenceOptions};
use vyre_cuda::DispatchConfig;

const SUBGROUP: LoweringCaps = LoweringCaps {
    subgroup_ops: true,
    subgroup_size: 32,
};
const TREE: LoweringCaps = LoweringCaps {
    subgroup_ops: false,
    subgroup_size: 32,
};
const BOTH_CAPS: [LoweringCaps; 2] = [SUBGROUP, TREE];

fn real(program: &Program, caps: &LoweringCaps) -> Program {
    lower_workgroup_reductions(program, caps)
}

// ---------------------------------------------------------------- fixtures

/// `local_id.x + sx * (local_id.y + sy * local_id.z)`.
fn local_linear(size: [u32; 3]) -> Expr {
    Expr::local_id(Axis::X)
        + Expr::u32(size[0])
            * (Expr::local_id(Axis::Y) + Expr::u32(size[1]) * Expr::local_id(Axis::Z))
}

/// Where the reduction sits in the fixture program.
#[derive(Clone, Copy, Debug)]
enum Placement {
    /// In the entry block.
    TopLevel,
    /// In the body of a uniform `for iteration in 0..3` loop, reusing its buffer.
    InLoop,
    /// In `if workgroup_id.x < 2 { ... } else { ... }`.
    InIf,
    /// Inside an `if` inside a loop, and a second one after the loop.
    NestedTwice,
    /// A reduction whose result decides a branch holding a second reduction (the
    /// lowered result must still count as workgroup-uniform).
    ResultDrivesControl,
}

const ALL_PLACEMENTS: [Placement; 5] = [
    Placement::TopLevel,
    Placement::InLoop,
    Placement::InIf,
    Placement::NestedTwice,
    Placement::ResultDrivesControl,
];

/// Buffers `input` (read-only) and `output` (read-write); each thread reduces a
/// value derived from `input[global linear index]` and every thread stores the result,
/// so a thread that saw a wrong result shows up in the output.
fn reduction_program(size: [u32; 3], op: ReduceOp, placement: Placement) -> Program {
    let threads = size[0] * size[1] * size[2];
    per_thread_program(size, |b, global, mine| match placement {
        Placement::TopLevel => {
            let r = b.workgroup_reduce("r", op, mine.clone());
            b.store("output", global.clone(), r);
        }
        Placement::InLoop => {
            b.loop_("iteration", 0u32, 3u32, |b, iteration| {
                let varied = b.let_(
                    "varied",
                    mine.clone() ^ (iteration.clone() * 0x9e37_79b9u32),
                );
                let r = b.workgroup_reduce("r", op, varied);
                b.store("output", global.clone() * 3u32 + iteration, r);
            });
        }
        Placement::InIf => {
            b.if_else(
                Expr::workgroup_id(Axis::X).less_than(2u32),
                |b| {
                    let r = b.workgroup_reduce("r", op, mine.clone() + 1u32);
                    b.store("output", global.clone(), r);
                },
                |b| {
                    b.store("output", global.clone(), 7u32);
                },
            );
        }
        Placement::NestedTwice => {
            b.loop_("iteration", 0u32, 2u32, |b, iteration| {
                b.if_(Expr::workgroup_id(Axis::X).not_equals(1u32), |b| {
                    let r = b.workgroup_reduce("r", op, mine.clone() >> iteration.clone());
                    b.store("output", global.clone() * 3u32 + iteration, r);
                });
            });
            let last = b.workgroup_reduce("last", op, mine.clone() & 0xffu32);
            b.store("output", global.clone() * 3u32 + 2u32, last);
        }
        Placement::ResultDrivesControl => {
            let odd = b.workgroup_reduce("odd", ReduceOp::Sum, mine.clone() & 1u32);
            b.if_else(
                odd.clone().greater_than(threads / 2),
                |b| {
                    let r = b.workgroup_reduce("r", op, mine.clone());
                    b.store("output", global.clone(), r);
                },
                |b| {
                    b.store("output", global.clone(), odd.clone());
                },
            );
        }
    })
}

/// `size` threads per workgroup over `input` (read-only) and `output` (read-write),
/// each thread's body given its global index `global` and `mine = input[global]`.
fn per_thread_program(size: [u32; 3], body: impl FnOnce(&mut BlockBuilder, Expr, Expr)) -> Program {
    let threads = size[0] * size[1] * size[2];
    Program::builder(size)
        .buffer(
            "input",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "output",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let global = b.let_(
                "global",
                Expr::workgroup_id(Axis::X) * threads + local_linear(size),
            );
            let mine = b.let_("mine", Expr::load("input", global.clone()));
            body(b, global, mine);
        })
        .build()
}

/// Output elements per thread for a placement.
fn outputs_per_thread(placement: Placement) -> u32 {
    match placement {
        Placement::TopLevel | Placement::InIf | Placement::ResultDrivesControl => 1,
        Placement::InLoop | Placement::NestedTwice => 3,
    }
}

/// A program with no reduction at any depth, but with ifs, loops and barriers.
fn reduction_free_program() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "input",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "output",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "scratch",
            2,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(64),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.store(
                "scratch",
                Expr::local_id(Axis::X),
                Expr::load("input", i.clone()),
            );
            b.barrier();
            b.loop_("k", 0u32, 4u32, |b, k| {
                b.if_(i.clone().less_than(Expr::length("output")), |b| {
                    b.store("output", i.clone(), Expr::load("scratch", k));
                });
            });
        })
        .build()
}

/// A program whose only reduction is two blocks deep (inside a loop inside an if).
fn deeply_nested_reduction_program() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "input",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "output",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(Expr::workgroup_id(Axis::X).less_than(4u32), |b| {
                b.loop_("k", 0u32, 2u32, |b, _k| {
                    let r = b.workgroup_reduce("r", ReduceOp::Sum, Expr::load("input", i.clone()));
                    b.store("output", i.clone(), r);
                });
            });
        })
        .build()
}

// ---------------------------------------------------------------- IR inspection helpers

fn count_nodes(block: &[Node], predicate: &dyn Fn(&Node) -> bool) -> usize {
    block
        .iter()
        .map(|node| {
            let nested = match node {
                Node::If {
                    then_body,
                    else_body,
                    ..
                } => count_nodes(then_body, predicate) + count_nodes(else_body, predicate),
                Node::Loop { body, .. } | Node::While { body, .. } => count_nodes(body, predicate),
                _ => 0,
            };
            nested + predicate(node) as usize
        })
        .sum()
}

fn reductions_in(program: &Program) -> usize {
    count_nodes(program.entry(), &|n| {
        matches!(n, Node::WorkgroupReduce { .. })
    })
}

fn barriers_in(program: &Program) -> usize {
    count_nodes(program.entry(), &|n| matches!(n, Node::Barrier))
}

fn scans_in(program: &Program) -> usize {
    count_nodes(program.entry(), &|n| {
        matches!(n, Node::WorkgroupScan { .. })
    })
}

fn expr_has_subgroup_op(expr: &Expr) -> bool {
    match expr {
        Expr::SubgroupReduce { .. }
        | Expr::SubgroupShuffleXor { .. }
        | Expr::SubgroupScan { .. } => true,
        Expr::Literal(_)
        | Expr::Var(_)
        | Expr::Length { .. }
        | Expr::Scalar(_)
        | Expr::Builtin(_) => false,
        Expr::Load { index, .. } => expr_has_subgroup_op(index),
        Expr::Binary { lhs, rhs, .. } => expr_has_subgroup_op(lhs) || expr_has_subgroup_op(rhs),
        Expr::Unary { operand, .. } => expr_has_subgroup_op(operand),
        Expr::Select {
            condition,
            if_true,
            if_false,
        } => {
            expr_has_subgroup_op(condition)
                || expr_has_subgroup_op(if_true)
                || expr_has_subgroup_op(if_false)
        }
        Expr::Cast { value, .. } => expr_has_subgroup_op(value),
    }
}

fn subgroup_ops_in(program: &Program) -> usize {
    count_nodes(program.entry(), &|n| match n {
        Node::Let { value, .. } | Node::Assign { value, .. } => expr_has_subgroup_op(value),
        _ => false,
    })
}

fn generated_buffers(program: &Program) -> Vec<BufferDecl> {
    program
        .buffers()
        .iter()
        .filter(|b| b.name.starts_with("__vyre"))
        .cloned()
        .collect()
}

/// Rebuilds a program into a new value with identical content (fresh memos).
fn rebuilt(program: &Program) -> Program {
    program.with_entry(program.buffers_shared().clone(), program.entry().clone())
}

// ---------------------------------------------------------------- guards

/// Guard: a program with nothing to rewrite comes back as the same value, with its
/// digest memo intact (no recomputation, so the cache key of an unchanged program
/// costs O(1)). Locks out a lowering that rebuilds every program.
fn check_noop_keeps_identity(
    lower: impl Fn(&Program, &LoweringCaps) -> Program,
) -> Result<(), String> {
    for caps in BOTH_CAPS {
        let program = reduction_free_program();
        let digest = program.digest();
        let computed_before = computations_on_current_thread();
        let lowered = lower(&program, &caps);
        if !Program::ptr_eq(&program, &lowered) {
            return Err(format!(
                "a reduction-free program was rebuilt under {caps:?}"
            ));
        }
        if !lowered.digest_is_memoised() {
            return Err("the no-op result lost the digest memo".into());
        }
        if lowered.digest() != digest || computations_on_current_thread() != computed_before {
            return Err("the no-op result's digest was recomputed".into());
        }
    }
    Ok(())
}

/// Guard: a rewrite yields a new value with a new digest and no reduction left, so a
/// PTX cache keyed by the digest can never hand the lowered program the original's
/// code. Locks out a lowering that returns its input unchanged.
fn check_rewrite_changes_digest(
    lower: impl Fn(&Program, &LoweringCaps) -> Program,
) -> Result<(), String> {
    // A fake emitter: the "PTX" of a program is its listing, so it differs whenever
    // the programs differ.
    let emit = |program: &Program| format!("// ptx of\n{program}");
    for caps in BOTH_CAPS {
        let original = reduction_program([64, 1, 1], ReduceOp::Sum, Placement::TopLevel);
        let lowered = lower(&original, &caps);
        if Program::ptr_eq(&original, &lowered) {
            return Err(format!("the lowering returned its input under {caps:?}"));
        }
        if reductions_in(&lowered) != 0 {
            return Err(format!(
                "{} reductions survived lowering",
                reductions_in(&lowered)
            ));
        }
        if lowered.digest() == original.digest() {
            return Err("the lowered program kept the original's digest".into());
        }
        let mut ptx_cache: HashMap<Digest, String> = HashMap::new();
        ptx_cache.insert(original.digest(), emit(&original));
        let served = ptx_cache
            .entry(lowered.digest())
            .or_insert_with(|| emit(&lowered))
            .clone();
        if served == emit(&original) {
            return Err("the cache served the un-lowered program's PTX".into());
        }
    }
    Ok(())
}

/// Guard: reductions nested in ifs and loops are rewritten too. Locks out a
/// "nothing to rewrite" decision that looks only at part of the program.
fn check_nested_reductions_rewritten(
    lower: impl Fn(&Program, &LoweringCaps) -> Program,
) -> Result<(), String> {
    for caps in BOTH_CAPS {
        let program = deeply_nested_reduction_program();
        let lowered = lower(&program, &caps);
        if Program::ptr_eq(&program, &lowered) || reductions_in(&lowered) != 0 {
            return Err(format!(
                "a reduction nested two blocks deep was not rewritten under {caps:?}"
            ));
        }
    }
    Ok(())
}

/// Guard: a repeat call with the same caps, on the program or any clone, returns the
/// memoised value (pointer-equal) without walking the program. Locks out a lowering
/// that recomputes on every dispatch.
fn check_repeat_is_memoised(
    lower: impl Fn(&Program, &LoweringCaps) -> Program,
) -> Result<(), String> {
    for caps in BOTH_CAPS {
        let program = reduction_program([64, 1, 1], ReduceOp::Max, Placement::InLoop);
        let first = lower(&program, &caps);
        let walks = walks_on_current_thread();
        let digests = computations_on_current_thread();
        let second = lower(&program.clone(), &caps);
        if !Program::ptr_eq(&first, &second) {
            return Err("the second call returned a different value".into());
        }
        if walks_on_current_thread() != walks || computations_on_current_thread() != digests {
            return Err("the second call walked the program".into());
        }
    }
    Ok(())
}

/// Workgroup shapes the semantic checks cover: one warp, two warps, eight warps,
/// 1.5 warps (tree fallback on a subgroup device), a 2-D shape, a single thread.
const SHAPES: [[u32; 3]; 6] = [
    [32, 1, 1],
    [64, 1, 1],
    [256, 1, 1],
    [48, 1, 1],
    [8, 4, 1],
    [1, 1, 1],
];
const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];
/// Capability sets the semantic checks cover (16-lane subgroups make [8, 4, 1] two warps).
const SEMANTIC_CAPS: [LoweringCaps; 3] = [
    SUBGROUP,
    TREE,
    LoweringCaps {
        subgroup_ops: true,
        subgroup_size: 16,
    },
];
const WORKGROUPS: u32 = 3;

/// Deterministic inputs with large values (sums wrap) and repeats (min/max ties).
fn inputs_for(threads: u32) -> Vec<u8> {
    let mut state: u32 = 0x1234_5678 ^ threads;
    (0..threads * WORKGROUPS)
        .flat_map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let value = if state.is_multiple_of(7) {
                42
            } else {
                state >> (state % 5)
            };
            value.to_le_bytes()
        })
        .collect()
}

/// Runs a program on the reference interpreter with subgroups of `subgroup_size` lanes.
fn run_reference(
    program: &Program,
    subgroup_size: u32,
    size: [u32; 3],
    placement: Placement,
) -> Result<Vec<Vec<u8>>, String> {
    let threads = size[0] * size[1] * size[2];
    let input = inputs_for(threads);
    let output = vec![0u8; (threads * WORKGROUPS * outputs_per_thread(placement) * 4) as usize];
    let options = ReferenceOptions {
        subgroup_size,
        ..ReferenceOptions::default()
    };
    reference::run_with_options(
        program,
        &[&input, &output],
        &DispatchConfig::linear(WORKGROUPS),
        &options,
    )
    .map_err(|e| e.to_string())
}

/// Guard: the lowered program computes exactly what the original does, for every
/// shape, operator, placement and capability set. Locks out a rewrite that computes
/// something else (a wrong tree, a missed partial, a thread-local "reduction").
fn check_semantics(lower: impl Fn(&Program, &LoweringCaps) -> Program) -> Result<(), String> {
    for size in SHAPES {
        for op in OPS {
            for placement in ALL_PLACEMENTS {
                let original = reduction_program(size, op, placement);
                for caps in SEMANTIC_CAPS {
                    let lowered = lower(&original, &caps);
                    let expected = run_reference(&original, caps.subgroup_size, size, placement)?;
                    let actual = run_reference(&lowered, caps.subgroup_size, size, placement)?;
                    if expected != actual {
                        return Err(format!(
                            "{op:?} {placement:?} over {size:?} with {caps:?}: outputs differ\n{lowered}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A defective lowering: every reduction becomes the thread's own value.
fn thread_local_lowering(program: &Program, _: &LoweringCaps) -> Program {
    replace_collectives(program, &|node| match node {
        Node::WorkgroupReduce { name, value, .. } => Some(own_value(name, value)),
        _ => None,
    })
}

/// `let name = value;`: a collective replaced by the thread's own value.
fn own_value(name: &Name, value: &Expr) -> Node {
    Node::Let {
        name: name.clone(),
        mutable: false,
        value: value.clone(),
    }
}

/// `program` with every node `replace` answers replaced, at any depth.
fn replace_collectives(program: &Program, replace: &dyn Fn(&Node) -> Option<Node>) -> Program {
    let Ok(entry) = Replace(replace).block(program.entry());
    program.with_entry(program.buffers_shared().clone(), entry)
}

/// The rebuild that puts its function's answer in place of a node.
struct Replace<'a>(&'a dyn Fn(&Node) -> Option<Node>);

impl Rebuild for Replace<'_> {
    type Error = Infallible;

    fn node(&mut self, node: &Node) -> Result<Node, Infallible> {
        match (self.0)(node) {
            Some(replaced) => Ok(replaced),
            None => node.map_parts(self),
        }
    }
}

// ---------------------------------------------------------------- guard tests

/// Defect locked out: the lowered program's outputs differ from the original's under
/// the reference interpreter (the oracle the GPU is held to).
#[test]
fn lowering_preserves_semantics_under_the_reference() {
    check_semantics(real).unwrap();
}

/// Negative control: a lowering that replaces each reduction by the thread's own
/// value fails the semantic guard.
#[test]
fn semantic_guard_detects_a_thread_local_reduction() {
    assert!(check_semantics(thread_local_lowering).is_err());
}

/// Defect locked out: the reference agrees with a lowering that is wrong in the same
/// way as itself. One shape is checked against sums computed here in Rust.
#[test]
fn reference_reductions_match_a_host_computation() {
    let size = [48, 1, 1];
    let original = reduction_program(size, ReduceOp::Sum, Placement::TopLevel);
    let input: Vec<u32> = inputs_for(48)
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for caps in SEMANTIC_CAPS {
        let lowered = real(&original, &caps);
        let output =
            &run_reference(&lowered, caps.subgroup_size, size, Placement::TopLevel).unwrap()[0];
        for (thread, bytes) in output.chunks_exact(4).enumerate() {
            let group = thread / 48;
            let expected = input[group * 48..group * 48 + 48]
                .iter()
                .fold(0u32, |a, &v| a.wrapping_add(v));
            assert_eq!(u32::from_le_bytes(bytes.try_into().unwrap()), expected);
        }
    }
}

/// Defect locked out: lowering emits something the lowered-program validator (and so
/// code generation) rejects, e.g. a result no longer considered workgroup-uniform or
/// a reduction left behind. The fixtures themselves must be valid user programs.
#[test]
fn every_lowered_program_passes_validate_lowered() {
    let limits = Limits::default();
    for size in SHAPES {
        for op in OPS {
            for placement in ALL_PLACEMENTS {
                let original = reduction_program(size, op, placement);
                validate(&original, &limits)
                    .unwrap_or_else(|e| panic!("fixture invalid: {e}\n{original}"));
                for caps in SEMANTIC_CAPS {
                    let lowered = real(&original, &caps);
                    validate_lowered(&lowered, &limits)
                        .unwrap_or_else(|e| panic!("{caps:?}: {e}\n{lowered}"));
                }
            }
        }
    }
}

/// Negative control: `validate_lowered` rejects a "lowered" program that still holds
/// a reduction, so the test above can fail.
#[test]
fn validate_lowered_guard_detects_a_leftover_reduction() {
    let original = reduction_program([64, 1, 1], ReduceOp::Sum, Placement::TopLevel);
    assert!(validate_lowered(&original, &Limits::default()).is_err());
}

/// Defect locked out: lowering rebuilds a program that has nothing to rewrite, so
/// the backend pays a digest walk per dispatch.
#[test]
fn noop_lowering_keeps_identity_and_digest_memo() {
    check_noop_keeps_identity(real).unwrap();
}

/// Negative control: a lowering that always rebuilds fails the identity guard.
#[test]
fn identity_guard_detects_a_lowering_that_always_rebuilds() {
    let always_rebuilds = |p: &Program, c: &LoweringCaps| rebuilt(&real(p, c));
    assert!(check_noop_keeps_identity(always_rebuilds).is_err());
}

/// Defect locked out: a rewritten program keeps the original's digest (or its
/// reductions), so a digest-keyed PTX cache serves it the un-lowered code.
#[test]
fn rewrite_changes_digest_and_cannot_be_served_original_ptx() {
    check_rewrite_changes_digest(real).unwrap();
}

/// Negative control: a lowering that returns its input fails the rewrite guard.
#[test]
fn rewrite_guard_detects_a_lowering_that_returns_its_input() {
    let returns_input = |p: &Program, _: &LoweringCaps| p.clone();
    assert!(check_rewrite_changes_digest(returns_input).is_err());
}

/// Defect locked out: only the top-level block is inspected, so a nested reduction
/// reaches code generation.
#[test]
fn nested_reductions_are_rewritten() {
    check_nested_reductions_rewritten(real).unwrap();
}

/// Negative control: a lowering that decides "nothing to rewrite" from the top-level
/// block alone fails the nested-reduction guard.
#[test]
fn nested_guard_detects_a_top_level_only_scan() {
    let top_level_only = top_level_only(|n| matches!(n, Node::WorkgroupReduce { .. }));
    assert!(check_nested_reductions_rewritten(top_level_only).is_err());
}

/// A defective lowering that lowers only when the entry block itself holds a node
/// `collective` accepts (a "nothing to rewrite" decision from the top level alone).
fn top_level_only(collective: fn(&Node) -> bool) -> impl Fn(&Program, &LoweringCaps) -> Program {
    move |p, c| {
        if p.entry().iter().any(collective) {
            real(p, c)
        } else {
            p.clone()
        }
    }
}

/// Defect locked out: repeat lowering of the same program recomputes the rewrite.
#[test]
fn repeat_lowering_is_memoised() {
    check_repeat_is_memoised(real).unwrap();
}

/// Negative control: a lowering without a memo (fresh value per call) fails the guard.
#[test]
fn memo_guard_detects_a_lowering_without_memo() {
    let no_memo = |p: &Program, c: &LoweringCaps| rebuilt(&real(p, c));
    assert!(check_repeat_is_memoised(no_memo).is_err());
}

// ---------------------------------------------------------------- memo details

/// Defect locked out: the no-op answer is not memoised, so `needs_lowering` and
/// lowering walk an unchanged program on every dispatch. (That the memo holds no
/// reference to the program itself is a unit test in `src/lower`.)
#[test]
fn noop_answer_is_memoised_for_every_caps() {
    let program = reduction_free_program();
    let walks = walks_on_current_thread();
    assert!(!needs_lowering(&program));
    assert_eq!(walks_on_current_thread(), walks + 1);
    let lowered = real(&program, &SUBGROUP);
    let lowered_again = real(&program, &TREE);
    assert!(!needs_lowering(&program.clone()));
    assert_eq!(
        walks_on_current_thread(),
        walks + 1,
        "memo hits must not walk"
    );
    assert!(Program::ptr_eq(&program, &lowered) && Program::ptr_eq(&program, &lowered_again));
}

/// Defect locked out: `needs_lowering` or lowering of an already-lowered program
/// walks it again (the backend calls both per dispatch).
#[test]
fn lowered_programs_need_no_further_lowering_and_cost_no_walk() {
    let program = reduction_program([64, 1, 1], ReduceOp::Sum, Placement::TopLevel);
    assert!(needs_lowering(&program));
    let lowered = real(&program, &SUBGROUP);
    let walks = walks_on_current_thread();
    assert!(needs_lowering(&program));
    assert!(!needs_lowering(&lowered));
    assert!(Program::ptr_eq(&lowered, &real(&lowered, &SUBGROUP)));
    assert!(Program::ptr_eq(&lowered, &real(&lowered, &TREE)));
    assert_eq!(walks_on_current_thread(), walks);
}

/// Defect locked out: the memo answers a call with other caps with the result made
/// for the first caps (a tree-lowered program on a subgroup device or vice versa).
#[test]
fn other_caps_get_their_own_lowering() {
    let program = reduction_program([64, 1, 1], ReduceOp::Min, Placement::TopLevel);
    let with_subgroups = real(&program, &SUBGROUP);
    let with_tree = real(&program, &TREE);
    assert!(subgroup_ops_in(&with_subgroups) > 0);
    assert_eq!(subgroup_ops_in(&with_tree), 0);
    assert_ne!(with_subgroups.digest(), with_tree.digest());
    // The memo keeps the first caps' result.
    assert!(Program::ptr_eq(&with_subgroups, &real(&program, &SUBGROUP)));
}

/// Defect locked out: two capability sets share a key, so a cache keyed by it mixes
/// their lowerings.
#[test]
fn caps_keys_are_distinct_and_stable() {
    let all = [
        SUBGROUP,
        TREE,
        LoweringCaps {
            subgroup_ops: true,
            subgroup_size: 64,
        },
        LoweringCaps {
            subgroup_ops: false,
            subgroup_size: 64,
        },
        LoweringCaps {
            subgroup_ops: true,
            subgroup_size: 0,
        },
    ];
    let keys: std::collections::HashSet<u64> = all.iter().map(LoweringCaps::key).collect();
    assert_eq!(keys.len(), all.len());
    assert_eq!(SUBGROUP.key(), SUBGROUP.key());
}

// ---------------------------------------------------------------- shapes codegen relies on

/// Defect locked out: the subgroup form changes shape unnoticed (codegen and the
/// shared-memory budget rely on it): one `__vyre_reduce0` buffer of one `u32` per
/// warp, two barriers, no reduction left.
#[test]
fn subgroup_form_uses_one_partial_per_warp_and_two_barriers() {
    let program = reduction_program([256, 1, 1], ReduceOp::Sum, Placement::TopLevel);
    let lowered = real(&program, &SUBGROUP);
    let buffers = generated_buffers(&lowered);
    assert_eq!(buffers.len(), 1);
    assert_eq!(&*buffers[0].name, "__vyre_reduce0");
    assert_eq!(buffers[0].access, Access::Workgroup);
    assert_eq!(buffers[0].elem, ElemType::U32);
    assert_eq!(buffers[0].count, BufferCount::Static(8));
    assert_eq!(barriers_in(&lowered), 2);
    assert_eq!(subgroup_ops_in(&lowered), 1);
}

/// Defect locked out: a one-warp workgroup pays for shared memory and barriers it
/// does not need.
#[test]
fn single_warp_workgroup_needs_no_shared_memory() {
    let program = reduction_program([32, 1, 1], ReduceOp::Max, Placement::TopLevel);
    let lowered = real(&program, &SUBGROUP);
    assert!(generated_buffers(&lowered).is_empty());
    assert_eq!(barriers_in(&lowered), 0);
    assert_eq!(subgroup_ops_in(&lowered), 1);
}

/// Defect locked out: a workgroup that is not a whole number of warps takes the
/// subgroup path (partial warps would read inactive lanes).
#[test]
fn partial_warps_fall_back_to_the_tree() {
    let program = reduction_program([48, 1, 1], ReduceOp::Sum, Placement::TopLevel);
    let lowered = real(&program, &SUBGROUP);
    assert_eq!(subgroup_ops_in(&lowered), 0);
    let buffers = generated_buffers(&lowered);
    assert_eq!(buffers.len(), 1);
    assert_eq!(buffers[0].count, BufferCount::Static(48));
    // One after the stores, ceil(log2 48) = 6 tree steps, one trailing.
    assert_eq!(barriers_in(&lowered), 8);
}

/// Defect locked out: two reductions share a buffer or a binding, or a generated
/// binding collides with a user binding.
#[test]
fn each_reduction_gets_its_own_buffer_and_binding() {
    let program = reduction_program([64, 1, 1], ReduceOp::Sum, Placement::NestedTwice);
    for caps in BOTH_CAPS {
        let lowered = real(&program, &caps);
        let names: Vec<String> = generated_buffers(&lowered)
            .iter()
            .map(|b| b.name.to_string())
            .collect();
        assert_eq!(names, ["__vyre_reduce0", "__vyre_reduce1"]);
        let mut bindings: Vec<u32> = lowered.buffers().iter().map(|b| b.binding).collect();
        bindings.sort_unstable();
        bindings.dedup();
        assert_eq!(bindings.len(), lowered.buffers().len());
    }
}

/// Defect locked out: a rewrite deep-copies blocks it did not change (memory and
/// time proportional to the whole program per distinct caps).
#[test]
fn unchanged_blocks_are_shared_with_the_input() {
    let untouched: Block = vec![Node::Store {
        buffer: "output".into(),
        index: Expr::u32(0),
        value: Expr::u32(1),
    }]
    .into();
    let program = Program::builder([64, 1, 1])
        .buffer(
            "output",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .nodes([
            Node::If {
                condition: Expr::workgroup_id(Axis::X).equals(0u32),
                then_body: untouched.clone(),
                else_body: Vec::new().into(),
            },
            Node::WorkgroupReduce {
                name: "r".into(),
                op: ReduceOp::Sum,
                value: Expr::u32(1),
            },
        ])
        .build();
    let lowered = real(&program, &TREE);
    match &lowered.entry()[0] {
        Node::If { then_body, .. } => assert!(Arc::ptr_eq(then_body, &untouched)),
        other => panic!("expected the untouched if first, got {other:?}"),
    }
}

/// Defect locked out: a generated name can collide with a user name (user names
/// never start with `__vyre`) or another generated name.
#[test]
fn generated_variables_use_the_reserved_prefix_and_are_unique() {
    let program = reduction_program([8, 4, 1], ReduceOp::Sum, Placement::NestedTwice);
    for caps in BOTH_CAPS {
        let lowered = real(&program, &caps);
        let mut declared = Vec::new();
        collect_declarations(lowered.entry(), &mut declared);
        let user = ["global", "mine", "iteration", "r", "last"];
        for name in &declared {
            assert!(
                user.contains(&name.as_str()) || name.starts_with("__vyre"),
                "unexpected declaration {name}"
            );
        }
        let generated: Vec<&String> = declared
            .iter()
            .filter(|n| n.starts_with("__vyre"))
            .collect();
        let unique: std::collections::HashSet<&&String> = generated.iter().collect();
        assert_eq!(unique.len(), generated.len(), "{generated:?}");
    }
}

fn collect_declarations(block: &[Node], out: &mut Vec<String>) {
    for node in block {
        match node {
            Node::Let { name, .. } => out.push(name.to_string()),
            Node::If {
                then_body,
                else_body,
                ..
            } => {
                collect_declarations(then_body, out);
                collect_declarations(else_body, out);
            }
            Node::Loop { variable, body, .. } => {
                out.push(variable.to_string());
                collect_declarations(body, out);
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------- workgroup scans

/// Where the scan sits in [`scan_program`].
#[derive(Clone, Copy, Debug)]
enum ScanPlacement {
    /// In the entry block.
    TopLevel,
    /// In a uniform `for` loop, reusing its buffer each iteration.
    InLoop,
    /// In a uniform `while` inside a uniform `if`.
    InWhileUnderIf,
    /// Two scans, the second scanning the first's results.
    Chained,
}

const SCAN_PLACEMENTS: [ScanPlacement; 4] = [
    ScanPlacement::TopLevel,
    ScanPlacement::InLoop,
    ScanPlacement::InWhileUnderIf,
    ScanPlacement::Chained,
];
const KINDS: [ScanKind; 2] = [ScanKind::Inclusive, ScanKind::Exclusive];

/// Like [`reduction_program`], with a workgroup scan: each thread stores its own
/// prefix, so a thread that got another's shows up in the output.
fn scan_program(size: [u32; 3], op: ReduceOp, kind: ScanKind, placement: ScanPlacement) -> Program {
    per_thread_program(size, |b, global, mine| match placement {
        ScanPlacement::TopLevel => {
            let s = b.workgroup_scan("s", op, kind, mine.clone());
            b.store("output", global.clone(), s);
        }
        ScanPlacement::InLoop => {
            b.loop_("iteration", 0u32, 3u32, |b, iteration| {
                let varied = b.let_("varied", mine.clone().rem(iteration.clone() + 5u32));
                let s = b.workgroup_scan("s", op, kind, varied);
                b.store("output", global.clone() * 3u32 + iteration, s);
            });
        }
        ScanPlacement::InWhileUnderIf => {
            b.if_(Expr::workgroup_id(Axis::X).not_equals(1u32), |b| {
                let round = b.let_mut("round", 0u32);
                b.while_(round.clone().less_than(3u32), |b| {
                    let s = b.workgroup_scan("s", op, kind, mine.clone() >> round.clone());
                    b.store("output", global.clone() * 3u32 + round.clone(), s);
                    b.assign("round", round.clone() + 1u32);
                });
            });
        }
        ScanPlacement::Chained => {
            let first = b.workgroup_scan("first", op, kind, mine.clone());
            let second = b.workgroup_scan("second", ReduceOp::Sum, ScanKind::Inclusive, first);
            b.store("output", global.clone() * 3u32, second);
        }
    })
}

/// Runs a scan fixture on the reference with subgroups of `subgroup_size` lanes.
fn run_scan(program: &Program, subgroup_size: u32, size: [u32; 3]) -> Result<Vec<Vec<u8>>, String> {
    // Every placement writes at most 3 words per thread.
    run_reference(program, subgroup_size, size, Placement::InLoop)
}

/// Guard: a lowered scan computes exactly what the workgroup scan does (the
/// reference runs both), for every shape, operation, kind, placement and capability
/// set. Locks out a rewrite that scans the wrong way (another order, a missed warp
/// total, an off-by-one exclusive prefix).
fn check_scan_semantics(lower: impl Fn(&Program, &LoweringCaps) -> Program) -> Result<(), String> {
    for size in SHAPES {
        for op in OPS {
            for kind in KINDS {
                for placement in SCAN_PLACEMENTS {
                    let original = scan_program(size, op, kind, placement);
                    for caps in SEMANTIC_CAPS {
                        let lowered = lower(&original, &caps);
                        let expected = run_scan(&original, caps.subgroup_size, size)?;
                        let actual = run_scan(&lowered, caps.subgroup_size, size)?;
                        if expected != actual {
                            return Err(format!(
                                "{op:?} {kind:?} {placement:?} over {size:?} with {caps:?}: \
                                 outputs differ\n{lowered}"
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A defective lowering: every scan becomes the thread's own value.
fn thread_local_scan_lowering(program: &Program, caps: &LoweringCaps) -> Program {
    let replaced = replace_collectives(program, &|node| match node {
        Node::WorkgroupScan { name, value, .. } => Some(own_value(name, value)),
        _ => None,
    });
    real(&replaced, caps)
}

/// Defect locked out: a lowered workgroup scan's outputs differ from the scan's
/// under the reference interpreter.
#[test]
fn scan_lowering_preserves_semantics_under_the_reference() {
    check_scan_semantics(real).unwrap();
}

/// Negative control: a lowering that replaces each scan by the thread's own value
/// fails the scan guard.
#[test]
fn scan_guard_detects_a_thread_local_scan() {
    assert!(check_scan_semantics(thread_local_scan_lowering).is_err());
}

/// Defect locked out: the reference and the lowering agree on a wrong prefix (an
/// inclusive scan taken for an exclusive one, another thread order): the prefix sums
/// of three shapes, lowered with every capability set, against sums computed here,
/// thread order `x + sx * y`.
#[test]
fn scans_match_prefix_sums_computed_on_the_host() {
    for size in [[48, 1, 1], [64, 1, 1], [8, 4, 1]] {
        let threads = (size[0] * size[1]) as usize;
        let input: Vec<u32> = inputs_for(threads as u32)
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for kind in KINDS {
            let original = scan_program(size, ReduceOp::Sum, kind, ScanPlacement::TopLevel);
            for caps in SEMANTIC_CAPS {
                let lowered = real(&original, &caps);
                let output = &run_scan(&lowered, caps.subgroup_size, size).unwrap()[0];
                for (thread, bytes) in output.chunks_exact(4).enumerate().take(threads * 3) {
                    let group = thread / threads;
                    let own = thread % threads;
                    let end = match kind {
                        ScanKind::Inclusive => own + 1,
                        ScanKind::Exclusive => own,
                    };
                    let expected = input[group * threads..group * threads + end]
                        .iter()
                        .fold(0u32, |a, &v| a.wrapping_add(v));
                    assert_eq!(
                        u32::from_le_bytes(bytes.try_into().unwrap()),
                        expected,
                        "{kind:?} thread {thread} of {size:?} with {caps:?}"
                    );
                }
            }
        }
    }
}

/// Defect locked out: lowering emits a scan form the lowered-program validator
/// rejects (a barrier under the divergent prefix, a scan left behind).
#[test]
fn every_lowered_scan_passes_validate_lowered() {
    let limits = Limits::default();
    for size in SHAPES {
        for kind in KINDS {
            for placement in SCAN_PLACEMENTS {
                let original = scan_program(size, ReduceOp::Max, kind, placement);
                validate(&original, &limits)
                    .unwrap_or_else(|e| panic!("fixture invalid: {e}\n{original}"));
                assert!(validate_lowered(&original, &limits).is_err());
                for caps in SEMANTIC_CAPS {
                    let lowered = real(&original, &caps);
                    validate_lowered(&lowered, &limits)
                        .unwrap_or_else(|e| panic!("{caps:?}: {e}\n{lowered}"));
                }
            }
        }
    }
}

/// Guard: scans nested in a `while` under an `if` are rewritten into a new value
/// with a new digest and no scan left. Locks out a "nothing to rewrite" decision
/// that misses scans or `while` bodies.
fn check_scans_rewritten(lower: impl Fn(&Program, &LoweringCaps) -> Program) -> Result<(), String> {
    for caps in BOTH_CAPS {
        let program = scan_program(
            [64, 1, 1],
            ReduceOp::Sum,
            ScanKind::Exclusive,
            ScanPlacement::InWhileUnderIf,
        );
        let lowered = lower(&program, &caps);
        if Program::ptr_eq(&program, &lowered) || scans_in(&lowered) != 0 {
            return Err(format!("a nested scan was not rewritten under {caps:?}"));
        }
        if lowered.digest() == program.digest() {
            return Err("the lowered program kept the original's digest".into());
        }
    }
    Ok(())
}

/// Defect locked out: a scan reaches code generation (which refuses it) because
/// lowering did not look for scans or into `while` bodies.
#[test]
fn nested_scans_are_rewritten() {
    check_scans_rewritten(real).unwrap();
}

/// Negative control: a lowering that only acts when the entry block itself holds a
/// collective fails the scan guard.
#[test]
fn scan_guard_detects_a_top_level_only_lowering() {
    let top_level_only = top_level_only(|n| matches!(n, Node::WorkgroupScan { .. }));
    assert!(check_scans_rewritten(top_level_only).is_err());
}

/// Defect locked out: the scan forms change shape unnoticed: one warp needs no
/// shared memory or barrier; two warps take one total per warp in shared memory and
/// two barriers; 48 threads (not whole warps) take the tree: one element per thread
/// and 2 + 2 * ceil(log2 48) = 14 barriers.
#[test]
fn scan_forms_have_their_documented_shapes() {
    let shape = |size: [u32; 3], caps: LoweringCaps| {
        let lowered = real(
            &scan_program(
                size,
                ReduceOp::Sum,
                ScanKind::Inclusive,
                ScanPlacement::TopLevel,
            ),
            &caps,
        );
        let buffers: Vec<u32> = generated_buffers(&lowered)
            .iter()
            .map(|b| match b.count {
                BufferCount::Static(n) => n,
                BufferCount::Runtime => 0,
            })
            .collect();
        (buffers, barriers_in(&lowered), subgroup_ops_in(&lowered))
    };
    assert_eq!(shape([32, 1, 1], SUBGROUP), (vec![], 0, 1));
    assert_eq!(shape([64, 1, 1], SUBGROUP), (vec![2], 2, 1));
    assert_eq!(shape([48, 1, 1], SUBGROUP), (vec![48], 14, 0));
    assert_eq!(shape([64, 1, 1], TREE), (vec![64], 14, 0));
}
