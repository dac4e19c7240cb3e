//! Prefixes across workgroups in the same dispatch: decoupled look-back.
//!
//! A value of every block (its piece count, its transition map, the first
//! position after which a fact is decided) must be combined with the values of
//! all blocks before it (or, for the look-ahead facts, after it), however many.
//! A second dispatch per scan would cost a launch each (3.6 µs eager, 1.0 µs
//! as a graph node on the H200); instead every block publishes its own value
//! (an *aggregate*) in one 64-bit status word as soon as it has it, then reads
//! the status words of the blocks before it, one per thread, the nearest
//! [`FIRST_REACH`] first and then `W` at a time: the nearest block that has
//! already published its *inclusive* prefix ends the walk, and the aggregates
//! between are combined on the way. Then the block
//! publishes its own inclusive prefix. A block waits only for blocks that have
//! not published even their aggregate, and those started earlier: blocks take
//! their position in the text from a ticket counter in the order they start
//! ([`take_ticket`]), never from the hardware's block index, so a waiting block
//! never waits for one that has no place on the device yet; in a fused kernel,
//! whose groups run in index order or all at once, from their index
//! ([`position`], [`SplitBuild`]).
//!
//! Status words: flag in bits 62..=63 (0 not yet published, 1 aggregate, 2
//! inclusive), below it the values one after another from bit 0: up to two of
//! 30 bits (two facts travel together), or one transition map of 32. Blocks
//! before the first (or after the last) read as inclusive identities. Every
//! read is an atomic load (it reaches the device's coherent L2, never a stale
//! L1 line, and a warp's loads of neighbouring words travel together, where
//! an `atomic_fetch_or` of 0 made each a read-modify-write) and every value
//! rides in the same word as its flag, so the look-back itself needs no fence.
//!
//! The status words and the two counters (ticket, done) must be zero before a
//! dispatch and are zero after it: the block that finishes last (by the done
//! counter) clears them ([`finish`]), so a buffer allocated zeroed serves any
//! number of dispatches, eager or in a graph, with no clearing step. A
//! dispatch of one workgroup leaves all of it out and touches neither
//! ([`alone`]). That step
//! is the one place where one atomic must order another: the IR's atomics are
//! relaxed, so a block's status exchange and its later done increment (two
//! addresses) may reach memory in either order, and without a fence on each
//! side of the done count an exchange could land after the last block's clear
//! and leave a stale status word (flag and value of this dispatch) for the
//! next one, whose blocks then take it for a finished prefix before its owner
//! publishes: wrong piece indexes only when the next batch differs (the first
//! H200 run failed exactly there, never on a graph replay of the same batch).
//!
//! What a look-back costs was cut on 2026-12-05, in one change measured as a
//! whole (H200, cl100k, 8 MiB of each shape eager, two rounds alternating with
//! the tree before): aggregates that already are inclusive values published as
//! such (constant maps, blocks holding a fact event), a first round of
//! [`FIRST_REACH`] blocks, few maps composed by one thread, one reduction for
//! both the nearest inclusive prefix and an unready block, and status words
//! read by atomic loads instead of `atomic_fetch_or` of 0. `phases` went from
//! 195–199 to 157–160 µs, `compact` from 39–42 to 33–36, `classify` of prose
//! and code from 133–141 to 110–112, the chunk's kernels from 609–655 to
//! 540–575 µs.
//!
//! On the reference interpreter every block publishes its aggregate in the same
//! statement (lockstep), so no block ever waits; each walks back to the first
//! block, `W` blocks a round after the first.

use vyre_cuda::ir::{AtomicOp, Axis, BlockBuilder, Expr, ReduceOp, ScalarType};

use super::ir::{as_u32, local};
use super::maps;
use super::SplitBuild;

/// Counter word: the next ticket.
pub(super) const TICKET: u32 = 0;
/// Counter word: blocks that have finished reading status words.
pub(super) const DONE: u32 = 1;
/// Words of the counters buffer.
pub const COUNTER_WORDS: u32 = 2;

