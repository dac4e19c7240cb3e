//! What every split program shares around its rule: the global buffers
//! declared from the step's binding list (so the step description and the
//! program cannot disagree), the cuts between bytes no token joins (an
//! encoder's split), and the end that turns each thread's marks into stored
//! piece starts.

use vyre_cuda::ir::{Access, BlockBuilder, BufferCount, Expr, ProgramBuilder, ReduceOp, ScanKind};

use super::ir::{as_u32, load_where, local};
use super::lookback::{self, Combine, Direction, LookBack, COUNTER_WORDS};
use super::window::Layout;
use super::SplitBuffer;
use super::SplitBuild;

/// Declares one global buffer per entry of `bindings`, in that order: the
/// scratch buffers and those in `written` read-write, the rest read-only.
pub(super) fn declare(
    mut builder: ProgramBuilder,
    bindings: &[SplitBuffer],
    written: &[SplitBuffer],
) -> ProgramBuilder {
    for (binding, &buffer) in bindings.iter().enumerate() {
        let scratch = matches!(buffer, SplitBuffer::Statuses | SplitBuffer::Counters);
        let access = if scratch || written.contains(&buffer) {
            Access::ReadWrite
        } else {
            Access::ReadOnly
        };
        let count = match buffer {
            SplitBuffer::Counters => BufferCount::Static(COUNTER_WORDS),
            SplitBuffer::PieceCount => BufferCount::Static(1),
            _ => BufferCount::Runtime,
        };
        builder = builder.buffer(
            buffer.name(),
            binding as u32,
            access,
            buffer.element(),
            count,
        );
    }
    builder
}

/// The block a program's look-backs run in, and where the piece counts' status
/// words start.
pub(super) struct Block<'a> {
    /// This block's index (uniform).
    pub index: &'a Expr,
    /// Number of blocks (uniform).
    pub count: &'a Expr,
    /// Its first byte (uniform).
    pub start: &'a Expr,
    /// Threads per workgroup.
    pub workgroup_size: u32,
    /// Bytes per thread (thread `t` owns the bytes `t·K .. t·K + K` of the block).
    pub bytes_per_thread: u32,
}

impl<'a> Block<'a> {
    /// The block `index` of `count`, starting at byte `start`, of `layout`'s shape.
    pub(super) fn new(index: &'a Expr, count: &'a Expr, start: &'a Expr, layout: Layout) -> Self {
        Block {
            index,
            count,
            start,
            workgroup_size: layout.workgroup_size,
            bytes_per_thread: layout.bytes_per_thread,
        }
    }
}

/// `marks` (one `bool` per byte the thread owns, in order) with a piece also
/// starting at every byte of the text whose byte before it is one that no
/// token holds right before it: bit `before << 8 | byte` of the joined-pairs
/// table at word `table_word` of the resident tables is clear (see
/// [`SplitPrograms::build_cutting_unjoined`](super::SplitPrograms::build_cutting_unjoined)
/// for why the ids stay exact). A document's first byte is a piece start
/// already, so the byte before it, in another document, only ever adds a
/// start that is there; bytes past `text_len` stay unmarked.
pub(super) fn with_cuts(
    b: &mut BlockBuilder,
    block: &Block<'_>,
    marks: Vec<Expr>,
    text_len: &Expr,
    table_word: u32,
) -> Vec<Expr> {
    let first = b.let_(
        "cut_first",
        block.start.clone() + local() * block.bytes_per_thread,
    );
    // bytes[0] is the byte before the thread's first (0 before the text: the
    // position wraps past the text's length), bytes[k + 1] its byte k; 0 past
    // the text. Every load first, then the lookups.
    let bytes: Vec<Expr> = (0..=block.bytes_per_thread)
        .map(|index| {
            let position = b.let_(format!("cut_position{index}"), first.clone() + index - 1u32);
            let inside = position.clone().less_than(text_len.clone());
            load_where(b, &format!("cut_byte{index}"), "text", position, inside)
        })
        .collect();
    marks
        .into_iter()
        .enumerate()
        .map(|(byte, mark)| {
            let pair = b.let_(
                format!("cut_pair{byte}"),
                (bytes[byte].clone() << 8u32) | bytes[byte + 1].clone(),
            );
            let word = Expr::load(
                SplitBuffer::KindTable.name(),
                (pair.clone() >> 5u32) + table_word,
            );
            let joined = ((word >> (pair & 31u32)) & 1u32).equals(1u32);
            let inside = (first.clone() + byte as u32).less_than(text_len.clone());
            b.let_(
                format!("cut_mark{byte}"),
                mark.or(inside.and(joined.logical_not())),
            )
        })
        .collect()
}

