//! A state machine's character words as a table: what the `phases` step looks
//! up, once per byte, instead of evaluating every rule of every state.
//!
//! # Why
//!
//! A character's [word](super::rules::CharacterWord) is a function of five kind
//! codes (two characters before it, itself, two after) and two or three facts.
//! Evaluated as IR (every condition of every state's rules, then eight selects
//! into the map) it was about 40 % of the `phases` program's instructions: 1,552
//! of 3,936 SASS instructions for cl100k's blocks of 1,024 threads × 8 bytes
//! (ptxas for sm_90, 2026-12-03), and it held enough registers that ptxas
//! spilled 60 bytes a thread. A table answers in two loads.
//!
//! # Why it is small
//!
//! A rule never asks which kind a character has, only whether it is in some
//! set: at each field only the sets the machine's conditions test there matter,
//! and kind codes in the same sets behave alike. So each field's 32 codes fall
//! into a few *classes* (cl100k: 2, 4, 8, 7 and 3 for the five fields; o200k 2,
//! 5, 12, 8 and 3), and the table holds one word per combination of classes
//! and facts: 5,376 entries for cl100k (42 KiB), 23,040 for o200k (180 KiB),
//! resident after the kind table in the same buffer, read through the L1.
//!
//! # Layout (`u32` words, from the table's first word `F` in the buffer)
//!
//! - Words `F + 32·f + c` (`f` a field, `c` a kind code 0..32): the offset of
//!   code `c`'s class at field `f`, already multiplied by the field's stride
//!   (field 0's offsets also hold the entries' first word, so the offsets add up
//!   to the entry's word index in the buffer).
//! - Entries, two words each: the map, then the start bits (bits 0..8) and the
//!   state a piece starting there takes (bits 8..11). A character that starts a
//!   document takes the constant map of that state and every start bit.
//!
//! The fact bits of an entry index (times two, the entry's words) follow
//! [`WordTable::facts`]' order.
//!
//! A class's members are decided by the device's own set test (bit `c` of the
//! set's mask, `KindSet::bits`), so codes that are no kind (a byte inside a
//! character) fall where the rules evaluated as IR put them.

use super::rules::{constant_map, CharacterWord, Condition, Fact, Field, StateMachine};
use crate::pretokenize::unicode::KindSet;

/// Kind codes per field: every code the five bits of a byte code can hold.
pub const CODES: u32 = 32;

/// Fields of a character's window.
pub const FIELDS: u32 = 5;

/// Words of the offsets before the entries.
pub const OFFSET_WORDS: u32 = FIELDS * CODES;

/// Every fact a machine may ask for, in the order their bits take.
const FACTS: [Fact; 3] = [Fact::BreakAhead, Fact::BreakAheadBefore, Fact::UpperToEnd];

/// One field's classes: each code's class, and one code of each class.
struct Classes {
    of_code: [u32; CODES as usize],
    representatives: Vec<u32>,
}

impl Classes {
    /// The classes of the codes at a field whose conditions test `sets`.
    fn of(sets: &[KindSet]) -> Classes {
        let signature = |code: u32| -> Vec<bool> {
            sets.iter()
                .map(|set| (set.bits() >> code) & 1 == 1)
                .collect()
        };
        let mut signatures: Vec<Vec<bool>> = Vec::new();
        let mut representatives = Vec::new();
        let mut of_code = [0; CODES as usize];
        for code in 0..CODES {
            let own = signature(code);
            let class = match signatures.iter().position(|known| *known == own) {
                Some(class) => class,
                None => {
                    signatures.push(own);
                    representatives.push(code);
                    signatures.len() - 1
                }
            };
            of_code[code as usize] = class as u32;
        }
        Classes {
            of_code,
            representatives,
        }
    }

    fn count(&self) -> u32 {
        self.representatives.len() as u32
    }
}

/// A machine's word table ([module docs](self)).
pub struct WordTable {
    machine: &'static StateMachine,
    first_word: u32,
    words: Vec<u32>,
    facts: Vec<Fact>,
}