const FLAG_SHIFT: u32 = 62;
const AGGREGATE: u64 = 1 << FLAG_SHIFT;
const INCLUSIVE: u64 = 2 << FLAG_SHIFT;
/// Bits of one value in a status word.
const VALUE_BITS: u32 = 30;
/// The largest value a status word holds; a minimum's identity.
pub(super) const INFINITY: u32 = (1 << VALUE_BITS) - 1;

/// How values combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Combine {
    /// Wrapping sum (piece counts).
    Sum,
    /// Minimum of events whose values grow in the walk's direction (the fact
    /// events, `2 · position + verdict`, looked for ahead; identity
    /// [`INFINITY`]): a block that holds an event holds the minimum of itself
    /// and every block beyond, so its aggregate is its inclusive value.
    FirstEvent,
    /// Transition maps over eight states ([`maps`]): an aggregate is a map, an
    /// inclusive value a state. The name is a workgroup buffer of `W` words the
    /// look-back combines maps in.
    States(&'static str),
}

impl Combine {
    /// Bits of its value in a status word: [`VALUE_BITS`], or a whole `u32`
    /// for a map (a map's slots are nibbles, so it needs all 32; an inclusive
    /// state needs 3).
    fn value_bits(self) -> u32 {
        match self {
            Combine::Sum | Combine::FirstEvent => VALUE_BITS,
            Combine::States(_) => 32,
        }
    }

    fn identity(self) -> u32 {
        match self {
            Combine::Sum => 0,
            Combine::FirstEvent => INFINITY,
            Combine::States(_) => maps::IDENTITY,
        }
    }

    /// The identity as an inclusive value (a state for `States`: the state
    /// before the text).
    fn inclusive_identity(self) -> u32 {
        match self {
            Combine::States(_) => 0,
            other => other.identity(),
        }
    }
}

/// Which blocks a block combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// The blocks before it (a prefix).
    Backward,
    /// The blocks after it (a suffix).
    Forward,
}

/// Whether this workgroup is the dispatch's only one (uniform). Then no other
/// workgroup reads its status words or counts it done, so the protocol is
/// left out: its ticket is 0 without the fetch-add, it publishes nothing, and
/// [`finish`] neither counts nor clears (the status words and counters stay
/// zero, untouched). Why: a lone workgroup paid for the protocol on its
/// serial path, thread 0's two fetch-adds (each a round trip to L2 before the
/// workgroup could go on) and two workgroup reductions per program, for
/// nothing; the short-text kernel runs every step of a text of up to a
/// block (1 KiB) as one group, and a small text dispatched step by step runs
/// one workgroup per step too.
fn alone() -> Expr {
    Expr::workgroup_count(Axis::X).equals(1u32)
}

/// Declares the uniform variable `name`: what `publish` builds (the
/// statements, reductions and barriers it emits run only then) where this
/// workgroup has others, `alone_value` where it is [`alone`]. For a value
/// that only the look-back reads (what the workgroup publishes), which a lone
/// workgroup leaves out.
pub(crate) fn published(
    b: &mut BlockBuilder,
    name: &str,
    alone_value: impl Into<Expr>,
    publish: impl FnOnce(&mut BlockBuilder) -> Expr,
) -> Expr {
    let value = b.let_mut(name, alone_value);
    b.if_(alone().logical_not(), |b| {
        let published = publish(b);
        b.assign(name, published);
    });
    value
}

/// The uniform `u32` position of this workgroup among the dispatch's: its
/// ticket ([`take_ticket`]) in a step dispatched alone, its index in a fused
/// kernel ([`SplitBuild::Fused`]: its groups run in index order, or all at
/// once, so a group waits in a look-back only for groups that started).
pub(crate) fn position(b: &mut BlockBuilder, build: SplitBuild) -> Expr {
    match build {
        SplitBuild::Dispatched => take_ticket(b),
        SplitBuild::Fused => b.let_("ticket", Expr::workgroup_id(Axis::X)),
    }
}

/// Index of the first status word of a fused build's second set of regions
/// ([`SplitBuild::Fused`]): the buffer's second half.
pub(crate) fn second_set() -> Expr {
    Expr::length("statuses") / 2u32
}

