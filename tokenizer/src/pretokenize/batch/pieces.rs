//! What every split program shares around its rule: the global buffers
//! declared from the step's binding list (so the step description and the
//! program cannot disagree), and the end that turns each thread's marks into
//! stored piece starts.

use vyre_cuda::ir::{Access, BlockBuilder, BufferCount, Expr, ProgramBuilder, ReduceOp, ScanKind};

use super::ir::{as_u32, local};
use super::lookback::{self, Combine, Direction, LookBack, COUNTER_WORDS};
use super::window::Layout;
use super::SplitBuffer;

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

/// Emits the end of a split program: `marks` (one `bool` per byte the thread
/// owns, in order) counted, the workgroup's exclusive scan of the counts, a
/// look-back over the piece counts' status words (from index `region`) for the
/// block's first piece index, [`lookback::finish`] over `regions` status
/// regions, every piece start stored at its index, and the piece count written
/// by the last block.
pub(super) fn store(
    b: &mut BlockBuilder,
    block: Block<'_>,
    marks: Vec<Expr>,
    region: Expr,
    regions: u32,
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
    lookback::finish(b, block.workgroup_size, regions);
    let slot = b.let_mut("piece_slot", before.clone() + rank);
    for (byte, mark) in marks.into_iter().enumerate() {
        let position = block.start.clone() + local() * block.bytes_per_thread + byte as u32;
        b.if_(mark, |b| {
            b.store("piece_starts", slot.clone(), position);
            b.assign("piece_slot", slot.clone() + 1u32);
        });
    }
    let last = (block.index.clone() + 1u32).equals(block.count.clone());
    b.if_(last.and(local().equals(0u32)), |b| {
        b.store("piece_count", 0u32, before + total);
    });
}
