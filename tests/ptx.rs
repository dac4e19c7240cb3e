//! PTX code generation, checked three ways:
//!
//! 1. **The real assembler accepts it.** Every fixture and 500 random valid programs
//!    go through NVIDIA's `ptxas -arch=sm_90`; a string that merely looks like PTX is
//!    not enough, because the driver JIT rejects what ptxas rejects.
//! 2. **Reviewed snapshots.** The exact text of each fixture lives in
//!    `tests/snapshots/ptx/<name>.ptx`, so any change to emitted code is a diff a
//!    person reads. `VYRE_UPDATE_SNAPSHOTS=1 cargo test --test ptx` rewrites them.
//! 3. **Guards on properties the backend relies on:** determinism, parameter order,
//!    bounds checks on every access, no fused float arithmetic, the grid-barrier
//!    symbol, and `Fix:` errors instead of panics. Each guard has a negative control
//!    showing it fails on the defect it names.
//!
//! ptxas is found through `VYRE_PTXAS`, `PTXAS`, `PATH`, the crate's `.venv-ptxas`
//! (see `.ci/run`) or the `nvidia-cuda-nvcc-cu12` Python package; without it the
//! assembler tests print "skipped: ptxas not found", unless `VYRE_REQUIRE_PTXAS=1`
//! (set in CI), where they fail.

use std::path::PathBuf;
use std::sync::Arc;

use vyre_cuda::codegen::{
    program_to_ptx, program_to_ptx_with_results, CodegenError, ENTRY_NAME, GRID_BARRIER_SYMBOL,
    GRID_BARRIER_WORDS,
};
use vyre_cuda::ir::*;
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::{AcquireFence, CodegenOptions};

#[path = "support/ptxas.rs"]
mod ptxas;
#[path = "support/wide_shared.rs"]
mod wide_shared;
#[path = "support/without.rs"]
mod without;

use without::without;

// ----- fixtures ------------------------------------------------------------------------

struct Fixture {
    name: &'static str,
    program: Program,
    options: CodegenOptions,
    sm: u32,
}

const CHECKED: CodegenOptions = CodegenOptions::new();
const UNCHECKED: CodegenOptions = CodegenOptions::new().with_bounds_checks(false);

fn fixture(name: &'static str, program: Program) -> Fixture {
    Fixture {
        name,
        program,
        options: CHECKED,
        sm: 90,
    }
}

/// The result type of `op` on operands of type `ty`, or `None` where it is undefined
/// (the operator table of `BinaryOp`'s docs; shifts and `permute_bytes` take a `u32`
/// right operand).
fn binary_result(op: BinaryOp, ty: ScalarType) -> Option<ScalarType> {
    use BinaryOp as B;
    use ScalarType as T;
    if op == B::PermuteBytes {
        // A u64 of source bytes and a u32 selector.
        return (ty == T::U64).then_some(T::U32);
    }
    let defined = match op {
        B::Add | B::Sub | B::Mul | B::Div | B::Min | B::Max => ty != T::Bool,
        B::Rem | B::Shl | B::Shr => ty.is_integer(),
        B::BitAnd | B::BitOr | B::BitXor => ty.is_integer(),
        B::Eq | B::Ne => true,
        B::Lt | B::Le | B::Gt | B::Ge => ty != T::Bool,
        B::LogicalAnd | B::LogicalOr => ty == T::Bool,
        B::PermuteBytes => false,
    };
    defined.then(|| if op.is_comparison() { T::Bool } else { ty })
}

/// The result type of `op` on `ty`, or `None` where it is undefined (`UnaryOp`'s docs).
fn unary_result(op: UnaryOp, ty: ScalarType) -> Option<ScalarType> {
    use ScalarType as T;
    use UnaryOp as U;
    match (op, ty) {
        (U::Neg | U::Abs, T::I32 | T::I64 | T::F32) => Some(ty),
        (U::BitNot, _) if ty.is_integer() => Some(ty),
        (U::LogicalNot, T::Bool) => Some(T::Bool),
        (U::CountOnes | U::LeadingZeros, _) if ty.is_integer() => Some(T::U32),
        _ => None,
    }
}

const TYPES: [ScalarType; 4] = [
    ScalarType::U32,
    ScalarType::I32,
    ScalarType::F32,
    ScalarType::Bool,
];

/// Buffers `u`, `i`, `f` (one per numeric type) and the output `out`, plus one
/// variable of each type named `a_<type>` and `b_<type>` read from them.
fn typed_operands(b: &mut BlockBuilder) {
    b.let_("a_u32", Expr::load("u", 0u32));
    b.let_("b_u32", Expr::load("u", 1u32));
    b.let_("a_i32", Expr::load("i", 0u32));
    b.let_("b_i32", Expr::load("i", 1u32));
    b.let_("a_f32", Expr::load("f", 0u32));
    b.let_("b_f32", Expr::load("f", 1u32));
    b.let_("a_bool", Expr::var("a_u32").less_than(Expr::var("b_u32")));
    b.let_("b_bool", Expr::var("a_i32").less_than(Expr::var("b_i32")));
}

/// The 64-bit types' operands for [`every_op_64`], from buffers `w` (`u64`) and `s`
/// (`i64`).
fn wide_operands(b: &mut BlockBuilder) {
    b.let_("a_u64", Expr::load("w", 0u32));
    b.let_("b_u64", Expr::load("w", 1u32));
    b.let_("a_i64", Expr::load("s", 0u32));
    b.let_("b_i64", Expr::load("s", 1u32));
}

/// Every operator, cast and select on a 64-bit operand (or into a 64-bit type), each
/// result stored into the `u64` output `wide_out`.
fn every_op_64() -> Program {
    const WIDE: [ScalarType; 2] = [ScalarType::U64, ScalarType::I64];
    let mut results: Vec<Expr> = Vec::new();
    for op in BinaryOp::ALL {
        for ty in WIDE {
            if binary_result(op, ty).is_some() {
                let rhs = if matches!(op, BinaryOp::Shl | BinaryOp::Shr | BinaryOp::PermuteBytes) {
                    operand("b", ScalarType::U32)
                } else {
                    operand("b", ty)
                };
                results.push(Expr::binary(op, operand("a", ty), rhs));
            }
        }
    }
    for op in UnaryOp::ALL {
        for ty in WIDE {
            if unary_result(op, ty).is_some() {
                results.push(Expr::unary(op, operand("a", ty)));
            }
        }
    }
    for from in ScalarType::ALL {
        for to in ScalarType::ALL {
            if from.is_wide() || to.is_wide() {
                results.push(operand("a", from).cast(to));
            }
        }
    }
    for ty in WIDE {
        results.push(Expr::var("a_bool").select(operand("a", ty), operand("b", ty)));
    }
    let count = results.len() as u32;
    typed_inputs()
        .buffer(
            "w",
            3,
            Access::ReadOnly,
            ElemType::U64,
            BufferCount::Static(2),
        )
        .buffer(
            "s",
            4,
            Access::ReadOnly,
            ElemType::I64,
            BufferCount::Static(2),
        )
        .buffer(
            "wide_out",
            5,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Static(count),
        )
        .buffer(
            "shared64",
            6,
            Access::Workgroup,
            ElemType::I64,
            BufferCount::Static(3),
        )
        .body(|b| {
            typed_operands(b);
            wide_operands(b);
            for (slot, result) in results.into_iter().enumerate() {
                b.store("wide_out", slot as u32, result.cast(ScalarType::U64));
            }
            b.store("shared64", 1u32, Expr::i64(i64::MIN));
            b.store(
                "wide_out",
                0u32,
                Expr::load("shared64", 1u32).cast(ScalarType::U64),
            );
            b.store("wide_out", 1u32, Expr::u64(u64::MAX));
        })
        .build()
}

/// One thread and the inputs `u`, `i`, `f` of [`typed_operands`] (bindings 0 to 2).
fn typed_inputs() -> ProgramBuilder {
    Program::builder([1, 1, 1])
        .buffer(
            "u",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(2),
        )
        .buffer(
            "i",
            1,
            Access::ReadOnly,
            ElemType::I32,
            BufferCount::Static(2),
        )
        .buffer(
            "f",
            2,
            Access::ReadOnly,
            ElemType::F32,
            BufferCount::Static(2),
        )
}

fn typed_program(body: impl FnOnce(&mut BlockBuilder)) -> Program {
    typed_inputs()
        .buffer(
            "out",
            3,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            typed_operands(b);
            body(b);
        })
        .build()
}

fn operand(side: &str, ty: ScalarType) -> Expr {
    Expr::var(format!("{side}_{}", ty.name()))
}

fn every_binary_op() -> Program {
    typed_program(|b| {
        let mut slot = 0u32;
        for op in BinaryOp::ALL {
            for ty in TYPES {
                if binary_result(op, ty).is_none() {
                    continue;
                }
                let rhs = if matches!(op, BinaryOp::Shl | BinaryOp::Shr | BinaryOp::PermuteBytes) {
                    operand("b", ScalarType::U32)
                } else {
                    operand("b", ty)
                };
                let result = Expr::binary(op, operand("a", ty), rhs);
                b.store("out", slot, result.cast(ScalarType::U32));
                slot += 1;
            }
        }
    })
}

fn every_unary_op() -> Program {
    typed_program(|b| {
        let mut slot = 0u32;
        for op in UnaryOp::ALL {
            for ty in TYPES {
                if unary_result(op, ty).is_some() {
                    let result = Expr::unary(op, operand("a", ty));
                    b.store("out", slot, result.cast(ScalarType::U32));
                    slot += 1;
                }
            }
        }
    })
}

fn every_cast() -> Program {
    typed_program(|b| {
        let mut slot = 0u32;
        for from in TYPES {
            for to in TYPES {
                let converted = operand("a", from).cast(to);
                b.store("out", slot, converted.cast(ScalarType::U32));
                slot += 1;
            }
        }
    })
}

fn every_select() -> Program {
    typed_program(|b| {
        for (slot, ty) in TYPES.into_iter().enumerate() {
            let chosen = Expr::var("a_bool").select(operand("a", ty), operand("b", ty));
            b.store("out", slot as u32, chosen.cast(ScalarType::U32));
        }
    })
}

fn literals() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "out_u",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "out_i",
            1,
            Access::WriteOnly,
            ElemType::I32,
            BufferCount::Static(4),
        )
        .buffer(
            "out_f",
            2,
            Access::WriteOnly,
            ElemType::F32,
            BufferCount::Static(6),
        )
        .body(|b| {
            b.store("out_u", 0u32, u32::MAX);
            b.store("out_u", 1u32, 0u32);
            b.store("out_u", 2u32, Expr::bool(true).cast(ScalarType::U32));
            b.store("out_u", 3u32, Expr::bool(false).cast(ScalarType::U32));
            b.store("out_i", 0u32, i32::MIN);
            b.store("out_i", 1u32, -1i32);
            b.store("out_i", 2u32, i32::MAX);
            b.store("out_i", 3u32, 0i32);
            for (slot, value) in [f32::NAN, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1.5, 1e-45]
                .into_iter()
                .enumerate()
            {
                b.store("out_f", slot as u32, value);
            }
        })
        .build()
}

fn memory_program() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "bytes_out",
            1,
            Access::ReadWrite,
            ElemType::U8,
            BufferCount::Static(16),
        )
        .buffer(
            "words",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "signed",
            3,
            Access::WriteOnly,
            ElemType::I32,
            BufferCount::Static(8),
        )
        .buffer(
            "floats",
            4,
            Access::ReadWrite,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let byte = b.let_("byte", Expr::load("text", gid.clone()));
            b.store("bytes_out", gid.clone(), byte.clone() + 1u32);
            b.store(
                "words",
                gid.clone(),
                Expr::load("words", gid.clone()) + Expr::length("text"),
            );
            b.store(
                "signed",
                gid.clone(),
                byte.clone().cast(ScalarType::I32) - 128i32,
            );
            b.store(
                "floats",
                gid.clone(),
                Expr::load("floats", gid.clone()) * Expr::length("floats").cast(ScalarType::F32),
            );
            b.store(
                "words",
                0u32,
                Expr::length("bytes_out") + Expr::length("signed"),
            );
            b.store("words", 1u32, Expr::length("words"));
        })
        .build()
}

fn builtins() -> Program {
    Program::builder([8, 4, 2])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let mut slot = 0u32;
            for axis in [Axis::X, Axis::Y, Axis::Z] {
                for builtin in [
                    Builtin::GlobalId(axis),
                    Builtin::LocalId(axis),
                    Builtin::WorkgroupId(axis),
                    Builtin::WorkgroupCount(axis),
                ] {
                    b.store("out", slot, Expr::Builtin(builtin));
                    slot += 1;
                }
            }
        })
        .build()
}

/// The clock read twice around a store, each reading stored as a `u64`: the
/// first reading and the difference.
fn clock() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "stamps",
            0,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .body(|b| {
            let start = b.let_("start", Expr::clock());
            b.store("stamps", Expr::local_id(Axis::X), start.clone());
            b.store(
                "stamps",
                Expr::local_id(Axis::X) + 32u32,
                Expr::clock() - start,
            );
        })
        .build()
}

fn workgroup_memory() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "tile",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(64),
        )
        .buffer(
            "flags",
            2,
            Access::Workgroup,
            ElemType::U8,
            BufferCount::Static(10),
        )
        .buffer(
            "weights",
            3,
            Access::Workgroup,
            ElemType::F32,
            BufferCount::Static(64),
        )
        .body(|b| {
            let lid = b.let_("lid", Expr::local_id(Axis::X));
            // Read before any write: must be 0.
            let before = b.let_("before", Expr::load("tile", lid.clone()));
            b.store("tile", lid.clone(), lid.clone() + before);
            b.store("flags", lid.clone(), lid.clone());
            b.store("weights", lid.clone(), lid.clone().cast(ScalarType::F32));
            b.barrier();
            let mirrored = Expr::load("tile", Expr::u32(63) - lid.clone())
                + Expr::load("flags", lid.clone().rem(10u32))
                + Expr::load("weights", lid.clone()).cast(ScalarType::U32);
            b.store("out", Expr::global_id(Axis::X), mirrored);
        })
        .build()
}

