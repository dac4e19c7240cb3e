//! The three splits as a rule evaluated at each character position: the second
//! formulation, and the plan for the GPU programs of cl100k and o200k.
//!
//! # Why this module exists
//!
//! The CPU [`Splitter`](super::pattern::Splitter) walks the text piece by piece,
//! as a regex engine does. A GPU decides every position at once, so it needs the
//! split stated as "a piece starts at character `i` iff ..." in terms of facts it
//! can compute in parallel. This module states it that way and runs it on the
//! CPU; the tests hold it, the sequential splitter and `fancy-regex` to the same
//! piece starts, so the rule a later GPU program implements is already checked.
//!
//! # The rule
//!
//! Every character has a [`Phase`]: the part of the pattern it is matched by
//! (the optional first character of a letter piece, the letters, the first digit
//! of a group of three, a run of punctuation, ...). The phase of character `i`
//! is
//!
//! ```text
//! phase[i] = continues(phase[i - 1], window[i])     if that is Some
//!          = starts(window[i])                      otherwise: a piece starts at i
//! ```
//!
//! ([`continues`], [`starts`]; character 0 follows [`Phase::Begin`], which nothing
//! continues). `starts` looks only at the text from `i` on, because a regex match
//! starting at `i` depends on nothing before it. `window[i]` ([`Window`]) holds:
//!
//! - the kinds ([`Kind`]) of characters `i - 2 ..= i + 2` (`Kind::End` outside
//!   the text) and the code points of `i + 1` and `i + 2` (GPT-2's contractions
//!   are case-sensitive ASCII);
//! - two facts about the text after `i` that no bounded window holds:
//!   - `break_ahead`: the first character at or after `i` that is not white space
//!     other than `\r`/`\n` is `\r` or `\n` (`\s*[\r\n]+` runs to the last line
//!     break of a white-space run, however far);
//!   - `upper_to_end`: the first character at or after `i` that is not `Lu`/`Lt`
//!     is not a letter or mark either, or is past the end (o200k: a letter run
//!     that is all upper case from here on cannot give a lower-case class a
//!     character, so its first alternative backtracks to before `i`).
//!
//! Both are "find the next character outside a set, test it": a reverse scan, or
//! a minimum scan of positions on a device.
//!
//! What only the phase carries from arbitrarily far back: the count of digits in
//! the current group (`\p{N}{1,3}` counts from the start of the number run);
//! whether a mark, `/`, `\r` or `\n` belongs to a run of punctuation or to a
//! letter piece (o200k puts a mark after a punctuation run into that run, but a
//! mark after a single punctuation character that starts a piece into a letter
//! piece with that character first: `..\u{301}a` is two pieces, `.\u{301}a`
//! one; cl100k's and o200k's punctuation pieces take the line breaks, and
//! o200k's the `/`, after them); and whether a caseless character of o200k (Lm,
//! Lo, M) comes before or after its piece's first lower-case letter.
//!
//! # On a device
//!
//! 1. Decode each character and look its kind up in the resident
//!    [`KindTable`](super::unicode::KindTable) (the five ASCII characters the
//!    patterns name by their byte).
//! 2. The two look-ahead facts: a minimum scan, from the right, of the
//!    positions of characters outside the set (white space other than a line
//!    break; Lu/Lt), then one test of the character found.
//! 3. Per position, the transition map `previous phase -> phase` from the
//!    window: [`Phase::COUNT`] = 16 phases of 4 bits, so one map is one `u64`.
//! 4. A parallel prefix of the maps (composing two is 16 nibble lookups) gives
//!    every phase; a piece starts where [`continues`] gave `None`, and the
//!    compaction is GPT-2's.
//!
//! GPT-2 needs only the bounded window (its GPU rule is per byte, in the
//! [parent module's docs](super)); cl100k needs the digit count, the
//! punctuation run's `[\r\n]*` tail and `break_ahead`; o200k needs all of it.
//! The phases each pattern uses, and what continues them, are in [`Phase`]'s
//! documentation.
//!
//! ```
//! use vyre_tokenizer::pretokenize::pattern::{piece_starts, Pattern};
//! use vyre_tokenizer::pretokenize::per_position;
//! for text in ["..\u{301}a .\u{301}a", "ABC日本DEF ABC日本DEFghi", "x \n\t\n  y"] {
//!     let text = text.as_bytes();
//!     for pattern in Pattern::ALL {
//!         let by_rule = per_position::piece_starts(pattern, text).unwrap();
//!         assert_eq!(by_rule, piece_starts(pattern, text).unwrap());
//!     }
//! }
//! ```

