//! The vocabulary as the device reads it: one array of `u32` words (a header,
//! the rank of every single byte, the rank of every 2-byte token, each rank's
//! bytes and length, and an open-addressing table of the longer tokens) and the
//! tokens' bytes back to back. Built once per tokenizer on the host and uploaded
//! once; resident for as long as the encoder lives.
//!
//! # Why this layout
//!
//! Every question the merge loop asks is "is this substring of the text a
//! token, and of which rank": once for the whole piece (most pieces are whole
//! tokens) and once per candidate pair. Every candidate is a substring of the
//! text the device already holds, so the table is keyed by bytes and a lookup
//! reads only the text and the table. Single bytes and byte pairs (the merge
//! loop's first round of lookups for every piece) are dense arrays: one load,
//! no hashing, 257 KiB that stay in the device's L2 cache. Longer keys hash
//! their bytes and probe linearly; a slot holds the key's full 32-bit hash and
//! its length beside the rank, so a probe that meets another key rejects it
//! without touching the token's bytes, and only a probe that matches both
//! compares the bytes. Lookups per piece: one for a piece that is a token
//! (most of them); otherwise `len − 1` dense pair loads plus two hashed
//! lookups per merge.
//!
//! Bytes per encoding (the whole resident vocabulary): r50k and p50k
//! 1.75 MiB, cl100k 3.25 MiB, o200k 6.35 MiB (the slot table is a power of two
//! at most half full; [`DeviceVocabulary::device_bytes`] gives the exact
//! figure). The longest probe of a stored key is 15 slots for r50k and p50k,
//! 18 for cl100k and o200k.

use crate::error::{ErrorKind, TokenizerError};
use crate::vocab::Vocabulary;

/// The rank every table holds where there is no token (and the device's
/// "no token starts here").
pub const NO_TOKEN: u32 = u32::MAX;

/// Word offsets of the header fields.
pub mod header {
    /// log2 of the number of slots of the hashed table.
    pub const SLOT_BITS: u32 = 0;
    /// Word offset of the hashed table (two words per slot).
    pub const SLOTS_AT: u32 = 1;
    /// One more than the largest rank.
    pub const RANK_BOUND: u32 = 2;
    /// Length in bytes of the longest token.
    pub const MAX_TOKEN_LEN: u32 = 3;
    /// Words the header takes.
    pub const WORDS: u32 = 16;
}

/// Word offset of the 256 single-byte ranks.
pub const BYTE_RANKS_AT: u32 = header::WORDS;

/// Word offset of the 65,536 ranks of 2-byte tokens, indexed `first << 8 | second`.
pub const PAIR_RANKS_AT: u32 = BYTE_RANKS_AT + 256;

/// Word offset of each rank's token: `offset << 8 | length` (`offset` into the
/// token bytes), [`NO_TOKEN`] for a rank without a token.
pub const TOKENS_AT: u32 = PAIR_RANKS_AT + (1 << 16);

/// A token's rank and its offset into the token bytes each fit 24 bits.
pub const MAX_RANK: u32 = (1 << 24) - 1;

/// The device's hash of a key: a multiply-xor over its bytes seeded by its
/// length, then a final mix (written the same way in the device program).
pub fn hash(key: &[u8]) -> u32 {
    let mut hash = (key.len() as u32).wrapping_mul(0x9E37_79B1);
    for &byte in key {
        hash = (hash ^ byte as u32).wrapping_mul(0x0100_0193);
    }
    finish(hash)
}

/// The final mix of [`hash`] (murmur3's 32-bit finaliser).
pub const fn finish(mut hash: u32) -> u32 {
    hash ^= hash >> 16;
    hash = hash.wrapping_mul(0x85EB_CA6B);
    hash ^= hash >> 13;
    hash = hash.wrapping_mul(0xC2B2_AE35);
    hash ^ (hash >> 16)
}

