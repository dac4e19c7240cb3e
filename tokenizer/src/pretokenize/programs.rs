//! The pipeline's two programs, written with the IR builder, and the one
//! description of its steps ([`STEPS`]) that the reference run, the eager CUDA runs
//! and the graph recording all follow.
//!
//! Every global buffer is runtime-sized, so one compiled kernel serves every text
//! length; the grid carries the size. Intermediate buffers are `ReadWrite` rather
//! than `WriteOnly`: every element is written by the step that produces it, so the
//! backend's zeroing of write-only outputs would be wasted device work.
//!
//! No program relies on bounds-checked loads for correctness: every index is
//! guarded or clamped, so the programs mean the same with bounds checks off.
//!
//! # The split program
//!
//! Workgroup `g` of `W` threads owns the `S = W · K` bytes `g·S .. g·S + S`
//! (`K` = [`Geometry::bytes_per_thread`]; thread `t` takes bytes `t, t + W, ...`,
//! so every load and store of a warp is 32 consecutive bytes). First every
//! thread computes a *byte code* ([`code`]) for `K` positions of a shared window
//! that reaches [`HALO`] bytes past the owned range on each side (the first
//! `2·HALO` threads compute one more position), then a barrier, then each thread
//! decides for its `K` bytes from the codes at distances −7..=+4 whether a piece
//! starts there (the rule in the [module docs](super)), stores the marks and
//! takes part in a workgroup sum that gives the block's piece count. One dispatch replaces the
//! classify, mark and count dispatches of a naive pipeline: on the H200 every
//! eager dispatch costs one launch and one synchronize (8.5–9.8 µs measured), which is
//! most of an encode.
//!
//! The byte code of position `j` reads `text[j-3 ..= j+3]`: byte `j` is the first
//! byte of a character unless a valid UTF-8 sequence starting at `j-1`, `j-2` or
//! `j-3` covers it; a valid sequence at `j` decodes to its code point, an ASCII
//! byte to itself, anything else to U+FFFD; the class comes from the
//! [class table](super::unicode) (two loads).

use super::unicode::CharClass;
use super::utf8_ir;
use super::{Geometry, PretokenizeError};
use vyre_cuda::ir::{
    Access, AtomicOp, Axis, BlockBuilder, BufferCount, ElemType, Expr, Program, ReduceOp,
    ScalarType,
};

/// Bytes of the split program's shared window on each side of a workgroup's
/// bytes: the rule looks 7 bytes back and 4 ahead.
pub const HALO: u32 = 8;

/// The byte codes of the split program's window (`u32` in shared memory).
pub mod code {
    /// Set on the first byte of every character (valid or not).
    pub const CHARACTER_START: u32 = 1;
    /// The character's [`CharClass`](super::CharClass) sits in bits 1..=2.
    pub const CLASS_SHIFT: u32 = 1;
    /// The character's [`identity`](super::identity) sits in bits 3..=6.
    pub const IDENTITY_SHIFT: u32 = 3;
    /// A position outside the text (before byte 0 or at/after its end). A byte
    /// inside a character but not its first has code 0.
    pub const OUTSIDE: u32 = 0x80;
}

/// The ASCII characters the rule must tell apart (code bits 3..=6); 0 is any other.
pub mod identity {
    /// U+0020, the only space the pattern's ` ?` attaches.
    pub const SPACE: u32 = 1;
    /// `'`, which can begin a contraction.
    pub const APOSTROPHE: u32 = 2;
    /// `s`.
    pub const S: u32 = 3;
    /// `t`.
    pub const T: u32 = 4;
    /// `m`.
    pub const M: u32 = 5;
    /// `d`.
    pub const D: u32 = 6;
    /// `r`.
    pub const R: u32 = 7;
    /// `v`.
    pub const V: u32 = 8;
    /// `e`.
    pub const E: u32 = 9;
    /// `l`.
    pub const L: u32 = 10;
    /// Every identity with its byte.
    pub const ALL: [(u8, u32); 10] = [
        (b' ', SPACE),
        (b'\'', APOSTROPHE),
        (b's', S),
        (b't', T),
        (b'm', M),
        (b'd', D),
        (b'r', R),
        (b'v', V),
        (b'e', E),
        (b'l', L),
    ];
}