fn atomics() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "keys",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "counts",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "summary",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "histogram",
            3,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let key = b.let_("key", Expr::load("keys", gid.clone()));
            b.atomic(AtomicOp::Add, "counts", key.clone(), 1u32);
            b.atomic(AtomicOp::Min, "summary", 0u32, key.clone());
            b.atomic(AtomicOp::Max, "summary", 1u32, key.clone());
            b.atomic(AtomicOp::Or, "summary", 2u32, key.clone());
            b.atomic(AtomicOp::Add, "histogram", key.clone().rem(16u32), 1u32);
            b.atomic(AtomicOp::Min, "histogram", 0u32, key.clone());
            b.atomic(AtomicOp::Max, "histogram", 1u32, key.clone());
            b.atomic(AtomicOp::Or, "histogram", 2u32, key.clone());
            b.barrier();
            let lid = b.let_("lid", Expr::local_id(Axis::X));
            b.if_(lid.clone().less_than(16u32), |b| {
                b.atomic(
                    AtomicOp::Add,
                    "counts",
                    lid.clone(),
                    Expr::load("histogram", lid.clone()),
                );
            });
        })
        .build()
}

/// Every returning atomic (fetches, compare-exchange, a plain exchange) and an
/// atomic load on every integer width and signedness, in global and workgroup
/// memory.
fn returning_atomics() -> Program {
    let elems = [ElemType::U32, ElemType::I32, ElemType::U64, ElemType::I64];
    let mut builder = Program::builder([32, 1, 1]);
    for (k, elem) in elems.into_iter().enumerate() {
        builder = builder
            .buffer(
                format!("global_{}", elem.name()),
                2 * k as u32,
                Access::ReadWrite,
                elem,
                BufferCount::Runtime,
            )
            .buffer(
                format!("shared_{}", elem.name()),
                2 * k as u32 + 1,
                Access::Workgroup,
                elem,
                BufferCount::Static(8),
            );
    }
    builder
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            for elem in elems {
                let ty = elem.value_type();
                let operand = gid.clone().cast(ty);
                for space in ["global", "shared"] {
                    let buffer = format!("{space}_{}", elem.name());
                    let mut folded = Expr::load(buffer.clone(), 0u32);
                    for op in AtomicOp::ALL {
                        let name = format!("{space}_{}_{}", elem.name(), op.name());
                        let old = b.atomic_fetch(
                            name,
                            op,
                            buffer.clone(),
                            gid.clone().rem(8u32),
                            operand.clone(),
                        );
                        folded = folded ^ old;
                    }
                    let swapped = b.compare_exchange(
                        format!("{space}_{}_swapped", elem.name()),
                        buffer.clone(),
                        1u32,
                        folded,
                        operand.clone(),
                    );
                    let seen = b.atomic_load(
                        format!("{space}_{}_seen", elem.name()),
                        buffer.clone(),
                        gid.clone().rem(8u32),
                    );
                    b.atomic(AtomicOp::Exchange, buffer.clone(), 2u32, swapped ^ seen);
                    b.atomic(AtomicOp::Sub, buffer, 3u32, operand.clone());
                }
            }
        })
        .build()
}

/// Per-thread arrays: a small one (zeroed by unrolled stores), a large one (zeroed
/// by a loop), bytes and 64-bit elements, indexed at run time.
fn local_arrays() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .local_array("tokens", 2, ElemType::U32, 8)
        .local_array("window", 3, ElemType::U64, 40)
        .local_array("text", 4, ElemType::U8, 5)
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            b.loop_("k", 0u32, 8u32, |b, k| {
                b.store(
                    "tokens",
                    k.clone(),
                    Expr::load("data", gid.clone() + k.clone()),
                );
                b.store("text", k.clone(), k.clone() * 7u32);
            });
            let picked = b.let_("picked", Expr::load("tokens", gid.clone().rem(9u32)));
            b.store(
                "window",
                picked.clone(),
                Expr::load("text", picked.clone()).cast(ScalarType::U64),
            );
            b.store("out", gid, Expr::load("window", picked));
        })
        .build()
}

fn grid_sync() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "a",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "b",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let n = b.let_("n", Expr::length("a"));
            b.if_(gid.clone().less_than(n.clone()), |b| {
                b.store("a", gid.clone(), gid.clone() * 3u32);
            });
            b.grid_sync();
            b.if_(gid.clone().less_than(n.clone()), |b| {
                let neighbour = (gid.clone() + 1u32).rem(n.clone());
                b.store("b", gid.clone(), Expr::load("a", neighbour));
            });
            b.grid_sync();
            b.store("a", gid.clone(), Expr::load("b", gid.clone()));
        })
        .build()
}

/// The "last workgroup clears" protocol: thread 0 publishes a status with a
/// relaxed exchange, counts its workgroup finished, and the last workgroup clears
/// every status; a fence on each side of the count orders the exchange before it
/// (release) and the clear after it (acquire). With `workgroup_scope` the fences
/// are workgroup-scope ones, as where one workgroup runs the protocol alone.
fn fenced_counter(workgroup_scope: bool) -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "statuses",
            0,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .buffer(
            "counters",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            let local = Expr::local_id(Axis::X);
            let group = b.let_("group", Expr::workgroup_id(Axis::X));
            let before = b.let_mut("before", 0u32);
            b.if_(local.clone().equals(0u32), |b| {
                let fence = |b: &mut BlockBuilder| {
                    if workgroup_scope {
                        b.workgroup_fence();
                    } else {
                        b.fence();
                    }
                };
                b.atomic(AtomicOp::Exchange, "statuses", group.clone(), Expr::u64(7));
                fence(b);
                let done = b.atomic_fetch("done", AtomicOp::Add, "counters", 0u32, 1u32);
                fence(b);
                b.assign("before", done);
            });
            let finished = b.workgroup_reduce("finished", ReduceOp::Max, before);
            b.if_(
                (finished + 1u32).equals(Expr::workgroup_count(Axis::X)),
                |b| {
                    b.store("statuses", local.clone(), Expr::u64(0));
                },
            );
        })
        .build()
}

/// Staged input a host hands over while the kernel runs: thread 0 of each workgroup
/// polls its piece's `ready` flag with an acquire load until it is set, a barrier
/// hands the acquire to the workgroup, then every thread reads the piece (a plain
/// load) and acquire loads of every other integer width and signedness, read-only
/// and read-write, each bounds-checked.
fn acquire_loads() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "ready",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "staged",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "signed",
            2,
            Access::ReadWrite,
            ElemType::I32,
            BufferCount::Runtime,
        )
        .buffer(
            "wide",
            3,
            Access::ReadOnly,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .buffer(
            "wide_signed",
            4,
            Access::ReadWrite,
            ElemType::I64,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            5,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let piece = b.let_("piece", Expr::workgroup_id(Axis::X));
            b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
                let seen = b.let_mut("seen", 0u32);
                b.while_(seen.equals(0u32), |b| {
                    let flag = b.acquire_load("flag", "ready", piece.clone());
                    b.assign("seen", flag);
                });
            });
            b.barrier();
            let signed = b.acquire_load("signed_seen", "signed", gid.clone());
            let wide = b.acquire_load("wide_seen", "wide", gid.clone());
            let wide_signed = b.acquire_load("wide_signed_seen", "wide_signed", gid.clone());
            b.store(
                "out",
                gid.clone(),
                Expr::load("staged", gid).cast(ScalarType::U64)
                    + signed.cast(ScalarType::U64)
                    + wide
                    + wide_signed.cast(ScalarType::U64),
            );
        })
        .build()
}

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
            b.loop_("k", 0u32, 8u32, |b, k| {
                b.if_else(
                    k.clone().equals(gid.clone().rem(8u32)),
                    |b| {
                        b.store("out", gid.clone(), k.clone());
                        b.return_();
                    },
                    |_| {},
                );
            });
            b.store("out", gid.clone(), 99u32);
        })
        .build()
}

fn nested_control() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            1,
            Access::ReadWrite,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let total = b.let_mut("total", 0u32);
            let bound = b.let_mut("bound", 4u32);
            b.loop_("i", 0u32, bound.clone(), |b, i| {
                // The end is evaluated once: changing `bound` inside does not extend the loop.
                b.assign("bound", bound.clone() + 1u32);
                b.if_else(
                    i.clone().rem(2u32).equals(0u32),
                    |b| {
                        let t = b.let_("t", Expr::load("data", i.clone()));
                        b.loop_("j", i.clone(), i.clone() + 3u32, |b, j| {
                            b.if_(j.clone().greater_than(gid.clone()), |b| {
                                b.assign("total", total.clone() + t.clone() * j.clone());
                            });
                        });
                    },
                    |b| {
                        // Same name as in the then-branch, different type.
                        let t = b.let_("t", Expr::f32(0.5));
                        b.store("out", gid.clone(), Expr::load("out", gid.clone()) + t);
                    },
                );
            });
            b.store("out", gid.clone(), total.clone().cast(ScalarType::F32));
        })
        .build()
}

/// The scan to the next space: a data-dependent loop whose PTX must be as tight as
/// hand-written (one compare and one branch per iteration).
/// Every scalar type as a parameter: values, a `bool` in a condition, and a `while`
/// around a barrier bounded by a scalar (grid-uniform, so the barrier is legal).
fn scalar_parameters() -> Program {
    use ScalarType::*;
    Program::builder([32, 1, 1])
        .buffer(
            "words",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "floats",
            1,
            Access::WriteOnly,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .buffer(
            "wide",
            2,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .scalar("count", U32)
        .scalar("bias", I32)
        .scalar("scale", F32)
        .scalar("enabled", Bool)
        .scalar("seed", U64)
        .scalar("offset", I64)
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let inside = Expr::scalar("enabled").and(i.clone().less_than(Expr::scalar("count")));
            b.if_(inside, |b| {
                let biased = i.clone().cast(I32) + Expr::scalar("bias");
                b.store("words", i.clone(), biased.cast(U32));
                b.store(
                    "floats",
                    i.clone(),
                    i.clone().cast(F32) * Expr::scalar("scale"),
                );
                let offset = i.clone().cast(I64) + Expr::scalar("offset");
                b.store("wide", i.clone(), Expr::scalar("seed") ^ offset.cast(U64));
            });
            let round = b.let_mut("round", 0u32);
            b.while_(round.clone().less_than(Expr::scalar("count")), |b| {
                b.barrier();
                b.assign("round", round.clone() + 1u32);
            });
        })
        .build()
}

fn while_scan() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "end",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let position = b.let_mut("position", gid.clone());
            b.while_(
                Expr::load("text", position.clone()).not_equals(32u32),
                |b| {
                    b.assign("position", position.clone() + 1u32);
                },
            );
            b.store("end", gid, position);
        })
        .build()
}

/// `break` and `continue` in a bounded loop and in a `while` loop, nested.
fn loop_control() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let sum = b.let_mut("sum", 0u32);
            b.loop_("k", 0u32, 16u32, |b, k| {
                b.if_(k.clone().bit_and(1u32).equals(1u32), |b| {
                    b.continue_();
                });
                b.if_(k.clone().greater_than(gid.clone()), |b| {
                    b.break_();
                });
                b.assign("sum", sum.clone() + k);
            });
            let n = b.let_mut("n", Expr::load("data", gid.clone()));
            b.while_(true, |b| {
                b.assign("n", n.clone() + 1u32);
                b.if_(n.clone().greater_equal(100u32), |b| {
                    b.break_();
                });
                b.if_(n.clone().rem(3u32).equals(0u32), |b| {
                    b.continue_();
                });
                b.assign("sum", sum.clone() + n.clone());
            });
            b.store("out", gid, sum);
        })
        .build()
}

fn subgroup_ops() -> Program {
    Program::builder([64, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let lane = b.let_("lane", Expr::local_id(Axis::X).rem(32u32));
            let mut mixed = Expr::u32(0);
            for lane_mask in [1, 2, 4, 8, 16] {
                mixed = mixed
                    ^ Expr::SubgroupShuffleXor {
                        value: Box::new(lane.clone()),
                        lane_mask,
                    };
            }
            let mixed = b.let_("mixed", mixed);
            let gid = Expr::global_id(Axis::X);
            for (slot, op) in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max]
                .into_iter()
                .enumerate()
            {
                let reduced = Expr::SubgroupReduce {
                    op,
                    value: Box::new(mixed.clone()),
                };
                b.store("out", gid.clone() * 3u32 + slot as u32, reduced);
            }
        })
        .build()
}

fn reduction_source(workgroup: [u32; 3]) -> Program {
    Program::builder(workgroup)
        .buffer(
            "values",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "sums",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let total = b.workgroup_reduce("total", ReduceOp::Sum, Expr::load("values", gid));
            b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
                b.store("sums", Expr::workgroup_id(Axis::X), total.clone());
            });
        })
        .build()
}

/// The compaction a tokenizer's pre-pass needs: each thread's exclusive prefix sum
/// of its flag is its output slot; the inclusive max is a running maximum.
fn scan_source(workgroup: [u32; 3]) -> Program {
    Program::builder(workgroup)
        .buffer(
            "values",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "packed",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let value = b.let_("value", Expr::load("values", gid.clone()));
            let keep = b.let_("keep", (value.clone() & 1u32).cast(ScalarType::U32));
            let slot = b.workgroup_scan("slot", ReduceOp::Sum, ScanKind::Exclusive, keep.clone());
            let running =
                b.workgroup_scan("running", ReduceOp::Max, ScanKind::Inclusive, value.clone());
            b.if_(keep.equals(1u32), |b| {
                b.store("packed", slot, running);
            });
        })
        .build()
}

/// Subgroup scans as lowering writes them, every operation and kind.
fn subgroup_scans() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let lane = b.let_("lane", Expr::local_id(Axis::X));
            let mut slot = 0u32;
            for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
                for kind in [ScanKind::Inclusive, ScanKind::Exclusive] {
                    let scanned = Expr::SubgroupScan {
                        op,
                        kind,
                        value: Box::new(lane.clone() * 3u32),
                    };
                    b.store("out", lane.clone() * 6u32 + slot, scanned);
                    slot += 1;
                }
            }
        })
        .build()
}

fn odd_names() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "in put\nwith newline",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out-put.ü",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "scratch pad",
            2,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(3),
        )
        .body(|b| {
            let v = b.let_("a b\r\nc", Expr::load("in put\nwith newline", 0u32));
            b.store("scratch pad", 0u32, v.clone());
            b.store("out-put.ü", 0u32, Expr::load("scratch pad", 0u32) + v);
        })
        .build()
}