/// The host image of a vocabulary on the device (see the module docs).
#[derive(Clone)]
pub struct DeviceVocabulary {
    words: Vec<u32>,
    token_bytes: Vec<u8>,
    slot_bits: u32,
    longest_probe: u32,
}

impl std::fmt::Debug for DeviceVocabulary {
    /// A summary: the tables are megabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceVocabulary")
            .field("device_bytes", &self.device_bytes())
            .field("slots", &(1u64 << self.slot_bits))
            .field("longest_probe", &self.longest_probe)
            .finish()
    }
}

fn too_large(what: String) -> TokenizerError {
    TokenizerError::new(
        ErrorKind::Backend,
        format!("Fix: {what}; the GPU encoder takes vocabularies of ranks and token bytes below 2^24, so use Backend::Cpu for this one"),
    )
}

impl DeviceVocabulary {
    /// The device tables of `vocabulary`. An `Err` for a vocabulary whose ranks
    /// or token bytes do not fit the 24-bit fields (none of the built-in ones).
    pub fn new(vocabulary: &Vocabulary) -> Result<Self, TokenizerError> {
        let rank_bound = vocabulary.rank_bound();
        if rank_bound > MAX_RANK {
            return Err(too_large(format!(
                "the vocabulary has ranks up to {}",
                rank_bound - 1
            )));
        }
        let hashed: Vec<(u32, &[u8])> = (0..rank_bound)
            .filter_map(|rank| Some((rank, vocabulary.token(rank)?)))
            .filter(|(_, bytes)| bytes.len() >= 3)
            .collect();
        let slot_bits = (hashed.len().max(8) * 2)
            .next_power_of_two()
            .trailing_zeros();
        let slots_at = TOKENS_AT + rank_bound;
        let mut words = vec![0u32; slots_at as usize + (2usize << slot_bits)];
        words[header::SLOT_BITS as usize] = slot_bits;
        words[header::SLOTS_AT as usize] = slots_at;
        words[header::RANK_BOUND as usize] = rank_bound;
        words[header::MAX_TOKEN_LEN as usize] = vocabulary.max_token_len() as u32;
        for byte in 0..=255u8 {
            words[(BYTE_RANKS_AT + byte as u32) as usize] = vocabulary.byte_rank(byte);
        }
        for pair in 0..1u32 << 16 {
            words[(PAIR_RANKS_AT + pair) as usize] = vocabulary
                .pair_rank((pair >> 8) as u8, pair as u8)
                .unwrap_or(NO_TOKEN);
        }
        let mut token_bytes = Vec::new();
        for rank in 0..rank_bound {
            let at = (TOKENS_AT + rank) as usize;
            words[at] = match vocabulary.token(rank) {
                Some(bytes) => {
                    let offset = token_bytes.len() as u32;
                    if offset > MAX_RANK || bytes.len() > 255 {
                        return Err(too_large(format!(
                            "the vocabulary holds {} bytes of tokens (token {rank} is {} bytes)",
                            token_bytes.len() + bytes.len(),
                            bytes.len()
                        )));
                    }
                    token_bytes.extend_from_slice(bytes);
                    offset << 8 | bytes.len() as u32
                }
                None => NO_TOKEN,
            };
        }
        let mask = (1usize << slot_bits) - 1;
        let mut longest_probe = 0;
        for (rank, bytes) in hashed {
            let hash = hash(bytes);
            let mut slot = (hash >> (32 - slot_bits)) as usize;
            let mut probe = 1;
            while words[slots_at as usize + 2 * slot + 1] != 0 {
                slot = (slot + 1) & mask;
                probe += 1;
            }
            longest_probe = longest_probe.max(probe);
            words[slots_at as usize + 2 * slot] = hash;
            words[slots_at as usize + 2 * slot + 1] = (bytes.len() as u32) << 24 | rank;
        }
        Ok(DeviceVocabulary {
            words,
            token_bytes,
            slot_bits,
            longest_probe,
        })
    }