use super::cpu::code_points;
use super::pattern::Pattern;
use super::unicode::{kind_table, Kind, KindSet};
use super::PretokenizeError;

/// The part of the pattern a character is matched by. The variants list which
/// characters continue each phase ([`continues`]); where a phase starts is
/// [`starts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Phase {
    /// Before the first character: nothing continues it.
    Begin = 0,
    /// A contraction (`'s`, `'re`, ...; GPT-2 and cl100k alone, o200k after a
    /// letter piece): continued by the one or two letters it was started for
    /// (the character after `'`, and the one after that if that was `r`, `v`
    /// or `l`).
    Contraction = 1,
    /// GPT-2's ` ?` before a letter, number or other run: continued by any
    /// character (it started only before one that is not white space).
    SpacePrefix = 2,
    /// cl100k's and o200k's optional first character `[^\r\n\p{L}\p{N}]` of a
    /// letter piece: continued by the letter (or mark) it was started for.
    Prefix = 3,
    /// A letter run of GPT-2 or cl100k: continued by `\p{L}`.
    Letters = 4,
    /// o200k's `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` run: continued by Ll (which
    /// goes to [`Phase::Lower`]), by Lm, Lo and M, by Lu and Lt unless the
    /// character before is Lm, Lo or M and `upper_to_end` holds (the match then
    /// ends after that last caseless character), and by a contraction.
    Upper = 5,
    /// o200k's `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` run: continued by those and by a
    /// contraction.
    Lower = 6,
    /// GPT-2's number run: continued by `\p{N}`.
    Numbers = 7,
    /// The first number of a `\p{N}{1,3}` group: continued by `\p{N}`.
    FirstDigit = 8,
    /// The second: continued by `\p{N}`.
    SecondDigit = 9,
    /// The third: continued by nothing.
    ThirdDigit = 10,
    /// The ` ?` before a punctuation run (cl100k, o200k): continued by the
    /// punctuation it was started for.
    OtherSpace = 11,
    /// A run of `[^\s\p{L}\p{N}]` (marks included): continued by more, and by
    /// `\r` or `\n` (cl100k, o200k), which go to [`Phase::OtherTail`].
    OtherRun = 12,
    /// The `[\r\n]*` (cl100k) or `[\r\n/]*` (o200k) after a punctuation run:
    /// continued by those characters.
    OtherTail = 13,
    /// `\s*[\r\n]+` (cl100k, o200k): continued by white space while
    /// `break_ahead` holds.
    Breaks = 14,
    /// `\s+(?!\S)` or `\s+`: continued by white space unless the next character
    /// exists and is not white space (the last white space before a
    /// non-white-space character starts the next piece).
    Spaces = 15,
}

impl Phase {
    /// Number of phases (4 bits).
    pub const COUNT: usize = 16;
}

