//! The cl100k and o200k splits as a machine of at most eight states, stated once
//! as data: the device programs are generated from it (the `phases` step) and
//! [`piece_starts`] runs it on the CPU, so the rule the GPU evaluates is checked
//! against the oracle without a device and without the interpreter.
//!
//! # Why eight states
//!
//! [`per_position`] states each split with the
//! sixteen [`Phase`](crate::pretokenize::per_position::Phase)s. A device composes
//! one transition map per character in a prefix scan, and a map over eight states
//! fits one `u32` (a nibble per state: [`SLOT_BITS`]) and composes with two
//! byte permutes, which pick from at most eight bytes, where sixteen states need
//! a `u64` and twice the work per composition. The phases merge into eight states
//! without losing anything, because where two phases behave differently the
//! window tells them apart:
//!
//! - `Begin` and `ThirdDigit` continue nothing (**Stop**).
//! - cl100k's `Prefix` is entered only before a letter and o200k's only before a
//!   letter or mark, and the next character then continues it exactly as it
//!   continues a letter run (**Letters**; o200k **Upper**: the prefix is never a
//!   caseless character, so the backtracking rule cannot fire there).
//! - `OtherSpace` is entered only before punctuation, which continues it exactly
//!   as it continues a punctuation run (**OtherRun**).
//! - `Contraction` and `OtherTail` (**ContractionOrTail**) follow different
//!   characters: a contraction continues after `'` or one of its letters, a tail
//!   after `\r`, `\n` (or o200k's `/`), so the character before says which rule
//!   applies.
//! - `Breaks` and `Spaces` (**White**): a white-space piece is `Breaks` exactly
//!   while `break_ahead` holds at its characters (it is entered only where it
//!   holds and continues only while it does), and `Spaces` is entered only where
//!   it does not and then never holds again in that run; so `break_ahead` at the
//!   character before says which rule applies.
//!
//! The model ([`piece_starts`]) runs over
//! [`per_position::windows`] and is
//! held to `fancy-regex` by the tests, merges included.

use crate::pretokenize::pattern::Pattern;
use crate::pretokenize::per_position;
use crate::pretokenize::unicode::{Kind, KindSet};
use crate::pretokenize::PretokenizeError;

/// Bits of one state in a transition map.
pub const STATE_BITS: u32 = 3;

/// Most states a machine has (`1 << STATE_BITS`).
pub const MAX_STATES: u32 = 1 << STATE_BITS;

/// The state of a character before the text or a document: nothing continues it.
pub const STOP: u8 = 0;

/// A character of the five a condition can read, relative to the one being
/// decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// Two characters before (`Kind::End` outside the document).
    Before2,
    /// The character before.
    Before,
    /// The character itself.
    Here,
    /// The character after.
    After,
    /// The character after that.
    After2,
}

/// A look-ahead fact (see [`per_position::Window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fact {
    /// `break_ahead` at this character.
    BreakAhead,
    /// `break_ahead` at the character before (false where there is none).
    BreakAheadBefore,
    /// `upper_to_end` at this character.
    UpperToEnd,
}

/// A condition on a [`StateWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Always true.
    Always,
    /// The character at the field has a kind in the set (`Kind::End` included
    /// where the set holds it: see [`END`]).
    Kind(Field, KindSet),
    /// The fact holds.
    Fact(Fact),
    /// The condition does not hold.
    Not(&'static Condition),
    /// Every condition holds.
    All(&'static [Condition]),
    /// Some condition holds.
    Any(&'static [Condition]),
}

/// The set holding only `Kind::End` (no character: outside the document).
pub const END: KindSet = KindSet::of(&[Kind::End]);

/// One transition: where `when` holds, the character gets state `next`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The condition.
    pub when: Condition,
    /// The state the character gets.
    pub next: u8,
}

/// What a rule reads at one character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateWindow {
    /// Kinds of the characters, indexed by [`Field`] (`Kind::End` outside the
    /// document).
    pub kinds: [Kind; 5],
    /// `break_ahead` here.
    pub break_ahead: bool,
    /// `break_ahead` at the character before.
    pub break_ahead_before: bool,
    /// `upper_to_end` here.
    pub upper_to_end: bool,
}