    /// The `u32` words: header, byte ranks, pair ranks, tokens, slots.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Every token's bytes, back to back in rank order.
    pub fn token_bytes(&self) -> &[u8] {
        &self.token_bytes
    }

    /// Bytes the vocabulary takes on the device.
    pub fn device_bytes(&self) -> usize {
        self.words.len() * 4 + self.token_bytes.len()
    }

    /// Slots the longest probe sequence of a stored key visits (a miss may visit
    /// more: it ends at the first empty slot).
    pub fn longest_probe(&self) -> u32 {
        self.longest_probe
    }

    /// The rank of `key` by exactly the device's steps (dense tables for one and
    /// two bytes, the hashed table beyond), for tests that hold the device
    /// tables to [`Vocabulary::rank`].
    pub fn lookup(&self, key: &[u8]) -> Option<u32> {
        let word = |at: u32| self.words[at as usize];
        let rank = match *key {
            [] => NO_TOKEN,
            [byte] => word(BYTE_RANKS_AT + byte as u32),
            [first, second] => word(PAIR_RANKS_AT + ((first as u32) << 8 | second as u32)),
            _ if key.len() > word(header::MAX_TOKEN_LEN) as usize => NO_TOKEN,
            _ => {
                let hash = hash(key);
                let slots_at = word(header::SLOTS_AT);
                let mask = (1u32 << self.slot_bits) - 1;
                let mut slot = hash >> (32 - self.slot_bits);
                loop {
                    let stored = word(slots_at + 2 * slot + 1);
                    if stored == 0 {
                        break NO_TOKEN;
                    }
                    let rank = stored & MAX_RANK;
                    if word(slots_at + 2 * slot) == hash
                        && (stored >> 24) as usize == key.len()
                        && self.token(rank) == Some(key)
                    {
                        break rank;
                    }
                    slot = (slot + 1) & mask;
                }
            }
        };
        (rank != NO_TOKEN).then_some(rank)
    }

    /// The bytes of the token of `rank`, from the device tables.
    pub fn token(&self, rank: u32) -> Option<&[u8]> {
        let info = *self.words.get((TOKENS_AT + rank) as usize)?;
        if info == NO_TOKEN || rank >= self.words[header::RANK_BOUND as usize] {
            return None;
        }
        let offset = (info >> 8) as usize;
        self.token_bytes
            .get(offset..offset + (info & 0xFF) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    /// Locks out device tables that disagree with the vocabulary: for every
    /// built-in encoding, every token's bytes look up to its rank through the
    /// device's steps, the device's token bytes are the vocabulary's, and
    /// (negative control) keys that are no token (a token with a byte appended,
    /// every 3-byte window of some text that the vocabulary refuses) are misses.
    #[test]
    fn device_lookup_equals_the_vocabulary() {
        for encoding in Encoding::ALL {
            let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
            let device = DeviceVocabulary::new(&vocabulary).unwrap();
            let mut misses = 0;
            for rank in 0..vocabulary.rank_bound() {
                let Some(token) = vocabulary.token(rank) else {
                    assert_eq!(device.token(rank), None);
                    continue;
                };
                assert_eq!(device.lookup(token), Some(rank), "{token:?}");
                assert_eq!(device.token(rank), Some(token));
                let longer = [token, b"\xFF"].concat();
                assert_eq!(device.lookup(&longer), vocabulary.rank(&longer));
                misses += usize::from(vocabulary.rank(&longer).is_none());
            }
            assert!(misses > 1000, "{}: only {misses} misses", encoding.name());
            let text = "The quick brown fox 日本語 \u{301}!! 12345".as_bytes();
            for len in 1..=6 {
                for window in text.windows(len) {
                    assert_eq!(device.lookup(window), vocabulary.rank(window), "{window:?}");
                }
            }
            assert_eq!(device.lookup(&[]), None);
            assert_eq!(device.lookup(&[b'a'; 200]), None);
            assert!(device.longest_probe() < 64, "{device:?}");
        }
    }
}
