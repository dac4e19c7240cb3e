//! GPT-2's split of a batch in one dispatch: the window, GPT-2's rule per byte
//! (the [parent module's](crate::pretokenize) rule, which reads a bounded
//! window: at most seven bytes back and four ahead), a count per thread, a
//! workgroup scan and a look-back for the block's first piece index, and every
//! piece start stored where it belongs.

use vyre_cuda::ir::{BlockBuilder, Expr, Program};

use super::code::{self, first_character, kind, outside, starts_document};
use super::ir::{in_set, local};
use super::lookback;
use super::pieces;
use super::window::{self, Layout, HALO};
use super::SplitBuild;
use super::{SplitBuffer, GPT2_BINDINGS};
use crate::pretokenize::unicode::{Kind, KindSet};
use crate::pretokenize::Geometry;

fn ascii(value: &Expr) -> Expr {
    (value.clone() >> code::ASCII_SHIFT) & 0xFFu32
}

/// GPT-2's class number of a kind: letter 1, number 2, white space 3, other 0.
fn class(value: &Expr) -> Expr {
    let kind = kind(value);
    in_set(&kind, KindSet::LETTER).select(
        1u32,
        in_set(&kind, KindSet::NUMBER)
            .select(2u32, in_set(&kind, KindSet::WHITE_SPACE).select(3u32, 0u32)),
    )
}

fn one_of(value: &Expr, bytes: &[u8]) -> Expr {
    bytes
        .iter()
        .map(|&byte| value.clone().equals(u32::from(byte)))
        .reduce(|either, or| either.or(or))
        .unwrap_or(Expr::bool(false))
}

/// The split program (see the module docs); with `cuts`, it also cuts between
/// bytes no token joins ([`pieces::with_cuts`], the joined-pairs table at that
/// word of the resident tables).
pub(super) fn program(geometry: Geometry, cuts: Option<u32>, build: SplitBuild) -> Program {
    let layout = Layout::new(geometry);
    let workgroup_size = layout.workgroup_size;
    let per_thread = layout.bytes_per_thread;
    let builder = Program::builder([workgroup_size, 1, 1]).entry_op_id("pretokenize.batch.gpt2");
    let builder = pieces::declare(
        builder,
        GPT2_BINDINGS,
        &[SplitBuffer::PieceStarts, SplitBuffer::PieceCount],
    );
    window::declare(builder, layout, GPT2_BINDINGS.len() as u32)
        .body(|b| {
            let block = lookback::position(b, build);
            let blocks = b.let_("blocks", Expr::workgroup_count(vyre_cuda::ir::Axis::X));
            let block_start = b.let_("block_start", block.clone() * layout.block_bytes);
            let text_len = window::text_length(b, "text");
            window::emit(b, layout, &block_start, &text_len, true);
            let first_slot = b.let_("first_slot", local() * per_thread + HALO);
            // codes[d + 7] = window code at distance d from the thread's first byte.
            let codes: Vec<Expr> = (-7i32..per_thread as i32 + 4)
                .map(|distance| {
                    let slot = if distance < 0 {
                        first_slot.clone() - distance.unsigned_abs()
                    } else {
                        first_slot.clone() + distance as u32
                    };
                    b.let_(format!("c{}", distance + 7), Expr::load("window", slot))
                })
                .collect();
            let mut marks = Vec::with_capacity(per_thread as usize);
            for byte in 0..per_thread as i32 {
                let at = |distance: i32| &codes[(byte + distance + 7) as usize];
                marks.push(rule(b, byte, &at));
            }
            let block = pieces::Block::new(&block, &blocks, &block_start, layout);
            if let Some(table_word) = cuts {
                marks = pieces::with_cuts(b, &block, marks, &text_len, table_word);
            }
            let region = match build {
                SplitBuild::Dispatched => Expr::u32(0),
                SplitBuild::Fused => lookback::second_set(),
            };
            pieces::store(b, block, marks, region, 1, build);
        })
        .build()
}

