//! The first stage of every batch program: a block's window of byte codes in
//! shared memory. Which bytes start a document (from `document_ends`), each
//! byte decoded within its document, and each character's [`Kind`] from the
//! resident kind table.
//!
//! Block `g` owns the bytes `g·S .. g·S + S` (`S` = [`Layout::block_bytes`]);
//! its window reaches [`HALO`] bytes further on each side, so a thread can
//! read the characters around any of its bytes. Two shared arrays:
//!
//! - `document_starts[f]` = 1 where position `g·S − HALO − 3 + f` starts a
//!   document (position 0 and every document end inside the text). The document
//!   ends that fall in the window are found once per block: a search of
//!   `document_ends` in which every thread samples one end per round (the range
//!   shrinks `W`-fold a round, so a batch of a million documents takes four),
//!   then a binary search per position inside the few ends found. The rounds
//!   and the searches are bounded by the logarithm of the document count.
//! - `window[s]` = the [code] of position `g·S − HALO + s`: a byte decodes
//!   only with bytes of its own document (a character cut by a document end
//!   is invalid there, exactly as at the end of a text), so every document
//!   splits as it would alone.
//! - `lengths[l]` (bytes) = the length of the valid UTF-8 sequence starting at
//!   position `g·S − HALO − 3 + l` (0 for none, 1 for ASCII), from which a
//!   second pass marks the bytes inside a character. Why two passes: each
//!   non-ASCII byte once decoded the sequences starting at it and at the three
//!   bytes before it, four decodes of about 30 comparisons each; now it decodes
//!   its own and reads three lengths. That was about 47 % of `classify`'s SASS
//!   instructions for blocks of 1,024 threads × 8 bytes (2,392 of 5,080,
//!   ptxas for sm_90, 2026-12-03); with two passes `classify` has 3,608, GPT-2's
//!   `split` 4,512 against 6,000 (both at the 32 registers their two blocks
//!   per SM allow).
//!
//! The first pass loads every round's byte before any round's work. Each
//! round stores what it decodes, a store waits for the load it depends on,
//! and a load issued after a store went out one memory round trip later: the
//! rounds' loads had followed one another. A short text's kernel (one
//! workgroup, five rounds a thread) waits on exactly that chain. On an H100
//! (2026-12-07, the encode example, three alternating rounds each, cl100k)
//! `classify` took 3.7 µs of 1 KiB of prose and code against 3.9–4.0, 4.4
//! against 4.5 of CJK, and 5.6–5.9 / 6.8–6.9 / 5.6–5.8 µs of 256 KiB of
//! prose / CJK / code against 6.0–6.1 / 7.0–7.1 / 6.0–6.1.

use vyre_cuda::ir::{
    Access, BlockBuilder, BufferCount, ElemType, Expr, ProgramBuilder, ReduceOp, ScalarType,
};

use super::code;
use super::ir::{as_u32, load_where, local};
use crate::pretokenize::unicode::{Kind, BLOCK_SHIFT, KIND_BITS};
use crate::pretokenize::utf8_ir;
use crate::pretokenize::Geometry;

/// Bytes of a block's window on each side of the bytes it owns: a rule reads up
/// to two characters (eight bytes) back and ahead.
pub const HALO: u32 = 8;

/// Document-start flags kept beyond the window on each side: a decode reads
/// three bytes each way.
const MARGIN: u32 = 3;

/// The shapes of a block's shared arrays.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// Threads per workgroup (`W`).
    pub workgroup_size: u32,
    /// Bytes per thread (`K`).
    pub bytes_per_thread: u32,
    /// Bytes a block owns (`S = W·K`).
    pub block_bytes: u32,
    /// Code slots: `S + 2·HALO`.
    pub code_slots: u32,
    /// Document-start slots: `S + 2·(HALO + 3)`.
    pub flag_slots: u32,
    /// Sequence-length slots: `S + 2·HALO + 3`, from [`MARGIN`] bytes before
    /// the window (a byte's character may start three bytes before it).
    pub length_slots: u32,
}

