//! A program whose workgroup memory is 100 KiB, past the 48 KiB a kernel may declare
//! statically, so its kernel uses the dynamic shared-memory pool
//! (`codegen::ptx::workgroup_memory`); and its answer computed on the host, so a
//! test can check the reference interpreter as well as compare the device with it.
//! Included by `support/mod.rs` and by `tests/ptx.rs` (`#[path]`).
#![allow(dead_code)]

use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program, ReduceOp, ScalarType};

/// Threads per workgroup.
pub const THREADS: u32 = 256;

/// `u32` words of the `table` workgroup buffer: 100 KiB.
pub const TABLE_WORDS: u32 = 100 * 1024 / 4;

/// `u64` words of the `wide` workgroup buffer (placed first in the pool).
pub const WIDE_WORDS: u32 = 64;

/// Each workgroup `g` fills `table` with its slice of `src` (`table[i] = src[g·W + i]
/// ^ i`) and `wide[j] = j · (2^32 + 1) + g`, waits, then writes
/// `dst[g·W + i] = table[W − 1 − i] + low32(wide[i % 64])`, every word written by
/// another thread than the one reading it; `totals[g]` is the workgroup reduction
/// (lowered into more workgroup buffers) of every table word. `src` and `dst` hold
/// `W` = [`TABLE_WORDS`] words per workgroup.
pub fn program() -> Program {
    Program::builder([THREADS, 1, 1])
        .entry_op_id("wide_shared")
        .buffer(
            "src",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "dst",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "totals",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "table",
            3,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(TABLE_WORDS),
        )
        .buffer(
            "wide",
            4,
            Access::Workgroup,
            ElemType::U64,
            BufferCount::Static(WIDE_WORDS),
        )
        .body(|b| {
            let t = b.let_("t", Expr::local_id(Axis::X));
            let g = b.let_("g", Expr::workgroup_id(Axis::X));
            let first = b.let_("first", g.clone() * TABLE_WORDS);
            let sum = b.let_mut("sum", Expr::u32(0));
            b.loop_("k", 0u32, TABLE_WORDS / THREADS, |b, k| {
                let i = b.let_("i", k * THREADS + t.clone());
                let word = b.let_(
                    "word",
                    Expr::load("src", first.clone() + i.clone()) ^ i.clone(),
                );
                b.store("table", i, word.clone());
                b.assign("sum", sum.clone() + word);
            });
            b.if_(t.clone().less_than(WIDE_WORDS), |b| {
                let wide = t.clone().cast(ScalarType::U64) * Expr::u64((1 << 32) + 1)
                    + g.clone().cast(ScalarType::U64);
                b.store("wide", t.clone(), wide);
            });
            b.barrier();
            b.loop_("k", 0u32, TABLE_WORDS / THREADS, |b, k| {
                let i = b.let_("i", k * THREADS + t.clone());
                let mirrored = Expr::load("table", Expr::u32(TABLE_WORDS - 1) - i.clone());
                let low = Expr::load("wide", i.clone() % WIDE_WORDS).cast(ScalarType::U32);
                b.store("dst", first.clone() + i, mirrored + low);
            });
            let total = b.workgroup_reduce("total", ReduceOp::Sum, sum.clone());
            b.if_(t.clone().equals(0u32), |b| {
                b.store("totals", g.clone(), total);
            });
        })
        .build()
}

/// `src` for `groups` workgroups: pseudo-random words.
pub fn source(groups: u32) -> Vec<u32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..groups * TABLE_WORDS)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        })
        .collect()
}

/// What [`program`] writes for `src` (`dst`, then `totals`), computed on the host.
pub fn expected(src: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let words = TABLE_WORDS as usize;
    let mut dst = vec![0u32; src.len()];
    let mut totals = Vec::new();
    for (g, slice) in src.chunks_exact(words).enumerate() {
        let table: Vec<u32> = slice
            .iter()
            .enumerate()
            .map(|(i, &v)| v ^ i as u32)
            .collect();
        for i in 0..words {
            let low = (i % WIDE_WORDS as usize) as u32 + g as u32;
            dst[g * words + i] = table[words - 1 - i].wrapping_add(low);
        }
        totals.push(table.iter().fold(0u32, |a, &v| a.wrapping_add(v)));
    }
    (dst, totals)
}
