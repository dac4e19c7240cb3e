//! Step 1 of cl100k's and o200k's split: the window, then the look-ahead facts
//! of every character, then one byte per text byte into `codes`, which step 2
//! ([`super::phases`]) reads instead of the text.
//!
//! Both facts are "the first character at or after this one that is not in a
//! set decides" (`break_ahead`: not white space other than a line break, and it
//! holds iff that character is a line break; `upper_to_end`: not Lu/Lt, and it
//! holds iff that character is no letter and no mark), and the end of the
//! document decides where no character does. So every character that decides
//! (or ends its document) gets the *event* `2·position + verdict`, every other
//! character none (the largest value), and a fact is the low bit of the
//! smallest event at or after a character: a suffix minimum, in the thread
//! (its bytes backwards), across the workgroup (the IR's minimum scan, threads
//! taking the block's chunks in reverse order) and across workgroups (a
//! look-back towards the end of the text: workgroups take their blocks from
//! the last one on, so the blocks a workgroup waits for started before it;
//! a block holding any event already holds the minimum of itself and every
//! block after it, and publishes it as final at once, so the walk of the block
//! before ends there without waiting for this one's). A 100 KiB run of spaces
//! costs what any 100 KiB costs.

use vyre_cuda::ir::{Expr, Program, ReduceOp, ScanKind};

use super::code::{self, first_character};
use super::ir::{as_u32, has_bit, in_set, local};
use super::lookback::{self, Combine, Direction, LookBack, INFINITY};
use super::pieces;
use super::window::{self, Layout, HALO};
use super::SplitBuild;
use super::{SplitBuffer, CLASSIFY_BINDINGS};
use crate::pretokenize::pattern::Pattern;
use crate::pretokenize::unicode::{Kind, KindSet};
use crate::pretokenize::Geometry;

/// A look-ahead fact: which characters decide it, and how.
#[derive(Clone, Copy, Debug)]
struct Fact {
    name: &'static str,
    /// Characters that do not decide (the scan runs over them).
    passes: KindSet,
    /// Characters that decide it true (among those that decide).
    holds: KindSet,
    /// Its value where the document ends first.
    at_end: bool,
    /// Its bit in the code byte.
    bit: u32,
}

const BREAK_AHEAD: Fact = Fact {
    name: "break_ahead",
    passes: KindSet::of(&[Kind::WhiteSpace, Kind::Space]),
    holds: KindSet::LINE_BREAK,
    at_end: false,
    bit: code::BREAK_AHEAD,
};

const UPPER_TO_END: Fact = Fact {
    name: "upper_to_end",
    passes: KindSet::UPPER_CASE,
    // Decided true by anything that is not a letter or mark (the complement of
    // WORD among the characters that decide).
    holds: KindSet::of(&[
        Kind::Other,
        Kind::Number,
        Kind::WhiteSpace,
        Kind::Apostrophe,
        Kind::Slash,
        Kind::Space,
        Kind::LineBreak,
    ]),
    at_end: true,
    bit: code::UPPER_TO_END,
};

/// The facts `pattern`'s machine reads.
fn facts(pattern: Pattern) -> &'static [Fact] {
    match pattern {
        Pattern::O200k => &[BREAK_AHEAD, UPPER_TO_END],
        _ => &[BREAK_AHEAD],
    }
}

