//! Step 2 of cl100k's and o200k's split: the state of every character by a
//! prefix scan of transition maps, then the piece starts, stored where they
//! belong.
//!
//! Each character's word is its [transition map](super::rules) (a `u32`: the
//! state it gets after a character of each state) and, per previous state,
//! whether a piece starts at it (eight bits, those of four bytes packed in one
//! `u32`): the pattern's [`StateMachine`](super::rules::StateMachine) for all eight states at once on the
//! character's window (the kinds of two characters each way, its facts and
//! those of the character before, all read from the codes step 1 wrote),
//! looked up in the machine's [word table](mod@word_table): five class offsets
//! added up, then the entry's two words. A byte inside a character has the
//! identity map. A thread composes the maps of its bytes, the workgroup scans those
//! ([`maps::scan_inclusive_stored`]; not where every thread's map but the first's is
//! constant, as nearly all are for cl100k: then the map before a thread is the
//! one of the thread before it), a look-back composes the blocks before (a
//! block whose map is constant publishes its last state at once, any other
//! when it has finished; either ends the walk), and every
//! thread then runs its bytes from the state before them: one nibble lookup
//! and one bit test per byte. A second look-back sums the piece counts, and
//! every piece start is stored at its index.
//!
//! Where a state depends on characters arbitrarily far back (a digit run's
//! count modulo three, a caseless letter before or after the first lower-case
//! one, a line break in a punctuation piece's tail), the scan carries it: no
//! thread ever walks a run.

use vyre_cuda::ir::{Access, BlockBuilder, BufferCount, ElemType, Expr, Program, ReduceOp};

use super::code::{self, kind, starts_character, starts_document};
use super::ir::{as_u32, has_bit, load_where, local};
use super::lookback::{self, Combine, Direction, LookBack};
use super::maps;
use super::pieces;
use super::rules::{Fact, Field};
use super::window::{self, Layout, HALO};
use super::word_table::{self, WordTable};
use super::SplitBuild;
use super::{phases_bindings, SplitBuffer};
use crate::pretokenize::unicode::Kind;
use crate::pretokenize::Geometry;

/// Bytes of context a character's window reads on each side: two characters.
const CONTEXT: i32 = 8;