/// Emits the end of a split program: `marks` (one `bool` per byte the thread
/// owns, in order) counted, the workgroup's exclusive scan of the counts, a
/// look-back over the piece counts' status words (from index `region`) for the
/// block's first piece index, [`lookback::finish`] over `regions` status
/// regions, every piece start stored at its index (through the `window`
/// buffer of workgroup memory, which must hold a word per byte of the block
/// and is free by then), and the piece count written by the last block.
pub(super) fn store(
    b: &mut BlockBuilder,
    block: Block<'_>,
    marks: Vec<Expr>,
    region: Expr,
    regions: u32,
    build: SplitBuild,
) {
    let count = marks
        .iter()
        .map(|mark| as_u32(mark.clone()))
        .reduce(|a, b| a + b)
        .unwrap_or(Expr::u32(0));
    let count = b.let_("count", count);
    let rank = b.workgroup_scan("rank", ReduceOp::Sum, ScanKind::Exclusive, count.clone());
    let total = b.workgroup_reduce("block_count", ReduceOp::Sum, count);
    let channels = [(Combine::Sum, total.clone())];
    let pieces = LookBack {
        prefix: "pieces",
        workgroup_size: block.workgroup_size,
        region,
        block: block.index.clone(),
        blocks: block.count.clone(),
        direction: Direction::Backward,
        channels: &channels,
    };
    let carried = pieces.carries(b).remove(0);
    let before = b.let_("pieces_before", carried);
    pieces.publish_inclusive(b, &[before.clone() + total.clone()]);
    // Done with the status words before the stores: the fences in `finish` then
    // wait for no piece start on its way to host-mapped memory.
    if build == SplitBuild::Dispatched {
        lookback::finish(b, block.workgroup_size, regions);
    }
    // The block's starts go to the window first (every thread read its codes
    // from it before the scans' barriers), then out to `piece_starts` in
    // order, consecutive threads on consecutive words: each thread storing its
    // own starts at its own slots wrote a warp's words a few at a time over
    // several lines, once per byte it owns. On the H200 (2026-12-04, cl100k,
    // 8 MiB eager, alternating in one call) `phases` of CJK, whose cuts make
    // about one piece start per two bytes, took 197–199 µs against 214; prose
    // and code 194–196 against 196–198.
    let slot = b.let_mut("piece_slot", rank);
    for (byte, mark) in marks.into_iter().enumerate() {
        let position = block.start.clone() + local() * block.bytes_per_thread + byte as u32;
        b.if_(mark, |b| {
            b.store("window", slot.clone(), position);
            b.assign("piece_slot", slot.clone() + 1u32);
        });
    }
    b.barrier();
    let rounds = b.let_(
        "piece_rounds",
        (total.clone() + (block.workgroup_size - 1)) / block.workgroup_size,
    );
    b.loop_("piece_round", 0u32, rounds, |b, round| {
        let at = b.let_("piece_at", round * block.workgroup_size + local());
        b.if_(at.clone().less_than(total.clone()), |b| {
            b.store(
                "piece_starts",
                before.clone() + at.clone(),
                Expr::load("window", at),
            );
        });
    });
    let last = (block.index.clone() + 1u32).equals(block.count.clone());
    b.if_(last.and(local().equals(0u32)), |b| {
        b.store("piece_count", 0u32, before + total);
    });
}