/// The host-cost fixture: `acc0 = in[0]; accK = acc(K-1) + K; out[0] = acc_last`.
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

fn unordered_bindings() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "third",
            7,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "shared",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "first",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Static(3),
        )
        .buffer(
            "second",
            4,
            Access::ReadWrite,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store(
                "third",
                0u32,
                Expr::load("first", 0u32) + Expr::length("second"),
            );
            b.store(
                "second",
                0u32,
                Expr::load("shared", 0u32).cast(ScalarType::F32),
            );
        })
        .build()
}

fn fixtures() -> Vec<Fixture> {
    let subgroup_caps = LoweringCaps {
        subgroup_ops: true,
        subgroup_size: 32,
    };
    let tree_caps = LoweringCaps {
        subgroup_ops: false,
        subgroup_size: 32,
    };
    vec![
        fixture("empty", Program::builder([1, 1, 1]).build()),
        fixture("every_binary_op", every_binary_op()),
        fixture("every_unary_op", every_unary_op()),
        fixture("every_cast", every_cast()),
        fixture("every_select", every_select()),
        fixture("literals", literals()),
        fixture("memory_checked", memory_program()),
        Fixture {
            options: UNCHECKED,
            ..fixture("memory_unchecked", memory_program())
        },
        fixture("builtins", builtins()),
        fixture("clock", clock()),
        fixture("workgroup_memory", workgroup_memory()),
        fixture("atomics_checked", atomics()),
        Fixture {
            options: UNCHECKED,
            ..fixture("atomics_unchecked", atomics())
        },
        fixture("grid_sync", grid_sync()),
        fixture(
            "fenced_counter",
            lower_workgroup_reductions(&fenced_counter(false), &subgroup_caps),
        ),
        fixture(
            "workgroup_fenced_counter",
            lower_workgroup_reductions(&fenced_counter(true), &subgroup_caps),
        ),
        fixture("early_return", early_return()),
        fixture("nested_control", nested_control()),
        fixture("subgroup_sm90", subgroup_ops()),
        Fixture {
            sm: 70,
            ..fixture("subgroup_sm70_shuffle_ladder", subgroup_ops())
        },
        fixture(
            "lowered_reduce_subgroup",
            lower_workgroup_reductions(&reduction_source([128, 1, 1]), &subgroup_caps),
        ),
        fixture(
            "lowered_reduce_tree",
            lower_workgroup_reductions(&reduction_source([48, 1, 1]), &tree_caps),
        ),
        fixture("odd_names", odd_names()),
        fixture("acc_chain_16", acc_chain(16)),
        fixture("unordered_bindings", unordered_bindings()),
        fixture("while_scan", while_scan()),
        Fixture {
            options: CodegenOptions::new().with_max_loop_iterations(Some(1000)),
            ..fixture("while_scan_capped", while_scan())
        },
        fixture("loop_control", loop_control()),
        fixture("every_op_64", every_op_64()),
        fixture("returning_atomics", returning_atomics()),
        fixture("acquire_loads", acquire_loads()),
        fixture("scalar_parameters", scalar_parameters()),
        fixture("local_arrays", local_arrays()),
        fixture("subgroup_scans", subgroup_scans()),
        fixture(
            "lowered_scan_subgroup",
            lower_workgroup_reductions(&scan_source([128, 1, 1]), &subgroup_caps),
        ),
        fixture(
            "lowered_scan_tree",
            lower_workgroup_reductions(&scan_source([48, 1, 1]), &tree_caps),
        ),
        Fixture {
            options: UNCHECKED,
            ..fixture("local_arrays_unchecked", local_arrays())
        },
        Fixture {
            options: UNCHECKED,
            ..fixture("returning_atomics_unchecked", returning_atomics())
        },
    ]
}

fn emit(fixture: &Fixture) -> String {
    program_to_ptx(&fixture.program, &fixture.options, fixture.sm, 32).unwrap_or_else(|e| {
        panic!(
            "fixture {} did not generate: {e}\n{}",
            fixture.name, fixture.program
        )
    })
}

fn snapshot_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots/ptx")
        .join(format!("{name}.ptx"))
}

// ----- assembler -------------------------------------------------------------------------

/// Locks out PTX the driver would reject: every fixture must assemble with real ptxas.
#[test]
fn every_fixture_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::require("every_fixture_assembles_with_ptxas") else {
        return;
    };
    ptxas::assemble_all(&ptxas, fixtures().iter().map(|f| (f.name, emit(f))))
        .unwrap_or_else(|failures| panic!("{failures}"));
}

/// Locks out kernels that profilers and compute-sanitizer cannot tell apart (every
/// kernel was `vyre_entry`) and entry names the driver would reject: a program's
/// entry op id names its kernel, `vyre_entry__` then the id with every character a
/// PTX identifier cannot hold written as `_` (a 300-byte id cut to 200 bytes); a
/// program without one, or with an empty one, keeps `vyre_entry`; and an id that
/// spells another symbol of the module (`block_finished`: the result ABI's
/// per-block counter `vyre_block_finished` of a 64-thread kernel) still assembles
/// with ptxas. Negative control: the same module with its kernel renamed to that
/// counter's name does not, so the double underscore is what keeps them apart.
#[test]
fn kernels_are_named_after_their_programs() {
    let program = |id: &str| {
        let mut builder = Program::builder([64, 1, 1]).buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(64),
        );
        if !id.is_empty() {
            builder = builder.entry_op_id(id);
        }
        builder
            .body(|b| {
                let i = b.let_("i", Expr::local_id(Axis::X));
                b.store("out", i.clone(), i);
            })
            .build()
    };
    let named = |id: &str| {
        let ptx = program_to_ptx_with_results(&program(id), &CHECKED, 90, 32).expect("emits");
        let start = ptx.find(".visible .entry ").expect("an entry") + ".visible .entry ".len();
        let end = start + ptx[start..].find('(').expect("parameters");
        (ptx[start..end].to_string(), ptx)
    };
    assert_eq!(named("bpe.merge/step 2").0, "vyre_entry__bpe_merge_step_2");
    assert_eq!(named("").0, ENTRY_NAME);
    let long = "x".repeat(300);
    assert_eq!(named(&long).0, format!("vyre_entry__{}", "x".repeat(200)));
    let (name, ptx) = named("block_finished");
    assert_eq!(name, "vyre_entry__block_finished");
    assert!(
        ptx.contains("vyre_block_finished"),
        "the 64-thread kernel counts its block in workgroup memory"
    );
    let Some(ptxas) = ptxas::require("kernels_are_named_after_their_programs") else {
        return;
    };
    for (what, ptx) in [("named", &ptx), ("long", &named(&long).1)] {
        if let Err(error) = ptxas::assemble(&ptxas, what, ptx) {
            panic!("{error}");
        }
    }
    let clash = ptx.replacen(
        ".visible .entry vyre_entry__block_finished(",
        ".visible .entry vyre_block_finished(",
        1,
    );
    assert!(
        ptxas::assemble(&ptxas, "clash", &clash).is_err(),
        "ptxas took a kernel named like a shared variable of its module"
    );
}

/// Negative control for the assembler gate: a harness that ignored ptxas's exit status
/// (or a missing binary that "succeeds") would pass broken PTX; this proves it does not.
#[test]
fn ptxas_gate_rejects_broken_ptx() {
    let Some(ptxas) = ptxas::require("ptxas_gate_rejects_broken_ptx") else {
        return;
    };
    let good = emit(&fixture("workgroup_memory", workgroup_memory()));
    assert!(ptxas::assemble(&ptxas, "control_good", &good).is_ok());
    let broken = good.replacen("bar.sync 0;", "bar.sync %nosuchregister;", 1);
    let error = ptxas::assemble(&ptxas, "control_broken", &broken)
        .expect_err("ptxas accepted an undeclared register");
    assert!(error.contains("ptxas rejected control_broken"), "{error}");
    assert!(
        error.contains("    1 | //"),
        "the report shows numbered PTX: {error}"
    );
}

/// Locks out fixtures that are not valid IR: codegen's contract is only for programs
/// that passed `validate_lowered`, so a fixture outside it would test nothing real.
#[test]
fn every_fixture_is_valid_lowered_ir() {
    for f in fixtures() {
        if let Err(e) = validate_lowered(&f.program, &Limits::default()) {
            panic!("fixture {} is not valid: {e}\n{}", f.name, f.program);
        }
    }
}

/// Locks out an acquire load emitted without its system-scope acquire (it would
/// promise nothing about what the host wrote before setting the flag), from another
/// state space, of another width, without its bounds check, or as `ld.acquire`
/// (which ptxas miscompiles when the value goes unused: see
/// `an_unused_acquire_load_keeps_a_later_guard`): each acquire load of the fixture is
/// one `ld.relaxed.sys.global` of its element's type (`u32`, `s32`, `u64`, `s64`),
/// guarded by a bounds predicate like a plain load, followed at once by
/// `fence.acq_rel.sys`, and the module assembles with ptxas. Negative control: the
/// same program with atomic loads instead (its read-only buffers made read-write, as
/// they need) has relaxed GPU-scope loads and no system-scope fence.
#[test]
fn acquire_loads_are_system_scope_acquires() {
    let program = acquire_loads();
    let ptx = program_to_ptx(&program, &CHECKED, 90, 32).expect("ptx");
    let acquire_patterns = |ptx: &str, ty: &str| -> Vec<(bool, bool)> {
        let needle = format!("ld.relaxed.sys.global.{ty} ");
        let lines: Vec<&str> = ptx.lines().map(str::trim_start).collect();
        lines
            .iter()
            .enumerate()
            .filter(|(_, line)| line.contains(&needle))
            .map(|(at, line)| {
                let fenced = lines.get(at + 1) == Some(&"fence.acq_rel.sys;");
                (line.starts_with('@'), fenced)
            })
            .collect()
    };
    for ty in ["u32", "s32", "u64", "s64"] {
        assert_eq!(acquire_patterns(&ptx, ty), [(true, true)], "{ty}\n{ptx}");
    }
    assert_eq!(ptx.matches("fence.acq_rel.sys;").count(), 4, "{ptx}");
    assert!(!ptx.contains("ld.acquire."), "{ptx}");
    let unchecked = program_to_ptx(&program, &UNCHECKED, 90, 32).expect("ptx");
    for ty in ["u32", "s32", "u64", "s64"] {
        assert_eq!(
            acquire_patterns(&unchecked, ty),
            [(false, true)],
            "{ty}\n{unchecked}"
        );
    }

    // Atomic loads need buffers the kernel may write.
    let writable: Vec<BufferDecl> = program
        .buffers()
        .iter()
        .map(|decl| BufferDecl {
            access: match decl.access {
                Access::ReadOnly => Access::ReadWrite,
                access => access,
            },
            ..decl.clone()
        })
        .collect();
    let relaxed = Program::new(
        writable,
        program.workgroup_size(),
        as_atomic_loads(program.entry()),
    );
    let relaxed_ptx = program_to_ptx(&relaxed, &CHECKED, 90, 32).expect("ptx");
    assert!(!relaxed_ptx.contains("fence.acq_rel.sys"), "{relaxed_ptx}");
    assert!(!relaxed_ptx.contains("ld.relaxed.sys"), "{relaxed_ptx}");
    assert_eq!(relaxed_ptx.matches("ld.relaxed.gpu.global.").count(), 4);

    let Some(ptxas) = ptxas::require("acquire_loads_are_system_scope_acquires") else {
        return;
    };
    for (what, ptx) in [("acquire_checked", &ptx), ("acquire_unchecked", &unchecked)] {
        ptxas::assemble(&ptxas, what, ptx).unwrap_or_else(|report| panic!("{report}"));
    }
}

/// Locks out the acquire-only fence where a target or module cannot take it, and
/// the full system barrier where it can: under `AcquireFence::AcquireOnly` each
/// acquire load of the fixture is its `ld.relaxed.sys.global` followed at once by
/// `fence.acquire.sys` on `sm_90` (in a module of PTX ISA 8.6, which the
/// instruction needs) and by `fence.acq_rel.sys` on `sm_80` (PTX 7.8); the
/// options' digest differs from the default's. With ptxas and nvdisasm, the
/// `sm_90` module assembles to SASS with an L1 invalidation and no system-scope
/// barrier. Negative control: the default options' SASS of the same program
/// holds `MEMBAR.ALL.SYS`, one per acquire load.
#[test]
fn acquire_only_fences_are_invalidations_on_sm_90() {
    let program = acquire_loads();
    let acquire_only = CHECKED.with_acquire_fence(AcquireFence::AcquireOnly);
    assert_ne!(acquire_only.policy_digest(), CHECKED.policy_digest());
    let fences_after_loads = |ptx: &str| -> Vec<String> {
        let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
        lines
            .iter()
            .enumerate()
            .filter(|(_, line)| line.contains("ld.relaxed.sys.global."))
            .map(|(at, _)| lines.get(at + 1).copied().unwrap_or_default().to_owned())
            .collect()
    };
    let [sm_90, _] = [
        (
            90,
            ".version 8.6\n",
            "fence.acquire.sys;",
            "fence.acq_rel.sys",
        ),
        (
            80,
            ".version 7.8\n",
            "fence.acq_rel.sys;",
            "fence.acquire.sys",
        ),
    ]
    .map(|(sm, version, fence, other)| {
        let ptx = program_to_ptx(&program, &acquire_only, sm, 32).expect("ptx");
        assert!(ptx.contains(version), "sm_{sm}\n{ptx}");
        assert_eq!(fences_after_loads(&ptx), vec![fence; 4], "sm_{sm}\n{ptx}");
        assert!(!ptx.contains(other), "sm_{sm}\n{ptx}");
        ptx
    });
    let default = program_to_ptx(&program, &CHECKED, 90, 32).expect("ptx");
    assert!(default.contains(".version 7.8\n"), "{default}");
    // A kernel without acquire loads keeps its version under the option (the
    // backend sets it for every program where the device takes it).
    let (name, before) = ACQUIRE_BEFORE_A_STORE[3];
    let atomic = program_to_ptx(
        &acquire_before_a_store(name, 32, before),
        &acquire_only,
        90,
        32,
    )
    .expect("ptx");
    assert!(atomic.contains(".version 7.8\n"), "{atomic}");

    let Some(ptxas) = ptxas::require("acquire_only_fences_are_invalidations_on_sm_90") else {
        return;
    };
    let Some(nvdisasm) = ptxas::require_nvdisasm("acquire_only_fences_are_invalidations_on_sm_90")
    else {
        return;
    };
    let sass = ptxas::disassemble(&ptxas, &nvdisasm, "acquire_only", &sm_90)
        .unwrap_or_else(|report| panic!("{report}"));
    assert!(!sass.contains("MEMBAR.ALL.SYS"), "{sass}");
    assert!(sass.contains("CCTL.IVALL"), "{sass}");
    let full = ptxas::disassemble(&ptxas, &nvdisasm, "acquire_release", &default)
        .unwrap_or_else(|report| panic!("{report}"));
    assert_eq!(
        full.matches("MEMBAR.ALL.SYS").count(),
        4,
        "negative control\n{full}"
    );
}