impl Condition {
    /// Whether the condition holds in `window`.
    pub fn holds(&self, window: &StateWindow) -> bool {
        self.holds_where(
            &|field, set| set.contains(window.kinds[field as usize]),
            &|fact| match fact {
                Fact::BreakAhead => window.break_ahead,
                Fact::BreakAheadBefore => window.break_ahead_before,
                Fact::UpperToEnd => window.upper_to_end,
            },
        )
    }

    /// Whether the condition holds where `in_set(field, set)` says whether the
    /// character at `field` is in `set`, and `fact(fact)` whether the fact holds.
    pub fn holds_where(
        &self,
        in_set: &dyn Fn(Field, KindSet) -> bool,
        fact: &dyn Fn(Fact) -> bool,
    ) -> bool {
        match *self {
            Condition::Always => true,
            Condition::Kind(field, set) => in_set(field, set),
            Condition::Fact(which) => fact(which),
            Condition::Not(inner) => !inner.holds_where(in_set, fact),
            Condition::All(all) => all.iter().all(|c| c.holds_where(in_set, fact)),
            Condition::Any(any) => any.iter().any(|c| c.holds_where(in_set, fact)),
        }
    }

    /// Calls `visit` on every kind test and fact inside the condition.
    pub fn visit(&self, visit: &mut dyn FnMut(&Condition)) {
        match *self {
            Condition::Not(inner) => inner.visit(visit),
            Condition::All(all) | Condition::Any(all) => {
                all.iter().for_each(|inner| inner.visit(visit))
            }
            Condition::Always => {}
            Condition::Kind(..) | Condition::Fact(_) => visit(self),
        }
    }
}

/// A split as a state machine: the state of each character follows from the
/// state of the one before and the window ([`StateMachine::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateMachine {
    /// The pattern.
    pub pattern: Pattern,
    /// The states' names, by number (at most [`MAX_STATES`]; state [`STOP`] first).
    pub names: &'static [&'static str],
    /// Per state, the rules by which the next character continues its piece,
    /// tried in order; none holding means a piece starts there.
    pub continues: &'static [&'static [Rule]],
    /// The state of a character where a piece starts: the first rule that holds
    /// (the last is [`Condition::Always`]).
    pub starts: &'static [Rule],
}

impl StateMachine {
    /// The machine of `pattern`; `None` for GPT-2, whose device rule needs no
    /// state (its decision per byte reads a bounded window: the
    /// [module docs](crate::pretokenize)).
    pub fn of(pattern: Pattern) -> Option<&'static StateMachine> {
        match pattern {
            Pattern::Gpt2 => None,
            Pattern::Cl100k => Some(&CL100K),
            Pattern::O200k => Some(&O200K),
        }
    }

    /// Number of states.
    pub fn states(&self) -> u32 {
        self.names.len() as u32
    }

    /// The state of a character where a piece starts.
    pub fn start(&self, window: &StateWindow) -> u8 {
        self.start_where(&|condition| condition.holds(window))
    }

    /// [`StateMachine::start`] where `holds` says which conditions hold.
    pub fn start_where(&self, holds: &dyn Fn(&Condition) -> bool) -> u8 {
        self.starts
            .iter()
            .find(|rule| holds(&rule.when))
            .map_or(STOP, |rule| rule.next)
    }

    /// The state of a character whose predecessor has state `previous`, and
    /// whether a piece starts at it.
    pub fn step(&self, previous: u8, window: &StateWindow) -> (u8, bool) {
        self.step_where(previous, &|condition| condition.holds(window))
    }

    /// [`StateMachine::step`] where `holds` says which conditions hold.
    pub fn step_where(&self, previous: u8, holds: &dyn Fn(&Condition) -> bool) -> (u8, bool) {
        let rules = self
            .continues
            .get(previous as usize)
            .copied()
            .unwrap_or(&[]);
        match rules.iter().find(|rule| holds(&rule.when)) {
            Some(rule) => (rule.next, false),
            None => (self.start_where(holds), true),
        }
    }

    /// What a device computes for one character: its transition map and its
    /// start bits. A character that starts a document starts a piece whatever
    /// came before (pass `document_start`).
    pub fn character_word(&self, window: &StateWindow, document_start: bool) -> CharacterWord {
        self.character_word_where(&|condition| condition.holds(window), document_start)
    }

    /// [`StateMachine::character_word`] where `holds` says which conditions hold.
    pub fn character_word_where(
        &self,
        holds: &dyn Fn(&Condition) -> bool,
        document_start: bool,
    ) -> CharacterWord {
        let mut word = CharacterWord { map: 0, starts: 0 };
        for previous in 0..MAX_STATES as u8 {
            let (next, starts) = if document_start {
                (self.start_where(holds), true)
            } else {
                self.step_where(previous, holds)
            };
            word.map |= u32::from(next) << (SLOT_BITS * u32::from(previous));
            word.starts |= u8::from(starts) << previous;
        }
        word
    }

    /// Every rule's condition, start rules first.
    pub fn conditions(&self) -> impl Iterator<Item = &'static Condition> {
        self.starts
            .iter()
            .chain(self.continues.iter().flat_map(|rules| rules.iter()))
            .map(|rule| &rule.when)
    }
}