/// Emits GPT-2's rule for the thread's byte `byte`, whose code at distance `d`
/// is `at(d)` (`d` in -7..=4); returns the `bool` "a piece starts here".
fn rule<'a>(b: &mut BlockBuilder, byte: i32, at: &dyn Fn(i32) -> &'a Expr) -> Expr {
    let name = |what: &str| format!("b{byte}_{what}");
    let outside_code = Expr::u32(code::OUTSIDE);
    let previous_of = |b: &mut BlockBuilder, distance: i32, label: &str| -> Expr {
        let nearest = first_character([
            at(distance - 1),
            at(distance - 2),
            at(distance - 3),
            at(distance - 4),
        ]);
        b.let_(
            name(label),
            starts_document(at(distance)).select(outside_code.clone(), nearest),
        )
    };
    // A contraction may start at an apostrophe that is a match start: after a
    // letter, a number, white space other than U+0020, or nothing. Its letters
    // must be in the apostrophe's document.
    let contraction_at = |b: &mut BlockBuilder, distance: i32| -> Expr {
        let previous = previous_of(b, distance, &format!("contraction_previous{}", -distance));
        let previous_kind = kind(&previous);
        let allowed = outside(&previous)
            .or(in_set(&previous_kind, KindSet::LETTER))
            .or(in_set(&previous_kind, KindSet::NUMBER))
            .or(in_set(&previous_kind, KindSet::WHITE_SPACE)
                .and(previous_kind.clone().not_equals(Kind::Space as u32)));
        let second = b.let_(
            name(&format!("contraction_second{}", -distance)),
            starts_document(at(distance + 1)).select(0u32, ascii(at(distance + 1))),
        );
        let third = b.let_(
            name(&format!("contraction_third{}", -distance)),
            starts_document(at(distance + 1))
                .or(starts_document(at(distance + 2)))
                .select(0u32, ascii(at(distance + 2))),
        );
        let two = one_of(&second, b"stmd");
        let three = one_of(&second, b"rv")
            .and(third.clone().equals(u32::from(b'e')))
            .or(second
                .equals(u32::from(b'l'))
                .and(third.equals(u32::from(b'l'))));
        b.let_(
            name(&format!("contraction_back{}", -distance)),
            kind(at(distance))
                .equals(Kind::Apostrophe as u32)
                .and(allowed)
                .select(two.select(2u32, three.select(3u32, 0u32)), 0u32),
        )
    };
    let back1 = contraction_at(b, -1);
    let back2 = contraction_at(b, -2);
    let back3 = contraction_at(b, -3);
    let own = at(0).clone();
    let previous = previous_of(b, 0, "previous");
    let next = b.let_(name("next"), first_character([at(1), at(2), at(3), at(4)]));
    let inside_contraction = back1.greater_equal(2u32).or(back2.clone().equals(3u32));
    let contraction_ends = back2.equals(2u32).or(back3.equals(3u32));
    let previous_kind = kind(&previous);
    let previous_space = b.let_(
        name("previous_space"),
        in_set(&previous_kind, KindSet::WHITE_SPACE),
    );
    let own_space = b.let_(name("own_space"), in_set(&kind(&own), KindSet::WHITE_SPACE));
    // White space after white space starts a piece only as the last of its run
    // before a character that is not white space (`\s+(?!\S)`); anything else
    // after U+0020 joins it (` ?`); otherwise a piece starts where the class
    // changes.
    let whitespace_rule = previous_space
        .clone()
        .logical_not()
        .or(starts_document(&next)
            .logical_not()
            .and(in_set(&kind(&next), KindSet::WHITE_SPACE).logical_not()));
    let other_rule = previous_space
        .clone()
        .and(previous_kind.not_equals(Kind::Space as u32))
        .or(previous_space
            .logical_not()
            .and(class(&previous).not_equals(class(&own))));
    let class_rule = own_space
        .clone()
        .and(whitespace_rule)
        .or(own_space.logical_not().and(other_rule));
    b.let_(
        name("starts_piece"),
        kind(&own).less_than(Kind::End as u32).and(
            outside(&previous).or(inside_contraction
                .logical_not()
                .and(contraction_ends.or(class_rule))),
        ),
    )
}