/// The classify program of `pattern` (cl100k or o200k).
pub(super) fn program(pattern: Pattern, geometry: Geometry, build: SplitBuild) -> Program {
    let layout = Layout::new(geometry);
    let workgroup_size = layout.workgroup_size;
    let per_thread = layout.bytes_per_thread;
    let facts = facts(pattern);
    let builder = Program::builder([workgroup_size, 1, 1])
        .entry_op_id(format!("pretokenize.batch.{}_classify", pattern.name()));
    let builder = pieces::declare(builder, CLASSIFY_BINDINGS, &[SplitBuffer::Codes]);
    window::declare(builder, layout, CLASSIFY_BINDINGS.len() as u32)
        .body(|b| {
            let ticket = lookback::position(b, build);
            let blocks = b.let_("blocks", Expr::workgroup_count(vyre_cuda::ir::Axis::X));
            // The first workgroup to start takes the last block.
            let block = b.let_("block", blocks.clone() - 1u32 - ticket);
            let block_start = b.let_("block_start", block.clone() * layout.block_bytes);
            let text_len = window::text_length(b, "text");
            window::emit(b, layout, &block_start, &text_len, false);
            // Thread t takes chunk W - 1 - t, so thread order is reverse text
            // order and the IR's prefix scan is a suffix scan over chunks.
            let chunk = b.let_("chunk", Expr::u32(workgroup_size - 1) - local());
            let first_slot = b.let_("first_slot", chunk.clone() * per_thread + HALO);
            let first_position = b.let_("first_position", block_start.clone() + chunk * per_thread);
            let codes: Vec<Expr> = (0..per_thread + 4)
                .map(|distance| {
                    b.let_(
                        format!("c{distance}"),
                        Expr::load("window", first_slot.clone() + distance),
                    )
                })
                .collect();
            // events[f][j]: fact f's event at the thread's byte j.
            let mut events: Vec<Vec<Expr>> = vec![Vec::new(); facts.len()];
            let mut characters = Vec::new();
            for byte in 0..per_thread as usize {
                let own = &codes[byte];
                let kind = b.let_(format!("kind{byte}"), own.clone() & code::KIND_MASK);
                let character = b.let_(
                    format!("character{byte}"),
                    kind.clone().less_than(Kind::End as u32),
                );
                characters.push(character.clone());
                let next = first_character([
                    &codes[byte + 1],
                    &codes[byte + 2],
                    &codes[byte + 3],
                    &codes[byte + 4],
                ]);
                let last = b.let_(
                    format!("last_of_document{byte}"),
                    has_bit(&next, code::DOCUMENT_START),
                );
                let position = first_position.clone() + byte as u32;
                for (index, fact) in facts.iter().enumerate() {
                    let decides = in_set(&kind, fact.passes).logical_not();
                    let verdict = as_u32(in_set(&kind, fact.holds));
                    let event = (position.clone() << 1u32)
                        | decides.clone().select(verdict, u32::from(fact.at_end));
                    events[index].push(
                        b.let_(
                            format!("{}_event{byte}", fact.name),
                            character
                                .clone()
                                .and(decides.or(last.clone()))
                                .select(event, INFINITY),
                        ),
                    );
                }
            }
            // Suffix minima inside the thread, then over the later chunks of the
            // block, then over the later blocks.
            let mut suffixes: Vec<Vec<Expr>> = Vec::new();
            let mut channels = Vec::new();
            let mut later = Vec::new();
            for (index, fact) in facts.iter().enumerate() {
                let mut suffix = vec![Expr::u32(INFINITY); per_thread as usize];
                let mut running = Expr::u32(INFINITY);
                for byte in (0..per_thread as usize).rev() {
                    running = b.let_(
                        format!("{}_suffix{byte}", fact.name),
                        events[index][byte].clone().min(running),
                    );
                    suffix[byte] = running.clone();
                }
                let chunk_first = suffix[0].clone();
                later.push(b.workgroup_scan(
                    format!("{}_later", fact.name),
                    ReduceOp::Min,
                    ScanKind::Exclusive,
                    chunk_first.clone(),
                ));
                // The block's minimum only feeds the look-back, which a lone
                // workgroup (every short text's) leaves out: no reduction, and
                // its barriers, for it there.
                let block_minimum =
                    lookback::published(b, &format!("{}_block", fact.name), INFINITY, |b| {
                        b.workgroup_reduce(
                            format!("{}_block_reduced", fact.name),
                            ReduceOp::Min,
                            chunk_first,
                        )
                    });
                channels.push((Combine::FirstEvent, block_minimum));
                suffixes.push(suffix);
            }
            let ahead = LookBack {
                prefix: "facts",
                workgroup_size,
                region: Expr::u32(0),
                block: block.clone(),
                blocks,
                direction: Direction::Forward,
                channels: &channels,
            };
            let carries = ahead.carries(b);
            let inclusive: Vec<Expr> = carries
                .iter()
                .zip(&channels)
                .map(|(carry, (_, block))| carry.clone().min(block.clone()))
                .collect();
            ahead.publish_inclusive(b, &inclusive);
            if build == SplitBuild::Dispatched {
                lookback::finish(b, workgroup_size, 1);
            }
            for byte in 0..per_thread as usize {
                let mut value = codes[byte].clone() & (code::KIND_MASK | code::DOCUMENT_START);
                for (index, fact) in facts.iter().enumerate() {
                    let first_event = suffixes[index][byte]
                        .clone()
                        .min(later[index].clone())
                        .min(carries[index].clone());
                    value = value
                        | characters[byte]
                            .clone()
                            .and((first_event & 1u32).equals(1u32))
                            .select(fact.bit, 0u32);
                }
                let position = b.let_(
                    format!("position{byte}"),
                    first_position.clone() + byte as u32,
                );
                b.if_(position.clone().less_than(text_len.clone()), |b| {
                    b.store("codes", position, value);
                });
            }
        })
        .build()
}