/// The phases program of `table`'s machine, which reads the table from the
/// resident tables' buffer ([`SplitBuffer::KindTable`]); with `cuts`, it also
/// cuts between bytes no token joins ([`pieces::with_cuts`], the joined-pairs
/// table at that word of the resident tables) and binds the text.
pub(super) fn program(
    table: &WordTable,
    geometry: Geometry,
    cuts: Option<u32>,
    build: SplitBuild,
) -> Program {
    let machine = table.machine();
    let layout = Layout::new(geometry);
    let workgroup_size = layout.workgroup_size;
    let per_thread = layout.bytes_per_thread;
    let builder = Program::builder([workgroup_size, 1, 1]).entry_op_id(format!(
        "pretokenize.batch.{}_phases",
        machine.pattern.name()
    ));
    let bindings = phases_bindings(cuts);
    let first_shared = bindings.len() as u32;
    pieces::declare(
        builder,
        bindings,
        &[SplitBuffer::PieceStarts, SplitBuffer::PieceCount],
    )
    .buffer(
        "window",
        first_shared,
        Access::Workgroup,
        ElemType::U32,
        BufferCount::Static(layout.code_slots),
    )
    .buffer(
        "scan",
        first_shared + 1,
        Access::Workgroup,
        ElemType::U32,
        BufferCount::Static(workgroup_size),
    )
    .buffer(
        "lookback_maps",
        first_shared + 2,
        Access::Workgroup,
        ElemType::U32,
        BufferCount::Static(workgroup_size),
    )
    .body(|b| {
        let block = lookback::position(b, build);
        let region = match build {
            SplitBuild::Dispatched => Expr::u32(0),
            SplitBuild::Fused => {
                // `classify`'s status words, which no group reads any more:
                // each group clears its block's (see `SplitBuild`).
                b.if_(local().equals(0u32), |b| {
                    b.store("statuses", block.clone(), Expr::u64(0));
                });
                b.let_("region", lookback::second_set())
            }
        };
        let blocks = b.let_("blocks", Expr::workgroup_count(vyre_cuda::ir::Axis::X));
        let block_start = b.let_("block_start", block.clone() * layout.block_bytes);
        let text_len = window::text_length(b, "codes");
        // Every round's load first, then every store: a store waits for its
        // load, and a warp issues in order, so a store between two rounds' loads
        // made each round wait a whole round trip to memory for the one before
        // (13 % of the step's warp samples on 8 MiB of prose, eight rounds of a
        // byte load each, Nsight Compute on the H200, 2026-12-04; with the loads
        // first the step took 182–188 µs per 8 MiB of CJK, prose and code
        // against 191–198, alternating in one call). The same reordering of
        // `classify`'s window, whose rounds decode and look kinds up between
        // their loads, gained nothing there (132–182 against 132–178 µs).
        // Each round's slot, code, and (only in a round that runs past the
        // window's end) the test that its slot is in the window.
        let loaded: Vec<(Expr, Expr, Option<Expr>)> = (0..layout.rounds(layout.code_slots))
            .map(|round| {
                let slot = b.let_(format!("slot{round}"), local() + round * workgroup_size);
                let position = b.let_(
                    format!("position{round}"),
                    block_start.clone() - HALO + slot.clone(),
                );
                let partial = (round + 1) * workgroup_size > layout.code_slots;
                let in_window = partial.then(|| slot.clone().less_than(layout.code_slots));
                let inside = position.clone().less_than(text_len.clone());
                let condition = match &in_window {
                    Some(in_window) => in_window.clone().and(inside.clone()),
                    None => inside.clone(),
                };
                let loaded = load_where(b, &format!("loaded{round}"), "codes", position, condition);
                (slot, inside.select(loaded, code::OUTSIDE), in_window)
            })
            .collect();
        for (slot, code, in_window) in loaded {
            match in_window {
                None => {
                    b.store("window", slot, code);
                }
                Some(in_window) => {
                    b.if_(in_window, |b| {
                        b.store("window", slot, code);
                    });
                }
            }
        }
        b.barrier();
        let first_slot = b.let_("first_slot", local() * per_thread + HALO);
        // codes[d + CONTEXT] = the code at distance d from the thread's first byte.
        let codes: Vec<Expr> = (-CONTEXT..per_thread as i32 + CONTEXT)
            .map(|distance| {
                let slot = if distance < 0 {
                    first_slot.clone() - distance.unsigned_abs()
                } else {
                    first_slot.clone() + distance as u32
                };
                b.let_(
                    format!("c{}", distance + CONTEXT),
                    Expr::load("window", slot),
                )
            })
            .collect();
        let neighbors = Neighbors::emit(b, &codes, per_thread as usize);
        let mut words = Vec::new();
        for group in 0..per_thread.div_ceil(4) as i32 {
            let mut starts = Expr::u32(0);
            let mut group_maps = Vec::new();
            for byte in 4 * group..(4 * group + 4).min(per_thread as i32) {
                let window = neighbors.of(byte as usize, &codes);
                let (map, byte_starts) = character_word(b, table, byte, window);
                let starts_shift = 8 * (byte - 4 * group) as u32;
                starts = starts | (byte_starts << starts_shift);
                group_maps.push((map, starts_shift));
            }
            let starts = b.let_(format!("starts{group}"), starts);
            words.extend(group_maps.into_iter().map(|(map, starts_shift)| Word {
                map,
                starts: starts.clone(),
                starts_shift,
            }));
        }
        // The thread's bytes in order.
        let mut chunk = words[0].map.clone();
        for (byte, word) in words.iter().enumerate().skip(1) {
            chunk = maps::compose(b, &format!("chunk{byte}"), &chunk, &word.map);
        }
        // The state before a thread is the composition of the threads' maps
        // before it; where the map of the thread just before is constant, that
        // composition is that map, and a block whose threads' maps are all
        // constant (but the first's, whose state comes from the look-back)
        // skips the scan: twenty-one barriers for blocks of 1,024 threads.
        // Counted on the CPU (2026-12-04) over 8 MiB of the `gpu_encode`
        // bench's batch: in blocks of 1,024 threads × 8 bytes (chunks from
        // 1 MiB) every block skips it with cl100k's machine and 371 of 1,024
        // with o200k's, whose letter runs keep states apart; in blocks of
        // 256 threads × 4 bytes (smaller texts) 3,020 and 421 of 8,192. A
        // block that scans pays one reduction more than before.
        let chunk = b.let_("chunk_map", chunk);
        b.store("scan", local(), chunk.clone());
        b.barrier();
        let previous = Expr::load(
            "scan",
            local().greater_than(0u32).select(local() - 1u32, 0u32),
        );
        let open = local()
            .greater_than(0u32)
            .and(maps::is_constant(&previous).logical_not())
            .or(local()
                .equals(workgroup_size - 1)
                .and(maps::is_constant(&chunk).logical_not()));
        let any_open = b.workgroup_reduce("any_open", ReduceOp::Max, as_u32(open));
        b.if_(any_open.equals(1u32), |b| {
            // `lookback_maps` is free until the look-back below.
            maps::scan_inclusive_stored(
                b,
                "states",
                "scan",
                Some("lookback_maps"),
                workgroup_size,
                chunk.clone(),
            );
        });
        // Either way `scan[t - 1]` holds the map before thread `t` and
        // `scan[W - 1]` the block's.
        let before_thread = b.let_(
            "before_thread",
            local().greater_than(0u32).select(
                Expr::load(
                    "scan",
                    local().greater_than(0u32).select(local() - 1u32, 0u32),
                ),
                maps::IDENTITY,
            ),
        );
        let block_map = b.let_("block_map", Expr::load("scan", workgroup_size - 1));
        let channels = [(Combine::States("lookback_maps"), block_map.clone())];
        let states = LookBack {
            prefix: "states",
            workgroup_size,
            region: region.clone(),
            block: block.clone(),
            blocks: blocks.clone(),
            direction: Direction::Backward,
            channels: &channels,
        };
        let carried = states.carries(b).remove(0);
        let state_before = b.let_("state_before_block", carried);
        states.publish_inclusive(b, &[maps::apply(&block_map, &state_before)]);
        let state = b.let_mut("state", maps::apply(&before_thread, &state_before));
        let mut marks = Vec::new();
        for (byte, word) in words.iter().enumerate() {
            let mark = b.let_(
                format!("mark{byte}"),
                word.starts_after(&state).equals(1u32),
            );
            b.assign("state", maps::apply(&word.map, &state));
            marks.push(mark);
        }
        let block = pieces::Block::new(&block, &blocks, &block_start, layout);
        if let Some(table_word) = cuts {
            marks = pieces::with_cuts(b, &block, marks, &text_len, table_word);
        }
        pieces::store(b, block, marks, region + blocks.clone(), 2, build);
    })
    .build()
}

