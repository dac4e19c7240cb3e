//! The five programs of the pipeline, written with the IR builder.
//!
//! Every buffer is runtime-sized, so one compiled kernel serves every text length;
//! the grid carries the size (`workgroups_for(n)` workgroups, or one for the scan).
//! Intermediate buffers are `ReadWrite` rather than `WriteOnly`: every element is
//! written by the step that produces it, so the backend's zeroing of write-only
//! outputs would be wasted device work on every encode.
//!
//! No program relies on bounds-checked loads for correctness: every index is
//! guarded or clamped, so the programs mean the same with bounds checks off.

use super::{class, Geometry, PretokenizeError};
use crate::ir::{
    Access, AtomicOp, Axis, BufferCount, ElemType, Expr, Program, ReduceOp, ScalarType,
};

/// The pipeline's programs, in dispatch order.
#[derive(Clone, Debug)]
pub struct Programs {
    /// The workgroup shapes they were built for.
    pub geometry: Geometry,
    /// Step 1: `text` (u8, binding 0) → `classes` (u8, binding 1).
    pub classify: Program,
    /// Step 2: `classes` (u8, binding 0) → `marks` (u8, binding 1), 1 where a piece starts.
    pub mark: Program,
    /// Step 3: `marks` (u8, binding 0) → `block_counts` (u32, binding 1), one per workgroup.
    pub block_count: Program,
    /// Step 4 (one workgroup of [`Geometry::scan_threads`]): `block_counts` (u32, binding 0) →
    /// `block_offsets` (u32, binding 1, `B + 1` elements): exclusive prefix sums, then the total.
    pub block_scan: Program,
    /// Step 5: `marks` (u8, binding 0), `block_offsets` (u32, binding 1) →
    /// `piece_starts` (u32, binding 2, at least as many elements as pieces).
    pub compact: Program,
}

/// Names of the steps, in dispatch order (the programs' entry op ids end with them).
pub const STEP_NAMES: [&str; 5] = ["classify", "mark", "block_count", "block_scan", "compact"];

impl Programs {
    /// The programs in dispatch order, with their step names.
    pub fn steps(&self) -> [(&'static str, &Program); 5] {
        [
            (STEP_NAMES[0], &self.classify),
            (STEP_NAMES[1], &self.mark),
            (STEP_NAMES[2], &self.block_count),
            (STEP_NAMES[3], &self.block_scan),
            (STEP_NAMES[4], &self.compact),
        ]
    }
}

/// The five programs with the default [`Geometry`] (256-thread workgroups, a
/// 1024-thread scan): what the example and the GPU tests run.
pub fn programs() -> Programs {
    build(Geometry::default()).unwrap_or_else(|_| unreachable!("the default geometry is valid"))
}

/// The five programs for another geometry (small ones let CPU tests cross many
/// workgroup boundaries with short texts). Rejects a geometry the programs cannot
/// run with.
pub fn build(geometry: Geometry) -> Result<Programs, PretokenizeError> {
    geometry.check()?;
    Ok(Programs {
        geometry,
        classify: classify(geometry.workgroup_size),
        mark: mark(geometry.workgroup_size),
        block_count: block_count(geometry.workgroup_size),
        block_scan: block_scan(geometry.scan_threads),
        compact: compact(geometry.workgroup_size),
    })
}

fn u(value: u32) -> Expr {
    Expr::u32(value)
}

/// `low <= value < low + span`, with one wrapping subtraction.
fn in_range(value: &Expr, low: u32, span: u32) -> Expr {
    (value.clone() - low).less_than(span)
}

/// Step 1: one [`class`] code per byte.
pub fn classify(workgroup_size: u32) -> Program {
    Program::builder([workgroup_size, 1, 1])
        .entry_op_id("pretokenize.classify")
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "classes",
            1,
            Access::ReadWrite,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("text")), |b| {
                let byte = b.let_("byte", Expr::load("text", i.clone()));
                let letter = b.let_(
                    "is_letter",
                    in_range(&byte, b'A' as u32, 26).or(in_range(&byte, b'a' as u32, 26)),
                );
                let digit = b.let_("is_digit", in_range(&byte, b'0' as u32, 10));
                // \t \n \x0B \x0C \r are 9..=13.
                let whitespace = b.let_(
                    "is_whitespace",
                    byte.clone().equals(b' ' as u32).or(in_range(&byte, 9, 5)),
                );
                let ascii = b.let_(
                    "ascii_class",
                    letter.select(
                        class::LETTER,
                        digit.select(
                            class::DIGIT,
                            whitespace.select(class::WHITESPACE, class::PUNCTUATION),
                        ),
                    ),
                );
                let high = b.let_(
                    "high_class",
                    byte.clone().greater_equal(0xF8u32).select(
                        class::INVALID,
                        byte.clone().greater_equal(0xF0u32).select(
                            class::LEAD4,
                            byte.clone().greater_equal(0xE0u32).select(
                                class::LEAD3,
                                byte.clone()
                                    .greater_equal(0xC0u32)
                                    .select(class::LEAD2, class::CONTINUATION),
                            ),
                        ),
                    ),
                );
                b.store(
                    "classes",
                    i.clone(),
                    byte.greater_equal(0x80u32).select(high, ascii),
                );
            });
        })
        .build()
}