/// What the rule reads at one character position: see the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Kind of the character two before (`Kind::End` if none).
    pub before2: Kind,
    /// Kind of the character before.
    pub before: Kind,
    /// Kind of this character.
    pub here: Kind,
    /// Kind of the next character (`Kind::End` if none).
    pub after: Kind,
    /// Kind of the character after that.
    pub after2: Kind,
    /// Code point of the next character (0 if none).
    pub after_code: u32,
    /// Code point of the character after that (0 if none).
    pub after2_code: u32,
    /// The first character at or after this one that is not white space other
    /// than `\r` or `\n` is `\r` or `\n`.
    pub break_ahead: bool,
    /// The first character at or after this one that is not Lu or Lt is not a
    /// letter or mark, or there is none.
    pub upper_to_end: bool,
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at this position.
fn contraction_here(window: &Window) -> bool {
    window.here == Kind::Apostrophe
        && (KindSet::CONTRACTION_STMD.contains(window.after)
            || (KindSet::CONTRACTION_RV.contains(window.after)
                && KindSet::CONTRACTION_E.contains(window.after2))
            || (KindSet::CONTRACTION_L.contains(window.after)
                && KindSet::CONTRACTION_L.contains(window.after2)))
}

/// GPT-2's case-sensitive `'s|'t|'re|'ve|'m|'ll|'d` at this position.
fn gpt2_contraction_here(window: &Window) -> bool {
    let letter = |code: u32| char::from_u32(code).unwrap_or('\0');
    window.here == Kind::Apostrophe
        && matches!(
            (letter(window.after_code), letter(window.after2_code)),
            ('s' | 't' | 'm' | 'd', _) | ('r' | 'v', 'e') | ('l', 'l')
        )
}

/// The characters a punctuation run's tail takes.
fn tail(pattern: Pattern) -> KindSet {
    match pattern {
        Pattern::O200k => KindSet::LINE_BREAK_OR_SLASH,
        Pattern::Cl100k => KindSet::LINE_BREAK,
        Pattern::Gpt2 => KindSet::NONE,
    }
}

/// The phase of a character that continues the piece of the character before
/// it (whose phase is `previous`), or `None` where a piece starts here.
pub fn continues(pattern: Pattern, previous: Phase, window: &Window) -> Option<Phase> {
    let here = window.here;
    let is = |set: KindSet| set.contains(here);
    match previous {
        Phase::Begin | Phase::ThirdDigit => None,
        Phase::Contraction => {
            let second = window.before == Kind::Apostrophe;
            let third = window.before2 == Kind::Apostrophe
                && KindSet::CONTRACTION_RV
                    .union(KindSet::CONTRACTION_L)
                    .contains(window.before);
            (second || third).then_some(Phase::Contraction)
        }
        Phase::SpacePrefix => Some(if is(KindSet::LETTER) {
            Phase::Letters
        } else if is(KindSet::NUMBER) {
            Phase::Numbers
        } else {
            Phase::OtherRun
        }),
        Phase::Prefix => Some(match pattern {
            Pattern::O200k if is(KindSet::LOWER_CASE) => Phase::Lower,
            Pattern::O200k => Phase::Upper,
            _ => Phase::Letters,
        }),
        Phase::Letters => is(KindSet::LETTER).then_some(Phase::Letters),
        Phase::Upper => {
            if is(KindSet::LOWER_CASE) {
                Some(Phase::Lower)
            } else if is(KindSet::CASELESS) {
                Some(Phase::Upper)
            } else if is(KindSet::UPPER_CASE) {
                let backtracked = KindSet::CASELESS.contains(window.before) && window.upper_to_end;
                (!backtracked).then_some(Phase::Upper)
            } else {
                contraction_here(window).then_some(Phase::Contraction)
            }
        }
        Phase::Lower => {
            if is(KindSet::O200K_LOWER) {
                Some(Phase::Lower)
            } else {
                contraction_here(window).then_some(Phase::Contraction)
            }
        }
        Phase::Numbers => is(KindSet::NUMBER).then_some(Phase::Numbers),
        Phase::FirstDigit => is(KindSet::NUMBER).then_some(Phase::SecondDigit),
        Phase::SecondDigit => is(KindSet::NUMBER).then_some(Phase::ThirdDigit),
        Phase::OtherSpace => Some(Phase::OtherRun),
        Phase::OtherRun => {
            if is(KindSet::OTHER) {
                Some(Phase::OtherRun)
            } else {
                is(tail(pattern)).then_some(Phase::OtherTail)
            }
        }
        Phase::OtherTail => is(tail(pattern)).then_some(Phase::OtherTail),
        Phase::Breaks => (is(KindSet::WHITE_SPACE) && window.break_ahead).then_some(Phase::Breaks),
        Phase::Spaces => {
            let last_before_text =
                window.after != Kind::End && !KindSet::WHITE_SPACE.contains(window.after);
            (is(KindSet::WHITE_SPACE) && !last_before_text).then_some(Phase::Spaces)
        }
    }
}