/// A byte's [`CharacterWord`](super::rules::CharacterWord) as IR values: its
/// map, and its start bits as a byte of a `u32` that holds those of up to four
/// bytes (fewer registers held from the words to the marks).
struct Word {
    map: Expr,
    starts: Expr,
    starts_shift: u32,
}

impl Word {
    /// 1 where a piece starts at the byte after a character of `state`, else 0.
    fn starts_after(&self, state: &Expr) -> Expr {
        (self.starts.clone() >> (state.clone() + self.starts_shift)) & 1u32
    }
}

/// The codes of the two nearest character starts on each side of every byte
/// of a thread, found by one pass over its context each way: the nearest start
/// at or before a position is the position itself if it starts a character,
/// else the nearest one at or before the position before (and the second
/// nearest likewise). Every four consecutive positions hold a start (a
/// character is at most four bytes; a position outside the text counts as
/// one), so within the context's eight bytes each way both are exact.
struct Neighbors {
    /// Per context index from 0: the nearest start at or before it, and the
    /// one before that.
    back: Vec<(Expr, Expr)>,
    /// Per context index from `CONTEXT + 1` (the thread's second byte): the
    /// nearest start at or after it, and the one after that.
    ahead: Vec<(Expr, Expr)>,
}

impl Neighbors {
    /// `codes[i]` is the code at distance `i - CONTEXT` from the thread's first
    /// byte; the thread has `bytes` bytes.
    fn emit(b: &mut BlockBuilder, codes: &[Expr], bytes: usize) -> Neighbors {
        let context = CONTEXT as usize;
        let starts: Vec<Expr> = codes
            .iter()
            .enumerate()
            .map(|(index, code)| b.let_(format!("starts_character{index}"), starts_character(code)))
            .collect();
        let mut step = |previous: &(Expr, Expr), index: usize, direction: &str| {
            let starts = &starts[index];
            (
                b.let_(
                    format!("nearest_{direction}{index}"),
                    starts
                        .clone()
                        .select(codes[index].clone(), previous.0.clone()),
                ),
                b.let_(
                    format!("second_{direction}{index}"),
                    starts
                        .clone()
                        .select(previous.0.clone(), previous.1.clone()),
                ),
            )
        };
        // Backward neighbours are read at indexes context - 1 ..= context + bytes - 2.
        let mut back = vec![(codes[0].clone(), codes[0].clone())];
        for index in 1..context + bytes - 1 {
            let next = step(&back[index - 1], index, "back");
            back.push(next);
        }
        // Forward neighbours are read at indexes context + 1 ..= context + bytes,
        // found from the last index down.
        let last = codes.len() - 1;
        let mut ahead = vec![(codes[last].clone(), codes[last].clone())];
        for index in (context + 1..last).rev() {
            let next = step(&ahead[ahead.len() - 1], index, "ahead");
            ahead.push(next);
        }
        ahead.reverse();
        Neighbors { back, ahead }
    }

