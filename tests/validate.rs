//! The validator's rules, one test per rule (each checks the rule, the `Fix:` prefix
//! and that the message names the offending item), positive controls showing legitimate
//! programs pass, and the fuzz tests: arbitrary programs never panic the validator,
//! generated valid programs always pass it.

use std::sync::Arc;

use vyre_cuda::ir::generate::{
    arbitrary_program, constructs_used, valid_program, Construct, GeneratorOptions,
};
use vyre_cuda::ir::validate::{Rule, MAX_NESTING_DEPTH};
use vyre_cuda::ir::*;

fn limits() -> Limits {
    Limits::default()
}

/// Asserts `program` breaks `rule`, with a `Fix:` message naming every item in `names`.
fn expect_rule(program: &Program, rule: Rule, names: &[&str]) {
    expect_rule_with(validate(program, &limits()), rule, names, program);
}

fn expect_lowered_rule(program: &Program, rule: Rule, names: &[&str]) {
    expect_rule_with(validate_lowered(program, &limits()), rule, names, program);
}

fn expect_rule_with(
    result: Result<ValidProgram, ValidationError>,
    rule: Rule,
    names: &[&str],
    program: &Program,
) {
    let error = match result {
        Ok(_) => panic!("expected {rule:?}, but the program validated:\n{program}"),
        Err(e) => e,
    };
    assert_eq!(
        error.rule(),
        rule,
        "wrong rule; message: {}\n{program}",
        error.message()
    );
    assert!(
        error.message().starts_with("Fix:"),
        "message must start with Fix: {}",
        error.message()
    );
    for name in names {
        assert!(
            error.message().contains(name),
            "message should name `{name}`: {}",
            error.message()
        );
    }
}

fn expect_valid(program: &Program) {
    if let Err(e) = validate(program, &limits()) {
        panic!("expected a valid program, got {e}\n{program}");
    }
}

fn u32_buffers(builder: ProgramBuilder) -> ProgramBuilder {
    builder
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
}

/// A program with `input` (read-only u32) and `output` (read-write u32) and this body.
fn with_body(build: impl FnOnce(&mut BlockBuilder)) -> Program {
    u32_buffers(Program::builder([64, 1, 1]))
        .body(build)
        .build()
}

fn gid() -> Expr {
    Expr::global_id(Axis::X)
}

// ---- buffers ---------------------------------------------------------------------------

/// Locks out buffers (and variables) with empty names, which no message can point at.
#[test]
fn empty_names_are_rejected() {
    let p = Program::builder([1, 1, 1])
        .buffer("", 0, Access::ReadOnly, ElemType::U32, BufferCount::Runtime)
        .build();
    expect_rule(&p, Rule::EmptyName, &["non-empty", "position 0"]);
    let p = with_body(|b| {
        b.let_("", 1u32);
    });
    expect_rule(&p, Rule::EmptyName, &["non-empty", "entry[0]"]);
}

/// Locks out user names that collide with the names lowering introduces.
#[test]
fn reserved_names_are_rejected_for_users_but_not_for_lowering() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "__vyre_tile",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .build();
    expect_rule(&p, Rule::ReservedName, &["__vyre_tile"]);
    // Negative control: the same program is what lowering may produce.
    assert_eq!(validate_lowered(&p, &limits()).map(|_| ()), Ok(()));
    let p = with_body(|b| {
        b.let_("__vyre_sum", 1u32);
    });
    expect_rule(&p, Rule::ReservedName, &["__vyre_sum"]);
}

/// Locks out two buffers with one name (loads would be ambiguous).
#[test]
fn duplicate_buffer_names_are_rejected() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "data",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .build();
    expect_rule(&p, Rule::DuplicateBufferName, &["data"]);
}

/// Locks out two buffers bound to one slot (kernel parameters would alias).
#[test]
fn binding_collisions_are_rejected() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "left",
            3,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "right",
            3,
            Access::ReadWrite,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .build();
    expect_rule(&p, Rule::BindingCollision, &["right", "left", "3"]);
}

/// Locks out runtime-sized shared memory, which PTX cannot declare.
#[test]
fn workgroup_buffers_need_a_static_count() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "tile",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .build();
    expect_rule(&p, Rule::WorkgroupBufferNeedsStaticCount, &["tile"]);
}

/// Locks out zero-element buffers (a zero-byte allocation or declaration).
#[test]
fn zero_counts_are_rejected() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "empty",
            0,
            Access::ReadWrite,
            ElemType::U8,
            BufferCount::Static(0),
        )
        .build();
    expect_rule(&p, Rule::ZeroCount, &["empty"]);
}

/// Locks out static sizes whose byte count wraps a `u32`.
#[test]
fn overflowing_counts_are_rejected() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "huge",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(u32::MAX),
        )
        .build();
    expect_rule(&p, Rule::CountOverflow, &["huge", &u32::MAX.to_string()]);
    // Negative control: u32::MAX bytes exactly still fits.
    let p = Program::builder([1, 1, 1])
        .buffer(
            "bytes",
            0,
            Access::ReadWrite,
            ElemType::U8,
            BufferCount::Static(u32::MAX),
        )
        .build();
    expect_valid(&p);
}

/// Locks out shared memory over the device limit, including a sum that overflows.
#[test]
fn shared_memory_over_the_limit_is_rejected() {
    let p = Program::builder([1, 1, 1])
        .buffer(
            "tile_a",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(8192),
        )
        .buffer(
            "tile_b",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(8192),
        )
        .build();
    expect_rule(
        &p,
        Rule::SharedMemoryOverLimit,
        &["tile_b", "65536", "49152"],
    );
    // Exactly at the limit passes.
    let p = Program::builder([1, 1, 1])
        .buffer(
            "tile_a",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(8192),
        )
        .buffer(
            "tile_b",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(4096),
        )
        .build();
    expect_valid(&p);
    // A sum that would wrap 32 bits is still caught with a huge limit.
    let generous = Limits {
        max_shared_memory_bytes: u32::MAX,
        ..Limits::default()
    };
    let quarter = u32::MAX / 4;
    let p = Program::builder([1, 1, 1])
        .buffer(
            "big_a",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(quarter),
        )
        .buffer(
            "big_b",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(quarter),
        )
        .build();
    let error = validate(&p, &generous).expect_err("8 GiB of shared memory");
    assert_eq!(error.rule(), Rule::SharedMemoryOverLimit);
    assert!(error.message().contains("big_b"), "{error}");
}

// ---- workgroup size ----------------------------------------------------------------

/// Locks out a zero workgroup axis (an empty launch).
#[test]
fn zero_workgroup_axes_are_rejected() {
    for (size, axis) in [
        ([0, 1, 1], "axis x"),
        ([1, 0, 1], "axis y"),
        ([1, 1, 0], "axis z"),
    ] {
        expect_rule(
            &Program::builder(size).build(),
            Rule::WorkgroupSizeZero,
            &[axis],
        );
    }
}

/// Locks out an axis over the device's per-axis limit.
#[test]
fn workgroup_axes_over_the_limit_are_rejected() {
    let p = Program::builder([1, 1, 65]).build();
    expect_rule(
        &p,
        Rule::WorkgroupSizeOverAxisLimit,
        &["axis z", "65", "64"],
    );
    expect_valid(&Program::builder([1, 1, 64]).build());
}

/// Locks out too many threads per workgroup, including a product that overflows.
#[test]
fn workgroup_thread_count_over_the_limit_is_rejected() {
    let p = Program::builder([64, 32, 1]).build();
    expect_rule(&p, Rule::WorkgroupSizeOverThreadLimit, &["2048", "1024"]);
    expect_valid(&Program::builder([32, 32, 1]).build());
    let unbounded = Limits {
        max_workgroup_size: [u32::MAX; 3],
        ..Limits::default()
    };
    let p = Program::builder([u32::MAX; 3]).build();
    let error = validate(&p, &unbounded).expect_err("overflowing thread count");
    assert_eq!(error.rule(), Rule::WorkgroupSizeOverThreadLimit);
    assert!(error.message().contains("overflowing"), "{error}");
}

// ---- variables ------------------------------------------------------------------------

/// Locks out reads and writes of undeclared variables, including a variable used
/// after the block that declared it ended.
#[test]
fn unknown_variables_are_rejected() {
    let p = with_body(|b| {
        b.store("output", gid(), Expr::var("ghost"));
    });
    expect_rule(&p, Rule::UnknownVariable, &["ghost", "entry[0]"]);
    let p = with_body(|b| {
        b.assign("ghost", 1u32);
    });
    expect_rule(&p, Rule::UnknownVariable, &["ghost", "let mut"]);
    let p = with_body(|b| {
        b.if_(true, |b| {
            b.let_("inner", 1u32);
        });
        b.store("output", 0u32, Expr::var("inner"));
    });
    expect_rule(&p, Rule::UnknownVariable, &["inner", "entry[1]"]);
}

