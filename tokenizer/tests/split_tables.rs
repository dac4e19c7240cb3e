//! The kind table (`unicode::KindTable`) against the oracle on every code point:
//! each class the cl100k and o200k patterns are written in, as `fancy-regex`
//! matches it, must be exactly the code points whose kind is in that class.

use vyre_tokenizer::pretokenize::unicode::{
    class_table, kind_table, Kind, KindSet, KindTable, BLOCK_SHIFT, CODE_POINTS, INDEX_ENTRIES,
    KIND_BITS, UNICODE_VERSION,
};

/// Every class the patterns use, whole and in parts, the named characters and
/// the case-insensitive contraction letters, as (regular expression, kinds).
fn classes() -> Vec<(&'static str, KindSet)> {
    vec![
        (r"\p{L}", KindSet::LETTER),
        (r"\p{N}", KindSet::NUMBER),
        (r"\s", KindSet::WHITE_SPACE),
        (r"[\p{Lu}\p{Lt}]", KindSet::UPPER_CASE),
        (r"\p{Ll}", KindSet::LOWER_CASE),
        (r"[\p{Lm}\p{Lo}]", KindSet::of(&[Kind::OtherLetter])),
        (r"\p{M}", KindSet::of(&[Kind::Mark])),
        (r"[^\s\p{L}\p{N}]", KindSet::OTHER),
        (r"[^\r\n\p{L}\p{N}]", KindSet::PREFIX),
        (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", KindSet::O200K_UPPER),
        (r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]", KindSet::O200K_LOWER),
        (r"[\p{L}\p{M}]", KindSet::WORD),
        (r"[\r\n]", KindSet::LINE_BREAK),
        (r"[\r\n/]", KindSet::LINE_BREAK_OR_SLASH),
        (r"'", KindSet::of(&[Kind::Apostrophe])),
        (r"/", KindSet::of(&[Kind::Slash])),
        (r" ", KindSet::of(&[Kind::Space])),
        (r"(?i:s|t|m|d)", KindSet::CONTRACTION_STMD),
        (r"(?i:r|v)", KindSet::CONTRACTION_RV),
        (r"(?i:e)", KindSet::CONTRACTION_E),
        (r"(?i:l)", KindSet::CONTRACTION_L),
    ]
}

/// Every character (every code point but the surrogates), in order.
fn all_characters() -> String {
    (0..CODE_POINTS).filter_map(char::from_u32).collect()
}

/// Membership of every code point in `regex`, as `fancy-regex` matches it: one
/// match per run of members over [`all_characters`].
fn oracle_members(all: &str, regex: &str) -> Vec<bool> {
    let runs = fancy_regex::Regex::new(&format!("(?:{regex})+")).expect("class pattern");
    let mut members = vec![false; CODE_POINTS as usize];
    for found in runs.find_iter(all) {
        for character in found.expect("match").as_str().chars() {
            members[character as usize] = true;
        }
    }
    members
}

/// The stored code of `code_point` by the arithmetic the table's docs give a
/// device (index word, block word, nibble), from raw words.
fn documented_code(words: &[u32], code_point: u32) -> u32 {
    let base = words[(code_point >> 8) as usize];
    let word = words[(base + ((code_point >> 3) & 31)) as usize];
    (word >> ((code_point & 7) * 4)) & 15
}

/// The characters whose membership by `kind_of` differs from the oracle's.
fn mismatches(members: &[bool], kinds: KindSet, kind_of: impl Fn(u32) -> Kind) -> Vec<u32> {
    (0..CODE_POINTS)
        .filter(|&code_point| char::from_u32(code_point).is_some())
        .filter(|&code_point| kinds.contains(kind_of(code_point)) != members[code_point as usize])
        .collect()
}

/// The kind of `code_point` from raw words, the five named ASCII characters put
/// back as `KindTable::kind_of` does.
fn kind_from_words(table: &KindTable, words: &[u32], code_point: u32) -> Kind {
    if code_point < 0x80 {
        table.kind_of(code_point)
    } else {
        Kind::from_code(documented_code(words, code_point))
    }
}

/// Locks out a kind table that differs from the oracle anywhere: for every class
/// of the patterns (letters by case, caseless letters, marks, numbers, white
/// space, punctuation, the optional first character, o200k's two letter classes,
/// the named characters, and the case-insensitive contraction letters: U+017F
/// folds to `s`, U+212A KELVIN SIGN to `k`), membership by the table equals
/// membership by `fancy-regex` on every code point `0..=0x10FFFF`, read both
/// through `kind_of` and through the documented two-level arithmetic on the raw
/// words. Negative control: the same comparison on words with one nibble changed
/// (U+017F made an ordinary lower-case letter) reports exactly that character.
#[test]
fn kind_table_equals_oracle_on_every_code_point() {
    let table = kind_table().expect("kind table");
    let all = all_characters();
    let mut long_s_members = None;
    for (regex, kinds) in classes() {
        let members = oracle_members(&all, regex);
        let by_kind = mismatches(&members, kinds, |code_point| table.kind_of(code_point));
        assert!(
            by_kind.is_empty(),
            "{regex}: {} code points differ, first {:X?}",
            by_kind.len(),
            &by_kind[..by_kind.len().min(10)]
        );
        let by_words = mismatches(&members, kinds, |code_point| {
            kind_from_words(table, table.words(), code_point)
        });
        assert!(
            by_words.is_empty(),
            "{regex} by the documented arithmetic: {by_words:X?}"
        );
        if regex == "(?i:s|t|m|d)" {
            long_s_members = Some(members);
        }
    }
    let members = long_s_members.expect("the contraction class was compared");
    assert!(members[0x17F] && !members[0x212A] && members['S' as usize]);
    // Negative control: U+017F stored as `Lower` instead of `LowerStmd`.
    let mut words = table.words().to_vec();
    let base = words[0x17F >> 8] as usize;
    let slot = &mut words[base + ((0x17F >> 3) & 31)];
    let shift = (0x17F & 7) * 4;
    assert_eq!((*slot >> shift) & 15, Kind::LowerStmd as u32);
    *slot = (*slot & !(15 << shift)) | ((Kind::Lower as u32) << shift);
    let caught = mismatches(&members, KindSet::CONTRACTION_STMD, |code_point| {
        kind_from_words(table, &words, code_point)
    });
    assert_eq!(
        caught,
        [0x17F],
        "negative control: one changed nibble is one mismatch"
    );
}

/// Locks out drift between the kind table and GPT-2's 2-bit class table (which
/// the GPU pipeline uploads): every code point's GPT-2 class read from its kind
/// equals the class table's, and the stored kind equals `kind_of` except at the
/// five ASCII characters the patterns name, which are stored under their general
/// kind; surrogates, U+FFFD (what invalid bytes decode to) and values past
/// U+10FFFF are `Other`.
#[test]
fn kind_table_agrees_with_the_class_table_and_stores_general_kinds() {
    let table = kind_table().expect("kind table");
    let classes = class_table().expect("class table");
    for code_point in 0..CODE_POINTS + 16 {
        let kind = table.kind_of(code_point);
        assert_eq!(
            kind.gpt2_class(),
            classes.class_of(code_point),
            "U+{code_point:04X}"
        );
        let stored = table.stored_kind(code_point);
        let named = match code_point {
            0x27 | 0x2F => Some(Kind::Other),
            0x20 | 0x0A | 0x0D => Some(Kind::WhiteSpace),
            _ => None,
        };
        assert_eq!(stored, named.unwrap_or(kind), "U+{code_point:04X} stored");
        assert!(
            (stored as u32) < 1 << KIND_BITS,
            "U+{code_point:04X} fits four bits"
        );
    }
    for code_point in [0xD800, 0xDFFF, 0xFFFD, 0x11_0000, u32::MAX] {
        assert_eq!(table.kind_of(code_point), Kind::Other, "{code_point:#X}");
    }
}

/// Locks out a wrong kind for the characters the patterns' hard cases turn on,
/// an unstated Unicode version and a table too big to stay in a device's caches.
#[test]
fn kind_table_spot_checks_size_and_version() {
    let table = KindTable::build().expect("kind table");
    assert_eq!(&table, kind_table().expect("kind table"));
    assert_eq!(UNICODE_VERSION, "16.0.0");
    for (character, kind) in [
        ('a', Kind::Lower),
        ('s', Kind::LowerStmd),
        ('S', Kind::UpperStmd),
        ('\u{17F}', Kind::LowerStmd),
        ('\u{212A}', Kind::Upper),
        ('R', Kind::UpperRv),
        ('v', Kind::LowerRv),
        ('E', Kind::UpperE),
        ('l', Kind::LowerL),
        ('ǅ', Kind::Upper),
        ('ʰ', Kind::OtherLetter),
        ('日', Kind::OtherLetter),
        ('\u{301}', Kind::Mark),
        ('\u{903}', Kind::Mark),
        ('\u{20DD}', Kind::Mark),
        ('٣', Kind::Number),
        ('Ⅻ', Kind::Number),
        ('\u{A0}', Kind::WhiteSpace),
        ('\u{85}', Kind::WhiteSpace),
        ('\u{200B}', Kind::Other),
        ('\'', Kind::Apostrophe),
        ('/', Kind::Slash),
        (' ', Kind::Space),
        ('\r', Kind::LineBreak),
        ('\n', Kind::LineBreak),
        ('\t', Kind::WhiteSpace),
        ('😀', Kind::Other),
    ] {
        assert_eq!(table.kind_of(character as u32), kind, "{character:?}");
    }
    assert_eq!(
        table.words().len(),
        INDEX_ENTRIES as usize
            + table.distinct_blocks() * ((1 << BLOCK_SHIFT) * KIND_BITS / 32) as usize
    );
    assert!(
        table.distinct_blocks() < 400,
        "{} blocks",
        table.distinct_blocks()
    );
    assert!(
        table.to_le_bytes().len() < 64 << 10,
        "{} bytes",
        table.to_le_bytes().len()
    );
    for (code, kind) in Kind::ALL.iter().enumerate() {
        assert_eq!(Kind::from_code(code as u32), *kind);
    }
    assert_eq!(Kind::from_code(99), Kind::End);
}