/// `block` with every acquire load (at any depth) made an atomic load.
fn as_atomic_loads(block: &[Node]) -> Vec<Node> {
    block
        .iter()
        .map(|node| match node {
            Node::AcquireLoad {
                name,
                buffer,
                index,
            } => Node::AtomicLoad {
                name: name.clone(),
                buffer: buffer.clone(),
                index: index.clone(),
            },
            Node::If {
                condition,
                then_body,
                else_body,
            } => Node::If {
                condition: condition.clone(),
                then_body: as_atomic_loads(then_body).into(),
                else_body: as_atomic_loads(else_body).into(),
            },
            Node::While { condition, body } => Node::While {
                condition: condition.clone(),
                body: as_atomic_loads(body).into(),
            },
            other => other.clone(),
        })
        .collect()
}

/// Locks out a fence that is dropped, moved or of the wrong scope: `Node::Fence`
/// is one `fence.acq_rel.gpu` and `Node::WorkgroupFence` one `fence.acq_rel.cta`
/// exactly where it stands, so in the "last workgroup clears" protocol the
/// status exchange, a fence, the finished count, a fence and the clearing store
/// come in that order, with no fence of the other scope. Negative control: the
/// same program without its fences has none between the exchange and the count.
#[test]
fn fence_orders_the_atomics_around_it() {
    let caps = LoweringCaps {
        subgroup_ops: true,
        subgroup_size: 32,
    };
    let position = |ptx: &str, needle: &str, from: usize| -> Option<usize> {
        ptx[from..].find(needle).map(|at| from + at)
    };
    for (workgroup_scope, fence, other, statement) in [
        (
            false,
            "fence.acq_rel.gpu;",
            "fence.acq_rel.cta;",
            "device_fence()",
        ),
        (
            true,
            "fence.acq_rel.cta;",
            "fence.acq_rel.gpu;",
            "workgroup_fence()",
        ),
    ] {
        let fenced = lower_workgroup_reductions(&fenced_counter(workgroup_scope), &caps);
        let ptx = program_to_ptx(&fenced, &CodegenOptions::default(), 90, 32).expect("ptx");
        let exchange = position(&ptx, "atom.global.exch.b64", 0).expect("exchange");
        let release = position(&ptx, fence, exchange).expect("release fence");
        let count = position(&ptx, "atom.global.add.u32", release).expect("count");
        let acquire = position(&ptx, fence, count).expect("acquire fence");
        position(&ptx, "st.global.u64", acquire).expect("clear after the acquire fence");
        assert_eq!(ptx.matches(fence).count(), 2, "{ptx}");
        assert!(!ptx.contains(other), "{ptx}");
        assert!(fenced_counter(workgroup_scope)
            .to_string()
            .contains(statement));
    }

    let fenced = fenced_counter(false);
    let unfenced = Program::new(
        fenced.buffers().to_vec(),
        fenced.workgroup_size(),
        without(fenced.entry(), &|node| matches!(node, Node::Fence)),
    );
    let ptx = program_to_ptx(
        &lower_workgroup_reductions(&unfenced, &caps),
        &CodegenOptions::default(),
        90,
        32,
    )
    .expect("ptx");
    assert!(!ptx.contains("fence.acq_rel.gpu"), "{ptx}");
}

// ----- snapshots -------------------------------------------------------------------------