/// Locks out shadowing by lets, loop variables and reduction results.
#[test]
fn duplicate_declarations_are_rejected() {
    let p = with_body(|b| {
        b.let_("x", 1u32);
        b.let_mut("x", 2u32);
    });
    expect_rule(&p, Rule::DuplicateVariable, &["x", "entry[1]"]);
    let p = with_body(|b| {
        b.let_("i", 1u32);
        b.loop_("i", 0u32, 4u32, |_, _| {});
    });
    expect_rule(&p, Rule::DuplicateVariable, &["i"]);
    let p = with_body(|b| {
        b.loop_("i", 0u32, 4u32, |b, _| {
            b.if_(true, |b| {
                b.let_("i", 0u32);
            });
        });
    });
    expect_rule(
        &p,
        Rule::DuplicateVariable,
        &["i", "entry[0].body[0].then[0]"],
    );
    let p = with_body(|b| {
        b.let_("total", 1u32);
        b.workgroup_reduce("total", ReduceOp::Sum, 1u32);
    });
    expect_rule(&p, Rule::DuplicateVariable, &["total"]);
    // Negative control: sibling blocks may reuse a name.
    expect_valid(&with_body(|b| {
        b.if_else(
            true,
            |b| {
                b.let_("t", 1u32);
            },
            |b| {
                b.let_("t", 2.0f32);
            },
        );
        b.loop_("t", 0u32, 2u32, |_, _| {});
    }));
}

/// Locks out assignment to immutable lets, loop variables and reduction results.
#[test]
fn assignments_to_immutable_variables_are_rejected() {
    let p = with_body(|b| {
        b.let_("fixed", 1u32);
        b.assign("fixed", 2u32);
    });
    expect_rule(&p, Rule::AssignToImmutable, &["fixed", "without `mut`"]);
    let p = with_body(|b| {
        b.loop_("i", 0u32, 4u32, |b, _| {
            b.assign("i", 2u32);
        });
    });
    expect_rule(&p, Rule::AssignToImmutable, &["i", "loop variable"]);
    let p = with_body(|b| {
        b.workgroup_reduce("total", ReduceOp::Max, 1u32);
        b.assign("total", 2u32);
    });
    expect_rule(&p, Rule::AssignToImmutable, &["total", "reduction result"]);
    expect_valid(&with_body(|b| {
        b.let_mut("acc", 1u32);
        b.assign("acc", Expr::var("acc") + 2u32);
    }));
}

/// Locks out assigning a value of another type than the variable's.
#[test]
fn assignments_of_another_type_are_rejected() {
    let p = with_body(|b| {
        b.let_mut("acc", 1u32);
        b.assign("acc", 2i32);
    });
    expect_rule(&p, Rule::TypeMismatch, &["acc", "u32", "i32"]);
}

// ---- buffer uses --------------------------------------------------------------------

/// Locks out loads, stores, atomics and lengths of undeclared buffers.
#[test]
fn unknown_buffers_are_rejected() {
    let cases: Vec<Program> = vec![
        with_body(|b| {
            b.let_("x", Expr::load("nowhere", 0u32));
        }),
        with_body(|b| {
            b.store("nowhere", 0u32, 1u32);
        }),
        with_body(|b| {
            b.atomic(AtomicOp::Add, "nowhere", 0u32, 1u32);
        }),
        with_body(|b| {
            b.let_("x", Expr::length("nowhere"));
        }),
    ];
    for p in &cases {
        expect_rule(p, Rule::UnknownBuffer, &["nowhere", "entry[0]"]);
    }
}

/// Locks out stores into read-only buffers; loads from write-only buffers stay legal.
#[test]
fn stores_into_read_only_buffers_are_rejected() {
    let p = with_body(|b| {
        b.store("input", gid(), 1u32);
    });
    expect_rule(&p, Rule::StoreToReadOnly, &["input", "read_only"]);
    let p = Program::builder([1, 1, 1])
        .buffer(
            "scratch",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|b| {
            b.store("scratch", 0u32, 7u32);
            b.store(
                "scratch",
                1u32,
                Expr::load("scratch", 0u32) + Expr::length("scratch"),
            );
        })
        .build();
    expect_valid(&p);
}