/// Step 2: `marks[i] = 1` where a piece starts (see the module docs).
pub fn mark(workgroup_size: u32) -> Program {
    Program::builder([workgroup_size, 1, 1])
        .entry_op_id("pretokenize.mark")
        .buffer(
            "classes",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "marks",
            1,
            Access::ReadWrite,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("classes")), |b| {
                let current = b.let_("current", Expr::load("classes", i.clone()));
                // Look-back indices clamp to 0 near the start; `i == 0` is forced to
                // a mark below, and for i = 1, 2 the clamped reads can only repeat
                // byte 0, which the attachment test then reads consistently.
                let back = |distance: u32| {
                    i.clone()
                        .greater_equal(distance)
                        .select(i.clone() - distance, 0u32)
                };
                let previous1 = b.let_("previous1", Expr::load("classes", back(1)));
                let previous2 = b.let_("previous2", Expr::load("classes", back(2)));
                let previous3 = b.let_("previous3", Expr::load("classes", back(3)));
                let previous1_continuation = b.let_(
                    "previous1_continuation",
                    previous1.clone().equals(class::CONTINUATION),
                );
                // A continuation byte is taken by the nearest lead within 3 bytes
                // whose sequence length exceeds the distance to it.
                let attached = b.let_(
                    "attached",
                    previous1
                        .clone()
                        .greater_equal(class::LEAD2)
                        .and(previous1.clone().less_equal(class::LEAD4))
                        .or(previous1_continuation.clone().and(
                            previous2
                                .clone()
                                .equals(class::LEAD3)
                                .or(previous2.clone().equals(class::LEAD4)),
                        ))
                        .or(previous1_continuation
                            .and(previous2.equals(class::CONTINUATION))
                            .and(previous3.equals(class::LEAD4))),
                );
                let starts_piece = b.let_(
                    "starts_piece",
                    i.clone()
                        .equals(0u32)
                        .or(current.clone().equals(class::CONTINUATION).select(
                            attached.logical_not(),
                            current
                                .clone()
                                .greater_equal(class::PUNCTUATION)
                                .or(current.not_equals(previous1)),
                        )),
                );
                b.store("marks", i.clone(), starts_piece.cast(ScalarType::U32));
            });
        })
        .build()
}

/// Step 3: the number of piece starts in each workgroup's bytes.
pub fn block_count(workgroup_size: u32) -> Program {
    Program::builder([workgroup_size, 1, 1])
        .entry_op_id("pretokenize.block_count")
        .buffer(
            "marks",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "block_counts",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let mark = b.let_mut("mark", 0u32);
            b.if_(i.clone().less_than(Expr::length("marks")), |b| {
                b.assign("mark", Expr::load("marks", i.clone()));
            });
            let count = b.workgroup_reduce("count", ReduceOp::Sum, mark);
            b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
                b.store("block_counts", Expr::workgroup_id(Axis::X), count);
            });
        })
        .build()
}