impl Layout {
    pub(super) fn new(geometry: Geometry) -> Layout {
        let block_bytes = geometry.block_bytes();
        Layout {
            workgroup_size: geometry.workgroup_size,
            bytes_per_thread: geometry.bytes_per_thread,
            block_bytes,
            code_slots: block_bytes + 2 * HALO,
            flag_slots: block_bytes + 2 * (HALO + MARGIN),
            length_slots: block_bytes + 2 * HALO + MARGIN,
        }
    }

    /// Rounds of a loop in which each thread takes one slot of `slots`.
    pub(super) fn rounds(&self, slots: u32) -> u32 {
        slots.div_ceil(self.workgroup_size)
    }
}

/// Declares the shared arrays `document_starts`, `window` and `lengths`
/// (bindings `first_binding` and the next two).
pub(super) fn declare(
    builder: ProgramBuilder,
    layout: Layout,
    first_binding: u32,
) -> ProgramBuilder {
    builder
        .buffer(
            "document_starts",
            first_binding,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(layout.flag_slots),
        )
        .buffer(
            "window",
            first_binding + 1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(layout.code_slots),
        )
        // Bytes, not words: blocks of 2 KiB keep every split program within
        // the 48 KiB of static shared memory.
        .buffer(
            "lengths",
            first_binding + 2,
            Access::Workgroup,
            ElemType::U8,
            BufferCount::Static(layout.length_slots),
        )
}

/// Declares `text_len`: the bytes of the batch, the last document end (0
/// without documents) but never more than `buffer` holds. Positions from there
/// on are outside the text, whatever a larger buffer holds.
pub(super) fn text_length(b: &mut BlockBuilder, buffer: &str) -> Expr {
    let documents = b.let_("documents", Expr::length("document_ends"));
    let last_end = load_where(
        b,
        "last_end",
        "document_ends",
        documents.clone() - 1u32,
        documents.greater_than(0u32),
    );
    b.let_("text_len", Expr::length(buffer).min(last_end))
}

/// Emits the window of the block starting at byte `block_start` (uniform) of a
/// text of `text_len` bytes: document starts, a barrier, codes, a barrier. With
/// `ascii`, a code also carries its ASCII byte (GPT-2's contractions are
/// case-sensitive ASCII).
pub(super) fn emit(
    b: &mut BlockBuilder,
    layout: Layout,
    block_start: &Expr,
    text_len: &Expr,
    ascii: bool,
) {
    emit_document_starts(b, layout, block_start, text_len);
    b.barrier();
    emit_codes(b, layout, block_start, text_len, ascii);
    b.barrier();
}

/// `low + span · numerator / W` in 64-bit arithmetic (no overflow for any
/// `u32` span): the `numerator`-th of `W` evenly spaced samples of `span`.
fn sample(low: &Expr, span: &Expr, numerator: Expr, workgroup_size: u32) -> Expr {
    low.clone()
        + ((span.clone().cast(ScalarType::U64) * numerator.cast(ScalarType::U64))
            / Expr::u64(u64::from(workgroup_size)))
        .cast(ScalarType::U32)
}