/// Declares the uniform `u32` variable `block`: this workgroup's ticket, the
/// order in which workgroups started (thread 0 takes it with one fetch-add;
/// 0 for a workgroup [`alone`]).
fn take_ticket(b: &mut BlockBuilder) -> Expr {
    let ticket = b.let_mut("ticket", 0u32);
    b.if_(alone().logical_not(), |b| {
        let taken = b.let_mut("ticket_taken", 0u32);
        b.if_(local().equals(0u32), |b| {
            let ticket = b.atomic_fetch("ticket_fetched", AtomicOp::Add, "counters", TICKET, 1u32);
            b.assign("ticket_taken", ticket);
        });
        let reduced = b.workgroup_reduce("ticket_reduced", ReduceOp::Max, taken);
        b.assign("ticket", reduced);
    });
    ticket
}

/// One look-back: which status words, which block, which values.
pub(crate) struct LookBack<'a> {
    /// Prefix of the names it declares.
    pub prefix: &'a str,
    /// Threads per workgroup (`W`): status words read per round.
    pub workgroup_size: u32,
    /// Index of block 0's status word (uniform).
    pub region: Expr,
    /// This block's index (uniform).
    pub block: Expr,
    /// Number of blocks (uniform).
    pub blocks: Expr,
    /// Which blocks it combines.
    pub direction: Direction,
    /// One or two values, each with its combination and this block's aggregate.
    pub channels: &'a [(Combine, Expr)],
}