/// The pipeline's programs, in dispatch order.
#[derive(Clone, Debug)]
pub struct Programs {
    /// The workgroup shapes they were built for.
    pub geometry: Geometry,
    /// Step 1: `text` (u8), `class_table` (u32) → `marks` (u8, 1 where a piece
    /// starts), `block_counts` (u32, pieces per workgroup).
    pub split: Program,
    /// Step 2 (at most [`Geometry::compact_workgroups`] workgroups): `marks`,
    /// `block_counts` → `piece_starts` (at least as many elements as pieces) and
    /// `piece_count` (one element): the scan and the compaction in one program.
    pub compact: Program,
}

/// A device buffer of the pipeline, by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferRole {
    /// The text, `n` bytes, uploaded per encode.
    Text,
    /// The [class table](super::unicode), uploaded once per pipeline.
    ClassTable,
    /// One byte per text byte: 1 where a piece starts.
    Marks,
    /// Pieces per workgroup, `B` words.
    BlockCounts,
    /// Piece start offsets, room for `n` words. Host-mapped
    /// ([`BufferRole::host_mapped`]): the compaction stores them straight into host
    /// memory.
    PieceStarts,
    /// The number of pieces: one word.
    PieceCount,
}

impl BufferRole {
    /// Every role; `role as usize` indexes it.
    pub const ALL: [BufferRole; 6] = [
        BufferRole::Text,
        BufferRole::ClassTable,
        BufferRole::Marks,
        BufferRole::BlockCounts,
        BufferRole::PieceStarts,
        BufferRole::PieceCount,
    ];

    /// The buffer's name in the programs that bind it.
    pub const fn name(self) -> &'static str {
        match self {
            BufferRole::Text => "text",
            BufferRole::ClassTable => "class_table",
            BufferRole::Marks => "marks",
            BufferRole::BlockCounts => "block_counts",
            BufferRole::PieceStarts => "piece_starts",
            BufferRole::PieceCount => "piece_count",
        }
    }

    /// Whether the CUDA run keeps this buffer in host-mapped pinned memory
    /// ([`CudaBackend::host_mapped_buffer`](vyre_cuda::backend::CudaBackend::host_mapped_buffer))
    /// instead of device memory: only the piece starts, so the compaction's stores
    /// reach the host with the encode's synchronize and no copy, whatever the count
    /// (measured on the H200, 2026-12-01: a separate read of exactly the piece starts
    /// after the graph replay cost 14–30 µs for about 400 KB; a kernel writing
    /// 256 KiB into mapped memory costs no more than launch + synchronize plus
    /// about 6 µs). Exactly one role is: the pipeline keeps it in its one
    /// host-mapped buffer.
    pub const fn host_mapped(self) -> bool {
        matches!(self, BufferRole::PieceStarts)
    }

    /// The buffer's size in bytes for a text of `text_len` bytes split into
    /// `blocks` workgroups, with a class table of `table_bytes` bytes.
    pub fn bytes(self, text_len: usize, blocks: u32, table_bytes: usize) -> u64 {
        let n = text_len as u64;
        let blocks = blocks as u64;
        match self {
            BufferRole::Text | BufferRole::Marks => n,
            BufferRole::ClassTable => table_bytes as u64,
            BufferRole::BlockCounts => 4 * blocks,
            BufferRole::PieceStarts => 4 * n,
            BufferRole::PieceCount => 4,
        }
    }
}

/// How many workgroups a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// One workgroup per [`Geometry::workgroup_size`] bytes (`B`).
    PerByte,
    /// `ceil(B / per)` workgroups of `per = ceil(B / compact_workgroups)` blocks
    /// each ([`Geometry::compaction_workgroups`]): `B` up to
    /// [`Geometry::compact_workgroups`].
    Compaction,
}