/// Locks out unreviewed changes to emitted PTX: each fixture's text must equal its
/// snapshot byte for byte (`VYRE_UPDATE_SNAPSHOTS=1` rewrites them for review).
#[test]
fn every_fixture_matches_its_snapshot() {
    let update = std::env::var("VYRE_UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for f in fixtures() {
        let ptx = emit(&f);
        let path = snapshot_path(f.name);
        if update {
            std::fs::create_dir_all(path.parent().expect("snapshot dir")).expect("mkdir");
            std::fs::write(&path, &ptx).expect("write snapshot");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(expected) if expected == ptx => {}
            Ok(expected) => stale.push(format!(
                "{}: differs from {} at line {}",
                f.name,
                path.display(),
                first_difference(&expected, &ptx)
            )),
            Err(e) => stale.push(format!("{}: cannot read {}: {e}", f.name, path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "Fix: review the PTX change and run `VYRE_UPDATE_SNAPSHOTS=1 cargo test --test ptx`:\n{}",
        stale.join("\n")
    );
}

fn first_difference(a: &str, b: &str) -> usize {
    a.lines()
        .zip(b.lines())
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.lines().count().min(b.lines().count()))
        + 1
}

/// Negative control for the snapshot comparison: a one-instruction change is reported
/// at the right line.
#[test]
fn snapshot_comparison_reports_a_changed_line() {
    let ptx = emit(&fixture("every_binary_op", every_binary_op()));
    let changed = ptx.replacen("add.rn.f32", "add.f32", 1);
    assert_ne!(ptx, changed);
    let line = first_difference(&ptx, &changed);
    assert!(changed.lines().nth(line - 1).unwrap().contains("add.f32"));
}

// ----- properties ------------------------------------------------------------------------

/// Locks out nondeterminism (hash-map order, addresses, counters shared across calls
/// leaking into names): emitting twice, and emitting an independently built equal
/// program, gives identical bytes.
#[test]
fn emission_is_deterministic() {
    let first: Vec<String> = fixtures().iter().map(emit).collect();
    let again: Vec<String> = fixtures().iter().map(emit).collect();
    assert_eq!(first, again);
    for (f, ptx) in fixtures().iter().zip(&first) {
        assert_eq!(&emit(f), ptx, "{} changed between two calls", f.name);
    }
}

/// The kernel parameter list: `(type, name, comment)` per parameter.
fn parameters(ptx: &str) -> Vec<(String, String, String)> {
    let start = ptx
        .find(&format!(".visible .entry {ENTRY_NAME}("))
        .expect("entry");
    let list = &ptx[start..];
    // A list closes on a line of its own (a comment may end in `)`); an empty one
    // right after its `(`.
    let end = list
        .find("\n)\n")
        .or_else(|| list.find(")\n"))
        .expect("end of parameters");
    list[..end]
        .lines()
        .skip(1)
        .map(|line| {
            let (declaration, comment) = line.split_once("//").unwrap_or((line, ""));
            let mut words = declaration.split_whitespace().skip(1);
            let ty = words.next().unwrap_or("").to_string();
            let name = words.next().unwrap_or("").trim_end_matches(',').to_string();
            (ty, name, comment.trim().to_string())
        })
        .collect()
}

/// What is wrong with a module's parameter list for `program` (empty when right):
/// pointers for every global buffer in ascending binding order, then their lengths,
/// then one parameter per scalar in declaration order (`.u32` for `u32`, `i32` and
/// `bool`, `.f32`, `.u64` for the 64-bit types).
fn parameter_problems(program: &Program, ptx: &str) -> Vec<String> {
    let globals = program.global_buffers();
    let scalars = program.scalars();
    let params = parameters(ptx);
    let mut problems = Vec::new();
    if params.len() != 2 * globals.len() + scalars.len() {
        problems.push(format!(
            "{} parameters for {} buffers and {} scalars",
            params.len(),
            globals.len(),
            scalars.len()
        ));
    }
    let (buffer_params, scalar_params) = params.split_at((2 * globals.len()).min(params.len()));
    for (position, (ty, name, comment)) in buffer_params.iter().enumerate() {
        let (want_ty, kind, buffer) = if position < globals.len() {
            (".u64", "ptr", globals[position])
        } else {
            match globals.get(position - globals.len()) {
                Some(b) => (".u32", "len", *b),
                None => break,
            }
        };
        let index = position % globals.len().max(1);
        if ty != want_ty || *name != format!("vyre_{kind}_{index}") {
            problems.push(format!("parameter {position} is `{ty} {name}`"));
        }
        if !comment.starts_with(&format!("@binding({})", buffer.binding)) {
            problems.push(format!(
                "parameter {position} ({comment}) should describe binding {}",
                buffer.binding
            ));
        }
    }
    problems.extend(scalar_parameter_problems(scalars, scalar_params));
    problems
}

/// What is wrong with `params` as the parameters of `scalars`, in order.
fn scalar_parameter_problems(
    scalars: &[ScalarDecl],
    params: &[(String, String, String)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (position, (decl, (ty, name, comment))) in scalars.iter().zip(params).enumerate() {
        let want_ty = match decl.ty {
            ScalarType::F32 => ".f32",
            ScalarType::U64 | ScalarType::I64 => ".u64",
            _ => ".u32",
        };
        if ty != want_ty || *name != format!("vyre_scalar_{position}") {
            problems.push(format!("scalar parameter {position} is `{ty} {name}`"));
        }
        if *comment != decl.to_string() {
            problems.push(format!("scalar parameter {position} describes `{comment}`"));
        }
    }
    problems
}

/// Locks out a parameter layout the backend cannot rely on: pointers of global
/// buffers in ascending binding order, then one `u32` length per global buffer in the
/// same order, whatever order the buffers were declared in.
#[test]
fn kernel_parameters_are_pointers_then_lengths_in_binding_order() {
    for f in fixtures() {
        let problems = parameter_problems(&f.program, &emit(&f));
        assert!(problems.is_empty(), "{}: {problems:?}", f.name);
    }
    let program = unordered_bindings();
    let ptx = emit(&fixture("unordered_bindings", program.clone()));
    let bindings: Vec<String> = parameters(&ptx).into_iter().map(|p| p.2).collect();
    assert_eq!(bindings.len(), 6);
    for (comment, binding) in bindings.iter().zip([0, 4, 7, 0, 4, 7]) {
        assert!(
            comment.starts_with(&format!("@binding({binding})")),
            "{bindings:?}"
        );
    }
}

/// Locks out scalar parameters that move when the result ABI is on (the backend
/// passes them after the result ABI's five): with the result ABI the scalars follow
/// `vyre_ranges`, in declaration order; without it they follow the lengths (the
/// snapshot fixture). Negative control: two scalar parameters swapped are caught.
#[test]
fn scalar_parameters_follow_the_result_abi() {
    let program = scalar_parameters();
    let ptx = program_to_ptx_with_results(&program, &CHECKED, 90, 32).expect("emits");
    let params = parameters(&ptx);
    let buffers = 2 * program.global_buffers().len();
    // `.param .align 8 .b8 vyre_ranges[256]`, the last result parameter.
    let ranges = params
        .iter()
        .position(|(ty, _, _)| ty == ".align")
        .expect("result parameters");
    assert_eq!(ranges, buffers + 4, "{params:?}");
    let scalars = &params[ranges + 1..];
    assert_eq!(scalars.len(), program.scalars().len());
    let problems = scalar_parameter_problems(program.scalars(), scalars);
    assert!(problems.is_empty(), "{problems:?}");
    let mut swapped = scalars.to_vec();
    swapped.swap(0, 1);
    assert!(!scalar_parameter_problems(program.scalars(), &swapped).is_empty());
    // Each scalar is loaded once, from its own parameter.
    for position in 0..program.scalars().len() {
        let load = format!("[vyre_scalar_{position}];");
        assert_eq!(ptx.matches(&load).count(), 1, "{load}\n{ptx}");
    }
}

/// Negative control: the parameter check fails on a module whose first two pointer
/// parameters were swapped (declaration order instead of binding order).
#[test]
fn parameter_check_catches_swapped_parameters() {
    let program = unordered_bindings();
    let ptx = emit(&fixture("unordered_bindings", program.clone()));
    let lines: Vec<&str> = ptx.lines().collect();
    let first = lines.iter().position(|l| l.contains("vyre_ptr_0")).unwrap();
    let mut swapped: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    swapped.swap(first, first + 1);
    assert!(!parameter_problems(&program, &swapped.join("\n")).is_empty());
}

/// Memory instructions on program buffers that are not guarded by a predicate.
fn unguarded_accesses(ptx: &str) -> Vec<String> {
    ptx.lines()
        .map(str::trim)
        .filter(|line| {
            let access = line.starts_with("ld.global")
                || line.starts_with("st.global")
                || line.starts_with("red.global")
                || line.starts_with("atom.global")
                || line.starts_with("ld.shared")
                || line.starts_with("red.shared")
                || line.starts_with("atom.shared")
                || line.starts_with("ld.local")
                || (line.starts_with("st.shared") && !line.ends_with("], 0;"))
                || (line.starts_with("st.local") && !line.ends_with("], 0;"));
            access && !line.contains(GRID_BARRIER_SYMBOL) && !line.starts_with("ld.acquire")
        })
        .map(str::to_string)
        .collect()
}

/// Locks out a missing bounds check: with bounds checks on, every load, store and
/// atomic on a program buffer is predicated (`@%p ...`), so out-of-range loads read 0
/// and stores do nothing, as in the reference interpreter.
#[test]
fn bounds_checks_guard_every_memory_access() {
    for f in fixtures().iter().filter(|f| f.options.bounds_checks) {
        let unguarded = unguarded_accesses(&emit(f));
        assert!(unguarded.is_empty(), "{}: {unguarded:?}", f.name);
    }
}

/// Negative control: the same programs with bounds checks off do have unguarded
/// accesses, so the check above can fail.
#[test]
fn bounds_check_guard_detects_unchecked_code() {
    for f in fixtures().iter().filter(|f| !f.options.bounds_checks) {
        assert!(!unguarded_accesses(&emit(f)).is_empty(), "{}", f.name);
    }
}

/// The loop-control instructions of the first loop of `kind` (`while` or `loop`) in
/// `ptx`: every `setp` and every branch between its first label and its end label.
/// With bounds checks off the body of `while_scan` has no compare of its own, so
/// whatever is counted is what the loop itself costs per iteration.
fn loop_control_instructions(ptx: &str, kind: &str) -> (usize, usize) {
    let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
    let top = format!("$L_{kind}_");
    let end = format!("$L_{kind}_end_");
    let first = lines
        .iter()
        .position(|l| l.starts_with(&top) && l.ends_with(':') && !l.starts_with(&end))
        .expect("a loop label");
    let last = lines
        .iter()
        .position(|l| l.starts_with(&end))
        .expect("a loop end label");
    let span = &lines[first..last];
    let compares = span.iter().filter(|l| l.starts_with("setp")).count();
    let branches = span.iter().filter(|l| l.contains("bra ")).count();
    (compares, branches)
}

/// Locks out a `while` loop that costs more than hand-written PTX: each iteration of
/// `while text[position] != 32 { position = position + 1 }` runs the body, one
/// compare and one conditional branch back (the test sits below the body). Negative
/// control: the shape before rotation (test at the top, unconditional branch back)
/// counts two branches.
#[test]
fn a_while_iteration_costs_one_compare_and_one_branch() {
    let ptx = emit(&Fixture {
        options: UNCHECKED,
        ..fixture("while_scan_unchecked", while_scan())
    });
    assert_eq!(loop_control_instructions(&ptx, "while"), (1, 1), "{ptx}");
    let unrotated = "$L_while_1:\n\tsetp.eq.u32 %p1, %r11, %r12;\n\t@%p1 bra $L_while_end_2;\n\
                     \tadd.u32 %r8, %r8, 1;\n\tbra $L_while_1;\n$L_while_end_2:\n";
    assert_eq!(loop_control_instructions(unrotated, "while"), (1, 2));
    // The bounded loop is rotated the same way.
    let sum = Program::builder([32, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let total = b.let_mut("total", 0u32);
            b.loop_("k", 0u32, Expr::length("out"), |b, k| {
                b.assign("total", total.clone() + k);
            });
            b.store("out", 0u32, total);
        })
        .build();
    let ptx = emit(&Fixture {
        options: UNCHECKED,
        ..fixture("for_sum", sum)
    });
    assert_eq!(loop_control_instructions(&ptx, "loop"), (1, 1), "{ptx}");
}

/// Float instructions that may be contracted into a fused multiply-add or that
/// flush denormals: `add/sub/mul.f32` without `.rn`, any `fma`, any `.ftz`.
fn contractible_float_ops(ptx: &str) -> Vec<String> {
    ptx.lines()
        .map(str::trim)
        .filter(|l| {
            [
                "add.f32",
                "sub.f32",
                "mul.f32",
                "div.f32",
                "div.approx",
                "div.full",
            ]
            .iter()
            .any(|op| l.starts_with(op))
                || l.starts_with("fma")
                || l.contains(".ftz")
        })
        .map(str::to_string)
        .collect()
}

/// Locks out fused or flushed float arithmetic: the IR rounds every `f32` operation
/// separately with denormals kept, so only `.rn` forms may appear.
#[test]
fn float_arithmetic_is_rounded_per_operation() {
    for f in fixtures() {
        let bad = contractible_float_ops(&emit(&f));
        assert!(bad.is_empty(), "{}: {bad:?}", f.name);
    }
    // Negative control: an unrounded add is caught.
    assert_eq!(contractible_float_ops("\tadd.f32 %f1, %f2, %f3;").len(), 1);
}

/// Locks out a grid-barrier symbol the backend would zero for nothing (or miss): it
/// is declared exactly when the program has a grid sync.
#[test]
fn grid_barrier_symbol_only_with_grid_sync() {
    let declaration = format!(".global .align 4 .u32 {GRID_BARRIER_SYMBOL}[{GRID_BARRIER_WORDS}];");
    for f in fixtures() {
        let ptx = emit(&f);
        let has_sync = f.name == "grid_sync";
        assert_eq!(ptx.contains(&declaration), has_sync, "{}", f.name);
        assert_eq!(ptx.matches(".entry").count(), 1, "{}", f.name);
    }
}

/// Locks out workgroup memory that starts with garbage: with workgroup buffers, the
/// kernel zeroes them and waits (`bar.sync 0`) before the first program statement.
#[test]
fn workgroup_memory_is_zeroed_before_the_program_runs() {
    let ptx = emit(&fixture("workgroup_memory", workgroup_memory()));
    let zero = ptx.find("st.shared.u32 [").expect("zeroing store");
    let first_statement = ptx.find("// let lid").expect("first statement");
    let wait = ptx[zero..].find("bar.sync 0;").expect("barrier") + zero;
    assert!(zero < wait && wait < first_statement, "{ptx}");
    // Control: a program without workgroup buffers has no zeroing.
    assert!(!emit(&fixture("literals", literals())).contains("st.shared"));
}

/// Locks out workgroup memory past 48 KiB that cannot run: static `.shared` arrays
/// (ptxas refuses them: "too much shared data"), a pool whose buffers overlap or
/// misalign, one `.extern` name declared twice in a module of several kernels, or a
/// kernel whose pool size the backend reads differently from what its PTX lays out.
/// The 100 KiB program's kernel declares one `.extern .shared .align 16` pool and no
/// static array, puts `wide` (8-byte elements) at offset 0 and `table` at 512, its
/// pool is `dynamic_shared_bytes` bytes, and it assembles with ptxas alone (plain and
/// result ABI) and as two kernels of one module beside a static one. A program of
/// 48 KiB exactly keeps its static arrays. Negative control: the same kernel with
/// the pool declared as a static array of that size is refused by ptxas.
#[test]
fn workgroup_memory_past_48_kib_is_one_dynamic_pool() {
    use vyre_cuda::codegen::ptx::{
        dynamic_shared_bytes, workgroup_memory, PtxModuleBuilder, DYNAMIC_SHARED_SYMBOL,
        MAX_STATIC_SHARED_BYTES,
    };
    let caps = LoweringCaps::new(true, 32).expect("32-lane subgroups");
    let lowered = lower_workgroup_reductions(&wide_shared::program(), &caps);
    let bytes = dynamic_shared_bytes(&lowered);
    let (placed, pool) = workgroup_memory::layout(&lowered);
    assert_eq!(bytes, pool);
    assert!(bytes >= 100 * 1024 + 8 * wide_shared::WIDE_WORDS, "{bytes}");
    let offset = |name: &str| placed.iter().find(|(d, _)| &*d.name == name).unwrap().1;
    assert_eq!((offset("wide"), offset("table")), (0, 512));

    let declaration = format!(".extern .shared .align 16 .b8 {DYNAMIC_SHARED_SYMBOL}[];");
    let plain = program_to_ptx(&lowered, &CHECKED, 90, 32).expect("plain");
    let with_results = program_to_ptx_with_results(&lowered, &CHECKED, 90, 32).expect("results");
    for ptx in [&plain, &with_results] {
        assert_eq!(ptx.matches(&declaration).count(), 1, "{ptx}");
        assert!(!ptx.contains(".shared .align 4 .b8"), "{ptx}");
        assert!(!ptx.contains(".shared .align 8 .b8"), "{ptx}");
        assert!(
            ptx.contains(&format!(", {DYNAMIC_SHARED_SYMBOL};")),
            "{ptx}"
        );
        assert!(ptx.contains(", 512;"), "table at offset 512: {ptx}");
        assert!(ptx.contains(&format!("dynamic workgroup memory: {bytes} bytes")));
    }

    let static_limit = Program::builder([32, 1, 1])
        .buffer(
            "pool",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(MAX_STATIC_SHARED_BYTES / 4),
        )
        .body(|b| {
            b.store("pool", Expr::local_id(Axis::X), 1u32);
        })
        .build();
    let static_ptx = program_to_ptx(&static_limit, &CHECKED, 90, 32).expect("48 KiB");
    assert_eq!(dynamic_shared_bytes(&static_limit), 0);
    assert!(!static_ptx.contains(".extern"), "{static_ptx}");

    let mut module = PtxModuleBuilder::with_results(&CHECKED, 90, 32);
    for program in [&lowered, &static_limit, &lowered] {
        module.push(program).expect("push");
    }
    let module = module.finish();
    for kernel in [0, 2] {
        let pool = format!(".extern .shared .align 16 .b8 {DYNAMIC_SHARED_SYMBOL}_{kernel}[];");
        assert_eq!(module.matches(&pool).count(), 1, "{module}");
    }

    let Some(ptxas) = ptxas::require("workgroup_memory_past_48_kib_is_one_dynamic_pool") else {
        return;
    };
    let modules = [
        ("wide_shared", plain.as_str()),
        ("wide_shared_results", with_results.as_str()),
        ("wide_shared_module", module.as_str()),
        ("static_limit", static_ptx.as_str()),
    ];
    ptxas::assemble_all(&ptxas, modules).unwrap_or_else(|failures| panic!("{failures}"));
    let as_static = plain.replacen(
        &declaration,
        &format!(".shared .align 16 .b8 {DYNAMIC_SHARED_SYMBOL}[{bytes}];"),
        1,
    );
    let error = ptxas::assemble(&ptxas, "wide_shared_static", &as_static)
        .expect_err("ptxas took static shared memory past 48 KiB");
    assert!(error.contains("shared"), "{error}");
}

// ----- errors ------------------------------------------------------------------------------

/// Locks out panics and unhelpful errors on inputs codegen cannot handle.
#[test]
fn unsupported_inputs_give_fix_errors() {
    let unlowered = reduction_source([64, 1, 1]);
    let error = program_to_ptx(&unlowered, &CHECKED, 90, 32).unwrap_err();
    assert!(
        matches!(&error, CodegenError::Invalid(e) if e.rule() == vyre_cuda::ir::validate::Rule::WorkgroupReduceNotLowered),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("lower_workgroup_reductions"),
        "{error}"
    );

    let simple = literals();
    let error = program_to_ptx(&simple, &CHECKED, 61, 32).unwrap_err();
    assert_eq!(error, CodegenError::UnsupportedTarget { sm: 61 });
    let error = program_to_ptx(&simple, &CHECKED, 90, 64).unwrap_err();
    assert_eq!(
        error,
        CodegenError::UnsupportedSubgroupSize { subgroup_size: 64 }
    );

    // Programs that skipped validation: the validator's error, never a panic.
    let unknown_variable = Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("out", 0u32, Expr::var("missing"));
        })
        .build();
    let unknown_buffer = Program::builder([1, 1, 1])
        .body(|b| {
            b.store("nowhere", 0u32, 1u32);
        })
        .build();
    let mistyped = Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("out", Expr::f32(1.0), Expr::u32(1) + Expr::f32(2.0));
        })
        .build();
    let zero_workgroup = Program::builder([0, 1, 1]).build();
    for program in [unknown_variable, unknown_buffer, mistyped, zero_workgroup] {
        match program_to_ptx(&program, &CHECKED, 90, 32) {
            Err(CodegenError::Invalid(e)) => {
                assert_eq!(
                    Some(e),
                    validate_lowered(&program, &vyre_cuda::codegen::codegen_limits()).err()
                );
            }
            other => panic!("expected the validator's error for\n{program}\ngot {other:?}"),
        }
    }
    for error in [
        CodegenError::Internal { detail: "x".into() },
        CodegenError::TooLarge {
            program: "'x'".into(),
            limit_bytes: 1,
        },
        CodegenError::LoweredForOtherSubgroupSize {
            lowered_for: 16,
            subgroup_size: 32,
        },
        CodegenError::UnsupportedTarget { sm: 60 },
        CodegenError::UnsupportedSubgroupSize { subgroup_size: 64 },
    ] {
        assert!(error.to_string().starts_with("Fix: "), "{error}");
    }
}

// ----- random programs -----------------------------------------------------------------

/// A small seeded generator of valid lowered programs (every node and expression kind,
/// uniform barriers, grid syncs and subgroup operations only where the IR allows them).
mod random {
    use super::*;

    pub struct Rng(u64);