impl LookBack<'_> {
    fn name(&self, what: &str) -> String {
        format!("{}_{what}", self.prefix)
    }

    /// Where channel `channel`'s value starts in a status word, and its mask.
    /// The channels' values lie below the flag: a program that asks for more
    /// bits than that is a bug in this crate, caught when it is built.
    fn value_place(&self, channel: usize) -> (u32, u32) {
        let shift: u32 = self.channels[..channel]
            .iter()
            .map(|(combine, _)| combine.value_bits())
            .sum();
        let bits = self.channels[channel].0.value_bits();
        assert!(
            shift + bits <= FLAG_SHIFT,
            "look-back `{}`: its channels take more than {FLAG_SHIFT} bits",
            self.prefix
        );
        (shift, u32::MAX >> (32 - bits))
    }

    fn word(&self, flag: u64, values: &[Expr]) -> Expr {
        let mut word = Expr::u64(flag);
        for (channel, value) in values.iter().enumerate() {
            let (shift, mask) = self.value_place(channel);
            word = word | ((value.clone() & mask).cast(ScalarType::U64) << shift);
        }
        word
    }

    fn publish(&self, b: &mut BlockBuilder, flag: u64, values: &[Expr]) {
        let word = self.word(flag, values);
        self.publish_word(b, word);
    }

    fn publish_word(&self, b: &mut BlockBuilder, word: Expr) {
        let index = self.region.clone() + self.block.clone();
        let inside = index.clone().less_than(Expr::length("statuses"));
        let read_by_others = alone().logical_not();
        b.if_(local().equals(0u32).and(inside).and(read_by_others), |b| {
            b.atomic(AtomicOp::Exchange, "statuses", index, word);
        });
    }

    /// Publishes this block's aggregates, then walks back (or ahead) until an
    /// inclusive prefix: returns, per channel, the combination of every block
    /// before this one in the direction (for `States`, the state before the
    /// block's first byte). An aggregate that already is the inclusive value
    /// is published as such at once, so that later blocks need not wait for
    /// this one's walk: a lone `States` channel's constant map (the state it
    /// sends everything to is the state after the block, whatever came
    /// before), and `FirstEvent` channels that all hold an event.
    pub(crate) fn carries(&self, b: &mut BlockBuilder) -> Vec<Expr> {
        let aggregates: Vec<Expr> = self
            .channels
            .iter()
            .map(|(_, value)| value.clone())
            .collect();
        let open = self.word(AGGREGATE, &aggregates);
        let published = match self.channels {
            [(Combine::States(_), map)] => {
                let settled = self.word(INCLUSIVE, &[map.clone() & (maps::STATES - 1)]);
                maps::is_constant(map).select(settled, open)
            }
            channels
                if channels
                    .iter()
                    .all(|(combine, _)| *combine == Combine::FirstEvent) =>
            {
                let settled = channels
                    .iter()
                    .map(|(_, value)| value.clone().less_than(INFINITY))
                    .reduce(Expr::and)
                    .unwrap_or(Expr::bool(false));
                settled.select(self.word(INCLUSIVE, &aggregates), open)
            }
            _ => open,
        };
        self.publish_word(b, published);
        let workgroup_size = self.workgroup_size;
        let mut carries = Vec::new();
        for (channel, (combine, _)) in self.channels.iter().enumerate() {
            carries.push(b.let_mut(self.name(&format!("carry{channel}")), combine.identity()));
        }
        let looked = b.let_mut(self.name("looked"), 0u32);
        // Blocks read this round: the nearest `FIRST_REACH` first, then `W` a
        // round.
        let first_reach = FIRST_REACH.min(workgroup_size);
        let reach = b.let_mut(self.name("reach"), first_reach);
        // Blocks to look at in this direction.
        let before = match self.direction {
            Direction::Backward => self.block.clone(),
            Direction::Forward => self.blocks.clone() - 1u32 - self.block.clone(),
        };
        let pending = b.let_mut(
            self.name("pending"),
            as_u32(before.clone().greater_than(0u32)),
        );
        b.while_(pending.clone().equals(1u32), |b| {
            // Thread t reads the block W - 1 - t places away (past those already
            // read): thread order is text order for the Backward maps. Threads
            // past this round's reach read nothing and hold an aggregate
            // identity (combined, never ending the walk).
            let distance = b.let_(
                self.name("distance"),
                looked.clone() + (workgroup_size - 1) - local(),
            );
            let within = b.let_(
                self.name("within"),
                (local() + reach.clone()).greater_equal(workgroup_size),
            );
            let exists = b.let_(
                self.name("exists"),
                distance.clone().less_than(before.clone()),
            );
            let index = match self.direction {
                Direction::Backward => self.block.clone() - 1u32 - distance,
                Direction::Forward => self.block.clone() + 1u32 + distance,
            };
            let inclusive_identities: Vec<Expr> = self
                .channels
                .iter()
                .map(|(combine, _)| Expr::u32(combine.inclusive_identity()))
                .collect();
            let aggregate_identities: Vec<Expr> = self
                .channels
                .iter()
                .map(|(combine, _)| Expr::u32(combine.identity()))
                .collect();
            let word_name = self.name("word");
            let word = b.let_mut(
                word_name.as_str(),
                within.clone().select(
                    self.word(INCLUSIVE, &inclusive_identities),
                    self.word(AGGREGATE, &aggregate_identities),
                ),
            );
            let status = b.let_(self.name("status"), self.region.clone() + index);
            // A status word past the buffer (a caller that bound too few) reads
            // as an inclusive identity: a wrong count, never a block waiting
            // forever.
            let readable = within
                .and(exists)
                .and(status.clone().less_than(Expr::length("statuses")));
            b.if_(readable, |b| {
                let read = b.atomic_load(self.name("read"), "statuses", status);
                b.assign(word_name.as_str(), read);
            });
            let flag = b.let_(
                self.name("flag"),
                (word.clone() >> FLAG_SHIFT).cast(ScalarType::U32),
            );
            // One reduction answers both questions of the round: the highest
            // thread holding an inclusive prefix (the nearest, which ends the
            // walk) and whether a block the walk takes has published nothing
            // yet. The highest thread holding either a prefix (key 2 · (t + 1))
            // or nothing (2 · (t + 1) + 1) is above every other such thread:
            // nothing there means a taken block is not ready (the round is
            // read again), a prefix there means every unready block lies
            // beyond it, untaken.
            let nearest = b.workgroup_reduce(
                self.name("nearest"),
                ReduceOp::Max,
                flag.clone().equals(2u32).select(
                    (local() + 1u32) * 2u32,
                    flag.clone()
                        .equals(0u32)
                        .select((local() + 1u32) * 2u32 + 1u32, 0u32),
                ),
            );
            let waiting = b.let_(self.name("waiting"), nearest.clone() & 1u32);
            // The nearest inclusive prefix read, as thread index + 1 (0: none).
            let found = b.let_(self.name("found"), nearest >> 1u32);
            let take = b.let_(
                self.name("take"),
                (local() + 1u32).greater_equal(found.clone()),
            );
            b.if_(waiting.equals(0u32), |b| {
                for (channel, (combine, _)) in self.channels.iter().enumerate() {
                    let (shift, mask) = self.value_place(channel);
                    let value = b.let_(
                        self.name(&format!("value{channel}")),
                        (word.clone() >> shift).cast(ScalarType::U32) & mask,
                    );
                    let carry_name = self.name(&format!("carry{channel}"));
                    let carry = carries[channel].clone();
                    match combine {
                        Combine::Sum => {
                            let part = b.workgroup_reduce(
                                self.name(&format!("sum{channel}")),
                                ReduceOp::Sum,
                                take.clone().select(value, 0u32),
                            );
                            b.assign(carry_name.as_str(), carry + part);
                        }
                        Combine::FirstEvent => {
                            let part = b.workgroup_reduce(
                                self.name(&format!("min{channel}")),
                                ReduceOp::Min,
                                take.clone().select(value, INFINITY),
                            );
                            b.assign(carry_name.as_str(), carry.min(part));
                        }
                        Combine::States(scratch) => {
                            // An inclusive prefix is a state: the map that sends
                            // everything there.
                            let entry = flag.clone().equals(2u32).select(
                                maps::constant(&(value.clone() & (maps::STATES - 1))),
                                value,
                            );
                            let entry = take.clone().select(entry, maps::IDENTITY);
                            let prefix = format!("{}_window{channel}", self.prefix);
                            // Where the entries that may not be the identity
                            // are few (from the nearest inclusive prefix read,
                            // or from the first thread within reach), one
                            // thread composes them in turn; else the workgroup
                            // scans the window. Either way the last slot of
                            // `scratch` holds the composition of the window in
                            // text order.
                            let first = b.let_(
                                self.name(&format!("first{channel}")),
                                found
                                    .clone()
                                    .max(Expr::u32(workgroup_size + 1) - reach.clone())
                                    - 1u32,
                            );
                            // Both ways read every thread's entry from `scratch`.
                            let entry = b.let_(format!("{prefix}_entry"), entry.clone());
                            b.store(*scratch, local(), entry.clone());
                            b.barrier();
                            b.if_else(
                                first
                                    .clone()
                                    .greater_equal(workgroup_size.saturating_sub(SERIAL_MOST)),
                                |b| {
                                    compose_in_turn(
                                        b,
                                        &prefix,
                                        scratch,
                                        workgroup_size,
                                        first.clone(),
                                    );
                                },
                                |b| {
                                    maps::scan_inclusive_stored(
                                        b,
                                        &prefix,
                                        scratch,
                                        None,
                                        workgroup_size,
                                        entry.clone(),
                                    );
                                },
                            );
                            // It comes before the blocks already combined.
                            let window = b.let_(
                                self.name(&format!("window_total{channel}")),
                                Expr::load(*scratch, workgroup_size - 1),
                            );
                            let composed = maps::compose(
                                b,
                                &self.name(&format!("composed{channel}")),
                                &window,
                                &carry,
                            );
                            b.assign(carry_name.as_str(), composed);
                            // Every thread has read the total before the next
                            // round writes the scratch again.
                            b.barrier();
                        }
                    }
                }
                b.assign(
                    self.name("pending"),
                    as_u32(
                        found
                            .equals(0u32)
                            .and((looked.clone() + reach.clone()).less_than(before.clone())),
                    ),
                );
                b.assign(self.name("looked"), looked.clone() + reach.clone());
                b.assign(self.name("reach"), Expr::u32(workgroup_size));
            });
        });
        carries
            .into_iter()
            .zip(self.channels)
            .map(|(carry, (combine, _))| match combine {
                Combine::States(_) => maps::apply(&carry, &Expr::u32(0)),
                _ => carry,
            })
            .collect()
    }

    /// Publishes this block's inclusive prefixes (`values`, one per channel; a
    /// state for `States`).
    pub(crate) fn publish_inclusive(&self, b: &mut BlockBuilder, values: &[Expr]) {
        self.publish(b, INCLUSIVE, values);
    }
}