impl WordTable {
    /// The table of `machine`, to be stored from word `first_word` of its buffer.
    pub fn build(machine: &'static StateMachine, first_word: u32) -> WordTable {
        let mut sets: [Vec<KindSet>; FIELDS as usize] = Default::default();
        let mut asked = Vec::new();
        for condition in machine.conditions() {
            condition.visit(&mut |test| match *test {
                Condition::Kind(field, set) => sets[field as usize].push(set),
                Condition::Fact(fact) => asked.push(fact),
                _ => {}
            });
        }
        let facts: Vec<Fact> = FACTS
            .into_iter()
            .filter(|fact| asked.contains(fact))
            .collect();
        let classes: Vec<Classes> = sets.iter().map(|sets| Classes::of(sets)).collect();
        // Entries in field order, the facts last: stride of field f in entries.
        let mut strides = [0u32; FIELDS as usize];
        let mut stride = 1u32 << facts.len();
        for field in (0..FIELDS as usize).rev() {
            strides[field] = stride;
            stride *= classes[field].count();
        }
        let entries = stride;
        let first_entry_word = first_word + OFFSET_WORDS;
        let mut words = Vec::with_capacity((OFFSET_WORDS + 2 * entries) as usize);
        for (field, classes) in classes.iter().enumerate() {
            let base = if field == 0 { first_entry_word } else { 0 };
            words.extend(
                classes
                    .of_code
                    .iter()
                    .map(|&class| base + 2 * class * strides[field]),
            );
        }
        for entry in 0..entries {
            let class_at = |field: usize| (entry / strides[field]) % classes[field].count();
            let codes: Vec<u32> = (0..FIELDS as usize)
                .map(|field| classes[field].representatives[class_at(field) as usize])
                .collect();
            let fact_bits = entry % (1 << facts.len());
            let in_set =
                |field: Field, set: KindSet| (set.bits() >> codes[field as usize]) & 1 == 1;
            let fact = |which: Fact| {
                facts
                    .iter()
                    .position(|&fact| fact == which)
                    .is_some_and(|bit| (fact_bits >> bit) & 1 == 1)
            };
            let holds = |condition: &Condition| condition.holds_where(&in_set, &fact);
            let word = machine.character_word_where(&holds, false);
            let start = machine.start_where(&holds);
            words.push(word.map);
            words.push(u32::from(word.starts) | u32::from(start) << START_STATE_SHIFT);
        }
        WordTable {
            machine,
            first_word,
            words,
            facts,
        }
    }

    /// The word of its buffer the table is built to be stored from (its
    /// offsets hold entry indexes in that buffer).
    pub fn first_word(&self) -> u32 {
        self.first_word
    }

    /// The machine the table answers for.
    pub fn machine(&self) -> &'static StateMachine {
        self.machine
    }

    /// The table's words: the offsets, then the entries.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The word the device looks up for a character whose fields have the kind
    /// codes `codes` (0..32 each) and whose facts are `facts` (`break_ahead`,
    /// `break_ahead_before`, `upper_to_end`), the table stored from
    /// [`WordTable::first_word`]: the same additions and loads as the `phases`
    /// program, on the CPU.
    pub fn lookup(
        &self,
        codes: [u32; FIELDS as usize],
        facts: [bool; 3],
        document_start: bool,
    ) -> CharacterWord {
        let first_word = self.first_word;
        let word = |index: u32| self.words[(index - first_word) as usize];
        let mut index = 0;
        for (field, &code) in codes.iter().enumerate() {
            index += word(first_word + field as u32 * CODES + code % CODES);
        }
        for (bit, fact) in self.facts.iter().enumerate() {
            let position = FACTS.iter().position(|known| known == fact).unwrap_or(0);
            index += u32::from(facts[position]) << (bit + 1);
        }
        let (map, extra) = (word(index), word(index + 1));
        if document_start {
            let start = extra >> START_STATE_SHIFT;
            return CharacterWord {
                map: constant_map(start),
                starts: u8::MAX,
            };
        }
        CharacterWord {
            map,
            starts: extra as u8,
        }
    }

    /// The facts an entry index holds, bit 0 first.
    pub fn facts(&self) -> &[Fact] {
        &self.facts
    }
}

/// Where an entry's second word keeps the state a piece starting there takes.
pub const START_STATE_SHIFT: u32 = 8;
