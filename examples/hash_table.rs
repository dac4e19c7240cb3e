// A hash table built and read on the device: open addressing with linear probing.
// `count_keys` inserts every key of its input with a compare-exchange on the slot the
// key hashes to (the next slot when another key holds it) and counts it there with
// an atomic add; `look_up` probes the same way with a `while` loop that ends on the
// data (the key found, or an empty slot) and returns each query's count. Which slot
// a key ends in depends on the order threads claimed slots in, so the table's layout
// may differ between runs and backends; every count `look_up` returns does not.
//
// Run: `cargo run --example hash_table` (the GPU where there is one, the reference
// interpreter otherwise). The ir module docs show this file; tests run it on both.

use vyre_cuda::backend::{AnyBackend, BackendError, Binding, Dispatch};
use vyre_cuda::ir::*;
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

/// Slots in the table: a power of two, so `slot + 1` wraps with a mask.
pub const SLOTS: u32 = 256;

/// What an empty slot holds: keys are never 0.
const EMPTY: u32 = 0;

/// Threads per workgroup of both programs.
const THREADS: u32 = 64;

/// A key's first slot: the top 8 bits of a multiplicative hash (256 slots).
fn first_slot(key: Expr) -> Expr {
    (key * 0x9E37_79B1u32) >> 24u32
}

/// Inserts and counts `keys[i]` (one thread per key; at most `SLOTS` distinct keys).
pub fn count_keys() -> Program {
    Program::builder([THREADS, 1, 1])
        .entry_op_id("hash_count_keys")
        .buffer(
            "keys",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "table",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(SLOTS),
        )
        .buffer(
            "counts",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(SLOTS),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().greater_equal(Expr::length("keys")), |b| {
                b.return_();
            });
            let key = b.let_("key", Expr::load("keys", i));
            let slot = b.let_mut("slot", first_slot(key.clone()));
            let probes = b.let_mut("probes", 0u32);
            b.while_(probes.clone().less_than(SLOTS), |b| {
                // Claim the slot if it is empty; `seen` is what it held before.
                let seen = b.compare_exchange("seen", "table", slot.clone(), EMPTY, key.clone());
                let mine = seen.clone().equals(EMPTY).or(seen.equals(key.clone()));
                b.if_(mine, |b| {
                    b.atomic(AtomicOp::Add, "counts", slot.clone(), 1u32);
                    b.break_();
                });
                b.assign("slot", (slot.clone() + 1u32) & (SLOTS - 1));
                b.assign("probes", probes.clone() + 1u32);
            });
        })
        .build()
}

/// `found[i]` = the count of `queries[i]` in the table (0 when absent).
pub fn look_up() -> Program {
    Program::builder([THREADS, 1, 1])
        .entry_op_id("hash_look_up")
        .buffer(
            "queries",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "table",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(SLOTS),
        )
        .buffer(
            "counts",
            2,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(SLOTS),
        )
        .buffer(
            "found",
            3,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().greater_equal(Expr::length("queries")), |b| {
                b.return_();
            });
            let query = b.let_("query", Expr::load("queries", i.clone()));
            let slot = b.let_mut("slot", first_slot(query.clone()));
            let probes = b.let_mut("probes", 0u32);
            let count = b.let_mut("count", 0u32);
            b.while_(probes.clone().less_than(SLOTS), |b| {
                let held = b.let_("held", Expr::load("table", slot.clone()));
                b.if_(held.clone().equals(query.clone()), |b| {
                    b.assign("count", Expr::load("counts", slot.clone()));
                    b.break_();
                });
                b.if_(held.equals(EMPTY), |b| {
                    b.break_();
                });
                b.assign("slot", (slot.clone() + 1u32) & (SLOTS - 1));
                b.assign("probes", probes.clone() + 1u32);
            });
            b.store("found", i, count);
        })
        .build()
}

/// Counts `keys` into a fresh table on `backend`, then returns each query's count.
pub fn count_and_look_up(
    backend: &AnyBackend,
    keys: &[u32],
    queries: &[u32],
) -> Result<Vec<u32>, BackendError> {
    let table = backend.buffer(u64::from(SLOTS) * 4)?;
    let counts = backend.buffer(u64::from(SLOTS) * 4)?;
    let keys_buffer = backend.buffer_from(keys)?;
    let counting = DispatchConfig::linear((keys.len() as u32).div_ceil(THREADS).max(1))
        .with_readback(ReadbackPolicy::None);
    let kernel = backend.compile(&count_keys(), &counting)?;
    let bindings = [
        Binding::from(&keys_buffer),
        Binding::from(&table),
        Binding::from(&counts),
    ];
    backend.run(Dispatch::new(&kernel, &bindings).config(&counting))?;

    let queries_buffer = backend.buffer_from(queries)?;
    let found = backend.buffer(queries.len() as u64 * 4)?;
    let looking = DispatchConfig::linear((queries.len() as u32).div_ceil(THREADS).max(1))
        .with_readback(ReadbackPolicy::None);
    let kernel = backend.compile(&look_up(), &looking)?;
    let bindings = [
        Binding::from(&queries_buffer),
        Binding::from(&table),
        Binding::from(&counts),
        Binding::from(&found),
    ];
    backend.run(Dispatch::new(&kernel, &bindings).config(&looking))?;
    backend.read::<u32>(&found)
}

/// 1,000 keys with repeats (200 distinct values) and the queries 1..=210 (the last
/// ten absent).
pub fn sample() -> (Vec<u32>, Vec<u32>) {
    let keys = (0..1000u32).map(|i| 1 + (i * 7919) % 200).collect();
    (keys, (1..=210).collect())
}

/// The queries whose `found` count differs from the count of `keys` on the host.
pub fn miscounted(keys: &[u32], queries: &[u32], found: &[u32]) -> Vec<u32> {
    queries
        .iter()
        .zip(found)
        .filter(|&(query, &count)| keys.iter().filter(|&key| key == query).count() as u32 != count)
        .map(|(&query, _)| query)
        .collect()
}

/// The sample counted and looked up on `backend`: the queries it got wrong.
pub fn check(backend: &AnyBackend) -> Result<Vec<u32>, BackendError> {
    let (keys, queries) = sample();
    let found = count_and_look_up(backend, &keys, &queries)?;
    Ok(miscounted(&keys, &queries, &found))
}

fn main() -> Result<(), BackendError> {
    let backend = AnyBackend::cuda_or_reference();
    let wrong = check(&backend)?;
    assert!(wrong.is_empty(), "counts differ for {wrong:?}");
    println!("{}", backend.notice());
    println!("hash table: 1,000 keys counted, 210 queries answered");
    Ok(())
}
