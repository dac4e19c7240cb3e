//! The Unicode class table against the oracle on every code point.

mod oracle;

use vyre_tokenizer::pretokenize::unicode::{class_table, CharClass, ClassTable, UNICODE_VERSION};

/// Locks out a class table that differs from the oracle's `\p{L}`, `\p{N}` or
/// `\s` anywhere: every code point `0..=0x10FFFF` (surrogates, which are not
/// characters, must be "other"), classified by `fancy-regex` itself, one match per
/// run of a class over a string of all characters in order. Also shows the three
/// classes are disjoint.
#[test]
fn class_table_equals_oracle_on_every_code_point() {
    let table = class_table().expect("class table");
    let all: String = (0..0x11_0000u32).filter_map(char::from_u32).collect();
    let mut oracle = vec![CharClass::Other; 0x11_0000];
    for (pattern, class) in [
        (r"\p{L}+", CharClass::Letter),
        (r"\p{N}+", CharClass::Number),
        (r"\s+", CharClass::Whitespace),
    ] {
        let regex = fancy_regex::Regex::new(pattern).expect("class pattern");
        for found in regex.find_iter(&all) {
            let found = found.expect("match");
            for character in all[found.start()..found.end()].chars() {
                let slot = &mut oracle[character as usize];
                assert_eq!(*slot, CharClass::Other, "{character:?} is in two classes");
                *slot = class;
            }
        }
    }
    let mut mismatches = Vec::new();
    for code_point in 0..0x11_0000u32 {
        if table.class_of(code_point) != oracle[code_point as usize] {
            mismatches.push(code_point);
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} code points differ, first {:X?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    assert_eq!(table.class_of(0xD800), CharClass::Other);
    assert_eq!(table.class_of(0x11_0000), CharClass::Other);
    assert_eq!(
        table.class_of(0xFFFD),
        CharClass::Other,
        "invalid bytes decode as U+FFFD"
    );
    // Negative control: the comparison sees a single flipped class.
    let mut words = table.words().to_vec();
    let base = words[0] as usize; // block of U+0000..=U+00FF
    words[base + (b'a' as usize >> 4)] ^= 1 << ((b'a' as u32 & 15) * 2);
    assert_ne!(
        CharClass::from_code(words[base + 6] >> 2),
        oracle['a' as usize],
        "negative control: flipping 'a' changes its class"
    );
}

/// Locks out an unstated or drifting Unicode version and a bloated table: the
/// version names the one `regex-syntax` generated its tables from, and the
/// table stays small enough to live in the device's caches.
#[test]
fn class_table_is_compact_and_versioned() {
    let table = ClassTable::build().expect("class table");
    assert_eq!(UNICODE_VERSION, "16.0.0");
    assert_eq!(&table, class_table().expect("class table"));
    assert!(
        table.distinct_blocks() < 1000,
        "{} blocks",
        table.distinct_blocks()
    );
    assert!(
        table.words().len() * 4 < 100_000,
        "{} bytes",
        table.words().len() * 4
    );
    // 'a' is a letter (U+0061), '٣' a number, U+3000 white space.
    assert_eq!(table.class_of('a' as u32), CharClass::Letter);
    assert_eq!(table.class_of('٣' as u32), CharClass::Number);
    assert_eq!(table.class_of(0x3000), CharClass::Whitespace);
    assert_eq!(
        table.class_of(0x301),
        CharClass::Other,
        "combining marks are not letters"
    );
}