/// The phase of a character where a piece starts: the pattern's first
/// alternative that matches here, and which of its parts takes this character.
/// It reads only this character and what follows (`here`, `after`, `after2`,
/// their codes, `break_ahead`), in this order:
///
/// | pattern | phase | where |
/// |---|---|---|
/// | GPT-2 | `Contraction` | `'` then `s t m d`, or `re ve ll` (ASCII, case-sensitive) |
/// | GPT-2 | `SpacePrefix` | U+0020 before a character that is not white space |
/// | GPT-2 | `Letters`, `Numbers`, `OtherRun` | a letter, a number, anything else but white space |
/// | cl100k | `Contraction` | `'` then a case fold of `s t m d`, or of `re ve ll` |
/// | cl100k | `Letters` | a letter |
/// | cl100k | `Prefix` | `[^\r\n\p{L}\p{N}]` before a letter |
/// | o200k | `Lower`, `Upper` | an Ll letter; any other letter or a mark |
/// | o200k | `Prefix` | `[^\r\n\p{L}\p{N}]` before a letter or mark |
/// | cl100k, o200k | `FirstDigit` | a number |
/// | cl100k, o200k | `OtherSpace` | U+0020 before punctuation |
/// | cl100k, o200k | `OtherRun` | punctuation |
/// | cl100k, o200k | `Breaks` | white space with `break_ahead` |
/// | all | `Spaces` | any other white space |
pub fn starts(pattern: Pattern, window: &Window) -> Phase {
    let here = window.here;
    let is = |set: KindSet| set.contains(here);
    let before_non_space =
        window.after != Kind::End && !KindSet::WHITE_SPACE.contains(window.after);
    let white_space = if window.break_ahead && pattern != Pattern::Gpt2 {
        Phase::Breaks
    } else {
        Phase::Spaces
    };
    match pattern {
        Pattern::Gpt2 => {
            if gpt2_contraction_here(window) {
                Phase::Contraction
            } else if here == Kind::Space && before_non_space {
                Phase::SpacePrefix
            } else if is(KindSet::LETTER) {
                Phase::Letters
            } else if is(KindSet::NUMBER) {
                Phase::Numbers
            } else if is(KindSet::OTHER) {
                Phase::OtherRun
            } else {
                white_space
            }
        }
        Pattern::Cl100k => {
            if contraction_here(window) {
                Phase::Contraction
            } else if is(KindSet::LETTER) {
                Phase::Letters
            } else if is(KindSet::PREFIX) && KindSet::LETTER.contains(window.after) {
                Phase::Prefix
            } else {
                non_letter_start(window, white_space)
            }
        }
        Pattern::O200k => {
            if is(KindSet::LOWER_CASE) {
                Phase::Lower
            } else if is(KindSet::WORD) {
                // A mark too: with itself as the first character, the rest of
                // the piece is what it would be without (or the mark alone).
                Phase::Upper
            } else if is(KindSet::PREFIX) && KindSet::WORD.contains(window.after) {
                Phase::Prefix
            } else {
                non_letter_start(window, white_space)
            }
        }
    }
}