/// What one character does, for every state the character before can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CharacterWord {
    /// The transition map: the state the character gets after one of state `s`.
    pub map: u32,
    /// Bit `s`: a piece starts at the character after one of state `s`.
    pub starts: u8,
}

/// Bits of one state's slot in a transition map: a nibble whose low three bits
/// hold the state it sends slot `s`'s state to (the high bit is always clear).
///
/// Three bits would do, and once did (24 bits a map), but composing such maps
/// took eight shifts-and-masks per state, about 48 instructions, which on the
/// H200 (Nsight Compute, 2026-12-03, 8 MiB of prose) were about 35 % of the
/// `phases` step's warp samples. With nibbles a map is a selector for a byte
/// permute (`Expr::permute_bytes`, PTX `prmt`): composing is two permutes and
/// the conversions between nibbles and bytes, about 16 instructions.
pub const SLOT_BITS: u32 = 4;

/// Bits of a transition map (eight slots of [`SLOT_BITS`]).
pub const MAP_BITS: u32 = MAX_STATES * SLOT_BITS;

/// The map that sends every state to itself (a byte that starts no character).
pub const IDENTITY_MAP: u32 = {
    let mut map = 0;
    let mut state = 0;
    while state < MAX_STATES {
        map |= state << (SLOT_BITS * state);
        state += 1;
    }
    map
};

/// The map that sends every state to `state`.
pub const fn constant_map(state: u32) -> u32 {
    // A 1 at the bottom of every slot.
    (state & (MAX_STATES - 1)) * 0x1111_1111
}

/// The state `map` sends `state` to.
pub fn apply(map: u32, state: u8) -> u8 {
    ((map >> (SLOT_BITS * u32::from(state))) & (MAX_STATES - 1)) as u8
}

/// `first` then `then`: the map of two stretches of text in order.
pub fn compose(first: u32, then: u32) -> u32 {
    let mut map = 0;
    for state in 0..MAX_STATES as u8 {
        map |= u32::from(apply(then, apply(first, state))) << (SLOT_BITS * u32::from(state));
    }
    map
}

const LINE_BREAK: KindSet = KindSet::LINE_BREAK;
const APOSTROPHE: KindSet = KindSet::of(&[Kind::Apostrophe]);
const SPACE: KindSet = KindSet::of(&[Kind::Space]);

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` starts here.
const CONTRACTION_HERE: Condition = Condition::All(&[
    Condition::Kind(Field::Here, APOSTROPHE),
    Condition::Any(&[
        Condition::Kind(Field::After, KindSet::CONTRACTION_STMD),
        Condition::All(&[
            Condition::Kind(Field::After, KindSet::CONTRACTION_RV),
            Condition::Kind(Field::After2, KindSet::CONTRACTION_E),
        ]),
        Condition::All(&[
            Condition::Kind(Field::After, KindSet::CONTRACTION_L),
            Condition::Kind(Field::After2, KindSet::CONTRACTION_L),
        ]),
    ]),
]);

/// The character after a contraction's `'`, or its second letter after `r`,
/// `v` or `l`: the contraction goes on.
const CONTRACTION_GOES_ON: Condition = Condition::Any(&[
    Condition::Kind(Field::Before, APOSTROPHE),
    Condition::All(&[
        Condition::Kind(Field::Before2, APOSTROPHE),
        Condition::Kind(
            Field::Before,
            KindSet::CONTRACTION_RV.union(KindSet::CONTRACTION_L),
        ),
    ]),
]);