fn emit_document_starts(b: &mut BlockBuilder, layout: Layout, block_start: &Expr, text_len: &Expr) {
    let reach = HALO + MARGIN;
    let workgroup_size = layout.workgroup_size;
    let documents = Expr::length("document_ends");
    // The document ends in [window_low, window_high): indices
    // [first_low, last_low) of `document_ends`, each found as the number of
    // ends below its bound. Every name assigned here is uniform.
    let window_low = b.let_(
        "window_low",
        block_start
            .clone()
            .greater_equal(reach)
            .select(block_start.clone() - reach, 0u32),
    );
    let window_high = b.let_(
        "window_high",
        block_start.clone() + (layout.block_bytes + reach),
    );
    let searches = [("first", window_low), ("last", window_high)];
    for (tag, _) in &searches {
        b.let_mut(format!("{tag}_low"), 0u32);
        b.let_mut(format!("{tag}_high"), documents.clone());
    }
    let open =
        |tag: &str| Expr::var(format!("{tag}_low")).less_than(Expr::var(format!("{tag}_high")));
    b.while_(open("first").or(open("last")), |b| {
        for (tag, bound) in &searches {
            let low = Expr::var(format!("{tag}_low"));
            let high = Expr::var(format!("{tag}_high"));
            let span = b.let_(format!("{tag}_span"), high.clone() - low.clone());
            let index = b.let_(
                format!("{tag}_sample"),
                sample(&low, &span, local(), workgroup_size),
            );
            let value = load_where(
                b,
                &format!("{tag}_sampled_end"),
                "document_ends",
                index,
                open(tag),
            );
            let below = open(tag).and(value.less_than(bound.clone()));
            let count = b.workgroup_reduce(format!("{tag}_below"), ReduceOp::Sum, as_u32(below));
            // Samples 0..count are below the bound, the rest are not: the
            // answer lies after sample count - 1 and at or before sample count.
            let after = sample(&low, &span, count.clone() - 1u32, workgroup_size) + 1u32;
            let until = count
                .clone()
                .less_than(workgroup_size)
                .select(sample(&low, &span, count.clone(), workgroup_size), high);
            let none = count.equals(0u32);
            let new_low = b.let_(
                format!("{tag}_new_low"),
                none.clone().select(low.clone(), after),
            );
            let new_high = b.let_(format!("{tag}_new_high"), none.select(low, until));
            b.assign(format!("{tag}_low"), new_low);
            b.assign(format!("{tag}_high"), new_high);
        }
    });
    let first = Expr::var("first_low");
    let last = Expr::var("last_low");
    for round in 0..layout.rounds(layout.flag_slots) {
        let slot = b.let_(
            format!("flag_slot{round}"),
            local() + round * workgroup_size,
        );
        b.if_(slot.clone().less_than(layout.flag_slots), |b| {
            let name = |what: &str| format!("flag{round}_{what}");
            let position = b.let_(name("position"), block_start.clone() - reach + slot.clone());
            // Binary search of the ends in the window for the first one at or
            // after this position.
            let low = b.let_mut(name("low"), first.clone());
            let high = b.let_mut(name("high"), last.clone());
            b.while_(low.clone().less_than(high.clone()), |b| {
                let middle = b.let_(name("middle"), (low.clone() + high.clone()) >> 1u32);
                let end = b.let_(name("end"), Expr::load("document_ends", middle.clone()));
                let before = end.less_than(position.clone());
                b.assign(
                    name("low"),
                    before.clone().select(middle.clone() + 1u32, low.clone()),
                );
                b.assign(name("high"), before.select(high.clone(), middle));
            });
            let found = load_where(
                b,
                &name("found"),
                "document_ends",
                low.clone(),
                low.clone().less_than(last.clone()),
            );
            let hit = low
                .less_than(last.clone())
                .and(found.equals(position.clone()));
            let starts = position
                .clone()
                .less_than(text_len.clone())
                .and(position.equals(0u32).or(hit));
            b.store("document_starts", slot.clone(), as_u32(starts));
        });
    }
}