/// What the eager CUDA run reads back right after a step. The piece starts are
/// never read back: they are in host-mapped memory
/// ([`BufferRole::host_mapped`]) once the last step's synchronize returns. The
/// graph run reads the count after the last step; the reference run reads both
/// buffers after the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepReadback {
    /// Nothing.
    Nothing,
    /// The piece count, [`BufferRole::PieceCount`] (4 bytes, which ride in the
    /// dispatch's own epilogue into mapped memory: no copy).
    PieceCount,
}

/// One step of the pipeline: which program, over which buffers (in binding
/// order), on which grid, and what the eager run reads back after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The step's name (the program's entry op id is `pretokenize.<name>`).
    pub name: &'static str,
    /// The buffers bound, one per global buffer of the program, in binding order.
    pub bindings: &'static [BufferRole],
    /// The grid it runs on.
    pub grid: Grid,
    /// What the eager run reads back after it.
    pub readback: StepReadback,
}

/// The pipeline, in dispatch order. After the last step the piece count is
/// [`BufferRole::PieceCount`] and the piece starts are the first `count` words of
/// [`BufferRole::PieceStarts`].
pub const STEPS: [Step; 2] = [
    Step {
        name: "split",
        bindings: &[
            BufferRole::Text,
            BufferRole::ClassTable,
            BufferRole::Marks,
            BufferRole::BlockCounts,
        ],
        grid: Grid::PerByte,
        readback: StepReadback::Nothing,
    },
    Step {
        name: "compact",
        bindings: &[
            BufferRole::Marks,
            BufferRole::BlockCounts,
            BufferRole::PieceStarts,
            BufferRole::PieceCount,
        ],
        grid: Grid::Compaction,
        readback: StepReadback::PieceCount,
    },
];