/// `\s*[\r\n]+` goes on while `break_ahead` holds; `\s+(?!\S)` up to the last
/// white space before a character that is not white space. Which of the two the
/// piece is, `break_ahead` at the character before says.
const WHITE_GOES_ON: [Condition; 2] = [
    Condition::All(&[
        Condition::Fact(Fact::BreakAheadBefore),
        Condition::Kind(Field::Here, KindSet::WHITE_SPACE),
        Condition::Fact(Fact::BreakAhead),
    ]),
    Condition::All(&[
        Condition::Not(&Condition::Fact(Fact::BreakAheadBefore)),
        Condition::Kind(Field::Here, KindSet::WHITE_SPACE),
        Condition::Kind(Field::After, KindSet::WHITE_SPACE.union(END)),
    ]),
];

/// The rules both machines share, for their own state numbers and
/// punctuation tail: a contraction or a punctuation piece's tail (which of the
/// two, the character before says), digit groups of three, punctuation runs,
/// white space, and where a piece starts at anything but a letter or mark.
macro_rules! shared_rules {
    (
        tail: $tail:expr,
        contraction_or_tail: $contraction_or_tail:expr,
        first_digit: $first_digit:expr,
        second_digit: $second_digit:expr,
        other_run: $other_run:expr,
        white: $white:expr $(,)?
    ) => {
        pub const CONTRACTION_OR_TAIL_RULES: [Rule; 2] = [
            Rule {
                when: Condition::All(&[
                    Condition::Kind(Field::Before, $tail),
                    Condition::Kind(Field::Here, $tail),
                ]),
                next: $contraction_or_tail,
            },
            Rule {
                when: Condition::All(&[
                    Condition::Not(&Condition::Kind(Field::Before, $tail)),
                    CONTRACTION_GOES_ON,
                ]),
                next: $contraction_or_tail,
            },
        ];
        pub const FIRST_DIGIT_RULES: [Rule; 1] = [Rule {
            when: Condition::Kind(Field::Here, KindSet::NUMBER),
            next: $second_digit,
        }];
        pub const SECOND_DIGIT_RULES: [Rule; 1] = [Rule {
            when: Condition::Kind(Field::Here, KindSet::NUMBER),
            next: STOP,
        }];
        pub const OTHER_RUN_RULES: [Rule; 2] = [
            Rule {
                when: Condition::Kind(Field::Here, KindSet::OTHER),
                next: $other_run,
            },
            Rule {
                when: Condition::Kind(Field::Here, $tail),
                next: $contraction_or_tail,
            },
        ];
        pub const WHITE_RULES: [Rule; 2] = [
            Rule {
                when: WHITE_GOES_ON[0],
                next: $white,
            },
            Rule {
                when: WHITE_GOES_ON[1],
                next: $white,
            },
        ];
        /// `\p{N}{1,3}| ?[^\s\p{L}\p{N}]+...|\s*[\r\n]+|\s+(?!\S)|\s+`.
        pub const NON_LETTER_STARTS: [Rule; 4] = [
            Rule {
                when: Condition::Kind(Field::Here, KindSet::NUMBER),
                next: $first_digit,
            },
            Rule {
                when: Condition::All(&[
                    Condition::Kind(Field::Here, SPACE),
                    Condition::Kind(Field::After, KindSet::OTHER),
                ]),
                next: $other_run,
            },
            Rule {
                when: Condition::Kind(Field::Here, KindSet::OTHER),
                next: $other_run,
            },
            Rule {
                when: Condition::Always,
                next: $white,
            },
        ];
    };
}