fn emit_codes(
    b: &mut BlockBuilder,
    layout: Layout,
    block_start: &Expr,
    text_len: &Expr,
    ascii: bool,
) {
    let workgroup_size = layout.workgroup_size;
    // Pass 1, per position from MARGIN bytes before the window: the length of
    // the valid sequence starting there (`lengths`) and, inside the window,
    // its code as if no sequence before covered it.
    // Every round's first byte before any round's work (module docs).
    let rounds: Vec<(Expr, Expr, Expr, Expr)> = (0..layout.rounds(layout.length_slots))
        .map(|round| {
            let name = move |what: &str| format!("code{round}_{what}");
            let slot = b.let_(
                format!("length_slot{round}"),
                local() + round * workgroup_size,
            );
            // Length slot l is flag slot l: both start MARGIN bytes before the
            // window.
            let position = b.let_(
                name("position"),
                block_start.clone() - (HALO + MARGIN) + slot.clone(),
            );
            let inside = b.let_(
                name("inside"),
                slot.clone()
                    .less_than(layout.length_slots)
                    .and(position.clone().less_than(text_len.clone())),
            );
            let first = load_where(b, &name("byte"), "text", position.clone(), inside.clone());
            (slot, position, inside, first)
        })
        .collect();
    for (round, (slot, position, inside, first)) in rounds.into_iter().enumerate() {
        b.if_(slot.clone().less_than(layout.length_slots), |b| {
            let name = move |what: &str| format!("code{round}_{what}");
            let start_at = |distance: u32| {
                Expr::load("document_starts", slot.clone() + distance).not_equals(0u32)
            };
            let code_point = b.let_mut(name("code_point"), first.clone());
            let length = b.let_mut(name("length"), as_u32(inside.clone()));
            // ASCII is a whole character by itself: only other bytes need the
            // three bytes after them.
            b.if_(first.clone().greater_equal(0x80u32), |b| {
                let mut bytes = vec![first.clone()];
                // A byte belongs to this byte's sequence only when no document
                // starts between them.
                let mut same_document = Expr::bool(true);
                for distance in 1..=3u32 {
                    same_document = same_document.and(start_at(distance).logical_not());
                    let at = position.clone() + distance;
                    let allowed = at
                        .clone()
                        .less_than(text_len.clone())
                        .and(same_document.clone());
                    bytes.push(load_where(
                        b,
                        &name(&format!("byte_ahead{distance}")),
                        "text",
                        at,
                        allowed,
                    ));
                }
                let bytes: [&Expr; 4] = std::array::from_fn(|index| &bytes[index]);
                utf8_ir::decode_own(b, &name, bytes, &name("length"), &name("code_point"));
            });
            b.store("lengths", slot.clone(), length);
            b.if_(slot.clone().greater_equal(MARGIN), |b| {
                let kind = emit_kind(b, &name, &first, &code_point);
                let mut character = kind | start_at(0).select(code::DOCUMENT_START, 0u32);
                if ascii {
                    character = character
                        | first
                            .clone()
                            .less_than(0x80u32)
                            .select(first.clone() << code::ASCII_SHIFT, 0u32);
                }
                b.store(
                    "window",
                    slot.clone() - MARGIN,
                    inside.select(character, code::OUTSIDE),
                );
            });
        });
    }
    b.barrier();
    // Pass 2, per window position: a byte inside a valid sequence that starts
    // one to three bytes before it continues that character.
    for round in 0..layout.rounds(layout.code_slots) {
        let slot = b.let_(
            format!("cover_slot{round}"),
            local() + round * workgroup_size,
        );
        b.if_(slot.clone().less_than(layout.code_slots), |b| {
            // Code slot s is length slot s + MARGIN.
            let length_back =
                |distance: u32| Expr::load("lengths", slot.clone() + (MARGIN - distance));
            let covered = utf8_ir::covered_by([&length_back(1), &length_back(2), &length_back(3)]);
            b.if_(covered, |b| {
                b.store("window", slot.clone(), code::CONTINUATION);
            });
        });
    }
}

/// Emits the kind code of the character whose first byte is `first` and whose
/// code point is `code_point` (U+FFFD for an invalid byte): the kind table's
/// entry (two loads), or the kind the patterns name by its byte.
fn emit_kind(
    b: &mut BlockBuilder,
    name: &dyn Fn(&str) -> String,
    first: &Expr,
    code_point: &Expr,
) -> Expr {
    let table_block = b.let_(
        name("table_block"),
        Expr::load("kind_table", code_point.clone() >> BLOCK_SHIFT),
    );
    let per_word = 32 / KIND_BITS;
    let table_word = b.let_(
        name("table_word"),
        Expr::load(
            "kind_table",
            table_block
                + ((code_point.clone() >> per_word.trailing_zeros())
                    & ((1u32 << BLOCK_SHIFT) / per_word - 1)),
        ),
    );
    let stored = (table_word >> ((code_point.clone() & (per_word - 1)) * KIND_BITS))
        & ((1u32 << KIND_BITS) - 1);
    // The five characters the patterns name by their byte.
    let mut kind = stored;
    for (byte, named) in [
        (b'\'', Kind::Apostrophe),
        (b'/', Kind::Slash),
        (b' ', Kind::Space),
        (b'\r', Kind::LineBreak),
        (b'\n', Kind::LineBreak),
    ] {
        kind = first
            .clone()
            .equals(u32::from(byte))
            .select(named as u32, kind);
    }
    b.let_(name("kind"), kind)
}