    impl Rng {
        pub fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
        }
        pub fn next(&mut self) -> u64 {
            // splitmix64
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        pub fn chance(&mut self, percent: u64) -> bool {
            self.next() % 100 < percent
        }
        pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
            items[self.below(items.len())]
        }
    }

    struct Generator {
        rng: Rng,
        buffers: Vec<BufferDecl>,
        threads: u32,
        scopes: Vec<Vec<(Name, ScalarType, bool)>>,
        names: u32,
        /// A return happened inside a nested block: later barriers would be divergent.
        returned: bool,
    }

    pub fn program(seed: u64) -> Program {
        let mut rng = Rng::new(seed);
        let workgroup = rng.pick(&[[1, 1, 1], [32, 1, 1], [64, 1, 1], [8, 4, 2], [48, 1, 1]]);
        let mut buffers = Vec::new();
        let globals = 1 + rng.below(4);
        let mut binding = 0;
        for k in 0..globals {
            let elem = rng.pick(&[ElemType::U8, ElemType::U32, ElemType::I32, ElemType::F32]);
            let access = rng.pick(&[Access::ReadOnly, Access::ReadWrite, Access::WriteOnly]);
            let count = if rng.chance(50) {
                BufferCount::Runtime
            } else {
                BufferCount::Static(1 + rng.below(64) as u32)
            };
            binding += 1 + rng.below(3) as u32;
            buffers.push(BufferDecl::new(
                format!("g{k}"),
                binding,
                access,
                elem,
                count,
            ));
        }
        for k in 0..rng.below(3) {
            let elem = rng.pick(&[ElemType::U8, ElemType::U32, ElemType::I32, ElemType::F32]);
            binding += 1;
            let count = BufferCount::Static(1 + rng.below(100) as u32);
            buffers.push(BufferDecl::new(
                format!("s{k}"),
                binding,
                Access::Workgroup,
                elem,
                count,
            ));
        }
        // Declaration order differs from binding order.
        if rng.chance(50) {
            buffers.reverse();
        }
        let threads = workgroup[0] * workgroup[1] * workgroup[2];
        let mut generator = Generator {
            rng,
            buffers,
            threads,
            scopes: vec![Vec::new()],
            names: 0,
            returned: false,
        };
        let length = 3 + generator.rng.below(10);
        let body = generator.block(0, length);
        Program::new(generator.buffers, workgroup, body)
    }

    impl Generator {
        fn fresh(&mut self) -> Name {
            self.names += 1;
            Arc::from(format!("v{}", self.names))
        }

        fn variables(&self, ty: ScalarType, mutable_only: bool) -> Vec<Name> {
            self.scopes
                .iter()
                .flatten()
                .filter(|(_, t, m)| *t == ty && (*m || !mutable_only))
                .map(|(n, _, _)| n.clone())
                .collect()
        }

        fn block(&mut self, depth: u32, length: usize) -> Vec<Node> {
            self.scopes.push(Vec::new());
            let mut nodes = Vec::new();
            for position in 0..length {
                let last = position + 1 == length;
                if let Some(node) = self.node(depth, last) {
                    nodes.push(node);
                }
            }
            self.scopes.pop();
            nodes
        }

        fn node(&mut self, depth: u32, last: bool) -> Option<Node> {
            let uniform = depth == 0 && !self.returned;
            match self.rng.below(12) {
                0..=2 => {
                    let ty = self.rng.pick(&TYPES);
                    let value = self.expr(ty, 3, uniform);
                    let name = self.fresh();
                    let mutable = self.rng.chance(40);
                    self.scopes.last_mut()?.push((name.clone(), ty, mutable));
                    Some(Node::Let {
                        name,
                        mutable,
                        value,
                    })
                }
                3 => {
                    let ty = self.rng.pick(&TYPES);
                    let candidates = self.variables(ty, true);
                    if candidates.is_empty() {
                        return None;
                    }
                    let name = candidates[self.rng.below(candidates.len())].clone();
                    Some(Node::Assign {
                        name,
                        value: self.expr(ty, 3, uniform),
                    })
                }
                4 | 5 => {
                    let writable: Vec<BufferDecl> = self
                        .buffers
                        .iter()
                        .filter(|b| b.access != Access::ReadOnly)
                        .cloned()
                        .collect();
                    if writable.is_empty() {
                        return None;
                    }
                    let buffer = writable[self.rng.below(writable.len())].clone();
                    Some(Node::Store {
                        index: self.index(uniform),
                        value: self.expr(buffer.elem.value_type(), 3, uniform),
                        buffer: buffer.name,
                    })
                }
                6 if depth < 3 => {
                    let condition = self.expr(ScalarType::Bool, 3, uniform);
                    let then_length = 1 + self.rng.below(4);
                    let then_body = self.block(depth + 1, then_length).into();
                    let else_length = self.rng.below(3);
                    let else_body = self.block(depth + 1, else_length).into();
                    Some(Node::If {
                        condition,
                        then_body,
                        else_body,
                    })
                }
                7 if depth < 3 => {
                    let start = self.expr(ScalarType::U32, 2, uniform);
                    let end = Expr::binary(
                        BinaryOp::Min,
                        self.expr(ScalarType::U32, 2, uniform),
                        Expr::u32(16),
                    );
                    let variable = self.fresh();
                    self.scopes
                        .push(vec![(variable.clone(), ScalarType::U32, false)]);
                    let length = 1 + self.rng.below(4);
                    let body = self.block(depth + 1, length).into();
                    self.scopes.pop();
                    Some(Node::Loop {
                        variable,
                        start,
                        end,
                        body,
                    })
                }
                8 if self.rng.chance(20) => {
                    let buffer = self.u32_buffer(&[Access::ReadOnly, Access::ReadWrite])?;
                    let index = self.index(uniform);
                    let name = self.fresh();
                    self.scopes
                        .last_mut()?
                        .push((name.clone(), ScalarType::U32, false));
                    Some(Node::AcquireLoad {
                        name,
                        buffer,
                        index,
                    })
                }
                8 => {
                    let buffer = self.u32_buffer(&[Access::ReadWrite, Access::Workgroup])?;
                    let op = self.rng.pick(&AtomicOp::ALL);
                    let index = self.index(uniform);
                    let value = self.expr(ScalarType::U32, 2, uniform);
                    Some(match self.rng.below(4) {
                        0 => Node::Atomic {
                            op,
                            buffer,
                            index,
                            value,
                        },
                        3 => {
                            let name = self.fresh();
                            self.scopes
                                .last_mut()?
                                .push((name.clone(), ScalarType::U32, false));
                            Node::AtomicLoad {
                                name,
                                buffer,
                                index,
                            }
                        }
                        returning => {
                            let expected = self.expr(ScalarType::U32, 1, uniform);
                            let name = self.fresh();
                            self.scopes
                                .last_mut()?
                                .push((name.clone(), ScalarType::U32, false));
                            if returning == 1 {
                                Node::AtomicFetch {
                                    name,
                                    op,
                                    buffer,
                                    index,
                                    value,
                                }
                            } else {
                                Node::CompareExchange {
                                    name,
                                    buffer,
                                    index,
                                    expected,
                                    value,
                                }
                            }
                        }
                    })
                }
                9 if uniform => Some(Node::Barrier),
                10 if uniform && self.rng.chance(30) => Some(Node::GridSync),
                11 if depth > 0 && last => {
                    self.returned = true;
                    Some(Node::Return)
                }
                _ => None,
            }
        }

        /// One of the `u32` buffers of `accesses`, at random (`None`: there is none).
        fn u32_buffer(&mut self, accesses: &[Access]) -> Option<Name> {
            let names: Vec<Name> = self
                .buffers
                .iter()
                .filter(|b| b.elem == ElemType::U32 && accesses.contains(&b.access))
                .map(|b| b.name.clone())
                .collect();
            if names.is_empty() {
                return None;
            }
            Some(names[self.rng.below(names.len())].clone())
        }

        fn index(&mut self, uniform: bool) -> Expr {
            if self.rng.chance(50) {
                Expr::global_id(Axis::X)
            } else {
                self.expr(ScalarType::U32, 2, uniform)
            }
        }

        fn literal(&mut self, ty: ScalarType) -> Expr {
            let bits = self.rng.next() as u32;
            let small = self.rng.chance(70);
            match ty {
                ScalarType::U32 => Expr::u32(if small { bits % 8 } else { bits }),
                ScalarType::I32 => Expr::i32(if small {
                    (bits % 8) as i32 - 4
                } else {
                    bits as i32
                }),
                ScalarType::F32 => Expr::f32(if small {
                    (bits % 16) as f32 * 0.25 - 2.0
                } else {
                    f32::from_bits(bits)
                }),
                ScalarType::Bool => Expr::bool(bits & 1 == 1),
                ScalarType::U64 => Expr::u64(u64::from(bits) << (bits % 33)),
                ScalarType::I64 => Expr::i64(-i64::from(bits)),
            }
        }

        fn expr(&mut self, ty: ScalarType, depth: u32, uniform: bool) -> Expr {
            let choice = if depth == 0 {
                self.rng.below(3)
            } else {
                self.rng.below(11)
            };
            match choice {
                0 => self.literal(ty),
                1 => {
                    let candidates = self.variables(ty, false);
                    if candidates.is_empty() {
                        self.literal(ty)
                    } else {
                        Expr::Var(candidates[self.rng.below(candidates.len())].clone())
                    }
                }
                2 => {
                    let readable: Vec<BufferDecl> = self
                        .buffers
                        .iter()
                        .filter(|b| b.elem.value_type() == ty)
                        .cloned()
                        .collect();
                    match (ty, readable.is_empty()) {
                        (ScalarType::U32, _) if self.rng.chance(30) => {
                            let b = self.rng.below(self.buffers.len());
                            Expr::length(self.buffers[b].name.clone())
                        }
                        (_, true) => self.literal(ty),
                        _ => {
                            let buffer = readable[self.rng.below(readable.len())].name.clone();
                            let index = if depth > 1 {
                                self.expr(ScalarType::U32, depth - 1, uniform)
                            } else {
                                Expr::global_id(Axis::X)
                            };
                            Expr::load(buffer, index)
                        }
                    }
                }
                3..=5 => {
                    let operand_ty = if ty == ScalarType::Bool {
                        self.rng.pick(&TYPES)
                    } else {
                        ty
                    };
                    let ops: Vec<BinaryOp> = BinaryOp::ALL
                        .into_iter()
                        .filter(|op| binary_result(*op, operand_ty) == Some(ty))
                        .collect();
                    let op = self.rng.pick(&ops);
                    let rhs_ty =
                        if matches!(op, BinaryOp::Shl | BinaryOp::Shr | BinaryOp::PermuteBytes) {
                            ScalarType::U32
                        } else {
                            operand_ty
                        };
                    Expr::binary(
                        op,
                        self.expr(operand_ty, depth - 1, uniform),
                        self.expr(rhs_ty, depth - 1, uniform),
                    )
                }
                6 => {
                    let options: Vec<(UnaryOp, ScalarType)> = UnaryOp::ALL
                        .into_iter()
                        .flat_map(|op| TYPES.into_iter().map(move |t| (op, t)))
                        .filter(|(op, t)| unary_result(*op, *t) == Some(ty))
                        .collect();
                    let (op, operand_ty) = self.rng.pick(&options);
                    Expr::unary(op, self.expr(operand_ty, depth - 1, uniform))
                }
                7 => Expr::Select {
                    condition: Box::new(self.expr(ScalarType::Bool, depth - 1, uniform)),
                    if_true: Box::new(self.expr(ty, depth - 1, uniform)),
                    if_false: Box::new(self.expr(ty, depth - 1, uniform)),
                },
                8 => {
                    let from = self.rng.pick(&TYPES);
                    self.expr(from, depth - 1, uniform).cast(ty)
                }
                9 if ty == ScalarType::U32 => {
                    let axis = self.rng.pick(&[Axis::X, Axis::Y, Axis::Z]);
                    Expr::Builtin(self.rng.pick(&[
                        Builtin::GlobalId(axis),
                        Builtin::LocalId(axis),
                        Builtin::WorkgroupId(axis),
                        Builtin::WorkgroupCount(axis),
                    ]))
                }
                10 if ty == ScalarType::U32 && uniform && self.threads.is_multiple_of(32) => {
                    let value = Box::new(self.expr(ScalarType::U32, depth - 1, uniform));
                    if self.rng.chance(50) {
                        Expr::SubgroupShuffleXor {
                            value,
                            lane_mask: self.rng.below(32) as u32,
                        }
                    } else {
                        Expr::SubgroupReduce {
                            op: self
                                .rng
                                .pick(&[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max]),
                            value,
                        }
                    }
                }
                _ => self.literal(ty),
            }
        }
    }
}

/// Locks out PTX that only the hand-written fixtures get right: 500 programs from the
/// crate's shared generator (`ir::generate::valid_program`, grid syncs and workgroup
/// reductions on, lowered with and without subgroup operations) plus 250 from this
/// file's generator (subgroup expressions written directly, bounds checks off on some,
/// the `sm_70` shuffle ladder on some) must all assemble. ptxas runs once per module,
/// on two threads.
#[test]
fn random_programs_assemble_with_ptxas() {
    let Some(ptxas) = ptxas::require("random_programs_assemble_with_ptxas") else {
        return;
    };
    const SHARED: u64 = 500;
    const LOCAL: u64 = 250;
    let started = std::time::Instant::now();
    let mut modules = Vec::with_capacity((SHARED + LOCAL) as usize);
    let generator = vyre_cuda::ir::generate::GeneratorOptions {
        allow_grid_sync: true,
        ..Default::default()
    };
    for seed in 0..SHARED {
        let case = vyre_cuda::ir::generate::valid_program(seed, &generator);
        let caps = LoweringCaps {
            subgroup_ops: seed % 2 == 0,
            subgroup_size: 32,
        };
        let program = lower_workgroup_reductions(&case.program, &caps);
        if let Err(e) = validate_lowered(&program, &Limits::default()) {
            panic!("lowered shared-generator program {seed} is not valid: {e}\n{program}");
        }
        let ptx = program_to_ptx(&program, &case.config.codegen, 90, 32).unwrap_or_else(|e| {
            panic!("shared-generator program {seed} did not generate: {e}\n{program}")
        });
        modules.push((format!("shared_{seed}"), ptx));
    }
    for seed in 0..LOCAL {
        let program = random::program(seed);
        if let Err(e) = validate_lowered(&program, &Limits::default()) {
            panic!("random program {seed} is not valid (generator bug): {e}\n{program}");
        }
        let options = CodegenOptions::new().with_bounds_checks(seed % 4 != 3);
        let sm = if seed % 5 == 4 { 70 } else { 90 };
        let ptx = program_to_ptx(&program, &options, sm, 32)
            .unwrap_or_else(|e| panic!("random program {seed} did not generate: {e}\n{program}"));
        modules.push((format!("local_{seed}"), ptx));
    }
    let emitted = started.elapsed();
    let directory = tempfile::tempdir().expect("tempdir");
    let workers = 2;
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let modules = &modules;
                let ptxas = &ptxas;
                let directory = directory.path();
                scope.spawn(move || {
                    modules
                        .iter()
                        .skip(worker)
                        .step_by(workers)
                        .filter_map(|(name, ptx)| {
                            ptxas::assemble_in(ptxas, directory, name, ptx).err()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("ptxas worker"))
            .collect()
    });
    eprintln!(
        "random_programs_assemble_with_ptxas: {} programs, emitted in {emitted:?}, \
         assembled in {:?}",
        modules.len(),
        started.elapsed() - emitted
    );
    if let Some(first) = failures.first() {
        panic!(
            "{} of {} random programs failed; first:\n{first}",
            failures.len(),
            modules.len()
        );
    }
}

/// Locks out a differential program the GPU run would stop at before comparing any
/// bytes, so its 10,000 programs prove less than they claim: the reference refuses it
/// (work cap, memory, a validator disagreement), its lowering is invalid, or ptxas
/// rejects the backend's kernel for it. The differential's first 200 cases (every
/// construct; see `differential_programs_draw_every_construct`) run on the reference
/// interpreter, and are lowered as on an H200 (warp shuffles) or without subgroup
/// operations, emitted with the result ABI the backend uses and assembled by ptxas.
#[test]
fn differential_programs_run_on_the_reference_and_assemble() {
    let Some(ptxas) = ptxas::require("differential_programs_run_on_the_reference_and_assemble")
    else {
        return;
    };
    const FIRST_SEED: u64 = 1_000_000;
    const PROGRAMS: u64 = 200;
    let mut modules = Vec::with_capacity(PROGRAMS as usize);
    for seed in FIRST_SEED..FIRST_SEED + PROGRAMS {
        let case = vyre_cuda::ir::generate::differential_case(seed);
        let options = vyre_cuda::reference::ReferenceOptions::default();
        let inputs = case.input_slices();
        let ran = vyre_cuda::reference::run_with_scalars(
            &case.program,
            &inputs,
            &case.scalars,
            &case.config,
            &options,
        );
        if let Err(e) = ran {
            panic!(
                "seed {seed}: the reference refused it: {e}\n{}",
                case.program
            );
        }
        let caps = LoweringCaps {
            subgroup_ops: seed % 3 != 0,
            subgroup_size: 32,
        };
        let lowered = vyre_cuda::lower::lower(&case.program, &caps)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", case.program));
        let ptx = program_to_ptx_with_results(&lowered, &case.config.codegen, 90, 32)
            .unwrap_or_else(|e| panic!("seed {seed} did not generate: {e}\n{lowered}"));
        modules.push((format!("differential_{seed}"), ptx));
    }
    let directory = tempfile::tempdir().expect("tempdir");
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
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
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("ptxas worker"))
            .collect()
    });
    if let Some(first) = failures.first() {
        panic!(
            "{} of {PROGRAMS} differential programs failed; first:\n{first}",
            failures.len()
        );
    }
}