    /// The codes of byte `byte`'s window: two starts before, itself, two after.
    fn of(&self, byte: usize, codes: &[Expr]) -> [Expr; 5] {
        let index = byte + CONTEXT as usize;
        let (before, before2) = self.back[index - 1].clone();
        // `ahead` starts at the context index after the thread's first byte.
        let (after, after2) = self.ahead[byte].clone();
        [before2, before, codes[index].clone(), after, after2]
    }
}

/// Emits the word ([`StateMachine::character_word`](super::rules::StateMachine::character_word)) of the thread's byte
/// `byte`, whose window is `[before2, before, here, after, after2]` (the codes
/// of the two character starts before it, its own, the two after): the identity
/// map with no start bit where the byte starts no character of the text.
/// Returns the map (a variable) and the start bits (an expression, bits 0..8).
fn character_word(
    b: &mut BlockBuilder,
    table: &WordTable,
    byte: i32,
    [before2, before, here, after, after2]: [Expr; 5],
) -> (Expr, Expr) {
    let name = |what: &str| format!("b{byte}_{what}");
    let document_start = b.let_(name("document_start"), starts_document(&here));
    let end = Expr::u32(Kind::End as u32);
    let before_kind = b.let_(
        name("before_kind"),
        document_start.clone().select(end.clone(), kind(&before)),
    );
    let before2_kind = b.let_(
        name("before2_kind"),
        document_start
            .clone()
            .or(starts_document(&before))
            .select(end.clone(), kind(&before2)),
    );
    let after_kind = b.let_(
        name("after_kind"),
        starts_document(&after).select(end.clone(), kind(&after)),
    );
    let after2_kind = b.let_(
        name("after2_kind"),
        starts_document(&after)
            .or(starts_document(&after2))
            .select(end, kind(&after2)),
    );
    let kinds = [
        before2_kind,
        before_kind,
        b.let_(name("here_kind"), kind(&here)),
        after_kind,
        after2_kind,
    ];
    let fact = |which: Fact| match which {
        Fact::BreakAhead => has_bit(&here, code::BREAK_AHEAD),
        Fact::BreakAheadBefore => document_start
            .clone()
            .logical_not()
            .and(has_bit(&before, code::BREAK_AHEAD)),
        Fact::UpperToEnd => has_bit(&here, code::UPPER_TO_END),
    };
    // The entry's first word: each field's class offset, then the facts.
    let mut entry = Expr::u32(0);
    for (field, kind) in kinds.into_iter().enumerate() {
        let offsets = table.first_word() + field as u32 * word_table::CODES;
        entry = entry + Expr::load(SplitBuffer::KindTable.name(), kind + offsets);
    }
    for (bit, &which) in table.facts().iter().enumerate() {
        entry = entry + (as_u32(fact(which)) << (bit as u32 + 1));
    }
    let entry = b.let_(name("entry"), entry);
    let map = Expr::load(SplitBuffer::KindTable.name(), entry.clone());
    let extra = b.let_(
        name("extra"),
        Expr::load(SplitBuffer::KindTable.name(), entry + 1u32),
    );
    let start_state = extra.clone() >> word_table::START_STATE_SHIFT;
    let map = document_start
        .clone()
        .select(maps::constant(&start_state), map);
    let start_bits = document_start.select(0xFFu32, extra & 0xFFu32);
    let character = b.let_(name("character"), kind(&here).less_than(Kind::End as u32));
    (
        b.let_(name("map"), character.clone().select(map, maps::IDENTITY)),
        character.select(start_bits, 0u32),
    )
}

// Fields are indexed in this order.
const _: () = {
    assert!(Field::Before2 as usize == 0 && Field::After2 as usize == 4);
};