impl Programs {
    /// The steps in dispatch order, each with its program.
    pub fn steps(&self) -> [(&'static Step, &Program); 2] {
        [(&STEPS[0], &self.split), (&STEPS[1], &self.compact)]
    }
}

/// The programs with the default [`Geometry`] (256-thread workgroups, at most
/// 1024 compaction workgroups): what the example and the GPU tests run.
pub fn programs() -> Programs {
    build(Geometry::default()).unwrap_or_else(|_| unreachable!("the default geometry is valid"))
}

/// The programs for another geometry (small ones let CPU tests cross many
/// workgroup boundaries with short texts). Rejects a geometry the programs cannot
/// run with.
pub fn build(geometry: Geometry) -> Result<Programs, PretokenizeError> {
    geometry.check()?;
    Ok(Programs {
        geometry,
        split: split(geometry),
        compact: compact(geometry),
    })
}

fn u(value: u32) -> Expr {
    Expr::u32(value)
}

/// Emits the lets that compute the [`code`] of the text position `position`
/// (a wrapping `u32`: "negative" positions are outside the text) and returns it.
fn position_code(b: &mut BlockBuilder, prefix: &str, position: Expr) -> Expr {
    let name = |what: &str| format!("{prefix}_{what}");
    let text_len = Expr::length("text");
    let at = b.let_(name("position"), position);
    // text[position + offset], 0 outside the text (offset may be "negative":
    // wrapping arithmetic, and every wrapped index is past the text).
    let byte_at = |b: &mut BlockBuilder, offset: i32| -> Expr {
        let label = if offset < 0 {
            format!("back{}", -offset)
        } else {
            format!("ahead{offset}")
        };
        let index = b.let_(
            name(&format!("index_{label}")),
            if offset < 0 {
                at.clone() - offset.unsigned_abs()
            } else {
                at.clone() + offset as u32
            },
        );
        let inside = index.clone().less_than(text_len.clone());
        b.let_(
            name(&format!("byte_{label}")),
            inside
                .clone()
                .select(Expr::load("text", inside.select(index, 0u32)), 0u32),
        )
    };
    let b0 = byte_at(b, 0);
    // An ASCII byte is always a whole character (no sequence covers it): only a
    // byte 0x80..=0xFF needs the six bytes around it, so ASCII text skips that work.
    let code_point = b.let_mut(name("code_point"), b0.clone());
    let covered = b.let_mut(name("covered"), 0u32);
    b.if_(b0.clone().greater_equal(0x80u32), |b| {
        let mut bytes = Vec::with_capacity(7);
        for offset in -3i32..=3 {
            bytes.push(if offset == 0 {
                b0.clone()
            } else {
                byte_at(b, offset)
            });
        }
        let bytes: [&Expr; 7] = std::array::from_fn(|index| &bytes[index]);
        utf8_ir::decode_non_ascii(b, &name, bytes, &name("covered"), &name("code_point"));
    });
    let covered = covered.not_equals(0u32);
    let block = b.let_(
        name("table_block"),
        Expr::load(
            "class_table",
            code_point.clone() >> super::unicode::BLOCK_SHIFT,
        ),
    );
    let word = b.let_(
        name("table_word"),
        Expr::load(
            "class_table",
            block + ((code_point.clone() >> 4u32) & 15u32),
        ),
    );
    let class = b.let_(
        name("class"),
        (word >> ((code_point & 15u32) << 1u32)) & 3u32,
    );
    let mut ascii_identity = u(0);
    for (byte, id) in identity::ALL {
        ascii_identity = b0.clone().equals(byte as u32).select(id, ascii_identity);
    }
    let identity = b.let_(name("identity"), ascii_identity);
    b.let_(
        name("code"),
        at.less_than(text_len).select(
            covered.select(
                0u32,
                (class << code::CLASS_SHIFT)
                    | (identity << code::IDENTITY_SHIFT)
                    | code::CHARACTER_START,
            ),
            code::OUTSIDE,
        ),
    )
}

fn class_of_code(value: &Expr) -> Expr {
    (value.clone() >> code::CLASS_SHIFT) & 3u32
}

fn identity_of_code(value: &Expr) -> Expr {
    (value.clone() >> code::IDENTITY_SHIFT) & 15u32
}

fn is_class(value: &Expr, class: CharClass) -> Expr {
    class_of_code(value).equals(class as u32)
}

fn is_outside(value: &Expr) -> Expr {
    value.clone().equals(code::OUTSIDE)
}

/// The first non-zero code of four (the nearest character start, or OUTSIDE).
fn first_character(codes: [&Expr; 4]) -> Expr {
    let [a, b, c, d] = codes;
    a.clone().not_equals(0u32).select(
        a.clone(),
        b.clone().not_equals(0u32).select(
            b.clone(),
            c.clone().not_equals(0u32).select(c.clone(), d.clone()),
        ),
    )
}

/// Step 1: byte codes into the shared window, then `marks[i]` (1 where a piece
/// starts) and `block_counts[g]` (see the module docs). `geometry` must pass
/// [`Geometry::check`] (at least `2 · HALO` threads, 1 to 8 bytes per thread);
/// [`build`] checks it.
pub fn split(geometry: Geometry) -> Program {
    let halo = HALO;
    let workgroup_size = geometry.workgroup_size;
    let per_thread = geometry.bytes_per_thread;
    let block_bytes = geometry.block_bytes();
    Program::builder([workgroup_size, 1, 1])
        .entry_op_id("pretokenize.split")
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "class_table",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "marks",
            2,
            Access::ReadWrite,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "block_counts",
            3,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "window",
            4,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(block_bytes + 2 * halo),
        )
        .body(|b| {
            let local = b.let_("local", Expr::local_id(Axis::X));
            let block_start = b.let_("block_start", Expr::workgroup_id(Axis::X) * block_bytes);
            // Window slot s holds the code of text position g·S - HALO + s (S = the
            // block's bytes). Thread t fills slots t, t + W, ... (unrolled: the text
            // and table loads of its positions are independent and overlap), the
            // first 2·HALO threads also the far side.
            for part in 0..per_thread {
                let slot = local.clone() + part * workgroup_size;
                let code = position_code(
                    b,
                    &format!("near{part}"),
                    block_start.clone() + slot.clone() - halo,
                );
                b.store("window", slot, code);
            }
            b.if_(local.clone().less_than(2 * halo), |b| {
                let slot = local.clone() + block_bytes;
                let code = position_code(b, "far", block_start.clone() + slot.clone() - halo);
                b.store("window", slot, code);
            });
            b.barrier();
            let count = b.let_mut("count", 0u32);
            // Thread t decides bytes t, t + W, ... of the block.
            b.loop_("part", 0u32, per_thread, |b, part| {
                let offset = b.let_("offset", local.clone() + part * workgroup_size);
                let i = b.let_("i", block_start.clone() + offset.clone());
                // codes[k + 7] is the code at distance k from byte i, k = -7..=4.
                let codes: Vec<Expr> = (0..12u32)
                    .map(|slot| {
                        let name = if slot < 7 {
                            format!("code_back{}", 7 - slot)
                        } else {
                            format!("code_ahead{}", slot - 7)
                        };
                        b.let_(
                            name,
                            Expr::load("window", offset.clone() + (halo - 7 + slot)),
                        )
                    })
                    .collect();
                let at = |k: i32| &codes[(k + 7) as usize];
                let previous_of =
                    |k: i32| first_character([at(k - 1), at(k - 2), at(k - 3), at(k - 4)]);
                // A contraction may start at an apostrophe that is a match start: one
                // after a letter, a number, white space other than U+0020, or nothing.
                let contraction_at = |b: &mut BlockBuilder, k: i32| -> Expr {
                    let previous = b.let_(format!("contraction_previous{}", -k), previous_of(k));
                    let allowed = is_outside(&previous)
                        .or(is_class(&previous, CharClass::Letter))
                        .or(is_class(&previous, CharClass::Number))
                        .or(is_class(&previous, CharClass::Whitespace)
                            .and(identity_of_code(&previous).not_equals(identity::SPACE)));
                    let second = identity_of_code(at(k + 1));
                    let third = identity_of_code(at(k + 2));
                    let two = second
                        .clone()
                        .equals(identity::S)
                        .or(second.clone().equals(identity::T))
                        .or(second.clone().equals(identity::M))
                        .or(second.clone().equals(identity::D));
                    let three = second
                        .clone()
                        .equals(identity::R)
                        .or(second.clone().equals(identity::V))
                        .and(third.clone().equals(identity::E))
                        .or(second.equals(identity::L).and(third.equals(identity::L)));
                    b.let_(
                        format!("contraction_back{}", -k),
                        identity_of_code(at(k))
                            .equals(identity::APOSTROPHE)
                            .and(allowed)
                            .select(two.select(2u32, three.select(3u32, 0u32)), 0u32),
                    )
                };
                let back1 = contraction_at(b, -1);
                let back2 = contraction_at(b, -2);
                let back3 = contraction_at(b, -3);
                let own = at(0).clone();
                let previous = b.let_("previous", previous_of(0));
                let next = b.let_("next", first_character([at(1), at(2), at(3), at(4)]));
                let inside_contraction = b.let_(
                    "inside_contraction",
                    back1.greater_equal(2u32).or(back2.clone().equals(3u32)),
                );
                let contraction_ends = b.let_(
                    "contraction_ends",
                    back2.equals(2u32).or(back3.equals(3u32)),
                );
                let previous_space = is_class(&previous, CharClass::Whitespace);
                let own_space = b.let_("own_whitespace", is_class(&own, CharClass::Whitespace));
                // White space after white space starts a piece only as the last of its
                // run before a non-space (`\s+(?!\S)` leaves it to the next piece);
                // anything else after U+0020 joins it (` ?`); otherwise a piece starts
                // where the class changes.
                let whitespace_rule = previous_space.clone().logical_not().or(is_outside(&next)
                    .logical_not()
                    .and(is_class(&next, CharClass::Whitespace).logical_not()));
                let other_rule = previous_space
                    .clone()
                    .and(identity_of_code(&previous).not_equals(identity::SPACE))
                    .or(previous_space
                        .logical_not()
                        .and(class_of_code(&previous).not_equals(class_of_code(&own))));
                let class_rule = b.let_(
                    "class_rule",
                    own_space
                        .clone()
                        .and(whitespace_rule)
                        .or(own_space.logical_not().and(other_rule)),
                );
                let starts_piece = b.let_(
                    "starts_piece",
                    (own.clone() & code::CHARACTER_START)
                        .equals(code::CHARACTER_START)
                        .and(
                            is_outside(&previous).or(inside_contraction
                                .logical_not()
                                .and(contraction_ends.or(class_rule))),
                        ),
                );
                b.if_(i.clone().less_than(Expr::length("marks")), |b| {
                    let mark = b.let_("mark", starts_piece.cast(ScalarType::U32));
                    b.store("marks", i.clone(), mark.clone());
                    b.assign("count", count.clone() + mark);
                });
            });
            let total = b.workgroup_reduce("block_count", ReduceOp::Sum, count);
            b.if_(local.equals(0u32), |b| {
                b.store("block_counts", Expr::workgroup_id(Axis::X), total);
            });
        })
        .build()
}

