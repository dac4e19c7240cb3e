//! Programs the lane tests share, CPU and GPU binaries alike (include it with
//! `#[path = "support/lane.rs"] mod lane_programs;` or through `support::lane`).
#![allow(dead_code)]

use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};

/// `y[i] = f(x[i])` over 64-thread workgroups (`x` read-only, `y` write-only), named
/// `name`.
pub fn elementwise(name: &str, f: fn(Expr) -> Expr) -> Program {
    Program::builder([64, 1, 1])
        .entry_op_id(name)
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "y",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                b.store("y", i.clone(), f(Expr::load("x", i.clone())));
            });
        })
        .build()
}

/// `y[i] = x[i] + 1`.
pub fn increment() -> Program {
    elementwise("lane_increment", |x| x + 1u32)
}

/// `y[i] = x[i] * 3`.
pub fn triple() -> Program {
    elementwise("lane_triple", |x| x * 3u32)
}

/// `x[local_id.x] = 1` in workgroups of `shape`, after a grid sync when asked: a
/// kernel a lane of another shape, or any lane, refuses.
pub fn store_one(shape: [u32; 3], grid_sync: bool) -> Program {
    Program::builder(shape)
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            if grid_sync {
                b.grid_sync();
            }
            b.store("x", Expr::local_id(Axis::X), 1u32);
        })
        .build()
}