/// Locks out a local generator too narrow to exercise codegen: across its seeds every
/// node kind and every expression kind appears.
#[test]
fn random_programs_cover_every_node_and_expression_kind() {
    fn walk_expr(e: &Expr, seen: &mut std::collections::BTreeSet<&'static str>) {
        let kind = match e {
            Expr::Literal(_) => "literal",
            Expr::Var(_) => "var",
            Expr::Load { index, .. } => {
                walk_expr(index, seen);
                "load"
            }
            Expr::Length { .. } => "length",
            Expr::Scalar(_) => "scalar",
            Expr::Binary { lhs, rhs, .. } => {
                walk_expr(lhs, seen);
                walk_expr(rhs, seen);
                "binary"
            }
            Expr::Unary { operand, .. } => {
                walk_expr(operand, seen);
                "unary"
            }
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => {
                walk_expr(condition, seen);
                walk_expr(if_true, seen);
                walk_expr(if_false, seen);
                "select"
            }
            Expr::Cast { value, .. } => {
                walk_expr(value, seen);
                "cast"
            }
            Expr::Builtin(_) => "builtin",
            Expr::SubgroupShuffleXor { value, .. } => {
                walk_expr(value, seen);
                "shuffle"
            }
            Expr::SubgroupReduce { value, .. } => {
                walk_expr(value, seen);
                "subgroup_reduce"
            }
            Expr::SubgroupScan { value, .. } => {
                walk_expr(value, seen);
                "subgroup_scan"
            }
        };
        seen.insert(kind);
    }
    fn walk(block: &[Node], seen: &mut std::collections::BTreeSet<&'static str>) {
        for node in block {
            let kind = match node {
                Node::Let { value, .. } | Node::Assign { value, .. } => {
                    walk_expr(value, seen);
                    if matches!(node, Node::Let { .. }) {
                        "let"
                    } else {
                        "assign"
                    }
                }
                Node::Store { index, value, .. } | Node::Atomic { index, value, .. } => {
                    walk_expr(index, seen);
                    walk_expr(value, seen);
                    if matches!(node, Node::Store { .. }) {
                        "store"
                    } else {
                        "atomic"
                    }
                }
                Node::AtomicFetch { index, value, .. } => {
                    walk_expr(index, seen);
                    walk_expr(value, seen);
                    "atomic_fetch"
                }
                Node::CompareExchange {
                    index,
                    expected,
                    value,
                    ..
                } => {
                    walk_expr(index, seen);
                    walk_expr(expected, seen);
                    walk_expr(value, seen);
                    "compare_exchange"
                }
                Node::AtomicLoad { index, .. } => {
                    walk_expr(index, seen);
                    "atomic_load"
                }
                Node::AcquireLoad { index, .. } => {
                    walk_expr(index, seen);
                    "acquire_load"
                }
                Node::If {
                    condition,
                    then_body,
                    else_body,
                } => {
                    walk_expr(condition, seen);
                    walk(then_body, seen);
                    walk(else_body, seen);
                    "if"
                }
                Node::Loop {
                    start, end, body, ..
                } => {
                    walk_expr(start, seen);
                    walk_expr(end, seen);
                    walk(body, seen);
                    "loop"
                }
                Node::While { condition, body } => {
                    walk_expr(condition, seen);
                    walk(body, seen);
                    "while"
                }
                Node::Break => "break",
                Node::Continue => "continue",
                Node::Barrier => "barrier",
                Node::GridSync => "grid_sync",
                Node::Fence => "fence",
                Node::WorkgroupFence => "workgroup_fence",
                Node::WorkgroupReduce { .. } => "workgroup_reduce",
                Node::WorkgroupScan { .. } => "workgroup_scan",
                Node::Return => "return",
            };
            seen.insert(kind);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..250 {
        walk(random::program(seed).entry(), &mut seen);
    }
    let expected = [
        "let",
        "assign",
        "store",
        "if",
        "loop",
        "atomic",
        "atomic_fetch",
        "compare_exchange",
        "atomic_load",
        "acquire_load",
        "barrier",
        "grid_sync",
        "return",
        "literal",
        "var",
        "load",
        "length",
        "binary",
        "unary",
        "select",
        "cast",
        "builtin",
        "shuffle",
        "subgroup_reduce",
    ];
    let missing: Vec<&&str> = expected.iter().filter(|k| !seen.contains(**k)).collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
}

// ----- on the GPU ------------------------------------------------------------------------

/// Edge operands per type: zeros of both signs, NaN (with a payload), infinities, a
/// denormal, values at and past integer limits, shift amounts past 31.
const EDGE_U32: [u32; 12] = [
    0,
    1,
    2,
    31,
    32,
    33,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    12345,
    7,
    0xdead_beef,
];
const EDGE_I32: [i32; 12] = [
    0,
    1,
    -1,
    2,
    -2,
    33,
    i32::MIN,
    i32::MAX,
    -12345,
    7,
    -7,
    i32::MIN + 1,
];
const EDGE_F32: [u32; 12] = [
    0x0000_0000, // 0.0
    0x8000_0000, // -0.0
    0x3f80_0000, // 1.0
    0xbfc0_0000, // -1.5
    0x7fc0_0001, // NaN with a payload
    0x7f80_0000, // inf
    0xff80_0000, // -inf
    0x0000_0001, // smallest denormal
    0x7f7f_ffff, // f32::MAX
    0x4f80_0000, // 4294967296.0
    0xcf00_0001, // just below i32::MIN
    0x4effffff,  // just below 2^31
];

/// Every operator, unary operator, cast and select on every pair of edge operands of
/// `types` (the 32-bit types, or all six): thread `t` takes operands
/// `a = x[t / 12]`, `b = x[t % 12]` and writes one result per operation into the
/// output buffer of the result's type. Inputs: `u`, `i`, `f` (and `w`, `s` for the
/// 64-bit types), then one output per type, `out_<type>`.
fn edge_case_program(types: &[ScalarType]) -> Program {
    const PAIRS: u32 = 144;
    let mut counts = [0u32; 6]; // results per thread per output type
    let slot = |ty: ScalarType| {
        types
            .iter()
            .position(|&t| t == ty)
            .expect("a result of one of the types")
    };
    let mut stores: Vec<(ScalarType, Expr)> = Vec::new();
    for op in BinaryOp::ALL {
        for &ty in types {
            if let Some(result) = binary_result(op, ty) {
                let rhs = if matches!(op, BinaryOp::Shl | BinaryOp::Shr | BinaryOp::PermuteBytes) {
                    operand("b", ScalarType::U32)
                } else {
                    operand("b", ty)
                };
                stores.push((result, Expr::binary(op, operand("a", ty), rhs)));
            }
        }
    }
    for op in UnaryOp::ALL {
        for &ty in types {
            if let Some(result) = unary_result(op, ty) {
                stores.push((result, Expr::unary(op, operand("a", ty))));
            }
        }
    }
    for &from in types {
        for &to in types {
            stores.push((to, operand("a", from).cast(to)));
        }
    }
    for &ty in types {
        let chosen = operand("a", ScalarType::Bool).select(operand("a", ty), operand("b", ty));
        stores.push((ty, chosen));
    }
    let mut indexed = Vec::new();
    for (ty, value) in stores {
        let s = slot(ty);
        indexed.push((ty, counts[s], value));
        counts[s] += 1;
    }
    let outputs: Vec<String> = types
        .iter()
        .map(|ty| format!("out_{}", ty.name()))
        .collect();
    let wide = types.iter().any(|ty| ty.is_wide());
    let mut inputs = vec![
        ("u", ElemType::U32),
        ("i", ElemType::I32),
        ("f", ElemType::F32),
    ];
    if wide {
        inputs.extend([("w", ElemType::U64), ("s", ElemType::I64)]);
    }
    let mut builder = Program::builder([64, 1, 1]);
    for (binding, (name, elem)) in inputs.iter().enumerate() {
        let count = BufferCount::Static(12);
        builder = builder.buffer(*name, binding as u32, Access::ReadOnly, *elem, count);
    }
    for (k, (name, ty)) in outputs.iter().zip(types).enumerate() {
        let elem = match ty {
            ScalarType::I32 => ElemType::I32,
            ScalarType::F32 => ElemType::F32,
            ScalarType::U64 => ElemType::U64,
            ScalarType::I64 => ElemType::I64,
            ScalarType::U32 | ScalarType::Bool => ElemType::U32,
        };
        let count = BufferCount::Static(PAIRS * counts[k].max(1));
        let binding = (inputs.len() + k) as u32;
        builder = builder.buffer(name.as_str(), binding, Access::WriteOnly, elem, count);
    }
    builder
        .body(|b| {
            let t = b.let_("t", Expr::global_id(Axis::X));
            b.if_(t.clone().greater_equal(PAIRS), |b| {
                b.return_();
            });
            let (x, y) = (t.clone() / 12u32, t.clone() % 12u32);
            b.let_("a_u32", Expr::load("u", x.clone()));
            b.let_("b_u32", Expr::load("u", y.clone()));
            b.let_("a_i32", Expr::load("i", x.clone()));
            b.let_("b_i32", Expr::load("i", y.clone()));
            b.let_("a_f32", Expr::load("f", x.clone()));
            b.let_("b_f32", Expr::load("f", y.clone()));
            if wide {
                b.let_("a_u64", Expr::load("w", x.clone()));
                b.let_("b_u64", Expr::load("w", y.clone()));
                b.let_("a_i64", Expr::load("s", x.clone()));
                b.let_("b_i64", Expr::load("s", y.clone()));
            }
            b.let_("a_bool", Expr::load("u", x).rem(2u32).equals(1u32));
            b.let_("b_bool", Expr::load("u", y).rem(2u32).equals(1u32));
            for (ty, position, value) in indexed {
                let s = slot(ty);
                let index = t.clone() * counts[s] + position;
                let value = if ty == ScalarType::Bool {
                    value.cast(ScalarType::U32)
                } else {
                    value
                };
                b.store(outputs[s].as_str(), index, value);
            }
        })
        .build()
}

/// `program` on the GPU over host bytes (one per global buffer), waited for.
fn gpu_run(
    gpu: &vyre_cuda::backend::CudaBackend,
    program: &Program,
    (inputs, scalars): (&[&[u8]], &[Literal]),
    config: &vyre_cuda::DispatchConfig,
) -> Result<vyre_cuda::backend::Outputs, vyre_cuda::backend::BackendError> {
    use vyre_cuda::backend::{Binding, Dispatch};
    let bindings: Vec<Binding> = inputs.iter().map(|bytes| Binding::Host(bytes)).collect();
    let mut request = Dispatch::program(program, &bindings).config(config);
    for (decl, &value) in program.scalars().iter().zip(scalars) {
        request = request.scalar(&decl.name, value);
    }
    gpu.run(request).map(|finished| finished.outputs)
}

/// Locks out any PTX instruction whose edge-case result differs from the reference
/// interpreter (integer division by zero and overflow, shifts past 31, NaN and signed
/// zeros through min/max/compare/cast, saturating float-to-integer casts, `abs` of
/// `i32::MIN`, denormals): byte-identical outputs on a real GPU, bounds checks on and
/// off. Run on the GPU machine: `cargo test --test ptx -- --ignored gpu_`.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_operator_edge_cases_match_reference() {
    let gpu = vyre_cuda::backend::CudaBackend::acquire().expect("a CUDA device");
    for types in [&TYPES[..], &ScalarType::ALL[..]] {
        edge_cases_match_reference(&gpu, types);
    }
}

/// The edge-case operands as input buffers for [`edge_case_program`] over `types`,
/// then zeroed outputs.
fn edge_case_inputs(program: &Program, types: &[ScalarType]) -> Vec<Vec<u8>> {
    let mut inputs: Vec<Vec<u8>> = vec![
        EDGE_U32.iter().flat_map(|v| v.to_le_bytes()).collect(),
        EDGE_I32.iter().flat_map(|v| v.to_le_bytes()).collect(),
        EDGE_F32.iter().flat_map(|v| v.to_le_bytes()).collect(),
    ];
    if types.iter().any(|ty| ty.is_wide()) {
        inputs.push(EDGE_U64.iter().flat_map(|v| v.to_le_bytes()).collect());
        inputs.push(EDGE_I64.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    for decl in program.global_buffers().iter().skip(inputs.len()) {
        inputs.push(vec![0u8; decl.static_size_bytes().unwrap_or(0) as usize]);
    }
    inputs
}

/// The 64-bit edge operands: zero, one, the ends of both ranges, values just past 32
/// bits, and shift amounts past 63 once truncated.
const EDGE_U64: [u64; 12] = [
    0,
    1,
    63,
    64,
    65,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
    0xdead_beef_0bad_f00d,
    0x0000_0001_0000_0021,
];
const EDGE_I64: [i64; 12] = [
    0,
    1,
    -1,
    2,
    -2,
    i64::MIN,
    i64::MAX,
    i64::MIN + 1,
    i32::MIN as i64,
    u32::MAX as i64,
    -0x1234_5678_9abc,
    7,
];

/// Locks out a 64-bit edge-case program that the GPU test could not even compare: it
/// is valid lowered IR and runs on the reference interpreter.
#[test]
fn wide_edge_case_program_runs_on_the_reference() {
    let program = edge_case_program(&ScalarType::ALL);
    validate_lowered(&program, &Limits::default()).expect("edge-case program is valid");
    let inputs = edge_case_inputs(&program, &ScalarType::ALL);
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    vyre_cuda::reference::run(&program, &borrowed, &vyre_cuda::DispatchConfig::linear(3))
        .expect("reference");
}

fn edge_cases_match_reference(gpu: &vyre_cuda::backend::CudaBackend, types: &[ScalarType]) {
    let program = edge_case_program(types);
    validate_lowered(&program, &Limits::default()).expect("edge-case program is valid");
    let inputs = edge_case_inputs(&program, types);
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    for bounds_checks in [true, false] {
        let config = vyre_cuda::DispatchConfig::linear(3)
            .with_codegen(CodegenOptions::new().with_bounds_checks(bounds_checks));
        let expected = vyre_cuda::reference::run(&program, &borrowed, &config).expect("reference");
        let got = gpu_run(gpu, &program, (&borrowed, &[]), &config).expect("gpu dispatch");
        assert_eq!(got.len(), expected.len());
        for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
            let differing: Vec<String> = g
                .chunks_exact(4)
                .zip(e.chunks_exact(4))
                .enumerate()
                .filter(|(_, (x, y))| x != y)
                .take(20)
                .map(|(word, (x, y))| format!("word {word}: gpu {x:02x?} reference {y:02x?}"))
                .collect();
            assert!(
                differing.is_empty(),
                "output {k} differs (bounds checks {bounds_checks}):\n{}\n{program}",
                differing.join("\n")
            );
        }
    }
}

/// Locks out a store lost after an acquire load of the same element, the defect
/// of the random program whose stores to `owned` never arrived on an H200
/// (2026-12-06, `gpu_soak`, seed `0x50a6_0039`): each thread acquire-loaded its own
/// element of a read-write buffer, dropped the value, then stored to that element
/// under the same bounds check, and ptxas (12.9 and 13.0, sm_90) turned the dropped
/// `ld.acquire` into a cache invalidate under the check's predicate but dropped the
/// comparison that computed it, so the store ran under a stale predicate. Each
/// program stores `3 · gid + 1` to `owned[gid]` after an acquire load of that
/// element, on more threads than `owned` has elements (the bounds check decides):
/// the value dropped, kept, dropped inside a branch on the same bound, and (the
/// control) an atomic load in its place; in one workgroup of 32 (the result ABI's
/// one-warp path, whose predicate the store ran under) and in four of 64. Every
/// output must be the reference interpreter's. `an_unused_acquire_load_keeps_a_later_guard`
/// holds the emitted code to the same on the build machine, with a negative control.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_a_store_after_an_acquire_load_of_its_element_lands() {
    let gpu = vyre_cuda::backend::CudaBackend::acquire().expect("a CUDA device");
    for (workgroup, workgroups) in [(32u32, 1u32), (64, 4)] {
        let threads = workgroup * workgroups;
        let elements = threads - threads / 8;
        for (name, before) in ACQUIRE_BEFORE_A_STORE {
            let program = acquire_before_a_store(name, workgroup, before);
            let owned: Vec<u8> = (0..elements)
                .flat_map(|i| (0xa5a5_0000 | i).to_le_bytes())
                .collect();
            let seen = vec![0u8; 4 * elements as usize];
            let inputs: [&[u8]; 2] = [&owned, &seen];
            let config = vyre_cuda::DispatchConfig::linear(workgroups);
            let expected = vyre_cuda::reference::run(&program, &inputs, &config)
                .unwrap_or_else(|e| panic!("{name}: reference failed: {e}"));
            let got = gpu_run(&gpu, &program, (&inputs, &[]), &config)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                got == expected,
                "{name} on {workgroups} workgroup(s) of {workgroup}: the GPU's outputs differ from the reference\n{program}"
            );
        }
    }
}

