//! The host-cost measurement fixture, shared by benches, instruments, tests and the
//! raw-driver floor so every figure in the README describes the same program.
//!
//! Buffers: `in` (read-only u32 × 4, binding 0), `out` (read-write u32 × 4,
//! binding 1), `scratch1..` (read-write u32 × 4, bindings 2..); body
//! `acc0 = in[0]; accK = acc(K−1) + K; out[0] = acc_last`; workgroup `[1, 1, 1]`.

use crate::ir::{Access, BufferCount, ElemType, Expr, Program};

/// The host-cost fixture with `buffers` buffers in total (at least 2) and a chain of
/// `chain` additions (`4 × chain + 6` IR nodes).
pub fn host_cost_fixture(buffers: u32, chain: u32) -> Program {
    host_cost_fixture_salted(buffers, chain, None)
}

/// The fixture with the first link `acc1 = acc0 + (1 + salt)` (wrapping; the salt
/// changes that literal's value only): a program with the same shape, node count and
/// cost but different content (digest and PTX text), so neither the PTX cache nor the
/// driver's JIT cache can serve it. Used to time cold first dispatches and to tell
/// same-shape programs apart. `out[0]` is
/// [`host_cost_fixture_expected`]`(x, chain) + salt` (for `chain >= 1`).
pub fn host_cost_fixture_salted(buffers: u32, chain: u32, salt: Option<u32>) -> Program {
    let buffers = buffers.max(2);
    let mut builder = Program::builder([1, 1, 1])
        .entry_op_id(format!("host_cost_fixture_b{buffers}_n{chain}"))
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
        );
    for k in 1..buffers - 1 {
        builder = builder.buffer(
            format!("scratch{k}"),
            k + 1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        );
    }
    builder
        .body(|b| {
            // The salt changes a literal, never the tree: a salted program must have
            // exactly the unsalted node count (an `in[0] ^ salt` would add two nodes).
            let mut acc = b.let_("acc0", Expr::load("in", 0u32));
            for k in 1..=chain {
                let step = match salt {
                    Some(salt) if k == 1 => k.wrapping_add(salt),
                    _ => k,
                };
                acc = b.let_(format!("acc{k}"), acc + step);
            }
            b.store("out", 0u32, acc);
        })
        .build()
}

/// The fixture's expected `out[0]` for input `in[0] = x`.
pub fn host_cost_fixture_expected(x: u32, chain: u32) -> u32 {
    let triangle = (chain as u64 * (chain as u64 + 1) / 2) as u32;
    x.wrapping_add(triangle)
}

/// Chain length that gives the fixture approximately `nodes` IR nodes.
pub fn chain_for_nodes(nodes: u32) -> u32 {
    // Each link is a Let, a Binary, a Var and a Literal: 4 nodes; the first load and
    // the final store add 6.
    nodes.saturating_sub(6) / 4
}