/// Blocks a look-back's first round reads (at most `W`): its status words are
/// read by atomic loads, one a thread, and a round of `W` reads 1,024 words in the
/// batch's blocks of 1,024 threads where the nearest inclusive prefix is most
/// often a few blocks back (the block just before, where its aggregate already
/// is its inclusive value). A walk that finds none within reach reads `W`
/// blocks a round from there on. Measured only together with the
/// module's other changes of 2026-12-05 (see the module docs).
pub(crate) const FIRST_REACH: u32 = 32;

/// Most taken entries of a look-back round of maps that one thread composes in
/// turn instead of the workgroup's scan: the scan is two barriers and a
/// composition per doubling of the workgroup (twenty barriers for the batch's
/// blocks of 1,024 threads) whatever the number of entries taken, while the
/// nearest inclusive prefix is most often a few blocks back (in the short-text
/// kernel, whose one workgroup runs the blocks in turn, always the block just
/// before). One thread's chain of 32 compositions costs about what the scan's
/// rounds do; fewer cost less. Measured only together with the
/// module's other changes of 2026-12-05 (see the module docs).
const SERIAL_MOST: u32 = 32;

/// Thread 0 composes the entries (maps) every thread has stored at
/// `scratch[t]`, a barrier since, of threads `first..W` in thread order into
/// `scratch[W - 1]`, which every thread may read after this returns (the
/// entries before `first` must be the identity). Needs workgroup-uniform
/// control flow and a uniform `first`.
fn compose_in_turn(
    b: &mut BlockBuilder,
    prefix: &str,
    scratch: &str,
    workgroup_size: u32,
    first: Expr,
) {
    let total = format!("{prefix}_in_turn");
    b.if_(local().equals(0u32), |b| {
        let running = b.let_mut(total.as_str(), maps::IDENTITY);
        b.loop_(
            format!("{prefix}_in_turn_at"),
            first,
            workgroup_size,
            |b, at| {
                let composed = maps::compose(
                    b,
                    &format!("{prefix}_in_turn_composed"),
                    &running,
                    &Expr::load(scratch, at),
                );
                b.assign(total.as_str(), composed);
            },
        );
        b.store(scratch, workgroup_size - 1, running);
    });
    b.barrier();
}