/// Step 2: the scan and the compaction in one program. Workgroup `h` of `G`
/// (`G` = [`Grid::Compaction`]) owns `per = ceil(B / G)` consecutive blocks of
/// the split, starting at block `first = h · per`:
///
/// 1. its piece offset is the sum of `block_counts[0 .. first)`: every thread sums
///    a strided part of them, four independent loads per round, and a workgroup
///    sum adds the threads' parts (with the default geometry and texts up to
///    1 MiB, `per` = 1 and each thread loads at most 4 counts);
/// 2. then block by block: the block's marks are gathered into a shared bit mask
///    (one atomic OR per mark; thread `t` owns bytes `t, t + W, ...` as in the
///    split), the first threads turn the mask into per-word prefix counts, every
///    marked byte writes its offset to `piece_starts[offset + rank]` (`rank` = the
///    marks before it in the block: its word's prefix plus the population count of
///    the earlier bits), and the offset grows by the block's count;
/// 3. the workgroup that owns the last block writes the total into
///    `piece_count[0]`.
///
/// One dispatch instead of a single-workgroup scan dispatch followed by the
/// compaction: on the eager path that is one synchronize less per encode
/// (8.5–9.8 µs each, measured on the H200), in a graph one kernel node and the scan's serial
/// rounds less. The prefix costs `first / W` loads per thread, so the grid is
/// capped ([`Geometry::compact_workgroups`]) to keep the sum of all prefixes
/// linear in the text (at most `G · B / 2` loads in all).
pub fn compact(geometry: Geometry) -> Program {
    const UNROLL: u32 = 4;
    let workgroup_size = geometry.workgroup_size;
    let per_thread = geometry.bytes_per_thread;
    let block_bytes = geometry.block_bytes();
    let words = block_bytes.div_ceil(32);
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
            "block_counts",
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
            "piece_count",
            3,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "mark_bits",
            4,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(words),
        )
        .buffer(
            "word_prefix",
            5,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(words),
        )
        .body(|b| {
            let local = b.let_("local", Expr::local_id(Axis::X));
            let blocks = b.let_("blocks", Expr::length("block_counts"));
            let groups = b.let_("groups", Expr::workgroup_count(Axis::X));
            let per_group = b.let_(
                "per_group",
                (blocks.clone() + (groups.clone() - 1u32)) / groups,
            );
            let first = b.let_("first", Expr::workgroup_id(Axis::X) * per_group.clone());
            // 1. The offset of block `first`: the counts before it.
            let part = b.let_mut("part", 0u32);
            let stride = workgroup_size * UNROLL;
            b.loop_(
                "prefix_round",
                0u32,
                (first.clone() + (stride - 1)) / stride,
                |b, round| {
                    let base = b.let_("prefix_base", round * stride + local.clone());
                    let mut sum = part.clone();
                    for lane in 0..UNROLL {
                        let index = b.let_(
                            format!("prefix_index{lane}"),
                            base.clone() + lane * workgroup_size,
                        );
                        let inside = index.clone().less_than(first.clone());
                        sum = sum
                            + inside.clone().select(
                                Expr::load("block_counts", inside.select(index, 0u32)),
                                0u32,
                            );
                    }
                    b.assign("part", sum);
                },
            );
            let before = b.workgroup_reduce("before", ReduceOp::Sum, part);
            let running = b.let_mut("running", before);
            // 2. The owned blocks, one after another.
            b.loop_("owned", 0u32, per_group.clone(), |b, owned| {
                let block = b.let_("block", first.clone() + owned);
                b.if_(block.clone().less_than(blocks.clone()), |b| {
                    for word in (0..words).step_by(workgroup_size as usize) {
                        b.if_((local.clone() + word).less_than(words), |b| {
                            b.store("mark_bits", local.clone() + word, 0u32);
                        });
                    }
                    b.barrier();
                    let block_start = b.let_("block_start", block.clone() * block_bytes);
                    let mut marks = Vec::with_capacity(per_thread as usize);
                    for part in 0..per_thread {
                        let offset = local.clone() + part * workgroup_size;
                        let i = b.let_(format!("i{part}"), block_start.clone() + offset.clone());
                        let mark = b.let_mut(format!("mark{part}"), 0u32);
                        b.if_(i.clone().less_than(Expr::length("marks")), |b| {
                            b.assign(format!("mark{part}"), Expr::load("marks", i.clone()));
                        });
                        b.if_(mark.clone().not_equals(0u32), |b| {
                            b.atomic(
                                AtomicOp::Or,
                                "mark_bits",
                                offset.clone() / 32u32,
                                u(1) << (offset.clone() % 32u32),
                            );
                        });
                        marks.push((offset, i, mark));
                    }
                    b.barrier();
                    for word in (0..words).step_by(workgroup_size as usize) {
                        let own = local.clone() + word;
                        b.if_(own.clone().less_than(words), |b| {
                            let prefix = b.let_mut("prefix", 0u32);
                            b.loop_("earlier", 0u32, own.clone(), |b, earlier| {
                                b.assign(
                                    "prefix",
                                    prefix.clone() + Expr::load("mark_bits", earlier).count_ones(),
                                );
                            });
                            b.store("word_prefix", own.clone(), prefix);
                        });
                    }
                    b.barrier();
                    for (offset, i, mark) in marks {
                        b.if_(mark.not_equals(0u32), |b| {
                            let word = offset.clone() / 32u32;
                            let earlier_bits = (u(1) << (offset % 32u32)) - 1u32;
                            let rank = Expr::load("word_prefix", word.clone())
                                + (Expr::load("mark_bits", word) & earlier_bits).count_ones();
                            b.store("piece_starts", running.clone() + rank, i);
                        });
                    }
                    b.assign(
                        "running",
                        running.clone() + Expr::load("block_counts", block.clone()),
                    );
                    // Every thread has read the mask before the next block clears it.
                    b.barrier();
                });
            });
            // 3. The total, from the workgroup that owns the last block.
            let owns_last = first
                .clone()
                .less_than(blocks.clone())
                .and((first + per_group).greater_equal(blocks));
            b.if_(owns_last.and(local.equals(0u32)), |b| {
                b.store("piece_count", 0u32, running);
            });
        })
        .build()
}