/// `first` then `second`, as one array of `N = A + B` rules.
const fn joined<const A: usize, const B: usize, const N: usize>(
    first: [Rule; A],
    second: [Rule; B],
) -> [Rule; N] {
    assert!(A + B == N, "joined rules: N must be A + B");
    let mut out = [Rule {
        when: Condition::Always,
        next: STOP,
    }; N];
    let mut index = 0;
    while index < A {
        out[index] = first[index];
        index += 1;
    }
    while index < N {
        out[index] = second[index - A];
        index += 1;
    }
    out
}

mod cl100k {
    use super::*;
    pub const CONTRACTION_OR_TAIL: u8 = 1;
    pub const LETTERS: u8 = 2;
    pub const FIRST_DIGIT: u8 = 3;
    pub const SECOND_DIGIT: u8 = 4;
    pub const OTHER_RUN: u8 = 5;
    pub const WHITE: u8 = 6;
    shared_rules! {
        tail: LINE_BREAK,
        contraction_or_tail: CONTRACTION_OR_TAIL,
        first_digit: FIRST_DIGIT,
        second_digit: SECOND_DIGIT,
        other_run: OTHER_RUN,
        white: WHITE,
    }
    pub const LETTERS_RULES: [Rule; 1] = [Rule {
        when: Condition::Kind(Field::Here, KindSet::LETTER),
        next: LETTERS,
    }];
    /// `(?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+`, then the rest.
    pub const STARTS: [Rule; 7] = joined(
        [
            Rule {
                when: CONTRACTION_HERE,
                next: CONTRACTION_OR_TAIL,
            },
            Rule {
                when: Condition::Kind(Field::Here, KindSet::LETTER),
                next: LETTERS,
            },
            Rule {
                when: Condition::All(&[
                    Condition::Kind(Field::Here, KindSet::PREFIX),
                    Condition::Kind(Field::After, KindSet::LETTER),
                ]),
                next: LETTERS,
            },
        ],
        NON_LETTER_STARTS,
    );
}

/// cl100k's machine (see the module docs for the merges).
pub static CL100K: StateMachine = StateMachine {
    pattern: Pattern::Cl100k,
    names: &[
        "Stop",
        "ContractionOrTail",
        "Letters",
        "FirstDigit",
        "SecondDigit",
        "OtherRun",
        "White",
    ],
    continues: &[
        &[],
        &cl100k::CONTRACTION_OR_TAIL_RULES,
        &cl100k::LETTERS_RULES,
        &cl100k::FIRST_DIGIT_RULES,
        &cl100k::SECOND_DIGIT_RULES,
        &cl100k::OTHER_RUN_RULES,
        &cl100k::WHITE_RULES,
    ],
    starts: &cl100k::STARTS,
};

mod o200k {
    use super::*;
    pub const CONTRACTION_OR_TAIL: u8 = 1;
    pub const UPPER: u8 = 2;
    pub const LOWER: u8 = 3;
    pub const FIRST_DIGIT: u8 = 4;
    pub const SECOND_DIGIT: u8 = 5;
    pub const OTHER_RUN: u8 = 6;
    pub const WHITE: u8 = 7;
    shared_rules! {
        tail: KindSet::LINE_BREAK_OR_SLASH,
        contraction_or_tail: CONTRACTION_OR_TAIL,
        first_digit: FIRST_DIGIT,
        second_digit: SECOND_DIGIT,
        other_run: OTHER_RUN,
        white: WHITE,
    }
    pub const UPPER_RULES: [Rule; 4] = [
        Rule {
            when: Condition::Kind(Field::Here, KindSet::LOWER_CASE),
            next: LOWER,
        },
        Rule {
            when: Condition::Kind(Field::Here, KindSet::CASELESS),
            next: UPPER,
        },
        // An upper-case letter after a caseless one, in a run that is upper
        // case to its end: the first alternative backtracks to after the
        // caseless one, so a piece starts here.
        Rule {
            when: Condition::All(&[
                Condition::Kind(Field::Here, KindSet::UPPER_CASE),
                Condition::Not(&Condition::All(&[
                    Condition::Kind(Field::Before, KindSet::CASELESS),
                    Condition::Fact(Fact::UpperToEnd),
                ])),
            ]),
            next: UPPER,
        },
        Rule {
            when: CONTRACTION_HERE,
            next: CONTRACTION_OR_TAIL,
        },
    ];
    pub const LOWER_RULES: [Rule; 2] = [
        Rule {
            when: Condition::Kind(Field::Here, KindSet::O200K_LOWER),
            next: LOWER,
        },
        Rule {
            when: CONTRACTION_HERE,
            next: CONTRACTION_OR_TAIL,
        },
    ];
    /// The two letter alternatives (their optional first character included),
    /// then the rest.
    pub const STARTS: [Rule; 7] = joined(
        [
            Rule {
                when: Condition::Kind(Field::Here, KindSet::LOWER_CASE),
                next: LOWER,
            },
            Rule {
                when: Condition::Kind(Field::Here, KindSet::WORD),
                next: UPPER,
            },
            Rule {
                when: Condition::All(&[
                    Condition::Kind(Field::Here, KindSet::PREFIX),
                    Condition::Kind(Field::After, KindSet::WORD),
                ]),
                next: UPPER,
            },
        ],
        NON_LETTER_STARTS,
    );
}

