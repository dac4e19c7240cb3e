//! Vocabularies in the standard `.tiktoken` format, read strictly.
//!
//! # Why this module exists
//!
//! A byte-level BPE encoding is a table of byte strings and their ranks; OpenAI
//! publishes theirs as `.tiktoken` files: one token per line, its bytes in
//! standard base64 (with `=` padding), one space, its rank in decimal. A
//! vocabulary that is almost right encodes text into almost-right ids without any
//! visible error, so this reader refuses anything a correct file does not
//! contain, naming the line: an empty line, a line without its space, bad base64,
//! an empty token, a rank that is not a decimal `u32`, a token or rank that an
//! earlier line already has, and a last line with no line break (a cut-off file).
//! Gaps in the ranks are legal (p50k_base has one, at 50256, where its
//! `<|endoftext|>` sits). Byte-level BPE needs every single byte as a token (a
//! text's bytes are where merging starts), so a vocabulary without all 256 is
//! refused too; ranks far beyond the token count (more than [`MAX_UNUSED_RANKS`]
//! unused) are refused because the id → bytes index is dense.
//!
//! The base64 decoder is the crate's own (a dozen lines; no dependency for it).

use std::path::Path;

use crate::error::{ErrorKind, TokenizerError};
use crate::table::TokenTable;

/// Most ranks below the largest that may be unused (gaps): the id → bytes index
/// holds one entry per rank up to the largest.
pub const MAX_UNUSED_RANKS: u32 = 1 << 20;

/// Marks a rank without a token in the dense id → bytes index.
const NO_TOKEN: u32 = u32::MAX;

/// A vocabulary: token bytes ↔ rank (the rank is the token id and the merge
/// priority: lower merges first).
#[derive(Clone)]
pub struct Vocabulary {
    /// Every token's bytes, back to back, in rank order.
    arena: Vec<u8>,
    /// For rank `r`: `spans[r]` = (offset into `arena`, length), or (`NO_TOKEN`, 0)
    /// for a gap.
    spans: Vec<(u32, u32)>,
    table: TokenTable,
    byte_ranks: [u32; 256],
    /// The rank of every 2-byte token, indexed by `first << 8 | second`
    /// (`NO_TOKEN` where there is none): the merge loop's first lookups are all
    /// of adjacent byte pairs, and this 256 KiB array stays in cache where the
    /// hash table (4–8 MiB) does not.
    pair_ranks: Box<[u32]>,
    /// The rank of every token that is one 3-byte UTF-8 character (U+0800 to
    /// U+FFFF: the CJK ideographs, kana, Hangul among them), indexed by the
    /// character's 16 bits (`NO_TOKEN` where there is none): CJK text merges its
    /// bytes into whole characters first, and this 256 KiB array answers those
    /// lookups from cache.
    character_ranks: Box<[u32]>,
    /// Bit `first << 8 | second` (of 65,536, in 64-bit words) set when some
    /// token holds the byte `first` right before `second`: where it is clear,
    /// no merge ever joins the two bytes (see [`Vocabulary::joins`]).
    joined_pairs: Box<[u64]>,
    tokens: usize,
}

/// The 16 payload bits of `key` if it is a lead byte `1110xxxx` and two
/// continuation bytes (the shape of a 3-byte UTF-8 character, overlong or
/// surrogate forms included: the index is only a table position).
#[inline(always)]
fn three_byte_character(key: &[u8]) -> Option<usize> {
    match *key {
        [lead @ 0xE0..=0xEF, second @ 0x80..=0xBF, third @ 0x80..=0xBF] => Some(
            ((lead & 0x0F) as usize) << 12
                | ((second & 0x3F) as usize) << 6
                | (third & 0x3F) as usize,
        ),
        _ => None,
    }
}

impl std::fmt::Debug for Vocabulary {
    /// A summary: the tables are megabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("tokens", &self.tokens)
            .field("rank_bound", &self.rank_bound())
            .field("max_token_len", &self.max_token_len())
            .finish_non_exhaustive()
    }
}