/// The end of every program with look-backs, after its last status exchange:
/// counts this block done, and the last block to finish clears the
/// `regions · B` status words and the counters for the next dispatch.
///
/// Thread 0 makes every status exchange and the count; every thread's status
/// reads have returned before it (their values went into the look-back's
/// workgroup reductions), so no clear can reach them. A fence before the count
/// (release) puts thread 0's exchanges before it; a fence after (acquire),
/// then the workgroup reduction's barriers, put the last block's clearing
/// stores after every block's count, and so after every exchange.
pub(crate) fn finish(b: &mut BlockBuilder, workgroup_size: u32, regions: u32) {
    // A workgroup alone wrote no status word and took no ticket.
    b.if_(alone().logical_not(), |b| {
        count_done_and_clear(b, workgroup_size, regions)
    });
}

/// [`finish`] for a workgroup among others.
fn count_done_and_clear(b: &mut BlockBuilder, workgroup_size: u32, regions: u32) {
    let finished = b.let_mut("finished_before", 0u32);
    b.if_(local().equals(0u32), |b| {
        b.fence();
        let done = b.atomic_fetch("done_fetched", AtomicOp::Add, "counters", DONE, 1u32);
        b.fence();
        b.assign("finished_before", done);
    });
    let finished = b.workgroup_reduce("finished", ReduceOp::Max, finished);
    let blocks = Expr::workgroup_count(Axis::X);
    b.if_((finished + 1u32).equals(blocks.clone()), |b| {
        let words = b.let_(
            "status_words",
            (blocks * regions).min(Expr::length("statuses")),
        );
        b.loop_(
            "clear_round",
            0u32,
            (words.clone() + (workgroup_size - 1)) / workgroup_size,
            |b, round| {
                let index = b.let_("clear_index", round * workgroup_size + local());
                b.if_(index.clone().less_than(words.clone()), |b| {
                    b.store("statuses", index, Expr::u64(0));
                });
            },
        );
        b.if_(local().equals(0u32), |b| {
            b.store("counters", TICKET, 0u32);
            b.store("counters", DONE, 0u32);
        });
    });
}