/// o200k's machine (see the module docs for the merges).
pub static O200K: StateMachine = StateMachine {
    pattern: Pattern::O200k,
    names: &[
        "Stop",
        "ContractionOrTail",
        "Upper",
        "Lower",
        "FirstDigit",
        "SecondDigit",
        "OtherRun",
        "White",
    ],
    continues: &[
        &[],
        &o200k::CONTRACTION_OR_TAIL_RULES,
        &o200k::UPPER_RULES,
        &o200k::LOWER_RULES,
        &o200k::FIRST_DIGIT_RULES,
        &o200k::SECOND_DIGIT_RULES,
        &o200k::OTHER_RUN_RULES,
        &o200k::WHITE_RULES,
    ],
    starts: &o200k::STARTS,
};

/// The byte offset of every piece start of `text` by the state machine of
/// `pattern` (cl100k or o200k; GPT-2 is an `Err`): [`machine_piece_starts`].
pub fn piece_starts(pattern: Pattern, text: &[u8]) -> Result<Vec<u32>, PretokenizeError> {
    let machine = StateMachine::of(pattern).ok_or_else(|| {
        PretokenizeError::new(format!(
            "Fix: the {} split has no state machine (its device rule is per byte); use cl100k or o200k",
            pattern.name()
        ))
    })?;
    machine_piece_starts(machine, text)
}

/// The byte offset of every piece start of `text` by `machine`: the characters
/// and facts of [`per_position::windows`], one [`StateMachine::character_word`]
/// each, run from [`STOP`] exactly as the device runs the words. Allocates per
/// character; the fast CPU split is
/// [`Splitter`](crate::pretokenize::pattern::Splitter).
pub fn machine_piece_starts(
    machine: &StateMachine,
    text: &[u8],
) -> Result<Vec<u32>, PretokenizeError> {
    let mut starts = Vec::new();
    let mut state = STOP;
    for (offset, window) in state_windows(text)? {
        let word = machine.character_word(&window, offset == 0);
        let starts_here = (word.starts >> state) & 1 == 1;
        state = apply(word.map, state);
        if starts_here {
            starts.push(offset);
        }
    }
    Ok(starts)
}

/// Every character of `text` with its byte offset and its window as a machine
/// sees it ([`per_position::windows`], with `break_ahead` at the character
/// before).
pub fn state_windows(text: &[u8]) -> Result<Vec<(u32, StateWindow)>, PretokenizeError> {
    let mut break_ahead_before = false;
    Ok(per_position::windows(text)?
        .into_iter()
        .map(|(offset, window)| {
            let seen = StateWindow {
                kinds: [
                    window.before2,
                    window.before,
                    window.here,
                    window.after,
                    window.after2,
                ],
                break_ahead: window.break_ahead,
                break_ahead_before,
                upper_to_end: window.upper_to_end,
            };
            break_ahead_before = window.break_ahead;
            (offset, seen)
        })
        .collect())
}