/// Locks out the ptxas miscompilation that lost a generated program's stores on an
/// H200 (see `gpu_a_store_after_an_acquire_load_of_its_element_lands`): with the
/// result ABI every case of [`ACQUIRE_BEFORE_A_STORE`], in both workgroup shapes,
/// assembles (ptxas, sm_90) to SASS that reads `owned`'s element count, the bound
/// its store's guard compares with (a module of two buffers has it at constant bank
/// offset `0x220`, after the two 8-byte addresses from `0x210`). Negative control:
/// the same PTX with each acquire pattern put back as the `ld.acquire.sys` that
/// codegen emitted before 2026-12-06 assembles, for the two cases whose value goes
/// unused, to SASS that never reads the count: ptxas dropped the comparison and
/// the store ran under a stale predicate. The acquire-only fence
/// (`AcquireFence::AcquireOnly`) keeps the read too. Needs nvdisasm besides ptxas.
#[test]
fn an_unused_acquire_load_keeps_a_later_guard() {
    let Some(ptxas) = ptxas::require("an_unused_acquire_load_keeps_a_later_guard") else {
        return;
    };
    let Some(nvdisasm) = ptxas::require_nvdisasm("an_unused_acquire_load_keeps_a_later_guard")
    else {
        return;
    };
    let owned_count = "c[0x0][0x220]";
    let as_acquire_instruction = |ptx: &str| -> String {
        let mut out = String::with_capacity(ptx.len());
        let mut lines = ptx.lines().peekable();
        while let Some(line) = lines.next() {
            if line.contains("ld.relaxed.sys.")
                && lines.peek().map(|next| next.trim()) == Some("fence.acq_rel.sys;")
            {
                lines.next();
                out.push_str(&line.replace("ld.relaxed.sys.", "ld.acquire.sys."));
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        out
    };
    let acquire_only = CHECKED.with_acquire_fence(AcquireFence::AcquireOnly);
    for workgroup in [32u32, 64] {
        for (name, before) in ACQUIRE_BEFORE_A_STORE {
            let program = acquire_before_a_store(name, workgroup, before);
            let ptx = program_to_ptx_with_results(&program, &CHECKED, 90, 32).expect("ptx");
            let only_ptx =
                program_to_ptx_with_results(&program, &acquire_only, 90, 32).expect("ptx");
            for (options, text) in [(CHECKED, &ptx), (acquire_only, &only_ptx)] {
                let sass = ptxas::disassemble(&ptxas, &nvdisasm, name, text)
                    .unwrap_or_else(|report| panic!("{report}"));
                assert!(
                    sass.contains(owned_count),
                    "{name} ({workgroup} threads, {:?}): the SASS never reads owned's count\n{sass}",
                    options.acquire_fence
                );
            }
            let old = as_acquire_instruction(&ptx);
            assert_eq!(old.contains("ld.acquire.sys."), name.starts_with("acquire"));
            let old_sass = ptxas::disassemble(&ptxas, &nvdisasm, name, &old)
                .unwrap_or_else(|report| panic!("{report}"));
            let unused = name.starts_with("acquire_dropped");
            assert_eq!(
                old_sass.contains(owned_count),
                !unused,
                "negative control, {name} ({workgroup} threads) as ld.acquire: ptxas \
                 {} the count\n{old_sass}",
                if unused { "read" } else { "never read" }
            );
        }
    }
}

/// What a case of [`acquire_before_a_store`] does before the store: its load, and
/// the value to keep in `seen`, if any.
type BeforeTheStore = fn(&mut BlockBuilder, Expr) -> Option<Expr>;

/// The cases of the acquire-then-store guards, by name.
const ACQUIRE_BEFORE_A_STORE: [(&str, BeforeTheStore); 4] = [
    ("acquire_dropped", |b, gid| {
        b.acquire_load("dropped", "owned", gid);
        None
    }),
    ("acquire_kept", |b, gid| {
        Some(b.acquire_load("kept", "owned", gid))
    }),
    ("acquire_dropped_in_a_branch", |b, gid| {
        b.if_(gid.clone().less_than(Expr::length("owned")), |b| {
            b.acquire_load("branched", "owned", gid.clone());
        });
        None
    }),
    ("atomic_dropped", |b, gid| {
        b.atomic_load("dropped", "owned", gid);
        None
    }),
];

/// `before`, then `owned[gid] = 3 · gid + 1`, each access bounds-checked on its
/// own (no branch around them): the shape ptxas miscompiled.
fn acquire_before_a_store(name: &str, workgroup: u32, before: BeforeTheStore) -> Program {
    Program::builder([workgroup, 1, 1])
        .entry_op_id(name)
        .buffer(
            "owned",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "seen",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            if let Some(value) = before(b, gid.clone()) {
                b.store("seen", gid.clone(), value);
            }
            b.store("owned", gid.clone(), gid.clone() * 3u32 + 1u32);
        })
        .build()
}

/// Locks out semantic drift between emitted PTX and the reference interpreter on
/// realistic programs: 400 programs of the shared generator with grid syncs and
/// workgroup reductions (lowered by the backend) must give byte-identical outputs.
/// Atomics are off here because mixing atomic operators on one element makes the
/// result depend on thread order; the backend's own random test covers atomics.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_generated_programs_match_reference() {
    let gpu = vyre_cuda::backend::CudaBackend::acquire().expect("a CUDA device");
    let options = vyre_cuda::ir::generate::GeneratorOptions {
        allow_atomics: false,
        allow_grid_sync: true,
        ..Default::default()
    };
    for seed in 0..400u64 {
        let case = vyre_cuda::ir::generate::valid_program(seed, &options);
        let borrowed = case.input_slices();
        let reference_options = vyre_cuda::reference::ReferenceOptions::default();
        let expected = vyre_cuda::reference::run_with_scalars(
            &case.program,
            &borrowed,
            &case.scalars,
            &case.config,
            &reference_options,
        )
        .map(|(outputs, _)| outputs)
        .unwrap_or_else(|e| panic!("seed {seed}: reference failed: {e}"));
        let got = gpu_run(
            &gpu,
            &case.program,
            (&borrowed, &case.scalars),
            &case.config,
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", case.program));
        if got != expected {
            let which: Vec<usize> = (0..got.len())
                .filter(|&k| got.item(k) != Some(&expected[k][..]))
                .collect();
            panic!(
                "seed {seed}: outputs {which:?} differ from the reference\n{}",
                case.program
            );
        }
    }
}

/// Locks out a division by a constant hidden behind the zero-divisor guard (ptxas
/// then calls its 64-bit division subroutine where a shift would do: about 15 % of
/// the tokenizer split's `classify` on an H200): `x / 1024` and `x % 1024` on `u64`
/// are a shift and a mask, and a safe constant of another kind (`u32` 7, `i32` -3,
/// `i64` 2^40, which a shift would round the wrong way) is the immediate operand of
/// one `div` and one `rem`, with no `selp` of the divisor, and the fixture
/// assembles. Negative control: the divisors no dividend makes safe (`0`, and `-1`
/// for a signed type) and a divisor in a variable keep the guard, whose `selp`
/// chooses 1 for them.
#[test]
fn division_by_a_safe_constant_is_one_instruction() {
    // The 64-bit dividends widen the 32-bit operands.
    let dividend = |ty: ScalarType| match ty {
        ScalarType::U64 => operand("a", ScalarType::U32).cast(ty),
        ScalarType::I64 => operand("a", ScalarType::I32).cast(ty),
        _ => operand("a", ty),
    };
    let program = |divisor: Literal, ty: ScalarType| {
        typed_program(|b| {
            let quotient = Expr::binary(BinaryOp::Div, dividend(ty), Expr::Literal(divisor));
            let remainder = Expr::binary(BinaryOp::Rem, dividend(ty), Expr::Literal(divisor));
            b.store("out", 0u32, quotient.cast(ScalarType::U32));
            b.store("out", 1u32, remainder.cast(ScalarType::U32));
        })
    };
    let ptx = |divisor: Literal, ty: ScalarType| {
        program_to_ptx(&program(divisor, ty), &CodegenOptions::default(), 90, 32).expect("ptx")
    };
    for (divisor, ty, quotient, remainder) in [
        (
            Literal::U64(1024),
            ScalarType::U64,
            ("shr.u64", "10"),
            ("and.b64", "1023"),
        ),
        (
            Literal::U32(7),
            ScalarType::U32,
            ("div.u32", "7"),
            ("rem.u32", "7"),
        ),
        (
            Literal::I32(-3),
            ScalarType::I32,
            ("div.s32", "-3"),
            ("rem.s32", "-3"),
        ),
        (
            Literal::I64(1 << 40),
            ScalarType::I64,
            ("div.s64", "1099511627776"),
            ("rem.s64", "1099511627776"),
        ),
    ] {
        let text = ptx(divisor, ty);
        for (mnemonic, operand) in [quotient, remainder] {
            assert!(
                text.lines()
                    .any(|line| line.trim_start().starts_with(mnemonic)
                        && line.trim_end().ends_with(&format!(", {operand};"))),
                "{mnemonic} by {divisor:?}:\n{text}"
            );
        }
        assert!(
            !text.contains("selp.b"),
            "{divisor:?} kept the guard:\n{text}"
        );
    }
    for (divisor, ty) in [
        (Literal::U32(0), ScalarType::U32),
        (Literal::I32(-1), ScalarType::I32),
        (Literal::I64(-1), ScalarType::I64),
    ] {
        assert!(
            ptx(divisor, ty).contains("selp.b"),
            "negative control: {divisor:?}"
        );
    }
    let variable = typed_program(|b| {
        let quotient = Expr::binary(
            BinaryOp::Div,
            operand("a", ScalarType::U32),
            operand("b", ScalarType::U32),
        );
        b.store("out", 0u32, quotient);
    });
    let text = program_to_ptx(&variable, &CodegenOptions::default(), 90, 32).expect("ptx");
    assert!(
        text.contains("selp.b32"),
        "negative control: a variable divisor"
    );
    let Some(ptxas) = ptxas::require("division_by_a_safe_constant_is_one_instruction") else {
        return;
    };
    ptxas::assemble_all(
        &ptxas,
        [(
            "division_by_constant",
            ptx(Literal::U64(1024), ScalarType::U64),
        )],
    )
    .unwrap_or_else(|failures| panic!("{failures}"));
}