/// Locks out atomics (plain, fetching, compare-exchange and atomic loads) on `u8`
/// and `f32` buffers and on read-only or write-only buffers, and operands (and an
/// atomic load's index) of another type than the element's (`u32`); integer
/// buffers of every width and signedness pass.
#[test]
fn atomics_need_integer_read_write_or_workgroup_buffers() {
    for (elem, operand) in [
        (ElemType::U8, Expr::u32(1)),
        (ElemType::F32, Expr::f32(1.0)),
    ] {
        let fetch = Program::builder([1, 1, 1])
            .buffer("text", 0, Access::ReadWrite, elem, BufferCount::Runtime)
            .body(|b| {
                b.atomic_fetch("old", AtomicOp::Add, "text", 0u32, operand.clone());
            })
            .build();
        expect_rule(
            &fetch,
            Rule::AtomicBuffer,
            &["text", elem.name(), "integer"],
        );
        let exchange = Program::builder([1, 1, 1])
            .buffer("text", 0, Access::ReadWrite, elem, BufferCount::Runtime)
            .body(|b| {
                b.compare_exchange("old", "text", 0u32, operand.clone(), operand.clone());
            })
            .build();
        expect_rule(&exchange, Rule::AtomicBuffer, &["text", elem.name()]);
        let load = Program::builder([1, 1, 1])
            .buffer("text", 0, Access::ReadWrite, elem, BufferCount::Runtime)
            .body(|b| {
                b.atomic_load("seen", "text", 0u32);
            })
            .build();
        expect_rule(&load, Rule::AtomicBuffer, &["text", elem.name(), "Fix"]);
    }
    for access in [Access::ReadOnly, Access::WriteOnly] {
        let p = Program::builder([1, 1, 1])
            .buffer("counter", 0, access, ElemType::U32, BufferCount::Runtime)
            .body(|b| {
                b.atomic(AtomicOp::Or, "counter", 0u32, 1u32);
            })
            .build();
        expect_rule(&p, Rule::AtomicBuffer, &["counter", access.name()]);
        let p = Program::builder([1, 1, 1])
            .buffer("table", 0, access, ElemType::U64, BufferCount::Runtime)
            .body(|b| {
                b.compare_exchange("old", "table", 0u32, Expr::u64(0), Expr::u64(7));
            })
            .build();
        expect_rule(&p, Rule::AtomicBuffer, &["table", access.name()]);
        let p = Program::builder([1, 1, 1])
            .buffer("statuses", 0, access, ElemType::U64, BufferCount::Runtime)
            .body(|b| {
                b.atomic_load("status", "statuses", 0u32);
            })
            .build();
        expect_rule(&p, Rule::AtomicBuffer, &["statuses", access.name()]);
    }
    expect_rule(
        &Program::builder([1, 1, 1])
            .buffer(
                "statuses",
                0,
                Access::ReadWrite,
                ElemType::U64,
                BufferCount::Runtime,
            )
            .body(|b| {
                b.atomic_load("status", "statuses", Expr::u64(0));
            })
            .build(),
        Rule::TypeMismatch,
        &["atomic index", "u32", "u64"],
    );
    // Operands (and the expected value) have the element's value type.
    let signed = |body: &dyn Fn(&mut BlockBuilder)| {
        Program::builder([1, 1, 1])
            .buffer(
                "signed",
                0,
                Access::ReadWrite,
                ElemType::I64,
                BufferCount::Runtime,
            )
            .body(|b| body(b))
            .build()
    };
    expect_rule(
        &signed(&|b| {
            b.atomic(AtomicOp::Add, "signed", 0u32, 1u32);
        }),
        Rule::TypeMismatch,
        &["atomic operand", "i64", "u32"],
    );
    expect_rule(
        &signed(&|b| {
            b.compare_exchange("old", "signed", 0u32, Expr::i32(0), Expr::i64(1));
        }),
        Rule::TypeMismatch,
        &["expected value", "i64", "i32"],
    );
    let p = Program::builder([32, 1, 1])
        .buffer(
            "counter",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "signed",
            1,
            Access::ReadWrite,
            ElemType::I32,
            BufferCount::Runtime,
        )
        .buffer(
            "wide",
            2,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .buffer(
            "tile",
            3,
            Access::Workgroup,
            ElemType::I64,
            BufferCount::Static(4),
        )
        .body(|b| {
            b.atomic(AtomicOp::Min, "counter", 0u32, 1u32);
            b.atomic(AtomicOp::Exchange, "signed", 0u32, -1i32);
            let old = b.atomic_fetch("old", AtomicOp::Xor, "wide", 1u32, Expr::u64(5));
            b.atomic(AtomicOp::Max, "tile", 1u32, old.cast(ScalarType::I64));
            b.compare_exchange("swapped", "tile", 2u32, Expr::i64(0), Expr::i64(-3));
            let seen = b.atomic_load("seen", "tile", 2u32);
            let counted = b.atomic_load("counted", "counter", 0u32);
            b.atomic(AtomicOp::Add, "wide", 0u32, seen.cast(ScalarType::U64));
            b.atomic(AtomicOp::Add, "signed", 1u32, counted.cast(ScalarType::I32));
        })
        .build();
    expect_valid(&p);
}

/// Locks out an atomic's result treated like other variables: it cannot be
/// assigned (it is the element's value at one instant), and it is divergent (which
/// value a thread gets depends on the others), so a barrier under it is refused.
/// Negative control: the same shapes with a `let` of a uniform value pass.
#[test]
fn atomic_results_are_immutable_and_divergent() {
    let p = with_body(|b| {
        b.atomic_fetch("claimed", AtomicOp::Add, "output", 0u32, 1u32);
        b.assign("claimed", 3u32);
    });
    expect_rule(
        &p,
        Rule::AssignToImmutable,
        &["claimed", "the result of an atomic"],
    );
    let p = with_body(|b| {
        let old = b.compare_exchange("old", "output", 0u32, 0u32, 1u32);
        b.if_(old.equals(0u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[1].then[0]"]);
    let p = with_body(|b| {
        let seen = b.atomic_load("seen", "output", 0u32);
        b.if_(seen.equals(0u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[1].then[0]"]);
    let p = with_body(|b| {
        b.atomic_load("seen", "output", 0u32);
        b.assign("seen", 3u32);
    });
    expect_rule(
        &p,
        Rule::AssignToImmutable,
        &["seen", "the result of an atomic"],
    );
    let p = with_body(|b| {
        b.atomic_fetch("old", AtomicOp::Add, "output", 0u32, 1u32);
        b.let_("old", 2u32);
    });
    expect_rule(&p, Rule::DuplicateVariable, &["old"]);
    expect_valid(&with_body(|b| {
        let old = b.let_("old", Expr::workgroup_id(Axis::X));
        b.if_(old.equals(0u32), |b| {
            b.barrier();
        });
    }));
}

/// Locks out acquire loads of memory no other agent can write, or of widths one
/// atomic read does not cover: a workgroup buffer, a per-thread local array, a
/// write-only buffer, `u8` and `f32` elements break `AcquireLoadBuffer` with a
/// `Fix:` message naming the buffer, its access or element type; a `u64` index is
/// a type mismatch naming the index. Read-only and read-write global buffers of
/// every integer width and signedness pass.
#[test]
fn acquire_loads_need_global_integer_buffers_the_kernel_reads() {
    let acquire_from = |access: Access, elem: ElemType, index: Expr| {
        let count = if access.is_global() {
            BufferCount::Runtime
        } else {
            BufferCount::Static(4)
        };
        Program::builder([32, 1, 1])
            .buffer("flags", 0, access, elem, count)
            .body(|b| {
                b.acquire_load("ready", "flags", index);
            })
            .build()
    };
    for access in [Access::ReadOnly, Access::ReadWrite] {
        for elem in [ElemType::U32, ElemType::I32, ElemType::U64, ElemType::I64] {
            expect_valid(&acquire_from(access, elem, Expr::global_id(Axis::X)));
        }
    }
    for access in [Access::Workgroup, Access::Local, Access::WriteOnly] {
        expect_rule(
            &acquire_from(access, ElemType::U32, Expr::u32(0)),
            Rule::AcquireLoadBuffer,
            &[
                "flags",
                access.name(),
                "read_only or read_write",
                "acquire load",
            ],
        );
    }
    for elem in [ElemType::U8, ElemType::F32] {
        expect_rule(
            &acquire_from(Access::ReadOnly, elem, Expr::u32(0)),
            Rule::AcquireLoadBuffer,
            &["flags", elem.name(), "integer"],
        );
    }
    expect_rule(
        &acquire_from(Access::ReadOnly, ElemType::U32, Expr::u64(0)),
        Rule::TypeMismatch,
        &["acquire load index", "u32", "u64"],
    );
    expect_rule(
        &with_body(|b| {
            b.acquire_load("ready", "nowhere", 0u32);
        }),
        Rule::UnknownBuffer,
        &["nowhere"],
    );
}

/// Locks out an acquire load's result treated as uniform or as a variable: it is
/// divergent (the host may set the flag between two threads' reads), so a barrier
/// under a condition on it is refused, and it cannot be assigned. Negative control:
/// a barrier after it, in uniform control flow, passes (that barrier is what hands
/// the acquire on to the workgroup's other threads).
#[test]
fn acquire_load_results_are_immutable_and_divergent() {
    let p = with_body(|b| {
        let ready = b.acquire_load("ready", "input", 0u32);
        b.if_(ready.equals(1u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[1].then[0]"]);
    let p = with_body(|b| {
        b.acquire_load("ready", "output", 0u32);
        b.assign("ready", 1u32);
    });
    expect_rule(
        &p,
        Rule::AssignToImmutable,
        &["ready", "the result of an atomic"],
    );
    expect_valid(&with_body(|b| {
        let ready = b.acquire_load("ready", "input", 0u32);
        b.barrier();
        b.store("output", gid(), ready + Expr::load("input", gid()));
    }));
}

/// Locks out local arrays the kernel cannot declare or the device cannot hold: a
/// runtime count, zero elements, a byte size that overflows, more than
/// `MAX_LOCAL_ARRAY_BYTES` per thread (alone or together), and atomics on them (a
/// thread's own memory has nothing to be atomic against). Exactly the limit passes.
#[test]
fn local_arrays_need_a_static_count_within_the_per_thread_budget() {
    use vyre_cuda::ir::validate::MAX_LOCAL_ARRAY_BYTES;
    let local = |count: BufferCount, elem: ElemType| {
        Program::builder([32, 1, 1])
            .buffer("scratch", 0, Access::Local, elem, count)
            .body(|b| {
                b.store("scratch", Expr::local_id(Axis::X), 1u32);
            })
            .build()
    };
    expect_rule(
        &local(BufferCount::Runtime, ElemType::U32),
        Rule::LocalArrayNeedsStaticCount,
        &["scratch", "static"],
    );
    expect_rule(
        &local(BufferCount::Static(0), ElemType::U32),
        Rule::ZeroCount,
        &["scratch"],
    );
    expect_rule(
        &local(BufferCount::Static(u32::MAX), ElemType::U32),
        Rule::CountOverflow,
        &["scratch"],
    );
    let words = MAX_LOCAL_ARRAY_BYTES / 4;
    expect_rule(
        &local(BufferCount::Static(words + 1), ElemType::U32),
        Rule::LocalMemoryOverLimit,
        &["scratch", "16388", "16384"],
    );
    expect_valid(&local(BufferCount::Static(words), ElemType::U32));
    let two = Program::builder([1, 1, 1])
        .local_array("first", 0, ElemType::U64, words / 4)
        .local_array("second", 1, ElemType::U8, MAX_LOCAL_ARRAY_BYTES / 2 + 1)
        .build();
    expect_rule(&two, Rule::LocalMemoryOverLimit, &["second", "16385"]);
    let atomic = Program::builder([1, 1, 1])
        .local_array("scratch", 0, ElemType::U32, 4)
        .body(|b| {
            b.atomic_fetch("old", AtomicOp::Add, "scratch", 0u32, 1u32);
        })
        .build();
    expect_rule(&atomic, Rule::AtomicBuffer, &["scratch", "local"]);
    // A value read from a local array differs between threads.
    let p = Program::builder([32, 1, 1])
        .local_array("scratch", 0, ElemType::U32, 4)
        .body(|b| {
            b.if_(Expr::load("scratch", 0u32).equals(0u32), |b| {
                b.barrier();
            });
        })
        .build();
    expect_rule(&p, Rule::DivergentBarrier, &["entry[0].then[0]"]);
}

// ---- types ------------------------------------------------------------------------------

fn literal(ty: ScalarType) -> Expr {
    match ty {
        ScalarType::U32 => Expr::u32(1),
        ScalarType::I32 => Expr::i32(-1),
        ScalarType::F32 => Expr::f32(1.5),
        ScalarType::Bool => Expr::bool(true),
        ScalarType::U64 => Expr::u64(1 << 40),
        ScalarType::I64 => Expr::i64(-1),
    }
}

const TYPES: [ScalarType; 6] = ScalarType::ALL;

/// The operator table of `program.rs`, written out independently.
fn binary_allowed(op: BinaryOp, lhs: ScalarType, rhs: ScalarType) -> bool {
    use BinaryOp::*;
    use ScalarType::*;
    let numeric = matches!(lhs, U32 | I32 | U64 | I64 | F32);
    let integer = matches!(lhs, U32 | I32 | U64 | I64);
    match op {
        Add | Sub | Mul | Div | Min | Max | Lt | Le | Gt | Ge => lhs == rhs && numeric,
        Rem | BitAnd | BitOr | BitXor => lhs == rhs && integer,
        Shl | Shr => integer && rhs == U32,
        Eq | Ne => lhs == rhs,
        LogicalAnd | LogicalOr => lhs == Bool && rhs == Bool,
        PermuteBytes => lhs == U64 && rhs == U32,
    }
}

fn unary_allowed(op: UnaryOp, ty: ScalarType) -> bool {
    use ScalarType::*;
    match op {
        UnaryOp::Neg | UnaryOp::Abs => matches!(ty, I32 | I64 | F32),
        UnaryOp::BitNot | UnaryOp::CountOnes | UnaryOp::LeadingZeros => {
            matches!(ty, U32 | I32 | U64 | I64)
        }
        UnaryOp::LogicalNot => ty == Bool,
    }
}

/// Locks out every operator applied to types its documentation does not allow, and
/// shows every allowed combination passes (an over-strict checker fails here too).
#[test]
fn operator_types_follow_the_documented_table() {
    for op in BinaryOp::ALL {
        for lhs in TYPES {
            for rhs in TYPES {
                let p = with_body(|b| {
                    b.let_("result", Expr::binary(op, literal(lhs), literal(rhs)));
                });
                if binary_allowed(op, lhs, rhs) {
                    expect_valid(&p);
                } else {
                    expect_rule(&p, Rule::TypeMismatch, &[op.symbol(), "result"]);
                }
            }
        }
    }
    for op in UnaryOp::ALL {
        for ty in TYPES {
            let p = with_body(|b| {
                b.let_("result", Expr::unary(op, literal(ty)));
            });
            if unary_allowed(op, ty) {
                expect_valid(&p);
            } else {
                expect_rule(&p, Rule::TypeMismatch, &[op.symbol(), ty.name()]);
            }
        }
    }
    // Casts go anywhere.
    for from in TYPES {
        for to in TYPES {
            expect_valid(&with_body(|b| {
                b.let_("result", literal(from).cast(to));
            }));
        }
    }
}

/// Locks out results of the wrong type flowing on: comparison results are bool,
/// counts are u32, shifts keep the left type.
#[test]
fn operator_result_types_are_tracked() {
    expect_valid(&with_body(|b| {
        let c = b.let_("c", Expr::i32(-3).count_ones());
        let s = b.let_("s", Expr::i32(-3) << c.clone());
        let t = b.let_("t", s.less_than(Expr::i32(0)));
        b.store("output", c, t.select(1u32, 2u32));
    }));
    let p = with_body(|b| {
        let c = b.let_("c", Expr::u32(3).less_than(4u32));
        b.store("output", 0u32, c);
    });
    expect_rule(&p, Rule::TypeMismatch, &["output", "u32", "bool"]);
}

/// Locks out non-u32 indices, non-bool conditions, non-u32 loop bounds and
/// mismatched select arms.
#[test]
fn indices_conditions_bounds_and_selects_are_typed() {
    let cases: Vec<(Program, &[&str])> = vec![
        (
            with_body(|b| {
                b.let_("x", Expr::load("input", Expr::i32(0)));
            }),
            &["load index", "i32"],
        ),
        (
            with_body(|b| {
                b.store("output", Expr::f32(0.0), 1u32);
            }),
            &["index", "f32"],
        ),
        (
            with_body(|b| {
                b.if_(1u32, |_| {});
            }),
            &["if condition", "bool"],
        ),
        (
            with_body(|b| {
                b.loop_("i", Expr::i32(0), 4u32, |_, _| {});
            }),
            &["loop start"],
        ),
        (
            with_body(|b| {
                b.loop_("i", 0u32, true, |_, _| {});
            }),
            &["loop end"],
        ),
        (
            with_body(|b| {
                b.let_("x", Expr::bool(true).select(1u32, 1i32));
            }),
            &["select", "u32", "i32"],
        ),
        (
            with_body(|b| {
                b.let_("x", Expr::u32(1).select(1u32, 2u32));
            }),
            &["select condition"],
        ),
        (
            with_body(|b| {
                b.atomic(AtomicOp::Add, "output", 0u32, 1i32);
            }),
            &["atomic operand"],
        ),
        (
            with_body(|b| {
                b.workgroup_reduce("r", ReduceOp::Sum, 1.0f32);
            }),
            &["reduced value"],
        ),
    ];
    for (p, names) in &cases {
        expect_rule(p, Rule::TypeMismatch, names);
    }
}

/// Locks out stores of the wrong value type, including into byte buffers (which take u32).
#[test]
fn stored_values_match_the_element_value_type() {
    let bytes = |value: Expr| {
        Program::builder([1, 1, 1])
            .buffer(
                "text",
                0,
                Access::ReadWrite,
                ElemType::U8,
                BufferCount::Runtime,
            )
            .body(|b| {
                b.store("text", 0u32, value);
            })
            .build()
    };
    expect_valid(&bytes(Expr::u32(300)));
    expect_valid(&bytes(Expr::load("text", 1u32) + 1u32));
    expect_rule(
        &bytes(Expr::i32(3)),
        Rule::TypeMismatch,
        &["text", "u8", "i32"],
    );
    let floats = Program::builder([1, 1, 1])
        .buffer(
            "values",
            0,
            Access::WriteOnly,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("values", 0u32, 1u32);
        })
        .build();
    expect_rule(&floats, Rule::TypeMismatch, &["values", "f32"]);
}

// ---- subgroups and lowering --------------------------------------------------------

fn shuffle(lane_mask: u32) -> Expr {
    Expr::SubgroupShuffleXor {
        value: Box::new(Expr::u32(5)),
        lane_mask,
    }
}

fn subgroup_sum(value: Expr) -> Expr {
    Expr::SubgroupReduce {
        op: ReduceOp::Sum,
        value: Box::new(value),
    }
}

/// Locks out user programs that contain lowering-only subgroup expressions.
#[test]
fn subgroup_expressions_are_rejected_before_lowering() {
    let p = with_body(|b| {
        b.let_("x", shuffle(1));
    });
    expect_rule(
        &p,
        Rule::SubgroupBeforeLowering,
        &["subgroup_shuffle_xor", "WorkgroupReduce"],
    );
    assert_eq!(validate_lowered(&p, &limits()).map(|_| ()), Ok(()));
    let p = with_body(|b| {
        b.let_("x", subgroup_sum(Expr::u32(1)));
    });
    expect_rule(&p, Rule::SubgroupBeforeLowering, &["subgroup_reduce", "x"]);
    assert_eq!(validate_lowered(&p, &limits()).map(|_| ()), Ok(()));
}

/// Locks out shuffle masks that name lanes outside the subgroup.
#[test]
fn lane_masks_must_be_below_the_subgroup_size() {
    let p = with_body(|b| {
        b.let_("x", shuffle(32));
    });
    expect_lowered_rule(&p, Rule::LaneMaskOutOfRange, &["32", "x"]);
    let p = with_body(|b| {
        b.let_("x", shuffle(31));
    });
    assert_eq!(validate_lowered(&p, &limits()).map(|_| ()), Ok(()));
}

/// Locks out lowered programs that still contain a workgroup reduction.
#[test]
fn lowered_programs_contain_no_workgroup_reduce() {
    let p = with_body(|b| {
        b.workgroup_reduce("total", ReduceOp::Sum, 1u32);
    });
    expect_valid(&p);
    expect_lowered_rule(&p, Rule::WorkgroupReduceNotLowered, &["total"]);
}

/// Locks out subgroup operations with inactive lanes (divergent control flow).
#[test]
fn subgroup_operations_need_uniform_control_flow() {
    let p = with_body(|b| {
        b.if_(gid().less_than(3u32), |b| {
            b.let_("x", shuffle(1));
        });
    });
    expect_lowered_rule(
        &p,
        Rule::DivergentSubgroupOp,
        &["entry[0].then[0]", "let x"],
    );
    let p = with_body(|b| {
        b.if_(Expr::workgroup_id(Axis::X).less_than(3u32), |b| {
            b.let_("x", subgroup_sum(gid()));
        });
    });
    assert_eq!(validate_lowered(&p, &limits()).map(|_| ()), Ok(()));
}

/// Locks out a lowered program being rejected for a barrier under the reduction result
/// it rewrote: lowering's own shared buffers read at a uniform index are uniform.
#[test]
fn lowered_shared_reads_at_uniform_indices_are_uniform() {
    let lowered = |name: &str| {
        Program::builder([64, 1, 1])
            .buffer(
                name,
                0,
                Access::Workgroup,
                ElemType::U32,
                BufferCount::Static(2),
            )
            .body(|b| {
                b.store(name, Expr::local_id(Axis::X), 1u32);
                b.barrier();
                let total = b.let_("total", Expr::load(name, 0u32));
                b.if_(total.greater_than(3u32), |b| {
                    b.barrier();
                });
            })
            .build()
    };
    assert_eq!(
        validate_lowered(&lowered("__vyre_partials"), &limits()).map(|_| ()),
        Ok(())
    );
    // Negative control: a user buffer read is not trusted to be uniform.
    expect_lowered_rule(
        &lowered("partials"),
        Rule::DivergentBarrier,
        &["entry[3].then[0]"],
    );
}

// ---- uniformity -------------------------------------------------------------------------

/// Locks out a barrier under an if whose condition differs between threads.
#[test]
fn barriers_under_divergent_ifs_are_rejected() {
    let p = with_body(|b| {
        b.if_(gid().less_than(3u32), |b| {
            b.barrier();
        });
    });
    expect_rule(
        &p,
        Rule::DivergentBarrier,
        &["entry[0].then[0]", "workgroup_barrier()", "move"],
    );
    let p = with_body(|b| {
        b.if_else(
            Expr::load("input", 0u32).equals(0u32),
            |_| {},
            |b| {
                b.barrier();
            },
        );
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[0].else[0]"]);
}

/// Locks out a barrier in a loop whose trip count differs between threads.
#[test]
fn barriers_in_divergent_loops_are_rejected() {
    let p = with_body(|b| {
        b.loop_("i", 0u32, Expr::local_id(Axis::X), |b, _| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[0].body[0]"]);
    let p = with_body(|b| {
        b.loop_("i", 0u32, Expr::workgroup_id(Axis::X) + 2u32, |b, i| {
            b.if_(i.less_than(1u32), |b| {
                b.barrier();
            });
        });
    });
    expect_valid(&p);
}

/// Locks out a barrier reachable after a return that only some threads took.
#[test]
fn barriers_after_divergent_returns_are_rejected() {
    let p = with_body(|b| {
        b.if_(gid().greater_equal(10u32), |b| {
            b.return_();
        });
        b.barrier();
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[1]"]);
    // The rest of the enclosing block, at every level, is divergent too.
    let p = with_body(|b| {
        b.if_(true, |b| {
            b.if_(gid().greater_equal(10u32), |b| {
                b.return_();
            });
        });
        b.if_(true, |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[1].then[0]"]);
    // A divergent return in a loop body makes later iterations divergent.
    let p = with_body(|b| {
        b.loop_("i", 0u32, 4u32, |b, _| {
            b.barrier();
            b.if_(gid().equals(1u32), |b| {
                b.return_();
            });
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[0].body[0]"]);
    // Negative control: a workgroup-uniform return keeps barriers legal.
    expect_valid(&with_body(|b| {
        b.if_(Expr::workgroup_id(Axis::X).equals(0u32), |b| {
            b.return_();
        });
        b.barrier();
    }));
}

/// Locks out variables judged uniform although some assignment makes them differ
/// between threads, including through a chain resolved only by the fixpoint.
#[test]
fn variables_are_as_divergent_as_their_worst_assignment() {
    // Assigned in a divergent if.
    let p = with_body(|b| {
        let flag = b.let_mut("flag", 0u32);
        b.if_(gid().less_than(3u32), |b| {
            b.assign("flag", 1u32);
        });
        b.if_(flag.equals(1u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[2].then[0]"]);
    // Divergence arrives through a later assignment of another variable in a loop.
    let p = with_body(|b| {
        let a = b.let_mut("a", 0u32);
        let c = b.let_mut("c", 0u32);
        b.loop_("i", 0u32, 3u32, |b, _| {
            b.assign("a", c.clone());
            b.if_(a.clone().equals(0u32), |b| {
                b.barrier();
            });
            b.assign("c", Expr::local_id(Axis::X));
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[2].body[1].then[0]"]);
    // Negative control: the same shapes with uniform values pass.
    expect_valid(&with_body(|b| {
        let flag = b.let_mut("flag", 0u32);
        b.if_(Expr::workgroup_id(Axis::Y).less_than(3u32), |b| {
            b.assign("flag", Expr::workgroup_id(Axis::X));
        });
        b.if_(flag.equals(1u32), |b| {
            b.barrier();
        });
    }));
}

/// Shows legitimate uniform control flow passes: barriers under workgroup ids,
/// lengths, workgroup counts and reduction results, and in uniform loops.
#[test]
fn uniform_barriers_and_reductions_pass() {
    expect_valid(&with_body(|b| {
        b.if_(Expr::workgroup_id(Axis::X).less_than(3u32), |b| {
            b.barrier();
            b.workgroup_reduce("inner", ReduceOp::Sum, gid());
        });
        b.if_(Expr::length("input").greater_than(2u32), |b| {
            b.barrier();
        });
        let total = b.workgroup_reduce("total", ReduceOp::Min, Expr::load("input", gid()));
        b.if_(total.greater_than(7u32), |b| {
            b.barrier();
        });
        b.loop_("round", 0u32, Expr::workgroup_count(Axis::X), |b, round| {
            b.barrier();
            b.let_("w", Expr::workgroup_id(Axis::Z) + round);
        });
        b.grid_sync();
        b.if_(Expr::workgroup_count(Axis::Y).equals(1u32), |b| {
            b.grid_sync();
        });
    }));
}

/// Locks out a workgroup reduction some threads of a workgroup skip.
#[test]
fn reductions_under_divergent_control_flow_are_rejected() {
    let p = with_body(|b| {
        b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
            b.workgroup_reduce("partial", ReduceOp::Sum, 1u32);
        });
    });
    expect_rule(
        &p,
        Rule::DivergentWorkgroupReduce,
        &["partial", "entry[0].then[0]"],
    );
}

/// Locks out workgroup scans some threads of a workgroup skip (under a divergent
/// `if`, in a loop threads leave at different times), scans of a non-`u32` value,
/// scans left in a lowered program, and a scan's result taken as uniform (each
/// thread's prefix is its own). Negative control: a scan in uniform control flow
/// whose result feeds only per-thread work passes.
#[test]
fn workgroup_scans_need_uniform_control_flow_and_give_divergent_results() {
    let p = with_body(|b| {
        b.if_(gid().less_than(3u32), |b| {
            b.workgroup_scan("offset", ReduceOp::Sum, ScanKind::Exclusive, 1u32);
        });
    });
    expect_rule(
        &p,
        Rule::DivergentWorkgroupScan,
        &["offset", "entry[0].then[0]", "workgroup_scan_exclusive_sum"],
    );
    let p = with_body(|b| {
        b.while_(Expr::load("input", gid()).equals(0u32), |b| {
            b.workgroup_scan("offset", ReduceOp::Max, ScanKind::Inclusive, 1u32);
        });
    });
    expect_rule(&p, Rule::DivergentWorkgroupScan, &["entry[0].body[0]"]);
    let p = with_body(|b| {
        b.workgroup_scan("offset", ReduceOp::Sum, ScanKind::Inclusive, Expr::i32(1));
    });
    expect_rule(&p, Rule::TypeMismatch, &["scanned value", "u32", "i32"]);
    let p = with_body(|b| {
        let offset = b.workgroup_scan("offset", ReduceOp::Sum, ScanKind::Exclusive, 1u32);
        b.if_(offset.equals(0u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[1].then[0]"]);
    let p = with_body(|b| {
        b.workgroup_scan("offset", ReduceOp::Sum, ScanKind::Exclusive, 1u32);
    });
    expect_lowered_rule(&p, Rule::WorkgroupScanNotLowered, &["offset", "lower"]);
    let p = with_body(|b| {
        b.let_(
            "prefix",
            Expr::SubgroupScan {
                op: ReduceOp::Sum,
                kind: ScanKind::Inclusive,
                value: Box::new(Expr::u32(1)),
            },
        );
    });
    expect_rule(&p, Rule::SubgroupBeforeLowering, &["subgroup_scan"]);
    expect_valid(&with_body(|b| {
        let offset = b.workgroup_scan("offset", ReduceOp::Sum, ScanKind::Exclusive, gid());
        b.if_(Expr::workgroup_id(Axis::X).less_than(2u32), |b| {
            b.workgroup_scan("again", ReduceOp::Min, ScanKind::Inclusive, offset.clone());
        });
        b.store("output", offset, 1u32);
    }));
}

/// Locks out a grid sync that whole workgroups can skip (workgroup-uniform is not enough).
#[test]
fn grid_sync_needs_grid_uniform_control_flow() {
    let p = with_body(|b| {
        b.if_(Expr::workgroup_id(Axis::X).less_than(3u32), |b| {
            b.grid_sync();
        });
    });
    expect_rule(
        &p,
        Rule::GridSyncNotGridUniform,
        &["grid_sync()", "entry[0].then[0]"],
    );
    let p = with_body(|b| {
        b.if_(Expr::workgroup_id(Axis::X).equals(0u32), |b| {
            b.return_();
        });
        b.grid_sync();
    });
    expect_rule(&p, Rule::GridSyncNotGridUniform, &["entry[1]"]);
    let p = with_body(|b| {
        let total = b.workgroup_reduce("total", ReduceOp::Sum, 1u32);
        b.if_(total.equals(64u32), |b| {
            b.grid_sync();
        });
    });
    expect_rule(&p, Rule::GridSyncNotGridUniform, &["entry[1].then[0]"]);
}

/// Locks out `break` and `continue` outside a loop (code generation would have no
/// label to branch to), also when nested in an `if`; inside a `for` or `while`, or
/// an `if` in one, they are fine.
#[test]
fn break_and_continue_need_an_enclosing_loop() {
    let p = with_body(|b| {
        b.break_();
    });
    expect_rule(&p, Rule::BreakOutsideLoop, &["`break`", "entry[0]", "loop"]);
    let p = with_body(|b| {
        b.if_(gid().less_than(3u32), |b| {
            b.continue_();
        });
    });
    expect_rule(
        &p,
        Rule::BreakOutsideLoop,
        &["`continue`", "entry[0].then[0]"],
    );
    // After a loop, the loop no longer counts.
    let p = with_body(|b| {
        b.while_(false, |b| {
            b.break_();
        });
        b.continue_();
    });
    expect_rule(&p, Rule::BreakOutsideLoop, &["entry[1]"]);
    expect_valid(&with_body(|b| {
        b.loop_("i", 0u32, 4u32, |b, i| {
            b.if_(i.equals(2u32), |b| {
                b.continue_();
            });
            b.break_();
        });
        b.while_(true, |b| {
            b.if_(gid().less_than(3u32), |b| {
                b.break_();
            });
            b.continue_();
        });
    }));
}

/// Locks out a `while` condition that is not a `bool`.
#[test]
fn while_conditions_are_bool() {
    let p = with_body(|b| {
        b.while_(1u32, |_| {});
    });
    expect_rule(&p, Rule::TypeMismatch, &["while condition", "bool", "u32"]);
}

/// Locks out barriers and workgroup reductions in loops that threads leave at
/// different times: a `while` whose condition differs between threads, a `break` or
/// `continue` under divergent control (the barrier before it too, since later
/// iterations lose the threads that left), and variables such loops assign.
/// Negative controls: a workgroup-uniform `while` condition or `break`, and a barrier
/// after the divergent loop, pass.
#[test]
fn barriers_in_loops_that_exit_on_per_thread_data_are_rejected() {
    let p = with_body(|b| {
        b.while_(Expr::load("input", gid()).equals(0u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[0].body[0]", "while"]);
    let p = with_body(|b| {
        b.loop_("i", 0u32, 8u32, |b, _| {
            b.barrier();
            b.if_(Expr::load("input", gid()).equals(0u32), |b| {
                b.break_();
            });
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[0].body[0]", "break"]);
    let p = with_body(|b| {
        b.while_(true, |b| {
            b.if_(gid().equals(5u32), |b| {
                b.continue_();
            });
            b.workgroup_reduce("total", ReduceOp::Sum, 1u32);
            b.break_();
        });
    });
    expect_rule(&p, Rule::DivergentWorkgroupReduce, &["entry[0].body[1]"]);
    // A loop that threads leave at different times leaves its variables divergent.
    let p = with_body(|b| {
        let steps = b.let_mut("steps", 0u32);
        b.while_(Expr::load("input", steps.clone()).not_equals(0u32), |b| {
            b.assign("steps", steps.clone() + 1u32);
        });
        b.if_(steps.equals(3u32), |b| {
            b.barrier();
        });
    });
    expect_rule(&p, Rule::DivergentBarrier, &["entry[2].then[0]"]);
    // Negative controls.
    expect_valid(&with_body(|b| {
        let round = b.let_mut("round", 0u32);
        b.while_(round.clone().less_than(Expr::workgroup_id(Axis::X)), |b| {
            b.barrier();
            b.if_(Expr::length("input").equals(round.clone()), |b| {
                b.break_();
            });
            b.assign("round", round.clone() + 1u32);
        });
        b.while_(Expr::load("input", gid()).equals(0u32), |b| {
            b.if_(gid().equals(0u32), |b| {
                b.break_();
            });
        });
        b.barrier();
        b.workgroup_reduce("after", ReduceOp::Max, round);
    }));
}

/// Locks out the uniformity error reporting a later node than the first offender.
#[test]
fn the_first_divergent_node_in_program_order_is_reported() {
    let p = with_body(|b| {
        b.if_(gid().less_than(3u32), |b| {
            b.let_("a", 1u32);
            b.grid_sync();
            b.barrier();
        });
    });
    expect_rule(&p, Rule::GridSyncNotGridUniform, &["entry[0].then[1]"]);
}

// ---- limits on size --------------------------------------------------------------------

fn nested_ifs(levels: u32) -> Program {
    let mut block: Vec<Node> = vec![Node::Barrier];
    for _ in 0..levels {
        block = vec![Node::If {
            condition: Expr::bool(true),
            then_body: block.into(),
            else_body: Vec::new().into(),
        }];
    }
    Program::new(Vec::new(), [1, 1, 1], block)
}

fn nested_expression(levels: u32) -> Program {
    let mut expr = Expr::u32(1);
    for _ in 0..levels {
        expr = Expr::unary(UnaryOp::BitNot, expr);
    }
    Program::new(
        Vec::new(),
        [1, 1, 1],
        vec![Node::Let {
            name: "deep".into(),
            mutable: false,
            value: expr,
        }],
    )
}

/// Locks out unbounded nesting (stack exhaustion in every recursive walk), at the
/// exact boundary.
#[test]
fn nesting_deeper_than_the_limit_is_rejected() {
    expect_valid(&nested_ifs(MAX_NESTING_DEPTH));
    expect_rule(
        &nested_ifs(MAX_NESTING_DEPTH + 1),
        Rule::NestingTooDeep,
        &["256", "then[0]"],
    );
    expect_valid(&nested_expression(MAX_NESTING_DEPTH - 1));
    expect_rule(
        &nested_expression(MAX_NESTING_DEPTH),
        Rule::NestingTooDeep,
        &["256", "entry[0]"],
    );
}

/// Locks out a program of shared blocks that describes an exponentially large tree
/// (the validator would walk it forever).
#[test]
fn programs_with_too_many_nodes_are_rejected() {
    let mut block: Arc<[Node]> = vec![Node::Barrier; 4096].into();
    for _ in 0..13 {
        block = vec![Node::If {
            condition: Expr::bool(true),
            then_body: block.clone(),
            else_body: block,
        }]
        .into();
    }
    let p = Program::new(Vec::new(), [1, 1, 1], block.to_vec());
    expect_rule(&p, Rule::TooManyNodes, &["16777216"]);
}

// ---- fuzzing ------------------------------------------------------------------------------

/// Locks out any panic in the validator: 100,000 arbitrary (mostly invalid) programs,
/// through both entry points; a panic reports its seed. Also checks every error
/// starts `Fix:` and that a good share of programs reach deep rules.
#[test]
fn validation_never_panics_on_arbitrary_programs() {
    const PROGRAMS: u64 = 100_000;
    const WORKERS: u64 = 2;
    let limits = limits();
    let worker = |first: u64| {
        let mut rules = std::collections::HashMap::new();
        let mut lowered_rules = std::collections::HashMap::new();
        let mut valid = 0u32;
        for seed in (first..PROGRAMS).step_by(WORKERS as usize) {
            let program = arbitrary_program(seed);
            let outcome = std::panic::catch_unwind(|| {
                (
                    validate(&program, &limits),
                    validate_lowered(&program, &limits),
                )
            });
            let (user, lowered) = match outcome {
                Ok(results) => results,
                Err(_) => panic!("validation panicked on arbitrary_program({seed}):\n{program}"),
            };
            for result in [&user, &lowered] {
                if let Err(e) = result {
                    assert!(e.message().starts_with("Fix:"), "seed {seed}: {e}");
                }
            }
            match user {
                Ok(_) => valid += 1,
                Err(e) => *rules.entry(e.rule()).or_insert(0u32) += 1,
            }
            if let Err(e) = lowered {
                *lowered_rules.entry(e.rule()).or_insert(0u32) += 1;
            }
        }
        (rules, lowered_rules, valid)
    };
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|first| scope.spawn(move || worker(first)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut rules = std::collections::HashMap::new();
    let mut lowered_rules = std::collections::HashMap::new();
    let mut valid = 0u32;
    for (worker_rules, worker_lowered_rules, worker_valid) in results {
        valid += worker_valid;
        for (rule, count) in worker_rules {
            *rules.entry(rule).or_insert(0u32) += count;
        }
        for (rule, count) in worker_lowered_rules {
            *lowered_rules.entry(rule).or_insert(0u32) += count;
        }
    }
    // The generator must reach every rule, or the fuzzing proves little.
    for rule in [
        Rule::EmptyName,
        Rule::ReservedName,
        Rule::DuplicateBufferName,
        Rule::BindingCollision,
        Rule::WorkgroupBufferNeedsStaticCount,
        Rule::ZeroCount,
        Rule::CountOverflow,
        Rule::SharedMemoryOverLimit,
        Rule::LocalArrayNeedsStaticCount,
        Rule::LocalMemoryOverLimit,
        Rule::WorkgroupSizeZero,
        Rule::WorkgroupSizeOverAxisLimit,
        Rule::WorkgroupSizeOverThreadLimit,
        Rule::UnknownVariable,
        Rule::DuplicateVariable,
        Rule::AssignToImmutable,
        Rule::UnknownBuffer,
        Rule::StoreToReadOnly,
        Rule::AtomicBuffer,
        Rule::AcquireLoadBuffer,
        Rule::TypeMismatch,
        Rule::SubgroupBeforeLowering,
        Rule::DivergentBarrier,
        Rule::DivergentWorkgroupReduce,
        Rule::DivergentWorkgroupScan,
        Rule::GridSyncNotGridUniform,
        Rule::BreakOutsideLoop,
        Rule::NestingTooDeep,
        Rule::UnknownScalar,
        Rule::DuplicateScalarName,
        Rule::TooManyScalars,
    ] {
        assert!(
            rules.get(&rule).copied().unwrap_or(0) > 0,
            "no arbitrary program broke {rule:?}: {rules:?}"
        );
    }
    for rule in [
        Rule::LaneMaskOutOfRange,
        Rule::WorkgroupReduceNotLowered,
        Rule::WorkgroupScanNotLowered,
        Rule::DivergentSubgroupOp,
    ] {
        assert!(
            lowered_rules.get(&rule).copied().unwrap_or(0) > 0,
            "no arbitrary program broke {rule:?} after lowering: {lowered_rules:?}"
        );
    }
    assert!(valid > 1000, "only {valid} arbitrary programs were valid");
}

fn assert_valid_cases(options: &GeneratorOptions, seeds: std::ops::Range<u64>) {
    for seed in seeds {
        let case = valid_program(seed, options);
        if let Err(e) = validate(&case.program, &options.limits) {
            panic!("valid_program({seed}) is invalid: {e}\n{}", case.program);
        }
        let globals = case.program.global_buffers();
        assert_eq!(case.inputs.len(), globals.len(), "seed {seed}");
        for (decl, bytes) in globals.iter().zip(&case.inputs) {
            assert_eq!(
                bytes.len() % decl.elem.size_bytes() as usize,
                0,
                "seed {seed}"
            );
            if let BufferCount::Static(n) = decl.count {
                assert_eq!(
                    bytes.len() as u64,
                    n as u64 * decl.elem.size_bytes() as u64,
                    "seed {seed}: {}",
                    decl.name
                );
            }
            assert!(!bytes.is_empty(), "seed {seed}: empty input {}", decl.name);
        }
        assert!(case.config.fixpoint_iterations >= 1);
        assert!(case.config.workgroups.iter().all(|&w| w >= 1));
        let declared: Vec<ScalarType> = case.program.scalars().iter().map(|s| s.ty).collect();
        let given: Vec<ScalarType> = case.scalars.iter().map(|v| v.ty()).collect();
        assert_eq!(declared, given, "seed {seed}: one value per scalar");
        let another: Vec<ScalarType> = case.scalar_values(1).iter().map(|v| v.ty()).collect();
        assert_eq!(declared, another, "seed {seed}: another draw");
    }
}

/// Locks out the valid generator producing programs the validator rejects (which
/// would silently shrink differential testing) or inputs of the wrong size.
#[test]
fn generated_valid_programs_validate() {
    assert_valid_cases(&GeneratorOptions::default(), 0..2_000);
    let grid = GeneratorOptions {
        allow_grid_sync: true,
        max_nodes: 96,
        ..GeneratorOptions::default()
    };
    assert_valid_cases(&grid, 10_000..11_000);
    let tight = GeneratorOptions {
        max_threads_per_workgroup: 32,
        allow_barriers: false,
        allow_atomics: false,
        allow_workgroup_reduce: false,
        allow_early_return: false,
        ..GeneratorOptions::default()
    };
    assert_valid_cases(&tight, 20_000..20_500);
}

/// Locks out generators that are not functions of their seed, and a valid generator
/// that never uses the features it is meant to cover.
#[test]
fn generators_are_deterministic_and_cover_the_language() {
    assert_eq!(arbitrary_program(42), arbitrary_program(42));
    let options = GeneratorOptions {
        allow_grid_sync: true,
        ..GeneratorOptions::default()
    };
    let a = valid_program(7, &options);
    let b = valid_program(7, &options);
    assert_eq!(a.program, b.program);
    assert_eq!(a.inputs, b.inputs);
    assert_eq!(a.config, b.config);

    let mut text = String::new();
    let mut shapes = std::collections::HashSet::new();
    for seed in 0..400 {
        let case = valid_program(seed, &options);
        shapes.insert(case.program.workgroup_size());
        text.push_str(&case.program.to_string());
    }
    for needle in [
        "workgroup_barrier();",
        "grid_sync();",
        "workgroup_reduce_",
        "atomic_",
        "return;",
        "for ",
        "while ",
        "break;",
        "continue;",
        "atomic_fetch_",
        "atomic_compare_exchange(",
        "atomic_load(&",
        "acquire_load(&",
        "} else {",
        "select(",
        "length(",
        "workgroup_count.",
        "local_id.",
        "count_ones(",
        "leading_zeros(",
        "abs(",
        "f32(",
        "i32(",
        "bool(",
        " u8[",
        " local ",
        " u64[",
        " i64[",
        "u64(",
        "i64(",
        " f32[",
        " i32[",
        "NaN",
        "inf",
        "  scalar s0: ",
        "scalar(s",
    ] {
        assert!(
            text.contains(needle),
            "no generated program contains {needle:?}"
        );
    }
    for op in BinaryOp::ALL {
        assert!(
            text.contains(&format!(" {} ", op.symbol()))
                || text.contains(&format!("{}(", op.symbol())),
            "no generated program uses {op:?}"
        );
    }
    assert!(
        shapes.len() > 10,
        "workgroup shapes barely vary: {shapes:?}"
    );
}

/// Locks out new constructs that silently change the programs of seeds an earlier
/// differential run printed (the GPU regression tests name two): with
/// `GeneratorOptions::core_only` the generator still draws exactly the programs it
/// drew before `while`, returning atomics, 64-bit integers, local arrays and scans
/// existed (content digests recorded from that generator). Negative control: with
/// every construct on, the same seeds give other programs.
#[test]
fn core_only_generator_options_reproduce_earlier_programs() {
    let recorded = [
        (
            0u64,
            false,
            "16063a896be136cd85b64bcd475b13470d45e44bdf0b2a3707eeb68798881172",
        ),
        (
            2,
            true,
            "0169cb7c80783cfcd59444d078d7b92f05780db490ea904967a7e2b13bc58868",
        ),
        (
            1_007_798,
            false,
            "60b62a35e55db046260a0377701f980afa00e7b3d725df1a067db70a4eca4f17",
        ),
        (
            1_008_915,
            false,
            "d3954db3343291ee00556bf2b5f11fb5e493f009a03526aa213ee9ec80b80111",
        ),
        (
            1_008_915,
            true,
            "f5932fef552cb0d3934a500bbb83253db79fdb5014f14a2aea61763b945cba4e",
        ),
    ];
    for (seed, grid_sync, digest) in recorded {
        let options = GeneratorOptions {
            allow_grid_sync: grid_sync,
            ..GeneratorOptions::default()
        };
        let core = valid_program(seed, &options.core_only());
        assert_eq!(core.program.digest().to_hex(), digest, "seed {seed}");
        let extended = valid_program(seed, &options);
        assert_ne!(extended.program.digest().to_hex(), digest, "seed {seed}");
    }
}

/// Defect locked out: re-validating a program (or a clone of it) walks it again, so
/// validity-as-a-type costs a walk per dispatch. The second call answers from the
/// memo (no validator walk on this thread); other limits walk again.
#[test]
fn validation_verdict_is_memoised_per_program_value() {
    let p = Program::builder([64, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("out", Expr::global_id(Axis::X), Expr::u32(1));
        })
        .build();
    let before = vyre_cuda::ir::validate::walks_on_current_thread();
    let first = validate(&p, &limits()).expect("valid");
    assert_eq!(
        vyre_cuda::ir::validate::walks_on_current_thread(),
        before + 1
    );
    let clone = p.clone();
    let second = validate(&clone, &limits()).expect("valid");
    assert_eq!(
        vyre_cuda::ir::validate::walks_on_current_thread(),
        before + 1,
        "re-validation of a clone walked the program"
    );
    assert_eq!(first, second);
    assert_eq!(first.form(), ProgramForm::User);
    assert!(Program::ptr_eq(first.program(), &p));
    // Negative control: other limits are another question, so the validator walks.
    let other = Limits {
        max_threads_per_workgroup: 512,
        ..limits()
    };
    validate(&p, &other).expect("valid under smaller limits too");
    let walks = || vyre_cuda::ir::validate::walks_on_current_thread() - before;
    assert_eq!(walks(), 2);
    // Both verdicts stay memoised: another caller's limits do not evict the first.
    validate(&p, &limits()).expect("valid");
    validate(&p, &other).expect("valid");
    assert_eq!(walks(), 2);
    // The lowered rule set has its own slots.
    let lowered = validate_lowered(&p, &limits()).expect("valid lowered");
    assert_eq!(lowered.form(), ProgramForm::Lowered);
    assert_eq!(walks(), 3);
    // Four sets of limits per form are memoised; a fifth walks on every call.
    for threads in [256, 128] {
        let more = Limits {
            max_threads_per_workgroup: threads,
            ..limits()
        };
        validate(&p, &more).expect("valid");
    }
    assert_eq!(walks(), 5);
    let fifth = Limits {
        max_threads_per_workgroup: 64,
        ..limits()
    };
    validate(&p, &fifth).expect("valid");
    validate(&p, &fifth).expect("valid");
    assert_eq!(walks(), 7);
    validate(&p, &limits()).expect("valid");
    assert_eq!(walks(), 7);
}

/// Defect locked out: a rejected program is re-walked on every call (an invalid
/// program dispatched in a loop costs a walk each time). The error is memoised too.
#[test]
fn validation_error_is_memoised_per_program_value() {
    let p = Program::new(Vec::new(), [0, 1, 1], Vec::new());
    let before = vyre_cuda::ir::validate::walks_on_current_thread();
    let first = validate(&p, &limits()).expect_err("zero workgroup size");
    let second = validate(&p, &limits()).expect_err("zero workgroup size");
    assert_eq!(first, second);
    assert_eq!(
        vyre_cuda::ir::validate::walks_on_current_thread(),
        before + 1
    );
    // The unmemoised entry point always walks (it is what measurements use).
    let third = validate_unmemoised(&p, &limits(), ProgramForm::User).expect_err("zero size");
    assert_eq!(third, first);
    assert_eq!(
        vyre_cuda::ir::validate::walks_on_current_thread(),
        before + 2
    );
}

// ---- scalar parameters -------------------------------------------------------------

/// `output[0] = value` with the scalars `declared` (name, type).
fn scalar_program(declared: &[(&str, ScalarType)], value: Expr) -> Program {
    let mut builder = u32_buffers(Program::builder([64, 1, 1]));
    for &(name, ty) in declared {
        builder = builder.scalar(name, ty);
    }
    builder
        .body(|b| {
            b.store("output", 0u32, value);
        })
        .build()
}

/// Locks out scalar declarations and reads the validator lets through to code
/// generation (a kernel parameter without a name, two values for one name, a read
/// the dispatch has no value for, more values than a request carries, a value used
/// as another type): each is its rule's `Fix:` error naming the scalar. Negative
/// controls: the same programs with the mistake fixed validate, and a scalar may
/// share its name with a buffer or a variable (scalars have their own namespace).
#[test]
fn scalar_declarations_and_reads_are_checked() {
    use vyre_cuda::ir::validate::MAX_SCALARS;
    use ScalarType::*;
    let read = |name: &str| Expr::scalar(name);
    expect_rule(
        &scalar_program(&[("limit", U32)], read("limt")),
        Rule::UnknownScalar,
        &["limt", "ProgramBuilder::scalar"],
    );
    expect_rule(
        &scalar_program(&[("limit", U32), ("limit", I32)], read("limit")),
        Rule::DuplicateScalarName,
        &["limit"],
    );
    expect_rule(
        &scalar_program(&[("", U32)], Expr::u32(0)),
        Rule::EmptyName,
        &["scalar"],
    );
    expect_rule(
        &scalar_program(&[("__vyre_k", U32)], Expr::u32(0)),
        Rule::ReservedName,
        &["__vyre_k"],
    );
    expect_rule(
        &scalar_program(&[("scale", F32)], read("scale") + 1u32),
        Rule::TypeMismatch,
        &["f32", "u32"],
    );
    expect_rule(
        &scalar_program(&[("wide", U64)], read("wide")),
        Rule::TypeMismatch,
        &["u64"],
    );
    let names: Vec<String> = (0..=MAX_SCALARS).map(|i| format!("s{i}")).collect();
    let many: Vec<(&str, ScalarType)> = names.iter().map(|n| (n.as_str(), U32)).collect();
    expect_rule(
        &scalar_program(&many, Expr::u32(0)),
        Rule::TooManyScalars,
        &["16", "17"],
    );
    // Negative controls.
    expect_valid(&scalar_program(&many[..MAX_SCALARS], read("s15")));
    expect_valid(&scalar_program(&[("limit", U32)], read("limit")));
    expect_valid(&scalar_program(
        &[("scale", F32)],
        read("scale").cast(U32) + 1u32,
    ));
    expect_valid(&scalar_program(
        &[("wide", U64), ("flag", Bool)],
        read("flag").select(read("wide").cast(U32), 0u32),
    ));
    let shared_names = u32_buffers(Program::builder([64, 1, 1]))
        .scalar("output", U32)
        .scalar("n", U32)
        .body(|b| {
            let n = b.let_("n", Expr::scalar("n"));
            b.store("output", 0u32, n + Expr::scalar("output"));
        })
        .build();
    expect_valid(&shared_names);
}

/// Locks out a validator that treats a scalar as per-thread data (a barrier, a
/// reduction or a grid sync under a condition on a scalar refused, though every
/// thread of the grid reads the same value): an `if` on a scalar and a `while`
/// bounded by one around a barrier, a workgroup reduction and a grid sync under a
/// `bool` scalar all validate. Negative controls: the same shapes on `global_id`
/// are refused.
#[test]
fn scalars_are_grid_uniform() {
    let barrier_under = |condition: Expr| {
        u32_buffers(Program::builder([64, 1, 1]))
            .scalar("rounds", ScalarType::U32)
            .body(|b| {
                b.if_(condition, |b| {
                    b.barrier();
                });
                let round = b.let_mut("round", 0u32);
                b.while_(round.clone().less_than(Expr::scalar("rounds")), |b| {
                    b.barrier();
                    let total = b.workgroup_reduce("total", ReduceOp::Sum, 1u32);
                    b.store("output", 0u32, total);
                    b.assign("round", round.clone() + 1u32);
                });
            })
            .build()
    };
    expect_valid(&barrier_under(Expr::scalar("rounds").greater_than(3u32)));
    expect_rule(
        &barrier_under(Expr::global_id(Axis::X).greater_than(3u32)),
        Rule::DivergentBarrier,
        &["scalar parameters"],
    );
    let grid_sync_under = |condition: Expr| {
        u32_buffers(Program::builder([64, 1, 1]))
            .scalar("sync", ScalarType::Bool)
            .body(|b| {
                b.if_(condition, |b| {
                    b.grid_sync();
                });
            })
            .build()
    };
    expect_valid(&grid_sync_under(Expr::scalar("sync")));
    expect_rule(
        &grid_sync_under(Expr::workgroup_id(Axis::X).equals(0u32)),
        Rule::GridSyncNotGridUniform,
        &["scalar parameters"],
    );
}

/// The digest of the arbitrary programs of seeds `seeds`, in order: one SHA-256 over
/// their program digests.
fn arbitrary_programs_digest(seeds: std::ops::Range<u64>) -> String {
    let mut digests = Vec::new();
    for seed in seeds {
        digests.extend_from_slice(&arbitrary_program(seed).digest().0);
    }
    Digest(sha256(&digests)).to_hex()
}

/// Locks out acquire loads that shift the programs of seeds they do not reach: the
/// valid generator draws them from a stream of their own, so every program of seeds
/// 0..400 without one is exactly the program the seed gives with acquire loads off
/// (digest and all). Negative control: they reach a good share of the seeds, and
/// those programs differ with them off.
#[test]
fn acquire_loads_leave_the_programs_without_them_unchanged() {
    let options = GeneratorOptions {
        allow_grid_sync: true,
        ..GeneratorOptions::default()
    };
    let off = GeneratorOptions {
        allow_acquire_loads: false,
        ..options
    };
    let has_acquire_load = |program: &Program| {
        let position = Construct::ALL
            .iter()
            .position(|&c| c == Construct::AcquireLoad)
            .expect("listed");
        constructs_used(program)[position]
    };
    let mut reached = 0;
    for seed in 0..400 {
        let with = valid_program(seed, &options);
        let without = valid_program(seed, &off);
        assert!(!has_acquire_load(&without.program), "seed {seed}");
        if has_acquire_load(&with.program) {
            reached += 1;
            assert_ne!(
                with.program.digest(),
                without.program.digest(),
                "seed {seed}"
            );
        } else {
            assert_eq!(
                with.program.digest(),
                without.program.digest(),
                "seed {seed}"
            );
            assert_eq!(with.inputs, without.inputs, "seed {seed}");
            assert_eq!(with.config, without.config, "seed {seed}");
        }
    }
    assert!(
        reached > 80,
        "acquire loads in only {reached} of 400 programs"
    );
}

/// Locks out a change to the programs the arbitrary generator draws for a seed (its
/// mutator rebuilds valid programs node by node, so a refactor of that rebuild that
/// visits parts in another order, or loses one, changes them): the programs of seeds
/// 0..600 (about 200 of them mutated valid programs) are pinned by digest. The
/// negative control: the next 600 seeds give another digest, so the pin is not
/// vacuous. Update the pin only for a deliberate change of the generator or of the
/// digest's encoding.
#[test]
fn arbitrary_programs_are_pinned_by_seed() {
    const PINNED: &str = "ef1dfd0b6cd24f65e1bdf6c16d098031a7e711c57e34e2a73d036529cfc5a3a7";
    assert_eq!(arbitrary_programs_digest(0..600), PINNED);
    assert_ne!(arbitrary_programs_digest(600..1200), PINNED);
}

/// Locks out a clock read that passes as a `u32` or as workgroup-uniform: stored
/// into a `u32` buffer it is a type mismatch naming `u64`, and a barrier under a
/// condition on it is divergent (each thread reads its own value). Negative
/// control: stored into a `u64` buffer, with no barrier under it, it validates.
#[test]
fn the_clock_is_a_divergent_u64() {
    let u64_out = |body: &dyn Fn(&mut BlockBuilder)| {
        Program::builder([32, 1, 1])
            .buffer(
                "out",
                0,
                Access::ReadWrite,
                ElemType::U64,
                BufferCount::Runtime,
            )
            .body(|b| body(b))
            .build()
    };
    let fine = u64_out(&|b| {
        b.store("out", Expr::local_id(Axis::X), Expr::clock());
    });
    validate(&fine, &limits()).unwrap_or_else(|error| panic!("{error}\n{fine}"));
    expect_rule(
        &with_body(|b| {
            b.store("output", 0u32, Expr::clock());
        }),
        Rule::TypeMismatch,
        &["u32", "u64"],
    );
    expect_rule(
        &u64_out(&|b| {
            b.if_(Expr::clock().less_than(Expr::u64(1000)), |b| {
                b.barrier();
            });
        }),
        Rule::DivergentBarrier,
        &["entry[0].then[0]"],
    );
}