/// Step 4: exclusive prefix sums of the block counts, and the total, in one
/// workgroup of `scan_threads` threads (a power of two).
///
/// Thread `t` owns `per_thread = ceil(B / scan_threads)` consecutive counts (one,
/// with the default geometry, for texts up to 256 KiB): it sums them, a
/// Hillis–Steele scan over the threads' sums in shared memory (log2 of
/// `scan_threads` rounds, two barriers each) gives every thread the total before
/// its first count, and the thread writes its counts' offsets serially. The last
/// thread writes the total at `B`.
pub fn block_scan(scan_threads: u32) -> Program {
    let rounds = scan_threads.trailing_zeros();
    Program::builder([scan_threads, 1, 1])
        .entry_op_id("pretokenize.block_scan")
        .buffer(
            "block_counts",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "block_offsets",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "thread_sums",
            2,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(scan_threads),
        )
        .body(|b| {
            let thread = b.let_("thread", Expr::local_id(Axis::X));
            let blocks = b.let_("blocks", Expr::length("block_counts"));
            let per_thread = b.let_(
                "per_thread",
                (blocks.clone() + (scan_threads - 1)) / scan_threads,
            );
            let first = b.let_("first", thread.clone() * per_thread.clone());
            let own = b.let_mut("own", 0u32);
            b.loop_("j", 0u32, per_thread.clone(), |b, j| {
                let index = b.let_("sum_index", first.clone() + j);
                b.if_(index.clone().less_than(blocks.clone()), |b| {
                    b.assign("own", own.clone() + Expr::load("block_counts", index));
                });
            });
            b.store("thread_sums", thread.clone(), own.clone());
            b.barrier();
            b.loop_("round", 0u32, rounds, |b, round| {
                let distance = b.let_("distance", u(1) << round);
                let addend = b.let_mut("addend", 0u32);
                b.if_(thread.clone().greater_equal(distance.clone()), |b| {
                    b.assign(
                        "addend",
                        Expr::load("thread_sums", thread.clone() - distance),
                    );
                });
                b.barrier();
                b.store(
                    "thread_sums",
                    thread.clone(),
                    Expr::load("thread_sums", thread.clone()) + addend,
                );
                b.barrier();
            });
            let inclusive = b.let_("inclusive", Expr::load("thread_sums", thread.clone()));
            let running = b.let_mut("running", inclusive.clone() - own);
            b.loop_("k", 0u32, per_thread, |b, k| {
                let index = b.let_("write_index", first.clone() + k);
                b.if_(index.clone().less_than(blocks.clone()), |b| {
                    b.store("block_offsets", index.clone(), running.clone());
                    b.assign(
                        "running",
                        running.clone() + Expr::load("block_counts", index),
                    );
                });
            });
            b.if_(thread.equals(scan_threads - 1), |b| {
                b.store("block_offsets", blocks, inclusive);
            });
        })
        .build()
}

/// Step 5: every marked byte writes its offset to
/// `piece_starts[block_offsets[workgroup] + rank]`, where `rank` counts the marks
/// before it in its workgroup: marks are gathered into a shared bit mask (one
/// atomic OR per mark, one barrier), and the rank is the population count of the
/// earlier bits.
pub fn compact(workgroup_size: u32) -> Program {
    let words = workgroup_size.div_ceil(32);
    Program::builder([workgroup_size, 1, 1])
        .entry_op_id("pretokenize.compact")
        .buffer(
            "marks",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "block_offsets",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "piece_starts",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "mark_bits",
            3,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(words),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let local = b.let_("local", Expr::local_id(Axis::X));
            let word = b.let_("word", local.clone() / 32u32);
            let bit = b.let_("bit", local % 32u32);
            let mark = b.let_mut("mark", 0u32);
            b.if_(i.clone().less_than(Expr::length("marks")), |b| {
                b.assign("mark", Expr::load("marks", i.clone()));
            });
            b.if_(mark.clone().not_equals(0u32), |b| {
                b.atomic(AtomicOp::Or, "mark_bits", word.clone(), u(1) << bit.clone());
            });
            b.barrier();
            let rank = b.let_mut(
                "rank",
                (Expr::load("mark_bits", word.clone()) & ((u(1) << bit) - 1u32)).count_ones(),
            );
            b.loop_("earlier", 0u32, word, |b, earlier| {
                b.assign(
                    "rank",
                    rank.clone() + Expr::load("mark_bits", earlier).count_ones(),
                );
            });
            b.if_(mark.not_equals(0u32), |b| {
                let base = Expr::load("block_offsets", Expr::workgroup_id(Axis::X));
                b.store("piece_starts", base + rank, i);
            });
        })
        .build()
}