/// cl100k's and o200k's alternatives after the letter ones:
/// `\p{N}{1,3}| ?[^\s\p{L}\p{N}]+<tail>|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn non_letter_start(window: &Window, white_space: Phase) -> Phase {
    let here = window.here;
    if here == Kind::Number {
        Phase::FirstDigit
    } else if here == Kind::Space && KindSet::OTHER.contains(window.after) {
        Phase::OtherSpace
    } else if KindSet::OTHER.contains(here) {
        Phase::OtherRun
    } else {
        white_space
    }
}

/// The byte offset of every piece start of `text` by `pattern`, by the rule of
/// the [module docs](self): [`windows`], then [`starts_from_windows`]. Allocates
/// per character; the fast split is [`Splitter`](super::pattern::Splitter). A
/// text over [`super::MAX_TEXT_BYTES`] is an `Err` starting `Fix:`.
pub fn piece_starts(pattern: Pattern, text: &[u8]) -> Result<Vec<u32>, PretokenizeError> {
    Ok(starts_from_windows(pattern, windows(text)?))
}

/// The byte offset of every character of `text` and its [`Window`]: characters
/// decoded by the standard library under the invalid-byte rule
/// ([`cpu::code_points`](super::cpu::code_points)), the two look-ahead facts by
/// a reverse pass. The same for every pattern. A text over
/// [`super::MAX_TEXT_BYTES`] is an `Err` starting `Fix:`.
pub fn windows(text: &[u8]) -> Result<Vec<(u32, Window)>, PretokenizeError> {
    super::check_text_len(text.len())?;
    let table = kind_table()?;
    let characters = code_points(text);
    let kinds: Vec<Kind> = characters
        .iter()
        .map(|&(_, code_point)| table.kind_of(code_point))
        .collect();
    let kind_at = |index: usize| kinds.get(index).copied().unwrap_or(Kind::End);
    let code_at = |index: usize| characters.get(index).map_or(0, |&(_, code)| code);
    // Reverse pass: the facts about the text after each position (the values
    // past the end are `false` and `true`).
    let mut break_ahead = vec![false; kinds.len() + 1];
    let mut upper_to_end = vec![true; kinds.len() + 1];
    for (index, &kind) in kinds.iter().enumerate().rev() {
        break_ahead[index] = if kind == Kind::LineBreak {
            true
        } else {
            KindSet::WHITE_SPACE.contains(kind) && break_ahead[index + 1]
        };
        upper_to_end[index] = if KindSet::UPPER_CASE.contains(kind) {
            upper_to_end[index + 1]
        } else {
            !KindSet::WORD.contains(kind)
        };
    }
    Ok(characters
        .iter()
        .enumerate()
        .map(|(index, &(offset, _))| {
            let before = |distance: usize| {
                index
                    .checked_sub(distance)
                    .map_or(Kind::End, |at| kinds[at])
            };
            let window = Window {
                before2: before(2),
                before: before(1),
                here: kinds[index],
                after: kind_at(index + 1),
                after2: kind_at(index + 2),
                after_code: code_at(index + 1),
                after2_code: code_at(index + 2),
                break_ahead: break_ahead[index],
                upper_to_end: upper_to_end[index],
            };
            (offset, window)
        })
        .collect())
}

/// The piece starts by `pattern` from every character's (byte offset,
/// [`Window`]) in order: the forward pass of phases, [`continues`] or else
/// [`starts`].
pub fn starts_from_windows(
    pattern: Pattern,
    windows: impl IntoIterator<Item = (u32, Window)>,
) -> Vec<u32> {
    let mut piece_starts = Vec::new();
    let mut phase = Phase::Begin;
    for (offset, window) in windows {
        phase = match continues(pattern, phase, &window) {
            Some(next) => next,
            None => {
                piece_starts.push(offset);
                starts(pattern, &window)
            }
        };
    }
    piece_starts
}
