//! The program IR: the language a kernel author writes in.
//!
//! This module is the language reference: each node's and expression's doc comment
//! says what it means at run time. [`validate`](mod@validate) owns every rule and every error
//! message; everything downstream (lowering, code generation, the reference
//! interpreter, the backend) may assume a program it receives has passed it.
//!
//! # The language at a glance
//!
//! - **Values** ([`ScalarType`]): `u32`, `i32`, `u64`, `i64`, `f32` and `bool`; an
//!   operation takes operands of one type (a shift amount is a `u32`), and a
//!   [`Expr::Cast`] converts with Rust `as` semantics.
//! - **Memory** ([`BufferDecl`]): buffers of `u8`, `u32`, `i32`, `u64`, `i64` or `f32`
//!   elements that are global (read-only, read-write or write-only: kernel
//!   parameters), per workgroup ([`Access::Workgroup`], shared memory) or per thread
//!   ([`Access::Local`], a local array), each indexed at run time.
//! - **Scalar parameters** ([`ScalarDecl`], [`ProgramBuilder::scalar`],
//!   [`Expr::Scalar`]): named values of any value type that each dispatch supplies
//!   (`Dispatch::scalar("name", value)`), the same in every thread (grid-uniform:
//!   a scalar may bound a loop around a barrier). At most
//!   [`MAX_SCALARS`](validate::MAX_SCALARS) per program. A value is never part of the
//!   program: a new value needs no new PTX and no new JIT, and a recorded graph step
//!   takes new values without re-capture (`set_scalar`). A delimiter, a table size or
//!   a length belongs here rather than in a literal (a new program per value) or a
//!   one-element buffer (a copy per dispatch).
//! - **Statements** ([`Node`]): `let` and assignment, stores, `if`, bounded `for`
//!   ([`Node::Loop`]) and data-dependent `while` ([`Node::While`]) loops with
//!   [`Node::Break`] and [`Node::Continue`], `return`; barriers and grid syncs;
//!   atomics that return nothing ([`Node::Atomic`]) or the previous value
//!   ([`Node::AtomicFetch`], [`Node::CompareExchange`]) and atomic reads
//!   ([`Node::AtomicLoad`]), acquire loads at system scope that poll what the host
//!   writes while the kernel runs ([`Node::AcquireLoad`]); workgroup reductions and
//!   prefix scans ([`Node::WorkgroupReduce`], [`Node::WorkgroupScan`]).
//! - **Control flow the workgroup must agree on**: a barrier, a workgroup reduction
//!   or scan needs every thread of the workgroup (a grid sync: of the grid), so it may
//!   not sit under a condition, or in a loop, that threads leave at different times
//!   (a `while` whose condition differs between threads, a `break` or `continue`
//!   under such a condition), nor after a `return` only some threads took.
//!   Literals, scalar parameters, buffer lengths and `workgroup_count` are the same
//!   for the whole grid, `workgroup_id` and reduction results for a workgroup.
//!
//! # Every result is defined
//!
//! Where C leaves behaviour undefined, this IR defines a value, the same bits on the
//! GPU and in the reference interpreter (the differential tests hold every generated
//! program to that):
//! - integer arithmetic wraps; `/` and `%` by zero give 0; `MIN / -1` gives `MIN` and
//!   `MIN % -1` gives 0 (`i32` and `i64`); shift amounts are taken modulo the width;
//! - `f32` arithmetic rounds to nearest and is never fused; every NaN result is
//!   `0x7fffffff`; casts to integers truncate and saturate, NaN gives 0
//!   ([`BinaryOp`], [`UnaryOp`], [`Expr::Cast`]);
//! - with bounds checks on (the default), a load past a buffer's end reads 0, a store
//!   or an atomic there does nothing (the atomic returns 0);
//! - a variable holds its `let` value until assigned; workgroup buffers and local
//!   arrays are zero at the start of every kernel run, write-only buffers at the
//!   start of every dispatch; a scalar parameter holds the dispatch's value (a
//!   dispatch without a value for every declared scalar is refused, never run with
//!   zeros);
//! - a `while` loop that never ends runs until the launch is killed, or traps at
//!   [`CodegenOptions::max_loop_iterations`](crate::CodegenOptions::max_loop_iterations);
//!   the reference interpreter stops it with an error at its work cap or at that cap.
//!
//! What does depend on the order threads run in: which of two plain stores to one
//! element without a barrier between wins, the value an atomic returns when several
//! threads touch one element, and the final value of an element updated with
//! different atomic operations ([`AtomicOp`] says which forms are order-free).
//! And one value is the machine's by design: [`Builtin::Clock`] reads the device's
//! clock (nanoseconds on CUDA, units of work on the reference), for instruments that
//! say when a phase of a kernel ended; the random programs of the differential tests
//! never read it.
//!
//! # Worked example: a hash table
//!
//! Open addressing with linear probing, built and read on the device: a
//! compare-exchange claims a slot, a `while` loop probes until the key or an empty
//! slot turns up. This is `examples/hash_table.rs` (`cargo run --example
//! hash_table`); it runs here as a test on the backend `AnyBackend::cuda_or_reference`
//! finds, and the tests run it on the reference interpreter and on CUDA.
//!

#![doc = concat!("```\n", include_str!("../../examples/hash_table.rs"), "```")]

mod builder;
mod digest;
mod display;
#[cfg(feature = "testing")]
pub mod generate;
mod program;
mod structural;
pub mod validate;

pub use builder::{BlockBuilder, ProgramBuilder};
pub use digest::{computations_on_current_thread, computations_total, sha256, Digest};
pub use display::{
    DISPLAY_MAX_BYTES, DISPLAY_MAX_DEPTH, DISPLAY_MAX_EXPR_DEPTH, DISPLAY_MAX_INDENT_LEVELS,
};
pub(crate) use program::LoweringMemo;
pub use program::*;
pub(crate) use structural::any_node;
pub use structural::{Rebuild, HASH_ITEM_BUDGET};
pub use validate::{
    validate, validate_lowered, validate_unmemoised, Limits, ValidProgram, ValidationError,
};