fn vocabulary_error(message: String) -> TokenizerError {
    TokenizerError::new(ErrorKind::Vocabulary, message)
}

/// The 6-bit value of a base64 character (standard alphabet), or `None`.
fn base64_value(character: u8) -> Option<u8> {
    match character {
        b'A'..=b'Z' => Some(character - b'A'),
        b'a'..=b'z' => Some(character - b'a' + 26),
        b'0'..=b'9' => Some(character - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes standard base64 with `=` padding (length a multiple of 4, padding
/// only at the end, unused bits zero) and appends the bytes to `out`. `Err` holds
/// a description of what is wrong.
pub(crate) fn decode_base64(text: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    if !text.len().is_multiple_of(4) {
        return Err(format!(
            "its length {} is not a multiple of 4 (base64 with '=' padding)",
            text.len()
        ));
    }
    let quads = text.len() / 4;
    for (index, quad) in text.chunks_exact(4).enumerate() {
        let last = index + 1 == quads;
        let padding = if last {
            quad.iter().rev().take_while(|&&c| c == b'=').count()
        } else {
            0
        };
        if padding > 2 {
            return Err("it has more than two '=' at the end".to_owned());
        }
        let mut bits = 0u32;
        for (position, &character) in quad[..4 - padding].iter().enumerate() {
            let value = base64_value(character).ok_or_else(|| {
                format!(
                    "character {:?} at column {} is not base64",
                    char::from(character),
                    index * 4 + position + 1
                )
            })?;
            bits |= (value as u32) << (18 - 6 * position);
        }
        let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        let kept = 3 - padding;
        if bytes[kept..].iter().any(|&byte| byte != 0) {
            return Err("its last character has bits set that the padding drops".to_owned());
        }
        out.extend_from_slice(&bytes[..kept]);
    }
    Ok(())
}

/// A rank: ASCII decimal digits only, at most `u32::MAX - 1`.
fn parse_rank(text: &[u8]) -> Result<u32, String> {
    if text.is_empty() {
        return Err("the rank after the space is missing".to_owned());
    }
    let mut value = 0u64;
    for &character in text {
        if !character.is_ascii_digit() {
            return Err(format!(
                "the rank {:?} is not a decimal number",
                String::from_utf8_lossy(text)
            ));
        }
        value = value * 10 + (character - b'0') as u64;
        if value >= NO_TOKEN as u64 {
            return Err(format!(
                "the rank {} does not fit a u32 token id (at most {})",
                String::from_utf8_lossy(text),
                NO_TOKEN - 1
            ));
        }
    }
    Ok(value as u32)
}

impl Vocabulary {
    /// Reads a `.tiktoken` file.
    pub fn from_tiktoken_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|error| {
            vocabulary_error(format!(
                "Fix: could not read the vocabulary file {}: {error}; pass the path of a .tiktoken file",
                path.display()
            ))
            .with_source(error)
        })?;
        Self::from_tiktoken_bytes(&bytes).map_err(|error| {
            vocabulary_error(format!("{} (in {})", error.message(), path.display()))
        })
    }

    /// Reads the contents of a `.tiktoken` file (see the module docs for what is
    /// refused; every error names the line).
    pub fn from_tiktoken_bytes(bytes: &[u8]) -> Result<Self, TokenizerError> {
        let mut tokens: Vec<(u32, u32, u32)> = Vec::with_capacity(bytes.len() / 12); // (rank, offset, len)
        let mut arena: Vec<u8> = Vec::with_capacity(bytes.len() * 2 / 3);
        let mut rest = bytes;
        let mut line_number = 0usize;
        while !rest.is_empty() {
            line_number += 1;
            let (line, after) = match rest.iter().position(|&byte| byte == b'\n') {
                Some(end) => (&rest[..end], &rest[end + 1..]),
                None => {
                    return Err(vocabulary_error(format!(
                        "Fix: line {line_number} has no line break after it: the file looks cut off; \
                         restore the rest of the file (every line of a .tiktoken file ends with a line break)"
                    )))
                }
            };
            rest = after;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                return Err(vocabulary_error(format!(
                    "Fix: line {line_number} is empty; remove it (each line is base64 token bytes, a space, a rank)"
                )));
            }
            let Some(space) = line.iter().position(|&byte| byte == b' ') else {
                return Err(vocabulary_error(format!(
                    "Fix: line {line_number} has no space; write the base64 token bytes, one space, then the rank"
                )));
            };
            let line_error = |what: String| {
                vocabulary_error(format!(
                    "Fix: line {line_number}: {what}; each line is base64 token bytes, one space, a decimal rank"
                ))
            };
            let offset = arena.len();
            decode_base64(&line[..space], &mut arena)
                .map_err(|what| line_error(format!("the token is not valid base64: {what}")))?;
            let len = arena.len() - offset;
            if len == 0 {
                return Err(line_error("the token is empty".to_owned()));
            }
            let rank = parse_rank(&line[space + 1..]).map_err(line_error)?;
            let (Ok(offset), Ok(len)) = (u32::try_from(offset), u32::try_from(len)) else {
                return Err(line_error(
                    "the vocabulary holds more than 4 GiB of token bytes".to_owned(),
                ));
            };
            tokens.push((rank, offset, len));
        }
        Self::build(arena, &tokens)
    }

    /// Checks ranks and tokens for repeats (naming both lines) and builds the index
    /// and the table. `tokens[i]` came from line `i + 1`.
    fn build(arena: Vec<u8>, tokens: &[(u32, u32, u32)]) -> Result<Self, TokenizerError> {
        if tokens.is_empty() {
            return Err(vocabulary_error(
                "Fix: the vocabulary is empty; pass a .tiktoken file with one token per line"
                    .to_owned(),
            ));
        }
        let largest = tokens.iter().map(|&(rank, _, _)| rank).max().unwrap_or(0);
        let unused = largest as u64 + 1 - tokens.len().min(largest as usize + 1) as u64;
        if unused > MAX_UNUSED_RANKS as u64 {
            let line = tokens
                .iter()
                .position(|&(rank, _, _)| rank == largest)
                .unwrap_or(0)
                + 1;
            return Err(vocabulary_error(format!(
                "Fix: line {line}: rank {largest} leaves {unused} ranks below it without a token \
                 (at most {MAX_UNUSED_RANKS}); number the tokens densely from 0"
            )));
        }
        // spans[rank] = (offset, len) and the line that gave it, for the repeat check.
        let mut spans = vec![(NO_TOKEN, 0u32); largest as usize + 1];
        let mut line_of_rank = vec![0u32; largest as usize + 1];
        for (index, &(rank, offset, len)) in tokens.iter().enumerate() {
            let line = index as u32 + 1;
            if spans[rank as usize].0 != NO_TOKEN {
                return Err(vocabulary_error(format!(
                    "Fix: line {line} repeats rank {rank} of line {}; give every token its own rank",
                    line_of_rank[rank as usize]
                )));
            }
            spans[rank as usize] = (offset, len);
            line_of_rank[rank as usize] = line;
        }
        let bytes_of = |rank: u32| {
            let (offset, len) = spans[rank as usize];
            &arena[offset as usize..(offset + len) as usize]
        };
        // Insert one rank at a time, refusing a token the table already holds.
        let entries: Vec<(&[u8], u32)> = tokens
            .iter()
            .map(|&(rank, _, _)| (bytes_of(rank), rank))
            .collect();
        let table = TokenTable::new(entries.iter().copied());
        for &(key, rank) in &entries {
            // The table keeps the first inserted of equal keys; any other rank
            // with the same bytes is a repeat.
            if let Some(first) = table.get(key, bytes_of) {
                if first != rank {
                    let (first_line, line) =
                        (line_of_rank[first as usize], line_of_rank[rank as usize]);
                    let (first_line, line) = (first_line.min(line), first_line.max(line));
                    return Err(vocabulary_error(format!(
                        "Fix: line {line} repeats the token of line {first_line} ({:?}); every token must appear once",
                        String::from_utf8_lossy(key)
                    )));
                }
            }
        }
        let mut byte_ranks = [NO_TOKEN; 256];
        for byte in 0..=255u8 {
            match table.get(&[byte], bytes_of) {
                Some(rank) => byte_ranks[byte as usize] = rank,
                None => {
                    return Err(vocabulary_error(format!(
                        "Fix: the vocabulary has no token for the single byte 0x{byte:02X}; byte-level BPE \
                         needs all 256 single bytes as tokens (add a line for it)"
                    )))
                }
            }
        }
        let mut pair_ranks = vec![NO_TOKEN; 1 << 16].into_boxed_slice();
        let mut character_ranks = vec![NO_TOKEN; 1 << 16].into_boxed_slice();
        let mut joined_pairs = vec![0u64; (1 << 16) / 64].into_boxed_slice();
        for &(key, rank) in &entries {
            for pair in key.windows(2) {
                let index = (pair[0] as usize) << 8 | pair[1] as usize;
                joined_pairs[index / 64] |= 1 << (index % 64);
            }
            if let &[first, second] = key {
                pair_ranks[(first as usize) << 8 | second as usize] = rank;
            }
            if let Some(index) = three_byte_character(key) {
                character_ranks[index] = rank;
            }
        }
        Ok(Vocabulary {
            arena,
            spans,
            table,
            byte_ranks,
            pair_ranks,
            character_ranks,
            joined_pairs,
            tokens: tokens.len(),
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Always false: a vocabulary has at least the 256 single bytes.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// One more than the largest rank.
    pub fn rank_bound(&self) -> u32 {
        self.spans.len() as u32
    }

    /// The bytes of the token of `rank`, if there is one.
    #[inline]
    pub fn token(&self, rank: u32) -> Option<&[u8]> {
        let &(offset, len) = self.spans.get(rank as usize)?;
        (offset != NO_TOKEN).then(|| &self.arena[offset as usize..(offset + len) as usize])
    }

    /// The rank of `bytes`, if they are a token.
    #[inline(always)]
    pub fn rank(&self, bytes: &[u8]) -> Option<u32> {
        if let &[first, second] = bytes {
            return self.pair_rank(first, second);
        }
        if let Some(index) = three_byte_character(bytes) {
            let rank = self.character_ranks[index];
            return (rank != NO_TOKEN).then_some(rank);
        }
        self.table.get(bytes, |rank| {
            let (offset, len) = self.spans[rank as usize];
            &self.arena[offset as usize..(offset + len) as usize]
        })
    }

    /// The rank of the two bytes `first, second`, if they are a token.
    #[inline(always)]
    pub fn pair_rank(&self, first: u8, second: u8) -> Option<u32> {
        let rank = self.pair_ranks[(first as usize) << 8 | second as usize];
        (rank != NO_TOKEN).then_some(rank)
    }

    /// Whether some token holds the byte `first` right before `second`. Where
    /// none does, no merge ever joins them: every part a merge makes is a
    /// token, so a part across the two would be a token that holds them. The
    /// pairs of parts across such a boundary are never tokens, so each side
    /// merges exactly as it would alone, and a piece can be encoded as its
    /// parts between such boundaries, one after another (cl100k: 6,611 of the
    /// 65,536 byte pairs occur inside a token; o200k: 10,439).
    #[inline(always)]
    pub fn joins(&self, first: u8, second: u8) -> bool {
        let index = (first as usize) << 8 | second as usize;
        self.joined_pairs[index / 64] >> (index % 64) & 1 == 1
    }

    /// The table [`Vocabulary::joins`] reads: bit `first << 8 | second` of
    /// 65,536 (word `index / 64`, bit `index % 64`), 1,024 words. Written
    /// little-endian it is the same bits as 2,048 words of 32 (word
    /// `index / 32`, bit `index % 32`), which is how the device reads it.
    pub fn joined_pair_bits(&self) -> &[u64] {
        &self.joined_pairs
    }

    /// The rank of the single byte `byte` (every vocabulary has all 256).
    #[inline(always)]
    pub fn byte_rank(&self, byte: u8) -> u32 {
        self.byte_ranks[byte as usize]
    }

    /// Length in bytes of the longest token.
    pub fn max_token_len(&self) -> usize {
        self.table.max_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    /// Locks out a `{:?}` of a tokenizer that prints megabytes: a vocabulary's
    /// Debug is a one-line summary.
    #[test]
    fn debug_is_a_summary() {
        let vocabulary =
            Vocabulary::from_tiktoken_bytes(Encoding::R50kBase.tiktoken_bytes()).unwrap();
        let summary = format!("{vocabulary:?}");
        assert!(
            summary.len() < 200 && summary.contains("50256"),
            "{summary}"
        );
    }

    /// Locks out the dense tables and the hash table disagreeing: for every
    /// token of cl100k and o200k `rank` finds its rank, and for every 2-byte key
    /// and every key of the 3-byte-character shape the dense answer is the hash
    /// table's (which holds every token too); (negative control) a 3-byte key of
    /// another shape is not taken for a character.
    #[test]
    fn dense_tables_agree_with_the_hash_table() {
        for encoding in [Encoding::Cl100kBase, Encoding::O200kBase] {
            let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
            let hashed = |key: &[u8]| {
                vocabulary
                    .table
                    .get(key, |rank| vocabulary.token(rank).unwrap_or(&[]))
            };
            for rank in 0..vocabulary.rank_bound() {
                if let Some(token) = vocabulary.token(rank) {
                    assert_eq!(vocabulary.rank(token), Some(rank), "{token:?}");
                    assert_eq!(hashed(token), Some(rank), "{token:?}");
                }
            }
            for first in 0..=255u8 {
                for second in 0..=255u8 {
                    assert_eq!(vocabulary.rank(&[first, second]), hashed(&[first, second]));
                }
            }
            for index in 0..1u32 << 16 {
                let key = [
                    0xE0 | (index >> 12) as u8,
                    0x80 | (index >> 6 & 0x3F) as u8,
                    0x80 | (index & 0x3F) as u8,
                ];
                assert_eq!(three_byte_character(&key), Some(index as usize));
                assert_eq!(vocabulary.rank(&key), hashed(&key), "{key:?}");
            }
        }
        assert_eq!(three_byte_character(&[0xE4, 0xB8, 0x41]), None);
        assert_eq!(three_byte_character(&[0xF0, 0x80, 0x80]), None);
        assert_eq!(three_byte_character(b"abc"), None);
    }

    /// Locks out a lenient or wrong base64 decoder: the RFC 4648 test vectors
    /// decode exactly, and (negative controls) a wrong length, a misplaced `=`,
    /// a character outside the alphabet and set padding bits are refused.
    #[test]
    fn base64_decodes_the_rfc_vectors_and_refuses_the_rest() {
        let vectors: [(&str, &str); 7] = [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ];
        for (encoded, decoded) in vectors {
            let mut out = Vec::new();
            decode_base64(encoded.as_bytes(), &mut out).unwrap();
            assert_eq!(out, decoded.as_bytes(), "{encoded}");
        }
        let mut out = Vec::new();
        decode_base64(b"/+8=", &mut out).unwrap();
        assert_eq!(out, [0xFF, 0xEF]);
        for bad in [
            "Zg=", "Z===", "Zg==Zg==", "Zm9v!A==", "Zh==", "Zm9=", "Zg=a",
        ] {
            assert!(
                decode_base64(bad.as_bytes(), &mut Vec::new()).is_err(),
                "{bad}"
            );
        }
    }
}
